//! The embedded SA's records beyond Path, Node and PortInfo, as OpenSM serves them.
//!
//! ClassPortInfo, PortInfoRecord with the component mask (`saquery -s`),
//! LinkRecord, SMInfoRecord, SwitchInfoRecord, LFT and MFT records,
//! MCMemberRecord (the IPv4 broadcast group, joins and leaves that program the
//! switch's MFT, new groups, the join checks), the multicast PathRecord,
//! ServiceRecord and MultiPathRecord, from test CAs to the SM's LID on the fake
//! model clock.

use sim::fabric::packet::{MAD_LEN, MadHdr, method};

use crate::net::{Net, SM_GUID};

const SEC: u64 = 1_000_000_000;
const PREFIX: u64 = 0xfe80_0000_0000_0000;
const GET_TABLE: u8 = 0x12;
const GET_MULTI: u8 = 0x14;
const DELETE: u8 = 0x15;
const BCAST: [u8; 16] = [
    0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
];

fn up() -> Net {
    let mut net = Net::star(2);
    assert!(net.run_until(5 * SEC, |n| n.sm_master()));
    net
}

fn gid(guid: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&PREFIX.to_be_bytes());
    g[8..].copy_from_slice(&guid.to_be_bytes());
    g
}

fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// A request to the SA.
struct Q<'a> {
    from: usize,
    meth: u8,
    attr: u16,
    cm: u64,
    data: &'a [u8],
    key: u64,
    amod: u32,
}

impl<'a> Q<'a> {
    fn new(meth: u8, attr: u16, cm: u64, data: &'a [u8]) -> Q<'a> {
        Q {
            from: 0,
            meth,
            attr,
            cm,
            data,
            key: 0,
            amod: 0,
        }
    }
}

/// The answer: status, method, attribute, AttributeOffset, records
/// (a table reassembled from its RMPP segments).
#[derive(Debug)]
struct A {
    status: u16,
    method: u8,
    attr: u16,
    recs: Vec<Vec<u8>>,
    mad: [u8; MAD_LEN],
}

static TID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0x5a00);

