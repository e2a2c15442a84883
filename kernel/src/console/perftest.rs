//! perftest and rdma-core's pingpong examples in the shell.
//!
//! perftest in the shell: `ib_write_bw`, `ib_write_lat`, `ib_read_bw`,
//! `ib_read_lat`, `ib_send_bw`, `ib_send_lat`, `ib_atomic_lat`, run by
//! `ib_tools::perftest::run`, and rdma-core's `ibv_rc_pingpong`/`ibv_ud_pingpong`,
//! run by `ib_tools::pingpong::run`, on the chosen HCA (`-d`, default the first
//! registered) with the SA and CM clients registered on first use; Ctrl-C stops any
//! wait. perftest's TCP exchange (a peer by IPv4 address, and every server's second
//! ear on port 18515) runs on the kernel's IP stack ([`StackSockets`]); rdma-core's
//! pingpong examples meet through the IB CM only.

use alloc::string::{String, ToString};
use core::fmt::Write;

use ib_core::ClientId;
use ib_tools::perftest::{self, Params, ParseError, Tool, run::Env};

use crate::console::CmdResult;
use crate::hca::{self, Ib};

/// The SA and CM clients, registered once.
static CLIENTS: spin::Mutex<Option<(ClientId, ClientId)>> = spin::Mutex::new(None);

pub(super) fn clients(ib: &mut Ib) -> (ClientId, ClientId) {
    let mut c = CLIENTS.lock();
    *c.get_or_insert_with(|| {
        (
            ib_core::sa_query::init(&mut ib.core),
            ib_core::cm::init(&mut ib.core),
        )
    })
}

fn tool(name: &'static str, out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let t = Tool::from_name(name).ok_or("unknown tool")?;
    let p = match Params::parse(t, args) {
        Ok(p) => p,
        Err(ParseError::Help) => {
            let _ = writeln!(out, "{}", perftest::usage(t));
            return Ok(());
        }
        Err(e) => return Err(alloc::format!("{e} ({} -h for the options)", name)),
    };
    let via_ip = crate::net::with_command_net(|n, ib| {
        let (sa, cm) = clients(ib);
        let crate::hca::Ib { core, hcas, .. } = ib;
        let (dev, name) = pick(hcas, p.ib_dev.as_deref(), |n| {
            alloc::format!("IB device {n} not found")
        })?;
        let cma = ib_core::cma::init(core);
        let mut ctrl_c = || crate::console::ctrl_c();
        let mut socks = StackSockets {
            net: n,
            socks: alloc::vec::Vec::new(),
            cma,
        };
        let mut env = Env {
            core,
            sa,
            cm,
            dev,
            dev_name: name,
            interrupted: &mut ctrl_c,
            ip: Some(&mut socks),
        };
        let r = perftest::run::run(&mut env, &p, out);
        let StackSockets { net, socks, .. } = socks;
        for s in socks.into_iter().flatten() {
            net.stack().close(s);
        }
        r
    });
    match via_ip {
        Some(r) => r,
        None => with_env(p.ib_dev.as_deref(), |env| perftest::run::run(env, &p, out)),
    }
}

/// The kernel's IP stack as perftest's TCP sockets (a listener listens on
/// the first link with an address other than loopback: `ib0`).
struct StackSockets<'n, 'a> {
    net: &'n mut crate::net::CommandNet<'a>,
    /// By number (`None` once closed).
    socks: alloc::vec::Vec<Option<net::SocketRef>>,
    /// The RDMA CM (perftest's `-R`).
    cma: ib_core::ClientId,
}

impl StackSockets<'_, '_> {
    fn sock(&self, s: u32) -> Result<net::SocketRef, String> {
        self.socks
            .get(s as usize)
            .copied()
            .flatten()
            .ok_or_else(|| String::from("the TCP connection is gone"))
    }

    /// The TCP socket of connection `s`.
    fn tcp(&mut self, s: u32) -> Result<&mut net::smoltcp::socket::tcp::Socket<'static>, String> {
        let r = self.sock(s)?;
        self.net
            .stack()
            .tcp(r)
            .ok_or_else(|| String::from("the TCP connection is gone"))
    }
}

