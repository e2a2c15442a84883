//! The set-ups the engine tests share.
//!
//! Two HCAs on one fabric with their ports 1 Active (back to back, through a
//! switch, or threaded), the RC QP pairs connected across them, and two QPs of one
//! HCA connected to each other over its loopback.

use std::time::Duration;

use sim::fabric::Topology;
use sim::{SimConfig, SimHca, Wire};

use crate::poster::*;

/// A synchronous HCA with node GUID `guid` and a 64 MiB DMA arena.
pub fn cfg(guid: u64) -> SimConfig {
    SimConfig {
        node_guid: guid,
        dma_size: 64 << 20,
        ..SimConfig::default()
    }
}

/// Two HCAs, both ports 1 initialised and made Active with LIDs 1 and 2.
pub fn b2b() -> (Hca, Hca, Wire) {
    let (x, y, w) = SimHca::back_to_back(cfg(0x0002_c903_0000_1000), cfg(0x0002_c903_0000_2000));
    let mut a = Hca::bare(x);
    let mut b = Hca::bare(y);
    a.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    assert_eq!(
        a.r.sim.port_state(1).map(|s| s.1),
        Some(sim::PhysicalState::Polling),
        "no link until the partner is enabled"
    );
    b.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    assert_eq!(
        a.r.sim.port_state(1),
        Some((sim::LogicalState::Init, sim::PhysicalState::LinkUp))
    );
    a.activate(1, 1).unwrap();
    b.activate(1, 2).unwrap();
    (a, b, w)
}

/// Two HCAs through one switch (the `--nodes 2` topology, cx3-emu's
/// default), ports 1 Active with LIDs 1 and 2, the switch's LFT set by
/// its SM stand-in.
pub fn switched() -> (Hca, Hca, Wire) {
    let mut f = sim::fabric::Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let shared = std::sync::Arc::new(std::sync::Mutex::new(f));
    let w = Wire::over(shared.clone(), Duration::from_micros(1));
    let mk = |i: usize| {
        let h = &built.hcas[i];
        SimHca::new_on_ports(cfg(h.node_guid), &w, [Some(h.ports[0]), Some(h.ports[1])])
    };
    let mut a = Hca::bare(mk(0));
    let mut b = Hca::bare(mk(1));
    a.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    b.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    assert_eq!(
        a.r.sim.port_state(1).map(|s| s.1),
        Some(sim::PhysicalState::LinkUp),
        "cabled to a powered switch"
    );
    a.activate(1, 1).unwrap();
    b.activate(1, 2).unwrap();
    shared
        .lock()
        .unwrap()
        .switch_mut(built.switches[0].1)
        .unwrap()
        .configure(0x10, &[(1, 1), (2, 2)]);
    (a, b, w)
}

/// Two threaded HCAs (each stepped by its own model thread, in real time)
/// back to back with node GUIDs `ga` and `gb`, ports 1 Active with LIDs 1
/// and 2.
pub fn threaded(ga: u64, gb: u64) -> (Hca, Hca, Wire) {
    let w = Wire::threaded(sim::fabric::Fabric::shared());
    let x = SimHca::new_on(cfg(ga), &w);
    let y = SimHca::new_on(cfg(gb), &w);
    w.fabric()
        .lock()
        .unwrap()
        .connect(x.fabric_port(1).unwrap(), y.fabric_port(1).unwrap())
        .unwrap();
    let mut a = Hca::bare(x);
    let mut b = Hca::bare(y);
    a.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    b.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while a.r.sim.port_state(1).map(|s| s.1) != Some(sim::PhysicalState::LinkUp) {
        assert!(std::time::Instant::now() < deadline, "link never came up");
        std::thread::sleep(Duration::from_millis(1));
    }
    a.activate(1, 1).unwrap();
    b.activate(1, 2).unwrap();
    (a, b, w)
}

/// A's RC QP `x` (on CQ `ca`, its spec adjusted by `f`) connected to B's
/// RC QP `y` (on CQ `cb`).
pub fn rc_qps(
    (a, ca, x): (&mut Hca, &Cq, u32),
    (b, cb, y): (&mut Hca, &Cq, u32),
    f: impl Fn(&mut QpSpec),
) -> (Qp, Qp) {
    let mut sa = QpSpec::new(RC, ca.cqn);
    f(&mut sa);
    let sb = QpSpec::new(RC, cb.cqn);
    let qa = a.qp(x, sa);
    let qb = b.qp(y, sb);
    a.connect(&qa, sa, y, b.lid).unwrap();
    b.connect(&qb, sb, x, a.lid).unwrap();
    (qa, qb)
}

/// A's QP 0x80 and B's QP 0x90, connected; `f` adjusts A's spec.
pub fn rc_pair(a: &mut Hca, b: &mut Hca, ca: &Cq, cb: &Cq, f: impl Fn(&mut QpSpec)) -> (Qp, Qp) {
    rc_qps((a, ca, 0x80), (b, cb, 0x90), f)
}

/// Two RC (or UC) QPs of one HCA, 0x80 and 0x81, connected to each other
/// on port 1 (the card's loopback).
pub fn pair(h: &mut Hca, st: u8, cq: &Cq) -> (Qp, Qp, QpSpec) {
    let s = QpSpec::new(st, cq.cqn);
    let a = h.qp(0x80, s);
    let b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    (a, b, s)
}
