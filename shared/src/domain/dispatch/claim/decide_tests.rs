use chrono::NaiveDate;
use serde_json::json;

use super::*;
use crate::domain::at;
use crate::domain::dispatch::priority::MAX_WAITING;

/// Midday in Shanghai (04:00 UTC), and 23:00 there (15:00 UTC), inside quiet hours.
const MIDDAY: &str = "2026-12-02T04:00:00Z";
const NIGHT: &str = "2026-12-02T15:00:00Z";

/// One claim's facts, owned, each case changing what it tests.
#[derive(Clone)]
struct World {
    push: Option<Push>,
    standing: Option<Standing>,
    per_day: Option<u32>,
    sent_today: i64,
    available: u64,
    waiting: Vec<String>,
    now: &'static str,
}

#[derive(Clone)]
struct Push {
    requested: Option<Requested>,
    send_by: Option<&'static str>,
    note_type: &'static str,
    priority: Priority,
}

fn push() -> World {
    World {
        push: Some(Push {
            requested: None,
            send_by: None,
            note_type: "order",
            priority: Priority::Normal,
        }),
        standing: None,
        per_day: Some(3),
        sent_today: 0,
        available: 1,
        waiting: Vec::new(),
        now: MIDDAY,
    }
}

fn plan() -> World {
    World {
        push: None,
        ..push()
    }
}

impl World {
    fn with(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self
    }

    fn on_push(self, change: impl FnOnce(&mut Push)) -> Self {
        self.with(|w| change(w.push.as_mut().expect("a push")))
    }

    /// The decision, and whether it asked for the pushes due together (given `due`).
    fn decide(&self, due: Option<&[DueTogether]>) -> (ClaimDecision, bool) {
        let prefs = Preferences::from_json(&json!({
            "quiet_hours": {"start": "22:00", "end": "08:00", "timezone": "Asia/Shanghai"},
            "muted_types": ["promo"],
        }))
        .expect("preferences");
        let sent = SentDays::from([(today(), self.sent_today)]);
        let facts = ClaimFacts {
            push: self.push.as_ref().map(|p| PushFacts {
                requested: p.requested,
                send_by: p.send_by.map(|s| at(s).timestamp_millis()),
                note_type: Some(p.note_type),
                priority: p.priority,
                note_id: "own",
                prefs: &prefs,
            }),
            standing: self.standing,
            per_day: self.per_day,
            sent: &sent,
            zone: Timezone::SHANGHAI,
            available: self.available,
            waiting: &self.waiting,
            now: at(self.now),
        };
        match decide(&facts) {
            Decide::Now(decision) => (decision, false),
            Decide::ReadDueTogether(yielding) => {
                assert_eq!(yielding.own, facts.push.as_ref().expect("a push").member());
                (yielding.decide(&facts, due.unwrap_or_default()), true)
            }
        }
    }
}

fn today() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 12, 2).expect("date")
}

fn counted() -> Option<Counted> {
    Some(Counted {
        day: today(),
        cap: 3,
        stale: vec![],
    })
}

fn unsent(why: Unsent) -> ClaimDecision {
    ClaimDecision::Unsent(why)
}

fn wait(wake: Option<&str>, yielded: bool) -> ClaimDecision {
    unsent(Unsent::WaitGrant {
        wake: wake.map(str::to_string),
        yielded,
    })
}

fn due(member: &str, note_type: &str) -> DueTogether {
    DueTogether {
        member: member.into(),
        note_type: Some(note_type.into()),
        send_by: None,
    }
}

