//! The memory node's side of rmem.
//!
//! The memory node's side: one exported region (DMA memory registered
//! through MTTs with an rkey scoped to it, remote read and write only), an IB
//! CM listener (and, with [`Server::listen_ip`], an RDMA CM one for compute
//! nodes that come by IP address), and a poll loop answering hello/alloc/free RPCs (LegoOS FIT's
//! RPC server in spirit); leaves out several regions, memory windows and
//! per-chunk keys.
//!
//! Data accesses never reach this code: the compute nodes' RDMA READ/WRITE
//! are served by the card, which refuses any address outside the region's
//! MPT bounds with a remote access error.

use alloc::vec::Vec;
use core::net::SocketAddrV4;
use core::time::Duration;

use hal::DmaBuf;
use ib_core::cm::{self, CmEvent, CmId, CmRepParam};
use ib_core::cm_msgs::rej_reason;
use ib_core::cma::{self, PortSpace, RdmaCmEventType, RdmaCmId};
use ib_core::verbs::{
    AccessFlags, Cq, CqInitAttr, Mr, MrPages, Mtu, Pd, Qp, QpCap, QpCreateFlags, QpInitAttr,
    QpType, SigType, Wc, WcFlags, WcOpcode, WcStatus,
};
use ib_core::{ClientId, DeviceId, IbCore};

use crate::chunks::Chunks;
use crate::conn::{Peer, RcParams, rc_connect};
use crate::proto::{self, MSG_LEN, Msg, Op, Status};
use crate::{Error, Result, dev, post_msg_recv, post_msg_send};

const RX_DEPTH: usize = 8;
/// Marks the send of a successful HELLO reply in its work request ID.
const HELLO_REPLY: u64 = 1 << 62;

/// What the memory node exports and how many it serves.
#[derive(Debug, Clone, Copy)]
pub struct ServerConfig {
    /// Port to listen on.
    pub port: u8,
    /// The CM service ID.
    pub service_id: u64,
    /// Compute nodes connected at once.
    pub max_clients: usize,
    /// Chunks allocated at once.
    pub max_chunks: usize,
    /// The remote address of the region's first byte (its I/O virtual
    /// address in the MPT).
    pub iova: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            port: 1,
            service_id: crate::SERVICE_ID,
            max_clients: 8,
            max_chunks: 4096,
            iova: 1 << 40,
        }
    }
}

/// What the memory node counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted.
    pub connects: u64,
    /// Connections refused (table full).
    pub refused: u64,
    /// Connections closed.
    pub disconnects: u64,
    /// HELLO replies delivered (a compute node that got its region; a
    /// connect attempt its node gave up before, or a reply that never
    /// arrived, is not one).
    pub hellos: u64,
    /// RPCs answered successfully.
    pub rpcs: u64,
    /// RPCs answered with an error status (malformed, no space...).
    pub rpc_errors: u64,
    /// Completion errors seen on connections.
    pub errors: u64,
}

/// How a connection was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnId {
    /// Without a CM ([`Server::accept_peer`]).
    None,
    /// By the IB CM (LID or GID).
    Ib(CmId),
    /// By the RDMA CM (IP address).
    Ip(RdmaCmId),
}

#[derive(Debug)]
struct Conn {
    id: ConnId,
    qp: Qp,
    owner: u32,
    dead: bool,
    /// The CM said Established (or there is no CM): the QP is in RTS.
    established: bool,
}

/// An exported region and its listener.
pub struct Server {
    dev: DeviceId,
    cm: ClientId,
    listen: CmId,
    /// The RDMA CM and its listener ([`Server::listen_ip`]).
    ip_listen: Option<(ClientId, RdmaCmId)>,
    pd: Pd,
    cq: Cq,
    mr: Mr,
    lmr: Mr,
    cfg: ServerConfig,
    region: DmaBuf,
    size: u64,
    chunks: Chunks,
    conns: Vec<Option<Conn>>,
    bufs: DmaBuf,
    next_owner: u32,
    stats: ServerStats,
    wc: [Wc; 16],
}

impl core::fmt::Debug for Server {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Server")
            .field("iova", &self.cfg.iova)
            .field("size", &self.size)
            .field("rkey", &self.mr.rkey)
            .field("stats", &self.stats)
            .finish()
    }
}

