//! Each completion-with-error syndrome from its real cause, the QP states
//! the errors leave behind, flushes, and the affiliated async events.

use std::time::Duration;

use crate::loopback::one;
use crate::pairs::pair;
use crate::poster::*;

const EV_WQ_INVAL_REQ: u8 = 0x10;
const EV_WQ_ACCESS: u8 = 0x11;

fn setup() -> (Hca, Cq, Qp, Qp, Mr, Mr) {
    let mut h = Hca::new();
    let cq = h.cq(8);
    let (a, b, _) = pair(&mut h, RC, &cq);
    let la = h.mr(0x10_0000, 16_384, acc::ALL);
    let rb = h.mr(0x20_0000, 16_384, acc::ALL);
    (h, cq, a, b, la, rb)
}

fn err(c: &Cqe) -> (u8, u8) {
    assert_eq!(c.opcode, 0x1e, "not an error CQE: {c:?}");
    (c.syndrome, c.vendor)
}

#[test]
fn local_protection_bad_lkey_pd_and_bounds_then_flush() {
    for case in 0..3 {
        let (mut h, mut cq, mut a, _b, la, rb) = setup();
        let other_pd = h.mr_pd(0x40_0000, 4096, acc::ALL, OTHER_PD);
        let bad = match case {
            0 => Sge {
                lkey: la.key ^ 0x01,
                ..la.sge(0, 64)
            }, // key byte differs
            1 => other_pd.sge(0, 64),  // the MR is in another PD
            _ => la.sge(16_000, 1000), // runs past the end
        };
        a.post(
            &h,
            &Wr {
                opcode: op::RDMA_WRITE,
                signalled: true,
                raddr: rb.addr(0),
                rkey: rb.key,
                sges: vec![bad],
                ..Wr::default()
            },
        );
        // Two more, unsignalled and signalled: both flushed.
        a.post(
            &h,
            &Wr {
                opcode: op::NOP,
                ..Wr::default()
            },
        );
        a.post(
            &h,
            &Wr {
                opcode: op::NOP,
                signalled: true,
                ..Wr::default()
            },
        );
        let v = cq.drain();
        assert_eq!(v.len(), 3, "case {case}: {v:?}");
        assert_eq!(err(&v[0]), (0x04, 0x56), "case {case}: local protection");
        assert_eq!((v[0].qpn, v[0].wqe_counter, v[0].send), (a.qpn, 0, true));
        assert_eq!(err(&v[1]).0, 0x05, "flushed");
        assert_eq!(err(&v[2]), (0x05, 0xf9), "flushed, vendor 0xf9");
        assert_eq!((v[1].wqe_counter, v[2].wqe_counter), (1, 2));
        assert_eq!(h.qp_state(a.qpn), 6, "RC requester error: ERR");
        // Posting in ERR flushes at once.
        a.post(
            &h,
            &Wr {
                opcode: op::NOP,
                ..Wr::default()
            },
        );
        assert_eq!(err(&one(&mut cq, true)).0, 0x05);
    }
}

