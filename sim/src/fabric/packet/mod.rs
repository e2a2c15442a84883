//! InfiniBand packets as the model puts them on the wire (IBTA vol. 1,
//! chapter 9 "Transport layer" and 7.7-7.8 "Link layer"): build and parse
//! the LRH, GRH, BTH and the extended transport headers DETH, RETH, AETH,
//! AtomicETH, AtomicAckETH, ImmDt and IETH, the MAD header with the SMP
//! fields (directed route included), and the ICRC and VCRC; RDETH
//! (reliable datagram), raw packets (LNH 0/1), XRC and the RoCE
//! encapsulations are deliberately left out.
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

/// Link next header (LRH LNH).
pub mod lnh {
    /// IBA local: BTH follows the LRH.
    pub const IBA_LOCAL: u8 = 2;
    /// IBA global: GRH then BTH.
    pub const IBA_GLOBAL: u8 = 3;
}

/// Local Route Header (IBTA 7.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lrh {
    /// Virtual lane (15 = management).
    pub vl: u8,
    /// Link version (0).
    pub lver: u8,
    /// Service level.
    pub sl: u8,
    /// Link next header ([`lnh`]).
    pub lnh: u8,
    /// Destination LID.
    pub dlid: u16,
    /// Packet length in 4-byte words, LRH..ICRC.
    pub pkt_len: u16,
    /// Source LID.
    pub slid: u16,
}

impl Lrh {
    /// Reads an LRH (no semantic checks).
    pub fn parse(b: &[u8]) -> Result<Lrh, PacketError> {
        need(b, LRH_LEN, "LRH")?;
        Ok(Lrh {
            vl: b[0] >> 4,
            lver: b[0] & 0xf,
            sl: b[1] >> 4,
            lnh: b[1] & 3,
            dlid: be16(b, 2),
            pkt_len: be16(b, 4) & 0x7ff,
            slid: be16(b, 6),
        })
    }
    /// Writes the LRH into `b[..8]`.
    pub fn write(&self, b: &mut [u8]) {
        b[0] = (self.vl & 0xf) << 4 | (self.lver & 0xf);
        b[1] = (self.sl & 0xf) << 4 | (self.lnh & 3);
        b[2..4].copy_from_slice(&self.dlid.to_be_bytes());
        b[4..6].copy_from_slice(&(self.pkt_len & 0x7ff).to_be_bytes());
        b[6..8].copy_from_slice(&self.slid.to_be_bytes());
    }
}

/// Global Route Header (IBTA 8.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grh {
    /// IP version (6).
    pub ip_ver: u8,
    /// Traffic class.
    pub tclass: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Bytes from the BTH to the ICRC inclusive.
    pub pay_len: u16,
    /// Next header (0x1B = IBA transport).
    pub nxt_hdr: u8,
    /// Hop limit.
    pub hop_lmt: u8,
    /// Source GID.
    pub sgid: [u8; 16],
    /// Destination GID.
    pub dgid: [u8; 16],
}

/// GRH NxtHdr for an IBA transport header.
pub const GRH_NXT_HDR_IBA: u8 = 0x1b;

impl Grh {
    /// Reads a GRH (no semantic checks).
    pub fn parse(b: &[u8]) -> Result<Grh, PacketError> {
        need(b, GRH_LEN, "GRH")?;
        let w0 = be32(b, 0);
        let mut sgid = [0u8; 16];
        let mut dgid = [0u8; 16];
        sgid.copy_from_slice(&b[8..24]);
        dgid.copy_from_slice(&b[24..40]);
        Ok(Grh {
            ip_ver: (w0 >> 28) as u8,
            tclass: (w0 >> 20) as u8,
            flow_label: w0 & 0xf_ffff,
            pay_len: be16(b, 4),
            nxt_hdr: b[6],
            hop_lmt: b[7],
            sgid,
            dgid,
        })
    }
    /// Writes the GRH into `b[..40]`.
    pub fn write(&self, b: &mut [u8]) {
        let w0 = u32::from(self.ip_ver & 0xf) << 28
            | u32::from(self.tclass) << 20
            | (self.flow_label & 0xf_ffff);
        b[0..4].copy_from_slice(&w0.to_be_bytes());
        b[4..6].copy_from_slice(&self.pay_len.to_be_bytes());
        b[6] = self.nxt_hdr;
        b[7] = self.hop_lmt;
        b[8..24].copy_from_slice(&self.sgid);
        b[24..40].copy_from_slice(&self.dgid);
    }
}

/// Base Transport Header (IBTA 9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bth {
    /// Opcode ([`opcode`]).
    pub opcode: u8,
    /// Solicited event.
    pub se: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad bytes after the payload (0..=3).
    pub pad_cnt: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward explicit congestion notification (byte 4 bit 7).
    pub fecn: bool,
    /// Backward explicit congestion notification (byte 4 bit 6).
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    /// Reads a BTH (no semantic checks).
    pub fn parse(b: &[u8]) -> Result<Bth, PacketError> {
        need(b, BTH_LEN, "BTH")?;
        Ok(Bth {
            opcode: b[0],
            se: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad_cnt: (b[1] >> 4) & 3,
            tver: b[1] & 0xf,
            pkey: be16(b, 2),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qp: be24(b, 5),
            ack_req: b[8] & 0x80 != 0,
            psn: be24(b, 9),
        })
    }
    /// Writes the BTH into `b[..12]`.
    pub fn write(&self, b: &mut [u8]) {
        b[0] = self.opcode;
        b[1] = u8::from(self.se) << 7
            | u8::from(self.mig_req) << 6
            | (self.pad_cnt & 3) << 4
            | (self.tver & 0xf);
        b[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        b[4] = u8::from(self.fecn) << 7 | u8::from(self.becn) << 6;
        put24(b, 5, self.dest_qp & 0xff_ffff);
        b[8] = u8::from(self.ack_req) << 7;
        put24(b, 9, self.psn & 0xff_ffff);
    }
}

/// Datagram Extended Transport Header (IBTA 9.3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deth {
    /// Queue key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

impl Deth {
    fn parse(b: &[u8]) -> Deth {
        Deth {
            qkey: be32(b, 0),
            src_qp: be24(b, 5),
        }
    }
    fn write(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&self.qkey.to_be_bytes());
        b[4] = 0;
        put24(b, 5, self.src_qp & 0xff_ffff);
    }
}

/// RDMA Extended Transport Header (IBTA 9.3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reth {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length of the whole message.
    pub dma_len: u32,
}

impl Reth {
    fn parse(b: &[u8]) -> Reth {
        Reth {
            va: be64(b, 0),
            rkey: be32(b, 8),
            dma_len: be32(b, 12),
        }
    }
    fn write(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.dma_len.to_be_bytes());
    }
}

/// ACK Extended Transport Header (IBTA 9.3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Aeth {
    /// Syndrome (see [`aeth`]).
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Aeth {
    fn parse(b: &[u8]) -> Aeth {
        Aeth {
            syndrome: b[0],
            msn: be24(b, 1),
        }
    }
    fn write(&self, b: &mut [u8]) {
        b[0] = self.syndrome;
        put24(b, 1, self.msn & 0xff_ffff);
    }
}

/// AETH syndromes (IBTA 9.7.5.1): bits 6:5 say ACK / RNR NAK / NAK,
/// bits 4:0 carry the credit count, the RNR timer or the NAK code.
pub mod aeth {
    /// ACK with a credit count in bits 4:0 (0x1f = invalid / unlimited).
    pub const fn ack(credits: u8) -> u8 {
        credits & 0x1f
    }
    /// RNR NAK with a timer code in bits 4:0.
    pub const fn rnr_nak(timer: u8) -> u8 {
        0x20 | (timer & 0x1f)
    }
    /// NAK: PSN sequence error.
    pub const NAK_PSN_SEQ_ERROR: u8 = 0x60;
    /// NAK: invalid request.
    pub const NAK_INVALID_REQUEST: u8 = 0x61;
    /// NAK: remote access error.
    pub const NAK_REMOTE_ACCESS: u8 = 0x62;
    /// NAK: remote operational error.
    pub const NAK_REMOTE_OP: u8 = 0x63;
    /// NAK: invalid RD request.
    pub const NAK_INVALID_RD_REQUEST: u8 = 0x64;
    /// The kind of a syndrome: 0 ACK, 1 RNR NAK, 3 NAK (2 reserved).
    pub const fn kind(syndrome: u8) -> u8 {
        (syndrome >> 5) & 3
    }
}

