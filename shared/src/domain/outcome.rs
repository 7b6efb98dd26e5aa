//! What a WeChat send's answer means for the delivery, the grant and the plan
//! (DESIGN.md §5). Pure: the dispatcher classifies, then finalizes by the class.

use serde::Serialize;

/// How a send ended, as far as onegrant can know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendResult {
    /// errcode 0: WeChat took the message. `msgid` is a u64 kept as a string.
    Sent { msgid: Option<String> },
    /// WeChat answered an errcode (after at most one token refetch and retry).
    Refused { errcode: i64, errmsg: String },
    /// No readable answer: timeout, reset, 5xx, unparseable. The message may have gone.
    Uncertain { reason: String },
    /// The request never left (no token, no connection): certainly not delivered.
    NotSent { reason: String },
    /// The message could not be built (a keyword value no truncation can make valid):
    /// never sent; needs the content or template configuration fixed.
    Invalid { reason: String },
}

/// The outcome classes of DESIGN.md §5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeClass {
    /// Delivered: delivery `sent`, grant `consumed`, plan awaits the check-in.
    Sent,
    /// Busy or throttled (-1, 45011, 43108, 45009, and token errors that persist): the
    /// grant is restored and the plan retried with backoff, paused after N attempts.
    Retryable,
    /// Template, page or content rejected (47003, 40037, 41030, 45168, 43107, 48001, and
    /// any errcode we do not know): grant restored, plan paused `config_error`, loudly.
    Config,
    /// 43101: the user has no quota WeChat recognises. This grant and every other
    /// available grant of the template become invalid; plan paused `needs_grant`.
    Refused,
    /// 40003, 50002: the openid is invalid or the user frozen. Grant invalid, plan paused.
    User,
    /// Outcome unknown: delivery `unknown`, grant invalid, plan paused `uncertain`,
    /// never resent automatically (I4).
    Unknown,
}

/// Token errcodes: refetch the token (normal mode) and retry once.
pub const TOKEN_ERRCODES: [i64; 3] = [40001, 40014, 42001];

impl SendResult {
    pub fn class(&self) -> OutcomeClass {
        match self {
            Self::Sent { .. } => OutcomeClass::Sent,
            Self::Uncertain { .. } => OutcomeClass::Unknown,
            Self::NotSent { .. } => OutcomeClass::Retryable,
            Self::Invalid { .. } => OutcomeClass::Config,
            Self::Refused { errcode, .. } => match errcode {
                -1 | 45011 | 43108 | 45009 | 40001 | 40014 | 42001 => OutcomeClass::Retryable,
                43101 => OutcomeClass::Refused,
                40003 | 50002 => OutcomeClass::User,
                47003 | 40037 | 41030 | 45168 | 43107 | 48001 => OutcomeClass::Config,
                _ => OutcomeClass::Config,
            },
        }
    }

    /// The errcode to record, if WeChat answered one.
    pub fn errcode(&self) -> Option<i64> {
        match self {
            Self::Sent { .. } => Some(0),
            Self::Refused { errcode, .. } => Some(*errcode),
            Self::Uncertain { .. } | Self::NotSent { .. } | Self::Invalid { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_the_outcome_table_classifies() {
        let refused = |errcode| SendResult::Refused {
            errcode,
            errmsg: String::new(),
        };
        let rows = [
            (-1, OutcomeClass::Retryable),
            (45011, OutcomeClass::Retryable),
            (43108, OutcomeClass::Retryable),
            (45009, OutcomeClass::Retryable),
            (40001, OutcomeClass::Retryable),
            (47003, OutcomeClass::Config),
            (40037, OutcomeClass::Config),
            (41030, OutcomeClass::Config),
            (45168, OutcomeClass::Config),
            (43107, OutcomeClass::Config),
            (48001, OutcomeClass::Config),
            (99999, OutcomeClass::Config),
            (43101, OutcomeClass::Refused),
            (40003, OutcomeClass::User),
            (50002, OutcomeClass::User),
        ];
        for (errcode, class) in rows {
            assert_eq!(refused(errcode).class(), class, "errcode {errcode}");
        }
        assert_eq!(
            SendResult::Sent {
                msgid: Some("1".into())
            }
            .class(),
            OutcomeClass::Sent
        );
        assert_eq!(
            SendResult::NotSent {
                reason: "connect".into()
            }
            .class(),
            OutcomeClass::Retryable
        );
        assert_eq!(
            SendResult::Uncertain {
                reason: "timeout".into()
            }
            .class(),
            OutcomeClass::Unknown
        );
    }
}
