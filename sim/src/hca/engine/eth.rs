//! The card's Ethernet data path: raw Ethernet QPs (mlx4_en's rings: frames sent as the WQE gathers them, with VLAN insertion, checksum offload and TCP segmentation (LSO); received frames steered to a QP by their destination MAC, spread by RSS, written to a receive WQE with the CQE's VLAN and checksum fields) and the RoCE v1 addressing of QPs on Ethernet ports.
//!
//! Left out: LSO over UD (IPoIB's), LSO of IPv6 with extension headers,
//! tunnel (VXLAN) offloads, the S-VLAN, timestamps, BlueFlame, the
//! eSwitch loopback of the `srcrb` destination MAC (SR-IOV), and RSS of
//! inner headers.
//!
//! Layouts: the raw Ethernet QP is an MLX QP (service type 7) whose port
//! runs Ethernet and which is not a special QP (Linux
//! `mlx4_en_fill_qp_context`: `flags = 7 << 16 | rss << 13`); iPXE's
//! `hermon_eth_open` uses the same type. Its send WQE is the control
//! segment and data segments (pointers or inline), the frame exactly as
//! they gather it. Control segment (Linux `struct mlx4_wqe_ctrl_seg`):
//! bytes 4-5 the 802.1Q tag to insert, byte 6 bit 6 (`MLX4_WQE_CTRL_INS_CVLAN`)
//! insert it; dword 2 bit 0 force loopback, bit 1 (iPXE: "inhibit ICRC";
//! mlx4_en sets it with every frame) leaves the ICRC alone, bits 4 and 5
//! (`MLX4_WQE_CTRL_IP_CSUM`, `TCP_UDP_CSUM`) compute the IPv4 header and
//! the TCP/UDP checksums. The RSS context sits in the QPC at the primary
//! path + 0x24 (Linux `struct mlx4_rss_context`, `MLX4_RSS_OFFSET_IN_QPC_PRI_PATH`):
//! base QPN with log2 of the rings in bits 31:24, default QPN, hash
//! function (0 XOR, 1 Toeplitz), the fields hashed, the 40-byte key. The
//! CQE of a received frame (Linux `struct mlx4_cqe`, `en_rx.c`): the
//! C-VLAN present bit (dword 0 bit 29) and the TCI in `sl_vid` when the
//! card stripped a tag, the status bits (IPv4 6, fragment 7, IPv6 8, IPv4
//! options 9, TCP 10, UDP 11, IP OK 12) and the L4 checksum (0xffff:
//! good), the RSS hash in the immediate dword.
//!
//! # Decisions
//!
//! * Checksums: the ConnectX-3 offloads Ethernet checksums without a
//!   capability bit (mlx4_en sets `NETIF_F_IP_CSUM` and `NETIF_F_RXCSUM`
//!   unconditionally), so the model computes what the WQE asks for and
//!   checks every IPv4/IPv6 TCP/UDP frame it receives; the CQE says "good"
//!   only when the checksums are right.
//! * VLANs: a tag is stripped on receive (the CQE carries it) unless the
//!   QP disabled stripping (param3 bit 30, Linux's VLAN-strip-disable when
//!   `NETIF_F_HW_VLAN_CTAG_RX` is off).
//! * A frame the port cannot send (shorter than an Ethernet header, or
//!   longer than the port's MTU, SET_PORT general) is dropped at the port
//!   and counted; its WQE completes, so a ring never stalls. A frame
//!   shorter than 60 bytes is padded.
//! * A frame for a QP whose ring is empty, or longer than the receive
//!   WQE's buffers, is dropped and counted (the WQE, if any, stays for the
//!   next frame). An empty ring is not an error on Ethernet.
//! * Force loopback (control bit 0) hands the frame to the port's own
//!   steering instead of the wire; without it, a frame to the port's own
//!   MAC goes to the wire like any other.
//! * LSO (opcode 0x0E; mlx4_en uses it when QUERY_DEV_CAP reports BLH,
//!   bit 15, which the model's default configuration leaves clear: an LSO
//!   WQE without it is a recorded bad WQE): the segment after the control segment is `MSS << 16 |
//!   header length` and the header (Ethernet, IPv4 or IPv6, TCP) padded to
//!   16 bytes (Linux `struct mlx4_wqe_lso_seg`), then the payload's data
//!   segments. Each frame is the header and up to MSS bytes, with the IP
//!   lengths, the IPv4 identification (+1 a frame), the TCP sequence
//!   number and the flags (FIN and PSH on the last frame, CWR on the first
//!   only) set, and both checksums computed, as Linux's own GSO would cut
//!   it. A header that is not TCP over IP is a bad WQE (recorded).

use super::QpEng;
use super::cq::{self, Cqe, CqeEth, Syndrome, rcv_op};
use super::exec::{self, Outcome};
use super::wqe::{self, Ctrl, MAX_SEGS, Sge};
use super::xlate::{self, Access, Seg};
use crate::fabric::LogicalState;
use crate::fabric::packet::{
    self, ETH_HLEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_ROCE, ETHERTYPE_VLAN, EthHdr,
    FCS_LEN, GRH_NXT_HDR_IBA, Grh, MIN_FRAME_FCS,
};
use crate::hca::ctx::{eqe, qpc};
use crate::hca::device::Hca;
use crate::hca::device::QpState;
use crate::hca::eth::{MAC_VALID, RqpCalc, mac_of, steer, steer_gid};
use crate::hca::layout::{get8, get16, get32};

