//! Consent is final: a user's refusal holds until a new accept, and a replay changes
//! nothing — through the HTTP API, WeChat's push callback and the stand-in.

use onegrant_tests::{
    TestApp, User, WATER, assert_ledger_agrees_with_counters, assert_plans_consistent, plan_state,
    spawn_app, spawn_pushing_app,
};
use serde_json::{Value, json};

const CHECKINS: &str = "/v1/reminders/water/checkins";

/// `POST /v1/grants` with one water result; the answer's body.
async fn report(app: &TestApp, user: &User, request_id: &str, result: &str) -> Value {
    let answer = app
        .post(
            "/v1/grants",
            Some(&user.token),
            &json!({"request_id": request_id, "results": {WATER: result}}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// `POST …/checkins`, carrying `grant` (request id, result) if given; the plan answered.
async fn check_in(
    app: &TestApp,
    user: &User,
    action_id: &str,
    grant: Option<(&str, &str)>,
) -> Value {
    let mut body = json!({
        "action_id": action_id,
        "occurred_at": app.now().to_rfc3339(),
        "current_count": 1,
        "daily_goal": 8,
    });
    if let Some((request_id, result)) = grant {
        body["grant_request_id"] = json!(request_id);
        body["subscription_status"] = json!(result);
    }
    let answer = app.post(CHECKINS, Some(&user.token), &body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// The plan as `GET /v1/reminders/water` shows it: (state, pause reason, needs_grant).
async fn plan(app: &TestApp, user: &User) -> (String, Option<String>, bool) {
    app.plan_state(user, "water").await
}

fn view(plan: &Value) -> (String, Option<String>, bool) {
    plan_state(plan)
}

fn paused(reason: &str) -> (String, Option<String>, bool) {
    ("paused".to_string(), Some(reason.to_string()), true)
}

/// A tick finds nothing to send for the user, and the stand-in delivered nothing.
async fn nothing_goes_out(app: &TestApp) {
    let summary = app.tick(3).await;
    assert_eq!(summary.claimed, 0, "{summary:?}");
    assert!(app.deliveries().await.is_empty(), "nothing delivered");
}

async fn invariants(app: &TestApp) {
    assert_ledger_agrees_with_counters(app).await;
    assert_plans_consistent(app).await;
}

/// The replay that used to undo a refusal: the client re-sends an earlier queued
/// accept report (same request id, same body) after the user's reject. It answers as
/// before and moves no plan, though two older grants are still held.
#[tokio::test]
async fn a_replayed_accept_report_never_undoes_a_reject() {
    let app = spawn_app().await;
    let user = app.scheduled_user("alice", 2).await;
    report(&app, &user, "wr_no", "reject").await;
    assert_eq!(plan(&app, &user).await, paused("rejected"));

    let again = report(&app, &user, "wr_alice_0", "accept").await;
    assert_eq!(
        again["grants"],
        json!([{"template_id": WATER, "request_id": "wr_alice_0", "result": "accept", "status": "available"}]),
        "answered as the first time"
    );
    assert_eq!(
        plan(&app, &user).await,
        paused("rejected"),
        "after the replay"
    );
    // Time passing changes nothing: the plan is on no due index.
    nothing_goes_out(&app).await;
    invariants(&app).await;
}

/// The same through WeChat's popup event: a reject pushed to the callback holds
/// against a replayed accept report.
#[tokio::test]
async fn a_popup_reject_holds_against_a_replayed_accept_report() {
    let app = spawn_pushing_app(1).await;
    let user = app.scheduled_user("bob", 2).await;
    app.push_event_answered(
        json!({"event": "popup", "openid": user.openid, "template_id": WATER,
                       "status": "reject", "create_time": app.now().timestamp()}),
    )
    .await;
    assert_eq!(plan(&app, &user).await, paused("rejected"));

    report(&app, &user, "wr_bob_1", "accept").await;
    assert_eq!(
        plan(&app, &user).await,
        paused("rejected"),
        "after the replay"
    );
    nothing_goes_out(&app).await;
    invariants(&app).await;
}

/// After a reject, neither a plain check-in nor a settings save resumes the plan,
/// whatever grants are still held: it stays paused and asks for a grant. A check-in
/// carrying a new accept resumes it.
#[tokio::test]
async fn only_a_new_accept_lifts_a_reject() {
    let app = spawn_app().await;
    let user = app.scheduled_user("carol", 2).await;
    check_in(&app, &user, "wc_1", Some(("wr_no", "reject"))).await;
    assert_eq!(plan(&app, &user).await, paused("rejected"));

    let answered = check_in(&app, &user, "wc_2", None).await;
    assert_eq!(view(&answered), paused("rejected"), "a plain check-in");
    let saved = app.enable(&user, "water").await;
    assert_eq!(saved.status, 200, "{}", saved.body);
    assert_eq!(view(&saved.body), paused("rejected"), "a settings save");
    // Nor a check-in carrying an older grant again (a replay of its report).
    check_in(&app, &user, "wc_3", Some(("wr_carol_0", "accept"))).await;
    assert_eq!(
        plan(&app, &user).await,
        paused("rejected"),
        "an older grant"
    );
    nothing_goes_out(&app).await;

    let resumed = check_in(&app, &user, "wc_4", Some(("wr_new", "accept"))).await;
    assert_eq!(
        (resumed["state"].as_str(), resumed["needs_grant"].as_bool()),
        (Some("scheduled"), Some(false)),
        "{resumed}"
    );
    invariants(&app).await;
}

/// A new accept report resumes a plan a ban paused; the ban's own replay afterwards
/// moves nothing either way.
#[tokio::test]
async fn a_new_accept_report_lifts_a_ban_and_the_ban_replayed_changes_nothing() {
    let app = spawn_app().await;
    let user = app.scheduled_user("dan", 1).await;
    report(&app, &user, "wr_ban", "ban").await;
    assert_eq!(plan(&app, &user).await, paused("banned"));
    report(&app, &user, "wr_again", "accept").await;
    assert_eq!(plan(&app, &user).await.0, "scheduled");
    report(&app, &user, "wr_ban", "ban").await;
    assert_eq!(plan(&app, &user).await.0, "scheduled", "a replayed ban");
    invariants(&app).await;
}

/// A reject while the reminder is off holds when the user turns it on again with
/// grants from before the reject; an accept after it would have lifted it.
#[tokio::test]
async fn a_reject_while_the_reminder_is_off_holds_when_it_is_turned_on() {
    let app = spawn_app().await;
    let user = app.scheduled_user("erin", 1).await;
    assert_eq!(app.disable(&user, "water").await.status, 200);
    report(&app, &user, "wr_after_off", "accept").await;
    report(&app, &user, "wr_no", "reject").await;
    let (_, _, asks) = plan(&app, &user).await;
    assert!(asks, "an off plan with a refusal asks for a grant");
    let on = app.enable(&user, "water").await;
    assert_eq!(view(&on.body), paused("rejected"), "{}", on.body);

    report(&app, &user, "wr_yes", "accept").await;
    assert_eq!(plan(&app, &user).await.0, "scheduled");
    invariants(&app).await;
}

/// Pushes one popup or change event of the water template for `user`, made by WeChat
/// `offset` seconds from now, until every copy is answered 200 (a copy that missed
/// WeChat's window on a loaded machine is pushed again, as WeChat retries it).
async fn choice_event(app: &TestApp, user: &User, event: &str, status: &str, offset: i64) {
    app.push_event_answered(
        json!({"event": event, "openid": user.openid, "template_id": WATER,
                          "status": status,
                          "create_time": app.now().timestamp() + offset}),
    )
    .await;
}

/// WeChat's order, not arrival order: a popup reject WeChat retried after the user's
/// later accept, or an older change event, changes nothing; a newer reject applies.
#[tokio::test]
async fn a_refusal_older_than_an_accept_already_applied_changes_nothing() {
    let app = spawn_pushing_app(1).await;
    let user = app.scheduled_user("fay", 2).await;
    choice_event(&app, &user, "popup", "accept", 0).await;

    choice_event(&app, &user, "popup", "reject", -30).await;
    assert_eq!(
        plan(&app, &user).await.0,
        "scheduled",
        "an older popup reject"
    );
    choice_event(&app, &user, "change", "reject", -20).await;
    assert_eq!(
        plan(&app, &user).await.0,
        "scheduled",
        "an older change event"
    );
    let grants = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(
        onegrant_tests::quota(&grants.body, WATER)["available"],
        2,
        "no grant voided"
    );

    choice_event(&app, &user, "popup", "reject", 1).await;
    assert_eq!(
        plan(&app, &user).await,
        paused("rejected"),
        "a newer reject"
    );
    invariants(&app).await;
}

/// WeChat's `CreateTime` ahead of our clock counts as now (I9): an accept stamped a
/// day ahead (a skewed clock) is applied, and the user's refusal ten seconds later
/// still applies — it is not taken for older than the accept. (Ordered by the stamp as
/// sent, every refusal for a day would look out of order and change nothing.)
#[tokio::test]
async fn a_choice_stamped_ahead_of_our_clock_counts_as_made_now() {
    let app = spawn_pushing_app(1).await;
    let user = app.scheduled_user("gus", 2).await;
    choice_event(&app, &user, "popup", "accept", 86_400).await;
    assert_eq!(plan(&app, &user).await.0, "scheduled");

    app.advance(std::time::Duration::from_secs(10));
    choice_event(&app, &user, "popup", "reject", 0).await;
    assert_eq!(
        plan(&app, &user).await,
        paused("rejected"),
        "the later refusal applies"
    );
    invariants(&app).await;
}

/// WeChat gives up on a push after three tries; an event recorded but never applied
/// (every apply failed) is applied by the dispatcher's sweep once the grace has passed
/// — exactly once: a later sweep or WeChat's retry changes nothing more.
#[tokio::test]
async fn an_event_no_try_applied_is_applied_once_by_the_sweep() {
    use onegrant_tests::faults::Fault;
    let (app, proxy) = onegrant_tests::spawn_faulty_pushing_app(1).await;
    let user = app.scheduled_user("gus", 1).await;
    // The plan's refusal cannot be written: the event is recorded, not applied.
    proxy.inject("TransactWriteItems", Some("PLAN#water"), Fault::Throttle, 0);
    let at = app.now().timestamp();
    let event = json!({"event": "popup", "openid": user.openid, "template_id": WATER,
                       "status": "reject", "create_time": at});
    let failed = app.push_event(event.clone()).await;
    assert_eq!(failed["answers"], json!([503]), "{failed}");
    proxy.clear();
    assert_eq!(plan(&app, &user).await.0, "scheduled", "not applied yet");

    let now = app.now();
    let early = app.sweep_at(now + chrono::Duration::seconds(20)).await;
    assert_eq!(
        early.events_applied, 0,
        "within WeChat's retries: {early:?}"
    );
    let swept = app.sweep_at(now + chrono::Duration::seconds(120)).await;
    assert_eq!(swept.events_applied, 1, "{swept:?}");
    assert_eq!(plan(&app, &user).await, paused("rejected"));
    let version = |plan: Option<std::collections::HashMap<String, _>>| {
        plan.as_ref()
            .and_then(|p| onegrant_tests::attr_n(p, "version"))
    };
    let applied_at = version(app.item(&user, "PLAN#water").await);

    let again = app.sweep_at(now + chrono::Duration::seconds(180)).await;
    assert_eq!(again.events_applied, 0, "{again:?}");
    // WeChat's retry (WeChat retries a push answered 5xx, as a loaded table may answer).
    let mut retried = app.push_event(event.clone()).await;
    for _ in 0..2 {
        if retried["answers"] != json!([503]) {
            break;
        }
        retried = app.push_event(event.clone()).await;
    }
    assert_eq!(retried["answers"], json!([200]), "{retried}");
    assert_eq!(
        version(app.item(&user, "PLAN#water").await),
        applied_at,
        "applied once"
    );
    invariants(&app).await;
}

/// A refusal of a reminder's template made before the reminder was ever set up is
/// kept: turning the reminder on later, with a grant given before the refusal, finds
/// it paused — whether the refusal came in a report or as WeChat's popup event.
#[tokio::test]
async fn a_refusal_before_the_reminder_was_ever_set_up_holds_when_it_is_turned_on() {
    let app = spawn_pushing_app(1).await;
    for (name, by_event) in [("hana", false), ("ivan", true)] {
        let user = app.user(name).await;
        report(&app, &user, &format!("wr_{name}"), "accept").await;
        if by_event {
            choice_event(&app, &user, "popup", "reject", 0).await;
        } else {
            report(&app, &user, &format!("wr_{name}_no"), "reject").await;
        }
        let (state, _, asks) = plan(&app, &user).await;
        assert_eq!((state.as_str(), asks), ("disabled", true), "{name}");
        let on = app.enable(&user, "water").await;
        assert_eq!(view(&on.body), paused("rejected"), "{name}: {}", on.body);
    }
    invariants(&app).await;
}

/// A change event (turned off in WeChat's settings) voids the grants given before it;
/// applied again — WeChat retrying after its mark was lost, or the sweep — it never
/// takes away a grant the user gave after it.
#[tokio::test]
async fn a_change_event_applied_again_spares_a_grant_given_after_it() {
    let app = spawn_pushing_app(1).await;
    let user = app.scheduled_user("jun", 1).await;
    let made = app.now().timestamp();
    app.push_event_answered(
        json!({"event": "change", "openid": user.openid, "template_id": WATER,
                       "status": "reject", "create_time": made}),
    )
    .await;
    let available = |body: &Value| onegrant_tests::quota(body, WATER)["available"].clone();
    // A tie goes to the refusal: the grant given after it comes in a later second.
    app.advance(std::time::Duration::from_millis(1100));
    assert_eq!(
        available(&report(&app, &user, "wr_after", "accept").await),
        1
    );

    let openid = onegrant::domain::OpenId::parse(user.openid.clone()).expect("openid");
    let water = onegrant::domain::TemplateId::parse(WATER.to_string()).expect("template");
    app.deps
        .store
        .refuse_template(&openid, &water, true, made, app.now())
        .await
        .expect("applied again");
    let quotas = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(available(&quotas.body), 1, "the later grant stays");
    invariants(&app).await;
}
