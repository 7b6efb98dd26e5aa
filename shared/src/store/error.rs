//! What a store operation can fail with, and the one place an SDK failure is sorted
//! into "try later" or "our fault" (`?` maps every read's and single write's failure
//! through [`From`]; the transaction engine sorts its own with its conflicts counted).

use aws_sdk_dynamodb::error::SdkError;

/// What a store operation can fail with, in the terms callers act on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An idempotency key was reused with a different payload (invariant I3).
    #[error("idempotency key reused with a different payload: {0}")]
    IdempotencyConflict(String),
    /// DynamoDB is throttling, contended past our retries, or unreachable: try later.
    #[error("DynamoDB is unavailable or contended")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A guard against a runaway client refused the write; nothing was stored.
    #[error("refused by a limit: {0:?}")]
    Limited(Limit),
    /// A stored item does not have the shape this code writes.
    #[error("stored item is unreadable: {0}")]
    Corrupt(String),
    /// Anything else the SDK reported (a bug or misconfiguration on our side).
    #[error("DynamoDB request failed")]
    Sdk(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl From<crate::domain::reminders::plan::IllegalTransition> for StoreError {
    /// A stored plan that cannot take a step its own state should allow.
    fn from(e: crate::domain::reminders::plan::IllegalTransition) -> Self {
        Self::Corrupt(e.to_string())
    }
}

/// Which guard refused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The user already holds [`Limits::max_open_grants`](crate::config::Limits::max_open_grants) available grants of the
    /// template.
    OpenGrants,
    /// The user made [`Limits::reports_per_minute`](crate::config::Limits::reports_per_minute) reports this minute; the next
    /// minute starts in `retry_after` seconds.
    Rate { retry_after: u64 },
}

/// Sorts an SDK failure into "try later" or "our fault". `service_unavailable` says
/// whether the operation's own error is a throttle or conflict.
pub(crate) fn classify_sdk_error<E>(
    err: SdkError<E, aws_smithy_runtime_api::http::Response>,
    service_unavailable: impl Fn(&E) -> bool,
) -> StoreError
where
    E: std::error::Error + aws_sdk_dynamodb::error::ProvideErrorMetadata + Send + Sync + 'static,
{
    match err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            StoreError::Unavailable(Box::new(err))
        }
        SdkError::ServiceError(ref service)
            if service_unavailable(service.err())
                || transient(service.err().code(), service.raw().status().as_u16()) =>
        {
            StoreError::Unavailable(Box::new(err))
        }
        other => StoreError::Sdk(Box::new(other)),
    }
}

/// Any other operation's failure, sorted by `classify_sdk_error` with no error of its
/// own counted as "not now": so `?` maps a read's or a single write's failure.
impl<E> From<SdkError<E, aws_smithy_runtime_api::http::Response>> for StoreError
where
    E: std::error::Error + aws_sdk_dynamodb::error::ProvideErrorMetadata + Send + Sync + 'static,
{
    fn from(err: SdkError<E, aws_smithy_runtime_api::http::Response>) -> Self {
        classify_sdk_error(err, |_| false)
    }
}

/// A request the SDK would not build (a required field left out): our fault.
impl From<aws_sdk_dynamodb::error::BuildError> for StoreError {
    fn from(err: aws_sdk_dynamodb::error::BuildError) -> Self {
        StoreError::Sdk(Box::new(err))
    }
}

/// Whether DynamoDB's answer means "not now" for any operation, reads included: a
/// throttle, a conflict, a request still in progress, or a server error (500, and the
/// 503s its front end may answer unmodelled) that outlasted the SDK's retries. The
/// caller answers 503 with `Retry-After` (API.md), never 500.
fn transient(code: Option<&str>, status: u16) -> bool {
    (500..600).contains(&status)
        || matches!(
            code,
            Some(
                "ThrottlingException"
                    | "Throttling"
                    | "ProvisionedThroughputExceededException"
                    | "RequestLimitExceeded"
                    | "LimitExceededException"
                    | "TooManyRequestsException"
                    | "InternalServerError"
                    | "ServiceUnavailable"
                    | "TransactionInProgressException"
                    | "TransactionConflictException"
            )
        )
}

pub(crate) fn corrupt(what: &str, err: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {err}"))
}
