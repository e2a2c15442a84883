//! The perftest runs against Linux's perftest: its TCP exchange ([`communication`](super::super::communication)) and its data paths.
//!
//! What a run does when the peer is Linux's perftest 4.5-0.17 met over TCP
//! (port 18515): the exchange of `perftest_communication.c`, the QP moved to
//! RTS by hand from the peer's `pingpong_dest` (perftest's `ctx_connect`: ACK
//! timeout 14, 7 retries, RNR retries 7, min RNR timer 12), the data paths
//! where perftest's differ from ours (write latency: the server writes first
//! and the marker is the count; RDMA to the peer's address itself, no
//! end-of-size SEND) and the barriers and reports where each tool's `main`
//! puts them. With `-R` the same run goes over the RDMA CM's control
//! connection ([`rdma_cm`](super::rdma_cm)). Left out: `-a`, `-D`, `--check` (refused with a sentence),
//! `ib_send_lat` and `ib_atomic_lat` (refused). On RoCE (or with `-x`) the
//! QP addresses take perftest's GID form and the QP's path a GRH to the
//! peer's GID.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;
use core::net::Ipv4Addr;
use core::time::Duration;

use hal::Deadline;
use ib_core::verbs::{
    AccessFlags, AhAttr, Gid, GlobalRoute, Mtu, QpAttr, QpAttrMask, QpState, SendFlags, SendWr,
};
use ib_core::verbs::{Wc, WcStatus, WrDetail, WrOpcode};

use super::super::communication::{
    CACHE_LINE, CYCLE_BUFFER, Comm, EXCHANGE_TIMEOUT, Link, Script, Sockets,
};
use super::super::{
    BwReport, Dest, LinkInfo, Params, RESULT_FMT, RESULT_LINE, TestKind, Verb, bw_report,
    lat_report, print_bw_line, print_lat_line, print_pingpong_data, print_result_header,
    print_test_info,
};
use super::rdma_cm::{self, Ctl};
use super::{
    CONNECT_TIMEOUT, Env, OP_TIMEOUT, Res, e, now, poll, post, post_recvs, setup, slots_for,
};

/// How long a barrier after the test may wait: the peer's whole run.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a wait on the socket polls the core and the IP stack.
const PUMP_EVERY: Duration = Duration::from_micros(500);

/// What carries the exchange: a TCP connection of the IP stack, or
/// (`-R`) the RDMA CM's control connection.
#[derive(Clone, Copy)]
pub(super) enum Way<'c> {
    /// The socket, connected.
    Tcp(u32),
    /// The control connection.
    Cm(&'c Ctl),
}

/// The exchange's [`Link`] over `way`.
struct Tcp<'e, 'a, 'c> {
    env: &'e mut Env<'a>,
    way: Way<'c>,
    /// Our GID when a GID index is in use (RoCE, `-x`): the TCP exchange's
    /// QP addresses take the GID form.
    gid: Option<[u8; 16]>,
}

impl<'c> Tcp<'_, '_, 'c> {
    /// The exchange on this link, in the form its way takes.
    fn comm(&mut self, client: bool) -> Comm<'_> {
        let rdma = matches!(self.way, Way::Cm(_));
        let gid = if rdma { None } else { self.gid };
        let mut c = Comm::new(self, client);
        c.rdma_cm = rdma;
        c.gid = gid;
        c
    }
    fn ip(&mut self) -> Result<&mut dyn Sockets, String> {
        match self.env.ip.as_deref_mut() {
            Some(s) => Ok(s),
            None => Err(String::from("no IP stack")),
        }
    }
}

impl Link for Tcp<'_, '_, '_> {
    fn now_ns(&self) -> u64 {
        self.env.core.clock().now_ns()
    }
    fn pump(&mut self) -> Result<(), String> {
        // A wait on the socket (the server's, all through the client's
        // run) must not take the device's time from the data path: the
        // core and the stack are polled every PUMP_EVERY, as the runs'
        // own waits poll the core (`PROGRESS_EVERY`).
        self.env.core.clock().delay(PUMP_EVERY);
        self.env.core.poll();
        if let Some(ip) = self.env.ip.as_deref_mut() {
            ip.poll(self.env.core);
        }
        if (self.env.interrupted)() {
            return Err(String::from("interrupted"));
        }
        Ok(())
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        match self.way {
            Way::Tcp(s) => self.ip()?.recv(s, buf),
            Way::Cm(c) => c.recv(self.env, buf),
        }
    }
    fn send(&mut self, buf: &[u8]) -> Result<usize, String> {
        match self.way {
            Way::Tcp(s) => self.ip()?.send(s, buf),
            Way::Cm(c) => c.send(self.env, buf),
        }
    }
}

