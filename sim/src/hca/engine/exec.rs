//! The transports: send-queue execution (RC, UC, UD and the MLX transport
//! of QP0/QP1), the responder side of a message delivered within the HCA
//! (receive queues, SRQs, RDMA WRITE/READ, atomics), RNR and transport
//! retries on the model clock, and the error state with its flushes;
//! packets on a fabric, APM, RD and XRC are not modelled here.
//!
//! A message whose destination LID is the sending port's own LID (or that
//! is forced to loop back) runs requester and responder in one go, as the
//! card's internal loopback does; any other destination is not reachable
//! yet (UD and UC complete, RC waits for an ACK that never comes and ends
//! with "transport retry counter exceeded").
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
        let Some(addr) = q.sq_wqe(idx) else { return };
        let parity = idx & q.sq_cnt != 0;
        if hca.dma_read(addr, &mut wqe[..16]).is_err() {
            return;
        }
        let ctrl = Ctrl::decode(&wqe[..16]);
        if ctrl.owner != parity {
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
        let outcome = if exhausted {
            Outcome::Fail(Syndrome::RetryExceeded)
        } else if ctrl.ds == 0 || size > stride.min(WQE_MAX) {
            hca.violation(format!(
                "QP {qpn:#x} SQ WQE {idx}: DS count {} does not fit the {stride}-byte stride",
                ctrl.ds
            ));
            Outcome::Fail(Syndrome::LocalQpOp)
        } else if hca.dma_read(addr + 16, &mut wqe[16..size]).is_err() {
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
                let scq = advance(hca, qpn);
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
                let scq = advance(hca, qpn);
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
    let Some(q) = hca.engine.qps.get_mut(&qpn) else {
        return 0;
    };
    let old = q.sq_ci;
    q.sq_ci = old.wrapping_add(1);
    if q.sq_next == old {
        q.sq_next = q.sq_ci;
    }
    q.retrying = false;
    q.scq
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
    // UD with the AV's GRH bit: a GRH from the AV (IBTA 8.3), the source
    // GID from the port's GID table; an index beyond it is the AV's fault.
    let grh = match dg {
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
    let active = port_state(hca, port).is_some_and(|(s, _, _)| s == LogicalState::Active);
    let attached = super::wire::attached(hca, port);
    let resp = if active && (force || is_local(hca, port, dlid)) {
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
        // Off the HCA: no fabric is attached yet, the packet is lost.
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
/// GUID of its table); multicast GIDs are not modelled.
pub(super) fn dgid_is_ours(hca: &Hca, port: u8, grh: &[u8; 40]) -> bool {
    let Some(i) = hca.port_index(u32::from(port)) else {
        return false;
    };
    let p = &hca.ports[i];
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

// ------------------------------------------------------------------ responder

/// A receive WQE taken (not yet consumed).
pub(super) struct Rwqe {
    /// RQ counter or SRQ index (the CQE's WQE counter).
    pub(super) counter: u16,
    /// Scatter entries (in the caller's scratch).
    pub(super) n: usize,
    /// SRQ: index of the next free WQE.
    pub(super) srq_next: Option<u16>,
    /// The scatter list is one the card refuses
    /// ([`wqe::scatter_malformed`]).
    pub(super) malformed: bool,
}

/// Peeks at the next receive WQE of `q` (its RQ or SRQ); its scatter list
/// lands in `sc.sges`.
pub(super) fn rq_peek(hca: &mut Hca, q: &QpEng, sc: &mut Scratch) -> Option<Rwqe> {
    let Scratch {
        sges, rbuf: buf, ..
    } = sc;
    if let Some(srqn) = q.srq {
        let s = srq_get(hca, srqn)?;
        let (db, consumed, head, shift, cnt) = (s.db_rec, s.consumed, s.head, s.shift, s.cnt);
        let (pages, page_shift) = (s.pages.clone(), s.page_shift);
        let mut d = [0u8; 4];
        hca.dma_read(db, &mut d).ok()?;
        let counter = (u32::from_be_bytes(d) & 0xffff) as u16;
        if counter == consumed {
            return None;
        }
        let stride = (1usize << shift).min(RWQE_MAX);
        let off = u64::from(u32::from(head) & (cnt - 1)) << shift;
        let pa = pages.get((off >> page_shift) as usize)? + (off & ((1 << page_shift) - 1));
        hca.dma_read(pa, &mut buf[..stride]).ok()?;
        let next = get16(&buf[..], 2);
        let n = wqe::parse_scatter(&buf[16..stride], sges);
        return Some(Rwqe {
            counter: head,
            n,
            srq_next: Some(next),
            malformed: wqe::scatter_malformed(&buf[16..stride]),
        });
    }
    if q.rq_cnt == 0 {
        return None;
    }
    let mut d = [0u8; 4];
    hca.dma_read(q.db_rec, &mut d).ok()?;
    let head = (u32::from_be_bytes(d) & 0xffff) as u16;
    if head == q.rq_ci {
        return None;
    }
    let stride = (1usize << q.rq_shift).min(RWQE_MAX);
    let pa = q.rq_wqe(u32::from(q.rq_ci))?;
    hca.dma_read(pa, &mut buf[..stride]).ok()?;
    let n = wqe::parse_scatter(&buf[..stride], sges);
    Some(Rwqe {
        counter: q.rq_ci,
        n,
        srq_next: None,
        malformed: wqe::scatter_malformed(&buf[..stride]),
    })
}

/// Consumes the receive WQE `r` peeked from `qpn`'s queue.
pub(super) fn rq_commit(hca: &mut Hca, qpn: u32, r: &Rwqe) {
    let Some(q) = hca.engine.qps.get_mut(&qpn) else {
        return;
    };
    match (q.srq, r.srq_next) {
        (Some(srqn), Some(next)) => {
            let Some(s) = hca.engine.srqs.get_mut(&srqn) else {
                return;
            };
            s.head = next;
            s.consumed = s.consumed.wrapping_add(1);
            let db = s.db_rec;
            let consumed = s.consumed;
            let limit = hca.srqs.get(&srqn).map_or(0, |x| x.limit);
            if limit > 0 {
                let mut d = [0u8; 4];
                if hca.dma_read(db, &mut d).is_ok() {
                    let counter = (u32::from_be_bytes(d) & 0xffff) as u16;
                    if counter.wrapping_sub(consumed) < limit {
                        if let Some(x) = hca.srqs.get_mut(&srqn) {
                            x.limit = 0;
                        }
                        hca.post_async(Event::Srq {
                            kind: eqe::SRQ_LIMIT,
                            srqn,
                        });
                    }
                }
            }
        }
        _ => q.rq_ci = q.rq_ci.wrapping_add(1),
    }
}

fn srq_get(hca: &mut Hca, srqn: u32) -> Option<&mut super::SrqEng> {
    if !hca.engine.srqs.contains_key(&srqn) {
        let s = *hca.srqs.get(&srqn)?;
        let va = hca
            .geo()
            .ok()?
            .va(crate::hca::icm::Table::Srqc, u64::from(srqn));
        let mut b = [0u8; crate::hca::ctx::srqc::SIZE];
        hca.icm_read(va, &mut b).ok()?;
        let c = crate::hca::ctx::SrqCtx::decode(&b);
        let shift = u32::from(c.log_stride) + 4;
        let cnt = 1u32 << s.log_size;
        let pages = hca
            .mtt_pages(c.mtt_base, c.log_page_size, u64::from(cnt) << shift)
            .ok()?
            .into();
        hca.engine.srqs.insert(
            srqn,
            super::SrqEng {
                cnt,
                shift,
                pages,
                page_shift: 12 + u32::from(c.log_page_size.min(20)),
                db_rec: c.db_rec_addr,
                pd: c.pd,
                head: 0,
                consumed: 0,
            },
        );
    }
    hca.engine.srqs.get_mut(&srqn)
}

/// Responder-side failure: the responder QP's receive WQE (if any) gets
/// `local` and the QP goes to ERR with `event`; an RC requester gets `nak`.
pub(super) fn responder_error(
    hca: &mut Hca,
    d: &QpEng,
    r: Option<&Rwqe>,
    local: Option<Syndrome>,
    event: u8,
    nak: Syndrome,
) -> Resp {
    if let (Some(r), Some(s)) = (r, local) {
        rq_commit(hca, d.qpn, r);
        let c = Cqe {
            qpn: d.qpn,
            wqe_counter: r.counter,
            error: Some(s),
            ..Cqe::default()
        };
        cq::push(hca, d.rcq, &c);
    }
    hca.post_async(Event::Qp {
        kind: event,
        qpn: d.qpn,
    });
    enter_error(hca, d.qpn, None);
    if d.st == st::RC {
        Resp::Nak(nak)
    } else {
        Resp::Ack
    }
}

/// A receive WQE the card cannot use (IBTA 9.9.3.1, class A responder
/// error "malformed WQE"): the WQE completes with a local QP operation
/// error, the QP goes to ERR with a work queue catastrophic error, and an
/// RC requester gets the Remote Operational Error NAK (REM_OP_ERR).
pub(super) fn malformed_rwqe(hca: &mut Hca, d: &QpEng, r: &Rwqe) -> Resp {
    hca.violation(format!(
        "QP {:#x} receive WQE {}: scatter entry with the inline bit (receive WQEs take data \
         pointers only)",
        d.qpn, r.counter
    ));
    responder_error(
        hca,
        d,
        Some(r),
        Some(Syndrome::LocalQpOp),
        eqe::WQ_CATAS_ERROR,
        Syndrome::RemoteOp,
    )
}

/// Delivers `m` to its destination QP on this HCA.
pub(super) fn respond(hca: &mut Hca, m: &Msg, src: &[Seg], inline: &[u8]) -> Resp {
    let Some(d) = hca.engine.qps.get(&m.dst_qpn).map(QpEng::for_send) else {
        return Resp::Silent;
    };
    if !matches!(
        qp_state(hca, d.qpn),
        Some(QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqer)
    ) || d.st != m.st
        || d.port != m.port
    {
        return Resp::Silent;
    }
    let pi = hca.port_index(u32::from(d.port)).unwrap_or(0);
    if !pkey_match(m.pkey, pkey_at(hca, d.port, d.pkey_index)) {
        let p = &mut hca.ports[pi];
        p.pkey_violations = p.pkey_violations.saturating_add(1);
        return Resp::Silent;
    }
    // A GRH whose DGID is not this port's is not for us (IBTA 9.6.1.1):
    // silently dropped.
    if d.st == st::UD
        && let Some(g) = &m.grh
        && !dgid_is_ours(hca, d.port, g)
    {
        return Resp::Silent;
    }
    if d.st == st::UD && m.qkey != d.qkey {
        let p = &mut hca.ports[pi];
        p.qkey_violations = p.qkey_violations.saturating_add(1);
        return Resp::Silent;
    }
    if let Some(dq) = hca.engine.qps.get_mut(&d.qpn) {
        dq.rq_psn = (dq.rq_psn + m.npkts) & 0xff_ffff;
    }
    match m.kind {
        Kind::Send => receive(hca, &d, m, src, inline, false),
        Kind::Write => {
            if !d.rwe {
                return responder_error(
                    hca,
                    &d,
                    None,
                    None,
                    eqe::WQ_ACCESS_ERROR,
                    Syndrome::RemoteAccess,
                );
            }
            let r = if m.imm.is_some() {
                let mut sc = take_scratch(&mut hca.engine.rx_scratch);
                let r = rq_peek(hca, &d, &mut sc);
                hca.engine.rx_scratch = Some(sc);
                match r {
                    Some(r) if r.malformed => return malformed_rwqe(hca, &d, &r),
                    Some(r) => Some(r),
                    None => return rnr(&d),
                }
            } else {
                None
            };
            if m.len > 0 {
                let xl = match xlate::check_qp(
                    hca,
                    m.rkey,
                    Some(d.qpn),
                    d.pd,
                    Access::RemoteWrite,
                    m.raddr,
                    m.len,
                    false,
                ) {
                    Ok(x) => x,
                    Err(_) => {
                        return responder_error(
                            hca,
                            &d,
                            r.as_ref(),
                            Some(Syndrome::LocalAccess),
                            eqe::WQ_ACCESS_ERROR,
                            Syndrome::RemoteAccess,
                        );
                    }
                };
                let dst = Seg {
                    addr: m.raddr,
                    len: m.len,
                    xl: Some(xl),
                };
                if xlate::copy(hca, src, inline, &[dst], 0, m.len).is_err() {
                    return responder_error(
                        hca,
                        &d,
                        r.as_ref(),
                        Some(Syndrome::LocalAccess),
                        eqe::WQ_ACCESS_ERROR,
                        Syndrome::RemoteOp,
                    );
                }
            }
            if let Some(r) = r {
                rq_commit(hca, d.qpn, &r);
                let c = Cqe {
                    qpn: d.qpn,
                    opcode: rcv_op::RDMA_WRITE_IMM,
                    byte_cnt: m.len as u32,
                    imm: m.imm.unwrap_or(0),
                    wqe_counter: r.counter,
                    solicited: m.se,
                    ..Cqe::default()
                };
                cq::push(hca, d.rcq, &c);
            }
            Resp::Ack
        }
        Kind::Read => {
            if !d.rre {
                return responder_error(
                    hca,
                    &d,
                    None,
                    None,
                    eqe::WQ_ACCESS_ERROR,
                    Syndrome::RemoteAccess,
                );
            }
            if m.len == 0 {
                return Resp::Read(Seg::default());
            }
            match xlate::check_qp(
                hca,
                m.rkey,
                Some(d.qpn),
                d.pd,
                Access::RemoteRead,
                m.raddr,
                m.len,
                false,
            ) {
                Ok(xl) => Resp::Read(Seg {
                    addr: m.raddr,
                    len: m.len,
                    xl: Some(xl),
                }),
                Err(_) => responder_error(
                    hca,
                    &d,
                    None,
                    None,
                    eqe::WQ_ACCESS_ERROR,
                    Syndrome::RemoteAccess,
                ),
            }
        }
        Kind::CmpSwap | Kind::FetchAdd => {
            if !d.rae {
                return responder_error(
                    hca,
                    &d,
                    None,
                    None,
                    eqe::WQ_ACCESS_ERROR,
                    Syndrome::RemoteAccess,
                );
            }
            if !m.raddr.is_multiple_of(8) {
                return responder_error(
                    hca,
                    &d,
                    None,
                    None,
                    eqe::WQ_INVAL_REQ_ERROR,
                    Syndrome::RemoteInvalidReq,
                );
            }
            let xl = match xlate::check_qp(
                hca,
                m.rkey,
                Some(d.qpn),
                d.pd,
                Access::RemoteAtomic,
                m.raddr,
                8,
                false,
            ) {
                Ok(x) => x,
                Err(_) => {
                    return responder_error(
                        hca,
                        &d,
                        None,
                        None,
                        eqe::WQ_ACCESS_ERROR,
                        Syndrome::RemoteAccess,
                    );
                }
            };
            let seg = [Seg {
                addr: m.raddr,
                len: 8,
                xl: Some(xl),
            }];
            let mut b = [0u8; 8];
            if xlate::gather(hca, &seg, &[], 0, &mut b).is_err() {
                return Resp::Nak(Syndrome::RemoteOp);
            }
            let orig = u64::from_be_bytes(b);
            let new = match m.kind {
                Kind::CmpSwap if orig == m.cmp => m.swap,
                Kind::CmpSwap => orig,
                _ => orig.wrapping_add(m.swap),
            };
            if new != orig && xlate::scatter(hca, &seg, 0, &new.to_be_bytes()).is_err() {
                return Resp::Nak(Syndrome::RemoteOp);
            }
            Resp::Atomic(orig)
        }
    }
}

pub(super) fn rnr(d: &QpEng) -> Resp {
    if d.st == st::RC {
        Resp::Rnr(d.min_rnr_timer)
    } else {
        Resp::Silent
    }
}

/// A SEND (or a MAD on QP0/QP1) arriving at `d`.
fn receive(hca: &mut Hca, d: &QpEng, m: &Msg, src: &[Seg], inline: &[u8], mad: bool) -> Resp {
    let mut sc = take_scratch(&mut hca.engine.rx_scratch);
    let r = receive_in(hca, d, m, src, inline, mad, &mut sc);
    hca.engine.rx_scratch = Some(sc);
    r
}

fn receive_in(
    hca: &mut Hca,
    d: &QpEng,
    m: &Msg,
    src: &[Seg],
    inline: &[u8],
    mad: bool,
    sc: &mut Scratch,
) -> Resp {
    let Some(r) = rq_peek(hca, d, sc) else {
        return rnr(d);
    };
    if r.malformed {
        return malformed_rwqe(hca, d, &r);
    }
    // SEND with Invalidate: the key is checked before anything lands
    // (IBTA 9.4.1.1, 10.6.7.2; the model's choice of status: super::mw).
    if let Some(k) = m.inv
        && super::mw::invalidate(hca, k, d.qpn, d.pd, true, false).is_err()
    {
        return responder_error(
            hca,
            d,
            Some(&r),
            Some(Syndrome::LocalAccess),
            eqe::WQ_INVAL_REQ_ERROR,
            Syndrome::RemoteInvalidReq,
        );
    }
    let pd = match d.srq {
        Some(s) => hca.engine.srqs.get(&s).map_or(d.pd, |x| x.pd),
        None => d.pd,
    };
    let dq = QpEng { pd, ..d.clone() };
    let datagram = matches!(d.st, st::UD | st::MLX);
    let skip = if datagram { 40u64 } else { 0 };
    let need = skip + m.len;
    // The scatter list is checked over the bytes the message uses.
    let Scratch { sges, segs, .. } = sc;
    let mut room = 0u64;
    let mut n = 0;
    let mut bad = false;
    for s in &sges[..r.n] {
        let Sge::Ptr { len, lkey, addr } = *s else {
            continue;
        };
        if room >= need {
            break;
        }
        let used = len.min(need - room);
        match xlate::check(hca, lkey, dq.pd, Access::LocalWrite, addr, used, dq.rlkey) {
            Ok(xl) => {
                segs[n] = Seg {
                    addr,
                    len: used,
                    xl: Some(xl),
                };
                n += 1;
                room += used;
            }
            Err(_) => {
                bad = true;
                break;
            }
        }
    }
    if bad {
        return responder_error(
            hca,
            d,
            Some(&r),
            Some(Syndrome::LocalProt),
            eqe::WQ_ACCESS_ERROR,
            Syndrome::RemoteOp,
        );
    }
    if room < need {
        return responder_error(
            hca,
            d,
            Some(&r),
            Some(Syndrome::LocalLength),
            eqe::WQ_INVAL_REQ_ERROR,
            Syndrome::RemoteInvalidReq,
        );
    }
    if let Some(g) = &m.grh
        && xlate::scatter(hca, &segs[..n], 0, g).is_err()
    {
        bad = true;
    }
    if bad || xlate::copy(hca, src, inline, &segs[..n], skip, m.len).is_err() {
        return responder_error(
            hca,
            d,
            Some(&r),
            Some(Syndrome::LocalProt),
            eqe::WQ_ACCESS_ERROR,
            Syndrome::RemoteOp,
        );
    }
    if let Some(k) = m.inv {
        let _ = super::mw::invalidate(hca, k, d.qpn, d.pd, true, true);
    }
    rq_commit(hca, d.qpn, &r);
    hca.engine.stats.received += 1;
    let pkey_index = if datagram {
        hca.port_index(u32::from(d.port))
            .and_then(|i| {
                hca.ports[i]
                    .pkeys
                    .iter()
                    .position(|&p| pkey_match(p, m.pkey))
            })
            .unwrap_or(0) as u32
    } else {
        0
    };
    let _ = mad;
    let c = Cqe {
        qpn: d.qpn,
        opcode: if m.inv.is_some() {
            rcv_op::SEND_INVAL
        } else if m.imm.is_some() {
            rcv_op::SEND_IMM
        } else {
            rcv_op::SEND
        },
        byte_cnt: need.min(u64::from(u32::MAX)) as u32,
        imm: m.inv.or(m.imm).unwrap_or(pkey_index),
        grh: datagram && m.grh.is_some(),
        path_bits: if datagram {
            (m.dlid & 0x7f) as u8 & lmc_mask(hca, d.port)
        } else {
            0
        },
        rqpn: if datagram { m.src_qpn } else { 0 },
        sl: if datagram { m.sl } else { 0 },
        slid: if datagram { m.slid } else { 0 },
        wqe_counter: r.counter,
        solicited: m.se,
        ..Cqe::default()
    };
    cq::push(hca, d.rcq, &c);
    Resp::Ack
}

pub(super) fn lmc_mask(hca: &Hca, port: u8) -> u8 {
    port_state(hca, port).map_or(0, |(_, _, lmc)| ((1u16 << lmc.min(7)) - 1) as u8)
}

// ------------------------------------------------------------------ MLX

/// The UD header the driver built inside an MLX WQE.
#[derive(Debug, Clone, Copy)]
struct UdHeader {
    vl: u8,
    sl: u8,
    dlid: u16,
    slid: u16,
    pkt_words: u16,
    grh: Option<[u8; 40]>,
    se: bool,
    pad: u8,
    pkey: u16,
    dqpn: u32,
    psn: u32,
    qkey: u32,
    sqpn: u32,
    imm: Option<u32>,
    len: usize,
}

fn parse_ud_header(h: &[u8]) -> Result<UdHeader, &'static str> {
    if h.len() < 8 {
        return Err("shorter than an LRH");
    }
    if h[0] & 0xf != 0 {
        return Err("LRH LVer not 0");
    }
    let lnh = h[1] & 3;
    let mut off = 8;
    let grh = match lnh {
        2 => None,
        3 => {
            let g: [u8; 40] = h
                .get(8..48)
                .ok_or("GRH cut short")?
                .try_into()
                .map_err(|_| "GRH")?;
            off += 40;
            Some(g)
        }
        _ => return Err("LRH LNH is neither IBA local nor IBA global"),
    };
    let bth = h.get(off..off + 12).ok_or("BTH cut short")?;
    let opcode = bth[0];
    if opcode != 0x64 && opcode != 0x65 {
        return Err("BTH opcode is not UD SEND only (with immediate)");
    }
    if bth[1] & 0xf != 0 {
        return Err("BTH TVer not 0");
    }
    off += 12;
    let deth = h.get(off..off + 8).ok_or("DETH cut short")?;
    off += 8;
    let imm = if opcode == 0x65 {
        let v = get32(h.get(off..off + 4).ok_or("ImmDt cut short")?, 0);
        off += 4;
        Some(v)
    } else {
        None
    };
    Ok(UdHeader {
        vl: h[0] >> 4,
        sl: h[1] >> 4,
        dlid: get16(h, 2),
        pkt_words: get16(h, 4) & 0x7ff,
        slid: get16(h, 6),
        grh,
        se: bth[1] & 0x80 != 0,
        pad: (bth[1] >> 4) & 3,
        pkey: get16(bth, 2),
        dqpn: get32(bth, 4) & 0xff_ffff,
        psn: get32(bth, 8) & 0xff_ffff,
        qkey: get32(deth, 0),
        sqpn: get32(deth, 4) & 0xff_ffff,
        imm,
        len: off,
    })
}

/// A send on QP0/QP1: the header is the driver's, checked here.
fn mlx_send(hca: &mut Hca, q: &QpEng, ctrl: &Ctrl, wqe: &[u8]) -> Outcome {
    let qpn = q.qpn;
    let mlx = MlxCtrl::decode(&wqe[..16]);
    let mut sges = [Sge::None; MAX_SEGS];
    let n = match wqe::parse_gather(wqe, 16, wqe.len(), &mut sges) {
        Ok(n) => n,
        Err(e) => {
            hca.violation(format!("QP {qpn:#x} MLX WQE malformed ({e:?})"));
            return Outcome::Fail(Syndrome::LocalQpOp);
        }
    };
    // Leading inline segments: the header; the last one: the ICRC room.
    let mut hdr = [0u8; 128];
    let mut hlen = 0usize;
    let mut first_data = n;
    for (i, s) in sges[..n].iter().enumerate() {
        match *s {
            Sge::Inline { off, len } if i + 1 < n || n == 1 => {
                let (o, l) = (usize::from(off), usize::from(len));
                if hlen + l > hdr.len() {
                    break;
                }
                hdr[hlen..hlen + l].copy_from_slice(&wqe[o..o + l]);
                hlen += l;
            }
            _ => {
                first_data = i;
                break;
            }
        }
    }
    let bad = |hca: &mut Hca, why: &str| {
        hca.violation(format!("QP {qpn:#x} MLX send: {why}"));
        Outcome::Fail(Syndrome::LocalQpOp)
    };
    let last_icrc = n >= 2 && matches!(sges[n - 1], Sge::Inline { len: 4, .. });
    if !last_icrc {
        return bad(hca, "no 4-byte inline ICRC segment at the end of the WQE");
    }
    let h = match parse_ud_header(&hdr[..hlen]) {
        Ok(h) => h,
        Err(e) => return bad(hca, e),
    };
    // Header bytes beyond the parsed header belong to the payload.
    let extra = hlen - h.len;
    let mut segs = [Seg::default(); MAX_SEGS];
    let mut ns = 0;
    if extra > 0 {
        segs[0] = Seg {
            addr: 0,
            len: extra as u64,
            xl: None,
        };
        ns = 1;
    }
    let mut payload = extra as u64;
    let mut hdr_inline = [0u8; 128];
    hdr_inline[..extra].copy_from_slice(&hdr[h.len..hlen]);
    let body = &sges[first_data.min(n - 1)..n - 1];
    for s in body {
        match *s {
            Sge::Ptr { len, lkey, addr } => {
                match xlate::check(hca, lkey, q.pd, Access::LocalRead, addr, len, q.rlkey) {
                    Ok(xl) => {
                        segs[ns] = Seg {
                            addr,
                            len,
                            xl: Some(xl),
                        };
                        ns += 1;
                        payload += len;
                    }
                    Err(_) => return Outcome::Fail(Syndrome::LocalProt),
                }
            }
            Sge::Inline { .. } => return bad(hca, "inline payload after data segments"),
            Sge::None => {}
        }
        if ns == MAX_SEGS {
            break;
        }
    }
    let is_qp0 = q.special == Some(true);
    if is_qp0 != (h.vl == 15) || is_qp0 != mlx.vl15 {
        return bad(
            hca,
            "VL15 is for QP0 (SMPs) only, and QP0 sends only on VL15",
        );
    }
    let want_sqpn = u32::from(!is_qp0);
    if h.sqpn != want_sqpn {
        return bad(hca, "DETH source QP is not the special QP's own number");
    }
    if is_qp0 && h.dqpn != 0 {
        return bad(hca, "an SMP addressed to a QP other than QP0");
    }
    if h.dqpn == 1 && h.qkey != GSI_QKEY {
        return bad(hca, "a GMP to QP1 without the Q_Key 0x80010000");
    }
    if u64::from(h.pkt_words) * 4 != h.len as u64 + payload + u64::from(h.pad) + 4
        || !(payload + u64::from(h.pad)).is_multiple_of(4)
    {
        return bad(
            hca,
            "LRH packet length does not match header + payload + pad + ICRC",
        );
    }
    if h.dlid == PERMISSIVE_LID {
        let mut cls = [0u8; 2];
        let class_ok = is_qp0
            && xlate::gather(hca, &segs[..ns], &hdr_inline, 0, &mut cls).is_ok()
            && cls[1] == 0x81;
        if !class_ok {
            return bad(hca, "permissive DLID on anything but a directed-route SMP");
        }
        if !mlx.slr {
            return bad(hca, "permissive DLID without SLR in the MLX segment");
        }
    }
    let port = q.port;
    let Some(pi) = hca.port_index(u32::from(port)) else {
        return Outcome::Fail(Syndrome::LocalQpOp);
    };
    if !is_qp0 && !hca.ports[pi].pkeys.iter().any(|&p| p != 0 && p == h.pkey) {
        return bad(hca, "BTH P_Key is not in the port's P_Key table");
    }
    let (state, lid, _) = port_state(hca, port).unwrap_or((LogicalState::Down, 0, 0));
    let up = if is_qp0 {
        state >= LogicalState::Init
    } else {
        state == LogicalState::Active
    };
    let slid = if mlx.slr {
        h.slid
    } else {
        lid | (h.slid & u16::from(lmc_mask(hca, port)))
    };
    let local = up && (mlx.force_lb || is_local(hca, port, h.dlid));
    if local {
        let base = hca.special_qp_base;
        let dst = if h.dqpn == 0 {
            base + u32::from(port) - 1
        } else if h.dqpn == 1 {
            base + 2 + u32::from(port) - 1
        } else {
            h.dqpn
        };
        let m = Msg {
            kind: Kind::Send,
            st: st::MLX,
            src_qpn: h.sqpn,
            dst_qpn: dst,
            port,
            len: payload,
            imm: h.imm,
            se: h.se,
            raddr: 0,
            rkey: 0,
            swap: 0,
            cmp: 0,
            slid,
            dlid: h.dlid,
            sl: h.sl,
            pkey: h.pkey,
            qkey: h.qkey,
            grh: h.grh,
            npkts: 1,
            inv: None,
        };
        mad_deliver(hca, &m, &segs[..ns], &hdr_inline, is_qp0);
    } else if up && super::wire::attached(hca, port) {
        let mut body = vec![0u8; payload as usize];
        if xlate::gather(hca, &segs[..ns], &hdr_inline, 0, &mut body).is_err() {
            return Outcome::Fail(Syndrome::LocalProt);
        }
        let grh = h
            .grh
            .and_then(|g| crate::fabric::packet::Grh::parse(&g).ok());
        let hd = crate::fabric::packet::Headers {
            lrh: crate::fabric::packet::Lrh {
                vl: h.vl,
                sl: h.sl,
                dlid: h.dlid,
                slid,
                ..Default::default()
            },
            grh,
            bth: crate::fabric::packet::Bth {
                opcode: if h.imm.is_some() {
                    crate::fabric::packet::opcode::UD_SEND_ONLY_IMM
                } else {
                    crate::fabric::packet::opcode::UD_SEND_ONLY
                },
                se: h.se,
                pkey: h.pkey,
                dest_qp: h.dqpn,
                psn: h.psn,
                ..Default::default()
            },
            deth: Some(crate::fabric::packet::Deth {
                qkey: h.qkey,
                src_qp: h.sqpn,
            }),
            imm: h.imm,
            ..Default::default()
        };
        match crate::fabric::packet::build(&hd, &body) {
            Ok(b) => {
                super::wire::transmit(hca, port, b);
            }
            Err(e) => return bad(hca, &format!("the header does not make a packet: {e}")),
        }
    } else if !up {
        // The port cannot send (QP0: link not up; QP1: not Active): the
        // card completes the WQE and discards the packet at the port.
        let c = &mut hca.ports[pi].counters;
        c.xmit_discards = c.xmit_discards.saturating_add(1);
    }
    let _ = ctrl;
    Outcome::Done {
        byte_cnt: payload as u32,
    }
}

/// A MAD arriving at QP0/QP1 `m.dst_qpn`: dropped unless that QP is ready
/// (VL15Dropped counts dropped SMPs).
pub(super) fn mad_deliver(hca: &mut Hca, m: &Msg, src: &[Seg], inline: &[u8], smp: bool) {
    let ready = matches!(
        qp_state(hca, m.dst_qpn),
        Some(QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqer)
    );
    let d = hca.engine.qps.get(&m.dst_qpn).cloned();
    let dropped = match d {
        Some(d) if ready && d.st == st::MLX => {
            let ok = smp
                || hca.ports[hca.port_index(u32::from(d.port)).unwrap_or(0)]
                    .pkeys
                    .iter()
                    .any(|&p| pkey_match(p, m.pkey));
            !ok || !matches!(receive(hca, &d, m, src, inline, true), Resp::Ack)
        }
        _ => true,
    };
    if dropped
        && smp
        && let Some(i) = hca.port_index(u32::from(m.port))
    {
        let c = &mut hca.ports[i].counters;
        c.vl15_dropped = c.vl15_dropped.saturating_add(1);
    }
}

// ------------------------------------------------------------------ errors

/// Moves `qpn` to ERR (or SQER for a send-side error on UD/UC/MLX) and
/// flushes.
pub fn enter_error(hca: &mut Hca, qpn: u32, send_error: Option<Syndrome>) {
    let Some(st_) = hca.engine.qps.get(&qpn).map(|q| q.st) else {
        return;
    };
    let to = if send_error.is_some() && st_ != st::RC {
        QpState::Sqer
    } else {
        QpState::Err
    };
    let was = qp_state(hca, qpn);
    if let Some(r) = hca.qps.get_mut(&qpn) {
        if r.state == QpState::Err {
            // Already there; only flush.
        } else {
            r.state = to;
        }
    }
    if let Some(q) = hca.engine.qps.get_mut(&qpn) {
        q.wait = None;
        q.retrying = false;
    }
    if let Some(w) = hca.engine.windows.get_mut(&qpn) {
        // Every message in flight is flushed with the rest of the SQ.
        w.txq.clear();
        w.resend = None;
        w.ack_due = None;
        w.seq_nak = None;
        w.drain_event = false;
    }
    flush_sq(hca, qpn);
    if qp_state(hca, qpn) == Some(QpState::Err) {
        flush_rq(hca, qpn);
        let srq = hca.engine.qps.get(&qpn).and_then(|q| q.srq);
        if srq.is_some() && was != Some(QpState::Err) {
            hca.post_async(Event::Qp {
                kind: eqe::SRQ_QP_LAST_WQE,
                qpn,
            });
        }
        watch(hca, qpn);
    }
}

/// Completes every hardware-owned SQ WQE with WR_FLUSH_ERR.
pub fn flush_sq(hca: &mut Hca, qpn: u32) -> u32 {
    let Some(q) = hca.engine.qps.get(&qpn) else {
        return 0;
    };
    let (cnt, scq) = (q.sq_cnt, q.scq);
    let mut n = 0;
    for _ in 0..cnt {
        let Some(q) = hca.engine.qps.get(&qpn) else {
            break;
        };
        let idx = q.sq_ci;
        let parity = idx & q.sq_cnt != 0;
        let Some(addr) = q.sq_wqe(idx) else { break };
        let mut b = [0u8; 4];
        if hca.dma_read(addr, &mut b).is_err() || (b[0] & 0x80 != 0) != parity {
            break;
        }
        advance(hca, qpn);
        let c = Cqe {
            qpn,
            send: true,
            wqe_counter: idx as u16,
            error: Some(Syndrome::WrFlush),
            ..Cqe::default()
        };
        cq::push(hca, scq, &c);
        n += 1;
    }
    hca.engine.stats.flushed += u64::from(n);
    n
}

/// Completes every posted receive WQE (own RQ only) with WR_FLUSH_ERR.
pub fn flush_rq(hca: &mut Hca, qpn: u32) -> u32 {
    let Some(q) = hca.engine.qps.get(&qpn).cloned() else {
        return 0;
    };
    if q.srq.is_some() || q.rq_cnt == 0 {
        return 0;
    }
    let mut d = [0u8; 4];
    if hca.dma_read(q.db_rec, &mut d).is_err() {
        return 0;
    }
    let head = (u32::from_be_bytes(d) & 0xffff) as u16;
    let pending = head.wrapping_sub(q.rq_ci).min(q.rq_cnt as u16);
    for k in 0..pending {
        let c = Cqe {
            qpn,
            wqe_counter: q.rq_ci.wrapping_add(k),
            error: Some(Syndrome::WrFlush),
            ..Cqe::default()
        };
        cq::push(hca, q.rcq, &c);
    }
    if let Some(qm) = hca.engine.qps.get_mut(&qpn) {
        qm.rq_ci = q.rq_ci.wrapping_add(pending);
    }
    hca.engine.stats.flushed += u64::from(pending);
    u32::from(pending)
}
