//! Updates as values: what a write changes, stated once, which renders the DynamoDB
//! update expression (its `#name` and `:value` placeholders numbered here, never by
//! hand) and declares the values it sets (the audit trail's entry is built from them,
//! never by reading an expression back).
//!
//! Rendered into a request only here, as [`super::expr::Cond`] is in `expr`: store
//! features compose a `Change` and hand it to [`update`] or [`Changing::changing`], and
//! `scripts/check-layout` refuses an `.update_expression(` anywhere else in the library.
//! A write of an audited item's state is built with [`WriteOf::part`], which declares
//! it (the tests' debug builds refuse one built otherwise). A transaction's put, delete
//! and check are values of the same shape ([`put`], [`delete`], [`check`]).

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, Put, ReturnValue, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem, Update,
};

use super::expr::Item;
use super::expr::{Cond, Guarded, Placeholders, Rendered};
use super::write::{Write, audited};
use crate::store::error::StoreError;

/// What a `SET` gives an attribute.
#[derive(Debug, Clone, PartialEq)]
enum To {
    /// This value.
    Value(AttributeValue),
    /// Its own number plus this step (`a = a + :v`).
    Plus(AttributeValue),
    /// Itself if present, else this value (`a = if_not_exists(a, :v)`).
    KeptOr(AttributeValue),
    /// Its list (empty if missing) with these appended
    /// (`a = list_append(if_not_exists(a, :empty), :v)`).
    Appended(AttributeValue),
}

/// What one update does to one item's top-level attributes.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Change {
    set: Vec<(String, To)>,
    add: Vec<(String, AttributeValue)>,
    delete: Vec<(String, AttributeValue)>,
    remove: Vec<String>,
}

/// A change with nothing in it yet.
pub(crate) fn change() -> Change {
    Change::default()
}

impl Change {
    /// `SET attribute = value`.
    pub(crate) fn set(mut self, attribute: impl Into<String>, value: AttributeValue) -> Self {
        self.set.push((attribute.into(), To::Value(value)));
        self
    }

    /// `SET attribute = attribute + step` (the attribute must be there).
    pub(crate) fn plus(mut self, attribute: impl Into<String>, step: i64) -> Self {
        self.set.push((
            attribute.into(),
            To::Plus(AttributeValue::N(step.to_string())),
        ));
        self
    }

    /// `SET attribute = if_not_exists(attribute, value)`.
    pub(crate) fn set_if_absent(
        mut self,
        attribute: impl Into<String>,
        value: AttributeValue,
    ) -> Self {
        self.set.push((attribute.into(), To::KeptOr(value)));
        self
    }

    /// Appends `items` to the attribute's list (an empty one if missing).
    pub(crate) fn append(
        mut self,
        attribute: impl Into<String>,
        items: Vec<AttributeValue>,
    ) -> Self {
        self.set
            .push((attribute.into(), To::Appended(AttributeValue::L(items))));
        self
    }

    /// `ADD attribute value`: a number added to (from 0), or a set's members joined.
    pub(crate) fn add(mut self, attribute: impl Into<String>, value: AttributeValue) -> Self {
        self.add.push((attribute.into(), value));
        self
    }

    /// `DELETE attribute members`: a set's members taken out.
    pub(crate) fn delete(mut self, attribute: impl Into<String>, members: AttributeValue) -> Self {
        self.delete.push((attribute.into(), members));
        self
    }

    /// `REMOVE attribute`.
    pub(crate) fn remove(mut self, attribute: impl Into<String>) -> Self {
        self.remove.push(attribute.into());
        self
    }

    /// This change and `other`'s, in one update.
    pub(crate) fn and(mut self, other: Change) -> Self {
        self.set.extend(other.set);
        self.add.extend(other.add);
        self.delete.extend(other.delete);
        self.remove.extend(other.remove);
        self
    }

