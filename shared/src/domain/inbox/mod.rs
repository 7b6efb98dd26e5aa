//! The in-app inbox and the WeChat pushes that may accompany a notification.
//!
//! A notification is a business fact: it is stored whatever happens to its push
//! (invariant I7). Its push, when asked for, is an outbox item the dispatcher sends like
//! a reminder — claim a grant, send, finalize — and the notification shows how it went.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::domain::ids::{OpenId, TemplateId};
use crate::domain::keywords::{KeywordError, fit_all};
use crate::domain::settle::{OutboxState, OutcomeClass, SendResult};
use crate::domain::template::Templates;
use crate::domain::text::{clean_line, clean_lines};

pub mod cancel;
pub mod error;
pub mod pending;
pub mod preferences;
pub mod refill;
pub mod schedule;

use error::EventError;
use schedule::Timing;

/// Limits on what a publishing service may put in a notification.
pub const MAX_TITLE_CHARS: usize = 100;
pub const MAX_BODY_CHARS: usize = 2000;
pub const MAX_PAGE_CHARS: usize = 256;
pub const MAX_KEY_CHARS: usize = 128;
/// The whole `detail`, as JSON: far above what the fields below allow together, far
/// below DynamoDB's 400 KB item and EventBridge's 256 KB event.
pub const MAX_DETAIL_BYTES: usize = 16 * 1024;
/// One raw keyword value before it is fitted (the longest valid one is a `date` range).
pub const MAX_VALUE_CHARS: usize = 200;
/// Keywords in `wechat.data` (templates have at most a few).
pub const MAX_DATA_KEYS: usize = 20;
/// A publisher's EventBridge `source`.
pub const MAX_SOURCE_CHARS: usize = 128;

/// Where a notification's WeChat push stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PushStatus {
    /// Waiting for the dispatcher (or retrying after a definite, retryable failure).
    Pending,
    Sent,
    /// No grant for the template: nothing was sent.
    Skipped,
    Failed,
    /// Sent, but WeChat's answer was lost: never resent.
    Unknown,
    /// Refused before sending: unknown template or data that cannot be made valid.
    Rejected,
    /// Not gone out by its `expires_at`: never sent, no grant spent.
    Expired,
    /// Cancelled by its publisher before it went out: never sent, no grant spent.
    Cancelled,
    /// Replaced by a newer notification's push of the same `collapse_key` before it
    /// went out: never sent, no grant spent.
    Replaced,
    /// Its notification type is muted by the user: never sent, no grant spent.
    Muted,
    /// Past the user's daily cap (`PUSHES_PER_DAY`) until it expired: never sent, no
    /// grant spent.
    Capped,
}

impl PushStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sent => "sent",
            Self::Skipped => "skipped",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
            Self::Replaced => "replaced",
            Self::Muted => "muted",
            Self::Capped => "capped",
        }
    }

    /// The push status a notification shows for its push's outbox state.
    pub fn of_outbox(state: OutboxState) -> Self {
        match state {
            OutboxState::Pending | OutboxState::Sending => Self::Pending,
            OutboxState::Sent => Self::Sent,
            OutboxState::Skipped => Self::Skipped,
            OutboxState::Failed => Self::Failed,
            OutboxState::Unknown => Self::Unknown,
            OutboxState::Expired => Self::Expired,
            OutboxState::Cancelled => Self::Cancelled,
            OutboxState::Replaced => Self::Replaced,
            OutboxState::Muted => Self::Muted,
            OutboxState::Capped => Self::Capped,
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "pending" => Self::Pending,
            "sent" => Self::Sent,
            "skipped" => Self::Skipped,
            "failed" => Self::Failed,
            "unknown" => Self::Unknown,
            "rejected" => Self::Rejected,
            "expired" => Self::Expired,
            "cancelled" => Self::Cancelled,
            "replaced" => Self::Replaced,
            "muted" => Self::Muted,
            "capped" => Self::Capped,
            _ => return None,
        })
    }
}

