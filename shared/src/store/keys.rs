//! Item keys. Ids never contain `#` (see `domain::ids`), so keys parse unambiguously.

use sha2::{Digest, Sha256};

use crate::domain::reminders::KindName;
use crate::domain::{OpenId, RequestId, TemplateId};

const USER_PREFIX: &str = "USER#";
pub const PLAN_PREFIX: &str = "PLAN#";
pub const OUTBOX_PREFIX: &str = "OUTBOX#";
pub const DELIVERY_PREFIX: &str = "DELIVERY#";
const NOTE_PREFIX: &str = "NOTE#";
const UNREAD_PREFIX: &str = "UNREAD#";
pub const SCHEDULED_PREFIX: &str = "SCHEDULED#";
/// Recorded WeChat events (`PUSH#<event>#<create time>#<items>`).
pub const EVENT_PREFIX: &str = "PUSH#";

/// The partition of everything one user owns.
pub fn user_pk(openid: &OpenId) -> String {
    format!("{USER_PREFIX}{openid}")
}

/// The user a partition key belongs to, if it is a user's partition.
pub fn openid_of(pk: &str) -> Option<OpenId> {
    pk.strip_prefix(USER_PREFIX)
        .and_then(|o| OpenId::parse(o).ok())
}

/// What a sort key names (for items reached through an index, keys only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey<'a> {
    /// A plan, by its kind's name.
    Plan(&'a str),
    /// A push, by its notification id.
    Outbox(&'a str),
    /// A notification waiting for its `send_at`, by its id.
    Scheduled(&'a str),
    Delivery(&'a str),
    /// A recorded WeChat event (on the lease index until applied).
    Event,
    Other,
}

/// Reads a sort key.
pub fn sort_key(sk: &str) -> SortKey<'_> {
    if let Some(kind) = sk.strip_prefix(PLAN_PREFIX) {
        SortKey::Plan(kind)
    } else if let Some(note) = sk.strip_prefix(OUTBOX_PREFIX) {
        SortKey::Outbox(note)
    } else if let Some(note) = sk.strip_prefix(SCHEDULED_PREFIX) {
        SortKey::Scheduled(note)
    } else if let Some(id) = sk.strip_prefix(DELIVERY_PREFIX) {
        SortKey::Delivery(id)
    } else if sk.starts_with(EVENT_PREFIX) {
        SortKey::Event
    } else {
        SortKey::Other
    }
}

/// Sort-key prefix of the notifications (one `begins_with` query lists them).
pub const NOTES: &str = NOTE_PREFIX;

/// Sort-key prefix of the per-template quota counters.
pub const QUOTA_PREFIX: &str = "QUOTA#";

/// The quota counters of one template.
pub fn quota_sk(template: &TemplateId) -> String {
    format!("{QUOTA_PREFIX}{template}")
}

/// Sort-key prefix of the subscription-result ledger (grants and refusals).
pub const GRANT_PREFIX: &str = "GRANT#";

/// One subscription result: a grant when accepted. Template first, so the grants of
/// one template are one `begins_with` query.
pub fn grant_sk(template: &TemplateId, request_id: &RequestId) -> String {
    format!("{GRANT_PREFIX}{template}#{request_id}")
}

/// The request id a grant's sort key names (what the quota item's open-grant sets hold).
pub fn request_id_of_grant(sk: &str) -> Option<RequestId> {
    let rest = sk.strip_prefix(GRANT_PREFIX)?;
    let (_template, request) = rest.split_once('#')?;
    RequestId::parse(request).ok()
}

/// The template a grant's sort key names.
pub fn template_of_grant(sk: &str) -> Option<String> {
    let rest = sk.strip_prefix(GRANT_PREFIX)?;
    rest.split('#').next().map(str::to_string)
}

/// A user's plan for one reminder kind.
pub fn plan_sk(kind: &KindName) -> String {
    format!("{PLAN_PREFIX}{kind}")
}

/// The counters of a user's writes in one minute (`minute`: epoch minutes): grant
/// reports (`reports`) and other changes (`changes`).
pub fn rate_sk(minute: i64) -> String {
    format!("RATE#{minute}")
}

/// An open push's sort key on the `pending` index: its template, then its waiting-list
/// member (rank, then note id), so a claim reads the better open pushes of its
/// template as one key range (`domain::dispatch::priority::at_grant_due`).
pub fn pending_sk(
    template: &str,
    priority: crate::domain::template::Priority,
    note_id: &str,
) -> String {
    format!(
        "{template}#{}",
        crate::domain::dispatch::priority::member(priority, note_id)
    )
}

/// An open push's partition on the `lane` index: its publisher's share of the user's
/// open pushes (a publisher's name has no `#`, so the first one ends it).
pub fn lane_pk(publisher: &str, user_pk: &str) -> String {
    format!("{publisher}#{user_pk}")
}

/// A publisher's own partition (its rate counts): outside every user's.
pub fn publisher_pk(source: &str) -> String {
    format!("PUBLISHER#{source}")
}

/// The user's read counter of one minute (apart from the write counters, which
/// transactions write: a read never contends with the user's own writes).
pub fn read_rate_sk(minute: i64) -> String {
    format!("RATE#{minute}#reads")
}

/// A check-in's action record (the idempotency record of `action_id`).
pub fn action_sk(action_id: &RequestId) -> String {
    format!("ACTION#{action_id}")
}

/// A notification in the inbox; ids sort by creation time, so sort keys do too.
pub fn note_sk(id: &str) -> String {
    format!("{NOTE_PREFIX}{id}")
}

/// Sort-key prefix of the unread markers: one small item per unread notification, so
/// `read=false` pages and read-all read only what is unread.
pub const UNREADS: &str = UNREAD_PREFIX;

/// The unread marker of notification `id` (exists exactly while it is unread).
pub fn unread_sk(id: &str) -> String {
    format!("{UNREAD_PREFIX}{id}")
}

/// The notification id a note's or an unread marker's sort key names.
pub fn note_id_of(sk: &str) -> Option<&str> {
    sk.strip_prefix(NOTE_PREFIX)
        .or_else(|| sk.strip_prefix(UNREAD_PREFIX))
}

/// The WeChat push of a notification.
pub fn outbox_sk(note_id: &str) -> String {
    format!("{OUTBOX_PREFIX}{note_id}")
}

/// A notification waiting for its `send_at` (with its push): not under the
/// notifications' prefix, so no listing, count or read-all meets it before it is
/// published.
pub fn scheduled_sk(note_id: &str) -> String {
    format!("{SCHEDULED_PREFIX}{note_id}")
}

/// The newest notification of a user with one publisher's `collapse_key`.
pub fn collapse_sk(publisher: &str, key: &str) -> String {
    format!("COLLAPSE#{publisher}#{key}")
}

/// The idempotency record of an ingested event: one item per (publisher, key), outside
/// every user's partition, so a key is unique per publisher across users (neither part
/// may contain `#`).
pub fn event_key(publisher: &str, key: &str) -> (String, String) {
    (format!("EVENT#{publisher}#{key}"), "EVENT".to_string())
}

/// Where an event's record was kept before keys were scoped per publisher: the user's
/// partition (checked by ingest for one retention period after the change).
pub fn legacy_event_sk(key: &str) -> String {
    format!("EVENT#{key}")
}

/// The dispatcher's shard registry (see `store::dispatch::shards`): one item outside
/// every user's partition.
pub const SHARDS_PK: &str = "META";
pub const SHARDS_SK: &str = "SHARDS";
/// The publishers whose outcomes have an own queue (`META` / `OUTCOME_QUEUES`).
pub const OUTCOME_QUEUES_SK: &str = "OUTCOME_QUEUES";

/// The user's unread counter.
pub const INBOX_SK: &str = "INBOX";

/// One send attempt.
pub fn delivery_sk(delivery_id: &str) -> String {
    format!("{DELIVERY_PREFIX}{delivery_id}")
}

/// The lease-index partition of a delivery (same hashing and shard count as the due
/// index), so the sweep queries every shard in parallel.
pub fn lease_pk(delivery_id: &str, shards: u32) -> String {
    lease_shard_pk(shard_of(delivery_id, "lease", shards))
}

/// The due-index partition `shard`.
pub fn due_shard_pk(shard: u32) -> String {
    format!("DUE#{shard}")
}

/// The lease-index partition `shard`.
pub fn lease_shard_pk(shard: u32) -> String {
    format!("LEASE#{shard}")
}

/// The due-index partition of an item: a stable hash of its key, mod `shards`, so
/// due items spread evenly and the dispatcher queries every shard in parallel.
pub fn due_pk(pk: &str, sk: &str, shards: u32) -> String {
    due_shard_pk(shard_of(pk, sk, shards))
}

/// An outcome item's sort key: one per (notification, status).
pub fn outcome_sk(note_id: &str, status: &str) -> String {
    format!("OUTCOME#{note_id}#{status}")
}

/// The due-index partition an outcome waits on, never read by the dispatcher (whose
/// partitions are `DUE#<n>`): the queue all publishers share (`OUTCOME#<n>`), or
/// (`Some`) once its publisher's webhook failed, that publisher's own
/// (`OUTCOME#<publisher>#<n>`), so its backlog never stands ahead of another's.
pub fn outcome_due_pk(publisher: Option<&str>, pk: &str, sk: &str) -> String {
    outcome_shard_pk(publisher, shard_of(pk, sk, crate::domain::outcome::SHARDS))
}

/// The due-index partition of outcome shard `shard`: the shared queue's (`None`), or
/// `publisher`'s own. A source holds no `#`, so the two never meet.
pub fn outcome_shard_pk(publisher: Option<&str>, shard: u32) -> String {
    match publisher {
        Some(publisher) => format!("OUTCOME#{publisher}#{shard}"),
        None => format!("OUTCOME#{shard}"),
    }
}

fn shard_of(pk: &str, sk: &str, shards: u32) -> u32 {
    let digest = Sha256::digest(format!("{pk}|{sk}").as_bytes());
    let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    n % shards.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_key_reads_back_its_request_id() {
        let template = TemplateId::parse("tmpl_a").expect("template");
        let request = RequestId::parse("wr_1").expect("request");
        assert_eq!(
            request_id_of_grant(&grant_sk(&template, &request)),
            Some(request)
        );
        assert_eq!(request_id_of_grant("PLAN#water"), None);
    }

    #[test]
    fn sort_keys_read_back_what_they_name() {
        let kind = KindName::parse("water").expect("kind");
        assert_eq!(sort_key(&plan_sk(&kind)), SortKey::Plan("water"));
        assert_eq!(sort_key(&outbox_sk("n1")), SortKey::Outbox("n1"));
        assert_eq!(sort_key(&delivery_sk("d1")), SortKey::Delivery("d1"));
        assert_eq!(sort_key("INBOX"), SortKey::Other);
        assert_eq!(sort_key("PUSH#popup#1#t:reject"), SortKey::Event);
        let openid = OpenId::parse("o1").expect("openid");
        assert_eq!(openid_of(&user_pk(&openid)), Some(openid));
        assert_eq!(openid_of("JUNK"), None);
    }

    #[test]
    fn due_shards_are_stable_and_in_range() {
        let a = due_pk("USER#o1", "PLAN#water", 16);
        assert_eq!(a, due_pk("USER#o1", "PLAN#water", 16));
        let shards: std::collections::BTreeSet<String> = (0..200)
            .map(|i| due_pk(&format!("USER#o{i}"), "PLAN#water", 16))
            .collect();
        assert_eq!(shards.len(), 16, "200 users cover all 16 shards");
        assert!(shards.iter().all(|s| {
            s.strip_prefix("DUE#")
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| n < 16)
        }));
    }
}
