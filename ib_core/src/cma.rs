//! Port of Linux `drivers/infiniband/core/cma.c` (6.1), busy-polled: the RDMA connection manager, IP-addressed connections over the IB CM (RC through REQ/REP, UD through SIDR) with Linux's port spaces, service IDs and `cma_hdr`.
//!
//! On an Ethernet (RoCE v1) port the address resolves by Ethernet ARP to
//! the IPv4-mapped GIDs of both ends, and the route is made locally from
//! them (`cma_resolve_iboe_route`: `sa_query` answers an Ethernet port's
//! PathRecord Get itself), with the default P_Key.
//!
//! Left out: iWARP, `AF_IB` and IPv6 addresses, multicast joins, VLANs and
//! RoCE v2, the
//! `rdma_ucm` user interface, network namespaces, ECE, `rdma_set_option`
//! beyond the two CM timings ([`set_cm_timeout`]) and the ACK timeout
//! ([`set_ack_timeout`]), reuse of a bound
//! address, and the per-device listen-on-every-device IDs (one ID listens
//! on every device here).
//!
//! How it runs: the RDMA CM is an [`IbClient`] holding every ID
//! (`struct rdma_id_private`). Its [`IbClient::poll`] (so every
//! [`IbCore::poll`]) turns the IB CM's events into `RDMA_CM_EVENT_*`s on
//! the IDs' queues, checks REQs and SIDR_REQs against the listeners as
//! Linux's passive side does, collects the SA's path answers and ends
//! address requests past their time. The IP side comes in through
//! [`net_poll`], which the owner of the IP stack calls whenever it polls it
//! (the kernel's progress loop, a tool waiting): it steps the address
//! requests waiting for ARP and refreshes the CM's view of the network
//! devices, which the passive side checks a REQ's addresses against. A
//! caller takes an ID's events with [`get_cm_event`] (or waits for one
//! against a deadline with [`wait_cm_event`]), as a `rdma_get_cm_event`
//! on a channel of its own.
//!
//! The cma header (`struct cma_hdr`, [`CmaHdr`]) opens the private data of
//! every REQ and SIDR_REQ: version 0, the IP version in the top nibble,
//! the active side's port, its address and the address it called. The
//! passive side refuses a REQ (REJ "consumer defined", as Linux's
//! `cma_ib_req_handler` does by returning an error to the IB CM) whose
//! version is not 0, whose IP version is not 4, whose destination is not an
//! address of the IPoIB device of the port and P_Key it came in on, whose
//! source is not a unicast address, or that no listener's address and port
//! match; a service ID no one listens to is refused by the IB CM itself
//! (REJ "invalid service ID", SIDR_REP "unsupported").

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::any::Any;
use core::fmt;
use core::net::{Ipv4Addr, SocketAddrV4};
use core::time::Duration;

use crate::addr::{self, IpNet, NetDev, RdmaDevAddr};
use crate::cm::{self, CmEvent, CmId, CmRepParam, CmReqParam, CmSidrReqParam};
use crate::cm_msgs::{private_len, rej_reason, sidr_status};
use crate::device::{ClientId, Device, DeviceId, IbClient, IbCore};
use crate::error::{Error, Result, errno};
use crate::sa_query::{self, PathRecord, SaQueryId, path_comp};
use crate::verbs::{AccessFlags, AhAttr, Pd, Qp, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType};

/// `RDMA_PS_IPOIB`.
pub const RDMA_PS_IPOIB: u16 = 0x0002;
/// `RDMA_PS_IB`.
pub const RDMA_PS_IB: u16 = 0x013f;
/// `RDMA_PS_TCP`.
pub const RDMA_PS_TCP: u16 = 0x0106;
/// `RDMA_PS_UDP`.
pub const RDMA_PS_UDP: u16 = 0x0111;
/// `RDMA_IB_IP_PS_MASK`: the part of a service ID that names the port
/// space (the low 16 bits are the port).
pub const RDMA_IB_IP_PS_MASK: u64 = 0xffff_ffff_ffff_0000;
/// `RDMA_IB_IP_PS_TCP`.
pub const RDMA_IB_IP_PS_TCP: u64 = 0x0000_0000_0106_0000;
/// `RDMA_IB_IP_PS_UDP`.
pub const RDMA_IB_IP_PS_UDP: u64 = 0x0000_0000_0111_0000;
/// `RDMA_IB_IP_PS_IB`.
pub const RDMA_IB_IP_PS_IB: u64 = 0x0000_0000_013f_0000;
/// The Q_Key of UDP port-space QPs (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// `CMA_VERSION`.
pub const CMA_VERSION: u8 = 0x00;
/// Bytes of `struct cma_hdr`.
pub const CMA_HDR_LEN: usize = 36;
/// `CMA_CM_RESPONSE_TIMEOUT`: 4.096 us * 2^20, about 4.3 s a try.
pub const CMA_CM_RESPONSE_TIMEOUT: u8 = 20;
/// `CMA_MAX_CM_RETRIES`.
pub const CMA_MAX_CM_RETRIES: u8 = 15;
/// First and last port of the ephemeral range (`ip_local_port_range`'s
/// defaults, which `cma_alloc_any_port` draws from).
pub const EPHEMERAL_PORTS: (u16, u16) = (32768, 60999);

/// A port space (`enum rdma_ucm_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections.
    Tcp,
    /// `RDMA_PS_UDP`: UD, through SIDR.
    Udp,
    /// `RDMA_PS_IB`: either.
    Ib,
    /// `RDMA_PS_IPOIB`: UD.
    Ipoib,
}

impl PortSpace {
    /// Its number.
    pub fn value(self) -> u16 {
        match self {
            PortSpace::Tcp => RDMA_PS_TCP,
            PortSpace::Udp => RDMA_PS_UDP,
            PortSpace::Ib => RDMA_PS_IB,
            PortSpace::Ipoib => RDMA_PS_IPOIB,
        }
    }
    /// From its number.
    pub fn from_value(v: u16) -> Option<PortSpace> {
        match v {
            RDMA_PS_TCP => Some(PortSpace::Tcp),
            RDMA_PS_UDP => Some(PortSpace::Udp),
            RDMA_PS_IB => Some(PortSpace::Ib),
            RDMA_PS_IPOIB => Some(PortSpace::Ipoib),
            _ => None,
        }
    }
    /// The QP type its IDs use unless told otherwise.
    pub fn qp_type(self) -> QpType {
        match self {
            PortSpace::Tcp | PortSpace::Ib => QpType::Rc,
            PortSpace::Udp | PortSpace::Ipoib => QpType::Ud,
        }
    }
}

