//! Identifier newtypes, validated at the edge.
//!
//! Each id is also a DynamoDB key component, so each excludes `#`, the key separator.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a string is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{kind} must be 1 to {max} characters long")]
    Length { kind: &'static str, max: usize },
    #[error("{kind} may contain only {allowed}")]
    Characters {
        kind: &'static str,
        allowed: &'static str,
    },
}

fn check(
    value: &str,
    kind: &'static str,
    max: usize,
    allowed: &'static str,
    ok: impl Fn(char) -> bool,
) -> Result<(), IdError> {
    if value.is_empty() || value.len() > max {
        return Err(IdError::Length { kind, max });
    }
    if !value.chars().all(ok) {
        return Err(IdError::Characters { kind, allowed });
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:literal, $allowed:literal, $ok:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `value`.
            pub fn parse(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                check(&value, $kind, $max, $allowed, $ok)?;
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                Self::parse(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

id_type!(
    /// A user's openid within this mini-program: the account identity. WeChat issues
    /// 28 characters of `[A-Za-z0-9_-]`; we accept up to 64.
    OpenId,
    "openid",
    64,
    "letters, digits, '_' and '-'",
    |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-'
);

id_type!(
    /// A subscription-message template id (`priTmplId`), as configured.
    TemplateId,
    "template_id",
    128,
    "letters, digits, '_' and '-'",
    |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-'
);

id_type!(
    /// A client-chosen idempotency key for a grant report (`request_id`, API.md).
    RequestId,
    "request_id",
    64,
    "letters, digits and '_', '.', ':', '-'",
    |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-')
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_follow_the_api_alphabet() {
        for ok in ["wr_1", "a", "wr.m:1-x_Y", &"x".repeat(64)] {
            assert!(RequestId::parse(ok).is_ok(), "{ok} should be accepted");
        }
        for bad in [
            "",
            "has space",
            "hash#sign",
            "中文",
            &"x".repeat(65),
            "slash/",
        ] {
            assert!(RequestId::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn openids_refuse_key_separators() {
        assert!(OpenId::parse("oAbc_12-3").is_ok());
        assert!(OpenId::parse("o#1").is_err());
        assert!(OpenId::parse("o.1").is_err());
    }
}
