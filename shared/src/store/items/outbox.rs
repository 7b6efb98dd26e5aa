//! The outbox item (a notification's WeChat send) and the writes that move it and
//! its note's push status.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::inbox::{PushReason, PushStatus};
use crate::domain::settle::OutboxState;
use crate::domain::template::Priority;
use crate::store::error::StoreError;
use crate::store::items::change::{change, check, put, update};
use crate::store::items::expr::{Cond, eq};
use crate::store::items::{at_version, is_there, key, n, rfc3339, s};
use crate::store::keys::{due_pk, lane_pk, note_sk, pending_sk};

/// The outbox item of a push: what to send, and where it stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct OutboxItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    pub(crate) kind: String,
    pub(crate) note_id: String,
    pub(crate) template_id: String,
    pub(crate) data: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) page: Option<String>,
    pub(crate) state: OutboxState,
    #[serde(default)]
    pub(crate) attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) due_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) due_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) delivery_id: Option<String>,
    pub(crate) version: u64,
    pub(crate) updated_at: String,
    /// Set once the push is final: TTL removes it after the outbox retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires_at: Option<i64>,
    /// The push's last moment (epoch ms; `Timing::send_by`: the event's `expires_at`,
    /// at most 30 days after publication): not gone out by then, never sent. Absent on
    /// pushes stored before the ceiling existed: those wait without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) send_by: Option<i64>,
    /// The event's `priority`, when not `normal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) priority: Option<Priority>,
    /// Its notification's type, for the user's mutes (absent on pushes stored before
    /// it was kept: never muted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) note_type: Option<String>,
    /// Pending for a grant of its template (listed on the quota item as waiting; on the
    /// due index only at its `send_by`, until a grant wakes it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) waiting_grant: bool,
    /// The user's partition while the push is open (`pending` or `sending`): its entry
    /// on the `pending` index, which counts a user's open pushes at ingest. Derived
    /// from the state wherever the item is written, so the count never drifts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pending_pk: Option<String>,
    /// Its place on the `pending` index while open ([`crate::store::keys::pending_sk`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pending_sk: Option<String>,
    /// Its publisher's lane while open ([`crate::store::keys::lane_pk`]): on the `lane`
    /// index, which counts the user's open pushes of one publisher at ingest. Derived
    /// from the state with `pending_pk` (absent on pushes stored before lanes, or
    /// without a publisher: not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lane_pk: Option<String>,
    /// Its notification's publisher and idempotency key (absent on pushes stored before
    /// outcomes were told: nobody told).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) publisher: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) idempotency_key: Option<String>,
}

impl OutboxItem {
    /// Whom this push's outcomes are told.
    pub(crate) fn origin(&self) -> Option<crate::store::items::outcome::Origin> {
        crate::store::items::outcome::Origin::of(&self.publisher, &self.idempotency_key)
    }

    /// This item with its keys on the `pending` and `lane` indexes (a new, open push).
    pub(crate) fn with_pending_sk(mut self) -> Self {
        self.pending_sk = Some(self.pending_sk());
        self.lane_pk = self.lane_pk();
        self
    }

    /// Its partition on the `lane` index, when it has a publisher.
    fn lane_pk(&self) -> Option<String> {
        self.publisher
            .as_deref()
            .map(|publisher| lane_pk(publisher, &self.pk))
    }

    /// Its sort key on the `pending` index.
    pub(crate) fn pending_sk(&self) -> String {
        pending_sk(
            &self.template_id,
            self.priority.unwrap_or_default(),
            &self.note_id,
        )
    }

    /// This item, pending again at `due` (on the due index) or in `state`; a final
    /// state expires after `retention`.
    pub(crate) fn moved(
        &self,
        state: OutboxState,
        due: Option<DateTime<Utc>>,
        shards: u32,
        now: DateTime<Utc>,
        retention: chrono::Duration,
    ) -> Self {
        let mut next = self.clone();
        let open = matches!(state, OutboxState::Pending | OutboxState::Sending);
        next.expires_at = (!open).then(|| (now + retention).timestamp());
        next.state = state;
        next.due_at = due.map(|d| d.timestamp_millis());
        next.due_pk = due.map(|_| due_pk(&self.pk, &self.sk, shards));
        next.delivery_id = None;
        next.waiting_grant = false;
        next.pending_pk = open.then(|| self.pk.clone());
        next.pending_sk = open.then(|| self.pending_sk());
        next.lane_pk = self.lane_pk().filter(|_| open);
        next.version = self.version + 1;
        next.updated_at = rfc3339(now);
        next
    }
}

/// The conditional Put of a whole item, versioned.
pub(crate) fn versioned_put(
    table: &str,
    item: HashMap<String, AttributeValue>,
    version: u64,
) -> Result<TransactWriteItem, StoreError> {
    put(table, item).when(at_version(version)).write()
}