/// `rdma_get_service_id`: `0x0000000001PPPPPP`-style, the port space in
/// bits 16-31 and the port in bits 0-15.
#[doc(alias = "rdma_get_service_id")]
pub fn service_id(ps: PortSpace, port: u16) -> u64 {
    (u64::from(ps.value()) << 16) | u64::from(port)
}

/// `rdma_ps_from_service_id`.
pub fn ps_from_service_id(sid: u64) -> u16 {
    (sid >> 16) as u16
}

/// `cma_port_from_service_id`.
pub fn port_from_service_id(sid: u64) -> u16 {
    sid as u16
}

/// `struct cma_hdr`, the first 36 bytes of a REQ's or SIDR_REQ's private
/// data (IPv4 in the last 4 bytes of each 16-byte address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHdr {
    /// `cma_version` ([`CMA_VERSION`]).
    pub cma_version: u8,
    /// The IP version (the top nibble of the second byte).
    pub ip_version: u8,
    /// The active side's port.
    pub port: u16,
    /// The active side's address (16 bytes).
    pub src_addr: [u8; 16],
    /// The address it called.
    pub dst_addr: [u8; 16],
}

impl CmaHdr {
    /// The header of an IPv4 connection from `src` to `dst`
    /// (`cma_format_hdr`).
    #[doc(alias = "cma_format_hdr")]
    pub fn ipv4(src: SocketAddrV4, dst: SocketAddrV4) -> CmaHdr {
        let mut s = [0u8; 16];
        let mut d = [0u8; 16];
        s[12..].copy_from_slice(&src.ip().octets());
        d[12..].copy_from_slice(&dst.ip().octets());
        CmaHdr {
            cma_version: CMA_VERSION,
            ip_version: 4,
            port: src.port(),
            src_addr: s,
            dst_addr: d,
        }
    }
    /// The 36 wire bytes.
    pub fn pack(&self) -> [u8; CMA_HDR_LEN] {
        let mut b = [0u8; CMA_HDR_LEN];
        b[0] = self.cma_version;
        b[1] = self.ip_version << 4;
        b[2..4].copy_from_slice(&self.port.to_be_bytes());
        b[4..20].copy_from_slice(&self.src_addr);
        b[20..36].copy_from_slice(&self.dst_addr);
        b
    }
    /// From private data (`None` if shorter than the header).
    pub fn parse(b: &[u8]) -> Option<CmaHdr> {
        let b = b.get(..CMA_HDR_LEN)?;
        let mut s = [0u8; 16];
        let mut d = [0u8; 16];
        s.copy_from_slice(&b[4..20]);
        d.copy_from_slice(&b[20..36]);
        Some(CmaHdr {
            cma_version: b[0],
            ip_version: b[1] >> 4,
            port: u16::from_be_bytes([b[2], b[3]]),
            src_addr: s,
            dst_addr: d,
        })
    }
    /// The active side's IPv4 address.
    pub fn src_ip4(&self) -> Ipv4Addr {
        Ipv4Addr::new(
            self.src_addr[12],
            self.src_addr[13],
            self.src_addr[14],
            self.src_addr[15],
        )
    }
    /// The IPv4 address it called.
    pub fn dst_ip4(&self) -> Ipv4Addr {
        Ipv4Addr::new(
            self.dst_addr[12],
            self.dst_addr[13],
            self.dst_addr[14],
            self.dst_addr[15],
        )
    }
}

/// `enum rdma_cm_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum RdmaCmEventType {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    MulticastJoin,
    MulticastError,
    AddrChange,
    TimewaitExit,
}

impl RdmaCmEventType {
    /// The name librdmacm's `rdma_event_str` gives it.
    pub fn name(self) -> &'static str {
        use RdmaCmEventType::*;
        match self {
            AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            Rejected => "RDMA_CM_EVENT_REJECTED",
            Established => "RDMA_CM_EVENT_ESTABLISHED",
            Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
    /// The kernel's words for it (`rdma_event_msg`).
    #[doc(alias = "rdma_event_msg")]
    pub fn msg(self) -> &'static str {
        use RdmaCmEventType::*;
        match self {
            AddrResolved => "address resolved",
            AddrError => "address error",
            RouteResolved => "route resolved ",
            RouteError => "route error",
            ConnectRequest => "connect request",
            ConnectResponse => "connect response",
            ConnectError => "connect error",
            Unreachable => "unreachable",
            Rejected => "rejected",
            Established => "established",
            Disconnected => "disconnected",
            DeviceRemoval => "device removal",
            MulticastJoin => "multicast join",
            MulticastError => "multicast error",
            AddrChange => "address change",
            TimewaitExit => "timewait exit",
        }
    }
}

impl fmt::Display for RdmaCmEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An ID (`struct rdma_cm_id`), a handle into the RDMA CM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmaCmId(pub u32);

/// `struct rdma_conn_param` (and, for UD, what `rdma_connect` and
/// `rdma_accept` take of it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RdmaConnParam {
    /// The consumer's private data (after the cma header on a REQ: at most
    /// 56 bytes; 196 on a REP, 180 on a SIDR_REQ, 136 on a SIDR_REP).
    pub private_data: Vec<u8>,
    /// RDMA READs/atomics we accept at once.
    pub responder_resources: u8,
    /// RDMA READs/atomics we issue at once.
    pub initiator_depth: u8,
    /// Transport retries (at most 7).
    pub retry_count: u8,
    /// RNR retries (7: infinite).
    pub rnr_retry_count: u8,
    /// In an event: the peer's QPN.
    pub qp_num: u32,
    /// In an event: the peer uses an SRQ.
    pub srq: bool,
}

/// `struct rdma_ud_param`: where a UD peer is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RdmaUdParam {
    /// Private data.
    pub private_data: Vec<u8>,
    /// Its address vector.
    pub ah_attr: AhAttr,
    /// Its QPN.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

/// `struct rdma_cm_event`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaCmEvent {
    /// What happened.
    pub event: RdmaCmEventType,
    /// 0, a negative errno, or a REJ reason ([`RdmaCmEventType::Rejected`]).
    pub status: i32,
    /// The ID it concerns: on a listener's CONNECT_REQUEST, the new one.
    pub id: RdmaCmId,
    /// On a CONNECT_REQUEST, the listener.
    pub listen_id: Option<RdmaCmId>,
    /// `param.conn` (RC).
    pub conn: RdmaConnParam,
    /// `param.ud` (UD).
    pub ud: Option<RdmaUdParam>,
}

