//! Tracing set-up and log-safe identifiers.
//!
//! In Lambda (`AWS_LAMBDA_FUNCTION_NAME` set) logs are JSON lines so CloudWatch Logs
//! Insights can query fields; locally they are human-readable. Openids are personal data:
//! logs carry [`openid_hash`], never the openid itself.

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the global subscriber once. `RUST_LOG` (or `AWS_LAMBDA_LOG_LEVEL`) sets the
/// level, as a level (`info`) or per target (`warn,onegrant=debug`); anything
/// unreadable means `info`. Only onegrant's own crates go below `info`: every other
/// crate is pinned at `info` or above, whatever is asked (see [`log_filter`]).
pub fn init() {
    let filter = log_filter(
        std::env::var("RUST_LOG").ok().as_deref(),
        std::env::var("AWS_LAMBDA_LOG_LEVEL").ok().as_deref(),
    );
    let registry = tracing_subscriber::registry().with(filter);
    let result = if std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some() {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .without_time()
                    .with_target(false),
            )
            .try_init()
    } else {
        registry
            .with(tracing_subscriber::fmt::layer().with_target(false))
            .try_init()
    };
    // A subscriber may already be installed (tests, the local stack): keep it.
    drop(result);
}

/// onegrant's own crates (their tracing targets): the only ones `RUST_LOG` may turn up
/// past `info`.
const OWN_CRATES: [&str; 10] = [
    "onegrant",
    "onegrant_local",
    "dispatcher",
    "grants",
    "inbox",
    "notify",
    "reminders",
    "session",
    "wechat_callback",
    "dispatch_once",
];

fn is_own(target: &str) -> bool {
    OWN_CRATES.iter().any(|own| {
        target == *own
            || target
                .strip_prefix(own)
                .is_some_and(|rest| rest.starts_with("::"))
    })
}

/// The filter `RUST_LOG` names (a level, or `warn,onegrant=debug`), else Lambda's
/// advanced logging level (`FATAL` is tracing's `error`), else `info`; with every
/// dependency crate pinned at `info` or above. At `debug` and `trace` the runtime, the
/// HTTP stack and the AWS SDK log raw events, requests and headers (an `Authorization`
/// bearer token, a login code, SigV4 material): those must never reach the logs.
pub fn log_filter(rust_log: Option<&str>, lambda_level: Option<&str>) -> Targets {
    pin_dependencies(&asked_filter(rust_log, lambda_level))
}

fn pin_dependencies(asked: &Targets) -> Targets {
    let cap = |level: LevelFilter| level.min(LevelFilter::INFO);
    let default = asked.default_level().unwrap_or(LevelFilter::INFO);
    let mut pinned = Targets::new().with_default(cap(default));
    for own in OWN_CRATES {
        if !asked.iter().any(|(target, _)| target == own) {
            pinned = pinned.with_target(own, default);
        }
    }
    for (target, level) in asked.iter() {
        let level = if is_own(target) { level } else { cap(level) };
        pinned = pinned.with_target(target.to_string(), level);
    }
    pinned
}

fn asked_filter(rust_log: Option<&str>, lambda_level: Option<&str>) -> Targets {
    rust_log
        .and_then(|f| f.parse::<Targets>().ok())
        .or_else(|| {
            let level = lambda_level?.to_lowercase();
            let level = if level == "fatal" {
                "error".into()
            } else {
                level
            };
            level.parse::<Targets>().ok()
        })
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO))
}

/// The salt of [`openid_hash`] (`OPENID_SALT`), set once a process has its config.
static OPENID_LOG_SALT: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Salts every later [`openid_hash`] with this deployment's `OPENID_SALT` (the first
/// call in a process wins).
pub fn salt_openid_tags(salt: &str) {
    let _ = OPENID_LOG_SALT.set(salt.to_string());
}

/// A short, stable, non-reversible tag for an openid, for log fields: HMAC-SHA256 under
/// the deployment's `OPENID_SALT`, so someone holding an openid and the logs cannot
/// link them without the salt (a plain hash would let them).
pub fn openid_hash(openid: &str) -> String {
    // (Before any config, in a tool or a test: a fixed salt.)
    let salt = OPENID_LOG_SALT.get().map_or("unconfigured", String::as_str);
    log_tag(salt, openid)
}

