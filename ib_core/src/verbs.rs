//! Port of Linux `include/rdma/ib_verbs.h` and `drivers/infiniband/core/verbs.c` (3.11): verbs types with Linux's names and values, the provider trait and `ib_modify_qp_is_ok`.
//!
//! The provider trait is `struct ib_device`'s ops. XRC, raw packet QPs, memory
//! windows, FMRs, fast-reg page lists, multicast attach, flow steering and
//! every user-space (`ib_udata`) path are left out.
//!
//! Objects are small typed handles chosen by the provider ([`Pd`], [`Cq`],
//! [`Qp`], [`Srq`], [`Ah`], [`Mr`]); the provider keeps the state behind them.
//! The hot path ([`IbDevice::post_send`], [`IbDevice::post_recv`],
//! [`IbDevice::poll_cq`]) takes slices and fills a caller's slice of [`Wc`], so
//! nothing on it allocates.

use core::fmt;

use hal::DmaPool;

use crate::error::{Error, PostError, Result};
use crate::mad::{Grh, Mad, MadResult};

macro_rules! c_enum {
    (
        $(#[$m:meta])*
        $vis:vis enum $name:ident : $repr:ty {
            $( $(#[$vm:meta])* $variant:ident = $val:expr => $lname:literal, )*
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr($repr)]
        $vis enum $name {
            $( $(#[$vm])* $variant = $val, )*
        }
        impl $name {
            /// Linux's name of the value.
            pub const fn name(self) -> &'static str {
                match self { $( $name::$variant => $lname, )* }
            }
            /// The raw value as Linux numbers it.
            pub const fn raw(self) -> $repr {
                self as $repr
            }
            /// The value for a raw number, if it is one.
            pub const fn from_raw(v: $repr) -> Option<Self> {
                match v { $( x if x == $val => Some($name::$variant), )* _ => None }
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

/// A C flag enum (`enum ib_*_flags`, `enum ib_*_attr_mask`) as a
/// [`bitflags`] type over its raw value (`.0`, which keeps bits this port
/// does not name, as the hardware may report them), with Linux's name of
/// each flag beside it for printing: `Display` joins the names of the set
/// flags with `|` (bits without a name in hex), `Debug` wraps that in the
/// type's name.
macro_rules! c_flags {
    (
        $(#[$m:meta])*
        $vis:vis struct $name:ident : $repr:ty {
            $( $(#[$($vm:tt)*])* const $flag:ident = $val:expr => $lname:literal; )*
        }
    ) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        $vis struct $name(pub $repr);

        bitflags::bitflags! {
            impl $name: $repr {
                $( $(#[$($vm)*])* const $flag = $val; )*
            }
        }

        impl $name {
            /// Linux's name of each flag, in declaration order.
            const LINUX_NAMES: &'static [($repr, &'static str)] = &[ $( ($val, $lname), )* ];
        }
        impl fmt::Display for $name {
            /// The Linux names of the set flags joined by `|` (unknown bits in hex).
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut rest = self.0;
                let mut first = true;
                for &(v, n) in Self::LINUX_NAMES {
                    if v != 0 && rest & v == v {
                        if !first { f.write_str("|")?; }
                        f.write_str(n)?;
                        first = false;
                        rest &= !v;
                    }
                }
                if rest != 0 || first {
                    if !first { f.write_str("|")?; }
                    write!(f, "{:#x}", rest)?;
                }
                Ok(())
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self)
            }
        }
    };
}

// ---------------------------------------------------------------------------
// Node, transport, link layer, port

c_enum! {
    /// `enum rdma_node_type`.
    pub enum NodeType: u8 {
        /// A channel adapter (our ConnectX-3).
        Ca = 1 => "RDMA_NODE_IB_CA",
        /// A switch.
        Switch = 2 => "RDMA_NODE_IB_SWITCH",
        /// A router.
        Router = 3 => "RDMA_NODE_IB_ROUTER",
        /// An iWARP RNIC.
        Rnic = 4 => "RDMA_NODE_RNIC",
    }
}

c_enum! {
    /// `enum rdma_transport_type`.
    pub enum Transport: u8 {
        /// InfiniBand.
        Ib = 0 => "RDMA_TRANSPORT_IB",
        /// iWARP.
        Iwarp = 1 => "RDMA_TRANSPORT_IWARP",
    }
}

impl NodeType {
    /// `rdma_node_get_transport`.
    pub const fn transport(self) -> Transport {
        match self {
            NodeType::Ca | NodeType::Switch | NodeType::Router => Transport::Ib,
            NodeType::Rnic => Transport::Iwarp,
        }
    }
    /// The word `ibv_devinfo`/`ibstat` print ("CA", "switch", ...).
    pub const fn short_name(self) -> &'static str {
        match self {
            NodeType::Ca => "CA",
            NodeType::Switch => "switch",
            NodeType::Router => "router",
            NodeType::Rnic => "RNIC",
        }
    }
}

c_enum! {
    /// `enum rdma_link_layer`.
    pub enum LinkLayer: u8 {
        /// Not said.
        Unspecified = 0 => "IB_LINK_LAYER_UNSPECIFIED",
        /// InfiniBand.
        Infiniband = 1 => "IB_LINK_LAYER_INFINIBAND",
        /// Ethernet (RoCE; not supported by this port).
        Ethernet = 2 => "IB_LINK_LAYER_ETHERNET",
    }
}

c_enum! {
    /// `enum ib_port_state`.
    pub enum PortState: u8 {
        /// No state change.
        Nop = 0 => "IB_PORT_NOP",
        /// Down.
        Down = 1 => "IB_PORT_DOWN",
        /// Initializing (physical link up, no SM yet).
        Init = 2 => "IB_PORT_INIT",
        /// Armed.
        Armed = 3 => "IB_PORT_ARMED",
        /// Active.
        Active = 4 => "IB_PORT_ACTIVE",
        /// Active, deferred.
        ActiveDefer = 5 => "IB_PORT_ACTIVE_DEFER",
    }
}

impl PortState {
    /// The word `ibv_devinfo` prints ("PORT_ACTIVE" ...).
    pub const fn ibv_str(self) -> &'static str {
        match self {
            PortState::Nop => "PORT_NOP",
            PortState::Down => "PORT_DOWN",
            PortState::Init => "PORT_INIT",
            PortState::Armed => "PORT_ARMED",
            PortState::Active => "PORT_ACTIVE",
            PortState::ActiveDefer => "PORT_ACTIVE_DEFER",
        }
    }
}

c_enum! {
    /// `enum ib_mtu`.
    pub enum Mtu: u8 {
        /// 256 bytes.
        Mtu256 = 1 => "IB_MTU_256",
        /// 512 bytes.
        Mtu512 = 2 => "IB_MTU_512",
        /// 1024 bytes.
        Mtu1024 = 3 => "IB_MTU_1024",
        /// 2048 bytes.
        Mtu2048 = 4 => "IB_MTU_2048",
        /// 4096 bytes.
        Mtu4096 = 5 => "IB_MTU_4096",
    }
}

impl Mtu {
    /// `ib_mtu_enum_to_int`.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

c_enum! {
    /// `enum ib_rate` (static rate of an address vector).
    pub enum Rate: u8 {
        /// The port's current rate.
        PortCurrent = 0 => "IB_RATE_PORT_CURRENT",
        /// 2.5 Gb/s.
        Rate2_5 = 2 => "IB_RATE_2_5_GBPS",
        /// 5 Gb/s.
        Rate5 = 5 => "IB_RATE_5_GBPS",
        /// 10 Gb/s.
        Rate10 = 3 => "IB_RATE_10_GBPS",
        /// 20 Gb/s.
        Rate20 = 6 => "IB_RATE_20_GBPS",
        /// 30 Gb/s.
        Rate30 = 4 => "IB_RATE_30_GBPS",
        /// 40 Gb/s.
        Rate40 = 7 => "IB_RATE_40_GBPS",
        /// 60 Gb/s.
        Rate60 = 8 => "IB_RATE_60_GBPS",
        /// 80 Gb/s.
        Rate80 = 9 => "IB_RATE_80_GBPS",
        /// 120 Gb/s.
        Rate120 = 10 => "IB_RATE_120_GBPS",
        /// 14 Gb/s.
        Rate14 = 11 => "IB_RATE_14_GBPS",
        /// 56 Gb/s.
        Rate56 = 12 => "IB_RATE_56_GBPS",
        /// 112 Gb/s.
        Rate112 = 13 => "IB_RATE_112_GBPS",
        /// 168 Gb/s.
        Rate168 = 14 => "IB_RATE_168_GBPS",
        /// 25 Gb/s.
        Rate25 = 15 => "IB_RATE_25_GBPS",
        /// 100 Gb/s.
        Rate100 = 16 => "IB_RATE_100_GBPS",
        /// 200 Gb/s.
        Rate200 = 17 => "IB_RATE_200_GBPS",
        /// 300 Gb/s.
        Rate300 = 18 => "IB_RATE_300_GBPS",
    }
}

impl Rate {
    /// `ib_rate_to_mult`: multiple of 2.5 Gb/s, -1 for an unknown rate.
    pub const fn to_mult(self) -> i32 {
        match self {
            Rate::Rate2_5 => 1,
            Rate::Rate5 => 2,
            Rate::Rate10 => 4,
            Rate::Rate20 => 8,
            Rate::Rate30 => 12,
            Rate::Rate40 => 16,
            Rate::Rate60 => 24,
            Rate::Rate80 => 32,
            Rate::Rate120 => 48,
            _ => -1,
        }
    }
}

/// `enum ib_port_width` values (PortInfo LinkWidthActive).
pub mod width {
    /// 1x.
    pub const IB_WIDTH_1X: u8 = 1;
    /// 4x.
    pub const IB_WIDTH_4X: u8 = 2;
    /// 8x.
    pub const IB_WIDTH_8X: u8 = 4;
    /// 12x.
    pub const IB_WIDTH_12X: u8 = 8;
}

/// `enum ib_port_speed` values (active_speed).
pub mod speed {
    /// 2.5 Gb/s per lane.
    pub const IB_SPEED_SDR: u8 = 1;
    /// 5 Gb/s.
    pub const IB_SPEED_DDR: u8 = 2;
    /// 10 Gb/s.
    pub const IB_SPEED_QDR: u8 = 4;
    /// 10.3125 Gb/s (64/66).
    pub const IB_SPEED_FDR10: u8 = 8;
    /// 14.0625 Gb/s.
    pub const IB_SPEED_FDR: u8 = 16;
    /// 25.78125 Gb/s.
    pub const IB_SPEED_EDR: u8 = 32;
}

/// `ib_width_enum_to_int`: lanes of an [`width`] value, `None` if unknown.
#[doc(alias = "ib_width_enum_to_int")]
pub const fn width_enum_to_int(w: u8) -> Option<u32> {
    match w {
        width::IB_WIDTH_1X => Some(1),
        width::IB_WIDTH_4X => Some(4),
        width::IB_WIDTH_8X => Some(8),
        width::IB_WIDTH_12X => Some(12),
        _ => None,
    }
}

/// A port's rate as Linux's sysfs `rate` file words it ("40 Gb/sec (4X
/// QDR)", "2.5 Gb/sec (1X)"), which is what `ibstat` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRate {
    /// Tenths of Gb/s.
    pub tenths_gbps: u32,
    /// Lanes.
    pub lanes: u32,
    /// " QDR", " FDR", ... or "" for SDR.
    pub speed: &'static str,
}

impl PortRate {
    /// Linux `rate_show` (sysfs.c): unknown speeds count as SDR, an unknown
    /// width is `None`.
    pub const fn from_port(active_width: u8, active_speed: u8) -> Option<PortRate> {
        let (per_lane, name) = match active_speed {
            speed::IB_SPEED_DDR => (50, " DDR"),
            speed::IB_SPEED_QDR => (100, " QDR"),
            speed::IB_SPEED_FDR10 => (100, " FDR10"),
            speed::IB_SPEED_FDR => (140, " FDR"),
            speed::IB_SPEED_EDR => (250, " EDR"),
            _ => (25, ""),
        };
        match width_enum_to_int(active_width) {
            Some(lanes) => Some(PortRate {
                tenths_gbps: per_lane * lanes,
                lanes,
                speed: name,
            }),
            None => None,
        }
    }
    /// Whole Gb/s (`ibstat`'s "Rate: 40").
    pub const fn gbps(&self) -> u32 {
        self.tenths_gbps / 10
    }
}

impl fmt::Display for PortRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{} Gb/sec ({}X{})",
            self.tenths_gbps / 10,
            if !self.tenths_gbps.is_multiple_of(10) {
                ".5"
            } else {
                ""
            },
            self.lanes,
            self.speed
        )
    }
}

/// PortPhysicalState as sysfs `phys_state` and `ibstat` word it.
pub const fn phys_state_str(phys_state: u8) -> &'static str {
    match phys_state {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "Phy Test",
        _ => "<unknown>",
    }
}

c_flags! {
    /// `enum ib_port_cap_flags` (PortInfo CapabilityMask).
    pub struct PortCapFlags: u32 {
        /// This port is the SM.
        const SM = 1 << 1 => "IB_PORT_SM";
        /// Notices supported.
        const NOTICE_SUP = 1 << 2 => "IB_PORT_NOTICE_SUP";
        /// Traps supported.
        const TRAP_SUP = 1 << 3 => "IB_PORT_TRAP_SUP";
        /// Optional IPD supported.
        const OPT_IPD_SUP = 1 << 4 => "IB_PORT_OPT_IPD_SUP";
        /// Automatic migration supported.
        const AUTO_MIGR_SUP = 1 << 5 => "IB_PORT_AUTO_MIGR_SUP";
        /// SL mapping supported.
        const SL_MAP_SUP = 1 << 6 => "IB_PORT_SL_MAP_SUP";
        /// M_Key NVRAM.
        const MKEY_NVRAM = 1 << 7 => "IB_PORT_MKEY_NVRAM";
        /// P_Key NVRAM.
        const PKEY_NVRAM = 1 << 8 => "IB_PORT_PKEY_NVRAM";
        /// LED info supported.
        const LED_INFO_SUP = 1 << 9 => "IB_PORT_LED_INFO_SUP";
        /// SM is disabled.
        const SM_DISABLED = 1 << 10 => "IB_PORT_SM_DISABLED";
        /// System image GUID supported.
        const SYS_IMAGE_GUID_SUP = 1 << 11 => "IB_PORT_SYS_IMAGE_GUID_SUP";
        /// P_Key switch external port trap supported.
        const PKEY_SW_EXT_PORT_TRAP_SUP = 1 << 12 => "IB_PORT_PKEY_SW_EXT_PORT_TRAP_SUP";
        /// Extended speeds supported.
        const EXTENDED_SPEEDS_SUP = 1 << 14 => "IB_PORT_EXTENDED_SPEEDS_SUP";
        /// Communication management supported.
        const CM_SUP = 1 << 16 => "IB_PORT_CM_SUP";
        /// SNMP tunnelling supported.
        const SNMP_TUNNEL_SUP = 1 << 17 => "IB_PORT_SNMP_TUNNEL_SUP";
        /// Reinit supported.
        const REINIT_SUP = 1 << 18 => "IB_PORT_REINIT_SUP";
        /// Device management supported.
        const DEVICE_MGMT_SUP = 1 << 19 => "IB_PORT_DEVICE_MGMT_SUP";
        /// Vendor class supported.
        const VENDOR_CLASS_SUP = 1 << 20 => "IB_PORT_VENDOR_CLASS_SUP";
        /// DR notice supported.
        const DR_NOTICE_SUP = 1 << 21 => "IB_PORT_DR_NOTICE_SUP";
        /// Capability mask notice supported.
        const CAP_MASK_NOTICE_SUP = 1 << 22 => "IB_PORT_CAP_MASK_NOTICE_SUP";
        /// Boot management supported.
        const BOOT_MGMT_SUP = 1 << 23 => "IB_PORT_BOOT_MGMT_SUP";
        /// Link latency supported.
        const LINK_LATENCY_SUP = 1 << 24 => "IB_PORT_LINK_LATENCY_SUP";
        /// Client reregistration supported.
        const CLIENT_REG_SUP = 1 << 25 => "IB_PORT_CLIENT_REG_SUP";
    }
}

c_flags! {
    /// `enum ib_device_cap_flags`.
    pub struct DeviceCapFlags: u32 {
        /// Resize max WR.
        const RESIZE_MAX_WR = 1 => "IB_DEVICE_RESIZE_MAX_WR";
        /// Bad P_Key counter.
        const BAD_PKEY_CNTR = 1 << 1 => "IB_DEVICE_BAD_PKEY_CNTR";
        /// Bad Q_Key counter.
        const BAD_QKEY_CNTR = 1 << 2 => "IB_DEVICE_BAD_QKEY_CNTR";
        /// Raw multicast.
        const RAW_MULTI = 1 << 3 => "IB_DEVICE_RAW_MULTI";
        /// Automatic path migration.
        const AUTO_PATH_MIG = 1 << 4 => "IB_DEVICE_AUTO_PATH_MIG";
        /// Change physical port.
        const CHANGE_PHY_PORT = 1 << 5 => "IB_DEVICE_CHANGE_PHY_PORT";
        /// UD AV port enforcement.
        const UD_AV_PORT_ENFORCE = 1 << 6 => "IB_DEVICE_UD_AV_PORT_ENFORCE";
        /// Current QP state modification.
        const CURR_QP_STATE_MOD = 1 << 7 => "IB_DEVICE_CURR_QP_STATE_MOD";
        /// Shutdown port.
        const SHUTDOWN_PORT = 1 << 8 => "IB_DEVICE_SHUTDOWN_PORT";
        /// Init type.
        const INIT_TYPE = 1 << 9 => "IB_DEVICE_INIT_TYPE";
        /// Port active event.
        const PORT_ACTIVE_EVENT = 1 << 10 => "IB_DEVICE_PORT_ACTIVE_EVENT";
        /// System image GUID.
        const SYS_IMAGE_GUID = 1 << 11 => "IB_DEVICE_SYS_IMAGE_GUID";
        /// RC RNR NAK generation.
        const RC_RNR_NAK_GEN = 1 << 12 => "IB_DEVICE_RC_RNR_NAK_GEN";
        /// SRQ resize.
        const SRQ_RESIZE = 1 << 13 => "IB_DEVICE_SRQ_RESIZE";
        /// N-notify CQ.
        const N_NOTIFY_CQ = 1 << 14 => "IB_DEVICE_N_NOTIFY_CQ";
        /// Local DMA L_Key.
        const LOCAL_DMA_LKEY = 1 << 15 => "IB_DEVICE_LOCAL_DMA_LKEY";
        /// Reserved.
        const RESERVED = 1 << 16 => "IB_DEVICE_RESERVED";
        /// Memory windows.
        const MEM_WINDOW = 1 << 17 => "IB_DEVICE_MEM_WINDOW";
        /// UD IP checksum.
        const UD_IP_CSUM = 1 << 18 => "IB_DEVICE_UD_IP_CSUM";
        /// UD TSO.
        const UD_TSO = 1 << 19 => "IB_DEVICE_UD_TSO";
        /// XRC.
        const XRC = 1 << 20 => "IB_DEVICE_XRC";
        /// Memory management extensions.
        const MEM_MGT_EXTENSIONS = 1 << 21 => "IB_DEVICE_MEM_MGT_EXTENSIONS";
        /// Block multicast loopback.
        const BLOCK_MULTICAST_LOOPBACK = 1 << 22 => "IB_DEVICE_BLOCK_MULTICAST_LOOPBACK";
        /// Type 2A memory windows.
        const MEM_WINDOW_TYPE_2A = 1 << 23 => "IB_DEVICE_MEM_WINDOW_TYPE_2A";
        /// Type 2B memory windows.
        const MEM_WINDOW_TYPE_2B = 1 << 24 => "IB_DEVICE_MEM_WINDOW_TYPE_2B";
        /// Managed flow steering.
        const MANAGED_FLOW_STEERING = 1 << 29 => "IB_DEVICE_MANAGED_FLOW_STEERING";
    }
}

c_enum! {
    /// `enum ib_atomic_cap`.
    pub enum AtomicCap: u8 {
        /// No atomics.
        None = 0 => "IB_ATOMIC_NONE",
        /// Atomic within this HCA.
        Hca = 1 => "IB_ATOMIC_HCA",
        /// Atomic with respect to all agents.
        Glob = 2 => "IB_ATOMIC_GLOB",
    }
}

/// `union ib_gid`: 16 bytes, network order (subnet prefix, then interface
/// GUID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// A GID from its subnet prefix and interface ID (host-order values).
    pub const fn new(subnet_prefix: u64, interface_id: u64) -> Gid {
        let p = subnet_prefix.to_be_bytes();
        let i = interface_id.to_be_bytes();
        Gid([
            p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], i[0], i[1], i[2], i[3], i[4], i[5],
            i[6], i[7],
        ])
    }
    /// The subnet prefix.
    pub fn subnet_prefix(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(b)
    }
    /// The interface ID (port GUID).
    pub fn interface_id(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(b)
    }
}