#[test]
fn the_gates_decide_in_their_order_and_a_refusal_always_wins() {
    let past = "2026-12-02T03:00:00Z";
    // Shanghai's next midnight: 16:00 UTC; quiet hours end at 08:00 there (00:00 UTC).
    let midnight = at("2026-12-02T16:00:00Z");
    let morning = at("2026-12-03T00:00:00Z");
    let high = |p: &mut Push| p.priority = Priority::High;
    let cases: Vec<(&str, World, ClaimDecision)> = vec![
        (
            "nothing stops it",
            push().on_push(high),
            ClaimDecision::Take(counted()),
        ),
        (
            "a cancel comes before everything",
            push()
                .on_push(|p| {
                    p.requested = Some(Requested::Cancel);
                    p.send_by = Some(past);
                    p.note_type = "promo";
                })
                .with(|w| w.standing = Some(Standing::Ban)),
            unsent(Unsent::Cancelled),
        ),
        (
            "a replacement before the expiry",
            push().on_push(|p| {
                p.requested = Some(Requested::Replace);
                p.send_by = Some(past);
            }),
            unsent(Unsent::Replaced),
        ),
        (
            "the expiry before a refusal",
            push()
                .on_push(|p| p.send_by = Some(past))
                .with(|w| w.standing = Some(Standing::Reject)),
            unsent(Unsent::Expired),
        ),
        (
            "a refusal before a mute",
            push()
                .on_push(|p| p.note_type = "promo")
                .with(|w| w.standing = Some(Standing::MainSwitchOff)),
            unsent(Unsent::TurnedOff),
        ),
        (
            "a refusal wins over high",
            push()
                .on_push(high)
                .with(|w| w.standing = Some(Standing::Reject)),
            unsent(Unsent::TurnedOff),
        ),
        (
            "an accept keeps nothing back",
            push()
                .on_push(high)
                .with(|w| w.standing = Some(Standing::Accept)),
            ClaimDecision::Take(counted()),
        ),
        (
            "a mute before quiet hours",
            push()
                .on_push(|p| p.note_type = "promo")
                .with(|w| w.now = NIGHT),
            unsent(Unsent::Muted),
        ),
        (
            "quiet hours hold a normal push",
            push().with(|w| w.now = NIGHT),
            unsent(Unsent::Held(morning)),
        ),
        (
            "quiet hours before the cap",
            push().with(|w| {
                w.now = NIGHT;
                w.sent_today = 3;
            }),
            unsent(Unsent::Held(morning)),
        ),
        (
            "the cap waits for the next day",
            push().on_push(high).with(|w| w.sent_today = 3),
            unsent(Unsent::CapWait(midnight)),
        ),
        (
            "the cap ends a push that expires first",
            push()
                .on_push(|p| p.send_by = Some("2026-12-02T10:00:00Z"))
                .with(|w| w.sent_today = 3),
            unsent(Unsent::Capped),
        ),
        (
            "the cap before the grant",
            push().with(|w| {
                w.sent_today = 3;
                w.available = 0;
            }),
            unsent(Unsent::CapWait(midnight)),
        ),
        (
            "no cap counts nothing",
            push().on_push(high).with(|w| {
                w.per_day = None;
                w.sent_today = 99;
            }),
            ClaimDecision::Take(None),
        ),
        (
            "no grant: the push waits",
            push().on_push(high).with(|w| w.available = 0),
            wait(None, false),
        ),
        (
            "a better push waits for the one grant: it is woken",
            push().with(|w| w.waiting = vec!["0:better".into()]),
            wait(Some("0:better"), false),
        ),
        (
            "the waiting list full: skipped",
            push().with(|w| {
                w.available = 0;
                w.waiting = (0..MAX_WAITING).map(|i| format!("2:n{i}")).collect();
            }),
            unsent(Unsent::NoGrant { wake: None }),
        ),
        (
            "a plan refused by the settings pauses",
            plan().with(|w| w.standing = Some(Standing::Reject)),
            unsent(Unsent::TurnedOff),
        ),
        (
            "a plan past the cap waits",
            plan().with(|w| w.sent_today = 3),
            unsent(Unsent::CapWait(midnight)),
        ),
        (
            "a plan at night is not held (its schedule knows its hours)",
            plan().with(|w| w.now = NIGHT),
            ClaimDecision::Take(counted()),
        ),
        (
            "a plan without a grant still takes (the pick finds none and it pauses)",
            plan().with(|w| w.available = 0),
            ClaimDecision::Take(counted()),
        ),
    ];
    for (name, world, expected) in cases {
        let (decision, read) = world.decide(None);
        assert_eq!(decision, expected, "{name}");
        // Only a push of a class that can be beaten, that would take a grant, reads.
        let normal = world
            .push
            .as_ref()
            .is_some_and(|p| p.priority != Priority::High);
        assert_eq!(
            read,
            normal && matches!(expected, ClaimDecision::Take(_)),
            "{name}"
        );
    }
}

