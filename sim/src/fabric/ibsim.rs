//! ibsim's server protocol, so that unmodified OpenSM and infiniband-diags attach to our fabric.
//!
//! ibsim's server protocol (ibsim 0.10, local mode: AF_UNIX datagram
//! sockets in the abstract namespace), so that unmodified OpenSM and
//! infiniband-diags, run under `LD_PRELOAD=libumad2sim.so`, attach to our
//! fabric as clients of [`HostNode`]s; left out: ibsim's remote (UDP)
//! mode, its console, and its own SMA/PMA for every node (here each node
//! answers for itself: host nodes through their model SMA/PMA, switches
//! through theirs, HCAs through their QP0/QP1 and driver).
//!
//! A request for QP0 or QP1 of a host node that its SMA or PMA does not
//! answer goes to the node's SM client only if OpenSM registered an agent
//! for its class, version and method ([`sm_takes`]); otherwise the node's
//! MAD layer answers a Get or Set with status 0x000C and drops the rest,
//! as a real host's does, so no peer's traffic reaches (and, through
//! umad2sim, crashes) OpenSM.
//!
//! The server is polled ([`IbsimServer::poll`]) from whatever drives the
//! fabric and never blocks. Every client request either gets its answer
//! or, when none comes within [`IbsimServer::timeout`], comes back with
//! status 110 (ETIMEDOUT), because umad2sim has no timeouts of its own.
//!
//! Message layouts (host byte order where ibsim uses it; see
//! `docs/peers.md`): control `struct sim_ctl` (80 bytes), data
//! `struct sim_request` (288 bytes). Transaction ids: requests from a
//! client get the client slot in TID bits 48..63 (as ibsim does); the
//! response a client receives carries its original TID again.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

use super::Fabric;
use super::host_node::{Handled, HostNode, Mad};
use crate::fabric::packet::{MAD_LEN, MadHdr, method, mgmt_class};

/// Client slots of one server (IBSIM_MAX_CLIENTS).
pub const MAX_CLIENTS: usize = 10;
/// `struct sim_ctl` size.
pub const CTL_LEN: usize = 80;
/// `struct sim_request` size.
pub const REQ_LEN: usize = 288;
/// `sim_ctl.magic`.
pub const SIM_MAGIC: u32 = 0xdead_beef;
/// The status a request comes back with when nobody answered it.
pub const ETIMEDOUT: u32 = 110;
/// Requests waiting for a response, at most (past it a request is bounced
/// at once).
pub const MAX_PENDING: usize = 4096;
/// Messages taken from one socket per poll, at most.
const BATCH: usize = 64;
/// Passes over the host nodes per poll, at most.
const ROUNDS: usize = 8;

/// `sim_ctl.type` values.
pub mod ctl {
    /// The reply type of a failed request.
    pub const ERROR: u32 = 0;
    /// Attach a client (data: `struct sim_client_info`).
    pub const CONNECT: u32 = 1;
    /// Detach.
    pub const DISCONNECT: u32 = 2;
    /// `{u16 lid, u8 state}`.
    pub const GET_PORT: u32 = 3;
    /// `struct sim_vendor`.
    pub const GET_VENDOR: u32 = 4;
    /// GID prefix and port GUID.
    pub const GET_GID: u32 = 5;
    /// Node GUID (host order).
    pub const GET_GUID: u32 = 6;
    /// NodeInfo (wire format).
    pub const GET_NODEINFO: u32 = 7;
    /// PortInfo (wire format).
    pub const GET_PORTINFO: u32 = 8;
    /// Sets or clears IsSM (data: host int).
    pub const SET_ISSM: u32 = 9;
    /// 32 P_Keys, big-endian.
    pub const GET_PKEYS: u32 = 10;
}

/// Counters of what the server did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Control messages handled.
    pub ctl: u64,
    /// MADs received from clients.
    pub from_clients: u64,
    /// Client SMPs (either class) put on the wire or answered in the node.
    pub client_smps: u64,
    /// MADs sent to clients (answers, forwarded requests, bounces).
    pub to_clients: u64,
    /// Traps (SubnTrap) handed to an SM client.
    pub traps_to_sm: u64,
    /// Traps 144 host nodes sent when an SM client came or went (IsSM).
    pub traps_from_nodes: u64,
    /// Gets and Sets no client's agent takes, answered by the node's MAD
    /// layer with status 0x000C ([`HostNode::unsupported_reply`]).
    pub unsupported_replies: u64,
    /// Requests returned with status 110 after the timeout.
    pub timeouts: u64,
    /// Requests returned with status 110 at once (no route, nobody to
    /// handle them, bad MAD).
    pub bounced: u64,
    /// MADs dropped, by reason.
    pub dropped: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Clone)]
