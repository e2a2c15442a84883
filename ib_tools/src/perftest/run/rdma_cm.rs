//! perftest's `-R` (`work_rdma_cm`) as perftest 4.5-0.17 does it, over ib_core's RDMA CM: the control connection and the test connection.
//!
//! What Linux's perftest does with `-R` (`perftest_communication.c`,
//! `create_comm_struct`, `rdma_client_connect`/`rdma_server_connect`,
//! `create_rdma_cm_connection`): the exchange of [`communication`] runs
//! over an RC connection of its own made by the RDMA CM (port space TCP,
//! perftest's port 18515, no private data), each message one SEND into a
//! single posted receive of `sizeof(struct pingpong_dest)` (56) bytes,
//! reposted as it is read; the QP addresses go as that binary struct
//! ([`encode_dest_bin`](super::super::communication::encode_dest_bin)),
//! and the closing has no "done". After `check_mtu` both sides make the
//! test QP, hand shake, connect it by a second RDMA CM connection to the
//! same port (the server listens again; the client retries 10 times,
//! 100 ms apart, as a REQ may come before that listen), and hand shake
//! again; from then on the run is the TCP one ([`socket`](super::socket))
//! without `ctx_connect`: the CM moved the QP to RTS. Our server keeps its
//! one listener for both connections. Left out: UD, multiple QPs, RoCE
//! (the RDMA CM's RoCE route is left out of ib_core too), `--tos` and
//! `--source_ip`.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::Cell;
use core::net::{Ipv4Addr, SocketAddrV4};
use core::time::Duration;

use hal::Deadline;
use ib_core::ClientId;
use ib_core::cm_msgs::rej_reason_str;
use ib_core::cma::{self, PortSpace, RdmaCmEvent, RdmaCmEventType, RdmaCmId, RdmaConnParam};
use ib_core::verbs::{
    AccessFlags, CqInitAttr, MrPages, QpCap, QpCreateFlags, QpInitAttr, QpType, RecvWr, SendFlags,
    SendWr, Sge, SigType, Wc, WcStatus, WrOpcode,
};

use super::super::communication::{DEST_BIN_SIZE, EXCHANGE_TIMEOUT};
use super::super::{Params, Verb};
use super::{CONNECT_TIMEOUT, Env, Made, Res, Undo, e};

/// How long address and route resolution may take (perftest's 2000 ms).
const RESOLVE_MS: u32 = 2000;
/// The client's tries of the test connection (`rdma_cm_client_connection`)
/// and the pause between them.
const TRIES: u32 = 10;
const TRY_PAUSE: Duration = Duration::from_millis(100);
/// Where in the control buffer the received and the sent message sit.
const RECV_OFF: u64 = 0;
const SEND_OFF: u64 = 256;
/// The work request id perftest gives every control message
/// (`SYNC_SPEC_ID`).
const SYNC_SPEC_ID: u64 = 5;

/// The control connection: its ID, QP and buffer, and the listener (a
/// server's, kept for the test connection); the test connection's ID once
/// made.
pub(in crate::perftest) struct Ctl {
    cma: ClientId,
    id: RdmaCmId,
    listen: Option<RdmaCmId>,
    /// The server's address (a client's control connection).
    peer: Option<Ipv4Addr>,
    made: Undo,
    /// The control QP, its send CQ and its receive CQ.
    qcq: (ib_core::verbs::Qp, ib_core::verbs::Cq, ib_core::verbs::Cq),
    lkey: u32,
    buf: hal::dma::DmaBuf,
    pub(super) test: Cell<Option<RdmaCmId>>,
}

/// One turn of the core, the IP stack and the RDMA CM's IP side; the
/// RDMA CM's client id, or why there is none (Ctrl-C among the reasons).
fn pump(env: &mut Env<'_>) -> Result<ClientId, String> {
    let cma = turn(env)?;
    if (env.interrupted)() {
        return Err(String::from("interrupted"));
    }
    Ok(cma)
}

