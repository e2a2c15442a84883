//! Two readings of the SA layouts side by side.
//!
//! Ib_core's SA client (`sa_query`, after Linux) builds the requests and parses the
//! answers, the model's SA (`sim::fabric::sa`, after the IBTA and OpenSM) answers
//! them. A field either side places differently shows up here.

use std::collections::BTreeMap;

use ib_core::mad::method;
use ib_core::sa_query::{
    NodeRecord, PathRecord, PortInfoRecord, build_mad, node_comp, path_comp, portinfo_comp,
    sa_attr, sa_method,
};
use ib_core::verbs::Gid;
use sim::fabric::SmConfig;
use sim::fabric::sa::{self, View};
use sim::fabric::sm::EndPort;

const PREFIX: u64 = 0xfe80_0000_0000_0000;
const SW: u64 = 0x0002_c900_0000_0100;
const CA: [u64; 2] = [0x0002_c903_0000_0010, 0x0002_c903_0000_0020];

fn port_info(lid: u16, state: u8, mtu_cap: u8, speed: u8) -> [u8; 64] {
    let mut p = [0u8; 64];
    p[8..16].copy_from_slice(&PREFIX.to_be_bytes());
    p[16..18].copy_from_slice(&lid.to_be_bytes());
    p[18..20].copy_from_slice(&1u16.to_be_bytes());
    p[31] = 2; // 4x
    p[32] = state;
    p[35] = speed << 4;
    p[41] = mtu_cap;
    p
}

fn endport(guid: u64, port: u8, lid: u16, node_type: u8, desc: &str, info: [u8; 64]) -> EndPort {
    let mut ni = [0u8; 40];
    ni[0] = 1;
    ni[1] = 1;
    ni[2] = node_type;
    ni[3] = if node_type == 2 { 3 } else { 1 };
    ni[4..12].copy_from_slice(&guid.to_be_bytes());
    ni[12..20].copy_from_slice(&guid.to_be_bytes());
    let pg = if node_type == 2 { guid } else { guid + 1 };
    ni[20..28].copy_from_slice(&pg.to_be_bytes());
    ni[30..32].copy_from_slice(&0x1003u16.to_be_bytes());
    ni[36] = port;
    ni[37..40].copy_from_slice(&[0, 2, 0xc9]);
    let mut d = [0u8; 64];
    d[..desc.len()].copy_from_slice(desc.as_bytes());
    EndPort {
        port_guid: pg,
        node_guid: guid,
        port,
        lid,
        node_type,
        node_info: ni,
        description: d,
        port_info: info,
    }
}

/// A switch (LID 1, 3 ports) with CA 0 (LID 2, 4x QDR, MTU 4096) on port
/// 1 and CA 1 (LID 3, 4x DDR, MTU 2048) on port 2.
struct Subnet {
    ports: Vec<EndPort>,
    lfts: BTreeMap<u64, Vec<u8>>,
    links: BTreeMap<(u64, u8), (u64, u8)>,
    infos: BTreeMap<(u64, u8), [u8; 64]>,
    cfg: SmConfig,
}

impl Subnet {
    fn new() -> Subnet {
        let ports = vec![
            endport(SW, 0, 1, 2, "switch", port_info(1, 4, 5, 4)),
            endport(CA[0], 1, 2, 1, "node0 HCA-1", port_info(2, 4, 5, 4)),
            endport(CA[1], 1, 3, 1, "node1 HCA-1", port_info(3, 4, 4, 2)),
        ];
        let mut links = BTreeMap::new();
        for (c, sp) in [(CA[0], 1u8), (CA[1], 2)] {
            links.insert((c, 1), (SW, sp));
            links.insert((SW, sp), (c, 1));
        }
        let mut infos = BTreeMap::new();
        for p in 0..=3u8 {
            infos.insert((SW, p), port_info(1, 4, 5, 4));
        }
        Subnet {
            ports,
            lfts: BTreeMap::from([(SW, vec![0xff, 0, 1, 2])]),
            links,
            infos,
            cfg: SmConfig::default(),
        }
    }

    fn ask(&self, mad: &ib_core::mad::Mad, from_lid: u16) -> sa::Answer {
        let v = View::new(
            &self.ports,
            &self.lfts,
            &self.links,
            &self.infos,
            &self.cfg,
            1,
        );
        sa::answer(&v, &mut sa::SaState::default(), &mad.0, from_lid, 0).expect("an answer")
    }
}

fn status(m: &[u8]) -> u16 {
    u16::from_be_bytes([m[4], m[5]])
}

