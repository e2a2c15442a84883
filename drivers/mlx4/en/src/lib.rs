//! Port of Linux's mlx4_en (`drivers/net/ethernet/mellanox/mlx4/en_*.c`) in its smallest useful form: each Ethernet port of a ConnectX-3 becomes an Ethernet link of the IP stack (`eth0`, `eth1`, ...) with one send ring and one receive ring, busy-polled.
//!
//! Left out: RSS and more than one ring per direction, LSO, checksum
//! offloads (the stack computes checksums), the VLAN filter and VLAN
//! priorities (VLAN devices are here: [`VlanLink`]), device-managed flow
//! steering, multicast lists (every multicast frame is received: the
//! port's filter is off), DCB, ethtool settings other than the counters,
//! interrupts, NAPI and BlueFlame, SR-IOV, self-test, time stamps, and the
//! adaptive moderation of `en_netdev.c`.
//!
//! Files keep Linux's names: [`en_netdev`] (`en_netdev.c`: open/close of a
//! port as `mlx4_en_start_port`/`mlx4_en_stop_port` do it, the link state,
//! the [`net::Link`] the stack drives), [`en_tx`] (`en_tx.c`: the send
//! ring, `mlx4_en_xmit`, send completions), [`en_rx`] (`en_rx.c`: the
//! receive ring, its QP steered by the MAC table, `mlx4_en_process_rx_cq`),
//! [`en_cq`] (`en_cq.c`: the two CQs), [`en_port`] (`en_port.c`:
//! `mlx4_en_QUERY_PORT`, `mlx4_en_DUMP_ETH_STATS`, and the names `ethtool
//! -S` prints).
//!
//! # Using it
//!
//! mlx4_core has probed the card and decided each port's type
//! ([`mlx4_core::Dev::protocol_ports`] with [`mlx4_core::Protocol::En`]
//! names the Ethernet ones). [`EnPriv::open`] takes a port: it registers
//! the port's MAC (its table index decides the receive QP), sets the MTU
//! and pause with SET_PORT, steers the port's frames (RQP_CALC) to its
//! receive ring, and brings the port up (INIT_PORT). [`EnLink`] wraps it
//! for the IP stack, which polls it with a context from which the link
//! finds the `Dev` again each time (the kernel's: ib_core, which owns the
//! device through mlx4_ib).
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod en_cq;
pub mod en_netdev;
pub mod en_port;
pub mod en_rx;
pub mod en_tx;

pub use en_netdev::{DevGetter, EnConfig, EnLink, EnPriv, EnShared, VlanLink};
pub use en_port::PortStats;

/// Bytes of an Ethernet header (`ETH_HLEN`).
pub const ETH_HLEN: usize = 14;
/// Bytes of an 802.1Q tag (`VLAN_HLEN`).
pub const VLAN_HLEN: usize = 4;
/// Bytes of the frame check sequence (`ETH_FCS_LEN`).
pub const ETH_FCS_LEN: usize = 4;
/// The default IP MTU (`ETH_DATA_LEN`).
pub const ETH_DATA_LEN: usize = 1500;
/// Bytes of a receive buffer: a frame of the largest MTU this driver sets
/// with a tag, rounded up.
pub const RX_BUF_SIZE: usize = 2048;
/// Bytes of a send descriptor slot (`TXBB_SIZE`).
pub const TXBB_SIZE: usize = 64;

/// Errors of mlx4_en.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// mlx4_core refused (firmware status, resources, arguments).
    Core(mlx4_core::Error),
    /// The port is not an Ethernet port.
    NotEthernet(u8),
    /// A ring size that is not a power of two in 2..=8192.
    BadRingSize(u32),
    /// An MTU this driver does not take (68..=1978: a frame in a 2 KiB
    /// receive buffer).
    BadMtu(usize),
    /// A VLAN id outside 1..=4094.
    BadVlan(u16),
    /// The port has a VLAN device of that id already.
    VlanExists(u16),
    /// The port is closed.
    Closed,
}

impl From<mlx4_core::Error> for Error {
    fn from(e: mlx4_core::Error) -> Error {
        Error::Core(e)
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Core(e) => write!(f, "mlx4_core: {e}"),
            Error::NotEthernet(p) => write!(f, "port {p} is not an Ethernet port"),
            Error::BadRingSize(n) => write!(f, "ring size {n} is not a power of two in 2..=8192"),
            Error::BadMtu(m) => write!(f, "MTU {m} outside 68..=1978"),
            Error::BadVlan(v) => write!(f, "VLAN id {v} outside 1..=4094"),
            Error::VlanExists(v) => write!(f, "the port has VLAN {v} already"),
            Error::Closed => f.write_str("the port is closed"),
        }
    }
}

/// Results of mlx4_en.
pub type Result<T> = core::result::Result<T, Error>;

/// `aa:bb:cc:dd:ee:ff` of a MAC in the low 48 bits of `mac`.
pub fn mac_bytes(mac: u64) -> [u8; 6] {
    mlx4_core::port::mac_to_bytes(mac)
}
