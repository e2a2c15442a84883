//! Port of Linux `drivers/infiniband/core/ud_header.c` (3.11): the UD packet headers (LRH, GRH, BTH, DETH, immediate) a driver puts in front of a QP0/QP1 send, with their init, pack and unpack.
//!
//! With the Ethernet (and 802.1Q) header a RoCE v1 QP1 send carries instead
//! of the LRH (3.11's `eth_present`/`vlan_present`); ICRC/VCRC and the FCS
//! are the hardware's business. Unpacking reads IB packets only.
//!
//! The field tables follow IBTA Vol. 1 9.2/8.2/8.3 (and Linux's `lrh_table`,
//! `grh_table`, `bth_table`, `deth_table`). One deliberate difference from
//! 3.11's `ib_ud_header_init`: the LRH packet length and the GRH payload
//! length count the 4 immediate bytes when an immediate is present (IBTA
//! 7.7.8); Linux 3.11 leaves them out. MADs never carry one.

use crate::error::{Error, Result};
use crate::packer::{self, IbField};
use crate::verbs::Gid;

/// LRH bytes.
pub const IB_LRH_BYTES: usize = 8;
/// GRH bytes.
pub const IB_GRH_BYTES: usize = 40;
/// BTH bytes.
pub const IB_BTH_BYTES: usize = 12;
/// DETH bytes.
pub const IB_DETH_BYTES: usize = 8;
/// Immediate bytes.
pub const IB_IMM_BYTES: usize = 4;
/// ICRC bytes.
pub const IB_ICRC_BYTES: usize = 4;
/// Ethernet header bytes (two MACs and the Ethertype).
pub const IB_ETH_BYTES: usize = 14;
/// 802.1Q tag bytes (TPID and TCI).
pub const IB_VLAN_BYTES: usize = 4;
/// RoCE v1's Ethertype (Linux `MLX4_IB_IBOE_ETHERTYPE`).
pub const ETH_P_IBOE: u16 = 0x8915;

/// Longest packed UD header on InfiniBand (LRH + GRH + BTH + DETH + IMM);
/// an Ethernet header with a tag is 10 bytes longer (18 for the 8-byte
/// LRH).
pub const IB_UD_HEADER_MAX: usize =
    IB_LRH_BYTES + IB_GRH_BYTES + IB_BTH_BYTES + IB_DETH_BYTES + IB_IMM_BYTES;

/// `IB_LNH_RAW`.
pub const IB_LNH_RAW: u8 = 0;
/// `IB_LNH_IP`.
pub const IB_LNH_IP: u8 = 1;
/// `IB_LNH_IBA_LOCAL`: BTH follows the LRH.
pub const IB_LNH_IBA_LOCAL: u8 = 2;
/// `IB_LNH_IBA_GLOBAL`: a GRH follows the LRH.
pub const IB_LNH_IBA_GLOBAL: u8 = 3;

/// `IB_OPCODE_UD_SEND_ONLY`.
pub const IB_OPCODE_UD_SEND_ONLY: u8 = 0x64;
/// `IB_OPCODE_UD_SEND_ONLY_WITH_IMMEDIATE`.
pub const IB_OPCODE_UD_SEND_ONLY_WITH_IMMEDIATE: u8 = 0x65;
/// GRH next header for IBA transport.
pub const IB_GRH_NEXT_HDR: u8 = 0x1b;

const LRH_TABLE: [IbField; 9] = [
    IbField::new("virtual_lane", 0, 0, 4),
    IbField::new("link_version", 0, 4, 4),
    IbField::new("service_level", 0, 8, 4),
    IbField::new("RESERVED", 0, 12, 2),
    IbField::new("link_next_header", 0, 14, 2),
    IbField::new("destination_lid", 0, 16, 16),
    IbField::new("RESERVED", 1, 0, 5),
    IbField::new("packet_length", 1, 5, 11),
    IbField::new("source_lid", 1, 16, 16),
];

/// The GRH without its two GIDs (dwords 2..5 and 6..9, copied as bytes).
const GRH_TABLE: [IbField; 6] = [
    IbField::new("ip_version", 0, 0, 4),
    IbField::new("traffic_class", 0, 4, 8),
    IbField::new("flow_label", 0, 12, 20),
    IbField::new("payload_length", 1, 0, 16),
    IbField::new("next_header", 1, 16, 8),
    IbField::new("hop_limit", 1, 24, 8),
];

