//! The compute node's side of rmem.
//!
//! The compute node's side: one RC connection to a memory node (made by the
//! IB CM to a LID or port GID, or by the RDMA CM to an IPv4 address), the RPC (hello/alloc/free over SEND with immediate) and RDMA
//! READ/WRITE with a window of K requests in flight, completions
//! busy-polled (LITE's `lite_read`/`lite_write` and LegoOS FIT's RPC in
//! spirit); leaves out reconnecting and sharing one QP between threads.
//!
//! Each in-flight request owns a slot: a staging frame of `slot_len` bytes
//! in DMA memory. The hot path ([`Client::read_async`],
//! [`Client::write_async`], [`Client::poll`]) allocates nothing.

use alloc::vec::Vec;
use core::net::SocketAddrV4;
use core::time::Duration;

use hal::{BusAddr, Deadline, DmaBuf};
use ib_core::addr::IpNet;
use ib_core::cm::{self, CmId, CmReqParam};
use ib_core::cma::{self, PortSpace, RdmaCmEvent, RdmaCmEventType, RdmaCmId, RdmaConnParam};
use ib_core::sa_query::{self, PathRecord};
use ib_core::verbs::{
    AccessFlags, Cq, CqInitAttr, Mr, Mtu, Pd, Qp, QpAttr, QpAttrMask, QpCap, QpCreateFlags,
    QpInitAttr, QpState, QpType, SendFlags, SendWr, Sge, SigType, Wc, WcFlags, WcStatus, WrDetail,
    WrOpcode,
};
use ib_core::{ClientId, DeviceId, IbCore};

use crate::conn::{Peer, RcParams, rc_connect};
use crate::proto::{self, MSG_LEN, Msg, Op};
use crate::stats::Stats;
use crate::{Error, Result, dev, post_msg_recv, post_msg_send};

/// Receive buffers kept posted for RPC replies.
const RX_DEPTH: usize = 4;
/// `wr_id` bit marking RPC work requests.
const RPC_WRID: u64 = 1 << 63;
/// Pause between two attempts of [`Client::connect`].
pub const CONNECT_PAUSE: Duration = Duration::from_millis(200);
/// `rdma_resolve_addr`'s and `rdma_resolve_route`'s timeouts of one
/// attempt by IP address (less when the connect deadline is nearer).
const RESOLVE_MS: u32 = 2000;

/// How a client connects and what it may have in flight.
#[derive(Debug, Clone, Copy)]
pub struct ClientConfig {
    /// Local port.
    pub port: u8,
    /// Requests in flight at most (K).
    pub window: usize,
    /// Largest single request (bytes; a staging frame per slot).
    pub slot_len: usize,
    /// The CM service ID.
    pub service_id: u64,
    /// Time allowed to find a path and connect, attempts repeated within it
    /// ([`Client::connect`]).
    pub connect_timeout: Duration,
    /// Time allowed for one operation (RPC or RDMA) before the connection
    /// is declared failed (a backstop behind the transport's own retries).
    pub op_timeout: Duration,
    /// Transport retry count (3 bits) and RNR retry count of the connection.
    pub retry_count: u8,
    /// Local ACK timeout (4.096 us * 2^x) of connections made without the
    /// CM, and its upper bound for CM connections (whose timeout is the
    /// path's packet life time + 1); with `retry_count` it bounds how long
    /// a gone memory node or a pulled cable takes to be noticed:
    /// (retry_count + 1) * 4.096 us * 2^x (16, 7: 8 x 268 ms = 2.1 s, under
    /// `op_timeout`).
    pub ack_timeout: u8,
    /// Latencies kept for the exact percentiles.
    pub sample: usize,
    /// The source GID index of a connection to a GID (RoCE's `-g`; 0: the
    /// port's first GID, its link-local one on an Ethernet port).
    pub gid_index: u8,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            port: 1,
            window: 16,
            slot_len: crate::PAGE_SIZE,
            service_id: crate::SERVICE_ID,
            connect_timeout: Duration::from_secs(5),
            op_timeout: Duration::from_secs(5),
            retry_count: 7,
            ack_timeout: 16,
            sample: crate::stats::DEFAULT_SAMPLE,
            gid_index: 0,
        }
    }
}

/// Where the memory node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// Its port's LID.
    Lid(u16),
    /// Its port's GID.
    Gid(ib_core::verbs::Gid),
}

/// The memory node's region as HELLO reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Remote address of its first byte.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// Its remote key.
    pub rkey: u32,
}

/// A chunk allocated on the memory node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteChunk {
    /// Remote address.
    pub addr: u64,
    /// Length (whole pages).
    pub len: u64,
}

/// An asynchronous request: its slot and generation (the `wr_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(pub u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    busy: bool,
    generation: u32,
    kind: Kind,
    addr: u64,
    len: u32,
    start_ns: u64,
    /// The caller's DMA memory the request reads into or writes from
    /// (`read_into_async`/`write_from_async`), instead of the slot's frame.
    local: Option<u64>,
}

/// One finished request, as [`Client::poll`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The request.
    pub token: Token,
    /// Whether it was a READ.
    pub read: bool,
    /// Remote address.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
    /// Its latency (post to completion seen).
    pub latency_ns: u64,
    /// The outcome.
    pub result: Result<()>,
}

/// A connection to a memory node.
pub struct Client {
    dev: DeviceId,
    id: Option<(ClientId, CmId)>,
    /// The RDMA CM's ID of a connection made by IP address.
    rid: Option<(ClientId, RdmaCmId)>,
    pd: Pd,
    scq: Cq,
    rcq: Cq,
    qp: Qp,
    lmr: Mr,
    cfg: ClientConfig,
    frames: DmaBuf,
    rpc: DmaBuf,
    slots: Vec<Slot>,
    free: Vec<u16>,
    inflight: usize,
    seq: u32,
    region: Region,
    stats: Stats,
    wc: [Wc; 16],
    broken: Option<Error>,
}

