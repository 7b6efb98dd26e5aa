//! Reads `template.yaml`, the single source of truth for the table definition and the
//! HTTP routes, so the local stack and the tests build exactly what SAM deploys.
//!
//! The file is compiled in (`include_str!`), so the binaries work from any directory.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use serde_yaml_ng::Value;

/// The SAM template, as committed.
pub const TEMPLATE_YAML: &str = include_str!("../../template.yaml");

/// One HTTP route a function serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub method: String,
    /// API Gateway path template, e.g. `/v1/reminders/{kind}`.
    pub path: String,
    /// The function's logical id in the template, e.g. `GrantsFunction`.
    pub function: String,
    /// The function's binary (cargo-lambda `Binary`), e.g. `grants`.
    pub binary: String,
}

/// A function and how it is triggered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    pub logical_id: String,
    pub binary: String,
    pub http: bool,
}

/// The template, parsed once per process (it is compiled in, so it never changes;
/// every test's table and routers read it).
fn parse() -> anyhow::Result<&'static Value> {
    static PARSED: std::sync::OnceLock<Result<Value, String>> = std::sync::OnceLock::new();
    PARSED
        .get_or_init(|| serde_yaml_ng::from_str(TEMPLATE_YAML).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("template.yaml does not parse: {e}"))
}

fn resources(doc: &Value) -> anyhow::Result<Vec<(String, &Value)>> {
    let map = doc
        .get("Resources")
        .and_then(Value::as_mapping)
        .ok_or_else(|| anyhow::anyhow!("template.yaml has no Resources"))?;
    Ok(map
        .iter()
        .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v)))
        .collect())
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(value, |v, key| v.get(*key))
        .and_then(Value::as_str)
}

/// The `dynamodb:*` actions the template's policies grant the function built as
/// `binary` (action names without the prefix): on the table, the action's name; on an
/// index (`!Sub "${Table.Arn}/index/<name>"`), `<action>@<name>`, one for each index
/// named, so a query of an index the policy does not name is not taken as granted.
pub fn dynamodb_actions(binary: &str) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let doc = parse()?;
    let mut actions = std::collections::BTreeSet::new();
    for (_, resource) in resources(doc)? {
        if str_at(resource, &["Metadata", "BuildProperties", "Binary"]) != Some(binary) {
            continue;
        }
        let policies = resource
            .get("Properties")
            .and_then(|p| p.get("Policies"))
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten();
        for policy in policies {
            let statements = policy
                .get("Statement")
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten();
            for statement in statements {
                let listed: Vec<&str> = match statement.get("Action") {
                    Some(Value::Sequence(list)) => list.iter().filter_map(Value::as_str).collect(),
                    Some(Value::String(one)) => vec![one.as_str()],
                    _ => Vec::new(),
                };
                let on = statement_resources(statement);
                for action in listed {
                    if let Some(name) = action.strip_prefix("dynamodb:") {
                        for index in &on {
                            actions.insert(match index {
                                Some(index) => format!("{name}@{index}"),
                                None => name.to_string(),
                            });
                        }
                    }
                }
            }
        }
    }
    Ok(actions)
}

/// What a policy statement's `Resource` names: `Some(index)` for each of the table's
/// indexes (`!Sub "${Table.Arn}/index/<name>"`), `None` for anything else (the table).
fn statement_resources(statement: &Value) -> Vec<Option<String>> {
    let one = |value: &Value| match value {
        Value::Tagged(tagged) => tagged
            .value
            .as_str()
            .and_then(|arn| arn.split_once("/index/"))
            .map(|(_, index)| index.to_string()),
        _ => None,
    };
    match statement.get("Resource") {
        Some(Value::Sequence(list)) => list.iter().map(one).collect(),
        Some(value) => vec![one(value)],
        None => vec![None],
    }
}

/// Every Lambda function in the template.
pub fn functions() -> anyhow::Result<Vec<Function>> {
    let doc = parse()?;
    let mut out = Vec::new();
    for (id, resource) in resources(doc)? {
        if str_at(resource, &["Type"]) != Some("AWS::Serverless::Function") {
            continue;
        }
        let binary = str_at(resource, &["Metadata", "BuildProperties", "Binary"])
            .ok_or_else(|| anyhow::anyhow!("{id} has no Metadata.BuildProperties.Binary"))?;
        let http = resource
            .get("Properties")
            .and_then(|p| p.get("Events"))
            .and_then(Value::as_mapping)
            .is_some_and(|events| {
                events
                    .values()
                    .any(|e| str_at(e, &["Type"]) == Some("HttpApi"))
            });
        out.push(Function {
            logical_id: id,
            binary: binary.to_string(),
            http,
        });
    }
    Ok(out)
}

/// Every `HttpApi` route in the template.
pub fn routes() -> anyhow::Result<Vec<Route>> {
    let doc = parse()?;
    let mut out = Vec::new();
    for (id, resource) in resources(doc)? {
        if str_at(resource, &["Type"]) != Some("AWS::Serverless::Function") {
            continue;
        }
        let Some(binary) = str_at(resource, &["Metadata", "BuildProperties", "Binary"]) else {
            continue;
        };
        let Some(events) = resource
            .get("Properties")
            .and_then(|p| p.get("Events"))
            .and_then(Value::as_mapping)
        else {
            continue;
        };
        for event in events.values() {
            if str_at(event, &["Type"]) != Some("HttpApi") {
                continue;
            }
            let method = str_at(event, &["Properties", "Method"])
                .ok_or_else(|| anyhow::anyhow!("{id}: HttpApi event without Method"))?;
            let path = str_at(event, &["Properties", "Path"])
                .ok_or_else(|| anyhow::anyhow!("{id}: HttpApi event without Path"))?;
            out.push(Route {
                method: method.to_uppercase(),
                path: path.to_string(),
                function: id.clone(),
                binary: binary.to_string(),
            });
        }
    }
    Ok(out)
}

