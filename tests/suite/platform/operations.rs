//! The stack's alarms and dashboard watch metrics the code really writes: every
//! `onegrant` metric they name is one of `onegrant::metrics::ALL`, the names the
//! functions record with (one list, in one place).

use onegrant::metrics::{ALL, NAMESPACE, dimensions};
use serde_yaml_ng::Value;

fn template() -> Value {
    serde_yaml_ng::from_str(onegrant_local::template::TEMPLATE_YAML).expect("template parses")
}

/// `value` itself, or what a `!Sub`/`!If` tag wraps.
fn untagged(value: &Value) -> &Value {
    match value {
        Value::Tagged(tagged) => &tagged.value,
        other => other,
    }
}

#[test]
fn every_onegrant_metric_an_alarm_or_the_dashboard_names_is_one_the_code_writes() {
    let doc = template();
    let resources = doc["Resources"].as_mapping().expect("resources");
    let mut alarms = 0;
    for (id, resource) in resources {
        if resource["Type"].as_str() != Some("AWS::CloudWatch::Alarm") {
            continue;
        }
        let properties = &resource["Properties"];
        // (metric name, its dimension names) of each onegrant metric the alarm reads.
        let names = |m: &Value| -> (String, Vec<String>) {
            let dims = m["Dimensions"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(|d| d["Name"].as_str().map(str::to_string))
                .collect();
            (
                m["MetricName"].as_str().unwrap_or_default().to_string(),
                dims,
            )
        };
        let mut named = Vec::new();
        if properties["Namespace"].as_str() == Some(NAMESPACE) {
            named.push(names(properties));
        }
        for metric in properties["Metrics"].as_sequence().into_iter().flatten() {
            let stat = &metric["MetricStat"]["Metric"];
            if stat["Namespace"].as_str() == Some(NAMESPACE) {
                named.push(names(stat));
            }
        }
        for (name, dims) in &named {
            assert!(
                ALL.contains(&name.as_str()),
                "{id:?} alarms on {name}, which no function writes"
            );
            assert_eq!(
                dims,
                &dimensions(name),
                "{id:?}: {name} is written with exactly these dimensions"
            );
            alarms += 1;
        }
    }
    assert!(alarms >= 4, "the onegrant alarms were read ({alarms})");

    let body = resources
        .iter()
        .find(|(_, r)| r["Type"].as_str() == Some("AWS::CloudWatch::Dashboard"))
        .map(|(_, r)| untagged(&r["Properties"]["DashboardBody"]))
        .and_then(Value::as_str)
        .expect("a dashboard");
    // `${…}` substitutions become plain strings for the JSON parser.
    let mut plain = String::new();
    let mut rest = body;
    while let Some(start) = rest.find("${") {
        plain.push_str(&rest[..start]);
        let end = rest[start..]
            .find('}')
            .map_or(rest.len(), |e| start + e + 1);
        plain.push_str("SUB");
        rest = &rest[end..];
    }
    plain.push_str(rest);
    let dashboard: serde_json::Value = serde_json::from_str(&plain).expect("the dashboard is JSON");
    let mut shown = 0;
    for widget in dashboard["widgets"].as_array().expect("widgets") {
        for metric in widget["properties"]["metrics"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if metric[0] == NAMESPACE {
                let name = metric[1].as_str().unwrap_or_default();
                assert!(
                    ALL.contains(&name),
                    "the dashboard shows {name}, which no function writes"
                );
                // Dimension names sit at 2, 4, …; a trailing object is the rendering.
                let dims: Vec<&str> = metric
                    .as_array()
                    .into_iter()
                    .flatten()
                    .skip(2)
                    .step_by(2)
                    .filter_map(serde_json::Value::as_str)
                    .collect();
                assert_eq!(
                    dims,
                    dimensions(name),
                    "the dashboard's {name} has exactly its dimensions"
                );
                shown += 1;
            }
        }
    }
    assert!(
        shown >= 10,
        "the dashboard's onegrant metrics were read ({shown})"
    );
}
