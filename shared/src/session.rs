//! Session tokens: HS256 JWTs that carry the user's openid.
//!
//! `POST /v1/session` issues one after WeChat vouches for a login code; every other route
//! takes the caller's identity only from a token verified here (invariant I8). The token
//! holds `sub` (openid), `iat`, `exp` and `iss`; nothing else is trusted from a client.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::Serialize;

use crate::clock::Clock;
use crate::config::{SessionConfig, SessionKeySource};
use crate::domain::OpenId;
use crate::secrets::Secret;

mod claims;
pub mod jwt_crypto;

use claims::{Claims, ISSUER, within_lifetime};

/// The shortest session key accepted (as at a cold start).
const MIN_KEY_BYTES: usize = crate::config::MIN_SESSION_SECRET_BYTES;

/// Issues and verifies session tokens.
///
/// Keys read from Secrets Manager ([`SessionConfig::source`]) are read again, so a
/// rotation needs no deploy and signs nobody out: every [`KEY_MAX_AGE`], and at once
/// (at most every [`UNKNOWN_KEY_PAUSE`]) when a token's signature matches none of the
/// keys held — a token signed by a container that started after the rotation. A
/// container that has not read the new key yet signs with the old one, which the
/// others accept as `AWSPREVIOUS`.
#[derive(Clone)]
pub struct Sessions {
    keys: Arc<RwLock<Arc<Keys>>>,
    source: Option<Arc<Source>>,
    validation: Validation,
    ttl: Duration,
    /// Tokens expire, and keys grow old, on it.
    clock: Clock,
}

/// The keys held: signing (`None` in a function not given the session key), and
/// checking (the current key, the one before the last rotation, and a pending one a
/// named rotation staged).
struct Keys {
    encoding: Option<EncodingKey>,
    decoding: Vec<DecodingKey>,
    read_at: DateTime<Utc>,
}

/// Where the keys are read again from, and when that was last tried for a token no
/// key matched.
struct Source {
    config: SessionKeySource,
    /// Held while the keys are read: one read at a time, the others wait for it.
    tried_at: tokio::sync::Mutex<Option<DateTime<Utc>>>,
}

/// How long keys read from Secrets Manager are used before they are read again.
pub const KEY_MAX_AGE: Duration = Duration::from_secs(600);

/// Keys not read again successfully for this long are trusted for their current key
/// only: a key taken off `AWSPREVIOUS` (a leak) stops being accepted even in a
/// container that cannot reach Secrets Manager.
pub const KEY_STALE_LIMIT: Duration = Duration::from_secs(1800);

/// The shortest time between two reads made for a token no key held matches (a
/// forged token, or one signed with a key newer than this container's). The first
/// such token after a cold start is read for at once.
pub const UNKNOWN_KEY_PAUSE: Duration = Duration::from_secs(30);

/// A freshly issued token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IssuedToken {
    pub token: String,
    pub token_type: &'static str,
    pub expires_in: u64,
}

