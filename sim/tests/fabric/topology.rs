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
