//! The HCA's data-path engines.
//!
//! Send and receive queues, SRQs, CQs, the RC/UC/UD transports and the MLX
//! transport of QP0/QP1, UD multicast ([`mcast`]), run against host memory
//! through the QP context's MTT translation and the dMPT's protection; what is
//! not modelled is listed in each submodule's first line (no BlueFlame, LSO
//! but a raw Ethernet QP's, fast registration, XRC, RD, APM, CQ moderation).
//!
//! # How work moves
//!
//! * A send doorbell (UAR + 0x14, `qpn << 8`) runs the QP's send queue: the
//!   WQE at the engine's next-to-start counter is executed while its owner
//!   bit equals the pass parity of that counter (porting map 6.3), at most
//!   one ring's worth per doorbell. The WQE is read through the QP's MTT
//!   translation only. An RC QP on a fabric keeps many messages in flight
//!   ([`wire::Window`]: cumulative ACKs, go-back-N, completions in order).
//! * A message to a QP of the same HCA (destination LID = the port's LID,
//!   or forced loopback) is executed at once against the responder QP
//!   ([`exec`]): RNR and transport retries wait on the model clock
//!   (the fake clock in synchronous mode), and [`step`] fires them.
//! * Receive queues are consumed on arrival: the RQ doorbell record holds
//!   the driver's producer counter, the engine keeps its own consumer
//!   counter; SRQ WQEs are taken along the free list's `next` indices.
//! * Completions go through [`cq::push`]; a QP that enters the error state
//!   flushes every outstanding WQE with WR_FLUSH_ERR, on the SQ at once
//!   and on the RQ as the driver posts them.

pub mod cq;
pub mod eth;
pub mod exec;
pub mod mcast;
pub mod mw;
pub mod wire;
pub mod wqe;
pub mod xlate;

use std::collections::BTreeMap;

use crate::hca::ctx::{MptEntry, QpCtx, qpc, st};
use crate::hca::device::{Hca, QpState};
use crate::hca::hcr::Opcode;
use crate::hca::icm::Table;
use crate::hca::layout::{get8, get16, get32};

/// What a QP's send queue waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitKind {
    /// RNR NAK: retry after the responder's RNR timer.
    Rnr,
    /// No response: local ACK timeout.
    Ack,
}

/// A send queue stopped until a time on the model clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// When to retry (model-clock nanoseconds).
    pub until_ns: u64,
    /// Why.
    pub kind: WaitKind,
}

