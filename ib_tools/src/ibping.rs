//! infiniband-diags' `ibping`, client and responder.
//!
//! infiniband-diags' `ibping` (`ibping.c`): the client's Get of the OpenIB ping
//! vendor class (0x32, OUI 0x001405) to a LID or port GUID on QP1 with its `Pong
//! from ...` lines and the `--- ... ibping statistics ---` summary, and the
//! responder (`ibping -S`) as an ib_core MAD agent that answers with this node's
//! description; flood mode (`-f`), `-o OUI`, `-S` from the console (the kernel's
//! responder runs from boot) and node-name maps are left out.
//!
//! Linux's `ibping -S` is a process of its own, answering whatever the node is
//! doing; here the kernel's responder is an ib_core client
//! ([`ResponderClient`]) whose agents' mailboxes are read by ib_core's
//! progress function, which every blocking helper calls: the node answers
//! while any command polls ib_core, `ibping` to its own LID included (the
//! card loops that ping back to its own QP1).
//!
//! One deliberate difference: ibping pings until Ctrl-C; a console command
//! must end on its own, so `-c` defaults to [`DEFAULT_COUNT`] here (Ctrl-C
//! still stops it, with the summary).

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;
use core::time::Duration;

use hal::Deadline;
use ib_core::device::{ClientId, Device, IbClient};
use ib_core::mad::{Mad, MadSendBuf, method};
use ib_core::verbs::{AhAttr, IB_QP1_QKEY, QpType, WcStatus};
use ib_core::{DeviceId, IbCore, MadAgent, MadEvent, MadRegReq};

use crate::diags::{Src, node_desc_string};

/// `IB_VENDOR_OPENIB_PING_CLASS`.
pub const IB_VENDOR_OPENIB_PING_CLASS: u8 = 0x32;
/// `IB_OPENIB_OUI`.
pub const IB_OPENIB_OUI: u32 = 0x00_1405;
/// Where a range-2 vendor MAD's data starts (`IB_VENDOR_RANGE2_DATA_OFFS`).
pub const IB_VENDOR_RANGE2_DATA_OFFS: usize = 40;
/// How long one ping waits for its pong (libibmad's default timeout).
pub const PING_TIMEOUT: Duration = Duration::from_secs(1);
/// Pings without `-c`.
pub const DEFAULT_COUNT: u32 = 10;

/// The kernel's `ibping -S`: one agent per port of a device, answering
/// every ping with the node description.
#[derive(Debug, Default)]
pub struct Responder {
    agents: Vec<(MadAgent, [u8; 64])>,
    /// Pings answered.
    pub answered: u64,
}

impl Responder {
    /// Registers the ping class on every port of `dev` whose MAD layer is
    /// open; ports that refuse are skipped (the error of the last is
    /// returned if none took it).
    pub fn register(core: &mut IbCore, dev: DeviceId) -> Result<Responder, ib_core::Error> {
        let (ports, desc) = {
            let d = core.device(dev).ok_or(ib_core::Error::NoDev)?;
            let mut b = [0u8; 64];
            let s = d.info().node_desc.as_bytes();
            let n = s.len().min(63);
            b[..n].copy_from_slice(&s[..n]);
            (d.phys_port_cnt(), b)
        };
        let mut r = Responder::default();
        let mut last = ib_core::Error::NoDev;
        for port in 1..=ports {
            if !core.mad_port_open(dev, port) {
                continue;
            }
            let req = MadRegReq::new(IB_VENDOR_OPENIB_PING_CLASS, 1, &[method::GET])
                .with_oui(IB_OPENIB_OUI);
            match core.register_mad_agent(dev, port, QpType::Gsi, Some(req), 0) {
                Ok(a) => r.agents.push((a, desc)),
                Err(e) => last = e,
            }
        }
        if r.agents.is_empty() {
            return Err(last);
        }
        Ok(r)
    }

