//! One AWS endpoint called without its SDK: signed POSTs (SigV4) with the credentials
//! and region of the store's own DynamoDB client, at the service's regional endpoint
//! or an emulator's. The dispatcher's fan-out (`invoke`) and the outcomes' bus (`bus`)
//! each need one call, not an SDK.

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_smithy_runtime_api::client::identity::Identity;

/// Why a signed call did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("no credentials to sign with")]
    Credentials(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the request could not be signed")]
    Signing(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the endpoint could not be reached")]
    Unreachable(#[source] reqwest::Error),
}

/// Why a JSON-protocol call got no answer to read.
#[derive(Debug, thiserror::Error)]
pub enum JsonCallError {
    #[error("the service was not reached")]
    Call(#[source] CallError),
    #[error("the service's answer could not be read")]
    Answer(#[source] reqwest::Error),
    #[error("the service answered {status} {kind}")]
    Refused { status: u16, kind: String },
}

/// A service's endpoint, with what signs calls to it.
#[derive(Clone)]
pub(crate) struct Endpoint {
    http: reqwest::Client,
    pub(crate) url: String,
    region: String,
    service: &'static str,
    credentials: SharedCredentialsProvider,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// `service` (its signing name, also its host's first label) in `region`, at
    /// `endpoint` when given, each call bounded by 5 s.
    pub(crate) fn new(
        service: &'static str,
        region: &str,
        credentials: SharedCredentialsProvider,
        endpoint: Option<&str>,
    ) -> Option<Self> {
        let url = endpoint.map_or_else(
            || {
                format!(
                    "https://{service}.{region}.{}",
                    crate::aws::dns_suffix(region)
                )
            },
            |e| e.trim_end_matches('/').to_string(),
        );
        let http = crate::aws::http_client_builder()
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .ok()?;
        Some(Self {
            http,
            url,
            region: region.to_string(),
            service,
            credentials,
        })
    }

    /// POSTs `body` with `headers` to `path`, signed.
    pub(crate) async fn post(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<reqwest::Response, CallError> {
        let credentials = self
            .credentials
            .provide_credentials()
            .await
            .map_err(|e| CallError::Credentials(Box::new(e)))?;
        let identity: Identity = credentials.into();
        let request = crate::secrets::signed_post(
            &self.http,
            &format!("{}{path}", self.url),
            (&self.region, self.service),
            &identity,
            headers,
            body,
        )
        .map_err(CallError::Signing)?;
        request.send().await.map_err(CallError::Unreachable)
    }

    /// One call of `target` (`Service.Action`) in AWS's JSON 1.1 protocol with `body`:
    /// the answer when 200, else the error kind the service named.
    pub(crate) async fn call_json(
        &self,
        target: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, JsonCallError> {
        let headers = [
            ("content-type", "application/x-amz-json-1.1"),
            ("x-amz-target", target),
        ];
        let answer = self
            .post("/", &headers, &body.to_string())
            .await
            .map_err(JsonCallError::Call)?;
        let status = answer.status().as_u16();
        let value: serde_json::Value = answer.json().await.map_err(JsonCallError::Answer)?;
        if status != 200 {
            return Err(JsonCallError::Refused {
                status,
                kind: crate::secrets::error_kind(&value),
            });
        }
        Ok(value)
    }
}