    /// Whether it changes nothing (DynamoDB refuses an empty update expression).
    pub(crate) fn is_empty(&self) -> bool {
        self.set.is_empty()
            && self.add.is_empty()
            && self.delete.is_empty()
            && self.remove.is_empty()
    }

    /// Whether it changes `attribute` already.
    pub(crate) fn touches(&self, attribute: &str) -> bool {
        self.attributes().any(|a| a == attribute)
    }

    /// The attributes it names, each once per clause it is in.
    fn attributes(&self) -> impl Iterator<Item = &str> {
        self.set
            .iter()
            .map(|(a, _)| a.as_str())
            .chain(self.add.iter().map(|(a, _)| a.as_str()))
            .chain(self.delete.iter().map(|(a, _)| a.as_str()))
            .chain(self.remove.iter().map(String::as_str))
    }

    /// The attribute named twice, if one is: DynamoDB refuses such an update (two
    /// clauses on one path), so the builder refuses it first.
    fn overlap(&self) -> Option<&str> {
        let mut seen = std::collections::HashSet::new();
        self.attributes().find(|a| !seen.insert(*a))
    }

    /// The DynamoDB update expression, its placeholders starting with `prefix` (one no
    /// other placeholder of the same request starts with).
    pub(crate) fn render(&self, prefix: &str) -> Rendered {
        let mut p = Placeholders::new(prefix);
        let mut clauses = Vec::new();
        if !self.set.is_empty() {
            let set: Vec<String> = self
                .set
                .iter()
                .map(|(a, to)| {
                    let a = p.name(a);
                    match to {
                        To::Value(v) => format!("{a} = {}", p.value(v.clone())),
                        To::Plus(v) => format!("{a} = {a} + {}", p.value(v.clone())),
                        To::KeptOr(v) => {
                            format!("{a} = if_not_exists({a}, {})", p.value(v.clone()))
                        }
                        To::Appended(v) => {
                            let empty = p.value(AttributeValue::L(Vec::new()));
                            format!(
                                "{a} = list_append(if_not_exists({a}, {empty}), {})",
                                p.value(v.clone())
                            )
                        }
                    }
                })
                .collect();
            clauses.push(format!("SET {}", set.join(", ")));
        }
        for (verb, pairs) in [("ADD", &self.add), ("DELETE", &self.delete)] {
            if pairs.is_empty() {
                continue;
            }
            let listed: Vec<String> = pairs
                .iter()
                .map(|(a, v)| format!("{} {}", p.name(a), p.value(v.clone())))
                .collect();
            clauses.push(format!("{verb} {}", listed.join(", ")));
        }
        if !self.remove.is_empty() {
            let listed: Vec<String> = self.remove.iter().map(|a| p.name(a)).collect();
            clauses.push(format!("REMOVE {}", listed.join(", ")));
        }
        p.rendered(clauses.join(" "))
    }

    /// The attributes it sets to plain values (not computed from the item), with
    /// those values: what the write declares it leaves there.
    pub(crate) fn values_set(&self) -> Item {
        self.set
            .iter()
            .filter_map(|(a, to)| match to {
                To::Value(v) => Some((a.clone(), v.clone())),
                _ => None,
            })
            .collect()
    }
}

/// A request (or a transaction's write) a [`Change`] can be the update of: its
/// rendering becomes the update expression, its placeholders (starting with `u`,
/// where a guard's start with `g`) join the request's own.
pub(super) trait Changing: Sized {
    fn changing(self, change: &Change) -> Self;
}

macro_rules! changing {
    ($($builder:ty),* $(,)?) => {$(
        impl Changing for $builder {
            fn changing(self, change: &Change) -> Self {
                debug_assert!(change.overlap().is_none(), "{change:?}");
                let Rendered { expression, names, values } = change.render("u");
                let mut changed = self.update_expression(expression);
                for (placeholder, name) in names {
                    changed = changed.expression_attribute_names(placeholder, name);
                }
                for (placeholder, value) in values {
                    changed = changed.expression_attribute_values(placeholder, value);
                }
                changed
            }
        }
    )*};
}

