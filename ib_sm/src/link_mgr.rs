//! Port states and link parameters, after OpenSM's `osm_link_mgr.c`: first every port's link parameters with the state left alone (switch ports: HOQLife and VLStallCount by what is at the far end, NeighborMTU, OperationalVLs, error thresholds), then every port to Armed, then to Active.
//!
//! A port is only moved up (a port already Armed is not sent Armed again);
//! a switch port whose far end did not answer is set Down, as OpenSM does.
//! The SMSL is 0 (no LASH routing); FDR10, extended speeds and forced link
//! widths or speeds are left out.

use alloc::vec::Vec;

use crate::ib_types::{attr, link};
use crate::req::{Ctx, Req};
use crate::sm::Sm;

impl Sm {
    /// `osm_link_mgr_process` for `state` (NO_CHANGE, ARMED or ACTIVE).
    pub(crate) fn link_mgr_process(&mut self, state: u8) {
        let todo: Vec<(u64, u8)> = self
            .subn
            .nodes
            .iter()
            .flat_map(|(g, n)| n.ports.keys().map(move |p| (*g, *p)))
            .collect();
        for (g, p) in todo {
            let Some(pp) = self.subn.physp(g, p) else {
                continue;
            };
            if pp.failed {
                continue;
            }
            let Some(pi) = pp.pi else { continue };
            let current = pi.port_state();
            if current == link::DOWN || current == 0 {
                continue;
            }
            if p != 0 {
                let remote_ok = pp
                    .remote
                    .and_then(|(rg, rp)| self.subn.physp(rg, rp))
                    .is_some_and(|r| r.pi.is_some() && !r.failed);
                if !remote_ok {
                    if current != link::INIT {
                        self.link_mgr_set_physp_pi(g, p, link::DOWN);
                    }
                    continue;
                }
            }
            if state != link::NO_CHANGE && state <= current {
                continue;
            }
            self.link_mgr_set_physp_pi(g, p, state);
        }
    }

    /// `link_mgr_set_physp_pi`.
    fn link_mgr_set_physp_pi(&mut self, g: u64, p: u8, state: u8) {
        let Some(n) = self.subn.nodes.get(&g) else {
            return;
        };
        let switch = n.is_switch();
        let esp0 = n.sw.as_ref().is_some_and(|s| s.info.enhanced_port0());
        let Some(pp) = n.ports.get(&p) else { return };
        let Some(old) = pp.pi else { return };
        let path = pp.path.clone();
        let remote = pp.remote;
        let mut pi = old;
        let mut send = false;
        if !switch || p == 0 {
            if pi.base_lid() == 0 {
                pi.set_base_lid(self.end_lid(g, p));
                send = true;
            }
            pi.set_master_sm_lid(self.subn.sm_lid);
            send |= old.master_sm_lid() != self.subn.sm_lid;
        }
        if p == 0 {
            if !switch {
                return;
            }
            if !esp0 {
                // Base port 0: only the SMSL (0 here) would be written.
                if old.master_sm_sl() == 0 && !send {
                    return;
                }
                pi.set_master_sm_sl(0);
                pi.0[33] = 0x02;
                pi.set_port_state(state);
                self.push_set(path, g, p, pi);
                return;
            }
        }
        pi.0[33] = 0x02;
        pi.set_port_state(state);
        send |= old.link_down_def() != 2;
        if state == link::NO_CHANGE {
            if !switch || p == 0 {
                pi.set_m_key(self.cfg.m_key);
                send |= old.m_key() != self.cfg.m_key;
                pi.set_subnet_prefix(self.cfg.subnet_prefix);
                send |= old.subnet_prefix() != self.cfg.subnet_prefix;
                pi.set_master_sm_sl(0);
                send |= old.master_sm_sl() != 0;
                pi.set_m_key_lease(0);
                send |= old.m_key_lease() != 0;
                pi.set_mpb_lmc(0, 0);
                send |= old.lmc() != 0 || old.mpb() != 0;
                pi.set_timeout_rereg(self.cfg.subnet_timeout, false);
                send |= old.subnet_timeout() != self.cfg.subnet_timeout;
            }
            if p != 0
                && switch
                && let Some((rg, _)) = remote
            {
                let leaf = self.subn.nodes.get(&rg).is_some_and(|r| !r.is_switch());
                let (hoq, stall) = if leaf {
                    (
                        self.cfg.leaf_head_of_queue_lifetime,
                        self.cfg.leaf_vl_stall_count,
                    )
                } else {
                    (self.cfg.head_of_queue_lifetime, self.cfg.vl_stall_count)
                };
                pi.set_stall_hoq(stall, hoq);
                send |= pi.0[42] != old.0[42];
            }
            let thd = (self.cfg.local_phy_errors_threshold & 0xf) << 4
                | (self.cfg.overrun_errors_threshold & 0xf);
            pi.set_error_threshold(thd);
            send |= old.error_threshold() != thd;
            let mtu = self.link_mtu(g, p);
            let vls = self.link_op_vls(g, p);
            pi.set_neighbor_mtu(mtu);
            pi.set_op_vls(vls);
            send |= old.neighbor_mtu() != mtu || old.op_vls() != vls;
        }
        // ClientReregister is write-only: never echoed.
        pi.set_timeout_rereg(pi.subnet_timeout(), false);
        if state != link::NO_CHANGE && state != old.port_state() {
            send = true;
        }
        if switch && p != 0 && self.sweep.first_time_master {
            send = true;
        }
        if send {
            self.push_set(path, g, p, pi);
        }
    }

    fn push_set(&mut self, path: Vec<u8>, g: u64, p: u8, pi: crate::ib_types::PortInfo) {
        self.req.push(Req::set(
            &path,
            attr::PORT_INFO,
            u32::from(p),
            pi.0,
            Ctx::SetPortInfo(g, p),
        ));
    }
}
