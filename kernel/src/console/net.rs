//! iproute2's `ip`, iputils' `ping` and rdma-core's `rping` in the shell, over the kernel's IP stack.
//!
//! `rping` runs `ib_tools::rping` on the RDMA CM, which finds its peer by
//! IP address through this stack (IPoIB's ARP); ib_core, the stack and the
//! RDMA CM's turn with it are polled between its steps, Ctrl-C ends it.
//!
//! `ip` runs `net::iproute` on the stack; `ping` runs `net::ping`, polling
//! ib_core and the stack between its steps, each wait bounded by ping's own
//! deadlines (`-c` with `-W`, or `-w`), and Ctrl-C ends it with its
//! statistics, as SIGINT ends iputils' ping. A ping that got no reply
//! fails the command (for `run=` scripts and `retry`) with no line of its
//! own: iputils' statistics have said it.

use alloc::string::{String, ToString};
use core::fmt::Write;

use net::ping::{self, Ping};

use crate::console::CmdResult;

const NO_STACK: &str = "the IP stack is not up";

/// `ip`.
pub fn ip(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    // With the adapters (a VLAN device registers its VID through them; an
    // address or link change reaches the RoCE GID tables at once, as
    // Linux's roce_gid_mgmt follows its address events), or the stack
    // alone when there is no adapter.
    crate::net::with(|s, core| {
        let r = net::iproute::ip(s, Some(core), args, &mut *out);
        crate::net::roce_sync(s, core);
        // ib_core takes the GID change events (its GID caches).
        core.poll();
        r
    })
    .or_else(|| crate::net::with_stack(|s| net::iproute::ip(s, None, args, &mut *out)))
    .unwrap_or_else(|| Err(NO_STACK.to_string()))
}

/// `ping`.
pub fn ping(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let o = ping::parse(args)?;
    let now = crate::net::now_us;
    let mut p = crate::net::with(|s, _| Ping::start(s, o, now(), out)).ok_or(NO_STACK)??;
    loop {
        crate::hca::poll();
        let go = crate::net::with(|s, core| {
            s.poll(now(), core);
            p.step(s, now(), out)
        });
        if go != Some(true) {
            break;
        }
        if crate::console::ctrl_c() {
            let _ = writeln!(out, "^C");
            break;
        }
        core::hint::spin_loop();
    }
    match crate::net::with(|s, _| p.finish(s, out)) {
        Some(true) => Ok(()),
        Some(false) => Err(String::new()),
        None => Err(NO_STACK.to_string()),
    }
}

/// `ethtool -S DEV`: the driver's statistics, as ethtool prints them
/// (IPoIB's counters; mlx4_en's device, ring and port counters, the port's
/// read from the firmware with DUMP_ETH_STATS).
pub fn ethtool(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let ["-S", dev] = args else {
        return Err("usage: ethtool -S DEV".to_string());
    };
    crate::net::with(|s, core| {
        let id = s.dev(dev).map_err(|e| alloc::format!("{e}"))?;
        let link = s.link_mut(id).ok_or(NO_STACK)?;
        let _ = writeln!(out, "NIC statistics:");
        if let Some(d) = link
            .as_any()
            .and_then(|a| a.downcast_ref::<ipoib::IpoibDev>())
        {
            d.counters().for_each(|k, v| {
                let _ = writeln!(out, "     {k}: {v}");
            });
        } else if let Some(en) = link
            .as_any()
            .and_then(|a| a.downcast_ref::<mlx4_en::EnShared>())
        {
            let en = en.lock();
            let Some(mdev) = crate::net::en_dev(core, en.handle) else {
                return Err(alloc::format!("{dev}: its adapter is gone"));
            };
            for (k, v) in en.ethtool_stats(mdev) {
                let _ = writeln!(out, "     {k}: {v}");
            }
        } else {
            let _ = writeln!(out, "no stats available");
        }
        Ok(())
    })
    .unwrap_or_else(|| Err(NO_STACK.to_string()))
}

/// The byte at `i` of what `tcpecho` sends.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8)) as u8
}