    /// Answers the pings waiting in the agents' mailboxes (never blocks);
    /// returns how many.
    pub fn poll(&mut self, core: &mut IbCore) -> usize {
        let mut n = 0;
        for &(agent, desc) in &self.agents {
            while let Some(ev) = core.mad_poll_agent(agent) {
                let MadEvent::Recv(r) = ev else { continue };
                if r.mad.method() != method::GET {
                    continue;
                }
                let ah = match core.device(agent.dev).and_then(|d| {
                    ib_core::agent::init_ah_from_wc(d, agent.port, &r.wc, r.grh.as_ref()).ok()
                }) {
                    Some(a) => a,
                    None => continue,
                };
                let mut resp = r.mad.clone();
                resp.set_method(method::GET_RESP);
                resp.set_status(0);
                resp.0[IB_VENDOR_RANGE2_DATA_OFFS..].fill(0);
                resp.0[IB_VENDOR_RANGE2_DATA_OFFS..IB_VENDOR_RANGE2_DATA_OFFS + 64]
                    .copy_from_slice(&desc);
                let mut buf = MadSendBuf::new(resp, ah, r.wc.src_qp);
                buf.remote_qkey = IB_QP1_QKEY;
                buf.pkey_index = r.wc.pkey_index;
                if core.post_send_mad(agent, buf).is_ok() {
                    n += 1;
                    self.answered += 1;
                }
            }
        }
        n
    }

    /// Unregisters the agents.
    pub fn unregister(self, core: &mut IbCore) {
        for (a, _) in self.agents {
            let _ = core.unregister_mad_agent(a);
        }
    }
}

/// The kernel's `ibping -S` as an ib_core client: a [`Responder`] for every
/// device it is told of, registered from the first progress pass after the
/// device came (its MAD ports are open by then), and answering from every
/// pass after that, whoever runs it: the idle loop, or a console command
/// waiting for its own MADs.
pub struct ResponderClient {
    /// Devices told of and not yet registered.
    pending: Vec<DeviceId>,
    live: Vec<(DeviceId, Responder)>,
    /// Where a device without a responder is reported.
    warn: Box<dyn FnMut(&str) + Send>,
}

impl ResponderClient {
    /// ib_core's client name.
    pub const NAME: &'static str = "ibping";

    /// A client reporting a device it cannot answer on to `warn` (one line).
    pub fn new(warn: Box<dyn FnMut(&str) + Send>) -> ResponderClient {
        ResponderClient {
            pending: Vec::new(),
            live: Vec::new(),
            warn,
        }
    }

    /// Pings answered on every device so far.
    pub fn answered(&self) -> u64 {
        self.live.iter().map(|(_, r)| r.answered).sum()
    }
}

impl IbClient for ResponderClient {
    fn name(&self) -> &str {
        Self::NAME
    }
    fn accepts(&self, _n: ib_core::verbs::NodeType, t: ib_core::verbs::Transport) -> bool {
        t == ib_core::verbs::Transport::Ib
    }
    fn add(&mut self, _me: ClientId, dev: &mut Device) {
        self.pending.push(dev.id());
    }
    fn remove(&mut self, _me: ClientId, dev: &mut Device) {
        // The agents go with the device's MAD ports.
        let id = dev.id();
        self.pending.retain(|d| *d != id);
        self.live.retain(|(d, _)| *d != id);
    }
    fn poll(&mut self, _me: ClientId, core: &mut IbCore) -> usize {
        if !self.pending.is_empty() {
            for dev in core::mem::take(&mut self.pending) {
                match Responder::register(core, dev) {
                    Ok(r) => self.live.push((dev, r)),
                    Err(e) => {
                        let name = core.device(dev).map(|d| d.name()).unwrap_or("?");
                        let line = format!("{name}: no ibping responder: {e}");
                        (self.warn)(&line);
                    }
                }
            }
        }
        self.live.iter_mut().map(|(_, r)| r.poll(core)).sum()
    }
}

