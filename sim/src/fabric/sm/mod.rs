//! An embedded subnet manager, like the SM inside a managed switch.
//!
//! Sitting on a fabric-modelled node of its own (one CA port cabled to a switch):
//! discovery by directed-route SMPs (NodeInfo, NodeDescription, SwitchInfo,
//! PortInfo; a breadth-first walk through the switches' own DR processing, so every
//! SMP is a packet on the wire), LID assignment (stable per port GUID across
//! sweeps, and across SM restarts by keeping the LIDs the ports already report; LMC
//! 0), min-hop LFT programming (SubnSet SwitchInfo LinearFDBTop and
//! LinearForwardingTable blocks), MFTs for the multicast groups that have members
//! ([`mcast_mgr`]), ports through Armed to Active (ClientReregister on the SM's
//! first sweep as master), a light sweep (SwitchInfo PortStateChange, the other
//! SMs' SMInfo) on the model clock and a heavy sweep on a change or on a trap;
//! SMInfo answered and the master/standby election and handover of IBTA 14.4.1
//! as OpenSM does them ([`sminfo`]); the SA on the same port is [`super::sa`].
//! Left out: P_Key tables, SL-to-VL and VL arbitration programming, M_Key
//! protection, LMC > 0, up/down or balanced routing (ties go to the lowest port),
//! LID-routed SMPs from the SM (traps aside).
//!
//! Written from the IBTA (vol. 1, 14.2.2 directed route, 14.2.5 attributes,
//! 14.4 SM state and sweeps), with OpenSM's defaults as facts (transaction
//! timeout 200 ms, 3 retries, 10 s sweep interval, subnet timeout 18, SMInfo
//! polling every 10 s with 4 retries).
//!
//! Stepping: [`SubnetManager::poll`] is called by the fabric from
//! [`super::Fabric::advance`] with the fabric's time; it takes the packets
//! that reached the SM's port, retries or gives up timed-out SMPs, sends
//! what the current stage allows, and starts sweeps when their time comes.
//! There are no threads and no wall clock: on a fake clock everything is
//! deterministic.

mod lid_route;
pub mod mcast_mgr;
mod receive;
pub mod sminfo;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::sa::{SaState, SmRow};
use super::{Fabric, Packet, PortId};
use crate::fabric::packet::{
    self, MAD_LEN, MadHdr, PERMISSIVE_LID, Smp, attr, mad_status, method, mgmt_class,
};

/// SMInfo attribute id.
pub const ATTR_SM_INFO: u16 = attr::SM_INFO;
/// Notice attribute id (traps).
pub const ATTR_NOTICE: u16 = 0x0002;

/// How the embedded SM behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmConfig {
    /// Node GUID of the SM's node; its port GUID is this plus 1.
    pub node_guid: u64,
    /// NodeDescription of the SM's node.
    pub description: String,
    /// SMInfo priority (0..15).
    pub priority: u8,
    /// SM_Key, reported in SMInfo (without M_Key protection there is
    /// nothing to hide it from). OpenSM's default, 1: an OpenSM ignores an
    /// SM whose key differs from its own, and stands by for one with the
    /// same key and a higher priority.
    pub sm_key: u64,
    /// Subnet prefix given to every port.
    pub subnet_prefix: u64,
    /// PortInfo SubnetTimeOut given to every port (4.096 µs * 2^n).
    pub subnet_timeout: u8,
    /// PathRecord PacketLifeTime the SA answers.
    pub packet_life_time: u8,
    /// SL of the SM (PortInfo MasterSMSL) and of PathRecords.
    pub sm_sl: u8,
    /// The first LID handed out.
    pub first_lid: u16,
    /// Time an SMP may take before it is sent again.
    pub smp_timeout_ns: u64,
    /// Resends of an SMP before its target is reported and skipped.
    pub smp_retries: u8,
    /// SMPs in flight at once.
    pub max_outstanding: usize,
    /// Time between light sweeps.
    pub sweep_interval_ns: u64,
    /// Time before a heavy sweep again after one that met errors (a node
    /// that did not answer yet: a driver still loading); doubled after
    /// each further sweep with errors, up to `sweep_interval_ns`.
    pub error_resweep_ns: u64,
    /// Time between SMInfo polls of the master by a standby SM (OpenSM's
    /// `sminfo_polling_timeout`).
    pub polling_interval_ns: u64,
    /// Polls the master may leave unanswered before a standby SM takes
    /// over (OpenSM's `polling_retry_number`).
    pub polling_retries: u32,
}

impl Default for SmConfig {
    fn default() -> SmConfig {
        SmConfig {
            node_guid: 0x0002_c903_00ff_0000,
            description: "embedded SM".into(),
            priority: 15,
            sm_key: 1,
            subnet_prefix: 0xfe80_0000_0000_0000,
            subnet_timeout: 18,
            packet_life_time: 18,
            sm_sl: 0,
            first_lid: 1,
            smp_timeout_ns: 200_000_000,
            smp_retries: 3,
            max_outstanding: 4,
            sweep_interval_ns: 10_000_000_000,
            error_resweep_ns: 1_000_000_000,
            polling_interval_ns: 10_000_000_000,
            polling_retries: 4,
        }
    }
}

/// PortInfo LocalPhyErrors and OverrunErrors thresholds the SM writes in
/// every PortInfo it sets but a switch's base port 0: 8 and 8, OpenSM's
/// defaults (`local_phy_errors_threshold`, `overrun_errors_threshold`).
pub const ERROR_THRESHOLDS: u8 = 0x88;

/// SMInfo SMState values.
pub mod sm_state {
    #![allow(missing_docs)]
    pub const NOT_ACTIVE: u8 = 0;
    pub const DISCOVERING: u8 = 1;
    pub const STANDBY: u8 = 2;
    pub const MASTER: u8 = 3;
}