/// Refuses what this way of meeting does not do, in a sentence.
pub(super) fn check_supported(p: &Params) -> Result<Script, String> {
    let script = Script::of(p.tool).ok_or_else(|| {
        format!(
            "{} against perftest's TCP exchange is not supported here (ib_write_bw, ib_read_bw, ib_send_bw, ib_write_lat and ib_read_lat are); give the peer's LID or GUID to use our IB CM way",
            p.tool.name()
        )
    })?;
    if p.all_sizes || p.duration.is_some() || p.check {
        return Err(String::from(
            "-a, -D and --check are not supported with perftest's TCP exchange here: run one size with -s and -n",
        ));
    }
    Ok(script)
}

/// Waits for `sock` to be connected (a client's connect, or a client on
/// the listener), at most `timeout`, interruptible.
fn wait_established(
    env: &mut Env<'_>,
    sock: u32,
    what: &str,
    timeout: Duration,
) -> Result<(), String> {
    let end = Deadline::after(env.core.clock(), timeout);
    loop {
        env.core.poll();
        let ip = env.ip.as_deref_mut().ok_or("no IP stack")?;
        ip.poll(env.core);
        if ip.established(sock)? {
            return Ok(());
        }
        env.core.clock().relax();
        if (env.interrupted)() {
            return Err(format!("interrupted while waiting for {what}"));
        }
        if end.expired(env.core.clock()) {
            return Err(format!(
                "waited {} s for {what}; none came",
                timeout.as_secs()
            ));
        }
    }
}

/// The client's TCP connection to `ip`.
pub(super) fn connect(
    env: &mut Env<'_>,
    p: &Params,
    ip: Ipv4Addr,
    out: &mut dyn Write,
) -> Result<u32, String> {
    let _ = writeln!(
        out,
        " Connecting to {ip}:{} (perftest's TCP exchange)",
        p.port
    );
    let s = env
        .ip
        .as_deref_mut()
        .ok_or("no IP stack here: give the server's LID or GUID")?;
    let sock = s.connect(ip, p.port)?;
    match wait_established(env, sock, "the TCP connection", EXCHANGE_TIMEOUT) {
        Ok(()) => Ok(sock),
        Err(m) => {
            close(env, sock);
            Err(format!("Couldn't connect to {ip}:{}: {m}", p.port))
        }
    }
}

/// Lets the connection go (a clean close, bounded).
pub(super) fn close(env: &mut Env<'_>, sock: u32) {
    if let Some(ip) = env.ip.as_deref_mut() {
        ip.close(env.core, sock);
    }
}

/// perftest's GID choice (`-x`, else `get_best_gid_index`: the first
/// IPv4-mapped GID of the port, else index 0), and the GID there.
fn source_gid(env: &mut Env<'_>, p: &Params) -> Result<(u8, [u8; 16]), String> {
    let dev = env.core.device(env.dev).ok_or("the device is gone")?;
    let gid_at = |i: u8| dev.get_cached_gid(p.ib_port, usize::from(i)).map(|g| g.0);
    let idx = match p.gid_index {
        Some(i) => i,
        None => (0..128u8)
            .map_while(|i| gid_at(i).ok().map(|g| (i, g)))
            .find(|(_, g)| g[..10] == [0; 10] && g[10..12] == [0xff, 0xff])
            .map_or(0, |(i, _)| i),
    };
    let g = gid_at(idx).map_err(|x| e("source GID", x))?;
    if g == [0; 16] {
        return Err(format!(
            "GID index {idx} of port {} is empty (see show_gids)",
            p.ib_port
        ));
    }
    Ok((idx, g))
}

fn mtu_of(n: u8) -> Mtu {
    match n {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        5 => Mtu::Mtu4096,
        _ => Mtu::Mtu2048,
    }
}

