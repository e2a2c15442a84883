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

/// The embedded SM's log, counters and remote SMs, and the server's
/// counters (one lock of the world).
fn sm_report(rig: &Rig) -> String {
    let w = rig.world();
    let sm = w.fabric.sm().expect("the embedded SM");
    format!(
        "{}\n{:?}\nremote SMs {:?}\nserver {:?}, {} pending",
        sm.log().join("\n"),
        sm.stats(),
        sm.remote_sms(),
        w.server.stats(),
        w.server.pending()
    )
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
        // Light sweeps every second: the one after OpenSM's first sweep
        // reads its SMInfo again (STANDBY by then).
        fabric
            .add_sm_on_free_port(SmConfig {
                sweep_interval_ns: 1_000_000_000,
                ..SmConfig::default()
            })
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
    // The embedded SM heard of it at once: H1's SMA sent trap 144 when
    // OpenSM set IsSM, the heavy sweep that followed read its SMInfo. That
    // read may come while OpenSM still discovers (state 1, as on a loaded
    // machine); as OpenSM's, only a later sweep's SMInfo Get shows it
    // standing by (a standby's polls do not tell the master its state).
    let h1 = rig.world().server.node("H1").unwrap().port_guid();
    let heard = rig.wait_for(Duration::from_secs(5), |w| {
        w.fabric
            .sm()
            .is_some_and(|s| s.remote_sms().iter().any(|r| r.0 == h1))
    });
    let what = sm_report(&rig);
    assert!(heard, "{what}");
    let found = rig.wait_for(Duration::from_secs(5), |w| {
        w.fabric
            .sm()
            .is_some_and(|s| s.remote_sms().iter().any(|r| r.0 == h1 && r.3 == 2))
    });
    let what = sm_report(&rig);
    assert!(found, "{what}");
    assert!(rig.world().fabric.sm().unwrap().is_master());
}

/// OpenSM of a higher priority started beside the embedded SM (master):
/// the embedded SM finds it (trap 144, heavy sweep, SMInfo), hands over
/// and stands by, polling it; OpenSM is master ("SUBNET UP"), no port
/// leaving Active. When OpenSM ends, the embedded SM's polls go unanswered
/// and it takes the subnet back, every LID kept.
#[test]
fn a_higher_opensm_gets_the_handover_and_the_embedded_sm_takes_over_when_it_ends() {
    if !tools_present("a_higher_opensm_gets_the_handover") {
        return;
    }
    let mut rig = Rig::start_with("embsm-handover", |fabric| {
        let topo = Topology::from_netfile(NET_SMALL).expect("net file");
        let built = topo.build(fabric).expect("build");
        let nodes = built
            .hcas
            .iter()
            .map(|h| HostNode::new(fabric, &h.name, h.node_guid, h.ports[0]))
            .collect();
        fabric
            .add_sm_on_free_port(SmConfig {
                priority: 1,
                polling_interval_ns: 1_000_000_000,
                ..SmConfig::default()
            })
            .expect("a free switch port");
        nodes
    });
    assert!(rig.wait_for(Duration::from_secs(10), |w| {
        w.fabric
            .sm()
            .is_some_and(|s| s.is_master() && !s.sweeping())
    }));
    let lids: Vec<u16> = rig.world().server.nodes().iter().map(|n| n.lid()).collect();
    let h1_lid = lids[0];
    let pid = rig.start_opensm("H1", &["-p", "10", "-s", "1"]);
    let t = Instant::now();
    let standby = rig.wait_for(Duration::from_secs(30), |w| {
        w.fabric
            .sm()
            .is_some_and(|s| s.sm_state() == sim::fabric::sm::sm_state::STANDBY)
    });
    let log = rig.opensm_log();
    let what = sm_report(&rig);
    assert!(standby, "{what}\nOpenSM:\n{log}");
    let waited = Instant::now();
    let mut log = String::new();
    while waited.elapsed() < Duration::from_secs(30) {
        log = rig.opensm_log();
        if log.contains("SUBNET UP") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let what = sm_report(&rig);
    assert!(
        log.contains("SUBNET UP"),
        "OpenSM is master:\n{log}\nembedded SM: {what}"
    );
    println!("handover to OpenSM in {:?}", t.elapsed());
    assert_eq!(rig.world().fabric.sm().unwrap().stats().handovers_sent, 1);
    let (ok, out, _) = rig.diag("H3", "/usr/sbin/sminfo", &[], DIAG_LIMIT);
    assert!(ok, "sminfo:\n{out}");
    assert!(
        out.contains(&format!("sminfo: sm lid {h1_lid} "))
            && out.contains("priority 10")
            && out.contains("SMINFO_MASTER"),
        "OpenSM on H1 is master:\n{out}"
    );
    assert!(
        rig.world()
            .server
            .nodes()
            .iter()
            .all(|n| { n.state() == sim::LogicalState::Active && n.sm_lid() == h1_lid })
    );
    // OpenSM ends: the embedded SM takes over.
    rig.stop_pid(pid);
    let t = Instant::now();
    let back = rig.wait_for(Duration::from_secs(30), |w| {
        w.fabric
            .sm()
            .is_some_and(|s| s.is_master() && !s.sweeping())
    });
    let what = sm_report(&rig);
    assert!(back, "{what}");
    println!(
        "embedded SM master again {:?} after OpenSM ended",
        t.elapsed()
    );
    let sm_lid = rig.world().fabric.sm().unwrap().lid();
    let after: Vec<u16> = rig.world().server.nodes().iter().map(|n| n.lid()).collect();
    assert_eq!(lids, after, "LIDs kept");
    assert!(rig.wait_for(Duration::from_secs(5), |w| {
        w.server
            .nodes()
            .iter()
            .all(|n| n.state() == sim::LogicalState::Active && n.sm_lid() == sm_lid)
    }));
}
