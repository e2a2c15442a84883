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
//! * An RC QP pipelines (IBTA 9.7): a send window ([`Window`]) holds every
//!   message started and not yet completed, WQEs `sq_ci..sq_next`. New
//!   WQEs start while fewer than [`WINDOW_PKTS`] PSNs are unacknowledged
//!   (the model's stand-in for link-level flow control), fewer READs and
//!   atomics than max_rd_atomic are outstanding (a fenced WQE: none), and
//!   no go-back-N is under way. Completions are written in WQE order: a
//!   WQE that ends at once (a NOP, a local error) behind messages in
//!   flight waits in the window for its turn; a local error stops the
//!   window from growing, and its error CQE comes when every older
//!   message has completed. A loopback message waits until the window is
//!   empty.
//! * ACKs are cumulative: an ACK of PSN n completes every SEND and WRITE
//!   up to n; a READ or atomic completes only by its own response, and a
//!   later PSN acknowledged while it still waits is an implied NAK (its
//!   response was lost). A READ response or atomic ACK implies the ACK of
//!   every request before it. A response outside the PSNs in flight is
//!   dropped.
//! * Go-back-N: a PSN sequence NAK (once per PSN), an implied NAK and the
//!   local ACK timeout (one timer per QP, restarted whenever a response
//!   makes progress) retransmit from the first unacknowledged PSN: the
//!   message it belongs to from that packet on (a READ asks for the
//!   responses not yet received, with the address and length that
//!   remain), then every later message in flight, each WQE read again from
//!   the SQ (it is still the hardware's). Each such event counts against
//!   retry_cnt; a response that makes progress resets the count (and the
//!   RNR count). An RNR NAK stops the window for the responder's RNR timer
//!   and resends from its PSN, counted against rnr_retry (7: for ever).
//! * The responder checks each request's PSN against the expected one
//!   (IBTA 9.7.5): ahead of it, one PSN sequence NAK per gap (later
//!   requests are dropped silently until the expected PSN comes; an RNR
//!   NAK likewise); behind it, a duplicate: a SEND or WRITE asking for an
//!   ACK is ACKed again (the last PSN received) and delivered nowhere, a
//!   READ is executed again from memory from its PSN on if it lies in one
//!   of the last max_dest_rd_atomic READs/atomics the responder keeps
//!   (its resources; the oldest goes), an atomic gets the original value
//!   kept for it and is not executed again; a duplicate the responder has
//!   no resource for is dropped. The responder ACKs every message that
//!   asks (no coalescing of its own), and reads no limit from the
//!   requester: more READs than its resources are not refused, the
//!   oldest resource is forgotten.
//! * The counters count what crosses the port: PortXmitData/PortRcvData in
//!   4-byte words of LRH..ICRC (the LRH PktLen), packets, PortXmitDiscards
//!   for a packet sent on a link that is down, PortRcvErrors for a packet
//!   that fails its CRC or header checks. Loopback traffic inside the HCA
//!   is not counted (it does not cross the port).

use super::cq::{self, Cqe, Syndrome};
use super::exec::{self, Kind, Msg, Outcome, Resp};
use super::wqe::Sge;
use super::xlate::{self, Access, Seg};
use std::collections::VecDeque;

use super::{QpEng, Wait, WaitKind};
use crate::fabric::packet::{self, Aeth, AtomicEth, Bth, Deth, Headers, Lrh, Reth, aeth, opcode};
use crate::fabric::{LogicalState, PhysicalState};
use crate::fabric::{Packet, PortId, SharedFabric};
use crate::hca::ctx::{eqe, st};
use crate::hca::device::{Hca, QpState};

/// An HCA's attachment to a fabric.
#[derive(Debug, Clone)]
pub struct FabricLink {
    /// The fabric.
    pub fabric: SharedFabric,
    /// What the fabric publishes without its lock (the fabric's own).
    pub activity: std::sync::Arc<crate::fabric::Activity>,
    /// Fabric ports of HCA ports 1 and 2.
    pub ports: [Option<PortId>; 2],
    /// What the fabric was last told (INIT_PORT seen).
    pub enabled: [bool; 2],
    /// Link generation last seen.
    pub generation: [u64; 2],
    /// Link state last seen.
    pub up: [bool; 2],
    /// The fabric's link epoch when the links were last read
    /// ([`crate::fabric::Activity::links`]; `u64::MAX`: never).
    pub links_seen: u64,
}