/// `tcpecho ADDR [-n BYTES] [-p PORT] [-t SECONDS]`: sends BYTES (1 MiB by
/// default) through the TCP echo service at ADDR (port 7), checks every
/// byte that comes back, and prints the time and the rate; fails at the
/// deadline (60 s), on a wrong byte, or if the peer closes first.
pub fn tcpecho(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    use net::smoltcp::socket::tcp::State;
    let usage = || "usage: tcpecho ADDR [-n BYTES] [-p PORT] [-t SECONDS]".to_string();
    let (mut total, mut port, mut secs, mut dst) = (1usize << 20, 7u16, 60u64, None);
    let mut it = args.iter();
    while let Some(&a) = it.next() {
        let mut val = || it.next().copied().ok_or_else(usage);
        match a {
            "-n" => {
                total = val()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=1usize << 30).contains(n))
                    .ok_or_else(usage)?
            }
            "-p" => port = val()?.parse().map_err(|_| usage())?,
            "-t" => {
                secs = val()?
                    .parse()
                    .ok()
                    .filter(|s| (1..=3600).contains(s))
                    .ok_or_else(usage)?
            }
            a => dst = Some(a.parse::<net::Ipv4Address>().map_err(|_| usage())?),
        }
    }
    let dst = dst.ok_or_else(usage)?;
    static NEXT_PORT: core::sync::atomic::AtomicU16 = core::sync::atomic::AtomicU16::new(0);
    let local = 41000 + NEXT_PORT.fetch_add(1, core::sync::atomic::Ordering::Relaxed) % 1000;
    let now = crate::net::now_us;
    let sock = crate::net::with(|s, _| s.tcp_connect(dst, port, local, 64 * 1024))
        .ok_or(NO_STACK)?
        .map_err(|e| alloc::format!("connect: {e}"))?;
    let t0 = now();
    let deadline = t0 + secs * 1_000_000;
    let (mut sent, mut got) = (0usize, 0usize);
    let mut chunk = alloc::vec![0u8; 16 * 1024];
    let mut result: Result<(), String> = Ok(());
    let mut connected_us = None;
    while got < total {
        crate::hca::poll();
        let step = crate::net::with(|s, core| {
            s.poll(now(), core);
            let Some(t) = s.tcp(sock) else {
                return Err("the socket is gone".to_string());
            };
            if t.may_send() && connected_us.is_none() {
                connected_us = Some(now());
            }
            while t.can_send() && sent < total {
                let n = (total - sent).min(chunk.len());
                for (k, b) in chunk[..n].iter_mut().enumerate() {
                    *b = pattern(sent + k);
                }
                match t.send_slice(&chunk[..n]) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => sent += k,
                }
            }
            while t.can_recv() {
                let n = t.recv_slice(&mut chunk).unwrap_or(0);
                if n == 0 {
                    break;
                }
                if let Some(k) = (0..n).find(|&k| chunk[k] != pattern(got + k)) {
                    return Err(alloc::format!("byte {} came back wrong", got + k));
                }
                got += n;
            }
            match t.state() {
                State::Closed | State::TimeWait | State::CloseWait | State::LastAck
                    if got < total =>
                {
                    Err(alloc::format!(
                        "the connection ended after {got} of {total} bytes ({})",
                        t.state()
                    ))
                }
                _ => Ok(()),
            }
        });
        match step {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                result = Err(e);
                break;
            }
            None => {
                result = Err(NO_STACK.to_string());
                break;
            }
        }
        if now() > deadline {
            result = Err(alloc::format!(
                "timed out after {secs} s: {sent} bytes sent, {got} back"
            ));
            break;
        }
        if crate::console::ctrl_c() {
            result = Err("interrupted".to_string());
            break;
        }
        core::hint::spin_loop();
    }
    let t1 = now();
    // A clean close, bounded; then the socket goes.
    let _ = crate::net::with(|s, _| {
        if let Some(t) = s.tcp(sock) {
            t.close();
        }
    });
    let end = now() + 1_000_000;
    while now() < end {
        crate::hca::poll();
        let closed = crate::net::with(|s, core| {
            s.poll(now(), core);
            s.tcp(sock)
                .is_none_or(|t| matches!(t.state(), State::Closed | State::TimeWait))
        });
        if closed != Some(false) {
            break;
        }
    }
    let _ = crate::net::with(|s, _| s.close(sock));
    result?;
    let from = connected_us.unwrap_or(t0);
    let us = t1.saturating_sub(from).max(1);
    let _ = writeln!(
        out,
        "tcpecho: {total} bytes echoed by {dst}:{port} in {}.{:03} s ({} KB/s each way; connect {}.{:03} ms)",
        us / 1_000_000,
        us / 1000 % 1000,
        total as u64 * 1_000_000 / us / 1000,
        from.saturating_sub(t0) / 1000,
        from.saturating_sub(t0) % 1000
    );
    Ok(())
}

/// `rping`.
pub fn rping(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    use core::task::Poll;
    use ib_tools::rping::{self, Rping};
    let p = match rping::Params::parse(args) {
        Ok(p) => p,
        Err(e) if e.is_empty() => {
            let _ = writeln!(out, "{}", rping::usage());
            return Ok(());
        }
        Err(e) => return Err(alloc::format!("{e} (rping -h for the options)")),
    };
    let now = crate::net::now_us;
    let start = crate::net::with_rdma_net(|n, core| {
        let cma = ib_core::cma::init(core);
        Rping::start(core, cma, n, &p, out).map(|r| (r, cma))
    });
    let (mut r, cma) = match start {
        Some(x) => x?,
        None => return Err(NO_STACK.to_string()),
    };
    let res = loop {
        let step = crate::net::with(|s, core| {
            core.poll();
            s.poll(now(), core);
            crate::net::rdma_cm_poll(s, core, cma);
            r.step(core, out)
        });
        match step {
            Some(Poll::Ready(x)) => break x,
            Some(Poll::Pending) => {}
            None => break Err(NO_STACK.to_string()),
        }
        if crate::console::ctrl_c() {
            let _ = writeln!(out, "^C");
            break Err(String::from("interrupted"));
        }
        core::hint::spin_loop();
    };
    crate::net::with(|_, core| r.finish(core));
    res.map_err(|e| {
        if p.server {
            alloc::format!("rping server failed: {e}")
        } else {
            alloc::format!("rping client failed: {e}")
        }
    })
}
