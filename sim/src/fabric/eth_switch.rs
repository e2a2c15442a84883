//! A learning Ethernet switch: IEEE 802.1D transparent bridging as a datacenter top-of-rack switch does it, store and forward.
//!
//! Left out: spanning tree, VLAN membership and tagging (every port is in
//! every VLAN; tags cross unchanged), IGMP/MLD snooping (multicast floods),
//! pause and priority flow control (the model's links do not overrun),
//! link aggregation, and management (no SNMP, no LLDP).
//!
//! What it does with each frame, in order:
//!
//! * a frame shorter than 64 bytes (FCS included) is a runt, one longer
//!   than [`EthSwitch::max_frame`] a giant: dropped and counted at the
//!   ingress port;
//! * the FCS is checked (unless the fabric says the sender's CRCs are
//!   still owed and nothing touched the frame: see `crate::fabric`, "CRCs
//!   owed"): a bad one is dropped and counted;
//! * the source MAC (a unicast one) is learned on the ingress port, its
//!   age reset;
//! * a unicast destination the table holds, younger than the ageing time
//!   (300 s, IEEE 802.1D's default), goes out of that port (dropped if
//!   that is the ingress port: it is already there); every other
//!   destination (unknown or aged unicast, multicast, broadcast) floods
//!   out of every port with a live link but the ingress one.
//!
//! A MAC moving to another port is learned there at its next frame; the
//! table holds [`MAX_ENTRIES`] MACs (a full table learns nothing new: those
//! destinations flood).

use std::collections::BTreeMap;

use super::packet::{self, EthHdr, FCS_LEN, MIN_FRAME_FCS};

/// MACs the table holds at most.
pub const MAX_ENTRIES: usize = 16384;
/// How long a learned MAC is kept without a frame from it (IEEE 802.1D's
/// default ageing time, 300 s).
pub const AGEING_NS: u64 = 300_000_000_000;
/// The largest frame, FCS included, a port takes by default (a jumbo
/// frame of 9216 bytes plus a tag).
pub const MAX_FRAME: usize = 9216 + 4;

/// One port's counters (as an `ethtool -S` of a switch port would show).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EthPortCounters {
    /// Frames received (good or not).
    pub rx_frames: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Frames sent out of the port.
    pub tx_frames: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// Runts received.
    pub rx_runt: u64,
    /// Giants received.
    pub rx_giant: u64,
    /// Frames with a bad FCS received.
    pub rx_bad_fcs: u64,
    /// Frames flooded because their destination was unknown (unicast).
    pub flooded_unknown: u64,
    /// Broadcast and multicast frames flooded.
    pub flooded_group: u64,
    /// Frames whose destination is on the ingress port (filtered).
    pub filtered: u64,
}

/// What the switch does with a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EthAction {
    /// Out of these ports (one for a known destination, several for a
    /// flood; none: nowhere to go).
    Forward(Vec<u8>),
    /// Dropped, for this reason.
    Drop(&'static str),
}

/// A learning Ethernet switch.
#[derive(Debug, Clone)]
pub struct EthSwitch {
    /// Name (for the capture and the port names: `esw0/3`).
    pub name: String,
    nports: u8,
    /// MAC -> (port, last seen in fabric nanoseconds).
    table: BTreeMap<[u8; 6], (u8, u64)>,
    /// The ageing time.
    pub ageing_ns: u64,
    /// The largest frame it takes, FCS included.
    pub max_frame: usize,
    counters: Vec<EthPortCounters>,
}

impl EthSwitch {
    /// A switch with `nports` ports (1-based), nothing learned.
    pub fn new(name: &str, nports: u8) -> EthSwitch {
        EthSwitch {
            name: name.into(),
            nports,
            table: BTreeMap::new(),
            ageing_ns: AGEING_NS,
            max_frame: MAX_FRAME,
            counters: vec![EthPortCounters::default(); usize::from(nports) + 1],
        }
    }

    /// Number of ports.
    pub fn nports(&self) -> u8 {
        self.nports
    }

    /// The port counters of `port`.
    pub fn counters(&self, port: u8) -> EthPortCounters {
        self.counters
            .get(usize::from(port))
            .copied()
            .unwrap_or_default()
    }

    /// Counts a frame of `len` bytes sent out of `port`.
    pub fn count_tx(&mut self, port: u8, len: usize) {
        if let Some(c) = self.counters.get_mut(usize::from(port)) {
            c.tx_frames += 1;
            c.tx_bytes += len as u64;
        }
    }

    /// Where `mac` was learned, if it is not older than the ageing time
    /// at `now_ns`.
    pub fn lookup(&self, mac: &[u8; 6], now_ns: u64) -> Option<u8> {
        let &(p, seen) = self.table.get(mac)?;
        (now_ns.saturating_sub(seen) < self.ageing_ns).then_some(p)
    }

    /// The MACs learned (MAC, port, last seen), for tests and tools.
    pub fn table(&self) -> Vec<([u8; 6], u8, u64)> {
        self.table.iter().map(|(m, &(p, t))| (*m, p, t)).collect()
    }

