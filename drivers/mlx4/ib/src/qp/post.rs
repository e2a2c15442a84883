//! Posting work requests (Linux `qp.c`: `mlx4_ib_post_send`, the MLX segment of `build_mlx_header`, `mlx4_ib_post_recv`).
//!
//! Send WQEs for every opcode of RC, UC and UD with owner bits,
//! fence/solicited/signalled flags, reverse-order data segments, inline
//! segments, stamping (`stamp_send_wqe`) and one doorbell per list; the MLX
//! segment of QP0/QP1 sends around ib_core's UD header; receive WQEs with
//! the scatter terminator. Left out: WQE shrinking (and its NOP padding),
//! LSO, BlueFlame and the work requests of XRC, memory windows and
//! fast-register MRs.

use hal::barrier::{dma_wmb, wmb};
use hal::be::put_be64;
use mlx4_hw::doorbell::SEND_DOORBELL;
use mlx4_hw::wqe::{self, atomic, ctrl, data, datagram, inline, mlx, opcode, raddr};

use super::{Mlx4IbQp, Sqp, UD_HEADER_SIZE};
use crate::ah::Mlx4IbAh;
use crate::table::Slab;
use crate::verbs::{QpState, QpType, RecvWr, SendFlags, SendWr, WrDetail, WrOpcode};
use crate::{Error, Result};

/// `mlx4_ib_opcode[]`: the hardware opcode (`MLX4_OPCODE_*` of
/// `include/linux/mlx4/qp.h`) of each `enum ib_wr_opcode` value; the ones
/// this port does not post (LSO 7, RDMA_READ_WITH_INV 9, LOCAL_INV 10,
/// FAST_REG_MR 11, BIND_MW 14) are refused before the table is read.
pub(crate) const HW_OPCODE: [u32; 16] = [
    opcode::RDMA_WRITE,
    opcode::RDMA_WRITE_IMM,
    opcode::SEND,
    opcode::SEND_IMM,
    opcode::RDMA_READ,
    opcode::ATOMIC_CS,
    opcode::ATOMIC_FA,
    opcode::NOP,
    opcode::SEND_INVAL,
    opcode::NOP,
    opcode::NOP,
    opcode::NOP,
    opcode::MASKED_ATOMIC_CS,
    opcode::MASKED_ATOMIC_FA,
    opcode::NOP,
    opcode::NOP,
];

const fn bit(op: WrOpcode) -> u32 {
    1 << (op as u32)
}
/// Opcodes with a remote-address segment only.
const RDMA_OPS: u32 =
    bit(WrOpcode::RdmaWrite) | bit(WrOpcode::RdmaWriteWithImm) | bit(WrOpcode::RdmaRead);
/// Opcodes with a remote-address and an atomic segment.
const ATOMIC_OPS: u32 = bit(WrOpcode::AtomicCmpAndSwp)
    | bit(WrOpcode::AtomicFetchAndAdd)
    | bit(WrOpcode::MaskedAtomicCmpAndSwp)
    | bit(WrOpcode::MaskedAtomicFetchAndAdd);
/// Sends.
const SEND_OPS: u32 = bit(WrOpcode::Send) | bit(WrOpcode::SendWithImm) | bit(WrOpcode::SendWithInv);
/// Opcodes whose `imm` field carries `imm_data` (or the rkey to invalidate).
const IMM_OPS: u32 =
    bit(WrOpcode::SendWithImm) | bit(WrOpcode::RdmaWriteWithImm) | bit(WrOpcode::SendWithInv);

/// What the straight line needs of a `WrOpcode`: the hardware opcode and
/// the mask of `imm_data` (all ones for [`IMM_OPS`], else zero), in one
/// table entry.
#[derive(Clone, Copy)]
struct OpInfo {
    hw: u32,
    imm_mask: u32,
}

/// [`OpInfo`] by `WrOpcode`.
const OP_INFO: [OpInfo; 16] = {
    let mut t = [OpInfo { hw: 0, imm_mask: 0 }; 16];
    let mut op = 0;
    while op < 16 {
        t[op].hw = HW_OPCODE[op];
        if IMM_OPS & (1 << op) != 0 {
            t[op].imm_mask = u32::MAX;
        }
        op += 1;
    }
    t
};

/// The opcodes of the straight-line send path: those whose WQE is the
/// control segment, an optional remote-address segment and data (no AV,
/// no atomic segment), on RC and UC.
const fn fast_ops(t: QpType) -> u32 {
    match t {
        QpType::Rc => RDMA_OPS | SEND_OPS,
        QpType::Uc => ops_allowed(QpType::Uc),
        _ => 0,
    }
}

/// Which variant of [`WrDetail`] a request carries, as a number below 4
/// (the straight-line path's shape index is `4 * opcode + kind`).
#[inline(always)]
fn detail_kind(d: &WrDetail) -> u32 {
    match d {
        WrDetail::None => 0,
        WrDetail::Rdma { .. } => 1,
        WrDetail::Atomic { .. } => 2,
        WrDetail::Ud { .. } => 3,
    }
}

/// The straight-line shapes of transport `t`: each fast opcode with the
/// fields it needs (remote address for RDMA, none for sends).
const fn fast_shapes(t: QpType) -> u64 {
    let ops = fast_ops(t);
    let mut m = 0u64;
    let mut op = 0;
    while op < 16 {
        if ops & (1 << op) != 0 {
            let kind = if RDMA_OPS & (1 << op) != 0 { 1 } else { 0 };
            m |= 1 << (4 * op + kind);
        }
        op += 1;
    }
    m
}

/// Inline bytes the straight-line path takes at most: the first segment
/// fills the first chunk after the control (and remote-address) segment,
/// the second holds up to 60 bytes of the second chunk.
pub(super) const FAST_INLINE_MAX: usize = 64 - ctrl::SIZE - raddr::SIZE - inline::SIZE + 60;

/// Opcodes each transport allows (UD and MLX: sends; UC: no READ, no atomics).
pub(super) const fn ops_allowed(t: QpType) -> u32 {
    match t {
        QpType::Rc => RDMA_OPS | ATOMIC_OPS | SEND_OPS,
        QpType::Uc => SEND_OPS | bit(WrOpcode::RdmaWrite) | bit(WrOpcode::RdmaWriteWithImm),
        QpType::Ud | QpType::Smi | QpType::Gsi => bit(WrOpcode::Send) | bit(WrOpcode::SendWithImm),
    }
}

/// `srcrb_flags` by the low three `ib_send_flags` bits (fence, signalled,
/// solicited).
pub(super) const SRCRB_FLAGS: [u32; 8] = [
    0,
    0,
    ctrl::CQ_UPDATE,
    ctrl::CQ_UPDATE,
    ctrl::SOLICITED,
    ctrl::SOLICITED,
    ctrl::CQ_UPDATE | ctrl::SOLICITED,
    ctrl::CQ_UPDATE | ctrl::SOLICITED,
];

