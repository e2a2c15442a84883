//! rdma-core's `rping` (librdmacm/examples/rping.c): the RDMA CM ping-pong, speaking its protocol so that Linux's `rping` and ours run against each other in both roles.
//!
//! What it does, as rping does: the client resolves the server's address
//! and route, connects (TCP port space, port 7174 unless `-p`), and for
//! each ping fills its start buffer with `rdma-ping-N: ` and a rotating run
//! of letters, advertises it by a SEND of `{be64 addr, be32 rkey, be32
//! size}`; the server RDMA READs it, SENDs a go-ahead, takes the client's
//! second advertisement (its sink buffer) and RDMA WRITEs the data back,
//! then SENDs the go-ahead again. `-V` compares what came back with what
//! went out, `-v` prints each ping (`ping data: ...`, `server ping data:
//! ...`). The server serves one client and ends when it disconnects.
//!
//! Left out: persistent servers (`-P`), self-created QPs (`-q`), IPv6, and
//! rping's threads: one busy-polled state machine ([`Rping::step`]) moves
//! the CM events, the completions and the ping-pong, so a host test steps
//! two of them in one loop and the console runs one to the end
//! ([`run`]). rping waits forever; here every wait has a deadline (the
//! server waits [`CONNECT_TIMEOUT`] for a client, each step of a ping
//! [`OP_TIMEOUT`]) and Ctrl-C ends it.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt::Write;
use core::net::{Ipv4Addr, SocketAddrV4};
use core::task::Poll;
use core::time::Duration;

use ib_core::addr::IpNet;
use ib_core::cm_msgs::rej_reason_str;
use ib_core::cma::{self, PortSpace, RdmaCmEvent, RdmaCmEventType, RdmaCmId, RdmaConnParam};
use ib_core::verbs::{
    AccessFlags, Cq, CqInitAttr, Mr, MrPages, Pd, Qp, QpCap, QpCreateFlags, QpInitAttr, QpType,
    RecvWr, SendFlags, SendWr, Sge, SigType, Wc, WcOpcode, WcStatus, WrDetail, WrOpcode,
};
use ib_core::{ClientId, DeviceId, IbCore};

/// rping's port (`htobe16(7174)`).
pub const RPING_PORT: u16 = 7174;
/// Largest buffer (`RPING_BUFSIZE`); sizes go up to one byte less.
pub const RPING_BUFSIZE: u32 = 64 * 1024;
/// Smallest size (`RPING_MIN_BUFSIZE`: the largest `int` in decimal and
/// the message format, with their NULs).
pub const RPING_MIN_BUFSIZE: u32 = 11 + 15;
/// Send queue depth (`RPING_SQ_DEPTH`).
pub const RPING_SQ_DEPTH: u32 = 16;
/// Bytes of `struct rping_rdma_info`.
pub const RDMA_INFO_LEN: u32 = 16;
/// How long the server waits for a client, and the client for its
/// address, route and connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one step of a ping may take.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// rdma_resolve_addr's and rdma_resolve_route's timeouts in rping.
const RESOLVE_MS: u32 = 2000;
/// How long a client that disconnected waits for the DREP (to print the
/// DISCONNECT line as rping's CM thread does).
const DREP_WAIT: Duration = Duration::from_secs(2);

/// `enum test_state`, numbered as rping numbers it (its error lines print
/// the number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum TestState {
    Idle = 1,
    ConnectRequest,
    AddrResolved,
    RouteResolved,
    Connected,
    RdmaReadAdv,
    RdmaReadComplete,
    RdmaWriteAdv,
    RdmaWriteComplete,
    Disconnected,
    Error,
}

/// The options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// `-s` (true) or `-c`.
    pub server: bool,
    /// `-a`: the server's address (client), the address to bind (server;
    /// none: any).
    pub addr: Option<Ipv4Addr>,
    /// `-I`: the client's source address.
    pub source: Option<Ipv4Addr>,
    /// `-p`.
    pub port: u16,
    /// `-C` (0: forever).
    pub count: u32,
    /// `-S`.
    pub size: u32,
    /// `-v`.
    pub verbose: bool,
    /// `-V`.
    pub validate: bool,
    /// `-d`.
    pub debug: bool,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            server: false,
            addr: None,
            source: None,
            port: RPING_PORT,
            count: 0,
            size: 64,
            verbose: false,
            validate: false,
            debug: false,
        }
    }
}

/// rping's usage text.
pub fn usage() -> String {
    String::from(
        "rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]\n\
         rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]\n\
         \t-c\t\tclient side\n\
         \t-I\t\tSource address to bind to for client.\n\
         \t-s\t\tserver side.  To bind to any address with IPv6 use -a ::0\n\
         \t-v\t\tdisplay ping data to stdout\n\
         \t-V\t\tvalidate ping data\n\
         \t-d\t\tdebug printfs\n\
         \t-S size \tping data size\n\
         \t-C count\tping count times\n\
         \t-a addr\t\taddress\n\
         \t-p port\t\tport",
    )
}

