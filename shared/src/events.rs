//! Plumbing for the non-HTTP functions (the scheduled dispatcher, the EventBridge
//! consumer): one handler shape that both the Lambda `main` and the local stack's Invoke
//! API call, with the time the invocation has left.

use std::time::Duration;

use futures::future::BoxFuture;
use lambda_http::lambda_runtime::{self, Error, LambdaEvent, service_fn};
use serde_json::Value;

/// A non-HTTP function's handler: an event in, a JSON answer (or an [`EventError`], which
/// makes the invocation fail and so be retried) out, within `budget`.
pub type Handler =
    for<'a> fn(&'a crate::Deps, Value, Duration) -> BoxFuture<'a, Result<Value, EventError>>;

/// Why an event function's invocation fails (and Lambda, or its caller, retries it).
/// An event that is well formed but refused is an answer, not an error.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The event is not one this function can run (the dispatcher's worker event
    /// naming no usable shards).
    #[error("the event cannot be run: {0}")]
    Event(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The table could not be read or written in the invocation's time.
    #[error("the store is unavailable")]
    Store(#[source] crate::store::StoreError),
    /// The answer could not be encoded as JSON.
    #[error("the answer could not be encoded")]
    Answer(#[source] serde_json::Error),
}

/// A non-HTTP function's whole `main`: tracing, dependencies built once, then events
/// served, each with the time left before the invocation's deadline.
pub async fn run(
    function: &'static str,
    handler: Handler,
    needs: &[crate::config::Need],
) -> Result<(), Error> {
    crate::telemetry::init();
    crate::metrics::init(function);
    let deps = crate::Deps::from_env(needs).await?;
    let deps = &deps;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        let deadline_ms = i64::try_from(event.context.deadline).unwrap_or(0);
        let budget = chrono::DateTime::from_timestamp_millis(deadline_ms)
            .and_then(|deadline| (deadline - crate::Clock::real_now()).to_std().ok())
            .unwrap_or_default();
        // At ERROR level: enabled whenever anything is logged.
        let span = tracing::error_span!(
            "invocation",
            function,
            request_id = event.context.request_id.as_str()
        );
        let answer =
            tracing::Instrument::instrument(handler(deps, event.payload, budget), span).await;
        crate::metrics::flush();
        answer.map_err(Error::from)
    }))
    .await
}
