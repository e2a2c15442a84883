//! LinkRecord, after OpenSM's `osm_sa_link_record.c`: one record per cable end (from LID and port to LID and port, a switch by its LID), filtered by the component mask; a from or to LID that is not in the subnet gives no records.

use alloc::vec::Vec;

use hal::be::get_be16;
use ib_core::mad::{Mad, method};

use super::{Answer, has, rec};
use crate::ib_types::{sa_method, status};
use crate::sm::Sm;

/// LinkRecord size.
pub const LINK_RECORD_LEN: usize = 8;

/// `osm_lr_rcv_process`.
pub fn process(sm: &Sm, m: &Mad) -> Answer {
    if m.method() != method::GET && m.method() != sa_method::GET_TABLE {
        return Answer::Error(status::UNSUP_METHOD_ATTR);
    }
    let cm = super::comp_mask(m);
    let q = rec(m);
    let s = &sm.done;
    let from_node = if has(cm, 0) {
        match s.port_by_lid(get_be16(q, 0)) {
            Some(e) => Some(e.node),
            None => return Answer::Records(LINK_RECORD_LEN, Vec::new()),
        }
    } else {
        None
    };
    let to_node = if has(cm, 3) {
        match s.port_by_lid(get_be16(q, 4)) {
            Some(e) => Some(e.node),
            None => return Answer::Records(LINK_RECORD_LEN, Vec::new()),
        }
    } else {
        None
    };
    let lid_of = |g: u64, p: u8| -> u16 {
        let Some(n) = s.nodes.get(&g) else { return 0 };
        let lp = if n.is_switch() { 0 } else { p };
        n.ports.get(&lp).map_or(0, |pp| super::lid_of(sm, pp.guid))
    };
    let mut out = Vec::new();
    for (&g, n) in &s.nodes {
        if from_node.is_some_and(|f| f != g) {
            continue;
        }
        for (&p, pp) in &n.ports {
            if p == 0 {
                continue;
            }
            let Some((rg, rp)) = pp.remote else { continue };
            if !s.nodes.contains_key(&rg) {
                continue;
            }
            if to_node.is_some_and(|t| t != rg) {
                continue;
            }
            if has(cm, 1) && p != q[2] {
                continue;
            }
            if has(cm, 2) && rp != q[3] {
                continue;
            }
            let mut r = alloc::vec![0u8; LINK_RECORD_LEN];
            r[0..2].copy_from_slice(&lid_of(g, p).to_be_bytes());
            r[2] = p;
            r[3] = rp;
            r[4..6].copy_from_slice(&lid_of(rg, rp).to_be_bytes());
            out.push(r);
        }
    }
    Answer::Records(LINK_RECORD_LEN, out)
}
