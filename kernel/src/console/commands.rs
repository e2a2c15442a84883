//! The shell's commands.
//!
//! The shell's commands. Each takes its arguments and a writer and returns
//! `Err(message)` on failure; names and output follow the Linux tools they are
//! named after.

use alloc::format;
use alloc::string::{String, ToString};
use core::fmt::Write;

use super::CmdResult;

/// One shell command.
pub struct Command {
    /// What the user types.
    pub name: &'static str,
    /// Usage line shown by `help`.
    pub usage: &'static str,
    /// What it does.
    pub help: &'static str,
    /// The implementation.
    pub run: fn(&mut dyn Write, &[&str]) -> CmdResult,
}

static COMMANDS: &[Command] = &[
    Command {
        name: "help",
        usage: "help",
        help: "list the commands",
        run: help,
    },
    Command {
        name: "lspci",
        usage: "lspci [-v] [-n]",
        help: "list PCI functions",
        run: lspci,
    },
    Command {
        name: "dmesg",
        usage: "dmesg",
        help: "print the kernel log buffer",
        run: dmesg,
    },
    Command {
        name: "meminfo",
        usage: "meminfo",
        help: "memory map and allocator usage",
        run: meminfo,
    },
    Command {
        name: "log",
        usage: "log [LEVEL|module=LEVEL,...]",
        help: "show or set log filters (off error warn info debug trace)",
        run: log_cmd,
    },
    Command {
        name: "status",
        usage: "status",
        help: "whether the previous command succeeded (status 0) or failed (1), as $?",
        run: status,
    },
    Command {
        name: "uptime",
        usage: "uptime",
        help: "time since kernel entry",
        run: uptime,
    },
    Command {
        name: "sleep",
        usage: "sleep SECONDS",
        help: "wait, running the progress loop (events, errors)",
        run: sleep,
    },
    Command {
        name: "retry",
        usage: "retry [-n TIMES] [-i SECONDS] [-u] COMMAND [ARGS...]",
        help: "run COMMAND until it succeeds, or with -u until it fails (10 times, 1 s apart by default; Ctrl-C stops)",
        run: retry,
    },
    Command {
        name: "ibv_devices",
        usage: "ibv_devices",
        help: "RDMA devices and their node GUIDs, as rdma-core's tool",
        run: super::ib::ibv_devices,
    },
    Command {
        name: "ibv_devinfo",
        usage: "ibv_devinfo [-v] [-d DEVICE]",
        help: "HCA and port attributes, as rdma-core's tool",
        run: super::ib::ibv_devinfo,
    },
    Command {
        name: "ibstat",
        usage: "ibstat [CA_NAME]",
        help: "HCA and port state, as infiniband-diags' tool",
        run: super::ib::ibstat,
    },
    Command {
        name: "show_gids",
        usage: "show_gids [DEV]",
        help: "the ports' GIDs (RoCE: from the MAC and the IPv4 addresses), as Mellanox's script",
        run: super::ib::show_gids,
    },
    Command {
        name: "ib_write_bw",
        usage: "ib_write_bw [-s SIZE] [-n ITERS] [-a] [--check] [-d DEV] [-i PORT] [-g GIDX] [LID|GUID|GID]",
        help: "RDMA WRITE bandwidth, as perftest (no peer: server; -h for the options)",
        run: super::perftest::ib_write_bw,
    },
    Command {
        name: "ib_write_lat",
        usage: "ib_write_lat [-s SIZE] [-n ITERS] [-a] [--check] [-d DEV] [-i PORT] [-g GIDX] [LID|GUID|GID]",
        help: "RDMA WRITE latency, as perftest (no peer: server; -h for the options)",
        run: super::perftest::ib_write_lat,
    },
    Command {
        name: "ib_read_bw",
        usage: "ib_read_bw [-s SIZE] [-n ITERS] [-a] [--check] [-d DEV] [-i PORT] [-g GIDX] [LID|GUID|GID]",
        help: "RDMA READ bandwidth, as perftest (no peer: server; -h for the options)",
        run: super::perftest::ib_read_bw,
    },
    Command {
        name: "ib_read_lat",
        usage: "ib_read_lat [-s SIZE] [-n ITERS] [-a] [--check] [-d DEV] [-i PORT] [-g GIDX] [LID|GUID|GID]",
        help: "RDMA READ latency, as perftest (no peer: server; -h for the options)",
        run: super::perftest::ib_read_lat,
    },
    Command {
        name: "ib_send_bw",
        usage: "ib_send_bw [-s SIZE] [-n ITERS] [-a] [--check] [-d DEV] [-i PORT] [-g GIDX] [LID|GUID|GID]",
        help: "SEND bandwidth, as perftest (no peer: server; -h for the options)",
        run: super::perftest::ib_send_bw,
    },
    Command {
        name: "ib_send_lat",
        usage: "ib_send_lat [-s SIZE] [-n ITERS] [-a] [--check] [-d DEV] [-i PORT] [-g GIDX] [LID|GUID|GID]",
        help: "SEND latency, as perftest (no peer: server; -h for the options)",
        run: super::perftest::ib_send_lat,
    },
    Command {
        name: "ib_atomic_lat",
        usage: "ib_atomic_lat [-s SIZE] [-n ITERS] [-a] [--check] [-d DEV] [-i PORT] [-g GIDX] [LID|GUID|GID]",
        help: "atomic latency, as perftest (no peer: server; -h for the options)",
        run: super::perftest::ib_atomic_lat,
    },
    Command {
        name: "ibv_rc_pingpong",
        usage: "ibv_rc_pingpong [-s SIZE] [-n ITERS] [-r RX_DEPTH] [-m MTU] [-g GIDX] [-c] [-d DEV] [-i PORT] [LID|GUID|GID]",
        help: "RC SEND ping-pong, as rdma-core's example (no peer: server; -h for the options)",
        run: super::perftest::ibv_rc_pingpong,
    },
    Command {
        name: "ibv_ud_pingpong",
        usage: "ibv_ud_pingpong [-s SIZE] [-n ITERS] [-r RX_DEPTH] [-g GIDX] [-c] [-d DEV] [-i PORT] [LID|GUID|GID]",
        help: "UD SEND ping-pong, as rdma-core's example (no peer: server; -h for the options)",
        run: super::perftest::ibv_ud_pingpong,
    },
    Command {
        name: "perfquery",
        usage: "perfquery [-x] [-a] [-G] [-C CA] [-P PORT] [LID|GUID [PORT]]",
        help: "port counters through the PMA, as infiniband-diags' tool",
        run: super::diags::perfquery,
    },
    Command {
        name: "smpquery",
        usage: "smpquery [-D|-G] [-C CA] [-P PORT] nodeinfo|nodedesc|portinfo|switchinfo [DEST [PORT]]",
        help: "SMP queries, LID or directed route, as infiniband-diags' tool",
        run: super::diags::smpquery,
    },
    Command {
        name: "sminfo",
        usage: "sminfo [-C CA] [-P PORT] [SM_LID]",
        help: "the master subnet manager's SMInfo",
        run: super::diags::sminfo,
    },
    Command {
        name: "saquery",
        usage: "saquery [-C CA] [-P PORT] [-N] [LID|NODE_DESC] | saquery -p [LID] | saquery -g",
        help: "NodeRecords, PathRecords and multicast groups from the SA, as infiniband-diags' tool",
        run: super::diags::saquery,
    },
    Command {
        name: "ibnetdiscover",
        usage: "ibnetdiscover [-s] [-C CA] [-P PORT]",
        help: "walk the subnet by directed route and print its topology, as infiniband-diags' tool",
        run: super::diags::ibnetdiscover,
    },
    Command {
        name: "ibping",
        usage: "ibping [-c COUNT] [-G] [-C CA] [-P PORT] LID|GUID",
        help: "ping a node's ibping responder (every node runs one), as infiniband-diags' tool",
        run: super::diags::ibping,
    },
    Command {
        name: "ip",
        usage: "ip [-s] addr|link|neigh|route [...]",
        help: "IP addresses, links, neighbours and routes, as iproute2's ip (ip help)",
        run: super::net::ip,
    },
    Command {
        name: "ping",
        usage: "ping [-c N] [-s SIZE] [-i SECONDS] [-W SECONDS] [-w SECONDS] ADDR",
        help: "ICMP echo, as iputils' ping (Ctrl-C stops)",
        run: super::net::ping,
    },
    Command {
        name: "rping",
        usage: "rping -s [-vVd] [-S SIZE] [-C COUNT] [-a ADDR] [-p PORT] | rping -c [-vVd] [-S SIZE] [-C COUNT] [-I ADDR] -a ADDR [-p PORT]",
        help: "RDMA CM ping-pong by IP address (SEND, RDMA READ and WRITE), as rdma-core's rping",
        run: super::net::rping,
    },
    Command {
        name: "ethtool",
        usage: "ethtool -S DEV",
        help: "a link driver's own counters (IPoIB's drops by reason), as ethtool -S",
        run: super::net::ethtool,
    },
    Command {
        name: "tcpecho",
        usage: "tcpecho ADDR [-n BYTES] [-p PORT] [-t SECONDS]",
        help: "bytes (1 MiB) through a peer's TCP echo (port 7), checked and timed",
        run: super::net::tcpecho,
    },
    Command {
        name: "opensm",
        usage: "opensm [-p PRIO] [-s SECS] [-C CA] [-P PORT] | opensm status|log|stop",
        help: "our subnet manager and SA on this port, as OpenSM (-p priority, -s sweep)",
        run: super::opensm::opensm,
    },
    Command {
        name: "mlx4",
        usage: "mlx4 caps|catas",
        help: "QUERY_DEV_CAP dump; internal-error buffer state",
        run: super::ib::mlx4,
    },
    Command {
        name: "fwtrace",
        usage: "fwtrace on|off",
        help: "log every firmware command",
        run: super::ib::fwtrace,
    },
    Command {
        name: "rmem",
        usage: "rmem serve|connect|alloc|free|read|write|bench|stats|close ...",
        help: "remote memory: export a region, or connect and read/write/bench it",
        run: super::rmem::rmem,
    },
    Command {
        name: "pcache",
        usage: "pcache attach|run|lat|stats|flush|detach|experiment ...",
        help: "remote paging: a region whose faults are served over RDMA from memory nodes",
        run: super::pcache::pcache,
    },
    Command {
        name: "poweroff",
        usage: "poweroff",
        help: "power the machine off",
        run: poweroff,
    },
    Command {
        name: "reboot",
        usage: "reboot",
        help: "reset the machine",
        run: reboot,
    },
    Command {
        name: "crash",
        usage: "crash pagefault|invalid-opcode|gp|stack-overflow|panic",
        help: "provoke a fault to test the exception path",
        run: crash,
    },
];

