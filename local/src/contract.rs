//! The contract this deployment serves: `api/openapi.yaml` with what configuration
//! and the zone database decide filled in, so that every request it calls valid is
//! one the API takes. The file cannot know them: which template ids a report may
//! name (one not configured answers 422 `unknown_template`), which reminder kinds a
//! path may name (404 otherwise), and which zone names exist (422
//! `invalid_timezone` otherwise: exactly the IANA names the product's zone database
//! holds). The local stack serves it at [`PATH`]; the fuzzer runs over it.

use onegrant::domain::reminders::ReminderKinds;
use onegrant::domain::reminders::schedule::Timezone;
use onegrant::domain::template::Templates;
use serde_json::{Value, json};

/// Where the local stack serves it, beside the API's routes.
pub const PATH: &str = "/openapi.json";

const OPENAPI_YAML: &str = include_str!("../../api/openapi.yaml");

/// `api/openapi.yaml` for a deployment with `templates` and `kinds`.
pub fn deployment_contract(templates: &Templates, kinds: &ReminderKinds) -> anyhow::Result<Value> {
    let mut doc: Value = serde_yaml_ng::from_str(OPENAPI_YAML)?;
    let mut names: Vec<Value> = templates
        .iter()
        .map(|t| Value::from(t.id.as_str()))
        .collect();
    names.push(Value::from("errMsg"));
    let results = doc
        .pointer_mut("/components/schemas/GrantReport/properties/results")
        .ok_or_else(|| anyhow::anyhow!("the contract has no GrantReport results"))?;
    results["propertyNames"] = json!({"enum": names});
    let zone = doc
        .pointer_mut("/components/schemas/Timezone")
        .ok_or_else(|| anyhow::anyhow!("the contract has no Timezone"))?;
    *zone = json!({"type": "string", "enum": Timezone::names().collect::<Vec<_>>()});
    let kinds: Vec<&str> = kinds.iter().map(|k| k.name.as_str()).collect();
    let paths = doc
        .get_mut("paths")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| anyhow::anyhow!("the contract has no paths"))?;
    // Declared for a whole path or for one of its operations.
    for item in paths.values_mut().filter_map(Value::as_object_mut) {
        let mut lists: Vec<&mut Value> = Vec::new();
        for (name, value) in item.iter_mut() {
            if name == "parameters" {
                lists.push(value);
            } else if let Some(parameters) = value.get_mut("parameters") {
                lists.push(parameters);
            }
        }
        for parameter in lists.into_iter().filter_map(Value::as_array_mut).flatten() {
            if parameter["name"] == "kind" && parameter["in"] == "path" {
                parameter["schema"] = json!({"type": "string", "enum": kinds});
            }
        }
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_served_contract_names_the_configured_templates_kinds_and_every_zone() {
        let templates = Templates::from_json(include_str!("../../config/local.templates.json"))
            .expect("templates");
        let kinds = ReminderKinds::from_json(
            include_str!("../../config/local.reminders.json"),
            &templates,
        )
        .expect("kinds");
        let doc = deployment_contract(&templates, &kinds).expect("contract");
        let names = doc
            .pointer("/components/schemas/GrantReport/properties/results/propertyNames/enum")
            .and_then(Value::as_array)
            .expect("template ids");
        assert!(names.contains(&json!("tmpl_water_reminder")) && names.contains(&json!("errMsg")));
        assert_eq!(names.len(), templates.iter().count() + 1);
        let zones = doc
            .pointer("/components/schemas/Timezone/enum")
            .and_then(Value::as_array)
            .expect("zones");
        assert!(zones.len() > 400 && zones.contains(&json!("Asia/Shanghai")));
        for zone in zones {
            let name = zone.as_str().expect("a name");
            assert!(Timezone::parse(name).is_ok(), "{name} is taken");
        }
        // Every path parameter named kind lists exactly the kinds.
        let mut seen = 0;
        for item in doc["paths"].as_object().expect("paths").values() {
            let item = item.as_object().expect("an item");
            let lists = item.iter().map(|(name, value)| {
                if name == "parameters" {
                    value
                } else {
                    &value["parameters"]
                }
            });
            for parameter in lists.filter_map(Value::as_array).flatten() {
                if parameter["name"] == "kind" {
                    assert_eq!(parameter["schema"]["enum"], json!(["water"]));
                    seen += 1;
                }
            }
        }
        assert!(seen >= 2, "{seen} paths name a kind");
    }
}