/// The control segment of a WQE built in `blk`: flags and immediate, a
/// barrier, then owner, opcode, fence and size in one aligned 8-byte store
/// that hands the WQE to the HCA.
#[inline(always)]
fn finish_ctrl<const N: usize>(blk: &hal::DmaBlock<'_, N>, flags: u64, owner_size: u64) {
    blk.write_be64(ctrl::SRCRB_FLAGS, flags);
    dma_wmb();
    blk.write_be64(ctrl::OWNER_OPCODE, owner_size);
}

/// The remote-address segment right after the control segment of a WQE
/// block (the straight-line send path's RDMA WRITE/READ).
#[inline(always)]
fn write_raddr<const N: usize>(blk: &hal::DmaBlock<'_, N>, addr: u64, rkey: u32) {
    blk.write_be64(ctrl::SIZE + raddr::RADDR, addr);
    blk.write_be64(ctrl::SIZE + raddr::RKEY, u64::from(rkey) << 32);
}

/// Inline data at `OFF` of a 128-byte WQE block in at most two segments
/// (the first up to the 64-byte boundary, the second at the start of the
/// second chunk; the caller checked the length); returns the WQE size in
/// 16-byte units. Each segment's byte count follows its bytes behind a
/// barrier: the second one overwrites its chunk's stamp.
#[inline(always)]
fn write_inline2<const OFF: usize>(blk: &hal::DmaBlock<'_, 128>, src: &[u8]) -> u32 {
    let room = inline::ALIGN - OFF - inline::SIZE;
    let end = if src.is_empty() {
        // No bytes, no segment (as the general path).
        OFF
    } else if src.len() <= room {
        blk.write_bytes(OFF + inline::SIZE, src);
        dma_wmb();
        blk.write_be32(OFF, inline::SEG | src.len() as u32);
        OFF + inline::SIZE + src.len()
    } else {
        let (a, b) = src.split_at(room);
        blk.write_bytes(OFF + inline::SIZE, a);
        blk.write_bytes(inline::ALIGN + inline::SIZE, b);
        dma_wmb();
        blk.write_be32(inline::ALIGN, inline::SEG | b.len() as u32);
        blk.write_be32(OFF, inline::SEG | a.len() as u32);
        inline::ALIGN + inline::SIZE + b.len()
    };
    end.div_ceil(16) as u32
}

/// Why a post verb refused a work request: one byte, so that the result of
/// `post_send`/`post_recv` travels in registers; [`Error::from`] gives the
/// errno-faithful error with its reason (Linux returns `-ENOMEM` for a full
/// queue or too much inline data, `-EINVAL` for the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PostFault {
    /// The work queue is full (`-ENOMEM`).
    QueueFull,
    /// More inline bytes than the QP's `max_inline_data` (`-ENOMEM`, as
    /// libmlx4 and kernel mlx5 answer).
    InlineTooLong,
    /// The opcode is not valid for the QP type.
    BadOpcode,
    /// More scatter/gather entries than the queue takes.
    TooManySge,
    /// The opcode-specific fields do not match the opcode.
    FieldsMismatch,
    /// `IB_SEND_INLINE` with a gather list but no inline bytes: the driver
    /// cannot read memory through bus addresses.
    InlineWithoutBytes,
    /// The address handle names no live AH.
    UnknownAh,
    /// The request does not fit one send WQE.
    WqeTooLarge,
    /// A send posted to a QP in RESET, INIT or RTR (IBTA 10.3.1).
    NotReadyToSend,
    /// A QP0/QP1 send posted without a UD header (`post_send_mlx`).
    NeedsUdHeader,
    /// A receive posted to a QP in RESET.
    RecvInReset,
    /// A receive posted to a QP that receives through an SRQ.
    RecvThroughSrq,
    /// The handle names no live object.
    NoObject,
}

impl From<PostFault> for Error {
    fn from(f: PostFault) -> Error {
        match f {
            PostFault::QueueFull => Error::QueueFull,
            PostFault::InlineTooLong => Error::NoMem,
            PostFault::BadOpcode => Error::Inval("opcode not valid for the QP type"),
            PostFault::TooManySge => Error::Inval("more SGEs than the work queue's max_sge"),
            PostFault::FieldsMismatch => {
                Error::Inval("work request fields do not match its opcode")
            }
            PostFault::InlineWithoutBytes => Error::Inval(
                "an inline send carries its bytes in inline_data (the driver cannot read them through the SGEs)",
            ),
            PostFault::UnknownAh => Error::Inval("unknown address handle"),
            PostFault::WqeTooLarge => Error::Inval("work request larger than a send WQE"),
            PostFault::NotReadyToSend => Error::Inval("send posted to a QP not yet in RTS"),
            PostFault::NeedsUdHeader => {
                Error::Inval("QP0/QP1 sends need a UD header (post_send_mlx)")
            }
            PostFault::RecvInReset => Error::Inval("receive posted to a QP in RESET"),
            PostFault::RecvThroughSrq => Error::Inval("QP receives through an SRQ"),
            PostFault::NoObject => Error::NoObject,
        }
    }
}

impl core::fmt::Display for PostFault {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", Error::from(*self))
    }
}

/// A failed post: why, and the index of the first work request not posted
/// (Linux's `*bad_wr`); the ones before it were posted. Sixteen bytes, so
/// `Result<(), PostError>` is returned in two registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostError {
    /// Why.
    pub err: PostFault,
    /// Index of the first request not posted.
    pub bad_wr: usize,
}

impl PostError {
    /// The error as mlx4_ib's [`Error`] (errno-faithful).
    pub fn error(&self) -> Error {
        Error::from(self.err)
    }
}

impl core::fmt::Display for PostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "work request {}: {}", self.bad_wr, self.err)
    }
}

/// A failed QP0/QP1 post ([`Mlx4IbQp::post_send_mlx`]): building the UD
/// header may fail with any error (a P_Key or GID query through MAD_IFC),
/// so this one carries the full [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlxPostError {
    /// Why.
    pub err: Error,
    /// Index of the first request not posted.
    pub bad_wr: usize,
}

impl From<PostError> for MlxPostError {
    fn from(e: PostError) -> MlxPostError {
        MlxPostError {
            err: e.error(),
            bad_wr: e.bad_wr,
        }
    }
}

/// Builds the UD header of an MLX (QP0/QP1) send into a buffer; supplied by
/// ib_core's `ud_header` (Linux `build_mlx_header` calls `ib_ud_header_init`
/// and `ib_ud_header_pack`).
pub trait MlxHeader {
    /// Packs the LRH/GRH/BTH/DETH(/immediate) for `wr` sent on `qp` into
    /// `out`; returns the length and the LRH fields the MLX segment repeats.
    fn build(&mut self, qp: &MlxSendInfo, wr: &SendWr<'_>, out: &mut [u8]) -> Result<MlxFields>;
}

/// What `build_mlx_header` knows about the sending special QP.
#[derive(Debug, Clone, Copy)]
pub struct MlxSendInfo {
    /// True for QP0 (VL15, source QPN 0).
    pub is_qp0: bool,
    /// Port of the QP.
    pub port: u8,
    /// QP state for special QPs (pkey index, qkey, next PSN).
    pub sqp: Sqp,
    /// The address vector of the WR's AH.
    pub av: wqe::Av,
    /// Ethernet (RoCE) AH: destination MAC and VLAN tag (0xffff: none).
    pub eth: Option<([u8; 6], u16)>,
}

/// LRH fields the MLX segment needs besides the packed header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MlxFields {
    /// Header length in bytes.
    pub len: usize,
    /// LRH DLID.
    pub dlid: u16,
    /// LRH SL.
    pub sl: u8,
    /// Ethernet (RoCE): what the MLX segment carries instead of the LRH's
    /// fields.
    pub eth: Option<MlxEth>,
}

