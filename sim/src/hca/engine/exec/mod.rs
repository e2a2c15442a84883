//! The transports within the HCA: send-queue execution and its responder.
//!
//! The transports: send-queue execution (RC, UC, UD and the MLX transport
//! of QP0/QP1), the responder side of a message delivered within the HCA
//! (receive queues, SRQs, RDMA WRITE/READ, atomics), RNR and transport
//! retries on the model clock, and the error state with its flushes; the
//! packets on the wire are [`super::wire`]'s, and APM, RD and XRC are not
//! modelled.
//!
//! A message whose destination LID is the sending port's own LID (or that
//! is forced to loop back) runs requester and responder in one go, as the
//! card's internal loopback does; a message to any other LID goes to the
//! wire ([`super::wire`]) when the port is on a fabric. A card on no
//! fabric loses it, as a port without a cable does: UD and UC complete,
//! RC waits for an ACK that never comes and ends with "transport retry
//! counter exceeded".
//!
//! The send queue is here; the responder is in `responder.rs`, the MLX
//! transport in `mlx.rs`, the error state and the flushes in `errors.rs`.
//!
//! # Decisions
//!
//! * Errors, IBTA 10.7/11.6 and 9.9: a requester-side error completes the
//!   WQE in error (signalled or not) and moves an RC QP to ERR and a UD,
//!   UC or MLX QP to SQER; a responder-side error moves the responder to
//!   ERR with WQ_ACCESS_ERROR (remote access) or WQ_INVAL_REQ_ERROR
//!   (invalid request) and answers an RC requester with the NAK that
//!   completes it with REM_ACCESS_ERR / REM_INV_REQ_ERR / REM_OP_ERR.
//! * A responder QP whose remote-access flag (RRE/RWE/RAE) is off answers
//!   "remote access error", as for a bad R_Key; a misaligned atomic or a
//!   SEND longer than the receive buffer is "remote invalid request".
//! * Atomics operate on the 8 bytes as a big-endian value (the ConnectX-3
//!   atomic capability is IB_ATOMIC_HCA with network byte order), and the
//!   original value lands big-endian in the requester's buffer.
//! * Zero-length RDMA operations do not check the R_Key (IBTA 9.7.4.1.3).
//! * With requester and responder run together (loopback), a message
//!   completes before the next starts, so max_rd_atomic /
//!   max_dest_rd_atomic (never below one in the context's log encoding)
//!   cannot be exceeded and a fence is always satisfied; over a fabric
//!   the send window enforces both ([`super::wire`]).
//! * Flushes: every outstanding WQE gets its own WR_FLUSH_ERR CQE, also
//!   unsignalled ones.
//! * A receive WQE with a scatter entry in inline form (byte count bit 31:
//!   receive WQEs take data pointers only) is malformed: IBTA's class A
//!   responder error, so the WQE completes with LOC_QP_OP_ERR, the QP goes
//!   to ERR with a work queue catastrophic error event, and an RC requester
//!   gets the Remote Operational Error NAK (REM_OP_ERR, syndrome 0x14).
//! * Remote Aborted (syndrome 0x22) is not produced: IBTA's NAK codes have
//!   no "aborted" (it belongs to RD and to vendor paths such as mlx5's
//!   on-demand paging), so no RC/UC/UD condition of a ConnectX-3 and a
//!   standard peer yields it that we could establish.
//! * UD with the address vector's GRH bit sends a GRH (IPVer 6, the AV's
//!   traffic class, flow label, hop limit and DGID, the SGID from the
//!   port's GID table at the AV's index; an index beyond the table is a
//!   local QP operation error); a received GRH whose DGID is not one of
//!   the port's GIDs is dropped, otherwise its 40 bytes land at the start
//!   of the receive buffer and the CQE's GRH bit is set.

use super::cq::{self, Cqe, Syndrome, rcv_op};
use super::wqe::{self, Ctrl, Datagram, MAX_SEGS, MlxCtrl, Sge, op};
use super::xlate::{self, Access, Seg};
use super::{QpEng, Wait, WaitKind};
use crate::fabric::LogicalState;
use crate::hca::ctx::{Event, eqe, st};
use crate::hca::device::{Hca, QpState};
use crate::hca::layout::{get16, get32, get64};

mod errors;
mod mlx;
mod responder;

pub use errors::{enter_error, flush_rq, flush_sq};
use mlx::mlx_send;
pub(in crate::hca::engine) use mlx::{local_smp, mad_deliver, pkey_violation};
use responder::receive;
pub(in crate::hca::engine) use responder::{
    Rwqe, lmc_mask, malformed_rwqe, respond, responder_error, rq_commit, rq_peek,
};

