use super::*;

fn s(f: impl FnOnce(&mut String) -> fmt::Result) -> String {
    let mut out = String::new();
    f(&mut out).unwrap();
    out
}

#[test]
fn field_lines_have_libibmads_dots() {
    let t = s(|o| dump_field(o, "PortSelect", 1));
    assert_eq!(t, "PortSelect:......................1\n");
    assert_eq!(
        t.find('1'),
        Some(33),
        "value after name, colon and dots to 33 columns"
    );
    // A name of 32 characters or more gets no dots.
    let t = s(|o| dump_field(o, "McastPkeyTrapSuppressionEnabled", 0));
    assert_eq!(t, "McastPkeyTrapSuppressionEnabled:.0\n");
}

#[test]
fn port_counters_decode_by_ibta_offsets() {
    let mut d = [0u8; 192];
    d[1] = 1; // PortSelect
    d[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
    d[4..6].copy_from_slice(&3u16.to_be_bytes()); // SymbolErrorCounter
    d[7] = 2; // LinkDownedCounter
    d[19] = 0x5a; // LocalLinkIntegrity 5, ExcessiveBufferOverrun 10
    d[22..24].copy_from_slice(&7u16.to_be_bytes()); // VL15Dropped
    d[24..28].copy_from_slice(&16400u32.to_be_bytes()); // XmitData (words)
    d[28..32].copy_from_slice(&20u32.to_be_bytes());
    d[32..36].copy_from_slice(&9u32.to_be_bytes());
    d[36..40].copy_from_slice(&8u32.to_be_bytes());
    let t = s(|o| dump_perfcounters(o, &d));
    let want = "PortSelect:......................1\n\
CounterSelect:...................0xffff\n\
SymbolErrorCounter:..............3\n\
LinkErrorRecoveryCounter:........0\n\
LinkDownedCounter:...............2\n\
PortRcvErrors:...................0\n\
PortRcvRemotePhysicalErrors:.....0\n\
PortRcvSwitchRelayErrors:........0\n\
PortXmitDiscards:................0\n\
PortXmitConstraintErrors:........0\n\
PortRcvConstraintErrors:.........0\n\
CounterSelect2:..................0x00\n\
LocalLinkIntegrityErrors:........5\n\
ExcessiveBufferOverrunErrors:....10\n\
VL15Dropped:.....................7\n\
PortXmitData:....................16400\n\
PortRcvData:.....................20\n\
PortXmitPkts:....................9\n\
PortRcvPkts:.....................8\n\
PortXmitWait:....................0\n";
    assert_eq!(t, want);
    assert_eq!(read_counter(&t, "PortXmitData"), Some(16400));
    assert_eq!(read_counter(&t, "PortRcvPkts"), Some(8));
    assert_eq!(read_counter(&t, "Nope"), None);
}

#[test]
fn extended_counters_only_with_the_capability() {
    let mut d = [0u8; 192];
    d[1] = 1;
    d[8..16].copy_from_slice(&(1u64 << 40).to_be_bytes());
    d[40..48].copy_from_slice(&77u64.to_be_bytes());
    let t = s(|o| dump_perfcounters_ext(o, &d, 0));
    assert!(t.contains("PortXmitData:....................1099511627776\n"));
    assert!(!t.contains("PortUnicastXmitPkts"));
    let t = s(|o| dump_perfcounters_ext(o, &d, IB_PM_EXT_WIDTH_SUPPORTED));
    assert!(t.contains("PortUnicastXmitPkts:.............77\n"));
    assert!(t.ends_with("PortMulticastRcvPkts:............0\n"));
}

#[test]
fn nodeinfo_and_nodedesc() {
    let mut d = [0u8; 64];
    d[0] = 1;
    d[1] = 1;
    d[2] = 1;
    d[3] = 2;
    d[4..12].copy_from_slice(&0x0002_c903_000a_1b2cu64.to_be_bytes());
    d[12..20].copy_from_slice(&0x0002_c903_000a_1b2cu64.to_be_bytes());
    d[20..28].copy_from_slice(&0x0002_c903_000a_1b2du64.to_be_bytes());
    d[28..30].copy_from_slice(&128u16.to_be_bytes());
    d[30..32].copy_from_slice(&0x1003u16.to_be_bytes());
    d[32..36].copy_from_slice(&0x1u32.to_be_bytes());
    d[36] = 1;
    d[37..40].copy_from_slice(&[0x00, 0x02, 0xc9]);
    let t = s(|o| dump_nodeinfo(o, &d));
    assert_eq!(
        t,
        "BaseVers:........................1\n\
ClassVers:.......................1\n\
NodeType:........................Channel Adapter\n\
NumPorts:........................2\n\
SystemGuid:......................0x0002c903000a1b2c\n\
Guid:............................0x0002c903000a1b2c\n\
PortGuid:........................0x0002c903000a1b2d\n\
PartCap:.........................128\n\
DevId:...........................0x1003\n\
Revision:........................0x00000001\n\
LocalPort:.......................1\n\
VendorId:........................0x0002c9\n"
    );
    d[2] = 2;
    assert!(s(|o| dump_nodeinfo(o, &d)).contains("NodeType:........................Switch\n"));
    d[2] = 9;
    assert!(s(|o| dump_nodeinfo(o, &d)).contains("NodeType:........................?(9)\n"));

    let mut nd = [0u8; 64];
    nd[..12].copy_from_slice(b"lego mlx4_0\x07");
    assert_eq!(
        s(|o| print_nodedesc(o, &nd)),
        "Node Description:....................lego mlx4_0.\n"
    );
}

#[test]
fn portinfo_words() {
    let mut d = [0u8; 64];
    d[16..18].copy_from_slice(&2u16.to_be_bytes());
    d[18..20].copy_from_slice(&1u16.to_be_bytes());
    d[28] = 1;
    d[31] = 2; // 4X
    d[32] = 0x14; // supported 1, Active
    d[33] = 0x52; // LinkUp, default Polling
    d[35] = 0x41; // 10.0 Gbps active
    d[36] = 0x40; // neighbor MTU 2048
    d[37] = 0x40; // VL0-7
    d[41] = 0x04; // MtuCap 2048
    d[51] = 0x12; // subnet timeout 18
    let t = s(|o| dump_portinfo(o, &d));
    for line in [
        "Lid:.............................2\n",
        "SMLid:...........................1\n",
        "LinkWidthActive:.................4X\n",
        "LinkState:.......................Active\n",
        "PhysLinkState:...................LinkUp\n",
        "LinkSpeedActive:.................10.0 Gbps\n",
        "NeighborMTU:.....................2048\n",
        "VLCap:...........................VL0-7\n",
        "MtuCap:..........................2048\n",
        "SubnetTimeout:...................18\n",
    ] {
        assert!(t.contains(line), "missing {line:?} in\n{t}");
    }
}

#[test]
fn switchinfo_and_sminfo() {
    let mut d = [0u8; 64];
    d[0..2].copy_from_slice(&49152u16.to_be_bytes());
    d[6..8].copy_from_slice(&3u16.to_be_bytes());
    d[11] = 0x0f << 3 | 1 << 2;
    d[18..20].copy_from_slice(&0xc000u16.to_be_bytes());
    let t = s(|o| dump_switchinfo(o, &d));
    assert!(t.starts_with("LinearFdbCap:....................49152\n"));
    assert!(t.contains("LinearFdbTop:....................3\n"));
    assert!(t.contains("LifeTime:........................15\n"));
    assert!(t.contains("StateChange:.....................1\n"));
    assert!(t.ends_with("MulticastFDBTop:.................0xc000\n"));

    let mut d = [0u8; 64];
    d[0..8].copy_from_slice(&0x0002_c903_000a_1b2cu64.to_be_bytes());
    d[16..20].copy_from_slice(&42u32.to_be_bytes());
    d[20] = 0x03;
    assert_eq!(
        s(|o| print_sminfo(o, 1, &d)),
        "sminfo: sm lid 1 sm guid 0x2c903000a1b2c, activity count 42 priority 0 state 3 SMINFO_MASTER\n"
    );
}

#[test]
fn short_data_reads_as_zeros_never_panics() {
    let t = s(|o| dump_perfcounters(o, &[0, 1]));
    assert!(t.starts_with("PortSelect:......................1\n"));
    assert!(t.ends_with("PortXmitWait:....................0\n"));
    for f in [dump_nodeinfo, dump_portinfo, dump_switchinfo] {
        let _ = s(|o| f(o, &[]));
    }
    let _ = s(|o| dump_perfcounters_ext(o, &[], IB_PM_EXT_WIDTH_SUPPORTED));
    let _ = s(|o| print_sminfo(o, 1, &[]));
}

#[test]
fn destinations_parse_and_print_as_libibmad() {
    assert_eq!(PortId::parse("5", false), Ok(PortId::Lid(5)));
    assert_eq!(PortId::parse("0x1f", false), Ok(PortId::Lid(0x1f)));
    assert!(PortId::parse("0", false).is_err());
    assert!(PortId::parse("0xc000", false).is_err());
    assert!(PortId::parse("x", false).is_err());
    assert_eq!(PortId::parse("0,1,3", true), Ok(PortId::Dr(vec![1, 3])));
    assert_eq!(PortId::parse("0", true), Ok(PortId::Dr(vec![])));
    assert!(
        PortId::parse("1,2", true)
            .unwrap_err()
            .contains("start at this port")
    );
    assert!(PortId::parse("0,a", true).is_err());
    assert!(PortId::parse("0,300", true).is_err());
    assert_eq!(PortId::Lid(3).to_string(), "Lid 3");
    assert_eq!(
        PortId::Dr(vec![1, 3]).to_string(),
        "DR path slid 65535; dlid 65535; 0,1,3"
    );
}

#[test]
fn ports_as_perfquery_and_smpquery_take_them() {
    // perfquery: 0 to 255, 255 being all ports; decimal or hex.
    assert_eq!(parse_port("255", ALL_PORTS), Ok(255));
    assert_eq!(parse_port("0xff", ALL_PORTS), Ok(255));
    assert_eq!(parse_port("0", ALL_PORTS), Ok(0));
    let e = parse_port("256", ALL_PORTS).unwrap_err();
    assert_eq!(e, "bad port '256' (0 to 254, or 255 for all ports)");
    // smpquery: no port 255 (no node has one).
    assert_eq!(parse_port("254", ALL_PORTS - 1), Ok(254));
    assert_eq!(
        parse_port("255", ALL_PORTS - 1).unwrap_err(),
        "bad port '255' (0 to 254)"
    );
    assert!(parse_port("-1", ALL_PORTS).is_err());
    // All ports only from a PMA whose CapMask says AllPortSelect.
    assert!(check_port_select(255, IB_PM_ALL_PORT_SELECT).is_ok());
    assert!(
        check_port_select(255, IB_PM_EXT_WIDTH_SUPPORTED)
            .unwrap_err()
            .starts_with("AllPortSelect not supported")
    );
    assert!(check_port_select(2, 0).is_ok());
}
