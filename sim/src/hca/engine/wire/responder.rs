//! The responder on the wire.
//!
//! Each request checked against the expected PSN, duplicates answered from the
//! resources kept for them, messages reassembled straight into host memory, and the
//! ACK, NAK, RNR NAK, READ responses or atomic ACK the requester is owed.

use super::*;

/// The ATOMIC ACKNOWLEDGE of the atomic at `psn` with its original value
/// `v` (first execution and a duplicate's replay alike).
fn reply_atomic(hca: &mut Hca, d: &QpEng, h: &Headers, psn: u32, v: u64) {
    let a = Aeth {
        syndrome: aeth::ack(0x1f),
        msn: 0,
    };
    let r = Response {
        op: opcode::ATOMIC_ACKNOWLEDGE,
        psn,
        aeth: Some(a),
        atomic_ack: Some(v),
    };
    reply(hca, d, h, r, &[]);
}

/// What a response packet carries beside its payload: its opcode (RC), PSN
/// and extended headers.
#[derive(Debug, Clone, Copy)]
struct Response {
    op: u8,
    psn: u32,
    aeth: Option<Aeth>,
    atomic_ack: Option<u64>,
}

/// Builds response `r` to request `req` with `payload` and sends it from
/// responder QP `d`.
fn reply(hca: &mut Hca, d: &QpEng, req: &Headers, r: Response, payload: &[u8]) {
    let (lid, lmc) = exec::port_state(hca, d.port).map_or((0, 0), |(_, l, m)| (l, m));
    let mask = (1u16 << lmc.min(7)) - 1;
    // RoCE: the responder's own path addresses the answer.
    let roce = match d.roce {
        Some(_) => match super::super::eth::path_link(hca, d) {
            Ok(l) => Some(l),
            Err(why) => {
                hca.violation(format!("QP {:#x}: no RoCE answer: {why}", d.qpn));
                return;
            }
        },
        None => None,
    };
    let hd = Headers {
        lrh: Lrh {
            vl: 0,
            sl: req.lrh.sl,
            dlid: req.lrh.slid,
            slid: lid | (req.lrh.dlid & mask),
            ..Lrh::default()
        },
        bth: Bth {
            opcode: opcode::RC | r.op,
            pkey: exec::pkey_at(hca, d.port, d.pkey_index),
            dest_qp: d.remote_qpn,
            psn: r.psn & 0xff_ffff,
            ..Bth::default()
        },
        aeth: r.aeth,
        atomic_ack: r.atomic_ack,
        eth: roce.map(|l| l.0),
        grh: roce.map(|l| l.1),
        ..Headers::default()
    };
    let mut hd = hd;
    if roce.is_some() {
        hd.lrh.sl = d.sl;
    }
    send_packet(hca, d.port, &hd, payload);
}

fn ack(hca: &mut Hca, d: &QpEng, req: &Headers, psn: u32, syndrome: u8) {
    let r = Response {
        op: opcode::ACKNOWLEDGE,
        psn,
        aeth: Some(Aeth { syndrome, msn: 0 }),
        atomic_ack: None,
    };
    reply(hca, d, req, r, &[]);
}

/// Sends the READ response for `len` bytes at `seg` starting at `psn`.
fn read_response(hca: &mut Hca, d: &QpEng, req: &Headers, psn: u32, seg: Seg, len: u64) {
    let mtu = d.mtu_bytes();
    let n = len.div_ceil(mtu).max(1) as u32;
    let mut buf = vec![0u8; len.min(mtu) as usize];
    for k in 0..n {
        let off = u64::from(k) * mtu;
        let c = (len - off.min(len)).min(mtu) as usize;
        buf.resize(c, 0);
        if c > 0 && xlate::gather(hca, &[seg], &[], off, &mut buf).is_err() {
            ack(hca, d, req, psn, aeth::NAK_REMOTE_OP);
            return;
        }
        let op = match (k == 0, k + 1 == n) {
            (true, true) => opcode::RDMA_READ_RESPONSE_ONLY,
            (true, false) => opcode::RDMA_READ_RESPONSE_FIRST,
            (false, false) => opcode::RDMA_READ_RESPONSE_MIDDLE,
            (false, true) => opcode::RDMA_READ_RESPONSE_LAST,
        };
        let a = (k == 0 || k + 1 == n).then_some(Aeth {
            syndrome: aeth::ack(0x1f),
            msn: 0,
        });
        let r = Response {
            op,
            psn: psn + k,
            aeth: a,
            atomic_ack: None,
        };
        reply(hca, d, req, r, &buf);
    }
}

