//! Our kernel's subnet manager (`ib_sm`) brings driver-run HCAs to Active.
//!
//! Two or more model HCAs with the real mlx4_core + mlx4_ib + ib_core, on the
//! `--nodes N` topology (one model switch) or back to back, with no SM of the
//! fabric's own (`--sm none`): the SM runs inside guest a's ib_core, every SMP
//! it sends crosses the fabric to the other guests' QP0 (answered by their
//! ib_core agent and mlx4_ib's MAD_IFC) and to the switch's SMA, and its SA
//! answers the other guests' ib_core SA client on QP1.

use tests::subnet_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ib_core::verbs::{EventType, PortState};
use ib_sm::SmConfig;
use ib_sm::ib_types::sm_state;
use sim::fabric::{Fabric, Topology};
use subnet_common::*;

const UP_LIMIT: Duration = Duration::from_secs(30);

struct Net {
    fabric: Arc<Mutex<Fabric>>,
    a: Guest,
    b: Guest,
    sm: ib_core::ClientId,
}

fn net(topo: Topology) -> Net {
    let mut f = Fabric::new();
    let built = topo.build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let (mut a, b) = sync_guests(&fabric, &built);
    let sm = ib_sm::init(&mut a.core);
    Net { fabric, a, b, sm }
}

fn start(n: &mut Net, cfg: SmConfig) {
    ib_sm::start(&mut n.a.core, n.sm, n.a.dev, 1, cfg).expect("SM started");
}

fn sm_log(n: &mut Net) -> String {
    ib_sm::log(&mut n.a.core, n.sm, n.a.dev)
        .unwrap_or_default()
        .join("\n")
}

/// Starts an SA query on guest b's (or a's) SA client and runs both
/// guests until it ends.
fn sa_query(
    n: &mut Net,
    on_a: bool,
    q: impl FnOnce(
        &mut ib_core::IbCore,
        ib_core::ClientId,
        ib_core::DeviceId,
    ) -> ib_core::Result<ib_core::sa_query::SaQueryId>,
) -> ib_core::sa_query::SaResponse {
    let g = if on_a { &mut n.a } else { &mut n.b };
    let (sa, dev) = (g.sa, g.dev);
    let id = q(&mut g.core, sa, dev).expect("query started");
    let mut got = None;
    pump_until(&mut [&mut n.a, &mut n.b], Duration::from_secs(20), 1, |g| {
        let g = if on_a { &mut *g[0] } else { &mut *g[1] };
        got = ib_core::sa_query::query_result(&mut g.core, sa, id);
        got.is_some()
    });
    let log = sm_log(n);
    got.expect("the SA answered")
        .unwrap_or_else(|e| panic!("SA query: {e}\nSM log:\n{log}"))
}

fn up(n: &mut Net) {
    let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 64, |g| {
        g.iter_mut().all(|g| g.active())
    });
    let log = sm_log(n);
    assert!(ok, "both ports Active; SM log:\n{log}");
}

