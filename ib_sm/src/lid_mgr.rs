//! LID assignment and each end port's subnet attributes, after OpenSM's `osm_lid_mgr.c`: a port keeps the LID this SM gave it before (guid2lid), else the LID it reports if that is free, else the lowest free one; then one SubnSet(PortInfo) carries the LID, the SM's LID, M_Key, subnet prefix, SubnetTimeOut, NeighborMTU, OperationalVLs and the error thresholds, sent only when something differs (every port on the first sweep as master), with ClientReregister where OpenSM sets it.
//!
//! Our own port comes first, so a fresh subnet gives the SM LID 1 and the
//! rest by port GUID, as OpenSM does. LMC is 0. Left out: the guid2lid file,
//! `reassign_lids`, OpenSM's "set the port Down when NeighborMTU or
//! OperationalVLs change" (the values are written while the port is still
//! Initializing here), and M_Key lease and protection.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::vec::Vec;

use crate::ib_types::{MAX_UCAST_LID, attr, cap, link};
use crate::req::{Ctx, Req};
use crate::sm::Sm;

impl Sm {
    /// Gives every end port of this sweep a LID (`lid_mgr_get_port_lid`
    /// for each, the SM's port first).
    pub(crate) fn lid_mgr_assign(&mut self, now: u64) {
        // (port GUID, LID the port reports), SM port first, then by GUID.
        let mut ends: Vec<(u64, u16)> = Vec::new();
        for n in self.subn.nodes.values() {
            for (&p, pp) in &n.ports {
                if !n.is_end(p) || pp.failed {
                    continue;
                }
                let Some(pi) = pp.pi else { continue };
                if n.is_switch() || pi.port_state() >= link::INIT {
                    ends.push((pp.guid, pi.base_lid()));
                }
            }
        }
        let me = self.subn.sm_port_guid;
        ends.sort_by_key(|e| (e.0 != me, e.0));
        ends.dedup_by_key(|e| e.0);
        let present: BTreeSet<u64> = ends.iter().map(|e| e.0).collect();
        // LIDs held by ports not seen this sweep stay theirs.
        let persistent: BTreeSet<u16> = self
            .guid2lid
            .iter()
            .filter(|(g, _)| !present.contains(g))
            .map(|(_, l)| *l)
            .collect();
        let mut used: BTreeSet<u16> = BTreeSet::new();
        let mut got: BTreeMap<u64, u16> = BTreeMap::new();
        for &(g, _) in &ends {
            if let Some(&l) = self.guid2lid.get(&g)
                && used.insert(l)
            {
                got.insert(g, l);
            }
        }
        for &(g, l) in &ends {
            if got.contains_key(&g) || !(1..=MAX_UCAST_LID).contains(&l) {
                continue;
            }
            if !persistent.contains(&l) && used.insert(l) {
                got.insert(g, l);
            }
        }
        let mut next = 1u16;
        for &(g, _) in &ends {
            if got.contains_key(&g) {
                continue;
            }
            while next <= MAX_UCAST_LID && (used.contains(&next) || persistent.contains(&next)) {
                next += 1;
            }
            if next > MAX_UCAST_LID {
                self.note(now, format!("ERR 0B12: No free LID for port {g:#018x}"));
                continue;
            }
            used.insert(next);
            got.insert(g, next);
        }
        for (&g, &l) in &got {
            if self.guid2lid.insert(g, l) != Some(l) {
                self.note_quiet(now, format!("Port {g:#018x} gets LID {l}"));
            }
        }
        if let Some(&l) = got.get(&me) {
            self.subn.sm_lid = l;
            self.subn.master_sm_lid = l;
        }
        let lids = self.guid2lid.clone();
        self.subn.index_ports(&lids);
    }

    /// `osm_lid_mgr_process_sm`: our own port first.
    pub(crate) fn lid_mgr_process_sm(&mut self) {
        let me = self.subn.sm_port_guid;
        let found = self.subn.nodes.iter().find_map(|(g, n)| {
            n.ports
                .iter()
                .find(|(p, pp)| pp.guid == me && n.is_end(**p))
                .map(|(p, _)| (*g, *p))
        });
        if let Some((g, p)) = found {
            self.lid_mgr_set_physp_pi(g, p, true);
        }
    }

    /// `osm_lid_mgr_process_subnet`: every other end port.
    pub(crate) fn lid_mgr_process_subnet(&mut self, _now: u64) {
        let me = self.subn.sm_port_guid;
        let todo: Vec<(u64, u8)> = self
            .subn
            .nodes
            .iter()
            .flat_map(|(g, n)| {
                n.ports
                    .iter()
                    .filter(move |(p, pp)| n.is_end(**p) && pp.guid != me)
                    .map(move |(p, _)| (*g, *p))
            })
            .collect();
        for (g, p) in todo {
            self.lid_mgr_set_physp_pi(g, p, false);
        }
    }

