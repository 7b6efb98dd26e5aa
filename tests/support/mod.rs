//! The suite's helpers, by topic.

pub mod app;
pub mod containers;
pub mod invariants;
pub mod logs;
pub mod publishers;
pub mod round_trips;
pub mod table;
pub mod users;
