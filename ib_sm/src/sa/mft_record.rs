//! MulticastForwardingTableRecord, after OpenSM's `osm_sa_mft_record.c`: the blocks in use of every switch's MFT, each of its 16-port positions, filtered by LID, block and position.

use alloc::vec::Vec;

use hal::be::get_be16;
use ib_core::mad::{Mad, method};

use super::{Answer, has, rec};
use crate::ib_types::{sa_method, status};
use crate::sm::Sm;

/// MFT record size (LID, position and block, reserved, 32 port masks).
pub const MFT_RECORD_LEN: usize = 72;

/// `osm_mftr_rcv_process`.
pub fn process(sm: &Sm, m: &Mad) -> Answer {
    if m.method() != method::GET && m.method() != sa_method::GET_TABLE {
        return Answer::Error(status::UNSUP_METHOD_ATTR);
    }
    let cm = super::comp_mask(m);
    let q = rec(m);
    let qpb = get_be16(q, 2);
    let mut out = Vec::new();
    for n in sm.done.switches() {
        let Some(sw) = n.sw.as_ref() else { continue };
        let lid = super::lid_of(sm, n.guid());
        if lid == 0 || has(cm, 0) && lid != get_be16(q, 0) {
            continue;
        }
        if sw.info.mcast_cap() == 0 || sw.mft.is_empty() {
            continue;
        }
        let max_block = (sw.mft.len() - 1) / 32;
        let max_pos = usize::from(n.ni.num_ports()) / 16;
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
                let mut r = alloc::vec![0u8; MFT_RECORD_LEN];
                r[0..2].copy_from_slice(&lid.to_be_bytes());
                r[2..4].copy_from_slice(&(((pos as u16) << 12) | b as u16).to_be_bytes());
                for i in 0..32 {
                    let mask = sw.mft.get(b * 32 + i).copied().unwrap_or(0);
                    let part = (mask >> (16 * pos.min(3))) as u16;
                    r[8 + 2 * i..10 + 2 * i].copy_from_slice(&part.to_be_bytes());
                }
                out.push(r);
            }
        }
    }
    Answer::Records(MFT_RECORD_LEN, out)
}
