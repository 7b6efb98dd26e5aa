//! `onegrant-local`: the whole stack on one machine.
//!
//! Starts the DynamoDB emulator (unless `AWS_ENDPOINT_URL_DYNAMODB` is set) and creates
//! the table from `template.yaml`; starts the WeChat stand-in (unless `WECHAT_API_BASE`,
//! `WECHAT_APPID` and `WECHAT_SECRET` name a real WeChat); serves the HTTP API on
//! `ONEGRANT_API_PORT` (3000) and the Lambda Invoke API on `ONEGRANT_INVOKE_PORT`
//! (3001). Ctrl-C or SIGTERM stops everything it started.

use std::collections::HashMap;

use anyhow::Context;
use onegrant_local::{api, emulator::Emulator, stack, standin};
use tokio::net::TcpListener;

fn env_u16(name: &str, default: u16) -> anyhow::Result<u16> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name} must be a whole number up to 65535")),
        Err(_) => Ok(default),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    onegrant::telemetry::init();
    // Every listener is bound first, so a port of 0 takes a free one (printed below):
    // stacks started side by side (tests, the fuzzer) never race for a port.
    let real_wechat = ["WECHAT_API_BASE", "WECHAT_APPID", "WECHAT_SECRET"]
        .iter()
        .all(|v| std::env::var_os(v).is_some());
    let bind = |name: &'static str, port: u16| async move {
        TcpListener::bind(("127.0.0.1", port))
            .await
            .with_context(|| format!("binding the {name} to 127.0.0.1:{port}"))
    };
    let api_listener = bind("API", env_u16("ONEGRANT_API_PORT", 3000)?).await?;
    let invoke_listener = bind("Invoke API", env_u16("ONEGRANT_INVOKE_PORT", 3001)?).await?;
    let standin_listener = match real_wechat {
        true => None,
        false => Some(bind("stand-in", env_u16("ONEGRANT_STANDIN_PORT", 3002)?).await?),
    };
    let api_port = api_listener.local_addr()?.port();
    let invoke_port = invoke_listener.local_addr()?.port();

    let (emulator, endpoint) = match std::env::var("AWS_ENDPOINT_URL_DYNAMODB") {
        Ok(endpoint) => (None, endpoint),
        Err(_) => {
            let emulator = Emulator::start(false)?;
            let endpoint = emulator.endpoint().to_string();
            (Some(emulator), endpoint)
        }
    };

    let mut overrides = HashMap::new();
    let mut standin_task = None;
    let wechat_base = if let Some(listener) = standin_listener {
        let base = format!("http://127.0.0.1:{}", listener.local_addr()?.port());
        overrides.insert("WECHAT_API_BASE", base.clone());
        overrides.insert("WECHAT_APPID", stack::LOCAL_APPID.to_string());
        overrides.insert("WECHAT_SECRET", stack::LOCAL_SECRET.to_string());
        // The stand-in pushes its events to this stack's callback, in safe mode, as
        // WeChat's message push would (unless a push token is set for another one).
        if std::env::var_os("WECHAT_PUSH_TOKEN").is_none() {
            for (name, value) in stack::LOCAL_PUSH {
                overrides.insert(name, value.to_string());
            }
        }
        let config = stack::local_config(&overrides)?;
        let mut standin = stack::standin_config(&config);
        standin.push = stack::standin_push(&config, &format!("http://127.0.0.1:{api_port}"));
        standin_task = Some(standin::spawn(standin, listener));
        base
    } else {
        std::env::var("WECHAT_API_BASE").unwrap_or_default()
    };
    // With DISPATCH_WORKERS above 1 the tick fans out to workers through this stack's
    // own Invoke API, as the deployed one does through Lambda's.
    overrides.insert("DISPATCH_FUNCTION_NAME", "dispatcher".to_string());
    overrides.insert(
        "AWS_ENDPOINT_URL_LAMBDA",
        format!("http://127.0.0.1:{invoke_port}"),
    );
    let config = stack::local_config(&overrides)?;
    let table = config.table_name.clone();
    let dynamodb = onegrant::aws::local_dynamodb_client(&endpoint);
    stack::ensure_table(&dynamodb, &table).await?;
    let deps_push = config.push.is_some();
    let deps = stack::deps(config, dynamodb)?;

    let tick_seconds = env_u16("ONEGRANT_LOCAL_TICK_SECONDS", 60)?;
    let ticker = {
        let deps = deps.clone();
        async move {
            if tick_seconds == 0 {
                return std::future::pending::<()>().await;
            }
            // Like the EventBridge schedule: one dispatcher tick per period, each bounded
            // by the period so ticks do not overlap.
            let period = std::time::Duration::from_secs(u64::from(tick_seconds));
            let mut interval = tokio::time::interval(period);
            loop {
                interval.tick().await;
                let deadline = tokio::time::Instant::now() + period;
                if let Err(e) = dispatcher::tick(&deps, deadline).await {
                    tracing::error!(error = %e, "local dispatcher tick failed");
                }
                // Then the outcomes' own tick (deployed, a schedule of its own).
                let deadline = tokio::time::Instant::now() + period;
                if let Err(e) = outcomes::tick(&deps, deadline).await {
                    tracing::error!(error = %e, "local outcomes tick failed");
                }
            }
        }
    };
    let publishers: Vec<String> = deps
        .config
        .publishers
        .iter()
        .map(|p| p.source.clone())
        .collect();
    let api = axum::serve(
        api_listener,
        api::api_router(deps.clone())?
            .into_make_service_with_connect_info::<std::net::SocketAddr>(),
    );
    let invoke = axum::serve(invoke_listener, api::invoke_router(deps)?.0);

    println!("onegrant local stack");
    println!("  HTTP API        http://127.0.0.1:{api_port}");
    for route in onegrant_local::template::routes()? {
        println!(
            "                    {:<6} {:<28} -> {}",
            route.method, route.path, route.function
        );
    }
    println!(
        "  Contract        http://127.0.0.1:{api_port}{}  (this configuration's templates, kinds and zones)",
        onegrant_local::contract::PATH
    );
    println!(
        "  Invoke API      http://127.0.0.1:{invoke_port}/2015-03-31/functions/<name>/invocations"
    );
    let (source, key) = onegrant_local::stack::LOCAL_PUBLISHER;
    if std::env::var("ONEGRANT_PUBLISHERS").is_ok() {
        println!(
            "  Publishers      {} (keys from ONEGRANT_PUBLISHERS)",
            publishers.join(", ")
        );
    } else {
        println!(
            "  Publisher       {source}, key {key} (development only; ONEGRANT_PUBLISHERS replaces it)"
        );
    }
    match &emulator {
        Some(emulator) => println!(
            "  DynamoDB        {endpoint}  (table {table}, emulator pid {})",
            emulator.pid()
        ),
        None => println!("  DynamoDB        {endpoint}  (table {table})"),
    }
    if standin_task.is_some() {
        println!("  WeChat stand-in {wechat_base}  (control API under /control)");
        if deps_push {
            println!(
                "                  pushes its events to http://127.0.0.1:{api_port}/wechat/callback (safe mode)"
            );
        }
    } else {
        println!("  WeChat          {wechat_base}  (real)");
    }
    if tick_seconds == 0 {
        println!(
            "  Dispatcher      off (ONEGRANT_LOCAL_TICK_SECONDS=0); invoke it through the Invoke API"
        );
    } else {
        println!(
            "  Dispatcher      a tick every {tick_seconds} s (ONEGRANT_LOCAL_TICK_SECONDS), then the outcomes' tick"
        );
    }
    println!("Ctrl-C stops everything.");

    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    tokio::select! {
        r = api => r.context("HTTP API server")?,
        r = invoke => r.context("Invoke API server")?,
        () = ticker => {}
        () = shutdown => println!("stopping"),
    }
    if let Some(task) = standin_task {
        task.abort();
    }
    // Dropping the emulator kills it.
    Ok(())
}
