//! The inbox's refusal of an event, at the bottom of its folder: every step that reads
//! an event says why with it.

/// Why an event cannot become a notification at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("{0}")]
    Shape(String),
}
