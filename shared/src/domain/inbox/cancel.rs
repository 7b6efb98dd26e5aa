//! Cancelling a notification's push: an `onegrant.cancel` event names the notification
//! by its publisher's idempotency key; its push is cancelled if it has not gone out,
//! and a cancel that arrives before its notification still cancels it.

use serde_json::Value;

use crate::domain::ids::OpenId;
use crate::domain::inbox::error::EventError;
use crate::domain::inbox::{MAX_KEY_CHARS, PushStatus, is_publisher};
use crate::domain::settle::OutboxState;

/// A validated `onegrant.cancel` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelEvent {
    pub publisher: String,
    pub idempotency_key: String,
    pub openid: OpenId,
}

impl CancelEvent {
    /// The cancel `publisher` sent: `{openid, idempotency_key}`, checked as `notify`
    /// checks the same fields.
    pub fn from_json(detail: &Value, publisher: &str) -> Result<Self, EventError> {
        if !is_publisher(publisher) {
            return Err(EventError::Shape(
                "source must be 1 to 128 printable ASCII characters without '#'".into(),
            ));
        }
        let object = detail
            .as_object()
            .ok_or_else(|| EventError::Shape("detail must be a JSON object".into()))?;
        let text = |name: &str, max: usize| -> Result<String, EventError> {
            match object.get(name) {
                Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= max => {
                    Ok(s.clone())
                }
                Some(Value::String(_)) => Err(EventError::Shape(format!(
                    "{name} must be 1 to {max} characters"
                ))),
                None | Some(Value::Null) => Err(EventError::Shape(format!("{name} is required"))),
                Some(_) => Err(EventError::Shape(format!("{name} must be a string"))),
            }
        };
        let key = text("idempotency_key", MAX_KEY_CHARS)?;
        if key.contains('#') || key.chars().any(char::is_control) {
            return Err(EventError::Shape(
                "idempotency_key may not contain '#' or control characters".into(),
            ));
        }
        let openid = OpenId::parse(text("openid", 64)?)
            .map_err(|e| EventError::Shape(format!("openid: {e}")))?;
        Ok(Self {
            publisher: publisher.to_string(),
            idempotency_key: key,
            openid,
        })
    }
}

/// Where the push a cancel names stands, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushFound {
    /// Waiting with its notification for `send_at`, its push with it.
    Scheduled,
    /// Waiting with its notification for `send_at`, its push ended already with
    /// this status (cancelled, replaced, expired).
    ScheduledEnded(PushStatus),
    /// In the outbox, in `state`.
    Outbox(OutboxState),
    /// The notification asked for no push, or its push was rejected before sending.
    None,
}

/// What a cancel does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelDecision {
    /// Cancel it: nothing sent, no grant spent.
    Cancel,
    /// Cancelled already (a cancel again): nothing changes.
    Already,
    /// An attempt is in flight (or its outcome unknown): that attempt is not stopped,
    /// but the cancel is recorded on the notification, so if the push comes due again
    /// (the attempt failed and is retried) its next claim cancels it.
    Request,
    /// It went out, or ended otherwise: it stays as it was and the cancel is recorded
    /// as too late.
    TooLate,
    /// There is no push to cancel.
    NoPush,
}

/// What a cancel does to the push it found.
pub fn decide(found: PushFound) -> CancelDecision {
    match found {
        PushFound::Scheduled | PushFound::Outbox(OutboxState::Pending) => CancelDecision::Cancel,
        PushFound::Outbox(OutboxState::Cancelled)
        | PushFound::ScheduledEnded(PushStatus::Cancelled) => CancelDecision::Already,
        PushFound::ScheduledEnded(PushStatus::Rejected) => CancelDecision::NoPush,
        PushFound::ScheduledEnded(_) => CancelDecision::TooLate,
        PushFound::Outbox(OutboxState::Sending | OutboxState::Unknown) => CancelDecision::Request,
        PushFound::Outbox(
            OutboxState::Sent
            | OutboxState::Skipped
            | OutboxState::Failed
            | OutboxState::Expired
            | OutboxState::Replaced
            | OutboxState::Muted
            | OutboxState::Capped,
        ) => CancelDecision::TooLate,
        PushFound::None => CancelDecision::NoPush,
    }
}