#[test]
fn path_record_request_from_ib_core_answered_and_parsed_back() {
    let s = Subnet::new();
    let q = PathRecord {
        dlid: 3,
        slid: 2,
        ..PathRecord::default()
    };
    let m = build_mad(
        method::GET,
        sa_attr::PATH_REC,
        path_comp::DLID | path_comp::SLID,
        &q.pack(),
    )
    .unwrap();
    let a = s.ask(&m, 2);
    assert_eq!(status(&a.mad), 0);
    let p = PathRecord::unpack(&a.mad[56..]).unwrap();
    assert_eq!((p.dlid, p.slid), (3, 2));
    assert_eq!(p.dgid, Gid::new(PREFIX, CA[1] + 1));
    assert_eq!(p.sgid, Gid::new(PREFIX, CA[0] + 1));
    assert_eq!((p.mtu_selector, p.mtu), (2, 4), "2048: CA 1's MTUCap");
    assert_eq!(
        (p.rate_selector, p.rate),
        (2, 6),
        "20 Gb/s: CA 1's 4x DDR link"
    );
    assert_eq!((p.packet_life_time_selector, p.packet_life_time), (2, 18));
    assert!(p.reversible);
    assert_eq!((p.pkey, p.sl, p.hop_limit, p.numb_path), (0xffff, 0, 0, 0));
    // By GIDs, as ib_core's path_to_gid asks.
    let q = PathRecord {
        dgid: Gid::new(PREFIX, CA[0] + 1),
        sgid: Gid::new(PREFIX, CA[1] + 1),
        numb_path: 1,
        reversible: true,
        pkey: 0xffff,
        ..PathRecord::default()
    };
    let cm = path_comp::DGID
        | path_comp::SGID
        | path_comp::NUMB_PATH
        | path_comp::REVERSIBLE
        | path_comp::PKEY;
    let m = build_mad(method::GET, sa_attr::PATH_REC, cm, &q.pack()).unwrap();
    let a = s.ask(&m, 3);
    assert_eq!(status(&a.mad), 0);
    let p = PathRecord::unpack(&a.mad[56..]).unwrap();
    assert_eq!((p.dlid, p.slid), (2, 3));
    // GetTable of every path from CA 0, parsed by ib_core record by record.
    let q = PathRecord {
        slid: 2,
        ..PathRecord::default()
    };
    let m = build_mad(
        sa_method::GET_TABLE,
        sa_attr::PATH_REC,
        path_comp::SLID,
        &q.pack(),
    )
    .unwrap();
    let a = s.ask(&m, 2);
    let data = a.table.expect("a table");
    let recs: Vec<PathRecord> = data
        .chunks(64)
        .map(|c| PathRecord::unpack(c).unwrap())
        .collect();
    let mut d: Vec<u16> = recs.iter().map(|r| r.dlid).collect();
    d.sort();
    assert_eq!(d, [1, 2, 3]);
    let own = recs.iter().find(|r| r.dlid == 2).unwrap();
    assert_eq!(own.packet_life_time, 0, "loopback");
    assert_eq!((own.mtu, own.rate), (5, 7), "CA 0 to itself: 4096, 40 Gb/s");
}

#[test]
fn node_and_portinfo_records_read_the_same_on_both_sides() {
    let s = Subnet::new();
    let q = NodeRecord {
        lid: 3,
        ..NodeRecord::default()
    };
    let m = build_mad(method::GET, sa_attr::NODE_REC, node_comp::LID, &q.pack()).unwrap();
    let a = s.ask(&m, 2);
    assert_eq!(status(&a.mad), 0);
    assert_eq!(u16::from_be_bytes([a.mad[44], a.mad[45]]) as usize * 8, 112);
    let n = NodeRecord::unpack(&a.mad[56..]).unwrap();
    assert_eq!(n.lid, 3);
    assert_eq!(n.node_info.node_guid, CA[1]);
    assert_eq!(n.node_info.port_guid, CA[1] + 1);
    assert_eq!(n.node_info.node_type, 1);
    assert_eq!(n.node_info.device_id, 0x1003);
    assert_eq!(n.node_info.vendor_id, 0x0002c9);
    assert_eq!(n.node_info.local_port_num, 1);
    assert_eq!(n.desc(), "node1 HCA-1");
    // By port GUID.
    let mut q = NodeRecord::default();
    q.node_info.port_guid = CA[0] + 1;
    let m = build_mad(
        method::GET,
        sa_attr::NODE_REC,
        node_comp::PORT_GUID,
        &q.pack(),
    )
    .unwrap();
    let n = NodeRecord::unpack(&s.ask(&m, 2).mad[56..]).unwrap();
    assert_eq!(n.lid, 2);
    // PortInfoRecord of CA 0, and the switch's ports as a table.
    let q = PortInfoRecord {
        lid: 2,
        ..PortInfoRecord::default()
    };
    let m = build_mad(
        method::GET,
        sa_attr::PORT_INFO_REC,
        portinfo_comp::LID,
        &q.pack(),
    )
    .unwrap();
    let a = s.ask(&m, 2);
    assert_eq!(status(&a.mad), 0);
    let r = PortInfoRecord::unpack(&a.mad[56..]).unwrap();
    assert_eq!(
        (r.lid, r.port_num, r.base_lid(), r.sm_lid(), r.port_state()),
        (2, 1, 2, 1, 4)
    );
    let q = PortInfoRecord {
        lid: 1,
        ..PortInfoRecord::default()
    };
    let m = build_mad(
        sa_method::GET_TABLE,
        sa_attr::PORT_INFO_REC,
        portinfo_comp::LID,
        &q.pack(),
    )
    .unwrap();
    let a = s.ask(&m, 2);
    let data = a.table.expect("a table");
    let recs: Vec<PortInfoRecord> = data
        .chunks(72)
        .map(|c| PortInfoRecord::unpack(c).unwrap())
        .collect();
    assert_eq!(
        recs.iter().map(|r| r.port_num).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert!(recs.iter().all(|r| r.lid == 1));
}