#[test]
fn a_push_that_would_take_a_grant_reads_the_better_pushes_due_together() {
    let normal = push();
    assert_eq!(
        normal.decide(Some(&[])),
        (ClaimDecision::Take(counted()), true)
    );
    // A better push due together takes the one grant: this one yields.
    let better = [due("0:other", "order")];
    assert_eq!(normal.decide(Some(&better)), (wait(None, true), true));
    // Not to one that will never contend (muted): it takes.
    let muted = [due("0:other", "promo")];
    assert_eq!(
        normal.decide(Some(&muted)),
        (ClaimDecision::Take(counted()), true)
    );
    // Nor to a worse one.
    let worse = [due("2:other", "order")];
    assert_eq!(
        normal.decide(Some(&worse)),
        (ClaimDecision::Take(counted()), true)
    );
    // Two grants for one better push: it takes.
    let two = push().with(|w| w.available = 2);
    assert_eq!(
        two.decide(Some(&better)),
        (ClaimDecision::Take(counted()), true)
    );
    // A high push never yields, so never reads them.
    let high = push().on_push(|p| p.priority = Priority::High);
    assert_eq!(
        high.decide(Some(&better)),
        (ClaimDecision::Take(counted()), false)
    );
    // Nor does one that would not take a grant anyway.
    let none = push().with(|w| w.available = 0);
    assert_eq!(none.decide(Some(&better)), (wait(None, false), false));
}

#[test]
fn a_claim_that_finds_no_grant_to_pick_waits_or_pauses() {
    assert_eq!(
        Unsent::none_picked(true),
        Unsent::WaitGrant {
            wake: None,
            yielded: false
        }
    );
    assert_eq!(Unsent::none_picked(false), Unsent::NoGrant { wake: None });
}

#[test]
fn at_a_claim_a_recorded_cancel_or_replacement_comes_first_then_expiry_then_a_standing_refusal_then_preferences()
 {
    let now = DateTime::from_timestamp(1_800_000_000, 0).expect("now");
    let past = Some(now.timestamp_millis());
    let later = now + chrono::Duration::hours(1);
    let soon = Some(now.timestamp_millis() + 1);
    let (reject, accept) = (Some(Standing::Reject), Some(Standing::Accept));
    let (cancel, replace) = (Some(Requested::Cancel), Some(Requested::Replace));
    let cases = [
        (
            cancel,
            past,
            reject,
            Gate::Hold(later),
            Some(Unsent::Cancelled),
        ),
        (cancel, None, None, Gate::Go, Some(Unsent::Cancelled)),
        (
            replace,
            past,
            reject,
            Gate::Hold(later),
            Some(Unsent::Replaced),
        ),
        (replace, soon, accept, Gate::Go, Some(Unsent::Replaced)),
        (None, past, reject, Gate::Muted, Some(Unsent::Expired)),
        (None, None, reject, Gate::Muted, Some(Unsent::TurnedOff)),
        (
            None,
            None,
            Some(Standing::Ban),
            Gate::Go,
            Some(Unsent::TurnedOff),
        ),
        (
            None,
            soon,
            Some(Standing::MainSwitchOff),
            Gate::Go,
            Some(Unsent::TurnedOff),
        ),
        (None, None, accept, Gate::Muted, Some(Unsent::Muted)),
        (
            None,
            None,
            None,
            Gate::Hold(later),
            Some(Unsent::Held(later)),
        ),
        (None, soon, accept, Gate::Go, None),
        (None, soon, None, Gate::Go, None),
    ];
    for (requested, expires, standing, gate, expected) in cases {
        assert_eq!(
            at_claim(requested, expires, standing, gate, now),
            expected,
            "{requested:?} {expires:?} {standing:?} {gate:?}"
        );
    }
}