fn ask(net: &mut Net, q: &Q) -> Option<A> {
    let tid = TID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut m = [0u8; MAD_LEN];
    MadHdr {
        base_version: 1,
        mgmt_class: 0x03,
        class_version: 2,
        method: q.meth,
        tid,
        attr_id: q.attr,
        attr_mod: q.amod,
        ..MadHdr::default()
    }
    .write(&mut m);
    if q.meth == GET_MULTI {
        // GetMulti comes as a one-segment RMPP transfer.
        m[24] = 1;
        m[25] = 1;
        m[26] = 0x07;
        m[28..32].copy_from_slice(&1u32.to_be_bytes());
        m[32..36].copy_from_slice(&(20 + q.data.len() as u32).to_be_bytes());
    }
    m[36..44].copy_from_slice(&q.key.to_be_bytes());
    m[48..56].copy_from_slice(&q.cm.to_be_bytes());
    m[56..56 + q.data.len()].copy_from_slice(q.data);
    let sm_lid = net.f.sm().unwrap().lid();
    assert!(net.send_gmp(q.from, sm_lid, &m));
    net.run_for(10_000);
    let mut got: Vec<Vec<u8>> = net
        .take_mads(q.from)
        .into_iter()
        .map(|(_, m)| m)
        .filter(|m| MadHdr::parse(m).is_ok_and(|h| h.tid == tid))
        .collect();
    if got.is_empty() {
        return None;
    }
    let first = got.remove(0);
    let h = MadHdr::parse(&first).unwrap();
    let off = usize::from(be16(&first, 44)) * 8;
    let mut data = first[56..].to_vec();
    let rmpp = first[24] == 1 && first[26] & 1 != 0;
    if rmpp {
        let total = be32(&first, 32) as usize - 20;
        let mut last = first[26] & 0x04 != 0;
        let mut seg = 1u32;
        while !last {
            // ACK with a window wide enough for the rest.
            let mut ack = [0u8; MAD_LEN];
            ack[..56].copy_from_slice(&first[..56]);
            ack[3] ^= 0x80;
            ack[24] = 1;
            ack[25] = 2;
            ack[26] = 1;
            ack[28..32].copy_from_slice(&seg.to_be_bytes());
            ack[32..36].copy_from_slice(&(seg + 64).to_be_bytes());
            assert!(net.send_gmp(q.from, sm_lid, &ack));
            net.run_for(10_000);
            let more: Vec<Vec<u8>> = net
                .take_mads(q.from)
                .into_iter()
                .map(|(_, m)| m)
                .filter(|m| MadHdr::parse(m).is_ok_and(|h| h.tid == tid))
                .collect();
            assert!(!more.is_empty(), "the transfer goes on");
            for m in more {
                seg += 1;
                last = m[26] & 0x04 != 0;
                if last {
                    let n = be32(&m, 32) as usize - 20;
                    data.extend_from_slice(&m[56..56 + n]);
                } else {
                    data.extend_from_slice(&m[56..]);
                }
            }
        }
        data.truncate(total);
        let mut ack = [0u8; MAD_LEN];
        ack[..56].copy_from_slice(&first[..56]);
        ack[3] ^= 0x80;
        ack[24] = 1;
        ack[25] = 2;
        ack[26] = 1;
        ack[28..32].copy_from_slice(&seg.to_be_bytes());
        ack[32..36].copy_from_slice(&seg.to_be_bytes());
        assert!(net.send_gmp(q.from, sm_lid, &ack));
        net.run_for(10_000);
    }
    let recs = if rmpp {
        if off == 0 {
            Vec::new()
        } else {
            data.chunks(off).map(<[u8]>::to_vec).collect()
        }
    } else {
        vec![data]
    };
    Some(A {
        status: h.status,
        method: h.method,
        attr: h.attr_id,
        recs,
        mad: first.try_into().unwrap(),
    })
}

fn ok(net: &mut Net, q: &Q) -> A {
    let a = ask(net, q).expect("an answer");
    assert_eq!(a.status, 0, "{a:?}");
    a
}

#[test]
fn class_port_info_is_opensms() {
    let mut net = up();
    let a = ok(&mut net, &Q::new(method::GET, 0x01, 0, &[]));
    let d = &a.recs[0];
    assert_eq!((d[0], d[1]), (1, 2));
    assert_eq!(be16(d, 2), 0x2602, "CapabilityMask");
    assert_eq!(be32(d, 4) & 0x1f, 16, "RespTimeValue: 200 ms");
    assert_eq!(be32(d, 4) >> 5, 0xb5e8, "CapabilityMask2");
    assert_eq!(be32(d, 32), 1, "RedirectQP");
    assert_eq!(be32(d, 36), 0x8001_0000, "RedirectQ_Key");
    assert_eq!(be32(d, 68), 0x8001_0000, "TrapQ_Key");
    let a = ask(&mut net, &Q::new(GET_TABLE, 0x01, 0, &[])).unwrap();
    assert_eq!(a.status, 0x0200, "GetTable: REQ_INVALID");
}