#[test]
fn kernel_sm_brings_two_guests_on_a_switch_to_active() {
    let mut n = net(Topology::for_nodes(2).unwrap());
    start(&mut n, SmConfig::default());
    up(&mut n);
    let st = ib_sm::status(&mut n.a.core, n.sm, n.a.dev).unwrap();
    eprintln!("{}\n{st:?}", sm_log(&mut n));
    let (pa, pb) = (n.a.port(1), n.b.port(1));
    assert_eq!(pa.state, PortState::Active);
    assert_eq!(pb.state, PortState::Active);
    assert_ne!(pa.lid, pb.lid);
    assert_eq!(pa.sm_lid, pa.lid, "the SM is on guest a");
    assert_eq!(pb.sm_lid, pa.lid);
    let _ = &n.fabric;
    // Guest b's SA client asks our SA for the path to guest a.
    let path = sa_query(&mut n, false, |core, sa, dev| {
        let (sgid, slid) = {
            let c = core.device(dev).unwrap().port_cache(1).unwrap();
            (c.get_gid(0).unwrap(), c.lid)
        };
        let rec = ib_core::sa_query::PathRecord {
            sgid,
            slid,
            dlid: pa.lid,
            pkey: 0xffff,
            numb_path: 1,
            reversible: true,
            ..Default::default()
        };
        use ib_core::sa_query::path_comp as pc;
        let mask = pc::SGID | pc::SLID | pc::DLID | pc::PKEY | pc::NUMB_PATH | pc::REVERSIBLE;
        ib_core::sa_query::path_rec_get(core, sa, dev, 1, &rec, mask, Duration::from_secs(5))
    });
    let p = &path.path_records().unwrap()[0];
    eprintln!("path b -> a: {p:?}");
    assert_eq!((p.slid, p.dlid), (pb.lid, pa.lid));
    assert_eq!((p.mtu_selector, p.mtu), (2, 5), "exactly 4096");
    assert_eq!((p.rate_selector, p.rate), (2, 7), "exactly 40 Gb/s");
    assert!(p.reversible);
    // Every NodeRecord: three records of 112 bytes, two RMPP segments.
    let nodes = sa_query(&mut n, false, |core, sa, dev| {
        ib_core::sa_query::node_rec_get_table(
            core,
            sa,
            dev,
            1,
            &Default::default(),
            0,
            Duration::from_secs(5),
        )
    });
    let recs = nodes.node_records().unwrap();
    assert_eq!(recs.len(), 3, "{recs:?}");
    // Guest a's own SA client asks the SA on its own port (loopback).
    let p = sa_query(&mut n, true, |core, sa, dev| {
        ib_core::sa_query::node_rec_get_table(
            core,
            sa,
            dev,
            1,
            &Default::default(),
            0,
            Duration::from_secs(5),
        )
    });
    assert_eq!(p.node_records().unwrap().len(), 3);
    let st = ib_sm::status(&mut n.a.core, n.sm, n.a.dev).unwrap();
    eprintln!("{:?}", st.sa);
    assert!(st.sa.rmpp_transfers >= 2, "{:?}", st.sa);
    let Net { a, b, .. } = n;
    a.teardown();
    b.teardown();
}

/// `n` synchronous guests on `built`'s first `n` HCAs (one fake clock).
fn guests(fabric: &Arc<Mutex<Fabric>>, built: &sim::fabric::Built, n: usize) -> Vec<Guest> {
    let wire = sim::Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    built
        .hcas
        .iter()
        .take(n)
        .map(|h| {
            let hca = sim::SimHca::new_on_ports(
                guest_config(h),
                &wire,
                [Some(h.ports[0]), Some(h.ports[1])],
            );
            guest(hca, &h.name)
        })
        .collect()
}

