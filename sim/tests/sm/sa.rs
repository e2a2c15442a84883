//! SA queries from a CA to the SM's LID, checked field by field against
//! the IBTA layouts (15.2.1 SA header, 15.2.5.16 PathRecord, 15.2.5.2
//! NodeRecord, 15.2.5.3 PortInfoRecord).

use sim::fabric::packet::{MAD_LEN, MadHdr, method};

use crate::net::{Net, SM_GUID};

const SEC: u64 = 1_000_000_000;
const PREFIX: u64 = 0xfe80_0000_0000_0000;

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

/// Sends an SA request from CA 0 and returns the answer MAD.
fn query(
    net: &mut Net,
    meth: u8,
    attr_id: u16,
    cm: u64,
    data: &[u8],
    class_version: u8,
) -> [u8; MAD_LEN] {
    query_opt(net, meth, attr_id, cm, data, class_version).expect("one answer")
}

/// [`query`], or `None` if the SA stays silent (as OpenSM does for what
/// it drops).
fn query_opt(
    net: &mut Net,
    meth: u8,
    attr_id: u16,
    cm: u64,
    data: &[u8],
    class_version: u8,
) -> Option<[u8; MAD_LEN]> {
    let mut m = [0u8; MAD_LEN];
    let tid = 0xabc0 + u64::from(attr_id);
    MadHdr {
        base_version: 1,
        mgmt_class: 0x03,
        class_version,
        method: meth,
        tid,
        attr_id,
        ..MadHdr::default()
    }
    .write(&mut m);
    m[48..56].copy_from_slice(&cm.to_be_bytes());
    m[56..56 + data.len()].copy_from_slice(data);
    let sm_lid = net.f.sm().unwrap().lid();
    assert!(net.send_gmp(0, sm_lid, &m));
    net.run_for(10_000);
    let got = net.take_mads(0);
    if got.is_empty() {
        return None;
    }
    assert_eq!(got.len(), 1, "one answer");
    let (p, mad) = &got[0];
    assert_eq!(p.hdr.lrh.slid, sm_lid, "from the SM's LID");
    assert_eq!(p.hdr.deth.unwrap().src_qp, 1, "from QP1");
    assert_eq!(p.hdr.bth.dest_qp, 1);
    let h = MadHdr::parse(mad).unwrap();
    assert_eq!(h.tid, tid);
    Some(mad[..MAD_LEN].try_into().unwrap())
}

fn status(m: &[u8]) -> u16 {
    u16::from_be_bytes([m[4], m[5]])
}

const DGID: u64 = 1 << 2;
const SGID: u64 = 1 << 3;
const DLID: u64 = 1 << 4;
const SLID: u64 = 1 << 5;
const PKEY: u64 = 1 << 13;
const MTU_SEL: u64 = 1 << 16;
const MTU: u64 = 1 << 17;

