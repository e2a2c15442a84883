//! The card's configuration.
//!
//! Identity (GUIDs, firmware version, board), the limits QUERY_DEV_CAP reports, and
//! how the command register and a software reset behave in time, and what each
//! port is (InfiniBand, Ethernet, or either: [`PortType`]); how a front end
//! hosts the card (DMA arena, clocks, polling) is the front end's.

use std::time::Duration;

use crate::hca::layout::DevCap;

impl HcaConfig {
    /// Some port may run Ethernet (the card then reports what a VPI card
    /// does: see `crate::hca::eth`).
    pub fn has_eth(&self) -> bool {
        self.port_types[..usize::from(self.num_ports.clamp(1, 2))]
            .iter()
            .any(|t| *t != PortType::Ib)
    }
}

/// How a port is configured, as `mlxconfig`'s LINK_TYPE_P1/P2 configures
/// a VPI card (ConnectX-3 VPI: each port InfiniBand or Ethernet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum PortType {
    /// InfiniBand only (QUERY_PORT supported types 1).
    #[default]
    Ib,
    /// Ethernet only (supported types 2).
    Eth,
    /// Both (supported types 3): the driver picks one, with SENSE_PORT's
    /// help (the type of what the cable reaches), by the flavour of
    /// SET_PORT it sends.
    Auto,
}

impl PortType {
    /// `ib`, `eth` or `auto`.
    pub fn parse(s: &str) -> Option<PortType> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ib" | "infiniband" => Some(PortType::Ib),
            "eth" | "ethernet" => Some(PortType::Eth),
            "auto" | "vpi" => Some(PortType::Auto),
            _ => None,
        }
    }
    /// `P1[,P2]`: one type for both ports, or one per port.
    pub fn parse_pair(s: &str) -> Option<[PortType; 2]> {
        let mut it = s.split(',');
        let a = PortType::parse(it.next()?)?;
        let b = match it.next() {
            Some(b) => PortType::parse(b)?,
            None => a,
        };
        it.next().is_none().then_some([a, b])
    }
    /// The word [`PortType::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            PortType::Ib => "ib",
            PortType::Eth => "eth",
            PortType::Auto => "auto",
        }
    }
    /// QUERY_PORT's supported-types bits (1 IB, 2 Ethernet).
    pub fn supported_bits(self) -> u8 {
        match self {
            PortType::Ib => 1,
            PortType::Eth => 2,
            PortType::Auto => 3,
        }
    }
}

/// What the card is and how it behaves.
#[derive(Debug, Clone)]
pub struct HcaConfig {
    /// Number of IB ports (1 or 2).
    pub num_ports: u8,
    /// Firmware version (major, minor, subminor); 2.42.5000 by default.
    pub fw_version: (u16, u16, u16),
    /// FW area size in 4 KiB pages (QUERY_FW).
    pub fw_pages: u16,
    /// Command interface revision (3: new port commands).
    pub cmd_if_rev: u16,
    /// Node GUID; port n's GUID is node GUID + n.
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// NodeDescription the firmware SMA reports.
    pub node_description: String,
    /// Board id in QUERY_ADAPTER's VSD.
    pub board_id: String,
    /// Hardware revision (NodeInfo).
    pub hw_rev: u32,
    /// INTA pin (QUERY_ADAPTER).
    pub inta_pin: u8,
    /// Core clock in MHz (QUERY_HCA, internal clock).
    pub core_clock_mhz: u16,
    /// Sync mode: status-dword reads that still show GO after a post.
    pub hcr_polls: u32,
    /// Model-clock time before GO clears (both modes).
    pub hcr_delay: Duration,
    /// How long the function is off the bus after a software reset.
    pub reset_duration: Duration,
    /// Cables plugged: ports train after INIT_PORT.
    pub cable_plugged: bool,
    /// Data VLs each port supports (SET_PORT above this is EXCEED_LIM).
    pub max_vls: u8,
    /// Record a software reset without the reset semaphore as a violation.
    pub strict_reset_semaphore: bool,
    /// Device limits reported by QUERY_DEV_CAP and enforced.
    pub dev_cap: DevCap,
    /// Port types (ports 1 and 2); both InfiniBand by default.
    pub port_types: [PortType; 2],
}

impl Default for HcaConfig {
    fn default() -> Self {
        HcaConfig {
            num_ports: 2,
            fw_version: (2, 42, 5000),
            fw_pages: 256,
            cmd_if_rev: 3,
            node_guid: 0x0002_c903_0042_1000,
            sys_image_guid: 0x0002_c903_0042_1003,
            node_description: "MT25408 ConnectX Mellanox Technologies".into(),
            board_id: "MT_1090120019".into(),
            hw_rev: 0,
            inta_pin: 0,
            core_clock_mhz: 427,
            hcr_polls: 2,
            hcr_delay: Duration::ZERO,
            reset_duration: Duration::from_millis(100),
            cable_plugged: true,
            max_vls: 8,
            strict_reset_semaphore: true,
            dev_cap: DevCap::default(),
            port_types: [PortType::Ib; 2],
        }
    }
}
