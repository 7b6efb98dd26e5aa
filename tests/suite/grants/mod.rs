//! Grant reports and what a user's consent holds: the reports, the taps WeChat's
//! popup confirms, the standing choice of the user's settings, refusals.

mod consent;
mod reports;
mod standing;
mod taps;