// Per connection: RX_DEPTH receive buffers and one send buffer.
const PER_CONN: usize = (RX_DEPTH + 1) * MSG_LEN;

impl Server {
    /// Exports `size` bytes (rounded up to pages) of zeroed DMA memory and
    /// listens for compute nodes.
    pub fn export(
        core: &mut IbCore,
        cm: ClientId,
        dev_id: DeviceId,
        size: u64,
        cfg: ServerConfig,
    ) -> Result<Server> {
        let pages = size.div_ceil(crate::PAGE_SIZE as u64);
        if pages == 0 || cfg.max_clients == 0 || cfg.max_clients > 1 << 16 {
            return Err(Error::BadLength);
        }
        let size = pages * crate::PAGE_SIZE as u64;
        let pool = dev(core, dev_id)?.provider().dma_pool();
        // Zeroing hundreds of MiB takes seconds under QEMU: ib_core's
        // progress function runs every few MiB meanwhile, as in every
        // blocking helper, so the port keeps answering the SM's SMPs (an SM
        // that gets no answer drops the port) and MAD timeouts run.
        let region = pool
            .alloc_pages_with_progress(
                usize::try_from(pages).map_err(|_| Error::BadLength)?,
                &mut || {
                    core.poll();
                },
            )
            .map_err(|_| Error::Verbs(ib_core::Error::NoMem))?;
        let d = dev(core, dev_id)?;
        let bufs = pool
            .alloc(cfg.max_clients * PER_CONN, 64)
            .map_err(|_| Error::Verbs(ib_core::Error::NoMem))?;
        let pd = d.alloc_pd()?;
        let base = region.bus_addr().0;
        let list: Vec<u64> = (0..pages)
            .map(|i| base + i * crate::PAGE_SIZE as u64)
            .collect();
        // The region's own key: MTT-translated, bounded to [iova, iova+size),
        // remote read/write (never an all-memory key).
        let mr = match d.reg_mr(
            pd,
            &MrPages {
                pages: &list,
                page_shift: 12,
                iova: cfg.iova,
                length: size,
                access: AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_WRITE,
            },
        ) {
            Ok(mr) => mr,
            Err(e) => {
                let _ = d.dealloc_pd(pd);
                return Err(e.into());
            }
        };
        // Everything made so far is undone if a later step fails.
        let undo = |core: &mut IbCore, lmr: Option<Mr>, cq: Option<Cq>| {
            if let Some(d) = core.device_mut(dev_id) {
                if let Some(cq) = cq {
                    let _ = d.destroy_cq(cq);
                }
                if let Some(lmr) = lmr {
                    let _ = d.dereg_mr(lmr);
                }
                let _ = d.dereg_mr(mr);
                let _ = d.dealloc_pd(pd);
            }
        };
        let lmr = match d.get_dma_mr(pd, AccessFlags::LOCAL_WRITE) {
            Ok(m) => m,
            Err(e) => {
                undo(core, None, None);
                return Err(e.into());
            }
        };
        let cq = match d.create_cq(&CqInitAttr {
            cqe: (cfg.max_clients * (RX_DEPTH + 1)) as u32,
            comp_vector: 0,
        }) {
            Ok((cq, _)) => cq,
            Err(e) => {
                undo(core, Some(lmr), None);
                return Err(e.into());
            }
        };
        let listen = match cm::listen(core, cm, dev_id, cfg.service_id) {
            Ok(l) => l,
            Err(e) => {
                undo(core, Some(lmr), Some(cq));
                return Err(e.into());
            }
        };
        log::info!(
            "rmem: exporting {} KiB at {:#x} rkey {:#x}",
            size / 1024,
            cfg.iova,
            mr.rkey
        );
        Ok(Server {
            dev: dev_id,
            cm,
            listen,
            ip_listen: None,
            pd,
            cq,
            mr,
            lmr,
            cfg,
            region,
            size,
            chunks: Chunks::new(size, cfg.max_chunks),
            conns: (0..cfg.max_clients).map(|_| None).collect(),
            bufs,
            next_owner: 1,
            stats: ServerStats::default(),
            wc: [Wc::default(); 16],
        })
    }

    /// The region's remote address, length and rkey.
    pub fn region(&self) -> crate::client::Region {
        crate::client::Region {
            base: self.cfg.iova,
            len: self.size,
            rkey: self.mr.rkey,
        }
    }

