//! `onegrant-audit <openid> [--template T] [--since D]`: a user's timeline from the audit
//! trail — every change of their grants, deliveries and plans, oldest first, with its
//! cause (a report's request id, a check-in's action id, the dispatcher, the sweep, a
//! WeChat event), the state it left and the one it reached, WeChat's msgid or errcode.
//!
//! Reads the table `TABLE_NAME` with the standard AWS configuration (credentials,
//! region; `AWS_ENDPOINT_URL_DYNAMODB` for the local stack's emulator). `D` is a date
//! (`2026-12-01`) or an RFC 3339 instant.

use anyhow::{Context, bail};
use onegrant::domain::OpenId;
use onegrant::store::Store;
use onegrant::store::audit::timeline;

const USAGE: &str = "usage: onegrant-audit <openid> [--template T] [--since D]";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut openid = None;
    let mut template = None;
    let mut since = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--template" => template = Some(args.next().context(USAGE)?),
            "--since" => since = Some(args.next().context(USAGE)?),
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
    // A date means its start (UTC); an instant is normalised to the entries' own form
    // (RFC 3339, milliseconds, `Z`), so the comparison is of like with like.
    let since = match since {
        None => None,
        Some(d) => Some(
            match chrono::NaiveDate::parse_from_str(&d, "%Y-%m-%d") {
                Ok(day) => day.and_hms_opt(0, 0, 0).context("midnight")?.and_utc(),
                Err(_) => chrono::DateTime::parse_from_rfc3339(&d)
                    .with_context(|| format!("--since {d}: a date or an RFC 3339 instant"))?
                    .with_timezone(&chrono::Utc),
            }
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        ),
    };
    let table = std::env::var("TABLE_NAME").context("TABLE_NAME names the table")?;
    let sdk = onegrant::aws::sdk_config().await;
    let store = Store::new(aws_sdk_dynamodb::Client::new(&sdk), table);
    let entries = store
        .history(&openid)
        .await
        .context("reading the history")?;
    let lines = timeline(&entries, template.as_deref(), since.as_deref());
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
    Ok(())
}
