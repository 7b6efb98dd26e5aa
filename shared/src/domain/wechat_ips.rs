//! WeChat's door: the addresses WeChat pushes from (`getcallbackip`'s `ip_list`, kept
//! fresh by the `wechat-ips` function), and whether a request's address is one of them.
//!
//! The list is WeChat's, read over TLS with the access token; still, it is checked
//! before it replaces the one in use: every entry an address or a network (IPv4 no
//! wider than /16, IPv6 no wider than /32 — a list that opened the door to a large part
//! of the internet is refused, not applied), at least one, at most [`MAX_ENTRIES`].
//! Networks are kept as WAF takes them: the network's own address and its prefix
//! (`101.226.103.5/25` is `101.226.103.0/25`; an address alone is `/32` or `/128`).

use std::fmt;
use std::net::IpAddr;

/// Most entries taken (WeChat's list has a few hundred; a WAF IP set holds 10,000).
pub const MAX_ENTRIES: usize = 5_000;
/// The widest IPv4 network taken.
pub const WIDEST_V4: u8 = 16;
/// The widest IPv6 network taken.
pub const WIDEST_V6: u8 = 32;
/// Most IPv4 addresses a list may open in all (WeChat's come to a few thousand): many
/// /16s are refused together as one would be alone.
pub const MOST_V4_ADDRESSES: u64 = 1 << 20;

/// Why a list was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WechatIpsError {
    #[error("the list is empty")]
    Empty,
    #[error("the list has {0} entries, more than {MAX_ENTRIES}")]
    TooMany(usize),
    #[error("{0:?} is not an address or a network")]
    Entry(String),
    #[error("{0:?} is wider than /{WIDEST_V4} (IPv4) or /{WIDEST_V6} (IPv6)")]
    TooWide(String),
    #[error("the list opens {0} IPv4 addresses, more than {MOST_V4_ADDRESSES}")]
    TooManyAddresses(u64),
}

/// One network: its own address (host bits zero) and its prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Network {
    address: IpAddr,
    prefix: u8,
}

impl Network {
    /// `a.b.c.d`, `a.b.c.d/n`, or the IPv6 forms.
    pub fn parse(entry: &str) -> Result<Self, WechatIpsError> {
        let bad = || WechatIpsError::Entry(entry.to_string());
        let text = entry.trim();
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                (a, Some(p.parse::<u8>().map_err(|_| bad())?))
            }
            Some(_) => return Err(bad()),
            None => (text, None),
        };
        let address: IpAddr = address.parse().map_err(|_| bad())?;
        let (bits, widest) = match address {
            IpAddr::V4(_) => (32, WIDEST_V4),
            IpAddr::V6(_) => (128, WIDEST_V6),
        };
        let prefix = prefix.unwrap_or(bits);
        if prefix > bits {
            return Err(bad());
        }
        if prefix < widest {
            return Err(WechatIpsError::TooWide(entry.to_string()));
        }
        Ok(Self {
            address: masked(address, prefix),
            prefix,
        })
    }

    pub fn contains(&self, address: IpAddr) -> bool {
        let same_family = matches!(
            (self.address, address),
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_))
        );
        same_family && masked(address, self.prefix) == self.address
    }

    pub fn is_v4(&self) -> bool {
        self.address.is_ipv4()
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// `address` with all but its first `prefix` bits zero.
fn masked(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & mask).into())
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

/// WeChat's addresses, checked, sorted, each once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WechatIps {
    networks: Vec<Network>,
}

