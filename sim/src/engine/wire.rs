//! The HCA on a fabric: its ports' physical link from the fabric's cables
//! (INIT_PORT/CLOSE_PORT enable and disable the fabric port, LinkDowned
//! counts links lost), packets built for the wire (RC/UC segmented at the
//! path MTU, RDMA READ responses, atomics, ACK/NAK/RNR NAK, UD datagrams,
//! the MADs of QP0/QP1 with the CRCs computed here), and the packets taken
//! from the fabric when the engines are stepped (CRC and header checks,
//! PortRcvErrors, P_Key/Q_Key checks, PSN checks with duplicate and
//! sequence-error handling, message reassembly straight into host memory);
//! multicast, APM, congestion marking and credit-based flow control are not
//! modelled.
//!
//! # Decisions
//!
//! * One RC message per QP is on the wire at a time (stop and wait): the
//!   send queue waits for the response (ACK, READ response, atomic ACK, or
//!   a NAK) before it starts the next WQE. Fences and the rd_atomic limits
//!   are therefore always met; throughput over the fabric is not the
//!   card's.
//! * A retransmission (ACK timeout, PSN sequence NAK) resends the whole
//!   message from its first PSN; the responder answers duplicates as IBTA
//!   9.7.5.1.4 says: SEND/WRITE with an ACK of the last PSN, a READ again
//!   from memory, an atomic with the saved result.
//! * The counters count what crosses the port: PortXmitData/PortRcvData in
//!   4-byte words of LRH..ICRC (the LRH PktLen), packets, PortXmitDiscards
//!   for a packet sent on a link that is down, PortRcvErrors for a packet
//!   that fails its CRC or header checks. Loopback traffic inside the HCA
//!   is not counted (it does not cross the port).

use super::cq::{self, Cqe, Syndrome};
use super::exec::{self, Kind, Msg, Outcome, Resp};
use super::wqe::Sge;
use super::xlate::{self, Access, Seg};
use super::{QpEng, Wait, WaitKind};
use crate::ctx::{eqe, st};
use crate::device::{Hca, QpState};
use crate::fabric::{Packet, PortId, SharedFabric};
use crate::packet::{self, Aeth, AtomicEth, Bth, Deth, Headers, Lrh, Reth, aeth, opcode};
use crate::port::{LogicalState, PhysicalState};

/// An HCA's attachment to a fabric.
#[derive(Debug, Clone)]
pub struct FabricLink {
    /// The fabric.
    pub fabric: SharedFabric,
    /// Fabric ports of HCA ports 1 and 2.
    pub ports: [Option<PortId>; 2],
    /// What the fabric was last told (INIT_PORT seen).
    pub enabled: [bool; 2],
    /// Link generation last seen.
    pub generation: [u64; 2],
}

/// The RC message on the wire waiting for its response.
#[derive(Debug, Clone)]
pub struct TxMsg {
    /// WQE index.
    pub idx: u32,
    /// WQE opcode.
    pub opcode: u8,
    /// Signalled.
    pub signalled: bool,
    /// PSN of the first request packet.
    pub first_psn: u32,
    /// PSN of the last request packet (for a READ: of the last response).
    pub last_psn: u32,
    /// Message length.
    pub len: u64,
    /// Local segments the response lands in (READ, atomics).
    pub segs: Vec<Seg>,
    /// READ response bytes received so far.
    pub read_off: u64,
}

/// A multi-packet message being received.
#[derive(Debug, Clone)]
pub struct RxMsg {
    /// SEND (else RDMA WRITE).
    pub send: bool,
    /// The receive WQE (SEND, or WRITE with immediate at the end).
    pub rwqe: Option<(u16, Option<u16>)>,
    /// Its scatter list.
    pub sges: Vec<Sge>,
    /// WRITE target.
    pub target: Option<Seg>,
    /// Bytes so far.
    pub off: u64,
}

fn lock(f: &SharedFabric) -> std::sync::MutexGuard<'_, crate::fabric::Fabric> {
    f.lock().unwrap_or_else(|e| e.into_inner())
}

