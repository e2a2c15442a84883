//! The kernel's IP layer: smoltcp over a busy-polled link trait, with the configuration, `ping` and echo services a researcher expects from `iproute2`, `iputils` and inetd.
//!
//! Leaves out: IPv6, forwarding, fragmentation, DHCP, DNS, multicast
//! groups, netfilter, and every interrupt: [`Stack::poll`] is called from
//! the kernel's progress loop and from commands that wait.
//!
//! A network device implements [`Link`] (IPoIB's `ib0`, mlx4_en's
//! `eth0`; [`Loopback`] is `lo`) and is handed to [`Stack::add_link`]. The
//! stack gives each link a smoltcp `Interface` and `SocketSet`, keeps the
//! addresses and the routing table ([`route`]), checks every received
//! packet before smoltcp does so that each drop is counted ([`check`]),
//! answers pings (smoltcp) and port 7 ([`echo`]), and offers sockets
//! ([`Stack::tcp_connect`], [`Stack::udp_open`], [`Stack::raw_icmp_open`]).
//! [`iproute`] is `ip addr|link|neigh|route`, [`ping`] is iputils' `ping`,
//! [`config`] reads `ip=` from the kernel command line. [`wire`] is a pair
//! of links joined back to back, for tests.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod check;
pub mod config;
mod device;
pub mod echo;
pub mod iproute;
pub mod link;
pub mod loopback;
pub mod ping;
pub mod route;
mod stack;
pub mod wire;

pub use device::Counters;
pub use link::{HwAddr, Ipv4Address, Link, LinkKind, LinkStats, NeighState, Neighbour};
pub use loopback::Loopback;
pub use smoltcp;
pub use smoltcp::wire::Ipv4Cidr;
pub use stack::{Egress, Error, LinkId, RoceLink, SocketRef, Stack};