/// A QP as the engine runs it (rebuilt from the QP context in ICM on every
/// state transition; the counters survive until RESET).
#[derive(Debug, Clone, Default)]
pub struct QpEng {
    /// QPN.
    pub qpn: u32,
    /// Service type.
    pub st: u8,
    /// PD.
    pub pd: u32,
    /// Port (1-based; 0 before INIT2RTR).
    pub port: u8,
    /// QP buffer pages.
    pub pages: std::sync::Arc<[u64]>,
    /// QP buffer page shift.
    pub page_shift: u32,
    /// SQ offset in the buffer, WQEs, log stride.
    pub sq_off: u64,
    /// SQ WQEs (power of two).
    pub sq_cnt: u32,
    /// log2 SQ stride.
    pub sq_shift: u32,
    /// RQ offset in the buffer.
    pub rq_off: u64,
    /// RQ WQEs (0: no RQ, or an SRQ).
    pub rq_cnt: u32,
    /// log2 RQ stride.
    pub rq_shift: u32,
    /// RQ doorbell record.
    pub db_rec: u64,
    /// SRQ.
    pub srq: Option<u32>,
    /// Send CQ.
    pub scq: u32,
    /// Receive CQ.
    pub rcq: u32,
    /// Send WQEs completed (free running; the oldest WQE the hardware
    /// still owns).
    pub sq_ci: u32,
    /// The next send WQE to start (free running; `sq_ci..sq_next` are the
    /// RC messages in flight, see [`wire::Window`]).
    pub sq_next: u32,
    /// Receive WQEs consumed (16-bit counter as the doorbell record).
    pub rq_ci: u16,
    /// Next send PSN.
    pub sq_psn: u32,
    /// Expected receive PSN.
    pub rq_psn: u32,
    /// Destination QPN (RC/UC).
    pub remote_qpn: u32,
    /// Remote LID (RC/UC).
    pub rlid: u16,
    /// SL (RC/UC path).
    pub sl: u8,
    /// Source path bits.
    pub path_bits: u8,
    /// GRH on the path.
    pub grh: bool,
    /// P_Key index.
    pub pkey_index: u8,
    /// Q_Key.
    pub qkey: u32,
    /// Path MTU (IB enum 1..5).
    pub mtu: u8,
    /// log2 max message.
    pub msgmax: u8,
    /// Remote read enabled.
    pub rre: bool,
    /// Remote write enabled.
    pub rwe: bool,
    /// Remote atomic enabled.
    pub rae: bool,
    /// Transport retry count.
    pub retry_cnt: u8,
    /// log2 of the RDMA READ/atomic requests this QP may have outstanding
    /// as a requester (max_rd_atomic; params1 bits 23:21).
    pub sra_max: u8,
    /// log2 of the READ/atomic responder resources (max_dest_rd_atomic;
    /// params2 bits 23:21).
    pub rra_max: u8,
    /// RNR retry count (7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer this QP hands out as a responder.
    pub min_rnr_timer: u8,
    /// Local ACK timeout exponent (0 = infinite).
    pub ack_timeout: u8,
    /// May use the reserved L_Key.
    pub rlkey: bool,
    /// QP0 or QP1 of `port`: `Some(is_qp0)`.
    pub special: Option<bool>,
    /// SQ stopped until then.
    pub wait: Option<Wait>,
    /// Transport retries left (reset when a response makes progress).
    pub retry_left: u8,
    /// RNR retries left (reset when a response makes progress).
    pub rnr_left: u8,
    /// The WQE at `sq_ci` has been tried before (counters armed).
    pub retrying: bool,
    /// Send packets (for the counters).
    pub pkts_sent: u64,
    /// A send doorbell came while the SQ could not run (before RTS, SQD):
    /// the SQ runs when the QP reaches RTS.
    pub db_pending: bool,
    /// The multi-packet message being received.
    pub rx: Option<wire::RxMsg>,
    /// Responder: a PSN sequence error (or RNR) NAK was sent and the
    /// expected PSN has not come since; later requests are dropped
    /// without another NAK (IBTA 9.7.5.2.2).
    pub nak_sent: bool,
    /// The RQ doorbell record claims more WQEs than the RQ holds (the
    /// violation is recorded when this turns true).
    pub rq_overclaim: bool,
    /// Responder resources: the READ and atomic requests executed last
    /// (at most `1 << rra_max`), for duplicates.
    pub rd_res: std::collections::VecDeque<wire::RdRes>,
    /// The primary path's RoCE fields, for a QP on an Ethernet port.
    pub roce: Option<eth::RocePath>,
    /// A raw Ethernet QP's RSS context (QPC flags bit 13).
    pub rss: Option<eth::Rss>,
    /// A raw Ethernet QP: VLAN stripping disabled (QPC param3 bit 30).
    pub vsd: bool,
    /// An MLX QP on an Ethernet port that is not a special QP: a raw
    /// Ethernet QP (mlx4_en's rings).
    pub raw_eth: bool,
}