#[test]
fn port_info_records_filter_on_the_mask_and_list_the_sm_ports() {
    let mut net = up();
    let sm_lid = net.f.sm().unwrap().lid();
    // saquery -s: CapabilityMask IsSM, bitwise (modifier bit 31).
    let mut q = [0u8; 72];
    q[4 + 20..4 + 24].copy_from_slice(&2u32.to_be_bytes());
    let a = ok(
        &mut net,
        &Q {
            amod: 1 << 31,
            ..Q::new(GET_TABLE, 0x12, 1 << 7, &q)
        },
    );
    assert_eq!(a.recs.len(), 1, "the SM's port only");
    assert_eq!(be16(&a.recs[0], 0), sm_lid);
    // Without bit 31 the mask must be equal: the SM's port has exactly
    // IsSM; nothing has IsSM and IsClientReregistration.
    let a = ok(&mut net, &Q::new(GET_TABLE, 0x12, 1 << 7, &q));
    assert_eq!(a.recs.len(), 1);
    q[4 + 20..4 + 24].copy_from_slice(&(2u32 | 1 << 25).to_be_bytes());
    let a = ok(
        &mut net,
        &Q {
            amod: 1 << 31,
            ..Q::new(GET_TABLE, 0x12, 1 << 7, &q)
        },
    );
    assert!(a.recs.is_empty());
    // PortState Active (component 15): every port but none Down.
    let mut q = [0u8; 72];
    q[4 + 32] = 4;
    let a = ok(&mut net, &Q::new(GET_TABLE, 0x12, 1 << 15, &q));
    assert_eq!(
        a.recs.len(),
        3 + 4,
        "2 CAs, the SM, the switch's port 0 and 3 cabled ports"
    );
    // The M_Key shows to a trusted request only (both are 0 here).
    let a = ok(
        &mut net,
        &Q {
            key: 1,
            ..Q::new(GET_TABLE, 0x12, 1 << 15, &q)
        },
    );
    assert_eq!(a.recs.len(), 7);
    // A foreign SM_Key: dropped.
    assert!(
        ask(
            &mut net,
            &Q {
                key: 9,
                ..Q::new(GET_TABLE, 0x12, 0, &[])
            }
        )
        .is_none()
    );
}

#[test]
fn link_sminfo_switchinfo_and_lft_records() {
    let mut net = up();
    let sm_lid = net.f.sm().unwrap().lid();
    let sw_lid = net.f.switch(net.sw).unwrap().lid();
    let a = ok(&mut net, &Q::new(GET_TABLE, 0x20, 0, &[]));
    assert_eq!(a.recs.len(), 6, "three cables, both ends");
    let mut q = [0u8; 8];
    q[0..2].copy_from_slice(&net.cas[0].lid.to_be_bytes());
    let a = ok(&mut net, &Q::new(method::GET, 0x20, 1, &q));
    let r = &a.recs[0];
    assert_eq!(
        (be16(r, 0), r[2], r[3], be16(r, 4)),
        (net.cas[0].lid, 1, 1, sw_lid)
    );
    let a = ok(&mut net, &Q::new(GET_TABLE, 0x18, 0, &[]));
    assert_eq!(a.recs.len(), 1);
    let r = &a.recs[0];
    assert_eq!(be16(r, 0), sm_lid);
    assert_eq!(&r[4..12], &(SM_GUID + 1).to_be_bytes());
    assert_eq!(&r[12..20], &[0; 8], "no SM_Key shown");
    assert_eq!(r[24], 15 << 4 | 3, "priority 15, MASTER");
    let a = ok(&mut net, &Q::new(GET_TABLE, 0x14, 0, &[]));
    assert_eq!(a.recs.len(), 1);
    assert_eq!(be16(&a.recs[0], 0), sw_lid);
    assert_eq!(be16(&a.recs[0], 4 + 4), 1024, "MulticastFDBCap");
    let mut q = [0u8; 72];
    q[0..2].copy_from_slice(&sw_lid.to_be_bytes());
    let a = ok(&mut net, &Q::new(GET_TABLE, 0x15, 1, &q));
    let r = &a.recs[0];
    let (la, lb) = (net.cas[0].lid, net.cas[1].lid);
    assert_eq!(
        (
            r[8 + usize::from(la)],
            r[8 + usize::from(lb)],
            r[8 + usize::from(sm_lid)]
        ),
        (1, 2, 3)
    );
    // A Set of a read-only record: UNSUP_METHOD_ATTR.
    let a = ask(&mut net, &Q::new(method::SET, 0x15, 0, &[])).unwrap();
    assert_eq!(a.status, 0x000c);
}

