//! The HCA-level firmware commands and the parsing of what they report, as Linux's `fw.c` has them.
//!
//! Linux: `fw.c` (QUERY_FW, MAP_FA/UNMAP_FA, RUN_FW, MOD_STAT_CFG,
//! QUERY_DEV_CAP with QUERY_PORT, SET_ICM_SIZE, MAP/UNMAP_ICM_AUX, INIT_HCA,
//! QUERY_HCA, QUERY_ADAPTER, CLOSE_HCA, INIT_PORT, CLOSE_PORT, NOP). SR-IOV
//! QUERY_FUNC_CAP, Wake-on-LAN and old-firmware INIT_PORT mailboxes are left
//! out.
//!
//! Every QUERY_DEV_CAP value is validated before use ([`DevCap::validate`]):
//! a device reporting absurd or inconsistent capabilities gets
//! [`Error::BadCaps`] naming Linux's field, never a shift overflow.

use hal::DmaPool;
use hal::be::*;
use mlx4_hw::cmd::{Opcode, timeout};
use mlx4_hw::fw::*;

use crate::cmd::{Cmd, Mailbox};
use crate::dev::MAX_PORTS;
use crate::{Error, Result, mlx4_dbg, mlx4_err, mlx4_info};

/// What QUERY_FW reports (Linux `struct mlx4_fw` plus `caps.fw_ver`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FwInfo {
    /// major<<32 | minor<<16 | subminor (Linux `caps.fw_ver`).
    pub fw_ver: u64,
    /// Command interface revision.
    pub cmd_if_rev: u16,
    /// log2 of the number of outstanding commands (event mode).
    pub max_cmds: u32,
    /// Pages of the firmware area (for MAP_FA).
    pub fw_pages: u32,
    /// Clear-interrupt register (INTx only; unused when polled).
    pub clr_int_base: u64,
    #[allow(missing_docs)]
    pub clr_int_bar: u8,
    /// Catastrophic error buffer: offset, size in dwords, BAR.
    pub catas_offset: u64,
    #[allow(missing_docs)]
    pub catas_size: u32,
    #[allow(missing_docs)]
    pub catas_bar: u8,
}

/// Formats a firmware version as Linux prints it (`%d.%d.%03d`).
pub struct FwVer(pub u64);

impl core::fmt::Display for FwVer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{}.{}.{:03}",
            (self.0 >> 32) & 0xffff,
            (self.0 >> 16) & 0xffff,
            self.0 & 0xffff
        )
    }
}

/// Linux `mlx4_QUERY_FW`.
pub fn query_fw(cmd: &mut Cmd, pool: &DmaPool, pci: &hal::PciAddress) -> Result<FwInfo> {
    use query_fw::*;
    let mb = Mailbox::new(pool)?;
    cmd.cmd_box(0, mb.dma(), 0, 0, Opcode::QUERY_FW, timeout::CLASS_A)?;
    let o: [u8; OUT_SIZE] = mb.read();
    let mut fw = FwInfo {
        fw_ver: fw_ver_from_raw(get_be64(&o, VER_OFFSET)),
        ..Default::default()
    };
    fw.cmd_if_rev = get_be16(&o, CMD_IF_REV_OFFSET);
    if !(COMMAND_INTERFACE_MIN_REV..=COMMAND_INTERFACE_MAX_REV).contains(&fw.cmd_if_rev) {
        mlx4_err!(
            pci,
            "Installed FW has unsupported command interface revision {}.",
            fw.cmd_if_rev
        );
        mlx4_err!(pci, "(Installed FW version is {})", FwVer(fw.fw_ver));
        mlx4_err!(
            pci,
            "This driver version supports only revisions {COMMAND_INTERFACE_MIN_REV} to {COMMAND_INTERFACE_MAX_REV}."
        );
        return Err(Error::BadCaps {
            field: "cmd_if_rev",
            value: u64::from(fw.cmd_if_rev),
        });
    }
    if fw.cmd_if_rev < COMMAND_INTERFACE_NEW_PORT_CMDS {
        // Old port commands (QUERY_DEV_CAP per-port fields, INIT_PORT
        // mailbox) belong to pre-ConnectX-3 firmware.
        return Err(Error::Unsupported);
    }
    let lg = get_u8(&o, MAX_CMD_OFFSET);
    fw.max_cmds = 1u32.checked_shl(u32::from(lg)).unwrap_or(0);
    mlx4_dbg!(
        pci,
        "FW version {} (cmd intf rev {}), max commands {}",
        FwVer(fw.fw_ver),
        fw.cmd_if_rev,
        fw.max_cmds
    );
    fw.catas_offset = get_be64(&o, ERR_START_OFFSET);
    fw.catas_size = get_be32(&o, ERR_SIZE_OFFSET);
    fw.catas_bar = bar_index(get_u8(&o, ERR_BAR_OFFSET));
    mlx4_dbg!(
        pci,
        "Catastrophic error buffer at {:#x}, size {:#x}, BAR {}",
        fw.catas_offset,
        fw.catas_size,
        fw.catas_bar
    );
    fw.fw_pages = u32::from(get_be16(&o, SIZE_OFFSET));
    fw.clr_int_base = get_be64(&o, CLR_INT_BASE_OFFSET);
    fw.clr_int_bar = bar_index(get_u8(&o, CLR_INT_BAR_OFFSET));
    mlx4_dbg!(pci, "FW size {} KB", u64::from(fw.fw_pages) << 2);
    mlx4_dbg!(
        pci,
        "Clear int @ {:x}, BAR {}",
        fw.clr_int_base,
        fw.clr_int_bar
    );
    if fw.fw_pages == 0 {
        return Err(Error::BadCaps {
            field: "fw_pages",
            value: 0,
        });
    }
    Ok(fw)
}

