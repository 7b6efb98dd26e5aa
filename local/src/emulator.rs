//! Starts the embedded DynamoDB emulator: moto, pinned in `.venv` by `scripts/setup`,
//! behind `scripts/moto_serial.py`, which applies requests one at a time (moto's own
//! threaded server is not atomic; docs/design.md §7).
//!
//! The child watches its standard input and exits when it closes, so it dies with its
//! parent even on SIGKILL: no emulator outlives a test run or a local stack.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};

/// The repository root (where `.venv` and `scripts/` live).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// A running emulator; killed on drop.
pub struct Emulator {
    child: Child,
    // Held open: closing it tells the child to exit.
    _stdin: ChildStdin,
    endpoint: String,
}

impl Emulator {
    /// Starts moto on a free loopback port and waits until it accepts connections.
    /// `quiet` discards the emulator's own stderr.
    pub fn start(quiet: bool) -> anyhow::Result<Self> {
        Self::start_with(quiet, &[])
    }

    /// Like [`Emulator::start`], with `env` set for the launcher (e.g.
    /// `ONEGRANT_EMULATOR_TOKEN_WINDOW_SECONDS`, for tests of the token window).
    pub fn start_with(quiet: bool, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let root = repo_root();
        let python = std::env::var_os("ONEGRANT_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join(".venv/bin/python"));
        if !python.exists() {
            bail!(
                "{} not found: run scripts/setup first (it installs the pinned emulator)",
                python.display()
            );
        }
        let mut child = Command::new(&python)
            .arg(root.join("scripts/moto_serial.py"))
            .args(["--host", "127.0.0.1", "--port", "0", "--exit-on-stdin-eof"])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if quiet {
                Stdio::null()
            } else {
                Stdio::inherit()
            })
            .spawn()
            .with_context(|| format!("starting {}", python.display()))?;
        let stdin = child.stdin.take().context("emulator stdin")?;
        let stdout = child.stdout.take().context("emulator stdout")?;

        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let read = reader.read_line(&mut line).map(|_| line);
            // The first line says where it listens; later output is drained so the
            // pipe never fills and blocks the emulator.
            let _ = tx.send(read);
            let _ = std::io::copy(&mut reader.take(u64::MAX), &mut std::io::sink());
        });
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => {
                let _ = child.kill();
                return Err(e).context("reading the emulator's port");
            }
            Err(_) => {
                let _ = child.kill();
                bail!("the emulator did not start within 60 s");
            }
        };
        let port: u16 = match line.trim().strip_prefix("listening on ").map(str::parse) {
            Some(Ok(port)) => port,
            _ => {
                let _ = child.kill();
                bail!("unexpected first line from the emulator: {line:?}");
            }
        };
        Ok(Self {
            child,
            _stdin: stdin,
            endpoint: format!("http://127.0.0.1:{port}"),
        })
    }

    /// The emulator process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The emulator's base URL, for `AWS_ENDPOINT_URL_DYNAMODB`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        // SIGKILL: the data is in memory anyway, and SIGTERM after heavy use can take minutes.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
