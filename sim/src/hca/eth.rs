//! The Ethernet side of a ConnectX-3 VPI port: its MAC, the tables the Ethernet SET_PORT flavours write (general, receive-QP calculation, MAC, VLAN, RoCE GID), the filters, its counters, and where the card steers a received frame.
//!
//! Left out: the priority table (SET_PORT 4), per-priority flow control
//! beyond recording the pause settings, the VXLAN and RoCE v2 address
//! flavours of ConnectX-3 Pro, device-managed flow steering, and the
//! `DUMP_ETH_STATS` layout beyond the counters the model keeps.
//!
//! Layouts from iPXE `hermon.h` (`hermonprm_set_port_general_context_st`,
//! `hermonprm_set_port_rqp_calc_st`, `hermonprm_set_port_mac_table_st`,
//! `hermonprm_set_port_vlan_st`, `hermonprm_query_port_cap_st`), read a
//! second time in Linux 3.11/6.1 `mlx4.h` (`mlx4_set_port_general_context`,
//! `mlx4_set_port_rqp_calc_context`) and `port.c`.
//!
//! # What a VPI card reports
//!
//! A port is InfiniBand, Ethernet or either ([`PortType`], mlxconfig's
//! LINK_TYPE): QUERY_PORT byte 0 carries the supported types (bits 1:0),
//! and for a port that may be Ethernet the suggested type (bit 3: the
//! type of what the cable reaches) and "default sense" (bit 4, set for a
//! port that may be either), the Ethernet MTU (bytes 2-3), the link speed
//! (byte 5: 0x40, 40 GbE), log2 of the MAC and VLAN table sizes (byte
//! 0x0a) and the port's MAC (bytes 0x10-0x17). QUERY_DEV_CAP adds, for a
//! card with any port that may be Ethernet, DPDP (ports of different
//! types), SENSE_SUPPORT and IBOE (RoCE: mlx4_ib takes Ethernet ports only
//! with it). A card configured InfiniBand on both ports reports exactly
//! what it did before (an IB-only firmware configuration).
//!
//! A port of type `Auto` runs InfiniBand until the driver sends an
//! Ethernet SET_PORT (op_mod 1), which makes it an Ethernet port; an
//! InfiniBand SET_PORT makes it InfiniBand again. Neither may change the
//! type of an open port (INIT_PORT done): BAD_RES_STATE. A fixed port
//! refuses the other type's SET_PORT with BAD_OP, as a firmware without
//! that flavour does.
//!
//! # The port's MAC
//!
//! Port n's MAC is its port GUID (node GUID + n) with the two middle bytes
//! taken out: `00:02:c9:03:00:ab:cd:ef` gives `00:02:c9:ab:cd:ef`, the
//! relation between a ConnectX-3's GUIDs and its MACs (OUI, then the low 24
//! bits). Stable per node and port, distinct across the nodes of a fabric.
//!
//! # Steering a received frame (non-RoCE)
//!
//! In this order; the first that names QPs wins:
//!
//! 1. an MCG entry of protocol Ethernet for (port, steer type, destination
//!    MAC), the MGID being Linux's B0 form: byte 5 the port, byte 7 the
//!    steer type << 1 (0 multicast, 1 unicast), bytes 10-15 the MAC; every
//!    member gets a copy;
//! 2. the promiscuous entry WRITE_MCG op_mod 1 set for (port, steer type);
//! 3. the receive-QP calculation (SET_PORT RQP_CALC, A0 steering): a
//!    unicast MAC at index i of the MAC table goes to `base_qpn + i`
//!    (`+ (vlan index << n_mac)` when `n_vlan` is set); a miss goes to
//!    the promiscuous QP if `en_uc_promisc`, else nowhere; a multicast or
//!    broadcast frame goes to the default multicast QP when
//!    `mc_promisc_mode` is 2 (all multicast), else nowhere (1 and 0 steer
//!    by the MCG table only);
//! 4. nowhere: dropped and counted ([`EthCounters::rx_no_steer`]).
//!
//! The multicast filter (SET_MCAST_FLTR) drops, while enabled, multicast
//! frames to MACs it does not hold (broadcast passes); the VLAN filter
//! (SET_VLAN_FLTR) and the VLAN table say which VLANs the port is in: a
//! frame tagged with another VLAN (VID 1-4095) is dropped and counted,
//! untagged and priority-tagged (VID 0) frames pass.

