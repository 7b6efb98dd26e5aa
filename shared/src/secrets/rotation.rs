//! The session key's rotation: Secrets Manager's four steps for a secret whose value is
//! the key itself (no other system to tell, so `setSecret` does nothing).
//!
//! - `createSecret`: a new key staged `AWSPENDING` under the rotation's token (once: a
//!   retried step finds it there);
//! - `setSecret`: nothing;
//! - `testSecret`: the staged key is there, long enough to sign with, and sealed;
//! - `finishSecret`: the staged version made `AWSCURRENT` (the old one becomes
//!   `AWSPREVIOUS`), sealed still.
//!
//! **Sealed**: a key this rotation makes is 32 random bytes and a 16-byte tag, the
//! HMAC-SHA256 under the current key of the token and those bytes ([`seal`]). A pending
//! value someone else wrote under the token (whoever got past the secret's write fence)
//! carries no tag that holds, and every step refuses it ([`RotationError::Foreign`]):
//! the rotation fails and the key in use stays. Forging the tag needs the current key,
//! which is reading the secret. The 256 random bits are the new key's secret part. The
//! seal guards the rotation's own path; a value put straight to `AWSCURRENT` is the
//! write fence's and the write alarm's to stop.
//!
//! The functions read the keys again when a token matches none they hold
//! ([`crate::session`]), so the new key needs no deploy and signs nobody out.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::MIN_SESSION_SECRET_BYTES;
use super::{SecretsError, SecretsReader};

/// Bytes of randomness in a key, and of its seal (written as hex: 96 characters).
const RANDOM_BYTES: usize = 32;
const TAG_BYTES: usize = 16;

/// One invocation by Secrets Manager: `{"SecretId", "ClientRequestToken", "Step"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotationRequest {
    pub secret_id: String,
    pub token: String,
    pub step: Step,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Create,
    Set,
    Test,
    Finish,
}

/// Why a step failed (Secrets Manager then marks the rotation failed and tries again).
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    #[error("not a rotation request: {0}")]
    Request(String),
    #[error("this function rotates the session key only")]
    OtherSecret,
    #[error("the rotation's version is not staged AWSPENDING")]
    NotStaged,
    #[error("the staged key is missing or shorter than {MIN_SESSION_SECRET_BYTES} bytes")]
    Unusable,
    #[error("no version of the secret is AWSCURRENT")]
    NoCurrent,
    #[error("no new key could be made")]
    Random,
    #[error("the staged key was not made by this rotation (its seal does not hold): refused")]
    Foreign,
    #[error("Secrets Manager refused {action}: {status} {kind}")]
    Refused {
        action: &'static str,
        status: u16,
        kind: String,
    },
    #[error(transparent)]
    Secrets(#[from] SecretsError),
}

impl RotationRequest {
    pub fn parse(event: &Value) -> Result<Self, RotationError> {
        let field = |name: &str| {
            event[name]
                .as_str()
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .ok_or_else(|| RotationError::Request(format!("{name} is missing")))
        };
        let step = match field("Step")?.as_str() {
            "createSecret" => Step::Create,
            "setSecret" => Step::Set,
            "testSecret" => Step::Test,
            "finishSecret" => Step::Finish,
            other => return Err(RotationError::Request(format!("unknown step {other:?}"))),
        };
        Ok(Self {
            secret_id: field("SecretId")?,
            token: field("ClientRequestToken")?,
            step,
        })
    }
}

/// What the secret's versions say of a step (the domain of the rotation, pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The rotation's version is current already: the step has nothing to do.
    Done,
    /// Do the step.
    Go,
}

/// From the versions' stages (`VersionIdsToStages`): whether `step` of the rotation
/// `token` is to be done. The version is staged `AWSPENDING` when Secrets Manager starts
/// a rotation (without a value until `createSecret`); a `createSecret` run by hand, or
/// by an emulator that stages nothing, may find no such version and makes it — only
/// while no other rotation is in flight (no version but the current one `AWSPENDING`),
/// whose label it would take.
pub fn decide(
    step: Step,
    token: &str,
    stages: &HashMap<String, Vec<String>>,
) -> Result<Decision, RotationError> {
    let has = |stages: &[String], stage: &str| stages.iter().any(|s| s == stage);
    match stages.get(token) {
        Some(own) if has(own, "AWSCURRENT") => Ok(Decision::Done),
        Some(own) if has(own, "AWSPENDING") => Ok(Decision::Go),
        None if step == Step::Create
            && !stages
                .values()
                .any(|s| has(s, "AWSPENDING") && !has(s, "AWSCURRENT")) =>
        {
            Ok(Decision::Go)
        }
        _ => Err(RotationError::NotStaged),
    }
}

