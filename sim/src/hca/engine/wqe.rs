//! Work-queue entry formats as the card reads them.
//!
//! The send control segment, remote-address, atomic, UD datagram (address vector),
//! data and inline segments, the MLX control segment of QP0/QP1, receive scatter
//! lists with their terminator and the SRQ "next" segment (the bind and
//! local-invalidate segments are read by [`super::mw`], the LSO segment of a raw
//! Ethernet QP by [`super::eth`]); fast registration and XRC segments are not
//! decoded (their opcodes fail as unsupported), nor LSO on other QPs.
//!
//! Offsets from iPXE `MT25408_PRM.h` (`hermonprm_wqe_segment_ctrl_send_st`,
//! `hermonprm_ud_address_vector_st`, `hermonprm_wqe_segment_data_ptr_st`,
//! `hermonprm_wqe_segment_ctrl_mlx_st`) and the porting map 6.1-6.5, checked
//! against Linux 3.11 `include/linux/mlx4/qp.h` and rdma-core libmlx4
//! `wqe.h`.
//!
//! # Where the readings differ
//!
//! * Control segment completion bits (0x08 bits 3:2): iPXE documents only
//!   `0b00` (no CQE) and `0b11` (CQE); Linux writes `0xc` or nothing. The
//!   model treats `0b11` as signalled, `0b00` as unsignalled, and records the
//!   two reserved encodings as a violation (and treats them as unsignalled).
//! * Data segment byte count 0: the PRM reads it as 2^31 bytes; libmlx4
//!   writes zero-length gathers as `0x80000000` (an inline segment of 0
//!   bytes, which occupies the same 16 bytes). The model follows the PRM:
//!   a plain 0 is 2 GiB and fails the bounds check if it is ever used.
//! * Receive terminator: Linux writes byte count 0, L_Key `0x100`
//!   (`MLX4_INVALID_LKEY`), address 0; the PRM names only the L_Key. The
//!   model ends the list at L_Key `0x100` whatever the other fields hold.
//! * Address vector 0x04 (iPXE `rlid`/`g`/`my_lid_path_bits` in one dword):
//!   Linux's `mlx4_av` splits it into `reserved1` (0x04), `g_slid` (0x05) and
//!   `dlid` (0x06). Same bits.
//! * The Ethernet address vector (RoCE; Linux `mlx4_eth_av`, iPXE has
//!   none): byte 5 is the source MAC's index in the MAC table (no GRH bit:
//!   the GRH is always there), the SL is bits 31:29 of dword 3, the 802.1Q
//!   tag is at 0x28 (0xffff: none) and the destination MAC at 0x2a, where
//!   the datagram segment has its `vlan` and `mac` (`set_datagram_seg`).

use crate::hca::layout::{get8, get16, get32, get64};

/// Send opcodes (control segment bits 4:0).
pub mod op {
    #![allow(missing_docs)]
    pub const NOP: u8 = 0x00;
    pub const SEND_INVAL: u8 = 0x01;
    pub const RDMA_WRITE: u8 = 0x08;
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    pub const SEND: u8 = 0x0a;
    pub const SEND_IMM: u8 = 0x0b;
    pub const LSO: u8 = 0x0e;
    pub const RDMA_READ: u8 = 0x10;
    pub const ATOMIC_CS: u8 = 0x11;
    pub const ATOMIC_FA: u8 = 0x12;
    pub const MASKED_ATOMIC_CS: u8 = 0x14;
    pub const MASKED_ATOMIC_FA: u8 = 0x15;
    pub const BIND_MW: u8 = 0x18;
    pub const FMR: u8 = 0x19;
    pub const LOCAL_INVAL: u8 = 0x1b;
    pub const CONFIG_CMD: u8 = 0x1f;
}

/// The L_Key that ends a receive scatter list.
pub const INVALID_LKEY: u32 = 0x100;
/// A 64-byte chunk whose first dword is this has not been written yet.
pub const STAMP: u32 = 0xffff_ffff;
/// Most segments a WQE of 63 16-byte units can hold.
pub const MAX_SEGS: usize = 64;

