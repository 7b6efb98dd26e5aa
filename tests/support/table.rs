//! The suite's DynamoDB emulator and a fresh table per test, created from
//! `template.yaml` and deleted on drop.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use aws_sdk_dynamodb::types::AttributeValue;
use onegrant_local::emulator::Emulator;

use crate::support::invariants::attr_s;

/// The emulator Secrets Manager is served from (and tables of tests that ask for
/// [`emulator_endpoint`]): started once per test binary, gone when it exits.
pub fn emulator_endpoint() -> &'static str {
    static EMULATOR: OnceLock<Emulator> = OnceLock::new();
    EMULATOR
        .get_or_init(|| {
            Emulator::start(true).expect("the DynamoDB emulator starts (run scripts/setup)")
        })
        .endpoint()
}

/// One call to a service of the shared emulator (moto's EventBridge, SQS, WAF) as its
/// JSON API: its answer, asserted 2xx. moto checks no signature; the credential scope
/// in `Authorization` names the service.
pub async fn emulator_call(
    service: &str,
    target: &str,
    version: &str,
    body: serde_json::Value,
) -> serde_json::Value {
    let endpoint = emulator_endpoint();
    let answer = reqwest::Client::new()
        .post(format!("{endpoint}/"))
        .header("content-type", format!("application/x-amz-json-{version}"))
        .header("x-amz-target", target)
        .header(
            "authorization",
            format!("AWS4-HMAC-SHA256 Credential=local/20261207/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=0"),
        )
        .body(body.to_string())
        .send()
        .await
        .expect("the emulator answers");
    assert!(
        answer.status().is_success(),
        "{target}: {}",
        answer.status()
    );
    answer.json().await.unwrap_or(serde_json::Value::Null)
}

/// The suite's emulators for tables: each test running takes one of its own and
/// gives it back when its table is dropped, so no test waits behind another's requests
/// (moto applies one request at a time, on one core) and the suite keeps both cores
/// busy. An emulator is started when every one is taken (about a second), so there are
/// as many as tests run at once; they die with the test binary.
struct Pool {
    idle: Mutex<Vec<Emulator>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        idle: Mutex::new(Vec::new()),
    })
}

/// An emulator a test holds for itself until dropped.
pub struct Leased {
    emulator: Option<Emulator>,
}

impl Leased {
    /// An idle emulator of the pool, or a new one.
    pub async fn take() -> Self {
        let idle = pool()
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        let emulator = match idle {
            Some(emulator) => emulator,
            None => tokio::task::spawn_blocking(|| Emulator::start(true))
                .await
                .expect("the emulator's start ran")
                .expect("the DynamoDB emulator starts (run scripts/setup)"),
        };
        Self {
            emulator: Some(emulator),
        }
    }

    pub fn endpoint(&self) -> &str {
        self.emulator.as_ref().map_or("", Emulator::endpoint)
    }
}

impl Drop for Leased {
    fn drop(&mut self) {
        if let Some(emulator) = self.emulator.take() {
            pool()
                .idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(emulator);
        }
    }
}

/// A fresh table, created from `template.yaml` and deleted when dropped.
pub struct TestTable {
    pub name: String,
    pub client: aws_sdk_dynamodb::Client,
    pub(crate) endpoint: String,
    /// The emulator the table is on, when the table holds it (given back after the
    /// table is deleted: fields drop after `drop`).
    _leased: Option<Leased>,
}

impl TestTable {
    /// A table on an emulator of the pool, the test's own while the table lives.
    pub async fn create() -> Self {
        Self::create_leased(Leased::take().await).await
    }

    /// A table on `leased`, which it holds until dropped.
    pub async fn create_leased(leased: Leased) -> Self {
        let mut table = Self::create_on(leased.endpoint()).await;
        table._leased = Some(leased);
        table
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
            _leased: None,
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
