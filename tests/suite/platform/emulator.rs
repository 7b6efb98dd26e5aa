//! The emulator the suite relies on must behave like DynamoDB where onegrant's
//! guarantees live: conditional writes and transactions applied atomically.

use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Put, TimeToLiveStatus, TransactWriteItem, Update,
};
use futures::future::join_all;
use onegrant_tests::TestTable;

/// A table on an emulator of its own that switches threads every microsecond: an
/// unserialised moto loses races there in the first round (scripts/moto_serial.py), so
/// a race won exactly is the lock's doing.
async fn racing_table() -> (onegrant_local::emulator::Emulator, TestTable) {
    let emulator = tokio::task::spawn_blocking(|| {
        onegrant_local::emulator::Emulator::start_with(
            true,
            &[("ONEGRANT_EMULATOR_SWITCH_INTERVAL", "1e-6")],
        )
    })
    .await
    .expect("started")
    .expect("an emulator switching threads every microsecond");
    let table = TestTable::create_on(emulator.endpoint()).await;
    (emulator, table)
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forty_racing_conditional_decrements_of_ten_succeed_exactly_ten_times_each_round() {
    let (_emulator, table) = racing_table().await;
    for round in 0..5 {
        table
            .client
            .put_item()
            .table_name(&table.name)
            .item("pk", s("COUNTER"))
            .item("sk", s("C"))
            .item("n", AttributeValue::N("10".into()))
            .send()
            .await
            .expect("seed the counter");
        let attempts = (0..40).map(|_| {
            let client = table.client.clone();
            let name = table.name.clone();
            tokio::spawn(async move {
                client
                    .update_item()
                    .table_name(name)
                    .key("pk", s("COUNTER"))
                    .key("sk", s("C"))
                    .update_expression("SET n = n - :one")
                    .condition_expression("n > :zero")
                    .expression_attribute_values(":one", AttributeValue::N("1".into()))
                    .expression_attribute_values(":zero", AttributeValue::N("0".into()))
                    .send()
                    .await
                    .is_ok()
            })
        });
        let successes = join_all(attempts)
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(true)))
            .count();
        let item = table
            .client
            .get_item()
            .table_name(&table.name)
            .key("pk", s("COUNTER"))
            .key("sk", s("C"))
            .consistent_read(true)
            .send()
            .await
            .expect("read the counter");
        let left = item.item().and_then(|i| onegrant_tests::attr_n(i, "n"));
        assert_eq!(successes, 10, "round {round}: successes");
        assert_eq!(left, Some(0), "round {round}: counter left");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_racing_transactional_claims_have_exactly_one_winner_each_round() {
    let (_emulator, table) = racing_table().await;
    for round in 0..5 {
        let plan = format!("PLAN#{round}");
        table
            .client
            .put_item()
            .table_name(&table.name)
            .item("pk", s("USER#race"))
            .item("sk", s(&plan))
            .item("state", s("scheduled"))
            .send()
            .await
            .expect("seed the plan");
        let racers = (0..20).map(|racer| {
            let client = table.client.clone();
            let name = table.name.clone();
            let plan = plan.clone();
            tokio::spawn(async move {
                let claim = Update::builder()
                    .table_name(&name)
                    .key("pk", s("USER#race"))
                    .key("sk", s(&plan))
                    .update_expression("SET #s = :sending")
                    .condition_expression("#s = :scheduled")
                    .expression_attribute_names("#s", "state")
                    .expression_attribute_values(":sending", s("sending"))
                    .expression_attribute_values(":scheduled", s("scheduled"))
                    .build()
                    .expect("update");
                let record = Put::builder()
                    .table_name(&name)
                    .item("pk", s("USER#race"))
                    .item("sk", s(&format!("CLAIM#{plan}#{racer}")))
                    .build()
                    .expect("put");
                client
                    .transact_write_items()
                    .transact_items(TransactWriteItem::builder().update(claim).build())
                    .transact_items(TransactWriteItem::builder().put(record).build())
                    .send()
                    .await
                    .is_ok()
            })
        });
        let winners = join_all(racers)
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(true)))
            .count();
        let claims = table
            .items()
            .await
            .iter()
            .filter(|i| {
                onegrant_tests::attr_s(i, "sk")
                    .is_some_and(|sk| sk.starts_with(&format!("CLAIM#{plan}#")))
            })
            .count();
        assert_eq!(winners, 1, "round {round}: winners");
        assert_eq!(claims, 1, "round {round}: claim records written");
    }
}

