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

use ib_core::verbs::PortState;
use ib_sm::SmConfig;
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
