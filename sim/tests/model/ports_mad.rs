//! INIT_PORT/CLOSE_PORT/SET_PORT and the firmware SMA/PMA behind MAD_IFC.

use crate::harness::*;
use sim::front::in_process::SmpDropped;
use sim::{LogicalState, Opcode, PhysicalState, SimConfig, Status};

fn st(s: Status) -> R<()> {
    Err(CmdError::Status(s))
}

fn mad(r: &mut Raw, m: &[u8], port: u32, op_mod: u8) -> R<Vec<u8>> {
    r.cmd_box(m, port, op_mod, Opcode::MAD_IFC)
}

fn port_info(r: &mut Raw, port: u32) -> Vec<u8> {
    let out = mad(r, &smp_get(0x0015, port), port, 3).unwrap();
    assert_eq!(out[3], 0x81, "GetResp");
    assert_eq!(&out[4..6], &[0, 0], "MAD status");
    out[0x40..0x80].to_vec()
}

fn smp_set(attr: u16, attr_mod: u32, data: &[u8]) -> Vec<u8> {
    let mut m = smp_get(attr, attr_mod);
    m[3] = 0x02;
    m[0x40..0x40 + data.len()].copy_from_slice(data);
    m
}

#[test]
fn node_info_node_description_guid_and_pkey_tables() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    let ni = mad(&mut r, &smp_get(0x0011, 0), 1, 3).unwrap();
    let d = &ni[0x40..];
    assert_eq!(&d[0..4], &[1, 1, 1, 2], "base/class version, CA, 2 ports");
    let guid = SimConfig::default().node_guid;
    assert_eq!(u64::from_be_bytes(d[12..20].try_into().unwrap()), guid);
    assert_eq!(
        u64::from_be_bytes(d[20..28].try_into().unwrap()),
        guid + 1,
        "port GUID"
    );
    assert_eq!(u16::from_be_bytes([d[30], d[31]]), 0x1003);
    assert_eq!(
        u32::from_be_bytes(d[36..40].try_into().unwrap()) & 0xff_ffff,
        0x0002c9
    );
    assert_eq!(d[36], 1, "local port");
    let nd = mad(&mut r, &smp_get(0x0010, 0), 2, 3).unwrap();
    assert!(nd[0x40..].starts_with(b"MT25408 ConnectX Mellanox Technologies"));
    let gi = mad(&mut r, &smp_get(0x0014, 0), 2, 3).unwrap();
    assert_eq!(
        u64::from_be_bytes(gi[0x40..0x48].try_into().unwrap()),
        guid + 2
    );
    let bad = mad(&mut r, &smp_get(0x0014, 16), 2, 3).unwrap();
    assert_eq!(&bad[4..6], &[0, 0x1c], "GUID block past the table");
    let pk = mad(&mut r, &smp_get(0x0016, 0), 1, 3).unwrap();
    assert_eq!(&pk[0x40..0x44], &[0xff, 0xff, 0, 0]);
    let mut keys = [0u8; 64];
    keys[0..4].copy_from_slice(&[0xff, 0xff, 0x80, 0x01]);
    let out = mad(&mut r, &smp_set(0x0016, 0, &keys), 1, 3).unwrap();
    assert_eq!(&out[0x40..0x44], &[0xff, 0xff, 0x80, 0x01]);
    let sm = mad(&mut r, &smp_get(0x0020, 0), 1, 3).unwrap();
    assert_eq!(&sm[4..6], &[0, 0x0c], "SMInfo unsupported");
}

#[test]
fn mad_ifc_rejections() {
    let mut r = Raw::new();
    assert_eq!(
        mad(&mut r, &smp_get(0x15, 1), 1, 3).map(|_| ()),
        st(Status::BAD_SYS_STATE)
    );
    init(&mut r).unwrap();
    assert_eq!(
        mad(&mut r, &smp_get(0x15, 1), 3, 3).map(|_| ()),
        st(Status::BAD_PARAM)
    );
    let mut m = smp_get(0x15, 1);
    m[0] = 2;
    assert_eq!(
        mad(&mut r, &m, 1, 3).map(|_| ()),
        st(Status::BAD_PKT),
        "base version"
    );
    let mut m = smp_get(0x15, 1);
    m[1] = 0x55;
    assert_eq!(
        mad(&mut r, &m, 1, 3).map(|_| ()),
        st(Status::BAD_PKT),
        "unknown class"
    );
    let mut m = smp_get(0x15, 1);
    m[3] = 0x81;
    assert_eq!(
        mad(&mut r, &m, 1, 3).map(|_| ()),
        st(Status::BAD_PKT),
        "a response"
    );
    let mut m = smp_get(0x15, 1);
    m[2] = 2;
    assert_eq!(
        &mad(&mut r, &m, 1, 3).unwrap()[4..6],
        &[0, 4],
        "class version"
    );
    let mut m = smp_get(0x15, 1);
    m[3] = 0x03;
    assert_eq!(&mad(&mut r, &m, 1, 3).unwrap()[4..6], &[0, 8], "method");
}

