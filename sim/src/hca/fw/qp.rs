//! QP commands.
//!
//! The state-transition commands with the QP state machine, QUERY_QP (with the PSNs
//! the engines have reached) and CONF_SPECIAL_QP; each transition hands the QP to
//! the data-path engines ([`crate::hca::engine::qp_modified`]), which flush on
//! entering ERR; RTS2SQD with the SQD event bit reports SQ_DRAINED once no RC
//! message is in flight (at once, or when the engines complete the last one).
//!
//! Transitions (PRM, Linux `__mlx4_qp_modify`): RST2INIT from RST;
//! INIT2INIT and INIT2RTR from INIT; RTR2RTS from RTR; RTS2RTS and RTS2SQD
//! from RTS; SQERR2RTS from SQER; SQD2RTS and SQD2SQD from SQD; 2ERR and
//! 2RST from any state. A transition from the wrong state is BAD_QP_STATE.
//!
//! The context lives in the QPC slot in ICM. RST2INIT writes all of it;
//! INIT2RTR takes its required fields (MTU, destination QPN, primary path
//! except the P_Key index, RQ PSN and responder parameters), RTR2RTS its own
//! (SQ PSN, retry parameters, ACK timeout); every transition also takes what
//! its optpar mask selects, and nothing else.

use super::{CmdResult, Outcome, need};
use crate::hca::ctx::{QpCtx, qpc, st};
use crate::hca::device::{FwState, Hca, QpRt, QpState};
use crate::hca::hcr::{Command, Opcode, Status};
use crate::hca::icm::Table;
use crate::hca::layout::{get32, put32};

/// Optional-parameter mask bits (mailbox dword 0).
pub mod optpar {
    #![allow(missing_docs)]
    pub const ALT_ADDR_PATH: u32 = 1 << 0;
    pub const RRE: u32 = 1 << 1;
    pub const RAE: u32 = 1 << 2;
    pub const RWE: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const Q_KEY: u32 = 1 << 5;
    pub const RNR_TIMEOUT: u32 = 1 << 6;
    pub const PRIMARY_ADDR_PATH: u32 = 1 << 7;
    pub const SRA_MAX: u32 = 1 << 8;
    pub const RRA_MAX: u32 = 1 << 9;
    pub const PM_STATE: u32 = 1 << 10;
    pub const RETRY_COUNT: u32 = 1 << 12;
    pub const RNR_RETRY: u32 = 1 << 13;
    pub const ACK_TIMEOUT: u32 = 1 << 14;
    pub const SCHED_QUEUE: u32 = 1 << 16;
    pub const COUNTER_INDEX: u32 = 1 << 20;
}

fn transition(op: Opcode) -> (&'static [QpState], QpState) {
    use QpState::*;
    const ANY: &[QpState] = &[Rst, Init, Rtr, Rts, Sqer, Sqd, Err];
    match op {
        Opcode::RST2INIT_QP => (&[Rst], Init),
        Opcode::INIT2INIT_QP => (&[Init], Init),
        Opcode::INIT2RTR_QP => (&[Init], Rtr),
        Opcode::RTR2RTS_QP => (&[Rtr], Rts),
        Opcode::RTS2RTS_QP => (&[Rts], Rts),
        Opcode::SQERR2RTS_QP => (&[Sqer], Rts),
        Opcode::RTS2SQD_QP => (&[Rts], Sqd),
        Opcode::SQD2RTS_QP => (&[Sqd], Rts),
        Opcode::SQD2SQD_QP => (&[Sqd], Sqd),
        Opcode::ERR_QP => (ANY, Err),
        _ => (ANY, Rst),
    }
}

/// The special-QP role of a QPN: `Some((port, is_qp0))`.
fn special(hca: &Hca, qpn: u32) -> Option<(u8, bool)> {
    let base = hca.special_qp_base;
    if base == 0 || qpn < base || qpn >= base + 4 {
        return None;
    }
    let k = qpn - base;
    Some(((k % 2) as u8 + 1, k < 2))
}

fn copy(dst: &mut [u8], src: &[u8], off: usize, len: usize) {
    dst[off..off + len].copy_from_slice(&src[off..off + len]);
}

