//! The integration suite: one binary, run by `scripts/test`.
//!
//! Every test gets its own table in the real DynamoDB emulator and its own WeChat
//! stand-in, reached over real HTTP (see `onegrant_tests::spawn_app`).

mod audit;
mod callback;
mod dispatch;
mod erasure;
mod grants;
mod inbox;
mod limits;
mod perimeter;
mod platform;
mod publishers;
mod reminders;