impl RdmaCmEvent {
    fn new(event: RdmaCmEventType, status: i32, id: RdmaCmId) -> RdmaCmEvent {
        RdmaCmEvent {
            event,
            status,
            id,
            listen_id: None,
            conn: RdmaConnParam::default(),
            ud: None,
        }
    }
}

/// `enum rdma_cm_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum RdmaCmState {
    Idle,
    AddrQuery,
    AddrResolved,
    RouteQuery,
    RouteResolved,
    Connect,
    Disconnect,
    AddrBound,
    Listen,
    DeviceRemoval,
    Destroying,
}

/// What an ID is, for the console and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaCmIdInfo {
    /// State.
    pub state: RdmaCmState,
    /// Port space.
    pub ps: PortSpace,
    /// QP type.
    pub qp_type: QpType,
    /// Our address and port.
    pub src: SocketAddrV4,
    /// The peer's.
    pub dst: SocketAddrV4,
    /// The device and port (`id->device`, `id->port_num`) once bound.
    pub port: Option<(DeviceId, u8)>,
    /// The route (`id->route.path_rec`) once resolved.
    pub path: Option<PathRecord>,
    /// The device addresses once resolved.
    pub dev_addr: Option<RdmaDevAddr>,
    /// The QP the ID connects.
    pub qp: Option<Qp>,
    /// The Q_Key of its UD QP.
    pub qkey: u32,
}

/// What the RDMA CM counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmaCounters {
    /// REQs and SIDR_REQs refused for a cma version that is not 0.
    pub bad_version: u64,
    /// ... for an IP version other than 4.
    pub bad_ip_version: u64,
    /// ... because no IP device of that port and P_Key has the destination
    /// address (`-ENODEV`, `-EHOSTUNREACH`).
    pub no_netdev: u64,
    /// ... because no listener's address matched.
    pub no_listener: u64,
    /// ... for the wrong QP type (a REQ on a UD listener, or back).
    pub bad_qp_type: u64,
    /// Connection requests handed to listeners.
    pub requests: u64,
    /// Address resolutions that ran out of time.
    pub addr_timeouts: u64,
}

/// An address request waiting for ARP (`struct addr_req`).
struct AddrReq {
    src: Option<Ipv4Addr>,
    dst: Ipv4Addr,
    deadline_ns: u64,
}

/// `struct rdma_id_private`.
struct IdPriv {
    id: u32,
    ps: PortSpace,
    qp_type: QpType,
    state: RdmaCmState,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    /// Bound to a port (explicitly or by resolve_addr).
    bound: bool,
    dev_addr: Option<RdmaDevAddr>,
    port: Option<(DeviceId, u8)>,
    path: Option<PathRecord>,
    addr_req: Option<AddrReq>,
    route_query: Option<(SaQueryId, u64)>,
    cm_id: Option<CmId>,
    qp: Option<Qp>,
    qkey: u32,
    /// For an ID from a CONNECT_REQUEST: the peer's conn parameters.
    req_conn: RdmaConnParam,
    /// A SIDR_REQ's requester (UD IDs from a CONNECT_REQUEST).
    sidr: bool,
    /// Listening: the IB CM listeners it uses (device, service ID).
    listens: Vec<(DeviceId, u64)>,
    cm_timeout: u8,
    max_cm_retries: u8,
    /// `rdma_set_ack_timeout`: the bound on the QP's local ACK timeout.
    ack_timeout: Option<u8>,
    events: VecDeque<RdmaCmEvent>,
}

const MAX_EVENTS: usize = 64;

impl IdPriv {
    fn handle(&self) -> RdmaCmId {
        RdmaCmId(self.id)
    }
    fn push(&mut self, ev: RdmaCmEvent) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(ev);
    }
}

/// One IB CM listener shared by the RDMA CM IDs that listen on its service
/// ID (Linux's `ib_cm_insert_listen`).
struct CmListener {
    dev: DeviceId,
    service_id: u64,
    cm_id: CmId,
    users: u32,
}

/// The RDMA CM's state.
struct Cma {
    sa: ClientId,
    cm: ClientId,
    ids: Vec<IdPriv>,
    next_id: u32,
    listeners: Vec<CmListener>,
    netdevs: Vec<NetDev>,
    /// When `netdevs` was last read (ns).
    netdevs_at: u64,
    rand: u32,
    counters: CmaCounters,
}

/// The RDMA CM client (`cma_client`).
pub struct CmaClient(Option<Box<Cma>>);

/// Registers the RDMA CM (and the SA and IB CM clients it uses) with the
/// core; the ID names it in every call. One per core: a later call returns
/// the one registered.
pub fn init(core: &mut IbCore) -> ClientId {
    if let Some(id) = core.client_by_name("rdma_cm") {
        return id;
    }
    let sa = sa_query::init(core);
    let cm = cm::init(core);
    let seed = (core.clock().now_ns() as u32) ^ 0x9e37_79b9;
    core.register_client(Box::new(CmaClient(Some(Box::new(Cma {
        sa,
        cm,
        ids: Vec::new(),
        next_id: 1,
        listeners: Vec::new(),
        netdevs: Vec::new(),
        netdevs_at: 0,
        rand: seed | 1,
        counters: CmaCounters::default(),
    })))))
}

