//! The headers of an InfiniBand packet (IBTA vol. 1, 7.7 LRH, 8.3 GRH, 9.2
//! BTH and 9.3 the extended transport headers) and whole packets built and
//! parsed from them, their CRCs computed, owed or checked.

use super::*;

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
    /// LRH (`lnh` and `pkt_len` are filled in by [`build`]); in a RoCE
    /// packet only its `sl` counts (the VLAN PCP carries it).
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
    /// The Ethernet header of a RoCE v1 packet, which takes the place of
    /// the LRH (the GRH is then mandatory, and the FCS takes the VCRC's
    /// place).
    pub eth: Option<super::EthHdr>,
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
        Ok(self.link_len() + self.grh.map_or(0, |_| GRH_LEN) + BTH_LEN + l.eth_len())
    }

    /// Bytes before the GRH (or the BTH): the LRH, or a RoCE packet's
    /// Ethernet header.
    pub fn link_len(&self) -> usize {
        self.eth.map_or(LRH_LEN, |e| e.len())
    }

    /// Bytes after the ICRC: the VCRC, or a RoCE packet's FCS.
    pub fn tail_len(&self) -> usize {
        if self.eth.is_some() {
            super::FCS_LEN
        } else {
            VCRC_LEN
        }
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
    let mut p = parse_transport(b, LRH_LEN, body, lrh.lnh == lnh::IBA_GLOBAL)?;
    p.hdr.lrh = lrh;
    p.vcrc = u16::from_le_bytes([b[body], b[body + 1]]);
    Ok(p)
}

/// The GRH (if `global`), BTH, extended headers and payload of `b` from
/// `off` (after the LRH or the Ethernet header) to `body` (the end of the
/// ICRC); the link header and what follows the ICRC are the caller's.
pub(super) fn parse_transport(
    b: &[u8],
    mut off: usize,
    body: usize,
    global: bool,
) -> Result<Parsed, PacketError> {
    let grh = if global {
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
            need: off + l.eth_len() + ICRC_LEN + (b.len() - body),
            have: b.len(),
        });
    }
    let mut hdr = Headers {
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
        vcrc: 0,
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
    if hdr.eth.is_some() && hdr.grh.is_none() {
        return Err(PacketError::HeaderMismatch("RoCE without a GRH"));
    }
    let pad = (4 - len % 4) % 4;
    let hlen = hdr.header_len()?;
    let lead = hdr.link_len();
    let body = hlen + len + pad + ICRC_LEN;
    if (body - lead + LRH_LEN) / 4 > 0x7ff {
        return Err(PacketError::TooLong(body + hdr.tail_len()));
    }
    out.resize(body + hdr.tail_len(), 0);
    out[..hlen].fill(0);
    match hdr.eth {
        Some(e) => e.write(&mut out[..lead]),
        None => {
            let mut lrh = hdr.lrh;
            lrh.lnh = if hdr.grh.is_some() {
                lnh::IBA_GLOBAL
            } else {
                lnh::IBA_LOCAL
            };
            lrh.pkt_len = (body / 4) as u16;
            lrh.write(&mut out[..LRH_LEN]);
        }
    }
    let mut off = lead;
    if let Some(mut g) = hdr.grh {
        g.pay_len = (body - lead - GRH_LEN) as u16;
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

#[cfg(test)]
mod tests {
    use super::*;

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
