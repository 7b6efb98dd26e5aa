//! HTTP plumbing shared by the HTTP functions.
//!
//! [`ApiError`] is the one place where failures become statuses and bodies
//! (`{"error": {"code", "message"}}`, API.md). Causes are logged where a lower-layer
//! error is converted, with their chain; bodies carry only the code and a human message.

use std::convert::Infallible;

mod caller;
mod error;

use error::log_chain;
pub use error::{ApiError, MAX_BODY_BYTES};

#[cfg(feature = "store")]
pub use caller::authenticate_read;
pub use caller::{Caller, authenticate, bearer, caller, source_ip};

use futures::future::BoxFuture;
use lambda_http::{Body, Request, Response};
use serde::Serialize;

/// An HTTP function's handler, as each function crate exports it: the Lambda `main`
/// and the local stack both call it.
#[cfg(feature = "store")]
pub type Handler = for<'a> fn(&'a crate::Deps, Request) -> BoxFuture<'a, Response<Body>>;

/// An HTTP function's whole `main`: tracing, dependencies built once, then events served.
#[cfg(feature = "store")]
pub async fn run(
    function: &'static str,
    handler: Handler,
    needs: &[crate::config::Need],
) -> Result<(), lambda_http::Error> {
    crate::telemetry::init();
    crate::metrics::init(function);
    let deps = crate::Deps::from_env(needs).await?;
    let deps = &deps;
    lambda_http::run(lambda_http::service_fn(move |req: Request| async move {
        let span = invocation_span(function, &req);
        let response = match from_elsewhere(&deps.config, &req) {
            Some(refused) => refused,
            None => tracing::Instrument::instrument(handler(deps, req), span).await,
        };
        crate::metrics::flush();
        Ok::<_, Infallible>(response)
    }))
    .await
}

/// The span every log line of one invocation is written in: the function and Lambda's
/// request id (logged once, on the span, not per call).
fn invocation_span(function: &'static str, req: &Request) -> tracing::Span {
    use lambda_http::RequestExt;
    let request_id = req
        .lambda_context_ref()
        .map(|context| context.request_id.clone())
        .unwrap_or_default();
    tracing::error_span!("invocation", function, request_id)
}

/// A handler of a function built on [`crate::Core`] alone.
pub type CoreHandler = for<'a> fn(&'a crate::Core, Request) -> BoxFuture<'a, Response<Body>>;

/// The whole `main` of an HTTP function that never touches the table.
pub async fn run_core(
    function: &'static str,
    handler: CoreHandler,
    needs: &[crate::config::Need],
) -> Result<(), lambda_http::Error> {
    crate::telemetry::init();
    crate::metrics::init(function);
    let core = crate::Core::from_env(needs).await?;
    let core = &core;
    lambda_http::run(lambda_http::service_fn(move |req: Request| async move {
        let span = invocation_span(function, &req);
        let response = match from_elsewhere(&core.config, &req) {
            Some(refused) => refused,
            None => tracing::Instrument::instrument(handler(core, req), span).await,
        };
        crate::metrics::flush();
        Ok::<_, Infallible>(response)
    }))
    .await
}

/// The header the stack's CloudFront distribution adds to every request it forwards
/// (the template's edge protection, docs/deployment.md): its value is the origin secret.
pub const ORIGIN_HEADER: &str = "x-onegrant-origin";