impl core::fmt::Debug for Client {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Client")
            .field("qp", &self.qp.qp_num)
            .field("region", &self.region)
            .field("inflight", &self.inflight)
            .field("broken", &self.broken)
            .finish()
    }
}

impl Client {
    /// Connects to the memory node at `dlid` (path from the SA), says hello
    /// and learns its region. An attempt that fails because the memory
    /// node is not there yet (no path from the SA: the SM has not swept;
    /// the CM's REQ rejected: nothing listens on the service; or
    /// unanswered) is made again after [`CONNECT_PAUSE`] until
    /// `connect_timeout` is spent; the repeats are the new client's
    /// [`Stats::retries`]. The last attempt's error is returned.
    pub fn connect(
        core: &mut IbCore,
        cm: ClientId,
        sa: ClientId,
        dev_id: DeviceId,
        dlid: u16,
        cfg: ClientConfig,
    ) -> Result<Client> {
        Self::connect_to(core, cm, sa, dev_id, Dest::Lid(dlid), cfg)
    }

    /// [`Client::connect`] to a LID or a port GID (a GID does not change
    /// when the SM hands out other LIDs: scripts name the memory node by
    /// its port GUID).
    pub fn connect_to(
        core: &mut IbCore,
        cm: ClientId,
        sa: ClientId,
        dev_id: DeviceId,
        dest: Dest,
        cfg: ClientConfig,
    ) -> Result<Client> {
        let deadline = Deadline::after(core.clock(), cfg.connect_timeout);
        // One QP for every attempt (moved back to RESET between them): a
        // failed attempt costs no verbs objects.
        let mut c = Self::create(core, dev_id, cfg)?;
        let mut retries = 0u64;
        loop {
            let left = deadline.remaining(core.clock());
            let r = match dest {
                Dest::Lid(l) => sa_query::path_to_lid(core, sa, dev_id, cfg.port, l, left),
                Dest::Gid(g) if cfg.gid_index == 0 => {
                    sa_query::path_to_gid(core, sa, dev_id, cfg.port, g, left)
                }
                // From another of the port's GIDs (on RoCE an IPv4-mapped
                // one; the path is made locally there).
                Dest::Gid(g) => core
                    .device(dev_id)
                    .ok_or(ib_core::Error::NoDev)
                    .and_then(|d| d.get_cached_gid(cfg.port, usize::from(cfg.gid_index)))
                    .and_then(|sgid| {
                        sa_query::path_between(core, sa, dev_id, cfg.port, sgid, g, left)
                    }),
            }
            .map_err(Error::Connect)
            .and_then(|path| {
                let left = deadline.remaining(core.clock());
                c.cm_connect(core, cm, path, left)
            });
            // Connected: HELLO. A HELLO whose reply does not come (the
            // memory node's answer lost to a connection it gave up, seen
            // under a loaded QEMU) is a failed attempt too, not the end.
            let r = r.and_then(|()| match c.hello(core) {
                Err(Error::TimedOut(_) | Error::Unreachable(_) | Error::Completion(_))
                    if deadline.remaining(core.clock()) > CONNECT_PAUSE =>
                {
                    c.forget_attempt(core);
                    Err(Error::Connect(ib_core::Error::Invalid("no reply to HELLO")))
                }
                other => other,
            });
            match r {
                Ok(()) => {
                    c.stats.retries = retries;
                    return Ok(c);
                }
                Err(Error::Connect(e)) if deadline.remaining(core.clock()) > CONNECT_PAUSE => {
                    log::debug!("rmem: connecting to {dest:?}: {e}; trying again");
                    retries += 1;
                    let pause = Deadline::after(core.clock(), CONNECT_PAUSE);
                    while !pause.expired(core.clock()) {
                        core.poll();
                        core.clock().relax();
                    }
                    let reset = QpAttr {
                        qp_state: QpState::Reset,
                        ..QpAttr::default()
                    };
                    if let Err(e) = dev(core, dev_id).and_then(|d| {
                        d.modify_qp(c.qp, &reset, QpAttrMask::STATE)
                            .map_err(Error::from)
                    }) {
                        c.destroy(core);
                        return Err(e);
                    }
                }
                Err(e) => {
                    c.destroy(core);
                    return Err(e);
                }
            }
        }
    }

    /// Undoes a connection whose HELLO failed, so the next attempt starts
    /// clean on the same QP: the CM ID goes (DREQ), completions flushed by
    /// the failure are drained, the failure is forgotten (it counts as a
    /// retry, not an error).
    fn forget_attempt(&mut self, core: &mut IbCore) {
        if let Some((cm, id)) = self.id.take() {
            let _ = cm::destroy_id(core, cm, id);
        }
        if let Some((cma, id)) = self.rid.take() {
            let _ = cma::destroy_id(core, cma, id);
        }
        if let Some(d) = core.device_mut(self.dev) {
            let mut wc = [Wc::default(); RX_DEPTH];
            for cq in [self.scq, self.rcq] {
                // At most RX_DEPTH receives and one send are queued.
                for _ in 0..=RX_DEPTH {
                    if d.poll_cq(cq, &mut wc).unwrap_or(0) == 0 {
                        break;
                    }
                }
            }
        }
        self.broken = None;
        self.stats.errors = self.stats.errors.saturating_sub(1);
    }

