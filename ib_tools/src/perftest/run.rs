//! The perftest runs over ib_core's verbs and CM.
//!
//! The perftest runs over ib_core's verbs and CM (perftest's `run_iter_bw`,
//! `run_iter_lat_write`, `run_iter_lat_send`, `run_iter_lat` for read/atomic): one
//! RC QP connected through the IB CM with the path from the SA, busy-polled, every
//! wait against a deadline and interruptible; `-D` runs without perftest's warm-up
//! margins (and not with `--check`); perftest's events mode, post lists, multiple
//! QPs and bidirectional runs are left out. Exercised between two model HCAs behind
//! the model switch (`tests/tests/ib_tools_two_nodes.rs`) and between two QEMU
//! guests (`tests/tests/qemu_tools.rs`). A peer given by IPv4 address is Linux's
//! perftest, met over its TCP exchange (`socket`, `super::communication`).
//!
//! Roles: the server (no peer) listens on [`PERFTEST_SERVICE_ID`], takes
//! the client's parameters from the REQ ([`Hello`]) and answers with its
//! buffer ([`Reply`]); the client then drives the test; a final SEND from
//! the client tells the server each size is over (and, with `--check`,
//! that the server may verify what it received).
//!
//! `--check`: the sender fills every message with its own pattern
//! ([`fill`]) before posting it; receivers verify every SEND received,
//! RDMA READ results are verified as they complete, and RDMA WRITE targets
//! are verified slot by slot when the size ends (each slot holds the last
//! message written to it). The figures of a `--check` run include the
//! filling and verifying.

pub(crate) use super::path::{gid_text, path_from, path_to};
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::Cell;
use core::fmt::Write;
use core::time::Duration;

use hal::Deadline;
use ib_core::cm::{self, CmEvent, CmId, CmRepParam, CmReqParam};
use ib_core::sa_query::PathRecord;
use ib_core::verbs::{
    AccessFlags, Cq, CqInitAttr, Mr, MrPages, Pd, Qp, QpAttrMask, QpCap, QpCreateFlags, QpInitAttr,
    QpState, QpType, RecvWr, SendFlags, SendWr, Sge, SigType, Wc, WcFlags, WcStatus, WrDetail,
    WrOpcode,
};
use ib_core::{ClientId, DeviceId, IbCore};

use super::communication::Sockets;
use super::exchange::{Hello, PERFTEST_SERVICE_ID, Reply, fill, verify};

mod rdma_cm;
mod socket;
use super::{
    Dest, LinkInfo, Params, Peer, RESULT_LINE, TestKind, Verb, bw_report, lat_report,
    print_bw_line, print_lat_line, print_pingpong_data, print_result_header, print_test_info,
};

/// How long the server waits for a client, and the client for the SA and
/// the CM.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a tool waits for its port to become Active.
pub const PORT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long any one completion may take before the run gives up.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// The CM response timeouts the clients ask for (4.096 us * 2^18, about
/// 1.1 s a try) and the CM retries: with the capped packet life time a
/// message gets about 1.1 s before it is sent again, 9 tries in all, so a
/// peer that never answers is reported in about 10 s, and a guest stalled
/// for a second on a loaded host does not break the connection (rdma_cm's
/// defaults take over a minute).
pub const CM_RESPONSE_TIMEOUT: u8 = 18;
/// CM retries of the clients' REQ (and the servers' REP).
pub const CM_RETRIES: u8 = 8;
/// The packet life time the clients put in the path they hand the CM (see
/// `cm_req`): the QPs' ACK timeout follows from it (15 gives 17: 537 ms a
/// try, about 4.3 s for the 7 retries, inside the 10 s deadline, and
/// tolerant of an emulator that stalls for half a second on a loaded host).
pub const PACKET_LIFE_CAP: u8 = 15;
/// How often long waits look at the interrupt check.
const SLICE: Duration = Duration::from_millis(50);
/// The private data of a server's DREQ once it ran to the end (checks
/// included): how the client learns the run is over on both sides.
pub const DONE: &[u8] = b"LEGO done";
/// How long a client waits for that DREQ after its last message: the
/// server may still wait for the ACK of its own last message (sent again
/// after a loss: 7 tries of 537 ms) and check what it received.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a server that finished waits for the client's DREP (its DREQ
/// is sent again meanwhile if lost: the client waits for it).
const DREP_TIMEOUT: Duration = Duration::from_secs(5);
/// Buffer slots at most (bandwidth tests spread messages over them).
const MAX_SLOTS: u64 = 16;
/// Bytes of buffer at most.
const MAX_BUF: u64 = 16 << 20;

/// Where the run happens and how it talks to the console.
pub struct Env<'a> {
    /// The core.
    pub core: &'a mut IbCore,
    /// The SA client (`sa_query::init`).
    pub sa: ClientId,
    /// The CM client (`cm::init`).
    pub cm: ClientId,
    /// The device.
    pub dev: DeviceId,
    /// Its name (for the header).
    pub dev_name: &'a str,
    /// Ctrl-C: true once the user asked to stop.
    pub interrupted: &'a mut dyn FnMut() -> bool,
    /// The IP stack's TCP, for perftest's exchange with Linux (none: only
    /// LID/GUID peers).
    pub ip: Option<&'a mut dyn Sockets>,
}

struct Res {
    pd: Pd,
    /// Send completions.
    cq: Cq,
    /// Receive completions.
    rcq: Cq,
    qp: Qp,
    mr: Mr,
    buf: hal::dma::DmaBuf,
    slot: u64,
    slots: u64,
    /// When the waits last ran ib_core's progress function ([`progress`]).
    progress_at: Cell<u64>,
    /// The peer is Linux's perftest: RDMA to its address itself, no
    /// end-of-size SEND.
    linux: bool,
}

pub(crate) fn e(what: &str, err: impl core::fmt::Display) -> String {
    format!("{what}: {err}")
}

fn now(core: &IbCore) -> u64 {
    core.clock().now_ns()
}

fn slots_for(p: &Params) -> (u64, u64) {
    let size = p.max_size().max(8);
    let slot = size.next_multiple_of(64);
    let slots = if p.tool.kind == TestKind::Bw {
        (MAX_BUF / slot).clamp(1, MAX_SLOTS)
    } else {
        2
    };
    (slot, slots)
}

/// A verbs object a set-up made.
pub(crate) enum Made {
    Pd(Pd),
    Cq(Cq),
    Qp(Qp),
    Mr(Mr),
}

