//! The stored states of a delivery and of a push in the outbox.

use serde::{Deserialize, Serialize};

/// Where a delivery stands (docs/design.md §3): `claimed → sending → sent | failed |
/// unknown`. Claims are written `sending` directly, once the per-openid turn and the
/// access token are in hand; `claimed` remains readable for items older than that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    Claimed,
    Sending,
    Sent,
    Failed,
    Unknown,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Claimed => "claimed",
            Self::Sending => "sending",
            Self::Sent => "sent",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
        }
    }

    /// Whether a send in this state counts against the daily cap: WeChat took it or
    /// may have. A failed send, certainly not taken, gives its day's count back,
    /// whatever becomes of its grant (43101 voids it, yet nothing went out).
    pub fn counts_against_cap(self) -> bool {
        !matches!(self, Self::Failed)
    }

    /// Still owned by a dispatcher (and on the lease index).
    pub fn is_live(self) -> bool {
        match self {
            Self::Claimed | Self::Sending => true,
            Self::Sent | Self::Failed | Self::Unknown => false,
        }
    }
}

/// Where a notification's push stands in the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutboxState {
    /// Waiting for its due instant (on the due index).
    Pending,
    /// Claimed; the send is in flight.
    Sending,
    Sent,
    /// No grant for the template when it came due.
    Skipped,
    Failed,
    /// The send's outcome is unknown; never resent.
    Unknown,
    /// Not gone out by its `expires_at`: never sent, no grant spent.
    Expired,
    /// Cancelled by its publisher before it went out.
    Cancelled,
    /// Replaced by a newer push of the same `collapse_key` before it went out.
    Replaced,
    /// Its notification type is muted by the user: never sent.
    Muted,
    /// Past the user's daily cap until it expired: never sent, no grant spent.
    Capped,
}

impl OutboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sending => "sending",
            Self::Sent => "sent",
            Self::Skipped => "skipped",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
            Self::Replaced => "replaced",
            Self::Muted => "muted",
            Self::Capped => "capped",
        }
    }
}
