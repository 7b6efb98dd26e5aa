//! WeChat's message push: `GET /wechat/callback` (URL verification) and
//! `POST /wechat/callback` (events), plain, compatible or safe mode, XML or JSON.
//!
//! Identity comes only from WeChat's signature (I8): `signature` over the token,
//! timestamp and nonce for URL verification and plain pushes (plain mode only as an
//! explicit insecure opt-in, `WECHAT_PUSH_INSECURE_PLAIN`); `msg_signature`, which also
//! covers the ciphertext, for encrypted ones — checked in constant time before the
//! body is decrypted or parsed. A push whose `ToUserName` is not the configured
//! original id (`WECHAT_ORIGINAL_ID`) is refused in every mode. URL verification
//! echoes only a plain `echostr`, decrypts nothing and writes nothing. A timestamp outside ±5 minutes, a body over 64 KiB, or
//! any failed check answers 401 (413) and changes nothing. A push that verifies but
//! cannot be read is answered `success` (WeChat's retries would not make it readable)
//! and logged; one that reads is recorded once (`store::callback`), applied once (a
//! refusal voids the template's available grants and pauses its plans) and answered
//! `success`.
//!
//! Before any of it, WeChat's door (`door`): where no edge keeps it, a request from
//! an address outside WeChat's list is refused 403.

use futures::future::BoxFuture;
use lambda_http::http::Method;
use lambda_http::{Body, Request, RequestExt, Response};
use onegrant::Deps;
use onegrant::config::{PushConfig, PushMode};
use onegrant::domain::callback::{self, PushEvent};
use onegrant::http::{ApiError, respond};
use onegrant::store::callback::PushRecorded;
use onegrant::telemetry::openid_hash;
use onegrant::wechat::push::PushCrypto;

/// Largest push body read (WeChat's are a few hundred bytes).
pub const MAX_PUSH_BYTES: usize = 64 * 1024;
/// How far a push's timestamp may be from server time, either way.
pub const TIMESTAMP_WINDOW_SECONDS: i64 = 300;

/// How long WeChat waits for a push's answer before it drops the connection (and
/// retries, three times in all), less a margin: a push the database cannot take in
/// time is answered 503 within it, never left to time out.
pub const WECHAT_PUSH_WINDOW: std::time::Duration = std::time::Duration::from_millis(4500);

/// The handler as `onegrant::http::run` and the local stack take it.
pub fn handler(deps: &Deps, req: Request) -> BoxFuture<'_, Response<Body>> {
    let budget =
        onegrant::http::budget(&req, deps.config.limits.handler_budget).min(WECHAT_PUSH_WINDOW);
    let route = onegrant::http::route(&req);
    Box::pin(onegrant::http::within(budget, route, handle(deps, req)))
}

/// The function's handler: one request in, one response out.
pub async fn handle(deps: &Deps, req: Request) -> Response<Body> {
    // Without a push token the deployed stack has no callback routes; here too,
    // nothing answers but 404.
    let Some(push) = deps.config.push.as_ref() else {
        tracing::warn!("a push arrived but WECHAT_PUSH_TOKEN is not configured");
        return respond(Err(ApiError::NotFound));
    };
    let appid = &deps.config.wechat.appid;
    let crypto = match &push.aes_key {
        None => PushCrypto::signatures_only(push.token.clone(), appid),
        Some(key) => match PushCrypto::new(push.token.clone(), key.expose(), appid) {
            Ok(crypto) => crypto,
            Err(_) => {
                tracing::error!("WECHAT_PUSH_AES_KEY is not a valid EncodingAESKey");
                return respond(Err(ApiError::Unavailable));
            }
        },
    };
    if let Err(refused) = door(deps, push, &req).await {
        return respond(Err(refused));
    }
    let result = match *req.method() {
        Method::GET => verify_url(deps, push, &crypto, &req).await,
        Method::POST => receive(deps, push, &crypto, &req).await,
        _ => Err(ApiError::NotFound),
    };
    respond(result)
}