struct Client {
    pid: u32,
    node: usize,
    qp: u32,
    issm: bool,
}

#[derive(Debug, Clone)]
struct Pending {
    node: usize,
    tid: u64,
    orig_tid: u64,
    slot: usize,
    deadline: Instant,
    req: Mad,
}

/// A client as the server sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    /// Slot (the `clientid`).
    pub slot: usize,
    /// The id it connected with (umad2sim: its pid).
    pub pid: u32,
    /// The node it is attached to.
    pub node: String,
    /// Whether it is the node's SM.
    pub issm: bool,
}

/// The ibsim server of one fabric.
#[derive(Debug)]
pub struct IbsimServer {
    base: String,
    ctl: UnixDatagram,
    outs: Vec<UnixDatagram>,
    clients: Vec<Option<Client>>,
    nodes: Vec<HostNode>,
    pending: Vec<Pending>,
    /// How long a request may wait for its response before it comes back
    /// with status 110. OpenSM's own transaction timeout (200 ms) by
    /// default.
    pub timeout: Duration,
    stats: ServerStats,
}

/// The abstract socket address ibsim uses for `name` (its trailing NUL is
/// part of the name).
pub fn abstract_addr(name: &str) -> std::io::Result<SocketAddr> {
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    SocketAddr::from_abstract_name(&n)
}

fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// Reads a `struct sim_request`: the MAD with its addressing, and the
/// status.
pub fn decode_request(b: &[u8; REQ_LEN]) -> (Mad, u32) {
    let len = u64::from_be_bytes(b[24..32].try_into().unwrap_or([0; 8]));
    let mut data = [0u8; MAD_LEN];
    data.copy_from_slice(&b[32..32 + MAD_LEN]);
    let m = Mad {
        dlid: u16::from_be_bytes([b[0], b[1]]),
        slid: u16::from_be_bytes([b[4], b[5]]),
        dqp: be32(b, 8),
        sqp: be32(b, 12),
        sl: 0,
        pkey: crate::fabric::packet::DEFAULT_PKEY,
        len: if len == 0 || len > MAD_LEN as u64 {
            MAD_LEN
        } else {
            len as usize
        },
        data,
    };
    (m, be32(b, 16))
}

/// Writes a `struct sim_request`.
pub fn encode_request(m: &Mad, status: u32) -> [u8; REQ_LEN] {
    let mut b = [0u8; REQ_LEN];
    b[0..2].copy_from_slice(&m.dlid.to_be_bytes());
    b[4..6].copy_from_slice(&m.slid.to_be_bytes());
    b[8..12].copy_from_slice(&m.dqp.to_be_bytes());
    b[12..16].copy_from_slice(&m.sqp.to_be_bytes());
    b[16..20].copy_from_slice(&status.to_be_bytes());
    b[24..32].copy_from_slice(&(m.len.min(MAD_LEN) as u64).to_be_bytes());
    b[32..].copy_from_slice(&m.data);
    b
}

impl IbsimServer {
    /// Binds `<base>:ctl` and `<base>:out0..9` and serves `nodes` (the
    /// first is the default node of a client that names none).
    pub fn bind(base: &str, nodes: Vec<HostNode>) -> std::io::Result<IbsimServer> {
        if nodes.is_empty() {
            return Err(std::io::Error::new(
                ErrorKind::InvalidInput,
                "an ibsim server needs at least one host node",
            ));
        }
        let ctl = UnixDatagram::bind_addr(&abstract_addr(&format!("{base}:ctl"))?)?;
        ctl.set_nonblocking(true)?;
        let mut outs = Vec::with_capacity(MAX_CLIENTS);
        for i in 0..MAX_CLIENTS {
            let s = UnixDatagram::bind_addr(&abstract_addr(&format!("{base}:out{i}"))?)?;
            s.set_nonblocking(true)?;
            outs.push(s);
        }
        Ok(IbsimServer {
            base: base.into(),
            ctl,
            outs,
            clients: vec![None; MAX_CLIENTS],
            nodes,
            pending: Vec::new(),
            timeout: Duration::from_millis(200),
            stats: ServerStats::default(),
        })
    }