/// Most bytes of a send WQE (63 units of 16).
const WQE_MAX: usize = 1024;
/// Most bytes of a receive WQE (stride 2^11).
const RWQE_MAX: usize = 2048;
/// The Q_Key of QP1.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The permissive LID.
pub const PERMISSIVE_LID: u16 = 0xffff;

/// IBTA table 45: RNR NAK timer field to microseconds.
const RNR_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// RNR timer `t` in nanoseconds.
pub fn rnr_ns(t: u8) -> u64 {
    u64::from(RNR_US[usize::from(t & 31)]) * 1000
}

/// Local ACK timeout `t` in nanoseconds (4.096 us * 2^t; 0 = infinite).
pub fn ack_ns(t: u8) -> Option<u64> {
    (t != 0).then(|| 4096u64 << t.min(31))
}

/// What a message asks of the responder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Send,
    Write,
    Read,
    CmpSwap,
    FetchAdd,
}

/// A message between requester and responder.
#[derive(Debug, Clone, Copy)]
pub(super) struct Msg {
    pub(super) kind: Kind,
    pub(super) st: u8,
    pub(super) src_qpn: u32,
    pub(super) dst_qpn: u32,
    pub(super) port: u8,
    pub(super) len: u64,
    pub(super) imm: Option<u32>,
    pub(super) se: bool,
    pub(super) raddr: u64,
    pub(super) rkey: u32,
    pub(super) swap: u64,
    pub(super) cmp: u64,
    pub(super) slid: u16,
    pub(super) dlid: u16,
    pub(super) sl: u8,
    pub(super) pkey: u16,
    pub(super) qkey: u32,
    pub(super) grh: Option<[u8; 40]>,
    pub(super) npkts: u32,
    /// SEND with Invalidate: the R_Key the responder invalidates.
    pub(super) inv: Option<u32>,
    /// RoCE: the Ethernet header (to send with, or received with).
    pub(super) eth: Option<crate::fabric::packet::EthHdr>,
}

/// The responder's answer.
#[derive(Debug, Clone, Copy)]
pub(super) enum Resp {
    Ack,
    Read(Seg),
    Atomic(u64),
    Nak(Syndrome),
    Rnr(u8),
    Silent,
}

/// Per-WQE scratch arrays, kept by the engine between WQEs so the hot
/// path neither allocates nor clears kilobytes of stack.
#[derive(Debug)]
pub struct Scratch {
    pub(super) sges: [Sge; MAX_SEGS],
    pub(super) segs: [Seg; MAX_SEGS],
    rbuf: [u8; RWQE_MAX],
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            sges: [Sge::None; MAX_SEGS],
            segs: [Seg::default(); MAX_SEGS],
            rbuf: [0; RWQE_MAX],
        }
    }
}

pub(super) fn take_scratch(slot: &mut Option<Box<Scratch>>) -> Box<Scratch> {
    slot.take().unwrap_or_default()
}

/// How one WQE ended.
pub(super) enum Outcome {
    /// Completed (a CQE if signalled).
    Done { byte_cnt: u32 },
    /// An RC message went onto the wire: it completes when its response
    /// comes ([`super::wire::Window`]).
    Sent,
    /// Cannot start while messages are in flight (a loopback message
    /// would complete before them): stop without advancing.
    Blocked,
    /// Stopped until a timer fires.
    Wait(WaitKind, u64),
    /// Completed in error.
    Fail(Syndrome),
    /// Not executable yet (stamped chunk): stop without advancing.
    Stall,
}

pub(super) fn pkey_at(hca: &Hca, port: u8, index: u8) -> u16 {
    hca.port_index(u32::from(port))
        .and_then(|i| hca.ports[i].pkeys.get(usize::from(index)).copied())
        .unwrap_or(0)
}

/// IBTA 10.9.3: P_Keys match when the low 15 bits agree and at least one
/// is a full member.
pub fn pkey_match(a: u16, b: u16) -> bool {
    a & 0x7fff != 0 && a & 0x7fff == b & 0x7fff && (a | b) & 0x8000 != 0
}

pub(super) fn port_state(hca: &Hca, port: u8) -> Option<(LogicalState, u16, u8)> {
    let i = hca.port_index(u32::from(port))?;
    let p = &hca.ports[i];
    Some((p.state, p.lid, p.lmc))
}

/// The destination is this port (LID match under the LMC mask).
pub(super) fn is_local(hca: &Hca, port: u8, dlid: u16) -> bool {
    port_state(hca, port).is_some_and(|(_, lid, lmc)| {
        let mask = !((1u16 << lmc.min(7)) - 1);
        lid != 0 && dlid & mask == lid & mask
    })
}

