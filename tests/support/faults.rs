//! A fault-injecting DynamoDB proxy: between the SDK and the emulator, it answers what
//! real DynamoDB answers and the emulator never does — throttles, transaction
//! conflicts, 500s — or forwards a request and loses (or delays) the answer, so the
//! write is applied while the client never hears of it.
//!
//! Rules match by operation (`TransactWriteItems`, `UpdateItem`, …) and optionally a
//! substring of the request body (an item key such as `PLAN#water`), apply to every
//! `every`-th matching request, `times` times (0: without end), and are counted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// What the proxy does to a matching request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `ThrottlingException` (400), not forwarded.
    Throttle,
    /// `ProvisionedThroughputExceededException` (400), not forwarded.
    ProvisionedThroughput,
    /// `TransactionInProgressException` (400): another attempt with the same
    /// `ClientRequestToken` is still running. Not forwarded.
    InProgress,
    /// A transaction conflict, not forwarded: `TransactionCanceledException` with
    /// `TransactionConflict` reasons for a transaction, `TransactionConflictException`
    /// for a single-item write.
    Conflict,
    /// `InternalServerError` (500), not forwarded.
    ServerError,
    /// A 503 the model does not name (`ServiceUnavailable`, as DynamoDB's front end may
    /// answer), not forwarded.
    Unavailable,
    /// Forwarded and applied; the answer is lost (the connection fails mid-answer).
    CommitThenDrop,
    /// Forwarded and applied; the answer arrives this late.
    CommitThenDelay(Duration),
    /// Held, never answered (the client's attempt times out), and applied only when a
    /// request meeting [`Fault::ReleaseHeld`] comes: a write that commits late, after
    /// the client has stopped asking.
    HoldThenCommit,
    /// Forwarded; then every held request is applied, before this one's answer goes
    /// back (the client learns of nothing held until after it has this answer).
    ReleaseHeld,
}

/// Every fault a write may meet once, each of which must leave the same outcome as
/// none: what DynamoDB answers when it did not run the request, and a commit whose
/// answer is lost.
/// A body pattern matching the claim's transaction, the only one reserving a grant: its
/// grant update's first value set (the state, `:u0` as the store's `Change` numbers
/// it) is `reserved`.
pub const RESERVES_A_GRANT: &str = "\":u0\":{\"S\":\"reserved\"}";

/// A body pattern matching a transaction giving a grant back (a settlement's restore):
/// its grant update's first value set (the state) is `available`.
pub const GIVES_A_GRANT_BACK: &str = "\":u0\":{\"S\":\"available\"}";

pub const ONCE: [Fault; 7] = [
    Fault::Throttle,
    Fault::ProvisionedThroughput,
    Fault::InProgress,
    Fault::Conflict,
    Fault::ServerError,
    Fault::Unavailable,
    Fault::CommitThenDrop,
];

#[derive(Debug, Clone)]
struct Rule {
    operation: String,
    pattern: Option<String>,
    fault: Fault,
    /// How many more times it applies (None: without end).
    left: Option<u32>,
    every: u32,
    seen: u32,
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    injected: Vec<(String, Fault)>,
    /// Each injected request's `ClientRequestToken`, if it had one (in step with
    /// `injected`).
    tokens: Vec<Option<String>>,
    held: Vec<Request>,
    /// Held requests applied: the emulator's status and the request's body.
    released: Vec<(u16, String)>,
}

/// A request as received: method, path, headers, body.
type Request = (Method, Uri, HeaderMap, Bytes);

/// A running proxy in front of `upstream`.
pub struct FaultProxy {
    pub url: String,
    state: Arc<Mutex<State>>,
    _task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy to the DynamoDB endpoint `upstream`.
    pub async fn start(upstream: &str) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind port 0");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        let client = onegrant::aws::http_client_builder()
            .build()
            .expect("an HTTP client");
        let upstream = upstream.trim_end_matches('/').to_string();
        let shared = state.clone();
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let (state, client, upstream) = (shared.clone(), client.clone(), upstream.clone());
                async move { handle(&state, &client, &upstream, method, uri, headers, body).await }
            },
        );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url,
            state,
            _task: task,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Injects `fault` into `times` requests of `operation` (`*`: any; 0 times: all of
    /// them) whose body contains `pattern`, if given.
    pub fn inject(&self, operation: &str, pattern: Option<&str>, fault: Fault, times: u32) {
        self.inject_every(operation, pattern, fault, times, 1);
    }

    /// Like [`FaultProxy::inject`], into every `every`-th matching request only.
    pub fn inject_every(
        &self,
        operation: &str,
        pattern: Option<&str>,
        fault: Fault,
        times: u32,
        every: u32,
    ) {
        self.lock().rules.push(Rule {
            operation: operation.to_string(),
            pattern: pattern.map(str::to_string),
            fault,
            left: (times > 0).then_some(times),
            every: every.max(1),
            seen: 0,
        });
    }

    /// Waits until a request has been held ([`Fault::HoldThenCommit`]): a write sent
    /// from another task has reached the proxy.
    pub async fn until_held(&self) {
        while self.lock().held.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.lock().rules.clear();
    }

    /// The faults injected so far: (operation, fault).
    pub fn injected(&self) -> Vec<(String, Fault)> {
        self.lock().injected.clone()
    }

    /// The distinct transactions among the requests that got `fault`: a transaction
    /// sent again with its token after an unknown outcome (a slow answer) is one.
    pub fn transactions_with(&self, fault: Fault) -> usize {
        let state = self.lock();
        let mut untokened = 0;
        let tokens: std::collections::BTreeSet<&String> = state
            .injected
            .iter()
            .zip(&state.tokens)
            .filter(|((_, f), _)| *f == fault)
            .filter_map(|(_, t)| {
                // A request without a token is a transaction of its own.
                untokened += usize::from(t.is_none());
                t.as_ref()
            })
            .collect();
        tokens.len() + untokened
    }

    /// The held requests applied so far: the emulator's status and the body.
    pub fn released(&self) -> Vec<(u16, String)> {
        self.lock().released.clone()
    }
}

