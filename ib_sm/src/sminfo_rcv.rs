//! SMInfo, after OpenSM's `osm_sminfo_rcv.c`: answering other SMs' SubnGet and SubnSet(SMInfo), and reading their answers to ours (who is master, who is higher, is the master alive).
//!
//! The SM_Key is returned in every answer (OpenSM withholds it only from a
//! requester that fails M_Key protection, which is not used here). A SubnSet is checked
//! as OpenSM does: ACKNOWLEDGE only from a standby SM, HANDOVER, DISABLE,
//! STANDBY and DISCOVER only from a master, and only where our state allows
//! the transition; otherwise it is answered with status 7. An SM whose
//! SM_Key differs from ours (when ours is not 0) is ignored, as OpenSM
//! 3.3.23 does ("ERR 2F18").

use alloc::format;

use ib_core::mad::method;
use ib_core::verbs::AhAttr;
use ib_core::{IbCore, MadAgent, MadRecvWc, MadSendBuf};

use crate::ib_types::{SmInfo, attr, sm_is_greater_than, sm_state, sminfo_mod};
use crate::sm::{RemoteSm, Sm};
use crate::state_mgr::Stage;

impl Sm {
    /// SubnGet/SubnSet(SMInfo) from another SM (or `sminfo`).
    pub(crate) fn sminfo_request(
        &mut self,
        core: &mut IbCore,
        agent: MadAgent,
        r: &MadRecvWc,
        now: u64,
    ) {
        let m = &r.mad;
        let remote = SmInfo::read(m.smp_data());
        let dr = m.mgmt_class() == ib_core::mad::class::SUBN_DIRECTED_ROUTE;
        let dir = if dr { 0x8000 } else { 0 };
        let mut resp = m.clone();
        resp.set_method(method::GET_RESP);
        resp.smp_data_mut().fill(0);
        // Without M_Key protection the SM_Key is always returned
        // (OpenSM 3.3.23 ignores an SM answering with another key, 0
        // included).
        let ours = self.our_sminfo(true);
        ours.write(resp.smp_data_mut());
        self.stats.sminfo_answered += 1;
        if m.method() == method::GET {
            resp.set_status(dir);
            self.respond(core, agent, r, resp);
            return;
        }
        // SubnSet: the requester's state must fit the modifier, and ours
        // the transition it asks for.
        let amod = m.attr_mod();
        let legal = match amod {
            sminfo_mod::ACKNOWLEDGE => remote.state == sm_state::STANDBY,
            sminfo_mod::HANDOVER
            | sminfo_mod::DISABLE
            | sminfo_mod::STANDBY
            | sminfo_mod::DISCOVER => remote.state == sm_state::MASTER,
            _ => false,
        };
        let transition = matches!(
            (self.state, amod),
            (sm_state::DISCOVERING, sminfo_mod::HANDOVER)
                | (
                    sm_state::STANDBY,
                    sminfo_mod::DISCOVER
                        | sminfo_mod::DISABLE
                        | sminfo_mod::HANDOVER
                        | sminfo_mod::ACKNOWLEDGE,
                )
                | (sm_state::NOTACTIVE, sminfo_mod::STANDBY)
                | (sm_state::MASTER, sminfo_mod::HANDOVER)
        );
        if !legal || !transition {
            self.note(
                now,
                format!(
                    "ERR 2F04: SubnSet(SMInfo) modifier {amod:#x} from SM {:#018x} in state {}: refused in state {}",
                    remote.guid,
                    crate::ib_types::sm_state_str(remote.state),
                    crate::ib_types::sm_state_str(self.state)
                ),
            );
            resp.set_status(7 | dir);
            self.respond(core, agent, r, resp);
            return;
        }
        resp.set_status(dir);
        self.respond(core, agent, r, resp);
        match (self.state, amod) {
            (sm_state::STANDBY | sm_state::DISCOVERING, sminfo_mod::HANDOVER) => {
                self.stats.handovers_received += 1;
                self.note(
                    now,
                    format!("Received a HANDOVER from SM {:#018x}", remote.guid),
                );
                if self.state == sm_state::STANDBY {
                    self.state = sm_state::MASTER;
                    self.report_sm_state(now);
                }
                self.master_sm_guid = 0;
                if let Some(rs) = self.remote_sms.get_mut(&remote.guid) {
                    rs.smi.state = sm_state::STANDBY;
                }
                self.force_first_time_master();
            }
            (sm_state::MASTER, sminfo_mod::HANDOVER) => {
                self.stats.handovers_received += 1;
                self.note(
                    now,
                    format!(
                        "Forcing heavy sweep. Received a HANDOVER from SM {:#018x}",
                        remote.guid
                    ),
                );
                self.polling_sm_guid = 0;
                if let Some(rs) = self.remote_sms.get_mut(&remote.guid) {
                    rs.smi.state = sm_state::STANDBY;
                }
                self.force_first_time_master();
            }
            (sm_state::STANDBY, sminfo_mod::DISCOVER) => {
                self.state = sm_state::DISCOVERING;
                self.report_sm_state(now);
                self.sweep.coming_out_of_standby = true;
                self.request_heavy_sweep();
            }
            (sm_state::STANDBY, sminfo_mod::DISABLE) => {
                self.state = sm_state::NOTACTIVE;
                self.report_sm_state(now);
            }
            (sm_state::NOTACTIVE, sminfo_mod::STANDBY) => {
                self.master_sm_guid = remote.guid;
                self.state = sm_state::STANDBY;
                self.report_sm_state(now);
                self.start_polling(now);
            }
            _ => {}
        }
    }

