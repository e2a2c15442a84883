//! The SM's own state machine, after OpenSM's `osm_sm_state_mgr.c`: DISCOVERING, STANDBY, MASTER and NOT ACTIVE, the polling of the master by a standby SM (SubnGet(SMInfo) every `sminfo_polling_timeout`, DISCOVERING again after `polling_retry_number` unanswered polls), the handover to a higher SM (once it stands by: OpenSM hands over to a discovering one too, which can lose it) and the wait for a lower master to hand over (C14-60.2.1).
//!
//! Signals OpenSM passes between its threads are direct calls here. The
//! election itself (priority, then the lower port GUID) is
//! [`crate::ib_types::sm_is_greater_than`].

use alloc::format;
use alloc::vec::Vec;

use ib_core::IbCore;

use crate::ib_types::{attr, sm_is_greater_than, sm_state, sminfo_mod};
use crate::req::{Ctx, Req};
use crate::sm::Sm;

impl Sm {
    /// DISCOVERING -> STANDBY (`OSM_SM_SIGNAL_MASTER_OR_HIGHER_SM_DETECTED`).
    pub(crate) fn enter_standby(&mut self, _core: &mut IbCore, now: u64) {
        self.state = sm_state::STANDBY;
        self.report_sm_state(now);
        self.start_polling(now);
    }

    /// MASTER -> STANDBY after a handover (`OSM_SM_SIGNAL_HANDOVER_SENT`).
    pub(crate) fn enter_standby_after_handover(&mut self, now: u64) {
        self.state = sm_state::STANDBY;
        self.report_sm_state(now);
        self.polling_sm_guid = 0;
        self.start_polling(now);
    }

    /// `sm_state_mgr_start_polling`: the first poll now, the next after
    /// the polling timeout.
    pub(crate) fn start_polling(&mut self, now: u64) {
        self.retry_number = 0;
        self.next_poll_ns = now;
    }

    /// `osm_sm_state_mgr_signal_master_is_alive`.
    pub(crate) fn master_is_alive(&mut self) {
        self.retry_number = 0;
    }

    /// The SM we poll: the master (standby) or the master we wait for.
    fn poll_target(&self) -> Option<u64> {
        match self.state {
            sm_state::STANDBY if self.master_sm_guid != 0 => Some(self.master_sm_guid),
            sm_state::MASTER if self.polling_sm_guid != 0 => Some(self.polling_sm_guid),
            _ => None,
        }
    }

    /// `osm_sm_state_mgr_polling_callback`: a poll, or the end of waiting.
    pub(crate) fn sm_state_timers(&mut self, core: &mut IbCore, now: u64) -> usize {
        let Some(target) = self.poll_target() else {
            return 0;
        };
        if now < self.next_poll_ns {
            return 0;
        }
        self.next_poll_ns =
            now.saturating_add(u64::from(self.cfg.polling_timeout_ms.max(1)) * 1_000_000);
        if self.retry_number > self.cfg.polling_retries {
            self.polling_timeout(core, now);
            return 1;
        }
        let path = self
            .remote_sms
            .get(&target)
            .map(|r| r.path.clone())
            .or_else(|| self.port_path(target).map(|(p, _)| p));
        if let Some(path) = path {
            self.req
                .push(Req::get(&path, attr::SM_INFO, 0, Ctx::SmInfo(target)));
            self.retry_number += 1;
        } else {
            // No route to it any more.
            self.retry_number = self.cfg.polling_retries + 1;
        }
        1
    }

    /// `OSM_SM_SIGNAL_POLLING_TIMEOUT`: the master is gone.
    fn polling_timeout(&mut self, _core: &mut IbCore, now: u64) {
        match self.state {
            sm_state::STANDBY => {
                self.note(
                    now,
                    format!(
                        "SM {:#018x} did not answer {} polls: taking over",
                        self.master_sm_guid, self.retry_number
                    ),
                );
                self.remote_sms.remove(&self.master_sm_guid);
                self.master_sm_guid = 0;
                self.state = sm_state::DISCOVERING;
                self.report_sm_state(now);
                self.sweep.coming_out_of_standby = true;
                self.request_heavy_sweep();
            }
            sm_state::MASTER => {
                self.note(
                    now,
                    format!(
                        "Forcing heavy sweep: remote master {:#018x} stopped answering",
                        self.polling_sm_guid
                    ),
                );
                self.remote_sms.remove(&self.polling_sm_guid);
                self.polling_sm_guid = 0;
                self.sweep.first_time_master = true;
                self.request_heavy_sweep();
            }
            _ => {}
        }
    }

    /// The highest remote SM if it is higher than us
    /// (`state_mgr_get_highest_sm`).
    pub(crate) fn highest_remote_sm(&self) -> Option<u64> {
        let mut best: Option<(u8, u64)> = None;
        let (mut hp, mut hg) = (self.cfg.priority, self.subn.sm_port_guid);
        for (g, r) in &self.remote_sms {
            if r.smi.state == sm_state::NOTACTIVE {
                continue;
            }
            if sm_is_greater_than(r.smi.priority, *g, hp, hg) {
                hp = r.smi.priority;
                hg = *g;
                best = Some((hp, hg));
            }
        }
        best.map(|b| b.1)
    }