impl FabricLink {
    /// A link to `fabric` through fabric ports `ports`, not yet synced.
    pub fn new(fabric: SharedFabric, ports: [Option<PortId>; 2]) -> FabricLink {
        let activity = lock(&fabric).activity();
        FabricLink {
            fabric,
            activity,
            ports,
            enabled: [false; 2],
            generation: [0; 2],
            up: [false; 2],
            links_seen: u64::MAX,
        }
    }
}

/// An RC message of the send window: started and not yet completed.
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
    /// PSNs the message uses: its request packets (a READ: its response
    /// packets); 0 for a WQE that completed without the wire (a NOP, a
    /// local error) and waits for its turn to complete.
    pub npkts: u32,
    /// Message length.
    pub len: u64,
    /// Local segments the response lands in (READ, atomics).
    pub segs: Vec<Seg>,
    /// READ response bytes received so far.
    pub read_off: u64,
    /// Where it stands.
    pub state: TxState,
}

/// Where a message of the send window stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxState {
    /// On the wire, waiting for its response.
    Wire,
    /// Done (this byte count); completes when every older one has.
    Done(u32),
    /// Failed; completes in error when every older one has completed.
    Failed(Syndrome),
}

impl TxMsg {
    /// The last PSN the message uses.
    pub fn last_psn(&self) -> u32 {
        self.first_psn.wrapping_add(self.npkts.max(1) - 1) & PSN_MASK
    }
    /// An RDMA READ or atomic (answered by its own response, limited by
    /// max_rd_atomic).
    pub fn rd_atomic(&self) -> bool {
        matches!(
            self.opcode,
            super::wqe::op::RDMA_READ | super::wqe::op::ATOMIC_CS | super::wqe::op::ATOMIC_FA
        )
    }
    /// `psn` is one of the message's.
    pub fn contains(&self, psn: u32) -> bool {
        self.npkts > 0 && psn_diff(psn, self.first_psn) < self.npkts
    }
    /// Where a retransmission of the message starts: a READ at its first
    /// response not yet received, anything else at its first PSN.
    fn resume_psn(&self, mtu: u64) -> u32 {
        let k = if self.opcode == super::wqe::op::RDMA_READ {
            (self.read_off / mtu.max(1)) as u32
        } else {
            0
        };
        self.first_psn.wrapping_add(k) & PSN_MASK
    }
}

/// The send window of an RC QP on a fabric: the messages started and not
/// yet completed, oldest first (WQEs `sq_ci..sq_next`), the go-back-N
/// cursor and the local ACK timer.
#[derive(Debug, Default)]
pub struct Window {
    /// The messages in flight, oldest first.
    pub txq: VecDeque<TxMsg>,
    /// Go-back-N under way: the WQE and the PSN to retransmit next.
    pub resend: Option<(u32, u32)>,
    /// The local ACK timer (model-clock nanoseconds), while a message is
    /// on the wire and the timeout is not infinite.
    pub ack_due: Option<u64>,
    /// The PSN of the last sequence NAK acted on (a second one for the
    /// same PSN starts no second retransmission).
    pub seq_nak: Option<u32>,
    /// RTS2SQD asked for SQ_DRAINED while messages were in flight: posted
    /// when the last one completes.
    pub drain_event: bool,
}

impl Window {
    fn on_wire(&self) -> bool {
        self.txq.iter().any(|e| e.state == TxState::Wire)
    }
}

/// A responder resource: a READ or atomic this QP executed, kept so that
/// a duplicate is answered without executing it again (an atomic) or
/// from the same memory (a READ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdRes {
    /// First PSN of the request.
    pub psn: u32,
    /// PSNs it uses (the READ's response packets; 1 for an atomic).
    pub npkts: u32,
    /// Remote address.
    pub va: u64,
    /// Length.
    pub len: u64,
    /// An atomic's original value.
    pub atomic: Option<u64>,
}

/// Most PSNs one QP keeps unacknowledged before it stops starting new
/// messages: the model's stand-in for link-level flow control, which it
/// does not model (a burst of several QPs cannot overflow a port's
/// inbound queue, `crate::fabric::MAX_INBOUND`). A message longer than
/// this starts when nothing else is in flight.
pub const WINDOW_PKTS: u32 = 256;

const PSN_MASK: u32 = 0xff_ffff;

