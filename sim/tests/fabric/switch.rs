//! The switch: its SMA through directed-route SMPs, LFT routing set up by
//! SMPs, unknown DLIDs, the PMA counters, port states.

use crate::common::{Net, data_packet, port_counters};
use sim::fabric::packet::{self, Smp, attr, mad_status, method, opcode};

#[test]
fn dr_nodeinfo_one_hop_answered_by_the_switch_sma() {
    let mut n = Net::star(3);
    // From node 2, which sits on switch port 3.
    let r = n.dr(2, &[1], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    assert_eq!(r.hdr.status & 0x7fff, 0);
    assert_eq!(
        (r.hop_cnt, r.hop_ptr),
        (1, 1),
        "hop pointer back at 1 on arrival"
    );
    assert_eq!(
        r.return_path[1], 3,
        "return path: the switch port it came in on"
    );
    let d = r.data;
    assert_eq!(
        &d[0..4],
        &[1, 1, 2, 36],
        "versions, NodeType switch, 36 ports"
    );
    assert_eq!(
        &d[12..20],
        &sim::fabric::topology::switch_guid(0).to_be_bytes()
    );
    assert_eq!(&d[30..32], &[0xc7, 0x38], "DeviceID SwitchX");
    assert_eq!(
        &d[36..40],
        &[3, 0x00, 0x02, 0xc9],
        "LocalPortNum 3, VendorID"
    );
    let desc = n.dr(2, &[1], method::GET, attr::NODE_DESC, 0, &[0; 64]);
    assert!(desc.data.starts_with(b"sw0"));
}

#[test]
fn dr_smp_two_hops_forwarded_and_returned_by_the_spec() {
    let mut n = Net::star(2);
    let (p0, p1) = (n.port(0), n.port(1));
    // SM on node 0 asks node 1 (switch port 2) for NodeInfo.
    let (tid, bytes) = n.dr_packet(&[1, 2], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    assert!(n.send(p0, bytes));
    let got = n.drain(p1);
    assert_eq!(got.len(), 1, "forwarded to node 1");
    let parsed = packet::parse_checked(&got[0].bytes).expect("switch resealed the CRCs");
    let mut smp = Smp::parse(parsed.payload(&got[0].bytes)).unwrap();
    assert_eq!(
        (smp.hop_ptr, smp.hop_cnt, smp.direction),
        (2, 2, false),
        "C14-9:2 moved the pointer"
    );
    assert_eq!(smp.return_path[1], 1, "switch wrote its ingress port");
    // Node 1 answers as an HCA's SMA does (C14-9:3 then C14-13:1).
    smp.return_path[2] = 1;
    smp.direction = true;
    smp.hdr.method = method::GET_RESP;
    smp.hop_ptr = 2;
    smp.data[2] = 1; // NodeType CA
    let h = packet::mad_headers(0xffff, 0xffff, 0, 0, 0xffff);
    assert!(n.send(p1, packet::build(&h, &smp.to_bytes()).unwrap()));
    let back = n.drain(p0);
    assert_eq!(back.len(), 1, "returned along the return path");
    let r = Smp::parse(
        packet::parse_checked(&back[0].bytes)
            .unwrap()
            .payload(&back[0].bytes),
    )
    .unwrap();
    assert_eq!(
        (r.hdr.tid, r.hop_ptr, r.direction, r.data[2]),
        (tid, 1, true, 1),
        "C14-13:2"
    );
}

#[test]
fn dr_smp_with_a_bad_path_is_dropped_and_counted() {
    let mut n = Net::star(2);
    let p0 = n.port(0);
    // Port 40 does not exist on a 36-port switch.
    let (_, bytes) = n.dr_packet(&[1, 40], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    assert!(n.send(p0, bytes));
    assert!(n.drain(p0).is_empty());
    assert_eq!(n.f.switch(n.sw).unwrap().counters(1).vl15_dropped, 1);
    // Hop pointer 0 on the wire (the sender did not do C14-9:1).
    let (_, mut bytes) = n.dr_packet(&[1], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    bytes[8 + 12 + 8 + 6] = 0;
    packet::reseal(&mut bytes).unwrap();
    assert!(n.send(p0, bytes));
    assert!(n.drain(p0).is_empty());
    assert_eq!(n.f.switch(n.sw).unwrap().counters(1).vl15_dropped, 2);
    // An SMP on VL 0 is malformed.
    let (_, mut bytes) = n.dr_packet(&[1], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    bytes[0] &= 0x0f;
    packet::reseal(&mut bytes).unwrap();
    assert!(n.send(p0, bytes));
    assert!(n.drain(p0).is_empty());
    assert_eq!(n.f.switch(n.sw).unwrap().counters(1).rcv_errors, 1);
}

#[test]
fn sma_refuses_what_a_switch_refuses() {
    let mut n = Net::star(1);
    let r = n.dr(0, &[1], method::GET, attr::PORT_INFO, 37, &[0; 64]);
    assert_eq!(r.hdr.status, mad_status::INVALID_FIELD, "no port 37");
    let r = n.dr(
        0,
        &[1],
        method::GET,
        attr::LINEAR_FORWARDING_TABLE,
        768,
        &[0; 64],
    );
    assert_eq!(
        r.hdr.status,
        mad_status::INVALID_FIELD,
        "LFT block beyond LinearFDBCap"
    );
    let r = n.dr(0, &[1], method::GET, 0x0099, 0, &[0; 64]);
    assert_eq!(r.hdr.status, mad_status::ATTR_UNSUPPORTED);
    let r = n.dr(0, &[1], 0x05, attr::NODE_INFO, 0, &[0; 64]);
    assert_eq!(r.hdr.status, mad_status::METHOD_UNSUPPORTED);
    // Active straight from Init is an invalid transition.
    let r = n.set_switch_port_info(1, |d| d[32] |= 4);
    assert_eq!(r.hdr.status, mad_status::INVALID_FIELD);
    assert_eq!(r.data[32] & 0xf, 2, "still Init");
    let pk = n.dr(0, &[1], method::GET, attr::PKEY_TABLE, 0, &[0; 64]);
    assert_eq!(
        &pk.data[0..4],
        &[0xff, 0xff, 0, 0],
        "P_Key table: full default member"
    );
}

#[test]
fn port_info_reports_link_state_of_every_port() {
    let mut n = Net::star(3);
    let r = n.dr(0, &[1], method::GET, attr::PORT_INFO, 2, &[0; 64]);
    assert_eq!(
        (r.data[32] & 0xf, r.data[33] >> 4),
        (2, 5),
        "cabled port: Init, LinkUp"
    );
    let r = n.dr(0, &[1], method::GET, attr::PORT_INFO, 4, &[0; 64]);
    assert_eq!(
        (r.data[32] & 0xf, r.data[33] >> 4),
        (1, 2),
        "empty port: Down, Polling"
    );
    assert_eq!(r.data[28], 1, "LocalPortNum: the port the SMP came in on");
    // Node 1 closes its port: the switch port goes Down and says so in
    // SwitchInfo.PortStateChange.
    let p1 = n.port(1);
    n.f.set_enabled(p1, false).unwrap();
    let r = n.dr(0, &[1], method::GET, attr::PORT_INFO, 2, &[0; 64]);
    assert_eq!(r.data[32] & 0xf, 1);
    let si = n.dr(0, &[1], method::GET, attr::SWITCH_INFO, 0, &[0; 64]);
    assert_eq!(si.data[11] & 4, 4, "PortStateChange");
    let mut d = si.data;
    d[11] |= 4;
    let si = n.dr(0, &[1], method::SET, attr::SWITCH_INFO, 0, &d);
    assert_eq!(si.data[11] & 4, 0, "cleared by writing 1");
    // Disabling a port by PortPhysicalState takes the link down.
    let p2 = n.port(2);
    let g = n.f.link_generation(p2);
    let r = n.set_switch_port_info(3, |d| d[33] |= 3 << 4);
    assert_eq!(r.data[33] >> 4, 3, "Disabled");
    assert!(!n.f.link_up(p2));
    assert_eq!(n.f.link_generation(p2), g + 1);
    let r = n.set_switch_port_info(3, |d| d[33] |= 2 << 4);
    assert_eq!(r.data[33] >> 4, 2, "enabled again: Polling");
    assert!(n.f.link_up(p2));
    let r = n.dr(0, &[1], method::GET, attr::PORT_INFO, 3, &[0; 64]);
    assert_eq!(
        (r.data[32] & 0xf, r.data[33] >> 4),
        (2, 5),
        "trained: Init, LinkUp"
    );
}

#[test]
fn lft_set_by_smps_then_lid_routing() {
    let mut n = Net::star(3);
    let (p0, p1, p2) = (n.port(0), n.port(1), n.port(2));
    // Before the SM: data does not cross (ports Init).
    assert!(n.send(p0, data_packet(1, 2, opcode::SEND_ONLY, 0x40, 0, b"early")));
    assert!(n.drain(p1).is_empty(), "no data through Init ports");
    n.sm_bring_up(3, 10);
    let lft = n.dr(
        0,
        &[1],
        method::GET,
        attr::LINEAR_FORWARDING_TABLE,
        0,
        &[0; 64],
    );
    assert_eq!(&lft.data[0..4], &[0xff, 1, 2, 3]);
    for (from, to, dlid) in [(p0, p1, 2u16), (p1, p0, 1), (p2, p0, 1), (p0, p2, 3)] {
        let bytes = data_packet(0, dlid, opcode::SEND_ONLY, 0x40, 7, b"routed by the LFT");
        assert!(n.send(from, bytes.clone()));
        let got = n.drain(to);
        assert_eq!(got.len(), 1, "to DLID {dlid}");
        assert_eq!(got[0].bytes, bytes, "forwarded unchanged");
        for other in [p0, p1, p2] {
            if other != to {
                assert!(n.drain(other).is_empty());
            }
        }
    }
    // A LID-routed SMP to the switch LID is answered by its SMA.
    let mut smp = Smp::lid_routed(0x77, method::GET, attr::NODE_INFO, 0);
    smp.hdr.tid = 0x77;
    let h = packet::mad_headers(10, 1, 0, 0, 0xffff);
    assert!(n.send(p0, packet::build(&h, &smp.to_bytes()).unwrap()));
    let got = n.drain(p0);
    assert_eq!(got.len(), 1);
    let p = packet::parse_checked(&got[0].bytes).unwrap();
    assert_eq!((p.hdr.lrh.dlid, p.hdr.lrh.slid), (1, 10));
    let r = Smp::parse(p.payload(&got[0].bytes)).unwrap();
    assert_eq!(
        (r.hdr.method, r.data[2], r.data[39]),
        (method::GET_RESP, 2, 0xc9)
    );
}

#[test]
fn unknown_dlid_dropped_and_counted() {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    let (p0, p1) = (n.port(0), n.port(1));
    for dlid in [77u16, 0, 0xc001] {
        assert!(n.send(
            p0,
            data_packet(1, dlid, opcode::SEND_ONLY, 0x40, 0, b"nowhere")
        ));
    }
    assert!(n.drain(p1).is_empty() && n.drain(p0).is_empty());
    let r = n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 1, 0xffff);
    assert_eq!(
        port_counters(&r).relay_errors,
        3,
        "PortRcvSwitchRelayErrors on the ingress port"
    );
    assert_eq!(n.f.stats().switch_drops.get("unknown DLID"), Some(&3));
}

#[test]
fn counters_in_words_and_packets_and_cleared_by_set() {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    let (p0, p1) = (n.port(0), n.port(1));
    let before = port_counters(&n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 2, 0));
    let mut words = 0u32;
    for (i, len) in [0usize, 1, 255, 256, 1000].into_iter().enumerate() {
        let b = data_packet(1, 2, opcode::SEND_ONLY, 0x40, i as u32, &vec![0xab; len]);
        words += ((b.len() - 2) / 4) as u32;
        assert!(n.send(p0, b));
    }
    assert_eq!(n.drain(p1).len(), 5);
    let r = port_counters(&n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 2, 0));
    assert_eq!(
        r.xmit_pkts - before.xmit_pkts,
        5,
        "PortXmitPkts on the egress port"
    );
    assert_eq!(
        r.xmit_data - before.xmit_data,
        words,
        "PortXmitData in words, LRH..ICRC"
    );
    let r1 = port_counters(&n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 1, 0));
    assert!(r1.rcv_pkts >= 5 && r1.rcv_data >= words);
    // Extended counters: 64-bit at their offsets.
    let x = n.pma(0, 10, method::GET, attr::PORT_COUNTERS_EXT, 2, 0);
    let xd = u64::from_be_bytes(x[64 + 8..64 + 16].try_into().unwrap());
    let xp = u64::from_be_bytes(x[64 + 24..64 + 32].try_into().unwrap());
    assert!(xd >= u64::from(words) && xp >= 5);
    // AllPortSelect sums; Set with CounterSelect clears.
    let all = port_counters(&n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 0xff, 0));
    assert!(all.rcv_pkts > r1.rcv_pkts);
    n.pma(0, 10, method::SET, attr::PORT_COUNTERS, 1, 0x1000 | 0x4000);
    let r = port_counters(&n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 1, 0));
    assert_eq!(
        r.xmit_pkts, 1,
        "cleared XmitPkts: only the Set's own response since"
    );
    assert_eq!(r.xmit_data, 72, "and its 288 bytes");
    assert!(r.rcv_pkts >= r1.rcv_pkts, "RcvPkts not selected, kept");
    let bad = n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 40, 0);
    assert_eq!(
        u16::from_be_bytes([bad[4], bad[5]]),
        mad_status::INVALID_FIELD
    );
}