    /// Whether the remote SM `g` is still discovering.
    pub(crate) fn still_discovering(&self, g: u64) -> bool {
        self.remote_sms
            .get(&g)
            .is_some_and(|r| r.smi.state == sm_state::DISCOVERING)
    }

    /// A higher SM that is still discovering gets no HANDOVER yet; we stay
    /// master until it stands by. OpenSM's master hands over at once
    /// (`state_mgr_send_handover` after the heavy sweep), but an OpenSM
    /// that receives it while DISCOVERING only sweeps again
    /// (`osm_sm_state_mgr_process`), a sweep it drops if the one under way
    /// has already read our SMInfo as MASTER: it then stands by for us
    /// while we stand by for it, until its polls of us time out (five
    /// polls, 10 s apart). Standing by, it polls us at once and, finding
    /// us lower, sends Trap 144; that trap (or our light sweep's SMInfo)
    /// brings the heavy sweep that hands over to a STANDBY SM, which
    /// always becomes master at a HANDOVER.
    pub(crate) fn wait_to_hand_over(&mut self, g: u64, now: u64) {
        if self.handover_waits_for != g {
            self.handover_waits_for = g;
            self.note(
                now,
                format!("Higher SM {g:#018x} is still DISCOVERING: handing over once it stands by"),
            );
        }
    }

    /// A remote SM in MASTER state (`state_mgr_exists_other_master_sm`).
    pub(crate) fn other_master_sm(&self) -> Option<u64> {
        self.remote_sms
            .iter()
            .find(|(_, r)| r.smi.state == sm_state::MASTER)
            .map(|(g, _)| *g)
    }

    /// `state_mgr_send_handover`: SubnSet(SMInfo) HANDOVER to `g`.
    pub(crate) fn send_handover(&mut self, g: u64, now: u64) {
        let Some(path) = self.remote_sms.get(&g).map(|r| r.path.clone()) else {
            return;
        };
        self.note(
            now,
            format!("Handing over mastership. Updating sm_state_mgr master_guid: {g:#018x}"),
        );
        self.master_sm_guid = g;
        self.stats.handovers_sent += 1;
        let mut data = [0u8; 64];
        self.our_sminfo(true).write(&mut data);
        self.req.push(Req::set(
            &path,
            attr::SM_INFO,
            sminfo_mod::HANDOVER,
            data,
            Ctx::SetSmInfo(g, sminfo_mod::HANDOVER),
        ));
    }

    /// The best standby SM we know, if any.
    pub(crate) fn best_standby(&self) -> Option<u64> {
        self.remote_sms
            .iter()
            .filter(|(_, r)| r.smi.state == sm_state::STANDBY)
            .map(|(g, r)| (r.smi.priority, *g))
            .reduce(|a, b| {
                if sm_is_greater_than(b.0, b.1, a.0, a.1) {
                    b
                } else {
                    a
                }
            })
            .map(|b| b.1)
    }

    /// Stops this SM (the console's `opensm stop`): a master hands over to
    /// the best standby SM first, as a master going away politely does.
    /// A master that knows of none looks once more (a heavy sweep's
    /// discovery: a standby SM that came after our last heavy sweep is
    /// only seen by one) before it decides.
    pub(crate) fn begin_stop(&mut self, core: &mut IbCore, now: u64) {
        self.stopping = true;
        if self.state != sm_state::MASTER {
            return;
        }
        let agent = self.dr_agent;
        self.req.clear(core, agent);
        self.sweep.stage = crate::state_mgr::Stage::Idle;
        match self.best_standby() {
            Some(g) => self.stop_handover(g, now),
            None => {
                self.stop_discover = true;
                self.sweep.next_ns = 0;
            }
        }
    }

    /// The handover of a stopping master.
    pub(crate) fn stop_handover(&mut self, g: u64, now: u64) {
        self.send_handover(g, now);
        self.state = sm_state::STANDBY;
        self.report_sm_state(now);
        self.sweep.stage = crate::state_mgr::Stage::Handover;
    }

    /// Whether a stopping SM is done (its handover answered, or nothing to
    /// hand over).
    pub(crate) fn stop_done(&self, now: u64) -> bool {
        self.stopping
            && (now >= self.stop_deadline
                || (!self.stop_discover && !self.sweep.busy() && self.req.idle()))
    }

    /// The directed route and LID of the end port with GUID `g`, from this
    /// sweep or the last.
    pub(crate) fn port_path(&self, g: u64) -> Option<(Vec<u8>, u16)> {
        for s in [&self.subn, &self.done] {
            for n in s.nodes.values() {
                for (&p, pp) in &n.ports {
                    if pp.guid == g && n.is_end(p) {
                        // Ours if we gave it, else what the port says.
                        let lid = self
                            .guid2lid
                            .get(&g)
                            .copied()
                            .or_else(|| pp.pi.map(|pi| pi.base_lid()))
                            .unwrap_or(0);
                        return Some((pp.path.clone(), lid));
                    }
                }
            }
        }
        None
    }
}
