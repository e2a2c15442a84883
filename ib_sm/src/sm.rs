//! The SM object and its progress function, after OpenSM's `osm_sm.c` and `osm_sm_mad_ctrl.c`: the agents on QP0 and QP1, the dispatch of what they receive, the timers, the log.
//!
//! OpenSM runs a dispatcher thread, a sweeper thread and a timer per SM; here
//! one [`Sm::poll`] does all of it from ib_core's progress function: it reads
//! the agents' mailboxes (answers to our SMPs, SMInfo and traps from other
//! nodes, SA requests and RMPP ACKs), runs the timers (sweep, SMInfo polling,
//! RMPP resends), posts queued SMPs and moves the sweep on. Nothing in it
//! waits.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use ib_core::mad::{MadRegReq, class, method};
use ib_core::verbs::{PortModify, PortModifyFlags, QpType};
use ib_core::{DeviceId, IbCore, MadAgent, MadEvent, MadRecvWc};

use crate::ib_types::{SmInfo, cap, sa_method, sm_state, sm_state_str};
use crate::req::{Done, ReqQueue, SmpCounters, WireCfg};
use crate::sa::SaState;
use crate::state_mgr::Sweep;
use crate::subnet::{SmConfig, Subnet};

/// Lines of the SM's log kept (oldest dropped first).
pub const LOG_LINES: usize = 200;

/// Counters a user (and a test) reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmStats {
    /// Heavy sweeps completed.
    pub heavy_sweeps: u64,
    /// Light sweeps completed.
    pub light_sweeps: u64,
    /// SMPs of the last heavy sweep (resends included).
    pub smps_last_heavy: u64,
    /// SMPs of the last light sweep.
    pub smps_last_light: u64,
    /// Nanoseconds the last heavy sweep took.
    pub last_heavy_ns: u64,
    /// Nanoseconds from start to the first SUBNET UP (0 until then).
    pub first_up_ns: u64,
    /// SUBNET UP lines logged.
    pub subnet_ups: u64,
    /// Sweeps that ended with errors ("Errors during initialization").
    pub init_errors: u64,
    /// Traps received.
    pub traps: u64,
    /// SMInfo requests from other SMs answered.
    pub sminfo_answered: u64,
    /// Handovers: sent, received.
    pub handovers_sent: u64,
    /// Handovers received.
    pub handovers_received: u64,
    /// Duplicate GUIDs reported.
    pub duplicate_guids: u64,
    /// MADs dropped as not understood.
    pub bad_mads: u64,
}

/// A remote SM (`osm_remote_sm_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSm {
    /// Its SMInfo as last read.
    pub smi: SmInfo,
    /// The directed route to its port.
    pub path: Vec<u8>,
    /// Its LID (0 if unknown).
    pub lid: u16,
}

/// What a status line shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmStatus {
    /// SMInfo state.
    pub state: u8,
    /// Priority.
    pub priority: u8,
    /// Our port GUID.
    pub guid: u64,
    /// Our LID.
    pub lid: u16,
    /// The master's LID and GUID as far as we know.
    pub master_lid: u16,
    /// See [`SmStatus::master_lid`].
    pub master_guid: u64,
    /// ActCount.
    pub act_count: u32,
    /// Nodes and end ports of the last heavy sweep.
    pub nodes: usize,
    /// End ports.
    pub ports: usize,
    /// SMP counters.
    pub smps: SmpCounters,
    /// SM counters.
    pub stats: SmStats,
    /// SA counters.
    pub sa: crate::sa::SaCounters,
    /// Whether a sweep runs.
    pub sweeping: bool,
    /// Other SMs seen.
    pub remote_sms: Vec<(u64, SmInfo)>,
}

