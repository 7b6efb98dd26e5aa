//! What the suite and the stack stand on: the contract, the emulator, the WeChat
//! stand-in, the alarms' metrics, the logs.

mod contract;
mod emulator;
mod logs;
mod operations;
mod standin;
