//! Port of Linux `drivers/infiniband/core/cm.c` (3.11), busy-polled: the IB CM for RC connections (IBTA Vol. 1 12) with its active and passive state machines.
//!
//! Ported but never exercised in LegoOS. It covers
//! REQ/MRA/REJ/REP/RTU/DREQ/DREP, listening by service ID, timeouts and retries
//! from the REQ's response timeouts and max CM retries, duplicate and stale
//! message handling, time-wait, and the QP transitions `ib_cm_init_qp_attr`
//! computes (driven by the CM itself on the QP the caller hands over), and
//! SIDR (service ID resolution for UD: [`send_sidr_req`], [`send_sidr_rep`]).
//! LAP/APR (path migration) are refused; UC/RD/XRC and alternate paths are
//! left out; `ib_cm_notify` (COMM_EST before a lost RTU) is kept.
//!
//! The CM is an [`IbClient`] whose state (one table of connection IDs per
//! device, one MAD agent per port on QP1) lives in the device's client
//! data; [`IbClient::poll`] reads the agents' mailboxes, so everything moves
//! from [`IbCore::poll`] and a caller waits for a [`CmEvent`] against a
//! deadline with [`wait_event`]. Where Linux calls a `cm_handler`, this
//! port queues the event on the ID (a new connection's REQ on its
//! listener's queue) for the caller to take.
//!
//! Decisions that differ from Linux 3.11 (and follow the IBTA):
//! * A REP for an unknown communication ID is answered with REJ "invalid
//!   communication ID" (Linux drops it silently).
//! * A duplicate REQ while the REP is outstanding re-sends the REP (Linux
//!   leaves that to the REP's own retries).
//! * A DREQ is answered with a DREP by the CM at once, after the QP was
//!   moved to the error state (Linux lets the consumer send the DREP).

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::time::Duration;

use crate::cm_msgs::*;
use crate::device::{ClientId, Device, DeviceId, IbClient, IbCore};
use crate::error::{Error, Result};
use crate::mad::{
    Mad, MadAgent, MadEvent, MadRecvWc, MadRegReq, MadSendBuf, MadSendId, class, method,
};
use crate::sa_query::{PathRecord, init_ah_from_path};
use crate::verbs::{
    AccessFlags, AhAttr, GlobalRoute, IB_QP1_QKEY, Mtu, Qp, QpAttr, QpAttrMask, QpState, QpType,
    WcStatus,
};

/// A connection ID (`struct ib_cm_id`), by device and local communication
/// ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmId {
    /// Device.
    pub dev: DeviceId,
    /// Local communication ID.
    pub local_id: u32,
}

/// `enum ib_cm_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmState {
    /// IB_CM_IDLE.
    Idle,
    /// IB_CM_LISTEN.
    Listen,
    /// IB_CM_REQ_SENT.
    ReqSent,
    /// IB_CM_REQ_RCVD.
    ReqRcvd,
    /// IB_CM_MRA_REQ_SENT.
    MraReqSent,
    /// IB_CM_MRA_REQ_RCVD.
    MraReqRcvd,
    /// IB_CM_REP_SENT.
    RepSent,
    /// IB_CM_REP_RCVD.
    RepRcvd,
    /// IB_CM_MRA_REP_SENT.
    MraRepSent,
    /// IB_CM_MRA_REP_RCVD.
    MraRepRcvd,
    /// IB_CM_ESTABLISHED.
    Established,
    /// IB_CM_DREQ_SENT.
    DreqSent,
    /// IB_CM_DREQ_RCVD.
    DreqRcvd,
    /// IB_CM_TIMEWAIT.
    Timewait,
    /// IB_CM_SIDR_REQ_SENT.
    SidrReqSent,
    /// IB_CM_SIDR_REQ_RCVD.
    SidrReqRcvd,
}

/// What happened to a connection (`enum ib_cm_event_type` with its data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// On a listener: a REQ for its service; `id` is the new connection,
    /// to accept ([`send_rep`]) or reject ([`send_rej`]).
    ReqReceived {
        /// The new connection.
        id: CmId,
        /// Port it came in on.
        port: u8,
        /// The REQ's private data (92 bytes).
        private_data: Vec<u8>,
        /// The peer's QPN.
        remote_qpn: u32,
        /// The peer's CA GUID.
        remote_ca_guid: u64,
        /// The peer's LID.
        remote_lid: u16,
        /// The P_Key of the REQ's primary path.
        pkey: u16,
        /// The GID the peer called (the primary path's remote GID: ours).
        local_gid: crate::verbs::Gid,
        /// The peer's GID (the primary path's local GID).
        remote_gid: crate::verbs::Gid,
        /// The service ID asked for.
        service_id: u64,
        /// The REQ's responder resources (RDMA READs it accepts at once).
        responder_resources: u8,
        /// The REQ's initiator depth.
        initiator_depth: u8,
        /// The REQ's retry count.
        retry_count: u8,
        /// The REQ's RNR retry count.
        rnr_retry_count: u8,
    },
    /// On a listener: a SIDR_REQ for its service (`IB_CM_SIDR_REQ_RECEIVED`);
    /// `id` is the request, to answer with [`send_sidr_rep`].
    SidrReqReceived {
        /// The request.
        id: CmId,
        /// Port it came in on.
        port: u8,
        /// The SIDR_REQ's P_Key.
        pkey: u16,
        /// The service ID asked for.
        service_id: u64,
        /// The SIDR_REQ's private data (216 bytes).
        private_data: Vec<u8>,
        /// The requester's LID and QPN (where the SIDR_REP goes).
        remote_lid: u16,
        /// The requester's QPN (its QP1, as a rule).
        remote_qpn: u32,
    },
    /// The answer to our SIDR_REQ (`IB_CM_SIDR_REP_RECEIVED`).
    SidrRepReceived {
        /// Status ([`crate::cm_msgs::sidr_status`]).
        status: u8,
        /// The service's QPN.
        qpn: u32,
        /// The service's Q_Key.
        qkey: u32,
        /// Additional information.
        info: Vec<u8>,
        /// Private data (136 bytes).
        private_data: Vec<u8>,
    },
    /// The peer needs more time (an MRA); the timeout was extended.
    MraReceived {
        /// Service timeout it asked for (4.096 us * 2^x).
        service_timeout: u8,
    },
    /// Connected; the QP is in RTS.
    Established {
        /// Private data of the REP (active side) or RTU (passive side).
        private_data: Vec<u8>,
    },
    /// The peer rejected the connection.
    Rejected {
        /// Reason ([`rej_reason`]).
        reason: u16,
        /// Additional rejection information.
        ari: Vec<u8>,
        /// Private data.
        private_data: Vec<u8>,
    },
    /// The peer never answered the REQ, REP or SIDR_REQ (all retries used:
    /// `IB_CM_REQ_ERROR`/`IB_CM_REP_ERROR`/`IB_CM_SIDR_REQ_ERROR`).
    TimedOut,
    /// The connection is closed and in time-wait; the QP is in the error
    /// state.
    Disconnected {
        /// Private data of the peer's DREQ or DREP (empty on a timeout).
        private_data: Vec<u8>,
        /// The peer asked (a DREQ came in).
        by_peer: bool,
        /// Our DREQ was never answered (`IB_CM_DREQ_ERROR`).
        dreq_timed_out: bool,
    },
}

/// `struct ib_cm_req_param` for [`send_req`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmReqParam {
    /// The path (from the SA).
    pub path: PathRecord,
    /// Service ID.
    pub service_id: u64,
    /// The RC QP to connect (in RESET; the CM drives it to RTS).
    pub qp: Qp,
    /// The PSN we expect first from the peer (24 bits): the REQ's starting
    /// PSN, which becomes our RQ PSN and the passive side's SQ PSN (Linux's
    /// reading of the field, which this port keeps for interoperation).
    pub starting_psn: u32,
    /// RDMA reads/atomics we accept at once.
    pub responder_resources: u8,
    /// RDMA reads/atomics we issue at once.
    pub initiator_depth: u8,
    /// How long the peer may take to answer (4.096 us * 2^x, 5 bits).
    pub remote_cm_response_timeout: u8,
    /// How long we take to answer (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits, 7 = infinite).
    pub rnr_retry_count: u8,
    /// CM retries (4 bits).
    pub max_cm_retries: u8,
    /// Private data (up to 92 bytes).
    pub private_data: Vec<u8>,
}

impl CmReqParam {
    /// Linux rdma_cm's defaults: response timeouts 20 (about 4.3 s),
    /// 15 CM retries, retry count 7, RNR retry 7.
    pub fn new(path: PathRecord, service_id: u64, qp: Qp) -> CmReqParam {
        CmReqParam {
            path,
            service_id,
            qp,
            starting_psn: qp.qp_num.wrapping_mul(0x9e37) & 0xff_ffff,
            responder_resources: 4,
            initiator_depth: 4,
            remote_cm_response_timeout: 20,
            local_cm_response_timeout: 20,
            retry_count: 7,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            private_data: Vec::new(),
        }
    }
}

/// `struct ib_cm_rep_param` for [`send_rep`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmRepParam {
    /// The RC QP for this connection (in RESET).
    pub qp: Qp,
    /// The PSN we expect first from the active side: the REP's starting
    /// PSN, our RQ PSN and the active side's SQ PSN (as Linux).
    pub starting_psn: u32,
    /// RDMA reads/atomics we accept at once.
    pub responder_resources: u8,
    /// RDMA reads/atomics we issue at once.
    pub initiator_depth: u8,
    /// RNR retry count the peer uses towards us (3 bits).
    pub rnr_retry_count: u8,
    /// Private data (up to 196 bytes).
    pub private_data: Vec<u8>,
}

impl CmRepParam {
    /// Defaults matching [`CmReqParam::new`].
    pub fn new(qp: Qp) -> CmRepParam {
        CmRepParam {
            qp,
            starting_psn: qp.qp_num.wrapping_mul(0x7f4a) & 0xff_ffff,
            responder_resources: 4,
            initiator_depth: 4,
            rnr_retry_count: 7,
            private_data: Vec::new(),
        }
    }
}

