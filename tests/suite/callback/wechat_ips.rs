//! WeChat's door (`wechat-ips` and the callback's check): the callback takes requests
//! only from the addresses WeChat lists (`getcallbackip`, read every hour), and the
//! list is checked before it replaces the one in use. The addresses are real: each
//! request leaves from its own loopback address (127.0.0.2, 127.0.0.3, …), and the
//! callback reads the socket's peer as API Gateway's `sourceIp`.

use onegrant_tests::{TestApp, emulator_call, spawn_app_with};
use serde_json::json;
use wechat_ips::{RunError, Summary, refresh};

use onegrant_tests::wechat_push;

const WECHAT: &str = "127.0.0.2";
const ELSEWHERE: &str = "127.0.0.3";

/// What the stand-in's `getcallbackip` lists from now on.
async fn wechat_lists(app: &TestApp, list: &[&str]) {
    app.control("POST", "callback-ips", Some(json!({"ip_list": list})))
        .await;
}

/// A valid safe-mode popup push (its own nonce), sent from `from`: status and body.
async fn push_from(app: &TestApp, from: &str, nonce: &str, origin: Option<&str>) -> (u16, String) {
    let c = wechat_push::crypto();
    let ts = app.now().timestamp().to_string();
    let plain = wechat_push::popup("otFpruAK8D-E6EfStSYonYSBZ8_4", app.now().timestamp());
    let (query, body) = wechat_push::sealed(&c, &c, &plain, &ts, nonce);
    let client = reqwest::Client::builder()
        .local_address(from.parse::<std::net::IpAddr>().expect("an address"))
        .build()
        .expect("a client");
    let mut request = client
        .post(format!("{}/wechat/callback?{query}", app.base_url))
        .body(body);
    if let Some(origin) = origin {
        request = request.header("x-onegrant-origin", origin);
    }
    let response = request.send().await.expect("the API answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// A URL verification sent from `from`: its status.
async fn verify_from(app: &TestApp, from: &str) -> u16 {
    let c = wechat_push::crypto();
    let ts = app.now().timestamp().to_string();
    let query = format!(
        "signature={}&timestamp={ts}&nonce=77&echostr=42",
        c.signature(&ts, "77")
    );
    let client = reqwest::Client::builder()
        .local_address(from.parse::<std::net::IpAddr>().expect("an address"))
        .build()
        .expect("a client");
    client
        .get(format!("{}/wechat/callback?{query}", app.base_url))
        .send()
        .await
        .expect("the API answers")
        .status()
        .as_u16()
}

#[tokio::test]
async fn the_callback_takes_requests_only_from_wechats_addresses_once_its_list_is_read() {
    let app = wechat_push::safe_json_app().await;
    app.freeze_at_a_minute_start();
    // No list read yet: the signatures alone decide, as before.
    assert_eq!(push_from(&app, ELSEWHERE, "n0", None).await.0, 200);
    assert_eq!(wechat_push::recorded(&app).await, 1);
    // WeChat lists one address; the function reads and keeps it.
    wechat_lists(&app, &[WECHAT]).await;
    let kept = refresh(&app.deps).await.expect("kept");
    assert_eq!(
        kept,
        Summary {
            entries: 1,
            ip_set: "none"
        }
    );
    let stored = app
        .deps
        .store
        .wechat_ips()
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(stored.ips.entries(), ["127.0.0.2/32"]);
    assert_eq!(stored.fetched_at, app.now());
    // A container reads the list at most every 5 minutes: until then, the one it read.
    app.advance(onegrant::store::WECHAT_IPS_KEPT_FOR);
    // Anyone else: 403 in the API's shape, nothing recorded, nothing read or written.
    app.round_trips.take();
    for n in 0..20 {
        let (status, body) = push_from(&app, ELSEWHERE, &format!("x{n}"), None).await;
        assert_eq!(status, 403, "{body}");
        let body: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(body["error"]["code"], "forbidden", "{body}");
    }
    let trips = app.round_trips.take();
    assert_eq!(
        trips,
        ["GetItem"],
        "one read of the list for 20 refused requests"
    );
    assert_eq!(verify_from(&app, ELSEWHERE).await, 403);
    assert_eq!(wechat_push::recorded(&app).await, 1, "nothing recorded");
    // WeChat's own address: taken and recorded as before.
    assert_eq!(
        push_from(&app, WECHAT, "w1", None).await,
        (200, "success".to_string())
    );
    assert_eq!(verify_from(&app, WECHAT).await, 200);
    assert_eq!(wechat_push::recorded(&app).await, 2);
    // WeChat adds an address: in use within 5 minutes of the next read.
    wechat_lists(&app, &[WECHAT, "127.0.0.3/32", "101.226.103.0/25"]).await;
    refresh(&app.deps).await.expect("kept");
    app.advance(onegrant::store::WECHAT_IPS_KEPT_FOR);
    assert_eq!(push_from(&app, ELSEWHERE, "n2", None).await.0, 200);
    assert_eq!(wechat_push::recorded(&app).await, 3);
}

#[tokio::test]
async fn a_list_that_is_malformed_empty_or_opens_too_much_is_refused_and_the_one_in_use_stays() {
    let app = wechat_push::safe_json_app().await;
    wechat_lists(&app, &[WECHAT, "101.226.103.0/25"]).await;
    refresh(&app.deps).await.expect("kept");
    let kept = app.deps.store.wechat_ips().await.expect("read");
    for bad in [
        vec!["0.0.0.0/0"],
        vec![WECHAT, "10.0.0.0/8"],
        vec![],
        vec![WECHAT, "wechat.example"],
        vec!["127.0.0.2/33"],
    ] {
        wechat_lists(&app, &bad).await;
        assert!(
            matches!(refresh(&app.deps).await, Err(RunError::List(_))),
            "{bad:?}"
        );
        assert_eq!(
            app.deps.store.wechat_ips().await.expect("read"),
            kept,
            "{bad:?}"
        );
    }
    // An access token WeChat no longer takes is fetched again, once.
    wechat_lists(&app, &["127.0.0.2"]).await;
    app.control("POST", "tokens/expire", None).await;
    assert_eq!(refresh(&app.deps).await.expect("kept").entries, 1);
    // WeChat unreachable: nothing kept, the list in use stays.
    let unreachable = spawn_app_with(&[
        ("WECHAT_PUSH_TOKEN", wechat_push::TOKEN),
        ("WECHAT_ORIGINAL_ID", "gh_123456789abc"),
        ("WECHAT_PUSH_AES_KEY", &wechat_push::key()),
        ("WECHAT_API_BASE", "http://127.0.0.1:9"),
    ])
    .await;
    assert!(matches!(
        refresh(&unreachable.deps).await,
        Err(RunError::Wechat(_))
    ));
    assert_eq!(
        unreachable.deps.store.wechat_ips().await.expect("read"),
        None
    );
}

#[tokio::test]
async fn the_edges_ip_set_is_kept_equal_to_wechats_ipv4_list_and_rewritten_only_when_it_differs() {
    let name = format!("wechat-{}", uuid::Uuid::new_v4().simple());
    let created = emulator_call(
        "wafv2",
        "AWSWAF_20190729.CreateIPSet",
        "1.1",
        json!({"Name": name, "Scope": "CLOUDFRONT", "IPAddressVersion": "IPV4", "Addresses": []}),
    )
    .await;
    let arn = created["Summary"]["ARN"]
        .as_str()
        .expect("an ARN")
        .to_string();
    let id = created["Summary"]["Id"]
        .as_str()
        .expect("an id")
        .to_string();
    let held = || async {
        let got = emulator_call(
            "wafv2",
            "AWSWAF_20190729.GetIPSet",
            "1.1",
            json!({"Name": name, "Scope": "CLOUDFRONT", "Id": id}),
        )
        .await;
        let mut addresses: Vec<String> =
            serde_json::from_value(got["IPSet"]["Addresses"].clone()).expect("addresses");
        addresses.sort();
        (
            addresses,
            got["LockToken"].as_str().unwrap_or_default().to_string(),
        )
    };
    let app = spawn_app_with(&[
        ("WECHAT_PUSH_TOKEN", wechat_push::TOKEN),
        ("WECHAT_ORIGINAL_ID", "gh_123456789abc"),
        ("WECHAT_PUSH_AES_KEY", &wechat_push::key()),
        ("WECHAT_IP_SET", &arn),
        (
            "AWS_ENDPOINT_URL_WAFV2",
            onegrant_tests::emulator_endpoint(),
        ),
    ])
    .await;
    wechat_lists(&app, &["101.226.103.5/25", "81.69.101.200"]).await;
    assert_eq!(refresh(&app.deps).await.expect("kept").ip_set, "replaced");
    let (addresses, lock) = held().await;
    assert_eq!(addresses, ["101.226.103.0/25", "81.69.101.200/32"]);
    // The same list again: nothing written (the lock token unchanged).
    assert_eq!(refresh(&app.deps).await.expect("kept").ip_set, "same");
    assert_eq!(held().await, (addresses, lock));
    // WeChat changes its list (an IPv6 network too: the table keeps it, the IPv4 set not).
    wechat_lists(&app, &["81.69.101.200", "2402:4e00:1::/48"]).await;
    let kept = refresh(&app.deps).await.expect("kept");
    assert_eq!((kept.entries, kept.ip_set), (2, "replaced"));
    assert_eq!(held().await.0, ["81.69.101.200/32"]);
    // A list with no IPv4 network would lock WeChat out at the edge: refused.
    wechat_lists(&app, &["2402:4e00:1::/48"]).await;
    assert!(matches!(refresh(&app.deps).await, Err(RunError::NoIpv4)));
    assert_eq!(held().await.0, ["81.69.101.200/32"]);
}

#[tokio::test]
async fn behind_the_edge_or_with_the_check_off_the_function_leaves_the_door_to_others() {
    for (extra, origin) in [
        (
            ("ORIGIN_SECRET", "edge-origin-secret-of-32-characters-x"),
            Some("edge-origin-secret-of-32-characters-x"),
        ),
        (("WECHAT_IPS_CHECK", "off"), None),
    ] {
        let app = spawn_app_with(&[
            ("WECHAT_PUSH_TOKEN", wechat_push::TOKEN),
            ("WECHAT_ORIGINAL_ID", "gh_123456789abc"),
            ("WECHAT_PUSH_AES_KEY", &wechat_push::key()),
            ("WECHAT_PUSH_FORMAT", "json"),
            extra,
        ])
        .await;
        wechat_lists(&app, &[WECHAT]).await;
        refresh(&app.deps).await.expect("kept");
        assert_eq!(
            push_from(&app, ELSEWHERE, "e1", origin).await,
            (200, "success".to_string()),
            "{extra:?}"
        );
    }
}

#[tokio::test]
async fn a_request_around_the_front_while_its_check_only_counts_still_meets_the_door() {
    const ORIGIN: &str = "edge-origin-secret-of-32-characters-x";
    let app = spawn_app_with(&[
        ("WECHAT_PUSH_TOKEN", wechat_push::TOKEN),
        ("WECHAT_ORIGINAL_ID", "gh_123456789abc"),
        ("WECHAT_PUSH_AES_KEY", &wechat_push::key()),
        ("WECHAT_PUSH_FORMAT", "json"),
        ("ORIGIN_SECRET", ORIGIN),
        ("ORIGIN_CHECK", "count"),
    ])
    .await;
    wechat_lists(&app, &[WECHAT]).await;
    refresh(&app.deps).await.expect("kept");
    // Around the front (no origin header; served while moving to it): the door holds.
    assert_eq!(push_from(&app, ELSEWHERE, "c1", None).await.0, 403);
    assert_eq!(wechat_push::recorded(&app).await, 0);
    assert_eq!(push_from(&app, WECHAT, "c2", None).await.0, 200);
    // Through the front: its web ACL kept the door (the address is CloudFront's). A
    // second later: another event, not WeChat's retry of the first.
    app.advance(std::time::Duration::from_secs(1));
    assert_eq!(push_from(&app, ELSEWHERE, "c3", Some(ORIGIN)).await.0, 200);
    assert_eq!(wechat_push::recorded(&app).await, 2);
}

#[tokio::test]
async fn a_callback_path_with_more_after_it_is_refused_as_the_fronts_rules_read_it() {
    // API Gateway routes /wechat/callback/ to the route; the function refuses it (404).
    let app = wechat_push::safe_json_app().await;
    for path in [
        "/wechat/callback/",
        "/wechat/callback//",
        "/wechat/callback/x",
    ] {
        let request = lambda_http::http::Request::builder()
            .method("GET")
            .uri(format!(
                "https://example.com{path}?timestamp=1&nonce=2&echostr=3&signature=4"
            ))
            .body(lambda_http::Body::Empty)
            .expect("a request");
        let answer = wechat_callback::handle(&app.deps, request).await;
        assert_eq!(answer.status().as_u16(), 404, "{path}");
    }
    assert_eq!(wechat_push::recorded(&app).await, 0);
}
