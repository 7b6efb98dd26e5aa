//! What an invocation's time allows: the margin a finalize keeps, its tries, and the
//! budget a lane spends from.

use std::time::Duration;

use tokio::time::Instant;

/// Time kept back, beyond the send's window, for a finalize after the last send.
pub(crate) const FINALIZE_MARGIN: Duration = Duration::from_secs(5);

/// How many times a finalize is tried, while the invocation has at least
/// `FINALIZE_RETRY_ROOM` left (a try's own write budget is 4 s).
pub(crate) const FINALIZE_TRIES: u32 = 3;
pub(crate) const FINALIZE_RETRY_ROOM: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    pub(crate) deadline: Instant,
    /// From a claim: the send's window and the finalize.
    pub(crate) after_claim: Duration,
    /// From the turn: a token fetch, then as from a claim.
    pub(crate) after_turn: Duration,
}

impl Budget {
    pub(crate) fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}