#[test]
fn kernel_sm_brings_two_guests_back_to_back_to_active() {
    let mut n = net(Topology::back_to_back());
    start(&mut n, SmConfig::default());
    up(&mut n);
    let (pa, pb) = (n.a.port(1), n.b.port(1));
    assert_eq!((pa.lid, pb.lid), (1, 2), "the SM's port first, as OpenSM");
    assert_eq!((pa.sm_lid, pb.sm_lid), (1, 1));
    assert_eq!(pb.subnet_timeout, 18);
    for g in [&n.a, &n.b] {
        let ev = g.events();
        assert!(
            ev.contains(&(EventType::PortActive, 1)),
            "{}: {ev:?}",
            g.name
        );
        assert!(
            ev.contains(&(EventType::ClientReregister, 1)),
            "{}: the first sweep asks clients to re-register: {ev:?}",
            g.name
        );
    }
    let p = sa_query(&mut n, false, |core, sa, dev| {
        let (sgid, slid) = {
            let c = core.device(dev).unwrap().port_cache(1).unwrap();
            (c.get_gid(0).unwrap(), c.lid)
        };
        let rec = ib_core::sa_query::PathRecord {
            sgid,
            slid,
            dlid: 1,
            ..Default::default()
        };
        use ib_core::sa_query::path_comp as pc;
        ib_core::sa_query::path_rec_get(
            core,
            sa,
            dev,
            1,
            &rec,
            pc::SGID | pc::SLID | pc::DLID,
            Duration::from_secs(5),
        )
    });
    let p = &p.path_records().unwrap()[0];
    assert_eq!((p.slid, p.dlid, p.mtu, p.rate), (2, 1, 5, 7));
    // Back to back there is no switch: every periodic sweep is heavy, as
    // OpenSM's; after the first, nothing is set again.
    let before =
        n.b.core
            .mad_counters(n.b.dev, 1)
            .unwrap()
            .process_mad_replies;
    pump_until(
        &mut [&mut n.a, &mut n.b],
        Duration::from_secs(20),
        64,
        |g| {
            let _ = g;
            false
        },
    );
    let st = ib_sm::status(&mut n.a.core, n.sm, n.a.dev).unwrap();
    eprintln!("{}\n{st:?}", sm_log(&mut n));
    assert!(st.stats.heavy_sweeps >= 2, "{st:?}");
    assert_eq!(st.stats.light_sweeps, 0);
    let after =
        n.b.core
            .mad_counters(n.b.dev, 1)
            .unwrap()
            .process_mad_replies;
    assert!(after > before, "guest b answered the later sweeps");
    // NodeInfo, NodeDescription and PortInfo of both nodes; then a
    // PortInfo Set per port from the LID manager and one from the link
    // manager, as OpenSM would send too: the model's SMA answers 0 for the
    // LocalPhyErrors/OverrunErrors thresholds it was set to (8/8), so they
    // always differ (a finding on the model, docs/sm.md).
    assert!(
        st.stats.smps_last_heavy <= 10,
        "a sweep of an unchanged subnet reads, and writes only the thresholds: {st:?}"
    );
    assert!(n.a.active() && n.b.active());
    let Net { a, b, .. } = n;
    a.teardown();
    b.teardown();
}

#[test]
fn kernel_sm_brings_four_guests_on_a_switch_to_active_with_distinct_lids() {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(4).unwrap().build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let mut gs = guests(&fabric, &built, 4);
    let sm = ib_sm::init(&mut gs[0].core);
    let (dev, t0) = (gs[0].dev, gs[0].core.clock().now_ns());
    ib_sm::start(&mut gs[0].core, sm, dev, 1, SmConfig::default()).unwrap();
    let mut refs: Vec<&mut Guest> = gs.iter_mut().collect();
    let ok = pump_until(&mut refs, UP_LIMIT, 64, |g| {
        g.iter_mut().all(|g| g.active())
    });
    drop(refs);
    let st = ib_sm::status(&mut gs[0].core, sm, dev).unwrap();
    let log = ib_sm::log(&mut gs[0].core, sm, dev).unwrap().join("\n");
    assert!(ok, "{log}");
    let lids: std::collections::BTreeSet<u16> = gs.iter_mut().map(|g| g.port(1).lid).collect();
    assert_eq!(lids.len(), 4, "{lids:?}");
    eprintln!(
        "4 guests: SUBNET UP {} us of model time after the start, {} SMPs; ports Active {} us after",
        st.stats.first_up_ns / 1000,
        st.stats.smps_last_heavy,
        (gs[0].core.clock().now_ns() - t0) / 1000
    );
    assert_eq!(st.ports, 5, "4 CAs and the switch");
    for g in gs {
        g.teardown();
    }
}

