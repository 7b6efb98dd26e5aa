//! # onegrant-tests
//!
//! Shared helpers for the integration suite (`suite/`) and the benches: every test gets
//! fresh resources from [`spawn_app`] — its own table in the real emulator (created from
//! `template.yaml`, deleted on drop), its own WeChat stand-in and its own HTTP API, both
//! on port 0 and reached over real HTTP.

mod support;

pub use support::app::{
    Answer, ORDER, TestApp, WATER, axum_router, spawn_app, spawn_app_isolated, spawn_app_with,
    spawn_faulty_app, spawn_faulty_pushing_app, spawn_pushing_app, spawn_pushing_app_with,
};
pub use support::containers::{order_numbers, summary_of, wait_for_exit};
pub use support::invariants::{
    assert_ledger_agrees_with_counters, assert_no_plan_stuck_sending, assert_plans_consistent,
    attr_n, attr_s, quota,
};
pub use support::logs::LogCapture;
pub use support::publishers::{Received, Receiver, SHOP, Signer, order_detail};
pub use support::round_trips::{ItemWrite, RoundTrips, item_size};
pub use support::table::{Leased, TestTable, emulator_call, emulator_endpoint};
pub use support::users::{User, assert_rate_limited, plan_state};
pub use support::{faults, inbox, openapi, wechat_push};
