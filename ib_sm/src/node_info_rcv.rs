//! Discovery's answers, after OpenSM's `osm_node_info_rcv.c`, `osm_port_info_rcv.c` and `osm_sw_info_rcv.c`: a new node's NodeDescription, SwitchInfo and PortInfo are asked for, a switch port with its link up leads to the next node, the cable is recorded on both ends, and a port with IsSM has its SMInfo read.
//!
//! A node GUID reached over a second cable that its port is not on is a
//! suspected duplicate: NodeInfo is read again over the new route, and if
//! the node still claims that GUID it is reported (OpenSM's "ERR 0D01:
//! Found duplicated node GUID"), left unconfigured, and the sweep ends with
//! errors; a cable from a port to itself (two nodes back to back with one
//! GUID) is reported the same way (OpenSM exits there, this SM goes on).
//! Routers are treated as CAs; OpenSM's re-query in the opposite direction
//! and its alias GUIDs are left out.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::vec::Vec;

use crate::ib_types::{NodeInfo, PortInfo, SwitchInfo, attr, cap, node_type};
use crate::req::{Ctx, Req};
use crate::sm::Sm;
use crate::subnet::{Node, Physp, Switch};

/// Re-queries of a suspected duplicate GUID before it is reported.
const DUP_REQUERIES: u8 = 2;

impl Sm {
    /// A NodeInfo answer (`osm_ni_rcv_process`).
    pub(crate) fn ni_rcv(
        &mut self,
        req: &Req,
        from: Option<(u64, u8)>,
        dup: u8,
        data: &[u8; 64],
        now: u64,
    ) {
        let ni = NodeInfo::from_smp(data);
        let (t, nports, guid, pg, local) = (
            ni.node_type(),
            ni.num_ports(),
            ni.node_guid(),
            ni.port_guid(),
            ni.local_port_num(),
        );
        let switch = t == node_type::SWITCH;
        let sane = matches!(t, node_type::CA | node_type::SWITCH | node_type::ROUTER)
            && nports >= 1
            && guid != 0
            && (switch || (1..=nports).contains(&local));
        if !sane {
            self.stats.bad_mads += 1;
            self.note(
                now,
                format!(
                    "ERR 0D04: NodeInfo along {:?} not understood (type {t}, {nports} ports, local port {local}): node skipped",
                    req.path
                ),
            );
            return;
        }
        if from.is_none() {
            self.subn.sm_port_guid = if switch { guid } else { pg };
        }
        if let Some((fg, fp)) = from
            && fg == guid
            && fp == local
            && !switch
        {
            self.note(
                now,
                format!(
                    "ERR 0D01: Duplicate GUID found by link from a port to itself: node {guid:#018x}, port number {local}"
                ),
            );
            self.report_dup(guid);
            return;
        }
        // Is the port already on another cable?
        if let Some(n) = self.subn.nodes.get(&guid)
            && let Some(pp) = n.ports.get(&local)
            && let (Some(old), Some(new)) = (pp.remote, from)
            && old != new
        {
            if dup < DUP_REQUERIES {
                self.req.push(Req::get(
                    &req.path,
                    attr::NODE_INFO,
                    0,
                    Ctx::NodeInfo { from, dup: dup + 1 },
                ));
                return;
            }
            if !self.sweep.dups.contains(&guid) {
                self.note(
                    now,
                    format!(
                        "ERR 0D01: Found duplicated node GUID. Node {guid:#018x} port {local} is reachable from remote node {:#018x} port {} and remote node {:#018x} port {}. Paths are: {:?} and {:?}",
                        old.0, old.1, new.0, new.1, pp.path, req.path
                    ),
                );
            }
            self.report_dup(guid);
            return;
        }
        if !self.subn.nodes.contains_key(&guid) {
            let mut node = Node {
                ni,
                desc: [0; 64],
                path: req.path.clone(),
                sw: None,
                ports: BTreeMap::new(),
            };
            self.req
                .push(Req::get(&req.path, attr::NODE_DESC, 0, Ctx::NodeDesc(guid)));
            if switch {
                node.sw = Some(Switch {
                    info: SwitchInfo([0; 64]),
                    lft: Vec::new(),
                    mft: Vec::new(),
                });
                self.req.push(Req::get(
                    &req.path,
                    attr::SWITCH_INFO,
                    0,
                    Ctx::SwitchInfo {
                        node: guid,
                        light: false,
                    },
                ));
                for p in 0..=nports {
                    node.ports.insert(p, Physp::new(guid, req.path.clone()));
                    self.req.push(Req::get(
                        &req.path,
                        attr::PORT_INFO,
                        u32::from(p),
                        Ctx::PortInfo(guid, p),
                    ));
                }
            }
            self.subn.nodes.insert(guid, node);
        }
        if !switch {
            let new_port = self
                .subn
                .nodes
                .get(&guid)
                .is_some_and(|n| !n.ports.contains_key(&local));
            if new_port {
                if let Some(n) = self.subn.nodes.get_mut(&guid) {
                    n.ports.insert(local, Physp::new(pg, req.path.clone()));
                }
                self.req.push(Req::get(
                    &req.path,
                    attr::PORT_INFO,
                    u32::from(local),
                    Ctx::PortInfo(guid, local),
                ));
            }
        }
        // The cable, on both ends.
        if let Some((fg, fp)) = from {
            if let Some(pp) = self.subn.physp_mut(guid, local) {
                pp.remote = Some((fg, fp));
            }
            if let Some(pp) = self.subn.physp_mut(fg, fp) {
                pp.remote = Some((guid, local));
            }
        }
    }