changing!(
    aws_sdk_dynamodb::types::builders::UpdateBuilder,
    aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder,
);

/// What a transaction's write does to its item.
enum Action {
    /// Updates it by this change.
    Update(Change),
    /// Writes this whole item (its key inside).
    Put,
    /// Deletes it.
    Delete,
    /// Only checks the guard.
    Check,
}

/// One item's write as a transaction's write: `key`'s item updated, put, deleted or
/// only checked, where `guard` holds.
pub(crate) struct WriteOf<'a> {
    table: &'a str,
    /// The key (the whole item for a put).
    key: Item,
    action: Action,
    guard: Option<Cond>,
    old_on_failure: bool,
    declared_nothing: bool,
}

fn write_of(table: &str, key: Item, action: Action) -> WriteOf<'_> {
    WriteOf {
        table,
        key,
        action,
        guard: None,
        old_on_failure: false,
        declared_nothing: true,
    }
}

/// The update of the item at `key` in `table` by `change`.
pub(crate) fn update(table: &str, key: Item, change: Change) -> WriteOf<'_> {
    write_of(table, key, Action::Update(change))
}

/// The put of `item` (a whole item, its key inside) into `table`.
pub(crate) fn put(table: &str, item: Item) -> WriteOf<'_> {
    write_of(table, item, Action::Put)
}

/// The delete of the item at `key` in `table`.
pub(crate) fn delete(table: &str, key: Item) -> WriteOf<'_> {
    write_of(table, key, Action::Delete)
}

/// A check that the item at `key` in `table` meets `guard`, writing nothing.
pub(crate) fn check(table: &str, key: Item, guard: Cond) -> WriteOf<'_> {
    write_of(table, key, Action::Check).when(guard)
}

/// The condition of a versioned write: no item yet at version 0, else the item at
/// `version` as read.
pub(crate) fn versioned(version: u64) -> Cond {
    if version == 0 {
        super::expr::is_new()
    } else {
        super::expr::at_version(version)
    }
}

/// Finishes one kind of request: its guard and, asked, the old item on failure.
macro_rules! finish {
    ($builder:expr, $of:expr) => {{
        let mut builder = $builder;
        if let Some(guard) = &$of.guard {
            builder = builder.guarded(guard, "g");
        }
        if $of.old_on_failure {
            builder = builder.return_values_on_condition_check_failure(
                ReturnValuesOnConditionCheckFailure::AllOld,
            );
        }
        builder.build()?
    }};
}

impl WriteOf<'_> {
    /// Only while `guard` holds.
    pub(crate) fn when(mut self, guard: Cond) -> Self {
        self.guard = Some(guard);
        self
    }

    /// A failed condition answers with the item as it was (`ALL_OLD`).
    pub(crate) fn old_on_failure(mut self) -> Self {
        self.old_on_failure = true;
        self
    }

    /// The transaction's write, declaring what it leaves (for the audit trail: every
    /// update of an audited item's state is one of these; a put declares its item).
    pub(crate) fn part(mut self) -> Result<Write, StoreError> {
        let Action::Update(change) = &self.action else {
            return Ok(self.write()?.into());
        };
        let sets = change.values_set();
        self.declared_nothing = false;
        Ok(Write::declaring(self.write()?, sets))
    }

    /// Whether it changes the state (or result) of an item the audit trail follows.
    fn moves_state(&self) -> bool {
        let Action::Update(change) = &self.action else {
            return false;
        };
        let audited = self
            .key
            .get("sk")
            .and_then(|sk| sk.as_s().ok())
            .is_some_and(|sk| audited(sk).is_some());
        audited && (change.touches("state") || change.touches("result"))
    }

    /// The transaction's write, declaring nothing: never of an audited item's state
    /// (refused, in every build: [`WriteOf::part`] declares it, so the audit entry
    /// shows it).
    pub(crate) fn write(self) -> Result<TransactWriteItem, StoreError> {
        if self.moves_state() && self.declared_nothing {
            return Err(StoreError::Corrupt(format!(
                "an update of an audited item's state is built with WriteOf::part: {:?}",
                self.key.get("sk")
            )));
        }
        let table = self.table;
        let write = TransactWriteItem::builder();
        Ok(match &self.action {
            Action::Update(change) => write.update(finish!(
                Update::builder()
                    .table_name(table)
                    .set_key(Some(self.key.clone()))
                    .changing(change),
                self
            )),
            Action::Put => write.put(finish!(
                Put::builder()
                    .table_name(table)
                    .set_item(Some(self.key.clone())),
                self
            )),
            Action::Delete => write.delete(finish!(
                Delete::builder()
                    .table_name(table)
                    .set_key(Some(self.key.clone())),
                self
            )),
            Action::Check => write.condition_check(finish!(
                ConditionCheck::builder()
                    .table_name(table)
                    .set_key(Some(self.key.clone())),
                self
            )),
        }
        .build())
    }
}