/// What the CM of a device counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmCounters {
    /// CM MADs received, by attribute (REQ, MRA, REJ, REP, RTU, DREQ,
    /// DREP, other, SIDR_REQ/SIDR_REP).
    pub recv: [u64; 9],
    /// CM MADs sent (first tries; MAD-layer retries not counted).
    pub sent: u64,
    /// Duplicates handled (REQ, REP, DREQ).
    pub duplicates: u64,
    /// Messages for no connection (dropped or rejected).
    pub unknown_id: u64,
    /// Stale connections refused.
    pub stale: u64,
    /// Messages dropped as malformed or unsupported.
    pub dropped: u64,
    /// REQs/REPs/DREQs that ran out of retries.
    pub timeouts: u64,
}

struct CmIdPriv {
    local_id: u32,
    remote_id: u32,
    state: CmState,
    port: u8,
    service_id: u64,
    listen: bool,
    destroyed: bool,
    qp: Option<Qp>,
    local_qpn: u32,
    remote_qpn: u32,
    remote_ca_guid: u64,
    av: AhAttr,
    /// Local ACK timeout of the QP (`av.timeout` in Linux).
    ack_timeout: u8,
    path_mtu: Mtu,
    pkey_index: u16,
    sq_psn: u32,
    rq_psn: u32,
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    max_cm_retries: u8,
    packet_life_time: u8,
    timeout_ms: u32,
    /// The outstanding MAD that expects an answer, if any.
    msg: Option<MadSendId>,
    /// The last REP or MRA sent, for duplicates.
    last_sent: Option<Mad>,
    timewait_until: u64,
    /// IB_EVENT_COMM_EST seen on the QP while the RTU is awaited.
    comm_est: bool,
    events: VecDeque<CmEvent>,
}

impl CmIdPriv {
    fn new(local_id: u32, port: u8) -> CmIdPriv {
        CmIdPriv {
            local_id,
            remote_id: 0,
            state: CmState::Idle,
            port,
            service_id: 0,
            listen: false,
            destroyed: false,
            qp: None,
            local_qpn: 0,
            remote_qpn: 0,
            remote_ca_guid: 0,
            av: AhAttr::default(),
            ack_timeout: 0,
            path_mtu: Mtu::Mtu256,
            pkey_index: 0,
            sq_psn: 0,
            rq_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 0,
            rnr_retry_count: 0,
            max_cm_retries: 0,
            packet_life_time: 0,
            timeout_ms: 0,
            msg: None,
            last_sent: None,
            timewait_until: 0,
            comm_est: false,
            events: VecDeque::new(),
        }
    }
    fn push(&mut self, ev: CmEvent) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(ev);
    }
}

/// `-ECONNREFUSED` (Linux x86 value), what [`connect`] returns after a
/// REJ.
pub const ECONNREFUSED: i32 = 111;

/// Events kept per ID before the oldest is dropped.
const MAX_EVENTS: usize = 64;
/// Connection IDs per device.
const MAX_IDS: usize = 4096;

/// Per-device CM state (`struct cm_device` plus this device's share of
/// Linux's global ID tables).
pub struct CmDevice {
    agents: Vec<Option<MadAgent>>,
    ids: Vec<CmIdPriv>,
    next_id: u32,
    random_id_operand: u32,
    node_guid: u64,
    ack_delay: u8,
    counters: CmCounters,
}

struct CmSlot(Option<CmDevice>);

/// The CM client (`cm_client` with `cm_add_one`/`cm_remove_one`).
pub struct CmClient;

/// `ib_cm_init`: registers the CM with the core; the id names the CM in
/// every call. There is one CM per core, as Linux's module is one per
/// system: it owns the CM class on QP1 (a second one could not register
/// its MAD agent), so a later call returns the CM already registered and
/// every user shares its listeners and connections.
#[doc(alias = "ib_cm_init")]
pub fn init(core: &mut IbCore) -> ClientId {
    if let Some(id) = core.client_by_name(CmClient.name()) {
        return id;
    }
    core.register_client(Box::new(CmClient))
}

impl IbClient for CmClient {
    fn name(&self) -> &str {
        "cm"
    }
    fn accepts(&self, _n: crate::verbs::NodeType, t: crate::verbs::Transport) -> bool {
        t == crate::verbs::Transport::Ib
    }
    fn add(&mut self, me: ClientId, dev: &mut Device) {
        let node_guid = dev.info().node_guid;
        let ack_delay = dev.query_device().map_or(15, |a| a.local_ca_ack_delay);
        let ports = usize::from(dev.phys_port_cnt());
        let operand = (node_guid as u32) ^ ((node_guid >> 32) as u32) ^ 0x5bd1_e995;
        dev.set_client_data(
            me,
            Box::new(CmSlot(Some(CmDevice {
                agents: (0..ports).map(|_| None).collect(),
                ids: Vec::new(),
                next_id: 1,
                random_id_operand: operand,
                node_guid,
                ack_delay,
                counters: CmCounters::default(),
            }))),
        );
    }
    fn remove(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn event(&mut self, me: ClientId, dev: &mut Device, event: &crate::verbs::Event) {
        // The first packet on a QP whose RTU was lost (`ib_cm_notify`,
        // done for the consumer); finished by the next poll.
        if event.event != crate::verbs::EventType::CommEst {
            return;
        }
        let crate::verbs::EventElement::Qp(qp) = event.element else {
            return;
        };
        let Some(CmSlot(Some(cd))) = dev.client_data::<CmSlot>(me) else {
            return;
        };
        for c in cd.ids.iter_mut() {
            if c.qp.map(|q| q.handle) == Some(qp.handle)
                && matches!(c.state, CmState::RepSent | CmState::MraRepRcvd)
            {
                c.comm_est = true;
            }
        }
    }
    fn poll(&mut self, me: ClientId, core: &mut IbCore) -> usize {
        let mut work = 0;
        // By index: the progress function allocates nothing here.
        for i in 0..core.devices.len() {
            let dev = DeviceId(i as u32);
            if core.devices[i].is_none() {
                continue;
            }
            work +=
                with_cm(core, me, dev, |core, cm| Ok(cm_poll_device(core, dev, cm))).unwrap_or(0);
        }
        work
    }
}

fn with_cm<T>(
    core: &mut IbCore,
    cm: ClientId,
    dev: DeviceId,
    f: impl FnOnce(&mut IbCore, &mut CmDevice) -> Result<T>,
) -> Result<T> {
    let d = core.device_mut(dev).ok_or(Error::NoDev)?;
    let slot = d.client_data::<CmSlot>(cm).ok_or(Error::NoDev)?;
    let mut cd = slot.0.take().ok_or(Error::Busy)?;
    let r = f(core, &mut cd);
    if let Some(d) = core.device_mut(dev)
        && let Some(slot) = d.client_data::<CmSlot>(cm)
    {
        slot.0 = Some(cd);
    }
    r
}

/// `cm_convert_to_ms`: 4.096 us * 2^t, as Linux rounds it.
pub fn cm_convert_to_ms(iba_time: u8) -> u32 {
    1u32 << u32::from(iba_time.min(31)).saturating_sub(8)
}

/// `cm_ack_timeout`: the local ACK timeout from the CA's ACK delay and the
/// path's packet life time.
pub fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let mut t = i32::from(packet_life_time) + 1;
    let d = i32::from(ca_ack_delay);
    if t >= d {
        t += i32::from(d >= t - 1);
    } else {
        t = d + i32::from(t >= d - 1);
    }
    t.min(31) as u8
}

fn mtu_from(code: u8) -> Option<Mtu> {
    match code {
        1 => Some(Mtu::Mtu256),
        2 => Some(Mtu::Mtu512),
        3 => Some(Mtu::Mtu1024),
        4 => Some(Mtu::Mtu2048),
        5 => Some(Mtu::Mtu4096),
        _ => None,
    }
}

impl CmDevice {
    fn alloc_id(&mut self, port: u8) -> Result<usize> {
        if self.ids.len() >= MAX_IDS {
            return Err(Error::NoMem);
        }
        loop {
            let n = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            let id = n ^ self.random_id_operand;
            if id != 0 && !self.ids.iter().any(|c| c.local_id == id) {
                self.ids.push(CmIdPriv::new(id, port));
                return Ok(self.ids.len() - 1);
            }
        }
    }
    fn find(&self, local_id: u32) -> Option<usize> {
        self.ids
            .iter()
            .position(|c| c.local_id == local_id && !c.listen)
    }
    fn get(&mut self, local_id: u32) -> Result<&mut CmIdPriv> {
        self.ids
            .iter_mut()
            .find(|c| c.local_id == local_id && !c.destroyed)
            .ok_or(Error::NotFound)
    }
}

fn ensure_agent(core: &mut IbCore, dev: DeviceId, cm: &mut CmDevice, port: u8) -> Result<MadAgent> {
    let slot = cm
        .agents
        .get_mut(usize::from(port).wrapping_sub(1))
        .ok_or(Error::Invalid("port number out of range"))?;
    if let Some(a) = *slot {
        return Ok(a);
    }
    let a = core.register_mad_agent(
        dev,
        port,
        QpType::Gsi,
        Some(MadRegReq::new(
            class::CM,
            IB_CM_CLASS_VERSION,
            &[method::SEND],
        )),
        0,
    )?;
    *slot = Some(a);
    Ok(a)
}