/// Looks a command up by name.
pub fn find(name: &str) -> Option<&'static Command> {
    COMMANDS.iter().find(|c| c.name == name)
}

fn no_args(args: &[&str], usage: &str) -> CmdResult {
    if args.is_empty() {
        Ok(())
    } else {
        Err(format!("usage: {usage}"))
    }
}

fn status(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    no_args(args, "status")?;
    let st = if super::last_succeeded() { 0 } else { 1 };
    let _ = writeln!(out, "status {st}");
    Ok(())
}

fn help(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    no_args(args, "help")?;
    for c in COMMANDS {
        let _ = writeln!(out, "  {:<58} {}", c.usage, c.help);
    }
    Ok(())
}

fn lspci(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    super::lspci::run(out, args).map_err(String::from)
}

fn dmesg(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    no_args(args, "dmesg")?;
    crate::logger::with_dmesg(|bytes| {
        let _ = out.write_str(&String::from_utf8_lossy(bytes));
    });
    Ok(())
}

fn kib(b: u64) -> u64 {
    b / 1024
}

fn meminfo(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    no_args(args, "meminfo")?;
    let (usable, handed_out) = crate::mm::frame::stats();
    let (ks, ke) = boot::kernel_image();
    let (heap, heap_used, heap_free) = crate::mm::heap::stats();
    let _ = writeln!(out, "MemTotal:     {:>10} kB", kib(usable));
    let _ = writeln!(
        out,
        "MemFree:      {:>10} kB",
        kib(usable.saturating_sub(handed_out + (ke - ks)))
    );
    let _ = writeln!(
        out,
        "KernelImage:  {:>10} kB  [{ks:#x}-{:#x}]",
        kib(ke - ks),
        ke - 1
    );
    let _ = writeln!(out, "HeapTotal:    {:>10} kB", kib(heap as u64));
    let _ = writeln!(out, "HeapUsed:     {:>10} kB", kib(heap_used as u64));
    let _ = writeln!(out, "HeapFree:     {:>10} kB", kib(heap_free as u64));
    if let Some(pool) = crate::mm::dma::pool() {
        let s = pool.stats();
        let mut ranges = alloc::vec::Vec::new();
        crate::mm::dma::ranges(|base, len| ranges.push((base, len)));
        let _ = writeln!(
            out,
            "DmaTotal:     {:>10} kB  in {} range(s)",
            kib(crate::mm::dma::total() as u64),
            ranges.len()
        );
        for (base, len) in ranges {
            let _ = writeln!(
                out,
                "DmaRange:     {:>10} kB  [{base:#x}-{:#x}]",
                kib(len as u64),
                base + len as u64 - 1
            );
        }
        let _ = writeln!(
            out,
            "DmaUsed:      {:>10} kB  in {} allocations",
            kib(s.bytes as u64),
            s.allocations
        );
    }
    let _ = writeln!(out, "Memory map ({}):", crate::boot_info().protocol);
    crate::print_memory_map(out);
    Ok(())
}

