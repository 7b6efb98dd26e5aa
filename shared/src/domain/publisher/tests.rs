use super::signature::{Refusal, Request, Signed, sign, verify};
use super::*;
use crate::domain::at;

const SHOP: &str = r#"[{"source": "com.example.shop", "key": "local-publisher-secret",
    "previous_key": "the-previous-shop-key", "webhook": "https://shop.example.com/hook"},
  {"source": "com.example.news", "key": "the-news-key-000000"}]"#;

fn request(body: &[u8]) -> Request<'_> {
    Request {
        method: "POST",
        target: "/publisher/v1/notifications",
        body,
    }
}

#[test]
fn the_signature_is_hmac_sha256_of_timestamp_method_target_and_body() {
    let publishers = Publishers::parse(SHOP).expect("valid");
    let shop = publishers.get("com.example.shop").expect("listed");
    // Computed apart from this code (Python's hmac module).
    assert_eq!(
        sign(shop.current_key(), 1_700_000_000, &request(br#"{"a":1}"#)),
        "v1=93dc54c5942d49b9448acdc5e350034a6f592f7c76dc890ed4176f4b2aa4a69b"
    );
}

#[test]
fn a_request_signed_with_either_key_of_its_publisher_within_the_window_passes() {
    let publishers = Publishers::parse(SHOP).expect("valid");
    let now = at("2026-12-07T01:00:00Z");
    let body = br#"{"openid":"o1"}"#;
    let shop = publishers.get("com.example.shop").expect("listed");
    for key in shop.keys() {
        for skew in [-300, 0, 300] {
            let ts = now.timestamp() + skew;
            let signature = sign(key, ts, &request(body));
            let ts = ts.to_string();
            let signed = Signed {
                publisher: Some("com.example.shop"),
                timestamp: Some(&ts),
                signature: Some(&signature),
            };
            let who = verify(&publishers, signed, &request(body), now).expect("admitted");
            assert_eq!(who.source, "com.example.shop");
        }
    }
}

#[test]
fn every_bad_signature_is_refused_with_its_reason() {
    let publishers = Publishers::parse(SHOP).expect("valid");
    let now = at("2026-12-07T01:00:00Z");
    let body = br#"{"openid":"o1"}"#;
    let shop = publishers.get("com.example.shop").expect("listed");
    let news = publishers.get("com.example.news").expect("listed");
    let ts = now.timestamp();
    let good = sign(shop.current_key(), ts, &request(body));
    let by_news = sign(news.current_key(), ts, &request(body));
    let stale = sign(shop.current_key(), ts - 301, &request(body));
    let other_body = sign(shop.current_key(), ts, &request(b"{}"));
    let other_path = sign(
        shop.current_key(),
        ts,
        &Request {
            target: "/publisher/v1/cancels",
            ..request(body)
        },
    );
    let (now_s, stale_s, future_s) = (
        ts.to_string(),
        (ts - 301).to_string(),
        (ts + 301).to_string(),
    );
    let future = sign(shop.current_key(), ts + 301, &request(body));
    let upper = good.to_uppercase().replace("V1=", "v1=");
    // (what, publisher, timestamp, signature, refusal)
    type Case<'a> = (
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        Refusal,
    );
    let cases: [Case<'_>; 12] = [
        ("no headers", None, None, None, Refusal::Missing),
        (
            "no signature",
            Some("com.example.shop"),
            Some(&now_s),
            None,
            Refusal::Missing,
        ),
        (
            "no timestamp",
            Some("com.example.shop"),
            None,
            Some(&good),
            Refusal::Missing,
        ),
        (
            "no publisher",
            None,
            Some(&now_s),
            Some(&good),
            Refusal::Missing,
        ),
        (
            "no version",
            Some("com.example.shop"),
            Some(&now_s),
            Some(&good[3..]),
            Refusal::Missing,
        ),
        (
            "timestamp not a number",
            Some("com.example.shop"),
            Some("1e9"),
            Some(&good),
            Refusal::Missing,
        ),
        (
            "unknown publisher",
            Some("com.example.evil"),
            Some(&now_s),
            Some(&good),
            Refusal::Unknown,
        ),
        (
            "another publisher's key",
            Some("com.example.shop"),
            Some(&now_s),
            Some(&by_news),
            Refusal::Signature,
        ),
        (
            "stale",
            Some("com.example.shop"),
            Some(&stale_s),
            Some(&stale),
            Refusal::Stale,
        ),
        (
            "from the future",
            Some("com.example.shop"),
            Some(&future_s),
            Some(&future),
            Refusal::Stale,
        ),
        (
            "another body",
            Some("com.example.shop"),
            Some(&now_s),
            Some(&other_body),
            Refusal::Signature,
        ),
        (
            "another path",
            Some("com.example.shop"),
            Some(&now_s),
            Some(&other_path),
            Refusal::Signature,
        ),
    ];
    for (what, publisher, timestamp, signature, refusal) in cases {
        let signed = Signed {
            publisher,
            timestamp,
            signature,
        };
        assert_eq!(
            verify(&publishers, signed, &request(body), now).map(|p| p.source.clone()),
            Err(refusal),
            "{what}"
        );
    }
    // Hex is case-insensitive: the same digest in capitals passes.
    let signed = Signed {
        publisher: Some("com.example.shop"),
        timestamp: Some(&now_s),
        signature: Some(&upper),
    };
    assert!(verify(&publishers, signed, &request(body), now).is_ok());
}

#[test]
fn publishers_are_refused_unless_well_formed() {
    let cases = [
        ("not JSON", "nope"),
        (
            "not a list",
            r#"{"source": "a", "key": "0123456789abcdef"}"#,
        ),
        ("no key", r#"[{"source": "com.a"}]"#),
        ("short key", r#"[{"source": "com.a", "key": "short"}]"#),
        (
            "short previous key",
            r#"[{"source": "com.a", "key": "0123456789abcdef", "previous_key": "x"}]"#,
        ),
        (
            "bad source",
            r##"[{"source": "com#a", "key": "0123456789abcdef"}]"##,
        ),
        (
            "onegrant's own name",
            r#"[{"source": "onegrant", "key": "0123456789abcdef"}]"#,
        ),
        (
            "twice",
            r#"[{"source": "com.a", "key": "0123456789abcdef"}, {"source": "com.a", "key": "0123456789abcdeg"}]"#,
        ),
        (
            "a key another publisher holds",
            r#"[{"source": "com.a", "key": "0123456789abcdef"}, {"source": "com.b", "key": "0123456789abcdef"}]"#,
        ),
        (
            "a previous key another publisher holds",
            r#"[{"source": "com.a", "key": "0123456789abcdef"}, {"source": "com.b", "key": "0123456789abcdeg", "previous_key": "0123456789abcdef"}]"#,
        ),
        (
            "plain http webhook",
            r#"[{"source": "com.a", "key": "0123456789abcdef", "webhook": "http://a.example.com/"}]"#,
        ),
        (
            "webhook not a URL",
            r#"[{"source": "com.a", "key": "0123456789abcdef", "webhook": "a.example.com"}]"#,
        ),
        (
            "unknown field",
            r#"[{"source": "com.a", "key": "0123456789abcdef", "keys": []}]"#,
        ),
    ];
    for (what, json) in cases {
        assert!(Publishers::parse(json).is_err(), "{what}");
    }
    // Serde would quote the value it met: the message never carries it.
    let refused = Publishers::parse(r#"["supersecretvalue123"]"#).expect_err("not an object");
    assert!(!refused.contains("supersecret"), "{refused}");
    let local = Publishers::parse(
        r#"[{"source": "com.a", "key": "0123456789abcdef", "webhook": "http://127.0.0.1:9/hook"}]"#,
    )
    .expect("a local webhook");
    assert_eq!(
        local.get("com.a").and_then(|p| p.webhook.as_deref()),
        Some("http://127.0.0.1:9/hook")
    );
    assert!(Publishers::parse("[]").expect("none").is_empty());
}

#[test]
fn keys_never_print() {
    let publishers = Publishers::parse(SHOP).expect("valid");
    let printed = format!("{publishers:?}");
    assert!(!printed.contains("local-publisher-secret"), "{printed}");
    assert!(!printed.contains("the-previous-shop-key"), "{printed}");
}

#[test]
fn a_source_with_a_lane_belongs_to_its_accounts_and_the_rest_to_the_stacks_own() {
    let lanes =
        Lanes::parse("com.example.shop=111111111111;222222222222, com.example.news=333333333333")
            .expect("valid");
    let own = "999999999999";
    assert_eq!(
        lanes.admits("com.example.shop", "111111111111", own),
        Ok(())
    );
    assert_eq!(
        lanes.admits("com.example.shop", "222222222222", own),
        Ok(())
    );
    assert_eq!(
        lanes.admits("com.example.news", "333333333333", own),
        Ok(())
    );
    assert_eq!(
        lanes.admits("com.example.shop", "333333333333", own),
        Err(OutOfLane::Paired),
        "news's account may not use shop's source"
    );
    assert_eq!(
        lanes.admits("com.example.shop", own, own),
        Err(OutOfLane::Paired),
        "not even the stack's own account"
    );
    assert_eq!(lanes.admits("com.example.other", own, own), Ok(()));
    assert_eq!(
        lanes.admits("com.example.other", "111111111111", own),
        Err(OutOfLane::Foreign)
    );
    assert_eq!(
        lanes.admits("com.example.other", "", ""),
        Err(OutOfLane::Foreign)
    );
    assert_eq!(Lanes::parse("").expect("none"), Lanes::default());
    for bad in [
        "com.example.shop",
        "com.example.shop=12",
        "com#x=111111111111",
        "a=111111111111;x",
    ] {
        assert!(Lanes::parse(bad).is_err(), "{bad}");
    }
}
