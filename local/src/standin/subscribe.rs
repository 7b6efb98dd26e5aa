//! The stand-in's subscription-message send (`/cgi-bin/message/subscribe/send`):
//! WeChat's checks and errcodes, one send per openid at a time, injected faults.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::standin::control::push_and_record;
use crate::standin::push::PushEventSpec;
use crate::standin::rules;
use crate::standin::state::{AppState, Delivery, Fault, Inner, Shared, random_msgid, wx};

/// Removes an openid from the in-flight set when a send ends, however it ends.
pub(crate) struct InFlight {
    pub(crate) state: AppState,
    pub(crate) openid: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.lock().in_flight.remove(&self.openid);
    }
}

pub(crate) enum Action {
    Answer(Response),
    Deliver {
        drop_connection: bool,
        garbage: bool,
    },
}

pub(crate) fn count(inner: &mut Inner, errcode: i64) {
    *inner.counters.send_errcodes.entry(errcode).or_default() += 1;
}

/// A refused send: the errcode and errmsg WeChat would answer.
pub(crate) struct Refusal(i64, String);

/// Counts a refused send.
pub(crate) fn refuse(inner: &mut Inner, errcode: i64, errmsg: &str) -> Refusal {
    count(inner, errcode);
    Refusal(errcode, errmsg.to_string())
}

pub(crate) async fn send(
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
    while s.lock().held.contains(&openid) {
        tokio::time::sleep(Duration::from_millis(10)).await;
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

pub(crate) struct SendRequest {
    pub(crate) touser: String,
    pub(crate) template_id: String,
    pub(crate) data: Value,
    pub(crate) page: Option<String>,
    pub(crate) miniprogram_state: Option<String>,
    pub(crate) lang: Option<String>,
}

/// Everything a send is checked for before it can be delivered, in WeChat's order.
pub(crate) fn check_send(
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