impl fmt::Display for Gid {
    /// `fe80:0000:0000:0000:0002:c903:0000:0001`, as `ibv_devinfo -v` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for i in 0..8 {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", self.0[2 * i], self.0[2 * i + 1])?;
        }
        Ok(())
    }
}

/// The default P_Key (full membership).
pub const IB_DEFAULT_PKEY_FULL: u16 = 0xffff;
/// The permissive LID.
pub const IB_LID_PERMISSIVE: u16 = 0xffff;
/// The well-known Q_Key of QP1 (GSI).
pub const IB_QP1_QKEY: u32 = 0x8001_0000;
/// Q_Key bit 31: "controlled" Q_Keys; a send with it set uses the QP's own.
pub const IB_QP_SET_QKEY: u32 = 0x8000_0000;

/// `struct ib_device_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct DeviceAttr {
    pub fw_ver: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub device_cap_flags: DeviceCapFlags,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_ee_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_ee_init_rd_atom: u32,
    pub atomic_cap: u8,
    pub masked_atomic_cap: u8,
    pub max_ee: u32,
    pub max_rdd: u32,
    pub max_mw: u32,
    pub max_raw_ipv6_qp: u32,
    pub max_raw_ethy_qp: u32,
    pub max_mcast_grp: u32,
    pub max_mcast_qp_attach: u32,
    pub max_total_mcast_qp_attach: u32,
    pub max_ah: u32,
    pub max_fmr: u32,
    pub max_map_per_fmr: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_fast_reg_page_list_len: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
}

