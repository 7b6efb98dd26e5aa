//! `notify`: turns other services' EventBridge events into inbox notifications and,
//! when asked, WeChat pushes (outbox items the dispatcher sends).
//!
//! The event's `detail` is API.md's `{"idempotency_key", "openid", "type", "title",
//! "body", "page", "wechat"}`. One transaction stores everything; the same key again is
//! a no-op, and the same key with another payload is logged as a conflict and changes
//! nothing. A push that cannot be sent (unknown template, invalid keywords) is recorded
//! `rejected` on the notification, which is stored all the same (record first, I7).
//!
//! Publishers keep to their lanes: with `PUBLISHER_LANES` set (the deployed stack), an
//! event whose `account` (set by EventBridge, not by the sender) is not paired with its
//! `source` is refused (`reason: lane`) before anything is read. [`publish`] is the path
//! the publisher API shares.

use futures::future::BoxFuture;
use onegrant::Deps;
use onegrant::domain::inbox::cancel::CancelEvent;
use onegrant::domain::inbox::{NotifyEvent, Push, PushReason};
use onegrant::events::EventError;
use onegrant::store::audit::attributed;
use onegrant::store::inbox::{Cancelled, Ingested};
use onegrant::telemetry::{error_chain, openid_hash};
use serde_json::{Value, json};

/// The `detail-type` of onegrant's events.
pub const DETAIL_TYPE: &str = "onegrant.notification";
/// The `detail-type` of a cancel of an event's push: `{openid, idempotency_key}`.
pub const CANCEL_DETAIL_TYPE: &str = "onegrant.cancel";

/// Handles one EventBridge event. `Err` only when the store is unavailable, so that
/// EventBridge retries; a malformed event is answered (and logged), not retried.
pub async fn handle(deps: &Deps, event: Value) -> Result<Value, EventError> {
    // The rule on the stack's own bus matches source and detail-type already; checked
    // again here, so a misrouted or hand-invoked event is refused too.
    let source = event
        .get("source")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let detail_type = event.get("detail-type").and_then(Value::as_str);
    if detail_type != Some(DETAIL_TYPE) && detail_type != Some(CANCEL_DETAIL_TYPE) {
        tracing::error!(
            source,
            reason = "detail_type",
            "notify event of another detail-type refused"
        );
        return Ok(json!({"status": "refused", "reason": "detail_type"}));
    }
    // onegrant's own notices (the refill notice) are published under its own name:
    // no event on the bus may take their keys.
    let reserved = source == onegrant::domain::inbox::refill::PUBLISHER;
    if reserved
        || deps
            .config
            .notify_sources
            .as_ref()
            .is_some_and(|allowed| !allowed.iter().any(|s| s == source))
    {
        tracing::error!(
            source,
            reason = "source",
            "notify event from a publisher not allowed refused"
        );
        return Ok(json!({"status": "refused", "reason": "source"}));
    }
    // A source with a lane is its accounts' alone (EventBridge sets `account`, the
    // sender cannot): publisher A cannot cancel, take or replace B's notifications.
    if let Some(lanes) = &deps.config.lanes {
        let account = onegrant::domain::publisher::event_account(&event);
        if let Err(why) = lanes.admits(source, account, &deps.config.stack_account) {
            tracing::error!(
                source,
                account,
                reason = "lane",
                lane = ?why,
                "notify event from an account not paired with its source refused"
            );
            return Ok(json!({"status": "refused", "reason": "lane"}));
        }
    }
    let Some(detail) = event.get("detail") else {
        tracing::error!(reason = "no detail", "notify event refused");
        return Ok(json!({"status": "invalid", "reason": "the event has no detail"}));
    };
    let kind = if detail_type == Some(CANCEL_DETAIL_TYPE) {
        Kind::Cancel
    } else {
        Kind::Notification
    };
    publish(deps, source, kind, detail).await
}

/// What a publisher asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `onegrant.notification`: a notification, and a push when asked.
    Notification,
    /// `onegrant.cancel`: a cancel of one's push.
    Cancel,
}

