//! The `grants` Lambda: builds its dependencies once, then serves API Gateway events.

use onegrant::config::Need;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    onegrant::http::run("grants", grants::handler, &[Need::SessionKey]).await
}