pub(super) fn qp_state(hca: &Hca, qpn: u32) -> Option<QpState> {
    hca.qps.get(&qpn).map(|r| r.state)
}

pub(super) fn watch(hca: &mut Hca, qpn: u32) {
    if !hca.engine.watch.contains(&qpn) {
        hca.engine.watch.push(qpn);
    }
}

// ------------------------------------------------------------------ SQ

/// Runs QP `qpn`'s send queue as far as it can go: first the go-back-N
/// retransmissions of the send window, then new WQEs while the window
/// has room ([`super::wire::may_start`]); in SQD only the former.
pub fn process_sq(hca: &mut Hca, qpn: u32) {
    match qp_state(hca, qpn) {
        Some(QpState::Err | QpState::Sqer) => {
            flush_sq(hca, qpn);
            return;
        }
        Some(QpState::Rts | QpState::Sqd) => {}
        _ => return,
    }
    let Some(cnt) = hca.engine.qps.get(&qpn).map(|q| q.sq_cnt) else {
        return;
    };
    let mut wqe = [0u8; WQE_MAX];
    // Each pass retransmits or starts one WQE: at most the ring twice.
    for _ in 0..cnt.saturating_mul(2) {
        let state = qp_state(hca, qpn);
        if !matches!(state, Some(QpState::Rts | QpState::Sqd)) {
            return;
        }
        let Some(q) = hca.engine.qps.get_mut(&qpn) else {
            return;
        };
        let mut expired_ack = false;
        if let Some(w) = q.wait {
            // The clock only for a stopped SQ: a doorbell's pass reads none.
            if w.until_ns > hca.clock.now_ns() {
                return;
            }
            q.wait = None;
            expired_ack = w.kind == WaitKind::Ack;
        }
        let exhausted = expired_ack && q.retry_left == 0;
        if expired_ack && !exhausted {
            q.retry_left -= 1;
        }
        let resend = hca.engine.windows.get(&qpn).and_then(|w| w.resend);
        let (idx, retx) = match resend {
            Some((idx, psn)) => match super::wire::retx_for(hca, qpn, idx, psn) {
                Some(r) => (idx, Some(r)),
                None => continue,
            },
            None => {
                if state != Some(QpState::Rts) {
                    return;
                }
                let Some(q) = hca.engine.qps.get(&qpn) else {
                    return;
                };
                if q.sq_next.wrapping_sub(q.sq_ci) >= q.sq_cnt {
                    return;
                }
                (q.sq_next, None)
            }
        };
        let Some(q) = hca.engine.qps.get(&qpn) else {
            return;
        };
        let stride = 1usize << q.sq_shift;
        // A raw Ethernet WQE may span several basic blocks of the stride
        // (mlx4_en's TX descriptors are 1 to MAX_DESC_TXBBS TXBBs of 64
        // bytes, the next one at the following free TXBB); other QPs keep
        // one WQE per stride (Linux mlx4_ib's constant stride).
        let most = if q.raw_eth {
            WQE_MAX
        } else {
            stride.min(WQE_MAX)
        };
        let Some(addr) = q.sq_wqe(idx) else { return };
        let parity = idx & q.sq_cnt != 0;
        if hca.dma_read(addr, &mut wqe[..16]).is_err() {
            return;
        }
        let ctrl = Ctrl::decode(&wqe[..16]);
        if ctrl.owner != parity || (retx.is_none() && wqe::unwritten(&wqe[..16])) {
            if retx.is_some() {
                hca.violation(format!(
                    "QP {qpn:#x} SQ WQE {idx}: owner bit handed back to software while the \
                     message is in flight"
                ));
                super::wire::fail_entry(hca, qpn, idx, Syndrome::LocalQpOp);
            }
            return;
        }
        if retx.is_none() && !super::wire::may_start(hca, qpn, &ctrl) {
            return;
        }
        let size = usize::from(ctrl.ds) * 16;
        let bbs = size.div_ceil(stride).max(1) as u32;
        let outcome = if exhausted {
            Outcome::Fail(Syndrome::RetryExceeded)
        } else if ctrl.ds == 0 || size > most || bbs > cnt {
            hca.violation(format!(
                "QP {qpn:#x} SQ WQE {idx}: DS count {} does not fit the {stride}-byte stride",
                ctrl.ds
            ));
            Outcome::Fail(Syndrome::LocalQpOp)
        } else if read_wqe(hca, qpn, idx, stride, &mut wqe[..size]).is_err() {
            Outcome::Fail(Syndrome::LocalProt)
        } else if let Some(k) = (64..size)
            .step_by(64)
            .find(|&o| get32(&wqe, o) == wqe::STAMP)
        {
            hca.violation(format!(
                "QP {qpn:#x} SQ WQE {idx}: 64-byte chunk at +{k} still carries the stamp \
                 (WQE handed to the hardware before it was written)"
            ));
            Outcome::Stall
        } else {
            if ctrl.c == 1 || ctrl.c == 2 {
                hca.violation(format!(
                    "QP {qpn:#x} SQ WQE {idx}: reserved completion encoding {}",
                    ctrl.c
                ));
            }
            execute(hca, qpn, idx, &ctrl, &wqe[..size], retx)
        };
        if retx.is_some() {
            match outcome {
                Outcome::Sent => super::wire::resent(hca, qpn, idx),
                Outcome::Fail(s) => {
                    super::wire::fail_entry(hca, qpn, idx, s);
                    return;
                }
                Outcome::Stall => return,
                _ => {
                    hca.violation(format!(
                        "QP {qpn:#x} SQ WQE {idx}: the retransmission did not go onto the wire"
                    ));
                    super::wire::fail_entry(hca, qpn, idx, Syndrome::LocalQpOp);
                    return;
                }
            }
            continue;
        }
        // Completions in order: behind messages in flight, a WQE that
        // ends at once waits in the window for its turn.
        let queued = super::wire::busy(hca, qpn);
        match outcome {
            Outcome::Stall | Outcome::Blocked => return,
            Outcome::Wait(kind, until_ns) => {
                if let Some(q) = hca.engine.qps.get_mut(&qpn) {
                    q.wait = Some(Wait { until_ns, kind });
                }
                watch(hca, qpn);
                return;
            }
            Outcome::Sent => next_wqe(hca, qpn),
            Outcome::Done { byte_cnt } if queued => {
                let st = super::wire::TxState::Done(byte_cnt);
                super::wire::queue_local(hca, qpn, idx, ctrl.opcode, ctrl.signalled(), st);
                next_wqe(hca, qpn);
            }
            Outcome::Fail(s) if queued => {
                let st = super::wire::TxState::Failed(s);
                super::wire::queue_local(hca, qpn, idx, ctrl.opcode, ctrl.signalled(), st);
                next_wqe(hca, qpn);
                return;
            }
            Outcome::Done { byte_cnt } => {
                hca.engine.stats.executed += 1;
                let scq = advance_by(hca, qpn, bbs);
                if ctrl.signalled() {
                    let c = Cqe {
                        qpn,
                        send: true,
                        opcode: ctrl.opcode,
                        byte_cnt,
                        wqe_counter: idx as u16,
                        ..Cqe::default()
                    };
                    cq::push(hca, scq, &c);
                }
            }
            Outcome::Fail(s) => {
                hca.engine.stats.executed += 1;
                let scq = advance_by(hca, qpn, bbs);
                let c = Cqe {
                    qpn,
                    send: true,
                    wqe_counter: idx as u16,
                    error: Some(s),
                    ..Cqe::default()
                };
                cq::push(hca, scq, &c);
                enter_error(hca, qpn, Some(s));
                return;
            }
        }
    }
}

