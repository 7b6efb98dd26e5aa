//! The WeChat server API client.
//!
//! One concrete client with an injected base URL and timeouts, so tests and the local
//! stack point it at the project's stand-in. Errors never carry URLs: the login call
//! puts the AppSecret in the query string and sends put the access token there, so
//! every `reqwest::Error` is stripped of its URL before it can reach a log.
//!
//! Access tokens come from `/cgi-bin/stable_token` in normal mode, cached per container
//! until `expires_in − 300 s` and refreshed single-flight; a fetch that fails is
//! remembered for [`TOKEN_FAILURE_MEMORY`], so callers queued behind it do not each wait
//! out a timeout. On 40001/40014/42001 the token is refetched (normal mode again — never
//! `force_refresh`, which would invalidate every other instance's token and burns a
//! 20/day budget) and the send retried once.
//!
//! Sends to one openid go one at a time ([`WechatClient::turn`]); WeChat answers 43108
//! to concurrent ones, which another container can still cause, so a 43108 is retried
//! after a short wait while the caller's deadline allows — it means "not sent", so the
//! retry cannot send twice.

mod callback_ips;
mod config;
pub mod push;

pub use config::{MiniprogramState, WechatConfig};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::clock::Clock;
use crate::domain::OpenId;
use crate::domain::settle::{CONCURRENT_SEND_ERRCODE, SendResult, TOKEN_ERRCODES};
use crate::secrets::Secret;

/// Login codes WeChat refused: invalid or expired (40029), already used (40163),
/// blocked as high-risk (40226). The client must get a new code from `wx.login`.
pub const REJECTED_CODE_ERRCODES: [i64; 3] = [40029, 40163, 40226];
/// Answers meaning "busy, try later": system error, minute quota.
pub const BUSY_ERRCODES: [i64; 2] = [-1, 45011];

/// A verified login: the user's identity within this mini-program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    pub openid: OpenId,
    pub unionid: Option<String>,
}

/// What went wrong talking to WeChat.
#[derive(Debug, thiserror::Error)]
pub enum WechatError {
    #[error("the HTTP client could not be built")]
    Build(#[source] reqwest::Error),
    #[error("WeChat refused the login code (errcode {errcode})")]
    CodeRejected { errcode: i64 },
    #[error("WeChat is busy (errcode {errcode})")]
    Busy { errcode: i64 },
    #[error("WeChat could not be reached")]
    Transport(#[source] reqwest::Error),
    #[error("WeChat answered HTTP {status}")]
    Status { status: u16 },
    #[error("WeChat's answer was unreadable")]
    Unreadable,
    #[error("WeChat answered errcode {errcode}: {errmsg}")]
    Api { errcode: i64, errmsg: String },
    #[error("the access token could not be fetched moments ago; not retried yet")]
    TokenRecentlyFailed,
    #[error("this function is not given the AppSecret")]
    NoSecret,
}

impl WechatError {
    /// Whether the failure is WeChat's availability rather than our request.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Busy { .. }
                | Self::Transport(_)
                | Self::Status { .. }
                | Self::Unreadable
                | Self::TokenRecentlyFailed
        )
    }
}

#[derive(Deserialize)]
struct Code2SessionAnswer {
    #[serde(default)]
    errcode: i64,
    #[serde(default)]
    errmsg: String,
    openid: Option<String>,
    unionid: Option<String>,
    // `session_key` is deliberately not read: onegrant never needs it, so it is never held.
}

/// Refresh a cached token this long before WeChat says it expires; stable_token
/// guarantees at least 300 s left on any token it hands out.
const TOKEN_REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// How long a failed token fetch is remembered: callers within it fail at once.
pub const TOKEN_FAILURE_MEMORY: Duration = Duration::from_secs(10);

/// The first wait before retrying a send WeChat refused as concurrent (43108);
/// doubled per retry, at most [`CONCURRENT_RETRY_MAX`], with jitter.
const CONCURRENT_RETRY_BASE: Duration = Duration::from_millis(150);
const CONCURRENT_RETRY_MAX: Duration = Duration::from_millis(1200);

#[derive(Clone)]
enum CachedToken {
    Valid {
        token: String,
        refresh_at: DateTime<Utc>,
    },
    Failed {
        until: DateTime<Utc>,
    },
}

#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    errcode: i64,
    access_token: Option<String>,
    expires_in: Option<u64>,
}

/// A message to send: every keyword already fitted to its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub touser: OpenId,
    pub template_id: String,
    pub page: Option<String>,
    pub data: BTreeMap<String, String>,
}

