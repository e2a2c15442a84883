//! The HCA on a fabric.
//!
//! Its ports' physical link from the fabric's cables (INIT_PORT/CLOSE_PORT enable
//! and disable the fabric port, LinkDowned counts links lost), packets built for
//! the wire (RC/UC segmented at the path MTU, RDMA READ responses, atomics,
//! ACK/NAK/RNR NAK, UD datagrams, the MADs of QP0/QP1 with the CRCs computed here),
//! and the packets taken from the fabric when the engines are stepped (CRC and
//! header checks, PortRcvErrors, P_Key/Q_Key checks, PSN checks with duplicate and
//! sequence-error handling, message reassembly straight into host memory;
//! packets to a multicast LID go to [`super::mcast`]); APM, congestion marking
//! and credit-based flow control are not modelled.
//!
//! The link (attachment, ports, transmit, receive and dispatch) is here;
//! the requester's side is in `requester.rs`, the responder's in
//! `responder.rs`.
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

mod requester;
mod responder;

pub use requester::ack_timeout;
pub(in crate::hca::engine) use requester::{
    Retx, WqeRef, busy, fail_entry, may_start, queue_local, resent, retx_for, send,
};
use requester::{discard, response};
use responder::request;

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
    /// The LinkSpeedExtEnabled the fabric was last told (`u8::MAX`:
    /// never).
    pub speeds_ext: [u8; 2],
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
            speeds_ext: [u8::MAX; 2],
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

/// Builds a packet with owed CRCs in a spare buffer and sends it on the VL
/// the port's SLtoVLMappingTable gives its SL (one mapped to VL 15 is
/// dropped at the port, as a data packet on VL 15 must not leave); one the
/// model cannot build goes to [`unbuilt`].
fn send_packet(hca: &mut Hca, port: u8, hd: &Headers, payload: &[u8]) {
    let Some(vl) = hca
        .port_index(u32::from(port))
        .map(|i| hca.ports[i].vl_of(hd.lrh.sl))
    else {
        return;
    };
    if vl == 15 {
        discard(hca, port);
        return;
    }
    let mut hd = *hd;
    hd.lrh.vl = vl;
    let hd = &hd;
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
/// fabric about INIT_PORT/CLOSE_PORT and the extended speeds the port
/// would train to, and follows the link (LinkUp and logical Init when
/// both ends are enabled and cabled; Down, LinkDowned and PORT_CHANGE when
/// it goes) and the speeds the far end would train to.
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
                || (hca.ports[i].initialized == l.enabled[i]
                    && hca.ports[i].cable == l.up[i]
                    && hca.ports[i].link_speed_ext_enabled == l.speeds_ext[i])
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
        let speeds = hca.ports[i].link_speed_ext_enabled;
        let (up, generation, peer_speeds) = {
            let mut f = lock(&link.fabric);
            if want != link.enabled[i] {
                let _ = f.set_enabled(pid, want);
            }
            if speeds != link.speeds_ext[i] {
                let _ = f.set_link_speeds_ext(pid, speeds);
            }
            (
                f.link_up(pid),
                f.link_generation(pid),
                f.peer_link_speeds_ext(pid),
            )
        };
        if let Some(l) = hca.fabric.as_mut() {
            l.enabled[i] = want;
            l.up[i] = up;
            l.speeds_ext[i] = speeds;
        }
        hca.ports[i].peer_speeds_ext = peer_speeds;
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
    if super::mcast::is_mcast_lid(h.lrh.dlid) {
        super::mcast::receive(hca, port, &h, payload, state);
        return;
    }
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
            // Connected service: the packet must come from the QP's remote
            // port, the LID (with its path bits) of the primary path.
            if h.lrh.slid != q.rlid {
                hca.engine.stats.slid_drops += 1;
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
