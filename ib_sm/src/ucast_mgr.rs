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
                self.note_quiet(
                    now,
                    format!("Switch {g:#018x}: {changed} LFT block(s) written, LinearFDBTop {top}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib_types::{NodeInfo, PortInfo, SwitchInfo, node_type};
    use crate::subnet::{Node, Physp, Switch};
    use alloc::collections::BTreeMap;

    fn node(guid: u64, t: u8, nports: u8) -> Node {
        let mut ni = NodeInfo([0; 40]);
        ni.set_node_type(t);
        ni.set_num_ports(nports);
        ni.set_node_guid(guid);
        ni.set_port_guid(guid + u64::from(t == node_type::CA));
        Node {
            ni,
            desc: [0; 64],
            path: Vec::new(),
            sw: (t == node_type::SWITCH).then(|| Switch {
                info: SwitchInfo([0; 64]),
                lft: Vec::new(),
                mft: Vec::new(),
            }),
            ports: BTreeMap::new(),
        }
    }

    fn cable(s: &mut Subnet, a: (u64, u8), b: (u64, u8)) {
        for (x, y) in [(a, b), (b, a)] {
            let n = s.nodes.get_mut(&x.0).unwrap();
            let guid = n.ni.port_guid();
            let mut pp = Physp::new(guid, Vec::new());
            let mut pi = PortInfo::default();
            pi.set_port_state(4);
            pi.set_mtu_cap(5);
            pi.0[31] = 2;
            pi.0[35] = 0x40;
            pp.pi = Some(pi);
            pp.remote = Some(y);
            n.ports.insert(x.1, pp);
        }
    }

    /// CA 1 - switch A (ports 1, 3) - switch B (ports 2, 4) - CA 2.
    fn two_switches() -> Subnet {
        let mut s = Subnet::default();
        for n in [
            node(0x10, node_type::CA, 1),
            node(0x20, node_type::CA, 1),
            node(0xa0, node_type::SWITCH, 8),
            node(0xb0, node_type::SWITCH, 8),
        ] {
            s.nodes.insert(n.guid(), n);
        }
        cable(&mut s, (0x10, 1), (0xa0, 1));
        cable(&mut s, (0xa0, 3), (0xb0, 2));
        cable(&mut s, (0xb0, 4), (0x20, 1));
        for g in [0xa0, 0xb0] {
            let mut p0 = Physp::new(g, Vec::new());
            p0.pi = Some(PortInfo::default());
            s.nodes.get_mut(&g).unwrap().ports.insert(0, p0);
        }
        let lids = BTreeMap::from([(0x11, 1), (0x21, 2), (0xa0, 3), (0xb0, 4)]);
        s.index_ports(&lids);
        s
    }

    #[test]
    fn min_hop_routes_every_lid_toward_its_port() {
        let s = two_switches();
        let lfts = min_hop_lfts(&s);
        let a = &lfts[&0xa0];
        let b = &lfts[&0xb0];
        assert_eq!((a[1], a[2], a[3], a[4]), (1, 3, 0, 3));
        assert_eq!((b[1], b[2], b[3], b[4]), (2, 4, 2, 0));
        assert_eq!(a[0], LFT_NO_PATH, "LID 0 goes nowhere");
        // The PathRecord walk follows them: 4096 MTU, 40 Gb/s.
        let (src, dst) = (s.port_by_lid(1).unwrap(), s.port_by_lid(2).unwrap());
        let mut s2 = s.clone();
        for (g, t) in &lfts {
            s2.nodes.get_mut(g).unwrap().sw.as_mut().unwrap().lft = t.clone();
        }
        assert_eq!(
            crate::sa::path_record::route_mtu_rate(&s2, src, dst),
            Some((5, 7))
        );
        // Without LFTs there is no route.
        assert_eq!(crate::sa::path_record::route_mtu_rate(&s, src, dst), None);
    }
}
