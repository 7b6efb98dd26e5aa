//! AWS SDK client construction.
//!
//! The SDK's default HTTPS client compiles AWS-LC (a 5-minute C build). We build the
//! client with rustls over ring instead, and set it explicitly: without `http_client`
//! this feature set has no default client at all. The endpoint comes from the SDK's
//! standard variables (`AWS_ENDPOINT_URL_DYNAMODB` points at the local emulator).

#[cfg(feature = "store")]
use aws_config::{BehaviorVersion, SdkConfig};
#[cfg(feature = "store")]
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};

/// Installs ring as the process-wide rustls provider (used by reqwest). Idempotent.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(feature = "store")]
fn https_client() -> aws_sdk_dynamodb::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

#[cfg(feature = "store")]
/// Loads the shared SDK config from the environment (region, credentials, endpoints).
pub async fn sdk_config() -> SdkConfig {
    install_crypto_provider();
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(https_client())
        .load()
        .await
}

#[cfg(feature = "store")]
/// A DynamoDB client configured from the environment.
pub async fn dynamodb_client() -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&sdk_config().await)
}

#[cfg(feature = "store")]
/// A DynamoDB client for a local emulator at `endpoint`, with dummy static credentials.
/// Used by the local stack and the tests; never by a deployed function.
pub fn local_dynamodb_client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    install_crypto_provider();
    let credentials =
        aws_credential_types::Credentials::new("local", "local", None, None, "onegrant-local");
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .credentials_provider(credentials)
        .endpoint_url(endpoint)
        .http_client(https_client())
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}