const BTH_TABLE: [IbField; 11] = [
    IbField::new("opcode", 0, 0, 8),
    IbField::new("solicited_event", 0, 8, 1),
    IbField::new("mig_req", 0, 9, 1),
    IbField::new("pad_count", 0, 10, 2),
    IbField::new("transport_header_version", 0, 12, 4),
    IbField::new("pkey", 0, 16, 16),
    IbField::new("RESERVED", 1, 0, 8),
    IbField::new("destination_qpn", 1, 8, 24),
    IbField::new("ack_req", 2, 0, 1),
    IbField::new("RESERVED", 2, 1, 7),
    IbField::new("psn", 2, 8, 24),
];

const DETH_TABLE: [IbField; 3] = [
    IbField::new("qkey", 0, 0, 32),
    IbField::new("RESERVED", 1, 0, 8),
    IbField::new("source_qpn", 1, 8, 24),
];

/// Local route header (`struct ib_unpacked_lrh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lrh {
    /// VL (15 for QP0).
    pub virtual_lane: u8,
    /// Link version (0).
    pub link_version: u8,
    /// SL.
    pub service_level: u8,
    /// LNH.
    pub link_next_header: u8,
    /// DLID.
    pub destination_lid: u16,
    /// Packet length in 4-byte words, LRH to ICRC inclusive.
    pub packet_length: u16,
    /// SLID.
    pub source_lid: u16,
}

/// Global route header (`struct ib_unpacked_grh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GrhHeader {
    /// IP version (6).
    pub ip_version: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Bytes after the GRH up to and including the ICRC.
    pub payload_length: u16,
    /// Next header (0x1b).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// SGID.
    pub source_gid: Gid,
    /// DGID.
    pub destination_gid: Gid,
}

/// Base transport header (`struct ib_unpacked_bth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bth {
    /// Opcode.
    pub opcode: u8,
    /// SE.
    pub solicited_event: u8,
    /// M.
    pub mig_req: u8,
    /// Pad bytes at the end of the payload.
    pub pad_count: u8,
    /// TVer (0).
    pub transport_header_version: u8,
    /// P_Key.
    pub pkey: u16,
    /// Destination QPN.
    pub destination_qpn: u32,
    /// A (ack request).
    pub ack_req: u8,
    /// PSN.
    pub psn: u32,
}

/// Datagram extended transport header (`struct ib_unpacked_deth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deth {
    /// Q_Key.
    pub qkey: u32,
    /// Source QPN.
    pub source_qpn: u32,
}

/// The Ethernet header of a RoCE v1 packet (`struct ib_unpacked_eth` and
/// `ib_unpacked_vlan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EthHeader {
    /// Destination MAC.
    pub dmac: [u8; 6],
    /// Source MAC.
    pub smac: [u8; 6],
    /// The 802.1Q TCI (priority << 13 | VLAN id), if tagged.
    pub vlan_tag: Option<u16>,
    /// Ethertype after the MACs (and the tag): [`ETH_P_IBOE`].
    pub ether_type: u16,
}

/// `struct ib_ud_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdHeader {
    /// The Ethernet header (RoCE v1; then no LRH).
    pub eth: Option<EthHeader>,
    /// LRH present.
    pub lrh_present: bool,
    /// LRH.
    pub lrh: Lrh,
    /// GRH present.
    pub grh_present: bool,
    /// GRH.
    pub grh: GrhHeader,
    /// BTH.
    pub bth: Bth,
    /// DETH.
    pub deth: Deth,
    /// Immediate present.
    pub immediate_present: bool,
    /// Immediate data, wire order read as a `u32`.
    pub immediate_data: u32,
}

