//! Secrets read from AWS Secrets Manager once per cold start: the deployed functions hold
//! secret ARNs in their environment, never the secrets (`SESSION_SECRET_ARN`,
//! `WECHAT_SECRET_ARN`, `WECHAT_PUSH_TOKEN_ARN`, `WECHAT_PUSH_AES_KEY_ARN`).
//!
//! One signed `GetSecretValue` POST per secret, signed with the function's own role
//! credentials (Lambda's `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`): no Secrets Manager SDK, so the session function still links no
//! AWS SDK. The endpoint is `AWS_ENDPOINT_URL_SECRETS_MANAGER` when set (the tests'
//! emulator), else the region's.

pub mod rotation;

use std::fmt;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use serde_json::{Value, json};

/// The minimum HS256 session key length we accept (RFC 7518 §3.2: at least the hash
/// size): a rotation stages no shorter key, and `config` refuses one.
pub const MIN_SESSION_SECRET_BYTES: usize = 32;

/// A secret string: usable, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Why a secret could not be read. Names the secret's variable, never its value.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("{0} is required to read secrets")]
    Environment(&'static str),
    #[error("the request for {name} could not be signed")]
    Signing {
        name: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("Secrets Manager could not be reached for {name}")]
    Unreachable {
        name: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("Secrets Manager refused {name}: {status} {kind}")]
    Refused {
        name: &'static str,
        status: u16,
        kind: String,
    },
    #[error("{name} has no string value")]
    NotAString { name: &'static str },
}

/// A POST of `body` to `url` with `headers`, signed with SigV4 for (`region`,
/// `service`) by `identity`: the one signing routine of the calls made without an SDK.
pub(crate) fn signed_post(
    http: &reqwest::Client,
    url: &str,
    (region, service): (&str, &str),
    identity: &Identity,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<reqwest::RequestBuilder, Box<dyn std::error::Error + Send + Sync>> {
    let params = v4::SigningParams::builder()
        .identity(identity)
        .region(region)
        .name(service)
        // AWS checks a signature against its own clock: the real time, whatever a
        // test's clock reads.
        .time(SystemTime::from(crate::clock::Clock::real_now()))
        .settings(SigningSettings::default())
        .build()?
        .into();
    let signable = SignableRequest::new(
        "POST",
        url,
        headers.iter().copied(),
        SignableBody::Bytes(body.as_bytes()),
    )?;
    let (instructions, _) = sign(signable, &params)?.into_parts();
    let mut request = http.post(url).body(body.to_string());
    for (header, value) in headers.iter().copied().chain(instructions.headers()) {
        request = request.header(header, value);
    }
    Ok(request)
}

/// The kind of a Secrets Manager error answer (`ResourceNotFoundException`, …).
pub(crate) fn error_kind(answer: &Value) -> String {
    answer["__type"]
        .as_str()
        .unwrap_or("unreadable answer")
        .rsplit('#')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A Secrets Manager reader: region, endpoint and credentials.
pub struct SecretsReader {
    http: reqwest::Client,
    endpoint: String,
    region: String,
    credentials: Credentials,
}

impl std::fmt::Debug for SecretsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsReader")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl SecretsReader {
    /// A reader configured as Lambda configures a function: region, credentials and an
    /// optional endpoint from `lookup` (the environment).
    pub fn from_lookup(lookup: &impl Fn(&str) -> Option<String>) -> Result<Self, SecretsError> {
        let get = |name: &'static str| {
            lookup(name)
                .filter(|v| !v.is_empty())
                .ok_or(SecretsError::Environment(name))
        };
        let region = get("AWS_REGION")
            .or_else(|_| get("AWS_DEFAULT_REGION"))
            .map_err(|_| SecretsError::Environment("AWS_REGION"))?;
        let credentials = Credentials::new(
            get("AWS_ACCESS_KEY_ID")?,
            get("AWS_SECRET_ACCESS_KEY")?,
            lookup("AWS_SESSION_TOKEN").filter(|t| !t.is_empty()),
            None,
            "lambda-environment",
        );
        let endpoint = lookup("AWS_ENDPOINT_URL_SECRETS_MANAGER")
            .filter(|e| !e.is_empty())
            .map_or_else(
                || {
                    format!(
                        "https://secretsmanager.{region}.{}",
                        crate::aws::dns_suffix(&region)
                    )
                },
                |e| e.trim_end_matches('/').to_string(),
            );
        Ok(Self::new(region, credentials, endpoint))
    }

    pub fn new(region: String, credentials: Credentials, endpoint: String) -> Self {
        let http = crate::aws::http_client_builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        Self {
            http,
            endpoint,
            region,
            credentials,
        }
    }

    /// The secret `id` (an ARN or name) at `stage` (`AWSCURRENT`, `AWSPREVIOUS`), and
    /// with `version` only that version, only while it has that stage; `None` when no
    /// version has it (a secret never rotated has no previous; a rotation's version no
    /// longer pending). `name` is the variable it is read for, for errors and logs.
    pub async fn read(
        &self,
        name: &'static str,
        id: &str,
        stage: &str,
        version: Option<&str>,
    ) -> Result<Option<Secret>, SecretsError> {
        let mut body = json!({"SecretId": id, "VersionStage": stage});
        if let Some(version) = version {
            body["VersionId"] = json!(version);
        }
        let body = body.to_string();
        let answer = self
            .call(name, "secretsmanager.GetSecretValue", &body)
            .await?;
        let status = answer.status().as_u16();
        let value: Value = answer.json().await.unwrap_or(Value::Null);
        if status != 200 {
            let kind = error_kind(&value);
            // A stage no version carries (AWSPREVIOUS before the first rotation).
            if kind == "ResourceNotFoundException" && stage != "AWSCURRENT" {
                if version.is_some() {
                    // A named rotation whose version is not there: a wrong name, and
                    // its tokens will be refused. Say so where an operator looks.
                    tracing::error!(
                        secret = name,
                        "the named version does not exist: no pending key is trusted"
                    );
                }
                return Ok(None);
            }
            // A named version that does not carry the stage (any more): a rotation
            // that ended, or a name that is wrong. Nothing is trusted for it.
            if version.is_some() && kind == "InvalidRequestException" {
                tracing::warn!(
                    secret = name,
                    "the named version does not carry {stage}: not read"
                );
                return Ok(None);
            }
            return Err(SecretsError::Refused { name, status, kind });
        }
        value["SecretString"]
            .as_str()
            .map(|s| Some(Secret::new(s)))
            .ok_or(SecretsError::NotAString { name })
    }

    /// One signed Secrets Manager request (JSON 1.1 protocol).
    pub async fn call(
        &self,
        name: &'static str,
        target: &str,
        body: &str,
    ) -> Result<reqwest::Response, SecretsError> {
        let url = format!("{}/", self.endpoint);
        let identity: Identity = self.credentials.clone().into();
        let headers = [
            ("content-type", "application/x-amz-json-1.1"),
            ("x-amz-target", target),
        ];
        signed_post(
            &self.http,
            &url,
            (&self.region, "secretsmanager"),
            &identity,
            &headers,
            body,
        )
        .map_err(|source| SecretsError::Signing { name, source })?
        .send()
        .await
        .map_err(|source| SecretsError::Unreachable { name, source })
    }
}
