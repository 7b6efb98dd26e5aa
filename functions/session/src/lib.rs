//! `POST /v1/session`: exchanges a `wx.login` code for a onegrant session token.
//!
//! WeChat (`jscode2session`) vouches for the code and names the user's openid; every
//! code of one user leads to the same openid, hence the same account. The answer is a
//! signed, expiring bearer token that every other route takes identity from.

use futures::future::BoxFuture;
use lambda_http::{Body, Request, Response};
use onegrant::Core;
use onegrant::http::{ApiError, json_body, json_response, respond};
use onegrant::telemetry::openid_hash;

/// Longest login code we pass on to WeChat (real codes are 32 characters).
const MAX_CODE_LEN: usize = 256;

/// The handler as `onegrant::http::run_core` takes it (the local stack adapts it).
pub fn handler(deps: &Core, req: Request) -> BoxFuture<'_, Response<Body>> {
    let budget = onegrant::http::budget(&req, deps.config.limits.handler_budget);
    let route = onegrant::http::route(&req);
    Box::pin(onegrant::http::within(budget, route, handle(deps, req)))
}

/// The function's handler: one request in, one response out.
pub async fn handle(deps: &Core, req: Request) -> Response<Body> {
    respond(login(deps, &req).await)
}

async fn login(deps: &Core, req: &Request) -> Result<Response<Body>, ApiError> {
    let body = json_body(req)?;
    let code = match body.get("code") {
        Some(serde_json::Value::String(code)) => code,
        Some(_) => return Err(ApiError::InvalidBody("code must be a string".into())),
        None => return Err(ApiError::InvalidBody("code is required".into())),
    };
    if code.is_empty() || code.chars().count() > MAX_CODE_LEN || code.chars().any(char::is_control)
    {
        return Err(ApiError::Unprocessable {
            code: "invalid_code_format",
            message: format!("code must be 1 to {MAX_CODE_LEN} printable characters"),
        });
    }
    let login = deps.wechat.code_to_session(code).await?;
    let issued = deps.sessions.issue(&login.openid, deps.clock.now()).await?;
    tracing::info!(openid = %openid_hash(login.openid.as_str()), "session issued");
    json_response(200, &issued)
}
