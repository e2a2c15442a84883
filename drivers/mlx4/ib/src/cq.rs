//! Completion queues (Linux `cq.c`): create, poll, clean and destroy.
//!
//! Create/destroy over mlx4_core, polling with the owner bit
//! (`mlx4_ib_poll_one`, `mlx4_ib_poll_cq`), every error syndrome mapped to
//! its `ib_wc_status` (`mlx4_ib_handle_error_cqe`), the `set_ci` and arm
//! doorbells (`mlx4_cq_set_ci`, `mlx4_cq_arm`), and removal of a QP's entries
//! (`__mlx4_ib_cq_clean`). Left out: resize, moderation (MODIFY_CQ), 64-byte
//! CQEs, timestamps and the Ethernet/XRC fields.

use hal::barrier::{dma_rmb, wmb};
use hal::{Bar, DmaBlock, DmaBuf};
use mlx4_core::mr::Mtt;
use mlx4_hw::cqe::{self, recv_opcode, syndrome};
use mlx4_hw::doorbell::{CQ_DB_REQ_NOT, CQ_DB_REQ_NOT_SOL, CQ_DOORBELL};
use mlx4_hw::wqe::opcode;

use crate::doorbell::Db;
use crate::srq::Mlx4IbSrq;
use crate::table::{QpTable, Slab};
use crate::verbs::{Wc, WcFlags, WcOpcode, WcStatus};
use crate::{Error, Result};

/// The hardware side of a CQ created through mlx4_core.
#[derive(Debug)]
pub(crate) struct CqHw {
    pub(crate) mcq: mlx4_core::cq::Cq,
    pub(crate) mtt: Mtt,
}

/// A completion queue (Linux `struct mlx4_ib_cq`).
pub struct Mlx4IbCq {
    pub(crate) buf: DmaBuf,
    /// Entries (a power of two); the verbs size is `nent - 1`.
    pub(crate) nent: u32,
    pub(crate) cons_index: u32,
    /// `set_ci` record (0) and arm record (1).
    pub(crate) db: Db,
    pub(crate) uar: Bar,
    pub(crate) cqn: u32,
    /// The real QPN of the last CQE's QP ([`NO_QPN`]: none) and its table
    /// slot (Linux `cur_qp`).
    cur: CurQp,
    /// An error met after completions that were returned first; reported
    /// by the next poll.
    pending: Option<PollFault>,
    pub(crate) hw: Option<CqHw>,
}

impl core::fmt::Debug for Mlx4IbCq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "Mlx4IbCq({:#x}, {} entries, ci {})",
            self.cqn, self.nent, self.cons_index
        )
    }
}

/// Linux `mlx4_ib_handle_error_cqe`: the status of an error syndrome.
pub fn syndrome_to_status(s: u8) -> WcStatus {
    match s {
        syndrome::LOCAL_LENGTH_ERR => WcStatus::LocLenErr,
        syndrome::LOCAL_QP_OP_ERR => WcStatus::LocQpOpErr,
        syndrome::LOCAL_PROT_ERR => WcStatus::LocProtErr,
        syndrome::WR_FLUSH_ERR => WcStatus::WrFlushErr,
        syndrome::MW_BIND_ERR => WcStatus::MwBindErr,
        syndrome::BAD_RESP_ERR => WcStatus::BadRespErr,
        syndrome::LOCAL_ACCESS_ERR => WcStatus::LocAccessErr,
        syndrome::REMOTE_INVAL_REQ_ERR => WcStatus::RemInvReqErr,
        syndrome::REMOTE_ACCESS_ERR => WcStatus::RemAccessErr,
        syndrome::REMOTE_OP_ERR => WcStatus::RemOpErr,
        syndrome::TRANSPORT_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        syndrome::RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        syndrome::REMOTE_ABORTED_ERR => WcStatus::RemAbortErr,
        _ => WcStatus::GeneralErr,
    }
}

/// No QP (the cached QP of [`Mlx4IbCq`] when none is cached): not a
/// 24-bit QPN.
const NO_QPN: u32 = u32::MAX;

/// The QPN bits of a CQE's first dword as a native load sees it (the
/// dword is big-endian: its low 24 bits are the last three bytes).
const RAW_QPN_MASK: u32 = cqe::QPN_MASK.to_be();

/// The owner bit a software-owned CQE at consumer index `ci` carries (the
/// pass parity, `ci & nent`, moved to bit 7).
#[inline(always)]
fn parity(ci: u32, nent: u32) -> u8 {
    u8::from(ci & nent != 0) << 7
}

