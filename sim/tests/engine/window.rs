//! The RC send window over the fabric.
//!
//! Many messages in flight per QP before the first ACK, cumulative ACKs, go-back-N
//! after a lost packet (sequence NAK) or a lost response (ACK timeout), duplicates
//! answered without a second delivery (SEND re-ACKed, READ re-executed, atomic
//! answered from its saved result), max_rd_atomic, and retry exhaustion with the
//! window full.

use std::time::Duration;

use sim::fabric::packet::opcode;
use sim::fabric::{FaultKind, FaultRule};

use crate::mlx::pma_get;
use crate::pairs::{b2b, rc_pair, threaded};
use crate::poster::*;

/// PortXmitPkts of port 1.
fn xmit_pkts(h: &mut Hca) -> u32 {
    let pc = h.r.cmd_box(&pma_get(), 1, 3, sim::Opcode::MAD_IFC).unwrap();
    u32::from_be_bytes(pc[0x40 + 32..0x40 + 36].try_into().unwrap())
}

fn fault(w: &sim::Wire, r: FaultRule) {
    w.fabric().lock().unwrap().faults.add(r);
}

/// Two HCAs back to back: A's QP 0x80 connected to B's 0x90 (CQs of 256
/// entries), A's buffer `la` and B's `rb` of `len` bytes each.
struct Link {
    a: Hca,
    b: Hca,
    w: sim::Wire,
    ca: Cq,
    cb: Cq,
    qa: Qp,
    qb: Qp,
    la: Mr,
    rb: Mr,
}

fn link(len: u64) -> Link {
    let (mut a, mut b, w) = b2b();
    let ca = a.cq(8);
    let cb = b.cq(8);
    let (qa, qb) = rc_pair(&mut a, &mut b, &ca, &cb, |_| {});
    let la = a.mr(0x10_0000, len, acc::ALL);
    let rb = b.mr(0x20_0000, len, acc::ALL);
    Link {
        a,
        b,
        w,
        ca,
        cb,
        qa,
        qb,
        la,
        rb,
    }
}

/// Sets max_rd_atomic to `1 << log` (RTS2RTS with the SRA_MAX optpar, as
/// Linux's modify_qp with IB_QP_MAX_QP_RD_ATOMIC).
fn set_max_rd_atomic(h: &mut Hca, q: &Qp, log: u32) {
    let s = q.spec;
    let m = crate::harness::QpMbox::new(3, RC)
        .u32(
            0x70,
            log << 21 | u32::from(s.retry_cnt) << 16 | u32::from(s.rnr_retry) << 13,
        )
        .optpar(1 << 8);
    h.r.cmd_in(&m.0, q.qpn, 0, sim::Opcode::RTS2RTS_QP).unwrap();
}

fn write_wr(src: &Mr, off: u64, dst: &Mr, doff: u64, len: u32, sig: bool) -> Wr {
    Wr {
        opcode: op::RDMA_WRITE,
        signalled: sig,
        raddr: dst.addr(doff),
        rkey: dst.key,
        sges: vec![src.sge(off, len)],
        ..Wr::default()
    }
}

/// Posts every WR and rings the doorbell once.
fn post_all(h: &Hca, q: &mut Qp, wrs: &[Wr]) {
    for w in wrs {
        let b = q.build(w);
        q.put(w.opcode, w.fence, &b);
    }
    h.ring_send(q.qpn);
}

/// Send CQEs until `n` have come (bounded by model time).
fn send_cqes(h: &Hca, cq: &mut Cq, n: usize, within: Duration) -> Vec<Cqe> {
    let mut v: Vec<Cqe> = Vec::new();
    let steps = 200;
    for _ in 0..steps {
        v.extend(cq.drain().into_iter().filter(|c| c.send));
        if v.len() >= n {
            break;
        }
        wait_steps(&h.r, within / steps);
    }
    v
}

