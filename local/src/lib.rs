//! # onegrant-local
//!
//! Everything that runs onegrant on one machine without AWS or WeChat, used by the
//! `onegrant-local` binary (the whole stack), the `wechat-standin` binary and the tests.
//!
//! ## Layout
//! - [`emulator`]: starts the pinned DynamoDB emulator (moto, one request at a time).
//! - [`template`]: reads `template.yaml` — table definition, routes, functions.
//! - [`standin`]: the WeChat stand-in server and its control API.
//! - [`api`]: the local HTTP API and Lambda Invoke API over the functions' handlers.
//! - [`stack`]: wires them together with local defaults.

pub mod api;
pub mod contract;
pub mod emulator;
pub mod stack;
pub mod standin;
pub mod template;