#[test]
fn path_record_by_lids_and_by_gids() {
    let mut net = up();
    let (a, b) = (net.cas[0].lid, net.cas[1].lid);
    let (ga, gb) = (net.cas[0].port_guid(), net.cas[1].port_guid());
    let mut d = [0u8; 64];
    d[40..42].copy_from_slice(&b.to_be_bytes());
    d[42..44].copy_from_slice(&a.to_be_bytes());
    let r = query(&mut net, method::GET, 0x35, DLID | SLID, &d, 2);
    assert_eq!(r[3], method::GET_RESP);
    assert_eq!(status(&r), 0);
    let rec = &r[56..120];
    assert_eq!(&rec[8..24], &gid(gb), "DGID");
    assert_eq!(&rec[24..40], &gid(ga), "SGID");
    assert_eq!(&rec[40..42], &b.to_be_bytes(), "DLID");
    assert_eq!(&rec[42..44], &a.to_be_bytes(), "SLID");
    assert_eq!(
        &rec[44..48],
        &[0, 0, 0, 0],
        "RawTraffic 0, FlowLabel 0, HopLimit 0"
    );
    assert_eq!(rec[49], 0x80, "reversible, NumbPath 0");
    assert_eq!(&rec[50..52], &[0xff, 0xff], "P_Key");
    assert_eq!(u16::from_be_bytes([rec[52], rec[53]]) & 0xf, 0, "SL 0");
    assert_eq!(rec[54], 0x80 | 4, "MTU exactly 2048: the CAs' MTUCap");
    assert_eq!(
        rec[55],
        0x80 | 3,
        "rate exactly 10 Gb/s: the CAs' 4x SDR links"
    );
    assert_eq!(rec[56], 0x80 | 18, "packet lifetime exactly 18");
    // A DGID alone names a path from every port (OpenSM's "half" case):
    // too many for a Get.
    let mut d = [0u8; 64];
    d[8..24].copy_from_slice(&gid(gb));
    let r = query(&mut net, method::GET, 0x35, DGID, &d, 2);
    assert_eq!(status(&r), 0x0400, "TOO_MANY_RECORDS");
    // Both GIDs.
    d[24..40].copy_from_slice(&gid(ga));
    let r = query(&mut net, method::GET, 0x35, DGID | SGID, &d, 2);
    assert_eq!(status(&r), 0);
    assert_eq!(
        &r[56 + 40..56 + 44],
        &[b.to_be_bytes(), a.to_be_bytes()].concat()
    );
    // To the SM's own port (the switch's QDR ports do not lower the CA's rate).
    let mut d = [0u8; 64];
    d[8..24].copy_from_slice(&gid(SM_GUID + 1));
    d[24..40].copy_from_slice(&gid(ga));
    let r = query(&mut net, method::GET, 0x35, DGID | SGID, &d, 2);
    assert_eq!(status(&r), 0);
    assert_eq!(
        &r[56 + 40..56 + 42],
        &net.f.sm().unwrap().lid().to_be_bytes()
    );
    assert_eq!(r[56 + 55], 0x80 | 3);
    // Loopback: to the requester's own port, PacketLifeTime 0.
    let mut d = [0u8; 64];
    d[40..42].copy_from_slice(&a.to_be_bytes());
    d[42..44].copy_from_slice(&a.to_be_bytes());
    let r = query(&mut net, method::GET, 0x35, DLID | SLID, &d, 2);
    assert_eq!(status(&r), 0);
    assert_eq!(r[56 + 56], 0x80, "loopback PacketLifeTime 0");
}

#[test]
fn path_record_refusals_carry_the_sa_status() {
    let mut net = up();
    let b = net.cas[1].lid;
    // No end point in a Get: every pair (OpenSM's "world"), too many.
    let r = query(&mut net, method::GET, 0x35, 0, &[0u8; 64], 2);
    assert_eq!(status(&r), 0x0400);
    // Half a ServiceID: insufficient components.
    let r = query(&mut net, method::GET, 0x35, 1, &[0u8; 64], 2);
    assert_eq!(status(&r), 0x0600);
    // A GUID nobody has: no records.
    let mut d = [0u8; 64];
    d[8..24].copy_from_slice(&gid(0x1234));
    let r = query(&mut net, method::GET, 0x35, DGID, &d, 2);
    assert_eq!(status(&r), 0x0300);
    // A GID from another subnet: no records (OpenSM 3.3.23 finds the
    // end point invalid and answers the empty list).
    d[9] = 0xc0; // fec0::
    let r = query(&mut net, method::GET, 0x35, DGID, &d, 2);
    assert_eq!(status(&r), 0x0300);
    // A partition that does not exist: no records.
    let mut d = [0u8; 64];
    d[40..42].copy_from_slice(&b.to_be_bytes());
    d[50..52].copy_from_slice(&0x8001u16.to_be_bytes());
    let r = query(&mut net, method::GET, 0x35, DLID | PKEY, &d, 2);
    assert_eq!(status(&r), 0x0300);
    // MTU greater than 2048 (selector 0): none.
    let mut d = [0u8; 64];
    d[40..42].copy_from_slice(&b.to_be_bytes());
    d[42..44].copy_from_slice(&net.cas[0].lid.to_be_bytes());
    d[54] = 4;
    let r = query(
        &mut net,
        method::GET,
        0x35,
        DLID | SLID | MTU | MTU_SEL,
        &d,
        2,
    );
    assert_eq!(status(&r), 0x0300);
    // Less than 4096 (selector 1): found.
    d[54] = 1 << 6 | 5;
    let r = query(
        &mut net,
        method::GET,
        0x35,
        DLID | SLID | MTU | MTU_SEL,
        &d,
        2,
    );
    assert_eq!(status(&r), 0);
    // A class version the SA does not speak (the host's MAD layer answers
    // for OpenSM), a method PathRecord does not take, an attribute OpenSM
    // does not serve (dropped: ERR 1A01).
    let r = query(&mut net, method::GET, 0x35, DLID, &d, 1);
    assert_eq!(status(&r), 0x000c);
    let r = query(&mut net, method::SET, 0x35, DLID, &d, 2);
    assert_eq!(status(&r), 0x000c, "UNSUP_METHOD_ATTR");
    assert!(query_opt(&mut net, method::GET, 0x0099, 0, &d, 2).is_none());
}