#[test]
fn eight_writes_are_on_the_wire_before_the_first_ack_and_complete_in_order() {
    let Link {
        mut a,
        b,
        w,
        mut ca,
        cb: _cb,
        mut qa,
        qb: _qb,
        la,
        rb,
    } = link(128 << 10);
    let data = Rng(3).bytes(8 * 10_000);
    la.write(0, &data);
    // Hold every ACK to A for 1 ms: whatever A sends before then, it sends
    // without having seen one.
    fault(
        &w,
        FaultRule::new(FaultKind::Delay(1_000_000))
            .qpn(0x80)
            .opcode(opcode::RC | opcode::ACKNOWLEDGE),
    );
    let before = xmit_pkts(&mut a);
    let wrs: Vec<Wr> = (0..8u64)
        .map(|i| write_wr(&la, i * 10_000, &rb, i * 10_000, 10_000, true))
        .collect();
    post_all(&a, &mut qa, &wrs);
    let sent = xmit_pkts(&mut a) - before;
    assert_eq!(
        sent, 24,
        "all 8 messages (3 packets each at MTU 4096) left before any ACK"
    );
    assert!(ca.drain().is_empty(), "no completion before an ACK");
    assert_eq!(rb.read(0, 80_000), data, "the responder has every byte");
    let c = send_cqes(&a, &mut ca, 8, Duration::from_millis(3));
    let got: Vec<(u16, bool, u32)> = c
        .iter()
        .map(|c| (c.wqe_counter, c.ok(), c.byte_cnt))
        .collect();
    let want: Vec<(u16, bool, u32)> = (0..8).map(|i| (i, true, 10_000)).collect();
    assert_eq!(got, want, "completions in WQE order: {c:?}");
    assert_eq!(xmit_pkts(&mut a) - before, 24, "nothing sent twice");
    a.assert_no_violations();
    b.assert_no_violations();
}

#[test]
fn a_later_ack_acknowledges_a_message_whose_own_ack_was_lost() {
    let Link {
        mut a,
        b: _b,
        w,
        mut ca,
        cb: _cb,
        mut qa,
        qb: _qb,
        la,
        rb,
    } = link(64 << 10);
    la.write(0, &Rng(4).bytes(3000));
    // The first ACK to A is lost; the second (a later PSN) covers both.
    fault(
        &w,
        FaultRule::new(FaultKind::Drop)
            .qpn(0x80)
            .opcode(opcode::RC | opcode::ACKNOWLEDGE)
            .times(1),
    );
    let before = xmit_pkts(&mut a);
    post_all(
        &a,
        &mut qa,
        &[
            write_wr(&la, 0, &rb, 0, 1000, true),
            write_wr(&la, 1000, &rb, 1000, 1000, true),
        ],
    );
    // Well before the 4 ms ACK timeout.
    let c = send_cqes(&a, &mut ca, 2, Duration::from_micros(50));
    assert_eq!(
        c.iter()
            .map(|c| (c.wqe_counter, c.ok()))
            .collect::<Vec<_>>(),
        [(0, true), (1, true)],
        "{c:?}"
    );
    assert_eq!(xmit_pkts(&mut a) - before, 2, "no retransmission");
    assert_eq!(rb.read(0, 2000), la.read(0, 2000));
}

#[test]
fn a_dropped_middle_packet_is_recovered_by_go_back_n_in_order() {
    let Link {
        mut a,
        b,
        w,
        mut ca,
        mut cb,
        mut qa,
        mut qb,
        la,
        rb,
    } = link(64 << 10);
    let data = Rng(5).bytes(4 * 10_000);
    la.write(0, &data);
    for i in 0..5u64 {
        qb.post_recv(&[rb.sge(i * 10_000, 10_000)]);
    }
    // 4 SENDs of 3 packets: lose the 5th packet (the middle of the
    // second message), once.
    fault(
        &w,
        FaultRule::new(FaultKind::Drop).qpn(0x90).every(5).times(1),
    );
    let before = xmit_pkts(&mut a);
    let wrs: Vec<Wr> = (0..4u64)
        .map(|i| Wr::send(vec![la.sge(i * 10_000, 10_000)]))
        .collect();
    post_all(&a, &mut qa, &wrs);
    // The sequence NAK brings the retransmission at once, long before
    // the 4 ms ACK timeout.
    let c = send_cqes(&a, &mut ca, 4, Duration::from_micros(100));
    assert_eq!(
        c.iter()
            .map(|c| (c.wqe_counter, c.ok()))
            .collect::<Vec<_>>(),
        [(0, true), (1, true), (2, true), (3, true)],
        "{c:?}"
    );
    assert_eq!(
        xmit_pkts(&mut a) - before,
        12 + 8,
        "go-back-N from the lost PSN: packets 5..12 once more"
    );
    let r: Vec<(u16, u32, bool)> = cb
        .drain()
        .iter()
        .map(|c| (c.wqe_counter, c.byte_cnt, c.ok()))
        .collect();
    assert_eq!(
        r,
        [
            (0, 10_000, true),
            (1, 10_000, true),
            (2, 10_000, true),
            (3, 10_000, true)
        ],
        "each message delivered once, in order; receive WQE 4 untouched"
    );
    assert_eq!(rb.read(0, 40_000), data);
    b.assert_no_violations();
}

