//! Benchmarks (release build, `--ignored`, figures printed, nothing
//! asserted about time): the in-process engine's RDMA WRITE throughput
//! with 64 KiB messages and its 8-byte RDMA WRITE rate on one core.
//!
//! `cargo test --release -p sim --test engine -- --ignored --nocapture bench`

use std::time::Instant;

use crate::poster::*;

/// One HCA writing from `src` to `dst` over its loopback: RC QP `a`
/// (0x80, connected to 0x81), both on `cq`.
struct Loop {
    h: Hca,
    cq: Cq,
    a: Qp,
    src: Mr,
    dst: Mr,
}

fn setup(phys: bool) -> Loop {
    let mut h = Hca::new();
    let cq = h.cq(10);
    let mut s = QpSpec::new(RC, cq.cqn);
    s.sq_log = 8;
    let a = h.qp(0x80, s);
    let b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let (src, dst) = if phys {
        (h.mr_phys(1 << 20, acc::ALL), h.mr_phys(1 << 20, acc::ALL))
    } else {
        (
            h.mr(0x10_0000_0000, 1 << 20, acc::ALL),
            h.mr(0x20_0000_0000, 1 << 20, acc::ALL),
        )
    };
    Loop { h, cq, a, src, dst }
}

/// This thread's CPU time in seconds (utime + stime from
/// /proc/thread-self/stat, 100 Hz ticks): on a shared machine the figures
/// per CPU second are the engine's, the wall-clock ones are not.
fn cpu_secs() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let after = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after the command: state is index 0, utime 11, stime 12.
    (tick(11) + tick(12)) / 100.0
}

/// Posts `n` RDMA WRITEs of `len` bytes, `batch` per doorbell, every
/// `batch`-th signalled; returns (wall, CPU) seconds.
fn run(l: &mut Loop, len: u32, n: u64, batch: u32) -> (f64, f64) {
    let Loop { h, cq, a, src, dst } = l;
    let mk = |i: u64, sig: bool| Wr {
        opcode: op::RDMA_WRITE,
        signalled: sig,
        raddr: dst.addr((i * u64::from(len)) % ((1 << 20) - u64::from(len))),
        rkey: dst.key,
        sges: vec![src.sge(0, len)],
        ..Wr::default()
    };
    let wqe_plain = a.build(&mk(0, false));
    let wqe_sig = a.build(&mk(0, true));
    let t = Instant::now();
    let c0 = cpu_secs();
    let mut i = 0u64;
    while i < n {
        for k in 0..batch {
            let sig = k + 1 == batch;
            let mut w = if sig {
                wqe_sig.clone()
            } else {
                wqe_plain.clone()
            };
            let raddr = dst.addr((i * u64::from(len)) % ((1 << 20) - u64::from(len)));
            w[16..24].copy_from_slice(&raddr.to_be_bytes());
            a.put(op::RDMA_WRITE, false, &w);
            i += 1;
        }
        h.ring_send(a.qpn);
        while cq.poll().is_none() {}
    }
    (t.elapsed().as_secs_f64(), cpu_secs() - c0)
}

#[test]
#[ignore]
fn bench_rdma_write_throughput_and_rate() {
    for phys in [false, true] {
        let mut l = setup(phys);
        let kind = if phys {
            "physical MRs"
        } else {
            "MTT MRs (4 KiB pages)"
        };
        let n = 40_000;
        let (w, c) = run(&mut l, 64 << 10, n, 16);
        let b = n as f64 * 65536.0 / 1e9;
        println!(
            "64 KiB RDMA WRITE, {kind}: {n} in {w:.3} s wall, {c:.2} s CPU = {:.2} GB/s wall, {:.2} GB/s per CPU second",
            b / w,
            b / c.max(0.01)
        );
        let n = 2_000_000;
        let (w, c) = run(&mut l, 8, n, 32);
        println!(
            "8-byte RDMA WRITE, {kind}, 32 per doorbell: {n} in {w:.3} s wall, {c:.2} s CPU = {:.2} M ops/s wall, {:.2} M ops per CPU second",
            n as f64 / w / 1e6,
            n as f64 / c.max(0.01) / 1e6
        );
        let n = 500_000;
        let (w, c) = run(&mut l, 8, n, 1);
        println!(
            "8-byte RDMA WRITE, {kind}, one per doorbell, each signalled: {n} in {w:.3} s wall, {c:.2} s CPU = {:.2} M ops/s wall, {:.2} M ops per CPU second",
            n as f64 / w / 1e6,
            n as f64 / c.max(0.01) / 1e6
        );
        l.h.assert_no_violations();
        assert_eq!(l.dst.read(0, 8), l.src.read(0, 8));
    }
}

