//! NodeRecord, after OpenSM's `osm_sa_node_record.c`: one record per end port of every node (a switch: port 0 only), the NodeInfo carrying that port's GUID and number, filtered by the component mask.
//!
//! Partition checks are left out (every port is in the default partition).

use super::{Reply, Request, View, be64, has};

/// NodeRecord: LID, reserved, NodeInfo (40), NodeDescription (64).
pub const NODE_RECORD_LEN: usize = 108;

/// `osm_nr_rcv_process`.
pub fn process(v: &View, r: &Request) -> Reply {
    if !r.is_query() {
        return Reply::Error(crate::fabric::packet::mad_status::ATTR_UNSUPPORTED);
    }
    let (cm, q) = (r.cm, r.rec());
    let qni = &q[4..44];
    let mut out = Vec::new();
    for e in v.ports {
        if e.lid == 0 {
            continue;
        }
        let ni = &e.node_info;
        let eq = |bit: u32, a: &[u8], b: &[u8]| !has(cm, bit) || a == b;
        // NodeInfo fields: BaseVersion, ClassVersion, NodeType, NumPorts,
        // SystemImageGUID, NodeGUID, PortGUID, PartitionCap, DeviceID,
        // Revision, LocalPortNum, VendorID.
        if !(eq(0, &e.lid.to_be_bytes(), &q[0..2])
            && eq(2, &ni[0..1], &qni[0..1])
            && eq(3, &ni[1..2], &qni[1..2])
            && eq(4, &ni[2..3], &qni[2..3])
            && eq(5, &ni[3..4], &qni[3..4])
            && eq(6, &ni[4..12], &qni[4..12])
            && eq(7, &ni[12..20], &qni[12..20])
            && (!has(cm, 8) || e.port_guid == be64(qni, 20))
            && eq(9, &ni[28..30], &qni[28..30])
            && eq(10, &ni[30..32], &qni[30..32])
            && eq(11, &ni[32..36], &qni[32..36])
            && (!has(cm, 12) || e.port == qni[36])
            && eq(13, &ni[37..40], &qni[37..40]))
        {
            continue;
        }
        if has(cm, 14) {
            // strncmp over the 64 bytes: equal up to the first NUL.
            let a = &e.description;
            let b = &q[44..108];
            let la = a.iter().position(|&c| c == 0).unwrap_or(64);
            let lb = b.iter().position(|&c| c == 0).unwrap_or(64);
            if a[..la] != b[..lb] {
                continue;
            }
        }
        let mut rec = vec![0u8; NODE_RECORD_LEN];
        rec[0..2].copy_from_slice(&e.lid.to_be_bytes());
        rec[4..44].copy_from_slice(ni);
        rec[24..32].copy_from_slice(&e.port_guid.to_be_bytes());
        rec[4 + 36] = e.port;
        rec[44..108].copy_from_slice(&e.description);
        out.push(rec);
    }
    Reply::Records(NODE_RECORD_LEN, out)
}