/// `struct ib_port_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct PortAttr {
    pub state: PortState,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub port_cap_flags: PortCapFlags,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    /// `ib_port_width` value ([`width`]).
    pub active_width: u8,
    /// `ib_port_speed` value ([`speed`]).
    pub active_speed: u8,
    /// PortPhysicalState (5 = LinkUp).
    pub phys_state: u8,
}

impl Default for PortAttr {
    fn default() -> Self {
        PortAttr {
            state: PortState::Down,
            max_mtu: Mtu::Mtu2048,
            active_mtu: Mtu::Mtu256,
            gid_tbl_len: 0,
            port_cap_flags: PortCapFlags::empty(),
            max_msg_sz: 0,
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
            pkey_tbl_len: 0,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_vl_num: 0,
            sm_sl: 0,
            subnet_timeout: 0,
            init_type_reply: 0,
            active_width: 0,
            active_speed: 0,
            phys_state: 0,
        }
    }
}

c_flags! {
    /// `enum ib_port_modify_flags`.
    pub struct PortModifyFlags: u32 {
        /// Shut the port down.
        const SHUTDOWN = 1 => "IB_PORT_SHUTDOWN";
        /// Set init_type.
        const INIT_TYPE = 1 << 2 => "IB_PORT_INIT_TYPE";
        /// Reset the Q_Key violation counter.
        const RESET_QKEY_CNTR = 1 << 3 => "IB_PORT_RESET_QKEY_CNTR";
    }
}

/// `struct ib_port_modify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortModify {
    /// Capability bits to set.
    pub set_port_cap_mask: u32,
    /// Capability bits to clear.
    pub clr_port_cap_mask: u32,
    /// Init type.
    pub init_type: u8,
}

// ---------------------------------------------------------------------------
// Events

c_enum! {
    /// `enum ib_event_type`.
    pub enum EventType: u8 {
        /// CQ error.
        CqErr = 0 => "IB_EVENT_CQ_ERR",
        /// QP fatal.
        QpFatal = 1 => "IB_EVENT_QP_FATAL",
        /// QP request error.
        QpReqErr = 2 => "IB_EVENT_QP_REQ_ERR",
        /// QP access error.
        QpAccessErr = 3 => "IB_EVENT_QP_ACCESS_ERR",
        /// Communication established.
        CommEst = 4 => "IB_EVENT_COMM_EST",
        /// SQ drained.
        SqDrained = 5 => "IB_EVENT_SQ_DRAINED",
        /// Path migrated.
        PathMig = 6 => "IB_EVENT_PATH_MIG",
        /// Path migration error.
        PathMigErr = 7 => "IB_EVENT_PATH_MIG_ERR",
        /// Device fatal (catastrophic error).
        DeviceFatal = 8 => "IB_EVENT_DEVICE_FATAL",
        /// Port became active.
        PortActive = 9 => "IB_EVENT_PORT_ACTIVE",
        /// Port went down.
        PortErr = 10 => "IB_EVENT_PORT_ERR",
        /// LID changed.
        LidChange = 11 => "IB_EVENT_LID_CHANGE",
        /// P_Key table changed.
        PkeyChange = 12 => "IB_EVENT_PKEY_CHANGE",
        /// SM changed.
        SmChange = 13 => "IB_EVENT_SM_CHANGE",
        /// SRQ error.
        SrqErr = 14 => "IB_EVENT_SRQ_ERR",
        /// SRQ limit reached.
        SrqLimitReached = 15 => "IB_EVENT_SRQ_LIMIT_REACHED",
        /// Last WQE reached.
        QpLastWqeReached = 16 => "IB_EVENT_QP_LAST_WQE_REACHED",
        /// The SM asks clients to re-register.
        ClientReregister = 17 => "IB_EVENT_CLIENT_REREGISTER",
        /// GID table changed.
        GidChange = 18 => "IB_EVENT_GID_CHANGE",
    }
}

/// What an event is about (`ib_event.element`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventElement {
    /// The whole device.
    Device,
    /// A port (1-based).
    Port(u8),
    /// A QP.
    Qp(Qp),
    /// A CQ.
    Cq(Cq),
    /// An SRQ.
    Srq(Srq),
}

/// `struct ib_event` (the device is implied by who dispatches it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub event: EventType,
    /// To what.
    pub element: EventElement,
}

impl Event {
    /// A port event.
    pub const fn port(event: EventType, port: u8) -> Event {
        Event {
            event,
            element: EventElement::Port(port),
        }
    }
}

// ---------------------------------------------------------------------------
// Handles

macro_rules! handle {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);
    };
}

handle!(
    /// A protection domain (`struct ib_pd`), chosen by the provider.
    Pd
);
handle!(
    /// A completion queue (`struct ib_cq`), chosen by the provider.
    Cq
);
handle!(
    /// A shared receive queue (`struct ib_srq`), chosen by the provider.
    Srq
);
handle!(
    /// An address handle (`struct ib_ah`), chosen by the provider.
    Ah
);