#[tokio::test]
async fn a_cancelled_transaction_leaves_nothing_behind_and_returns_the_old_item() {
    let table = TestTable::create().await;
    table
        .client
        .put_item()
        .table_name(&table.name)
        .item("pk", s("A"))
        .item("sk", s("A"))
        .item("state", s("done"))
        .send()
        .await
        .expect("seed");
    let check = ConditionCheck::builder()
        .table_name(&table.name)
        .key("pk", s("A"))
        .key("sk", s("A"))
        .condition_expression("attribute_not_exists(pk)")
        .return_values_on_condition_check_failure(
            aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
        )
        .build()
        .expect("check");
    let put = Put::builder()
        .table_name(&table.name)
        .item("pk", s("B"))
        .item("sk", s("B"))
        .build()
        .expect("put");
    let err = table
        .client
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().condition_check(check).build())
        .transact_items(TransactWriteItem::builder().put(put).build())
        .send()
        .await
        .expect_err("the condition fails");
    let service = err.into_service_error();
    let reasons = match service {
        aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(e) => {
            e.cancellation_reasons().to_vec()
        }
        other => panic!("expected a cancellation, got {other:?}"),
    };
    assert_eq!(reasons[0].code(), Some("ConditionalCheckFailed"));
    assert_eq!(
        reasons[0]
            .item()
            .and_then(|i| onegrant_tests::attr_s(i, "state")),
        Some("done")
    );
    assert_eq!(table.items().await.len(), 1, "only the seeded item exists");
}

#[tokio::test]
async fn test_tables_have_the_indexes_and_ttl_that_template_yaml_declares() {
    let table = TestTable::create().await;
    let described = table
        .client
        .describe_table()
        .table_name(&table.name)
        .send()
        .await
        .expect("describe");
    let desc = described.table().expect("table description");
    let mut indexes: Vec<(String, Vec<String>)> = desc
        .global_secondary_indexes()
        .iter()
        .map(|g| {
            (
                g.index_name().unwrap_or_default().to_string(),
                g.key_schema()
                    .iter()
                    .map(|k| k.attribute_name().to_string())
                    .collect(),
            )
        })
        .collect();
    indexes.sort();
    assert_eq!(
        indexes,
        vec![
            (
                "due".to_string(),
                vec!["due_pk".to_string(), "due_at".to_string()]
            ),
            ("lane".to_string(), vec!["lane_pk".to_string()]),
            (
                "lease".to_string(),
                vec!["lease_pk".to_string(), "lease_until".to_string()]
            ),
            (
                "pending".to_string(),
                vec!["pending_pk".to_string(), "pending_sk".to_string()]
            ),
        ]
    );
    let ttl = table
        .client
        .describe_time_to_live()
        .table_name(&table.name)
        .send()
        .await
        .expect("describe ttl");
    let ttl = ttl.time_to_live_description().expect("ttl description");
    assert_eq!(ttl.attribute_name(), Some("expires_at"));
    assert_eq!(ttl.time_to_live_status(), Some(&TimeToLiveStatus::Enabled));
}

