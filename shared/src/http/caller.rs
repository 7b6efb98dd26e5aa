//! Who is calling: the openid a verified session token names, and — before anything is
//! read or written for them — whether the user's erasure still lets that token in.

use lambda_http::Request;

use super::error::ApiError;
use crate::domain::OpenId;
use crate::session::Sessions;

/// The caller of a read route: authenticated and admitted, then its read counted
/// against `READS_PER_MINUTE` (429 with `Retry-After` past it, before anything is read).
#[cfg(feature = "store")]
pub async fn authenticate_read(req: &Request, deps: &crate::Deps) -> Result<OpenId, ApiError> {
    let openid = caller(req, &deps.sessions).await?.admitted(deps).await?;
    deps.store.count_read(&openid, deps.clock.now()).await?;
    Ok(openid)
}

/// The caller, from a verified token, not yet admitted: a handler checks the request
/// whole first (a bad one reads and writes nothing), then [`Caller::admitted`].
#[derive(Debug)]
#[cfg_attr(not(feature = "store"), allow(dead_code))]
pub struct Caller {
    openid: OpenId,
    issued_at: i64,
}

/// The caller a verified `Authorization: Bearer` token names ([`bearer`]).
pub async fn caller(req: &Request, sessions: &Sessions) -> Result<Caller, ApiError> {
    let (openid, issued_at) = bearer(req, sessions).await?;
    Ok(Caller { openid, issued_at })
}

#[cfg(feature = "store")]
impl Caller {
    /// The caller's openid, unless the user's erasure refuses the token: one issued
    /// before it began, or while it runs, is answered 401
    /// (`domain::erasure::Tombstone::admits_token`). The first request with a token
    /// issued after it was done reopens the account. One strongly consistent read (two
    /// at once, and a write a day, when inactivity erases: `INACTIVE_USER_DAYS`).
    pub async fn admitted(self, deps: &crate::Deps) -> Result<OpenId, ApiError> {
        let Caller { openid, issued_at } = self;
        let (tombstone, active) = deps.store.admission(&openid).await?;
        if let Some(tombstone) = tombstone {
            if !tombstone.admits_token(issued_at) {
                tracing::info!("a session token the user's erasure refuses");
                return Err(ApiError::Unauthorized);
            }
            if tombstone.reopened_by(issued_at) {
                deps.store.reopen(&openid, &tombstone).await?;
            }
        }
        // Their activity moved on, once a day, when inactivity erases.
        let now = deps.clock.now();
        if deps.store.limits().inactive_user_days > 0
            && crate::domain::erasure::moves_activity(
                active,
                crate::domain::erasure::activity_day(now),
            )
        {
            deps.store.touch_activity(&openid, now).await?;
        }
        Ok(openid)
    }
}

/// The caller's openid, from a verified `Authorization: Bearer` token (invariant I8).
pub async fn authenticate(req: &Request, sessions: &Sessions) -> Result<OpenId, ApiError> {
    Ok(bearer(req, sessions).await?.0)
}

/// The openid a verified `Authorization: Bearer` token names, and when it was issued.
pub async fn bearer(req: &Request, sessions: &Sessions) -> Result<(OpenId, i64), ApiError> {
    let header = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or(ApiError::Unauthorized)?;
    let (scheme, token) = header
        .trim()
        .split_once(' ')
        .ok_or(ApiError::Unauthorized)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ApiError::Unauthorized);
    }
    sessions.verify_issued(token.trim()).await.map_err(|err| {
        tracing::info!(reason = %err, "session token refused");
        ApiError::Unauthorized
    })
}

/// The address the request came from, as API Gateway's HTTP API saw it (behind
/// CloudFront, CloudFront's). `None` without a request context.
pub fn source_ip(req: &Request) -> Option<std::net::IpAddr> {
    use lambda_http::RequestExt;
    use lambda_http::request::RequestContext;
    let Some(RequestContext::ApiGatewayV2(context)) = req.request_context_ref() else {
        return None;
    };
    let ip = context.http.source_ip.as_deref()?;
    ip.parse().ok()
}
