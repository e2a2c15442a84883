//! infiniband-diags from the host against our kernel's SM and SA, beside the same tools against OpenSM on the same topology.
//!
//! Two driver-run guests on the `--nodes 2` switch and the fabric's SM host,
//! where the diags attach through the ibsim server (umad2sim). Once with our
//! SM in guest a (the server alone, `--sm none`), once with the real OpenSM on
//! the SM host: `sminfo`, `saquery` of every record type, `ibroute` and
//! `ibnetdiscover` print the same structure both times (the LIDs, GUIDs and
//! counts that differ by who is SM are masked; a path's MTU, rate and
//! lifetime and a port's error thresholds are compared as printed; not yet
//! a switch port's partition enforcement, which OpenSM turns on toward CAs
//! after writing their P_Key tables and our SM, without a P_Key manager,
//! leaves off). umad2sim hands a host tool
//! only the first 256 bytes of a MAD, so a table longer than one segment is
//! cut the same way for both SAs (the guests' own consoles reassemble RMPP;
//! `qemu_kernel_sm.rs`). Skipped loudly without the packages.

use tests::subnet_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ib_sm::SmConfig;
use sim::fabric::{Fabric, Topology};
use subnet_common::*;

const LIMIT: Duration = Duration::from_secs(40);
const DIAG: Duration = Duration::from_secs(20);

/// The diags run, each with its arguments (`{a}`, `{b}`, `{sw}` stand for
/// guest a's, guest b's and the switch's LIDs).
const DIAGS: &[(&str, &str)] = &[
    ("/usr/sbin/sminfo", ""),
    ("/usr/sbin/saquery", "-c"),
    ("/usr/sbin/saquery", "NR {a}"),
    ("/usr/sbin/saquery", "-s"),
    ("/usr/sbin/saquery", "PIR {b}"),
    ("/usr/sbin/saquery", "PIR {sw}"),
    ("/usr/sbin/saquery", "-p --src-to-dst {a}:{b}"),
    ("/usr/sbin/saquery", "-x"),
    ("/usr/sbin/saquery", "SWIR"),
    ("/usr/sbin/saquery", "SMIR"),
    ("/usr/sbin/saquery", "LFTR {sw}"),
    ("/usr/sbin/saquery", "MCMR"),
    ("/usr/sbin/saquery", "-g"),
    ("/usr/sbin/saquery", "SR"),
    ("/usr/sbin/saquery", "MFTR"),
    ("/usr/sbin/ibroute", "{sw}"),
    ("/usr/sbin/ibnetdiscover", ""),
];

struct Run {
    fabric: Arc<Mutex<Fabric>>,
    a: Guest,
    b: Guest,
    osm: OpenSm,
}

fn run(test: &str, ours: bool) -> (Run, Vec<(String, String)>) {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let (mut a, mut b) = sync_guests(&fabric, &built);
    let mut osm = OpenSm::start(test, &fabric, built.switches[0].1, !ours, &[]);
    if ours {
        let sm = ib_sm::init(&mut a.core);
        ib_sm::start(&mut a.core, sm, a.dev, 1, SmConfig::default()).unwrap();
    }
    let who = if ours { "ours" } else { "OpenSM" };
    osm.wait_subnet_up(&mut a, &mut b, LIMIT, !ours, who);
    let (la, lb) = (a.port(1).lid, b.port(1).lid);
    let sw = ours_switch_lid(&mut osm, &mut a, &mut b);
    let mut outs = Vec::new();
    for (prog, template) in DIAGS {
        let lids = [("a", la), ("b", lb), ("sw", sw)];
        let (args, out) = osm.patient_diag(&mut [&mut a, &mut b], prog, template, &lids, DIAG);
        let name = format!("{} {args}", prog.rsplit('/').next().unwrap_or(prog));
        outs.push((name, out));
    }
    (Run { fabric, a, b, osm }, outs)
}

/// The switch's LID: from `smpquery -D nodeinfo`? Simpler: the LFT owner
/// is the LID neither guest nor the SM host has, among 1..=4.
fn ours_switch_lid(osm: &mut OpenSm, a: &mut Guest, b: &mut Guest) -> u16 {
    let host = osm.svc.server.node("smhost").map_or(0, |h| h.lid());
    let taken = [a.port(1).lid, b.port(1).lid, host];
    (1..=4).find(|l| !taken.contains(l)).unwrap_or(0)
}

/// saquery fields compared as printed: they do not depend on who is SM
/// (a path's MTU, rate and packet lifetime, a port's error thresholds).
const EXACT: &[&str] = &[
    "mtu..",
    "rate..",
    "pkt_life..",
    "LocalPhysErr:",
    "OverrunErr:",
];

/// An output with what depends on who is SM masked: every number (LIDs,
/// GUIDs, ActCount, capability masks of the SM's port) but on the lines of
/// [`EXACT`] fields.
fn mask(s: &str) -> String {
    s.lines()
        .map(|l| {
            if EXACT.iter().any(|f| l.trim_start().starts_with(f)) {
                format!("{l}\n")
            } else {
                mask_numbers(&format!("{l}\n"))
            }
        })
        .collect()
}

/// `s` with every number, decimal or 0x-hex, as `#`.
fn mask_numbers(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            // A number, decimal or 0x-hex, with its hex digits.
            let mut hex = false;
            if c == '0' && chars.peek() == Some(&'x') {
                chars.next();
                hex = true;
            }
            while let Some(&d) = chars.peek() {
                if d.is_ascii_digit() || (hex && d.is_ascii_hexdigit()) {
                    chars.next();
                } else {
                    break;
                }
            }
            out.push('#');
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn diags_print_the_same_structure_against_our_sm_and_opensm() {
    if !peers_present("diags_print_the_same_structure_against_our_sm_and_opensm") {
        return;
    }
    let (r1, ours) = run("ksm-diags-ours", true);
    let Run { a, b, osm, fabric } = r1;
    osm.stop();
    drop(fabric);
    a.teardown();
    b.teardown();
    let (r2, theirs) = run("ksm-diags-osm", false);
    let Run { a, b, osm, fabric } = r2;
    osm.stop();
    drop(fabric);
    a.teardown();
    b.teardown();
    let mut bad = Vec::new();
    for ((name, o), (_, t)) in ours.iter().zip(&theirs) {
        if std::env::var_os("SHOW_DIAGS").is_some() {
            eprintln!("===== {name}\n--- ours:\n{o}\n--- OpenSM:\n{t}");
        }
        // Line order may differ where it follows the LIDs (ibroute).
        let lines = |x: &str| {
            let mut v: Vec<String> = mask(x).lines().map(str::to_string).collect();
            v.sort();
            v
        };
        if lines(o) != lines(t) {
            bad.push(format!("===== {name}\n--- ours:\n{o}\n--- OpenSM:\n{t}"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // Empty on both sides only where both SAs have nothing to list.
    for (name, o) in &ours {
        let empty_ok = name.contains(" SR") || name.contains(" MFTR");
        assert!(empty_ok || !o.trim().is_empty(), "{name} printed nothing");
    }
}