/// Doorbell-to-CQE latency of the polled front end `cx3-emu` runs: the
/// model's registers are shared memory, one thread spins on
/// `SimHca::poll` (cx3-emu's loop while busy), the host-side poster
/// writes a WQE, rings the send doorbell and spins on the CQ. (The ivshmem
/// files are left out: the same `poll_shared` round reads the same kind
/// of shared register words.)
#[test]
#[ignore]
fn bench_polled_doorbell_to_cqe_latency() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
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
    let mut h = Hca::with(sim);
    let mut cq = h.cq(10);
    let s = QpSpec::new(RC, cq.cqn);
    let mut a = h.qp(0x80, s);
    let b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let src = h.mr(0x1000, 4096, acc::ALL);
    let dst = h.mr(0x9000, 4096, acc::ALL);
    let w = Wr {
        opcode: op::RDMA_WRITE,
        signalled: true,
        raddr: dst.addr(0),
        rkey: dst.key,
        sges: vec![src.sge(0, 8)],
        ..Wr::default()
    };
    let bytes = a.build(&w);
    let n = 20_000;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        a.put(op::RDMA_WRITE, false, &bytes);
        h.ring_send(a.qpn);
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if let Some(c) = cq.poll() {
                assert!(c.ok(), "{c:?}");
                break;
            }
            assert!(Instant::now() < deadline, "no CQE within 5 s");
            std::hint::spin_loop();
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();
    lat.sort_unstable();
    let pct = |p: usize| lat[(lat.len() * p / 100).min(lat.len() - 1)] as f64 / 1000.0;
    println!(
        "polled front end, doorbell to CQE (8-byte RDMA WRITE, loopback), {n} samples: median {:.2} us, p90 {:.2} us, p99 {:.2} us, min {:.2} us",
        pct(50),
        pct(90),
        pct(99),
        lat[0] as f64 / 1000.0
    );
}

/// Two HCAs through one switch (the cx3-emu default topology), stepped on
/// one thread as cx3-emu's loop steps them: returns them with an RC pair
/// (A's QP 0x80 to B's QP 0x90), A's CQ, and a 1 MiB source MR on A and
/// sink MR on B (MTT-mapped, 4 KiB pages, as a guest's).
fn through_switch() -> (Hca, Hca, sim::Wire, Cq, Qp, Mr, Mr) {
    let (mut a, mut b, w) = crate::pairs::switched();
    let ca = a.cq(10);
    let cb = b.cq(10);
    let (qa, _qb) = crate::pairs::rc_pair(&mut a, &mut b, &ca, &cb, |s| s.sq_log = 8);
    let src = a.mr(0x10_0000_0000, 1 << 20, acc::ALL);
    let dst = b.mr(0x20_0000_0000, 1 << 20, acc::ALL);
    (a, b, w, ca, qa, src, dst)
}

/// 64 KiB RDMA WRITEs from one HCA to another through the switch, both
/// HCAs and the switch stepped on this thread (cx3-emu's work for one
/// guest-to-guest `ib_write_bw` message, without the polling): CPU per
/// message and GB per CPU second. `perf record` this test to see where a
/// guest-to-guest message spends the emulator's time.
#[test]
#[ignore]
fn bench_rdma_write_through_the_switch() {
    let (a, _b, w, mut ca, mut qa, src, dst) = through_switch();
    let len = 64u32 << 10;
    let mk = |i: u64, sig: bool| Wr {
        opcode: op::RDMA_WRITE,
        signalled: sig,
        raddr: dst.addr((i * u64::from(len)) % ((1 << 20) - u64::from(len))),
        rkey: dst.key,
        sges: vec![src.sge(0, len)],
        ..Wr::default()
    };
    let pattern: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    src.write(0, &pattern);
    let n = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000u64);
    let batch = 16u64;
    let t = Instant::now();
    let c0 = cpu_secs();
    let mut i = 0;
    while i < n {
        for k in 0..batch {
            qa.put(op::RDMA_WRITE, false, &qa.build(&mk(i + k, k + 1 == batch)));
        }
        a.ring_send(qa.qpn);
        i += batch;
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(c) = ca.poll() {
                assert!(c.ok(), "{c:?}");
                break;
            }
            w.step(true);
            assert!(Instant::now() < deadline, "no CQE within 10 s");
        }
    }
    let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu_secs() - c0);
    let gb = n as f64 * f64::from(len) / 1e9;
    println!(
        "64 KiB RDMA WRITE through the switch (MTU 4096, MTT MRs): {n} in {wall:.3} s wall, \
         {cpu:.2} s CPU = {:.1} us CPU per message, {:.2} GB per CPU second ({:.2} GB/s wall)",
        cpu / n as f64 * 1e6,
        gb / cpu.max(0.01),
        gb / wall
    );
    assert_eq!(dst.read(0, len as usize), pattern, "bytes arrived");
}
