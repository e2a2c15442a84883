//! Port types as a VPI card reports them, SENSE_PORT, the Ethernet
//! SET_PORT flavours with the card's statuses, INIT_PORT on an Ethernet
//! port, the Ethernet filter commands.

use sim::fabric::LinkLayer;
use sim::{LogicalState, Opcode, PhysicalState, PortType, SimHca, Status};

use crate::common::*;
use crate::harness::{CmdError, Raw};

fn st(s: Status) -> Result<(), CmdError> {
    Err(CmdError::Status(s))
}

const DPDP: u64 = 1 << 12;
const IBOE: u64 = 1 << 30;
const SENSE: u64 = 1 << 55;

fn dev_cap_flags(r: &mut Raw) -> u64 {
    let b = r.cmd_out(0, 0, Opcode::QUERY_DEV_CAP).unwrap();
    u64::from_be_bytes(b[0x40..0x48].try_into().unwrap())
}

#[test]
fn a_vpi_card_reports_its_port_types_macs_and_capabilities() {
    let guid = 0x0002_c903_0042_1000;
    let sim = SimHca::new(cfg(guid, [PortType::Ib, PortType::Eth]));
    let mut r = Raw::with(sim);
    crate::harness::init(&mut r).unwrap();
    let f = dev_cap_flags(&mut r);
    assert_eq!(f & (DPDP | IBOE | SENSE), DPDP | IBOE | SENSE, "{f:#x}");
    let p1 = r.cmd_out(1, 0, Opcode::QUERY_PORT).unwrap();
    assert_eq!(p1[0] & 0x1f, 0x01, "port 1: IB only, no suggestion");
    let p2 = r.cmd_out(2, 0, Opcode::QUERY_PORT).unwrap();
    assert_eq!(
        p2[0] & 0x1f,
        0x02 | 0x08,
        "port 2: Ethernet, suggested Ethernet"
    );
    assert_eq!(u16::from_be_bytes([p2[2], p2[3]]), 9600, "Ethernet MTU");
    assert_eq!(p2[5], 0x40, "40 GbE (mlx4_ib: 4X)");
    assert_eq!(p2[0x0a], 0x77, "128 MACs, 128 VLANs");
    let mac = u64::from_be_bytes(p2[0x10..0x18].try_into().unwrap());
    assert_eq!(mac, mac_u64(&port_mac(guid, 2)));
    assert_eq!(port_mac(guid, 2), [0x00, 0x02, 0xc9, 0x42, 0x10, 0x02]);
    assert_eq!(r.cmd_imm(0, 1, 0, Opcode::SENSE_PORT), Ok(1));
    assert_eq!(r.cmd_imm(0, 2, 0, Opcode::SENSE_PORT), Ok(2));
    // An IB-only card reports what it always did.
    let mut ib = Raw::new();
    crate::harness::init(&mut ib).unwrap();
    assert_eq!(dev_cap_flags(&mut ib) & (DPDP | IBOE | SENSE), 0);
    assert_eq!(ib.cmd_out(2, 0, Opcode::QUERY_PORT).unwrap()[0] & 0x1f, 1);
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}

#[test]
fn sense_port_is_answered_before_init_hca_as_linux_sends_it() {
    // Linux mlx4_dev_cap runs SENSE_PORT for a "default sense" port after
    // QUERY_DEV_CAP, before INIT_HCA; a refusal is its "Sense command
    // failed" error and the port keeps the firmware's suggestion.
    let t = [PortType::Auto, PortType::Eth];
    let (x, _y, _w) =
        SimHca::back_to_back(cfg(0x0002_c903_0000_1000, t), cfg(0x0002_c903_0000_2000, t));
    let mut r = Raw::with(x);
    crate::harness::reset(&mut r);
    assert_eq!(
        r.cmd_imm(0, 1, 0, Opcode::SENSE_PORT),
        Err(CmdError::Status(Status::BAD_SYS_STATE)),
        "no firmware running yet"
    );
    crate::harness::load_fw_no_reset(&mut r).unwrap();
    dev_cap_flags(&mut r);
    assert_eq!(r.cmd_imm(0, 1, 0, Opcode::SENSE_PORT), Ok(1), "an IB cable");
    assert_eq!(
        r.cmd_imm(0, 2, 0, Opcode::SENSE_PORT),
        Ok(2),
        "fixed Ethernet"
    );
    assert_eq!(
        r.cmd_imm(0, 3, 0, Opcode::SENSE_PORT),
        Err(CmdError::Status(Status::BAD_PARAM)),
        "no port 3"
    );
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
    // The bring-up goes on as before.
    crate::harness::init_after_fw_pub(&mut r).unwrap();
    assert_eq!(r.cmd_imm(0, 1, 0, Opcode::SENSE_PORT), Ok(1));
}