/// A new key for the rotation `token`: `random` and its seal under `current` (the key in
/// use), hex.
pub fn seal(current: &str, token: &str, random: &[u8; RANDOM_BYTES]) -> Option<String> {
    use hmac::Mac;
    let tag = mac(current, token, random)?.finalize().into_bytes();
    let mut key = random.to_vec();
    key.extend_from_slice(&tag[..TAG_BYTES]);
    Some(hex::encode(key))
}

/// Whether `pending` is a key [`seal`] made for `token` under `current` (its tag
/// compared in constant time).
pub fn sealed(current: &str, token: &str, pending: &str) -> bool {
    use hmac::Mac;
    let Ok(bytes) = hex::decode(pending) else {
        return false;
    };
    if bytes.len() != RANDOM_BYTES + TAG_BYTES {
        return false;
    }
    let (random, given) = bytes.split_at(RANDOM_BYTES);
    mac(current, token, random).is_some_and(|mac| mac.verify_truncated_left(given).is_ok())
}

fn mac(current: &str, token: &str, random: &[u8]) -> Option<hmac::Hmac<sha2_jwt::Sha256>> {
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac = Hmac::<sha2_jwt::Sha256>::new_from_slice(current.as_bytes()).ok()?;
    mac.update(b"onegrant-session-key-rotation\n");
    mac.update(token.as_bytes());
    mac.update(b"\n");
    mac.update(random);
    Some(mac)
}

/// The version that is `AWSCURRENT`.
pub fn current(stages: &HashMap<String, Vec<String>>) -> Option<&str> {
    stages
        .iter()
        .find(|(_, s)| s.iter().any(|s| s == "AWSCURRENT"))
        .map(|(id, _)| id.as_str())
}

/// Runs one step of the rotation of `arn` (the session key's secret, the only one this
/// rotates).
pub async fn rotate(
    reader: &SecretsReader,
    arn: &str,
    request: &RotationRequest,
) -> Result<(), RotationError> {
    if request.secret_id != arn {
        return Err(RotationError::OtherSecret);
    }
    let described = call(
        reader,
        "DescribeSecret",
        json!({"SecretId": arn}),
        &["ResourceNotFoundException"],
    )
    .await?;
    let stages: HashMap<String, Vec<String>> = described
        .and_then(|d| serde_json::from_value(d["VersionIdsToStages"].clone()).ok())
        .unwrap_or_default();
    if decide(request.step, &request.token, &stages)? == Decision::Done {
        tracing::info!(step = ?request.step, "the rotation's version is current already");
        return Ok(());
    }
    // The key in use: what a staged key's seal is checked under.
    let in_use = reader
        .read("SESSION_SECRET", arn, "AWSCURRENT", None)
        .await?
        .ok_or(RotationError::NoCurrent)?;
    let ours = |pending: &str| {
        if sealed(in_use.expose(), &request.token, pending) {
            Ok(())
        } else {
            tracing::error!(step = ?request.step, "a pending session key this rotation did not make: refused");
            Err(RotationError::Foreign)
        }
    };
    match request.step {
        Step::Create => {
            if let Some(pending) = staged(reader, arn, &request.token).await? {
                return ours(&pending);
            }
            let mut random = [0u8; RANDOM_BYTES];
            getrandom::fill(&mut random).map_err(|_| RotationError::Random)?;
            let key =
                seal(in_use.expose(), &request.token, &random).ok_or(RotationError::Random)?;
            call(
                reader,
                "PutSecretValue",
                json!({"SecretId": arn, "ClientRequestToken": request.token,
                       "SecretString": key, "VersionStages": ["AWSPENDING"]}),
                &[],
            )
            .await?;
            tracing::info!("a new session key staged AWSPENDING");
        }
        Step::Set => {}
        Step::Test => {
            let pending = staged(reader, arn, &request.token)
                .await?
                .filter(|key| key.len() >= MIN_SESSION_SECRET_BYTES)
                .ok_or(RotationError::Unusable)?;
            ours(&pending)?;
        }
        Step::Finish => {
            let pending = staged(reader, arn, &request.token)
                .await?
                .ok_or(RotationError::NotStaged)?;
            ours(&pending)?;
            let current = current(&stages).ok_or(RotationError::NoCurrent)?;
            call(
                reader,
                "UpdateSecretVersionStage",
                json!({"SecretId": arn, "VersionStage": "AWSCURRENT",
                       "MoveToVersionId": request.token, "RemoveFromVersionId": current}),
                &[],
            )
            .await?;
            tracing::info!("the new session key is current");
        }
    }
    Ok(())
}

/// The key staged under `token`, if it has a value.
async fn staged(
    reader: &SecretsReader,
    arn: &str,
    token: &str,
) -> Result<Option<String>, RotationError> {
    let got = call(
        reader,
        "GetSecretValue",
        json!({"SecretId": arn, "VersionId": token, "VersionStage": "AWSPENDING"}),
        &["ResourceNotFoundException"],
    )
    .await?;
    Ok(got.and_then(|v| v["SecretString"].as_str().map(str::to_string)))
}

