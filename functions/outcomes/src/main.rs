//! The `outcomes` Lambda: an EventBridge schedule invokes it every minute; each
//! invocation delivers the outcomes that are due, within its own deadline.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    onegrant::events::run("outcomes", outcomes::invoke, &[]).await
}