/// A queue pair (`struct ib_qp`): the provider's handle and the QP number the
/// verbs report (0 and 1 for the special QPs, whatever QPN the hardware uses
/// for them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Qp {
    /// The provider's handle.
    pub handle: u32,
    /// `ib_qp.qp_num`.
    pub qp_num: u32,
}

/// A memory region (`struct ib_mr`): the provider's handle and its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mr {
    /// The provider's handle.
    pub handle: u32,
    /// Local key, for SGEs.
    pub lkey: u32,
    /// Remote key, for RDMA by peers (meaningful only with remote access).
    pub rkey: u32,
}

// ---------------------------------------------------------------------------
// Memory regions

c_flags! {
    /// `enum ib_access_flags`.
    pub struct AccessFlags: u32 {
        /// The HCA may write locally (receives, RDMA READ responses).
        const LOCAL_WRITE = 1 => "IB_ACCESS_LOCAL_WRITE";
        /// Peers may RDMA WRITE.
        const REMOTE_WRITE = 1 << 1 => "IB_ACCESS_REMOTE_WRITE";
        /// Peers may RDMA READ.
        const REMOTE_READ = 1 << 2 => "IB_ACCESS_REMOTE_READ";
        /// Peers may do atomics.
        const REMOTE_ATOMIC = 1 << 3 => "IB_ACCESS_REMOTE_ATOMIC";
        /// Memory windows may be bound.
        const MW_BIND = 1 << 4 => "IB_ACCESS_MW_BIND";
    }
}

/// A region described by a list of pages of one size (the `reg_phys_mr` /
/// MTT path): the pages' bus addresses in order, mapped at `iova`.
#[derive(Debug, Clone, Copy)]
pub struct MrPages<'a> {
    /// Bus address of each page, `1 << page_shift` aligned.
    pub pages: &'a [u64],
    /// log2 of the page size (12 for 4 KiB).
    pub page_shift: u8,
    /// The virtual address the region starts at (offset into the first page
    /// is `iova & (page_size - 1)`).
    pub iova: u64,
    /// Length in bytes.
    pub length: u64,
    /// Access rights.
    pub access: AccessFlags,
}

// ---------------------------------------------------------------------------
// Address handles

/// `struct ib_global_route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GlobalRoute {
    /// Destination GID.
    pub dgid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Index of the source GID in the port's table.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// `struct ib_ah_attr`; `grh` is `Some` where Linux sets `IB_AH_GRH` in
/// `ah_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhAttr {
    /// Global route header, if any.
    pub grh: Option<GlobalRoute>,
    /// Destination LID.
    pub dlid: u16,
    /// Service level (4 bits).
    pub sl: u8,
    /// Source path bits (the low LMC bits of the source LID).
    pub src_path_bits: u8,
    /// `ib_rate` raw value ([`Rate`]).
    pub static_rate: u8,
    /// Port (1-based).
    pub port_num: u8,
}

/// `IB_AH_GRH`.
pub const IB_AH_GRH: u8 = 1;

// ---------------------------------------------------------------------------
// CQs

/// `struct ib_cq_init_attr` (3.11 passes `cqe` and `comp_vector` directly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CqInitAttr {
    /// Minimum number of entries.
    pub cqe: u32,
    /// Completion vector (EQ) to report on.
    pub comp_vector: u32,
}

c_flags! {
    /// `enum ib_cq_notify_flags`.
    pub struct CqNotifyFlags: u32 {
        /// Next solicited completion.
        const SOLICITED = 1 => "IB_CQ_SOLICITED";
        /// Next completion.
        const NEXT_COMP = 2 => "IB_CQ_NEXT_COMP";
        /// Report whether completions were missed.
        const REPORT_MISSED_EVENTS = 4 => "IB_CQ_REPORT_MISSED_EVENTS";
    }
}

// ---------------------------------------------------------------------------
// Work completions

c_enum! {
    /// `enum ib_wc_status`.
    pub enum WcStatus: u8 {
        /// Success.
        Success = 0 => "IB_WC_SUCCESS",
        /// Local length error.
        LocLenErr = 1 => "IB_WC_LOC_LEN_ERR",
        /// Local QP operation error.
        LocQpOpErr = 2 => "IB_WC_LOC_QP_OP_ERR",
        /// Local EE context operation error.
        LocEecOpErr = 3 => "IB_WC_LOC_EEC_OP_ERR",
        /// Local protection error.
        LocProtErr = 4 => "IB_WC_LOC_PROT_ERR",
        /// WR flushed.
        WrFlushErr = 5 => "IB_WC_WR_FLUSH_ERR",
        /// Memory window bind error.
        MwBindErr = 6 => "IB_WC_MW_BIND_ERR",
        /// Bad response.
        BadRespErr = 7 => "IB_WC_BAD_RESP_ERR",
        /// Local access error.
        LocAccessErr = 8 => "IB_WC_LOC_ACCESS_ERR",
        /// Remote invalid request.
        RemInvReqErr = 9 => "IB_WC_REM_INV_REQ_ERR",
        /// Remote access error.
        RemAccessErr = 10 => "IB_WC_REM_ACCESS_ERR",
        /// Remote operation error.
        RemOpErr = 11 => "IB_WC_REM_OP_ERR",
        /// Transport retry counter exceeded.
        RetryExcErr = 12 => "IB_WC_RETRY_EXC_ERR",
        /// RNR retry counter exceeded.
        RnrRetryExcErr = 13 => "IB_WC_RNR_RETRY_EXC_ERR",
        /// Local RDD violation.
        LocRddViolErr = 14 => "IB_WC_LOC_RDD_VIOL_ERR",
        /// Remote invalid RD request.
        RemInvRdReqErr = 15 => "IB_WC_REM_INV_RD_REQ_ERR",
        /// Remote abort.
        RemAbortErr = 16 => "IB_WC_REM_ABORT_ERR",
        /// Invalid EE context number.
        InvEecnErr = 17 => "IB_WC_INV_EECN_ERR",
        /// Invalid EE context state.
        InvEecStateErr = 18 => "IB_WC_INV_EEC_STATE_ERR",
        /// Fatal error.
        FatalErr = 19 => "IB_WC_FATAL_ERR",
        /// Response timeout (MAD layer).
        RespTimeoutErr = 20 => "IB_WC_RESP_TIMEOUT_ERR",
        /// General error.
        GeneralErr = 21 => "IB_WC_GENERAL_ERR",
    }
}

impl WcStatus {
    /// `ib_wc_status_msg`: the words Linux and libibverbs print.
    pub const fn msg(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "WR flushed",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "operation aborted",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

c_enum! {
    /// `enum ib_wc_opcode`.
    pub enum WcOpcode: u8 {
        /// Send completed.
        Send = 0 => "IB_WC_SEND",
        /// RDMA WRITE completed.
        RdmaWrite = 1 => "IB_WC_RDMA_WRITE",
        /// RDMA READ completed.
        RdmaRead = 2 => "IB_WC_RDMA_READ",
        /// Compare and swap completed.
        CompSwap = 3 => "IB_WC_COMP_SWAP",
        /// Fetch and add completed.
        FetchAdd = 4 => "IB_WC_FETCH_ADD",
        /// Memory window bind completed.
        BindMw = 5 => "IB_WC_BIND_MW",
        /// LSO send completed.
        Lso = 6 => "IB_WC_LSO",
        /// Local invalidate completed.
        LocalInv = 7 => "IB_WC_LOCAL_INV",
        /// Fast register completed.
        FastRegMr = 8 => "IB_WC_FAST_REG_MR",
        /// Masked compare and swap.
        MaskedCompSwap = 9 => "IB_WC_MASKED_COMP_SWAP",
        /// Masked fetch and add.
        MaskedFetchAdd = 10 => "IB_WC_MASKED_FETCH_ADD",
        /// A receive (send from the peer).
        Recv = 128 => "IB_WC_RECV",
        /// A receive consumed by an RDMA WRITE with immediate.
        RecvRdmaWithImm = 129 => "IB_WC_RECV_RDMA_WITH_IMM",
    }
}

c_flags! {
    /// `enum ib_wc_flags`.
    pub struct WcFlags: u32 {
        /// A GRH is in the first 40 bytes of the receive buffer.
        const GRH = 1 => "IB_WC_GRH";
        /// `imm_data` is valid.
        const WITH_IMM = 1 << 1 => "IB_WC_WITH_IMM";
        /// `invalidate_rkey` is valid.
        const WITH_INVALIDATE = 1 << 2 => "IB_WC_WITH_INVALIDATE";
        /// IP checksum verified.
        const IP_CSUM_OK = 1 << 3 => "IB_WC_IP_CSUM_OK";
    }
}

/// `struct ib_wc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (valid for errors only on some devices, as in Linux).
    pub opcode: WcOpcode,
    /// Vendor error syndrome (errors only).
    pub vendor_err: u32,
    /// Bytes received. On UD QPs and the special QPs it counts the 40-byte
    /// GRH area at the front of the buffer whether or not a GRH arrived (as
    /// IPoIB's `skb_pull(IB_GRH_BYTES)` relies on), so a MAD is 296.
    pub byte_len: u32,
    /// `ib_qp.qp_num` of the QP this completion belongs to (0/1 for the
    /// special QPs).
    pub qp_num: u32,
    /// Immediate data, in the wire's big-endian order read as a `u32`
    /// (Linux's `__be32 imm_data` converted with `be32_to_cpu`).
    pub imm_data: u32,
    /// Source QP (UD receives).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (UD/GSI receives).
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
    /// Port (special QPs on a multi-port device).
    pub port_num: u8,
}

impl Default for Wc {
    fn default() -> Self {
        Wc {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            vendor_err: 0,
            byte_len: 0,
            qp_num: 0,
            imm_data: 0,
            src_qp: 0,
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
            port_num: 0,
        }
    }
}

// ---------------------------------------------------------------------------
// Work requests

/// `struct ib_sge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Bus address (or IOVA inside the MR).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR that covers it.
    pub lkey: u32,
}