impl QpEng {
    /// A copy for the send path and local delivery, which read a QP while
    /// they change the HCA: every field but the receive state from the
    /// wire, left empty (`rx`, the message being received, and `rd_res`,
    /// the responder resources kept for duplicates). Those two are read
    /// and changed only by the wire's receive path, through the map or a
    /// full `clone`; without them the copy costs no deque. Every field is
    /// named: a new one must be placed here too.
    pub fn for_send(&self) -> QpEng {
        QpEng {
            qpn: self.qpn,
            st: self.st,
            pd: self.pd,
            port: self.port,
            pages: self.pages.clone(),
            page_shift: self.page_shift,
            sq_off: self.sq_off,
            sq_cnt: self.sq_cnt,
            sq_shift: self.sq_shift,
            rq_off: self.rq_off,
            rq_cnt: self.rq_cnt,
            rq_shift: self.rq_shift,
            db_rec: self.db_rec,
            srq: self.srq,
            scq: self.scq,
            rcq: self.rcq,
            sq_ci: self.sq_ci,
            sq_next: self.sq_next,
            rq_ci: self.rq_ci,
            sq_psn: self.sq_psn,
            rq_psn: self.rq_psn,
            remote_qpn: self.remote_qpn,
            rlid: self.rlid,
            sl: self.sl,
            path_bits: self.path_bits,
            grh: self.grh,
            pkey_index: self.pkey_index,
            qkey: self.qkey,
            mtu: self.mtu,
            msgmax: self.msgmax,
            rre: self.rre,
            rwe: self.rwe,
            rae: self.rae,
            retry_cnt: self.retry_cnt,
            sra_max: self.sra_max,
            rra_max: self.rra_max,
            rnr_retry: self.rnr_retry,
            min_rnr_timer: self.min_rnr_timer,
            ack_timeout: self.ack_timeout,
            rlkey: self.rlkey,
            special: self.special,
            wait: self.wait,
            retry_left: self.retry_left,
            rnr_left: self.rnr_left,
            retrying: self.retrying,
            pkts_sent: self.pkts_sent,
            db_pending: self.db_pending,
            nak_sent: self.nak_sent,
            rq_overclaim: self.rq_overclaim,
            rx: None,
            rd_res: std::collections::VecDeque::new(),
            roce: self.roce,
            rss: self.rss,
            vsd: self.vsd,
            raw_eth: self.raw_eth,
        }
    }
    /// log2 of the path MTU in bytes.
    pub fn mtu_bytes(&self) -> u64 {
        128u64 << self.mtu.clamp(1, 5)
    }
    /// Bus address of byte `off` of the QP buffer.
    pub fn buf_addr(&self, off: u64) -> Option<u64> {
        let p = (off >> self.page_shift) as usize;
        let pa = *self.pages.get(p)?;
        Some(pa + (off & ((1u64 << self.page_shift) - 1)))
    }
    /// Bus address of SQ WQE `i`.
    pub fn sq_wqe(&self, i: u32) -> Option<u64> {
        self.buf_addr(self.sq_off + (u64::from(i & (self.sq_cnt - 1)) << self.sq_shift))
    }
    /// Bus address of RQ WQE `i`.
    pub fn rq_wqe(&self, i: u32) -> Option<u64> {
        if self.rq_cnt == 0 {
            return None;
        }
        self.buf_addr(self.rq_off + (u64::from(i & (self.rq_cnt - 1)) << self.rq_shift))
    }
}

/// An SRQ as the engine runs it.
#[derive(Debug, Clone, Default)]
pub struct SrqEng {
    /// WQEs.
    pub cnt: u32,
    /// log2 stride.
    pub shift: u32,
    /// Buffer pages.
    pub pages: std::sync::Arc<[u64]>,
    /// Page shift.
    pub page_shift: u32,
    /// Doorbell record (BE32 WQE counter).
    pub db_rec: u64,
    /// PD.
    pub pd: u32,
    /// Index of the next WQE to use (the free list's head).
    pub head: u16,
    /// WQEs consumed (16-bit counter).
    pub consumed: u16,
}

/// What the engines have done (for tests and benchmarks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Send WQEs executed (completed, in error or not).
    pub executed: u64,
    /// Send and receive WQEs flushed.
    pub flushed: u64,
    /// Messages delivered to a receive queue.
    pub received: u64,
    /// CQEs written.
    pub cqes: u64,
    /// RC/UC packets dropped because their SLID is not the QP's remote
    /// LID (the card's source check; no PMA counter counts them).
    pub slid_drops: u64,
}

