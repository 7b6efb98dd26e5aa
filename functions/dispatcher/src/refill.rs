//! After a send: the refill notice, when the send used up the user's grants of a
//! template that names a refill template (`domain::inbox::refill` decides what it says,
//! `Store::refill` publishes it once per depletion, only with a refill grant held).

use onegrant::Deps;
use onegrant::domain::GrantState;
use onegrant::domain::inbox::refill::notice;
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

/// The refill notice for a finalized send: only a send that went out with the user's
/// last grant of its template while the template still has messages to send — a
/// reminder (its plan is on), or a push while other pushes of the template wait for a
/// grant — and only if the user neither refused the template nor turned the plan off
/// since it was claimed (`Store::refill` checks), within `room`.
pub(crate) async fn after_send(
    deps: &Deps,
    claim: &Claim,
    finalized: &Finalized,
    room: std::time::Duration,
) -> Refill {
    let spent = !finalized.superseded && finalized.settlement.grant == GrantState::Consumed;
    let more_to_send = match claim.source {
        ClaimSource::Plan { .. } => true,
        ClaimSource::Outbox(_) => claim.others_waiting,
    };
    if !spent || !claim.last_grant || !more_to_send {
        return Refill::Nothing;
    }
    let templates = &deps.config.templates;
    let Some(stopped) = templates.get(claim.template_id.as_str()) else {
        return Refill::Nothing;
    };
    let Some((refill_id, refill)) = stopped
        .refill_template
        .as_ref()
        .and_then(|id| Some((id, templates.get(id.as_str())?)))
    else {
        return Refill::Nothing;
    };
    let Some(last_grant) = claim.grant_request_id() else {
        return Refill::Nothing;
    };
    let now = deps.clock.now();
    let event = match notice(
        stopped,
        refill,
        claim.openid.clone(),
        last_grant.as_str(),
        now,
    ) {
        Ok(event) => event,
        Err(e) => {
            tracing::error!(template = %refill_id, error = %e, "a refill notice cannot be built: fix the refill template");
            return Refill::Nothing;
        }
    };
    let openid = openid_hash(claim.openid.as_str());
    // Inside what is left of the invocation: out of time, the notice is lost (logged),
    // never the tick.
    let published = tokio::time::timeout(
        room,
        deps.store.refill(
            &event,
            &claim.template_id,
            refill_id,
            claim.claimed_at(),
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
            tracing::info!(openid = %openid, template = %claim.template_id, note_id = %note_id, "grants used up: refill notice published");
            Refill::Published
        }
        Ok(Refilled::NoRefillGrant) => {
            tracing::info!(openid = %openid, template = %claim.template_id, "grants used up with no refill grant held");
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
