//! The sweeps, after OpenSM's `osm_state_mgr.c` (`do_sweep`): a heavy sweep discovers the subnet, decides who is master, assigns LIDs, programs the switches and brings every port through Armed to Active; a light sweep reads the switches' PortStateChange and the other SMs' SMInfo.
//!
//! Each stage queues its SMPs and the next starts only when every answer of
//! the one before is in (OpenSM's `wait_for_pending_transactions`), so a
//! stage reads a stable subnet. A heavy sweep that met errors (a Set that
//! failed) ends with "Errors during initialization" instead of "SUBNET UP"
//! and the next sweep is a heavy one, as OpenSM's
//! `subnet_initialization_error` has it. Left out: the unicast cache, the
//! re-route-only path, P_Key, QoS, congestion control and alias GUID
//! managers, the event plugins and the dump files.

use alloc::format;
use alloc::vec::Vec;

use ib_core::IbCore;

use crate::ib_types::{attr, link, sm_state};
use crate::req::{Ctx, Done, Req};
use crate::sm::Sm;

/// Where a sweep is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// No sweep.
    Idle,
    /// A light sweep's SMPs are out.
    Light,
    /// Discovery (hop 0, hop 1, then breadth first).
    Discover,
    /// A handover was sent; waiting for its answer.
    Handover,
    /// Our own port's PortInfo (`osm_lid_mgr_process_sm`).
    SmLid,
    /// Every other end port's PortInfo (`osm_lid_mgr_process_subnet`).
    Lids,
    /// SwitchInfo and LFT blocks (`osm_ucast_mgr_process`).
    Ucast,
    /// MFT blocks (`osm_mcast_mgr_process`).
    Mcast,
    /// Switch ports' link parameters (`osm_link_mgr_process`, NO_CHANGE).
    Links,
    /// Ports to Armed.
    Armed,
    /// Ports to Active.
    Active,
}

/// The sweep's state (OpenSM keeps it in `osm_subn_t`).
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Stage.
    pub stage: Stage,
    /// A heavy sweep is wanted (`force_heavy_sweep`).
    pub force_heavy: bool,
    /// The SM just became master: every port gets a PortInfo Set
    /// (`first_time_master_sweep`).
    pub first_time_master: bool,
    /// Coming out of standby: LIDs are written again (`coming_out_of_standby`).
    pub coming_out_of_standby: bool,
    /// A Set failed (`subnet_initialization_error`).
    pub init_error: bool,
    /// Another master or a higher SM answered while discovering.
    pub master_sm_found: bool,
    /// When the next periodic sweep is due (ns).
    pub next_ns: u64,
    /// When this sweep started (ns), and the SMP count then.
    pub start_ns: u64,
    /// SMPs sent before this sweep.
    pub smps_at_start: u64,
    /// A heavy sweep is under way (vs light).
    pub heavy: bool,
    /// Suspected duplicate GUIDs reported this sweep.
    pub dups: Vec<u64>,
    /// A trap (or our port) asked for a heavy sweep while one ran: the
    /// next starts at once.
    pub again_now: bool,
    /// A node did not answer its NodeInfo this sweep: the next periodic
    /// sweep is heavy, to find it again.
    pub unresolved: bool,
}

impl Sweep {
    /// The state of a new SM: a heavy sweep at once.
    pub fn new() -> Sweep {
        Sweep {
            stage: Stage::Idle,
            force_heavy: true,
            first_time_master: false,
            coming_out_of_standby: false,
            init_error: false,
            master_sm_found: false,
            next_ns: 0,
            start_ns: 0,
            smps_at_start: 0,
            heavy: false,
            dups: Vec::new(),
            again_now: false,
            unresolved: false,
        }
    }
    /// Whether a sweep is under way.
    pub fn busy(&self) -> bool {
        self.stage != Stage::Idle
    }
}

impl Default for Sweep {
    fn default() -> Self {
        Sweep::new()
    }
}

impl Sm {
    /// Asks for a heavy sweep as soon as the current one (if any) is done
    /// (`osm_sm_signal(OSM_SIGNAL_SWEEP)` with `force_heavy_sweep`).
    pub(crate) fn request_heavy_sweep(&mut self) {
        self.sweep.force_heavy = true;
        if self.sweep.busy() {
            self.sweep.again_now = true;
        } else {
            self.sweep.next_ns = 0;
        }
    }

