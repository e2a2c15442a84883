//! The embedded SM's LID assignment, min-hop unicast routing and the per-link configuration it enqueues (OpenSM's `osm_lid_mgr.c`, `osm_ucast_mgr.c` and `osm_link_mgr.c`).
//!
//! Split from [`super`] (the sweep's state machine).

use super::*;

impl SubnetManager {
    /// Gives every end port a LID: the one it had before (this SM's map),
    /// else the one it reports if free, else the lowest free one.
    pub(super) fn assign_lids(&mut self, now: u64) {
        let mut ends: Vec<(u64, u8, u64, u16)> = Vec::new(); // node, port, guid, reported
        for n in self.nodes.values() {
            for (&p, pr) in &n.ports {
                let is_end = if n.node_type == 2 { p == 0 } else { true };
                if !is_end || pr.info.is_none() {
                    continue;
                }
                let reported = pr.info.map_or(0, |i| be16(&i, 16));
                ends.push((n.guid, p, pr.guid, reported));
            }
        }
        // The SM's own port first (it takes LID 1 on a fresh subnet, as
        // OpenSM does), then by node GUID and port.
        let me = self.port_guid();
        ends.sort_by_key(|e| (e.2 != me, e.0, e.1));
        let mut used: BTreeSet<u16> = BTreeSet::new();
        let mut want: BTreeMap<u64, u16> = BTreeMap::new();
        // Known LIDs first.
        for &(_, _, g, _) in &ends {
            if let Some(&l) = self.guid2lid.get(&g)
                && used.insert(l)
            {
                want.insert(g, l);
            }
        }
        // Then LIDs the ports report, unless another port's LID.
        let taken_by_others: BTreeSet<u16> = self
            .guid2lid
            .iter()
            .filter(|(g, _)| !ends.iter().any(|e| e.2 == **g))
            .map(|(_, l)| *l)
            .collect();
        for &(_, _, g, l) in &ends {
            if want.contains_key(&g) || !(1..=MAX_UCAST_LID).contains(&l) {
                continue;
            }
            if !taken_by_others.contains(&l) && used.insert(l) {
                want.insert(g, l);
            }
        }
        let mut next = self.cfg.first_lid.max(1);
        for &(_, _, g, _) in &ends {
            if want.contains_key(&g) {
                continue;
            }
            while (used.contains(&next) || taken_by_others.contains(&next)) && next < MAX_UCAST_LID
            {
                next += 1;
            }
            if next > MAX_UCAST_LID || used.contains(&next) {
                self.note(now, format!("no LID left for port GUID {g:#018x}"));
                continue;
            }
            used.insert(next);
            want.insert(g, next);
        }
        for &(node, p, g, _) in &ends {
            let Some(&l) = want.get(&g) else { continue };
            if self.guid2lid.insert(g, l) != Some(l) {
                self.note(now, format!("port GUID {g:#018x} gets LID {l}"));
            }
            if let Some(pr) = self.port_rec(node, p) {
                pr.lid = l;
            }
        }
        if let Some(&l) = want.get(&self.port_guid()) {
            // Our own port, set locally: its LID, and us as its SM.
            self.lid = l;
            self.port_sm_lid = l;
            self.port_sm_sl = self.cfg.sm_sl & 0xf;
            self.port_subnet_timeout = self.cfg.subnet_timeout & 0x1f;
            self.port_thresholds = ERROR_THRESHOLDS;
        }
    }

    /// Min-hop LFTs; queues SwitchInfo (LinearFDBTop, PortStateChange
    /// cleared) and the LFT blocks that differ from what a switch holds.
    pub(super) fn compute_routes(&mut self, now: u64) {
        let max_lid = self
            .nodes
            .values()
            .flat_map(|n| n.ports.values().map(|p| p.lid))
            .max()
            .unwrap_or(0);
        let switches: Vec<u64> = self
            .nodes
            .values()
            .filter(|n| n.node_type == 2)
            .map(|n| n.guid)
            .collect();
        let mut lfts: BTreeMap<u64, Vec<u8>> = switches
            .iter()
            .map(|&g| (g, vec![NO_PORT; usize::from(max_lid) + 1]))
            .collect();
        // Destinations: (LID, the switch it hangs off, that switch's port).
        let mut dests: Vec<(u16, u64, u8)> = Vec::new();
        for n in self.nodes.values() {
            for pr in n.ports.values() {
                if pr.lid == 0 {
                    continue;
                }
                if n.node_type == 2 {
                    dests.push((pr.lid, n.guid, 0));
                } else if let Some((sw, sp)) = pr.peer
                    && self.nodes.get(&sw).is_some_and(|s| s.node_type == 2)
                {
                    dests.push((pr.lid, sw, sp));
                }
            }
        }
        for (lid, s0, p0) in dests {
            let mut seen = BTreeSet::from([s0]);
            if let Some(t) = lfts.get_mut(&s0) {
                t[usize::from(lid)] = p0;
            }
            let mut q = VecDeque::from([s0]);
            while let Some(s) = q.pop_front() {
                let Some(sn) = self.nodes.get(&s) else {
                    continue;
                };
                for (_, pr) in sn.ports.iter().filter(|(p, _)| **p != 0) {
                    let Some((t, tp)) = pr.peer else { continue };
                    if !switches.contains(&t) || !seen.insert(t) {
                        continue;
                    }
                    if let Some(tl) = lfts.get_mut(&t) {
                        tl[usize::from(lid)] = tp;
                    }
                    q.push_back(t);
                }
            }
        }
        for (&g, lft) in &lfts {
            let Some(n) = self.nodes.get(&g) else {
                continue;
            };
            let path = n.path.clone();
            let mut si = n.switch_info.unwrap_or([0; 64]);
            si[6..8].copy_from_slice(&max_lid.to_be_bytes());
            si[11] |= 0x04; // PortStateChange: writing 1 clears it
            self.queue.push_back(Req {
                path: path.clone(),
                meth: method::SET,
                attr_id: attr::SWITCH_INFO,
                attr_mod: 0,
                data: si,
                ctx: Ctx::SetSwitchInfo { node: g },
            });
            let old = self.programmed.get(&g);
            let mut changed = 0;
            for (b, chunk) in lft.chunks(64).enumerate() {
                let mut data = [NO_PORT; 64];
                data[..chunk.len()].copy_from_slice(chunk);
                let same = old.is_some_and(|o| o.get(b * 64..b * 64 + 64) == Some(&data[..]));
                if same {
                    continue;
                }
                changed += 1;
                self.queue.push_back(Req {
                    path: path.clone(),
                    meth: method::SET,
                    attr_id: attr::LINEAR_FORWARDING_TABLE,
                    attr_mod: b as u32,
                    data,
                    ctx: Ctx::SetLft {
                        node: g,
                        block: b as u16,
                    },
                });
            }
            if changed > 0 {
                self.note(
                    now,
                    format!("switch {g:#018x}: {changed} LFT blocks, top LID {max_lid}"),
                );
            }
        }
        self.lfts = lfts;
    }

