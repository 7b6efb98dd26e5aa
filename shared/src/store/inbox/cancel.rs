//! Cancelling a notification's push (an `onegrant.cancel` event): load the event's
//! record and the push it names, let the domain decide
//! ([`cancel::decide`](crate::domain::inbox::cancel::decide)), commit in one
//! transaction conditional on what was read — so a cancel racing the dispatcher's claim
//! or publication either cancels the push before it is claimed or finds it claimed and
//! is too late, never both.
//!
//! A cancel that finds no record of its event marks the record's place instead
//! ([`CANCEL_FIRST`]): the event, when it comes, is stored with its push `cancelled`.

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::domain::inbox::PushStatus;
use crate::domain::inbox::cancel::{CancelDecision, CancelEvent, PushFound, decide};
use crate::domain::settle::OutboxState;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::inbox::note::{
    CANCEL_DONE, CANCEL_FIRST, CANCEL_REQUESTED_MARK, CANCEL_TOO_LATE, EventItem,
};
use crate::store::inbox::publish::ScheduledItem;
use crate::store::items::change::{change, update};
use crate::store::items::outbox::{
    CANCEL_REQUESTED, OutboxItem, is_note_update, note_request, push_moved, versioned_put,
};
use crate::store::items::quota::wake_now;
use crate::store::items::{is_there, key, n, parse, s, to_item};
use crate::store::keys::{event_key, outbox_sk, scheduled_sk, user_pk};
use crate::store::retry::{Attempt, retry_carrying};
use crate::store::tx::{Beside, Outcome, Parts, TxOutcome};

/// How a cancel ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Cancelled {
    /// The push will never go out; no grant spent.
    Cancelled { note_id: String },
    /// Cancelled by an earlier cancel: nothing changed.
    Already { note_id: String },
    /// The push had gone out (or ended otherwise) already: it stays `push`; the cancel
    /// is recorded as too late.
    TooLate { note_id: String, push: PushStatus },
    /// An attempt of the push is in flight (or its outcome unknown): it is not stopped,
    /// but if it does not go out, the push's next claim cancels it.
    Requested { note_id: String, push: PushStatus },
    /// The notification has no push to cancel.
    NoPush { note_id: String },
    /// The event has not come yet: when it does, its push is `cancelled`.
    Early,
}

/// The push a notification has, as stored.
pub(super) enum Found {
    Scheduled(Box<ScheduledItem>),
    Outbox(Box<OutboxItem>),
    None,
}

impl Found {
    pub(super) fn as_domain(&self) -> PushFound {
        match self {
            Self::Scheduled(item) => item.push_found(),
            Self::Outbox(outbox) => PushFound::Outbox(outbox.state),
            Self::None => PushFound::None,
        }
    }
}