#[test]
fn an_auto_port_senses_the_cable_and_takes_the_drivers_flavour() {
    let t = [PortType::Auto, PortType::Auto];
    let (x, y, _w) =
        SimHca::back_to_back(cfg(0x0002_c903_0000_1000, t), cfg(0x0002_c903_0000_2000, t));
    // An IB cable (back_to_back of auto ports attaches IB ports).
    let mut r = Raw::with(x);
    crate::harness::init(&mut r).unwrap();
    assert_eq!(r.cmd_imm(0, 1, 0, Opcode::SENSE_PORT), Ok(1), "an IB cable");
    assert_eq!(r.cmd_imm(0, 2, 0, Opcode::SENSE_PORT), Ok(0), "no cable");
    let q = r.cmd_out(1, 0, Opcode::QUERY_PORT).unwrap();
    assert_eq!(q[0] & 0x1f, 0x13, "both types, default sense, suggested IB");
    drop(y);
    // An Ethernet cable.
    let (hcas, _w, _f, _b) = {
        let mut f = sim::fabric::Fabric::new();
        let built = sim::fabric::Topology::back_to_back_with(LinkLayer::Eth)
            .build(&mut f)
            .unwrap();
        let shared = std::sync::Arc::new(std::sync::Mutex::new(f));
        let w = sim::Wire::over(shared.clone(), std::time::Duration::from_micros(1));
        let hcas: Vec<SimHca> = built
            .hcas
            .iter()
            .map(|b| {
                SimHca::new_on_ports(
                    cfg(b.node_guid, t),
                    &w,
                    [Some(b.ports[0]), Some(b.ports[1])],
                )
            })
            .collect();
        (hcas, w, shared, built)
    };
    let mut a = Raw::with(hcas[0].clone());
    crate::harness::init(&mut a).unwrap();
    assert_eq!(a.cmd_imm(0, 1, 0, Opcode::SENSE_PORT), Ok(2));
    let q = a.cmd_out(1, 0, Opcode::QUERY_PORT).unwrap();
    assert_eq!(
        q[0] & 0x1f,
        0x1b,
        "both types, default sense, suggested Ethernet"
    );
    assert_eq!(a.sim.link_layer(1), Some(LinkLayer::Ib), "IB until told");
    set_general(&mut a, 1, 1522).unwrap();
    assert_eq!(a.sim.link_layer(1), Some(LinkLayer::Eth));
    a.cmd(0, 1, 0, Opcode::INIT_PORT).unwrap();
    // The IB flavour on the open Ethernet port: close it first.
    let mut sp = vec![0u8; 256];
    sp[0..4].copy_from_slice(&(1u32 << 22 | 5 << 12).to_be_bytes());
    assert_eq!(
        a.cmd_in(&sp, 1, 0, Opcode::SET_PORT),
        st(Status::BAD_RES_STATE)
    );
    assert!(a.violated("CLOSE_PORT before changing"));
    a.cmd(0, 1, 0, Opcode::CLOSE_PORT).unwrap();
    a.cmd_in(&sp, 1, 0, Opcode::SET_PORT).unwrap();
    assert_eq!(a.sim.link_layer(1), Some(LinkLayer::Ib));
}

