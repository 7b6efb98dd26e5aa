//! Conditions as values: a rule stated once, which renders the DynamoDB condition
//! expression (its `#name` and `:value` placeholders numbered here, never by hand) and
//! evaluates against an item in Rust by the same semantics, so the store's own checks
//! on an item it read (a cancellation's old image, a read ahead of a write) and the
//! database's check of the write cannot drift apart.
//!
//! Built only in the store's item layer (`store::items` and the modules it names as
//! their rules' home): the type is the crate's, so nothing outside the store sees it.
//!
//! Evaluation follows DynamoDB's rules for what onegrant writes: a comparison with an
//! attribute the item lacks, or of another type, is false (`<>` is `NOT =`: true then,
//! as DynamoDB and the emulator answer); numbers compare as numbers, strings and
//! binaries byte by byte; `contains` looks into a string, a set or a list; `size` is a
//! string's bytes, a binary's length or a collection's count.

use std::cmp::Ordering;
use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

/// A raw DynamoDB item.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// A string attribute value.
pub(crate) fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

/// A number attribute value.
pub(crate) fn n(value: impl std::fmt::Display) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// The item does not exist yet: a put that never overwrites one.
pub(crate) fn is_new() -> Cond {
    absent("pk")
}

/// The item exists: an update that never recreates one.
pub(crate) fn is_there() -> Cond {
    exists("pk")
}

/// The item is still at `version`, as read.
pub(crate) fn at_version(version: u64) -> Cond {
    eq("version", n(version))
}

/// The item's due-index entry is still at `due_ms` (epoch ms), as seen on the index.
pub(crate) fn due_as_seen(due_ms: i64) -> Cond {
    eq("due_at", n(due_ms))
}

/// The item's lease-index entry is still at `until_ms` (epoch ms), as seen.
pub(crate) fn lease_as_seen(until_ms: i64) -> Cond {
    eq("lease_until", n(until_ms))
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Cmp {
    fn symbol(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Ne => "<>",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Ge => ">=",
        }
    }

    /// Whether `ordering` (`None`: not comparable) satisfies this comparison.
    fn holds(self, ordering: Option<Ordering>) -> bool {
        match (self, ordering) {
            (Self::Ne, None) => true,
            (_, None) => false,
            (Self::Eq, Some(o)) => o == Ordering::Equal,
            (Self::Ne, Some(o)) => o != Ordering::Equal,
            (Self::Lt, Some(o)) => o == Ordering::Less,
            (Self::Le, Some(o)) => o != Ordering::Greater,
            (Self::Gt, Some(o)) => o == Ordering::Greater,
            (Self::Ge, Some(o)) => o != Ordering::Less,
        }
    }
}

/// A condition on one item's top-level attributes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cond {
    Exists(String),
    Absent(String),
    Compare(String, Cmp, AttributeValue),
    In(String, Vec<AttributeValue>),
    Contains(String, AttributeValue),
    Size(String, Cmp, i64),
    And(Vec<Cond>),
    Or(Vec<Cond>),
    Not(Box<Cond>),
}

pub(crate) fn exists(attribute: impl Into<String>) -> Cond {
    Cond::Exists(attribute.into())
}

pub(crate) fn absent(attribute: impl Into<String>) -> Cond {
    Cond::Absent(attribute.into())
}

pub(crate) fn compare(attribute: impl Into<String>, cmp: Cmp, value: AttributeValue) -> Cond {
    Cond::Compare(attribute.into(), cmp, value)
}

pub(crate) fn eq(attribute: impl Into<String>, value: AttributeValue) -> Cond {
    compare(attribute, Cmp::Eq, value)
}

pub(crate) fn is_in(attribute: impl Into<String>, values: Vec<AttributeValue>) -> Cond {
    Cond::In(attribute.into(), values)
}

pub(crate) fn contains(attribute: impl Into<String>, value: AttributeValue) -> Cond {
    Cond::Contains(attribute.into(), value)
}

pub(crate) fn size(attribute: impl Into<String>, cmp: Cmp, count: i64) -> Cond {
    Cond::Size(attribute.into(), cmp, count)
}

/// Every one of `conditions` (true when there is none).
pub(crate) fn all(conditions: impl IntoIterator<Item = Cond>) -> Cond {
    let mut flat = Vec::new();
    for c in conditions {
        match c {
            Cond::And(inner) => flat.extend(inner),
            other => flat.push(other),
        }
    }
    if flat.len() == 1 {
        flat.remove(0)
    } else {
        Cond::And(flat)
    }
}

