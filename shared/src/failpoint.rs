//! Crash points for the crash-injection tests.
//!
//! `ONEGRANT_FAILPOINT=<name>` makes the process kill itself (SIGKILL: no unwinding, no
//! flushing, exactly like a Lambda container vanishing) when it reaches the point of
//! that name. `<name>:stop` stops it instead (SIGSTOP: a container frozen mid-flight,
//! resumed when the test sends SIGCONT). `<name>:<ms>` arms a point that acts after a
//! delay (see [`delay_of`]). Unset — always, outside those tests — a point costs one
//! cached lookup.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// What an armed point does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Kill,
    Stop,
    After(Duration),
}

fn armed() -> Option<(&'static str, Action)> {
    static ARMED: OnceLock<Option<(String, Action)>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let value = std::env::var("ONEGRANT_FAILPOINT").ok()?;
            let (name, action) = match value.split_once(':') {
                None => (value.as_str(), Action::Kill),
                Some((name, "stop")) => (name, Action::Stop),
                Some((name, ms)) => (name, Action::After(Duration::from_millis(ms.parse().ok()?))),
            };
            (!name.is_empty()).then(|| (name.to_string(), action))
        })
        .as_ref()
        .map(|(name, action)| (name.as_str(), *action))
}

/// A stop point stops the process once; later hits pass.
static STOPPED: AtomicBool = AtomicBool::new(false);

fn signal_self(signal: &str) {
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args([signal, &pid])
        .status();
}

/// Kills (or stops) the process if the point `name` is armed.
pub fn hit(name: &str) {
    match armed() {
        Some((armed, Action::Kill | Action::After(_))) if armed == name => {
            tracing::warn!(failpoint = name, "failpoint reached: killing the process");
            signal_self("-KILL");
            // If kill was unavailable, abort is the next most abrupt end.
            std::process::abort();
        }
        Some((armed, Action::Stop)) if armed == name && !STOPPED.swap(true, Ordering::SeqCst) => {
            tracing::warn!(failpoint = name, "failpoint reached: stopping the process");
            // Resumed by SIGCONT from the test; the code then carries on from here.
            signal_self("-STOP");
        }
        Some(_) | None => {}
    }
}

/// For points that must act around an await: how long to let the awaited work run
/// before [`hit`] (2 ms unless the point was armed as `<name>:<ms>`), if `name` is armed.
pub fn delay_of(name: &str) -> Option<Duration> {
    match armed() {
        Some((armed, Action::After(delay))) if armed == name => Some(delay),
        Some((armed, Action::Kill)) if armed == name => Some(Duration::from_millis(2)),
        Some(_) | None => None,
    }
}
