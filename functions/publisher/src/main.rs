//! The `publisher` Lambda: builds its dependencies once, then serves API Gateway events.

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    onegrant::http::run("publisher", publisher::handler, &[]).await
}
