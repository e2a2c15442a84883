//! The embedded SM's multicast routing, after OpenSM's `osm_mcast_mgr.c`: each switch's MFT entry of a group has the ports that lead to its members (the unicast route toward each member, so the tree follows the LFTs), written block by block where it changed, in a heavy sweep and when a join or leave changes a group between sweeps.
//!
//! OpenSM builds a spanning tree rooted at a chosen switch; with the
//! min-hop LFTs of a tree-shaped subnet (one switch, or switches without
//! loops) the union of the routes toward the members is that tree. Full
//! and send-only members alike get the group's traffic; a group without
//! members has no entry. MulticastFDBTop is left as the switch has it.

use std::collections::BTreeMap;

use super::{Ctx, NO_PORT, Req, SubnetManager};
use crate::fabric::packet::{attr, method};
use crate::fabric::sa::mcmember_record::MLID_BASE;

/// MLIDs per MFT block.
pub const MFT_BLOCK: usize = 32;

impl SubnetManager {
    /// The MFT every switch should hold (node GUID -> port mask per MLID
    /// from 0xC000): for each group with members, the LFT's port toward
    /// each member.
    fn compute_mfts(&self) -> BTreeMap<u64, Vec<u64>> {
        let groups = self.sa.mcast.members();
        let top = groups
            .keys()
            .next_back()
            .map_or(0, |l| usize::from(l.saturating_sub(MLID_BASE)) + 1);
        let mut mfts = BTreeMap::new();
        for n in self.nodes.values().filter(|n| n.node_type == 2) {
            let cap = n
                .switch_info
                .map_or(0, |si| u16::from_be_bytes([si[4], si[5]]));
            if cap == 0 {
                continue;
            }
            let Some(lft) = self.lfts.get(&n.guid) else {
                continue;
            };
            let mut t = vec![0u64; top.min(usize::from(cap))];
            for (mlid, members) in &groups {
                let Some(e) = t.get_mut(usize::from(mlid - MLID_BASE)) else {
                    continue;
                };
                for guid in members {
                    let Some(&lid) = self.guid2lid.get(guid) else {
                        continue;
                    };
                    if let Some(&p) = lft.get(usize::from(lid))
                        && p != NO_PORT
                        && p != 0
                        && p < 64
                    {
                        *e |= 1 << p;
                    }
                }
            }
            mfts.insert(n.guid, t);
        }
        mfts
    }

    /// `osm_mcast_mgr_process`: computes the MFTs and queues the blocks
    /// that differ from what each switch holds (every 16-port position of
    /// a changed block of 32 MLIDs).
    pub(super) fn mcast_mgr_process(&mut self, now: u64) {
        self.mcast_dirty = false;
        let mfts = self.compute_mfts();
        for (g, mft) in &mfts {
            let Some(n) = self.nodes.get(g) else { continue };
            let (path, nports) = (n.path.clone(), usize::from(n.node_info[3]));
            let old = self.programmed_mft.get(g).cloned().unwrap_or_default();
            let blocks = mft.len().max(old.len()).div_ceil(MFT_BLOCK);
            let mut changed = 0;
            for b in 0..blocks {
                let range = b * MFT_BLOCK..(b + 1) * MFT_BLOCK;
                let want: Vec<u64> = range
                    .clone()
                    .map(|i| mft.get(i).copied().unwrap_or(0))
                    .collect();
                let have: Vec<u64> = range.map(|i| old.get(i).copied().unwrap_or(0)).collect();
                if want == have {
                    continue;
                }
                changed += 1;
                for pos in 0..=(nports / 16).min(3) {
                    let mut data = [0u8; 64];
                    for (i, m) in want.iter().enumerate() {
                        let part = (m >> (16 * pos)) as u16;
                        data[2 * i..2 * i + 2].copy_from_slice(&part.to_be_bytes());
                    }
                    self.queue.push_back(Req {
                        path: path.clone(),
                        meth: method::SET,
                        attr_id: attr::MULTICAST_FORWARDING_TABLE,
                        attr_mod: (pos as u32) << 28 | b as u32,
                        data,
                        ctx: Ctx::SetMft {
                            node: *g,
                            block: b as u16,
                            pos: pos as u8,
                        },
                    });
                }
            }
            if changed > 0 {
                self.note(now, format!("switch {g:#018x}: {changed} MFT blocks"));
            }
        }
        self.mfts = mfts;
    }

    /// An MFT block was written: remember what the switch holds.
    pub(super) fn mft_set_done(&mut self, g: u64, block: u16, pos: u8, data: &[u8; 64]) {
        self.stats.mft_blocks += 1;
        let t = self.programmed_mft.entry(g).or_default();
        let base = usize::from(block) * MFT_BLOCK;
        if t.len() < base + MFT_BLOCK {
            t.resize(base + MFT_BLOCK, 0);
        }
        let shift = 16 * u32::from(pos.min(3));
        for i in 0..MFT_BLOCK {
            let part = u64::from(u16::from_be_bytes([data[2 * i], data[2 * i + 1]]));
            let e = &mut t[base + i];
            *e = (*e & !(0xffff << shift)) | part << shift;
        }
    }
}
