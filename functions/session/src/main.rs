//! The `session` Lambda: builds its dependencies once (no store: it never touches the
//! table), then serves API Gateway events.

use onegrant::config::Need;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    onegrant::http::run_core(
        "session",
        session::handler,
        &[Need::SessionKey, Need::AppSecret],
    )
    .await
}
