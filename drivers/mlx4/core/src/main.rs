//! Probe, load sequence and teardown of the HCA (Linux `main.c`: `__mlx4_init_one`, `mlx4_init_hca`, `mlx4_load_fw`, `mlx4_dev_cap`, `mlx4_init_icm`, `mlx4_setup_hca`, `mlx4_remove_one`) and the device/caps types of `device.h`; SR-IOV, MSI-X, port sensing, sysfs and Ethernet port types are left out.
//!
//! The device object [`Dev`] owns every firmware resource and DMA
//! allocation. Bring-up records what it has done; on any error it unwinds
//! exactly what was done, in Linux's reverse order ([`Dev::teardown`] runs the
//! same unwinding), so a failed probe frees everything it took.

use alloc::sync::Arc;
use alloc::vec::Vec;

use hal::{Bar, Clock, DmaPool, PciAddress, PciFunction};
use log::{debug, error, info, warn};
use mlx4_hw::fw::dev_cap_flags as flags;
use mlx4_hw::hcr::{HCR_BASE, HCR_SIZE};

use crate::bitmap::Bitmap;
use crate::catas::Catas;
use crate::cmd::Cmd;
use crate::cq::CqTable;
use crate::eq::EqTable;
use crate::fw::{self, DevCap, FwInfo, FwVer};
use crate::icm::{self, Icm, IcmTable};
use crate::intf::Registry;
use crate::mr::MrTable;
use crate::pd::Uar;
use crate::profile::{self, Layout, Profile};
use crate::qp::QpTable;
use crate::srq::SrqTable;
use crate::{Error, Result};

/// `MLX4_MAX_PORTS`.
pub const MAX_PORTS: usize = 2;
/// `MLX4_BMME_FLAG_TYPE_2_WIN`.
pub const BMME_FLAG_TYPE_2_WIN: u32 = 1 << 9;
/// `MLX4_NUM_PDS`.
pub const NUM_PDS: u32 = 1 << 15;
/// `MLX4_CMPT_SHIFT`.
pub const CMPT_SHIFT: u32 = 24;
/// PCI IDs handled (ConnectX-3, ConnectX-3 Pro).
pub const PCI_IDS: [(u16, u16); 2] = [(0x15b3, 0x1003), (0x15b3, 0x1007)];

/// Port link type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PortType {
    /// InfiniBand (the only type this port drives).
    #[default]
    Ib,
    /// Ethernet: left alone (no SET_PORT, no events acted upon).
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

/// The ICM tables (Linux keeps them in `priv`'s per-resource tables).
#[derive(Default)]
#[allow(missing_docs)]
pub struct IcmTables {
    pub cmpt_qp: Option<IcmTable>,
    pub cmpt_srq: Option<IcmTable>,
    pub cmpt_cq: Option<IcmTable>,
    pub cmpt_eq: Option<IcmTable>,
    pub eqc: Option<IcmTable>,
    pub mtt: Option<IcmTable>,
    pub dmpt: Option<IcmTable>,
    pub qpc: Option<IcmTable>,
    pub auxc: Option<IcmTable>,
    pub altc: Option<IcmTable>,
    pub rdmarc: Option<IcmTable>,
    pub cqc: Option<IcmTable>,
    pub srqc: Option<IcmTable>,
    pub mcg: Option<IcmTable>,
}

impl IcmTables {
    fn all(&self) -> [&Option<IcmTable>; 14] {
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

    /// Linux `mlx4_free_icms` (the table part): reverse of `mlx4_init_icm`.
    fn cleanup(&mut self, cmd: &mut Cmd) {
        for t in [
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
        ] {
            if let Some(mut tab) = t.take() {
                tab.cleanup(cmd);
            }
        }
    }
}

/// What bring-up has done, for unwinding.
#[derive(Debug, Default, Clone, Copy)]
struct State {
    owned: bool,
    fa_mapped: bool,
    fw_running: bool,
    aux_mapped: bool,
    hca_init: bool,
    registered: bool,
    done: bool,
}

/// A running ConnectX-3 (Linux `struct mlx4_dev` + `struct mlx4_priv`).
pub struct Dev {
    pub(crate) pdev: Option<PciFunction>,
    pub(crate) pci: PciAddress,
    pub(crate) pool: DmaPool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) bar0: Option<Bar>,
    pub(crate) uar_bar: Option<Bar>,
    pub(crate) cmd: Cmd,
    pub(crate) caps: Caps,
    pub(crate) fw: FwInfo,
    pub(crate) dev_cap: DevCap,
    pub(crate) profile: Profile,
    pub(crate) layout: Layout,
    st: State,
    pub(crate) fw_icm: Option<Icm>,
    pub(crate) aux_icm: Option<Icm>,
    pub(crate) icm: IcmTables,
    pub(crate) uar_table: Option<Bitmap>,
    pub(crate) driver_uar: Option<Uar>,
    pub(crate) pd_bitmap: Option<Bitmap>,
    pub(crate) xrcd_bitmap: Option<Bitmap>,
    pub(crate) mr_table: Option<MrTable>,
    pub(crate) mcg_bitmap: Option<Bitmap>,
    pub(crate) eq_table: Option<EqTable>,
    pub(crate) cq_table: Option<CqTable>,
    pub(crate) srq_table: Option<SrqTable>,
    pub(crate) qp_table: Option<QpTable>,
    pub(crate) counters: Option<Bitmap>,
    pub(crate) intf: Registry,
    pub(crate) catas: Catas,
    pub(crate) port_open: [bool; MAX_PORTS + 1],
    enabled_here: bool,
    pub(crate) db_pages: crate::bitmap::DbPages,
}

