//! The `notify` Lambda: an EventBridge rule delivers the events.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    onegrant::telemetry::init();
    let deps = onegrant::Deps::from_env().await?;
    let deps = &deps;
    run(service_fn(
        move |event: LambdaEvent<serde_json::Value>| async move {
            notify::handle(deps, event.payload)
                .await
                .map_err(Error::from)
        },
    ))
    .await
}
