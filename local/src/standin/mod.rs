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
//! - `GET /control/pushes`: every push made and how it was answered

pub mod push;
pub mod rules;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use onegrant::domain::Templates;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

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
    deliveries: Vec<Delivery>,
    counters: Counters,
    push: Option<PushTarget>,
    pushes: Vec<PushRecord>,
}

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
        client: reqwest::Client::new(),
    });
    Router::new()
        .route("/cgi-bin/token", get(token))
        .route("/cgi-bin/stable_token", post(stable_token))
        .route("/sns/jscode2session", get(jscode2session))
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

fn check_app(
    config: &StandinConfig,
    appid: Option<&String>,
    secret: Option<&String>,
) -> Option<Response> {
    if appid.map(String::as_str) != Some(config.appid.as_str()) {
        return Some(wx(40013, "invalid appid"));
    }
    if secret.map(String::as_str) != Some(config.secret.as_str()) {
        return Some(wx(40125, "invalid appsecret"));
    }
    None
}

async fn token(State(s): State<AppState>, Query(q): Query<HashMap<String, String>>) -> Response {
    let mut inner = s.lock();
    inner.counters.token_calls += 1;
    if q.get("grant_type").map(String::as_str) != Some("client_credential") {
        return wx(40002, "invalid grant_type");
    }
    if let Some(r) = check_app(&s.config, q.get("appid"), q.get("secret")) {
        return r;
    }
    let now = Instant::now();
    // Each call overwrites: earlier plain tokens keep at most 5 more minutes.
    for t in inner.tokens.values_mut() {
        if t.kind == TokenKind::Plain {
            t.expires_at = t.expires_at.min(now + ROTATE_WINDOW);
        }
    }
    let token = random_token();
    inner.tokens.insert(
        token.clone(),
        Token {
            kind: TokenKind::Plain,
            expires_at: now + TOKEN_TTL,
        },
    );
    Json(json!({"access_token": token, "expires_in": TOKEN_TTL.as_secs()})).into_response()
}

#[derive(Deserialize)]
struct StableTokenRequest {
    grant_type: Option<String>,
    appid: Option<String>,
    secret: Option<String>,
    #[serde(default)]
    force_refresh: bool,
}

async fn stable_token(State(s): State<AppState>, body: Bytes) -> Response {
    let hang = {
        let mut inner = s.lock();
        inner.counters.stable_token_calls += 1;
        inner.token_hang
    };
    if let Some(hang) = hang {
        tokio::time::sleep(hang).await;
    }
    let mut inner = s.lock();
    let Ok(req) = serde_json::from_slice::<StableTokenRequest>(&body) else {
        return wx(47001, "data format error");
    };
    if req.grant_type.as_deref() != Some("client_credential") {
        return wx(40002, "invalid grant_type");
    }
    if let Some(r) = check_app(&s.config, req.appid.as_ref(), req.secret.as_ref()) {
        return r;
    }
    let now = Instant::now();
    if req.force_refresh {
        inner.counters.force_refresh_calls += 1;
        if let Some(old) = inner.current_stable.take() {
            inner.tokens.remove(&old);
        }
    }
    let current = inner
        .current_stable
        .as_ref()
        .and_then(|t| inner.tokens.get(t).map(|info| (t.clone(), info.expires_at)))
        .filter(|(_, expires_at)| *expires_at > now + ROTATE_WINDOW);
    let (token, expires_at) = match current {
        Some(current) => current,
        None => {
            // Rotation: the old token (if any) keeps its own expiry, so both overlap.
            let token = random_token();
            let expires_at = now + TOKEN_TTL;
            inner.tokens.insert(
                token.clone(),
                Token {
                    kind: TokenKind::Stable,
                    expires_at,
                },
            );
            inner.current_stable = Some(token.clone());
            (token, expires_at)
        }
    };
    let expires_in = expires_at.saturating_duration_since(now).as_secs();
    Json(json!({"access_token": token, "expires_in": expires_in})).into_response()
}