#[test]
fn duplicates_are_acked_again_reads_reexecuted_atomics_not() {
    let Link {
        mut a,
        b,
        w,
        mut ca,
        mut cb,
        mut qa,
        mut qb,
        la,
        rb,
    } = link(64 << 10);
    la.write(0, &Rng(6).bytes(2000));
    // SEND whose ACK is lost: the ACK timeout resends it, the responder
    // sees a duplicate, ACKs it and does not deliver it again.
    qb.post_recv(&[rb.sge(0, 1000)]);
    qb.post_recv(&[rb.sge(1000, 1000)]);
    fault(
        &w,
        FaultRule::new(FaultKind::Drop)
            .qpn(0x80)
            .opcode(opcode::RC | opcode::ACKNOWLEDGE)
            .times(1),
    );
    let before = xmit_pkts(&mut a);
    qa.post(&a, &Wr::send(vec![la.sge(0, 1000)]));
    assert!(send_cqes(&a, &mut ca, 1, Duration::from_millis(3)).is_empty());
    let c = send_cqes(&a, &mut ca, 1, Duration::from_millis(3));
    assert!(c.len() == 1 && c[0].ok(), "{c:?}");
    assert_eq!(xmit_pkts(&mut a) - before, 2, "sent twice");
    let r = cb.drain();
    assert_eq!(r.len(), 1, "delivered once: {r:?}");
    assert_eq!((r[0].wqe_counter, r[0].byte_cnt), (0, 1000));
    // The next SEND lands in receive WQE 1: the duplicate took none.
    qa.post(&a, &Wr::send(vec![la.sge(1000, 1000)]));
    assert!(send_cqes(&a, &mut ca, 1, Duration::from_micros(10))[0].ok());
    let r = cb.drain();
    assert_eq!((r.len(), r[0].wqe_counter), (1, 1), "{r:?}");
    assert_eq!(rb.read(0, 2000), la.read(0, 2000));

    // READ whose response is lost: the memory changes before the timeout;
    // the retried READ is executed again and returns the new bytes.
    w.fabric().lock().unwrap().faults.clear();
    rb.write(8192, &[1u8; 512]);
    fault(
        &w,
        FaultRule::new(FaultKind::Drop)
            .qpn(0x80)
            .opcode(opcode::RC | opcode::RDMA_READ_RESPONSE_ONLY)
            .times(1),
    );
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_READ,
            signalled: true,
            raddr: rb.addr(8192),
            rkey: rb.key,
            sges: vec![la.sge(8192, 512)],
            ..Wr::default()
        },
    );
    wait_steps(&a.r, Duration::from_millis(1));
    assert!(ca.drain().is_empty(), "READ response lost: waiting");
    rb.write(8192, &[2u8; 512]);
    let c = send_cqes(&a, &mut ca, 1, Duration::from_millis(5));
    assert!(c.len() == 1 && c[0].ok(), "{c:?}");
    assert_eq!(la.read(8192, 512), [2u8; 512], "read again from memory");

    // Fetch-and-add whose ACK is lost: the duplicate gets the saved
    // original value; the add happens once.
    w.fabric().lock().unwrap().faults.clear();
    rb.write(64, &100u64.to_be_bytes());
    fault(
        &w,
        FaultRule::new(FaultKind::Drop)
            .qpn(0x80)
            .opcode(opcode::RC | opcode::ATOMIC_ACKNOWLEDGE)
            .times(1),
    );
    qa.post(
        &a,
        &Wr {
            opcode: op::ATOMIC_FA,
            signalled: true,
            raddr: rb.addr(64),
            rkey: rb.key,
            swap: 5,
            sges: vec![la.sge(64, 8)],
            ..Wr::default()
        },
    );
    let c = send_cqes(&a, &mut ca, 1, Duration::from_millis(6));
    assert!(c.len() == 1 && c[0].ok(), "{c:?}");
    assert_eq!(la.read(64, 8), 100u64.to_be_bytes(), "original value");
    assert_eq!(rb.read(64, 8), 105u64.to_be_bytes(), "added once");
    a.assert_no_violations();
    b.assert_no_violations();
}