/// Counters a user (and a test) reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmStats {
    /// Heavy sweeps completed.
    pub heavy_sweeps: u64,
    /// Light sweeps completed (without a heavy one following).
    pub light_sweeps: u64,
    /// SMPs put on the wire, resends included.
    pub smps_sent: u64,
    /// SMPs of the last completed heavy sweep (resends included).
    pub smps_last_heavy: u64,
    /// SMPs of the last light sweep.
    pub smps_last_light: u64,
    /// SMPs that got no answer in time (each try counts).
    pub timeouts: u64,
    /// Model time the last heavy sweep took.
    pub last_heavy_ns: u64,
    /// Traps received.
    pub traps: u64,
    /// SA requests answered.
    pub sa_answered: u64,
    /// SA GetTable answers sent as RMPP transfers of several segments.
    pub sa_rmpp_transfers: u64,
    /// RMPP transfers given up (no ACK after the resends) or stopped by
    /// the receiver.
    pub sa_rmpp_aborted: u64,
    /// MADs refused with an error status or dropped as malformed.
    pub bad_mads: u64,
    /// Handovers sent to a higher SM.
    pub handovers_sent: u64,
    /// Handovers received (this SM became master by one).
    pub handovers_received: u64,
    /// SMInfo polls of another SM sent.
    pub sminfo_polls: u64,
    /// MFT blocks written (a block of 32 MLIDs at one port position).
    pub mft_blocks: u64,
}

/// A port of the subnet as the last heavy sweep left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndPort {
    /// Port GUID (a switch's port 0: the node GUID).
    pub port_guid: u64,
    /// Node GUID.
    pub node_guid: u64,
    /// Port number (0 for a switch).
    pub port: u8,
    /// LID.
    pub lid: u16,
    /// NodeType (1 CA, 2 switch).
    pub node_type: u8,
    /// NodeInfo as read (PortGUID and LocalPortNum are this port's).
    pub node_info: [u8; 40],
    /// NodeDescription.
    pub description: [u8; 64],
    /// PortInfo as last read or set.
    pub port_info: [u8; 64],
}

impl EndPort {
    /// PortState (1 Down, 2 Init, 3 Armed, 4 Active).
    pub fn state(&self) -> u8 {
        self.port_info[32] & 0xf
    }
    /// NodeDescription up to its first NUL.
    pub fn description(&self) -> String {
        let n = self.description.iter().position(|&b| b == 0).unwrap_or(64);
        String::from_utf8_lossy(&self.description[..n]).into_owned()
    }
}

/// A node found by discovery.
#[derive(Debug, Clone)]
struct Node {
    guid: u64,
    node_type: u8,
    node_info: [u8; 40],
    description: [u8; 64],
    /// DR path (egress ports from the SM's node) to reach the node.
    path: Vec<u8>,
    /// SwitchInfo as read (switches).
    switch_info: Option<[u8; 64]>,
    ports: BTreeMap<u8, PortRec>,
    /// The port the first SMP came in on (LocalPortNum).
    entry: u8,
}

#[derive(Debug, Clone)]
struct PortRec {
    guid: u64,
    info: Option<[u8; 64]>,
    /// The node and port at the other end of the cable.
    peer: Option<(u64, u8)>,
    /// DR path to the node through this port (CA ports).
    path: Vec<u8>,
    lid: u16,
    failed: bool,
}

impl PortRec {
    fn new(guid: u64, path: Vec<u8>) -> PortRec {
        PortRec {
            guid,
            info: None,
            peer: None,
            path,
            lid: 0,
            failed: false,
        }
    }
}

/// What an SMP was for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ctx {
    /// NodeInfo along a path, reached from (node, port).
    Probe {
        from: (u64, u8),
    },
    NodeDesc {
        node: u64,
    },
    SwitchInfo {
        node: u64,
    },
    PortInfo {
        node: u64,
        port: u8,
    },
    /// A SubnSet whose answer is a PortInfo to keep.
    SetPortInfo {
        node: u64,
        port: u8,
    },
    SetSwitchInfo {
        node: u64,
    },
    SetLft {
        node: u64,
        block: u16,
    },
    /// Light sweep: SwitchInfo PortStateChange.
    Light {
        node: u64,
    },
    /// SubnGet(SMInfo) of another SM's port (discovery, light sweep or
    /// polling): its port GUID and LID.
    SmInfo {
        guid: u64,
        lid: u16,
    },
    /// SubnSet(SMInfo) to another SM (a handover).
    SetSmInfo {
        guid: u64,
        amod: u32,
    },
    /// SubnSet(MulticastForwardingTable) block at a port position.
    SetMft {
        node: u64,
        block: u16,
        pos: u8,
    },
}

#[derive(Debug, Clone)]
struct Req {
    path: Vec<u8>,
    meth: u8,
    attr_id: u16,
    attr_mod: u32,
    data: [u8; 64],
    ctx: Ctx,
}

#[derive(Debug, Clone)]
struct Pending {
    tid: u64,
    req: Req,
    deadline: u64,
    tries: u8,
}

/// An SA answer going out as RMPP DATA segments (IBTA 13.6.5 sender).
#[derive(Debug)]
struct RmppSend {
    tid: u64,
    dlid: u16,
    dqp: u32,
    pkey: u16,
    sl: u8,
    /// Headers of every segment (MAD and SA headers).
    mad: [u8; MAD_LEN],
    data: Vec<u8>,
    nsegs: u32,
    /// Last segment acknowledged.
    acked: u32,
    /// Last segment the receiver's window takes.
    window_last: u32,
    /// Last segment sent.
    sent: u32,
    deadline: u64,
    tries: u8,
}

/// RMPP transfers under way at once; more requests get "no resources".
pub const RMPP_MAX_SENDS: usize = 16;

/// Sweep stages; each waits for every answer of the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Idle,
    Light,
    Discover,
    Routes,
    Config,
    Arm,
    Activate,
}