/// All engine state of one HCA.
#[derive(Debug, Default)]
pub struct Engine {
    /// Counters.
    pub stats: Stats,
    /// QPs that have left RESET.
    pub qps: BTreeMap<u32, QpEng>,
    /// CQs in use.
    pub cqs: BTreeMap<u32, cq::CqEng>,
    /// SRQs in use.
    pub srqs: BTreeMap<u32, SrqEng>,
    /// Decoded dMPT entries.
    pub mpts: BTreeMap<u32, MptEntry>,
    /// Memory windows met so far, with their bindings (by dMPT index).
    pub mws: BTreeMap<u32, mw::Window>,
    /// Bounce buffer for copies.
    pub bounce: Vec<u8>,
    /// Scratch of the send side.
    pub tx_scratch: Option<Box<exec::Scratch>>,
    /// Scratch of the receive side.
    pub rx_scratch: Option<Box<exec::Scratch>>,
    /// Number of dMPT entries (0 until first use).
    pub nmpt: u64,
    /// A direct-mapped cache of MTT entries read for MR translation:
    /// (MTT index, page bus address); cleared by every command that can
    /// change MTTs or MPTs (the card's TPT cache is refreshed the same way).
    pub mtt_cache: Vec<(u64, u64)>,
    /// QPs with a timer pending or in the error state (checked by `step`).
    pub watch: Vec<u32>,
    /// The send windows of RC QPs on a fabric (kept apart from [`QpEng`],
    /// which the receive path copies per packet).
    pub windows: BTreeMap<u32, wire::Window>,
    /// Multicast steering counters.
    pub mcast: mcast::McastStats,
}

/// The special-QP role of `qpn`: `Some((port, is_qp0))`.
pub fn special(hca: &Hca, qpn: u32) -> Option<(u8, bool)> {
    let base = hca.special_qp_base;
    if base == 0 || qpn < base || qpn >= base + 4 {
        return None;
    }
    let k = qpn - base;
    Some(((k % 2) as u8 + 1, k < 2))
}

