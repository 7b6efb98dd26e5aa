//! The edge's AWS WAF IP set of WeChat's push addresses (`WECHAT_IP_SET`), kept by
//! the `wechat-ips` function: read for its lock token, then replaced when it differs.
//! No WAF SDK: two signed JSON calls (`GetIPSet`, `UpdateIPSet`), like `bus`.

use aws_credential_types::provider::SharedCredentialsProvider;
use serde_json::{Value, json};

use crate::signed::{Endpoint, JsonCallError};

/// Why the IP set was not kept.
#[derive(Debug, thiserror::Error)]
pub enum WafError {
    #[error(
        "not a WAF IP set ARN (arn:<partition>:wafv2:<region>:<account>:<global|regional>/ipset/<name>/<id>)"
    )]
    Arn,
    #[error("AWS WAF's call failed")]
    Call(#[source] JsonCallError),
}

/// What keeping the set did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// It held the list already: nothing written.
    Same,
    /// Replaced with the list.
    Replaced,
}

/// One IP set.
#[derive(Clone, Debug)]
pub struct IpSet {
    waf: Endpoint,
    name: String,
    id: String,
    /// `CLOUDFRONT` (an ARN's `global/`) or `REGIONAL`.
    scope: &'static str,
}

impl IpSet {
    /// The set `arn` names, called in its own region (a CLOUDFRONT set's is us-east-1),
    /// at `endpoint` (an emulator) when given.
    pub fn new(
        arn: &str,
        credentials: SharedCredentialsProvider,
        endpoint: Option<&str>,
    ) -> Result<Self, WafError> {
        let parts: Vec<&str> = arn.splitn(6, ':').collect();
        let [arn_word, _, "wafv2", region, _, resource] = parts[..] else {
            return Err(WafError::Arn);
        };
        if arn_word != "arn" || region.is_empty() {
            return Err(WafError::Arn);
        }
        let [scope, "ipset", name, id] = resource.split('/').collect::<Vec<_>>()[..] else {
            return Err(WafError::Arn);
        };
        let scope = match scope {
            "global" => "CLOUDFRONT",
            "regional" => "REGIONAL",
            _ => return Err(WafError::Arn),
        };
        if name.is_empty() || id.is_empty() {
            return Err(WafError::Arn);
        }
        Ok(Self {
            waf: Endpoint::new("wafv2", region, credentials, endpoint).ok_or(WafError::Arn)?,
            name: name.to_string(),
            id: id.to_string(),
            scope,
        })
    }

    /// Makes the set hold exactly `addresses` (`address/prefix`, one IP version).
    /// Another writer between the read and the write (its lock token changed) makes
    /// this read it again, once.
    pub async fn keep(&self, addresses: &[String]) -> Result<Kept, WafError> {
        let mut want: Vec<&str> = addresses.iter().map(String::as_str).collect();
        want.sort_unstable();
        let mut tries = 0;
        loop {
            tries += 1;
            let got = self
                .call(
                    "GetIPSet",
                    json!({"Name": self.name, "Scope": self.scope, "Id": self.id}),
                )
                .await?;
            let mut held: Vec<&str> = got["IPSet"]["Addresses"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            held.sort_unstable();
            if held == want {
                return Ok(Kept::Same);
            }
            let lock = got["LockToken"].as_str().unwrap_or_default();
            match self
                .call(
                    "UpdateIPSet",
                    json!({"Name": self.name, "Scope": self.scope, "Id": self.id,
                           "Addresses": want, "LockToken": lock}),
                )
                .await
            {
                Ok(_) => return Ok(Kept::Replaced),
                Err(WafError::Call(JsonCallError::Refused { kind, .. }))
                    if kind == "WAFOptimisticLockException" && tries < 2 => {}
                Err(e) => return Err(e),
            }
        }
    }

    async fn call(&self, action: &str, body: Value) -> Result<Value, WafError> {
        self.waf
            .call_json(&format!("AWSWAF_20190729.{action}"), &body)
            .await
            .map_err(WafError::Call)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials() -> SharedCredentialsProvider {
        SharedCredentialsProvider::new(aws_credential_types::Credentials::new(
            "a", "b", None, None, "test",
        ))
    }

    #[test]
    fn an_ip_sets_arn_names_its_region_scope_name_and_id() {
        let set = IpSet::new(
            "arn:aws:wafv2:us-east-1:123456789012:global/ipset/wechat/abc-123",
            credentials(),
            None,
        )
        .expect("an IP set");
        assert_eq!(
            (set.scope, set.name.as_str(), set.id.as_str()),
            ("CLOUDFRONT", "wechat", "abc-123")
        );
        assert_eq!(set.waf.url, "https://wafv2.us-east-1.amazonaws.com");
        let china = IpSet::new(
            "arn:aws-cn:wafv2:cn-north-1:123456789012:regional/ipset/wechat/abc",
            credentials(),
            None,
        )
        .expect("an IP set");
        assert_eq!(china.scope, "REGIONAL");
        assert_eq!(china.waf.url, "https://wafv2.cn-north-1.amazonaws.com.cn");
        for bad in [
            "",
            "arn:aws:wafv2:us-east-1:1:global/webacl/x/y",
            "arn:aws:wafv2:us-east-1:1:global/ipset/x",
            "arn:aws:wafv2:us-east-1:1:local/ipset/x/y",
            "arn:aws:s3:us-east-1:1:global/ipset/x/y",
            "arn:aws:wafv2::1:global/ipset/x/y",
            "arn:aws:wafv2:us-east-1:1:global/ipset//y",
        ] {
            assert!(
                matches!(IpSet::new(bad, credentials(), None), Err(WafError::Arn)),
                "{bad}"
            );
        }
    }
}
