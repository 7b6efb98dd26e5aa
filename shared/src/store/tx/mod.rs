//! The transaction engine: one `TransactWriteItems` sent with one token, its answer
//! sorted (committed, cancelled with each item's reason, contended). The only place
//! that reads a cancellation reason code.

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;

use crate::store::error::{StoreError, classify_sdk_error};
use crate::store::handle::Store;
use crate::store::retry::Attempt;

mod answer;
mod parts;
pub(crate) use crate::store::items::write::Write;
pub(crate) use answer::{SentTx, TxOutcome};
pub(crate) use parts::{Beside, Outcome, Parts};

impl Store {
    /// Sends a transaction and sorts the answer: committed; cancelled, with each item's
    /// reason and ALL_OLD item (the caller decides: replay, conflict or retry); or
    /// contended (throttled, in conflict with another transaction — retry). `Err` only
    /// for failures a retry will not fix.
    pub(crate) async fn transact(
        &self,
        items: Vec<impl Into<Write>>,
    ) -> Result<TxOutcome, StoreError> {
        Ok(self.transact_kept(items).await?.0)
    }

    /// One try of a contended write: `done` once `writes` committed, else (refused by a
    /// part, or contended) read again and retry.
    pub(crate) async fn commit_or_retry<T>(
        &self,
        writes: Vec<impl Into<Write>>,
        done: T,
    ) -> Result<Attempt<T>, StoreError> {
        Ok(match self.transact(writes).await? {
            TxOutcome::Committed => Attempt::Done(done),
            TxOutcome::Cancelled(_) | TxOutcome::Contended => Attempt::Retry,
        })
    }

    /// [`Store::transact`], keeping what was sent: a caller whose transaction ended
    /// `Contended` (it may have committed unseen) and that then reads its work done
    /// can [`Store::resend`] it to learn whether the work was its own.
    pub(crate) async fn transact_kept(
        &self,
        writes: Vec<impl Into<Write>>,
    ) -> Result<(TxOutcome, SentTx), StoreError> {
        let writes: Vec<Write> = writes.into_iter().map(Into::into).collect();
        // One token for every attempt below: a retry after a commit whose answer was
        // lost gets that answer instead of failing its own conditions (and a caller
        // reading again would take its own write for someone else's).
        let items = if self.limits.audit {
            crate::store::audit::with_history(
                &writes,
                &self.table,
                self.clock.now(),
                self.limits.retention.grants,
            )?
        } else {
            writes.into_iter().map(Write::into_item).collect()
        };
        let sent = SentTx {
            items,
            token: crate::store::handle::request_token(),
        };
        let outcome = self.resend(&sent).await?;
        Ok((outcome, sent))
    }

    /// Sends a transaction with its token: first, or again after it ended `Contended`
    /// (DynamoDB then answers for the token — committed, if that attempt did — or runs
    /// it now against the items as they are: cancelled, if its conditions no longer
    /// hold).
    pub(crate) async fn resend(&self, sent_tx: &SentTx) -> Result<TxOutcome, StoreError> {
        let (items, token) = (&sent_tx.items, &sent_tx.token);
        let started = tokio::time::Instant::now();
        // Set once an attempt may have committed unseen: from then on an answer that
        // only says "not this attempt" (a throttle, the token in progress) proves
        // nothing, and only DynamoDB's answer for the token ends the call.
        let mut ambiguous = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            // The SDK's own retries are off here: this loop sees every attempt, so it
            // knows whether one may have committed.
            let sent = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .client_request_token(token)
                .customize()
                .config_override(
                    aws_sdk_dynamodb::config::Builder::new()
                        .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled()),
                )
                .send()
                .await;
            let again = match &sent {
                Err(err) if may_have_committed(err) => {
                    ambiguous = true;
                    true
                }
                Err(err) => did_not_run(err),
                Ok(_) => false,
            };
            // After an attempt that may have committed, keep asking (longer, and with
            // longer pauses: that attempt may still be running, and "in progress" until
            // it ends) until DynamoDB answers for the token or the budget is spent.
            let limit = if ambiguous {
                AMBIGUOUS_ATTEMPTS
            } else {
                TRANSACT_ATTEMPTS
            };
            if again && attempt < limit && started.elapsed() < self.limits.write_budget {
                let pause = if ambiguous {
                    tracing::warn!(
                        attempt,
                        "a transaction's outcome is unknown; sent again with its token"
                    );
                    AMBIGUOUS_PAUSE * 2u32.pow(attempt.min(4))
                } else {
                    crate::store::retry::backoff(attempt + 1)
                };
                tokio::time::sleep(pause).await;
                continue;
            }
            return self.sort_transaction(sent);
        }
    }

    pub(crate) fn sort_transaction(
        &self,
        sent: Result<
            aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsOutput,
            aws_sdk_dynamodb::error::SdkError<
                TransactWriteItemsError,
                aws_smithy_runtime_api::http::Response,
            >,
        >,
    ) -> Result<TxOutcome, StoreError> {
        match sent {
            Ok(_) => Ok(TxOutcome::Committed),
            Err(err) => {
                if let aws_sdk_dynamodb::error::SdkError::ServiceError(ref service) = err
                    && let TransactWriteItemsError::TransactionCanceledException(cancelled) =
                        service.err()
                {
                    let reasons = cancelled
                        .cancellation_reasons()
                        .iter()
                        .map(|r| (r.code().unwrap_or("None").to_string(), r.item().cloned()))
                        .collect();
                    return Ok(TxOutcome::Cancelled(reasons));
                }
                if may_have_committed(&err) || did_not_run(&err) {
                    return Ok(TxOutcome::Contended);
                }
                match classify_sdk_error(err, crate::store::tx::transact_unavailable) {
                    StoreError::Unavailable(_) => Ok(TxOutcome::Contended),
                    other => Err(other),
                }
            }
        }
    }
}