/// Atomic Extended Transport Header (IBTA 9.3.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEth {
    /// Virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value (CmpSwap) or add value (FetchAdd).
    pub swap_add: u64,
    /// Compare value (CmpSwap only).
    pub compare: u64,
}

impl AtomicEth {
    fn parse(b: &[u8]) -> AtomicEth {
        AtomicEth {
            va: be64(b, 0),
            rkey: be32(b, 8),
            swap_add: be64(b, 12),
            compare: be64(b, 20),
        }
    }
    fn write(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..20].copy_from_slice(&self.swap_add.to_be_bytes());
        b[20..28].copy_from_slice(&self.compare.to_be_bytes());
    }
}

/// BTH opcodes (IBTA 9.2.1, table 38): transport in bits 7:5 (RC 0, UC 1,
/// RD 2, UD 3), operation in bits 4:0.
pub mod opcode {
    #![allow(missing_docs)]
    pub const RC: u8 = 0x00;
    pub const UC: u8 = 0x20;
    pub const RD: u8 = 0x40;
    pub const UD: u8 = 0x60;

    pub const SEND_FIRST: u8 = 0x00;
    pub const SEND_MIDDLE: u8 = 0x01;
    pub const SEND_LAST: u8 = 0x02;
    pub const SEND_LAST_IMM: u8 = 0x03;
    pub const SEND_ONLY: u8 = 0x04;
    pub const SEND_ONLY_IMM: u8 = 0x05;
    pub const RDMA_WRITE_FIRST: u8 = 0x06;
    pub const RDMA_WRITE_MIDDLE: u8 = 0x07;
    pub const RDMA_WRITE_LAST: u8 = 0x08;
    pub const RDMA_WRITE_LAST_IMM: u8 = 0x09;
    pub const RDMA_WRITE_ONLY: u8 = 0x0a;
    pub const RDMA_WRITE_ONLY_IMM: u8 = 0x0b;
    pub const RDMA_READ_REQUEST: u8 = 0x0c;
    pub const RDMA_READ_RESPONSE_FIRST: u8 = 0x0d;
    pub const RDMA_READ_RESPONSE_MIDDLE: u8 = 0x0e;
    pub const RDMA_READ_RESPONSE_LAST: u8 = 0x0f;
    pub const RDMA_READ_RESPONSE_ONLY: u8 = 0x10;
    pub const ACKNOWLEDGE: u8 = 0x11;
    pub const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    pub const COMPARE_SWAP: u8 = 0x13;
    pub const FETCH_ADD: u8 = 0x14;
    pub const SEND_LAST_INV: u8 = 0x16;
    pub const SEND_ONLY_INV: u8 = 0x17;

    /// UD SEND Only.
    pub const UD_SEND_ONLY: u8 = UD | SEND_ONLY;
    /// UD SEND Only with Immediate.
    pub const UD_SEND_ONLY_IMM: u8 = UD | SEND_ONLY_IMM;
}

/// Which extended transport headers follow the BTH for an opcode, in wire
/// order DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt/IETH, and whether
/// the packet carries a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layout {
    /// DETH (UD).
    pub deth: bool,
    /// RETH.
    pub reth: bool,
    /// AtomicETH.
    pub atomic_eth: bool,
    /// AETH.
    pub aeth: bool,
    /// AtomicAckETH.
    pub atomic_ack_eth: bool,
    /// ImmDt.
    pub imm: bool,
    /// IETH.
    pub ieth: bool,
    /// The opcode may carry payload.
    pub payload: bool,
}

impl Layout {
    /// Bytes of extended headers.
    pub fn eth_len(&self) -> usize {
        usize::from(self.deth) * DETH_LEN
            + usize::from(self.reth) * RETH_LEN
            + usize::from(self.atomic_eth) * ATOMIC_ETH_LEN
            + usize::from(self.aeth) * AETH_LEN
            + usize::from(self.atomic_ack_eth) * ATOMIC_ACK_ETH_LEN
            + usize::from(self.imm || self.ieth) * IMM_LEN
    }
}

/// The header layout of an opcode, or `None` for opcodes the model does
/// not carry (RD, reserved, CNP, XRC, manufacturer-specific).
pub fn layout(op: u8) -> Option<Layout> {
    use opcode::*;
    let l = Layout::default();
    let data = Layout { payload: true, ..l };
    let transport = op & 0xe0;
    let kind = op & 0x1f;
    match transport {
        RC | UC => {}
        UD => {
            return match kind {
                SEND_ONLY => Some(Layout { deth: true, ..data }),
                SEND_ONLY_IMM => Some(Layout {
                    deth: true,
                    imm: true,
                    ..data
                }),
                _ => None,
            };
        }
        _ => return None,
    }
    let uc = transport == UC;
    Some(match kind {
        SEND_FIRST | SEND_MIDDLE | SEND_LAST | SEND_ONLY => data,
        SEND_LAST_IMM | SEND_ONLY_IMM => Layout { imm: true, ..data },
        RDMA_WRITE_FIRST | RDMA_WRITE_ONLY => Layout { reth: true, ..data },
        RDMA_WRITE_MIDDLE | RDMA_WRITE_LAST => data,
        RDMA_WRITE_LAST_IMM => Layout { imm: true, ..data },
        RDMA_WRITE_ONLY_IMM => Layout {
            reth: true,
            imm: true,
            ..data
        },
        _ if uc => return None,
        RDMA_READ_REQUEST => Layout { reth: true, ..l },
        RDMA_READ_RESPONSE_FIRST | RDMA_READ_RESPONSE_LAST | RDMA_READ_RESPONSE_ONLY => {
            Layout { aeth: true, ..data }
        }
        RDMA_READ_RESPONSE_MIDDLE => data,
        ACKNOWLEDGE => Layout { aeth: true, ..l },
        ATOMIC_ACKNOWLEDGE => Layout {
            aeth: true,
            atomic_ack_eth: true,
            ..l
        },
        COMPARE_SWAP | FETCH_ADD => Layout {
            atomic_eth: true,
            ..l
        },
        SEND_LAST_INV | SEND_ONLY_INV => Layout { ieth: true, ..data },
        _ => return None,
    })
}

/// All headers of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Headers {
    /// LRH (`lnh` and `pkt_len` are filled in by [`build`]).
    pub lrh: Lrh,
    /// GRH, if LNH says IBA global.
    pub grh: Option<Grh>,
    /// BTH (`pad_cnt` is filled in by [`build`]).
    pub bth: Bth,
    /// DETH.
    pub deth: Option<Deth>,
    /// RETH.
    pub reth: Option<Reth>,
    /// AETH.
    pub aeth: Option<Aeth>,
    /// AtomicETH.
    pub atomic_eth: Option<AtomicEth>,
    /// AtomicAckETH: the original remote data.
    pub atomic_ack: Option<u64>,
    /// Immediate data (as on the wire, big-endian value).
    pub imm: Option<u32>,
    /// IETH: the R_Key to invalidate.
    pub ieth: Option<u32>,
}

impl Headers {
    /// Headers for an opcode, with the LRH/BTH fields given and the
    /// extended headers defaulted (present exactly where the opcode wants
    /// them); `None` for an unsupported opcode.
    pub fn for_opcode(op: u8) -> Option<Headers> {
        let l = layout(op)?;
        Some(Headers {
            bth: Bth {
                opcode: op,
                ..Bth::default()
            },
            deth: l.deth.then_some(Deth::default()),
            reth: l.reth.then_some(Reth::default()),
            aeth: l.aeth.then_some(Aeth::default()),
            atomic_eth: l.atomic_eth.then_some(AtomicEth::default()),
            atomic_ack: l.atomic_ack_eth.then_some(0),
            imm: l.imm.then_some(0),
            ieth: l.ieth.then_some(0),
            ..Headers::default()
        })
    }

