//! Port of Linux `drivers/infiniband/core/mad.c` (3.11): the MAD layer of each port (QP0/QP1, agents, sends with their timeouts and retries, receives for the agents or the driver's `process_mad`).
//!
//! RMPP reassembly is in `mad_rmpp.rs`; sending RMPP transfers and redirection
//! are left out.
//!
//! The layouts and the agent API's types are Linux's `ib_mad.h` and
//! `ib_smi.h` (`mad/ib_mad.rs`, `mad/ib_smi.rs`), re-exported here; the
//! private state of a port, its agents and its sends is `mad_priv.h`
//! (`mad/mad_priv.rs`), and every step of the layer takes it as one
//! borrowed `MadCtx`. Vendor classes of range 2 match one OUI per
//! registration instead of Linux's OUI tables.

mod ib_mad;
mod ib_smi;
mod mad_priv;

pub use ib_mad::*;
pub use ib_smi::*;
use mad_priv::{AgentPriv, MadQp, SendPriv, SendState};
pub(crate) use mad_priv::{MadCtx, MadPort};

use alloc::boxed::Box;
use alloc::collections::{BTreeSet, VecDeque};
use alloc::vec::Vec;
use core::time::Duration;

use hal::Clock;

use crate::device::{Device, DeviceId, IbCore, MadConfig};
use crate::error::{Error, Result};
use crate::smi::{
    SmiAction, SmiForwardAction, smi_check_forward_dr_smp, smi_check_local_smp,
    smi_handle_dr_smp_recv, smi_handle_dr_smp_send,
};
use crate::verbs::{
    AccessFlags, Ah, AhAttr, CqInitAttr, CqNotifyFlags, IB_QP1_QKEY, LinkLayer, NodeType, Pd, Qp,
    QpAttr, QpAttrMask, QpCap, QpCreateFlags, QpInitAttr, QpState, QpType, RecvWr, SendFlags,
    SendWr, Sge, SigType, Wc, WcFlags, WcOpcode, WcStatus, WrDetail, WrOpcode,
};

/// Classes an agent may register below (`MAX_MGMT_CLASS`; 0x81 is folded).
pub const MAX_MGMT_CLASS: u8 = 80;
/// Class versions an agent may register below (`MAX_MGMT_VERSION`).
pub const MAX_MGMT_VERSION: u8 = 8;
/// Bytes of one receive buffer: the GRH area, then the MAD.
pub const MAD_RECV_BUF: usize = IB_GRH_BYTES + IB_MGMT_MAD_SIZE;
const PAGE: usize = 4096;
const WRID_SEND: u64 = 1 << 63;

/// What the MAD layer of one port counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MadCounters {
    /// MADs received with a good completion.
    pub recv: u64,
    /// MADs sent (good send completions).
    pub sent: u64,
    /// Receive completions in error (flushes counted apart).
    pub recv_errors: u64,
    /// Send completions in error.
    pub send_errors: u64,
    /// Dropped: shorter than a GRH area and a MAD.
    pub drop_short: u64,
    /// Dropped: base version not 1.
    pub drop_bad_version: u64,
    /// Dropped: an SM class on QP1 or another class on QP0.
    pub drop_wrong_qp: u64,
    /// Dropped by the directed-route SMP rules.
    pub drop_smi: u64,
    /// Dropped: a response matching no outstanding request (unknown TID).
    pub drop_unmatched_response: u64,
    /// Dropped: no agent, and no response due.
    pub drop_no_agent: u64,
    /// Dropped: the agent's mailbox was full.
    pub drop_mailbox_full: u64,
    /// Requests answered "unsupported method/attribute".
    pub unsupported_replies: u64,
    /// MADs answered by the driver's `process_mad` (SMA/PMA).
    pub process_mad_replies: u64,
    /// MADs consumed by the driver.
    pub consumed: u64,
    /// Traps of the HCA's own SMA forwarded to the SM.
    pub traps_forwarded: u64,
    /// Directed-route SMPs handled locally, without the wire.
    pub local_smps: u64,
    /// Requests that ran out of retries.
    pub timeouts: u64,
    /// Retries sent.
    pub retries: u64,
    /// Receive buffers that could not be re-posted.
    pub repost_failures: u64,
    /// Receive buffers that came back flushed (the QP is in error); they
    /// are not posted again.
    pub recv_flushed: u64,
    /// RMPP segments received by RMPP agents.
    pub rmpp_segments: u64,
    /// RMPP transfers put together.
    pub rmpp_completed: u64,
    /// RMPP segments or transfers dropped (bad, out of order, aborted,
    /// timed out).
    pub rmpp_dropped: u64,
}

fn qp_index(t: QpType) -> Option<usize> {
    match t {
        QpType::Smi => Some(0),
        QpType::Gsi => Some(1),
        _ => None,
    }
}

fn wr_id(send: bool, qpi: usize, slot: usize) -> u64 {
    (if send { WRID_SEND } else { 0 }) | ((qpi as u64) << 32) | slot as u64
}

/// `ib_mad_port_open` + `ib_mad_port_start`: PD, DMA MR, one CQ, QP0 (on an
/// InfiniBand port) and QP1 brought to RTS, receive buffers with their GRH
/// area posted.
#[doc(alias = "ib_mad_port_open")]
pub(crate) fn port_open(dev: &mut Device, port: u8, cfg: &MadConfig) -> Result<MadPort> {
    let mut mp = MadPort {
        port,
        pd: None,
        mr: None,
        cq: None,
        qps: [None, None],
        agents: Vec::new(),
        sends: Vec::new(),
        free_sends: Vec::new(),
        next_gen: 1,
        by_tid: BTreeSet::new(),
        next_deadline: u64::MAX,
        rmpp_recvs: Vec::new(),
        counters: MadCounters::default(),
    };
    match port_open_inner(dev, &mut mp, cfg) {
        Ok(()) => Ok(mp),
        Err(e) => {
            port_close(dev, mp);
            Err(e)
        }
    }
}