    /// The current stage has nothing outstanding: go on. Returns whether
    /// something changed.
    pub(crate) fn advance(&mut self, core: &mut IbCore, now: u64) -> bool {
        match self.sweep.stage {
            Stage::Idle => {
                if self.stopping {
                    if !self.stop_discover {
                        return false;
                    }
                    self.stop_discover = false;
                    self.start_heavy(now);
                    return true;
                }
                if now < self.sweep.next_ns
                    || !matches!(self.state, sm_state::MASTER | sm_state::DISCOVERING)
                {
                    return false;
                }
                self.start_sweep(now);
                true
            }
            Stage::Light => {
                self.stats.smps_last_light = self
                    .req
                    .counters
                    .sent
                    .saturating_sub(self.sweep.smps_at_start);
                if self.sweep.force_heavy {
                    self.start_heavy(now);
                } else {
                    self.stats.light_sweeps += 1;
                    self.end_sweep(now);
                }
                true
            }
            Stage::Discover => {
                self.discovery_done(core, now);
                true
            }
            Stage::Handover => {
                // The handover was answered (or not): stand by.
                self.end_sweep(now);
                true
            }
            Stage::SmLid => {
                self.lid_mgr_process_subnet(now);
                self.sweep.stage = Stage::Lids;
                true
            }
            Stage::Lids => {
                self.ucast_mgr_process(now);
                self.sweep.stage = Stage::Ucast;
                true
            }
            Stage::Ucast => {
                self.mcast_mgr_process(now);
                self.sweep.stage = Stage::Mcast;
                true
            }
            Stage::Mcast => {
                self.link_mgr_process(link::NO_CHANGE);
                self.sweep.stage = Stage::Links;
                true
            }
            Stage::Links => {
                self.link_mgr_process(link::ARMED);
                self.sweep.stage = Stage::Armed;
                true
            }
            Stage::Armed => {
                self.link_mgr_process(link::ACTIVE);
                self.sweep.stage = Stage::Active;
                true
            }
            Stage::Active => {
                self.heavy_sweep_done(now);
                true
            }
        }
    }

    fn start_sweep(&mut self, now: u64) {
        self.sweep.start_ns = now;
        self.sweep.smps_at_start = self.req.counters.sent;
        // A light sweep needs switches to ask (back to back, every sweep
        // is heavy, as OpenSM does when it has no switch).
        let has_switches = self.done.switches().next().is_some();
        if has_switches
            && self.state == sm_state::MASTER
            && !self.sweep.force_heavy
            && !self.sweep.init_error
        {
            self.start_light(now);
        } else {
            self.start_heavy(now);
        }
    }

    /// `state_mgr_light_sweep_start`: SwitchInfo of every switch, SMInfo of
    /// every other SM.
    fn start_light(&mut self, _now: u64) {
        self.sweep.stage = Stage::Light;
        self.sweep.heavy = false;
        let sws: Vec<(u64, Vec<u8>)> = self
            .done
            .switches()
            .map(|n| (n.guid(), n.path.clone()))
            .collect();
        for (g, path) in sws {
            self.req.push(Req::get(
                &path,
                attr::SWITCH_INFO,
                0,
                Ctx::SwitchInfo {
                    node: g,
                    light: true,
                },
            ));
        }
        let sms: Vec<(u64, Vec<u8>)> = self
            .remote_sms
            .iter()
            .map(|(g, r)| (*g, r.path.clone()))
            .collect();
        for (g, path) in sms {
            self.req
                .push(Req::get(&path, attr::SM_INFO, 0, Ctx::SmInfo(g)));
        }
    }

    /// A heavy sweep: discovery from our own node (`state_mgr_sweep_hop_0`).
    pub(crate) fn start_heavy(&mut self, now: u64) {
        self.sweep.stage = Stage::Discover;
        self.sweep.heavy = true;
        self.sweep.force_heavy = false;
        self.sweep.init_error = false;
        self.sweep.master_sm_found = false;
        self.sweep.unresolved = false;
        self.sweep.dups.clear();
        self.sweep.start_ns = now;
        self.sweep.smps_at_start = self.req.counters.sent;
        if self.sweep.coming_out_of_standby {
            // `state_mgr_clean_known_lids`: every port gets its LID and the
            // new SM LID written again.
            self.programmed_lft.clear();
            self.programmed_mft.clear();
        }
        let keep = (self.subn.sm_port_guid, self.subn.sm_lid);
        self.subn = crate::subnet::Subnet {
            sm_port_guid: keep.0,
            sm_lid: keep.1,
            ..Default::default()
        };
        self.req.push(Req::get(
            &[],
            attr::NODE_INFO,
            0,
            Ctx::NodeInfo { from: None, dup: 0 },
        ));
    }