#[test]
fn local_length_local_qp_op_and_mw_bind() {
    let (mut h, mut cq, mut a, _b, la, rb) = setup();
    // An atomic whose result buffer is not 8 bytes.
    a.post(
        &h,
        &Wr {
            opcode: op::ATOMIC_FA,
            signalled: true,
            raddr: rb.addr(0),
            rkey: rb.key,
            swap: 1,
            sges: vec![la.sge(0, 4)],
            ..Wr::default()
        },
    );
    assert_eq!(err(&one(&mut cq, true)).0, 0x01);
    // UD QP asked for an RDMA WRITE: local QP operation error, SQE state.
    let s = QpSpec::new(UD, cq.cqn);
    let mut u = h.qp(0xb0, s);
    h.connect(&u, s, 0, 0).unwrap();
    let av = Av {
        port: 1,
        dlid: h.lid,
        dqpn: 0xb0,
        qkey: s.qkey,
        ..Av::default()
    };
    u.post(
        &h,
        &Wr {
            opcode: op::RDMA_WRITE,
            signalled: true,
            ud: Some(av),
            ..Wr::default()
        },
    );
    assert_eq!(err(&one(&mut cq, true)), (0x02, 0x68));
    assert_eq!(h.qp_state(u.qpn), 4, "UD send error: SQE");
    // An opcode the model's card does not support (LSO on IB).
    let (mut h, mut cq, mut a2, _b, _la, _rb) = setup();
    a2.post(
        &h,
        &Wr {
            opcode: op::LSO,
            signalled: true,
            ..Wr::default()
        },
    );
    assert_eq!(err(&one(&mut cq, true)).0, 0x02);
    let _ = &mut h;
    // BIND_MW naming an MR without the bind-enable right.
    let (h, mut cq, mut a3, _b, la, _rb) = setup();
    let mut seg = vec![0u8; 32];
    seg[8..12].copy_from_slice(&0x1234_5600u32.to_be_bytes());
    seg[12..16].copy_from_slice(&la.key.to_be_bytes());
    seg[16..24].copy_from_slice(&la.addr(0).to_be_bytes());
    seg[24..32].copy_from_slice(&64u64.to_be_bytes());
    a3.post(
        &h,
        &Wr {
            opcode: op::BIND_MW,
            signalled: true,
            raw: Some(seg),
            ..Wr::default()
        },
    );
    assert_eq!(
        err(&one(&mut cq, true)),
        (0x06, 0x6a),
        "memory window bind error"
    );
    let _ = &mut a;
}

#[test]
fn remote_access_errors_nak_the_requester_and_break_the_responder() {
    // Bad R_Key on WRITE, READ without the MR's remote-read right, atomic on
    // a QP without remote atomics.
    for case in 0..3 {
        let (mut h, mut cq, mut a, b, la, rb) = setup();
        let ro = h.mr(0x60_0000, 4096, acc::LW | acc::RW);
        let w = match case {
            0 => Wr {
                opcode: op::RDMA_WRITE,
                signalled: true,
                raddr: rb.addr(0),
                rkey: rb.key + 1,
                sges: vec![la.sge(0, 16)],
                ..Wr::default()
            },
            1 => Wr {
                opcode: op::RDMA_READ,
                signalled: true,
                raddr: ro.addr(0),
                rkey: ro.key,
                sges: vec![la.sge(0, 16)],
                ..Wr::default()
            },
            _ => Wr {
                opcode: op::RDMA_WRITE,
                signalled: true,
                raddr: rb.addr(16_380),
                rkey: rb.key,
                sges: vec![la.sge(0, 16)],
                ..Wr::default()
            },
        };
        a.post(&h, &w);
        let c = one(&mut cq, true);
        assert_eq!(err(&c), (0x13, 0x88), "case {case}: remote access error");
        assert_eq!(h.qp_state(a.qpn), 6);
        assert_eq!(h.qp_state(b.qpn), 6, "responder in ERR too");
        let ev = h.async_events();
        assert!(ev.contains(&(EV_WQ_ACCESS, b.qpn)), "case {case}: {ev:?}");
    }
    // A responder QP without remote atomics enabled.
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let mut s = QpSpec::new(RC, cq.cqn);
    s.access = 1 << 15 | 1 << 14; // RRE | RWE, no RAE
    let mut a = h.qp(0x80, s);
    let b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let la = h.mr(0x10_0000, 4096, acc::ALL);
    a.post(
        &h,
        &Wr {
            opcode: op::ATOMIC_CS,
            signalled: true,
            raddr: la.addr(0),
            rkey: la.key,
            sges: vec![la.sge(8, 8)],
            ..Wr::default()
        },
    );
    assert_eq!(err(&one(&mut cq, true)).0, 0x13);
}

