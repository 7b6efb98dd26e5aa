//! The store's one retry loop ([`retry_carrying`]) and its pauses.

use std::time::Duration;

use crate::store::error::StoreError;

/// How often a write contended by other writers is tried before answering 503. High
/// enough for a burst of one user's offline queue arriving at once (50 check-ins).
pub(crate) const MAX_WRITE_ATTEMPTS: u32 = 40;

/// How often a contended API write is tried, at most: a backstop only, since the time
/// budget ([`Limits::write_budget`](crate::config::Limits)) is what bounds it (a few
/// dozen attempts fit in the deployed 4 s; the suite's slower emulator gets 20 s).
const MAX_BUDGETED_ATTEMPTS: u32 = 200;

/// The pause before retry `attempt` (1-based): "full jitter" over an exponentially
/// growing window (10 ms, 20 ms, … capped at 640 ms), so contending writers spread out
/// instead of colliding again in lockstep.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let window = 10u64 << attempt.saturating_sub(1).min(6);
    let random = u64::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or([0; 8]),
    );
    Duration::from_millis(random % window + 1)
}

/// Where the loop waits and reads how long it has been trying: the monotonic clock in
/// the product ([`Monotonic`]), a counted one in its tests (time is an input there
/// too, and no test build needs tokio's `test-util`, which would split the workspace's
/// one build: docs/testing.md, "One build").
pub(crate) trait Pacer {
    /// How long since the loop began.
    fn elapsed(&self) -> Duration;
    /// Waits `pause`.
    fn pause(&mut self, pause: Duration) -> impl std::future::Future<Output = ()> + Send;
}

/// The product's pacer: tokio's monotonic clock and real sleeps.
pub(crate) struct Monotonic(tokio::time::Instant);

impl Monotonic {
    pub(crate) fn start() -> Self {
        Monotonic(tokio::time::Instant::now())
    }
}

impl Pacer for Monotonic {
    fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }

    fn pause(&mut self, pause: Duration) -> impl std::future::Future<Output = ()> + Send {
        tokio::time::sleep(pause)
    }
}

/// What one try of a contended write decided.
pub(crate) enum Attempt<T> {
    /// Finished with this answer.
    Done(T),
    /// Lost a race (a condition or a conflicting write): read again and try again,
    /// after a pause.
    Retry,
    /// Narrowed what it writes after a refusal (a part that no longer applies
    /// dropped): try again at once, no pause.
    Again,
}

/// How long a contended write keeps trying before it is `Unavailable`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Tries {
    /// Until this much time has passed: an API write, whose caller waits for it
    /// ([`Limits::write_budget`](crate::config::Limits)), [`MAX_BUDGETED_ATTEMPTS`] at
    /// most.
    Budget(Duration),
    /// This many times: the dispatcher's writes, bounded by their invocation.
    Times(u32),
}

impl From<Duration> for Tries {
    fn from(budget: Duration) -> Self {
        Tries::Budget(budget)
    }
}

/// The store's one retry loop, for an attempt that carries nothing from one try to
/// the next: see [`retry_carrying`].
pub(crate) async fn retry_contended<T, F, Fut>(
    what: &'static str,
    tries: impl Into<Tries>,
    mut attempt: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Attempt<T>, StoreError>>,
{
    let carried = retry_carrying(what, tries, (), |()| {
        let tried = attempt();
        async move { (tried.await, ()) }
    });
    carried.await.0
}

/// The store's one retry loop: runs `attempt` until it is done, pausing [`backoff`]
/// (counted as [`crate::metrics::name::CONTENDED_RETRIES`], by `what`) after each
/// [`Attempt::Retry`]; past `tries` the write is `Unavailable` (503 with
/// `Retry-After`), naming `what`; an error ends it. Every read-decide-write cycle goes
/// through it. What one try learns for the next (the version a save wrote, a claim's
/// unanswered attempts, a settle's dropped grant) is an ordinary value, `state`: each
/// try takes it and hands it on with its decision, and the loop hands it back with the
/// answer or the error (a claim looks for its unanswered attempts either way). (Not a
/// borrow kept by an async closure: such a future cannot be proven `Send` for the
/// handlers on today's compiler.)
pub(crate) async fn retry_carrying<S, T, F, Fut>(
    what: &'static str,
    tries: impl Into<Tries>,
    state: S,
    attempt: F,
) -> (Result<T, StoreError>, S)
where
    F: FnMut(S) -> Fut,
    Fut: std::future::Future<Output = (Result<Attempt<T>, StoreError>, S)>,
{
    retry_paced(what, tries.into(), state, attempt, Monotonic::start()).await
}

/// [`retry_carrying`]'s loop, paced by `pacer`.
pub(crate) async fn retry_paced<S, T, F, Fut>(
    what: &'static str,
    tries: Tries,
    mut state: S,
    mut attempt: F,
    mut pacer: impl Pacer,
) -> (Result<T, StoreError>, S)
where
    F: FnMut(S) -> Fut,
    Fut: std::future::Future<Output = (Result<Attempt<T>, StoreError>, S)>,
{
    let most = match tries {
        Tries::Budget(_) => MAX_BUDGETED_ATTEMPTS,
        Tries::Times(times) => times,
    };
    for n in 1..=most {
        // On the heap: a try's future holds the state and the whole read-decide-write
        // (a claim's is large), and the loop's own stays small inside its caller's —
        // carried inline, debug builds overflowed a worker thread's stack.
        let (decided, next) = Box::pin(attempt(state)).await;
        state = next;
        match decided {
            Ok(Attempt::Done(answer)) => return (Ok(answer), state),
            Err(e) => return (Err(e), state),
            Ok(Attempt::Again) => continue,
            Ok(Attempt::Retry) => {}
        }
        if let Tries::Budget(budget) = tries
            && pacer.elapsed() > budget
        {
            break;
        }
        // The pause before trying again a write that lost a race or met a throttle,
        // counted. (The window grows with the tries so far, narrowed ones included, as
        // settle's own loop counted them.)
        crate::metrics::count_by(
            crate::metrics::name::CONTENDED_RETRIES,
            "What",
            what.to_string(),
            1,
        );
        pacer.pause(backoff(n)).await;
    }
    let spent = StoreError::Unavailable(format!("{what} contended past the retry limit").into());
    (Err(spent), state)
}

#[cfg(test)]
mod tests;