impl Params {
    /// rping's options (`-vV` style groups too). `Err("")` asks for the
    /// usage.
    pub fn parse(args: &[&str]) -> Result<Params, String> {
        let mut p = Params::default();
        let mut role = None;
        let mut i = 0;
        while i < args.len() {
            let a = args[i];
            let Some(flags) = a.strip_prefix('-').filter(|f| !f.is_empty()) else {
                return Err(format!("unexpected argument '{a}'"));
            };
            for (k, c) in flags.char_indices() {
                let value = |i: &mut usize| -> Result<String, String> {
                    let rest = &flags[k + 1..];
                    if !rest.is_empty() {
                        return Ok(String::from(rest));
                    }
                    *i += 1;
                    args.get(*i)
                        .map(|s| String::from(*s))
                        .ok_or_else(|| format!("option -{c} needs a value"))
                };
                match c {
                    's' => role = Some(true),
                    'c' => role = Some(false),
                    'v' => p.verbose = true,
                    'V' => p.validate = true,
                    'd' => p.debug = true,
                    'a' | 'I' | 'p' | 'C' | 'S' => {
                        let v = value(&mut i)?;
                        match c {
                            'a' | 'I' => {
                                let ip: Ipv4Addr = v.parse().map_err(|_| {
                                    format!(
                                        "getaddrinfo failed (Name or service not known) - invalid hostname or IP address: {v}"
                                    )
                                })?;
                                if c == 'a' {
                                    p.addr = Some(ip);
                                } else {
                                    p.source = Some(ip);
                                }
                            }
                            'p' => {
                                p.port = v.parse().map_err(|_| format!("bad port '{v}'"))?;
                            }
                            'C' => {
                                let n: i64 = v.parse().map_err(|_| format!("bad count '{v}'"))?;
                                if n < 0 || n > i64::from(u32::MAX) {
                                    return Err(format!("Invalid count {n}"));
                                }
                                p.count = n as u32;
                            }
                            _ => {
                                let n: i64 = v.parse().map_err(|_| format!("bad size '{v}'"))?;
                                if n < i64::from(RPING_MIN_BUFSIZE)
                                    || n > i64::from(RPING_BUFSIZE - 1)
                                {
                                    return Err(format!(
                                        "Invalid size {n} (valid range is {RPING_MIN_BUFSIZE} to {RPING_BUFSIZE})"
                                    ));
                                }
                                p.size = n as u32;
                            }
                        }
                        break;
                    }
                    'h' => return Err(String::new()),
                    'P' => {
                        return Err(String::from("-P (persistent server) is not supported here"));
                    }
                    'q' => return Err(String::from("-q (self-created QP) is not supported here")),
                    _ => return Err(format!("unknown option -{c}")),
                }
            }
            i += 1;
        }
        p.server = role.ok_or_else(String::new)?;
        if !p.server && p.addr.is_none() {
            return Err(String::from("the client needs the server's address (-a)"));
        }
        Ok(p)
    }
}

/// The client's buffer for ping `ping`, as rping fills it: `rdma-ping-N: `
/// then letters from `start` (A to z, wrapping back to A), the last byte
/// NUL.
pub fn fill_ping(buf: &mut [u8], ping: u32, start: u8) {
    let size = buf.len();
    if size == 0 {
        return;
    }
    let head = format!("rdma-ping-{ping}: ");
    let cc = head.len().min(size - 1);
    buf[..cc].copy_from_slice(&head.as_bytes()[..cc]);
    let mut c = start;
    for b in buf.iter_mut().take(size).skip(cc) {
        *b = c;
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    buf[size - 1] = 0;
}

/// The text of a NUL-terminated buffer (what `%s` prints).
pub fn c_str(b: &[u8]) -> &str {
    let n = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    core::str::from_utf8(&b[..n]).unwrap_or("<not text>")
}

/// `struct rping_rdma_info` on the wire.
pub fn rdma_info(addr: u64, rkey: u32, size: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&addr.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.to_be_bytes());
    b[12..].copy_from_slice(&size.to_be_bytes());
    b
}

/// Reads a `struct rping_rdma_info`.
pub fn parse_rdma_info(b: &[u8]) -> Option<(u64, u32, u32)> {
    let b = b.get(..16)?;
    Some((
        u64::from_be_bytes(b[..8].try_into().ok()?),
        u32::from_be_bytes(b[8..12].try_into().ok()?),
        u32::from_be_bytes(b[12..16].try_into().ok()?),
    ))
}

// Offsets in the one DMA buffer (one MR): recv_buf, send_buf, rdma_buf,
// start_buf.
const RECV_OFF: u64 = 0;
const SEND_OFF: u64 = 64;
const RDMA_OFF: u64 = 128;

const WR_SEND: u64 = 1;
const WR_RDMA: u64 = 2;
const WR_RECV: u64 = 3;