#[test]
fn remote_invalid_request_and_remote_operation_and_local_access() {
    // SEND longer than the receive buffer.
    let (mut h, mut cq, mut a, mut b, la, rb) = setup();
    b.post_recv(&[rb.sge(0, 100)]);
    a.post(&h, &Wr::send(vec![la.sge(0, 101)]));
    assert_eq!(
        err(&one(&mut cq, false)),
        (0x01, 0x69),
        "responder: local length"
    );
    assert_eq!(
        err(&one(&mut cq, true)),
        (0x12, 0x8a),
        "requester: remote invalid request"
    );
    assert!(h.async_events().contains(&(EV_WQ_INVAL_REQ, b.qpn)));
    // Misaligned atomic.
    let (h, mut cq, mut a, _b, la, rb) = setup();
    a.post(
        &h,
        &Wr {
            opcode: op::ATOMIC_FA,
            signalled: true,
            raddr: rb.addr(4),
            rkey: rb.key,
            sges: vec![la.sge(0, 8)],
            ..Wr::default()
        },
    );
    assert_eq!(err(&one(&mut cq, true)).0, 0x12);
    // Receive WQE with a bad L_Key: responder local protection, requester
    // remote operation error.
    let (h, mut cq, mut a, mut b, la, rb) = setup();
    b.post_recv(&[Sge {
        lkey: rb.key ^ 0x80,
        ..rb.sge(0, 100)
    }]);
    a.post(&h, &Wr::send(vec![la.sge(0, 50)]));
    assert_eq!(err(&one(&mut cq, false)).0, 0x04);
    assert_eq!(err(&one(&mut cq, true)), (0x14, 0x89));
    // WRITE with immediate to a bad R_Key: the responder's receive WQE
    // completes with local access error.
    let (h, mut cq, mut a, mut b, la, rb) = setup();
    b.post_recv(&[rb.sge(0, 100)]);
    b.post_recv(&[rb.sge(100, 100)]);
    a.post(
        &h,
        &Wr {
            opcode: op::RDMA_WRITE_IMM,
            signalled: true,
            raddr: rb.addr(0),
            rkey: 0xdead_0000,
            sges: vec![la.sge(0, 50)],
            ..Wr::default()
        },
    );
    let v = cq.drain();
    assert_eq!(v.len(), 3, "{v:?}");
    let rcv: Vec<_> = v.iter().filter(|c| !c.send).collect();
    assert_eq!(err(rcv[0]), (0x11, 0x57), "local access error");
    assert_eq!(err(rcv[1]).0, 0x05, "the other receive flushed");
    assert_eq!(err(v.iter().find(|c| c.send).unwrap()).0, 0x13);
}

#[test]
fn rnr_retries_on_the_fake_clock_finite_and_infinite() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let mut s = QpSpec::new(RC, cq.cqn);
    s.rnr_retry = 2;
    s.min_rnr_timer = 14; // 1.28 ms
    let mut a = h.qp(0x80, s);
    let b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let la = h.mr(0x10_0000, 4096, acc::ALL);
    let t0 = h.r.clock.now_ns();
    a.post(&h, &Wr::send(vec![la.sge(0, 8)]));
    assert!(cq.drain().is_empty(), "waiting for the RNR timer");
    wait_steps(&h.r, Duration::from_millis(2));
    assert!(cq.drain().is_empty(), "first retry also RNR-NAKed");
    wait_steps(&h.r, Duration::from_millis(3));
    let c = one(&mut cq, true);
    assert_eq!(err(&c), (0x16, 0x82), "RNR retry exceeded");
    let took = h.r.clock.now_ns() - t0;
    assert!(
        took >= 2 * 1_280_000,
        "two RNR waits of 1.28 ms on the fake clock ({took} ns)"
    );
    // rnr_retry 7 retries for ever: a receive posted late still gets it.
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let mut s = QpSpec::new(RC, cq.cqn);
    s.rnr_retry = 7;
    let mut a = h.qp(0x80, s);
    let mut b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let la = h.mr(0x10_0000, 4096, acc::ALL);
    a.post(&h, &Wr::send(vec![la.sge(0, 8)]));
    wait_steps(&h.r, Duration::from_millis(100));
    assert!(cq.drain().is_empty());
    b.post_recv(&[la.sge(100, 8)]);
    wait_steps(&h.r, Duration::from_millis(1));
    assert!(one(&mut cq, true).ok());
    assert!(one(&mut cq, false).ok());
}

