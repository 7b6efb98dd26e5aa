//! The `session` Lambda: builds its dependencies once, then serves API Gateway events.

use std::convert::Infallible;

use lambda_http::{Error, Request, run, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    onegrant::telemetry::init();
    let deps = onegrant::Deps::from_env().await?;
    let deps = &deps;
    run(service_fn(move |req: Request| async move {
        Ok::<_, Infallible>(session::handle(deps, req).await)
    }))
    .await
}
