//! NodeRecord, after OpenSM's `osm_sa_node_record.c`: one record per end port of every node (a switch: port 0 only), the NodeInfo carrying that port's GUID and number, filtered by the component mask.
//!
//! Partition checks are left out (every port is in the default partition).

use alloc::vec::Vec;

use hal::be::{get_be16, get_be64};
use ib_core::mad::{Mad, method};

use super::{Answer, has, rec};
use crate::ib_types::{sa_method, status};
use crate::sm::Sm;

/// NodeRecord size (LID, reserved, NodeInfo, NodeDescription, pad).
pub const NODE_RECORD_LEN: usize = 112;

/// `osm_nr_rcv_process`.
pub fn process(sm: &Sm, m: &Mad) -> Answer {
    if m.method() != method::GET && m.method() != sa_method::GET_TABLE {
        return Answer::Error(status::UNSUP_METHOD_ATTR);
    }
    let cm = super::comp_mask(m);
    let q = rec(m);
    let qni = &q[4..44];
    let mut out = Vec::new();
    for n in sm.done.nodes.values() {
        let ni = &n.ni.0;
        let eq = |bit: u32, a: &[u8], b: &[u8]| !has(cm, bit) || a == b;
        if !(eq(7, &ni[12..20], &qni[12..20])
            && eq(6, &ni[4..12], &qni[4..12])
            && eq(2, &ni[0..1], &qni[0..1])
            && eq(3, &ni[1..2], &qni[1..2])
            && eq(4, &ni[2..3], &qni[2..3])
            && eq(5, &ni[3..4], &qni[3..4])
            && eq(9, &ni[28..30], &qni[28..30])
            && eq(10, &ni[30..32], &qni[30..32])
            && eq(11, &ni[32..36], &qni[32..36])
            && eq(13, &ni[37..40], &qni[37..40]))
        {
            continue;
        }
        if has(cm, 14) {
            // strncmp over the 64 bytes: equal up to the first NUL.
            let a = &n.desc;
            let b = &q[44..108];
            let la = a.iter().position(|&c| c == 0).unwrap_or(64);
            let lb = b.iter().position(|&c| c == 0).unwrap_or(64);
            if a[..la] != b[..lb] {
                continue;
            }
        }
        for (&p, pp) in &n.ports {
            if !n.is_end(p) {
                continue;
            }
            let Some(e) = sm.done.port_by_guid(pp.guid) else {
                continue;
            };
            if has(cm, 8) && pp.guid != get_be64(qni, 20) {
                continue;
            }
            if has(cm, 0) && e.lid != get_be16(q, 0) {
                continue;
            }
            if has(cm, 12) && p != qni[36] {
                continue;
            }
            let mut r = alloc::vec![0u8; NODE_RECORD_LEN];
            r[0..2].copy_from_slice(&e.lid.to_be_bytes());
            r[4..44].copy_from_slice(ni);
            r[24..32].copy_from_slice(&pp.guid.to_be_bytes());
            r[4 + 36] = p;
            r[44..108].copy_from_slice(&n.desc);
            out.push(r);
        }
    }
    Answer::Records(NODE_RECORD_LEN, out)
}