/// The WeChat client. Cheap to clone; share one per container.
#[derive(Clone)]
pub struct WechatClient {
    http: reqwest::Client,
    config: WechatConfig,
    // A tokio mutex because the refresh (an HTTP call) happens while it is held: that
    // is what makes the refresh single-flight.
    token: Arc<tokio::sync::Mutex<Option<CachedToken>>>,
    // One send at a time per openid. std mutex: held only to find the openid's lock.
    sending: Arc<StdMutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// A token's lifetime and a failure's memory run on it.
    clock: Clock,
}

impl WechatClient {
    pub fn new(config: WechatConfig) -> Result<Self, WechatError> {
        let http = crate::aws::http_client_builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.timeout)
            .build()
            .map_err(|e| WechatError::Build(e.without_url()))?;
        Ok(Self {
            http,
            config,
            token: Arc::new(tokio::sync::Mutex::new(None)),
            sending: Arc::new(StdMutex::new(HashMap::new())),
            clock: Clock::system(),
        })
    }

    /// This client reading `clock` for its token's lifetime (a test's, which it moves).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub fn config(&self) -> &WechatConfig {
        &self.config
    }

    /// The AppSecret, which only the functions that call WeChat are given.
    fn secret(&self) -> Result<&str, WechatError> {
        self.config
            .secret
            .as_ref()
            .map(Secret::expose)
            .ok_or(WechatError::NoSecret)
    }

    /// Exchanges a `wx.login` code for the user's openid (`/sns/jscode2session`).
    pub async fn code_to_session(&self, code: &str) -> Result<Login, WechatError> {
        let url = format!("{}/sns/jscode2session", self.config.api_base);
        let response = self
            .http
            .get(url)
            .query(&[
                ("appid", self.config.appid.as_str()),
                ("secret", self.secret()?),
                ("js_code", code),
                ("grant_type", "authorization_code"),
            ])
            .send()
            .await
            .map_err(|e| WechatError::Transport(e.without_url()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(WechatError::Status {
                status: status.as_u16(),
            });
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| WechatError::Transport(e.without_url()))?;
        let answer: Code2SessionAnswer =
            serde_json::from_slice(&bytes).map_err(|_| WechatError::Unreadable)?;
        match answer.errcode {
            0 => {
                let openid = answer
                    .openid
                    .and_then(|o| OpenId::parse(o).ok())
                    .ok_or(WechatError::Unreadable)?;
                Ok(Login {
                    openid,
                    unionid: answer.unionid,
                })
            }
            e if REJECTED_CODE_ERRCODES.contains(&e) => {
                Err(WechatError::CodeRejected { errcode: e })
            }
            e if BUSY_ERRCODES.contains(&e) => Err(WechatError::Busy { errcode: e }),
            e => Err(WechatError::Api {
                errcode: e,
                errmsg: answer.errmsg,
            }),
        }
    }

    /// A valid access token: the cached one, or a fresh one from stable_token (normal
    /// mode). Single-flight; a failure is remembered briefly (see the module docs).
    pub async fn token(&self) -> Result<String, WechatError> {
        self.access_token(None).await
    }

    /// Like [`Self::token`]; `stale` is a token WeChat just refused: it is never
    /// returned from cache.
    async fn access_token(&self, stale: Option<&str>) -> Result<String, WechatError> {
        let mut cached = self.token.lock().await;
        let now = self.clock.now();
        match cached.as_ref() {
            Some(CachedToken::Valid { token, refresh_at })
                if now < *refresh_at && Some(token.as_str()) != stale =>
            {
                return Ok(token.clone());
            }
            Some(CachedToken::Failed { until }) if now < *until => {
                return Err(WechatError::TokenRecentlyFailed);
            }
            Some(CachedToken::Valid { .. } | CachedToken::Failed { .. }) | None => {}
        }
        let fetched = self.fetch_token().await;
        crate::metrics::count_by(
            crate::metrics::name::TOKEN_FETCHES,
            "Outcome",
            if fetched.is_ok() { "ok" } else { "failed" }.to_string(),
            1,
        );
        let now = self.clock.now();
        let after = |d: Duration| now + chrono::Duration::from_std(d).unwrap_or_default();
        *cached = Some(match &fetched {
            Ok((token, lifetime)) => CachedToken::Valid {
                token: token.clone(),
                refresh_at: after(*lifetime),
            },
            Err(e) => {
                tracing::error!(error = %e, "stable_token failed; remembered briefly");
                CachedToken::Failed {
                    until: after(TOKEN_FAILURE_MEMORY),
                }
            }
        });
        fetched.map(|(token, _)| token)
    }

    /// One stable_token call: the token and how long to keep it.
    async fn fetch_token(&self) -> Result<(String, Duration), WechatError> {
        let url = format!("{}/cgi-bin/stable_token", self.config.api_base);
        let body = json!({
            "grant_type": "client_credential",
            "appid": self.config.appid,
            "secret": self.secret()?,
            "force_refresh": false,
        });
        let answer: TokenAnswer = read_answer(self.http.post(url).json(&body)).await?;
        match (answer.errcode, answer.access_token, answer.expires_in) {
            (0, Some(token), Some(expires_in)) => {
                let lifetime = Duration::from_secs(expires_in).saturating_sub(TOKEN_REFRESH_MARGIN);
                Ok((token, lifetime))
            }
            (0, _, _) => Err(WechatError::Unreadable),
            (errcode, _, _) if BUSY_ERRCODES.contains(&errcode) => {
                Err(WechatError::Busy { errcode })
            }
            (errcode, _, _) => Err(WechatError::Api {
                errcode,
                errmsg: "stable_token refused".into(),
            }),
        }
    }

    /// The longest one call to WeChat can take.
    pub fn call_timeout(&self) -> Duration {
        self.config.connect_timeout + self.config.timeout
    }

    /// The longest [`Self::send_in_turn`] needs: a send, one token refetch (which may
    /// first wait for another task's fetch) and the retried send — what a claim's lease
    /// must cover before its finalize.
    pub fn send_window(&self) -> Duration {
        self.call_timeout() * 4
    }

    /// Waits for `openid`'s turn: sends to one user go one at a time per container.
    /// The turn lasts until the returned guard is dropped.
    pub async fn turn(&self, openid: &OpenId) -> Turn {
        let lock = {
            let mut map = self.sending.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(openid.to_string()).or_default().clone()
        };
        Turn {
            guard: Some(lock.lock_owned().await),
            map: self.sending.clone(),
            openid: openid.to_string(),
        }
    }

    /// Sends one subscription message (`subscribeMessage.send`) with `token` during
    /// the user's `turn`, finishing by `send_by`. Never returns an error: every failure
    /// is a [`SendResult`] the caller finalizes. A refused token is refetched and the
    /// send retried once; a 43108 is retried after a short wait. A call is started only
    /// if it can end by `send_by`.
    pub async fn send_in_turn(
        &self,
        _turn: &Turn,
        token: &str,
        message: &Message,
        send_by: Instant,
    ) -> SendResult {
        let call = self.call_timeout();
        let mut token = token.to_string();
        let mut refetched = false;
        let mut concurrent = 0u32;
        if Instant::now() + call > send_by {
            // The claim's time is up (the process stalled after claiming): sending now
            // could outlive the lease, so it does not send at all.
            return SendResult::NotSent {
                reason: "no time left to send within the claim's lease".into(),
            };
        }
        loop {
            let result = self.post_send(&token, message).await;
            match &result {
                SendResult::Refused { errcode, .. }
                    if TOKEN_ERRCODES.contains(errcode) && !refetched =>
                {
                    // Room for a wait behind another task's fetch, the fetch, the send.
                    if Instant::now() + call * 3 > send_by {
                        return result;
                    }
                    tracing::warn!(errcode, "access token refused; refetching once");
                    refetched = true;
                    match self.access_token(Some(&token)).await {
                        // The wait for the token may have eaten the time: check again.
                        Ok(_) if Instant::now() + call > send_by => {
                            return SendResult::NotSent {
                                reason: format!("no time left to resend after errcode {errcode}"),
                            };
                        }
                        Ok(fresh) => token = fresh,
                        Err(e) => {
                            return SendResult::NotSent {
                                reason: format!("no access token after errcode {errcode}: {e}"),
                            };
                        }
                    }
                }
                SendResult::Refused { errcode, .. } if *errcode == CONCURRENT_SEND_ERRCODE => {
                    concurrent += 1;
                    let wait = concurrent_wait(concurrent);
                    if Instant::now() + wait + call > send_by {
                        return result;
                    }
                    tokio::time::sleep(wait).await;
                }
                SendResult::Sent { .. }
                | SendResult::Refused { .. }
                | SendResult::Uncertain { .. }
                | SendResult::NotSent { .. }
                | SendResult::Invalid { .. } => return result,
            }
        }
    }

    async fn post_send(&self, token: &str, message: &Message) -> SendResult {
        let data: serde_json::Map<String, Value> = message
            .data
            .iter()
            .map(|(k, v)| (k.clone(), json!({ "value": v })))
            .collect();
        let mut body = json!({
            "touser": message.touser.as_str(),
            "template_id": message.template_id,
            "data": data,
            "miniprogram_state": self.config.miniprogram_state.as_str(),
            "lang": self.config.lang,
        });
        if let Some(page) = &message.page {
            body["page"] = json!(page);
        }
        let url = format!("{}/cgi-bin/message/subscribe/send", self.config.api_base);
        let sent = self
            .http
            .post(url)
            .query(&[("access_token", token)])
            .json(&body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            // No connection was made: the request never left.
            Err(e) if e.is_connect() => {
                return SendResult::NotSent {
                    reason: e.without_url().to_string(),
                };
            }
            Err(e) => {
                return SendResult::Uncertain {
                    reason: e.without_url().to_string(),
                };
            }
        };
        let status = response.status();
        let bytes = match response.bytes().await {
            Ok(bytes) => bytes,
            Err(e) => {
                return SendResult::Uncertain {
                    reason: format!("answer lost: {}", e.without_url()),
                };
            }
        };
        if !status.is_success() {
            return SendResult::Uncertain {
                reason: format!("HTTP {}", status.as_u16()),
            };
        }
        let Ok(answer) = serde_json::from_slice::<Value>(&bytes) else {
            return SendResult::Uncertain {
                reason: "unreadable answer".into(),
            };
        };
        let errcode = match answer.get("errcode") {
            // WeChat always answers an errcode; without one the answer is unreadable
            // and the message may have gone (docs/design.md §5).
            None => {
                return SendResult::Uncertain {
                    reason: "answer without errcode".into(),
                };
            }
            Some(code) => match code.as_i64() {
                Some(code) => code,
                None => {
                    return SendResult::Uncertain {
                        reason: "unreadable errcode".into(),
                    };
                }
            },
        };
        if errcode == 0 {
            // msgid is a JSON number above 2^53: read it as u64, keep it as a string.
            // (Some proxies and SDKs pass it on as a string: read that too.)
            let msgid = answer.get("msgid").and_then(|m| match m {
                Value::Number(n) => n.as_u64().map(|m| m.to_string()),
                Value::String(s) => s.parse::<u64>().ok().map(|m| m.to_string()),
                _ => None,
            });
            return SendResult::Sent { msgid };
        }
        SendResult::Refused {
            errcode,
            errmsg: answer
                .get("errmsg")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect(),
        }
    }
}