struct Res {
    dev: DeviceId,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    buf: hal::dma::DmaBuf,
    base: u64,
    start_off: u64,
}

/// What the ping-pong waits for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Client: fill and advertise the start buffer.
    ClientSend,
    /// Client: the go-ahead after the server's READ.
    ClientWaitWriteAdv,
    /// Client: the go-ahead after the server's WRITE.
    ClientWaitWriteComplete,
    /// Server: the client's start advertisement.
    ServerWaitReadAdv,
    /// Server: the READ's completion.
    ServerWaitReadComplete,
    /// Server: the client's sink advertisement.
    ServerWaitWriteAdv,
    /// Server: the WRITE's completion.
    ServerWaitWriteComplete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Client: address then route.
    Resolving,
    /// Client: REQ sent.
    Connecting,
    /// Server: waiting for a CONNECT_REQUEST.
    Listening,
    /// Server: REP sent.
    Accepting,
    /// The ping-pong.
    Running(Step),
    /// Client: DREQ sent, waiting for the DREP.
    Closing,
}

/// One rping, client or server.
pub struct Rping {
    p: Params,
    cma: ClientId,
    /// The client's ID, or the server's listener.
    id: RdmaCmId,
    /// The server's connection.
    child: Option<RdmaCmId>,
    res: Option<Res>,
    phase: Phase,
    state: TestState,
    ping: u32,
    start: u8,
    remote: (u64, u32, u32),
    /// When the current wait gives up (ns of the core's clock).
    deadline: u64,
    /// Receives seen (their count moves the state machine).
    recvs: u64,
    /// Completion of the last RDMA READ/WRITE.
    rdma_done: bool,
    disconnected: bool,
}

fn now(core: &IbCore) -> u64 {
    core.clock().now_ns()
}

fn err(what: &str, e: impl core::fmt::Display) -> String {
    format!("{what}: {e}")
}

impl Rping {
    /// Starts: the server binds and listens, the client starts resolving
    /// the server's address. Prints nothing unless `-d`.
    pub fn start(
        core: &mut IbCore,
        cma: ClientId,
        net: &mut dyn IpNet,
        p: &Params,
        out: &mut dyn Write,
    ) -> Result<Rping, String> {
        let id = cma::create_id(core, cma, PortSpace::Tcp).map_err(|e| err("rdma_create_id", e))?;
        if p.debug {
            let _ = writeln!(out, "created cm_id {}", id.0);
        }
        let mut r = Rping {
            p: p.clone(),
            cma,
            id,
            child: None,
            res: None,
            phase: Phase::Resolving,
            state: TestState::Idle,
            ping: 0,
            start: 65,
            remote: (0, 0, 0),
            deadline: now(core) + CONNECT_TIMEOUT.as_nanos() as u64,
            recvs: 0,
            rdma_done: false,
            disconnected: false,
        };
        let res = if p.server {
            r.phase = Phase::Listening;
            // rping_bind_server: net_poll first, so the bind sees the
            // device's addresses.
            cma::net_poll(core, cma, net);
            let a = SocketAddrV4::new(p.addr.unwrap_or(Ipv4Addr::UNSPECIFIED), p.port);
            cma::bind_addr(core, cma, id, a)
                .map_err(|e| err("rdma_bind_addr", e))
                .and_then(|_| cma::listen(core, cma, id, 3).map_err(|e| err("rdma_listen", e)))
        } else {
            let dst = SocketAddrV4::new(p.addr.unwrap_or(Ipv4Addr::UNSPECIFIED), p.port);
            let src = p.source.map(|s| SocketAddrV4::new(s, 0));
            cma::resolve_addr(core, cma, net, id, src, dst, RESOLVE_MS)
                .map_err(|e| err("rdma_resolve_addr", errno_text(e.to_errno())))
        };
        if let Err(e) = res {
            let _ = cma::destroy_id(core, cma, id);
            return Err(e);
        }
        Ok(r)
    }

    /// Whether this is the server.
    pub fn is_server(&self) -> bool {
        self.p.server
    }

    /// Pings done so far.
    pub fn pings(&self) -> u32 {
        self.ping
    }

    /// One step: the CM's events, the completions, the next move. Never
    /// waits. `Ready` once the run is over (the server: its client
    /// disconnected; the client: its count done and disconnected).
    pub fn step(&mut self, core: &mut IbCore, out: &mut dyn Write) -> Poll<Result<(), String>> {
        match self.step_inner(core, out) {
            Ok(true) => Poll::Ready(Ok(())),
            Ok(false) => Poll::Pending,
            Err(e) => {
                self.state = TestState::Error;
                Poll::Ready(Err(e))
            }
        }
    }

    fn cm_event(&mut self, core: &mut IbCore) -> Option<RdmaCmEvent> {
        if let Some(c) = self.child
            && let Some(e) = cma::get_cm_event(core, self.cma, c)
        {
            return Some(e);
        }
        cma::get_cm_event(core, self.cma, self.id)
    }