/// Linux `mlx4_init_one`/`__mlx4_init_one`: brings up the HCA behind `pdev`
/// and returns it ready for mlx4_ib.
///
/// Order (porting map 2.2): PCI enable, BAR0/BAR2, ownership, reset, HCR
/// init, QUERY_FW, MAP_FA, RUN_FW, MOD_STAT_CFG, QUERY_DEV_CAP (+ QUERY_PORT),
/// profile, SET_ICM_SIZE, MAP_ICM_AUX, MAP_ICM per table, INIT_HCA,
/// (QUERY_HCA if CQ timestamps), QUERY_ADAPTER, UAR/PD/XRCD/MR/MCG tables, EQs (SW2HW_EQ,
/// MAP_EQ), NOP, CQ/SRQ/QP tables (CONF_SPECIAL_QP), and per IB port
/// MAD_IFC(PortInfo) + SET_PORT; then the device is registered (catastrophic
/// error polling starts).
#[doc(alias = "mlx4_init_one")]
pub fn probe(
    pdev: PciFunction,
    pool: DmaPool,
    clock: Arc<dyn Clock>,
    profile: Profile,
) -> Result<Dev> {
    let pci = pdev.address();
    let ids = (pdev.vendor_id(), pdev.device_id());
    if !PCI_IDS.contains(&ids) {
        error!(
            "mlx4_core {pci}: unsupported device {:04x}:{:04x}",
            ids.0, ids.1
        );
        return Err(Error::NoDevice);
    }
    info!("mlx4_core: Initializing {pci}");
    profile
        .validate()
        .inspect_err(|e| error!("mlx4_core {pci}: bad profile: {e}"))?;
    // pci_enable_device is reference counted in Linux; here: only undo what
    // this probe turned on.
    let cmd_bits = hal::pci::cfg::COMMAND_MASTER | hal::pci::cfg::COMMAND_MEMORY;
    let enabled_here = pdev.command() & cmd_bits != cmd_bits;
    pdev.enable();
    let bar0 = match pdev.take_bar(0) {
        Ok(b) => b,
        Err(_) => {
            error!("mlx4_core {pci}: Missing DCS, aborting.");
            if enabled_here {
                pdev.clear_command_bits(cmd_bits);
            }
            return Err(Error::NoDevice);
        }
    };
    let uar_bar = match pdev.take_bar(2) {
        Ok(b) => b,
        Err(_) => {
            error!("mlx4_core {pci}: Missing UAR, aborting.");
            pdev.release_bar(0, bar0);
            if enabled_here {
                pdev.clear_command_bits(cmd_bits);
            }
            return Err(Error::NoDevice);
        }
    };
    let hcr = match bar0.slice(HCR_BASE, HCR_SIZE) {
        Some(h) if bar0.len() >= mlx4_hw::hcr::RESET_BASE + mlx4_hw::hcr::RESET_SIZE => h,
        _ => {
            error!(
                "mlx4_core {pci}: Couldn't map command register (BAR0 of {:#x} bytes).",
                bar0.len()
            );
            pdev.release_bar(0, bar0);
            pdev.release_bar(2, uar_bar);
            if enabled_here {
                pdev.clear_command_bits(cmd_bits);
            }
            return Err(Error::NoDevice);
        }
    };
    let cmd = Cmd::new(hcr, clock.clone(), pci);
    let mut dev = Dev {
        pdev: Some(pdev),
        pci,
        pool,
        clock,
        bar0: Some(bar0),
        uar_bar: Some(uar_bar),
        cmd,
        caps: Caps::default(),
        fw: FwInfo::default(),
        dev_cap: DevCap::default(),
        profile,
        layout: Layout::default(),
        st: State::default(),
        fw_icm: None,
        aux_icm: None,
        icm: IcmTables::default(),
        uar_table: None,
        driver_uar: None,
        pd_bitmap: None,
        xrcd_bitmap: None,
        mr_table: None,
        mcg_bitmap: None,
        eq_table: None,
        cq_table: None,
        srq_table: None,
        qp_table: None,
        counters: None,
        intf: Registry::default(),
        catas: Catas::default(),
        port_open: [false; MAX_PORTS + 1],
        enabled_here,
        db_pages: crate::bitmap::DbPages::default(),
    };
    match dev.init_one() {
        Ok(()) => Ok(dev),
        Err(e) => {
            error!("mlx4_core {pci}: bring-up failed: {e}");
            dev.unwind();
            Err(e)
        }
    }
}