fn nak_code(s: Syndrome) -> u8 {
    match s {
        Syndrome::RemoteAccess => aeth::NAK_REMOTE_ACCESS,
        Syndrome::RemoteOp => aeth::NAK_REMOTE_OP,
        _ => aeth::NAK_INVALID_REQUEST,
    }
}

/// An RNR NAK for `psn`: the request is not taken, and later ones are
/// dropped without another NAK until it comes again (as after a
/// sequence NAK: one NAK outstanding at a time).
fn rnr(hca: &mut Hca, d: &QpEng, req: &Headers, psn: u32, timer: u8) {
    if let Some(qm) = hca.engine.qps.get_mut(&d.qpn) {
        qm.nak_sent = true;
    }
    ack(hca, d, req, psn, aeth::rnr_nak(timer));
}

/// Keeps a READ/atomic responder resource (at most max_dest_rd_atomic:
/// the oldest goes).
fn keep_resource(hca: &mut Hca, qpn: u32, r: RdRes) {
    if let Some(qm) = hca.engine.qps.get_mut(&qpn) {
        let cap = 1usize << qm.rra_max.min(7);
        while qm.rd_res.len() >= cap {
            qm.rd_res.pop_front();
        }
        qm.rd_res.push_back(r);
    }
}

/// A duplicate request (PSN before the expected one, IBTA 9.7.5):
/// nothing is delivered again. A SEND or WRITE asking for an ACK gets the
/// ACK of the last PSN received; a READ is answered again from memory,
/// from its PSN on, if it lies within a READ this QP still keeps as a
/// responder resource; an atomic gets the result kept for it. A duplicate
/// READ or atomic the QP has no resource for is dropped.
fn duplicate(hca: &mut Hca, d: &QpEng, h: &Headers, op: u8, psn: u32, exp: u32, mtu: u64) {
    match op {
        opcode::RDMA_READ_REQUEST => {
            let Some(r) = h.reth else { return };
            let Some(res) = d
                .rd_res
                .iter()
                .find(|x| x.atomic.is_none() && psn_diff(psn, x.psn) < x.npkts.max(1))
            else {
                return;
            };
            let off = u64::from(psn_diff(psn, res.psn)) * mtu;
            let len = u64::from(r.dma_len);
            if r.va != res.va.wrapping_add(off) || off + len != res.len {
                return;
            }
            if len == 0 {
                read_response(hca, d, h, psn, Seg::default(), 0);
                return;
            }
            let xl = xlate::check_qp(
                hca,
                xlate::KeyUse::remote(d, r.rkey, Access::RemoteRead, r.va, len),
            );
            if let Ok(xl) = xl {
                let seg = Seg {
                    addr: r.va,
                    len,
                    xl: Some(xl),
                };
                read_response(hca, d, h, psn, seg, len);
            }
        }
        opcode::COMPARE_SWAP | opcode::FETCH_ADD => {
            if let Some(v) = d
                .rd_res
                .iter()
                .find(|x| x.psn == psn)
                .and_then(|x| x.atomic)
            {
                reply_atomic(hca, d, h, psn, v);
            }
        }
        _ => {
            if h.bth.ack_req {
                ack(hca, d, h, exp.wrapping_sub(1) & PSN_MASK, aeth::ack(0x1f));
            }
        }
    }
}