/// The fabric's embedded SM, already master: ours finds it and stands by,
/// whatever the priorities (the embedded SM never hands over: see
/// docs/sm.md).
#[test]
fn kernel_sm_stands_by_for_the_embedded_master() {
    for (embedded, ours) in [(15u8, 0u8), (1, 10)] {
        let mut f = Fabric::new();
        let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
        f.add_sm_on_free_port(sim::fabric::SmConfig {
            priority: embedded,
            ..Default::default()
        })
        .unwrap();
        let fabric = Arc::new(Mutex::new(f));
        let (mut a, b) = sync_guests(&fabric, &built);
        let sm = ib_sm::init(&mut a.core);
        let mut n = Net { fabric, a, b, sm };
        up(&mut n);
        let emb_lid = n.fabric.lock().unwrap().sm().unwrap().lid();
        start(
            &mut n,
            SmConfig {
                priority: ours,
                polling_timeout_ms: 1000,
                ..Default::default()
            },
        );
        let sm = n.sm;
        let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 64, |g| {
            ib_sm::status(&mut g[0].core, sm, g[0].dev)
                .is_some_and(|s| s.state == sm_state::STANDBY)
        });
        let log = sm_log(&mut n);
        assert!(ok, "embedded {embedded}, ours {ours}: standby; log:\n{log}");
        // Polls keep it standing by; the ports keep the embedded SM.
        pump_until(
            &mut [&mut n.a, &mut n.b],
            Duration::from_secs(5),
            64,
            |_| false,
        );
        let st = ib_sm::status(&mut n.a.core, n.sm, n.a.dev).unwrap();
        assert_eq!(st.state, sm_state::STANDBY, "{log}");
        assert_eq!(st.master_lid, emb_lid);
        assert_eq!(n.a.port(1).sm_lid, emb_lid);
        assert_eq!(n.b.port(1).sm_lid, emb_lid);
        let traps = n.fabric.lock().unwrap().sm().unwrap().stats().traps;
        if ours > embedded {
            assert!(traps >= 1, "a higher standby tells the master (trap 144)");
        }
        eprintln!("embedded {embedded} / ours {ours}: {log}");
        let Net { a, b, .. } = n;
        a.teardown();
        b.teardown();
    }
}

/// A pulled cable and its return: the switch's trap 128 makes our SM sweep
/// heavily at once (not at the 10 s period); the port comes back Active
/// with its LID.
#[test]
fn a_cable_back_is_taken_in_by_the_trap_alone() {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let b_port = built.hcas[1].ports[0];
    let fabric = Arc::new(Mutex::new(f));
    let (mut a, b) = sync_guests(&fabric, &built);
    let sm = ib_sm::init(&mut a.core);
    let mut n = Net { fabric, a, b, sm };
    start(&mut n, SmConfig::default());
    up(&mut n);
    let lid = n.b.port(1).lid;
    let sw_port = n.fabric.lock().unwrap().peer(b_port).unwrap();
    n.fabric.lock().unwrap().unplug(b_port).unwrap();
    let down = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 16, |g| {
        g[1].port(1).state == PortState::Down
    });
    assert!(down);
    let (sm, dev) = (n.sm, n.a.dev);
    let heavy = ib_sm::status(&mut n.a.core, sm, dev)
        .unwrap()
        .stats
        .heavy_sweeps;
    let t0 = n.a.hca.clock().now_ns();
    n.fabric.lock().unwrap().connect(b_port, sw_port).unwrap();
    up(&mut n);
    let took_ms = (n.a.hca.clock().now_ns() - t0) / 1_000_000;
    let st = ib_sm::status(&mut n.a.core, sm, dev).unwrap();
    let log = sm_log(&mut n);
    assert!(
        st.stats.traps >= 1 && st.stats.heavy_sweeps > heavy,
        "{st:?}\n{log}"
    );
    assert!(
        log.contains("Received Generic Notice type:1 num:128"),
        "{log}"
    );
    assert!(
        took_ms < 1000,
        "trap-driven, not the 10 s sweep: {took_ms} ms\n{log}"
    );
    assert_eq!(n.b.port(1).lid, lid, "the same LID");
    let Net { a, b, .. } = n;
    a.teardown();
    b.teardown();
}