    /// The socket base name (`IBSIM_SOCKNAME` for the clients).
    pub fn base(&self) -> &str {
        &self.base
    }
    /// The host nodes.
    pub fn nodes(&self) -> &[HostNode] {
        &self.nodes
    }
    /// The host node named `name`.
    pub fn node(&self, name: &str) -> Option<&HostNode> {
        self.nodes.iter().find(|n| n.name == name)
    }
    /// The host node named `name`, to change.
    pub fn node_mut(&mut self, name: &str) -> Option<&mut HostNode> {
        self.nodes.iter_mut().find(|n| n.name == name)
    }
    /// What the server did so far.
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }
    /// Requests waiting for their response.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
    /// The connected clients.
    pub fn clients(&self) -> Vec<ClientInfo> {
        self.clients
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| {
                let c = c.as_ref()?;
                Some(ClientInfo {
                    slot,
                    pid: c.pid,
                    node: self.nodes.get(c.node)?.name.clone(),
                    issm: c.issm,
                })
            })
            .collect()
    }

    /// Serves: control messages, client MADs, packets reaching the host
    /// nodes, timeouts. Returns how many things happened (0: idle).
    pub fn poll(&mut self, fabric: &mut Fabric, now_ns: u64) -> usize {
        let mut work = 0;
        let mut buf = [0u8; 512];
        for _ in 0..BATCH {
            match self.ctl.recv_from(&mut buf) {
                Ok((n, from)) => {
                    work += 1;
                    self.handle_ctl(&buf[..n], &from);
                }
                Err(_) => break,
            }
        }
        for slot in 0..MAX_CLIENTS {
            if self.clients[slot].is_none() {
                continue;
            }
            for _ in 0..BATCH {
                let n = match self.outs[slot].recv(&mut buf) {
                    Ok(n) => n,
                    Err(_) => break,
                };
                work += 1;
                if n != REQ_LEN {
                    self.drop_for("client message not 288 bytes");
                    continue;
                }
                let mut req = [0u8; REQ_LEN];
                req.copy_from_slice(&buf[..REQ_LEN]);
                self.client_mad(fabric, now_ns, slot, &req);
            }
        }
        // A node whose CapabilityMask changed (an SM client came or went)
        // tells its SM: trap 144.
        for i in 0..self.nodes.len() {
            if let Some(t) = self.nodes[i].take_trap() {
                work += 1;
                self.stats.traps_from_nodes += 1;
                if t.dlid == self.nodes[i].lid() {
                    // The node's own SM (a restarted OpenSM): delivered in
                    // the node, as an HCA loops it back.
                    self.arrive(fabric, now_ns, i, t, true);
                } else if let Err(why) = self.nodes[i].transmit(fabric, now_ns, &t) {
                    self.drop_for(why);
                }
            }
        }
        // Host nodes answer each other within one poll (a request and its
        // response cross the fabric in a few rounds), bounded.
        for _ in 0..ROUNDS {
            let mut round = 0;
            for i in 0..self.nodes.len() {
                for _ in 0..BATCH {
                    let Some(r) = self.nodes[i].receive(fabric, now_ns) else {
                        break;
                    };
                    round += 1;
                    match r {
                        Ok(m) => self.arrive(fabric, now_ns, i, m, false),
                        Err(why) => self.drop_for(why),
                    }
                }
            }
            work += round;
            if round == 0 {
                break;
            }
        }
        let now = Instant::now();
        let mut k = 0;
        while k < self.pending.len() {
            if self.pending[k].deadline > now {
                k += 1;
                continue;
            }
            // (A bounce to a client that is gone drops its other pending
            // requests; the bound check above copes.)
            let p = self.pending.swap_remove(k);
            self.stats.timeouts += 1;
            self.bounce_pending(p);
            work += 1;
        }
        work
    }

    fn drop_for(&mut self, why: &'static str) {
        *self.stats.dropped.entry(why).or_default() += 1;
    }

    fn handle_ctl(&mut self, msg: &[u8], from: &SocketAddr) {
        self.stats.ctl += 1;
        let mut r = [0u8; CTL_LEN];
        let n = msg.len().min(CTL_LEN);
        r[..n].copy_from_slice(&msg[..n]);
        if msg.len() != CTL_LEN || le32(msg, 0) != SIM_MAGIC {
            // ibsim ignores these; an ERROR reply keeps a client that
            // waits for one from hanging.
            self.drop_for("bad control message (size or magic)");
            r[0..4].copy_from_slice(&SIM_MAGIC.to_le_bytes());
            r[8..12].copy_from_slice(&ctl::ERROR.to_le_bytes());
            let _ = self.ctl.send_to_addr(&r, from);
            return;
        }
        let slot = le32(msg, 4) as usize;
        let ty = le32(msg, 8);
        let ok = if ty == ctl::CONNECT {
            self.connect(&mut r)
        } else if slot >= MAX_CLIENTS || self.clients[slot].is_none() {
            // DISCONNECT of a slot already free is fine (as ibsim).
            ty == ctl::DISCONNECT && slot < MAX_CLIENTS
        } else {
            self.client_ctl(slot, ty, &mut r)
        };
        if !ok {
            r[8..12].copy_from_slice(&ctl::ERROR.to_le_bytes());
        }
        let _ = self.ctl.send_to_addr(&r, from);
    }

    fn connect(&mut self, r: &mut [u8; CTL_LEN]) -> bool {
        let d = &r[16..];
        let id = le32(d, 0);
        let qp = le32(d, 4);
        let issm = le32(d, 8) != 0;
        let name_bytes = &d[12..44];
        let end = name_bytes.iter().position(|&c| c == 0).unwrap_or(32);
        let want = String::from_utf8_lossy(&name_bytes[..end]).into_owned();
        let node = if want.is_empty() {
            Some(0)
        } else {
            self.nodes
                .iter()
                .position(|n| n.name == want)
                .or_else(|| self.nodes.iter().position(|n| n.description == want))
        };
        let Some(node) = node else {
            return false;
        };
        let Some(slot) = self.clients.iter().position(|c| c.is_none()) else {
            return false;
        };
        if issm && self.sm_client(node).is_some() {
            return false;
        }
        // Anything a previous client of this slot left unread goes.
        let mut junk = [0u8; 512];
        while self.outs[slot].recv(&mut junk).is_ok() {}
        let Ok(addr) = abstract_addr(&format!("{}:in{id}", self.base)) else {
            return false;
        };
        if self.outs[slot].connect_addr(&addr).is_err() {
            return false;
        }
        self.clients[slot] = Some(Client {
            pid: id,
            node,
            qp,
            issm,
        });
        if issm {
            self.nodes[node].set_is_sm(true);
        }
        let d = &mut r[16..];
        d[0..4].copy_from_slice(&(slot as u32).to_le_bytes());
        d[12..44].fill(0);
        for (o, c) in d[12..43].iter_mut().zip(self.nodes[node].name.bytes()) {
            *o = c;
        }
        true
    }

    fn client_ctl(&mut self, slot: usize, ty: u32, r: &mut [u8; CTL_LEN]) -> bool {
        let Some(c) = self.clients[slot].clone() else {
            return false;
        };
        let n = &mut self.nodes[c.node];
        let d = &mut r[16..];
        match ty {
            ctl::DISCONNECT => {
                self.disconnect(slot);
            }
            ctl::GET_PORT => {
                d.fill(0);
                d[0..2].copy_from_slice(&n.lid().to_le_bytes());
                d[2] = n.state() as u8;
            }
            ctl::GET_VENDOR => {
                d.fill(0);
                d[0..4].copy_from_slice(&n.vendor_id.to_le_bytes());
                d[4..8].copy_from_slice(&u32::from(n.device_id).to_le_bytes());
                d[8..12].copy_from_slice(&n.revision.to_le_bytes());
                d[16..24].copy_from_slice(&1u64.to_le_bytes());
            }
            ctl::GET_GID => {
                d.fill(0);
                d[0..8].copy_from_slice(&n.gid_prefix().to_be_bytes());
                d[8..16].copy_from_slice(&n.port_guid().to_be_bytes());
            }
            ctl::GET_GUID => {
                d.fill(0);
                d[0..8].copy_from_slice(&n.node_guid.to_le_bytes());
            }
            ctl::GET_NODEINFO => d.copy_from_slice(&n.node_info()),
            ctl::GET_PORTINFO => d.copy_from_slice(&n.port_info()),
            ctl::GET_PKEYS => {
                for (k, p) in n.pkeys().iter().take(32).enumerate() {
                    d[2 * k..2 * k + 2].copy_from_slice(&p.to_be_bytes());
                }
            }
            ctl::SET_ISSM => {
                let on = le32(d, 0) != 0;
                if on && self.sm_client(c.node).is_some_and(|s| s != slot) {
                    return false;
                }
                if let Some(cl) = self.clients[slot].as_mut() {
                    cl.issm = on;
                }
                self.nodes[c.node].set_is_sm(on);
            }
            _ => return false,
        }
        true
    }

    fn disconnect(&mut self, slot: usize) {
        let Some(c) = self.clients.get_mut(slot).and_then(Option::take) else {
            return;
        };
        if c.issm
            && let Some(n) = self.nodes.get_mut(c.node)
        {
            n.set_is_sm(false);
        }
        self.pending.retain(|p| p.slot != slot);
    }

    fn sm_client(&self, node: usize) -> Option<usize> {
        self.clients
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.node == node && c.issm))
    }

    /// Sends `m` to client `slot`; a client that is gone loses its slot.
    fn send_to_client(&mut self, slot: usize, m: &Mad, status: u32) -> bool {
        let msg = encode_request(m, status);
        match self.outs[slot].send(&msg) {
            Ok(_) => {
                self.stats.to_clients += 1;
                true
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.drop_for("client not reading (socket full)");
                false
            }
            Err(_) => {
                self.drop_for("client gone");
                self.disconnect(slot);
                false
            }
        }
    }

    fn bounce_pending(&mut self, p: Pending) {
        let mut m = p.req;
        m.set_tid(p.orig_tid);
        self.send_to_client(p.slot, &m, ETIMEDOUT);
    }

    /// Returns the request (`node`, `tid`) to its sender with status 110.
    fn bounce(&mut self, node: usize, tid: u64) {
        if let Some(k) = self
            .pending
            .iter()
            .position(|p| p.node == node && p.tid == tid)
        {
            let p = self.pending.swap_remove(k);
            self.stats.bounced += 1;
            self.bounce_pending(p);
        }
    }

    fn client_mad(&mut self, fabric: &mut Fabric, now_ns: u64, slot: usize, req: &[u8; REQ_LEN]) {
        let Some(node) = self.clients[slot].as_ref().map(|c| c.node) else {
            return;
        };
        self.stats.from_clients += 1;
        let (mut m, _) = decode_request(req);
        let h = m.hdr();
        if h.method == method::TRAP_REPRESS {
            // As ibsim: a TrapRepress goes nowhere (the switch sends each
            // trap once).
            self.drop_for("TrapRepress from a client");
            return;
        }
        if m.slid == 0 {
            m.slid = self.nodes[node].lid();
        }
        let response = m.is_response();
        let tid = m.tid();
        if !response {
            let stamped = (tid & 0x0000_ffff_ffff_ffff) | (slot as u64) << 48;
            m.set_tid(stamped);
            // A client's trap waits for its TrapRepress (OpenSM's trap 144
            // of a standby SM does, and umad2sim has no timeout to end it).
            if m.wants_response() || h.method == method::TRAP {
                if self.pending.len() >= MAX_PENDING {
                    self.stats.bounced += 1;
                    let mut b = m.clone();
                    b.set_tid(tid);
                    self.send_to_client(slot, &b, ETIMEDOUT);
                    return;
                }
                self.pending.push(Pending {
                    node,
                    tid: stamped,
                    orig_tid: tid,
                    slot,
                    deadline: Instant::now() + self.timeout,
                    req: m.clone(),
                });
            }
        }
        if h.base_version != 1 || h.class_version > 2 {
            self.drop_for("client MAD with a bad base or class version");
            self.bounce(node, m.tid());
            return;
        }
        if m.is_smp() {
            self.stats.client_smps += 1;
        }
        if self.nodes[node].is_local(&m) {
            self.arrive(fabric, now_ns, node, m, true);
            return;
        }
        if let Err(why) = self.nodes[node].transmit(fabric, now_ns, &m) {
            self.drop_for(why);
            if !response {
                self.bounce(node, m.tid());
            }
        }
    }

    /// A MAD reached host node `node`: from the wire, or from one of its
    /// own clients (`local`).
    fn arrive(&mut self, fabric: &mut Fabric, now_ns: u64, node: usize, m: Mad, local: bool) {
        if m.is_response() {
            self.response(node, m);
            return;
        }
        if m.hdr().method == method::TRAP_REPRESS {
            // The answer to a client's trap; any other goes nowhere.
            self.response(node, m);
            return;
        }
        match self.nodes[node].handle(&m) {
            Handled::Reply(r) => {
                if local {
                    self.response(node, r);
                } else if let Err(why) = self.nodes[node].transmit(fabric, now_ns, &r) {
                    self.drop_for(why);
                }
            }
            Handled::Up(m) => {
                let target = if m.dqp > 1 {
                    self.clients
                        .iter()
                        .position(|c| c.as_ref().is_some_and(|c| c.node == node && c.qp == m.dqp))
                } else if sm_takes(&m.hdr()) {
                    self.sm_client(node)
                } else {
                    None
                };
                match target {
                    Some(t) => {
                        if m.hdr().method == method::TRAP {
                            self.stats.traps_to_sm += 1;
                        }
                        if !self.send_to_client(t, &m, 0) && local {
                            self.bounce(node, m.tid());
                        }
                    }
                    None if m.dqp <= 1 => self.unmatched(fabric, now_ns, node, m, local),
                    None => {
                        self.drop_for("no one to handle the request");
                        if local {
                            self.bounce(node, m.tid());
                        }
                    }
                }
            }
            Handled::Drop(why) => {
                self.drop_for(why);
                if local {
                    self.bounce(node, m.tid());
                }
            }
        }
    }

    /// A request for QP0 or QP1 of `node` that no client's agent takes
    /// (see [`sm_takes`]): the node's MAD layer answers a Get or Set with
    /// status 0x000C and drops anything else, as a real host's does.
    fn unmatched(&mut self, fabric: &mut Fabric, now_ns: u64, node: usize, m: Mad, local: bool) {
        let Some(r) = self.nodes[node].unsupported_reply(&m) else {
            self.drop_for("no agent for the class and method");
            if local {
                self.bounce(node, m.tid());
            }
            return;
        };
        self.stats.unsupported_replies += 1;
        if local {
            self.response(node, r);
        } else if let Err(why) = self.nodes[node].transmit(fabric, now_ns, &r) {
            self.drop_for(why);
        }
    }

    /// A response reached `node`: to the client whose request it answers
    /// (same TID and class, as a MAD layer matches a response to its
    /// send).
    fn response(&mut self, node: usize, mut m: Mad) {
        let tid = m.tid();
        let class = m.hdr().mgmt_class;
        let Some(k) = self
            .pending
            .iter()
            .position(|p| p.node == node && p.tid == tid && p.req.hdr().mgmt_class == class)
        else {
            self.drop_for("response nobody waits for (late, unknown TID or class)");
            return;
        };
        let p = self.pending.swap_remove(k);
        m.set_tid(p.orig_tid);
        self.send_to_client(p.slot, &m, 0);
    }
}