    /// Bytes of headers (LRH through the last extended header).
    pub fn header_len(&self) -> Result<usize, PacketError> {
        let l = layout(self.bth.opcode).ok_or(PacketError::UnsupportedOpcode(self.bth.opcode))?;
        Ok(LRH_LEN + self.grh.map_or(0, |_| GRH_LEN) + BTH_LEN + l.eth_len())
    }
}

/// A parsed packet: its headers and where the payload lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// Every header.
    pub hdr: Headers,
    /// Offset of the payload in the packet bytes.
    pub payload_off: usize,
    /// Payload length (without pad).
    pub payload_len: usize,
    /// The ICRC as stored.
    pub icrc: u32,
    /// The VCRC as stored.
    pub vcrc: u16,
}

impl Parsed {
    /// The payload within `bytes` (the slice this was parsed from).
    pub fn payload<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        bytes
            .get(self.payload_off..self.payload_off + self.payload_len)
            .unwrap_or(&[])
    }
}

/// Parses a packet (LRH..VCRC), checking every length field and the
/// opcode's header layout; CRCs are not checked here ([`check_crcs`]).
pub fn parse(b: &[u8]) -> Result<Parsed, PacketError> {
    let lrh = Lrh::parse(b)?;
    if lrh.lver != 0 {
        return Err(PacketError::BadLver(lrh.lver));
    }
    if lrh.lnh != lnh::IBA_LOCAL && lrh.lnh != lnh::IBA_GLOBAL {
        return Err(PacketError::UnsupportedLnh(lrh.lnh));
    }
    if b.len() > MAX_PACKET {
        return Err(PacketError::TooLong(b.len()));
    }
    let body = b.len().saturating_sub(VCRC_LEN);
    if usize::from(lrh.pkt_len) * 4 != body || b.len() < LRH_LEN + VCRC_LEN {
        return Err(PacketError::BadPktLen {
            words: lrh.pkt_len,
            bytes: body,
        });
    }
    let mut off = LRH_LEN;
    let grh = if lrh.lnh == lnh::IBA_GLOBAL {
        let g = Grh::parse(&b[off..body])?;
        if g.ip_ver != 6 {
            return Err(PacketError::BadGrh("IPVer is not 6"));
        }
        if g.nxt_hdr != GRH_NXT_HDR_IBA {
            return Err(PacketError::BadGrh("NxtHdr is not 0x1B"));
        }
        off += GRH_LEN;
        let actual = body - off;
        if usize::from(g.pay_len) != actual {
            return Err(PacketError::BadPayLen {
                pay_len: g.pay_len,
                actual,
            });
        }
        Some(g)
    } else {
        None
    };
    let bth = Bth::parse(&b[off..body])?;
    if bth.tver != 0 {
        return Err(PacketError::BadTver(bth.tver));
    }
    off += BTH_LEN;
    let l = layout(bth.opcode).ok_or(PacketError::UnsupportedOpcode(bth.opcode))?;
    let end = body - ICRC_LEN.min(body);
    if end < off + l.eth_len() {
        return Err(PacketError::Truncated {
            what: "extended transport headers and ICRC",
            need: off + l.eth_len() + ICRC_LEN + VCRC_LEN,
            have: b.len(),
        });
    }
    let mut hdr = Headers {
        lrh,
        grh,
        bth,
        ..Headers::default()
    };
    if l.deth {
        hdr.deth = Some(Deth::parse(&b[off..]));
        off += DETH_LEN;
    }
    if l.reth {
        hdr.reth = Some(Reth::parse(&b[off..]));
        off += RETH_LEN;
    }
    if l.atomic_eth {
        hdr.atomic_eth = Some(AtomicEth::parse(&b[off..]));
        off += ATOMIC_ETH_LEN;
    }
    if l.aeth {
        hdr.aeth = Some(Aeth::parse(&b[off..]));
        off += AETH_LEN;
    }
    if l.atomic_ack_eth {
        hdr.atomic_ack = Some(be64(b, off));
        off += ATOMIC_ACK_ETH_LEN;
    }
    if l.imm {
        hdr.imm = Some(be32(b, off));
        off += IMM_LEN;
    }
    if l.ieth {
        hdr.ieth = Some(be32(b, off));
        off += IMM_LEN;
    }
    let padded = end - off;
    let pad = usize::from(bth.pad_cnt);
    if !padded.is_multiple_of(4) || pad > padded || (!l.payload && padded != 0) {
        return Err(PacketError::BadPad {
            pad: bth.pad_cnt,
            len: padded,
        });
    }
    Ok(Parsed {
        hdr,
        payload_off: off,
        payload_len: padded - pad,
        icrc: u32::from_le_bytes([b[end], b[end + 1], b[end + 2], b[end + 3]]),
        vcrc: u16::from_le_bytes([b[body], b[body + 1]]),
    })
}

/// Builds a packet from `hdr` and `payload` into `out` (cleared first, so
/// a caller can reuse one buffer): fills in LRH LNH and PktLen, GRH
/// PayLen, BTH PadCnt, the pad, ICRC and VCRC. The extended headers must
/// be exactly those the opcode wants.
pub fn build_into(hdr: &Headers, payload: &[u8], out: &mut Vec<u8>) -> Result<(), PacketError> {
    out.clear();
    let pad = write_headers(hdr, payload.len(), out)?;
    out.truncate(hdr.header_len()?);
    out.extend_from_slice(payload);
    out.resize(out.len() + pad, 0);
    seal(out);
    Ok(())
}

/// Like [`build_into`], but the `len` payload bytes are written in place
/// by `fill` (no intermediate copy), and the ICRC and VCRC are left as
/// zeros: the packet's CRCs are *owed*, to be computed by [`seal_owed`]
/// before anything reads or alters the bytes (the model's own HCAs send
/// packets this way; `crate::fabric` says when it seals them). `out` is
/// not cleared first: a reused buffer's old payload bytes are not zeroed
/// only to be overwritten by `fill` (headers, pad and CRCs are).
pub fn build_owed_with(
    hdr: &Headers,
    len: usize,
    out: &mut Vec<u8>,
    fill: impl FnOnce(&mut [u8]),
) -> Result<(), PacketError> {
    write_headers(hdr, len, out)?;
    let h = hdr.header_len()?;
    fill(&mut out[h..h + len]);
    out[h + len..].fill(0);
    Ok(())
}

/// [`build_owed_with`] copying `payload`, into a new buffer.
pub fn build_owed(hdr: &Headers, payload: &[u8]) -> Result<Vec<u8>, PacketError> {
    let mut v = Vec::new();
    build_owed_with(hdr, payload.len(), &mut v, |p| p.copy_from_slice(payload))?;
    Ok(v)
}

/// Whether `b` still carries the placeholders [`build_owed_with`] leaves
/// where the ICRC and VCRC go (six zero bytes): only such a packet may be
/// taken as owing its CRCs. A packet with real CRCs (a sealed one, maybe
/// damaged since) has them checked, whatever its sender said; one whose
/// ICRC and VCRC are both zero by chance (one in 2^48) would pass as owed.
pub fn crcs_owed(b: &[u8]) -> bool {
    b.len() >= LRH_LEN + BTH_LEN + ICRC_LEN + VCRC_LEN
        && b[b.len() - ICRC_LEN - VCRC_LEN..].iter().all(|&x| x == 0)
}

/// Computes the ICRC and VCRC of a packet whose CRCs are owed (the last
/// six bytes, whatever they hold, are overwritten).
pub fn seal_owed(b: &mut [u8]) -> Result<(), PacketError> {
    need(b, LRH_LEN + BTH_LEN + ICRC_LEN + VCRC_LEN, "packet")?;
    let e = b.len() - VCRC_LEN - ICRC_LEN;
    let i = icrc(&b[..e]);
    b[e..e + ICRC_LEN].copy_from_slice(&i.to_le_bytes());
    let v = vcrc(&b[..e + ICRC_LEN]);
    b[e + ICRC_LEN..].copy_from_slice(&v.to_le_bytes());
    Ok(())
}