/// A send queue slot the driver never wrote: an all-zero control segment.
/// Linux mlx4_en clears its TX ring at activation and pre-stamps nothing,
/// so in the ring's first pass every unused slot's owner bit reads
/// "hardware"; a posted WQE always has its DS count (written before the
/// owner bit), so a zero slot is no WQE and the send engine stops there
/// as at a software-owned one.
pub fn unwritten(ctrl: &[u8]) -> bool {
    ctrl.len() >= 16 && ctrl[..16].iter().all(|&b| b == 0)
}

/// The send control segment (16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ctrl {
    /// Owner bit (31 of dword 0).
    pub owner: bool,
    /// No error completion (NOP padding).
    pub nec: bool,
    /// Opcode.
    pub opcode: u8,
    /// WQE size in 16-byte units, the control segment included.
    pub ds: u8,
    /// Fence.
    pub fence: bool,
    /// The C bits (3:2 of dword 2).
    pub c: u8,
    /// Solicited event.
    pub solicited: bool,
    /// Force loopback.
    pub force_lb: bool,
    /// Immediate data (or invalidate key).
    pub imm: u32,
}

impl Ctrl {
    /// Decodes the first 16 bytes of a WQE.
    pub fn decode(b: &[u8]) -> Ctrl {
        let oo = get32(b, 0);
        let fs = get8(b, 7);
        let fl = get32(b, 8);
        Ctrl {
            owner: oo >> 31 != 0,
            nec: oo & 1 << 29 != 0,
            opcode: (oo & 0x1f) as u8,
            ds: fs & 0x3f,
            fence: fs & 0x40 != 0,
            c: ((fl >> 2) & 3) as u8,
            solicited: fl & 2 != 0,
            force_lb: fl & 1 != 0,
            imm: get32(b, 0x0c),
        }
    }
    /// A CQE is requested.
    pub fn signalled(&self) -> bool {
        self.c == 3
    }
}

/// The MLX control segment that overlays the send control segment on
/// QP0/QP1 (flags in dword 2, RLID in dword 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MlxCtrl {
    /// VL15 (QP0 only).
    pub vl15: bool,
    /// SLID taken from the header (permissive DLID).
    pub slr: bool,
    /// Static rate.
    pub rate: u8,
    /// Service level.
    pub sl: u8,
    /// Hardware computes the ICRC (the driver leaves the room for it).
    pub icrc: bool,
    /// Force loopback.
    pub force_lb: bool,
    /// Remote LID.
    pub rlid: u16,
}

impl MlxCtrl {
    /// Decodes dwords 2..3 of the MLX segment.
    pub fn decode(b: &[u8]) -> MlxCtrl {
        let f = get32(b, 8);
        MlxCtrl {
            vl15: f & 1 << 17 != 0,
            slr: f & 1 << 16 != 0,
            rate: ((f >> 12) & 0xf) as u8,
            sl: ((f >> 8) & 0xf) as u8,
            icrc: f & 1 << 4 != 0,
            force_lb: f & 1 != 0,
            rlid: get16(b, 0x0e),
        }
    }
}

/// The UD address vector and datagram segment (48 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Datagram {
    /// Port (1 or 2).
    pub port: u8,
    /// PD of the address handle.
    pub pd: u32,
    /// Force loopback (port_pd bit 31).
    pub force_lb: bool,
    /// A GRH follows the LRH.
    pub grh: bool,
    /// Source path bits.
    pub path_bits: u8,
    /// Destination LID.
    pub dlid: u16,
    /// Source GID index.
    pub gid_index: u8,
    /// Static rate.
    pub rate: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level.
    pub sl: u8,
    /// Traffic class.
    pub tclass: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Destination QPN.
    pub dqpn: u32,
    /// Q_Key as written (bit 31 set: use the QP's own).
    pub qkey: u32,
    /// Ethernet (RoCE) address vector: the 802.1Q tag to send with
    /// (0xffff: untagged; Linux `mlx4_eth_av.vlan`, `vlan | sl << 13`).
    pub vlan: u16,
    /// Ethernet address vector: the destination MAC.
    pub mac: [u8; 6],
}

