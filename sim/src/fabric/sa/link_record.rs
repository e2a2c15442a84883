//! LinkRecord, after OpenSM's `osm_sa_link_record.c`: one record per cable end (from LID and port to port and LID, a switch by its LID), filtered by the component mask; a from or to LID that is not in the subnet gives no records.

use super::{Reply, Request, View, be16, has};
use crate::fabric::packet::mad_status;

/// LinkRecord: FromLID, FromPort, ToPort, ToLID, reserved.
pub const LINK_RECORD_LEN: usize = 8;

/// `osm_lr_rcv_process`.
pub fn process(v: &View, r: &Request) -> Reply {
    if !r.is_query() {
        return Reply::Error(mad_status::ATTR_UNSUPPORTED);
    }
    let (cm, q) = (r.cm, r.rec());
    let from_node = if has(cm, 0) {
        match v.port_by_lid(be16(q, 0)) {
            Some(e) => Some(e.node_guid),
            None => return Reply::Records(LINK_RECORD_LEN, Vec::new()),
        }
    } else {
        None
    };
    let to_node = if has(cm, 3) {
        match v.port_by_lid(be16(q, 4)) {
            Some(e) => Some(e.node_guid),
            None => return Reply::Records(LINK_RECORD_LEN, Vec::new()),
        }
    } else {
        None
    };
    let mut out = Vec::new();
    for (&(g, p), &(rg, rp)) in v.links {
        if p == 0 || from_node.is_some_and(|f| f != g) || to_node.is_some_and(|t| t != rg) {
            continue;
        }
        if has(cm, 1) && p != q[2] || has(cm, 2) && rp != q[3] {
            continue;
        }
        let (fl, tl) = (v.lid_of(g, p), v.lid_of(rg, rp));
        if fl == 0 || tl == 0 {
            continue;
        }
        let mut rec = vec![0u8; LINK_RECORD_LEN];
        rec[0..2].copy_from_slice(&fl.to_be_bytes());
        rec[2] = p;
        rec[3] = rp;
        rec[4..6].copy_from_slice(&tl.to_be_bytes());
        out.push(rec);
    }
    Reply::Records(LINK_RECORD_LEN, out)
}
