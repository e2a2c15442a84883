//! The requester on the wire.
//!
//! A message's packets (RC and UC segmented at the path MTU, UD datagrams, the MADs
//! of QP0/QP1), the RC send window with its retransmissions, and the responses it
//! takes back (ACK, NAK, RNR NAK, READ responses, atomic ACKs) to complete the WQEs
//! in order.

use super::*;

/// The WQE a message comes from.
#[derive(Debug, Clone, Copy)]
pub(in crate::hca::engine) struct WqeRef {
    pub(in crate::hca::engine) idx: u32,
    pub(in crate::hca::engine) opcode: u8,
    pub(in crate::hca::engine) signalled: bool,
}

/// A retransmission (go-back-N): packet `from` on of the message whose
/// first PSN is `first_psn` and which uses `npkts` PSNs.
#[derive(Debug, Clone, Copy)]
pub(in crate::hca::engine) struct Retx {
    pub(in crate::hca::engine) first_psn: u32,
    pub(in crate::hca::engine) npkts: u32,
    pub(in crate::hca::engine) from: u32,
}

/// Counts a packet the port could not send (not Active).
pub(super) fn discard(hca: &mut Hca, port: u8) {
    if let Some(i) = hca.port_index(u32::from(port)) {
        let c = &mut hca.ports[i].counters;
        c.xmit_discards = c.xmit_discards.saturating_add(1);
    }
}

