//! Serves the functions locally the way AWS would call them.
//!
//! - [`api_router`]: the HTTP API on one base URL, with exactly the routes
//!   `template.yaml` declares (`sam local start-api`). A request becomes the
//!   `lambda_http::Request` API Gateway would deliver (path and query parameters
//!   included) and goes to the function's own handler; unknown routes answer API
//!   Gateway's `{"message":"Not Found"}`. Beside them, the contract this
//!   configuration makes of `api/openapi.yaml` ([`crate::contract`]).
//! - [`invoke_router`]: the Lambda Invoke API shape (`sam local start-lambda`):
//!   `POST /2015-03-31/functions/<name>/invocations`, by logical id or binary name. HTTP
//!   functions take an API Gateway v2 event and answer its response JSON.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use lambda_http::{Body, Request, RequestExt};
use onegrant::Deps;
use onegrant::events::Handler as EventHandler;
use onegrant::http::Handler as HttpHandler;
use onegrant::telemetry::error_chain;
use serde_json::json;

use crate::template::{self, Route};

/// API Gateway HTTP APIs accept payloads up to 10 MB; the handlers apply API.md's 64 KiB.
const GATEWAY_PAYLOAD_LIMIT: usize = 10 * 1024 * 1024;

/// The handler of the event function built as `binary`.
pub fn event_handler(binary: &str) -> Option<EventHandler> {
    match binary {
        "dispatcher" => Some(dispatcher::invoke),
        "notify" => Some(notify::invoke),
        "outcomes" => Some(outcomes::invoke),
        "session-key-rotation" => Some(session_key_rotation::invoke),
        "wechat-ips" => Some(wechat_ips::invoke),
        _ => None,
    }
}

/// Local invocations get this much time, like the template's function timeout.
const EVENT_BUDGET: std::time::Duration = std::time::Duration::from_secs(55);

/// The handler of the HTTP function built as `binary` (its crate's `handler`).
pub fn http_handler(binary: &str) -> Option<HttpHandler> {
    match binary {
        "session" => Some(session_handler),
        "grants" => Some(grants::handler),
        "reminders" => Some(reminders::handler),
        "inbox" => Some(inbox::handler),
        "publisher" => Some(publisher::handler),
        "wechat-callback" => Some(wechat_callback::handler),
        _ => None,
    }
}

/// The session function's handler, which takes only the [`onegrant::Core`].
fn session_handler(
    deps: &Deps,
    req: Request,
) -> futures::future::BoxFuture<'_, lambda_http::Response<Body>> {
    session::handler(deps, req)
}

struct ApiState {
    deps: Deps,
    routes: Vec<(Route, HttpHandler)>,
}

/// Path parameters if `path` matches the API Gateway path template `pattern`.
fn match_path(pattern: &str, path: &str) -> Option<HashMap<String, String>> {
    let mut params = HashMap::new();
    let mut actual = path.trim_start_matches('/').split('/');
    let mut segments = pattern.trim_start_matches('/').split('/').peekable();
    while let Some(segment) = segments.next() {
        if let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix("+}")) {
            let rest: Vec<&str> = actual.by_ref().collect();
            if rest.is_empty() || segments.peek().is_some() {
                return None;
            }
            params.insert(name.to_string(), rest.join("/"));
            return Some(params);
        }
        let value = actual.next()?;
        match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            Some(name) if !value.is_empty() => {
                params.insert(name.to_string(), value.to_string());
            }
            Some(_) => return None,
            None if segment == value => {}
            None => return None,
        }
    }
    actual.next().is_none().then_some(params)
}

fn query_map(query: Option<&str>) -> HashMap<String, Vec<String>> {
    let mut map: HashMap<String, Vec<String>> = HashMap::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        map.entry(k.into_owned()).or_default().push(v.into_owned());
    }
    map
}

fn lambda_body(bytes: Vec<u8>) -> Body {
    if bytes.is_empty() {
        return Body::Empty;
    }
    match String::from_utf8(bytes) {
        Ok(text) => Body::Text(text),
        Err(e) => Body::Binary(e.into_bytes()),
    }
}

fn into_axum(response: lambda_http::Response<Body>) -> Response {
    let (parts, body) = response.into_parts();
    let bytes = match body {
        Body::Empty => Vec::new(),
        Body::Text(t) => t.into_bytes(),
        Body::Binary(b) => b,
        _ => Vec::new(),
    };
    Response::from_parts(parts, AxumBody::from(bytes))
}