fn port_open_inner(dev: &mut Device, mp: &mut MadPort, cfg: &MadConfig) -> Result<()> {
    let port = mp.port;
    if cfg.recv_queue_size < 1 || cfg.send_queue_size < 1 {
        return Err(Error::Invalid("MAD queue sizes must be at least 1"));
    }
    let pool = dev.ops.dma_pool();
    let pd = dev.alloc_pd()?;
    mp.pd = Some(pd);
    let mr = dev.get_dma_mr(pd, AccessFlags::LOCAL_WRITE)?;
    mp.mr = Some(mr);
    let (cq, _) = dev.create_cq(&CqInitAttr {
        cqe: (cfg.send_queue_size + cfg.recv_queue_size) * 2,
        comp_vector: 0,
    })?;
    mp.cq = Some(cq);
    let first = if dev.port_link_layer(port)? == LinkLayer::Infiniband {
        0
    } else {
        1
    };
    for qpi in first..2 {
        let qp_type = if qpi == 0 { QpType::Smi } else { QpType::Gsi };
        let (qp, _cap) = dev.create_qp(
            pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: cfg.send_queue_size,
                    max_recv_wr: cfg.recv_queue_size,
                    max_send_sge: 2,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_type: SigType::AllWr,
                qp_type,
                create_flags: QpCreateFlags::empty(),
                port_num: port,
            },
        )?;
        let recv_per_page = PAGE / MAD_RECV_BUF;
        let send_per_page = PAGE / IB_MGMT_MAD_SIZE;
        let nrecv = cfg.recv_queue_size as usize;
        let nsend = cfg.send_queue_size as usize;
        // Owned by the port from here on, so a failure below destroys it.
        let mq = mp.qps[qpi].insert(MadQp {
            qp,
            recv_pages: Vec::new(),
            recv_per_page,
            send_pages: Vec::new(),
            send_per_page,
            send_slot: alloc::vec![None; nsend],
            free_slots: (0..nsend as u32).rev().collect(),
            overflow: VecDeque::new(),
        });
        let dma_err = |_| Error::NoMem;
        for _ in 0..nrecv.div_ceil(recv_per_page) {
            mq.recv_pages.push(pool.alloc(PAGE, PAGE).map_err(dma_err)?);
        }
        for _ in 0..nsend.div_ceil(send_per_page) {
            mq.send_pages.push(pool.alloc(PAGE, PAGE).map_err(dma_err)?);
        }
        // ib_mad_port_start: INIT (P_Key index of the default P_Key, the
        // well-known Q_Key), RTR, RTS.
        let pkey_index = dev.find_cached_pkey(port, 0xffff).unwrap_or(0);
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index,
            qkey: if qpi == 0 { 0 } else { IB_QP1_QKEY },
            ..QpAttr::default()
        };
        dev.modify_qp(
            qp,
            &attr,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::QKEY,
        )?;
        attr.qp_state = QpState::Rtr;
        dev.modify_qp(qp, &attr, QpAttrMask::STATE)?;
        attr.qp_state = QpState::Rts;
        attr.sq_psn = 0;
        dev.modify_qp(qp, &attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)?;
    }
    dev.req_notify_cq(cq, CqNotifyFlags::NEXT_COMP)?;
    for qpi in first..2 {
        for slot in 0..cfg.recv_queue_size as usize {
            post_recv_slot(dev, mp, qpi, slot)?;
        }
    }
    Ok(())
}

fn post_recv_slot(dev: &mut Device, mp: &MadPort, qpi: usize, slot: usize) -> Result<()> {
    let (Some(mq), Some(mr)) = (mp.qps[qpi].as_ref(), mp.mr) else {
        return Err(Error::NoDev);
    };
    let Some((page, off)) = mq.recv_addr(slot) else {
        return Err(Error::Invalid("MAD receive slot out of range"));
    };
    let sge = [Sge {
        addr: page.bus_addr().0 + off as u64,
        length: MAD_RECV_BUF as u32,
        lkey: mr.lkey,
    }];
    dev.post_recv(
        mq.qp,
        &[RecvWr {
            wr_id: wr_id(false, qpi, slot),
            sg_list: &sge,
        }],
    )
    .map_err(|e| e.error)
}

/// `ib_mad_port_close`: destroys the QPs, CQ, MR and PD (whatever exists),
/// and drops pending sends (destroying their AHs) and the agents.
#[doc(alias = "ib_mad_port_close")]
pub(crate) fn port_close(dev: &mut Device, mut mp: MadPort) {
    for s in mp.sends.iter_mut() {
        if let Some(s) = s.take() {
            let _ = dev.destroy_ah(s.ah);
        }
    }
    for qpi in 0..2 {
        if let Some(mq) = mp.qps[qpi].take()
            && let Err(e) = dev.destroy_qp(mq.qp)
        {
            log::warn!("{}: port {}: destroying QP{qpi}: {e}", dev.name(), mp.port);
        }
    }
    if let Some(cq) = mp.cq.take() {
        let _ = dev.destroy_cq(cq);
    }
    if let Some(mr) = mp.mr.take() {
        let _ = dev.dereg_mr(mr);
    }
    if let Some(pd) = mp.pd.take() {
        let _ = dev.dealloc_pd(pd);
    }
}

/// Finishes a send: drops it, destroys its AH, tells its agent.
fn complete_send(cx: &mut MadCtx<'_>, idx: u32, status: WcStatus, vendor_err: u32) {
    let id = cx.mp.send_id(idx);
    let Some(s) = cx.mp.sends.get_mut(idx as usize).and_then(|s| s.take()) else {
        return;
    };
    cx.mp.free_sends.push(idx);
    cx.mp.by_tid.remove(&(s.buf.mad.tid(), idx));
    if let SendState::OnWire(slot) = s.state
        && let Some(mq) = cx.mp.qps[s.qpi].as_mut()
    {
        mq.send_slot[slot as usize] = None;
        mq.free_slots.push(slot);
    }
    if let Some(mq) = cx.mp.qps[s.qpi].as_mut() {
        mq.overflow.retain(|&i| i != idx);
    }
    let _ = cx.dev.destroy_ah(s.ah);
    if let Some(agent) = s.agent {
        cx.mp.deliver(
            cx.cfg,
            agent,
            MadEvent::SendDone(MadSendWc {
                id,
                status,
                vendor_err,
                context: s.buf.context,
            }),
        );
    }
}

/// Posts send `idx` if its QP has a free slot; otherwise queues it (Linux's
/// overflow list). Ok(false) = queued.
fn post_one(cx: &mut MadCtx<'_>, idx: u32) -> Result<bool> {
    let Some(mr) = cx.mp.mr else {
        return Err(Error::NoDev);
    };
    let Some(Some(s)) = cx.mp.sends.get_mut(idx as usize) else {
        return Err(Error::NotFound);
    };
    let qpi = s.qpi;
    let Some(mq) = cx.mp.qps[qpi].as_mut() else {
        return Err(Error::NoDev);
    };
    let Some(slot) = mq.free_slots.pop() else {
        s.state = SendState::Queued;
        if !mq.overflow.contains(&idx) {
            mq.overflow.push_back(idx);
        }
        return Ok(false);
    };
    let Some((page, off)) = mq.send_addr(slot as usize) else {
        mq.free_slots.push(slot);
        return Err(Error::Invalid("MAD send slot out of range"));
    };
    page.write_bytes(off, &s.buf.mad.0);
    let sge = [Sge {
        addr: page.bus_addr().0 + off as u64,
        length: IB_MGMT_MAD_SIZE as u32,
        lkey: mr.lkey,
    }];
    let wr = [SendWr {
        wr_id: wr_id(true, qpi, slot as usize),
        sg_list: &sge,
        opcode: WrOpcode::Send,
        send_flags: SendFlags::SIGNALED,
        imm_data: 0,
        wr: WrDetail::Ud {
            ah: s.ah,
            remote_qpn: s.buf.remote_qpn,
            remote_qkey: s.buf.remote_qkey,
            pkey_index: s.buf.pkey_index,
            port_num: cx.mp.port,
        },
        inline_data: &[],
    }];
    let qp = mq.qp;
    match cx.dev.post_send(qp, &wr) {
        Ok(()) => {
            mq.send_slot[slot as usize] = Some(idx);
            s.state = SendState::OnWire(slot);
            Ok(true)
        }
        Err(e) => {
            mq.free_slots.push(slot);
            Err(e.error)
        }
    }
}

