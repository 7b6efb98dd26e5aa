//! Outcome items: what became of a publisher's push, written in the same transaction as
//! the status change it tells (`domain::outcome`), in the user's partition (an erasure
//! takes them with the rest), waiting on the due index under `OUTCOME#<n>` — partitions
//! the dispatcher never reads — until the outcomes function has delivered them.

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::inbox::PushStatus;
use crate::domain::outcome::{self, Outcome};
use crate::store::error::StoreError;
use crate::store::items::change::put;
use crate::store::items::{rfc3339, to_item};
use crate::store::keys::{outcome_due_pk, outcome_sk};

/// Who published a notification, under which key: kept on the notification and its
/// push so that each status change can tell its publisher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Origin {
    pub(crate) publisher: String,
    pub(crate) idempotency_key: String,
}

impl Origin {
    /// The origin as stored beside a notification (`None` for one stored before
    /// origins were kept, and for onegrant's own notices: nobody to tell).
    pub(crate) fn of(publisher: &Option<String>, key: &Option<String>) -> Option<Self> {
        match (publisher, key) {
            (Some(publisher), Some(key))
                if publisher != crate::domain::inbox::refill::PUBLISHER =>
            {
                Some(Self {
                    publisher: publisher.clone(),
                    idempotency_key: key.clone(),
                })
            }
            _ => None,
        }
    }
}

/// One outcome waiting to be delivered (or dead-lettered: off the due index, kept
/// until `expires_at`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutcomeItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    kind: String,
    pub outcome_id: String,
    pub publisher: String,
    pub idempotency_key: String,
    pub note_id: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the push reached the status.
    pub at: String,
    /// When it was first due (epoch ms): retried until a day after.
    pub first_at: i64,
    /// Failed deliveries so far.
    #[serde(default)]
    pub attempts: u32,
    /// Put on the stack's bus already (a later try only posts the webhook).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bus_done: bool,
    /// Taken by the publisher's webhook already (a later try only puts it on the bus).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hook_done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) due_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) due_at: Option<i64>,
    /// Set when it was given up: kept for the operator, off the due index, until
    /// `expires_at` (an outcome still to be told never expires).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires_at: Option<i64>,
}

impl OutcomeItem {
    /// Whether it waits in its publisher's own queue (moved there when its webhook
    /// failed), not the shared one.
    pub fn in_own_queue(&self) -> bool {
        self.due_pk
            .as_deref()
            .is_some_and(|due| due != outcome_due_pk(None, &self.pk, &self.sk))
    }

    /// The outcome as the publisher receives it.
    pub fn outcome(&self) -> Outcome {
        Outcome {
            outcome_id: self.outcome_id.clone(),
            source: self.publisher.clone(),
            idempotency_key: self.idempotency_key.clone(),
            openid: crate::store::keys::openid_of(&self.pk)
                .map(|o| o.as_str().to_string())
                .unwrap_or_default(),
            note_id: self.note_id.clone(),
            status: self.status.clone(),
            reason: self.reason.clone(),
            at: self.at.clone(),
        }
    }
}

/// How long an outcome given up is kept for the operator (delivered ones are deleted
/// at once).
pub(crate) const KEEP_DEAD: chrono::Duration = chrono::Duration::days(15);

/// The write of the outcome of `note_id`'s push reaching `status` (`reason`) at `now`,
/// for the transaction that makes the change; `None` when there is nothing to tell
/// (a push still pending, or no publisher to tell).
pub(crate) fn outcome_write(
    table: &str,
    pk: &str,
    note_id: &str,
    origin: Option<&Origin>,
    (status, reason): (PushStatus, Option<String>),
    now: DateTime<Utc>,
) -> Result<Option<TransactWriteItem>, StoreError> {
    let Some(origin) = origin else {
        return Ok(None);
    };
    if !outcome::is_told(status) {
        return Ok(None);
    }
    let sk = outcome_sk(note_id, status.as_str());
    let item = OutcomeItem {
        due_pk: Some(outcome_due_pk(None, pk, &sk)),
        due_at: Some(now.timestamp_millis()),
        pk: pk.to_string(),
        sk,
        kind: "outcome".into(),
        outcome_id: outcome::outcome_id(note_id, status),
        publisher: origin.publisher.clone(),
        idempotency_key: origin.idempotency_key.clone(),
        note_id: note_id.to_string(),
        status: status.as_str().to_string(),
        reason,
        at: rfc3339(now),
        first_at: now.timestamp_millis(),
        attempts: 0,
        bus_done: false,
        hook_done: false,
        dead_at: None,
        expires_at: None,
    };
    // A push reaches each status once: a plain put (never a condition that could
    // cancel the change it rides on).
    Ok(Some(put(table, to_item("outcome", &item)?).write()?))
}