/// One subnet manager on one port.
pub struct Sm {
    pub(crate) cfg: SmConfig,
    pub(crate) dev: DeviceId,
    pub(crate) port: u8,
    /// DR agent (class 0x81): our SMPs and DR SMInfo from other SMs.
    pub(crate) dr_agent: MadAgent,
    /// LID-routed agent (class 0x01): SMInfo and traps.
    pub(crate) lr_agent: MadAgent,
    /// SA agent (class 0x03 on QP1).
    pub(crate) sa_agent: MadAgent,
    pub(crate) state: u8,
    pub(crate) started_ns: u64,
    /// The subnet as the sweep under way builds it.
    pub(crate) subn: Subnet,
    /// The subnet of the last completed heavy sweep (what the SA answers
    /// from).
    pub(crate) done: Subnet,
    /// Port GUID to LID, kept across sweeps (OpenSM's guid2lid).
    pub(crate) guid2lid: BTreeMap<u64, u16>,
    /// LFT each switch holds as we wrote it (node GUID -> LFT).
    pub(crate) programmed_lft: BTreeMap<u64, Vec<u8>>,
    /// MFT blocks each switch holds as we wrote them.
    pub(crate) programmed_mft: BTreeMap<u64, Vec<u64>>,
    pub(crate) req: ReqQueue,
    pub(crate) sweep: Sweep,
    /// Other SMs by port GUID (`sm_guid_tbl`).
    pub(crate) remote_sms: BTreeMap<u64, RemoteSm>,
    /// The master we stand by for (or hand over to).
    pub(crate) master_sm_guid: u64,
    /// A remote master we wait for (C14-60.2.1), 0 if none.
    pub(crate) polling_sm_guid: u64,
    /// A higher SM still discovering that we hand over to once it stands
    /// by, 0 if none (logged once).
    pub(crate) handover_waits_for: u64,
    /// Polls without an answer.
    pub(crate) retry_number: u32,
    pub(crate) next_poll_ns: u64,
    pub(crate) stats: SmStats,
    pub(crate) log: VecDeque<String>,
    pub(crate) sa: SaState,
    pub(crate) stopping: bool,
    /// When a stopping SM closes even if its handover is unanswered.
    pub(crate) stop_deadline: u64,
    /// A stopping master still looks for a standby SM.
    pub(crate) stop_discover: bool,
}

/// Registration of an SM agent (class `c`; methods Get, Set, and for the
/// LID-routed class Trap and TrapRepress too).
fn smp_reg(c: u8) -> MadRegReq {
    if c == class::SUBN_LID_ROUTED {
        MadRegReq::new(c, 1, &[method::GET, method::SET, method::TRAP])
    } else {
        MadRegReq::new(c, 1, &[method::GET, method::SET])
    }
}

impl Sm {
    /// Opens the agents and sets IsSM on the port (what OpenSM's vendor
    /// layer does when it binds and opens `issm`).
    pub(crate) fn open(
        core: &mut IbCore,
        dev: DeviceId,
        port: u8,
        cfg: SmConfig,
    ) -> ib_core::Result<Sm> {
        let dr_agent = core.register_mad_agent(
            dev,
            port,
            QpType::Smi,
            Some(smp_reg(class::SUBN_DIRECTED_ROUTE)),
            0,
        )?;
        let lr_agent = match core.register_mad_agent(
            dev,
            port,
            QpType::Smi,
            Some(smp_reg(class::SUBN_LID_ROUTED)),
            0,
        ) {
            Ok(a) => a,
            Err(e) => {
                let _ = core.unregister_mad_agent(dr_agent);
                return Err(e);
            }
        };
        let sa_reg = MadRegReq::new(
            class::SUBN_ADM,
            2,
            &[
                method::GET,
                method::SET,
                sa_method::GET_TABLE,
                sa_method::GET_MULTI,
                sa_method::DELETE,
                method::REPORT_RESP,
            ],
        );
        let sa_agent = match core.register_mad_agent(dev, port, QpType::Gsi, Some(sa_reg), 0) {
            Ok(a) => a,
            Err(e) => {
                let _ = core.unregister_mad_agent(dr_agent);
                let _ = core.unregister_mad_agent(lr_agent);
                return Err(e);
            }
        };
        if let Some(d) = core.device_mut(dev) {
            let props = PortModify {
                set_port_cap_mask: cap::IS_SM,
                ..PortModify::default()
            };
            if let Err(e) = d.modify_port(port, PortModifyFlags::empty(), &props) {
                log::warn!(
                    "{}: port {port}: IsSM not set ({e}): other SMs will not find this one",
                    d.name()
                );
            }
        }
        let now = core.clock().now_ns();
        let mut sm = Sm {
            cfg,
            dev,
            port,
            dr_agent,
            lr_agent,
            sa_agent,
            state: sm_state::DISCOVERING,
            started_ns: now,
            subn: Subnet::default(),
            done: Subnet::default(),
            guid2lid: BTreeMap::new(),
            programmed_lft: BTreeMap::new(),
            programmed_mft: BTreeMap::new(),
            req: ReqQueue::default(),
            sweep: Sweep::new(),
            remote_sms: BTreeMap::new(),
            master_sm_guid: 0,
            polling_sm_guid: 0,
            handover_waits_for: 0,
            retry_number: 0,
            next_poll_ns: u64::MAX,
            stats: SmStats::default(),
            log: VecDeque::new(),
            sa: SaState::default(),
            stopping: false,
            stop_deadline: u64::MAX,
            stop_discover: false,
        };
        sm.note(
            now,
            format!(
                "OpenSM-like SM starting on port {port}, priority {}",
                sm.cfg.priority
            ),
        );
        sm.report_sm_state(now);
        Ok(sm)
    }