    /// Discovery is over: stand by, hand over or go on as master
    /// (`do_sweep` after `state_mgr_sweep_hop_1`).
    fn discovery_done(&mut self, core: &mut IbCore, now: u64) {
        // Our own port must be there and up.
        let me = self.subn.sm_port_guid;
        let my_state = self
            .subn
            .nodes
            .values()
            .flat_map(|n| n.ports.values())
            .find(|p| p.guid == me && me != 0)
            .map(|p| p.state());
        match my_state {
            Some(s) if s >= link::INIT => {}
            _ => {
                self.note(now, "SM port is down".into());
                self.sweep.stage = Stage::Idle;
                self.sweep.force_heavy = true;
                self.sweep.next_ns = now.saturating_add(1_000_000_000);
                if self.state != sm_state::DISCOVERING {
                    self.state = sm_state::DISCOVERING;
                    self.report_sm_state(now);
                }
                return;
            }
        }
        if self.stopping {
            // The look of a stopping master for a standby SM.
            match self.best_standby() {
                Some(g) => self.stop_handover(g, now),
                None => self.sweep.stage = Stage::Idle,
            }
            return;
        }
        if self.sweep.master_sm_found {
            // OSM_SM_SIGNAL_MASTER_OR_HIGHER_SM_DETECTED.
            self.enter_standby(core, now);
            self.send_trap144(core, 0);
            self.sweep.stage = Stage::Idle;
            return;
        }
        if self.sweep.again_now {
            // Something changed while we looked: look again.
            self.sweep.again_now = false;
            self.start_heavy(now);
            return;
        }
        self.note_quiet(now, "HEAVY SWEEP COMPLETE".into());
        if self.state == sm_state::MASTER {
            match self.highest_remote_sm() {
                Some(g) if self.still_discovering(g) => self.wait_to_hand_over(g, now),
                Some(g) => {
                    self.handover_waits_for = 0;
                    self.send_handover(g, now);
                    self.sweep.stage = Stage::Handover;
                    self.enter_standby_after_handover(now);
                    return;
                }
                None => self.handover_waits_for = 0,
            }
            if let Some(g) = self.other_master_sm() {
                // C14-60.2.1: wait for the other master to hand over, and
                // poll it.
                if self.polling_sm_guid != g {
                    self.note(
                        now,
                        format!("Found remote master SM with guid:{g:#018x}; polling it"),
                    );
                }
                self.polling_sm_guid = g;
                self.start_polling(now);
            } else if self.polling_sm_guid != 0 {
                self.polling_sm_guid = 0;
            }
        }
        if self.state == sm_state::DISCOVERING {
            // OSM_SM_SIGNAL_DISCOVERY_COMPLETED.
            self.state = sm_state::MASTER;
            self.report_sm_state(now);
            self.sweep.first_time_master = true;
        }
        self.lid_mgr_assign(now);
        self.lid_mgr_process_sm();
        self.sweep.stage = Stage::SmLid;
    }

    /// End of a heavy sweep (`do_sweep`'s tail): SUBNET UP, or the errors.
    fn heavy_sweep_done(&mut self, now: u64) {
        self.stats.heavy_sweeps += 1;
        self.stats.smps_last_heavy = self
            .req
            .counters
            .sent
            .saturating_sub(self.sweep.smps_at_start);
        self.stats.last_heavy_ns = now.saturating_sub(self.sweep.start_ns);
        self.sweep.coming_out_of_standby = false;
        let first = core::mem::take(&mut self.sweep.first_time_master);
        // The SA answers from what this sweep found.
        let lids = self.guid2lid.clone();
        self.subn.index_ports(&lids);
        self.done = self.subn.clone();
        if self.sweep.init_error {
            self.stats.init_errors += 1;
            self.note(now, "Errors during initialization".into());
            self.sweep.force_heavy = true;
        } else {
            self.stats.subnet_ups += 1;
            if self.stats.first_up_ns == 0 {
                self.stats.first_up_ns = now.saturating_sub(self.started_ns).max(1);
            }
            let msg = format!(
                "SUBNET UP ({} nodes, {} end ports, {} SMPs, {}.{:03} ms)",
                self.done.nodes.len(),
                self.done.ports.len(),
                self.stats.smps_last_heavy,
                self.stats.last_heavy_ns / 1_000_000,
                self.stats.last_heavy_ns / 1000 % 1000
            );
            // `state_mgr_up_msg`: to the system log the first time as
            // master, at the info level after.
            if first {
                self.note(now, msg);
            } else {
                self.note_quiet(now, msg);
            }
        }
        if self.sweep.unresolved {
            self.sweep.force_heavy = true;
        }
        self.sa_subnet_changed();
        self.end_sweep(now);
    }