/// A request packet for responder QP `d`.
pub(super) fn request(hca: &mut Hca, port: u8, d: &QpEng, h: &Headers, payload: &[u8]) {
    let rc = d.st == st::RC;
    if !matches!(
        exec::qp_state(hca, d.qpn),
        Some(QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqer)
    ) || d.port != port
    {
        return;
    }
    if !exec::pkey_match(h.bth.pkey, exec::pkey_at(hca, d.port, d.pkey_index)) {
        if let Some(i) = hca.port_index(u32::from(port)) {
            let m = super::msg_from(h, d.st, d.remote_qpn, d.qpn, port, payload.len() as u64);
            exec::pkey_violation(hca, i, &m, d.qpn);
        }
        return;
    }
    let op = h.bth.opcode & 0x1f;
    let psn = h.bth.psn;
    let exp = d.rq_psn;
    let mtu = d.mtu_bytes();
    if rc && psn != exp {
        if psn_ge(psn, exp) {
            // Ahead of the expected PSN: a request was lost. One NAK per
            // gap (IBTA 9.7.5: after a sequence NAK the responder
            // drops new requests until the expected PSN comes).
            if !d.nak_sent {
                if let Some(qm) = hca.engine.qps.get_mut(&d.qpn) {
                    qm.nak_sent = true;
                }
                ack(hca, d, h, exp, aeth::NAK_PSN_SEQ_ERROR);
            }
            return;
        }
        duplicate(hca, d, h, op, psn, exp, mtu);
        return;
    }
    if rc
        && d.nak_sent
        && let Some(qm) = hca.engine.qps.get_mut(&d.qpn)
    {
        qm.nak_sent = false;
    }
    if !rc && let Some(qm) = hca.engine.qps.get_mut(&d.qpn) {
        qm.rq_psn = psn;
    }
    let is = |o: &[u8]| o.contains(&op);
    let only = is(&[
        opcode::SEND_ONLY,
        opcode::SEND_ONLY_IMM,
        opcode::SEND_ONLY_INV,
        opcode::RDMA_WRITE_ONLY,
        opcode::RDMA_WRITE_ONLY_IMM,
        opcode::RDMA_READ_REQUEST,
        opcode::COMPARE_SWAP,
        opcode::FETCH_ADD,
    ]);
    let st_ = d.st;
    let src = [inline_seg(payload.len())];
    if only {
        let mut m = msg_from(h, st_, 0, d.qpn, port, payload.len() as u64);
        m.kind = Kind::Send;
        if let Some(r) = h.reth {
            m.raddr = r.va;
            m.rkey = r.rkey;
            m.len = u64::from(r.dma_len);
            m.kind = if op == opcode::RDMA_READ_REQUEST {
                Kind::Read
            } else {
                Kind::Write
            };
        }
        if let Some(a) = h.atomic_eth {
            m.raddr = a.va;
            m.rkey = a.rkey;
            m.swap = a.swap_add;
            m.cmp = a.compare;
            m.len = 8;
            m.kind = if op == opcode::COMPARE_SWAP {
                Kind::CmpSwap
            } else {
                Kind::FetchAdd
            };
        }
        if m.kind == Kind::Write && m.len != payload.len() as u64 {
            if rc {
                ack(hca, d, h, psn, aeth::NAK_INVALID_REQUEST);
            }
            return;
        }
        m.npkts = if m.kind == Kind::Read {
            m.len.div_ceil(mtu).max(1) as u32
        } else {
            1
        };
        let r = exec::respond(hca, &m, &src, payload);
        if !rc {
            return;
        }
        match r {
            Resp::Ack => ack(hca, d, h, psn, aeth::ack(0x1f)),
            Resp::Read(seg) => {
                keep_resource(
                    hca,
                    d.qpn,
                    RdRes {
                        psn,
                        npkts: m.npkts,
                        va: m.raddr,
                        len: m.len,
                        atomic: None,
                    },
                );
                read_response(hca, d, h, psn, seg, m.len);
            }
            Resp::Atomic(v) => {
                keep_resource(
                    hca,
                    d.qpn,
                    RdRes {
                        psn,
                        npkts: 1,
                        va: m.raddr,
                        len: 8,
                        atomic: Some(v),
                    },
                );
                reply_atomic(hca, d, h, psn, v);
            }
            Resp::Nak(s) => ack(hca, d, h, psn, nak_code(s)),
            Resp::Rnr(t) => {
                // Not consumed: the PSN stays for the retry.
                if let Some(qm) = hca.engine.qps.get_mut(&d.qpn) {
                    qm.rq_psn = exp;
                }
                rnr(hca, d, h, psn, t);
            }
            Resp::Silent => {}
        }
        return;
    }
    stream(hca, d, h, payload, op, psn);
}