/// At least one of `conditions` (false when there is none).
pub(crate) fn any(conditions: impl IntoIterator<Item = Cond>) -> Cond {
    let mut flat = Vec::new();
    for c in conditions {
        match c {
            Cond::Or(inner) => flat.extend(inner),
            other => flat.push(other),
        }
    }
    if flat.len() == 1 {
        flat.remove(0)
    } else {
        Cond::Or(flat)
    }
}

impl Cond {
    pub(crate) fn and(self, other: Cond) -> Cond {
        all([self, other])
    }

    pub(crate) fn or(self, other: Cond) -> Cond {
        any([self, other])
    }
}

impl std::ops::Not for Cond {
    type Output = Cond;

    fn not(self) -> Cond {
        match self {
            Cond::Not(inner) => *inner,
            other => Cond::Not(Box::new(other)),
        }
    }
}

/// A rendered condition: the expression and the placeholders it uses, to add to a
/// request's own.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rendered {
    pub expression: String,
    pub names: HashMap<String, String>,
    pub values: HashMap<String, AttributeValue>,
}

/// Numbers the placeholders of one rendering: `#{prefix}{i}` per attribute name (one
/// per distinct name), `:{prefix}{i}` per value. (Conditions here, updates in
/// `items::change`.)
pub(super) struct Placeholders<'a> {
    prefix: &'a str,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl<'a> Placeholders<'a> {
    pub(super) fn new(prefix: &'a str) -> Self {
        Self {
            prefix,
            names: HashMap::new(),
            values: HashMap::new(),
        }
    }

    /// `expression` with the placeholders it was rendered with.
    pub(super) fn rendered(self, expression: String) -> Rendered {
        Rendered {
            expression,
            names: self.names,
            values: self.values,
        }
    }

    pub(super) fn name(&mut self, attribute: &str) -> String {
        if let Some((placeholder, _)) = self.names.iter().find(|(_, a)| *a == attribute) {
            return placeholder.clone();
        }
        let placeholder = format!("#{}{}", self.prefix, self.names.len());
        self.names
            .insert(placeholder.clone(), attribute.to_string());
        placeholder
    }

    pub(super) fn value(&mut self, value: AttributeValue) -> String {
        let placeholder = format!(":{}{}", self.prefix, self.values.len());
        self.values.insert(placeholder.clone(), value);
        placeholder
    }

    fn render(&mut self, cond: &Cond) -> String {
        match cond {
            Cond::Exists(a) => format!("attribute_exists({})", self.name(a)),
            Cond::Absent(a) => format!("attribute_not_exists({})", self.name(a)),
            Cond::Compare(a, cmp, v) => {
                let name = self.name(a);
                format!("{name} {} {}", cmp.symbol(), self.value(v.clone()))
            }
            Cond::In(a, vs) => {
                let name = self.name(a);
                let listed: Vec<String> = vs.iter().map(|v| self.value(v.clone())).collect();
                format!("{name} IN ({})", listed.join(", "))
            }
            Cond::Contains(a, v) => {
                let name = self.name(a);
                format!("contains({name}, {})", self.value(v.clone()))
            }
            Cond::Size(a, cmp, count) => {
                let name = self.name(a);
                let count = self.value(AttributeValue::N(count.to_string()));
                format!("size({name}) {} {count}", cmp.symbol())
            }
            Cond::And(cs) => self.join(cs, " AND "),
            Cond::Or(cs) => self.join(cs, " OR "),
            Cond::Not(c) => format!("NOT ({})", self.render(c)),
        }
    }

    fn join(&mut self, conditions: &[Cond], with: &str) -> String {
        let parts: Vec<String> = conditions
            .iter()
            .map(|c| format!("({})", self.render(c)))
            .collect();
        parts.join(with)
    }
}

impl Cond {
    /// The DynamoDB condition expression, its placeholders starting with `prefix` (one
    /// no other placeholder of the same request starts with).
    pub(crate) fn render(&self, prefix: &str) -> Rendered {
        let mut placeholders = Placeholders::new(prefix);
        let expression = placeholders.render(self);
        placeholders.rendered(expression)
    }