#[tokio::test]
async fn a_cancelled_transaction_rolls_back_updates_deletes_and_puts_applied_before_the_failure() {
    // scripts/moto_serial.py rolls back by per-item snapshots instead of moto's table
    // copies; this is the proof that the rollback is still complete.
    let table = TestTable::create().await;
    for sk in ["counter", "doomed", "guard"] {
        table
            .client
            .put_item()
            .table_name(&table.name)
            .item("pk", s("P"))
            .item("sk", s(sk))
            .item("n", AttributeValue::N("1".into()))
            .send()
            .await
            .expect("seed");
    }
    let before = table.items().await;
    let key = |sk: &str| {
        std::collections::HashMap::from([("pk".to_string(), s("P")), ("sk".to_string(), s(sk))])
    };
    let update = Update::builder()
        .table_name(&table.name)
        .set_key(Some(key("counter")))
        .update_expression("SET n = n + :hundred")
        .expression_attribute_values(":hundred", AttributeValue::N("100".into()))
        .build()
        .expect("update");
    let delete = aws_sdk_dynamodb::types::Delete::builder()
        .table_name(&table.name)
        .set_key(Some(key("doomed")))
        .build()
        .expect("delete");
    let put = Put::builder()
        .table_name(&table.name)
        .item("pk", s("P"))
        .item("sk", s("new"))
        .build()
        .expect("put");
    let check = ConditionCheck::builder()
        .table_name(&table.name)
        .set_key(Some(key("guard")))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .expect("check");
    let result = table
        .client
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().update(update).build())
        .transact_items(TransactWriteItem::builder().delete(delete).build())
        .transact_items(TransactWriteItem::builder().put(put).build())
        .transact_items(TransactWriteItem::builder().condition_check(check).build())
        .send()
        .await;
    assert!(result.is_err(), "the last condition fails");
    let mut after = table.items().await;
    let mut before = before;
    let by_sk = |i: &std::collections::HashMap<String, AttributeValue>| {
        onegrant_tests::attr_s(i, "sk")
            .unwrap_or_default()
            .to_string()
    };
    before.sort_by_key(by_sk);
    after.sort_by_key(by_sk);
    assert_eq!(
        before, after,
        "nothing of the cancelled transaction remains"
    );
}

#[tokio::test]
async fn a_request_with_an_unused_expression_value_or_name_is_refused_as_dynamodb_does() {
    let table = TestTable::create().await;
    let unused_value = table
        .client
        .update_item()
        .table_name(&table.name)
        .key("pk", s("K"))
        .key("sk", s("K"))
        .update_expression("SET a = :a")
        .expression_attribute_values(":a", s("1"))
        .expression_attribute_values(":spare", s("2"))
        .send()
        .await;
    let error = unused_value.expect_err("refused");
    assert!(
        format!("{:?}", error.raw_response()).contains("400")
            || format!("{error:?}").contains("ValidationException"),
        "{error:?}"
    );
    let put = Put::builder()
        .table_name(&table.name)
        .item("pk", s("K"))
        .item("sk", s("K"))
        .condition_expression("attribute_not_exists(pk)")
        .expression_attribute_names("#spare", "spare")
        .build()
        .expect("put");
    let in_transaction = table
        .client
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().put(put).build())
        .send()
        .await;
    assert!(format!("{:?}", in_transaction.expect_err("refused")).contains("ValidationException"));
    assert!(table.items().await.is_empty(), "nothing written");
    // Every placeholder used: accepted.
    table
        .client
        .update_item()
        .table_name(&table.name)
        .key("pk", s("K"))
        .key("sk", s("K"))
        .update_expression("SET #a = :a")
        .expression_attribute_names("#a", "a")
        .expression_attribute_values(":a", s("1"))
        .send()
        .await
        .expect("accepted");
}

/// A transaction adding `by` to the counter item `sk`.
fn increment(table: &TestTable, sk: &str, by: &str) -> TransactWriteItem {
    TransactWriteItem::builder()
        .update(
            Update::builder()
                .table_name(&table.name)
                .key("pk", s("COUNTER"))
                .key("sk", s(sk))
                .update_expression("ADD n :by")
                .expression_attribute_values(":by", AttributeValue::N(by.into()))
                .build()
                .expect("update"),
        )
        .build()
}

