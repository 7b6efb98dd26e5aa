//! `dispatch-once`: runs one dispatcher tick against the configured table and WeChat
//! (environment as for the Lambda) and prints its summary. For operators and for the
//! crash tests, which kill this process at chosen points.
//! `DISPATCH_ONCE_SECONDS` bounds the tick (default 55). Unlike the Lambda, it finds
//! credentials as the AWS CLI does (a profile, SSO, an assumed role: `aws::sdk_config`).

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    onegrant::telemetry::init();
    // As the Lambda: the tick's metrics as EMF lines on stdout, before the summary.
    onegrant::metrics::init("dispatcher");
    let seconds: u64 = std::env::var("DISPATCH_ONCE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(55);
    let sdk = onegrant::aws::sdk_config().await;
    let deps = onegrant::Deps::from_env_on(&[onegrant::config::Need::AppSecret], sdk).await?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(seconds);
    let summary = dispatcher::tick(&deps, deadline).await?;
    onegrant::metrics::flush();
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}
