//! The subnet as the SM knows it and the options it runs with, after OpenSM's `osm_subnet.c` (`osm_subn_t`, `osm_subn_opt_t`), `osm_node.c`, `osm_port.c` and `osm_switch.c`.
//!
//! Nodes are kept by node GUID with their physical ports; a port records its
//! PortInfo, the cable's far end and the directed route that reaches it. The
//! options are the subset of OpenSM's that this SM acts on, with OpenSM's
//! defaults; the option file, partitions, QoS, routing engines other than
//! min-hop, alias GUIDs and LMC > 0 are left out.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use crate::ib_types::{NodeInfo, PortInfo, SwitchInfo, node_type};

/// What the SM runs with (`osm_subn_opt_t`, OpenSM's defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmConfig {
    /// SMInfo priority, 0..15 (`-p`; OpenSM 0).
    pub priority: u8,
    /// SM_Key (OpenSM 1).
    pub sm_key: u64,
    /// M_Key given to every port (OpenSM 0).
    pub m_key: u64,
    /// Subnet prefix given to every port.
    pub subnet_prefix: u64,
    /// PortInfo SubnetTimeOut (OpenSM 18: 4.096 us * 2^18, about 1 s); also
    /// the PacketLifeTime of the paths the SA answers.
    pub subnet_timeout: u8,
    /// Milliseconds between light sweeps (`-s`; OpenSM 10 s); 0: no
    /// periodic sweep, only traps start one.
    pub sweep_interval_ms: u32,
    /// Milliseconds an SMP may take before it is sent again (OpenSM 200).
    pub transaction_timeout_ms: u32,
    /// Resends of an SMP (OpenSM 3).
    pub transaction_retries: u32,
    /// SMPs on the wire at once (OpenSM `max_wire_smps` 4).
    pub max_wire_smps: usize,
    /// Milliseconds between SMInfo polls of the master by a standby SM
    /// (OpenSM `sminfo_polling_timeout` 10 s).
    pub polling_timeout_ms: u32,
    /// Unanswered polls before a standby SM takes over (OpenSM 4).
    pub polling_retries: u32,
    /// HOQLife of switch ports toward switches (OpenSM 0x12).
    pub head_of_queue_lifetime: u8,
    /// HOQLife of switch ports toward CAs (OpenSM 0x10).
    pub leaf_head_of_queue_lifetime: u8,
    /// VLStallCount toward switches (OpenSM 7).
    pub vl_stall_count: u8,
    /// VLStallCount toward CAs (OpenSM 7).
    pub leaf_vl_stall_count: u8,
    /// LocalPhyErrors and OverrunErrors thresholds (OpenSM 8 each).
    pub local_phy_errors_threshold: u8,
    /// See [`SmConfig::local_phy_errors_threshold`].
    pub overrun_errors_threshold: u8,
    /// Largest OperationalVLs code given (OpenSM `max_op_vls` 5: VL0-14
    /// capped by VLCap; 1 = VL0 only).
    pub max_op_vls: u8,
    /// Never set ClientReregister (OpenSM `no_clients_rereg` FALSE).
    pub no_clients_rereg: bool,
    /// Milliseconds an RMPP DATA window may wait for its ACK before the SA
    /// sends it again.
    pub rmpp_timeout_ms: u32,
    /// Resends of an RMPP window before the transfer is given up.
    pub rmpp_retries: u32,
    /// Node description log lines and status are prefixed with.
    pub name: &'static str,
}

impl Default for SmConfig {
    fn default() -> SmConfig {
        SmConfig {
            priority: 0,
            sm_key: 1,
            m_key: 0,
            subnet_prefix: crate::ib_types::LINK_LOCAL_PREFIX,
            subnet_timeout: 18,
            sweep_interval_ms: 10_000,
            transaction_timeout_ms: 200,
            transaction_retries: 3,
            max_wire_smps: 4,
            polling_timeout_ms: 10_000,
            polling_retries: 4,
            head_of_queue_lifetime: 0x12,
            leaf_head_of_queue_lifetime: 0x10,
            vl_stall_count: 7,
            leaf_vl_stall_count: 7,
            local_phy_errors_threshold: 8,
            overrun_errors_threshold: 8,
            max_op_vls: 5,
            no_clients_rereg: false,
            rmpp_timeout_ms: 1000,
            rmpp_retries: 3,
            name: "opensm",
        }
    }
}

/// A physical port (`osm_physp_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Physp {
    /// Port GUID (a switch port's: the node GUID).
    pub guid: u64,
    /// PortInfo as last read or set.
    pub pi: Option<PortInfo>,
    /// The node and port at the far end of the cable.
    pub remote: Option<(u64, u8)>,
    /// The directed route that reaches this port's node through it (a CA
    /// port) or the node's (a switch).
    pub path: Vec<u8>,
    /// An SMP to this port failed this sweep: it is left alone.
    pub failed: bool,
}