/// One publisher's request, from the bus or the publisher API (the same validation,
/// idempotency and answers): `source` is the publisher, already checked.
pub async fn publish(
    deps: &Deps,
    source: &str,
    kind: Kind,
    detail: &Value,
) -> Result<Value, EventError> {
    let now = deps.clock.now();
    if kind == Kind::Cancel {
        return cancel(deps, detail, source).await;
    }
    let parsed = match NotifyEvent::from_json(detail, source, &deps.config.templates, now) {
        Ok(parsed) => parsed,
        Err(e) => {
            tracing::error!(reason = %e, "notify event refused");
            return Ok(json!({"status": "invalid", "reason": e.to_string()}));
        }
    };
    if let Some(Push::Rejected { code, detail }) = &parsed.push {
        // The answer and the notification carry the code; the words are for the log.
        tracing::warn!(
            reason = code.as_str(),
            detail,
            "push rejected before sending"
        );
    }
    let cause = format!("notify {}:{}", parsed.publisher, parsed.idempotency_key);
    let ingested = attributed(cause, deps.store.ingest(&parsed, now))
        .await
        .map_err(|e| {
            tracing::error!(error = %error_chain(&e), "notify event not stored");
            EventError::Store(e)
        })?;
    let openid = openid_hash(parsed.openid.as_str());
    match &ingested {
        Ingested::Created {
            note_id,
            push,
            reason,
            send_at,
        } => {
            if reason.as_deref() == Some(PushReason::TooManyPending.as_str()) {
                tracing::warn!(%openid, note_id, publisher = parsed.publisher.as_str(), "the user has too many open pushes from this publisher: this one rejected, its notification stored");
            }
            tracing::info!(%openid, note_id, push = ?push, reason = ?reason, send_at = ?send_at, "notification stored")
        }
        Ingested::Duplicate { note_id } => {
            tracing::info!(%openid, note_id, "duplicate event ignored")
        }
        Ingested::Erased => {
            tracing::info!(%openid, "an event for an erased user: nothing stored")
        }
        Ingested::Conflict { note_id } => tracing::error!(
            %openid,
            note_id,
            key = %parsed.idempotency_key,
            "idempotency key reused with a different payload: nothing changed"
        ),
    }
    serde_json::to_value(ingested).map_err(EventError::Answer)
}

/// A cancel of an event's push (see `Store::cancel`).
async fn cancel(deps: &Deps, detail: &Value, source: &str) -> Result<Value, EventError> {
    let parsed = match CancelEvent::from_json(detail, source) {
        Ok(parsed) => parsed,
        Err(e) => {
            tracing::error!(reason = %e, "cancel event refused");
            return Ok(json!({"status": "invalid", "reason": e.to_string()}));
        }
    };
    let cause = format!("cancel {}:{}", parsed.publisher, parsed.idempotency_key);
    let cancelled = attributed(cause, deps.store.cancel(&parsed, deps.clock.now()))
        .await
        .map_err(|e| {
            tracing::error!(error = %error_chain(&e), "cancel not recorded");
            EventError::Store(e)
        })?;
    let openid = openid_hash(parsed.openid.as_str());
    match &cancelled {
        Cancelled::TooLate { note_id, push } => {
            tracing::warn!(%openid, note_id, push = push.as_str(), "cancel came too late: the push stays as it was")
        }
        other => tracing::info!(%openid, outcome = ?other, "cancel applied"),
    }
    serde_json::to_value(cancelled).map_err(EventError::Answer)
}

/// The handler as its Lambda `main` and the local Invoke API take it.
pub fn invoke(
    deps: &Deps,
    event: Value,
    _budget: std::time::Duration,
) -> BoxFuture<'_, Result<Value, EventError>> {
    Box::pin(async move {
        let answer = handle(deps, event).await;
        // One count per event by how it ended (a failed one is Lambda's to retry).
        if let Ok(answer) = &answer {
            count(answer);
        }
        answer
    })
}

/// Counts one publisher request by how it ended (`Events{Outcome}`, and its push's
/// refusals), from the bus or the publisher API alike.
pub fn count(answer: &Value) {
    use onegrant::metrics::{count, count_by, name};
    let outcome = answer["status"].as_str().unwrap_or("invalid").to_string();
    count_by(name::EVENTS, "Outcome", outcome, 1);
    if answer["push"] == "rejected" {
        count(name::PUSHES_REJECTED, 1);
    }
    if answer["reason"] == PushReason::TooManyPending.as_str() {
        count(name::PUSHES_TOO_MANY_PENDING, 1);
    }
}
