//! `onegrant-audit <openid> [--template T] [--since D] [--limit N]`: a user's timeline
//! from the audit trail — every change of their grants, deliveries and plans, oldest
//! first, with its cause (a report's request id, a check-in's action id, the
//! dispatcher, the sweep, a WeChat event), the state it left and the one it reached,
//! WeChat's msgid or errcode.
//!
//! Reads the table `TABLE_NAME` with the standard AWS configuration (credentials,
//! region; `AWS_ENDPOINT_URL_DYNAMODB` for the local stack's emulator). `D` is a date
//! (`2026-12-01`) or an RFC 3339 instant: the entries from then on (bounded in the
//! query's key condition, so nothing earlier is read). Without it, the newest. Either
//! way at most `N` entries (default 200) are read, whatever the user's history; a
//! state left before the window shows as `…`.

use anyhow::{Context, bail};
use onegrant::domain::OpenId;
use onegrant::domain::audit::{HistoryWindow, timeline};
use onegrant::store::Store;

const USAGE: &str = "usage: onegrant-audit <openid> [--template T] [--since D] [--limit N]";

/// Entries read when `--limit` is not given.
const DEFAULT_LIMIT: usize = 200;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut openid = None;
    let mut template = None;
    let mut since = None;
    let mut limit = DEFAULT_LIMIT;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--template" => template = Some(args.next().context(USAGE)?),
            "--since" => since = Some(args.next().context(USAGE)?),
            "--limit" => {
                limit = args
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| (1..=10_000).contains(n))
                    .context("--limit: a whole number from 1 to 10000")?;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ if openid.is_none() && !arg.starts_with("--") => openid = Some(arg),
            _ => bail!("{USAGE}"),
        }
    }
    let openid =
        OpenId::parse(openid.context(USAGE)?).map_err(|e| anyhow::anyhow!("openid: {e}"))?;
    // A date means its start (UTC).
    let since = match since {
        None => None,
        Some(d) => Some(match chrono::NaiveDate::parse_from_str(&d, "%Y-%m-%d") {
            Ok(day) => day.and_hms_opt(0, 0, 0).context("midnight")?.and_utc(),
            Err(_) => chrono::DateTime::parse_from_rfc3339(&d)
                .with_context(|| format!("--since {d}: a date or an RFC 3339 instant"))?
                .with_timezone(&chrono::Utc),
        }),
    };
    let table = std::env::var("TABLE_NAME").context("TABLE_NAME names the table")?;
    let sdk = onegrant::aws::sdk_config().await;
    let store = Store::new(aws_sdk_dynamodb::Client::new(&sdk), table);
    let read = store
        .history(&openid, HistoryWindow { since, limit })
        .await
        .context("reading the history")?;
    let lines = timeline(&read.entries, template.as_deref(), read.from_start);
    if lines.is_empty() {
        println!(
            "no history for this user{}",
            if template.is_some() || since.is_some() {
                " (with these filters)"
            } else {
                ""
            }
        );
    }
    for line in lines {
        println!("{line}");
    }
    if read.more {
        println!(
            "(more entries {} the {limit} read: raise --limit{})",
            if since.is_some() { "after" } else { "before" },
            if since.is_some() {
                ""
            } else {
                " or give --since"
            }
        );
    }
    Ok(())
}
