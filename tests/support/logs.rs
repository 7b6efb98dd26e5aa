//! Logs captured through onegrant's own filter.

use std::sync::{Arc, Mutex};

/// Logs captured through onegrant's own filter, for tests that check what is logged.
/// [`LogCapture::start`] installs it as this thread's subscriber (a current-thread test
/// runtime runs the app's tasks on the same thread, so their logs are captured too).
#[derive(Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogCapture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    /// Captures JSON log lines at `rust_log` (as `RUST_LOG` would ask) until the guard
    /// drops.
    pub fn start(rust_log: &str) -> (Self, tracing::dispatcher::DefaultGuard) {
        use tracing_subscriber::layer::SubscriberExt;
        let capture = Self::default();
        let sink = capture.clone();
        let subscriber = tracing_subscriber::registry()
            .with(onegrant::telemetry::log_filter(Some(rust_log), None))
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(move || sink.clone()),
            );
        let guard = tracing_subscriber::util::SubscriberInitExt::set_default(subscriber);
        (capture, guard)
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).to_string()
    }
}
