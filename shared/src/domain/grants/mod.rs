//! Subscription results, grants and quota counters.
//!
//! One `accept` in `wx.requestSubscribeMessage` buys exactly one later message: a grant.
//! A grant moves `available → reserved → consumed`, may return `reserved → available`
//! (only by the delivery that reserved it) and ends `invalid` on disable, refusal or an
//! uncertain send. Per (user, template) the counters keep invariant I2:
//! `accepted = available + reserved + consumed + invalid`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::domain::consent::Refusal;
use crate::domain::consent::standing::Standing;
use crate::domain::ids::{IdError, RequestId, TemplateId};
use crate::domain::template::Templates;

pub mod open;
pub mod report;

/// The most templates one `wx.requestSubscribeMessage` call can carry.
pub const MAX_TEMPLATES_PER_REPORT: usize = 5;

/// What the user chose for one template in the subscription popup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubscribeResult {
    #[serde(rename = "accept")]
    Accept,
    #[serde(rename = "acceptWithAudio")]
    AcceptWithAudio,
    #[serde(rename = "acceptWithAlert")]
    AcceptWithAlert,
    #[serde(rename = "reject")]
    Reject,
    #[serde(rename = "ban")]
    Ban,
    #[serde(rename = "filter")]
    Filter,
}

impl SubscribeResult {
    /// The refusal the result makes, if any.
    pub fn refusal(self) -> Option<Refusal> {
        match self {
            Self::Reject => Some(Refusal::Reject),
            Self::Ban => Some(Refusal::Ban),
            Self::Accept | Self::AcceptWithAudio | Self::AcceptWithAlert | Self::Filter => None,
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "accept" => Self::Accept,
            "acceptWithAudio" => Self::AcceptWithAudio,
            "acceptWithAlert" => Self::AcceptWithAlert,
            "reject" => Self::Reject,
            "ban" => Self::Ban,
            "filter" => Self::Filter,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accept => "accept",
            Self::AcceptWithAudio => "acceptWithAudio",
            Self::AcceptWithAlert => "acceptWithAlert",
            Self::Reject => "reject",
            Self::Ban => "ban",
            Self::Filter => "filter",
        }
    }

    /// Whether this result buys one send.
    pub fn grants(self) -> bool {
        match self {
            Self::Accept | Self::AcceptWithAudio | Self::AcceptWithAlert => true,
            Self::Reject | Self::Ban | Self::Filter => false,
        }
    }

    /// Whether this result is the user refusing the template (pauses plans that need it).
    pub fn refuses(self) -> bool {
        match self {
            Self::Reject | Self::Ban => true,
            Self::Accept | Self::AcceptWithAudio | Self::AcceptWithAlert | Self::Filter => false,
        }
    }
}

/// The lifecycle state of one grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantState {
    Available,
    Reserved,
    Consumed,
    Invalid,
}

impl GrantState {
    /// The state as the ledger stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Available => "available",
            Self::Reserved => "reserved",
            Self::Consumed => "consumed",
            Self::Invalid => "invalid",
        }
    }

    /// A state as the ledger stores it, read back.
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Available,
            Self::Reserved,
            Self::Consumed,
            Self::Invalid,
        ]
        .into_iter()
        .find(|state| state.as_str() == name)
    }
}

/// The status shown for one entry of a grant report: the grant's state, or
/// `not_granted` when the user did not accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantStatus {
    Available,
    Reserved,
    Consumed,
    Invalid,
    NotGranted,
}

impl From<Option<GrantState>> for GrantStatus {
    fn from(state: Option<GrantState>) -> Self {
        match state {
            Some(GrantState::Available) => Self::Available,
            Some(GrantState::Reserved) => Self::Reserved,
            Some(GrantState::Consumed) => Self::Consumed,
            Some(GrantState::Invalid) => Self::Invalid,
            None => Self::NotGranted,
        }
    }
}

