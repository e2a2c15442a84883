//! mlx4_core's Ethernet ports against the model: port types (fixed,
//! suggested by the cable, chosen in the profile), SENSE_PORT, the Ethernet
//! SET_PORT flavours, reference-counted MAC and VLAN registration, the RoCE
//! GID table, and which ports each protocol takes.

use std::sync::{Arc, Mutex};

use mlx4_core::{Dev, PortType, Profile, Protocol};
use sim::fabric::{LinkLayer, Topology};
use sim::{SimConfig, Wire};
use tests::mlx4_common::{Model, bring_up};

const VALID: u64 = 1 << 63;

/// Cards on the `--nodes n --link-layer ll` fabric with ports of `types`.
fn on_fabric(n: usize, ll: [LinkLayer; 2], types: [sim::PortType; 2]) -> (Vec<Model>, Wire) {
    let mut f = sim::fabric::Fabric::new();
    let built = Topology::for_nodes_with(n, ll)
        .unwrap()
        .build(&mut f)
        .unwrap();
    let wire = Wire::over(Arc::new(Mutex::new(f)), SimConfig::default().relax_step);
    let models = built
        .hcas
        .iter()
        .map(|h| {
            Model::on_ports(
                SimConfig {
                    node_guid: h.node_guid,
                    port_types: types,
                    ..SimConfig::default()
                },
                &wire,
                [Some(h.ports[0]), Some(h.ports[1])],
            )
        })
        .collect();
    (models, wire)
}

fn types(d: &Dev) -> [PortType; 2] {
    [d.caps().port[1].port_type, d.caps().port[2].port_type]
}

#[test]
fn fixed_port_types_are_taken_as_the_card_reports_them() {
    let hca = Model::new(SimConfig {
        port_types: [sim::PortType::Eth, sim::PortType::Ib],
        ..SimConfig::default()
    });
    let d = bring_up(&hca, Profile::default()).unwrap();
    assert_eq!(types(&d), [PortType::Eth, PortType::Ib]);
    assert_eq!(d.protocol_ports(Protocol::En), vec![1]);
    // The model reports IBOE for a card with an Ethernet port: mlx4_ib
    // takes both (RoCE on port 1).
    assert_eq!(d.protocol_ports(Protocol::Ib), vec![1, 2]);
    let pc = d.caps().port[1];
    assert_eq!(pc.eth_mtu_cap, 9600);
    assert_eq!(pc.log_num_macs, 7);
    let m = hca.eth_port(1).unwrap().mac;
    assert_eq!(
        pc.def_mac,
        m.iter().fold(0u64, |a, &b| a << 8 | u64::from(b))
    );
    // The ETH_ADDR QP region exists: 128 QPs per port at the top.
    let base = d.get_base_qpn(1);
    assert_eq!(d.get_base_qpn(2), base + 128);
    assert!(base + 256 <= d.caps().num_qps);
    d.teardown();
    hca.finish();
}

#[test]
fn auto_ports_take_the_type_of_their_cable_unless_the_profile_chooses() {
    let (mut m, _w) = on_fabric(1, [LinkLayer::Ib, LinkLayer::Eth], [sim::PortType::Auto; 2]);
    let hca = m.remove(0);
    let d = bring_up(&hca, Profile::default()).unwrap();
    assert_eq!(types(&d), [PortType::Ib, PortType::Eth]);
    assert!(d.caps().port[2].sense_allowed);
    assert!(d.caps().port[2].auto_sensed);
    d.teardown();

    // Linux's port_type_array: port 1 chosen Ethernet on an IB cable.
    let p = Profile {
        port_type: [Some(PortType::Eth), None],
        ..Profile::default()
    };
    let mut d = bring_up(&hca, p).unwrap();
    assert_eq!(types(&d), [PortType::Eth, PortType::Eth]);
    assert!(!d.caps().port[1].auto_sensed);
    // SENSE_PORT once running says what the cables are.
    assert_eq!(
        d.do_sense_ports(),
        [Some(PortType::Ib), Some(PortType::Eth)]
    );
    // The chosen Ethernet port runs Ethernet once told so.
    d.set_port_general(1, 1522, true, 0, true, 0).unwrap();
    assert_eq!(hca.link_layer(1), Some(LinkLayer::Eth));
    d.teardown();
    hca.finish();
}

