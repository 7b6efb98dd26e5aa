//! A publisher's backend outside Rust: `examples/publisher.py` (Python's standard library
//! alone) signs its requests and publishes, replays, is refused, reads a status that
//! turns `sent` after the dispatcher's tick (through the Invoke API), and cancels, through a real
//! `onegrant-local`.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn a_python_publisher_publishes_reads_and_cancels_through_the_local_stack() {
    let mut started = common::start_local(&[("ONEGRANT_LOCAL_TICK_SECONDS", "0")]);
    assert!(
        started
            .printed
            .iter()
            .any(|l| l.contains("com.example.shop, key local-publisher-secret")),
        "the local stack prints its publisher: {:?}",
        started.printed
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new("python3")
        .current_dir(&root)
        .arg("examples/publisher.py")
        .arg("--invoke")
        .arg(format!("http://127.0.0.1:{}", started.invoke))
        .arg("--api")
        .arg(format!("http://127.0.0.1:{}", started.api))
        .arg("--standin")
        .arg(format!("http://127.0.0.1:{}", started.standin))
        .output()
        .expect("python3 runs");
    let _ = started.child.kill();
    let _ = started.child.wait();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(printed.contains("publisher.py: ok"), "{printed}");
}
