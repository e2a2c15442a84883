//! The device, its capabilities and its object tables, as Linux's `mlx4.h` declares them.
//!
//! Linux: `mlx4.h` (`struct mlx4_priv` and the per-object tables
//! `mlx4_{uar,mr,eq,cq,srq,qp,mcg}_table`, `struct mlx4_eq`,
//! `struct mlx4_catas_err`, the `mlx4_err`/`mlx4_warn`/`mlx4_info`/`mlx4_dbg`
//! log macros) and the device part of `include/linux/mlx4/device.h`
//! (`struct mlx4_dev`, `struct mlx4_caps`, `struct mlx4_mtt`,
//! `struct mlx4_uar`, `MLX4_MAX_PORTS`). The SR-IOV, Ethernet (MAC/VLAN
//! tables, sense), MSI-X and flow-steering parts are left out.
//!
//! The functions live where Linux has them (`cq.rs` for `cq.c`, ...); this
//! file only holds what they share. A [`Dev`] exists only ready: probe
//! (`main.rs`) brings up an `Hca` (PCI function, BARs, command interface,
//! firmware and ICM areas), builds the object `Tables` on it in
//! `mlx4_setup_hca`'s order, and only then makes the device. Its methods
//! therefore reach every table directly; a failed bring-up unwinds the `Hca`
//! and the tables made so far, never a half-made device.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::sync::Arc;
use alloc::vec::Vec;

use hal::{Bar, Clock, DmaBuf, DmaPool, PciAddress, PciFunction};
use mlx4_hw::qp::QpState;

use crate::bitmap::{Bitmap, Buddy, DbPages};
use crate::cmd::Cmd;
use crate::fw::{DevCap, FwInfo, FwVer};
use crate::icm::{Icm, IcmTable};
use crate::intf::Registry;
use crate::profile::{Layout, Profile};

/// `MLX4_MAX_PORTS`.
pub const MAX_PORTS: usize = 2;
/// `MLX4_BMME_FLAG_TYPE_2_WIN`.
pub const BMME_FLAG_TYPE_2_WIN: u32 = 1 << 9;
/// `MLX4_NUM_PDS`.
pub const NUM_PDS: u32 = 1 << 15;
/// `MLX4_CMPT_SHIFT`.
pub const CMPT_SHIFT: u32 = 24;

/// Linux `mlx4_err`: an error line naming the device, `mlx4_core <pci>: ...`.
///
/// The first argument is what carries the device's name (its PCI address,
/// anything that prints as Linux's `dev_name`); the rest is a `format!`
/// string and its arguments. The log target stays the calling module.
#[macro_export]
macro_rules! mlx4_err {
    ($pci:expr, $($arg:tt)+) => {
        $crate::__log::error!("mlx4_core {}: {}", $pci, ::core::format_args!($($arg)+))
    };
}

/// Linux `mlx4_warn`: a warning line naming the device (see [`mlx4_err!`]).
#[macro_export]
macro_rules! mlx4_warn {
    ($pci:expr, $($arg:tt)+) => {
        $crate::__log::warn!("mlx4_core {}: {}", $pci, ::core::format_args!($($arg)+))
    };
}

/// Linux `mlx4_info`: an information line naming the device (see [`mlx4_err!`]).
#[macro_export]
macro_rules! mlx4_info {
    ($pci:expr, $($arg:tt)+) => {
        $crate::__log::info!("mlx4_core {}: {}", $pci, ::core::format_args!($($arg)+))
    };
}

/// Linux `mlx4_dbg`: a debug line naming the device (see [`mlx4_err!`]).
#[macro_export]
macro_rules! mlx4_dbg {
    ($pci:expr, $($arg:tt)+) => {
        $crate::__log::debug!("mlx4_core {}: {}", $pci, ::core::format_args!($($arg)+))
    };
}

/// Port link type (Linux `enum mlx4_port_type`, IB and ETH).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PortType {
    /// InfiniBand: mlx4_ib's.
    #[default]
    Ib,
    /// Ethernet: mlx4_en's (and mlx4_ib's for RoCE when the card has IBOE).
    Eth,
}

