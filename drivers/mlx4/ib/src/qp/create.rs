//! Creating, querying and destroying QPs (Linux `qp.c`: `set_rq_size`, `set_kernel_sq_size`, `create_qp_common`, `mlx4_ib_query_qp`, `destroy_qp_common`).
//!
//! Kernel QPs only: user QPs, XRC and SR-IOV proxy/tunnel QPs are left out,
//! and so is WQE shrinking.

use alloc::vec;

use hal::{Bar, DmaBuf};
use mlx4_core::Caps;
use mlx4_core::mr::Mtt;
use mlx4_hw::doorbell::SEND_DOORBELL;
use mlx4_hw::qp::params2;
use mlx4_hw::wqe::{self, atomic, ctrl, data, datagram, inline, raddr};

use super::post::{FAST_INLINE_MAX, SRCRB_FLAGS, ops_allowed};
use super::{Mlx4IbQp, QpHw, Sqp, Wq, to_ib_state, to_mlx4_state};
use crate::doorbell::Db;
use crate::table::{CqId, PdId, SrqId};
use crate::verbs::{AccessFlags, QpCap, QpCreateFlags, QpState, QpType, SendFlags};
use crate::{Error, Result};

/// Linux `send_wqe_overhead`: bytes of a send WQE before its data segments.
pub const fn send_wqe_overhead(t: QpType) -> u32 {
    let c = ctrl::SIZE as u32;
    match t {
        QpType::Ud => c + datagram::SIZE as u32,
        QpType::Uc => c + raddr::SIZE as u32,
        QpType::Rc => c + atomic::MASKED_SIZE as u32 + raddr::SIZE as u32,
        // MLX: the UD header (82 bytes at most) in inline segments that may
        // not cross 64 bytes, padded to 16, plus the 4-byte ICRC segment.
        QpType::Smi | QpType::Gsi => {
            let hdr = UD_HEADER_SIZE + UD_HEADER_SIZE.div_ceil(inline::ALIGN as u32) * 4;
            c + hdr.next_multiple_of(16) + (4 + inline::SIZE as u32).next_multiple_of(16)
        }
    }
}

/// Largest packed UD header: LRH 8 + GRH 40 + BTH 12 + DETH 8 + immediate 4
/// + VLAN/Ethernet room Linux reserves (`MLX4_IB_UD_HEADER_SIZE`).
pub const UD_HEADER_SIZE: u32 = 82;

/// libmlx4 `num_inline_segs`: inline headers needed for `data` bytes, with
/// the worst-case start offset of the first segment in its 64-byte chunk.
fn num_inline_segs(data: u32, t: QpType) -> u32 {
    let lead = match t {
        QpType::Ud => (ctrl::SIZE + datagram::SIZE) % inline::ALIGN,
        _ => (ctrl::SIZE + raddr::SIZE) % inline::ALIGN,
    } as u32;
    let per = (inline::ALIGN - inline::SIZE) as u32;
    (data + lead).div_ceil(per)
}

/// Linux `set_rq_size` (kernel QPs): RQ geometry, with `cap` updated to what
/// was granted.
pub fn set_rq_size(caps: &Caps, cap: &mut QpCap, has_rq: bool) -> Result<Wq> {
    let max_sg = caps.max_sq_sg.min(caps.max_rq_sg);
    if cap.max_recv_wr > caps.max_wqes.saturating_sub(wqe::SQ_MAX_SPARE)
        || cap.max_recv_sge > max_sg
    {
        return Err(Error::Inval("receive queue larger than the device allows"));
    }
    let mut rq = Wq::default();
    if !has_rq {
        if cap.max_recv_wr != 0 {
            return Err(Error::Inval("max_recv_wr on a QP attached to an SRQ"));
        }
    } else {
        rq.wqe_cnt = cap.max_recv_wr.max(1).next_power_of_two();
        rq.max_gs = cap.max_recv_sge.max(1).next_power_of_two();
        rq.wqe_shift = (rq.max_gs * data::SIZE as u32).ilog2();
    }
    rq.max_post = caps
        .max_wqes
        .saturating_sub(wqe::SQ_MAX_SPARE)
        .min(rq.wqe_cnt);
    cap.max_recv_wr = rq.max_post;
    cap.max_recv_sge = rq.max_gs.min(max_sg);
    Ok(rq)
}