/// Posts queued sends while slots are free.
fn drain_overflow(cx: &mut MadCtx<'_>, qpi: usize) {
    loop {
        let Some(mq) = cx.mp.qps[qpi].as_mut() else {
            return;
        };
        if mq.free_slots.is_empty() {
            return;
        }
        let Some(idx) = mq.overflow.pop_front() else {
            return;
        };
        if let Err(e) = post_one(cx, idx) {
            log::warn!(
                "{}: port {}: posting a queued MAD: {e}",
                cx.dev.name(),
                cx.mp.port
            );
            complete_send(cx, idx, WcStatus::GeneralErr, 0);
        }
    }
}

/// `build_smp_wc`: the completion a locally handled SMP is delivered with.
fn build_smp_wc(qp_num: u32, slid: u16, pkey_index: u16, port: u8) -> Wc {
    Wc {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Recv,
        pkey_index,
        byte_len: (IB_GRH_BYTES + IB_MGMT_MAD_SIZE) as u32,
        src_qp: qp_num,
        qp_num,
        slid,
        wc_flags: WcFlags::empty(),
        dlid_path_bits: 0,
        port_num: port,
        ..Wc::default()
    }
}

/// The send half of `ib_post_send_mad` for one MAD, from an agent or (agent
/// `None`) from the responder of agent.c.
fn send_mad(
    cx: &mut MadCtx<'_>,
    agent: Option<u32>,
    qpi: usize,
    mut buf: MadSendBuf,
) -> Result<MadSendId> {
    if cx.mp.qps[qpi].is_none() {
        return Err(Error::Invalid("no such special QP on this port"));
    }
    if buf.mad.base_version() != IB_MGMT_BASE_VERSION {
        return Err(Error::Invalid("MAD base version is not 1"));
    }
    let smi_class = matches!(
        buf.mad.mgmt_class(),
        class::SUBN_LID_ROUTED | class::SUBN_DIRECTED_ROUTE
    );
    if smi_class != (qpi == 0) {
        return Err(Error::Invalid(
            "SM classes go on QP0, every other class on QP1",
        ));
    }
    if let Some(a) = agent {
        let ap = cx.mp.agent(a)?;
        if !response_mad(&buf.mad) {
            let mut lo = buf.mad.tid() as u32;
            if lo == 0 {
                ap.next_tid = ap.next_tid.wrapping_add(1).max(1);
                lo = ap.next_tid;
            }
            buf.mad
                .set_tid((u64::from(ap.hi_tid) << 32) | u64::from(lo));
        }
    }
    let mut local = false;
    if buf.mad.mgmt_class() == class::SUBN_DIRECTED_ROUTE {
        // Directed-route handling starts only where the LID-routed part
        // (the first of a request, the last of a response) is empty; at
        // the start of a LID-routed part the hop pointer stays as it is
        // (IBTA 14.2.2, Linux handle_outgoing_dr_smp).
        let lid_part_empty = if buf.mad.smp_direction() {
            buf.mad.dr_dlid()
        } else {
            buf.mad.dr_slid()
        } == crate::verbs::IB_LID_PERMISSIVE;
        if lid_part_empty
            && smi_handle_dr_smp_send(&mut buf.mad, cx.dev.node_type(), cx.mp.port)
                == SmiAction::Discard
        {
            return Err(Error::Invalid(
                "directed-route SMP refused by the SMI send rules (hop count/pointer or path)",
            ));
        }
        local = smi_check_local_smp(&buf.mad, true) == SmiAction::Handle;
    }
    let Some(pd) = cx.mp.pd else {
        return Err(Error::NoDev);
    };
    if local {
        return handle_outgoing_dr_smp(cx, agent, buf, pd);
    }
    let ah = cx.dev.create_ah(pd, &buf.ah_attr)?;
    let idx = alloc_send(cx.mp, agent, qpi, buf, ah);
    match post_one(cx, idx) {
        Ok(_) => Ok(cx.mp.send_id(idx)),
        Err(e) => {
            let _ = cx.dev.destroy_ah(ah);
            if let Some(s) = cx.mp.sends.get_mut(idx as usize).and_then(|x| x.take()) {
                cx.mp.by_tid.remove(&(s.buf.mad.tid(), idx));
            }
            cx.mp.free_sends.push(idx);
            Err(e)
        }
    }
}

fn alloc_send(mp: &mut MadPort, agent: Option<u32>, qpi: usize, buf: MadSendBuf, ah: Ah) -> u32 {
    let generation = mp.next_gen;
    mp.next_gen = mp.next_gen.wrapping_add(1).max(1);
    let s = SendPriv {
        generation,
        agent,
        qpi,
        retries_left: buf.retries,
        buf,
        ah,
        state: SendState::Queued,
        canceled: false,
        got_response: false,
        retry_on_flush: false,
    };
    let tracked = s.agent.is_some() && !response_mad(&s.buf.mad);
    let tid = s.buf.mad.tid();
    let i = if let Some(i) = mp.free_sends.pop() {
        mp.sends[i as usize] = Some(s);
        i
    } else {
        mp.sends.push(Some(s));
        (mp.sends.len() - 1) as u32
    };
    if tracked {
        mp.by_tid.insert((tid, i));
    }
    i
}

