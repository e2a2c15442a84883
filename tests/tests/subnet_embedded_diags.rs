//! infiniband-diags from the host against the fabric's embedded SM and SA, beside the same tools against OpenSM on the same topology.
//!
//! Two driver-run guests on the `--nodes 2` switch, a node on the switch's
//! first free port and the SM host the ibsim server attaches (where the
//! diags run). Once that node is the embedded SM (the server alone), once
//! it is a plain host node with the embedded SM's GUID and description
//! while OpenSM runs on the SM host: the same five nodes on the same ports
//! both times. `sminfo`, `saquery` of every record type, `ibroute` and
//! `ibnetdiscover` must print the same thing, stricter than
//! `subnet_kernel_sm_diags.rs`: a LID is replaced by the name of the node
//! that holds it (the SMs may number the nodes differently, but a record
//! must name the same node), and only what belongs to the SM itself (its
//! port's GUID, its ActCount, its port's capability mask) is masked; rates,
//! MTUs, thresholds, counts and ports are compared as printed. umad2sim hands
//! a host tool only the first 256 bytes of a MAD, so a table longer than
//! one segment is cut the same way for both SAs. Skipped loudly without the
//! packages.

use tests::subnet_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sim::fabric::{Fabric, HostNode, SmConfig, Topology};
use subnet_common::*;

const LIMIT: Duration = Duration::from_secs(40);
const DIAG: Duration = Duration::from_secs(20);

