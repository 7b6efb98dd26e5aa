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
    let filter = std::env::var("RUST_LOG")
        .or_else(|_| std::env::var("AWS_LAMBDA_LOG_LEVEL").map(|l| l.to_lowercase()))
        .ok()
        .and_then(|f| f.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO));
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
