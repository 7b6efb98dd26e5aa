//! The WeChat server API client.
//!
//! One concrete client with an injected base URL and timeouts, so tests and the local
//! stack point it at the project's stand-in. Errors never carry URLs: the login call
//! puts the AppSecret in the query string and sends put the access token there, so
//! every `reqwest::Error` is stripped of its URL before it can reach a log.
//!
//! Access tokens come from `/cgi-bin/stable_token` in normal mode, cached per container
//! until `expires_in − 300 s` and refreshed single-flight. On 40001/40014/42001 the
//! token is refetched (normal mode again — never `force_refresh`, which would invalidate
//! every other instance's token and burns a 20/day budget) and the send retried once.
//! Sends to one openid go one at a time (WeChat answers 43108 to concurrent ones).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::WechatConfig;
use crate::domain::OpenId;
use crate::domain::outcome::{SendResult, TOKEN_ERRCODES};

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
}

impl WechatError {
    /// Whether the failure is WeChat's availability rather than our request.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Busy { .. } | Self::Transport(_) | Self::Status { .. } | Self::Unreadable
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

#[derive(Clone)]
struct CachedToken {
    token: String,
    refresh_at: Instant,
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
}

impl WechatClient {
    pub fn new(config: WechatConfig) -> Result<Self, WechatError> {
        crate::aws::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.timeout)
            .build()
            .map_err(|e| WechatError::Build(e.without_url()))?;
        Ok(Self {
            http,
            config,
            token: Arc::new(tokio::sync::Mutex::new(None)),
            sending: Arc::new(StdMutex::new(HashMap::new())),
        })
    }

    pub fn config(&self) -> &WechatConfig {
        &self.config
    }

    /// Exchanges a `wx.login` code for the user's openid (`/sns/jscode2session`).
    pub async fn code_to_session(&self, code: &str) -> Result<Login, WechatError> {
        let url = format!("{}/sns/jscode2session", self.config.api_base);
        let response = self
            .http
            .get(url)
            .query(&[
                ("appid", self.config.appid.as_str()),
                ("secret", self.config.secret.expose()),
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
    /// mode). `stale` is a token WeChat just refused: it is never returned from cache.
    async fn access_token(&self, stale: Option<&str>) -> Result<String, WechatError> {
        let mut cached = self.token.lock().await;
        if let Some(t) = cached.as_ref()
            && Instant::now() < t.refresh_at
            && Some(t.token.as_str()) != stale
        {
            return Ok(t.token.clone());
        }
        let url = format!("{}/cgi-bin/stable_token", self.config.api_base);
        let body = json!({
            "grant_type": "client_credential",
            "appid": self.config.appid,
            "secret": self.config.secret.expose(),
            "force_refresh": false,
        });
        let response = self
            .http
            .post(url)
            .json(&body)
            .send()
            .await
            .map_err(|e| WechatError::Transport(e.without_url()))?;
        if !response.status().is_success() {
            return Err(WechatError::Status {
                status: response.status().as_u16(),
            });
        }
        let answer: TokenAnswer = response.json().await.map_err(|_| WechatError::Unreadable)?;
        match (answer.errcode, answer.access_token, answer.expires_in) {
            (0, Some(token), Some(expires_in)) => {
                let lifetime = Duration::from_secs(expires_in).saturating_sub(TOKEN_REFRESH_MARGIN);
                *cached = Some(CachedToken {
                    token: token.clone(),
                    refresh_at: Instant::now() + lifetime,
                });
                Ok(token)
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

    /// Sends one subscription message (`subscribeMessage.send`) and says how it ended.
    /// Never returns an error: every failure is a [`SendResult`] the caller finalizes.
    pub async fn send(&self, message: &Message) -> SendResult {
        let lock = {
            let mut map = self.sending.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(message.touser.to_string()).or_default().clone()
        };
        let result = {
            let _one_at_a_time = lock.lock().await;
            self.send_with_token_retry(message).await
        };
        let mut map = self.sending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = map.get(message.touser.as_str())
            && Arc::strong_count(l) <= 2
        {
            map.remove(message.touser.as_str());
        }
        result
    }

    async fn send_with_token_retry(&self, message: &Message) -> SendResult {
        let token = match self.access_token(None).await {
            Ok(token) => token,
            Err(e) => {
                return SendResult::NotSent {
                    reason: format!("no access token: {e}"),
                };
            }
        };
        let first = self.post_send(&token, message).await;
        match first {
            SendResult::Refused { errcode, .. } if TOKEN_ERRCODES.contains(&errcode) => {
                tracing::warn!(errcode, "access token refused; refetching once");
                match self.access_token(Some(&token)).await {
                    Ok(fresh) => self.post_send(&fresh, message).await,
                    Err(e) => SendResult::NotSent {
                        reason: format!("no access token after errcode {errcode}: {e}"),
                    },
                }
            }
            other => other,
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
            None => 0,
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
            let msgid = answer
                .get("msgid")
                .and_then(Value::as_u64)
                .map(|m| m.to_string());
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