/// Whether the MAD layer of a host node hands the unsolicited request
/// with header `h` to an SM client: what OpenSM registers (its ibumad
/// vendor layer's `umad_register` calls): the SM's agents for both SMP
/// classes, class version 1, as responder and trap processor (Get, Set,
/// Trap, TrapRepress), and the SA's agent, class 0x03 version 2, as
/// responder (Get, Set, GetTable, Delete). Its PerfMgr and
/// congestion-control agents register no method (they take responses to
/// their own requests only). umad2sim tells the server nothing of this
/// and crashes on a MAD of a class nobody registered, so OpenSM gets
/// only these; a real host's MAD layer delivers no more either.
pub fn sm_takes(h: &MadHdr) -> bool {
    match (h.mgmt_class, h.class_version) {
        (mgmt_class::SUBN_LID_ROUTED | mgmt_class::SUBN_DIRECTED_ROUTE, 1) => matches!(
            h.method,
            method::GET | method::SET | method::TRAP | method::TRAP_REPRESS
        ),
        (mgmt_class::SUBN_ADM, 2) => matches!(
            h.method,
            method::GET | method::SET | method::GET_TABLE | method::DELETE
        ),
        _ => false,
    }
}

/// Where a running emulator records its socket name, relative to the
/// repository (read by `scripts/ib-host.sh`).
pub const SOCKNAME_FILE: &str = "target/fabric/ibsim-sockname";