/// The fabric port of HCA port `port`, if attached.
pub fn fabric_port(hca: &Hca, port: u8) -> Option<PortId> {
    let l = hca.fabric.as_ref()?;
    *l.ports.get(usize::from(port).checked_sub(1)?)?
}

/// Port `port` is on a fabric.
pub fn attached(hca: &Hca, port: u8) -> bool {
    fabric_port(hca, port).is_some()
}

fn bump32(c: &mut u32, by: u32) {
    *c = c.saturating_add(by);
}

/// Sends `bytes` (a whole packet, CRCs included) out of `port`.
pub fn transmit(hca: &mut Hca, port: u8, bytes: Vec<u8>) -> bool {
    transmit_as(hca, port, bytes, false)
}

/// Sends `bytes` (a whole packet whose CRCs are owed, built by
/// [`packet::build_owed_with`]) out of `port`; the fabric computes them
/// when anything could see the bytes (`crate::fabric`, "CRCs owed").
pub fn transmit_owed(hca: &mut Hca, port: u8, bytes: Vec<u8>) -> bool {
    transmit_as(hca, port, bytes, true)
}

/// A packet buffer from the fabric's spares (no allocation once traffic
/// runs: receivers give their buffers back).
fn buffer(hca: &Hca) -> Vec<u8> {
    match hca.fabric.as_ref() {
        Some(l) => lock(&l.fabric).take_buffer(),
        None => Vec::new(),
    }
}

/// Builds a packet with owed CRCs in a spare buffer and sends it.
fn send_packet(hca: &mut Hca, port: u8, hd: &Headers, payload: &[u8]) {
    let mut b = buffer(hca);
    if packet::build_owed_with(hd, payload.len(), &mut b, |p| p.copy_from_slice(payload)).is_ok() {
        transmit_owed(hca, port, b);
    }
}

fn transmit_as(hca: &mut Hca, port: u8, bytes: Vec<u8>, owed: bool) -> bool {
    let Some(pid) = fabric_port(hca, port) else {
        return false;
    };
    let Some(fabric) = hca.fabric.as_ref().map(|l| l.fabric.clone()) else {
        return false;
    };
    let words = packet::Lrh::parse(&bytes).map_or(0, |l| u32::from(l.pkt_len));
    let now = hca.clock.now_ns();
    let ok = if owed {
        lock(&fabric).transmit_owed(pid, Packet { bytes }, now)
    } else {
        lock(&fabric).transmit(pid, Packet { bytes }, now)
    };
    let Some(i) = hca.port_index(u32::from(port)) else {
        return ok;
    };
    let c = &mut hca.ports[i].counters;
    if ok {
        bump32(&mut c.xmit_data, words);
        bump32(&mut c.xmit_pkts, 1);
        c.ext_xmit_data = c.ext_xmit_data.wrapping_add(u64::from(words));
        c.ext_xmit_pkts = c.ext_xmit_pkts.wrapping_add(1);
    } else {
        c.xmit_discards = c.xmit_discards.saturating_add(1);
    }
    ok
}

/// Brings the ports' physical state in line with the fabric: tells the
/// fabric about INIT_PORT/CLOSE_PORT, and follows the link (LinkUp and
/// logical Init when both ends are enabled and cabled; Down, LinkDowned
/// and PORT_CHANGE when it goes).
pub fn sync_ports(hca: &mut Hca) -> bool {
    let Some(link) = hca.fabric.clone() else {
        return false;
    };
    let mut changed = false;
    for i in 0..hca.ports.len().min(2) {
        let Some(pid) = link.ports[i] else { continue };
        let want = hca.ports[i].initialized;
        let (up, generation) = {
            let mut f = lock(&link.fabric);
            if want != link.enabled[i] {
                let _ = f.set_enabled(pid, want);
            }
            (f.link_up(pid), f.link_generation(pid))
        };
        if let Some(l) = hca.fabric.as_mut() {
            l.enabled[i] = want;
        }
        let was_up = hca.ports[i].phys == PhysicalState::LinkUp;
        if want != link.enabled[i] || generation != link.generation[i] || hca.ports[i].cable != up {
            if let Some(l) = hca.fabric.as_mut() {
                l.generation[i] = generation;
            }
            let before = hca.ports[i].state;
            hca.ports[i].cable = up;
            hca.ports[i].retrain();
            let now_up = hca.ports[i].phys == PhysicalState::LinkUp;
            if was_up && !now_up && before != LogicalState::Active {
                let c = &mut hca.ports[i].counters;
                c.link_downed = c.link_downed.saturating_add(1);
            }
            hca.port_changed(i, before);
            changed = true;
        }
    }
    changed
}

