//! `opensm`: our subnet manager and SA (`ib_sm`) on one of this node's ports, started, stopped and shown in the words of OpenSM.
//!
//! `opensm [-p PRIORITY] [-s SWEEP_SECONDS] [-C CA] [-P PORT]` starts it (as
//! OpenSM's `-p` and `-s`; `-C`/`-P` pick the port as infiniband-diags do, the
//! first HCA's port 1 by default); it then runs from the progress loop and
//! from every command that polls ib_core, and logs its state changes and a
//! "SUBNET UP" line per heavy sweep. `opensm status` prints its SMInfo and
//! counters, `opensm log` its last lines, `opensm stop` stops it (a master
//! hands over to a standby SM first). OpenSM's configuration file, console
//! and daemon options are left out.

use alloc::format;
use alloc::string::{String, ToString};
use core::fmt::Write;
use core::time::Duration;

use ib_sm::SmConfig;
use ib_sm::ib_types::sm_state_str;

use crate::console::CmdResult;
use crate::hca::{self, Ib};

/// The SM client, registered at first use.
static CLIENT: spin::Mutex<Option<ib_core::ClientId>> = spin::Mutex::new(None);

fn client(ib: &mut Ib) -> ib_core::ClientId {
    *CLIENT
        .lock()
        .get_or_insert_with(|| ib_sm::init(&mut ib.core))
}

const USAGE: &str =
    "usage: opensm [-p PRIORITY] [-s SWEEP_SECONDS] [-C CA] [-P PORT] | opensm status|log|stop";

/// `opensm ...`.
pub fn opensm(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    match args.first().copied() {
        Some("stop") if args.len() == 1 => stop(out),
        Some("status") if args.len() == 1 => status(out),
        Some("log") if args.len() == 1 => log(out),
        Some("-h" | "--help") => {
            let _ = writeln!(out, "{USAGE}");
            Ok(())
        }
        _ => start(out, args),
    }
}

fn start(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let mut cfg = SmConfig::default();
    let mut ca: Option<&str> = None;
    let mut port: u8 = 1;
    let mut it = args.iter();
    while let Some(&a) = it.next() {
        let mut val = || {
            it.next()
                .copied()
                .ok_or_else(|| format!("{a} needs a value; {USAGE}"))
        };
        match a {
            "-p" | "--priority" => {
                let v = val()?;
                cfg.priority = v
                    .parse()
                    .ok()
                    .filter(|p| *p <= 15)
                    .ok_or_else(|| format!("bad priority '{v}' (0 to 15)"))?;
            }
            "-s" | "--sweep" => {
                let v = val()?;
                let s: u32 = v.parse().ok().filter(|s| *s <= 3600).ok_or_else(|| {
                    format!("bad sweep interval '{v}' (0 to 3600 seconds, 0: none)")
                })?;
                cfg.sweep_interval_ms = s * 1000;
            }
            "-C" | "--Ca" => ca = Some(val()?),
            "-P" | "--Port" => {
                let v = val()?;
                port = v
                    .parse()
                    .ok()
                    .filter(|p| (1..=2).contains(p))
                    .ok_or_else(|| format!("bad port '{v}' (1 or 2)"))?;
            }
            other => return Err(format!("unknown option '{other}'; {USAGE}")),
        }
    }
    hca::with(|ib| {
        let me = client(ib);
        if let Some((_, p)) = ib_sm::running(&mut ib.core, me) {
            return Err(format!("already running on port {p} (opensm stop first)"));
        }
        let Ib { core, hcas } = ib;
        let (dev, name) = super::perftest::pick(hcas, ca, |n| format!("CA '{n}' not found"))?;
        let name = name.to_string();
        let prio = cfg.priority;
        ib_sm::start(core, me, dev, port, cfg).map_err(|e| format!("{name} port {port}: {e}"))?;
        let _ = writeln!(
            out,
            "OpenSM (ib_sm) on {name} port {port}, priority {prio}: sweeping"
        );
        Ok(())
    })
    .unwrap_or_else(|| Err(no_hca()))
}