/// [`pump`] without looking at Ctrl-C, for a caller that looks itself:
/// reading the console takes the Ctrl-C it finds, so a turn that dropped
/// the answer would lose it (the server's wait for a client did).
fn turn(env: &mut Env<'_>) -> Result<ClientId, String> {
    env.core.poll();
    let ip = env
        .ip
        .as_deref_mut()
        .ok_or("no IP stack here: -R needs IPoIB")?;
    ip.poll(env.core);
    let (cma, net) = ip
        .rdma_cm()
        .ok_or("no RDMA CM here: -R cannot be used (leave it out for perftest's TCP exchange)")?;
    cma::net_poll(env.core, cma, net);
    Ok(cma)
}

/// Waits for `id`'s next event, at most `timeout`.
fn wait_event(
    env: &mut Env<'_>,
    id: RdmaCmId,
    what: &str,
    timeout: Duration,
) -> Result<RdmaCmEvent, String> {
    let end = Deadline::after(env.core.clock(), timeout);
    loop {
        let cma = pump(env).map_err(|m| format!("{m} while waiting for {what}"))?;
        if let Some(ev) = cma::get_cm_event(env.core, cma, id) {
            return Ok(ev);
        }
        if end.expired(env.core.clock()) {
            return Err(format!(
                "waited {} s for {what}; none came",
                timeout.as_secs()
            ));
        }
        env.core.clock().delay(Duration::from_micros(200));
    }
}

/// An event that is not the one wanted, in words.
fn explain(ev: &RdmaCmEvent, peer: &str) -> String {
    match ev.event {
        RdmaCmEventType::Rejected => format!(
            "{peer} rejected the connection ({}{})",
            rej_reason_str(ev.status as u16),
            match ev.status {
                8 => ": nobody listens there with -R",
                _ => "",
            }
        ),
        RdmaCmEventType::Unreachable => {
            format!("{peer} never answered the connection request")
        }
        RdmaCmEventType::AddrError => format!("no ARP answer from {peer}"),
        other => format!("{} ({}) towards {peer}", other.msg(), ev.status),
    }
}

