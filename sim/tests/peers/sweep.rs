//! The subnet changes under OpenSM.
//!
//! A cable pulled and put back (the switch's Trap 128 makes OpenSM sweep at once),
//! OpenSM restarted, and a request nobody answers (it comes back timed out instead
//! of hanging).

use std::time::{Duration, Instant};

use sim::LogicalState;

use crate::rig::{NET_SMALL, Rig, tools_present};

const LIMIT: Duration = Duration::from_secs(30);

fn node_state(rig: &Rig, name: &str) -> (u16, LogicalState) {
    let w = rig.world();
    let n = w.server.node(name).expect("node");
    (n.lid(), n.state())
}

#[test]
fn cable_pulled_and_reinserted_comes_back_active_by_trap() {
    if !tools_present("cable_pulled_and_reinserted_comes_back_active_by_trap") {
        return;
    }
    let mut rig = Rig::start("cable", NET_SMALL);
    // No periodic sweep: only the switch's trap can make OpenSM look again.
    rig.start_opensm("H1", &["-s", "0"]);
    assert!(
        rig.wait_subnet_up(1, LIMIT).is_some(),
        "{}",
        rig.opensm_log()
    );
    let (lid, st) = node_state(&rig, "H3");
    assert_eq!(st, LogicalState::Active);

    let (port, peer) = {
        let w = rig.world();
        let p = w.server.node("H3").expect("H3").port;
        (p, w.fabric.peer(p).expect("H3 is cabled"))
    };
    rig.world().fabric.unplug(port).expect("unplug");
    assert!(
        rig.wait_for(LIMIT, |w| w
            .server
            .node("H3")
            .is_some_and(|n| n.state() == LogicalState::Down)),
        "H3 goes Down with its cable"
    );
    let t = Instant::now();
    let traps = rig.world().server.stats().traps_to_sm;
    assert!(
        traps >= 1,
        "the switch trapped the link going down: {traps}"
    );
    rig.world().fabric.connect(port, peer).expect("reinsert");
    let back = rig.wait_for(LIMIT, |w| {
        w.server
            .node("H3")
            .is_some_and(|n| n.state() == LogicalState::Active)
    });
    let took = t.elapsed();
    assert!(
        back,
        "H3 Active again after the cable is back; log:\n{}",
        rig.opensm_log()
    );
    let (lid2, _) = node_state(&rig, "H3");
    assert_eq!(lid2, lid, "H3 keeps its LID");
    eprintln!("H3 Active again {took:?} after the cable went back in (trap-driven sweep)");
    let traps = rig.world().server.stats().traps_to_sm;
    assert!(
        traps >= 2,
        "the switch trapped the link going down and up: {traps}"
    );
}

#[test]
fn opensm_restart_is_survived() {
    if !tools_present("opensm_restart_is_survived") {
        return;
    }
    let mut rig = Rig::start("restart", NET_SMALL);
    let pid = rig.start_opensm("H1", &[]);
    assert!(
        rig.wait_subnet_up(1, LIMIT).is_some(),
        "{}",
        rig.opensm_log()
    );
    let before: Vec<u16> = ["H1", "H2", "H3"]
        .iter()
        .map(|n| node_state(&rig, n).0)
        .collect();
    rig.stop_pid(pid);
    assert!(
        rig.wait_for(LIMIT, |w| w.server.clients().is_empty()),
        "OpenSM disconnected on exit: {:?}",
        rig.world().server.clients()
    );
    assert!(
        rig.world()
            .server
            .node("H1")
            .is_some_and(|n| n.cap_mask & sim::fabric::host_node::CAP_IS_SM == 0),
        "IsSM cleared when the SM left"
    );
    let t = Instant::now();
    rig.start_opensm("H1", &[]);
    let up = rig.wait_subnet_up(1, LIMIT);
    assert!(
        up.is_some(),
        "SUBNET UP again after the restart:\n{}",
        rig.opensm_log()
    );
    eprintln!("SUBNET UP {:?} after the restart", t.elapsed());
    for (i, n) in ["H1", "H2", "H3"].iter().enumerate() {
        let (lid, st) = node_state(&rig, n);
        assert_eq!(st, LogicalState::Active, "{n}");
        assert_eq!(lid, before[i], "{n} keeps its LID over the restart");
    }
    let (ok, out, _) = rig.diag("H2", "/usr/sbin/sminfo", &[], Duration::from_secs(20));
    assert!(
        ok && out.contains("SMINFO_MASTER"),
        "the new SM is master:\n{out}"
    );
}