c_enum! {
    /// `enum ib_wr_opcode`.
    pub enum WrOpcode: u8 {
        /// RDMA WRITE.
        RdmaWrite = 0 => "IB_WR_RDMA_WRITE",
        /// RDMA WRITE with immediate.
        RdmaWriteWithImm = 1 => "IB_WR_RDMA_WRITE_WITH_IMM",
        /// SEND.
        Send = 2 => "IB_WR_SEND",
        /// SEND with immediate.
        SendWithImm = 3 => "IB_WR_SEND_WITH_IMM",
        /// RDMA READ.
        RdmaRead = 4 => "IB_WR_RDMA_READ",
        /// Atomic compare and swap.
        AtomicCmpAndSwp = 5 => "IB_WR_ATOMIC_CMP_AND_SWP",
        /// Atomic fetch and add.
        AtomicFetchAndAdd = 6 => "IB_WR_ATOMIC_FETCH_AND_ADD",
        /// SEND with invalidate (the rkey to invalidate in `imm_data`, as
        /// Linux's `ex.invalidate_rkey`). 8 in the kernel's enum; libibverbs
        /// numbers it 9.
        SendWithInv = 8 => "IB_WR_SEND_WITH_INV",
        /// Masked compare and swap (`wr.atomic` with both masks).
        MaskedAtomicCmpAndSwp = 12 => "IB_WR_MASKED_ATOMIC_CMP_AND_SWP",
        /// Masked fetch and add (`wr.atomic`; `compare_add_mask` marks the
        /// bits where a carry stops).
        MaskedAtomicFetchAndAdd = 13 => "IB_WR_MASKED_ATOMIC_FETCH_AND_ADD",
    }
}

c_flags! {
    /// `enum ib_send_flags`.
    pub struct SendFlags: u32 {
        /// Wait for prior RDMA READs/atomics.
        const FENCE = 1 => "IB_SEND_FENCE";
        /// Generate a completion.
        const SIGNALED = 1 << 1 => "IB_SEND_SIGNALED";
        /// Set the solicited event bit.
        const SOLICITED = 1 << 2 => "IB_SEND_SOLICITED";
        /// Copy the data into the WQE.
        const INLINE = 1 << 3 => "IB_SEND_INLINE";
        /// IP checksum offload.
        const IP_CSUM = 1 << 4 => "IB_SEND_IP_CSUM";
    }
}

/// The per-opcode part of `struct ib_send_wr` (its `wr` union).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WrDetail {
    /// Nothing (SEND on a connected QP).
    #[default]
    None,
    /// `wr.rdma`.
    Rdma {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `wr.atomic`.
    Atomic {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Compare value (CMP_AND_SWP) or addend (FETCH_AND_ADD).
        compare_add: u64,
        /// Swap value (CMP_AND_SWP).
        swap: u64,
        /// Mask of `compare_add` (the masked atomics only).
        compare_add_mask: u64,
        /// Mask of `swap` (masked CMP_AND_SWP only).
        swap_mask: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `wr.ud`.
    Ud {
        /// Address handle.
        ah: Ah,
        /// Destination QPN.
        remote_qpn: u32,
        /// Q_Key (bit 31 set: use the QP's own).
        remote_qkey: u32,
        /// P_Key index (GSI only).
        pkey_index: u16,
        /// Port (SMI on switches only).
        port_num: u8,
    },
}

/// `struct ib_send_wr` (a slice element instead of a `next` list).
///
/// Build it with `..SendWr::default()` so fields added later do not break
/// the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Gather list (ignored with [`SendFlags::INLINE`]).
    pub sg_list: &'a [Sge],
    /// Operation.
    pub opcode: WrOpcode,
    /// Flags.
    pub send_flags: SendFlags,
    /// Immediate data (`*_WITH_IMM`, wire order read as a `u32`) or the
    /// rkey to invalidate (SEND_WITH_INV): Linux's `ex` union.
    pub imm_data: u32,
    /// Per-opcode fields.
    pub wr: WrDetail,
    /// The payload of an [`SendFlags::INLINE`] send, copied into the WQE.
    /// Linux reads it through the SGEs' kernel virtual addresses; a safe
    /// port hands over the bytes themselves (and the provider refuses more
    /// than its `max_inline_data`, and the flag with a gather list but no
    /// bytes: it cannot read them through bus addresses).
    pub inline_data: &'a [u8],
}

impl Default for SendWr<'_> {
    fn default() -> Self {
        SendWr {
            wr_id: 0,
            sg_list: &[],
            opcode: WrOpcode::Send,
            send_flags: SendFlags::empty(),
            imm_data: 0,
            wr: WrDetail::None,
            inline_data: &[],
        }
    }
}

/// `struct ib_recv_wr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sg_list: &'a [Sge],
}

// ---------------------------------------------------------------------------
// SRQs

/// `struct ib_srq_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Receive WRs.
    pub max_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// Arm limit: an `IB_EVENT_SRQ_LIMIT_REACHED` when fewer WRs remain.
    pub srq_limit: u32,
}

c_flags! {
    /// `enum ib_srq_attr_mask`.
    pub struct SrqAttrMask: u32 {
        /// Resize.
        const MAX_WR = 1 => "IB_SRQ_MAX_WR";
        /// Arm the limit.
        const LIMIT = 1 << 1 => "IB_SRQ_LIMIT";
    }
}

/// `struct ib_srq_init_attr` (basic SRQs only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqInitAttr {
    /// Sizes and limit.
    pub attr: SrqAttr,
}

// ---------------------------------------------------------------------------
// QPs

c_enum! {
    /// `enum ib_qp_type` (the types this port supports).
    pub enum QpType: u8 {
        /// QP0, subnet management.
        Smi = 0 => "IB_QPT_SMI",
        /// QP1, general services.
        Gsi = 1 => "IB_QPT_GSI",
        /// Reliable connected.
        Rc = 2 => "IB_QPT_RC",
        /// Unreliable connected.
        Uc = 3 => "IB_QPT_UC",
        /// Unreliable datagram.
        Ud = 4 => "IB_QPT_UD",
    }
}

c_enum! {
    /// `enum ib_qp_state`.
    pub enum QpState: u8 {
        /// Reset.
        Reset = 0 => "IB_QPS_RESET",
        /// Initialized.
        Init = 1 => "IB_QPS_INIT",
        /// Ready to receive.
        Rtr = 2 => "IB_QPS_RTR",
        /// Ready to send.
        Rts = 3 => "IB_QPS_RTS",
        /// Send queue drain.
        Sqd = 4 => "IB_QPS_SQD",
        /// Send queue error.
        Sqe = 5 => "IB_QPS_SQE",
        /// Error.
        Err = 6 => "IB_QPS_ERR",
    }
}

c_enum! {
    /// `enum ib_mig_state`.
    pub enum MigState: u8 {
        /// Migrated.
        Migrated = 0 => "IB_MIG_MIGRATED",
        /// Rearm.
        Rearm = 1 => "IB_MIG_REARM",
        /// Armed.
        Armed = 2 => "IB_MIG_ARMED",
    }
}

c_enum! {
    /// `enum ib_sig_type`.
    pub enum SigType: u8 {
        /// Every send WR generates a completion.
        AllWr = 0 => "IB_SIGNAL_ALL_WR",
        /// Only WRs with `IB_SEND_SIGNALED`.
        ReqWr = 1 => "IB_SIGNAL_REQ_WR",
    }
}