/// perftest's `ctx_connect` for RC: the QP from RESET to RTS towards `rem`.
fn connect_qp(
    env: &mut Env<'_>,
    p: &Params,
    res: &Res,
    my: &Dest,
    rem: &Dest,
    mtu: u8,
    grh: Option<(u8, [u8; 16])>,
) -> Result<(), String> {
    let dev = env.core.device_mut(env.dev).ok_or("the device is gone")?;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: p.ib_port,
        qp_access_flags: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..Default::default()
    };
    dev.modify_qp(
        res.qp,
        &a,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .map_err(|x| e("modify QP to INIT", x))?;
    a.qp_state = QpState::Rtr;
    a.path_mtu = mtu_of(mtu);
    a.dest_qp_num = rem.qpn;
    a.rq_psn = rem.psn;
    a.max_dest_rd_atomic = my.out_reads.clamp(1, 16) as u8;
    a.min_rnr_timer = 12;
    // With a GID index, perftest's `ctx_modify_qp_to_rtr` makes the path
    // global: the peer's GID, our GID index, hop limit 0xff (on RoCE the
    // driver finds the peer's MAC from the GID: EUI-64 or ARP).
    a.ah_attr = AhAttr {
        dlid: rem.lid,
        sl: 0,
        port_num: p.ib_port,
        grh: grh.map(|(sgid_index, dgid)| GlobalRoute {
            dgid: Gid(dgid),
            flow_label: 0,
            sgid_index,
            hop_limit: 0xff,
            traffic_class: 0,
        }),
        ..Default::default()
    };
    dev.modify_qp(
        res.qp,
        &a,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .map_err(|x| e("modify QP to RTR", x))?;
    a.qp_state = QpState::Rts;
    a.sq_psn = my.psn;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = rem.out_reads.clamp(1, 16) as u8;
    dev.modify_qp(
        res.qp,
        &a,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .map_err(|x| e("modify QP to RTS", x))
}

/// One side of a run against Linux's perftest over the TCP connection
/// `sock` (connected): the exchange, the test and the closing barriers.
/// The buffer made is left in `slot_res` for the caller to tear down.
pub(super) fn run(
    env: &mut Env<'_>,
    p: &Params,
    link: &LinkInfo,
    lid: u16,
    way: Way<'_>,
    out: &mut dyn Write,
    slot_res: &mut Option<Res>,
) -> Result<(), String> {
    let script = check_supported(p)?;
    let client = !p.is_server();
    let mut q = p.clone();
    q.socket = true;
    q.rdma_cm = matches!(way, Way::Cm(_));
    // perftest uses a GID index on RoCE (or with -x anywhere): the QP
    // addresses carry the GID and the QP's path a GRH.
    let sgid =
        if matches!(way, Way::Tcp(_)) && (link.link_type == "Ethernet" || q.gid_index.is_some()) {
            let (idx, g) = source_gid(env, &q)?;
            q.gid_index = Some(idx);
            Some((idx, g))
        } else {
            None
        };
    let gid = sgid.map(|(_, g)| g);
    let p = &q;
    let mtu_now = (link.mtu / 256).trailing_zeros() as u8 + 1;
    let t0 = env.core.clock().now_ns();
    let (cycle, mtu) = {
        let mut t = Tcp { env, way, gid };
        let mut c = t.comm(client);
        c.exchange_versions()?;
        let (cycle, _line) = c.check_sys_data(CYCLE_BUFFER, CACHE_LINE)?;
        (cycle, c.check_mtu(mtu_now)?)
    };
    // perftest's peer may write anywhere in its cycle buffer from the
    // address we give: the buffer holds that much past the incoming slot.
    let (slot, slots) = slots_for(p);
    let slots = slots.max(u64::from(cycle).div_ceil(slot) + 1);
    let res = slot_res.insert(setup(env, p, slot, slots)?);
    res.linux = true;
    let incoming = if p.tool.kind == TestKind::Lat {
        res.slot
    } else {
        0
    };
    let my = Dest {
        lid,
        qpn: res.qp.qp_num,
        psn: (t0 as u32 ^ res.qp.qp_num.wrapping_mul(0x9e37)) & 0xff_ffff,
        rkey: res.mr.rkey,
        vaddr: res.buf.bus_addr().0 + incoming,
        out_reads: p.out_reads,
    };
    // The header names the MTU both sides settled on.
    let link = &LinkInfo {
        mtu: 128u32 << mtu,
        ..link.clone()
    };
    let _ = print_test_info(out, p, link);
    if let Way::Cm(ctl) = way {
        // create_rdma_cm_connection: a hand shake (of zeros), the test
        // connection, another hand shake.
        let zero = Dest::default();
        Tcp { env, way, gid }.shake(client, &zero, EXCHANGE_TIMEOUT)?;
        ctl.connect_test(env, p, res)?;
        Tcp { env, way, gid }.shake(client, &zero, EXCHANGE_TIMEOUT)?;
    }
    let (rem, rem_gid) = {
        let mut t = Tcp { env, way, gid };
        let mut c = t.comm(client);
        let d = c.hand_shake(&my, EXCHANGE_TIMEOUT)?;
        (d, c.rem_gid)
    };
    if matches!(way, Way::Tcp(_)) {
        let grh = sgid.map(|(idx, _)| (idx, rem_gid));
        connect_qp(env, p, res, &my, &rem, mtu, grh)?;
    }
    if !client && p.tool.verb == Verb::Send {
        post_recvs(env, res, p.tool.kind, 0..u64::from(p.rx_depth).min(p.iters))?;
    }
    let _ = print_pingpong_data(out, false, p.tool.verb, &my);
    if let Some(g) = &gid {
        let _ = super::super::print_gid(out, g);
    }
    for _ in 1..script.before {
        Tcp { env, way, gid }.shake(client, &my, EXCHANGE_TIMEOUT)?;
    }
    let _ = print_pingpong_data(out, true, p.tool.verb, &rem);
    if gid.is_some() {
        let _ = super::super::print_gid(out, &rem_gid);
    }
    let size = p.size;
    let reply = super::super::exchange::Reply {
        status: 0,
        vaddr: rem.vaddr,
        rkey: rem.rkey,
        len: size,
    };
    if !client && (script.server_idle || script.report) {
        // The server waits while the client works: read latency closes at
        // once; write and read bandwidth print the client's figures.
        if script.report {
            let _ = writeln!(out, "{RESULT_LINE}\n{RESULT_FMT}");
            let mut t = Tcp { env, way, gid };
            let mut c = t.comm(false);
            c.hand_shake(&my, RUN_TIMEOUT)?;
            let r = c.xchg_bw_reports(&BwReport::default())?;
            let _ = print_bw_line(out, &r);
            c.close(&my, EXCHANGE_TIMEOUT)?;
        } else {
            Tcp { env, way, gid }.close_comm(false, &my, RUN_TIMEOUT)?;
        }
        let _ = writeln!(out, "{RESULT_LINE}");
        return Ok(());
    }
    let _ = print_result_header(out, p);
    let mine = match (p.tool.verb, p.tool.kind, client) {
        (Verb::Write, TestKind::Lat, _) => {
            write_lat(env, p, res, size, &rem, client, out)?;
            None
        }
        (Verb::Send, TestKind::Bw, false) => {
            recv_bw(env, p, res, size, out)?;
            None
        }
        _ => super::drive_size(env, p, res, size, &reply, out)?,
    };
    let _ = writeln!(out, "{RESULT_LINE}");
    let mut t = Tcp { env, way, gid };
    let mut c = t.comm(client);
    if let (true, Some(r)) = (script.report, mine) {
        c.hand_shake(&my, RUN_TIMEOUT)?;
        c.xchg_bw_reports(&r)?;
    }
    if script.close {
        c.close(&my, RUN_TIMEOUT)?;
    }
    Ok(())
}

impl Tcp<'_, '_, '_> {
    fn shake(&mut self, client: bool, my: &Dest, timeout: Duration) -> Result<Dest, String> {
        self.comm(client).hand_shake(my, timeout)
    }
    fn close_comm(&mut self, client: bool, my: &Dest, timeout: Duration) -> Result<(), String> {
        self.comm(client).close(my, timeout)
    }
}

/// perftest's `run_iter_lat_write`: the server writes first; each write's
/// last byte is the count of writes so far (as a byte), which the other
/// side polls for in the last byte of its incoming buffer.
fn write_lat(
    env: &mut Env<'_>,
    p: &Params,
    res: &Res,
    size: u64,
    rem: &Dest,
    client: bool,
    out: &mut dyn Write,
) -> Result<(), String> {
    let last = (size - 1) as usize;
    let inc = res.slot as usize + last;
    let mut stamps = Vec::with_capacity(p.iters as usize + 1);
    for i in 0..p.iters {
        let want = (i + 1) as u8;
        if client {
            wait_byte(env, res, inc, want, i + 1, false)?;
        }
        stamps.push(now(env.core));
        res.buf.write_u8(last, want);
        let s = super::sge(res, 0, size);
        let wr = SendWr {
            wr_id: i,
            sg_list: &s,
            opcode: WrOpcode::RdmaWrite,
            send_flags: SendFlags::SIGNALED,
            wr: WrDetail::Rdma {
                remote_addr: rem.vaddr,
                rkey: rem.rkey,
            },
            ..SendWr::default()
        };
        post(env, res.qp, &wr)?;
        let cq = res.cq;
        poll(env, res, cq, 1, "our write's completion", false, |_, _| {
            Ok(())
        })?;
        if !client {
            wait_byte(env, res, inc, want, i + 1, false)?;
        }
    }
    stamps.push(now(env.core));
    let mut samples: Vec<u64> = stamps.windows(2).map(|w| w[1] - w[0]).collect();
    let r = lat_report(size, p.iters, &mut samples, p.tool.verb, 1_000_000_000)
        .map_err(|x| format!("{x}"))?;
    let _ = print_lat_line(out, &r);
    Ok(())
}

/// Spins until byte `at` of our buffer is `want` (the peer's write number
/// `n`): `Ok(true)`. With `end_on_recv` (a timed run) a receive completing
/// first, the peer's end-of-run SEND, ends the wait: `Ok(false)`. Also
/// the wait of the IB CM path's write latency ([`super::wait_ping`]).
pub(super) fn wait_byte(
    env: &mut Env<'_>,
    res: &Res,
    at: usize,
    want: u8,
    n: u64,
    end_on_recv: bool,
) -> Result<bool, String> {
    let start = now(env.core);
    let mut spins = 0u32;
    while res.buf.read_u8(at) != want {
        env.core.clock().relax();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            super::progress(env.core, now(env.core), &res.progress_at);
        }
        if end_on_recv && spins.is_multiple_of(64) {
            let mut wc = [Wc::default(); 1];
            let got = env
                .core
                .device_mut(env.dev)
                .ok_or("the device is gone")?
                .poll_cq(res.rcq, &mut wc)
                .map_err(|x| e("poll_cq", x))?;
            if got == 1 {
                if wc[0].status != WcStatus::Success {
                    return Err(format!(
                        "Completion with error: status {} ({}: {}) while waiting for the peer's write",
                        wc[0].status.raw(),
                        wc[0].status.name(),
                        wc[0].status.msg()
                    ));
                }
                return Ok(false);
            }
        }
        if spins.is_multiple_of(1024) {
            if (env.interrupted)() {
                return Err(String::from(
                    "interrupted while waiting for the peer's write",
                ));
            }
            if now(env.core).saturating_sub(start) > OP_TIMEOUT.as_nanos() as u64 {
                return Err(format!(
                    "the peer's write {n} did not come within {} s",
                    OP_TIMEOUT.as_secs()
                ));
            }
        }
    }
    Ok(true)
}