/// CQE status bits of a received frame (`MLX4_CQE_STATUS_*`).
pub mod status {
    #![allow(missing_docs)]
    pub const IPV4: u16 = 1 << 6;
    pub const IPV4F: u16 = 1 << 7;
    pub const IPV6: u16 = 1 << 8;
    pub const IPV4OPT: u16 = 1 << 9;
    pub const TCP: u16 = 1 << 10;
    pub const UDP: u16 = 1 << 11;
    pub const IPOK: u16 = 1 << 12;
}

/// RSS hash flags (`MLX4_RSS_*`).
pub mod rss_flags {
    #![allow(missing_docs)]
    pub const UDP_IPV6: u8 = 1 << 0;
    pub const UDP_IPV4: u8 = 1 << 1;
    pub const TCP_IPV6: u8 = 1 << 2;
    pub const IPV6: u8 = 1 << 3;
    pub const TCP_IPV4: u8 = 1 << 4;
    pub const IPV4: u8 = 1 << 5;
}

/// The RoCE fields of a QP's primary path (Linux `mlx4_set_path` on an
/// Ethernet port: `grh_mylmc` = GRH bit | source MAC index, `dmac` at
/// path offset 0x26, `vlan_index` at 0x21 used when `fl` bit 6 is set, the
/// SL in `sched_queue` bits 5:3, `mgid_index` the source GID index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RocePath {
    /// The GRH bit (mandatory: INIT2RTR refuses a path without it).
    pub grh: bool,
    /// Destination MAC.
    pub dmac: [u8; 6],
    /// Source MAC's index in the MAC table.
    pub smac_idx: u8,
    /// VLAN table index, if the path is tagged.
    pub vlan_idx: Option<u8>,
    /// Source GID index.
    pub sgid_idx: u8,
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Traffic class.
    pub tclass: u8,
    /// Flow label.
    pub flow: u32,
    /// Hop limit.
    pub hop: u8,
    /// Service level (the VLAN PCP).
    pub sl: u8,
}

impl RocePath {
    /// Decodes the path at `p` of context `b`.
    pub fn decode(b: &[u8], p: usize) -> RocePath {
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&b[p + 0x10..p + 0x20]);
        let mut dmac = [0u8; 6];
        dmac.copy_from_slice(&b[p + 0x26..p + 0x2c]);
        let tf = get32(b, p + 0x0c);
        RocePath {
            grh: get8(b, p + 5) & 0x80 != 0,
            dmac,
            smac_idx: get8(b, p + 5) & 0x7f,
            vlan_idx: (get8(b, p) & 0x40 != 0).then(|| get8(b, p + 0x21) & 0x7f),
            sgid_idx: get8(b, p + 9),
            dgid,
            tclass: (tf >> 20) as u8,
            flow: tf & 0xf_ffff,
            hop: get8(b, p + 0x0b),
            sl: (get8(b, p + qpc::PATH_SCHED_QUEUE) >> 3) & 7,
        }
    }
}

/// A raw Ethernet QP's RSS context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rss {
    /// The first ring's QPN.
    pub base_qpn: u32,
    /// log2 of the rings.
    pub log_n: u8,
    /// Where frames that are not hashed go.
    pub default_qpn: u32,
    /// 0 XOR, 1 Toeplitz.
    pub hash_fn: u8,
    /// The fields hashed ([`rss_flags`]).
    pub flags: u8,
    /// The Toeplitz key.
    pub key: [u8; 40],
}

impl Rss {
    /// Decodes the RSS context of QPC `b`.
    pub fn decode(b: &[u8]) -> Rss {
        let o = qpc::PRI_PATH + 0x24;
        let bq = get32(b, o);
        let mut key = [0u8; 40];
        key.copy_from_slice(&b[o + 0x0c..o + 0x34]);
        Rss {
            base_qpn: bq & 0xff_ffff,
            log_n: (bq >> 24) as u8 & 0x1f,
            default_qpn: get32(b, o + 4) & 0xff_ffff,
            hash_fn: get8(b, o + 0x0a),
            flags: get8(b, o + 0x0b),
            key,
        }
    }
}

/// The port `port` runs Ethernet.
pub fn port_is_eth(hca: &Hca, port: u8) -> bool {
    hca.port_index(u32::from(port))
        .is_some_and(|i| hca.ports[i].is_eth())
}