/// Applies the optpar-selected fields of `new` to `cur`.
fn apply_optpar(cur: &mut [u8], new: &[u8], opt: u32) {
    use optpar::*;
    let p = qpc::PRI_PATH;
    if opt & PRIMARY_ADDR_PATH != 0 {
        copy(cur, new, p, 0x2c);
    }
    if opt & ALT_ADDR_PATH != 0 {
        copy(cur, new, qpc::ALT_PATH, 0x2c);
    }
    if opt & PKEY_INDEX != 0 {
        copy(cur, new, p + qpc::PATH_PKEY_INDEX, 1);
    }
    if opt & SCHED_QUEUE != 0 {
        copy(cur, new, p + qpc::PATH_SCHED_QUEUE, 1);
    }
    if opt & ACK_TIMEOUT != 0 {
        copy(cur, new, p + 8, 1);
    }
    if opt & COUNTER_INDEX != 0 {
        copy(cur, new, p + 4, 1);
    }
    if opt & Q_KEY != 0 {
        copy(cur, new, qpc::QKEY, 4);
    }
    if opt & RNR_TIMEOUT != 0 {
        copy(cur, new, qpc::RNR_NEXTRECVPSN, 1);
    }
    let merge = |cur: &mut [u8], off: usize, mask: u32| {
        let v = (get32(cur, off) & !mask) | (get32(new, off) & mask);
        put32(cur, off, v);
    };
    let mut p1 = 0;
    if opt & RETRY_COUNT != 0 {
        p1 |= 7 << 16;
    }
    if opt & RNR_RETRY != 0 {
        p1 |= 7 << 13;
    }
    if opt & SRA_MAX != 0 {
        p1 |= 7 << 21;
    }
    merge(cur, qpc::PARAMS1, p1);
    let mut p2 = 0;
    if opt & RRE != 0 {
        p2 |= 1 << 15;
    }
    if opt & RWE != 0 {
        p2 |= 1 << 14;
    }
    if opt & RAE != 0 {
        p2 |= 1 << 13;
    }
    if opt & RRA_MAX != 0 {
        p2 |= 7 << 21;
    }
    merge(cur, qpc::PARAMS2, p2);
    if opt & PM_STATE != 0 {
        merge(cur, qpc::FLAGS, 3 << 11);
    }
}

fn set_state(ctx: &mut [u8], s: QpState) {
    let f = (get32(ctx, qpc::FLAGS) & 0x0fff_ffff) | (s as u32) << 28;
    put32(ctx, qpc::FLAGS, f);
}

fn check_rst2init(hca: &mut Hca, cmd: &Command, qpn: u32, c: &QpCtx) -> Result<(), Status> {
    let caps = hca.caps().clone();
    let is_special = special(hca, qpn).is_some();
    // An MLX QP that is not a special QP is a raw Ethernet QP: its port
    // (the path's sched_queue) must run Ethernet.
    let eth = hca
        .port_index(u32::from(c.port()))
        .is_some_and(|i| hca.ports[i].is_eth());
    let st_ok = match c.st {
        st::RC | st::UC | st::UD => !is_special,
        st::MLX => is_special || eth,
        _ => false,
    };
    if !st_ok
        || c.local_qpn != qpn
        || c.msgmax > caps.log_max_msg
        || u64::from(c.pd) >= crate::hca::layout::pow2(caps.log_max_pd)
        || c.usr_page >= caps.num_uars()
        || c.usr_page < u32::from(caps.rsvd_uars)
        || c.sq_log_size > caps.log_max_qp_sz
        // A QP on an SRQ has no RQ of its own: Linux mlx4_ib leaves
        // `rq.wqe_shift - 4` (0xfc) in its RQ size byte.
        || (!c.has_srq && c.rq_log_size > caps.log_max_qp_sz)
        || c.sq_log_stride < 2
    {
        return Err(Status::BAD_PARAM);
    }
    super::res::pd_check(hca, cmd, qpn, c.pd)?;
    for cqn in [c.cqn_send, c.cqn_recv] {
        if !hca.cqs.contains_key(&cqn) {
            hca.violation(format!(
                "RST2INIT QP {qpn:#x}: CQ {cqn:#x} is not in hardware ownership"
            ));
            return Err(Status::BAD_RES_STATE);
        }
    }
    if c.has_srq && !hca.srqs.contains_key(&c.srqn) {
        return Err(Status::BAD_RES_STATE);
    }
    for t in [Table::Auxc, Table::Altc, Table::Rdmarc, Table::Cmpt(0)] {
        let i = hca.qp_index(qpn);
        hca.ctx_va(t, i)?;
    }
    if c.rss {
        // An RSS QP (raw Ethernet only) has no queues of its own: it hands
        // frames to its rings (Linux's RSS QP context names no MTT).
        if !(c.st == st::MLX && eth && !is_special) {
            hca.violation(format!(
                "RST2INIT QP {qpn:#x}: the RSS bit on a QP that is not a raw Ethernet QP"
            ));
            return Err(Status::BAD_PARAM);
        }
        return Ok(());
    }
    // A raw Ethernet QP without an RQ size has no RQ: its buffer is the SQ
    // alone (mlx4_en's send rings) and its doorbell record is not read
    // (mlx4_en writes none for its send rings and RSS QP). Any other QP
    // with RQ size byte 0 has one 16-byte receive WQE (Linux mlx4_ib
    // set_rq_size never makes an RQ of 0 WQEs without an SRQ).
    let no_rq = c.st == st::MLX && !is_special && c.rq_log_size == 0 && c.rq_log_stride == 0;
    let rq = if c.has_srq || no_rq {
        0
    } else {
        (1u64 << c.rq_log_size) << (c.rq_log_stride + 4)
    };
    let sq = (1u64 << c.sq_log_size) << (c.sq_log_stride + 4);
    hca.mtt_pages(c.mtt_base, c.log_page_size, rq + sq)?;
    if !c.has_srq && !no_rq {
        if !c.db_rec_addr.is_multiple_of(4) {
            return Err(Status::BAD_PARAM);
        }
        let mut db = [0u8; 4];
        hca.dma_read(c.db_rec_addr, &mut db)?;
    }
    Ok(())
}

