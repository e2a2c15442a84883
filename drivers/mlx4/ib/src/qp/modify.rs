//! QP state transitions (Linux `qp.c`: `__mlx4_ib_modify_qp` and `mlx4_set_path`).
//!
//! InfiniBand and Ethernet (RoCE) paths: on an Ethernet port the GRH is
//! mandatory, the destination MAC comes from the DGID and the source MAC is
//! named by its MAC-table index, the VLAN of a VLAN GID by its VLAN-table
//! index. Left out: alternate paths and SR-IOV.

use mlx4_core::Caps;
use mlx4_hw::qp::{PM_MIGRATED, optpar, params2};

use super::to_mlx4_state;
use crate::verbs::{AccessFlags, QpAttrMask as M, QpState, QpType};
use crate::{Error, Result};

/// `MLX4_IB_DEFAULT_SCHED_QUEUE`.
const DEFAULT_SCHED_QUEUE: u8 = 0x83;
/// `MLX4_IB_DEFAULT_QP0_SCHED_QUEUE`.
const DEFAULT_QP0_SCHED_QUEUE: u8 = 0x3f;
/// `MLX4_IB_ACK_REQ_FREQ`.
const ACK_REQ_FREQ: u32 = 8;

/// `fls(x - 1)`: the log2 encoding of an RDMA-atomic depth.
fn fls_minus_one(x: u8) -> u32 {
    if x <= 1 {
        0
    } else {
        u32::BITS - u32::from(x - 1).leading_zeros()
    }
}

/// Linux `mlx4_set_path`: the address path of `ah` through `port`
/// (`roce`: the port's RoCE state when it is an Ethernet port).
fn mlx4_set_path(
    caps: &Caps,
    ah: &crate::verbs::AhAttr,
    port: u8,
    roce: Option<&crate::roce::RocePort>,
) -> Result<mlx4_hw::qp::QpPath> {
    let mut p = mlx4_hw::qp::QpPath {
        grh_mylmc: ah.src_path_bits & 0x7f,
        rlid: ah.dlid,
        static_rate: crate::ah::static_rate(caps, ah.static_rate),
        ..Default::default()
    };
    if let Some(grh) = &ah.grh {
        let len = caps
            .port
            .get(usize::from(port))
            .map_or(0, |p| p.gid_table_len);
        if u32::from(grh.sgid_index) >= len {
            return Err(Error::Inval("sgid_index beyond the GID table"));
        }
        p.grh_mylmc |= 1 << 7;
        p.mgid_index = grh.sgid_index;
        p.hop_limit = grh.hop_limit;
        p.tclass_flowlabel = (u32::from(grh.traffic_class) << 20) | (grh.flow_label & 0xf_ffff);
        p.rgid = grh.dgid.0;
    }
    if let Some(rp) = roce {
        let Some(grh) = &ah.grh else {
            return Err(Error::Inval(
                "a QP path on an Ethernet (RoCE) port needs a GRH",
            ));
        };
        p.sched_queue =
            DEFAULT_SCHED_QUEUE | ((port.wrapping_sub(1) & 1) << 6) | ((ah.sl & 7) << 3);
        p.dmac = rp.resolve_dmac(&grh.dgid.0)?;
        p.ackto = crate::roce::LINK_TYPE_ETH;
        // The source MAC by its MAC-table index.
        p.grh_mylmc = (p.grh_mylmc & 0x80) | rp.smac_idx();
        if usize::from(grh.sgid_index) >= rp.gids.len() {
            return Err(Error::Inval("source GID index beyond the port's GID table"));
        }
        // A VLAN GID: the frames carry its tag (mlx4_set_path, is_eth).
        let vid = rp.sgid_vlan_id(grh.sgid_index);
        if vid < 0x1000 {
            p.vlan_index = rp.vlan_index(vid).ok_or(Error::Inval(
                "the source GID's VLAN is not in the port's VLAN table",
            ))?;
            p.fl |= 1 << 6;
        }
        return Ok(p);
    }
    p.sched_queue = DEFAULT_SCHED_QUEUE | ((port.wrapping_sub(1) & 1) << 6) | ((ah.sl & 0xf) << 2);
    Ok(p)
}

