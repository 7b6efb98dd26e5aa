//! The stand-in's state: what it plays (one mini-program, its templates), what it has
//! issued and seen, and the faults a test asks for.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Json;
use axum::response::{IntoResponse, Response};
use onegrant::domain::Templates;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::standin::push::{PushRecord, PushTarget};

/// How long an issued login code can be exchanged.
pub(crate) const CODE_TTL: Duration = Duration::from_secs(300);
/// Tokens live 2 hours; stable tokens rotate in their last 5 minutes.
pub(crate) const TOKEN_TTL: Duration = Duration::from_secs(7200);
pub(crate) const ROTATE_WINDOW: Duration = Duration::from_secs(300);

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
pub(crate) enum TokenKind {
    Plain,
    Stable,
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub(crate) kind: TokenKind,
    pub(crate) expires_at: Instant,
}

#[derive(Debug, Clone)]
pub(crate) struct Code {
    pub(crate) openid: String,
    pub(crate) issued_at: Instant,
    pub(crate) used: bool,
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
pub(crate) struct TokenFault {
    #[serde(default)]
    pub(crate) hang_ms: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub(crate) struct LoginFault {
    #[serde(default)]
    pub(crate) errcode: Option<i64>,
    #[serde(default)]
    pub(crate) hang_ms: Option<u64>,
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
pub(crate) struct Inner {
    pub(crate) tokens: HashMap<String, Token>,
    pub(crate) current_stable: Option<String>,
    pub(crate) codes: HashMap<String, Code>,
    pub(crate) openids: HashSet<String>,
    pub(crate) quota: HashMap<(String, String), u64>,
    /// The popup accepts pushed with their `CreateTime` (openid, template, time): a
    /// copy of one pushed again, as WeChat retries, is the same tap and buys nothing.
    pub(crate) taps_pushed: HashSet<(String, String, i64)>,
    pub(crate) faults: HashMap<String, Fault>,
    pub(crate) login_fault: Option<LoginFault>,
    pub(crate) token_hang: Option<Duration>,
    pub(crate) latency: Duration,
    pub(crate) in_flight: HashSet<String>,
    /// Openids whose sends are held (after any latency) until released.
    pub(crate) held: HashSet<String>,
    pub(crate) deliveries: Vec<Delivery>,
    pub(crate) counters: Counters,
    pub(crate) push: Option<PushTarget>,
    pub(crate) pushes: Vec<PushRecord>,
    /// What `getcallbackip` lists (set by the control API; `None`: [`CALLBACK_IPS`]).
    pub(crate) callback_ips: Option<Vec<String>>,
}

/// The addresses `getcallbackip` lists unless a test sets others: loopback (where the
/// stand-in pushes from) and a network of WeChat's.
pub const CALLBACK_IPS: [&str; 2] = ["127.0.0.1", "101.226.103.0/25"];

pub(crate) struct Shared {
    pub(crate) config: StandinConfig,
    pub(crate) inner: Mutex<Inner>,
    pub(crate) client: reqwest::Client,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent-enough test state; keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(crate) type AppState = Arc<Shared>;

/// A refusal as WeChat words it: the errmsg ends with a request id (` rid: …`), which
/// must never reach a onegrant answer.
pub(crate) fn wx(errcode: i64, errmsg: &str) -> Response {
    let rid = uuid::Uuid::new_v4().simple().to_string();
    let errmsg = format!("{errmsg} rid: {}-{}", &rid[..8], &rid[8..16]);
    Json(json!({"errcode": errcode, "errmsg": errmsg})).into_response()
}

pub(crate) fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// A msgid as WeChat issues them: a 64-bit number above 2^53.
pub(crate) fn random_msgid() -> u64 {
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
