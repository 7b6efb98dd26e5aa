//! `GET`/`PUT /v1/reminders/{kind}` and `POST /v1/reminders/{kind}/checkins`: reminder
//! plans ("remind me to drink water every 2 hours") and the check-ins that drive them.
//!
//! The plan state machine and the next-due rule are pure (`onegrant::domain`); this
//! crate only decodes, authenticates and calls one store operation per request.

use futures::future::BoxFuture;
use lambda_http::http::Method;
use lambda_http::{Body, Request, RequestExt, Response};
use onegrant::Deps;
use onegrant::domain::consent::standing::SubscriptionsSetting;
use onegrant::domain::reminders::{CheckIn, ReminderKind, SettingsPatch};
use onegrant::http::{ApiError, caller, json_body, json_response, respond};
use onegrant::store::audit::attributed;
use onegrant::store::reminders::CheckInOutcome;
use onegrant::telemetry::openid_hash;

/// The handler as `onegrant::http::run` and the local stack take it.
pub fn handler(deps: &Deps, req: Request) -> BoxFuture<'_, Response<Body>> {
    let budget = onegrant::http::budget(&req, deps.config.limits.handler_budget);
    let route = onegrant::http::route(&req);
    Box::pin(onegrant::http::within(budget, route, handle(deps, req)))
}

/// The function's handler: one request in, one response out.
pub async fn handle(deps: &Deps, req: Request) -> Response<Body> {
    let checkins = req.uri().path().ends_with("/checkins");
    let result = match (req.method().clone(), checkins) {
        (Method::GET, false) => get(deps, &req).await,
        (Method::PUT, false) => put(deps, &req).await,
        (Method::POST, true) => check_in(deps, &req).await,
        // API Gateway routes only the declared methods here.
        _ => Err(ApiError::NotFound),
    };
    respond(result)
}

fn kind<'a>(deps: &'a Deps, req: &Request) -> Result<&'a ReminderKind, ApiError> {
    req.path_parameters()
        .first("kind")
        .and_then(|k| deps.config.reminders.get(k))
        .ok_or(ApiError::NotFound)
}

async fn get(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let caller = caller(req, &deps.sessions).await?;
    let kind = kind(deps, req)?;
    // Counted once the request is known good: a bad one reads and writes nothing.
    let openid = caller.admitted(deps).await?;
    deps.store.count_read(&openid, deps.clock.now()).await?;
    let snapshot = deps.store.plan(&openid, kind).await?;
    let view = snapshot
        .plan
        .view(snapshot.counters.available, deps.clock.now());
    json_response(200, &with_refill(deps, kind, &view))
}

/// A plan's answer with the template of its refill notice (`refill_template_id`, null
/// when its template names none) after the plan's own fields, for the client to ask for
/// both in one tap.
#[derive(serde::Serialize)]
struct WithRefill<'a, T: serde::Serialize> {
    #[serde(flatten)]
    plan: &'a T,
    refill_template_id: Option<String>,
}

fn with_refill<'a, T: serde::Serialize>(
    deps: &Deps,
    kind: &ReminderKind,
    plan: &'a T,
) -> WithRefill<'a, T> {
    let refill_template_id = deps
        .config
        .templates
        .get(kind.template_id.as_str())
        .and_then(|t| t.refill_template.as_ref())
        .map(|t| t.to_string());
    WithRefill {
        plan,
        refill_template_id,
    }
}

async fn put(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let caller = caller(req, &deps.sessions).await?;
    let kind = kind(deps, req)?;
    let body = json_body(req)?;
    let now = deps.clock.now();
    // Every field is checked before the plan is read; only the merged whole needs it.
    let patch = SettingsPatch::from_json(&body)?;
    let openid = caller.admitted(deps).await?;
    let current = deps.store.plan(&openid, kind).await?;
    let update = patch.apply(&current.plan.settings)?;
    let saved = attributed(
        "settings",
        deps.store.save_settings(&openid, kind, &update, now),
    )
    .await?;
    tracing::info!(
        openid = %openid_hash(openid.as_str()),
        kind = %kind.name,
        state = saved.plan.status.name(),
        "plan settings saved"
    );
    let view = saved.plan.view(saved.counters.available, now);
    json_response(200, &with_refill(deps, kind, &view))
}

async fn check_in(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let caller = caller(req, &deps.sessions).await?;
    let kind = kind(deps, req)?;
    let body = json_body(req)?;
    let now = deps.clock.now();
    let checkin = CheckIn::from_json(&body)?;
    let setting = SubscriptionsSetting::from_body(&body, &deps.config.templates)?;
    let openid = caller.admitted(deps).await?;
    // The standing choice first, and only on the check-in's first application: a
    // replay changes nothing.
    if let Some(setting) = &setting
        && !deps
            .store
            .admit_check_in(&openid, kind, &checkin, now)
            .await?
    {
        attributed(
            format!("check-in {}", checkin.action_id),
            deps.store.stand(&openid, setting, 0, now),
        )
        .await?;
    }
    let outcome = attributed(
        format!("check-in {}", checkin.action_id),
        deps.store.check_in(&openid, kind, &checkin, now),
    )
    .await?;
    let replayed = matches!(outcome, CheckInOutcome::Replayed(_));
    let answer = match outcome {
        CheckInOutcome::Applied(answer) => {
            onegrant::metrics::count(onegrant::metrics::name::CHECK_INS, 1);
            // A carried grant refused on its own (a conflict, the cap) was not recorded.
            let refused =
                answer.get("grant_conflict").is_some() || answer.get("grant_limit").is_some();
            if !refused && checkin.grant.is_some() {
                onegrant::metrics::count(onegrant::metrics::name::GRANTS_REPORTED, 1);
            }
            tracing::info!(openid = %openid_hash(openid.as_str()), kind = %kind.name, action_id = %checkin.action_id, "check-in applied");
            answer
        }
        CheckInOutcome::Replayed(answer) => answer,
    };
    let mut response = json_response(200, &with_refill(deps, kind, &answer))?;
    if replayed {
        // The answer of the check-in's first application: the plan as it was then,
        // which a client must not take for the plan as it is now.
        response.headers_mut().insert(
            onegrant::http::REPLAYED_HEADER,
            lambda_http::http::HeaderValue::from_static("true"),
        );
    }
    Ok(response)
}
