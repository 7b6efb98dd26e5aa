//! Events put on the stack's EventBridge bus (`PutEvents`), signed with SigV4 by the
//! credentials and region of the store's own DynamoDB client: the outcomes function
//! tells each outcome there (`detail-type: onegrant.push.outcome`, source `onegrant`).
//! No EventBridge SDK: one signed POST per batch of at most ten.

use aws_credential_types::provider::SharedCredentialsProvider;
use serde_json::{Value, json};

use crate::signed::{Endpoint, JsonCallError};

/// The most entries one `PutEvents` call takes.
pub const MAX_BATCH: usize = 10;

/// Why a batch could not be handed to EventBridge at all.
pub type BusError = JsonCallError;

/// The stack's bus.
#[derive(Clone, Debug)]
pub struct Bus {
    events: Endpoint,
    name: String,
}

impl Bus {
    /// The bus `name` in `region`, at `endpoint` (an emulator) or EventBridge's
    /// regional endpoint.
    pub fn new(
        region: &str,
        credentials: SharedCredentialsProvider,
        name: &str,
        endpoint: Option<&str>,
    ) -> Option<Self> {
        Some(Self {
            events: Endpoint::new("events", region, credentials, endpoint)?,
            name: name.to_string(),
        })
    }

    /// Puts one event per detail (at most [`MAX_BATCH`]) with `source` and
    /// `detail_type`; for each, in order, whether EventBridge took it.
    pub async fn put(
        &self,
        source: &str,
        detail_type: &str,
        details: &[Value],
    ) -> Result<Vec<bool>, BusError> {
        let entries: Vec<Value> = details
            .iter()
            .map(|detail| {
                json!({"Source": source, "DetailType": detail_type,
                       "Detail": detail.to_string(), "EventBusName": self.name})
            })
            .collect();
        let answer = self
            .events
            .call_json("AWSEvents.PutEvents", &json!({ "Entries": entries }))
            .await?;
        // Each entry answers an EventId, or an ErrorCode when it was not taken.
        let taken = answer["Entries"]
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| e.get("ErrorCode").is_none_or(Value::is_null))
                    .collect::<Vec<bool>>()
            })
            .unwrap_or_default();
        Ok((0..details.len())
            .map(|i| taken.get(i).copied().unwrap_or(false))
            .collect())
    }
}