use std::collections::BTreeSet;

use crate::fabric::LinkLayer;
use crate::hca::config::PortType;
use crate::hca::layout::{get8, get16, get32, get64};

/// Entries of the MAC table (`MLX4_MAX_MAC_NUM`).
pub const MAC_TABLE_LEN: usize = 128;
/// Entries of the VLAN table (`MLX4_MAX_VLAN_NUM`).
pub const VLAN_TABLE_LEN: usize = 128;
/// Entries of the RoCE GID table (`MLX4_ROCE_MAX_GIDS`).
pub const GID_TABLE_LEN: usize = 128;
/// The largest frame the port takes, FCS included (QUERY_PORT eth_mtu).
pub const ETH_MTU_CAP: u16 = 9600;
/// The smallest frame on the wire without its FCS (64 with it).
pub const MIN_FRAME: usize = 60;
/// MAC table entry valid bit (`MLX4_MAC_VALID`).
pub const MAC_VALID: u64 = 1 << 63;
/// VLAN table entry valid bit (`MLX4_VLAN_VALID`).
pub const VLAN_VALID: u32 = 1 << 31;
/// QUERY_PORT byte 5, the Ethernet link speed: 40 GbE (Linux
/// `MLX4_EN_40G_SPEED`; mlx4_ib reads 0x40 as 4X QDR).
pub const LINK_SPEED_40G: u8 = 0x40;
/// log2 of the MAC and VLAN table sizes QUERY_PORT reports.
pub const LOG_MAX_MAC: u8 = 7;
/// log2 of the VLAN table size.
pub const LOG_MAX_VLAN: u8 = 7;

/// The flavours of SET_PORT op_mod 1 (input modifier bits 15:8).
pub mod set_port_eth {
    /// MTU and pause.
    pub const GENERAL: u32 = 0;
    /// The receive-QP calculation.
    pub const RQP_CALC: u32 = 1;
    /// The MAC table: 128 BE64 `MAC | valid << 63`.
    pub const MAC_TABLE: u32 = 2;
    /// The VLAN table: 128 BE32 `VID | valid << 31`.
    pub const VLAN_TABLE: u32 = 3;
    /// The priority table (not modelled: BAD_PARAM).
    pub const PRIO_TABLE: u32 = 4;
    /// The RoCE GID table: 128 GIDs of 16 bytes.
    pub const GID_TABLE: u32 = 5;
    /// General: byte 3 bit 0, the MTU is valid.
    pub const V_MTU: u8 = 1 << 0;
    /// General: byte 3 bit 1, the receive pause is valid.
    pub const V_PPRX: u8 = 1 << 1;
    /// General: byte 3 bit 2, the transmit pause is valid.
    pub const V_PPTX: u8 = 1 << 2;
    /// General: BE16 MTU (the largest frame, FCS included).
    pub const MTU: usize = 0x06;
    /// General: transmit pause (bit 7).
    pub const PPTX: usize = 0x08;
    /// General: transmit priority flow control bitmap.
    pub const PFCTX: usize = 0x09;
    /// General: receive pause (bit 7).
    pub const PPRX: usize = 0x0c;
    /// General: receive priority flow control bitmap.
    pub const PFCRX: usize = 0x0d;
}

/// Steer types of the B0 MGID (byte 7 bits 2:1) and of WRITE_MCG's
/// promiscuous form.
pub mod steer {
    /// Multicast and broadcast (`MLX4_MC_STEER`).
    pub const MC: u8 = 0;
    /// Unicast (`MLX4_UC_STEER`).
    pub const UC: u8 = 1;
}