fn log_cmd(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    match args {
        [] => {
            let _ = out.write_str("log filter: ");
            let _ = crate::logger::describe(out);
            let _ = writeln!(out);
            Ok(())
        }
        [spec] => crate::logger::set_filter(spec).map_err(String::from),
        _ => Err("usage: log [LEVEL|module=LEVEL,...]".to_string()),
    }
}

fn uptime(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    no_args(args, "uptime")?;
    let us = crate::time::uptime_us();
    let s = us / 1_000_000;
    let _ = writeln!(
        out,
        "up {}:{:02}:{:02}.{:03} ({}.{:06} s since kernel entry)",
        s / 3600,
        s / 60 % 60,
        s % 60,
        us / 1000 % 1000,
        s,
        us % 1_000_000
    );
    Ok(())
}

fn sleep(_out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let usage = || "usage: sleep SECONDS (0 to 3600, fractions allowed)".to_string();
    let [arg] = args else { return Err(usage()) };
    let (whole, frac) = arg.split_once('.').unwrap_or((arg, ""));
    let secs: u64 = whole.parse().map_err(|_| usage())?;
    if secs > 3600 || frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(usage());
    }
    let micros = frac.parse::<u64>().unwrap_or(0) * 10u64.pow(6 - frac.len() as u32);
    let d = core::time::Duration::from_secs(secs) + core::time::Duration::from_micros(micros);
    let end = hal::Deadline::after(&crate::time::TscClock, d);
    while !end.expired(&crate::time::TscClock) {
        crate::progress();
        core::hint::spin_loop();
    }
    Ok(())
}