c_flags! {
    /// `enum ib_qp_attr_mask`.
    pub struct QpAttrMask: u32 {
        /// `qp_state`.
        const STATE = 1 => "IB_QP_STATE";
        /// `cur_qp_state`.
        const CUR_STATE = 1 << 1 => "IB_QP_CUR_STATE";
        /// `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2 => "IB_QP_EN_SQD_ASYNC_NOTIFY";
        /// `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3 => "IB_QP_ACCESS_FLAGS";
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4 => "IB_QP_PKEY_INDEX";
        /// `port_num`.
        const PORT = 1 << 5 => "IB_QP_PORT";
        /// `qkey`.
        const QKEY = 1 << 6 => "IB_QP_QKEY";
        /// `ah_attr`.
        const AV = 1 << 7 => "IB_QP_AV";
        /// `path_mtu`.
        const PATH_MTU = 1 << 8 => "IB_QP_PATH_MTU";
        /// `timeout`.
        const TIMEOUT = 1 << 9 => "IB_QP_TIMEOUT";
        /// `retry_cnt`.
        const RETRY_CNT = 1 << 10 => "IB_QP_RETRY_CNT";
        /// `rnr_retry`.
        const RNR_RETRY = 1 << 11 => "IB_QP_RNR_RETRY";
        /// `rq_psn`.
        const RQ_PSN = 1 << 12 => "IB_QP_RQ_PSN";
        /// `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = 1 << 13 => "IB_QP_MAX_QP_RD_ATOMIC";
        /// `alt_ah_attr` etc.
        const ALT_PATH = 1 << 14 => "IB_QP_ALT_PATH";
        /// `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15 => "IB_QP_MIN_RNR_TIMER";
        /// `sq_psn`.
        const SQ_PSN = 1 << 16 => "IB_QP_SQ_PSN";
        /// `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = 1 << 17 => "IB_QP_MAX_DEST_RD_ATOMIC";
        /// `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18 => "IB_QP_PATH_MIG_STATE";
        /// `cap`.
        const CAP = 1 << 19 => "IB_QP_CAP";
        /// `dest_qp_num`.
        const DEST_QPN = 1 << 20 => "IB_QP_DEST_QPN";
    }
}

/// `struct ib_qp_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Send WRs.
    pub max_send_wr: u32,
    /// Receive WRs.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

c_flags! {
    /// `enum ib_qp_create_flags`.
    pub struct QpCreateFlags: u32 {
        /// IPoIB LSO (not offered: the model and our ipoib keep LSO off).
        const IPOIB_UD_LSO = 1 => "IB_QP_CREATE_IPOIB_UD_LSO";
        /// The QP does not receive the multicast datagrams it sends itself
        /// (UD only; Linux's IPoIB asks for it).
        const BLOCK_MULTICAST_LOOPBACK = 1 << 1 => "IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK";
    }
}

/// `struct ib_qp_init_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    /// CQ for send completions.
    pub send_cq: Cq,
    /// CQ for receive completions.
    pub recv_cq: Cq,
    /// Shared receive queue, if any.
    pub srq: Option<Srq>,
    /// Requested sizes; the provider returns the actual ones.
    pub cap: QpCap,
    /// Signalling.
    pub sq_sig_type: SigType,
    /// Type.
    pub qp_type: QpType,
    /// Creation flags (`create_flags`).
    pub create_flags: QpCreateFlags,
    /// Port, for the special QPs.
    pub port_num: u8,
}

/// `struct ib_qp_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    pub path_mtu: Mtu,
    pub path_mig_state: MigState,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: AccessFlags,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub alt_ah_attr: AhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu256,
            path_mig_state: MigState::Migrated,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            cap: QpCap::default(),
            ah_attr: AhAttr::default(),
            alt_ah_attr: AhAttr::default(),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: 0,
            sq_draining: 0,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 0,
            alt_timeout: 0,
        }
    }
}

// ---------------------------------------------------------------------------
// ib_modify_qp_is_ok

/// One cell of the IBTA QP state table: is the transition allowed, and which
/// attributes it requires and accepts, per QP type.
#[derive(Clone, Copy)]
struct Transition {
    valid: bool,
    /// Indexed by `QpType as usize` (SMI, GSI, RC, UC, UD).
    req: [u32; 5],
    opt: [u32; 5],
}

const NONE: Transition = Transition {
    valid: false,
    req: [0; 5],
    opt: [0; 5],
};
const VALID: Transition = Transition {
    valid: true,
    req: [0; 5],
    opt: [0; 5],
};

const fn t(req: [QpAttrMask; 5], opt: [QpAttrMask; 5]) -> Transition {
    Transition {
        valid: true,
        req: [req[0].0, req[1].0, req[2].0, req[3].0, req[4].0],
        opt: [opt[0].0, opt[1].0, opt[2].0, opt[3].0, opt[4].0],
    }
}

/// Builds a mask from a list of flags (const context).
const fn m(flags: &[QpAttrMask]) -> QpAttrMask {
    let mut v = 0;
    let mut i = 0;
    while i < flags.len() {
        v |= flags[i].0;
        i += 1;
    }
    QpAttrMask(v)
}

const E: QpAttrMask = QpAttrMask(0);

use QpAttrMask as A;

/// Linux's `qp_state_table[cur][next]`, columns in [`QpType`] order (SMI,
/// GSI, RC, UC, UD).
const QP_STATE_TABLE: [[Transition; 7]; 7] = {
    let pk_qk = m(&[A::PKEY_INDEX, A::QKEY]);
    let cur_qk = m(&[A::CUR_STATE, A::QKEY]);
    let mut tab = [[NONE; 7]; 7];
    // RESET
    tab[0][0] = VALID;
    tab[0][1] = t(
        [
            pk_qk,
            pk_qk,
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            m(&[A::PKEY_INDEX, A::PORT, A::QKEY]),
        ],
        [E; 5],
    );
    // INIT
    tab[1][0] = VALID;
    tab[1][6] = VALID;
    tab[1][1] = t(
        [E; 5],
        [
            pk_qk,
            pk_qk,
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            m(&[A::PKEY_INDEX, A::PORT, A::QKEY]),
        ],
    );
    tab[1][2] = t(
        [
            E,
            E,
            m(&[
                A::AV,
                A::PATH_MTU,
                A::DEST_QPN,
                A::RQ_PSN,
                A::MAX_DEST_RD_ATOMIC,
                A::MIN_RNR_TIMER,
            ]),
            m(&[A::AV, A::PATH_MTU, A::DEST_QPN, A::RQ_PSN]),
            E,
        ],
        [
            pk_qk,
            pk_qk,
            m(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
            m(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
            pk_qk,
        ],
    );
    // RTR
    tab[2][0] = VALID;
    tab[2][6] = VALID;
    tab[2][3] = t(
        [
            A::SQ_PSN,
            A::SQ_PSN,
            m(&[
                A::TIMEOUT,
                A::RETRY_CNT,
                A::RNR_RETRY,
                A::SQ_PSN,
                A::MAX_QP_RD_ATOMIC,
            ]),
            A::SQ_PSN,
            A::SQ_PSN,
        ],
        [
            cur_qk,
            cur_qk,
            m(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::MIN_RNR_TIMER,
                A::PATH_MIG_STATE,
            ]),
            m(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PATH_MIG_STATE,
            ]),
            cur_qk,
        ],
    );
    // RTS
    tab[3][0] = VALID;
    tab[3][6] = VALID;
    tab[3][3] = t(
        [E; 5],
        [
            cur_qk,
            cur_qk,
            m(&[
                A::CUR_STATE,
                A::ACCESS_FLAGS,
                A::ALT_PATH,
                A::PATH_MIG_STATE,
                A::MIN_RNR_TIMER,
            ]),
            m(&[
                A::CUR_STATE,
                A::ACCESS_FLAGS,
                A::ALT_PATH,
                A::PATH_MIG_STATE,
            ]),
            cur_qk,
        ],
    );
    tab[3][4] = t([E; 5], [A::EN_SQD_ASYNC_NOTIFY; 5]);
    // SQD
    tab[4][0] = VALID;
    tab[4][6] = VALID;
    tab[4][3] = t(
        [E; 5],
        [
            cur_qk,
            cur_qk,
            m(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::MIN_RNR_TIMER,
                A::PATH_MIG_STATE,
            ]),
            m(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PATH_MIG_STATE,
            ]),
            cur_qk,
        ],
    );
    tab[4][4] = t(
        [E; 5],
        [
            pk_qk,
            pk_qk,
            m(&[
                A::PORT,
                A::AV,
                A::TIMEOUT,
                A::RETRY_CNT,
                A::RNR_RETRY,
                A::MAX_QP_RD_ATOMIC,
                A::MAX_DEST_RD_ATOMIC,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PKEY_INDEX,
                A::MIN_RNR_TIMER,
                A::PATH_MIG_STATE,
            ]),
            m(&[
                A::AV,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PKEY_INDEX,
                A::PATH_MIG_STATE,
            ]),
            pk_qk,
        ],
    );
    // SQE (no RC column in Linux's table: an RC QP never enters SQE)
    tab[5][0] = VALID;
    tab[5][6] = VALID;
    tab[5][3] = t(
        [E; 5],
        [
            cur_qk,
            cur_qk,
            E,
            m(&[A::CUR_STATE, A::ACCESS_FLAGS]),
            cur_qk,
        ],
    );
    // ERR
    tab[6][0] = VALID;
    tab[6][6] = VALID;
    tab
};

