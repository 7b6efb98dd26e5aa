//! Tracing set-up and log-safe identifiers.
//!
//! In Lambda (`AWS_LAMBDA_FUNCTION_NAME` set) logs are JSON lines so CloudWatch Logs
//! Insights can query fields; locally they are human-readable. Openids are personal data:
//! logs carry [`openid_hash`], never the openid itself.

use sha2::{Digest, Sha256};
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once. `RUST_LOG` (or `AWS_LAMBDA_LOG_LEVEL`) sets the level.
pub fn init() {
    let filter = std::env::var("RUST_LOG")
        .or_else(|_| std::env::var("AWS_LAMBDA_LOG_LEVEL").map(|l| l.to_lowercase()))
        .unwrap_or_else(|_| "info".to_string());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_target(false);
    let result = if std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some() {
        builder
            .json()
            .with_current_span(true)
            .without_time()
            .try_init()
    } else {
        builder.try_init()
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
