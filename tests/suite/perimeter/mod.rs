//! The perimeter: sessions, the edge's origin check, least-privilege roles, fenced
//! secrets.

mod edge;
mod iam;
mod secrets;
mod session;