#[test]
fn unanswered_requests_come_back_timed_out() {
    if !tools_present("unanswered_requests_come_back_timed_out") {
        return;
    }
    let mut rig = Rig::start("timeout", NET_SMALL);
    rig.start_opensm("H1", &[]);
    assert!(
        rig.wait_subnet_up(1, LIMIT).is_some(),
        "{}",
        rig.opensm_log()
    );
    let before = rig.world().server.stats().timeouts;
    // No LID 77 on this subnet: the switch drops the SMP.
    let (ok, out, took) = rig.diag("H2", "/usr/sbin/smpquery", &["nodeinfo", "77"], LIMIT);
    assert!(!ok, "smpquery of a LID nobody has fails:\n{out}");
    assert!(!out.contains("killed after"), "it did not hang:\n{out}");
    // Directed route out of a switch port with no cable.
    let (ok2, out2, took2) = rig.diag(
        "H2",
        "/usr/sbin/smpquery",
        &["-D", "nodeinfo", "0,1,7"],
        LIMIT,
    );
    assert!(!ok2 && !out2.contains("killed after"), "{out2}");
    let after = rig.world().server.stats().timeouts;
    assert!(
        after > before,
        "the server timed the requests out ({before} -> {after})"
    );
    assert_eq!(rig.world().server.pending(), 0, "nothing left waiting");
    eprintln!("unanswered smpquery gave up after {took:?} (LID) and {took2:?} (DR)");
}

#[test]
fn a_second_opensm_becomes_standby() {
    if !tools_present("a_second_opensm_becomes_standby") {
        return;
    }
    let mut rig = Rig::start("standby", NET_SMALL);
    rig.start_opensm("H1", &["-p", "10"]);
    assert!(
        rig.wait_subnet_up(1, LIMIT).is_some(),
        "{}",
        rig.opensm_log()
    );
    // A second SM on H2 (its own log and cache), lower priority: it finds
    // the master through SMInfo, which only the SM clients answer.
    let dir2 = rig.dir.join("sm2");
    std::fs::create_dir_all(&dir2).expect("dir");
    let mut c = sim::fabric::ibsim::opensm_command(&rig.base, "H2", &dir2);
    c.args(["-p", "1"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    rig.spawn(c);
    let log2 = dir2.join("opensm.log");
    let t = Instant::now();
    let mut text = String::new();
    while t.elapsed() < LIMIT {
        text = std::fs::read_to_string(&log2).unwrap_or_default();
        if text.contains("Entering STANDBY state") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        text.contains("Entering STANDBY state"),
        "second SM log:\n{text}"
    );
    assert!(
        !text.contains("SUBNET UP"),
        "the standby does not take over:\n{text}"
    );
    let (ok, out, _) = rig.diag("H3", "/usr/sbin/sminfo", &[], Duration::from_secs(20));
    assert!(ok && out.contains("SMINFO_MASTER"), "{out}");
    // H2's CapabilityMask gained IsSM when the second SM attached: its
    // node sent the master trap 144 (as ibsim does on SET_ISSM), which
    // makes OpenSM sweep heavily and find the new SM at once instead of at
    // its next heavy sweep.
    let h2 = node_state(&rig, "H2").0;
    assert!(
        rig.world().server.stats().traps_from_nodes >= 1,
        "{:?}",
        rig.world().server.stats()
    );
    let want = "Received Generic Notice type:4 num:144 (CapabilityMask";
    let from = format!("Producer:1 (Channel Adapter) from LID:{h2} ");
    let t = Instant::now();
    let mut master = rig.opensm_log();
    let seen = |log: &str| log.lines().any(|l| l.contains(want) && l.contains(&from));
    while t.elapsed() < LIMIT && !seen(&master) {
        std::thread::sleep(Duration::from_millis(10));
        master = rig.opensm_log();
    }
    assert!(seen(&master), "master's log:\n{master}");
}