/// Linux `mlx4_UNMAP_FA`.
pub fn unmap_fa(cmd: &mut Cmd) -> Result<()> {
    cmd.cmd(0, 0, 0, Opcode::UNMAP_FA, timeout::CLASS_B)
}

/// Linux `mlx4_RUN_FW`.
pub fn run_fw(cmd: &mut Cmd) -> Result<()> {
    cmd.cmd(0, 0, 0, Opcode::RUN_FW, timeout::CLASS_A)
}

/// Linux `mlx4_MOD_STAT_CFG` with `log_pg_sz_m = 1, log_pg_sz = 0` (4 KiB
/// pages), as `mlx4_init_hca` issues it.
pub fn mod_stat_cfg(cmd: &mut Cmd, pool: &DmaPool) -> Result<()> {
    let mb = Mailbox::new(pool)?;
    let mut b = [0u8; mod_stat_cfg::IN_SIZE];
    b[mod_stat_cfg::PG_SZ_M_OFFSET] = 1;
    b[mod_stat_cfg::PG_SZ_OFFSET] = 0;
    mb.write(0, &b);
    cmd.cmd(mb.dma(), 0, 0, Opcode::MOD_STAT_CFG, timeout::CLASS_A)
}

/// Linux `mlx4_SENSE_PORT`: the type the firmware senses on `port` (`None`
/// when it senses nothing); a value above 2 is refused as Linux does.
#[doc(alias = "mlx4_SENSE_PORT")]
pub fn sense_port(
    cmd: &mut Cmd,
    port: u8,
    pci: &hal::PciAddress,
) -> Result<Option<crate::dev::PortType>> {
    let v = cmd
        .cmd_imm(0, u32::from(port), 0, Opcode::SENSE_PORT, timeout::CLASS_B)
        .inspect_err(|_| mlx4_err!(pci, "Sense command failed for port: {port}"))?;
    match v {
        0 => Ok(None),
        1 => Ok(Some(crate::dev::PortType::Ib)),
        2 => Ok(Some(crate::dev::PortType::Eth)),
        _ => {
            mlx4_err!(pci, "Sense returned illegal value: {v:#x}");
            Err(Error::BadCaps {
                field: "sense_port",
                value: v,
            })
        }
    }
}

/// Per-port capabilities from QUERY_PORT.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct PortCap {
    pub supported_port_types: u8,
    /// QUERY_PORT byte 0 bit 3: the firmware suggests Ethernet.
    pub suggested_eth: bool,
    /// QUERY_PORT byte 0 bit 4: sense the port's type at start.
    pub default_sense: bool,
    pub ib_mtu: u8,
    pub max_port_width: u8,
    pub max_gids: u32,
    pub max_pkeys: u32,
    pub max_vl: u8,
    pub log_max_macs: u8,
    pub log_max_vlans: u8,
    pub eth_mtu: u16,
    pub def_mac: u64,
}