    fn step_inner(&mut self, core: &mut IbCore, out: &mut dyn Write) -> Result<bool, String> {
        // rping_cma_event_handler.
        while let Some(ev) = self.cm_event(core) {
            if self.p.debug {
                let _ = writeln!(
                    out,
                    "cma_event type {} cma_id {} ({})",
                    ev.event.name(),
                    ev.id.0,
                    if ev.id == self.id { "parent" } else { "child" }
                );
            }
            match ev.event {
                RdmaCmEventType::AddrResolved => {
                    self.state = TestState::AddrResolved;
                    cma::resolve_route(core, self.cma, self.id, RESOLVE_MS)
                        .map_err(|e| err("rdma_resolve_route", e))?;
                }
                RdmaCmEventType::RouteResolved => {
                    self.state = TestState::RouteResolved;
                    self.client_connect(core, out)?;
                }
                RdmaCmEventType::ConnectRequest => {
                    if self.child.is_some() {
                        // One client at a time, as rping without -P.
                        let _ = cma::reject(core, self.cma, ev.id, &[]);
                        let _ = cma::destroy_id(core, self.cma, ev.id);
                        continue;
                    }
                    self.state = TestState::ConnectRequest;
                    self.child = Some(ev.id);
                    self.server_accept(core, ev.id, out)?;
                }
                RdmaCmEventType::Established => {
                    if !self.p.server {
                        self.state = TestState::Connected;
                        if self.p.debug {
                            let _ = writeln!(out, "rdma_connect successful");
                        }
                        self.phase = Phase::Running(Step::ClientSend);
                    } else {
                        self.phase = Phase::Running(Step::ServerWaitReadAdv);
                    }
                    self.deadline = now(core) + OP_TIMEOUT.as_nanos() as u64;
                }
                RdmaCmEventType::AddrError
                | RdmaCmEventType::RouteError
                | RdmaCmEventType::ConnectError
                | RdmaCmEventType::Unreachable
                | RdmaCmEventType::Rejected => {
                    let _ = writeln!(out, "cma event {}, error {}", ev.event.name(), ev.status);
                    return Err(explain(&ev, &self.p));
                }
                RdmaCmEventType::Disconnected => {
                    let _ = writeln!(
                        out,
                        "{} DISCONNECT EVENT...",
                        if self.p.server { "server" } else { "client" }
                    );
                    self.state = TestState::Disconnected;
                    self.disconnected = true;
                }
                RdmaCmEventType::DeviceRemoval => {
                    let _ = writeln!(out, "cma detected device removal!!!!");
                    return Err(String::from("the device went away"));
                }
                other => {
                    let _ = writeln!(out, "unhandled event: {}, ignoring", other.name());
                }
            }
        }
        self.poll_cq(core, out)?;
        match self.phase {
            Phase::Closing => {
                return Ok(self.disconnected || now(core) >= self.deadline);
            }
            Phase::Running(_) if self.p.server && self.disconnected => return Ok(true),
            Phase::Running(_) if self.disconnected => {
                return Err(format!(
                    "the server disconnected after {} of {} pings",
                    self.ping, self.p.count
                ));
            }
            Phase::Running(s) => self.drive(core, s, out)?,
            _ => {}
        }
        if now(core) >= self.deadline {
            return Err(match self.phase {
                Phase::Listening => {
                    format!("no client connected in {} s", CONNECT_TIMEOUT.as_secs())
                }
                Phase::Resolving => String::from("address or route resolution never finished"),
                Phase::Connecting | Phase::Accepting => {
                    String::from("the connection was not made in time")
                }
                Phase::Running(s) => format!(
                    "ping {}: nothing from the peer in {} s (waiting at {s:?}, state {})",
                    self.ping,
                    OP_TIMEOUT.as_secs(),
                    self.state as u8
                ),
                Phase::Closing => String::new(),
            });
        }
        Ok(false)
    }

