//! Checks over the stored items, run after a test: the ledger agrees with the
//! counters, every plan is in one consistent state, none is stuck sending.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

use crate::support::app::TestApp;

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