    /// Whether `item` (an empty one for an item that does not exist) satisfies it, as
    /// DynamoDB would decide.
    pub(crate) fn holds(&self, item: &Item) -> bool {
        match self {
            Cond::Exists(a) => item.contains_key(a),
            Cond::Absent(a) => !item.contains_key(a),
            Cond::Compare(a, cmp, v) => match item.get(a) {
                Some(have) => cmp.holds(order(have, v)),
                None => *cmp == Cmp::Ne,
            },
            Cond::In(a, vs) => item
                .get(a)
                .is_some_and(|have| vs.iter().any(|v| order(have, v) == Some(Ordering::Equal))),
            Cond::Contains(a, v) => item.get(a).is_some_and(|have| contained(have, v)),
            Cond::Size(a, cmp, count) => item
                .get(a)
                .and_then(size_of)
                .is_some_and(|have| cmp.holds(Some(have.cmp(count)))),
            Cond::And(cs) => cs.iter().all(|c| c.holds(item)),
            Cond::Or(cs) => cs.iter().any(|c| c.holds(item)),
            Cond::Not(c) => !c.holds(item),
        }
    }
}

/// A request (or a transaction's write) a [`Cond`] can guard: its rendering becomes the
/// condition expression, its placeholders join the request's own.
pub(super) trait Guarded: Sized {
    /// Guards this request with `cond`, its placeholders starting with `prefix`.
    fn guarded(self, cond: &Cond, prefix: &str) -> Self;
}

macro_rules! guarded {
    ($($builder:ty),* $(,)?) => {$(
        impl Guarded for $builder {
            fn guarded(self, cond: &Cond, prefix: &str) -> Self {
                let Rendered { expression, names, values } = cond.render(prefix);
                let mut guarded = self.condition_expression(expression);
                for (placeholder, name) in names {
                    guarded = guarded.expression_attribute_names(placeholder, name);
                }
                for (placeholder, value) in values {
                    guarded = guarded.expression_attribute_values(placeholder, value);
                }
                guarded
            }
        }
    )*};
}

guarded!(
    aws_sdk_dynamodb::types::builders::UpdateBuilder,
    aws_sdk_dynamodb::types::builders::PutBuilder,
    aws_sdk_dynamodb::types::builders::DeleteBuilder,
    aws_sdk_dynamodb::types::builders::ConditionCheckBuilder,
    aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder,
    aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder,
    aws_sdk_dynamodb::operation::delete_item::builders::DeleteItemFluentBuilder,
);

/// How two values order, if they can be compared: of one type, and for `<`/`>` a
/// scalar one (numbers as numbers, strings and binaries byte by byte); other types
/// only equal or not (sets in any order).
fn order(a: &AttributeValue, b: &AttributeValue) -> Option<Ordering> {
    use AttributeValue as V;
    match (a, b) {
        (V::S(x), V::S(y)) => Some(x.as_bytes().cmp(y.as_bytes())),
        (V::N(x), V::N(y)) => number_order(x, y),
        (V::B(x), V::B(y)) => Some(x.as_ref().cmp(y.as_ref())),
        (V::Ss(x), V::Ss(y)) | (V::Ns(x), V::Ns(y)) => same_set(x, y),
        // Other types: equal or not; no order is claimed (so `<`/`>` are false, and
        // of two types only `<>` holds).
        _ => (a == b).then_some(Ordering::Equal),
    }
}

/// Equal sets, whatever their order (`None`: unequal, which only `<>` admits).
fn same_set(x: &[String], y: &[String]) -> Option<Ordering> {
    let mut x: Vec<&String> = x.iter().collect();
    let mut y: Vec<&String> = y.iter().collect();
    x.sort();
    y.sort();
    (x == y).then_some(Ordering::Equal)
}

/// Numbers as numbers: integers exactly, others as floating point.
fn number_order(x: &str, y: &str) -> Option<Ordering> {
    if let (Ok(x), Ok(y)) = (x.trim().parse::<i128>(), y.trim().parse::<i128>()) {
        return Some(x.cmp(&y));
    }
    let (x, y) = (x.trim().parse::<f64>().ok()?, y.trim().parse::<f64>().ok()?);
    x.partial_cmp(&y)
}

fn contained(have: &AttributeValue, v: &AttributeValue) -> bool {
    use AttributeValue as V;
    match (have, v) {
        (V::S(s), V::S(part)) => s.contains(part.as_str()),
        (V::Ss(set), V::S(one)) | (V::Ns(set), V::N(one)) => set.iter().any(|m| m == one),
        (V::L(list), one) => list.iter().any(|m| order(m, one) == Some(Ordering::Equal)),
        _ => false,
    }
}

fn size_of(v: &AttributeValue) -> Option<i64> {
    use AttributeValue as V;
    let size = match v {
        V::S(s) => s.len(),
        V::B(b) => b.as_ref().len(),
        V::Ss(x) | V::Ns(x) => x.len(),
        V::Bs(x) => x.len(),
        V::L(x) => x.len(),
        V::M(x) => x.len(),
        _ => return None,
    };
    i64::try_from(size).ok()
}

#[cfg(test)]
mod tests;
