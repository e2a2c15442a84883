//! Figures for the wire.
//!
//! Figures for the wire (release build, prints, asserts nothing about
//! speed): CRC throughput on 4 KiB packets, packet build rate, and
//! forwarding through one switch.
//! `cargo test --release -p sim --test fabric -- --ignored --nocapture bench`

use crate::common::{Net, data_packet};
use sim::fabric::Packet;
use sim::fabric::packet::{self, opcode};
use std::time::Instant;

/// CPU time of this thread in seconds (from /proc/thread-self/schedstat),
/// so that the figures mean something on a loaded machine.
fn cpu() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

/// Runs `f`, returns (wall seconds, CPU seconds).
fn timed(f: impl FnOnce()) -> (f64, f64) {
    let (t, c) = (Instant::now(), cpu());
    f();
    (t.elapsed().as_secs_f64(), cpu() - c)
}

#[test]
#[ignore = "benchmark: run in release with --ignored --nocapture"]
fn bench_wire() {
    let payload = vec![0x5a; 4096];
    let pkt = data_packet(1, 2, opcode::RDMA_WRITE_MIDDLE, 0x40, 0, &payload);
    let n = 50_000;
    let (w, c) = timed(|| {
        for _ in 0..n {
            std::hint::black_box(packet::check_crcs(std::hint::black_box(&pkt))).unwrap();
        }
    });
    println!(
        "ICRC+VCRC check, 4 KiB packets: {:.2} GB/s per CPU second ({:.2} GB/s wall)",
        (n * pkt.len()) as f64 / c / 1e9,
        (n * pkt.len()) as f64 / w / 1e9,
    );
    let mut h = packet::Headers::for_opcode(opcode::RDMA_WRITE_MIDDLE).unwrap();
    h.lrh.dlid = 2;
    let mut buf = Vec::with_capacity(4200);
    let (_, c) = timed(|| {
        for i in 0..n {
            h.bth.psn = i as u32;
            packet::build_into(&h, &payload, &mut buf).unwrap();
            std::hint::black_box(&buf);
        }
    });
    println!(
        "build_into (headers, copy, ICRC, VCRC), 4 KiB payload: {:.2} GB/s per CPU second",
        (n * buf.len()) as f64 / c / 1e9
    );
    let small = vec![1u8; 8];
    let (_, c) = timed(|| {
        for i in 0..n * 10 {
            h.bth.psn = i as u32;
            packet::build_into(&h, &small, &mut buf).unwrap();
            std::hint::black_box(&buf);
        }
    });
    println!(
        "build_into, 8 B payload: {:.2} M packets per CPU second",
        (n * 10) as f64 / c / 1e6
    );
    let mut net = Net::star(2);
    net.sm_bring_up(2, 10);
    let (p0, p1) = (net.port(0), net.port(1));
    for (len, count) in [(4096usize, 20_000usize), (8, 200_000)] {
        let bytes = data_packet(1, 2, opcode::RDMA_WRITE_MIDDLE, 0x40, 0, &vec![7; len]);
        let mut got = 0;
        let (_, c) = timed(|| {
            for _ in 0..count / 1000 {
                for _ in 0..1000 {
                    let pkt = Packet {
                        bytes: bytes.clone(),
                    };
                    net.f.transmit(p0, pkt, net.now);
                }
                net.now += 1;
                while net.f.receive(p1, net.now).is_some() {
                    got += 1;
                }
            }
        });
        assert_eq!(got, count);
        println!(
            "HCA -> switch -> HCA (a copy per send, VCRC at the switch), {len} B payload: \
             {:.2} M packets, {:.2} GB per CPU second",
            count as f64 / c / 1e6,
            (count * bytes.len()) as f64 / c / 1e9
        );
    }
}
