//! The delivery: one send attempt and what is known of it, with the rules that read
//! it — its settled class, what a finalize does when its settlement finds the delivery
//! moved (a late answer after a sweep, its own earlier landing, or someone else's),
//! what the sweep does at its lease's end, what a plan left `sending` learns from it,
//! which quota-item marks a settlement changes, and when a grant voided for it may
//! still move (docs/design.md §3, §5).

use chrono::{DateTime, Utc};

use crate::domain::grants::GrantState;
use crate::domain::reconcile::{Mark, anonymous_sent_id};
use crate::domain::settle::{
    DeliveryState, KeptAnswer, OutcomeClass, RetryPolicy, SendResult, Settlement, release, settle,
};

/// A delivery as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: String,
    pub state: DeliveryState,
    /// The dispatcher that claimed it.
    pub claimer: String,
    pub template_id: String,
    /// The lease: a live delivery is its claimer's until then (epoch ms).
    pub lease_until: Option<i64>,
    /// When the claimed item was due (epoch ms).
    pub due_at: i64,
    /// The claimed item's retryable failures in a row before this send.
    pub attempts: u32,
    /// The class it was settled with, if stored.
    pub class: Option<OutcomeClass>,
    pub errcode: Option<i64>,
    pub msgid: Option<String>,
    /// A sweep declared it `unknown`.
    pub swept: bool,
    /// WeChat's answer arrived after the sweep and settled it.
    pub answered_late: bool,
    /// Given back unsent, for want of time.
    pub released: bool,
    /// WeChat's definite answer, kept by a finalize that could not commit in time.
    pub kept_answer: Option<KeptAnswer>,
    /// Settled 43101 with the template's other grants not yet voided.
    pub void_others: bool,
}

/// Who writes a settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    Finalize,
    Sweep,
    /// The sweep settling by the answer a finalize kept ([`KeptAnswer`]).
    Kept,
    LateAnswer,
    /// WeChat's sent event settling an `unknown` delivery.
    Event,
    /// A finalize (or late answer) giving the claim back unsent.
    Release {
        late: bool,
    },
}

impl Writer {
    /// The dispatcher's own writer of a send's answer: a finalize, or a release of the
    /// claim unsent (`released`), on time or after a sweep declared it `unknown`
    /// (`late`).
    pub fn answering(released: bool, late: bool) -> Self {
        match (released, late) {
            (true, late) => Self::Release { late },
            (false, false) => Self::Finalize,
            (false, true) => Self::LateAnswer,
        }
    }

    /// Whether the delivery it settles was `unknown` until now.
    pub fn settles_unknown(self) -> bool {
        matches!(
            self,
            Self::LateAnswer | Self::Event | Self::Release { late: true }
        )
    }
}

/// Which delivery a settlement may move. The store writes each as the condition of the
/// settlement's delivery update (`store::dispatch::settle`); [`Guard::admits`] is the
/// same rule read here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard<'a> {
    /// Still live and this claimer's (a finalize, a release).
    Claimer(&'a str),
    /// Still live with this expired lease (the sweep).
    ExpiredLease(i64),
    /// Declared `unknown` by a sweep, claimed by this claimer, not yet answered late (a
    /// late answer).
    Swept(&'a str),
    /// `unknown`, however it got there (WeChat's sent event settling it).
    Unknown,
}

impl Guard<'_> {
    /// Whether this guard lets a settlement move `delivery`.
    pub fn admits(&self, delivery: &Delivery) -> bool {
        match *self {
            Self::Claimer(claimer) => delivery.state.is_live() && delivery.claimer == claimer,
            Self::ExpiredLease(until) => {
                delivery.state.is_live() && delivery.lease_until == Some(until)
            }
            Self::Swept(claimer) => {
                delivery.state == DeliveryState::Unknown
                    && delivery.claimer == claimer
                    && delivery.swept
                    && !delivery.answered_late
            }
            Self::Unknown => delivery.state == DeliveryState::Unknown,
        }
    }
}

/// What a finalize does when its settlement found the delivery not as its claim left
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    /// A sweep declared it `unknown` and no late answer came yet: this definite
    /// answer wins (I4: the record never contradicts WeChat).
    AnswerLate,
    /// This very settlement, landed before (a first try whose answer was lost, or one
    /// that landed and then failed after): what follows it runs again. `late` when it
    /// was a late answer (which moved the plan in its own settlement).
    AlreadySettled { late: bool },
    /// Someone else's: nothing more to do.
    Superseded,
}