/// `a - b` in the 24-bit PSN space.
fn psn_diff(a: u32, b: u32) -> u32 {
    a.wrapping_sub(b) & PSN_MASK
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

/// Builds a packet with owed CRCs in a spare buffer and sends it; one the
/// model cannot build goes to [`unbuilt`].
fn send_packet(hca: &mut Hca, port: u8, hd: &Headers, payload: &[u8]) {
    let mut b = buffer(hca);
    match packet::build_owed_with(hd, payload.len(), &mut b, |p| p.copy_from_slice(payload)) {
        Ok(()) => {
            transmit_owed(hca, port, b);
        }
        Err(e) => unbuilt(hca, port, hd, b, &e),
    }
}

/// A packet the engines asked for and [`packet::build_owed_with`] refused
/// (extended headers that do not fit the opcode, a payload too long for
/// one packet): nothing a driver can cause through the checks before it,
/// so a model bug. Never lost in silence: recorded as a violation (every
/// front end reports those) and counted as a discard at the port
/// (PortXmitDiscards: it did not leave); the buffer goes back.
fn unbuilt(hca: &mut Hca, port: u8, hd: &Headers, b: Vec<u8>, e: &packet::PacketError) {
    discard(hca, port);
    hca.violation(format!(
        "model bug: port {port} could not build a packet (opcode {:#04x}, dest QP {:#x}, PSN {:#x}): {e}; dropped",
        hd.bth.opcode, hd.bth.dest_qp, hd.bth.psn
    ));
    if let Some(l) = hca.fabric.as_ref() {
        lock(&l.fabric).recycle(b);
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
    let Some(l) = hca.fabric.as_ref() else {
        return false;
    };
    // Nothing to do while the fabric's links are as last read and the
    // HCA's side (INIT_PORT/CLOSE_PORT, a reset's cable state) is as
    // last synced: no lock, no lookups.
    let epoch = l.activity.links();
    let n = hca.ports.len().min(2);
    if epoch == l.links_seen
        && (0..n).all(|i| {
            l.ports[i].is_none()
                || (hca.ports[i].initialized == l.enabled[i] && hca.ports[i].cable == l.up[i])
        })
    {
        return false;
    }
    let link = l.clone();
    if let Some(l) = hca.fabric.as_mut() {
        l.links_seen = epoch;
    }
    let mut changed = false;
    for i in 0..n {
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
            l.up[i] = up;
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
    let Some(l) = hca.fabric.as_ref() else {
        return false;
    };
    // A quiet fabric (nothing queued anywhere, nothing scheduled, no
    // embedded SM) has nothing to advance and nothing for us: one atomic
    // load instead of the lock, the clock and an advance per port.
    if !l.activity.busy() {
        return false;
    }
    let (fabric, ports) = (l.fabric.clone(), l.ports);
    let mut any = false;
    let mut spent: Option<Vec<u8>> = None;
    for (i, pid) in ports.iter().enumerate() {
        let Some(pid) = *pid else { continue };
        for _ in 0..crate::fabric::MAX_INBOUND {
            let now = hca.clock.now_ns();
            let pkt = {
                let mut f = lock(&fabric);
                if let Some(b) = spent.take() {
                    f.recycle(b);
                }
                f.receive_owed(pid, now)
            };
            let Some((pkt, owed)) = pkt else { break };
            any = true;
            handle(hca, i as u8 + 1, &pkt.bytes, owed);
            spent = Some(pkt.bytes);
        }
    }
    if let Some(b) = spent {
        lock(&fabric).recycle(b);
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
                response(hca, dqp, &h, payload);
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
        inv: h.ieth,
    }
}

// ------------------------------------------------------------------ requester

/// The WQE a message comes from.
#[derive(Debug, Clone, Copy)]
pub(super) struct WqeRef {
    pub(super) idx: u32,
    pub(super) opcode: u8,
    pub(super) signalled: bool,
}

/// A retransmission (go-back-N): packet `from` on of the message whose
/// first PSN is `first_psn` and which uses `npkts` PSNs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Retx {
    pub(super) first_psn: u32,
    pub(super) npkts: u32,
    pub(super) from: u32,
}

/// Counts a packet the port could not send (not Active).
fn discard(hca: &mut Hca, port: u8) {
    if let Some(i) = hca.port_index(u32::from(port)) {
        let c = &mut hca.ports[i].counters;
        c.xmit_discards = c.xmit_discards.saturating_add(1);
    }
}

/// The requester's packets for one message of QP `q` (`retx`: again, from
/// a packet on). An RC message joins the send window ([`Outcome::Sent`]);
/// UD and UC complete at once.
#[allow(clippy::too_many_arguments)]
pub(super) fn send(
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
pub(super) fn may_start(hca: &Hca, qpn: u32, ctrl: &super::wqe::Ctrl) -> bool {
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
        super::wqe::op::RDMA_READ | super::wqe::op::ATOMIC_CS | super::wqe::op::ATOMIC_FA
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
pub(super) fn busy(hca: &Hca, qpn: u32) -> bool {
    hca.engine
        .windows
        .get(&qpn)
        .is_some_and(|w| !w.txq.is_empty())
}

/// A WQE that completed without the wire while older messages are in
/// flight: it waits in the window for its turn.
pub(super) fn queue_local(
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
pub(super) fn retx_for(hca: &mut Hca, qpn: u32, idx: u32, psn: u32) -> Option<Retx> {
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
pub(super) fn resent(hca: &mut Hca, qpn: u32, idx: u32) {
    if let Some(w) = hca.engine.windows.get_mut(&qpn) {
        w.resend = next_after(w, idx);
    }
}

/// The message of WQE `idx` failed (`s`): it completes in error when its
/// turn comes, and nothing after it goes out again.
pub(super) fn fail_entry(hca: &mut Hca, qpn: u32, idx: u32, s: Syndrome) {
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
pub(super) fn retire(hca: &mut Hca, qpn: u32) {
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
fn response(hca: &mut Hca, qpn: u32, h: &Headers, payload: &[u8]) {
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
    if e.opcode != super::wqe::op::RDMA_READ {
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
        super::wqe::op::ATOMIC_CS | super::wqe::op::ATOMIC_FA
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

// ------------------------------------------------------------------ responder

/// The ATOMIC ACKNOWLEDGE of the atomic at `psn` with its original value
/// `v` (first execution and a duplicate's replay alike).
fn reply_atomic(hca: &mut Hca, d: &QpEng, h: &Headers, psn: u32, v: u64) {
    let a = Aeth {
        syndrome: aeth::ack(0x1f),
        msn: 0,
    };
    reply(
        hca,
        d,
        h,
        opcode::ATOMIC_ACKNOWLEDGE,
        psn,
        Some(a),
        Some(v),
        &[],
    );
}

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
                r.rkey,
                Some(d.qpn),
                d.pd,
                Access::RemoteRead,
                r.va,
                len,
                false,
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
                r.rkey,
                Some(d.qpn),
                d.pd,
                Access::RemoteWrite,
                r.va,
                len,
                false,
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
    // data lands (as in loopback, super::mw).
    if let Some(k) = h.ieth
        && super::mw::invalidate(hca, k, d.qpn, d.pd, true, false).is_err()
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
                let _ = super::mw::invalidate(hca, k, d.qpn, d.pd, true, true);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::Fabric;
    use crate::hca::HcaConfig;

    /// A packet the engines cannot build (here a WRITE FIRST without its
    /// RETH, as a model bug would ask for) is recorded and counted, not
    /// lost without a trace; a good one still goes out.
    #[test]
    fn a_packet_the_model_cannot_build_is_recorded_not_dropped_in_silence() {
        let fabric = Fabric::shared();
        let cfg = HcaConfig {
            cable_plugged: false,
            ..HcaConfig::default()
        };
        let ports = {
            let mut f = lock(&fabric);
            [
                Some(f.attach_hca_port(cfg.node_guid, 1)),
                Some(f.attach_hca_port(cfg.node_guid, 2)),
            ]
        };
        let mut h = Hca::for_tests(cfg);
        h.fabric = Some(FabricLink::new(fabric, ports));
        let mut hd = Headers::for_opcode(opcode::RC | opcode::RDMA_WRITE_FIRST).unwrap();
        hd.bth.dest_qp = 0x91;
        hd.reth = None;
        send_packet(&mut h, 1, &hd, &[7; 8]);
        let v = h.violations.clone();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("could not build a packet") && v[0].contains("dest QP 0x91"),
            "{v:?}"
        );
        assert_eq!(h.ports[0].counters.xmit_discards, 1);
        assert_eq!(h.ports[0].counters.xmit_pkts, 0);
    }
}