async fn jscode2session(
    State(s): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let fault = {
        let mut inner = s.lock();
        inner.counters.jscode2session_calls += 1;
        inner.login_fault.clone()
    };
    if let Some(fault) = fault {
        if let Some(ms) = fault.hang_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if let Some(errcode) = fault.errcode {
            return wx(errcode, "system error");
        }
    }
    if q.get("grant_type").map(String::as_str) != Some("authorization_code") {
        return wx(40002, "invalid grant_type");
    }
    if let Some(r) = check_app(&s.config, q.get("appid"), q.get("secret")) {
        return r;
    }
    let mut inner = s.lock();
    let Some(code) = q.get("js_code").and_then(|c| inner.codes.get_mut(c)) else {
        return wx(40029, "invalid code");
    };
    if code.issued_at.elapsed() > CODE_TTL {
        return wx(40029, "invalid code");
    }
    if code.used {
        return wx(40163, "code been used");
    }
    code.used = true;
    let openid = code.openid.clone();
    Json(json!({"openid": openid, "session_key": random_token()})).into_response()
}

/// Removes an openid from the in-flight set when a send ends, however it ends.
struct InFlight {
    state: AppState,
    openid: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.lock().in_flight.remove(&self.openid);
    }
}

enum Action {
    Answer(Response),
    Deliver {
        drop_connection: bool,
        garbage: bool,
    },
}

fn count(inner: &mut Inner, errcode: i64) {
    *inner.counters.send_errcodes.entry(errcode).or_default() += 1;
}

/// A refused send: the errcode and errmsg WeChat would answer.
struct Refusal(i64, String);

/// Counts a refused send.
fn refuse(inner: &mut Inner, errcode: i64, errmsg: &str) -> Refusal {
    count(inner, errcode);
    Refusal(errcode, errmsg.to_string())
}