/// The wait before concurrent-send retry `n` (1-based): doubling from the base, capped,
/// with up to half of it as jitter so two containers do not retry in lockstep.
fn concurrent_wait(n: u32) -> Duration {
    let window = CONCURRENT_RETRY_BASE
        .saturating_mul(1u32 << n.saturating_sub(1).min(4))
        .min(CONCURRENT_RETRY_MAX);
    let random = u64::from(uuid::Uuid::new_v4().as_bytes()[0]);
    let jitter_ms = u64::try_from(window.as_millis() / 2).unwrap_or(0) * random / 255;
    window / 2 + Duration::from_millis(jitter_ms)
}

/// One user's turn to be sent to (see [`WechatClient::turn`]).
pub struct Turn {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    map: Arc<StdMutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    openid: String,
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.guard.take());
        // Forget the user's lock once nobody holds or waits for it.
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map
            .get(&self.openid)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            map.remove(&self.openid);
        }
    }
}

/// Sends `request` and reads WeChat's JSON answer: a transport failure (its URL, which
/// may carry a token, left out), a non-2xx status, or a body that is not `T` is an error.
async fn read_answer<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
) -> Result<T, WechatError> {
    let response = request
        .send()
        .await
        .map_err(|e| WechatError::Transport(e.without_url()))?;
    if !response.status().is_success() {
        return Err(WechatError::Status {
            status: response.status().as_u16(),
        });
    }
    response.json().await.map_err(|_| WechatError::Unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_send_waits_grow_and_stay_capped() {
        for n in 1..10 {
            let wait = concurrent_wait(n);
            assert!(wait >= CONCURRENT_RETRY_BASE / 2, "{n}: {wait:?}");
            assert!(wait <= CONCURRENT_RETRY_MAX, "{n}: {wait:?}");
        }
        assert!(concurrent_wait(5) >= CONCURRENT_RETRY_MAX / 2);
    }
}
