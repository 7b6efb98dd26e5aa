//! The audit trail's rules: what one change records, and a user's timeline built from
//! their history entries (each change with the state its entity left). The store
//! writes and reads the entries (`store::audit`).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One grant, delivery, plan or push as a transaction leaves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// `grant`, `delivery`, `plan` or `push`.
    pub entity: String,
    /// The item's sort key (`GRANT#<template>#<request_id>`, `DELIVERY#<id>`,
    /// `PLAN#<kind>`).
    pub sk: String,
    /// Its state after the change (a refusal's result for a refusal recorded).
    pub to: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msgid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errcode: Option<i64>,
    /// The outcome class of a settled delivery, or a paused plan's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One history entry as the timeline reads it: when, why, and what changed.
pub trait Entry {
    fn at(&self) -> &str;
    fn cause(&self) -> &str;
    fn changes(&self) -> &[Change];
}

/// One line of a user's timeline: a change with where the entity came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    pub at: String,
    pub cause: String,
    pub entity: String,
    pub sk: String,
    pub template_id: Option<String>,
    /// The entity's state before (its previous entry); `None` when this created it.
    pub from: Option<String>,
    pub to: String,
    pub msgid: Option<String>,
    pub errcode: Option<i64>,
    pub reason: Option<String>,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let from = self.from.as_deref().unwrap_or("(new)");
        let (at, cause, entity, sk, to) = (&self.at, &self.cause, &self.entity, &self.sk, &self.to);
        write!(f, "{at}  {cause:<34}  {entity:<8} {sk:<40} {from} → {to}")?;
        if let Some(template) = &self.template_id {
            write!(f, "  template {template}")?;
        }
        if let Some(reason) = &self.reason {
            write!(f, "  ({reason})")?;
        }
        if let Some(msgid) = &self.msgid {
            write!(f, "  msgid {msgid}")?;
        }
        if let Some(errcode) = self.errcode {
            write!(f, "  errcode {errcode}")?;
        }
        Ok(())
    }
}

/// What an entity's first change in a window read left, when the window does not
/// start at the user's first entry: unknown here.
pub const EARLIER: &str = "…";

/// A user's history entries, oldest first, as timeline lines: each change with the
/// state it left, those of `template` only (all when `None`). `from_start`: the entries
/// begin with the user's first; otherwise an entity's first change in them left a
/// state read earlier ([`EARLIER`]). A change's template is its own or the one an
/// earlier change of the same entity named: the store's history read names every
/// grant's (from its key), so a `template` filter keeps all of a template's lines.
pub fn timeline<E: Entry>(entries: &[E], template: Option<&str>, from_start: bool) -> Vec<Line> {
    let mut last: HashMap<String, String> = HashMap::new();
    // An update names no template: the entity's earlier entry (its creation) did.
    let mut templates: HashMap<String, String> = HashMap::new();
    let mut lines = Vec::new();
    for entry in entries {
        for change in entry.changes() {
            let from = last
                .insert(change.sk.clone(), change.to.clone())
                .or_else(|| (!from_start).then(|| EARLIER.to_string()));
            let template_id = change
                .template_id
                .clone()
                .or_else(|| templates.get(&change.sk).cloned());
            if let Some(template) = &template_id {
                templates.insert(change.sk.clone(), template.clone());
            }
            if template.is_some_and(|t| template_id.as_deref() != Some(t)) {
                continue;
            }
            lines.push(Line {
                at: entry.at().to_string(),
                cause: entry.cause().to_string(),
                entity: change.entity.clone(),
                sk: change.sk.clone(),
                template_id,
                from,
                to: change.to.clone(),
                msgid: change.msgid.clone(),
                errcode: change.errcode,
                reason: change.reason.clone(),
            });
        }
    }
    lines
}

/// Which part of a user's history an operator reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryWindow {
    /// From this instant on, oldest first (in the key condition: nothing earlier is
    /// read); `None`: the newest entries.
    pub since: Option<DateTime<Utc>>,
    /// Most entries read.
    pub limit: usize,
}
