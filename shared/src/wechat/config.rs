//! The WeChat client's settings (read by `config`, used here).

use std::time::Duration;

use crate::secrets::Secret;

/// Which build of the mini-program a message opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MiniprogramState {
    Formal,
    Trial,
    Developer,
}

impl MiniprogramState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Formal => "formal",
            Self::Trial => "trial",
            Self::Developer => "developer",
        }
    }
}

/// The WeChat client's settings.
#[derive(Debug, Clone)]
pub struct WechatConfig {
    /// Without a trailing slash.
    pub api_base: String,
    pub appid: String,
    /// The AppSecret; `None` in a function that never calls WeChat.
    pub secret: Option<Secret>,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub miniprogram_state: MiniprogramState,
    pub lang: String,
}