/// Linux `ib_ud_header_init` (IB link only): the header of a UD SEND ONLY
/// carrying `payload_bytes`, with lengths, LNH, opcode and pad filled in.
#[doc(alias = "ib_ud_header_init")]
pub fn init(
    payload_bytes: usize,
    lrh_present: bool,
    grh_present: bool,
    immediate_present: bool,
) -> Result<UdHeader> {
    // The 11-bit packet length bounds the payload (and 4096-byte MTUs fit).
    if payload_bytes > 4096 + 256 {
        return Err(Error::MsgSize);
    }
    let imm = if immediate_present { IB_IMM_BYTES } else { 0 };
    let transport = IB_BTH_BYTES + IB_DETH_BYTES + imm + payload_bytes + IB_ICRC_BYTES;
    let mut h = UdHeader {
        lrh_present,
        grh_present,
        immediate_present,
        ..UdHeader::default()
    };
    if lrh_present {
        let mut words = (IB_LRH_BYTES + transport).div_ceil(4);
        if grh_present {
            words += IB_GRH_BYTES / 4;
        }
        h.lrh.link_version = 0;
        h.lrh.link_next_header = if grh_present {
            IB_LNH_IBA_GLOBAL
        } else {
            IB_LNH_IBA_LOCAL
        };
        h.lrh.packet_length = words as u16;
    }
    if grh_present {
        h.grh.ip_version = 6;
        h.grh.payload_length = (transport.next_multiple_of(4)) as u16;
        h.grh.next_header = IB_GRH_NEXT_HDR;
    }
    h.bth.opcode = if immediate_present {
        IB_OPCODE_UD_SEND_ONLY_WITH_IMMEDIATE
    } else {
        IB_OPCODE_UD_SEND_ONLY
    };
    h.bth.pad_count = ((4 - payload_bytes % 4) % 4) as u8;
    h.bth.transport_header_version = 0;
    Ok(h)
}

impl UdHeader {
    /// Bytes [`UdHeader::pack`] writes.
    pub fn packed_len(&self) -> usize {
        self.eth.map_or(0, |e| {
            IB_ETH_BYTES
                + if e.vlan_tag.is_some() {
                    IB_VLAN_BYTES
                } else {
                    0
                }
        }) + (if self.lrh_present { IB_LRH_BYTES } else { 0 })
            + (if self.grh_present { IB_GRH_BYTES } else { 0 })
            + IB_BTH_BYTES
            + IB_DETH_BYTES
            + (if self.immediate_present {
                IB_IMM_BYTES
            } else {
                0
            })
    }