async fn send(
    State(s): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let now = Instant::now();
    let checked = {
        let mut inner = s.lock();
        inner.counters.send_calls += 1;
        check_send(&s, &mut inner, q.get("access_token"), &body, now)
    };
    let (request, fault, latency) = match checked {
        Ok(ok) => ok,
        Err(Refusal(errcode, errmsg)) => return wx(errcode, &errmsg),
    };
    let openid = request.touser.clone();
    {
        let mut inner = s.lock();
        if !inner.in_flight.insert(openid.clone()) {
            count(&mut inner, 43108);
            return wx(
                43108,
                "Cannot make concurrent calls to the same OpenID, please try again",
            );
        }
    }
    let _guard = InFlight {
        state: s.clone(),
        openid: openid.clone(),
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }

    let action = match &fault {
        Some(f) if f.errcode.is_some() => {
            let errcode = f.errcode.unwrap_or(-1);
            count(&mut s.lock(), errcode);
            Action::Answer(wx(errcode, "injected fault"))
        }
        Some(f) if f.http_status.is_some() => {
            let status = axum::http::StatusCode::from_u16(f.http_status.unwrap_or(502))
                .unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
            Action::Answer((status, "upstream error").into_response())
        }
        Some(f) if f.drop_after_delivery == Some(true) => Action::Deliver {
            drop_connection: true,
            garbage: false,
        },
        Some(f) if f.garbage == Some(true) => Action::Deliver {
            drop_connection: false,
            garbage: true,
        },
        Some(f) if f.hang_ms.is_some() => {
            tokio::time::sleep(Duration::from_millis(f.hang_ms.unwrap_or(0))).await;
            if f.deliver == Some(false) {
                Action::Answer(wx(-1, "system error"))
            } else {
                Action::Deliver {
                    drop_connection: false,
                    garbage: false,
                }
            }
        }
        _ => Action::Deliver {
            drop_connection: false,
            garbage: false,
        },
    };
    let (drop_connection, garbage) = match action {
        Action::Answer(response) => return response,
        Action::Deliver {
            drop_connection,
            garbage,
        } => (drop_connection, garbage),
    };

    // The lock is held in this block only: the answer may wait below.
    let (msgid, sent_event, target) = {
        let mut inner = s.lock();
        let key = (openid.clone(), request.template_id.clone());
        let left = inner.quota.get(&key).copied().unwrap_or(0);
        if left == 0 {
            count(&mut inner, 43101);
            return wx(43101, "user refuse to accept the msg");
        }
        inner.quota.insert(key, left - 1);
        let msgid = random_msgid();
        let sent_event = PushEventSpec::Sent {
            openid: openid.clone(),
            template_id: request.template_id.clone(),
            msgid,
            error_code: 0,
        };
        inner.deliveries.push(Delivery {
            msgid,
            openid,
            template_id: request.template_id,
            data: request.data,
            page: request.page,
            miniprogram_state: request.miniprogram_state,
            lang: request.lang,
        });
        count(&mut inner, 0);
        let target = inner
            .push
            .clone()
            .filter(|_| fault.as_ref().and_then(|f| f.no_push) != Some(true));
        (msgid, sent_event, target)
    };
    if let Some(target) = target {
        // WeChat pushes once it has delivered, whatever becomes of this answer.
        let state = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(target.delay_ms.unwrap_or(50))).await;
            push_and_record(&state, &target, sent_event, None).await;
        });
    }
    if let Some(hang) = fault.as_ref().and_then(|f| f.hang_after_delivery_ms) {
        tokio::time::sleep(Duration::from_millis(hang)).await;
    }
    if drop_connection {
        // Headers go out, then the body fails: the client loses the connection after
        // WeChat has delivered, exactly the ambiguous case onegrant must record `unknown`.
        let failing = futures::stream::once(async {
            Err::<Bytes, std::io::Error>(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "dropped by fault injection",
            ))
        });
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from_stream(failing))
            .unwrap_or_else(|_| wx(-1, "system error"));
    }
    if garbage {
        return (axum::http::StatusCode::OK, "<html>not json</html>").into_response();
    }
    if fault.as_ref().and_then(|f| f.no_errcode) == Some(true) {
        return Json(json!({"errmsg": "ok", "msgid": msgid})).into_response();
    }
    Json(json!({"errcode": 0, "errmsg": "ok", "msgid": msgid})).into_response()
}

struct SendRequest {
    touser: String,
    template_id: String,
    data: Value,
    page: Option<String>,
    miniprogram_state: Option<String>,
    lang: Option<String>,
}

