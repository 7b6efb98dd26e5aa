//! A user's open pushes. Every open push — an outbox item `pending` or `sending`, a
//! scheduled notification with its push — carries `pending_pk` (the user's partition)
//! and `lane_pk` (its publisher's lane of it, [`crate::store::keys::lane_pk`]), set and
//! removed with the state they follow in the same write, so the sparse `pending` and
//! `lane` indexes hold exactly the open pushes and no count can drift.
//!
//! At ingest a publisher's open pushes for the user are counted on the `lane` index
//! against `PUSHES_PENDING_MAX` ([`crate::domain::inbox::pending`]): one publisher
//! filling its share refuses its own pushes, never another's. A count reads at most
//! the cap's number of index keys, whatever the user's history; finished pushes are not
//! on either index.
//!
//! Sorted by `<template>#<member>` and projecting `due_at` and `state`, the `pending`
//! index gives a push's claim the better pushes of its template due together with it,
//! whoever published them ([`Store::due_better`],
//! `domain::dispatch::priority::at_grant_due`): about the cap's number per publisher
//! (besides them only onegrant's own refill notices, one per depletion, which are not
//! capped, and pushes opened before lanes existed).

use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::types::Select;
use chrono::{DateTime, Utc};

use crate::domain::dispatch::priority::DueTogether;
use crate::domain::{OpenId, TemplateId};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::expr::{Cmp, all, compare, is_in};
use crate::store::items::query::{Keys, Range, partition};
use crate::store::items::{n, number, s, text};
use crate::store::keys::{lane_pk, user_pk};

impl Store {
    /// How many open pushes `openid` has from `publisher`, counted up to `up_to` (the
    /// index is eventually consistent: a push written a moment ago may not be counted
    /// yet).
    pub(crate) async fn pending_pushes(
        &self,
        openid: &OpenId,
        publisher: &str,
        up_to: u32,
    ) -> Result<u32, StoreError> {
        let mut counted = 0u32;
        let mut from = None;
        loop {
            let lane = partition("lane_pk", s(lane_pk(publisher, &user_pk(openid))));
            let sent = lane
                .on(self.index_query("lane"))
                .select(Select::Count)
                .limit(i32::try_from(up_to.saturating_sub(counted).max(1)).unwrap_or(i32::MAX))
                .set_exclusive_start_key(from)
                .send()
                .await;
            let Some(out) = answered(sent, "open pushes not counted")? else {
                return Ok(0);
            };
            counted = counted.saturating_add(u32::try_from(out.count()).unwrap_or(0));
            from = out.last_evaluated_key().cloned();
            if from.is_none() || counted >= up_to {
                return Ok(counted);
            }
        }
    }

    /// A query of the user `pk`'s entries on the `pending` index (`:p` bound).
    ///
    /// While DynamoDB builds an index (a deploy that adds it to a table with items),
    /// queries of it are refused ([`index_not_ready`]): the cap then admits and a claim
    /// yields to nobody, as before the index existed, rather than failing every ingest.
    fn pending_index(&self, keys: Keys) -> QueryFluentBuilder {
        keys.on(self.index_query("pending"))
    }

    /// `pk`'s open pushes of `template` of a better class than `own`
    /// that are due together with it (pending or scheduled, due within
    /// [`YIELD_WAIT`](crate::domain::dispatch::priority::YIELD_WAIT)), from the
    /// `pending` index: one key range of the template's better classes, read whole
    /// (bounded by `PUSHES_PENDING_MAX` per publisher, see the module docs; usually
    /// none).
    pub(crate) async fn due_better(
        &self,
        pk: &str,
        template: &TemplateId,
        own: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<DueTogether>, StoreError> {
        let prefix = format!("{template}#");
        let class = own.split_once(':').map_or(own, |(rank, _)| rank);
        let until = now + crate::domain::dispatch::priority::YIELD_WAIT;
        let since = now - crate::domain::dispatch::priority::YIELD_WAIT;
        let mut better = Vec::new();
        let mut from = None;
        loop {
            // Every member of a better class sorts between the template's prefix and
            // `<prefix><own rank>:`. Overdue by more than the wait: not coming (a claim
            // failing, a shard unread), so not waited for again.
            let better_keys = partition("pending_pk", s(pk))
                .range(
                    "pending_sk",
                    Range::Between(s(&prefix), s(format!("{prefix}{class}:"))),
                )
                .filter(all([
                    compare("due_at", Cmp::Ge, n(since.timestamp_millis())),
                    compare("due_at", Cmp::Le, n(until.timestamp_millis())),
                    is_in("state", vec![s("pending"), s("scheduled")]),
                ]));
            let sent = self
                .pending_index(better_keys)
                .set_exclusive_start_key(from)
                .send()
                .await;
            let Some(out) = answered(sent, "no push due together looked for")? else {
                return Ok(Vec::new());
            };
            for item in out.items() {
                let Some(member) = text(item, "pending_sk").and_then(|sk| sk.strip_prefix(&prefix))
                else {
                    continue;
                };
                if member < own {
                    better.push(DueTogether {
                        member: member.to_string(),
                        note_type: text(item, "note_type").map(str::to_string),
                        send_by: number(item, "send_by").and_then(DateTime::from_timestamp_millis),
                    });
                }
            }
            from = out.last_evaluated_key().cloned();
            if from.is_none() {
                return Ok(better);
            }
        }
    }
}

/// Whether DynamoDB refused a query of the index as not there yet: created by the
/// deploy and still being built ("backfilling"), or not created at all.
fn index_not_ready<E: aws_sdk_dynamodb::error::ProvideErrorMetadata, R>(
    e: &aws_sdk_dynamodb::error::SdkError<E, R>,
) -> bool {
    e.as_service_error().is_some_and(|s| {
        matches!(
            s.code(),
            Some("ValidationException" | "ResourceNotFoundException")
        ) && s
            .message()
            .is_some_and(|m| m.to_ascii_lowercase().contains("index"))
    })
}

/// A query's answer, or `None` (logged, with what is `skipped` for it) when the index is
/// not ready yet ([`index_not_ready`]).
fn answered<O, E>(
    sent: Result<O, aws_sdk_dynamodb::error::SdkError<E, aws_smithy_runtime_api::http::Response>>,
    skipped: &str,
) -> Result<Option<O>, StoreError>
where
    E: std::error::Error + aws_sdk_dynamodb::error::ProvideErrorMetadata + Send + Sync + 'static,
{
    match sent {
        Ok(out) => Ok(Some(out)),
        Err(e) if index_not_ready(&e) => {
            tracing::warn!(
                skipped,
                "an index of open pushes is not ready (still being built)"
            );
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}
