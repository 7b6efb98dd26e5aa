//! Bytes that are not JSON, on every route that takes a JSON body: each answers 400
//! `malformed_json` before the database or WeChat is asked, and nothing is stored.
//!
//! Seen passing on the code it was written against (it cannot fail first): every route
//! already parses its body whole into a `serde_json::Value`, which refuses invalid UTF-8
//! and nesting deeper than 128 even under keys the route ignores. The table keeps it so:
//! a body decoded straight into a route's type would skip unknown keys unchecked, and
//! its invalid UTF-8 and deep nesting there would be stored or answered otherwise.

use onegrant_tests::spawn_app;

/// Every route with a JSON body, as (method, path, signed in).
const JSON_ROUTES: [(&str, &str, bool); 5] = [
    ("POST", "/v1/session", false),
    ("POST", "/v1/grants", true),
    ("PUT", "/v1/reminders/water", true),
    ("POST", "/v1/reminders/water/checkins", true),
    ("PUT", "/v1/preferences", true),
];

fn bad_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    vec![
        (
            "invalid UTF-8 inside a string",
            [&br#"{"code":""#[..], &[0xff, 0xfe], &br#""}"#[..]].concat(),
        ),
        ("invalid UTF-8 alone", vec![0xc3, 0x28]),
        (
            "an overlong encoding of a quote",
            [&br#"{"code":""#[..], &[0xc0, 0xa2], &br#""}"#[..]].concat(),
        ),
        ("a lone surrogate escaped", br#"{"code":"\ud800"}"#.to_vec()),
        ("arrays nested 200 deep", nested(200).into_bytes()),
        (
            "objects nested 200 deep under a valid key",
            format!(
                r#"{{"request_id":"wr_1","results":{}1{}}}"#,
                r#"{"a":"#.repeat(200),
                "}".repeat(200)
            )
            .into_bytes(),
        ),
        ("a NUL byte", vec![0x00]),
    ]
}

#[tokio::test]
async fn invalid_utf8_and_deep_nesting_are_malformed_json_on_every_json_route_and_store_nothing() {
    let app = spawn_app().await;
    let token = app.login("alice").await;
    // What the sign-in itself asked of WeChat and stored: the bad bytes add nothing.
    let calls = |counters: serde_json::Value| counters["jscode2session_calls"].clone();
    let calls_before = calls(app.control("GET", "counters", None).await);
    let stored_before = app.items().await;
    for (method, path, signed_in) in JSON_ROUTES {
        for (name, body) in bad_bodies() {
            app.round_trips.take();
            let token = signed_in.then_some(token.as_str());
            let answer = app.call(method, path, token, Some(body)).await;
            assert_eq!(
                (answer.status, answer.body["error"]["code"].as_str()),
                (400, Some("malformed_json")),
                "{method} {path}, {name}: {}",
                answer.body
            );
            assert_eq!(
                app.round_trips.take(),
                Vec::<String>::new(),
                "{method} {path}, {name}: refused on the bytes alone"
            );
        }
    }
    assert_eq!(
        calls(app.control("GET", "counters", None).await),
        calls_before,
        "bad bytes never reach WeChat"
    );
    assert_eq!(app.items().await, stored_before, "nothing is stored");
}
