//! The embedded SM's election, after OpenSM's `osm_sminfo_rcv.c` and `osm_sm_state_mgr.c`: SMInfo of other SMs read in discovery and light sweeps, DISCOVERING / STANDBY / MASTER / NOT ACTIVE, the polling of the master by a standby SM, handover to a higher SM, trap 144 to a master that should hand over, and SMInfo Get/Set answered on this SM's port.
//!
//! As OpenSM 3.3.23: a discovering SM that finds a master, or a higher SM,
//! stands by and polls it (SubnGet(SMInfo) every `polling_interval_ns`),
//! taking the subnet when `polling_retries` polls in a row go unanswered;
//! a standby that is higher than its master sends it trap 144 (SM
//! priority changed), so that the master sweeps, finds it and hands over;
//! a master whose heavy sweep finds a higher SM hands over
//! (SubnSet(SMInfo) HANDOVER) and stands by; a master that finds a lower
//! master polls it and sends it trap 144 until it hands over. Higher means
//! a higher priority, then the lower port GUID. An SM whose SM_Key is not
//! ours (when ours is not 0) is ignored (ERR 2F18), as is an answer whose
//! GUID is not the port's (ERR 2F13). SubnSet(SMInfo) is taken as OpenSM
//! takes it: ACKNOWLEDGE only from a standby, HANDOVER, DISABLE, STANDBY
//! and DISCOVER only from a master, and each only where our state allows;
//! otherwise status 7. Left out: the SM_Key's protection of SMInfo (it is
//! always shown, as OpenSM does without M_Key protection).

use super::{Ctx, Req, SubnetManager, be64, sm_state};
use crate::fabric::packet::{self, MAD_LEN, MadHdr, Smp, attr, method, mgmt_class};
use crate::fabric::{Fabric, Packet};

/// SMInfo attribute modifiers of a SubnSet (IBTA 14.4.1).
pub mod sminfo_mod {
    #![allow(missing_docs)]
    pub const HANDOVER: u32 = 1;
    pub const ACKNOWLEDGE: u32 = 2;
    pub const DISABLE: u32 = 3;
    pub const STANDBY: u32 = 4;
    pub const DISCOVER: u32 = 5;
}

/// Trap 144 change flag: SM priority changed.
const CHANGE_SM_PRIORITY: u16 = 0x0008;

/// Another SM as its SMInfo last said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSm {
    /// Directed route to its port.
    pub path: Vec<u8>,
    /// Its port's LID (as the port reported it).
    pub lid: u16,
    /// Priority.
    pub priority: u8,
    /// SMState.
    pub state: u8,
    /// ActCount.
    pub act_count: u32,
}

/// `osm_sm_is_greater_than`: whether an SM of priority `p1` and port GUID
/// `g1` wins over one of `p2`, `g2` (higher priority, then lower GUID).
pub fn sm_is_greater_than(p1: u8, g1: u64, p2: u8, g2: u64) -> bool {
    p1 > p2 || (p1 == p2 && g1 < g2)
}

/// OpenSM's words for an SM state.
pub fn state_str(s: u8) -> &'static str {
    match s {
        sm_state::NOT_ACTIVE => "NOT ACTIVE",
        sm_state::DISCOVERING => "DISCOVERING",
        sm_state::STANDBY => "STANDBY",
        sm_state::MASTER => "MASTER",
        _ => "UNKNOWN STATE",
    }
}

impl SubnetManager {
    /// The other SMs this SM knows: (port GUID, LID, priority, state).
    pub fn remote_sms(&self) -> Vec<(u64, u16, u8, u8)> {
        self.remote_sms
            .iter()
            .map(|(g, r)| (*g, r.lid, r.priority, r.state))
            .collect()
    }

    /// The master this SM stands by for (0 if none).
    pub fn master_guid(&self) -> u64 {
        self.master_guid
    }

    /// Our SMInfo (IBTA 14.2.5.13) in SMP data.
    fn our_sminfo(&self, out: &mut [u8; 64]) {
        out[0..8].copy_from_slice(&self.port_guid().to_be_bytes());
        out[8..16].copy_from_slice(&self.cfg.sm_key.to_be_bytes());
        out[16..20].copy_from_slice(&self.act_count.to_be_bytes());
        out[20] = (self.cfg.priority & 0xf) << 4 | (self.sm_state & 0xf);
    }