    /// Linux `ib_ud_header_pack`: writes the headers into `buf`, returns the
    /// number of bytes written.
    pub fn pack(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.packed_len();
        if buf.len() < len {
            return Err(Error::MsgSize);
        }
        let mut off = 0;
        if let Some(e) = &self.eth {
            buf[..6].copy_from_slice(&e.dmac);
            buf[6..12].copy_from_slice(&e.smac);
            off = 12;
            if let Some(tag) = e.vlan_tag {
                buf[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
                buf[14..16].copy_from_slice(&tag.to_be_bytes());
                off = 16;
            }
            buf[off..off + 2].copy_from_slice(&e.ether_type.to_be_bytes());
            off += 2;
        }
        if self.lrh_present {
            let l = &self.lrh;
            let v = [
                l.virtual_lane.into(),
                l.link_version.into(),
                l.service_level.into(),
                0,
                l.link_next_header.into(),
                l.destination_lid.into(),
                0,
                l.packet_length.into(),
                l.source_lid.into(),
            ];
            packer::pack(&LRH_TABLE, &v, &mut buf[off..off + IB_LRH_BYTES])?;
            off += IB_LRH_BYTES;
        }
        if self.grh_present {
            let g = &self.grh;
            let v = [
                g.ip_version.into(),
                g.traffic_class.into(),
                g.flow_label.into(),
                g.payload_length.into(),
                g.next_header.into(),
                g.hop_limit.into(),
            ];
            packer::pack(&GRH_TABLE, &v, &mut buf[off..off + 8])?;
            buf[off + 8..off + 24].copy_from_slice(&g.source_gid.0);
            buf[off + 24..off + 40].copy_from_slice(&g.destination_gid.0);
            off += IB_GRH_BYTES;
        }
        let b = &self.bth;
        let v = [
            b.opcode.into(),
            b.solicited_event.into(),
            b.mig_req.into(),
            b.pad_count.into(),
            b.transport_header_version.into(),
            b.pkey.into(),
            0,
            b.destination_qpn.into(),
            b.ack_req.into(),
            0,
            b.psn.into(),
        ];
        packer::pack(&BTH_TABLE, &v, &mut buf[off..off + IB_BTH_BYTES])?;
        off += IB_BTH_BYTES;
        let d = &self.deth;
        packer::pack(
            &DETH_TABLE,
            &[d.qkey.into(), 0, d.source_qpn.into()],
            &mut buf[off..off + IB_DETH_BYTES],
        )?;
        off += IB_DETH_BYTES;
        if self.immediate_present {
            buf[off..off + 4].copy_from_slice(&self.immediate_data.to_be_bytes());
            off += 4;
        }
        Ok(off)
    }

    /// Linux `ib_ud_header_unpack`: parses the headers of a received packet
    /// starting with the LRH. Refuses (with `-EINVAL`) a link version other
    /// than 0, a raw or IP LNH, a GRH that is not version 6, a BTH opcode
    /// other than UD SEND ONLY (with or without immediate) and a transport
    /// header version other than 0.
    pub fn unpack(buf: &[u8]) -> Result<UdHeader> {
        let mut h = UdHeader {
            lrh_present: true,
            ..UdHeader::default()
        };
        let mut off = 0;
        let need = |off: usize, n: usize| -> Result<()> {
            if buf.len() < off + n {
                Err(Error::MsgSize)
            } else {
                Ok(())
            }
        };
        need(off, IB_LRH_BYTES)?;
        let mut v = [0u64; 9];
        packer::unpack(&LRH_TABLE, &buf[..IB_LRH_BYTES], &mut v)?;
        h.lrh = Lrh {
            virtual_lane: v[0] as u8,
            link_version: v[1] as u8,
            service_level: v[2] as u8,
            link_next_header: v[4] as u8,
            destination_lid: v[5] as u16,
            packet_length: v[7] as u16,
            source_lid: v[8] as u16,
        };
        off += IB_LRH_BYTES;
        if h.lrh.link_version != 0 {
            return Err(Error::Invalid("ud_header: LRH link version is not 0"));
        }
        match h.lrh.link_next_header {
            IB_LNH_IBA_LOCAL => {}
            IB_LNH_IBA_GLOBAL => {
                need(off, IB_GRH_BYTES)?;
                let mut g = [0u64; 6];
                packer::unpack(&GRH_TABLE, &buf[off..off + 8], &mut g)?;
                let mut sgid = [0u8; 16];
                let mut dgid = [0u8; 16];
                sgid.copy_from_slice(&buf[off + 8..off + 24]);
                dgid.copy_from_slice(&buf[off + 24..off + 40]);
                h.grh_present = true;
                h.grh = GrhHeader {
                    ip_version: g[0] as u8,
                    traffic_class: g[1] as u8,
                    flow_label: g[2] as u32,
                    payload_length: g[3] as u16,
                    next_header: g[4] as u8,
                    hop_limit: g[5] as u8,
                    source_gid: Gid(sgid),
                    destination_gid: Gid(dgid),
                };
                if h.grh.ip_version != 6 {
                    return Err(Error::Invalid("ud_header: GRH IP version is not 6"));
                }
                if h.grh.next_header != IB_GRH_NEXT_HDR {
                    return Err(Error::Invalid("ud_header: GRH next header is not 0x1b"));
                }
                off += IB_GRH_BYTES;
            }
            _ => return Err(Error::Invalid("ud_header: LNH is raw or IP, not IBA")),
        }
        need(off, IB_BTH_BYTES + IB_DETH_BYTES)?;
        let mut b = [0u64; 11];
        packer::unpack(&BTH_TABLE, &buf[off..off + IB_BTH_BYTES], &mut b)?;
        h.bth = Bth {
            opcode: b[0] as u8,
            solicited_event: b[1] as u8,
            mig_req: b[2] as u8,
            pad_count: b[3] as u8,
            transport_header_version: b[4] as u8,
            pkey: b[5] as u16,
            destination_qpn: b[7] as u32,
            ack_req: b[8] as u8,
            psn: b[10] as u32,
        };
        off += IB_BTH_BYTES;
        h.immediate_present = match h.bth.opcode {
            IB_OPCODE_UD_SEND_ONLY => false,
            IB_OPCODE_UD_SEND_ONLY_WITH_IMMEDIATE => true,
            _ => return Err(Error::Invalid("ud_header: BTH opcode is not UD SEND ONLY")),
        };
        if h.bth.transport_header_version != 0 {
            return Err(Error::Invalid(
                "ud_header: BTH transport header version is not 0",
            ));
        }
        let mut d = [0u64; 3];
        packer::unpack(&DETH_TABLE, &buf[off..off + IB_DETH_BYTES], &mut d)?;
        h.deth = Deth {
            qkey: d[0] as u32,
            source_qpn: d[2] as u32,
        };
        off += IB_DETH_BYTES;
        if h.immediate_present {
            need(off, IB_IMM_BYTES)?;
            h.immediate_data =
                u32::from_be_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]);
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A RoCE v1 MAD leaving QP1 (Linux `build_mlx_header` on an Ethernet
    /// port): MACs, Ethertype 0x8915 (after an 802.1Q tag when tagged),
    /// then the GRH with no LRH before it.
    #[test]
    fn roce_qp1_header_golden_bytes() {
        let mut h = init(256, false, true, false).unwrap();
        h.eth = Some(EthHeader {
            dmac: [0, 2, 0xc9, 1, 2, 3],
            smac: [0, 2, 0xc9, 4, 5, 6],
            vlan_tag: None,
            ether_type: ETH_P_IBOE,
        });
        h.grh.hop_limit = 1;
        let mut buf = [0u8; 96];
        let n = h.pack(&mut buf).unwrap();
        assert_eq!(n, 14 + 40 + 12 + 8);
        assert_eq!(
            buf[..14],
            [0, 2, 0xc9, 1, 2, 3, 0, 2, 0xc9, 4, 5, 6, 0x89, 0x15]
        );
        assert_eq!(buf[14] >> 4, 6, "GRH right after the Ethernet header");
        assert_eq!(u16::from_be_bytes([buf[18], buf[19]]), 12 + 8 + 256 + 4);
        assert_eq!(buf[20], 0x1b);
        h.eth.as_mut().unwrap().vlan_tag = Some(5 << 13 | 7);
        assert_eq!(h.pack(&mut buf).unwrap(), 18 + 40 + 12 + 8);
        assert_eq!(buf[12..18], [0x81, 0, 0xa0, 7, 0x89, 0x15]);
    }

    /// A directed-route SMP leaving QP0: VL15, permissive LIDs, P_Key
    /// 0xffff, to QP0. Bytes written by hand from IBTA 7.7 (LRH), 9.2 (BTH)
    /// and 9.3.3 (DETH).
    #[test]
    fn qp0_smp_header_golden_bytes() {
        let mut h = init(256, true, false, false).unwrap();
        h.lrh.virtual_lane = 15;
        h.lrh.service_level = 0;
        h.lrh.destination_lid = 0xffff;
        h.lrh.source_lid = 0xffff;
        h.bth.pkey = 0xffff;
        h.bth.destination_qpn = 0;
        h.bth.psn = 0x12_3456;
        h.deth.qkey = 0;
        h.deth.source_qpn = 0;
        let mut buf = [0xaau8; 64];
        let n = h.pack(&mut buf).unwrap();
        assert_eq!(n, 28);
        #[rustfmt::skip]
        let want: [u8; 28] = [
            // LRH: VL 15 | LVer 0, SL 0 | LNH 2 (local), DLID, pktlen 72 words, SLID
            0xf0, 0x02, 0xff, 0xff, 0x00, 0x48, 0xff, 0xff,
            // BTH: opcode 0x64, SE/M/pad/TVer 0, P_Key, dest QPN 0, PSN
            0x64, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x12, 0x34, 0x56,
            // DETH: Q_Key 0, source QPN 0
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ];
        assert_eq!(&buf[..28], &want);
        assert_eq!(buf[28], 0xaa, "nothing written past the header");
        assert_eq!(UdHeader::unpack(&buf[..28]).unwrap(), h);
    }

    /// A GSI MAD with a GRH and an immediate, odd payload: pad, lengths,
    /// LNH 3, Q_Key and source QP 1.
    #[test]
    fn qp1_header_with_grh_and_immediate_golden_bytes() {
        let mut h = init(255, true, true, true).unwrap();
        h.lrh.virtual_lane = 0;
        h.lrh.service_level = 5;
        h.lrh.destination_lid = 0x0012;
        h.lrh.source_lid = 0x0034;
        h.grh.traffic_class = 0xab;
        h.grh.flow_label = 0x12345;
        h.grh.hop_limit = 0x40;
        h.grh.source_gid = Gid::new(0xfe80_0000_0000_0000, 0x0002_c903_0000_0001);
        h.grh.destination_gid = Gid::new(0xfe80_0000_0000_0000, 0x0002_c903_0000_0002);
        h.bth.solicited_event = 1;
        h.bth.pkey = 0x7fff;
        h.bth.destination_qpn = 1;
        h.bth.psn = 1;
        h.deth.qkey = 0x8001_0000;
        h.deth.source_qpn = 1;
        h.immediate_data = 0xdead_beef;
        let mut buf = [0u8; IB_UD_HEADER_MAX];
        assert_eq!(h.pack(&mut buf).unwrap(), IB_UD_HEADER_MAX);
        // 8 + 40 + 12 + 8 + 4 + 255 + 4 = 331 bytes -> 83 words.
        assert_eq!(
            &buf[0..8],
            &[0x00, 0x53, 0x00, 0x12, 0x00, 0x53, 0x00, 0x34]
        );
        // GRH: IPVer 6, TClass 0xab, flow 0x12345; paylen (12+8+4+255+4)=283 -> 284; nxt 0x1b; hop 0x40
        assert_eq!(
            &buf[8..16],
            &[0x6a, 0xb1, 0x23, 0x45, 0x01, 0x1c, 0x1b, 0x40]
        );
        assert_eq!(buf[16], 0xfe);
        assert_eq!(buf[16 + 15], 0x01);
        assert_eq!(buf[32 + 15], 0x02);
        // BTH: opcode 0x65, SE 1, pad 1: 0x80 | 0x10
        assert_eq!(
            &buf[48..60],
            &[0x65, 0x90, 0x7f, 0xff, 0, 0, 0, 1, 0, 0, 0, 1]
        );
        assert_eq!(&buf[60..68], &[0x80, 0x01, 0x00, 0x00, 0, 0, 0, 1]);
        assert_eq!(&buf[68..72], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(UdHeader::unpack(&buf).unwrap(), h);
    }

    /// Random bytes and every length: `unpack` answers, never panics, and
    /// what it accepts packs back to the same bytes.
    #[test]
    fn unpack_random_bytes() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut buf = [0u8; IB_UD_HEADER_MAX];
        let mut accepted = 0;
        for i in 0..30_000 {
            for b in buf.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            // Bias towards plausible headers so the deep checks are reached.
            if i % 2 == 0 {
                buf[0] &= 0xf0;
                buf[1] = (buf[1] & 0xf0) | 2 | (i as u8 & 1);
                let bth = if buf[1] & 3 == 3 { 48 } else { 8 };
                buf[bth] = 0x64 | (i as u8 >> 1 & 1);
                buf[bth + 1] &= 0xf0;
                if bth == 48 {
                    buf[8] = 0x60 | (buf[8] & 0x0f);
                    buf[14] = 0x1b;
                }
            }
            let len = (x as usize >> 8) % (IB_UD_HEADER_MAX + 1);
            if let Ok(h) = UdHeader::unpack(&buf[..len]) {
                let mut out = [0u8; IB_UD_HEADER_MAX];
                let n = h.pack(&mut out).unwrap();
                // Reserved bits are not kept, so compare the parsed view.
                assert_eq!(UdHeader::unpack(&out[..n]).unwrap(), h);
                accepted += 1;
            }
        }
        assert!(accepted > 1000, "{accepted}");
    }

    #[test]
    fn unpack_refuses_what_is_not_a_ud_send() {
        let h = init(256, true, false, false).unwrap();
        let mut buf = [0u8; 28];
        h.pack(&mut buf).unwrap();
        let mut bad = buf;
        bad[1] = 0x00; // LNH raw
        assert!(UdHeader::unpack(&bad).is_err());
        let mut bad = buf;
        bad[8] = 0x04; // RC SEND ONLY
        assert!(UdHeader::unpack(&bad).is_err());
        let mut bad = buf;
        bad[0] = 0x01; // link version 1
        assert!(UdHeader::unpack(&bad).is_err());
        let mut bad = buf;
        bad[9] = 0x01; // TVer 1
        assert!(UdHeader::unpack(&bad).is_err());
        assert_eq!(UdHeader::unpack(&buf[..20]), Err(Error::MsgSize));
        let mut small = [0u8; 10];
        assert_eq!(h.pack(&mut small), Err(Error::MsgSize));
    }
}