    /// The CM's active side on this client's QP (in RESET): REQ, REP, RTU
    /// within `timeout`; the CM drives the QP to RTS.
    fn cm_connect(
        &mut self,
        core: &mut IbCore,
        cm: ClientId,
        path: PathRecord,
        timeout: Duration,
    ) -> Result<()> {
        let cfg = self.cfg;
        // The CM gives the QP a local ACK timeout of the path's packet life
        // time + 1; an SA's default (OpenSM: 18, 1 s per try, 8 s for 7
        // retries) would let `op_timeout` fire first on a pulled cable. At
        // most `ack_timeout`, as rdma_set_ack_timeout lets Linux ULPs ask.
        let mut path = path;
        path.packet_life_time = path.packet_life_time.min(cfg.ack_timeout.saturating_sub(1));
        let mut p = CmReqParam::new(path, cfg.service_id, self.qp);
        p.retry_count = cfg.retry_count.min(7);
        p.rnr_retry_count = cfg.retry_count.min(7);
        // Interactive: a silent memory node fails the connect within
        // `connect_timeout`, not after Linux's minute of CM retries.
        p.max_cm_retries = 3;
        p.remote_cm_response_timeout = 16;
        p.local_cm_response_timeout = 16;
        let (id, _) =
            cm::connect(core, cm, self.dev, cfg.port, &p, timeout).map_err(Error::Connect)?;
        self.id = Some((cm, id));
        Ok(())
    }

    /// [`Client::connect`] by IPv4 address and port (the memory node's
    /// [`crate::IP_PORT`] unless it serves another) through the RDMA CM: the
    /// address resolved by IPoIB ARP, the route by the SA, then the RDMA
    /// CM's REQ (TCP port space, the cma header), and HELLO as on every
    /// connection. The QP is made on the device and port the address
    /// resolves to. `net` is the IP stack: it is polled, with the RDMA CM's
    /// turn at it ([`cma::net_poll`]), as the attempt waits. Attempts that
    /// fail (no route yet, no ARP answer, no path, rejected, unanswered)
    /// are made again after [`CONNECT_PAUSE`] until `connect_timeout`, as
    /// by LID; the last attempt's error is returned, or the one before it
    /// when the deadline cut the last one short ([`Error::ConnectIp`],
    /// which says what failed).
    pub fn connect_ip(
        core: &mut IbCore,
        cma: ClientId,
        net: &mut dyn IpNet,
        dst: SocketAddrV4,
        cfg: ClientConfig,
    ) -> Result<Client> {
        let deadline = Deadline::after(core.clock(), cfg.connect_timeout);
        // Made once the address says which device and port; kept (its QP
        // moved back to RESET) from one attempt to the next.
        let mut client: Option<Client> = None;
        let mut retries = 0u64;
        // The previous attempt's error: an attempt the deadline cut short
        // says less than the one before it (an ARP wait ended by the
        // deadline after a port that refused the REQ).
        let mut prev: Option<Error> = None;
        loop {
            let r = Self::ip_attempt(core, cma, net, dst, cfg, &mut client, deadline);
            let r = r.and_then(|()| match client.as_mut() {
                Some(c) => match c.hello(core) {
                    Err(Error::TimedOut(_) | Error::Unreachable(_) | Error::Completion(_))
                        if deadline.remaining(core.clock()) > CONNECT_PAUSE =>
                    {
                        c.forget_attempt(core);
                        Err(Error::Connect(ib_core::Error::Invalid("no reply to HELLO")))
                    }
                    other => other,
                },
                None => Err(Error::Protocol("no connection")),
            });
            match r {
                Ok(()) => {
                    let Some(mut c) = client else {
                        return Err(Error::Protocol("no connection"));
                    };
                    c.stats.retries = retries;
                    return Ok(c);
                }
                Err(e @ (Error::Connect(_) | Error::ConnectIp { .. }))
                    if deadline.remaining(core.clock()) > CONNECT_PAUSE =>
                {
                    log::debug!("rmem: connecting to {dst}: {e}; trying again");
                    prev = Some(e);
                    retries += 1;
                    let pause = Deadline::after(core.clock(), CONNECT_PAUSE);
                    while !pause.expired(core.clock()) {
                        pump(core, cma, net);
                        core.clock().relax();
                    }
                    if let Some(c) = client.as_mut() {
                        let reset = QpAttr {
                            qp_state: QpState::Reset,
                            ..QpAttr::default()
                        };
                        let r = dev(core, c.dev).and_then(|d| {
                            d.modify_qp(c.qp, &reset, QpAttrMask::STATE)
                                .map_err(Error::from)
                        });
                        if let Err(e) = r {
                            if let Some(c) = client.take() {
                                c.destroy(core);
                            }
                            return Err(e);
                        }
                    }
                }
                Err(e) => {
                    if let Some(c) = client.take() {
                        c.destroy(core);
                    }
                    let cut =
                        matches!(e, Error::ConnectIp { .. }) && deadline.expired(core.clock());
                    return Err(match prev {
                        Some(p) if cut => p,
                        _ => e,
                    });
                }
            }
        }
    }