/// Sends a CM MAD to the peer of `c` (its primary path, QP1); with
/// `expect` it waits `timeout_ms` per try and retries `max_cm_retries`
/// times, the id keeping the send so an answer can cancel it.
fn cm_send(
    core: &mut IbCore,
    dev: DeviceId,
    cm: &mut CmDevice,
    ci: usize,
    mad: Mad,
    expect: bool,
) -> Result<()> {
    let port = cm.ids[ci].port;
    let agent = ensure_agent(core, dev, cm, port)?;
    let c = &mut cm.ids[ci];
    let mut buf = MadSendBuf::new(mad, c.av, 1);
    buf.ah_attr.port_num = port;
    buf.remote_qkey = IB_QP1_QKEY;
    buf.pkey_index = c.pkey_index;
    if expect {
        buf.timeout_ms = c.timeout_ms.max(1);
        buf.retries = u32::from(c.max_cm_retries);
    }
    let id = core.post_send_mad(agent, buf)?;
    if expect && let Some(old) = c.msg.replace(id) {
        let _ = core.cancel_mad(agent, old);
    }
    cm.counters.sent += 1;
    Ok(())
}

/// Sends a CM MAD back to where `r` came from (REJ, DREP, RTU resend...).
fn cm_send_response(core: &mut IbCore, agent: MadAgent, r: &MadRecvWc, mad: Mad) {
    let mut buf = MadSendBuf::new(
        mad,
        AhAttr {
            dlid: r.wc.slid,
            sl: r.wc.sl,
            src_path_bits: r.wc.dlid_path_bits,
            port_num: r.port,
            ..AhAttr::default()
        },
        r.wc.src_qp,
    );
    if let Some(g) = &r.grh {
        buf.ah_attr.grh = Some(GlobalRoute {
            dgid: g.sgid(),
            flow_label: g.flow_label(),
            sgid_index: 0,
            hop_limit: 0xff,
            traffic_class: g.traffic_class(),
        });
    }
    buf.remote_qkey = IB_QP1_QKEY;
    buf.pkey_index = r.wc.pkey_index;
    let _ = core.post_send_mad(agent, buf);
}

/// `cm_issue_rej`: a REJ for a message that has no connection to go with.
fn cm_issue_rej(core: &mut IbCore, agent: MadAgent, r: &MadRecvWc, reason: u16, msg_rejected: u8) {
    let (their_local, their_remote) = comm_ids(&r.mad);
    let rej = CmRej {
        local_comm_id: their_remote,
        remote_comm_id: their_local,
        msg_rejected,
        reason,
        ari: Vec::new(),
        private_data: Vec::new(),
    };
    if let Ok(mut m) = rej.pack() {
        if msg_rejected == msg_response::REQ {
            // A REJ of a REQ has no local ID to name.
            m.0[24..28].fill(0);
        }
        cm_send_response(core, agent, r, m);
    }
}

fn cancel_msg(core: &mut IbCore, cm: &mut CmDevice, ci: usize) {
    let port = cm.ids[ci].port;
    if let Some(id) = cm.ids[ci].msg.take()
        && let Some(Some(a)) = cm.agents.get(usize::from(port).wrapping_sub(1))
    {
        let _ = core.cancel_mad(*a, id);
    }
}

fn modify_qp(
    core: &mut IbCore,
    dev: DeviceId,
    cm: &CmDevice,
    ci: usize,
    state: QpState,
) -> Result<()> {
    let c = &cm.ids[ci];
    let qp = c.qp.ok_or(Error::Invalid("connection without a QP"))?;
    let (attr, mask) = cm_init_qp_attr(c, state)?;
    core.device_mut(dev)
        .ok_or(Error::NoDev)?
        .modify_qp(qp, &attr, mask)
}

fn qp_to_error(core: &mut IbCore, dev: DeviceId, cm: &CmDevice, ci: usize) {
    if let Some(qp) = cm.ids[ci].qp
        && let Some(d) = core.device_mut(dev)
    {
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = d.modify_qp(qp, &attr, QpAttrMask::STATE);
    }
}

/// `cm_enter_timewait`: the connection waits out packets still in flight
/// (the local ACK timeout) before its IDs may be reused.
fn enter_timewait(core: &IbCore, cm: &mut CmDevice, ci: usize) {
    let c = &mut cm.ids[ci];
    c.state = CmState::Timewait;
    let ms = u64::from(cm_convert_to_ms(c.ack_timeout)).max(1);
    c.timewait_until = core.clock().now_ns().saturating_add(ms * 1_000_000);
}

/// `ib_cm_init_qp_attr`: the attributes and mask that move the
/// connection's QP to `state` (INIT, RTR or RTS), as Linux's
/// `cm_init_qp_{init,rtr,rts}_attr` build them for RC.
#[doc(alias = "ib_cm_init_qp_attr")]
pub fn init_qp_attr(
    core: &mut IbCore,
    cm: ClientId,
    id: CmId,
    state: QpState,
) -> Result<(QpAttr, QpAttrMask)> {
    with_cm(core, cm, id.dev, |_, cd| {
        cm_init_qp_attr(cd.get(id.local_id)?, state)
    })
}

fn cm_init_qp_attr(c: &CmIdPriv, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
    let mut a = QpAttr {
        qp_state: state,
        ..QpAttr::default()
    };
    match state {
        QpState::Init => {
            // Idle: the active side's QP, before its REQ goes out.
            if !matches!(
                c.state,
                CmState::Idle
                    | CmState::ReqSent
                    | CmState::MraReqRcvd
                    | CmState::ReqRcvd
                    | CmState::MraReqSent
                    | CmState::RepRcvd
                    | CmState::MraRepSent
                    | CmState::RepSent
                    | CmState::MraRepRcvd
                    | CmState::Established
            ) {
                return Err(Error::Invalid("CM state has no INIT attributes"));
            }
            a.qp_access_flags = AccessFlags::REMOTE_WRITE;
            if c.responder_resources > 0 {
                a.qp_access_flags |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
            }
            a.pkey_index = c.pkey_index;
            a.port_num = c.port;
            Ok((
                a,
                QpAttrMask::STATE
                    | QpAttrMask::ACCESS_FLAGS
                    | QpAttrMask::PKEY_INDEX
                    | QpAttrMask::PORT,
            ))
        }
        QpState::Rtr => {
            if !matches!(
                c.state,
                CmState::ReqRcvd
                    | CmState::MraReqSent
                    | CmState::RepRcvd
                    | CmState::MraRepSent
                    | CmState::RepSent
                    | CmState::MraRepRcvd
                    | CmState::Established
            ) {
                return Err(Error::Invalid("CM state has no RTR attributes"));
            }
            a.ah_attr = c.av;
            a.path_mtu = c.path_mtu;
            a.dest_qp_num = c.remote_qpn;
            a.rq_psn = c.rq_psn;
            a.max_dest_rd_atomic = c.responder_resources;
            a.min_rnr_timer = 0;
            Ok((
                a,
                QpAttrMask::STATE
                    | QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER,
            ))
        }
        QpState::Rts => {
            if !matches!(
                c.state,
                CmState::RepRcvd
                    | CmState::MraRepSent
                    | CmState::RepSent
                    | CmState::MraRepRcvd
                    | CmState::Established
            ) {
                return Err(Error::Invalid("CM state has no RTS attributes"));
            }
            a.sq_psn = c.sq_psn;
            a.timeout = c.ack_timeout;
            a.retry_cnt = c.retry_count;
            a.rnr_retry = c.rnr_retry_count;
            a.max_rd_atomic = c.initiator_depth;
            Ok((
                a,
                QpAttrMask::STATE
                    | QpAttrMask::SQ_PSN
                    | QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::MAX_QP_RD_ATOMIC,
            ))
        }
        _ => Err(Error::Invalid("the CM sets up INIT, RTR and RTS only")),
    }
}

// ---------------------------------------------------------------------------
// The consumer's calls

/// `ib_cm_listen`: a listener for `service_id` on every port of `dev`;
/// REQs for it arrive as [`CmEvent::ReqReceived`] on the listener. A
/// service ID already listened to is refused (`-EBUSY` in Linux).
#[doc(alias = "ib_cm_listen")]
pub fn listen(core: &mut IbCore, cm: ClientId, dev: DeviceId, service_id: u64) -> Result<CmId> {
    with_cm(core, cm, dev, |core, cd| {
        if cd
            .ids
            .iter()
            .any(|c| c.listen && !c.destroyed && c.service_id == service_id)
        {
            return Err(Error::Conflict("service ID already listened to"));
        }
        for p in 1..=cd.agents.len() as u8 {
            ensure_agent(core, dev, cd, p)?;
        }
        let ci = cd.alloc_id(0)?;
        let c = &mut cd.ids[ci];
        c.listen = true;
        c.state = CmState::Listen;
        c.service_id = service_id;
        Ok(CmId {
            dev,
            local_id: c.local_id,
        })
    })
}

