//! `onegrant-erase <openid> [--once | --status]`: forgets a user for a request received another
//! way (PIPL Art. 50: a letter, a support ticket), as `DELETE /v1/me` does for a
//! signed-in user — the same erasure (`domain::erasure`), caused `operator`. It begins
//! the erasure (or reports the one begun), then takes its bounded steps until it is
//! done, each step's progress printed; stopped at any point, the dispatcher's ticks
//! finish it. `--once` begins it and takes one step (the dispatcher does the rest);
//! `--status` only reports.
//!
//! Its due entries go under the shard count the deployed dispatcher registered
//! (`DUE_SHARDS`), read from the table.
//!
//! Reads and writes the table `TABLE_NAME` with the standard AWS configuration
//! (credentials, region; `AWS_ENDPOINT_URL_DYNAMODB` for the local stack's emulator),
//! tagging the openid with `OPENID_SALT` — the deployment's own (the stack's
//! `OpenidSalt`, or its id when that is empty), or the tombstone is not found.

use anyhow::{Context, bail};
use onegrant::domain::OpenId;
use onegrant::domain::erasure::{ErasureCause, ErasureState};
use onegrant::store::Store;

const USAGE: &str = "usage: onegrant-erase <openid> [--once | --status]";

/// The most steps one run takes (a user with 100,000 items needs about 200).
const MAX_STEPS: usize = 1_000;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut openid = None;
    let mut status_only = false;
    let mut steps = MAX_STEPS;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--status" => status_only = true,
            "--once" => steps = 1,
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
    let table = std::env::var("TABLE_NAME").context("TABLE_NAME names the table")?;
    // The deployment's own salt, or the tombstone is written under a tag nothing else
    // finds: required but against the local stack's emulator.
    let local = std::env::var("AWS_ENDPOINT_URL_DYNAMODB").is_ok();
    let salt = match std::env::var("OPENID_SALT") {
        Ok(salt) if salt.trim().len() >= 16 => salt,
        Ok(_) => bail!("OPENID_SALT: at least 16 characters, the stack's own"),
        Err(_) if local => onegrant::config::DEFAULT_OPENID_SALT.to_string(),
        Err(_) => bail!(
            "OPENID_SALT: the stack's OpenidSalt (or, when that is empty, the stack id's last part)"
        ),
    };
    let sdk = onegrant::aws::sdk_config().await;
    let store = Store::new(aws_sdk_dynamodb::Client::new(&sdk), table).with_openid_salt(salt);
    // The tombstone's due entry on a partition the deployed dispatcher reads: under
    // the count it registered (the default count's may have been drained).
    let store = match store
        .deployed_shards()
        .await
        .context("reading the shard registry")?
    {
        Some(shards) => store.with_shards(shards),
        None => store,
    };
    if status_only {
        match store
            .tombstone(&openid)
            .await
            .context("reading the tombstone")?
        {
            None => println!("no erasure of this user"),
            Some(t) => println!(
                "erasure {} (begun {}{})",
                t.state.as_str(),
                t.erased_at.to_rfc3339(),
                if t.reopened {
                    "; the user came back since"
                } else {
                    ""
                }
            ),
        }
        return Ok(());
    }
    let now = || onegrant::Clock::real_now();
    let mut erasure = store
        .start_erasure(&openid, ErasureCause::Operator, now())
        .await
        .context("beginning the erasure")?;
    println!("erasure {}", erasure.state.as_str());
    for step in 0..steps {
        if erasure.state == ErasureState::Done {
            break;
        }
        if step > 0 {
            // Done only once no request from before it began can still write (30 s),
            // or once a send in flight has settled.
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        }
        erasure = store
            .erase_step(&openid, now())
            .await
            .context("an erasure step")?;
        println!(
            "erasure {}: {} items deleted",
            erasure.state.as_str(),
            erasure.deleted
        );
    }
    Ok(())
}