/// Checks `hdr` against its opcode, sizes `out` for the whole packet
/// (headers, `len` payload bytes, pad, ICRC, VCRC; bytes `out` held
/// already are kept, new ones are zero) and writes LRH..extended headers
/// over zeros at its start; the pad it needs.
fn write_headers(hdr: &Headers, len: usize, out: &mut Vec<u8>) -> Result<usize, PacketError> {
    let op = hdr.bth.opcode;
    let l = layout(op).ok_or(PacketError::UnsupportedOpcode(op))?;
    let checks: [(bool, bool, &'static str); 7] = [
        (l.deth, hdr.deth.is_some(), "DETH"),
        (l.reth, hdr.reth.is_some(), "RETH"),
        (l.atomic_eth, hdr.atomic_eth.is_some(), "AtomicETH"),
        (l.aeth, hdr.aeth.is_some(), "AETH"),
        (l.atomic_ack_eth, hdr.atomic_ack.is_some(), "AtomicAckETH"),
        (l.imm, hdr.imm.is_some(), "ImmDt"),
        (l.ieth, hdr.ieth.is_some(), "IETH"),
    ];
    for (want, have, what) in checks {
        if want != have {
            return Err(PacketError::HeaderMismatch(what));
        }
    }
    if !l.payload && len != 0 {
        return Err(PacketError::HeaderMismatch(
            "payload on an opcode without one",
        ));
    }
    let pad = (4 - len % 4) % 4;
    let hlen = hdr.header_len()?;
    let body = hlen + len + pad + ICRC_LEN;
    if body / 4 > 0x7ff {
        return Err(PacketError::TooLong(body + VCRC_LEN));
    }
    out.resize(body + VCRC_LEN, 0);
    out[..hlen].fill(0);
    let mut lrh = hdr.lrh;
    lrh.lnh = if hdr.grh.is_some() {
        lnh::IBA_GLOBAL
    } else {
        lnh::IBA_LOCAL
    };
    lrh.pkt_len = (body / 4) as u16;
    lrh.write(&mut out[..LRH_LEN]);
    let mut off = LRH_LEN;
    if let Some(mut g) = hdr.grh {
        g.pay_len = (body - LRH_LEN - GRH_LEN) as u16;
        g.write(&mut out[off..off + GRH_LEN]);
        off += GRH_LEN;
    }
    let mut bth = hdr.bth;
    bth.pad_cnt = pad as u8;
    bth.write(&mut out[off..off + BTH_LEN]);
    off += BTH_LEN;
    if let Some(d) = hdr.deth {
        d.write(&mut out[off..]);
        off += DETH_LEN;
    }
    if let Some(r) = hdr.reth {
        r.write(&mut out[off..]);
        off += RETH_LEN;
    }
    if let Some(a) = hdr.atomic_eth {
        a.write(&mut out[off..]);
        off += ATOMIC_ETH_LEN;
    }
    if let Some(a) = hdr.aeth {
        a.write(&mut out[off..]);
        off += AETH_LEN;
    }
    if let Some(v) = hdr.atomic_ack {
        out[off..off + 8].copy_from_slice(&v.to_be_bytes());
        off += ATOMIC_ACK_ETH_LEN;
    }
    if let Some(v) = hdr.imm.or(hdr.ieth) {
        out[off..off + 4].copy_from_slice(&v.to_be_bytes());
    }
    Ok(pad)
}

/// Builds a packet into a new buffer (see [`build_into`]).
pub fn build(hdr: &Headers, payload: &[u8]) -> Result<Vec<u8>, PacketError> {
    let mut v = Vec::new();
    build_into(hdr, payload, &mut v)?;
    Ok(v)
}

/// Appends ICRC and VCRC to `b`, which holds LRH..pad.
fn seal(b: &mut Vec<u8>) {
    let icrc = icrc(b);
    b.extend_from_slice(&icrc.to_le_bytes());
    let vcrc = vcrc(b);
    b.extend_from_slice(&vcrc.to_le_bytes());
}

/// Recomputes the ICRC and VCRC of a well-formed packet in place (after a
/// switch or a test changed a field). Variant fields (VL, hop limit,
/// FECN/BECN) need only the VCRC, but this does both.
pub fn reseal(b: &mut Vec<u8>) -> Result<(), PacketError> {
    if b.len() < LRH_LEN + BTH_LEN + ICRC_LEN + VCRC_LEN {
        return Err(PacketError::Truncated {
            what: "packet",
            need: LRH_LEN + BTH_LEN + ICRC_LEN + VCRC_LEN,
            have: b.len(),
        });
    }
    b.truncate(b.len() - ICRC_LEN - VCRC_LEN);
    seal(b);
    Ok(())
}

/// Recomputes only the VCRC (after a variant field changed).
pub fn reseal_vcrc(b: &mut [u8]) -> Result<(), PacketError> {
    let n = b.len();
    need(b, LRH_LEN + VCRC_LEN, "packet")?;
    let v = vcrc(&b[..n - VCRC_LEN]);
    b[n - VCRC_LEN..].copy_from_slice(&v.to_le_bytes());
    Ok(())
}

/// Checks the VCRC, then the ICRC, of a packet whose lengths
/// [`parse`] accepted.
pub fn check_crcs(b: &[u8]) -> Result<(), PacketError> {
    need(b, LRH_LEN + BTH_LEN + ICRC_LEN + VCRC_LEN, "packet")?;
    let n = b.len();
    let found = u16::from_le_bytes([b[n - 2], b[n - 1]]);
    let expected = vcrc(&b[..n - VCRC_LEN]);
    if found != expected {
        return Err(PacketError::BadVcrc { expected, found });
    }
    let e = n - VCRC_LEN - ICRC_LEN;
    let found = u32::from_le_bytes([b[e], b[e + 1], b[e + 2], b[e + 3]]);
    let expected = icrc(&b[..e]);
    if found != expected {
        return Err(PacketError::BadIcrc { expected, found });
    }
    Ok(())
}

/// Checks only the VCRC (the link-level check every hop makes).
pub fn check_vcrc(b: &[u8]) -> Result<(), PacketError> {
    need(b, LRH_LEN + VCRC_LEN, "packet")?;
    let n = b.len();
    let found = u16::from_le_bytes([b[n - 2], b[n - 1]]);
    let expected = vcrc(&b[..n - VCRC_LEN]);
    if found != expected {
        return Err(PacketError::BadVcrc { expected, found });
    }
    Ok(())
}

/// Parses and checks both CRCs.
pub fn parse_checked(b: &[u8]) -> Result<Parsed, PacketError> {
    let p = parse(b)?;
    check_crcs(b)?;
    Ok(p)
}

// ---------------------------------------------------------------- CRCs

/// Slices of the table-driven CRCs: 16 bytes per step.
const SLICES: usize = 16;

const fn crc32_tables() -> [[u32; 256]; SLICES] {
    let mut t = [[0u32; 256]; SLICES];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < SLICES {
        let mut i = 0;
        while i < 256 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

const fn crc16_tables() -> [[u16; 256]; SLICES] {
    // 0xD008 is 0x100B with its bits reversed.
    let mut t = [[0u16; 256]; SLICES];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u16;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xd008 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < SLICES {
        let mut i = 0;
        while i < 256 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

static CRC32: [[u32; 256]; SLICES] = crc32_tables();
static CRC16: [[u16; 256]; SLICES] = crc16_tables();

/// Continues a reflected CRC-32 (state not complemented) over `data`:
/// carry-less multiplication where the CPU has it, tables otherwise.
fn crc32_update(c: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if let Some((folded, tail)) = clmul::fold(u128::from(c), data, &clmul::CRC32) {
        return crc32_table_update(crc32_table_update(0, &folded), tail);
    }
    crc32_table_update(c, data)
}

/// The same for the 16-bit VCRC.
fn crc16_update(c: u16, data: &[u8]) -> u16 {
    #[cfg(target_arch = "x86_64")]
    if let Some((folded, tail)) = clmul::fold(u128::from(c), data, &clmul::CRC16) {
        return crc16_table_update(crc16_table_update(0, &folded), tail);
    }
    crc16_table_update(c, data)
}

/// Continues a reflected CRC-32 (state not complemented) over `data`,
/// sixteen bytes per step (slicing-by-16).
fn crc32_table_update(mut c: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(SLICES);
    for ch in &mut chunks {
        let mut x = [0u8; SLICES];
        x.copy_from_slice(ch);
        let lo = c ^ u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        x[..4].copy_from_slice(&lo.to_le_bytes());
        let mut r = 0u32;
        for (k, &b) in x.iter().enumerate() {
            r ^= CRC32[SLICES - 1 - k][usize::from(b)];
        }
        c = r;
    }
    for &x in chunks.remainder() {
        c = CRC32[0][((c ^ u32::from(x)) & 0xff) as usize] ^ (c >> 8);
    }
    c
}

/// The same for the 16-bit VCRC.
fn crc16_table_update(mut c: u16, data: &[u8]) -> u16 {
    let mut chunks = data.chunks_exact(SLICES);
    for ch in &mut chunks {
        let mut x = [0u8; SLICES];
        x.copy_from_slice(ch);
        let lo = c ^ u16::from_le_bytes([x[0], x[1]]);
        x[..2].copy_from_slice(&lo.to_le_bytes());
        let mut r = 0u16;
        for (k, &b) in x.iter().enumerate() {
            r ^= CRC16[SLICES - 1 - k][usize::from(b)];
        }
        c = r;
    }
    for &x in chunks.remainder() {
        c = CRC16[0][((c ^ u16::from(x)) & 0xff) as usize] ^ (c >> 8);
    }
    c
}

/// Folding with carry-less multiplication (x86_64 PCLMULQDQ), for both
/// reflected CRCs: 16-byte blocks are folded into one 128-bit remainder
/// congruent to the message modulo the polynomial, and the tables finish
/// the last 16 bytes and the tail. With bit k of a little-endian 128-bit
/// block standing for x^(127-k), block B followed by block N folds to
/// H * (x^192 mod P) + L * (x^128 mod P) + N, H and L the halves of B
/// (four blocks at a time are folded across 512 bits the same way). A
/// carry-less product of two reflected 64-bit values, read as a reflected
/// 128-bit value, is the polynomial product times x, so the constants are
/// x^191 and x^127 (x^575 and x^511) mod P, stored reflected.
#[cfg(target_arch = "x86_64")]
mod clmul {
    use std::arch::x86_64::{
        __m128i, _mm_clmulepi64_si128, _mm_loadu_si128, _mm_set_epi64x, _mm_storeu_si128,
        _mm_xor_si128,
    };

    /// Below this many bytes the tables are as fast.
    pub const MIN_LEN: usize = 64;

    /// Folding constants of one polynomial: (x^(d+64-1), x^(d-1)) mod P,
    /// reflected in 64 bits, for folding across d = 128 and d = 512 bits.
    pub struct Consts {
        k128: (u64, u64),
        k512: (u64, u64),
    }

    /// x^e mod P, with P given with its x^n term.
    const fn xpow_mod(e: u32, poly: u64, n: u32) -> u64 {
        let mut r: u64 = 1;
        let mut i = 0;
        while i < e {
            r <<= 1;
            if r & (1 << n) != 0 {
                r ^= poly;
            }
            i += 1;
        }
        r
    }

    const fn consts(poly: u64, n: u32) -> Consts {
        Consts {
            k128: (
                xpow_mod(128 + 64 - 1, poly, n).reverse_bits(),
                xpow_mod(128 - 1, poly, n).reverse_bits(),
            ),
            k512: (
                xpow_mod(512 + 64 - 1, poly, n).reverse_bits(),
                xpow_mod(512 - 1, poly, n).reverse_bits(),
            ),
        }
    }

    /// The ICRC polynomial.
    pub const CRC32: Consts = consts(0x1_04c1_1db7, 32);
    /// The VCRC polynomial.
    pub const CRC16: Consts = consts(0x1_100b, 16);

    /// Whether the CPU multiplies carry-less.
    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("sse2")
    }

    /// Folds `data` with the CRC state `state` (not complemented) into 16
    /// bytes whose CRC from state 0, continued over the returned tail, is
    /// the CRC of `data` from `state`; `None` (use the tables) for fewer
    /// than [`MIN_LEN`] bytes or a CPU without carry-less multiplication.
    pub fn fold<'a>(state: u128, data: &'a [u8], k: &Consts) -> Option<([u8; 16], &'a [u8])> {
        if data.len() < MIN_LEN || !available() {
            return None;
        }
        let mut first = [0u8; 64];
        first.copy_from_slice(&data[..64]);
        // A state is the same as zero state with it XORed into the first
        // bytes (reflected: the low byte meets the first data byte).
        let mut lead = [0u8; 16];
        lead.copy_from_slice(&first[..16]);
        first[..16].copy_from_slice(&(u128::from_le_bytes(lead) ^ state).to_le_bytes());
        let quads = (data.len() - 64) / 64;
        let body = &data[64..64 + quads * 64];
        let rest = &data[64 + quads * 64..];
        let singles = rest.len() / 16;
        let (tail16, tail) = rest.split_at(singles * 16);
        // SAFETY: `available()` was checked above, so the CPU has
        // PCLMULQDQ and SSE2, which is all `fold_blocks` is compiled for.
        let out = unsafe { fold_blocks(&first, body, tail16, k) };
        Some((out, tail))
    }

    #[target_feature(enable = "pclmulqdq,sse2")]
    fn fold_blocks(first: &[u8; 64], body: &[u8], singles: &[u8], k: &Consts) -> [u8; 16] {
        let load = |b: &[u8]| {
            let b = &b[..16];
            // SAFETY: `b` is exactly 16 readable bytes (sliced above); the
            // load is unaligned.
            unsafe { _mm_loadu_si128(b.as_ptr().cast::<__m128i>()) }
        };
        let k128 = _mm_set_epi64x(k.k128.0 as i64, k.k128.1 as i64);
        let k512 = _mm_set_epi64x(k.k512.0 as i64, k.k512.1 as i64);
        // Low half (the first 8 bytes, the higher degrees) times the first
        // constant, high half times the second.
        let fold = |x: __m128i, kk: __m128i| {
            _mm_xor_si128(
                _mm_clmulepi64_si128(x, kk, 0x10),
                _mm_clmulepi64_si128(x, kk, 0x01),
            )
        };
        let mut acc = [
            load(&first[0..]),
            load(&first[16..]),
            load(&first[32..]),
            load(&first[48..]),
        ];
        for q in body.chunks_exact(64) {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm_xor_si128(fold(*a, k512), load(&q[16 * j..]));
            }
        }
        let mut x = acc[0];
        for a in &acc[1..] {
            x = _mm_xor_si128(fold(x, k128), *a);
        }
        for ch in singles.chunks_exact(16) {
            x = _mm_xor_si128(fold(x, k128), load(ch));
        }
        let mut out = [0u8; 16];
        // SAFETY: an unaligned 16-byte store into a 16-byte array.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast::<__m128i>(), x) };
        out
    }
}

/// CRC-32 as zlib computes it (for tests and the ICRC).
pub fn crc32(data: &[u8]) -> u32 {
    !crc32_update(!0, data)
}

/// The ICRC of `b` = LRH..pad (no CRCs), variant fields masked to ones.
/// Bytes that are not a well-formed header prefix are taken as they are.
pub fn icrc(b: &[u8]) -> u32 {
    // Copy of the headers with the variant fields masked: LRH 8, GRH 40,
    // BTH 12 at most.
    let mut h = [0u8; LRH_LEN + GRH_LEN + BTH_LEN];
    let global = b.len() >= 2 && b[1] & 3 == lnh::IBA_GLOBAL;
    let hlen = (LRH_LEN + if global { GRH_LEN } else { 0 } + BTH_LEN).min(b.len());
    h[..hlen].copy_from_slice(&b[..hlen]);
    if global {
        // The whole LRH is variant in a packet with a GRH.
        h[..LRH_LEN.min(hlen)].fill(0xff);
    } else if hlen > 0 {
        h[0] |= 0xf0; // VL
    }
    let bth = if global {
        if hlen >= LRH_LEN + 8 {
            h[LRH_LEN] |= 0x0f; // TClass (high nibble)
            h[LRH_LEN + 1] = 0xff; // TClass low nibble, FlowLabel
            h[LRH_LEN + 2] = 0xff;
            h[LRH_LEN + 3] = 0xff;
            h[LRH_LEN + 7] = 0xff; // HopLmt
        }
        LRH_LEN + GRH_LEN
    } else {
        LRH_LEN
    };
    if hlen > bth + 4 {
        h[bth + 4] = 0xff; // Resv8a (FECN, BECN)
    }
    let c = crc32_update(!0, &h[..hlen]);
    !crc32_update(c, &b[hlen..])
}

/// The VCRC of `b` = LRH..ICRC.
pub fn vcrc(b: &[u8]) -> u16 {
    !crc16_update(!0, b)
}

// ------------------------------------------------------------------ MADs

/// Management classes.
pub mod mgmt_class {
    #![allow(missing_docs)]
    pub const SUBN_LID_ROUTED: u8 = 0x01;
    pub const SUBN_ADM: u8 = 0x03;
    pub const PERF_MGMT: u8 = 0x04;
    pub const CM: u8 = 0x07;
    pub const SUBN_DIRECTED_ROUTE: u8 = 0x81;
}

/// MAD methods.
pub mod method {
    #![allow(missing_docs)]
    pub const GET: u8 = 0x01;
    pub const SET: u8 = 0x02;
    pub const SEND: u8 = 0x03;
    pub const TRAP: u8 = 0x05;
    pub const REPORT: u8 = 0x06;
    pub const TRAP_REPRESS: u8 = 0x07;
    pub const GET_TABLE: u8 = 0x12;
    pub const GET_RESP: u8 = 0x81;
    pub const REPORT_RESP: u8 = 0x86;
}

/// Attribute ids (SMP 14.2.5, PMA 16.1.3).
pub mod attr {
    #![allow(missing_docs)]
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    pub const NODE_DESC: u16 = 0x0010;
    pub const NODE_INFO: u16 = 0x0011;
    pub const SWITCH_INFO: u16 = 0x0012;
    pub const GUID_INFO: u16 = 0x0014;
    pub const PORT_INFO: u16 = 0x0015;
    pub const PKEY_TABLE: u16 = 0x0016;
    pub const SL_TO_VL_TABLE: u16 = 0x0017;
    pub const VL_ARB_TABLE: u16 = 0x0018;
    pub const LINEAR_FORWARDING_TABLE: u16 = 0x0019;
    pub const MULTICAST_FORWARDING_TABLE: u16 = 0x001b;
    pub const SM_INFO: u16 = 0x0020;
    pub const PORT_COUNTERS: u16 = 0x0012;
    pub const PORT_COUNTERS_EXT: u16 = 0x001d;
}

/// MAD status values (IBTA 13.4.7; bit 15 is the SMP D bit).
pub mod mad_status {
    #![allow(missing_docs)]
    pub const BUSY: u16 = 0x0001;
    pub const BAD_VERSION: u16 = 0x0004;
    pub const METHOD_UNSUPPORTED: u16 = 0x0008;
    pub const ATTR_UNSUPPORTED: u16 = 0x000c;
    pub const INVALID_FIELD: u16 = 0x001c;
    /// The SMP "direction" bit: set on the return trip.
    pub const DIRECTION: u16 = 0x8000;
}

/// Offset of the SMP/PMA attribute data within a MAD.
pub const SMP_DATA: usize = 64;
/// Offset of the PMA attribute data within a MAD.
pub const PMA_DATA: usize = 64;
/// Length of SMP attribute data.
pub const SMP_DATA_LEN: usize = 64;

/// The common MAD header (IBTA 13.4.3), 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MadHdr {
    /// Base version (1).
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method, response bit included.
    pub method: u8,
    /// Status (for directed-route SMPs bit 15 is the D bit).
    pub status: u16,
    /// Class specific (for directed-route SMPs: hop pointer << 8 | hop
    /// count).
    pub class_specific: u16,
    /// Transaction id.
    pub tid: u64,
    /// Attribute id.
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHdr {
    /// Reads the MAD header.
    pub fn parse(b: &[u8]) -> Result<MadHdr, PacketError> {
        need(b, 24, "MAD header")?;
        Ok(MadHdr {
            base_version: b[0],
            mgmt_class: b[1],
            class_version: b[2],
            method: b[3],
            status: be16(b, 4),
            class_specific: be16(b, 6),
            tid: be64(b, 8),
            attr_id: be16(b, 16),
            attr_mod: be32(b, 20),
        })
    }
    /// Writes the MAD header into `b[..24]`.
    pub fn write(&self, b: &mut [u8]) {
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        b[4..6].copy_from_slice(&self.status.to_be_bytes());
        b[6..8].copy_from_slice(&self.class_specific.to_be_bytes());
        b[8..16].copy_from_slice(&self.tid.to_be_bytes());
        b[16..18].copy_from_slice(&self.attr_id.to_be_bytes());
        b[18..20].fill(0);
        b[20..24].copy_from_slice(&self.attr_mod.to_be_bytes());
    }
}

/// A subnet management packet (IBTA 14.2.1.1 LID-routed, 14.2.1.2
/// directed route): the MAD header, M_Key, and for directed route the
/// hop pointer/count, DrSLID, DrDLID and both paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Smp {
    /// Common header. For directed route, [`Smp::parse`] moves the D bit
    /// into `direction` and the class-specific word into `hop_ptr` and
    /// `hop_cnt` (leaving them 0 here), and [`Smp::to_bytes`] writes them
    /// back from there.
    pub hdr: MadHdr,
    /// M_Key.
    pub mkey: u64,
    /// Directed route: hop pointer.
    pub hop_ptr: u8,
    /// Directed route: hop count (at most 63).
    pub hop_cnt: u8,
    /// Directed route: D bit (returning).
    pub direction: bool,
    /// Directed route: DrSLID.
    pub dr_slid: u16,
    /// Directed route: DrDLID.
    pub dr_dlid: u16,
    /// Attribute data.
    pub data: [u8; SMP_DATA_LEN],
    /// Directed route: initial path (entry 0 unused).
    pub initial_path: [u8; 64],
    /// Directed route: return path (entry 0 unused).
    pub return_path: [u8; 64],
}

impl Smp {
    /// A directed-route SubnGet of `attr_id` along `path` (the egress port
    /// at hops 1..), with permissive DrSLID/DrDLID.
    pub fn dr_get(tid: u64, attr_id: u16, attr_mod: u32, path: &[u8]) -> Result<Smp, PacketError> {
        if path.len() > 63 {
            return Err(PacketError::BadMad("directed route longer than 63 hops"));
        }
        let mut initial_path = [0u8; 64];
        initial_path[1..=path.len()].copy_from_slice(path);
        Ok(Smp {
            hdr: MadHdr {
                base_version: 1,
                mgmt_class: mgmt_class::SUBN_DIRECTED_ROUTE,
                class_version: 1,
                method: method::GET,
                tid,
                attr_id,
                attr_mod,
                ..MadHdr::default()
            },
            mkey: 0,
            hop_ptr: 0,
            hop_cnt: path.len() as u8,
            direction: false,
            dr_slid: PERMISSIVE_LID,
            dr_dlid: PERMISSIVE_LID,
            data: [0; SMP_DATA_LEN],
            initial_path,
            return_path: [0; 64],
        })
    }

    /// A LID-routed SubnGet/SubnSet.
    pub fn lid_routed(tid: u64, method: u8, attr_id: u16, attr_mod: u32) -> Smp {
        Smp {
            hdr: MadHdr {
                base_version: 1,
                mgmt_class: mgmt_class::SUBN_LID_ROUTED,
                class_version: 1,
                method,
                tid,
                attr_id,
                attr_mod,
                ..MadHdr::default()
            },
            mkey: 0,
            hop_ptr: 0,
            hop_cnt: 0,
            direction: false,
            dr_slid: 0,
            dr_dlid: 0,
            data: [0; SMP_DATA_LEN],
            initial_path: [0; 64],
            return_path: [0; 64],
        }
    }

    /// Whether this is a directed-route SMP.
    pub fn is_dr(&self) -> bool {
        self.hdr.mgmt_class == mgmt_class::SUBN_DIRECTED_ROUTE
    }

    /// Reads an SMP from a 256-byte MAD.
    pub fn parse(b: &[u8]) -> Result<Smp, PacketError> {
        need(b, MAD_LEN, "SMP")?;
        let hdr = MadHdr::parse(b)?;
        let dr = hdr.mgmt_class == mgmt_class::SUBN_DIRECTED_ROUTE;
        if !dr && hdr.mgmt_class != mgmt_class::SUBN_LID_ROUTED {
            return Err(PacketError::BadMad("not a subnet management class"));
        }
        let mut data = [0u8; SMP_DATA_LEN];
        data.copy_from_slice(&b[SMP_DATA..SMP_DATA + SMP_DATA_LEN]);
        let mut initial_path = [0u8; 64];
        let mut return_path = [0u8; 64];
        if dr {
            initial_path.copy_from_slice(&b[128..192]);
            return_path.copy_from_slice(&b[192..256]);
        }
        let mut hdr = hdr;
        let status = hdr.status;
        if dr {
            hdr.status &= !mad_status::DIRECTION;
            hdr.class_specific = 0;
        }
        Ok(Smp {
            hdr,
            mkey: be64(b, 24),
            hop_ptr: if dr { b[6] } else { 0 },
            hop_cnt: if dr { b[7] } else { 0 },
            direction: dr && status & mad_status::DIRECTION != 0,
            dr_slid: if dr { be16(b, 32) } else { 0 },
            dr_dlid: if dr { be16(b, 34) } else { 0 },
            data,
            initial_path,
            return_path,
        })
    }

    /// Writes the SMP as a 256-byte MAD.
    pub fn to_bytes(&self) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        let mut h = self.hdr;
        if self.is_dr() {
            h.class_specific = u16::from(self.hop_ptr) << 8 | u16::from(self.hop_cnt);
            h.status = (h.status & !mad_status::DIRECTION)
                | if self.direction {
                    mad_status::DIRECTION
                } else {
                    0
                };
        }
        h.write(&mut b);
        b[24..32].copy_from_slice(&self.mkey.to_be_bytes());
        if self.is_dr() {
            b[32..34].copy_from_slice(&self.dr_slid.to_be_bytes());
            b[34..36].copy_from_slice(&self.dr_dlid.to_be_bytes());
            b[128..192].copy_from_slice(&self.initial_path);
            b[192..256].copy_from_slice(&self.return_path);
        }
        b[SMP_DATA..SMP_DATA + SMP_DATA_LEN].copy_from_slice(&self.data);
        b
    }
}