/// Why a CQE could not be turned into a completion: one byte, so the
/// polling loop's results stay in registers; [`Error::from`] gives
/// mlx4_ib's error (`-EINVAL` with the reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PollFault {
    /// The CQE's place is outside the CQ buffer.
    OutsideBuffer,
    /// A completion for a NOP.
    Nop,
    /// A resize CQE on a CQ never resized.
    Resize,
    /// The CQE names no live QP.
    UnknownQp,
    /// A send CQE for a WQE not posted.
    SendNotPosted,
    /// A send CQE for an empty send queue.
    SendQueueEmpty,
    /// A receive CQE for an empty receive queue.
    RecvQueueEmpty,
    /// A CQE for a QP whose SRQ is gone.
    SrqGone,
    /// An SRQ completion for a WQE not posted.
    SrqNotPosted,
}

impl From<PollFault> for Error {
    fn from(f: PollFault) -> Error {
        Error::Inval(match f {
            PollFault::OutsideBuffer => "CQE outside the CQ buffer",
            PollFault::Nop => "completion for a NOP",
            PollFault::Resize => "resize CQE",
            PollFault::UnknownQp => "CQE for an unknown QP",
            PollFault::SendNotPosted => "send CQE for a WQE not posted",
            PollFault::SendQueueEmpty => "send CQE for an empty send queue",
            PollFault::RecvQueueEmpty => "receive CQE for an empty receive queue",
            PollFault::SrqGone => "CQE for a QP whose SRQ is gone",
            PollFault::SrqNotPosted => "SRQ completion for a WQE not posted",
        })
    }
}

/// The wr_id of the send WQE a CQE completes, for a send queue with
/// producer counter `head` and consumer counter `*tail`, which moves past
/// it. With selective signalling (`signal_all` false) the unsignalled WRs
/// before it complete with it: the CQE's WQE counter says how many, and
/// an index outside the posted window is the device's error and must not
/// move the tail past the head. On an error `*tail` is left as it was.
#[inline(always)]
fn next_send_wr_id(
    head: u32,
    tail: &mut u32,
    signal_all: bool,
    wrid: &[u64],
    mask: u32,
    c: &DmaBlock<'_, { cqe::SIZE }>,
) -> core::result::Result<u64, PollFault> {
    let outstanding = head.wrapping_sub(*tail);
    if !signal_all {
        let wqe_ctr = c.read_be16(cqe::WQE_INDEX);
        let skip = u32::from(wqe_ctr.wrapping_sub(*tail as u16));
        if skip >= outstanding {
            return Err(PollFault::SendNotPosted);
        }
        *tail = tail.wrapping_add(skip);
    } else if outstanding == 0 {
        return Err(PollFault::SendQueueEmpty);
    }
    let id = wrid.get((*tail & mask) as usize).copied().unwrap_or(0);
    *tail = tail.wrapping_add(1);
    Ok(id)
}

/// [`next_send_wr_id`] on a QP's send queue.
#[inline(always)]
fn send_wr_id(
    wq: &mut crate::qp::Wq,
    sq_signal_bits: u32,
    c: &DmaBlock<'_, { cqe::SIZE }>,
) -> core::result::Result<u64, PollFault> {
    let mut tail = wq.tail;
    let id = next_send_wr_id(
        wq.head,
        &mut tail,
        sq_signal_bits != 0,
        &wq.wrid,
        wq.mask,
        c,
    )?;
    wq.tail = tail;
    Ok(id)
}

/// The CQE opcodes of successful sends [`Mlx4IbCq::poll`] takes on its
/// straight line: all but NOP (and the resize and error codes, which are
/// not send opcodes).
const SEND_SUCCESS_OPS: u32 = {
    let mut m = 0u32;
    let ops = [
        opcode::RDMA_WRITE,
        opcode::RDMA_WRITE_IMM,
        opcode::SEND,
        opcode::SEND_IMM,
        opcode::SEND_INVAL,
        opcode::RDMA_READ,
        opcode::ATOMIC_CS,
        opcode::ATOMIC_FA,
        opcode::MASKED_ATOMIC_CS,
        opcode::MASKED_ATOMIC_FA,
        opcode::BIND_MW,
        opcode::LSO,
        opcode::FMR,
        opcode::LOCAL_INVAL,
    ];
    let mut i = 0;
    while i < ops.len() {
        m |= 1 << ops[i];
        i += 1;
    }
    m
};

