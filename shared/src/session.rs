//! Session tokens: HS256 JWTs that carry the user's openid.
//!
//! `POST /v1/session` issues one after WeChat vouches for a login code; every other route
//! takes the caller's identity only from a token verified here (invariant I8). The token
//! holds `sub` (openid), `iat`, `exp` and `iss`; nothing else is trusted from a client.

use std::time::Duration;

use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::config::SessionConfig;
use crate::domain::OpenId;

pub mod jwt_crypto;

const ISSUER: &str = "onegrant";

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    iat: i64,
    exp: i64,
    iss: String,
}

/// Issues and verifies session tokens.
#[derive(Clone)]
pub struct Sessions {
    /// `None` in a function not given the session key.
    encoding: Option<EncodingKey>,
    /// The current key, the key before the last rotation, and the one a rotation is
    /// about to make current.
    decoding: Vec<DecodingKey>,
    validation: Validation,
    ttl: Duration,
}

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

impl Sessions {
    pub fn new(config: &SessionConfig) -> Result<Self, SessionError> {
        jwt_crypto::install();
        let keys = config
            .secret
            .iter()
            .chain(config.previous.iter())
            .chain(config.pending.iter());
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[ISSUER]);
        validation.set_required_spec_claims(&["exp", "sub", "iss"]);
        // Lambda clocks are NTP-synchronised; a few seconds absorbs the rest.
        validation.leeway = 5;
        Ok(Self {
            encoding: config
                .secret
                .as_ref()
                .map(|s| EncodingKey::from_secret(s.expose().as_bytes()))
                .transpose()
                .map_err(SessionError::Key)?,
            decoding: keys
                .map(|s| DecodingKey::from_secret(s.expose().as_bytes()))
                .collect::<Result<_, _>>()
                .map_err(SessionError::Key)?,
            validation,
            ttl: config.ttl,
        })
    }

    /// A token for `openid`, valid from `now` for the configured lifetime.
    pub fn issue(&self, openid: &OpenId, now: DateTime<Utc>) -> Result<IssuedToken, SessionError> {
        let ttl = self.ttl.as_secs();
        let claims = Claims {
            sub: openid.to_string(),
            iat: now.timestamp(),
            exp: now.timestamp().saturating_add_unsigned(ttl),
            iss: ISSUER.to_string(),
        };
        let encoding = self.encoding.as_ref().ok_or(SessionError::NoKey)?;
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, encoding)
            .map_err(SessionError::Sign)?;
        Ok(IssuedToken {
            token,
            token_type: "Bearer",
            expires_in: ttl,
        })
    }

    /// The openid a token was issued to, if the token is genuine (signed by the current
    /// key or the one before the last rotation) and unexpired.
    pub fn verify(&self, token: &str) -> Result<OpenId, SessionError> {
        let mut refused = SessionError::NoKey;
        for key in &self.decoding {
            match jsonwebtoken::decode::<Claims>(token, key, &self.validation) {
                Ok(data) => {
                    return OpenId::parse(data.claims.sub).map_err(|_| SessionError::Subject);
                }
                Err(e) => refused = SessionError::Invalid(e),
            }
        }
        Err(refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::Secret;

    fn sessions(secret: &str) -> Sessions {
        rotated(secret, None)
    }

    fn rotated(secret: &str, previous: Option<&str>) -> Sessions {
        Sessions::new(&SessionConfig {
            secret: Some(Secret::new(secret)),
            previous: previous.map(Secret::new),
            pending: None,
            ttl: Duration::from_secs(7200),
        })
        .expect("valid key")
    }

    #[test]
    fn after_a_rotation_tokens_of_the_previous_key_are_accepted_and_older_ones_are_not() {
        let (old, new, older) = ("o".repeat(32), "n".repeat(32), "x".repeat(32));
        let openid = OpenId::parse("oUser1").expect("openid");
        let before = sessions(&old)
            .issue(&openid, Utc::now())
            .expect("signed")
            .token;
        let ancient = sessions(&older)
            .issue(&openid, Utc::now())
            .expect("signed")
            .token;
        let after = rotated(&new, Some(&old));
        assert_eq!(after.verify(&before).expect("previous key"), openid);
        let fresh = after.issue(&openid, Utc::now()).expect("signed").token;
        assert_eq!(after.verify(&fresh).expect("current key"), openid);
        assert!(matches!(
            after.verify(&ancient),
            Err(SessionError::Invalid(_))
        ));
        assert!(
            sessions(&old).verify(&fresh).is_err(),
            "signed with the new key"
        );
        let keyless = Sessions::new(&SessionConfig {
            secret: None,
            previous: None,
            pending: None,
            ttl: Duration::from_secs(60),
        })
        .expect("no key");
        assert!(matches!(
            keyless.issue(&openid, Utc::now()),
            Err(SessionError::NoKey)
        ));
        assert!(matches!(keyless.verify(&fresh), Err(SessionError::NoKey)));
    }

    #[test]
    fn a_token_round_trips_to_its_openid() {
        let s = sessions(&"k".repeat(32));
        let openid = OpenId::parse("oUser1").expect("openid");
        let issued = s.issue(&openid, Utc::now()).expect("signed");
        assert_eq!(issued.expires_in, 7200);
        assert_eq!(s.verify(&issued.token).expect("valid"), openid);
    }

    #[test]
    fn forged_expired_and_garbage_tokens_are_refused() {
        let s = sessions(&"k".repeat(32));
        let other = sessions(&"z".repeat(32));
        let openid = OpenId::parse("oUser1").expect("openid");
        let forged = other.issue(&openid, Utc::now()).expect("signed").token;
        assert!(matches!(s.verify(&forged), Err(SessionError::Invalid(_))));
        let expired = s
            .issue(&openid, Utc::now() - chrono::Duration::hours(3))
            .expect("signed")
            .token;
        assert!(matches!(s.verify(&expired), Err(SessionError::Invalid(_))));
        assert!(s.verify("not.a.token").is_err());
        assert!(s.verify("").is_err());
    }

    /// The token crypto is HS256 alone: a token claiming any other algorithm, `none`
    /// included, or carrying one flipped signature bit, is refused; signing with
    /// another algorithm is refused too.
    #[test]
    fn tokens_of_other_algorithms_or_a_changed_signature_are_refused() {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let s = sessions(&"k".repeat(32));
        let openid = OpenId::parse("oUser1").expect("openid");
        let token = s.issue(&openid, Utc::now()).expect("signed").token;
        assert!(s.verify(&token).is_ok(), "the control is accepted");
        let parts: Vec<&str> = token.split('.').collect();
        for alg in ["none", "HS384", "HS512", "RS256", "ES256", "EdDSA"] {
            let header = b64.encode(format!(r#"{{"typ":"JWT","alg":"{alg}"}}"#));
            for signature in [parts[2], ""] {
                let other = format!("{header}.{}.{signature}", parts[1]);
                assert!(
                    matches!(s.verify(&other), Err(SessionError::Invalid(_))),
                    "{alg} with signature {signature:?}"
                );
            }
        }
        let mut signature = b64.decode(parts[2]).expect("signature");
        signature[0] ^= 1;
        let flipped = format!("{}.{}.{}", parts[0], parts[1], b64.encode(signature));
        assert!(matches!(s.verify(&flipped), Err(SessionError::Invalid(_))));
        let key = EncodingKey::from_secret(&[7; 32]).expect("key");
        for alg in [Algorithm::HS384, Algorithm::RS256, Algorithm::EdDSA] {
            assert!(
                jsonwebtoken::encode(&Header::new(alg), &"{}", &key).is_err(),
                "{alg:?}"
            );
        }
    }
}