/// Sends an RMPP ACK (or with `rtype` 3/4 a STOP/ABORT) for `seg` of
/// transfer `tid`, as a receiver does (IBTA 13.6.4: the DATA header with
/// the response bit cleared).
fn rmpp_ack(net: &mut Net, data_mad: &[u8], seg: u32, newwin: u32, rtype: u8) {
    let mut m = [0u8; MAD_LEN];
    m[..56].copy_from_slice(&data_mad[..56]);
    m[3] ^= 0x80;
    m[24] = 1;
    m[25] = rtype;
    m[26] = 0x01;
    m[27] = 0;
    m[28..32].copy_from_slice(&seg.to_be_bytes());
    m[32..36].copy_from_slice(&newwin.to_be_bytes());
    let sm_lid = net.f.sm().unwrap().lid();
    assert!(net.send_gmp(0, sm_lid, &m));
    net.run_for(10_000);
}

fn segs(net: &mut Net) -> Vec<Vec<u8>> {
    net.take_mads(0).into_iter().map(|(_, m)| m).collect()
}

/// Receives a whole RMPP transfer whose first segment is `first`, with a
/// window of `w` segments; returns the data (SA data of every segment,
/// cut to the last segment's PayloadLength).
fn rmpp_receive(net: &mut Net, first: &[u8], w: u32) -> Vec<u8> {
    let be32 = |m: &[u8], o: usize| u32::from_be_bytes([m[o], m[o + 1], m[o + 2], m[o + 3]]);
    assert_eq!(first[26] & 0x03, 0x03, "active, first");
    assert_eq!(be32(first, 28), 1);
    let total = be32(first, 32) as usize - 20;
    let mut data = first[56..].to_vec();
    let mut last = first[26] & 0x04 != 0;
    let mut seg = 1;
    while !last {
        rmpp_ack(net, first, seg, seg + w, 2);
        let got = segs(net);
        assert!(
            !got.is_empty() && got.len() as u32 <= w,
            "{} segments in a window of {w}",
            got.len()
        );
        for m in got {
            seg += 1;
            assert_eq!(be32(&m, 28), seg, "in order");
            assert_eq!(m[26] & 0x02, 0, "only the first is first");
            let paylen = be32(&m, 32) as usize;
            last = m[26] & 0x04 != 0;
            if last {
                data.extend_from_slice(&m[56..56 + paylen - 20]);
            } else {
                assert_eq!(paylen, 0, "middle segments carry no PayloadLength");
                data.extend_from_slice(&m[56..]);
            }
        }
    }
    rmpp_ack(net, first, seg, seg, 2);
    assert!(segs(net).is_empty(), "nothing after the last ACK");
    assert_eq!(data.len(), total, "PayloadLength of the first = the data");
    data
}