/// The Ethernet header and GRH a RoCE packet from `port` gets: the source
/// MAC from the MAC table (the port's own MAC while the driver has
/// written none), the source GID from the RoCE GID table; `Err` says what
/// the address cannot be (a bad WQE or path).
#[allow(clippy::too_many_arguments)]
pub fn roce_link(
    hca: &Hca,
    port: u8,
    smac_idx: u8,
    dmac: [u8; 6],
    vlan: Option<u16>,
    sgid_idx: u8,
    dgid: [u8; 16],
    tclass: u8,
    flow: u32,
    hop: u8,
) -> Result<(EthHdr, Grh), String> {
    let i = hca
        .port_index(u32::from(port))
        .ok_or_else(|| format!("no port {port}"))?;
    let e = &hca.ports[i].eth;
    let src = if e.macs.iter().any(|m| m & MAC_VALID != 0) {
        let m = e.macs.get(usize::from(smac_idx)).copied().unwrap_or(0);
        if m & MAC_VALID == 0 {
            return Err(format!(
                "source MAC index {smac_idx} is not a valid entry of port {port}'s MAC table"
            ));
        }
        mac_of(m)
    } else {
        e.mac
    };
    if dgid.iter().all(|&b| b == 0) {
        return Err("no GRH: the destination GID is zero (RoCE needs a GRH)".into());
    }
    let sgid = e
        .gids
        .get(usize::from(sgid_idx))
        .copied()
        .unwrap_or([0; 16]);
    if sgid.iter().all(|&b| b == 0) {
        return Err(format!(
            "source GID index {sgid_idx} is an empty entry of port {port}'s RoCE GID table"
        ));
    }
    Ok((
        EthHdr {
            dst: dmac,
            src,
            vlan,
            ethertype: ETHERTYPE_ROCE,
        },
        Grh {
            ip_ver: 6,
            tclass,
            flow_label: flow & 0xf_ffff,
            pay_len: 0,
            nxt_hdr: GRH_NXT_HDR_IBA,
            hop_lmt: hop,
            sgid,
            dgid,
        },
    ))
}

/// The RoCE addressing of connected QP `q` (its primary path).
pub fn path_link(hca: &Hca, q: &QpEng) -> Result<(EthHdr, Grh), String> {
    let r = q.roce.ok_or("no RoCE path")?;
    if !r.grh {
        return Err("the path has no GRH (RoCE needs one)".into());
    }
    let vlan = match r.vlan_idx {
        Some(vi) => {
            let i = hca.port_index(u32::from(q.port)).ok_or("no port")?;
            let v = hca.ports[i]
                .eth
                .vlans
                .get(usize::from(vi))
                .copied()
                .unwrap_or(0);
            if v & crate::hca::eth::VLAN_VALID == 0 {
                return Err(format!("VLAN index {vi} is not a valid VLAN table entry"));
            }
            Some((v & 0xfff) as u16 | u16::from(r.sl) << 13)
        }
        None => None,
    };
    roce_link(
        hca, q.port, r.smac_idx, r.dmac, vlan, r.sgid_idx, r.dgid, r.tclass, r.flow, r.hop,
    )
}

// ------------------------------------------------------------------ TX

/// The most an LSO WQE may carry (header and payload): Linux's GSO
/// limit, 64 KiB, with room to spare.
const LSO_MAX: u64 = 256 << 10;

