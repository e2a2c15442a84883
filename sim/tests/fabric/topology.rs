//! Topologies built onto a fabric.

use sim::fabric::{Fabric, Owner, Topology};

#[test]
fn nodes_n_cables_port_1_of_each_hca_to_the_switch() {
    let mut f = Fabric::new();
    let b = Topology::for_nodes(4).unwrap().build(&mut f).unwrap();
    let sw = b.switches[0].1;
    for (i, h) in b.hcas.iter().enumerate() {
        let peer = f.peer(h.ports[0]).unwrap();
        assert_eq!(
            f.owner(peer),
            Some(Owner::Switch {
                switch: sw,
                port: i as u8 + 1
            })
        );
        assert_eq!(f.peer(h.ports[1]), None, "port 2 uncabled");
        assert_eq!(
            f.owner(h.ports[0]),
            Some(Owner::Hca {
                node_guid: h.node_guid,
                port: 1
            })
        );
    }
    let mut g = Fabric::new();
    let b2 = Topology::for_nodes(4).unwrap().build(&mut g).unwrap();
    assert_eq!(b, b2, "same GUIDs and ports from run to run");
}

#[test]
fn netfile_with_two_switches_builds() {
    let text = "\
Switch 8 \"S1\"
[1] \"H1\"[1]
[3] \"S2\"[3]

Switch 8 \"S2\"
[3] \"S1\"[3]
[1] \"H2\"[2]

Hca 2 \"H1\"
[1] \"S1\"[1]

Hca 2 \"H2\"
[2] \"S2\"[1]
";
    let t = Topology::from_netfile(text).unwrap();
    let mut f = Fabric::new();
    let b = t.build(&mut f).unwrap();
    assert_eq!(b.hcas.len(), 2);
    let h2p2 = b.hca_port(1, 2).unwrap();
    let peer = f.peer(h2p2).unwrap();
    assert_eq!(
        f.owner(peer),
        Some(Owner::Switch {
            switch: b.switches[1].1,
            port: 1
        })
    );
    assert_eq!(f.peer(b.hca_port(1, 1).unwrap()), None);
    let s1p3 = f.switch_port(b.switches[0].1, 3).unwrap();
    assert_eq!(f.peer(s1p3), f.switch_port(b.switches[1].1, 3));
}

#[test]
fn a_fabric_can_be_shared_between_threads() {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<sim::fabric::SharedFabric>();
    let shared = Fabric::shared();
    let b = Topology::back_to_back()
        .build(&mut shared.lock().unwrap())
        .unwrap();
    let (a, c) = (b.hca_port(0, 1).unwrap(), b.hca_port(1, 1).unwrap());
    let s = shared.clone();
    std::thread::spawn(move || s.lock().unwrap().set_enabled(c, true).unwrap())
        .join()
        .unwrap();
    let mut f = shared.lock().unwrap();
    f.set_enabled(a, true).unwrap();
    assert!(f.link_up(a));
}

#[test]
fn directed_route_across_two_switches() {
    use sim::fabric::packet::{self, Smp, attr, method};
    let text = "\
Switch 8 \"S1\"
[1] \"H1\"[1]
[3] \"S2\"[5]

Switch 8 \"S2\"
[5] \"S1\"[3]

Hca 2 \"H1\"
[1] \"S1\"[1]
";
    let mut f = Fabric::new();
    let b = Topology::from_netfile(text).unwrap().build(&mut f).unwrap();
    let h = b.hca_port(0, 1).unwrap();
    f.set_enabled(h, true).unwrap();
    // H1 port 1 -> S1, out of S1 port 3 -> S2 (arrives on its port 5).
    let mut smp = Smp::dr_get(0x42, attr::NODE_INFO, 0, &[1, 3]).unwrap();
    smp.hop_ptr = 1;
    let hdr = packet::mad_headers(0xffff, 0xffff, 0, 0, 0xffff);
    assert!(f.transmit(
        h,
        sim::fabric::Packet {
            bytes: packet::build(&hdr, &smp.to_bytes()).unwrap()
        },
        0
    ));
    for t in 0..4 {
        f.advance(t);
    }
    let got = f.receive(h, 4).expect("the answer came back over two hops");
    let r = Smp::parse(
        packet::parse_checked(&got.bytes)
            .unwrap()
            .payload(&got.bytes),
    )
    .unwrap();
    assert_eq!(
        (r.hdr.method, r.direction, r.hop_ptr),
        (method::GET_RESP, true, 1)
    );
    assert_eq!(&r.return_path[1..3], &[1, 5], "ingress ports of S1 and S2");
    assert_eq!(
        &r.data[12..20],
        &sim::fabric::topology::switch_guid(1).to_be_bytes(),
        "S2 answered"
    );
    assert_eq!(r.data[36], 5, "LocalPortNum at S2");
}

