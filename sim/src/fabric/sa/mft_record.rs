//! MulticastForwardingTableRecord, after OpenSM's `osm_sa_mft_record.c`: the blocks in use of every switch's MFT as the SM computed it, each of its 16-port positions, filtered by LID, block and position.

use super::{Reply, Request, View, be16, has};
use crate::fabric::packet::mad_status;

/// MFT record: LID, position and block, reserved, 32 port masks.
pub const MFT_RECORD_LEN: usize = 72;

/// `osm_mftr_rcv_process`.
pub fn process(v: &View, r: &Request) -> Reply {
    if !r.is_query() {
        return Reply::Error(mad_status::ATTR_UNSUPPORTED);
    }
    let (cm, q) = (r.cm, r.rec());
    let qpb = be16(q, 2);
    let mut out = Vec::new();
    for e in v.switches() {
        if e.lid == 0 || has(cm, 0) && e.lid != be16(q, 0) {
            continue;
        }
        let cap = v.switch_infos.get(&e.node_guid).map_or(0, |si| be16(si, 4));
        let Some(mft) = v.mfts.get(&e.node_guid).filter(|m| !m.is_empty()) else {
            continue;
        };
        if cap == 0 {
            continue;
        }
        let max_block = (mft.len() - 1) / 32;
        let max_pos = usize::from(e.node_info[3]) / 16;
        let (blo, bhi) = if has(cm, 3) {
            let b = usize::from(qpb & 0x1ff);
            if b > max_block {
                continue;
            }
            (b, b)
        } else {
            (0, max_block)
        };
        let (plo, phi) = if has(cm, 1) {
            let p = usize::from(qpb >> 12);
            if p > max_pos {
                continue;
            }
            (p, p)
        } else {
            (0, max_pos)
        };
        for b in blo..=bhi {
            for pos in plo..=phi {
                let mut rec = vec![0u8; MFT_RECORD_LEN];
                rec[0..2].copy_from_slice(&e.lid.to_be_bytes());
                rec[2..4].copy_from_slice(&(((pos as u16) << 12) | b as u16).to_be_bytes());
                for i in 0..32 {
                    let mask = mft.get(b * 32 + i).copied().unwrap_or(0);
                    let part = (mask >> (16 * pos.min(3))) as u16;
                    rec[8 + 2 * i..10 + 2 * i].copy_from_slice(&part.to_be_bytes());
                }
                out.push(rec);
            }
        }
    }
    Reply::Records(MFT_RECORD_LEN, out)
}