/// Builds (or refreshes) the engine state of `qpn` from its context.
fn load_qp(hca: &mut Hca, qpn: u32, prev: Option<QpEng>, op: Opcode) -> Option<QpEng> {
    let rt = *hca.qps.get(&qpn)?;
    let va = hca.geo().ok()?.va(Table::Qpc, hca.qp_index(qpn));
    let mut b = vec![0u8; qpc::SIZE];
    hca.icm_read(va, &mut b).ok()?;
    let c = QpCtx::decode(&b);
    let port = if rt.port != 0 { rt.port } else { c.port() };
    let eth_port = eth::port_is_eth(hca, port);
    // A raw Ethernet QP (an MLX QP of an Ethernet port that is not a
    // special QP) without an RQ size has no RQ (mlx4_en's send rings and
    // its RSS QP write none).
    let raw_eth = c.st == st::MLX && eth_port && special(hca, qpn).is_none();
    let no_rq = raw_eth && get8(&b, qpc::RQ_SIZE_STRIDE) == 0;
    let rq_cnt = if c.has_srq || no_rq {
        0
    } else {
        1u32 << c.rq_log_size
    };
    let rq_shift = u32::from(c.rq_log_stride) + 4;
    let sq_cnt = 1u32 << c.sq_log_size;
    let sq_shift = u32::from(c.sq_log_stride) + 4;
    let rq_bytes = u64::from(rq_cnt) << rq_shift;
    let sq_bytes = u64::from(sq_cnt) << sq_shift;
    // The queue with the larger stride comes first, the SQ on equal
    // strides (Linux mlx4_ib set_kernel_sq_size and libmlx4: the RQ first
    // only when `rq.wqe_shift > sq.wqe_shift`; mlx4_en's RX ring, stride
    // <= one TXBB, starts its RQ after the one-TXBB SQ).
    let (rq_off, sq_off) = if rq_cnt > 0 && rq_shift > sq_shift {
        (0, rq_bytes)
    } else {
        (sq_bytes, 0)
    };
    let pages = match &prev {
        Some(p) if !p.pages.is_empty() => p.pages.clone(),
        // An RSS QP has no queues (RST2INIT checked it is raw Ethernet).
        _ if c.rss => Vec::new().into(),
        _ => hca
            .mtt_pages(c.mtt_base, c.log_page_size, rq_bytes + sq_bytes)
            .ok()?
            .into(),
    };
    let p = qpc::PRI_PATH;
    let params1 = get32(&b, qpc::PARAMS1);
    let params2 = get32(&b, qpc::PARAMS2);
    let rnr = get32(&b, qpc::RNR_NEXTRECVPSN);
    let sched = get8(&b, p + qpc::PATH_SCHED_QUEUE);
    let mut q = prev.unwrap_or_default();
    q.qpn = qpn;
    q.st = c.st;
    q.pd = c.pd;
    q.port = port;
    q.raw_eth = raw_eth;
    q.roce = (eth_port && !raw_eth).then(|| eth::RocePath::decode(&b, p));
    q.rss = (raw_eth && get32(&b, qpc::FLAGS) & 1 << 13 != 0).then(|| eth::Rss::decode(&b));
    q.vsd = get32(&b, qpc::PARAM3) & 1 << 30 != 0;
    q.pages = pages;
    q.page_shift = 12 + u32::from(c.log_page_size.min(20));
    q.sq_off = sq_off;
    q.sq_cnt = sq_cnt;
    q.sq_shift = sq_shift;
    q.rq_off = rq_off;
    q.rq_cnt = rq_cnt;
    q.rq_shift = rq_shift;
    q.db_rec = c.db_rec_addr;
    q.srq = c.has_srq.then_some(c.srqn);
    q.scq = c.cqn_send;
    q.rcq = c.cqn_recv;
    q.remote_qpn = c.remote_qpn;
    q.rlid = get16(&b, p + qpc::PATH_RLID);
    q.sl = if eth_port {
        (sched >> 3) & 7
    } else {
        (sched >> 2) & 0xf
    };
    q.grh = get8(&b, p + 5) & 0x80 != 0;
    q.path_bits = get8(&b, p + 5) & 0x7f;
    q.pkey_index = c.pkey_index;
    q.qkey = c.qkey;
    q.mtu = c.mtu;
    q.msgmax = c.msgmax;
    q.rre = params2 & 1 << 15 != 0;
    q.rwe = params2 & 1 << 14 != 0;
    q.rae = params2 & 1 << 13 != 0;
    q.retry_cnt = ((params1 >> 16) & 7) as u8;
    q.sra_max = ((params1 >> 21) & 7) as u8;
    q.rra_max = ((params2 >> 21) & 7) as u8;
    q.rnr_retry = ((params1 >> 13) & 7) as u8;
    q.min_rnr_timer = ((rnr >> 24) & 0x1f) as u8;
    q.ack_timeout = get8(&b, p + 8) >> 3;
    q.rlkey = get8(&b, qpc::RLKEY) & 0x10 != 0;
    q.special = special(hca, qpn).map(|(_, qp0)| qp0);
    if op == Opcode::INIT2RTR_QP {
        q.rq_psn = rnr & 0xff_ffff;
    }
    if op == Opcode::RTR2RTS_QP {
        q.sq_psn = get32(&b, qpc::NEXT_SEND_PSN) & 0xff_ffff;
    }
    if matches!(c.st, st::UD | st::MLX) && q.mtu == 0 {
        q.mtu = 5;
    }
    Some(q)
}