impl Dev {
    fn init_one(&mut self) -> Result<()> {
        let pci = self.pci;
        let bar0 = self.bar0.as_ref().ok_or(Error::NoDevice)?;
        if !crate::reset::get_ownership(bar0) {
            warn!("mlx4_core {pci}: Multiple PFs not yet supported. Skipping PF.");
            return Err(Error::NotOwner);
        }
        self.st.owned = true;
        let pdev = self.pdev.as_ref().ok_or(Error::NoDevice)?;
        if let Err(e) = crate::reset::reset(pdev, bar0, &*self.clock) {
            error!("mlx4_core {pci}: Failed to reset HCA, aborting.");
            return Err(e);
        }
        self.init_hca()?;
        self.setup_hca()?;
        self.register_device();
        Ok(())
    }

    /// Linux `mlx4_load_fw`.
    fn load_fw(&mut self) -> Result<()> {
        let pci = self.pci;
        let icm = icm::alloc_icm(&self.pool, self.fw.fw_pages as usize).inspect_err(|_| {
            error!("mlx4_core {pci}: Couldn't allocate FW area, aborting.");
        })?;
        let fw_icm = self.fw_icm.insert(icm);
        icm::map_cmd(
            &mut self.cmd,
            &self.pool,
            mlx4_hw::cmd::Opcode::MAP_FA,
            fw_icm,
            None,
            &pci,
        )
        .inspect_err(|_| {
            error!("mlx4_core {pci}: MAP_FA command failed, aborting.");
        })?;
        self.st.fa_mapped = true;
        fw::run_fw(&mut self.cmd)
            .inspect_err(|_| error!("mlx4_core {pci}: RUN_FW command failed, aborting."))?;
        self.st.fw_running = true;
        Ok(())
    }

    /// Linux `mlx4_init_hca` (native PF).
    fn init_hca(&mut self) -> Result<()> {
        let pci = self.pci;
        self.fw = fw::query_fw(&mut self.cmd, &self.pool, &pci)
            .inspect_err(|_| error!("mlx4_core {pci}: QUERY_FW command failed, aborting."))?;
        self.cmd.max_cmds = self.fw.max_cmds;
        self.caps.fw_ver = self.fw.fw_ver;
        fw::log_fw(&pci, &self.fw);
        self.load_fw()?;
        match fw::mod_stat_cfg(&mut self.cmd, &self.pool) {
            // A stuck HCR is not a soft failure: every later command would
            // fail on it, so stop here naming the command that hung.
            Err(e @ (Error::CmdTimeout { .. } | Error::CmdBusy { .. })) => return Err(e),
            Err(_) => warn!("mlx4_core {pci}: Failed to override log_pg_sz parameter"),
            Ok(()) => {}
        }
        self.init_dev_cap()?;
        self.choose_steering_mode();
        let mut p = self.profile;
        self.clamp_profile(&mut p)?;
        let layout = profile::make_profile(&p, &self.dev_cap, &pci)?;
        self.layout = layout;
        self.apply_layout();
        self.init_icm()?;
        fw::init_hca(&mut self.cmd, &self.pool, &self.layout.init_hca, &pci)
            .inspect_err(|_| error!("mlx4_core {pci}: INIT_HCA command failed, aborting."))?;
        self.st.hca_init = true;
        if self.caps.cq_timestamp {
            match fw::query_hca_core_clock(&mut self.cmd, &self.pool) {
                Ok(c) if c != 0 => self.caps.hca_core_clock = c,
                _ => {
                    warn!("mlx4_core {pci}: QUERY_HCA command failed, disable timestamp");
                    self.caps.cq_timestamp = false;
                }
            }
        }
        let adapter = fw::query_adapter(&mut self.cmd, &self.pool)
            .inspect_err(|_| error!("mlx4_core {pci}: QUERY_ADAPTER command failed, aborting."))?;
        self.caps.board_id = adapter.board_id;
        Ok(())
    }