/// Takes the packets due at the HCA's ports and handles them.
pub fn poll_rx(hca: &mut Hca) -> bool {
    let Some(link) = hca.fabric.clone() else {
        return false;
    };
    let mut any = false;
    for (i, pid) in link.ports.iter().enumerate() {
        let Some(pid) = *pid else { continue };
        for _ in 0..crate::fabric::MAX_INBOUND {
            let now = hca.clock.now_ns();
            let pkt = {
                let mut f = lock(&link.fabric);
                f.advance(now);
                f.receive_owed(pid, now)
            };
            let Some((pkt, owed)) = pkt else { break };
            any = true;
            handle(hca, i as u8 + 1, &pkt.bytes, owed);
            lock(&link.fabric).recycle(pkt.bytes);
        }
    }
    any
}

fn rcv_error(hca: &mut Hca, port: u8) {
    if let Some(i) = hca.port_index(u32::from(port)) {
        let c = &mut hca.ports[i].counters;
        c.rcv_errors = c.rcv_errors.saturating_add(1);
    }
}

/// PSN `a` is at or after `b` (24-bit serial arithmetic).
fn psn_ge(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) & 0xff_ffff) < 0x80_0000
}

/// One packet arriving at `port`; `crc_owed`: its CRCs are owed (a model
/// HCA built it and nothing has touched it since), so their comparison,
/// which cannot fail, is skipped and every other check made.
fn handle(hca: &mut Hca, port: u8, bytes: &[u8], crc_owed: bool) {
    let parsed = if crc_owed {
        packet::parse(bytes)
    } else {
        packet::parse_checked(bytes)
    };
    let Ok(p) = parsed else {
        rcv_error(hca, port);
        return;
    };
    let Some(pi) = hca.port_index(u32::from(port)) else {
        return;
    };
    {
        let c = &mut hca.ports[pi].counters;
        bump32(&mut c.rcv_data, u32::from(p.hdr.lrh.pkt_len));
        bump32(&mut c.rcv_pkts, 1);
        c.ext_rcv_data = c.ext_rcv_data.wrapping_add(u64::from(p.hdr.lrh.pkt_len));
        c.ext_rcv_pkts = c.ext_rcv_pkts.wrapping_add(1);
    }
    let h = p.hdr;
    let payload = p.payload(bytes);
    let dqp = h.bth.dest_qp;
    let smp = dqp == 0;
    let (state, lid, lmc) = exec::port_state(hca, port).unwrap_or((LogicalState::Down, 0, 0));
    // VL15 carries SMPs to QP0 only; data needs an Active port; the DLID
    // must be this port's (the permissive LID only for SMPs).
    let mask = !((1u16 << lmc.min(7)) - 1);
    let lid_ok = (smp && h.lrh.dlid == packet::PERMISSIVE_LID) || (h.lrh.dlid & mask == lid & mask);
    if smp != (h.lrh.vl == 15) || !lid_ok {
        rcv_error(hca, port);
        return;
    }
    if smp || dqp == 1 {
        if state < LogicalState::Init || (!smp && state != LogicalState::Active) {
            return;
        }
        let Some(d) = h.deth else {
            rcv_error(hca, port);
            return;
        };
        let base = hca.special_qp_base;
        if base == 0 {
            return;
        }
        let dst = base + if smp { 0 } else { 2 } + u32::from(port) - 1;
        let m = msg_from(&h, st::MLX, d.src_qp, dst, port, payload.len() as u64);
        let m = Msg { qkey: d.qkey, ..m };
        let src = [inline_seg(payload.len())];
        if !smp && d.qkey != packet::GSI_QKEY {
            let p = &mut hca.ports[pi];
            p.qkey_violations = p.qkey_violations.saturating_add(1);
            return;
        }
        exec::mad_deliver(hca, &m, &src, payload, smp);
        return;
    }
    if state != LogicalState::Active {
        return;
    }
    let Some(q) = hca.engine.qps.get(&dqp).cloned() else {
        return;
    };
    let transport = h.bth.opcode & 0xe0;
    let op = h.bth.opcode & 0x1f;
    match transport {
        opcode::UD => {
            let Some(d) = h.deth else {
                rcv_error(hca, port);
                return;
            };
            let m = Msg {
                qkey: d.qkey,
                ..msg_from(&h, st::UD, d.src_qp, dqp, port, payload.len() as u64)
            };
            let src = [inline_seg(payload.len())];
            let _ = exec::respond(hca, &m, &src, payload);
        }
        opcode::RC | opcode::UC => {
            let is_rc = transport == opcode::RC;
            let responder_op = !matches!(
                op,
                opcode::ACKNOWLEDGE
                    | opcode::ATOMIC_ACKNOWLEDGE
                    | opcode::RDMA_READ_RESPONSE_FIRST
                    | opcode::RDMA_READ_RESPONSE_MIDDLE
                    | opcode::RDMA_READ_RESPONSE_LAST
                    | opcode::RDMA_READ_RESPONSE_ONLY
            );
            if q.st != if is_rc { st::RC } else { st::UC } {
                return;
            }
            if responder_op {
                request(hca, port, &q, &h, payload);
            } else if is_rc {
                response(hca, &q, &h, payload);
            }
        }
        _ => {}
    }
}

