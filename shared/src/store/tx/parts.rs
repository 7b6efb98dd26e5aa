//! Transactions with named parts: each write carries a role, and a cancellation is
//! read as which roles failed their conditions and what they held — never by position,
//! so moving a write in a transaction cannot change what its failure means.

use aws_sdk_dynamodb::types::TransactWriteItem;

use super::answer::{SentTx, TxOutcome, is_condition_failed};
use crate::store::error::StoreError;
use crate::store::handle::Store;
use crate::store::items::Item;
use crate::store::items::outbox::is_note_update;
use crate::store::items::write::Write;

/// A transaction's writes, each with its role `R`.
#[derive(Debug, Clone)]
pub(crate) struct Parts<R> {
    roles: Vec<R>,
    items: Vec<Write>,
}

impl<R: Copy + PartialEq> Parts<R> {
    pub(crate) fn new() -> Self {
        Self {
            roles: Vec::new(),
            items: Vec::new(),
        }
    }

    /// One write, playing `role`.
    pub(crate) fn add(&mut self, role: R, item: impl Into<Write>) {
        self.roles.push(role);
        self.items.push(item.into());
    }

    /// [`Parts::add`], chained.
    pub(crate) fn with(mut self, role: R, item: impl Into<Write>) -> Self {
        self.add(role, item);
        self
    }
}

impl<R: Copy + PartialEq> Parts<R> {
    /// Only the parts whose role `keep` admits.
    pub(crate) fn retain(&mut self, keep: impl Fn(R) -> bool) {
        let (roles, items) = std::mem::take(&mut self.roles)
            .into_iter()
            .zip(std::mem::take(&mut self.items))
            .filter(|(role, _)| keep(*role))
            .unzip();
        self.roles = roles;
        self.items = items;
    }
}

/// The role of a write in a transaction that carries notifications' push-status
/// updates: those alone may fail (the notification removed by its retention), and the
/// rest then lands without them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Beside {
    Write,
    /// A notification's push status.
    Note,
    /// A waiting push woken.
    Wake,
}

impl Parts<Beside> {
    /// `writes`, each a [`Beside::Note`] or a [`Beside::Write`].
    pub(crate) fn notes_apart(writes: Vec<TransactWriteItem>) -> Self {
        let mut parts = Self::new();
        for write in writes {
            let role = if is_note_update(&write) {
                Beside::Note
            } else {
                Beside::Write
            };
            parts.add(role, write);
        }
        parts
    }
}

/// What a cancelled transaction says of its parts: those whose condition failed, with
/// the item each held (when its write asked for it: `ALL_OLD`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failed<R> {
    failed: Vec<(R, Option<Item>)>,
    /// The audit entry the engine adds failed its own condition (an entry of that
    /// instant and key there already: never expected).
    audit: bool,
}

impl<R: Copy + PartialEq> Failed<R> {
    /// Whether a part playing `role` failed its condition.
    pub(crate) fn has(&self, role: R) -> bool {
        self.failed.iter().any(|(r, _)| *r == role)
    }

    /// The item the first failed part playing `role` held.
    pub(crate) fn old(&self, role: R) -> Option<&Item> {
        self.failed
            .iter()
            .find(|(r, _)| *r == role)
            .and_then(|(_, old)| old.as_ref())
    }

    /// The roles that failed, in the order of their writes.
    pub(crate) fn roles(&self) -> impl Iterator<Item = R> + '_ {
        self.failed.iter().map(|(r, _)| *r)
    }

    /// Each failed part's role and the item it held, in the order of the writes.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (R, Option<&Item>)> + '_ {
        self.failed.iter().map(|(r, old)| (*r, old.as_ref()))
    }

    /// Whether the engine's own audit entry failed its condition (never a race: an
    /// entry of that key there already).
    pub(crate) fn audit(&self) -> bool {
        self.audit
    }

    /// Whether every part that failed plays a role `of` admits (and the audit entry
    /// did not fail).
    pub(crate) fn only(&self, of: impl Fn(R) -> bool) -> bool {
        !self.audit && self.failed.iter().all(|(r, _)| of(*r))
    }
}

/// How a transaction of named parts ended.
#[derive(Debug)]
pub(crate) enum Outcome<R> {
    Committed,
    /// At least one part failed its condition.
    Cancelled(Failed<R>),
    /// Throttled, or its answer lost: it may have committed unseen (a resend with its
    /// token tells). Try again.
    Contended,
    /// Cancelled with no failed condition (in conflict with another transaction),
    /// which says nothing about the items: it did not commit. Try again.
    Conflict,
}