/// Linux `set_kernel_sq_size` without WQE shrinking: SQ geometry and the
/// spare (prefetch headroom) WQEs; `cap` is updated to what was granted.
/// Inline data (not in the 3.11 kernel driver) is sized as libmlx4 does.
pub fn set_kernel_sq_size(caps: &Caps, cap: &mut QpCap, t: QpType) -> Result<(Wq, u32)> {
    let overhead = send_wqe_overhead(t);
    let max_sg = caps.max_sq_sg.min(caps.max_rq_sg);
    if cap.max_send_wr > caps.max_wqes.saturating_sub(wqe::SQ_MAX_SPARE)
        || cap.max_send_sge > max_sg
        || cap.max_inline_data + overhead + inline::SIZE as u32 > caps.max_sq_desc_sz
    {
        return Err(Error::Inval("send queue larger than the device allows"));
    }
    if matches!(t, QpType::Smi | QpType::Gsi) && cap.max_send_sge + 2 > caps.max_sq_sg {
        return Err(Error::Inval("too many send SGEs for a special QP"));
    }
    if matches!(t, QpType::Smi | QpType::Gsi) && cap.max_inline_data != 0 {
        return Err(Error::Inval("inline data on a special QP"));
    }
    let mut s = cap.max_send_sge * data::SIZE as u32;
    if cap.max_inline_data != 0 {
        let inl =
            num_inline_segs(cap.max_inline_data, t) * inline::SIZE as u32 + cap.max_inline_data;
        s = s.max(inl);
    }
    s += overhead;
    let mut sq = Wq {
        wqe_shift: s.next_power_of_two().ilog2().max(wqe::SQ_MIN_WQE_SHIFT),
        ..Default::default()
    };
    let max_wqes_per_wr = 1;
    let spare = (wqe::MAX_HEADROOM >> sq.wqe_shift) + max_wqes_per_wr;
    sq.wqe_cnt = (cap.max_send_wr * max_wqes_per_wr + spare).next_power_of_two();
    if sq.wqe_cnt > caps.max_wqes.max(1).next_power_of_two() {
        return Err(Error::Inval("send queue larger than the device allows"));
    }
    sq.max_gs = (caps.max_sq_desc_sz.min(1 << sq.wqe_shift) - overhead) / data::SIZE as u32;
    sq.max_post = (sq.wqe_cnt - spare) / max_wqes_per_wr;
    cap.max_send_wr = sq.max_post;
    cap.max_send_sge = sq.max_gs.min(max_sg);
    Ok((sq, spare))
}

/// Places the queues in one buffer, the larger stride first (Linux
/// `set_kernel_sq_size`), and allocates it.
pub fn alloc_qp_buf(pool: &hal::DmaPool, sq: &mut Wq, rq: &mut Wq) -> Result<DmaBuf> {
    let rq_bytes = (rq.wqe_cnt as usize) << rq.wqe_shift;
    let sq_bytes = (sq.wqe_cnt as usize) << sq.wqe_shift;
    if rq.wqe_shift > sq.wqe_shift {
        rq.offset = 0;
        sq.offset = rq_bytes;
    } else {
        sq.offset = 0;
        rq.offset = sq_bytes;
    }
    Ok(pool.alloc((rq_bytes + sq_bytes).next_multiple_of(4096), 4096)?)
}

/// What a QP without an HCA behind it is built over
/// ([`Mlx4IbQp::detached`]): host memory standing in for the HCA's.
pub struct HostMemory<'a> {
    /// The device limits the queues are sized against.
    pub caps: &'a Caps,
    /// Where the queue buffer is allocated.
    pub pool: &'a hal::DmaPool,
    /// The UAR page of the send doorbell.
    pub uar: Bar,
    /// Where the QP's receives go.
    pub recv: HostRecv,
}

