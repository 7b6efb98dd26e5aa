//! Forgetting a user (`domain::erasure`): the tombstone first, then bounded steps that
//! delete the user's partition — what the dispatcher could act on first, everything
//! else once no send is in flight — carried on by the dispatcher's ticks (the
//! tombstone sits on the due index while pending) until the partition is empty.

use aws_sdk_dynamodb::types::{DeleteRequest, TransactWriteItem, WriteRequest};
use chrono::{DateTime, Duration, Utc};

use crate::domain::OpenId;
use crate::domain::erasure::{
    DUE_PREFIXES, Disposition, ErasureCause, ErasureState, Next, Pass, Progress, Tombstone,
    disposition, next, progress,
};
use crate::domain::erasure::{InactiveDue, activity_day, inactive_due, inactive_from};
use crate::store::dispatch::DueItem;
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::activity::{ACTIVITY_SK, later_due, off_due, touched};
use crate::store::items::change::check;
use crate::store::items::expr::eq;
use crate::store::items::query::{Range, partition};
use crate::store::items::tombstone::{
    TOMBSTONE_SK, TombstoneItem, finished, not_erased, reopened, stepped, tombstone_pk,
};
use crate::store::items::{Item, key, n, number, s, text};
use crate::store::keys::user_pk;
use crate::store::retry::{Attempt, MAX_WRITE_ATTEMPTS, Tries, retry_carrying};
use crate::store::tx::{Outcome, Parts, TxOutcome};

/// Items one step reads per page, and the most it deletes: a step's reads and writes
/// are bounded whatever the user's history (docs/design.md §6).
const PAGE: i32 = 100;
const STEP_ITEMS: usize = 500;

/// DynamoDB's most requests in one `BatchWriteItem`.
const BATCH: usize = 25;

/// How long a tombstone is kept: past the longest a publisher's event or WeChat's may
/// be replayed (an event record's retention, and a scheduled one's month ahead).
fn keep(store: &Store) -> Duration {
    store.limits.retention.events + Duration::days(31)
}

/// The parts of an inactive user's erasure's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Begin {
    /// The new tombstone (none there, or one the user came back from).
    Tombstone,
    /// That the activity's entry is still the one come due.
    Activity,
}

/// What an erasure's start or step left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Erasure {
    pub state: ErasureState,
    /// Items deleted so far.
    pub deleted: u64,
    /// Still pending `domain::erasure::STALL_AFTER` after it began.
    pub stalled: bool,
    /// Begun by this call (not one begun before).
    pub begun: bool,
}

impl Erasure {
    /// An erasure in `state` with `deleted` items gone, neither stalled nor begun here.
    fn at(state: ErasureState, deleted: u64) -> Self {
        Self {
            state,
            deleted,
            stalled: false,
            begun: false,
        }
    }
}

impl Store {
    /// A condition that `openid` is not erased (no tombstone, or the user came back),
    /// for a write storing something new for them.
    pub(crate) fn not_erased_check(
        &self,
        openid: &OpenId,
    ) -> Result<TransactWriteItem, StoreError> {
        let tombstone = key(&tombstone_pk(&self.subject(openid)), TOMBSTONE_SK);
        check(&self.table, tombstone, not_erased()).write()
    }