/// `ib_send_cm_req`: brings `param.qp` to INIT and sends a REQ along
/// `param.path` from `port`. The answer arrives as an event on the
/// returned ID: [`CmEvent::Established`] (the QP is then in RTS and the
/// RTU sent), [`CmEvent::Rejected`] or [`CmEvent::TimedOut`] after
/// `max_cm_retries` retries of `2 * packet life + remote response timeout`
/// each.
#[doc(alias = "ib_send_cm_req")]
pub fn send_req(
    core: &mut IbCore,
    cm: ClientId,
    dev: DeviceId,
    port: u8,
    param: &CmReqParam,
) -> Result<CmId> {
    if param.private_data.len() > private_len::REQ {
        return Err(Error::MsgSize);
    }
    let mtu = mtu_from(param.path.mtu).ok_or(Error::Invalid("path MTU code out of range"))?;
    let (av, pkey_index, sgid) = {
        let d = core.device(dev).ok_or(Error::NoDev)?;
        let av = init_ah_from_path(d, port, &param.path)?;
        let pkey_index = d
            .port_cache(port)?
            .find_pkey(param.path.pkey)
            .map_err(|_| Error::Invalid("path P_Key is not in the port's table"))?;
        (av, pkey_index, param.path.sgid)
    };
    with_cm(core, cm, dev, |core, cd| {
        ensure_agent(core, dev, cd, port)?;
        let ack_delay = cd.ack_delay;
        let guid = cd.node_guid;
        let ci = cd.alloc_id(port)?;
        let c = &mut cd.ids[ci];
        c.service_id = param.service_id;
        c.qp = Some(param.qp);
        c.local_qpn = param.qp.qp_num;
        c.av = av;
        c.packet_life_time = param.path.packet_life_time;
        c.ack_timeout = param.path.packet_life_time.min(30) + 1;
        c.path_mtu = mtu;
        c.pkey_index = pkey_index;
        c.rq_psn = param.starting_psn & 0xff_ffff;
        c.responder_resources = param.responder_resources;
        c.initiator_depth = param.initiator_depth;
        c.retry_count = param.retry_count & 7;
        c.rnr_retry_count = param.rnr_retry_count & 7;
        c.max_cm_retries = param.max_cm_retries & 0xf;
        c.timeout_ms = cm_convert_to_ms(param.path.packet_life_time) * 2
            + cm_convert_to_ms(param.remote_cm_response_timeout);
        let local_id = c.local_id;
        let req = CmReq {
            local_comm_id: local_id,
            service_id: param.service_id,
            local_ca_guid: guid,
            local_qkey: 0,
            local_qpn: param.qp.qp_num & 0xff_ffff,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            remote_cm_response_timeout: param.remote_cm_response_timeout & 0x1f,
            transport_type: 0,
            flow_control: true,
            starting_psn: c.rq_psn,
            local_cm_response_timeout: param.local_cm_response_timeout & 0x1f,
            retry_count: c.retry_count,
            pkey: param.path.pkey,
            path_mtu: param.path.mtu,
            rnr_retry_count: c.rnr_retry_count,
            max_cm_retries: c.max_cm_retries,
            primary: crate::cm_msgs::CmReqPath {
                local_lid: param.path.slid,
                remote_lid: param.path.dlid,
                local_gid: sgid,
                remote_gid: param.path.dgid,
                flow_label: param.path.flow_label,
                packet_rate: param.path.rate,
                traffic_class: param.path.traffic_class,
                hop_limit: param.path.hop_limit,
                sl: param.path.sl,
                subnet_local: param.path.hop_limit <= 1,
                local_ack_timeout: cm_ack_timeout(ack_delay, param.path.packet_life_time),
            },
            private_data: param.private_data.clone(),
            ..CmReq::default()
        };
        let r = (|| {
            let mad = req.pack()?;
            modify_qp(core, dev, cd, ci, QpState::Init)?;
            cm_send(core, dev, cd, ci, mad, true)
        })();
        if let Err(e) = r {
            cd.ids.swap_remove(ci);
            return Err(e);
        }
        cd.ids[ci].state = CmState::ReqSent;
        Ok(CmId { dev, local_id })
    })
}

/// `ib_send_cm_rep`: accepts a connection announced by
/// [`CmEvent::ReqReceived`]: brings `param.qp` through INIT to RTR and
/// sends the REP; the RTU moves the QP to RTS ([`CmEvent::Established`]).
#[doc(alias = "ib_send_cm_rep")]
pub fn send_rep(core: &mut IbCore, cm: ClientId, id: CmId, param: &CmRepParam) -> Result<()> {
    if param.private_data.len() > private_len::REP {
        return Err(Error::MsgSize);
    }
    with_cm(core, cm, id.dev, |core, cd| {
        let ack_delay = cd.ack_delay;
        let guid = cd.node_guid;
        let ci = cd.find(id.local_id).ok_or(Error::NotFound)?;
        let c = &mut cd.ids[ci];
        if !matches!(c.state, CmState::ReqRcvd | CmState::MraReqSent) {
            return Err(Error::Invalid("no REQ to answer in this CM state"));
        }
        c.qp = Some(param.qp);
        c.local_qpn = param.qp.qp_num;
        c.rq_psn = param.starting_psn & 0xff_ffff;
        // The consumer's values (as Linux), kept within what the REQ
        // offered (IBTA 12.7.20/21).
        c.responder_resources = param.responder_resources.min(c.responder_resources);
        c.initiator_depth = param.initiator_depth.min(c.initiator_depth);
        let rep = CmRep {
            local_comm_id: c.local_id,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: param.qp.qp_num & 0xff_ffff,
            starting_psn: c.rq_psn,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            target_ack_delay: ack_delay,
            failover_accepted: 0,
            flow_control: true,
            rnr_retry_count: param.rnr_retry_count & 7,
            srq: false,
            local_ca_guid: guid,
            private_data: param.private_data.clone(),
            ..CmRep::default()
        };
        let mad = rep.pack()?;
        modify_qp(core, id.dev, cd, ci, QpState::Init)?;
        modify_qp(core, id.dev, cd, ci, QpState::Rtr)?;
        cd.ids[ci].last_sent = Some(mad.clone());
        cm_send(core, id.dev, cd, ci, mad, true)?;
        cd.ids[ci].state = CmState::RepSent;
        Ok(())
    })
}

/// `ib_send_cm_rej`: refuses a connection in REQ_RCVD/MRA_REQ_SENT (the
/// REQ) or REP_RCVD (the REP) with `reason`.
#[doc(alias = "ib_send_cm_rej")]
pub fn send_rej(
    core: &mut IbCore,
    cm: ClientId,
    id: CmId,
    reason: u16,
    ari: &[u8],
    private_data: &[u8],
) -> Result<()> {
    with_cm(core, cm, id.dev, |core, cd| {
        let ci = cd.find(id.local_id).ok_or(Error::NotFound)?;
        let c = &cd.ids[ci];
        let msg_rejected = match c.state {
            CmState::ReqRcvd | CmState::MraReqSent => msg_response::REQ,
            CmState::RepRcvd | CmState::MraRepSent => msg_response::REP,
            _ => return Err(Error::Invalid("nothing to reject in this CM state")),
        };
        let rej = CmRej {
            // cm_format_rej: no local ID for a REQ not yet acknowledged.
            local_comm_id: if c.state == CmState::ReqRcvd {
                0
            } else {
                c.local_id
            },
            remote_comm_id: c.remote_id,
            msg_rejected,
            reason,
            ari: ari.to_vec(),
            private_data: private_data.to_vec(),
        };
        let mad = rej.pack()?;
        cm_send(core, id.dev, cd, ci, mad, false)?;
        if msg_rejected == msg_response::REP {
            enter_timewait(core, cd, ci);
        } else {
            cd.ids[ci].state = CmState::Idle;
        }
        Ok(())
    })
}

/// `ib_send_cm_mra`: tells the active side the REQ needs more time
/// (`service_timeout`, 4.096 us * 2^x); a duplicate REQ re-sends it.
#[doc(alias = "ib_send_cm_mra")]
pub fn send_mra(
    core: &mut IbCore,
    cm: ClientId,
    id: CmId,
    service_timeout: u8,
    private_data: &[u8],
) -> Result<()> {
    with_cm(core, cm, id.dev, |core, cd| {
        let ci = cd.find(id.local_id).ok_or(Error::NotFound)?;
        let c = &cd.ids[ci];
        if c.state != CmState::ReqRcvd {
            return Err(Error::Invalid("MRA only answers a REQ being considered"));
        }
        let mra = CmMra {
            local_comm_id: c.local_id,
            remote_comm_id: c.remote_id,
            msg_mraed: msg_response::REQ,
            service_timeout: service_timeout & 0x1f,
            private_data: private_data.to_vec(),
        };
        let mad = mra.pack()?;
        cm_send(core, id.dev, cd, ci, mad.clone(), false)?;
        cd.ids[ci].last_sent = Some(mad);
        cd.ids[ci].state = CmState::MraReqSent;
        Ok(())
    })
}

/// `ib_send_cm_dreq`: disconnects an established connection; the QP goes
/// to the error state, and [`CmEvent::Disconnected`] follows the DREP (or
/// the last DREQ retry).
#[doc(alias = "ib_send_cm_dreq")]
pub fn send_dreq(core: &mut IbCore, cm: ClientId, id: CmId, private_data: &[u8]) -> Result<()> {
    with_cm(core, cm, id.dev, |core, cd| {
        let ci = cd.find(id.local_id).ok_or(Error::NotFound)?;
        let c = &cd.ids[ci];
        if c.state != CmState::Established {
            return Err(Error::Invalid("DREQ needs an established connection"));
        }
        let dreq = CmIds {
            local_comm_id: c.local_id,
            remote_comm_id: c.remote_id,
            remote_qpn: c.remote_qpn,
            private_data: private_data.to_vec(),
        };
        let mad = dreq.pack(cm_attr::DREQ)?;
        qp_to_error(core, id.dev, cd, ci);
        cm_send(core, id.dev, cd, ci, mad, true)?;
        cd.ids[ci].state = CmState::DreqSent;
        Ok(())
    })
}

