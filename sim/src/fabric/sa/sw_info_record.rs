//! SwitchInfoRecord, after OpenSM's `osm_sa_sw_info_record.c`: every switch's SwitchInfo under its LID, filtered by LID.

use super::{Reply, Request, View, be16, has};
use crate::fabric::packet::mad_status;

/// SwitchInfoRecord: LID, reserved, SwitchInfo (20).
pub const SWITCH_INFO_RECORD_LEN: usize = 24;

/// `osm_sir_rcv_process`.
pub fn process(v: &View, r: &Request) -> Reply {
    if !r.is_query() {
        return Reply::Error(mad_status::ATTR_UNSUPPORTED);
    }
    let (cm, q) = (r.cm, r.rec());
    let mut out = Vec::new();
    for e in v.switches() {
        let Some(si) = v.switch_infos.get(&e.node_guid) else {
            continue;
        };
        if e.lid == 0 || has(cm, 0) && e.lid != be16(q, 0) {
            continue;
        }
        let mut rec = vec![0u8; SWITCH_INFO_RECORD_LEN];
        rec[0..2].copy_from_slice(&e.lid.to_be_bytes());
        rec[4..24].copy_from_slice(&si[..20]);
        out.push(rec);
    }
    Reply::Records(SWITCH_INFO_RECORD_LEN, out)
}
