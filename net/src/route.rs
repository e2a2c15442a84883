//! The routing table, as `ip route` shows it: Linux's `main` and `local` tables (`fib_table`), searched by longest prefix.
//!
//! Leaves out: metrics, policy rules, multipath, route caches, scopes other
//! than `host` and `link` (and `global` for gateway routes), and every table
//! but `main` and `local`. A connected route comes with each address, as
//! Linux adds one; `local` holds each address itself (and lo's whole
//! 127.0.0.0/8), which is how a packet to one of our own addresses is sent
//! through lo whichever link holds the address.

use alloc::vec::Vec;
use core::fmt;

use smoltcp::wire::{Ipv4Address, Ipv4Cidr};

use crate::LinkId;

/// Which table a route sits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// `ip route` (`table main`).
    Main,
    /// Our own addresses (`ip route show table local`).
    Local,
}

/// Who made a route (`proto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// With an address (`proto kernel`).
    Kernel,
    /// By `ip route add` (`proto static`, which `ip route` does not print).
    Static,
    /// From the kernel command line (`proto boot`).
    Boot,
}

/// One route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Destination network (host bits clear; `/0` is the default route).
    pub dst: Ipv4Cidr,
    /// Gateway, for a route through a router.
    pub via: Option<Ipv4Address>,
    /// The link the packets leave by.
    pub dev: LinkId,
    /// Who made it.
    pub proto: Proto,
    /// Preferred source address.
    pub src: Option<Ipv4Address>,
    /// Its table.
    pub table: Table,
}

impl Route {
    /// `link` for a connected route, `host` for a local one, `global` else
    /// (what `ip route` prints after `scope`, when it prints it).
    pub fn scope(&self) -> &'static str {
        match (self.table, self.via) {
            (Table::Local, _) => "host",
            (Table::Main, None) => "link",
            (Table::Main, Some(_)) => "global",
        }
    }
}

/// Prints a destination as `ip route` does: `default`, a bare address for
/// a /32, else `a.b.c.d/len`.
pub struct Dst(pub Ipv4Cidr);

impl fmt::Display for Dst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.prefix_len() {
            0 => f.write_str("default"),
            32 => write!(f, "{}", self.0.address()),
            _ => write!(f, "{}", self.0),
        }
    }
}

/// The routes of both tables.
#[derive(Default)]
pub struct Routes {
    v: Vec<Route>,
}

impl Routes {
    /// Every route, in the order added.
    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.v.iter()
    }

    /// Adds `r` (its destination narrowed to the network); false if the
    /// table already has a route to that destination in that table.
    pub fn add(&mut self, mut r: Route) -> bool {
        r.dst = r.dst.network();
        if self.v.iter().any(|o| {
            o.table == r.table && o.dst == r.dst && (r.table == Table::Main || o.dev == r.dev)
        }) {
            return false;
        }
        self.v.push(r);
        true
    }

    /// Removes the routes for which `f` is true; returns how many.
    pub fn remove_where(&mut self, mut f: impl FnMut(&Route) -> bool) -> usize {
        let before = self.v.len();
        self.v.retain(|r| !f(r));
        before - self.v.len()
    }

    /// The route a packet to `dst` takes: `local` first (our own
    /// addresses), then `main`, each by longest prefix (the first added
    /// wins a tie).
    pub fn lookup(&self, dst: Ipv4Address) -> Option<&Route> {
        [Table::Local, Table::Main].into_iter().find_map(|t| {
            self.v
                .iter()
                .filter(|r| r.table == t && r.dst.contains_addr(&dst))
                .fold(None, |best: Option<&Route>, r| match best {
                    Some(b) if b.dst.prefix_len() >= r.dst.prefix_len() => Some(b),
                    _ => Some(r),
                })
        })
    }

    /// The address on `dev` a packet to `dst` is sent to: `dst` itself on a
    /// connected network, else the gateway of the best route leaving by
    /// `dev` (`dst` when there is none).
    pub fn next_hop(&self, dev: LinkId, dst: Ipv4Address) -> Ipv4Address {
        self.v
            .iter()
            .filter(|r| r.table == Table::Main && r.dev == dev && r.dst.contains_addr(&dst))
            .fold(None, |best: Option<&Route>, r| match best {
                Some(b) if b.dst.prefix_len() >= r.dst.prefix_len() => Some(b),
                _ => Some(r),
            })
            .and_then(|r| r.via)
            .unwrap_or(dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(a: [u8; 4], len: u8) -> Ipv4Cidr {
        Ipv4Cidr::new(Ipv4Address::from(a), len)
    }

    fn route(dst: Ipv4Cidr, via: Option<[u8; 4]>, dev: u32, table: Table) -> Route {
        Route {
            dst,
            via: via.map(Ipv4Address::from),
            dev: LinkId(dev),
            proto: Proto::Kernel,
            src: None,
            table,
        }
    }

    #[test]
    fn longest_prefix_local_first_and_next_hops() {
        let mut t = Routes::default();
        assert!(t.add(route(cidr([10, 0, 0, 7], 24), None, 2, Table::Main)));
        assert!(!t.add(route(cidr([10, 0, 0, 0], 24), None, 2, Table::Main)));
        assert!(t.add(route(
            cidr([0, 0, 0, 0], 0),
            Some([10, 0, 0, 254]),
            2,
            Table::Main
        )));
        assert!(t.add(route(cidr([10, 0, 0, 7], 32), None, 2, Table::Local)));
        assert!(t.add(route(cidr([127, 0, 0, 0], 8), None, 1, Table::Local)));
        let a = |x: [u8; 4]| Ipv4Address::from(x);
        assert_eq!(
            t.lookup(a([10, 0, 0, 7])).map(|r| r.table),
            Some(Table::Local)
        );
        assert_eq!(
            t.lookup(a([10, 0, 0, 9])).map(|r| r.dst.prefix_len()),
            Some(24)
        );
        assert_eq!(
            t.lookup(a([8, 8, 8, 8])).and_then(|r| r.via),
            Some(a([10, 0, 0, 254]))
        );
        assert_eq!(t.lookup(a([127, 1, 2, 3])).map(|r| r.dev), Some(LinkId(1)));
        assert_eq!(t.next_hop(LinkId(2), a([10, 0, 0, 9])), a([10, 0, 0, 9]));
        assert_eq!(t.next_hop(LinkId(2), a([8, 8, 8, 8])), a([10, 0, 0, 254]));
        assert_eq!(t.remove_where(|r| r.via.is_some()), 1);
        assert_eq!(t.lookup(a([8, 8, 8, 8])), None);
        assert_eq!(alloc::format!("{}", Dst(cidr([0, 0, 0, 0], 0))), "default");
        assert_eq!(
            alloc::format!("{}", Dst(cidr([10, 0, 0, 1], 32))),
            "10.0.0.1"
        );
    }
}
