//! The one source of time the product reads: schedules, rate windows, leases, quiet
//! hours, expiry, read-ahead ages and token lifetimes all take `now` from a [`Clock`].
//!
//! Deployed functions and the local stack use [`Clock::system`]. Tests build a
//! [`Clock::test`] clock: it runs with the system clock (so latencies, budgets and
//! timeouts stay real) until the test moves it forward with [`Clock::advance`] or
//! [`Clock::set`], which wakes everything waiting in [`Clock::sleep_until`] at once. A
//! test therefore makes a minute pass, a lease run out or a scheduled instant arrive
//! without waiting for it.
//!
//! Elapsed-time budgets (a handler's 9 s, a write's 4 s, an invocation's deadline) are
//! measured on the monotonic clock (`tokio::time::Instant`), not here: they are about
//! how long real I/O may take, not about what time it is.

use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

/// What time it is, for the whole product. Cheap to clone; clones share one time.
#[derive(Clone)]
pub struct Clock {
    inner: Arc<Inner>,
}

enum Inner {
    System,
    Test {
        time: Mutex<TestTime>,
        /// Told every move, so sleepers look at the time again.
        moved: watch::Sender<()>,
    },
}

/// A test clock's reading: the system clock shifted by what the test moved it, or
/// held at one instant.
#[derive(Debug, Clone, Copy)]
struct TestTime {
    offset_ms: i64,
    /// Held here (epoch milliseconds) while frozen.
    frozen_at: Option<i64>,
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*self.inner {
            Inner::System => f.write_str("Clock::System"),
            Inner::Test { time, .. } => f
                .debug_tuple("Clock::Test")
                .field(&*time.lock().unwrap_or_else(PoisonError::into_inner))
                .finish(),
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::system()
    }
}

impl Clock {
    /// The system's clock: what Lambda and the local stack read.
    pub fn system() -> Self {
        Self {
            inner: Arc::new(Inner::System),
        }
    }

    /// A clock a test moves: it reads as the system clock until moved.
    pub fn test() -> Self {
        let (moved, _) = watch::channel(());
        Self {
            inner: Arc::new(Inner::Test {
                time: Mutex::new(TestTime {
                    offset_ms: 0,
                    frozen_at: None,
                }),
                moved,
            }),
        }
    }

    /// The system's time, for the few readings that are about real time whatever a
    /// test does (an invocation's deadline given by Lambda, a request's signing time).
    #[allow(clippy::disallowed_methods)]
    pub fn real_now() -> DateTime<Utc> {
        Utc::now()
    }

    /// What time it is.
    pub fn now(&self) -> DateTime<Utc> {
        match &*self.inner {
            Inner::System => Self::real_now(),
            Inner::Test { time, .. } => {
                let time = *time.lock().unwrap_or_else(PoisonError::into_inner);
                match time.frozen_at {
                    Some(at) => from_ms(at),
                    None => Self::real_now() + chrono::Duration::milliseconds(time.offset_ms),
                }
            }
        }
    }

    /// Moves a test clock forward by `by` (time passing, without waiting for it).
    ///
    /// # Panics
    /// On the system clock, which nothing may move.
    pub fn advance(&self, by: std::time::Duration) {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.change(|time| match &mut time.frozen_at {
            Some(at) => *at = at.saturating_add(by),
            None => time.offset_ms = time.offset_ms.saturating_add(by),
        });
    }

    /// Moves a test clock to `at` (forward or back); a frozen clock stays frozen there.
    ///
    /// # Panics
    /// On the system clock, which nothing may move.
    pub fn set(&self, at: DateTime<Utc>) {
        let at = at.timestamp_millis();
        self.change(|time| match &mut time.frozen_at {
            Some(held) => *held = at,
            None => time.offset_ms = at - Self::real_now().timestamp_millis(),
        });
    }

    /// Holds a test clock at `at`: it reads `at` until moved or let run again. For a
    /// test whose every request must fall in one minute (a per-minute limit) however
    /// slow the machine.
    ///
    /// # Panics
    /// On the system clock, which nothing may move.
    pub fn freeze_at(&self, at: DateTime<Utc>) {
        self.change(|time| time.frozen_at = Some(at.timestamp_millis()));
    }

    /// Lets a frozen test clock run again from where it is held.
    ///
    /// # Panics
    /// On the system clock, which nothing may move.
    pub fn run(&self) {
        self.change(|time| {
            if let Some(at) = time.frozen_at.take() {
                time.offset_ms = at - Self::real_now().timestamp_millis();
            }
        });
    }