/// The embedded subnet manager.
#[derive(Debug)]
pub struct SubnetManager {
    cfg: SmConfig,
    port: PortId,
    // Persistent across sweeps.
    guid2lid: BTreeMap<u64, u16>,
    /// LFT contents each switch was given (by node GUID).
    programmed: BTreeMap<u64, Vec<u8>>,
    // This sweep.
    stage: Stage,
    nodes: BTreeMap<u64, Node>,
    queue: VecDeque<Req>,
    pending: Vec<Pending>,
    heavy_requested: bool,
    sweep_errors: bool,
    sweep_start: u64,
    smps_at_start: u64,
    next_sweep: u64,
    link_gen: u64,
    tid: u64,
    // The SM's own port (its SMA).
    lid: u16,
    port_state: u8,
    sm_state: u8,
    act_count: u32,
    // Results.
    subnet: Vec<EndPort>,
    /// LID-routed next hop per switch (node GUID -> LFT), from the last sweep.
    lfts: BTreeMap<u64, Vec<u8>>,
    links: BTreeMap<(u64, u8), (u64, u8)>,
    port_infos: BTreeMap<(u64, u8), [u8; 64]>,
    rmpp: Vec<RmppSend>,
    /// A heavy sweep completed: ports were told to re-register.
    rereg_done: bool,
    /// Heavy sweeps in a row that met errors.
    error_sweeps: u32,
    log: Vec<String>,
    stats: SmStats,
    // The SA's state and what the SA reads besides the subnet.
    sa: SaState,
    switch_infos: BTreeMap<u64, [u8; 64]>,
    /// MFT per switch (a port mask per MLID from 0xC000), as computed.
    mfts: BTreeMap<u64, Vec<u64>>,
    /// MFT contents each switch was given.
    programmed_mft: BTreeMap<u64, Vec<u64>>,
    /// A join or leave changed a group: the MFTs need writing.
    mcast_dirty: bool,
    // Election (IBTA 14.4.1, OpenSM's `osm_sminfo_rcv.c`).
    /// The other SMs found (port GUID -> what they said).
    remote_sms: BTreeMap<u64, sminfo::RemoteSm>,
    /// The master this SM stands by for (and polls).
    master_guid: u64,
    /// As master: another master this SM polls, waiting for it to hand
    /// over.
    polling_guid: u64,
    next_poll: u64,
    poll_retry: u32,
    /// This discovery found a master, or a higher SM.
    master_found: bool,
    /// A trap 144 (SM priority) owed to the SM at this LID.
    trap_owed: Option<u16>,
    /// A heavy sweep as master completed: the SA answers.
    up_done: bool,
    // Our own port's SMA state beyond LID and PortState.
    port_sm_lid: u16,
    port_sm_sl: u8,
    port_subnet_timeout: u8,
    port_thresholds: u8,
    /// P_KeyTable, SL-to-VL and VL arbitration blocks set on our SMA.
    local_tables: BTreeMap<(u16, u32), [u8; 64]>,
}

/// PortInfo CapabilityMask IsClientReregistrationSupported (bit 25).
pub const CAP_CLIENT_REREG: u32 = 1 << 25;
/// PortInfo CapabilityMask IsSM (bit 1).
pub const CAP_IS_SM: u32 = 1 << 1;

/// Lines of the SM log kept (oldest dropped first).
const LOG_CAP: usize = 256;
/// Largest unicast LID.
const MAX_UCAST_LID: u16 = 0xbfff;
/// An LFT entry with no port.
const NO_PORT: u8 = 0xff;

fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn be64(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(x)
}

impl SubnetManager {
    /// An SM on fabric port `port` (a port attached as port 1 of node
    /// `cfg.node_guid`); it starts its first sweep once the link is up.
    pub fn new(cfg: SmConfig, port: PortId) -> SubnetManager {
        SubnetManager {
            cfg,
            port,
            guid2lid: BTreeMap::new(),
            programmed: BTreeMap::new(),
            stage: Stage::Idle,
            nodes: BTreeMap::new(),
            queue: VecDeque::new(),
            pending: Vec::new(),
            heavy_requested: true,
            sweep_errors: false,
            sweep_start: 0,
            smps_at_start: 0,
            next_sweep: 0,
            link_gen: u64::MAX,
            tid: 0x5e00_0000_0000_0000,
            lid: 0,
            port_state: 1,
            sm_state: sm_state::DISCOVERING,
            act_count: 0,
            subnet: Vec::new(),
            lfts: BTreeMap::new(),
            links: BTreeMap::new(),
            port_infos: BTreeMap::new(),
            rmpp: Vec::new(),
            rereg_done: false,
            error_sweeps: 0,
            log: Vec::new(),
            stats: SmStats::default(),
            sa: SaState::default(),
            switch_infos: BTreeMap::new(),
            mfts: BTreeMap::new(),
            programmed_mft: BTreeMap::new(),
            mcast_dirty: false,
            remote_sms: BTreeMap::new(),
            master_guid: 0,
            polling_guid: 0,
            next_poll: 0,
            poll_retry: 0,
            master_found: false,
            trap_owed: None,
            up_done: false,
            port_sm_lid: 0,
            port_sm_sl: 0,
            port_subnet_timeout: 0,
            port_thresholds: 0,
            local_tables: BTreeMap::new(),
        }
    }

    /// The same SM process started again on its node: everything it knew
    /// (the LID map, the topology, the LFTs it wrote) is gone; its node's
    /// port keeps its LID and state, as an HCA does while its SM restarts.
    pub fn restarted(&self) -> SubnetManager {
        let mut sm = SubnetManager::new(self.cfg.clone(), self.port);
        sm.lid = self.lid;
        sm.port_state = self.port_state;
        sm.link_gen = self.link_gen;
        sm.port_sm_lid = self.port_sm_lid;
        sm.port_sm_sl = self.port_sm_sl;
        sm.port_subnet_timeout = self.port_subnet_timeout;
        sm.port_thresholds = self.port_thresholds;
        sm.local_tables = self.local_tables.clone();
        sm
    }