/// Per-port capabilities (the per-port arrays of Linux `struct mlx4_caps`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct PortCaps {
    pub port_type: PortType,
    pub supported_type: u8,
    pub vl_cap: u8,
    pub ib_mtu_cap: u8,
    pub port_ib_mtu: u8,
    pub gid_table_len: u32,
    pub pkey_table_len: u32,
    pub port_width_cap: u8,
    pub eth_mtu_cap: u16,
    pub def_mac: u64,
    /// log2 of the MAC table size (`log_num_macs`, at most 7).
    pub log_num_macs: u8,
    /// log2 of the VLAN table size (`log_num_vlans`).
    pub log_num_vlans: u8,
    /// The port may be either type and link sensing is allowed
    /// (`sense.sense_allowed[port]`: supported type 3, DPDP, SENSE_SUPPORT).
    pub sense_allowed: bool,
    /// The type was sensed at start (`possible_type == MLX4_PORT_TYPE_AUTO`).
    pub auto_sensed: bool,
    /// Port capability mask from PortInfo (MAD_IFC), CPU order.
    pub ib_port_def_cap: u32,
}

/// Steering mode (Linux `enum mlx4_steering_mode`; device-managed is not used).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SteeringMode {
    /// A0 steering.
    #[default]
    A0,
    /// B0 steering (firmware reports both VEP steering flags).
    B0,
}

/// Device capabilities (Linux `struct mlx4_caps`, native subset), what
/// mlx4_ib reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Caps {
    pub fw_ver: u64,
    pub board_id: [u8; 16],
    pub num_ports: u8,
    pub port: [PortCaps; MAX_PORTS + 1],
    pub uar_page_size: u32,
    pub num_uars: u32,
    pub local_ca_ack_delay: u8,
    pub bf_reg_size: u32,
    pub bf_regs_per_page: u32,
    pub max_sq_sg: u32,
    pub max_rq_sg: u32,
    pub num_qps: u32,
    pub max_wqes: u32,
    pub max_sq_desc_sz: u32,
    pub max_rq_desc_sz: u32,
    pub max_qp_init_rdma: u32,
    pub max_qp_dest_rdma: u32,
    pub num_srqs: u32,
    pub max_srq_wqes: u32,
    pub max_srq_sge: u32,
    pub reserved_srqs: u32,
    pub num_cqs: u32,
    pub max_cqes: u32,
    pub reserved_cqs: u32,
    pub num_eqs: u32,
    pub reserved_eqs: u32,
    pub num_comp_vectors: u32,
    pub num_mpts: u32,
    pub num_mtts: u32,
    pub fmr_reserved_mtts: u32,
    pub reserved_mtts: u32,
    pub reserved_mrws: u32,
    pub reserved_uars: u32,
    pub num_mgms: u32,
    pub num_amgms: u32,
    pub reserved_mcgs: u32,
    pub num_qp_per_mgm: u32,
    pub steering_mode: SteeringMode,
    pub num_pds: u32,
    pub reserved_pds: u32,
    pub max_xrcds: u32,
    pub reserved_xrcds: u32,
    pub mtt_entry_sz: u32,
    pub max_msg_sz: u32,
    pub page_size_cap: u32,
    pub flags: u64,
    pub bmme_flags: u32,
    pub reserved_lkey: u32,
    pub stat_rate_support: u16,
    pub max_gso_sz: u32,
    pub max_counters: u32,
    pub reserved_qps_cnt: [u32; 4],
    pub reserved_qps_base: [u32; 4],
    pub reserved_qps: u32,
    /// First special QP (QP0 of port 1), `phys_caps.base_sqpn`.
    pub base_sqpn: u32,
    pub cq_timestamp: bool,
    pub hca_core_clock: u16,
    pub max_fmr_maps: u32,
}

impl Caps {
    /// The device's ports, 1-based, in order.
    pub fn ports(&self) -> core::ops::RangeInclusive<u8> {
        1..=self.num_ports.min(MAX_PORTS as u8)
    }

    /// Some port runs Ethernet.
    pub fn has_eth_port(&self) -> bool {
        self.ports_of_type(PortType::Eth).next().is_some()
    }