/// One Secrets Manager action: its answer, or `None` for an error of a kind in
/// `absent` (what is not there yet).
async fn call(
    reader: &SecretsReader,
    action: &'static str,
    body: Value,
    absent: &[&str],
) -> Result<Option<Value>, RotationError> {
    let answer = reader
        .call(
            "SESSION_SECRET",
            &format!("secretsmanager.{action}"),
            &body.to_string(),
        )
        .await?;
    let status = answer.status().as_u16();
    let value: Value = answer.json().await.unwrap_or(Value::Null);
    if status == 200 {
        return Ok(Some(value));
    }
    let kind = super::error_kind(&value);
    if absent.contains(&kind.as_str()) {
        return Ok(None);
    }
    Err(RotationError::Refused {
        action,
        status,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stages(pairs: &[(&str, &[&str])]) -> HashMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|(id, s)| (id.to_string(), s.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn a_step_goes_only_for_a_version_staged_pending_and_ends_once_it_is_current() {
        let pending = stages(&[("old", &["AWSCURRENT"]), ("t", &["AWSPENDING"])]);
        for step in [Step::Create, Step::Set, Step::Test, Step::Finish] {
            assert_eq!(
                decide(step, "t", &pending).ok(),
                Some(Decision::Go),
                "{step:?}"
            );
        }
        let done = stages(&[
            ("old", &["AWSPREVIOUS"]),
            ("t", &["AWSCURRENT", "AWSPENDING"]),
        ]);
        for step in [Step::Create, Step::Test, Step::Finish] {
            assert_eq!(
                decide(step, "t", &done).ok(),
                Some(Decision::Done),
                "{step:?}"
            );
        }
        let before = stages(&[("old", &["AWSCURRENT"])]);
        assert_eq!(decide(Step::Create, "t", &before).ok(), Some(Decision::Go));
        // A label left on the version a rotation made current is no rotation in flight.
        let after = stages(&[("old", &["AWSCURRENT", "AWSPENDING"])]);
        assert_eq!(decide(Step::Create, "t", &after).ok(), Some(Decision::Go));
        // Another rotation in flight: its label is not taken.
        let other = stages(&[("old", &["AWSCURRENT"]), ("u", &["AWSPENDING"])]);
        assert!(matches!(
            decide(Step::Create, "t", &other),
            Err(RotationError::NotStaged)
        ));
        assert!(matches!(
            decide(Step::Finish, "t", &before),
            Err(RotationError::NotStaged)
        ));
        let stale = stages(&[("old", &["AWSCURRENT"]), ("t", &["AWSPREVIOUS"])]);
        assert!(matches!(
            decide(Step::Test, "t", &stale),
            Err(RotationError::NotStaged)
        ));
        assert_eq!(current(&pending), Some("old"));
        assert_eq!(current(&stages(&[("t", &["AWSPENDING"])])), None);
    }

    #[test]
    fn only_a_key_sealed_under_the_current_key_for_this_token_is_the_rotations() {
        let random = [7u8; RANDOM_BYTES];
        let key = seal("current-key", "token-1", &random).expect("sealed");
        assert_eq!(key.len(), 96);
        assert!(key.starts_with(&hex::encode(random)));
        assert!(sealed("current-key", "token-1", &key));
        // Another token, another key in use, a changed bit, a foreign value: refused.
        assert!(!sealed("current-key", "token-2", &key));
        assert!(!sealed("other-key", "token-1", &key));
        let mut flipped = hex::decode(&key).expect("hex");
        flipped[47] ^= 1;
        assert!(!sealed("current-key", "token-1", &hex::encode(flipped)));
        for foreign in [
            "",
            "zz",
            &"a".repeat(96),
            &"a".repeat(98),
            &key[..94],
            &key[..64],
        ] {
            assert!(!sealed("current-key", "token-1", foreign), "{foreign}");
        }
        // Two keys for one rotation differ in their random part only.
        let other = seal("current-key", "token-1", &[8u8; RANDOM_BYTES]).expect("sealed");
        assert_ne!(key, other);
        assert!(sealed("current-key", "token-1", &other));
    }

    #[test]
    fn only_a_whole_request_of_a_known_step_is_taken() {
        let whole = json!({"SecretId": "arn", "ClientRequestToken": "t", "Step": "finishSecret"});
        assert_eq!(
            RotationRequest::parse(&whole).ok(),
            Some(RotationRequest {
                secret_id: "arn".into(),
                token: "t".into(),
                step: Step::Finish
            })
        );
        for bad in [
            json!({"SecretId": "arn", "ClientRequestToken": "t", "Step": "dropSecret"}),
            json!({"SecretId": "arn", "Step": "createSecret"}),
            json!({"SecretId": "", "ClientRequestToken": "t", "Step": "createSecret"}),
            json!(null),
        ] {
            assert!(
                matches!(RotationRequest::parse(&bad), Err(RotationError::Request(_))),
                "{bad}"
            );
        }
    }
}