/// The requester's packets for one message of QP `q` (`retx`: again, from
/// a packet on). An RC message joins the send window ([`Outcome::Sent`]);
/// UD and UC complete at once.
#[allow(clippy::too_many_arguments)]
pub(in crate::hca::engine) fn send(
    hca: &mut Hca,
    q: &QpEng,
    m: &Msg,
    segs: &[Seg],
    inline: &[u8],
    w: WqeRef,
    mtu: u64,
    retx: Option<Retx>,
) -> Outcome {
    let port = m.port;
    // A port that is not Active sends nothing: the packets are discarded
    // there (and an RC message waits for its ACK timeout like a lost one).
    let up = exec::port_state(hca, port).is_some_and(|(s, _, _)| s == LogicalState::Active);
    let psn0 = match retx {
        Some(r) => r.first_psn,
        None => hca.engine.qps.get(&q.qpn).map_or(0, |x| x.sq_psn),
    };
    let base = Headers {
        lrh: Lrh {
            vl: 0,
            sl: m.sl,
            dlid: m.dlid,
            slid: m.slid,
            ..Lrh::default()
        },
        bth: Bth {
            pkey: m.pkey,
            dest_qp: m.dst_qpn,
            ..Bth::default()
        },
        // RoCE: the Ethernet header and the (mandatory) GRH.
        eth: m.eth,
        grh: m.eth.and(m.grh).and_then(|g| packet::Grh::parse(&g).ok()),
        ..Headers::default()
    };
    if q.st == st::UD {
        let mut payload = vec![0u8; m.len.min(mtu) as usize];
        if xlate::gather(hca, segs, inline, 0, &mut payload).is_err() {
            return Outcome::Fail(Syndrome::LocalProt);
        }
        let mut hd = base;
        hd.bth.opcode = if m.imm.is_some() {
            opcode::UD_SEND_ONLY_IMM
        } else {
            opcode::UD_SEND_ONLY
        };
        hd.bth.se = m.se;
        hd.bth.psn = psn0;
        hd.deth = Some(Deth {
            qkey: m.qkey,
            src_qp: m.src_qpn,
        });
        hd.imm = m.imm;
        // The AV's GRH goes on the wire (LNH = IBA global); the build
        // recomputes its PayLen.
        hd.grh = m.grh.and_then(|g| packet::Grh::parse(&g).ok());
        if up {
            send_packet(hca, port, &hd, &payload);
        } else {
            discard(hca, port);
        }
        bump_psn(hca, q.qpn, 1);
        return Outcome::Done {
            byte_cnt: m.len as u32,
        };
    }
    let t = if q.st == st::RC {
        opcode::RC
    } else {
        opcode::UC
    };
    let npkts = match m.kind {
        Kind::CmpSwap | Kind::FetchAdd => 1,
        _ => m.len.div_ceil(mtu).max(1) as u32,
    };
    let from = retx.map_or(0, |r| r.from);
    if let Some(r) = retx
        && (r.npkts != npkts || from >= npkts)
    {
        hca.violation(format!(
            "QP {:#x} SQ WQE {}: changed while in flight ({} packets when sent, {npkts} now)",
            q.qpn, w.idx, r.npkts
        ));
        return Outcome::Fail(Syndrome::LocalQpOp);
    }
    match m.kind {
        Kind::Send | Kind::Write => {
            let send = m.kind == Kind::Send;
            for k in from..npkts {
                let off = u64::from(k) * mtu;
                let n = (m.len - off.min(m.len)).min(mtu) as usize;
                let (first, last) = (k == 0, k + 1 == npkts);
                let o = match (send, first, last, m.imm.is_some()) {
                    (true, true, true, false) => opcode::SEND_ONLY,
                    (true, true, true, true) => opcode::SEND_ONLY_IMM,
                    (true, true, false, _) => opcode::SEND_FIRST,
                    (true, false, false, _) => opcode::SEND_MIDDLE,
                    (true, false, true, false) => opcode::SEND_LAST,
                    (true, false, true, true) => opcode::SEND_LAST_IMM,
                    (false, true, true, false) => opcode::RDMA_WRITE_ONLY,
                    (false, true, true, true) => opcode::RDMA_WRITE_ONLY_IMM,
                    (false, true, false, _) => opcode::RDMA_WRITE_FIRST,
                    (false, false, false, _) => opcode::RDMA_WRITE_MIDDLE,
                    (false, false, true, false) => opcode::RDMA_WRITE_LAST,
                    (false, false, true, true) => opcode::RDMA_WRITE_LAST_IMM,
                };
                // SEND with Invalidate: its last packet carries the R_Key
                // in an IETH (IBTA 9.4.1.1; opcodes 0x16/0x17).
                let o = match m.inv {
                    Some(_) if send && last && first => opcode::SEND_ONLY_INV,
                    Some(_) if send && last => opcode::SEND_LAST_INV,
                    _ => o,
                };
                if !up {
                    discard(hca, port);
                    continue;
                }
                let mut hd = base;
                hd.bth.opcode = t | o;
                hd.bth.psn = psn0.wrapping_add(k) & PSN_MASK;
                hd.bth.ack_req = last && q.st == st::RC;
                hd.bth.se = last && m.se;
                if last {
                    hd.imm = m.imm;
                    hd.ieth = m.inv;
                }
                if !send && first {
                    hd.reth = Some(Reth {
                        va: m.raddr,
                        rkey: m.rkey,
                        dma_len: m.len as u32,
                    });
                }
                // The payload is gathered straight into the packet.
                let mut b = buffer(hca);
                let mut gathered = true;
                let built = packet::build_owed_with(&hd, n, &mut b, |p| {
                    gathered = xlate::gather(hca, segs, inline, off, p).is_ok();
                });
                if !gathered {
                    return Outcome::Fail(Syndrome::LocalProt);
                }
                match built {
                    Ok(()) => {
                        transmit_owed(hca, port, b);
                    }
                    Err(e) => unbuilt(hca, port, &hd, b, &e),
                }
            }
        }
        Kind::Read => {
            // A retransmission asks for the responses not yet received
            // (IBTA 9.7: the READ restarts at their first PSN with
            // the address and length that remain).
            let off = (u64::from(from) * mtu).min(m.len);
            let mut hd = base;
            hd.bth.opcode = t | opcode::RDMA_READ_REQUEST;
            hd.bth.psn = psn0.wrapping_add(from) & PSN_MASK;
            hd.bth.ack_req = true;
            hd.reth = Some(Reth {
                va: m.raddr.wrapping_add(off),
                rkey: m.rkey,
                dma_len: (m.len - off) as u32,
            });
            if up {
                send_packet(hca, port, &hd, &[]);
            } else {
                discard(hca, port);
            }
        }
        Kind::CmpSwap | Kind::FetchAdd => {
            let mut hd = base;
            hd.bth.opcode = t | if m.kind == Kind::CmpSwap {
                opcode::COMPARE_SWAP
            } else {
                opcode::FETCH_ADD
            };
            hd.bth.psn = psn0;
            hd.bth.ack_req = true;
            hd.atomic_eth = Some(AtomicEth {
                va: m.raddr,
                rkey: m.rkey,
                swap_add: m.swap,
                compare: m.cmp,
            });
            if up {
                send_packet(hca, port, &hd, &[]);
            } else {
                discard(hca, port);
            }
        }
    }
    if retx.is_none() {
        bump_psn(hca, q.qpn, npkts);
    } else if let Some(x) = hca.engine.qps.get_mut(&q.qpn) {
        x.pkts_sent += u64::from(npkts - from);
    }
    if q.st != st::RC {
        return Outcome::Done {
            byte_cnt: m.len as u32,
        };
    }
    let now = hca.clock.now_ns();
    let win = hca.engine.windows.entry(q.qpn).or_default();
    match retx {
        None => win.txq.push_back(TxMsg {
            idx: w.idx,
            opcode: w.opcode,
            signalled: w.signalled,
            first_psn: psn0,
            npkts,
            len: m.len,
            segs: if matches!(m.kind, Kind::Read | Kind::CmpSwap | Kind::FetchAdd) {
                segs.to_vec()
            } else {
                Vec::new()
            },
            read_off: 0,
            state: TxState::Wire,
        }),
        Some(_) => {
            if let Some(e) = win.txq.iter_mut().find(|e| e.idx == w.idx)
                && m.kind == Kind::Read
            {
                e.read_off = u64::from(from) * mtu;
            }
        }
    }
    if win.ack_due.is_none() {
        win.ack_due = exec::ack_ns(q.ack_timeout).map(|t| now.saturating_add(t));
    }
    exec::watch(hca, q.qpn);
    Outcome::Sent
}

