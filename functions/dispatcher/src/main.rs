//! The `dispatcher` Lambda: an EventBridge schedule invokes it every minute; each
//! invocation runs one tick bounded by the invocation's own deadline.

use onegrant::config::Need;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    onegrant::events::run("dispatcher", dispatcher::invoke, &[Need::AppSecret]).await
}