/// What a set-up made so far, in order: when a later step fails, what
/// the earlier ones made is destroyed, newest first (the QP before its
/// CQs, everything before the PD), so a tool that fails half-way leaves
/// the device as it found it, however often `retry` runs it.
#[derive(Default)]
pub(crate) struct Undo(Vec<Made>);

impl Undo {
    /// Remembers `x` (one of `what` made) and hands it back.
    pub(crate) fn keep<T: Copy>(&mut self, x: T, what: fn(T) -> Made) -> T {
        self.0.push(what(x));
        x
    }

    /// Destroys everything kept, newest first.
    pub(crate) fn undo(self, dev: &mut ib_core::Device) {
        for m in self.0.into_iter().rev() {
            let _ = match m {
                Made::Qp(q) => dev.destroy_qp(q),
                Made::Mr(m) => dev.dereg_mr(m),
                Made::Cq(c) => dev.destroy_cq(c),
                Made::Pd(p) => dev.dealloc_pd(p),
            };
        }
    }
}

fn setup(env: &mut Env<'_>, p: &Params, slot: u64, slots: u64) -> Result<Res, String> {
    let dev = env.core.device_mut(env.dev).ok_or("the device is gone")?;
    let mut made = Undo::default();
    let r = build(dev, p, slot, slots, &mut made);
    if r.is_err() {
        made.undo(dev);
    }
    r
}

/// [`setup`]'s steps, each object kept in `made` as it is made.
fn build(
    dev: &mut ib_core::Device,
    p: &Params,
    slot: u64,
    slots: u64,
    made: &mut Undo,
) -> Result<Res, String> {
    let pd = dev.alloc_pd().map_err(|x| e("alloc_pd", x))?;
    let pd = made.keep(pd, Made::Pd);
    let depth = p.tx_depth.max(p.rx_depth) * 2 + 4;
    let attr = CqInitAttr {
        cqe: depth,
        comp_vector: 0,
    };
    let (cq, _) = dev.create_cq(&attr).map_err(|x| e("create_cq", x))?;
    let cq = made.keep(cq, Made::Cq);
    let (rcq, _) = dev.create_cq(&attr).map_err(|x| e("create_cq", x))?;
    let rcq = made.keep(rcq, Made::Cq);
    let (qp, _) = dev
        .create_qp(
            pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: rcq,
                srq: None,
                cap: QpCap {
                    max_send_wr: p.tx_depth.max(2),
                    max_recv_wr: p.rx_depth.max(2),
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: p.inline_size,
                },
                sq_sig_type: SigType::ReqWr,
                qp_type: QpType::Rc,
                create_flags: QpCreateFlags::empty(),
                port_num: p.ib_port,
            },
        )
        .map_err(|x| e("create_qp", x))?;
    let qp = made.keep(qp, Made::Qp);
    let len = slot * slots;
    let pages = len.div_ceil(4096);
    // Freed when dropped (on any error below too).
    let buf = dev
        .provider()
        .dma_pool()
        .alloc_pages(pages as usize)
        .map_err(|x| e("allocating the buffer", x))?;
    let base = buf.bus_addr().0;
    let list: Vec<u64> = (0..pages).map(|i| base + i * 4096).collect();
    let mr = dev
        .reg_mr(
            pd,
            &MrPages {
                pages: &list,
                page_shift: 12,
                iova: base,
                length: len,
                access: AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
            },
        )
        .map_err(|x| e("reg_mr", x))?;
    made.keep(mr, Made::Mr);
    Ok(Res {
        pd,
        cq,
        rcq,
        qp,
        mr,
        buf,
        slot,
        slots,
        progress_at: Cell::new(0),
        linux: false,
    })
}

fn teardown(env: &mut Env<'_>, r: Res, id: Option<CmId>, done: bool) {
    if let Some(id) = id {
        disconnect(env, id, done);
    }
    if let Some(dev) = env.core.device_mut(env.dev) {
        let _ = dev.destroy_qp(r.qp);
        let _ = dev.dereg_mr(r.mr);
        let _ = dev.destroy_cq(r.cq);
        let _ = dev.destroy_cq(r.rcq);
        let _ = dev.dealloc_pd(r.pd);
    }
    drop(r.buf);
}

/// Ends a connection (perftest's closing handshake, through the CM): a
/// server that ran to the end (`done`) says so in its DREQ and waits for
/// the client's DREP before it destroys the connection (a lost DREQ is
/// sent again meanwhile); otherwise a plain DREQ (it fails, harmlessly, on
/// a connection the peer already ended).
pub(crate) fn disconnect(env: &mut Env<'_>, id: CmId, done: bool) {
    let data: &[u8] = if done { DONE } else { &[] };
    if cm::send_dreq(env.core, env.cm, id, data).is_ok() && done {
        let _ = wait_cm(env, id, "the client's DREP", DREP_TIMEOUT);
    }
    let _ = cm::destroy_id(env.core, env.cm, id);
}

/// The client's end of the closing handshake: waits for the server's DREQ
/// saying it finished. The client ends nothing before that: its DREQ
/// would take the server's QP to the error state while the server may
/// still wait for the ACK of its last message (lost on the wire, sent
/// again), which would end in a flush error there.
pub(crate) fn await_done(env: &mut Env<'_>, id: CmId) -> Result<(), String> {
    loop {
        match wait_cm(env, id, "the server to finish (its DREQ)", CLOSE_TIMEOUT)? {
            CmEvent::Disconnected {
                by_peer: true,
                private_data,
                ..
            } => {
                return if private_data.starts_with(DONE) {
                    Ok(())
                } else {
                    Err(String::from(
                        "the server ended the connection before finishing the run (see its console)",
                    ))
                };
            }
            CmEvent::MraReceived { .. } | CmEvent::Established { .. } => {}
            other => {
                return Err(format!(
                    "the connection ended while waiting for the server to finish ({other:?})"
                ));
            }
        }
    }
}