/// `handle_outgoing_dr_smp`: a DR SMP for this port's own SMA goes to
/// `process_mad`, never to the wire; its answer (or the request itself, if
/// the driver passes on it) is delivered as a receive, then the send
/// completes.
fn handle_outgoing_dr_smp(
    cx: &mut MadCtx<'_>,
    agent: Option<u32>,
    buf: MadSendBuf,
    pd: Pd,
) -> Result<MadSendId> {
    let port = cx.mp.port;
    let wc = build_smp_wc(0, buf.mad.dr_slid(), buf.pkey_index, port);
    let mut out = Mad::default();
    let ret = cx
        .dev
        .ops
        .process_mad(0, port, Some(&wc), None, &buf.mad, &mut out)
        .unwrap_or(MadResult::FAILURE);
    if !ret.contains(MadResult::SUCCESS) {
        return Err(Error::Invalid(
            "the local SMA refused the directed-route SMP",
        ));
    }
    cx.mp.counters.local_smps += 1;
    // A send record without an AH on the wire: the AH is created so that
    // completion is uniform.
    let ah = cx.dev.create_ah(pd, &buf.ah_attr)?;
    let expects = buf.timeout_ms > 0;
    let mut b = buf;
    b.retries = 0;
    let req = b.mad.clone();
    let idx = alloc_send(cx.mp, agent, 0, b, ah);
    let id = cx.mp.send_id(idx);
    let mut answered = false;
    if ret.contains(MadResult::REPLY) {
        if response_mad(&out)
            && let Some(a) = agent
        {
            answered = expects;
            cx.mp.deliver(
                cx.cfg,
                a,
                MadEvent::Recv(Box::new(MadRecvWc {
                    wc,
                    grh: None,
                    mad: out,
                    port,
                    send_id: expects.then_some(id),
                    rmpp_data: None,
                })),
            );
        }
    } else if !ret.contains(MadResult::CONSUMED) {
        // Treat like an incoming request: to whichever agent takes it. (Linux
        // looks up and delivers the driver's untouched output buffer with the
        // request's TID here; the request itself is what an agent can use.)
        if let Some(a) = cx.mp.find_request_agent(&req, 0) {
            cx.mp.deliver(
                cx.cfg,
                a,
                MadEvent::Recv(Box::new(MadRecvWc {
                    wc,
                    grh: None,
                    mad: req,
                    port,
                    send_id: None,
                    rmpp_data: None,
                })),
            );
        }
    }
    if expects && !answered {
        let ms = cx
            .mp
            .sends
            .get(idx as usize)
            .and_then(|x| x.as_ref())
            .map_or(0, |s| s.buf.timeout_ms);
        let deadline = cx.clock.now_ns().saturating_add(u64::from(ms) * 1_000_000);
        cx.mp.wait_resp(idx, deadline);
    } else {
        complete_send(cx, idx, WcStatus::Success, 0);
    }
    Ok(id)
}

/// The receive half: `ib_mad_recv_done_handler` for one good or bad
/// completion on slot `slot` of QP `qpi`.
fn recv_done(cx: &mut MadCtx<'_>, qpi: usize, slot: usize, wc: &Wc) {
    let mut raw = [0u8; MAD_RECV_BUF];
    let Some(mq) = cx.mp.qps[qpi].as_ref() else {
        return;
    };
    let Some((page, off)) = mq.recv_addr(slot) else {
        cx.mp.counters.recv_errors += 1;
        return;
    };
    page.read_bytes(off, &mut raw);
    if wc.status == WcStatus::WrFlushErr {
        // The QP is in error and flushing: posting the buffer again would
        // only have it flushed again, forever. The port is closed or
        // restarted by its owner (Linux leaves the buffer too).
        cx.mp.counters.recv_flushed += 1;
        return;
    }
    if post_recv_slot(cx.dev, cx.mp, qpi, slot).is_err() {
        cx.mp.counters.repost_failures += 1;
    }
    if wc.status != WcStatus::Success {
        cx.mp.counters.recv_errors += 1;
        return;
    }
    if (wc.byte_len as usize) < MAD_RECV_BUF {
        cx.mp.counters.drop_short += 1;
        return;
    }
    let grh = wc.wc_flags.contains(WcFlags::GRH).then(|| {
        let mut g = [0u8; IB_GRH_BYTES];
        g.copy_from_slice(&raw[..IB_GRH_BYTES]);
        Grh(g)
    });
    let mut mad = Mad::from_bytes(&raw[IB_GRH_BYTES..]);
    cx.mp.counters.recv += 1;
    recv_one(cx, qpi, wc, grh, &mut mad);
}

fn recv_one(cx: &mut MadCtx<'_>, qpi: usize, wc: &Wc, grh: Option<Grh>, mad: &mut Mad) {
    let port = cx.mp.port;
    // validate_mad
    if mad.base_version() != IB_MGMT_BASE_VERSION {
        cx.mp.counters.drop_bad_version += 1;
        return;
    }
    let smi_class = matches!(
        mad.mgmt_class(),
        class::SUBN_LID_ROUTED | class::SUBN_DIRECTED_ROUTE
    );
    if smi_class != (qpi == 0) {
        cx.mp.counters.drop_wrong_qp += 1;
        return;
    }
    if mad.mgmt_class() == class::SUBN_DIRECTED_ROUTE
        && handle_ib_smi(cx.dev.node_type(), cx.dev.phys_port_cnt(), port, mad)
            == SmiAction::Discard
    {
        cx.mp.counters.drop_smi += 1;
        return;
    }
    // A trap of the HCA's own SMA (received with SLID 0): mlx4_ib's
    // process_mad consumes it and forwards it to the SM (`forward_trap`).
    if qpi == 0 && mad.method() == method::TRAP && wc.slid == 0 {
        cx.mp.counters.consumed += 1;
        crate::agent::forward_trap(cx, mad);
        return;
    }
    // The driver's first refusal.
    let mut out = Mad::default();
    let ret = match cx
        .dev
        .ops
        .process_mad(0, port, Some(wc), grh.as_ref(), mad, &mut out)
    {
        Ok(r) => r,
        Err(Error::NoSys) => MadResult::SUCCESS,
        Err(e) => {
            log::debug!("{}: port {port}: process_mad: {e}", cx.dev.name());
            MadResult::FAILURE
        }
    };
    if ret.contains(MadResult::SUCCESS) {
        if ret.contains(MadResult::CONSUMED) {
            cx.mp.counters.consumed += 1;
            return;
        }
        if ret.contains(MadResult::REPLY) {
            cx.mp.counters.process_mad_replies += 1;
            crate::agent::agent_send_response(cx, &out, grh.as_ref(), wc, qpi);
            return;
        }
    }
    if response_mad(mad) {
        let Some((agent, send)) = cx.mp.find_response_send(mad) else {
            cx.mp.counters.drop_unmatched_response += 1;
            return;
        };
        let id = cx.mp.send_id(send);
        let mut rw = Box::new(MadRecvWc {
            wc: *wc,
            grh,
            mad: mad.clone(),
            port,
            send_id: Some(id),
            rmpp_data: None,
        });
        if cx.mp.agent_rmpp(agent) {
            use crate::mad_rmpp::{RmppResult, process_rmpp_recv};
            match process_rmpp_recv(cx, agent, wc, grh, mad, Some(id)) {
                RmppResult::NotRmpp => {}
                RmppResult::Complete(full) => rw = full,
                RmppResult::Consumed => {
                    // A transfer in progress keeps its request alive.
                    let ms = cx
                        .mp
                        .sends
                        .get(send as usize)
                        .and_then(|x| x.as_ref())
                        .and_then(|s| match s.state {
                            SendState::WaitResp(_) => Some(s.buf.timeout_ms),
                            _ => None,
                        });
                    if let Some(ms) = ms {
                        let d = cx.clock.now_ns().saturating_add(u64::from(ms) * 1_000_000);
                        cx.mp.wait_resp(send, d);
                    }
                    return;
                }
                RmppResult::Aborted => {
                    complete_send(cx, send, WcStatus::RemAbortErr, 0);
                    return;
                }
            }
        }
        cx.mp.deliver(cx.cfg, agent, MadEvent::Recv(rw));
        let state = cx
            .mp
            .sends
            .get(send as usize)
            .and_then(|x| x.as_ref())
            .map(|s| s.state);
        if let Some(SendState::WaitResp(_)) = state {
            complete_send(cx, send, WcStatus::Success, 0);
        } else if let Some(s) = cx.mp.sends.get_mut(send as usize).and_then(|x| x.as_mut()) {
            // The response beat the send completion.
            s.got_response = true;
        }
        return;
    }
    if let Some(agent) = cx.mp.find_request_agent(mad, qpi) {
        let mut rw = Box::new(MadRecvWc {
            wc: *wc,
            grh,
            mad: mad.clone(),
            port,
            send_id: None,
            rmpp_data: None,
        });
        if cx.mp.agent_rmpp(agent) {
            use crate::mad_rmpp::{RmppResult, process_rmpp_recv};
            match process_rmpp_recv(cx, agent, wc, grh, mad, None) {
                RmppResult::NotRmpp => {}
                RmppResult::Complete(full) => rw = full,
                RmppResult::Consumed | RmppResult::Aborted => return,
            }
        }
        cx.mp.deliver(cx.cfg, agent, MadEvent::Recv(rw));
        return;
    }
    // generate_unmatched_resp: a Get or Set nobody takes is answered.
    if ret.contains(MadResult::SUCCESS) && matches!(mad.method(), method::GET | method::SET) {
        let mut resp = mad.clone();
        resp.set_method(method::GET_RESP);
        let mut st = status::UNSUPPORTED_METHOD_ATTRIB;
        if mad.mgmt_class() == class::SUBN_DIRECTED_ROUTE {
            st |= status::IB_SMP_DIRECTION;
        }
        resp.set_status(st);
        cx.mp.counters.unsupported_replies += 1;
        crate::agent::agent_send_response(cx, &resp, grh.as_ref(), wc, qpi);
        return;
    }
    cx.mp.counters.drop_no_agent += 1;
}

