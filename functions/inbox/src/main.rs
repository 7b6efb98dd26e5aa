//! The `inbox` Lambda: builds its dependencies once, then serves API Gateway events.

use onegrant::config::Need;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    onegrant::http::run("inbox", inbox::handler, &[Need::SessionKey]).await
}
