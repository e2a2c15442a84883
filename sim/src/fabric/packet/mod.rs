//! InfiniBand packets as the model puts them on the wire.
//!
//! InfiniBand packets as the model puts them on the wire (IBTA vol. 1,
//! chapter 9 "Transport layer" and 7.7-7.8 "Link layer"): build and parse
//! the LRH, GRH, BTH and the extended transport headers DETH, RETH, AETH,
//! AtomicETH, AtomicAckETH, ImmDt and IETH, the MAD header with the SMP
//! fields (directed route included), and the ICRC and VCRC; RDETH
//! (reliable datagram), raw packets (LNH 0/1), XRC and RoCE v2 are
//! deliberately left out; Ethernet frames and the RoCE v1 packets in them
//! are in `eth.rs`.
//!
//! Written from the IBTA layouts and checked as facts against Linux
//! `ib_pack.h`/`ud_header.c` and ibsim; it shares no code with the driver
//! crates (the model is the driver's checker).
//!
//! A packet is `LRH [GRH] BTH [ETHs] payload pad ICRC VCRC`. The LRH
//! PktLen counts 4-byte words from the first byte of the LRH to the last
//! byte of the ICRC (the VCRC is not counted); the GRH PayLen counts bytes
//! from the first byte of the BTH to the last byte of the ICRC; BTH PadCnt
//! says how many pad bytes make the payload a multiple of 4.
//!
//! CRCs (IBTA 7.8):
//! * ICRC: CRC-32 (the Ethernet polynomial 0x04C11DB7, reflected, initial
//!   value all ones, result complemented) over LRH..payload+pad with the
//!   variant fields replaced by ones: LRH VL in a local packet, the whole
//!   LRH in a global one (a router rewrites it; this is why RoCE, which
//!   has no LRH, takes 8 bytes of ones instead, and why Linux rxe starts
//!   from 0xdebb20e3, the CRC state after those 8 bytes), GRH TClass,
//!   FlowLabel and HopLmt, BTH byte 4 (Resv8a, which holds FECN/BECN).
//!   Stored least significant byte first (the same bytes zlib's `crc32`
//!   gives little-endian).
//! * VCRC: CRC-16 (polynomial 0x100B, reflected, initial value all ones,
//!   result complemented) over LRH..ICRC. Stored least significant byte
//!   first like the ICRC; no tool here cross-checks its byte order (tshark
//!   does not validate either CRC), so this is our reading of 7.8.2.
//!
//! The headers and whole packets are in `headers.rs`, the CRCs in `crc.rs`,
//! the MADs in `mad.rs`, Ethernet and RoCE v1 framing in `eth.rs`;
//! everything is reached as `packet::NAME`.

mod crc;
mod eth;
mod headers;
mod mad;

pub use crc::*;
pub use eth::*;
pub use headers::*;
pub use mad::*;