/// Sends one raw Ethernet WQE of QP `q` (see the module doc): a SEND is
/// one frame, an LSO as many as its payload needs at its MSS.
pub(super) fn raw_send(hca: &mut Hca, q: &QpEng, ctrl: &Ctrl, wqe: &[u8]) -> Outcome {
    let qpn = q.qpn;
    let lso = ctrl.opcode == wqe::op::LSO;
    if ctrl.opcode != wqe::op::SEND && !lso {
        hca.violation(format!(
            "QP {qpn:#x} (raw Ethernet): opcode {:#04x}; a raw Ethernet QP sends SEND and LSO WQEs",
            ctrl.opcode
        ));
        return Outcome::Fail(Syndrome::LocalQpOp);
    }
    if lso && hca.caps().flags & crate::hca::layout::cap_flags::BLH == 0 {
        hca.violation(format!(
            "QP {qpn:#x}: an LSO WQE, but QUERY_DEV_CAP did not report BLH (bit 15)"
        ));
        return Outcome::Fail(Syndrome::LocalQpOp);
    }
    // LSO: the segment after the control segment holds MSS << 16 | the
    // header's length, then the header, padded to 16 bytes.
    let (from, lso_hdr) = if lso {
        let mh = if wqe.len() >= 20 { get32(wqe, 16) } else { 0 };
        let (mss, hlen) = (mh >> 16, (mh & 0xffff) as usize);
        if mss == 0 || hlen < ETH_HLEN || 20 + hlen > wqe.len() {
            hca.violation(format!(
                "QP {qpn:#x} LSO WQE: MSS {mss} and header of {hlen} bytes in a {}-byte WQE",
                wqe.len()
            ));
            return Outcome::Fail(Syndrome::LocalQpOp);
        }
        (
            (20 + hlen).next_multiple_of(16),
            Some((mss, &wqe[20..20 + hlen])),
        )
    } else {
        (16, None)
    };
    let mut sges = [Sge::None; MAX_SEGS];
    let n = match wqe::parse_gather(wqe, from, wqe.len(), &mut sges) {
        Ok(n) => n,
        Err(e) => {
            hca.violation(format!("QP {qpn:#x} raw Ethernet WQE malformed ({e:?})"));
            return Outcome::Fail(Syndrome::LocalQpOp);
        }
    };
    let mut segs = [Seg::default(); MAX_SEGS];
    let mut len = 0u64;
    for (k, s) in sges[..n].iter().enumerate() {
        segs[k] = match *s {
            Sge::None => Seg::default(),
            Sge::Inline { off, len: l } => Seg {
                addr: u64::from(off),
                len: u64::from(l),
                xl: None,
            },
            Sge::Ptr { len: l, lkey, addr } => {
                match xlate::check(hca, lkey, q.pd, Access::LocalRead, addr, l, q.rlkey) {
                    Ok(xl) => Seg {
                        addr,
                        len: l,
                        xl: Some(xl),
                    },
                    Err(_) => return Outcome::Fail(Syndrome::LocalProt),
                }
            }
        };
        len += segs[k].len;
    }
    let Some(pi) = hca.port_index(u32::from(q.port)) else {
        return Outcome::Fail(Syndrome::LocalQpOp);
    };
    let mtu = u64::from(hca.ports[pi].eth.mtu);
    let byte_cnt = len as u32;
    let flags = get32(wqe, 8);
    let frames = match lso_hdr {
        None => {
            // A frame that cannot leave (nor fit the buffer) is not read.
            if len < ETH_HLEN as u64 || len + FCS_LEN as u64 > mtu.max(MIN_FRAME_FCS as u64) + 4 {
                if len < ETH_HLEN as u64 {
                    hca.violation(format!(
                        "QP {qpn:#x}: a {len}-byte frame is shorter than an Ethernet header; dropped"
                    ));
                }
                hca.ports[pi].eth.counters.tx_dropped += 1;
                return Outcome::Done { byte_cnt };
            }
            let mut frame = vec![0u8; len as usize];
            if xlate::gather(hca, &segs[..n], wqe, 0, &mut frame).is_err() {
                return Outcome::Fail(Syndrome::LocalProt);
            }
            vec![frame]
        }
        Some((mss, hdr)) => {
            if len > LSO_MAX {
                hca.violation(format!(
                    "QP {qpn:#x} LSO WQE: {len} bytes of payload (at most {LSO_MAX})"
                ));
                return Outcome::Fail(Syndrome::LocalQpOp);
            }
            let mut payload = vec![0u8; len as usize];
            if xlate::gather(hca, &segs[..n], wqe, 0, &mut payload).is_err() {
                return Outcome::Fail(Syndrome::LocalProt);
            }
            match lso_segments(hdr, &payload, mss as usize) {
                Ok(f) => f,
                Err(why) => {
                    hca.violation(format!("QP {qpn:#x} LSO WQE: {why}"));
                    return Outcome::Fail(Syndrome::LocalQpOp);
                }
            }
        }
    };
    let force_lb = flags & 1 != 0;
    for mut frame in frames {
        // 802.1Q insertion (control bytes 4-6).
        if get8(wqe, 6) & 0x40 != 0 {
            let tci = get16(wqe, 4);
            let mut t = [0u8; 4];
            t[..2].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            t[2..].copy_from_slice(&tci.to_be_bytes());
            frame.splice(12..12, t);
        }
        if frame.len() + FCS_LEN > usize::from(hca.ports[pi].eth.mtu) {
            hca.ports[pi].eth.counters.tx_dropped += 1;
            continue;
        }
        // Checksums: as the control segment asks; every segment of an LSO.
        let (ip, l4) = (flags & 1 << 4 != 0, flags & 1 << 5 != 0);
        if ip || l4 || lso {
            tx_checksums(&mut frame, ip || lso, l4 || lso);
        }
        if !lso && flags & 2 == 0 && packet::is_roce(&frame) {
            // The last four bytes are the ICRC's room: the card fills it.
            if let Ok(h) = EthHdr::parse(&frame) {
                let n = frame.len();
                if n >= h.len() + 4 {
                    let i = packet::roce_icrc(&frame[h.len()..n - 4]);
                    frame[n - 4..].copy_from_slice(&i.to_le_bytes());
                }
            }
        }
        packet::finish_frame(&mut frame, false);
        send_frame(hca, q.port, frame, force_lb);
    }
    Outcome::Done { byte_cnt }
}