/// How many times one transaction is sent (with one token) before the caller is told
/// it was contended: it reads afresh and decides again, within its write budget.
const TRANSACT_ATTEMPTS: u32 = 5;

/// The same once an attempt may have committed unseen (still within the write budget),
/// with pauses doubling from 50 ms to 400 ms (about 2.7 s in all): the attempt whose
/// answer was lost may still be running, and its token "in progress" until it ends.
const AMBIGUOUS_ATTEMPTS: u32 = 10;
const AMBIGUOUS_PAUSE: std::time::Duration = std::time::Duration::from_millis(25);

/// Whether a failed transaction may have committed: no answer (a timeout, a dropped
/// connection, an unreadable answer) or a server error (500, and the 502/503/504s
/// DynamoDB's front end may answer unmodelled). Sending it again with the same token is
/// right: DynamoDB answers a committed token with that commit's success (for 10
/// minutes), and runs one that never committed.
fn may_have_committed(
    err: &aws_sdk_dynamodb::error::SdkError<
        TransactWriteItemsError,
        aws_smithy_runtime_api::http::Response,
    >,
) -> bool {
    use aws_sdk_dynamodb::error::SdkError;
    match err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(service) => {
            matches!(
                service.err(),
                TransactWriteItemsError::InternalServerError(_)
            ) || service.raw().status().is_server_error()
        }
        _ => false,
    }
}

/// Whether DynamoDB says it did not run this attempt: a throttle, or another attempt
/// with the same token still in progress. Worth sending again as it is (a cancellation
/// is definite and goes back to the caller: a committed token is never cancelled).
fn did_not_run(
    err: &aws_sdk_dynamodb::error::SdkError<
        TransactWriteItemsError,
        aws_smithy_runtime_api::http::Response,
    >,
) -> bool {
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;
    match err {
        aws_sdk_dynamodb::error::SdkError::ServiceError(service) => {
            crate::store::tx::transact_unavailable(service.err())
                // Throttles the model does not name, as the SDK's own retries know them.
                || matches!(
                    service.err().code(),
                    Some("LimitExceededException" | "RequestLimitExceeded" | "ThrottlingException" | "Throttling" | "TooManyRequestsException")
                )
        }
        _ => false,
    }
}

/// Transaction errors that mean "try again later".
pub(crate) fn transact_unavailable(err: &TransactWriteItemsError) -> bool {
    matches!(
        err,
        TransactWriteItemsError::TransactionInProgressException(_)
            | TransactWriteItemsError::ProvisionedThroughputExceededException(_)
            | TransactWriteItemsError::RequestLimitExceeded(_)
            | TransactWriteItemsError::ThrottlingException(_)
            | TransactWriteItemsError::InternalServerError(_)
    )
}