/// SET_PORT RQP_CALC as the card keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RqpCalc {
    /// QPN of MAC index 0.
    pub base_qpn: u32,
    /// log2 of the MAC indices in use.
    pub n_mac: u8,
    /// log2 of the VLAN indices in use.
    pub n_vlan: u8,
    /// log2 of the priorities in use.
    pub n_prio: u8,
    /// The index of a MAC miss (kept; a miss goes to the promiscuous QP).
    pub mac_miss: u8,
    /// The VLAN index of untagged frames.
    pub no_vlan: u8,
    /// The VLAN index of a VLAN miss.
    pub vlan_miss: u8,
    /// The promiscuous QP.
    pub promisc_qpn: u32,
    /// Unicast misses go to the promiscuous QP.
    pub uc_promisc: bool,
    /// The default multicast QP.
    pub mcast_qpn: u32,
    /// Multicast by VLAN.
    pub mc_by_vlan: bool,
    /// 0: MCG only, 1: MCG (direct), 2: every multicast to the default QP.
    pub mc_promisc_mode: u8,
}

impl RqpCalc {
    /// Decodes the mailbox.
    pub fn decode(b: &[u8]) -> RqpCalc {
        let promisc = get32(b, 0x14);
        let mcast = get32(b, 0x18);
        RqpCalc {
            base_qpn: get32(b, 0) & 0xff_ffff,
            n_mac: get8(b, 5) & 0xf,
            n_vlan: get8(b, 6) & 0x7,
            n_prio: get8(b, 7) & 0x3,
            mac_miss: get8(b, 0x0b),
            no_vlan: get8(b, 0x0d) & 0x7f,
            vlan_miss: get8(b, 0x0f) & 0x7f,
            promisc_qpn: promisc & 0xff_ffff,
            uc_promisc: promisc >> 31 != 0,
            mcast_qpn: mcast & 0xff_ffff,
            mc_by_vlan: mcast & 1 << 29 != 0,
            mc_promisc_mode: (mcast >> 30) as u8,
        }
    }
}

/// What the Ethernet side of a port counted (the model's; DUMP_ETH_STATS
/// reports the frame and drop counts from these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EthCounters {
    /// Frames received with a good FCS (any destination).
    pub rx_frames: u64,
    /// Their bytes (FCS included).
    pub rx_bytes: u64,
    /// Broadcast frames received.
    pub rx_broadcast: u64,
    /// Multicast frames received.
    pub rx_multicast: u64,
    /// Frames shorter than 64 bytes with the FCS (runts).
    pub rx_runt: u64,
    /// Frames longer than the port's MTU (SET_PORT general).
    pub rx_too_long: u64,
    /// Frames with a bad FCS.
    pub rx_bad_fcs: u64,
    /// Tagged frames of a VLAN the port is not in.
    pub rx_vlan_drop: u64,
    /// Multicast frames the multicast filter held back.
    pub rx_mcast_filtered: u64,
    /// Frames no steering step named a QP for.
    pub rx_no_steer: u64,
    /// Frames steered to a QP that cannot take them (not a raw Ethernet
    /// QP of this port, not ready).
    pub rx_bad_qp: u64,
    /// Frames for a QP whose receive ring was empty.
    pub rx_no_wqe: u64,
    /// Frames longer than the receive WQE's buffers.
    pub rx_too_long_for_wqe: u64,
    /// Frames delivered into a receive queue (each copy counts).
    pub rx_delivered: u64,
    /// RoCE frames taken by the transport.
    pub roce_rx: u64,
    /// RoCE frames to a MAC or a GID that is not this port's.
    pub roce_not_ours: u64,
    /// RoCE frames whose headers do not parse or whose ICRC is bad.
    pub roce_bad: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Their bytes (FCS included).
    pub tx_bytes: u64,
    /// Broadcast frames sent.
    pub tx_broadcast: u64,
    /// Multicast frames sent.
    pub tx_multicast: u64,
    /// Frames the port did not send: link down, longer than its MTU,
    /// shorter than an Ethernet header.
    pub tx_dropped: u64,
    /// RoCE frames sent.
    pub roce_tx: u64,
}