/// What the sweep does with a delivery whose lease-index entry is past its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtLeaseEnd {
    /// Not on the lease any more, or not yet past it: nothing.
    Idle,
    /// Settled 43101 with the other grants not voided yet: finish that.
    VoidOthers,
    /// Still live: settle it, by WeChat's kept answer if a finalize kept one (`kept`),
    /// else as uncertain (the grant void, never resent: I4) — guarded by the expired
    /// lease as read (`lease_until`, epoch ms).
    Settle {
        result: SendResult,
        kept: bool,
        lease_until: i64,
    },
}

/// What a plan left `sending` past its lease learns from its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanLearns {
    /// The delivery is still live: its own lease entry settles it, and the plan.
    Wait,
    /// Given back unsent: due again at its own instant (epoch ms), no attempt spent.
    Released { due_at: i64 },
    /// Settled with this class (and errcode).
    Settled {
        class: OutcomeClass,
        errcode: Option<i64>,
    },
}

impl PlanLearns {
    /// What a plan learns of a delivery that is missing or cannot be read: that its
    /// send's outcome is unknown.
    pub const MISSING: PlanLearns = PlanLearns::Settled {
        class: OutcomeClass::Unknown,
        errcode: None,
    };

    /// How the plan, `attempts` failures in a row before this send, moves on: `None`
    /// while the delivery is live (its own lease entry settles it, and the plan with
    /// it); given back unsent, due again at its own instant with no attempt spent;
    /// else settled by the delivery's class, as its finalize would have.
    pub fn settlement(
        self,
        attempts: u32,
        policy: &RetryPolicy,
        now: DateTime<Utc>,
    ) -> Option<Settlement> {
        match self {
            Self::Wait => None,
            Self::Released { due_at } => Some(release(
                attempts,
                DateTime::from_timestamp_millis(due_at).unwrap_or(now),
            )),
            Self::Settled { class, errcode } => Some(settle(class, errcode, attempts, policy, now)),
        }
    }
}

impl Delivery {
    /// The class it was settled with (older items: from the state alone).
    pub fn settled_class(&self) -> Option<OutcomeClass> {
        if let Some(class) = self.class {
            return Some(class);
        }
        match self.state {
            DeliveryState::Claimed | DeliveryState::Sending => None,
            DeliveryState::Sent => Some(OutcomeClass::Sent),
            DeliveryState::Unknown => Some(OutcomeClass::Unknown),
            DeliveryState::Failed => Some(match self.errcode {
                Some(errcode) => SendResult::Refused {
                    errcode,
                    errmsg: String::new(),
                }
                .class(),
                None => OutcomeClass::Retryable,
            }),
        }
    }

    /// What `claimer`'s finalize, settling to `settled`, does with the delivery as it
    /// found it. Only the claimer moves a delivery out of `sending` without a sweep,
    /// and only its late answer marks one answered late.
    pub fn on_finalize_refused(&self, claimer: &str, settled: DeliveryState) -> Moved {
        if self.claimer != claimer {
            return Moved::Superseded;
        }
        // A definite answer, and the delivery is the sweep's `unknown` a late answer
        // may still settle.
        if settled != DeliveryState::Unknown && Guard::Swept(claimer).admits(self) {
            return Moved::AnswerLate;
        }
        if self.state == settled && (!self.swept || self.answered_late) {
            return Moved::AlreadySettled { late: self.swept };
        }
        Moved::Superseded
    }

    /// Whether it is on the lease and the lease has run out at `now`.
    pub fn past_lease(&self, now: DateTime<Utc>) -> bool {
        self.lease_until
            .is_some_and(|until| until < now.timestamp_millis())
    }

    /// What the sweep does with this delivery at `now`.
    pub fn at_lease_end(&self, now: DateTime<Utc>) -> AtLeaseEnd {
        let Some(lease_until) = self.lease_until.filter(|_| self.past_lease(now)) else {
            return AtLeaseEnd::Idle;
        };
        if !self.state.is_live() {
            return if self.void_others {
                AtLeaseEnd::VoidOthers
            } else {
                AtLeaseEnd::Idle
            };
        }
        match self.kept_answer.as_ref().map(KeptAnswer::result) {
            Some(result) => AtLeaseEnd::Settle {
                result,
                kept: true,
                lease_until,
            },
            None => AtLeaseEnd::Settle {
                result: SendResult::Uncertain {
                    reason: "the dispatcher stopped mid-send".into(),
                },
                kept: false,
                lease_until,
            },
        }
    }