/// Whether `req` came through the stack's front (CloudFront's edge or the regional
/// REST API): it carries the origin secret they add (compared in constant time). `false`
/// without one configured.
pub fn through_front(config: &crate::config::Config, req: &Request) -> bool {
    let Some(expected) = config.origin.as_ref() else {
        return false;
    };
    let given = req
        .headers()
        .get(ORIGIN_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    crate::wechat::push::same(given, expected.expose())
}

/// With an origin secret configured (`ORIGIN_SECRET`, the edge protection), the answer
/// to a request that does not carry it — one sent to the API's own address, around
/// CloudFront and its per-client limits — before any handler runs: 403, nothing read.
pub fn from_elsewhere(config: &crate::config::Config, req: &Request) -> Option<Response<Body>> {
    config.origin.as_ref()?;
    if through_front(config, req) {
        return None;
    }
    crate::metrics::count(crate::metrics::name::FROM_ELSEWHERE, 1);
    // Counted only while clients move to the edge's address (`ORIGIN_CHECK=count`).
    config
        .origin_enforced
        .then(|| ApiError::Forbidden.into_response())
}

/// Turns a handler's result into the response API Gateway returns.
pub fn respond(result: Result<Response<Body>, ApiError>) -> Response<Body> {
    result.unwrap_or_else(ApiError::into_response)
}

/// How long the handler of `req` may work: the configured budget, and in Lambda never
/// past the invocation's deadline less a second (for the answer to leave), whatever the
/// function's timeout was set to.
pub fn budget(req: &Request, configured: std::time::Duration) -> std::time::Duration {
    use lambda_http::RequestExt;
    let left = req
        .lambda_context_ref()
        .and_then(|context| i64::try_from(context.deadline).ok())
        .and_then(chrono::DateTime::from_timestamp_millis)
        .and_then(|deadline| (deadline - crate::Clock::real_now()).to_std().ok())
        .map(|left| left.saturating_sub(std::time::Duration::from_secs(1)));
    left.map_or(configured, |left| configured.min(left))
}

/// `handling`, or `503 unavailable` with `Retry-After` once `budget` has passed: every
/// HTTP handler answers in the error shape before its function's timeout, never with
/// API Gateway's bare 503. A write cut short this way is safe to retry: every write is
/// idempotent by its request or action id (a committed one answers as a replay).
/// The answer is counted ([`crate::metrics::name::REQUESTS`]) by `route` and status
/// class (`429` apart).
pub async fn within(
    budget: std::time::Duration,
    route: String,
    handling: impl std::future::Future<Output = Response<Body>>,
) -> Response<Body> {
    let response = match tokio::time::timeout(budget, handling).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(
                budget_ms = u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
                "request out of time: answered 503"
            );
            ApiError::Unavailable.into_response()
        }
    };
    // 429 on its own (a per-user limit refusing: the abuse alarm's signal), else the
    // status class.
    let status = match response.status().as_u16() {
        429 => "429".to_string(),
        code => format!("{}xx", code / 100),
    };
    metrics::counter!(crate::metrics::name::REQUESTS, "Route" => route, "Status" => status)
        .increment(1);
    response
}

/// The route `req` came by: API Gateway's route key (`POST /v1/notifications/{id}/read`),
/// or `other`.
pub fn route(req: &Request) -> String {
    use lambda_http::RequestExt;
    use lambda_http::request::RequestContext;
    match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(context)) => context
            .route_key
            .clone()
            .unwrap_or_else(|| "other".to_string()),
        // Not API Gateway's HTTP API (a test, the local stack): one label, so raw paths
        // with ids never become dimensions.
        _ => "other".to_string(),
    }
}

/// The header of an answer replayed for an idempotency key already applied
/// (`Idempotent-Replayed: true`): what the first application answered, not the state
/// now.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// A JSON response with `status`.
pub fn json_response<T: Serialize>(status: u16, value: &T) -> Result<Response<Body>, ApiError> {
    let body = serde_json::to_string(value).map_err(|e| {
        log_chain(tracing::Level::ERROR, "response serialisation failed", &e);
        ApiError::Internal
    })?;
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::Text(body))
        .map_err(|_| ApiError::Internal)
}

/// The request body decoded as JSON, after the size limit.
pub fn json_body(req: &Request) -> Result<serde_json::Value, ApiError> {
    let bytes: &[u8] = req.body().as_ref();
    if bytes.len() > MAX_BODY_BYTES {
        return Err(ApiError::PayloadTooLarge);
    }
    serde_json::from_slice(bytes).map_err(|_| ApiError::MalformedJson)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "store")]
    use crate::store::StoreError;

    #[test]
    fn the_handler_budget_never_runs_past_the_invocations_deadline() {
        use lambda_http::RequestExt;
        let configured = std::time::Duration::from_secs(9);
        let plain = Request::default();
        assert_eq!(
            budget(&plain, configured),
            configured,
            "no Lambda context: as set"
        );
        let mut context = lambda_http::lambda_runtime::Context::default();
        context.deadline = u64::try_from(
            (crate::Clock::real_now() + chrono::Duration::seconds(4)).timestamp_millis(),
        )
        .unwrap_or(0);
        let invoked = Request::default().with_lambda_context(context);
        let left = budget(&invoked, configured);
        assert!(left <= std::time::Duration::from_secs(3), "{left:?}");
        assert!(left >= std::time::Duration::from_secs(2), "{left:?}");
    }

    #[test]
    fn error_bodies_have_the_api_shape_and_503_says_when_to_retry() {
        let response = ApiError::Unavailable.into_response();
        assert_eq!(response.status(), 503);
        assert_eq!(
            response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()),
            Some("1")
        );
        let body: serde_json::Value =
            serde_json::from_slice(response.body().as_ref()).expect("JSON body");
        assert_eq!(body["error"]["code"], "unavailable");
        assert!(body["error"]["message"].is_string());
    }

    #[cfg(feature = "store")]
    #[test]
    fn internal_failures_never_reach_the_body() {
        let err = StoreError::Sdk("secret internal detail arn:aws:dynamodb:x".into());
        let response = ApiError::from(err).into_response();
        let text = String::from_utf8_lossy(response.body().as_ref()).to_string();
        assert_eq!(response.status(), 500);
        assert!(!text.contains("secret internal detail"));
        assert!(!text.contains("arn:aws"));
    }
}