/// The frames of an LSO: `hdr` (Ethernet, IPv4 or IPv6 without extension
/// headers, TCP; the header the driver copied) before each `mss` bytes of
/// `payload`, with the IPv4 total length and identification (+1 per
/// segment) or the IPv6 payload length, the TCP sequence number, and the
/// TCP flags FIN and PSH on the last segment only and CWR on the first
/// only; the checksums are the caller's.
fn lso_segments(hdr: &[u8], payload: &[u8], mss: usize) -> Result<Vec<Vec<u8>>, String> {
    let (l3, ty) = l3(hdr).ok_or("the header does not start with an Ethernet header")?;
    let (l4, v4) = match ty {
        ETHERTYPE_IPV4 => {
            let ihl = usize::from(hdr.get(l3).copied().unwrap_or(0) & 0xf) * 4;
            if hdr.get(l3).map(|b| b >> 4) != Some(4) || ihl < 20 || hdr.get(l3 + 9) != Some(&6) {
                return Err("not an IPv4 TCP header".into());
            }
            (l3 + ihl, true)
        }
        ETHERTYPE_IPV6 => {
            if hdr.get(l3).map(|b| b >> 4) != Some(6) || hdr.get(l3 + 6) != Some(&6) {
                return Err("not an IPv6 TCP header (extension headers are not segmented)".into());
            }
            (l3 + 40, false)
        }
        t => return Err(format!("Ethertype {t:#06x} is not IPv4 or IPv6")),
    };
    let thl = usize::from(hdr.get(l4 + 12).copied().unwrap_or(0) >> 4) * 4;
    if thl < 20 || l4 + thl != hdr.len() {
        return Err(format!(
            "the header is {} bytes but ends its TCP header at {}",
            hdr.len(),
            l4 + thl
        ));
    }
    let seq0 = u32::from_be_bytes([hdr[l4 + 4], hdr[l4 + 5], hdr[l4 + 6], hdr[l4 + 7]]);
    let id0 = u16::from_be_bytes([hdr[l3 + 4], hdr[l3 + 5]]);
    let chunks: Vec<&[u8]> = if payload.is_empty() {
        vec![&[]]
    } else {
        payload.chunks(mss).collect()
    };
    let last = chunks.len() - 1;
    Ok(chunks
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let mut f = Vec::with_capacity(hdr.len() + c.len());
            f.extend_from_slice(hdr);
            f.extend_from_slice(c);
            if v4 {
                let total = (l4 - l3 + thl + c.len()) as u16;
                f[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
                let id = id0.wrapping_add(k as u16);
                f[l3 + 4..l3 + 6].copy_from_slice(&id.to_be_bytes());
            } else {
                let pl = (thl + c.len()) as u16;
                f[l3 + 4..l3 + 6].copy_from_slice(&pl.to_be_bytes());
            }
            let seq = seq0.wrapping_add((k * mss) as u32);
            f[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
            if k != last {
                f[l4 + 13] &= !(0x01 | 0x08);
            }
            if k != 0 {
                f[l4 + 13] &= !0x80;
            }
            f
        })
        .collect())
}

/// Sends `frame` (padded, FCS owed) out of Ethernet port `port`, or hands
/// it to the port's own receive side (`force_lb`): counted either way.
pub(super) fn send_frame(hca: &mut Hca, port: u8, frame: Vec<u8>, force_lb: bool) {
    let Some(pi) = hca.port_index(u32::from(port)) else {
        return;
    };
    let up = hca.ports[pi].state == LogicalState::Active;
    if force_lb {
        if up {
            rx_frame(hca, port, &frame, true);
        }
        return;
    }
    if !up || !super::wire::attached(hca, port) {
        hca.ports[pi].eth.counters.tx_dropped += 1;
        return;
    }
    // Counted by the wire (`transmit_frame`).
    super::wire::transmit_owed(hca, port, frame);
}

