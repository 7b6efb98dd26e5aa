//! The refill notice: when a send spends a user's last grant of a template that names a
//! refill template (`refill_template` in its configuration), onegrant tells the user
//! once, with the refill template's own grant, that the messages have stopped — so they
//! come back and tap again.
//!
//! The notice is an ordinary notification with a push (publisher [`PUBLISHER`], type
//! [`NOTE_TYPE`]), ingested under an idempotency key naming the depletion (the template
//! and how many grants of it the user had accepted): never twice for one depletion. The store publishes it
//! only while the template is still used up and the user holds a refill grant; its push
//! then goes through the ordinary claim like any other. Pure.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::domain::grants::QuotaCounters;
use crate::domain::ids::OpenId;
use crate::domain::inbox::schedule::Timing;
use crate::domain::inbox::{NotifyEvent, Push};
use crate::domain::keywords::{KeywordError, fit};
use crate::domain::reminders::schedule::Timezone;
use crate::domain::template::Priority;
use crate::domain::template::{KeywordType, TemplateDef};

/// The publisher of refill notices (their idempotency keys are its own).
pub const PUBLISHER: &str = "onegrant";

/// The notification type of a refill notice.
pub const NOTE_TYPE: &str = "onegrant.refill";

/// Whether the user's grants of a template are used up, as read after a send's
/// finalize: none available and none in flight. Of several sends that go out together
/// only the last to finish sees it ("last one out"), whichever claimed the last grant.
pub fn used_up(counters: &QuotaCounters) -> bool {
    counters.available == 0 && counters.reserved == 0
}

/// The depletion found after a send or a wait, if any: the user had grants of the
/// template and they are [`used_up`] while it still has messages to send
/// (`more_to_send`: a reminder plan on, or pushes waiting for a grant) — named by the
/// grants accepted in all ([`depletion_key`]). A user who never gave one has nothing
/// used up: a push waiting for their first grant tells them nothing.
pub fn depletion(counters: &QuotaCounters, more_to_send: bool) -> Option<u64> {
    (counters.accepted > 0 && used_up(counters) && more_to_send).then_some(counters.accepted)
}

/// A depletion the store found: the grants accepted in all when it came (its name,
/// [`depletion`]), and the zone of the user's day
/// ([`day_zone`](crate::domain::dispatch::cap::day_zone): their quiet hours',
/// else China's), in which the notice tells its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Depletion {
    pub accepted: u64,
    pub zone: Timezone,
}

/// The idempotency key of the notice for the depletion of `openid`'s grants of
/// `template` at which they had accepted `accepted` of it in all: one per depletion (a
/// depletion after it needs a new grant, and so a larger count), the same for every
/// send that finds it, so two finishing together publish it once. Keys are unique per
/// publisher across users, so the user is in it (a digest: the key is kept outside
/// their partition).
pub fn depletion_key(openid: &OpenId, template: &str, accepted: u64) -> String {
    let user = hex::encode(&Sha256::digest(openid.as_str().as_bytes())[..8]);
    format!("refill:{template}:{user}:{accepted}")
}