/// Headers of a UD packet carrying a MAD to QP0 (SMP, VL15) or QP1 (GMP,
/// VL 0): LRH, BTH (UD SEND Only, P_Key), DETH (Q_Key 0 for QP0,
/// 0x80010000 for QP1).
pub fn mad_headers(dlid: u16, slid: u16, dest_qp: u32, src_qp: u32, pkey: u16) -> Headers {
    let smi = dest_qp == 0;
    Headers {
        lrh: Lrh {
            vl: if smi { 15 } else { 0 },
            dlid,
            slid,
            ..Lrh::default()
        },
        bth: Bth {
            opcode: opcode::UD_SEND_ONLY,
            pkey,
            dest_qp,
            ..Bth::default()
        },
        deth: Some(Deth {
            qkey: if smi { 0 } else { GSI_QKEY },
            src_qp,
        }),
        ..Headers::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_zlibs() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        let long: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut c = !0u32;
        for &x in &long {
            c = CRC32[0][((c ^ u32::from(x)) & 0xff) as usize] ^ (c >> 8);
        }
        assert_eq!(crc32(&long), !c, "slicing-by-16 equals the bytewise CRC");
    }

    #[test]
    fn folded_crcs_equal_the_tables() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for len in (0..300).chain([1000, 4096, 4133, 8190]) {
            let d: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            for s32 in [0u32, !0, 0xdebb_20e3] {
                assert_eq!(
                    crc32_update(s32, &d),
                    crc32_table_update(s32, &d),
                    "crc32 len {len}"
                );
            }
            for s16 in [0u16, !0, 0x1234] {
                assert_eq!(
                    crc16_update(s16, &d),
                    crc16_table_update(s16, &d),
                    "crc16 len {len}"
                );
            }
        }
    }

    #[test]
    fn vcrc_polynomial() {
        // Bitwise reference of the reflected 0x100B CRC, seed and final
        // complement, against the table version.
        fn bitwise(d: &[u8]) -> u16 {
            let mut c: u16 = 0xffff;
            for &x in d {
                c ^= u16::from(x);
                for _ in 0..8 {
                    c = if c & 1 != 0 {
                        (c >> 1) ^ 0xd008
                    } else {
                        c >> 1
                    };
                }
            }
            !c
        }
        let d: Vec<u8> = (0..777u32).map(|i| (i * 13 + 1) as u8).collect();
        assert_eq!(vcrc(&d), bitwise(&d));
        assert_eq!(vcrc(b"123456789"), bitwise(b"123456789"));
    }

    /// The DR SubnGet(NodeInfo) of real-peers.md, whose ICRC tshark shows
    /// as 0x297e56c8 (the four stored bytes read big-endian).
    #[test]
    fn icrc_matches_the_tshark_capture() {
        let mut smp = Smp::dr_get(0x1234, attr::NODE_INFO, 0, &[1]).unwrap();
        smp.hop_ptr = 0;
        let mad = smp.to_bytes();
        let h = mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, DEFAULT_PKEY);
        let p = build(&h, &mad).unwrap();
        assert_eq!(p.len(), 288 + 2);
        assert_eq!(Lrh::parse(&p).unwrap().pkt_len, 72);
        assert_eq!(&p[284..288], &0x297e_56c8u32.to_be_bytes(), "ICRC");
    }

    #[test]
    fn build_parse_roundtrip_every_opcode() {
        let ops: Vec<u8> = (0..=255u8).filter(|&o| layout(o).is_some()).collect();
        assert_eq!(ops.len(), 23 + 12 + 2, "RC 23, UC 12, UD 2 opcodes");
        for op in ops {
            let mut h = Headers::for_opcode(op).unwrap();
            h.lrh = Lrh {
                vl: 3,
                sl: 5,
                dlid: 0x12,
                slid: 0x34,
                ..Lrh::default()
            };
            h.bth.pkey = 0x8001;
            h.bth.dest_qp = 0xabcdef;
            h.bth.psn = 0x123456;
            h.bth.ack_req = true;
            if let Some(r) = h.reth.as_mut() {
                *r = Reth {
                    va: 0x1122_3344_5566_7788,
                    rkey: 0xdead_beef,
                    dma_len: 9000,
                };
            }
            if h.imm.is_some() {
                h.imm = Some(0x0102_0304);
            }
            let payload: &[u8] = if layout(op).unwrap().payload {
                b"hello"
            } else {
                b""
            };
            for grh in [false, true] {
                h.grh = grh.then_some(Grh {
                    ip_ver: 6,
                    nxt_hdr: GRH_NXT_HDR_IBA,
                    hop_lmt: 64,
                    tclass: 0x12,
                    flow_label: 0x3_4567,
                    sgid: [1; 16],
                    dgid: [2; 16],
                    ..Grh::default()
                });
                let b = build(&h, payload).unwrap();
                let p = parse_checked(&b).unwrap();
                assert_eq!(p.payload(&b), payload, "op {op:#x}");
                // Built with owed CRCs into a dirty reused buffer, then
                // sealed: the same bytes; unsealed, the CRC check fails.
                let mut owed = vec![0xa5u8; 300];
                build_owed_with(&h, payload.len(), &mut owed, |p| p.copy_from_slice(payload))
                    .unwrap();
                assert!(parse_checked(&owed).is_err(), "op {op:#x}: CRCs owed");
                assert_eq!(parse(&owed).unwrap().payload(&owed), payload);
                seal_owed(&mut owed).unwrap();
                assert_eq!(owed, b, "op {op:#x}: sealed later, same packet");
                assert_eq!(p.hdr.bth.pad_cnt as usize, (4 - payload.len() % 4) % 4);
                assert_eq!(p.hdr.reth, h.reth);
                assert_eq!(p.hdr.imm, h.imm);
                assert_eq!(p.hdr.grh.map(|g| g.flow_label), h.grh.map(|g| g.flow_label));
            }
        }
    }

    #[test]
    fn golden_bth_and_eths() {
        let mut h = Headers::for_opcode(opcode::COMPARE_SWAP).unwrap();
        h.lrh = Lrh {
            dlid: 2,
            slid: 1,
            ..Lrh::default()
        };
        h.bth = Bth {
            opcode: opcode::COMPARE_SWAP,
            se: true,
            pkey: 0xffff,
            dest_qp: 0x000102,
            ack_req: true,
            psn: 0x00fffe,
            ..Bth::default()
        };
        h.atomic_eth = Some(AtomicEth {
            va: 0x1000,
            rkey: 0x55,
            swap_add: 7,
            compare: 9,
        });
        let b = build(&h, &[]).unwrap();
        assert_eq!(
            &b[0..8],
            &[0x00, 0x02, 0x00, 0x02, 0x00, 13, 0x00, 0x01],
            "LRH: PktLen (8 + 12 + 28 + 4) / 4"
        );
        assert_eq!(
            &b[8..20],
            &[
                0x13, 0x80, 0xff, 0xff, 0, 0x00, 0x01, 0x02, 0x80, 0x00, 0xff, 0xfe
            ],
            "BTH"
        );
        assert_eq!(&b[20..28], &[0, 0, 0, 0, 0, 0, 0x10, 0], "AtomicETH VA");
        assert_eq!(&b[28..32], &[0, 0, 0, 0x55], "R_Key");
        assert_eq!(b[39], 7, "swap");
        assert_eq!(b[47], 9, "compare");
        assert_eq!(b.len(), 48 + 4 + 2);
    }

    /// A global packet's ICRC equals the RoCE computation: Linux rxe
    /// starts from 0xdebb20e3, the CRC-32 state after 8 bytes of ones
    /// standing for the LRH, then takes the masked GRH and BTH.
    #[test]
    fn global_icrc_is_the_roce_one() {
        assert_eq!(crc32_update(!0, &[0xff; 8]), 0xdebb_20e3);
        let mut h = mad_headers(5, 6, 1, 1, 0xffff);
        h.lrh.vl = 2;
        h.lrh.sl = 3;
        h.grh = Some(Grh {
            ip_ver: 6,
            tclass: 0x21,
            flow_label: 0x12345,
            nxt_hdr: GRH_NXT_HDR_IBA,
            hop_lmt: 9,
            sgid: [7; 16],
            dgid: [8; 16],
            ..Grh::default()
        });
        let b = build(&h, &[0x42u8; 256]).unwrap();
        let end = b.len() - ICRC_LEN - VCRC_LEN;
        let mut g = b[LRH_LEN..end].to_vec();
        g[0] |= 0x0f;
        g[1..4].fill(0xff);
        g[7] = 0xff;
        g[GRH_LEN + 4] = 0xff;
        let roce = !crc32_update(0xdebb_20e3, &g);
        assert_eq!(
            u32::from_le_bytes(b[end..end + 4].try_into().unwrap()),
            roce
        );
    }

    #[test]
    fn icrc_ignores_variant_fields_only() {
        let mut h = mad_headers(5, 6, 1, 1, 0xffff);
        h.grh = Some(Grh {
            ip_ver: 6,
            nxt_hdr: GRH_NXT_HDR_IBA,
            hop_lmt: 1,
            ..Grh::default()
        });
        let base = build(&h, &[0u8; 256]).unwrap();
        let mut v = base.clone();
        v[0] ^= 0xf0; // VL
        v[1] ^= 0xf0; // SL: with a GRH the whole LRH is variant
        v[3] ^= 0xff; // DLID
        v[8] ^= 0x0f; // TClass
        v[9] ^= 0xff; // TClass/FlowLabel
        v[15] ^= 0xff; // HopLmt
        v[48 + 4] ^= 0xc0; // FECN/BECN
        assert_eq!(icrc(&v[..v.len() - 6]), icrc(&base[..base.len() - 6]));
        assert!(matches!(check_crcs(&v), Err(PacketError::BadVcrc { .. })));
        reseal_vcrc(&mut v).unwrap();
        assert_eq!(check_crcs(&v), Ok(()));
        for i in [12usize, 20, 30, 48, 60, 100] {
            let mut w = base.clone();
            w[i] ^= 1;
            reseal_vcrc(&mut w).unwrap();
            assert!(
                matches!(check_crcs(&w), Err(PacketError::BadIcrc { .. })),
                "byte {i} is invariant"
            );
        }
        // Without a GRH only the VL of the LRH is variant.
        let local = build(&mad_headers(5, 6, 1, 1, 0xffff), &[0u8; 256]).unwrap();
        let mut v = local.clone();
        v[0] ^= 0xf0;
        reseal_vcrc(&mut v).unwrap();
        assert_eq!(check_crcs(&v), Ok(()), "VL");
        for i in [1usize, 3, 5, 7] {
            let mut w = local.clone();
            w[i] ^= 1;
            reseal_vcrc(&mut w).unwrap();
            assert!(
                matches!(check_crcs(&w), Err(PacketError::BadIcrc { .. })),
                "LRH byte {i} is invariant in a local packet"
            );
        }
    }

    #[test]
    fn smp_dr_fields() {
        let mut s = Smp::dr_get(7, attr::PORT_INFO, 3, &[1, 5, 2]).unwrap();
        s.hop_ptr = 2;
        s.direction = true;
        s.return_path[1] = 9;
        let b = s.to_bytes();
        assert_eq!(&b[0..4], &[1, 0x81, 1, 1]);
        assert_eq!(&b[4..8], &[0x80, 0, 2, 3], "D bit, hop pointer, hop count");
        assert_eq!(&b[32..36], &[0xff, 0xff, 0xff, 0xff], "DrSLID, DrDLID");
        assert_eq!(&b[128..132], &[0, 1, 5, 2], "initial path");
        assert_eq!(b[193], 9, "return path");
        assert_eq!(Smp::parse(&b).unwrap(), s);
        assert!(Smp::dr_get(1, 1, 0, &[1; 64]).is_err());
    }

    #[test]
    fn malformed_input_is_an_error() {
        let h = mad_headers(5, 6, 1, 1, 0xffff);
        let good = build(&h, &[0u8; 256]).unwrap();
        for n in 0..good.len() {
            assert!(parse(&good[..n]).is_err(), "truncated to {n}");
        }
        let mut b = good.clone();
        b[1] &= !3; // LNH raw
        assert_eq!(parse(&b), Err(PacketError::UnsupportedLnh(0)));
        let mut b = good.clone();
        b[8] = 0x15; // RD opcode
        assert_eq!(parse(&b), Err(PacketError::UnsupportedOpcode(0x15)));
        let mut b = good.clone();
        b.push(0);
        assert!(matches!(parse(&b), Err(PacketError::BadPktLen { .. })));
        assert!(matches!(
            build(&Headers::for_opcode(opcode::ACKNOWLEDGE).unwrap(), b"x"),
            Err(PacketError::HeaderMismatch(_))
        ));
        let mut h2 = Headers::for_opcode(opcode::RDMA_WRITE_FIRST).unwrap();
        h2.reth = None;
        assert_eq!(build(&h2, b""), Err(PacketError::HeaderMismatch("RETH")));
        assert!(matches!(
            build(&Headers::for_opcode(opcode::SEND_ONLY).unwrap(), &[0; 9000]),
            Err(PacketError::TooLong(_))
        ));
        // Pseudo-random bytes never panic.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = (x % 400) as usize;
            let v: Vec<u8> = (0..n).map(|i| (x >> (i % 56)) as u8).collect();
            let _ = parse_checked(&v);
            let _ = Smp::parse(&v);
        }
    }
}