    /// What a plan left `sending` learns from this delivery (a delivery that cannot
    /// be read counts as missing: settle it `unknown`).
    pub fn for_stranded_plan(&self) -> PlanLearns {
        if self.state.is_live() {
            PlanLearns::Wait
        } else if self.released {
            PlanLearns::Released {
                due_at: self.due_at,
            }
        } else {
            PlanLearns::Settled {
                class: self.settled_class().unwrap_or(OutcomeClass::Unknown),
                errcode: self.errcode,
            }
        }
    }

    /// Whether WeChat's sent event for `template` may settle it: `unknown`, of that
    /// template, with no msgid recorded (a send WeChat's answer settled has one).
    pub fn awaits_sent_event(&self, template: &str) -> bool {
        self.state == DeliveryState::Unknown && self.template_id == template && self.msgid.is_none()
    }
}

/// What a settlement changes in the quota item's marks (see
/// [`reconcile`](crate::domain::reconcile)), as encoded set members.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    /// The send's outcome became unknown: it joins the open-unknown set.
    pub open_unknown: Option<String>,
    /// A send that was unknown settled: it leaves the open-unknown set.
    pub close_unknown: Option<String>,
    /// Recorded `sent`: its msgid (or, without one, an anonymous mark) joins the sent
    /// set for the event window.
    pub sent: Option<String>,
    /// The send was in flight (a finalize, a release or the sweep): it leaves the
    /// in-flight set.
    pub close_inflight: Option<String>,
}

impl Marks {
    /// The marks of a settlement to `state` (with WeChat's `msgid`, if any) written by
    /// `by`, for delivery `delivery_id` claimed at `claimed_at`.
    pub fn of(
        state: DeliveryState,
        msgid: Option<&str>,
        by: Writer,
        delivery_id: &str,
        claimed_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Self {
        let claimed = Mark::new(claimed_at, delivery_id).encode();
        let was_unknown = by.settles_unknown();
        // Kept for the whole window, so every copy of the send's event is known as its
        // own (an event settling it included: WeChat may deliver that event again).
        let sent = match (msgid, state) {
            (Some(msgid), _) => Some(Mark::new(now, msgid).encode()),
            (None, DeliveryState::Sent) => {
                Some(Mark::new(now, anonymous_sent_id(delivery_id)).encode())
            }
            (None, _) => None,
        };
        Self {
            open_unknown: (state == DeliveryState::Unknown && !was_unknown)
                .then(|| claimed.clone()),
            close_unknown: was_unknown.then(|| claimed.clone()),
            sent,
            close_inflight: (!was_unknown).then_some(claimed),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.open_unknown.is_none()
            && self.close_unknown.is_none()
            && self.sent.is_none()
            && self.close_inflight.is_none()
    }
}

/// A delivery's grant as a settlement found it, when its move was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantSeen {
    pub state: Option<GrantState>,
    /// The delivery that reserved it.
    pub delivery_id: Option<String>,
    /// Voided by the sweep (its send's outcome unknown), not on purpose.
    pub voided_by_sweep: bool,
}

/// The state to move a grant from, after its move to `to` was refused and the grant
/// is as `seen`: none if it is no longer `delivery_id`'s to move. A grant voided for
/// this delivery still goes to `consumed` when WeChat took the message (the truth
/// wins, whoever voided it), and back to `available` only if the sweep voided it (a
/// user who disabled the plan voided it on purpose).
pub fn regrant(to: GrantState, delivery_id: &str, seen: &GrantSeen) -> Option<GrantState> {
    if seen.delivery_id.as_deref() != Some(delivery_id) || seen.state != Some(GrantState::Invalid) {
        return None;
    }
    match to {
        GrantState::Consumed => Some(GrantState::Invalid),
        GrantState::Available if seen.voided_by_sweep => Some(GrantState::Invalid),
        GrantState::Available | GrantState::Invalid | GrantState::Reserved => None,
    }
}

#[cfg(test)]
mod tests;
