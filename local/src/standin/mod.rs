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
//!   buys, a change takes the template's quota away
//! - `GET /control/pushes`: every push made (with its `create_time`, which a retry of it
//!   carries) and how it was answered

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use onegrant::domain::Templates;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

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
mod subscribe;
mod tokens;

pub use push::{PushEventSpec, PushRecord, PushTarget};

/// How long an issued login code can be exchanged.
const CODE_TTL: Duration = Duration::from_secs(300);
/// Tokens live 2 hours; stable tokens rotate in their last 5 minutes.
const TOKEN_TTL: Duration = Duration::from_secs(7200);
const ROTATE_WINDOW: Duration = Duration::from_secs(300);

/// What the stand-in plays: one mini-program with its templates.
#[derive(Debug, Clone)]
pub struct StandinConfig {
    pub appid: String,
    pub secret: String,
    pub templates: Templates,
    /// Where to push events from the start (the control API can change it).
    pub push: Option<PushTarget>,
    /// WeChat's time, as its pushes carry it: a test gives the stand-in the clock it
    /// gives onegrant, so a push signed after the test moved it is fresh.
    pub clock: onegrant::Clock,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenKind {
    Plain,
    Stable,
}

#[derive(Debug, Clone)]
struct Token {
    kind: TokenKind,
    expires_at: Instant,
}

#[derive(Debug, Clone)]
struct Code {
    openid: String,
    issued_at: Instant,
    used: bool,
}

/// A fault injected for one openid's sends.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Fault {
    pub openid: String,
    /// Answer this errcode instead of sending.
    #[serde(default)]
    pub errcode: Option<i64>,
    /// How many sends the fault applies to (default 1; 0 means every send).
    #[serde(default)]
    pub times: Option<u32>,
    /// Hold the request this long before answering (past the client's timeout).
    #[serde(default)]
    pub hang_ms: Option<u64>,
    /// With `hang_ms`: whether the message is delivered while the client waits.
    #[serde(default)]
    pub deliver: Option<bool>,
    /// Deliver, then drop the connection instead of answering.
    #[serde(default)]
    pub drop_after_delivery: Option<bool>,
    /// Answer this HTTP status (e.g. 502) with no errcode, without delivering.
    #[serde(default)]
    pub http_status: Option<u16>,
    /// Deliver, then answer a body that is not JSON.
    #[serde(default)]
    pub garbage: Option<bool>,
    /// Deliver, then answer JSON without an errcode.
    #[serde(default)]
    pub no_errcode: Option<bool>,
    /// Deliver, but push no sent event (WeChat's push lost).
    #[serde(default)]
    pub no_push: Option<bool>,
    /// Deliver (and push the sent event) at once, then hold the answer this long.
    #[serde(default)]
    pub hang_after_delivery_ms: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
struct TokenFault {
    #[serde(default)]
    hang_ms: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
struct LoginFault {
    #[serde(default)]
    errcode: Option<i64>,
    #[serde(default)]
    hang_ms: Option<u64>,
}

/// One message the stand-in delivered.
#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    pub msgid: u64,
    pub openid: String,
    pub template_id: String,
    pub data: Value,
    pub page: Option<String>,
    pub miniprogram_state: Option<String>,
    pub lang: Option<String>,
}

/// Call and answer counts, for tests.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    pub token_calls: u64,
    pub stable_token_calls: u64,
    pub force_refresh_calls: u64,
    pub jscode2session_calls: u64,
    pub send_calls: u64,
    /// How often each errcode was answered by the send API (0 = delivered).
    pub send_errcodes: BTreeMap<i64, u64>,
}

#[derive(Default)]
struct Inner {
    tokens: HashMap<String, Token>,
    current_stable: Option<String>,
    codes: HashMap<String, Code>,
    openids: HashSet<String>,
    quota: HashMap<(String, String), u64>,
    faults: HashMap<String, Fault>,
    login_fault: Option<LoginFault>,
    token_hang: Option<Duration>,
    latency: Duration,
    in_flight: HashSet<String>,
    /// Openids whose sends are held (after any latency) until released.
    held: HashSet<String>,
    deliveries: Vec<Delivery>,
    counters: Counters,
    push: Option<PushTarget>,
    pushes: Vec<PushRecord>,
    /// What `getcallbackip` lists (set by the control API; `None`: [`CALLBACK_IPS`]).
    callback_ips: Option<Vec<String>>,
}

/// The addresses `getcallbackip` lists unless a test sets others: loopback (where the
/// stand-in pushes from) and a network of WeChat's.
pub const CALLBACK_IPS: [&str; 2] = ["127.0.0.1", "101.226.103.0/25"];

struct Shared {
    config: StandinConfig,
    inner: Mutex<Inner>,
    client: reqwest::Client,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent-enough test state; keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type AppState = Arc<Shared>;

/// A refusal as WeChat words it: the errmsg ends with a request id (` rid: …`), which
/// must never reach a onegrant answer.
fn wx(errcode: i64, errmsg: &str) -> Response {
    let rid = uuid::Uuid::new_v4().simple().to_string();
    let errmsg = format!("{errmsg} rid: {}-{}", &rid[..8], &rid[8..16]);
    Json(json!({"errcode": errcode, "errmsg": errmsg})).into_response()
}

fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// A msgid as WeChat issues them: a 64-bit number above 2^53.
fn random_msgid() -> u64 {
    let raw = u64::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or([7; 8]),
    );
    (1u64 << 60) + raw % (1u64 << 62)
}

/// The openid this mini-program sees for `user`: stable per user, 28 characters.
pub fn openid_for(appid: &str, user: &str) -> String {
    let digest = Sha256::digest(format!("{appid}:{user}").as_bytes());
    format!("o{}", &hex::encode(digest)[..27])
}

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