#[test]
fn get_tables_come_as_rmpp_transfers_under_the_receivers_window() {
    let mut net = up();
    // Paths from CA 0 to all 4 end ports: 256 bytes, two segments.
    let mut d = [0u8; 64];
    d[42..44].copy_from_slice(&net.cas[0].lid.to_be_bytes());
    let r = query(&mut net, 0x12, 0x35, SLID, &d, 2);
    assert_eq!(r[3], 0x92, "GetTableResp");
    assert_eq!(status(&r), 0);
    assert_eq!(
        u16::from_be_bytes([r[44], r[45]]),
        8,
        "AttributeOffset: 64 bytes"
    );
    assert_eq!(&r[24..26], &[1, 1], "RMPP v1 DATA");
    assert_eq!(r[26] >> 3, 0x1f, "no response time");
    assert_eq!(&r[32..36], &(20u32 + 4 * 64).to_be_bytes(), "PayloadLength");
    let data = rmpp_receive(&mut net, &r, 1);
    let a = net.cas[0].lid;
    let mut dlids: Vec<u16> = data
        .chunks(64)
        .map(|rec| {
            assert_eq!(&rec[42..44], &a.to_be_bytes(), "all from the requester");
            u16::from_be_bytes([rec[40], rec[41]])
        })
        .collect();
    dlids.sort();
    let mut want: Vec<u16> = net.f.sm().unwrap().subnet().iter().map(|e| e.lid).collect();
    want.sort();
    assert_eq!(dlids, want);
    // NodeRecords of the 4 nodes (112 bytes each): 3 segments, window 2.
    let r = query(&mut net, 0x12, 0x11, 0, &[0u8; 108], 2);
    let data = rmpp_receive(&mut net, &r, 2);
    assert_eq!(data.len(), 4 * 112);
    let descs: Vec<String> = data
        .chunks(112)
        .map(|c| {
            String::from_utf8_lossy(&c[44..108])
                .trim_end_matches('\0')
                .to_string()
        })
        .collect();
    assert!(
        descs.contains(&"node1 HCA-1".to_string()) && descs.contains(&"embedded SM".to_string()),
        "{descs:?}"
    );
    // The switch's 37 PortInfoRecords (72 bytes each), window 5.
    let sw_lid = net.f.switch(net.sw).unwrap().lid();
    let mut d = [0u8; 72];
    d[0..2].copy_from_slice(&sw_lid.to_be_bytes());
    let r = query(&mut net, 0x12, 0x12, 1, &d, 2);
    let data = rmpp_receive(&mut net, &r, 5);
    assert_eq!(data.len(), 37 * 72);
    for (i, rec) in data.chunks(72).enumerate() {
        assert_eq!(rec[2] as usize, i, "PortNum");
    }
    let st = net.f.sm().unwrap().stats().clone();
    assert_eq!((st.sa_rmpp_transfers, st.sa_rmpp_aborted), (3, 0));
}

#[test]
fn an_unacknowledged_transfer_is_resent_then_dropped_and_stop_ends_one() {
    let mut net = up();
    let r = query(&mut net, 0x12, 0x11, 0, &[0u8; 108], 2);
    assert_eq!(r[26] & 0x07, 0x03);
    // No ACK: segment 1 again after the RMPP timeout (1 s), 3 times.
    net.run_for(1_100_000_000);
    let again = segs(&mut net);
    assert_eq!(again.len(), 1);
    assert_eq!(&again[0][28..32], &1u32.to_be_bytes());
    net.run_for(5 * SEC);
    assert_eq!(segs(&mut net).len(), 3, "resent up to the retry count");
    assert_eq!(net.f.sm().unwrap().stats().sa_rmpp_aborted, 1);
    // A STOP after the first segment ends the transfer at once.
    let r = query(&mut net, 0x12, 0x11, 0, &[0u8; 108], 2);
    rmpp_ack(&mut net, &r, 1, 1, 3);
    net.run_for(5 * SEC);
    assert!(segs(&mut net).is_empty());
    assert_eq!(net.f.sm().unwrap().stats().sa_rmpp_aborted, 2);
    // A small table still fits one MAD: one segment, first and last.
    let b = net.cas[1].lid;
    let mut d = [0u8; 64];
    d[40..42].copy_from_slice(&b.to_be_bytes());
    d[42..44].copy_from_slice(&net.cas[0].lid.to_be_bytes());
    let r = query(&mut net, 0x12, 0x35, 1 << 4 | 1 << 5, &d, 2);
    assert_eq!(r[26] & 0x07, 0x07);
    assert_eq!(&r[32..36], &(20u32 + 64).to_be_bytes());
}

#[test]
fn node_record_by_lid_and_by_guid() {
    let mut net = up();
    let b = net.cas[1].lid;
    let mut d = [0u8; 108];
    d[0..2].copy_from_slice(&b.to_be_bytes());
    let r = query(&mut net, method::GET, 0x11, 1, &d, 2);
    assert_eq!(status(&r), 0);
    let rec = &r[56..56 + 108];
    assert_eq!(&rec[0..2], &b.to_be_bytes(), "LID");
    assert_eq!(rec[4 + 2], 1, "NodeType CA");
    assert_eq!(
        &rec[4 + 12..4 + 20],
        &net.cas[1].node_guid.to_be_bytes(),
        "NodeGUID"
    );
    assert_eq!(
        &rec[4 + 20..4 + 28],
        &net.cas[1].port_guid().to_be_bytes(),
        "PortGUID"
    );
    assert_eq!(&rec[4 + 30..4 + 32], &[0x10, 0x03], "DeviceID");
    assert_eq!(rec[4 + 36], 1, "LocalPortNum");
    assert_eq!(&rec[44..44 + 12], b"node1 HCA-1\0", "NodeDescription");
    assert_eq!(
        u16::from_be_bytes([r[44], r[45]]),
        14,
        "AttributeOffset: 112 bytes"
    );
    // The switch by its NodeGUID (component 7).
    let sw_guid = net.f.switch(net.sw).unwrap().node_guid;
    let mut d = [0u8; 108];
    d[4 + 12..4 + 20].copy_from_slice(&sw_guid.to_be_bytes());
    let r = query(&mut net, method::GET, 0x11, 1 << 7, &d, 2);
    assert_eq!(status(&r), 0);
    assert_eq!(r[56 + 4 + 2], 2, "NodeType switch");
    assert_eq!(
        &r[56..58],
        &net.f.switch(net.sw).unwrap().lid().to_be_bytes()
    );
    assert_eq!(r[56 + 4 + 3], 36, "NumPorts");
    // Every node: more than one record is too many for a Get.
    let r = query(&mut net, method::GET, 0x11, 0, &[0u8; 108], 2);
    assert_eq!(status(&r), 0x0400);
}