    /// The configuration.
    pub fn config(&self) -> &SmConfig {
        &self.cfg
    }
    /// The fabric port the SM sits on.
    pub fn port(&self) -> PortId {
        self.port
    }
    /// The SM's port GUID.
    pub fn port_guid(&self) -> u64 {
        self.cfg.node_guid.wrapping_add(1)
    }
    /// The SM's own LID (0 before its first sweep).
    pub fn lid(&self) -> u16 {
        self.lid
    }
    /// SMInfo SMState.
    pub fn sm_state(&self) -> u8 {
        self.sm_state
    }
    /// Whether this SM is master and a heavy sweep of its as master has
    /// completed (the SA answers then).
    pub fn is_master(&self) -> bool {
        self.sm_state == sm_state::MASTER && self.up_done
    }
    /// The SA's multicast groups and services.
    pub fn sa_state(&self) -> &SaState {
        &self.sa
    }
    /// The MFT this SM computed for switch `node_guid`: a port mask per
    /// MLID from 0xC000.
    pub fn mft(&self, node_guid: u64) -> Option<&[u64]> {
        self.mfts.get(&node_guid).map(Vec::as_slice)
    }
    /// Whether a sweep is in progress.
    pub fn sweeping(&self) -> bool {
        self.stage != Stage::Idle
    }
    /// Counters.
    pub fn stats(&self) -> &SmStats {
        &self.stats
    }
    /// The SM's log (sweeps, LIDs, ports that did not answer).
    pub fn log(&self) -> &[String] {
        &self.log
    }
    /// Every end port (CA ports, switch port 0) of the last heavy sweep.
    pub fn subnet(&self) -> &[EndPort] {
        &self.subnet
    }
    /// The LID the SM gave the port with this GUID.
    pub fn lid_of(&self, port_guid: u64) -> Option<u16> {
        self.guid2lid.get(&port_guid).copied()
    }
    /// The port-GUID-to-LID map (what OpenSM keeps in its guid2lid file).
    pub fn lid_map(&self) -> &BTreeMap<u64, u16> {
        &self.guid2lid
    }
    /// Starts from a saved port-GUID-to-LID map.
    pub fn with_lid_map(mut self, m: BTreeMap<u64, u16>) -> SubnetManager {
        self.guid2lid = m
            .into_iter()
            .filter(|(_, l)| (1..=MAX_UCAST_LID).contains(l))
            .collect();
        self
    }
    /// The LFT entry the SM computed for `dlid` at switch `node_guid`.
    pub fn route(&self, node_guid: u64, dlid: u16) -> Option<u8> {
        self.lfts
            .get(&node_guid)?
            .get(usize::from(dlid))
            .copied()
            .filter(|&p| p != NO_PORT)
    }
    /// The cable at (node GUID, port), as discovered.
    pub fn neighbor(&self, node_guid: u64, port: u8) -> Option<(u64, u8)> {
        self.links.get(&(node_guid, port)).copied()
    }
    /// Asks for a heavy sweep at the next poll.
    pub fn request_sweep(&mut self) {
        self.heavy_requested = true;
        if self.stage == Stage::Idle {
            self.next_sweep = 0;
        }
    }

    /// When the SM next needs a poll (a timeout or a sweep), if ever.
    pub fn next_due(&self) -> Option<u64> {
        let t = self
            .pending
            .iter()
            .map(|p| p.deadline)
            .chain(self.rmpp.iter().map(|r| r.deadline))
            .chain(self.poll_target().map(|_| self.next_poll))
            .min();
        match self.stage {
            // With its link down the SM waits for the link, not a time; a
            // standby SM sweeps not at all.
            Stage::Idle
                if self.port_state != 1
                    && matches!(self.sm_state, sm_state::MASTER | sm_state::DISCOVERING) =>
            {
                Some(t.map_or(self.next_sweep, |t| t.min(self.next_sweep)))
            }
            _ => t,
        }
    }

    /// Whether a poll at `now` has anything to do, given the SM port's
    /// link generation and whether a packet is due there (the fabric
    /// asks before every poll, so an idle SM costs little).
    pub fn wants_poll(&self, now: u64, link_gen: u64, packet_due: bool) -> bool {
        packet_due
            || link_gen != self.link_gen
            || !self.queue.is_empty()
            || (self.mcast_dirty && self.stage == Stage::Idle && self.is_master())
            || self.next_due().is_some_and(|t| t <= now)
    }

    fn note(&mut self, now: u64, s: String) {
        if self.log.len() >= LOG_CAP {
            self.log.remove(0);
        }
        self.log.push(format!("[{:>10.6}] {s}", now as f64 / 1e9));
    }

    // ------------------------------------------------------------ polling