/// Runs one tool with `p` (server if `p.peer` is `None`), printing as
/// perftest does.
pub fn run(env: &mut Env<'_>, p: &Params, out: &mut dyn Write) -> Result<(), String> {
    let attr = env
        .core
        .device_mut(env.dev)
        .ok_or("the device is gone")?
        .query_port(p.ib_port)
        .map_err(|x| e("query_port", x))?;
    if p.duration.is_some() && p.check {
        return Err(String::from(
            "-D and --check do not go together here (the check needs the message count): use -n",
        ));
    }
    let eth = is_eth(env, p.ib_port);
    let attr = if (attr.lid == 0 && !eth) || attr.state != ib_core::verbs::PortState::Active {
        let _ = writeln!(
            out,
            " Waiting for port {} to become Active (up to {} s; Ctrl-C stops)",
            p.ib_port,
            PORT_TIMEOUT.as_secs()
        );
        wait_port_active(env, p.ib_port)?
    } else {
        attr
    };
    let link = LinkInfo {
        ib_dev: String::from(env.dev_name),
        mtu: 128u32 << attr.active_mtu.raw(),
        link_type: if eth { "Ethernet" } else { "IB" },
    };
    // Both sides size their buffers from the same (the client's)
    // parameters, so slot k is at the same offset on both.
    let (res, r) = match p.peer {
        None => server(env, p, &link, attr.lid, out),
        Some(Peer::Ip(ip)) => socket::client(env, p, &link, attr.lid, ip, out),
        Some(peer) => {
            let (slot, slots) = slots_for(p);
            let mut res = setup(env, p, slot, slots)?;
            let r = client(env, p, &mut res, &link, attr.lid, peer, out);
            (Some(res), r)
        }
    };
    let (outcome, id) = match r {
        Ok(id) => (Ok(()), id),
        Err((msg, id)) => (Err(msg), id),
    };
    // A server that ran to the end says so (the client waits for it).
    let done = p.peer.is_none() && outcome.is_ok();
    match res {
        Some(res) => teardown(env, res, id, done),
        None => {
            if let Some(id) = id {
                let _ = cm::destroy_id(env.core, env.cm, id);
            }
        }
    }
    outcome
}

/// Whether `port` is a RoCE port (Ethernet link layer: no LID, no SA).
fn is_eth(env: &Env<'_>, port: u8) -> bool {
    env.core
        .device(env.dev)
        .and_then(|d| d.port_link_layer(port).ok())
        == Some(ib_core::verbs::LinkLayer::Ethernet)
}

/// Polls the core until the port is Active with a LID (an SM configured
/// it; a RoCE port has none), at most [`PORT_TIMEOUT`], interruptible.
pub(crate) fn wait_port_active(
    env: &mut Env<'_>,
    port: u8,
) -> Result<ib_core::verbs::PortAttr, String> {
    let end = Deadline::after(env.core.clock(), PORT_TIMEOUT);
    loop {
        env.core.poll();
        let a = env
            .core
            .device_mut(env.dev)
            .ok_or("the device is gone")?
            .query_port(port)
            .map_err(|x| e("query_port", x))?;
        if (a.lid != 0 || is_eth(env, port)) && a.state == ib_core::verbs::PortState::Active {
            return Ok(a);
        }
        if (env.interrupted)() {
            return Err(format!(
                "interrupted while waiting for port {port} to become Active"
            ));
        }
        if end.expired(env.core.clock()) {
            return Err(format!(
                "port {port} is not Active after {} s (is a subnet manager running?)",
                PORT_TIMEOUT.as_secs()
            ));
        }
        env.core.clock().delay(Duration::from_millis(20));
    }
}

type Step<T> = Result<T, (String, Option<CmId>)>;

pub(crate) fn wait_cm(
    env: &mut Env<'_>,
    id: CmId,
    what: &str,
    timeout: Duration,
) -> Result<CmEvent, String> {
    let end = Deadline::after(env.core.clock(), timeout);
    loop {
        if (env.interrupted)() {
            return Err(format!("interrupted while waiting for {what}"));
        }
        if end.expired(env.core.clock()) {
            return Err(format!(
                "waited {} s for {what}; none came",
                timeout.as_secs()
            ));
        }
        match cm::wait_event(env.core, env.cm, id, SLICE) {
            Ok(ev) => return Ok(ev),
            Err(ib_core::Error::TimedOut) => continue,
            Err(x) => return Err(e(what, x)),
        }
    }
}

/// The clients' CM REQ on `path` (its packet life time capped at
/// [`PACKET_LIFE_CAP`]) with [`CM_RESPONSE_TIMEOUT`] and [`CM_RETRIES`].
pub(crate) fn cm_req(mut path: PathRecord, service_id: u64, qp: Qp) -> CmReqParam {
    // perftest sets the QP's ACK timeout (14) itself; through the CM the
    // timeout follows the path's packet life time, so cap that: the CM
    // then gives the QPs 17 (537 ms a try, about 4.3 s for the 7 retries)
    // instead of over 4 s per try with an SM's default of 18.
    path.packet_life_time = path.packet_life_time.min(PACKET_LIFE_CAP);
    let mut req = CmReqParam::new(path, service_id, qp);
    req.remote_cm_response_timeout = CM_RESPONSE_TIMEOUT;
    req.local_cm_response_timeout = CM_RESPONSE_TIMEOUT;
    req.max_cm_retries = CM_RETRIES;
    req
}

/// The servers' wait for the client's RTU after their REP.
pub(crate) fn wait_rtu(env: &mut Env<'_>, id: CmId) -> Result<(), String> {
    match wait_cm(env, id, "the client's RTU", CONNECT_TIMEOUT)? {
        CmEvent::Established { .. } => Ok(()),
        CmEvent::Rejected { reason, .. } => Err(format!(
            "the client rejected the connection (reason {reason})"
        )),
        CmEvent::TimedOut => Err(String::from(
            "the client's RTU never came (our REP was sent again until the CM gave up)",
        )),
        other => Err(format!(
            "the connection failed while waiting for the RTU ({other:?})"
        )),
    }
}

fn server(
    env: &mut Env<'_>,
    p: &Params,
    link: &LinkInfo,
    lid: u16,
    out: &mut dyn Write,
) -> (Option<Res>, Step<Option<CmId>>) {
    let mut res = None;
    let r = serve(env, p, link, lid, out, &mut res);
    (res, r)
}