#[test]
fn egress_not_active_is_a_discard() {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    let (p0, p1) = (n.port(0), n.port(1));
    // SM takes switch port 2 back Down: it retrains to Init.
    let r = n.set_switch_port_info(2, |d| d[32] |= 1);
    assert_eq!(r.data[32] & 0xf, 2);
    assert!(n.send(p0, data_packet(1, 2, opcode::SEND_ONLY, 0x40, 0, b"x")));
    assert!(n.drain(p1).is_empty());
    assert_eq!(n.f.switch(n.sw).unwrap().counters(2).xmit_discards, 1);
}

#[test]
fn ingress_in_init_drops_data_but_passes_smps() {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    let (p0, p1) = (n.port(0), n.port(1));
    // Node 1's switch port back to Init; node 1 sends towards node 0,
    // whose port stays Active.
    let r = n.set_switch_port_info(2, |d| d[32] |= 1);
    assert_eq!(r.data[32] & 0xf, 2);
    assert!(n.send(p1, data_packet(2, 1, opcode::SEND_ONLY, 0x40, 0, b"x")));
    assert!(
        n.drain(p0).is_empty(),
        "data does not enter through an Init port"
    );
    assert_eq!(n.f.switch(n.sw).unwrap().counters(1).xmit_discards, 0);
    // SMPs still do.
    let r = n.dr(1, &[1], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    assert_eq!(r.data[36], 2, "LocalPortNum 2");
}

#[test]
fn switch_forwards_by_the_lrh_alone() {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    let (p0, p1) = (n.port(0), n.port(1));
    // An RD opcode the model's HCA would refuse: the switch does not look.
    let mut b = data_packet(1, 2, opcode::SEND_ONLY, 0x40, 0, b"reliable datagram?");
    b[8] = 0x44;
    packet::reseal(&mut b).unwrap();
    assert!(n.send(p0, b.clone()));
    assert_eq!(
        n.drain(p1).into_iter().map(|p| p.bytes).collect::<Vec<_>>(),
        [b]
    );
    // A wrong PktLen is a link error.
    let mut b = data_packet(1, 2, opcode::SEND_ONLY, 0x40, 0, b"x");
    b[5] += 1;
    packet::reseal_vcrc(&mut b).unwrap();
    assert!(n.send(p0, b));
    assert!(n.drain(p1).is_empty());
    assert_eq!(n.f.switch(n.sw).unwrap().counters(1).rcv_errors, 1);
}

#[test]
fn sl2vl_and_vlarb_tables_are_kept() {
    let mut n = Net::star(2);
    let mut d = [0u8; 64];
    d[..8].copy_from_slice(&[0x01, 0x23, 0x45, 0x67, 0, 0, 0, 0]);
    let r = n.dr(0, &[1], method::SET, attr::SL_TO_VL_TABLE, 1 << 8 | 2, &d);
    assert_eq!((r.hdr.status, &r.data[..4]), (0, &d[..4]));
    let r = n.dr(
        0,
        &[1],
        method::GET,
        attr::SL_TO_VL_TABLE,
        1 << 8 | 2,
        &[0; 64],
    );
    assert_eq!(&r.data[..4], &d[..4]);
    let r = n.dr(
        0,
        &[1],
        method::GET,
        attr::SL_TO_VL_TABLE,
        2 << 8 | 1,
        &[0; 64],
    );
    assert_eq!(&r.data[..4], &[0; 4], "another port pair");
    let r = n.dr(
        0,
        &[1],
        method::SET,
        attr::VL_ARB_TABLE,
        1 << 16 | 2,
        &[3; 64],
    );
    assert_eq!((r.hdr.status, r.data), (0, [3; 64]));
    let r = n.dr(
        0,
        &[1],
        method::GET,
        attr::VL_ARB_TABLE,
        5 << 16 | 2,
        &[0; 64],
    );
    assert_eq!(r.hdr.status, mad_status::INVALID_FIELD, "blocks 1-4 only");
}

#[test]
fn data_across_two_switches_of_a_net_file() {
    use sim::fabric::{Fabric, Packet, Topology};
    let text = "\
Switch 8 \"S1\"
[1] \"H1\"[1]
[3] \"S2\"[5]

Switch 8 \"S2\"
[5] \"S1\"[3]
[2] \"H2\"[1]

Hca 2 \"H1\"
[1] \"S1\"[1]

Hca 2 \"H2\"
[1] \"S2\"[2]
";
    let mut f = Fabric::new();
    let b = Topology::from_netfile(text).unwrap().build(&mut f).unwrap();
    let (h1, h2) = (b.hca_port(0, 1).unwrap(), b.hca_port(1, 1).unwrap());
    f.set_enabled(h1, true).unwrap();
    f.set_enabled(h2, true).unwrap();
    let (s1, s2) = (b.switches[0].1, b.switches[1].1);
    f.switch_mut(s1).unwrap().configure(3, &[(1, 1), (2, 3)]);
    f.switch_mut(s2).unwrap().configure(4, &[(1, 5), (2, 2)]);
    let bytes = data_packet(1, 2, opcode::RDMA_WRITE_ONLY, 0x40, 9, &[9; 100]);
    assert!(f.transmit(
        h1,
        Packet {
            bytes: bytes.clone()
        },
        0
    ));
    f.advance(10);
    assert_eq!(f.receive(h2, 10).map(|p| p.bytes), Some(bytes));
    let back = data_packet(2, 1, opcode::ACKNOWLEDGE, 0x41, 9, &[]);
    assert!(f.transmit(
        h2,
        Packet {
            bytes: back.clone()
        },
        20
    ));
    assert_eq!(f.receive(h1, 30).map(|p| p.bytes), Some(back));
    assert_eq!(f.switch(s1).unwrap().counters(3).xmit_pkts, 1);
    assert_eq!(f.switch(s2).unwrap().counters(5).rcv_pkts, 1);
}

#[test]
fn m_key_protects_the_switch_sma() {
    let mut n = Net::star(1);
    let p0 = n.port(0);
    let r = n.set_switch_port_info(0, |d| {
        d[0..8].copy_from_slice(&0x1234u64.to_be_bytes());
        d[34] |= 2 << 6; // protect bits 2: Gets need the key too
    });
    assert_eq!(r.hdr.status, 0);
    // Without the key: silently dropped.
    let (_, bytes) = n.dr_packet(&[1], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    assert!(n.send(p0, bytes));
    assert!(n.drain(p0).is_empty(), "no answer without the M_Key");
    // With it: answered.
    let (_, bytes) = n.dr_packet(&[1], method::GET, attr::PORT_INFO, 0, &[0; 64]);
    let mut b = bytes;
    let mad = 8 + 12 + 8;
    b[mad + 24..mad + 32].copy_from_slice(&0x1234u64.to_be_bytes());
    packet::reseal(&mut b).unwrap();
    assert!(n.send(p0, b));
    let got = n.drain(p0);
    assert_eq!(got.len(), 1);
    let r = Smp::parse(
        packet::parse_checked(&got[0].bytes)
            .unwrap()
            .payload(&got[0].bytes),
    )
    .unwrap();
    assert_eq!(
        u16::from_be_bytes([r.data[44], r.data[45]]),
        1,
        "M_KeyViolations counted"
    );
}

/// IBTA 14.2.4.1, protection level 1: a Get without the key succeeds and
/// PortInfo's M_Key field reads 0; with the key it shows the key; a Set
/// without it is refused as at level 2.
#[test]
fn m_key_level_1_hides_the_key_from_a_get_without_it() {
    let mut n = Net::star(1);
    let p0 = n.port(0);
    let r = n.set_switch_port_info(0, |d| {
        d[0..8].copy_from_slice(&0x1234u64.to_be_bytes());
        d[34] = (d[34] & 0x3f) | 1 << 6; // protect bits 1
    });
    assert_eq!(r.hdr.status, 0);
    for port in [0u32, 1] {
        let r = n.dr(0, &[1], method::GET, attr::PORT_INFO, port, &[0; 64]);
        assert_eq!(r.hdr.status & 0x7fff, 0, "port {port}: answered");
        assert_eq!(&r.data[0..8], &[0; 8], "port {port}: M_Key field 0");
        assert_eq!(r.data[34] >> 6, 1, "protect bits shown");
    }
    let with_key = |n: &mut Net, meth: u8, data: &[u8; 64]| -> Vec<sim::fabric::Packet> {
        let (_, mut b) = n.dr_packet(&[1], meth, attr::PORT_INFO, 0, data);
        let mad = 8 + 12 + 8;
        b[mad + 24..mad + 32].copy_from_slice(&0x1234u64.to_be_bytes());
        packet::reseal(&mut b).unwrap();
        assert!(n.send(p0, b));
        n.drain(p0)
    };
    let got = with_key(&mut n, method::GET, &[0; 64]);
    assert_eq!(got.len(), 1);
    let r = Smp::parse(
        packet::parse_checked(&got[0].bytes)
            .unwrap()
            .payload(&got[0].bytes),
    )
    .unwrap();
    assert_eq!(
        &r.data[0..8],
        &0x1234u64.to_be_bytes(),
        "the key, to its holder"
    );
    // A Set without the key: dropped and counted.
    let mut d = r.data;
    d[32] &= 0xf0;
    d[33] &= 0x0f;
    let (_, b) = n.dr_packet(&[1], method::SET, attr::PORT_INFO, 0, &d);
    assert!(n.send(p0, b));
    assert!(n.drain(p0).is_empty(), "no answer to a Set without the key");
    let r = n.dr(0, &[1], method::GET, attr::PORT_INFO, 0, &[0; 64]);
    assert_eq!(
        u16::from_be_bytes([r.data[44], r.data[45]]),
        1,
        "M_KeyViolations"
    );
}

/// SwitchInfo MulticastFDBCap and a MulticastForwardingTable the SM sets
/// and reads back; a packet to an MLID goes out of every Active port of
/// its port mask but the one it came in on; an MLID without an entry, or
/// above MulticastFDBTop, is dropped and counted as an unknown DLID.
#[test]
fn multicast_is_replicated_by_the_mft() {
    let mut n = Net::star(4);
    n.sm_bring_up(4, 10);
    let si = n.dr(0, &[1], method::GET, attr::SWITCH_INFO, 0, &[0; 64]);
    assert_eq!(&si.data[4..6], &1024u16.to_be_bytes(), "MulticastFDBCap");
    // MLID 0xc001: ports 1, 2 and 4 (block 0, position 0: ports 0-15).
    let mut block = [0u8; 64];
    block[2..4].copy_from_slice(&0b1_0110u16.to_be_bytes());
    let r = n.dr(
        0,
        &[1],
        method::SET,
        attr::MULTICAST_FORWARDING_TABLE,
        0,
        &block,
    );
    assert_eq!((r.hdr.status, r.data), (0, block), "set and read back");
    let r = n.dr(
        0,
        &[1],
        method::GET,
        attr::MULTICAST_FORWARDING_TABLE,
        0,
        &[0; 64],
    );
    assert_eq!(r.data, block);
    // Position 3 (ports 48-63) does not exist on a 36-port switch.
    let r = n.dr(
        0,
        &[1],
        method::GET,
        attr::MULTICAST_FORWARDING_TABLE,
        3 << 28,
        &[0; 64],
    );
    assert_eq!(r.hdr.status & 0x7fff, mad_status::INVALID_FIELD);
    assert_eq!(n.f.switch(n.sw).unwrap().mft_ports(0xc001), vec![1, 2, 4]);

    let ports: Vec<_> = (0..4).map(|i| n.port(i)).collect();
    let ud = |dlid| data_packet(1, dlid, opcode::UD_SEND_ONLY, 0xffffff, 0, b"mcast");
    assert!(n.send(ports[0], ud(0xc001)));
    let got: Vec<usize> = (0..4).map(|i| n.drain(ports[i]).len()).collect();
    assert_eq!(
        got,
        vec![0, 1, 0, 1],
        "to ports 2 and 4, not back to 1, not 3"
    );
    // From node 3 (port 4): to ports 1 and 2.
    assert!(n.send(ports[3], ud(0xc001)));
    let got: Vec<usize> = (0..4).map(|i| n.drain(ports[i]).len()).collect();
    assert_eq!(got, vec![1, 1, 0, 0]);
    // No entry: dropped, PortRcvSwitchRelayErrors on the ingress port.
    let before =
        n.f.switch(n.sw)
            .unwrap()
            .counters(1)
            .rcv_switch_relay_errors;
    assert!(n.send(ports[0], ud(0xc002)));
    let got: Vec<usize> = (0..4).map(|i| n.drain(ports[i]).len()).collect();
    assert_eq!(got, vec![0; 4]);
    let sw = n.f.switch(n.sw).unwrap();
    assert_eq!(sw.counters(1).rcv_switch_relay_errors, before + 1);
    // MulticastFDBTop below the MLID: outside the table.
    let mut si = n
        .dr(0, &[1], method::GET, attr::SWITCH_INFO, 0, &[0; 64])
        .data;
    si[18..20].copy_from_slice(&0xc000u16.to_be_bytes());
    let r = n.dr(0, &[1], method::SET, attr::SWITCH_INFO, 0, &si);
    assert_eq!(&r.data[18..20], &[0xc0, 0x00], "MulticastFDBTop");
    assert!(n.send(ports[0], ud(0xc001)));
    let got: Vec<usize> = (0..4).map(|i| n.drain(ports[i]).len()).collect();
    assert_eq!(got, vec![0; 4], "above MulticastFDBTop");
    si[18..20].copy_from_slice(&0xc3ffu16.to_be_bytes());
    n.dr(0, &[1], method::SET, attr::SWITCH_INFO, 0, &si);
    // An egress port not Active: that copy is a discard, the others go.
    let r = n.set_switch_port_info(2, |d| d[32] |= 1);
    assert_eq!(r.data[32] & 0xf, 2, "port 2 back to Init");
    assert!(n.send(ports[0], ud(0xc001)));
    let got: Vec<usize> = (0..4).map(|i| n.drain(ports[i]).len()).collect();
    assert_eq!(got, vec![0, 0, 0, 1]);
    assert_eq!(n.f.switch(n.sw).unwrap().counters(2).xmit_discards, 1);
}

/// Partition enforcement as an SM turns it on (PortInfo byte 43 and the
/// port's P_Key table, PartitionEnforcementCap entries): a packet whose
/// P_Key is not in the ingress port's table is dropped
/// (PortRcvConstraintErrors), one not in the egress port's table too
/// (PortXmitConstraintErrors); membership types are not compared.
#[test]
fn partition_enforcement_on_switch_ports() {
    let mut n = Net::star(2);
    n.sm_bring_up(2, 10);
    let si = n.dr(0, &[1], method::GET, attr::SWITCH_INFO, 0, &[0; 64]);
    assert_eq!(
        &si.data[14..16],
        &64u16.to_be_bytes(),
        "PartitionEnforcementCap"
    );
    let (p0, p1) = (n.port(0), n.port(1));
    let with_pkey = |pkey: u16| {
        let mut h = packet::Headers::for_opcode(opcode::SEND_ONLY).unwrap();
        h.lrh.dlid = 2;
        h.lrh.slid = 1;
        h.bth.pkey = pkey;
        h.bth.dest_qp = 0x40;
        packet::build(&h, b"p").unwrap()
    };
    // Port 1: table {0xffff, 0x8001 (full)}; port 2: {0xffff, 0x0001
    // (limited)}; enforcement both ways on both.
    for (port, key) in [(1u8, 0x8001u16), (2, 0x0001)] {
        let mut t = [0u8; 64];
        t[0..2].copy_from_slice(&0xffffu16.to_be_bytes());
        t[2..4].copy_from_slice(&key.to_be_bytes());
        let m = u32::from(port) << 16;
        let r = n.dr(0, &[1], method::SET, attr::PKEY_TABLE, m, &t);
        assert_eq!((r.hdr.status, r.data), (0, t), "port {port}'s table");
        let r = n.dr(0, &[1], method::GET, attr::PKEY_TABLE, m | 1, &[0; 64]);
        assert_eq!(r.hdr.status, 0, "block 1 of 2");
        let r = n.dr(0, &[1], method::GET, attr::PKEY_TABLE, m | 2, &[0; 64]);
        assert_eq!(
            r.hdr.status & 0x7fff,
            mad_status::INVALID_FIELD,
            "no block 2"
        );
        let r = n.set_switch_port_info(port, |d| d[43] = (d[43] & 0xf0) | 0x0c);
        assert_eq!(r.data[43] & 0x0f, 0x0c, "enforcement in and out");
    }
    // In the partition on both ports (either membership): through.
    for k in [0x8001u16, 0x0001, 0xffff] {
        assert!(n.send(p0, with_pkey(k)));
        assert_eq!(n.drain(p1).len(), 1, "P_Key {k:#x}");
    }
    // Not in port 1's table: refused at ingress.
    assert!(n.send(p0, with_pkey(0x8002)));
    assert!(n.drain(p1).is_empty());
    let sw = n.f.switch(n.sw).unwrap();
    assert_eq!(sw.counters(1).rcv_constraint_errors, 1);
    // In port 1's table, not in port 2's: refused at egress.
    let mut t = [0u8; 64];
    t[0..2].copy_from_slice(&0xffffu16.to_be_bytes());
    t[2..4].copy_from_slice(&0x8003u16.to_be_bytes());
    n.dr(0, &[1], method::SET, attr::PKEY_TABLE, 1 << 16, &t);
    assert!(n.send(p0, with_pkey(0x8003)));
    assert!(n.drain(p1).is_empty());
    let sw = n.f.switch(n.sw).unwrap();
    assert_eq!(sw.counters(2).xmit_constraint_errors, 1);
    // The PMA reports both (PortCounters bytes 16 and 17).
    let r = n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 2, 0xffff);
    assert_eq!(r[64 + 16], 1, "PortXmitConstraintErrors of port 2");
    let r = n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 1, 0xffff);
    assert_eq!(r[64 + 17], 1, "PortRcvConstraintErrors of port 1");
    // Enforcement off: everything passes again.
    n.set_switch_port_info(1, |d| d[43] &= 0xf0);
    n.set_switch_port_info(2, |d| d[43] &= 0xf0);
    assert!(n.send(p0, with_pkey(0x8002)));
    assert_eq!(n.drain(p1).len(), 1);
}

