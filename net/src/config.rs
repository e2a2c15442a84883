//! Addresses from the kernel command line: Linux's `ip=` parameter of `Documentation/admin-guide/nfs/nfsroot.rst` (`net/ipv4/ipconfig.c`), plus a shorter form that names several links at once.
//!
//! Two forms of the value, and `ip=` may be given more than once:
//!
//! * `ip=[DEV:]ADDR/LEN[,[DEV:]ADDR/LEN...]`: an address with its prefix
//!   length on link `DEV` (`ip=ib0:10.0.0.1/24,eth0:192.168.1.5/24`);
//! * Linux's own, `ip=CLIENT:SERVER:GATEWAY:NETMASK:HOSTNAME:DEV:AUTOCONF`
//!   with fields left empty as Linux allows
//!   (`ip=10.0.0.3::10.0.0.254:255.255.255.0::ib0:off`): the client address
//!   and netmask on `DEV`, and a default route through `GATEWAY`.
//!
//! A link named nowhere is the first one other than `lo` to appear, as
//! Linux's ipconfig takes the first device that comes up. Leaves out: DHCP,
//! BOOTP and RARP (`AUTOCONF` must be `off`, `none` or empty), the server,
//! host name and DNS fields (read, not used).

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use alloc::{format, vec};

use smoltcp::wire::{Ipv4Address, Ipv4Cidr};

/// One address to give a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpConfig {
    /// The link's name; `None`: the first link other than `lo`.
    pub dev: Option<String>,
    /// The address and prefix length.
    pub addr: Ipv4Cidr,
    /// A default route through this gateway.
    pub gateway: Option<Ipv4Address>,
}

fn addr(s: &str) -> Result<Ipv4Address, String> {
    s.parse()
        .map_err(|_| format!("'{s}' is not an IPv4 address"))
}

/// `ADDR/LEN` (or a bare `ADDR`: /32), as `ip addr add` takes it.
pub fn parse_cidr(s: &str) -> Result<Ipv4Cidr, String> {
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => {
            let len: u8 = l
                .parse()
                .ok()
                .filter(|&l| l <= 32)
                .ok_or_else(|| format!("'{l}' is not a prefix length (0 to 32)"))?;
            (a, len)
        }
        None => (s, 32),
    };
    Ok(Ipv4Cidr::new(addr(a)?, len))
}

/// The value of one `ip=` word.
pub fn parse(value: &str) -> Result<Vec<IpConfig>, String> {
    if value.is_empty() {
        return Err("ip=: empty value".to_string());
    }
    if value.contains('/') {
        return value
            .split(',')
            .map(|item| {
                let (dev, a) = match item.split_once(':') {
                    Some((d, a)) if !d.is_empty() => (Some(d.to_string()), a),
                    Some((_, a)) => (None, a),
                    None => (None, item),
                };
                Ok(IpConfig {
                    dev,
                    addr: parse_cidr(a).map_err(|e| format!("ip=: {e}"))?,
                    gateway: None,
                })
            })
            .collect();
    }
    // Linux's colon form.
    let f: Vec<&str> = value.split(':').collect();
    let field = |i: usize| f.get(i).copied().unwrap_or("");
    if !matches!(field(6), "" | "off" | "none") {
        return Err(format!(
            "ip=: autoconfiguration '{}' is not supported (only static addresses: 'off')",
            field(6)
        ));
    }
    let client = addr(field(0)).map_err(|e| format!("ip=: client address: {e}"))?;
    let len = match field(3) {
        "" => 24,
        m => {
            let mask = addr(m).map_err(|e| format!("ip=: netmask: {e}"))?;
            Ipv4Cidr::from_netmask(client, mask)
                .map_err(|_| format!("ip=: '{m}' is not a netmask"))?
                .prefix_len()
        }
    };
    let gateway = match field(2) {
        "" => None,
        g => Some(addr(g).map_err(|e| format!("ip=: gateway: {e}"))?),
    };
    let dev = match field(5) {
        "" => None,
        d => Some(d.to_string()),
    };
    Ok(vec![IpConfig {
        dev,
        addr: Ipv4Cidr::new(client, len),
        gateway,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(a: [u8; 4], len: u8) -> Ipv4Cidr {
        Ipv4Cidr::new(Ipv4Address::from(a), len)
    }

    #[test]
    fn the_short_form_names_links_and_the_linux_form_gives_a_gateway() {
        assert_eq!(
            parse("ib0:10.0.0.1/24,10.1.0.1/16").unwrap(),
            vec![
                IpConfig {
                    dev: Some("ib0".into()),
                    addr: cidr([10, 0, 0, 1], 24),
                    gateway: None
                },
                IpConfig {
                    dev: None,
                    addr: cidr([10, 1, 0, 1], 16),
                    gateway: None
                },
            ]
        );
        assert_eq!(
            parse("10.0.0.3::10.0.0.254:255.255.255.0::ib0:off").unwrap(),
            vec![IpConfig {
                dev: Some("ib0".into()),
                addr: cidr([10, 0, 0, 3], 24),
                gateway: Some(Ipv4Address::new(10, 0, 0, 254)),
            }]
        );
        assert_eq!(parse("10.0.0.3").unwrap()[0].addr, cidr([10, 0, 0, 3], 24));
    }

    #[test]
    fn bad_values_are_errors() {
        for bad in [
            "",
            "ib0:10.0.0.1/33",
            "ib0:10.0.0/24",
            "10.0.0.3:::255.0.255.0",
            "10.0.0.3::::::dhcp",
            "x::",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
