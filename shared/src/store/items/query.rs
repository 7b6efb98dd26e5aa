//! Queries as values: which keys a table or index read covers (its partition, a range
//! of its sort key) and what it keeps of them, rendered into the request here with
//! numbered placeholders (`k` for the key, `f` for a filter), as writes' conditions and
//! updates are in `expr` and `change`. Store features say what they read; none writes a
//! key condition.

use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::types::AttributeValue;

use super::expr::{Cond, Placeholders, Rendered};

/// The part of a sort key a query reads.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Range {
    /// Keys that begin with this.
    Prefix(String),
    /// Keys from the first to the second, both included.
    Between(AttributeValue, AttributeValue),
    /// Keys below this.
    Below(AttributeValue),
    /// Keys up to this, included.
    UpTo(AttributeValue),
}

/// The keys a query reads: one partition, all of it or a range of its sort key, and
/// the filter its items are kept by.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Keys {
    partition: (&'static str, AttributeValue),
    range: Option<(&'static str, Range)>,
    filter: Option<Cond>,
}

/// The whole partition whose key attribute `name` is `value`.
pub(crate) fn partition(name: &'static str, value: AttributeValue) -> Keys {
    Keys {
        partition: (name, value),
        range: None,
        filter: None,
    }
}

impl Keys {
    /// Only the sort keys (attribute `name`) in `range`.
    pub(crate) fn range(mut self, name: &'static str, range: Range) -> Self {
        self.range = Some((name, range));
        self
    }

    /// Only the items `filter` holds for (read all the same: it saves the answer's
    /// size, not the read units).
    pub(crate) fn filter(mut self, filter: Cond) -> Self {
        self.filter = Some(filter);
        self
    }

    /// `query` reading these keys.
    pub(crate) fn on(self, query: QueryFluentBuilder) -> QueryFluentBuilder {
        let mut placeholders = Placeholders::new("k");
        let (name, value) = self.partition;
        let mut expression = format!(
            "{} = {}",
            placeholders.name(name),
            placeholders.value(value)
        );
        if let Some((name, range)) = self.range {
            let name = placeholders.name(name);
            let range = match range {
                Range::Prefix(prefix) => format!(
                    "begins_with({name}, {})",
                    placeholders.value(AttributeValue::S(prefix))
                ),
                Range::Between(low, high) => format!(
                    "{name} BETWEEN {} AND {}",
                    placeholders.value(low),
                    placeholders.value(high)
                ),
                Range::Below(bound) => format!("{name} < {}", placeholders.value(bound)),
                Range::UpTo(bound) => format!("{name} <= {}", placeholders.value(bound)),
            };
            expression = format!("{expression} AND {range}");
        }
        let mut query = with(placeholders.rendered(expression), query, |q, e| {
            q.key_condition_expression(e)
        });
        if let Some(filter) = self.filter {
            query = with(filter.render("f"), query, |q, e| q.filter_expression(e));
        }
        query
    }
}

/// `query` with `rendered`'s expression set by `set` and its placeholders added.
fn with(
    rendered: Rendered,
    query: QueryFluentBuilder,
    set: fn(QueryFluentBuilder, String) -> QueryFluentBuilder,
) -> QueryFluentBuilder {
    let Rendered {
        expression,
        names,
        values,
    } = rendered;
    let mut query = set(query, expression);
    for (placeholder, name) in names {
        query = query.expression_attribute_names(placeholder, name);
    }
    for (placeholder, value) in values {
        query = query.expression_attribute_values(placeholder, value);
    }
    query
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::items::expr::{Cmp, compare, is_in};
    use crate::store::items::{n, s};

    fn query() -> QueryFluentBuilder {
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .build();
        aws_sdk_dynamodb::Client::from_conf(config).query()
    }

    #[test]
    fn a_key_range_and_a_filter_render_with_placeholders_of_their_own() {
        let keys = partition("pending_pk", s("USER#o"))
            .range("pending_sk", Range::Between(s("T#"), s("T#2:")))
            .filter(compare("due_at", Cmp::Ge, n(5)).and(is_in("state", vec![s("pending")])));
        let built = keys.on(query());
        let input = built.as_input();
        assert_eq!(
            input.get_key_condition_expression().as_deref(),
            Some("#k0 = :k0 AND #k1 BETWEEN :k1 AND :k2")
        );
        assert_eq!(
            input.get_filter_expression().as_deref(),
            Some("(#f0 >= :f0) AND (#f1 IN (:f1))")
        );
        let names = input
            .get_expression_attribute_names()
            .clone()
            .unwrap_or_default();
        assert_eq!(names.get("#k1").map(String::as_str), Some("pending_sk"));
        assert_eq!(names.get("#f1").map(String::as_str), Some("state"));
        let values = input
            .get_expression_attribute_values()
            .clone()
            .unwrap_or_default();
        assert_eq!(values.get(":k2"), Some(&s("T#2:")));
        assert_eq!(values.get(":f0"), Some(&n(5)));
    }

    #[test]
    fn each_range_renders_its_comparison() {
        for (range, expected) in [
            (
                Range::Prefix("GRANT#".into()),
                "#k0 = :k0 AND begins_with(#k1, :k1)",
            ),
            (Range::Below(n(1)), "#k0 = :k0 AND #k1 < :k1"),
            (Range::UpTo(n(1)), "#k0 = :k0 AND #k1 <= :k1"),
        ] {
            let built = partition("pk", s("p")).range("sk", range).on(query());
            assert_eq!(
                built.as_input().get_key_condition_expression().as_deref(),
                Some(expected)
            );
        }
        let whole = partition("pk", s("p")).on(query());
        assert_eq!(
            whole.as_input().get_key_condition_expression().as_deref(),
            Some("#k0 = :k0")
        );
        assert_eq!(whole.as_input().get_filter_expression(), &None);
    }
}