    /// The ports of type `t`, in order (Linux `mlx4_foreach_port`).
    #[doc(alias = "mlx4_foreach_port")]
    pub fn ports_of_type(&self, t: PortType) -> impl Iterator<Item = u8> + '_ {
        self.ports()
            .filter(move |&p| self.port[usize::from(p)].port_type == t)
    }
}

/// A user access region: one 4 KiB page of BAR2 (Linux `struct mlx4_uar`).
pub struct Uar {
    /// UAR index (the `usr_page`/`logsize_usrpage` field of contexts).
    pub index: u32,
    /// The doorbell page.
    pub map: Bar,
}

impl core::fmt::Debug for Uar {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Uar({})", self.index)
    }
}

/// An MTT range (Linux `struct mlx4_mtt`): `2^order` entries from `offset`,
/// describing pages of `2^page_shift` bytes; `order == None` means no
/// translation (physical MR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mtt {
    /// First MTT entry.
    pub offset: u32,
    /// log2 of the number of entries, `None` for none.
    pub order: Option<u32>,
    /// log2 of the page size.
    pub page_shift: u32,
}

/// The ICM context tables (Linux keeps each in its object's table:
/// `qp_table.qp_table`, `cq_table.cmpt_table`, ...). Before `mlx4_init_icm`
/// and after `mlx4_free_icms` every table is empty (nothing mapped).
pub(crate) struct IcmTables {
    pub(crate) cmpt_qp: IcmTable,
    pub(crate) cmpt_srq: IcmTable,
    pub(crate) cmpt_cq: IcmTable,
    pub(crate) cmpt_eq: IcmTable,
    pub(crate) eqc: IcmTable,
    pub(crate) mtt: IcmTable,
    pub(crate) dmpt: IcmTable,
    pub(crate) qpc: IcmTable,
    pub(crate) auxc: IcmTable,
    pub(crate) altc: IcmTable,
    pub(crate) rdmarc: IcmTable,
    pub(crate) cqc: IcmTable,
    pub(crate) srqc: IcmTable,
    pub(crate) mcg: IcmTable,
}

impl Default for IcmTables {
    fn default() -> IcmTables {
        IcmTables {
            cmpt_qp: IcmTable::empty("cMPT-QP"),
            cmpt_srq: IcmTable::empty("cMPT-SRQ"),
            cmpt_cq: IcmTable::empty("cMPT-CQ"),
            cmpt_eq: IcmTable::empty("cMPT-EQ"),
            eqc: IcmTable::empty("EQC"),
            mtt: IcmTable::empty("MTT"),
            dmpt: IcmTable::empty("dMPT"),
            qpc: IcmTable::empty("QPC"),
            auxc: IcmTable::empty("AUXC"),
            altc: IcmTable::empty("ALTC"),
            rdmarc: IcmTable::empty("RDMARC"),
            cqc: IcmTable::empty("CQC"),
            srqc: IcmTable::empty("SRQC"),
            mcg: IcmTable::empty("MCG"),
        }
    }
}

impl IcmTables {
    /// Every table, in the reverse of `mlx4_init_icm`'s order (the order
    /// `mlx4_free_icms` releases them in).
    pub(crate) fn all_mut(&mut self) -> [&mut IcmTable; 14] {
        [
            &mut self.mcg,
            &mut self.srqc,
            &mut self.cqc,
            &mut self.rdmarc,
            &mut self.altc,
            &mut self.auxc,
            &mut self.qpc,
            &mut self.dmpt,
            &mut self.mtt,
            &mut self.eqc,
            &mut self.cmpt_eq,
            &mut self.cmpt_cq,
            &mut self.cmpt_srq,
            &mut self.cmpt_qp,
        ]
    }

    /// Every table, in the order of [`IcmTables::all_mut`].
    pub(crate) fn all(&self) -> [&IcmTable; 14] {
        [
            &self.mcg,
            &self.srqc,
            &self.cqc,
            &self.rdmarc,
            &self.altc,
            &self.auxc,
            &self.qpc,
            &self.dmpt,
            &self.mtt,
            &self.eqc,
            &self.cmpt_eq,
            &self.cmpt_cq,
            &self.cmpt_srq,
            &self.cmpt_qp,
        ]
    }
}