fn bump_psn(hca: &mut Hca, qpn: u32, n: u32) {
    if let Some(q) = hca.engine.qps.get_mut(&qpn) {
        q.sq_psn = (q.sq_psn + n) & PSN_MASK;
        q.pkts_sent += u64::from(n);
    }
}

/// The window has room for a new WQE with control segment `ctrl` on QP
/// `qpn`: nothing failed before it, no go-back-N under way, fewer than
/// [`WINDOW_PKTS`] PSNs unacknowledged; a READ or atomic only below
/// max_rd_atomic (the requester never exceeds the limit it
/// negotiated), and a fenced WQE only when no READ or atomic is
/// outstanding (the fence indicator, IBTA ch. 10).
pub(in crate::hca::engine) fn may_start(
    hca: &Hca,
    qpn: u32,
    ctrl: &crate::hca::engine::wqe::Ctrl,
) -> bool {
    let Some(w) = hca.engine.windows.get(&qpn) else {
        return true;
    };
    let Some(head) = w.txq.iter().find(|e| e.npkts > 0) else {
        return w.txq.iter().all(|e| !matches!(e.state, TxState::Failed(_)));
    };
    let Some(q) = hca.engine.qps.get(&qpn) else {
        return false;
    };
    if w.resend.is_some()
        || w.txq
            .back()
            .is_some_and(|e| matches!(e.state, TxState::Failed(_)))
        || psn_diff(q.sq_psn, head.first_psn) >= WINDOW_PKTS
    {
        return false;
    }
    let rd = matches!(
        ctrl.opcode,
        crate::hca::engine::wqe::op::RDMA_READ
            | crate::hca::engine::wqe::op::ATOMIC_CS
            | crate::hca::engine::wqe::op::ATOMIC_FA
    );
    if rd || ctrl.fence {
        let out = w
            .txq
            .iter()
            .filter(|e| e.rd_atomic() && e.state == TxState::Wire)
            .count();
        if (ctrl.fence && out > 0) || (rd && out >= 1usize << q.sra_max) {
            return false;
        }
    }
    true
}