/// `handle_ib_smi` (the DR part of the receive path, for a CA).
fn handle_ib_smi(node_type: NodeType, phys_port_cnt: u8, port: u8, smp: &mut Mad) -> SmiAction {
    if smi_handle_dr_smp_recv(smp, node_type, port, phys_port_cnt) == SmiAction::Discard {
        return SmiAction::Discard;
    }
    match smi_check_forward_dr_smp(smp) {
        SmiForwardAction::Local => SmiAction::Handle,
        SmiForwardAction::Send => {
            if smi_handle_dr_smp_send(smp, node_type, port) == SmiAction::Discard {
                return SmiAction::Discard;
            }
            smi_check_local_smp(smp, true)
        }
        // Forwarding is a switch's job, and this port is no switch.
        SmiForwardAction::Forward => SmiAction::Discard,
    }
}

/// A send completion (`ib_mad_send_done_handler`).
fn send_done(cx: &mut MadCtx<'_>, qpi: usize, slot: usize, wc: &Wc) {
    let Some(mq) = cx.mp.qps[qpi].as_mut() else {
        return;
    };
    let Some(Some(idx)) = mq.send_slot.get(slot).copied() else {
        // A completion for a slot we do not have in flight: the device's
        // mistake; count it and go on.
        cx.mp.counters.send_errors += 1;
        return;
    };
    mq.send_slot[slot] = None;
    mq.free_slots.push(slot as u32);
    if let Some(s) = cx.mp.sends.get_mut(idx as usize).and_then(|x| x.as_mut()) {
        s.state = SendState::Queued;
    }
    let (canceled, timeout_ms, got) = match cx.mp.sends.get(idx as usize).and_then(|x| x.as_ref()) {
        Some(s) => (s.canceled, s.buf.timeout_ms, s.got_response),
        None => return,
    };
    if wc.status == WcStatus::WrFlushErr
        && cx
            .mp
            .sends
            .get(idx as usize)
            .and_then(|x| x.as_ref())
            .is_some_and(|s| s.retry_on_flush && !s.canceled)
    {
        // Flushed by the SQE of another send: post it again.
        if let Some(s) = cx.mp.sends.get_mut(idx as usize).and_then(|x| x.as_mut()) {
            s.retry_on_flush = false;
        }
        cx.mp.counters.retries += 1;
        if post_one(cx, idx).is_err() {
            cx.mp.counters.send_errors += 1;
            complete_send(cx, idx, wc.status, wc.vendor_err);
        }
    } else if wc.status != WcStatus::Success {
        cx.mp.counters.send_errors += 1;
        if wc.status != WcStatus::WrFlushErr {
            mad_error_recover(cx, qpi);
        }
        complete_send(cx, idx, wc.status, wc.vendor_err);
    } else {
        cx.mp.counters.sent += 1;
        if canceled {
            complete_send(cx, idx, WcStatus::WrFlushErr, 0);
        } else if timeout_ms == 0 || got {
            complete_send(cx, idx, WcStatus::Success, 0);
        } else {
            let deadline = cx
                .clock
                .now_ns()
                .saturating_add(u64::from(timeout_ms) * 1_000_000);
            cx.mp.wait_resp(idx, deadline);
        }
    }
    drain_overflow(cx, qpi);
}

/// `mad_error_handler` for a send error: the error put the QP in SQE, so
/// bring it back to RTS and mark the sends still in flight to be posted
/// again when they come back flushed.
fn mad_error_recover(cx: &mut MadCtx<'_>, qpi: usize) {
    let Some(qp) = cx.mp.qps[qpi].as_ref().map(|q| q.qp) else {
        return;
    };
    let attr = QpAttr {
        qp_state: QpState::Rts,
        cur_qp_state: QpState::Sqe,
        ..QpAttr::default()
    };
    match cx
        .dev
        .modify_qp(qp, &attr, QpAttrMask::STATE | QpAttrMask::CUR_STATE)
    {
        Ok(()) => {
            for s in cx.mp.sends.iter_mut().flatten() {
                if s.qpi == qpi && matches!(s.state, SendState::OnWire(_)) {
                    s.retry_on_flush = true;
                }
            }
        }
        Err(e) => log::error!(
            "{}: port {}: mad_error_handler - ib_modify_qp to RTS: {e}",
            cx.dev.name(),
            cx.mp.port
        ),
    }
}

