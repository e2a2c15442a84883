//! Multicast routing, after OpenSM's `osm_mcast_mgr.c`: each switch's MFT entry of a group has the ports that lead to its members (the unicast route toward each member, so the tree follows the LFTs), written block by block where it changed, at the end of a heavy sweep and when a join or leave changes a group.
//!
//! OpenSM builds a spanning tree rooted at a chosen switch; with the min-hop
//! LFTs of a tree-shaped subnet (one switch, or switches without loops) the
//! union of the routes toward the members is that tree. Groups are written
//! for full members and send-only members alike; the MFT file and
//! MulticastFDBTop are left out.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use crate::ib_types::{MCAST_LID_BASE, attr};
use crate::req::{Ctx, Req};
use crate::sm::Sm;

/// Entries (MLIDs) per MFT block.
pub const MFT_BLOCK: usize = 32;

impl Sm {
    /// The MFT every switch should hold (node GUID -> port mask per MLID
    /// index).
    fn compute_mfts(&self) -> BTreeMap<u64, Vec<u64>> {
        let s = &self.subn;
        let top = self
            .sa
            .mcast
            .groups
            .keys()
            .next_back()
            .map_or(0, |l| usize::from(l.saturating_sub(MCAST_LID_BASE)) + 1);
        let mut mfts = BTreeMap::new();
        for n in s.switches() {
            let Some(sw) = n.sw.as_ref() else { continue };
            if sw.info.mcast_cap() == 0 {
                continue;
            }
            let mut t = alloc::vec![0u64; top];
            for (mlid, g) in &self.sa.mcast.groups {
                let i = usize::from(mlid.saturating_sub(MCAST_LID_BASE));
                let Some(e) = t.get_mut(i) else { continue };
                for guid in g.members.keys() {
                    let Some(lid) = self.guid2lid.get(guid) else {
                        continue;
                    };
                    if let Some(&p) = sw.lft.get(usize::from(*lid))
                        && p != crate::ib_types::LFT_NO_PATH
                        && p < 64
                    {
                        *e |= 1 << p;
                    }
                }
            }
            mfts.insert(n.guid(), t);
        }
        mfts
    }

    /// `osm_mcast_mgr_process`: the MFT blocks that changed.
    pub(crate) fn mcast_mgr_process(&mut self, _now: u64) {
        let mfts = self.compute_mfts();
        let first = self.sweep.first_time_master;
        for (g, mft) in mfts {
            let Some(n) = self.subn.nodes.get_mut(&g) else {
                continue;
            };
            let path = n.path.clone();
            let nports = usize::from(n.ni.num_ports());
            if let Some(sw) = n.sw.as_mut() {
                sw.mft = mft.clone();
            }
            let old = self.programmed_mft.get(&g).cloned().unwrap_or_default();
            for (b, chunk) in mft.chunks(MFT_BLOCK).enumerate() {
                let was = old.get(b * MFT_BLOCK..(b * MFT_BLOCK + chunk.len()));
                if !first && was == Some(chunk) {
                    continue;
                }
                for pos in 0..=(nports / 16).min(3) {
                    let mut data = [0u8; 64];
                    for (i, m) in chunk.iter().enumerate() {
                        let part = (m >> (16 * pos)) as u16;
                        data[2 * i..2 * i + 2].copy_from_slice(&part.to_be_bytes());
                    }
                    let amod = (pos as u32) << 28 | b as u32;
                    self.req.push(Req::set(
                        &path,
                        attr::MCAST_FWD_TBL,
                        amod,
                        data,
                        Ctx::SetMft(g, b as u16, pos as u8),
                    ));
                }
            }
        }
        self.sa.mcast.dirty = false;
    }

    /// An MFT block was written: remember it.
    pub(crate) fn mft_set_done(&mut self, g: u64, block: u16, pos: u8, data: &[u8; 64]) {
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

    /// A join or leave changed a group: write the MFTs now if no sweep
    /// runs (a sweep writes them anyway).
    pub(crate) fn request_mcast_update(&mut self) {
        self.sa.mcast.dirty = true;
    }

    /// The MFT update of a join or leave, when the SM is idle.
    pub(crate) fn mcast_timers(&mut self, now: u64) -> usize {
        if !self.sa.mcast.dirty
            || self.sweep.busy()
            || self.state != crate::ib_types::sm_state::MASTER
            || self.subn.nodes.is_empty()
        {
            return 0;
        }
        self.mcast_mgr_process(now);
        let n = self.subn.clone();
        self.done.nodes = n.nodes;
        1
    }
}
