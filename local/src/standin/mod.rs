//! The WeChat stand-in: a local HTTP server that follows the real WeChat server API
//! contract closely enough to test onegrant against (reference/wechat.md), plus a
//! control API for tests.
//!
//! WeChat endpoints:
//! - `GET /cgi-bin/token`: a new token per call; the previous one stays valid 5 minutes.
//! - `POST /cgi-bin/stable_token`: normal mode returns the current token while it has
//!   more than 5 minutes left; `force_refresh` replaces it at once (and is counted).
//! - `GET /sns/jscode2session`: single-use codes (40029 unknown or expired, 40163 used),
//!   one openid per user.
//! - `POST /cgi-bin/message/subscribe/send`: 41001/40001/42001 token checks, 40037
//!   unknown template, 40003 unknown openid, 41030 page, 47003 naming the field for a
//!   missing or ill-typed keyword, 43101 without real quota, 43108 for a concurrent send
//!   to one openid, and `msgid` as a JSON number above 2^53.
//!
//! Control API (tests and local runs), all JSON:
//! - `POST /control/login-codes {"user"}` → `{"code", "openid"}`
//! - `POST /control/quota {"openid", "template_id", "count"}` adds quota as taps would;
//!   `GET /control/quota?openid=&template_id=` reads it
//! - `POST /control/faults {"openid", "errcode"?, "times"?, "hang_ms"?, "deliver"?,
//!   "drop_after_delivery"?, "http_status"?, "garbage"?, "no_errcode"?, "no_push"?,
//!   "hang_after_delivery_ms"?}`;
//!   `DELETE /control/faults`
//! - `POST /control/login-fault {"errcode"?, "hang_ms"?}` for `jscode2session`
//! - `POST /control/token-fault {"hang_ms"?}` holds every stable_token call that long
//!   (`{}` clears it)
//! - `POST /control/hold {"openid", "held"}`: hold that user's sends in flight until
//!   released (a test's window, however slow the machine)
//! - `POST /control/latency {"ms"}`; `POST /control/tokens/expire`
//! - `GET /control/deliveries`, `GET /control/counters`, `POST /control/reset`
//! - `POST /control/push-target {"url", "token", "aes_key"?, "format"?, "delay_ms"?,
//!   "copies"?}` makes the stand-in push like WeChat's message push (see [`push`]): a
//!   sent event after every delivery (a fault's `"no_push": true` loses it);
//!   `DELETE /control/push-target` stops it
//! - `POST /control/push-events {"event": "popup"|"change"|"sent", "openid",
//!   "template_id", "status"?, "msgid"?, "error_code"?, "create_time"?}` pushes one
//!   event now (created now unless `create_time` says) and answers the callback's
//!   statuses; a popup `accept` also adds the quota its tap
//!   buys (once: a copy pushed again with its `create_time` is the same tap), a change
//!   takes the template's quota away
//! - `GET /control/pushes`: every push made (with its `create_time`, which a retry of it
//!   carries) and how it was answered

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::{get, post};

use crate::standin::control::{
    control_add_quota, control_clear_faults, control_clear_push_target, control_counters,
    control_deliveries, control_expire_tokens, control_fault, control_hold, control_latency,
    control_login_code, control_login_fault, control_push_event, control_push_target,
    control_pushes, control_quota, control_reset, control_token_fault,
};
use crate::standin::subscribe::send;
use crate::standin::tokens::{jscode2session, stable_token, token};

mod control;
pub mod push;
pub mod rules;
mod state;
mod subscribe;
mod tokens;

pub use push::{PushEventSpec, PushRecord, PushTarget};
pub use state::{CALLBACK_IPS, Counters, Delivery, Fault, StandinConfig, openid_for};
use state::{Inner, Shared};

/// Builds the stand-in's router.
pub fn router(config: StandinConfig) -> Router {
    // The push client: reqwest is built without a default TLS provider.
    onegrant::aws::install_crypto_provider();
    let inner = Inner {
        push: config.push.clone(),
        ..Inner::default()
    };
    let state = Arc::new(Shared {
        config,
        inner: Mutex::new(inner),
        client: onegrant::aws::http_client_builder()
            .build()
            .unwrap_or_default(),
    });
    Router::new()
        .route("/cgi-bin/token", get(token))
        .route("/cgi-bin/stable_token", post(stable_token))
        .route("/sns/jscode2session", get(jscode2session))
        .route("/cgi-bin/getcallbackip", get(tokens::callback_ips))
        .route("/cgi-bin/message/subscribe/send", post(send))
        .route("/control/login-codes", post(control_login_code))
        .route("/control/quota", post(control_add_quota).get(control_quota))
        .route(
            "/control/faults",
            post(control_fault).delete(control_clear_faults),
        )
        .route("/control/login-fault", post(control_login_fault))
        .route("/control/token-fault", post(control_token_fault))
        .route("/control/latency", post(control_latency))
        .route("/control/hold", post(control_hold))
        .route("/control/tokens/expire", post(control_expire_tokens))
        .route("/control/deliveries", get(control_deliveries))
        .route("/control/counters", get(control_counters))
        .route("/control/reset", post(control_reset))
        .route(
            "/control/push-target",
            post(control_push_target).delete(control_clear_push_target),
        )
        .route("/control/push-events", post(control_push_event))
        .route("/control/pushes", get(control_pushes))
        .route("/control/callback-ips", post(control::control_callback_ips))
        .with_state(state)
}

/// Serves the stand-in on `listener` until the task is dropped or aborted.
pub fn spawn(
    config: StandinConfig,
    listener: tokio::net::TcpListener,
) -> tokio::task::JoinHandle<()> {
    let app = router(config);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "WeChat stand-in stopped");
        }
    })
}