/// Why a push is not (yet) `sent`, as answers say it: a stable code from API.md's list.
/// WeChat's errmsg and the HTTP client's words never reach an answer; they are logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PushReason {
    /// `rejected`: the event named no template.
    TemplateMissing,
    /// `rejected`: the template is not configured.
    TemplateNotConfigured,
    /// `rejected`: `wechat.data` is not an object of keyword values.
    DataInvalid,
    /// `rejected`: a keyword of the template has no value.
    KeywordMissing,
    /// `rejected`: a value cannot be made valid for its keyword's type.
    KeywordInvalid,
    /// `rejected`: `wechat.page` is not a page path of at most 256 characters.
    PageInvalid,
    /// `skipped`: the user holds no grant of the template.
    NoGrant,
    /// `skipped`: the user's settings keep the template refused (a kept reject, a
    /// ban, or the main switch off); the grants held stay unspent.
    TurnedOff,
    /// `pending` or `failed`: WeChat was busy or throttled (retried, up to a limit).
    WechatBusy,
    /// `failed`: WeChat refused the template, page or content.
    ContentRejected,
    /// `failed`: WeChat says the user has no grant of the template (43101).
    UserRefused,
    /// `failed`: the openid is invalid or the user frozen.
    UserUnavailable,
    /// `pending` or `failed`: the request never reached WeChat.
    NotSent,
    /// `failed`: the message could not be built from the stored data.
    InvalidContent,
    /// `unknown`: WeChat's answer was lost; never resent.
    Uncertain,
    /// `pending`: past the user's daily cap; due again on their next day.
    Capped,
    /// `rejected`: the user had `PUSHES_PENDING_MAX` open pushes from the event's
    /// publisher already.
    TooManyPending,
}

impl PushReason {
    pub const ALL: [Self; 17] = [
        Self::TemplateMissing,
        Self::TemplateNotConfigured,
        Self::DataInvalid,
        Self::KeywordMissing,
        Self::KeywordInvalid,
        Self::PageInvalid,
        Self::NoGrant,
        Self::TurnedOff,
        Self::WechatBusy,
        Self::ContentRejected,
        Self::UserRefused,
        Self::UserUnavailable,
        Self::NotSent,
        Self::InvalidContent,
        Self::Uncertain,
        Self::Capped,
        Self::TooManyPending,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::TemplateMissing => "template_missing",
            Self::TemplateNotConfigured => "template_not_configured",
            Self::DataInvalid => "data_invalid",
            Self::KeywordMissing => "keyword_missing",
            Self::KeywordInvalid => "keyword_invalid",
            Self::PageInvalid => "page_invalid",
            Self::NoGrant => "no_grant",
            Self::TurnedOff => "turned_off",
            Self::WechatBusy => "wechat_busy",
            Self::ContentRejected => "content_rejected",
            Self::UserRefused => "user_refused",
            Self::UserUnavailable => "user_unavailable",
            Self::NotSent => "not_sent",
            Self::InvalidContent => "invalid_content",
            Self::Uncertain => "uncertain",
            Self::Capped => "capped",
            Self::TooManyPending => "too_many_pending",
        }
    }

    /// A stored code; anything else (free text kept by an earlier version) is `None`.
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == value)
    }

    /// Why a send that did not end `sent` ended as it did.
    pub fn of_send(result: &SendResult) -> Option<Self> {
        Some(match result {
            SendResult::Sent { .. } => return None,
            SendResult::Refused { .. } => match result.class() {
                OutcomeClass::Retryable => Self::WechatBusy,
                OutcomeClass::Refused => Self::UserRefused,
                OutcomeClass::User => Self::UserUnavailable,
                OutcomeClass::Sent | OutcomeClass::Config | OutcomeClass::Unknown => {
                    Self::ContentRejected
                }
            },
            SendResult::Uncertain { .. } => Self::Uncertain,
            SendResult::NotSent { .. } => Self::NotSent,
            SendResult::Invalid { .. } => Self::InvalidContent,
        })
    }
}