/// How a send completion reports its byte count.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SendLen {
    /// Not at all.
    None,
    /// The CQE's byte count (RDMA READ).
    Cqe,
    /// Eight bytes (atomics).
    Eight,
}

/// The send half of `mlx4_ib_poll_one`'s switch as a table by CQE opcode:
/// completion opcode, flags, byte count.
const SEND_WC: [(WcOpcode, WcFlags, SendLen); 32] = {
    let mut t = [(WcOpcode::Send, WcFlags::empty(), SendLen::None); 32];
    t[opcode::RDMA_WRITE_IMM as usize] = (WcOpcode::RdmaWrite, WcFlags::WITH_IMM, SendLen::None);
    t[opcode::RDMA_WRITE as usize] = (WcOpcode::RdmaWrite, WcFlags::empty(), SendLen::None);
    t[opcode::SEND_IMM as usize] = (WcOpcode::Send, WcFlags::WITH_IMM, SendLen::None);
    t[opcode::RDMA_READ as usize] = (WcOpcode::RdmaRead, WcFlags::empty(), SendLen::Cqe);
    t[opcode::ATOMIC_CS as usize] = (WcOpcode::CompSwap, WcFlags::empty(), SendLen::Eight);
    t[opcode::ATOMIC_FA as usize] = (WcOpcode::FetchAdd, WcFlags::empty(), SendLen::Eight);
    t[opcode::MASKED_ATOMIC_CS as usize] =
        (WcOpcode::MaskedCompSwap, WcFlags::empty(), SendLen::Eight);
    t[opcode::MASKED_ATOMIC_FA as usize] =
        (WcOpcode::MaskedFetchAdd, WcFlags::empty(), SendLen::Eight);
    t[opcode::BIND_MW as usize] = (WcOpcode::BindMw, WcFlags::empty(), SendLen::None);
    t[opcode::LSO as usize] = (WcOpcode::Lso, WcFlags::empty(), SendLen::None);
    t[opcode::FMR as usize] = (WcOpcode::FastRegMr, WcFlags::empty(), SendLen::None);
    t[opcode::LOCAL_INVAL as usize] = (WcOpcode::LocalInv, WcFlags::empty(), SendLen::None);
    t
};

/// Which way the polling loop takes a CQE.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Still the hardware's: stop.
    Hw,
    /// A successful send with a straight line ([`poll_send`]).
    Send,
    /// Anything else ([`poll_one_general`]).
    General,
}

/// What the polling loop needs of a CQE, by its `owner_sr_opcode` byte with
/// the pass parity folded into the owner bit (0: software-owned).
#[derive(Clone, Copy)]
struct CqeClass {
    kind: Kind,
    opcode: WcOpcode,
    flags: WcFlags,
    len: SendLen,
}

/// [`CqeClass`] of each `owner_sr_opcode` byte XOR the pass parity
/// ([`parity`]): one load tells the loop whether the CQE is still the
/// hardware's (owner bit set after the XOR), which path takes it and, for
/// a send, the completion opcode, flags and length.
const CQE_CLASS: [CqeClass; 256] = {
    let mut t = [CqeClass {
        kind: Kind::Hw,
        opcode: WcOpcode::Send,
        flags: WcFlags::empty(),
        len: SendLen::None,
    }; 256];
    let mut i = 0;
    while i < 128 {
        let op = i & cqe::OPCODE_MASK as usize;
        let send = i & cqe::IS_SEND_MASK as usize != 0;
        let (opcode, flags, len) = SEND_WC[op];
        t[i] = CqeClass {
            kind: if send && SEND_SUCCESS_OPS & (1 << op) != 0 {
                Kind::Send
            } else {
                Kind::General
            },
            opcode,
            flags,
            len,
        };
        i += 1;
    }
    t
};

/// The completion opcode, flags and byte count of a successful send CQE
/// (`u32::MAX`: the CQE's own byte count).
#[cfg(test)]
fn send_wc(op: u8) -> (WcOpcode, WcFlags, Option<u32>) {
    let (o, f, l) = SEND_WC[usize::from(op & 0x1f)];
    let l = match l {
        SendLen::None => None,
        SendLen::Cqe => Some(u32::MAX),
        SendLen::Eight => Some(8),
    };
    (o, f, l)
}

/// The CQE buffer of `nent` entries (a power of two, at least 2).
pub fn alloc_cq_buf(pool: &hal::DmaPool, nent: u32) -> Result<DmaBuf> {
    if !nent.is_power_of_two() || nent < 2 {
        return Err(Error::Inval("CQ size must be a power of two"));
    }
    let bytes = (nent as usize) * cqe::SIZE;
    Ok(pool.alloc(bytes.next_multiple_of(4096), 4096)?)
}