/// The window of `qpn` holds messages (a new WQE's completion must wait
/// for theirs).
pub(in crate::hca::engine) fn busy(hca: &Hca, qpn: u32) -> bool {
    hca.engine
        .windows
        .get(&qpn)
        .is_some_and(|w| !w.txq.is_empty())
}

/// A WQE that completed without the wire while older messages are in
/// flight: it waits in the window for its turn.
pub(in crate::hca::engine) fn queue_local(
    hca: &mut Hca,
    qpn: u32,
    idx: u32,
    ctrl_opcode: u8,
    signalled: bool,
    state: TxState,
) {
    let psn = hca.engine.qps.get(&qpn).map_or(0, |q| q.sq_psn);
    hca.engine
        .windows
        .entry(qpn)
        .or_default()
        .txq
        .push_back(TxMsg {
            idx,
            opcode: ctrl_opcode,
            signalled,
            first_psn: psn,
            npkts: 0,
            len: 0,
            segs: Vec::new(),
            read_off: 0,
            state,
        });
}

/// The retransmission of WQE `idx` from `psn`, if that WQE is still in
/// flight (else the go-back-N cursor moves on or ends).
pub(in crate::hca::engine) fn retx_for(
    hca: &mut Hca,
    qpn: u32,
    idx: u32,
    psn: u32,
) -> Option<Retx> {
    let w = hca.engine.windows.get_mut(&qpn)?;
    let r = w
        .txq
        .iter()
        .find(|e| e.idx == idx && e.state == TxState::Wire)
        .map(|e| Retx {
            first_psn: e.first_psn,
            npkts: e.npkts,
            from: psn_diff(psn, e.first_psn).min(e.npkts.saturating_sub(1)),
        });
    if r.is_none() {
        w.resend = next_after(w, idx);
    }
    r
}

/// The go-back-N cursor after WQE `idx`: the next message on the wire.
fn next_after(w: &Window, idx: u32) -> Option<(u32, u32)> {
    let pos = w.txq.iter().position(|e| e.idx == idx)?;
    w.txq
        .iter()
        .skip(pos + 1)
        .find(|e| e.state == TxState::Wire && e.npkts > 0)
        .map(|e| (e.idx, e.first_psn))
}

/// WQE `idx` went out again: the cursor moves to the next message.
pub(in crate::hca::engine) fn resent(hca: &mut Hca, qpn: u32, idx: u32) {
    if let Some(w) = hca.engine.windows.get_mut(&qpn) {
        w.resend = next_after(w, idx);
    }
}

/// The message of WQE `idx` failed (`s`): it completes in error when its
/// turn comes, and nothing after it goes out again.
pub(in crate::hca::engine) fn fail_entry(hca: &mut Hca, qpn: u32, idx: u32, s: Syndrome) {
    if let Some(w) = hca.engine.windows.get_mut(&qpn) {
        w.resend = None;
        if let Some(e) = w.txq.iter_mut().find(|e| e.idx == idx) {
            e.state = TxState::Failed(s);
        }
    }
    retire(hca, qpn);
}

/// The local ACK timer of `qpn` expired: a retransmission from the oldest
/// unacknowledged PSN (counted against retry_cnt), or, with no retries
/// left, "transport retry counter exceeded" for that message.
pub fn ack_timeout(hca: &mut Hca, qpn: u32) {
    let Some(mtu) = hca.engine.qps.get(&qpn).map(|q| q.mtu_bytes()) else {
        return;
    };
    let Some(w) = hca.engine.windows.get_mut(&qpn) else {
        return;
    };
    w.ack_due = None;
    let Some(head) = w.txq.iter().find(|e| e.state == TxState::Wire) else {
        return;
    };
    let (idx, psn) = (head.idx, head.resume_psn(mtu));
    go_back(hca, qpn, idx, psn);
    exec::process_sq(hca, qpn);
}