    /// Closes the agents and clears IsSM.
    pub(crate) fn close(mut self, core: &mut IbCore) {
        let agent = self.dr_agent;
        self.req.clear(core, agent);
        for a in [self.dr_agent, self.lr_agent, self.sa_agent] {
            let _ = core.unregister_mad_agent(a);
        }
        if let Some(d) = core.device_mut(self.dev) {
            let props = PortModify {
                clr_port_cap_mask: cap::IS_SM,
                ..PortModify::default()
            };
            let _ = d.modify_port(self.port, PortModifyFlags::empty(), &props);
        }
    }

    /// A log line: kept, and printed through `log` as OpenSM writes
    /// `osm.log` (the time is seconds since the SM started).
    pub(crate) fn note(&mut self, now: u64, s: String) {
        log::info!("{}: {s}", self.cfg.name);
        self.keep(now, s);
    }

    /// A log line kept but printed only at debug level (OpenSM's
    /// `OSM_LOG_INFO` lines, which its default log level leaves out of
    /// the system log).
    pub(crate) fn note_quiet(&mut self, now: u64, s: String) {
        log::debug!("{}: {s}", self.cfg.name);
        self.keep(now, s);
    }

    fn keep(&mut self, now: u64, s: String) {
        let t = now.saturating_sub(self.started_ns);
        if self.log.len() >= LOG_LINES {
            self.log.pop_front();
        }
        self.log.push_back(format!(
            "[{:>4}.{:06}] {s}",
            t / 1_000_000_000,
            t / 1000 % 1_000_000
        ));
    }

    /// `osm_report_sm_state`.
    pub(crate) fn report_sm_state(&mut self, now: u64) {
        let s = sm_state_str(self.state);
        self.note(now, format!("Entering {s} state"));
    }

    pub(crate) fn wire(&self) -> WireCfg {
        WireCfg {
            agent: self.dr_agent,
            max_wire: self.cfg.max_wire_smps,
            timeout_ms: self.cfg.transaction_timeout_ms,
            retries: self.cfg.transaction_retries,
            m_key: self.cfg.m_key,
        }
    }

    /// Our SMInfo as we answer it (`pri_state`, ActCount = SMPs sent).
    pub(crate) fn our_sminfo(&self, with_key: bool) -> SmInfo {
        SmInfo {
            guid: self.subn.sm_port_guid,
            sm_key: if with_key { self.cfg.sm_key } else { 0 },
            act_count: self.req.counters.sent as u32,
            priority: self.cfg.priority,
            state: self.state,
        }
    }

