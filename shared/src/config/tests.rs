use super::*;
use std::collections::HashMap;

fn env() -> HashMap<&'static str, String> {
    HashMap::from([
        ("TABLE_NAME", "t".to_string()),
        ("WECHAT_APPID", "wx1".to_string()),
        ("WECHAT_SECRET", "very-secret-value".to_string()),
        ("SESSION_SECRET", "s".repeat(32)),
        (
            "ONEGRANT_TEMPLATES",
            r#"[{"id":"T","title":"t","keywords":[{"key":"thing1"}]}]"#.to_string(),
        ),
        (
            "ONEGRANT_REMINDERS",
            r#"[{"kind":"water","template_id":"T","content":{"thing1":"drink"}}]"#.to_string(),
        ),
    ])
}

#[test]
fn a_complete_environment_parses_with_defaults() {
    let e = env();
    let c = Config::from_lookup(|k| e.get(k).cloned()).expect("valid config");
    assert_eq!(c.wechat.api_base, "https://api.weixin.qq.com");
    assert_eq!(c.wechat.timeout, Duration::from_millis(3000));
    assert_eq!(c.session.ttl, Duration::from_secs(7200));
    assert_eq!(c.wechat.miniprogram_state, MiniprogramState::Formal);
    assert_eq!(c.limits, Limits::default());
    assert_eq!(c.limits.retention.grants, chrono::Duration::days(400));
}

