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

/// The DNS suffix of AWS endpoints in `region`'s partition: China's regions have their
/// own (`amazonaws.com.cn`), where a WeChat product is likely to run.
pub fn dns_suffix(region: &str) -> &'static str {
    if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    }
}

/// Installs ring as the process-wide rustls provider (used by reqwest). Idempotent.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// An HTTP client builder with the process's one TLS configuration: the platform's
/// root certificates are read once per process, not once per client (each read parses
/// every certificate under `/etc/ssl/certs`; a cold start built three clients). The
/// verifier and protocols are what reqwest builds by itself (rustls-platform-verifier,
/// TLS 1.2 and 1.3, ALPN h2 then http/1.1); should the platform's roots be unreadable,
/// reqwest's own (which then reports it when the client is built).
pub fn http_client_builder() -> reqwest::ClientBuilder {
    install_crypto_provider();
    static TLS: std::sync::OnceLock<Option<rustls::ClientConfig>> = std::sync::OnceLock::new();
    let tls = TLS.get_or_init(|| {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls_platform_verifier::Verifier::new(provider.clone()).ok()?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .ok()?
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(verifier))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Some(config)
    });
    match tls {
        Some(config) => reqwest::Client::builder().tls_backend_preconfigured(config.clone()),
        None => reqwest::Client::builder(),
    }
}

#[cfg(feature = "store")]
fn https_client() -> aws_sdk_dynamodb::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// How long one DynamoDB request may take before it is given up on and tried again
/// (by the SDK; a transaction by the store, with its `ClientRequestToken`). DynamoDB
/// answers in milliseconds; without a limit a lost answer would hold the invocation
/// until Lambda kills it.
pub const DYNAMODB_ATTEMPT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(feature = "store")]
/// Timeouts for a DynamoDB client: `attempt` per request, two attempts' worth (plus
/// 1 s of backoff) for the whole call, 1 s to connect — so a write's last call, begun
/// just inside the store's write budget (4 s), still ends inside a 10 s function.
pub fn dynamodb_timeouts(attempt: std::time::Duration) -> aws_config::timeout::TimeoutConfig {
    aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(std::time::Duration::from_secs(1))
        .operation_attempt_timeout(attempt)
        .operation_timeout(attempt * 2 + std::time::Duration::from_secs(1))
        .build()
}

#[cfg(feature = "store")]
/// Loads the shared SDK config from the environment (region, credentials, endpoints),
/// with [`DYNAMODB_ATTEMPT_TIMEOUT`] per request.
pub async fn sdk_config() -> SdkConfig {
    install_crypto_provider();
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(https_client())
        .timeout_config(dynamodb_timeouts(DYNAMODB_ATTEMPT_TIMEOUT))
        .load()
        .await
}

#[cfg(feature = "store")]
/// A deployed function's SDK config: what Lambda gives a function in its environment —
/// `AWS_REGION`, the execution role's credentials in `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`, and `AWS_ENDPOINT_URL_DYNAMODB`
/// (or `AWS_ENDPOINT_URL`) where one is set, as for the emulator — with
/// [`DYNAMODB_ATTEMPT_TIMEOUT`] per request. Unlike [`sdk_config`] (the operator tools',
/// which run wherever an operator signs in), it links none of aws-config's other
/// credential sources (STS, SSO, instance metadata, profile files) that a function never
/// uses: about 0.6 MB of each binary (docs/benchmarks.md, "Cold start").
pub fn function_sdk_config() -> SdkConfig {
    install_crypto_provider();
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let region = env("AWS_REGION")
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .map(aws_config::Region::new);
    let credentials = aws_credential_types::provider::SharedCredentialsProvider::new(
        aws_config::environment::EnvironmentVariableCredentialsProvider::new(),
    );
    let mut config = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(https_client())
        .timeout_config(dynamodb_timeouts(DYNAMODB_ATTEMPT_TIMEOUT))
        .retry_config(aws_config::retry::RetryConfig::standard())
        .region(region)
        .credentials_provider(credentials);
    if let Some(url) = env("AWS_ENDPOINT_URL_DYNAMODB").or_else(|| env("AWS_ENDPOINT_URL")) {
        config = config.endpoint_url(url);
    }
    config.build()
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

#[cfg(test)]
mod tests {
    #[test]
    fn china_regions_have_their_own_endpoint_suffix() {
        assert_eq!(super::dns_suffix("cn-north-1"), "amazonaws.com.cn");
        assert_eq!(super::dns_suffix("cn-northwest-1"), "amazonaws.com.cn");
        assert_eq!(super::dns_suffix("ap-east-1"), "amazonaws.com");
    }
}