/// QUERY_DEV_CAP decoded (Linux `struct mlx4_dev_cap`), before validation.
/// Counts derived from log2 fields are kept as `u64` so that an absurd log
/// cannot overflow before [`DevCap::validate`] looks at it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct DevCap {
    pub max_srq_sz: u64,
    pub max_qp_sz: u64,
    pub reserved_qps: u64,
    pub max_qps: u64,
    pub reserved_srqs: u64,
    pub max_srqs: u64,
    pub max_cq_sz: u64,
    pub reserved_cqs: u64,
    pub max_cqs: u64,
    pub max_mpts: u64,
    pub reserved_eqs: u32,
    pub max_eqs: u32,
    pub reserved_mtts: u64,
    pub max_mrw_sz: u64,
    pub reserved_mrws: u64,
    pub max_mtt_seg: u64,
    pub max_requester_per_qp: u64,
    pub max_responder_per_qp: u64,
    pub max_gso_sz: u64,
    pub max_rdma_global: u64,
    pub local_ca_ack_delay: u8,
    pub num_ports: u8,
    pub max_msg_sz: u64,
    pub stat_rate_support: u16,
    pub cq_timestamp: bool,
    pub flags: u64,
    pub reserved_uars: u32,
    pub uar_size: u64,
    pub min_page_sz: u64,
    pub bf_reg_size: u32,
    pub bf_regs_per_page: u32,
    pub max_sq_sg: u32,
    pub max_sq_desc_sz: u32,
    pub max_rq_sg: u32,
    pub max_rq_desc_sz: u32,
    pub max_qp_per_mcg: u64,
    pub reserved_mgms: u32,
    pub max_mcgs: u64,
    pub reserved_pds: u32,
    pub max_pds: u64,
    pub reserved_xrcds: u32,
    pub max_xrcds: u64,
    pub max_counters: u32,
    pub rdmarc_entry_sz: u32,
    pub qpc_entry_sz: u32,
    pub aux_entry_sz: u32,
    pub altc_entry_sz: u32,
    pub eqc_entry_sz: u32,
    pub cqc_entry_sz: u32,
    pub srq_entry_sz: u32,
    pub cmpt_entry_sz: u32,
    pub mtt_entry_sz: u32,
    pub dmpt_entry_sz: u32,
    pub bmme_flags: u32,
    pub reserved_lkey: u32,
    pub max_icm_sz: u64,
    pub port: [PortCap; MAX_PORTS + 1],
}

fn pow2(log: u32) -> u64 {
    1u64.checked_shl(log).unwrap_or(0)
}

