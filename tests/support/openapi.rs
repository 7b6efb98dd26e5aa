//! Checks real responses against `api/openapi.yaml`.
//!
//! Every call made through `TestApp::call` passes here: the (method, path, status)
//! must be documented, and the body must validate against the documented schema.

use std::sync::OnceLock;

use serde_json::{Value, json};

/// The committed contract.
pub const OPENAPI_YAML: &str = include_str!("../../api/openapi.yaml");

/// The contract as JSON.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| serde_yaml_ng::from_str(OPENAPI_YAML).expect("api/openapi.yaml parses"))
}

fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The documented path template that `path` (no query) falls under.
fn template_for(path: &str) -> Option<String> {
    let path = path.split('?').next().unwrap_or(path);
    let paths = document()["paths"].as_object()?;
    paths
        .keys()
        .find(|template| {
            let t: Vec<&str> = template.split('/').collect();
            let p: Vec<&str> = path.split('/').collect();
            t.len() == p.len()
                && t.iter().zip(&p).all(|(a, b)| {
                    a == b || (a.starts_with('{') && a.ends_with('}') && !b.is_empty())
                })
        })
        .cloned()
}

/// The validator of the schema at `pointer` in the contract, compiled once per process
/// (every call the suite makes is checked).
fn validator(pointer: &str) -> std::sync::Arc<jsonschema::Validator> {
    static COMPILED: OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<jsonschema::Validator>>>,
    > = OnceLock::new();
    let compiled = COMPILED.get_or_init(Default::default);
    if let Some(v) = compiled
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(pointer)
    {
        return v.clone();
    }
    let mut root = document().clone();
    // A URI fragment: percent-encode the path template's braces.
    let fragment = pointer.replace('{', "%7B").replace('}', "%7D");
    root["$ref"] = json!(format!("#{fragment}"));
    let v = std::sync::Arc::new(
        jsonschema::validator_for(&root).expect("the contract is a valid schema"),
    );
    compiled
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(pointer.to_string(), v.clone());
    v
}

/// Panics unless `body` is what the contract documents for `method path` → `status`.
pub fn assert_conforms(method: &str, path: &str, status: u16, body: &Value) {
    let doc = document();
    let template =
        template_for(path).unwrap_or_else(|| panic!("{path} is not in api/openapi.yaml"));
    let method = method.to_lowercase();
    let status_key = status.to_string();
    let mut pointer = format!(
        "/paths/{}/{}/responses/{}",
        escape(&template),
        method,
        status_key
    );
    let response = doc
        .pointer(&pointer)
        .unwrap_or_else(|| panic!("{method} {template} does not document status {status}: {body}"));
    if let Some(reference) = response.get("$ref").and_then(Value::as_str) {
        pointer = reference.trim_start_matches('#').to_string();
    }
    pointer.push_str("/content/application~1json/schema");
    assert!(
        doc.pointer(&pointer).is_some(),
        "{method} {template} {status} documents no JSON body"
    );
    let validator = validator(&pointer);
    let errors: Vec<String> = validator.iter_errors(body).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{method} {path} {status} does not match api/openapi.yaml: {errors:?}\nbody: {body}"
    );
}
