//! What a client cannot talk its way past: rate limits on every route, and bad input
//! refused with its documented error, nothing stored.

mod inputs;
mod malformed;
mod rates;
mod writes;