/// The node GUID of the SM host [`attach_sm_host`] adds by default.
pub const SM_HOST_GUID: u64 = 0x0002_c903_0000_0f00;

/// Adds the host node where OpenSM and the diags attach (`name`, e.g.
/// `"smhost"`): a one-port CA cabled to the highest-numbered free port of
/// switch `sw` (guests keep ports 1..N), or, with no switch, to `peer`
/// directly. The caller serves it with [`IbsimServer::bind`].
pub fn attach_sm_host(
    fabric: &mut Fabric,
    sw: Option<super::SwitchId>,
    peer: Option<super::PortId>,
    name: &str,
    node_guid: u64,
) -> Result<HostNode, String> {
    let far = match (sw, peer) {
        (Some(id), _) => {
            let n = fabric
                .switch(id)
                .ok_or_else(|| format!("no switch {}", id.0))?
                .nports();
            (1..=n)
                .rev()
                .filter_map(|p| fabric.switch_port(id, p))
                .find(|fp| fabric.peer(*fp).is_none())
                .ok_or_else(|| format!("switch {} has no free port for {name}", id.0))?
        }
        (None, Some(p)) => p,
        (None, None) => return Err("attach_sm_host: a switch or a port to cable to".into()),
    };
    let port = fabric.attach_hca_port(node_guid, 1);
    fabric.set_port_name(port, &format!("{name}/1"));
    fabric.connect(port, far).map_err(|e| e.to_string())?;
    Ok(HostNode::new(fabric, name, node_guid, port))
}