/// Why a token was refused or could not be made. The variants are for logs: every
/// refusal answers the same 401 so a client learns nothing about why.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the session key is unusable")]
    Key(#[source] jsonwebtoken::errors::Error),
    #[error("the token could not be signed")]
    Sign(#[source] jsonwebtoken::errors::Error),
    #[error("the token is malformed, forged or expired")]
    Invalid(#[source] jsonwebtoken::errors::Error),
    #[error("the token's subject is not an openid")]
    Subject,
    #[error("this function is not given the session key")]
    NoKey,
}

impl Keys {
    fn new(
        secret: Option<&Secret>,
        previous: Option<&Secret>,
        pending: Option<&Secret>,
        now: DateTime<Utc>,
    ) -> Result<Self, SessionError> {
        Ok(Self {
            encoding: secret
                .map(|s| EncodingKey::from_secret(s.expose().as_bytes()))
                .transpose()
                .map_err(SessionError::Key)?,
            decoding: secret
                .into_iter()
                .chain(previous)
                .chain(pending)
                .map(|s| DecodingKey::from_secret(s.expose().as_bytes()))
                .collect::<Result<_, _>>()
                .map_err(SessionError::Key)?,
            read_at: now,
        })
    }
}

impl Sessions {
    pub fn new(config: &SessionConfig) -> Result<Self, SessionError> {
        jwt_crypto::install();
        let clock = Clock::system();
        let keys = Keys::new(
            config.secret.as_ref(),
            config.previous.as_ref(),
            config.pending.as_ref(),
            clock.now(),
        )?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[ISSUER]);
        validation.set_required_spec_claims(&["exp", "sub", "iss"]);
        // Expiry is checked against the clock (`expired`), not jsonwebtoken's own
        // reading of the system time.
        validation.validate_exp = false;
        Ok(Self {
            keys: Arc::new(RwLock::new(Arc::new(keys))),
            source: config.source.clone().map(|config| {
                Arc::new(Source {
                    config,
                    tried_at: tokio::sync::Mutex::new(None),
                })
            }),
            validation,
            ttl: config.ttl,
            clock,
        })
    }

    /// These sessions on `clock` (a test's, which it moves): tokens expire, and keys
    /// held grow old, by it.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        let now = clock.now();
        let keys = self.keys();
        // The keys were just read: as of the new clock's now.
        let rebased = Keys {
            encoding: keys.encoding.clone(),
            decoding: keys.decoding.clone(),
            read_at: now,
        };
        self.keys = Arc::new(RwLock::new(Arc::new(rebased)));
        self.clock = clock;
        self
    }

    fn keys(&self) -> Arc<Keys> {
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A token for `openid`, valid from `now` for the configured lifetime.
    pub async fn issue(
        &self,
        openid: &OpenId,
        now: DateTime<Utc>,
    ) -> Result<IssuedToken, SessionError> {
        self.read_again_if_stale().await;
        let ttl = self.ttl.as_secs();
        let claims = Claims {
            sub: openid.to_string(),
            iat: now.timestamp(),
            exp: now.timestamp().saturating_add_unsigned(ttl),
            iss: ISSUER.to_string(),
        };
        let keys = self.keys();
        let encoding = keys.encoding.as_ref().ok_or(SessionError::NoKey)?;
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, encoding)
            .map_err(SessionError::Sign)?;
        Ok(IssuedToken {
            token,
            token_type: "Bearer",
            expires_in: ttl,
        })
    }

    /// The openid a token was issued to, if the token is genuine (signed by the current
    /// key or the one before the last rotation) and within its lifetime: unexpired, not
    /// issued in the future, and valid no longer than this deployment issues tokens for.
    pub async fn verify(&self, token: &str) -> Result<OpenId, SessionError> {
        Ok(self.verify_issued(token).await?.0)
    }

    /// [`Sessions::verify`], with when the token was issued (its `iat`, epoch
    /// seconds): a token older than the user's erasure is refused by the caller.
    pub async fn verify_issued(&self, token: &str) -> Result<(OpenId, i64), SessionError> {
        self.read_again_if_stale().await;
        let held = self.keys();
        match self.verify_with(&held, token) {
            Err(SessionError::Invalid(e))
                if matches!(e.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature)
                    && self.read_again_for_unknown_key(&held).await =>
            {
                self.verify_with(&self.keys(), token)
            }
            checked => checked,
        }
    }

    fn verify_with(&self, keys: &Keys, token: &str) -> Result<(OpenId, i64), SessionError> {
        // Keys not read for too long (Secrets Manager unreachable past KEY_STALE_LIMIT):
        // the current key alone, so a key taken off AWSPREVIOUS (a leak) is not
        // accepted for as long as the container lives.
        let now = self.clock.now();
        let held = if age(keys.read_at, now) > KEY_STALE_LIMIT && self.source.is_some() {
            &keys.decoding[..keys.decoding.len().min(1)]
        } else {
            &keys.decoding[..]
        };
        // The reason worth telling: a key whose signature matched (expired, wrong
        // issuer) over the others' "invalid signature".
        let mut refused = SessionError::NoKey;
        for key in held {
            match jsonwebtoken::decode::<Claims>(token, key, &self.validation)
                .and_then(|data| within_lifetime(data.claims, now, self.ttl))
            {
                Ok(claims) => {
                    let openid = OpenId::parse(claims.sub).map_err(|_| SessionError::Subject)?;
                    return Ok((openid, claims.iat));
                }
                Err(e) => {
                    let signature =
                        matches!(e.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature);
                    let told = matches!(&refused, SessionError::Invalid(r)
                        if !matches!(r.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature));
                    if !(signature && told) {
                        refused = SessionError::Invalid(e);
                    }
                }
            }
        }
        Err(refused)
    }

    /// Reads the keys again once they are [`KEY_MAX_AGE`] old (a failed read is tried
    /// again after [`UNKNOWN_KEY_PAUSE`], not on every request).
    async fn read_again_if_stale(&self) {
        let Some(source) = &self.source else {
            return;
        };
        if age(self.keys().read_at, self.clock.now()) < KEY_MAX_AGE {
            return;
        }
        let mut tried_at = source.tried_at.lock().await;
        let now = self.clock.now();
        // Read by another request meanwhile, or tried (and failed) too recently.
        if age(self.keys().read_at, now) < KEY_MAX_AGE
            || tried_at.is_some_and(|at| age(at, now) < UNKNOWN_KEY_PAUSE)
        {
            return;
        }
        *tried_at = Some(now);
        self.read_again(source).await;
    }

    /// For a token whose signature matched none of the keys `held`: whether the keys
    /// changed since (read by another request meanwhile, or read now — at most once
    /// every [`UNKNOWN_KEY_PAUSE`], so forged tokens cannot make a container read
    /// Secrets Manager on every request).
    async fn read_again_for_unknown_key(&self, held: &Arc<Keys>) -> bool {
        let Some(source) = &self.source else {
            return false;
        };
        let mut tried_at = source.tried_at.lock().await;
        if !Arc::ptr_eq(held, &self.keys()) {
            return true;
        }
        let now = self.clock.now();
        if tried_at.is_some_and(|at| age(at, now) < UNKNOWN_KEY_PAUSE) {
            return false;
        }
        *tried_at = Some(now);
        self.read_again(source).await
    }

    /// Reads the keys from Secrets Manager and holds them: whether they were read. A
    /// read that fails keeps the keys held (logged and counted); a previous or pending
    /// key too short to have been made for signing is not trusted.
    async fn read_again(&self, source: &Source) -> bool {
        let SessionKeySource {
            arn,
            pending_version,
            reader,
        } = &source.config;
        let read = futures::future::try_join3(
            reader.read("SESSION_SECRET", arn, "AWSCURRENT", None),
            reader.read("SESSION_SECRET_PREVIOUS", arn, "AWSPREVIOUS", None),
            async {
                match pending_version {
                    Some(version) => {
                        reader
                            .read("SESSION_SECRET_PENDING", arn, "AWSPENDING", Some(version))
                            .await
                    }
                    None => Ok(None),
                }
            },
        )
        .await;
        let usable = |key: Option<Secret>, stage: &str| {
            key.filter(|k| {
                let long = k.expose().len() >= MIN_KEY_BYTES;
                if !long {
                    tracing::error!(stage, "a session key read again is too short: not trusted");
                }
                long
            })
        };
        let keys = match read {
            Ok((current, previous, pending)) => match usable(current, "AWSCURRENT") {
                Some(current) => Keys::new(
                    Some(&current),
                    usable(previous, "AWSPREVIOUS").as_ref(),
                    usable(pending, "AWSPENDING").as_ref(),
                    self.clock.now(),
                ),
                None => {
                    crate::metrics::count(crate::metrics::name::SESSION_KEY_READS_FAILED, 1);
                    return false;
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "the session keys could not be read again; the keys held are kept");
                crate::metrics::count(crate::metrics::name::SESSION_KEY_READS_FAILED, 1);
                return false;
            }
        };
        match keys {
            Ok(keys) => {
                *self
                    .keys
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
                tracing::info!("session keys read again");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "the session key read again is unusable; the keys held are kept");
                crate::metrics::count(crate::metrics::name::SESSION_KEY_READS_FAILED, 1);
                false
            }
        }
    }
}

