//! Publishers: the business backends that send onegrant notifications, each known by
//! its `source` (the idempotency keys' scope) and kept in its own lane.
//!
//! - Over HTTP a publisher signs each request with its key ([`signature`]): a
//!   [`Publishers`] list, from `ONEGRANT_PUBLISHERS` (locally) or the stack's publishers
//!   secret, says which keys each `source` holds (two at once while one is rotated) and
//!   where its outcomes go (`webhook`).
//! - On EventBridge the event's `account`, set by EventBridge and not by the sender,
//!   must be paired with its `source` ([`Lanes`], `PUBLISHER_LANES`): a source with a
//!   lane belongs to its accounts only.

pub mod signature;

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use super::inbox::is_publisher;

/// The publisher name onegrant signs its own webhook posts with.
pub const ONEGRANT: &str = "onegrant";

/// The shortest key a publisher may hold: 128 bits of HMAC key material, written as
/// text (the key is used as its UTF-8 bytes).
pub const MIN_KEY_CHARS: usize = 16;

/// A publisher's signing key: usable, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(String);

impl Key {
    pub fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// One publisher: its `source`, the keys it may sign with (the current first), and the
/// URL its outcomes are posted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publisher {
    pub source: String,
    keys: Vec<Key>,
    pub webhook: Option<String>,
}

impl Publisher {
    /// The keys a request may be signed with: the current one, then the previous one
    /// while a rotation lasts.
    pub fn keys(&self) -> &[Key] {
        &self.keys
    }

    /// The key onegrant signs with (its webhook posts): the current one.
    pub fn current_key(&self) -> &Key {
        // Parsing admits no publisher without a key.
        &self.keys[0]
    }
}

/// Every publisher allowed to call the publisher API (none: the API refuses all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Publishers(Vec<Publisher>);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublisherEntry {
    source: String,
    key: String,
    #[serde(default)]
    previous_key: Option<String>,
    #[serde(default)]
    webhook: Option<String>,
}

impl Publishers {
    /// `ONEGRANT_PUBLISHERS`: a JSON list of `{"source", "key", "previous_key"?,
    /// "webhook"?}`; each source once, each key at least [`MIN_KEY_CHARS`] characters and
    /// held by no other publisher, each webhook an `https://` URL (or `http://` to this
    /// machine, for local runs).
    pub fn parse(json: &str) -> Result<Self, String> {
        // Serde's message may quote a value, a key among them: only where it failed.
        let entries: Vec<PublisherEntry> = serde_json::from_str(json).map_err(|e| {
            format!(
                "expected a JSON list of {{\"source\", \"key\", \"previous_key\"?, \"webhook\"?}} (line {}, column {})",
                e.line(),
                e.column()
            )
        })?;
        let mut publishers: Vec<Publisher> = Vec::with_capacity(entries.len());
        for entry in entries {
            if !is_publisher(&entry.source) {
                return Err(format!(
                    "publisher {:?}: a source is 1 to 128 printable ASCII characters without '#'",
                    entry.source
                ));
            }
            if entry.source == ONEGRANT {
                return Err(format!(
                    "publisher {:?} is onegrant's own name (its notices, its webhook posts)",
                    entry.source
                ));
            }
            if publishers.iter().any(|p| p.source == entry.source) {
                return Err(format!("publisher {:?} is listed twice", entry.source));
            }
            let mut keys = vec![entry.key];
            keys.extend(entry.previous_key);
            if keys.iter().any(|k| k.chars().count() < MIN_KEY_CHARS) {
                return Err(format!(
                    "publisher {:?}: each key needs at least {MIN_KEY_CHARS} characters",
                    entry.source
                ));
            }
            // The signed text names no publisher: a key two publishers share would let a
            // request of one pass as the other's (a rotation's copy and paste, say).
            if publishers
                .iter()
                .flat_map(|p| p.keys.iter())
                .any(|held| keys.contains(&held.0))
            {
                return Err(format!(
                    "publisher {:?}: a key is another publisher's: each publisher signs with its own",
                    entry.source
                ));
            }
            if let Some(url) = &entry.webhook
                && !is_webhook(url)
            {
                return Err(format!(
                    "publisher {:?}: a webhook is an https:// URL (http:// only to localhost)",
                    entry.source
                ));
            }
            publishers.push(Publisher {
                source: entry.source,
                keys: keys.into_iter().map(Key).collect(),
                webhook: entry.webhook,
            });
        }
        Ok(Self(publishers))
    }

    /// The publisher named `source`.
    pub fn get(&self, source: &str) -> Option<&Publisher> {
        self.0.iter().find(|p| p.source == source)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Publisher> {
        self.0.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether `url` can be a webhook: `https://` to a named host, or `http://` to this
/// machine only (local runs), without credentials in it, at most 2,048 characters.
fn is_webhook(url: &str) -> bool {
    let Ok(parsed) = url::Url::parse(url) else {
        return false;
    };
    let host = parsed.host_str().unwrap_or_default();
    let local = matches!(host, "localhost" | "127.0.0.1" | "[::1]");
    let scheme_fits = match parsed.scheme() {
        "https" => !host.is_empty(),
        "http" => local,
        _ => false,
    };
    scheme_fits && parsed.username().is_empty() && parsed.password().is_none() && url.len() <= 2048
}

/// Which accounts may publish as which `source` on EventBridge (`PUBLISHER_LANES`:
/// `source=account[;account…]`, comma-separated). A source with a lane is refused from
/// every other account, the stack's own included; a source with none is the stack's
/// own account's alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lanes(BTreeMap<String, Vec<String>>);

/// Why an event's `source` and `account` do not go together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfLane {
    /// The source's lane names other accounts.
    Paired,
    /// No lane names the source and the account is not the stack's own.
    Foreign,
}

impl Lanes {
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut lanes: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for lane in list.split(',').map(str::trim).filter(|l| !l.is_empty()) {
            let (source, accounts) = lane
                .split_once('=')
                .ok_or_else(|| format!("lane {lane:?}: expected source=account[;account…]"))?;
            let source = source.trim();
            if !is_publisher(source) {
                return Err(format!("lane {lane:?}: {source:?} cannot name a publisher"));
            }
            let accounts: Vec<String> = accounts.split(';').map(|a| a.trim().to_string()).collect();
            if !accounts.iter().all(|a| is_account(a)) {
                return Err(format!("lane {lane:?}: an account is 12 digits"));
            }
            lanes
                .entry(source.to_string())
                .or_default()
                .extend(accounts);
        }
        Ok(Self(lanes))
    }

    /// Whether an event of `source` put by `account` is in its lane, on the bus of the
    /// stack in `own_account`.
    pub fn admits(&self, source: &str, account: &str, own_account: &str) -> Result<(), OutOfLane> {
        match self.0.get(source) {
            Some(accounts) if accounts.iter().any(|a| a == account) => Ok(()),
            Some(_) => Err(OutOfLane::Paired),
            None if account == own_account && is_account(account) => Ok(()),
            None => Err(OutOfLane::Foreign),
        }
    }
}

fn is_account(account: &str) -> bool {
    account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit())
}

/// The `account` of an EventBridge event (empty when absent).
pub fn event_account(event: &Value) -> &str {
    event
        .get("account")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