    /// The exported memory itself (the memory node's own view).
    pub fn memory(&self) -> &DmaBuf {
        &self.region
    }

    /// What the memory node counted.
    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    /// Connected compute nodes.
    pub fn clients(&self) -> usize {
        self.conns.iter().flatten().filter(|c| !c.dead).count()
    }

    /// Bytes allocated to compute nodes.
    pub fn used_bytes(&self) -> u64 {
        self.chunks.used_bytes()
    }

    fn post_recv(&self, core: &mut IbCore, c: usize, i: usize) -> Result<()> {
        let Some(Some(conn)) = self.conns.get(c) else {
            return Ok(());
        };
        post_msg_recv(
            dev(core, self.dev)?,
            conn.qp,
            ((c as u64) << 8) | i as u64,
            self.bufs.bus_addr().0 + (c * PER_CONN + (i + 1) * MSG_LEN) as u64,
            self.lmr.lkey,
        )
    }

    fn accept(&mut self, core: &mut IbCore, id: CmId) -> Result<()> {
        let Some(c) = self.conns.iter().position(Option::is_none) else {
            self.stats.refused += 1;
            let _ = cm::send_rej(core, self.cm, id, rej_reason::NO_RESOURCES, &[], &[]);
            return Ok(());
        };
        let init = self.qp_init();
        let d = dev(core, self.dev)?;
        let (qp, _) = d.create_qp(self.pd, &init)?;
        if let Err(e) = cm::send_rep(core, self.cm, id, &CmRepParam::new(qp)) {
            let _ = dev(core, self.dev)?.destroy_qp(qp);
            return Err(e.into());
        }
        let owner = self.next_owner;
        self.next_owner = self.next_owner.wrapping_add(1).max(1);
        self.conns[c] = Some(Conn {
            id: ConnId::Ib(id),
            qp,
            owner,
            dead: false,
            established: false,
        });
        // The QP is in RTR once the REP went out: receives may be posted.
        for i in 0..RX_DEPTH {
            self.post_recv(core, c, i)?;
        }
        self.stats.connects += 1;
        Ok(())
    }

    /// Listens on the RDMA CM as well: compute nodes that come by IPv4
    /// address (`Client::connect_ip`) to `addr` (an address of ours, or
    /// `0.0.0.0` for any; the port [`crate::IP_PORT`] or another) in the TCP
    /// port space, service ID `0x0000000001060000 | port`. The RDMA CM
    /// checks a REQ's destination against the IP side's view of our
    /// addresses, which whoever runs the IP stack keeps fresh
    /// ([`cma::net_poll`]).
    pub fn listen_ip(
        &mut self,
        core: &mut IbCore,
        cma: ClientId,
        addr: SocketAddrV4,
    ) -> Result<()> {
        if self.ip_listen.is_some() {
            return Err(Error::Verbs(ib_core::Error::Invalid(
                "already listening by IP address",
            )));
        }
        let id = cma::create_id(core, cma, PortSpace::Tcp)?;
        let backlog = self.cfg.max_clients as u32;
        let r =
            cma::bind_addr(core, cma, id, addr).and_then(|()| cma::listen(core, cma, id, backlog));
        if let Err(e) = r {
            let _ = cma::destroy_id(core, cma, id);
            return Err(e.into());
        }
        log::info!("rmem: listening on {addr} (RDMA CM, TCP port space)");
        self.ip_listen = Some((cma, id));
        Ok(())
    }

    /// The address and port the RDMA CM listener is bound to, if any.
    pub fn ip_addr(&self, core: &mut IbCore) -> Option<SocketAddrV4> {
        let (cma, id) = self.ip_listen?;
        cma::query(core, cma, id).ok().map(|i| i.src)
    }