/// What bring-up has done, for unwinding.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct State {
    pub(crate) owned: bool,
    pub(crate) fa_mapped: bool,
    pub(crate) fw_running: bool,
    pub(crate) aux_mapped: bool,
    pub(crate) hca_init: bool,
    pub(crate) registered: bool,
    pub(crate) done: bool,
}

/// The HCA below its object tables: what probe took (PCI function, BARs,
/// command interface) and what `mlx4_init_hca` built on it (firmware area,
/// capabilities, profile, ICM). During bring-up it is all there is; in a
/// ready [`Dev`] it is the ground the tables stand on.
pub(crate) struct Hca {
    /// Held from probe until teardown hands it back.
    pub(crate) pdev: Option<PciFunction>,
    pub(crate) pci: PciAddress,
    pub(crate) pool: DmaPool,
    pub(crate) clock: Arc<dyn Clock>,
    /// BAR0 and BAR2, held from probe until unwinding releases them.
    pub(crate) bar0: Option<Bar>,
    pub(crate) uar_bar: Option<Bar>,
    pub(crate) cmd: Cmd,
    pub(crate) caps: Caps,
    pub(crate) fw: FwInfo,
    pub(crate) dev_cap: DevCap,
    pub(crate) profile: Profile,
    pub(crate) layout: Layout,
    pub(crate) st: State,
    pub(crate) fw_icm: Option<Icm>,
    pub(crate) aux_icm: Option<Icm>,
    pub(crate) icm: IcmTables,
    /// Probe turned on memory decoding and bus mastering (undone at the end).
    pub(crate) enabled_here: bool,
}

/// The object tables `mlx4_setup_hca` makes, all of them (Linux keeps them
/// in `struct mlx4_priv`; `mlx4_cleanup_*_table` undoes each).
pub(crate) struct Tables {
    pub(crate) uar: Bitmap,
    /// The driver's own UAR (`priv->driver_uar`), held so that no client
    /// gets it; Linux maps it as `priv->kar` for Ethernet CQ doorbells,
    /// which this port leaves out.
    #[allow(dead_code)]
    pub(crate) driver_uar: Uar,
    pub(crate) pd: Bitmap,
    pub(crate) xrcd: Bitmap,
    pub(crate) mr: MrTable,
    /// AMGM entries (`mcg_table.bitmap`); the MGM hash table is all ICM.
    pub(crate) mcg: Bitmap,
    pub(crate) eq: EqTable,
    pub(crate) cq: CqTable,
    pub(crate) srq: SrqTable,
    pub(crate) qp: QpTable,
    /// Flow counters, on devices that have them.
    pub(crate) counters: Option<Bitmap>,
}

/// Linux `struct mlx4_mr_table` (native part).
pub(crate) struct MrTable {
    pub(crate) mpt_bitmap: Bitmap,
    /// MPT indices (masked) in hardware ownership.
    pub(crate) enabled: BTreeSet<u32>,
    pub(crate) mtt_buddy: Buddy,
    /// The firmware's MTTs, taken first: (offset, order).
    pub(crate) reserved_mtts: Option<(u32, u32)>,
}

/// One EQ (Linux `struct mlx4_eq`).
pub struct Eq {
    /// EQ number.
    pub eqn: u32,
    pub(crate) nent: u32,
    pub(crate) cons_index: u32,
    pub(crate) pages: Vec<DmaBuf>,
    pub(crate) mtt: Mtt,
    pub(crate) hw_owned: bool,
}

/// Linux `struct mlx4_eq_table`.
pub(crate) struct EqTable {
    pub(crate) bitmap: Bitmap,
    /// Completion EQs first, the async EQ last.
    pub(crate) eqs: Vec<Eq>,
    pub(crate) async_mapped: bool,
}

/// Linux `struct mlx4_cq_table`.
pub(crate) struct CqTable {
    pub(crate) bitmap: Bitmap,
    /// Live CQs: CQN -> arm sequence number.
    pub(crate) cqs: BTreeMap<u32, u32>,
}

/// Linux `struct mlx4_srq_table`.
pub(crate) struct SrqTable {
    pub(crate) bitmap: Bitmap,
    pub(crate) live: BTreeSet<u32>,
}