/// The stored counters of one (user, template). Missing counters read as zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QuotaCounters {
    pub accepted: u64,
    pub available: u64,
    pub reserved: u64,
    pub consumed: u64,
    pub invalid: u64,
    /// Grants whose tap WeChat's popup event confirmed (a count beside the others,
    /// not a state).
    pub confirmed: u64,
}

impl QuotaCounters {
    /// Invariant I2.
    pub fn conserved(&self) -> bool {
        self.accepted == self.available + self.reserved + self.consumed + self.invalid
    }

    /// The counters once every unconsumed grant is void (a plan turned off).
    pub fn all_voided(self) -> Self {
        Self {
            invalid: self.invalid + self.available + self.reserved,
            available: 0,
            reserved: 0,
            ..self
        }
    }
}

/// One template's quota as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Quota {
    pub template_id: TemplateId,
    pub title: String,
    pub available: u64,
    pub used: u64,
    pub accepted: u64,
    /// How many of the accepted grants WeChat's popup events confirmed.
    pub confirmed: u64,
    pub needs_grant: bool,
    /// The standing choice the user's settings keep for the template (`accept`,
    /// `reject`, `ban`, `main_switch_off`), absent while none is known. A refusing one
    /// makes `needs_grant` false: asking is pointless until the setting changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub standing: Option<&'static str>,
}

impl Quota {
    /// Every configured template's quota, in template order; templates without stored
    /// counters show zeros.
    pub fn for_templates(
        templates: &Templates,
        counters: &BTreeMap<TemplateId, QuotaCounters>,
        standings: &BTreeMap<TemplateId, Standing>,
    ) -> Vec<Quota> {
        templates
            .iter()
            .map(|t| {
                let c = counters.get(&t.id).copied().unwrap_or_default();
                let standing = standings.get(&t.id).copied();
                Quota {
                    template_id: t.id.clone(),
                    title: t.title.clone(),
                    available: c.available,
                    used: c.consumed,
                    accepted: c.accepted,
                    confirmed: c.confirmed,
                    needs_grant: c.available == 0 && !standing.is_some_and(Standing::refuses),
                    standing: standing.map(Standing::as_str),
                }
            })
            .collect()
    }
}

/// Why a grant report is refused. Each variant is a distinct client mistake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("{0}")]
    Shape(String),
    #[error(transparent)]
    RequestId(IdError),
    #[error("results has no templates")]
    NoTemplates,
    #[error("results has {0} templates; at most {MAX_TEMPLATES_PER_REPORT} are allowed")]
    TooManyTemplates(usize),
    #[error("template {0:?} is not configured")]
    UnknownTemplate(String),
    #[error(
        "result {value:?} for template {template:?} is not one of accept, acceptWithAudio, acceptWithAlert, reject, ban, filter"
    )]
    InvalidResult { template: String, value: String },
}

/// A validated grant report: `POST /v1/grants`, or the grant a check-in carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantReport {
    pub request_id: RequestId,
    /// Per template, in template order.
    pub results: BTreeMap<TemplateId, SubscribeResult>,
}