    /// Linux `mlx4_dev_cap`: QUERY_DEV_CAP, validation, and the caps derived
    /// from it.
    #[doc(alias = "mlx4_dev_cap")]
    fn init_dev_cap(&mut self) -> Result<()> {
        let pci = self.pci;
        let d = fw::query_dev_cap(&mut self.cmd, &self.pool, &pci)
            .inspect_err(|_| error!("mlx4_core {pci}: QUERY_DEV_CAP command failed, aborting."))?;
        let uar_len = self.uar_bar.as_ref().map_or(0, |b| b.len() as u64);
        d.validate(uar_len)
            .inspect_err(|e| error!("mlx4_core {pci}: {e}, aborting."))?;
        let c = &mut self.caps;
        c.num_ports = d.num_ports;
        for p in 1..=usize::from(d.num_ports) {
            let pc = &d.port[p];
            c.port[p] = PortCaps {
                port_type: if pc.supported_port_types & 1 != 0 {
                    PortType::Ib
                } else {
                    PortType::Eth
                },
                supported_type: pc.supported_port_types,
                vl_cap: pc.max_vl,
                ib_mtu_cap: pc.ib_mtu,
                port_ib_mtu: 0,
                gid_table_len: pc.max_gids,
                pkey_table_len: pc.max_pkeys,
                port_width_cap: pc.max_port_width,
                eth_mtu_cap: pc.eth_mtu,
                def_mac: pc.def_mac,
                ib_port_def_cap: 0,
            };
        }
        // Bounded by validate(); the narrowing casts below cannot truncate.
        c.uar_page_size = 4096;
        c.num_uars = (d.uar_size / 4096) as u32;
        c.local_ca_ack_delay = d.local_ca_ack_delay;
        c.bf_reg_size = d.bf_reg_size;
        c.bf_regs_per_page = d.bf_regs_per_page;
        c.max_sq_sg = d.max_sq_sg;
        c.max_rq_sg = d.max_rq_sg;
        c.max_wqes = d.max_qp_sz as u32;
        c.max_qp_init_rdma = d.max_requester_per_qp.min(1 << 31) as u32;
        c.max_srq_wqes = d.max_srq_sz as u32;
        c.max_srq_sge = d.max_rq_sg - 1;
        c.reserved_srqs = d.reserved_srqs as u32;
        c.max_sq_desc_sz = d.max_sq_desc_sz;
        c.max_rq_desc_sz = d.max_rq_desc_sz;
        // A spare CQE lets HW tell an empty CQ from a full one.
        c.max_cqes = (d.max_cq_sz - 1) as u32;
        c.reserved_cqs = d.reserved_cqs as u32;
        c.reserved_eqs = d.reserved_eqs;
        c.reserved_mtts = d.reserved_mtts as u32;
        c.reserved_mrws = d.reserved_mrws as u32;
        // The first 128 UARs carry EQ doorbells.
        c.reserved_uars = d.reserved_uars.max(128);
        c.reserved_pds = d.reserved_pds;
        c.reserved_xrcds = d.reserved_xrcds;
        c.max_xrcds = d.max_xrcds.min(1 << 16) as u32;
        c.mtt_entry_sz = d.mtt_entry_sz;
        c.max_msg_sz = d.max_msg_sz as u32;
        c.page_size_cap = !((d.min_page_sz as u32) - 1);
        c.flags = d.flags;
        c.bmme_flags = d.bmme_flags;
        c.reserved_lkey = d.reserved_lkey;
        c.stat_rate_support = d.stat_rate_support;
        c.max_gso_sz = d.max_gso_sz.min(1 << 31) as u32;
        c.max_counters = if d.max_counters == 0 {
            0
        } else {
            1 << d.max_counters.ilog2()
        };
        c.cq_timestamp = d.cq_timestamp;
        c.reserved_mcgs = d.reserved_mgms;
        c.num_comp_vectors = 1;
        c.num_pds = NUM_PDS;
        c.reserved_qps_cnt[0] = d.reserved_qps as u32;
        if self.profile.eth_fc_qp_regions {
            // log_num_mac 7, log_num_vlan 0, no priorities, per port.
            let per = (1u32 << 7) * u32::from(d.num_ports);
            c.reserved_qps_cnt[1] = per;
            c.reserved_qps_cnt[2] = per;
            c.reserved_qps_cnt[3] = 64 * 1024;
        }
        c.reserved_qps = c.reserved_qps_cnt.iter().sum();
        self.dev_cap = d;
        Ok(())
    }

    /// Linux `choose_steering_mode` without device-managed flow steering.
    fn choose_steering_mode(&mut self) {
        let both = flags::VEP_UC_STEER | flags::VEP_MC_STEER;
        self.caps.steering_mode = if self.caps.flags & both == both {
            SteeringMode::B0
        } else {
            if self.caps.flags & both != 0 {
                warn!(
                    "mlx4_core {}: Must have both UC_STEER and MC_STEER flags set to use B0 steering. Falling back to A0 steering mode.",
                    self.pci
                );
            }
            SteeringMode::A0
        };
        self.caps.num_qp_per_mgm = crate::mcg::qp_per_mgm(self.profile.log_mgm_entry_size);
        debug!(
            "mlx4_core {}: Steering mode is: {:?}",
            self.pci, self.caps.steering_mode
        );
    }

    /// Keeps the requested counts within what the device supports (each a
    /// power of two), warning when it has to shrink one; RDMA responder
    /// resources above the device's are refused (INIT_HCA would be).
    fn clamp_profile(&self, p: &mut Profile) -> Result<()> {
        let d = &self.dev_cap;
        let clamp = |name: &str, v: &mut u32, max: u64| {
            if u64::from(*v) > max {
                warn!(
                    "mlx4_core {}: profile asks for {} {name}, device supports {max}",
                    self.pci, *v
                );
                *v = max as u32;
            }
        };
        clamp("QPs", &mut p.num_qp, d.max_qps);
        clamp("SRQs", &mut p.num_srq, d.max_srqs);
        clamp("CQs", &mut p.num_cq, d.max_cqs);
        clamp("MPTs", &mut p.num_mpt, d.max_mpts.min(1 << 31));
        clamp(
            "MTT segments",
            &mut p.num_mtt_segs,
            d.max_mtt_seg.min(1 << 28),
        );
        // Every table must hold more than the firmware reserves in it.
        let raise = |name: &str, v: &mut u32, reserved: u64| {
            if u64::from(*v) <= reserved {
                let n = (reserved.saturating_mul(2))
                    .next_power_of_two()
                    .min(1 << 31) as u32;
                warn!(
                    "mlx4_core {}: profile's {} {name} raised to {n} (firmware reserves {reserved})",
                    self.pci, *v
                );
                *v = n;
            }
        };
        let eth_fc = if p.eth_fc_qp_regions {
            (2u64 << 7) * u64::from(d.num_ports) + (64 << 10)
        } else {
            0
        };
        raise(
            "QPs",
            &mut p.num_qp,
            d.reserved_qps.next_multiple_of(8) + 8 + eth_fc,
        );
        raise("SRQs", &mut p.num_srq, d.reserved_srqs);
        raise("CQs", &mut p.num_cq, d.reserved_cqs);
        raise("MPTs", &mut p.num_mpt, d.reserved_mrws);
        raise(
            "MTT segments",
            &mut p.num_mtt_segs,
            d.reserved_mtts.div_ceil(8),
        );
        raise("MCG entries", &mut p.num_mcg, 1);
        Error::check_pow2(
            "rdmarc_per_qp",
            p.rdmarc_per_qp.into(),
            d.max_responder_per_qp.min(128),
        )
        .inspect_err(|e| error!("mlx4_core {}: bad profile: {e}", self.pci))
    }

