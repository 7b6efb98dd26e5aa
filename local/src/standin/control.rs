//! The stand-in's control API (`/control/...`): what tests and the walk-through use
//! to mint login codes, grant quota, inject faults and read what was delivered.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::standin::push::{self, PushEventSpec, PushRecord, PushTarget};
use crate::standin::state::{
    AppState, Code, Fault, Inner, LoginFault, Shared, TokenFault, openid_for,
};

#[derive(Deserialize)]
pub(crate) struct LoginCodeRequest {
    pub(crate) user: String,
}

pub(crate) async fn control_login_code(
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
pub(crate) struct QuotaRequest {
    pub(crate) openid: String,
    pub(crate) template_id: String,
    #[serde(default = "one")]
    pub(crate) count: u64,
}

pub(crate) fn one() -> u64 {
    1
}

pub(crate) async fn control_add_quota(
    State(s): State<AppState>,
    Json(req): Json<QuotaRequest>,
) -> Response {
    let mut inner = s.lock();
    inner.openids.insert(req.openid.clone());
    let entry = inner
        .quota
        .entry((req.openid, req.template_id))
        .or_default();
    *entry += req.count;
    Json(json!({"quota": *entry})).into_response()
}

pub(crate) async fn control_quota(
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

pub(crate) async fn control_fault(State(s): State<AppState>, Json(fault): Json<Fault>) -> Response {
    s.lock().faults.insert(fault.openid.clone(), fault);
    Json(json!({"ok": true})).into_response()
}

pub(crate) async fn control_clear_faults(State(s): State<AppState>) -> Response {
    let mut inner = s.lock();
    inner.faults.clear();
    inner.login_fault = None;
    Json(json!({"ok": true})).into_response()
}

pub(crate) async fn control_token_fault(
    State(s): State<AppState>,
    Json(fault): Json<TokenFault>,
) -> Response {
    s.lock().token_hang = fault.hang_ms.map(Duration::from_millis);
    Json(json!({"ok": true})).into_response()
}

pub(crate) async fn control_login_fault(
    State(s): State<AppState>,
    Json(fault): Json<LoginFault>,
) -> Response {
    s.lock().login_fault = (fault.errcode.is_some() || fault.hang_ms.is_some()).then_some(fault);
    Json(json!({"ok": true})).into_response()
}

#[derive(Deserialize)]
pub(crate) struct LatencyRequest {
    pub(crate) ms: u64,
}

#[derive(Deserialize)]
pub(crate) struct HoldRequest {
    pub(crate) openid: String,
    pub(crate) held: bool,
}

/// Holds (or releases) the sends to one openid: a held send has been received, and
/// answers only once released.
pub(crate) async fn control_hold(
    State(s): State<AppState>,
    Json(req): Json<HoldRequest>,
) -> Response {
    let mut inner = s.lock();
    if req.held {
        inner.held.insert(req.openid);
    } else {
        inner.held.remove(&req.openid);
    }
    Json(json!({"ok": true})).into_response()
}

pub(crate) async fn control_latency(
    State(s): State<AppState>,
    Json(req): Json<LatencyRequest>,
) -> Response {
    s.lock().latency = Duration::from_millis(req.ms);
    Json(json!({"ok": true})).into_response()
}

pub(crate) async fn control_expire_tokens(State(s): State<AppState>) -> Response {
    let now = Instant::now();
    for t in s.lock().tokens.values_mut() {
        t.expires_at = now;
    }
    Json(json!({"ok": true})).into_response()
}

pub(crate) async fn control_deliveries(State(s): State<AppState>) -> Response {
    Json(json!({"deliveries": s.lock().deliveries.clone()})).into_response()
}

pub(crate) async fn control_counters(State(s): State<AppState>) -> Response {
    Json(s.lock().counters.clone()).into_response()
}

pub(crate) async fn control_reset(State(s): State<AppState>) -> Response {
    *s.lock() = Inner {
        push: s.config.push.clone(),
        ..Inner::default()
    };
    Json(json!({"ok": true})).into_response()
}

/// Pushes `spec` (created now, or at `create_time`) to `target` and keeps the record:
/// the callback's answers.
pub(crate) async fn push_and_record(
    s: &Shared,
    target: &PushTarget,
    spec: PushEventSpec,
    create_time: Option<i64>,
) -> Vec<u16> {
    let now = s.config.clock.now().timestamp();
    let at = create_time.unwrap_or(now);
    let answers = push::push(&s.client, target, &s.config.appid, &spec, at, now).await;
    s.lock().pushes.push(PushRecord {
        spec,
        create_time: at,
        answers: answers.clone(),
    });
    answers
}

pub(crate) async fn control_push_target(
    State(s): State<AppState>,
    Json(target): Json<PushTarget>,
) -> Response {
    s.lock().push = Some(target);
    Json(json!({"ok": true})).into_response()
}

pub(crate) async fn control_clear_push_target(State(s): State<AppState>) -> Response {
    s.lock().push = None;
    Json(json!({"ok": true})).into_response()
}

/// A push ordered through the control API: the event, and optionally WeChat's
/// `CreateTime` for it (default now).
#[derive(Deserialize)]
pub(crate) struct PushOrder {
    #[serde(flatten)]
    pub(crate) spec: PushEventSpec,
    #[serde(default)]
    pub(crate) create_time: Option<i64>,
}

pub(crate) async fn control_push_event(
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
        // The tap or the setting behind the event changes WeChat's quota as it would
        // (once per tap: a copy pushed again with its `CreateTime` is the same tap).
        match &spec {
            PushEventSpec::Popup {
                openid,
                template_id,
                status,
            } if status == "accept" => {
                inner.openids.insert(openid.clone());
                let again = create_time.is_some_and(|at| {
                    !inner
                        .taps_pushed
                        .insert((openid.clone(), template_id.clone(), at))
                });
                if !again {
                    *inner
                        .quota
                        .entry((openid.clone(), template_id.clone()))
                        .or_default() += 1;
                }
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

pub(crate) async fn control_pushes(State(s): State<AppState>) -> Response {
    Json(json!({"pushes": s.lock().pushes.clone()})).into_response()
}

#[derive(Deserialize)]
pub(crate) struct CallbackIps {
    ip_list: Vec<String>,
}

/// What `getcallbackip` lists from now on (as WeChat gives it: not checked here).
pub(crate) async fn control_callback_ips(
    State(s): State<AppState>,
    Json(req): Json<CallbackIps>,
) -> Response {
    s.lock().callback_ips = Some(req.ip_list);
    Json(json!({"ok": true})).into_response()
}
