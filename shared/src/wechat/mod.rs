//! The WeChat server API client.
//!
//! One concrete client with an injected base URL and timeouts, so tests and the local
//! stack point it at the project's stand-in. Errors never carry URLs: the login call
//! puts the AppSecret in the query string, so every `reqwest::Error` is stripped of its
//! URL before it can reach a log.

use serde::Deserialize;

use crate::config::WechatConfig;
use crate::domain::OpenId;

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

/// The WeChat client. Cheap to clone; share one per container.
#[derive(Clone)]
pub struct WechatClient {
    http: reqwest::Client,
    config: WechatConfig,
}

impl WechatClient {
    pub fn new(config: WechatConfig) -> Result<Self, WechatError> {
        crate::aws::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.timeout)
            .build()
            .map_err(|e| WechatError::Build(e.without_url()))?;
        Ok(Self { http, config })
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
}