/// The refill notice for `openid`, whose grants of `stopped` ran out at `now` at
/// `depletion` ([`depletion_key`]): a notification saying which messages stopped, with
/// a push of the `refill` template (its keywords filled as
/// [`KeywordType::fills_refill`] says, times in the user's zone, as their day's).
pub fn notice(
    stopped: &TemplateDef,
    refill: &TemplateDef,
    openid: OpenId,
    depletion: Depletion,
    now: DateTime<Utc>,
) -> Result<NotifyEvent, KeywordError> {
    let local = now.with_timezone(&depletion.zone.tz());
    let data = refill
        .keywords
        .iter()
        .map(|k| {
            let raw = match k.kind {
                KeywordType::Time => local.format("%Y-%m-%d %H:%M").to_string(),
                KeywordType::Date => local.format("%Y-%m-%d").to_string(),
                _ => stopped.title.clone(),
            };
            Ok((k.key.clone(), fit(&k.key, k.kind, &raw)?))
        })
        .collect::<Result<BTreeMap<_, _>, KeywordError>>()?;
    let idempotency_key = depletion_key(&openid, stopped.id.as_str(), depletion.accepted);
    let page = refill.page.clone().or_else(|| stopped.page.clone());
    Ok(NotifyEvent {
        publisher: PUBLISHER.to_string(),
        fingerprint: hex::encode(Sha256::digest(idempotency_key.as_bytes())),
        idempotency_key,
        openid,
        kind: NOTE_TYPE.to_string(),
        title: format!("「{}」已用完", stopped.title),
        body: format!(
            "「{}」的订阅次数已用完，后续提醒已暂停。打开小程序再点一次订阅即可继续接收。",
            stopped.title
        ),
        page: page.clone(),
        push: Some(Push::Ready {
            template_id: refill.id.clone(),
            data,
            page,
        }),
        timing: Timing {
            send_at: None,
            expires_at: None,
            priority: Priority::default(),
        },
        collapse_key: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::template::Templates;

    fn templates() -> Templates {
        Templates::from_json(
            r#"[{"id":"tmpl_water","title":"喝水提醒","keywords":[{"key":"thing1"},{"key":"time2"},{"key":"number3"}],
                 "page":"pages/water/index","refill_template":"tmpl_used_up"},
                {"id":"tmpl_used_up","title":"次数用完提醒","keywords":[{"key":"thing1"},{"key":"time2"}]}]"#,
        )
        .expect("templates")
    }

    #[test]
    fn used_up_means_none_available_and_none_in_flight() {
        let c = |available, reserved| QuotaCounters {
            available,
            reserved,
            ..Default::default()
        };
        assert!(used_up(&c(0, 0)));
        assert!(!used_up(&c(1, 0)));
        assert!(!used_up(&c(0, 1)), "another send of it still out");
        assert!(!used_up(&c(1, 1)));
        let spent = QuotaCounters {
            accepted: 4,
            consumed: 4,
            ..Default::default()
        };
        assert_eq!(depletion(&spent, true), Some(4));
        assert_eq!(depletion(&spent, false), None, "nothing stopped: no notice");
        assert_eq!(depletion(&c(1, 0), true), None);
        assert_eq!(depletion(&c(0, 0), true), None, "never had one");
    }

    #[test]
    fn the_notice_names_what_stopped_and_when_with_the_refill_template() {
        let t = templates();
        let (water, used_up) = (
            t.get("tmpl_water").expect("water"),
            t.get("tmpl_used_up").expect("used up"),
        );
        let openid = OpenId::parse("o_alice_1234567890".to_string()).expect("openid");
        let now = DateTime::parse_from_rfc3339("2026-12-02T04:30:00Z")
            .expect("instant")
            .with_timezone(&Utc);
        let china = |accepted| Depletion {
            accepted,
            zone: Timezone::SHANGHAI,
        };
        let event = notice(water, used_up, openid.clone(), china(9), now).expect("notice");
        assert!(
            event.idempotency_key.starts_with("refill:tmpl_water:")
                && event.idempotency_key.ends_with(":9"),
            "{}",
            event.idempotency_key
        );
        assert_eq!(event.publisher, PUBLISHER);
        assert_eq!(event.kind, NOTE_TYPE);
        assert_eq!(event.page.as_deref(), Some("pages/water/index"));
        let Some(Push::Ready {
            template_id, data, ..
        }) = &event.push
        else {
            panic!("a push");
        };
        assert_eq!(template_id.as_str(), "tmpl_used_up");
        assert_eq!(data.get("thing1").map(String::as_str), Some("喝水提醒"));
        // 12:30 in China.
        assert_eq!(
            data.get("time2").map(String::as_str),
            Some("2026-12-02 12:30")
        );
        // The same depletion, later: the same key and fingerprint (a replay).
        let again = notice(
            water,
            used_up,
            openid.clone(),
            china(9),
            now + chrono::Duration::hours(1),
        )
        .expect("notice");
        assert_eq!(
            (&again.idempotency_key, &again.fingerprint),
            (&event.idempotency_key, &event.fingerprint)
        );
        // The next depletion (a grant accepted since), or another user's: another key.
        let next = notice(water, used_up, openid.clone(), china(10), now).expect("notice");
        assert_ne!(next.idempotency_key, event.idempotency_key);
        let bob = OpenId::parse("o_bob_1234567890".to_string()).expect("openid");
        let theirs = notice(water, used_up, bob, china(9), now).expect("notice");
        assert_ne!(theirs.idempotency_key, event.idempotency_key);
        // A user whose day is London's is told London's time: the same depletion (its
        // key), 04:30 there.
        let london = Timezone::parse("Europe/London").expect("zone");
        let abroad = notice(
            water,
            used_up,
            openid,
            Depletion {
                accepted: 9,
                zone: london,
            },
            now,
        )
        .expect("notice");
        assert_eq!(abroad.idempotency_key, event.idempotency_key);
        let Some(Push::Ready { data, .. }) = &abroad.push else {
            panic!("a push");
        };
        assert_eq!(
            data.get("time2").map(String::as_str),
            Some("2026-12-02 04:30")
        );
    }
}