/// Moves past the WQE at the consumer counter; returns the send CQ.
pub(super) fn advance(hca: &mut Hca, qpn: u32) -> u32 {
    advance_by(hca, qpn, 1)
}

/// Moves past the WQE of `bbs` basic blocks at the consumer counter;
/// returns the send CQ.
pub(super) fn advance_by(hca: &mut Hca, qpn: u32, bbs: u32) -> u32 {
    let Some(q) = hca.engine.qps.get_mut(&qpn) else {
        return 0;
    };
    let old = q.sq_ci;
    q.sq_ci = old.wrapping_add(bbs);
    if q.sq_next == old {
        q.sq_next = q.sq_ci;
    }
    q.retrying = false;
    q.scq
}

/// Reads the rest of SQ WQE `idx` of QP `qpn` (its first 16 bytes are in
/// `out` already) into `out`, basic block by basic block: a WQE of several
/// blocks may cross a page of the buffer or wrap at the end of the ring
/// (mlx4_en copies such a descriptor from its bounce buffer).
fn read_wqe(hca: &mut Hca, qpn: u32, idx: u32, stride: usize, out: &mut [u8]) -> Result<(), ()> {
    let mut at = 16;
    let mut bb = 0u32;
    while at < out.len() {
        let Some(addr) = hca
            .engine
            .qps
            .get(&qpn)
            .and_then(|q| q.sq_wqe(idx.wrapping_add(bb)))
        else {
            return Err(());
        };
        let within = at - bb as usize * stride;
        let end = out.len().min((bb as usize + 1) * stride);
        hca.dma_read(addr + within as u64, &mut out[at..end])
            .map_err(|_| ())?;
        at = end;
        bb += 1;
    }
    Ok(())
}

