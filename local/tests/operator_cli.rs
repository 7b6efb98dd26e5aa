//! `onegrant-export` and `onegrant-erase`, the operator's ways to give a user a copy of
//! their data and to forget them, against a running local stack: the same copy as
//! `GET /v1/me/export`, the same erasure as `DELETE /v1/me` — the user's old token
//! refused at once, their partition emptied — and bad inputs refused with nothing
//! changed.

mod common;

use std::process::Command;

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{Value, json};

/// The emulator's address and the table, as `onegrant-local` printed them.
fn dynamodb(printed: &[String]) -> (String, String) {
    let line = printed
        .iter()
        .find(|l| l.trim_start().starts_with("DynamoDB"))
        .expect("the stack printed its DynamoDB address");
    let mut words = line.split_whitespace().skip(1);
    let endpoint = words.next().expect("an address").to_string();
    let table = line
        .split("(table ")
        .nth(1)
        .and_then(|rest| rest.split([')', ',']).next())
        .expect("a table")
        .trim()
        .to_string();
    (endpoint, table)
}

fn erase(endpoint: &str, table: &str, args: &[&str]) -> (bool, String) {
    operator(env!("CARGO_BIN_EXE_onegrant-erase"), endpoint, table, args)
}

fn operator(bin: &str, endpoint: &str, table: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin)
        .args(args)
        .env("TABLE_NAME", table)
        .env("AWS_ENDPOINT_URL_DYNAMODB", endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("OPENID_SALT")
        .output()
        .expect("onegrant-erase runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn an_operator_erases_a_user_by_openid() {
    // (No ticks of its own: the test writes the dispatcher's shard registry.)
    let mut stack = common::start_local(&[("ONEGRANT_LOCAL_TICK_SECONDS", "0")]);
    let (endpoint, table) = dynamodb(&stack.printed);
    let http = onegrant::aws::http_client_builder()
        .build()
        .expect("an HTTP client");
    let standin = format!("http://127.0.0.1:{}", stack.standin);
    let api = format!("http://127.0.0.1:{}", stack.api);
    let login: Value = http
        .post(format!("{standin}/control/login-codes"))
        .json(&json!({"user": "erin"}))
        .send()
        .await
        .expect("stand-in")
        .json()
        .await
        .expect("json");
    let openid = login["openid"].as_str().expect("openid").to_string();
    let session: Value = http
        .post(format!("{api}/v1/session"))
        .json(&json!({"code": login["code"]}))
        .send()
        .await
        .expect("session")
        .json()
        .await
        .expect("json");
    let token = session["token"].as_str().expect("token").to_string();
    let saved = http
        .put(format!("{api}/v1/preferences"))
        .bearer_auth(&token)
        .body(r#"{"quiet_hours": null, "muted_types": ["marketing"]}"#)
        .send()
        .await
        .expect("preferences");
    assert_eq!(saved.status().as_u16(), 200);

    let db = onegrant::aws::local_dynamodb_client(&endpoint);
    let partition = |db: aws_sdk_dynamodb::Client| {
        let (table, pk) = (table.clone(), format!("USER#{openid}"));
        async move {
            db.query()
                .table_name(table)
                .key_condition_expression("pk = :pk")
                .expression_attribute_values(":pk", AttributeValue::S(pk))
                .send()
                .await
                .expect("query")
                .count()
        }
    };
    assert!(partition(db.clone()).await > 0, "the user has items");

    // A copy first: her preferences among the lines, no table plumbing.
    let export = env!("CARGO_BIN_EXE_onegrant-export");
    let (ok, printed) = operator(export, &endpoint, &table, &[&openid]);
    assert!(ok, "{printed}");
    let lines: Vec<Value> = printed
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let prefs = lines
        .iter()
        .find(|l| l["kind"] == "preferences")
        .expect("her preferences");
    assert_eq!(prefs["muted_types"], json!(["marketing"]));
    assert!(lines.iter().all(|l| l.get("pk").is_none()), "{printed}");
    for args in [
        vec![],
        vec!["not an openid#"],
        vec![openid.as_str(), "--what"],
    ] {
        let (ok, printed) = operator(export, &endpoint, &table, &args);
        assert!(!ok, "{args:?}: {printed}");
    }

    // Bad inputs: refused, nothing changed.
    for args in [
        vec![],
        vec!["not an openid#"],
        vec![openid.as_str(), "--what"],
    ] {
        let (ok, printed) = erase(&endpoint, &table, &args);
        assert!(!ok, "{args:?}: {printed}");
        assert!(
            printed.contains("usage") || printed.contains("openid"),
            "{args:?}: {printed}"
        );
    }
    let (ok, printed) = erase(&endpoint, &table, &[&openid, "--status"]);
    assert!(
        ok && printed.contains("no erasure of this user"),
        "{printed}"
    );
    assert!(partition(db.clone()).await > 0, "nothing changed");

    // Deployed with fewer shards than the default 16, drained down to them: the
    // erasure's due entry must land on a partition that dispatcher reads, not where
    // the default count would put it.
    use onegrant::store::keys::due_pk;
    let subject = onegrant::domain::erasure::subject(
        onegrant::config::DEFAULT_OPENID_SALT,
        &onegrant::domain::OpenId::parse(openid.clone()).expect("openid"),
    );
    let tombstone_pk = format!("ERASED#{subject}");
    let shards = (1..16u32)
        .find(|&n| due_pk(&tombstone_pk, "ERASED", 16) != due_pk(&tombstone_pk, "ERASED", n))
        .expect("a count whose partition differs");
    db.put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S("META".into()))
        .item("sk", AttributeValue::S("SHARDS".into()))
        .item("max_shards", AttributeValue::N(shards.to_string()))
        .item("current", AttributeValue::N(shards.to_string()))
        .item("current_since", AttributeValue::N("0".into()))
        .send()
        .await
        .expect("registry");
    let (ok, printed) = erase(&endpoint, &table, &[&openid, "--once"]);
    assert!(ok, "{printed}");
    assert!(printed.contains("erasure pending"), "{printed}");
    let tombstones = db
        .scan()
        .table_name(&table)
        .filter_expression("sk = :sk")
        .expression_attribute_values(":sk", AttributeValue::S("ERASED".into()))
        .send()
        .await
        .expect("scan");
    let due: Vec<_> = tombstones
        .items()
        .iter()
        .map(|t| t.get("due_pk").and_then(|v| v.as_s().ok()).cloned())
        .collect();
    assert_eq!(
        due,
        vec![Some(due_pk(&tombstone_pk, "ERASED", shards))],
        "under {shards} shards: {tombstones:?}"
    );
    assert_eq!(
        partition(db.clone()).await,
        0,
        "the partition is empty: {printed}"
    );
    let refused = http
        .get(format!("{api}/v1/preferences"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("preferences");
    assert_eq!(refused.status().as_u16(), 401);
    let (ok, printed) = erase(&endpoint, &table, &[&openid, "--status"]);
    assert!(ok && printed.contains("erasure pending"), "{printed}");
    let _ = stack.child.kill();
    let _ = stack.child.wait();
}
