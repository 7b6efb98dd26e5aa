//! [`ApiError`]: every failure an HTTP route answers with, and the one place a lower
//! layer's error becomes a status and a body (its cause logged with its chain, the body
//! only a code and a human message).

use lambda_http::{Body, Response};
use serde::Serialize;

use crate::domain::consent::standing::SettingError;
use crate::domain::grants::ReportError;
use crate::domain::inbox::preferences::PreferencesError;
use crate::domain::reminders::schedule::ScheduleError;
use crate::domain::reminders::{CheckInError, SettingsError};
#[cfg(feature = "store")]
use crate::store::{Limit, StoreError};
use crate::wechat::WechatError;

/// Bodies over this size are refused with 413 (API.md).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Seconds a client should wait after a 503.
const RETRY_AFTER_SECONDS: u32 = 1;

/// Every failure an HTTP route can answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// 400: the body is not JSON.
    MalformedJson,
    /// 400: JSON, but not of the documented shape (missing field, wrong type).
    InvalidBody(String),
    /// 400: a query parameter is malformed (including a cursor this API did not issue).
    InvalidQuery(String),
    /// 401: missing, malformed, forged or expired session token.
    Unauthorized,
    /// 401: a publisher API request not signed by a publisher (a header missing, an
    /// unknown publisher, a stale timestamp, a wrong signature: one answer for all).
    Unsigned,
    /// 401: WeChat refused the login code.
    InvalidLoginCode,
    /// 403: a request that did not come through the stack's CloudFront distribution
    /// (when the template's edge protection is on: `from_elsewhere`).
    Forbidden,
    /// 404: unknown or foreign resource.
    NotFound,
    /// 409: an idempotency key reused with a different payload.
    IdempotencyConflict(String),
    /// 413: body over [`MAX_BODY_BYTES`].
    PayloadTooLarge,
    /// 422: well-formed but invalid; `code` names the rule.
    Unprocessable { code: &'static str, message: String },
    /// 429: too many requests from this user; retry after `retry_after` seconds.
    RateLimited { retry_after: u64 },
    /// 503: a dependency is unavailable; retry after a pause.
    Unavailable,
    /// 500: our fault; details are in the logs only.
    Internal,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    code: &'a str,
    message: &'a str,
}

impl ApiError {
    /// The HTTP status, the machine code and the human message.
    pub fn parts(&self) -> (u16, &'static str, String) {
        match self {
            Self::MalformedJson => (400, "malformed_json", "the body is not valid JSON".into()),
            Self::InvalidBody(m) => (400, "invalid_body", m.clone()),
            Self::InvalidQuery(m) => (400, "invalid_query", m.clone()),
            Self::Unauthorized => (
                401,
                "unauthorized",
                "a valid session token is required (Authorization: Bearer <token>)".into(),
            ),
            Self::Unsigned => (
                401,
                "unsigned",
                "sign the request: X-Onegrant-Publisher, X-Onegrant-Timestamp (within 300 s) and X-Onegrant-Signature".into(),
            ),
            Self::InvalidLoginCode => (
                401,
                "invalid_code",
                "WeChat refused the login code; call wx.login for a new one".into(),
            ),
            Self::Forbidden => (
                403,
                "forbidden",
                "this API is reached through its public address only".into(),
            ),
            Self::NotFound => (404, "not_found", "no such resource".into()),
            Self::IdempotencyConflict(m) => (409, "idempotency_conflict", m.clone()),
            Self::PayloadTooLarge => (
                413,
                "payload_too_large",
                format!("the body exceeds {MAX_BODY_BYTES} bytes"),
            ),
            Self::Unprocessable { code, message } => (422, code, message.clone()),
            Self::RateLimited { retry_after } => (
                429,
                "rate_limited",
                format!("too many requests; retry in {retry_after} s"),
            ),
            Self::Unavailable => (
                503,
                "unavailable",
                "a dependency is unavailable; retry shortly".into(),
            ),
            Self::Internal => (500, "internal", "an internal error occurred".into()),
        }
    }

