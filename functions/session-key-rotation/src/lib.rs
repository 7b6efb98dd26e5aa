//! One step of the session key's rotation (`onegrant::secrets::rotation`): the request
//! read, the step run on the secret this function was given (`SESSION_SECRET_ARN`), and
//! any other secret refused. It needs nothing of the stack's configuration but that
//! ARN, so a key ring that would fail the other functions' cold starts (a key too
//! short) does not stop the rotation that replaces it.

use std::time::Duration;

use futures::future::BoxFuture;
use onegrant::Deps;
use onegrant::events::EventError;
use onegrant::secrets::SecretsReader;
use onegrant::secrets::rotation::{RotationError, RotationRequest, rotate};
use serde_json::Value;

/// Runs the step `event` asks for on `arn` (the session key's secret).
pub async fn handle(
    reader: &SecretsReader,
    arn: &str,
    event: &Value,
) -> Result<Value, RotationError> {
    let request = RotationRequest::parse(event)?;
    rotate(reader, arn, &request).await.inspect_err(|e| {
        tracing::error!(step = ?request.step, error = %onegrant::telemetry::error_chain(e), "the session key's rotation step failed");
    })?;
    Ok(Value::Null)
}

/// The handler as the local stack calls its event functions (with the stack's
/// dependencies: the session key's source, when given by ARN).
pub fn invoke(
    deps: &Deps,
    event: Value,
    _budget: Duration,
) -> BoxFuture<'_, Result<Value, EventError>> {
    Box::pin(async move {
        let source = deps.config.session.source.as_ref().ok_or_else(|| {
            EventError::Event("the session key is not given by SESSION_SECRET_ARN".into())
        })?;
        handle(&source.reader, &source.arn, &event)
            .await
            .map_err(|e| EventError::Event(Box::new(e)))
    })
}