impl ib_tools::perftest::communication::Sockets for StackSockets<'_, '_> {
    fn listen(&mut self, port: u16) -> Result<u32, String> {
        let st = self.net.stack();
        // The first link with an address other than loopback (ib0).
        let dev = st
            .links()
            .map(|(id, _)| id)
            .find(|&id| st.addrs(id).iter().any(|a| !a.address().is_loopback()))
            .ok_or("no IP address on any link (ip addr add ... dev ib0): cannot listen for perftest's TCP exchange")?;
        let s = st
            .tcp_listen(dev, port, 16 * 1024)
            .map_err(|e| alloc::format!("listen on TCP port {port}: {e}"))?;
        self.socks.push(Some(s));
        Ok(self.socks.len() as u32 - 1)
    }
    fn connect(&mut self, dst: core::net::Ipv4Addr, port: u16) -> Result<u32, String> {
        static NEXT: core::sync::atomic::AtomicU16 = core::sync::atomic::AtomicU16::new(0);
        let local = 43000 + NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed) % 1000;
        let o = dst.octets();
        let s = self
            .net
            .stack()
            .tcp_connect(
                net::Ipv4Address::new(o[0], o[1], o[2], o[3]),
                port,
                local,
                16 * 1024,
            )
            .map_err(|e| alloc::format!("connect to {dst}:{port}: {e}"))?;
        self.socks.push(Some(s));
        Ok(self.socks.len() as u32 - 1)
    }
    fn poll(&mut self, core: &mut ib_core::IbCore) {
        ib_core::addr::IpNet::poll(self.net, core);
    }
    fn rdma_cm(&mut self) -> Option<(ib_core::ClientId, &mut dyn ib_core::addr::IpNet)> {
        Some((self.cma, self.net))
    }
    fn established(&mut self, s: u32) -> Result<bool, String> {
        use net::smoltcp::socket::tcp::State;
        let t = self.tcp(s)?;
        match t.state() {
            State::Established => Ok(true),
            State::Listen | State::SynSent | State::SynReceived => Ok(false),
            State::Closed => Err(String::from("the connection was refused or reset")),
            other => Err(alloc::format!("the connection is in state {other}")),
        }
    }
    fn recv(&mut self, s: u32, buf: &mut [u8]) -> Result<usize, String> {
        let t = self.tcp(s)?;
        if t.can_recv() {
            return t
                .recv_slice(buf)
                .map_err(|_| String::from("the peer closed the connection"));
        }
        if t.may_recv() {
            Ok(0)
        } else {
            Err(String::from("the peer closed the connection"))
        }
    }
    fn send(&mut self, s: u32, buf: &[u8]) -> Result<usize, String> {
        let t = self.tcp(s)?;
        if !t.may_send() {
            return Err(String::from("the connection is closed"));
        }
        t.send_slice(buf)
            .map_err(|_| String::from("the connection is closed"))
    }
    fn close(&mut self, core: &mut ib_core::IbCore, s: u32) {
        let Ok(r) = self.sock(s) else { return };
        if let Some(t) = self.net.stack().tcp(r) {
            t.close();
        }
        // What we queued (the last "done") leaves before the socket goes.
        let end = crate::net::now_us() + 500_000;
        while crate::net::now_us() < end {
            ib_core::addr::IpNet::poll(self.net, core);
            let st = self.net.stack();
            let gone = st.tcp(r).is_none_or(|t| {
                t.send_queue() == 0
                    || matches!(
                        t.state(),
                        net::smoltcp::socket::tcp::State::Closed
                            | net::smoltcp::socket::tcp::State::TimeWait
                    )
            });
            if gone {
                break;
            }
        }
        self.net.stack().close(r);
        self.socks[s as usize] = None;
    }
}

fn pingpong(t: ib_tools::pingpong::Transport, out: &mut dyn Write, args: &[&str]) -> CmdResult {
    use ib_tools::pingpong;
    let p = match pingpong::Params::parse(t, args) {
        Ok(p) => p,
        Err(e) if e.is_empty() => {
            let _ = writeln!(out, "{}", pingpong::usage(t));
            return Ok(());
        }
        Err(e) => return Err(alloc::format!("{e} ({} -h for the options)", t.name())),
    };
    with_env(p.ib_dev.as_deref(), |env| pingpong::run(env, &p, out))
}

/// The ib_core device and name of the HCA named `name` (`-d`, `-C`;
/// `not_found` words the miss), or of the first registered one.
pub(super) fn pick<'a>(
    hcas: &'a [hca::Hca],
    name: Option<&str>,
    not_found: impl FnOnce(&str) -> String,
) -> Result<(ib_core::DeviceId, &'a str), String> {
    let h = match name {
        Some(n) => hcas
            .iter()
            .find(|h| h.name == n)
            .ok_or_else(|| not_found(n))?,
        None => hcas
            .iter()
            .find(|h| h.id.is_some())
            .ok_or("no registered HCA (see dmesg)")?,
    };
    let dev =
        h.id.ok_or_else(|| alloc::format!("{} is not registered (catastrophic error?)", h.name))?;
    Ok((dev, &h.name))
}

/// Runs `f` with the tools' environment on the HCA named `ib_dev` (`-d`),
/// or on the first registered one: the core, the SA and CM clients, and
/// Ctrl-C read from the console.
fn with_env(ib_dev: Option<&str>, f: impl FnOnce(&mut Env<'_>) -> CmdResult) -> CmdResult {
    hca::with(|ib| {
        let (sa, cm) = clients(ib);
        let Ib { core, hcas, .. } = ib;
        let (dev, name) = pick(hcas, ib_dev, |n| alloc::format!("IB device {n} not found"))?;
        let mut ctrl_c = || crate::console::ctrl_c();
        let mut env = Env {
            core,
            sa,
            cm,
            dev,
            dev_name: name,
            interrupted: &mut ctrl_c,
            ip: None,
        };
        f(&mut env)
    })
    .unwrap_or_else(|| {
        Err("no HCA (no ConnectX-3 found, or its bring-up failed: see dmesg)".to_string())
    })
}

/// `ibv_rc_pingpong`.
pub fn ibv_rc_pingpong(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    pingpong(ib_tools::pingpong::Transport::Rc, out, args)
}
/// `ibv_ud_pingpong`.
pub fn ibv_ud_pingpong(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    pingpong(ib_tools::pingpong::Transport::Ud, out, args)
}

/// `ib_write_bw`.
pub fn ib_write_bw(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_write_bw", out, args)
}
/// `ib_write_lat`.
pub fn ib_write_lat(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_write_lat", out, args)
}
/// `ib_read_bw`.
pub fn ib_read_bw(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_read_bw", out, args)
}
/// `ib_read_lat`.
pub fn ib_read_lat(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_read_lat", out, args)
}
/// `ib_send_bw`.
pub fn ib_send_bw(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_send_bw", out, args)
}
/// `ib_send_lat`.
pub fn ib_send_lat(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_send_lat", out, args)
}
/// `ib_atomic_lat`.
pub fn ib_atomic_lat(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_atomic_lat", out, args)
}