fn inline_seg(len: usize) -> Seg {
    Seg {
        addr: 0,
        len: len as u64,
        xl: None,
    }
}

fn msg_from(h: &Headers, st_: u8, src_qpn: u32, dst_qpn: u32, port: u8, len: u64) -> Msg {
    Msg {
        kind: Kind::Send,
        st: st_,
        src_qpn,
        dst_qpn,
        port,
        len,
        imm: h.imm,
        se: h.bth.se,
        raddr: 0,
        rkey: 0,
        swap: 0,
        cmp: 0,
        slid: h.lrh.slid,
        dlid: h.lrh.dlid,
        sl: h.lrh.sl,
        pkey: h.bth.pkey,
        qkey: 0,
        grh: h.grh.map(|g| {
            let mut b = [0u8; 40];
            g.write(&mut b);
            b
        }),
        npkts: 1,
        inv: None,
    }
}

// ------------------------------------------------------------------ requester

/// The requester's packets for one message of QP `q`.
#[allow(clippy::too_many_arguments)]
pub(super) fn send(
    hca: &mut Hca,
    q: &QpEng,
    m: &Msg,
    segs: &[Seg],
    inline: &[u8],
    idx: u32,
    opcode_: u8,
    signalled: bool,
    mtu: u64,
) -> Outcome {
    let port = m.port;
    let psn0 = hca.engine.qps.get(&q.qpn).map_or(0, |x| x.sq_psn);
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
        send_packet(hca, port, &hd, &payload);
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
    let npkts;
    match m.kind {
        Kind::Send | Kind::Write => {
            npkts = m.len.div_ceil(mtu).max(1) as u32;
            let send = m.kind == Kind::Send;
            for k in 0..npkts {
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
                let mut hd = base;
                hd.bth.opcode = t | o;
                hd.bth.psn = (psn0 + k) & 0xff_ffff;
                hd.bth.ack_req = last && q.st == st::RC;
                hd.bth.se = last && m.se;
                if last {
                    hd.imm = m.imm;
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
                if built.is_ok() {
                    transmit_owed(hca, port, b);
                }
            }
        }
        Kind::Read => {
            npkts = m.len.div_ceil(mtu).max(1) as u32;
            let mut hd = base;
            hd.bth.opcode = t | opcode::RDMA_READ_REQUEST;
            hd.bth.psn = psn0;
            hd.bth.ack_req = true;
            hd.reth = Some(Reth {
                va: m.raddr,
                rkey: m.rkey,
                dma_len: m.len as u32,
            });
            send_packet(hca, port, &hd, &[]);
        }
        Kind::CmpSwap | Kind::FetchAdd => {
            npkts = 1;
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
            send_packet(hca, port, &hd, &[]);
        }
    }
    bump_psn(hca, q.qpn, npkts);
    if q.st != st::RC {
        return Outcome::Done {
            byte_cnt: m.len as u32,
        };
    }
    let tx = TxMsg {
        idx,
        opcode: opcode_,
        signalled,
        first_psn: psn0,
        last_psn: (psn0 + npkts - 1) & 0xff_ffff,
        len: m.len,
        segs: if matches!(m.kind, Kind::Read | Kind::CmpSwap | Kind::FetchAdd) {
            segs.to_vec()
        } else {
            Vec::new()
        },
        read_off: 0,
    };
    if let Some(qm) = hca.engine.qps.get_mut(&q.qpn) {
        qm.tx = Some(tx);
    }
    let now = hca.clock.now_ns();
    exec::ack_wait(q, now)
}

fn bump_psn(hca: &mut Hca, qpn: u32, n: u32) {
    if let Some(q) = hca.engine.qps.get_mut(&qpn) {
        q.sq_psn = (q.sq_psn + n) & 0xff_ffff;
        q.pkts_sent += u64::from(n);
    }
}

/// A response for the RC message QP `q` has on the wire.
fn response(hca: &mut Hca, q: &QpEng, h: &Headers, payload: &[u8]) {
    let Some(tx) = q.tx.clone() else {
        return; // nothing outstanding: a late duplicate
    };
    let psn = h.bth.psn;
    let op = h.bth.opcode & 0x1f;
    let qpn = q.qpn;
    match op {
        opcode::ACKNOWLEDGE => {
            let Some(a) = h.aeth else { return };
            match aeth::kind(a.syndrome) {
                0 if psn_ge(psn, tx.last_psn) && tx.segs.is_empty() => {
                    complete(hca, qpn, &tx, Ok(tx.len as u32));
                }
                1 => {
                    let now = hca.clock.now_ns();
                    let Some(qm) = hca.engine.qps.get_mut(&qpn) else {
                        return;
                    };
                    if qm.rnr_retry != 7 {
                        if qm.rnr_left == 0 {
                            complete(hca, qpn, &tx, Err(Syndrome::RnrRetryExceeded));
                            return;
                        }
                        qm.rnr_left -= 1;
                    }
                    qm.wait = Some(Wait {
                        until_ns: now.saturating_add(exec::rnr_ns(a.syndrome & 0x1f)),
                        kind: WaitKind::Rnr,
                    });
                    // The retransmission starts again at the first PSN.
                    qm.sq_psn = tx.first_psn;
                    qm.tx = None;
                }
                3 => match a.syndrome {
                    aeth::NAK_PSN_SEQ_ERROR => {
                        // Resend at once (counted as a retry when it fires).
                        let now = hca.clock.now_ns();
                        if let Some(qm) = hca.engine.qps.get_mut(&qpn) {
                            qm.wait = Some(Wait {
                                until_ns: now,
                                kind: WaitKind::Ack,
                            });
                        }
                    }
                    aeth::NAK_INVALID_REQUEST => {
                        complete(hca, qpn, &tx, Err(Syndrome::RemoteInvalidReq))
                    }
                    aeth::NAK_REMOTE_ACCESS => complete(hca, qpn, &tx, Err(Syndrome::RemoteAccess)),
                    aeth::NAK_REMOTE_OP => complete(hca, qpn, &tx, Err(Syndrome::RemoteOp)),
                    _ => complete(hca, qpn, &tx, Err(Syndrome::BadResp)),
                },
                _ => {}
            }
        }
        opcode::RDMA_READ_RESPONSE_FIRST
        | opcode::RDMA_READ_RESPONSE_MIDDLE
        | opcode::RDMA_READ_RESPONSE_LAST
        | opcode::RDMA_READ_RESPONSE_ONLY => {
            if tx.opcode != super::wqe::op::RDMA_READ {
                complete(hca, qpn, &tx, Err(Syndrome::BadResp));
                return;
            }
            let k = psn.wrapping_sub(tx.first_psn) & 0xff_ffff;
            let mtu = q.mtu_bytes();
            if u64::from(k) * mtu != tx.read_off {
                return; // out of order: the timer resends the request
            }
            if tx.read_off + payload.len() as u64 > tx.len {
                complete(hca, qpn, &tx, Err(Syndrome::BadResp));
                return;
            }
            if xlate::scatter(hca, &tx.segs, tx.read_off, payload).is_err() {
                complete(hca, qpn, &tx, Err(Syndrome::LocalProt));
                return;
            }
            let read_off = tx.read_off + payload.len() as u64;
            if let Some(qm) = hca.engine.qps.get_mut(&qpn)
                && let Some(t) = qm.tx.as_mut()
            {
                t.read_off = read_off;
            }
            if matches!(
                op,
                opcode::RDMA_READ_RESPONSE_LAST | opcode::RDMA_READ_RESPONSE_ONLY
            ) {
                if read_off != tx.len {
                    complete(hca, qpn, &tx, Err(Syndrome::BadResp));
                } else {
                    complete(hca, qpn, &tx, Ok(tx.len as u32));
                }
            }
        }
        opcode::ATOMIC_ACKNOWLEDGE => {
            let Some(orig) = h.atomic_ack else { return };
            if !matches!(
                tx.opcode,
                super::wqe::op::ATOMIC_CS | super::wqe::op::ATOMIC_FA
            ) {
                complete(hca, qpn, &tx, Err(Syndrome::BadResp));
                return;
            }
            if xlate::scatter(hca, &tx.segs, 0, &orig.to_be_bytes()).is_err() {
                complete(hca, qpn, &tx, Err(Syndrome::LocalProt));
                return;
            }
            complete(hca, qpn, &tx, Ok(8));
        }
        _ => {}
    }
}

/// Completes the RC message on the wire and lets the SQ go on.
fn complete(hca: &mut Hca, qpn: u32, tx: &TxMsg, r: Result<u32, Syndrome>) {
    if let Some(qm) = hca.engine.qps.get_mut(&qpn) {
        qm.tx = None;
        qm.wait = None;
    }
    let scq = exec::advance(hca, qpn);
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
            hca.engine.stats.executed += 1;
            exec::process_sq(hca, qpn);
        }
        Err(s) => {
            hca.engine.stats.executed += 1;
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

// ------------------------------------------------------------------ responder

/// Builds and sends a response packet from responder QP `d`.
#[allow(clippy::too_many_arguments)]
fn reply(
    hca: &mut Hca,
    d: &QpEng,
    req: &Headers,
    op: u8,
    psn: u32,
    a: Option<Aeth>,
    atomic: Option<u64>,
    payload: &[u8],
) {
    let (lid, lmc) = exec::port_state(hca, d.port).map_or((0, 0), |(_, l, m)| (l, m));
    let mask = (1u16 << lmc.min(7)) - 1;
    let hd = Headers {
        lrh: Lrh {
            vl: 0,
            sl: req.lrh.sl,
            dlid: req.lrh.slid,
            slid: lid | (req.lrh.dlid & mask),
            ..Lrh::default()
        },
        bth: Bth {
            opcode: opcode::RC | op,
            pkey: exec::pkey_at(hca, d.port, d.pkey_index),
            dest_qp: d.remote_qpn,
            psn: psn & 0xff_ffff,
            ..Bth::default()
        },
        aeth: a,
        atomic_ack: atomic,
        ..Headers::default()
    };
    send_packet(hca, d.port, &hd, payload);
}

fn ack(hca: &mut Hca, d: &QpEng, req: &Headers, psn: u32, syndrome: u8) {
    reply(
        hca,
        d,
        req,
        opcode::ACKNOWLEDGE,
        psn,
        Some(Aeth { syndrome, msn: 0 }),
        None,
        &[],
    );
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
        reply(hca, d, req, op, psn + k, a, None, &buf);
    }
}

fn nak_code(s: Syndrome) -> u8 {
    match s {
        Syndrome::RemoteAccess => aeth::NAK_REMOTE_ACCESS,
        Syndrome::RemoteOp => aeth::NAK_REMOTE_OP,
        _ => aeth::NAK_INVALID_REQUEST,
    }
}

/// A request packet for responder QP `d`.
fn request(hca: &mut Hca, port: u8, d: &QpEng, h: &Headers, payload: &[u8]) {
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
            let p = &mut hca.ports[i];
            p.pkey_violations = p.pkey_violations.saturating_add(1);
        }
        return;
    }
    let op = h.bth.opcode & 0x1f;
    let psn = h.bth.psn;
    let exp = d.rq_psn;
    let mtu = d.mtu_bytes();
    if rc && psn != exp {
        if psn_ge(psn, exp) {
            ack(hca, d, h, exp, aeth::NAK_PSN_SEQ_ERROR);
            return;
        }
        // A duplicate.
        match op {
            opcode::RDMA_READ_REQUEST => {
                if let Some(r) = h.reth
                    && let Ok(xl) = xlate::check(
                        hca,
                        r.rkey,
                        d.pd,
                        Access::RemoteRead,
                        r.va,
                        u64::from(r.dma_len),
                        false,
                    )
                {
                    let seg = Seg {
                        addr: r.va,
                        len: u64::from(r.dma_len),
                        xl: Some(xl),
                    };
                    read_response(hca, d, h, psn, seg, u64::from(r.dma_len));
                }
            }
            opcode::COMPARE_SWAP | opcode::FETCH_ADD => {
                if let Some((p, v)) = d.last_atomic
                    && p == psn
                {
                    reply(
                        hca,
                        d,
                        h,
                        opcode::ATOMIC_ACKNOWLEDGE,
                        psn,
                        Some(Aeth {
                            syndrome: aeth::ack(0x1f),
                            msn: 0,
                        }),
                        Some(v),
                        &[],
                    );
                }
            }
            _ => ack(hca, d, h, exp.wrapping_sub(1), aeth::ack(0x1f)),
        }
        return;
    }
    if !rc && let Some(qm) = hca.engine.qps.get_mut(&d.qpn) {
        qm.rq_psn = psn;
    }
    let is = |o: &[u8]| o.contains(&op);
    let only = is(&[
        opcode::SEND_ONLY,
        opcode::SEND_ONLY_IMM,
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
            Resp::Read(seg) => read_response(hca, d, h, psn, seg, m.len),
            Resp::Atomic(v) => {
                if let Some(qm) = hca.engine.qps.get_mut(&d.qpn) {
                    qm.last_atomic = Some((psn, v));
                }
                reply(
                    hca,
                    d,
                    h,
                    opcode::ATOMIC_ACKNOWLEDGE,
                    psn,
                    Some(Aeth {
                        syndrome: aeth::ack(0x1f),
                        msn: 0,
                    }),
                    Some(v),
                    &[],
                );
            }
            Resp::Nak(s) => ack(hca, d, h, psn, nak_code(s)),
            Resp::Rnr(t) => {
                // Not consumed: the PSN stays for the retry.
                if let Some(qm) = hca.engine.qps.get_mut(&d.qpn) {
                    qm.rq_psn = exp;
                }
                ack(hca, d, h, psn, aeth::rnr_nak(t));
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
            | opcode::RDMA_WRITE_LAST
            | opcode::RDMA_WRITE_LAST_IMM
    );
    let send = matches!(
        op,
        opcode::SEND_FIRST | opcode::SEND_MIDDLE | opcode::SEND_LAST | opcode::SEND_LAST_IMM
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
                    ack(hca, d, h, psn, aeth::rnr_nak(d.min_rnr_timer));
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
            let Ok(xl) = xlate::check(hca, r.rkey, d.pd, Access::RemoteWrite, r.va, len, false)
            else {
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
                ack(hca, &d, h, psn, aeth::rnr_nak(d.min_rnr_timer));
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
            exec::rq_commit(hca, d.qpn, &rw);
            hca.engine.stats.received += 1;
            let c = Cqe {
                qpn: d.qpn,
                opcode: match (send, imm) {
                    (true, false) => cq::rcv_op::SEND,
                    (true, true) => cq::rcv_op::SEND_IMM,
                    _ => cq::rcv_op::RDMA_WRITE_IMM,
                },
                byte_cnt: rx.off as u32,
                imm: h.imm.unwrap_or(0),
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
