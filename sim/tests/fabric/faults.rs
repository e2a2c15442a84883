//! Packet faults and cable pulls.

use crate::common::{Net, data_packet, port_counters};
use sim::fabric::packet::{self, PacketError, attr, method, opcode};
use sim::fabric::{Fabric, FaultKind, FaultOptions, FaultRule, Packet, PortId, Topology};

/// Two HCAs back to back, both ports enabled.
fn b2b() -> (Fabric, PortId, PortId) {
    let mut f = Fabric::new();
    let b = Topology::back_to_back().build(&mut f).unwrap();
    let (a, c) = (b.hca_port(0, 1).unwrap(), b.hca_port(1, 1).unwrap());
    f.set_enabled(a, true).unwrap();
    f.set_enabled(c, true).unwrap();
    (f, a, c)
}

fn pkt(psn: u32, qpn: u32, op: u8) -> Packet {
    Packet {
        bytes: data_packet(1, 2, op, qpn, psn, b"payload!"),
    }
}

fn psns(f: &mut Fabric, p: PortId, now: u64) -> Vec<u32> {
    let mut v = Vec::new();
    while let Some(x) = f.receive(p, now) {
        v.push(packet::parse(&x.bytes).unwrap().hdr.bth.psn);
    }
    v
}

#[test]
fn drop_every_nth() {
    let (mut f, a, b) = b2b();
    f.faults.add(FaultRule::new(FaultKind::Drop).every(3));
    for i in 0..9 {
        assert!(
            f.transmit(a, pkt(i, 0x40, opcode::SEND_ONLY), 0),
            "the sender cannot tell"
        );
    }
    assert_eq!(psns(&mut f, b, 0), [0, 1, 3, 4, 6, 7]);
    assert_eq!(f.faults.stats.dropped, 3);
}

#[test]
fn drop_at_a_seeded_rate_is_repeatable() {
    let run = |seed| {
        let (mut f, a, b) = b2b();
        f.faults.seed(seed);
        f.faults.add(FaultRule::new(FaultKind::Drop).rate(0.3));
        for i in 0..200 {
            f.transmit(a, pkt(i, 0x40, opcode::SEND_ONLY), 0);
        }
        psns(&mut f, b, 0)
    };
    let x = run(7);
    assert_eq!(x, run(7), "same seed, same losses");
    assert_ne!(x, run(8));
    assert!(
        (110..170).contains(&x.len()),
        "about 70% arrive: {}",
        x.len()
    );
}

#[test]
fn drop_matching_qpn_or_opcode_only() {
    let (mut f, a, b) = b2b();
    f.faults.add(FaultRule::new(FaultKind::Drop).qpn(0x41));
    f.faults
        .add(FaultRule::new(FaultKind::Drop).opcode(opcode::RDMA_WRITE_ONLY));
    f.transmit(a, pkt(1, 0x40, opcode::SEND_ONLY), 0);
    f.transmit(a, pkt(2, 0x41, opcode::SEND_ONLY), 0);
    let mut w = packet::Headers::for_opcode(opcode::RDMA_WRITE_ONLY).unwrap();
    w.lrh.dlid = 2;
    w.bth.psn = 3;
    w.bth.dest_qp = 0x40;
    f.transmit(
        a,
        Packet {
            bytes: packet::build(&w, b"w").unwrap(),
        },
        0,
    );
    f.transmit(a, pkt(4, 0x40, opcode::SEND_ONLY), 0);
    assert_eq!(psns(&mut f, b, 0), [1, 4]);
}

#[test]
fn corrupt_makes_the_receiver_see_a_bad_crc() {
    let (mut f, a, b) = b2b();
    f.faults.add(FaultRule::new(FaultKind::Corrupt).times(1));
    f.transmit(a, pkt(1, 0x40, opcode::SEND_ONLY), 0);
    f.transmit(a, pkt(2, 0x40, opcode::SEND_ONLY), 0);
    let bad = f.receive(b, 0).unwrap();
    assert!(matches!(
        packet::check_crcs(&bad.bytes),
        Err(PacketError::BadVcrc { .. } | PacketError::BadIcrc { .. })
    ));
    let good = f.receive(b, 0).unwrap();
    assert_eq!(
        packet::check_crcs(&good.bytes),
        Ok(()),
        "times(1): only one"
    );
}

#[test]
fn corrupt_through_a_switch_reaches_the_hca() {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    n.f.faults.add(FaultRule::new(FaultKind::Corrupt));
    let (p0, p1) = (n.port(0), n.port(1));
    assert!(n.send(p0, data_packet(1, 2, opcode::SEND_ONLY, 0x40, 0, b"bits")));
    let got = n.drain(p1);
    assert_eq!(got.len(), 1, "the switch did not see the corruption");
    assert!(packet::check_crcs(&got[0].bytes).is_err(), "the HCA does");
    n.f.faults.clear();
    let r = port_counters(&n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 1, 0));
    assert_eq!(r.rcv_errors, 0);
    // Corruption on the HCA-to-switch link: the switch's VCRC check drops
    // it and counts PortRcvErrors.
    n.f.faults
        .add(FaultRule::new(FaultKind::Corrupt).port(p0).times(1));
    assert!(n.send(p0, data_packet(1, 2, opcode::SEND_ONLY, 0x40, 1, b"bits")));
    assert!(n.drain(p1).is_empty());
    assert_eq!(n.f.switch(n.sw).unwrap().counters(1).rcv_errors, 1);
}

