//! Probe, the load sequence and teardown of the HCA, as Linux's `main.c` does them.
//!
//! Linux: `main.c` (`__mlx4_init_one`, `mlx4_init_hca`, `mlx4_load_fw`,
//! `mlx4_dev_cap`, `mlx4_init_icm`, `mlx4_setup_hca`, `mlx4_remove_one`,
//! `mlx4_counter_alloc`). SR-IOV, MSI-X, port sensing, sysfs and Ethernet
//! port types are left out.
//!
//! Bring-up works on the device's `Hca` (`dev.rs`), which records what it has
//! done; `mlx4_setup_hca` then makes every object table, and only a device
//! with all of them becomes a [`Dev`]. On any error bring-up unwinds exactly
//! what was done, in Linux's reverse order ([`Dev::teardown`] runs the same
//! unwinding), so a failed probe frees everything it took.

use alloc::sync::Arc;
use alloc::vec::Vec;

use hal::{Clock, DmaPool, PciFunction};
use mlx4_hw::fw::dev_cap_flags as flags;
use mlx4_hw::hcr::{HCR_BASE, HCR_SIZE};

use crate::bitmap::{Bitmap, DbPages};
use crate::cmd::Cmd;
use crate::dev::{
    BMME_FLAG_TYPE_2_WIN, CMPT_SHIFT, Caps, Catas, CqTable, Dev, Hca, IcmTables, MAX_PORTS,
    MrTable, NUM_PDS, PortCaps, PortType, QpTable, SrqTable, State, SteeringMode, Tables,
};
use crate::eq::EqTable;
use crate::fw::{self, DevCap, FwInfo, FwVer};
use crate::icm::{self, IcmTable, IcmTableSpec};
use crate::intf::Registry;
use crate::port::ETH_QPS_PER_PORT;
use crate::profile::{self, Layout, Profile};
use crate::{Error, Result, mlx4_dbg, mlx4_err, mlx4_info, mlx4_warn};