impl DevCap {
    /// Decodes a QUERY_DEV_CAP output mailbox (Linux's `MLX4_GET` list).
    pub fn parse(o: &[u8]) -> DevCap {
        use dev_cap::*;
        let f = |off| u32::from(get_u8(o, off));
        let mut d = DevCap {
            reserved_qps: pow2(f(RSVD_QP) & 0xf),
            max_qps: pow2(f(MAX_QP) & 0x1f),
            reserved_srqs: pow2(f(RSVD_SRQ) >> 4),
            max_srqs: pow2(f(MAX_SRQ) & 0x1f),
            max_cq_sz: pow2(f(MAX_CQ_SZ)),
            reserved_cqs: pow2(f(RSVD_CQ) & 0xf),
            max_cqs: pow2(f(MAX_CQ) & 0x1f),
            max_mpts: pow2(f(MAX_MPT) & 0x3f),
            reserved_eqs: f(RSVD_EQ) & 0xf,
            max_eqs: 1 << (f(MAX_EQ) & 0xf),
            reserved_mtts: pow2(f(RSVD_MTT) >> 4),
            max_mrw_sz: pow2(f(MAX_MRW_SZ)),
            reserved_mrws: pow2(f(RSVD_MRW) & 0xf),
            max_mtt_seg: pow2(f(MAX_MTT_SEG) & 0x3f),
            max_requester_per_qp: pow2(f(MAX_REQ_QP) & 0x3f),
            max_responder_per_qp: pow2(f(MAX_RES_QP) & 0x3f),
            max_gso_sz: match f(MAX_GSO) & 0x1f {
                0 => 0,
                x => pow2(x),
            },
            max_rdma_global: pow2(f(MAX_RDMA) & 0x3f),
            local_ca_ack_delay: (f(ACK_DELAY) & 0x1f) as u8,
            num_ports: (f(VL_PORT) & 0xf) as u8,
            max_msg_sz: pow2(f(MAX_MSG_SZ) & 0x1f),
            stat_rate_support: get_be16(o, RATE_SUPPORT),
            cq_timestamp: f(CQ_TS_SUPPORT) & 0x80 != 0,
            flags: u64::from(get_be32(o, FLAGS)) | (u64::from(get_be32(o, EXT_FLAGS)) << 32),
            reserved_uars: f(RSVD_UAR) >> 4,
            uar_size: pow2((f(UAR_SZ) & 0x3f) + 20),
            min_page_sz: pow2(f(PAGE_SZ)),
            max_sq_sg: f(MAX_SG_SQ),
            max_sq_desc_sz: u32::from(get_be16(o, MAX_DESC_SZ_SQ)),
            max_rq_sg: f(MAX_SG_RQ),
            max_rq_desc_sz: u32::from(get_be16(o, MAX_DESC_SZ_RQ)),
            max_qp_per_mcg: pow2(f(MAX_QP_MCG)),
            reserved_mgms: f(RSVD_MCG) & 0xf,
            max_mcgs: pow2(f(MAX_MCG)),
            reserved_pds: f(RSVD_PD) >> 4,
            max_pds: pow2(f(MAX_PD) & 0x3f),
            reserved_xrcds: f(RSVD_XRC) >> 4,
            max_xrcds: pow2(f(MAX_XRC) & 0x1f),
            rdmarc_entry_sz: u32::from(get_be16(o, RDMARC_ENTRY_SZ)),
            qpc_entry_sz: u32::from(get_be16(o, QPC_ENTRY_SZ)),
            aux_entry_sz: u32::from(get_be16(o, AUX_ENTRY_SZ)),
            altc_entry_sz: u32::from(get_be16(o, ALTC_ENTRY_SZ)),
            eqc_entry_sz: u32::from(get_be16(o, EQC_ENTRY_SZ)),
            cqc_entry_sz: u32::from(get_be16(o, CQC_ENTRY_SZ)),
            srq_entry_sz: u32::from(get_be16(o, SRQ_ENTRY_SZ)),
            cmpt_entry_sz: u32::from(get_be16(o, C_MPT_ENTRY_SZ)),
            mtt_entry_sz: u32::from(get_be16(o, MTT_ENTRY_SZ)),
            dmpt_entry_sz: u32::from(get_be16(o, D_MPT_ENTRY_SZ)),
            max_srq_sz: pow2(f(MAX_SRQ_SZ)),
            max_qp_sz: pow2(f(MAX_QP_SZ)),
            bmme_flags: get_be32(o, BMME_FLAGS),
            reserved_lkey: get_be32(o, RSVD_LKEY),
            max_icm_sz: get_be64(o, MAX_ICM_SZ),
            ..Default::default()
        };
        if f(BF) & 0x80 != 0 {
            d.bf_reg_size = 1 << (f(LOG_BF_REG_SZ) & 0x1f);
            let mut field = f(LOG_MAX_BF_REGS_PER_PAGE) & 0x3f;
            // Firmware may report a count instead of a log (Linux clamps).
            if d.bf_reg_size == 0 || u64::from(4096 / d.bf_reg_size.max(1)) < pow2(field) {
                field = 3;
            }
            d.bf_regs_per_page = 1 << field;
        }
        if d.flags & dev_cap_flags::COUNTERS != 0 {
            d.max_counters = get_be32(o, MAX_COUNTERS);
        }
        d
    }

    /// Decodes one QUERY_PORT output into `port[p]`.
    pub fn parse_port(&mut self, p: usize, o: &[u8]) {
        use query_port::*;
        let f = |off| get_u8(o, off);
        self.port[p] = PortCap {
            supported_port_types: f(SUPPORTED_TYPE) & 3,
            suggested_eth: f(SUPPORTED_TYPE) & 0x08 != 0,
            default_sense: f(SUPPORTED_TYPE) & 0x10 != 0,
            ib_mtu: f(MTU) & 0xf,
            max_port_width: f(WIDTH) & 0xf,
            max_gids: 1 << (f(MAX_GID_PKEY) >> 4),
            max_pkeys: 1 << (f(MAX_GID_PKEY) & 0xf),
            max_vl: f(MAX_VL) & 0xf,
            log_max_macs: f(MAX_MACVLAN) & 0xf,
            log_max_vlans: f(MAX_MACVLAN) >> 4,
            eth_mtu: get_be16(o, ETH_MTU),
            def_mac: get_be64(o, MAC),
        };
    }