#[test]
fn the_message_push_is_optional_and_checked_when_set() {
    let e = env();
    let c = Config::from_lookup(|k| e.get(k).cloned()).expect("valid config");
    assert_eq!(c.push, None);
    let with = |pairs: &[(&'static str, &str)]| {
        let mut e = env();
        e.insert("WECHAT_PUSH_TOKEN", "token".into());
        e.insert("WECHAT_ORIGINAL_ID", "gh_123456789abc".into());
        for (k, v) in pairs {
            e.insert(k, v.to_string());
        }
        Config::from_lookup(|k| e.get(k).cloned())
    };
    let safe = with(&[("WECHAT_PUSH_AES_KEY", &"A".repeat(43))]).expect("safe");
    let push = safe.push.expect("push");
    assert_eq!(push.mode, PushMode::Safe);
    assert_eq!(push.format, crate::domain::callback::Format::Xml);
    assert_eq!(push.original_id, "gh_123456789abc");
    let plain = with(&[
        ("WECHAT_PUSH_MODE", "plain"),
        ("WECHAT_PUSH_INSECURE_PLAIN", "true"),
        ("WECHAT_PUSH_FORMAT", "json"),
    ])
    .expect("plain needs no key");
    assert_eq!(plain.push.map(|p| p.mode), Some(PushMode::Plain));
    let key = "A".repeat(43);
    for (pairs, name) in [
        (vec![], "WECHAT_PUSH_AES_KEY"),
        (
            vec![("WECHAT_PUSH_AES_KEY", "short")],
            "WECHAT_PUSH_AES_KEY",
        ),
        (
            vec![(
                "WECHAT_PUSH_AES_KEY",
                "*******************************************",
            )],
            "WECHAT_PUSH_AES_KEY",
        ),
        (vec![("WECHAT_PUSH_MODE", "loud")], "WECHAT_PUSH_MODE"),
        // Plain mode only as the explicit insecure opt-in.
        (vec![("WECHAT_PUSH_MODE", "plain")], "WECHAT_PUSH_MODE"),
        (
            vec![
                ("WECHAT_PUSH_MODE", "plain"),
                ("WECHAT_PUSH_INSECURE_PLAIN", "yes"),
            ],
            "WECHAT_PUSH_MODE",
        ),
        (
            vec![
                ("WECHAT_PUSH_AES_KEY", key.as_str()),
                ("WECHAT_ORIGINAL_ID", ""),
            ],
            "WECHAT_ORIGINAL_ID",
        ),
        (
            vec![
                ("WECHAT_PUSH_AES_KEY", key.as_str()),
                ("WECHAT_ORIGINAL_ID", "wx1234"),
            ],
            "WECHAT_ORIGINAL_ID",
        ),
        (
            vec![
                ("WECHAT_PUSH_MODE", "plain"),
                ("WECHAT_PUSH_INSECURE_PLAIN", "true"),
                ("WECHAT_PUSH_FORMAT", "yaml"),
            ],
            "WECHAT_PUSH_FORMAT",
        ),
    ] {
        let err = with(&pairs).expect_err("must fail");
        assert!(err.to_string().contains(name), "{pairs:?}: {err}");
    }
    let printed = format!("{:?}", with(&[("WECHAT_PUSH_AES_KEY", &"Z".repeat(43))]));
    assert!(!printed.contains("ZZZZ") && !printed.contains("token\""));
}

#[test]
fn retention_and_guards_are_configurable() {
    let mut e = env();
    e.insert("RETENTION_READ_NOTES_DAYS", "7".into());
    e.insert("RETENTION_OUTBOX_DAYS", "3".into());
    e.insert("MAX_OPEN_GRANTS", "5".into());
    e.insert("REPORTS_PER_MINUTE", "2".into());
    e.insert("CHANGES_PER_MINUTE", "7".into());
    e.insert("PUSHES_PENDING_MAX", "3".into());
    e.insert("READS_PER_MINUTE", "9".into());
    let c = Config::from_lookup(|k| e.get(k).cloned()).expect("valid config");
    assert_eq!(c.limits.retention.read_notes, chrono::Duration::days(7));
    assert_eq!(c.limits.retention.outbox, chrono::Duration::days(3));
    assert_eq!(c.limits.retention.deliveries, chrono::Duration::days(90));
    assert_eq!(c.limits.max_open_grants, 5);
    assert_eq!(c.limits.reports_per_minute, 2);
    assert_eq!(c.limits.changes_per_minute, 7);
    assert_eq!(c.limits.pushes_pending_max, 3);
    assert_eq!(c.limits.reads_per_minute, 9);
}

#[test]
fn workers_never_outnumber_what_the_reserved_concurrency_leaves_room_for() {
    let with = |workers: &str, reserved: Option<&str>| {
        let mut e = env();
        e.insert("DISPATCH_WORKERS", workers.into());
        if let Some(reserved) = reserved {
            e.insert("DISPATCHER_RESERVED_CONCURRENCY", reserved.into());
        }
        let c = Config::from_lookup(|k| e.get(k).cloned()).expect("valid config");
        (c.dispatch.workers, c.dispatch.workers_configured)
    };
    assert_eq!(with("8", None), (8, None));
    assert_eq!(with("8", Some("10")), (8, None));
    assert_eq!(with("8", Some("9")), (7, Some(8)));
    assert_eq!(with("4", Some("3")), (1, Some(4)));
    assert_eq!(with("1", Some("1")), (1, None));
    assert_eq!(with("8", Some("0")), (8, None), "0: nothing reserved");
    let mut e = env();
    e.insert("DISPATCHER_RESERVED_CONCURRENCY", "none".into());
    assert!(Config::from_lookup(|k| e.get(k).cloned()).is_err());
}

#[test]
fn secrets_never_appear_in_debug_output() {
    let e = env();
    let c = Config::from_lookup(|k| e.get(k).cloned()).expect("valid config");
    let printed = format!("{c:?}");
    assert!(!printed.contains("very-secret-value"));
    assert!(!printed.contains(&"s".repeat(32)));
}

#[test]
fn wechat_is_reached_over_https_and_plain_http_only_on_this_machine() {
    for (base, ok) in [
        ("https://api.weixin.qq.com", true),
        ("http://127.0.0.1:3002", true),
        ("http://localhost:3002/", true),
        ("http://[::1]:8080", true),
        ("http://api.weixin.qq.com", false),
        ("http://localhost.evil.com", false),
    ] {
        let mut e = env();
        e.insert("WECHAT_API_BASE", base.to_string());
        assert_eq!(
            Config::from_lookup(|k| e.get(k).cloned()).is_ok(),
            ok,
            "{base}"
        );
    }
}

#[test]
fn each_bad_variable_is_named() {
    let cases: Vec<(&str, Option<&str>, &str)> = vec![
        (
            "DISPATCH_LEASE_SECONDS",
            Some("1"),
            "DISPATCH_LEASE_SECONDS",
        ),
        ("ONEGRANT_REMINDERS", None, "ONEGRANT_REMINDERS"),
        (
            "ONEGRANT_REMINDERS",
            Some(r#"[{"kind":"tea","template_id":"T"}]"#),
            "ONEGRANT_REMINDERS",
        ),
        ("DUE_SHARDS", Some("0"), "DUE_SHARDS"),
        ("TABLE_NAME", None, "TABLE_NAME"),
        ("SESSION_SECRET", Some("short"), "SESSION_SECRET"),
        ("MINIPROGRAM_STATE", Some("prod"), "MINIPROGRAM_STATE"),
        ("WECHAT_TIMEOUT_MS", Some("0"), "WECHAT_TIMEOUT_MS"),
        ("ONEGRANT_TEMPLATES", Some("{"), "ONEGRANT_TEMPLATES"),
        ("RETENTION_GRANTS_DAYS", Some("0"), "RETENTION_GRANTS_DAYS"),
        (
            "RETENTION_READ_NOTES_DAYS",
            Some("6"),
            "RETENTION_READ_NOTES_DAYS",
        ),
        (
            "RETENTION_EVENTS_DAYS",
            Some("ten"),
            "RETENTION_EVENTS_DAYS",
        ),
        ("MAX_OPEN_GRANTS", Some("1001"), "MAX_OPEN_GRANTS"),
        ("REPORTS_PER_MINUTE", Some("0"), "REPORTS_PER_MINUTE"),
        ("CHANGES_PER_MINUTE", Some("601"), "CHANGES_PER_MINUTE"),
        ("PUSHES_PENDING_MAX", Some("0"), "PUSHES_PENDING_MAX"),
        ("READS_PER_MINUTE", Some("6001"), "READS_PER_MINUTE"),
        (
            "WECHAT_API_BASE",
            Some("http://api.weixin.qq.com"),
            "WECHAT_API_BASE",
        ),
        (
            "WECHAT_API_BASE",
            Some("http://127.0.0.1.evil.com"),
            "WECHAT_API_BASE",
        ),
        (
            "WECHAT_API_BASE",
            Some("http://localhost@evil.com"),
            "WECHAT_API_BASE",
        ),
        (
            "WECHAT_API_BASE",
            Some("ftp://127.0.0.1"),
            "WECHAT_API_BASE",
        ),
        ("HANDLER_BUDGET_MS", Some("500"), "HANDLER_BUDGET_MS"),
        ("NOTIFY_SOURCES", Some("ok,bad#source"), "NOTIFY_SOURCES"),
    ];
    for (name, value, want) in cases {
        let mut e = env();
        match value {
            Some(v) => e.insert(name, v.to_string()),
            None => e.remove(name),
        };
        let err = Config::from_lookup(|k| e.get(k).cloned()).expect_err("must fail");
        assert!(err.to_string().contains(want), "{name}: {err}");
    }
}

#[test]
fn the_origin_secret_is_optional_and_as_long_as_a_session_key() {
    let e = env();
    let c = Config::from_lookup(|k| e.get(k).cloned()).expect("valid config");
    assert_eq!(c.origin, None);
    let with = |value: &str| {
        let mut e = env();
        e.insert("ORIGIN_SECRET", value.to_string());
        Config::from_lookup(|k| e.get(k).cloned())
    };
    let err = with("short").expect_err("a short origin secret");
    assert!(err.to_string().contains("ORIGIN_SECRET"), "{err}");
    let c = with(&"o".repeat(64)).expect("a long one");
    assert!(c.origin_enforced, "enforced unless told");
    assert_eq!(c.origin.map(|o| o.expose().len()), Some(64));
    let check = |value: &str| {
        let mut e = env();
        e.insert("ORIGIN_CHECK", value.to_string());
        Config::from_lookup(|k| e.get(k).cloned())
    };
    assert!(!check("count").expect("count").origin_enforced);
    assert!(check("enforce").expect("enforce").origin_enforced);
    let err = check("off").expect_err("neither");
    assert!(err.to_string().contains("ORIGIN_CHECK"), "{err}");
}
