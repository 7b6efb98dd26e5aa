//! `wechat-standin`: the WeChat stand-in on its own, for pointing any client at it.
//! `STANDIN_PORT` (3002), `WECHAT_APPID`, `WECHAT_SECRET` and `ONEGRANT_TEMPLATES`
//! default to the local stack's values.

use std::collections::HashMap;

use anyhow::Context;
use onegrant_local::{stack, standin};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    onegrant::telemetry::init();
    let port: u16 = std::env::var("STANDIN_PORT")
        .unwrap_or_else(|_| "3002".into())
        .parse()
        .context("STANDIN_PORT must be a port number")?;
    let config = stack::local_config(&HashMap::new())?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "WeChat stand-in on http://127.0.0.1:{port} (appid {})",
        config.wechat.appid
    );
    standin::spawn(stack::standin_config(&config), listener)
        .await
        .context("stand-in task")?;
    Ok(())
}