impl Store {
    /// Cancels the push of the notification `cancel` names (see the module docs).
    pub async fn cancel(
        &self,
        cancel: &CancelEvent,
        now: DateTime<Utc>,
    ) -> Result<Cancelled, StoreError> {
        let (event_pk, event_sk) = event_key(&cancel.publisher, &cancel.idempotency_key);
        let pk = user_pk(&cancel.openid);
        let (event_pk, event_sk, pk) = (&event_pk, &event_sk, &pk);
        // Set once a try found the notification removed by its retention: the push is
        // still ended, without the notification's status.
        let carried = retry_carrying(
            "cancel",
            self.limits.write_budget,
            false,
            |mut no_note: bool| async move {
                let decided = async {
                    let with_note = !no_note;
                    let Some(record) = self.get(event_pk, event_sk).await? else {
                        // Before its event: the mark, kept as long as an event record.
                        let mark = EventItem {
                            pk: event_pk.clone(),
                            sk: event_sk.clone(),
                            kind: "event".into(),
                            fingerprint: String::new(),
                            note_id: String::new(),
                            expires_at: (now + self.limits.retention.events).timestamp(),
                            cancel: Some(CANCEL_FIRST.into()),
                            openid: Some(self.subject(&cancel.openid)),
                        };
                        return Ok(
                            match self
                                .transact(vec![self.put_new(to_item("event", &mark)?)?])
                                .await?
                            {
                                TxOutcome::Committed => Attempt::Done(Cancelled::Early),
                                // The event (or another cancel) landed meanwhile: read it again.
                                TxOutcome::Cancelled(_) | TxOutcome::Contended => Attempt::Retry,
                            },
                        );
                    };
                    let record: EventItem = parse("event", record)?;
                    if record.is_cancel_mark() {
                        return Ok(Attempt::Done(Cancelled::Early));
                    }
                    let note_id = record.note_id.clone();
                    let found = self.push_of(pk, &note_id).await?;
                    let decision = decide(found.as_domain());
                    let mut writes = Vec::new();
                    let answer = match decision {
                        CancelDecision::Cancel => {
                            writes.extend(self.end_push(
                                pk,
                                &note_id,
                                &found,
                                PushStatus::Cancelled,
                                with_note,
                                now,
                            )?);
                            Cancelled::Cancelled { note_id }
                        }
                        CancelDecision::Already => {
                            return Ok(Attempt::Done(Cancelled::Already { note_id }));
                        }
                        CancelDecision::Request => {
                            let Found::Outbox(outbox) = &found else {
                                return Err(StoreError::Corrupt(
                                    "a cancel request for a push not in the outbox".into(),
                                ));
                            };
                            let push = PushStatus::of_outbox(outbox.state);
                            if with_note {
                                writes.extend(note_request(
                                    &self.table,
                                    outbox,
                                    CANCEL_REQUESTED,
                                    now,
                                )?);
                                Cancelled::Requested { note_id, push }
                            } else {
                                // Nowhere to record it: this attempt decides.
                                Cancelled::TooLate { note_id, push }
                            }
                        }
                        CancelDecision::TooLate => match found.as_domain() {
                            PushFound::Outbox(state) => Cancelled::TooLate {
                                note_id,
                                push: PushStatus::of_outbox(state),
                            },
                            PushFound::ScheduledEnded(push) => Cancelled::TooLate { note_id, push },
                            PushFound::Scheduled | PushFound::None => {
                                return Err(StoreError::Corrupt(
                                    "a cancel too late for a push still waiting".into(),
                                ));
                            }
                        },
                        // Its event came after a cancel, or its push ended cancelled and left
                        // nothing behind: a cancel again changes nothing.
                        CancelDecision::NoPush if record.cancel.as_deref() == Some(CANCEL_DONE) => {
                            return Ok(Attempt::Done(Cancelled::Already { note_id }));
                        }
                        CancelDecision::NoPush => {
                            return Ok(Attempt::Done(Cancelled::NoPush { note_id }));
                        }
                    };
                    let outcome = match answer {
                        Cancelled::TooLate { .. } => CANCEL_TOO_LATE,
                        Cancelled::Requested { .. } => CANCEL_REQUESTED_MARK,
                        _ => CANCEL_DONE,
                    };
                    if record.cancel.as_deref() != Some(outcome) {
                        writes.push(self.cancel_recorded(event_pk, event_sk, outcome, now)?);
                    }
                    if writes.is_empty() {
                        return Ok(Attempt::Done(answer));
                    }
                    Ok(
                        match self.transact_parts(&Parts::notes_apart(writes)).await? {
                            Outcome::Committed => Attempt::Done(answer),
                            Outcome::Cancelled(failed) => {
                                if failed.only(|part| part == Beside::Note) {
                                    no_note = true;
                                }
                                // Claimed, published or cancelled meanwhile: read again.
                                Attempt::Retry
                            }
                            Outcome::Contended | Outcome::Conflict => Attempt::Retry,
                        },
                    )
                }
                .await;
                (decided, no_note)
            },
        )
        .await;
        carried.0
    }

    /// The push of notification `note_id` of `pk`, as stored: with its notification
    /// (scheduled), in the outbox, or none.
    pub(super) async fn push_of(&self, pk: &str, note_id: &str) -> Result<Found, StoreError> {
        Ok(
            if let Some(item) = self.get(pk, &scheduled_sk(note_id)).await? {
                Found::Scheduled(Box::new(parse("scheduled", item)?))
            } else if let Some(item) = self.get(pk, &outbox_sk(note_id)).await? {
                Found::Outbox(Box::new(parse("outbox", item)?))
            } else {
                Found::None
            },
        )
    }

    /// The writes that end a waiting push `found` (of notification `note_id` of `pk`)
    /// with `status` (cancelled or replaced), each conditional on what was read.
    pub(super) fn end_push(
        &self,
        pk: &str,
        note_id: &str,
        found: &Found,
        status: PushStatus,
        with_note: bool,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        Ok(match found {
            Found::Scheduled(item) => {
                let next = item.without_push(status, now);
                let mut writes = vec![versioned_put(
                    &self.table,
                    to_item("scheduled", &next)?,
                    item.version(),
                )?];
                writes.extend(crate::store::items::outcome::outcome_write(
                    &self.table,
                    pk,
                    note_id,
                    next.note.origin().as_ref(),
                    (status, None),
                    now,
                )?);
                writes
            }
            Found::Outbox(outbox) => {
                let state = match status {
                    PushStatus::Replaced => OutboxState::Replaced,
                    _ => OutboxState::Cancelled,
                };
                let next =
                    outbox.moved(state, None, self.shards, now, self.limits.retention.outbox);
                let mut writes =
                    push_moved(&self.table, pk, outbox, &next, Some((status, None)), now)?;
                // (Without the notification when its retention removed it: the push
                // still ended, and is told.)
                writes.retain(|w| with_note || !is_note_update(w));
                // A push waiting for a grant may have been woken for one: the next
                // waiting push is woken through the wake entry instead.
                if outbox.waiting_grant {
                    writes.push(wake_now(&self.table, pk, &outbox.template_id, now)?);
                }
                writes
            }
            Found::None => Vec::new(),
        })
    }

    /// Records on the event's record how a cancel of it ended.
    fn cancel_recorded(
        &self,
        pk: &str,
        sk: &str,
        outcome: &str,
        now: DateTime<Utc>,
    ) -> Result<TransactWriteItem, StoreError> {
        let recorded = change()
            .set("cancel", s(outcome))
            .set("cancelled_at", n(now.timestamp_millis()));
        update(&self.table, key(pk, sk), recorded)
            .when(is_there())
            .write()
    }
}