impl Datagram {
    /// Size in bytes.
    pub const SIZE: usize = 48;
    /// Decodes 48 bytes.
    pub fn decode(b: &[u8]) -> Datagram {
        let pp = get32(b, 0);
        let gs = get8(b, 5);
        let sl_tc = get32(b, 0x0c);
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&b[0x10..0x20]);
        Datagram {
            port: ((pp >> 24) & 0x3) as u8,
            pd: pp & 0xff_ffff,
            force_lb: pp >> 31 != 0,
            grh: gs & 0x80 != 0,
            path_bits: gs & 0x7f,
            dlid: get16(b, 6),
            gid_index: get8(b, 9),
            rate: get8(b, 0x0a),
            hop_limit: get8(b, 0x0b),
            sl: (sl_tc >> 28) as u8,
            tclass: ((sl_tc >> 20) & 0xff) as u8,
            flow_label: sl_tc & 0xf_ffff,
            dgid,
            dqpn: get32(b, 0x20) & 0xff_ffff,
            qkey: get32(b, 0x24),
            vlan: get16(b, 0x28),
            mac: [b[0x2a], b[0x2b], b[0x2c], b[0x2d], b[0x2e], b[0x2f]],
        }
    }

    /// The SL of an Ethernet address vector (bits 31:29; Linux
    /// `create_iboe_ah`: `sl << 29`).
    pub fn eth_sl(b: &[u8]) -> u8 {
        (get32(b, 0x0c) >> 29) as u8
    }
}

/// One gather/scatter entry: a data pointer or an inline run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sge {
    /// No entry (array filler).
    #[default]
    None,
    /// A data pointer: bytes, L_Key, virtual address.
    Ptr {
        /// Byte count (0 in the WQE means 2^31).
        len: u64,
        /// L_Key.
        lkey: u32,
        /// Address.
        addr: u64,
    },
    /// Inline data at `off..off+len` of the WQE bytes.
    Inline {
        /// Offset in the WQE.
        off: u16,
        /// Length.
        len: u16,
    },
}

impl Sge {
    /// Bytes this entry carries.
    pub fn len(&self) -> u64 {
        match *self {
            Sge::None => 0,
            Sge::Ptr { len, .. } => len,
            Sge::Inline { len, .. } => u64::from(len),
        }
    }
    /// Carries nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a WQE cannot be parsed (the card's "local QP operation error").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// DS count 0, or beyond the stride.
    BadSize,
    /// A segment runs past the DS count.
    Truncated,
    /// An inline segment crosses a 64-byte boundary.
    InlineCrossing,
}

/// Parses the data and inline segments in `wqe[from..end]` into `out`;
/// returns how many.
pub fn parse_gather(
    wqe: &[u8],
    mut from: usize,
    end: usize,
    out: &mut [Sge; MAX_SEGS],
) -> Result<usize, Malformed> {
    let mut n = 0;
    while from < end {
        if n == MAX_SEGS || from + 4 > end {
            return Err(Malformed::Truncated);
        }
        let bc = get32(wqe, from);
        if bc & 0x8000_0000 != 0 {
            let len = (bc & 0x7fff_ffff) as usize;
            if from + 4 + len > end {
                return Err(Malformed::Truncated);
            }
            if len > 0 && (from % 64) + 4 + len > 64 {
                return Err(Malformed::InlineCrossing);
            }
            out[n] = Sge::Inline {
                off: (from + 4) as u16,
                len: len as u16,
            };
            from = (from + 4 + len).next_multiple_of(16);
        } else {
            if from + 16 > end {
                return Err(Malformed::Truncated);
            }
            out[n] = Sge::Ptr {
                len: if bc == 0 { 1 << 31 } else { u64::from(bc) },
                lkey: get32(wqe, from + 4),
                addr: get64(wqe, from + 8),
            };
            from += 16;
        }
        n += 1;
    }
    Ok(n)
}

