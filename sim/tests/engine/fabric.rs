//! Two HCAs on a fabric: back to back and through a switch. Links follow
//! INIT_PORT/CLOSE_PORT and cables; every opcode crosses the wire in
//! packets (segmented at the MTU); counters and the firmware PMA.

use std::time::Duration;

use sim::fabric::Topology;
use sim::{SimConfig, SimHca, Wire};

use crate::loopback::one;
use crate::mlx::pma_get;
use crate::poster::*;

fn cfg(guid: u64) -> SimConfig {
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

fn rc_pair(a: &mut Hca, b: &mut Hca, ca: &Cq, cb: &Cq) -> (Qp, Qp) {
    let sa = QpSpec::new(RC, ca.cqn);
    let sb = QpSpec::new(RC, cb.cqn);
    let qa = a.qp(0x80, sa);
    let qb = b.qp(0x90, sb);
    a.connect(&qa, sa, 0x90, b.lid).unwrap();
    b.connect(&qb, sb, 0x80, a.lid).unwrap();
    (qa, qb)
}

fn counters(h: &mut Hca) -> (u32, u32, u32, u32) {
    let pc = h.r.cmd_box(&pma_get(), 1, 3, sim::Opcode::MAD_IFC).unwrap();
    let d = |o: usize| u32::from_be_bytes(pc[0x40 + o..0x44 + o].try_into().unwrap());
    (d(24), d(28), d(32), d(36))
}

#[test]
fn every_rc_opcode_crosses_the_wire_in_mtu_segments() {
    let (mut a, mut b, _w) = b2b();
    let mut ca = a.cq(8);
    let mut cb = b.cq(8);
    let (mut qa, mut qb) = rc_pair(&mut a, &mut b, &ca, &cb);
    let la = a.mr(0x10_0000_0100, 64 << 10, acc::ALL);
    let rb = b.mr(0x20_0000_0200, 64 << 10, acc::ALL);
    let mut rng = Rng(42);
    let before = counters(&mut a);
    // SEND of 10 000 bytes: 3 packets at MTU 4096.
    let data = rng.bytes(10_000);
    la.write(0, &data);
    qb.post_recv(&[Sge {
        addr: rb.addr(0),
        len: 20_000,
        lkey: rb.key,
    }]);
    qa.post(
        &a,
        &Wr {
            opcode: op::SEND_IMM,
            signalled: true,
            imm: 9,
            sges: vec![Sge {
                addr: la.addr(0),
                len: 10_000,
                lkey: la.key,
            }],
            ..Wr::default()
        },
    );
    let r = one(&mut cb, false);
    assert_eq!((r.opcode, r.byte_cnt, r.imm), (2, 10_000, 9), "{r:?}");
    assert_eq!(rb.read(0, 10_000), data);
    assert!(one(&mut ca, true).ok());
    let after = counters(&mut a);
    assert_eq!(after.2 - before.2, 3, "three SEND packets left A");
    // (LRH 8 + BTH 12 + payload + ImmDt on the last + ICRC 4) / 4 words.
    assert_eq!(
        after.0 - before.0,
        (3 * 24 + 4 + 10_000) / 4,
        "PortXmitData in words"
    );
    let rcv = counters(&mut b);
    assert_eq!(
        (rcv.1, rcv.3),
        (after.0 - before.0, 3),
        "B received the same words and packets"
    );
    // RDMA WRITE with immediate, 9000 bytes.
    let data = rng.bytes(9000);
    la.write(20_000, &data);
    qb.post_recv(&[Sge {
        addr: rb.addr(0),
        len: 8,
        lkey: rb.key,
    }]);
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_WRITE_IMM,
            signalled: true,
            imm: 0x77,
            raddr: rb.addr(30_000),
            rkey: rb.key,
            sges: vec![Sge {
                addr: la.addr(20_000),
                len: 9000,
                lkey: la.key,
            }],
            ..Wr::default()
        },
    );
    let r = one(&mut cb, false);
    assert_eq!((r.opcode, r.byte_cnt, r.imm), (0, 9000, 0x77));
    assert!(one(&mut ca, true).ok());
    assert_eq!(rb.read(30_000, 9000), data);
    // RDMA READ of 12 000 bytes (3 response packets).
    let remote = rng.bytes(12_000);
    rb.write(40_000, &remote);
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_READ,
            signalled: true,
            raddr: rb.addr(40_000),
            rkey: rb.key,
            sges: vec![Sge {
                addr: la.addr(40_000),
                len: 12_000,
                lkey: la.key,
            }],
            ..Wr::default()
        },
    );
    let c = one(&mut ca, true);
    assert_eq!((c.opcode, c.byte_cnt), (op::RDMA_READ, 12_000), "{c:?}");
    assert_eq!(la.read(40_000, 12_000), remote);
    // Atomics.
    rb.write(64, &41u64.to_be_bytes());
    qa.post(
        &a,
        &Wr {
            opcode: op::ATOMIC_FA,
            signalled: true,
            raddr: rb.addr(64),
            rkey: rb.key,
            swap: 1,
            sges: vec![Sge {
                addr: la.addr(0),
                len: 8,
                lkey: la.key,
            }],
            ..Wr::default()
        },
    );
    assert!(one(&mut ca, true).ok());
    assert_eq!(
        (la.read(0, 8), rb.read(64, 8)),
        (41u64.to_be_bytes().to_vec(), 42u64.to_be_bytes().to_vec())
    );
    qa.post(
        &a,
        &Wr {
            opcode: op::ATOMIC_CS,
            signalled: true,
            raddr: rb.addr(64),
            rkey: rb.key,
            cmp: 42,
            swap: 7,
            sges: vec![Sge {
                addr: la.addr(8),
                len: 8,
                lkey: la.key,
            }],
            ..Wr::default()
        },
    );
    assert!(one(&mut ca, true).ok());
    assert_eq!(rb.read(64, 8), 7u64.to_be_bytes());
    // A remote access error comes back as a NAK.
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_WRITE,
            signalled: true,
            raddr: rb.addr(0),
            rkey: rb.key ^ 0xff,
            sges: vec![Sge {
                addr: la.addr(0),
                len: 8,
                lkey: la.key,
            }],
            ..Wr::default()
        },
    );
    let e = one(&mut ca, true);
    assert_eq!((e.opcode, e.syndrome), (0x1e, 0x13), "{e:?}");
    assert_eq!(b.qp_state(0x90), 6, "responder in ERR");
    assert!(
        a.r.sim.violations().is_empty() && b.r.sim.violations().is_empty(),
        "{:?} {:?}",
        a.r.sim.violations(),
        b.r.sim.violations()
    );
}