/// `timeout_sends`: retries or fails the requests whose response is late.
fn timeout_sends(cx: &mut MadCtx<'_>) -> usize {
    let now = cx.clock.now_ns();
    if now < cx.mp.next_deadline {
        return 0;
    }
    let mut work = 0;
    let mut next = u64::MAX;
    for idx in 0..cx.mp.sends.len() as u32 {
        let Some(s) = cx.mp.sends.get_mut(idx as usize).and_then(|x| x.as_mut()) else {
            continue;
        };
        let SendState::WaitResp(deadline) = s.state else {
            continue;
        };
        if now < deadline {
            next = next.min(deadline);
            continue;
        }
        work += 1;
        if s.retries_left > 0 && !s.canceled {
            s.retries_left -= 1;
            cx.mp.counters.retries += 1;
            match post_one(cx, idx) {
                Ok(_) => {}
                Err(_) => complete_send(cx, idx, WcStatus::GeneralErr, 0),
            }
        } else {
            cx.mp.counters.timeouts += 1;
            complete_send(cx, idx, WcStatus::RespTimeoutErr, 0);
        }
    }
    cx.mp.next_deadline = next;
    work
}

/// The MAD completion handler and timeout work of every port of a device;
/// returns the completions and timeouts handled.
pub(crate) fn poll_device(dev: &mut Device, clock: &dyn Clock, cfg: &MadConfig) -> usize {
    let mut work = 0;
    for pi in 0..dev.mad.len() {
        let Some(mut mp) = dev.mad[pi].take() else {
            continue;
        };
        work += poll_port(&mut MadCtx {
            dev,
            mp: &mut mp,
            clock,
            cfg,
        });
        dev.mad[pi] = Some(mp);
    }
    work
}

fn poll_port(cx: &mut MadCtx<'_>) -> usize {
    let Some(cq) = cx.mp.cq else {
        return 0;
    };
    let mut work = 0;
    let mut wcs = [Wc::default(); 16];
    while work < cx.cfg.poll_budget {
        let n = match cx.dev.poll_cq(cq, &mut wcs) {
            Ok(n) => n.min(wcs.len()),
            Err(e) => {
                if cx.dev.poll_errors == 0 {
                    log::warn!(
                        "{}: port {}: polling the MAD CQ: {e}",
                        cx.dev.name(),
                        cx.mp.port
                    );
                }
                cx.dev.poll_errors += 1;
                break;
            }
        };
        for wc in &wcs[..n] {
            let send = wc.wr_id & WRID_SEND != 0;
            let qpi = ((wc.wr_id >> 32) & 1) as usize;
            let slot = (wc.wr_id & 0xffff_ffff) as usize;
            if send {
                send_done(cx, qpi, slot, wc);
            } else {
                recv_done(cx, qpi, slot, wc);
            }
        }
        work += n;
        if n < wcs.len() {
            break;
        }
    }
    let rmpp = if cx.mp.rmpp_recvs.is_empty() {
        0
    } else {
        crate::mad_rmpp::rmpp_timeouts(cx.mp, cx.clock.now_ns())
    };
    work + timeout_sends(cx) + rmpp
}

// ---------------------------------------------------------------------------
// The agent API on IbCore

impl IbCore {
    fn mad_port(&mut self, dev: DeviceId, port: u8) -> Result<(&mut Device, MadPort)> {
        let d = self.dev(dev)?;
        if port == 0 || port > d.phys_port_cnt() {
            return Err(Error::Invalid("port number out of range"));
        }
        let mp = d.mad[usize::from(port - 1)].take().ok_or(Error::NoDev)?;
        Ok((d, mp))
    }