/// The Ethernet side of one port.
#[derive(Debug, Clone)]
pub struct EthPort {
    /// The port's MAC (QUERY_PORT).
    pub mac: [u8; 6],
    /// The largest frame, FCS included (SET_PORT general; the cap until
    /// one is set).
    pub mtu: u16,
    /// Transmit pause.
    pub pptx: bool,
    /// Receive pause.
    pub pprx: bool,
    /// Transmit priority flow control bitmap.
    pub pfctx: u8,
    /// Receive priority flow control bitmap.
    pub pfcrx: u8,
    /// SET_PORT general was given.
    pub general_set: bool,
    /// SET_PORT RQP_CALC, if given.
    pub rqp: Option<RqpCalc>,
    /// The MAC table (BE64 entries as written: MAC | valid << 63).
    pub macs: Vec<u64>,
    /// The VLAN table (VID | valid << 31).
    pub vlans: Vec<u32>,
    /// The RoCE GID table.
    pub gids: Vec<[u8; 16]>,
    /// WRITE_MCG op_mod 1: the promiscuous QPs per steer type (member
    /// words), multicast first.
    pub promisc: [Vec<u32>; 2],
    /// SET_MCAST_FLTR: enabled, and the MACs it lets through.
    pub mcast_filter: (bool, BTreeSet<u64>),
    /// SET_VLAN_FLTR: the VIDs let through (none set: no filter).
    pub vlan_filter: Option<Box<[bool; 4096]>>,
    /// Counters.
    pub counters: EthCounters,
}

/// Port `num`'s MAC from node GUID `node_guid` (see the module doc).
pub fn port_mac(node_guid: u64, num: u8) -> [u8; 6] {
    let g = node_guid.wrapping_add(u64::from(num)).to_be_bytes();
    [g[0], g[1], g[2], g[5], g[6], g[7]]
}

/// A MAC as the low 48 bits of a u64.
pub fn mac_u64(m: &[u8; 6]) -> u64 {
    m.iter().fold(0u64, |a, &b| a << 8 | u64::from(b))
}