    /// One attempt of [`Client::connect_ip`]: a new RDMA CM ID, resolve the
    /// address, the route, make the client (or keep the one made) on the
    /// resolved device and port, connect; the ID is the client's once
    /// established, destroyed otherwise.
    fn ip_attempt(
        core: &mut IbCore,
        cma: ClientId,
        net: &mut dyn IpNet,
        dst: SocketAddrV4,
        cfg: ClientConfig,
        client: &mut Option<Client>,
        deadline: Deadline,
    ) -> Result<()> {
        let id = cma::create_id(core, cma, PortSpace::Tcp).map_err(Error::Connect)?;
        let refused = |e: ib_core::Error| Error::ConnectIp {
            dst,
            event: None,
            status: e.to_errno(),
        };
        let failed = |ev: &RdmaCmEvent| Error::ConnectIp {
            dst,
            event: Some(ev.event),
            status: ev.status,
        };
        let ms = |core: &IbCore| {
            let left = deadline.remaining(core.clock()).as_millis();
            u32::try_from(left).unwrap_or(u32::MAX).clamp(1, RESOLVE_MS)
        };
        let r = (|| {
            // Interactive: a silent memory node fails the attempt within
            // seconds, not after Linux's minute of CM retries; the QP's ACK
            // timeout at most `ack_timeout`, as on connections by LID.
            cma::set_cm_timeout(core, cma, id, 16, 3).map_err(refused)?;
            cma::set_ack_timeout(core, cma, id, cfg.ack_timeout).map_err(refused)?;
            let t = ms(core);
            cma::resolve_addr(core, cma, net, id, None, dst, t).map_err(refused)?;
            let ev = wait_ip(
                core,
                cma,
                net,
                id,
                deadline,
                RdmaCmEventType::AddrError,
                dst,
            )?;
            if ev.event != RdmaCmEventType::AddrResolved {
                return Err(failed(&ev));
            }
            let t = ms(core);
            cma::resolve_route(core, cma, id, t).map_err(refused)?;
            let ev = wait_ip(
                core,
                cma,
                net,
                id,
                deadline,
                RdmaCmEventType::RouteError,
                dst,
            )?;
            if ev.event != RdmaCmEventType::RouteResolved {
                return Err(failed(&ev));
            }
            let (dev_id, port) = cma::query(core, cma, id)
                .map_err(refused)?
                .port
                .ok_or_else(|| refused(ib_core::Error::NoDev))?;
            if client
                .as_ref()
                .is_some_and(|c| c.dev != dev_id || c.cfg.port != port)
                && let Some(c) = client.take()
            {
                c.destroy(core);
            }
            let c = match client {
                Some(c) => c,
                None => client.insert(Self::create(core, dev_id, ClientConfig { port, ..cfg })?),
            };
            cma::set_qp(core, cma, id, c.qp).map_err(refused)?;
            let retry = cfg.retry_count.min(7);
            let param = RdmaConnParam {
                responder_resources: 4,
                initiator_depth: 4,
                retry_count: retry,
                rnr_retry_count: retry,
                ..RdmaConnParam::default()
            };
            cma::connect(core, cma, id, &param).map_err(refused)?;
            loop {
                let ev = wait_ip(
                    core,
                    cma,
                    net,
                    id,
                    deadline,
                    RdmaCmEventType::Unreachable,
                    dst,
                )?;
                match ev.event {
                    RdmaCmEventType::Established => break Ok(()),
                    RdmaCmEventType::ConnectResponse => continue,
                    _ => break Err(failed(&ev)),
                }
            }
        })();
        match r {
            Ok(()) => {
                if let Some(c) = client.as_mut() {
                    c.rid = Some((cma, id));
                }
                Ok(())
            }
            Err(e) => {
                let _ = cma::destroy_id(core, cma, id);
                Err(e)
            }
        }
    }

    /// Connects over a known path (the CM drives the QP to RTS).
    pub fn connect_path(
        core: &mut IbCore,
        cm: ClientId,
        dev_id: DeviceId,
        path: PathRecord,
        cfg: ClientConfig,
    ) -> Result<Client> {
        let mut c = Self::create(core, dev_id, cfg)?;
        if let Err(e) = c.cm_connect(core, cm, path, cfg.connect_timeout) {
            c.destroy(core);
            return Err(e);
        }
        c.finish(core)
    }