/// A retransmission event (timeout, sequence NAK, implied NAK): counted
/// against the retry counter (IBTA 9.7.5: reset whenever a response
/// makes progress); with none left, the message of WQE `idx` fails with
/// "transport retry counter exceeded".
fn go_back(hca: &mut Hca, qpn: u32, idx: u32, psn: u32) {
    let Some(q) = hca.engine.qps.get_mut(&qpn) else {
        return;
    };
    if q.retry_left == 0 {
        fail_entry(hca, qpn, idx, Syndrome::RetryExceeded);
        return;
    }
    q.retry_left -= 1;
    if let Some(w) = hca.engine.windows.get_mut(&qpn) {
        w.resend = Some((idx, psn));
        w.ack_due = None;
    }
}

/// Completes the finished messages at the head of `qpn`'s window, in
/// order: a CQE for each done one that is signalled, and for a failed one
/// its error CQE and the error state (which flushes the rest).
pub(in crate::hca::engine) fn retire(hca: &mut Hca, qpn: u32) {
    loop {
        let Some(w) = hca.engine.windows.get_mut(&qpn) else {
            return;
        };
        let r = match w.txq.front().map(|e| e.state) {
            Some(TxState::Done(b)) => Ok(b),
            Some(TxState::Failed(s)) => Err(s),
            _ => return,
        };
        let Some(e) = w.txq.pop_front() else { return };
        let drained = w.txq.is_empty() && core::mem::take(&mut w.drain_event);
        if w.txq.is_empty() {
            w.resend = None;
            w.ack_due = None;
            w.seq_nak = None;
        }
        complete(hca, qpn, &e, r);
        if r.is_err() {
            return;
        }
        if drained && exec::qp_state(hca, qpn) == Some(QpState::Sqd) {
            hca.post_async(crate::hca::ctx::Event::Qp {
                kind: eqe::SQ_DRAINED,
                qpn,
            });
        }
    }
}

/// Messages whose last PSN is before `psn` (`inclusive`: at or before)
/// are acknowledged: a SEND or WRITE is done; a READ or atomic still
/// waiting for its response means that response was lost (IBTA 9.7.5,
/// an implied NAK): its WQE and resume PSN come back. Says whether
/// anything was acknowledged; progress resets the retry counters.
fn ack_upto(
    hca: &mut Hca,
    qpn: u32,
    psn: u32,
    inclusive: bool,
    oldest: u32,
    mtu: u64,
) -> (bool, Option<(u32, u32)>) {
    let Some(w) = hca.engine.windows.get_mut(&qpn) else {
        return (false, None);
    };
    let at = psn_diff(psn, oldest);
    let mut progress = false;
    let mut implied = None;
    for e in w.txq.iter_mut() {
        if e.npkts == 0 || e.state != TxState::Wire {
            continue;
        }
        let last = psn_diff(e.last_psn(), oldest);
        if !(last < at || (inclusive && last == at)) {
            break;
        }
        if e.rd_atomic() {
            implied = Some((e.idx, e.resume_psn(mtu)));
            break;
        }
        e.state = TxState::Done(e.len as u32);
        progress = true;
    }
    if progress {
        made_progress(hca, qpn);
    }
    (progress, implied)
}

/// A response made progress: the retry counters start again (IBTA
/// 9.7.5.1), and so does a sequence NAK's guard.
fn made_progress(hca: &mut Hca, qpn: u32) {
    if let Some(q) = hca.engine.qps.get_mut(&qpn) {
        q.retry_left = q.retry_cnt;
        q.rnr_left = q.rnr_retry;
    }
    if let Some(w) = hca.engine.windows.get_mut(&qpn) {
        w.seq_nak = None;
    }
}

/// The message of the window in state Wire that PSN `psn` belongs to.
fn entry_at(hca: &mut Hca, qpn: u32, psn: u32) -> Option<&mut TxMsg> {
    hca.engine
        .windows
        .get_mut(&qpn)?
        .txq
        .iter_mut()
        .find(|e| e.state == TxState::Wire && e.contains(psn))
}

