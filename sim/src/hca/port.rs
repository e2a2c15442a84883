//! The two InfiniBand ports.
//!
//! Physical and logical link state, the subnet attributes an SM assigns (LID,
//! SM LID/SL, LMC, GID prefix, M_Key and its lease), the P_Key and GUID
//! tables, the SL-to-VL and VL arbitration tables, SET_PORT capabilities and
//! the PMA counters; link training beyond the speed (4x, at FDR when both
//! ends of the cable have it: the fabric says what the far end has), VL
//! arbitration itself and Ethernet are not modelled.
//!
//! A port starts Down/Disabled. INIT_PORT enables it: with the cable
//! plugged (the default, [`HcaConfig::cable_plugged`]) the physical state
//! becomes LinkUp and the logical state Init, waiting for the SM. Only the
//! SM's SubnSet(PortInfo) through the firmware SMA (MAD_IFC, or an SMP
//! received from the link) moves it to Armed and Active;
//! becoming Active, or leaving Active, raises a PORT_CHANGE event.

use crate::fabric::{LogicalState, PhysicalState};
use crate::hca::config::HcaConfig;

/// Size of the P_Key table.
pub const PKEY_TABLE_LEN: usize = 128;
/// Size of the GUID table.
pub const GUID_TABLE_LEN: usize = 128;

/// PMA PortCounters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// SymbolErrorCounter.
    pub symbol_errors: u16,
    /// LinkDownedCounter.
    pub link_downed: u8,
    /// PortRcvErrors.
    pub rcv_errors: u16,
    /// PortXmitDiscards.
    pub xmit_discards: u16,
    /// VL15Dropped.
    pub vl15_dropped: u16,
    /// PortXmitData (in 4-byte words).
    pub xmit_data: u32,
    /// PortRcvData.
    pub rcv_data: u32,
    /// PortXmitPkts.
    pub xmit_pkts: u32,
    /// PortRcvPkts.
    pub rcv_pkts: u32,
    /// PortXmitData, 64 bits (PortCountersExtended).
    pub ext_xmit_data: u64,
    /// PortRcvData, 64 bits.
    pub ext_rcv_data: u64,
    /// PortXmitPkts, 64 bits.
    pub ext_xmit_pkts: u64,
    /// PortRcvPkts, 64 bits.
    pub ext_rcv_pkts: u64,
}

/// One port.
#[derive(Debug, Clone)]
pub struct Port {
    /// Port number (1-based).
    pub num: u8,
    /// INIT_PORT done.
    pub initialized: bool,
    /// A cable and a live partner are present.
    pub cable: bool,
    /// Physical state.
    pub phys: PhysicalState,
    /// Logical state.
    pub state: LogicalState,
    /// Base LID.
    pub lid: u16,
    /// Master SM LID.
    pub sm_lid: u16,
    /// Master SM SL.
    pub sm_sl: u8,
    /// LMC.
    pub lmc: u8,
    /// GID prefix.
    pub gid_prefix: u64,
    /// M_Key.
    pub mkey: u64,
    /// M_Key lease period.
    pub mkey_lease: u16,
    /// M_Key protect bits.
    pub mkey_protect: u8,
    /// Capability mask (firmware defaults, replaced by SET_PORT).
    pub cap_mask: u32,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Client reregister bit (as last set).
    pub client_rereg: bool,
    /// Neighbor MTU (IB enum).
    pub neighbor_mtu: u8,
    /// MTU capability (IB enum).
    pub mtu_cap: u8,
    /// Max data VLs the hardware supports (1, 2, 4 or 8).
    pub max_vls: u8,
    /// VL capability set by SET_PORT.
    pub vl_cap: u8,
    /// Operational VLs.
    pub op_vls: u8,
    /// P_Key table.
    pub pkeys: Vec<u16>,
    /// GUID table (index 0 = port GUID).
    pub guids: Vec<u64>,
    /// PMA counters.
    pub counters: Counters,
    /// M_Key violations.
    pub mkey_violations: u16,
    /// P_Key violations.
    pub pkey_violations: u16,
    /// Q_Key violations.
    pub qkey_violations: u16,
    /// The M_Key lease timer (IBTA 14.2.4.2): when it runs out (model
    /// clock, nanoseconds) the M_Key protection bits fall to 0. Started by
    /// a failed M_Key check while the lease period is not 0, stopped by an
    /// SMP with the right key.
    pub mkey_lease_due: Option<u64>,
    /// Traps the SMA has sent from this port (the low half of each trap's
    /// TID).
    pub traps_sent: u32,
    /// LinkSpeedExtEnabled (IBTA 14.2.5.6; bit 0 = FDR 14.0625 Gb/s).
    pub link_speed_ext_enabled: u8,
    /// The extended speeds the far end of the cable would train to, as the
    /// fabric last said ([`crate::fabric::Fabric::peer_link_speeds_ext`]);
    /// without a fabric, FDR (the far end is taken to be an FDR switch).
    pub peer_speeds_ext: u8,
    /// SLtoVLMappingTable (IBTA 14.2.5.8): the VL of SL `n` in nibble `n`
    /// (SL 0 in the high nibble of byte 0), as the attribute carries it.
    pub sl2vl: [u8; 8],
    /// VLArbitrationTable low-priority entries (VL, weight), `VL_ARB_CAP`
    /// of them.
    pub vlarb_low: [[u8; 2]; VL_ARB_CAP],
    /// VLArbitrationTable high-priority entries.
    pub vlarb_high: [[u8; 2]; VL_ARB_CAP],
}