    /// rping_setup_qp + rping_setup_buffers on the ID's device.
    fn setup(&mut self, core: &mut IbCore, id: RdmaCmId) -> Result<(), String> {
        let info = cma::query(core, self.cma, id).map_err(|e| err("rdma_cm query", e))?;
        let (dev, _) = info.port.ok_or("the ID has no device")?;
        let d = core.device_mut(dev).ok_or("the device is gone")?;
        let pd = d.alloc_pd().map_err(|e| err("ibv_alloc_pd failed", e))?;
        let cq = match d.create_cq(&CqInitAttr {
            cqe: RPING_SQ_DEPTH * 2,
            comp_vector: 0,
        }) {
            Ok((cq, _)) => cq,
            Err(e) => {
                let _ = d.dealloc_pd(pd);
                return Err(err("ibv_create_cq failed", e));
            }
        };
        // A server reads whatever size its client advertises (rping's
        // server would overrun a buffer of its own -S): room for the
        // largest.
        let size = if self.p.server {
            u64::from(RPING_BUFSIZE)
        } else {
            u64::from(self.p.size)
        };
        let start_off = (RDMA_OFF + size).next_multiple_of(64);
        let len = start_off + size;
        let pages = len.div_ceil(4096);
        let undo = |d: &mut ib_core::Device| {
            let _ = d.destroy_cq(cq);
            let _ = d.dealloc_pd(pd);
        };
        let buf = match d.provider().dma_pool().alloc_pages(pages as usize) {
            Ok(b) => b,
            Err(e) => {
                undo(d);
                return Err(err("rdma_buf malloc failed", e));
            }
        };
        let base = buf.bus_addr().0;
        let list: Vec<u64> = (0..pages).map(|i| base + i * 4096).collect();
        let mr = match d.reg_mr(
            pd,
            &MrPages {
                pages: &list,
                page_shift: 12,
                iova: base,
                length: pages * 4096,
                access: AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_WRITE,
            },
        ) {
            Ok(m) => m,
            Err(e) => {
                undo(d);
                return Err(err("rdma_buf reg_mr failed", e));
            }
        };
        let attr = QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: RPING_SQ_DEPTH,
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
        let qp = match cma::create_qp(core, self.cma, id, pd, &attr) {
            Ok(q) => q,
            Err(e) => {
                if let Some(d) = core.device_mut(dev) {
                    let _ = d.dereg_mr(mr);
                    undo(d);
                }
                return Err(err("rdma_create_qp", e));
            }
        };
        self.res = Some(Res {
            dev,
            pd,
            cq,
            qp,
            mr,
            buf,
            base,
            start_off,
        });
        self.post_recv(core)
    }

    fn post_recv(&mut self, core: &mut IbCore) -> Result<(), String> {
        let r = self.res.as_ref().ok_or("no QP")?;
        let sge = [Sge {
            addr: r.base + RECV_OFF,
            length: RDMA_INFO_LEN,
            lkey: r.mr.lkey,
        }];
        core.device_mut(r.dev)
            .ok_or("the device is gone")?
            .post_recv(
                r.qp,
                &[RecvWr {
                    wr_id: WR_RECV,
                    sg_list: &sge,
                }],
            )
            .map_err(|e| err("ibv_post_recv failed", e))
    }

    fn post(
        &mut self,
        core: &mut IbCore,
        opcode: WrOpcode,
        local_off: u64,
        len: u32,
        detail: WrDetail,
    ) -> Result<(), String> {
        let r = self.res.as_ref().ok_or("no QP")?;
        let sge = [Sge {
            addr: r.base + local_off,
            length: len,
            lkey: r.mr.lkey,
        }];
        let wr = SendWr {
            wr_id: if opcode == WrOpcode::Send {
                WR_SEND
            } else {
                WR_RDMA
            },
            sg_list: &sge,
            opcode,
            send_flags: SendFlags::SIGNALED,
            wr: detail,
            ..SendWr::default()
        };
        core.device_mut(r.dev)
            .ok_or("the device is gone")?
            .post_send(r.qp, core::slice::from_ref(&wr))
            .map_err(|e| format!("post send error {}", e.error.to_errno()))
    }

    /// rping_format_send + the SEND of `{addr, rkey, size}` of the buffer
    /// at `off`.
    fn send_info(&mut self, core: &mut IbCore, off: u64) -> Result<(), String> {
        let r = self.res.as_ref().ok_or("no QP")?;
        let info = rdma_info(r.base + off, r.mr.rkey, self.p.size);
        r.buf.write_bytes(SEND_OFF as usize, &info);
        self.post(
            core,
            WrOpcode::Send,
            SEND_OFF,
            RDMA_INFO_LEN,
            WrDetail::None,
        )
    }

    /// The go-ahead: the server's send_buf as it is (rping never fills it).
    fn send_go_ahead(&mut self, core: &mut IbCore) -> Result<(), String> {
        self.post(
            core,
            WrOpcode::Send,
            SEND_OFF,
            RDMA_INFO_LEN,
            WrDetail::None,
        )
    }

