//! The `rmem` shell command.
//!
//! The rmem crate's memory node and compute node from the console (`rmem serve
//! SIZE`, `rmem connect LID|GUID|IPV4`, `rmem alloc|free|read|write`, `rmem probe`, `rmem
//! bench [--csv]`, `rmem stats`, `rmem close`); leaves out several connections per
//! node (one client and one server per kernel).
//!
//! The CM and SA clients are registered with ib_core on first use. While a
//! command runs it holds the adapters and polls ib_core itself; `rmem
//! serve` serves until its time is up or Ctrl-C, on the IB CM and on the
//! RDMA CM (TCP port `rmem::IP_PORT` unless `-p`), and holds the IP stack
//! too, polling it (ARP answers) with the RDMA CM's turn at it, as `rmem
//! connect` to an IPv4 address does while it connects.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt::Write;
use core::net::{Ipv4Addr, SocketAddrV4};
use core::time::Duration;

use ib_core::{ClientId, DeviceId, IbCore};
use rmem::bench::{BenchConfig, BenchResult, Pattern};
use rmem::{Client, ClientConfig, Server, ServerConfig};

use crate::console::CmdResult;
use crate::hca::{self, Ib};
use crate::net::CommandNet;
use crate::time::TscClock;

const USAGE: &str = "usage: rmem serve SIZE[K|M|G] [SECONDS] [--clients N] [-p PORT] | connect LID|PORT_GUID|GID|IPV4[:PORT] [-p PORT] [-k K] [-t SECONDS] [-g GIDX] | alloc LEN | \
free ADDR | read ADDR LEN [--check [BYTE]] | write ADDR LEN [BYTE] (ADDR: a number, @ or @+OFF: the last chunk allocated) | \
probe ADDR [-i MS] [-t SECONDS] | bench [-n PAGES] [-k K[,K...]] [--iters N] [--seq|--rand] [--csv] | stats | close";

struct State {
    cm: ClientId,
    sa: ClientId,
    server: Option<Server>,
    client: Option<Client>,
}

/// The address of the chunk `rmem alloc` returned last (`@` in ADDR), for
/// scripts that cannot know it in advance.
static LAST_CHUNK: spin::Mutex<Option<u64>> = spin::Mutex::new(None);

/// ADDR: a number, or `@` / `@+OFF` (the last chunk `rmem alloc` returned).
fn addr(s: &str) -> Result<u64, String> {
    let Some(rest) = s.strip_prefix('@') else {
        return num(s);
    };
    let base = LAST_CHUNK
        .lock()
        .ok_or_else(|| String::from("@: no chunk allocated yet (rmem alloc LEN)"))?;
    let off = match rest.strip_prefix('+') {
        Some(o) => size(o)?,
        None if rest.is_empty() => 0,
        None => return Err(alloc::format!("bad address: {s} (@ or @+OFFSET)")),
    };
    base.checked_add(off)
        .ok_or_else(|| alloc::format!("address overflow: {s}"))
}

static STATE: spin::Mutex<Option<State>> = spin::Mutex::new(None);

/// A number, decimal or 0x hexadecimal.
pub(super) fn num(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| alloc::format!("not a number: {s}"))
}

/// `-p PORT`'s value: a port of the RDMA CM's TCP port space.
fn ip_port(v: Option<&&str>) -> Result<u16, String> {
    let v = v.ok_or_else(|| String::from(USAGE))?;
    num(v)
        .ok()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p != 0)
        .ok_or_else(|| alloc::format!("bad port: {v} (1 to 65535)"))
}

/// A size: a number with an optional K, M or G suffix.
pub(super) fn size(s: &str) -> Result<u64, String> {
    let (n, mul) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num(n)?
        .checked_mul(mul)
        .ok_or_else(|| alloc::format!("too large: {s}"))
}

/// The byte `rmem write` puts at remote address `a` (and `read --check`
/// expects): differs from page to page and within a page.
fn pattern(a: u64) -> u8 {
    (a ^ (a >> 8) ^ (a >> 16) ^ 0xa5) as u8
}