    fn apply_layout(&mut self) {
        let l = &self.layout;
        let c = &mut self.caps;
        c.num_qps = l.num_qps;
        c.num_srqs = l.num_srqs;
        c.num_cqs = l.num_cqs;
        c.num_eqs = l.num_eqs;
        c.num_mpts = l.num_mpts;
        c.num_mtts = l.num_mtts;
        c.num_mgms = l.num_mgms;
        c.num_amgms = l.num_amgms;
        c.max_qp_dest_rdma = 1 << l.rdmarc_shift;
        c.max_fmr_maps = (1u32 << (32 - l.num_mpts.max(1).ilog2()).min(31)) - 1;
        self.layout.init_hca.log_uar_sz = c.num_uars.max(1).ilog2() as u8;
        self.layout.init_hca.uar_page_sz = 0;
        let mut f = mlx4_hw::fw::init_hca::FLAG_CHECK_PORT_UD_AV;
        if c.flags & flags::IPOIB_CSUM != 0 {
            f |= mlx4_hw::fw::init_hca::FLAG_IPOIB_CSUM;
        }
        if c.flags & flags::COUNTERS != 0 {
            f |= mlx4_hw::fw::init_hca::FLAG_COUNTERS;
        }
        self.layout.init_hca.flags = f;
        self.layout.init_hca.uc_steering = c.flags & flags::VEP_MC_STEER != 0;
        // Linux 3.10+: memory windows when the device has them.
        self.layout.init_hca.mw_enabled =
            c.flags & flags::MEM_WINDOW != 0 || c.bmme_flags & BMME_FLAG_TYPE_2_WIN != 0;
    }

