//! The grant ledger item (`GRANT#<template>#<request_id>`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::grants::report::GrantEntry;
use crate::domain::{GrantState, RequestId, SubscribeResult, TemplateId};
use crate::store::items::expr::{Cond, all, eq};
use crate::store::items::{rfc3339, s};
use crate::store::keys::grant_sk;

/// The grant is in `state`.
pub(crate) fn grant_in(state: GrantState) -> Cond {
    eq("state", s(state.as_str()))
}

/// The grant is in `from` and names `delivery_id` (fenced: only the delivery that
/// reserved it moves it) — and, with `void_reason`, was voided for that reason.
pub(crate) fn held_by(from: GrantState, delivery_id: &str, void_reason: Option<&str>) -> Cond {
    all([
        Some(grant_in(from)),
        Some(eq("delivery_id", s(delivery_id))),
    ]
    .into_iter()
    .chain([void_reason.map(|why| eq("void_reason", s(why)))])
    .flatten())
}

/// The ledger item: a grant when `result` accepts, a recorded refusal otherwise.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct GrantItem {
    pub(crate) pk: String,
    pub(crate) sk: String,
    pub(crate) kind: String,
    pub(crate) template_id: TemplateId,
    pub(crate) request_id: RequestId,
    pub(crate) result: SubscribeResult,
    /// Present only on grants (accepted results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) state: Option<GrantState>,
    pub(crate) created_at: String,
    pub(crate) version: u64,
    /// Set once the item is final (a refusal at once, a grant when consumed or
    /// invalid): DynamoDB's TTL removes it after the grants retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires_at: Option<i64>,
}

impl GrantItem {
    /// A new ledger item: `available` when the result grants; a refusal is final from
    /// the start and expires after `retention`.
    pub(crate) fn new(
        pk: &str,
        template: &TemplateId,
        request_id: &RequestId,
        result: SubscribeResult,
        now: DateTime<Utc>,
        retention: chrono::Duration,
    ) -> Self {
        Self {
            pk: pk.to_string(),
            sk: grant_sk(template, request_id),
            kind: "grant".into(),
            template_id: template.clone(),
            request_id: request_id.clone(),
            result,
            state: result.grants().then_some(GrantState::Available),
            created_at: rfc3339(now),
            version: 0,
            expires_at: (!result.grants()).then(|| (now + retention).timestamp()),
        }
    }

    pub(crate) fn entry(&self) -> GrantEntry {
        GrantEntry {
            template_id: self.template_id.clone(),
            request_id: self.request_id.clone(),
            result: self.result,
            status: self.state.into(),
        }
    }
}