/// The outcome of `roles`' transaction from the engine's answer.
fn by_role<R: Copy>(roles: &[R], outcome: TxOutcome) -> Outcome<R> {
    let reasons = match outcome {
        TxOutcome::Committed => return Outcome::Committed,
        TxOutcome::Contended => return Outcome::Contended,
        TxOutcome::Cancelled(reasons) => reasons,
    };
    let mut failed = Vec::new();
    let mut audit = false;
    for (i, (code, old)) in reasons.into_iter().enumerate() {
        if !is_condition_failed(&code) {
            continue;
        }
        match roles.get(i) {
            Some(role) => failed.push((*role, old)),
            // Past the caller's parts: the audit entry the engine added.
            None => audit = true,
        }
    }
    if failed.is_empty() && !audit {
        Outcome::Conflict
    } else {
        Outcome::Cancelled(Failed { failed, audit })
    }
}

impl Store {
    /// Sends a transaction of named parts ([`Store::transact`]), its answer read by
    /// role.
    pub(crate) async fn transact_parts<R: Copy>(
        &self,
        parts: &Parts<R>,
    ) -> Result<Outcome<R>, StoreError> {
        let outcome = self.transact(parts.items.clone()).await?;
        Ok(by_role(&parts.roles, outcome))
    }

    /// [`Store::transact_parts`], keeping what was sent (for [`Store::resend`]).
    pub(crate) async fn transact_parts_kept<R: Copy>(
        &self,
        parts: &Parts<R>,
    ) -> Result<(Outcome<R>, SentTx), StoreError> {
        let (outcome, sent) = self.transact_kept(parts.items.clone()).await?;
        Ok((by_role(&parts.roles, outcome), sent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Role {
        Record,
        Counter,
        Note,
    }

    fn reason(code: &str, old: Option<&str>) -> (String, Option<Item>) {
        (
            code.to_string(),
            old.map(|sk| Item::from([("sk".to_string(), crate::store::items::s(sk))])),
        )
    }

    #[test]
    fn a_cancellation_is_read_by_role_whatever_the_order() {
        let roles = [Role::Note, Role::Record, Role::Counter, Role::Note];
        let outcome = by_role(
            &roles,
            TxOutcome::Cancelled(vec![
                reason("None", None),
                reason("ConditionalCheckFailed", Some("ACTION#1")),
                reason("None", None),
                reason("ConditionalCheckFailed", Some("NOTE#2")),
                reason("None", None),
            ]),
        );
        let Outcome::Cancelled(failed) = outcome else {
            panic!("cancelled: {outcome:?}");
        };
        assert!(failed.has(Role::Record) && failed.has(Role::Note));
        assert!(!failed.has(Role::Counter));
        assert_eq!(
            failed.old(Role::Record).and_then(|i| i.get("sk")),
            Some(&crate::store::items::s("ACTION#1"))
        );
        assert_eq!(
            failed.roles().collect::<Vec<_>>(),
            [Role::Record, Role::Note]
        );
        assert!(failed.only(|r| r != Role::Counter));
        assert!(!failed.only(|r| r == Role::Note));
        assert!(!failed.audit());
    }

    #[test]
    fn no_failed_condition_is_a_conflict_and_the_audit_entry_is_told_apart() {
        let roles = [Role::Record];
        assert!(matches!(
            by_role(
                &roles,
                TxOutcome::Cancelled(vec![
                    reason("TransactionConflict", None),
                    reason("None", None)
                ])
            ),
            Outcome::Conflict
        ));
        let Outcome::Cancelled(failed) = by_role(
            &roles,
            TxOutcome::Cancelled(vec![
                reason("None", None),
                reason("ConditionalCheckFailed", None),
            ]),
        ) else {
            panic!("cancelled");
        };
        assert!(failed.audit() && !failed.has(Role::Record));
        assert!(
            !failed.only(|_| true),
            "an audit failure is never only the caller's"
        );
        assert!(matches!(
            by_role(&roles, TxOutcome::Committed),
            Outcome::Committed
        ));
        assert!(matches!(
            by_role(&roles, TxOutcome::Contended),
            Outcome::Contended
        ));
    }
}