#[test]
fn ethernet_set_port_flavours_are_taken_or_refused_as_the_card_does() {
    let sim = SimHca::new(cfg(0x0002_c903_0000_1000, [PortType::Ib, PortType::Eth]));
    let mut r = Raw::with(sim);
    crate::harness::init(&mut r).unwrap();
    // Wrong flavour for a fixed port: the firmware has none.
    assert_eq!(set_general(&mut r, 1, 1522), st(Status::BAD_OP));
    let mut sp = vec![0u8; 256];
    sp[0..4].copy_from_slice(&(1u32 << 22 | 5 << 12).to_be_bytes());
    assert_eq!(r.cmd_in(&sp, 2, 0, Opcode::SET_PORT), st(Status::BAD_OP));
    // General.
    set_general(&mut r, 2, 1522).unwrap();
    assert_eq!(r.sim.eth_port(2).unwrap().mtu, 1522);
    assert_eq!(set_general(&mut r, 2, 9700), st(Status::BAD_PARAM));
    let mut g = vec![0u8; 64];
    g[3] = 0x6;
    g[8] = 0x80;
    g[9] = 0x0f;
    assert_eq!(
        set_port_eth(&mut r, 2, 0, &g),
        st(Status::BAD_PARAM),
        "global pause and PFC at once"
    );
    // RQP_CALC.
    set_rqp(&mut r, 2, 0x100, 7, false, 2).unwrap();
    let rqp = r.sim.eth_port(2).unwrap().rqp.unwrap();
    assert_eq!(
        (rqp.base_qpn, rqp.n_mac, rqp.mc_promisc_mode),
        (0x100, 7, 2)
    );
    // MAC table: valid unicast MACs once each.
    let a = [0x00, 0x02, 0xc9, 0, 0, 0x21];
    set_macs(&mut r, 2, &[a, [0x00, 0x02, 0xc9, 0, 0, 0x22]]).unwrap();
    assert_eq!(r.sim.eth_port(2).unwrap().mac_index(&a), Some(0));
    assert_eq!(set_macs(&mut r, 2, &[a, a]), st(Status::BAD_PARAM));
    assert_eq!(
        set_macs(&mut r, 2, &[[0x01, 0x00, 0x5e, 0, 0, 1]]),
        st(Status::BAD_PARAM)
    );
    // VLAN table.
    let mut v = vec![0u8; 512];
    v[4..8].copy_from_slice(&(1u32 << 31 | 100).to_be_bytes());
    set_port_eth(&mut r, 2, 3, &v).unwrap();
    assert_eq!(r.sim.eth_port(2).unwrap().vlan_index(100), Some(1));
    v[8..12].copy_from_slice(&(1u32 << 31 | 1 << 20 | 100).to_be_bytes());
    assert_eq!(set_port_eth(&mut r, 2, 3, &v), st(Status::BAD_PARAM));
    // GID table (in_mod GID_TABLE 5 << 8 | port).
    let g0 = ll_gid(&a);
    set_gids(&mut r, 2, &[g0]).unwrap();
    assert_eq!(r.sim.eth_port(2).unwrap().gid_index(&g0), Some(0));
    // The same GID twice, as Linux 6.1 writes a VLAN device's link-local
    // GID beside the port's: taken.
    set_gids(&mut r, 2, &[g0, g0]).unwrap();
    assert_eq!(r.sim.eth_port(2).unwrap().gid_index(&g0), Some(0));
    // Not a ConnectX-3 flavour; reserved input modifier bits.
    assert_eq!(set_port_eth(&mut r, 2, 0xb, &g), st(Status::BAD_PARAM));
    assert_eq!(
        r.cmd_in(&g, 1 << 16 | 2, 1, Opcode::SET_PORT),
        st(Status::BAD_PARAM)
    );
    // The priority table is taken (and not kept).
    set_port_eth(&mut r, 2, 4, &g).unwrap();
    // The filters take Ethernet ports only.
    r.cmd(0x0100_5e00_0001, 2, 0, Opcode::SET_MCAST_FLTR)
        .unwrap();
    r.cmd(0, 2, 2, Opcode::SET_MCAST_FLTR).unwrap();
    assert_eq!(
        r.cmd(0, 1, 2, Opcode::SET_MCAST_FLTR),
        st(Status::BAD_PARAM)
    );
    let f = r.sim.eth_port(2).unwrap().mcast_filter;
    assert!(f.0 && f.1.contains(&0x0100_5e00_0001));
    let mut vf = vec![0u8; 512];
    vf[127 * 4..128 * 4].copy_from_slice(&(1u32 << 5).to_be_bytes()); // VID 5
    r.cmd_in(&vf, 2, 0, Opcode::SET_VLAN_FLTR).unwrap();
    assert!(r.sim.eth_port(2).unwrap().in_vlan(5));
    assert!(!r.sim.eth_port(2).unwrap().in_vlan(6));
    let stats = r.cmd_out(2, 0, Opcode::DUMP_ETH_STATS).unwrap();
    assert_eq!(stats.len(), 4096);
}

#[test]
fn an_ethernet_port_is_active_when_its_link_is_up() {
    let (mut a, mut b, w) = eth_b2b();
    a.r.cmd(0, 1, 0, Opcode::INIT_PORT).unwrap();
    assert_eq!(
        a.r.sim.port_state(1),
        Some((LogicalState::Down, PhysicalState::Polling)),
        "no partner yet"
    );
    b.r.cmd(0, 1, 0, Opcode::INIT_PORT).unwrap();
    settle(&a);
    assert_eq!(
        a.r.sim.port_state(1),
        Some((LogicalState::Active, PhysicalState::LinkUp)),
        "no SM on Ethernet"
    );
    assert!(
        a.async_events().contains(&(0x09, 0)),
        "PORT_CHANGE (subtype active)"
    );
    let q = a.r.cmd_out(1, 0, Opcode::QUERY_PORT).unwrap();
    assert_eq!(q[0] & 0x80, 0x80, "link up (mlx4_en's link_up bit)");
    // The partner closes: down again.
    b.r.cmd(0, 1, 0, Opcode::CLOSE_PORT).unwrap();
    settle(&a);
    assert_eq!(a.r.sim.port_state(1).map(|s| s.0), Some(LogicalState::Down));
    drop(w);
    a.assert_no_violations();
}