    fn with_mad_port<T>(
        &mut self,
        dev: DeviceId,
        port: u8,
        f: impl FnOnce(&mut MadCtx<'_>) -> Result<T>,
    ) -> Result<T> {
        let clock = self.clock.clone();
        let cfg = self.mad_config;
        let (d, mut mp) = self.mad_port(dev, port)?;
        let r = f(&mut MadCtx {
            dev: d,
            mp: &mut mp,
            clock: &*clock,
            cfg: &cfg,
        });
        d.mad[usize::from(port - 1)] = Some(mp);
        r
    }

    /// `ib_register_mad_agent`: an agent on QP0 (`IB_QPT_SMI`) or QP1
    /// (`IB_QPT_GSI`) of a port. With `reg_req` it receives unsolicited MADs
    /// of that class, version and methods (a method already taken by another
    /// agent is refused, as are class 0, classes beyond the table, SM classes
    /// on QP1 and other classes on QP0, a vendor class of range 2 without
    /// its OUI ([`MadRegReq::with_oui`]; its MADs are then matched on the
    /// OUI at byte 37, as Linux's vendor-class tables do), and any RMPP
    /// version); without, it only sends and gets responses.
    #[doc(alias = "ib_register_mad_agent")]
    pub fn register_mad_agent(
        &mut self,
        dev: DeviceId,
        port: u8,
        qp_type: QpType,
        reg_req: Option<MadRegReq>,
        rmpp_version: u8,
    ) -> Result<MadAgent> {
        let qpi = qp_index(qp_type).ok_or(Error::Invalid("MAD agents live on QP0 or QP1"))?;
        if rmpp_version > crate::mad_rmpp::IB_MGMT_RMPP_VERSION {
            return Err(Error::NotSupported);
        }
        if rmpp_version != 0 && qpi == 0 {
            return Err(Error::Invalid("RMPP is for GSI classes"));
        }
        if let Some(r) = &reg_req {
            if r.mgmt_class_version >= MAX_MGMT_VERSION {
                return Err(Error::Invalid("class version out of range"));
            }
            if r.mgmt_class == 0 {
                return Err(Error::Invalid("management class 0 is reserved"));
            }
            if r.mgmt_class >= MAX_MGMT_CLASS && r.mgmt_class != class::SUBN_DIRECTED_ROUTE {
                return Err(Error::Invalid("management class out of range"));
            }
            let range2 =
                (class::VENDOR_RANGE2_START..=class::VENDOR_RANGE2_END).contains(&r.mgmt_class);
            if range2 && r.oui == [0; 3] {
                // Linux: a vendor class of range 2 needs its OUI.
                return Err(Error::Invalid("vendor class of range 2 without an OUI"));
            }
            if !range2 && r.oui != [0; 3] {
                return Err(Error::Invalid("an OUI is for vendor classes of range 2"));
            }
            let smi = matches!(
                r.mgmt_class,
                class::SUBN_LID_ROUTED | class::SUBN_DIRECTED_ROUTE
            );
            if smi != (qpi == 0) {
                return Err(Error::Invalid("SM classes register on QP0, others on QP1"));
            }
            if rmpp_version != 0 && !crate::mad_rmpp::is_mad_class_rmpp(r.mgmt_class) {
                return Err(Error::Invalid("RMPP on a class that does not use it"));
            }
        }
        self.next_hi_tid = self.next_hi_tid.wrapping_add(1).max(1);
        let hi_tid = self.next_hi_tid;
        self.with_mad_port(dev, port, |cx| {
            if cx.mp.qps[qpi].is_none() {
                return Err(Error::Invalid("this port has no such special QP"));
            }
            if let Some(r) = &reg_req {
                for a in cx.mp.agents.iter().flatten() {
                    if let Some(o) = &a.reg
                        && o.mgmt_class == r.mgmt_class
                        && o.mgmt_class_version == r.mgmt_class_version
                        && o.oui == r.oui
                        && (o.method_mask[0] & r.method_mask[0] != 0
                            || o.method_mask[1] & r.method_mask[1] != 0)
                    {
                        return Err(Error::Conflict("method already in use"));
                    }
                }
            }
            let a = AgentPriv {
                qp_type,
                rmpp_version,
                reg: reg_req,
                hi_tid,
                next_tid: 0,
                mailbox: VecDeque::new(),
            };
            let idx = match cx.mp.agents.iter().position(|a| a.is_none()) {
                Some(i) => {
                    cx.mp.agents[i] = Some(a);
                    i
                }
                None => {
                    cx.mp.agents.push(Some(a));
                    cx.mp.agents.len() - 1
                }
            };
            Ok(MadAgent {
                dev,
                port,
                idx: idx as u32,
                hi_tid,
            })
        })
    }

    /// `ib_unregister_mad_agent`: cancels its sends (no completions are
    /// reported any more) and drops its mailbox.
    #[doc(alias = "ib_unregister_mad_agent")]
    pub fn unregister_mad_agent(&mut self, agent: MadAgent) -> Result<()> {
        self.with_mad_port(agent.dev, agent.port, |cx| {
            cx.mp.agent(agent.idx)?;
            if cx.mp.agents[agent.idx as usize].as_ref().map(|a| a.hi_tid) != Some(agent.hi_tid) {
                return Err(Error::NotFound);
            }
            for idx in 0..cx.mp.sends.len() as u32 {
                let Some(s) = cx.mp.sends.get_mut(idx as usize).and_then(|x| x.as_mut()) else {
                    continue;
                };
                if s.agent != Some(agent.idx) {
                    continue;
                }
                s.agent = None;
                if matches!(s.state, SendState::OnWire(_)) {
                    // Finished silently when the send completes.
                    s.canceled = true;
                    s.buf.timeout_ms = 0;
                } else {
                    complete_send(cx, idx, WcStatus::WrFlushErr, 0);
                }
            }
            cx.mp.agents[agent.idx as usize] = None;
            crate::mad_rmpp::rmpp_forget_agent(cx.mp, agent.idx);
            Ok(())
        })
    }

    fn check_agent(mp: &mut MadPort, agent: &MadAgent) -> Result<()> {
        let a = mp.agent(agent.idx)?;
        if a.hi_tid != agent.hi_tid {
            return Err(Error::NotFound);
        }
        Ok(())
    }

    /// `ib_post_send_mad`: sends one MAD from an agent. A DR SMP goes
    /// through the SMI send rules (refused with `-EINVAL` if they drop it)
    /// and one for this port's own SMA is answered by `process_mad` without
    /// the wire. The completion (and any response) arrives in the agent's
    /// mailbox ([`IbCore::mad_poll_agent`]).
    #[doc(alias = "ib_post_send_mad")]
    pub fn post_send_mad(&mut self, agent: MadAgent, buf: MadSendBuf) -> Result<MadSendId> {
        self.with_mad_port(agent.dev, agent.port, |cx| {
            Self::check_agent(cx.mp, &agent)?;
            let qpi = qp_index(cx.mp.agent(agent.idx)?.qp_type).ok_or(Error::NoDev)?;
            send_mad(cx, Some(agent.idx), qpi, buf)
        })
    }

    /// `ib_cancel_mad`: the send completes with `IB_WC_WR_FLUSH_ERR` (at
    /// once, or when the device finishes with it).
    #[doc(alias = "ib_cancel_mad")]
    pub fn cancel_mad(&mut self, agent: MadAgent, id: MadSendId) -> Result<()> {
        self.with_mad_port(agent.dev, agent.port, |cx| {
            Self::check_agent(cx.mp, &agent)?;
            let idx = cx.mp.lookup_send(id).ok_or(Error::NotFound)?;
            let Some(s) = cx.mp.sends.get_mut(idx as usize).and_then(|x| x.as_mut()) else {
                return Err(Error::NotFound);
            };
            if s.agent != Some(agent.idx) {
                return Err(Error::NotFound);
            }
            if matches!(s.state, SendState::OnWire(_)) {
                s.canceled = true;
            } else {
                complete_send(cx, idx, WcStatus::WrFlushErr, 0);
            }
            Ok(())
        })
    }

    /// `ib_modify_mad`: gives an outstanding request a new response timeout
    /// counted from now (what CM does on an MRA); 0 cancels it.
    #[doc(alias = "ib_modify_mad")]
    pub fn modify_mad(&mut self, agent: MadAgent, id: MadSendId, timeout_ms: u32) -> Result<()> {
        if timeout_ms == 0 {
            return self.cancel_mad(agent, id);
        }
        self.with_mad_port(agent.dev, agent.port, |cx| {
            Self::check_agent(cx.mp, &agent)?;
            let idx = cx.mp.lookup_send(id).ok_or(Error::NotFound)?;
            let Some(s) = cx.mp.sends.get_mut(idx as usize).and_then(|x| x.as_mut()) else {
                return Err(Error::NotFound);
            };
            if s.agent != Some(agent.idx) || s.canceled {
                return Err(Error::NotFound);
            }
            s.buf.timeout_ms = timeout_ms;
            if let SendState::WaitResp(_) = s.state {
                let deadline = cx
                    .clock
                    .now_ns()
                    .saturating_add(u64::from(timeout_ms) * 1_000_000);
                cx.mp.wait_resp(idx, deadline);
            }
            Ok(())
        })
    }

    /// The next event of an agent's mailbox, oldest first (does not poll).
    pub fn mad_poll_agent(&mut self, agent: MadAgent) -> Option<MadEvent> {
        self.with_mad_port(agent.dev, agent.port, |cx| {
            Self::check_agent(cx.mp, &agent)?;
            Ok(cx.mp.agent(agent.idx)?.mailbox.pop_front())
        })
        .ok()
        .flatten()
    }

    fn take_send_events(
        &mut self,
        agent: MadAgent,
        id: MadSendId,
        resp: &mut Option<Box<MadRecvWc>>,
    ) -> Option<MadSendWc> {
        self.with_mad_port(agent.dev, agent.port, |cx| {
            let a = cx.mp.agent(agent.idx)?;
            let mut done = None;
            a.mailbox.retain(|ev| match ev {
                MadEvent::Recv(r) if r.send_id == Some(id) && resp.is_none() => {
                    *resp = Some(r.clone());
                    false
                }
                MadEvent::SendDone(s) if s.id == id && done.is_none() => {
                    done = Some(*s);
                    false
                }
                _ => true,
            });
            Ok(done)
        })
        .ok()
        .flatten()
    }

    /// Sends one MAD and polls until its send completes (after the
    /// response, the last retry's timeout, or an error), at most `timeout`.
    /// Returns the send completion and the response, if one came; other
    /// events stay in the mailbox.
    pub fn send_mad_wait(
        &mut self,
        agent: MadAgent,
        buf: MadSendBuf,
        timeout: Duration,
    ) -> Result<(MadSendWc, Option<Box<MadRecvWc>>)> {
        let id = self.post_send_mad(agent, buf)?;
        let mut resp = None;
        let r = self.poll_until(timeout, |core| core.take_send_events(agent, id, &mut resp));
        match r {
            Ok(done) => Ok((done, resp)),
            Err(e) => {
                let _ = self.cancel_mad(agent, id);
                Err(e)
            }
        }
    }

    /// What the MAD layer of a port counted.
    pub fn mad_counters(&self, dev: DeviceId, port: u8) -> Option<MadCounters> {
        let d = self.device(dev)?;
        let i = usize::from(port.checked_sub(1)?);
        d.mad.get(i)?.as_ref().map(|mp| mp.counters)
    }

    /// Whether the MAD layer of a port is open (QP1 up, and QP0 on IB).
    pub fn mad_port_open(&self, dev: DeviceId, port: u8) -> bool {
        self.mad_counters(dev, port).is_some()
    }

    /// The provider's QP0/QP1 of a port (for tests and diagnostics).
    pub fn mad_qp(&self, dev: DeviceId, port: u8, qp_type: QpType) -> Option<Qp> {
        let d = self.device(dev)?;
        let mp = d.mad.get(usize::from(port.checked_sub(1)?))?.as_ref()?;
        Some(mp.qps[qp_index(qp_type)?].as_ref()?.qp)
    }
}

/// Where an SMP goes (`smpquery`'s `-D` or a LID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmpRoute<'a> {
    /// LID routed (class 0x01) to this LID.
    Lid(u16),
    /// Directed route (class 0x81) through these ports (empty: this port).
    Directed(&'a [u8]),
}

impl IbCore {
    /// A blocking SubnGet (what `smpquery` does): sends a Get of `attr_id`
    /// with `attr_mod` along `route` from `port`, waits at most `timeout`
    /// (one try of `timeout / 4`, three retries) and returns the GetResp. A
    /// response with a non-zero status (direction bit aside) is
    /// [`Error::MadStatus`].
    pub fn smp_query(
        &mut self,
        dev: DeviceId,
        port: u8,
        route: SmpRoute<'_>,
        attr_id: u16,
        attr_mod: u32,
        timeout: Duration,
    ) -> Result<Mad> {
        let (mut mad, dlid) = match route {
            SmpRoute::Lid(lid) => (
                Mad::new_request(class::SUBN_LID_ROUTED, 1, method::GET, attr_id, attr_mod),
                lid,
            ),
            SmpRoute::Directed(path) => {
                if path.len() >= usize::from(IB_SMP_MAX_PATH_HOPS) {
                    return Err(Error::Invalid("directed route longer than 63 hops"));
                }
                let mut m = Mad::new_request(
                    class::SUBN_DIRECTED_ROUTE,
                    1,
                    method::GET,
                    attr_id,
                    attr_mod,
                );
                m.set_hop_cnt(path.len() as u8);
                for (i, &p) in path.iter().enumerate() {
                    m.set_initial_path(i as u8 + 1, p);
                }
                m.set_dr_slid(crate::verbs::IB_LID_PERMISSIVE);
                m.set_dr_dlid(crate::verbs::IB_LID_PERMISSIVE);
                (m, crate::verbs::IB_LID_PERMISSIVE)
            }
        };
        mad.set_tid(0);
        self.blocking_get(dev, port, QpType::Smi, mad, dlid, timeout)
    }

