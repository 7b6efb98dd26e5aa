//! WeChat's push addresses as last read from WeChat (`WECHAT#IPS` / `LIST`): written
//! by the `wechat-ips` function, read by the callback (WeChat's door, where there is no
//! edge to keep it). One item for the stack, outside every user's partition.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::wechat_ips::WechatIps;
use crate::store::error::{StoreError, corrupt};
use crate::store::handle::{Store, StoredWechatIps};
use crate::store::items::change::put;
use crate::store::items::{parse, to_item};

/// How long a container keeps the list it read before reading it again: a refused
/// flood costs no read per request, and a refreshed list is in use within this.
pub const WECHAT_IPS_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(300);

const PK: &str = "WECHAT#IPS";
const SK: &str = "LIST";

/// The list as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct WechatIpsItem {
    pk: String,
    sk: String,
    kind: String,
    /// Each network, `address/prefix`.
    ips: Vec<String>,
    /// When it was read from WeChat (epoch ms).
    fetched_at: i64,
}

impl Store {
    /// Keeps `ips`, read from WeChat at `fetched_at`, as the list in use.
    pub async fn put_wechat_ips(
        &self,
        ips: &WechatIps,
        fetched_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let item = to_item(
            "wechat ips",
            &WechatIpsItem {
                pk: PK.into(),
                sk: SK.into(),
                kind: "wechat_ips".into(),
                ips: ips.entries(),
                fetched_at: fetched_at.timestamp_millis(),
            },
        )?;
        put(&self.table, item).apply(&self.client).await?;
        Ok(())
    }

    /// The list in use, if one was ever read. A stored list that no longer parses is
    /// corrupt (an error), never an open door.
    pub async fn wechat_ips(&self) -> Result<Option<StoredWechatIps>, StoreError> {
        let Some(item) = self.get(PK, SK).await? else {
            return Ok(None);
        };
        let item: WechatIpsItem = parse("wechat ips", item)?;
        let ips = WechatIps::parse(&item.ips).map_err(|e| corrupt("wechat ips", e))?;
        let fetched_at = DateTime::from_timestamp_millis(item.fetched_at)
            .ok_or_else(|| corrupt("wechat ips", "fetched_at"))?;
        Ok(Some(StoredWechatIps { ips, fetched_at }))
    }

    /// [`Self::wechat_ips`], read at most once per [`WECHAT_IPS_KEPT_FOR`] by this
    /// container (one read at a time; a failed read is not kept).
    pub async fn wechat_ips_kept(&self) -> Result<Option<StoredWechatIps>, StoreError> {
        let mut seen = self.wechat_ips_seen.lock().await;
        let now = self.clock.now();
        let kept_for = chrono::Duration::from_std(WECHAT_IPS_KEPT_FOR).unwrap_or_default();
        if let Some((list, read_at)) = seen.as_ref()
            && now < *read_at + kept_for
            && now >= *read_at
        {
            return Ok(list.clone());
        }
        let list = self.wechat_ips().await?;
        *seen = Some((list.clone(), now));
        Ok(list)
    }
}