/// Sets a notification's push status (part of a transaction).
fn note_push_update(
    table: &str,
    pk: &str,
    note_id: &str,
    status: PushStatus,
    reason: Option<PushReason>,
    now: DateTime<Utc>,
) -> Result<TransactWriteItem, StoreError> {
    let status_set = change().set("push_status", s(status.as_str())).set(
        "push_reason",
        reason.map_or(AttributeValue::Null(true), |r| s(r.as_str())),
    );
    // A push back to pending (a retry, a wait for a grant or the next day) keeps its
    // history as it is: the history lists the moments it moved on.
    let status_set = if status == PushStatus::Pending {
        status_set
    } else {
        let moment =
            serde_dynamo::to_attribute_value(crate::domain::inbox::PushMoment::new(status, now))
                .map_err(|e| {
                    StoreError::Corrupt(format!("a push moment could not be encoded: {e}"))
                })?;
        status_set.append("push_history", vec![moment])
    };
    update(table, key(pk, &note_sk(note_id)), status_set)
        // Never recreates, as a stub, a notification its retention removed: a caller
        // meeting this condition drops the write (`is_note_update`) and lands the rest.
        .when(is_there())
        .write()
}

/// A notification's push status set ([`note_push_update`]) and, when the push has
/// reached an end, its outcome for `origin` (part of the same transaction).
fn note_push_told(
    table: &str,
    pk: &str,
    note_id: &str,
    origin: Option<&crate::store::items::outcome::Origin>,
    (status, reason): (PushStatus, Option<PushReason>),
    now: DateTime<Utc>,
) -> Result<Vec<TransactWriteItem>, StoreError> {
    let mut writes = vec![note_push_update(table, pk, note_id, status, reason, now)?];
    writes.extend(crate::store::items::outcome::outcome_write(
        table,
        pk,
        note_id,
        origin,
        (status, reason.map(|r| r.as_str().to_string())),
        now,
    )?);
    Ok(writes)
}

/// A push moved from `old` to `next` (at `old`'s version), and its notification (and
/// publisher) told `told` when the move is one they see.
pub(crate) fn push_moved(
    table: &str,
    pk: &str,
    old: &OutboxItem,
    next: &OutboxItem,
    told: Option<(PushStatus, Option<PushReason>)>,
    now: DateTime<Utc>,
) -> Result<Vec<TransactWriteItem>, StoreError> {
    let item = crate::store::items::to_item("outbox", next)?;
    let mut writes = vec![versioned_put(table, item, old.version)?];
    if let Some(told) = told {
        let origin = old.origin();
        writes.extend(note_push_told(
            table,
            pk,
            &old.note_id,
            origin.as_ref(),
            told,
            now,
        )?);
    }
    Ok(writes)
}

/// Whether `write` is a notification's push-status update ([`note_push_update`]).
pub(crate) fn is_note_update(write: &TransactWriteItem) -> bool {
    write
        .update()
        .and_then(|u| u.key().get("sk"))
        .and_then(|sk| sk.as_s().ok())
        .is_some_and(|sk| sk.starts_with(crate::store::keys::NOTES))
}

/// The notification's attribute recording a cancel that came while an attempt of its
/// push was in flight (epoch ms): the push's next claim cancels it.
pub(crate) const CANCEL_REQUESTED: &str = "cancel_requested_at";

/// The notification's attribute recording a newer notification of its `collapse_key`
/// that came while an attempt of its push was in flight (epoch ms): the push's next
/// claim ends it `replaced`.
pub(crate) const REPLACE_REQUESTED: &str = "replace_requested_at";

/// Records on a notification, for its push's next claim, a cancel or a replacement
/// (`attribute`: [`CANCEL_REQUESTED`], [`REPLACE_REQUESTED`]) that came while an attempt
/// of the push was in flight, and checks that attempt is still where it was read
/// (`outbox`'s version): a request lands only before the push can be claimed again,
/// so that claim reads it. Part of a transaction; never recreates a notification its
/// retention removed.
pub(crate) fn note_request(
    table: &str,
    outbox: &OutboxItem,
    attribute: &str,
    now: DateTime<Utc>,
) -> Result<[TransactWriteItem; 2], StoreError> {
    let requested = update(
        table,
        key(&outbox.pk, &note_sk(&outbox.note_id)),
        change().set(attribute, n(now.timestamp_millis())),
    )
    .when(is_there())
    .write()?;
    let unchanged = check(
        table,
        key(&outbox.pk, &outbox.sk),
        at_version(outbox.version),
    );
    Ok([requested, unchanged.write()?])
}

/// A scheduled notification ready to publish with its push: the writes that publish
/// it (its scheduled item deleted, conditional on what was read; the notification,
/// its unread marker, `unread + 1`) and its push's outbox item, `pending` and due at
/// the notification's `send_at`, not yet written. The claim commits them with the
/// claim itself (`Store::claim_published`), so a push goes out as soon after its
/// `send_at` as a plan after its due instant.
#[derive(Debug, Clone)]
pub struct Publication {
    pub(crate) writes: Vec<TransactWriteItem>,
    pub(crate) outbox: OutboxItem,
}

/// The stored outbox item is a push still waiting for a grant: a wake's condition, and
/// (negated) the condition of dropping it from the waiting list.
pub(crate) fn waits_for_grant() -> Cond {
    eq("state", s("pending")).and(eq("waiting_grant", AttributeValue::Bool(true)))
}

/// Whether a stored outbox item is a push still waiting for a grant.
pub(crate) fn still_waits(item: &HashMap<String, AttributeValue>) -> bool {
    waits_for_grant().holds(item)
}