/// The WeChat push an event asks for, validated against the templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Push {
    /// Ready to send: template and data fitted to its keyword rules.
    Ready {
        template_id: TemplateId,
        data: BTreeMap<String, String>,
        page: Option<String>,
    },
    /// Not sendable: recorded with the code; `detail` is for the log only.
    Rejected { code: PushReason, detail: String },
}

impl Push {
    /// The status the push takes as its notification is stored, and why: rejected as
    /// validated; else cancelled if a cancel came first, expired if its last moment has
    /// passed, rejected if the user's open pushes are `capped`; else pending.
    pub fn first_status(
        &self,
        cancelled_first: bool,
        expired: bool,
        capped: Option<PushReason>,
    ) -> (PushStatus, Option<PushReason>) {
        match self {
            Self::Rejected { code, .. } => (PushStatus::Rejected, Some(*code)),
            Self::Ready { .. } if cancelled_first => (PushStatus::Cancelled, None),
            Self::Ready { .. } if expired => (PushStatus::Expired, None),
            Self::Ready { .. } => match capped {
                Some(code) => (PushStatus::Rejected, Some(code)),
                None => (PushStatus::Pending, None),
            },
        }
    }
}

/// A validated `notify` event (the EventBridge `detail`, API.md), its text cleaned of
/// Cc/Cf/Zl/Zp characters ([`crate::domain::text`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyEvent {
    /// The publisher (EventBridge `source`): an idempotency key is unique per publisher,
    /// across users.
    pub publisher: String,
    pub idempotency_key: String,
    pub openid: OpenId,
    pub kind: String,
    pub title: String,
    pub body: String,
    pub page: Option<String>,
    pub push: Option<Push>,
    /// When it appears and when its push may go.
    pub timing: Timing,
    /// A newer notification of the same user with the same key (from the same
    /// publisher) replaces this one's push while that has not gone out.
    pub collapse_key: Option<String>,
    /// A SHA-256 (hex) of the event's canonical text, for "same key, same payload":
    /// stored instead of the payload, so the record stays small whatever was sent.
    pub fingerprint: String,
}

fn text(
    object: &serde_json::Map<String, Value>,
    name: &str,
    required: bool,
    max: usize,
) -> Result<Option<String>, EventError> {
    match object.get(name) {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(EventError::Shape(format!("{name} is required"))),
        Some(Value::String(s)) if s.chars().count() <= max && !(required && s.is_empty()) => {
            Ok(Some(s.clone()))
        }
        Some(Value::String(_)) => Err(EventError::Shape(format!(
            "{name} must be 1 to {max} characters"
        ))),
        Some(_) => Err(EventError::Shape(format!("{name} must be a string"))),
    }
}

/// Whether `key` can be an event's `idempotency_key`: 1 to [`MAX_KEY_CHARS`]
/// characters, no `#` or control character (checked before any read).
pub fn is_idempotency_key(key: &str) -> bool {
    (1..=MAX_KEY_CHARS).contains(&key.chars().count())
        && !key.contains('#')
        && !key.chars().any(char::is_control)
}

/// Whether `source` can name a publisher: 1 to 128 printable ASCII characters, no `#`.
pub fn is_publisher(source: &str) -> bool {
    (1..=MAX_SOURCE_CHARS).contains(&source.len())
        && source.bytes().all(|b| b.is_ascii_graphic() && b != b'#')
}

