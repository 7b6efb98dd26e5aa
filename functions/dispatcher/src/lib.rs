//! The dispatcher: every minute, recover stale claims, then claim each due reminder or
//! notification push, send it at most once, and finalize it — on time to the second.
//!
//! One tick:
//! 1. **Sweep** the lease index: deliveries past their lease become `unknown`.
//! 2. **Query** every shard of the due index in parallel for plans due before the next
//!    tick (now + lookahead).
//! 3. For each, **wait until it is due**, then claim it (one transaction), send it
//!    (outside any transaction), and finalize it by the outcome table — up to
//!    `concurrency` sends in flight, one at a time per openid.
//! 4. Stop claiming when the invocation's remaining time cannot cover a send and a
//!    finalize; what is left stays on the index for the next tick.
//!
//! Any number of dispatchers may run at once: a claim is a conditional transaction, so
//! exactly one wins each plan and the others move on.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::future::{BoxFuture, join_all};
use onegrant::Deps;
use onegrant::domain::keywords::fit_all;
use onegrant::domain::outcome::{OutcomeClass, SendResult};
use onegrant::domain::reminder::ContentValues;
use onegrant::store::StoreError;
use onegrant::store::deliveries::{Claim, ClaimOutcome, ClaimSource, DueItem};
use onegrant::telemetry::openid_hash;
use onegrant::wechat::Message;
use serde::Serialize;
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

/// Time kept back, beyond the WeChat timeouts, for a finalize after the last send.
const FINALIZE_MARGIN: Duration = Duration::from_secs(3);

/// What one tick did. Also logged, and emitted as CloudWatch EMF metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub due: u32,
    pub claimed: u32,
    pub sent: u32,
    pub failed: u32,
    pub unknown: u32,
    pub recovered: u32,
    pub restored: u32,
    pub config_errors: u32,
    pub no_grant: u32,
    pub lost: u32,
    pub deferred: u32,
    /// Milliseconds from each due instant to its send's answer.
    #[serde(skip)]
    pub latencies_ms: Vec<i64>,
}

/// Runs one tick that must finish by `deadline`.
pub async fn tick(deps: &Deps, deadline: Instant) -> Result<Summary, StoreError> {
    let config = &deps.config;
    let claimer = uuid::Uuid::new_v4().simple().to_string();
    let now = Utc::now();
    let summary = Arc::new(Mutex::new(Summary {
        recovered: deps
            .store
            .sweep(&config.reminders, config.due_shards, now)
            .await?,
        ..Summary::default()
    }));
    let horizon = now + chrono::Duration::from_std(config.dispatch.lookahead).unwrap_or_default();
    let mut due = deps.store.due_items(config.due_shards, horizon).await?;
    // Earliest first; among items due at the same instant, a random order, so that
    // dispatchers running at once mostly start on different plans instead of all
    // racing for the same one.
    due.sort_by_cached_key(|item| (item.due_at, uuid::Uuid::new_v4()));
    summary.lock().await.due = u32::try_from(due.len()).unwrap_or(u32::MAX);
    let needed =
        deps.wechat.config().connect_timeout + deps.wechat.config().timeout + FINALIZE_MARGIN;
    let permits = Arc::new(Semaphore::new(config.dispatch.concurrency));
    let runs = due.into_iter().map(|item| {
        let (summary, permits, claimer) = (summary.clone(), permits.clone(), claimer.clone());
        async move {
            let outcome = dispatch_one(deps, &item, &claimer, deadline, needed, &permits).await;
            let mut s = summary.lock().await;
            match outcome {
                Ok(Dispatched::Deferred) => s.deferred += 1,
                Ok(Dispatched::Lost) => s.lost += 1,
                Ok(Dispatched::NoGrant) => s.no_grant += 1,
                Ok(Dispatched::Done {
                    class,
                    restored,
                    latency_ms,
                }) => {
                    s.claimed += 1;
                    s.restored += u32::from(restored);
                    s.latencies_ms.push(latency_ms);
                    match class {
                        OutcomeClass::Sent => s.sent += 1,
                        OutcomeClass::Unknown => s.unknown += 1,
                        OutcomeClass::Config => {
                            s.config_errors += 1;
                            s.failed += 1;
                        }
                        OutcomeClass::Retryable | OutcomeClass::Refused | OutcomeClass::User => {
                            s.failed += 1
                        }
                    }
                }
                Err(e) => {
                    // Left for the sweep (claimed) or the next tick (not claimed).
                    tracing::error!(
                        error = %onegrant::telemetry::error_chain(&e),
                        pk_hash = %openid_hash(&item.pk),
                        "dispatch failed"
                    );
                    s.lost += 1;
                }
            }
        }
    });
    join_all(runs).await;
    let summary = summary.lock().await.clone();
    tracing::info!(
        due = summary.due,
        claimed = summary.claimed,
        sent = summary.sent,
        failed = summary.failed,
        unknown = summary.unknown,
        recovered = summary.recovered,
        restored = summary.restored,
        deferred = summary.deferred,
        "dispatcher tick"
    );
    emit_metrics(&summary);
    Ok(summary)
}

enum Dispatched {
    Done {
        class: OutcomeClass,
        restored: bool,
        latency_ms: i64,
    },
    Lost,
    NoGrant,
    Deferred,
}