/// The fault for this request, if a rule takes it (and counts it).
fn pick(state: &Mutex<State>, operation: &str, body: &str) -> Option<Fault> {
    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
    let mut chosen = None;
    for rule in state.rules.iter_mut() {
        if (rule.operation != "*" && rule.operation != operation)
            || rule.left == Some(0)
            || rule.pattern.as_deref().is_some_and(|p| !body.contains(p))
        {
            continue;
        }
        rule.seen += 1;
        if rule.seen % rule.every != 0 {
            continue;
        }
        if let Some(left) = rule.left.as_mut() {
            *left -= 1;
        }
        chosen = Some(rule.fault);
        break;
    }
    if let Some(fault) = chosen {
        state.injected.push((operation.to_string(), fault));
        let token = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|b| b["ClientRequestToken"].as_str().map(str::to_string));
        state.tokens.push(token);
    }
    chosen
}

fn error(status: StatusCode, kind: &str, extra: serde_json::Value) -> Response {
    let mut body = json!({"__type": format!("com.amazonaws.dynamodb.v20120810#{kind}"),
                          "message": format!("injected {kind}")});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    (
        status,
        [("content-type", "application/x-amz-json-1.0")],
        body.to_string(),
    )
        .into_response()
}

async fn handle(
    state: &Mutex<State>,
    client: &reqwest::Client,
    upstream: &str,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let operation = target.rsplit('.').next().unwrap_or_default().to_string();
    let text = String::from_utf8_lossy(&body).to_string();
    let fault = pick(state, &operation, &text);
    match fault {
        Some(Fault::Throttle) => {
            return error(StatusCode::BAD_REQUEST, "ThrottlingException", json!({}));
        }
        Some(Fault::ProvisionedThroughput) => {
            return error(
                StatusCode::BAD_REQUEST,
                "ProvisionedThroughputExceededException",
                json!({}),
            );
        }
        Some(Fault::InProgress) => {
            return error(
                StatusCode::BAD_REQUEST,
                "TransactionInProgressException",
                json!({}),
            );
        }
        Some(Fault::ServerError) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                json!({}),
            );
        }
        Some(Fault::Unavailable) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                json!({}),
            );
        }
        Some(Fault::Conflict) if operation == "TransactWriteItems" => {
            let items = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|r| r["TransactItems"].as_array().map(Vec::len))
                .unwrap_or(1);
            let reasons: Vec<_> = (0..items)
                .map(|_| json!({"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}))
                .collect();
            return error(
                StatusCode::BAD_REQUEST,
                "TransactionCanceledException",
                json!({"CancellationReasons": reasons}),
            );
        }
        Some(Fault::Conflict) => {
            return error(
                StatusCode::BAD_REQUEST,
                "TransactionConflictException",
                json!({}),
            );
        }
        Some(Fault::HoldThenCommit) => {
            state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .held
                .push((method, uri, headers, body));
            return std::future::pending::<Response>().await;
        }
        Some(Fault::CommitThenDrop | Fault::CommitThenDelay(_) | Fault::ReleaseHeld) | None => {}
    }
    let Some((status, answer_headers, bytes)) =
        forward(client, upstream, (method, uri, headers, body)).await
    else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    match fault {
        Some(Fault::ReleaseHeld) => {
            let held = std::mem::take(&mut state.lock().unwrap_or_else(|p| p.into_inner()).held);
            for request in held {
                let body = String::from_utf8_lossy(&request.3).to_string();
                let status = forward(client, upstream, request)
                    .await
                    .map_or(0, |(status, _, _)| status.as_u16());
                state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .released
                    .push((status, body));
            }
        }
        Some(Fault::CommitThenDrop) => {
            // The answer starts and then the connection fails: the client never learns
            // that the write was applied.
            let failing = futures::stream::once(async {
                Err::<Bytes, std::io::Error>(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "answer dropped by fault injection",
                ))
            });
            return Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/x-amz-json-1.0")
                .body(Body::from_stream(failing))
                .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response());
        }
        Some(Fault::CommitThenDelay(delay)) => tokio::time::sleep(delay).await,
        _ => {}
    }
    let mut response = Response::builder().status(status.as_u16());
    for (name, value) in &answer_headers {
        if name != "content-length" && name != "transfer-encoding" {
            response = response.header(name, value);
        }
    }
    response
        .body(Body::from(bytes))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

/// Sends `request` on to the emulator: its answer's status, headers and body.
async fn forward(
    client: &reqwest::Client,
    upstream: &str,
    (method, uri, headers, body): Request,
) -> Option<(StatusCode, HeaderMap, Bytes)> {
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut request = client.request(method, format!("{upstream}{path}"));
    for (name, value) in &headers {
        if name != "host" && name != "content-length" {
            request = request.header(name, value);
        }
    }
    let answer = request.body(body).send().await.ok()?;
    let status = answer.status();
    let answer_headers = answer.headers().clone();
    let bytes = answer.bytes().await.unwrap_or_default();
    Some((status, answer_headers, bytes))
}
