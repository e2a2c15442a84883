//! Completion queues (Linux `cq.c`): create/destroy over mlx4_core, polling with the owner bit (`mlx4_ib_poll_one`, `mlx4_ib_poll_cq`), every error syndrome mapped to its `ib_wc_status` (`mlx4_ib_handle_error_cqe`), the `set_ci` and arm doorbells (`mlx4_cq_set_ci`, `mlx4_cq_arm`), and removal of a QP's entries (`__mlx4_ib_cq_clean`); resize, moderation (MODIFY_CQ), 64-byte CQEs, timestamps and the Ethernet/XRC fields are left out.

use hal::barrier::{dma_rmb, wmb};
use hal::{Bar, DmaBuf};
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
    /// The QP of the last CQE: (real QPN, table slot) (Linux `cur_qp`).
    cur_qp: Option<(u32, u32)>,
    /// An error met after completions that were returned first; reported
    /// by the next poll.
    pending: Option<Error>,
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

/// How a send completion reports its byte count.
#[derive(Clone, Copy)]
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
            cur_qp: None,
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
    /// record is written when any was consumed. A CQE the driver cannot
    /// account for (unknown QPN, NOP, resize, an empty queue) is consumed
    /// and reported as an error: at once if it comes first, else by the
    /// next poll, after the completions before it (Linux returns the error
    /// and loses those).
    #[inline]
    pub fn poll(
        &mut self,
        qps: &mut QpTable,
        srqs: &mut Slab<Mlx4IbSrq>,
        wc: &mut [Wc],
    ) -> Result<usize> {
        // The empty CQ, cheaply: one owner-bit test, inlined into the
        // caller; the rest out of line.
        if self.pending.is_none() && !self.sw_owned(self.cons_index) {
            return Ok(0);
        }
        self.poll_cqes(qps, srqs, wc)
    }

    #[inline(never)]
    fn poll_cqes(
        &mut self,
        qps: &mut QpTable,
        srqs: &mut Slab<Mlx4IbSrq>,
        wc: &mut [Wc],
    ) -> Result<usize> {
        if self.pending.is_some()
            && let Some(e) = self.pending.take()
        {
            return Err(e);
        }
        let mut n = 0;
        let mut err = None;
        while n < wc.len() {
            match self.poll_one(qps, srqs, &mut wc[n]) {
                Ok(true) => n += 1,
                Ok(false) => break,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        if n > 0 || err.is_some() {
            self.update_cons_index();
        }
        match err {
            Some(e) if n == 0 => Err(e),
            Some(e) => {
                self.pending = Some(e);
                Ok(n)
            }
            None => Ok(n),
        }
    }

    /// Linux `mlx4_cq_set_ci`.
    #[inline]
    fn update_cons_index(&self) {
        self.db
            .write(0, mlx4_hw::doorbell::cq_set_ci_record(self.cons_index));
    }

    /// Linux `mlx4_ib_poll_one`: `Ok(false)` when the next CQE is still
    /// hardware-owned.
    #[inline]
    fn poll_one(
        &mut self,
        qps: &mut QpTable,
        srqs: &mut Slab<Mlx4IbSrq>,
        wc: &mut Wc,
    ) -> Result<bool> {
        let n = self.cons_index;
        let off = ((n & (self.nent - 1)) as usize) * cqe::SIZE;
        let Some(b) = self.buf.window().block::<{ cqe::SIZE }>(off) else {
            return Err(Error::Inval("CQE outside the CQ buffer"));
        };
        let osr = b.read_u8(cqe::OWNER_SR_OPCODE);
        if (osr & cqe::OWNER_MASK != 0) != (n & self.nent != 0) {
            return Ok(false);
        }
        self.cons_index = n.wrapping_add(1);
        // The owner bit before the body.
        dma_rmb();
        let is_send = osr & cqe::IS_SEND_MASK != 0;
        let op = osr & cqe::OPCODE_MASK;
        let is_error = op == cqe::OPCODE_ERROR;
        if is_send && u32::from(op) == opcode::NOP {
            log::warn!(
                "mlx4_ib: CQ {:06x}: Completion for NOP opcode detected!",
                self.cqn
            );
            return Err(Error::Inval("completion for a NOP"));
        }
        if op == cqe::OPCODE_RESIZE {
            log::warn!(
                "mlx4_ib: CQ {:06x}: resize CQE on a CQ never resized",
                self.cqn
            );
            return Err(Error::Inval("resize CQE"));
        }
        let head = b.read_be64(cqe::VLAN_MY_QPN);
        let qpn = (head >> 32) as u32 & cqe::QPN_MASK;
        let slot = match self.cur_qp {
            Some((q, s)) if q == qpn => s,
            _ => match qps.lookup(qpn) {
                Some(s) => {
                    self.cur_qp = Some((qpn, s));
                    s
                }
                None => {
                    log::warn!(
                        "mlx4_ib: CQ {:06x} with entry for unknown QPN {:06x}",
                        self.cqn,
                        qpn
                    );
                    return Err(Error::Inval("CQE for an unknown QP"));
                }
            },
        };
        let Some(qp) = qps.slab.get_mut(slot) else {
            self.cur_qp = None;
            return Err(Error::Inval("CQE for an unknown QP"));
        };
        let tail = b.read_be64(cqe::WQE_INDEX);
        let wqe_ctr = (tail >> 48) as u16;
        wc.qp_num = qp.ibqp_num;
        wc.port_num = qp.port;
        if is_send {
            let wq = &mut qp.sq;
            let outstanding = wq.head.wrapping_sub(wq.tail);
            if qp.sq_signal_bits == 0 {
                // Skip the unsignalled WRs before the completed one; an
                // index outside the posted window is the device's error
                // and must not move the tail past the head.
                let skip = u32::from(wqe_ctr.wrapping_sub(wq.tail as u16));
                if skip >= outstanding {
                    return Err(Error::Inval("send CQE for a WQE not posted"));
                }
                wq.tail = wq.tail.wrapping_add(skip);
            } else if outstanding == 0 {
                return Err(Error::Inval("send CQE for an empty send queue"));
            }
            wc.wr_id = wq
                .wrid
                .get((wq.tail & (wq.wqe_cnt - 1)) as usize)
                .copied()
                .unwrap_or(0);
            wq.tail = wq.tail.wrapping_add(1);
        } else if let Some(srq) = qp.srq {
            let srq = srqs
                .get_mut(srq.0)
                .ok_or(Error::Inval("CQE for a QP whose SRQ is gone"))?;
            wc.wr_id = srq.take_wqe(wqe_ctr)?;
        } else {
            let wq = &mut qp.rq;
            if wq.head == wq.tail {
                return Err(Error::Inval("receive CQE for an empty receive queue"));
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
            return Ok(true);
        }
        wc.status = WcStatus::Success;
        wc.vendor_err = 0;
        if is_send {
            let (opc, flags, len) = SEND_WC[usize::from(op)];
            wc.opcode = opc;
            wc.wc_flags = flags;
            match len {
                SendLen::Cqe => wc.byte_len = b.read_be32(cqe::BYTE_CNT),
                SendLen::Eight => wc.byte_len = 8,
                SendLen::None => {}
            }
        } else {
            let mid = b.read_be64(cqe::G_MLPATH_RQPN);
            let g = (mid >> 32) as u32;
            let imm = head as u32;
            wc.byte_len = b.read_be32(cqe::BYTE_CNT);
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
        Ok(true)
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
        self.cur_qp = None;
    }

    /// Forgets the cached QP (its slot is being freed).
    pub(crate) fn forget_qp(&mut self, slot: u32) {
        if self.cur_qp.is_some_and(|(_, s)| s == slot) {
            self.cur_qp = None;
        }
    }
}

#[cfg(test)]
mod tests;
