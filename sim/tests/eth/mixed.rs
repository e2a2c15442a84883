//! A VPI card with port 1 InfiniBand and port 2 Ethernet: IB traffic on
//! port 1 (through the IB switch) and RoCE on port 2 (through the Ethernet
//! switch) at the same time.

use sim::fabric::LinkLayer;
use sim::{LinkLayer as Ll, Opcode};

use crate::common::*;
use crate::poster::*;

#[test]
fn ib_on_port_1_and_roce_on_port_2_at_once() {
    let (mut hcas, _w, fab, built) = on_switches(2, [LinkLayer::Ib, LinkLayer::Eth]);
    let mut b = hcas.pop().unwrap();
    let mut a = hcas.pop().unwrap();
    assert_eq!(a.r.sim.link_layer(1), Some(Ll::Ib));
    assert_eq!(a.r.sim.link_layer(2), Some(Ll::Eth));
    // Port 1: the SM's part by SMPs, the switch programmed.
    a.port_up(1, 1).unwrap();
    b.port_up(1, 2).unwrap();
    fab.lock()
        .unwrap()
        .switch_mut(built.switches[0].1)
        .unwrap()
        .configure(0x10, &[(1, 1), (2, 2)]);
    // Port 2: Ethernet, RoCE at a path MTU of 1024 (netdev MTU 1500:
    // Linux's iboe_get_mtu).
    let ida = eth_up(&mut a, 2);
    let idb = eth_up(&mut b, 2);
    settle(&a);
    let mut ca = a.cq(8);
    let mut cb = b.cq(8);
    // IB RC pair on port 1.
    let s1a = QpSpec::new(RC, ca.cqn);
    let s1b = QpSpec::new(RC, cb.cqn);
    let mut qa1 = a.qp(0x80, s1a);
    let mut qb1 = b.qp(0x90, s1b);
    a.connect(&qa1, s1a, 0x90, 2).unwrap();
    b.connect(&qb1, s1b, 0x80, 1).unwrap();
    // RoCE RC pair on port 2.
    let mut s2a = QpSpec::new(RC, ca.cqn);
    s2a.port = 2;
    s2a.mtu = 3;
    let mut s2b = QpSpec::new(RC, cb.cqn);
    s2b.port = 2;
    s2b.mtu = 3;
    let mut qa2 = a.qp(0x81, s2a);
    let mut qb2 = b.qp(0x91, s2b);
    roce_connect(&mut a, &qa2, s2a, 0x91, RocePath::to(idb.0, idb.1)).unwrap();
    roce_connect(&mut b, &qb2, s2b, 0x81, RocePath::to(ida.0, ida.1)).unwrap();
    let la = a.mr(0x10_0000_0000, 64 << 10, acc::ALL);
    let rb = b.mr(0x20_0000_0000, 64 << 10, acc::ALL);
    let mut rng = Rng(3);
    let d1 = rng.bytes(9000);
    let d2 = rng.bytes(7000);
    la.write(0, &d1);
    la.write(16 << 10, &d2);
    qb1.post_recv(&[rb.sge(0, 10_000)]);
    qb2.post_recv(&[rb.sge(16 << 10, 10_000)]);
    // Both messages posted before either completes.
    qa1.post(&a, &Wr::send(vec![la.sge(0, 9000)]));
    qa2.post(&a, &Wr::send(vec![la.sge(16 << 10, 7000)]));
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(one(&b, &mut cb, false));
    }
    got.sort_by_key(|c| c.qpn);
    assert_eq!(
        got.iter().map(|c| (c.qpn, c.byte_cnt)).collect::<Vec<_>>(),
        vec![(0x90, 9000), (0x91, 7000)]
    );
    assert_eq!(rb.read(0, 9000), d1);
    assert_eq!(rb.read(16 << 10, 7000), d2);
    assert!(one(&a, &mut ca, true).ok());
    assert!(one(&a, &mut ca, true).ok());
    // Each went its own way: IB packets on port 1, RoCE frames on port 2.
    let e2 = a.r.sim.eth_counters(2).unwrap();
    assert!(e2.roce_tx >= 2, "{e2:?}");
    assert_eq!(a.r.sim.eth_counters(1).unwrap().tx_frames, 0);
    let _ = Opcode::NOP;
    a.assert_no_violations();
    b.assert_no_violations();
}
