//! After a send, or a push beginning to wait for a grant: the refill notice, when the
//! user's grants of a template that names a refill template are used up while it has
//! messages to send (`Store::depletion` finds it, `domain::inbox::refill` decides what
//! it says, `Store::refill` publishes it once per depletion, only with a refill grant
//! held).

use chrono::{DateTime, Utc};
use onegrant::Deps;
use onegrant::domain::inbox::refill::notice;
use onegrant::domain::{GrantState, OpenId, TemplateId};
use onegrant::store::dispatch::{Claim, ClaimSource, Finalized};
use onegrant::store::inbox::Refilled;
use onegrant::telemetry::{error_chain, openid_hash};

/// What a send left for its refill notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refill {
    /// Not a depletion, or its notice was published before.
    Nothing,
    /// The notice was published; its push goes out like any other.
    Published,
    /// A depletion with no refill grant to tell the user with.
    NoRefillGrant,
}

/// The refill notice after a finalized send: only a send that spent a grant can have
/// used the grants up ([`tell`]).
pub(crate) async fn after_send(
    deps: &Deps,
    claim: &Claim,
    finalized: &Finalized,
    room: std::time::Duration,
) -> Refill {
    let spent = !finalized.superseded && finalized.settlement.grant == GrantState::Consumed;
    if !spent {
        return Refill::Nothing;
    }
    let plan_sent = matches!(claim.source, ClaimSource::Plan { .. });
    tell(
        deps,
        &claim.openid,
        &claim.template_id,
        plan_sent,
        claim.claimed_at(),
        room,
    )
    .await
}

/// The refill notice for `stopped`, a template that names a refill template, looked
/// for after a send of it that spent a grant (`plan_sent`: a reminder's) and after a
/// push of it began waiting for a grant (claimed at `claimed_at`): published when the
/// user's grants of it are used up — none available and none in flight, read after
/// the write: of several sends that go out together the last one out finds it,
/// whichever claimed the last grant, and of a send and a push beginning to wait at
/// once, the later — while the template still has messages to send (the reminder's
/// plan on, or pushes still waiting for a grant); and only if the user neither refused
/// the template nor turned the plan off since `claimed_at` (`Store::refill` checks),
/// within `room`. One notice per depletion: everything that finds it names it alike.
pub(crate) async fn tell(
    deps: &Deps,
    user: &OpenId,
    stopped: &TemplateId,
    plan_sent: bool,
    claimed_at: DateTime<Utc>,
    room: std::time::Duration,
) -> Refill {
    let templates = &deps.config.templates;
    let Some(stopped_def) = templates.get(stopped.as_str()) else {
        return Refill::Nothing;
    };
    let Some((refill_id, refill)) = stopped_def
        .refill_template
        .as_ref()
        .and_then(|id| Some((id, templates.get(id.as_str())?)))
    else {
        return Refill::Nothing;
    };
    let openid = openid_hash(user.as_str());
    // Inside what is left of the invocation: out of time, the notice is lost (logged),
    // never the tick.
    let found = tokio::time::timeout(room, deps.store.depletion(user, stopped, plan_sent)).await;
    let depletion = match found {
        Ok(Ok(Some(depletion))) => depletion,
        Ok(Ok(None)) => return Refill::Nothing,
        Ok(Err(e)) => {
            tracing::warn!(openid = %openid, error = %error_chain(&e), "a refill notice was not looked for");
            return Refill::Nothing;
        }
        Err(_) => {
            tracing::warn!(openid = %openid, "no time left to look for a refill notice");
            return Refill::Nothing;
        }
    };
    let now = deps.clock.now();
    let event = match notice(stopped_def, refill, user.clone(), depletion, now) {
        Ok(event) => event,
        Err(e) => {
            tracing::error!(template = %refill_id, error = %e, "a refill notice cannot be built: fix the refill template");
            return Refill::Nothing;
        }
    };
    let published = tokio::time::timeout(
        room,
        deps.store.refill(
            &event,
            stopped,
            refill_id,
            depletion.accepted,
            claimed_at,
            now,
        ),
    )
    .await
    .unwrap_or_else(|_| {
        Err(onegrant::store::StoreError::Unavailable(
            "no time left for the refill notice".into(),
        ))
    });
    match published {
        Ok(Refilled::Published { note_id }) => {
            tracing::info!(openid = %openid, template = %stopped, note_id = %note_id, "grants used up: refill notice published");
            Refill::Published
        }
        Ok(Refilled::NoRefillGrant) => {
            tracing::info!(openid = %openid, template = %stopped, "grants used up with no refill grant held");
            Refill::NoRefillGrant
        }
        Ok(Refilled::Already | Refilled::NotUsedUp) => Refill::Nothing,
        Err(e) => {
            // The send is settled; only its notice is lost (logged, never sent twice).
            tracing::warn!(openid = %openid, error = %error_chain(&e), "a refill notice was not published");
            Refill::Nothing
        }
    }
}
