//! CIDR allow-lists (`server.allow`, `admin.allow`): which peer addresses
//! may use a port or the admin API.

use std::net::IpAddr;

/// One network, `addr/prefix` (a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `10.0.0.0/8`, `fd00::/8` or a bare address.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let net: IpAddr = addr.parse().map_err(|_| {
            format!("{s:?} is not an address or CIDR such as 10.0.0.0/8 or fd00::/8")
        })?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Self { net, prefix })
    }

    /// Whether `ip` is in this network (an IPv4-mapped IPv6 address counts
    /// as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// An allow-list; empty allows everyone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(pub Vec<Cidr>);

impl AllowList {
    /// Parses every entry; the error names the entry.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        entries
            .iter()
            .map(|e| Cidr::parse(e))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether `ip` may connect: the list is empty or names its network.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.0.is_empty() || self.0.iter().any(|c| c.contains(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_contain_their_addresses_only() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains(ip("10.1.255.3")));
        assert!(!c.contains(ip("10.2.0.1")));
        assert!(c.contains(ip("::ffff:10.1.0.9")), "IPv4-mapped");
        let c = Cidr::parse("fd00::/8").unwrap();
        assert!(c.contains(ip("fd12::1")) && !c.contains(ip("fe80::1")));
        assert!(!c.contains(ip("10.1.0.1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("192.0.2.1")));
        assert!(Cidr::parse("127.0.0.1").unwrap().contains(ip("127.0.0.1")));
        assert!(!Cidr::parse("127.0.0.1").unwrap().contains(ip("127.0.0.2")));
        assert!(Cidr::parse("::1").unwrap().contains(ip("::1")));
        for bad in ["10.0.0.0/33", "::/129", "nope", "10.0.0.0/x"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        assert!(AllowList::default().allows(ip("192.0.2.1")));
    }
}