/// The MLX segment's fields of a send on an Ethernet port (Linux
/// `build_mlx_header` and `mlx4_ib_post_send` for QP1 over RoCE).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MlxEth {
    /// Destination MAC (repeated in the control segment).
    pub dmac: [u8; 6],
    /// The 802.1Q priority, shifted to the TCI's bits 15:13.
    pub pcp: u16,
    /// Source and destination MAC are the same: loop back.
    pub loopback: bool,
}

impl Mlx4IbQp {
    /// Moves the QP to `s` (the firmware agreed) and recomputes which
    /// requests the straight-line send path takes in it.
    pub(crate) fn set_state(&mut self, s: QpState) {
        self.state = s;
        self.rq_fast_post = if s == QpState::Reset {
            0
        } else {
            self.rq.max_post
        };
        let m = if matches!(s, QpState::Rts | QpState::Sqd) && self.send_db.is_some() {
            fast_shapes(self.qp_type)
        } else {
            0
        };
        self.fast_shapes = [
            if self.sq.max_gs >= 1 { m } else { 0 },
            if self.fast_max_inline > 0 { m } else { 0 },
        ];
    }

    /// Linux `stamp_send_wqe` (one WQE per WR): the first dword of every
    /// 64-byte chunk after the first of WQE `n`, as far as its last use
    /// reached (its DS count), becomes 0xffffffff so the prefetcher never
    /// sees stale data as valid. Chunks beyond were stamped before that use
    /// (RST->INIT stamps the whole stride).
    #[inline(always)]
    fn stamp_send_wqe(&self, n: u32) {
        let base = self.send_wqe_offset(n);
        let b = self.buf.window();
        let ds = match b.block::<64>(base) {
            Some(c) => c.read_u8(ctrl::FENCE_SIZE),
            None => b.read_u8(base + ctrl::FENCE_SIZE),
        };
        let s = usize::from(ds & ctrl::DS_MASK) << 4;
        let mut i = 64;
        while i < s {
            b.write_be32(base + i, wqe::STAMP);
            i += 64;
        }
    }

    /// The RST->INIT preparation of `__mlx4_ib_modify_qp`: every send WQE
    /// gets an owner bit that is invalid in pass 0, the full DS count, and
    /// its stamps.
    pub(crate) fn stamp_all(&mut self) {
        let ds = (1u32 << (self.sq.wqe_shift - 4)) as u8;
        for i in 0..self.sq.wqe_cnt {
            let base = self.send_wqe_offset(i);
            self.buf.write_be32(base + ctrl::OWNER_OPCODE, ctrl::OWNER);
            self.buf.write_be32(base + 4, u32::from(ds));
            self.stamp_send_wqe(i);
        }
    }

    /// Writes data segments `sg` at `off`, in reverse order, each byte count
    /// behind a barrier (Linux `set_data_seg`); returns the offset after
    /// them.
    #[inline(always)]
    fn write_data_segs(&self, off: usize, sg: &[crate::verbs::Sge]) -> usize {
        let mut i = sg.len();
        while i > 0 {
            i -= 1;
            let s = &sg[i];
            let d = off + i * data::SIZE;
            self.buf.write_be64(d + data::ADDR, s.addr);
            // libmlx4 encodes a zero length as 0x80000000 (2 GiB).
            let bc = if s.length == 0 { 0x8000_0000 } else { s.length };
            // The byte count must not be seen before the rest of the
            // segment (it overwrites the chunk's stamp): lkey, barrier,
            // then byte count, as one ordered pair of stores.
            self.buf.write_be32(d + data::LKEY, s.lkey);
            dma_wmb();
            self.buf.write_be32(d + data::BYTE_COUNT, bc);
        }
        off + sg.len() * data::SIZE
    }

    /// Copies inline data at `off` in segments that never cross 64 bytes
    /// (libmlx4's inline path); returns the bytes used, headers included.
    /// More than the QP's `max_inline_data` is `-ENOMEM` (libmlx4's and
    /// kernel mlx5's answer).
    fn write_inline(&self, off: usize, src: &[u8]) -> core::result::Result<usize, PostFault> {
        if src.len() > self.max_inline_data as usize {
            return Err(PostFault::InlineTooLong);
        }
        let mut seg = off;
        let mut pos = off + inline::SIZE;
        let mut rest = src;
        let mut nseg = 0usize;
        loop {
            let room = inline::ALIGN - (pos % inline::ALIGN);
            if rest.len() < room {
                break;
            }
            let (now, later) = rest.split_at(room);
            self.buf.write_bytes(pos, now);
            dma_wmb();
            self.buf.write_be32(seg, inline::SEG | (now.len() as u32));
            nseg += 1;
            rest = later;
            seg = pos + room;
            pos = seg + inline::SIZE;
        }
        if !rest.is_empty() {
            self.buf.write_bytes(pos, rest);
            dma_wmb();
            self.buf.write_be32(seg, inline::SEG | (rest.len() as u32));
            nseg += 1;
        }
        Ok(src.len() + nseg * inline::SIZE)
    }