/// The counter item `sk`'s value, read strongly.
async fn counter(table: &TestTable, sk: &str) -> Option<String> {
    table
        .client
        .get_item()
        .table_name(&table.name)
        .key("pk", s("COUNTER"))
        .key("sk", s(sk))
        .consistent_read(true)
        .send()
        .await
        .expect("get")
        .item
        .and_then(|i| i.get("n").and_then(|v| v.as_n().ok()).cloned())
}

#[tokio::test]
async fn a_transactions_client_request_token_is_honoured_as_dynamodb_does() {
    let table = TestTable::create().await;
    let send = |token: &str, by: &str| {
        table
            .client
            .transact_write_items()
            .client_request_token(token)
            .transact_items(increment(&table, "T", by))
            .send()
    };
    let n = || counter(&table, "T");
    send("token-1", "1").await.expect("first");
    assert_eq!(n().await.as_deref(), Some("1"));
    // The same request again (a retry whose first answer was lost): the first answer,
    // nothing applied twice.
    send("token-1", "1")
        .await
        .expect("a replay answers as the first did");
    send("token-1", "1").await.expect("and again");
    assert_eq!(n().await.as_deref(), Some("1"));
    // The same token with other parameters is refused.
    let mismatch = send("token-1", "5").await.expect_err("refused");
    assert!(
        mismatch
            .as_service_error()
            .is_some_and(|e| e.is_idempotent_parameter_mismatch_exception()),
        "{mismatch:?}"
    );
    assert_eq!(n().await.as_deref(), Some("1"));
    // Another token is another transaction.
    send("token-2", "1").await.expect("new token");
    assert_eq!(n().await.as_deref(), Some("2"));
    // A cancelled transaction is not remembered: the same token runs it again.
    let guarded = |token: &str| {
        table
            .client
            .transact_write_items()
            .client_request_token(token)
            .transact_items(
                TransactWriteItem::builder()
                    .update(
                        Update::builder()
                            .table_name(&table.name)
                            .key("pk", s("COUNTER"))
                            .key("sk", s("T"))
                            .update_expression("ADD n :one")
                            .condition_expression("n >= :three")
                            .expression_attribute_values(":one", AttributeValue::N("1".into()))
                            .expression_attribute_values(":three", AttributeValue::N("3".into()))
                            .build()
                            .expect("update"),
                    )
                    .build(),
            )
            .send()
    };
    assert!(guarded("token-3").await.is_err(), "n is 2: cancelled");
    send("token-4", "1").await.expect("n to 3");
    guarded("token-3").await.expect("now the condition holds");
    assert_eq!(n().await.as_deref(), Some("4"));
}

#[tokio::test]
async fn a_transactions_token_is_forgotten_after_its_window_as_dynamodb_forgets_it() {
    // DynamoDB remembers a committed token for 10 minutes; this emulator for 1 s. Within
    // the window the same request replays the first answer; after it, the same token
    // runs the transaction again as a new one.
    let emulator = onegrant_local::emulator::Emulator::start_with(
        true,
        &[("ONEGRANT_EMULATOR_TOKEN_WINDOW_SECONDS", "1")],
    )
    .expect("an emulator with a short token window");
    let table = TestTable::create_on(emulator.endpoint()).await;
    let send = || {
        table
            .client
            .transact_write_items()
            .client_request_token("token-window")
            .transact_items(increment(&table, "W", "1"))
            .send()
    };
    let n = || counter(&table, "W");
    send().await.expect("first");
    send().await.expect("replayed within the window");
    assert_eq!(n().await.as_deref(), Some("1"));
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    send().await.expect("run again after the window");
    assert_eq!(n().await.as_deref(), Some("2"));
}

