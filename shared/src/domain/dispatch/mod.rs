//! Dispatch: claiming a due item, its gates, the daily cap, priority among pushes due
//! together, the delivery's guards and the sweep. What a send's answer means is
//! [`settle`](crate::domain::settle), below this and the features it moves.

pub mod cap;
pub mod claim;
pub mod delivery;
pub mod priority;
pub mod sweep;