#[test]
fn delay_holds_the_packet_and_keeps_order() {
    let (mut f, a, b) = b2b();
    f.latency_ns = 100;
    f.faults
        .add(FaultRule::new(FaultKind::Delay(5_000)).opcode(opcode::SEND_FIRST));
    f.transmit(a, pkt(1, 0x40, opcode::SEND_FIRST), 0);
    f.transmit(a, pkt(2, 0x40, opcode::SEND_LAST), 10);
    assert_eq!(f.next_due(), Some(5_100));
    assert!(psns(&mut f, b, 5_099).is_empty(), "held");
    assert_eq!(psns(&mut f, b, 5_100), [1, 2], "in order: the link is FIFO");
    assert_eq!(f.faults.stats.delayed, 1);
}

#[test]
fn cable_pull_and_reinsert_at_a_time() {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    let (p0, p1) = (n.port(0), n.port(1));
    let g = n.f.link_generation(p1);
    let t = n.now;
    n.f.schedule_unplug(p1, t + 10_000, Some(t + 20_000))
        .unwrap();
    n.f.advance(t + 9_999);
    assert!(n.f.link_up(p1));
    n.f.advance(t + 10_000);
    assert!(
        !n.f.link_up(p1) && n.f.link_generation(p1) == g + 1,
        "pulled"
    );
    assert!(!n.f.transmit(
        p1,
        Packet {
            bytes: data_packet(2, 1, opcode::SEND_ONLY, 0x40, 0, b"")
        },
        t + 15_000
    ));
    n.now = t + 20_000;
    n.f.advance(n.now);
    assert!(
        n.f.link_up(p1) && n.f.link_generation(p1) == g + 2,
        "reinserted"
    );
    let c = port_counters(&n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 2, 0));
    assert_eq!(c.link_downed, 1, "LinkDownedCounter on the switch port");
    // The port came back in Init: data waits for the SM.
    let r = n.dr(0, &[1], method::GET, attr::PORT_INFO, 2, &[0; 64]);
    assert_eq!((r.data[32] & 0xf, r.data[33] >> 4), (2, 5), "Init, LinkUp");
    assert!(n.send(p0, data_packet(1, 2, opcode::SEND_ONLY, 0x40, 0, b"x")));
    assert!(n.drain(p1).is_empty());
}

#[test]
fn cable_pull_after_bytes_crossed_it_in_either_direction() {
    let (mut f, a, b) = b2b();
    let len = pkt(0, 0x40, opcode::SEND_ONLY).bytes.len() as u64;
    // Three packets' worth; the third packet is the one that uses it up.
    f.unplug_after_bytes(a, 3 * len, Some(1_000)).unwrap();
    let g = f.link_generation(a);
    assert!(f.transmit(a, pkt(1, 0x40, opcode::SEND_ONLY), 10));
    assert!(
        f.transmit(b, pkt(2, 0x40, opcode::SEND_ONLY), 20),
        "the way back counts too"
    );
    f.advance(100);
    assert!(f.link_up(a), "two packets: still cabled");
    assert!(f.transmit(a, pkt(3, 0x40, opcode::SEND_ONLY), 200));
    assert!(
        !f.transmit(a, pkt(4, 0x40, opcode::SEND_ONLY), 201),
        "pulled after the third"
    );
    assert!(!f.link_up(a) && f.link_generation(a) == g + 1);
    f.advance(1_200);
    assert!(f.link_up(a), "plugged back 1 us after the pull");
    assert!(f.transmit(a, pkt(5, 0x40, opcode::SEND_ONLY), 1_300));
    f.advance(10_000);
    assert!(f.link_up(a), "a byte-count pull happens once");
}

#[test]
fn cx3_emu_options_resolve_against_the_topology() {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let mut o = FaultOptions::default();
    for (k, v) in [
        ("--drop", "every=2,port=sw0/2"),
        ("--pull", "node1/1@1ms+1ms"),
        ("--fault-seed", "9"),
    ] {
        assert_eq!(o.parse_arg(k, v), Ok(true));
    }
    let p = built
        .resolve(&f, o.rules[0].port.as_ref().unwrap())
        .unwrap();
    assert_eq!(p, f.switch_port(built.switches[0].1, 2).unwrap());
    assert_eq!(
        built.resolve(&f, &o.pulls[0].port).unwrap(),
        built.hca_port(1, 1).unwrap()
    );
    let bad = sim::fabric::faults::PortRef::parse("nobody/1").unwrap();
    assert!(
        built
            .resolve(&f, &bad)
            .unwrap_err()
            .contains("no node named")
    );
}

#[test]
fn a_delay_on_one_cable_does_not_hold_up_another() {
    let mut n = Net::star(3);
    n.sm_bring_up(3, 10);
    let (p0, p1, p2) = (n.port(0), n.port(1), n.port(2));
    // Node 0's packets towards the switch wait 1 ms; node 2's do not.
    n.f.faults
        .add(FaultRule::new(FaultKind::Delay(1_000_000)).port(p0));
    assert!(n.send(p0, data_packet(1, 2, opcode::SEND_ONLY, 0x40, 1, b"slow")));
    assert!(n.send(p2, data_packet(3, 2, opcode::SEND_ONLY, 0x40, 2, b"fast")));
    let got = n.drain(p1);
    assert_eq!(got.len(), 1, "the undelayed packet crossed the switch");
    assert_eq!(packet::parse(&got[0].bytes).unwrap().hdr.bth.psn, 2);
    n.now += 1_000_000;
    let got = n.drain(p1);
    assert_eq!(
        packet::parse(&got[0].bytes).unwrap().hdr.bth.psn,
        1,
        "then the delayed one"
    );
}
