//! The suite's DynamoDB emulator and a fresh table per test, created from
//! `template.yaml` and deleted on drop.

use std::collections::HashMap;
use std::sync::OnceLock;

use aws_sdk_dynamodb::types::AttributeValue;
use onegrant_local::emulator::Emulator;

use crate::support::invariants::attr_s;

/// The suite's emulator: started once per test binary, gone when the binary exits.
pub fn emulator_endpoint() -> &'static str {
    static EMULATOR: OnceLock<Emulator> = OnceLock::new();
    EMULATOR
        .get_or_init(|| {
            Emulator::start(true).expect("the DynamoDB emulator starts (run scripts/setup)")
        })
        .endpoint()
}

/// A DynamoDB client on the suite's emulator (one per test: clients hold connections
/// bound to the test's runtime).
pub fn dynamodb() -> aws_sdk_dynamodb::Client {
    onegrant::aws::local_dynamodb_client(emulator_endpoint())
}

/// A fresh table, created from `template.yaml` and deleted when dropped.
pub struct TestTable {
    pub name: String,
    pub client: aws_sdk_dynamodb::Client,
    pub(crate) endpoint: String,
}

impl TestTable {
    /// A table on the suite's shared emulator.
    pub async fn create() -> Self {
        Self::create_on(emulator_endpoint()).await
    }

    /// A table on the emulator at `endpoint`.
    pub async fn create_on(endpoint: &str) -> Self {
        let name = format!("test-{}", uuid::Uuid::new_v4().simple());
        let client = onegrant::aws::local_dynamodb_client(endpoint);
        onegrant_local::template::create_table(&client, &name)
            .await
            .expect("the test table is created from template.yaml");
        Self {
            name,
            client,
            endpoint: endpoint.to_string(),
        }
    }

    /// Every item in the table, in (pk, sk) order so snapshots compare directly (tables
    /// here are small and short-lived).
    pub async fn items(&self) -> Vec<HashMap<String, AttributeValue>> {
        let mut items = Vec::new();
        let mut pages = self
            .client
            .scan()
            .table_name(&self.name)
            .into_paginator()
            .items()
            .send();
        while let Some(item) = pages.next().await {
            items.push(item.expect("scan succeeds"));
        }
        items.sort_by_cached_key(|i| {
            (
                attr_s(i, "pk").unwrap_or_default().to_string(),
                attr_s(i, "sk").unwrap_or_default().to_string(),
            )
        });
        items
    }
}

impl TestTable {
    /// The emulator this table lives on.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl Drop for TestTable {
    fn drop(&mut self) {
        let name = self.name.clone();
        let endpoint = self.endpoint.clone();
        // Drop cannot await; a short-lived runtime on its own thread deletes the table.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let client = onegrant::aws::local_dynamodb_client(&endpoint);
                let _ = client.delete_table().table_name(name).send().await;
            });
        })
        .join();
    }
}
