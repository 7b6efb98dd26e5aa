//! The suite's helpers, by topic.

pub mod app;
pub mod containers;
pub mod faults;
pub mod inbox;
pub mod invariants;
pub mod logs;
pub mod openapi;
pub mod publishers;
pub mod round_trips;
pub mod table;
pub mod users;
pub mod wechat_push;