    /// A blocking PerfMgmt Get (what `perfquery` does) to the PMA at `dlid`
    /// (QP1, Q_Key 0x80010000); returns the GetResp.
    #[allow(clippy::too_many_arguments)]
    pub fn pma_query(
        &mut self,
        dev: DeviceId,
        port: u8,
        dlid: u16,
        attr_id: u16,
        attr_mod: u32,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Mad> {
        let mut mad = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr_id, attr_mod);
        let n = data.len().min(IB_MGMT_MAD_SIZE - 64);
        mad.0[64..64 + n].copy_from_slice(&data[..n]);
        self.blocking_get(dev, port, QpType::Gsi, mad, dlid, timeout)
    }

    /// Sends `mad` from the QP0 (`Smi`) or QP1 (`Gsi`) of `port` to the
    /// same QP at `dlid` and waits for the GetResp.
    fn blocking_get(
        &mut self,
        dev: DeviceId,
        port: u8,
        qp_type: QpType,
        mad: Mad,
        dlid: u16,
        timeout: Duration,
    ) -> Result<Mad> {
        let remote_qpn = if qp_type == QpType::Smi { 0 } else { 1 };
        let agent = self.register_mad_agent(dev, port, qp_type, None, 0)?;
        let try_ms = u32::try_from((timeout / 4).as_millis())
            .unwrap_or(u32::MAX)
            .max(1);
        let mut buf = MadSendBuf::new(
            mad,
            AhAttr {
                dlid,
                port_num: port,
                ..AhAttr::default()
            },
            remote_qpn,
        );
        buf.timeout_ms = try_ms;
        buf.retries = 3;
        let r = self.send_mad_wait(
            agent,
            buf,
            timeout + Duration::from_millis(u64::from(try_ms)),
        );
        let _ = self.unregister_mad_agent(agent);
        let (done, resp) = r?;
        match (done.status, resp) {
            (WcStatus::Success, Some(resp)) => {
                let st = resp.mad.status() & !status::IB_SMP_DIRECTION;
                if st != 0 {
                    return Err(Error::MadStatus(st));
                }
                Ok(resp.mad)
            }
            (WcStatus::RespTimeoutErr, _) | (WcStatus::Success, None) => Err(Error::TimedOut),
            (_, _) => Err(Error::Errno(crate::error::errno::EIO)),
        }
    }
}

/// Used by agent.c's responder.
pub(crate) fn send_response(cx: &mut MadCtx<'_>, qpi: usize, buf: MadSendBuf) -> Result<MadSendId> {
    send_mad(cx, None, qpi, buf)
}