/// A response for RC QP `qpn` (the requester).
pub(super) fn response(hca: &mut Hca, qpn: u32, h: &Headers, payload: &[u8]) {
    let Some(q) = hca.engine.qps.get(&qpn) else {
        return;
    };
    let (mtu, next) = (q.mtu_bytes(), q.sq_psn);
    let Some(oldest) = hca
        .engine
        .windows
        .get(&qpn)
        .and_then(|w| w.txq.iter().find(|e| e.npkts > 0))
        .map(|e| e.first_psn)
    else {
        return; // nothing outstanding: a late duplicate
    };
    let psn = h.bth.psn;
    // A response can only be for a PSN sent and not yet acknowledged;
    // anything else is a stale duplicate (or a forgery) and is dropped.
    if psn_diff(psn, oldest) >= psn_diff(next, oldest) {
        return;
    }
    let op = h.bth.opcode & 0x1f;
    let mut progress = false;
    let mut implied = None;
    match op {
        opcode::ACKNOWLEDGE => {
            let Some(a) = h.aeth else { return };
            let kind = aeth::kind(a.syndrome);
            (progress, implied) = ack_upto(hca, qpn, psn, kind == 0, oldest, mtu);
            if implied.is_none() {
                match kind {
                    1 => rnr_nak(hca, qpn, psn, a.syndrome),
                    3 => nak(hca, qpn, psn, a.syndrome),
                    _ => {}
                }
            }
        }
        opcode::RDMA_READ_RESPONSE_FIRST
        | opcode::RDMA_READ_RESPONSE_MIDDLE
        | opcode::RDMA_READ_RESPONSE_LAST
        | opcode::RDMA_READ_RESPONSE_ONLY
        | opcode::ATOMIC_ACKNOWLEDGE => {
            // A response implies the ACK of every request before it.
            let Some(first) = entry_at(hca, qpn, psn).map(|e| e.first_psn) else {
                return;
            };
            (progress, implied) = ack_upto(hca, qpn, first, false, oldest, mtu);
            if implied.is_none() {
                progress |= if op == opcode::ATOMIC_ACKNOWLEDGE {
                    atomic_ack(hca, qpn, psn, h)
                } else {
                    read_resp(hca, qpn, psn, op, payload, mtu)
                };
            }
        }
        _ => {}
    }
    if let Some((idx, p)) = implied {
        go_back(hca, qpn, idx, p);
    }
    if progress {
        let now = hca.clock.now_ns();
        let t = hca
            .engine
            .qps
            .get(&qpn)
            .and_then(|q| exec::ack_ns(q.ack_timeout));
        if let Some(w) = hca.engine.windows.get_mut(&qpn) {
            w.ack_due = match t {
                Some(t) if w.on_wire() && w.resend.is_none() => Some(now.saturating_add(t)),
                _ => None,
            };
        }
    }
    retire(hca, qpn);
    exec::process_sq(hca, qpn);
}

/// An RNR NAK for PSN `psn`: the requester waits the responder's RNR timer
/// and then resends from that PSN (counted against rnr_retry; 7 retries
/// for ever).
fn rnr_nak(hca: &mut Hca, qpn: u32, psn: u32, syndrome: u8) {
    let Some(idx) = entry_at(hca, qpn, psn).map(|e| e.idx) else {
        return;
    };
    let now = hca.clock.now_ns();
    let Some(q) = hca.engine.qps.get_mut(&qpn) else {
        return;
    };
    if q.rnr_retry != 7 {
        if q.rnr_left == 0 {
            fail_entry(hca, qpn, idx, Syndrome::RnrRetryExceeded);
            return;
        }
        q.rnr_left -= 1;
    }
    q.wait = Some(Wait {
        until_ns: now.saturating_add(exec::rnr_ns(syndrome & 0x1f)),
        kind: WaitKind::Rnr,
    });
    if let Some(w) = hca.engine.windows.get_mut(&qpn) {
        w.resend = Some((idx, psn));
        w.ack_due = None;
    }
    exec::watch(hca, qpn);
}

