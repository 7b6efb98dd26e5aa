//! The `dispatcher` Lambda: an EventBridge schedule invokes it every minute; each
//! invocation runs one tick bounded by the invocation's own deadline.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    onegrant::telemetry::init();
    let deps = onegrant::Deps::from_env().await?;
    let deps = &deps;
    run(service_fn(
        move |event: LambdaEvent<serde_json::Value>| async move {
            let deadline = chrono::DateTime::from_timestamp_millis(
                i64::try_from(event.context.deadline).unwrap_or(0),
            )
            .map(dispatcher::until)
            .unwrap_or_default();
            let summary = dispatcher::tick(deps, tokio::time::Instant::now() + deadline).await?;
            Ok::<_, Error>(serde_json::to_value(summary)?)
        },
    ))
    .await
}
