//! Figures for the wire (release build, prints, asserts nothing about
//! speed): CRC throughput on 4 KiB packets, packet build rate, and
//! forwarding through one switch.
//! `cargo test --release -p sim --test fabric -- --ignored --nocapture bench`

use crate::common::{Net, data_packet};
use sim::fabric::Packet;
use sim::packet::{self, opcode};
use std::time::Instant;

#[test]
#[ignore = "benchmark: run in release with --ignored --nocapture"]
fn bench_wire() {
    let payload = vec![0x5a; 4096];
    let pkt = data_packet(1, 2, opcode::RDMA_WRITE_MIDDLE, 0x40, 0, &payload);
    let n = 20_000;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(packet::check_crcs(std::hint::black_box(&pkt))).unwrap();
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "ICRC+VCRC check, 4 KiB packets: {:.2} GB/s ({:.0} packets/s)",
        (n * pkt.len()) as f64 / s / 1e9,
        n as f64 / s
    );
    let mut h = packet::Headers::for_opcode(opcode::RDMA_WRITE_MIDDLE).unwrap();
    h.lrh.dlid = 2;
    let mut buf = Vec::with_capacity(4200);
    let t = Instant::now();
    for i in 0..n {
        h.bth.psn = i as u32;
        packet::build_into(&h, &payload, &mut buf).unwrap();
        std::hint::black_box(&buf);
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "build (headers + copy + CRCs), 4 KiB: {:.2} GB/s, 8 B: see below",
        (n * buf.len()) as f64 / s / 1e9
    );
    let small = vec![1u8; 8];
    let t = Instant::now();
    for i in 0..n * 10 {
        h.bth.psn = i as u32;
        packet::build_into(&h, &small, &mut buf).unwrap();
        std::hint::black_box(&buf);
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "build, 8 B payload: {:.2} M packets/s",
        (n * 10) as f64 / s / 1e6
    );
    let mut net = Net::star(2);
    net.sm_bring_up(2, 10);
    let (p0, p1) = (net.port(0), net.port(1));
    for (len, count) in [(4096usize, 20_000usize), (8, 200_000)] {
        let bytes = data_packet(1, 2, opcode::RDMA_WRITE_MIDDLE, 0x40, 0, &vec![7; len]);
        let t = Instant::now();
        let mut got = 0;
        for _ in 0..count / 1000 {
            for _ in 0..1000 {
                net.f.transmit(
                    p0,
                    Packet {
                        bytes: bytes.clone(),
                    },
                    net.now,
                );
            }
            net.now += 1;
            while net.f.receive(p1, net.now).is_some() {
                got += 1;
            }
        }
        let s = t.elapsed().as_secs_f64();
        assert_eq!(got, count);
        println!(
            "through one switch (copy per send, VCRC check at the switch), {len} B payload: {:.2} M packets/s, {:.2} GB/s",
            count as f64 / s / 1e6,
            (count * bytes.len()) as f64 / s / 1e9
        );
    }
}