/// A new ID resolved to `ip`:`port` (address, then route).
fn resolve(env: &mut Env<'_>, ip: Ipv4Addr, port: u16) -> Result<RdmaCmId, String> {
    let cma = pump(env)?;
    let id = cma::create_id(env.core, cma, PortSpace::Tcp).map_err(|x| e("rdma_create_id", x))?;
    let peer = format!("{ip} port {port}");
    let r = (|| {
        {
            let net = env
                .ip
                .as_deref_mut()
                .and_then(|s| s.rdma_cm())
                .ok_or("no RDMA CM here")?
                .1;
            cma::resolve_addr(
                env.core,
                cma,
                net,
                id,
                None,
                SocketAddrV4::new(ip, port),
                RESOLVE_MS,
            )
            .map_err(|x| e("rdma_resolve_addr", x))?;
        }
        let ev = wait_event(env, id, "the address resolution", CONNECT_TIMEOUT)?;
        if ev.event != RdmaCmEventType::AddrResolved {
            return Err(explain(&ev, &peer));
        }
        cma::resolve_route(env.core, cma, id, RESOLVE_MS)
            .map_err(|x| e("rdma_resolve_route", x))?;
        let ev = wait_event(env, id, "the route resolution", CONNECT_TIMEOUT)?;
        if ev.event != RdmaCmEventType::RouteResolved {
            return Err(explain(&ev, &peer));
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok(id),
        Err(m) => {
            let _ = cma::destroy_id(env.core, cma, id);
            Err(m)
        }
    }
}

/// Waits for `id`'s connection to be established (after our REQ or REP).
fn established(env: &mut Env<'_>, id: RdmaCmId, peer: &str) -> Result<(), String> {
    loop {
        let ev = wait_event(env, id, "the connection", CONNECT_TIMEOUT)?;
        match ev.event {
            RdmaCmEventType::Established => return Ok(()),
            RdmaCmEventType::ConnectResponse => {}
            _ => return Err(explain(&ev, peer)),
        }
    }
}

impl Ctl {
    /// The control QP (one SEND and one receive at a time, as perftest's
    /// `tx_depth`/`rx_depth` of 1) on `id`, its receive posted.
    fn make(env: &mut Env<'_>, cma: ClientId, id: RdmaCmId) -> Result<Ctl, String> {
        let mut made = Undo::default();
        let r = Self::build(env, cma, id, &mut made);
        match r {
            Ok((qcq, lkey, buf)) => {
                let c = Ctl {
                    cma,
                    id,
                    listen: None,
                    peer: None,
                    made,
                    qcq,
                    lkey,
                    buf,
                    test: Cell::new(None),
                };
                if let Err(m) = c.post_recv(env) {
                    // The control QP and the rest go with the error.
                    if let Some(d) = env.core.device_mut(env.dev) {
                        c.made.undo(d);
                    }
                    return Err(m);
                }
                Ok(c)
            }
            Err(m) => {
                if let Some(d) = env.core.device_mut(env.dev) {
                    made.undo(d);
                }
                Err(m)
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn build(
        env: &mut Env<'_>,
        cma: ClientId,
        id: RdmaCmId,
        made: &mut Undo,
    ) -> Result<
        (
            (ib_core::verbs::Qp, ib_core::verbs::Cq, ib_core::verbs::Cq),
            u32,
            hal::dma::DmaBuf,
        ),
        String,
    > {
        let dev = env.core.device_mut(env.dev).ok_or("the device is gone")?;
        let pd = dev.alloc_pd().map_err(|x| e("alloc_pd", x))?;
        let pd = made.keep(pd, Made::Pd);
        let attr = CqInitAttr {
            cqe: 4,
            comp_vector: 0,
        };
        let (scq, _) = dev.create_cq(&attr).map_err(|x| e("create_cq", x))?;
        let scq = made.keep(scq, Made::Cq);
        let (rcq, _) = dev.create_cq(&attr).map_err(|x| e("create_cq", x))?;
        let rcq = made.keep(rcq, Made::Cq);
        let buf = dev
            .provider()
            .dma_pool()
            .alloc_pages(1)
            .map_err(|x| e("allocating the control buffer", x))?;
        let base = buf.bus_addr().0;
        let mr = dev
            .reg_mr(
                pd,
                &MrPages {
                    pages: &[base],
                    page_shift: 12,
                    iova: base,
                    length: 4096,
                    access: AccessFlags::LOCAL_WRITE,
                },
            )
            .map_err(|x| e("reg_mr", x))?;
        made.keep(mr, Made::Mr);
        let qattr = QpInitAttr {
            send_cq: scq,
            recv_cq: rcq,
            srq: None,
            cap: QpCap {
                max_send_wr: 2,
                max_recv_wr: 2,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_type: SigType::ReqWr,
            qp_type: QpType::Rc,
            create_flags: QpCreateFlags::empty(),
            port_num: 1,
        };
        let qp =
            cma::create_qp(env.core, cma, id, pd, &qattr).map_err(|x| e("rdma_create_qp", x))?;
        made.keep(qp, Made::Qp);
        Ok(((qp, scq, rcq), mr.lkey, buf))
    }

    fn post_recv(&self, env: &mut Env<'_>) -> Result<(), String> {
        let sge = [Sge {
            addr: self.buf.bus_addr().0 + RECV_OFF,
            length: DEST_BIN_SIZE as u32,
            lkey: self.lkey,
        }];
        env.core
            .device_mut(env.dev)
            .ok_or("the device is gone")?
            .post_recv(
                self.qcq.0,
                &[RecvWr {
                    wr_id: SYNC_SPEC_ID,
                    sg_list: &sge,
                }],
            )
            .map_err(|x| e("posting the control receive", x))
    }

    /// The client's control connection to `ip` (`rdma_client_connect`).
    pub(super) fn connect(env: &mut Env<'_>, ip: Ipv4Addr, port: u16) -> Result<Ctl, String> {
        let id = resolve(env, ip, port)?;
        let cma = pump(env)?;
        let mut c = match Ctl::make(env, cma, id) {
            Ok(c) => c,
            Err(m) => {
                let _ = cma::destroy_id(env.core, cma, id);
                return Err(m);
            }
        };
        c.peer = Some(ip);
        let param = RdmaConnParam {
            retry_count: 7,
            rnr_retry_count: 7,
            ..RdmaConnParam::default()
        };
        let peer = format!("{ip} port {port}");
        let r = cma::connect(env.core, cma, id, &param)
            .map_err(|x| e("rdma_connect", x))
            .and_then(|()| established(env, id, &peer));
        match r {
            Ok(()) => Ok(c),
            Err(m) => {
                c.finish(env);
                Err(m)
            }
        }
    }

    /// The server's control connection from a connection request on
    /// `listen` (`rdma_server_connect`); the listener is kept for the test
    /// connection.
    pub(super) fn accept(
        env: &mut Env<'_>,
        listen: RdmaCmId,
        child: RdmaCmId,
    ) -> Result<Ctl, String> {
        let cma = pump(env)?;
        let mut c = match Ctl::make(env, cma, child) {
            Ok(c) => c,
            Err(m) => {
                let _ = cma::reject(env.core, cma, child, &[]);
                let _ = cma::destroy_id(env.core, cma, child);
                let _ = cma::destroy_id(env.core, cma, listen);
                return Err(m);
            }
        };
        c.listen = Some(listen);
        let r = cma::accept(env.core, cma, child, None)
            .map_err(|x| e("rdma_accept", x))
            .and_then(|()| established(env, child, "the client"));
        match r {
            Ok(()) => Ok(c),
            Err(m) => {
                c.finish(env);
                Err(m)
            }
        }
    }

    /// One control message in, if one came: `Ok(0)` when none yet; an
    /// error when it is not `buf.len()` bytes (the peer is at another
    /// step) or the connection failed.
    pub(super) fn recv(&self, env: &mut Env<'_>, buf: &mut [u8]) -> Result<usize, String> {
        let Some(w) = poll_one(env, self.qcq.2, "the control connection")? else {
            return Ok(0);
        };
        if w.byte_len as usize != buf.len() {
            return Err(format!(
                "the peer's control message has {} bytes where {} were due",
                w.byte_len,
                buf.len()
            ));
        }
        self.buf.read_bytes(RECV_OFF as usize, buf);
        self.post_recv(env)?;
        Ok(buf.len())
    }

    /// One control message out (`rdma_write_data`: a signaled SEND, waited
    /// for).
    pub(super) fn send(&self, env: &mut Env<'_>, buf: &[u8]) -> Result<usize, String> {
        if buf.len() > DEST_BIN_SIZE {
            return Err(String::from("a control message longer than perftest takes"));
        }
        self.buf.write_bytes(SEND_OFF as usize, buf);
        let sge = [Sge {
            addr: self.buf.bus_addr().0 + SEND_OFF,
            length: buf.len() as u32,
            lkey: self.lkey,
        }];
        let wr = SendWr {
            wr_id: SYNC_SPEC_ID,
            sg_list: &sge,
            opcode: WrOpcode::Send,
            send_flags: SendFlags::SIGNALED,
            ..SendWr::default()
        };
        env.core
            .device_mut(env.dev)
            .ok_or("the device is gone")?
            .post_send(self.qcq.0, core::slice::from_ref(&wr))
            .map_err(|x| e("posting the control SEND", x.error))?;
        let end = Deadline::after(env.core.clock(), EXCHANGE_TIMEOUT);
        loop {
            if poll_one(env, self.qcq.1, "the control SEND")?.is_some() {
                return Ok(buf.len());
            }
            if end.expired(env.core.clock()) {
                return Err(format!(
                    "the control SEND was not acknowledged in {} s",
                    EXCHANGE_TIMEOUT.as_secs()
                ));
            }
            pump(env)?;
        }
    }

    /// The test connection for `res`'s QP (`create_rdma_cm_connection`
    /// between its two hand shakes): the client connects to `ip`, the
    /// server accepts the next request on its listener.
    pub(super) fn connect_test(
        &self,
        env: &mut Env<'_>,
        p: &Params,
        res: &Res,
    ) -> Result<(), String> {
        let peer = self.peer;
        let rd = if matches!(p.tool.verb, Verb::Read | Verb::Atomic) {
            p.out_reads.clamp(1, 16) as u8
        } else {
            0
        };
        let param = RdmaConnParam {
            responder_resources: rd,
            initiator_depth: rd,
            retry_count: 7,
            rnr_retry_count: 7,
            ..RdmaConnParam::default()
        };
        let cma = self.cma;
        match (peer, self.listen) {
            (Some(ip), _) => {
                let whom = format!("{ip} port {}", p.port);
                let mut last = String::new();
                for _ in 0..TRIES {
                    let id = resolve(env, ip, p.port)?;
                    let r = cma::set_qp(env.core, cma, id, res.qp)
                        .and_then(|()| cma::connect(env.core, cma, id, &param))
                        .map_err(|x| e("rdma_connect", x))
                        .and_then(|()| established(env, id, &whom));
                    match r {
                        Ok(()) => {
                            self.test.set(Some(id));
                            return Ok(());
                        }
                        Err(m) => {
                            let _ = cma::destroy_id(env.core, cma, id);
                            last = m;
                        }
                    }
                    let end = Deadline::after(env.core.clock(), TRY_PAUSE);
                    while !end.expired(env.core.clock()) {
                        pump(env)?;
                    }
                }
                Err(format!(
                    "the test connection failed {TRIES} times; the last: {last}"
                ))
            }
            (None, Some(l)) => {
                let ev = wait_event(env, l, "the client's test connection", CONNECT_TIMEOUT)?;
                if ev.event != RdmaCmEventType::ConnectRequest {
                    return Err(format!("unexpected {} on the listener", ev.event.name()));
                }
                let id = ev.id;
                self.test.set(Some(id));
                cma::set_qp(env.core, cma, id, res.qp)
                    .and_then(|()| cma::accept(env.core, cma, id, Some(&param)))
                    .map_err(|x| e("rdma_accept", x))?;
                established(env, id, "the client")
            }
            (None, None) => Err(String::from("no listener for the test connection")),
        }
    }

    /// Ends both connections (DREQs) and frees the control QP.
    pub(super) fn finish(self, env: &mut Env<'_>) {
        let cma = self.cma;
        let mut ids: Vec<RdmaCmId> = Vec::new();
        ids.extend(self.test.get());
        ids.push(self.id);
        for &id in &ids {
            let _ = cma::disconnect(env.core, cma, id);
        }
        // A moment for the DREPs (the peer waits for its own).
        let end = Deadline::after(env.core.clock(), Duration::from_millis(300));
        while !end.expired(env.core.clock()) {
            if pump(env).is_err() {
                break;
            }
        }
        for id in ids.into_iter().chain(self.listen) {
            let _ = cma::destroy_id(env.core, cma, id);
        }
        if let Some(d) = env.core.device_mut(env.dev) {
            self.made.undo(d);
        }
        drop(self.buf);
    }
}

/// One completion from the control CQ `cq`, if one came; an error naming
/// `what` when it did not succeed.
fn poll_one(env: &mut Env<'_>, cq: ib_core::verbs::Cq, what: &str) -> Result<Option<Wc>, String> {
    let mut wc = [Wc::default(); 1];
    let n = env
        .core
        .device_mut(env.dev)
        .ok_or("the device is gone")?
        .poll_cq(cq, &mut wc)
        .map_err(|x| e("poll_cq", x))?;
    if n == 0 {
        return Ok(None);
    }
    let w = wc[0];
    if w.status != WcStatus::Success {
        return Err(format!(
            "{what} failed ({}: {})",
            w.status.name(),
            w.status.msg()
        ));
    }
    Ok(Some(w))
}

/// Reports the listener's connection request: the new ID if one came.
pub(super) fn poll_listener(env: &mut Env<'_>, l: RdmaCmId) -> Option<RdmaCmId> {
    let cma = turn(env).ok()?;
    match cma::get_cm_event(env.core, cma, l) {
        Some(ev) if ev.event == RdmaCmEventType::ConnectRequest => Some(ev.id),
        _ => None,
    }
}

/// A listener on perftest's port in the TCP port space (`-R` clients).
pub(super) fn listen(env: &mut Env<'_>, port: u16) -> Option<RdmaCmId> {
    let cma = turn(env).ok()?;
    let id = cma::create_id(env.core, cma, PortSpace::Tcp).ok()?;
    let ok = cma::bind_addr(
        env.core,
        cma,
        id,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port),
    )
    .and_then(|()| cma::listen(env.core, cma, id, 1));
    if ok.is_err() {
        let _ = cma::destroy_id(env.core, cma, id);
        return None;
    }
    Some(id)
}

/// Drops a listener nobody used.
pub(super) fn unlisten(env: &mut Env<'_>, l: RdmaCmId) {
    if let Ok(cma) = turn(env) {
        let _ = cma::destroy_id(env.core, cma, l);
    }
}
