use std::time::Duration;

use super::*;

/// A pacer whose time passes only by the loop's pauses, shared with the test through
/// an `Arc` so that it reads the time paused once the loop has ended.
#[derive(Clone, Default)]
struct Counted(std::sync::Arc<std::sync::Mutex<Duration>>);

impl Counted {
    fn paused(&self) -> Duration {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Pacer for Counted {
    fn elapsed(&self) -> Duration {
        self.paused()
    }

    fn pause(&mut self, pause: Duration) -> impl std::future::Future<Output = ()> + Send {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) += pause;
        std::future::ready(())
    }
}

/// A try that counts itself in the state it carries, answering `decide(n)` on its
/// n-th try (1-based), on a counted clock.
async fn counted(
    tries: Tries,
    decide: impl Fn(u32) -> Result<Attempt<&'static str>, StoreError> + Copy,
) -> (Result<&'static str, StoreError>, u32, Duration) {
    let clock = Counted::default();
    let (answer, n) = retry_paced(
        "test",
        tries,
        0u32,
        |n| async move {
            let n = n + 1;
            (decide(n), n)
        },
        clock.clone(),
    )
    .await;
    (answer, n, clock.paused())
}

#[tokio::test]
async fn what_a_try_learns_reaches_the_next_and_the_caller() {
    let (answer, n, paused) = counted(Tries::Times(10), |n| {
        Ok(if n < 3 {
            Attempt::Retry
        } else {
            Attempt::Done("done")
        })
    })
    .await;
    assert_eq!((answer.ok(), n), (Some("done"), 3));
    assert!(paused > Duration::ZERO, "a lost race pauses");
}

#[tokio::test]
async fn a_narrowed_write_is_tried_again_at_once() {
    let (answer, n, paused) = counted(Tries::Times(10), |n| {
        Ok(if n < 4 {
            Attempt::Again
        } else {
            Attempt::Done("done")
        })
    })
    .await;
    assert_eq!((answer.ok(), n), (Some("done"), 4));
    assert_eq!(paused, Duration::ZERO, "no pause before an Again");
}

#[tokio::test]
async fn past_its_tries_a_write_is_unavailable_and_its_state_handed_back() {
    let (answer, n, _) = counted(Tries::Times(5), |_| Ok(Attempt::Retry)).await;
    assert!(
        matches!(answer, Err(StoreError::Unavailable(_))),
        "{answer:?}"
    );
    assert_eq!(n, 5);
    // Again counts as a try too: a write narrowed for ever still ends.
    let (answer, n, _) = counted(Tries::Times(5), |_| Ok(Attempt::Again)).await;
    assert!(
        matches!(answer, Err(StoreError::Unavailable(_))),
        "{answer:?}"
    );
    assert_eq!(n, 5);
}

#[tokio::test]
async fn past_its_budget_a_write_is_unavailable() {
    let budget = Duration::from_millis(300);
    let (answer, n, spent) = counted(Tries::Budget(budget), |_| Ok(Attempt::Retry)).await;
    assert!(
        matches!(answer, Err(StoreError::Unavailable(_))),
        "{answer:?}"
    );
    assert!(spent > budget, "{spent:?}");
    assert!(n > 1 && n < MAX_BUDGETED_ATTEMPTS, "{n} tries");
}

#[tokio::test]
async fn an_error_ends_the_loop_at_once_with_the_state() {
    let (answer, n, paused) = counted(Tries::Times(10), |n| {
        if n == 2 {
            Err(StoreError::Corrupt("bad".into()))
        } else {
            Ok(Attempt::Retry)
        }
    })
    .await;
    assert!(matches!(answer, Err(StoreError::Corrupt(_))), "{answer:?}");
    assert_eq!(n, 2, "the state as the failing try handed it back");
    assert!(paused > Duration::ZERO);
}

#[tokio::test]
async fn a_try_that_carries_nothing_runs_the_same_loop() {
    let mut n = 0;
    let answer = retry_contended("test", Tries::Times(3), || {
        n += 1;
        let n = n;
        async move {
            Ok(if n < 2 {
                Attempt::Retry
            } else {
                Attempt::Done(n)
            })
        }
    })
    .await;
    assert_eq!(answer.ok(), Some(2));
}
