//! What the embedded SM costs the fabric.
//!
//! `Fabric::advance` on an idle subnet with and without the SM (it is polled from
//! every advance), and a heavy sweep. Release build: `cargo test --release -p sim
//! --test sm bench -- --ignored --nocapture`.

use std::time::Instant;

use sim::fabric::{Fabric, SmConfig, Topology};

use crate::net::Net;

#[test]
#[ignore = "benchmark: prints figures"]
fn idle_advance_and_sweep_cost() {
    const N: u64 = 2_000_000;
    let mut plain = Fabric::new();
    Topology::for_nodes(2).unwrap().build(&mut plain).unwrap();
    let t = Instant::now();
    for i in 0..N {
        plain.advance(i * 100);
    }
    let without = t.elapsed().as_nanos() as f64 / N as f64;
    let mut net = Net::star(2);
    assert!(net.run_until(5_000_000_000, |n| n.sm_master()));
    let base = net.now;
    let t = Instant::now();
    for i in 0..N {
        net.f.advance(base + i * 100);
    }
    let with = t.elapsed().as_nanos() as f64 / N as f64;
    println!(
        "Fabric::advance on an idle subnet: {without:.1} ns without an SM, {with:.1} ns with the embedded SM"
    );
    // Heavy sweeps: a fresh SM on a configured subnet, again and again.
    let mut sweeps = 0u64;
    let mut smps = 0u64;
    let t = Instant::now();
    for _ in 0..200 {
        net.f.restart_sm();
        assert!(net.run_until(5_000_000_000, |n| n.sm_master()));
        sweeps += 1;
        smps += net.f.sm().unwrap().stats().smps_last_heavy;
    }
    let per = t.elapsed().as_secs_f64() / sweeps as f64;
    println!(
        "heavy sweep of 1 switch + 2 CAs: {:.0} µs wall each, {} SMPs each ({:.2} µs per SMP round trip incl. the test CAs)",
        per * 1e6,
        smps / sweeps,
        per * 1e6 / (smps / sweeps) as f64
    );
    let _ = SmConfig::default();
}