#[test]
fn port_trains_after_init_port_and_the_sm_path_activates_it() {
    let mut r = Raw::new();
    let (_, asy) = init_full(&mut r).unwrap();
    let async_eqn = profile::FIRST_EQ + 1;
    let pi = port_info(&mut r, 1);
    assert_eq!(
        (pi[32] & 0xf, pi[33] >> 4),
        (1, 3),
        "Down/Disabled before INIT_PORT"
    );
    r.cmd(0, 1, 0, Opcode::INIT_PORT).unwrap();
    let pi = port_info(&mut r, 1);
    assert_eq!((pi[32] & 0xf, pi[33] >> 4), (2, 5), "Init/LinkUp");
    assert_eq!(
        u32::from_be_bytes(pi[20..24].try_into().unwrap()),
        0x0251_4868
    );
    // SubnSet(PortInfo): Init -> Active is not allowed, Armed then Active is.
    let mut d = pi.clone();
    d[16..18].copy_from_slice(&7u16.to_be_bytes());
    d[18..20].copy_from_slice(&1u16.to_be_bytes());
    d[32] = (d[32] & 0xf0) | 4;
    let out = mad(&mut r, &smp_set(0x0015, 1, &d), 1, 3).unwrap();
    assert_eq!(&out[4..6], &[0, 0x1c]);
    assert_eq!(r.sim.port_lid(1), Some(0), "nothing applied");
    d[32] = (d[32] & 0xf0) | 3;
    mad(&mut r, &smp_set(0x0015, 1, &d), 1, 3).unwrap();
    assert_eq!(r.sim.port_state(1).unwrap().0, LogicalState::Armed);
    assert_eq!(eqe(&r, &asy, 512, 0)[31], 0x80, "no event for Armed");
    d[32] = (d[32] & 0xf0) | 4;
    let out = mad(&mut r, &smp_set(0x0015, 1, &d), 1, 3).unwrap();
    assert_eq!(out[0x40 + 32] & 0xf, 4);
    assert_eq!(r.sim.port_lid(1), Some(7));
    // PORT_CHANGE(ACTIVE) for port 1 on the async EQ, owner 0 in pass 0.
    let e = eqe(&r, &asy, 512, 0);
    assert_eq!((e[1], e[3], e[0x0c] >> 4, e[31]), (0x09, 4, 1, 0));
    assert_eq!(r.sim.eq(async_eqn).unwrap().prod, 1);
    // CLOSE_PORT takes it down: PORT_CHANGE(DOWN).
    r.cmd(0, 1, 0, Opcode::CLOSE_PORT).unwrap();
    let e = eqe(&r, &asy, 512, 1);
    assert_eq!((e[1], e[3]), (0x09, 1));
    // Closing it again is a no-op (Linux does it on every unload): no
    // second PORT_CHANGE.
    r.cmd(0, 1, 0, Opcode::CLOSE_PORT).unwrap();
    assert_eq!(r.sim.eq(async_eqn).unwrap().prod, 2);
    assert_eq!(r.cmd(0, 3, 0, Opcode::INIT_PORT), st(Status::BAD_PARAM));
}

/// A port's LID is a unicast LID: an SM setting a multicast LID or the
/// permissive LID 0xFFFF gets "invalid attribute value" and the port keeps
/// its LID (the SMAs Linux implements in software, qib's and ipath's,
/// refuse both the same way; the switch's SMA here does too).
#[test]
fn a_port_info_set_with_a_multicast_or_permissive_lid_is_refused() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    r.cmd(0, 1, 0, Opcode::INIT_PORT).unwrap();
    let mut d = port_info(&mut r, 1);
    d[32] &= 0xf0; // PortState: no state change
    d[16..18].copy_from_slice(&7u16.to_be_bytes());
    let out = mad(&mut r, &smp_set(0x0015, 1, &d), 1, 3).unwrap();
    assert_eq!(&out[4..6], &[0, 0], "a unicast LID is taken");
    for lid in [0xc000u16, 0xfffe, 0xffff] {
        d[16..18].copy_from_slice(&lid.to_be_bytes());
        let out = mad(&mut r, &smp_set(0x0015, 1, &d), 1, 3).unwrap();
        assert_eq!(&out[4..6], &[0, 0x1c], "LID {lid:#06x}");
        assert_eq!(r.sim.port_lid(1), Some(7), "LID {lid:#06x} not applied");
    }
}

