//! Queue pairs (Linux `qp.c`): the QP object and its work queues, created in `create`, posted to in `post` and moved through its states in `modify`.
//!
//! Each submodule keeps the names of the `qp.c` functions it ports. Left
//! out: WQE shrinking, LSO, BlueFlame, XRC, RoCE, alternate paths and
//! SR-IOV proxy/tunnel QPs.

use alloc::vec::Vec;

use hal::{Bar, DmaBuf};
use mlx4_core::mr::Mtt;

use crate::doorbell::Db;
use crate::table::{CqId, PdId, SrqId};
use crate::verbs::{AccessFlags, QpState, QpType};
use crate::{Error, Result};

mod create;
mod modify;
mod post;

pub use create::{
    HostMemory, HostRecv, UD_HEADER_SIZE, alloc_qp_buf, send_wqe_overhead, set_kernel_sq_size,
    set_rq_size,
};
pub use post::{MlxEth, MlxFields, MlxHeader, MlxPostError, MlxSendInfo, PostError, PostFault};

/// A work queue (Linux `struct mlx4_ib_wq`): ring geometry, producer and
/// consumer counters, and the work-request ids by slot.
#[derive(Debug, Default)]
pub struct Wq {
    pub(crate) wrid: Vec<u64>,
    pub(crate) wqe_cnt: u32,
    pub(crate) max_post: u32,
    pub(crate) max_gs: u32,
    pub(crate) offset: usize,
    pub(crate) wqe_shift: u32,
    /// `1 << wqe_shift`, for the straight lines' WQE addresses.
    pub(crate) stride: usize,
    /// `wqe_cnt - 1`: a counter's slot.
    pub(crate) mask: u32,
    pub(crate) head: u32,
    pub(crate) tail: u32,
}

impl Wq {
    /// Linux `mlx4_wq_overflow`: would `nreq` more requests overrun it?
    #[inline]
    fn overflow(&self, nreq: u32) -> bool {
        self.head.wrapping_sub(self.tail).wrapping_add(nreq) >= self.max_post
    }

    /// Requests posted and not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }
}

/// QP0/QP1 state Linux keeps in `struct mlx4_ib_sqp`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sqp {
    /// P_Key index of QP0 sends.
    pub pkey_index: u16,
    /// The QP's Q_Key (substituted when a WR's Q_Key has bit 31 set).
    pub qkey: u32,
    /// PSN of the next send (24 bits).
    pub send_psn: u32,
}

/// The hardware side of a QP created through mlx4_core.
#[derive(Debug)]
pub(crate) struct QpHw {
    pub(crate) mqp: mlx4_core::qp::Qp,
    pub(crate) mtt: Mtt,
    /// True if the QPN came from `mlx4_qp_reserve_range` (not special).
    pub(crate) reserved: bool,
}

/// A queue pair (Linux `struct mlx4_ib_qp`).
pub struct Mlx4IbQp {
    pub(crate) qp_type: QpType,
    /// Real QPN (CQEs carry it).
    pub(crate) qpn: u32,
    /// QPN as verbs report it (0/1 for QP0/QP1).
    pub(crate) ibqp_num: u32,
    pub(crate) buf: DmaBuf,
    pub(crate) sq: Wq,
    pub(crate) rq: Wq,
    pub(crate) sq_spare_wqes: u32,
    /// Posts before this producer index (wrapping) stamp WQE
    /// `ind + sq_spare_wqes`: a WQE larger than 64 bytes was posted within
    /// the last pass of the ring, so a slot ahead may hold stale chunks.
    pub(crate) stamp_until: u32,
    /// `MLX4_WQE_CTRL_CQ_UPDATE` for `IB_SIGNAL_ALL_WR` QPs, else 0.
    pub(crate) sq_signal_bits: u32,
    /// By the low three `ib_send_flags` bits (fence, signalled,
    /// solicited): `srcrb_flags` with `sq_signal_bits` in, shifted to the
    /// high half of the control segment's second word, and the fence bit
    /// as it sits in the first word.
    pub(crate) ctrl_by_flags: [(u64, u64); 8],
    /// `(1 << 31) / sq.wqe_cnt`: `(ind & wqe_cnt) * owner_mul` is the owner
    /// bit of producer index `ind`.
    pub(crate) owner_mul: u32,
    pub(crate) max_inline_data: u32,
    /// Bit `op` set for each `WrOpcode` the transport allows.
    pub(crate) ops_allowed: u32,
    /// Bit `4 * op + detail_kind(wr)` of entry `inline` set for each
    /// (opcode, fields) pair [`Mlx4IbQp::post_send`] builds on its
    /// straight-line path (RDMA WRITE/READ with remote-address fields and
    /// SENDs without, on RC and UC QPs in RTS or SQD with a checked send
    /// doorbell), with one SGE (entry 0, if the QP takes one) or inline
    /// data (entry 1, if the QP takes some); zero in any other state.
    /// Recomputed on every state change.
    pub(crate) fast_shapes: [u64; 2],
    /// Most inline bytes the straight-line path takes (0: none): two
    /// inline segments in a stride of at least 128 bytes.
    pub(crate) fast_max_inline: usize,
    /// The UAR page (the device's `priv_uar`) the send doorbell goes to.
    pub(crate) uar: Bar,
    /// Its send doorbell register, checked once.
    pub(crate) send_db: Option<hal::Doorbell>,
    /// `qpn << 8`, stored big-endian at `UAR + 0x14`.
    pub(crate) doorbell_qpn: u32,
    /// RQ doorbell record (absent with an SRQ).
    pub(crate) db: Option<Db>,
    /// `rq.max_post` while the receive straight line applies (the QP out
    /// of RESET), else 0.
    pub(crate) rq_fast_post: u32,
    pub(crate) state: QpState,
    pub(crate) port: u8,
    pub(crate) atomic_rd_en: AccessFlags,
    pub(crate) resp_depth: u8,
    pub(crate) pd: PdId,
    pub(crate) send_cq: CqId,
    pub(crate) recv_cq: CqId,
    pub(crate) srq: Option<SrqId>,
    pub(crate) sqp: Option<Sqp>,
    pub(crate) hw: Option<QpHw>,
    /// `MLX4_IB_QP_BLOCK_MULTICAST_LOOPBACK`: the QP's multicast
    /// attachments carry the MGM block-loopback bit.
    pub(crate) block_mcast_loopback: bool,
    /// MGIDs the QP is attached to (Linux's `gid_list`).
    pub(crate) mcast_gids: alloc::vec::Vec<[u8; 16]>,
}