/// The ones-complement sum of `b` (16-bit big-endian words) added to `acc`.
fn sum16(mut acc: u32, b: &[u8]) -> u32 {
    let mut it = b.chunks_exact(2);
    for w in &mut it {
        acc += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [x] = it.remainder() {
        acc += u32::from(*x) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Where the L3 header of a frame starts, and its Ethertype.
fn l3(frame: &[u8]) -> Option<(usize, u16)> {
    let h = EthHdr::parse(frame).ok()?;
    Some((h.len(), h.ethertype))
}

/// The IP facts of a frame: L3 offset, L4 offset, protocol (6, 17, other),
/// L4 length, the pseudo-header sum, IPv4 or not, and for IPv4 whether it
/// is a fragment and has options.
struct Ip {
    l3: usize,
    l4: usize,
    proto: u8,
    l4_len: usize,
    pseudo: u32,
    v4: bool,
    frag: bool,
    opts: bool,
}

fn ip_of(frame: &[u8]) -> Option<Ip> {
    let (o, t) = l3(frame)?;
    match t {
        ETHERTYPE_IPV4 => {
            let h = frame.get(o..o + 20)?;
            if h[0] >> 4 != 4 {
                return None;
            }
            let ihl = usize::from(h[0] & 0xf) * 4;
            let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
            if ihl < 20 || total < ihl || o + total > frame.len() {
                return None;
            }
            let proto = h[9];
            let l4_len = total - ihl;
            let mut pseudo = sum16(0, &h[12..20]);
            pseudo += u32::from(proto) + l4_len as u32;
            let ff = u16::from_be_bytes([h[6], h[7]]);
            Some(Ip {
                l3: o,
                l4: o + ihl,
                proto,
                l4_len,
                pseudo,
                v4: true,
                frag: ff & 0x3fff != 0,
                opts: ihl > 20,
            })
        }
        ETHERTYPE_IPV6 => {
            let h = frame.get(o..o + 40)?;
            if h[0] >> 4 != 6 {
                return None;
            }
            let l4_len = usize::from(u16::from_be_bytes([h[4], h[5]]));
            if o + 40 + l4_len > frame.len() {
                return None;
            }
            let proto = h[6];
            let mut pseudo = sum16(0, &h[8..40]);
            pseudo += u32::from(proto) + l4_len as u32;
            Some(Ip {
                l3: o,
                l4: o + 40,
                proto,
                l4_len,
                pseudo,
                v4: false,
                frag: false,
                opts: false,
            })
        }
        _ => None,
    }
}

/// The offset of the L4 checksum of `proto` (TCP 16, UDP 6).
fn l4_csum_off(proto: u8) -> Option<usize> {
    match proto {
        6 => Some(16),
        17 => Some(6),
        _ => None,
    }
}

/// Checksum offload of a frame being sent: the IPv4 header checksum
/// (`ip`), the TCP or UDP checksum (`l4`).
fn tx_checksums(frame: &mut [u8], ip: bool, l4: bool) {
    let Some(x) = ip_of(frame) else { return };
    if ip && x.v4 {
        let ihl = x.l4 - x.l3;
        frame[x.l3 + 10] = 0;
        frame[x.l3 + 11] = 0;
        let c = !fold(sum16(0, &frame[x.l3..x.l3 + ihl]));
        frame[x.l3 + 10..x.l3 + 12].copy_from_slice(&c.to_be_bytes());
    }
    if l4 && !x.frag {
        let Some(co) = l4_csum_off(x.proto) else {
            return;
        };
        let end = x.l4 + x.l4_len;
        if x.l4 + co + 2 > end {
            return;
        }
        frame[x.l4 + co] = 0;
        frame[x.l4 + co + 1] = 0;
        let mut c = !fold(sum16(x.pseudo, &frame[x.l4..end]));
        if x.proto == 17 && c == 0 {
            c = 0xffff;
        }
        frame[x.l4 + co..x.l4 + co + 2].copy_from_slice(&c.to_be_bytes());
    }
}

/// What the card says of a received frame's checksums: the CQE status
/// bits and checksum field.
fn rx_checksums(frame: &[u8]) -> (u16, u16) {
    let Some(x) = ip_of(frame) else {
        return (0, 0);
    };
    let mut st = 0u16;
    let mut ip_ok = true;
    if x.v4 {
        st |= status::IPV4;
        if x.frag {
            st |= status::IPV4F;
        }
        if x.opts {
            st |= status::IPV4OPT;
        }
        ip_ok = fold(sum16(0, &frame[x.l3..x.l4])) == 0xffff;
    } else {
        st |= status::IPV6;
    }
    if ip_ok {
        st |= status::IPOK;
    }
    let mut csum = 0u16;
    match x.proto {
        6 => st |= status::TCP,
        17 => st |= status::UDP,
        _ => return (st, 0),
    }
    if !x.frag {
        let end = x.l4 + x.l4_len;
        csum = fold(sum16(x.pseudo, &frame[x.l4..end]));
        // A UDP datagram without a checksum (IPv4 only) is good as it is.
        if x.proto == 17 && x.v4 && frame.get(x.l4 + 6..x.l4 + 8) == Some(&[0, 0]) {
            csum = 0xffff;
        }
    }
    (st, csum)
}

// ------------------------------------------------------------------ RX

/// A frame (FCS included; `owed`: its FCS is still owed) arriving at
/// Ethernet port `port`: checked, counted, then RoCE to the transport and
/// anything else to the raw QPs its destination MAC is steered to.
pub fn rx_frame(hca: &mut Hca, port: u8, bytes: &[u8], owed: bool) {
    let Some(pi) = hca.port_index(u32::from(port)) else {
        return;
    };
    if hca.ports[pi].state != LogicalState::Active {
        return;
    }
    let mtu = usize::from(hca.ports[pi].eth.mtu);
    let c = &mut hca.ports[pi].eth.counters;
    if bytes.len() < MIN_FRAME_FCS {
        c.rx_runt += 1;
        return;
    }
    if bytes.len() > mtu {
        c.rx_too_long += 1;
        return;
    }
    if !owed && packet::check_fcs(bytes).is_err() {
        c.rx_bad_fcs += 1;
        return;
    }
    let frame = &bytes[..bytes.len() - FCS_LEN];
    let Ok(h) = EthHdr::parse(frame) else {
        c.rx_runt += 1;
        return;
    };
    c.rx_frames += 1;
    c.rx_bytes += bytes.len() as u64;
    if h.dst == packet::BROADCAST {
        c.rx_broadcast += 1;
    } else if packet::is_group_mac(&h.dst) {
        c.rx_multicast += 1;
    }
    let pe = &hca.ports[pi].eth;
    if let Some(vid) = h.vid()
        && !pe.in_vlan(vid)
    {
        hca.ports[pi].eth.counters.rx_vlan_drop += 1;
        return;
    }
    if h.ethertype == ETHERTYPE_ROCE {
        super::wire::roce_rx(hca, port, bytes, owed, &h);
        return;
    }
    if packet::is_group_mac(&h.dst) && !pe.mcast_passes(&h.dst) {
        hca.ports[pi].eth.counters.rx_mcast_filtered += 1;
        return;
    }
    let qps = steer_frame(hca, port, &h);
    if qps.is_empty() {
        hca.ports[pi].eth.counters.rx_no_steer += 1;
        return;
    }
    for qpn in qps {
        deliver(hca, port, qpn, frame, &h);
    }
}

/// The QPs a frame with header `h` arriving at `port` is steered to (the
/// order in [`crate::hca::eth`]).
fn steer_frame(hca: &mut Hca, port: u8, h: &EthHdr) -> Vec<u32> {
    let group = packet::is_group_mac(&h.dst);
    let st = if group { steer::MC } else { steer::UC };
    let gid = steer_gid(port, st, &h.dst);
    if let Some(m) = crate::hca::fw::mcg::eth_members(hca, &gid) {
        return m
            .iter()
            .map(|w| w & crate::hca::fw::mcg::QPN_MASK)
            .collect();
    }
    let Some(pi) = hca.port_index(u32::from(port)) else {
        return Vec::new();
    };
    let pe = &hca.ports[pi].eth;
    if !pe.promisc[usize::from(st)].is_empty() {
        return pe.promisc[usize::from(st)]
            .iter()
            .map(|w| w & crate::hca::fw::mcg::QPN_MASK)
            .collect();
    }
    let Some(r) = pe.rqp else {
        return Vec::new();
    };
    if group {
        return match r.mc_promisc_mode {
            2 => vec![r.mcast_qpn],
            _ => Vec::new(),
        };
    }
    match pe.mac_index(&h.dst) {
        Some(i) if i < 1 << r.n_mac.min(7) => vec![r.base_qpn + vlan_offset(pe, &r, h) + i as u32],
        _ if r.uc_promisc => vec![r.promisc_qpn],
        _ => Vec::new(),
    }
}

/// The VLAN part of an RQP_CALC QPN: `vlan index << n_mac` when the
/// calculation uses VLANs.
fn vlan_offset(pe: &crate::hca::eth::EthPort, r: &RqpCalc, h: &EthHdr) -> u32 {
    if r.n_vlan == 0 {
        return 0;
    }
    let vi = match h.vid() {
        None | Some(0) => u32::from(r.no_vlan),
        Some(v) => pe
            .vlan_index(v)
            .map_or(u32::from(r.vlan_miss), |i| i as u32),
    };
    (vi & ((1 << r.n_vlan) - 1)) << r.n_mac
}

/// The Toeplitz hash of `input` under `key`.
pub fn toeplitz(key: &[u8; 40], input: &[u8]) -> u32 {
    let mut h = 0u32;
    let mut window = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
    for (i, &b) in input.iter().enumerate() {
        for bit in (0..8).rev() {
            if b >> bit & 1 != 0 {
                h ^= window;
            }
            let next_bit = {
                let k = (i * 8 + (7 - bit) + 32) / 8;
                let kb = key.get(k).copied().unwrap_or(0);
                (kb >> (7 - ((i * 8 + (7 - bit) + 32) % 8))) & 1
            };
            window = window << 1 | u32::from(next_bit);
        }
    }
    h
}

/// The ring an RSS QP sends `frame` to, and the hash (None: the default
/// QPN, not hashed).
fn rss_target(r: &Rss, frame: &[u8]) -> (u32, Option<u32>) {
    let Some(x) = ip_of(frame) else {
        return (r.default_qpn, None);
    };
    let mut input = Vec::with_capacity(36);
    let (ip_flag, tcp_flag, udp_flag) = if x.v4 {
        (rss_flags::IPV4, rss_flags::TCP_IPV4, rss_flags::UDP_IPV4)
    } else {
        (rss_flags::IPV6, rss_flags::TCP_IPV6, rss_flags::UDP_IPV6)
    };
    let addrs = if x.v4 {
        &frame[x.l3 + 12..x.l3 + 20]
    } else {
        &frame[x.l3 + 8..x.l3 + 40]
    };
    let ports = match x.proto {
        6 if r.flags & tcp_flag != 0 && !x.frag => true,
        17 if r.flags & udp_flag != 0 && !x.frag => true,
        _ => false,
    };
    if !ports && r.flags & ip_flag == 0 {
        return (r.default_qpn, None);
    }
    input.extend_from_slice(addrs);
    if ports && let Some(p) = frame.get(x.l4..x.l4 + 4) {
        input.extend_from_slice(p);
    }
    let h = if r.hash_fn == 1 {
        toeplitz(&r.key, &input)
    } else {
        input.chunks(4).fold(0u32, |a, c| {
            a ^ u32::from_be_bytes([c[0], c[1], c[2], c[3]])
        })
    };
    let mask = (1u32 << r.log_n.min(16)) - 1;
    (r.base_qpn + (h & mask), Some(h))
}

/// Hands `frame` (without FCS) to raw Ethernet QP `qpn` of `port`: through
/// its RSS context to a ring, the tag stripped, into a receive WQE.
fn deliver(hca: &mut Hca, port: u8, qpn: u32, frame: &[u8], h: &EthHdr) {
    let Some(pi) = hca.port_index(u32::from(port)) else {
        return;
    };
    let ready = matches!(
        hca.qps.get(&qpn).map(|r| r.state),
        Some(QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqer)
    );
    let q = match hca.engine.qps.get(&qpn) {
        Some(q) if ready && q.raw_eth && q.port == port => q.for_send(),
        _ => {
            hca.ports[pi].eth.counters.rx_bad_qp += 1;
            return;
        }
    };
    if let Some(r) = q.rss {
        // To a ring (itself no RSS QP: deliver_hashed refuses one).
        let (t, hash) = rss_target(&r, frame);
        deliver_hashed(hca, port, t, frame, h, hash);
        return;
    }
    deliver_hashed(hca, port, q.qpn, frame, h, None);
}

fn deliver_hashed(hca: &mut Hca, port: u8, qpn: u32, frame: &[u8], h: &EthHdr, hash: Option<u32>) {
    let Some(pi) = hca.port_index(u32::from(port)) else {
        return;
    };
    let ready = matches!(
        hca.qps.get(&qpn).map(|r| r.state),
        Some(QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqer)
    );
    let q = match hca.engine.qps.get(&qpn) {
        Some(q) if ready && q.raw_eth && q.port == port && q.rss.is_none() => q.for_send(),
        _ => {
            hca.ports[pi].eth.counters.rx_bad_qp += 1;
            return;
        }
    };
    // Strip the tag unless the QP keeps it.
    let (data, vlan): (std::borrow::Cow<'_, [u8]>, Option<u16>) = match h.vlan {
        Some(tci) if !q.vsd => {
            let mut v = Vec::with_capacity(frame.len() - 4);
            v.extend_from_slice(&frame[..12]);
            v.extend_from_slice(&frame[16..]);
            (v.into(), Some(tci))
        }
        _ => (frame.into(), None),
    };
    let (st, csum) = rx_checksums(&data);
    let mut sc = exec::take_scratch(&mut hca.engine.rx_scratch);
    let r = exec::rq_peek(hca, &q, &mut sc);
    let Some(r) = r else {
        hca.engine.rx_scratch = Some(sc);
        hca.ports[pi].eth.counters.rx_no_wqe += 1;
        return;
    };
    if r.malformed {
        hca.engine.rx_scratch = Some(sc);
        let _ = exec::malformed_rwqe(hca, &q, &r);
        return;
    }
    let room: u64 = sc.sges[..r.n].iter().map(|s| s.len()).sum();
    if room < data.len() as u64 {
        hca.engine.rx_scratch = Some(sc);
        hca.ports[pi].eth.counters.rx_too_long_for_wqe += 1;
        return;
    }
    let mut segs = Vec::with_capacity(r.n);
    let mut need = data.len() as u64;
    let mut bad = false;
    for s in &sc.sges[..r.n] {
        let Sge::Ptr { len, lkey, addr } = *s else {
            continue;
        };
        if need == 0 {
            break;
        }
        let used = len.min(need);
        match xlate::check(hca, lkey, q.pd, Access::LocalWrite, addr, used, q.rlkey) {
            Ok(xl) => segs.push(Seg {
                addr,
                len: used,
                xl: Some(xl),
            }),
            Err(_) => {
                bad = true;
                break;
            }
        }
        need -= used;
    }
    hca.engine.rx_scratch = Some(sc);
    if bad || xlate::scatter(hca, &segs, 0, &data).is_err() {
        let _ = exec::responder_error(
            hca,
            &q,
            Some(&r),
            Some(Syndrome::LocalProt),
            eqe::WQ_ACCESS_ERROR,
            Syndrome::RemoteOp,
        );
        return;
    }
    exec::rq_commit(hca, q.qpn, &r);
    hca.engine.stats.received += 1;
    hca.ports[pi].eth.counters.rx_delivered += 1;
    let c = Cqe {
        qpn: q.qpn,
        opcode: rcv_op::SEND,
        byte_cnt: data.len() as u32,
        wqe_counter: r.counter,
        eth: Some(CqeEth {
            vlan,
            smac: None,
            status: st,
            checksum: csum,
            rss_hash: hash,
        }),
        ..Cqe::default()
    };
    cq::push(hca, q.rcq, &c);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Toeplitz hash of Microsoft's RSS verification suite (the key
    /// and the first IPv4 TCP vector: 66.9.149.187:2794 -> 161.142.100.80:1766).
    #[test]
    fn toeplitz_matches_the_rss_verification_vector() {
        let key: [u8; 40] = [
            0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
            0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
            0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
        ];
        let input = [66, 9, 149, 187, 161, 142, 100, 80, 0x0a, 0xea, 0x06, 0xe6];
        assert_eq!(toeplitz(&key, &input), 0x51cc_c178);
        assert_eq!(toeplitz(&key, &input[..8]), 0x323e_8fc2);
    }

    #[test]
    fn checksums_computed_on_send_verify_on_receive() {
        // An IPv4 UDP frame with zeroed checksums.
        let mut f = vec![0u8; 14 + 20 + 8 + 5];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&(20u16 + 13).to_be_bytes());
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
        f[34..36].copy_from_slice(&1234u16.to_be_bytes());
        f[36..38].copy_from_slice(&5678u16.to_be_bytes());
        f[38..40].copy_from_slice(&13u16.to_be_bytes());
        f[42..].copy_from_slice(b"hello");
        tx_checksums(&mut f, true, true);
        assert_ne!(&f[24..26], &[0, 0]);
        let (st, c) = rx_checksums(&f);
        assert_eq!(st, status::IPV4 | status::IPOK | status::UDP);
        assert_eq!(c, 0xffff);
        f[43] ^= 1;
        assert_ne!(rx_checksums(&f).1, 0xffff, "a flipped bit is seen");
        f[43] ^= 1;
        f[24] ^= 1;
        assert_eq!(rx_checksums(&f).0 & status::IPOK, 0, "a bad IP header");
    }
}