    /// What admitting a request of `openid`'s reads: their tombstone, and — when
    /// inactivity erases (`INACTIVE_USER_DAYS`) — the day of their last request (both
    /// at once).
    pub async fn admission(
        &self,
        openid: &OpenId,
    ) -> Result<(Option<Tombstone>, Option<chrono::NaiveDate>), StoreError> {
        if self.limits.inactive_user_days == 0 {
            return Ok((self.tombstone(openid).await?, None));
        }
        let pk = user_pk(openid);
        let (tombstone, activity) =
            tokio::join!(self.tombstone(openid), self.get(&pk, ACTIVITY_SK));
        let day = activity?
            .as_ref()
            .and_then(|item| text(item, "day"))
            .and_then(|day| chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d").ok());
        Ok((tombstone?, day))
    }

    /// Moves `openid`'s activity to `now`'s day, when inactivity erases (lost to a
    /// request of the same day: the same).
    pub async fn touch_activity(
        &self,
        openid: &OpenId,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let today = activity_day(now);
        let Some(due) = inactive_from(today, self.limits.inactive_user_days) else {
            return Ok(());
        };
        let update = touched(&self.table, &user_pk(openid), today, due, self.shards)?;
        self.transact(vec![update]).await?;
        Ok(())
    }

    /// A user's activity come due (`DueItem::is_inactivity`), judged under the
    /// `INACTIVE_USER_DAYS` set now ([`inactive_due`]): no request for that many days,
    /// so their erasure begins (caused `inactive`) and the entry leaves the index; not
    /// yet (the days were raised since), due again then; inactivity turned off since,
    /// off the index. One that moved on meanwhile (a request today) is left as it is.
    pub async fn inactive_due(
        &self,
        due: &DueItem,
        now: DateTime<Utc>,
    ) -> Result<Erasure, StoreError> {
        let seen = due.due_at.timestamp_millis();
        let untouched = Erasure::at(ErasureState::Pending, 0);
        let Some(item) = self.get(&due.pk, &due.sk).await? else {
            return Ok(untouched);
        };
        let (Some(openid), true) = (due.openid(), number(&item, "due_at") == Some(seen)) else {
            return Ok(untouched);
        };
        let day = text(&item, "day")
            .and_then(|day| chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d").ok());
        let (erasure, write) = match inactive_due(day, self.limits.inactive_user_days, now) {
            InactiveDue::Erase => {
                // Begun only while the entry is as read: a request moving the user's
                // activity meanwhile wins, and nothing begins.
                let fresh = TombstoneItem::new(
                    &self.subject(&openid),
                    &openid,
                    ErasureCause::Inactive,
                    now,
                    keep(self),
                    self.shards,
                );
                let begin = Parts::new()
                    .with(Begin::Tombstone, fresh.put(&self.table)?)
                    .with(
                        Begin::Activity,
                        check(
                            &self.table,
                            key(&due.pk, ACTIVITY_SK),
                            eq("due_at", n(seen)),
                        )
                        .write()?,
                    );
                let erasure = match self.transact_parts(&begin).await? {
                    Outcome::Committed => {
                        tracing::info!(cause = "inactive", "an erasure began");
                        Erasure {
                            begun: true,
                            ..untouched
                        }
                    }
                    Outcome::Cancelled(failed) if failed.has(Begin::Activity) => {
                        return Ok(untouched);
                    }
                    // One there already (the user asked, or WeChat did): its state.
                    Outcome::Cancelled(_) => {
                        self.start_erasure(&openid, ErasureCause::Inactive, now)
                            .await?
                    }
                    // (Left due: the next tick reads it again.)
                    Outcome::Contended | Outcome::Conflict => return Ok(untouched),
                };
                (erasure, off_due(&self.table, &due.pk, seen)?)
            }
            // (Come up a little early, within the dispatcher's look ahead: left.)
            InactiveDue::Later(at) if at.timestamp_millis() == seen => return Ok(untouched),
            InactiveDue::Later(at) => (
                untouched,
                later_due(&self.table, &due.pk, seen, at, self.shards)?,
            ),
            InactiveDue::Off => (untouched, off_due(&self.table, &due.pk, seen)?),
        };
        self.transact(vec![write]).await?;
        Ok(erasure)
    }

    /// `openid`'s tombstone, if an erasure ever began.
    pub async fn tombstone(&self, openid: &OpenId) -> Result<Option<Tombstone>, StoreError> {
        match self.tombstone_item(openid).await? {
            Some(item) => Ok(Some(item.tombstone()?)),
            None => Ok(None),
        }
    }

    async fn tombstone_item(&self, openid: &OpenId) -> Result<Option<TombstoneItem>, StoreError> {
        let pk = tombstone_pk(&self.subject(openid));
        match self.get(&pk, TOMBSTONE_SK).await? {
            Some(item) => Ok(Some(TombstoneItem::read(item)?)),
            None => Ok(None),
        }
    }

    /// Begins erasing `openid` (`cause`), or answers the erasure already begun:
    /// idempotent. From the tombstone on, nothing new is stored for the user.
    pub async fn start_erasure(
        &self,
        openid: &OpenId,
        cause: ErasureCause,
        now: DateTime<Utc>,
    ) -> Result<Erasure, StoreError> {
        let subject = self.subject(openid);
        let fresh = TombstoneItem::new(&subject, openid, cause, now, keep(self), self.shards);
        let outcome = self.transact(vec![fresh.put(&self.table)?]).await?;
        if matches!(outcome, TxOutcome::Committed) {
            tracing::info!(cause = cause.as_str(), "an erasure began");
            return Ok(Erasure {
                begun: true,
                ..Erasure::at(ErasureState::Pending, 0)
            });
        }
        // One there already (or the answer lost): it is the one to answer.
        let Some(there) = self.tombstone_item(openid).await? else {
            return Err(StoreError::Unavailable(
                "an erasure's tombstone could not be written".into(),
            ));
        };
        Ok(Erasure::at(there.tombstone()?.state, there.deleted))
    }

    /// A request with a token issued at `issued_at` after `openid`'s erasure was done:
    /// the user came back, and their data is stored again.
    pub async fn reopen(&self, openid: &OpenId, tombstone: &Tombstone) -> Result<(), StoreError> {
        let pk = tombstone_pk(&self.subject(openid));
        let update = reopened(&self.table, &pk, tombstone.erased_at.timestamp_millis())?;
        // Lost to another request reopening it: the same.
        self.transact(vec![update]).await?;
        Ok(())
    }

    /// One bounded step of `openid`'s pending erasure (see the module docs).
    pub async fn erase_step(
        &self,
        openid: &OpenId,
        now: DateTime<Utc>,
    ) -> Result<Erasure, StoreError> {
        let Some(item) = self.tombstone_item(openid).await? else {
            return Err(StoreError::Corrupt(
                "an erasure step with no tombstone".into(),
            ));
        };
        self.step(item, openid, now).await
    }

    /// A pending erasure's due entry, from the dispatcher's tick.
    pub async fn erase_due(
        &self,
        due: &DueItem,
        now: DateTime<Utc>,
    ) -> Result<Erasure, StoreError> {
        let Some(item) = self.get(&due.pk, &due.sk).await? else {
            return Ok(Erasure::at(ErasureState::Done, 0));
        };
        let item = TombstoneItem::read(item)?;
        let Some(openid) = item.openid.clone() else {
            return Ok(Erasure::at(ErasureState::Done, item.deleted));
        };
        let openid = OpenId::parse(openid)
            .map_err(|_| StoreError::Corrupt(format!("tombstone {}: openid", item.pk)))?;
        self.step(item, &openid, now).await
    }

    async fn step(
        &self,
        item: TombstoneItem,
        openid: &OpenId,
        now: DateTime<Utc>,
    ) -> Result<Erasure, StoreError> {
        let tombstone = item.tombstone()?;
        if tombstone.state == ErasureState::Done {
            return Ok(Erasure::at(ErasureState::Done, item.deleted));
        }
        let pk = user_pk(openid);
        let started = tombstone.erased_at;
        let mut pass = item.pass();
        let mut deleted = 0u64;
        let outcome = loop {
            let prefixes: Vec<Option<&str>> = match pass {
                Pass::Due => DUE_PREFIXES.iter().map(|p| Some(*p)).collect(),
                Pass::Rest => vec![None],
            };
            let (mut in_flight, mut more) = (0, false);
            for prefix in prefixes {
                let room = STEP_ITEMS.saturating_sub(usize::try_from(deleted).unwrap_or(0));
                let (keys, kept, left) = self.page(&pk, prefix, room, started, now).await?;
                in_flight += kept;
                more |= left;
                deleted += u64::try_from(keys.len()).unwrap_or(0);
                self.delete_keys(keys).await?;
            }
            let (next, answer) = progress(pass, in_flight, more, now);
            pass = next;
            let spent = usize::try_from(deleted).unwrap_or(usize::MAX) >= STEP_ITEMS;
            match answer {
                // The due pass done: the rest at once, if this step has room.
                Progress::More if !spent && !more => continue,
                answer => break answer,
            }
        };
        let erased_at = started.timestamp_millis();
        let empty_since = item.empty_since.and_then(DateTime::from_timestamp_millis);
        let (state, update) = match next(outcome, deleted, empty_since, now) {
            Next::Done => (
                ErasureState::Done,
                finished(&self.table, &item.pk, erased_at, deleted, now)?,
            ),
            Next::Step { due, empty_since } => (
                ErasureState::Pending,
                stepped(
                    &self.table,
                    &item.pk,
                    erased_at,
                    pass,
                    deleted,
                    due,
                    empty_since,
                )?,
            ),
        };
        // Lost to a racing step: its record stands, and this step's deletes are done.
        self.transact(vec![update]).await?;
        if state == ErasureState::Done {
            tracing::info!(deleted = item.deleted + deleted, "an erasure is done");
        }
        let stalled =
            state == ErasureState::Pending && crate::domain::erasure::stalled(started, now);
        if stalled {
            tracing::error!(
                deleted = item.deleted + deleted,
                "an erasure is still pending an hour after it began (ErasuresStalled)"
            );
        }
        Ok(Erasure {
            stalled,
            ..Erasure::at(state, item.deleted + deleted)
        })
    }

    /// The keys of up to `room` items of the user's partition (those whose sort key
    /// begins with `prefix`) to delete, how many were kept for a send in flight, and
    /// whether more may follow.
    async fn page(
        &self,
        pk: &str,
        prefix: Option<&str>,
        room: usize,
        started: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(Vec<Item>, usize, bool), StoreError> {
        let mut keys = Vec::new();
        let mut kept = 0;
        let mut from: Option<Item> = None;
        loop {
            if keys.len() >= room {
                return Ok((keys, kept, true));
            }
            let keys_read = match prefix {
                Some(prefix) => partition("pk", s(pk)).range("sk", Range::Prefix(prefix.into())),
                None => partition("pk", s(pk)),
            };
            let query = keys_read
                .on(self.table_query())
                .limit(PAGE)
                .projection_expression("pk, sk, #state")
                .expression_attribute_names("#state", "state")
                .set_exclusive_start_key(from.take());
            let out = query.send().await?;
            for found in out.items() {
                let Some(sk) = text(found, "sk") else {
                    continue;
                };
                match disposition(text(found, "state"), started, now) {
                    Disposition::InFlight => kept += 1,
                    Disposition::Delete => keys.push(key(pk, sk)),
                }
            }
            match out.last_evaluated_key() {
                Some(last) if keys.len() < room => from = Some(last.clone()),
                Some(_) => return Ok((keys, kept, true)),
                None => return Ok((keys, kept, false)),
            }
        }
    }

    /// Deletes `keys`, 25 to a batch, retrying what DynamoDB leaves unprocessed.
    async fn delete_keys(&self, keys: Vec<Item>) -> Result<(), StoreError> {
        for chunk in keys.chunks(BATCH) {
            let requests: Vec<WriteRequest> = chunk
                .iter()
                .map(|k| {
                    DeleteRequest::builder()
                        .set_key(Some(k.clone()))
                        .build()
                        .map(|delete| WriteRequest::builder().delete_request(delete).build())
                        .map_err(StoreError::from)
                })
                .collect::<Result<_, _>>()?;
            let (done, _) = retry_carrying(
                "erase",
                Tries::Times(MAX_WRITE_ATTEMPTS),
                requests,
                |pending: Vec<WriteRequest>| async move {
                    let sent = self
                        .client
                        .batch_write_item()
                        .request_items(&self.table, pending.clone())
                        .send()
                        .await;
                    match sent {
                        Ok(out) => {
                            let left: Vec<WriteRequest> = out
                                .unprocessed_items()
                                .and_then(|u| u.get(&self.table))
                                .cloned()
                                .unwrap_or_default();
                            if left.is_empty() {
                                (Ok(Attempt::Done(())), left)
                            } else {
                                (Ok(Attempt::Retry), left)
                            }
                        }
                        Err(e) => (Err(e.into()), pending),
                    }
                },
            )
            .await;
            done?;
            // A container may vanish between batches: the step's record is not
            // written, and the next step deletes what is left.
            crate::failpoint::hit("erase_batch");
        }
        Ok(())
    }
}