/// WeChat's door: a request from an address not in WeChat's list (as the `wechat-ips`
/// function last read it) is refused 403 before anything else is read — unless the
/// check is off, the request came through the stack's front (its web ACL kept the door,
/// before API Gateway; one that went around it while `ORIGIN_CHECK=count` is checked
/// here), or no list was read yet (the signatures decide alone, as before). The list is
/// read at most every 5 minutes per container, so a refused flood costs no read per
/// request. A path with anything after `/wechat/callback` (a trailing slash API Gateway
/// would route here) is refused too: the front's rules match the path's end.
async fn door(deps: &Deps, push: &PushConfig, req: &Request) -> Result<(), ApiError> {
    if !req.uri().path().ends_with("/wechat/callback") {
        return Err(ApiError::NotFound);
    }
    if !push.wechat_ips_check || onegrant::http::through_front(&deps.config, req) {
        return Ok(());
    }
    let list = deps.store.wechat_ips_kept().await.map_err(|e| {
        tracing::error!(error = %onegrant::telemetry::error_chain(&e), "WeChat's addresses could not be read");
        ApiError::Unavailable
    })?;
    let Some(list) = list else {
        return Ok(());
    };
    if onegrant::http::source_ip(req).is_some_and(|from| list.ips.admits(from)) {
        return Ok(());
    }
    onegrant::metrics::count(onegrant::metrics::name::PUSHES_FROM_OUTSIDE, 1);
    tracing::warn!("a request from an address not in WeChat's list was refused");
    Err(ApiError::Forbidden)
}

fn text(status: u16, body: &str) -> Result<Response<Body>, ApiError> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Body::Text(body.to_string()))
        .map_err(|_| ApiError::Internal)
}

/// The request's query parameter `name`.
fn query(req: &Request, name: &str) -> Option<String> {
    req.query_string_parameters()
        .first(name)
        .map(str::to_string)
}

/// The timestamp and nonce, if the timestamp is a number within the window.
fn fresh(deps: &Deps, req: &Request) -> Result<(String, String), ApiError> {
    let timestamp = query(req, "timestamp").ok_or(ApiError::Unauthorized)?;
    let nonce = query(req, "nonce")
        .filter(|n| !n.is_empty() && n.len() <= 64)
        .ok_or(ApiError::Unauthorized)?;
    let at = timestamp
        .parse::<i64>()
        .map_err(|_| ApiError::Unauthorized)?;
    if deps.clock.now().timestamp().abs_diff(at) > TIMESTAMP_WINDOW_SECONDS.unsigned_abs() {
        return Err(ApiError::Unauthorized);
    }
    Ok((timestamp, nonce))
}

/// URL verification: `echostr` back, verbatim, when `signature` verifies. Only a plain
/// echostr is echoed (WeChat's are short strings of letters and digits): nothing is
/// decrypted, so no signed query turns this into an oracle for a push's ciphertext.
/// In safe and compatible mode nothing is written either (an echo reveals nothing the
/// caller did not send, and a push there needs `msg_signature`), so a verification
/// never spends the nonce of a push signed alike. In plain mode, where `signature`
/// alone admits a push, its nonce is remembered: the query cannot be replayed as one.
async fn verify_url(
    deps: &Deps,
    push: &PushConfig,
    crypto: &PushCrypto,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let (timestamp, nonce) = fresh(deps, req)?;
    let echostr = query(req, "echostr")
        .filter(|e| callback::is_plain_echostr(e))
        .ok_or(ApiError::Unauthorized)?;
    let signature = query(req, "signature").ok_or(ApiError::Unauthorized)?;
    if !crypto.verify_signature(&timestamp, &nonce, &signature) {
        return Err(ApiError::Unauthorized);
    }
    if push.mode == PushMode::Plain {
        fresh_nonce(deps, &timestamp, &nonce).await?;
    }
    text(200, &echostr)
}

/// A verified push addressed to another account (or to none): refused, unrecorded.
fn another_account() -> Result<Response<Body>, ApiError> {
    tracing::warn!("a push addressed to another account was refused");
    Err(ApiError::Unauthorized)
}

/// 401 if this verified request's nonce was seen before.
async fn fresh_nonce(deps: &Deps, timestamp: &str, nonce: &str) -> Result<(), ApiError> {
    if deps
        .store
        .record_nonce(timestamp, nonce, deps.clock.now())
        .await?
    {
        Ok(())
    } else {
        tracing::warn!("a signed request was replayed");
        Err(ApiError::Unauthorized)
    }
}