/// `ib_destroy_cm_id`: ends whatever the ID was doing as Linux's
/// `cm_destroy_id` does (a REQ being waited for or considered is rejected,
/// an established connection gets a DREQ) and forgets it; an ID in
/// time-wait stays until the wait is over, so stale REQs are still caught.
#[doc(alias = "ib_destroy_cm_id")]
pub fn destroy_id(core: &mut IbCore, cm: ClientId, id: CmId) -> Result<()> {
    with_cm(core, cm, id.dev, |core, cd| {
        let ci = cd
            .ids
            .iter()
            .position(|c| c.local_id == id.local_id && !c.destroyed)
            .ok_or(Error::NotFound)?;
        cancel_msg(core, cd, ci);
        let guid = cd.node_guid;
        let c = &cd.ids[ci];
        let reject = |reason, msg| CmRej {
            local_comm_id: c.local_id,
            remote_comm_id: c.remote_id,
            msg_rejected: msg,
            reason,
            ari: Vec::new(),
            private_data: Vec::new(),
        };
        let farewell = match c.state {
            CmState::ReqSent | CmState::MraReqRcvd => {
                // cm_format_rej for a state with nothing received: "other",
                // and the CA GUID in the ARI so the peer finds its ID.
                let mut r = reject(rej_reason::TIMEOUT, msg_response::OTHER);
                r.ari = guid.to_be_bytes().to_vec();
                r.pack().ok()
            }
            CmState::ReqRcvd | CmState::MraReqSent => {
                reject(rej_reason::CONSUMER_DEFINED, msg_response::REQ)
                    .pack()
                    .ok()
            }
            CmState::RepSent | CmState::MraRepRcvd | CmState::RepRcvd | CmState::MraRepSent => {
                reject(rej_reason::CONSUMER_DEFINED, msg_response::REP)
                    .pack()
                    .ok()
            }
            CmState::Established => CmIds {
                local_comm_id: c.local_id,
                remote_comm_id: c.remote_id,
                remote_qpn: c.remote_qpn,
                private_data: Vec::new(),
            }
            .pack(cm_attr::DREQ)
            .ok(),
            // cm_reject_sidr_req: a request no one answered is refused.
            CmState::SidrReqRcvd => CmSidrRep {
                request_id: c.remote_id,
                status: sidr_status::REJECT,
                service_id: c.service_id,
                ..CmSidrRep::default()
            }
            .pack()
            .ok(),
            _ => None,
        };
        let was = c.state;
        if let Some(m) = farewell {
            let _ = cm_send(core, id.dev, cd, ci, m, false);
        }
        if matches!(
            was,
            CmState::Established | CmState::DreqSent | CmState::DreqRcvd
        ) {
            qp_to_error(core, id.dev, cd, ci);
            enter_timewait(core, cd, ci);
        }
        if cd.ids[ci].state == CmState::Timewait {
            cd.ids[ci].destroyed = true;
            cd.ids[ci].events.clear();
        } else {
            cd.ids.swap_remove(ci);
        }
        Ok(())
    })
}

/// `ib_cm_notify` with `IB_EVENT_COMM_EST`: data arrived on the QP before
/// the RTU (which was lost), so the connection is established now. The CM
/// does this itself when the provider reports the event on the QP.
#[doc(alias = "ib_cm_notify")]
pub fn notify(core: &mut IbCore, cm: ClientId, id: CmId) -> Result<()> {
    with_cm(core, cm, id.dev, |core, cd| {
        let ci = cd.find(id.local_id).ok_or(Error::NotFound)?;
        if !matches!(cd.ids[ci].state, CmState::RepSent | CmState::MraRepRcvd) {
            return Err(Error::Invalid("no RTU awaited in this CM state"));
        }
        cm_establish(core, id.dev, cd, ci, Vec::new());
        Ok(())
    })
}

/// The next event of an ID (does not poll).
pub fn get_event(core: &mut IbCore, cm: ClientId, id: CmId) -> Option<CmEvent> {
    with_cm(core, cm, id.dev, |_, cd| {
        Ok(cd.get(id.local_id)?.events.pop_front())
    })
    .ok()
    .flatten()
}

/// Polls the core until the ID has an event or `timeout` passes
/// (`-ETIMEDOUT`).
pub fn wait_event(core: &mut IbCore, cm: ClientId, id: CmId, timeout: Duration) -> Result<CmEvent> {
    core.poll_until(timeout, |core| {
        match with_cm(core, cm, id.dev, |_, cd| {
            Ok(cd.get(id.local_id)?.events.pop_front())
        }) {
            Ok(ev) => ev.map(Ok),
            // The ID or its device is gone: nothing will come.
            Err(e) => Some(Err(e)),
        }
    })?
}

/// The state of an ID.
pub fn state(core: &mut IbCore, cm: ClientId, id: CmId) -> Option<CmState> {
    with_cm(core, cm, id.dev, |_, cd| Ok(cd.get(id.local_id)?.state)).ok()
}

/// The peer's communication ID and QPN.
pub fn remote(core: &mut IbCore, cm: ClientId, id: CmId) -> Option<(u32, u32)> {
    with_cm(core, cm, id.dev, |_, cd| {
        let c = cd.get(id.local_id)?;
        Ok((c.remote_id, c.remote_qpn))
    })
    .ok()
}

/// What the CM of a device counted.
pub fn counters(core: &mut IbCore, cm: ClientId, dev: DeviceId) -> Option<CmCounters> {
    with_cm(core, cm, dev, |_, cd| Ok(cd.counters)).ok()
}

/// `struct ib_cm_sidr_req_param` for [`send_sidr_req`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmSidrReqParam {
    /// The path to the service's port.
    pub path: PathRecord,
    /// Service ID.
    pub service_id: u64,
    /// How long one try waits for the SIDR_REP.
    pub timeout_ms: u32,
    /// Retries after the first try.
    pub max_cm_retries: u8,
    /// Private data (up to 216 bytes).
    pub private_data: Vec<u8>,
}

/// `ib_send_cm_sidr_req`: asks the CM of the path's destination which UD
/// QPN and Q_Key serve `param.service_id`. The answer arrives on the
/// returned ID as [`CmEvent::SidrRepReceived`], or [`CmEvent::TimedOut`]
/// after the retries.
#[doc(alias = "ib_send_cm_sidr_req")]
pub fn send_sidr_req(
    core: &mut IbCore,
    cm: ClientId,
    dev: DeviceId,
    port: u8,
    param: &CmSidrReqParam,
) -> Result<CmId> {
    if param.private_data.len() > private_len::SIDR_REQ {
        return Err(Error::MsgSize);
    }
    let (av, pkey_index) = {
        let d = core.device(dev).ok_or(Error::NoDev)?;
        let av = init_ah_from_path(d, port, &param.path)?;
        let pkey_index = d
            .port_cache(port)?
            .find_pkey(param.path.pkey)
            .map_err(|_| Error::Invalid("path P_Key is not in the port's table"))?;
        (av, pkey_index)
    };
    with_cm(core, cm, dev, |core, cd| {
        ensure_agent(core, dev, cd, port)?;
        let ci = cd.alloc_id(port)?;
        let c = &mut cd.ids[ci];
        c.service_id = param.service_id;
        c.av = av;
        c.pkey_index = pkey_index;
        c.timeout_ms = param.timeout_ms.max(1);
        c.max_cm_retries = param.max_cm_retries;
        let local_id = c.local_id;
        let req = CmSidrReq {
            request_id: local_id,
            pkey: param.path.pkey,
            service_id: param.service_id,
            private_data: param.private_data.clone(),
        };
        let r = req
            .pack()
            .and_then(|mad| cm_send(core, dev, cd, ci, mad, true));
        if let Err(e) = r {
            cd.ids.swap_remove(ci);
            return Err(e);
        }
        cd.ids[ci].state = CmState::SidrReqSent;
        Ok(CmId { dev, local_id })
    })
}

/// `ib_send_cm_sidr_rep`: answers a request announced by
/// [`CmEvent::SidrReqReceived`] with `status` and, on success, the QPN and
/// Q_Key of the service. The ID stays (a repeated SIDR_REQ gets the same
/// answer) until [`destroy_id`].
#[doc(alias = "ib_send_cm_sidr_rep")]
pub fn send_sidr_rep(
    core: &mut IbCore,
    cm: ClientId,
    id: CmId,
    status: u8,
    qpn: u32,
    qkey: u32,
    private_data: &[u8],
) -> Result<()> {
    if private_data.len() > private_len::SIDR_REP {
        return Err(Error::MsgSize);
    }
    with_cm(core, cm, id.dev, |core, cd| {
        let ci = cd.find(id.local_id).ok_or(Error::NotFound)?;
        let c = &cd.ids[ci];
        if c.state != CmState::SidrReqRcvd {
            return Err(Error::Invalid("no SIDR_REQ to answer in this CM state"));
        }
        let rep = CmSidrRep {
            request_id: c.remote_id,
            status,
            info_length: 0,
            qpn,
            service_id: c.service_id,
            qkey,
            info: Vec::new(),
            private_data: private_data.to_vec(),
        };
        let mad = rep.pack()?;
        cm_send(core, id.dev, cd, ci, mad.clone(), false)?;
        cd.ids[ci].last_sent = Some(mad);
        cd.ids[ci].state = CmState::Idle;
        Ok(())
    })
}

/// Connect in one call: [`send_req`], then wait until the connection
/// is established (returns the ID) or fails: a REJ is
/// [`Error::Errno`]`(ECONNREFUSED)` and a silent peer `-ETIMEDOUT`, both
/// within `timeout`; the ID is destroyed on failure.
pub fn connect(
    core: &mut IbCore,
    cm: ClientId,
    dev: DeviceId,
    port: u8,
    param: &CmReqParam,
    timeout: Duration,
) -> Result<(CmId, Vec<u8>)> {
    let id = send_req(core, cm, dev, port, param)?;
    let r = loop {
        match wait_event(core, cm, id, timeout) {
            Ok(CmEvent::Established { private_data }) => break Ok(private_data),
            Ok(CmEvent::MraReceived { .. }) => continue,
            Ok(CmEvent::Rejected { .. }) => break Err(Error::Errno(ECONNREFUSED)),
            Ok(CmEvent::TimedOut) | Err(Error::TimedOut) => break Err(Error::TimedOut),
            Ok(_) => break Err(Error::Invalid("unexpected CM event while connecting")),
            Err(e) => break Err(e),
        }
    };
    match r {
        Ok(pd) => Ok((id, pd)),
        Err(e) => {
            let _ = destroy_id(core, cm, id);
            Err(e)
        }
    }
}