#[test]
fn link_down_and_up_and_the_sm_moves_the_logical_state_by_the_rules() {
    let mut r = Raw::new();
    let (_, asy) = init_full(&mut r).unwrap();
    r.cmd(0, 2, 0, Opcode::INIT_PORT).unwrap();
    sm_activate(&r.sim, 2, 9, 1);
    assert_eq!(r.sim.port_lid(2), Some(9));
    assert_eq!(eqe(&r, &asy, 512, 0)[0x0c] >> 4, 2);
    assert!(r.sim.set_link(2, false));
    assert_eq!(
        r.sim.port_state(2),
        Some((LogicalState::Down, PhysicalState::Polling))
    );
    let e = eqe(&r, &asy, 512, 1);
    assert_eq!((e[1], e[3], e[0x0c] >> 4), (0x09, 1, 2));
    // No link, no activation: nothing reaches the port from the wire, and
    // through MAD_IFC the SMA refuses Armed from Down.
    assert_eq!(sm_set_state(&r.sim, 2, 3), Err(SmpDropped::NoLink));
    let mut d = port_info(&mut r, 2);
    d[32] = (d[32] & 0xf0) | 3;
    d[33] &= 0x0f;
    let out = mad(&mut r, &port_info_set_smp(2, &d), 2, 0).unwrap();
    assert_eq!(&out[4..6], &[0, 0x1c], "Armed from Down refused");
    assert_eq!(r.sim.port_state(2).unwrap().0, LogicalState::Down);
    r.sim.set_link(2, true);
    assert_eq!(
        r.sim.port_state(2),
        Some((LogicalState::Init, PhysicalState::LinkUp))
    );
    // Init -> Active skips Armed: refused, the port stays in Init.
    assert_eq!(sm_set_state(&r.sim, 2, 4), Ok(0x1c));
    assert_eq!(r.sim.port_state(2).unwrap().0, LogicalState::Init);
    assert_eq!(sm_set_state(&r.sim, 2, 3), Ok(0));
    assert_eq!(r.sim.port_state(2).unwrap().0, LogicalState::Armed);
    assert_eq!(
        r.sim.eq(profile::FIRST_EQ + 1).unwrap().prod,
        2,
        "no event for Armed"
    );
    assert_eq!(sm_set_state(&r.sim, 2, 4), Ok(0));
    assert_eq!(r.sim.port_state(2).unwrap().0, LogicalState::Active);
    let e = eqe(&r, &asy, 512, 2);
    assert_eq!(
        (e[1], e[3], e[0x0c] >> 4),
        (0x09, 4, 2),
        "PORT_CHANGE(ACTIVE)"
    );
    // Down by SMP: the link retrains to Init, PORT_CHANGE(DOWN).
    assert_eq!(sm_set_state(&r.sim, 2, 1), Ok(0));
    assert_eq!(
        r.sim.port_state(2),
        Some((LogicalState::Init, PhysicalState::LinkUp))
    );
    let e = eqe(&r, &asy, 512, 3);
    assert_eq!((e[1], e[3], e[0x0c] >> 4), (0x09, 1, 2));
    // Armed -> Init is not a PortState an SM may write.
    assert_eq!(sm_set_state(&r.sim, 2, 3), Ok(0));
    assert_eq!(sm_set_state(&r.sim, 2, 2), Ok(0x1c));
    assert_eq!(r.sim.port_state(2).unwrap().0, LogicalState::Armed);
    assert!(r.sim.set_port_physical_state(2, PhysicalState::Disabled));
    assert_eq!(
        r.sim.port_state(2),
        Some((LogicalState::Down, PhysicalState::Disabled))
    );
}

