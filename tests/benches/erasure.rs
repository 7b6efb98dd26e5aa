//! The erasure bench (not a test): `cargo bench -p onegrant-tests --bench erasure`
//! (`BENCH_ITEMS` sets the user's history; default 10,000, the figure is
//! 100,000). One user with that many items asks `DELETE /v1/me`; the dispatcher's
//! ticks carry the erasure on until it is done. Reported from one run: the steps, the
//! most items one step read (the bound: 500 keys and the tombstone), the items read in
//! all against the items deleted, and the wall time of the setup and of the erasure.

use onegrant_tests::spawn_app_isolated;

#[tokio::main]
async fn main() {
    let items: usize = std::env::var("BENCH_ITEMS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let app = spawn_app_isolated(&[]).await;
    let user = app.user("big").await;
    let started = std::time::Instant::now();
    app.put_notes(&user, items).await;
    let setup = started.elapsed();
    app.round_trips.take_items_read();

    let started = std::time::Instant::now();
    let answer = app.call("DELETE", "/v1/me", Some(&user.token), None).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    let mut steps = 1u64;
    let mut most = app.round_trips.take_items_read();
    let mut read = most;
    let mut quiet_waits = 0;
    loop {
        let tick = app.tick(55).await;
        let this = app.round_trips.take_items_read();
        read += this;
        steps += u64::from(tick.erasure_steps);
        if tick.erasure_steps > 0 {
            most = most.max(this / u64::from(tick.erasure_steps));
        }
        if tick.erasures_done > 0 {
            break;
        }
        if tick.erasure_steps == 0 {
            // Emptied: the last look comes once the partition stayed empty.
            quiet_waits += 1;
            assert!(quiet_waits < 5, "the erasure ends");
            app.advance(std::time::Duration::from_secs(121));
        }
    }
    let took = started.elapsed();
    let left = app
        .items()
        .await
        .iter()
        .filter(|i| format!("{i:?}").contains(&user.openid))
        .count();
    assert_eq!(left, 0, "nothing names the user");
    println!(
        "items:                 {items} (written in {:.1} s)",
        setup.as_secs_f64()
    );
    println!("steps:                 {steps} (the request's and the ticks')");
    println!("most items one step read: {most} (bound: 500 and the tombstone)");
    println!(
        "items read in all:     {read} → {:.2} per item deleted",
        read as f64 / items as f64
    );
    println!("erasure took:          {:.1} s", took.as_secs_f64());
}
