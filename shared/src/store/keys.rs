//! Item keys. Ids never contain `#` (see `domain::ids`), so keys parse unambiguously.

use crate::domain::{OpenId, RequestId, TemplateId};

/// The partition of everything one user owns.
pub fn user_pk(openid: &OpenId) -> String {
    format!("USER#{openid}")
}

/// Sort-key prefix of the per-template quota counters.
pub const QUOTA_PREFIX: &str = "QUOTA#";

/// The quota counters of one template.
pub fn quota_sk(template: &TemplateId) -> String {
    format!("{QUOTA_PREFIX}{template}")
}

/// Sort-key prefix of the subscription-result ledger (grants and refusals).
pub const GRANT_PREFIX: &str = "GRANT#";

/// One subscription result: a grant when accepted. Template first, so the grants of
/// one template are one `begins_with` query.
pub fn grant_sk(template: &TemplateId, request_id: &RequestId) -> String {
    format!("{GRANT_PREFIX}{template}#{request_id}")
}