    fn enter_state(&mut self, now: u64, s: u8) {
        if self.sm_state != s {
            self.note(now, format!("Entering {} state", state_str(s)));
        }
        if s != sm_state::MASTER {
            // The SA is silent until a sweep as master completes.
            self.up_done = false;
        }
        self.sm_state = s;
    }

    /// Queues a SubnGet(SMInfo) of the SM at port `guid` along `path`.
    pub(super) fn queue_sminfo_get(&mut self, guid: u64, path: Vec<u8>, lid: u16) {
        self.queue.push_back(Req {
            path,
            meth: method::GET,
            attr_id: attr::SM_INFO,
            attr_mod: 0,
            data: [0; 64],
            ctx: Ctx::SmInfo { guid, lid },
        });
    }

    /// SubnGet/SubnSet(SMInfo) to our port (another SM, or `sminfo`):
    /// our SMInfo, and for a Set the transition it asks for.
    pub(super) fn sminfo_request(&mut self, now: u64, smp: &Smp, out: &mut [u8; 64]) -> u16 {
        let remote = smp.data;
        out.fill(0);
        self.our_sminfo(out);
        if smp.hdr.method == method::GET {
            return 0;
        }
        let (rguid, rstate) = (be64(&remote, 0), remote[20] & 0xf);
        let amod = smp.hdr.attr_mod;
        let legal = match amod {
            sminfo_mod::ACKNOWLEDGE => rstate == sm_state::STANDBY,
            sminfo_mod::HANDOVER
            | sminfo_mod::DISABLE
            | sminfo_mod::STANDBY
            | sminfo_mod::DISCOVER => rstate == sm_state::MASTER,
            _ => false,
        };
        let transition = matches!(
            (self.sm_state, amod),
            (sm_state::DISCOVERING, sminfo_mod::HANDOVER)
                | (
                    sm_state::STANDBY,
                    sminfo_mod::DISCOVER
                        | sminfo_mod::DISABLE
                        | sminfo_mod::HANDOVER
                        | sminfo_mod::ACKNOWLEDGE,
                )
                | (sm_state::NOT_ACTIVE, sminfo_mod::STANDBY)
                | (sm_state::MASTER, sminfo_mod::HANDOVER)
        );
        if !legal || !transition {
            self.note(
                now,
                format!(
                    "ERR 2F04: SubnSet(SMInfo) modifier {amod:#x} from SM {rguid:#018x} in state {}: refused in state {}",
                    state_str(rstate),
                    state_str(self.sm_state)
                ),
            );
            return 7;
        }
        match (self.sm_state, amod) {
            (sm_state::STANDBY | sm_state::DISCOVERING, sminfo_mod::HANDOVER) => {
                self.stats.handovers_received += 1;
                self.note(now, format!("Received a HANDOVER from SM {rguid:#018x}"));
                self.enter_state(now, sm_state::MASTER);
                self.master_guid = 0;
                if let Some(r) = self.remote_sms.get_mut(&rguid) {
                    r.state = sm_state::STANDBY;
                }
                self.become_master(now);
            }
            (sm_state::MASTER, sminfo_mod::HANDOVER) => {
                self.stats.handovers_received += 1;
                self.note(
                    now,
                    format!("Forcing heavy sweep. Received a HANDOVER from SM {rguid:#018x}"),
                );
                self.polling_guid = 0;
                if let Some(r) = self.remote_sms.get_mut(&rguid) {
                    r.state = sm_state::STANDBY;
                }
                self.become_master(now);
            }
            (sm_state::STANDBY, sminfo_mod::DISCOVER) => {
                self.enter_state(now, sm_state::DISCOVERING);
                self.master_guid = 0;
                self.request_sweep();
            }
            (sm_state::STANDBY, sminfo_mod::DISABLE) => {
                self.enter_state(now, sm_state::NOT_ACTIVE);
                self.master_guid = 0;
            }
            (sm_state::NOT_ACTIVE, sminfo_mod::STANDBY) => {
                self.enter_state(now, sm_state::STANDBY);
                self.master_guid = rguid;
                self.start_polling(now);
            }
            _ => {}
        }
        // The ACK a handover asks for is not modelled: OpenSM sends none
        // either in 3.3.23 (the master goes by the Set's answer).
        0
    }