#[test]
fn smps_from_the_wire_meet_the_smas_checks() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    assert_eq!(
        r.sim.sma_receive(3, &smp_get(0x0015, 3)),
        Err(SmpDropped::NoSuchPort)
    );
    assert_eq!(
        r.sim.sma_receive(1, &smp_get(0x0015, 1)),
        Err(SmpDropped::NoLink),
        "before INIT_PORT the link is down"
    );
    r.cmd(0, 1, 0, Opcode::INIT_PORT).unwrap();
    // A PMA MAD or a short one is not an SMP.
    let mut pma = smp_get(0x0012, 0);
    pma[1] = 0x04;
    assert_eq!(r.sim.sma_receive(1, &pma), Err(SmpDropped::NotAnSmp));
    assert_eq!(
        r.sim.sma_receive(1, &smp_get(0x0015, 1)[..64]),
        Err(SmpDropped::NotAnSmp)
    );
    // A directed-route Get is answered with the D bit.
    let mut dr = smp_get(0x0011, 0);
    dr[1] = 0x81;
    let out = r.sim.sma_receive(1, &dr).unwrap();
    assert_eq!((out[3], out[4] & 0x80), (0x81, 0x80));
    // M_Key set: a Set with the wrong key is discarded (no response) and
    // counted, and the port stays in Init; with the key it is applied.
    let (st, _) = sm_port_info(&r.sim, 1, |d| {
        d[0..8].copy_from_slice(&0x1122u64.to_be_bytes());
        d[16..18].copy_from_slice(&5u16.to_be_bytes());
    })
    .unwrap();
    assert_eq!(st, 0);
    assert_eq!(sm_set_state(&r.sim, 1, 3), Err(SmpDropped::Discarded));
    assert_eq!(r.sim.port_state(1).unwrap().0, LogicalState::Init);
    let mut d = port_info(&mut r, 1);
    assert_eq!(u16::from_be_bytes([d[44], d[45]]), 1, "one M_Key violation");
    d[32] = (d[32] & 0xf0) | 3;
    d[33] &= 0x0f;
    let mut m = port_info_set_smp(1, &d);
    m[0x18..0x20].copy_from_slice(&0x1122u64.to_be_bytes());
    let out = r.sim.sma_receive(1, &m).unwrap();
    assert_eq!(&out[4..6], &[0, 0]);
    assert_eq!(r.sim.port_state(1).unwrap().0, LogicalState::Armed);
}

#[test]
fn set_port_vl_cap_is_limited_and_linux_retries() {
    let cfg = SimConfig {
        max_vls: 4,
        ..Default::default()
    };
    let mut r = Raw::cfg(cfg);
    init(&mut r).unwrap();
    let sp = |vl: u32, mtu: u32| {
        let mut b = vec![0u8; 256];
        b[0..4].copy_from_slice(&(1u32 << 22 | 1 << 21 | mtu << 12 | vl << 4).to_be_bytes());
        b
    };
    // Linux: for vl_cap in 8, 4, 2, 1 while status == EXCEED_LIM.
    assert_eq!(
        r.cmd_in(&sp(8, 5), 1, 0, Opcode::SET_PORT),
        st(Status::EXCEED_LIM)
    );
    r.cmd_in(&sp(4, 5), 1, 0, Opcode::SET_PORT).unwrap();
    assert_eq!(
        r.cmd_in(&sp(3, 5), 1, 0, Opcode::SET_PORT),
        st(Status::BAD_PARAM)
    );
    assert_eq!(
        r.cmd_in(&sp(4, 6), 1, 0, Opcode::SET_PORT),
        st(Status::BAD_PARAM)
    );
    assert_eq!(
        r.cmd_in(&sp(4, 5), 1, 1, Opcode::SET_PORT),
        st(Status::BAD_OP),
        "Ethernet"
    );
    let pi = port_info(&mut r, 1);
    assert_eq!(pi[37] >> 4, 3, "VLCap VL0-3");
}

#[test]
fn set_port_capability_mask_shows_in_port_info() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    let mut b = vec![0u8; 256];
    b[4..8].copy_from_slice(&0x0251_4a6au32.to_be_bytes());
    r.cmd_in(&b, 2, 0, Opcode::SET_PORT).unwrap();
    let pi = port_info(&mut r, 2);
    assert_eq!(
        u32::from_be_bytes(pi[20..24].try_into().unwrap()),
        0x0251_4a6a
    );
}