/// The command that starts OpenSM on host node `host` of the fabric
/// served under socket name `base`: Debian's opensm under the umad2sim
/// preload, its log (flushed at every line) at `dir/opensm.log`, its
/// cache and dump files in `dir` (a fresh directory gives fresh LIDs).
/// The caller spawns it, keeps the pid, and ends it before the server
/// (its exit waits for the server's DISCONNECT reply).
pub fn opensm_command(base: &str, host: &str, dir: &std::path::Path) -> std::process::Command {
    let prog = if std::path::Path::new("/usr/sbin/opensm").exists() {
        "/usr/sbin/opensm"
    } else {
        "opensm"
    };
    let mut c = std::process::Command::new(prog);
    c.env("LD_PRELOAD", UMAD2SIM)
        .env("IBSIM_SOCKNAME", base)
        .env("SIM_HOST", host)
        .env("OSM_TMP_DIR", dir)
        .env("OSM_CACHE_DIR", dir)
        .current_dir(dir)
        .arg("-d2")
        .arg("-e")
        .arg("-f")
        .arg(dir.join("opensm.log"))
        .arg("--dump_files_dir")
        .arg(dir);
    c
}

/// The umad2sim preload library of Debian's libumad2sim0.
pub const UMAD2SIM: &str = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so";