    /// A client whose QP is still in RESET, for a connection made without
    /// the CM: give [`Client::qpn`] and [`Client::sq_psn`] to the memory
    /// node, then [`Client::connect_peer`] with its answer.
    pub fn create(core: &mut IbCore, dev_id: DeviceId, cfg: ClientConfig) -> Result<Client> {
        if cfg.window == 0 || cfg.window > 1 << 15 || cfg.slot_len == 0 || cfg.port == 0 {
            return Err(Error::BadLength);
        }
        let d = dev(core, dev_id)?;
        let pool = d.provider().dma_pool();
        let nomem = |_| Error::Verbs(ib_core::Error::NoMem);
        let frames = pool
            .alloc(cfg.window * cfg.slot_len, crate::PAGE_SIZE)
            .map_err(nomem)?;
        let rpc = pool.alloc((RX_DEPTH + 1) * MSG_LEN, 64).map_err(nomem)?;
        let pd = d.alloc_pd()?;
        // What was made is undone if a later step fails.
        let undo = |d: &mut ib_core::Device, lmr: Option<Mr>, cqs: &[Cq]| {
            for &cq in cqs {
                let _ = d.destroy_cq(cq);
            }
            if let Some(m) = lmr {
                let _ = d.dereg_mr(m);
            }
            let _ = d.dealloc_pd(pd);
        };
        let lmr = match d.get_dma_mr(pd, AccessFlags::LOCAL_WRITE) {
            Ok(m) => m,
            Err(e) => {
                undo(d, None, &[]);
                return Err(e.into());
            }
        };
        let scq = match d.create_cq(&CqInitAttr {
            cqe: cfg.window as u32 + 2,
            comp_vector: 0,
        }) {
            Ok((cq, _)) => cq,
            Err(e) => {
                undo(d, Some(lmr), &[]);
                return Err(e.into());
            }
        };
        let rcq = match d.create_cq(&CqInitAttr {
            cqe: RX_DEPTH as u32 + 1,
            comp_vector: 0,
        }) {
            Ok((cq, _)) => cq,
            Err(e) => {
                undo(d, Some(lmr), &[scq]);
                return Err(e.into());
            }
        };
        let qp = match d.create_qp(
            pd,
            &QpInitAttr {
                send_cq: scq,
                recv_cq: rcq,
                srq: None,
                cap: QpCap {
                    max_send_wr: cfg.window as u32 + 1,
                    max_recv_wr: RX_DEPTH as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_type: SigType::ReqWr,
                qp_type: QpType::Rc,
                create_flags: QpCreateFlags::empty(),
                port_num: cfg.port,
            },
        ) {
            Ok((qp, _)) => qp,
            Err(e) => {
                undo(d, Some(lmr), &[scq, rcq]);
                return Err(e.into());
            }
        };
        Ok(Client {
            dev: dev_id,
            id: None,
            rid: None,
            pd,
            scq,
            rcq,
            qp,
            lmr,
            cfg,
            frames,
            rpc,
            slots: alloc::vec![
                Slot {
                    busy: false,
                    generation: 0,
                    kind: Kind::Read,
                    addr: 0,
                    len: 0,
                    start_ns: 0,
                    local: None,
                };
                cfg.window
            ],
            free: (0..cfg.window as u16).rev().collect(),
            inflight: 0,
            seq: 0,
            region: Region {
                base: 0,
                len: 0,
                rkey: 0,
            },
            stats: Stats::new(cfg.sample),
            wc: [Wc::default(); 16],
            broken: None,
        })
    }

    /// This client's QP number.
    pub fn qpn(&self) -> u32 {
        self.qp.qp_num
    }

    /// The first PSN this client sends.
    pub fn sq_psn(&self) -> u32 {
        self.qp.qp_num.wrapping_mul(0x9e37) & 0xff_ffff
    }

    /// Connects a [`Client::create`]d client to `peer` without the CM
    /// (INIT, RTR, RTS here), says hello and learns the region.
    pub fn connect_peer(self, core: &mut IbCore, peer: Peer) -> Result<Client> {
        let p = RcParams {
            port: self.cfg.port,
            sq_psn: self.sq_psn(),
            access: AccessFlags::empty(),
            timeout: self.cfg.ack_timeout,
            retry_cnt: self.cfg.retry_count,
            rnr_retry: self.cfg.retry_count,
            mtu: Mtu::Mtu1024,
        };
        let r = dev(core, self.dev).and_then(|d| rc_connect(d, self.qp, &p, peer));
        match r {
            Ok(()) => self.finish(core),
            Err(e) => {
                self.destroy(core);
                Err(e)
            }
        }
    }

    /// Posts the RPC receives and says hello (the QP is in RTS).
    fn finish(mut self, core: &mut IbCore) -> Result<Client> {
        match self.hello(core) {
            Ok(()) => Ok(self),
            Err(e) => {
                self.destroy(core);
                Err(e)
            }
        }
    }

    /// Posts the RPC receives and says HELLO: learns the region.
    fn hello(&mut self, core: &mut IbCore) -> Result<()> {
        (0..RX_DEPTH).try_for_each(|i| self.post_rpc_recv(core, i))?;
        let hello = self.rpc(core, Op::Hello, 0, 0)?;
        self.region = Region {
            base: hello.addr,
            len: hello.len,
            rkey: hello.rkey,
        };
        Ok(())
    }

    /// Frees the verbs objects (after a failure or at close).
    fn destroy(self, core: &mut IbCore) {
        if let Some((cm, id)) = self.id {
            let _ = cm::destroy_id(core, cm, id);
        }
        if let Some((cma, id)) = self.rid {
            let _ = cma::destroy_id(core, cma, id);
        }
        if let Some(d) = core.device_mut(self.dev) {
            let _ = d.destroy_qp(self.qp);
            let _ = d.destroy_cq(self.scq);
            let _ = d.destroy_cq(self.rcq);
            let _ = d.dereg_mr(self.lmr);
            let _ = d.dealloc_pd(self.pd);
        }
    }

    /// The memory node's region.
    pub fn region(&self) -> Region {
        self.region
    }

    /// What this client counted.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Resets the counters (before a benchmark's measured part).
    pub fn reset_stats(&mut self) {
        self.stats.reset();
    }

    /// The first error that failed the connection, if any.
    pub fn broken(&self) -> Option<Error> {
        self.broken
    }

    /// Requests in flight.
    pub fn inflight(&self) -> usize {
        self.inflight
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// The device the connection runs on (for a connection by IP address,
    /// the one the address resolved to).
    pub fn device(&self) -> DeviceId {
        self.dev
    }

    fn post_rpc_recv(&mut self, core: &mut IbCore, i: usize) -> Result<()> {
        post_msg_recv(
            dev(core, self.dev)?,
            self.qp,
            RPC_WRID | i as u64,
            self.rpc.bus_addr().0 + ((i + 1) * MSG_LEN) as u64,
            self.lmr.lkey,
        )
    }

    fn fail(&mut self, core: &mut IbCore, e: Error) -> Error {
        if self.broken.is_none() {
            self.broken = Some(e);
            // Flush whatever is still queued so every slot completes.
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            if let Some(d) = core.device_mut(self.dev) {
                let _ = d.modify_qp(self.qp, &attr, QpAttrMask::STATE);
            }
        }
        self.stats.errors += 1;
        e
    }

    /// One RPC round trip (no asynchronous requests may be in flight).
    fn rpc(&mut self, core: &mut IbCore, op: Op, addr: u64, len: u64) -> Result<Msg> {
        if self.broken.is_some() {
            return Err(Error::Broken);
        }
        if self.inflight != 0 {
            return Err(Error::Busy);
        }
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut b = [0u8; MSG_LEN];
        let imm = Msg::request(op, seq, addr, len).encode(&mut b);
        self.rpc.write_bytes(0, &b);
        post_msg_send(
            dev(core, self.dev)?,
            self.qp,
            RPC_WRID,
            self.rpc.bus_addr().0,
            self.lmr.lkey,
            imm,
        )?;
        let deadline = Deadline::after(core.clock(), self.cfg.op_timeout);
        let mut sent = false;
        let mut reply = None;
        while !(sent && reply.is_some()) {
            if deadline.expired(core.clock()) {
                return Err(self.fail(core, Error::TimedOut("the memory node's reply")));
            }
            core.poll();
            let d = dev(core, self.dev)?;
            let mut wc = [Wc::default(); 1];
            if d.poll_cq(self.scq, &mut wc)? == 1 {
                if wc[0].status != WcStatus::Success {
                    let e = Error::from_wc(wc[0].status, 0, MSG_LEN as u32);
                    return Err(self.fail(core, e));
                }
                sent = true;
            }
            let d = dev(core, self.dev)?;
            if d.poll_cq(self.rcq, &mut wc)? == 1 {
                let w = wc[0];
                if w.status != WcStatus::Success {
                    let e = Error::from_wc(w.status, 0, MSG_LEN as u32);
                    return Err(self.fail(core, e));
                }
                let i = (w.wr_id & !RPC_WRID) as usize;
                if i >= RX_DEPTH {
                    return Err(self.fail(core, Error::Protocol("receive completion of no buffer")));
                }
                let n = (w.byte_len as usize).min(MSG_LEN);
                let mut m = [0u8; MSG_LEN];
                self.rpc.read_bytes((i + 1) * MSG_LEN, &mut m[..n]);
                let imm = w.wc_flags.contains(WcFlags::WITH_IMM).then_some(w.imm_data);
                let got = if (w.byte_len as usize) > MSG_LEN {
                    Err(Error::Protocol("reply longer than 32 bytes"))
                } else {
                    proto::decode(&m[..n], imm).map_err(|e| Error::Protocol(e.what))
                };
                self.post_rpc_recv(core, i)?;
                let msg = got?;
                if !msg.reply || msg.seq != seq || msg.op != op {
                    return Err(Error::Protocol("reply to another request"));
                }
                reply = Some(msg);
            }
            core.clock().relax();
        }
        self.stats.rpcs += 1;
        match reply {
            Some(m) if m.status == proto::Status::Ok => Ok(m),
            Some(m) => Err(Error::Rpc(m.status)),
            None => Err(Error::Protocol("no reply")),
        }
    }

    /// Allocates `len` bytes (rounded up to pages) on the memory node.
    pub fn alloc(&mut self, core: &mut IbCore, len: u64) -> Result<RemoteChunk> {
        let m = self.rpc(core, Op::Alloc, 0, len)?;
        if m.rkey != self.region.rkey
            || m.addr < self.region.base
            || m.len < len
            || m.addr - self.region.base > self.region.len.saturating_sub(m.len)
        {
            return Err(Error::Protocol("allocated chunk outside the region"));
        }
        Ok(RemoteChunk {
            addr: m.addr,
            len: m.len,
        })
    }

    /// Frees a chunk this connection allocated.
    pub fn free(&mut self, core: &mut IbCore, chunk: RemoteChunk) -> Result<()> {
        self.rpc(core, Op::Free, chunk.addr, 0).map(|_| ())
    }

    fn start(&mut self, kind: Kind, addr: u64, len: usize) -> Result<(Token, usize)> {
        if self.broken.is_some() {
            return Err(Error::Broken);
        }
        if len == 0 || len > self.cfg.slot_len {
            return Err(Error::BadLength);
        }
        let Some(&s) = self.free.last() else {
            return Err(Error::WindowFull);
        };
        let s = s as usize;
        let slot = &mut self.slots[s];
        slot.generation = slot.generation.wrapping_add(1);
        slot.kind = kind;
        slot.addr = addr;
        slot.len = len as u32;
        slot.local = None;
        let token = Token(((slot.generation as u64) << 16) | s as u64);
        Ok((token, s))
    }

    fn post(&mut self, core: &mut IbCore, token: Token, s: usize) -> Result<Token> {
        let slot = self.slots[s];
        let sge = [Sge {
            addr: slot
                .local
                .unwrap_or(self.frames.bus_addr().0 + (s * self.cfg.slot_len) as u64),
            length: slot.len,
            lkey: self.lmr.lkey,
        }];
        let wr = SendWr {
            wr_id: token.0,
            sg_list: &sge,
            opcode: match slot.kind {
                Kind::Read => WrOpcode::RdmaRead,
                Kind::Write => WrOpcode::RdmaWrite,
            },
            send_flags: SendFlags::SIGNALED,
            wr: WrDetail::Rdma {
                remote_addr: slot.addr,
                rkey: self.region.rkey,
            },
            ..SendWr::default()
        };
        let now = core.clock().now_ns();
        if let Err(e) = dev(core, self.dev)?.post_send(self.qp, &[wr]) {
            self.stats.errors += 1;
            return Err(e.into());
        }
        self.free.pop();
        let slot = &mut self.slots[s];
        slot.busy = true;
        slot.start_ns = now;
        self.inflight += 1;
        Ok(token)
    }

    /// Starts an RDMA READ of `len` bytes (at most `slot_len`) at remote
    /// `addr` into the request's frame; [`Client::poll`] reports it.
    pub fn read_async(&mut self, core: &mut IbCore, addr: u64, len: usize) -> Result<Token> {
        let (t, s) = self.start(Kind::Read, addr, len)?;
        self.post(core, t, s)
    }

    /// Starts an RDMA WRITE of `data` (at most `slot_len` bytes, copied into
    /// the request's frame) to remote `addr`.
    pub fn write_async(&mut self, core: &mut IbCore, addr: u64, data: &[u8]) -> Result<Token> {
        let (t, s) = self.start(Kind::Write, addr, data.len())?;
        self.frames.write_bytes(s * self.cfg.slot_len, data);
        self.post(core, t, s)
    }

    /// Starts an RDMA READ of `len` bytes (at most `slot_len`) at remote
    /// `addr` straight into the caller's DMA memory at bus address `local`
    /// (reached through the connection's DMA memory region, as the slot
    /// frames are), with no copy through a slot frame: a page cache reads
    /// a page into the frame it maps. The memory must stay allocated, and
    /// be left alone, until [`Client::poll`] reports the request.
    pub fn read_into_async(
        &mut self,
        core: &mut IbCore,
        addr: u64,
        local: BusAddr,
        len: usize,
    ) -> Result<Token> {
        let (t, s) = self.start(Kind::Read, addr, len)?;
        self.slots[s].local = Some(local.0);
        self.post(core, t, s)
    }

    /// Starts an RDMA WRITE of `len` bytes (at most `slot_len`) from the
    /// caller's DMA memory at bus address `local` to remote `addr`, with
    /// no copy (a page cache writing a dirty frame back); the memory must
    /// stay unchanged until [`Client::poll`] reports the request.
    pub fn write_from_async(
        &mut self,
        core: &mut IbCore,
        addr: u64,
        local: BusAddr,
        len: usize,
    ) -> Result<Token> {
        let (t, s) = self.start(Kind::Write, addr, len)?;
        self.slots[s].local = Some(local.0);
        self.post(core, t, s)
    }

    /// Copies the data a finished READ brought (valid until its slot is
    /// used again by the next request; not for `read_into_async`, whose
    /// data is already where it was asked to go).
    pub fn read_data(&self, token: Token, dst: &mut [u8]) -> Result<()> {
        let s = (token.0 & 0xffff) as usize;
        let Some(slot) = self.slots.get(s) else {
            return Err(Error::Protocol("no such request"));
        };
        if slot.busy
            || slot.local.is_some()
            || slot.generation != (token.0 >> 16) as u32
            || dst.len() > slot.len as usize
        {
            return Err(Error::BadLength);
        }
        self.frames.read_bytes(s * self.cfg.slot_len, dst);
        Ok(())
    }

    /// Polls the send CQ once: reports each finished request to `done`
    /// (allocates nothing) and returns how many finished. Requests older
    /// than `op_timeout` fail the connection (every request then completes
    /// with an error).
    pub fn poll(&mut self, core: &mut IbCore, mut done: impl FnMut(&Completion)) -> Result<usize> {
        let d = dev(core, self.dev)?;
        let n = d.poll_cq(self.scq, &mut self.wc)?;
        let now = core.clock().now_ns();
        for i in 0..n {
            let w = self.wc[i];
            if w.wr_id & RPC_WRID != 0 {
                continue;
            }
            let s = (w.wr_id & 0xffff) as usize;
            let Some(slot) = self.slots.get(s).copied() else {
                continue;
            };
            if !slot.busy || slot.generation != (w.wr_id >> 16) as u32 {
                continue;
            }
            self.slots[s].busy = false;
            self.free.push(s as u16);
            self.inflight -= 1;
            let lat = now.saturating_sub(slot.start_ns);
            let result = if w.status == WcStatus::Success {
                self.stats.record(lat);
                match slot.kind {
                    Kind::Read => {
                        self.stats.reads += 1;
                        self.stats.bytes_read += u64::from(slot.len);
                    }
                    Kind::Write => {
                        self.stats.writes += 1;
                        self.stats.bytes_written += u64::from(slot.len);
                    }
                }
                Ok(())
            } else if let Some(first) = self.broken {
                self.stats.errors += 1;
                // A request flushed because the connection failed earlier
                // reports why it failed, not the flush.
                Err(match w.status {
                    WcStatus::WrFlushErr => first,
                    s => Error::from_wc(s, slot.addr, slot.len),
                })
            } else {
                Err(self.fail(core, Error::from_wc(w.status, slot.addr, slot.len)))
            };
            done(&Completion {
                token: Token(w.wr_id),
                read: slot.kind == Kind::Read,
                addr: slot.addr,
                len: slot.len,
                latency_ns: lat,
                result,
            });
        }
        if n == 0 && self.inflight > 0 {
            let limit = u64::try_from(self.cfg.op_timeout.as_nanos()).unwrap_or(u64::MAX);
            let oldest = self
                .slots
                .iter()
                .filter(|s| s.busy)
                .map(|s| s.start_ns)
                .min()
                .unwrap_or(now);
            if now.saturating_sub(oldest) > limit {
                if self.broken.is_none() {
                    self.fail(core, Error::TimedOut("an RDMA completion"));
                }
                // The QP is in error: the flushes come; if the device is
                // gone they never will, so the slots are given back here.
                if now.saturating_sub(oldest) > limit.saturating_mul(2) {
                    for s in 0..self.slots.len() {
                        if self.slots[s].busy {
                            let slot = self.slots[s];
                            self.slots[s].busy = false;
                            self.free.push(s as u16);
                            self.inflight -= 1;
                            self.stats.errors += 1;
                            done(&Completion {
                                token: Token(((slot.generation as u64) << 16) | s as u64),
                                read: slot.kind == Kind::Read,
                                addr: slot.addr,
                                len: slot.len,
                                latency_ns: now.saturating_sub(slot.start_ns),
                                result: Err(Error::TimedOut("an RDMA completion")),
                            });
                        }
                    }
                }
            }
        }
        Ok(n)
    }

    /// Waits for every request in flight (within twice `op_timeout`),
    /// reporting each to `done`.
    pub fn drain(&mut self, core: &mut IbCore, mut done: impl FnMut(&Completion)) -> Result<()> {
        let deadline = Deadline::after(core.clock(), self.cfg.op_timeout * 3);
        while self.inflight > 0 {
            if deadline.expired(core.clock()) {
                return Err(Error::TimedOut("requests in flight"));
            }
            core.poll();
            if self.poll(core, &mut done)? == 0 {
                core.clock().relax();
            }
        }
        Ok(())
    }

    fn blocking(
        &mut self,
        core: &mut IbCore,
        kind: Kind,
        addr: u64,
        len: usize,
        mut buf: Option<&mut [u8]>,
        src: Option<&[u8]>,
    ) -> Result<()> {
        if self.inflight != 0 {
            return Err(Error::Busy);
        }
        let step = self.cfg.slot_len;
        let mut first_err = None;
        let mut posted = 0usize;
        let mut finished = 0usize;
        // Pieces go out in order; a completion's piece is found from its
        // remote address (minus `addr`).
        let pieces = len.div_ceil(step);
        while finished < pieces {
            while posted < pieces && self.inflight < self.cfg.window && first_err.is_none() {
                let off = posted * step;
                let n = step.min(len - off);
                let r = match (kind, src) {
                    (Kind::Write, Some(s)) => {
                        self.write_async(core, addr + off as u64, &s[off..off + n])
                    }
                    _ => self.read_async(core, addr + off as u64, n),
                };
                match r {
                    Ok(_) => posted += 1,
                    Err(e) => {
                        first_err = Some(e);
                        break;
                    }
                }
            }
            if first_err.is_some() && self.inflight == 0 {
                break;
            }
            core.poll();
            let mut comps = [None::<Completion>; 16];
            let mut k = 0;
            let n = self.poll(core, |c| {
                if k < comps.len() {
                    comps[k] = Some(*c);
                    k += 1;
                }
            })?;
            if n == 0 && k == 0 {
                core.clock().relax();
            }
            for c in comps.iter().take(k).flatten() {
                finished += 1;
                match c.result {
                    Ok(()) => {
                        if let Some(b) = buf.as_deref_mut() {
                            let off = (c.addr - addr) as usize;
                            let s = (c.token.0 & 0xffff) as usize;
                            self.frames.read_bytes(
                                s * self.cfg.slot_len,
                                &mut b[off..off + c.len as usize],
                            );
                        }
                    }
                    Err(e) => {
                        if first_err.is_none() {
                            first_err = Some(e);
                        }
                    }
                }
            }
            if first_err.is_some() && self.inflight == 0 {
                break;
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Reads `dst.len()` bytes at remote `addr` (any length; split into
    /// slot-sized requests, up to `window` in flight).
    pub fn read(&mut self, core: &mut IbCore, addr: u64, dst: &mut [u8]) -> Result<()> {
        let len = dst.len();
        if len == 0 {
            return Err(Error::BadLength);
        }
        self.blocking(core, Kind::Read, addr, len, Some(dst), None)
    }

    /// Writes `src` to remote `addr` (any length).
    pub fn write(&mut self, core: &mut IbCore, addr: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Err(Error::BadLength);
        }
        self.blocking(core, Kind::Write, addr, src.len(), None, Some(src))
    }

    /// Disconnects (DREQ, when connected by the CM) and frees the verbs
    /// objects; the memory node frees this connection's chunks.
    pub fn close(self, core: &mut IbCore) -> Result<()> {
        if let Some((cm, id)) = self.id {
            let _ = cm::send_dreq(core, cm, id, &[]);
            let _ = cm::wait_event(core, cm, id, Duration::from_millis(500));
        }
        if let Some((cma, id)) = self.rid {
            // rdma_disconnect, and the DREP waited for as above.
            if cma::disconnect(core, cma, id).is_ok() {
                let _ = cma::wait_cm_event(core, cma, id, Duration::from_millis(500));
            }
        }
        dev(core, self.dev)?;
        self.destroy(core);
        Ok(())
    }
}

/// One turn of everything an attempt by IP address waits on: ib_core, the
/// IP stack (ARP replies), the RDMA CM's turn at it.
fn pump(core: &mut IbCore, cma: ClientId, net: &mut dyn IpNet) {
    core.poll();
    net.poll(core);
    cma::net_poll(core, cma, net);
}

/// The next RDMA CM event of `id`, everything pumped meanwhile; past
/// `deadline`, the error of `late` with `-ETIMEDOUT`.
fn wait_ip(
    core: &mut IbCore,
    cma: ClientId,
    net: &mut dyn IpNet,
    id: RdmaCmId,
    deadline: Deadline,
    late: RdmaCmEventType,
    dst: SocketAddrV4,
) -> Result<RdmaCmEvent> {
    loop {
        if let Some(ev) = cma::get_cm_event(core, cma, id) {
            return Ok(ev);
        }
        if deadline.expired(core.clock()) {
            return Err(Error::ConnectIp {
                dst,
                event: Some(late),
                status: -ib_core::error::errno::ETIMEDOUT,
            });
        }
        pump(core, cma, net);
        core.clock().relax();
    }
}