#[test]
fn a_lost_read_response_in_the_middle_resumes_the_read_there() {
    let Link {
        a,
        mut b,
        w,
        mut ca,
        cb: _cb,
        mut qa,
        qb: _qb,
        la,
        rb,
    } = link(64 << 10);
    let remote = Rng(8).bytes(12_000);
    rb.write(0, &remote);
    fault(
        &w,
        FaultRule::new(FaultKind::Drop)
            .qpn(0x80)
            .opcode(opcode::RC | opcode::RDMA_READ_RESPONSE_MIDDLE)
            .times(1),
    );
    let before = xmit_pkts(&mut b);
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_READ,
            signalled: true,
            raddr: rb.addr(0),
            rkey: rb.key,
            sges: vec![la.sge(0, 12_000)],
            ..Wr::default()
        },
    );
    let c = send_cqes(&a, &mut ca, 1, Duration::from_millis(6));
    assert!(c.len() == 1 && c[0].ok(), "{c:?}");
    assert_eq!(c[0].byte_cnt, 12_000);
    assert_eq!(la.read(0, 12_000), remote);
    assert_eq!(
        xmit_pkts(&mut b) - before,
        3 + 2,
        "three responses, then the two from the lost one on"
    );
}

#[test]
fn reads_in_flight_are_limited_by_max_rd_atomic() {
    for log in [0u32, 2] {
        let Link {
            mut a,
            b: _b,
            w,
            mut ca,
            cb: _cb,
            mut qa,
            qb: _qb,
            la,
            rb,
        } = link(64 << 10);
        if log > 0 {
            set_max_rd_atomic(&mut a, &qa, log);
        }
        let remote = Rng(9).bytes(6 * 100);
        rb.write(0, &remote);
        // Hold the READ responses for 1 ms.
        fault(
            &w,
            FaultRule::new(FaultKind::Delay(1_000_000))
                .qpn(0x80)
                .opcode(opcode::RC | opcode::RDMA_READ_RESPONSE_ONLY),
        );
        let before = xmit_pkts(&mut a);
        let wrs: Vec<Wr> = (0..6u64)
            .map(|i| Wr {
                opcode: op::RDMA_READ,
                signalled: true,
                raddr: rb.addr(i * 100),
                rkey: rb.key,
                sges: vec![la.sge(i * 100, 100)],
                ..Wr::default()
            })
            .collect();
        post_all(&a, &mut qa, &wrs);
        assert_eq!(
            xmit_pkts(&mut a) - before,
            1 << log,
            "max_rd_atomic {} READ requests outstanding",
            1 << log
        );
        let c = send_cqes(&a, &mut ca, 6, Duration::from_millis(10));
        assert_eq!(
            c.iter()
                .map(|c| (c.wqe_counter, c.ok()))
                .collect::<Vec<_>>(),
            (0..6).map(|i| (i, true)).collect::<Vec<_>>(),
            "{c:?}"
        );
        assert_eq!(la.read(0, 600), remote);
        assert_eq!(xmit_pkts(&mut a) - before, 6, "each READ once");
    }
}

#[test]
fn a_full_window_runs_out_of_retries_as_one_message_did() {
    let (mut a, b, _w) = b2b();
    let mut ca = a.cq(8);
    let mut s = QpSpec::new(RC, ca.cqn);
    s.retry_cnt = 2;
    s.ack_timeout = 10; // 4.2 ms
    let mut qa = a.qp(0x80, s);
    // B has no QP 0x90: every request vanishes.
    a.connect(&qa, s, 0x90, b.lid).unwrap();
    let la = a.mr(0x1_0000, 4096, acc::ALL);
    let rb_key = 0x1234_5600;
    let before = xmit_pkts(&mut a);
    let wrs: Vec<Wr> = (0..4u64)
        .map(|i| Wr {
            opcode: op::RDMA_WRITE,
            signalled: true,
            raddr: 0x9000 + i * 8,
            rkey: rb_key,
            sges: vec![la.sge(i * 8, 8)],
            ..Wr::default()
        })
        .collect();
    post_all(&a, &mut qa, &wrs);
    assert_eq!(xmit_pkts(&mut a) - before, 4, "the window is on the wire");
    // First try at 0, retries at 4.2 and 8.4 ms, given up at 12.6 ms.
    wait_steps(&a.r, Duration::from_millis(12));
    assert!(ca.drain().is_empty());
    wait_steps(&a.r, Duration::from_millis(2));
    let c = ca.drain();
    let got: Vec<(u16, u8, u8)> = c
        .iter()
        .map(|c| (c.wqe_counter, c.syndrome, c.vendor))
        .collect();
    assert_eq!(got.len(), 4, "{c:?}");
    assert_eq!(got[0], (0, 0x15, 0x81), "transport retry counter exceeded");
    assert!(
        got[1..]
            .iter()
            .enumerate()
            .all(|(i, g)| g.0 == i as u16 + 1 && g.1 == 0x05),
        "the rest flushed in order: {c:?}"
    );
    assert_eq!(
        xmit_pkts(&mut a) - before,
        3 * 4,
        "every timeout resends the whole window"
    );
    assert_eq!(a.qp_state(0x80), 6, "ERR");
}