/// PCI IDs handled (ConnectX-3, ConnectX-3 Pro).
pub const PCI_IDS: [(u16, u16); 2] = [(0x15b3, 0x1003), (0x15b3, 0x1007)];

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
        mlx4_err!(pci, "unsupported device {:04x}:{:04x}", ids.0, ids.1);
        return Err(Error::NoDevice);
    }
    log::info!("mlx4_core: Initializing {pci}");
    profile
        .validate()
        .inspect_err(|e| mlx4_err!(pci, "bad profile: {e}"))?;
    // pci_enable_device is reference counted in Linux; here: only undo what
    // this probe turned on.
    let cmd_bits = hal::pci::cfg::COMMAND_MASTER | hal::pci::cfg::COMMAND_MEMORY;
    let enabled_here = pdev.command() & cmd_bits != cmd_bits;
    pdev.enable();
    let bar0 = match pdev.take_bar(0) {
        Ok(b) => b,
        Err(_) => {
            mlx4_err!(pci, "Missing DCS, aborting.");
            if enabled_here {
                pdev.clear_command_bits(cmd_bits);
            }
            return Err(Error::NoDevice);
        }
    };
    let uar_bar = match pdev.take_bar(2) {
        Ok(b) => b,
        Err(_) => {
            mlx4_err!(pci, "Missing UAR, aborting.");
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
            mlx4_err!(
                pci,
                "Couldn't map command register (BAR0 of {:#x} bytes).",
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
    // The EQs are polled and nothing takes INTx: the function must not
    // assert it (Linux's `pci_intx(pdev, 0)`, which `pci_intx_for_msi` does
    // once MSI-X is on). Over vfio-user this also keeps QEMU from turning
    // the mapped UAR pages back into a trapped BAR at the first interrupt.
    pdev.set_command_bits(hal::pci::cfg::COMMAND_INTX_DISABLE);
    let cmd = Cmd::new(hcr, clock.clone(), pci);
    let mut hca = Hca {
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
        enabled_here,
    };
    let tables = match hca.init_one() {
        Ok(t) => t,
        Err(e) => {
            mlx4_err!(pci, "bring-up failed: {e}");
            hca.unwind();
            return Err(e);
        }
    };
    let mut dev = Dev {
        hca,
        tables,
        intf: Registry::default(),
        catas: Catas::default(),
        port_open: [false; MAX_PORTS + 1],
        eth: Default::default(),
        db_pages: DbPages::default(),
    };
    if let Err(e) = dev.setup_ports() {
        mlx4_err!(pci, "bring-up failed: {e}");
        dev.unwind();
        return Err(e);
    }
    dev.register_device();
    Ok(dev)
}

/// Logs Linux's "Failed to initialize ... table, aborting." for `what`.
fn table_failed(pci: hal::PciAddress, what: &'static str) -> impl FnOnce(&Error) {
    move |_| mlx4_err!(pci, "Failed to initialize {what} table, aborting.")
}

impl Hca {
    /// The firmware part of `__mlx4_init_one`: ownership, reset,
    /// `mlx4_init_hca`, then the object tables of `mlx4_setup_hca`.
    fn init_one(&mut self) -> Result<Tables> {
        let pci = self.pci;
        let bar0 = self.bar0.as_ref().ok_or(Error::NoDevice)?;
        if !crate::reset::get_ownership(bar0) {
            mlx4_warn!(pci, "Multiple PFs not yet supported. Skipping PF.");
            return Err(Error::NotOwner);
        }
        self.st.owned = true;
        let pdev = self.pdev.as_ref().ok_or(Error::NoDevice)?;
        if let Err(e) = crate::reset::reset(pdev, bar0, &*self.clock) {
            mlx4_err!(pci, "Failed to reset HCA, aborting.");
            return Err(e);
        }
        self.init_hca()?;
        self.setup_hca()
    }

    /// Linux `mlx4_load_fw`.
    fn load_fw(&mut self) -> Result<()> {
        let pci = self.pci;
        let icm = icm::alloc_icm(&self.pool, self.fw.fw_pages as usize).inspect_err(|_| {
            mlx4_err!(pci, "Couldn't allocate FW area, aborting.");
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
            mlx4_err!(pci, "MAP_FA command failed, aborting.");
        })?;
        self.st.fa_mapped = true;
        fw::run_fw(&mut self.cmd)
            .inspect_err(|_| mlx4_err!(pci, "RUN_FW command failed, aborting."))?;
        self.st.fw_running = true;
        Ok(())
    }

    /// Linux `mlx4_init_hca` (native PF).
    fn init_hca(&mut self) -> Result<()> {
        let pci = self.pci;
        self.fw = fw::query_fw(&mut self.cmd, &self.pool, &pci)
            .inspect_err(|_| mlx4_err!(pci, "QUERY_FW command failed, aborting."))?;
        self.cmd.max_cmds = self.fw.max_cmds;
        self.caps.fw_ver = self.fw.fw_ver;
        fw::log_fw(&pci, &self.fw);
        self.load_fw()?;
        match fw::mod_stat_cfg(&mut self.cmd, &self.pool) {
            // A stuck HCR is not a soft failure: every later command would
            // fail on it, so stop here naming the command that hung.
            Err(e @ (Error::CmdTimeout { .. } | Error::CmdBusy { .. })) => return Err(e),
            Err(_) => mlx4_warn!(pci, "Failed to override log_pg_sz parameter"),
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
            .inspect_err(|_| mlx4_err!(pci, "INIT_HCA command failed, aborting."))?;
        self.st.hca_init = true;
        if self.caps.cq_timestamp {
            match fw::query_hca_core_clock(&mut self.cmd, &self.pool) {
                Ok(c) if c != 0 => self.caps.hca_core_clock = c,
                _ => {
                    mlx4_warn!(pci, "QUERY_HCA command failed, disable timestamp");
                    self.caps.cq_timestamp = false;
                }
            }
        }
        let adapter = fw::query_adapter(&mut self.cmd, &self.pool)
            .inspect_err(|_| mlx4_err!(pci, "QUERY_ADAPTER command failed, aborting."))?;
        self.caps.board_id = adapter.board_id;
        Ok(())
    }

    /// Linux `mlx4_dev_cap`: QUERY_DEV_CAP, validation, and the caps derived
    /// from it.
    #[doc(alias = "mlx4_dev_cap")]
    fn init_dev_cap(&mut self) -> Result<()> {
        let pci = self.pci;
        let d = fw::query_dev_cap(&mut self.cmd, &self.pool, &pci)
            .inspect_err(|_| mlx4_err!(pci, "QUERY_DEV_CAP command failed, aborting."))?;
        let uar_len = self.uar_bar.as_ref().map_or(0, |b| b.len() as u64);
        d.validate(uar_len)
            .inspect_err(|e| mlx4_err!(pci, "{e}, aborting."))?;
        let c = &mut self.caps;
        c.num_ports = d.num_ports;
        let sense_flags = d.flags & flags::DPDP != 0 && d.flags & flags::SENSE_SUPPORT != 0;
        for p in 1..=usize::from(d.num_ports) {
            let pc = &d.port[p];
            // Linux `mlx4_dev_cap`: a port of one type is that type; one
            // that may be either takes the user's choice, else the type
            // the firmware suggests, and is sensed when the firmware says
            // "default sense" and sensing is allowed.
            let sense_allowed = pc.supported_port_types == 3 && sense_flags;
            let chosen = self.profile.port_type.get(p - 1).copied().flatten();
            let mut port_type = match pc.supported_port_types {
                1 => PortType::Ib,
                2 => PortType::Eth,
                3 => chosen.unwrap_or(if pc.suggested_eth {
                    PortType::Eth
                } else {
                    PortType::Ib
                }),
                // No type reported: as before Ethernet support, a port that
                // is not InfiniBand is left to Ethernet.
                _ => PortType::Eth,
            };
            let auto_sensed = sense_allowed && pc.default_sense && chosen.is_none();
            if auto_sensed {
                // Linux ignores a failed sense and keeps the suggestion.
                if let Ok(Some(t)) = fw::sense_port(&mut self.cmd, p as u8, &pci) {
                    port_type = t;
                }
            }
            let log_macs = pc.log_max_macs.min(7);
            c.port[p] = PortCaps {
                port_type,
                supported_type: pc.supported_port_types,
                vl_cap: pc.max_vl,
                ib_mtu_cap: pc.ib_mtu,
                port_ib_mtu: 0,
                gid_table_len: pc.max_gids,
                pkey_table_len: pc.max_pkeys,
                port_width_cap: pc.max_port_width,
                eth_mtu_cap: pc.eth_mtu,
                def_mac: pc.def_mac,
                log_num_macs: if log_macs == 0 { 7 } else { log_macs },
                log_num_vlans: pc.log_max_vlans.min(7),
                sense_allowed,
                auto_sensed,
                ib_port_def_cap: 0,
            };
            mlx4_dbg!(
                pci,
                "port {p}: supported types {}, {:?}{}",
                pc.supported_port_types,
                port_type,
                if auto_sensed { " (sensed)" } else { "" }
            );
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
        let per = ETH_QPS_PER_PORT * u32::from(d.num_ports);
        if self.profile.eth_fc_qp_regions || c.has_eth_port() {
            // Linux's ETH_ADDR region, which RQP_CALC steers into: a QP per
            // MAC-table entry per port.
            c.reserved_qps_cnt[1] = per;
        }
        if self.profile.eth_fc_qp_regions {
            // The FC address and exchange regions, for fidelity only.
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
                mlx4_warn!(
                    self.pci,
                    "Must have both UC_STEER and MC_STEER flags set to use B0 steering. Falling back to A0 steering mode."
                );
            }
            SteeringMode::A0
        };
        self.caps.num_qp_per_mgm = crate::mcg::qp_per_mgm(self.profile.log_mgm_entry_size);
        mlx4_dbg!(self.pci, "Steering mode is: {:?}", self.caps.steering_mode);
    }

    /// Keeps the requested counts within what the device supports (each a
    /// power of two), warning when it has to shrink one; RDMA responder
    /// resources above the device's are refused (INIT_HCA would be).
    fn clamp_profile(&self, p: &mut Profile) -> Result<()> {
        let d = &self.dev_cap;
        let clamp = |name: &str, v: &mut u32, max: u64| {
            if u64::from(*v) > max {
                mlx4_warn!(
                    self.pci,
                    "profile asks for {} {name}, device supports {max}",
                    *v
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
                mlx4_warn!(
                    self.pci,
                    "profile's {} {name} raised to {n} (firmware reserves {reserved})",
                    *v
                );
                *v = n;
            }
        };
        // The Ethernet and FC regions init_dev_cap reserved.
        let eth_fc: u64 = self.caps.reserved_qps_cnt[1..]
            .iter()
            .map(|&n| u64::from(n))
            .sum();
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
        .inspect_err(|e| mlx4_err!(self.pci, "bad profile: {e}"))
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
        // Linux 3.5+ `mlx4_INIT_HCA`: the bit asks for B0 steering, chosen
        // only when both VEP steering capabilities are there.
        self.layout.init_hca.uc_steering = c.steering_mode == SteeringMode::B0;
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
            .inspect_err(|_| mlx4_err!(pci, "SET_ICM_SIZE command failed, aborting."))?;
        // The aux area is a small fraction of the ICM; anything beyond the
        // ICM size itself is nonsense.
        if aux_pages == 0 || aux_pages > (total >> 12).max(1 << 10) {
            mlx4_err!(pci, "firmware asks for {aux_pages} aux pages, aborting.");
            return Err(Error::BadCaps {
                field: "aux_pages",
                value: aux_pages,
            });
        }
        mlx4_dbg!(
            pci,
            "{} KB of HCA context requires {} KB aux memory.",
            total >> 10,
            aux_pages << 2
        );
        let aux = icm::alloc_icm(&self.pool, aux_pages as usize)
            .inspect_err(|_| mlx4_err!(pci, "Couldn't allocate aux memory, aborting."))?;
        let aux = self.aux_icm.insert(aux);
        icm::map_cmd(
            &mut self.cmd,
            &self.pool,
            mlx4_hw::cmd::Opcode::MAP_ICM_AUX,
            aux,
            None,
            &pci,
        )
        .inspect_err(|_| mlx4_err!(pci, "MAP_ICM_AUX command failed, aborting."))?;
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
        // Each table's reserved part, in Linux's order; `what` is the name
        // Linux's error message gives the table.
        let mut map = |what: &str, spec: IcmTableSpec| {
            IcmTable::init(&mut self.cmd, &self.pool, &spec, &pci)
                .inspect_err(|_| mlx4_err!(pci, "Failed to map {what} context memory, aborting."))
        };
        let spec = |name, virt, obj_size, nobj, reserved| IcmTableSpec {
            name,
            virt,
            obj_size,
            nobj,
            reserved,
        };
        let cmpt_sz = d.cmpt_entry_sz;
        // The QP context tables: one entry per QP, the firmware's QPs reserved.
        let per_qp = |name, virt, obj_size| spec(name, virt, obj_size, c.num_qps, rsvd_fw_qps);
        let t = &mut self.icm;
        t.cmpt_qp = map("cMPT", per_qp("cMPT-QP", cmpt(0), cmpt_sz))?;
        t.cmpt_srq = map(
            "cMPT",
            spec("cMPT-SRQ", cmpt(1), cmpt_sz, c.num_srqs, c.reserved_srqs),
        )?;
        t.cmpt_cq = map(
            "cMPT",
            spec("cMPT-CQ", cmpt(2), cmpt_sz, c.num_cqs, c.reserved_cqs),
        )?;
        t.cmpt_eq = map(
            "cMPT",
            spec("cMPT-EQ", cmpt(3), cmpt_sz, c.num_eqs, c.num_eqs),
        )?;
        t.eqc = map(
            "EQ",
            spec("EQC", h.eqc_base, d.eqc_entry_sz, c.num_eqs, c.num_eqs),
        )?;
        t.mtt = map(
            "MTT",
            spec("MTT", h.mtt_base, c.mtt_entry_sz, c.num_mtts, reserved_mtts),
        )?;
        t.dmpt = map(
            "dMPT",
            spec(
                "dMPT",
                h.dmpt_base,
                d.dmpt_entry_sz,
                c.num_mpts,
                c.reserved_mrws,
            ),
        )?;
        t.qpc = map("QP", per_qp("QPC", h.qpc_base, d.qpc_entry_sz))?;
        t.auxc = map("AUXC", per_qp("AUXC", h.auxc_base, d.aux_entry_sz))?;
        t.altc = map("ALTC", per_qp("ALTC", h.altc_base, d.altc_entry_sz))?;
        let rdmarc_sz = d.rdmarc_entry_sz << self.layout.rdmarc_shift;
        t.rdmarc = map("RDMARC", per_qp("RDMARC", h.rdmarc_base, rdmarc_sz))?;
        t.cqc = map(
            "CQ",
            spec("CQC", h.cqc_base, d.cqc_entry_sz, c.num_cqs, c.reserved_cqs),
        )?;
        t.srqc = map(
            "SRQ",
            spec(
                "SRQC",
                h.srqc_base,
                d.srq_entry_sz,
                c.num_srqs,
                c.reserved_srqs,
            ),
        )?;
        let mcgs = c.num_mgms + c.num_amgms;
        t.mcg = map(
            "MCG",
            spec("MCG", h.mc_base, 1 << h.log_mc_entry_sz, mcgs, mcgs),
        )?;
        Ok(())
    }

    /// Linux `mlx4_setup_hca` without the ports: every object table, in
    /// Linux's order. A failure undoes the tables that told the firmware
    /// something (MR, EQ, QP), in reverse, as Linux's `err_*` labels do; the
    /// others are memory only, and the rest is left to [`Hca::unwind`].
    fn setup_hca(&mut self) -> Result<Tables> {
        let pci = self.pci;
        let mut uar = crate::pd::init_uar_table(&self.caps, pci)
            .inspect_err(table_failed(pci, "user access region"))?;
        let driver_uar = crate::pd::uar_alloc_in(&mut uar, self).inspect_err(|_| {
            mlx4_err!(pci, "Failed to allocate driver access region, aborting.")
        })?;
        let pd = crate::pd::init_pd_table(&self.caps)
            .inspect_err(table_failed(pci, "protection domain"))?;
        let xrcd = crate::pd::init_xrcd_table(&self.caps)
            .inspect_err(table_failed(pci, "reliable connection domain"))?;
        let mut mr = MrTable::init(self).inspect_err(table_failed(pci, "memory region"))?;
        let mcg = crate::mcg::init_mcg_table(&self.caps)
            .inspect_err(table_failed(pci, "multicast group"))
            .inspect_err(|_| mr.cleanup(self))?;
        let mut eq = EqTable::init(self, &mut mr)
            .inspect_err(table_failed(pci, "event queue"))
            .inspect_err(|_| mr.cleanup(self))?;
        let undo_eq = |hca: &mut Hca, eq: &mut EqTable, mr: &mut MrTable| {
            eq.cleanup(hca, mr);
            mr.cleanup(hca);
        };
        // Linux switches to event-driven commands here and uses NOP as an
        // interrupt test; commands stay polled, NOP stays as a liveness test.
        fw::nop(&mut self.cmd)
            .inspect_err(|_| mlx4_err!(pci, "NOP command failed, aborting."))
            .inspect_err(|_| undo_eq(self, &mut eq, &mut mr))?;
        mlx4_dbg!(pci, "NOP command test passed (polled)");
        let cq = CqTable::init(&self.caps)
            .inspect_err(table_failed(pci, "completion queue"))
            .inspect_err(|_| undo_eq(self, &mut eq, &mut mr))?;
        let srq = SrqTable::init(&self.caps)
            .inspect_err(table_failed(pci, "shared receive queue"))
            .inspect_err(|_| undo_eq(self, &mut eq, &mut mr))?;
        let mut qp = QpTable::init(self)
            .inspect_err(table_failed(pci, "queue pair"))
            .inspect_err(|_| undo_eq(self, &mut eq, &mut mr))?;
        let counters = if self.caps.flags & flags::COUNTERS != 0 && self.caps.max_counters > 0 {
            let n = self.caps.max_counters;
            let b = Bitmap::new(n, n - 1, 0, 0).inspect_err(|_| {
                qp.cleanup(self);
                undo_eq(self, &mut eq, &mut mr);
            })?;
            Some(b)
        } else {
            None
        };
        Ok(Tables {
            uar,
            driver_uar,
            pd,
            xrcd,
            mr,
            mcg,
            eq,
            cq,
            srq,
            qp,
            counters,
        })
    }

    /// What `__mlx4_init_one`'s error path and `mlx4_remove_one` release
    /// below the object tables, in reverse order of bring-up: CLOSE_HCA, the
    /// ICM tables and aux area, the firmware area, ownership, the BARs and
    /// PCI decoding.
    fn unwind(&mut self) {
        if self.st.done {
            return;
        }
        self.st.done = true;
        let pci = self.pci;
        if self.st.hca_init
            && let Err(e) = fw::close_hca(&mut self.cmd, false)
        {
            mlx4_warn!(pci, "CLOSE_HCA failed ({})", e.to_errno());
        }
        // mlx4_free_icms
        for t in self.icm.all_mut() {
            t.cleanup(&mut self.cmd);
        }
        if self.st.aux_mapped
            && let Err(e) = fw::unmap_icm_aux(&mut self.cmd)
        {
            mlx4_warn!(pci, "UNMAP_ICM_AUX failed ({})", e.to_errno());
        }
        self.aux_icm = None;
        if self.st.fa_mapped
            && let Err(e) = fw::unmap_fa(&mut self.cmd)
        {
            mlx4_warn!(pci, "UNMAP_FA failed ({})", e.to_errno());
        }
        self.fw_icm = None;
        if self.st.owned
            && let Some(b) = self.bar0.as_ref()
        {
            crate::reset::free_ownership(b, &*self.clock);
        }
        if let Some(pdev) = self.pdev.as_ref() {
            if let Some(b) = self.bar0.take() {
                pdev.release_bar(0, b);
            }
            if let Some(b) = self.uar_bar.take() {
                pdev.release_bar(2, b);
            }
            // pci_disable_device: no more DMA or MMIO decoding (and INTx
            // as it was before the probe).
            if self.enabled_here {
                pdev.clear_command_bits(
                    hal::pci::cfg::COMMAND_MASTER
                        | hal::pci::cfg::COMMAND_MEMORY
                        | hal::pci::cfg::COMMAND_INTX_DISABLE,
                );
            }
        }
        self.st = State {
            done: true,
            ..State::default()
        };
    }
}

impl Tables {
    /// The table part of `mlx4_remove_one` (`mlx4_cleanup_*_table` in
    /// reverse order of `mlx4_setup_hca`): the QP, EQ and MR tables tell the
    /// firmware; the others are memory, released when the device goes.
    fn cleanup(&mut self, hca: &mut Hca) {
        self.counters = None;
        self.qp.cleanup(hca);
        self.eq.cleanup(hca, &mut self.mr);
        self.mr.cleanup(hca);
    }
}

impl Dev {
    /// The port part of `mlx4_setup_hca`: per IB port, the default
    /// capability mask by MAD_IFC(PortInfo), then SET_PORT.
    fn setup_ports(&mut self) -> Result<()> {
        let pci = self.hca.pci;
        for port in 1..=self.hca.caps.num_ports {
            if self.hca.caps.port[usize::from(port)].port_type != PortType::Ib {
                continue;
            }
            let cap = match self.get_port_ib_caps(port) {
                Ok(c) => c,
                Err(e @ (Error::CmdTimeout { .. } | Error::CmdBusy { .. })) => return Err(e),
                Err(e) => {
                    mlx4_warn!(
                        pci,
                        "failed to get port {port} default ib capabilities ({}). Continuing with caps = 0",
                        e.to_errno()
                    );
                    0
                }
            };
            let pc = &mut self.hca.caps.port[usize::from(port)];
            pc.ib_port_def_cap = cap;
            pc.port_ib_mtu = mlx4_hw::port::IB_MTU_4096 as u8;
            self.set_port(port)
                .inspect_err(|_| mlx4_err!(pci, "Failed to set port {port}, aborting"))?;
        }
        Ok(())
    }

    /// Linux `mlx4_register_device`: the device is ready for interfaces;
    /// catastrophic-error polling starts.
    fn register_device(&mut self) {
        self.hca.st.registered = true;
        self.start_catas_poll();
        let c = &self.hca.caps;
        mlx4_info!(
            self.hca.pci,
            "ConnectX-3 ready: fw_ver {}, board_id {}, {} port(s), {} QPs, {} CQs, {} MPTs, ICM {} KB mapped",
            FwVer(c.fw_ver),
            self.hca.board_id(),
            c.num_ports,
            c.num_qps,
            c.num_cqs,
            c.num_mpts,
            self.hca.icm_mapped_bytes() >> 10
        );
    }

    /// Linux `mlx4_remove_one` (and the error unwinding of
    /// `__mlx4_init_one`): releases, in reverse order, whatever bring-up did.
    fn unwind(&mut self) {
        if self.hca.st.done {
            return;
        }
        let pci = self.hca.pci;
        if self.hca.st.registered {
            self.stop_catas_poll();
            self.unregister_device();
            // Linux issues CLOSE_PORT for every port and ignores the status;
            // only ports mlx4_ib opened (INIT_PORT) are closed here, so the
            // firmware is never asked to close a port that is not open.
            for port in 1..=self.hca.caps.num_ports {
                if self.port_open[usize::from(port)] {
                    self.port_open[usize::from(port)] = false;
                    if let Err(e) = fw::close_port(&mut self.hca.cmd, port) {
                        mlx4_warn!(pci, "CLOSE_PORT {port} failed ({})", e.to_errno());
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
            mlx4_warn!(
                pci,
                "reclaimed leaked objects: {} QPs, {} SRQs, {} CQs, {} MRs",
                leaked[0],
                leaked[1],
                leaked[2],
                leaked[3]
            );
        }
        self.tables.cleanup(&mut self.hca);
        self.db_pages = DbPages::default();
        self.catas = Catas::default();
        self.hca.unwind();
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
        mlx4_info!(self.hca.pci, "removing device");
        self.unwind();
        match self.hca.pdev.take() {
            Some(p) => p,
            None => unreachable!("the PCI function is only taken here"),
        }
    }

    /// Linux `mlx4_counter_alloc`: a flow counter index (devices with
    /// counters only).
    #[doc(alias = "mlx4_counter_alloc")]
    pub fn counter_alloc(&mut self) -> Result<u32> {
        self.tables
            .counters
            .as_mut()
            .ok_or(Error::Unsupported)?
            .alloc()
    }

    /// Linux `mlx4_counter_free`.
    #[doc(alias = "mlx4_counter_free")]
    pub fn counter_free(&mut self, idx: u32) {
        if let Some(c) = self.tables.counters.as_mut() {
            c.free(idx);
        }
    }

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
            if let Err(e) = issue(&mut self.hca.cmd, id) {
                mlx4_warn!(self.hca.pci, "{what} {id:#x} failed ({})", e.to_errno());
            }
        }
        ids.len()
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        self.unwind();
    }
}
