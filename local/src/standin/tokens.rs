//! The stand-in's token and login endpoints (`/cgi-bin/token`, `stable_token`,
//! `jscode2session`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::standin::state::{
    AppState, CODE_TTL, ROTATE_WINDOW, StandinConfig, TOKEN_TTL, Token, TokenKind, random_token, wx,
};

pub(crate) fn check_app(
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

pub(crate) async fn token(
    State(s): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
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
pub(crate) struct StableTokenRequest {
    pub(crate) grant_type: Option<String>,
    pub(crate) appid: Option<String>,
    pub(crate) secret: Option<String>,
    #[serde(default)]
    pub(crate) force_refresh: bool,
}

pub(crate) async fn stable_token(State(s): State<AppState>, body: Bytes) -> Response {
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

pub(crate) async fn jscode2session(
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

/// `getcallbackip`: the addresses WeChat pushes from, for a valid access token.
pub(crate) async fn callback_ips(
    State(s): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let inner = s.lock();
    let now = Instant::now();
    match q.get("access_token").filter(|t| !t.is_empty()) {
        None => return wx(41001, "access_token missing"),
        Some(t) => match inner.tokens.get(t) {
            None => {
                return wx(
                    40001,
                    "invalid credential, access_token is invalid or not latest",
                );
            }
            Some(t) if t.expires_at <= now => return wx(42001, "access_token expired"),
            Some(_) => {}
        },
    }
    let list = inner.callback_ips.clone().unwrap_or_else(|| {
        crate::standin::state::CALLBACK_IPS
            .iter()
            .map(|a| a.to_string())
            .collect()
    });
    Json(json!({ "ip_list": list })).into_response()
}