    /// Linux `mlx4_init_icm`: SET_ICM_SIZE, aux memory, then every table's
    /// reserved part, in Linux's order.
    fn init_icm(&mut self) -> Result<()> {
        let pci = self.pci;
        let total = self.layout.total_size;
        let aux_pages = fw::set_icm_size(&mut self.cmd, total)
            .inspect_err(|_| error!("mlx4_core {pci}: SET_ICM_SIZE command failed, aborting."))?;
        // The aux area is a small fraction of the ICM; anything beyond the
        // ICM size itself is nonsense.
        if aux_pages == 0 || aux_pages > (total >> 12).max(1 << 10) {
            error!("mlx4_core {pci}: firmware asks for {aux_pages} aux pages, aborting.");
            return Err(Error::BadCaps {
                field: "aux_pages",
                value: aux_pages,
            });
        }
        debug!(
            "mlx4_core {pci}: {} KB of HCA context requires {} KB aux memory.",
            total >> 10,
            aux_pages << 2
        );
        let aux = icm::alloc_icm(&self.pool, aux_pages as usize)
            .inspect_err(|_| error!("mlx4_core {pci}: Couldn't allocate aux memory, aborting."))?;
        let aux = self.aux_icm.insert(aux);
        icm::map_cmd(
            &mut self.cmd,
            &self.pool,
            mlx4_hw::cmd::Opcode::MAP_ICM_AUX,
            aux,
            None,
            &pci,
        )
        .inspect_err(|_| error!("mlx4_core {pci}: MAP_ICM_AUX command failed, aborting."))?;
        self.st.aux_mapped = true;

        let h = self.layout.init_hca;
        let d = self.dev_cap;
        let c = self.caps.clone();
        let cmpt = |ty: u64| h.cmpt_base + ((ty * u64::from(d.cmpt_entry_sz)) << CMPT_SHIFT);
        let rsvd_fw_qps = c.reserved_qps_cnt[0];
        // Reserved MTTs are rounded up to a cache line: the firmware writes
        // them while the driver writes their neighbours.
        self.caps.reserved_mtts =
            ((c.reserved_mtts * c.mtt_entry_sz).next_multiple_of(64)) / c.mtt_entry_sz;
        let reserved_mtts = self.caps.reserved_mtts;
        let specs: [(&'static str, u64, u32, u32, u32, &'static str); 14] = [
            (
                "cMPT-QP",
                cmpt(0),
                d.cmpt_entry_sz,
                c.num_qps,
                rsvd_fw_qps,
                "cMPT",
            ),
            (
                "cMPT-SRQ",
                cmpt(1),
                d.cmpt_entry_sz,
                c.num_srqs,
                c.reserved_srqs,
                "cMPT",
            ),
            (
                "cMPT-CQ",
                cmpt(2),
                d.cmpt_entry_sz,
                c.num_cqs,
                c.reserved_cqs,
                "cMPT",
            ),
            (
                "cMPT-EQ",
                cmpt(3),
                d.cmpt_entry_sz,
                c.num_eqs,
                c.num_eqs,
                "cMPT",
            ),
            (
                "EQC",
                h.eqc_base,
                d.eqc_entry_sz,
                c.num_eqs,
                c.num_eqs,
                "EQ",
            ),
            (
                "MTT",
                h.mtt_base,
                c.mtt_entry_sz,
                c.num_mtts,
                reserved_mtts,
                "MTT",
            ),
            (
                "dMPT",
                h.dmpt_base,
                d.dmpt_entry_sz,
                c.num_mpts,
                c.reserved_mrws,
                "dMPT",
            ),
            (
                "QPC",
                h.qpc_base,
                d.qpc_entry_sz,
                c.num_qps,
                rsvd_fw_qps,
                "QP",
            ),
            (
                "AUXC",
                h.auxc_base,
                d.aux_entry_sz,
                c.num_qps,
                rsvd_fw_qps,
                "AUXC",
            ),
            (
                "ALTC",
                h.altc_base,
                d.altc_entry_sz,
                c.num_qps,
                rsvd_fw_qps,
                "ALTC",
            ),
            (
                "RDMARC",
                h.rdmarc_base,
                d.rdmarc_entry_sz << self.layout.rdmarc_shift,
                c.num_qps,
                rsvd_fw_qps,
                "RDMARC",
            ),
            (
                "CQC",
                h.cqc_base,
                d.cqc_entry_sz,
                c.num_cqs,
                c.reserved_cqs,
                "CQ",
            ),
            (
                "SRQC",
                h.srqc_base,
                d.srq_entry_sz,
                c.num_srqs,
                c.reserved_srqs,
                "SRQ",
            ),
            (
                "MCG",
                h.mc_base,
                1 << h.log_mc_entry_sz,
                c.num_mgms + c.num_amgms,
                c.num_mgms + c.num_amgms,
                "MCG",
            ),
        ];
        for (i, &(name, virt, obj_size, nobj, reserved, what)) in specs.iter().enumerate() {
            let t = IcmTable::init(
                name,
                &mut self.cmd,
                &self.pool,
                virt,
                obj_size,
                nobj,
                reserved,
                &pci,
            )
            .inspect_err(|_| {
                error!("mlx4_core {pci}: Failed to map {what} context memory, aborting.")
            })?;
            let slot = match i {
                0 => &mut self.icm.cmpt_qp,
                1 => &mut self.icm.cmpt_srq,
                2 => &mut self.icm.cmpt_cq,
                3 => &mut self.icm.cmpt_eq,
                4 => &mut self.icm.eqc,
                5 => &mut self.icm.mtt,
                6 => &mut self.icm.dmpt,
                7 => &mut self.icm.qpc,
                8 => &mut self.icm.auxc,
                9 => &mut self.icm.altc,
                10 => &mut self.icm.rdmarc,
                11 => &mut self.icm.cqc,
                12 => &mut self.icm.srqc,
                _ => &mut self.icm.mcg,
            };
            *slot = Some(t);
        }
        Ok(())
    }