    /// Linux `mlx4_ib_post_send` for RC, UC and UD QPs (QP0/QP1 go through
    /// [`Mlx4IbQp::post_send_mlx`]): every request of `wrs` built, then one
    /// doorbell. Stops at the first bad request; the ones before it are
    /// posted and the doorbell rung for them.
    ///
    /// An RDMA WRITE/READ or SEND with one SGE or a little inline data on
    /// an RC/UC QP in RTS or SQD takes a straight line of its own (a single
    /// one, doorbell included, without entering the loop); everything
    /// else, and every refusal, the general builder.
    #[inline(always)]
    pub fn post_send(
        &mut self,
        ahs: &Slab<Mlx4IbAh>,
        wrs: &[SendWr<'_>],
    ) -> core::result::Result<(), PostError> {
        if let [wr] = wrs {
            let ind = self.sq.head;
            if self.write_fast::<true>(wr, ind, 0) {
                return Ok(());
            }
        }
        self.post_send_list(ahs, wrs)
    }

    /// The loop of `mlx4_ib_post_send`: each request on the straight line
    /// if it takes it, else through the general builder; the stamps of all
    /// but the last WQE as they are built, then the doorbell, then the last
    /// stamp. A run of straight-line requests stays in a loop of its own;
    /// the first request that leaves it hands the rest to
    /// [`Mlx4IbQp::post_send_rest`].
    #[inline(never)]
    fn post_send_list(
        &mut self,
        ahs: &Slab<Mlx4IbAh>,
        wrs: &[SendWr<'_>],
    ) -> core::result::Result<(), PostError> {
        if matches!(self.qp_type, QpType::Smi | QpType::Gsi) {
            return Err(PostError {
                err: PostFault::NeedsUdHeader,
                bad_wr: 0,
            });
        }
        self.check_send_state()?;
        let head = self.sq.head;
        let mut nreq = 0u32;
        let mut res = Ok(());
        for wr in wrs {
            let ind = head.wrapping_add(nreq);
            if !self.write_fast::<false>(wr, ind, nreq) {
                let (n, r) = self.post_send_rest(ahs, wrs, nreq);
                nreq = n;
                res = r;
                break;
            }
            self.set_wrid(ind, wr.wr_id);
            nreq += 1;
            // Stamp now unless this is the last WQE: that one waits until
            // after the doorbell (latency).
            if (nreq as usize) < wrs.len() {
                self.stamp_after(ind);
            }
        }
        if nreq > 0 {
            self.sq.head = head.wrapping_add(nreq);
            self.ring_send_doorbell();
            self.stamp_after(head.wrapping_add(nreq - 1));
        }
        res
    }

    /// The rest of a list from request `nreq` on, the first one the
    /// straight line did not take: each request through the general
    /// builder unless the straight line takes it. Returns how many of
    /// `wrs` are built (the earlier ones included) and why the next one
    /// was not.
    #[inline(never)]
    fn post_send_rest(
        &mut self,
        ahs: &Slab<Mlx4IbAh>,
        wrs: &[SendWr<'_>],
        mut nreq: u32,
    ) -> (u32, core::result::Result<(), PostError>) {
        let head = self.sq.head;
        for (i, wr) in wrs.iter().enumerate().skip(nreq as usize) {
            let ind = head.wrapping_add(nreq);
            if self.write_fast::<false>(wr, ind, nreq) {
                self.set_wrid(ind, wr.wr_id);
            } else {
                if let Err(err) = self.build_send_wqe(ahs, wr, ind, nreq) {
                    return (nreq, Err(PostError { err, bad_wr: i }));
                }
                // The general builder makes WQEs of any size: the
                // straight line stamps for a full pass after them.
                self.stamp_until = ind.wrapping_add(self.sq.wqe_cnt);
            }
            nreq += 1;
            if i + 1 < wrs.len() {
                self.stamp_after(ind);
            }
        }
        (nreq, Ok(()))
    }

    /// The straight-line WQE of one request at producer index `ind`, with
    /// `nreq` built before it in this call: RDMA WRITE/READ or a SEND of an
    /// RC or UC QP in RTS/SQD with one SGE (a WQE within the first 64-byte
    /// chunk) or with inline data in at most two segments, built with
    /// direct stores into one bounds-checked block; with `RING` (a single
    /// request) its wr_id, the producer index and the doorbell follow
    /// ([`Mlx4IbQp::fast_ring`], in each branch: one jump less). Returns
    /// false, having written nothing, for anything else (other opcodes,
    /// states or transports, more SGEs, a full queue, fields that do not
    /// match the opcode): the general builder then builds it or says why
    /// not.
    ///
    /// Which (opcode, fields) pairs qualify is one precomputed bit mask
    /// ([`Mlx4IbQp::fast_shapes`]), so opcode, transport, state and the
    /// shape of `wr.wr` cost one test.
    #[inline(always)]
    fn write_fast<const RING: bool>(&mut self, wr: &SendWr<'_>, ind: u32, nreq: u32) -> bool {
        let opi = wr.opcode as u32;
        let f = wr.send_flags.0;
        let inline = f & SendFlags::INLINE.0 != 0;
        let shapes = self.fast_shapes[usize::from(inline)];
        if shapes & (1 << (opi * 4 + detail_kind(&wr.wr))) == 0 || self.sq.overflow(nreq) {
            return false;
        }
        if inline {
            return self.write_fast_inline::<RING>(wr, ind);
        }
        let [sg] = wr.sg_list else {
            return false;
        };
        let Some(blk) = self.buf.window().block::<64>(self.send_wqe_offset(ind)) else {
            return false;
        };
        let (flags, hi) = self.ctrl_words(wr, ind);
        // The data segment after the remote-address segment of RDMA (the
        // shape check let only RDMA, kind 1, and plain sends, kind 0,
        // through).
        let at = ctrl::SIZE + (detail_kind(&wr.wr) & 1) as usize * raddr::SIZE;
        // libmlx4 encodes a zero length as 0x80000000 (2 GiB).
        let bc = if sg.length == 0 {
            0x8000_0000
        } else {
            sg.length
        };
        blk.write_be64(at, (u64::from(bc) << 32) | u64::from(sg.lkey));
        blk.write_be64(at + data::ADDR, sg.addr);
        if let WrDetail::Rdma { remote_addr, rkey } = wr.wr {
            write_raddr(&blk, remote_addr, rkey);
        }
        let size = (at / 16) as u32 + 1;
        finish_ctrl(&blk, flags, hi | u64::from(size));
        if RING {
            self.fast_ring(ind, wr.wr_id);
        }
        true
    }

    /// [`Mlx4IbQp::write_fast`] for inline data (checked shape): the bytes
    /// in at most two inline segments of a 128-byte block.
    #[inline(always)]
    fn write_fast_inline<const RING: bool>(&mut self, wr: &SendWr<'_>, ind: u32) -> bool {
        let data = wr.inline_data;
        // No bytes (perhaps a gather list the driver cannot read through):
        // the general builder.
        if data.len().wrapping_sub(1) >= self.fast_max_inline {
            return false;
        }
        let Some(blk) = self.buf.window().block::<128>(self.send_wqe_offset(ind)) else {
            return false;
        };
        let (flags, hi) = self.ctrl_words(wr, ind);
        let size = match wr.wr {
            WrDetail::Rdma { remote_addr, rkey } => {
                write_raddr(&blk, remote_addr, rkey);
                write_inline2::<{ ctrl::SIZE + raddr::SIZE }>(&blk, data)
            }
            _ => write_inline2::<{ ctrl::SIZE }>(&blk, data),
        };
        finish_ctrl(&blk, flags, hi | u64::from(size));
        if size > 4 {
            // Data past the first chunk: its slot needs restamping when
            // the stamp index reaches it a pass from now.
            self.stamp_until = ind.wrapping_add(self.sq.wqe_cnt);
        }
        if RING {
            self.fast_ring(ind, wr.wr_id);
        }
        true
    }

    /// The control segment of the send WQE at producer index `ind` for
    /// `wr`, as its two 8-byte words: owner, opcode and fence (the size in
    /// 16-byte units left for the caller to add), then `srcrb_flags` with
    /// the immediate.
    #[inline(always)]
    fn ctrl_words(&self, wr: &SendWr<'_>, ind: u32) -> (u64, u64) {
        let op = &OP_INFO[wr.opcode as usize & 15];
        let (srcrb, fence) = self.ctrl_by_flags[(wr.send_flags.0 & 7) as usize];
        let imm = wr.imm_data & op.imm_mask;
        // The pass bit of `ind` moved to bit 31 by one multiply.
        let owner = (ind & self.sq.wqe_cnt) * self.owner_mul;
        let hi = (u64::from(op.hw | owner) << 32) | fence;
        (srcrb | u64::from(imm), hi)
    }

    /// The wr_id of the send WQE at producer index `ind`, by its slot.
    #[inline(always)]
    fn set_wrid(&mut self, ind: u32, wr_id: u64) {
        let slot = (ind & self.sq.mask) as usize;
        if let Some(w) = self.sq.wrid.get_mut(slot) {
            *w = wr_id;
        }
    }

    /// The end of a single straight-line post: the wr_id, the producer
    /// index, the doorbell, and the stamp if one can be needed.
    #[inline(always)]
    fn fast_ring(&mut self, ind: u32, wr_id: u64) {
        self.set_wrid(ind, wr_id);
        self.sq.head = ind.wrapping_add(1);
        // Descriptors before the doorbell.
        wmb();
        if let Some(db) = &self.send_db {
            db.write_be32(self.doorbell_qpn);
        }
        self.stamp_after(ind);
    }

    /// Linux stamps WQE `ind + sq_spare_wqes` after posting WQE `ind`; only
    /// chunks past the first 64 bytes that the slot's last WQE filled get a
    /// stamp, so while no WQE of the last pass was larger than 64 bytes
    /// ([`Mlx4IbQp::stamp_until`]) there is nothing to write, and the read
    /// of the slot's size is skipped.
    #[inline(always)]
    fn stamp_after(&self, ind: u32) {
        if self.stamp_until.wrapping_sub(ind) as i32 > 0 {
            self.stamp_send_wqe(ind.wrapping_add(self.sq_spare_wqes));
        }
    }

    /// Sends are an immediate error in RESET, INIT and RTR (IBTA 10.3.1).
    #[inline]
    fn check_send_state(&self) -> core::result::Result<(), PostError> {
        match self.state {
            QpState::Reset | QpState::Init | QpState::Rtr => Err(PostError {
                err: PostFault::NotReadyToSend,
                bad_wr: 0,
            }),
            _ => Ok(()),
        }
    }

    /// The send doorbell, behind a barrier that makes the WQEs visible
    /// first.
    #[inline(always)]
    fn ring_send_doorbell(&self) {
        wmb();
        match &self.send_db {
            Some(d) => d.write_be32(self.doorbell_qpn),
            None => self.uar.write_be32(SEND_DOORBELL, self.doorbell_qpn),
        }
    }

    /// One send WQE at producer index `ind` (the body of Linux's loop).
    #[inline(always)]
    fn build_send_wqe(
        &mut self,
        ahs: &Slab<Mlx4IbAh>,
        wr: &SendWr<'_>,
        ind: u32,
        nreq: u32,
    ) -> core::result::Result<(), PostFault> {
        let inline = wr.send_flags.contains(SendFlags::INLINE);
        if inline && wr.inline_data.is_empty() && !wr.sg_list.is_empty() {
            return Err(PostFault::InlineWithoutBytes);
        }
        if self.sq.overflow(nreq) {
            return Err(PostFault::QueueFull);
        }
        let opi = wr.opcode as u32;
        if self.ops_allowed & (1 << opi) == 0 {
            return Err(PostFault::BadOpcode);
        }
        let op = HW_OPCODE[opi as usize & 15];
        if !inline && wr.sg_list.len() > self.sq.max_gs as usize {
            return Err(PostFault::TooManySge);
        }
        // Refused before a byte of the WQE is written.
        if inline && wr.inline_data.len() > self.max_inline_data as usize {
            return Err(PostFault::InlineTooLong);
        }
        let base = self.send_wqe_offset(ind);
        if !inline && wr.sg_list.len() <= 4 {
            return self.build_send_wqe_staged(ahs, wr, ind);
        }
        let mut off = base + ctrl::SIZE;
        match &wr.wr {
            WrDetail::Rdma { remote_addr, rkey } if RDMA_OPS & (1 << opi) != 0 => {
                self.buf.write_be64(off + raddr::RADDR, *remote_addr);
                self.buf
                    .write_be64(off + raddr::RKEY, u64::from(*rkey) << 32);
                off += raddr::SIZE;
            }
            WrDetail::None if SEND_OPS & (1 << opi) != 0 && self.qp_type != QpType::Ud => {}
            WrDetail::Atomic {
                remote_addr,
                compare_add,
                swap,
                compare_add_mask,
                swap_mask,
                rkey,
            } if ATOMIC_OPS & (1 << opi) != 0 => {
                self.buf.write_be64(off + raddr::RADDR, *remote_addr);
                self.buf
                    .write_be64(off + raddr::RKEY, u64::from(*rkey) << 32);
                off += raddr::SIZE;
                match wr.opcode {
                    // set_atomic_seg: CAS carries swap and compare; FAA the
                    // addend in the first field.
                    WrOpcode::AtomicCmpAndSwp => {
                        self.buf.write_be64(off + atomic::SWAP_ADD, *swap);
                        self.buf.write_be64(off + atomic::COMPARE, *compare_add);
                        off += atomic::SIZE;
                    }
                    WrOpcode::AtomicFetchAndAdd => {
                        self.buf.write_be64(off + atomic::SWAP_ADD, *compare_add);
                        self.buf.write_be64(off + atomic::COMPARE, 0);
                        off += atomic::SIZE;
                    }
                    // set_masked_atomic_seg (CAS) and Linux's FAA variant,
                    // which sends add and add mask in a plain atomic segment.
                    WrOpcode::MaskedAtomicCmpAndSwp => {
                        self.buf.write_be64(off + atomic::SWAP_ADD, *swap);
                        self.buf.write_be64(off + atomic::COMPARE, *compare_add);
                        self.buf.write_be64(off + atomic::SWAP_ADD_MASK, *swap_mask);
                        self.buf
                            .write_be64(off + atomic::COMPARE_MASK, *compare_add_mask);
                        off += atomic::MASKED_SIZE;
                    }
                    _ => {
                        self.buf.write_be64(off + atomic::SWAP_ADD, *compare_add);
                        self.buf
                            .write_be64(off + atomic::COMPARE, *compare_add_mask);
                        off += atomic::SIZE;
                    }
                }
            }
            WrDetail::Ud {
                ah,
                remote_qpn,
                remote_qkey,
                ..
            } if self.qp_type == QpType::Ud => {
                let ah = ahs.get(ah.0).ok_or(PostFault::UnknownAh)?;
                self.buf.write_bytes(off + datagram::AV, &ah.av);
                self.buf.write_be64(
                    off + datagram::DQPN,
                    (u64::from(*remote_qpn & 0xff_ffff) << 32) | u64::from(*remote_qkey),
                );
                self.buf.write_be64(off + datagram::VLAN, ah.vlan_mac);
                off += datagram::SIZE;
            }
            _ => return Err(PostFault::FieldsMismatch),
        }
        let end = if inline {
            let end = off + self.write_inline(off, wr.inline_data)?;
            if end - base > (1 << self.sq.wqe_shift) {
                return Err(PostFault::WqeTooLarge);
            }
            end
        } else {
            self.write_data_segs(off, wr.sg_list)
        };
        let size = (end - base).div_ceil(16) as u32;
        let slot = (self.sq.head.wrapping_add(nreq) & (self.sq.wqe_cnt - 1)) as usize;
        if let Some(w) = self.sq.wrid.get_mut(slot) {
            *w = wr.wr_id;
        }
        let srcrb = self.sq_signal_bits | SRCRB_FLAGS[(wr.send_flags.0 & 7) as usize];
        let fence = (wr.send_flags.0 & SendFlags::FENCE.0) << 6;
        let imm = if IMM_OPS & (1 << opi) != 0 {
            wr.imm_data
        } else {
            0
        };
        self.buf.write_be64(
            base + ctrl::SRCRB_FLAGS,
            (u64::from(srcrb) << 32) | u64::from(imm),
        );
        // Linux writes the segments, a barrier, fence_size, a barrier, then
        // the owner/opcode dword that hands the WQE to the HCA. One aligned
        // 8-byte store of both after the barrier keeps that order: the HCA
        // never sees the new owner bit with a stale size.
        dma_wmb();
        let owner = (ind & self.sq.wqe_cnt != 0) as u32 * ctrl::OWNER;
        self.buf.write_be64(
            base + ctrl::OWNER_OPCODE,
            (u64::from(op | owner) << 32) | u64::from(fence | size),
        );
        Ok(())
    }

    /// The common case of [`Mlx4IbQp::build_send_wqe`] (no inline data, at
    /// most 4 SGEs: at most 128 bytes): the WQE is assembled in a local
    /// buffer and copied in one piece, then the first dword of its second
    /// 64-byte chunk (left as the stamp by the copy) and the owner dword are
    /// written, each behind a barrier, which keeps Linux's rule that no
    /// chunk looks valid before its contents.
    #[inline(always)]
    fn build_send_wqe_staged(
        &mut self,
        ahs: &Slab<Mlx4IbAh>,
        wr: &SendWr<'_>,
        ind: u32,
    ) -> core::result::Result<(), PostFault> {
        let base = self.send_wqe_offset(ind);
        let opi = wr.opcode as u32;
        let op = HW_OPCODE[opi as usize & 15];
        let mut st = [0u8; 128];
        let mut off = ctrl::SIZE;
        match &wr.wr {
            WrDetail::Rdma { remote_addr, rkey } if RDMA_OPS & (1 << opi) != 0 => {
                put_be64(&mut st, off, *remote_addr);
                put_be64(&mut st, off + 8, u64::from(*rkey) << 32);
                off += raddr::SIZE;
            }
            WrDetail::None if SEND_OPS & (1 << opi) != 0 && self.qp_type != QpType::Ud => {}
            WrDetail::Atomic {
                remote_addr,
                compare_add,
                swap,
                compare_add_mask,
                swap_mask,
                rkey,
            } if ATOMIC_OPS & (1 << opi) != 0 => {
                put_be64(&mut st, off, *remote_addr);
                put_be64(&mut st, off + 8, u64::from(*rkey) << 32);
                off += raddr::SIZE;
                let (a, b, masks) = match wr.opcode {
                    WrOpcode::AtomicCmpAndSwp => (*swap, *compare_add, None),
                    WrOpcode::AtomicFetchAndAdd => (*compare_add, 0, None),
                    WrOpcode::MaskedAtomicCmpAndSwp => {
                        (*swap, *compare_add, Some((*swap_mask, *compare_add_mask)))
                    }
                    _ => (*compare_add, *compare_add_mask, None),
                };
                put_be64(&mut st, off, a);
                put_be64(&mut st, off + 8, b);
                off += atomic::SIZE;
                if let Some((sm, cm)) = masks {
                    put_be64(&mut st, off, sm);
                    put_be64(&mut st, off + 8, cm);
                    off += atomic::SIZE;
                }
            }
            WrDetail::Ud {
                ah,
                remote_qpn,
                remote_qkey,
                ..
            } if self.qp_type == QpType::Ud => {
                let ah = ahs.get(ah.0).ok_or(PostFault::UnknownAh)?;
                if let Some(d) = st.get_mut(off..off + 32) {
                    d.copy_from_slice(&ah.av);
                }
                put_be64(
                    &mut st,
                    off + datagram::DQPN,
                    (u64::from(*remote_qpn & 0xff_ffff) << 32) | u64::from(*remote_qkey),
                );
                put_be64(&mut st, off + datagram::VLAN, ah.vlan_mac);
                off += datagram::SIZE;
            }
            _ => return Err(PostFault::FieldsMismatch),
        }
        for s in wr.sg_list {
            // libmlx4 encodes a zero length as 0x80000000 (2 GiB).
            let bc = if s.length == 0 { 0x8000_0000 } else { s.length };
            put_be64(&mut st, off, (u64::from(bc) << 32) | u64::from(s.lkey));
            put_be64(&mut st, off + 8, s.addr);
            off += data::SIZE;
        }
        if off > (1 << self.sq.wqe_shift) || off > st.len() {
            return Err(PostFault::WqeTooLarge);
        }
        let size = (off / 16) as u32;
        self.set_wrid(ind, wr.wr_id);
        let srcrb = self.sq_signal_bits | SRCRB_FLAGS[(wr.send_flags.0 & 7) as usize];
        let imm = if IMM_OPS & (1 << opi) != 0 {
            wr.imm_data
        } else {
            0
        };
        put_be64(
            &mut st,
            ctrl::SRCRB_FLAGS,
            (u64::from(srcrb) << 32) | u64::from(imm),
        );
        // A second chunk keeps its stamp until the rest of it is in place.
        let chunk1 = if off > 64 {
            let mut d = [0u8; 4];
            d.copy_from_slice(&st[64..68]);
            st[64..68].copy_from_slice(&wqe::STAMP.to_be_bytes());
            Some(u32::from_be_bytes(d))
        } else {
            None
        };
        let b = self.buf.window();
        b.write_bytes(base + 8, &st[8..off]);
        if let Some(d) = chunk1 {
            dma_wmb();
            b.write_be32(base + 64, d);
        }
        dma_wmb();
        let fence = (wr.send_flags.0 & SendFlags::FENCE.0) << 6;
        let owner = (ind & self.sq.wqe_cnt != 0) as u32 * ctrl::OWNER;
        b.write_be64(
            base + ctrl::OWNER_OPCODE,
            (u64::from(op | owner) << 32) | u64::from(fence | size),
        );
        Ok(())
    }

    /// Linux `mlx4_ib_post_send` for QP0/QP1 (`build_mlx_header`): the MLX
    /// segment overlaying the control segment, the UD header from `hdr` in
    /// inline segments split at 64 bytes, the data segments, and the 4-byte
    /// ICRC inline segment.
    pub fn post_send_mlx(
        &mut self,
        ahs: &Slab<Mlx4IbAh>,
        hdr: &mut dyn MlxHeader,
        wrs: &[SendWr<'_>],
    ) -> core::result::Result<(), MlxPostError> {
        self.check_send_state()?;
        let mut ind = self.sq.head;
        let mut nreq = 0u32;
        let mut stamp = 0;
        let mut res = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(err) = self.build_mlx_wqe(ahs, hdr, wr, ind, nreq) {
                res = Err(MlxPostError { err, bad_wr: i });
                break;
            }
            stamp = ind.wrapping_add(self.sq_spare_wqes);
            ind = ind.wrapping_add(1);
            nreq += 1;
            if i + 1 < wrs.len() {
                self.stamp_send_wqe(stamp);
            }
        }
        if nreq > 0 {
            self.stamp_until = ind.wrapping_add(self.sq.wqe_cnt);
            self.sq.head = ind;
            self.ring_send_doorbell();
            self.stamp_send_wqe(stamp);
        }
        res
    }

    fn build_mlx_wqe(
        &mut self,
        ahs: &Slab<Mlx4IbAh>,
        hdr: &mut dyn MlxHeader,
        wr: &SendWr<'_>,
        ind: u32,
        nreq: u32,
    ) -> Result<()> {
        if wr.send_flags.contains(SendFlags::INLINE)
            && wr.inline_data.is_empty()
            && !wr.sg_list.is_empty()
        {
            return Err(PostFault::InlineWithoutBytes.into());
        }
        let sqp = self.sqp.ok_or(Error::Inval("not a special QP"))?;
        if self.sq.overflow(nreq) {
            return Err(Error::QueueFull);
        }
        if wr.sg_list.len() > self.sq.max_gs as usize {
            return Err(Error::Inval("more SGEs than max_send_sge"));
        }
        let opi = wr.opcode as u32;
        if self.ops_allowed & (1 << opi) == 0 {
            return Err(Error::Inval("opcode not valid for the QP type"));
        }
        let op = HW_OPCODE[opi as usize & 15];
        let WrDetail::Ud { ah, .. } = wr.wr else {
            return Err(Error::Inval("QP0/QP1 sends need an address handle"));
        };
        let ah = ahs
            .get(ah.0)
            .ok_or(Error::Inval("unknown address handle"))?;
        let av = wqe::Av::from_bytes(&ah.av);
        let info = MlxSendInfo {
            is_qp0: self.qp_type == QpType::Smi,
            port: self.port,
            sqp,
            av,
            eth: ah.eth(),
        };
        let mut h = [0u8; UD_HEADER_SIZE as usize];
        let f = hdr.build(&info, wr, &mut h)?;
        let h = h.get(..f.len).ok_or(Error::Inval("UD header too long"))?;
        if let Some(s) = self.sqp.as_mut() {
            s.send_psn = s.send_psn.wrapping_add(1) & 0xff_ffff;
        }
        let base = self.send_wqe_offset(ind);
        let seglen = self.write_mlx_header(base, &av, &f, wr.send_flags, h);
        let mut off = base + mlx::SIZE + seglen;
        // Data segments, then the ICRC segment after them (written first,
        // as Linux does, so the reverse order holds).
        let icrc = off + wr.sg_list.len() * data::SIZE;
        self.buf.write_be32(icrc + 4, 0);
        dma_wmb();
        self.buf.write_be32(icrc, inline::SEG | 4);
        off = self.write_data_segs(off, wr.sg_list) + data::SIZE;
        let size = (off - base).div_ceil(16);
        if size > (1 << (self.sq.wqe_shift - 4)) {
            return Err(Error::Inval("work request larger than a send WQE"));
        }
        let slot = (self.sq.head.wrapping_add(nreq) & (self.sq.wqe_cnt - 1)) as usize;
        if let Some(w) = self.sq.wrid.get_mut(slot) {
            *w = wr.wr_id;
        }
        dma_wmb();
        self.buf.write_be32(base + 4, size as u32);
        dma_wmb();
        let owner = if ind & self.sq.wqe_cnt != 0 {
            ctrl::OWNER
        } else {
            0
        };
        self.buf.write_be32(base + ctrl::OWNER_OPCODE, op | owner);
        Ok(())
    }

    /// The MLX segment and the header's inline segments at `base`; returns
    /// the bytes after the MLX segment, padded to 16.
    fn write_mlx_header(
        &self,
        base: usize,
        av: &wqe::Av,
        f: &MlxFields,
        flags: SendFlags,
        h: &[u8],
    ) -> usize {
        // Only the completion bits of the control flags survive; then VL15
        // for QP0, SLR for a permissive DLID, SL, loopback (Linux 3.11 sets
        // no static rate here).
        let mut mflags = self.sq_signal_bits;
        if flags.contains(SendFlags::SIGNALED) {
            mflags |= ctrl::CQ_UPDATE;
        }
        if let Some(e) = &f.eth {
            // RoCE: the priority in sched_prio, the destination MAC over
            // the flags' upper half and the LRH dword (srcrb_flags16[0]
            // and imm of the control segment), loopback to our own MAC.
            if e.loopback {
                mflags |= ctrl::FORCE_LOOPBACK;
            }
            let d = e.dmac;
            self.buf
                .write_bytes(base + mlx::SCHED_PRIO, &e.pcp.to_be_bytes());
            self.buf.write_be32(
                base + mlx::FLAGS,
                (u32::from(d[0]) << 24) | (u32::from(d[1]) << 16) | (mflags & 0xffff),
            );
            self.buf.write_be32(
                base + mlx::RLID,
                u32::from_be_bytes([d[2], d[3], d[4], d[5]]),
            );
        } else {
            self.write_mlx_ib_flags(base, av, f, mflags);
        }
        self.write_mlx_inline(base, h)
    }

    /// The MLX segment's flags and remote LID on InfiniBand.
    fn write_mlx_ib_flags(&self, base: usize, av: &wqe::Av, f: &MlxFields, mut mflags: u32) {
        if self.qp_type == QpType::Smi {
            mflags |= mlx::VL15;
        }
        if f.dlid == 0xffff {
            mflags |= mlx::SLR;
        }
        mflags |= u32::from(f.sl & 0xf) << mlx::SL_SHIFT;
        if av.port_pd & (1 << 31) != 0 {
            mflags |= ctrl::FORCE_LOOPBACK;
        }
        self.buf.write_be32(base + mlx::FLAGS, mflags);
        self.buf
            .write_be32(base + mlx::RLID, u32::from(f.dlid) << 16);
    }

    /// The header's inline segments after the MLX segment at `base`;
    /// returns the bytes after the MLX segment, padded to 16.
    fn write_mlx_inline(&self, base: usize, h: &[u8]) -> usize {
        // The header in inline segments; the first may hold at most what
        // fits before the 64-byte boundary after its 4-byte header.
        let first = base + mlx::SIZE;
        let room = inline::ALIGN - (first % inline::ALIGN) - inline::SIZE;
        if h.len() <= room {
            self.buf.write_bytes(first + inline::SIZE, h);
            dma_wmb();
            self.buf.write_be32(first, inline::SEG | h.len() as u32);
            (inline::SIZE + h.len()).next_multiple_of(16)
        } else {
            let (a, b) = h.split_at(room);
            let second = first + inline::SIZE + room;
            self.buf.write_bytes(first + inline::SIZE, a);
            self.buf.write_bytes(second + inline::SIZE, b);
            dma_wmb();
            self.buf.write_be32(second, inline::SEG | b.len() as u32);
            dma_wmb();
            self.buf.write_be32(first, inline::SEG | a.len() as u32);
            (2 * inline::SIZE + h.len()).next_multiple_of(16)
        }
    }

    /// Linux `mlx4_ib_post_recv`: one receive WQE per request (data
    /// segments plus the terminator when fewer than `max_gs`), then the RQ
    /// doorbell record after a barrier. No MMIO. A single request with one
    /// SGE takes a straight line of its own.
    #[inline]
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        if let [wr] = wrs
            && self.post_recv_one_fast(wr)
        {
            return Ok(());
        }
        self.post_recv_general(wrs)
    }

    /// One receive with one SGE: the WQE in one bounds-checked block, the
    /// doorbell record. False, having written nothing, if it does not
    /// apply (the general path then posts it or says why not). The QP's
    /// state is folded into the queue-full test ([`Mlx4IbQp::rq_fast_post`]
    /// is 0 in RESET).
    #[inline(always)]
    fn post_recv_one_fast(&mut self, wr: &RecvWr<'_>) -> bool {
        let [s] = wr.sg_list else {
            return false;
        };
        let head = self.rq.head;
        if head.wrapping_sub(self.rq.tail) >= self.rq_fast_post {
            return false;
        }
        let Some(db) = &self.db else {
            return false;
        };
        let ind = head & self.rq.mask;
        // The RQ's offset and stride are multiples of 16 (a QP with a receive
        // queue has `wqe_shift` at least 4, and `alloc_qp_buf` places each queue at a multiple of the
        // other's size), so clearing the low three bits changes nothing; it
        // tells the compiler the block is 8-byte aligned, which drops
        // `block`'s alignment test (and a register) from this line.
        let base = (self.rq.offset + (ind as usize) * self.rq.stride) & !7;
        let w0 = (u64::from(s.length) << 32) | u64::from(s.lkey);
        let b = self.buf.window();
        // The data segment, and the terminator behind it when the WQE has
        // room for more.
        if self.rq.max_gs > 1 {
            let Some(blk) = b.block::<32>(base) else {
                return false;
            };
            blk.write_be64(0, w0);
            blk.write_be64(data::ADDR, s.addr);
            blk.write_be64(data::SIZE, u64::from(wqe::INVALID_LKEY));
            blk.write_be64(data::SIZE + data::ADDR, 0);
        } else {
            let Some(blk) = b.block::<16>(base) else {
                return false;
            };
            blk.write_be64(0, w0);
            blk.write_be64(data::ADDR, s.addr);
        }
        if let Some(w) = self.rq.wrid.get_mut(ind as usize) {
            *w = wr.wr_id;
        }
        let head = head.wrapping_add(1);
        self.rq.head = head;
        dma_wmb();
        db.write(0, mlx4_hw::doorbell::rq_db_record(head));
        true
    }

    #[inline(never)]
    fn post_recv_general(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        if self.state == QpState::Reset {
            return Err(PostError {
                err: PostFault::RecvInReset,
                bad_wr: 0,
            });
        }
        let Some(db) = &self.db else {
            return Err(PostError {
                err: PostFault::RecvThroughSrq,
                bad_wr: 0,
            });
        };
        let b = self.buf.window();
        let mut ind = self.rq.head & (self.rq.wqe_cnt - 1);
        let mut nreq = 0u32;
        let mut res = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if self.rq.overflow(nreq) {
                res = Err(PostError {
                    err: PostFault::QueueFull,
                    bad_wr: i,
                });
                break;
            }
            if wr.sg_list.len() > self.rq.max_gs as usize {
                res = Err(PostError {
                    err: PostFault::TooManySge,
                    bad_wr: i,
                });
                break;
            }
            let base = self.rq.offset + ((ind as usize) << self.rq.wqe_shift);
            for (k, s) in wr.sg_list.iter().enumerate() {
                let d = base + k * data::SIZE;
                b.write_be64(d, (u64::from(s.length) << 32) | u64::from(s.lkey));
                b.write_be64(d + data::ADDR, s.addr);
            }
            if wr.sg_list.len() < self.rq.max_gs as usize {
                let d = base + wr.sg_list.len() * data::SIZE;
                b.write_be64(d, u64::from(wqe::INVALID_LKEY));
                b.write_be64(d + data::ADDR, 0);
            }
            if let Some(w) = self.rq.wrid.get_mut(ind as usize) {
                *w = wr.wr_id;
            }
            ind = (ind + 1) & (self.rq.wqe_cnt - 1);
            nreq += 1;
        }
        if nreq > 0 {
            self.rq.head = self.rq.head.wrapping_add(nreq);
            // WQEs before the doorbell record.
            dma_wmb();
            db.write(0, mlx4_hw::doorbell::rq_db_record(self.rq.head));
        }
        res
    }
}

impl crate::Mlx4IbDev {
    /// Linux `mlx4_ib_post_send` (RC, UC, UD).
    #[inline]
    pub fn post_send(
        &mut self,
        id: crate::QpId,
        wrs: &[SendWr<'_>],
    ) -> core::result::Result<(), PostError> {
        match self.qps.slab.get_mut(id.0) {
            Some(qp) => qp.post_send(&self.ahs, wrs),
            None => Err(PostError {
                err: PostFault::NoObject,
                bad_wr: 0,
            }),
        }
    }

    /// Linux `mlx4_ib_post_send` for QP0/QP1, with ib_core's UD header.
    pub fn post_send_mlx(
        &mut self,
        id: crate::QpId,
        hdr: &mut dyn MlxHeader,
        wrs: &[SendWr<'_>],
    ) -> core::result::Result<(), MlxPostError> {
        match self.qps.slab.get_mut(id.0) {
            Some(qp) => qp.post_send_mlx(&self.ahs, hdr, wrs),
            None => Err(MlxPostError {
                err: Error::NoObject,
                bad_wr: 0,
            }),
        }
    }

    /// Linux `mlx4_ib_post_recv`.
    #[inline]
    pub fn post_recv(
        &mut self,
        id: crate::QpId,
        wrs: &[RecvWr<'_>],
    ) -> core::result::Result<(), PostError> {
        match self.qps.slab.get_mut(id.0) {
            Some(qp) => qp.post_recv(wrs),
            None => Err(PostError {
                err: PostFault::NoObject,
                bad_wr: 0,
            }),
        }
    }
}
