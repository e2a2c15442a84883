//! Faults on Ethernet cables, as on InfiniBand ones: a pulled cable takes
//! both ports down (PORT_CHANGE) and back up with no SM; frames sent
//! meanwhile are dropped at the port and their WQEs complete; a RoCE RC
//! message outlives the pull by retransmission; dropped and corrupted
//! frames are recovered (RoCE RC) or counted (a bad FCS) and no ring
//! stalls.

use std::time::Duration;

use sim::fabric::{FaultKind, FaultRule};
use sim::{LogicalState, PhysicalState};

use crate::common::*;
use crate::poster::*;

const RX: u32 = 0xa0;
const TX: u32 = 0xa1;

/// Two cards back to back on Ethernet ports 1, up, each with a raw RX
/// and TX QP on CQ `cq` (A0 steering: its MAC and every multicast to RX).
struct Two {
    a: Hca,
    b: Hca,
    w: sim::Wire,
    ida: ([u8; 6], [u8; 16]),
    idb: ([u8; 6], [u8; 16]),
    ca: Cq,
    cb: Cq,
    txa: Qp,
    rxb: Qp,
    la: Mr,
    rb: Mr,
}

fn two() -> Two {
    let (mut a, mut b, w) = eth_b2b();
    set_general(&mut a.r, 1, 9022).unwrap();
    set_general(&mut b.r, 1, 9022).unwrap();
    let ida = eth_up(&mut a, 1);
    let idb = eth_up(&mut b, 1);
    settle(&a);
    let ca = a.cq(8);
    let cb = b.cq(8);
    let (txa, _) = raw_qp(&mut a, TX, 1, ca.cqn);
    let (rxb, _) = raw_qp(&mut b, RX, 1, cb.cqn);
    set_rqp(&mut b.r, 1, RX, 0, false, 2).unwrap();
    let la = a.mr(0x10_0000_0000, 64 << 10, acc::ALL);
    let rb = b.mr(0x20_0000_0000, 64 << 10, acc::ALL);
    Two {
        a,
        b,
        w,
        ida,
        idb,
        ca,
        cb,
        txa,
        rxb,
        la,
        rb,
    }
}

impl Two {
    /// A raw frame of `n` payload bytes (marked `tag`) from A to B.
    fn raw(&mut self, tag: u8, n: usize) -> Vec<u8> {
        let f = frame(self.idb.0, self.ida.0, 0x88b5, &vec![tag; n]);
        raw_send(&self.a, &mut self.txa, &self.la, 0, &f, None, 0);
        f
    }
    /// B's receive CQEs now (raw).
    fn b_received(&mut self) -> Vec<[u8; 32]> {
        settle(&self.b);
        drain_raw(&mut self.cb)
            .into_iter()
            .filter(|c| !cqe_basics(c).1)
            .collect()
    }
    /// RoCE RC QPs 0x80 (A) and 0x90 (B), connected, with `retry_cnt`
    /// and a 4.2 ms ACK timeout.
    fn rc(&mut self, retry_cnt: u8) -> (Qp, Qp) {
        let mut sa = QpSpec::new(RC, self.ca.cqn);
        sa.retry_cnt = retry_cnt;
        sa.ack_timeout = 10;
        let sb = QpSpec::new(RC, self.cb.cqn);
        let qa = self.a.qp(0x80, sa);
        let qb = self.b.qp(0x90, sb);
        let (ida, idb) = (self.ida, self.idb);
        roce_connect(&mut self.a, &qa, sa, 0x90, RocePath::to(idb.0, idb.1)).unwrap();
        roce_connect(&mut self.b, &qb, sb, 0x80, RocePath::to(ida.0, ida.1)).unwrap();
        (qa, qb)
    }
}