/// Checks a gather (or READ/atomic target) list and turns it into segments.
fn check_list(
    hca: &mut Hca,
    q: &QpEng,
    sges: &[Sge],
    access: Access,
    out: &mut [Seg; MAX_SEGS],
) -> Result<(usize, u64), Syndrome> {
    let mut total = 0u64;
    let mut n = 0;
    for s in sges {
        match *s {
            Sge::None => {}
            Sge::Inline { off, len } => {
                if access != Access::LocalRead {
                    return Err(Syndrome::LocalQpOp);
                }
                out[n] = Seg {
                    addr: u64::from(off),
                    len: u64::from(len),
                    xl: None,
                };
                n += 1;
                total += u64::from(len);
            }
            Sge::Ptr { len, lkey, addr } => {
                let xl = xlate::check(hca, lkey, q.pd, access, addr, len, q.rlkey)
                    .map_err(|_| Syndrome::LocalProt)?;
                out[n] = Seg {
                    addr,
                    len,
                    xl: Some(xl),
                };
                n += 1;
                total += len;
            }
        }
    }
    Ok((n, total))
}

fn opcode_ok(st: u8, opcode: u8) -> bool {
    match st {
        st::RC => matches!(
            opcode,
            op::NOP
                | op::SEND
                | op::SEND_IMM
                | op::SEND_INVAL
                | op::RDMA_WRITE
                | op::RDMA_WRITE_IMM
                | op::RDMA_READ
                | op::ATOMIC_CS
                | op::ATOMIC_FA
        ),
        st::UC => matches!(
            opcode,
            op::NOP | op::SEND | op::SEND_IMM | op::RDMA_WRITE | op::RDMA_WRITE_IMM
        ),
        st::UD | st::MLX => matches!(opcode, op::NOP | op::SEND | op::SEND_IMM),
        _ => false,
    }
}

/// Executes one WQE of QP `qpn` (`retx`: again, for go-back-N).
fn execute(
    hca: &mut Hca,
    qpn: u32,
    idx: u32,
    ctrl: &Ctrl,
    wqe: &[u8],
    retx: Option<super::wire::Retx>,
) -> Outcome {
    let mut sc = take_scratch(&mut hca.engine.tx_scratch);
    let r = execute_in(hca, qpn, idx, ctrl, wqe, &mut sc, retx);
    hca.engine.tx_scratch = Some(sc);
    r
}

