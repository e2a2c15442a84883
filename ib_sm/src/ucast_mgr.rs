//! Unicast routing, after OpenSM's `osm_ucast_mgr.c` with its default min-hop engine (`osm_ucast_minhop.c`): every switch forwards each LID to the port with the fewest hops to it, and the LFT blocks that differ from what the switch holds are written, after SwitchInfo's LinearFDBTop.
//!
//! Hops are counted breadth first over the switch graph from the switch each
//! end port hangs off; ties go to the port that already carries the fewest
//! LIDs, then the lowest port number (OpenSM balances the same way, by its
//! port counters). LMC is 0, so each end port has one LID. The unicast
//! cache, the other routing engines, `lmc_esp0` and the LFT file are left
//! out.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::format;
use alloc::vec;
use alloc::vec::Vec;

use crate::ib_types::{LFT_NO_PATH, attr};
use crate::req::{Ctx, Req};
use crate::sm::Sm;
use crate::subnet::Subnet;

/// Entries in an LFT block.
pub const LFT_BLOCK: usize = 64;

/// Min-hop LFTs for every switch of `subn` (node GUID -> LFT indexed by
/// LID up to the subnet's top LID); LIDs with no route are 0xFF.
pub fn min_hop_lfts(subn: &Subnet) -> BTreeMap<u64, Vec<u8>> {
    let top = usize::from(subn.max_lid());
    let switches: Vec<u64> = subn.switches().map(|n| n.guid()).collect();
    let mut lfts: BTreeMap<u64, Vec<u8>> = switches
        .iter()
        .map(|&g| (g, vec![LFT_NO_PATH; top + 1]))
        .collect();
    // Where each LID enters the switch graph: (switch, its port; 0 = the
    // switch itself).
    let mut dests: Vec<(u16, u64, u8)> = Vec::new();
    for e in subn.ports.values() {
        if e.lid == 0 {
            continue;
        }
        let Some(n) = subn.nodes.get(&e.node) else {
            continue;
        };
        if n.is_switch() {
            dests.push((e.lid, e.node, 0));
        } else if let Some((sg, sp)) = n.ports.get(&e.port).and_then(|pp| pp.remote)
            && subn.nodes.get(&sg).is_some_and(|s| s.is_switch())
        {
            dests.push((e.lid, sg, sp));
        }
    }
    let mut load: BTreeMap<(u64, u8), u32> = BTreeMap::new();
    for (lid, s0, p0) in dests {
        // Hops from every switch to s0.
        let mut hops: BTreeMap<u64, u32> = BTreeMap::new();
        hops.insert(s0, 0);
        let mut q = VecDeque::from([s0]);
        while let Some(s) = q.pop_front() {
            let h = hops.get(&s).copied().unwrap_or(0);
            let Some(sn) = subn.nodes.get(&s) else {
                continue;
            };
            for (&p, pp) in &sn.ports {
                if p == 0 {
                    continue;
                }
                let Some((t, _)) = pp.remote else { continue };
                if !switches.contains(&t) || hops.contains_key(&t) {
                    continue;
                }
                hops.insert(t, h + 1);
                q.push_back(t);
            }
        }
        for &s in &switches {
            let Some(&h) = hops.get(&s) else { continue };
            let out = if s == s0 {
                p0
            } else {
                // The neighbour switches one hop closer; least loaded port.
                let Some(sn) = subn.nodes.get(&s) else {
                    continue;
                };
                let mut best: Option<(u32, u8)> = None;
                for (&p, pp) in &sn.ports {
                    if p == 0 {
                        continue;
                    }
                    let Some((t, _)) = pp.remote else { continue };
                    if hops.get(&t) != Some(&(h.saturating_sub(1))) || !switches.contains(&t) {
                        continue;
                    }
                    let l = load.get(&(s, p)).copied().unwrap_or(0);
                    if best.is_none_or(|b| (l, p) < b) {
                        best = Some((l, p));
                    }
                }
                match best {
                    Some((_, p)) => p,
                    None => continue,
                }
            };
            if let Some(t) = lfts.get_mut(&s)
                && let Some(e) = t.get_mut(usize::from(lid))
            {
                *e = out;
                *load.entry((s, out)).or_default() += 1;
            }
        }
    }
    lfts
}

impl Sm {
    /// `osm_ucast_mgr_process`: LFTs computed, LinearFDBTop and the blocks
    /// that changed queued.
    pub(crate) fn ucast_mgr_process(&mut self, now: u64) {
        let lfts = min_hop_lfts(&self.subn);
        let top = self.subn.max_lid();
        for (g, lft) in lfts {
            let Some(n) = self.subn.nodes.get_mut(&g) else {
                continue;
            };
            let path = n.path.clone();
            let Some(sw) = n.sw.as_mut() else { continue };
            sw.lft = lft.clone();
            let mut si = sw.info;
            let first = self.sweep.first_time_master;
            if si.lin_top() != top || si.port_state_change() || first {
                si.set_lin_top(top);
                // PortStateChange is cleared by writing 1.
                let ls = si.life_state();
                si.set_life_state(ls | 0x04);
                self.req.push(Req::set(
                    &path,
                    attr::SWITCH_INFO,
                    0,
                    si.0,
                    Ctx::SetSwitchInfo(g),
                ));
            }
            let old = self.programmed_lft.get(&g);
            let mut changed = 0;
            for (b, chunk) in lft.chunks(LFT_BLOCK).enumerate() {
                let mut data = [LFT_NO_PATH; 64];
                data[..chunk.len()].copy_from_slice(chunk);
                let same = !first
                    && old.is_some_and(|o| {
                        o.get(b * LFT_BLOCK..(b + 1) * LFT_BLOCK) == Some(&data[..])
                    });
                if same {
                    continue;
                }
                changed += 1;
                self.req.push(Req::set(
                    &path,
                    attr::LIN_FWD_TBL,
                    b as u32,
                    data,
                    Ctx::SetLft(g, b as u16),
                ));
            }
            if changed > 0 {
                self.note(
                    now,
                    format!("Switch {g:#018x}: {changed} LFT block(s) written, LinearFDBTop {top}"),
                );
            }
        }
    }
}
