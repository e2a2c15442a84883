//! Our kernel's SM (`ib_sm`, inside guest a's ib_core) and the real OpenSM on one fabric: the election both ways, and the handover when the master goes.
//!
//! OpenSM (Debian's, under umad2sim, on the SM host through the fabric's ibsim
//! server) and our SM find each other by the IsSM bit of each other's port and
//! SubnGet(SMInfo); the higher priority (then the lower port GUID) is master and
//! the other stands by, as IBTA 14.4 and OpenSM's `osm_sm_state_mgr.c` have it.
//! Skipped loudly without the packages.

use tests::subnet_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ib_core::verbs::EventType;
use ib_sm::SmConfig;
use ib_sm::ib_types::sm_state;
use sim::fabric::{Fabric, Topology};
use subnet_common::*;

const LIMIT: Duration = Duration::from_secs(40);

struct Net {
    fabric: Arc<Mutex<Fabric>>,
    a: Guest,
    b: Guest,
    osm: OpenSm,
    sm: ib_core::ClientId,
}

/// The fabric with OpenSM started on the SM host (`opensm`), or only its
/// server (OpenSM started later with [`OpenSm::restart`]).
fn net(test: &str, opensm: bool, args: &[&str]) -> Net {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let (mut a, b) = sync_guests(&fabric, &built);
    let sm = ib_sm::init(&mut a.core);
    let osm = OpenSm::start(test, &fabric, built.switches[0].1, opensm, args);
    Net {
        fabric,
        a,
        b,
        osm,
        sm,
    }
}

/// Our SM's config for these tests: polls every half second, gives up on a
/// master after two unanswered polls.
fn ours(priority: u8) -> SmConfig {
    SmConfig {
        priority,
        polling_timeout_ms: 500,
        polling_retries: 2,
        sweep_interval_ms: 1000,
        ..SmConfig::default()
    }
}

fn our_state(core: &mut ib_core::IbCore, sm: ib_core::ClientId, dev: ib_core::DeviceId) -> u8 {
    ib_sm::status(core, sm, dev).map_or(0xff, |s| s.state)
}

fn report(n: &mut Net) -> String {
    format!(
        "--- our SM:\n{}\n{:?}\n--- OpenSM:\n{}",
        ib_sm::log(&mut n.a.core, n.sm, n.a.dev)
            .unwrap_or_default()
            .join("\n"),
        ib_sm::status(&mut n.a.core, n.sm, n.a.dev),
        n.osm.current_log()
    )
}