    /// `force_first_time_master_sweep`: everything written again.
    fn force_first_time_master(&mut self) {
        self.sweep.first_time_master = true;
        self.sweep.coming_out_of_standby = true;
        self.request_heavy_sweep();
    }

    /// Our SubnGet(SMInfo) was answered (`smi_rcv_process_get_response`
    /// and `smi_rcv_process_get_sm`).
    pub(crate) fn sminfo_rcv_get_resp(
        &mut self,
        core: &mut IbCore,
        g: u64,
        data: &[u8; 64],
        now: u64,
    ) {
        let smi = SmInfo::read(data);
        if self.cfg.sm_key != 0 && smi.sm_key != self.cfg.sm_key {
            self.note(
                now,
                format!(
                    "ERR 2F18: Got SM {:#018x} with sm_key that doesn't match our local key: ignored",
                    smi.guid
                ),
            );
            return;
        }
        if smi.guid != g {
            self.note(
                now,
                format!(
                    "ERR 2F13: Bogus SM port GUID: expected {g:#018x}, received {:#018x}",
                    smi.guid
                ),
            );
            return;
        }
        if g == self.subn.sm_port_guid {
            return;
        }
        let (path, lid) = self.port_path(g).unwrap_or_default();
        let known = self.remote_sms.contains_key(&g);
        self.remote_sms.insert(g, RemoteSm { smi, path, lid });
        if !known {
            self.note(
                now,
                format!(
                    "Detected SM {g:#018x} (LID {lid}) in state {}, priority {}",
                    crate::ib_types::sm_state_str(smi.state),
                    smi.priority
                ),
            );
        }
        let higher = sm_is_greater_than(smi.priority, g, self.cfg.priority, self.subn.sm_port_guid);
        let light = self.sweep.stage == Stage::Light;
        match self.state {
            sm_state::DISCOVERING => match smi.state {
                sm_state::MASTER => {
                    self.sweep.master_sm_found = true;
                    self.master_sm_guid = g;
                }
                sm_state::DISCOVERING | sm_state::STANDBY if higher => {
                    self.sweep.master_sm_found = true;
                    self.master_sm_guid = g;
                }
                _ => {}
            },
            sm_state::STANDBY => match smi.state {
                sm_state::MASTER => {
                    self.master_is_alive();
                    if g != self.master_sm_guid {
                        self.master_sm_guid = g;
                    }
                    if !higher {
                        // We are the better SM: tell the master, so that
                        // it sweeps, finds us and hands over.
                        self.send_trap144(core, 0x0008);
                    }
                }
                sm_state::STANDBY if g == self.master_sm_guid && higher => self.master_is_alive(),
                _ => {}
            },
            sm_state::MASTER => match smi.state {
                sm_state::MASTER => {
                    if self.polling_sm_guid != 0 {
                        if higher {
                            self.sweep.force_heavy = true;
                        } else {
                            self.master_sm_guid = self.polling_sm_guid;
                            self.send_trap144(core, 0x0008);
                        }
                        self.master_is_alive();
                    } else if light {
                        self.sweep.force_heavy = true;
                    }
                }
                sm_state::STANDBY if light && higher => self.sweep.force_heavy = true,
                _ => {}
            },
            _ => {}
        }
    }