/// Host nodes for the CAs of a topology that no guest drives: HCA `i`
/// of `built` for `i >= guests` (a net file naming more CAs than
/// `--nodes`), each on its port 1, named as in the file so `SIM_HOST`
/// can name it. Pass them to [`SmService::start`] as `extra`.
pub fn host_nodes_beyond(
    fabric: &mut Fabric,
    built: &super::Built,
    guests: usize,
) -> Vec<HostNode> {
    built
        .hcas
        .iter()
        .skip(guests)
        .map(|h| HostNode::new(fabric, &h.name, h.node_guid, h.ports[0]))
        .collect()
}

/// What [`SmService::start`] sets up.
#[derive(Debug, Clone)]
pub struct SmOptions {
    /// Socket base name (unique per run, e.g. `lego-<pid>`).
    pub base: String,
    /// The switch the SM host is cabled to (its last free port) ...
    pub switch: Option<super::SwitchId>,
    /// ... or, without a switch, the port it is cabled to.
    pub peer: Option<super::PortId>,
    /// Start OpenSM on the SM host (`--sm opensm`); otherwise only the
    /// server runs (`--sm none`, or diags only).
    pub opensm: bool,
    /// Extra OpenSM arguments (e.g. `-s 1` to sweep every second).
    pub opensm_args: Vec<String>,
    /// OpenSM's log, cache and dump directory (created; e.g.
    /// `target/fabric/opensm`).
    pub dir: std::path::PathBuf,
    /// Where to record the socket name for `scripts/ib-host.sh` (e.g.
    /// [`SOCKNAME_FILE`] under the repository); removed by
    /// [`SmService::stop`].
    pub sockname_file: Option<std::path::PathBuf>,
    /// The server's request timeout.
    pub timeout: Duration,
}

/// The ibsim server of a running emulator with its SM host and, if asked
/// for, OpenSM: one thing to start, poll and stop from a single-threaded
/// main loop. Stopping keeps serving the control socket while OpenSM
/// exits (its exit waits for the DISCONNECT reply), then ends it by pid.
#[derive(Debug)]
pub struct SmService {
    /// The server.
    pub server: IbsimServer,
    opensm: Option<std::process::Child>,
    dir: std::path::PathBuf,
    sockname_file: Option<std::path::PathBuf>,
}

