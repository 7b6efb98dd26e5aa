//! Starting `onegrant-local` for a test: free ports, the emulator and stand-in of its
//! own, and what it printed until it reported it was up.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running `onegrant-local` and its ports.
pub struct Started {
    pub child: Child,
    pub api: u16,
    pub invoke: u16,
    pub standin: u16,
    /// Its summary: the lines printed until it said it was up (not every test reads it).
    #[allow(dead_code)]
    pub printed: Vec<String>,
}

/// Starts `onegrant-local` on free ports with `env` added, and waits (up to 120 s)
/// until it says it is up.
pub fn start_local(env: &[(&str, &str)]) -> Started {
    let (api, invoke, standin) = (free_port(), free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_onegrant-local"))
        .env("ONEGRANT_API_PORT", api.to_string())
        .env("ONEGRANT_INVOKE_PORT", invoke.to_string())
        .env("ONEGRANT_STANDIN_PORT", standin.to_string())
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
        api,
        invoke,
        standin,
        printed,
    }
}