/// Port 0 of a base switch: Initialize until the SM gives the switch its
/// LID, Active after, with ibsim's CapabilityMask; external ports report
/// none. GUIDInfo block 0 holds the node GUID.
#[test]
fn port_0_becomes_active_with_its_lid() {
    let mut n = Net::star(1);
    let r = n.dr(0, &[1], method::GET, attr::PORT_INFO, 0, &[0; 64]);
    assert_eq!(r.data[32] & 0xf, 2, "Initialize before the SM");
    assert_eq!(&r.data[20..24], &0xc048u32.to_be_bytes(), "CapabilityMask");
    let r = n.set_switch_port_info(0, |d| d[16..18].copy_from_slice(&7u16.to_be_bytes()));
    assert_eq!(
        (r.hdr.status, r.data[32] & 0xf),
        (0, 4),
        "Active with LID 7"
    );
    let r = n.dr(0, &[1], method::GET, attr::PORT_INFO, 1, &[0; 64]);
    assert_eq!(
        &r.data[20..24],
        &[0; 4],
        "external ports: no CapabilityMask"
    );
    let r = n.dr(0, &[1], method::GET, attr::GUID_INFO, 0, &[0; 64]);
    assert_eq!(
        &r.data[0..8],
        &sim::fabric::topology::switch_guid(0).to_be_bytes()
    );
    assert_eq!(&r.data[8..], &[0; 56]);
    // Mellanox ExtendedPortInfo of a port (none of FDR10).
    let r = n.dr(0, &[1], method::GET, attr::MLNX_EXT_PORT_INFO, 1, &[0; 64]);
    assert_eq!(r.hdr.status, 0);
    assert_eq!(r.data, [0; 64]);
    let r = n.dr(0, &[1], method::GET, attr::MLNX_EXT_PORT_INFO, 37, &[0; 64]);
    assert_eq!(
        r.hdr.status & 0x7fff,
        mad_status::INVALID_FIELD,
        "no port 37"
    );
}