fn not_found() -> Response {
    (
        axum::http::StatusCode::NOT_FOUND,
        axum::Json(json!({"message": "Not Found"})),
    )
        .into_response()
}

async fn dispatch(State(state): State<Arc<ApiState>>, req: axum::extract::Request) -> Response {
    let (parts, body) = req.into_parts();
    let Some((params, handler)) = state.routes.iter().find_map(|(route, handler)| {
        (route.method == parts.method.as_str())
            .then(|| match_path(&route.path, parts.uri.path()))
            .flatten()
            .map(|params| (params, *handler))
    }) else {
        return not_found();
    };
    let bytes = match axum::body::to_bytes(body, GATEWAY_PAYLOAD_LIMIT).await {
        Ok(bytes) => bytes.to_vec(),
        Err(_) => {
            return (
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                axum::Json(json!({"message": "Request Entity Too Large"})),
            )
                .into_response();
        }
    };
    let query = query_map(parts.uri.query());
    let from = parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let request = Request::from_parts(parts, lambda_body(bytes))
        .with_path_parameters(params)
        .with_query_string_parameters(query);
    let request = match from {
        Some(from) => request.with_request_context(source_context(from)),
        None => request,
    };
    // As the deployed functions' `main` does, before the handler.
    if let Some(refused) = onegrant::http::from_elsewhere(&state.deps.config, &request) {
        return into_axum(refused);
    }
    into_axum(handler(&state.deps, request).await)
}

/// API Gateway's request context as far as the local stack knows it: the address the
/// request came from (the socket's peer), as `sourceIp`.
fn source_context(from: std::net::IpAddr) -> lambda_http::request::RequestContext {
    use lambda_http::aws_lambda_events::apigw::{
        ApiGatewayV2httpRequestContext, ApiGatewayV2httpRequestContextHttpDescription,
    };
    let mut http = ApiGatewayV2httpRequestContextHttpDescription::default();
    http.source_ip = Some(from.to_string());
    let mut context = ApiGatewayV2httpRequestContext::default();
    context.http = http;
    lambda_http::request::RequestContext::ApiGatewayV2(context)
}

/// The HTTP API: every route of `template.yaml`, each to its function's handler
/// (served with each connection's peer address: `axum::serve` of
/// `into_make_service_with_connect_info::<SocketAddr>()`).
pub fn api_router(deps: Deps) -> anyhow::Result<Router> {
    let mut routes = Vec::new();
    for route in template::routes()? {
        let handler = http_handler(&route.binary).ok_or_else(|| {
            anyhow::anyhow!(
                "template.yaml routes to {} but no handler is registered",
                route.binary
            )
        })?;
        routes.push((route, handler));
    }
    let contract =
        crate::contract::deployment_contract(&deps.config.templates, &deps.config.reminders)?;
    Ok(Router::new()
        .route(
            crate::contract::PATH,
            axum::routing::get(move || async move { axum::Json(contract) }),
        )
        .fallback(dispatch)
        .with_state(Arc::new(ApiState { deps, routes })))
}

struct InvokeState {
    deps: Deps,
    functions: Vec<template::Function>,
    running: Running,
}

/// How many asynchronous invocations are still running: Lambda runs them on their
/// own, and a test that fanned work out waits for them to end ([`Running::idle`])
/// instead of guessing how long they take.
#[derive(Clone)]
pub struct Running(Arc<tokio::sync::watch::Sender<usize>>);

impl Default for Running {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(0)))
    }
}

impl Running {
    /// Ends once no asynchronous invocation is running.
    pub async fn idle(&self) {
        let mut count = self.0.subscribe();
        // (The sender lives as long as `self`: the wait cannot fail.)
        let _ = count.wait_for(|n| *n == 0).await;
    }

    /// One more running until the returned guard is dropped (also by a panic).
    fn start(&self) -> RunningOne {
        self.0.send_modify(|n| *n += 1);
        RunningOne(self.0.clone())
    }
}

struct RunningOne(Arc<tokio::sync::watch::Sender<usize>>);

