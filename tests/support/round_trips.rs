//! The round-trip counter: every DynamoDB request a client sends, by operation, with
//! the items it read and wrote and the units DynamoDB would bill, and the IAM
//! actions it needed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

/// Counts the DynamoDB requests a client sends (every attempt, retries included), by
/// operation name, so tests can pin the round trips an operation costs, and the items
/// those requests read (what DynamoDB bills reads by: a query's or scan's scanned items,
/// a get's item, a batch get's items). Queries of an index are named `Query@index`.
#[derive(Debug, Clone, Default)]
pub struct RoundTrips {
    pub(crate) ops: Arc<Mutex<Vec<String>>>,
    /// Each index query's index, `+next` after it when it asked for a later page.
    pub(crate) index_queries: Arc<Mutex<Vec<String>>>,
    pub(crate) items_read: Arc<std::sync::atomic::AtomicU64>,
    /// Estimated read request units, in halves (see [`read_units`]).
    pub(crate) read_half_units: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) writes: Arc<Mutex<Vec<ItemWrite>>>,
    pub(crate) requests: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) actions: Arc<Mutex<std::collections::BTreeSet<String>>>,
    /// Calls made and not yet ended, and the most there were at once.
    pub(crate) in_flight: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) most_in_flight: Arc<std::sync::atomic::AtomicU64>,
}

/// The IAM actions (`dynamodb:` left off) a request needs: its operation (a query of an
/// index `Query@<index>`, granted on that index's ARN), or for a transaction each
/// item's (a Put needs PutItem, a ConditionCheck ConditionCheckItem).
pub(crate) fn iam_actions(target: &str, body: &[u8]) -> Vec<String> {
    let operation = target.trim_end_matches("@index");
    if operation == "Query" || operation == "Scan" {
        let index = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|request| request["IndexName"].as_str().map(str::to_string));
        return vec![match index {
            Some(index) => format!("{operation}@{index}"),
            None => operation.to_string(),
        }];
    }
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
pub(crate) fn items_written(target: &str, body: &[u8]) -> Vec<ItemWrite> {
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
    /// The index queries sent since the last take: each one's index, `+next` after a
    /// query of a later page.
    pub fn take_index_queries(&self) -> Vec<String> {
        std::mem::take(&mut *self.index_queries.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn take_writes(&self) -> Vec<ItemWrite> {
        std::mem::take(&mut *self.writes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// [`Self::take_writes`] less the read counters every read call writes first
    /// (`RATE#<minute>#reads`, `READS_PER_MINUTE`): what the requests changed.
    pub fn take_changes(&self) -> Vec<ItemWrite> {
        self.take_writes()
            .into_iter()
            .filter(|w| !w.sk.ends_with("#reads"))
            .collect()
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
    /// DynamoDB's rules (see `read_units`); resets the count.
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
pub(crate) struct InFlight {
    pub(crate) _guard: Arc<CallGuard>,
}

#[derive(Debug)]
pub(crate) struct CallGuard(Arc<std::sync::atomic::AtomicU64>);

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
pub(crate) struct ReadAsked {
    pub(crate) operation: String,
    pub(crate) consistent: bool,
    /// Keys a GetItem or BatchGetItem asked for.
    pub(crate) keys: u64,
}

impl aws_smithy_types::config_bag::Storable for ReadAsked {
    type Storer = aws_smithy_types::config_bag::StoreReplace<Self>;
}

impl ReadAsked {
    pub(crate) fn of(operation: &str, body: &[u8]) -> Option<Self> {
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
pub(crate) fn json_attribute(v: &Value) -> AttributeValue {
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
pub(crate) fn json_item(item: &Value) -> HashMap<String, AttributeValue> {
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
pub(crate) fn read_units(asked: &ReadAsked, body: &[u8]) -> u64 {
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
pub(crate) fn items_in_answer(body: &[u8]) -> u64 {
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
            if let Some(query) = request
                .body()
                .bytes()
                .and_then(|b| serde_json::from_slice::<Value>(b).ok())
            {
                let index = query["IndexName"].as_str().unwrap_or_default();
                let next = if query.get("ExclusiveStartKey").is_some() {
                    "+next"
                } else {
                    ""
                };
                self.index_queries
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("{index}{next}"));
            }
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