    fn end_sweep(&mut self, now: u64) {
        self.sweep.stage = Stage::Idle;
        let again = core::mem::take(&mut self.sweep.again_now);
        self.sweep.next_ns = if again {
            // A trap came during the sweep: again at once.
            now
        } else if self.cfg.sweep_interval_ms == 0 {
            u64::MAX
        } else {
            now.saturating_add(u64::from(self.cfg.sweep_interval_ms) * 1_000_000)
        };
    }

    /// One request ended: its answer goes to the receiver of its kind.
    pub(crate) fn complete(&mut self, core: &mut IbCore, d: Done, now: u64) {
        match d {
            Done::Ok(req, data) => match req.ctx.clone() {
                Ctx::NodeInfo { from, dup } => self.ni_rcv(&req, from, dup, &data, now),
                Ctx::NodeDesc(g) => {
                    if let Some(n) = self.subn.nodes.get_mut(&g) {
                        n.desc = data;
                    }
                }
                Ctx::SwitchInfo { node, light } => self.si_rcv(node, light, &data, now),
                Ctx::PortInfo(g, p) => self.pi_rcv(&req, g, p, &data, now),
                Ctx::SmInfo(g) => self.sminfo_rcv_get_resp(core, g, &data, now),
                Ctx::SetSmInfo(g, m) => self.sminfo_set_done(g, m, &data, now),
                Ctx::SetPortInfo(g, p) => {
                    if let Some(pp) = self.subn.physp_mut(g, p) {
                        pp.pi = Some(crate::ib_types::PortInfo::from_smp(&data));
                    }
                }
                Ctx::SetSwitchInfo(g) => {
                    if let Some(sw) = self.subn.nodes.get_mut(&g).and_then(|n| n.sw.as_mut()) {
                        sw.info = crate::ib_types::SwitchInfo::from_smp(&data);
                    }
                }
                Ctx::SetLft(g, block) => {
                    let base = usize::from(block) * 64;
                    let lft = self.programmed_lft.entry(g).or_default();
                    if lft.len() < base + 64 {
                        lft.resize(base + 64, crate::ib_types::LFT_NO_PATH);
                    }
                    lft[base..base + 64].copy_from_slice(&data);
                }
                Ctx::SetMft(g, block, pos) => self.mft_set_done(g, block, pos, &data),
            },
            Done::Status(req, st) => {
                self.note(
                    now,
                    format!(
                        "ERR 3111: Error status = {st:#06x} for {} attr {:#06x} mod {:#x} along {:?}",
                        if req.method == ib_core::mad::method::SET {
                            "SubnSet"
                        } else {
                            "SubnGet"
                        },
                        req.attr_id,
                        req.attr_mod,
                        req.path
                    ),
                );
                self.request_failed(req, now);
            }
            Done::Timeout(req) => {
                if req.method == ib_core::mad::method::GET {
                    self.note(
                        now,
                        format!(
                            "ERR 3120: Timeout while getting attribute {:#06x} mod {:#x} along {:?}",
                            req.attr_id, req.attr_mod, req.path
                        ),
                    );
                } else {
                    self.note(
                        now,
                        format!(
                            "ERR 3119: Set method failed for attribute {:#06x} mod {:#x} along {:?}",
                            req.attr_id, req.attr_mod, req.path
                        ),
                    );
                }
                self.request_failed(req, now);
            }
        }
    }

    /// What a failed request means for the sweep.
    fn request_failed(&mut self, req: Req, now: u64) {
        match req.ctx {
            Ctx::SetPortInfo(g, p) | Ctx::PortInfo(g, p) => {
                if let Some(pp) = self.subn.physp_mut(g, p) {
                    pp.failed = true;
                }
                if matches!(req.ctx, Ctx::SetPortInfo(..)) {
                    self.sweep.init_error = true;
                }
            }
            Ctx::SetSwitchInfo(g) | Ctx::SetLft(g, _) | Ctx::SetMft(g, _, _) => {
                // Unknown contents now: written again in full next time.
                self.programmed_lft.remove(&g);
                self.programmed_mft.remove(&g);
                self.sweep.init_error = true;
            }
            Ctx::SwitchInfo { light: true, .. } => {
                // A switch that stopped answering: look at everything.
                self.request_heavy_sweep();
            }
            Ctx::SmInfo(g) => self.sminfo_failed(g, now),
            Ctx::SetSmInfo(g, m) => self.sminfo_set_failed(g, m, now),
            Ctx::NodeInfo { .. } => self.sweep.unresolved = true,
            Ctx::NodeDesc(_) | Ctx::SwitchInfo { .. } => {}
        }
    }
}
