//! Tracing set-up and log-safe identifiers.
//!
//! In Lambda (`AWS_LAMBDA_FUNCTION_NAME` set) logs are JSON lines so CloudWatch Logs
//! Insights can query fields; locally they are human-readable. Openids are personal data:
//! logs carry [`openid_hash`], never the openid itself.

use sha2::{Digest, Sha256};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the global subscriber once. `RUST_LOG` (or `AWS_LAMBDA_LOG_LEVEL`) sets the
/// level, as a level (`info`) or per target (`warn,onegrant=debug`); anything
/// unreadable means `info`.
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

/// The filter `RUST_LOG` names (a level, or `warn,onegrant=debug`), else Lambda's
/// advanced logging level (`FATAL` is tracing's `error`), else `info`.
fn log_filter(rust_log: Option<&str>, lambda_level: Option<&str>) -> Targets {
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

/// A short, stable, non-reversible tag for an openid, for log fields.
pub fn openid_hash(openid: &str) -> String {
    let digest = Sha256::digest(openid.as_bytes());
    hex::encode(&digest[..6])
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
}