impl Drop for RunningOne {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

async fn invoke(
    State(state): State<Arc<InvokeState>>,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
    payload: axum::body::Bytes,
) -> Response {
    let Some(function) = state
        .functions
        .iter()
        .find(|f| f.logical_id == name || f.binary == name)
    else {
        return (
            axum::http::StatusCode::NOT_FOUND,
            [("x-amzn-errortype", "ResourceNotFoundException")],
            axum::Json(json!({"Type": "User", "Message": format!("Function not found: {name}")})),
        )
            .into_response();
    };
    let function_error = |message: String| {
        (
            [("x-amz-function-error", "Unhandled")],
            axum::Json(json!({"errorType": "FunctionError", "errorMessage": message})),
        )
            .into_response()
    };
    match (function.http, http_handler(&function.binary)) {
        (true, Some(handler)) => {
            let Ok(text) = std::str::from_utf8(&payload) else {
                return function_error("the payload is not UTF-8".into());
            };
            let request = match lambda_http::request::from_str(text) {
                Ok(request) => request,
                Err(e) => return function_error(format!("not an API Gateway event: {e}")),
            };
            let response = handler(&state.deps, request).await;
            let (parts, body) = response.into_parts();
            let headers: serde_json::Map<String, serde_json::Value> = parts
                .headers
                .iter()
                .filter_map(|(k, v)| Some((k.to_string(), json!(v.to_str().ok()?))))
                .collect();
            let (body, base64) = match body {
                Body::Text(t) => (json!(t), false),
                Body::Empty => (serde_json::Value::Null, false),
                Body::Binary(b) => (
                    json!(base64::engine::general_purpose::STANDARD.encode(&b)),
                    true,
                ),
                _ => (serde_json::Value::Null, false),
            };
            axum::Json(json!({
                "statusCode": parts.status.as_u16(),
                "headers": headers,
                "body": body,
                "isBase64Encoded": base64,
            }))
            .into_response()
        }
        (false, _) => match event_handler(&function.binary) {
            // Asynchronous, as Lambda's `Event` invocation type: queued, answered 202,
            // run on its own.
            Some(handler)
                if headers
                    .get("x-amz-invocation-type")
                    .is_some_and(|t| t.as_bytes() == b"Event") =>
            {
                let event = match event_payload(&payload) {
                    Ok(event) => event,
                    Err(message) => return function_error(message),
                };
                let state = state.clone();
                let running = state.running.start();
                tokio::spawn(async move {
                    let _running = running;
                    if let Err(e) = handler(&state.deps, event, EVENT_BUDGET).await {
                        tracing::error!(error = %error_chain(&e), "asynchronous invocation failed");
                    }
                });
                axum::http::StatusCode::ACCEPTED.into_response()
            }
            Some(handler) => {
                let event = match event_payload(&payload) {
                    Ok(event) => event,
                    Err(message) => return function_error(message),
                };
                match handler(&state.deps, event, EVENT_BUDGET).await {
                    Ok(answer) => axum::Json(answer).into_response(),
                    Err(e) => function_error(e.to_string()),
                }
            }
            None => function_error(format!("{name} has no local handler")),
        },
        (true, None) => function_error(format!("{name} has no local handler")),
    }
}

/// An event function's payload: JSON, or nothing (null).
fn event_payload(payload: &[u8]) -> Result<serde_json::Value, String> {
    if payload.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))
}

/// The Lambda Invoke API for every function in `template.yaml`, and its count of
/// asynchronous invocations running.
pub fn invoke_router(deps: Deps) -> anyhow::Result<(Router, Running)> {
    let running = Running::default();
    let router = Router::new()
        .route(
            "/2015-03-31/functions/{name}/invocations",
            axum::routing::post(invoke),
        )
        .with_state(Arc::new(InvokeState {
            deps,
            functions: template::functions()?,
            running: running.clone(),
        }));
    Ok((router, running))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_templates_match_like_api_gateway() {
        assert_eq!(match_path("/v1/grants", "/v1/grants"), Some(HashMap::new()));
        assert_eq!(match_path("/v1/grants", "/v1/grants/x"), None);
        assert_eq!(match_path("/v1/grants", "/v1/grant"), None);
        let p = match_path("/v1/reminders/{kind}", "/v1/reminders/water").expect("match");
        assert_eq!(p.get("kind").map(String::as_str), Some("water"));
        assert_eq!(match_path("/v1/reminders/{kind}", "/v1/reminders/"), None);
        let p = match_path("/files/{proxy+}", "/files/a/b").expect("greedy");
        assert_eq!(p.get("proxy").map(String::as_str), Some("a/b"));
    }

    #[test]
    fn query_strings_are_decoded() {
        let q = query_map(Some("limit=20&cursor=a%2Bb&type=order+status&read"));
        assert_eq!(q["limit"], vec!["20"]);
        assert_eq!(q["cursor"], vec!["a+b"]);
        assert_eq!(q["type"], vec!["order status"]);
        assert_eq!(q["read"], vec![""]);
    }
}