/// Runs the guests and the server until `done`.
fn pump(n: &mut Net, limit: Duration, mut done: impl FnMut(&mut Net) -> bool) -> bool {
    let t = std::time::Instant::now();
    loop {
        for _ in 0..64 {
            n.osm.round(&mut [&mut n.a, &mut n.b]);
        }
        if done(n) {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
    }
}

/// The net for `test` without OpenSM, our SM (priority 5) started in guest
/// a and master with both guests' ports Active.
fn ours_master(test: &str) -> Net {
    let mut n = net(test, false, &[]);
    ib_sm::start(&mut n.a.core, n.sm, n.a.dev, 1, ours(5)).unwrap();
    let (sm, dev) = (n.sm, n.a.dev);
    let ok = pump(&mut n, LIMIT, |n| {
        our_state(&mut n.a.core, sm, dev) == sm_state::MASTER && n.a.active() && n.b.active()
    });
    assert!(ok, "ours up:\n{}", report(&mut n));
    n
}

fn smhost_lid(n: &Net) -> u16 {
    n.osm.svc.server.node("smhost").map_or(0, |h| h.lid())
}

#[test]
fn opensm_at_a_lower_priority_stands_by_and_takes_over_at_our_handover() {
    if !peers_present("opensm_at_a_lower_priority_stands_by_and_takes_over_at_our_handover") {
        return;
    }
    // Our SM first, master of the subnet; then OpenSM starts (the SM host's
    // IsSM appears) and finds a master of a higher priority.
    let mut n = ours_master("ksm-lower");
    let (sm, dev) = (n.sm, n.a.dev);
    n.osm
        .restart(&mut [&mut n.a, &mut n.b], &["-p", "0", "-s", "1"]);
    let ok = pump(&mut n, LIMIT, |n| {
        n.osm.current_log().contains("Entering STANDBY state")
            && our_state(&mut n.a.core, sm, dev) == sm_state::MASTER
            && n.b.port(1).sm_lid == n.a.port(1).lid
    });
    let rep = report(&mut n);
    assert!(ok, "OpenSM (0) stands by, ours (5) is master:\n{rep}");
    let la = n.a.port(1).lid;
    assert_eq!(n.b.port(1).sm_lid, la);
    assert!(n.a.active() && n.b.active());
    // Our SM goes: it hands over to OpenSM, which takes the subnet without a
    // port leaving Active.
    let before = [n.a.events().len(), n.b.events().len()];
    let lids = [n.a.port(1).lid, n.b.port(1).lid];
    ib_sm::stop(&mut n.a.core, sm, dev, Duration::from_secs(5)).unwrap();
    let ok = pump(&mut n, LIMIT, |n| {
        let host = smhost_lid(n);
        ib_sm::running(&mut n.a.core, sm).is_none()
            && n.osm.current_log().contains("Entering MASTER state")
            && host != 0
            && n.a.port(1).sm_lid == host
            && n.b.port(1).sm_lid == host
    });
    let rep = format!(
        "{}\n{}",
        tests::mlx4_common::log_lines("opensm:").join("\n"),
        n.osm.current_log()
    );
    assert!(ok, "OpenSM took over:\n{rep}");
    assert!(rep.contains("Handing over mastership"), "{rep}");
    // A port's change event comes through its guest's async EQ, read at
    // the guest's next poll: the round whose QUERY_PORT showed the new SM
    // LID can come before it. Rounds until each guest has one (the checks
    // below say what is missing if none comes).
    let told = |g: &Guest, from: usize| {
        g.events()[from..]
            .iter()
            .any(|e| matches!(e, (EventType::SmChange | EventType::ClientReregister, 1)))
    };
    pump(&mut n, Duration::from_secs(5), |n| {
        told(&n.a, before[0]) && told(&n.b, before[1])
    });
    for (k, g) in [&mut n.a, &mut n.b].into_iter().enumerate() {
        assert!(g.active(), "{}", g.name);
        assert_eq!(g.port(1).lid, lids[k], "{}: LID kept", g.name);
        let ev = g.events()[before[k]..].to_vec();
        assert!(
            !ev.contains(&(EventType::PortErr, 1)),
            "{}: no port left Active: {ev:?}",
            g.name
        );
        assert!(
            ev.contains(&(EventType::SmChange, 1))
                || ev.contains(&(EventType::ClientReregister, 1)),
            "{}: {ev:?}",
            g.name
        );
    }
    let Net {
        a, b, osm, fabric, ..
    } = n;
    drop(fabric);
    osm.stop();
    a.teardown();
    b.teardown();
}

/// OpenSM at a higher priority arrives while ours is master: ours hands it
/// the subnet and stands by within seconds (not by OpenSM's polling
/// timeout, five polls 10 s apart). OpenSM meets a HANDOVER while it
/// discovers only with another sweep (`osm_sm_state_mgr.c`), so ours hands
/// over once OpenSM stands by (its Trap 144 says so).
#[test]
fn opensm_at_a_higher_priority_arriving_gets_the_subnet_by_our_handover() {
    if !peers_present("opensm_at_a_higher_priority_arriving_gets_the_subnet_by_our_handover") {
        return;
    }
    let mut n = ours_master("ksm-arrive");
    let (sm, dev) = (n.sm, n.a.dev);
    let lids = [n.a.port(1).lid, n.b.port(1).lid];
    let t = std::time::Instant::now();
    n.osm
        .restart(&mut [&mut n.a, &mut n.b], &["-p", "10", "-s", "1"]);
    let ok = pump(&mut n, Duration::from_secs(15), |n| {
        let host = smhost_lid(n);
        n.osm.current_log().contains("Entering MASTER state")
            && our_state(&mut n.a.core, sm, dev) == sm_state::STANDBY
            && host != 0
            && n.a.port(1).sm_lid == host
            && n.b.port(1).sm_lid == host
    });
    let rep = report(&mut n);
    assert!(ok, "OpenSM (10) master by our handover within 15 s:\n{rep}");
    eprintln!(
        "OpenSM (10) master {:.1} s after its start",
        t.elapsed().as_secs_f64()
    );
    // The HANDOVER went to an OpenSM standing by (its answer gives its
    // state before it), not to one still discovering, which may lose it.
    assert!(
        rep.contains("HANDOVER to SM 0x0002c90300000f01 answered (its state STANDBY)"),
        "{rep}"
    );
    for (k, g) in [&mut n.a, &mut n.b].into_iter().enumerate() {
        assert!(g.active(), "{}", g.name);
        assert_eq!(g.port(1).lid, lids[k], "{}: LID kept", g.name);
    }
    let Net {
        a, b, osm, fabric, ..
    } = n;
    drop(fabric);
    osm.stop();
    a.teardown();
    b.teardown();
}

#[test]
fn our_sm_stands_by_for_opensm_at_a_higher_priority_and_takes_over_when_it_dies() {
    if !peers_present(
        "our_sm_stands_by_for_opensm_at_a_higher_priority_and_takes_over_when_it_dies",
    ) {
        return;
    }
    let mut n = net("ksm-higher", true, &["-p", "10", "-s", "1"]);
    let ok = pump(&mut n, LIMIT, |n| {
        n.osm.subnet_ups() >= 1 && n.a.active() && n.b.active()
    });
    assert!(ok, "OpenSM up:\n{}", n.osm.current_log());
    let (sm, dev) = (n.sm, n.a.dev);
    ib_sm::start(&mut n.a.core, sm, dev, 1, ours(0)).unwrap();
    let ok = pump(&mut n, LIMIT, |n| {
        our_state(&mut n.a.core, sm, dev) == sm_state::STANDBY
    });
    let rep = report(&mut n);
    assert!(ok, "ours (0) stands by for OpenSM (10):\n{rep}");
    // It stays so across OpenSM's sweeps (each poll answered).
    pump(&mut n, Duration::from_secs(3), |_| false);
    let host = smhost_lid(&n);
    let st = ib_sm::status(&mut n.a.core, sm, dev).unwrap();
    let rep = report(&mut n);
    assert_eq!(st.state, sm_state::STANDBY, "{rep}");
    assert_eq!(st.master_lid, host, "{rep}");
    assert_eq!(n.b.port(1).sm_lid, host);
    assert!(
        !n.osm.current_log().contains("Entering STANDBY"),
        "OpenSM stayed master:\n{rep}"
    );
    // OpenSM dies: our standby stops hearing it and takes the subnet,
    // keeping every LID, no port leaving Active.
    let before = [n.a.events().len(), n.b.events().len()];
    let lids = [n.a.port(1).lid, n.b.port(1).lid];
    {
        let now = n.a.hca.clock().now_ns();
        let mut f = n.fabric.lock().unwrap();
        n.osm.svc.stop(&mut f, now);
    }
    let ok = pump(&mut n, LIMIT, |n| {
        our_state(&mut n.a.core, sm, dev) == sm_state::MASTER
            && n.b.port(1).sm_lid == n.a.port(1).lid
            && n.a.port(1).sm_lid == n.a.port(1).lid
    });
    let rep = report(&mut n);
    assert!(ok, "ours took over:\n{rep}");
    for (k, g) in [&mut n.a, &mut n.b].into_iter().enumerate() {
        assert!(g.active(), "{}", g.name);
        assert_eq!(g.port(1).lid, lids[k], "{}: LID kept", g.name);
        let ev = g.events()[before[k]..].to_vec();
        assert!(
            !ev.contains(&(EventType::PortErr, 1)),
            "{}: no port left Active: {ev:?}",
            g.name
        );
    }
    let Net {
        a, b, osm, fabric, ..
    } = n;
    drop(fabric);
    osm.stop();
    a.teardown();
    b.teardown();
}

/// Two SMs of the same priority: the lower port GUID wins (guest a's
/// 0x0002c90300000011 against the SM host's 0x0002c90300000f01). OpenSM,
/// master first, hears our trap 144 and hands over.
#[test]
fn with_equal_priorities_the_lower_guid_wins_and_opensm_hands_over() {
    if !peers_present("with_equal_priorities_the_lower_guid_wins_and_opensm_hands_over") {
        return;
    }
    let mut n = net("ksm-equal", true, &["-p", "3", "-s", "1"]);
    let ok = pump(&mut n, LIMIT, |n| {
        n.osm.subnet_ups() >= 1 && n.a.active() && n.b.active()
    });
    assert!(ok, "OpenSM up:\n{}", n.osm.current_log());
    let (sm, dev) = (n.sm, n.a.dev);
    ib_sm::start(&mut n.a.core, sm, dev, 1, ours(3)).unwrap();
    let ok = pump(&mut n, LIMIT, |n| {
        our_state(&mut n.a.core, sm, dev) == sm_state::MASTER
            && n.osm.current_log().contains("Entering STANDBY state")
            && n.b.port(1).sm_lid == n.a.port(1).lid
    });
    let rep = report(&mut n);
    assert!(ok, "ours (lower GUID) master, OpenSM standby:\n{rep}");
    let st = ib_sm::status(&mut n.a.core, sm, dev).unwrap();
    assert!(st.stats.handovers_received >= 1, "{rep}");
    assert!(n.a.active() && n.b.active());
    let Net {
        a, b, osm, fabric, ..
    } = n;
    drop(fabric);
    osm.stop();
    a.teardown();
    b.teardown();
}