async fn dispatch_one(
    deps: &Deps,
    item: &DueItem,
    claimer: &str,
    deadline: Instant,
    needed: Duration,
    permits: &Semaphore,
) -> Result<Dispatched, StoreError> {
    let config = &deps.config;
    let wait = (item.due_at - Utc::now()).to_std().unwrap_or_default();
    if Instant::now() + wait + needed > deadline {
        return Ok(Dispatched::Deferred);
    }
    tokio::time::sleep(wait).await;
    let Ok(_permit) = permits.acquire().await else {
        return Ok(Dispatched::Deferred);
    };
    if Instant::now() + needed > deadline {
        return Ok(Dispatched::Deferred);
    }
    let claim = match deps
        .store
        .claim(
            item,
            &config.reminders,
            claimer,
            config.due_shards,
            config.dispatch.lease,
            Utc::now(),
        )
        .await?
    {
        ClaimOutcome::Claimed(claim) => claim,
        ClaimOutcome::Lost => return Ok(Dispatched::Lost),
        ClaimOutcome::NoGrant => return Ok(Dispatched::NoGrant),
    };
    onegrant::failpoint::hit("after_claim");
    if !deps.store.mark_sending(&claim).await? {
        return Ok(Dispatched::Lost);
    }
    let result = match message(deps, &claim) {
        Ok(message) => deps.wechat.send(&message).await,
        Err(invalid) => invalid,
    };
    let latency_ms = (Utc::now() - claim.due_at).num_milliseconds();
    onegrant::failpoint::hit("after_send");
    let finalize = deps.store.finalize(
        &claim,
        &result,
        &config.dispatch,
        config.due_shards,
        Utc::now(),
    );
    if onegrant::failpoint::is_armed("during_finalize") {
        // Die with the finalize transaction in flight: it may or may not land.
        tokio::select! {
            _ = finalize => {}
            () = tokio::time::sleep(Duration::from_millis(2)) => {}
        }
        onegrant::failpoint::hit("during_finalize");
        return Ok(Dispatched::Lost);
    }
    let finalized = finalize.await?;
    let class = finalized.class;
    match class {
        OutcomeClass::Config => tracing::error!(
            openid = %openid_hash(claim.openid.as_str()),
            template = %claim.template_id,
            delivery_id = %claim.delivery_id,
            errcode = ?result.errcode(),
            "WeChat refused the template or content: fix the configuration"
        ),
        OutcomeClass::Sent
        | OutcomeClass::Retryable
        | OutcomeClass::Refused
        | OutcomeClass::User
        | OutcomeClass::Unknown => tracing::info!(
            openid = %openid_hash(claim.openid.as_str()),
            template = %claim.template_id,
            delivery_id = %claim.delivery_id,
            errcode = ?result.errcode(),
            outcome = ?class,
            latency_ms,
            "delivery finalized"
        ),
    }
    Ok(Dispatched::Done {
        class,
        restored: finalized.restored,
        latency_ms,
    })
}

/// The message for a claim: a reminder's content rendered for the user, or a push's
/// data as ingested, fitted to the template's keyword rules.
fn message(deps: &Deps, claim: &Claim) -> Result<Message, SendResult> {
    let template = deps
        .config
        .templates
        .get(claim.template_id.as_str())
        .ok_or_else(|| SendResult::Invalid {
            reason: format!("template {} is not configured", claim.template_id),
        })?;
    let (values, page) = match &claim.source {
        ClaimSource::Plan { kind, plan } => {
            let schedule = plan.settings.schedule;
            let local = claim.due_at.with_timezone(&schedule.timezone().tz());
            let values = ContentValues {
                due_time: local.format("%H:%M").to_string(),
                due_date: local.format("%Y年%-m月%-d日").to_string(),
                count: plan.count_on(schedule.waking_day(claim.due_at)),
                goal: plan.settings.daily_goal,
            };
            (kind.render(&values), template.page.clone())
        }
        ClaimSource::Outbox(outbox) => (outbox.data.clone(), outbox.page.clone()),
    };
    let data = fit_all(template, &values).map_err(|e| SendResult::Invalid {
        reason: e.to_string(),
    })?;
    Ok(Message {
        touser: claim.openid.clone(),
        template_id: template.id.to_string(),
        page,
        data,
    })
}

/// One CloudWatch Embedded Metric Format line per tick.
fn emit_metrics(summary: &Summary) {
    let line = serde_json::json!({
        "_aws": {
            "Timestamp": Utc::now().timestamp_millis(),
            "CloudWatchMetrics": [{
                "Namespace": "onegrant",
                "Dimensions": [["Function"]],
                "Metrics": [
                    {"Name": "Sent", "Unit": "Count"},
                    {"Name": "Failed", "Unit": "Count"},
                    {"Name": "Unknown", "Unit": "Count"},
                    {"Name": "Recovered", "Unit": "Count"},
                    {"Name": "ConfigErrors", "Unit": "Count"},
                    {"Name": "Deferred", "Unit": "Count"}
                ]
            }]
        },
        "Function": "dispatcher",
        "Sent": summary.sent,
        "Failed": summary.failed,
        "Unknown": summary.unknown,
        "Recovered": summary.recovered,
        "ConfigErrors": summary.config_errors,
        "Deferred": summary.deferred,
    });
    if std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some() {
        println!("{line}");
    }
}

/// The dispatcher as its Lambda `main` and the local Invoke API call it: one tick with
/// `budget` of time (the invocation's), answering the summary.
pub fn invoke(
    deps: &Deps,
    _event: serde_json::Value,
    budget: Duration,
) -> BoxFuture<'_, Result<serde_json::Value, String>> {
    Box::pin(async move {
        let summary = tick(deps, Instant::now() + budget)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::to_value(summary).map_err(|e| e.to_string())
    })
}