    /// Rejects absurd or inconsistent values with the Linux field name.
    /// `uar_bar_len` is the size of BAR2.
    pub fn validate(&self, uar_bar_len: u64) -> Result<()> {
        let bad = |field, value: u64| Err(Error::BadCaps { field, value });
        // Counts the driver derives numbers from must be powers of two within
        // the hardware's index widths.
        let limits: [(&'static str, u64, u64); 9] = [
            ("max_qps", self.max_qps, 1 << 23),
            ("max_srqs", self.max_srqs, 1 << 24),
            ("max_cqs", self.max_cqs, 1 << 24),
            ("max_mpts", self.max_mpts, 1 << 32),
            ("max_cq_sz", self.max_cq_sz, 1 << 24),
            ("max_qp_sz", self.max_qp_sz, 1 << 16),
            ("max_srq_sz", self.max_srq_sz, 1 << 16),
            ("max_mrw_sz", self.max_mrw_sz, 1 << 63),
            ("max_msg_sz", self.max_msg_sz, 1 << 31),
        ];
        for (name, v, max) in limits {
            if v == 0 || v > max {
                return bad(name, v);
            }
        }
        if self.num_ports == 0 || usize::from(self.num_ports) > MAX_PORTS {
            log::error!(
                "HCA has {} ports, but we only support {}, aborting.",
                self.num_ports,
                MAX_PORTS
            );
            return bad("num_ports", u64::from(self.num_ports));
        }
        if self.min_page_sz == 0 || self.min_page_sz > 4096 {
            log::error!(
                "HCA minimum page size of {} bigger than kernel PAGE_SIZE of 4096, aborting.",
                self.min_page_sz
            );
            return bad("min_page_sz", self.min_page_sz);
        }
        if self.uar_size == 0 || self.uar_size > uar_bar_len {
            log::error!(
                "HCA reported UAR size of {:#x} bigger than PCI resource 2 size of {:#x}, aborting.",
                self.uar_size,
                uar_bar_len
            );
            return bad("uar_size", self.uar_size);
        }
        if self.uar_size / 4096 <= 128 {
            log::error!(
                "Only {} UAR pages (need more than 128)",
                self.uar_size / 4096
            );
            return bad("uar_size", self.uar_size);
        }
        if self.reserved_qps >= self.max_qps {
            return bad("reserved_qps", self.reserved_qps);
        }
        if self.reserved_srqs >= self.max_srqs {
            return bad("reserved_srqs", self.reserved_srqs);
        }
        if self.reserved_cqs >= self.max_cqs {
            return bad("reserved_cqs", self.reserved_cqs);
        }
        if self.reserved_mrws >= self.max_mpts {
            return bad("reserved_mrws", self.reserved_mrws);
        }
        if u64::from(self.reserved_pds) >= self.max_pds {
            return bad("reserved_pds", u64::from(self.reserved_pds));
        }
        // After the UAR adjustment (4 EQ doorbells per reserved UAR page), a
        // completion and an async EQ must still fit under MAX_MSIX.
        let rsvd_eqs = self.reserved_eqs.max(self.reserved_uars * 4);
        if rsvd_eqs + 2 > self.max_eqs.min(crate::profile::MAX_MSIX) {
            return bad("reserved_eqs", u64::from(rsvd_eqs));
        }
        if self.max_rq_sg == 0 {
            return bad("max_rq_sg", 0);
        }
        if self.mtt_entry_sz != 8 {
            return bad("mtt_entry_sz", u64::from(self.mtt_entry_sz));
        }
        let entries: [(&'static str, u32); 9] = [
            ("rdmarc_entry_sz", self.rdmarc_entry_sz),
            ("qpc_entry_sz", self.qpc_entry_sz),
            ("aux_entry_sz", self.aux_entry_sz),
            ("altc_entry_sz", self.altc_entry_sz),
            ("eqc_entry_sz", self.eqc_entry_sz),
            ("cqc_entry_sz", self.cqc_entry_sz),
            ("srq_entry_sz", self.srq_entry_sz),
            ("cmpt_entry_sz", self.cmpt_entry_sz),
            ("dmpt_entry_sz", self.dmpt_entry_sz),
        ];
        for (name, v) in entries {
            if v == 0 || !v.is_power_of_two() || v > 4096 {
                return bad(name, u64::from(v));
            }
        }
        if self.max_icm_sz == 0 {
            return bad("max_icm_sz", 0);
        }
        if self.max_counters > 1 << 24 {
            return bad("max_counters", u64::from(self.max_counters));
        }
        for p in 1..=usize::from(self.num_ports) {
            let pc = &self.port[p];
            if pc.supported_port_types & 1 != 0 && !(1..=5).contains(&pc.ib_mtu) {
                return bad("ib_mtu", u64::from(pc.ib_mtu));
            }
        }
        Ok(())
    }
}

/// Linux `mlx4_QUERY_DEV_CAP` (with QUERY_PORT per port, command interface
/// revision >= 3).
pub fn query_dev_cap(cmd: &mut Cmd, pool: &DmaPool, pci: &hal::PciAddress) -> Result<DevCap> {
    let mb = Mailbox::new(pool)?;
    cmd.cmd_box(0, mb.dma(), 0, 0, Opcode::QUERY_DEV_CAP, timeout::CLASS_A)?;
    let o: [u8; dev_cap::OUT_SIZE] = mb.read();
    let mut d = DevCap::parse(&o);
    if d.bf_reg_size != 0 {
        mlx4_dbg!(
            pci,
            "BlueFlame available (reg size {}, regs/page {})",
            d.bf_reg_size,
            d.bf_regs_per_page
        );
    } else {
        mlx4_dbg!(pci, "BlueFlame not available");
    }
    let nports = usize::from(d.num_ports).min(MAX_PORTS);
    for p in 1..=nports {
        mb.clear(4096);
        cmd.cmd_box(
            0,
            mb.dma(),
            p as u32,
            0,
            Opcode::QUERY_PORT,
            timeout::CLASS_B,
        )?;
        let po: [u8; 0x40] = mb.read();
        d.parse_port(p, &po);
    }
    // Each UAR page holds 4 EQ doorbells: EQs on a reserved page are reserved.
    d.reserved_eqs = d.reserved_eqs.max(d.reserved_uars.saturating_mul(4));
    mlx4_dbg!(
        pci,
        "Base MM extensions: flags {:08x}, rsvd L_Key {:08x}",
        d.bmme_flags,
        d.reserved_lkey
    );
    mlx4_dbg!(pci, "Max ICM size {} MB", d.max_icm_sz >> 20);
    mlx4_dbg!(
        pci,
        "Max QPs: {}, reserved QPs: {}, entry size: {}",
        d.max_qps,
        d.reserved_qps,
        d.qpc_entry_sz
    );
    mlx4_dbg!(
        pci,
        "Max SRQs: {}, reserved SRQs: {}, entry size: {}",
        d.max_srqs,
        d.reserved_srqs,
        d.srq_entry_sz
    );
    mlx4_dbg!(
        pci,
        "Max CQs: {}, reserved CQs: {}, entry size: {}",
        d.max_cqs,
        d.reserved_cqs,
        d.cqc_entry_sz
    );
    mlx4_dbg!(
        pci,
        "Max EQs: {}, reserved EQs: {}, entry size: {}",
        d.max_eqs,
        d.reserved_eqs,
        d.eqc_entry_sz
    );
    mlx4_dbg!(
        pci,
        "reserved MPTs: {}, reserved MTTs: {}",
        d.reserved_mrws,
        d.reserved_mtts
    );
    mlx4_dbg!(
        pci,
        "Max PDs: {}, reserved PDs: {}, reserved UARs: {}",
        d.max_pds,
        d.reserved_pds,
        d.reserved_uars
    );
    mlx4_dbg!(
        pci,
        "Max CQEs: {}, max WQEs: {}, max SRQ WQEs: {}",
        d.max_cq_sz,
        d.max_qp_sz,
        d.max_srq_sz
    );
    mlx4_dbg!(
        pci,
        "Local CA ACK delay: {}, max MTU: {}, port width cap: {}",
        d.local_ca_ack_delay,
        128u32 << d.port[1].ib_mtu.min(7),
        d.port[1].max_port_width
    );
    Ok(d)
}

/// Linux `mlx4_SET_ICM_SIZE`: returns the number of aux pages the firmware
/// needs.
pub fn set_icm_size(cmd: &mut Cmd, icm_size: u64) -> Result<u64> {
    cmd.cmd_imm(icm_size, 0, 0, Opcode::SET_ICM_SIZE, timeout::CLASS_A)
}

/// Linux `mlx4_UNMAP_ICM_AUX`.
pub fn unmap_icm_aux(cmd: &mut Cmd) -> Result<()> {
    cmd.cmd(0, 0, 0, Opcode::UNMAP_ICM_AUX, timeout::CLASS_B)
}

/// Linux `mlx4_INIT_HCA`.
pub fn init_hca(
    cmd: &mut Cmd,
    pool: &DmaPool,
    param: &InitHcaParam,
    pci: &hal::PciAddress,
) -> Result<()> {
    let mb = Mailbox::new(pool)?;
    mb.write(0, &param.to_bytes());
    let r = cmd.cmd(mb.dma(), 0, 0, Opcode::INIT_HCA, timeout::INIT_HCA);
    if let Err(e) = &r {
        mlx4_err!(pci, "INIT_HCA returns {}", e.to_errno());
    }
    r
}

/// Linux `mlx4_QUERY_HCA`, reduced to the HCA core clock (MHz) used for CQ
/// timestamps.
pub fn query_hca_core_clock(cmd: &mut Cmd, pool: &DmaPool) -> Result<u16> {
    let mb = Mailbox::new(pool)?;
    cmd.cmd_box(0, mb.dma(), 0, 0, Opcode::QUERY_HCA, timeout::CLASS_B)?;
    let o: [u8; 0x20] = mb.read();
    Ok(get_be16(&o, init_hca::CORE_CLOCK_OFFSET))
}

/// What QUERY_ADAPTER reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adapter {
    /// INTx pin (unused when polled).
    pub inta_pin: u8,
    /// Board id string, NUL padded.
    pub board_id: [u8; 16],
}

/// Linux `mlx4_QUERY_ADAPTER`.
pub fn query_adapter(cmd: &mut Cmd, pool: &DmaPool) -> Result<Adapter> {
    let mb = Mailbox::new(pool)?;
    cmd.cmd_box(0, mb.dma(), 0, 0, Opcode::QUERY_ADAPTER, timeout::CLASS_A)?;
    let o: [u8; 0x120] = mb.read();
    Ok(Adapter {
        inta_pin: get_u8(&o, query_adapter::INTA_PIN),
        board_id: board_id(&o),
    })
}

/// Linux `mlx4_CLOSE_HCA`.
pub fn close_hca(cmd: &mut Cmd, panic: bool) -> Result<()> {
    cmd.cmd(0, 0, u8::from(panic), Opcode::CLOSE_HCA, timeout::CLOSE)
}

/// Linux `mlx4_INIT_PORT` (command interface revision >= 3: no mailbox).
pub fn init_port(cmd: &mut Cmd, port: u8) -> Result<()> {
    cmd.cmd(0, u32::from(port), 0, Opcode::INIT_PORT, timeout::CLASS_A)
}

/// Linux `mlx4_CLOSE_PORT`.
pub fn close_port(cmd: &mut Cmd, port: u8) -> Result<()> {
    cmd.cmd(0, u32::from(port), 0, Opcode::CLOSE_PORT, timeout::CLOSE)
}

/// Linux `mlx4_NOP`: in_mod 0x1f = "finish as soon as possible".
pub fn nop(cmd: &mut Cmd) -> Result<()> {
    cmd.cmd(0, 0x1f, 0, Opcode::NOP, timeout::NOP)
}

/// Logs the firmware version the way `mlx4_core` does at probe.
pub fn log_fw(pci: &hal::PciAddress, fw: &FwInfo) {
    mlx4_info!(
        pci,
        "FW version {} (cmd intf rev {})",
        FwVer(fw.fw_ver),
        fw.cmd_if_rev
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> [u8; 0x100] {
        use dev_cap::*;
        let mut o = [0u8; 0x100];
        o[MAX_SRQ_SZ] = 15;
        o[MAX_QP_SZ] = 14;
        o[RSVD_QP] = 6;
        o[MAX_QP] = 18;
        o[RSVD_SRQ] = 6 << 4;
        o[MAX_SRQ] = 16;
        o[MAX_CQ_SZ] = 22;
        o[RSVD_CQ] = 7;
        o[MAX_CQ] = 16;
        o[MAX_MPT] = 20;
        o[RSVD_EQ] = 4;
        o[MAX_EQ] = 9;
        o[RSVD_MTT] = 4 << 4;
        o[MAX_MRW_SZ] = 40;
        o[RSVD_MRW] = 4;
        o[MAX_MTT_SEG] = 24;
        o[VL_PORT] = 2;
        o[MAX_MSG_SZ] = 30;
        o[RSVD_UAR] = 1 << 4;
        o[UAR_SZ] = 3;
        o[PAGE_SZ] = 12;
        o[MAX_SG_RQ] = 32;
        o[RSVD_PD] = 4 << 4;
        o[MAX_PD] = 17;
        for (off, v) in [
            (RDMARC_ENTRY_SZ, 32u16),
            (QPC_ENTRY_SZ, 256),
            (AUX_ENTRY_SZ, 64),
            (ALTC_ENTRY_SZ, 64),
            (EQC_ENTRY_SZ, 64),
            (CQC_ENTRY_SZ, 64),
            (SRQ_ENTRY_SZ, 64),
            (C_MPT_ENTRY_SZ, 64),
            (MTT_ENTRY_SZ, 8),
            (D_MPT_ENTRY_SZ, 64),
        ] {
            put_be16(&mut o, off, v);
        }
        put_be64(&mut o, MAX_ICM_SZ, 1 << 40);
        o
    }

    fn with_ports(o: &[u8]) -> DevCap {
        let mut d = DevCap::parse(o);
        let mut p = [0u8; 0x40];
        p[0] = 1;
        p[1] = 5;
        for i in 1..=2 {
            d.parse_port(i, &p);
        }
        d
    }

    #[test]
    fn parses_and_validates_a_connectx3() {
        let d = with_ports(&good());
        assert_eq!(d.max_qps, 1 << 18);
        assert_eq!(d.reserved_qps, 64);
        assert_eq!(d.reserved_srqs, 64);
        assert_eq!(d.uar_size, 8 << 20);
        assert_eq!(d.reserved_uars, 1);
        d.validate(8 << 20).unwrap();
        assert_eq!(d.port[1].max_pkeys, 1);
    }

    #[test]
    fn absurd_values_are_named() {
        use dev_cap::*;
        let cases: &[(usize, u8, &str)] = &[
            (MAX_QP, 0x1f, "max_qps"),
            (VL_PORT, 0, "num_ports"),
            (VL_PORT, 9, "num_ports"),
            (UAR_SZ, 0x3f, "uar_size"),
            (PAGE_SZ, 0xff, "min_page_sz"),
            (MAX_CQ_SZ, 0xff, "max_cq_sz"),
            (MAX_MRW_SZ, 200, "max_mrw_sz"),
            (MAX_QP, 6, "reserved_qps"),
            (MAX_EQ, 2, "reserved_eqs"),
            (MAX_EQ, 0, "reserved_eqs"),
            (QPC_ENTRY_SZ + 1, 3, "qpc_entry_sz"),
            (MTT_ENTRY_SZ + 1, 16, "mtt_entry_sz"),
        ];
        for &(off, v, name) in cases {
            let mut o = good();
            o[off] = v;
            match with_ports(&o).validate(8 << 20) {
                Err(Error::BadCaps { field, .. }) => assert_eq!(field, name, "offset {off:#x}"),
                r => panic!("offset {off:#x} value {v:#x}: {r:?}"),
            }
        }
    }

    #[test]
    fn fw_ver_prints_like_linux() {
        assert_eq!(
            FwVer((2 << 32) | (42 << 16) | 5000).to_string(),
            "2.42.5000"
        );
        assert_eq!(FwVer((2 << 32) | (9 << 16) | 8).to_string(), "2.9.008");
    }
}