/// Creates `table_name` exactly as the template's `AWS::DynamoDB::Table` declares it
/// (keys, attribute types, GSIs and projections, billing mode, TTL attribute).
pub async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    table_name: &str,
) -> anyhow::Result<()> {
    let doc = parse()?;
    let (_, table) = resources(doc)?
        .into_iter()
        .find(|(_, r)| str_at(r, &["Type"]) == Some("AWS::DynamoDB::Table"))
        .ok_or_else(|| anyhow::anyhow!("template.yaml declares no table"))?;
    let props = table
        .get("Properties")
        .ok_or_else(|| anyhow::anyhow!("table without Properties"))?;

    let key_schema = |v: &Value| -> anyhow::Result<Vec<KeySchemaElement>> {
        v.as_sequence()
            .ok_or_else(|| anyhow::anyhow!("KeySchema is not a list"))?
            .iter()
            .map(|k| {
                let name = str_at(k, &["AttributeName"])
                    .ok_or_else(|| anyhow::anyhow!("key without name"))?;
                let kind = match str_at(k, &["KeyType"]) {
                    Some("HASH") => KeyType::Hash,
                    Some("RANGE") => KeyType::Range,
                    other => anyhow::bail!("unknown KeyType {other:?}"),
                };
                Ok(KeySchemaElement::builder()
                    .attribute_name(name)
                    .key_type(kind)
                    .build()?)
            })
            .collect()
    };

    let mut request = client.create_table().table_name(table_name);
    for def in props
        .get("AttributeDefinitions")
        .and_then(Value::as_sequence)
        .ok_or_else(|| anyhow::anyhow!("no AttributeDefinitions"))?
    {
        let name = str_at(def, &["AttributeName"])
            .ok_or_else(|| anyhow::anyhow!("attribute without name"))?;
        let kind = match str_at(def, &["AttributeType"]) {
            Some("S") => ScalarAttributeType::S,
            Some("N") => ScalarAttributeType::N,
            Some("B") => ScalarAttributeType::B,
            other => anyhow::bail!("unknown AttributeType {other:?}"),
        };
        request = request.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(kind)
                .build()?,
        );
    }
    request = request.set_key_schema(Some(key_schema(
        props
            .get("KeySchema")
            .ok_or_else(|| anyhow::anyhow!("no KeySchema"))?,
    )?));
    if let Some(indexes) = props
        .get("GlobalSecondaryIndexes")
        .and_then(Value::as_sequence)
    {
        for index in indexes {
            let name =
                str_at(index, &["IndexName"]).ok_or_else(|| anyhow::anyhow!("GSI without name"))?;
            let projection = match str_at(index, &["Projection", "ProjectionType"]) {
                Some("KEYS_ONLY") => ProjectionType::KeysOnly,
                Some("ALL") => ProjectionType::All,
                Some("INCLUDE") => ProjectionType::Include,
                other => anyhow::bail!("unknown ProjectionType {other:?}"),
            };
            request = request.global_secondary_indexes(
                GlobalSecondaryIndex::builder()
                    .index_name(name)
                    .set_key_schema(Some(key_schema(
                        index
                            .get("KeySchema")
                            .ok_or_else(|| anyhow::anyhow!("GSI without KeySchema"))?,
                    )?))
                    .projection(
                        Projection::builder()
                            .projection_type(projection)
                            .set_non_key_attributes(
                                index
                                    .get("Projection")
                                    .and_then(|p| p.get("NonKeyAttributes"))
                                    .and_then(Value::as_sequence)
                                    .map(|names| {
                                        names
                                            .iter()
                                            .filter_map(Value::as_str)
                                            .map(str::to_string)
                                            .collect()
                                    }),
                            )
                            .build(),
                    )
                    .build()?,
            );
        }
    }
    match str_at(props, &["BillingMode"]) {
        Some("PAY_PER_REQUEST") => request = request.billing_mode(BillingMode::PayPerRequest),
        other => anyhow::bail!("the local stack supports PAY_PER_REQUEST only, not {other:?}"),
    }
    request.send().await?;

    if let Some(ttl) = str_at(props, &["TimeToLiveSpecification", "AttributeName"]) {
        client
            .update_time_to_live()
            .table_name(table_name)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name(ttl)
                    .enabled(true)
                    .build()?,
            )
            .send()
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_declares_the_session_and_grants_routes() {
        let routes = routes().expect("template parses");
        let declared: Vec<_> = routes
            .iter()
            .map(|r| (r.method.as_str(), r.path.as_str(), r.binary.as_str()))
            .collect();
        assert!(declared.contains(&("POST", "/v1/session", "session")));
        assert!(declared.contains(&("POST", "/v1/grants", "grants")));
        assert!(declared.contains(&("GET", "/v1/grants", "grants")));
    }
}