    fn client_connect(&mut self, core: &mut IbCore, out: &mut dyn Write) -> Result<(), String> {
        if self.p.debug {
            let _ = writeln!(out, "rdma_resolve_addr - rdma_resolve_route successful");
        }
        self.setup(core, self.id)?;
        let param = RdmaConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            ..RdmaConnParam::default()
        };
        cma::connect(core, self.cma, self.id, &param).map_err(|e| err("rdma_connect", e))?;
        self.phase = Phase::Connecting;
        Ok(())
    }

    fn server_accept(
        &mut self,
        core: &mut IbCore,
        child: RdmaCmId,
        out: &mut dyn Write,
    ) -> Result<(), String> {
        if self.p.debug {
            let _ = writeln!(out, "child cma {}", child.0);
        }
        self.setup(core, child)?;
        if self.p.debug {
            let _ = writeln!(out, "accepting client connection request");
        }
        cma::accept(core, self.cma, child, None).map_err(|e| err("rdma_accept", e))?;
        self.phase = Phase::Accepting;
        self.deadline = now(core) + CONNECT_TIMEOUT.as_nanos() as u64;
        Ok(())
    }

    /// rping_cq_event_handler.
    fn poll_cq(&mut self, core: &mut IbCore, out: &mut dyn Write) -> Result<(), String> {
        let Some(r) = self.res.as_ref() else {
            return Ok(());
        };
        let (dev, cq) = (r.dev, r.cq);
        let mut wc = [Wc::default(); 4];
        loop {
            let n = core
                .device_mut(dev)
                .ok_or("the device is gone")?
                .poll_cq(cq, &mut wc)
                .map_err(|e| format!("poll error {}", e.to_errno()))?;
            if n == 0 {
                return Ok(());
            }
            for w in &wc[..n] {
                if w.status != WcStatus::Success {
                    if w.status == WcStatus::WrFlushErr {
                        continue;
                    }
                    let _ = writeln!(out, "cq completion failed status {}", w.status as u32);
                    return Err(format!(
                        "cq completion failed status {} ({:?}, WR {})",
                        w.status as u32, w.status, w.wr_id
                    ));
                }
                match w.opcode {
                    WcOpcode::Send => {
                        if self.p.debug {
                            let _ = writeln!(out, "send completion");
                        }
                    }
                    WcOpcode::RdmaWrite | WcOpcode::RdmaRead => {
                        self.rdma_done = true;
                        self.state = if w.opcode == WcOpcode::RdmaRead {
                            TestState::RdmaReadComplete
                        } else {
                            TestState::RdmaWriteComplete
                        };
                    }
                    WcOpcode::Recv => {
                        if w.byte_len != RDMA_INFO_LEN {
                            let _ = writeln!(out, "Received bogus data, size {}", w.byte_len);
                            return Err(format!("Received bogus data, size {}", w.byte_len));
                        }
                        if self.p.server {
                            let r = self.res.as_ref().ok_or("no QP")?;
                            let mut b = [0u8; 16];
                            r.buf.read_bytes(RECV_OFF as usize, &mut b);
                            self.remote = parse_rdma_info(&b).unwrap_or_default();
                            if self.p.debug {
                                let _ = writeln!(
                                    out,
                                    "Received rkey {:x} addr {:x} len {} from peer",
                                    self.remote.1, self.remote.0, self.remote.2
                                );
                            }
                            self.state = if self.state <= TestState::Connected
                                || self.state == TestState::RdmaWriteComplete
                            {
                                TestState::RdmaReadAdv
                            } else {
                                TestState::RdmaWriteAdv
                            };
                        } else {
                            self.state = if self.state == TestState::RdmaReadAdv {
                                TestState::RdmaWriteAdv
                            } else {
                                TestState::RdmaWriteComplete
                            };
                        }
                        self.recvs += 1;
                        self.post_recv(core)?;
                    }
                    other => {
                        return Err(format!("unknown completion {other:?}"));
                    }
                }
            }
        }
    }

    fn set_step(&mut self, core: &IbCore, s: Step) {
        self.phase = Phase::Running(s);
        self.deadline = now(core) + OP_TIMEOUT.as_nanos() as u64;
    }

    /// rping_test_client / rping_test_server, one move at a time.
    fn drive(&mut self, core: &mut IbCore, s: Step, out: &mut dyn Write) -> Result<(), String> {
        let size = self.p.size as usize;
        match s {
            Step::ClientSend => {
                if self.p.count != 0 && self.ping >= self.p.count {
                    // rping_disconnect.
                    cma::disconnect(core, self.cma, self.id)
                        .map_err(|e| err("rdma_disconnect", e))?;
                    self.phase = Phase::Closing;
                    self.deadline = now(core) + DREP_WAIT.as_nanos() as u64;
                    return Ok(());
                }
                self.state = TestState::RdmaReadAdv;
                let r = self.res.as_ref().ok_or("no QP")?;
                let mut m = vec![0u8; size];
                fill_ping(&mut m, self.ping, self.start);
                r.buf.write_bytes(r.start_off as usize, &m);
                self.start += 1;
                if self.start > 122 {
                    self.start = 65;
                }
                let off = r.start_off;
                self.send_info(core, off)?;
                self.set_step(core, Step::ClientWaitWriteAdv);
            }
            Step::ClientWaitWriteAdv => {
                if self.state == TestState::RdmaWriteAdv {
                    self.send_info(core, RDMA_OFF)?;
                    self.set_step(core, Step::ClientWaitWriteComplete);
                } else if self.state != TestState::RdmaReadAdv {
                    return Err(format!(
                        "wait for RDMA_WRITE_ADV state {}",
                        self.state as u8
                    ));
                }
            }
            Step::ClientWaitWriteComplete => {
                if self.state == TestState::RdmaWriteComplete {
                    let r = self.res.as_ref().ok_or("no QP")?;
                    let mut sent = vec![0u8; size];
                    let mut got = vec![0u8; size];
                    r.buf.read_bytes(r.start_off as usize, &mut sent);
                    r.buf.read_bytes(RDMA_OFF as usize, &mut got);
                    if self.p.validate && sent != got {
                        let _ = writeln!(out, "data mismatch!");
                        return Err(format!("ping {}: data mismatch!", self.ping));
                    }
                    if self.p.verbose {
                        let _ = writeln!(out, "ping data: {}", c_str(&got));
                    }
                    self.ping += 1;
                    self.set_step(core, Step::ClientSend);
                    return self.drive(core, Step::ClientSend, out);
                } else if self.state != TestState::RdmaWriteAdv {
                    return Err(format!(
                        "wait for RDMA_WRITE_COMPLETE state {}",
                        self.state as u8
                    ));
                }
            }
            Step::ServerWaitReadAdv => {
                if self.state == TestState::RdmaReadAdv {
                    let (addr, rkey, len) = self.remote;
                    if len > RPING_BUFSIZE {
                        return Err(format!(
                            "the client advertises {len} bytes, more than {RPING_BUFSIZE}"
                        ));
                    }
                    self.rdma_done = false;
                    self.post(
                        core,
                        WrOpcode::RdmaRead,
                        RDMA_OFF,
                        len,
                        WrDetail::Rdma {
                            remote_addr: addr,
                            rkey,
                        },
                    )?;
                    self.set_step(core, Step::ServerWaitReadComplete);
                }
            }
            Step::ServerWaitReadComplete => {
                if self.state == TestState::RdmaReadComplete {
                    if self.p.verbose {
                        let r = self.res.as_ref().ok_or("no QP")?;
                        let mut got = vec![0u8; self.remote.2 as usize];
                        r.buf.read_bytes(RDMA_OFF as usize, &mut got);
                        let _ = writeln!(out, "server ping data: {}", c_str(&got));
                    }
                    self.send_go_ahead(core)?;
                    self.set_step(core, Step::ServerWaitWriteAdv);
                } else if self.state != TestState::RdmaReadAdv {
                    return Err(format!(
                        "wait for RDMA_READ_COMPLETE state {}",
                        self.state as u8
                    ));
                }
            }
            Step::ServerWaitWriteAdv => {
                if self.state == TestState::RdmaWriteAdv {
                    let (addr, rkey, _) = self.remote;
                    let r = self.res.as_ref().ok_or("no QP")?;
                    let n = self.remote.2.min(RPING_BUFSIZE) as usize;
                    let mut got = vec![0u8; n];
                    r.buf.read_bytes(RDMA_OFF as usize, &mut got);
                    // strlen(rdma_buf) + 1 (of what the READ brought).
                    let len = got.iter().position(|&x| x == 0).map_or(n, |k| k + 1) as u32;
                    self.rdma_done = false;
                    self.post(
                        core,
                        WrOpcode::RdmaWrite,
                        RDMA_OFF,
                        len,
                        WrDetail::Rdma {
                            remote_addr: addr,
                            rkey,
                        },
                    )?;
                    self.set_step(core, Step::ServerWaitWriteComplete);
                } else if self.state != TestState::RdmaReadComplete {
                    return Err(format!(
                        "wait for RDMA_WRITE_ADV state {}",
                        self.state as u8
                    ));
                }
            }
            Step::ServerWaitWriteComplete => {
                if self.state == TestState::RdmaWriteComplete {
                    self.ping += 1;
                    self.send_go_ahead(core)?;
                    self.set_step(core, Step::ServerWaitReadAdv);
                }
            }
        }
        Ok(())
    }

    /// Tears down what is left (QP, CQ, MR, PD, the IDs); a server that
    /// ends early disconnects its client first (rping_disconnect).
    pub fn finish(mut self, core: &mut IbCore) {
        if let Some(c) = self.child.take() {
            let _ = cma::disconnect(core, self.cma, c);
            let _ = cma::destroy_id(core, self.cma, c);
        }
        if !self.p.server && self.phase != Phase::Closing {
            let _ = cma::disconnect(core, self.cma, self.id);
        }
        if let Some(r) = self.res.take()
            && let Some(d) = core.device_mut(r.dev)
        {
            let _ = d.destroy_qp(r.qp);
            let _ = d.dereg_mr(r.mr);
            let _ = d.destroy_cq(r.cq);
            let _ = d.dealloc_pd(r.pd);
            drop(r.buf);
        }
        let _ = cma::destroy_id(core, self.cma, self.id);
    }
}