fn check_init2rtr(hca: &mut Hca, qpn: u32, cur: &QpCtx, new: &QpCtx) -> Result<u8, Status> {
    let port = new.port();
    if usize::from(port) > hca.ports.len() {
        return Err(Status::BAD_PARAM);
    }
    if let Some((p, _)) = special(hca, qpn)
        && p != port
    {
        hca.violation(format!(
            "INIT2RTR special QP {qpn:#x} belongs to port {p} but its path names port {port}"
        ));
        return Err(Status::BAD_PARAM);
    }
    if matches!(cur.st, st::RC | st::UC) {
        let cap = hca.ports[usize::from(port) - 1].mtu_cap;
        if new.mtu == 0 || new.mtu > cap {
            return Err(Status::BAD_PARAM);
        }
    }
    Ok(port)
}

/// INIT2RTR of an RC/UC QP on an Ethernet port: RoCE has no LIDs, so the
/// path must carry the GRH (Linux `mlx4_set_path` refuses an address
/// without one) with a source GID index inside the RoCE GID table.
fn check_roce_path(hca: &mut Hca, qpn: u32, port: u8, ctx: &[u8]) -> Result<(), Status> {
    use crate::hca::layout::get8;
    let eth = hca
        .port_index(u32::from(port))
        .is_some_and(|i| hca.ports[i].is_eth());
    if !eth {
        return Ok(());
    }
    let p = qpc::PRI_PATH;
    if get8(ctx, p + 5) & 0x80 == 0 {
        hca.violation(format!(
            "INIT2RTR QP {qpn:#x} on Ethernet port {port}: the path has no GRH (RoCE needs one)"
        ));
        return Err(Status::BAD_PARAM);
    }
    if usize::from(get8(ctx, p + 9)) >= crate::hca::eth::GID_TABLE_LEN {
        hca.violation(format!(
            "INIT2RTR QP {qpn:#x}: source GID index {} beyond the RoCE GID table",
            get8(ctx, p + 9)
        ));
        return Err(Status::BAD_PARAM);
    }
    Ok(())
}

/// The QPC slot of `qpn` (its index and ICM address) for a command on
/// that QP. The QPN's low `log_num_qps` bits index the table and the bits
/// above are a tag ([`Hca::qp_index`]): a slot outside the table or not
/// mapped is refused by [`Hca::ctx_va`], a firmware-reserved one is
/// BAD_RESOURCE, and a slot another QPN with the same index (another tag)
/// holds out of RESET is BAD_RES_STATE: the context there is that QP's,
/// not this one's.
fn context_slot(hca: &mut Hca, cmd: &Command, qpn: u32) -> Result<(u64, u64), Status> {
    let qidx = hca.qp_index(qpn);
    let va = hca.ctx_va(Table::Qpc, qidx)?;
    if qidx < u64::from(hca.caps().rsvd_qps()) {
        return Err(Status::BAD_RESOURCE);
    }
    if let Some((&other, _)) = hca
        .qps
        .iter()
        .find(|(n, q)| **n != qpn && q.state != QpState::Rst && hca.qp_index(**n) == qidx)
    {
        hca.violation(format!(
            "{} QP {qpn:#x}: its context slot {qidx:#x} is in use by QP {other:#x}",
            cmd.opcode
        ));
        return Err(Status::BAD_RES_STATE);
    }
    Ok((qidx, va))
}