#[test]
fn min_hop_routing_across_a_ring_of_switches() {
    use sim::fabric::Packet;
    use sim::fabric::packet::{self, Headers, opcode};
    // Three switches in a ring, an HCA on each.
    let text = "\
Switch 8 \"A\"
[1] \"H0\"[1]
[2] \"B\"[3]
[3] \"C\"[2]

Switch 8 \"B\"
[1] \"H1\"[1]
[3] \"A\"[2]
[2] \"C\"[3]

Switch 8 \"C\"
[1] \"H2\"[1]
[2] \"A\"[3]
[3] \"B\"[2]

Hca 1 \"H0\"
[1] \"A\"[1]
Hca 1 \"H1\"
[1] \"B\"[1]
Hca 1 \"H2\"
[1] \"C\"[1]
";
    let mut f = Fabric::new();
    let b = Topology::from_netfile(text).unwrap().build(&mut f).unwrap();
    let ports: Vec<_> = (0..3).map(|i| b.hca_port(i, 1).unwrap()).collect();
    for p in &ports {
        f.set_enabled(*p, true).unwrap();
    }
    let lids: Vec<_> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, i as u16 + 1))
        .collect();
    let sw = f.route_min_hop(&lids, 100).unwrap();
    assert_eq!(sw, [100, 101, 102]);
    // One hop between any two switches: A sends LID 2 (H1, on B) to port 2.
    assert_eq!(f.switch(b.switches[0].1).unwrap().lft(2), 2);
    assert_eq!(
        f.switch(b.switches[0].1).unwrap().lft(101),
        2,
        "to switch B"
    );
    assert_eq!(f.switch(b.switches[1].1).unwrap().lft(101), 0, "B itself");
    for (from, to) in [(0usize, 1usize), (1, 2), (2, 0), (0, 2)] {
        let mut h = Headers::for_opcode(opcode::SEND_ONLY).unwrap();
        h.lrh.slid = from as u16 + 1;
        h.lrh.dlid = to as u16 + 1;
        let bytes = packet::build(&h, b"ring").unwrap();
        assert!(f.transmit(
            ports[from],
            Packet {
                bytes: bytes.clone()
            },
            0
        ));
        f.advance(1);
        assert_eq!(
            f.receive(ports[to], 1).map(|p| p.bytes),
            Some(bytes),
            "{from} -> {to}"
        );
    }
    assert!(
        f.route_min_hop(&[(ports[0], 1), (ports[1], 1)], 100)
            .is_err(),
        "LID twice"
    );
}

#[test]
fn build_with_ports_the_hcas_attached_themselves() {
    let t = Topology::for_nodes(2).unwrap();
    let mut f = Fabric::new();
    // The HCAs came first and attached their ports.
    let mine: Vec<[sim::fabric::PortId; 2]> = t
        .hcas()
        .map(|h| {
            [
                f.attach_hca_port(h.node_guid, 1),
                f.attach_hca_port(h.node_guid, 2),
            ]
        })
        .collect();
    let b = t
        .build_with(&mut f, |_, i, _, port| Ok(mine[i][usize::from(port) - 1]))
        .unwrap();
    assert_eq!(b.hcas[1].ports, mine[1]);
    assert!(f.peer(mine[1][0]).is_some());
    // A port of the wrong node is refused.
    let mut g = Fabric::new();
    let stray = g.attach_hca_port(0x99, 1);
    let e = t.build_with(&mut g, |_, _, _, _| Ok(stray)).unwrap_err();
    assert!(e.0.contains("is not port"), "{e}");
}