    /// Linux `mlx4_setup_hca`.
    fn setup_hca(&mut self) -> Result<()> {
        let pci = self.pci;
        self.init_uar_table().inspect_err(|_| {
            error!("mlx4_core {pci}: Failed to initialize user access region table, aborting.")
        })?;
        let uar = self.uar_alloc().inspect_err(|_| {
            error!("mlx4_core {pci}: Failed to allocate driver access region, aborting.")
        })?;
        self.driver_uar = Some(uar);
        self.init_pd_table().inspect_err(|_| {
            error!("mlx4_core {pci}: Failed to initialize protection domain table, aborting.")
        })?;
        self.init_xrcd_table().inspect_err(|_| {
            error!(
                "mlx4_core {pci}: Failed to initialize reliable connection domain table, aborting."
            )
        })?;
        self.init_mr_table().inspect_err(|_| {
            error!("mlx4_core {pci}: Failed to initialize memory region table, aborting.")
        })?;
        self.init_mcg_table().inspect_err(|_| {
            error!("mlx4_core {pci}: Failed to initialize multicast group table, aborting.")
        })?;
        self.init_eq_table().inspect_err(|_| {
            error!("mlx4_core {pci}: Failed to initialize event queue table, aborting.")
        })?;
        // Linux switches to event-driven commands here and uses NOP as an
        // interrupt test; commands stay polled, NOP stays as a liveness test.
        fw::nop(&mut self.cmd)
            .inspect_err(|_| error!("mlx4_core {pci}: NOP command failed, aborting."))?;
        debug!("mlx4_core {pci}: NOP command test passed (polled)");
        self.init_cq_table().inspect_err(|_| {
            error!("mlx4_core {pci}: Failed to initialize completion queue table, aborting.")
        })?;
        self.init_srq_table().inspect_err(|_| {
            error!("mlx4_core {pci}: Failed to initialize shared receive queue table, aborting.")
        })?;
        self.init_qp_table().inspect_err(|_| {
            error!("mlx4_core {pci}: Failed to initialize queue pair table, aborting.")
        })?;
        if self.caps.flags & flags::COUNTERS != 0 && self.caps.max_counters > 0 {
            let n = self.caps.max_counters;
            self.counters = Some(Bitmap::new(n, n - 1, 0, 0)?);
        }
        for port in 1..=self.caps.num_ports {
            if self.caps.port[usize::from(port)].port_type != PortType::Ib {
                continue;
            }
            let cap = match self.get_port_ib_caps(port) {
                Ok(c) => c,
                Err(e @ (Error::CmdTimeout { .. } | Error::CmdBusy { .. })) => return Err(e),
                Err(e) => {
                    warn!(
                        "mlx4_core {pci}: failed to get port {port} default ib capabilities ({}). Continuing with caps = 0",
                        e.to_errno()
                    );
                    0
                }
            };
            let pc = &mut self.caps.port[usize::from(port)];
            pc.ib_port_def_cap = cap;
            pc.port_ib_mtu = mlx4_hw::port::IB_MTU_4096 as u8;
            self.set_port(port)
                .inspect_err(|_| error!("mlx4_core {pci}: Failed to set port {port}, aborting"))?;
        }
        Ok(())
    }

    /// Linux `mlx4_register_device`: the device is ready for interfaces;
    /// catastrophic-error polling starts.
    fn register_device(&mut self) {
        self.st.registered = true;
        self.start_catas_poll();
        let c = &self.caps;
        info!(
            "mlx4_core {}: ConnectX-3 ready: fw_ver {}, board_id {}, {} port(s), {} QPs, {} CQs, {} MPTs, ICM {} KB mapped",
            self.pci,
            FwVer(c.fw_ver),
            self.board_id(),
            c.num_ports,
            c.num_qps,
            c.num_cqs,
            c.num_mpts,
            self.icm_mapped_bytes() >> 10
        );
    }

    /// Linux `mlx4_remove_one` (and the error unwinding of
    /// `__mlx4_init_one`): releases, in reverse order, whatever bring-up did.
    fn unwind(&mut self) {
        if self.st.done {
            return;
        }
        self.st.done = true;
        let pci = self.pci;
        if self.st.registered {
            self.stop_catas_poll();
            self.unregister_device();
            // Linux issues CLOSE_PORT for every port and ignores the status;
            // only ports mlx4_ib opened (INIT_PORT) are closed here, so the
            // firmware is never asked to close a port that is not open.
            for port in 1..=self.caps.num_ports {
                if self.port_open[usize::from(port)] {
                    self.port_open[usize::from(port)] = false;
                    if let Err(e) = fw::close_port(&mut self.cmd, port) {
                        warn!(
                            "mlx4_core {pci}: CLOSE_PORT {port} failed ({})",
                            e.to_errno()
                        );
                    }
                }
            }
        }
        // Linux expects mlx4_ib to have destroyed everything by now; objects
        // a client leaked are taken back from the HCA so that CLOSE_HCA finds
        // none in hardware ownership.
        let leaked = [
            self.reclaim_qps(),
            self.reclaim_srqs(),
            self.reclaim_cqs(),
            self.reclaim_mrs(),
        ];
        if leaked.iter().any(|&n| n > 0) {
            warn!(
                "mlx4_core {pci}: reclaimed leaked objects: {} QPs, {} SRQs, {} CQs, {} MRs",
                leaked[0], leaked[1], leaked[2], leaked[3]
            );
        }
        self.counters = None;
        self.cleanup_qp_table();
        self.srq_table = None;
        self.cq_table = None;
        self.cleanup_eq_table();
        self.mcg_bitmap = None;
        self.cleanup_mr_table();
        self.xrcd_bitmap = None;
        self.pd_bitmap = None;
        self.driver_uar = None;
        self.uar_table = None;
        self.db_pages = crate::bitmap::DbPages::default();
        if self.st.hca_init
            && let Err(e) = fw::close_hca(&mut self.cmd, false)
        {
            warn!("mlx4_core {pci}: CLOSE_HCA failed ({})", e.to_errno());
        }
        // mlx4_free_icms
        self.icm.cleanup(&mut self.cmd);
        if self.st.aux_mapped
            && let Err(e) = fw::unmap_icm_aux(&mut self.cmd)
        {
            warn!("mlx4_core {pci}: UNMAP_ICM_AUX failed ({})", e.to_errno());
        }
        self.aux_icm = None;
        if self.st.fa_mapped
            && let Err(e) = fw::unmap_fa(&mut self.cmd)
        {
            warn!("mlx4_core {pci}: UNMAP_FA failed ({})", e.to_errno());
        }
        self.fw_icm = None;
        if self.st.owned
            && let Some(b) = self.bar0.as_ref()
        {
            crate::reset::free_ownership(b, &*self.clock);
        }
        self.catas = Catas::default();
        if let Some(pdev) = self.pdev.as_ref() {
            if let Some(b) = self.bar0.take() {
                pdev.release_bar(0, b);
            }
            if let Some(b) = self.uar_bar.take() {
                pdev.release_bar(2, b);
            }
            // pci_disable_device: no more DMA or MMIO decoding.
            if self.enabled_here {
                pdev.clear_command_bits(
                    hal::pci::cfg::COMMAND_MASTER | hal::pci::cfg::COMMAND_MEMORY,
                );
            }
        }
        self.st = State {
            done: true,
            ..State::default()
        };
    }