impl GrantReport {
    /// Validates a decoded JSON body against the configured templates.
    /// `results` is `wx.requestSubscribeMessage`'s success object; its `errMsg` is ignored.
    pub fn from_json(body: &serde_json::Value, templates: &Templates) -> Result<Self, ReportError> {
        let object = body
            .as_object()
            .ok_or_else(|| ReportError::Shape("the body must be a JSON object".into()))?;
        let request_id = match object.get("request_id") {
            Some(serde_json::Value::String(s)) => {
                RequestId::parse(s.as_str()).map_err(ReportError::RequestId)?
            }
            Some(_) => return Err(ReportError::Shape("request_id must be a string".into())),
            None => return Err(ReportError::Shape("request_id is required".into())),
        };
        let raw = match object.get("results") {
            Some(serde_json::Value::Object(map)) => map,
            Some(_) => return Err(ReportError::Shape("results must be an object".into())),
            None => return Err(ReportError::Shape("results is required".into())),
        };
        let entries: Vec<_> = raw.iter().filter(|(k, _)| k.as_str() != "errMsg").collect();
        if entries.is_empty() {
            return Err(ReportError::NoTemplates);
        }
        if entries.len() > MAX_TEMPLATES_PER_REPORT {
            return Err(ReportError::TooManyTemplates(entries.len()));
        }
        let mut results = BTreeMap::new();
        for (key, value) in entries {
            let value = value
                .as_str()
                .ok_or_else(|| ReportError::Shape(format!("results.{key} must be a string")))?;
            let template = templates
                .get(key)
                .ok_or_else(|| ReportError::UnknownTemplate(key.clone()))?;
            let result =
                SubscribeResult::parse(value).ok_or_else(|| ReportError::InvalidResult {
                    template: key.clone(),
                    value: value.to_string(),
                })?;
            results.insert(template.id.clone(), result);
        }
        Ok(Self {
            request_id,
            results,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn templates() -> Templates {
        crate::domain::template::test_templates()
    }

    #[test]
    fn a_report_ignores_err_msg_and_orders_templates() {
        let body = json!({"request_id": "wr_1", "results": {"errMsg": "requestSubscribeMessage:ok", "B": "reject", "A": "accept"}});
        let report = GrantReport::from_json(&body, &templates()).expect("valid report");
        let got: Vec<_> = report
            .results
            .iter()
            .map(|(t, r)| (t.as_str(), *r))
            .collect();
        assert_eq!(
            got,
            vec![
                ("A", SubscribeResult::Accept),
                ("B", SubscribeResult::Reject)
            ]
        );
    }

    #[test]
    fn bad_reports_get_their_own_error() {
        let t = templates();
        let cases = [
            (json!([1]), "Shape"),
            (json!({"results": {"A": "accept"}}), "Shape"),
            (
                json!({"request_id": 5, "results": {"A": "accept"}}),
                "Shape",
            ),
            (
                json!({"request_id": "bad id", "results": {"A": "accept"}}),
                "RequestId",
            ),
            (json!({"request_id": "r", "results": []}), "Shape"),
            (
                json!({"request_id": "r", "results": {"errMsg": "x"}}),
                "NoTemplates",
            ),
            (json!({"request_id": "r", "results": {"A": 1}}), "Shape"),
            (
                json!({"request_id": "r", "results": {"C": "accept"}}),
                "UnknownTemplate",
            ),
            (
                json!({"request_id": "r", "results": {"A": "yes"}}),
                "InvalidResult",
            ),
            (
                json!({"request_id": "r", "results": {"A":"accept","B":"accept","C":"accept","D":"accept","E":"accept","F":"accept"}}),
                "TooManyTemplates",
            ),
        ];
        for (body, want) in cases {
            let err = GrantReport::from_json(&body, &t).expect_err("must be refused");
            let got = format!("{err:?}");
            assert!(got.starts_with(want), "{body}: expected {want}, got {got}");
        }
    }

    #[test]
    fn quotas_show_every_template_and_need_a_grant_at_zero() {
        let mut counters = BTreeMap::new();
        let a = TemplateId::parse("A").expect("id");
        counters.insert(
            a,
            QuotaCounters {
                accepted: 3,
                available: 1,
                reserved: 0,
                consumed: 2,
                invalid: 0,
                confirmed: 0,
            },
        );
        let quotas = Quota::for_templates(&templates(), &counters, &BTreeMap::new());
        assert_eq!(quotas.len(), 2);
        assert_eq!(
            (
                quotas[0].available,
                quotas[0].used,
                quotas[0].accepted,
                quotas[0].needs_grant
            ),
            (1, 2, 3, false)
        );
        assert_eq!((quotas[1].available, quotas[1].needs_grant), (0, true));
    }
}
