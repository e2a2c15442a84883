//! The fabric's embedded SM brings driver-run HCAs to Active.
//!
//! Two model HCAs, each with the real mlx4_core + mlx4_ib + ib_core, cabled to a
//! model switch (the `--nodes 2` topology) with the SM on the switch's next port;
//! every SMP of the sweep reaches the guests' QP0 and is answered by ib_core's
//! agent and mlx4_ib's MAD_IFC; no test shortcut touches a port (the links train
//! when ib_core opens QP0, the SM does the rest). Left out here: OpenSM
//! (`subnet_opensm.rs`).

use tests::subnet_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ib_core::verbs::{EventType, PortState};
use sim::fabric::{Fabric, PortId, SmConfig, Topology};
use subnet_common::*;

/// Wall time the SM may take (debug build, shared machine); a run takes
/// about 2 s of model time and a few seconds of wall time.
const UP_LIMIT: Duration = Duration::from_secs(20);

struct Subnet {
    fabric: Arc<Mutex<Fabric>>,
    a: Guest,
    b: Guest,
    /// Port GUIDs of the guests' port 1.
    guids: [u64; 2],
    /// Fabric ports of the guests' port 1.
    ports: [PortId; 2],
}

fn subnet() -> Subnet {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    f.add_sm_on_free_port(SmConfig::default())
        .expect("SM on switch port 3");
    let fabric = Arc::new(Mutex::new(f));
    let (a, b) = sync_guests(&fabric, &built);
    let guids = [built.hcas[0].node_guid + 1, built.hcas[1].node_guid + 1];
    let ports = [built.hcas[0].ports[0], built.hcas[1].ports[0]];
    Subnet {
        fabric,
        a,
        b,
        guids,
        ports,
    }
}

#[test]
fn embedded_sm_brings_two_driver_run_hcas_to_active() {
    let Subnet {
        fabric,
        mut a,
        mut b,
        guids,
        ..
    } = subnet();
    let up = pump_until(&mut [&mut a, &mut b], UP_LIMIT, 64, |g| {
        g.iter_mut().all(|g| g.active())
    });
    let (sm_lid, lids, log) = {
        let f = fabric.lock().unwrap();
        let sm = f.sm().unwrap();
        (
            sm.lid(),
            [sm.lid_of(guids[0]), sm.lid_of(guids[1])],
            format!("{}\n{:?}", sm.log().join("\n"), sm.stats()),
        )
    };
    assert!(up, "both ports Active within {UP_LIMIT:?}; SM log:\n{log}");
    let (pa, pb) = (a.port(1), b.port(1));
    assert_ne!(sm_lid, 0);
    for (g, p, lid) in [(&a, &pa, lids[0]), (&b, &pb, lids[1])] {
        let name = &g.name;
        assert_eq!(p.state, PortState::Active, "{name}: {p:?}");
        assert_eq!(p.phys_state, 5, "{name}: LinkUp");
        assert_eq!(
            Some(p.lid),
            lid,
            "{name}: query_port reports the LID the SM assigned\n{log}"
        );
        assert_eq!(p.sm_lid, sm_lid, "{name}: and the SM's LID");
        assert_eq!(p.subnet_timeout, 18, "{name}: SubnetTimeOut as set");
        // The port cache (what the SA client and the CM read) agrees.
        let c = g.core.device(g.dev).unwrap().port_cache(1).unwrap();
        assert_eq!((c.lid, c.sm_lid), (p.lid, sm_lid), "{name}: port cache");
        // The port events reached a client: the LID first (SubnSet
        // PortInfo snooped by mlx4_ib), then Active (PORT_CHANGE EQE).
        let ev = g.events();
        let lid_at = ev.iter().position(|e| *e == (EventType::LidChange, 1));
        let act_at = ev.iter().position(|e| *e == (EventType::PortActive, 1));
        assert!(
            lid_at.is_some() && act_at.is_some() && lid_at < act_at,
            "{name}: IB_EVENT_LID_CHANGE then IB_EVENT_PORT_ACTIVE on port 1: {ev:?}"
        );
        // One LID change: the SM sets PortInfo three times (LID, Armed,
        // Active), only the first changes the LID.
        let n = ev.iter().filter(|e| e.0 == EventType::LidChange).count();
        assert_eq!(n, 1, "{name}: one LID change: {ev:?}");
    }
    assert_ne!(pa.lid, pb.lid, "distinct LIDs");
    // The SM saw both CAs as the drivers describe them.
    {
        let f = fabric.lock().unwrap();
        let sm = f.sm().unwrap();
        for guid in guids {
            let e = sm
                .subnet()
                .iter()
                .find(|e| e.port_guid == guid)
                .expect("the CA in the SM's subnet");
            assert_eq!(e.node_type, 1, "a CA");
            assert_eq!(e.state(), 4, "Active in the SM's view");
        }
    }
    // The guest's SA client asks the embedded SM's SA for a path to the
    // other guest (a blocking query: the core's polling drives the wire),
    // then finds it in its cache.
    let p =
        ib_core::sa_query::path_to_lid(&mut a.core, a.sa, a.dev, 1, pb.lid, Duration::from_secs(5))
            .expect("PathRecord from the embedded SA");
    assert_eq!((p.slid, p.dlid), (pa.lid, pb.lid));
    // 4x FDR between the guests, 56 Gb/s as OpenSM rates it.
    assert_eq!((p.mtu, p.rate), (5, 12), "4096, 56 Gb/s");
    let again =
        ib_core::sa_query::path_to_lid(&mut a.core, a.sa, a.dev, 1, pb.lid, Duration::from_secs(5))
            .unwrap();
    assert_eq!(again, p);
    let c = ib_core::sa_query::counters(&mut a.core, a.sa, a.dev, 1).unwrap();
    assert_eq!((c.answered, c.cache_hits), (1, 1), "{c:?}");
    a.teardown();
    b.teardown();
}