/// Parses a receive scatter list (data segments only, up to the terminator
/// or the end of the stride).
pub fn parse_scatter(wqe: &[u8], out: &mut [Sge; MAX_SEGS]) -> usize {
    let mut n = 0;
    let mut off = 0;
    while off + 16 <= wqe.len() && n < MAX_SEGS {
        let bc = get32(wqe, off);
        let lkey = get32(wqe, off + 4);
        if lkey == INVALID_LKEY {
            break;
        }
        out[n] = Sge::Ptr {
            len: if bc & 0x7fff_ffff == 0 {
                1 << 31
            } else {
                u64::from(bc & 0x7fff_ffff)
            },
            lkey,
            addr: get64(wqe, off + 8),
        };
        n += 1;
        off += 16;
    }
    n
}

/// A receive scatter list the card refuses: an entry before the
/// terminator with the inline bit (byte count bit 31) set; receive WQEs
/// have data pointers only (PRM receive WQE: scatter entries of
/// byte_count[30:0], L_Key, address), so the card stops on it.
pub fn scatter_malformed(wqe: &[u8]) -> bool {
    let mut off = 0;
    let mut n = 0;
    while off + 16 <= wqe.len() && n < MAX_SEGS {
        if get32(wqe, off + 4) == INVALID_LKEY {
            return false;
        }
        if get32(wqe, off) & 0x8000_0000 != 0 {
            return true;
        }
        n += 1;
        off += 16;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hca::layout::{put32, put64};

    #[test]
    fn ctrl_golden_as_linux_writes_it() {
        let mut b = [0u8; 16];
        put32(&mut b, 0, 0x8000_000a); // owner | SEND
        b[7] = 0x40 | 3; // fence | 3 x 16 bytes
        put32(&mut b, 8, 0xc | 2); // CQ update | SE
        put32(&mut b, 12, 0xdead_beef);
        let c = Ctrl::decode(&b);
        assert!(c.owner && c.fence && c.signalled() && c.solicited && !c.force_lb);
        assert_eq!((c.opcode, c.ds, c.imm), (op::SEND, 3, 0xdead_beef));
    }

    #[test]
    fn gather_inline_and_pointer() {
        let mut w = [0u8; 128];
        put32(&mut w, 16, 0x8000_0005);
        w[20..25].copy_from_slice(b"hello");
        put32(&mut w, 32, 100);
        put32(&mut w, 36, 0x1234);
        put64(&mut w, 40, 0xabc0);
        put32(&mut w, 48, 0);
        let mut out = [Sge::None; MAX_SEGS];
        assert_eq!(parse_gather(&w, 16, 64, &mut out), Ok(3));
        assert_eq!(out[0], Sge::Inline { off: 20, len: 5 });
        assert_eq!(
            out[1],
            Sge::Ptr {
                len: 100,
                lkey: 0x1234,
                addr: 0xabc0
            }
        );
        assert_eq!(out[2].len(), 1 << 31, "a zero byte count is 2 GiB");
        put32(&mut w, 48, 0x8000_0014); // 20 bytes from 52 cross 64
        assert_eq!(
            parse_gather(&w, 16, 80, &mut out),
            Err(Malformed::InlineCrossing)
        );
    }

    #[test]
    fn scatter_stops_at_the_terminator() {
        let mut w = [0u8; 64];
        put32(&mut w, 0, 8);
        put32(&mut w, 4, 0x500);
        put32(&mut w, 20, INVALID_LKEY);
        put32(&mut w, 32, 8);
        let mut out = [Sge::None; MAX_SEGS];
        assert_eq!(parse_scatter(&w, &mut out), 1);
    }
}