/// What a ping run counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Pings sent.
    pub ntrans: u64,
    /// Pongs received.
    pub replied: u64,
    /// Fastest, slowest and summed round trips, in microseconds.
    pub min_us: u64,
    /// Slowest.
    pub max_us: u64,
    /// Sum.
    pub total_us: u64,
}

/// ibping's summary (`report`).
pub fn print_summary(
    out: &mut dyn Write,
    host: &str,
    dest: &str,
    s: &Stats,
    total_ms: u64,
) -> core::fmt::Result {
    let lost = s.ntrans - s.replied.min(s.ntrans);
    writeln!(out, "\n--- {host} ({dest}) ibping statistics ---")?;
    writeln!(
        out,
        "{} packets transmitted, {} received, {}% packet loss, time {} ms",
        s.ntrans,
        s.replied,
        if lost != 0 { lost * 100 / s.ntrans } else { 0 },
        total_ms
    )?;
    let min = if s.replied == 0 { 0 } else { s.min_us };
    let avg = s.total_us.checked_div(s.replied).unwrap_or(0);
    writeln!(
        out,
        "rtt min/avg/max = {}.{:03}/{}.{:03}/{}.{:03} ms",
        min / 1000,
        min % 1000,
        avg / 1000,
        avg % 1000,
        s.max_us / 1000,
        s.max_us % 1000
    )
}

const USAGE: &str = "usage: ibping [-c COUNT] [-G] [-L] DEST  (DEST: a LID, or with -G a port GUID; the responder runs in every node's kernel)";

/// `ibping [-c COUNT] [-G] DEST`: pings DEST's responder once a second.
pub fn ibping(
    core: &mut IbCore,
    sa: Option<ib_core::ClientId>,
    src: Src,
    args: &[&str],
    interrupted: &mut dyn FnMut() -> bool,
    out: &mut dyn Write,
) -> Result<(), String> {
    let mut count = DEFAULT_COUNT;
    let mut guid = false;
    let mut dest = None;
    let mut it = args.iter();
    while let Some(&a) = it.next() {
        match a {
            "-c" | "--count" => {
                let v = it.next().ok_or("-c needs a count")?;
                count = v
                    .parse()
                    .ok()
                    .filter(|c| (1..=100_000).contains(c))
                    .ok_or_else(|| format!("bad count '{v}' (1 to 100000)"))?;
            }
            "-G" | "--Guid" => guid = true,
            "-L" | "--Lid" => guid = false,
            "-h" | "--help" => return Err(String::from(USAGE)),
            "-S" | "--Server" => {
                return Err(String::from(
                    "the ibping responder already runs in this kernel (from boot): nothing to start",
                ));
            }
            "-f" | "--flood" | "-o" | "--oui" => {
                return Err(format!("{a} is not supported here ({USAGE})"));
            }
            _ if a.starts_with('-') => return Err(format!("unknown option '{a}' ({USAGE})")),
            _ if dest.is_some() => return Err(String::from(USAGE)),
            _ => dest = Some(a),
        }
    }
    let d = dest.ok_or(USAGE)?;
    let lid = if guid {
        let g = parse_num(d).ok_or_else(|| format!("bad port GUID '{d}'"))?;
        let sa = sa.ok_or("resolving a GUID needs the SA client")?;
        crate::diags::path_to_guid(core, sa, src, g, Duration::from_secs(4))
            .map_err(|e| format!("can't resolve destination port {d}: {e}"))?
            .dlid
    } else {
        match crate::diags::PortId::parse(d, false)? {
            crate::diags::PortId::Lid(l) => l,
            crate::diags::PortId::Dr(_) => return Err(String::from(USAGE)),
        }
    };
    let agent = core
        .register_mad_agent(src.dev, src.port, QpType::Gsi, None, 0)
        .map_err(|e| format!("can't register a MAD agent: {e}"))?;
    let r = ping_loop(core, agent, src, lid, count, interrupted, out);
    let _ = core.unregister_mad_agent(agent);
    r
}