    /// Linux `mlx4_remove_one`: unregisters the interfaces, closes the ports
    /// and releases every firmware resource and DMA allocation in reverse
    /// order of bring-up. Objects the caller still holds (CQs, QPs, MRs, ...)
    /// become invalid; their ICM is unmapped with the tables. Returns the
    /// PCI function (BARs released) so that the kernel can probe it again,
    /// e.g. after a catastrophic error.
    ///
    /// # Panics
    ///
    /// Never: the function is held from probe until here.
    #[doc(alias = "mlx4_remove_one")]
    pub fn teardown(mut self) -> PciFunction {
        info!("mlx4_core {}: removing device", self.pci);
        self.unwind();
        match self.pdev.take() {
            Some(p) => p,
            None => unreachable!("the PCI function is only taken here"),
        }
    }

    /// The device's capabilities.
    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    /// Firmware version, major<<32 | minor<<16 | subminor.
    pub fn fw_ver(&self) -> u64 {
        self.caps.fw_ver
    }

    /// Firmware version as Linux prints it (`2.42.5000`).
    pub fn fw_ver_string(&self) -> alloc::string::String {
        alloc::format!("{}", FwVer(self.caps.fw_ver))
    }

    /// Board id (`MT_1090120019`), trailing NULs removed.
    pub fn board_id(&self) -> &str {
        let id = &self.caps.board_id;
        let n = id.iter().position(|&b| b == 0).unwrap_or(id.len());
        core::str::from_utf8(&id[..n]).unwrap_or("?")
    }

    /// The PCI address (the device's name in logs).
    pub fn pci_address(&self) -> PciAddress {
        self.pci
    }

    /// Firmware information from QUERY_FW.
    pub fn fw_info(&self) -> &FwInfo {
        &self.fw
    }

    /// Raw QUERY_DEV_CAP values.
    pub fn dev_cap(&self) -> &DevCap {
        &self.dev_cap
    }

    /// Where the profile put the tables.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Host bytes mapped into ICM right now (all tables).
    pub fn icm_mapped_bytes(&self) -> usize {
        self.icm
            .all()
            .iter()
            .filter_map(|t| t.as_ref())
            .map(IcmTable::mapped_bytes)
            .sum()
    }

    /// Host bytes given to the firmware area and the ICM aux area.
    pub fn fw_aux_bytes(&self) -> (usize, usize) {
        (
            self.fw_icm.as_ref().map_or(0, Icm::bytes),
            self.aux_icm.as_ref().map_or(0, Icm::bytes),
        )
    }

    /// Firmware commands posted since probe.
    pub fn commands_issued(&self) -> u64 {
        self.cmd.issued
    }

    /// Per-table mapped chunk reference counts (name, [(chunk, refs)]), for
    /// leak checks.
    pub fn icm_refcounts(&self) -> Vec<(&'static str, Vec<(usize, u32)>)> {
        self.icm
            .all()
            .iter()
            .filter_map(|t| t.as_ref())
            .map(|t| (t.name, t.refcounts()))
            .collect()
    }

    /// Linux `mlx4_counter_alloc`: a flow counter index (devices with
    /// counters only).
    #[doc(alias = "mlx4_counter_alloc")]
    pub fn counter_alloc(&mut self) -> Result<u32> {
        self.counters.as_mut().ok_or(Error::Unsupported)?.alloc()
    }

    /// Linux `mlx4_counter_free`.
    #[doc(alias = "mlx4_counter_free")]
    pub fn counter_free(&mut self, idx: u32) {
        if let Some(c) = self.counters.as_mut() {
            c.free(idx);
        }
    }

    /// The DMA pool the device allocates from.
    pub fn dma_pool(&self) -> &DmaPool {
        &self.pool
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        self.unwind();
    }
}

impl Dev {
    /// Takes objects a client leaked back from the HCA at teardown, one
    /// command each (`issue`); a failure only warns, since the device is
    /// being closed anyway. Returns how many there were.
    pub(crate) fn reclaim_each(
        &mut self,
        ids: Vec<u32>,
        what: &str,
        mut issue: impl FnMut(&mut Cmd, u32) -> Result<()>,
    ) -> usize {
        for &id in &ids {
            if let Err(e) = issue(&mut self.cmd, id) {
                warn!(
                    "mlx4_core {}: {what} {id:#x} failed ({})",
                    self.pci,
                    e.to_errno()
                );
            }
        }
        ids.len()
    }
}