/// The launcher answers an index query from the items matching its partition key only
/// (moto sorts the whole table first): the answer must still be DynamoDB's — only the
/// items on that index partition, in the index's order (due instant, then the table's
/// keys), paged both ways, and nothing from an item without the index's sort key.
#[tokio::test]
async fn an_index_query_answers_its_partition_in_order_paged_both_ways() {
    let table = TestTable::create().await;
    let mut expected: Vec<(i64, String, String)> = Vec::new();
    for i in 0..60_i64 {
        let pk = format!("USER#{}", i % 7);
        let sk = format!("ITEM#{i:03}");
        let mut put = table
            .client
            .put_item()
            .table_name(&table.name)
            .item("pk", s(&pk))
            .item("sk", s(&sk));
        // Every third item is on partition DUE#1 (due instants repeat, so the table's
        // keys break ties); some others on DUE#2; a few on DUE#1 with no sort key (not
        // on the index at all).
        if i % 3 == 0 {
            let due = (i * 7) % 10;
            put = put
                .item("due_pk", s("DUE#1"))
                .item("due_at", AttributeValue::N(due.to_string()));
            if due <= 6 {
                expected.push((due, pk.clone(), sk.clone()));
            }
        } else if i % 3 == 1 {
            put = put
                .item("due_pk", s("DUE#2"))
                .item("due_at", AttributeValue::N("1".into()));
        } else if i % 9 == 2 {
            put = put.item("due_pk", s("DUE#1"));
        }
        put.send().await.expect("put");
    }
    expected.sort();
    assert!(expected.len() >= 10, "enough to page");
    let query = |partition: &str, forward: bool| {
        let table = &table;
        let partition = partition.to_string();
        async move {
            let mut got = Vec::new();
            let mut start = None;
            loop {
                let page = table
                    .client
                    .query()
                    .table_name(&table.name)
                    .index_name("due")
                    .key_condition_expression("due_pk = :p AND due_at <= :n")
                    .expression_attribute_values(":p", s(&partition))
                    .expression_attribute_values(":n", AttributeValue::N("6".into()))
                    .scan_index_forward(forward)
                    .limit(3)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .expect("query");
                for item in page.items() {
                    let due = item
                        .get("due_at")
                        .and_then(|v| v.as_n().ok())
                        .and_then(|n| n.parse::<i64>().ok())
                        .expect("due_at projected");
                    let key = |name: &str| {
                        item.get(name)
                            .and_then(|v| v.as_s().ok())
                            .cloned()
                            .expect("key projected")
                    };
                    got.push((due, key("pk"), key("sk")));
                }
                start = page.last_evaluated_key().cloned();
                if start.is_none() {
                    return got;
                }
            }
        }
    };
    assert_eq!(query("DUE#1", true).await, expected);
    let mut backwards = expected.clone();
    backwards.reverse();
    assert_eq!(query("DUE#1", false).await, backwards);
    assert_eq!(query("DUE#3", true).await, Vec::new(), "an empty partition");
    assert_eq!(query("DUE#2", true).await.len(), 20);
}