impl Physp {
    /// A port known by GUID and path, nothing read yet.
    pub fn new(guid: u64, path: Vec<u8>) -> Physp {
        Physp {
            guid,
            pi: None,
            remote: None,
            path,
            failed: false,
        }
    }
    /// PortState, 0 if not read.
    pub fn state(&self) -> u8 {
        self.pi.map_or(0, |p| p.port_state())
    }
}

/// A switch's part of a node (`osm_switch_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    /// SwitchInfo as last read or set.
    pub info: SwitchInfo,
    /// The LFT this sweep computed (index: LID).
    pub lft: Vec<u8>,
    /// The MFT this sweep computed (index: MLID - 0xC000; bit p: port p).
    pub mft: Vec<u64>,
}

/// A node (`osm_node_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// NodeInfo as first read (PortGUID and LocalPortNum are those of the
    /// port it was first reached through).
    pub ni: NodeInfo,
    /// NodeDescription.
    pub desc: [u8; 64],
    /// The directed route to the node.
    pub path: Vec<u8>,
    /// Switch data.
    pub sw: Option<Switch>,
    /// Physical ports known (0 for a switch's management port).
    pub ports: BTreeMap<u8, Physp>,
}

impl Node {
    /// Node GUID.
    pub fn guid(&self) -> u64 {
        self.ni.node_guid()
    }
    /// Whether it is a switch.
    pub fn is_switch(&self) -> bool {
        self.ni.node_type() == node_type::SWITCH
    }
    /// Whether port `p` is an end port (a CA port, a switch's port 0).
    pub fn is_end(&self, p: u8) -> bool {
        !self.is_switch() || p == 0
    }
    /// NodeDescription up to its first NUL.
    pub fn desc_str(&self) -> &str {
        let n = self.desc.iter().position(|&b| b == 0).unwrap_or(64);
        core::str::from_utf8(&self.desc[..n]).unwrap_or("?")
    }
}

/// An end port the SA answers about (`osm_port_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndPort {
    /// Port GUID.
    pub guid: u64,
    /// Node GUID.
    pub node: u64,
    /// Port number (0 for a switch).
    pub port: u8,
    /// LID.
    pub lid: u16,
}

/// The subnet (`osm_subn_t`): nodes, end ports by GUID and by LID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subnet {
    /// Nodes by node GUID.
    pub nodes: BTreeMap<u64, Node>,
    /// End ports by port GUID.
    pub ports: BTreeMap<u64, EndPort>,
    /// Port GUID by LID.
    pub by_lid: BTreeMap<u16, u64>,
    /// The SM's own port GUID and LID.
    pub sm_port_guid: u64,
    /// The SM's LID (`sm_base_lid`).
    pub sm_lid: u16,
    /// The master SM's LID (ours when master).
    pub master_sm_lid: u16,
}

impl Subnet {
    /// The physical port `p` of node `guid`.
    pub fn physp(&self, guid: u64, p: u8) -> Option<&Physp> {
        self.nodes.get(&guid)?.ports.get(&p)
    }
    /// The same, writable.
    pub fn physp_mut(&mut self, guid: u64, p: u8) -> Option<&mut Physp> {
        self.nodes.get_mut(&guid)?.ports.get_mut(&p)
    }
    /// The end port with this GUID.
    pub fn port_by_guid(&self, g: u64) -> Option<&EndPort> {
        self.ports.get(&g)
    }
    /// The end port with this LID.
    pub fn port_by_lid(&self, lid: u16) -> Option<&EndPort> {
        self.ports.get(self.by_lid.get(&lid)?)
    }
    /// PortInfo of an end port.
    pub fn end_pi(&self, e: &EndPort) -> Option<&PortInfo> {
        self.physp(e.node, e.port)?.pi.as_ref()
    }
    /// The node of an end port.
    pub fn node_of(&self, e: &EndPort) -> Option<&Node> {
        self.nodes.get(&e.node)
    }
    /// Rebuilds the end-port tables from the nodes (after LIDs are known).
    pub fn index_ports(&mut self, lid_of: &BTreeMap<u64, u16>) {
        self.ports.clear();
        self.by_lid.clear();
        for n in self.nodes.values() {
            for (&p, pp) in &n.ports {
                if !n.is_end(p) || pp.pi.is_none() {
                    continue;
                }
                let lid = lid_of.get(&pp.guid).copied().unwrap_or(0);
                self.ports.insert(
                    pp.guid,
                    EndPort {
                        guid: pp.guid,
                        node: n.guid(),
                        port: p,
                        lid,
                    },
                );
                if lid != 0 {
                    self.by_lid.insert(lid, pp.guid);
                }
            }
        }
    }
    /// Switches by node GUID.
    pub fn switches(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values().filter(|n| n.is_switch())
    }
    /// The largest unicast LID in use.
    pub fn max_lid(&self) -> u16 {
        self.by_lid.keys().next_back().copied().unwrap_or(0)
    }
}
