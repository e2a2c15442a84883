//! The switch checks the CRCs a real switch checks.
//!
//! The VCRC of every packet at every hop, and the ICRC too of a packet its own SMA
//! or PMA takes (port 0 is that packet's end port). A packet the model's HCAs send
//! with its CRCs owed (`sim::fabric`, "CRCs owed") passes unchecked only while it
//! is provably as the builder left it; a packet merely *said* to owe its CRCs is
//! checked like any other, so a corrupted one is dropped and counts PortRcvErrors
//! on every path.

use crate::common::{Net, data_packet};
use sim::fabric::packet::{self, Headers, MAD_LEN, MadHdr, Smp, attr, method, mgmt_class, opcode};
use sim::fabric::switch::Action;
use sim::fabric::{Packet, PortId};

/// Flips one payload bit of a sealed packet (both CRCs now fail).
fn corrupt(mut b: Vec<u8>) -> Vec<u8> {
    let at = b.len() / 2;
    b[at] ^= 0x10;
    b
}

/// Flips one payload bit and recomputes the VCRC only: the link-level
/// check passes, the ICRC (end to end) fails.
fn corrupt_icrc_only(b: Vec<u8>) -> Vec<u8> {
    let mut b = corrupt(b);
    packet::reseal_vcrc(&mut b).unwrap();
    assert!(packet::check_vcrc(&b).is_ok());
    assert!(packet::check_crcs(&b).is_err());
    b
}

fn rcv_errors(n: &Net, port: u8) -> u64 {
    n.f.switch(n.sw).unwrap().counters(port).rcv_errors
}

fn send_owed(n: &mut Net, p: PortId, bytes: Vec<u8>) -> bool {
    n.f.transmit_owed(p, Packet { bytes }, n.now)
}

/// A sealed packet handed to `Fabric::transmit_owed` (the flag says its
/// CRCs are owed; its last bytes are real CRCs, and wrong) is checked by
/// the switch, not forwarded and later given fresh CRCs that would hide
/// the damage.
#[test]
fn a_corrupted_packet_said_to_owe_its_crcs_is_dropped_by_the_switch() {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    let (p0, p1) = (n.port(0), n.port(1));
    let good = data_packet(1, 2, opcode::SEND_ONLY, 0x40, 0, &[0x5a; 256]);
    let before = rcv_errors(&n, 1);
    assert!(send_owed(&mut n, p0, corrupt(good.clone())));
    assert!(
        n.drain(p1).is_empty(),
        "a bad VCRC does not cross the switch"
    );
    assert_eq!(rcv_errors(&n, 1), before + 1, "PortRcvErrors on ingress");
    // The same packet, intact, crosses with its CRCs as they were.
    assert!(send_owed(&mut n, p0, good.clone()));
    assert_eq!(
        n.drain(p1).into_iter().map(|p| p.bytes).collect::<Vec<_>>(),
        std::slice::from_ref(&good)
    );
    // Good VCRC, bad ICRC: the switch forwards it (it reads no further
    // than the link layer), and it arrives with its bad ICRC for the
    // receiver to find, not resealed into a good one.
    let bad = corrupt_icrc_only(good);
    assert!(send_owed(&mut n, p0, bad.clone()));
    let got = n.drain(p1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].bytes, bad);
    assert!(packet::check_crcs(&got[0].bytes).is_err());
    assert_eq!(rcv_errors(&n, 1), before + 1);
}