/// Runs a command until it succeeds: a scripted client started before its
/// server listens, or a query sent before the SM has finished, gets more
/// tries instead of a sleep long enough for the slowest machine. With `-u`,
/// until it fails: a node that serves a peer's script stays up (running
/// the progress loop between tries) until the peer stops answering.
fn retry(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let usage = || "usage: retry [-n TIMES] [-i SECONDS] [-u] COMMAND [ARGS...]".to_string();
    let (mut times, mut every, mut rest) = (10u32, 1u64, args);
    let mut until_fail = false;
    loop {
        match rest {
            ["-n", v, more @ ..] => {
                times = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(usage)?;
                rest = more;
            }
            ["-i", v, more @ ..] => {
                every = v.parse().ok().filter(|s| *s <= 3600).ok_or_else(usage)?;
                rest = more;
            }
            ["-u", more @ ..] => {
                until_fail = true;
                rest = more;
            }
            _ => break,
        }
    }
    let [name, cmd_args @ ..] = rest else {
        return Err(usage());
    };
    let cmd = find(name).ok_or_else(|| format!("{name}: command not found"))?;
    let (wanted, other) = if until_fail {
        ("failed", "succeeded")
    } else {
        ("succeeded", "failed")
    };
    for attempt in 1..=times {
        let ok = match (cmd.run)(out, cmd_args) {
            Ok(()) => true,
            Err(msg) => {
                if !msg.is_empty() {
                    let _ = writeln!(out, "{name}: {msg}");
                }
                false
            }
        };
        if ok != until_fail {
            if until_fail {
                let _ = writeln!(out, "retry: {name} {wanted} (try {attempt} of {times})");
            }
            return Ok(());
        }
        if attempt == times {
            break;
        }
        let _ = writeln!(
            out,
            "retry: {name} {other} ({attempt} of {times}); again in {every} s"
        );
        let end = hal::Deadline::after(
            &crate::time::TscClock,
            core::time::Duration::from_secs(every),
        );
        while !end.expired(&crate::time::TscClock) {
            crate::progress();
            if crate::console::ctrl_c() {
                return Err(format!(
                    "interrupted after {attempt} failed tries of {name}"
                ));
            }
            core::hint::spin_loop();
        }
    }
    Err(format!("{name} {other} {times} times"))
}

