//! The pure domain: validated types and rules with no I/O.
//!
//! Values from outside (request bodies, config, stored items) become these types at the
//! edge, through `parse`/`TryFrom`, so the rest of the code never re-checks them.

pub mod callback;
pub mod consent;
pub mod dispatch;
pub mod grants;
pub mod ids;
pub mod inbox;
pub mod keywords;
pub mod rate;
pub mod reconcile;
pub mod reminders;
pub mod template;
pub mod text;

pub use grants::{GrantReport, GrantState, GrantStatus, Quota, QuotaCounters, SubscribeResult};
pub use ids::{IdError, OpenId, RequestId, TemplateId};
pub use template::{Keyword, KeywordType, TemplateDef, Templates};
