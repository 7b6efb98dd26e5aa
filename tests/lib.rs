//! # onegrant-tests
//!
//! Shared helpers for the integration suite (`suite/`) and the benches: every test gets
//! fresh resources from [`spawn_app`] — its own table in the real emulator (created from
//! `template.yaml`, deleted on drop), its own WeChat stand-in and its own HTTP API, both
//! on port 0 and reached over real HTTP.

pub mod faults;
pub mod openapi;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use aws_sdk_dynamodb::types::AttributeValue;
use onegrant::Deps;
use onegrant_local::emulator::Emulator;
use onegrant_local::{api, stack, standin};
use serde_json::{Value, json};
use tokio::net::TcpListener;

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

/// Counts the DynamoDB requests a client sends (every attempt, retries included), by
/// operation name, so tests can pin the round trips an operation costs, and the items
/// those requests read (what DynamoDB bills reads by: a query's or scan's scanned items,
/// a get's item, a batch get's items). Queries of an index are named `Query@index`.
#[derive(Debug, Clone, Default)]
pub struct RoundTrips {
    ops: Arc<Mutex<Vec<String>>>,
    items_read: Arc<std::sync::atomic::AtomicU64>,
    /// Estimated read request units, in halves (see [`read_units`]).
    read_half_units: Arc<std::sync::atomic::AtomicU64>,
    writes: Arc<Mutex<Vec<ItemWrite>>>,
    requests: Arc<std::sync::atomic::AtomicU64>,
    actions: Arc<Mutex<std::collections::BTreeSet<String>>>,
    /// Calls made and not yet ended, and the most there were at once.
    in_flight: Arc<std::sync::atomic::AtomicU64>,
    most_in_flight: Arc<std::sync::atomic::AtomicU64>,
}

/// The IAM actions (`dynamodb:` left off) a request needs: its operation, or for a
/// transaction each item's (a Put needs PutItem, a ConditionCheck ConditionCheckItem).
fn iam_actions(target: &str, body: &[u8]) -> Vec<String> {
    let operation = target.trim_end_matches("@index");
    let inner = |key: &str| match key {
        "Put" => Some("PutItem"),
        "Update" => Some("UpdateItem"),
        "Delete" => Some("DeleteItem"),
        "ConditionCheck" => Some("ConditionCheckItem"),
        "Get" => Some("GetItem"),
        _ => None,
    };
    if operation != "TransactWriteItems" && operation != "TransactGetItems" {
        return vec![operation.to_string()];
    }
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    request["TransactItems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .flat_map(|item| item.keys().filter_map(|k| inner(k)).map(str::to_string))
        .collect()
}

/// One item a write request named: its key, and whether a transaction carried it
/// (DynamoDB bills transactional writes, condition checks included, twice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemWrite {
    /// Which request (numbered in sending order) named it, and that request's operation.
    pub request: u64,
    pub operation: String,
    pub pk: String,
    pub sk: String,
    pub transactional: bool,
}

