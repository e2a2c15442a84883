//! Owner bits, overruns, arming and the polled front end's doorbells.
//!
//! Owner bits over several wraps of the SQ, RQ and CQ; CQ overrun; CQ
//! arming and completion events; stamped (unfinished) WQEs never run;
//! SRQ free lists and the limit event; the polled front end reading the
//! doorbells of a QP moved to another UAR page.

use crate::loopback::one;
use crate::pairs::pair;
use crate::poster::*;

#[test]
fn owner_bits_over_three_wraps_of_sq_rq_and_cq() {
    let mut h = Hca::new();
    let mut cq = h.cq(4); // 16 CQEs
    let mut s = QpSpec::new(RC, cq.cqn);
    s.sq_log = 3; // 8 WQEs
    s.rq_log = 2; // 4 WQEs
    let mut a = h.qp(0x80, s);
    let mut b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let la = h.mr(0x10_0000, 4096, acc::ALL);
    let rb = h.mr(0x20_0000, 4096, acc::ALL);
    let mut seen = 0u32;
    for i in 0..40u32 {
        la.write(0, &i.to_be_bytes());
        b.post_recv(&[rb.sge(u64::from(i % 4) * 8, 8)]);
        a.post(&h, &Wr::send(vec![la.sge(0, 4)]));
        let r = one(&mut cq, false);
        let sc = one(&mut cq, true);
        assert!(r.ok() && sc.ok(), "{r:?} {sc:?}");
        assert_eq!(r.wqe_counter, i as u16, "RQ counter");
        assert_eq!(sc.wqe_counter, i as u16, "SQ counter");
        assert_eq!(rb.read(u64::from(i % 4) * 8, 4), i.to_be_bytes());
        seen += 2;
    }
    assert!(seen / 16 >= 3, "CQ wrapped {} times", seen / 16);
    // 40 WRs: 5 wraps of the 8-WQE SQ, 10 of the 4-WQE RQ.
    // A WQE left over from an earlier pass (owner bit of the old parity)
    // is never executed: ring without posting.
    h.ring_send(a.qpn);
    assert!(cq.drain().is_empty(), "stale WQE ran");
    h.assert_no_violations();
}

#[test]
fn cq_overrun_raises_cq_error_and_stops_the_cq() {
    let mut h = Hca::new();
    let mut cq = h.cq(2); // 4 CQEs
    let (mut a, _b, _) = pair(&mut h, RC, &cq);
    h.async_events();
    for _ in 0..4 {
        a.post(
            &h,
            &Wr {
                opcode: op::NOP,
                signalled: true,
                ..Wr::default()
            },
        );
    }
    assert!(h.async_events().is_empty());
    a.post(
        &h,
        &Wr {
            opcode: op::NOP,
            signalled: true,
            ..Wr::default()
        },
    );
    let ev = h.async_events();
    assert!(ev.contains(&(0x04, cq.cqn)), "CQ_ERROR: {ev:?}");
    assert!(h.r.sim.violations().iter().any(|v| v.contains("overrun")));
    assert_eq!(cq.drain().len(), 4, "the four before the overrun");
    a.post(
        &h,
        &Wr {
            opcode: op::NOP,
            signalled: true,
            ..Wr::default()
        },
    );
    assert!(cq.drain().is_empty(), "a CQ in error stays stopped");
}