    fn report_dup(&mut self, guid: u64) {
        if !self.sweep.dups.contains(&guid) {
            self.sweep.dups.push(guid);
            self.stats.duplicate_guids += 1;
        }
        self.sweep.init_error = true;
    }

    /// A PortInfo answer (`osm_pi_rcv_process`): a switch port with its
    /// link up leads further; an end port with IsSM has an SM to ask.
    pub(crate) fn pi_rcv(&mut self, req: &Req, g: u64, p: u8, data: &[u8; 64], _now: u64) {
        let pi = PortInfo::from_smp(data);
        let me = self.subn.sm_port_guid;
        let Some(n) = self.subn.nodes.get_mut(&g) else {
            return;
        };
        let switch = n.is_switch();
        let node_path = n.path.clone();
        let Some(pp) = n.ports.get_mut(&p) else {
            return;
        };
        pp.pi = Some(pi);
        let (remote, port_guid, port_path) = (pp.remote, pp.guid, pp.path.clone());
        // A switch port with its link up leads on; so does our own port
        // (`state_mgr_sweep_hop_1` of an SM on a CA).
        let ours = !switch && node_path.is_empty() && port_guid == me;
        if (switch && p != 0 || ours) && pi.link_up() && remote.is_none() && node_path.len() < 63 {
            let mut path = node_path;
            path.push(p);
            self.req.push(Req::get(
                &path,
                attr::NODE_INFO,
                0,
                Ctx::NodeInfo {
                    from: Some((g, p)),
                    dup: 0,
                },
            ));
        }
        let end = !switch || p == 0;
        if end && pi.capability_mask() & cap::IS_SM != 0 && port_guid != me && port_guid != 0 {
            let _ = req;
            self.req.push(Req::get(
                &port_path,
                attr::SM_INFO,
                0,
                Ctx::SmInfo(port_guid),
            ));
        }
    }

    /// A SwitchInfo answer (`osm_si_rcv_process`): kept, and in a light
    /// sweep a PortStateChange asks for a heavy sweep.
    pub(crate) fn si_rcv(&mut self, g: u64, light: bool, data: &[u8; 64], now: u64) {
        let si = SwitchInfo::from_smp(data);
        if light {
            if si.port_state_change() {
                self.note(
                    now,
                    format!("Switch {g:#018x}: PortStateChange: forcing a heavy sweep"),
                );
                self.sweep.force_heavy = true;
            }
            return;
        }
        if let Some(sw) = self.subn.nodes.get_mut(&g).and_then(|n| n.sw.as_mut()) {
            sw.info = si;
        }
    }
}