/// Accept in one call (a server's side of [`connect`]): waits on
/// `listen` for the next REQ, answers it with `param` (its QP is driven to
/// RTS) and waits for the RTU, all within `timeout`. Returns the
/// connection and the REQ's private data (92 bytes). A REQ whose
/// connection then fails is destroyed and the error returned.
pub fn accept(
    core: &mut IbCore,
    cm: ClientId,
    listen: CmId,
    param: &CmRepParam,
    timeout: Duration,
) -> Result<(CmId, Vec<u8>)> {
    let deadline = hal::Deadline::after(core.clock(), timeout);
    let left = |core: &IbCore| deadline.remaining(core.clock());
    let (id, req_private) = loop {
        match wait_event(core, cm, listen, left(core))? {
            CmEvent::ReqReceived {
                id, private_data, ..
            } => break (id, private_data),
            _ => continue,
        }
    };
    let r = send_rep(core, cm, id, param).and_then(|_| {
        loop {
            match wait_event(core, cm, id, left(core))? {
                CmEvent::Established { .. } => break Ok(()),
                CmEvent::Rejected { .. } => {
                    break Err(Error::Errno(ECONNREFUSED));
                }
                CmEvent::TimedOut => break Err(Error::TimedOut),
                _ => continue,
            }
        }
    });
    match r {
        Ok(()) => Ok((id, req_private)),
        Err(e) => {
            let _ = destroy_id(core, cm, id);
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------
// The receive side (cm_recv_handler and the per-message handlers)

fn cm_poll_device(core: &mut IbCore, dev: DeviceId, cd: &mut CmDevice) -> usize {
    let mut work = 0;
    for pi in 0..cd.agents.len() {
        // Agents are registered on the first poll, so REQs are taken from
        // the start.
        let Ok(agent) = ensure_agent(core, dev, cd, pi as u8 + 1) else {
            continue;
        };
        while let Some(ev) = core.mad_poll_agent(agent) {
            work += 1;
            match ev {
                MadEvent::Recv(r) => cm_recv_handler(core, dev, cd, agent, &r),
                MadEvent::SendDone(s) => cm_send_handler(core, dev, cd, s.id, s.status),
            }
        }
    }
    // Connections whose QP saw its first packet before the RTU.
    for ci in 0..cd.ids.len() {
        if cd.ids[ci].comm_est {
            work += 1;
            if matches!(cd.ids[ci].state, CmState::RepSent | CmState::MraRepRcvd) {
                cm_establish(core, dev, cd, ci, Vec::new());
            }
            cd.ids[ci].comm_est = false;
        }
    }
    // Time-wait ends.
    let now = core.clock().now_ns();
    let mut i = 0;
    while i < cd.ids.len() {
        let c = &mut cd.ids[i];
        if c.state == CmState::Timewait && now >= c.timewait_until {
            work += 1;
            if c.destroyed {
                cd.ids.swap_remove(i);
                continue;
            }
            c.state = CmState::Idle;
        }
        i += 1;
    }
    work
}

/// `cm_send_handler` / `cm_process_send_error`: a request ran out of
/// retries.
fn cm_send_handler(
    core: &mut IbCore,
    _dev: DeviceId,
    cd: &mut CmDevice,
    id: MadSendId,
    status: WcStatus,
) {
    let Some(ci) = cd.ids.iter().position(|c| c.msg == Some(id)) else {
        return;
    };
    cd.ids[ci].msg = None;
    if status == WcStatus::Success || status == WcStatus::WrFlushErr {
        return;
    }
    cd.counters.timeouts += 1;
    let c = &mut cd.ids[ci];
    match c.state {
        CmState::ReqSent
        | CmState::MraReqRcvd
        | CmState::RepSent
        | CmState::MraRepRcvd
        | CmState::SidrReqSent => {
            c.state = CmState::Idle;
            c.push(CmEvent::TimedOut);
        }
        CmState::DreqSent => {
            enter_timewait(core, cd, ci);
            cd.ids[ci].push(CmEvent::Disconnected {
                private_data: Vec::new(),
                by_peer: false,
                dreq_timed_out: true,
            });
        }
        _ => {}
    }
}

fn p_is_zero(g: &crate::verbs::Gid) -> bool {
    g.0.iter().all(|&b| b == 0)
}

fn comm_ids(m: &Mad) -> (u32, u32) {
    let b = &m.0;
    (
        u32::from_be_bytes([b[24], b[25], b[26], b[27]]),
        u32::from_be_bytes([b[28], b[29], b[30], b[31]]),
    )
}

fn cm_recv_handler(
    core: &mut IbCore,
    dev: DeviceId,
    cd: &mut CmDevice,
    agent: MadAgent,
    r: &MadRecvWc,
) {
    let m = &r.mad;
    if m.mgmt_class() != class::CM || m.method() != method::SEND {
        cd.counters.dropped += 1;
        return;
    }
    let slot = match m.attr_id() {
        cm_attr::REQ => 0,
        cm_attr::MRA => 1,
        cm_attr::REJ => 2,
        cm_attr::REP => 3,
        cm_attr::RTU => 4,
        cm_attr::DREQ => 5,
        cm_attr::DREP => 6,
        cm_attr::SIDR_REQ | cm_attr::SIDR_REP => 8,
        _ => 7,
    };
    cd.counters.recv[slot] += 1;
    if m.class_version() != IB_CM_CLASS_VERSION {
        // Only a REQ can be refused for it; anything else is dropped.
        if m.attr_id() == cm_attr::REQ {
            cm_issue_rej(
                core,
                agent,
                r,
                rej_reason::INVALID_CLASS_VERSION,
                msg_response::REQ,
            );
        } else {
            cd.counters.dropped += 1;
        }
        return;
    }
    match m.attr_id() {
        cm_attr::REQ => cm_req_handler(core, dev, cd, agent, r),
        cm_attr::MRA => cm_mra_handler(core, cd, r),
        cm_attr::REJ => cm_rej_handler(core, cd, r),
        cm_attr::REP => cm_rep_handler(core, dev, cd, agent, r),
        cm_attr::RTU => cm_rtu_handler(core, dev, cd, r),
        cm_attr::DREQ => cm_dreq_handler(core, dev, cd, agent, r),
        cm_attr::DREP => cm_drep_handler(core, cd, r),
        cm_attr::SIDR_REQ => cm_sidr_req_handler(core, dev, cd, agent, r),
        cm_attr::SIDR_REP => cm_sidr_rep_handler(core, cd, r),
        cm_attr::LAP => {
            // No path migration: an APR "unsupported" answers the LAP and
            // leaves the connection as it is.
            cd.counters.dropped += 1;
            let (their_local, their_remote) = comm_ids(&r.mad);
            let mut apr = cm_mad(cm_attr::APR);
            apr.0[24..28].copy_from_slice(&their_remote.to_be_bytes());
            apr.0[28..32].copy_from_slice(&their_local.to_be_bytes());
            apr.0[33] = IB_CM_APR_UNSUPPORTED;
            cm_send_response(core, agent, r, apr);
        }
        _ => cd.counters.dropped += 1,
    }
}

fn cm_req_handler(
    core: &mut IbCore,
    dev: DeviceId,
    cd: &mut CmDevice,
    agent: MadAgent,
    r: &MadRecvWc,
) {
    let req = CmReq::unpack(&r.mad);
    // Duplicate: we know this (remote ID, CA GUID) already (cm_match_req).
    if let Some(ci) = cd.ids.iter().position(|c| {
        !c.listen && c.remote_id == req.local_comm_id && c.remote_ca_guid == req.local_ca_guid
    }) {
        cd.counters.duplicates += 1;
        let c = &cd.ids[ci];
        match c.state {
            CmState::MraReqSent | CmState::RepSent | CmState::MraRepRcvd => {
                if let Some(m) = c.last_sent.clone() {
                    let _ = cm_send(core, dev, cd, ci, m, false);
                }
            }
            CmState::Timewait => {
                cd.counters.stale += 1;
                cm_issue_rej(core, agent, r, rej_reason::STALE_CONN, msg_response::REQ);
            }
            _ => {}
        }
        return;
    }
    // Stale: the peer's QP is still part of a connection we hold.
    if cd.ids.iter().any(|c| {
        !c.listen
            && c.state != CmState::Idle
            && c.remote_qpn == req.local_qpn
            && c.remote_ca_guid == req.local_ca_guid
    }) {
        cd.counters.stale += 1;
        cm_issue_rej(core, agent, r, rej_reason::STALE_CONN, msg_response::REQ);
        return;
    }
    let Some(li) = cd
        .ids
        .iter()
        .position(|c| c.listen && !c.destroyed && c.service_id == req.service_id)
    else {
        cm_issue_rej(
            core,
            agent,
            r,
            rej_reason::INVALID_SERVICE_ID,
            msg_response::REQ,
        );
        return;
    };
    if req.transport_type != 0 {
        cm_issue_rej(
            core,
            agent,
            r,
            rej_reason::INVALID_TRANSPORT_TYPE,
            msg_response::REQ,
        );
        return;
    }
    let Some(mtu) = mtu_from(req.path_mtu) else {
        cm_issue_rej(core, agent, r, rej_reason::INVALID_MTU, msg_response::REQ);
        return;
    };
    // cm_init_av_by_path: our GID (the REQ's remote GID; a zero GID is
    // taken as "this port") and the P_Key must be this port's, or the REQ
    // is refused "invalid GID" with our GID in the ARI, as Linux does.
    let (sgid_index, pkey_index, our_gid, lmc) =
        match core.device(dev).and_then(|d| d.port_cache(r.port).ok()) {
            Some(pc) => (
                if p_is_zero(&req.primary.remote_gid) {
                    Some(0)
                } else {
                    pc.find_gid(&req.primary.remote_gid)
                },
                pc.find_pkey(req.pkey).ok(),
                pc.get_gid(0).ok(),
                pc.lmc,
            ),
            None => (None, None, None, 0),
        };
    let (Some(sgid_index), Some(pkey_index)) = (sgid_index, pkey_index) else {
        let (their_local, _) = comm_ids(&r.mad);
        let rej = CmRej {
            local_comm_id: 0,
            remote_comm_id: their_local,
            msg_rejected: msg_response::REQ,
            reason: rej_reason::INVALID_GID,
            ari: our_gid.map_or(Vec::new(), |g| g.0.to_vec()),
            private_data: Vec::new(),
        };
        if let Ok(m) = rej.pack() {
            cm_send_response(core, agent, r, m);
        }
        return;
    };
    let Ok(ci) = cd.alloc_id(r.port) else {
        cm_issue_rej(core, agent, r, rej_reason::NO_RESOURCES, msg_response::REQ);
        return;
    };
    // cm_format_paths_from_req + cm_init_av_by_path: the reverse of the
    // REQ's primary path. Its SLID is the LID the peer called (the REQ's
    // remote LID), so under LMC the answers leave from that LID's path
    // bits, not from the base LID (a card drops RC packets whose SLID is
    // not the QP's remote LID).
    // A routed REQ may name no LID (permissive): then the path bits it
    // arrived at (cm_process_routed_req).
    let p = &req.primary;
    let called = if p.remote_lid == crate::verbs::IB_LID_PERMISSIVE {
        u16::from(r.wc.dlid_path_bits)
    } else {
        p.remote_lid
    };
    let mut av = AhAttr {
        dlid: p.local_lid,
        sl: p.sl,
        src_path_bits: (called & ((1u16 << lmc.min(7)) - 1)) as u8,
        static_rate: p.packet_rate,
        port_num: r.port,
        grh: None,
    };
    // On Ethernet (RoCE) the GRH is always there (ib_init_ah_from_path's
    // force_grh).
    let eth = core
        .device(dev)
        .and_then(|d| d.port_link_layer(r.port).ok())
        == Some(crate::verbs::LinkLayer::Ethernet);
    if !p.subnet_local || eth {
        av.grh = Some(GlobalRoute {
            dgid: p.local_gid,
            flow_label: p.flow_label,
            sgid_index: sgid_index.min(255) as u8,
            hop_limit: p.hop_limit,
            traffic_class: p.traffic_class,
        });
    }
    let c = &mut cd.ids[ci];
    c.state = CmState::ReqRcvd;
    c.remote_id = req.local_comm_id;
    c.remote_ca_guid = req.local_ca_guid;
    c.remote_qpn = req.local_qpn;
    c.service_id = req.service_id;
    c.av = av;
    c.ack_timeout = p.local_ack_timeout;
    c.packet_life_time = p.local_ack_timeout.saturating_sub(1);
    c.path_mtu = mtu;
    c.pkey_index = pkey_index;
    c.sq_psn = req.starting_psn;
    // Our responder resources serve its initiator depth and back.
    c.responder_resources = req.initiator_depth;
    c.initiator_depth = req.responder_resources;
    c.retry_count = req.retry_count;
    c.rnr_retry_count = req.rnr_retry_count;
    c.max_cm_retries = req.max_cm_retries;
    c.timeout_ms =
        cm_convert_to_ms(req.local_cm_response_timeout) + 2 * cm_convert_to_ms(c.packet_life_time);
    let ev = CmEvent::ReqReceived {
        id: CmId {
            dev,
            local_id: c.local_id,
        },
        port: r.port,
        private_data: req.private_data,
        remote_qpn: req.local_qpn,
        remote_ca_guid: req.local_ca_guid,
        remote_lid: p.local_lid,
        pkey: req.pkey,
        local_gid: p.remote_gid,
        remote_gid: p.local_gid,
        service_id: req.service_id,
        responder_resources: req.responder_resources,
        initiator_depth: req.initiator_depth,
        retry_count: req.retry_count,
        rnr_retry_count: req.rnr_retry_count,
    };
    cd.ids[li].push(ev);
}

fn cm_rep_handler(
    core: &mut IbCore,
    dev: DeviceId,
    cd: &mut CmDevice,
    agent: MadAgent,
    r: &MadRecvWc,
) {
    let rep = CmRep::unpack(&r.mad);
    let Some(ci) = cd.find(rep.remote_comm_id) else {
        cd.counters.unknown_id += 1;
        cm_issue_rej(
            core,
            agent,
            r,
            rej_reason::INVALID_COMM_ID,
            msg_response::REP,
        );
        return;
    };
    let c = &cd.ids[ci];
    match c.state {
        CmState::ReqSent | CmState::MraReqRcvd => {}
        CmState::Established | CmState::MraRepSent if c.remote_id == rep.local_comm_id => {
            // cm_dup_rep_handler: our RTU (or MRA) was lost.
            cd.counters.duplicates += 1;
            if let Some(m) = c.last_sent.clone() {
                let _ = cm_send(core, dev, cd, ci, m, false);
            }
            return;
        }
        _ => {
            cd.counters.dropped += 1;
            return;
        }
    }
    // Stale: the peer's QP belongs to another connection we still hold.
    if cd.ids.iter().enumerate().any(|(i, o)| {
        i != ci
            && !o.listen
            && o.state != CmState::Idle
            && o.remote_qpn == rep.local_qpn
            && o.remote_ca_guid == rep.local_ca_guid
    }) {
        cd.counters.stale += 1;
        cancel_msg(core, cd, ci);
        cm_issue_rej(core, agent, r, rej_reason::STALE_CONN, msg_response::REP);
        cd.ids[ci].state = CmState::Idle;
        cd.ids[ci].push(CmEvent::Rejected {
            reason: rej_reason::STALE_CONN,
            ari: Vec::new(),
            private_data: Vec::new(),
        });
        return;
    }
    cancel_msg(core, cd, ci);
    let c = &mut cd.ids[ci];
    c.state = CmState::RepRcvd;
    c.remote_id = rep.local_comm_id;
    c.remote_ca_guid = rep.local_ca_guid;
    c.remote_qpn = rep.local_qpn;
    c.sq_psn = rep.starting_psn;
    // As Linux: what it accepts bounds what we issue, and back.
    c.initiator_depth = c.initiator_depth.min(rep.responder_resources);
    c.responder_resources = c.responder_resources.min(rep.initiator_depth);
    c.rnr_retry_count = rep.rnr_retry_count;
    c.ack_timeout = cm_ack_timeout(rep.target_ack_delay, c.ack_timeout.saturating_sub(1));
    let up = modify_qp(core, dev, cd, ci, QpState::Rtr)
        .and_then(|_| modify_qp(core, dev, cd, ci, QpState::Rts));
    let c = &cd.ids[ci];
    if let Err(e) = up {
        log::warn!("cm: connection {:#x}: QP to RTS failed: {e}", c.local_id);
        let rej = CmRej {
            local_comm_id: c.local_id,
            remote_comm_id: c.remote_id,
            msg_rejected: msg_response::REP,
            reason: rej_reason::CONSUMER_DEFINED,
            ari: Vec::new(),
            private_data: Vec::new(),
        };
        if let Ok(m) = rej.pack() {
            let _ = cm_send(core, dev, cd, ci, m, false);
        }
        qp_to_error(core, dev, cd, ci);
        enter_timewait(core, cd, ci);
        cd.ids[ci].push(CmEvent::Rejected {
            reason: rej_reason::CONSUMER_DEFINED,
            ari: Vec::new(),
            private_data: Vec::new(),
        });
        return;
    }
    let rtu = CmIds {
        local_comm_id: c.local_id,
        remote_comm_id: c.remote_id,
        remote_qpn: 0,
        private_data: Vec::new(),
    };
    if let Ok(m) = rtu.pack(cm_attr::RTU) {
        let _ = cm_send(core, dev, cd, ci, m.clone(), false);
        cd.ids[ci].last_sent = Some(m);
    }
    let c = &mut cd.ids[ci];
    c.state = CmState::Established;
    c.push(CmEvent::Established {
        private_data: rep.private_data,
    });
}

fn cm_rtu_handler(core: &mut IbCore, dev: DeviceId, cd: &mut CmDevice, r: &MadRecvWc) {
    let Ok(rtu) = CmIds::unpack(&r.mad) else {
        return;
    };
    let Some(ci) = cd.find(rtu.remote_comm_id) else {
        cd.counters.unknown_id += 1;
        return;
    };
    let c = &cd.ids[ci];
    if c.remote_id != rtu.local_comm_id
        || !matches!(c.state, CmState::RepSent | CmState::MraRepRcvd)
    {
        cd.counters.dropped += 1;
        return;
    }
    cm_establish(core, dev, cd, ci, rtu.private_data);
}

/// The passive side's way into ESTABLISHED (an RTU, or the first packet):
/// the REP stops, the QP goes to RTS.
fn cm_establish(
    core: &mut IbCore,
    dev: DeviceId,
    cd: &mut CmDevice,
    ci: usize,
    private_data: Vec<u8>,
) {
    cancel_msg(core, cd, ci);
    cd.ids[ci].state = CmState::Established;
    cd.ids[ci].comm_est = false;
    if let Err(e) = modify_qp(core, dev, cd, ci, QpState::Rts) {
        log::warn!(
            "cm: connection {:#x}: QP to RTS failed: {e}",
            cd.ids[ci].local_id
        );
    }
    cd.ids[ci].push(CmEvent::Established { private_data });
}

fn cm_rej_handler(core: &mut IbCore, cd: &mut CmDevice, r: &MadRecvWc) {
    let rej = CmRej::unpack(&r.mad);
    // cm_acquire_rejected_id: a timed-out active side names itself by its
    // ID and CA GUID (in the ARI); a REJ of our REQ names only our ID;
    // others name both.
    let timeout_guid = (rej.reason == rej_reason::TIMEOUT && rej.ari.len() >= 8).then(|| {
        let mut g = [0u8; 8];
        g.copy_from_slice(&rej.ari[..8]);
        u64::from_be_bytes(g)
    });
    let Some(ci) = cd.ids.iter().position(|c| {
        !c.listen
            && !c.destroyed
            && match timeout_guid {
                Some(g) => c.remote_ca_guid == g && c.remote_id == rej.local_comm_id,
                None => {
                    c.local_id == rej.remote_comm_id
                        && (rej.msg_rejected == msg_response::REQ
                            || c.remote_id == rej.local_comm_id)
                }
            }
    }) else {
        cd.counters.unknown_id += 1;
        return;
    };
    let state = cd.ids[ci].state;
    match state {
        CmState::ReqSent
        | CmState::MraReqRcvd
        | CmState::RepSent
        | CmState::MraRepRcvd
        | CmState::RepRcvd
        | CmState::MraRepSent
        | CmState::Established
        | CmState::ReqRcvd
        | CmState::MraReqSent => {}
        _ => {
            cd.counters.dropped += 1;
            return;
        }
    }
    cancel_msg(core, cd, ci);
    let qp_used = !matches!(
        state,
        CmState::ReqSent | CmState::MraReqRcvd | CmState::ReqRcvd | CmState::MraReqSent
    );
    if qp_used || rej.reason == rej_reason::STALE_CONN {
        enter_timewait(core, cd, ci);
    } else {
        cd.ids[ci].state = CmState::Idle;
    }
    cd.ids[ci].push(CmEvent::Rejected {
        reason: rej.reason,
        ari: rej.ari,
        private_data: rej.private_data,
    });
}

fn cm_mra_handler(core: &mut IbCore, cd: &mut CmDevice, r: &MadRecvWc) {
    let mra = CmMra::unpack(&r.mad);
    let Some(ci) = cd.find(mra.remote_comm_id) else {
        cd.counters.unknown_id += 1;
        return;
    };
    let c = &mut cd.ids[ci];
    let next = match (c.state, mra.msg_mraed) {
        (CmState::ReqSent, msg_response::REQ) => CmState::MraReqRcvd,
        (CmState::RepSent, msg_response::REP) => CmState::MraRepRcvd,
        (CmState::MraReqRcvd, msg_response::REQ) | (CmState::MraRepRcvd, msg_response::REP) => {
            // A duplicate MRA extends the wait once more.
            c.state
        }
        _ => {
            cd.counters.dropped += 1;
            return;
        }
    };
    c.state = next;
    c.remote_id = mra.local_comm_id;
    let timeout = cm_convert_to_ms(mra.service_timeout) + cm_convert_to_ms(c.ack_timeout);
    if let (Some(msg), Some(Some(a))) = (c.msg, cd.agents.get(usize::from(c.port).wrapping_sub(1)))
    {
        let _ = core.modify_mad(*a, msg, timeout);
    }
    cd.ids[ci].push(CmEvent::MraReceived {
        service_timeout: mra.service_timeout,
    });
}

fn cm_dreq_handler(
    core: &mut IbCore,
    dev: DeviceId,
    cd: &mut CmDevice,
    agent: MadAgent,
    r: &MadRecvWc,
) {
    let Ok(dreq) = CmIds::unpack(&r.mad) else {
        return;
    };
    let drep = |local, remote| CmIds {
        local_comm_id: local,
        remote_comm_id: remote,
        remote_qpn: 0,
        private_data: Vec::new(),
    };
    let found = cd
        .find(dreq.remote_comm_id)
        .filter(|&ci| cd.ids[ci].remote_id == dreq.local_comm_id);
    let Some(ci) = found else {
        // cm_issue_drep: a DREQ for nothing still gets its DREP.
        cd.counters.unknown_id += 1;
        if let Ok(m) = drep(dreq.remote_comm_id, dreq.local_comm_id).pack(cm_attr::DREP) {
            cm_send_response(core, agent, r, m);
        }
        return;
    };
    let c = &cd.ids[ci];
    if dreq.remote_qpn != c.local_qpn {
        cd.counters.dropped += 1;
        return;
    }
    let m = drep(c.local_id, c.remote_id).pack(cm_attr::DREP);
    match c.state {
        CmState::Established | CmState::RepSent | CmState::MraRepRcvd | CmState::DreqSent => {
            cancel_msg(core, cd, ci);
            qp_to_error(core, dev, cd, ci);
            if let Ok(m) = m {
                let _ = cm_send(core, dev, cd, ci, m, false);
            }
            enter_timewait(core, cd, ci);
            cd.ids[ci].push(CmEvent::Disconnected {
                private_data: dreq.private_data,
                by_peer: true,
                dreq_timed_out: false,
            });
        }
        CmState::Timewait => {
            // Our DREP was lost.
            cd.counters.duplicates += 1;
            if let Ok(m) = m {
                let _ = cm_send(core, dev, cd, ci, m, false);
            }
        }
        _ => cd.counters.dropped += 1,
    }
}

fn cm_drep_handler(core: &mut IbCore, cd: &mut CmDevice, r: &MadRecvWc) {
    let Ok(drep) = CmIds::unpack(&r.mad) else {
        return;
    };
    let Some(ci) = cd
        .find(drep.remote_comm_id)
        .filter(|&ci| cd.ids[ci].remote_id == drep.local_comm_id)
    else {
        cd.counters.unknown_id += 1;
        return;
    };
    if cd.ids[ci].state != CmState::DreqSent {
        cd.counters.dropped += 1;
        return;
    }
    cancel_msg(core, cd, ci);
    enter_timewait(core, cd, ci);
    cd.ids[ci].push(CmEvent::Disconnected {
        private_data: drep.private_data,
        by_peer: false,
        dreq_timed_out: false,
    });
}

/// `cm_sidr_req_handler`: a request for a service we listen to becomes a
/// new ID and an event on the listener; one for no service is answered
/// "unsupported" at once; a repeated one gets the answer sent before.
fn cm_sidr_req_handler(
    core: &mut IbCore,
    _dev: DeviceId,
    cd: &mut CmDevice,
    agent: MadAgent,
    r: &MadRecvWc,
) {
    let req = CmSidrReq::unpack(&r.mad);
    let respond = |core: &mut IbCore, status: u8| {
        let rep = CmSidrRep {
            request_id: req.request_id,
            status,
            service_id: req.service_id,
            ..CmSidrRep::default()
        };
        if let Ok(m) = rep.pack() {
            cm_send_response(core, agent, r, m);
        }
    };
    // A duplicate: the same request ID from the same port (LID and QPN).
    if let Some(ci) = cd.ids.iter().position(|c| {
        !c.listen
            && matches!(c.state, CmState::SidrReqRcvd | CmState::Idle)
            && c.remote_id == req.request_id
            && c.av.dlid == r.wc.slid
            && c.remote_qpn == r.wc.src_qp
            && c.service_id == req.service_id
    }) {
        cd.counters.duplicates += 1;
        if let Some(m) = cd.ids[ci].last_sent.clone() {
            cm_send_response(core, agent, r, m);
        }
        return;
    }
    let Some(li) = cd
        .ids
        .iter()
        .position(|c| c.listen && !c.destroyed && c.service_id == req.service_id)
    else {
        respond(core, sidr_status::UNSUPPORTED);
        return;
    };
    let Ok(ci) = cd.alloc_id(r.port) else {
        respond(core, sidr_status::NO_QP);
        return;
    };
    let c = &mut cd.ids[ci];
    c.state = CmState::SidrReqRcvd;
    c.remote_id = req.request_id;
    c.remote_qpn = r.wc.src_qp;
    c.service_id = req.service_id;
    c.pkey_index = r.wc.pkey_index;
    // cm_init_av_for_response: the answer goes back where the request
    // came from.
    c.av = AhAttr {
        dlid: r.wc.slid,
        sl: r.wc.sl,
        src_path_bits: r.wc.dlid_path_bits,
        port_num: r.port,
        ..AhAttr::default()
    };
    if let Some(g) = &r.grh {
        c.av.grh = Some(GlobalRoute {
            dgid: g.sgid(),
            flow_label: g.flow_label(),
            sgid_index: 0,
            hop_limit: 0xff,
            traffic_class: g.traffic_class(),
        });
    }
    let ev = CmEvent::SidrReqReceived {
        id: CmId {
            dev: _dev,
            local_id: c.local_id,
        },
        port: r.port,
        pkey: req.pkey,
        service_id: req.service_id,
        private_data: req.private_data,
        remote_lid: r.wc.slid,
        remote_qpn: r.wc.src_qp,
    };
    cd.ids[li].push(ev);
}

/// `cm_sidr_rep_handler`: the answer to our SIDR_REQ.
fn cm_sidr_rep_handler(core: &mut IbCore, cd: &mut CmDevice, r: &MadRecvWc) {
    let rep = CmSidrRep::unpack(&r.mad);
    let Some(ci) = cd
        .find(rep.request_id)
        .filter(|&ci| cd.ids[ci].state == CmState::SidrReqSent)
    else {
        cd.counters.unknown_id += 1;
        return;
    };
    cancel_msg(core, cd, ci);
    let c = &mut cd.ids[ci];
    c.state = CmState::Idle;
    c.push(CmEvent::SidrRepReceived {
        status: rep.status,
        qpn: rep.qpn,
        qkey: rep.qkey,
        info: rep.info,
        private_data: rep.private_data,
    });
}

/// For the fuzz test: one MAD through the receive handler of `dev`'s CM.
#[cfg(test)]
pub(crate) fn cm_inject_for_fuzz(core: &mut IbCore, cm: ClientId, dev: DeviceId, r: &MadRecvWc) {
    let _ = with_cm(core, cm, dev, |core, cd| {
        let agent = ensure_agent(core, dev, cd, r.port)?;
        cm_recv_handler(core, dev, cd, agent, r);
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_convert_as_linux() {
        assert_eq!(cm_convert_to_ms(0), 1);
        assert_eq!(cm_convert_to_ms(8), 1);
        assert_eq!(cm_convert_to_ms(14), 64);
        assert_eq!(cm_convert_to_ms(20), 4096);
        assert_eq!(cm_convert_to_ms(31), 1 << 23);
        assert_eq!(cm_convert_to_ms(255), 1 << 23);
        // ack timeout: packet life 14, CA ACK delay 15.
        assert_eq!(cm_ack_timeout(15, 14), 16);
        assert_eq!(cm_ack_timeout(0, 14), 15);
        assert_eq!(cm_ack_timeout(20, 10), 20);
        assert_eq!(cm_ack_timeout(31, 31), 31);
    }
}
