//! The `session-key-rotation` Lambda: Secrets Manager invokes it for each step of the
//! session key's scheduled rotation.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    onegrant::events::run(
        "session-key-rotation",
        session_key_rotation::invoke,
        &[onegrant::config::Need::SessionKey],
    )
    .await
}