impl core::fmt::Debug for Mlx4IbQp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "Mlx4IbQp({:?} {:#x}, {:?})",
            self.qp_type, self.qpn, self.state
        )
    }
}

impl Mlx4IbQp {
    /// The real QPN.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    /// The QP number verbs report (0/1 for special QPs).
    pub fn qp_num(&self) -> u32 {
        self.ibqp_num
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }
    /// The send queue (geometry, counters).
    pub fn sq(&self) -> &Wq {
        &self.sq
    }
    /// The receive queue.
    pub fn rq(&self) -> &Wq {
        &self.rq
    }
    /// Spare WQEs kept as prefetch headroom.
    pub fn sq_spare_wqes(&self) -> u32 {
        self.sq_spare_wqes
    }
    /// The queue buffer (tests read WQEs from it).
    pub fn buf(&self) -> &DmaBuf {
        &self.buf
    }
    /// Byte offset of send WQE `n` (modulo the ring) in the buffer.
    #[inline]
    pub fn send_wqe_offset(&self, n: u32) -> usize {
        // A multiply by the stride rather than a shift by `wqe_shift`: no
        // shift-count register to free on x86.
        self.sq.offset + ((n & self.sq.mask) as usize) * self.sq.stride
    }
    /// Byte offset of receive WQE `n` in the buffer.
    #[inline]
    pub fn recv_wqe_offset(&self, n: u32) -> usize {
        self.rq.offset + (((n & (self.rq.wqe_cnt - 1)) as usize) << self.rq.wqe_shift)
    }

    /// Resets the rings (a kernel QP moved to RESET).
    pub(crate) fn reset_rings(&mut self) {
        self.sq.head = 0;
        self.sq.tail = 0;
        self.rq.head = 0;
        self.rq.tail = 0;
        self.stamp_until = 0;
        if let Some(db) = &self.db {
            db.write(0, 0);
        }
    }
}

/// Linux `to_mlx4_state`: the verbs state as the firmware numbers it.
fn to_mlx4_state(s: QpState) -> mlx4_hw::qp::QpState {
    use mlx4_hw::qp::QpState as H;
    match s {
        QpState::Reset => H::Rst,
        QpState::Init => H::Init,
        QpState::Rtr => H::Rtr,
        QpState::Rts => H::Rts,
        QpState::Sqd => H::Sqd,
        QpState::Sqe => H::Sqer,
        QpState::Err => H::Err,
    }
}

/// Linux `to_ib_qp_state`: the firmware's state as verbs name it.
fn to_ib_state(s: mlx4_hw::qp::QpState) -> QpState {
    use mlx4_hw::qp::QpState as H;
    match s {
        H::Rst => QpState::Reset,
        H::Init => QpState::Init,
        H::Rtr => QpState::Rtr,
        H::Rts => QpState::Rts,
        H::Sqd => QpState::Sqd,
        H::Sqer => QpState::Sqe,
        H::Err => QpState::Err,
    }
}

impl crate::Mlx4IbDev {
    /// The QP's CQEs removed from its CQs (Linux `mlx4_ib_cq_clean` on the
    /// receive CQ, with the SRQ's WQEs freed, then on the send CQ), when it
    /// goes to RESET or is destroyed.
    fn clean_cqs(&mut self, qpn: u32, srq: Option<SrqId>, send_cq: CqId, recv_cq: CqId) {
        let srq = srq.and_then(|s| self.srqs.get_mut(s.0));
        if let Some(c) = self.cqs.get_mut(recv_cq.0) {
            c.clean(qpn, srq);
        }
        if send_cq != recv_cq
            && let Some(c) = self.cqs.get_mut(send_cq.0)
        {
            c.clean(qpn, None);
        }
    }

    /// A QP by handle.
    pub fn qp(&self, id: crate::QpId) -> Result<&Mlx4IbQp> {
        self.qps.get(id).ok_or(Error::NoObject)
    }
}

#[cfg(test)]
pub(crate) mod tests;