impl Mlx4IbCq {
    /// A CQ of `nent` entries (a power of two) over fresh memory, without
    /// an HCA behind it: for tests and the fast-path benchmark, which write
    /// CQEs themselves.
    pub fn detached(nent: u32, pool: &hal::DmaPool, uar: Bar, db: Db, cqn: u32) -> Result<Self> {
        let buf = alloc_cq_buf(pool, nent)?;
        Ok(Self::assemble(nent, buf, uar, db, cqn))
    }

    /// Sets up a CQ over `buf` (from [`alloc_cq_buf`]).
    pub(crate) fn assemble(nent: u32, buf: DmaBuf, uar: Bar, db: Db, cqn: u32) -> Self {
        // Every entry starts hardware-owned in pass 0 (owner bit 1), as
        // iPXE does, rather than trusting the firmware to mark them.
        for i in 0..nent as usize {
            buf.write_u8(i * cqe::SIZE + cqe::OWNER_SR_OPCODE, cqe::OWNER_MASK);
        }
        db.write(0, 0);
        db.write(1, 0);
        Mlx4IbCq {
            buf,
            nent,
            cons_index: 0,
            db,
            uar,
            cqn,
            cur: CurQp {
                qpn: NO_QPN,
                raw_qpn: NO_QPN,
                slot: 0,
            },
            pending: None,
            hw: None,
        }
    }

    /// CQ number.
    pub fn cqn(&self) -> u32 {
        self.cqn
    }
    /// Entries the CQ can hold (verbs `cqe`: `nent - 1`).
    pub fn cqe(&self) -> u32 {
        self.nent - 1
    }
    /// The consumer index.
    pub fn cons_index(&self) -> u32 {
        self.cons_index
    }
    /// The CQE buffer (tests and the benchmark write CQEs into it).
    pub fn buf(&self) -> &DmaBuf {
        &self.buf
    }
    /// The doorbell records.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// True if the entry at `n` is software-owned (Linux `next_cqe_sw`).
    #[inline(always)]
    fn sw_owned(&self, n: u32) -> bool {
        let off = ((n & (self.nent - 1)) as usize) * cqe::SIZE + cqe::OWNER_SR_OPCODE;
        let owner = self.buf.window().read_u8(off) & cqe::OWNER_MASK != 0;
        owner == (n & self.nent != 0)
    }

    /// Linux `mlx4_ib_poll_cq`: up to `wc.len()` completions; the `set_ci`
    /// record is written when any CQE was consumed. A CQE the driver
    /// cannot account for (unknown QPN, NOP, resize, an empty queue) is
    /// consumed and reported as an error: at once if it comes first, else
    /// by the next poll, after the completions before it (Linux returns
    /// the error and loses those).
    ///
    /// Inlined into the caller: the empty CQ, one owner-byte lookup. The
    /// rest out of line (`poll_some`), called last, so the
    /// caller keeps nothing across the call.
    #[inline(always)]
    pub fn poll(
        &mut self,
        qps: &mut QpTable,
        srqs: &mut Slab<Mlx4IbSrq>,
        wc: &mut [Wc],
    ) -> Result<usize> {
        // Tested before it is taken: the empty poll only reads it.
        if let Some(e) = self.pending {
            self.pending = None;
            return Err(e.into());
        }
        let ci = self.cons_index;
        let b = self.buf.window();
        let class = match b.block::<{ cqe::SIZE }>(((ci & (self.nent - 1)) as usize) * cqe::SIZE) {
            Some(c) => {
                let osr = c.read_u8(cqe::OWNER_SR_OPCODE);
                &CQE_CLASS[usize::from(osr ^ parity(ci, self.nent))]
            }
            // The loop reports it.
            None => &CQE_CLASS[0],
        };
        if class.kind == Kind::Hw {
            return Ok(0);
        }
        match self.poll_some(qps, srqs, wc, class) {
            (_, Some(e)) => Err(e.into()),
            (n, None) => Ok(n),
        }
    }

