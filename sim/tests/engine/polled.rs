//! The polled front end (cx3-emu's loop, `SimHca::poll`) reads each UAR
//! page's doorbell words once a pass: two QPs (or two CQs) of one page rung
//! between two passes leave one doorbell word, and the work of both runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sim::{SimConfig, SimHca};

use crate::pairs::pair;
use crate::poster::*;

/// Runs `f` while a thread polls `sim`, as cx3-emu's loop does; the
/// thread has stopped when this returns.
fn while_polled<T>(sim: &SimHca, f: impl FnOnce() -> T) -> T {
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (s, stop) = (sim.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if !s.poll() {
                    std::thread::yield_now();
                }
            }
        })
    };
    let r = f();
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();
    r
}

/// A polled HCA with port 1 Active, RC QPs 0x80 and 0x81 connected to
/// each other over the loopback (both on the kernel's UAR page), one CQ
/// and two 8 KiB MRs.
fn polled_pair() -> (SimHca, Hca, Cq, Qp, Qp, Mr, Mr) {
    let sim = SimHca::new_polled_local(SimConfig {
        dma_size: 64 << 20,
        ..SimConfig::default()
    });
    while_polled(&sim, || {
        let mut h = Hca::with(sim.clone());
        let cq = h.cq(6);
        let (a, b, _) = pair(&mut h, RC, &cq);
        let src = h.mr(0x10_0000, 8192, acc::ALL);
        let dst = h.mr(0x20_0000, 8192, acc::ALL);
        (sim.clone(), h, cq, a, b, src, dst)
    })
}

#[test]
fn two_send_doorbells_on_one_uar_page_in_one_pass_both_run() {
    let (sim, h, mut cq, mut a, mut b, src, dst) = polled_pair();
    src.write(0, &[0xa5; 64]);
    src.write(4096, &[0x5a; 64]);
    // Nobody polls: the receives and both sends are posted, and the two
    // send doorbells land on the same word of the page, the second over
    // the first, before the model's next pass.
    a.post_recv(&[dst.sge(0, 64)]);
    b.post_recv(&[dst.sge(4096, 64)]);
    let send = |from: u64| Wr {
        opcode: op::SEND,
        signalled: true,
        sges: vec![src.sge(from, 64)],
        ..Wr::default()
    };
    a.post(&h, &send(0));
    b.post(&h, &send(4096));
    for _ in 0..8 {
        sim.poll();
    }
    let cqes = cq.drain();
    let sent: Vec<u32> = cqes.iter().filter(|c| c.send).map(|c| c.qpn).collect();
    assert!(
        sent.contains(&0x80) && sent.contains(&0x81),
        "both QPs' sends completed: {cqes:?}"
    );
    assert!(cqes.iter().all(Cqe::ok), "{cqes:?}");
    assert_eq!(
        dst.read(4096, 64),
        vec![0xa5; 64],
        "0x80's SEND reached 0x81"
    );
    assert_eq!(dst.read(0, 64), vec![0x5a; 64], "0x81's SEND reached 0x80");
    h.assert_no_violations();
}

#[test]
fn two_cq_arms_on_one_uar_page_in_one_pass_both_take() {
    let sim = SimHca::new_polled_local(SimConfig {
        dma_size: 64 << 20,
        ..SimConfig::default()
    });
    let (mut h, mut c1, mut c2, mut a, mut b, src, dst) = while_polled(&sim, || {
        let mut h = Hca::with(sim.clone());
        let c1 = h.cq(6);
        let c2 = h.cq(6);
        let s1 = QpSpec::new(RC, c1.cqn);
        let s2 = QpSpec::new(RC, c2.cqn);
        let a = h.qp(0x80, s1);
        let b = h.qp(0x81, s2);
        let lid = h.lid;
        h.connect(&a, s1, 0x81, lid).unwrap();
        h.connect(&b, s2, 0x80, lid).unwrap();
        let src = h.mr(0x10_0000, 4096, acc::ALL);
        let dst = h.mr(0x20_0000, 4096, acc::ALL);
        (h, c1, c2, a, b, src, dst)
    });
    // Both CQs armed for their next completion in one pass: the second
    // arm's doorbell overwrites the first's.
    c1.arm(&h.r, 2, 0);
    c2.arm(&h.r, 2, 0);
    sim.poll();
    assert!(h.comp_events().is_empty(), "nothing completed yet");
    // A SEND from 0x80 (CQ 1) to 0x81 (CQ 2): a CQE on each CQ.
    b.post_recv(&[dst.sge(0, 64)]);
    a.post(
        &h,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            sges: vec![src.sge(0, 64)],
            ..Wr::default()
        },
    );
    for _ in 0..8 {
        sim.poll();
    }
    assert_eq!(c1.drain().len(), 1);
    assert_eq!(c2.drain().len(), 1);
    let mut ev = h.comp_events();
    ev.sort_unstable();
    assert_eq!(ev, vec![c1.cqn, c2.cqn], "each armed CQ raised its event");
    h.assert_no_violations();
}

/// Zeroes `q`'s SQ as Linux mlx4_en leaves its TX ring at activation
/// (`memset(ring->buf, 0, ...)`, no pre-stamp): in the first pass every
/// slot's owner bit reads "hardware" although nothing was posted there.
fn zero_sq(q: &Qp) {
    q.buf.fill(q.sq_off, (q.sq_cnt as usize) << q.sq_shift, 0);
}

#[test]
fn a_coalesced_doorbell_runs_no_slot_that_was_never_posted() {
    let (sim, h, mut cq, mut a, mut b, src, dst) = polled_pair();
    zero_sq(&b);
    src.write(0, &[0xa5; 64]);
    b.post_recv(&[dst.sge(0, 64)]);
    let send = |from: u64| Wr {
        opcode: op::SEND,
        signalled: true,
        sges: vec![src.sge(from, 64)],
        ..Wr::default()
    };
    // Only A rings; the model's pass looks at B (same UAR page) too, whose
    // head slot is all zero: not a WQE, so B runs nothing and stays RTS.
    a.post(&h, &send(0));
    for _ in 0..8 {
        sim.poll();
    }
    let cqes = cq.drain();
    assert!(cqes.iter().all(Cqe::ok), "{cqes:?}");
    assert!(!cqes.iter().any(|c| c.send && c.qpn == 0x81), "{cqes:?}");
    assert_eq!(dst.read(0, 64), vec![0xa5; 64], "A's SEND reached B");
    h.assert_no_violations();
    // B's first real WQE runs at its doorbell, and the zero slot after it
    // ends the work quietly.
    a.post_recv(&[dst.sge(4096, 64)]);
    src.write(4096, &[0x5a; 64]);
    b.post(&h, &send(4096));
    for _ in 0..8 {
        sim.poll();
    }
    let cqes = cq.drain();
    assert!(cqes.iter().all(Cqe::ok), "{cqes:?}");
    assert!(cqes.iter().any(|c| c.send && c.qpn == 0x81), "{cqes:?}");
    assert_eq!(dst.read(4096, 64), vec![0x5a; 64], "B's SEND reached A");
    h.assert_no_violations();
}