    /// One step at time `now`: answers and responses that arrived, timeouts,
    /// the next SMPs, sweeps that are due. Returns whether anything
    /// happened.
    pub fn poll(&mut self, f: &mut Fabric, now: u64) -> bool {
        let mut did = false;
        // Our own link.
        let gen_ = f.link_generation(self.port);
        if gen_ != self.link_gen {
            self.link_gen = gen_;
            did = true;
            if f.link_up(self.port) {
                self.port_state = 2;
                self.note(now, "SM port link up".into());
                self.request_sweep();
            } else {
                self.port_state = 1;
                self.note(now, "SM port link down".into());
                self.abort_sweep();
            }
        }
        for _ in 0..super::MAX_INBOUND {
            let Some(pkt) = f.take_due(self.port, now) else {
                break;
            };
            did = true;
            self.receive(f, now, &pkt);
        }
        // Timeouts.
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].deadline > now {
                i += 1;
                continue;
            }
            did = true;
            self.stats.timeouts += 1;
            if self.pending[i].tries <= self.cfg.smp_retries {
                let p = &mut self.pending[i];
                p.tries += 1;
                p.deadline = now.saturating_add(self.cfg.smp_timeout_ns);
                let (tid, req) = (p.tid, p.req.clone());
                self.transmit(f, now, tid, &req);
                i += 1;
            } else {
                let p = self.pending.swap_remove(i);
                self.timed_out(now, p.req);
            }
        }
        did |= self.rmpp_timeouts(f, now);
        did |= self.sm_state_timers(now);
        did |= self.send_owed_trap(f, now);
        if self.mcast_dirty && self.stage == Stage::Idle && self.is_master() {
            // A join or leave between sweeps: the MFTs now.
            self.mcast_mgr_process(now);
            did = true;
        }
        did |= self.pump(f, now);
        did
    }

    /// Resends the unacknowledged window of a stalled RMPP transfer, or
    /// gives it up.
    fn rmpp_timeouts(&mut self, f: &mut Fabric, now: u64) -> bool {
        let mut did = false;
        let mut i = 0;
        while i < self.rmpp.len() {
            if self.rmpp[i].deadline > now {
                i += 1;
                continue;
            }
            did = true;
            if self.rmpp[i].tries > self.cfg.smp_retries {
                let r = self.rmpp.swap_remove(i);
                self.stats.sa_rmpp_aborted += 1;
                self.note(
                    now,
                    format!(
                        "SA: RMPP transfer to LID {} unacknowledged: dropped",
                        r.dlid
                    ),
                );
                continue;
            }
            let r = &mut self.rmpp[i];
            r.tries += 1;
            r.sent = r.acked;
            self.rmpp_send_window(f, now, i);
            i += 1;
        }
        did
    }

    /// Sends the segments of transfer `i` up to its window.
    fn rmpp_send_window(&mut self, f: &mut Fabric, now: u64, i: usize) {
        let timeout = self.rmpp_timeout();
        let lid = self.lid;
        let Some(r) = self.rmpp.get_mut(i) else {
            return;
        };
        let last = r.window_last.min(r.nsegs);
        while r.sent < last {
            r.sent += 1;
            let mut m = r.mad;
            super::sa::write_segment(&mut m, &r.data, r.sent, r.nsegs);
            let mut h = packet::mad_headers(r.dlid, lid, r.dqp, 1, r.pkey);
            h.lrh.sl = r.sl;
            if let Ok(bytes) = packet::build(&h, &m) {
                f.send_from(self.port, Packet { bytes }, now);
            }
        }
        r.deadline = now.saturating_add(timeout);
    }

    fn rmpp_timeout(&self) -> u64 {
        self.cfg.smp_timeout_ns.saturating_mul(5)
    }

    /// An RMPP ACK, STOP or ABORT from the receiver of one of our
    /// transfers.
    fn rmpp_control(&mut self, f: &mut Fabric, now: u64, slid: u16, mad: &[u8]) {
        let tid = be64(mad, 8);
        let Some(i) = self
            .rmpp
            .iter()
            .position(|r| r.tid == tid && r.dlid == slid)
        else {
            return;
        };
        match mad[25] {
            2 => {
                let seg = u32::from_be_bytes([mad[28], mad[29], mad[30], mad[31]]);
                let newwin = u32::from_be_bytes([mad[32], mad[33], mad[34], mad[35]]);
                let r = &mut self.rmpp[i];
                if seg > r.sent || seg < r.acked || newwin < seg {
                    // Not a sane ACK: ignored (the timer resends).
                    self.stats.bad_mads += 1;
                    return;
                }
                r.acked = seg;
                r.tries = 0;
                r.window_last = r.window_last.max(newwin);
                if r.acked >= r.nsegs {
                    self.rmpp.swap_remove(i);
                    return;
                }
                self.rmpp_send_window(f, now, i);
            }
            _ => {
                // STOP or ABORT: the receiver wants no more.
                self.rmpp.swap_remove(i);
                self.stats.sa_rmpp_aborted += 1;
            }
        }
    }

    /// Sends queued SMPs while the window allows; moves to the next stage
    /// when one is done; starts sweeps.
    fn pump(&mut self, f: &mut Fabric, now: u64) -> bool {
        let mut did = false;
        for _ in 0..64 {
            while self.pending.len() < self.cfg.max_outstanding.max(1) {
                let Some(req) = self.queue.pop_front() else {
                    break;
                };
                self.tid = self.tid.wrapping_add(1);
                let tid = self.tid;
                self.transmit(f, now, tid, &req);
                self.pending.push(Pending {
                    tid,
                    req,
                    deadline: now.saturating_add(self.cfg.smp_timeout_ns),
                    tries: 1,
                });
                did = true;
            }
            if !self.pending.is_empty() || !self.queue.is_empty() {
                break;
            }
            if !self.advance_stage(f, now) {
                break;
            }
            did = true;
        }
        did
    }

    fn transmit(&mut self, f: &mut Fabric, now: u64, tid: u64, r: &Req) {
        let Ok(mut smp) = Smp::dr_get(tid, r.attr_id, r.attr_mod, &r.path) else {
            return;
        };
        smp.hdr.method = r.meth;
        smp.data = r.data;
        // C14-9:1: the sending node moves the hop pointer to 1.
        smp.hop_ptr = 1;
        let h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, packet::DEFAULT_PKEY);
        if let Ok(bytes) = packet::build(&h, &smp.to_bytes()) {
            self.stats.smps_sent += 1;
            f.send_from(self.port, Packet { bytes }, now);
        }
    }

    fn abort_sweep(&mut self) {
        self.queue.clear();
        self.pending.clear();
        self.stage = Stage::Idle;
    }

    /// The current stage has no work left: go on. Returns whether a stage
    /// changed.
    fn advance_stage(&mut self, f: &mut Fabric, now: u64) -> bool {
        match self.stage {
            Stage::Idle => {
                if now < self.next_sweep
                    || self.port_state == 1
                    || !f.link_up(self.port)
                    || !matches!(self.sm_state, sm_state::MASTER | sm_state::DISCOVERING)
                {
                    return false;
                }
                if self.heavy_requested || self.sweep_errors || self.subnet.is_empty() {
                    self.start_heavy(now);
                } else {
                    self.start_light(now);
                }
                true
            }
            Stage::Light => {
                self.stats.smps_last_light =
                    self.stats.smps_sent.saturating_sub(self.smps_at_start);
                if self.heavy_requested {
                    self.start_heavy(now);
                } else {
                    self.stats.light_sweeps += 1;
                    self.stage = Stage::Idle;
                    self.next_sweep = now.saturating_add(self.cfg.sweep_interval_ns);
                }
                true
            }
            Stage::Discover => {
                if !self.discovery_done(f, now) {
                    self.stage = Stage::Idle;
                    return true;
                }
                self.assign_lids(now);
                self.compute_routes(now);
                self.mcast_mgr_process(now);
                self.stage = Stage::Routes;
                true
            }
            Stage::Routes => {
                self.enqueue_config(now);
                self.stage = Stage::Config;
                true
            }
            Stage::Config => {
                self.enqueue_state(3);
                self.stage = Stage::Arm;
                true
            }
            Stage::Arm => {
                self.enqueue_state(4);
                self.stage = Stage::Activate;
                true
            }
            Stage::Activate => {
                self.finish_heavy(now);
                true
            }
        }
    }

    fn start_light(&mut self, now: u64) {
        self.stage = Stage::Light;
        self.smps_at_start = self.stats.smps_sent;
        let switches: Vec<(u64, Vec<u8>)> = self
            .nodes
            .values()
            .filter(|n| n.node_type == 2)
            .map(|n| (n.guid, n.path.clone()))
            .collect();
        for (guid, path) in switches {
            self.queue.push_back(Req {
                path,
                meth: method::GET,
                attr_id: attr::SWITCH_INFO,
                attr_mod: 0,
                data: [0; 64],
                ctx: Ctx::Light { node: guid },
            });
        }
        // The other SMs: still there, still in the state they were?
        let sms: Vec<(u64, Vec<u8>, u16)> = self
            .remote_sms
            .iter()
            .map(|(g, r)| (*g, r.path.clone(), r.lid))
            .collect();
        for (guid, path, lid) in sms {
            self.queue_sminfo_get(guid, path, lid);
        }
        let _ = now;
    }

    fn start_heavy(&mut self, now: u64) {
        self.stage = Stage::Discover;
        self.heavy_requested = false;
        self.sweep_errors = false;
        self.master_found = false;
        self.sweep_start = now;
        self.smps_at_start = self.stats.smps_sent;
        self.nodes.clear();
        self.note(now, "heavy sweep: discovering".into());
        // The SM's own node, without an SMP (its SMA is local).
        let me = self.local_node();
        self.nodes.insert(me.guid, me);
        self.queue.push_back(Req {
            path: vec![1],
            meth: method::GET,
            attr_id: attr::NODE_INFO,
            attr_mod: 0,
            data: [0; 64],
            ctx: Ctx::Probe {
                from: (self.cfg.node_guid, 1),
            },
        });
    }

    fn finish_heavy(&mut self, now: u64) {
        self.stage = Stage::Idle;
        self.rereg_done = true;
        self.stats.heavy_sweeps += 1;
        self.stats.smps_last_heavy = self.stats.smps_sent.saturating_sub(self.smps_at_start);
        self.stats.last_heavy_ns = now.saturating_sub(self.sweep_start);
        if self.port_state == 4 && self.sm_state == sm_state::MASTER {
            if !self.up_done {
                self.note(now, "SM state: MASTER".into());
            }
            self.up_done = true;
        }
        self.subnet = self.collect_endports();
        self.switch_infos = self
            .nodes
            .values()
            .filter_map(|n| n.switch_info.map(|si| (n.guid, si)))
            .collect();
        self.links = self
            .nodes
            .values()
            .flat_map(|n| {
                n.ports
                    .iter()
                    .filter_map(move |(p, r)| r.peer.map(|q| ((n.guid, *p), q)))
            })
            .collect();
        self.port_infos = self
            .nodes
            .values()
            .flat_map(|n| {
                n.ports
                    .iter()
                    .filter_map(move |(p, r)| r.info.map(|i| ((n.guid, *p), i)))
            })
            .collect();
        self.act_count = self.act_count.wrapping_add(1);
        // The SA's groups: the broadcast group from the first sweep on,
        // members whose port went away dropped.
        let rows = self.sm_rows();
        let mut sa = std::mem::take(&mut self.sa);
        let changed = super::sa::mcmember_record::subnet_changed(&mut sa, &self.view(&rows));
        self.sa = sa;
        if changed {
            self.mcast_dirty = true;
        }
        // After errors: again soon, then backing off (doubling) to the
        // light-sweep interval while the errors persist.
        let wait = if self.sweep_errors {
            let n = self.error_sweeps.min(16);
            self.error_sweeps += 1;
            self.cfg
                .error_resweep_ns
                .saturating_mul(1 << n)
                .min(self.cfg.sweep_interval_ns)
        } else {
            self.error_sweeps = 0;
            self.cfg.sweep_interval_ns
        };
        // A trap (or a light sweep's PortStateChange) that came while this
        // sweep ran asked for another one: at once, as OpenSM re-sweeps
        // when a trap arrived during its sweep, not at the next interval.
        self.next_sweep = if self.heavy_requested {
            now
        } else {
            now.saturating_add(wait)
        };
        let msg = format!(
            "SUBNET UP: {} nodes, {} end ports, {} SMPs, {} ms{}",
            self.nodes.len(),
            self.subnet.len(),
            self.stats.smps_last_heavy,
            self.stats.last_heavy_ns / 1_000_000,
            if self.sweep_errors {
                " (with errors: see above)"
            } else {
                ""
            }
        );
        self.note(now, msg);
    }

    /// This SM and the other SMs it knows, for the SA's SMInfoRecords.
    fn sm_rows(&self) -> Vec<SmRow> {
        let mut rows = vec![SmRow {
            lid: self.lid,
            guid: self.port_guid(),
            act_count: self.act_count,
            priority: self.cfg.priority,
            state: self.sm_state,
        }];
        rows.extend(self.remote_sms.iter().map(|(g, r)| SmRow {
            lid: r.lid,
            guid: *g,
            act_count: r.act_count,
            priority: r.priority,
            state: r.state,
        }));
        rows
    }

    /// What the SA reads, from the last heavy sweep.
    fn view<'a>(&'a self, rows: &'a [SmRow]) -> super::sa::View<'a> {
        super::sa::View {
            ports: &self.subnet,
            lfts: &self.lfts,
            links: &self.links,
            port_infos: &self.port_infos,
            cfg: &self.cfg,
            sm_lid: self.lid,
            switch_infos: &self.switch_infos,
            mfts: &self.mfts,
            sms: rows,
        }
    }

    fn answered(&mut self, now: u64, req: Req, smp: &Smp) {
        let status = smp.hdr.status & !mad_status::DIRECTION;
        match req.ctx {
            Ctx::SmInfo { guid, lid } => {
                if status == 0 {
                    self.sminfo_answer(now, guid, lid, &req.path, &smp.data);
                } else {
                    self.sminfo_failed(now, guid);
                }
                return;
            }
            Ctx::SetSmInfo { guid, amod } => {
                self.sminfo_set_done(now, guid, amod, status == 0);
                return;
            }
            _ => {}
        }
        if status != 0 {
            self.sweep_errors = true;
            let what = format!(
                "SMP attr {:#06x} mod {:#x} along {:?}: status {status:#06x}",
                req.attr_id, req.attr_mod, req.path
            );
            self.note(now, what);
            if let Ctx::SetPortInfo { node, port } = req.ctx
                && let Some(pr) = self.port_rec(node, port)
            {
                pr.failed = true;
            }
            return;
        }
        let d = smp.data;
        match req.ctx {
            Ctx::Probe { from } => self.probe_answer(now, &req.path, from, &d),
            Ctx::NodeDesc { node } => {
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.description = d;
                }
            }
            Ctx::SwitchInfo { node } => {
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.switch_info = Some(d);
                }
            }
            Ctx::PortInfo { node, port } => self.port_info_answer(node, port, &d),
            Ctx::SetPortInfo { node, port } => {
                if let Some(pr) = self.port_rec(node, port) {
                    pr.info = Some(d);
                }
            }
            Ctx::SetSwitchInfo { node } => {
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.switch_info = Some(d);
                }
            }
            Ctx::SetLft { node, block } => {
                let base = usize::from(block) * 64;
                let lft = self.programmed.entry(node).or_default();
                if lft.len() < base + 64 {
                    lft.resize(base + 64, NO_PORT);
                }
                lft[base..base + 64].copy_from_slice(&d);
            }
            Ctx::SetMft { node, block, pos } => self.mft_set_done(node, block, pos, &d),
            Ctx::SmInfo { .. } | Ctx::SetSmInfo { .. } => {}
            Ctx::Light { node } => {
                if d[11] & 0x04 != 0 {
                    self.note(now, format!("switch {node:#018x}: port state change"));
                    self.heavy_requested = true;
                }
            }
        }
    }

    fn timed_out(&mut self, now: u64, req: Req) {
        let tries = u32::from(self.cfg.smp_retries) + 1;
        self.note(
            now,
            format!(
                "no answer to SMP attr {:#06x} mod {:#x} along {:?} after {tries} tries: skipped",
                req.attr_id, req.attr_mod, req.path
            ),
        );
        match req.ctx {
            Ctx::Light { .. } => self.heavy_requested = true,
            Ctx::SmInfo { guid, .. } => self.sminfo_failed(now, guid),
            Ctx::SetSmInfo { guid, amod } => self.sminfo_set_done(now, guid, amod, false),
            Ctx::SetMft { node, .. } => {
                self.programmed_mft.remove(&node);
                self.sweep_errors = true;
            }
            Ctx::SetLft { node, .. } => {
                // Unknown contents now: reprogram it all next time.
                self.programmed.remove(&node);
                self.sweep_errors = true;
            }
            Ctx::SetPortInfo { node, port } | Ctx::PortInfo { node, port } => {
                if let Some(pr) = self.port_rec(node, port) {
                    pr.failed = true;
                }
                self.sweep_errors = true;
            }
            _ => self.sweep_errors = true,
        }
    }

    fn port_rec(&mut self, node: u64, port: u8) -> Option<&mut PortRec> {
        self.nodes.get_mut(&node)?.ports.get_mut(&port)
    }

    fn probe_answer(&mut self, now: u64, path: &[u8], from: (u64, u8), d: &[u8; 64]) {
        let node_type = d[2];
        let nports = d[3];
        let guid = be64(d, 12);
        let port_guid = be64(d, 20);
        let local = d[36];
        if !(1..=2).contains(&node_type) || (node_type == 1 && (local == 0 || local > nports)) {
            self.note(now, format!("node along {path:?}: NodeInfo not understood"));
            self.sweep_errors = true;
            return;
        }
        // The cable.
        if let Some(pr) = self.port_rec(from.0, from.1) {
            pr.peer = Some((guid, local));
        }
        let mut ni = [0u8; 40];
        ni.copy_from_slice(&d[..40]);
        let known = self.nodes.contains_key(&guid);
        let req = |attr_id: u16, attr_mod: u32, ctx: Ctx| Req {
            path: path.to_vec(),
            meth: method::GET,
            attr_id,
            attr_mod,
            data: [0; 64],
            ctx,
        };
        if !known {
            let mut n = Node {
                guid,
                node_type,
                node_info: ni,
                description: [0; 64],
                path: path.to_vec(),
                switch_info: None,
                ports: BTreeMap::new(),
                entry: local,
            };
            self.queue
                .push_back(req(attr::NODE_DESC, 0, Ctx::NodeDesc { node: guid }));
            if node_type == 2 {
                self.queue
                    .push_back(req(attr::SWITCH_INFO, 0, Ctx::SwitchInfo { node: guid }));
                for p in 0..=nports {
                    n.ports.insert(p, PortRec::new(guid, path.to_vec()));
                    self.queue.push_back(req(
                        attr::PORT_INFO,
                        u32::from(p),
                        Ctx::PortInfo {
                            node: guid,
                            port: p,
                        },
                    ));
                }
            }
            self.nodes.insert(guid, n);
        }
        if let Some(n) = self.nodes.get_mut(&guid) {
            if let Some(pr) = n.ports.get_mut(&local) {
                pr.peer = Some(from);
            } else if node_type == 1 {
                let mut pr = PortRec::new(port_guid, path.to_vec());
                pr.peer = Some(from);
                n.ports.insert(local, pr);
                self.queue.push_back(req(
                    attr::PORT_INFO,
                    u32::from(local),
                    Ctx::PortInfo {
                        node: guid,
                        port: local,
                    },
                ));
            }
        }
    }

    fn port_info_answer(&mut self, node: u64, port: u8, d: &[u8; 64]) {
        let Some(n) = self.nodes.get_mut(&node) else {
            return;
        };
        let (is_switch, entry, path) = (n.node_type == 2, n.entry, n.path.clone());
        let Some(pr) = n.ports.get_mut(&port) else {
            return;
        };
        pr.info = Some(*d);
        let (guid, port_path) = (pr.guid, pr.path.clone());
        let state = d[32] & 0xf;
        let phys = d[33] >> 4;
        // An end port with IsSM has an SM to ask (OpenSM's
        // `pi_rcv_process_endport`).
        let end = !is_switch || port == 0;
        let cap = u32::from_be_bytes([d[20], d[21], d[22], d[23]]);
        if end && cap & CAP_IS_SM != 0 && guid != self.port_guid() && guid != 0 {
            let lid = be16(d, 16);
            self.queue_sminfo_get(guid, port_path, lid);
        }
        // A switch port with its link up leads somewhere: probe it (not
        // the way we came in, whose far end is known).
        if is_switch && port != 0 && port != entry && state >= 2 && phys == 5 && path.len() < 63 {
            let mut p = path;
            p.push(port);
            self.queue.push_back(Req {
                path: p,
                meth: method::GET,
                attr_id: attr::NODE_INFO,
                attr_mod: 0,
                data: [0; 64],
                ctx: Ctx::Probe { from: (node, port) },
            });
        }
    }

    // ------------------------------------------------------ LIDs, routes

    /// Moves every port one state up: `to` 3 arms ports in Init, 4
    /// activates Armed ones (switch external ports whose far end answered,
    /// switch port 0, CA ports that took their LID).
    fn enqueue_state(&mut self, to: u8) {
        let from = to.saturating_sub(1);
        // Our own port, locally.
        if self.port_state == from && self.lid != 0 {
            self.port_state = to;
        }
        let mut reqs = Vec::new();
        for n in self.nodes.values() {
            if n.guid == self.cfg.node_guid {
                continue;
            }
            for (&p, pr) in &n.ports {
                let Some(info) = pr.info else { continue };
                if pr.failed || info[32] & 0xf != from {
                    continue;
                }
                let end = n.node_type != 2 || p == 0;
                if end && pr.lid == 0 {
                    continue;
                }
                if !end {
                    // A switch port: only toward a node that answered.
                    let ok = pr.peer.is_some_and(|(g, q)| {
                        self.nodes
                            .get(&g)
                            .and_then(|x| x.ports.get(&q))
                            .is_some_and(|x| x.info.is_some() && !x.failed)
                    });
                    if !ok {
                        continue;
                    }
                }
                let mut d = info;
                d[29] = 0;
                d[32] = (d[32] & 0xf0) | to;
                // Every port but a switch's base port 0 (OpenSM's
                // `osm_link_mgr.c`).
                if n.node_type != 2 || p != 0 {
                    d[53] = ERROR_THRESHOLDS;
                }
                d[33] = 0;
                d[35] &= 0xf0;
                if !end {
                    let (mtu, vls) = self.link_params(n.guid, p);
                    d[36] = mtu << 4 | (d[36] & 0xf);
                    // Partition enforcement, inbound and outbound, on a
                    // switch port toward a CA where the switch can enforce
                    // (SwitchInfo PartitionEnforcementCap): OpenSM's
                    // default `part_enforce both` (`osm_pkey_mgr.c`).
                    let leaf = pr
                        .peer
                        .and_then(|(g, _)| self.nodes.get(&g))
                        .is_some_and(|x| x.node_type != 2);
                    let can = n.switch_info.is_some_and(|si| be16(&si, 14) != 0);
                    d[43] = vls << 4 | if leaf && can { 0xc } else { 0 };
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
    }

    fn collect_endports(&self) -> Vec<EndPort> {
        let mut v = Vec::new();
        for n in self.nodes.values() {
            for (&p, pr) in &n.ports {
                let end = n.node_type != 2 || p == 0;
                if !end || pr.lid == 0 {
                    continue;
                }
                let info = if n.guid == self.cfg.node_guid {
                    self.local_port_info()
                } else {
                    let Some(i) = pr.info else { continue };
                    i
                };
                let mut ni = n.node_info;
                ni[20..28].copy_from_slice(&pr.guid.to_be_bytes());
                ni[36] = p;
                v.push(EndPort {
                    port_guid: pr.guid,
                    node_guid: n.guid,
                    port: p,
                    lid: pr.lid,
                    node_type: n.node_type,
                    node_info: ni,
                    description: n.description,
                    port_info: info,
                });
            }
        }
        v.sort_by_key(|e| e.lid);
        v
    }
}
