//! `wechat-ips`: keeps WeChat's door. Every hour it reads the addresses WeChat pushes
//! from (`getcallbackip`, with the access token), checks the list
//! (`domain::wechat_ips`: a malformed, empty or too-wide list is refused and the one in
//! use stays), and keeps it in the table, where the callback reads it to refuse a push
//! from any other address, and — with the edge — in the edge's WAF IP set
//! (`WECHAT_IP_SET`), which refuses such a request before it reaches API Gateway.
//! A failure fails the invocation (Lambda's errors alarm) and keeps the list in use.

use std::time::Duration;

use futures::future::BoxFuture;
use onegrant::Deps;
use onegrant::domain::wechat_ips::WechatIps;
use onegrant::events::EventError;
use onegrant::metrics::{count_by, name};
use onegrant::waf::Kept;
use serde::Serialize;

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Networks in the list kept.
    pub entries: usize,
    /// The edge's IP set: `same`, `replaced`, or `none` (no edge).
    pub ip_set: &'static str,
}

/// Why a run kept nothing new.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("WeChat's list could not be read")]
    Wechat(#[source] onegrant::wechat::WechatError),
    #[error("WeChat's list was not taken")]
    List(#[source] onegrant::domain::wechat_ips::WechatIpsError),
    #[error("WeChat's list has no IPv4 network for the edge's IP set")]
    NoIpv4,
    #[error("the table could not be written")]
    Store(#[source] onegrant::store::StoreError),
    #[error("the edge's IP set could not be kept")]
    Waf(#[source] onegrant::waf::WafError),
}

/// One run: WeChat's list read, checked, kept.
pub async fn refresh(deps: &Deps) -> Result<Summary, RunError> {
    let outcome = |o: &'static str| count_by(name::WECHAT_IPS, "Outcome", o.to_string(), 1);
    let listed = deps.wechat.callback_ips().await.map_err(|e| {
        outcome("failed");
        RunError::Wechat(e)
    })?;
    let ips = WechatIps::parse(&listed).map_err(|e| {
        outcome("refused");
        RunError::List(e)
    })?;
    let v4 = ips.v4_entries();
    if deps.wechat_ip_set.is_some() && v4.is_empty() {
        outcome("refused");
        return Err(RunError::NoIpv4);
    }
    deps.store
        .put_wechat_ips(&ips, deps.clock.now())
        .await
        .map_err(|e| {
            outcome("failed");
            RunError::Store(e)
        })?;
    let ip_set = match &deps.wechat_ip_set {
        None => "none",
        Some(set) => match set.keep(&v4).await.map_err(|e| {
            outcome("failed");
            RunError::Waf(e)
        })? {
            Kept::Same => "same",
            Kept::Replaced => "replaced",
        },
    };
    outcome("kept");
    Ok(Summary {
        entries: ips.entries().len(),
        ip_set,
    })
}

/// The handler as `onegrant::events::run` and the local stack take it.
pub fn invoke(
    deps: &Deps,
    _event: serde_json::Value,
    _budget: Duration,
) -> BoxFuture<'_, Result<serde_json::Value, EventError>> {
    Box::pin(async move {
        let summary = refresh(deps).await.map_err(|e| {
            tracing::error!(error = %onegrant::telemetry::error_chain(&e), "WeChat's addresses were not kept; the list in use stays");
            EventError::Event(Box::new(e))
        })?;
        tracing::info!(?summary, "WeChat's addresses kept");
        serde_json::to_value(summary).map_err(EventError::Answer)
    })
}