#[test]
fn pma_port_counters_get_and_clear() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    r.cmd(0, 1, 0, Opcode::INIT_PORT).unwrap();
    sm_activate(&r.sim, 1, 3, 1);
    r.sim.set_link(1, false);
    let mut m = smp_get(0x0012, 0);
    m[1] = 0x04;
    m[0x41] = 1;
    let out = mad(&mut r, &m, 1, 3).unwrap();
    assert_eq!(&out[4..6], &[0, 0]);
    assert_eq!(out[0x40 + 7], 1, "LinkDownedCounter");
    m[3] = 0x02;
    m[0x42..0x44].copy_from_slice(&0xffffu16.to_be_bytes());
    let out = mad(&mut r, &m, 1, 3).unwrap();
    assert_eq!(out[0x40 + 7], 0, "cleared");
    let mut cpi = smp_get(0x0001, 0);
    cpi[1] = 0x04;
    let out = mad(&mut r, &cpi, 1, 3).unwrap();
    assert_eq!(&out[0x40..0x42], &[1, 1]);
}

#[test]
fn m_key_protects_port_info_set_unless_ignored() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    let mut d = port_info(&mut r, 1);
    d[0..8].copy_from_slice(&0x1122u64.to_be_bytes());
    mad(&mut r, &smp_set(0x0015, 1, &d), 1, 3).unwrap();
    // Without "ignore M_Key" and with the wrong key: discarded.
    let m = smp_set(0x0015, 1, &d);
    assert_eq!(mad(&mut r, &m, 1, 0).map(|_| ()), st(Status::BAD_PKT));
    let mut m = smp_set(0x0015, 1, &d);
    m[0x18..0x20].copy_from_slice(&0x1122u64.to_be_bytes());
    mad(&mut r, &m, 1, 0).unwrap();
    let pi = port_info(&mut r, 1);
    assert_eq!(
        u16::from_be_bytes([pi[44], pi[45]]),
        1,
        "one M_Key violation"
    );
}

#[test]
fn ipxe_flavours_of_port_commands() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    // MAD_IFC with iPXE's "extended info valid" bit 8 and a source LID.
    let out = mad(&mut r, &smp_get(0x0011, 0), 1 | 1 << 8 | 0x55 << 16, 3).unwrap();
    assert_eq!(out[0x40 + 2], 1);
    // SET_PORT g0/ng/sig replace the GUIDs NodeInfo reports.
    let mut b = vec![0u8; 256];
    b[0..4].copy_from_slice(&(1u32 << 16 | 1 << 17 | 1 << 18).to_be_bytes());
    b[4..8].copy_from_slice(&0x0251_4868u32.to_be_bytes());
    b[0x08..0x10].copy_from_slice(&0xaaaau64.to_be_bytes());
    b[0x10..0x18].copy_from_slice(&0xbbbbu64.to_be_bytes());
    b[0x18..0x20].copy_from_slice(&0xccccu64.to_be_bytes());
    r.cmd_in(&b, 1, 0, Opcode::SET_PORT).unwrap();
    let ni = mad(&mut r, &smp_get(0x0011, 0), 1, 3).unwrap();
    let d = &ni[0x40..];
    assert_eq!(u64::from_be_bytes(d[4..12].try_into().unwrap()), 0xaaaa);
    assert_eq!(u64::from_be_bytes(d[12..20].try_into().unwrap()), 0xcccc);
    assert_eq!(u64::from_be_bytes(d[20..28].try_into().unwrap()), 0xbbbb);
    // QUERY_PORT's link_state bit follows the physical link.
    assert_eq!(r.cmd_out(1, 0, Opcode::QUERY_PORT).unwrap()[0] & 0x80, 0);
    r.cmd(0, 1, 0, Opcode::INIT_PORT).unwrap();
    assert_eq!(r.cmd_out(1, 0, Opcode::QUERY_PORT).unwrap()[0] & 0x80, 0x80);
}

#[test]
fn sense_port_reports_infiniband() {
    let mut r = Raw::new();
    assert_eq!(
        r.cmd_imm(0, 1, 0, Opcode::SENSE_PORT).map(|_| ()),
        st(Status::BAD_SYS_STATE)
    );
    init(&mut r).unwrap();
    assert_eq!(r.cmd_imm(0, 2, 0, Opcode::SENSE_PORT), Ok(1));
    assert_eq!(
        r.cmd_imm(0, 3, 0, Opcode::SENSE_PORT).map(|_| ()),
        st(Status::BAD_PARAM)
    );
}