    /// NeighborMTU of a link: the smaller MTUCap of both ends
    /// (`osm_physp_calc_link_mtu`).
    pub(crate) fn link_mtu(&self, g: u64, p: u8) -> u8 {
        let Some(pp) = self.subn.physp(g, p) else {
            return 1;
        };
        let mine = pp.pi.map_or(1, |pi| pi.mtu_cap());
        match pp.remote.and_then(|(rg, rp)| self.subn.physp(rg, rp)?.pi) {
            Some(r) => mine.min(r.mtu_cap()),
            None => mine,
        }
    }

    /// OperationalVLs of a link: the smaller VLCap of both ends, at most
    /// `max_op_vls` (`osm_physp_calc_link_op_vls`).
    pub(crate) fn link_op_vls(&self, g: u64, p: u8) -> u8 {
        let Some(pp) = self.subn.physp(g, p) else {
            return 1;
        };
        let mut v = pp.pi.map_or(1, |pi| pi.vl_cap()).min(self.cfg.max_op_vls);
        if let Some(r) = pp.remote.and_then(|(rg, rp)| self.subn.physp(rg, rp)?.pi) {
            v = v.min(r.vl_cap());
        }
        v.max(1)
    }

    /// `lid_mgr_set_physp_pi`: one end port's attributes and LID.
    fn lid_mgr_set_physp_pi(&mut self, g: u64, p: u8, sm_port: bool) {
        let (node_switch, pp) = match self.subn.nodes.get(&g) {
            Some(n) => (n.is_switch(), n.ports.get(&p).cloned()),
            None => return,
        };
        let Some(pp) = pp else { return };
        if pp.failed {
            return;
        }
        let Some(old) = pp.pi else { return };
        let Some(&lid) = self.guid2lid.get(&pp.guid) else {
            return;
        };
        let mut pi = old;
        let mut send = false;
        // PhysState: no change; LinkDownDefault: Polling; PortState: no
        // change.
        pi.0[33] = 0x02;
        pi.set_port_state(link::NO_CHANGE);
        send |= old.link_down_def() != 2;
        send |= old.port_state() == 0;
        pi.set_m_key(self.cfg.m_key);
        send |= old.m_key() != self.cfg.m_key;
        pi.set_subnet_prefix(self.cfg.subnet_prefix);
        send |= old.subnet_prefix() != self.cfg.subnet_prefix;
        pi.set_base_lid(lid);
        send |= old.base_lid() != lid;
        let sm_lid = self.subn.sm_lid;
        pi.set_master_sm_lid(sm_lid);
        let sm_changed = old.master_sm_lid() != sm_lid;
        send |= sm_changed;
        pi.set_m_key_lease(0);
        send |= old.m_key_lease() != 0;
        pi.set_mpb_lmc(0, 0);
        send |= old.mpb() != 0;
        pi.set_timeout_rereg(self.cfg.subnet_timeout, false);
        send |= old.subnet_timeout() != self.cfg.subnet_timeout;
        if p != 0 {
            send |= old.lmc() != 0;
            let vls = self.link_op_vls(g, p);
            let mtu = self.link_mtu(g, p);
            pi.set_neighbor_mtu(mtu);
            pi.set_op_vls(vls);
            send |= old.neighbor_mtu() != mtu || old.op_vls() != vls;
            let thd = (self.cfg.local_phy_errors_threshold & 0xf) << 4
                | (self.cfg.overrun_errors_threshold & 0xf);
            pi.set_error_threshold(thd);
            send |= old.error_threshold() != thd;
        } else if node_switch {
            // Enhanced port 0 has a real MTU; base port 0 ignores it.
            let enh = self
                .subn
                .nodes
                .get(&g)
                .and_then(|n| n.sw.as_ref())
                .is_some_and(|s| s.info.enhanced_port0());
            if enh {
                pi.set_neighbor_mtu(old.mtu_cap());
                send |= old.neighbor_mtu() != old.mtu_cap();
            }
        }
        let is_new = !self.done.ports.contains_key(&pp.guid);
        let rereg = (sm_changed || self.sweep.first_time_master || is_new)
            && !self.cfg.no_clients_rereg
            && old.capability_mask() & cap::HAS_CLIENT_REREG != 0;
        if rereg {
            pi.set_timeout_rereg(self.cfg.subnet_timeout, true);
            send = true;
        }
        send |= self.sweep.first_time_master;
        let _ = sm_port;
        if !send {
            return;
        }
        self.req.push(Req::set(
            &pp.path,
            attr::PORT_INFO,
            u32::from(p),
            pi.0,
            Ctx::SetPortInfo(g, p),
        ));
    }

    /// The LID of port `(g, p)`'s end port (a switch port: the switch's).
    pub(crate) fn end_lid(&self, g: u64, p: u8) -> u16 {
        let Some(n) = self.subn.nodes.get(&g) else {
            return 0;
        };
        let port = if n.is_switch() { 0 } else { p };
        n.ports
            .get(&port)
            .and_then(|pp| self.guid2lid.get(&pp.guid).copied())
            .unwrap_or(0)
    }
}
