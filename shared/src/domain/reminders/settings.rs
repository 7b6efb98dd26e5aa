//! `PUT /v1/reminders/{kind}`, decided: the plan with the new settings, turned on or
//! off, and what turning it off does to the template's grants.

use chrono::{DateTime, Utc};

use crate::domain::grants::QuotaCounters;
use crate::domain::reminders::plan::{IllegalTransition, Plan, PlanStatus};
use crate::domain::reminders::{ReminderKind, SettingsUpdate};

/// What saving settings writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsDecision {
    /// The plan to write (conditional on the version read).
    pub plan: Plan,
    /// Turned off: every unconsumed grant of the kind's template is voided with the
    /// plan's write (or, the plan already off as stored, with a check of its version).
    pub voids_grants: bool,
    /// The plan itself changes (or was never stored): written, and counted against the
    /// user's `CHANGES_PER_MINUTE`. A turn-off of a plan already off that only voids
    /// grants left open (a new accept since, or an earlier turn-off stopped midway)
    /// neither writes nor counts it again.
    pub writes_plan: bool,
    /// Turned on and scheduled: the write checks that a grant is still available.
    pub checks_grant: bool,
    /// The template's counters once the write lands.
    pub counters: QuotaCounters,
    /// Whether the save changes anything: one that does not writes nothing (no plan,
    /// no audit entry) and is not counted against the user's `CHANGES_PER_MINUTE`.
    pub changes: bool,
}

/// Applies `update` to the plan as stored (a new one if none) with the template's
/// `counters` as read. Turning it on schedules it by the next-due rule from the last
/// check-in (or now) if a grant is available, else it waits for one — never lifting a
/// refusal; saving the settings a scheduled plan has keeps its time (only a change
/// re-times it); turning it off voids the grants.
pub fn decide(
    stored: Option<Plan>,
    kind: &ReminderKind,
    counters: QuotaCounters,
    update: &SettingsUpdate,
    now: DateTime<Utc>,
) -> Result<SettingsDecision, IllegalTransition> {
    let before = stored.unwrap_or_else(|| Plan::new(kind));
    let mut plan = before.clone();
    let same_settings = plan.settings == update.settings;
    plan.settings = update.settings;
    if update.enabled {
        let anchor = plan.last_checkin_at.unwrap_or(now);
        let due = match plan.status {
            PlanStatus::Scheduled { due } if same_settings => due,
            _ => plan.next_due(anchor, plan.settings.daily_goal, now),
        };
        plan.enable(counters.available > 0, due)?;
        Ok(SettingsDecision {
            checks_grant: matches!(plan.status, PlanStatus::Scheduled { .. }),
            changes: plan != before,
            writes_plan: plan != before,
            plan,
            voids_grants: false,
            counters,
        })
    } else {
        plan.disable()?;
        let after = counters.all_voided();
        Ok(SettingsDecision {
            changes: plan != before || after != counters,
            writes_plan: plan != before || before.version == 0,
            plan,
            voids_grants: true,
            checks_grant: false,
            counters: after,
        })
    }
}