impl crate::Mlx4IbDev {
    /// Linux `mlx4_ib_modify_qp` / `__mlx4_ib_modify_qp`: the context fields
    /// Linux writes for the transition and `mask`, the firmware command,
    /// and the side effects (SQ stamping at RST->INIT, INIT_PORT when QP0
    /// reaches RTR, CLOSE_PORT when it leaves, CQ cleaning at ->RESET).
    pub fn modify_qp(
        &mut self,
        id: crate::QpId,
        attr: &crate::verbs::QpAttr,
        mask: M,
    ) -> Result<()> {
        let num_ports = self.num_ports();
        let qp = self.qps.slab.get(id.0).ok_or(Error::NoObject)?;
        let cur = if mask.contains(M::CUR_STATE) {
            attr.cur_qp_state
        } else {
            qp.state
        };
        let new = if mask.contains(M::STATE) {
            attr.qp_state
        } else {
            cur
        };
        let caps = self.dev.caps();
        if mask.contains(M::PORT) && (attr.port_num == 0 || attr.port_num > num_ports) {
            return Err(Error::Inval("no such port"));
        }
        if mask.contains(M::PKEY_INDEX) {
            let p = if mask.contains(M::PORT) {
                attr.port_num
            } else {
                qp.port
            };
            let len = caps
                .port
                .get(usize::from(p))
                .map_or(0, |p| p.pkey_table_len);
            if u32::from(attr.pkey_index) >= len.max(1) {
                return Err(Error::Inval("P_Key index beyond the table"));
            }
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC)
            && u32::from(attr.max_rd_atomic) > caps.max_qp_init_rdma
        {
            return Err(Error::Inval("max_rd_atomic above the device's limit"));
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC)
            && u32::from(attr.max_dest_rd_atomic) > caps.max_qp_dest_rdma
        {
            return Err(Error::Inval("max_dest_rd_atomic above the device's limit"));
        }
        if mlx4_hw::qp::transition(to_mlx4_state(cur), to_mlx4_state(new)).is_none() {
            return Err(Error::Inval("QP state transition not allowed"));
        }
        if cur == new && cur == QpState::Reset {
            return Ok(());
        }
        let t = qp.qp_type;
        let mut ctx = mlx4_hw::qp::QpContext {
            flags: ((to_mlx4_state(new) as u32) << 28)
                | (match t {
                    QpType::Rc => mlx4_hw::qp::st::RC,
                    QpType::Uc => mlx4_hw::qp::st::UC,
                    QpType::Ud => mlx4_hw::qp::st::UD,
                    QpType::Smi | QpType::Gsi => mlx4_hw::qp::st::MLX,
                } << 16)
                | (PM_MIGRATED << 11),
            ..Default::default()
        };
        let mut opt = 0u32;
        match t {
            QpType::Smi | QpType::Gsi => ctx.mtu_msgmax = (5 << 5) | 11,
            QpType::Ud => ctx.mtu_msgmax = (5 << 5) | 12,
            _ if mask.contains(M::PATH_MTU) => {
                ctx.mtu_msgmax = (attr.path_mtu.raw() << 5) | caps.max_msg_sz.max(1).ilog2() as u8;
            }
            _ => {}
        }
        if qp.rq.wqe_cnt != 0 {
            ctx.rq_size_stride = (qp.rq.wqe_cnt.ilog2() << 3) as u8;
        }
        ctx.rq_size_stride |= (qp.rq.wqe_shift.saturating_sub(4)) as u8;
        ctx.sq_size_stride = ((qp.sq.wqe_cnt.ilog2() << 3) | (qp.sq.wqe_shift - 4)) as u8;
        ctx.usr_page = self.priv_uar.as_ref().ok_or(Error::Fatal)?.index;
        if mask.contains(M::DEST_QPN) {
            ctx.remote_qpn = attr.dest_qp_num & 0xff_ffff;
        }
        let port = if mask.contains(M::PORT) {
            attr.port_num
        } else {
            qp.port
        };
        if cur == QpState::Init && new == QpState::Rtr {
            match self
                .counters
                .get(usize::from(port.wrapping_sub(1)))
                .copied()
                .flatten()
            {
                Some(c) => {
                    ctx.pri_path.counter_index = c as u8;
                    opt |= optpar::COUNTER_INDEX;
                }
                None => ctx.pri_path.counter_index = 0xff,
            }
        }
        if mask.contains(M::PKEY_INDEX) {
            ctx.pri_path.pkey_index = attr.pkey_index as u8;
            opt |= optpar::PKEY_INDEX;
        }
        if mask.contains(M::AV) {
            let pkey = ctx.pri_path.pkey_index;
            let counter = ctx.pri_path.counter_index;
            let roce = self.roce_port(port);
            ctx.pri_path = mlx4_set_path(caps, &attr.ah_attr, port, roce)?;
            ctx.pri_path.pkey_index = pkey;
            ctx.pri_path.counter_index = counter;
            opt |= optpar::PRIMARY_ADDR_PATH | optpar::SCHED_QUEUE;
        }
        if mask.contains(M::TIMEOUT) {
            ctx.pri_path.ackto |= attr.timeout << 3;
            if self.is_eth(port) {
                ctx.pri_path.ackto |= crate::roce::LINK_TYPE_ETH;
            }
            opt |= optpar::ACK_TIMEOUT;
        }
        let scq = self.cqs.get(qp.send_cq.0).ok_or(Error::NoObject)?.cqn;
        let rcq = self.cqs.get(qp.recv_cq.0).ok_or(Error::NoObject)?.cqn;
        ctx.pd = self.pds.get(qp.pd.0).ok_or(Error::NoObject)?.pdn;
        ctx.cqn_send = scq;
        ctx.cqn_recv = rcq;
        // Fast-register enabled for all kernel QPs.
        ctx.params1 = (ACK_REQ_FREQ << 28) | (1 << 11);
        if mask.contains(M::RNR_RETRY) {
            ctx.params1 |= u32::from(attr.rnr_retry & 7) << 13;
            opt |= optpar::RNR_RETRY;
        }
        if mask.contains(M::RETRY_CNT) {
            ctx.params1 |= u32::from(attr.retry_cnt & 7) << 16;
            opt |= optpar::RETRY_COUNT;
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            ctx.params1 |= fls_minus_one(attr.max_rd_atomic) << 21;
            opt |= optpar::SRA_MAX;
        }
        if mask.contains(M::SQ_PSN) {
            ctx.next_send_psn = attr.sq_psn & 0xff_ffff;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            ctx.params2 |= fls_minus_one(attr.max_dest_rd_atomic) << 21;
            opt |= optpar::RRA_MAX;
        }
        if mask.intersects(M::ACCESS_FLAGS | M::MAX_DEST_RD_ATOMIC) {
            // to_mlx4_access_flags
            let depth = if mask.contains(M::MAX_DEST_RD_ATOMIC) {
                attr.max_dest_rd_atomic
            } else {
                qp.resp_depth
            };
            let mut acc = if mask.contains(M::ACCESS_FLAGS) {
                attr.qp_access_flags
            } else {
                qp.atomic_rd_en
            };
            if depth == 0 {
                acc &= AccessFlags::REMOTE_WRITE;
            }
            if acc.contains(AccessFlags::REMOTE_READ) {
                ctx.params2 |= params2::RRE;
            }
            if acc.contains(AccessFlags::REMOTE_ATOMIC) {
                ctx.params2 |= params2::RAE;
            }
            if acc.contains(AccessFlags::REMOTE_WRITE) {
                ctx.params2 |= params2::RWE;
            }
            opt |= optpar::RWE | optpar::RRE | optpar::RAE;
        }
        if qp.srq.is_some() {
            ctx.params2 |= params2::RIC;
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            ctx.rnr_nextrecvpsn |= u32::from(attr.min_rnr_timer & 0x1f) << 24;
            opt |= optpar::RNR_TIMEOUT;
        }
        if mask.contains(M::RQ_PSN) {
            ctx.rnr_nextrecvpsn |= attr.rq_psn & 0xff_ffff;
        }
        if mask.contains(M::QKEY) {
            ctx.qkey = attr.qkey;
            opt |= optpar::Q_KEY;
        }
        if let Some(s) = qp.srq {
            let srqn = self.srqs.get(s.0).ok_or(Error::NoObject)?.srqn();
            ctx.srqn = (1 << 24) | srqn;
        }
        if cur == QpState::Reset && new == QpState::Init {
            if let Some(db) = &qp.db {
                ctx.db_rec_addr = db.dma();
            }
            // Kernel QPs may use the reserved L_Key.
            ctx.rlkey |= 1 << 4;
        }
        if cur == QpState::Init
            && new == QpState::Rtr
            && matches!(t, QpType::Smi | QpType::Gsi | QpType::Ud)
        {
            ctx.pri_path.sched_queue = (port.wrapping_sub(1) & 1) << 6;
            ctx.pri_path.sched_queue |= if t == QpType::Smi {
                DEFAULT_QP0_SCHED_QUEUE
            } else {
                DEFAULT_SCHED_QUEUE
            };
            if let Some(rp) = self.roce_port(port) {
                // Linux 3.15+: UD/GSI on Ethernet say so in ackto, with
                // their source MAC index.
                ctx.pri_path.ackto = (ctx.pri_path.ackto & 0xf8) | crate::roce::LINK_TYPE_ETH;
                ctx.pri_path.grh_mylmc = 0x80 | rp.smac_idx();
            }
        }
        let sqd_event = cur == QpState::Rts
            && new == QpState::Sqd
            && mask.contains(M::EN_SQD_ASYNC_NOTIFY)
            && attr.en_sqd_async_notify != 0;
        let qp = self.qps.slab.get_mut(id.0).ok_or(Error::NoObject)?;
        // Before the HCA owns the SQ: owner bits and stamps.
        if cur == QpState::Reset && new == QpState::Init {
            qp.stamp_all();
        }
        let hw = qp.hw.as_ref().ok_or(Error::NoObject)?;
        self.dev.qp_modify(
            &hw.mqp,
            Some(&hw.mtt),
            to_mlx4_state(cur),
            to_mlx4_state(new),
            &ctx,
            opt,
            sqd_event,
        )?;
        qp.set_state(new);
        if mask.contains(M::ACCESS_FLAGS) {
            qp.atomic_rd_en = attr.qp_access_flags;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            qp.resp_depth = attr.max_dest_rd_atomic;
        }
        if mask.contains(M::PORT) {
            qp.port = attr.port_num;
        }
        // store_sqp_attrs
        if let Some(s) = qp.sqp.as_mut() {
            if mask.contains(M::PKEY_INDEX) {
                s.pkey_index = attr.pkey_index;
            }
            if mask.contains(M::QKEY) {
                s.qkey = attr.qkey;
            }
            if mask.contains(M::SQ_PSN) {
                s.send_psn = attr.sq_psn & 0xff_ffff;
            }
        }
        let (qp_port, is_qp0) = (qp.port, qp.qp_type == QpType::Smi);
        let (qpn, srq, send_cq, recv_cq) = (qp.qpn, qp.srq, qp.send_cq, qp.recv_cq);
        if new == QpState::Reset {
            qp.reset_rings();
        }
        if is_qp0 {
            if cur != QpState::Rtr && new == QpState::Rtr && self.dev.init_port(qp_port).is_err() {
                log::warn!("{}: INIT_PORT failed for port {qp_port}", self.name);
            }
            if cur != QpState::Reset
                && cur != QpState::Err
                && matches!(new, QpState::Reset | QpState::Err)
            {
                let _ = self.dev.close_port(qp_port);
            }
        }
        if new == QpState::Reset {
            self.clean_cqs(qpn, srq, send_cq, recv_cq);
        }
        Ok(())
    }
}