fn poweroff(_out: &mut dyn Write, args: &[&str]) -> CmdResult {
    no_args(args, "poweroff")?;
    crate::println!("Power down.");
    crate::qemu::exit(crate::qemu::ExitCode::Success)
}

fn reboot(_out: &mut dyn Write, args: &[&str]) -> CmdResult {
    no_args(args, "reboot")?;
    crate::println!("Restarting system.");
    crate::qemu::reboot()
}

#[inline(never)]
fn recurse(depth: u64) -> u64 {
    let pad = core::hint::black_box([depth; 64]);
    if depth == u64::MAX {
        return pad[0];
    }
    recurse(core::hint::black_box(depth + 1)) + pad[63]
}

fn crash(_out: &mut dyn Write, args: &[&str]) -> CmdResult {
    match args {
        ["pagefault"] => {
            let p = core::hint::black_box(0x0000_6000_dead_0000_u64) as *mut u64;
            // SAFETY: deliberately unsound: this address is never mapped, so the
            // write faults before it can corrupt anything.
            unsafe { p.write_volatile(0x42) };
        }
        ["invalid-opcode"] => {
            // SAFETY: ud2 raises #UD; the handler stops the machine.
            unsafe { core::arch::asm!("ud2") };
        }
        ["gp"] => {
            let p = core::hint::black_box(0x8000_0000_0000_0000_u64) as *const u64;
            // SAFETY: deliberately faults: a non-canonical address raises #GP
            // before any memory is read.
            let _ = unsafe { p.read_volatile() };
        }
        ["stack-overflow"] => {
            core::hint::black_box(recurse(0));
        }
        ["panic"] => panic!("crash panic requested from the console"),
        _ => {
            return Err(
                "usage: crash pagefault|invalid-opcode|gp|stack-overflow|panic".to_string(),
            );
        }
    }
    Err("the fault did not happen".to_string())
}