fn mcm(mgid: &[u8; 16], port_guid: u64, join_state: u8) -> [u8; 56] {
    let mut r = [0u8; 56];
    r[0..16].copy_from_slice(mgid);
    r[16..32].copy_from_slice(&gid(port_guid));
    r[48] = join_state;
    r
}

const JOIN: u64 = 1 | 1 << 1 | 1 << 16;
/// Q_Key, TClass, P_Key, FlowLabel and SL besides the join's.
const CREATE: u64 = JOIN | 1 << 2 | 1 << 6 | 1 << 7 | 1 << 13 | 1 << 12;

#[test]
fn joins_and_leaves_program_the_switch_mft() {
    let mut net = up();
    let (ga, gb) = (net.cas[0].port_guid(), net.cas[1].port_guid());
    // The broadcast group exists from the first sweep.
    let a = ok(&mut net, &Q::new(GET_TABLE, 0x38, 0, &[]));
    assert_eq!(a.recs.len(), 1);
    let r = &a.recs[0];
    assert_eq!(&r[0..16], &BCAST);
    assert_eq!(be32(r, 32), 0x0b1b, "Q_Key");
    assert_eq!(be16(r, 36), 0xc000, "MLID");
    assert_eq!((r[38], r[42]), (0x84, 0x83), "exactly 2048, 10 Gb/s");
    assert_eq!(be16(r, 40), 0xffff);
    assert_eq!(r[48], 0x20, "link-local scope, no JoinState untrusted");
    assert!(net.f.switch(net.sw).unwrap().mft_ports(0xc000).is_empty());
    // CA 0 joins (IPoIB's mask): the MFT sends the group to its port.
    let a = ok(
        &mut net,
        &Q::new(method::SET, 0x38, JOIN, &mcm(&BCAST, ga, 1)),
    );
    assert_eq!(a.method, method::GET_RESP);
    let r = &a.recs[0];
    assert_eq!((be16(r, 36), r[48], be32(r, 32)), (0xc000, 0x21, 0x0b1b));
    assert_eq!(&r[16..32], &gid(ga));
    net.run_for(SEC / 100);
    assert_eq!(net.f.switch(net.sw).unwrap().mft_ports(0xc000), vec![1]);
    let jb = mcm(&BCAST, gb, 1);
    let b = Q {
        from: 1,
        ..Q::new(method::SET, 0x38, JOIN, &jb)
    };
    ok(&mut net, &b);
    net.run_for(SEC / 100);
    assert_eq!(net.f.switch(net.sw).unwrap().mft_ports(0xc000), vec![1, 2]);
    // The MFT record says the same.
    let a = ok(&mut net, &Q::new(GET_TABLE, 0x17, 0, &[]));
    assert_eq!(a.recs.len(), 3, "block 0 at port positions 0, 1, 2");
    assert_eq!(be16(&a.recs[0], 8), 0b110, "MLID 0xC000: ports 1 and 2");
    // Members by a trusted query; untrusted, no PortGID.
    let a = ok(
        &mut net,
        &Q {
            key: 1,
            ..Q::new(GET_TABLE, 0x38, 0, &[])
        },
    );
    assert_eq!(a.recs.len(), 2);
    let mut q = [0u8; 56];
    q[16..32].copy_from_slice(&gid(ga));
    let a = ok(&mut net, &Q::new(method::GET, 0x38, 1 << 1, &q));
    assert_eq!(&a.recs[0][16..32], &[0; 16], "PortGID only when trusted");
    // The group's path: by its MGID.
    let mut p = [0u8; 64];
    p[8..24].copy_from_slice(&BCAST);
    p[24..40].copy_from_slice(&gid(ga));
    let a = ok(&mut net, &Q::new(method::GET, 0x35, 1 << 2 | 1 << 3, &p));
    let r = &a.recs[0];
    assert_eq!(&r[8..24], &BCAST);
    assert_eq!(be16(r, 40), 0xc000, "DLID: the MLID");
    assert_eq!((r[49], r[54], r[55], be16(r, 50)), (1, 0x84, 0x83, 0xffff));
    // A multicast DGID with a unicast DLID: INVALID_FIELD.
    p[40..42].copy_from_slice(&3u16.to_be_bytes());
    let a = ask(&mut net, &Q::new(method::GET, 0x35, 1 << 2 | 1 << 4, &p)).unwrap();
    assert_eq!(a.status, 0x001c);
    // CA 0 leaves; a second leave holds nothing.
    let a = ok(&mut net, &Q::new(DELETE, 0x38, JOIN, &mcm(&BCAST, ga, 1)));
    assert_eq!(a.method, 0x95, "DeleteResp");
    net.run_for(SEC / 100);
    assert_eq!(net.f.switch(net.sw).unwrap().mft_ports(0xc000), vec![2]);
    let a = ask(&mut net, &Q::new(DELETE, 0x38, JOIN, &mcm(&BCAST, ga, 1))).unwrap();
    assert_eq!(a.status, 0x0200);
    assert!(net.f.sm().unwrap().stats().mft_blocks >= 9);
}

