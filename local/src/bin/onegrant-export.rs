//! `onegrant-export <openid>`: a copy of a user's data for a request received another
//! way (PIPL Art. 45), as `GET /v1/me/export` gives a signed-in user — every item
//! onegrant holds for them, one JSON object per line, without the table's plumbing,
//! read a bounded page at a time.
//!
//! Reads the table `TABLE_NAME` with the standard AWS configuration (credentials,
//! region; `AWS_ENDPOINT_URL_DYNAMODB` for the local stack's emulator).

use anyhow::{Context, bail};
use onegrant::domain::OpenId;
use onegrant::store::Store;

const USAGE: &str = "usage: onegrant-export <openid>";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let openid = match args.as_slice() {
        [flag] if flag == "-h" || flag == "--help" => {
            println!("{USAGE}");
            return Ok(());
        }
        [openid] if !openid.starts_with("--") => openid.clone(),
        _ => bail!("{USAGE}"),
    };
    let openid = OpenId::parse(openid).map_err(|e| anyhow::anyhow!("openid: {e}"))?;
    let table = std::env::var("TABLE_NAME").context("TABLE_NAME names the table")?;
    let sdk = onegrant::aws::sdk_config().await;
    let store = Store::new(aws_sdk_dynamodb::Client::new(&sdk), table);
    let mut after: Option<String> = None;
    loop {
        let page = store
            .export_page(&openid, after.as_deref())
            .await
            .context("reading the user's items")?;
        for item in &page.items {
            println!("{item}");
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
    }
}
