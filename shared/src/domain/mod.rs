//! The pure domain: validated types and rules with no I/O.
//!
//! Values from outside (request bodies, config, stored items) become these types at the
//! edge, through `parse`/`TryFrom`, so the rest of the code never re-checks them.

pub mod audit;
pub mod callback;
pub mod consent;
pub mod dispatch;
pub mod erasure;
pub mod export;
pub mod grants;
pub mod ids;
pub mod inbox;
pub mod keywords;
pub mod outcome;
pub mod publisher;
pub mod rate;
pub mod reconcile;
pub mod reminders;
pub mod settle;
pub mod template;
pub mod text;
pub mod wechat_ips;

/// An RFC 3339 instant, in UTC: the domain's tests write their instants so.
#[cfg(test)]
pub(crate) fn at(rfc3339: &str) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .expect("a valid RFC 3339 instant")
        .with_timezone(&chrono::Utc)
}

pub use grants::{GrantReport, GrantState, GrantStatus, Quota, QuotaCounters, SubscribeResult};
pub use ids::{IdError, OpenId, RequestId, TemplateId};
pub use template::{Keyword, KeywordType, TemplateDef, Templates};