    /// A first sweep as master: every port is written again and asked to
    /// re-register (`force_first_time_master_sweep`).
    fn become_master(&mut self, now: u64) {
        self.up_done = false;
        self.rereg_done = false;
        self.programmed.clear();
        self.programmed_mft.clear();
        self.request_sweep();
        let _ = now;
    }

    /// `sm_state_mgr_start_polling`: the first poll now.
    fn start_polling(&mut self, now: u64) {
        self.poll_retry = 0;
        self.next_poll = now;
    }

    /// The SM we poll: the master (standby) or the master we wait for.
    pub(super) fn poll_target(&self) -> Option<u64> {
        match self.sm_state {
            sm_state::STANDBY if self.master_guid != 0 => Some(self.master_guid),
            sm_state::MASTER if self.polling_guid != 0 => Some(self.polling_guid),
            _ => None,
        }
    }

    /// `osm_sm_state_mgr_polling_callback`: a poll of the SM we watch, or,
    /// after `polling_retries` unanswered, the end of waiting. Returns
    /// whether anything happened.
    pub(super) fn sm_state_timers(&mut self, now: u64) -> bool {
        let Some(target) = self.poll_target() else {
            return false;
        };
        if now < self.next_poll {
            return false;
        }
        self.next_poll = now.saturating_add(self.cfg.polling_interval_ns.max(1));
        if self.poll_retry > self.cfg.polling_retries {
            self.polling_timeout(now);
            return true;
        }
        match self
            .remote_sms
            .get(&target)
            .map(|r| (r.path.clone(), r.lid))
        {
            Some((path, lid)) => {
                self.stats.sminfo_polls += 1;
                self.queue_sminfo_get(target, path, lid);
                self.poll_retry += 1;
            }
            None => self.poll_retry = self.cfg.polling_retries + 1,
        }
        true
    }

    /// `OSM_SM_SIGNAL_POLLING_TIMEOUT`: the SM we watched is gone.
    fn polling_timeout(&mut self, now: u64) {
        match self.sm_state {
            sm_state::STANDBY => {
                let g = self.master_guid;
                self.note(
                    now,
                    format!(
                        "SM {g:#018x} did not answer {} polls: taking over",
                        self.poll_retry
                    ),
                );
                self.remote_sms.remove(&g);
                self.master_guid = 0;
                self.enter_state(now, sm_state::DISCOVERING);
                self.rereg_done = false;
                self.programmed.clear();
                self.programmed_mft.clear();
                self.request_sweep();
            }
            sm_state::MASTER => {
                let g = self.polling_guid;
                self.note(
                    now,
                    format!("Forcing heavy sweep: remote master {g:#018x} stopped answering"),
                );
                self.remote_sms.remove(&g);
                self.polling_guid = 0;
                self.request_sweep();
            }
            _ => {}
        }
    }