/// A detached QP's receive side: its own RQ with a doorbell record, or an
/// SRQ (a detached one of the caller's, [`crate::srq::Mlx4IbSrq::detached`],
/// in the slab `poll_cq` is given).
pub enum HostRecv {
    /// Its own RQ, with this doorbell record.
    Rq(Db),
    /// The SRQ of this handle.
    Srq(SrqId),
}

/// The memory a QP is assembled over: both queues' geometry in one buffer
/// (from [`alloc_qp_buf`]), the UAR page of its send doorbell and its RQ
/// doorbell record (none with an SRQ).
pub(crate) struct QpQueues {
    pub(crate) sq: Wq,
    pub(crate) rq: Wq,
    /// Spare WQEs of the SQ (from [`set_kernel_sq_size`]).
    pub(crate) spare: u32,
    pub(crate) buf: DmaBuf,
    pub(crate) uar: Bar,
    pub(crate) db: Option<Db>,
}

impl Mlx4IbQp {
    /// A QP in RTS without an HCA behind it, its queues sized for `cap`
    /// (updated to what was granted) in host memory: for tests and the
    /// fast-path benchmark, which play the hardware themselves.
    pub fn detached(
        qp_type: QpType,
        qpn: u32,
        cap: &mut QpCap,
        sig_all: bool,
        host: HostMemory<'_>,
    ) -> Result<Mlx4IbQp> {
        let (db, srq) = match host.recv {
            HostRecv::Rq(db) => (Some(db), None),
            HostRecv::Srq(srq) => (None, Some(srq)),
        };
        let mut rq = set_rq_size(host.caps, cap, db.is_some())?;
        let (mut sq, spare) = set_kernel_sq_size(host.caps, cap, qp_type)?;
        let buf = alloc_qp_buf(host.pool, &mut sq, &mut rq)?;
        let q = QpQueues {
            sq,
            rq,
            spare,
            buf,
            uar: host.uar,
            db,
        };
        let mut qp = Mlx4IbQp::assemble(qp_type, qpn, qpn, sig_all, cap.max_inline_data, q);
        qp.srq = srq;
        qp.stamp_all();
        qp.set_state(QpState::Rts);
        Ok(qp)
    }

    /// The QP over `q`, with its wrid arrays, in RESET.
    pub(crate) fn assemble(
        qp_type: QpType,
        qpn: u32,
        ibqp_num: u32,
        sig_all: bool,
        max_inline_data: u32,
        q: QpQueues,
    ) -> Mlx4IbQp {
        let QpQueues {
            mut sq,
            mut rq,
            spare,
            buf,
            uar,
            db,
        } = q;
        sq.wrid = vec![0; sq.wqe_cnt as usize];
        rq.wrid = vec![0; rq.wqe_cnt as usize];
        sq.stride = 1 << sq.wqe_shift;
        rq.stride = 1 << rq.wqe_shift;
        sq.mask = sq.wqe_cnt.wrapping_sub(1);
        rq.mask = rq.wqe_cnt.wrapping_sub(1);
        let sq_signal_bits = if sig_all { ctrl::CQ_UPDATE } else { 0 };
        let owner_mul = ctrl::OWNER / sq.wqe_cnt.max(1);
        let fast_max_inline = if sq.wqe_shift >= 7 {
            (max_inline_data as usize).min(FAST_INLINE_MAX)
        } else {
            0
        };
        Mlx4IbQp {
            qp_type,
            qpn,
            ibqp_num,
            buf,
            sq,
            rq,
            sq_spare_wqes: spare,
            stamp_until: 0,
            sq_signal_bits,
            ctrl_by_flags: core::array::from_fn(|f| {
                let srcrb = SRCRB_FLAGS[f] | sq_signal_bits;
                let fence = (f as u32 & SendFlags::FENCE.0) << 6;
                (u64::from(srcrb) << 32, u64::from(fence))
            }),
            owner_mul,
            max_inline_data,
            ops_allowed: ops_allowed(qp_type),
            fast_shapes: [0; 2],
            fast_max_inline,
            send_db: uar.doorbell(SEND_DOORBELL),
            uar,
            doorbell_qpn: mlx4_hw::doorbell::send_doorbell(qpn),
            db,
            rq_fast_post: 0,
            state: QpState::Reset,
            port: 0,
            atomic_rd_en: AccessFlags::empty(),
            resp_depth: 0,
            pd: PdId(0),
            send_cq: CqId(0),
            recv_cq: CqId(0),
            srq: None,
            sqp: None,
            hw: None,
            block_mcast_loopback: false,
            mcast_gids: alloc::vec::Vec::new(),
        }
    }
}

