//! The refill notice: when a send spends a user's last grant of a template that names a
//! refill template (`refill_template` in its configuration), onegrant tells the user
//! once, with the refill template's own grant, that the messages have stopped — so they
//! come back and tap again.
//!
//! The notice is an ordinary notification with a push (publisher [`PUBLISHER`], type
//! [`NOTE_TYPE`]), ingested under an idempotency key naming the depletion (the template
//! and the last grant spent): never twice for one depletion. The store publishes it
//! only while the template is still used up and the user holds a refill grant; its push
//! then goes through the ordinary claim like any other. Pure.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::domain::QuotaCounters;
use crate::domain::ids::OpenId;
use crate::domain::inbox::schedule::{Priority, Timing};
use crate::domain::inbox::{NotifyEvent, Push};
use crate::domain::keywords::{KeywordError, fit};
use crate::domain::reminders::schedule::Timezone;
use crate::domain::template::{KeywordType, TemplateDef};

/// The publisher of refill notices (their idempotency keys are its own).
pub const PUBLISHER: &str = "onegrant";

/// The notification type of a refill notice.
pub const NOTE_TYPE: &str = "onegrant.refill";

/// Whether a claim takes the user's last grant of its template: the only one available
/// and none other in flight, as read at the claim.
pub fn takes_last_grant(counters: &QuotaCounters) -> bool {
    counters.available == 1 && counters.reserved == 0
}

/// The idempotency key of the notice for the depletion of `template` by the grant
/// `last_grant` (its request id): one per depletion.
pub fn depletion_key(template: &str, last_grant: &str) -> String {
    format!("refill:{template}:{last_grant}")
}

/// The refill notice for `openid`, whose grants of `stopped` ran out at `now` with the
/// grant `last_grant`: a notification saying which messages stopped, with a push of the
/// `refill` template (its keywords filled as [`KeywordType::fills_refill`] says, times
/// in China's zone).
pub fn notice(
    stopped: &TemplateDef,
    refill: &TemplateDef,
    openid: OpenId,
    last_grant: &str,
    now: DateTime<Utc>,
) -> Result<NotifyEvent, KeywordError> {
    let local = now.with_timezone(&Timezone::SHANGHAI.tz());
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
    let idempotency_key = depletion_key(stopped.id.as_str(), last_grant);
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
    use crate::domain::Templates;

    fn templates() -> Templates {
        Templates::from_json(
            r#"[{"id":"tmpl_water","title":"喝水提醒","keywords":[{"key":"thing1"},{"key":"time2"},{"key":"number3"}],
                 "page":"pages/water/index","refill_template":"tmpl_used_up"},
                {"id":"tmpl_used_up","title":"次数用完提醒","keywords":[{"key":"thing1"},{"key":"time2"}]}]"#,
        )
        .expect("templates")
    }

    #[test]
    fn only_the_last_grant_with_nothing_in_flight_is_a_depletion() {
        let c = |available, reserved| QuotaCounters {
            available,
            reserved,
            ..Default::default()
        };
        assert!(takes_last_grant(&c(1, 0)));
        assert!(!takes_last_grant(&c(2, 0)));
        assert!(!takes_last_grant(&c(1, 1)));
        assert!(!takes_last_grant(&c(0, 0)));
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
        let event = notice(water, used_up, openid.clone(), "wr_9", now).expect("notice");
        assert_eq!(event.idempotency_key, "refill:tmpl_water:wr_9");
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
            openid,
            "wr_9",
            now + chrono::Duration::hours(1),
        )
        .expect("notice");
        assert_eq!(
            (again.idempotency_key, again.fingerprint),
            (event.idempotency_key, event.fingerprint)
        );
    }
}