    /// [`Mlx4IbCq::poll`] once a CQE is there, its owner byte XOR the pass
    /// parity giving [`CqeClass`] `first`: a successful send of the QP of
    /// the last CQE polled into a one-entry `wc` takes a straight line
    /// without a further call, which consumes the CQE whether or not the
    /// send queue can account for it (as the loop would); everything else,
    /// `wc` of more than one entry included, goes on in
    /// [`Mlx4IbCq::poll_loop`] (runs of sends take [`send_run`] there).
    /// Returns the completions filled and, if there are none, the fault of
    /// the first CQE (a pair, so it comes back in two registers).
    #[inline(never)]
    fn poll_some(
        &mut self,
        qps: &mut QpTable,
        srqs: &mut Slab<Mlx4IbSrq>,
        wc: &mut [Wc],
        first: &CqeClass,
    ) -> (usize, Option<PollFault>) {
        let ci = self.cons_index;
        if first.kind == Kind::Send
            && let [w] = wc
            && let Some(c) = self
                .buf
                .window()
                .block::<{ cqe::SIZE }>(((ci & (self.nent - 1)) as usize) * cqe::SIZE)
            && let Some(qp) = cached_send_qp(&self.cur, qps, &c)
        {
            // Consumed either way, as the loop would: a send the queue
            // cannot account for is reported now, with no completion.
            let r = poll_send(qp, &c, first, w);
            self.cons_index = ci.wrapping_add(1);
            self.update_cons_index();
            return match r {
                Ok(()) => (1, None),
                Err(e) => (0, Some(e)),
            };
        }
        self.poll_loop(qps, srqs, wc)
    }

    /// The polling loop ([`Mlx4IbCq::poll_cqes`]) out of line: writes the
    /// `set_ci` record if any CQE was consumed; returns the completions
    /// filled and, if there are none, the fault the loop met.
    #[inline(never)]
    fn poll_loop(
        &mut self,
        qps: &mut QpTable,
        srqs: &mut Slab<Mlx4IbSrq>,
        wc: &mut [Wc],
    ) -> (usize, Option<PollFault>) {
        let start = self.cons_index;
        let n = self.poll_cqes(qps, srqs, wc);
        if self.cons_index != start {
            self.update_cons_index();
        }
        if n == 0 {
            (0, self.pending.take())
        } else {
            (n, None)
        }
    }

    /// The polling loop: fills the front of `wc`, returns how many, and
    /// moves the consumer index past the CQEs consumed (the caller writes
    /// the `set_ci` record). Runs of successful sends of the QP of the
    /// last CQE (Linux `cur_qp`) take [`send_run`]; every other CQE takes
    /// [`poll_one_general`], which may make its QP the cached one. A CQE
    /// that fills no completion is consumed and its error left in
    /// `pending`, which [`Mlx4IbCq::poll`] reports. Each turn consumes a
    /// CQE or stops, so the loop ends within `wc.len()` turns.
    #[inline(always)]
    fn poll_cqes(&mut self, qps: &mut QpTable, srqs: &mut Slab<Mlx4IbSrq>, wc: &mut [Wc]) -> usize {
        let nent = self.nent;
        let mut n = 0;
        while n < wc.len() {
            if let Some(qp) = qps.slab.get_mut(self.cur.slot)
                && let Some(ws) = wc.get_mut(n..)
            {
                let b = self.buf.window();
                let (k, fault) = send_run(b, nent, self.cur.raw_qpn, qp, &mut self.cons_index, ws);
                n += k;
                if fault.is_some() {
                    self.pending = fault;
                    break;
                }
            }
            let Some(w) = wc.get_mut(n) else {
                break;
            };
            let ci = self.cons_index;
            let b = self.buf.window();
            let Some(c) = b.block::<{ cqe::SIZE }>(((ci & (nent - 1)) as usize) * cqe::SIZE) else {
                self.pending = Some(PollFault::OutsideBuffer);
                break;
            };
            let osr = c.read_u8(cqe::OWNER_SR_OPCODE);
            if CQE_CLASS[usize::from(osr ^ parity(ci, nent))].kind == Kind::Hw {
                break;
            }
            // The owner bit before the body.
            dma_rmb();
            self.cons_index = ci.wrapping_add(1);
            if let Err(e) = poll_one_general(&mut self.cur, self.cqn, qps, srqs, &c, osr, w) {
                self.pending = Some(e);
                break;
            }
            n += 1;
        }
        n
    }

    /// Linux `mlx4_cq_set_ci`.
    #[inline(always)]
    fn update_cons_index(&self) {
        self.db
            .write(0, mlx4_hw::doorbell::cq_set_ci_record(self.cons_index));
    }