/// What an error event means, in words.
fn explain(ev: &RdmaCmEvent, p: &Params) -> String {
    let peer = match p.addr {
        Some(a) => format!("{a} port {}", p.port),
        None => format!("port {}", p.port),
    };
    match ev.event {
        RdmaCmEventType::Rejected => format!(
            "{peer} rejected the connection ({}{})",
            rej_reason_str(ev.status as u16),
            match ev.status {
                8 => ": nobody listens there",
                28 => ": the peer's RDMA CM refused the request",
                _ => "",
            }
        ),
        RdmaCmEventType::Unreachable if ev.status == -110 => {
            format!("{peer} never answered the connection request (timed out)")
        }
        RdmaCmEventType::AddrError if ev.status == -110 => {
            format!("no ARP answer from {peer}: address resolution timed out")
        }
        _ => format!(
            "{} ({}) towards {peer}",
            ev.event.msg(),
            errno_text(ev.status)
        ),
    }
}

/// strerror for the errnos the RDMA CM reports.
pub fn errno_text(e: i32) -> &'static str {
    match -e {
        19 => "No such device",
        22 => "Invalid argument",
        98 => "Address already in use",
        99 => "Cannot assign requested address",
        101 => "Network is unreachable",
        104 => "Connection reset by peer",
        110 => "Connection timed out",
        111 => "Connection refused",
        113 => "No route to host",
        _ => "error",
    }
}