    pub fn into_response(self) -> Response<Body> {
        let (status, code, message) = self.parts();
        let body = serde_json::to_string(&ErrorBody {
            error: ErrorDetail {
                code,
                message: &message,
            },
        })
        .unwrap_or_else(|_| r#"{"error":{"code":"internal","message":"error"}}"#.to_string());
        let mut builder = Response::builder()
            .status(status)
            .header("content-type", "application/json");
        match self {
            Self::Unavailable => {
                builder = builder.header("retry-after", RETRY_AFTER_SECONDS.to_string());
            }
            Self::RateLimited { retry_after } => {
                builder = builder.header("retry-after", retry_after.to_string());
            }
            _ => {}
        }
        builder
            .body(Body::Text(body))
            .unwrap_or_else(|_| Response::new(Body::Empty))
    }
}

/// Logs `err` with its whole source chain.
pub(crate) fn log_chain(
    level: tracing::Level,
    what: &str,
    err: &(dyn std::error::Error + 'static),
) {
    let chain = crate::telemetry::error_chain(err);
    if level == tracing::Level::ERROR {
        tracing::error!(error = %chain, "{what}");
    } else {
        tracing::warn!(error = %chain, "{what}");
    }
}

#[cfg(feature = "store")]
impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::IdempotencyConflict(message) => Self::IdempotencyConflict(message),
            StoreError::Limited(Limit::Rate { retry_after }) => Self::RateLimited { retry_after },
            StoreError::Limited(Limit::OpenGrants) => Self::Unprocessable {
                code: "grant_limit",
                message: "this user already holds the most unused grants of a template \
                          that onegrant keeps; spend some first"
                    .into(),
            },
            StoreError::Unavailable(_) => {
                log_chain(tracing::Level::WARN, "store unavailable", &err);
                Self::Unavailable
            }
            StoreError::Corrupt(_) | StoreError::Sdk(_) => {
                log_chain(tracing::Level::ERROR, "store failure", &err);
                Self::Internal
            }
        }
    }
}

impl From<WechatError> for ApiError {
    fn from(err: WechatError) -> Self {
        match err {
            WechatError::CodeRejected { .. } => Self::InvalidLoginCode,
            ref e if e.is_unavailable() => {
                log_chain(tracing::Level::WARN, "WeChat unavailable", &err);
                Self::Unavailable
            }
            _ => {
                log_chain(tracing::Level::ERROR, "WeChat call failed", &err);
                Self::Internal
            }
        }
    }
}

impl From<crate::session::SessionError> for ApiError {
    fn from(err: crate::session::SessionError) -> Self {
        log_chain(
            tracing::Level::ERROR,
            "session token could not be issued",
            &err,
        );
        Self::Internal
    }
}

impl From<ReportError> for ApiError {
    fn from(err: ReportError) -> Self {
        let message = err.to_string();
        match err {
            ReportError::Shape(m) => Self::InvalidBody(m),
            ReportError::RequestId(_) => Self::Unprocessable {
                code: "invalid_request_id",
                message,
            },
            ReportError::NoTemplates => Self::Unprocessable {
                code: "no_templates",
                message,
            },
            ReportError::TooManyTemplates(_) => Self::Unprocessable {
                code: "too_many_templates",
                message,
            },
            ReportError::UnknownTemplate(_) => Self::Unprocessable {
                code: "unknown_template",
                message,
            },
            ReportError::InvalidResult { .. } => Self::Unprocessable {
                code: "invalid_result",
                message,
            },
        }
    }
}

fn unprocessable(code: &'static str, message: String) -> ApiError {
    ApiError::Unprocessable { code, message }
}

fn schedule_error(err: &ScheduleError) -> ApiError {
    let code = match err {
        ScheduleError::Interval => "invalid_interval",
        ScheduleError::Time(_) => "invalid_time",
        ScheduleError::EmptyDay => "invalid_waking_hours",
        ScheduleError::Timezone => "invalid_timezone",
    };
    unprocessable(code, err.to_string())
}

impl From<SettingsError> for ApiError {
    fn from(err: SettingsError) -> Self {
        match err {
            SettingsError::Shape(m) => Self::InvalidBody(m),
            SettingsError::Schedule(e) => schedule_error(&e),
            SettingsError::DailyGoal => unprocessable("invalid_daily_goal", err.to_string()),
        }
    }
}

impl From<PreferencesError> for ApiError {
    fn from(err: PreferencesError) -> Self {
        let message = err.to_string();
        match err {
            PreferencesError::Shape(m) => Self::InvalidBody(m),
            PreferencesError::QuietHours(ScheduleError::Timezone) => {
                unprocessable("invalid_timezone", message)
            }
            PreferencesError::QuietHours(_) => unprocessable("invalid_quiet_hours", message),
            PreferencesError::MutedTypes => unprocessable("invalid_muted_types", message),
        }
    }
}

impl From<SettingError> for ApiError {
    fn from(err: SettingError) -> Self {
        let message = err.to_string();
        match err {
            SettingError::Shape(m) => Self::InvalidBody(m),
            SettingError::TooManyItems(_)
            | SettingError::InvalidItem { .. }
            | SettingError::ReadAt => unprocessable("invalid_subscriptions_setting", message),
        }
    }
}

impl From<CheckInError> for ApiError {
    fn from(err: CheckInError) -> Self {
        let message = err.to_string();
        match err {
            CheckInError::Shape(m) => Self::InvalidBody(m),
            CheckInError::ActionId(_) => unprocessable("invalid_action_id", message),
            CheckInError::GrantRequestId(_) => unprocessable("invalid_request_id", message),
            CheckInError::GrantPair => unprocessable("invalid_grant", message),
            CheckInError::Status(_) => unprocessable("invalid_result", message),
            CheckInError::OccurredAt => unprocessable("invalid_occurred_at", message),
            CheckInError::Count => unprocessable("invalid_count", message),
            CheckInError::DailyGoal => unprocessable("invalid_daily_goal", message),
        }
    }
}