/// Any QP state transition. The input modifier is the QPN (23:0) and, for
/// RTS2SQD only, the SQ-drained event request in bit 31 (Linux
/// `__mlx4_qp_modify`); bits 30:24 are reserved. The opcode modifier is 0,
/// except for 2RST (Linux 2, iPXE 3: no output mailbox).
pub fn modify(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    let sqd_event = cmd.in_mod >> 31 != 0;
    if cmd.in_mod & 0x7f00_0000 != 0 || (sqd_event && cmd.opcode != Opcode::RTS2SQD_QP) {
        hca.violation(format!(
            "{}: input modifier {:#010x} has reserved bits set (QPN 23:0; bit 31 only for RTS2SQD)",
            cmd.opcode, cmd.in_mod
        ));
        return Err(Status::BAD_PARAM);
    }
    let op_mod_ok = if cmd.opcode == Opcode::RST_QP {
        cmd.op_mod <= 3
    } else {
        cmd.op_mod == 0
    };
    if !op_mod_ok {
        return Err(Status::BAD_OP);
    }
    let qpn = cmd.in_mod & 0xff_ffff;
    let (qidx, va) = context_slot(hca, cmd, qpn)?;
    // Earlier tags of this slot, all in RESET: forgotten.
    let stale: Vec<u32> = hca
        .qps
        .keys()
        .copied()
        .filter(|&n| n != qpn && hca.qp_index(n) == qidx)
        .collect();
    for n in stale {
        hca.qps.remove(&n);
    }
    let (from, to) = transition(cmd.opcode);
    let rt = hca.qps.get(&qpn).copied();
    let cur_state = rt.map_or(QpState::Rst, |q| q.state);
    if !from.contains(&cur_state) {
        return Err(Status::BAD_QP_STATE);
    }
    if to == QpState::Rst {
        let mut f = [0u8; 4];
        if hca.icm_read(va, &mut f).is_ok() {
            set_state(&mut f, QpState::Rst);
            let _ = hca.icm_write(va, &f);
        }
        if let Some(q) = hca.qps.get_mut(&qpn) {
            q.state = QpState::Rst;
        }
        crate::hca::engine::qp_modified(hca, qpn, cmd.opcode, QpState::Rst);
        return Ok(Outcome::OK);
    }
    let mbox = hca.read_mailbox(cmd.in_param, qpc::MAILBOX_CTX + qpc::SIZE)?;
    let opt = get32(&mbox, qpc::MAILBOX_OPTPAR);
    let new_raw = &mbox[qpc::MAILBOX_CTX..];
    let new = QpCtx::decode(new_raw);
    if new.state != to as u8 && cmd.opcode != Opcode::ERR_QP {
        hca.violation(format!(
            "{} QP {qpn:#x}: context state field {} (expected {})",
            cmd.opcode, new.state, to as u8
        ));
    }
    let mut ctx;
    let mut next = rt.unwrap_or(QpRt {
        state: QpState::Rst,
        st: new.st,
        scq: 0,
        rcq: 0,
        srq: None,
        pd: 0,
        port: 0,
        uar: new.usr_page,
    });
    match cmd.opcode {
        Opcode::RST2INIT_QP => {
            check_rst2init(hca, cmd, qpn, &new)?;
            ctx = new_raw.to_vec();
            next = QpRt {
                state: to,
                st: new.st,
                scq: new.cqn_send,
                rcq: new.cqn_recv,
                srq: new.has_srq.then_some(new.srqn),
                pd: new.pd,
                port: special(hca, qpn).map_or(0, |(p, _)| p),
                uar: new.usr_page,
            };
        }
        Opcode::INIT2RTR_QP | Opcode::RTR2RTS_QP => {
            ctx = vec![0u8; qpc::SIZE];
            hca.icm_read(va, &mut ctx)?;
            let cur = QpCtx::decode(&ctx);
            let required: &[(usize, usize)] = if cmd.opcode == Opcode::INIT2RTR_QP {
                next.port = check_init2rtr(hca, qpn, &cur, &new)?;
                if matches!(cur.st, st::RC | st::UC) {
                    check_roce_path(hca, qpn, next.port, new_raw)?;
                }
                &[
                    (qpc::MTU_MSGMAX, 1),
                    (qpc::REMOTE_QPN, 4),
                    (qpc::PRI_PATH, 0x2c),
                    (qpc::PARAMS2, 8),
                ]
            } else {
                &[
                    (qpc::PARAMS1, 4),
                    (qpc::NEXT_SEND_PSN, 4),
                    (qpc::PRI_PATH + 8, 1),
                ]
            };
            let pkey = ctx[qpc::PRI_PATH + qpc::PATH_PKEY_INDEX];
            for &(off, len) in required {
                copy(&mut ctx, new_raw, off, len);
            }
            if opt & optpar::PKEY_INDEX == 0 {
                ctx[qpc::PRI_PATH + qpc::PATH_PKEY_INDEX] = pkey;
            }
            apply_optpar(&mut ctx, new_raw, opt);
            next.state = to;
        }
        _ => {
            ctx = vec![0u8; qpc::SIZE];
            hca.icm_read(va, &mut ctx)?;
            if cmd.opcode != Opcode::ERR_QP {
                apply_optpar(&mut ctx, new_raw, opt);
            }
            next.state = to;
        }
    }
    set_state(&mut ctx, to);
    hca.icm_write(va, &ctx)?;
    hca.qps.insert(qpn, next);
    crate::hca::engine::qp_modified(hca, qpn, cmd.opcode, to);
    if cmd.opcode == Opcode::RTS2SQD_QP
        && cmd.in_mod >> 31 != 0
        && crate::hca::engine::sq_drained_or_later(hca, qpn)
    {
        // Nothing in flight: the SQ is drained at once (else the engines
        // report it when the last message in flight completes).
        hca.post_async(crate::hca::ctx::Event::Qp {
            kind: crate::hca::ctx::eqe::SQ_DRAINED,
            qpn,
        });
    }
    Ok(Outcome::OK)
}