impl NotifyEvent {
    /// The event `publisher` sent, validated: refused when a field is missing, of the
    /// wrong type or over its cap; text cleaned; the push checked against `templates`;
    /// its timing checked at `now`.
    pub fn from_json(
        detail: &Value,
        publisher: &str,
        templates: &Templates,
        now: DateTime<Utc>,
    ) -> Result<Self, EventError> {
        if !is_publisher(publisher) {
            return Err(EventError::Shape(format!(
                "source must be 1 to {MAX_SOURCE_CHARS} printable ASCII characters without '#'"
            )));
        }
        let size = serde_json::to_vec(detail).map_or(usize::MAX, |b| b.len());
        if size > MAX_DETAIL_BYTES {
            return Err(EventError::Shape(format!(
                "detail is {size} bytes; at most {MAX_DETAIL_BYTES}"
            )));
        }
        let object = detail
            .as_object()
            .ok_or_else(|| EventError::Shape("detail must be a JSON object".into()))?;
        let key = text(object, "idempotency_key", true, MAX_KEY_CHARS)?.unwrap_or_default();
        if key.contains('#') || key.chars().any(char::is_control) {
            return Err(EventError::Shape(
                "idempotency_key may not contain '#' or control characters".into(),
            ));
        }
        let openid = OpenId::parse(text(object, "openid", true, 64)?.unwrap_or_default())
            .map_err(|e| EventError::Shape(format!("openid: {e}")))?;
        let collapse_key = text(object, "collapse_key", false, MAX_KEY_CHARS)?;
        if collapse_key
            .as_ref()
            .is_some_and(|k| k.is_empty() || k.contains('#') || k.chars().any(char::is_control))
        {
            return Err(EventError::Shape(format!(
                "collapse_key must be 1 to {MAX_KEY_CHARS} characters without '#' or control characters"
            )));
        }
        let kind = text(object, "type", true, 32)?.unwrap_or_default();
        if !kind
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err(EventError::Shape(
                "type may contain only letters, digits and '_', '.', '-'".into(),
            ));
        }
        let title = clean_line(&text(object, "title", true, MAX_TITLE_CHARS)?.unwrap_or_default())
            .trim()
            .to_string();
        if title.is_empty() {
            return Err(EventError::Shape("title has no visible characters".into()));
        }
        let body = clean_lines(&text(object, "body", false, MAX_BODY_CHARS)?.unwrap_or_default());
        let page = text(object, "page", false, MAX_PAGE_CHARS)?.map(|p| clean_line(&p));
        let push = match object.get("wechat") {
            None | Some(Value::Null) => None,
            Some(Value::Object(wechat)) => Some(Self::push(wechat, templates)),
            Some(_) => return Err(EventError::Shape("wechat must be an object".into())),
        };
        let mut timing = Timing::from_json(object, now)?;
        let mut canonical = serde_json::json!({
            "openid": openid.as_str(), "type": kind, "title": title, "body": body,
            "page": page, "wechat": object.get("wechat"),
        });
        for (name, value) in timing.canonical() {
            canonical[name] = value;
        }
        if let Some(key) = &collapse_key {
            canonical["collapse_key"] = Value::from(key.as_str());
        }
        let canonical = canonical.to_string();
        let fingerprint = hex::encode(Sha256::digest(canonical.as_bytes()));
        // An event naming no priority takes its template's (after the fingerprint: it
        // is configuration, not the event's payload).
        if object.get("priority").is_none_or(Value::is_null)
            && let Some(Push::Ready { template_id, .. }) = &push
            && let Some(priority) = templates.get(template_id.as_str()).and_then(|t| t.priority)
        {
            timing.priority = priority;
        }
        Ok(Self {
            publisher: publisher.to_string(),
            idempotency_key: key,
            openid,
            kind,
            title,
            body,
            page,
            push,
            timing,
            collapse_key,
            fingerprint,
        })
    }

    fn push(wechat: &serde_json::Map<String, Value>, templates: &Templates) -> Push {
        let rejected = |code: PushReason, detail: String| Push::Rejected { code, detail };
        let Some(template_id) = wechat.get("template_id").and_then(Value::as_str) else {
            return rejected(
                PushReason::TemplateMissing,
                "wechat.template_id is required".into(),
            );
        };
        let Some(template) = templates.get(template_id) else {
            return rejected(
                PushReason::TemplateNotConfigured,
                format!("template {template_id} is not configured"),
            );
        };
        let Some(data) = wechat.get("data").and_then(Value::as_object) else {
            return rejected(
                PushReason::DataInvalid,
                "wechat.data must be an object of keyword values".into(),
            );
        };
        if data.len() > MAX_DATA_KEYS {
            return rejected(
                PushReason::DataInvalid,
                format!("wechat.data has more than {MAX_DATA_KEYS} keywords"),
            );
        }
        let page = match wechat.get("page") {
            None | Some(Value::Null) => template.page.clone(),
            Some(Value::String(p)) if p.chars().count() <= MAX_PAGE_CHARS => Some(clean_line(p)),
            Some(_) => {
                return rejected(
                    PushReason::PageInvalid,
                    format!("wechat.page must be a string of at most {MAX_PAGE_CHARS} characters"),
                );
            }
        };
        let mut values = BTreeMap::new();
        for (k, v) in data {
            let value = match v {
                Value::String(s) => s.clone(),
                Value::Object(o) => match o.get("value").and_then(Value::as_str) {
                    Some(s) => s.to_string(),
                    None => {
                        return rejected(
                            PushReason::DataInvalid,
                            format!("wechat.data.{k} has no value"),
                        );
                    }
                },
                Value::Number(n) => n.to_string(),
                _ => {
                    return rejected(
                        PushReason::DataInvalid,
                        format!("wechat.data.{k} must be a string"),
                    );
                }
            };
            if value.chars().count() > MAX_VALUE_CHARS {
                return rejected(
                    PushReason::KeywordInvalid,
                    format!("wechat.data.{k} is over {MAX_VALUE_CHARS} characters"),
                );
            }
            values.insert(k.clone(), value);
        }
        match fit_all(template, &values) {
            Ok(data) => Push::Ready {
                template_id: template.id.clone(),
                data,
                page,
            },
            Err(e @ KeywordError::Missing(_)) => {
                rejected(PushReason::KeywordMissing, e.to_string())
            }
            Err(e @ KeywordError::Invalid { .. }) => {
                rejected(PushReason::KeywordInvalid, e.to_string())
            }
        }
    }
}

