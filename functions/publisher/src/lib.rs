//! The publisher API, for business backends anywhere (not only on AWS):
//! `POST /publisher/v1/notifications` (the body is the `onegrant.notification` detail),
//! `POST /publisher/v1/cancels` (`{openid, idempotency_key}`, the `onegrant.cancel`
//! detail) and `GET /publisher/v1/notifications/{idempotency_key}?openid=…` (what became
//! of it).
//!
//! Each request is signed by its publisher (`domain::publisher::signature`); one that is
//! not is refused 401 before anything is read or stored, and counted. The publisher is
//! the `source`: it sees and changes only its own notifications, on the same code path
//! as the bus (`notify::publish`: the same validation, idempotency and answers). Each
//! publisher's calls are counted by the minute (`PUBLISHER_REQUESTS_PER_MINUTE`).

use futures::future::BoxFuture;
use lambda_http::http::Method;
use lambda_http::{Body, Request, RequestExt, Response};
use notify::Kind;
use onegrant::Deps;
use onegrant::domain::OpenId;
use onegrant::domain::publisher::signature::{
    self, PUBLISHER_HEADER, SIGNATURE_HEADER, Signed, TIMESTAMP_HEADER,
};
use onegrant::events::EventError;
use onegrant::http::{ApiError, MAX_BODY_BYTES, REPLAYED_HEADER, json_response, respond};
use serde_json::Value;

/// The handler as `onegrant::http::run` and the local stack take it.
pub fn handler(deps: &Deps, req: Request) -> BoxFuture<'_, Response<Body>> {
    let budget = onegrant::http::budget(&req, deps.config.limits.handler_budget);
    let route = onegrant::http::route(&req);
    Box::pin(onegrant::http::within(budget, route, handle(deps, req)))
}

/// The function's handler: one request in, one response out.
pub async fn handle(deps: &Deps, req: Request) -> Response<Body> {
    respond(serve(deps, &req).await)
}

async fn serve(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    if req.body().len() > MAX_BODY_BYTES {
        return Err(ApiError::PayloadTooLarge);
    }
    let source = signed_by(deps, req)?;
    deps.store
        .count_publisher_call(&source, deps.clock.now())
        .await?;
    let path = req.uri().path().trim_end_matches('/');
    match (req.method().clone(), path) {
        (Method::POST, "/publisher/v1/notifications") => {
            publish(deps, &source, Kind::Notification, req).await
        }
        (Method::POST, "/publisher/v1/cancels") => publish(deps, &source, Kind::Cancel, req).await,
        (Method::GET, _) => status(deps, &source, req).await,
        // API Gateway routes only the declared routes here.
        _ => Err(ApiError::NotFound),
    }
}

/// The publisher that signed `req`, or 401 (counted by reason) with nothing read.
fn signed_by(deps: &Deps, req: &Request) -> Result<String, ApiError> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let signed = Signed {
        publisher: header(PUBLISHER_HEADER),
        timestamp: header(TIMESTAMP_HEADER),
        signature: header(SIGNATURE_HEADER),
    };
    let target = signature::target(req.uri().path(), req.uri().query());
    let request = signature::Request {
        method: req.method().as_str(),
        target: &target,
        body: req.body().as_ref(),
    };
    match signature::verify(&deps.config.publishers, signed, &request, deps.clock.now()) {
        Ok(publisher) => Ok(publisher.source.clone()),
        Err(refusal) => {
            onegrant::metrics::count_by(
                onegrant::metrics::name::PUBLISHER_REFUSALS,
                "Reason",
                refusal.as_str().to_string(),
                1,
            );
            tracing::warn!(
                reason = refusal.as_str(),
                "publisher API request refused: not signed by a publisher"
            );
            Err(ApiError::Unsigned)
        }
    }
}

/// A notification or a cancel, as the bus would take it, answered in HTTP.
async fn publish(
    deps: &Deps,
    source: &str,
    kind: Kind,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let detail: Value =
        serde_json::from_slice(req.body().as_ref()).map_err(|_| ApiError::MalformedJson)?;
    let answer = notify::publish(deps, source, kind, &detail)
        .await
        .map_err(|e| match e {
            EventError::Store(e) => ApiError::from(e),
            EventError::Event(_) | EventError::Answer(_) => ApiError::Internal,
        })?;
    notify::count(&answer);
    let status = answer["status"].as_str().unwrap_or_default();
    match status {
        "invalid" => Err(ApiError::Unprocessable {
            code: "invalid_event",
            message: answer["reason"].as_str().unwrap_or("invalid").to_string(),
        }),
        "conflict" => Err(ApiError::IdempotencyConflict(
            "this idempotency_key was used with another payload".into(),
        )),
        "created" => json_response(201, &answer),
        "duplicate" => {
            let mut response = json_response(200, &answer)?;
            response.headers_mut().insert(
                REPLAYED_HEADER,
                lambda_http::http::HeaderValue::from_static("true"),
            );
            Ok(response)
        }
        _ => json_response(200, &answer),
    }
}

/// `GET /publisher/v1/notifications/{idempotency_key}?openid=…`: the publisher's own
/// notification only (another's key, or another user, is 404).
async fn status(deps: &Deps, source: &str, req: &Request) -> Result<Response<Body>, ApiError> {
    // The key as the path's last segment, decoded: the same whether API Gateway passed
    // the path decoded or not (its path parameters are decoded, the local stack's not).
    let path = signature::decoded(req.uri().path());
    let key = path
        .strip_prefix("/publisher/v1/notifications/")
        .filter(|k| onegrant::domain::inbox::is_idempotency_key(k))
        .ok_or(ApiError::NotFound)?;
    let query = req.query_string_parameters();
    let openid = query
        .first("openid")
        .ok_or_else(|| ApiError::InvalidQuery("openid is required".into()))
        .and_then(|o| {
            OpenId::parse(o).map_err(|_| ApiError::InvalidQuery("openid is not an openid".into()))
        })?;
    match deps.store.notification_status(source, key, &openid).await? {
        Some(found) => json_response(200, &found),
        None => Err(ApiError::NotFound),
    }
}