    /// Linux `mlx4_ib_arm_cq` / `mlx4_cq_arm`: request an event for the next
    /// (or next solicited) completion. `arm_sn` is mlx4_core's count of
    /// completion events for this CQ.
    pub fn req_notify(&self, solicited: bool, arm_sn: u32) {
        let cmd = if solicited {
            CQ_DB_REQ_NOT_SOL
        } else {
            CQ_DB_REQ_NOT
        };
        let ci = self.cons_index;
        self.db
            .write(1, mlx4_hw::doorbell::cq_arm_record(arm_sn, cmd, ci));
        // The record in host memory before the MMIO doorbell.
        wmb();
        let (hi, lo) = mlx4_hw::doorbell::cq_doorbell(arm_sn, cmd, self.cqn, ci);
        self.uar.write_be32_pair(CQ_DOORBELL, hi, lo);
    }

    /// Linux `__mlx4_ib_cq_clean`: removes the CQEs of `qpn` not yet
    /// polled, compacting the others, and gives SRQ WQEs back.
    pub fn clean(&mut self, qpn: u32, mut srq: Option<&mut Mlx4IbSrq>) {
        let mut prod = self.cons_index;
        while self.sw_owned(prod) {
            if prod == self.cons_index.wrapping_add(self.nent - 1) {
                break;
            }
            prod = prod.wrapping_add(1);
        }
        let mut nfreed = 0u32;
        while prod != self.cons_index {
            prod = prod.wrapping_sub(1);
            let off = ((prod & (self.nent - 1)) as usize) * cqe::SIZE;
            let mut e = [0u8; cqe::SIZE];
            self.buf.read_bytes(off, &mut e);
            if u32::from_be_bytes([e[0], e[1], e[2], e[3]]) & cqe::QPN_MASK == qpn {
                let osr = e[cqe::OWNER_SR_OPCODE];
                if osr & cqe::IS_SEND_MASK == 0
                    && let Some(s) = srq.as_deref_mut()
                {
                    let idx = u16::from_be_bytes([e[cqe::WQE_INDEX], e[cqe::WQE_INDEX + 1]]);
                    let _ = s.take_wqe(idx);
                }
                nfreed += 1;
            } else if nfreed > 0 {
                let dst = ((prod.wrapping_add(nfreed) & (self.nent - 1)) as usize) * cqe::SIZE;
                let owner = self.buf.read_u8(dst + cqe::OWNER_SR_OPCODE) & cqe::OWNER_MASK;
                e[cqe::OWNER_SR_OPCODE] = owner | (e[cqe::OWNER_SR_OPCODE] & !cqe::OWNER_MASK);
                self.buf.write_bytes(dst, &e);
            }
        }
        if nfreed > 0 {
            self.cons_index = self.cons_index.wrapping_add(nfreed);
            wmb();
            self.update_cons_index();
        }
        self.cur.clear();
    }

    /// Forgets the cached QP (its slot is being freed).
    pub(crate) fn forget_qp(&mut self, slot: u32) {
        if self.cur.qpn != NO_QPN && self.cur.slot == slot {
            self.cur.clear();
        }
    }
}

/// The QP of the last CQE (Linux `cur_qp`): its real QPN ([`NO_QPN`]:
/// none) and table slot.
#[derive(Debug, Clone, Copy)]
struct CurQp {
    qpn: u32,
    /// `qpn` as [`RAW_QPN_MASK`] selects it from a native load.
    raw_qpn: u32,
    slot: u32,
}

impl CurQp {
    /// Caches QP `qpn` at table slot `slot`.
    fn set(&mut self, qpn: u32, slot: u32) {
        self.qpn = qpn;
        // The big-endian dword's QPN bytes as a native load sees them.
        self.raw_qpn = qpn.to_be();
        self.slot = slot;
    }

    /// Forgets the cached QP (no raw QPN matches `NO_QPN`: the mask keeps
    /// 24 bits).
    fn clear(&mut self) {
        self.qpn = NO_QPN;
        self.raw_qpn = NO_QPN;
    }
}

/// The fields of a successful send's completion: wr_id `id`, the QP's
/// number and port, and the opcode, flags and byte count of the CQE's
/// [`CqeClass`].
#[inline(always)]
fn fill_send_wc(
    wc: &mut Wc,
    id: u64,
    qp_num: u32,
    port: u8,
    class: &CqeClass,
    c: &DmaBlock<'_, { cqe::SIZE }>,
) {
    wc.wr_id = id;
    wc.qp_num = qp_num;
    wc.port_num = port;
    wc.status = WcStatus::Success;
    wc.vendor_err = 0;
    wc.opcode = class.opcode;
    wc.wc_flags = class.flags;
    match class.len {
        SendLen::None => {}
        SendLen::Cqe => wc.byte_len = c.read_be32(cqe::BYTE_CNT),
        SendLen::Eight => wc.byte_len = 8,
    }
}