/// `<notification>` of API.md, with its push status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotificationView {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub body: String,
    pub page: Option<String>,
    pub read: bool,
    pub created_at: String,
    pub push: Option<PushView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PushView {
    pub status: PushStatus,
    pub reason: Option<PushReason>,
}

/// A status a notification's push reached, and when (RFC 3339, UTC): its history, as
/// the publisher API answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct PushMoment {
    pub status: String,
    pub at: String,
}

impl PushMoment {
    pub fn new(status: PushStatus, at: DateTime<Utc>) -> Self {
        Self {
            status: status.as_str().to_string(),
            at: at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        }
    }
}

/// A notification id: `<13-digit epoch ms><12 hex>`, so ids sort by creation time.
pub fn new_notification_id(now: DateTime<Utc>) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{:013}{}", now.timestamp_millis().max(0), &random[..12])
}

/// Whether `id` has the shape of a notification id (checked before any read).
pub fn is_notification_id(id: &str) -> bool {
    id.len() == 25
        && id.bytes().take(13).all(|b| b.is_ascii_digit())
        && id.bytes().skip(13).all(|b| b.is_ascii_hexdigit())
}

/// The cursor for the page after notification `id`: `n1.` and the id, so the
/// contract's pattern (`^n1\.[0-9]{13}[0-9a-f]{12}$`) says exactly which cursors are
/// accepted.
pub fn encode_cursor(id: &str) -> String {
    format!("{CURSOR_PREFIX}{id}")
}

const CURSOR_PREFIX: &str = "n1.";

/// The notification id a cursor continues after, if the cursor is well formed. A cursor
/// holds no user: pages always come from the caller's own inbox, so any well-formed
/// cursor only positions the page.
pub fn decode_cursor(cursor: &str) -> Option<String> {
    let id = cursor.strip_prefix(CURSOR_PREFIX)?;
    is_notification_id(id).then(|| id.to_string())
}

#[cfg(test)]
mod tests;