    /// Our SubnGet(SMInfo) was answered (`smi_rcv_process_get_response`).
    pub(super) fn sminfo_answer(
        &mut self,
        now: u64,
        guid: u64,
        lid: u16,
        path: &[u8],
        d: &[u8; 64],
    ) {
        let (rguid, key, act, prio, state) = (
            be64(d, 0),
            be64(d, 8),
            u32::from_be_bytes([d[16], d[17], d[18], d[19]]),
            d[20] >> 4,
            d[20] & 0xf,
        );
        if self.cfg.sm_key != 0 && key != self.cfg.sm_key {
            self.note(
                now,
                format!("ERR 2F18: Got SM {rguid:#018x} with sm_key that doesn't match our local key: ignored"),
            );
            return;
        }
        if rguid != guid {
            self.note(
                now,
                format!(
                    "ERR 2F13: Bogus SM port GUID: expected {guid:#018x}, received {rguid:#018x}"
                ),
            );
            return;
        }
        if guid == self.port_guid() {
            return;
        }
        let known = self.remote_sms.insert(
            guid,
            RemoteSm {
                path: path.to_vec(),
                lid,
                priority: prio,
                state,
                act_count: act,
            },
        );
        if known
            .as_ref()
            .is_none_or(|k| k.state != state || k.priority != prio)
        {
            self.note(
                now,
                format!(
                    "SM {guid:#018x} (LID {lid}) in state {}, priority {prio}",
                    state_str(state)
                ),
            );
        }
        let higher = sm_is_greater_than(prio, guid, self.cfg.priority, self.port_guid());
        let light = self.stage == super::Stage::Light;
        match self.sm_state {
            sm_state::DISCOVERING
                if state == sm_state::MASTER
                    || higher && matches!(state, sm_state::DISCOVERING | sm_state::STANDBY) =>
            {
                self.master_found = true;
                self.master_guid = guid;
            }
            sm_state::STANDBY => match state {
                sm_state::MASTER => {
                    self.poll_retry = 0;
                    self.master_guid = guid;
                    if !higher {
                        // We are the better SM: the master should sweep,
                        // find us and hand over.
                        self.trap_owed = Some(lid);
                    }
                }
                sm_state::STANDBY if guid == self.master_guid && higher => self.poll_retry = 0,
                _ => {}
            },
            sm_state::MASTER => match state {
                sm_state::MASTER => {
                    if self.polling_guid != 0 {
                        if higher {
                            self.heavy_requested = true;
                        } else {
                            self.trap_owed = Some(lid);
                        }
                        self.poll_retry = 0;
                    } else if light {
                        self.heavy_requested = true;
                    }
                }
                sm_state::STANDBY if light && higher => self.heavy_requested = true,
                _ => {}
            },
            _ => {}
        }
    }

    /// An SMInfo we asked for never came (or came with an error).
    pub(super) fn sminfo_failed(&mut self, now: u64, guid: u64) {
        if self.poll_target() != Some(guid) && self.remote_sms.remove(&guid).is_some() {
            // Gone between sweeps: forgotten.
            self.note(now, format!("SM {guid:#018x} no longer answers"));
        }
    }

    /// Our SubnSet(SMInfo) was answered, or not.
    pub(super) fn sminfo_set_done(&mut self, now: u64, guid: u64, amod: u32, ok: bool) {
        if amod != sminfo_mod::HANDOVER {
            return;
        }
        if ok {
            self.note(now, format!("HANDOVER to SM {guid:#018x} answered"));
        } else if self.sm_state == sm_state::STANDBY {
            self.note(
                now,
                format!("HANDOVER to SM {guid:#018x} failed: discovering again"),
            );
            self.master_guid = 0;
            self.enter_state(now, sm_state::DISCOVERING);
            self.request_sweep();
        }
    }

    /// The highest other SM, if it is higher than us
    /// (`state_mgr_get_highest_sm`).
    fn highest_remote_sm(&self) -> Option<u64> {
        let (mut hp, mut hg) = (self.cfg.priority, self.port_guid());
        let mut best = None;
        for (g, r) in &self.remote_sms {
            if r.state == sm_state::NOT_ACTIVE {
                continue;
            }
            if sm_is_greater_than(r.priority, *g, hp, hg) {
                (hp, hg) = (r.priority, *g);
                best = Some(*g);
            }
        }
        best
    }

    /// Discovery is over (`do_sweep` after `state_mgr_sweep_hop_1`): stand
    /// by, hand over, or go on as master. Returns whether the sweep goes
    /// on.
    pub(super) fn discovery_done(&mut self, f: &mut Fabric, now: u64) -> bool {
        if self.master_found && self.sm_state == sm_state::DISCOVERING {
            // OSM_SM_SIGNAL_MASTER_OR_HIGHER_SM_DETECTED.
            self.note(
                now,
                format!(
                    "found master or higher SM {:#018x}: standing by",
                    self.master_guid
                ),
            );
            self.enter_state(now, sm_state::STANDBY);
            self.start_polling(now);
            return false;
        }
        if self.sm_state == sm_state::MASTER {
            if let Some(g) = self.highest_remote_sm() {
                self.send_handover(now, g);
                return false;
            }
            let other = self
                .remote_sms
                .iter()
                .find(|(_, r)| r.state == sm_state::MASTER)
                .map(|(g, r)| (*g, r.lid));
            match other {
                Some((g, lid)) => {
                    // C14-60.2.1: the lower master should hand over; poll
                    // it, and tell it.
                    if self.polling_guid != g {
                        self.note(
                            now,
                            format!("Found remote master SM with guid:{g:#018x}; polling it"),
                        );
                        self.start_polling(now);
                    }
                    self.polling_guid = g;
                    self.send_trap144(f, now, lid);
                }
                None => self.polling_guid = 0,
            }
        }
        if self.sm_state == sm_state::DISCOVERING {
            // OSM_SM_SIGNAL_DISCOVERY_COMPLETED.
            self.enter_state(now, sm_state::MASTER);
            self.up_done = false;
        }
        true
    }

