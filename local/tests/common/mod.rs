//! Starting `onegrant-local` for a test: the free ports it picks, the emulator and stand-in of its
//! own, and what it printed until it reported it was up.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `onegrant-local` and its ports.
pub struct Started {
    pub child: Child,
    pub api: u16,
    #[allow(dead_code)]
    pub invoke: u16,
    pub standin: u16,
    /// Its summary: the lines printed until it said it was up (not every test reads it).
    #[allow(dead_code)]
    pub printed: Vec<String>,
}

/// The port `onegrant-local` printed for `label` (it binds port 0 to a free one).
fn printed_port(printed: &[String], label: &str) -> u16 {
    printed
        .iter()
        .filter_map(|line| line.trim_start().strip_prefix(label))
        .filter_map(|rest| rest.trim_start().strip_prefix("http://127.0.0.1:"))
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .next()
        .unwrap_or_else(|| panic!("onegrant-local printed its {label} address: {printed:?}"))
}

/// Starts `onegrant-local` on free ports (port 0 for each: it binds free ones and
/// prints them, so stacks started side by side never race for a port) with `env`
/// added, and waits (up to 120 s) until it says it is up.
pub fn start_local(env: &[(&str, &str)]) -> Started {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onegrant-local"))
        .env("ONEGRANT_API_PORT", "0")
        .env("ONEGRANT_INVOKE_PORT", "0")
        .env("ONEGRANT_STANDIN_PORT", "0")
        .envs(env.iter().copied())
        .env_remove("AWS_ENDPOINT_URL_DYNAMODB")
        .env_remove("WECHAT_API_BASE")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("onegrant-local starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut printed: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !printed
        .iter()
        .any(|l| l.contains("Ctrl-C stops everything"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        printed.push(rx.recv_timeout(left).expect("the stack reports it is up"));
    }
    Started {
        child,
        api: printed_port(&printed, "HTTP API"),
        invoke: printed_port(&printed, "Invoke API"),
        standin: printed_port(&printed, "WeChat stand-in"),
        printed,
    }
}