fn serve(
    env: &mut Env<'_>,
    p: &Params,
    link: &LinkInfo,
    lid: u16,
    out: &mut dyn Write,
    slot_res: &mut Option<Res>,
) -> Step<Option<CmId>> {
    let listen = cm::listen(env.core, env.cm, env.dev, PERFTEST_SERVICE_ID)
        .map_err(|x| (e("listen", x), None))?;
    let _ = writeln!(out, "{RESULT_LINE}");
    let _ = writeln!(
        out,
        " Waiting for client to connect... (LID {lid}, up to {} s; Ctrl-C stops)",
        CONNECT_TIMEOUT.as_secs()
    );
    let got = socket::accept_either(env, p, listen);
    let _ = cm::destroy_id(env.core, env.cm, listen);
    let got = match got {
        Ok(socket::Incoming::Tcp(sock)) => {
            let r = socket::run(env, p, link, lid, socket::Way::Tcp(sock), out, slot_res);
            socket::close(env, sock);
            return r.map(|()| None).map_err(|m| (m, None));
        }
        Ok(socket::Incoming::RdmaCm(l, child)) => {
            let _ = writeln!(out, " A client came by rdma_cm (-R)");
            let ctl = rdma_cm::Ctl::accept(env, l, child).map_err(|m| (m, None))?;
            let r = socket::run(env, p, link, lid, socket::Way::Cm(&ctl), out, slot_res);
            ctl.finish(env);
            return r.map(|()| None).map_err(|m| (m, None));
        }
        Ok(socket::Incoming::Cm(ev)) => Ok(ev),
        Err(m) => Err(m),
    };
    let (id, private, remote_lid, remote_qpn) = match got {
        Ok(CmEvent::ReqReceived {
            id,
            private_data,
            remote_lid,
            remote_qpn,
            ..
        }) => (id, private_data, remote_lid, remote_qpn),
        Ok(_) => return Err((String::from("unexpected CM event on the listener"), None)),
        Err(m) => return Err((m, None)),
    };
    let hello = match Hello::decode(&private).and_then(|h| {
        h.accept(p.tool, 0)?;
        Ok(h)
    }) {
        Ok(h) => h,
        Err(x) => {
            let _ = cm::send_rej(env.core, env.cm, id, 28, &[], &[]);
            return Err((format!("refused the client: {x}"), Some(id)));
        }
    };
    // The server runs with the client's parameters.
    let mut q = p.clone();
    q.size = hello.size;
    q.iters = hello.iters;
    q.all_sizes = hello.all_sizes;
    q.check = hello.check;
    q.atomic_type = hello.atomic_type;
    q.duration = (hello.duration != 0).then_some(hello.duration);
    let (slot, slots) = slots_for(&q);
    let res = match setup(env, &q, slot, slots) {
        Ok(r) => slot_res.insert(r),
        Err(m) => {
            let _ = cm::send_rej(env.core, env.cm, id, 28, &[], &[]);
            return Err((m, Some(id)));
        }
    };
    let mut rep = CmRepParam::new(res.qp);
    rep.private_data = Reply {
        status: 0,
        vaddr: res.buf.bus_addr().0,
        rkey: res.mr.rkey,
        len: res.slot * res.slots,
    }
    .encode();
    let psn = rep.starting_psn;
    if q.tool.verb == Verb::Read {
        // What the client's reads fetch (and --check verifies): pattern k
        // in slot k, written before the REP: the client reads as soon as
        // it has the REP, before our RTU wait even starts.
        for k in 0..res.slots {
            fill_slot(res, k, res.slot, k);
        }
    }
    cm::send_rep(env.core, env.cm, id, &rep).map_err(|x| (e("CM REP", x), Some(id)))?;
    // Receives for the client's SENDs: the REP took the QP out of RESET;
    // the client sends nothing before our RTU arrives.
    let recvs = if (q.tool.verb, q.tool.kind) == (Verb::Send, TestKind::Bw) {
        u64::from(q.rx_depth).min(res.slots)
    } else {
        1
    };
    post_recvs(env, res, q.tool.kind, 0..recvs).map_err(|m| (m, Some(id)))?;
    wait_rtu(env, id).map_err(|m| (m, Some(id)))?;
    let _ = print_test_info(out, &q, link);
    let local = Dest {
        lid,
        qpn: res.qp.qp_num,
        psn,
        rkey: res.mr.rkey,
        vaddr: res.buf.bus_addr().0,
        out_reads: q.out_reads,
    };
    let remote = Dest {
        lid: remote_lid,
        qpn: remote_qpn,
        psn: peer_psn(env, id),
        rkey: hello.rkey,
        vaddr: hello.vaddr,
        out_reads: q.out_reads,
    };
    let _ = print_pingpong_data(out, false, q.tool.verb, &local);
    let _ = print_pingpong_data(out, true, q.tool.verb, &remote);
    let _ = writeln!(out, "{RESULT_LINE}");
    for size in q.sizes() {
        serve_size(env, &q, res, size, &hello).map_err(|m| (m, Some(id)))?;
    }
    let _ = remote_qpn;
    let _ = writeln!(out, "{RESULT_LINE}");
    Ok(Some(id))
}

fn client(
    env: &mut Env<'_>,
    p: &Params,
    res: &mut Res,
    link: &LinkInfo,
    lid: u16,
    peer: Peer,
    out: &mut dyn Write,
) -> Step<Option<CmId>> {
    let whom = match peer {
        Peer::Lid(l) => format!("LID {l}"),
        Peer::Guid(g) => format!("port GUID {g:#018x}"),
        Peer::Gid(g) => format!("GID {}", gid_text(&g)),
        Peer::Ip(ip) => format!("{ip}"),
    };
    if link.link_type == "Ethernet" {
        let _ = writeln!(
            out,
            " Making the path to {whom} from the GIDs (RoCE: no SA)"
        );
    } else {
        let _ = writeln!(
            out,
            " Asking the SA for a path to {whom} (up to {} s)",
            CONNECT_TIMEOUT.as_secs()
        );
    }
    let path = path_from(env, p.ib_port, p.gid_index, peer).map_err(|m| (m, None))?;
    let remote_lid = path.dlid;
    let (sgid, dgid) = (path.sgid.0, path.dgid.0);
    let mut req = cm_req(path, PERFTEST_SERVICE_ID, res.qp);
    req.private_data =
        Hello::from_params(p, res.buf.bus_addr().0, res.mr.rkey, res.slot * res.slots).encode();
    let psn = req.starting_psn;
    let _ = writeln!(
        out,
        " Connecting to the server (CM REQ, service {PERFTEST_SERVICE_ID:#x})"
    );
    let (id, rep) = cm::connect(env.core, env.cm, env.dev, p.ib_port, &req, CONNECT_TIMEOUT)
        .map_err(|x| {
            let why = match x {
                ib_core::Error::Errno(cm::ECONNREFUSED) => String::from(
                    "the peer rejected the connection (is the server running the same tool there?)",
                ),
                other => format!("{other}"),
            };
            (format!("connecting to {whom}: {why}"), None)
        })?;
    let reply =
        Reply::decode(&rep, p.max_size()).map_err(|x| (e("server's answer", x), Some(id)))?;
    if p.tool.verb == Verb::Send && p.tool.kind == TestKind::Lat {
        // For the server's pongs (the first comes only after our first ping).
        post_recvs(env, res, TestKind::Lat, 0..1).map_err(|m| (m, Some(id)))?;
    }
    let _ = print_test_info(out, p, link);
    let local = Dest {
        lid,
        qpn: res.qp.qp_num,
        psn,
        rkey: res.mr.rkey,
        vaddr: res.buf.bus_addr().0,
        out_reads: p.out_reads,
    };
    let remote_qpn = cm::remote(env.core, env.cm, id).map_or(0, |r| r.1);
    let remote = Dest {
        lid: remote_lid,
        qpn: remote_qpn,
        psn: peer_psn(env, id),
        rkey: reply.rkey,
        vaddr: reply.vaddr,
        out_reads: p.out_reads,
    };
    let _ = print_pingpong_data(out, false, p.tool.verb, &local);
    if link.link_type == "Ethernet" {
        let _ = super::print_gid(out, &sgid);
    }
    let _ = print_pingpong_data(out, true, p.tool.verb, &remote);
    if link.link_type == "Ethernet" {
        let _ = super::print_gid(out, &dgid);
    }
    let _ = print_result_header(out, p);
    for size in p.sizes() {
        drive_size(env, p, res, size, &reply, out).map_err(|m| (m, Some(id)))?;
    }
    let _ = writeln!(out, "{RESULT_LINE}");
    await_done(env, id).map_err(|m| (m, Some(id)))?;
    Ok(Some(id))
}