/// Linux `mlx4_ib_poll_one` for a successful send CQE `c` of `qp` (the QP
/// of the last CQE) with [`CqeClass`] `class`: a straight line.
#[inline(always)]
fn poll_send(
    qp: &mut crate::qp::Mlx4IbQp,
    c: &DmaBlock<'_, { cqe::SIZE }>,
    class: &CqeClass,
    wc: &mut Wc,
) -> core::result::Result<(), PollFault> {
    let id = send_wr_id(&mut qp.sq, qp.sq_signal_bits, c)?;
    fill_send_wc(wc, id, qp.ibqp_num, qp.port, class, c);
    Ok(())
}

/// The QP of the software-owned CQE `c` if it is the QP of the last CQE
/// (`cur`, Linux `cur_qp`); `None` if it is another QP's (or none is
/// cached).
#[inline(always)]
fn cached_send_qp<'q>(
    cur: &CurQp,
    qps: &'q mut QpTable,
    c: &DmaBlock<'_, { cqe::SIZE }>,
) -> Option<&'q mut crate::qp::Mlx4IbQp> {
    // The owner bit (read by the caller) before the body.
    dma_rmb();
    if c.read_u32(cqe::VLAN_MY_QPN) & RAW_QPN_MASK != cur.raw_qpn {
        return None;
    }
    qps.slab.get_mut(cur.slot)
}

/// A run of successful send CQEs of `qp` (raw QPN `raw_qpn`, as
/// [`CurQp`] keeps it) from consumer index `*ci` of the ring in `b`
/// (`nent` entries), one per entry of `wc`, with the QP's send-queue
/// counters and fields held in registers. Stops, leaving the CQE for the
/// general path, at one still the hardware's, not a successful send, or
/// of another QP; a send CQE the send queue cannot account for is
/// consumed and its fault returned. Returns the completions filled
/// (`*ci` moved past them).
#[inline(always)]
fn send_run(
    b: hal::DmaWindow<'_>,
    nent: u32,
    raw_qpn: u32,
    qp: &mut crate::qp::Mlx4IbQp,
    ci: &mut u32,
    wc: &mut [Wc],
) -> (usize, Option<PollFault>) {
    let qp_num = qp.ibqp_num;
    let port = qp.port;
    let signal_all = qp.sq_signal_bits != 0;
    let sq = &mut qp.sq;
    let head = sq.head;
    let mask = sq.mask;
    let mut tail = sq.tail;
    let start = *ci;
    let mut at = start;
    let mut fault = None;
    for w in wc.iter_mut() {
        let Some(c) = b.block::<{ cqe::SIZE }>(((at & (nent - 1)) as usize) * cqe::SIZE) else {
            break;
        };
        let class = &CQE_CLASS[usize::from(c.read_u8(cqe::OWNER_SR_OPCODE) ^ parity(at, nent))];
        if class.kind != Kind::Send {
            break;
        }
        // The owner bit before the body.
        dma_rmb();
        if c.read_u32(cqe::VLAN_MY_QPN) & RAW_QPN_MASK != raw_qpn {
            break;
        }
        at = at.wrapping_add(1);
        match next_send_wr_id(head, &mut tail, signal_all, &sq.wrid, mask, &c) {
            Ok(id) => fill_send_wc(w, id, qp_num, port, class, &c),
            Err(e) => {
                fault = Some(e);
                break;
            }
        }
    }
    sq.tail = tail;
    *ci = at;
    // One completion per CQE consumed, but for the one that failed.
    let n = at.wrapping_sub(start) as usize - usize::from(fault.is_some());
    (n, fault)
}