/// Bytes `rmem write` generates and `rmem read --check` checks between
/// two looks at the clock (a few hundred microseconds of TCG).
const STEP: usize = 64 << 10;

/// Runs ib_core's progress function at most every millisecond from a
/// console command's own long loops (building or checking 16 MiB under a
/// loaded TCG takes seconds): the adapters are held, so the idle loop
/// cannot, and an SM whose SMPs go unanswered for long drops the port.
struct Progress {
    next_ns: u64,
}

impl Progress {
    const EVERY_NS: u64 = 1_000_000;

    fn new() -> Progress {
        Progress {
            next_ns: hal::Clock::now_ns(&TscClock) + Self::EVERY_NS,
        }
    }

    fn tick(&mut self, core: &mut IbCore) {
        let now = hal::Clock::now_ns(&TscClock);
        if now >= self.next_ns {
            core.poll();
            self.next_ns = hal::Clock::now_ns(&TscClock) + Self::EVERY_NS;
        }
    }
}

/// `len` bytes of `fill`, or of the address pattern from `addr` on,
/// progress made every [`STEP`].
fn make_data(core: &mut IbCore, addr: u64, len: usize, fill: Option<u8>) -> Vec<u8> {
    let mut data = Vec::with_capacity(len);
    let mut p = Progress::new();
    while data.len() < len {
        let from = data.len();
        let to = (from + STEP).min(len);
        data.extend((from..to).map(|i| fill.unwrap_or_else(|| pattern(addr + i as u64))));
        p.tick(core);
    }
    data
}

/// The first offset in `data` whose byte is not `expect(addr + offset)`,
/// progress made every [`STEP`].
fn mismatch(
    core: &mut IbCore,
    addr: u64,
    data: &[u8],
    expect: impl Fn(u64) -> u8,
) -> Option<usize> {
    let mut p = Progress::new();
    for (k, chunk) in data.chunks(STEP).enumerate() {
        let base = k * STEP;
        if let Some(i) = chunk
            .iter()
            .enumerate()
            .position(|(i, &b)| b != expect(addr + (base + i) as u64))
        {
            return Some(base + i);
        }
        p.tick(core);
    }
    None
}

fn first_dev(ib: &Ib) -> Result<DeviceId, String> {
    ib.hcas
        .iter()
        .find_map(|h| h.id)
        .ok_or_else(|| String::from("no HCA (see dmesg)"))
}

/// The rmem state, made on first use.
fn state<'a>(g: &'a mut Option<State>, core: &mut IbCore) -> &'a mut State {
    g.get_or_insert_with(|| State {
        sa: ib_core::sa_query::init(core),
        cm: ib_core::cm::init(core),
        server: None,
        client: None,
    })
}

/// Runs `f` with ib_core, the first HCA and the rmem state.
fn with_state(f: impl FnOnce(&mut IbCore, DeviceId, &mut State) -> CmdResult) -> CmdResult {
    hca::with(|ib| {
        let dev = first_dev(ib)?;
        let mut g = STATE.lock();
        let st = state(&mut g, &mut ib.core);
        f(&mut ib.core, dev, st)
    })
    .unwrap_or_else(|| Err(String::from("no HCA (see dmesg)")))
}

