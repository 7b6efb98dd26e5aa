//! Asynchronous Lambda invocations through the Invoke API (`X-Amz-Invocation-Type:
//! Event`), signed with SigV4 by the credentials and region of the store's own
//! DynamoDB client: the dispatcher fans a tick's shards out to workers with it. No
//! Lambda SDK: one signed POST is all it needs.

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_smithy_runtime_api::client::identity::Identity;

/// Why an invocation could not be handed to Lambda.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("no credentials for the Invoke API")]
    Credentials(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the invocation could not be signed")]
    Signing(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the Invoke API could not be reached")]
    Unreachable(#[source] reqwest::Error),
    #[error("the Invoke API answered {status}")]
    Refused { status: u16 },
}

/// Invokes one function asynchronously.
#[derive(Clone)]
pub struct Invoker {
    http: reqwest::Client,
    endpoint: String,
    region: String,
    credentials: SharedCredentialsProvider,
    function: String,
}

impl std::fmt::Debug for Invoker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invoker")
            .field("endpoint", &self.endpoint)
            .field("function", &self.function)
            .finish_non_exhaustive()
    }
}

impl Invoker {
    /// An invoker of `function` in `region` with `credentials`, at `endpoint` (the
    /// local stack's Invoke API) or Lambda's regional endpoint.
    pub fn new(
        region: &str,
        credentials: SharedCredentialsProvider,
        function: &str,
        endpoint: Option<&str>,
    ) -> Option<Self> {
        let region = region.to_string();
        let endpoint = endpoint.map_or_else(
            || {
                format!(
                    "https://lambda.{region}.{}",
                    crate::aws::dns_suffix(&region)
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
            endpoint,
            region,
            credentials,
            function: function.to_string(),
        })
    }

    /// Hands `payload` to Lambda for an asynchronous invocation (answered 202 once
    /// queued; Lambda retries a failed one twice by itself).
    pub async fn invoke_event(&self, payload: &serde_json::Value) -> Result<(), InvokeError> {
        let url = format!(
            "{}/2015-03-31/functions/{}/invocations",
            self.endpoint, self.function
        );
        let body = payload.to_string();
        let credentials = self
            .credentials
            .provide_credentials()
            .await
            .map_err(|e| InvokeError::Credentials(Box::new(e)))?;
        let identity: Identity = credentials.into();
        let headers = [
            ("content-type", "application/json"),
            ("x-amz-invocation-type", "Event"),
        ];
        let request = crate::secrets::signed_post(
            &self.http,
            &url,
            (&self.region, "lambda"),
            &identity,
            &headers,
            &body,
        )
        .map_err(InvokeError::Signing)?;
        let answer = request.send().await.map_err(InvokeError::Unreachable)?;
        let status = answer.status().as_u16();
        if status == 202 {
            Ok(())
        } else {
            Err(InvokeError::Refused { status })
        }
    }
}