/// [`openid_hash`] under `salt`.
fn log_tag(salt: &str, openid: &str) -> String {
    use hmac::{Hmac, KeyInit, Mac};
    // A key of its own (not the erasure's tags under the same salt: a log line must
    // not name a tombstone).
    let Ok(mut mac) = Hmac::<sha2_jwt::Sha256>::new_from_slice(format!("log:{salt}").as_bytes())
    else {
        return String::new();
    };
    mac.update(openid.as_bytes());
    hex::encode(&mac.finalize().into_bytes()[..6])
}

/// An error and its whole source chain, for one log field.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut chain = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        chain.push_str(": ");
        chain.push_str(&s.to_string());
        source = s.source();
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn an_openid_is_logged_under_a_tag_only_its_deployment_makes() {
        let openid = "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o";
        let here = log_tag("salt-of-this-deployment", openid);
        // As docs/operations.md computes it: HMAC-SHA256 keyed "log:<salt>", 12 hex.
        assert_eq!(here, "31ceae5f33b4");
        assert_eq!(here, log_tag("salt-of-this-deployment", openid), "stable");
        assert_ne!(here, log_tag("salt-of-another-one", openid));
        assert_ne!(here, log_tag("salt-of-this-deployment", "oOther"));
        // Not the plain hash anyone holding the openid could compute.
        use sha2::{Digest, Sha256};
        let plain = hex::encode(&Sha256::digest(openid.as_bytes())[..6]);
        assert_ne!(here, plain);
        // Nor the erasure's tag of the same openid under the same salt.
        let erasure = crate::domain::erasure::tag("salt-of-this-deployment", openid);
        assert!(!erasure.starts_with(&here));
    }

    #[test]
    fn the_log_filter_reads_rust_log_then_lambdas_level_then_defaults_to_info() {
        let at = |f: &Targets, level: Level| f.would_enable("onegrant", &level);
        let f = log_filter(Some("warn,onegrant=debug"), None);
        assert!(at(&f, Level::DEBUG));
        assert!(!f.would_enable("hyper", &Level::INFO));
        let f = log_filter(None, Some("FATAL"));
        assert!(at(&f, Level::ERROR) && !at(&f, Level::WARN));
        let f = log_filter(Some("onegrant=loudly"), Some("DEBUG"));
        assert!(at(&f, Level::DEBUG));
        let f = log_filter(None, None);
        assert!(at(&f, Level::INFO) && !at(&f, Level::DEBUG));
    }

    #[test]
    fn dependency_crates_stay_at_info_whatever_rust_log_asks() {
        for asked in [
            "trace",
            "debug",
            "trace,lambda_runtime=trace,hyper=trace",
            "lambda_runtime=trace",
            "onegrant=trace,aws_smithy_runtime=trace",
        ] {
            let f = log_filter(Some(asked), None);
            for dependency in [
                "lambda_runtime",
                "lambda_runtime::layers::trace",
                "lambda_http",
                "hyper",
                "hyper_util::client",
                "aws_smithy_runtime::client::orchestrator",
                "aws_sigv4",
                "reqwest",
                "h2",
            ] {
                assert!(
                    !f.would_enable(dependency, &Level::DEBUG),
                    "{asked}: {dependency} at debug"
                );
            }
        }
        let f = log_filter(Some("trace"), None);
        assert!(f.would_enable("onegrant::http", &Level::TRACE));
        assert!(f.would_enable("dispatcher", &Level::TRACE));
        assert!(
            f.would_enable("lambda_runtime", &Level::INFO),
            "info still shows"
        );
        let f = log_filter(Some("warn,onegrant=debug"), None);
        assert!(f.would_enable("onegrant::store", &Level::DEBUG));
        assert!(
            !f.would_enable("grants", &Level::INFO),
            "own crates follow the default"
        );
        assert!(!f.would_enable("hyper", &Level::INFO));
    }
}