/// The launcher writes plain attribute values straight into its answers instead of
/// through moto's model-driven walk (scripts/moto_serial.py): every kind of value,
/// nested ones and binaries (still moto's walk) included, reads back as it was written,
/// through every read an answer carries items in.
#[tokio::test]
async fn every_kind_of_attribute_value_reads_back_as_written_through_every_read() {
    use aws_sdk_dynamodb::primitives::Blob;
    use aws_sdk_dynamodb::types::{KeysAndAttributes, ReturnValuesOnConditionCheckFailure};
    use std::collections::HashMap;

    let table = TestTable::create().await;
    let nested = AttributeValue::M(HashMap::from([
        ("s".to_string(), s("内层 \"quoted\" \\ text")),
        ("n".to_string(), AttributeValue::N("-12.5e3".into())),
        (
            "l".to_string(),
            AttributeValue::L(vec![
                AttributeValue::Bool(false),
                AttributeValue::Null(true),
                AttributeValue::Ss(vec!["x".into(), "y".into()]),
            ]),
        ),
        (
            "b".to_string(),
            AttributeValue::B(Blob::new(vec![0u8, 159, 255])),
        ),
    ]));
    let item: HashMap<String, AttributeValue> = HashMap::from([
        ("pk".to_string(), s("USER#kinds")),
        ("sk".to_string(), s("ITEM")),
        ("s".to_string(), s("订单 🚚 \u{0}")),
        (
            "n".to_string(),
            AttributeValue::N("12345678901234567890".into()),
        ),
        ("t".to_string(), AttributeValue::Bool(true)),
        ("z".to_string(), AttributeValue::Null(true)),
        (
            "ss".to_string(),
            AttributeValue::Ss(vec!["a".into(), "b".into()]),
        ),
        (
            "ns".to_string(),
            AttributeValue::Ns(vec!["1".into(), "2.5".into()]),
        ),
        (
            "b".to_string(),
            AttributeValue::B(Blob::new(b"\x01binary".to_vec())),
        ),
        (
            "bs".to_string(),
            AttributeValue::Bs(vec![Blob::new(vec![1u8]), Blob::new(vec![2u8])]),
        ),
        ("m".to_string(), nested.clone()),
        ("l".to_string(), AttributeValue::L(vec![nested, s("end")])),
        ("empty".to_string(), AttributeValue::L(Vec::new())),
    ]);
    table
        .client
        .put_item()
        .table_name(&table.name)
        .set_item(Some(item.clone()))
        .send()
        .await
        .expect("put");
    let key = HashMap::from([
        ("pk".to_string(), s("USER#kinds")),
        ("sk".to_string(), s("ITEM")),
    ]);
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    // Sets come back in any order, as DynamoDB's do.
    let normal = |mut i: HashMap<String, AttributeValue>| {
        for v in i.values_mut() {
            match v {
                AttributeValue::Ss(set) | AttributeValue::Ns(set) => *set = sorted(set.clone()),
                AttributeValue::Bs(set) => set.sort_by(|a, b| a.as_ref().cmp(b.as_ref())),
                _ => {}
            }
        }
        i
    };
    let want = normal(item.clone());
    let got = table
        .client
        .get_item()
        .table_name(&table.name)
        .set_key(Some(key.clone()))
        .send()
        .await
        .expect("get")
        .item
        .expect("the item");
    assert_eq!(normal(got), want, "GetItem");
    let queried = table
        .client
        .query()
        .table_name(&table.name)
        .key_condition_expression("pk = :p")
        .expression_attribute_values(":p", s("USER#kinds"))
        .send()
        .await
        .expect("query")
        .items
        .unwrap_or_default();
    assert_eq!(
        queried.into_iter().map(normal).collect::<Vec<_>>(),
        vec![want.clone()],
        "Query"
    );
    let scanned = table
        .client
        .scan()
        .table_name(&table.name)
        .send()
        .await
        .expect("scan")
        .items
        .unwrap_or_default();
    assert_eq!(
        scanned.into_iter().map(normal).collect::<Vec<_>>(),
        vec![want.clone()],
        "Scan"
    );
    let batch = table
        .client
        .batch_get_item()
        .request_items(
            &table.name,
            KeysAndAttributes::builder()
                .keys(key.clone())
                .build()
                .expect("keys"),
        )
        .send()
        .await
        .expect("batch get");
    let batched = batch
        .responses
        .and_then(|mut r| r.remove(&table.name))
        .unwrap_or_default();
    assert_eq!(
        batched.into_iter().map(normal).collect::<Vec<_>>(),
        vec![want.clone()],
        "BatchGetItem"
    );
    // The old item a refused write answers with.
    let refused = table
        .client
        .put_item()
        .table_name(&table.name)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(pk)")
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .send()
        .await
        .expect_err("the item exists");
    let old = refused
        .as_service_error()
        .and_then(|e| match e {
            aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c) => {
                c.item().cloned()
            }
            _ => None,
        })
        .expect("ALL_OLD on the refusal");
    assert_eq!(normal(old), want, "ALL_OLD");
}