fn execute_in(
    hca: &mut Hca,
    qpn: u32,
    idx: u32,
    ctrl: &Ctrl,
    wqe: &[u8],
    sc: &mut Scratch,
    retx: Option<super::wire::Retx>,
) -> Outcome {
    let Some(q) = hca.engine.qps.get(&qpn).map(QpEng::for_send) else {
        return Outcome::Fail(Syndrome::LocalQpOp);
    };
    if matches!(q.st, st::RC | st::UC) {
        match ctrl.opcode {
            op::BIND_MW => return super::mw::bind(hca, &q, wqe),
            op::LOCAL_INVAL => return super::mw::local_inval(hca, &q, wqe),
            _ => {}
        }
    }
    if q.raw_eth && ctrl.opcode != op::NOP {
        return super::eth::raw_send(hca, &q, ctrl, wqe);
    }
    if !opcode_ok(q.st, ctrl.opcode) {
        return Outcome::Fail(Syndrome::LocalQpOp);
    }
    if ctrl.opcode == op::NOP {
        return Outcome::Done { byte_cnt: 0 };
    }
    if q.st == st::MLX {
        return mlx_send(hca, &q, ctrl, wqe);
    }
    let is_rdma = matches!(
        ctrl.opcode,
        op::RDMA_WRITE | op::RDMA_WRITE_IMM | op::RDMA_READ | op::ATOMIC_CS | op::ATOMIC_FA
    );
    let is_atomic = matches!(ctrl.opcode, op::ATOMIC_CS | op::ATOMIC_FA);
    let mut off = 16;
    let (mut raddr, mut rkey, mut swap, mut cmp) = (0, 0, 0, 0);
    let mut dg = None;
    if q.st == st::UD {
        if wqe.len() < off + Datagram::SIZE {
            return Outcome::Fail(Syndrome::LocalQpOp);
        }
        dg = Some(Datagram::decode(&wqe[off..off + Datagram::SIZE]));
        off += Datagram::SIZE;
    } else if is_rdma {
        if wqe.len() < off + 16 {
            return Outcome::Fail(Syndrome::LocalQpOp);
        }
        raddr = get64(wqe, off);
        rkey = get32(wqe, off + 8);
        off += 16;
        if is_atomic {
            if wqe.len() < off + 16 {
                return Outcome::Fail(Syndrome::LocalQpOp);
            }
            swap = get64(wqe, off);
            cmp = get64(wqe, off + 8);
            off += 16;
        }
    }
    let Scratch { sges, segs, .. } = sc;
    let n = match wqe::parse_gather(wqe, off, wqe.len(), sges) {
        Ok(n) => n,
        Err(e) => {
            hca.violation(format!("QP {qpn:#x} SQ WQE {idx}: malformed ({e:?})"));
            return Outcome::Fail(Syndrome::LocalQpOp);
        }
    };
    let local_access = if ctrl.opcode == op::RDMA_READ || is_atomic {
        Access::LocalWrite
    } else {
        Access::LocalRead
    };
    let (nseg, len) = match check_list(hca, &q, &sges[..n], local_access, segs) {
        Ok(v) => v,
        Err(s) => return Outcome::Fail(s),
    };
    let msgmax = if q.msgmax == 0 { 31 } else { q.msgmax.min(31) };
    if len > 1u64 << msgmax {
        return Outcome::Fail(Syndrome::LocalLength);
    }
    if is_atomic && len != 8 {
        return Outcome::Fail(Syndrome::LocalLength);
    }
    let port = dg.map_or(q.port, |d| if d.port != 0 { d.port } else { q.port });
    let port_mtu = hca
        .port_index(u32::from(port))
        .map_or(5, |i| hca.ports[i].mtu_cap);
    let mtu = 128u64 << q.mtu.clamp(1, 5).min(port_mtu.clamp(1, 5));
    if q.st == st::UD && len > mtu {
        return Outcome::Fail(Syndrome::LocalLength);
    }
    let kind = match ctrl.opcode {
        op::SEND | op::SEND_IMM | op::SEND_INVAL => Kind::Send,
        op::RDMA_WRITE | op::RDMA_WRITE_IMM => Kind::Write,
        op::RDMA_READ => Kind::Read,
        op::ATOMIC_CS => Kind::CmpSwap,
        _ => Kind::FetchAdd,
    };
    let imm = matches!(ctrl.opcode, op::SEND_IMM | op::RDMA_WRITE_IMM).then_some(ctrl.imm);
    let inv = (ctrl.opcode == op::SEND_INVAL).then_some(ctrl.imm);
    let (lid, lmc) = port_state(hca, port).map_or((0, 0), |(_, l, m)| (l, m));
    let path_bits = dg.map_or(q.path_bits, |d| d.path_bits) & ((1u8 << lmc.min(7)) - 1);
    let eth_port = super::eth::port_is_eth(hca, port);
    let (dlid, dst_qpn, qkey, sl, force) = match dg {
        Some(d) => (
            d.dlid,
            d.dqpn,
            if d.qkey & 0x8000_0000 != 0 {
                q.qkey
            } else {
                d.qkey
            },
            d.sl,
            d.force_lb || ctrl.force_lb,
        ),
        None => (q.rlid, q.remote_qpn, 0, q.sl, ctrl.force_lb),
    };
    let npkts = if is_atomic {
        1
    } else {
        len.div_ceil(mtu).max(1) as u32
    };
    // RoCE (an Ethernet port): the Ethernet header and GRH from the AV or
    // the QP's path; what they cannot address is a bad WQE.
    let mut roce = None;
    let mut sl = sl;
    if eth_port {
        let link = match dg {
            Some(d) => {
                let av = &wqe[16..16 + Datagram::SIZE];
                sl = Datagram::eth_sl(av);
                let vlan = (d.vlan & 0xfff != 0xfff).then_some(d.vlan);
                super::eth::roce_link(
                    hca,
                    port,
                    d.path_bits,
                    d.mac,
                    vlan,
                    d.gid_index,
                    d.dgid,
                    d.tclass,
                    d.flow_label,
                    d.hop_limit,
                )
            }
            None => super::eth::path_link(hca, &q),
        };
        match link {
            Ok(l) => roce = Some(l),
            Err(why) => {
                hca.violation(format!("QP {qpn:#x} SQ WQE {idx} (RoCE): {why}"));
                return Outcome::Fail(Syndrome::LocalQpOp);
            }
        }
    }
    // UD with the AV's GRH bit: a GRH from the AV (IBTA 8.3), the source
    // GID from the port's GID table; an index beyond it is the AV's fault.
    let grh = match dg {
        _ if roce.is_some() => roce.map(|(_, mut g)| {
            // PayLen as on the wire (the build recomputes it for a packet;
            // a datagram delivered inside the card keeps this one).
            let pad = (4 - len % 4) % 4;
            let eths = if q.st == st::UD { 8 } else { 0 } + if imm.is_some() { 4 } else { 0 };
            g.pay_len = u16::try_from(12 + eths + len + pad + 4).unwrap_or(u16::MAX);
            let mut b = [0u8; 40];
            g.write(&mut b);
            b
        }),
        Some(d) if d.grh => match ud_grh(hca, port, &d, len, imm.is_some()) {
            Some(g) => Some(g),
            None => {
                hca.violation(format!(
                    "QP {qpn:#x} SQ WQE {idx}: UD address vector names source GID index {} \
                     beyond port {port}'s GID table",
                    d.gid_index
                ));
                return Outcome::Fail(Syndrome::LocalQpOp);
            }
        },
        _ => None,
    };
    let msg = Msg {
        kind,
        st: q.st,
        src_qpn: qpn,
        dst_qpn,
        port,
        len,
        imm,
        se: ctrl.solicited,
        raddr,
        rkey,
        swap,
        cmp,
        slid: lid | u16::from(path_bits),
        dlid,
        sl,
        pkey: pkey_at(hca, port, q.pkey_index),
        qkey,
        grh,
        npkts,
        inv,
        eth: roce.map(|(e, _)| e),
    };
    // Retry bookkeeping: armed for a WQE that starts with nothing in
    // flight (later ones share the window's counters, which progress
    // resets).
    let idle = !super::wire::busy(hca, qpn);
    if let Some(qm) = hca.engine.qps.get_mut(&qpn)
        && !qm.retrying
        && idle
    {
        qm.retrying = true;
        qm.retry_left = qm.retry_cnt;
        qm.rnr_left = qm.rnr_retry;
    }
    let mcast = if eth_port {
        msg.grh.is_some_and(|g| g[24] == 0xff)
    } else {
        super::mcast::is_mcast_lid(dlid)
    };
    if q.st == st::UD && mcast && retx.is_none() {
        super::mcast::loopback(hca, &msg, &segs[..nseg], wqe);
    }
    let active = port_state(hca, port).is_some_and(|(s, _, _)| s == LogicalState::Active);
    let attached = super::wire::attached(hca, port);
    let local = if eth_port {
        !mcast && msg.grh.is_some_and(|g| dgid_is_ours(hca, port, &g))
    } else {
        is_local(hca, port, dlid)
    };
    let resp = if active && (force || local) {
        if !idle || retx.is_some() {
            return Outcome::Blocked;
        }
        respond(hca, &msg, &segs[..nseg], wqe)
    } else if attached && (active || q.st == st::RC || retx.is_some()) {
        let mtu_w = if q.st == st::UD { mtu.max(len) } else { mtu };
        let w = super::wire::WqeRef {
            idx,
            opcode: ctrl.opcode,
            signalled: ctrl.signalled(),
        };
        return super::wire::send(hca, &q, &msg, &segs[..nseg], wqe, w, mtu_w, retx);
    } else {
        // Off the HCA and on no fabric: the packet is lost.
        if !active && let Some(i) = hca.port_index(u32::from(port)) {
            let c = &mut hca.ports[i].counters;
            c.xmit_discards = c.xmit_discards.saturating_add(1);
        }
        Resp::Silent
    };
    if let Some(qm) = hca.engine.qps.get_mut(&qpn) {
        qm.sq_psn = (qm.sq_psn + npkts) & 0xff_ffff;
        qm.pkts_sent += u64::from(npkts);
    }
    finish(hca, qpn, &q, &msg, resp, &segs[..nseg])
}