    /// A CONNECT_REQUEST on the RDMA CM listener: a QP through the RDMA CM
    /// on the request's port, its receives posted, `rdma_accept` (the REP
    /// takes the resources the REQ offered).
    fn accept_ip(&mut self, core: &mut IbCore, cma: ClientId, id: RdmaCmId) -> Result<()> {
        let Some(c) = self.conns.iter().position(Option::is_none) else {
            self.stats.refused += 1;
            let _ = cma::reject(core, cma, id, &[]);
            let _ = cma::destroy_id(core, cma, id);
            return Ok(());
        };
        let on = cma::query(core, cma, id)?.port;
        if on.is_none_or(|(d, _)| d != self.dev) {
            // A request that came in on another device: not ours to serve.
            self.stats.refused += 1;
            let _ = cma::reject(core, cma, id, &[]);
            let _ = cma::destroy_id(core, cma, id);
            return Ok(());
        }
        let qp = cma::create_qp(core, cma, id, self.pd, &self.qp_init())?;
        let owner = self.next_owner;
        self.next_owner = self.next_owner.wrapping_add(1).max(1);
        self.conns[c] = Some(Conn {
            id: ConnId::Ip(id),
            qp,
            owner,
            dead: false,
            established: false,
        });
        // The QP is in INIT: receives may be posted before the REP.
        let r = (0..RX_DEPTH)
            .try_for_each(|i| self.post_recv(core, c, i))
            .and_then(|()| cma::accept(core, cma, id, None).map_err(Error::from));
        if let Err(e) = r {
            self.conns[c] = None;
            let _ = cma::destroy_id(core, cma, id);
            let _ = dev(core, self.dev)?.destroy_qp(qp);
            return Err(e);
        }
        self.stats.connects += 1;
        Ok(())
    }

    /// Accepts a compute node without the CM: a QP driven to RTS towards
    /// `peer` here; returns what the compute node needs
    /// ([`crate::Client::connect_peer`]): our LID, QPN and first PSN.
    pub fn accept_peer(&mut self, core: &mut IbCore, peer: Peer) -> Result<Peer> {
        let Some(c) = self.conns.iter().position(Option::is_none) else {
            self.stats.refused += 1;
            return Err(Error::Verbs(ib_core::Error::NoMem));
        };
        let d = dev(core, self.dev)?;
        let lid = d.query_port(self.cfg.port)?.lid;
        let (qp, _) = d.create_qp(self.pd, &self.qp_init())?;
        let psn = qp.qp_num.wrapping_mul(0x7f4a) & 0xff_ffff;
        let p = RcParams {
            port: self.cfg.port,
            sq_psn: psn,
            access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            mtu: Mtu::Mtu1024,
        };
        if let Err(e) = rc_connect(d, qp, &p, peer) {
            let _ = d.destroy_qp(qp);
            return Err(e);
        }
        let owner = self.next_owner;
        self.next_owner = self.next_owner.wrapping_add(1).max(1);
        self.conns[c] = Some(Conn {
            id: ConnId::None,
            qp,
            owner,
            dead: false,
            established: true,
        });
        for i in 0..RX_DEPTH {
            self.post_recv(core, c, i)?;
        }
        self.stats.connects += 1;
        Ok(Peer {
            lid,
            qpn: qp.qp_num,
            psn,
        })
    }