/// 4x FDR as link training gives it: an external port supports and
/// enables FDR (PortInfo's extended speeds, as an SX6036's) and runs it
/// while its link is up and the far end would train to FDR too; the SM
/// narrows it with SMSupportsExtendedSpeeds (modifier bit 31), and the far
/// end reads what the switch port would now train to.
#[test]
fn external_ports_run_fdr_when_both_ends_have_it() {
    let mut n = Net::star(2);
    let get = |n: &mut Net, port: u32| {
        n.dr(0, &[1], method::GET, attr::PORT_INFO, port, &[0; 64])
            .data
    };
    // Node 1 (switch port 2) has published no extended speeds: QDR.
    let d = get(&mut n, 2);
    assert_eq!(
        (d[62], d[63] & 0x1f),
        (0x01, 0x01),
        "FDR supported and enabled, none active"
    );
    assert_eq!(d[35] >> 4, 4, "LinkSpeedActive QDR");
    let p1 = n.port(1);
    n.f.set_link_speeds_ext(p1, 0x1).unwrap();
    assert_eq!(get(&mut n, 2)[62], 0x11, "FDR active: both ends have it");
    assert_eq!(n.f.peer_link_speeds_ext(p1), 0x1, "what node 1 reads");
    // Port 0 has no link: its CapabilityMask says the switch has
    // extended speeds, its own fields stay 0.
    let d = get(&mut n, 0);
    assert_eq!(&d[20..24], &0xc048u32.to_be_bytes());
    assert_eq!(&d[62..64], &[0, 0]);
    // A port without a cable: none active.
    assert_eq!(get(&mut n, 5)[62], 0x01);
    // The SM turns FDR off on port 2 (LinkSpeedExtEnabled 30 with bit
    // 31), then tries to turn it on without bit 31 (ignored), then with.
    let set = |n: &mut Net, v: u8, ext: bool| {
        let mut d = get(n, 2);
        d[32] &= 0xf0;
        d[33] &= 0x0f;
        d[63] = v;
        let m = 2 | if ext { 0x8000_0000 } else { 0 };
        let r = n.dr(0, &[1], method::SET, attr::PORT_INFO, m, &d);
        assert_eq!(r.hdr.status & 0x7fff, 0);
        r.data
    };
    let d = set(&mut n, 30, true);
    assert_eq!((d[62], d[63] & 0x1f), (0x01, 0), "FDR off: QDR");
    assert_eq!(n.f.peer_link_speeds_ext(p1), 0, "node 1 reads it");
    assert_eq!(set(&mut n, 31, false)[63] & 0x1f, 0, "no bit 31: unchanged");
    let d = set(&mut n, 31, true);
    assert_eq!((d[62], d[63] & 0x1f), (0x11, 0x01), "all supported: FDR");
    assert_eq!(n.f.peer_link_speeds_ext(p1), 0x1);
    // The link goes down: nothing active; the cable pulled: nothing at
    // the far end either.
    n.f.set_enabled(p1, false).unwrap();
    assert_eq!(get(&mut n, 2)[62], 0x01);
    n.f.unplug(p1).unwrap();
    assert_eq!(n.f.peer_link_speeds_ext(p1), 0);
}