/// The starting PSN the peer's CM message named (the client's REQ for the
/// server, the server's REP for the client): the PSN our QP sends from,
/// as the CM gives it for RTS.
fn peer_psn(env: &mut Env<'_>, id: CmId) -> u32 {
    cm::init_qp_attr(env.core, env.cm, id, QpState::Rts).map_or(0, |(a, _)| a.sq_psn)
}

/// Posts receives with these ids; id `w` lands in slot `w % slots`, or in
/// slot 1 (the incoming one) for latency tests.
fn post_recvs(
    env: &mut Env<'_>,
    res: &Res,
    kind: TestKind,
    ids: core::ops::Range<u64>,
) -> Result<(), String> {
    let dev = env.core.device_mut(env.dev).ok_or("the device is gone")?;
    for w in ids {
        let k = if kind == TestKind::Lat {
            1
        } else {
            w % res.slots
        };
        let sge = [Sge {
            addr: res.buf.bus_addr().0 + k * res.slot,
            length: res.slot as u32,
            lkey: res.mr.lkey,
        }];
        dev.post_recv(
            res.qp,
            &[RecvWr {
                wr_id: w,
                sg_list: &sge,
            }],
        )
        .map_err(|x| e("post_recv", x))?;
    }
    Ok(())
}

/// How often a tool's waits run ib_core's progress function
/// ([`IbCore::poll`]: the event queues, QP0/QP1 completions and MAD
/// timeouts, the SA and CM clients). A node inside a run must still answer
/// the SM: an SM that sweeps meanwhile (OpenSM on a trap or after an error;
/// 200 ms a try, 4 tries) finds no node behind a silent port and takes its
/// LID out of the switches' forwarding tables, so the run's own packets
/// are dropped (UD ones for good). The PMA, the ibping responder and the
/// peer's DREQ are served the same way. Once a millisecond of the clock
/// costs the data path nothing it would notice.
pub(crate) const PROGRESS_EVERY: Duration = Duration::from_millis(1);

/// Runs ib_core's progress function if [`PROGRESS_EVERY`] passed since
/// `at` (the time it last ran, kept across waits by the caller).
pub(crate) fn progress(core: &mut IbCore, t: u64, at: &Cell<u64>) {
    if t.saturating_sub(at.get()) >= PROGRESS_EVERY.as_nanos() as u64 {
        at.set(t);
        core.poll();
    }
}

/// The receive PSN the HCA has reached on `qp` (QUERY_QP): it moves with
/// every request packet the peer's QP sends us.
fn rq_psn(env: &mut Env<'_>, qp: Qp) -> Option<u32> {
    env.core
        .device_mut(env.dev)?
        .query_qp(qp, QpAttrMask::RQ_PSN)
        .ok()
        .map(|(a, _)| a.rq_psn)
}

/// Polls `cq` until `want` completions came (each handed to `on`), against
/// [`OP_TIMEOUT`] of no progress, interruptible, running ib_core's
/// progress function meanwhile ([`PROGRESS_EVERY`]). `passive`: a wait
/// that sees no completion while the peer works (the server while the
/// client writes, reads or runs atomics: as long as `-n` or `-D` make it):
/// progress is then also the peer's packets reaching our QP (its receive
/// PSN moving), so only a peer that stopped sending ends it.
fn poll(
    env: &mut Env<'_>,
    res: &Res,
    cq: Cq,
    want: usize,
    what: &str,
    passive: bool,
    on: impl FnMut(&Wc, u64) -> Result<(), String>,
) -> Result<(), String> {
    let mode = WaitMode {
        passive,
        flush_ok: false,
    };
    poll_inner(env, res, cq, want, what, mode, on)
}

/// How [`poll_inner`] waits: `passive` as [`poll`] says; `flush_ok`: a
/// flushed completion is handed to `on` too instead of ending the wait in
/// an error.
#[derive(Clone, Copy)]
struct WaitMode {
    passive: bool,
    flush_ok: bool,
}

/// [`poll`] in a [`WaitMode`].
fn poll_inner(
    env: &mut Env<'_>,
    res: &Res,
    cq: Cq,
    want: usize,
    what: &str,
    mode: WaitMode,
    mut on: impl FnMut(&Wc, u64) -> Result<(), String>,
) -> Result<(), String> {
    let mut wc = [Wc::default(); 16];
    let mut got = 0;
    let mut last = now(env.core);
    let mut spins = 0u32;
    let WaitMode { passive, flush_ok } = mode;
    let mut psn = if passive { rq_psn(env, res.qp) } else { None };
    while got < want {
        let dev = env.core.device_mut(env.dev).ok_or("the device is gone")?;
        let n = dev
            .poll_cq(cq, &mut wc[..(want - got).min(16)])
            .map_err(|x| e("poll_cq", x))?;
        let t = now(env.core);
        for w in &wc[..n] {
            let flushed = flush_ok && w.status == WcStatus::WrFlushErr;
            if w.status != WcStatus::Success && !flushed {
                return Err(format!(
                    "Completion with error: status {} ({}: {}) wr_id {} syndrom {:#x} (waiting for {what})",
                    w.status.raw(),
                    w.status.name(),
                    w.status.msg(),
                    w.wr_id,
                    w.vendor_err
                ));
            }
            on(w, t)?;
        }
        got += n;
        if n > 0 {
            last = t;
            continue;
        }
        // Between two empty polls (a spin hint on hardware; the model's
        // clock steps the wire here).
        progress(env.core, t, &res.progress_at);
        env.core.clock().relax();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) && (env.interrupted)() {
            return Err(format!("interrupted while waiting for {what}"));
        }
        if t.saturating_sub(last) > OP_TIMEOUT.as_nanos() as u64 {
            if passive {
                let now_psn = rq_psn(env, res.qp);
                if now_psn.is_some() && now_psn != psn {
                    // The peer's packets still arrive: it is at work.
                    psn = now_psn;
                    last = t;
                    continue;
                }
                return Err(format!(
                    "no completion for {} s while waiting for {what}, and no packet from the peer either",
                    OP_TIMEOUT.as_secs()
                ));
            }
            return Err(format!(
                "no completion for {} s while waiting for {what}",
                OP_TIMEOUT.as_secs()
            ));
        }
    }
    Ok(())
}