    /// Drops the connection whose QP is `qpn` (its chunks are freed), as
    /// a disconnect does; for connections made without the CM.
    pub fn disconnect_qpn(&mut self, core: &mut IbCore, qpn: u32) -> bool {
        match self
            .conns
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.qp.qp_num == qpn))
        {
            Some(c) => {
                self.drop_conn(core, c);
                true
            }
            None => false,
        }
    }

    fn qp_init(&self) -> QpInitAttr {
        QpInitAttr {
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 2,
                max_recv_wr: RX_DEPTH as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_type: SigType::ReqWr,
            qp_type: QpType::Rc,
            create_flags: QpCreateFlags::empty(),
            port_num: self.cfg.port,
        }
    }

    fn drop_conn(&mut self, core: &mut IbCore, c: usize) {
        if let Some(conn) = self.conns.get_mut(c).and_then(Option::take) {
            let freed = self.chunks.free_owner(conn.owner);
            log::info!("rmem: client {} gone, {freed} chunks freed", conn.owner);
            match conn.id {
                ConnId::Ib(id) => {
                    let _ = cm::destroy_id(core, self.cm, id);
                }
                ConnId::Ip(id) => {
                    if let Some((cma, _)) = self.ip_listen {
                        let _ = cma::destroy_id(core, cma, id);
                    }
                }
                ConnId::None => {}
            }
            if let Some(d) = core.device_mut(self.dev) {
                let _ = d.destroy_qp(conn.qp);
            }
            self.stats.disconnects += 1;
        }
    }

    fn answer(&mut self, owner: u32, req: &Msg) -> Msg {
        let mut r = Msg {
            reply: true,
            rkey: self.mr.rkey,
            addr: 0,
            len: 0,
            ..*req
        };
        match req.op {
            Op::Hello => {
                // Counted when the reply has been delivered (its send
                // completed): a compute node that never got it retries.
                r.addr = self.cfg.iova;
                r.len = self.size;
            }
            Op::Alloc => match self.chunks.alloc(req.len, owner) {
                Ok((off, len)) => {
                    r.addr = self.cfg.iova + off;
                    r.len = len;
                }
                Err(s) => r.status = s,
            },
            Op::Free => {
                let off = req.addr.wrapping_sub(self.cfg.iova);
                match self.chunks.free(off, owner) {
                    Ok(len) => {
                        r.addr = req.addr;
                        r.len = len;
                    }
                    Err(s) => r.status = s,
                }
            }
        }
        if r.status != Status::Ok {
            r.rkey = 0;
        }
        r
    }

    fn reply(&mut self, core: &mut IbCore, c: usize, msg: &Msg) -> Result<()> {
        let Some(Some(conn)) = self.conns.get(c) else {
            return Ok(());
        };
        let qp = conn.qp;
        let mut b = [0u8; MSG_LEN];
        let imm = msg.encode(&mut b);
        self.bufs.write_bytes(c * PER_CONN, &b);
        if msg.status == Status::Ok {
            self.stats.rpcs += 1;
        } else {
            self.stats.rpc_errors += 1;
        }
        let hello = if msg.op == Op::Hello && msg.status == Status::Ok {
            HELLO_REPLY
        } else {
            0
        };
        post_msg_send(
            dev(core, self.dev)?,
            qp,
            (1 << 63) | hello | ((c as u64) << 8),
            self.bufs.bus_addr().0 + (c * PER_CONN) as u64,
            self.lmr.lkey,
            imm,
        )
    }

    /// One round of service: new connections, disconnections, RPCs. Call it
    /// from the idle loop (it does not poll the core itself); returns how
    /// many things happened.
    pub fn poll(&mut self, core: &mut IbCore) -> Result<usize> {
        let mut n = 0;
        while let Some(ev) = cm::get_event(core, self.cm, self.listen) {
            if let CmEvent::ReqReceived { id, .. } = ev {
                n += 1;
                if let Err(e) = self.accept(core, id) {
                    log::warn!("rmem: accepting a client failed: {e}");
                    let _ = cm::destroy_id(core, self.cm, id);
                }
            }
        }
        if let Some((cma, lid)) = self.ip_listen {
            while let Some(ev) = cma::get_cm_event(core, cma, lid) {
                n += 1;
                if ev.event == RdmaCmEventType::ConnectRequest
                    && let Err(e) = self.accept_ip(core, cma, ev.id)
                {
                    log::warn!("rmem: accepting a client by IP address failed: {e}");
                    let _ = cma::destroy_id(core, cma, ev.id);
                }
            }
        }
        for c in 0..self.conns.len() {
            let Some(conn) = &self.conns[c] else { continue };
            let id = conn.id;
            let mut gone = conn.dead;
            if let (ConnId::Ip(rid), Some((cma, _))) = (id, self.ip_listen) {
                while let Some(ev) = cma::get_cm_event(core, cma, rid) {
                    n += 1;
                    match ev.event {
                        RdmaCmEventType::Established => {
                            if let Some(Some(conn)) = self.conns.get_mut(c) {
                                conn.established = true;
                            }
                        }
                        RdmaCmEventType::Disconnected
                        | RdmaCmEventType::Rejected
                        | RdmaCmEventType::Unreachable
                        | RdmaCmEventType::ConnectError
                        | RdmaCmEventType::DeviceRemoval => gone = true,
                        _ => {}
                    }
                }
            }
            let ib_id = match id {
                ConnId::Ib(i) => Some(i),
                _ => None,
            };
            while let Some(ev) = ib_id.and_then(|id| cm::get_event(core, self.cm, id)) {
                n += 1;
                match ev {
                    CmEvent::Disconnected { .. } | CmEvent::Rejected { .. } | CmEvent::TimedOut => {
                        gone = true;
                    }
                    CmEvent::Established { .. } => {
                        if let Some(Some(conn)) = self.conns.get_mut(c) {
                            conn.established = true;
                        }
                    }
                    _ => {}
                }
            }
            if gone {
                self.drop_conn(core, c);
            }
        }
        let cnt = dev(core, self.dev)?.poll_cq(self.cq, &mut self.wc)?;
        for k in 0..cnt {
            let w = self.wc[k];
            n += 1;
            let c = ((w.wr_id >> 8) & 0xffff) as usize;
            let i = (w.wr_id & 0xff) as usize;
            if w.status != WcStatus::Success {
                self.stats.errors += 1;
                if let Some(Some(conn)) = self.conns.get_mut(c) {
                    conn.dead = true;
                }
                continue;
            }
            if w.wr_id & (1 << 63) != 0 && w.wr_id & HELLO_REPLY != 0 {
                self.stats.hellos += 1;
            }
            if w.opcode != WcOpcode::Recv || w.wr_id & (1 << 63) != 0 || i >= RX_DEPTH {
                continue;
            }
            let Some(Some(conn)) = self.conns.get_mut(c) else {
                continue;
            };
            let owner = conn.owner;
            // A request before the RTU (lost, or not processed yet): the
            // first packet establishes the connection, as Linux ULPs do on
            // IB_EVENT_COMM_EST with ib_cm_notify; the QP goes to RTS so
            // the reply can be sent.
            if !conn.established {
                conn.established = true;
                match conn.id {
                    ConnId::Ib(id) => {
                        let _ = cm::notify(core, self.cm, id);
                    }
                    ConnId::Ip(id) => {
                        if let Some((cma, _)) = self.ip_listen {
                            let _ = cma::notify(core, cma, id);
                        }
                    }
                    ConnId::None => {}
                }
            }
            let len = (w.byte_len as usize).min(MSG_LEN);
            let mut b = [0u8; MSG_LEN];
            self.bufs
                .read_bytes(c * PER_CONN + (i + 1) * MSG_LEN, &mut b[..len]);
            let imm = w.wc_flags.contains(WcFlags::WITH_IMM).then_some(w.imm_data);
            let bytes: &[u8] = if w.byte_len as usize > MSG_LEN {
                // Longer than a message cannot fit the buffer; the card
                // would have failed it, but say so rather than trust it.
                &[0u8; MSG_LEN + 1]
            } else {
                &b[..len]
            };
            let reply = match proto::decode(bytes, imm) {
                Ok(m) if !m.reply => self.answer(owner, &m),
                Ok(m) => proto::error_reply(&proto::DecodeError {
                    status: Status::Malformed,
                    seq: m.seq,
                    op_byte: m.op as u8,
                    what: "a reply sent as a request",
                }),
                Err(e) => {
                    log::warn!("rmem: client {owner}: {e}");
                    proto::error_reply(&e)
                }
            };
            // A connection that cannot take its receive or reply is dropped
            // at the next round; the others are still served.
            if let Err(e) = self
                .post_recv(core, c, i)
                .and_then(|()| self.reply(core, c, &reply))
            {
                log::warn!("rmem: client {owner}: cannot answer: {e}; dropping it");
                self.stats.errors += 1;
                if let Some(Some(conn)) = self.conns.get_mut(c) {
                    conn.dead = true;
                }
            }
        }
        Ok(n)
    }

    /// Serves for `time` (polling the core), for tests and the console.
    pub fn serve_for(&mut self, core: &mut IbCore, time: Duration) -> Result<()> {
        let deadline = hal::Deadline::after(core.clock(), time);
        while !deadline.expired(core.clock()) {
            core.poll();
            self.poll(core)?;
            core.clock().relax();
        }
        Ok(())
    }

    /// Stops listening, drops every connection and unregisters the region.
    pub fn close(mut self, core: &mut IbCore) -> Result<()> {
        for c in 0..self.conns.len() {
            self.drop_conn(core, c);
        }
        let _ = cm::destroy_id(core, self.cm, self.listen);
        if let Some((cma, id)) = self.ip_listen.take() {
            let _ = cma::destroy_id(core, cma, id);
        }
        let d = dev(core, self.dev)?;
        d.destroy_cq(self.cq)?;
        d.dereg_mr(self.mr)?;
        d.dereg_mr(self.lmr)?;
        d.dealloc_pd(self.pd)?;
        Ok(())
    }
}