impl IbClient for CmaClient {
    fn name(&self) -> &str {
        "rdma_cm"
    }
    fn add(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn remove(&mut self, _me: ClientId, dev: &mut Device) {
        // cma_remove_one: every ID on the device hears of it.
        if let Some(st) = self.0.as_mut() {
            let d = dev.id();
            for p in st.ids.iter_mut() {
                if p.port.is_some_and(|(x, _)| x == d) {
                    let id = p.handle();
                    p.state = RdmaCmState::DeviceRemoval;
                    p.push(RdmaCmEvent::new(RdmaCmEventType::DeviceRemoval, 0, id));
                }
            }
            st.listeners.retain(|l| l.dev != d);
        }
    }
    fn poll(&mut self, _me: ClientId, core: &mut IbCore) -> usize {
        match self.0.as_mut() {
            Some(st) => cma_poll(core, st),
            None => 0,
        }
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        Some(self)
    }
}

fn with_cma<T>(
    core: &mut IbCore,
    cma: ClientId,
    f: impl FnOnce(&mut IbCore, &mut Cma) -> Result<T>,
) -> Result<T> {
    let mut st = core
        .client_mut(cma)
        .and_then(|c| c.as_any_mut())
        .and_then(|a| a.downcast_mut::<CmaClient>())
        .ok_or(Error::NoDev)?
        .0
        .take()
        .ok_or(Error::Busy)?;
    let r = f(core, &mut st);
    if let Some(c) = core
        .client_mut(cma)
        .and_then(|c| c.as_any_mut())
        .and_then(|a| a.downcast_mut::<CmaClient>())
    {
        c.0 = Some(st);
    }
    r
}

fn errno_of(e: &Error) -> i32 {
    e.to_errno()
}

impl Cma {
    fn idx(&self, id: RdmaCmId) -> Result<usize> {
        self.ids
            .iter()
            .position(|p| p.id == id.0)
            .ok_or(Error::NotFound)
    }
    fn alloc(&mut self, ps: PortSpace, qp_type: QpType) -> usize {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.ids.push(IdPriv {
            id,
            ps,
            qp_type,
            state: RdmaCmState::Idle,
            src: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            dst: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            bound: false,
            dev_addr: None,
            port: None,
            path: None,
            addr_req: None,
            route_query: None,
            cm_id: None,
            qp: None,
            qkey: if ps == PortSpace::Udp {
                RDMA_UDP_QKEY
            } else {
                0
            },
            req_conn: RdmaConnParam::default(),
            sidr: false,
            listens: Vec::new(),
            cm_timeout: CMA_CM_RESPONSE_TIMEOUT,
            max_cm_retries: CMA_MAX_CM_RETRIES,
            ack_timeout: None,
            events: VecDeque::new(),
        });
        self.ids.len() - 1
    }
    fn next_rand(&mut self) -> u32 {
        // xorshift32
        let mut x = self.rand;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.rand = x;
        x
    }
    /// Whether `port` of `ps` is taken by another ID whose address overlaps
    /// `ip` (`cma_check_port`).
    fn port_taken(&self, me: usize, ps: PortSpace, ip: Ipv4Addr, port: u16) -> bool {
        self.ids.iter().enumerate().any(|(i, p)| {
            i != me
                && p.bound
                && p.ps == ps
                && p.src.port() == port
                && (ip.is_unspecified() || p.src.ip().is_unspecified() || *p.src.ip() == ip)
        })
    }
    /// `cma_alloc_any_port`: a free ephemeral port.
    fn any_port(&mut self, me: usize, ps: PortSpace, ip: Ipv4Addr) -> Result<u16> {
        let (lo, hi) = EPHEMERAL_PORTS;
        let n = u32::from(hi - lo) + 1;
        let start = self.next_rand() % n;
        for k in 0..n {
            let port = lo + ((start + k) % n) as u16;
            if !self.port_taken(me, ps, ip, port) {
                return Ok(port);
            }
        }
        Err(Error::Errno(errno::EADDRNOTAVAIL))
    }
    fn netdev_with_addr(&self, a: Ipv4Addr) -> Option<&NetDev> {
        self.netdevs
            .iter()
            .find(|d| d.rdma_port.is_some() && d.has_addr(a))
    }
}

/// The state of the RDMA CM as one value: the client taken out of the core
/// for the duration of `f` (as every call does).
fn st_id<T>(
    core: &mut IbCore,
    cma: ClientId,
    id: RdmaCmId,
    f: impl FnOnce(&mut IbCore, &mut Cma, usize) -> Result<T>,
) -> Result<T> {
    with_cma(core, cma, |core, st| {
        let i = st.idx(id)?;
        f(core, st, i)
    })
}

// ---------------------------------------------------------------------------
// The consumer's calls

/// `rdma_create_id`: a new ID in port space `ps` (its QP type follows:
/// RC for TCP and IB, UD for UDP and IPoIB).
#[doc(alias = "rdma_create_id")]
pub fn create_id(core: &mut IbCore, cma: ClientId, ps: PortSpace) -> Result<RdmaCmId> {
    with_cma(core, cma, |_, st| {
        let i = st.alloc(ps, ps.qp_type());
        Ok(st.ids[i].handle())
    })
}

/// `rdma_bind_addr`: binds the ID to `addr` (port 0: an ephemeral one). A
/// specific address must be one of ours on a device with an RDMA port
/// behind it (`-EADDRNOTAVAIL`; the IP side's view comes from
/// [`net_poll`]), which the ID then uses; a port another ID holds for an
/// overlapping address is `-EADDRINUSE`.
#[doc(alias = "rdma_bind_addr")]
pub fn bind_addr(core: &mut IbCore, cma: ClientId, id: RdmaCmId, addr: SocketAddrV4) -> Result<()> {
    st_id(core, cma, id, |_, st, i| {
        if st.ids[i].state != RdmaCmState::Idle {
            return Err(Error::Invalid("rdma_bind_addr on an ID that is not idle"));
        }
        let ip = *addr.ip();
        let mut port_of = None;
        if !ip.is_unspecified() {
            let d = st
                .netdev_with_addr(ip)
                .ok_or(Error::Errno(errno::EADDRNOTAVAIL))?;
            port_of = d.rdma_port;
            let mut a = addr::copy_src_l2_addr(d);
            a.dst_dev_addr = [0; addr::MAX_ADDR_LEN];
            st.ids[i].dev_addr = Some(a);
        }
        let ps = st.ids[i].ps;
        let port = if addr.port() == 0 {
            st.any_port(i, ps, ip)?
        } else {
            if st.port_taken(i, ps, ip, addr.port()) {
                return Err(Error::Errno(errno::EADDRINUSE));
            }
            addr.port()
        };
        let p = &mut st.ids[i];
        p.src = SocketAddrV4::new(ip, port);
        p.port = port_of;
        p.bound = true;
        p.state = RdmaCmState::AddrBound;
        Ok(())
    })
}

/// `rdma_resolve_addr`: resolves `dst` (and binds the ID to `src`, or to
/// the route's source and an ephemeral port). What can be told at once is
/// returned at once (no route: `-ENETUNREACH`; no RDMA device behind the
/// route: `-ENODEV`); otherwise the answer comes as
/// [`RdmaCmEventType::AddrResolved`], or [`RdmaCmEventType::AddrError`]
/// (`-ETIMEDOUT` when ARP found no one within `timeout_ms`). The request
/// moves each time the IP side is pumped through [`net_poll`].
#[doc(alias = "rdma_resolve_addr")]
pub fn resolve_addr(
    core: &mut IbCore,
    cma: ClientId,
    net: &mut dyn IpNet,
    id: RdmaCmId,
    src: Option<SocketAddrV4>,
    dst: SocketAddrV4,
    timeout_ms: u32,
) -> Result<()> {
    with_cma(core, cma, |core, st| {
        refresh_netdevs(st, net);
        let i = st.idx(id)?;
        if st.ids[i].state == RdmaCmState::Idle {
            let a = src.unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
            // cma_bind_addr: the source address is the route's, later.
            let ps = st.ids[i].ps;
            let port = if a.port() == 0 {
                st.any_port(i, ps, *a.ip())?
            } else if st.port_taken(i, ps, *a.ip(), a.port()) {
                return Err(Error::Errno(errno::EADDRINUSE));
            } else {
                a.port()
            };
            let p = &mut st.ids[i];
            p.src = SocketAddrV4::new(*a.ip(), port);
            p.bound = true;
            p.state = RdmaCmState::AddrBound;
        }
        if st.ids[i].state != RdmaCmState::AddrBound {
            return Err(Error::Invalid(
                "rdma_resolve_addr: the ID is busy or connected",
            ));
        }
        let src_ip = Some(*st.ids[i].src.ip()).filter(|a| !a.is_unspecified());
        st.ids[i].dst = dst;
        st.ids[i].state = RdmaCmState::AddrQuery;
        let deadline_ns = core
            .clock()
            .now_ns()
            .saturating_add(u64::from(timeout_ms.max(1)) * 1_000_000);
        match addr::addr_resolve(core, net, src_ip, *dst.ip(), true) {
            Ok(Some((s, a))) => {
                addr_resolved(core, st, i, s, a);
                Ok(())
            }
            Ok(None) => {
                st.ids[i].addr_req = Some(AddrReq {
                    src: src_ip,
                    dst: *dst.ip(),
                    deadline_ns,
                });
                Ok(())
            }
            Err(e) => {
                st.ids[i].state = RdmaCmState::AddrBound;
                Err(e)
            }
        }
    })
}

/// `addr_handler` for a resolved address: the ID takes the device and port
/// whose GID table has our GID and whose P_Key table has the P_Key
/// (`cma_acquire_dev_by_src_ip`), and hears ADDR_RESOLVED (or ADDR_ERROR
/// `-ENODEV` when no port fits).
fn addr_resolved(core: &IbCore, st: &mut Cma, i: usize, src: Ipv4Addr, a: RdmaDevAddr) {
    let p = &mut st.ids[i];
    p.addr_req = None;
    let handle = p.handle();
    let ok = a.rdma_port.filter(|&(d, port)| {
        core.device(d)
            .and_then(|dev| dev.port_cache(port).ok())
            .is_some_and(|c| c.find_gid(&a.sgid()).is_some() && c.find_pkey(a.pkey()).is_ok())
    });
    match ok {
        Some(port) => {
            if p.src.ip().is_unspecified() {
                p.src = SocketAddrV4::new(src, p.src.port());
            }
            p.port = Some(port);
            p.dev_addr = Some(a);
            p.state = RdmaCmState::AddrResolved;
            p.push(RdmaCmEvent::new(RdmaCmEventType::AddrResolved, 0, handle));
        }
        None => {
            p.state = RdmaCmState::AddrBound;
            p.push(RdmaCmEvent::new(
                RdmaCmEventType::AddrError,
                -errno::ENODEV,
                handle,
            ));
        }
    }
}

/// `rdma_resolve_route`: asks the SA for the path between the resolved
/// GIDs (P_Key from the device, one reversible path, the service ID of the
/// destination port); [`RdmaCmEventType::RouteResolved`] or
/// [`RdmaCmEventType::RouteError`] (with the SA's error) within
/// `timeout_ms`.
#[doc(alias = "rdma_resolve_route")]
pub fn resolve_route(
    core: &mut IbCore,
    cma: ClientId,
    id: RdmaCmId,
    timeout_ms: u32,
) -> Result<()> {
    st_id(core, cma, id, |core, st, i| {
        let p = &st.ids[i];
        if p.state != RdmaCmState::AddrResolved {
            return Err(Error::Invalid(
                "rdma_resolve_route before the address is resolved",
            ));
        }
        let a = p.dev_addr.ok_or(Error::Invalid("no device address"))?;
        let (dev, port) = p.port.ok_or(Error::NoDev)?;
        // cma_query_ib_route.
        let rec = PathRecord {
            sgid: a.sgid(),
            dgid: a.dgid(),
            pkey: a.pkey(),
            numb_path: 1,
            reversible: true,
            service_id: service_id(p.ps, p.dst.port()),
            qos_class: 0,
            ..PathRecord::default()
        };
        let mask = path_comp::DGID
            | path_comp::SGID
            | path_comp::PKEY
            | path_comp::NUMB_PATH
            | path_comp::REVERSIBLE
            | path_comp::SERVICE_ID
            | path_comp::QOS_CLASS;
        let t = Duration::from_millis(u64::from(timeout_ms.max(1)));
        let q = sa_query::path_rec_get(core, st.sa, dev, port, &rec, mask, t)?;
        let deadline = core
            .clock()
            .now_ns()
            .saturating_add(t.as_nanos() as u64 + 100_000_000);
        let p = &mut st.ids[i];
        p.route_query = Some((q, deadline));
        p.state = RdmaCmState::RouteQuery;
        Ok(())
    })
}

/// `rdma_create_qp`: a QP for the ID on its device and port, in `pd`
/// (`attr.qp_type` must be the ID's). An RC QP goes to INIT (receives can
/// be posted; the CM drives it on when the connection is made), a UD QP
/// to RTS with the ID's Q_Key (`cma_init_ud_qp`).
#[doc(alias = "rdma_create_qp")]
pub fn create_qp(
    core: &mut IbCore,
    cma: ClientId,
    id: RdmaCmId,
    pd: Pd,
    attr: &QpInitAttr,
) -> Result<Qp> {
    st_id(core, cma, id, |core, st, i| {
        let p = &st.ids[i];
        let (dev, port) = p
            .port
            .ok_or(Error::Invalid("rdma_create_qp on an unbound ID"))?;
        if attr.qp_type != p.qp_type {
            return Err(Error::Invalid(
                "rdma_create_qp: QP type of another port space",
            ));
        }
        let pkey = p.dev_addr.map_or(0xffff, |a| a.pkey());
        let qkey = p.qkey;
        let d = core.device_mut(dev).ok_or(Error::NoDev)?;
        let mut a = *attr;
        a.port_num = port;
        let (qp, _) = d.create_qp(pd, &a)?;
        let pkey_index = d.find_cached_pkey(port, pkey).unwrap_or(0);
        if p.qp_type == QpType::Rc {
            // cma_init_ib_qp: INIT, so receives can be posted before the
            // connection (the CM takes it on from there).
            let x = QpAttr {
                qp_state: QpState::Init,
                pkey_index,
                port_num: port,
                qp_access_flags: AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
                ..QpAttr::default()
            };
            let m = QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS;
            if let Err(e) = d.modify_qp(qp, &x, m) {
                let _ = d.destroy_qp(qp);
                return Err(e);
            }
        } else {
            let steps = [
                (
                    QpAttr {
                        qp_state: QpState::Init,
                        pkey_index,
                        port_num: port,
                        qkey,
                        ..QpAttr::default()
                    },
                    QpAttrMask::STATE
                        | QpAttrMask::PKEY_INDEX
                        | QpAttrMask::PORT
                        | QpAttrMask::QKEY,
                ),
                (
                    QpAttr {
                        qp_state: QpState::Rtr,
                        ..QpAttr::default()
                    },
                    QpAttrMask::STATE,
                ),
                (
                    QpAttr {
                        qp_state: QpState::Rts,
                        sq_psn: 0,
                        ..QpAttr::default()
                    },
                    QpAttrMask::STATE | QpAttrMask::SQ_PSN,
                ),
            ];
            for (x, m) in steps {
                if let Err(e) = d.modify_qp(qp, &x, m) {
                    let _ = d.destroy_qp(qp);
                    return Err(e);
                }
            }
        }
        st.ids[i].qp = Some(qp);
        Ok(qp)
    })
}

/// Hands the ID a QP the caller made itself on its device (in RESET or
/// INIT for RC, in RTS with the ID's Q_Key for UD).
pub fn set_qp(core: &mut IbCore, cma: ClientId, id: RdmaCmId, qp: Qp) -> Result<()> {
    st_id(core, cma, id, |_, st, i| {
        st.ids[i].qp = Some(qp);
        Ok(())
    })
}

/// The CM's response timeout (4.096 us * 2^`timeout`) and retries for this
/// ID's REQ, REP or SIDR_REQ, instead of Linux's 20 and 15 (a minute or
/// more before a silent peer is reported).
pub fn set_cm_timeout(
    core: &mut IbCore,
    cma: ClientId,
    id: RdmaCmId,
    timeout: u8,
    retries: u8,
) -> Result<()> {
    st_id(core, cma, id, |_, st, i| {
        st.ids[i].cm_timeout = timeout.min(31);
        st.ids[i].max_cm_retries = retries.min(15);
        Ok(())
    })
}

/// `rdma_set_ack_timeout`: the local ACK timeout (4.096 us * 2^`timeout`)
/// of the ID's RC QP, which with the retry count bounds how long a silent
/// peer takes to be noticed. Here the IB CM drives the QP and gives it the
/// path's packet life time + 1, so [`connect`] lowers the packet life time
/// in the REQ's path to `timeout - 1` when the SA's is longer: the ACK
/// timeout is then at most `timeout` (Linux sets it exactly, through
/// `rdma_init_qp_attr`). RC only (`-EINVAL`).
#[doc(alias = "rdma_set_ack_timeout")]
pub fn set_ack_timeout(core: &mut IbCore, cma: ClientId, id: RdmaCmId, timeout: u8) -> Result<()> {
    st_id(core, cma, id, |_, st, i| {
        if st.ids[i].qp_type != QpType::Rc {
            return Err(Error::Invalid("rdma_set_ack_timeout on a UD ID"));
        }
        st.ids[i].ack_timeout = Some(timeout.clamp(1, 31));
        Ok(())
    })
}

/// `rdma_notify` with `IB_EVENT_COMM_EST`: data arrived on the ID's QP
/// before the RTU (lost, or not processed yet), so the connection is
/// established now; [`RdmaCmEventType::Established`] follows.
#[doc(alias = "rdma_notify")]
pub fn notify(core: &mut IbCore, cma: ClientId, id: RdmaCmId) -> Result<()> {
    let (cm, cm_id) = st_id(core, cma, id, |_, st, i| {
        Ok((
            st.cm,
            st.ids[i].cm_id.ok_or(Error::Invalid("not connected"))?,
        ))
    })?;
    cm::notify(core, cm, cm_id)
}

/// `rdma_connect`: on a resolved route, a REQ (RC) or a SIDR_REQ (UD) with
/// the cma header and `param`'s private data. The answer comes as
/// [`RdmaCmEventType::Established`] (the QP in RTS, or for UD the peer's
/// QPN and Q_Key), [`RdmaCmEventType::Rejected`] (status: the REJ reason),
/// or [`RdmaCmEventType::Unreachable`] (`-ETIMEDOUT`: the peer never
/// answered; `-ECONNRESET`: SIDR refused).
#[doc(alias = "rdma_connect")]
pub fn connect(
    core: &mut IbCore,
    cma: ClientId,
    id: RdmaCmId,
    param: &RdmaConnParam,
) -> Result<()> {
    st_id(core, cma, id, |core, st, i| {
        let p = &st.ids[i];
        if p.state != RdmaCmState::RouteResolved {
            return Err(Error::Invalid("rdma_connect before the route is resolved"));
        }
        let mut path = p.path.ok_or(Error::Invalid("no route"))?;
        if let Some(t) = p.ack_timeout {
            // The IB CM gives the QP the path's packet life time + 1.
            path.packet_life_time = path.packet_life_time.min(t.saturating_sub(1));
        }
        let (dev, port) = p.port.ok_or(Error::NoDev)?;
        let sid = service_id(p.ps, p.dst.port());
        let mut pd = CmaHdr::ipv4(p.src, p.dst).pack().to_vec();
        pd.extend_from_slice(&param.private_data);
        let cm_id = if p.qp_type == QpType::Ud {
            if pd.len() > private_len::SIDR_REQ {
                return Err(Error::MsgSize);
            }
            let req = CmSidrReqParam {
                path,
                service_id: sid,
                timeout_ms: cm::cm_convert_to_ms(p.cm_timeout),
                max_cm_retries: p.max_cm_retries,
                private_data: pd,
            };
            cm::send_sidr_req(core, st.cm, dev, port, &req)?
        } else {
            if pd.len() > private_len::REQ {
                return Err(Error::MsgSize);
            }
            let qp = p.qp.ok_or(Error::Invalid("rdma_connect without a QP"))?;
            let mut req = CmReqParam::new(path, sid, qp);
            req.starting_psn = st.next_rand() & 0xff_ffff;
            let p = &st.ids[i];
            req.responder_resources = param.responder_resources;
            req.initiator_depth = param.initiator_depth;
            req.retry_count = param.retry_count.min(7);
            req.rnr_retry_count = param.rnr_retry_count.min(7);
            req.remote_cm_response_timeout = p.cm_timeout;
            req.local_cm_response_timeout = p.cm_timeout;
            req.max_cm_retries = p.max_cm_retries;
            req.private_data = pd;
            cm::send_req(core, st.cm, dev, port, &req)?
        };
        let p = &mut st.ids[i];
        p.cm_id = Some(cm_id);
        p.state = RdmaCmState::Connect;
        Ok(())
    })
}

/// `rdma_listen`: the ID (bound, or bound now to any address and an
/// ephemeral port) takes connection requests for its port space and port
/// on its device, or on every device when bound to no address. They come
/// as [`RdmaCmEventType::ConnectRequest`] with a new ID to
/// [`accept`] or [`reject`].
#[doc(alias = "rdma_listen")]
pub fn listen(core: &mut IbCore, cma: ClientId, id: RdmaCmId, _backlog: u32) -> Result<()> {
    st_id(core, cma, id, |core, st, i| {
        if st.ids[i].state == RdmaCmState::Idle {
            let ps = st.ids[i].ps;
            let port = st.any_port(i, ps, Ipv4Addr::UNSPECIFIED)?;
            let p = &mut st.ids[i];
            p.src = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
            p.bound = true;
            p.state = RdmaCmState::AddrBound;
        }
        if st.ids[i].state != RdmaCmState::AddrBound {
            return Err(Error::Invalid("rdma_listen on an ID that is not bound"));
        }
        let sid = service_id(st.ids[i].ps, st.ids[i].src.port());
        let devs: Vec<DeviceId> = match st.ids[i].port {
            Some((d, _)) => alloc::vec![d],
            None => core.device_ids(),
        };
        let mut listens = Vec::new();
        for d in devs {
            if let Some(l) = st
                .listeners
                .iter_mut()
                .find(|l| l.dev == d && l.service_id == sid)
            {
                l.users += 1;
            } else {
                match cm::listen(core, st.cm, d, sid) {
                    Ok(cm_id) => st.listeners.push(CmListener {
                        dev: d,
                        service_id: sid,
                        cm_id,
                        users: 1,
                    }),
                    Err(e) => {
                        release_listens(core, st, &listens);
                        return Err(e);
                    }
                }
            }
            listens.push((d, sid));
        }
        let p = &mut st.ids[i];
        p.listens = listens;
        p.state = RdmaCmState::Listen;
        Ok(())
    })
}

fn release_listens(core: &mut IbCore, st: &mut Cma, listens: &[(DeviceId, u64)]) {
    for &(d, sid) in listens {
        if let Some(li) = st
            .listeners
            .iter()
            .position(|l| l.dev == d && l.service_id == sid)
        {
            st.listeners[li].users -= 1;
            if st.listeners[li].users == 0 {
                let l = st.listeners.swap_remove(li);
                let _ = cm::destroy_id(core, st.cm, l.cm_id);
            }
        }
    }
}

/// `rdma_accept`: answers a connection request on the ID it made: a REP
/// (RC; the QP from [`create_qp`] or [`set_qp`] is driven to RTS, and
/// [`RdmaCmEventType::Established`] follows the RTU) or a SIDR_REP with the
/// QP's number and the ID's Q_Key (UD). Without `param` the REP takes the
/// resources the REQ offered.
#[doc(alias = "rdma_accept")]
pub fn accept(
    core: &mut IbCore,
    cma: ClientId,
    id: RdmaCmId,
    param: Option<&RdmaConnParam>,
) -> Result<()> {
    st_id(core, cma, id, |core, st, i| {
        let p = &st.ids[i];
        if p.state != RdmaCmState::Connect {
            return Err(Error::Invalid(
                "rdma_accept on an ID with no connection request",
            ));
        }
        let cm_id = p.cm_id.ok_or(Error::Invalid("no IB CM ID"))?;
        let qp = p.qp.ok_or(Error::Invalid("rdma_accept without a QP"))?;
        let data = param.map(|x| x.private_data.clone()).unwrap_or_default();
        if p.sidr {
            return cm::send_sidr_rep(
                core,
                st.cm,
                cm_id,
                sidr_status::SUCCESS,
                qp.qp_num,
                p.qkey,
                &data,
            );
        }
        let mut rep = CmRepParam::new(qp);
        rep.starting_psn = st.next_rand() & 0xff_ffff;
        let p = &st.ids[i];
        match param {
            Some(x) => {
                rep.responder_resources = x.responder_resources;
                rep.initiator_depth = x.initiator_depth;
                rep.rnr_retry_count = x.rnr_retry_count.min(7);
            }
            None => {
                // librdmacm without conn_param: the REQ's offer, mirrored.
                rep.responder_resources = p.req_conn.initiator_depth;
                rep.initiator_depth = p.req_conn.responder_resources;
                rep.rnr_retry_count = 7;
            }
        }
        rep.private_data = data;
        cm::send_rep(core, st.cm, cm_id, &rep)
    })
}

/// `rdma_reject`: refuses a connection request (REJ "consumer defined"
/// with `private_data`, or SIDR_REP "rejected").
#[doc(alias = "rdma_reject")]
pub fn reject(core: &mut IbCore, cma: ClientId, id: RdmaCmId, private_data: &[u8]) -> Result<()> {
    st_id(core, cma, id, |core, st, i| {
        let p = &mut st.ids[i];
        let cm_id = p
            .cm_id
            .ok_or(Error::Invalid("no connection request to reject"))?;
        let r = if p.sidr {
            cm::send_sidr_rep(core, st.cm, cm_id, sidr_status::REJECT, 0, 0, private_data)
        } else {
            cm::send_rej(
                core,
                st.cm,
                cm_id,
                rej_reason::CONSUMER_DEFINED,
                &[],
                private_data,
            )
        };
        p.state = RdmaCmState::Idle;
        r
    })
}

/// `rdma_disconnect`: a DREQ (the QP goes to the error state);
/// [`RdmaCmEventType::Disconnected`] follows the DREP. An ID whose peer
/// disconnected first has had its DREP sent by the CM already.
#[doc(alias = "rdma_disconnect")]
pub fn disconnect(core: &mut IbCore, cma: ClientId, id: RdmaCmId) -> Result<()> {
    st_id(core, cma, id, |core, st, i| {
        let p = &st.ids[i];
        let cm_id = p
            .cm_id
            .ok_or(Error::Invalid("rdma_disconnect: not connected"))?;
        if p.qp_type == QpType::Ud {
            return Ok(());
        }
        match cm::state(core, st.cm, cm_id) {
            Some(cm::CmState::Established) => cm::send_dreq(core, st.cm, cm_id, &[]),
            // The peer went first (our DREP is out) or the connection is
            // over: nothing to send.
            Some(_) | None => Ok(()),
        }
    })
}

/// `rdma_destroy_id`: ends what the ID does (a connection gets its DREQ or
/// REJ from the IB CM, a listener stops) and forgets it.
#[doc(alias = "rdma_destroy_id")]
pub fn destroy_id(core: &mut IbCore, cma: ClientId, id: RdmaCmId) -> Result<()> {
    with_cma(core, cma, |core, st| {
        let i = st.idx(id)?;
        let p = st.ids.swap_remove(i);
        if let Some((q, _)) = p.route_query {
            let _ = sa_query::cancel_query(core, st.sa, q);
        }
        if let Some(c) = p.cm_id {
            let _ = cm::destroy_id(core, st.cm, c);
        }
        release_listens(core, st, &p.listens);
        Ok(())
    })
}

/// The ID's next event, if one is waiting (does not poll).
#[doc(alias = "rdma_get_cm_event")]
pub fn get_cm_event(core: &mut IbCore, cma: ClientId, id: RdmaCmId) -> Option<RdmaCmEvent> {
    st_id(core, cma, id, |_, st, i| Ok(st.ids[i].events.pop_front()))
        .ok()
        .flatten()
}

/// Polls the core until the ID has an event or `timeout` passes
/// (`-ETIMEDOUT`). Address resolution also needs the IP side pumped
/// ([`net_poll`]): a caller waiting for it runs its own loop.
pub fn wait_cm_event(
    core: &mut IbCore,
    cma: ClientId,
    id: RdmaCmId,
    timeout: Duration,
) -> Result<RdmaCmEvent> {
    core.poll_until(timeout, |core| {
        match st_id(core, cma, id, |_, st, i| Ok(st.ids[i].events.pop_front())) {
            Ok(ev) => ev.map(Ok),
            Err(e) => Some(Err(e)),
        }
    })?
}

/// What the ID is (`rdma_cm_id`'s public fields).
pub fn query(core: &mut IbCore, cma: ClientId, id: RdmaCmId) -> Result<RdmaCmIdInfo> {
    st_id(core, cma, id, |_, st, i| {
        let p = &st.ids[i];
        Ok(RdmaCmIdInfo {
            state: p.state,
            ps: p.ps,
            qp_type: p.qp_type,
            src: p.src,
            dst: p.dst,
            port: p.port,
            path: p.path,
            dev_addr: p.dev_addr,
            qp: p.qp,
            qkey: p.qkey,
        })
    })
}

/// What the RDMA CM counted.
pub fn counters(core: &mut IbCore, cma: ClientId) -> Option<CmaCounters> {
    with_cma(core, cma, |_, st| Ok(st.counters)).ok()
}

/// How often [`net_poll`] reads the devices again (a bind or an address
/// resolution reads them at once).
pub const NETDEV_REFRESH: Duration = Duration::from_millis(50);

/// The IP side's turn (Linux's netevent notifier and `addr.c`'s delayed
/// work): refreshes the RDMA CM's view of the network devices (every
/// [`NETDEV_REFRESH`]) and steps every address request waiting for ARP.
/// The owner of the IP stack calls it each time it polls the stack.
/// Returns the requests finished.
pub fn net_poll(core: &mut IbCore, cma: ClientId, net: &mut dyn IpNet) -> usize {
    with_cma(core, cma, |core, st| {
        let now = core.clock().now_ns();
        if now.saturating_sub(st.netdevs_at) >= NETDEV_REFRESH.as_nanos() as u64
            || st.netdevs.is_empty()
        {
            st.netdevs_at = now;
            refresh_netdevs(st, net);
        }
        let mut done = 0;
        for i in 0..st.ids.len() {
            let Some(r) = st.ids[i].addr_req.as_ref() else {
                continue;
            };
            let (src, dst) = (r.src, r.dst);
            match addr::addr_resolve(core, net, src, dst, false) {
                Ok(Some((s, a))) => {
                    done += 1;
                    addr_resolved(core, st, i, s, a);
                }
                Ok(None) => {}
                // ARP failed: ask again until the request's time is up
                // (Linux's neighbour is asked again at each retry).
                Err(Error::Errno(errno::EHOSTUNREACH)) => {
                    let _ = addr::addr_resolve(core, net, src, dst, true);
                }
                Err(e) => {
                    done += 1;
                    let p = &mut st.ids[i];
                    p.addr_req = None;
                    p.state = RdmaCmState::AddrBound;
                    let h = p.handle();
                    p.push(RdmaCmEvent::new(
                        RdmaCmEventType::AddrError,
                        errno_of(&e),
                        h,
                    ));
                }
            }
        }
        Ok(done)
    })
    .unwrap_or(0)
}

fn refresh_netdevs(st: &mut Cma, net: &dyn IpNet) {
    st.netdevs.clear();
    let v = &mut st.netdevs;
    net.netdevs(&mut |d| v.push(d.clone()));
}

mod ib_handler;
pub use ib_handler::init_qp_attr;
use ib_handler::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_are_linuxs() {
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0000_0000_0106_1c06);
        assert_eq!(service_id(PortSpace::Udp, 1), RDMA_IB_IP_PS_UDP | 1);
        assert_eq!(service_id(PortSpace::Ib, 0), RDMA_IB_IP_PS_IB);
        assert_eq!(
            service_id(PortSpace::Tcp, 0) & RDMA_IB_IP_PS_MASK,
            RDMA_IB_IP_PS_TCP
        );
        let s = service_id(PortSpace::Tcp, 18515);
        assert_eq!(ps_from_service_id(s), RDMA_PS_TCP);
        assert_eq!(port_from_service_id(s), 18515);
        assert_eq!(PortSpace::from_value(RDMA_PS_UDP), Some(PortSpace::Udp));
        assert_eq!(PortSpace::from_value(0x42), None);
    }

    #[test]
    fn cma_hdr_golden_bytes() {
        let src = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 0x8001);
        let dst = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 7174);
        let h = CmaHdr::ipv4(src, dst);
        let b = h.pack();
        assert_eq!(&b[..4], &[0x00, 0x40, 0x80, 0x01]);
        assert_eq!(&b[4..16], &[0; 12]);
        assert_eq!(&b[16..20], &[10, 0, 0, 1]);
        assert_eq!(&b[32..36], &[10, 0, 0, 2]);
        let back = CmaHdr::parse(&b).unwrap();
        assert_eq!(back, h);
        assert_eq!((back.src_ip4(), back.dst_ip4()), (*src.ip(), *dst.ip()));
        assert!(CmaHdr::parse(&b[..35]).is_none());
        assert_eq!(
            RdmaCmEventType::AddrResolved.name(),
            "RDMA_CM_EVENT_ADDR_RESOLVED"
        );
        assert_eq!(RdmaCmEventType::Unreachable.msg(), "unreachable");
    }
}