/// perftest's `run_iter_bw_server`: `iters` SENDs received, each receive
/// posted again as it completes; the figures from the first completion to
/// each later one.
fn recv_bw(
    env: &mut Env<'_>,
    p: &Params,
    res: &mut Res,
    size: u64,
    out: &mut dyn Write,
) -> Result<(), String> {
    let n = p.iters as usize;
    let mut done = Vec::with_capacity(n);
    let rcq = res.rcq;
    // The receives posted before the run (`rx_depth` of them).
    let mut posted = u64::from(p.rx_depth).min(p.iters);
    while done.len() < n {
        // Not a passive wait: that one reads the QP's receive PSN (a
        // firmware command) at every call, dearer than a message here.
        poll(env, res, rcq, 1, "the client's SENDs", false, |_, t| {
            done.push(t);
            Ok(())
        })?;
        if posted < p.iters {
            post_recvs(env, res, TestKind::Bw, posted..posted + 1)?;
            posted += 1;
        }
    }
    let first = done[0];
    let posted = alloc::vec![first; n];
    let mut r = bw_report(size, &posted, &done, 1, 1_000_000_000).map_err(|x| format!("{x}"))?;
    // perftest's server prints no peak (0.00): it times the whole run only.
    r.bw_peak = 0.0;
    let _ = print_bw_line(out, &r);
    Ok(())
}