fn no_hca() -> String {
    "no HCA (no ConnectX-3 found, or its bring-up failed: see dmesg)".to_string()
}

fn stop(out: &mut dyn Write) -> CmdResult {
    hca::with(|ib| {
        let me = client(ib);
        let Some((dev, port)) = ib_sm::running(&mut ib.core, me) else {
            return Err("not running".to_string());
        };
        ib_sm::stop(&mut ib.core, me, dev, Duration::from_secs(3)).map_err(|e| e.to_string())?;
        // The SM closes from the progress function once its handover is
        // answered (bounded by the stop's timeout).
        let end = hal::Deadline::after(&crate::time::TscClock, Duration::from_secs(4));
        while ib_sm::running(&mut ib.core, me).is_some() && !end.expired(&crate::time::TscClock) {
            ib.core.poll();
        }
        let _ = writeln!(out, "OpenSM on port {port}: exiting");
        Ok(())
    })
    .unwrap_or_else(|| Err(no_hca()))
}

fn status(out: &mut dyn Write) -> CmdResult {
    hca::with(|ib| {
        let me = client(ib);
        let Some((dev, port)) = ib_sm::running(&mut ib.core, me) else {
            return Err("not running".to_string());
        };
        let Some(s) = ib_sm::status(&mut ib.core, me, dev) else {
            return Err("not running".to_string());
        };
        let _ = writeln!(
            out,
            "   SM State               : {} (priority {}) on port {port}",
            sm_state_str(s.state),
            s.priority
        );
        let _ = writeln!(out, "   SM Port GUID           : {:#018x}, LID {}", s.guid, s.lid);
        let _ = writeln!(
            out,
            "   Master SM              : {:#018x}, LID {}",
            s.master_guid, s.master_lid
        );
        let _ = writeln!(out, "   ActCount               : {}", s.act_count);
        let _ = writeln!(
            out,
            "   Subnet                 : {} nodes, {} end ports{}",
            s.nodes,
            s.ports,
            if s.sweeping { " (sweeping)" } else { "" }
        );
        let _ = writeln!(
            out,
            "   Sweeps                 : {} heavy, {} light; SUBNET UP {} times, errors {}",
            s.stats.heavy_sweeps, s.stats.light_sweeps, s.stats.subnet_ups, s.stats.init_errors
        );
        let _ = writeln!(
            out,
            "   SMPs                   : {} sent, {} retried, {} timed out, {} error answers, {} bad answers; last heavy sweep {} SMPs",
            s.smps.sent,
            s.smps.retried,
            s.smps.timeouts,
            s.smps.errors,
            s.smps.bad_answers,
            s.stats.smps_last_heavy
        );
        let up = s.stats.first_up_ns;
        let _ = writeln!(
            out,
            "   First SUBNET UP        : {}.{:03} ms after the start",
            up / 1_000_000,
            up / 1000 % 1000
        );
        let _ = writeln!(
            out,
            "   SA                     : {} requests, {} answered, {} errors, {} ignored; {} RMPP transfers",
            s.sa.received, s.sa.answered, s.sa.errors, s.sa.ignored, s.sa.rmpp_transfers
        );
        for (g, smi) in &s.remote_sms {
            let _ = writeln!(
                out,
                "   Other SM               : {g:#018x} {} (priority {})",
                sm_state_str(smi.state),
                smi.priority
            );
        }
        Ok(())
    })
    .unwrap_or_else(|| Err(no_hca()))
}

fn log(out: &mut dyn Write) -> CmdResult {
    hca::with(|ib| {
        let me = client(ib);
        let Some((dev, _)) = ib_sm::running(&mut ib.core, me) else {
            return Err("not running".to_string());
        };
        for l in ib_sm::log(&mut ib.core, me, dev).unwrap_or_default() {
            let _ = writeln!(out, "{l}");
        }
        Ok(())
    })
    .unwrap_or_else(|| Err(no_hca()))
}