/// Everything [`poll_send`] does not take on its straight
/// line: NOP and resize CQEs (refused), a QP other than the last one
/// (looked up by QPN), receives (RQ or SRQ), error CQEs (every
/// syndrome mapped to its `ib_wc_status`).
#[cold]
#[inline(never)]
fn poll_one_general(
    cur: &mut CurQp,
    cqn: u32,
    qps: &mut QpTable,
    srqs: &mut Slab<Mlx4IbSrq>,
    c: &DmaBlock<'_, { cqe::SIZE }>,
    osr: u8,
    wc: &mut Wc,
) -> core::result::Result<(), PollFault> {
    let is_send = osr & cqe::IS_SEND_MASK != 0;
    let op = osr & cqe::OPCODE_MASK;
    let is_error = op == cqe::OPCODE_ERROR;
    if is_send && u32::from(op) == opcode::NOP {
        log::warn!(
            "mlx4_ib: CQ {:06x}: Completion for NOP opcode detected!",
            cqn
        );
        return Err(PollFault::Nop);
    }
    if op == cqe::OPCODE_RESIZE {
        log::warn!("mlx4_ib: CQ {:06x}: resize CQE on a CQ never resized", cqn);
        return Err(PollFault::Resize);
    }
    let head = c.read_be64(cqe::VLAN_MY_QPN);
    let qpn = (head >> 32) as u32 & cqe::QPN_MASK;
    let slot = if qpn == cur.qpn {
        cur.slot
    } else {
        match qps.lookup(qpn) {
            Some(s) => {
                cur.set(qpn, s);
                s
            }
            None => {
                log::warn!(
                    "mlx4_ib: CQ {:06x} with entry for unknown QPN {:06x}",
                    cqn,
                    qpn
                );
                return Err(PollFault::UnknownQp);
            }
        }
    };
    let Some(qp) = qps.slab.get_mut(slot) else {
        cur.clear();
        return Err(PollFault::UnknownQp);
    };
    let tail = c.read_be64(cqe::WQE_INDEX);
    let wqe_ctr = (tail >> 48) as u16;
    wc.qp_num = qp.ibqp_num;
    wc.port_num = qp.port;
    if is_send {
        wc.wr_id = send_wr_id(&mut qp.sq, qp.sq_signal_bits, c)?;
    } else if let Some(srq) = qp.srq {
        let srq = srqs.get_mut(srq.0).ok_or(PollFault::SrqGone)?;
        wc.wr_id = srq.take_wqe(wqe_ctr).map_err(|_| PollFault::SrqNotPosted)?;
    } else {
        let wq = &mut qp.rq;
        if wq.head == wq.tail {
            return Err(PollFault::RecvQueueEmpty);
        }
        wc.wr_id = wq
            .wrid
            .get((wq.tail & (wq.wqe_cnt.max(1) - 1)) as usize)
            .copied()
            .unwrap_or(0);
        wq.tail = wq.tail.wrapping_add(1);
    }
    if is_error {
        let syn = (tail >> 32) as u16;
        wc.status = syndrome_to_status(syn as u8);
        wc.vendor_err = u32::from(syn >> 8);
        if syn as u8 == syndrome::LOCAL_QP_OP_ERR {
            log::warn!(
                "mlx4_ib: local QP operation err (QPN {:06x}, WQE index {:x}, vendor syndrome {:02x}, opcode = {:02x})",
                qpn,
                wqe_ctr,
                syn >> 8,
                op
            );
        }
        return Ok(());
    }
    wc.status = WcStatus::Success;
    wc.vendor_err = 0;
    if is_send {
        let (opc, flags, len) = SEND_WC[usize::from(op)];
        wc.opcode = opc;
        wc.wc_flags = flags;
        match len {
            SendLen::Cqe => wc.byte_len = c.read_be32(cqe::BYTE_CNT),
            SendLen::Eight => wc.byte_len = 8,
            SendLen::None => {}
        }
    } else {
        let mid = c.read_be64(cqe::G_MLPATH_RQPN);
        let g = (mid >> 32) as u32;
        let imm = head as u32;
        wc.byte_len = c.read_be32(cqe::BYTE_CNT);
        let (opc, flags) = match op {
            recv_opcode::RDMA_WRITE_IMM => (WcOpcode::RecvRdmaWithImm, WcFlags::WITH_IMM),
            recv_opcode::SEND_INVAL => (WcOpcode::Recv, WcFlags::WITH_INVALIDATE),
            recv_opcode::SEND_IMM => (WcOpcode::Recv, WcFlags::WITH_IMM),
            _ => (WcOpcode::Recv, WcFlags::empty()),
        };
        wc.opcode = opc;
        wc.imm_data = imm;
        wc.slid = mid as u16;
        wc.src_qp = g & 0xff_ffff;
        wc.dlid_path_bits = ((g >> 24) & 0x7f) as u8;
        wc.wc_flags = if g & (1 << 31) != 0 {
            flags | WcFlags::GRH
        } else {
            flags
        };
        wc.pkey_index = (imm & 0x7f) as u16;
        wc.sl = ((mid >> 16) as u16 >> 12) as u8;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