/// Moves the SQ's next-WQE pointer past a WQE whose completion now lives
/// in the send window (sent, or queued behind messages in flight).
fn next_wqe(hca: &mut Hca, qpn: u32) {
    if let Some(q) = hca.engine.qps.get_mut(&qpn) {
        q.sq_next = q.sq_next.wrapping_add(1);
    }
}

/// The 40-byte GRH a UD send with the AV's GRH bit carries: IPVer 6, the
/// AV's traffic class, flow label and hop limit, PayLen from the BTH to
/// the ICRC (BTH 12 + DETH 8 + ImmDt + payload + pad + ICRC 4), NxtHdr
/// 0x1B, SGID = the port's GID prefix and the GUID at the AV's GID index,
/// DGID from the AV. `None` if the index is beyond the GUID table.
fn ud_grh(hca: &Hca, port: u8, d: &Datagram, len: u64, imm: bool) -> Option<[u8; 40]> {
    let p = &hca.ports[hca.port_index(u32::from(port))?];
    let guid = *p.guids.get(usize::from(d.gid_index))?;
    let mut sgid = [0u8; 16];
    sgid[..8].copy_from_slice(&p.gid_prefix.to_be_bytes());
    sgid[8..].copy_from_slice(&guid.to_be_bytes());
    let pad = (4 - len % 4) % 4;
    let pay = 12 + 8 + if imm { 4 } else { 0 } + len + pad + 4;
    let g = crate::fabric::packet::Grh {
        ip_ver: 6,
        tclass: d.tclass,
        flow_label: d.flow_label,
        pay_len: u16::try_from(pay).unwrap_or(u16::MAX),
        nxt_hdr: crate::fabric::packet::GRH_NXT_HDR_IBA,
        hop_lmt: d.hop_limit,
        sgid,
        dgid: d.dgid,
    };
    let mut b = [0u8; 40];
    g.write(&mut b);
    Some(b)
}