/// Whether a save tried again after it wrote the plan (at version `written`, once
/// landed) finds the plan `stored` past that version: another save landed after this
/// one's write — an enable after a turn-off stopped midway — and stands. This one then
/// ends with the plan as stored, writing nothing more (not the plan, nor voiding the
/// grants the later save keeps).
pub fn overtaken(stored: Option<&Plan>, written: Option<u64>) -> bool {
    matches!((stored, written), (Some(plan), Some(written)) if plan.version > written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::at;
    use crate::domain::reminders::test_kind;

    fn counters(available: u64, reserved: u64) -> QuotaCounters {
        QuotaCounters {
            accepted: available + reserved + 1,
            available,
            reserved,
            consumed: 1,
            ..QuotaCounters::default()
        }
    }

    fn update(enabled: bool) -> SettingsUpdate {
        SettingsUpdate {
            enabled,
            settings: test_kind().defaults,
        }
    }

    #[test]
    fn a_save_is_overtaken_only_by_a_plan_past_its_own_write() {
        let mut plan = Plan::new(&test_kind());
        plan.version = 4;
        // Never written by this save, or its write (version 4) the last: not overtaken.
        assert!(!overtaken(Some(&plan), None));
        assert!(!overtaken(Some(&plan), Some(4)));
        assert!(!overtaken(Some(&plan), Some(5)));
        assert!(!overtaken(None, Some(1)));
        // Written at 3, found at 4: another save landed after it.
        assert!(overtaken(Some(&plan), Some(3)));
    }

    #[test]
    fn turning_a_plan_on_schedules_it_only_with_a_grant() {
        let now = at("2026-12-01T10:00:00Z");
        let with = decide(None, &test_kind(), counters(1, 0), &update(true), now)
            .expect("a new plan turns on");
        assert!(
            matches!(with.plan.status, PlanStatus::Scheduled { .. }),
            "{with:?}"
        );
        assert!(with.checks_grant && !with.voids_grants);
        assert_eq!(with.counters, counters(1, 0));
        let without = decide(None, &test_kind(), counters(0, 0), &update(true), now)
            .expect("a new plan turns on");
        assert!(
            !matches!(without.plan.status, PlanStatus::Scheduled { .. }),
            "{without:?}"
        );
        assert!(!without.checks_grant);
    }

    #[test]
    fn turning_a_plan_off_voids_every_unconsumed_grant() {
        let now = at("2026-12-01T10:00:00Z");
        let on = decide(None, &test_kind(), counters(2, 1), &update(true), now)
            .expect("turns on")
            .plan;
        let off =
            decide(Some(on), &test_kind(), counters(2, 1), &update(false), now).expect("turns off");
        assert_eq!(off.plan.status, PlanStatus::Disabled);
        assert!(off.voids_grants && !off.checks_grant);
        let c = off.counters;
        assert_eq!(
            (c.available, c.reserved, c.invalid, c.consumed),
            (0, 0, 3, 1)
        );
        assert!(c.conserved());
    }

    #[test]
    fn turning_off_a_plan_already_off_only_voids_the_grants_left_open() {
        let now = at("2026-12-01T10:00:00Z");
        let on = decide(None, &test_kind(), counters(2, 0), &update(true), now)
            .expect("turns on")
            .plan
            .written();
        let off =
            decide(Some(on), &test_kind(), counters(2, 0), &update(false), now).expect("turns off");
        assert!(
            off.changes && off.writes_plan,
            "the turn-off writes the plan"
        );
        // Stopped midway, or a grant given since: the plan stays as stored.
        let stored = off.plan.written();
        let again = decide(
            Some(stored),
            &test_kind(),
            counters(1, 0),
            &update(false),
            now,
        )
        .expect("off again");
        assert!(again.changes && again.voids_grants, "{again:?}");
        assert!(!again.writes_plan, "neither written nor counted again");
        assert_eq!(again.counters.available, 0);
        // A plan never stored is written, whatever it holds.
        let never = decide(None, &test_kind(), counters(1, 0), &update(false), now).expect("off");
        assert!(never.writes_plan);
    }

    #[test]
    fn a_save_that_changes_nothing_is_told_apart() {
        let now = at("2026-12-01T10:00:00Z");
        let later = at("2026-12-01T10:07:00Z");
        let on = decide(None, &test_kind(), counters(1, 0), &update(true), now).expect("turns on");
        assert!(on.changes);
        let plan = on.plan.written();
        // The same settings again, minutes later: the schedule keeps its time.
        let again = decide(
            Some(plan.clone()),
            &test_kind(),
            counters(1, 0),
            &update(true),
            later,
        )
        .expect("saves again");
        assert!(!again.changes, "{again:?}");
        assert_eq!(again.plan, plan);
        // Other settings re-time it.
        let mut other = update(true);
        other.settings.daily_goal += 1;
        let changed = decide(
            Some(plan.clone()),
            &test_kind(),
            counters(1, 0),
            &other,
            later,
        )
        .expect("saves other settings");
        assert!(changed.changes);
        // Off twice: the second voids nothing and changes nothing — unless grants came
        // meanwhile.
        let off = decide(
            Some(plan),
            &test_kind(),
            counters(1, 0),
            &update(false),
            later,
        )
        .expect("turns off");
        assert!(off.changes);
        let off = off.plan.written();
        let none = QuotaCounters {
            invalid: 1,
            accepted: 1,
            ..QuotaCounters::default()
        };
        let twice = decide(Some(off.clone()), &test_kind(), none, &update(false), later)
            .expect("turns off again");
        assert!(!twice.changes, "{twice:?}");
        let granted = decide(
            Some(off),
            &test_kind(),
            counters(1, 0),
            &update(false),
            later,
        )
        .expect("turns off again");
        assert!(granted.changes);
        // Never stored, turned off, no grants: nothing to write either.
        let fresh = decide(
            None,
            &test_kind(),
            QuotaCounters::default(),
            &update(false),
            now,
        )
        .expect("a new plan stays off");
        assert!(!fresh.changes);
    }
}