fn up(s: &mut Subnet) {
    let ok = pump_until(&mut [&mut s.a, &mut s.b], UP_LIMIT, 64, |g| {
        g.iter_mut().all(|g| g.active())
    });
    let log = s.fabric.lock().unwrap().sm().unwrap().log().join("\n");
    assert!(ok, "both ports Active; SM log:\n{log}");
}

#[test]
fn embedded_sm_cable_pull_and_sm_restart_keep_the_lids() {
    let mut s = subnet();
    up(&mut s);
    let lids = [s.a.port(1).lid, s.b.port(1).lid];
    // Pull guest a's cable: Down, IB_EVENT_PORT_ERR.
    let mine = s.ports[0];
    let sw_port = s.fabric.lock().unwrap().peer(mine).expect("cabled");
    s.fabric.lock().unwrap().unplug(mine).unwrap();
    let down = pump_until(&mut [&mut s.a, &mut s.b], UP_LIMIT, 16, |g| {
        g[0].port(1).state == PortState::Down
    });
    assert!(down, "{:?}", s.a.port(1));
    assert!(s.a.events().contains(&(EventType::PortErr, 1)));
    // Back in: the switch's Trap 128 makes the SM sweep at once.
    let heavy = s.fabric.lock().unwrap().sm().unwrap().stats().heavy_sweeps;
    let t0 = s.a.hca.clock().now_ns();
    s.fabric.lock().unwrap().connect(mine, sw_port).unwrap();
    up(&mut s);
    let took_ms = (s.a.hca.clock().now_ns() - t0) / 1_000_000;
    let st = s.fabric.lock().unwrap().sm().unwrap().stats().clone();
    assert!(st.heavy_sweeps > heavy && st.traps >= 1, "{st:?}");
    assert!(
        took_ms < 1000,
        "back within a second of model time (trap-driven, not the 10 s sweep): {took_ms} ms"
    );
    assert_eq!(
        s.a.port(1).lid,
        lids[0],
        "same LID after the cable came back"
    );
    // Restart the SM: it forgets everything, keeps what the ports report.
    let before = [s.a.events().len(), s.b.events().len()];
    s.fabric.lock().unwrap().restart_sm();
    let swept = pump_until(&mut [&mut s.a, &mut s.b], UP_LIMIT, 64, |_| {
        s.fabric.lock().unwrap().sm().unwrap().stats().heavy_sweeps >= 1
    });
    assert!(swept);
    // The request to re-register reaches a client through the guest's
    // async EQ, read at its next poll, which can come after the round the
    // sweep ended in: rounds until each guest has it (the checks below say
    // what is missing if it never comes).
    pump_until(&mut [&mut s.a, &mut s.b], Duration::from_secs(5), 1, |g| {
        g.iter()
            .zip(before)
            .all(|(g, from)| g.events()[from..].contains(&(EventType::ClientReregister, 1)))
    });
    for (k, g) in [&mut s.a, &mut s.b].into_iter().enumerate() {
        assert!(g.active(), "{}", g.name);
        assert_eq!(
            g.port(1).lid,
            lids[k],
            "{}: LID kept across the SM restart",
            g.name
        );
        let ev = g.events()[before[k]..].to_vec();
        assert!(
            !ev.contains(&(EventType::LidChange, 1)) && !ev.contains(&(EventType::PortErr, 1)),
            "{}: {ev:?}",
            g.name
        );
        assert!(
            ev.contains(&(EventType::ClientReregister, 1)),
            "{}: the new SM's first sweep asks clients to re-register: {ev:?}",
            g.name
        );
    }
    let Subnet { a, b, .. } = s;
    a.teardown();
    b.teardown();
}