/// VLArbitrationHighCap and VLArbitrationLowCap: entries in each of the
/// port's two VL arbitration tables.
pub const VL_ARB_CAP: usize = 8;

/// LinkSpeedExtSupported of a ConnectX-3 FDR port (MT27500 family, the
/// FCBT parts): FDR (14.0625 Gb/s a lane) only.
pub const LINK_SPEED_EXT_SUPPORTED: u8 = 0x1;

/// PortInfo CapabilityMask the firmware SMA reports by default: what
/// `ibstat` shows for a ConnectX-3 without an SM (0x02514868): IsTrap (3),
/// IsAutomaticMigration (5), IsSLMapping (6), IsSystemImageGUID (11),
/// IsExtendedSpeeds (14), IsCommunicationManagement (16), IsVendorClass (20),
/// IsCapabilityMaskNotice (22), IsClientReregistration (25).
pub const DEFAULT_CAP_MASK: u32 = 0x0251_4868;

impl Port {
    /// A powered-on port.
    pub fn new(num: u8, cfg: &HcaConfig) -> Port {
        let port_guid = cfg.node_guid.wrapping_add(u64::from(num));
        let mut guids = vec![0u64; GUID_TABLE_LEN];
        guids[0] = port_guid;
        let mut pkeys = vec![0u16; PKEY_TABLE_LEN];
        pkeys[0] = 0xffff;
        Port {
            num,
            initialized: false,
            cable: cfg.cable_plugged,
            phys: PhysicalState::Disabled,
            state: LogicalState::Down,
            lid: 0,
            sm_lid: 0,
            sm_sl: 0,
            lmc: 0,
            gid_prefix: 0xfe80_0000_0000_0000,
            mkey: 0,
            mkey_lease: 0,
            mkey_protect: 0,
            cap_mask: DEFAULT_CAP_MASK,
            subnet_timeout: 0,
            client_rereg: false,
            neighbor_mtu: 5,
            mtu_cap: 5,
            max_vls: cfg.max_vls,
            vl_cap: cfg.max_vls,
            op_vls: 1,
            pkeys,
            guids,
            counters: Counters::default(),
            mkey_violations: 0,
            pkey_violations: 0,
            qkey_violations: 0,
            mkey_lease_due: None,
            traps_sent: 0,
            link_speed_ext_enabled: LINK_SPEED_EXT_SUPPORTED,
            peer_speeds_ext: LINK_SPEED_EXT_SUPPORTED,
            sl2vl: [0; 8],
            vlarb_low: [[0; 2]; VL_ARB_CAP],
            vlarb_high: [[0; 2]; VL_ARB_CAP],
        }
    }