/// Hook: QP `qpn` completed transition `op` into `to`.
pub fn qp_modified(hca: &mut Hca, qpn: u32, op: Opcode, to: QpState) {
    if to == QpState::Rst {
        hca.engine.qps.remove(&qpn);
        hca.engine.windows.remove(&qpn);
        hca.engine.watch.retain(|&q| q != qpn);
        return;
    }
    let prev = hca.engine.qps.remove(&qpn);
    match load_qp(hca, qpn, prev, op) {
        Some(mut q) => {
            if to != QpState::Rts {
                q.wait = None;
            }
            hca.engine.qps.insert(qpn, q);
        }
        None => {
            hca.violation(format!(
                "QP {qpn:#x}: the engine cannot read its context or buffer after {op}"
            ));
            return;
        }
    }
    match to {
        QpState::Err => exec::enter_error(hca, qpn, None),
        QpState::Sqd => {}
        QpState::Rts => {
            let pending = hca
                .engine
                .qps
                .get_mut(&qpn)
                .is_some_and(|q| core::mem::take(&mut q.db_pending));
            if pending {
                exec::process_sq(hca, qpn);
            }
        }
        _ => {}
    }
}

/// Hook: RTS2SQD asked for the SQ_DRAINED event. True if the send queue
/// has nothing in flight (the caller posts the event now); otherwise the
/// engines post it when the last message in flight completes.
pub fn sq_drained_or_later(hca: &mut Hca, qpn: u32) -> bool {
    match hca.engine.windows.get_mut(&qpn) {
        Some(w) if !w.txq.is_empty() => {
            w.drain_event = true;
            false
        }
        _ => true,
    }
}

/// Hook: an SRQ was handed to or taken from the hardware.
pub fn srq_changed(hca: &mut Hca, srqn: u32) {
    hca.engine.srqs.remove(&srqn);
}

/// Hook: a CQ was handed to or taken from the hardware, or resized.
pub fn cq_changed(hca: &mut Hca, cqn: u32, keep_prod: bool) {
    let old = hca.engine.cqs.remove(&cqn);
    if keep_prod
        && let Some(o) = old
        && let Some(c) = cq::get(hca, cqn)
    {
        c.prod = o.prod;
        c.arm = o.arm;
        c.error = o.error;
    }
}

/// Hook: a CQ doorbell.
pub fn cq_doorbell(hca: &mut Hca, cqn: u32, cmd: u32, sn: u8, ci: u32) {
    cq::arm(hca, cqn, cmd, sn, ci);
}

/// Polled front ends: a send doorbell was seen on UAR page `uar`, where
/// another QP's doorbell may have been overwritten since the last pass
/// (the page's doorbell word is read once a pass; the hardware sees every
/// MMIO write). Every other QP bound to the page whose next-to-start slot
/// holds a posted WQE runs its send queue (one not yet in RTS keeps a
/// pending doorbell for RTS). `rung` has run already. Posted means handed
/// over whole, as a driver does before it rings: the owner bit of the
/// pass, a DS count, no stamp; a slot that only reads hardware-owned (an
/// mlx4_en TX ring cleared to zero, a stamped slot) was announced by no
/// doorbell and is left alone.
pub fn send_doorbells_coalesced(hca: &mut Hca, uar: u32, rung: u32) {
    let others: Vec<(u32, QpState)> = hca
        .qps
        .iter()
        .filter(|(q, rt)| **q != rung && rt.uar == uar && rt.state != QpState::Rst)
        .map(|(q, rt)| (*q, rt.state))
        .collect();
    for (qpn, state) in others {
        if !sq_owned_wqe(hca, qpn) {
            continue;
        }
        match state {
            QpState::Rts | QpState::Sqd | QpState::Err | QpState::Sqer => {
                exec::process_sq(hca, qpn);
            }
            _ => {
                if let Some(q) = hca.engine.qps.get_mut(&qpn) {
                    q.db_pending = true;
                }
            }
        }
    }
}

/// QP `qpn`'s send WQE at the next-to-start index is a posted WQE the
/// hardware owns (its owner bit is the pass parity, it has a DS count and
/// its first dword is no stamp).
fn sq_owned_wqe(hca: &mut Hca, qpn: u32) -> bool {
    let Some(q) = hca.engine.qps.get(&qpn) else {
        return false;
    };
    if q.sq_cnt == 0 {
        return false;
    }
    let idx = q.sq_next;
    let parity = idx & q.sq_cnt != 0;
    let Some(addr) = q.sq_wqe(idx) else {
        return false;
    };
    let mut b = [0u8; 16];
    if hca.dma_read(addr, &mut b).is_err() || wqe::unwritten(&b) {
        return false;
    }
    let c = wqe::Ctrl::decode(&b);
    c.owner == parity && c.ds != 0 && u32::from_be_bytes([b[0], b[1], b[2], b[3]]) != wqe::STAMP
}

