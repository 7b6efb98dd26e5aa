//! Crash points for the crash-injection tests.
//!
//! `ONEGRANT_FAILPOINT=<name>` makes the process kill itself (SIGKILL: no unwinding, no
//! flushing, exactly like a Lambda container vanishing) when it reaches the point of
//! that name. Unset — always, outside those tests — a point costs one cached lookup.

use std::sync::OnceLock;

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            std::env::var("ONEGRANT_FAILPOINT")
                .ok()
                .filter(|v| !v.is_empty())
        })
        .as_deref()
}

/// Kills the process if the point `name` is armed.
pub fn hit(name: &str) {
    if armed() == Some(name) {
        tracing::warn!(failpoint = name, "failpoint reached: killing the process");
        // SAFETY-free alternative to libc: the kill command sends SIGKILL to ourselves.
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
        // If kill was unavailable, abort is the next most abrupt end.
        std::process::abort();
    }
}

/// Whether the point `name` is armed (for points that must act around an await).
pub fn is_armed(name: &str) -> bool {
    armed() == Some(name)
}
