//! The push parser's tests, against WeChat's documented formats and safe mode.

use super::*;

const OPENID: &str = "otFpruAK8D-E6EfStSYonYSBZ8_4";

fn template(id: &str) -> TemplateId {
    TemplateId::parse(id).expect("template")
}

#[test]
fn popup_events_read_alike_from_xml_and_json_with_list_as_object_or_array() {
    let xml = format!(
        "<xml><ToUserName><![CDATA[gh_123456789abc]]></ToUserName><FromUserName><![CDATA[{OPENID}]]></FromUserName>\
             <CreateTime>1610969440</CreateTime><MsgType><![CDATA[event]]></MsgType>\
             <Event><![CDATA[subscribe_msg_popup_event]]></Event><SubscribeMsgPopupEvent>\
             <List><TemplateId><![CDATA[tmpl_a]]></TemplateId><SubscribeStatusString><![CDATA[accept]]></SubscribeStatusString><PopupScene>2</PopupScene></List>\
             <List><TemplateId><![CDATA[tmpl_b]]></TemplateId><SubscribeStatusString><![CDATA[reject]]></SubscribeStatusString><PopupScene>2</PopupScene></List>\
             </SubscribeMsgPopupEvent></xml>"
    );
    let json_array = format!(
        r#"{{"ToUserName":"gh_123456789abc","FromUserName":"{OPENID}","CreateTime":"1610969440","MsgType":"event",
                "Event":"subscribe_msg_popup_event",
                "List":[{{"TemplateId":"tmpl_a","SubscribeStatusString":"accept","PopupScene":"2"}},
                        {{"TemplateId":"tmpl_b","SubscribeStatusString":"reject","PopupScene":2}}]}}"#
    );
    let want = PushMessage {
        to_user: "gh_123456789abc".into(),
        openid: OpenId::parse(OPENID).expect("openid"),
        create_time: 1_610_969_440,
        event: PushEvent::Popup(vec![
            PopupItem {
                template_id: template("tmpl_a"),
                choice: Choice::Accept,
                scene: Some(2),
            },
            PopupItem {
                template_id: template("tmpl_b"),
                choice: Choice::Reject,
                scene: Some(2),
            },
        ]),
    };
    assert_eq!(parse(&xml, Format::Xml), Ok(want.clone()));
    assert_eq!(parse(&json_array, Format::Json), Ok(want));

    let json_object = format!(
        r#"{{"ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":1620973045,"MsgType":"event",
                "Event":"subscribe_msg_popup_event",
                "List":{{"TemplateId":"tmpl_a","SubscribeStatusString":"accept","PopupScene":"0"}}}}"#
    );
    let read = parse(&json_object, Format::Json).expect("object list");
    assert_eq!(read.create_time, 1_620_973_045);
    assert_eq!(
        read.event,
        PushEvent::Popup(vec![PopupItem {
            template_id: template("tmpl_a"),
            choice: Choice::Accept,
            scene: Some(0),
        }])
    );
}

#[test]
fn sent_and_change_events_keep_msgids_above_2_53_exactly() {
    let xml = format!(
        "<xml><ToUserName>gh_1</ToUserName><FromUserName>{OPENID}</FromUserName><CreateTime>1700827132</CreateTime>\
             <MsgType>event</MsgType><Event>subscribe_msg_sent_event</Event><SubscribeMsgSentEvent><List>\
             <TemplateId><![CDATA[tmpl_a]]></TemplateId><MsgID>1700827132819554304</MsgID><ErrorCode>0</ErrorCode>\
             <ErrorStatus><![CDATA[success]]></ErrorStatus></List></SubscribeMsgSentEvent></xml>"
    );
    let json = format!(
        r#"{{"ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":"1700827132","MsgType":"event",
                "Event":"subscribe_msg_sent_event",
                "List":{{"TemplateId":"tmpl_a","MsgID":1864323726461255680,"ErrorCode":"0","ErrorStatus":"success"}}}}"#
    );
    let msgid = |body: &str, format| match parse(body, format).map(|m| m.event) {
        Ok(PushEvent::Sent(items)) => items.first().map(|i| (i.msgid, i.error_code)),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        msgid(&xml, Format::Xml),
        Some((1_700_827_132_819_554_304, 0))
    );
    assert_eq!(
        msgid(&json, Format::Json),
        Some((1_864_323_726_461_255_680, 0))
    );

    let change = format!(
        r#"{{"ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":"1","MsgType":"event",
                "Event":"subscribe_msg_change_event",
                "List":{{"TemplateId":"tmpl_a","SubscribeStatusString":"reject"}}}}"#
    );
    assert_eq!(
        parse(&change, Format::Json).map(|m| m.event),
        Ok(PushEvent::Change(vec![ChangeItem {
            template_id: template("tmpl_a"),
            choice: Choice::Reject,
        }]))
    );
}

