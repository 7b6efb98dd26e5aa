//! The publisher API's request signature, and the same scheme on onegrant's webhook
//! posts (publisher `onegrant`, signed with the receiving publisher's key):
//!
//! ```text
//! X-Onegrant-Publisher: <source>
//! X-Onegrant-Timestamp: <unix seconds>
//! X-Onegrant-Signature: v1=<hex HMAC-SHA256 of "<timestamp>.<METHOD>.<path and query>.<raw body>">
//! ```
//!
//! A request is refused (401, nothing read or stored) without the three headers, from
//! an unknown publisher, with a timestamp more than [`WINDOW_SECONDS`] away from the
//! server's clock, or with a signature no key of the publisher makes; signatures are
//! compared in constant time.

use chrono::{DateTime, Utc};
use hmac::{Hmac, KeyInit, Mac};
// (hmac 0.13 pairs with sha2 0.11.)
use sha2_jwt::Sha256;

use super::{Key, Publisher, Publishers};

pub const PUBLISHER_HEADER: &str = "x-onegrant-publisher";
pub const TIMESTAMP_HEADER: &str = "x-onegrant-timestamp";
pub const SIGNATURE_HEADER: &str = "x-onegrant-signature";

/// How far a request's timestamp may be from the server's clock, either way.
pub const WINDOW_SECONDS: i64 = 300;

pub use super::ONEGRANT;

/// The signature's version prefix.
const VERSION: &str = "v1=";

/// What a request says about who signed it: the three headers, as sent.
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    pub publisher: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// What the signature covers: the request's method, its target ([`target`]: the path
/// percent-decoded, then the query string as sent), and its body's raw bytes.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub target: &'a str,
    pub body: &'a [u8],
}

/// Why a signed request is refused; each is a 401 with the same body, and a metric by
/// this name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A header missing or not of its form.
    Missing,
    /// No publisher of that name.
    Unknown,
    /// The timestamp is more than [`WINDOW_SECONDS`] away.
    Stale,
    /// No key of the publisher makes the signature.
    Signature,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Unknown => "unknown_publisher",
            Self::Stale => "stale",
            Self::Signature => "signature",
        }
    }
}

/// The signed form of a request's path and query: the path percent-decoded (so
/// `/publisher/v1/notifications/订单 1:已发货`, however a client or API Gateway encoded
/// it), then `?` and the query string exactly as sent, when there is one.
pub fn target(path: &str, query: Option<&str>) -> String {
    let path = decoded(path);
    match query.filter(|q| !q.is_empty()) {
        Some(query) => format!("{path}?{query}"),
        None => path,
    }
}

/// `text` percent-decoded (invalid UTF-8 replaced).
pub fn decoded(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

fn mac(key: &Key, timestamp: &str, request: &Request<'_>) -> Option<Hmac<Sha256>> {
    // (HMAC takes a key of any length: never `None`.)
    let mut mac = Hmac::<Sha256>::new_from_slice(key.bytes()).ok()?;
    for part in [
        timestamp.as_bytes(),
        b".",
        request.method.as_bytes(),
        b".",
        request.target.as_bytes(),
        b".",
    ] {
        mac.update(part);
    }
    mac.update(request.body);
    Some(mac)
}

/// The `X-Onegrant-Signature` value of `request` signed by `key` at `timestamp`.
pub fn sign(key: &Key, timestamp: i64, request: &Request<'_>) -> String {
    let digest = mac(key, &timestamp.to_string(), request)
        .map(|m| hex::encode(m.finalize().into_bytes()))
        .unwrap_or_default();
    format!("{VERSION}{digest}")
}

/// The publisher that signed `request`, or why it is refused, at `now`.
pub fn verify<'p>(
    publishers: &'p Publishers,
    signed: Signed<'_>,
    request: &Request<'_>,
    now: DateTime<Utc>,
) -> Result<&'p Publisher, Refusal> {
    let (Some(source), Some(timestamp), Some(signature)) =
        (signed.publisher, signed.timestamp, signed.signature)
    else {
        return Err(Refusal::Missing);
    };
    let seconds: i64 = timestamp
        .parse()
        .ok()
        .filter(|_| timestamp.bytes().all(|b| b.is_ascii_digit()) && timestamp.len() <= 12)
        .ok_or(Refusal::Missing)?;
    let digest = signature
        .strip_prefix(VERSION)
        .and_then(|h| hex::decode(h).ok())
        .filter(|d| d.len() == 32)
        .ok_or(Refusal::Missing)?;
    let publisher = publishers.get(source).ok_or(Refusal::Unknown)?;
    if (now.timestamp() - seconds).abs() > WINDOW_SECONDS {
        return Err(Refusal::Stale);
    }
    // Every key is tried, whichever matches: the time taken does not say which.
    let matched = publisher
        .keys()
        .iter()
        .map(|key| mac(key, timestamp, request).is_some_and(|m| m.verify_slice(&digest).is_ok()))
        .fold(false, |any, ok| any | ok);
    if matched {
        Ok(publisher)
    } else {
        Err(Refusal::Signature)
    }
}