/// Linux `ib_modify_qp_is_ok`: checks a transition `cur -> next` of a QP of
/// `qp_type` with attribute mask `mask` against the IBTA state table. `mask`
/// must contain [`QpAttrMask::STATE`] for a state change (as Linux, a mask
/// without it means "stay in `cur`", i.e. `next == cur`). The error names the
/// transition and the missing or refused attributes.
#[doc(alias = "ib_modify_qp_is_ok")]
pub fn modify_qp_is_ok(
    cur: QpState,
    next: QpState,
    qp_type: QpType,
    mask: QpAttrMask,
) -> Result<()> {
    let cell = &QP_STATE_TABLE[cur as usize][next as usize];
    if mask.contains(QpAttrMask::CUR_STATE)
        && !matches!(
            cur,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    {
        return Err(Error::BadQpAttrMask {
            qp_type,
            cur,
            next,
            missing: QpAttrMask::empty(),
            extra: QpAttrMask::CUR_STATE,
        });
    }
    if !cell.valid {
        return Err(Error::BadQpTransition { qp_type, cur, next });
    }
    let req = QpAttrMask(cell.req[qp_type as usize]);
    let opt = QpAttrMask(cell.opt[qp_type as usize]);
    let missing = req.difference(mask);
    let extra = mask.difference(req | opt | QpAttrMask::STATE);
    if !missing.is_empty() || !extra.is_empty() {
        return Err(Error::BadQpAttrMask {
            qp_type,
            cur,
            next,
            missing,
            extra,
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The provider

/// What the provider says about itself at registration (the fields a Linux
/// driver fills in `struct ib_device` before `ib_register_device`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Name ("mlx4_0").
    pub name: alloc::string::String,
    /// Node type.
    pub node_type: NodeType,
    /// Number of physical ports (ports are numbered from 1).
    pub phys_port_cnt: u8,
    /// Node GUID (host order).
    pub node_guid: u64,
    /// Node description (at most 64 bytes).
    pub node_desc: alloc::string::String,
    /// `local_dma_lkey`: an L_Key covering all of DMA memory for local
    /// access, if the device has one.
    pub local_dma_lkey: Option<u32>,
    /// Completion vectors.
    pub num_comp_vectors: u32,
}

/// `process_mad` flags (`IB_MAD_IGNORE_MKEY` ...).
pub mod mad_flags {
    /// Do not check the M_Key.
    pub const IB_MAD_IGNORE_MKEY: u32 = 1;
    /// Do not check the B_Key.
    pub const IB_MAD_IGNORE_BKEY: u32 = 2;
    /// Ignore both keys.
    pub const IB_MAD_IGNORE_ALL: u32 = IB_MAD_IGNORE_MKEY | IB_MAD_IGNORE_BKEY;
}

/// The verbs a driver provides: `struct ib_device`'s function pointers.
///
/// Every method takes `&mut self`: ib_core serializes calls per device. The
/// hot path is [`IbDevice::post_send`], [`IbDevice::post_recv`],
/// [`IbDevice::post_srq_recv`] and [`IbDevice::poll_cq`]; they must not
/// allocate. Optional verbs have a default returning [`Error::NoSys`], as a
/// NULL function pointer does in Linux.
pub trait IbDevice: Send {
    /// The fields of `struct ib_device` set before registration.
    fn info(&self) -> DeviceInfo;

    /// The provider as `Any`, so its owner can reach driver-specific state
    /// through the core (the console's `mlx4 caps` reaching mlx4_core);
    /// `None` by default.
    fn as_any_mut(&mut self) -> Option<&mut dyn core::any::Any> {
        None
    }

    /// A DMA pool the core may allocate MAD buffers from (the same pool the
    /// device's DMA goes through).
    fn dma_pool(&self) -> DmaPool;

    /// Progress without interrupts: poll the device's event queues (and its
    /// catastrophic-error buffer) and report asynchronous events through
    /// `event`. Called by [`crate::IbCore::poll`].
    fn poll_events(&mut self, event: &mut dyn FnMut(Event)) -> Result<()>;

    /// `query_device`.
    fn query_device(&mut self) -> Result<DeviceAttr>;
    /// `query_port` (port 1-based).
    fn query_port(&mut self, port: u8) -> Result<PortAttr>;
    /// `get_link_layer`.
    fn get_link_layer(&self, _port: u8) -> LinkLayer {
        LinkLayer::Infiniband
    }
    /// `query_gid`.
    fn query_gid(&mut self, port: u8, index: u32) -> Result<Gid>;
    /// `query_pkey`.
    fn query_pkey(&mut self, port: u8, index: u16) -> Result<u16>;
    /// Fills `out` with the port's GIDs from index 0, for the cache's
    /// refresh. The default asks [`IbDevice::query_gid`] once per entry, as
    /// Linux 3.11's `ib_cache_update` does; a provider that reads whole
    /// blocks (mlx4: 8 GUIDs per GUIDInfo) overrides it.
    fn query_gid_table(&mut self, port: u8, out: &mut [Gid]) -> Result<()> {
        for (i, g) in (0u32..).zip(out.iter_mut()) {
            *g = self.query_gid(port, i)?;
        }
        Ok(())
    }
    /// Fills `out` with the port's P_Keys from index 0 (see
    /// [`IbDevice::query_gid_table`]; mlx4 reads 32 per PKeyTable block).
    fn query_pkey_table(&mut self, port: u8, out: &mut [u16]) -> Result<()> {
        for (i, k) in (0u16..).zip(out.iter_mut()) {
            *k = self.query_pkey(port, i)?;
        }
        Ok(())
    }
    /// `modify_port`.
    fn modify_port(
        &mut self,
        _port: u8,
        _mask: PortModifyFlags,
        _props: &PortModify,
    ) -> Result<()> {
        Err(Error::NoSys)
    }

    /// `alloc_pd`.
    fn alloc_pd(&mut self) -> Result<Pd>;
    /// `dealloc_pd`.
    fn dealloc_pd(&mut self, pd: Pd) -> Result<()>;

    /// `create_ah`.
    fn create_ah(&mut self, pd: Pd, attr: &AhAttr) -> Result<Ah>;
    /// `query_ah`.
    fn query_ah(&mut self, _ah: Ah) -> Result<AhAttr> {
        Err(Error::NoSys)
    }
    /// `destroy_ah`.
    fn destroy_ah(&mut self, ah: Ah) -> Result<()>;

    /// `create_cq`; returns the handle and the actual number of entries.
    fn create_cq(&mut self, attr: &CqInitAttr) -> Result<(Cq, u32)>;
    /// `destroy_cq`.
    fn destroy_cq(&mut self, cq: Cq) -> Result<()>;
    /// `poll_cq`: fills the front of `wc`, returns how many were filled.
    fn poll_cq(&mut self, cq: Cq, wc: &mut [Wc]) -> Result<usize>;
    /// `req_notify_cq`; with [`CqNotifyFlags::REPORT_MISSED_EVENTS`], returns
    /// true if completions may have been missed.
    fn req_notify_cq(&mut self, cq: Cq, flags: CqNotifyFlags) -> Result<bool>;

    /// `create_qp` (also the special QPs: `qp_type` SMI/GSI with `port_num`);
    /// returns the QP and the actual capacities.
    fn create_qp(&mut self, pd: Pd, attr: &QpInitAttr) -> Result<(Qp, QpCap)>;
    /// `modify_qp`; the provider checks the mask with [`modify_qp_is_ok`]
    /// against its current state, as `mlx4_ib_modify_qp` does.
    fn modify_qp(&mut self, qp: Qp, attr: &QpAttr, mask: QpAttrMask) -> Result<()>;
    /// `query_qp`.
    fn query_qp(&mut self, qp: Qp, mask: QpAttrMask) -> Result<(QpAttr, QpInitAttr)>;
    /// `destroy_qp`.
    fn destroy_qp(&mut self, qp: Qp) -> Result<()>;
    /// `post_send`.
    fn post_send(&mut self, qp: Qp, wr: &[SendWr<'_>]) -> core::result::Result<(), PostError>;
    /// `post_recv`.
    fn post_recv(&mut self, qp: Qp, wr: &[RecvWr<'_>]) -> core::result::Result<(), PostError>;

    /// `create_srq`; returns the handle and the actual attributes.
    fn create_srq(&mut self, _pd: Pd, _attr: &SrqInitAttr) -> Result<(Srq, SrqAttr)> {
        Err(Error::NoSys)
    }
    /// `modify_srq` (arm the limit, resize).
    fn modify_srq(&mut self, _srq: Srq, _attr: &SrqAttr, _mask: SrqAttrMask) -> Result<()> {
        Err(Error::NoSys)
    }
    /// `query_srq`.
    fn query_srq(&mut self, _srq: Srq) -> Result<SrqAttr> {
        Err(Error::NoSys)
    }
    /// `destroy_srq`.
    fn destroy_srq(&mut self, _srq: Srq) -> Result<()> {
        Err(Error::NoSys)
    }
    /// `post_srq_recv`.
    fn post_srq_recv(
        &mut self,
        _srq: Srq,
        _wr: &[RecvWr<'_>],
    ) -> core::result::Result<(), PostError> {
        Err(PostError {
            index: 0,
            error: Error::NoSys,
        })
    }

    /// `get_dma_mr`: a region covering all DMA memory, for local access only
    /// by default (remote access flags are refused unless the provider
    /// explicitly supports them).
    fn get_dma_mr(&mut self, pd: Pd, access: AccessFlags) -> Result<Mr>;
    /// `reg_phys_mr`: a region over a page list, translated through the MTT.
    fn reg_mr(&mut self, _pd: Pd, _pages: &MrPages<'_>) -> Result<Mr> {
        Err(Error::NoSys)
    }
    /// `dereg_mr`.
    fn dereg_mr(&mut self, mr: Mr) -> Result<()>;

    /// `attach_mcast`: the UD QP receives the datagrams sent to multicast
    /// group `gid` (`lid` is its MLID, which mlx4 does not use: the card
    /// steers by MGID). [`crate::Device::attach_mcast`] checked the GID and
    /// the LID; the provider refuses a QP that is not UD (`-EINVAL`).
    fn attach_mcast(&mut self, _qp: Qp, _gid: &Gid, _lid: u16) -> Result<()> {
        Err(Error::NoSys)
    }
    /// `detach_mcast`: undoes [`IbDevice::attach_mcast`].
    fn detach_mcast(&mut self, _qp: Qp, _gid: &Gid, _lid: u16) -> Result<()> {
        Err(Error::NoSys)
    }

    /// `process_mad`: the driver's "first refusal" on MADs arriving on QP0/QP1
    /// (`in_wc`/`in_grh` given) and the way the core queries the local
    /// port's SMA/PMA (`in_wc` `None`). `flags` are [`mad_flags`]. Returns
    /// Linux's `IB_MAD_RESULT_*` bits; with `REPLY` the response is in
    /// `out_mad`.
    fn process_mad(
        &mut self,
        _flags: u32,
        _port: u8,
        _in_wc: Option<&Wc>,
        _in_grh: Option<&Grh>,
        _in_mad: &Mad,
        _out_mad: &mut Mad,
    ) -> Result<MadResult> {
        Err(Error::NoSys)
    }

    /// The core's cache of `port` was refreshed (`ib_cache_update`, at
    /// registration and on the port events). Linux's providers read
    /// `ib_get_cached_pkey`/`ib_get_cached_gid` while they build the UD
    /// header of a QP0/QP1 send; a provider here cannot call back into the
    /// core from its `post_send`, so it keeps what it needs of this copy.
    /// Never called on the data path.
    fn cache_updated(&mut self, _port: u8, _cache: &crate::cache::PortCache) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    #[test]
    fn values_are_linuxs() {
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
        assert_eq!(QpAttrMask::PKEY_INDEX.bits(), 16);
        assert_eq!(WcStatus::GeneralErr.raw(), 21);
        assert_eq!(WcStatus::RespTimeoutErr.raw(), 20);
        assert_eq!(WcOpcode::RecvRdmaWithImm.raw(), 129);
        assert_eq!(WrOpcode::AtomicFetchAndAdd.raw(), 6);
        assert_eq!(EventType::GidChange.raw(), 18);
        assert_eq!(EventType::ClientReregister.raw(), 17);
        assert_eq!(Rate::Rate40.raw(), 7);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(NodeType::Rnic.transport(), Transport::Iwarp);
        assert_eq!(WcStatus::from_raw(5), Some(WcStatus::WrFlushErr));
        assert_eq!(WcStatus::from_raw(22), None);
        assert_eq!(
            WcStatus::RetryExcErr.msg(),
            "transport retry counter exceeded"
        );
    }

    #[test]
    fn rates_read_like_sysfs() {
        use alloc::string::ToString;
        let r = PortRate::from_port(width::IB_WIDTH_4X, speed::IB_SPEED_QDR).unwrap();
        assert_eq!(r.to_string(), "40 Gb/sec (4X QDR)");
        assert_eq!(r.gbps(), 40);
        let r = PortRate::from_port(width::IB_WIDTH_4X, speed::IB_SPEED_FDR).unwrap();
        assert_eq!(r.to_string(), "56 Gb/sec (4X FDR)");
        let r = PortRate::from_port(width::IB_WIDTH_1X, speed::IB_SPEED_SDR).unwrap();
        assert_eq!(r.to_string(), "2.5 Gb/sec (1X)");
        let r = PortRate::from_port(width::IB_WIDTH_4X, speed::IB_SPEED_FDR10).unwrap();
        assert_eq!(r.to_string(), "40 Gb/sec (4X FDR10)");
        assert_eq!(PortRate::from_port(3, speed::IB_SPEED_QDR), None);
        assert_eq!(phys_state_str(5), "LinkUp");
        assert_eq!(phys_state_str(0), "<unknown>");
    }

    #[test]
    fn flags_print_linux_names() {
        let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask(1 << 30);
        assert_eq!(format!("{m}"), "IB_QP_STATE|IB_QP_PKEY_INDEX|0x40000000");
        assert_eq!(format!("{}", QpAttrMask::empty()), "0x0");
    }

    #[test]
    fn gid_prints_like_ibv_devinfo() {
        let g = Gid::new(0xfe80_0000_0000_0000, 0x0002_c903_0000_0001);
        assert_eq!(format!("{g}"), "fe80:0000:0000:0000:0002:c903:0000:0001");
        assert_eq!(g.interface_id(), 0x0002_c903_0000_0001);
        assert_eq!(g.subnet_prefix(), 0xfe80_0000_0000_0000);
    }

    const RC_INIT: QpAttrMask = m(&[A::STATE, A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]);
    const RC_RTR: QpAttrMask = m(&[
        A::STATE,
        A::AV,
        A::PATH_MTU,
        A::DEST_QPN,
        A::RQ_PSN,
        A::MAX_DEST_RD_ATOMIC,
        A::MIN_RNR_TIMER,
    ]);
    const RC_RTS: QpAttrMask = m(&[
        A::STATE,
        A::TIMEOUT,
        A::RETRY_CNT,
        A::RNR_RETRY,
        A::SQ_PSN,
        A::MAX_QP_RD_ATOMIC,
    ]);

    #[test]
    fn rc_bring_up_masks_pass() {
        use QpState::*;
        modify_qp_is_ok(Reset, Init, QpType::Rc, RC_INIT).unwrap();
        modify_qp_is_ok(Init, Rtr, QpType::Rc, RC_RTR).unwrap();
        modify_qp_is_ok(Rtr, Rts, QpType::Rc, RC_RTS).unwrap();
        modify_qp_is_ok(Rts, Err, QpType::Rc, A::STATE).unwrap();
        modify_qp_is_ok(Err, Reset, QpType::Rc, A::STATE).unwrap();
    }

    #[test]
    fn ud_and_special_bring_up_masks_pass() {
        use QpState::*;
        for ty in [QpType::Smi, QpType::Gsi] {
            modify_qp_is_ok(Reset, Init, ty, A::STATE | A::PKEY_INDEX | A::QKEY).unwrap();
            modify_qp_is_ok(Init, Rtr, ty, A::STATE).unwrap();
            modify_qp_is_ok(Rtr, Rts, ty, A::STATE | A::SQ_PSN).unwrap();
        }
        modify_qp_is_ok(
            Reset,
            Init,
            QpType::Ud,
            A::STATE | A::PKEY_INDEX | A::PORT | A::QKEY,
        )
        .unwrap();
        modify_qp_is_ok(Sqe, Rts, QpType::Ud, A::STATE | A::CUR_STATE).unwrap();
    }

    #[test]
    fn wrong_masks_are_refused_naming_what() {
        use QpState::*;
        // RTR without the destination QPN.
        let e = modify_qp_is_ok(Init, Rtr, QpType::Rc, RC_RTR.difference(A::DEST_QPN)).unwrap_err();
        assert_eq!(
            e,
            Error::BadQpAttrMask {
                qp_type: QpType::Rc,
                cur: Init,
                next: Rtr,
                missing: A::DEST_QPN,
                extra: A::empty(),
            }
        );
        assert_eq!(
            format!("{e}"),
            "modify_qp IB_QPT_RC: IB_QPS_INIT -> IB_QPS_RTR refused: missing IB_QP_DEST_QPN"
        );
        assert_eq!(e.to_errno(), -22);
        // A Q_Key on an RC QP is never accepted.
        let e = modify_qp_is_ok(Reset, Init, QpType::Rc, RC_INIT | A::QKEY).unwrap_err();
        assert!(format!("{e}").ends_with("not allowed IB_QP_QKEY"), "{e}");
        // UD needs no AV to reach RTR, and refuses one.
        assert!(modify_qp_is_ok(Init, Rtr, QpType::Ud, A::STATE | A::AV).is_err());
        // Skipping a state.
        let e = modify_qp_is_ok(Reset, Rts, QpType::Ud, A::STATE).unwrap_err();
        assert_eq!(
            format!("{e}"),
            "modify_qp IB_QPT_UD: no transition IB_QPS_RESET -> IB_QPS_RTS"
        );
        // CUR_STATE only from RTR/RTS/SQD/SQE.
        assert!(modify_qp_is_ok(Init, Init, QpType::Ud, A::STATE | A::CUR_STATE).is_err());
        // Nothing enters SQE by modify_qp (the hardware puts a QP there).
        assert!(modify_qp_is_ok(Rts, Sqe, QpType::Ud, A::STATE).is_err());
        // Reset -> Err is not in the table.
        assert!(modify_qp_is_ok(Reset, Err, QpType::Rc, A::STATE).is_err());
        // UD RESET->INIT without PORT.
        let e = modify_qp_is_ok(Reset, Init, QpType::Ud, A::STATE | A::PKEY_INDEX | A::QKEY)
            .unwrap_err();
        assert!(matches!(e, Error::BadQpAttrMask { missing, .. } if missing == A::PORT));
    }
}