/// The diags run, each with its arguments (`{a}`, `{b}`, `{sw}`, `{smn}`
/// stand for the LIDs of guest a, guest b, the switch and the node on the
/// embedded SM's port).
const DIAGS: &[(&str, &str)] = &[
    ("/usr/sbin/sminfo", ""),
    ("/usr/sbin/saquery", "-c"),
    ("/usr/sbin/saquery", "NR {a}"),
    ("/usr/sbin/saquery", "-s"),
    ("/usr/sbin/saquery", "PIR {b}"),
    ("/usr/sbin/saquery", "PIR {sw}"),
    ("/usr/sbin/saquery", "-p --src-to-dst {a}:{b}"),
    ("/usr/sbin/saquery", "-p --src-to-dst {b}:{smn}"),
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

/// The node on the embedded SM's port: the embedded SM's own GUID and
/// description.
fn sm_node_config() -> SmConfig {
    SmConfig {
        // OpenSM's default priority, so `sminfo` prints the same.
        priority: 0,
        description: "smnode".into(),
        ..SmConfig::default()
    }
}

struct Run {
    a: Guest,
    b: Guest,
    osm: OpenSm,
    outs: Vec<(String, String)>,
}

fn run(test: &str, embedded: bool) -> Run {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let cfg = sm_node_config();
    let sw_id = built.switches[0].1;
    let mut extra = Vec::new();
    if embedded {
        f.add_sm_on_free_port(cfg.clone())
            .expect("embedded SM port");
    } else {
        // The same node, on the same switch port, with no SM in it.
        let port = (1..=36u8)
            .find(|&p| f.switch_port(sw_id, p).is_some_and(|q| f.peer(q).is_none()))
            .expect("free switch port");
        let q = f.switch_port(sw_id, port).unwrap();
        let p = f.attach_hca_port(cfg.node_guid, 1);
        f.connect(p, q).expect("cable");
        let mut n = HostNode::new(&mut f, &cfg.description, cfg.node_guid, p);
        n.description = cfg.description.clone();
        extra.push(n);
    }
    let fabric = Arc::new(Mutex::new(f));
    let (mut a, mut b) = sync_guests(&fabric, &built);
    let mut osm = OpenSm::start_with(test, &fabric, sw_id, !embedded, &[], extra);
    let who = if embedded { "embedded" } else { "OpenSM" };
    osm.wait_subnet_up(&mut a, &mut b, LIMIT, !embedded, who);
    let (la, lb) = (a.port(1).lid, b.port(1).lid);
    let (sw, smn, host) = {
        let f = fabric.lock().unwrap();
        let sw = f.switch(sw_id).map_or(0, |s| s.lid());
        let smn = if embedded {
            f.sm().map_or(0, |s| s.lid())
        } else {
            osm.svc.server.node(&cfg.description).map_or(0, |n| n.lid())
        };
        let host = osm.svc.server.node("smhost").map_or(0, |h| h.lid());
        (sw, smn, host)
    };
    let names = Names {
        lids: [
            (la, "a"),
            (lb, "b"),
            (sw, "switch"),
            (smn, "smnode"),
            (host, "smhost"),
        ]
        .into_iter()
        .collect(),
        sm: if embedded { smn } else { host },
    };
    assert_eq!(names.lids.len(), 5, "five distinct LIDs: {:?}", names.lids);
    let mut outs = Vec::new();
    for (prog, template) in DIAGS {
        let lids = [("a", la), ("b", lb), ("sw", sw), ("smn", smn)];
        let (_, out) = osm.patient_diag(&mut [&mut a, &mut b], prog, template, &lids, DIAG);
        let name = format!("{} {template}", prog.rsplit('/').next().unwrap_or(prog));
        // Outputs that list the SM's own records.
        let sm_only = prog.ends_with("sminfo") || ["-s", "SMIR"].contains(template);
        let switch_pir = *template == "PIR {sw}";
        outs.push((name, normalize(&out, &names, sm_only, switch_pir)));
    }
    drop(fabric);
    Run { a, b, osm, outs }
}

/// Whether `s` is a whole number token (decimal, or 0x-hex).
fn number(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

/// Field names (saquery's `name....value`) whose value is a LID.
fn lid_field(name: &str) -> bool {
    let n = name.trim_end_matches(':').to_ascii_lowercase();
    n.ends_with("lid")
}

/// Field names whose value is the master SM's LID.
fn sm_lid_field(name: &str) -> bool {
    let n = name.trim_end_matches(':').to_ascii_lowercase();
    n == "smlid" || n == "master_sm_base_lid"
}

/// What a run's outputs are normalized by: the LIDs by holder, and the
/// master SM's LID.
struct Names {
    lids: BTreeMap<u16, &'static str>,
    sm: u16,
}

impl Names {
    /// A LID token as its holder's name (`LID(SM)` where `sm` asks for the
    /// master SM's and it is that).
    fn lid(&self, v: &str, sm: bool) -> Option<String> {
        let n = u16::try_from(number(v)?).ok()?;
        if sm && n == self.sm {
            return Some("LID(SM)".into());
        }
        self.lids.get(&n).map(|s| format!("LID({s})"))
    }

    /// `w` with the word after each of `keys` read as a LID.
    fn words(&self, t: &str, keys: &[&str], sm: bool) -> String {
        let w: Vec<&str> = t.split(' ').collect();
        let mut o = Vec::new();
        for (i, x) in w.iter().enumerate() {
            let prev = if i > 0 { w[i - 1] } else { "" };
            o.push(if keys.contains(&prev) {
                let bare = x.trim_end_matches([';', ',']);
                let suffix = &x[bare.len()..];
                self.lid(bare, sm)
                    .map_or_else(|| x.to_string(), |n| format!("{n}{suffix}"))
            } else {
                x.to_string()
            });
        }
        o.join(" ")
    }
}

/// An output with every LID replaced by its holder's name and what belongs
/// to the SM itself masked: its LID where a field names the master SM (and
/// throughout `sm_only` outputs, which list the SM's own records), its
/// GUID and ActCount, its port's capability mask, and the port of the
/// switch its SMPs enter by (LocalPort of the switch's port 0).
fn normalize(s: &str, names: &Names, sm_only: bool, switch_pir: bool) -> String {
    let mut out = String::new();
    for line in s.lines() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        let mut l = String::from(indent);
        if let Some(dots) = t.find("..") {
            // saquery: "name.........value"
            let (name, rest) = t.split_at(dots);
            let value = rest.trim_start_matches('.');
            let lname = name.trim_end_matches(':').to_ascii_lowercase();
            let v = if lid_field(name) {
                let sm = sm_only || sm_lid_field(name);
                names.lid(value, sm).unwrap_or_else(|| value.to_string())
            } else if matches!(lname.as_str(), "guid" | "actcount")
                || (sm_only && lname == "capability_mask")
                || (lname == "localport" && switch_pir)
            {
                "<sm>".into()
            } else {
                value.to_string()
            };
            l.push_str(&format!("{name}..{v}"));
        } else if let Some(rest) = t.strip_prefix("sminfo: ") {
            // "sm lid 1 sm guid 0x..., activity count 5 priority 0 state 3 SMINFO_MASTER"
            let w: Vec<&str> = rest.split_whitespace().collect();
            let mut o = Vec::new();
            for (i, x) in w.iter().enumerate() {
                let prev = if i > 0 { w[i - 1] } else { "" };
                o.push(match prev {
                    "lid" => names.lid(x, true).unwrap_or_else(|| x.to_string()),
                    "guid" | "count" => "<sm>".into(),
                    _ => x.to_string(),
                });
            }
            l.push_str("sminfo: ");
            l.push_str(&o.join(" "));
        } else if t.starts_with("# Topology file: generated on") {
            l.push_str("# Topology file: generated on <date>");
        } else if let Some((head, tail)) = t
            .split_once(' ')
            .filter(|(h, tail)| h.starts_with("0x") && tail.contains(" : ("))
        {
            // ibroute: "0x0003 001 : (Channel Adapter portguid 0x...: 'a')"
            l.push_str(&names.lid(head, false).unwrap_or_else(|| head.to_string()));
            l.push(' ');
            l.push_str(tail);
        } else if let Some((a, b)) = t
            .split_once('\t')
            .filter(|(a, b)| number(a).is_some() && number(b).is_some())
        {
            // saquery LFTR: "LID\tPort".
            l.push_str(&names.lid(a, false).unwrap_or_else(|| a.to_string()));
            l.push('\t');
            l.push_str(b);
        } else {
            l.push_str(&names.words(t, &["lid", "Lid", "slid", "dlid"], sm_only));
        }
        out.push_str(&l);
        out.push('\n');
    }
    out
}

#[test]
fn diags_print_the_same_against_the_embedded_sm_and_opensm() {
    if !peers_present("diags_print_the_same_against_the_embedded_sm_and_opensm") {
        return;
    }
    let r1 = run("emb-diags-embedded", true);
    let ours = r1.outs;
    r1.osm.stop();
    r1.a.teardown();
    r1.b.teardown();
    let r2 = run("emb-diags-osm", false);
    let theirs = r2.outs;
    r2.osm.stop();
    r2.a.teardown();
    r2.b.teardown();
    let mut bad = Vec::new();
    for ((name, o), (_, t)) in ours.iter().zip(&theirs) {
        if std::env::var_os("SHOW_DIAGS").is_some() {
            eprintln!("===== {name}\n--- embedded:\n{o}\n--- OpenSM:\n{t}");
        }
        // Line order may differ where it follows the LIDs (ibroute).
        let lines = |x: &str| {
            let mut v: Vec<String> = x.lines().map(str::to_string).collect();
            v.sort();
            v
        };
        if lines(o) != lines(t) {
            bad.push(format!(
                "===== {name}\n--- embedded:\n{o}\n--- OpenSM:\n{t}"
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    for (name, o) in &ours {
        let empty_ok = name.contains(" SR") || name.contains(" MFTR");
        assert!(empty_ok || !o.trim().is_empty(), "{name} printed nothing");
    }
}