    fn change(&self, how: impl FnOnce(&mut TestTime)) {
        let Inner::Test { time, moved } = &*self.inner else {
            panic!("the system clock cannot be moved");
        };
        how(&mut time.lock().unwrap_or_else(PoisonError::into_inner));
        moved.send_replace(());
    }

    /// Waits until the clock reads `at` or later: by the system clock's own passing,
    /// or at once when a test moves the clock past it.
    pub async fn sleep_until(&self, at: DateTime<Utc>) {
        let mut moved = match &*self.inner {
            Inner::System => None,
            Inner::Test { moved, .. } => Some(moved.subscribe()),
        };
        loop {
            let wait = match (at - self.now()).to_std() {
                Ok(wait) if !wait.is_zero() => wait,
                // At or past the instant.
                _ => return,
            };
            match &mut moved {
                None => tokio::time::sleep(wait).await,
                Some(moved) => {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        // The sender lives as long as the clock, so this only ends
                        // with a move.
                        _ = moved.changed() => {}
                    }
                }
            }
        }
    }

    /// Waits for `for_` to pass on this clock.
    pub async fn sleep(&self, for_: std::time::Duration) {
        let at = self.now() + chrono::Duration::from_std(for_).unwrap_or(chrono::TimeDelta::MAX);
        self.sleep_until(at).await;
    }

    /// How long from now until `at`; zero once it has passed.
    pub fn until(&self, at: DateTime<Utc>) -> std::time::Duration {
        (at - self.now()).to_std().unwrap_or_default()
    }
}

fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_test_clock_reads_the_system_time_until_moved_and_then_as_moved() {
        let clock = Clock::test();
        let drift = (clock.now() - Clock::real_now()).num_milliseconds().abs();
        assert!(drift < 1_000, "{drift}");
        clock.advance(Duration::from_secs(3600));
        let ahead = (clock.now() - Clock::real_now()).num_seconds();
        assert!((3599..=3600).contains(&ahead), "{ahead}");
        let at = DateTime::from_timestamp(1_800_000_000, 0).expect("an instant");
        clock.set(at);
        let off = (clock.now() - at).num_milliseconds();
        assert!((0..1_000).contains(&off), "{off}");
        // Clones share the one time.
        let other = clock.clone();
        other.advance(Duration::from_secs(60));
        assert!(clock.now() >= at + chrono::Duration::seconds(60));
    }

    #[test]
    fn a_frozen_clock_reads_one_instant_until_moved_and_runs_on_from_there() {
        let clock = Clock::test();
        let at = DateTime::from_timestamp(1_800_000_000, 0).expect("an instant");
        clock.freeze_at(at);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(clock.now(), at);
        clock.advance(Duration::from_secs(90));
        assert_eq!(clock.now(), at + chrono::Duration::seconds(90));
        clock.run();
        std::thread::sleep(Duration::from_millis(20));
        let ran = (clock.now() - at).num_milliseconds();
        assert!((90_020..91_000).contains(&ran), "{ran}");
    }

    #[test]
    #[should_panic(expected = "the system clock cannot be moved")]
    fn the_system_clock_cannot_be_moved() {
        Clock::system().advance(Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_sleeper_wakes_when_the_clock_is_moved_past_its_instant_not_before() {
        let clock = Clock::test();
        let at = clock.now() + chrono::Duration::hours(1);
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move {
                clock.sleep_until(at).await;
                clock.now()
            }
        });
        // A move short of the instant leaves it asleep.
        clock.advance(Duration::from_secs(1800));
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!sleeper.is_finished(), "woke half an hour early");
        clock.advance(Duration::from_secs(1800));
        let woke = tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .expect("woken by the move, not by an hour passing")
            .expect("the sleeper ran");
        assert!(woke >= at, "woke at {woke}, due {at}");
    }

    #[tokio::test]
    async fn a_sleep_on_the_system_clock_waits_for_the_time_itself() {
        let clock = Clock::system();
        let started = std::time::Instant::now();
        clock.sleep(Duration::from_millis(30)).await;
        assert!(started.elapsed() >= Duration::from_millis(30));
        // An instant in the past returns at once.
        clock
            .sleep_until(clock.now() - chrono::Duration::days(1))
            .await;
    }
}