/// [`with_state`] with the IP stack too (the stack, then the adapters,
/// then the rmem state), and the RDMA CM registered: for `rmem serve` and
/// `rmem connect` by IP address, which poll the stack themselves.
fn with_state_net(
    f: impl FnOnce(&mut IbCore, DeviceId, &mut State, ClientId, &mut CommandNet<'_>) -> CmdResult,
) -> CmdResult {
    crate::net::with_command_net(|net, ib| {
        let dev = first_dev(ib)?;
        let cma = ib_core::cma::init(&mut ib.core);
        let mut g = STATE.lock();
        let st = state(&mut g, &mut ib.core);
        f(&mut ib.core, dev, st, cma, net)
    })
    .unwrap_or_else(|| Err(String::from("no HCA or no IP stack (see dmesg)")))
}

/// A memory node by name: an IPv4 address with an optional port
/// (`10.0.0.2`, `10.0.0.2:21070`), or a LID or port GUID
/// (`0x0002c90300000011` or ibstat's `0002:c903:0000:0011`), which no SM
/// changes.
pub(super) enum Node {
    /// By IP address (port `rmem::IP_PORT` unless given), through the
    /// RDMA CM.
    Ip(Ipv4Addr, Option<u16>),
    /// By LID or GID, through the IB CM.
    Ib(rmem::client::Dest),
}

impl Node {
    /// Its address and port, by IP.
    pub(super) fn ip(&self) -> Option<SocketAddrV4> {
        match *self {
            Node::Ip(a, p) => Some(SocketAddrV4::new(a, p.unwrap_or(rmem::IP_PORT))),
            Node::Ib(_) => None,
        }
    }
}

/// Parses a memory node's name (see [`Node`]).
pub(super) fn node(s: &str) -> Result<Node, String> {
    if s.contains('.') {
        let bad = || alloc::format!("not an IPv4 address[:PORT]: {s}");
        return match s.split_once(':') {
            Some((a, p)) => Ok(Node::Ip(
                a.parse().map_err(|_| bad())?,
                Some(p.parse().ok().filter(|&p| p != 0).ok_or_else(bad)?),
            )),
            None => Ok(Node::Ip(s.parse().map_err(|_| bad())?, None)),
        };
    }
    if s.contains("::") || s.split(':').count() == 8 {
        return ib_tools::perftest::parse_gid(s)
            .map(|g| Node::Ib(rmem::client::Dest::Gid(ib_core::verbs::Gid(g))))
            .ok_or_else(|| alloc::format!("not a GID: {s}"));
    }
    let v = num(&s.replace(':', ""))
        .or_else(|_| u64::from_str_radix(&s.replace(':', ""), 16))
        .map_err(|_| alloc::format!("not a LID, port GUID or IPv4 address: {s}"))?;
    Ok(Node::Ib(match u16::try_from(v) {
        Ok(l) if !s.contains(':') && v < 0xc000 => rmem::client::Dest::Lid(l),
        _ => rmem::client::Dest::Gid(ib_core::verbs::Gid::new(0xfe80_0000_0000_0000, v)),
    }))
}

fn err(e: rmem::Error) -> String {
    alloc::format!("{e}")
}

fn client(st: &mut State) -> Result<&mut Client, String> {
    st.client
        .as_mut()
        .ok_or_else(|| String::from("not connected (rmem connect LID)"))
}

/// `rmem ...`.
pub fn rmem(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let Some((&sub, rest)) = args.split_first() else {
        return Err(USAGE.into());
    };
    match (sub, rest) {
        ("serve", [sz, more @ ..]) => {
            let bytes = size(sz)?;
            let mut secs = None;
            let mut clients = None;
            let mut port = rmem::IP_PORT;
            let mut it = more.iter();
            while let Some(&o) = it.next() {
                match o {
                    "--clients" => {
                        let n = it.next().ok_or_else(|| String::from(USAGE))?;
                        clients = Some(num(n)?.max(1));
                    }
                    "-p" => port = ip_port(it.next())?,
                    s if secs.is_none() => secs = Some(num(s)?),
                    _ => return Err(USAGE.into()),
                }
            }
            serve(out, bytes, secs, clients, port)
        }
        ("connect", [to, more @ ..]) => {
            let dest = node(to)?;
            let mut cfg = ClientConfig::default();
            let mut port = None;
            let mut it = more.iter();
            while let Some(&o) = it.next() {
                if o == "-p" {
                    port = Some(ip_port(it.next())?);
                    continue;
                }
                let v = it.next().ok_or_else(|| String::from(USAGE))?;
                match o {
                    "-k" => cfg.window = num(v)?.clamp(1, 1024) as usize,
                    "-g" => {
                        cfg.gid_index = u8::try_from(num(v)?)
                            .ok()
                            .filter(|&g| g < 128)
                            .ok_or_else(|| String::from("-g: a GID index from 0 to 127"))?
                    }
                    "-t" => cfg.connect_timeout = Duration::from_secs(num(v)?.clamp(1, 3600)),
                    _ => return Err(USAGE.into()),
                }
            }
            let connected = |out: &mut dyn Write, st: &mut State, c: Client| -> CmdResult {
                let r = c.region();
                let _ = writeln!(
                    out,
                    "connected to {to}: region {:#x}..{:#x} ({} KiB) rkey {:#x}, {} in flight{}",
                    r.base,
                    r.base + r.len,
                    r.len / 1024,
                    r.rkey,
                    cfg.window,
                    match c.stats().retries {
                        0 => String::new(),
                        1 => String::from(" (after 1 retry)"),
                        n => alloc::format!(" (after {n} retries)"),
                    }
                );
                st.client = Some(c);
                Ok(())
            };
            if let Some(d) = dest.ip() {
                let dst = SocketAddrV4::new(*d.ip(), port.unwrap_or(d.port()));
                return with_state_net(|core, _, st, cma, net| {
                    if st.client.is_some() {
                        return Err("already connected (rmem close first)".into());
                    }
                    let c = Client::connect_ip(core, cma, net, dst, cfg).map_err(err)?;
                    connected(out, st, c)
                });
            }
            let (Node::Ib(d), None) = (dest, port) else {
                return Err("-p is for a memory node named by IP address".into());
            };
            with_state(|core, dev, st| {
                if st.client.is_some() {
                    return Err("already connected (rmem close first)".into());
                }
                let c = Client::connect_to(core, st.cm, st.sa, dev, d, cfg).map_err(err)?;
                connected(out, st, c)
            })
        }
        ("alloc", [len]) => {
            let len = size(len)?;
            with_state(|core, _, st| {
                let ch = client(st)?.alloc(core, len).map_err(err)?;
                *LAST_CHUNK.lock() = Some(ch.addr);
                let _ = writeln!(out, "{:#x} {}", ch.addr, ch.len);
                Ok(())
            })
        }
        ("free", [a]) => {
            let addr = addr(a)?;
            with_state(|core, _, st| {
                client(st)?
                    .free(core, rmem::client::RemoteChunk { addr, len: 0 })
                    .map_err(err)
            })
        }
        ("write", [a, len, more @ ..]) => {
            let (addr, len) = (addr(a)?, size(len)?);
            if len == 0 || len > 16 << 20 {
                return Err("LEN must be 1 byte to 16 MiB".into());
            }
            let fill = match more {
                [] => None,
                [b] => Some(u8::try_from(num(b)?).map_err(|_| String::from("BYTE > 0xff"))?),
                _ => return Err(USAGE.into()),
            };
            with_state(|core, _, st| {
                let data = make_data(core, addr, len as usize, fill);
                let t0 = crate::time::uptime_us();
                client(st)?.write(core, addr, &data).map_err(err)?;
                let us = crate::time::uptime_us() - t0;
                let _ = writeln!(out, "wrote {len} bytes at {addr:#x} in {us} us");
                Ok(())
            })
        }
        ("read", [a, len, more @ ..]) => {
            let (addr, len) = (addr(a)?, size(len)?);
            if len == 0 || len > 16 << 20 {
                return Err("LEN must be 1 byte to 16 MiB".into());
            }
            // --check: the address pattern `rmem write` puts; --check BYTE:
            // that byte everywhere.
            let (check, fill) = match more {
                [] => (false, None),
                ["--check"] => (true, None),
                ["--check", b] => (
                    true,
                    Some(u8::try_from(num(b)?).map_err(|_| String::from("BYTE > 0xff"))?),
                ),
                _ => return Err(USAGE.into()),
            };
            let expect = move |a: u64| fill.unwrap_or_else(|| pattern(a));
            with_state(|core, _, st| {
                let mut data = make_data(core, addr, len as usize, Some(0));
                let t0 = crate::time::uptime_us();
                client(st)?.read(core, addr, &mut data).map_err(err)?;
                let us = crate::time::uptime_us() - t0;
                if check {
                    if let Some(i) = mismatch(core, addr, &data, expect) {
                        let a = addr + i as u64;
                        return Err(alloc::format!(
                            "data check failed at {a:#x}: {:#04x}, expected {:#04x}",
                            data[i],
                            expect(a)
                        ));
                    }
                    let _ = writeln!(
                        out,
                        "read {len} bytes at {addr:#x} in {us} us: {} ok",
                        match fill {
                            Some(b) => alloc::format!("fill {b:#04x}"),
                            None => String::from("pattern"),
                        }
                    );
                } else {
                    for (row, chunk) in data.chunks(16).take(64).enumerate() {
                        let _ = write!(out, "{:016x}:", addr + row as u64 * 16);
                        for b in chunk {
                            let _ = write!(out, " {b:02x}");
                        }
                        let _ = writeln!(out);
                    }
                    if len > 1024 {
                        let _ = writeln!(out, "... ({len} bytes in {us} us)");
                    }
                }
                Ok(())
            })
        }
        ("probe", [a, more @ ..]) => {
            let addr = addr(a)?;
            let (mut every_ms, mut secs) = (100u64, 60u64);
            let mut it = more.iter();
            while let Some(&o) = it.next() {
                let v = num(it.next().ok_or_else(|| String::from(USAGE))?)?;
                match o {
                    "-i" => every_ms = v.clamp(1, 60_000),
                    "-t" => secs = v.clamp(1, 3600),
                    _ => return Err(USAGE.into()),
                }
            }
            with_state(|core, _, st| probe(out, core, client(st)?, addr, every_ms, secs))
        }
        ("bench", opts) => {
            let mut cfg = BenchConfig::default();
            let mut ks = vec![cfg.window];
            let mut csv = false;
            let mut it = opts.iter();
            while let Some(&o) = it.next() {
                let mut val = || {
                    it.next()
                        .ok_or_else(|| String::from(USAGE))
                        .and_then(|v| num(v))
                };
                match o {
                    "-n" => cfg.pages = val()?.max(1),
                    "-k" => {
                        let v = it.next().ok_or_else(|| String::from(USAGE))?;
                        ks = v
                            .split(',')
                            .map(|k| num(k).map(|k| k.clamp(1, 1024) as usize))
                            .collect::<Result<_, _>>()?;
                        if ks.is_empty() || ks.len() > 16 {
                            return Err("-k takes 1 to 16 values, e.g. -k 1,4,16".into());
                        }
                    }
                    "--iters" => cfg.iters = val()?.clamp(1, 10_000_000),
                    "--seq" => cfg.pattern = Pattern::Sequential,
                    "--rand" => cfg.pattern = Pattern::Random,
                    "--csv" => csv = true,
                    _ => return Err(USAGE.into()),
                }
            }
            with_state(|core, _, st| {
                let c = client(st)?;
                if let Some(&k) = ks.iter().find(|&&k| k > c.config().window) {
                    return Err(alloc::format!(
                        "-k {k}: the connection has {} requests in flight at most (rmem connect LID -k {k})",
                        c.config().window
                    ));
                }
                // One run per K; with --csv the rows form one block that
                // run-qemu.sh collects (--- csv begin/end ---).
                let mut rows = vec![];
                for &k in &ks {
                    let r =
                        rmem::bench::run(core, c, BenchConfig { window: k, ..cfg }).map_err(err)?;
                    if csv {
                        rows.push(r);
                    } else {
                        let _ = r.write_report(out);
                    }
                }
                if csv {
                    let _ = writeln!(out, "--- csv begin rmem-bench ---");
                    let _ = writeln!(out, "{}", BenchResult::CSV_HEADER);
                    for r in &rows {
                        let _ = r.write_csv(out);
                    }
                    let _ = writeln!(out, "--- csv end ---");
                }
                Ok(())
            })
        }
        ("stats", []) => with_state(|_, _, st| {
            if let Some(s) = &st.server {
                let t = s.stats();
                let _ = writeln!(
                    out,
                    "memory node: {} clients, {} KiB allocated; connects {} refused {} disconnects {} rpcs {} rpc_errors {} errors {}",
                    s.clients(),
                    s.used_bytes() / 1024,
                    t.connects,
                    t.refused,
                    t.disconnects,
                    t.rpcs,
                    t.rpc_errors,
                    t.errors
                );
            }
            if let Some(c) = &st.client {
                let s = c.stats();
                let p = s.percentiles();
                let _ = writeln!(
                    out,
                    "compute node: reads {} ({} bytes) writes {} ({} bytes) rpcs {} retries {} errors {}",
                    s.reads, s.bytes_read, s.writes, s.bytes_written, s.rpcs, s.retries, s.errors
                );
                let _ = writeln!(
                    out,
                    "latency ns: min {} median {} 99% {} 99.9% {} max {} (of {})",
                    p.min, p.median, p.p99, p.p999, p.max, p.count
                );
                let _ = write!(out, "histogram (log2 ns):");
                for (i, n) in s.hist.iter().enumerate().filter(|(_, n)| **n > 0) {
                    let _ = write!(out, " [{}]={n}", 1u64 << i);
                }
                let _ = writeln!(out);
                if let Some(e) = c.broken() {
                    let _ = writeln!(out, "connection failed: {e}");
                }
            }
            if st.server.is_none() && st.client.is_none() {
                let _ = writeln!(out, "rmem: neither serving nor connected");
            }
            Ok(())
        }),
        ("close", []) => with_state(|core, _, st| {
            *LAST_CHUNK.lock() = None;
            if let Some(c) = st.client.take() {
                c.close(core).map_err(err)?;
            }
            if let Some(s) = st.server.take() {
                s.close(core).map_err(err)?;
            }
            Ok(())
        }),
        _ => Err(USAGE.into()),
    }
}

/// `rmem probe`: reads the page at `addr` every `every_ms` until a read
/// fails (the error, with how many reads went well and how long after the
/// last good one the failure came: the time to notice a pulled cable or a
/// memory node gone), `secs` pass, or Ctrl-C.
fn probe(
    out: &mut dyn Write,
    core: &mut IbCore,
    c: &mut Client,
    addr: u64,
    every_ms: u64,
    secs: u64,
) -> CmdResult {
    let clock = &TscClock;
    let end = hal::Deadline::after(clock, Duration::from_secs(secs));
    let mut page = vec![0u8; 4096];
    let (mut n, mut last_ok) = (0u64, crate::time::uptime_us());
    loop {
        if let Err(e) = c.read(core, addr, &mut page) {
            let ms = (crate::time::uptime_us() - last_ok) / 1000;
            return Err(alloc::format!(
                "{e} ({n} reads of {addr:#x} went well; this one failed {ms} ms after the last good one)"
            ));
        }
        n += 1;
        last_ok = crate::time::uptime_us();
        let next = hal::Deadline::after(clock, Duration::from_millis(every_ms));
        while !next.expired(clock) {
            core.poll();
            if end.expired(clock) {
                let _ = writeln!(
                    out,
                    "rmem: probe: {n} reads of {addr:#x} in {secs} s, all well"
                );
                return Ok(());
            }
            if crate::console::ctrl_c() {
                let _ = writeln!(out, "^C\nrmem: probe: {n} reads of {addr:#x}, all well");
                return Ok(());
            }
            core::hint::spin_loop();
        }
    }
}

/// Serves until `secs` pass, `clients` compute nodes have come and all
/// gone, or Ctrl-C: compute nodes by LID or GUID (the IB CM) and by IP
/// address (the RDMA CM, TCP `port`).
fn serve(
    out: &mut dyn Write,
    bytes: u64,
    secs: Option<u64>,
    clients: Option<u64>,
    port: u16,
) -> CmdResult {
    with_state_net(|core, dev, st, cma, net| {
        if st.server.is_none() {
            let s =
                Server::export(core, st.cm, dev, bytes, ServerConfig::default()).map_err(|e| {
                    match e {
                        rmem::Error::Verbs(ib_core::Error::NoMem) => alloc::format!(
                            "cannot export {} KiB: no contiguous RAM left for it \
                         (see meminfo; give the guest more, e.g. run-qemu.sh --memory 1G)",
                            bytes / 1024
                        ),
                        e => err(e),
                    }
                })?;
            st.server = Some(s);
        }
        let Some(s) = st.server.as_mut() else {
            return Err("no region".into());
        };
        // The RDMA CM's view of our addresses first (what it checks a
        // REQ's destination against).
        ib_core::cma::net_poll(core, cma, net);
        match s.ip_addr(core) {
            None => s
                .listen_ip(core, cma, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))
                .map_err(|e| alloc::format!("cannot listen on TCP port {port} (RDMA CM): {e}"))?,
            Some(a) if a.port() != port => {
                let _ = writeln!(
                    out,
                    "rmem: already listening on port {} (rmem close first to change it)",
                    a.port()
                );
            }
            Some(_) => {}
        }
        let port = s.ip_addr(core).map_or(port, |a| a.port());
        let r = s.region();
        if r.len != bytes.div_ceil(4096) * 4096 {
            let _ = writeln!(
                out,
                "rmem: already exporting {} KiB (rmem close first to change the size)",
                r.len / 1024
            );
        }
        let lid = core
            .device_mut(dev)
            .and_then(|d| d.query_port(1).ok())
            .map_or(0, |a| a.lid);
        let _ = writeln!(
            out,
            "rmem: serving {} KiB at {:#x} rkey {:#x} on {} and TCP port {port} (RDMA CM); {}{}",
            r.len / 1024,
            r.base,
            r.rkey,
            match lid {
                0 => String::from("port 1 (no LID yet: the SM assigns it)"),
                l => alloc::format!("LID {l}"),
            },
            match clients {
                Some(n) => alloc::format!("until {n} compute node(s) have come and gone, "),
                None => String::new(),
            },
            match secs {
                Some(n) => alloc::format!("for at most {n} s (Ctrl-C stops)"),
                None => String::from("Ctrl-C stops"),
            }
        );
        let before = s.stats().hellos;
        let end = secs.map(|n| hal::Deadline::after(&TscClock, Duration::from_secs(n)));
        loop {
            core.poll();
            // The IP stack's turn (ARP answers for compute nodes coming by
            // IP address) and the RDMA CM's with it.
            ib_core::addr::IpNet::poll(net, core);
            ib_core::cma::net_poll(core, cma, net);
            s.poll(core).map_err(err)?;
            if end.is_some_and(|e| e.expired(&TscClock)) {
                break;
            }
            // Compute nodes that got their region, not connect attempts
            // their node gave up (a slow guest's CM times out and retries).
            if clients.is_some_and(|n| s.stats().hellos - before >= n && s.clients() == 0) {
                break;
            }
            if crate::console::ctrl_c() {
                let _ = writeln!(out, "^C");
                break;
            }
            core::hint::spin_loop();
        }
        let t = s.stats();
        let _ = writeln!(
            out,
            "rmem: {} clients served, {} RPCs ({} refused as malformed or failed), {} KiB allocated",
            t.hellos,
            t.rpcs,
            t.rpc_errors,
            s.used_bytes() / 1024
        );
        Ok(())
    })
}
