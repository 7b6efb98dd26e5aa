//! `getcallbackip`: the addresses WeChat pushes from (its `ip_list`), for the
//! `wechat-ips` function to keep WeChat's door (`domain::wechat_ips`).

use serde::Deserialize;

use super::{WechatClient, WechatError};
use crate::domain::settle::TOKEN_ERRCODES;

#[derive(Deserialize)]
struct IpsAnswer {
    #[serde(default)]
    errcode: i64,
    #[serde(default)]
    errmsg: String,
    ip_list: Option<Vec<String>>,
}

impl WechatClient {
    /// WeChat's push addresses, as it lists them (unchecked: `WechatIps::parse` checks
    /// them). A refused token is refetched and the call made once more.
    pub async fn callback_ips(&self) -> Result<Vec<String>, WechatError> {
        let mut token = self.token().await?;
        let mut refetched = false;
        loop {
            let url = format!("{}/cgi-bin/getcallbackip", self.config.api_base);
            let answer: IpsAnswer = super::read_answer(
                self.http
                    .get(url)
                    .query(&[("access_token", token.as_str())]),
            )
            .await?;
            match (answer.errcode, answer.ip_list) {
                (0, Some(list)) => return Ok(list),
                (0, None) => return Err(WechatError::Unreadable),
                (errcode, _) if TOKEN_ERRCODES.contains(&errcode) && !refetched => {
                    tracing::warn!(errcode, "access token refused; refetching once");
                    refetched = true;
                    token = self.access_token(Some(&token)).await?;
                }
                (errcode, _) if super::BUSY_ERRCODES.contains(&errcode) => {
                    return Err(WechatError::Busy { errcode });
                }
                (errcode, _) => {
                    return Err(WechatError::Api {
                        errcode,
                        errmsg: answer.errmsg,
                    });
                }
            }
        }
    }
}