fn post(env: &mut Env<'_>, qp: Qp, wr: &SendWr<'_>) -> Result<(), String> {
    env.core
        .device_mut(env.dev)
        .ok_or("the device is gone")?
        .post_send(qp, core::slice::from_ref(wr))
        .map_err(|x| e("post_send", x))
}

fn sge(res: &Res, k: u64, len: u64) -> [Sge; 1] {
    [Sge {
        addr: res.buf.bus_addr().0 + k * res.slot,
        length: len as u32,
        lkey: res.mr.lkey,
    }]
}

fn fill_slot(res: &Res, k: u64, len: u64, seq: u64) {
    let mut m = vec![0u8; len as usize];
    fill(&mut m, seq);
    res.buf.write_bytes((k * res.slot) as usize, &m);
}

fn check_slot(res: &Res, k: u64, len: u64, seq: u64) -> Result<(), String> {
    let mut m = vec![0u8; len as usize];
    res.buf.read_bytes((k * res.slot) as usize, &mut m);
    verify(&m, seq).map_err(|x| format!("{x}"))
}

/// The server's side of one size: answer ping-pongs, receive SENDs, or
/// wait for the client's final SEND; then check what arrived.
fn serve_size(
    env: &mut Env<'_>,
    p: &Params,
    res: &mut Res,
    size: u64,
    hello: &Hello,
) -> Result<(), String> {
    let iters = p.iters;
    match (p.tool.verb, p.tool.kind) {
        (Verb::Send, TestKind::Bw) => {
            // `iters` SENDs, then the final one; each receive reposted as
            // it lands (after its check), so as many stay posted.
            let rcq = res.rcq;
            if p.duration.is_some() {
                // As many SENDs as fit in the time; the last carries an
                // immediate (the count).
                loop {
                    let (mut id, mut end) = (0, false);
                    poll(env, res, rcq, 1, "the client's SENDs", false, |w, _| {
                        id = w.wr_id;
                        end = w.wc_flags.contains(WcFlags::WITH_IMM);
                        Ok(())
                    })?;
                    post_recvs(env, res, TestKind::Bw, id..id.saturating_add(1))?;
                    if end {
                        return Ok(());
                    }
                }
            }
            for seq in 0..=iters {
                let mut id = 0;
                poll(env, res, rcq, 1, "the client's SENDs", false, |w, _| {
                    id = w.wr_id;
                    Ok(())
                })?;
                if p.check && seq < iters {
                    check_slot(res, id % res.slots, size, seq)?;
                }
                post_recvs(env, res, TestKind::Bw, id..id.saturating_add(1))?;
            }
            Ok(())
        }
        (Verb::Send, TestKind::Lat) | (Verb::Write, TestKind::Lat) => {
            pong(env, p, res, size, hello, iters)
        }
        _ => {
            // RDMA WRITE/READ/atomics: the client works alone until its
            // final SEND.
            let rcq = res.rcq;
            poll(
                env,
                res,
                rcq,
                1,
                "the client's end-of-size SEND",
                true,
                |_, _| Ok(()),
            )?;
            if p.check && p.tool.verb == Verb::Write && p.tool.kind == TestKind::Bw {
                // Slot k holds the last message written to it.
                for k in 0..res.slots.min(iters) {
                    let last = k + (iters - 1 - k) / res.slots * res.slots;
                    check_slot(res, k, size, last)?;
                }
            }
            post_recvs(env, res, p.tool.kind, 0..1)
        }
    }
}

/// The passive half of a ping-pong (write or send latency).
fn pong(
    env: &mut Env<'_>,
    p: &Params,
    res: &mut Res,
    size: u64,
    hello: &Hello,
    iters: u64,
) -> Result<(), String> {
    let mut i = 0;
    while p.duration.is_some() || i < iters {
        if !wait_ping(env, p, res, size, i)? {
            // -D: the client's final SEND came instead of a ping.
            return post_recvs(env, res, TestKind::Lat, 0..1);
        }
        send_ping(env, p, res, size, hello.vaddr, hello.rkey, i)?;
        i += 1;
    }
    // The client's final SEND.
    let rcq = res.rcq;
    poll(
        env,
        res,
        rcq,
        1,
        "the client's end-of-size SEND",
        false,
        |_, _| Ok(()),
    )?;
    post_recvs(env, res, TestKind::Lat, 0..1)
}