/// LRH length.
pub const LRH_LEN: usize = 8;
/// GRH length.
pub const GRH_LEN: usize = 40;
/// BTH length.
pub const BTH_LEN: usize = 12;
/// DETH length.
pub const DETH_LEN: usize = 8;
/// RETH length.
pub const RETH_LEN: usize = 16;
/// AETH length.
pub const AETH_LEN: usize = 4;
/// AtomicETH length.
pub const ATOMIC_ETH_LEN: usize = 28;
/// AtomicAckETH length.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// ImmDt / IETH length.
pub const IMM_LEN: usize = 4;
/// ICRC length.
pub const ICRC_LEN: usize = 4;
/// VCRC length.
pub const VCRC_LEN: usize = 2;
/// The longest packet the LRH can describe (PktLen is 11 bits of words),
/// plus the VCRC.
pub const MAX_PACKET: usize = 2047 * 4 + VCRC_LEN;
/// A MAD is 256 bytes.
pub const MAD_LEN: usize = 256;
/// The permissive LID.
pub const PERMISSIVE_LID: u16 = 0xffff;
/// The Q_Key of QP1 (GSI).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The default P_Key.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Why bytes are not a packet (or headers cannot be built).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PacketError {
    /// Fewer bytes than the header or packet needs.
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// LRH LVer is not 0.
    BadLver(u8),
    /// LRH LNH is raw (0) or IPv6 non-IBA (1).
    UnsupportedLnh(u8),
    /// LRH PktLen disagrees with the bytes present.
    BadPktLen {
        /// PktLen from the LRH (words).
        words: u16,
        /// Bytes from the LRH to the ICRC actually present.
        bytes: usize,
    },
    /// GRH IPVer is not 6 or NxtHdr is not 0x1B.
    BadGrh(&'static str),
    /// GRH PayLen disagrees with the packet.
    BadPayLen {
        /// PayLen from the GRH.
        pay_len: u16,
        /// Bytes from BTH to ICRC.
        actual: usize,
    },
    /// BTH TVer is not 0.
    BadTver(u8),
    /// An opcode this model does not know (reserved, RD, CNP, XRC...).
    UnsupportedOpcode(u8),
    /// PadCnt larger than the payload, or payload not 4-byte aligned.
    BadPad {
        /// PadCnt from the BTH.
        pad: u8,
        /// Payload+pad bytes.
        len: usize,
    },
    /// A header the opcode requires (or forbids) is missing (or present)
    /// when building.
    HeaderMismatch(&'static str),
    /// The packet would exceed what the LRH can describe.
    TooLong(usize),
    /// ICRC does not match.
    BadIcrc {
        /// Computed.
        expected: u32,
        /// In the packet.
        found: u32,
    },
    /// VCRC does not match.
    BadVcrc {
        /// Computed.
        expected: u16,
        /// In the packet.
        found: u16,
    },
    /// A MAD field is out of range (e.g. directed-route hop count > 63).
    BadMad(&'static str),
    /// An Ethernet frame's FCS does not match.
    BadFcs {
        /// Computed.
        expected: u32,
        /// In the frame.
        found: u32,
    },
    /// An Ethernet frame that is not RoCE (its Ethertype).
    NotRoce(u16),
}

impl core::fmt::Display for PacketError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PacketError::Truncated { what, need, have } => {
                write!(f, "truncated {what}: need {need} bytes, have {have}")
            }
            PacketError::BadLver(v) => write!(f, "LRH LVer {v} (expected 0)"),
            PacketError::UnsupportedLnh(v) => write!(f, "LRH LNH {v} (raw packets unsupported)"),
            PacketError::BadPktLen { words, bytes } => {
                write!(f, "LRH PktLen {words} words but {bytes} bytes LRH..ICRC")
            }
            PacketError::BadGrh(w) => write!(f, "bad GRH: {w}"),
            PacketError::BadPayLen { pay_len, actual } => {
                write!(f, "GRH PayLen {pay_len} but {actual} bytes BTH..ICRC")
            }
            PacketError::BadTver(v) => write!(f, "BTH TVer {v} (expected 0)"),
            PacketError::UnsupportedOpcode(o) => write!(f, "unsupported BTH opcode {o:#04x}"),
            PacketError::BadPad { pad, len } => {
                write!(f, "BTH PadCnt {pad} with {len} payload bytes")
            }
            PacketError::HeaderMismatch(w) => write!(f, "headers do not fit the opcode: {w}"),
            PacketError::TooLong(n) => write!(f, "packet of {n} bytes exceeds the LRH PktLen"),
            PacketError::BadIcrc { expected, found } => {
                write!(f, "ICRC {found:#010x}, expected {expected:#010x}")
            }
            PacketError::BadVcrc { expected, found } => {
                write!(f, "VCRC {found:#06x}, expected {expected:#06x}")
            }
            PacketError::BadMad(w) => write!(f, "bad MAD: {w}"),
            PacketError::BadFcs { expected, found } => {
                write!(f, "FCS {found:#010x}, expected {expected:#010x}")
            }
            PacketError::NotRoce(t) => write!(f, "Ethertype {t:#06x} is not RoCE (0x8915)"),
        }
    }
}

impl std::error::Error for PacketError {}

fn need(b: &[u8], n: usize, what: &'static str) -> Result<(), PacketError> {
    if b.len() < n {
        Err(PacketError::Truncated {
            what,
            need: n,
            have: b.len(),
        })
    } else {
        Ok(())
    }
}

fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn be24(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([0, b[o], b[o + 1], b[o + 2]])
}
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn be64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(a)
}
fn put24(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
