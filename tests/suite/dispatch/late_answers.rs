//! Answers that come after the sweep declared a send unknown.

use super::*;

/// A user's push (one grant of the order template) claimed by a dispatcher that then
/// stalled past its lease, and swept `unknown`: the user and the claim.
async fn swept_push(app: &TestApp, name: &str) -> (User, onegrant::store::dispatch::Claim) {
    let user = app.user(name).await;
    app.accept(&user, ORDER, &format!("wr_{name}")).await;
    app.push(&user, name).await;
    let now = app.now();
    let claim = app.claim_and_sweep(now).await;
    (user, claim)
}

/// A late answer for a push whose notification its retention removed meanwhile (read,
/// then expired) settles the push, and never recreates the notification as a stub
/// holding only a push status.
#[tokio::test]
async fn a_late_answer_never_recreates_a_notification_its_retention_removed() {
    let app = spawn_app_with(&[
        FAST[0],
        FAST[1],
        FAST[2],
        ("RETENTION_READ_NOTES_DAYS", "7"),
        ("RETENTION_OUTBOX_DAYS", "30"),
        ("RETENTION_DELIVERIES_DAYS", "30"),
    ])
    .await;
    let user = app.user("expired-note").await;
    app.accept(&user, ORDER, "wr_expired").await;
    let pushed = app.push(&user, "expired-note").await;
    let note_id = pushed["note_id"].as_str().expect("note id").to_string();
    let claim = app.claim_and_sweep(app.now()).await;
    let read = app
        .call(
            "POST",
            &format!("/v1/notifications/{note_id}/read"),
            Some(&user.token),
            None,
        )
        .await;
    assert_eq!(read.status, 200, "{}", read.body);
    // A read note is kept 7 days; the push and its delivery 30.
    assert!(app.ttl_pass(app.now() + Duration::days(8)).await >= 1);
    // Any item under the note's key, whatever it holds (a stub has no `kind`).
    let notes = || async {
        let pk = format!("USER#{}", user.openid);
        app.items()
            .await
            .into_iter()
            .filter(|i| {
                attr_s(i, "pk") == Some(pk.as_str())
                    && attr_s(i, "sk").is_some_and(|sk| sk.starts_with("NOTE#"))
            })
            .count()
    };
    assert_eq!(notes().await, 0, "the note expired");

    let finalized = app
        .finalize_as(
            &claim,
            onegrant::domain::settle::SendResult::Sent {
                msgid: Some("3141592653589793238".into()),
            },
        )
        .await;
    assert!(finalized.late && !finalized.superseded, "{finalized:?}");
    assert_eq!(notes().await, 0, "no stub");
    let outbox = app.items_of(&user, "outbox").await;
    assert_eq!(attr_s(&outbox[0], "state"), Some("sent"), "{outbox:?}");
    assert_ledger_agrees_with_counters(&app).await;
}

/// WeChat's -1: busy, not sent.
fn busy() -> onegrant::domain::settle::SendResult {
    onegrant::domain::settle::SendResult::Refused {
        errcode: -1,
        errmsg: "system error".into(),
    }
}

#[tokio::test]
async fn a_late_failure_never_gives_back_a_grant_of_a_template_refused_since_the_claim() {
    // A push is claimed and its dispatcher stalls; the sweep voids its grant (the send
    // may have gone). The user then turns the template off in WeChat's settings. The
    // stalled dispatcher's answer arrives at last: -1, not sent. Only a sweep's guess is
    // undone by such an answer, never a refusal made since the claim: the grant stays
    // void and nothing is sent with it.
    let app = spawn_app_with(&[FAST[0], FAST[1], FAST[2]]).await;
    let (user, claim) = swept_push(&app, "refused-meanwhile").await;
    let openid = onegrant::domain::OpenId::parse(user.openid.clone()).expect("openid");
    let order = onegrant::domain::TemplateId::parse(ORDER.to_string()).expect("template");
    app.deps
        .store
        .refuse_template(&openid, &order, true, app.now().timestamp(), app.now())
        .await
        .expect("refused");
    let late = app.finalize_as(&claim, busy()).await;
    assert!(late.late && !late.restored, "{late:?}");
    app.assert_grants_void(&user, 1).await;
    // Nothing left to send the push with when it comes due again.
    let grants = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(onegrant_tests::quota(&grants.body, ORDER)["available"], 0);
    assert_ledger_agrees_with_counters(&app).await;
}

#[tokio::test]
async fn a_late_failure_gives_back_a_grant_the_sweep_voided_when_nothing_refused_it() {
    // The control: the same late -1 with no refusal since the claim restores the grant
    // (it was only the sweep's guess), for the push's next try.
    let app = spawn_app_with(&[FAST[0], FAST[1], FAST[2]]).await;
    let (user, claim) = swept_push(&app, "nothing-meanwhile").await;
    let late = app.finalize_as(&claim, busy()).await;
    assert!(late.late && late.restored, "{late:?}");
    let grants = app.get("/v1/grants", Some(&user.token)).await;
    assert_eq!(onegrant_tests::quota(&grants.body, ORDER)["available"], 1);
    assert_ledger_agrees_with_counters(&app).await;
}