#[test]
fn armed_cq_raises_one_completion_event() {
    let mut h = Hca::new();
    let mut cq = h.cq(4);
    let (mut a, mut b, _) = pair(&mut h, RC, &cq);
    let la = h.mr(0x10_0000, 4096, acc::ALL);
    h.comp_events();
    a.post(
        &h,
        &Wr {
            opcode: op::NOP,
            signalled: true,
            ..Wr::default()
        },
    );
    assert!(h.comp_events().is_empty(), "not armed: no event");
    cq.drain();
    cq.arm(&h.r, 2, 1);
    a.post(
        &h,
        &Wr {
            opcode: op::NOP,
            signalled: true,
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
    assert_eq!(h.comp_events(), vec![cq.cqn], "one event per arm");
    // Arming with CQEs still unconsumed fires at once.
    cq.arm(&h.r, 2, 2);
    assert_eq!(h.comp_events(), vec![cq.cqn]);
    cq.drain();
    // Solicited-only: an unsolicited receive does not fire, a solicited
    // one does.
    cq.arm(&h.r, 1, 3);
    b.post_recv(&[la.sge(0, 64)]);
    b.post_recv(&[la.sge(0, 64)]);
    a.post(
        &h,
        &Wr {
            opcode: op::SEND,
            ..Wr::default()
        },
    );
    assert!(h.comp_events().is_empty());
    a.post(
        &h,
        &Wr {
            opcode: op::SEND,
            solicited: true,
            ..Wr::default()
        },
    );
    assert_eq!(h.comp_events(), vec![cq.cqn]);
}

#[test]
fn a_stamped_chunk_stops_the_sq_until_the_wqe_is_written() {
    let mut h = Hca::new();
    let mut cq = h.cq(4);
    let (mut a, _b, _) = pair(&mut h, RC, &cq);
    let la = h.mr(0x10_0000, 4096, acc::ALL);
    let rb = h.mr(0x20_0000, 4096, acc::ALL);
    la.write(0, b"0123456789abcdef0123456789abcdef");
    let w = Wr {
        opcode: op::RDMA_WRITE,
        signalled: true,
        raddr: rb.addr(0),
        rkey: rb.key,
        sges: (0..4).map(|i| la.sge(i * 8, 8)).collect(),
        ..Wr::default()
    };
    let mut bytes = a.build(&w); // 16 + 16 + 4 x 16 = 96: two 64-byte chunks
    let good = bytes[64..68].to_vec();
    bytes[64..68].copy_from_slice(&[0xff; 4]);
    a.put(w.opcode, false, &bytes);
    h.ring_send(a.qpn);
    assert!(cq.drain().is_empty());
    assert!(
        h.r.sim.violations().iter().any(|v| v.contains("stamp")),
        "{:?}",
        h.r.sim.violations()
    );
    // The driver finishes the WQE and rings again.
    a.buf.write_bytes(a.sq_off + 64, &good);
    h.ring_send(a.qpn);
    assert!(one(&mut cq, true).ok());
    assert_eq!(rb.read(0, 32), la.read(0, 32));
}

#[test]
fn srq_free_list_and_limit_event() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let mut srq = h.srq(FIRST_SRQ_N, 3, 5); // 8 WQEs of 32 bytes
    let mut s = QpSpec::new(RC, cq.cqn);
    s.srq = Some(FIRST_SRQ_N);
    let mut a = h.qp(0x80, QpSpec::new(RC, cq.cqn));
    let b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, QpSpec::new(RC, cq.cqn), 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let la = h.mr(0x10_0000, 4096, acc::ALL);
    let rb = h.mr(0x20_0000, 4096, acc::ALL);
    for i in 0..6u64 {
        srq.post(&[rb.sge(i * 16, 16)]);
    }
    // ARM_SRQ with watermark 3: the event comes when fewer than 3 remain.
    h.r.cmd(3, FIRST_SRQ_N, 0, sim::Opcode::ARM_SRQ).unwrap();
    let mut used = Vec::new();
    for i in 0..4u32 {
        la.write(0, &i.to_be_bytes());
        a.post(&h, &Wr::send(vec![la.sge(0, 4)]));
        let r = one(&mut cq, false);
        assert!(r.ok(), "{r:?}");
        assert_eq!(rb.read(u64::from(r.wqe_counter) * 16, 4), i.to_be_bytes());
        used.push(r.wqe_counter);
        one(&mut cq, true);
    }
    assert_eq!(used, vec![0, 1, 2, 3], "taken along the free list");
    let ev = h.async_events();
    assert!(ev.contains(&(0x14, FIRST_SRQ_N)), "SRQ_LIMIT: {ev:?}");
    // Free WQE 1 back to the tail; the list goes 4, 5, then 1 ... after
    // the driver re-posts.
    srq.free(used[1]);
    for i in 0..3u64 {
        srq.post(&[rb.sge(200 + i * 16, 16)]);
    }
    let mut order = Vec::new();
    for _ in 0..5 {
        a.post(
            &h,
            &Wr {
                opcode: op::SEND,
                signalled: true,
                ..Wr::default()
            },
        );
        order.push(one(&mut cq, false).wqe_counter);
        one(&mut cq, true);
    }
    assert_eq!(order, vec![4, 5, 6, 7, 1]);
    h.assert_no_violations();
}

#[test]
fn a_qp_on_an_srq_takes_the_rq_size_byte_linux_leaves_in_it() {
    // Linux mlx4_ib never sizes the RQ of a QP on an SRQ and writes
    // `rq.wqe_shift - 4` = 0xfc (log size 15, stride 4) all the same; the
    // card reads no RQ of such a QP, so neither the size limit nor the
    // buffer's MTT entries apply to it.
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let mut srq = h.srq(FIRST_SRQ_N, 3, 5);
    let mut s = QpSpec::new(RC, cq.cqn);
    (s.srq, s.rq_ss) = (Some(FIRST_SRQ_N), Some(0xfc));
    let mut a = h.qp(0x80, QpSpec::new(RC, cq.cqn));
    let b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, QpSpec::new(RC, cq.cqn), 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let la = h.mr(0x10_0000, 4096, acc::ALL);
    let rb = h.mr(0x20_0000, 4096, acc::ALL);
    srq.post(&[rb.sge(0, 16)]);
    la.write(0, b"to the SRQ");
    a.post(&h, &Wr::send(vec![la.sge(0, 10)]));
    let r = one(&mut cq, false);
    assert!(r.ok() && r.byte_cnt == 10, "{r:?}");
    assert_eq!(rb.read(0, 10), b"to the SRQ");
    assert!(one(&mut cq, true).ok());
    h.assert_no_violations();
}

const FIRST_SRQ_N: u32 = crate::harness::profile::FIRST_SRQ;

/// The polled front end (cx3-emu's) reads only the doorbell words of the
/// UAR pages its objects use, from a list it keeps between rounds: a QP
/// taken back to RESET and initialized on another UAR page (no object
/// added or removed) has its send doorbell on the new page taken at once.
#[test]
fn polled_send_doorbell_on_the_uar_page_a_reinit_moved_the_qp_to() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let sim = sim::SimHca::new_polled_local(sim::SimConfig::default());
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (s, stop) = (sim.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                s.poll();
            }
        })
    };
    let mut h = Hca::with(sim.clone());
    let mut cq = h.cq(10);
    let s = QpSpec::new(RC, cq.cqn);
    let mut a = h.qp(0x80, s);
    let b = h.qp(0x81, s);
    let lid = h.lid;
    let src = h.mr(0x1000, 4096, acc::ALL);
    let dst = h.mr(0x9000, 4096, acc::ALL);
    src.write(0, b"uar-move");
    let wr = Wr {
        opcode: op::RDMA_WRITE,
        signalled: true,
        raddr: dst.addr(0),
        rkey: dst.key,
        sges: vec![src.sge(0, 8)],
        ..Wr::default()
    };
    let trip = |h: &Hca, a: &mut Qp, cq: &mut Cq, uar: u32| {
        let w = a.build(&wr);
        a.put(op::RDMA_WRITE, false, &w);
        h.ring_send_on(a.qpn, uar);
        let t = Instant::now();
        loop {
            if let Some(c) = cq.poll() {
                return Some(c);
            }
            if t.elapsed() > Duration::from_secs(2) {
                return None;
            }
            std::thread::yield_now();
        }
    };
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let c = trip(&h, &mut a, &mut cq, crate::harness::profile::UAR)
        .expect("a CQE on the first UAR page");
    assert!(c.ok(), "{c:?}");
    let moved = crate::harness::profile::UAR + 1;
    h.reinit_on(&mut a, moved);
    h.connect(&a, s, 0x81, lid).unwrap();
    dst.write(0, &[0; 8]);
    let c = trip(&h, &mut a, &mut cq, moved);
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();
    let c = c.expect("no CQE: the doorbell on the QP's new UAR page was not read");
    assert!(c.ok(), "{c:?}");
    assert_eq!(dst.read(0, 8), b"uar-move");
    assert!(sim.take_violations().is_empty());
}