async fn receive(
    deps: &Deps,
    push: &PushConfig,
    crypto: &PushCrypto,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let bytes = req.body().as_ref();
    if bytes.len() > MAX_PUSH_BYTES {
        return Err(ApiError::PayloadTooLarge);
    }
    let (timestamp, nonce) = fresh(deps, req)?;
    let body = std::str::from_utf8(bytes).map_err(|_| ApiError::Unauthorized)?;
    let plain = match push.mode {
        // The body is read (within 64 KiB, no DTD) for its Encrypt field only, which
        // msg_signature then verifies. Compatible mode always carries the ciphertext
        // too, so it is held to it: a body without one would be covered by no
        // signature at all.
        PushMode::Safe | PushMode::Compatible => {
            let encrypt = callback::encrypted_field(body, push.format)
                .ok()
                .flatten()
                .ok_or(ApiError::Unauthorized)?;
            let msg_signature = query(req, "msg_signature").ok_or(ApiError::Unauthorized)?;
            if !crypto.verify_msg_signature(&timestamp, &nonce, &encrypt, &msg_signature) {
                return Err(ApiError::Unauthorized);
            }
            crypto.decrypt(&encrypt).map_err(|_| {
                tracing::error!(
                    "a signed push did not decrypt: is WECHAT_PUSH_AES_KEY right, and the appid?"
                );
                ApiError::Unauthorized
            })?
        }
        // Plain mode: `signature` covers no body (WeChat's design; use safe mode).
        PushMode::Plain => {
            let signature = query(req, "signature").ok_or(ApiError::Unauthorized)?;
            if !crypto.verify_signature(&timestamp, &nonce, &signature) {
                return Err(ApiError::Unauthorized);
            }
            body.to_string()
        }
    };
    // Signed, but for another mini-program (or forged for ours under a plain-mode
    // query): nothing of it is taken, nor its nonce.
    if callback::addressee(&plain, push.format).is_some_and(|to| to != push.original_id) {
        return another_account();
    }
    let message = match callback::parse(&plain, push.format) {
        Ok(message) => message,
        Err(e) => {
            // Authentic but unreadable: a retry would not help. Nothing is written for
            // it (its addressee unknown, its nonce is not spent either).
            tracing::warn!(error = %e, "a verified push could not be read; acknowledged");
            return text(200, "success");
        }
    };
    if message.to_user != push.original_id {
        return another_account();
    }
    let now = deps.clock.now();
    // WeChat asks that the user be forgotten: the erasure begun (once, however often
    // the push comes), its steps carried on by the dispatcher. Not on a plain-mode
    // push, whose signature covers no body: anyone holding one signed query could
    // erase any user.
    if let PushEvent::Erasure(cause) = &message.event {
        if push.mode == PushMode::Plain {
            tracing::warn!(
                cause = cause.as_str(),
                "WeChat asked that a user be forgotten in plain mode, whose body no signature covers: not acted on (use safe mode)"
            );
            return text(200, "success");
        }
        let fresh = deps.store.record_nonce(&timestamp, &nonce, now).await?;
        // Begun if none is there, or over one the user came back from before this push
        // was created — also on a retry with the nonce spent (an attempt that recorded
        // it and then failed); never a second for the same push, nor by an older push
        // on a fresh nonce.
        let begins = deps
            .store
            .tombstone(&message.openid)
            .await?
            .is_none_or(|there| there.erased_again_by(message.create_time));
        if begins {
            let erasure = deps
                .store
                .start_erasure(&message.openid, *cause, now)
                .await?;
            tracing::info!(
                cause = cause.as_str(),
                state = erasure.state.as_str(),
                "WeChat asked that a user be forgotten"
            );
        } else {
            tracing::warn!(
                fresh,
                "an erasure push for a user already being forgotten, or older than their last erasure: nothing changed"
            );
        }
        return text(200, "success");
    }
    let taps = deps.store.popup_accepts(&message, &deps.config.templates);
    let recorded = deps
        .store
        .record_push(&timestamp, &nonce, &message, &taps, now)
        .await?;
    tracing::info!(
        openid = %openid_hash(message.openid.as_str()),
        ?recorded,
        "push received"
    );
    // Applied once: a new event, or a retry of one whose first attempt stopped before
    // it was marked applied. A replayed request does nothing.
    let to_apply = match recorded {
        PushRecorded::Recorded(key)
        | PushRecorded::Duplicate {
            key,
            applied: false,
        } => Some(key),
        PushRecorded::Duplicate { applied: true, .. }
        | PushRecorded::Ignored
        | PushRecorded::Erased => None,
        PushRecorded::Replayed => {
            tracing::warn!("a push request was replayed; nothing changed");
            None
        }
    };
    if let Some(key) = to_apply {
        let cause = match &message.event {
            PushEvent::Change(_) => "WeChat change event",
            PushEvent::Popup(_) => "WeChat popup event",
            PushEvent::Sent(_) => "WeChat sent event",
            PushEvent::Erasure(_) | PushEvent::Other { .. } => "WeChat event",
        };
        let applying = deps.store.apply_push(&message, &deps.config.templates, now);
        onegrant::store::audit::attributed(cause, applying).await?;
        deps.store.push_applied(&key).await?;
    }
    text(200, "success")
}
