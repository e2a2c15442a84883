//! What Linux's `en_port.c` asks the firmware about a port: its link (`mlx4_en_QUERY_PORT`) and its counters (`mlx4_en_DUMP_ETH_STATS`), and the counter names `ethtool -S` prints.
//!
//! Left out: the per-priority and per-VLAN counters of `struct
//! mlx4_en_stat_out_mbox` (summed here as "no VLAN", as the firmware
//! reports them for a port in no VLAN), the VLAN filter
//! (`mlx4_SET_VLAN_FLTR`), the transceiver fields of QUERY_PORT.

use alloc::string::String;
use alloc::vec::Vec;

use hal::be::{get_be32, get_be64};
use mlx4_core::Dev;

use crate::Result;

/// Bytes of `struct mlx4_en_stat_out_mbox` read.
pub const STAT_MBOX_LEN: usize = 3072;

/// The port's counters as DUMP_ETH_STATS reports them (the part of
/// `struct mlx4_en_stat_out_mbox` this driver reads).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received (`RTOT_novlan`).
    pub rx_packets: u64,
    /// Bytes received (`ROCT_novlan`).
    pub rx_bytes: u64,
    /// Broadcast frames received (`RBCAST_novlan`).
    pub rx_broadcast: u64,
    /// Multicast frames received (`MCAST_novlan`).
    pub rx_multicast: u64,
    /// Frames longer than the port's MTU (`RFrmTooLong`).
    pub rx_too_long: u64,
    /// Frames sent (`TTOT_novlan`).
    pub tx_packets: u64,
    /// Bytes sent (`TOCT_novlan`).
    pub tx_bytes: u64,
    /// Broadcast frames sent (`TBCAST_novlan`).
    pub tx_broadcast: u64,
    /// Multicast frames sent (`TMCAST_novlan`).
    pub tx_multicast: u64,
    /// Frames with a bad FCS (`RCRC`).
    pub rx_crc_errors: u64,
    /// Frames shorter than 64 bytes (`RSHORT`).
    pub rx_short: u64,
    /// Frames the port dropped (`RDROP`: no steering, a VLAN not ours, no
    /// descriptor, ...).
    pub rx_dropped: u64,
    /// Frames dropped for want of a descriptor (`RdropOvflw`).
    pub rx_over_errors: u64,
    /// Frames longer than the descriptor's buffer (`RdropLength`).
    pub rx_length_errors: u64,
    /// Frames the port dropped on the way out (`TDROP`).
    pub tx_dropped: u64,
}

impl PortStats {
    /// Decodes the mailbox (`mlx4_en_DUMP_ETH_STATS`); a counter past the
    /// end of `b` reads 0.
    pub fn parse(b: &[u8]) -> PortStats {
        let q = |slot: usize| b.get(slot * 8..slot * 8 + 8).map_or(0, |s| get_be64(s, 0));
        let d = |off: usize| b.get(off..off + 4).map_or(0, |s| u64::from(get_be32(s, 0)));
        PortStats {
            rx_broadcast: q(98),
            rx_multicast: q(107),
            rx_bytes: q(143),
            rx_packets: q(168),
            rx_too_long: q(177),
            tx_broadcast: q(287),
            tx_multicast: q(297),
            tx_bytes: q(335),
            tx_packets: q(363),
            rx_crc_errors: d(2956),
            rx_short: d(2964),
            rx_dropped: d(2968),
            rx_over_errors: d(2972),
            rx_length_errors: d(2976),
            tx_dropped: d(2984),
        }
    }

    /// Name and value of each counter, in `ethtool -S`'s words.
    pub fn named(&self) -> Vec<(String, u64)> {
        [
            ("rx_packets_phy", self.rx_packets),
            ("rx_bytes_phy", self.rx_bytes),
            ("rx_broadcast_phy", self.rx_broadcast),
            ("rx_multicast_phy", self.rx_multicast),
            ("rx_too_long_phy", self.rx_too_long),
            ("rx_crc_errors_phy", self.rx_crc_errors),
            ("rx_short_phy", self.rx_short),
            ("rx_dropped_phy", self.rx_dropped),
            ("rx_over_errors_phy", self.rx_over_errors),
            ("rx_length_errors_phy", self.rx_length_errors),
            ("tx_packets_phy", self.tx_packets),
            ("tx_bytes_phy", self.tx_bytes),
            ("tx_broadcast_phy", self.tx_broadcast),
            ("tx_multicast_phy", self.tx_multicast),
            ("tx_dropped_phy", self.tx_dropped),
        ]
        .into_iter()
        .map(|(n, v)| (String::from(n), v))
        .collect()
    }
}

/// Linux `mlx4_en_DUMP_ETH_STATS`: the port's counters (`reset` starts
/// them again).
pub fn dump_eth_stats(dev: &mut Dev, port: u8, reset: bool) -> Result<PortStats> {
    let mut b = alloc::vec![0u8; STAT_MBOX_LEN];
    dev.dump_eth_stats(port, reset, &mut b)?;
    Ok(PortStats::parse(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_where_the_mailbox_has_them() {
        let mut b = vec![0u8; STAT_MBOX_LEN];
        b[98 * 8 + 7] = 3; // RBCAST_novlan
        b[168 * 8 + 6] = 1; // RTOT_novlan = 256
        b[363 * 8 + 7] = 9; // TTOT_novlan
        b[2968 + 3] = 5; // RDROP
        b[2984 + 3] = 2; // TDROP
        let s = PortStats::parse(&b);
        assert_eq!(
            (
                s.rx_broadcast,
                s.rx_packets,
                s.tx_packets,
                s.rx_dropped,
                s.tx_dropped
            ),
            (3, 256, 9, 5, 2)
        );
        assert_eq!(PortStats::parse(&[]), PortStats::default());
        let named = s.named();
        assert!(named.contains(&(String::from("rx_dropped_phy"), 5)));
    }
}
