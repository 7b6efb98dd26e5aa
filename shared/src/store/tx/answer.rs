//! A transaction's answer as the engine hands it back, and the one reading of
//! DynamoDB's cancellation code.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

/// Whether a cancellation reason code is a failed condition (the one place that
/// names DynamoDB's code).
pub(crate) fn is_condition_failed(code: &str) -> bool {
    code == "ConditionalCheckFailed"
}

/// A transaction as it was sent (with what [`Store::transact`] adds) and its token.
pub(crate) struct SentTx {
    pub(super) items: Vec<TransactWriteItem>,
    pub(super) token: String,
}

pub(crate) enum TxOutcome {
    Committed,
    /// Cancelled, with each item's (reason code, ALL_OLD item).
    Cancelled(Vec<(String, Option<HashMap<String, AttributeValue>>)>),
    /// Throttled or in conflict with another transaction.
    Contended,
}
