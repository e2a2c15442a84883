//! Bad input into the switch.
//!
//! Random and mutated packets never panic or hang it, and it still answers
//! afterwards. The default run sends 20 000 packets; `cargo test -p sim --test
//! fabric -- --ignored fuzz_million` sends 1 000 000.

use crate::common::{Net, data_packet};
use sim::fabric::faults::Rng;
use sim::fabric::packet::{self, attr, method, opcode};
use sim::fabric::{Fabric, Packet, Switch};

fn fuzz(count: u64) {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    let (p0, p1) = (n.port(0), n.port(1));
    let mut rng = Rng::new(0xf0f0);
    let (_, smp) = n.dr_packet(&[1], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    let (_, smp2) = n.dr_packet(&[1, 2], method::SET, attr::PORT_INFO, 1, &[0; 64]);
    let seeds = [
        smp,
        smp2,
        data_packet(1, 2, opcode::SEND_ONLY, 0x40, 0, &[1; 64]),
        data_packet(1, 10, opcode::UD_SEND_ONLY, 1, 0, &[0; 256]),
        data_packet(1, 2, opcode::RDMA_WRITE_FIRST, 0x40, 0, &[2; 256]),
    ];
    for i in 0..count {
        let mut b = match rng.below(3) {
            0 => (0..rng.below(300)).map(|_| rng.next_u64() as u8).collect(),
            _ => {
                let mut b = seeds[rng.below(seeds.len() as u64) as usize].clone();
                for _ in 0..=rng.below(4) {
                    let at = rng.below(b.len() as u64) as usize;
                    b[at] = rng.next_u64() as u8;
                }
                if rng.below(4) == 0 {
                    b.truncate(rng.below(b.len() as u64 + 1) as usize);
                }
                // Half of them with good CRCs, so they get past the VCRC
                // check and into the parser, SMI and SMA.
                if rng.below(2) == 0 && b.len() > 20 {
                    let _ = packet::reseal(&mut b);
                }
                b
            }
        };
        if b.is_empty() {
            b.push(0);
        }
        let from = if i % 2 == 0 { p0 } else { p1 };
        n.f.transmit(from, Packet { bytes: b }, n.now);
        if i % 64 == 0 {
            n.tick();
            while n.f.receive(p0, n.now).is_some() {}
            while n.f.receive(p1, n.now).is_some() {}
        }
    }
    n.tick();
    while n.f.receive(p0, n.now).is_some() {}
    while n.f.receive(p1, n.now).is_some() {}
    let st = n.f.stats();
    println!(
        "fuzz: {count} packets, {} sent on by the fabric; switch drops by reason:",
        st.sent
    );
    for (why, k) in &st.switch_drops {
        println!("  {k:>8}  {why}");
    }
    assert!(
        st.switch_drops.len() >= 5,
        "the fuzz reaches several checks"
    );
    // Random SMPs may have changed port states or the LFT; the SMA must
    // still answer correctly.
    let r = n.dr(0, &[1], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    assert_eq!(r.data[2], 2, "the switch still answers NodeInfo");
}

#[test]
fn fuzz_switch_default() {
    fuzz(20_000);
}

#[test]
#[ignore = "1 000 000 packets: run with --ignored"]
fn fuzz_million() {
    fuzz(1_000_000);
}

#[test]
fn forwarding_loop_ends() {
    // Two switches whose LFTs send DLID 5 round in a circle.
    let mut f = Fabric::new();
    let a = f.add_switch(Switch::new("a", 1, 4));
    let b = f.add_switch(Switch::new("b", 2, 4));
    let h = f.attach_hca_port(3, 1);
    f.set_enabled(h, true).unwrap();
    f.connect(h, f.switch_port(a, 1).unwrap()).unwrap();
    f.connect(f.switch_port(a, 2).unwrap(), f.switch_port(b, 2).unwrap())
        .unwrap();
    f.connect(f.switch_port(a, 3).unwrap(), f.switch_port(b, 3).unwrap())
        .unwrap();
    // a sends DLID 5 to b over port 2, b sends it back to a over port 3.
    f.switch_mut(a).unwrap().configure(20, &[(5, 2)]);
    f.switch_mut(b).unwrap().configure(21, &[(5, 3)]);
    assert!(f.transmit(
        h,
        Packet {
            bytes: data_packet(1, 5, opcode::SEND_ONLY, 1, 0, b"loop")
        },
        0
    ));
    for t in 0..10 {
        f.advance(t);
    }
    assert_eq!(f.next_due(), None, "the looping packet was dropped");
    assert_eq!(
        f.stats().switch_drops.get("looping: too many switch hops"),
        Some(&1)
    );
}
