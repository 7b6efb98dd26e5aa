//! What a session token claims, and whether its lifetime is one this deployment
//! issues.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub(super) const ISSUER: &str = "onegrant";

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Claims {
    pub(super) sub: String,
    pub(super) iat: i64,
    pub(super) exp: i64,
    pub(super) iss: String,
}

/// Lambda clocks are NTP-synchronised; a few seconds absorbs the rest.
const EXPIRY_LEEWAY_SECONDS: i64 = 5;

/// The claims of a genuine token, unless it expired before `now`, was issued after
/// `now`, or claims a lifetime longer than this deployment issues (each beyond the
/// leeway): a token signed with a leaked key cannot be made to last for years.
pub(super) fn within_lifetime(
    claims: Claims,
    now: DateTime<Utc>,
    ttl: Duration,
) -> Result<Claims, jsonwebtoken::errors::Error> {
    use jsonwebtoken::errors::ErrorKind;
    let now = now.timestamp();
    if claims.exp.saturating_add(EXPIRY_LEEWAY_SECONDS) < now {
        return Err(ErrorKind::ExpiredSignature.into());
    }
    if claims.iat > now.saturating_add(EXPIRY_LEEWAY_SECONDS) {
        return Err(ErrorKind::ImmatureSignature.into());
    }
    let longest = i64::try_from(ttl.as_secs())
        .unwrap_or(i64::MAX)
        .saturating_add(EXPIRY_LEEWAY_SECONDS);
    if claims.exp.saturating_sub(claims.iat) > longest {
        return Err(ErrorKind::InvalidToken.into());
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::errors::ErrorKind;

    #[test]
    fn a_token_lasting_longer_than_issued_or_issued_in_the_future_is_refused() {
        let now = DateTime::from_timestamp(1_800_000_000, 0).expect("now");
        let ttl = Duration::from_secs(7200);
        // (iat, exp) from now, and the reason told; the lifetime issued is 7,200 s.
        let cases: [(&str, i64, i64, Option<ErrorKind>); 7] = [
            ("the lifetime issued", -60, 7140, None),
            ("the lifetime and the leeway", -60, 7145, None),
            (
                "a second beyond the leeway",
                -60,
                7146,
                Some(ErrorKind::InvalidToken),
            ),
            ("ten years", -60, 315_360_000, Some(ErrorKind::InvalidToken)),
            (
                "issued in an hour",
                3600,
                4200,
                Some(ErrorKind::ImmatureSignature),
            ),
            ("issued within the leeway", 3, 600, None),
            ("expired", -7200, -60, Some(ErrorKind::ExpiredSignature)),
        ];
        for (case, iat, exp, refused) in cases {
            let claims = Claims {
                sub: "oUser1".to_string(),
                iat: now.timestamp() + iat,
                exp: now.timestamp() + exp,
                iss: ISSUER.to_string(),
            };
            match (refused, within_lifetime(claims, now, ttl)) {
                (None, Ok(claims)) => assert_eq!(claims.sub, "oUser1", "{case}"),
                (Some(kind), Err(e)) => assert_eq!(
                    std::mem::discriminant(e.kind()),
                    std::mem::discriminant(&kind),
                    "{case}: {e:?}"
                ),
                (expected, got) => panic!("{case}: expected {expected:?}, got {got:?}"),
            }
        }
    }
}