/// Everything a send is checked for before it can be delivered, in WeChat's order.
fn check_send(
    s: &Shared,
    inner: &mut Inner,
    access_token: Option<&String>,
    body: &[u8],
    now: Instant,
) -> Result<(SendRequest, Option<Fault>, Duration), Refusal> {
    let Some(access_token) = access_token.filter(|t| !t.is_empty()) else {
        return Err(refuse(inner, 41001, "access_token missing"));
    };
    match inner.tokens.get(access_token) {
        None => {
            return Err(refuse(
                inner,
                40001,
                "invalid credential, access_token is invalid or not latest",
            ));
        }
        Some(t) if t.expires_at <= now => {
            return Err(refuse(inner, 42001, "access_token expired"));
        }
        Some(_) => {}
    }
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) else {
        return Err(refuse(inner, 47001, "data format error"));
    };
    let text = |k: &str| body.get(k).and_then(Value::as_str).map(str::to_string);
    let Some(touser) = text("touser").filter(|t| !t.is_empty()) else {
        return Err(refuse(inner, 40003, "invalid openid"));
    };
    let Some(template) = text("template_id").and_then(|t| s.config.templates.get(&t).cloned())
    else {
        return Err(refuse(inner, 40037, "invalid template_id"));
    };
    let miniprogram_state = text("miniprogram_state");
    if miniprogram_state
        .as_deref()
        .is_some_and(|m| !["developer", "trial", "formal"].contains(&m))
    {
        return Err(refuse(inner, 47003, "argument invalid! miniprogram_state"));
    }
    let lang = text("lang");
    if lang
        .as_deref()
        .is_some_and(|l| !["zh_CN", "en_US", "zh_HK", "zh_TW"].contains(&l))
    {
        return Err(refuse(inner, 47003, "argument invalid! lang"));
    }
    let page = text("page");
    if let Some(page) = &page {
        let path = page.split('?').next().unwrap_or_default();
        let known = s
            .config
            .templates
            .iter()
            .filter_map(|t| t.page.as_deref())
            .any(|p| p == path);
        if !known {
            return Err(refuse(inner, 41030, "invalid page"));
        }
    }
    let data = body.get("data").cloned().unwrap_or(Value::Null);
    for keyword in &template.keywords {
        let value = data
            .get(&keyword.key)
            .and_then(|v| v.get("value"))
            .and_then(Value::as_str);
        let valid = match (value, rules::prefix_of(&keyword.key)) {
            (Some(v), Some(prefix)) => rules::is_valid(prefix, v),
            _ => false,
        };
        if !valid {
            let message = format!("argument invalid! data.{}.value", keyword.key);
            return Err(refuse(inner, 47003, &message));
        }
    }
    if !inner.openids.contains(&touser) {
        return Err(refuse(inner, 40003, "invalid openid"));
    }
    let fault = match inner.faults.get_mut(&touser) {
        Some(f) => {
            let fault = f.clone();
            match f.times {
                Some(0) => {}
                Some(1) | None => {
                    inner.faults.remove(&touser);
                }
                Some(n) => f.times = Some(n - 1),
            }
            Some(fault)
        }
        None => None,
    };
    Ok((
        SendRequest {
            touser,
            template_id: template.id.to_string(),
            data,
            page,
            miniprogram_state,
            lang,
        },
        fault,
        inner.latency,
    ))
}

#[derive(Deserialize)]
struct LoginCodeRequest {
    user: String,
}

async fn control_login_code(
    State(s): State<AppState>,
    Json(req): Json<LoginCodeRequest>,
) -> Response {
    let openid = openid_for(&s.config.appid, &req.user);
    let code = format!("code_{}", uuid::Uuid::new_v4().simple());
    let mut inner = s.lock();
    inner.openids.insert(openid.clone());
    inner.codes.insert(
        code.clone(),
        Code {
            openid: openid.clone(),
            issued_at: Instant::now(),
            used: false,
        },
    );
    Json(json!({"code": code, "openid": openid})).into_response()
}

#[derive(Deserialize)]
struct QuotaRequest {
    openid: String,
    template_id: String,
    #[serde(default = "one")]
    count: u64,
}

fn one() -> u64 {
    1
}

async fn control_add_quota(State(s): State<AppState>, Json(req): Json<QuotaRequest>) -> Response {
    let mut inner = s.lock();
    inner.openids.insert(req.openid.clone());
    let entry = inner
        .quota
        .entry((req.openid, req.template_id))
        .or_default();
    *entry += req.count;
    Json(json!({"quota": *entry})).into_response()
}

async fn control_quota(
    State(s): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let key = (
        q.get("openid").cloned().unwrap_or_default(),
        q.get("template_id").cloned().unwrap_or_default(),
    );
    let quota = s.lock().quota.get(&key).copied().unwrap_or(0);
    Json(json!({"quota": quota})).into_response()
}

async fn control_fault(State(s): State<AppState>, Json(fault): Json<Fault>) -> Response {
    s.lock().faults.insert(fault.openid.clone(), fault);
    Json(json!({"ok": true})).into_response()
}

async fn control_clear_faults(State(s): State<AppState>) -> Response {
    let mut inner = s.lock();
    inner.faults.clear();
    inner.login_fault = None;
    Json(json!({"ok": true})).into_response()
}