/// A client run against the server at `ip`: perftest's TCP exchange, or
/// with `-R` its RDMA CM connections ([`rdma_cm`]).
pub(super) fn client(
    env: &mut Env<'_>,
    p: &Params,
    link: &LinkInfo,
    lid: u16,
    ip: Ipv4Addr,
    out: &mut dyn Write,
) -> (Option<Res>, super::Step<Option<ib_core::cm::CmId>>) {
    let mut res = None;
    let r = client_tcp(env, p, link, lid, ip, out, &mut res);
    (res, r.map(|()| None).map_err(|m| (m, None)))
}

fn client_tcp(
    env: &mut Env<'_>,
    p: &Params,
    link: &LinkInfo,
    lid: u16,
    ip: Ipv4Addr,
    out: &mut dyn Write,
    res: &mut Option<Res>,
) -> Result<(), String> {
    check_supported(p)?;
    if p.rdma_cm {
        let _ = writeln!(out, " Connecting to {ip}:{} (rdma_cm)", p.port);
        let ctl = Ctl::connect(env, ip, p.port)
            .map_err(|m| format!("Couldn't connect to {ip}:{} by rdma_cm: {m}", p.port))?;
        let r = run(env, p, link, lid, Way::Cm(&ctl), out, res);
        ctl.finish(env);
        return r;
    }
    let sock = connect(env, p, ip, out)?;
    let r = run(env, p, link, lid, Way::Tcp(sock), out, res);
    close(env, sock);
    r
}