impl crate::Mlx4IbDev {
    /// Linux `mlx4_ib_create_qp` / `create_qp_common` (kernel QPs): RC, UC,
    /// UD, and QP0/QP1 of `init.port_num` on their reserved QPNs. `init.cap`
    /// is updated to what was granted.
    pub fn create_qp(
        &mut self,
        pd: PdId,
        init: &mut crate::verbs::QpInitAttr,
    ) -> Result<crate::QpId> {
        self.pdn(pd)?;
        if self.fatal {
            return Err(Error::Fatal);
        }
        self.cqs.get(init.send_cq.0).ok_or(Error::NoObject)?;
        self.cqs.get(init.recv_cq.0).ok_or(Error::NoObject)?;
        if let Some(s) = init.srq {
            self.srqs.get(s.0).ok_or(Error::NoObject)?;
        }
        let t = init.qp_type;
        // mlx4_ib_create_qp: of the creation flags only multicast
        // loopback blocking (LSO is not offered), and only on a UD QP.
        if !(init.create_flags & !QpCreateFlags::BLOCK_MULTICAST_LOOPBACK).is_empty() {
            return Err(Error::Inval(
                "QP creation flags other than block-multicast-loopback",
            ));
        }
        if !init.create_flags.is_empty() && t != QpType::Ud {
            return Err(Error::Inval("QP creation flags on a QP that is not UD"));
        }
        let special = matches!(t, QpType::Smi | QpType::Gsi);
        let (qpn, reserved) = if special {
            if init.port_num == 0 || init.port_num > self.num_ports() {
                return Err(Error::Inval("special QP on no port of the HCA"));
            }
            if init.srq.is_some() {
                return Err(Error::Inval("special QPs do not use an SRQ"));
            }
            let qpn = self.dev.special_qpn(init.port_num, t == QpType::Gsi);
            if self.qps.lookup(qpn).is_some() {
                return Err(Error::Busy);
            }
            // Linux adds a scatter entry for tunnelling, even natively.
            init.cap.max_recv_sge += 1;
            (qpn, false)
        } else {
            (self.dev.qp_reserve_range(1, 1)?, true)
        };
        let release = |dev: &mut mlx4_core::Dev| {
            if reserved {
                dev.qp_release_range(qpn, 1);
            }
        };
        let caps = self.dev.caps();
        let geo = set_rq_size(caps, &mut init.cap, init.srq.is_none())
            .and_then(|rq| Ok((rq, set_kernel_sq_size(caps, &mut init.cap, t)?)));
        let (mut rq, (mut sq, spare)) = match geo {
            Ok(g) => g,
            Err(e) => {
                release(&mut self.dev);
                return Err(e);
            }
        };
        let bufs = self
            .uar_page()
            .and_then(|u| Ok((u, alloc_qp_buf(self.dev.dma_pool(), &mut sq, &mut rq)?)));
        let (uar, buf) = match bufs {
            Ok(b) => b,
            Err(e) => {
                release(&mut self.dev);
                return Err(e);
            }
        };
        let db = if init.srq.is_none() {
            match self.dbs.alloc(self.dev.dma_pool(), 0) {
                Ok(d) => Some(d),
                Err(e) => {
                    release(&mut self.dev);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let ibqp_num = match t {
            QpType::Smi => 0,
            QpType::Gsi => 1,
            _ => qpn,
        };
        let q = QpQueues {
            sq,
            rq,
            spare,
            buf,
            uar,
            db,
        };
        let mut qp = Mlx4IbQp::assemble(
            t,
            qpn,
            ibqp_num,
            init.sq_sig_type == crate::verbs::SigType::AllWr,
            init.cap.max_inline_data,
            q,
        );
        let mtt = match write_mtt_for(&mut self.dev, &qp.buf) {
            Ok(m) => m,
            Err(e) => {
                if let Some(d) = qp.db.take() {
                    self.dbs.free(d);
                }
                release(&mut self.dev);
                return Err(e);
            }
        };
        let mqp = match self.dev.qp_alloc(qpn) {
            Ok(m) => m,
            Err(e) => {
                self.dev.mtt_cleanup(&mtt);
                if let Some(d) = qp.db.take() {
                    self.dbs.free(d);
                }
                release(&mut self.dev);
                return Err(e.into());
            }
        };
        qp.pd = pd;
        qp.send_cq = init.send_cq;
        qp.recv_cq = init.recv_cq;
        qp.srq = init.srq;
        qp.block_mcast_loopback = init
            .create_flags
            .contains(QpCreateFlags::BLOCK_MULTICAST_LOOPBACK);
        if special {
            qp.port = init.port_num;
            qp.sqp = Some(Sqp::default());
        }
        qp.hw = Some(QpHw { mqp, mtt, reserved });
        Ok(self.qps.insert(qp))
    }

    /// Linux `mlx4_ib_query_qp`: the attributes as the HCA holds them.
    pub fn query_qp(
        &mut self,
        id: crate::QpId,
    ) -> Result<(crate::verbs::QpAttr, crate::verbs::QpInitAttr)> {
        let qp = self.qps.slab.get_mut(id.0).ok_or(Error::NoObject)?;
        let hw = qp.hw.as_ref().ok_or(Error::NoObject)?;
        let c = if qp.state == QpState::Reset {
            None
        } else {
            Some(self.dev.qp_query(&hw.mqp)?)
        };
        let mut a = crate::verbs::QpAttr {
            qp_state: qp.state,
            cur_qp_state: qp.state,
            ..Default::default()
        };
        if let Some(c) = c {
            if let Some(s) = c.state() {
                a.qp_state = to_ib_state(s);
                qp.set_state(a.qp_state);
                a.cur_qp_state = a.qp_state;
            }
            if let Some(m) = crate::verbs::Mtu::from_raw(c.mtu_msgmax >> 5) {
                a.path_mtu = m;
            }
            a.qkey = c.qkey;
            a.rq_psn = c.rnr_nextrecvpsn & 0xff_ffff;
            a.sq_psn = c.next_send_psn & 0xff_ffff;
            a.dest_qp_num = c.remote_qpn & 0xff_ffff;
            let p2 = c.params2;
            let mut acc = AccessFlags::empty();
            for (bit, f) in [
                (params2::RRE, AccessFlags::REMOTE_READ),
                (params2::RWE, AccessFlags::REMOTE_WRITE),
                (params2::RAE, AccessFlags::REMOTE_ATOMIC),
            ] {
                if p2 & bit != 0 {
                    acc |= f;
                }
            }
            a.qp_access_flags = acc;
            if matches!(qp.qp_type, QpType::Rc | QpType::Uc) {
                let p = &c.pri_path;
                a.ah_attr = crate::verbs::AhAttr {
                    dlid: p.rlid,
                    sl: (p.sched_queue >> 2) & 0xf,
                    src_path_bits: p.grh_mylmc & 0x7f,
                    static_rate: p
                        .static_rate
                        .saturating_sub(mlx4_hw::wqe::av::STAT_RATE_OFFSET),
                    port_num: ((p.sched_queue >> 6) & 1) + 1,
                    grh: (p.grh_mylmc & 0x80 != 0).then_some(crate::verbs::GlobalRoute {
                        dgid: crate::verbs::Gid(p.rgid),
                        flow_label: p.tclass_flowlabel & 0xf_ffff,
                        sgid_index: p.mgid_index,
                        hop_limit: p.hop_limit,
                        traffic_class: (p.tclass_flowlabel >> 20) as u8,
                    }),
                };
            }
            a.pkey_index = u16::from(c.pri_path.pkey_index);
            a.port_num = if qp.port != 0 {
                qp.port
            } else {
                ((c.pri_path.sched_queue >> 6) & 1) + 1
            };
            a.max_rd_atomic = 1 << ((c.params1 >> 21) & 7);
            a.max_dest_rd_atomic = 1 << ((p2 >> 21) & 7);
            a.min_rnr_timer = ((c.rnr_nextrecvpsn >> 24) & 0x1f) as u8;
            a.timeout = c.pri_path.ackto >> 3;
            a.retry_cnt = ((c.params1 >> 16) & 7) as u8;
            a.rnr_retry = ((c.params1 >> 13) & 7) as u8;
        }
        a.cap = QpCap {
            max_send_wr: qp.sq.max_post,
            max_recv_wr: qp.rq.max_post,
            max_send_sge: qp.sq.max_gs,
            max_recv_sge: qp.rq.max_gs,
            max_inline_data: qp.max_inline_data,
        };
        let init = crate::verbs::QpInitAttr {
            send_cq: qp.send_cq,
            recv_cq: qp.recv_cq,
            srq: qp.srq,
            cap: a.cap,
            sq_sig_type: if qp.sq_signal_bits != 0 {
                crate::verbs::SigType::AllWr
            } else {
                crate::verbs::SigType::ReqWr
            },
            qp_type: qp.qp_type,
            create_flags: if qp.block_mcast_loopback {
                QpCreateFlags::BLOCK_MULTICAST_LOOPBACK
            } else {
                QpCreateFlags::empty()
            },
            port_num: qp.port,
        };
        Ok((a, init))
    }

    /// Linux `mlx4_ib_destroy_qp` / `destroy_qp_common`: CLOSE_PORT for
    /// QP0, the QP to RESET, its CQEs cleaned, then its resources.
    pub fn destroy_qp(&mut self, id: crate::QpId) -> Result<()> {
        // A QP still attached to multicast groups would stay in their MGM
        // entries: detach it first (Linux leaves that to the ULP).
        let gids = self
            .qps
            .slab
            .get(id.0)
            .map(|q| q.mcast_gids.clone())
            .unwrap_or_default();
        if !gids.is_empty() {
            log::warn!(
                "{}: QP destroyed while attached to {} multicast group(s): detaching",
                self.name,
                gids.len()
            );
        }
        for g in gids {
            let _ = self.mcg_detach(id, &g, 0);
        }
        let qp = self.qps.slab.get(id.0).ok_or(Error::NoObject)?;
        if qp.qp_type == QpType::Smi && qp.state != QpState::Reset {
            let _ = self.dev.close_port(qp.port);
        }
        let (qpn, srq, scq, rcq, state) = (qp.qpn, qp.srq, qp.send_cq, qp.recv_cq, qp.state);
        if state != QpState::Reset
            && let Some(hw) = qp.hw.as_ref()
            && self
                .dev
                .qp_modify(
                    &hw.mqp,
                    None,
                    to_mlx4_state(state),
                    mlx4_hw::qp::QpState::Rst,
                    &Default::default(),
                    0,
                    false,
                )
                .is_err()
        {
            log::warn!("{}: modify QP {qpn:06x} to RESET failed.", self.name);
        }
        self.clean_cqs(qpn, srq, scq, rcq);
        for c in [scq, rcq] {
            if let Some(c) = self.cqs.get_mut(c.0) {
                c.forget_qp(id.0);
            }
        }
        let mut qp = self.qps.remove(id).ok_or(Error::NoObject)?;
        if let Some(hw) = qp.hw.take() {
            self.dev.qp_free(hw.mqp);
            if hw.reserved {
                self.dev.qp_release_range(qpn, 1);
            }
            self.dev.mtt_cleanup(&hw.mtt);
        }
        if let Some(d) = qp.db.take() {
            self.dbs.free(d);
        }
        Ok(())
    }
}

fn write_mtt_for(dev: &mut mlx4_core::Dev, buf: &DmaBuf) -> Result<Mtt> {
    crate::buf::write_buf_mtt(dev, buf)
}
