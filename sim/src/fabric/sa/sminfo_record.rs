//! SMInfoRecord, after OpenSM's `osm_sa_sminfo_record.c`: this SM first (its LID, GUID, ActCount, priority and state), then every other SM it knows, filtered by LID, GUID, priority and state; the SM_Key is never shown.

use super::{Reply, Request, SmRow, View, be16, be64, has};
use crate::fabric::packet::mad_status;

/// SMInfoRecord: LID, reserved, SMInfo (21), padding.
pub const SMINFO_RECORD_LEN: usize = 32;

fn record(s: &SmRow) -> Vec<u8> {
    let mut r = vec![0u8; SMINFO_RECORD_LEN];
    r[0..2].copy_from_slice(&s.lid.to_be_bytes());
    r[4..12].copy_from_slice(&s.guid.to_be_bytes());
    // SM_Key (12..20) stays 0.
    r[20..24].copy_from_slice(&s.act_count.to_be_bytes());
    r[24] = (s.priority & 0xf) << 4 | (s.state & 0xf);
    r
}

/// `osm_smir_rcv_process`.
pub fn process(v: &View, r: &Request) -> Reply {
    if !r.is_query() {
        return Reply::Error(mad_status::ATTR_UNSUPPORTED);
    }
    let (cm, q) = (r.cm, r.rec());
    let by_guid = if has(cm, 0) {
        match v.port_by_lid(be16(q, 0)) {
            Some(e) => Some(e.port_guid),
            None => return Reply::Records(SMINFO_RECORD_LEN, Vec::new()),
        }
    } else {
        None
    };
    let out = v
        .sms
        .iter()
        .filter(|s| {
            by_guid.is_none_or(|g| g == s.guid)
                && !(has(cm, 2) && s.guid != be64(q, 4)
                    || has(cm, 5) && s.priority != q[24] >> 4
                    || has(cm, 6) && s.state != q[24] & 0xf)
        })
        .map(record)
        .collect();
    Reply::Records(SMINFO_RECORD_LEN, out)
}
