//! `POST /v1/grants` and `GET /v1/grants`: subscription grants and quotas.
//!
//! A report is the success object of `wx.requestSubscribeMessage`; each accepted
//! template adds one grant, once per (user, request_id, template). A grant for a
//! reminder kind's template resumes a plan waiting for one; a reject or ban pauses it.
//! The answer lists the report's grants and every configured template's quota.

use futures::future::BoxFuture;
use lambda_http::http::Method;
use lambda_http::{Body, Request, Response};
use onegrant::Deps;
use onegrant::domain::consent::standing::SubscriptionsSetting;
use onegrant::domain::grants::report::GrantEntry;
use onegrant::domain::{GrantReport, Quota};
use onegrant::http::{ApiError, authenticate_read, caller, json_body, json_response, respond};
use onegrant::store::audit::attributed;
use onegrant::telemetry::openid_hash;
use serde::Serialize;

#[derive(Serialize)]
struct ReportAnswer {
    grants: Vec<GrantEntry>,
    quotas: Vec<Quota>,
}

#[derive(Serialize)]
struct QuotasAnswer {
    quotas: Vec<Quota>,
}

/// The handler as `onegrant::http::run` and the local stack take it.
pub fn handler(deps: &Deps, req: Request) -> BoxFuture<'_, Response<Body>> {
    let budget = onegrant::http::budget(&req, deps.config.limits.handler_budget);
    let route = onegrant::http::route(&req);
    Box::pin(onegrant::http::within(budget, route, handle(deps, req)))
}

/// The function's handler: one request in, one response out.
pub async fn handle(deps: &Deps, req: Request) -> Response<Body> {
    let result = match *req.method() {
        Method::POST => report(deps, &req).await,
        Method::GET => quotas(deps, &req).await,
        // API Gateway routes only the declared methods here.
        _ => Err(ApiError::NotFound),
    };
    respond(result)
}

async fn report(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let caller = caller(req, &deps.sessions).await?;
    let body = json_body(req)?;
    let report = GrantReport::from_json(&body, &deps.config.templates)?;
    let setting = SubscriptionsSetting::from_body(&body, &deps.config.templates)?;
    let openid = caller.admitted(deps).await?;
    let now = deps.clock.now();
    let cause = format!("report {}", report.request_id);
    // A new report past the minute's limit is refused here, before any write.
    let admitted = deps.store.admit_report(&openid, &report, now).await?;
    // The standing choice first (the tap's answer came after the setting was read),
    // and only on the report's first application: a replay changes nothing.
    if let Some(setting) = &setting
        && !admitted.is_replay(&report)
    {
        attributed(cause.clone(), deps.store.stand(&openid, setting, 1, now)).await?;
    }
    let recorded = attributed(cause.clone(), async {
        // The plans that use a reported template move with the report's first
        // application (a grant resumes them, a refusal pauses them); a replay moves none.
        // What the read found recorded is answered as such, not written again.
        deps.store
            .record_grants(&openid, &report, Some(&admitted), now)
            .await
    })
    .await?;
    // New grants only: a replay wrote nothing.
    onegrant::metrics::count(
        onegrant::metrics::name::GRANTS_REPORTED,
        u32::try_from(recorded.written).unwrap_or(u32::MAX),
    );
    tracing::info!(
        openid = %openid_hash(openid.as_str()),
        request_id = %report.request_id,
        templates = report.results.len(),
        written = recorded.written,
        "grant report recorded"
    );
    let stored = deps.store.quota_counters(&openid).await?;
    // A grant for a template some push waits for wakes the best of them (a replay
    // too: waking is idempotent, and its first try may have been cut short).
    for (template, result) in &report.results {
        if result.grants() && stored.waiting.contains(template) {
            Box::pin(deps.store.wake_waiting_logged(&openid, template, now)).await;
        }
    }
    json_response(
        200,
        &ReportAnswer {
            grants: recorded.grants,
            quotas: Quota::for_templates(
                &deps.config.templates,
                &stored.counters,
                &stored.standings,
            ),
        },
    )
}

async fn quotas(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let openid = authenticate_read(req, deps).await?;
    let stored = deps.store.quota_counters(&openid).await?;
    json_response(
        200,
        &QuotasAnswer {
            quotas: Quota::for_templates(
                &deps.config.templates,
                &stored.counters,
                &stored.standings,
            ),
        },
    )
}