/// FIRST/MIDDLE/LAST packets of a SEND or RDMA WRITE.
fn stream(hca: &mut Hca, d: &QpEng, h: &Headers, payload: &[u8], op: u8, psn: u32) {
    let rc = d.st == st::RC;
    let first = matches!(op, opcode::SEND_FIRST | opcode::RDMA_WRITE_FIRST);
    let last = matches!(
        op,
        opcode::SEND_LAST
            | opcode::SEND_LAST_IMM
            | opcode::SEND_LAST_INV
            | opcode::RDMA_WRITE_LAST
            | opcode::RDMA_WRITE_LAST_IMM
    );
    let send = matches!(
        op,
        opcode::SEND_FIRST
            | opcode::SEND_MIDDLE
            | opcode::SEND_LAST
            | opcode::SEND_LAST_IMM
            | opcode::SEND_LAST_INV
    );
    let fail = |hca: &mut Hca, d: &QpEng, s: Syndrome, local: Option<Syndrome>, ev: u8| {
        if let Some(qm) = hca.engine.qps.get_mut(&d.qpn) {
            qm.rx = None;
        }
        // The receive WQE (if one was taken) completes in error.
        let taken = d.rx.as_ref().and_then(|r| r.rwqe);
        let rw = taken.map(|(counter, srq_next)| exec::Rwqe {
            counter,
            n: 0,
            srq_next,
            malformed: false,
        });
        let r = exec::responder_error(hca, d, rw.as_ref(), local, ev, s);
        if let Resp::Nak(s) = r {
            ack(hca, d, h, psn, nak_code(s));
        }
    };
    let mut rx = if first {
        if send {
            let mut sc = exec::take_scratch(&mut hca.engine.rx_scratch);
            let r = exec::rq_peek(hca, d, &mut sc);
            let sges = r
                .as_ref()
                .map(|r| sc.sges[..r.n].to_vec())
                .unwrap_or_default();
            hca.engine.rx_scratch = Some(sc);
            let Some(r) = r else {
                if rc {
                    rnr(hca, d, h, psn, d.min_rnr_timer);
                }
                return;
            };
            if r.malformed {
                if let Resp::Nak(s) = exec::malformed_rwqe(hca, d, &r) {
                    ack(hca, d, h, psn, nak_code(s));
                }
                return;
            }
            RxMsg {
                send: true,
                rwqe: Some((r.counter, r.srq_next)),
                sges,
                target: None,
                off: 0,
            }
        } else {
            let Some(r) = h.reth else {
                return;
            };
            if !d.rwe {
                fail(hca, d, Syndrome::RemoteAccess, None, eqe::WQ_ACCESS_ERROR);
                return;
            }
            let len = u64::from(r.dma_len);
            let Ok(xl) = xlate::check_qp(
                hca,
                xlate::KeyUse::remote(d, r.rkey, Access::RemoteWrite, r.va, len),
            ) else {
                fail(hca, d, Syndrome::RemoteAccess, None, eqe::WQ_ACCESS_ERROR);
                return;
            };
            RxMsg {
                send: false,
                rwqe: None,
                sges: Vec::new(),
                target: Some(Seg {
                    addr: r.va,
                    len,
                    xl: Some(xl),
                }),
                off: 0,
            }
        }
    } else {
        match d.rx.clone() {
            Some(r) if r.send == send => r,
            _ => {
                // A MIDDLE/LAST without its FIRST.
                if rc {
                    ack(hca, d, h, psn, aeth::NAK_INVALID_REQUEST);
                }
                return;
            }
        }
    };
    let d = QpEng {
        rx: Some(rx.clone()),
        ..d.clone()
    };
    // SEND with Invalidate: the key is checked before the last packet's
    // data lands (as in loopback, crate::hca::engine::mw).
    if let Some(k) = h.ieth
        && crate::hca::engine::mw::invalidate(hca, k, d.qpn, d.pd, true, false).is_err()
    {
        fail(
            hca,
            &d,
            Syndrome::RemoteInvalidReq,
            Some(Syndrome::LocalAccess),
            eqe::WQ_INVAL_REQ_ERROR,
        );
        return;
    }
    // Data.
    if send {
        let need = rx.off + payload.len() as u64;
        let room: u64 = rx.sges.iter().map(|s| s.len()).sum();
        if need > room {
            fail(
                hca,
                &d,
                Syndrome::RemoteInvalidReq,
                Some(Syndrome::LocalLength),
                eqe::WQ_INVAL_REQ_ERROR,
            );
            return;
        }
        if scatter_sges(hca, &d, &rx.sges, rx.off, payload).is_err() {
            fail(
                hca,
                &d,
                Syndrome::RemoteOp,
                Some(Syndrome::LocalProt),
                eqe::WQ_ACCESS_ERROR,
            );
            return;
        }
    } else if let Some(t) = rx.target
        && (rx.off + payload.len() as u64 > t.len
            || xlate::scatter(hca, &[t], rx.off, payload).is_err())
    {
        {
            fail(
                hca,
                &d,
                Syndrome::RemoteInvalidReq,
                None,
                eqe::WQ_INVAL_REQ_ERROR,
            );
            return;
        }
    }
    rx.off += payload.len() as u64;
    let imm = matches!(op, opcode::SEND_LAST_IMM | opcode::RDMA_WRITE_LAST_IMM);
    // WRITE with immediate needs a receive WQE at the end.
    if last && !send && imm {
        let mut sc = exec::take_scratch(&mut hca.engine.rx_scratch);
        let r = exec::rq_peek(hca, &d, &mut sc);
        hca.engine.rx_scratch = Some(sc);
        let Some(r) = r else {
            if rc {
                rnr(hca, &d, h, psn, d.min_rnr_timer);
            }
            return;
        };
        if r.malformed {
            if let Some(qm) = hca.engine.qps.get_mut(&d.qpn) {
                qm.rx = None;
            }
            if let Resp::Nak(s) = exec::malformed_rwqe(hca, &d, &r) {
                ack(hca, &d, h, psn, nak_code(s));
            }
            return;
        }
        rx.rwqe = Some((r.counter, r.srq_next));
    }
    if let Some(qm) = hca.engine.qps.get_mut(&d.qpn) {
        qm.rq_psn = (psn + 1) & 0xff_ffff;
        qm.rx = if last { None } else { Some(rx.clone()) };
    }
    if last {
        if let Some((counter, srq_next)) = rx.rwqe {
            let rw = exec::Rwqe {
                counter,
                n: 0,
                srq_next,
                malformed: false,
            };
            if let Some(k) = h.ieth {
                let _ = crate::hca::engine::mw::invalidate(hca, k, d.qpn, d.pd, true, true);
            }
            exec::rq_commit(hca, d.qpn, &rw);
            hca.engine.stats.received += 1;
            let c = Cqe {
                qpn: d.qpn,
                opcode: match (send, imm, h.ieth.is_some()) {
                    (true, _, true) => cq::rcv_op::SEND_INVAL,
                    (true, false, _) => cq::rcv_op::SEND,
                    (true, true, _) => cq::rcv_op::SEND_IMM,
                    _ => cq::rcv_op::RDMA_WRITE_IMM,
                },
                byte_cnt: rx.off as u32,
                imm: h.imm.or(h.ieth).unwrap_or(0),
                wqe_counter: counter,
                solicited: h.bth.se,
                ..Cqe::default()
            };
            cq::push(hca, d.rcq, &c);
        }
        if rc {
            ack(hca, &d, h, psn, aeth::ack(0x1f));
        }
    }
}

/// Scatters `data` at `off` into a receive WQE's list, checking each entry
/// it touches for local write.
fn scatter_sges(
    hca: &mut Hca,
    d: &QpEng,
    sges: &[Sge],
    mut off: u64,
    data: &[u8],
) -> Result<(), ()> {
    let pd = match d.srq {
        Some(s) => hca.engine.srqs.get(&s).map_or(d.pd, |x| x.pd),
        None => d.pd,
    };
    let mut done = 0usize;
    for s in sges {
        if done == data.len() {
            break;
        }
        let Sge::Ptr { len, lkey, addr } = *s else {
            continue;
        };
        if off >= len {
            off -= len;
            continue;
        }
        let n = ((len - off) as usize).min(data.len() - done);
        let xl = xlate::check(
            hca,
            lkey,
            pd,
            Access::LocalWrite,
            addr + off,
            n as u64,
            d.rlkey,
        )
        .map_err(|_| ())?;
        let seg = Seg {
            addr: addr + off,
            len: n as u64,
            xl: Some(xl),
        };
        xlate::scatter(hca, &[seg], 0, &data[done..done + n]).map_err(|_| ())?;
        done += n;
        off = 0;
    }
    if done == data.len() { Ok(()) } else { Err(()) }
}
