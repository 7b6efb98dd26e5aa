//! The cold-start bench: each function's release binary against a minimal local Lambda
//! Runtime API, on the real emulator and the WeChat stand-in.
//!
//! Per function: the stripped binary's size; init (process start to its first
//! `invocation/next` poll — config, clients, runtime); the first invoke (the cold
//! request, from handing the event out to its response) and warm invokes (p50 of
//! `COLDSTART_WARM`, default 20). The events are the ones in `events/`, with a real
//! session token and login code.
//!
//! ```sh
//! scripts/coldstart      # builds the release binaries, then runs this
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use onegrant::secrets::Secret;
use onegrant::wechat::push::PushCrypto;
use onegrant_local::stack::{LOCAL_APPID, LOCAL_PUSH, local_publishers};
use onegrant_tests::{SHOP, TestApp, order_detail, spawn_app_isolated};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Mutex, mpsc, oneshot};

/// What the runtime API hands out and what it heard back.
struct Runtime {
    events: Mutex<mpsc::Receiver<(String, Value)>>,
    polled: Mutex<Option<oneshot::Sender<Instant>>>,
    /// (request id, when, the response body; `None` for a function error).
    answers: mpsc::Sender<(String, Instant, Option<String>)>,
}

async fn next(State(rt): State<Arc<Runtime>>) -> impl IntoResponse {
    if let Some(polled) = rt.polled.lock().await.take() {
        let _ = polled.send(Instant::now());
    }
    let Some((id, event)) = rt.events.lock().await.recv().await else {
        return (
            axum::http::StatusCode::GONE,
            HeaderMap::new(),
            String::new(),
        );
    };
    let mut headers = HeaderMap::new();
    let deadline = onegrant::Clock::real_now().timestamp_millis() + 30_000;
    for (name, value) in [
        ("lambda-runtime-aws-request-id", id.clone()),
        ("lambda-runtime-deadline-ms", deadline.to_string()),
        (
            "lambda-runtime-invoked-function-arn",
            "arn:aws:lambda:us-east-1:123456789012:function:bench".to_string(),
        ),
        ("lambda-runtime-trace-id", format!("Root=1-{id}")),
    ] {
        if let Ok(value) = value.parse() {
            headers.insert(name, value);
        }
    }
    (axum::http::StatusCode::OK, headers, event.to_string())
}

async fn response(
    State(rt): State<Arc<Runtime>>,
    Path(id): Path<String>,
    body: String,
) -> impl IntoResponse {
    let _ = rt.answers.send((id, Instant::now(), Some(body))).await;
    axum::http::StatusCode::ACCEPTED
}

async fn error(State(rt): State<Arc<Runtime>>, Path(id): Path<String>) -> impl IntoResponse {
    let _ = rt.answers.send((id, Instant::now(), None)).await;
    axum::http::StatusCode::ACCEPTED
}

