//! One step of the session key's rotation (`onegrant::secrets::rotation`): the request
//! read, the step run on the secret this function was given (`SESSION_SECRET_ARN`), and
//! any other secret refused.

use std::time::Duration;

use futures::future::BoxFuture;
use onegrant::Deps;
use onegrant::events::EventError;
use onegrant::secrets::rotation::{RotationRequest, rotate};
use serde_json::Value;

/// The function's handler, as `onegrant::events::run` and the local stack call it.
pub fn invoke(
    deps: &Deps,
    event: Value,
    _budget: Duration,
) -> BoxFuture<'_, Result<Value, EventError>> {
    Box::pin(async move {
        let request = RotationRequest::parse(&event).map_err(|e| EventError::Event(Box::new(e)))?;
        let source = deps.config.session.source.as_ref().ok_or_else(|| {
            EventError::Event("the session key is not given by SESSION_SECRET_ARN".into())
        })?;
        rotate(&source.reader, &source.arn, &request)
            .await
            .map_err(|e| {
                tracing::error!(step = ?request.step, error = %onegrant::telemetry::error_chain(&e), "the session key's rotation step failed");
                EventError::Event(Box::new(e))
            })?;
        Ok(Value::Null)
    })
}