    /// `state_mgr_send_handover`: SubnSet(SMInfo) HANDOVER to `g`; we
    /// stand by for it.
    fn send_handover(&mut self, now: u64, g: u64) {
        let Some(path) = self.remote_sms.get(&g).map(|r| r.path.clone()) else {
            return;
        };
        self.note(now, format!("Handing over mastership to SM {g:#018x}"));
        self.stats.handovers_sent += 1;
        let mut data = [0u8; 64];
        self.our_sminfo(&mut data);
        self.queue.push_back(Req {
            path,
            meth: method::SET,
            attr_id: attr::SM_INFO,
            attr_mod: sminfo_mod::HANDOVER,
            data,
            ctx: Ctx::SetSmInfo {
                guid: g,
                amod: sminfo_mod::HANDOVER,
            },
        });
        self.master_guid = g;
        self.polling_guid = 0;
        self.enter_state(now, sm_state::STANDBY);
        self.start_polling(now);
    }

    /// Sends the trap 144 owed (SM priority changed), if any.
    pub(super) fn send_owed_trap(&mut self, f: &mut Fabric, now: u64) -> bool {
        match self.trap_owed.take() {
            Some(lid) => {
                self.send_trap144(f, now, lid);
                true
            }
            None => false,
        }
    }

    /// `osm_send_trap144`: trap 144 (local changes, SM priority changed)
    /// LID-routed from our port to the SM at `dlid`.
    fn send_trap144(&mut self, f: &mut Fabric, now: u64, dlid: u16) {
        if dlid == 0 || self.lid == 0 || dlid == self.lid {
            return;
        }
        let mut m = [0u8; MAD_LEN];
        self.tid = self.tid.wrapping_add(1);
        MadHdr {
            base_version: 1,
            mgmt_class: mgmt_class::SUBN_LID_ROUTED,
            class_version: 1,
            method: method::TRAP,
            tid: self.tid,
            attr_id: super::ATTR_NOTICE,
            ..MadHdr::default()
        }
        .write(&mut m);
        let cap = u32::from_be_bytes({
            let pi = self.local_port_info();
            [pi[20], pi[21], pi[22], pi[23]]
        });
        let n = &mut m[packet::SMP_DATA..packet::SMP_DATA + 64];
        n[0] = 0x80 | 4; // generic, informational
        n[1..4].copy_from_slice(&[0, 0, 1]); // ProducerType: CA
        n[4..6].copy_from_slice(&144u16.to_be_bytes());
        n[6..8].copy_from_slice(&self.lid.to_be_bytes());
        n[12..14].copy_from_slice(&self.lid.to_be_bytes());
        n[15] = 1; // OtherLocalChanges
        n[16..20].copy_from_slice(&cap.to_be_bytes());
        n[20..22].copy_from_slice(&CHANGE_SM_PRIORITY.to_be_bytes());
        let mut h = packet::mad_headers(dlid, self.lid, 0, 0, packet::DEFAULT_PKEY);
        h.lrh.sl = self.port_sm_sl;
        if let Ok(bytes) = packet::build(&h, &m) {
            self.note(now, format!("trap 144 (SM priority) to LID {dlid}"));
            f.send_from(self.port, Packet { bytes }, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_then_the_lower_guid_wins() {
        assert!(sm_is_greater_than(15, 9, 0, 1));
        assert!(sm_is_greater_than(3, 1, 3, 2));
        assert!(!sm_is_greater_than(3, 2, 3, 1));
        assert!(!sm_is_greater_than(2, 1, 3, 9));
    }
}
