//! The real infiniband-diags against the embedded SM and SA.
//!
//! The real infiniband-diags (Debian's, under umad2sim, through the
//! fabric's ibsim server and a host node) against the embedded SM and SA:
//! `sminfo`, `saquery -p`, `saquery` NodeRecord by LID, `smpquery
//! portinfo`, `ibnetdiscover`. Skipped (loudly) without the packages.

use std::time::{Duration, Instant};

use sim::fabric::{HostNode, SmConfig, Topology};

#[path = "../peers/rig.rs"]
#[allow(dead_code)]
mod rig;

use rig::{NET_SMALL, Rig, tools_present};

const DIAG_LIMIT: Duration = Duration::from_secs(20);

fn field(out: &str, name: &str) -> String {
    out.lines()
        .map(str::trim)
        .find_map(|l| {
            let rest = l.strip_prefix(name)?;
            rest.starts_with([':', '.'])
                .then(|| rest.trim_start_matches([':', '.']).trim().to_string())
        })
        .unwrap_or_default()
}

#[test]
fn diags_read_the_embedded_sm_and_its_sa() {
    if !tools_present("diags_read_the_embedded_sm_and_its_sa") {
        return;
    }
    let t0 = Instant::now();
    let rig = Rig::start_with("embsm", |fabric| {
        let topo = Topology::from_netfile(NET_SMALL).expect("net file");
        let built = topo.build(fabric).expect("build");
        let nodes = built
            .hcas
            .iter()
            .map(|h| HostNode::new(fabric, &h.name, h.node_guid, h.ports[0]))
            .collect();
        fabric
            .add_sm_on_free_port(SmConfig::default())
            .expect("a free switch port");
        nodes
    });
    assert!(
        rig.wait_for(Duration::from_secs(10), |w| {
            w.fabric
                .sm()
                .is_some_and(|s| s.is_master() && !s.sweeping())
                && w.server.nodes().iter().all(|n| n.lid() != 0)
        }),
        "the embedded SM brought the subnet up"
    );
    let up = t0.elapsed();
    let (sm_lid, lids, smps) = {
        let w = rig.world();
        let sm = w.fabric.sm().unwrap();
        let lids: Vec<u16> = w.server.nodes().iter().map(|n| n.lid()).collect();
        (sm.lid(), lids, sm.stats().smps_last_heavy)
    };
    println!("embedded SM on NET_SMALL (real time, polled thread): up in {up:?}, {smps} SMPs");

    let (ok, out, _) = rig.diag("H1", "/usr/sbin/sminfo", &[], DIAG_LIMIT);
    assert!(ok, "sminfo:\n{out}");
    assert!(
        out.contains(&format!("sminfo: sm lid {sm_lid} ")) && out.contains("SMINFO_MASTER"),
        "sminfo names the embedded SM:\n{out}"
    );
    assert!(
        out.contains("sm guid 0x2c90300ff0001"),
        "its port GUID:\n{out}"
    );

    let (ok, out, _) = rig.diag("H2", "/usr/sbin/ibstat", &[], DIAG_LIMIT);
    assert!(ok, "ibstat:\n{out}");
    for want in [
        "State: Active".to_string(),
        format!("Base lid: {}", lids[1]),
        format!("SM lid: {sm_lid}"),
    ] {
        assert!(out.contains(&want), "ibstat on H2 shows {want:?}:\n{out}");
    }

    let src_dst = format!("{}:{}", lids[1], lids[2]);
    let (ok, out, _) = rig.diag(
        "H2",
        "/usr/sbin/saquery",
        &["-p", "--src-to-dst", &src_dst],
        DIAG_LIMIT,
    );
    assert!(ok, "saquery -p:\n{out}");
    assert_eq!(out.matches("PathRecord dump:").count(), 1, "{out}");
    assert_eq!(field(&out, "dlid"), lids[2].to_string(), "{out}");
    assert_eq!(field(&out, "slid"), lids[1].to_string(), "{out}");
    // Host nodes and the switch say 4096 and 4x QDR.
    assert_eq!(field(&out, "mtu"), "0x85", "4096, exactly: {out}");
    assert_eq!(field(&out, "rate"), "0x87", "40 Gb/s, exactly: {out}");
    assert_eq!(field(&out, "pkt_life"), "0x92", "{out}");
    assert_eq!(field(&out, "num_path_revers"), "0x80", "{out}");
    assert_eq!(field(&out, "pkey"), "0xFFFF", "{out}");
    println!("saquery -p against the embedded SA:\n{out}");

    let l3 = lids[2].to_string();
    let (ok, out, _) = rig.diag("H1", "/usr/sbin/saquery", &["NR", &l3], DIAG_LIMIT);
    assert!(ok, "saquery NR:\n{out}");
    assert!(out.contains("H3"), "NodeRecord of H3:\n{out}");
    assert!(out.contains("0x0002c90300000031"), "its port GUID:\n{out}");

    let (ok, out, _) = rig.diag("H1", "/usr/sbin/smpquery", &["portinfo", &l3], DIAG_LIMIT);
    assert!(ok, "smpquery portinfo:\n{out}");
    assert_eq!(field(&out, "SMLid"), sm_lid.to_string(), "{out}");
    assert_eq!(field(&out, "LinkState"), "Active", "{out}");

    let (ok, out, _) = rig.diag("H1", "/usr/sbin/ibnetdiscover", &[], DIAG_LIMIT);
    assert!(ok, "ibnetdiscover:\n{out}");
    for want in ["\"H1\"", "\"H2\"", "\"H3\"", "\"embedded SM\""] {
        assert!(out.contains(want), "ibnetdiscover shows {want}:\n{out}");
    }
}

#[test]
fn opensm_started_beside_the_embedded_sm_stands_by() {
    if !tools_present("opensm_started_beside_the_embedded_sm_stands_by") {
        return;
    }
    let mut rig = Rig::start_with("embsm-osm", |fabric| {
        let topo = Topology::from_netfile(NET_SMALL).expect("net file");
        let built = topo.build(fabric).expect("build");
        let nodes = built
            .hcas
            .iter()
            .map(|h| HostNode::new(fabric, &h.name, h.node_guid, h.ports[0]))
            .collect();
        fabric
            .add_sm_on_free_port(SmConfig::default())
            .expect("a free switch port");
        nodes
    });
    assert!(rig.wait_for(Duration::from_secs(10), |w| {
        w.fabric
            .sm()
            .is_some_and(|s| s.is_master() && !s.sweeping())
    }));
    let lids: Vec<u16> = rig.world().server.nodes().iter().map(|n| n.lid()).collect();
    // OpenSM (priority 0) finds our SM (priority 15, MASTER) by SMInfo and
    // yields, leaving the LIDs alone.
    rig.start_opensm("H1", &[]);
    let t = Instant::now();
    let mut log = String::new();
    while t.elapsed() < Duration::from_secs(20) {
        log = rig.opensm_log();
        if log.contains("STANDBY") {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(log.contains("STANDBY"), "OpenSM stands by:\n{log}");
    assert!(!log.contains("SUBNET UP"), "and does not take over:\n{log}");
    std::thread::sleep(Duration::from_millis(200));
    let after: Vec<u16> = rig.world().server.nodes().iter().map(|n| n.lid()).collect();
    assert_eq!(lids, after);
}