/// Whether a single-item request failed only its condition.
fn condition_failed<E: aws_sdk_dynamodb::error::ProvideErrorMetadata>(
    err: &aws_sdk_dynamodb::error::SdkError<E, aws_smithy_runtime_api::http::Response>,
) -> bool {
    err.as_service_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "ConditionalCheckFailedException")
}

/// Sends one kind of single-item request: the item it left (`ALL_NEW` where asked, else
/// empty), or `None` when its guard did not hold.
macro_rules! send_alone {
    ($request:expr, $guard:expr) => {{
        let mut request = $request;
        if let Some(guard) = $guard {
            request = request.guarded(guard, "g");
        }
        match request.send().await {
            Ok(out) => Ok(Some(out.attributes.unwrap_or_default())),
            Err(e) if condition_failed(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }};
}

impl WriteOf<'_> {
    /// Sends it alone (an `UpdateItem`, `PutItem` or `DeleteItem`, at half a
    /// transaction's write units): whether it applied — false when its guard did not
    /// hold, an answer rather than an error.
    pub(crate) async fn apply(self, client: &Client) -> Result<bool, StoreError> {
        Ok(self.send_alone(client, false).await?.is_some())
    }

    /// An update sent alone, answering the item as it left it (`None`: its guard did
    /// not hold).
    pub(crate) async fn apply_new(self, client: &Client) -> Result<Option<Item>, StoreError> {
        self.send_alone(client, true).await
    }

    async fn send_alone(self, client: &Client, new: bool) -> Result<Option<Item>, StoreError> {
        // Refused in every build: an audited item's state moves in a transaction with
        // its history entry; and sent alone, a write answers only whether its guard
        // held (no old item on failure, a new one only from an update).
        let refused = if self.moves_state() {
            Some("an audited item's state moves in a transaction with its history entry")
        } else if self.old_on_failure {
            Some("old_on_failure is a transaction's answer")
        } else if new && !matches!(self.action, Action::Update(_)) {
            Some("only an update answers the item it left")
        } else {
            None
        };
        if let Some(why) = refused {
            return Err(StoreError::Corrupt(format!(
                "{why}: {:?}",
                self.key.get("sk")
            )));
        }
        let guard = self.guard.as_ref();
        match self.action {
            Action::Update(change) => {
                let request = client
                    .update_item()
                    .table_name(self.table)
                    .set_key(Some(self.key))
                    .changing(&change)
                    .set_return_values(new.then_some(ReturnValue::AllNew));
                send_alone!(request, guard)
            }
            Action::Put => send_alone!(
                client
                    .put_item()
                    .table_name(self.table)
                    .set_item(Some(self.key)),
                guard
            ),
            Action::Delete => send_alone!(
                client
                    .delete_item()
                    .table_name(self.table)
                    .set_key(Some(self.key)),
                guard
            ),
            Action::Check => Err(StoreError::Corrupt(
                "a check alone writes nothing: it belongs in a transaction".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