#[test]
fn transport_retry_exceeded_when_the_peer_is_unreachable() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let mut s = QpSpec::new(RC, cq.cqn);
    s.retry_cnt = 3;
    s.ack_timeout = 12; // 16.8 ms
    let mut a = h.qp(0x80, s);
    h.connect(&a, s, 0x99, 0x0777).unwrap(); // a LID nobody has
    let la = h.mr(0x10_0000, 4096, acc::ALL);
    a.post(&h, &Wr::send(vec![la.sge(0, 8)]));
    a.post(
        &h,
        &Wr {
            opcode: op::NOP,
            signalled: true,
            ..Wr::default()
        },
    );
    wait_steps(&h.r, Duration::from_millis(3 * 16));
    assert!(cq.drain().is_empty(), "three retries not yet used up");
    wait_steps(&h.r, Duration::from_millis(20));
    let v = cq.drain();
    assert_eq!(v.len(), 2, "{v:?}");
    assert_eq!(err(&v[0]), (0x15, 0x81), "transport retry counter exceeded");
    assert_eq!(err(&v[1]).0, 0x05);
}

#[test]
fn error_state_flushes_posted_receives_and_later_ones() {
    let (mut h, mut cq, _a, mut b, _la, rb) = setup();
    b.post_recv(&[rb.sge(0, 10)]);
    b.post_recv(&[rb.sge(0, 10)]);
    let m = crate::harness::QpMbox::new(6, RC);
    h.r.cmd_in(&m.0, b.qpn, 0, sim::Opcode::ERR_QP).unwrap();
    let v = cq.drain();
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(v.iter().all(|c| !c.send && c.syndrome == 0x05));
    assert_eq!((v[0].wqe_counter, v[1].wqe_counter), (0, 1));
    b.post_recv(&[rb.sge(0, 10)]);
    wait_steps(&h.r, Duration::from_micros(5));
    let c = one(&mut cq, false);
    assert_eq!(
        (c.syndrome, c.wqe_counter),
        (0x05, 2),
        "posted in ERR: flushed"
    );
}

/// An RQ doorbell record claiming more receives than the RQ holds (fuzz
/// finding `sim_wqe-overrun-6bf13e65`: a counter of 15 617 over an RQ of
/// 64) is the driver's mistake, recorded once while it lasts. The card
/// takes the counter
/// as it is: a QP in error flushes that many WQEs, as fast as the CQ's
/// consumer index lets it (the doorbell record read afresh for every
/// CQE), and a CQ not polled meanwhile overruns.
#[test]
fn rq_counter_past_the_ring_is_recorded_and_flushed_as_counted() {
    let (mut h, mut cq, _a, b, _la, _rb) = setup();
    let claimed = 0x3d01u32;
    b.db.write_be32(0, claimed);
    let m = crate::harness::QpMbox::new(6, RC);
    h.r.cmd_in(&m.0, b.qpn, 0, sim::Opcode::ERR_QP).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut flushed = 0u32;
    while flushed < claimed {
        for c in cq.drain() {
            assert!(!c.send && c.qpn == b.qpn && c.syndrome == 0x05, "{c:?}");
            assert_eq!(u32::from(c.wqe_counter), flushed);
            flushed += 1;
        }
        assert!(std::time::Instant::now() < deadline, "{flushed} flushed");
        h.r.clock.relax();
    }
    for _ in 0..8 {
        h.r.clock.relax();
    }
    assert!(cq.drain().is_empty(), "no more than the counter says");
    let v = h.r.sim.take_violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("QP 0x81 claims 15617 receive WQEs posted"),
        "{v:?}"
    );
    // Another 1 000 with nobody polling: recorded again, and the 256-entry
    // CQ overruns.
    b.db.write_be32(0, claimed + 1000);
    for _ in 0..32 {
        h.r.clock.relax();
    }
    let v = h.r.sim.take_violations();
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(v[0].contains("claims 1000 receive WQEs posted"), "{v:?}");
    assert!(
        v[1].contains("overrun: 256 CQEs outstanding of 256"),
        "{v:?}"
    );
}