/// Polled front ends: a CQ doorbell was seen on UAR page `uar`, where
/// another CQ's arm may have been overwritten since the last pass. Each
/// other CQ bound to the page whose arm doorbell record (written by the
/// driver before it rings, Linux `mlx4_cq_arm`) holds a request not yet
/// taken is armed from the record. `rung` has been armed already.
pub fn cq_arms_coalesced(hca: &mut Hca, uar: u32, rung: u32) {
    let others: Vec<u32> = hca
        .cqs
        .iter()
        .filter(|(c, st)| **c != rung && st.uar == uar)
        .map(|(c, _)| *c)
        .collect();
    for cqn in others {
        cq::arm_from_record(hca, cqn);
    }
}

/// Hook: a MAD the card generates (an SMA trap) for port `port`'s QP0,
/// received there with SLID 0 ([`exec`]'s `local_smp`).
pub fn deliver_local_smp(hca: &mut Hca, port: u8, mad: &[u8]) {
    exec::local_smp(hca, port, mad);
}

/// Hook: a send doorbell for `qpn` on UAR page `uar`.
pub fn send_doorbell(hca: &mut Hca, qpn: u32, uar: u32) {
    let Some(rt) = hca.qps.get(&qpn).copied() else {
        return;
    };
    if rt.uar != uar {
        hca.violation(format!(
            "send doorbell for QP {qpn:#x} rung on UAR {uar}; its context names UAR {}",
            rt.uar
        ));
        return;
    }
    if rt.state != QpState::Rts
        && let Some(q) = hca.engine.qps.get_mut(&qpn)
    {
        q.db_pending = true;
    }
    exec::process_sq(hca, qpn);
}

/// One pass over the wire, timers and error-state queues; true if
/// anything moved.
pub fn step(hca: &mut Hca) -> bool {
    let mut active = false;
    if hca.fabric.is_some() {
        active |= wire::sync_ports(hca);
        active |= wire::poll_rx(hca);
    }
    if hca.engine.watch.is_empty() {
        return active;
    }
    let now = hca.clock.now_ns();
    let watch = hca.engine.watch.clone();
    for qpn in watch {
        let Some(q) = hca.engine.qps.get(&qpn) else {
            continue;
        };
        let state = hca.qps.get(&qpn).map(|r| r.state);
        if state == Some(QpState::Err) {
            active |= exec::flush_rq(hca, qpn) > 0;
            continue;
        }
        if q.wait.is_some_and(|w| w.until_ns <= now) {
            exec::process_sq(hca, qpn);
            active = true;
        }
        let due = hca.engine.windows.get(&qpn).and_then(|w| w.ack_due);
        if due.is_some_and(|t| t <= now) {
            wire::ack_timeout(hca, qpn);
            active = true;
        }
    }
    let qps = &hca.engine.qps;
    let states = &hca.qps;
    let windows = &hca.engine.windows;
    hca.engine.watch.retain(|q| {
        qps.get(q).is_some_and(|e| e.wait.is_some())
            || windows.get(q).is_some_and(|w| w.ack_due.is_some())
            || states.get(q).is_some_and(|r| r.state == QpState::Err)
    });
    active
}

/// Next model-clock time a timer is due, if any.
pub fn next_due(hca: &Hca) -> Option<u64> {
    let e = &hca.engine;
    e.watch
        .iter()
        .filter_map(|q| e.qps.get(q)?.wait.map(|w| w.until_ns))
        .chain(e.watch.iter().filter_map(|q| e.windows.get(q)?.ack_due))
        .min()
}
