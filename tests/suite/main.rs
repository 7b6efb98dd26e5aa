//! The integration suite: one binary, run by `scripts/test`.
//!
//! Every test gets its own table in the real DynamoDB emulator and its own WeChat
//! stand-in, reached over real HTTP (see `onegrant_tests::spawn_app`).

mod audit;
mod callback;
mod callback_closed;
mod cap;
mod consent;
mod contract;
mod dispatcher;
mod edge;
mod emulator;
mod erasure;
mod expiry;
mod faults;
mod grants;
mod hostile_events;
mod iam;
mod inbox;
mod inputs;
mod limits;
mod logs;
mod malformed;
mod operations;
mod pending;
mod preferences;
mod priority;
mod priority_together;
mod publication;
mod publisher_outcomes;
mod publishers;
mod refill;
mod reminders;
mod scheduled;
mod secrets;
mod sent_event;
mod session;
mod standin;
mod standing;
mod sweep;
mod taps;
mod wechat_ips;
mod write_limits;