    /// The progress function: everything due now. Returns the work done.
    pub(crate) fn poll(&mut self, core: &mut IbCore) -> usize {
        let now = core.clock().now_ns();
        let mut work = 0;
        let w = self.wire();
        let mut done: Vec<Done> = Vec::new();
        // QP0: answers to our SMPs, and requests from other SMs.
        for agent in [self.dr_agent, self.lr_agent] {
            for _ in 0..256 {
                let Some(ev) = core.mad_poll_agent(agent) else {
                    break;
                };
                work += 1;
                match ev {
                    MadEvent::SendDone(s) => {
                        if agent == self.dr_agent {
                            self.req.on_send_done(core, &w, &s, &mut done);
                        }
                    }
                    MadEvent::Recv(r) => {
                        if r.send_id.is_some() {
                            if !self.req.on_recv(core, &w, &r, &mut done) {
                                self.stats.bad_mads += 1;
                            }
                        } else {
                            self.smp_request(core, agent, &r, now);
                        }
                    }
                }
            }
        }
        for d in done.drain(..) {
            self.complete(core, d, now);
        }
        // QP1: the SA.
        for _ in 0..256 {
            let Some(ev) = core.mad_poll_agent(self.sa_agent) else {
                break;
            };
            work += 1;
            if let MadEvent::Recv(r) = ev {
                self.sa_request(core, &r, now);
            }
        }
        work += self.sa_timers(core, now);
        work += self.sm_state_timers(core, now);
        // The sweep: SMPs out while the window allows, then the next stage.
        for _ in 0..64 {
            let n = self.req.pump(core, &w, &mut done);
            work += n;
            let ended = !done.is_empty();
            for d in done.drain(..) {
                self.complete(core, d, now);
            }
            if ended {
                continue;
            }
            if !self.req.idle() {
                break;
            }
            if !self.advance(core, now) {
                break;
            }
            work += 1;
        }
        work
    }

    /// An unsolicited SMP: SMInfo from another SM, a trap.
    fn smp_request(&mut self, core: &mut IbCore, agent: MadAgent, r: &MadRecvWc, now: u64) {
        let m = &r.mad;
        match (m.method(), m.attr_id()) {
            (method::GET | method::SET, crate::ib_types::attr::SM_INFO) => {
                self.sminfo_request(core, agent, r, now);
            }
            (method::TRAP, crate::ib_types::attr::NOTICE) => self.trap_rcv(core, agent, r, now),
            _ => {
                self.stats.bad_mads += 1;
                let mut resp = m.clone();
                resp.set_method(method::GET_RESP);
                let mut st = crate::ib_types::status::UNSUP_METHOD_ATTR;
                if m.mgmt_class() == class::SUBN_DIRECTED_ROUTE {
                    st |= 0x8000;
                }
                resp.set_status(st);
                self.respond(core, agent, r, resp);
            }
        }
    }

    /// Sends `resp` back where `r` came from, on `agent`'s QP.
    pub(crate) fn respond(
        &mut self,
        core: &mut IbCore,
        agent: MadAgent,
        r: &MadRecvWc,
        resp: ib_core::mad::Mad,
    ) {
        let Some(ah) = core.device(self.dev).and_then(|d| {
            ib_core::agent::init_ah_from_wc(d, self.port, &r.wc, r.grh.as_ref()).ok()
        }) else {
            self.stats.bad_mads += 1;
            return;
        };
        let mut buf = ib_core::MadSendBuf::new(resp, ah, r.wc.src_qp);
        buf.pkey_index = r.wc.pkey_index;
        if let Err(e) = core.post_send_mad(agent, buf) {
            log::debug!("{}: a response was refused: {e}", self.cfg.name);
        }
    }

    /// What [`Sm::status`] reports.
    pub(crate) fn status(&self) -> SmStatus {
        let master = if self.state == sm_state::MASTER {
            self.subn.sm_port_guid
        } else {
            self.master_sm_guid
        };
        let master_lid = if self.state == sm_state::MASTER {
            self.subn.sm_lid
        } else {
            self.remote_sms.get(&master).map_or(0, |r| r.lid)
        };
        SmStatus {
            state: self.state,
            priority: self.cfg.priority,
            guid: self.subn.sm_port_guid,
            lid: self.subn.sm_lid,
            master_lid,
            master_guid: master,
            act_count: self.req.counters.sent as u32,
            nodes: self.done.nodes.len(),
            ports: self.done.ports.len(),
            smps: self.req.counters,
            stats: self.stats,
            sa: self.sa.counters,
            sweeping: self.sweep.busy(),
            remote_sms: self.remote_sms.iter().map(|(g, r)| (*g, r.smi)).collect(),
        }
    }
}
