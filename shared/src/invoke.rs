//! Asynchronous Lambda invocations through the Invoke API (`X-Amz-Invocation-Type:
//! Event`), signed with SigV4 by the credentials and region of the store's own
//! DynamoDB client: the dispatcher fans a tick's shards out to workers with it. No
//! Lambda SDK: one signed POST is all it needs.

use aws_credential_types::provider::SharedCredentialsProvider;

use crate::signed::{CallError, Endpoint};

/// Why an invocation could not be handed to Lambda.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("the Invoke API was not reached")]
    Call(#[source] CallError),
    #[error("the Invoke API answered {status}")]
    Refused { status: u16 },
}

/// Invokes one function asynchronously.
#[derive(Clone, Debug)]
pub struct Invoker {
    lambda: Endpoint,
    function: String,
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
        Some(Self {
            lambda: Endpoint::new("lambda", region, credentials, endpoint)?,
            function: function.to_string(),
        })
    }

    /// Hands `payload` to Lambda for an asynchronous invocation (answered 202 once
    /// queued; Lambda retries a failed one twice by itself).
    pub async fn invoke_event(&self, payload: &serde_json::Value) -> Result<(), InvokeError> {
        let path = format!("/2015-03-31/functions/{}/invocations", self.function);
        let headers = [
            ("content-type", "application/json"),
            ("x-amz-invocation-type", "Event"),
        ];
        let answer = self
            .lambda
            .post(&path, &headers, &payload.to_string())
            .await
            .map_err(InvokeError::Call)?;
        let status = answer.status().as_u16();
        if status == 202 {
            Ok(())
        } else {
            Err(InvokeError::Refused { status })
        }
    }
}