/// The DGID of a received GRH names this port (the port's prefix and a
/// GUID of its table); a multicast DGID is the business of
/// [`super::mcast`], which finds the QPs attached to it.
pub(super) fn dgid_is_ours(hca: &Hca, port: u8, grh: &[u8; 40]) -> bool {
    let Some(i) = hca.port_index(u32::from(port)) else {
        return false;
    };
    let p = &hca.ports[i];
    if p.is_eth() {
        // RoCE: a GID of the port's RoCE GID table.
        let mut g = [0u8; 16];
        g.copy_from_slice(&grh[24..40]);
        return p.eth.gid_index(&g).is_some();
    }
    let prefix = u64::from_be_bytes(grh[24..32].try_into().unwrap_or([0; 8]));
    let guid = u64::from_be_bytes(grh[32..40].try_into().unwrap_or([0; 8]));
    prefix == p.gid_prefix && p.guids.contains(&guid)
}

/// The requester's side of a response.
fn finish(hca: &mut Hca, qpn: u32, q: &QpEng, msg: &Msg, resp: Resp, local: &[Seg]) -> Outcome {
    match resp {
        Resp::Ack => Outcome::Done {
            byte_cnt: msg.len.min(u64::from(u32::MAX)) as u32,
        },
        Resp::Read(remote) => {
            if xlate::copy(hca, &[remote], &[], local, 0, msg.len).is_err() {
                return Outcome::Fail(Syndrome::LocalProt);
            }
            Outcome::Done {
                byte_cnt: msg.len as u32,
            }
        }
        Resp::Atomic(orig) => {
            if xlate::scatter(hca, local, 0, &orig.to_be_bytes()).is_err() {
                return Outcome::Fail(Syndrome::LocalProt);
            }
            Outcome::Done { byte_cnt: 8 }
        }
        Resp::Nak(s) => Outcome::Fail(s),
        Resp::Rnr(t) if q.st == st::RC => {
            let Some(qm) = hca.engine.qps.get_mut(&qpn) else {
                return Outcome::Fail(Syndrome::RnrRetryExceeded);
            };
            if qm.rnr_retry != 7 {
                if qm.rnr_left == 0 {
                    return Outcome::Fail(Syndrome::RnrRetryExceeded);
                }
                qm.rnr_left -= 1;
            }
            Outcome::Wait(WaitKind::Rnr, hca.clock.now_ns().saturating_add(rnr_ns(t)))
        }
        Resp::Rnr(_) => Outcome::Done {
            byte_cnt: msg.len as u32,
        },
        Resp::Silent if q.st == st::RC => ack_wait(q, hca.clock.now_ns()),
        Resp::Silent => Outcome::Done {
            byte_cnt: msg.len as u32,
        },
    }
}

/// An RC request went out and no answer came (yet): wait the local ACK
/// timeout (for ever if it is 0). Retries are counted when it expires.
pub(super) fn ack_wait(q: &QpEng, now: u64) -> Outcome {
    match ack_ns(q.ack_timeout) {
        None => Outcome::Wait(WaitKind::Ack, u64::MAX),
        Some(t) => Outcome::Wait(WaitKind::Ack, now.saturating_add(t)),
    }
}