/// The server's wait for a client: a CM REQ on `listen` (our tools) or a
/// TCP connection on perftest's port (Linux's), whichever comes first.
pub(super) enum Incoming {
    /// Our IB CM's REQ.
    Cm(ib_core::cm::CmEvent),
    /// A TCP connection (connected).
    Tcp(u32),
    /// An RDMA CM connection request (`-R`): the listener and the new ID.
    RdmaCm(ib_core::cma::RdmaCmId, ib_core::cma::RdmaCmId),
}

/// Waits [`CONNECT_TIMEOUT`] for either kind of client.
pub(super) fn accept_either(
    env: &mut Env<'_>,
    p: &Params,
    listen: ib_core::cm::CmId,
) -> Result<Incoming, String> {
    // Without an IP address (no IPoIB configured) only our own tools can
    // come, by the IB CM.
    let tcp = env.ip.as_deref_mut().and_then(|ip| ip.listen(p.port).ok());
    // A Linux client with -R comes by the RDMA CM (PS_TCP, our port).
    // Where there is no RDMA CM it is told no, and so is the user here.
    let cma_listen = rdma_cm::listen(env, p.port);
    let sid = ib_core::cma::service_id(ib_core::cma::PortSpace::Tcp, p.port);
    let rdma_cm = match cma_listen {
        Some(_) => None,
        None => ib_core::cm::listen(env.core, env.cm, env.dev, sid).ok(),
    };
    let end = Deadline::after(env.core.clock(), CONNECT_TIMEOUT);
    let r = loop {
        if let Some(s) = tcp {
            let ip = env.ip.as_deref_mut().ok_or("no IP stack")?;
            ip.poll(env.core);
            if ip.established(s).unwrap_or(false) {
                break Ok(Incoming::Tcp(s));
            }
        }
        if let Some(l) = cma_listen
            && let Some(child) = rdma_cm::poll_listener(env, l)
        {
            break Ok(Incoming::RdmaCm(l, child));
        }
        if let Some(l) = rdma_cm
            && let Ok(ib_core::cm::CmEvent::ReqReceived { id, .. }) =
                ib_core::cm::wait_event(env.core, env.cm, l, Duration::from_millis(1))
        {
            let _ = ib_core::cm::send_rej(env.core, env.cm, id, 28, &[], &[]);
            let _ = ib_core::cm::destroy_id(env.core, env.cm, id);
            break Err(String::from(
                "a client asked for rdma_cm (-R), which needs the RDMA CM and IPoIB here: run the client without -R (perftest's TCP exchange)",
            ));
        }
        match ib_core::cm::wait_event(env.core, env.cm, listen, Duration::from_millis(5)) {
            Ok(ev) => break Ok(Incoming::Cm(ev)),
            Err(ib_core::Error::TimedOut) => {}
            Err(x) => break Err(e("a client's CM REQ", x)),
        }
        if (env.interrupted)() {
            break Err(String::from(
                "interrupted while waiting for a client's CM REQ or TCP connection",
            ));
        }
        if end.expired(env.core.clock()) {
            break Err(format!(
                "waited {} s for a client (CM REQ or TCP connection on port {}); none came",
                CONNECT_TIMEOUT.as_secs(),
                p.port
            ));
        }
    };
    if let Some(l) = rdma_cm {
        let _ = ib_core::cm::destroy_id(env.core, env.cm, l);
    }
    if let Some(l) = cma_listen
        && !matches!(r, Ok(Incoming::RdmaCm(..)))
    {
        rdma_cm::unlisten(env, l);
    }
    if let (Some(s), r2) = (tcp, &r)
        && !matches!(r2, Ok(Incoming::Tcp(_)))
    {
        close(env, s);
    }
    r
}