/// The last byte of ping `i`: never 0 (fresh memory), never the previous
/// ping's.
fn marker(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

fn send_ping(
    env: &mut Env<'_>,
    p: &Params,
    res: &Res,
    size: u64,
    raddr: u64,
    rkey: u32,
    i: u64,
) -> Result<(), String> {
    if p.check {
        fill_slot(res, 0, size, i);
    }
    let last = (size - 1) as usize;
    res.buf.write_u8(last, marker(i));
    // Into the peer's incoming slot (1).
    let raddr = raddr + res.slot;
    let s = sge(res, 0, size);
    let wr = match p.tool.verb {
        Verb::Write => SendWr {
            wr_id: i,
            sg_list: &s,
            opcode: WrOpcode::RdmaWrite,
            send_flags: SendFlags::SIGNALED,
            wr: WrDetail::Rdma {
                remote_addr: raddr,
                rkey,
            },
            ..SendWr::default()
        },
        _ => SendWr {
            wr_id: i,
            sg_list: &s,
            opcode: WrOpcode::Send,
            send_flags: SendFlags::SIGNALED,
            ..SendWr::default()
        },
    };
    post(env, res.qp, &wr)?;
    let cq = res.cq;
    poll(env, res, cq, 1, "our ping's completion", false, |_, _| {
        Ok(())
    })
}

/// Waits for ping `i`; `Ok(false)`: the client's final SEND came instead
/// (a `-D` run is over; the server never knows the count beforehand).
fn wait_ping(env: &mut Env<'_>, p: &Params, res: &Res, size: u64, i: u64) -> Result<bool, String> {
    let last = (size - 1) as usize;
    let inc = res.slot as usize;
    let want = marker(i);
    if p.tool.verb == Verb::Write {
        // perftest's write_lat polls the buffer's last byte.
        if !socket::wait_byte(env, res, inc + last, want, i, p.duration.is_some())? {
            return Ok(false);
        }
    } else {
        let rcq = res.rcq;
        let mut end = false;
        poll(env, res, rcq, 1, "the peer's SEND", false, |w, _| {
            end = w.wc_flags.contains(WcFlags::WITH_IMM);
            Ok(())
        })?;
        if end {
            return Ok(false);
        }
        if p.check {
            check_ping(res, size, i)?;
        }
        post_recvs(env, res, TestKind::Lat, 0..1)?;
        return Ok(true);
    }
    if p.check {
        check_ping(res, size, i)?;
    }
    Ok(true)
}

/// The incoming ping `i`: its pattern, the marker in its last byte.
fn check_ping(res: &Res, size: u64, i: u64) -> Result<(), String> {
    let last = (size - 1) as usize;
    {
        let mut m = vec![0u8; size as usize];
        res.buf.read_bytes(res.slot as usize, &mut m);
        m[last] = super::exchange::pattern_byte(i, last);
        verify(&m, i).map_err(|x| format!("{x}"))?;
    }
    Ok(())
}

/// The client's side of one size: the measured loop and the report line.
fn drive_size(
    env: &mut Env<'_>,
    p: &Params,
    res: &mut Res,
    size: u64,
    reply: &Reply,
    out: &mut dyn Write,
) -> Result<Option<super::BwReport>, String> {
    let iters = p.iters as usize;
    let tps = 1_000_000_000;
    if let Some(secs) = p.duration {
        return drive_duration(env, p, res, size, reply, secs, out).map(|()| None);
    }
    match p.tool.kind {
        TestKind::Bw => {
            let mut posted = vec![0u64; iters];
            let mut completed = vec![0u64; iters];
            // With --check a slot is not refilled while a message from it
            // may still be in flight: at most `slots` outstanding, each
            // window of them signalled.
            let depth = if p.check {
                (p.tx_depth as usize).min(res.slots as usize)
            } else {
                p.tx_depth as usize
            };
            let cq_mod_eff = p.cq_mod.max(1).min(depth as u32);
            let cq_mod = u64::from(cq_mod_eff);
            let (mut sent, mut done) = (0usize, 0usize);
            while done < iters {
                while sent < iters && sent - done < depth {
                    let k = sent as u64 % res.slots;
                    if p.check && p.tool.verb != Verb::Read {
                        fill_slot(res, k, size, sent as u64);
                    }
                    let s = sge(res, k, size);
                    let signaled = (sent as u64 + 1).is_multiple_of(cq_mod) || sent + 1 == iters;
                    let remote = reply.vaddr + if res.linux { 0 } else { k * res.slot };
                    let (opcode, wr) = match p.tool.verb {
                        Verb::Write => (
                            WrOpcode::RdmaWrite,
                            WrDetail::Rdma {
                                remote_addr: remote,
                                rkey: reply.rkey,
                            },
                        ),
                        Verb::Read => (
                            WrOpcode::RdmaRead,
                            WrDetail::Rdma {
                                remote_addr: remote,
                                rkey: reply.rkey,
                            },
                        ),
                        _ => (WrOpcode::Send, WrDetail::None),
                    };
                    let w = SendWr {
                        wr_id: sent as u64,
                        sg_list: &s,
                        opcode,
                        send_flags: if signaled {
                            SendFlags::SIGNALED
                        } else {
                            SendFlags::empty()
                        },
                        wr,
                        ..SendWr::default()
                    };
                    posted[sent] = now(env.core);
                    post(env, res.qp, &w)?;
                    sent += 1;
                }
                let cq = res.cq;
                let check_read = p.check && p.tool.verb == Verb::Read;
                let slots = res.slots;
                let mut upto = done;
                poll(env, res, cq, 1, "a send completion", false, |w, t| {
                    // wr_id is the index of the signalled message; one
                    // from nowhere (beyond the run) cannot move us past it.
                    let last = usize::try_from(w.wr_id)
                        .unwrap_or(usize::MAX)
                        .min(iters - 1);
                    for c in completed.iter_mut().take(last + 1).skip(upto) {
                        *c = t;
                    }
                    upto = upto.max(last + 1);
                    Ok(())
                })?;
                if check_read {
                    for j in done..upto {
                        let k = j as u64 % slots;
                        // The server's slot k holds pattern k.
                        check_slot(res, k, size, k)?;
                    }
                }
                done = upto;
            }
            finish_size(env, res, iters as u64)?;
            let r = bw_report(size, &posted, &completed, cq_mod_eff, tps)
                .map_err(|x| format!("{x}"))?;
            let _ = print_bw_line(out, &r);
            return Ok(Some(r));
        }
        TestKind::Lat => {
            let mut stamps = Vec::with_capacity(iters + 1);
            for i in 0..iters as u64 {
                stamps.push(now(env.core));
                match p.tool.verb {
                    Verb::Write | Verb::Send => {
                        send_ping(env, p, res, size, reply.vaddr, reply.rkey, i)?;
                        if !wait_ping(env, p, res, size, i)? {
                            return Err(String::from("the server ended the run"));
                        }
                    }
                    Verb::Read | Verb::Atomic => one_op(env, p, res, size, reply, i)?,
                }
            }
            stamps.push(now(env.core));
            finish_size(env, res, p.iters)?;
            let mut samples: Vec<u64> = stamps.windows(2).map(|w| w[1] - w[0]).collect();
            let r = lat_report(size, p.iters, &mut samples, p.tool.verb, tps)
                .map_err(|x| format!("{x}"))?;
            let _ = print_lat_line(out, &r);
        }
    }
    Ok(None)
}

fn one_op(
    env: &mut Env<'_>,
    p: &Params,
    res: &Res,
    size: u64,
    reply: &Reply,
    i: u64,
) -> Result<(), String> {
    let s = sge(res, 0, if p.tool.verb == Verb::Atomic { 8 } else { size });
    let wr = if p.tool.verb == Verb::Atomic {
        let (opcode, compare_add, swap) = match p.atomic_type {
            super::AtomicType::FetchAndAdd => (WrOpcode::AtomicFetchAndAdd, 1, 0),
            super::AtomicType::CmpAndSwap => (WrOpcode::AtomicCmpAndSwp, i, i + 1),
        };
        SendWr {
            wr_id: i,
            sg_list: &s,
            opcode,
            send_flags: SendFlags::SIGNALED,
            wr: WrDetail::Atomic {
                remote_addr: reply.vaddr,
                compare_add,
                swap,
                compare_add_mask: 0,
                swap_mask: 0,
                rkey: reply.rkey,
            },
            ..SendWr::default()
        }
    } else {
        SendWr {
            wr_id: i,
            sg_list: &s,
            opcode: WrOpcode::RdmaRead,
            send_flags: SendFlags::SIGNALED,
            wr: WrDetail::Rdma {
                remote_addr: reply.vaddr,
                rkey: reply.rkey,
            },
            ..SendWr::default()
        }
    };
    post(env, res.qp, &wr)?;
    let cq = res.cq;
    poll(
        env,
        res,
        cq,
        1,
        "the operation's completion",
        false,
        |_, _| Ok(()),
    )?;
    if p.check {
        if p.tool.verb == Verb::Atomic {
            // Fetch-and-add by 1 from 0 / compare-and-swap i -> i+1: the
            // old value is the iteration number (read in either byte order:
            // the returned word is the responder's memory as it was).
            let got = res.buf.read_u64(0);
            if got != i && u64::from_be(got) != i {
                return Err(format!("data check failed: atomic {i} returned {got:#x}"));
            }
        } else {
            check_slot(res, 0, size, 0)?;
        }
    }
    Ok(())
}

/// The client's end-of-size SEND (the server's cue), with the count of
/// messages as its immediate (what tells a `-D` server the run is over).
/// Its completion may be a flush: the server got it, finished and
/// disconnected before its ACK reached us (lost, or late); whether the
/// server got it is then what its DREQ says ([`await_done`]): a run that
/// goes on after a flushed one fails on the next message anyway.
fn finish_size(env: &mut Env<'_>, res: &Res, count: u64) -> Result<(), String> {
    if res.linux {
        return Ok(());
    }
    let s = sge(res, 0, 1);
    let wr = SendWr {
        wr_id: u64::MAX,
        sg_list: &s,
        opcode: WrOpcode::SendWithImm,
        send_flags: SendFlags::SIGNALED,
        imm_data: u32::try_from(count).unwrap_or(u32::MAX),
        ..SendWr::default()
    };
    post(env, res.qp, &wr)?;
    let cq = res.cq;
    poll_inner(
        env,
        res,
        cq,
        1,
        "the end-of-size SEND's completion",
        WaitMode {
            passive: false,
            flush_ok: true,
        },
        |_, _| Ok(()),
    )
}

/// A `-D` run of one size (perftest's duration mode without its warm-up
/// and cool-down margins): as many messages as fit in `secs`, then the
/// final SEND; bandwidth reports no peak (0.00, as perftest), latency its
/// duration line (mean latency and transactions per second).
fn drive_duration(
    env: &mut Env<'_>,
    p: &Params,
    res: &mut Res,
    size: u64,
    reply: &Reply,
    secs: u32,
    out: &mut dyn Write,
) -> Result<(), String> {
    let tps = 1_000_000_000;
    let start = now(env.core);
    let end = start.saturating_add(u64::from(secs) * tps);
    let mut done = 0u64;
    match p.tool.kind {
        TestKind::Bw => {
            let depth = u64::from(p.tx_depth).max(1);
            let cq_mod = u64::from(p.cq_mod.max(1)).min(depth);
            let mut sent = 0u64;
            let mut last_done_at = start;
            loop {
                // Posting fills the window, and the message that fills it
                // is signalled: the last one posted always is, so once
                // the time is up the rest drains.
                if now(env.core) < end {
                    while sent - done < depth {
                        let k = sent % res.slots;
                        let s = sge(res, k, size);
                        let remote = reply.vaddr + if res.linux { 0 } else { k * res.slot };
                        let (opcode, wr) = match p.tool.verb {
                            Verb::Write => (
                                WrOpcode::RdmaWrite,
                                WrDetail::Rdma {
                                    remote_addr: remote,
                                    rkey: reply.rkey,
                                },
                            ),
                            Verb::Read => (
                                WrOpcode::RdmaRead,
                                WrDetail::Rdma {
                                    remote_addr: remote,
                                    rkey: reply.rkey,
                                },
                            ),
                            _ => (WrOpcode::Send, WrDetail::None),
                        };
                        let signaled =
                            (sent + 1).is_multiple_of(cq_mod) || sent + 1 - done == depth;
                        let w = SendWr {
                            wr_id: sent,
                            sg_list: &s,
                            opcode,
                            send_flags: if signaled {
                                SendFlags::SIGNALED
                            } else {
                                SendFlags::empty()
                            },
                            wr,
                            ..SendWr::default()
                        };
                        post(env, res.qp, &w)?;
                        sent += 1;
                    }
                } else if done == sent {
                    break;
                }
                let cq = res.cq;
                let mut upto = done;
                poll(env, res, cq, 1, "a send completion", false, |w, t| {
                    upto = upto.max(w.wr_id.saturating_add(1).min(sent));
                    last_done_at = t;
                    Ok(())
                })?;
                done = upto;
            }
            let elapsed = last_done_at.saturating_sub(start);
            finish_size(env, res, done)?;
            let r =
                super::bw_report_duration(size, done, elapsed, tps).map_err(|x| format!("{x}"))?;
            let _ = print_bw_line(out, &r);
        }
        TestKind::Lat => {
            while now(env.core) < end {
                match p.tool.verb {
                    Verb::Write | Verb::Send => {
                        send_ping(env, p, res, size, reply.vaddr, reply.rkey, done)?;
                        if !wait_ping(env, p, res, size, done)? {
                            return Err(String::from("the server ended the run"));
                        }
                    }
                    Verb::Read | Verb::Atomic => one_op(env, p, res, size, reply, done)?,
                }
                done += 1;
            }
            let elapsed = now(env.core).saturating_sub(start);
            finish_size(env, res, done)?;
            super::print_lat_duration_line(out, size, done, elapsed, p.tool.verb, tps)
                .map_err(|x| format!("{x}"))?;
        }
    }
    Ok(())
}