#[test]
fn sq_drained_comes_when_the_last_message_in_flight_completes() {
    let Link {
        mut a,
        b: _b,
        w,
        mut ca,
        cb: _cb,
        mut qa,
        qb: _qb,
        la,
        rb,
    } = link(64 << 10);
    fault(
        &w,
        FaultRule::new(FaultKind::Delay(1_000_000))
            .qpn(0x80)
            .opcode(opcode::RC | opcode::ACKNOWLEDGE),
    );
    let wrs: Vec<Wr> = (0..4u64)
        .map(|i| write_wr(&la, i * 100, &rb, i * 100, 100, true))
        .collect();
    post_all(&a, &mut qa, &wrs);
    a.async_events();
    // RTS2SQD with the SQD event bit while the four are in flight.
    let m = crate::harness::QpMbox::new(5, RC);
    a.r.cmd_in(&m.0, 0x80 | 1 << 31, 0, sim::Opcode::RTS2SQD_QP)
        .unwrap();
    assert!(
        !a.async_events().iter().any(|e| e.0 == 0x03),
        "not drained while messages are in flight"
    );
    let c = send_cqes(&a, &mut ca, 4, Duration::from_millis(3));
    assert_eq!(c.len(), 4, "{c:?}");
    let ev = a.async_events();
    assert!(
        ev.iter().any(|e| e.0 == 0x03 && e.1 & 0xff_ffff == 0x80),
        "SQ_DRAINED once the last one completed: {ev:?}"
    );
}

/// Benchmark (release build, `--ignored`, figures printed, nothing
/// asserted about time): 64 KiB RDMA WRITEs between two HCAs of the
/// threaded front end (each model stepped by its own thread in real time,
/// as cx3-emu's are), 16 per doorbell, the last signalled. Every round
/// trip costs the model threads' polling here, so this is where a send
/// window shows against stop-and-wait.
///
/// `cargo test --release -p sim --test engine -- --ignored --nocapture bench_threaded`
#[test]
#[ignore]
fn bench_threaded_rdma_write_64k() {
    let (mut a, mut b, _w) = threaded(0x0002_c903_0000_5000, 0x0002_c903_0000_6000);
    let mut ca = a.cq(10);
    let cb = b.cq(6);
    let (mut qa, _qb) = rc_pair(&mut a, &mut b, &ca, &cb, |_| {});
    let len = 64u32 << 10;
    let src = a.mr(0x10_0000_0000, 1 << 20, acc::ALL);
    let dst = b.mr(0x20_0000_0000, 1 << 20, acc::ALL);
    let pattern: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    src.write(0, &pattern);
    let (n, batch) = (4000u64, 16u64);
    let t = std::time::Instant::now();
    let mut i = 0;
    while i < n {
        let wrs: Vec<Wr> = (0..batch)
            .map(|k| {
                let off = ((i + k) * u64::from(len)) % ((1 << 20) - u64::from(len));
                write_wr(&src, 0, &dst, off, len, k + 1 == batch)
            })
            .collect();
        post_all(&a, &mut qa, &wrs);
        i += batch;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(c) = ca.poll() {
                assert!(c.ok(), "{c:?}");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no CQE within 10 s");
            std::hint::spin_loop();
        }
    }
    let wall = t.elapsed().as_secs_f64();
    println!(
        "64 KiB RDMA WRITE, threaded front end, back to back, 16 per doorbell: {n} in {wall:.3} s \
         = {:.2} GB/s wall, {:.1} us per message",
        n as f64 * f64::from(len) / 1e9 / wall,
        wall / n as f64 * 1e6
    );
    assert_eq!(dst.read(0, 4096), pattern[..4096]);
}