    /// Forgets every MAC learned on `port` (its link went down).
    pub fn flush_port(&mut self, port: u8) {
        self.table.retain(|_, (p, _)| *p != port);
    }

    /// A frame arrived at `in_port` at `now_ns` (`crc_owed`: its FCS is
    /// still owed, so not compared); `live(p)`: port p's link is up.
    pub fn receive(
        &mut self,
        in_port: u8,
        frame: &[u8],
        crc_owed: bool,
        now_ns: u64,
        live: impl Fn(u8) -> bool,
    ) -> EthAction {
        let Some(c) = self.counters.get_mut(usize::from(in_port)) else {
            return EthAction::Drop("no such port");
        };
        c.rx_frames += 1;
        c.rx_bytes += frame.len() as u64;
        if frame.len() < MIN_FRAME_FCS {
            c.rx_runt += 1;
            return EthAction::Drop("runt frame");
        }
        if frame.len() > self.max_frame {
            c.rx_giant += 1;
            return EthAction::Drop("giant frame");
        }
        if !crc_owed && packet::check_fcs(frame).is_err() {
            c.rx_bad_fcs += 1;
            return EthAction::Drop("bad FCS");
        }
        let Ok(h) = EthHdr::parse(&frame[..frame.len() - FCS_LEN]) else {
            c.rx_runt += 1;
            return EthAction::Drop("runt frame");
        };
        if !packet::is_group_mac(&h.src)
            && (self.table.len() < MAX_ENTRIES || self.table.contains_key(&h.src))
        {
            self.table.insert(h.src, (in_port, now_ns));
        }
        let group = packet::is_group_mac(&h.dst);
        let known = self
            .table
            .get(&h.dst)
            .filter(|(_, seen)| now_ns.saturating_sub(*seen) < self.ageing_ns)
            .map(|(p, _)| *p);
        let Some(c) = self.counters.get_mut(usize::from(in_port)) else {
            return EthAction::Drop("no such port");
        };
        if !group && let Some(p) = known {
            if p == in_port {
                c.filtered += 1;
                return EthAction::Forward(Vec::new());
            }
            return EthAction::Forward(vec![p]);
        }
        if group {
            c.flooded_group += 1;
        } else {
            c.flooded_unknown += 1;
        }
        let out = (1..=self.nports)
            .filter(|&p| p != in_port && live(p))
            .collect();
        EthAction::Forward(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::packet::{ETHERTYPE_IPV4, finish_frame};

    fn frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        EthHdr {
            dst,
            src,
            vlan: None,
            ethertype: ETHERTYPE_IPV4,
        }
        .write(&mut f);
        finish_frame(&mut f, true);
        f
    }

    const A: [u8; 6] = [0, 2, 0xc9, 0, 0, 0x11];
    const B: [u8; 6] = [0, 2, 0xc9, 0, 0, 0x21];

    #[test]
    fn learns_floods_and_ages() {
        let mut s = EthSwitch::new("esw0", 4);
        let all = |_| true;
        // B unknown: flood out of 2, 3, 4.
        assert_eq!(
            s.receive(1, &frame(B, A), false, 0, all),
            EthAction::Forward(vec![2, 3, 4])
        );
        assert_eq!(s.lookup(&A, 0), Some(1));
        // B answers from port 3: A is known.
        assert_eq!(
            s.receive(3, &frame(A, B), false, 10, all),
            EthAction::Forward(vec![1])
        );
        assert_eq!(
            s.receive(1, &frame(B, A), false, 20, all),
            EthAction::Forward(vec![3])
        );
        // Broadcast floods, only to live ports.
        assert_eq!(
            s.receive(1, &frame([0xff; 6], A), false, 30, |p| p != 2),
            EthAction::Forward(vec![3, 4])
        );
        // Aged out: B floods again.
        let later = 20 + AGEING_NS;
        assert_eq!(
            s.receive(1, &frame(B, A), false, later, all),
            EthAction::Forward(vec![2, 3, 4])
        );
        // B moves to port 4.
        s.receive(4, &frame(A, B), false, later + 1, all);
        assert_eq!(s.lookup(&B, later + 1), Some(4));
        let c = s.counters(1);
        assert_eq!((c.flooded_unknown, c.flooded_group), (2, 1));
    }

    #[test]
    fn runts_giants_and_bad_fcs_are_dropped_and_counted() {
        let mut s = EthSwitch::new("esw0", 2);
        let all = |_| true;
        let f = frame(B, A);
        assert_eq!(
            s.receive(1, &f[..40], false, 0, all),
            EthAction::Drop("runt frame")
        );
        let mut bad = f.clone();
        bad[20] ^= 1;
        assert_eq!(
            s.receive(1, &bad, false, 0, all),
            EthAction::Drop("bad FCS")
        );
        assert!(matches!(
            s.receive(1, &bad, true, 0, all),
            EthAction::Forward(_)
        ));
        let big = vec![0u8; MAX_FRAME + 1];
        assert_eq!(
            s.receive(1, &big, true, 0, all),
            EthAction::Drop("giant frame")
        );
        let c = s.counters(1);
        assert_eq!((c.rx_runt, c.rx_bad_fcs, c.rx_giant), (1, 1, 1));
    }
}
