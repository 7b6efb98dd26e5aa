//! Deliveries: the dispatcher's writes, split by step (docs/design.md §2 I1, I4–I6, §5).
//!
//! - [`due`]: the due index, every shard queried in parallel.
//! - [`claim`]: one transaction takes a due plan or push (`scheduled`/`pending` →
//!   `sending`, off the due index, onto the lease index), reserves one grant naming
//!   the delivery, moves the counters and writes the delivery `sending` with a lease
//!   covering the send and the finalize. The dispatcher claims only once the user's
//!   per-openid turn and an access token are in hand, so a delivery is `sending` only
//!   while its POST can actually be in flight.
//! - [`finalize`]: one transaction, conditional on the delivery still being this
//!   claimer's, writes what [`settle`](crate::domain::settle::settle) decided for the
//!   delivery, the grant (fenced: only the delivery that reserved it moves it) and the
//!   claimed item. If the item moved on meanwhile (a check-in, a refusal), the item is
//!   re-read and advanced on its own; should that second write be lost (a crash), the
//!   plan is still on the lease index and the next sweep advances it. If a sweep got
//!   there first, a definite answer still wins: see [`finalize`] ("late answers"). A
//!   claim with no time left to send is released the same way, unsent.
//! - [`sweep`]: deliveries and plans past their lease. A live delivery becomes
//!   `unknown` (grant void, plan paused `uncertain`; never resent, I4); a plan still
//!   `sending` whose delivery is already terminal is advanced by that delivery's
//!   outcome (I5). A delivery whose finalize kept WeChat's answer is settled by it
//!   instead ([`kept`]). One page per shard per tick; an entry that cannot be read is
//!   logged, counted and taken off the index (quarantined); one whose handling fails
//!   is moved behind the others and quarantined at its third failure, so no entry
//!   holds up its shard.
//! - [`kept`]: what a finalize leaves for the sweep when it cannot finish: WeChat's
//!   answer kept on the delivery, and a 43101's voiding still to do.
//! - [`sent_event`]: WeChat's sent event settling the one `unknown` send it can be
//!   (marks on the quota item: unknown sends, and sent msgids whose event is due).
//! - `priority`: pushes waiting for a grant of their template, best first, and
//!   the wake a grant brings.
//! - [`shards`]: which partitions to query when `DUE_SHARDS` has changed.
//! - this module: the types shared by the steps and the one settle transaction.

pub mod claim;
mod claimed;
mod delivery;
pub mod due;
pub mod finalize;
pub mod kept;
mod lease;
mod priority;
mod reserve;
pub mod sent_event;
mod settle;
pub mod shards;
pub mod sweep;

pub use claim::{ClaimOutcome, ReadAhead};
pub use claimed::{Claim, ClaimSource, OutboxClaim};
pub use due::{DueCursor, DueItem, DuePage};
pub use finalize::Finalized;
pub use lease::{SWEEP_FAILURE_LIMIT, SWEEP_RETRY_AFTER};
pub use sent_event::SentEventOutcome;
pub use shards::ShardSpan;
pub use sweep::SweepSummary;