#[test]
fn port_info_record_of_a_ca_and_of_a_switch_port() {
    let mut net = up();
    let a = net.cas[0].lid;
    let sm_lid = net.f.sm().unwrap().lid();
    let mut d = [0u8; 72];
    d[0..2].copy_from_slice(&a.to_be_bytes());
    let r = query(&mut net, method::GET, 0x12, 1, &d, 2);
    assert_eq!(status(&r), 0);
    assert_eq!(
        u16::from_be_bytes([r[44], r[45]]),
        9,
        "AttributeOffset: 72 bytes"
    );
    let rec = &r[56..56 + 68];
    assert_eq!(&rec[0..2], &a.to_be_bytes(), "EndportLID");
    assert_eq!(rec[2], 1, "PortNum");
    let pi = &rec[4..68];
    assert_eq!(&pi[8..16], &PREFIX.to_be_bytes(), "GidPrefix");
    assert_eq!(&pi[16..18], &a.to_be_bytes(), "LID");
    assert_eq!(&pi[18..20], &sm_lid.to_be_bytes(), "MasterSMLID");
    assert_eq!(pi[32] & 0xf, 4, "PortState Active");
    assert_eq!(pi[33] >> 4, 5, "LinkUp");
    // Switch port 2 (the cable to CA 1) under the switch's LID.
    let sw_lid = net.f.switch(net.sw).unwrap().lid();
    let mut d = [0u8; 72];
    d[0..2].copy_from_slice(&sw_lid.to_be_bytes());
    d[2] = 2;
    let r = query(&mut net, method::GET, 0x12, 1 | 2, &d, 2);
    assert_eq!(status(&r), 0);
    assert_eq!(r[56 + 2], 2);
    assert_eq!(r[56 + 4 + 32] & 0xf, 4, "switch port 2 Active");
}

#[test]
fn class_port_info_and_a_short_or_corrupt_mad_are_survived() {
    let mut net = up();
    let r = query(&mut net, method::GET, 0x0001, 0, &[], 2);
    assert_eq!(status(&r), 0);
    assert_eq!((r[56], r[57]), (1, 2), "BaseVersion 1, ClassVersion 2");
    // A corrupt packet to the SM: dropped and counted, nothing else.
    let sm_lid = net.f.sm().unwrap().lid();
    let h = sim::fabric::packet::mad_headers(sm_lid, net.cas[0].lid, 1, 1, 0xffff);
    let mut bytes = sim::fabric::packet::build(&h, &[0u8; 40]).unwrap();
    let n = bytes.len();
    bytes[n - 8] ^= 0xff; // ICRC
    sim::fabric::packet::reseal_vcrc(&mut bytes).unwrap();
    let p = net.cas[0].port;
    let before = net.f.sm().unwrap().stats().bad_mads;
    net.f.transmit(p, sim::fabric::Packet { bytes }, net.now);
    net.run_for(10_000);
    assert!(net.take_mads(0).is_empty());
    assert_eq!(net.f.sm().unwrap().stats().bad_mads, before + 1);
    // A short MAD (40 bytes) with a good ICRC: dropped too.
    let bytes = sim::fabric::packet::build(&h, &[0u8; 40]).unwrap();
    net.f.transmit(p, sim::fabric::Packet { bytes }, net.now);
    net.run_for(10_000);
    assert!(net.take_mads(0).is_empty());
    assert_eq!(net.f.sm().unwrap().stats().bad_mads, before + 2);
}