/// The MAC in the low 48 bits of `v`.
pub fn mac_of(v: u64) -> [u8; 6] {
    let b = v.to_be_bytes();
    [b[2], b[3], b[4], b[5], b[6], b[7]]
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_str(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl EthPort {
    /// A powered-on port with MAC `mac`: nothing set, every table empty.
    pub fn new(mac: [u8; 6]) -> EthPort {
        EthPort {
            mac,
            mtu: ETH_MTU_CAP,
            pptx: false,
            pprx: false,
            pfctx: 0,
            pfcrx: 0,
            general_set: false,
            rqp: None,
            macs: vec![0; MAC_TABLE_LEN],
            vlans: vec![0; VLAN_TABLE_LEN],
            gids: vec![[0; 16]; GID_TABLE_LEN],
            promisc: [Vec::new(), Vec::new()],
            mcast_filter: (false, BTreeSet::new()),
            vlan_filter: None,
            counters: EthCounters::default(),
        }
    }

    /// The index of `mac` in the MAC table (valid entries only).
    pub fn mac_index(&self, mac: &[u8; 6]) -> Option<usize> {
        let m = mac_u64(mac);
        self.macs
            .iter()
            .position(|&e| e & MAC_VALID != 0 && e & 0xffff_ffff_ffff == m)
    }

    /// `mac` is this port's: in its MAC table, or (before the driver
    /// wrote any entry) its own MAC.
    pub fn owns_mac(&self, mac: &[u8; 6]) -> bool {
        if self.macs.iter().any(|e| e & MAC_VALID != 0) {
            self.mac_index(mac).is_some()
        } else {
            *mac == self.mac
        }
    }

    /// The index of VID `vid` in the VLAN table.
    pub fn vlan_index(&self, vid: u16) -> Option<usize> {
        self.vlans
            .iter()
            .position(|&e| e & VLAN_VALID != 0 && (e & 0xfff) as u16 == vid & 0xfff)
    }

    /// The port is in VLAN `vid` (0: untagged or priority-tagged, always).
    pub fn in_vlan(&self, vid: u16) -> bool {
        let vid = vid & 0xfff;
        vid == 0
            || self.vlan_index(vid).is_some()
            || self
                .vlan_filter
                .as_ref()
                .is_some_and(|f| f[usize::from(vid)])
    }

    /// The index of `gid` in the RoCE GID table (a zero entry is empty).
    pub fn gid_index(&self, gid: &[u8; 16]) -> Option<usize> {
        if gid.iter().all(|&b| b == 0) {
            return None;
        }
        self.gids.iter().position(|g| g == gid)
    }

    /// The multicast filter lets `mac` (a multicast MAC) through.
    pub fn mcast_passes(&self, mac: &[u8; 6]) -> bool {
        let (enabled, macs) = &self.mcast_filter;
        !*enabled || *mac == [0xff; 6] || macs.contains(&mac_u64(mac))
    }

    /// Writes the general settings; `Err` says what is wrong.
    pub fn set_general(&mut self, b: &[u8]) -> Result<(), String> {
        use set_port_eth::*;
        let flags = get8(b, 3);
        let mtu = get16(b, MTU);
        if flags & V_MTU != 0 && !(64..=ETH_MTU_CAP).contains(&mtu) {
            return Err(format!(
                "MTU {mtu} outside 64..={ETH_MTU_CAP} (the largest frame, FCS included)"
            ));
        }
        let (pptx, pprx) = (get8(b, PPTX) & 0x80 != 0, get8(b, PPRX) & 0x80 != 0);
        let (pfctx, pfcrx) = (get8(b, PFCTX), get8(b, PFCRX));
        if (flags & V_PPTX != 0 && pptx && pfctx != 0)
            || (flags & V_PPRX != 0 && pprx && pfcrx != 0)
        {
            return Err("global pause and priority flow control both on".into());
        }
        if flags & V_MTU != 0 {
            self.mtu = mtu;
        }
        if flags & V_PPTX != 0 {
            self.pptx = pptx;
            self.pfctx = pfctx;
        }
        if flags & V_PPRX != 0 {
            self.pprx = pprx;
            self.pfcrx = pfcrx;
        }
        self.general_set = true;
        Ok(())
    }

    /// Writes the MAC table (128 BE64); `Err` for a valid entry that is
    /// not a unicast MAC, or a MAC twice.
    pub fn set_macs(&mut self, b: &[u8]) -> Result<(), String> {
        let mut t = vec![0u64; MAC_TABLE_LEN];
        for (i, e) in t.iter_mut().enumerate() {
            *e = get64(b, i * 8);
        }
        let mut seen = BTreeSet::new();
        for (i, e) in t.iter().enumerate() {
            if e & MAC_VALID == 0 {
                continue;
            }
            if e & 0x7fff_0000_0000_0000 != 0 {
                return Err(format!("entry {i} {e:#018x} has bits 62:48 set"));
            }
            let m = e & 0xffff_ffff_ffff;
            if m >> 40 & 1 != 0 {
                return Err(format!(
                    "entry {i}: {} is a multicast MAC",
                    mac_str(&mac_of(m))
                ));
            }
            if !seen.insert(m) {
                return Err(format!(
                    "entry {i}: {} is in the table twice",
                    mac_str(&mac_of(m))
                ));
            }
        }
        self.macs = t;
        Ok(())
    }

    /// Writes the VLAN table (128 BE32).
    pub fn set_vlans(&mut self, b: &[u8]) -> Result<(), String> {
        let mut t = vec![0u32; VLAN_TABLE_LEN];
        for (i, e) in t.iter_mut().enumerate() {
            *e = get32(b, i * 4);
            if *e & VLAN_VALID != 0 && *e & 0x3fff_f000 != 0 {
                return Err(format!("entry {i} {:#010x} has bits 29:12 set", *e));
            }
        }
        self.vlans = t;
        Ok(())
    }

    /// Writes the RoCE GID table (128 x 16 bytes). A GID may be there
    /// twice: Linux 6.1's mlx4_ib keeps one entry per GID and VLAN, so a
    /// VLAN device's link-local GID (the port's MAC, as the port's own)
    /// is written beside the port's, and the card takes the table as it
    /// comes; a packet to that GID matches the first.
    pub fn set_gids(&mut self, b: &[u8]) -> Result<(), String> {
        let mut t = vec![[0u8; 16]; GID_TABLE_LEN];
        for (i, g) in t.iter_mut().enumerate() {
            if let Some(s) = b.get(i * 16..i * 16 + 16) {
                g.copy_from_slice(s);
            }
        }
        self.gids = t;
        Ok(())
    }
}

/// The operating link layer of a port configured `t` whose last SET_PORT
/// flavour (if any) asked for `asked`.
pub fn link_layer(t: PortType, asked: Option<LinkLayer>) -> LinkLayer {
    match t {
        PortType::Ib => LinkLayer::Ib,
        PortType::Eth => LinkLayer::Eth,
        PortType::Auto => asked.unwrap_or(LinkLayer::Ib),
    }
}

/// The MGID of Linux's B0 Ethernet steering entries.
pub fn steer_gid(port: u8, steer: u8, mac: &[u8; 6]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[5] = port;
    g[7] = steer << 1;
    g[10..16].copy_from_slice(mac);
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hca::layout::{put32, put64};

    #[test]
    fn macs_come_from_the_port_guids() {
        assert_eq!(
            port_mac(0x0002_c903_0000_0010, 1),
            [0x00, 0x02, 0xc9, 0x00, 0x00, 0x11]
        );
        assert_eq!(
            port_mac(0x0002_c903_0042_1000, 2),
            [0x00, 0x02, 0xc9, 0x42, 0x10, 0x02]
        );
        assert_eq!(mac_of(mac_u64(&[1, 2, 3, 4, 5, 6])), [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn rqp_calc_decodes_as_linux_writes_it() {
        // mlx4_SET_PORT_qpn_calc: base 0x48, n_mac 7, promisc 0 | base,
        // mcast MCAST_DEFAULT << 30 | base, vlan_miss 2.
        let mut b = vec![0u8; 64];
        put32(&mut b, 0, 0x48);
        b[5] = 7;
        b[0x0f] = 2;
        put32(&mut b, 0x14, 0x48);
        put32(&mut b, 0x18, 2 << 30 | 0x48);
        let r = RqpCalc::decode(&b);
        assert_eq!((r.base_qpn, r.n_mac, r.vlan_miss), (0x48, 7, 2));
        assert!(!r.uc_promisc);
        assert_eq!((r.mcast_qpn, r.mc_promisc_mode), (0x48, 2));
        put32(&mut b, 0x14, 1 << 31 | 0x50);
        assert!(RqpCalc::decode(&b).uc_promisc);
    }

    #[test]
    fn tables_refuse_what_the_card_would_not_keep() {
        let mut p = EthPort::new(port_mac(0x0002_c903_0000_0010, 1));
        let mut b = vec![0u8; 1024];
        put64(&mut b, 0, MAC_VALID | 0x0002_c900_0011);
        put64(&mut b, 8, MAC_VALID | 0x0002_c900_0012);
        assert!(p.set_macs(&b).is_ok());
        assert_eq!(p.mac_index(&[0, 2, 0xc9, 0, 0, 0x12]), Some(1));
        put64(&mut b, 16, MAC_VALID | 0x0002_c900_0011);
        assert!(p.set_macs(&b).unwrap_err().contains("twice"));
        put64(&mut b, 16, MAC_VALID | 0x0100_5e00_0001);
        assert!(p.set_macs(&b).unwrap_err().contains("multicast"));
        let mut g = vec![0u8; 2048];
        g[15] = 1;
        g[31] = 1;
        // The same GID twice (a VLAN device's link-local GID beside the
        // port's): taken, the first answers.
        p.set_gids(&g).unwrap();
        let mut one = [0u8; 16];
        one[15] = 1;
        assert_eq!(p.gid_index(&one), Some(0));
        let mut v = vec![0u8; 512];
        put32(&mut v, 4, VLAN_VALID | 100);
        p.set_vlans(&v).unwrap();
        assert!(p.in_vlan(100) && p.in_vlan(0) && !p.in_vlan(101));
    }
}