#[test]
fn the_encrypted_field_is_found_in_either_format() {
    let xml =
        "<xml><ToUserName><![CDATA[gh_1]]></ToUserName><Encrypt><![CDATA[abc+/=]]></Encrypt></xml>";
    assert_eq!(
        encrypted_field(xml, Format::Xml),
        Ok(Some("abc+/=".to_string()))
    );
    let json = r#"{"ToUserName":"gh_1","Encrypt":"abc+/="}"#;
    assert_eq!(
        encrypted_field(json, Format::Json),
        Ok(Some("abc+/=".to_string()))
    );
    assert_eq!(
        encrypted_field(r#"{"ToUserName":"gh_1"}"#, Format::Json),
        Ok(None)
    );
}

#[test]
fn bad_bodies_are_refused_with_their_reason() {
    let ok_fields = format!(
        r#""ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":"1","MsgType":"event""#
    );
    let cases: Vec<(String, Format, PushParseError)> = vec![
        ("".into(), Format::Json, PushParseError::Malformed("JSON")),
        (
            "[1,2]".into(),
            Format::Json,
            PushParseError::Malformed("JSON"),
        ),
        ("{".into(), Format::Json, PushParseError::Malformed("JSON")),
        (
            "<xml><a>1</b></xml>".into(),
            Format::Xml,
            PushParseError::Malformed("XML"),
        ),
        (
            "<xml><a>1</a>".into(),
            Format::Xml,
            PushParseError::Malformed("XML"),
        ),
        (
            "<root/>".into(),
            Format::Xml,
            PushParseError::Malformed("XML"),
        ),
        (
            "<other><a>1</a></other>".into(),
            Format::Xml,
            PushParseError::Malformed("XML"),
        ),
        (
            "<!DOCTYPE xml [<!ENTITY x \"boom\">]><xml><a>&x;</a></xml>".into(),
            Format::Xml,
            PushParseError::Malformed("XML"),
        ),
        (
            r#"{"ToUserName":"gh_1","CreateTime":"1","MsgType":"event"}"#.into(),
            Format::Json,
            PushParseError::Field("FromUserName"),
        ),
        (
            format!(
                r#"{{"ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":"soon","MsgType":"event"}}"#
            ),
            Format::Json,
            PushParseError::Field("CreateTime"),
        ),
        (
            format!(r#"{{{ok_fields},"Event":"subscribe_msg_popup_event"}}"#),
            Format::Json,
            PushParseError::Field("List"),
        ),
        (
            format!(
                r#"{{{ok_fields},"Event":"subscribe_msg_popup_event","List":{{"TemplateId":"tmpl_a","SubscribeStatusString":"maybe"}}}}"#
            ),
            Format::Json,
            PushParseError::Field("SubscribeStatusString"),
        ),
        (
            format!(
                r#"{{{ok_fields},"Event":"subscribe_msg_sent_event","List":{{"TemplateId":"tmpl_a","MsgID":"-1","ErrorCode":"0"}}}}"#
            ),
            Format::Json,
            PushParseError::Field("MsgID"),
        ),
        (
            format!(r#"{{{ok_fields},"Event":"subscribe_msg_change_event","List":"tmpl_a"}}"#),
            Format::Json,
            PushParseError::Field("List"),
        ),
    ];
    for (body, format, want) in cases {
        assert_eq!(parse(&body, format), Err(want), "{body}");
    }
}

#[test]
fn other_pushes_are_read_as_other() {
    let json = format!(
        r#"{{"ToUserName":"gh_1","FromUserName":"{OPENID}","CreateTime":"1","MsgType":"text","Content":"hi &amp; bye"}}"#
    );
    assert_eq!(
        parse(&json, Format::Json).map(|m| m.event),
        Ok(PushEvent::Other {
            msg_type: "text".into(),
            event: String::new()
        })
    );
    let xml = format!(
        "<xml><ToUserName>gh_1</ToUserName><FromUserName>{OPENID}</FromUserName><CreateTime>1</CreateTime>\
             <MsgType>event</MsgType><Event>debug_demo</Event><debug_str>a &amp; b</debug_str></xml>"
    );
    assert_eq!(
        parse(&xml, Format::Xml).map(|m| m.event),
        Ok(PushEvent::Other {
            msg_type: "event".into(),
            event: "debug_demo".into()
        })
    );
}

#[test]
fn a_change_voids_grants_a_popup_does_not_and_only_a_popups_configured_accepts_confirm() {
    let (water, order) = (template("tmpl_water"), template("tmpl_order"));
    let popup = PushEvent::Popup(vec![
        PopupItem {
            template_id: water.clone(),
            choice: Choice::Accept,
            scene: None,
        },
        PopupItem {
            template_id: order.clone(),
            choice: Choice::Reject,
            scene: None,
        },
    ]);
    assert_eq!(
        popup.choices(),
        (
            vec![(&water, Choice::Accept), (&order, Choice::Reject)],
            false
        )
    );
    assert_eq!(popup.popup_accepts(|_| true), vec![&water]);
    assert!(
        popup.popup_accepts(|t| *t != water).is_empty(),
        "not configured"
    );
    let change = PushEvent::Change(vec![ChangeItem {
        template_id: water.clone(),
        choice: Choice::Reject,
    }]);
    assert_eq!(change.choices(), (vec![(&water, Choice::Reject)], true));
    assert!(change.popup_accepts(|_| true).is_empty());
    let other = PushEvent::Other {
        msg_type: "text".into(),
        event: String::new(),
    };
    assert_eq!(other.choices(), (Vec::new(), false));
}