#[test]
fn new_groups_and_the_join_checks() {
    let mut net = up();
    let ga = net.cas[0].port_guid();
    let mgid: [u8; 16] = [0xff, 0x15, 0xa0, 0x1b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
    // Without JoinState: INSUF_COMPS.
    let a = ask(
        &mut net,
        &Q::new(method::SET, 0x38, 1 | 1 << 1, &mcm(&BCAST, ga, 1)),
    )
    .unwrap();
    assert_eq!(a.status, 0x0600);
    // A new group without Q_Key, TClass, P_Key, FlowLabel and SL.
    let a = ask(
        &mut net,
        &Q::new(method::SET, 0x38, JOIN, &mcm(&mgid, ga, 1)),
    )
    .unwrap();
    assert_eq!(a.status, 0x0600);
    // Created by a non-member: REQ_INVALID.
    let a = ask(
        &mut net,
        &Q::new(method::SET, 0x38, CREATE, &mcm(&mgid, ga, 2)),
    )
    .unwrap();
    assert_eq!(a.status, 0x0200);
    // An invalid MGID.
    let mut bad = mgid;
    bad[1] = 0x12;
    let a = ask(
        &mut net,
        &Q::new(method::SET, 0x38, CREATE, &mcm(&bad, ga, 1)),
    )
    .unwrap();
    assert_eq!(a.status, 0x0200, "SA signature with link-local scope");
    // An MTU the port cannot carry (exactly 4096 on a 2048 port).
    let mut r = mcm(&mgid, ga, 1);
    r[38] = 2 << 6 | 5;
    let a = ask(
        &mut net,
        &Q::new(method::SET, 0x38, CREATE | 1 << 4 | 1 << 5, &r),
    )
    .unwrap();
    assert_eq!(a.status, 0x0200);
    // Made: the next MLID, the port's MTU and rate, the MFT entry.
    let mut r = mcm(&mgid, ga, 1);
    r[32..36].copy_from_slice(&0x1234u32.to_be_bytes());
    r[40..42].copy_from_slice(&0xffffu16.to_be_bytes());
    let a = ok(&mut net, &Q::new(method::SET, 0x38, CREATE, &r));
    let g = &a.recs[0];
    assert_eq!(be16(g, 36), 0xc001);
    assert_eq!((g[38], g[42], be32(g, 32)), (0x84, 0x83, 0x1234));
    net.run_for(SEC / 100);
    assert_eq!(net.f.switch(net.sw).unwrap().mft_ports(0xc001), vec![1]);
    // Joining the broadcast group asking exactly 4096: the group is 2048.
    let mut r = mcm(&BCAST, ga, 1);
    r[38] = 2 << 6 | 5;
    let a = ask(
        &mut net,
        &Q::new(method::SET, 0x38, JOIN | 1 << 4 | 1 << 5, &r),
    )
    .unwrap();
    assert_eq!(a.status, 0x0200);
    // Another port may not change CA 0's membership.
    let a = ask(
        &mut net,
        &Q {
            from: 1,
            ..Q::new(DELETE, 0x38, JOIN, &mcm(&mgid, ga, 1))
        },
    )
    .unwrap();
    assert_eq!(a.status, 0x0200);
    // The last member leaves: the group goes, and its MFT entry.
    ok(&mut net, &Q::new(DELETE, 0x38, JOIN, &mcm(&mgid, ga, 1)));
    net.run_for(SEC / 100);
    assert!(net.f.switch(net.sw).unwrap().mft_ports(0xc001).is_empty());
    let a = ok(&mut net, &Q::new(GET_TABLE, 0x38, 0, &[]));
    assert_eq!(a.recs.len(), 1, "the broadcast group stays");
}

#[test]
fn service_records_set_get_delete() {
    let mut net = up();
    let gb = gid(net.cas[1].port_guid());
    let mut sr = [0u8; 176];
    sr[0..8].copy_from_slice(&0x1000_0000_0000_0001u64.to_be_bytes());
    sr[8..24].copy_from_slice(&gb);
    sr[32..48].copy_from_slice(&[0x5a; 16]);
    sr[48..55].copy_from_slice(b"legoib1");
    let a = ask(&mut net, &Q::new(method::SET, 0x31, 1 << 6, &sr)).unwrap();
    assert_eq!(a.status, 0x0200, "a Set without ServiceID and GID");
    let a = ok(
        &mut net,
        &Q::new(method::SET, 0x31, 0b11 | 1 << 5 | 1 << 6, &sr),
    );
    assert_eq!(a.method, method::GET_RESP);
    assert_eq!(be16(&a.recs[0], 24), 0xffff, "P_Key filled in");
    let mut q = [0u8; 176];
    q[48..55].copy_from_slice(b"legoib1");
    let a = ok(&mut net, &Q::new(method::GET, 0x31, 1 << 6, &q));
    assert_eq!(&a.recs[0][8..24], &gb);
    assert_eq!(&a.recs[0][32..48], &[0; 16], "ServiceKey hidden untrusted");
    let a = ok(
        &mut net,
        &Q {
            key: 1,
            ..Q::new(method::GET, 0x31, 1 << 6, &q)
        },
    );
    assert_eq!(&a.recs[0][32..48], &[0x5a; 16]);
    ok(&mut net, &Q::new(DELETE, 0x31, 0b11, &sr));
    let a = ask(&mut net, &Q::new(DELETE, 0x31, 0b11, &sr)).unwrap();
    assert_eq!(a.status, 0x0300, "gone");
    let a = ask(&mut net, &Q::new(method::GET, 0x31, 1 << 6, &q)).unwrap();
    assert_eq!(a.status, 0x0300);
}

#[test]
fn multipath_records_answer_getmulti_with_path_records() {
    let mut net = up();
    let (la, lb) = (net.cas[0].lid, net.cas[1].lid);
    let mut mpr = [0u8; 200];
    mpr[15] = 1;
    mpr[16] = 1;
    mpr[24..40].copy_from_slice(&gid(net.cas[0].port_guid()));
    mpr[40..56].copy_from_slice(&gid(net.cas[1].port_guid()));
    let a = ok(&mut net, &Q::new(GET_MULTI, 0x3a, 1 << 19 | 1 << 20, &mpr));
    assert_eq!(
        (a.method, a.attr),
        (0x94, 0x35),
        "GetMultiResp of PathRecords"
    );
    assert_eq!(a.recs.len(), 1);
    assert_eq!((be16(&a.recs[0], 40), be16(&a.recs[0], 42)), (lb, la));
    let a = ask(&mut net, &Q::new(GET_MULTI, 0x3a, 1 << 19, &mpr)).unwrap();
    assert_eq!(a.status, 0x0600, "no DGIDCount");
    let a = ask(&mut net, &Q::new(method::GET, 0x3a, 0, &mpr)).unwrap();
    assert_eq!(a.status, 0x000c);
    let _ = a.mad;
}