impl SmService {
    /// Adds the SM host ("smhost") to `fabric`, binds the server for it
    /// and `extra` host nodes, records the socket name, and starts OpenSM
    /// if asked.
    pub fn start(
        fabric: &mut Fabric,
        opts: &SmOptions,
        extra: Vec<HostNode>,
    ) -> Result<SmService, String> {
        let sm = attach_sm_host(fabric, opts.switch, opts.peer, "smhost", SM_HOST_GUID)?;
        let mut nodes = vec![sm];
        nodes.extend(extra);
        let mut server = IbsimServer::bind(&opts.base, nodes)
            .map_err(|e| format!("ibsim sockets '{}': {e}", opts.base))?;
        server.timeout = opts.timeout;
        std::fs::create_dir_all(&opts.dir).map_err(|e| format!("{}: {e}", opts.dir.display()))?;
        if let Some(f) = &opts.sockname_file {
            if let Some(d) = f.parent() {
                let _ = std::fs::create_dir_all(d);
            }
            // Written aside and renamed into place: a reader that sees the
            // file sees all of it (a plain write let one read it empty).
            // The aside file is this process's own: two emulators starting
            // together (parallel tests) must not rename each other's away.
            let tmp = f.with_extension(format!("tmp.{}", std::process::id()));
            std::fs::write(&tmp, format!("{}\n", opts.base))
                .and_then(|()| std::fs::rename(&tmp, f))
                .map_err(|e| format!("{}: {e}", f.display()))?;
        }
        let mut svc = SmService {
            server,
            opensm: None,
            dir: opts.dir.clone(),
            sockname_file: opts.sockname_file.clone(),
        };
        if opts.opensm {
            let _ = std::fs::remove_file(opts.dir.join("opensm.log"));
            let mut cmd = opensm_command(&opts.base, "smhost", &opts.dir);
            // OpenSM dies with the thread that started it, even when that
            // process is killed outright: nobody would serve it otherwise.
            // SAFETY: the closure runs in the child between fork and exec
            // and only makes the prctl system call (async-signal-safe).
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                    libc::prctl(
                        libc::PR_SET_PDEATHSIG,
                        libc::SIGKILL as libc::c_ulong,
                        0,
                        0,
                        0,
                    );
                    Ok(())
                });
            }
            let child = cmd
                .args(&opts.opensm_args)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("starting OpenSM (package opensm): {e}"))?;
            svc.opensm = Some(child);
        }
        Ok(svc)
    }

    /// OpenSM's pid, while it runs.
    pub fn opensm_pid(&self) -> Option<u32> {
        self.opensm.as_ref().map(|c| c.id())
    }

    /// OpenSM's log file.
    pub fn opensm_log(&self) -> std::path::PathBuf {
        self.dir.join("opensm.log")
    }

    /// Serves (see [`IbsimServer::poll`]); also notices OpenSM exiting on
    /// its own.
    pub fn poll(&mut self, fabric: &mut Fabric, now_ns: u64) -> usize {
        if let Some(c) = self.opensm.as_mut()
            && let Ok(Some(_)) = c.try_wait()
        {
            self.opensm = None;
        }
        self.server.poll(fabric, now_ns)
    }

    /// Ends OpenSM (SIGTERM, serving its DISCONNECT for up to 2 s, then
    /// SIGKILL) and removes the socket-name file and OpenSM's fake sysfs.
    pub fn stop(&mut self, fabric: &mut Fabric, now_ns: u64) {
        if let Some(mut c) = self.opensm.take() {
            let pid = c.id();
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(2) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if self.server.poll(fabric, now_ns) == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
            let _ = c.wait();
            let _ = std::fs::remove_dir_all(self.dir.join(format!("sys-{pid}")));
        }
        if let Some(f) = self.sockname_file.take() {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl Drop for SmService {
    fn drop(&mut self) {
        // Without the fabric OpenSM cannot be served while it exits: end
        // it at once. Call `stop` first for a clean exit.
        if let Some(mut c) = self.opensm.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(f) = self.sockname_file.take() {
            let _ = std::fs::remove_file(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_layout_golden() {
        // As umad2sim writes a DR SubnGet: dlid 0xffff, slid 0xffff, QP0,
        // length 256 (real-peers.md section 2).
        let mut data = [0u8; MAD_LEN];
        data[0] = 1;
        data[1] = 0x81;
        let m = Mad {
            dlid: 0xffff,
            slid: 0xffff,
            dqp: 0,
            sqp: 1,
            sl: 0,
            pkey: 0xffff,
            len: 120,
            data,
        };
        let b = encode_request(&m, ETIMEDOUT);
        assert_eq!(&b[0..8], &[0xff, 0xff, 0, 0, 0xff, 0xff, 0, 0]);
        assert_eq!(&b[12..16], &[0, 0, 0, 1], "sqp big-endian");
        assert_eq!(&b[16..20], &[0, 0, 0, 110], "status big-endian");
        assert_eq!(&b[24..32], &[0, 0, 0, 0, 0, 0, 0, 120], "length big-endian");
        assert_eq!(b[33], 0x81);
        let (back, st) = decode_request(&b);
        assert_eq!((back, st), (m, ETIMEDOUT));
        let mut z = b;
        z[24..32].fill(0);
        assert_eq!(
            decode_request(&z).0.len,
            MAD_LEN,
            "length 0 reads as a whole MAD"
        );
        z[24..32].copy_from_slice(&1000u64.to_be_bytes());
        assert_eq!(
            decode_request(&z).0.len,
            MAD_LEN,
            "and so does one past 256"
        );
    }

    #[test]
    fn spare_cas_of_a_topology_become_host_nodes() {
        let mut f = Fabric::new();
        let built = super::super::Topology::for_nodes(3)
            .unwrap()
            .build(&mut f)
            .unwrap();
        let spare = host_nodes_beyond(&mut f, &built, 2);
        assert_eq!(spare.len(), 1);
        assert_eq!(spare[0].name, "node2");
        assert_eq!(spare[0].port, built.hcas[2].ports[0]);
        assert!(
            f.link_up(spare[0].port),
            "enabled, and the switch end is up"
        );
        assert!(host_nodes_beyond(&mut f, &built, 3).is_empty());
    }

    #[test]
    fn service_types_are_send() {
        fn send<T: Send>() {}
        send::<IbsimServer>();
        send::<SmService>();
    }
}