#[test]
fn macs_are_registered_once_and_counted() {
    let hca = Model::new(SimConfig {
        port_types: [sim::PortType::Eth, sim::PortType::Eth],
        ..SimConfig::default()
    });
    let mut d = bring_up(&hca, Profile::default()).unwrap();
    let mac = d.caps().port[1].def_mac;
    let other = 0x0002_c9aa_bbcc;
    assert_eq!(d.register_mac(1, mac).unwrap(), 0);
    assert_eq!(d.register_mac(1, mac).unwrap(), 0);
    assert_eq!(d.register_mac(1, other).unwrap(), 1);
    assert_eq!(d.mac_refs(1, 0), 2);
    let t = &hca.eth_port(1).unwrap().macs;
    assert_eq!((t[0], t[1], t[2]), (VALID | mac, VALID | other, 0));
    // Port 2's table is its own.
    assert_eq!(d.register_mac(2, other).unwrap(), 0);
    // A multicast MAC is refused before the card sees it.
    assert!(d.register_mac(1, 0x0100_5e00_0001).is_err());
    d.unregister_mac(1, mac);
    assert_eq!(
        hca.eth_port(1).unwrap().macs[0],
        VALID | mac,
        "one reference left"
    );
    d.unregister_mac(1, mac);
    assert_eq!(hca.eth_port(1).unwrap().macs[0], 0);
    assert_eq!(d.find_cached_mac(1, other), Some(1));
    // The freed slot is reused.
    assert_eq!(d.register_mac(1, 0x0002_c9aa_bbcd).unwrap(), 0);
    // An IB port has no MAC table.
    d.teardown();
    hca.finish();
}

#[test]
fn vlans_gids_and_the_general_settings_reach_the_port() {
    let hca = Model::new(SimConfig {
        port_types: [sim::PortType::Eth, sim::PortType::Ib],
        ..SimConfig::default()
    });
    let mut d = bring_up(&hca, Profile::default()).unwrap();
    assert_eq!(d.register_vlan(1, 5).unwrap(), 2);
    assert_eq!(d.register_vlan(1, 5).unwrap(), 2);
    assert_eq!(d.register_vlan(1, 7).unwrap(), 3);
    assert!(d.register_vlan(1, 4095).is_err());
    let p = hca.eth_port(1).unwrap();
    assert_eq!(p.vlan_index(5), Some(2));
    assert_eq!(p.vlan_index(7), Some(3));
    d.unregister_vlan(1, 5);
    assert_eq!(hca.eth_port(1).unwrap().vlan_index(5), Some(2));
    d.unregister_vlan(1, 5);
    assert_eq!(hca.eth_port(1).unwrap().vlan_index(5), None);

    let g0 = [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 2, 0xc9, 0xff, 0xfe, 0, 0, 0x11,
    ];
    let mut g1 = g0;
    g1[15] = 0x12;
    d.set_port_gid_table(1, &[g0, g1]).unwrap();
    let p = hca.eth_port(1).unwrap();
    assert_eq!((p.gid_index(&g0), p.gid_index(&g1)), (Some(0), Some(1)));
    // A GID twice is taken (Linux 6.1 writes a VLAN device's link-local
    // GID beside the port's); the first entry answers for it.
    d.set_port_gid_table(1, &[g0, g1, g0]).unwrap();
    assert_eq!(hca.eth_port(1).unwrap().gid_index(&g0), Some(0));

    d.set_port_general(1, 1522, false, 0, false, 0).unwrap();
    assert!(d.set_port_general(1, 9601, false, 0, false, 0).is_err());
    let base = d.get_base_qpn(1);
    d.set_port_qpn_calc(1, base, false).unwrap();
    let p = hca.eth_port(1).unwrap();
    assert_eq!(p.mtu, 1522);
    let r = p.rqp.unwrap();
    assert_eq!((r.base_qpn, r.n_mac, r.mc_promisc_mode), (base, 7, 2));
    // The Ethernet flavours are refused on the InfiniBand port.
    assert!(d.set_port_general(2, 1522, false, 0, false, 0).is_err());
    assert!(d.register_mac(2, 0x0002_c900_0001).is_err());
    let st = d.query_eth_port(1).unwrap();
    assert_eq!(st.mac, d.caps().port[1].def_mac);
    assert_eq!(st.speed_mbps(), 40_000);
    d.teardown();
    hca.finish();
}
