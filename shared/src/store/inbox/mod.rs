//! The inbox: notifications, the unread counter, and the outbox items of their pushes.
//!
//! Ingesting an event is one transaction: the event's idempotency record, the
//! notification, its unread marker, `unread + 1`, and — when a push is asked for and
//! valid — an outbox item due now (on the due index). Marking read flips `read`, deletes
//! the marker and decrements the counter in one transaction conditional on the
//! notification being unread, so the counter is always the number of unread
//! notifications and of markers: it never drifts or goes negative.
//!
//! - `list`: pages (bounded reads per call, whatever the filter) and the counter.
//! - `read`: marking one or all read, in bounded steps.

mod cancel;
mod collapse;
mod ingest;
mod list;
pub(crate) mod note;
mod pending;
mod preferences;
mod publish;
mod read;
mod refill;
mod status;

pub use cancel::Cancelled;
pub use list::LIST_BUDGET;
pub use note::{Ingested, ListFilter, Page};
pub use publish::Published;
pub use read::ReadAll;
pub use refill::Refilled;
pub use status::NotificationStatus;
