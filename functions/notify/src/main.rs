//! The `notify` Lambda: an EventBridge rule delivers the events.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    onegrant::events::run("notify", notify::invoke, &[]).await
}