/// What was recorded on a notification while an attempt of its push was in flight,
/// for the push's next claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requested {
    /// A cancel.
    Cancel,
    /// A newer notification of its `collapse_key`.
    Replace,
}

/// What a newer notification with the same `collapse_key` does to the push it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaceDecision {
    /// It waits: ended `replaced` now, nothing sent, no grant spent.
    Replace,
    /// An attempt is in flight (or its outcome unknown): that attempt is not stopped,
    /// but the replacement is recorded on the older notification, so if the push comes
    /// due again (the attempt failed and is retried, or its lease ran out) its next
    /// claim ends it `replaced`, its grant kept.
    Request,
    /// It went out or ended otherwise: left as it is.
    Leave,
}

/// What a newer notification of the same `collapse_key` does to the push it found:
/// as a cancel would (see [`decide`]).
pub fn replace(found: PushFound) -> ReplaceDecision {
    match decide(found) {
        CancelDecision::Cancel => ReplaceDecision::Replace,
        CancelDecision::Request => ReplaceDecision::Request,
        CancelDecision::Already | CancelDecision::TooLate | CancelDecision::NoPush => {
            ReplaceDecision::Leave
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_push_is_cancelled_only_while_it_has_not_gone_out() {
        use CancelDecision::*;
        let cases = [
            (PushFound::Scheduled, Cancel),
            (PushFound::ScheduledEnded(PushStatus::Cancelled), Already),
            (PushFound::ScheduledEnded(PushStatus::Rejected), NoPush),
            (PushFound::ScheduledEnded(PushStatus::Expired), TooLate),
            (PushFound::ScheduledEnded(PushStatus::Replaced), TooLate),
            (PushFound::None, NoPush),
            (PushFound::Outbox(OutboxState::Pending), Cancel),
            (PushFound::Outbox(OutboxState::Cancelled), Already),
            (PushFound::Outbox(OutboxState::Sending), Request),
            (PushFound::Outbox(OutboxState::Sent), TooLate),
            (PushFound::Outbox(OutboxState::Unknown), Request),
            (PushFound::Outbox(OutboxState::Failed), TooLate),
            (PushFound::Outbox(OutboxState::Skipped), TooLate),
            (PushFound::Outbox(OutboxState::Expired), TooLate),
            (PushFound::Outbox(OutboxState::Replaced), TooLate),
        ];
        for (found, expected) in cases {
            assert_eq!(decide(found), expected, "{found:?}");
            let replaced = match expected {
                Cancel => ReplaceDecision::Replace,
                Request => ReplaceDecision::Request,
                _ => ReplaceDecision::Leave,
            };
            assert_eq!(replace(found), replaced, "{found:?}");
        }
    }

    #[test]
    fn cancels_without_their_essentials_are_refused() {
        let cases = [
            (json!([]), "detail must be a JSON object"),
            (json!({"openid": "oA"}), "idempotency_key is required"),
            (
                json!({"idempotency_key": "", "openid": "oA"}),
                "idempotency_key must be 1 to 128",
            ),
            (
                json!({"idempotency_key": "a#b", "openid": "oA"}),
                "may not contain '#'",
            ),
            (json!({"idempotency_key": "k"}), "openid is required"),
            (
                json!({"idempotency_key": "k", "openid": 7}),
                "openid must be a string",
            ),
            (json!({"idempotency_key": "k", "openid": "o#1"}), "openid:"),
        ];
        for (detail, reason) in cases {
            let error = CancelEvent::from_json(&detail, "shop").expect_err(&detail.to_string());
            assert!(error.to_string().contains(reason), "{detail}: {error}");
        }
        assert!(
            CancelEvent::from_json(&json!({"idempotency_key": "k", "openid": "oA"}), "a#b")
                .is_err()
        );
        let ok = CancelEvent::from_json(&json!({"idempotency_key": "k", "openid": "oA"}), "shop")
            .expect("valid");
        assert_eq!(
            (ok.publisher.as_str(), ok.idempotency_key.as_str()),
            ("shop", "k")
        );
    }
}