/// How long before `now` the instant `then` was (zero if after it).
fn age(then: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (now - then).to_std().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(secret: &str) -> Sessions {
        rotated(secret, None)
    }

    fn rotated(secret: &str, previous: Option<&str>) -> Sessions {
        Sessions::new(&SessionConfig {
            secret: Some(Secret::new(secret)),
            previous: previous.map(Secret::new),
            pending: None,
            ttl: Duration::from_secs(7200),
            source: None,
        })
        .expect("valid key")
    }

    #[tokio::test]
    async fn after_a_rotation_tokens_of_the_previous_key_are_accepted_and_older_ones_are_not() {
        let (old, new, older) = ("o".repeat(32), "n".repeat(32), "x".repeat(32));
        let openid = OpenId::parse("oUser1").expect("openid");
        let before = sessions(&old)
            .issue(&openid, Clock::real_now())
            .await
            .expect("signed")
            .token;
        let ancient = sessions(&older)
            .issue(&openid, Clock::real_now())
            .await
            .expect("signed")
            .token;
        let after = rotated(&new, Some(&old));
        assert_eq!(after.verify(&before).await.expect("previous key"), openid);
        let fresh = after
            .issue(&openid, Clock::real_now())
            .await
            .expect("signed")
            .token;
        assert_eq!(after.verify(&fresh).await.expect("current key"), openid);
        assert!(matches!(
            after.verify(&ancient).await,
            Err(SessionError::Invalid(_))
        ));
        assert!(
            sessions(&old).verify(&fresh).await.is_err(),
            "signed with the new key"
        );
        let keyless = Sessions::new(&SessionConfig {
            secret: None,
            previous: None,
            pending: None,
            ttl: Duration::from_secs(60),
            source: None,
        })
        .expect("no key");
        assert!(matches!(
            keyless.issue(&openid, Clock::real_now()).await,
            Err(SessionError::NoKey)
        ));
        assert!(matches!(
            keyless.verify(&fresh).await,
            Err(SessionError::NoKey)
        ));
    }

    #[tokio::test]
    async fn an_expired_token_is_refused_as_expired_whatever_other_keys_are_held() {
        let (current, previous) = ("c".repeat(32), "p".repeat(32));
        let openid = OpenId::parse("oUser1").expect("openid");
        let expired = sessions(&current)
            .issue(&openid, Clock::real_now() - chrono::Duration::hours(3))
            .await
            .expect("signed")
            .token;
        // The previous key is tried after the current one and fails on the signature:
        // the reason told is still the current key's, so no key is read again for it.
        match rotated(&current, Some(&previous)).verify(&expired).await {
            Err(SessionError::Invalid(e)) => assert!(
                matches!(e.kind(), jsonwebtoken::errors::ErrorKind::ExpiredSignature),
                "{e:?}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_token_round_trips_to_its_openid() {
        let s = sessions(&"k".repeat(32));
        let openid = OpenId::parse("oUser1").expect("openid");
        let issued = s.issue(&openid, Clock::real_now()).await.expect("signed");
        assert_eq!(issued.expires_in, 7200);
        assert_eq!(s.verify(&issued.token).await.expect("valid"), openid);
    }

    #[tokio::test]
    async fn forged_expired_and_garbage_tokens_are_refused() {
        let s = sessions(&"k".repeat(32));
        let other = sessions(&"z".repeat(32));
        let openid = OpenId::parse("oUser1").expect("openid");
        let forged = other
            .issue(&openid, Clock::real_now())
            .await
            .expect("signed")
            .token;
        assert!(matches!(
            s.verify(&forged).await,
            Err(SessionError::Invalid(_))
        ));
        let expired = s
            .issue(&openid, Clock::real_now() - chrono::Duration::hours(3))
            .await
            .expect("signed")
            .token;
        assert!(matches!(
            s.verify(&expired).await,
            Err(SessionError::Invalid(_))
        ));
        assert!(s.verify("not.a.token").await.is_err());
        assert!(s.verify("").await.is_err());
    }

    /// The token crypto is HS256 alone: a token claiming any other algorithm, `none`
    /// included, or carrying one flipped signature bit, is refused; signing with
    /// another algorithm is refused too.
    #[tokio::test]
    async fn tokens_of_other_algorithms_or_a_changed_signature_are_refused() {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let s = sessions(&"k".repeat(32));
        let openid = OpenId::parse("oUser1").expect("openid");
        let token = s
            .issue(&openid, Clock::real_now())
            .await
            .expect("signed")
            .token;
        assert!(s.verify(&token).await.is_ok(), "the control is accepted");
        let parts: Vec<&str> = token.split('.').collect();
        for alg in ["none", "HS384", "HS512", "RS256", "ES256", "EdDSA"] {
            let header = b64.encode(format!(r#"{{"typ":"JWT","alg":"{alg}"}}"#));
            for signature in [parts[2], ""] {
                let other = format!("{header}.{}.{signature}", parts[1]);
                assert!(
                    matches!(s.verify(&other).await, Err(SessionError::Invalid(_))),
                    "{alg} with signature {signature:?}"
                );
            }
        }
        let mut signature = b64.decode(parts[2]).expect("signature");
        signature[0] ^= 1;
        let flipped = format!("{}.{}.{}", parts[0], parts[1], b64.encode(signature));
        assert!(matches!(
            s.verify(&flipped).await,
            Err(SessionError::Invalid(_))
        ));
        let key = EncodingKey::from_secret(&[7; 32]).expect("key");
        for alg in [Algorithm::HS384, Algorithm::RS256, Algorithm::EdDSA] {
            assert!(
                jsonwebtoken::encode(&Header::new(alg), &"{}", &key).is_err(),
                "{alg:?}"
            );
        }
    }
}