/// The items a write request names (DynamoDB's wire JSON).
fn items_written(target: &str, body: &[u8]) -> Vec<ItemWrite> {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let named = |key: &Value, transactional: bool| {
        Some(ItemWrite {
            request: 0,
            operation: target.to_string(),
            pk: key["pk"]["S"].as_str()?.to_string(),
            sk: key["sk"]["S"].as_str()?.to_string(),
            transactional,
        })
    };
    match target {
        "PutItem" => named(&request["Item"], false).into_iter().collect(),
        "UpdateItem" | "DeleteItem" => named(&request["Key"], false).into_iter().collect(),
        "TransactWriteItems" => request["TransactItems"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| {
                let key = item["Put"]
                    .get("Item")
                    .or_else(|| item["Update"].get("Key"))
                    .or_else(|| item["Delete"].get("Key"))
                    .or_else(|| item["ConditionCheck"].get("Key"))?;
                named(key, true)
            })
            .collect(),
        "BatchWriteItem" => request["RequestItems"]
            .as_object()
            .into_iter()
            .flat_map(|tables| tables.values())
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(|w| {
                let key = w["PutRequest"]
                    .get("Item")
                    .or_else(|| w["DeleteRequest"].get("Key"))?;
                named(key, false)
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// An item's size by DynamoDB's rules: each attribute's name plus its value (strings
/// and binaries by their bytes, numbers by about one byte per two digits plus one,
/// booleans and nulls one byte, lists and maps 3 bytes plus one per element).
pub fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    fn value(v: &AttributeValue) -> usize {
        match v {
            AttributeValue::S(s) => s.len(),
            AttributeValue::N(n) => n.trim_start_matches('-').len().div_ceil(2) + 1,
            AttributeValue::B(b) => b.as_ref().len(),
            AttributeValue::Ss(set) => set.iter().map(String::len).sum(),
            AttributeValue::Ns(set) => set.iter().map(|n| n.len().div_ceil(2) + 1).sum(),
            AttributeValue::Bs(set) => set.iter().map(|b| b.as_ref().len()).sum(),
            AttributeValue::L(list) => 3 + list.iter().map(|v| value(v) + 1).sum::<usize>(),
            AttributeValue::M(map) => {
                3 + map
                    .iter()
                    .map(|(k, v)| k.len() + value(v) + 1)
                    .sum::<usize>()
            }
            _ => 1,
        }
    }
    item.iter().map(|(name, v)| name.len() + value(v)).sum()
}

impl RoundTrips {
    /// The operations sent since the last call, in order; resets the count.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.ops.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The item writes sent since the last call; resets the record.
    pub fn take_writes(&self) -> Vec<ItemWrite> {
        std::mem::take(&mut *self.writes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The IAM actions the requests since the last call needed; resets the record.
    pub fn take_actions(&self) -> std::collections::BTreeSet<String> {
        std::mem::take(&mut *self.actions.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The items read since the last call; resets the count.
    pub fn take_items_read(&self) -> u64 {
        self.items_read.swap(0, std::sync::atomic::Ordering::SeqCst)
    }

    /// The read request units the reads since the last call cost, estimated by
    /// DynamoDB's rules (see [`read_units`]); resets the count.
    pub fn take_read_units(&self) -> f64 {
        self.read_half_units
            .swap(0, std::sync::atomic::Ordering::SeqCst) as f64
            / 2.0
    }

    /// The most calls in flight at once since the last call; resets the record.
    pub fn take_most_in_flight(&self) -> u64 {
        let now = self.in_flight.load(std::sync::atomic::Ordering::SeqCst);
        self.most_in_flight
            .swap(now, std::sync::atomic::Ordering::SeqCst)
    }

    /// `client` with this counter attached.
    pub fn attach(&self, client: &aws_sdk_dynamodb::Client) -> aws_sdk_dynamodb::Client {
        let config = client
            .config()
            .to_builder()
            .interceptor(self.clone())
            .build();
        aws_sdk_dynamodb::Client::from_conf(config)
    }
}

/// Held in a call's state while the call lasts; counts it out when dropped.
#[derive(Debug, Clone)]
struct InFlight {
    _guard: Arc<CallGuard>,
}

#[derive(Debug)]
struct CallGuard(Arc<std::sync::atomic::AtomicU64>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl aws_smithy_types::config_bag::Storable for InFlight {
    type Storer = aws_smithy_types::config_bag::StoreReplace<Self>;
}

/// What a read asked for, kept from its request to its answer.
#[derive(Debug, Clone)]
struct ReadAsked {
    operation: String,
    consistent: bool,
    /// Keys a GetItem or BatchGetItem asked for.
    keys: u64,
}

impl aws_smithy_types::config_bag::Storable for ReadAsked {
    type Storer = aws_smithy_types::config_bag::StoreReplace<Self>;
}

impl ReadAsked {
    fn of(operation: &str, body: &[u8]) -> Option<Self> {
        let request: Value = serde_json::from_slice(body).ok()?;
        let consistent = |r: &Value| r["ConsistentRead"].as_bool() == Some(true);
        let (consistent, keys) = match operation {
            "GetItem" => (consistent(&request), 1),
            "BatchGetItem" => {
                let tables = request["RequestItems"].as_object()?;
                let keys = tables
                    .values()
                    .map(|t| t["Keys"].as_array().map_or(0, Vec::len) as u64)
                    .sum();
                (tables.values().all(consistent), keys)
            }
            "TransactGetItems" => (true, 0),
            // An index is read eventually consistent, whatever is asked.
            "Query@index" => (false, 0),
            "Query" | "Scan" => (consistent(&request), 0),
            _ => return None,
        };
        Some(Self {
            operation: operation.to_string(),
            consistent,
            keys,
        })
    }
}

/// An attribute value as a DynamoDB answer spells it (`{"S": "..."}`), for
/// [`item_size`]: binaries keep their base64 text's decoded length.
fn json_attribute(v: &Value) -> AttributeValue {
    let Some((kind, inner)) = v.as_object().and_then(|o| o.iter().next()) else {
        return AttributeValue::Null(true);
    };
    let strings = |set: &Value| -> Vec<String> {
        set.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    };
    let blob = |b: &str| aws_sdk_dynamodb::primitives::Blob::new(vec![0; b.len() * 3 / 4]);
    match kind.as_str() {
        "S" => AttributeValue::S(inner.as_str().unwrap_or_default().to_string()),
        "N" => AttributeValue::N(inner.as_str().unwrap_or_default().to_string()),
        "B" => AttributeValue::B(blob(inner.as_str().unwrap_or_default())),
        "SS" => AttributeValue::Ss(strings(inner)),
        "NS" => AttributeValue::Ns(strings(inner)),
        "BS" => AttributeValue::Bs(strings(inner).iter().map(|b| blob(b)).collect()),
        "L" => AttributeValue::L(
            inner
                .as_array()
                .into_iter()
                .flatten()
                .map(json_attribute)
                .collect(),
        ),
        "M" => AttributeValue::M(json_item(inner)),
        _ => AttributeValue::Null(true),
    }
}

/// An item as a DynamoDB answer spells it.
fn json_item(item: &Value) -> HashMap<String, AttributeValue> {
    item.as_object()
        .into_iter()
        .flatten()
        .map(|(name, v)| (name.clone(), json_attribute(v)))
        .collect()
}

/// The read request units an answer cost, in halves, by DynamoDB's rules: a GetItem
/// or each key of a BatchGetItem one unit per 4 KB of its item, found or not (half
/// eventually consistent); a Query or Scan one unit per 4 KB of all the items it read
/// together, at least one (half eventually consistent, as every index read is; items
/// a filter left out counted at the answer's mean size); a transactional read twice.
fn read_units(asked: &ReadAsked, body: &[u8]) -> u64 {
    const BLOCK: usize = 4096;
    let Ok(answer) = serde_json::from_slice::<Value>(body) else {
        return 0;
    };
    let size = |v: &Value| item_size(&json_item(v));
    let full = match asked.operation.as_str() {
        "GetItem" => answer
            .get("Item")
            .map_or(1, |item| size(item).div_ceil(BLOCK).max(1)),
        "BatchGetItem" => {
            let found: Vec<usize> = answer["Responses"]
                .as_object()
                .into_iter()
                .flat_map(|tables| tables.values())
                .filter_map(Value::as_array)
                .flatten()
                .map(size)
                .collect();
            let missing = (asked.keys as usize).saturating_sub(found.len());
            found
                .iter()
                .map(|s| s.div_ceil(BLOCK).max(1))
                .sum::<usize>()
                + missing
        }
        "TransactGetItems" => {
            2 * answer["Responses"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| r.get("Item").map_or(1, |i| size(i).div_ceil(BLOCK).max(1)))
                .sum::<usize>()
        }
        _ => {
            let items: Vec<usize> = answer["Items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(size)
                .collect();
            let returned: usize = items.iter().sum();
            let scanned = answer["ScannedCount"].as_u64().unwrap_or(0) as usize;
            let left_out = scanned.saturating_sub(items.len());
            let mean = if items.is_empty() {
                1024
            } else {
                returned / items.len()
            };
            (returned + left_out * mean).div_ceil(BLOCK).max(1)
        }
    } as u64;
    if asked.consistent { full * 2 } else { full }
}

/// The items one DynamoDB answer reports reading.
fn items_in_answer(body: &[u8]) -> u64 {
    let Ok(answer) = serde_json::from_slice::<Value>(body) else {
        return 0;
    };
    if let Some(scanned) = answer.get("ScannedCount").and_then(Value::as_u64) {
        return scanned;
    }
    if answer.get("Item").is_some_and(Value::is_object) {
        return 1;
    }
    answer
        .get("Responses")
        .and_then(Value::as_object)
        .map_or(0, |tables| {
            tables
                .values()
                .filter_map(Value::as_array)
                .map(|items| items.len() as u64)
                .sum()
        })
}

impl aws_sdk_dynamodb::config::Intercept for RoundTrips {
    fn name(&self) -> &'static str {
        "RoundTrips"
    }

    // A call is in flight from its start until its state is dropped: answered, failed,
    // or cancelled with the future that made it (a drain that stops early).
    fn read_before_execution(
        &self,
        _context: &aws_sdk_dynamodb::config::interceptors::BeforeSerializationInterceptorContextRef<
            '_,
        >,
        cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let now = self
            .in_flight
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        self.most_in_flight
            .fetch_max(now, std::sync::atomic::Ordering::SeqCst);
        cfg.interceptor_state().store_put(InFlight {
            _guard: Arc::new(CallGuard(self.in_flight.clone())),
        });
        Ok(())
    }

    fn read_before_transmit(
        &self,
        context: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _components: &aws_sdk_dynamodb::config::RuntimeComponents,
        cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let request = context.request();
        let mut target = request
            .headers()
            .get("x-amz-target")
            .and_then(|t| t.split('.').nth(1))
            .unwrap_or("unknown")
            .to_string();
        // A query of an index is bounded by what the index holds; one of the table reads
        // a partition's items: tell them apart.
        if target == "Query"
            && request
                .body()
                .bytes()
                .is_some_and(|b| b.windows(11).any(|w| w == b"\"IndexName\""))
        {
            target.push_str("@index");
        }
        let number = self
            .requests
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some(asked) = request
            .body()
            .bytes()
            .and_then(|body| ReadAsked::of(&target, body))
        {
            cfg.interceptor_state().store_put(asked);
        }
        if let Some(body) = request.body().bytes() {
            self.actions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(iam_actions(&target, body));
            let mut written = items_written(&target, body);
            for w in &mut written {
                w.request = number;
            }
            if !written.is_empty() {
                self.writes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(written);
            }
        }
        self.ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(target);
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &aws_sdk_dynamodb::config::interceptors::AfterDeserializationInterceptorContextRef<
            '_,
        >,
        _components: &aws_sdk_dynamodb::config::RuntimeComponents,
        cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        if let Some(body) = context.response().body().bytes() {
            self.items_read
                .fetch_add(items_in_answer(body), std::sync::atomic::Ordering::SeqCst);
            if context.response().status().is_success()
                && let Some(asked) = cfg.load::<ReadAsked>()
            {
                self.read_half_units
                    .fetch_add(read_units(asked, body), std::sync::atomic::Ordering::SeqCst);
            }
        }
        Ok(())
    }
}

/// A fresh table, created from `template.yaml` and deleted when dropped.
pub struct TestTable {
    pub name: String,
    pub client: aws_sdk_dynamodb::Client,
    endpoint: String,
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

/// One test's running onegrant: API, stand-in and table.
pub struct TestApp {
    pub base_url: String,
    /// The Lambda Invoke API for the same functions.
    pub invoke_url: String,
    pub standin_url: String,
    pub http: reqwest::Client,
    pub table: TestTable,
    pub deps: Deps,
    /// Every DynamoDB request the functions send.
    pub round_trips: RoundTrips,
    /// The items [`TestApp::ttl_pass`] removed, so ledger checks still add up.
    pub expired: Arc<Mutex<Vec<HashMap<String, AttributeValue>>>>,
    // Declared after `table`, so the table is deleted before the emulator is killed.
    _emulator: Option<Emulator>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Words that only WeChat, the HTTP client or the SDK produce: no answer of onegrant's
/// may carry them (API.md: bodies never carry internal details). Checked on every
/// response the suite decodes, like the OpenAPI check.
const INTERNAL_WORDS: [&str; 10] = [
    "errmsg",
    "errcode",
    "rid:",
    "error sending request",
    "operation timed out",
    "connection refused",
    "dispatch failure",
    "dynamodb",
    "conditionalcheckfailed",
    "transactioncanceled",
];

fn assert_nothing_internal(status: u16, body: &[u8]) {
    let text = String::from_utf8_lossy(body).to_lowercase();
    for word in INTERNAL_WORDS {
        assert!(
            !text.contains(word),
            "a {status} answer carries {word:?}: {text}"
        );
    }
}

/// A plain HTTP response, decoded.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

async fn serve(router: axum_router::Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let addr = listener.local_addr().expect("local addr");
    let task = tokio::spawn(async move {
        let _ = axum_router::serve(listener, router).await;
    });
    (format!("http://{addr}"), task)
}

/// Re-exported so tests need no direct axum dependency.
pub mod axum_router {
    pub use axum::{Router, serve};
}

/// Starts a fresh onegrant for one test. `overrides` replace config values.
pub async fn spawn_app_with(overrides: &[(&'static str, &str)]) -> TestApp {
    spawn_app_on(overrides, None, None).await
}

/// Like [`spawn_app_with`], with the functions' DynamoDB client going through a
/// [`faults::FaultProxy`] (the test's own reads go straight to the emulator). The
/// client retries and times out as a deployed one does, only faster: 3 attempts, a
/// 1-second attempt timeout, 10 ms first backoff.
pub async fn spawn_faulty_app(overrides: &[(&'static str, &str)]) -> (TestApp, faults::FaultProxy) {
    let proxy = faults::FaultProxy::start(emulator_endpoint()).await;
    let app = spawn_app_on(overrides, None, Some(&proxy.url)).await;
    (app, proxy)
}

/// Like [`spawn_app_with`], on an emulator of its own: for load tests, which would
/// otherwise slow every test sharing the suite's emulator (moto applies requests one
/// at a time).
pub async fn spawn_app_isolated(overrides: &[(&'static str, &str)]) -> TestApp {
    let emulator = Emulator::start(true).expect("a dedicated emulator starts");
    spawn_app_on(overrides, Some(emulator), None).await
}

async fn spawn_app_on(
    overrides: &[(&'static str, &str)],
    emulator: Option<Emulator>,
    proxy: Option<&str>,
) -> TestApp {
    // Logs go through the test harness's capture: shown only for failing tests.
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .try_init();
    // reqwest is built without a default TLS provider; onegrant installs ring.
    onegrant::aws::install_crypto_provider();
    let table = match &emulator {
        Some(e) => TestTable::create_on(e.endpoint()).await,
        None => TestTable::create().await,
    };
    let standin_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let standin_url = format!(
        "http://{}",
        standin_listener.local_addr().expect("local addr")
    );
    // The Invoke API's address is part of the config (a fanning-out tick invokes its
    // workers there), so it is bound first.
    let invoke_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let invoke_url = format!(
        "http://{}",
        invoke_listener.local_addr().expect("local addr")
    );
    let mut values: HashMap<&str, String> = HashMap::from([
        ("DISPATCH_FUNCTION_NAME", "dispatcher".to_string()),
        ("AWS_ENDPOINT_URL_LAMBDA", invoke_url.clone()),
        ("TABLE_NAME", table.name.clone()),
        ("WECHAT_API_BASE", standin_url.clone()),
        ("WECHAT_APPID", stack::LOCAL_APPID.to_string()),
        ("WECHAT_SECRET", stack::LOCAL_SECRET.to_string()),
        ("SESSION_SECRET", stack::LOCAL_SESSION_SECRET.to_string()),
        ("ONEGRANT_TEMPLATES", stack::LOCAL_TEMPLATES.to_string()),
        ("ONEGRANT_REMINDERS", stack::LOCAL_REMINDERS.to_string()),
        ("WECHAT_TIMEOUT_MS", "2000".to_string()),
        ("NOTIFY_SOURCES", "tests,com.example.shop".to_string()),
    ]);
    if proxy.is_none() {
        // The suite's emulator applies one request at a time, on a loaded machine:
        // contended writes take far longer to get through than on DynamoDB. The fault
        // tests keep the deployed budget.
        values.insert("WRITE_BUDGET_MS", "20000".to_string());
        // And the handler's own budget stays above it, as the deployed 9 s is above 4 s.
        values.insert("HANDLER_BUDGET_MS", "30000".to_string());
    }
    for (k, v) in overrides {
        values.insert(k, v.to_string());
    }
    let config = stack::local_config(&values).expect("test config is valid");
    let standin_task = standin::spawn(stack::standin_config(&config), standin_listener);
    let round_trips = RoundTrips::default();
    let functions_client = match proxy {
        None => table.client.clone(),
        Some(url) => {
            let config = table
                .client
                .config()
                .to_builder()
                .endpoint_url(url)
                .retry_config(
                    aws_sdk_dynamodb::config::retry::RetryConfig::standard()
                        .with_max_attempts(3)
                        .with_initial_backoff(std::time::Duration::from_millis(10)),
                )
                .timeout_config(onegrant::aws::dynamodb_timeouts(
                    std::time::Duration::from_secs(1),
                ))
                .build();
            aws_sdk_dynamodb::Client::from_conf(config)
        }
    };
    let deps = stack::deps(config, round_trips.attach(&functions_client)).expect("deps build");
    let (base_url, api_task) = serve(api::api_router(deps.clone()).expect("router builds")).await;
    let router = api::invoke_router(deps.clone()).expect("router builds");
    let invoke_task = tokio::spawn(async move {
        let _ = axum_router::serve(invoke_listener, router).await;
    });
    TestApp {
        base_url,
        invoke_url,
        standin_url,
        http: reqwest::Client::new(),
        table,
        deps,
        round_trips,
        expired: Arc::default(),
        _emulator: emulator,
        tasks: vec![standin_task, api_task, invoke_task],
    }
}

/// Starts a fresh onegrant taking safe-mode JSON pushes (the local stack's push
/// settings), with its stand-in pushing there like WeChat, each event `copies` times
/// at once; dispatch timeouts short enough for 20-second test ticks.
pub async fn spawn_pushing_app(copies: u32) -> TestApp {
    spawn_pushing_app_with(copies, &[]).await
}

/// Like [`spawn_pushing_app`], with `extra` config values on top.
pub async fn spawn_pushing_app_with(copies: u32, extra: &[(&'static str, &str)]) -> TestApp {
    let app = spawn_app_with(&pushing_overrides(extra)).await;
    point_pushes(&app, copies).await;
    app
}

/// Like [`spawn_pushing_app`], with the fault proxy between the functions and the
/// emulator.
pub async fn spawn_faulty_pushing_app(copies: u32) -> (TestApp, faults::FaultProxy) {
    let proxy = faults::FaultProxy::start(emulator_endpoint()).await;
    let app = spawn_app_on(&pushing_overrides(&[]), None, Some(&proxy.url)).await;
    point_pushes(&app, copies).await;
    (app, proxy)
}

fn pushing_overrides<'a>(extra: &[(&'static str, &'a str)]) -> Vec<(&'static str, &'a str)> {
    let mut overrides: Vec<(&'static str, &str)> = stack::LOCAL_PUSH.to_vec();
    overrides.extend([
        ("DISPATCH_LOOKAHEAD_SECONDS", "5"),
        ("WECHAT_TIMEOUT_MS", "1500"),
    ]);
    overrides.extend_from_slice(extra);
    overrides
}

/// Points the stand-in's pushes at `app`'s callback, each posted `copies` times.
async fn point_pushes(app: &TestApp, copies: u32) {
    let target = stack::standin_push(&app.deps.config, &app.base_url).expect("push configured");
    let mut target = serde_json::to_value(target).expect("a push target");
    target["copies"] = json!(copies);
    app.control("POST", "push-target", Some(target)).await;
}

/// Starts a fresh onegrant for one test with the local defaults.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(&[]).await
}

/// The local templates' ids.
pub const WATER: &str = "tmpl_water_reminder";
pub const ORDER: &str = "tmpl_order_status";

impl TestApp {
    async fn decode(response: reqwest::Response) -> Answer {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.expect("response body");
        assert_nothing_internal(status, &bytes);
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                panic!(
                    "non-JSON body ({status}): {}",
                    String::from_utf8_lossy(&bytes)
                )
            })
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    /// Sends `method path` with an optional bearer token and raw body, checks the answer
    /// against api/openapi.yaml, and returns it.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base_url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let answer = Self::decode(request.send().await.expect("request reaches the API")).await;
        openapi::assert_conforms(method.as_str(), path, answer.status, &answer.body);
        answer
    }

    /// Like [`TestApp::call`], retrying as the contract asks a client to: a 503 (checked
    /// to carry the error shape and `Retry-After`) is sent again, up to ten times. The
    /// answer, and how many 503s came before it.
    pub async fn call_retrying(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (Answer, usize) {
        for retried in 0..10 {
            let bytes = body.map(|b| serde_json::to_vec(b).expect("JSON"));
            let answer = self.call(method, path, token, bytes).await;
            if answer.status != 503 {
                return (answer, retried);
            }
            assert_eq!(
                answer.body["error"]["code"], "unavailable",
                "{}",
                answer.body
            );
            assert!(
                answer.headers.contains_key("retry-after"),
                "503 without Retry-After"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        panic!("{method} {path} answered 503 ten times");
    }

    pub async fn post(&self, path: &str, token: Option<&str>, body: &Value) -> Answer {
        self.call(
            "POST",
            path,
            token,
            Some(serde_json::to_vec(body).expect("JSON")),
        )
        .await
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> Answer {
        self.call("GET", path, token, None).await
    }

    /// Calls the stand-in's control API.
    pub async fn control(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self
            .http
            .request(method, format!("{}/control/{path}", self.standin_url));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("stand-in reachable");
        assert!(
            response.status().is_success(),
            "control {path}: {}",
            response.status()
        );
        response.json().await.expect("control answers JSON")
    }

    /// A fresh `wx.login` code for `user`, and that user's openid.
    pub async fn login_code(&self, user: &str) -> (String, String) {
        let v = self
            .control("POST", "login-codes", Some(json!({"user": user})))
            .await;
        (
            v["code"].as_str().expect("code").to_string(),
            v["openid"].as_str().expect("openid").to_string(),
        )
    }

    /// Logs `user` in through `POST /v1/session` and returns the session token.
    pub async fn login(&self, user: &str) -> String {
        let (code, _) = self.login_code(user).await;
        let answer = self.post("/v1/session", None, &json!({"code": code})).await;
        assert_eq!(answer.status, 200, "login: {}", answer.body);
        answer.body["token"].as_str().expect("token").to_string()
    }

    /// Every item stored so far.
    pub async fn items(&self) -> Vec<HashMap<String, AttributeValue>> {
        self.table.items().await
    }

    /// Estimated write units of `writes` (see [`RoundTrips::take_writes`]) by
    /// DynamoDB's rules: per item, its size rounded up to 1 KB, twice in a transaction.
    /// Sizes are the items as they are now (DynamoDB bills the larger of before and
    /// after; for the small items here they round alike); a deleted item counts 1 KB.
    pub async fn write_units(&self, writes: &[ItemWrite]) -> usize {
        self.write_sizes(writes)
            .await
            .iter()
            .map(|(w, bytes)| bytes.div_ceil(1024).max(1) * if w.transactional { 2 } else { 1 })
            .sum()
    }

    /// Each write of `writes` with its item's size in bytes now (a deleted item counts
    /// 1 KB), as [`TestApp::write_units`] bills it.
    pub async fn write_sizes(&self, writes: &[ItemWrite]) -> Vec<(ItemWrite, usize)> {
        let mut sizes = Vec::new();
        for w in writes {
            let item = self
                .table
                .client
                .get_item()
                .table_name(&self.table.name)
                .key("pk", AttributeValue::S(w.pk.clone()))
                .key("sk", AttributeValue::S(w.sk.clone()))
                .send()
                .await
                .expect("get item")
                .item;
            sizes.push((w.clone(), item.map_or(1024, |i| item_size(&i))));
        }
        sizes
    }

    /// What DynamoDB's TTL does, as of `at`: every item whose `expires_at` (epoch
    /// seconds) is before `at` is deleted, conditional on `expires_at` being unchanged
    /// (TTL re-checks the attribute before it deletes). Returns how many it removed;
    /// they are kept in [`TestApp::expired`].
    pub async fn ttl_pass(&self, at: chrono::DateTime<chrono::Utc>) -> usize {
        let mut removed = 0;
        for item in self.items().await {
            let Some(expires) = attr_n(&item, "expires_at") else {
                continue;
            };
            if expires >= at.timestamp() {
                continue;
            }
            let deleted = self
                .table
                .client
                .delete_item()
                .table_name(&self.table.name)
                .key("pk", item["pk"].clone())
                .key("sk", item["sk"].clone())
                .condition_expression("expires_at = :e")
                .expression_attribute_values(":e", AttributeValue::N(expires.to_string()))
                .send()
                .await;
            if deleted.is_ok() {
                removed += 1;
                self.expired
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(item);
            }
        }
        removed
    }
}

/// `Value` → the quota entry of `template` in an answer's `quotas`.
pub fn quota<'a>(answer: &'a Value, template: &str) -> &'a Value {
    answer["quotas"]
        .as_array()
        .and_then(|qs| qs.iter().find(|q| q["template_id"] == template))
        .unwrap_or_else(|| panic!("no quota for {template} in {answer}"))
}

/// The string attribute `name` of a stored item.
pub fn attr_s<'a>(item: &'a HashMap<String, AttributeValue>, name: &str) -> Option<&'a str> {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
}

/// The number attribute `name` of a stored item.
pub fn attr_n(item: &HashMap<String, AttributeValue>, name: &str) -> Option<i64> {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
}

/// Per (user partition, template): the quota counters and the grant items by state.
/// Checks invariant I2 and that counters agree with the ledger, for every user.
pub async fn assert_ledger_agrees_with_counters(app: &TestApp) {
    let items = app.items().await;
    let expired = app
        .expired
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut states: HashMap<(String, String), HashMap<String, i64>> = HashMap::new();
    // The request ids of the open grants, by (user, template) and state.
    let mut open: HashMap<(String, String, String), std::collections::BTreeSet<String>> =
        HashMap::new();
    // The counters keep the totals of grants whose ledger items expired.
    for item in items.iter().chain(&expired) {
        if attr_s(item, "kind") == Some("grant")
            && let Some(state) = attr_s(item, "state")
        {
            let key = (
                attr_s(item, "pk").unwrap_or_default().to_string(),
                attr_s(item, "template_id").unwrap_or_default().to_string(),
            );
            if state == "available" || state == "reserved" {
                open.entry((key.0.clone(), key.1.clone(), state.to_string()))
                    .or_default()
                    .insert(attr_s(item, "request_id").unwrap_or_default().to_string());
            }
            *states
                .entry(key)
                .or_default()
                .entry(state.to_string())
                .or_default() += 1;
        }
    }
    for item in items.iter().filter(|i| attr_s(i, "kind") == Some("quota")) {
        let key = (
            attr_s(item, "pk").unwrap_or_default().to_string(),
            attr_s(item, "template_id").unwrap_or_default().to_string(),
        );
        let counted = states.remove(&key).unwrap_or_default();
        let n = |name: &str| attr_n(item, name).unwrap_or(0);
        let c = |state: &str| counted.get(state).copied().unwrap_or(0);
        assert_eq!(
            n("accepted"),
            n("available") + n("reserved") + n("consumed") + n("invalid"),
            "I2 for {key:?}"
        );
        assert_eq!(n("available"), c("available"), "available for {key:?}");
        assert_eq!(n("reserved"), c("reserved"), "reserved for {key:?}");
        assert_eq!(n("consumed"), c("consumed"), "consumed for {key:?}");
        assert_eq!(n("invalid"), c("invalid"), "invalid for {key:?}");
        // The open-grant sets a claim and an invalidation trust: once they account for
        // the counters, they name exactly the ledger's open grants.
        for (state, set) in [
            ("available", "open_available"),
            ("reserved", "open_reserved"),
        ] {
            let listed: std::collections::BTreeSet<String> = item
                .get(set)
                .and_then(|v| v.as_ss().ok())
                .map(|ids| ids.iter().cloned().collect())
                .unwrap_or_default();
            let ledger = open
                .get(&(key.0.clone(), key.1.clone(), state.to_string()))
                .cloned()
                .unwrap_or_default();
            // Always true members only (every write moves a grant's id with it; the
            // repair checks each id it adds): what makes a partial repair safe.
            assert!(
                listed.is_subset(&ledger),
                "{set} names grants not {state} for {key:?}: {:?}",
                listed.difference(&ledger).collect::<Vec<_>>()
            );
            if listed.len() as i64 == n(state) {
                assert_eq!(listed, ledger, "{set} names the {state} grants for {key:?}");
            }
        }
    }
    assert!(states.is_empty(), "grants without counters: {states:?}");
}

/// Every plan item is well formed and the due index holds exactly the scheduled plans:
/// `scheduled` ⇔ on the index at its `next_due_at`; `paused` ⇔ a reason.
pub async fn assert_plans_consistent(app: &TestApp) {
    let items = app.items().await;
    let mut scheduled = std::collections::BTreeSet::new();
    for plan in items.iter().filter(|i| attr_s(i, "kind") == Some("plan")) {
        let state = attr_s(plan, "state").unwrap_or_default();
        let on_index = plan.contains_key("due_pk") && plan.contains_key("due_at");
        assert_eq!(
            on_index,
            state == "scheduled",
            "due index entry vs state {state}: {plan:?}"
        );
        assert_eq!(
            plan.contains_key("pause_reason"),
            state == "paused",
            "pause reason vs {state}"
        );
        if on_index {
            assert_eq!(attr_n(plan, "due_at"), attr_n(plan, "next_due_at"));
            scheduled.insert((
                attr_s(plan, "pk").unwrap_or_default().to_string(),
                attr_s(plan, "sk").unwrap_or_default().to_string(),
            ));
        }
    }
    let mut indexed = std::collections::BTreeSet::new();
    let known = app
        .deps
        .store
        .known_shards()
        .await
        .expect("the shard registry");
    for shard in 0..known {
        let out = app
            .table
            .client
            .query()
            .table_name(&app.table.name)
            .index_name("due")
            .key_condition_expression("due_pk = :p")
            .expression_attribute_values(
                ":p",
                AttributeValue::S(onegrant::store::keys::due_shard_pk(shard)),
            )
            .send()
            .await
            .expect("query the due index");
        for item in out.items() {
            indexed.insert((
                attr_s(item, "pk").unwrap_or_default().to_string(),
                attr_s(item, "sk").unwrap_or_default().to_string(),
            ));
        }
    }
    assert_eq!(
        indexed, scheduled,
        "the due index holds exactly the scheduled plans"
    );
    assert_no_plan_stuck_sending(app).await;
}

/// Every `sending` plan has a live (`claimed`/`sending`) delivery: a plan whose send has
/// settled never stays `sending` (I5).
pub async fn assert_no_plan_stuck_sending(app: &TestApp) {
    let items = app.items().await;
    for plan in items
        .iter()
        .filter(|i| attr_s(i, "kind") == Some("plan") && attr_s(i, "state") == Some("sending"))
    {
        let pk = attr_s(plan, "pk").unwrap_or_default();
        let delivery_sk = format!(
            "DELIVERY#{}",
            attr_s(plan, "delivery_id").unwrap_or_default()
        );
        let delivery = items
            .iter()
            .find(|i| attr_s(i, "pk") == Some(pk) && attr_s(i, "sk") == Some(delivery_sk.as_str()));
        let state = delivery.and_then(|d| attr_s(d, "state"));
        assert!(
            matches!(state, Some("claimed" | "sending")),
            "a sending plan without a live delivery ({state:?}): {plan:?}"
        );
    }
}

/// A user with a session, known to the stand-in.
#[derive(Debug, Clone)]
pub struct User {
    pub openid: String,
    pub token: String,
}

impl TestApp {
    /// Logs a user in and returns their session and openid.
    pub async fn user(&self, name: &str) -> User {
        let (code, openid) = self.login_code(name).await;
        let answer = self.post("/v1/session", None, &json!({"code": code})).await;
        assert_eq!(answer.status, 200, "login: {}", answer.body);
        User {
            openid,
            token: answer.body["token"].as_str().expect("token").to_string(),
        }
    }

    /// One tap that accepts `template`: the grant reported to onegrant and the quota
    /// WeChat (the stand-in) then really holds.
    pub async fn accept(&self, user: &User, template: &str, request_id: &str) {
        let answer = self
            .post(
                "/v1/grants",
                Some(&user.token),
                &json!({"request_id": request_id, "results": {template: "accept"}}),
            )
            .await;
        assert_eq!(answer.status, 200, "grant: {}", answer.body);
        self.control(
            "POST",
            "quota",
            Some(json!({"openid": user.openid, "template_id": template, "count": 1})),
        )
        .await;
    }

    /// A user holding `grants` accepted water grants (at the stand-in too) with the
    /// water plan enabled — scheduled, not yet due (see [`TestApp::make_due`]).
    pub async fn scheduled_user(&self, name: &str, grants: u32) -> User {
        let user = self.user(name).await;
        for i in 0..grants {
            self.accept(&user, WATER, &format!("wr_{name}_{i}")).await;
        }
        let plan = self.enable(&user, "water").await;
        assert_eq!(plan.body["state"], "scheduled", "{}", plan.body);
        user
    }

    /// Waits (up to 5 s) until `user`'s plan of `kind` is `sending`: a send in flight.
    pub async fn until_sending(&self, user: &User, kind: &str) {
        for _ in 0..250 {
            let plan = self.item(user, &format!("PLAN#{kind}")).await;
            if plan.as_ref().and_then(|p| attr_s(p, "state")) == Some("sending") {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Asserts that `user` has `n` grant ledger items, every one `invalid`.
    pub async fn assert_grants_void(&self, user: &User, n: usize) {
        let grants = self.items_of(user, "grant").await;
        assert_eq!(grants.len(), n, "{grants:?}");
        assert!(
            grants.iter().all(|g| attr_s(g, "state") == Some("invalid")),
            "every grant void: {grants:?}"
        );
    }

    /// `POST /v1/notifications/read-all` for `user` (one bounded step).
    pub async fn read_all(&self, user: &User) -> Answer {
        self.call(
            "POST",
            "/v1/notifications/read-all",
            Some(&user.token),
            None,
        )
        .await
    }

    /// `PUT /v1/reminders/{kind}` turning the user's plan off (its grants void).
    pub async fn disable(&self, user: &User, kind: &str) -> Answer {
        self.call(
            "PUT",
            &format!("/v1/reminders/{kind}"),
            Some(&user.token),
            Some(br#"{"enabled": false}"#.to_vec()),
        )
        .await
    }

    /// `PUT /v1/reminders/{kind}` turning the user's plan on with its settings as they are.
    pub async fn enable(&self, user: &User, kind: &str) -> Answer {
        self.call(
            "PUT",
            &format!("/v1/reminders/{kind}"),
            Some(&user.token),
            Some(br#"{"enabled": true}"#.to_vec()),
        )
        .await
    }

    /// Moves a scheduled plan's due instant (time passing, without waiting for it).
    pub async fn make_due(&self, user: &User, kind: &str, at: chrono::DateTime<chrono::Utc>) {
        let ms = AttributeValue::N(at.timestamp_millis().to_string());
        self.table
            .client
            .update_item()
            .table_name(&self.table.name)
            .key("pk", AttributeValue::S(format!("USER#{}", user.openid)))
            .key("sk", AttributeValue::S(format!("PLAN#{kind}")))
            .update_expression("SET next_due_at = :t, due_at = :t")
            .condition_expression("#s = :scheduled")
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":t", ms)
            .expression_attribute_values(":scheduled", AttributeValue::S("scheduled".into()))
            .send()
            .await
            .expect("the plan is scheduled");
    }

    /// The stored item `sk` of `user`.
    pub async fn item(&self, user: &User, sk: &str) -> Option<HashMap<String, AttributeValue>> {
        self.table
            .client
            .get_item()
            .table_name(&self.table.name)
            .key("pk", AttributeValue::S(format!("USER#{}", user.openid)))
            .key("sk", AttributeValue::S(sk.to_string()))
            .consistent_read(true)
            .send()
            .await
            .expect("get item")
            .item
    }

    /// `n` available grants of `template` as an older version left them: ledger items
    /// and counters, but no open-grant sets. WeChat holds them too. Their request ids.
    pub async fn legacy_grants(&self, user: &User, template: &str, n: usize) -> Vec<String> {
        let ids: Vec<String> = (0..n).map(|i| format!("legacy_{i:03}")).collect();
        self.write_ledger(user, template, &ids, Some("available"))
            .await;
        self.quota_update(user, template)
            .update_expression(
                "SET template_id = :t, kind = :k, accepted = :n, available = :n \
                 REMOVE open_available, open_reserved",
            )
            .expression_attribute_values(":t", AttributeValue::S(template.into()))
            .expression_attribute_values(":k", AttributeValue::S("quota".into()))
            .expression_attribute_values(":n", AttributeValue::N(n.to_string()))
            .send()
            .await
            .expect("counters written");
        self.control(
            "POST",
            "quota",
            Some(json!({"openid": user.openid, "template_id": template, "count": n})),
        )
        .await;
        ids
    }

    /// Ledger items of `template` written straight to the table, counters untouched:
    /// grants in `state`, or refusals (no state) when `None`.
    pub async fn write_ledger(
        &self,
        user: &User,
        template: &str,
        ids: &[String],
        state: Option<&str>,
    ) {
        use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
        for chunk in ids.chunks(25) {
            let writes = chunk
                .iter()
                .map(|id| {
                    let mut item: HashMap<String, AttributeValue> = [
                        ("pk", format!("USER#{}", user.openid)),
                        ("sk", format!("GRANT#{template}#{id}")),
                        ("kind", "grant".to_string()),
                        ("template_id", template.to_string()),
                        ("request_id", id.clone()),
                        (
                            "result",
                            if state.is_some() { "accept" } else { "reject" }.to_string(),
                        ),
                        ("created_at", "2025-11-30T00:00:00Z".to_string()),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), AttributeValue::S(v)))
                    .collect();
                    item.insert("version".into(), AttributeValue::N("1".into()));
                    if let Some(state) = state {
                        item.insert("state".into(), AttributeValue::S(state.into()));
                    }
                    WriteRequest::builder()
                        .put_request(
                            PutRequest::builder()
                                .set_item(Some(item))
                                .build()
                                .expect("put"),
                        )
                        .build()
                })
                .collect();
            self.table
                .client
                .batch_write_item()
                .request_items(&self.table.name, writes)
                .send()
                .await
                .expect("ledger written");
        }
    }

    /// An update of `user`'s counter item of `template` (to set up states a test needs).
    pub fn quota_update(
        &self,
        user: &User,
        template: &str,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.table
            .client
            .update_item()
            .table_name(&self.table.name)
            .key("pk", AttributeValue::S(format!("USER#{}", user.openid)))
            .key("sk", AttributeValue::S(format!("QUOTA#{template}")))
    }

    /// The state of the grant a stored delivery of `user` reserved.
    pub async fn grant_state_of(
        &self,
        user: &User,
        delivery: &HashMap<String, AttributeValue>,
    ) -> Option<String> {
        let grant = self
            .item(user, attr_s(delivery, "grant_sk").unwrap_or_default())
            .await?;
        attr_s(&grant, "state").map(str::to_string)
    }

    /// Every stored item of `user` whose kind attribute is `kind`.
    pub async fn items_of(&self, user: &User, kind: &str) -> Vec<HashMap<String, AttributeValue>> {
        let pk = format!("USER#{}", user.openid);
        self.items()
            .await
            .into_iter()
            .filter(|i| attr_s(i, "pk") == Some(pk.as_str()) && attr_s(i, "kind") == Some(kind))
            .collect()
    }

    /// Has the stand-in push one event now (see its control API); the callback's
    /// answers.
    pub async fn push_event(&self, event: Value) -> Value {
        self.control("POST", "push-events", Some(event)).await
    }

    /// The stand-in's deliveries.
    pub async fn deliveries(&self) -> Vec<Value> {
        self.control("GET", "deliveries", None).await["deliveries"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Runs one dispatcher tick with `seconds` of budget.
    pub async fn tick(&self, seconds: u64) -> dispatcher::Summary {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(seconds);
        dispatcher::tick(&self.deps, deadline).await.expect("tick")
    }
}

impl TestApp {
    /// A dispatcher process (`bin`: the `dispatch-once` binary, which only the
    /// dispatcher's own tests can name) on this app's table and stand-in, with clients
    /// of its own — another container. `env` adds or overrides variables.
    pub fn dispatcher_process(&self, bin: &str, env: &[(&str, &str)]) -> std::process::Command {
        let mut command = std::process::Command::new(bin);
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("TABLE_NAME", &self.table.name)
            .env("AWS_ENDPOINT_URL_DYNAMODB", self.table.endpoint())
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "local")
            .env("AWS_SECRET_ACCESS_KEY", "local")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("WECHAT_API_BASE", &self.standin_url)
            .env("WECHAT_APPID", stack::LOCAL_APPID)
            .env("WECHAT_SECRET", stack::LOCAL_SECRET)
            .env("SESSION_SECRET", stack::LOCAL_SESSION_SECRET)
            .env("ONEGRANT_TEMPLATES", stack::LOCAL_TEMPLATES)
            .env("ONEGRANT_REMINDERS", stack::LOCAL_REMINDERS)
            .env("DUE_SHARDS", self.deps.config.due_shards.to_string())
            .env("RUST_LOG", "error");
        for (k, v) in env {
            command.env(k, v);
        }
        command
    }

    /// A notification for `user` that asks for a WeChat push of the order template;
    /// `key` is its idempotency key (and the order number the message carries).
    pub async fn push(&self, user: &User, key: &str) -> Value {
        let answer = self
            .notify(json!({"idempotency_key": key, "openid": user.openid, "type": "order",
                           "title": "订单已发货", "body": format!("订单 {key} 已发出"),
                           "wechat": {"template_id": ORDER,
                                      "data": {"character_string1": key, "phrase2": "已发货", "thing3": "顺丰速运"}}}))
            .await;
        assert_eq!(answer["push"], "pending", "push queued: {answer}");
        answer
    }

    /// Claims the one item due (by `now` + 5 s) through the store, as a dispatcher
    /// would (a 10 s lease), and returns the claim.
    pub async fn claim_due(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> onegrant::store::dispatch::Claim {
        let store = &self.deps.store;
        let span = store.shard_span(now).await.expect("registry");
        let due = store
            .due_items(now + chrono::Duration::seconds(5), &span)
            .await
            .expect("due");
        assert_eq!(due.len(), 1, "{due:?}");
        match store
            .claim(
                &due[0],
                &self.deps.config.reminders,
                "this-dispatcher",
                std::time::Duration::from_secs(10),
                now,
            )
            .await
            .expect("claim")
        {
            onegrant::store::dispatch::ClaimOutcome::Claimed(claim) => *claim,
            other => panic!("not claimed: {other:?}"),
        }
    }

    /// [`TestApp::claim_due`], then the dispatcher stalls past its lease and the sweep
    /// declares the send `unknown`: the claim, for its late answer.
    pub async fn claim_and_sweep(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> onegrant::store::dispatch::Claim {
        let claim = self.claim_due(now).await;
        let swept = self.sweep_at(now + chrono::Duration::seconds(60)).await;
        assert_eq!(swept.recovered, 1, "{swept:?}");
        claim
    }

    /// Finalizes `claim` through the store with WeChat's answer `result`.
    pub async fn finalize_as(
        &self,
        claim: &onegrant::store::dispatch::Claim,
        result: onegrant::domain::outcome::SendResult,
    ) -> onegrant::store::dispatch::Finalized {
        self.deps
            .store
            .finalize(
                claim,
                &result,
                &self.deps.config.dispatch.retry_policy(),
                chrono::Utc::now(),
            )
            .await
            .expect("finalized")
    }

    /// [`TestApp::finalize_as`] WeChat having taken the message with `msgid`.
    pub async fn finalize_sent(
        &self,
        claim: &onegrant::store::dispatch::Claim,
        msgid: &str,
    ) -> onegrant::store::dispatch::Finalized {
        let msgid = Some(msgid.to_string());
        self.finalize_as(claim, onegrant::domain::outcome::SendResult::Sent { msgid })
            .await
    }

    /// Claims `item` as a dispatcher that then vanishes (a 10 s lease, no send, no
    /// finalize), as of `now`.
    pub async fn claim_and_vanish(
        &self,
        item: &onegrant::store::dispatch::DueItem,
        now: chrono::DateTime<chrono::Utc>,
    ) {
        let claimed = self
            .deps
            .store
            .claim(
                item,
                &self.deps.config.reminders,
                "vanished",
                std::time::Duration::from_secs(10),
                now,
            )
            .await
            .expect("claim");
        assert!(
            matches!(claimed, onegrant::store::dispatch::ClaimOutcome::Claimed(_)),
            "{claimed:?}"
        );
    }

    /// Runs one sweep as if at `at`.
    pub async fn sweep_at(
        &self,
        at: chrono::DateTime<chrono::Utc>,
    ) -> onegrant::store::dispatch::SweepSummary {
        // Read only: a check must not register a shard count.
        let known = self
            .deps
            .store
            .known_shards()
            .await
            .expect("the shard registry");
        self.deps
            .store
            .sweep(
                &self.deps.config.templates,
                &self.deps.config.reminders,
                &self.deps.config.dispatch.retry_policy(),
                0..known,
                at,
            )
            .await
    }

    /// Invokes a function through the local Lambda Invoke API and returns its answer.
    pub async fn invoke(&self, function: &str, payload: &Value) -> Value {
        let response = self
            .http
            .post(format!(
                "{}/2015-03-31/functions/{function}/invocations",
                self.invoke_url
            ))
            .json(payload)
            .send()
            .await
            .expect("invoke");
        assert_eq!(response.status().as_u16(), 200, "invoke {function}");
        response.json().await.expect("invoke answers JSON")
    }

    /// Publishes a notification event (the EventBridge envelope around `detail`).
    pub async fn notify(&self, detail: Value) -> Value {
        self.notify_as("tests", "onegrant.notification", detail)
            .await
    }

    /// Delivers one event as the bus would, from `source` with `detail_type`.
    pub async fn notify_as(&self, source: &str, detail_type: &str, detail: Value) -> Value {
        self.invoke(
            "NotifyFunction",
            &json!({"version": "0", "id": "e", "detail-type": detail_type, "source": source,
                    "account": "1", "time": "2026-11-30T06:00:00Z", "region": "us-east-1", "resources": [],
                    "detail": detail}),
        )
        .await
    }
}

/// Logs captured through onegrant's own filter, for tests that check what is logged.
/// [`LogCapture::start`] installs it as this thread's subscriber (a current-thread test
/// runtime runs the app's tasks on the same thread, so their logs are captured too).
#[derive(Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogCapture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    /// Captures JSON log lines at `rust_log` (as `RUST_LOG` would ask) until the guard
    /// drops.
    pub fn start(rust_log: &str) -> (Self, tracing::dispatcher::DefaultGuard) {
        use tracing_subscriber::layer::SubscriberExt;
        let capture = Self::default();
        let sink = capture.clone();
        let subscriber = tracing_subscriber::registry()
            .with(onegrant::telemetry::log_filter(Some(rust_log), None))
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(move || sink.clone()),
            );
        let guard = tracing_subscriber::util::SubscriberInitExt::set_default(subscriber);
        (capture, guard)
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).to_string()
    }
}