impl WechatIps {
    /// The list as WeChat (or a stored item) gives it.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, WechatIpsError> {
        if entries.is_empty() {
            return Err(WechatIpsError::Empty);
        }
        if entries.len() > MAX_ENTRIES {
            return Err(WechatIpsError::TooMany(entries.len()));
        }
        let mut networks = entries
            .iter()
            .map(|e| Network::parse(e.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        networks.sort();
        networks.dedup();
        let v4: u64 = networks
            .iter()
            .filter(|n| n.is_v4())
            .map(|n| 1u64 << (32 - u32::from(n.prefix)))
            .sum();
        if v4 > MOST_V4_ADDRESSES {
            return Err(WechatIpsError::TooManyAddresses(v4));
        }
        Ok(Self { networks })
    }

    /// Whether a request from `address` comes from WeChat (an IPv4 address written as
    /// IPv6, `::ffff:a.b.c.d`, is its IPv4 address).
    pub fn admits(&self, address: IpAddr) -> bool {
        let address = match address {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
            v4 => v4,
        };
        self.networks.iter().any(|n| n.contains(address))
    }

    /// Every network, as `address/prefix`.
    pub fn entries(&self) -> Vec<String> {
        self.networks.iter().map(Network::to_string).collect()
    }

    /// The IPv4 networks, as `address/prefix` (what an IPv4 WAF IP set holds).
    pub fn v4_entries(&self) -> Vec<String> {
        self.networks
            .iter()
            .filter(|n| n.is_v4())
            .map(Network::to_string)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn addresses_and_networks_are_taken_as_waf_writes_them() {
        let list = WechatIps::parse(&[
            "101.226.103.5/25",
            "81.69.101.200",
            "2402:4e00:1::/48",
            " 81.69.101.200 ",
        ])
        .expect("taken");
        assert_eq!(
            list.entries(),
            ["81.69.101.200/32", "101.226.103.0/25", "2402:4e00:1::/48"]
        );
        assert_eq!(list.v4_entries(), ["81.69.101.200/32", "101.226.103.0/25"]);
    }

    #[test]
    fn a_request_is_admitted_only_from_an_address_in_the_list() {
        let list = WechatIps::parse(&["101.226.103.0/25", "81.69.101.200", "2402:4e00:1::/48"])
            .expect("taken");
        for (address, admitted) in [
            ("101.226.103.0", true),
            ("101.226.103.127", true),
            ("101.226.103.128", false),
            ("101.226.102.255", false),
            ("81.69.101.200", true),
            ("81.69.101.201", false),
            ("::ffff:81.69.101.200", true),
            ("::ffff:81.69.101.201", false),
            ("2402:4e00:1:ffff::1", true),
            ("2402:4e00:2::1", false),
            ("127.0.0.1", false),
        ] {
            assert_eq!(list.admits(ip(address)), admitted, "{address}");
        }
    }

    #[test]
    fn a_list_that_is_empty_malformed_or_opens_too_much_is_refused() {
        let none: [&str; 0] = [];
        assert_eq!(WechatIps::parse(&none), Err(WechatIpsError::Empty));
        let many: Vec<String> = (0..=MAX_ENTRIES)
            .map(|i| format!("10.{}.{}.1", i / 256, i % 256))
            .collect();
        assert_eq!(
            WechatIps::parse(&many),
            Err(WechatIpsError::TooMany(MAX_ENTRIES + 1))
        );
        for bad in [
            "",
            "1.2.3",
            "1.2.3.4/",
            "1.2.3.4/33",
            "1.2.3.4/x",
            "1.2.3.4/-1",
            "host.example",
            "::/129",
            "1.2.3.4/24/1",
        ] {
            assert_eq!(
                WechatIps::parse(&["1.1.1.1", bad]),
                Err(WechatIpsError::Entry(bad.to_string())),
                "{bad:?}"
            );
        }
        for wide in [
            "0.0.0.0/0",
            "10.0.0.0/8",
            "101.226.0.0/15",
            "::/0",
            "2402::/16",
        ] {
            assert_eq!(
                WechatIps::parse(&[wide]),
                Err(WechatIpsError::TooWide(wide.to_string())),
                "{wide}"
            );
        }
        assert!(WechatIps::parse(&["101.226.0.0/16", "2402:4e00::/32"]).is_ok());
        // Seventeen /16s open more than a /12: refused together; sixteen are taken.
        let many_wide: Vec<String> = (0..17).map(|i| format!("10.{i}.0.0/16")).collect();
        assert_eq!(
            WechatIps::parse(&many_wide),
            Err(WechatIpsError::TooManyAddresses(17 << 16))
        );
        assert!(WechatIps::parse(&many_wide[..16]).is_ok());
    }
}