/// `Switch::receive_crc_owed` on every path: a forwarded data packet, a
/// directed-route SMP for the SMA. The owed claim is honoured only for a
/// packet still as `build_owed` left it.
#[test]
fn receive_crc_owed_checks_what_is_not_provably_owed() {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    let mut h = Headers::for_opcode(opcode::RDMA_WRITE_ONLY).unwrap();
    h.lrh.slid = 1;
    h.lrh.dlid = 2;
    h.bth.pkey = 0xffff;
    let payload = [0x33u8; 512];
    let owed = packet::build_owed(&h, &payload).unwrap();
    let sealed = packet::build(&h, &payload).unwrap();
    let sw = n.f.switch_mut(n.sw).unwrap();
    let before = sw.counters(1).rcv_errors;
    // Truly owed: forwarded as built (the comparison cannot fail).
    let a = sw.receive_crc_owed(
        1,
        Packet {
            bytes: owed.clone(),
        },
        true,
    );
    assert_eq!(a, Action::Send(2, Packet { bytes: owed }));
    // Sealed and intact: forwarded.
    let a = sw.receive_crc_owed(
        1,
        Packet {
            bytes: sealed.clone(),
        },
        true,
    );
    assert_eq!(
        a,
        Action::Send(
            2,
            Packet {
                bytes: sealed.clone()
            }
        )
    );
    // Sealed and corrupted: dropped and counted.
    let a = sw.receive_crc_owed(
        1,
        Packet {
            bytes: corrupt(sealed),
        },
        true,
    );
    assert!(matches!(a, Action::Drop(_)), "{}", what(&a));
    assert_eq!(sw.counters(1).rcv_errors, before + 1);

    // An SMP for the switch's SMA, corrupted, said to owe its CRCs.
    let (_, smp) = n.dr_packet(&[1], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    let sw = n.f.switch_mut(n.sw).unwrap();
    let a = sw.receive_crc_owed(
        1,
        Packet {
            bytes: corrupt(smp.clone()),
        },
        true,
    );
    assert!(matches!(a, Action::Drop(_)), "bad SMP {}", what(&a));
    assert_eq!(sw.counters(1).rcv_errors, before + 2);
    // Intact, it is answered; so is the same SMP truly owing its CRCs
    // (the switch computes them before its SMA reads it).
    let mut owed_smp = smp.clone();
    let n6 = owed_smp.len() - 6;
    owed_smp[n6..].fill(0);
    for bytes in [smp, owed_smp] {
        let a = sw.receive_crc_owed(1, Packet { bytes }, true);
        assert!(matches!(a, Action::Send(1, _)), "{}", what(&a));
    }
    assert_eq!(sw.counters(1).rcv_errors, before + 2);
}

/// An action, without the packet's bytes.
fn what(a: &Action) -> String {
    match a {
        Action::Send(p, _) => format!("sent out of port {p}"),
        Action::Replicate(c) => format!("sent out of {} ports", c.len()),
        Action::Drop(why) => format!("dropped: {why}"),
    }
}

/// A directed-route SMP and a PMA request whose VCRC is good and whose
/// ICRC is not: the switch's management port is their end port and
/// checks the ICRC (PortRcvErrors), where it used to answer them.
#[test]
fn the_switch_checks_the_icrc_of_what_its_sma_and_pma_take() {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    let p0 = n.port(0);
    let before = rcv_errors(&n, 1);
    let (_, smp) = n.dr_packet(&[1], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    assert!(n.send(p0, corrupt_icrc_only(smp)));
    assert!(n.drain(p0).is_empty(), "no answer to a damaged SMP");
    assert_eq!(rcv_errors(&n, 1), before + 1);

    let mut mad = [0u8; MAD_LEN];
    MadHdr {
        base_version: 1,
        mgmt_class: mgmt_class::PERF_MGMT,
        class_version: 1,
        method: method::GET,
        tid: 0x77,
        attr_id: attr::PORT_COUNTERS,
        ..MadHdr::default()
    }
    .write(&mut mad);
    mad[64 + 1] = 1;
    let h = packet::mad_headers(10, 1, 1, 1, 0xffff);
    let gmp = packet::build(&h, &mad).unwrap();
    assert!(n.send(p0, corrupt_icrc_only(gmp.clone())));
    assert!(n.drain(p0).is_empty(), "no answer to a damaged GMP");
    assert_eq!(rcv_errors(&n, 1), before + 2);
    // Intact, both are answered (the check refuses only damage).
    assert!(n.send(p0, gmp));
    assert_eq!(n.drain(p0).len(), 1);
    let r = n.dr(0, &[1], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    assert_eq!(Smp::parse(&r.to_bytes()).unwrap().data[2], 2, "a switch");
}