fn parse_num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn ping_loop(
    core: &mut IbCore,
    agent: MadAgent,
    src: Src,
    lid: u16,
    count: u32,
    interrupted: &mut dyn FnMut() -> bool,
    out: &mut dyn Write,
) -> Result<(), String> {
    let dest = format!("Lid {lid}");
    let mut s = Stats {
        min_us: u64::MAX,
        ..Stats::default()
    };
    let mut host = String::new();
    let start = core.clock().now_ns();
    let mut stopped = false;
    for i in 0..count {
        if i > 0 {
            // ibping waits a second between pings; interruptible here.
            let next = Deadline::after(core.clock(), Duration::from_secs(1));
            while !next.expired(core.clock()) {
                core.poll();
                if interrupted() {
                    stopped = true;
                    break;
                }
                core.clock().delay(Duration::from_millis(10));
            }
            if stopped {
                break;
            }
        }
        let mut mad = Mad::new_request(IB_VENDOR_OPENIB_PING_CLASS, 1, method::GET, 0, 0);
        let oui = IB_OPENIB_OUI.to_be_bytes();
        mad.0[37..40].copy_from_slice(&oui[1..]);
        let mut buf = MadSendBuf::new(
            mad,
            AhAttr {
                dlid: lid,
                port_num: src.port,
                ..AhAttr::default()
            },
            1,
        );
        buf.remote_qkey = IB_QP1_QKEY;
        buf.timeout_ms = PING_TIMEOUT.as_millis() as u32;
        buf.retries = 0;
        s.ntrans += 1;
        let t0 = core.clock().now_ns();
        let r = core.send_mad_wait(agent, buf, PING_TIMEOUT + Duration::from_millis(500));
        let rtt_us = core.clock().now_ns().saturating_sub(t0) / 1000;
        match r {
            Ok((done, Some(resp))) if done.status == WcStatus::Success => {
                if resp.mad.mgmt_class() != IB_VENDOR_OPENIB_PING_CLASS || resp.mad.status() != 0 {
                    continue;
                }
                let name = node_desc_string(&resp.mad.0[IB_VENDOR_RANGE2_DATA_OFFS..]);
                if host.is_empty() {
                    host = name.clone();
                }
                s.replied += 1;
                s.total_us += rtt_us;
                s.min_us = s.min_us.min(rtt_us);
                s.max_us = s.max_us.max(rtt_us);
                let _ = writeln!(
                    out,
                    "Pong from {name} ({dest}): time {}.{:03} ms",
                    rtt_us / 1000,
                    rtt_us % 1000
                );
            }
            // A lost ping is counted, not printed (as ibping).
            _ => {}
        }
        if interrupted() {
            break;
        }
    }
    let total_ms = core.clock().now_ns().saturating_sub(start) / 1_000_000;
    let _ = print_summary(out, &host, &dest, &s, total_ms);
    if s.replied == 0 {
        return Err(format!("no answer from {dest}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_in_ibping_words() {
        let s = Stats {
            ntrans: 4,
            replied: 3,
            min_us: 57,
            max_us: 81,
            total_us: 57 + 73 + 81,
        };
        let mut o = String::new();
        print_summary(&mut o, "node1 HCA-1", "Lid 3", &s, 3012).unwrap();
        assert_eq!(
            o,
            "\n--- node1 HCA-1 (Lid 3) ibping statistics ---\n4 packets transmitted, 3 received, 25% packet loss, time 3012 ms\nrtt min/avg/max = 0.057/0.070/0.081 ms\n"
        );
        let mut o = String::new();
        print_summary(&mut o, "", "Lid 9", &Stats::default(), 0).unwrap();
        assert!(o.contains("0 packets transmitted, 0 received, 0% packet loss"));
        assert!(o.contains("rtt min/avg/max = 0.000/0.000/0.000 ms"));
    }
}
