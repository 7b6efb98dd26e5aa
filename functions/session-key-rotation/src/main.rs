//! The `session-key-rotation` Lambda: Secrets Manager invokes it for each step of the
//! session key's scheduled rotation. Its cold start reads only `SESSION_SECRET_ARN`
//! and the function's credentials.

use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    onegrant::telemetry::init();
    let env = |name: &str| std::env::var(name).ok();
    let arn = env("SESSION_SECRET_ARN")
        .filter(|a| !a.is_empty())
        .ok_or("SESSION_SECRET_ARN is required")?;
    let reader = onegrant::secrets::SecretsReader::from_lookup(&env)?;
    let (reader, arn) = (&reader, arn.as_str());
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        session_key_rotation::handle(reader, arn, &event.payload)
            .await
            .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { Box::new(e) })
    }))
    .await
}