    /// NeighborMTU and OperationalVLs for a port: the smaller of both ends'.
    pub(super) fn link_params(&self, node: u64, port: u8) -> (u8, u8) {
        let mine = self.nodes.get(&node).and_then(|n| n.ports.get(&port));
        let Some(info) = mine.and_then(|p| p.info) else {
            return (0, 0);
        };
        let peer = mine
            .and_then(|p| p.peer)
            .and_then(|(g, q)| self.nodes.get(&g)?.ports.get(&q)?.info);
        let (mtu, vls) = (info[41] & 0xf, info[37] >> 4);
        match peer {
            Some(pi) => (mtu.min(pi[41] & 0xf), vls.min(pi[37] >> 4)),
            None => (mtu, vls),
        }
    }

    /// SubnSet PortInfo with the subnet attributes for every end port that
    /// lacks them (the SM's own port is set locally).
    pub(super) fn enqueue_config(&mut self, now: u64) {
        let mut reqs = Vec::new();
        for n in self.nodes.values() {
            for (&p, pr) in &n.ports {
                let end = if n.node_type == 2 { p == 0 } else { true };
                let Some(info) = pr.info else { continue };
                if !end || pr.lid == 0 || n.guid == self.cfg.node_guid {
                    continue;
                }
                let mut d = info;
                d[0..8].fill(0); // M_Key
                d[8..16].copy_from_slice(&self.cfg.subnet_prefix.to_be_bytes());
                d[16..18].copy_from_slice(&pr.lid.to_be_bytes());
                d[18..20].copy_from_slice(&self.lid.to_be_bytes());
                d[26..28].fill(0); // M_KeyLeasePeriod
                d[29] = 0; // LinkWidthEnabled: no change
                d[32] &= 0xf0; // PortState: no change
                d[33] = 0; // PortPhysicalState, LinkDownDefault: no change
                d[34] = 0; // M_KeyProtect 0, LMC 0
                d[35] &= 0xf0; // LinkSpeedEnabled: no change
                let (mtu, vls) = if n.node_type == 2 {
                    (0, 0)
                } else {
                    self.link_params(n.guid, p)
                };
                d[36] = mtu << 4 | (self.cfg.sm_sl & 0xf);
                d[43] = vls << 4;
                d[51] = self.cfg.subnet_timeout & 0x1f;
                if n.node_type != 2 {
                    d[53] = ERROR_THRESHOLDS;
                }
                // The first sweep of this SM asks every port that can
                // (CapabilityMask IsClientReregistrationSupported) to
                // re-register with the SA, as OpenSM does.
                let rereg = !self.rereg_done
                    && u32::from_be_bytes([info[20], info[21], info[22], info[23]])
                        & CAP_CLIENT_REREG
                        != 0;
                if rereg {
                    d[51] |= 0x80;
                }
                let cur = |o: usize| info[o];
                let same = !rereg
                    && info[8..20] == d[8..20]
                    && cur(34) & 7 == 0
                    && cur(36) & 0xf == self.cfg.sm_sl & 0xf
                    && (mtu == 0 || cur(36) >> 4 == mtu)
                    && cur(51) & 0x1f == self.cfg.subnet_timeout & 0x1f
                    && (n.node_type == 2 || cur(53) == ERROR_THRESHOLDS);
                if same {
                    continue;
                }
                reqs.push(Req {
                    path: pr.path.clone(),
                    meth: method::SET,
                    attr_id: attr::PORT_INFO,
                    attr_mod: u32::from(p),
                    data: d,
                    ctx: Ctx::SetPortInfo {
                        node: n.guid,
                        port: p,
                    },
                });
            }
        }
        self.queue.extend(reqs);
        let _ = now;
    }
}