/// What a console run needs: the core, the RDMA CM, the IP stack and
/// Ctrl-C.
pub struct Env<'a> {
    /// The core.
    pub core: &'a mut IbCore,
    /// The RDMA CM (`cma::init`).
    pub cma: ClientId,
    /// The IP stack.
    pub net: &'a mut dyn IpNet,
    /// Ctrl-C: true once the user asked to stop.
    pub interrupted: &'a mut dyn FnMut() -> bool,
}

/// Runs one rping to its end: the core, the IP stack and the RDMA CM's
/// turn with it polled between the steps.
pub fn run(env: &mut Env<'_>, p: &Params, out: &mut dyn Write) -> Result<(), String> {
    let mut r = Rping::start(env.core, env.cma, env.net, p, out)?;
    let res = loop {
        env.core.poll();
        env.net.poll(env.core);
        cma::net_poll(env.core, env.cma, env.net);
        if let Poll::Ready(x) = r.step(env.core, out) {
            break x;
        }
        if (env.interrupted)() {
            break Err(String::from("interrupted"));
        }
    };
    let res = res.map_err(|e| {
        if p.server {
            format!("rping server failed: {e}")
        } else {
            format!("rping client failed: {e}")
        }
    });
    r.finish(env.core);
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_as_rping_takes_them() {
        let p = Params::parse(&["-c", "-a", "10.0.0.2", "-C", "100", "-S", "128", "-vV"]).unwrap();
        assert!(!p.server && p.verbose && p.validate);
        assert_eq!((p.count, p.size, p.port), (100, 128, RPING_PORT));
        assert_eq!(p.addr, Some(Ipv4Addr::new(10, 0, 0, 2)));
        let s = Params::parse(&["-s", "-p", "9000"]).unwrap();
        assert!(s.server && s.addr.is_none());
        assert_eq!(s.port, 9000);
        assert_eq!(
            Params::parse(&["-sa10.0.0.1"]).unwrap().addr,
            Some(Ipv4Addr::new(10, 0, 0, 1))
        );
        assert_eq!(
            Params::parse(&["-c", "-a", "1.2.3.4", "-S", "10"]).unwrap_err(),
            "Invalid size 10 (valid range is 26 to 65536)"
        );
        assert_eq!(Params::parse(&["-v"]).unwrap_err(), "");
        assert!(Params::parse(&["-c"]).is_err());
        assert!(Params::parse(&["-c", "-a", "nowhere"]).is_err());
        assert!(Params::parse(&["-s", "-P"]).is_err());
        assert!(Params::parse(&["-s", "-C", "-1"]).is_err());
    }

    #[test]
    fn ping_buffers_are_rpings() {
        let mut b = [0u8; 30];
        fill_ping(&mut b, 0, 65);
        assert_eq!(c_str(&b), "rdma-ping-0: ABCDEFGHIJKLMNOP");
        assert_eq!(b[29], 0);
        fill_ping(&mut b, 12, 120);
        assert_eq!(c_str(&b), "rdma-ping-12: xyzABCDEFGHIJKL");
        let mut small = [0u8; 26];
        fill_ping(&mut small, 1_000_000_000, 65);
        assert_eq!(c_str(&small), "rdma-ping-1000000000: ABC");
        let info = rdma_info(0x1122_3344_5566_7788, 0xabcd, 64);
        assert_eq!(
            &info[..8],
            &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
        );
        assert_eq!(&info[8..], &[0, 0, 0xab, 0xcd, 0, 0, 0, 64]);
        assert_eq!(
            parse_rdma_info(&info),
            Some((0x1122_3344_5566_7788, 0xabcd, 64))
        );
        assert_eq!(parse_rdma_info(&info[..15]), None);
    }
}