async fn control_token_fault(State(s): State<AppState>, Json(fault): Json<TokenFault>) -> Response {
    s.lock().token_hang = fault.hang_ms.map(Duration::from_millis);
    Json(json!({"ok": true})).into_response()
}

async fn control_login_fault(State(s): State<AppState>, Json(fault): Json<LoginFault>) -> Response {
    s.lock().login_fault = (fault.errcode.is_some() || fault.hang_ms.is_some()).then_some(fault);
    Json(json!({"ok": true})).into_response()
}

#[derive(Deserialize)]
struct LatencyRequest {
    ms: u64,
}

async fn control_latency(State(s): State<AppState>, Json(req): Json<LatencyRequest>) -> Response {
    s.lock().latency = Duration::from_millis(req.ms);
    Json(json!({"ok": true})).into_response()
}

async fn control_expire_tokens(State(s): State<AppState>) -> Response {
    let now = Instant::now();
    for t in s.lock().tokens.values_mut() {
        t.expires_at = now;
    }
    Json(json!({"ok": true})).into_response()
}

async fn control_deliveries(State(s): State<AppState>) -> Response {
    Json(json!({"deliveries": s.lock().deliveries.clone()})).into_response()
}

async fn control_counters(State(s): State<AppState>) -> Response {
    Json(s.lock().counters.clone()).into_response()
}

async fn control_reset(State(s): State<AppState>) -> Response {
    *s.lock() = Inner {
        push: s.config.push.clone(),
        ..Inner::default()
    };
    Json(json!({"ok": true})).into_response()
}

/// Pushes `spec` (created now, or at `create_time`) to `target` and keeps the record:
/// the callback's answers.
async fn push_and_record(
    s: &Shared,
    target: &PushTarget,
    spec: PushEventSpec,
    create_time: Option<i64>,
) -> Vec<u16> {
    let at = create_time.unwrap_or_else(|| chrono::Utc::now().timestamp());
    let answers = push::push(&s.client, target, &s.config.appid, &spec, at).await;
    s.lock().pushes.push(PushRecord {
        spec,
        answers: answers.clone(),
    });
    answers
}

async fn control_push_target(
    State(s): State<AppState>,
    Json(target): Json<PushTarget>,
) -> Response {
    s.lock().push = Some(target);
    Json(json!({"ok": true})).into_response()
}

async fn control_clear_push_target(State(s): State<AppState>) -> Response {
    s.lock().push = None;
    Json(json!({"ok": true})).into_response()
}

/// A push ordered through the control API: the event, and optionally WeChat's
/// `CreateTime` for it (default now).
#[derive(Deserialize)]
struct PushOrder {
    #[serde(flatten)]
    spec: PushEventSpec,
    #[serde(default)]
    create_time: Option<i64>,
}

async fn control_push_event(
    State(s): State<AppState>,
    Json(PushOrder { spec, create_time }): Json<PushOrder>,
) -> Response {
    let target = {
        let mut inner = s.lock();
        let Some(target) = inner.push.clone() else {
            return (
                axum::http::StatusCode::CONFLICT,
                Json(json!({"error": "no push target: POST /control/push-target first"})),
            )
                .into_response();
        };
        // The tap or the setting behind the event changes WeChat's quota as it would.
        match &spec {
            PushEventSpec::Popup {
                openid,
                template_id,
                status,
            } if status == "accept" => {
                inner.openids.insert(openid.clone());
                *inner
                    .quota
                    .entry((openid.clone(), template_id.clone()))
                    .or_default() += 1;
            }
            PushEventSpec::Change {
                openid,
                template_id,
            } => {
                inner.quota.remove(&(openid.clone(), template_id.clone()));
            }
            PushEventSpec::Popup { .. } | PushEventSpec::Sent { .. } => {}
        }
        target
    };
    let answers = push_and_record(&s, &target, spec, create_time).await;
    Json(json!({"answers": answers})).into_response()
}

async fn control_pushes(State(s): State<AppState>) -> Response {
    Json(json!({"pushes": s.lock().pushes.clone()})).into_response()
}