/// A NAK for PSN `psn`: a sequence error goes back to that PSN (once per
/// PSN); any other NAK completes its message in error.
fn nak(hca: &mut Hca, qpn: u32, psn: u32, syndrome: u8) {
    let Some(idx) = entry_at(hca, qpn, psn).map(|e| e.idx) else {
        return;
    };
    let s = match syndrome {
        aeth::NAK_PSN_SEQ_ERROR => {
            let Some(w) = hca.engine.windows.get_mut(&qpn) else {
                return;
            };
            if w.seq_nak == Some(psn) {
                return;
            }
            w.seq_nak = Some(psn);
            go_back(hca, qpn, idx, psn);
            return;
        }
        aeth::NAK_INVALID_REQUEST => Syndrome::RemoteInvalidReq,
        aeth::NAK_REMOTE_ACCESS => Syndrome::RemoteAccess,
        aeth::NAK_REMOTE_OP => Syndrome::RemoteOp,
        _ => Syndrome::BadResp,
    };
    fail_entry(hca, qpn, idx, s);
}

/// A READ response packet; true if it made progress.
fn read_resp(hca: &mut Hca, qpn: u32, psn: u32, op: u8, payload: &[u8], mtu: u64) -> bool {
    let Some(e) = entry_at(hca, qpn, psn) else {
        return false;
    };
    if e.opcode != crate::hca::engine::wqe::op::RDMA_READ {
        e.state = TxState::Failed(Syndrome::BadResp);
        return false;
    }
    let k = psn_diff(psn, e.first_psn);
    if u64::from(k) * mtu != e.read_off {
        return false; // out of order: a response was lost, the timer resends
    }
    if e.read_off + payload.len() as u64 > e.len {
        e.state = TxState::Failed(Syndrome::BadResp);
        return false;
    }
    let (read_off, segs) = (e.read_off, core::mem::take(&mut e.segs));
    let ok = xlate::scatter(hca, &segs, read_off, payload).is_ok();
    let Some(e) = entry_at(hca, qpn, psn) else {
        return false;
    };
    e.segs = segs;
    if !ok {
        e.state = TxState::Failed(Syndrome::LocalProt);
        return false;
    }
    e.read_off += payload.len() as u64;
    if matches!(
        op,
        opcode::RDMA_READ_RESPONSE_LAST | opcode::RDMA_READ_RESPONSE_ONLY
    ) {
        e.state = if e.read_off == e.len {
            TxState::Done(e.len as u32)
        } else {
            TxState::Failed(Syndrome::BadResp)
        };
    }
    made_progress(hca, qpn);
    true
}

/// An atomic ACKNOWLEDGE; true if it made progress.
fn atomic_ack(hca: &mut Hca, qpn: u32, psn: u32, h: &Headers) -> bool {
    let Some(orig) = h.atomic_ack else {
        return false;
    };
    let Some(e) = entry_at(hca, qpn, psn) else {
        return false;
    };
    if !matches!(
        e.opcode,
        crate::hca::engine::wqe::op::ATOMIC_CS | crate::hca::engine::wqe::op::ATOMIC_FA
    ) {
        e.state = TxState::Failed(Syndrome::BadResp);
        return false;
    }
    let segs = core::mem::take(&mut e.segs);
    let ok = xlate::scatter(hca, &segs, 0, &orig.to_be_bytes()).is_ok();
    let Some(e) = entry_at(hca, qpn, psn) else {
        return false;
    };
    e.segs = segs;
    e.state = if ok {
        TxState::Done(8)
    } else {
        TxState::Failed(Syndrome::LocalProt)
    };
    made_progress(hca, qpn);
    true
}

/// Completes the oldest message of the window (a CQE if signalled or in
/// error; an error moves the QP to ERR, which flushes the rest).
fn complete(hca: &mut Hca, qpn: u32, tx: &TxMsg, r: Result<u32, Syndrome>) {
    let scq = exec::advance(hca, qpn);
    hca.engine.stats.executed += 1;
    match r {
        Ok(byte_cnt) => {
            if tx.signalled {
                let c = Cqe {
                    qpn,
                    send: true,
                    opcode: tx.opcode,
                    byte_cnt,
                    wqe_counter: tx.idx as u16,
                    ..Cqe::default()
                };
                cq::push(hca, scq, &c);
            }
        }
        Err(s) => {
            let c = Cqe {
                qpn,
                send: true,
                wqe_counter: tx.idx as u16,
                error: Some(s),
                ..Cqe::default()
            };
            cq::push(hca, scq, &c);
            exec::enter_error(hca, qpn, Some(s));
        }
    }
}