/// Linux `struct mlx4_qp_table`.
pub(crate) struct QpTable {
    pub(crate) bitmap: Bitmap,
    /// CONF_SPECIAL_QP gave the firmware the special-QP base.
    pub(crate) special_configured: bool,
    /// Live QPs and the state the last successful modify left them in.
    pub(crate) live: BTreeMap<u32, QpState>,
}

/// Catastrophic-error state (Linux `struct mlx4_catas_err`).
#[derive(Default)]
pub(crate) struct Catas {
    /// The internal error buffer, while polled.
    pub(crate) map: Option<Bar>,
    /// Its size in dwords.
    pub(crate) size: u32,
    /// An error was seen (and reported once).
    pub(crate) hit: bool,
}

/// A running ConnectX-3 (Linux `struct mlx4_dev` + `struct mlx4_priv`).
///
/// Made only by [`crate::probe`], with every table in place; [`Dev::teardown`]
/// (or dropping it) releases everything in Linux's reverse order.
pub struct Dev {
    pub(crate) hca: Hca,
    pub(crate) tables: Tables,
    pub(crate) intf: Registry,
    pub(crate) catas: Catas,
    pub(crate) port_open: [bool; MAX_PORTS + 1],
    pub(crate) eth: [crate::port::EthTables; MAX_PORTS + 1],
    pub(crate) db_pages: DbPages,
}

impl Dev {
    /// The device's capabilities.
    pub fn caps(&self) -> &Caps {
        &self.hca.caps
    }

    /// Firmware version, major<<32 | minor<<16 | subminor.
    pub fn fw_ver(&self) -> u64 {
        self.hca.caps.fw_ver
    }

    /// Firmware version as Linux prints it (`2.42.5000`).
    pub fn fw_ver_string(&self) -> alloc::string::String {
        alloc::format!("{}", FwVer(self.hca.caps.fw_ver))
    }

    /// Board id (`MT_1090120019`), trailing NULs removed.
    pub fn board_id(&self) -> &str {
        self.hca.board_id()
    }

    /// The PCI address (the device's name in logs).
    pub fn pci_address(&self) -> PciAddress {
        self.hca.pci
    }

    /// Firmware information from QUERY_FW.
    pub fn fw_info(&self) -> &FwInfo {
        &self.hca.fw
    }

    /// Raw QUERY_DEV_CAP values.
    pub fn dev_cap(&self) -> &DevCap {
        &self.hca.dev_cap
    }

    /// Where the profile put the tables.
    pub fn layout(&self) -> &Layout {
        &self.hca.layout
    }

    /// Host bytes mapped into ICM right now (all tables).
    pub fn icm_mapped_bytes(&self) -> usize {
        self.hca.icm_mapped_bytes()
    }

    /// Host bytes given to the firmware area and the ICM aux area.
    pub fn fw_aux_bytes(&self) -> (usize, usize) {
        (
            self.hca.fw_icm.as_ref().map_or(0, Icm::bytes),
            self.hca.aux_icm.as_ref().map_or(0, Icm::bytes),
        )
    }

    /// Firmware commands posted since probe.
    pub fn commands_issued(&self) -> u64 {
        self.hca.cmd.issued
    }

    /// Per-table mapped chunk reference counts (name, [(chunk, refs)]), for
    /// leak checks.
    pub fn icm_refcounts(&self) -> Vec<(&'static str, Vec<(usize, u32)>)> {
        self.hca
            .icm
            .all()
            .iter()
            .map(|t| (t.name, t.refcounts()))
            .collect()
    }

    /// The DMA pool the device allocates from.
    pub fn dma_pool(&self) -> &DmaPool {
        &self.hca.pool
    }
}

impl Hca {
    /// Board id (`MT_1090120019`), trailing NULs removed.
    pub(crate) fn board_id(&self) -> &str {
        let id = &self.caps.board_id;
        let n = id.iter().position(|&b| b == 0).unwrap_or(id.len());
        core::str::from_utf8(&id[..n]).unwrap_or("?")
    }

    /// Host bytes mapped into ICM right now (all tables).
    pub(crate) fn icm_mapped_bytes(&self) -> usize {
        self.icm.all().iter().map(|t| t.mapped_bytes()).sum()
    }
}