#[test]
fn a_pulled_ethernet_cable_takes_both_ports_down_and_back_up_without_an_sm() {
    let mut t = two();
    let _ = t.a.async_events();
    let _ = t.b.async_events();
    let (mut qa, mut qb) = t.rc(7);
    let pa = t.a.r.sim.fabric_port(1).unwrap();
    let pb = t.b.r.sim.fabric_port(1).unwrap();
    t.w.fabric().lock().unwrap().unplug(pa).unwrap();
    settle(&t.a);
    for h in [&t.a, &t.b] {
        assert_eq!(
            h.r.sim.port_state(1),
            Some((LogicalState::Down, PhysicalState::Polling))
        );
    }
    assert!(
        t.a.async_events().iter().any(|e| e.0 == 0x09),
        "PORT_CHANGE (down) at A"
    );
    assert!(t.b.async_events().iter().any(|e| e.0 == 0x09), "and at B");
    let q = t.a.r.cmd_out(1, 0, sim::Opcode::QUERY_PORT).unwrap();
    assert_eq!(q[0] & 0x80, 0, "QUERY_PORT: link down");
    // A raw frame meanwhile: dropped at the port, its WQE completes.
    t.raw(1, 100);
    settle(&t.a);
    let sends: Vec<_> = drain_raw(&mut t.ca)
        .into_iter()
        .filter(|c| cqe_basics(c).1)
        .collect();
    assert_eq!(sends.len(), 1);
    assert_ne!(cqe_basics(&sends[0]).2, 0x1e, "not an error");
    assert_eq!(t.a.r.sim.eth_counters(1).unwrap().tx_dropped, 1);
    // A RoCE SEND meanwhile: its packets go nowhere; it is retried.
    let data = Rng(5).bytes(10_000);
    t.la.write(8192, &data);
    qb.post_recv(&[t.rb.sge(0, 16_384)]);
    qa.post(&t.a, &Wr::send(vec![t.la.sge(8192, 10_000)]));
    wait_steps(&t.a.r, Duration::from_millis(10));
    assert!(t.ca.drain().is_empty(), "still retrying");
    // The cable back in: both ports Active at once, PORT_CHANGE again, and
    // the retransmission delivers the message.
    t.w.fabric().lock().unwrap().connect(pa, pb).unwrap();
    settle(&t.a);
    for h in [&t.a, &t.b] {
        assert_eq!(
            h.r.sim.port_state(1),
            Some((LogicalState::Active, PhysicalState::LinkUp))
        );
    }
    assert!(t.a.async_events().iter().any(|e| e.0 == 0x09));
    wait_steps(&t.a.r, Duration::from_millis(10));
    assert!(one(&t.a, &mut t.ca, true).ok());
    let r = one(&t.b, &mut t.cb, false);
    assert_eq!(r.byte_cnt, 10_000);
    assert_eq!(t.rb.read(0, 10_000), data);
    // Raw frames flow again.
    t.rxb.post_recv(&[t.rb.sge(32 << 10, 2048)]);
    let f = t.raw(2, 100);
    let got = t.b_received();
    assert_eq!(got.len(), 1);
    assert_eq!(t.rb.read(32 << 10, f.len()), f);
    t.a.assert_no_violations();
    t.b.assert_no_violations();
}

#[test]
fn a_roce_message_runs_out_of_retries_when_the_cable_stays_out() {
    let mut t = two();
    let (mut qa, _qb) = t.rc(2);
    let pa = t.a.r.sim.fabric_port(1).unwrap();
    t.w.fabric().lock().unwrap().unplug(pa).unwrap();
    settle(&t.a);
    qa.post(&t.a, &Wr::send(vec![t.la.sge(0, 8)]));
    wait_steps(&t.a.r, Duration::from_millis(16));
    let e = one(&t.a, &mut t.ca, true);
    assert_eq!(
        (e.syndrome, e.vendor),
        (0x15, 0x81),
        "retry exceeded: {e:?}"
    );
}

#[test]
fn dropped_and_corrupted_frames_are_recovered_or_counted() {
    let mut t = two();
    let (mut qa, mut qb) = t.rc(7);
    let data = Rng(11).bytes(12_000);
    t.la.write(8192, &data);
    // RoCE: the second packet of a three-packet SEND lost once; the
    // retransmission fixes it.
    t.w.fabric()
        .lock()
        .unwrap()
        .faults
        .add(FaultRule::new(FaultKind::Drop).qpn(0x90).every(2).times(1));
    qb.post_recv(&[t.rb.sge(0, 16_384)]);
    qa.post(&t.a, &Wr::send(vec![t.la.sge(8192, 12_000)]));
    wait_steps(&t.a.r, Duration::from_millis(10));
    assert!(one(&t.a, &mut t.ca, true).ok());
    assert_eq!(one(&t.b, &mut t.cb, false).byte_cnt, 12_000);
    assert_eq!(t.rb.read(0, 12_000), data);
    // RoCE: a corrupted packet fails B's FCS check, counted; recovered.
    t.w.fabric().lock().unwrap().faults.clear();
    t.w.fabric()
        .lock()
        .unwrap()
        .faults
        .add(FaultRule::new(FaultKind::Corrupt).qpn(0x90).times(1));
    qb.post_recv(&[t.rb.sge(0, 16_384)]);
    qa.post(&t.a, &Wr::send(vec![t.la.sge(8192, 100)]));
    wait_steps(&t.a.r, Duration::from_millis(10));
    assert!(
        one(&t.a, &mut t.ca, true).ok(),
        "recovered by retransmission"
    );
    assert_eq!(one(&t.b, &mut t.cb, false).byte_cnt, 100);
    let c = t.b.r.sim.eth_counters(1).unwrap();
    assert_eq!(c.rx_bad_fcs, 1, "{c:?}");
    // Raw frames: one lost, one corrupted (a bad FCS, counted); the ring
    // takes the next frame each time.
    t.w.fabric().lock().unwrap().faults.clear();
    for k in 0..2 {
        t.rxb.post_recv(&[t.rb.sge((32 << 10) + k * 2048, 2048)]);
    }
    t.w.fabric()
        .lock()
        .unwrap()
        .faults
        .add(FaultRule::new(FaultKind::Drop).times(1));
    t.raw(3, 100);
    assert!(t.b_received().is_empty(), "lost");
    t.w.fabric()
        .lock()
        .unwrap()
        .faults
        .add(FaultRule::new(FaultKind::Corrupt).times(1));
    t.raw(4, 100);
    assert!(t.b_received().is_empty(), "corrupted");
    assert_eq!(t.b.r.sim.eth_counters(1).unwrap().rx_bad_fcs, 2);
    let f = t.raw(5, 100);
    assert_eq!(t.b_received().len(), 1);
    assert_eq!(t.rb.read(32 << 10, f.len()), f, "into the first WQE");
    t.a.assert_no_violations();
    t.b.assert_no_violations();
}