    /// Back to power-on (software reset), keeping the cable state and GUID.
    pub fn reset(&mut self) {
        let cable = self.cable;
        let max_vls = self.max_vls;
        let guid = self.guids[0];
        *self = Port {
            cable,
            max_vls,
            vl_cap: max_vls,
            ..self.clone()
        };
        self.initialized = false;
        self.phys = PhysicalState::Disabled;
        self.state = LogicalState::Down;
        self.lid = 0;
        self.sm_lid = 0;
        self.sm_sl = 0;
        self.lmc = 0;
        self.mkey = 0;
        self.cap_mask = DEFAULT_CAP_MASK;
        self.pkeys = vec![0; PKEY_TABLE_LEN];
        self.pkeys[0] = 0xffff;
        self.guids = vec![0; GUID_TABLE_LEN];
        self.guids[0] = guid;
        self.counters = Counters::default();
        self.mkey_protect = 0;
        self.mkey_lease = 0;
        self.mkey_lease_due = None;
        self.link_speed_ext_enabled = LINK_SPEED_EXT_SUPPORTED;
        self.sl2vl = [0; 8];
        self.vlarb_low = [[0; 2]; VL_ARB_CAP];
        self.vlarb_high = [[0; 2]; VL_ARB_CAP];
    }

    /// The VL data packets of service level `sl` leave on: the
    /// SLtoVLMappingTable's entry (15 for an SL the SM mapped to VL 15:
    /// such data packets are dropped, VL 15 being the SMPs').
    pub fn vl_of(&self, sl: u8) -> u8 {
        let b = self.sl2vl[usize::from(sl & 0xf) / 2];
        if sl & 1 == 0 { b >> 4 } else { b & 0xf }
    }

    /// LinkSpeedExtActive: the fastest extended speed both ends of the
    /// live link have (FDR with FDR enabled here and at the far end; 0:
    /// the link runs at QDR).
    pub fn link_speed_ext_active(&self) -> u8 {
        if self.phys != PhysicalState::LinkUp {
            return 0;
        }
        crate::fabric::link_speed_ext_active(
            self.link_speed_ext_enabled & LINK_SPEED_EXT_SUPPORTED,
            self.peer_speeds_ext,
        )
    }

    /// Port GUID.
    pub fn guid(&self) -> u64 {
        self.guids[0]
    }

    /// Recomputes the physical state from INIT_PORT and the cable; returns
    /// the logical state it implies if the link just came up or went down.
    pub fn retrain(&mut self) {
        match (self.initialized, self.cable) {
            (false, _) => {
                self.phys = PhysicalState::Disabled;
                self.state = LogicalState::Down;
            }
            (true, false) => {
                self.phys = PhysicalState::Polling;
                self.state = LogicalState::Down;
            }
            (true, true) => {
                self.phys = PhysicalState::LinkUp;
                if self.state == LogicalState::Down {
                    self.state = LogicalState::Init;
                }
            }
        }
    }
}

impl crate::hca::device::Hca {
    /// The port `num` (1-based), if it exists.
    pub fn port_index(&self, num: u32) -> Option<usize> {
        let i = usize::try_from(num).ok()?.checked_sub(1)?;
        (i < self.ports.len()).then_some(i)
    }

    /// Raises PORT_CHANGE if the port entered or left Active since `before`.
    pub fn port_changed(&mut self, i: usize, before: LogicalState) {
        let after = self.ports[i].state;
        let port = self.ports[i].num;
        if before != LogicalState::Active && after == LogicalState::Active {
            self.post_async(crate::hca::ctx::Event::PortChange { port, up: true });
        } else if before == LogicalState::Active && after != LogicalState::Active {
            self.ports[i].counters.link_downed =
                self.ports[i].counters.link_downed.saturating_add(1);
            self.post_async(crate::hca::ctx::Event::PortChange { port, up: false });
        }
    }

    /// Plugs or unplugs the cable (test API: link up/down).
    pub fn set_cable(&mut self, i: usize, plugged: bool) {
        let before = self.ports[i].state;
        self.ports[i].cable = plugged;
        self.ports[i].retrain();
        self.port_changed(i, before);
    }
}