    /// An SMInfo we asked for never came.
    pub(crate) fn sminfo_failed(&mut self, g: u64, now: u64) {
        if self.state != sm_state::STANDBY && self.polling_sm_guid != g {
            // Gone during a sweep: forget it.
            if self.remote_sms.remove(&g).is_some() {
                self.note(now, format!("SM {g:#018x} no longer answers"));
            }
        }
    }

    /// Our SubnSet(SMInfo) was answered.
    pub(crate) fn sminfo_set_done(&mut self, g: u64, m: u32, data: &[u8; 64], now: u64) {
        let smi = SmInfo::read(data);
        if m == sminfo_mod::HANDOVER {
            self.note(
                now,
                format!(
                    "HANDOVER to SM {g:#018x} answered (its state {})",
                    crate::ib_types::sm_state_str(smi.state)
                ),
            );
        }
    }

    /// Our SubnSet(SMInfo) failed.
    pub(crate) fn sminfo_set_failed(&mut self, g: u64, m: u32, now: u64) {
        if m == sminfo_mod::HANDOVER {
            self.note(
                now,
                format!("HANDOVER to SM {g:#018x} failed: discovering again"),
            );
            if self.state == sm_state::STANDBY && !self.stopping {
                self.state = sm_state::DISCOVERING;
                self.report_sm_state(now);
                self.master_sm_guid = 0;
                self.request_heavy_sweep();
            }
        }
    }

    /// `osm_send_trap144`: Trap 144 (local changes; `change` 0x0008: SM
    /// priority) LID-routed to the master.
    pub(crate) fn send_trap144(&mut self, core: &mut IbCore, change: u16) {
        let Some(master) = self.remote_sms.get(&self.master_sm_guid) else {
            return;
        };
        let dlid = if master.lid != 0 {
            master.lid
        } else {
            self.port_path(self.master_sm_guid).map_or(0, |x| x.1)
        };
        if dlid == 0 {
            return;
        }
        let me = self.subn.sm_port_guid;
        let (my_lid, cap_mask, node_type) = self
            .subn
            .nodes
            .values()
            .chain(self.done.nodes.values())
            .find_map(|n| {
                n.ports
                    .iter()
                    .find(|(p, pp)| pp.guid == me && n.is_end(**p))
                    .map(|(_, pp)| {
                        let pi = pp.pi.unwrap_or_default();
                        (pi.base_lid(), pi.capability_mask(), n.ni.node_type())
                    })
            })
            .unwrap_or((self.subn.sm_lid, 0, 1));
        // Entering standby (`change` 0): the SMA reports a capability
        // change itself if it can (IsTrapSupported or
        // IsCapabilityMaskNoticeSupported).
        if change == 0 && cap_mask & ((1 << 3) | (1 << 22)) != 0 {
            return;
        }
        let mut m = ib_core::mad::Mad::new_request(
            ib_core::mad::class::SUBN_LID_ROUTED,
            1,
            method::TRAP,
            attr::NOTICE,
            0,
        );
        let d = m.smp_data_mut();
        d[0] = 0x80 | 4; // generic, informational
        d[1..4].copy_from_slice(&u32::from(node_type).to_be_bytes()[1..]);
        d[4..6].copy_from_slice(&144u16.to_be_bytes());
        d[6..8].copy_from_slice(&my_lid.to_be_bytes());
        d[12..14].copy_from_slice(&my_lid.to_be_bytes());
        d[15] = u8::from(change != 0); // OtherLocalChanges
        d[16..20].copy_from_slice(&cap_mask.to_be_bytes());
        d[20..22].copy_from_slice(&change.to_be_bytes());
        let mut buf = MadSendBuf::new(
            m,
            AhAttr {
                dlid,
                port_num: self.port,
                ..AhAttr::default()
            },
            0,
        );
        buf.timeout_ms = self.cfg.transaction_timeout_ms.max(1);
        if core.post_send_mad(self.lr_agent, buf).is_ok() {
            self.req.counters.sent += 1;
        }
    }
}
