//! Unit tests of the fabric's wiring, delivery and published activity.

use super::*;

fn pkt(dlid: u16) -> Packet {
    let mut b = vec![0u8; 8 + 6];
    b[2..4].copy_from_slice(&dlid.to_be_bytes());
    Packet { bytes: b }
}

#[test]
fn link_needs_cable_and_both_ends_enabled() {
    let mut f = Fabric::new();
    let a = f.attach_hca_port(1, 1);
    let b = f.attach_hca_port(2, 1);
    assert!(!f.link_up(a));
    f.set_enabled(a, true).unwrap();
    f.set_enabled(b, true).unwrap();
    assert!(!f.link_up(a), "no cable yet");
    f.connect(a, b).unwrap();
    assert!(f.link_up(a) && f.link_up(b));
    assert_eq!(f.link_generation(a), 1);
    f.set_enabled(b, false).unwrap();
    assert!(!f.link_up(a), "partner closed its port");
    assert_eq!(f.link_generation(a), 2);
    assert_eq!(f.connect(a, a), Err(FabricError::SelfLoop(a)));
    assert_eq!(f.connect(a, b), Err(FabricError::AlreadyCabled(a)));
}

/// Owed CRCs (module doc, "CRCs owed"): a packet crosses a switch
/// unsealed only while nothing can see or change it; a capture or a
/// fault seals it first (so a corrupted packet still fails its CRCs),
/// and `receive` hands out sealed packets.
#[test]
fn owed_crcs_are_computed_before_anything_sees_or_changes_the_bytes() {
    use crate::fabric::packet::{self, Headers, opcode};
    let mut h = Headers::for_opcode(opcode::RDMA_WRITE_MIDDLE).unwrap();
    h.lrh.slid = 1;
    h.lrh.dlid = 2;
    let payload: Vec<u8> = (0..1024u32).map(|i| i as u8).collect();
    let sealed = packet::build(&h, &payload).unwrap();
    let owed = packet::build_owed(&h, &payload).unwrap();
    assert_ne!(owed, sealed, "the CRC bytes are placeholders");
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let (a, b) = (built.hcas[0].ports[0], built.hcas[1].ports[0]);
    f.set_enabled(a, true).unwrap();
    f.set_enabled(b, true).unwrap();
    let sw = built.switches[0].1;
    f.switch_mut(sw).unwrap().configure(0x10, &[(1, 1), (2, 2)]);
    let s = f.switch(sw).unwrap();
    assert!(s.only_forwards(&owed));
    let mut to_sma = owed.clone();
    to_sma[2..4].copy_from_slice(&0x10u16.to_be_bytes());
    assert!(!s.only_forwards(&to_sma), "for the switch's own LID");
    let mut vl15 = owed.clone();
    vl15[0] |= 0xf0;
    assert!(!s.only_forwards(&vl15), "VL15");
    let send = |f: &mut Fabric| {
        assert!(f.transmit_owed(
            a,
            Packet {
                bytes: owed.clone()
            },
            0
        ));
    };
    // Nothing watching: forwarded by the switch without CRCs.
    send(&mut f);
    let (p, still_owed) = f.receive_owed(b, 0).expect("forwarded");
    assert!(still_owed);
    assert_eq!(p.bytes, owed);
    // `receive` seals.
    send(&mut f);
    assert_eq!(f.receive(b, 0).map(|p| p.bytes), Some(sealed.clone()));
    // A capture seals before it records.
    let dir = std::env::temp_dir().join(format!("owed-crc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    f.set_capture(Some(Capture::create(&dir.join("c.pcapng")).unwrap()));
    send(&mut f);
    let (p, still_owed) = f.receive_owed(b, 0).unwrap();
    assert!(!still_owed);
    assert_eq!(p.bytes, sealed);
    f.set_capture(None);
    let _ = std::fs::remove_dir_all(&dir);
    // A corrupting fault seals first: the receiver's check fails.
    f.faults
        .rules
        .push(FaultRule::new(FaultKind::Corrupt).every(1));
    send(&mut f);
    let (p, still_owed) = f.receive_owed(b, 0).unwrap();
    assert!(!still_owed, "a corrupted packet is never taken on trust");
    assert!(packet::check_crcs(&p.bytes).is_err());
}

/// What an HCA reads without the lock (`Activity`): it skips the
/// fabric only while nothing is queued, scheduled or owed, and sees
/// every change of cabling or enables as a new link epoch.
#[test]
fn quiet_fabric_is_published_and_every_piece_of_work_ends_it() {
    let mut f = Fabric::new();
    let act = f.activity();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let (a, b) = (built.hcas[0].ports[0], built.hcas[1].ports[0]);
    let e0 = act.links();
    f.set_enabled(a, true).unwrap();
    f.set_enabled(b, true).unwrap();
    assert!(act.links() > e0, "enables move the epoch");
    assert!(act.busy(), "the switch ports' links changed: traps owed");
    f.advance(0);
    assert!(!act.busy(), "nothing queued, scheduled or owed");
    let sw = built.switches[0].1;
    f.switch_mut(sw).unwrap().configure(0x10, &[(1, 1), (2, 2)]);
    f.latency_ns = 100;
    let mut h =
        crate::fabric::packet::Headers::for_opcode(crate::fabric::packet::opcode::SEND_ONLY)
            .unwrap();
    h.lrh.slid = 1;
    h.lrh.dlid = 2;
    let bytes = crate::fabric::packet::build(&h, &[7; 8]).unwrap();
    assert!(f.transmit(a, Packet { bytes }, 0));
    assert!(act.busy(), "a packet on the wire");
    assert_eq!(f.receive(b, 150), None, "at the switch, not yet at b");
    assert!(act.busy(), "forwarded, due at b at 200: {:?}", f.stats());
    assert_eq!(f.receive(b, 200).and_then(|p| p.dlid()), Some(2));
    assert!(!act.busy(), "delivered: quiet again");
    f.schedule_unplug(a, 1000, Some(2000)).unwrap();
    assert!(act.busy(), "a cable change scheduled");
    let e1 = act.links();
    f.advance(1000);
    assert!(act.links() > e1, "the pull moves the epoch");
    assert!(act.busy(), "the reinsertion is still scheduled");
    f.advance(2000);
    f.advance(2000);
    assert!(f.link_up(a));
    assert!(!act.busy(), "reinserted, traps sent: quiet");
    f.add_sm(crate::fabric::sm::SmConfig::default());
    assert!(act.busy(), "an embedded SM has timers");
}

#[test]
fn packets_cross_the_cable_in_order_and_not_on_a_dead_link() {
    let mut f = Fabric::new();
    let a = f.attach_hca_port(1, 1);
    let b = f.attach_hca_port(2, 1);
    f.connect(a, b).unwrap();
    assert!(!f.transmit(a, pkt(1), 0), "link down: dropped");
    f.set_enabled(a, true).unwrap();
    f.set_enabled(b, true).unwrap();
    f.latency_ns = 100;
    assert!(f.transmit(a, pkt(7), 0));
    assert!(f.transmit(a, pkt(8), 0));
    assert_eq!(f.receive(b, 99), None, "not due yet");
    assert_eq!(f.next_due(), Some(100));
    assert_eq!(f.receive(b, 100).and_then(|p| p.dlid()), Some(7));
    assert_eq!(f.receive(b, 100).and_then(|p| p.dlid()), Some(8));
    assert_eq!(f.receive(a, 100), None);
    f.transmit(b, pkt(9), 200);
    f.unplug(a).unwrap();
    assert_eq!(f.receive(a, 1000), None, "lost with the cable");
    assert!(!f.link_up(b));
}