/// QUERY_QP: optpar 0, 4 reserved bytes, then the context from ICM. The
/// QPN is looked up as the transitions look it up ([`context_slot`]): a
/// QPN whose slot another tag holds is refused, not answered with that
/// QP's context.
pub fn query_qp(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    let qpn = super::res::index(hca, cmd)?;
    let (_, va) = context_slot(hca, cmd, qpn)?;
    let state = hca.qps.get(&qpn).map_or(QpState::Rst, |q| q.state);
    let mut out = vec![0u8; qpc::MAILBOX_CTX + qpc::SIZE];
    hca.icm_read(va, &mut out[qpc::MAILBOX_CTX..])?;
    set_state(&mut out[qpc::MAILBOX_CTX..], state);
    // The PSNs the engines have reached, not the ones the driver wrote.
    if let Some(q) = hca.engine.qps.get(&qpn) {
        let c = &mut out[qpc::MAILBOX_CTX..];
        put32(c, qpc::NEXT_SEND_PSN, q.sq_psn & 0xff_ffff);
        let rnr = get32(c, qpc::RNR_NEXTRECVPSN) & 0xff00_0000;
        put32(c, qpc::RNR_NEXTRECVPSN, rnr | (q.rq_psn & 0xff_ffff));
    }
    hca.write_mailbox(cmd.out_param, &out)?;
    Ok(Outcome::OK)
}

/// CONF_SPECIAL_QP: in_mod = base of the 8 special QPNs (0 = none); op_mod
/// 0 (QP0/QP1; Linux and iPXE use nothing else, the other internal-QP
/// flavours are not modelled: BAD_OP).
///
/// A teardown without `CONF_SPECIAL_QP(0)` is not recorded: Linux sends it
/// (`mlx4_cleanup_qp_table`), but iPXE goes straight to CLOSE_HCA on real
/// cards, so CLOSE_HCA evidently drops the configuration.
pub fn conf_special_qp(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    if cmd.op_mod != 0 {
        return Err(Status::BAD_OP);
    }
    let base = super::res::index(hca, cmd)?;
    let live = |h: &Hca| {
        let b = h.special_qp_base;
        b != 0
            && h.qps
                .iter()
                .any(|(&n, q)| n >= b && n < b + 8 && q.state != QpState::Rst)
    };
    if live(hca) {
        return Err(Status::RESOURCE_BUSY);
    }
    if base != 0 {
        let nqps = hca.geo()?.count(Table::Qpc).unwrap_or(0);
        if !base.is_multiple_of(8) || base < hca.caps().rsvd_qps() || u64::from(base) + 8 > nqps {
            return Err(Status::BAD_PARAM);
        }
    }
    hca.special_qp_base = base;
    Ok(Outcome::OK)
}
