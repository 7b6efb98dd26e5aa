//! The DynamoDB single-table store.
//!
//! All user-owned items share `pk = USER#<openid>`, so one query answers any screen
//! (docs/design.md §6). Every state change is a conditional write or a single
//! `TransactWriteItems`; replays are answered from `ReturnValuesOnConditionCheckFailure =
//! ALL_OLD` without a second read. Item mapping (serde_dynamo) stays inside this module.
//!
//! Plumbing, which every feature uses and which uses no feature:
//! - `error` (`StoreError`) and `handle` (the `Store` itself), at the ground floor: this
//!   file only declares the parts and re-exports what callers outside name.
//! - [`keys`]: the key formats, in one place.
//! - `items`: the typed items (plan, grant, quota, outbox, recorded event) in and out,
//!   and the writes that move them; attribute names and state strings live there.
//! - `tx`: the transaction engine (one token per transaction, the answer sorted).
//! - `snapshot`: loading a plan with its quota item in one round trip.
//! - `open_grants`: voiding a template's open grants, repairing their lists.
//! - `consent`: plans moved by a user's choice (a report, a refusal).
//! - `taps`: pairing reported taps with WeChat's popup events.
//! - [`audit`]: the audit trail written with every change, and its reader.
//!
//! Features, one per handler, each depending only on the plumbing and the domain:
//! - [`grants`]: grant reports and quota counters.
//! - [`reminders`]: plans, settings and check-ins.
//! - [`inbox`]: notifications, the unread counter and the outbox.
//! - [`dispatch`]: due items, claims, finalizes and the sweep.
//! - [`callback`]: WeChat's pushed events, recorded once and applied in WeChat's order.

pub mod audit;
pub mod callback;
mod consent;
pub mod dispatch;
pub mod erasure;
mod error;
pub mod export;
pub mod grants;
mod handle;
pub mod inbox;
mod items;
pub mod keys;
mod open_grants;
pub mod outcomes;
pub mod reminders;
mod retry;
mod snapshot;
mod sweep;
mod taps;
mod tx;

pub use crate::config::{Limits, Retention};
pub use crate::domain::grants::report::{GrantEntry, GrantsRecorded};
pub use crate::store::consent::Stood;
pub use crate::store::error::{Limit, StoreError};
pub use crate::store::handle::{DEFAULT_SHARDS, INDEX_QUERIES_IN_FLIGHT, Store, StoredWechatIps};
pub use crate::store::items::outbox::Publication;
pub use crate::store::items::wechat_ips::WECHAT_IPS_KEPT_FOR;