/// One function's figures.
struct Figures {
    size_mb: f64,
    init_ms: f64,
    first_ms: f64,
    warm_p50_ms: f64,
    errors: usize,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn event(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../events/{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// The event of invocation `n` of `function`: the sample event with a live token, a
/// fresh login code or a fresh idempotency key.
async fn event_for(app: &TestApp, function: &str, token: &str, openid: &str, n: usize) -> Value {
    let with_token = |mut e: Value| {
        e["headers"]["authorization"] = json!(format!("Bearer {token}"));
        e
    };
    match function {
        "session" => {
            let (code, _) = app.login_code("bench").await;
            let mut e = event("session-create");
            e["body"] = json!(json!({"code": code}).to_string());
            e
        }
        "grants" => with_token(event("grants-list")),
        "reminders" => with_token(event("reminders-get")),
        "inbox" => with_token(event("inbox-unread-count")),
        "notify" => {
            let mut e = event("notify-order-shipped");
            e["detail"]["idempotency_key"] = json!(format!("bench-{n}"));
            e["detail"]["openid"] = json!(openid);
            e
        }
        "wechat-callback" => callback_event(openid, n),
        "outcomes" => event("outcomes-schedule"),
        "wechat-ips" => event("wechat-ips-schedule"),
        "publisher" => publisher_event(openid, n),
        _ => event("dispatcher-schedule"),
    }
}

/// A notification the local publisher publishes, signed as its backend signs it, under
/// a fresh idempotency key each time (answered 201).
fn publisher_event(openid: &str, n: usize) -> Value {
    let body = order_detail(openid, &format!("bench-publisher-{n}"), json!({})).to_string();
    let now = onegrant::Clock::real_now().timestamp();
    let target = "/publisher/v1/notifications";
    let mut e = event("publisher-publish");
    e["headers"]["x-onegrant-timestamp"] = json!(now.to_string());
    e["headers"]["x-onegrant-signature"] = json!(SHOP.sign(now, "POST", target, body.as_bytes()));
    e["body"] = json!(body);
    e
}

/// A popup event WeChat pushes in safe mode (JSON, as `LOCAL_PUSH` configures): sealed
/// and signed with the local push settings, a fresh nonce each time.
fn callback_event(openid: &str, n: usize) -> Value {
    let setting = |name: &str| {
        LOCAL_PUSH
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .expect("a local push setting")
    };
    let crypto = PushCrypto::new(
        Secret::new(setting("WECHAT_PUSH_TOKEN")),
        setting("WECHAT_PUSH_AES_KEY"),
        LOCAL_APPID,
    )
    .expect("the local push key");
    let now = onegrant::Clock::real_now().timestamp();
    let plain = json!({"ToUserName": setting("WECHAT_ORIGINAL_ID"), "FromUserName": openid,
        "CreateTime": now, "MsgType": "event", "Event": "subscribe_msg_popup_event",
        "List": [{"TemplateId": "tmpl_water_reminder", "SubscribeStatusString": "accept",
                  "PopupScene": "0"}]});
    let (ts, nonce) = (now.to_string(), format!("bench{n}"));
    let encrypt = crypto.encrypt(&plain.to_string(), &[7; 16]);
    let query = json!({
        "signature": crypto.signature(&ts, &nonce),
        "timestamp": ts,
        "nonce": nonce,
        "openid": openid,
        "encrypt_type": "aes",
        "msg_signature": crypto.msg_signature(&ts, &nonce, &encrypt),
    });
    let raw_query = query
        .as_object()
        .map(|q| {
            q.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join("&")
        })
        .unwrap_or_default();
    let mut e = event("wechat-callback-verify");
    e["routeKey"] = json!("POST /wechat/callback");
    e["requestContext"]["routeKey"] = json!("POST /wechat/callback");
    e["requestContext"]["http"]["method"] = json!("POST");
    e["rawQueryString"] = json!(raw_query);
    e["queryStringParameters"] = query;
    e["headers"]["content-type"] = json!("application/json");
    e["body"] =
        json!(json!({"ToUserName": setting("WECHAT_ORIGINAL_ID"), "Encrypt": encrypt}).to_string());
    e
}

async fn measure(app: &TestApp, dir: &std::path::Path, function: &str, warm: usize) -> Figures {
    let binary = dir.join(function);
    let size = std::fs::metadata(&binary)
        .unwrap_or_else(|e| panic!("{binary:?}: {e}; run scripts/coldstart"))
        .len();
    let (events_in, events_out) = mpsc::channel(4);
    let (answers_in, mut answers) = mpsc::channel(4);
    let (polled_in, polled) = oneshot::channel();
    let runtime = Arc::new(Runtime {
        events: Mutex::new(events_out),
        polled: Mutex::new(Some(polled_in)),
        answers: answers_in,
    });
    let api = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next))
        .route(
            "/2018-06-01/runtime/invocation/{id}/response",
            post(response),
        )
        .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
        .with_state(runtime);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, api).await;
    });

    let token = app.login("bench").await;
    let openid = app.login_code("bench").await.1;
    let binary = binary.to_string_lossy().to_string();
    let address = address.to_string();
    let mut env = vec![
        ("AWS_LAMBDA_RUNTIME_API", address.as_str()),
        ("AWS_LAMBDA_FUNCTION_NAME", function),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"),
        ("AWS_LAMBDA_LOG_GROUP_NAME", "bench"),
        ("AWS_LAMBDA_LOG_STREAM_NAME", "bench"),
    ];
    if function == "wechat-callback" {
        env.extend(LOCAL_PUSH);
    }
    let publishers = local_publishers();
    if function == "publisher" {
        env.push(("ONEGRANT_PUBLISHERS", publishers.as_str()));
    }
    let mut command = tokio::process::Command::from(app.dispatcher_process(&binary, &env));
    command
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null());
    let started = Instant::now();
    let mut child = command.spawn().expect("the function starts");
    let first_poll = tokio::time::timeout(Duration::from_secs(30), polled)
        .await
        .expect("the function polls within 30 s")
        .expect("poll time");
    let mut errors = 0;
    let mut times = Vec::new();
    for n in 0..=warm {
        let e = event_for(app, function, &token, &openid, n).await;
        let id = format!("bench-{function}-{n}");
        let sent = Instant::now();
        events_in.send((id.clone(), e)).await.expect("handed out");
        let (answered, at, body) = tokio::time::timeout(Duration::from_secs(60), answers.recv())
            .await
            .expect("an answer within 60 s")
            .expect("answer");
        assert_eq!(answered, id);
        // An HTTP function answers an API Gateway response: it must be a 2xx (a
        // publish is 201).
        let ok = body.as_ref().is_some_and(|b| {
            serde_json::from_str::<Value>(b)
                .ok()
                .and_then(|v| v.get("statusCode").and_then(Value::as_u64))
                .is_none_or(|status| (200..300).contains(&status))
        });
        if !ok && errors == 0 {
            eprintln!("{function}: its first failed answer: {body:?}");
        }
        errors += usize::from(!ok);
        times.push(at - sent);
    }
    let _ = child.kill().await;
    server.abort();
    let first = times.remove(0);
    times.sort();
    Figures {
        size_mb: size as f64 / 1_000_000.0,
        init_ms: ms(first_poll - started),
        first_ms: ms(first),
        warm_p50_ms: times.get(times.len() / 2).map_or(0.0, |d| ms(*d)),
        errors,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let warm: usize = std::env::var("COLDSTART_WARM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = std::env::var("COLDSTART_BIN_DIR").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release"),
        PathBuf::from,
    );
    let app = spawn_app_isolated(&[]).await;
    let mut rows: HashMap<&str, Figures> = HashMap::new();
    let functions = [
        "session",
        "grants",
        "reminders",
        "inbox",
        "notify",
        "dispatcher",
        "wechat-callback",
        "outcomes",
        "wechat-ips",
        "publisher",
    ];
    for function in functions {
        rows.insert(function, measure(&app, &dir, function, warm).await);
    }
    println!(
        "{:<15} {:>8} {:>9} {:>10} {:>13} {:>7}",
        "function", "size MB", "init ms", "first ms", "warm p50 ms", "errors"
    );
    for function in functions {
        let f = &rows[function];
        println!(
            "{:<15} {:>8.1} {:>9.1} {:>10.1} {:>13.1} {:>7}",
            function, f.size_mb, f.init_ms, f.first_ms, f.warm_p50_ms, f.errors
        );
    }
    // The issue's bound: every release binary at most 8 MB (decimal, 8,000,000 bytes;
    // 7.63 MiB), stripped.
    for function in functions {
        assert!(
            rows[function].size_mb <= 8.0,
            "{function} is {:.2} MB, over 8 MB",
            rows[function].size_mb
        );
    }
    let failed: usize = rows.values().map(|f| f.errors).sum();
    assert_eq!(
        failed, 0,
        "every invocation answered without a function error"
    );
}
