//! How many of each context the HCA gets and where each table lives in ICM, as Linux's `profile.c` lays it out.
//!
//! Linux: `profile.c` (`mlx4_make_profile`) and the `default_profile` of
//! `main.c`. The scaling of MTTs with system RAM is left out (the profile
//! states its MTT count).
//!
//! Two profiles are offered:
//!
//! * [`Profile::research`] (the default): 4096 QPs, 1024 SRQs, 1024 CQs,
//!   256 MCG entries, 16384 MPTs, 16384 MTT segments (131072 MTT entries,
//!   512 MiB registrable in 4 KiB pages). With ConnectX-3 entry sizes (QPC
//!   256 B, RDMARC 32 B x 16 per QP, others 64 B) the ICM address space is
//!   the 4 GiB cMPT area (virtual, never mapped whole) plus 6.1 MiB of
//!   tables; what bring-up actually maps is the 256 KiB chunks holding
//!   reserved entries, all EQ contexts and the whole MCG table: 2312 KiB
//!   (measured against the model; [`crate::Dev::icm_mapped_bytes`]), plus
//!   the firmware area and the aux area the firmware asks for.
//! * [`Profile::linux`]: Linux 3.11's `default_profile` (2^18 QPs, 2^16
//!   SRQs/CQs, 2^13 MCGs, 2^19 MPTs, 2^20 MTT segments): 4 GiB cMPT plus
//!   352 MiB of tables; 11016 KiB mapped at bring-up, 8 MiB of it the MCG
//!   table.

use crate::dev::{MAX_PORTS, PortType};
use crate::fw::DevCap;
use crate::{Error, Result, mlx4_dbg, mlx4_err};
use mlx4_hw::fw::InitHcaParam;

/// What to ask the HCA for (Linux `struct mlx4_profile` plus the module
/// parameters that shape the ICM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// Queue pairs.
    pub num_qp: u32,
    /// RDMA read/atomic responder resources per QP.
    pub rdmarc_per_qp: u32,
    /// Shared receive queues.
    pub num_srq: u32,
    /// Completion queues.
    pub num_cq: u32,
    /// Multicast group entries (MGM + AMGM).
    pub num_mcg: u32,
    /// Memory protection table entries (MRs).
    pub num_mpt: u32,
    /// MTT segments of 8 entries.
    pub num_mtt_segs: u32,
    /// log2 of the MGM entry size (`log_num_mgm_entry_size`, 10 in Linux).
    pub log_mgm_entry_size: u32,
    /// Keep Linux's Ethernet/FCoE QP regions at the top of the QP space
    /// (log_num_mac 7 per port, 64 Ki FC exchange QPs). Useless for an
    /// InfiniBand-only driver; on in [`Profile::linux`] for fidelity.
    pub eth_fc_qp_regions: bool,
    /// The type of each port that may be either (Linux's `port_type_array`
    /// module parameter), indexed by port - 1: `None` takes the type the
    /// card senses or suggests. A port of one type only ignores it.
    pub port_type: [Option<PortType>; MAX_PORTS],
}

impl Profile {
    /// The small default for a research kernel.
    pub const fn research() -> Profile {
        Profile {
            num_qp: 1 << 12,
            rdmarc_per_qp: 1 << 4,
            num_srq: 1 << 10,
            num_cq: 1 << 10,
            num_mcg: 1 << 8,
            num_mpt: 1 << 14,
            num_mtt_segs: 1 << 14,
            log_mgm_entry_size: 10,
            eth_fc_qp_regions: false,
            port_type: [None; MAX_PORTS],
        }
    }

    /// Linux 3.11's `default_profile`.
    pub const fn linux() -> Profile {
        Profile {
            num_qp: 1 << 18,
            rdmarc_per_qp: 1 << 4,
            num_srq: 1 << 16,
            num_cq: 1 << 16,
            num_mcg: 1 << 13,
            num_mpt: 1 << 19,
            num_mtt_segs: 1 << 20,
            log_mgm_entry_size: 10,
            eth_fc_qp_regions: true,
            port_type: [None; MAX_PORTS],
        }
    }
}

impl Profile {
    /// What Linux's `mlx4_verify_params` and INIT_HCA refuse, checked
    /// before the device is touched: `log_mgm_entry_size` outside 7..=12
    /// (`MLX4_MIN/MAX_MGM_LOG_ENTRY_SIZE`), `rdmarc_per_qp` not a power of
    /// two or above 128 (INIT_HCA's `log_rd_per_qp` has 3 bits). Counts are
    /// not refused: too small ones are raised above the firmware's reserved
    /// entries and too large ones lowered to the device's limits, both with
    /// a warning, and each table is rounded up to a power of two as Linux
    /// does.
    pub fn validate(&self) -> Result<()> {
        Error::check_range("log_mgm_entry_size", self.log_mgm_entry_size.into(), 7, 12)?;
        Error::check_pow2("rdmarc_per_qp", self.rdmarc_per_qp.into(), 128)
    }
}

impl Default for Profile {
    fn default() -> Self {
        Profile::research()
    }
}

/// Where the profile put things (the parts of Linux's `dev->caps` and
/// `priv` that `mlx4_make_profile` fills).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Layout {
    /// INIT_HCA parameters (bases and log sizes).
    pub init_hca: InitHcaParam,
    /// Total ICM virtual space.
    pub total_size: u64,
    /// Number of QPs, SRQs, CQs, EQs, MPTs, MTT entries.
    pub num_qps: u32,
    #[allow(missing_docs)]
    pub num_srqs: u32,
    #[allow(missing_docs)]
    pub num_cqs: u32,
    #[allow(missing_docs)]
    pub num_eqs: u32,
    #[allow(missing_docs)]
    pub num_mpts: u32,
    #[allow(missing_docs)]
    pub num_mtts: u32,
    /// MGM and AMGM entries.
    pub num_mgms: u32,
    #[allow(missing_docs)]
    pub num_amgms: u32,
    /// log2 of RDMARC entries per QP.
    pub rdmarc_shift: u32,
}

const RES_NAMES: [&str; 11] = [
    "QP", "RDMARC", "ALTC", "AUXC", "SRQ", "CQ", "EQ", "DMPT", "CMPT", "MTT", "MCG",
];
/// `MAX_MSIX`: Linux never asks for more EQs than this.
pub const MAX_MSIX: u32 = 64;
/// `MLX4_NUM_CMPTS`: 4 cMPT types x 2^24.
pub const NUM_CMPTS: u64 = 4 << 24;

/// Linux `mlx4_make_profile`: sizes every table (entries rounded up to a
/// power of two, at least one page), sorts them by decreasing size and packs
/// them from ICM address 0, each aligned to its size. All arithmetic is
/// checked: a profile or entry size that would overflow is an error, not a
/// wrap.
pub fn make_profile(p: &Profile, dc: &DevCap, pci: &hal::PciAddress) -> Result<Layout> {
    let too_big = |need| Error::ProfileTooBig {
        need,
        max: dc.max_icm_sz,
    };
    p.validate()?;
    let mgm_entry = 1u64 << p.log_mgm_entry_size;
    let num_eqs = dc.max_eqs.min(MAX_MSIX);
    let mtt_entries = u64::from(p.num_mtt_segs) << mlx4_hw::mr::LOG_MTTS_PER_SEG;
    let mut res: [(u64, u64, usize, u64, u32); 11] = [
        (u64::from(dc.qpc_entry_sz), u64::from(p.num_qp), 0, 0, 0),
        (
            u64::from(dc.rdmarc_entry_sz),
            u64::from(p.num_qp) * u64::from(p.rdmarc_per_qp),
            1,
            0,
            0,
        ),
        (u64::from(dc.altc_entry_sz), u64::from(p.num_qp), 2, 0, 0),
        (u64::from(dc.aux_entry_sz), u64::from(p.num_qp), 3, 0, 0),
        (u64::from(dc.srq_entry_sz), u64::from(p.num_srq), 4, 0, 0),
        (u64::from(dc.cqc_entry_sz), u64::from(p.num_cq), 5, 0, 0),
        (u64::from(dc.eqc_entry_sz), u64::from(num_eqs), 6, 0, 0),
        (u64::from(dc.dmpt_entry_sz), u64::from(p.num_mpt), 7, 0, 0),
        (u64::from(dc.cmpt_entry_sz), NUM_CMPTS, 8, 0, 0),
        (u64::from(dc.mtt_entry_sz), mtt_entries, 9, 0, 0),
        (mgm_entry, u64::from(p.num_mcg), 10, 0, 0),
    ];
    // (size, num, type, start, log_num)
    for r in res.iter_mut() {
        let num =
            r.1.max(1)
                .checked_next_power_of_two()
                .ok_or(too_big(u64::MAX))?;
        r.1 = num;
        r.4 = num.trailing_zeros();
        r.0 = r.0.checked_mul(num).ok_or(too_big(u64::MAX))?.max(4096);
    }
    // Stable sort by decreasing size, as Linux's bubble sort.
    res.sort_by_key(|r| core::cmp::Reverse(r.0));
    let mut total: u64 = 0;
    for (i, r) in res.iter_mut().enumerate() {
        r.3 = total;
        total = total.checked_add(r.0).ok_or(too_big(u64::MAX))?;
        if total > dc.max_icm_sz {
            mlx4_err!(
                pci,
                "Profile requires {total:#x} bytes; won't fit in {:#x} bytes of context memory.",
                dc.max_icm_sz
            );
            return Err(too_big(total));
        }
        mlx4_dbg!(
            pci,
            "  profile[{i:2}] ({:>6}): 2^{:02} entries @ {:#12x}, size {:#12x}",
            RES_NAMES[r.2],
            r.4,
            r.3,
            r.0
        );
    }
    mlx4_dbg!(pci, "HCA context memory: reserving {} KB", total >> 10);

    let mut l = Layout {
        total_size: total,
        ..Default::default()
    };
    let h = &mut l.init_hca;
    for &(_, num, ty, start, log) in &res {
        let num32 = u32::try_from(num).map_err(|_| too_big(total))?;
        match ty {
            0 => {
                l.num_qps = num32;
                h.qpc_base = start;
                h.log_num_qps = log as u8;
            }
            1 => {
                let mut shift = 0;
                while (u64::from(p.num_qp) << shift) < num {
                    shift += 1;
                }
                l.rdmarc_shift = shift;
                h.rdmarc_base = start;
                h.log_rd_per_qp = shift as u8;
            }
            2 => h.altc_base = start,
            3 => h.auxc_base = start,
            4 => {
                l.num_srqs = num32;
                h.srqc_base = start;
                h.log_num_srqs = log as u8;
            }
            5 => {
                l.num_cqs = num32;
                h.cqc_base = start;
                h.log_num_cqs = log as u8;
            }
            6 => {
                l.num_eqs = num32;
                h.eqc_base = start;
                h.log_num_eqs = log as u8;
            }
            7 => {
                l.num_mpts = num32;
                h.dmpt_base = start;
                h.log_mpt_sz = log as u8;
            }
            8 => h.cmpt_base = start,
            9 => {
                l.num_mtts = num32;
                h.mtt_base = start;
            }
            _ => {
                h.mc_base = start;
                h.log_mc_entry_sz = mgm_entry.trailing_zeros() as u16;
                h.log_mc_table_sz = log as u8;
                h.log_mc_hash_sz = log.saturating_sub(1) as u16;
                l.num_mgms = num32 >> 1;
                l.num_amgms = num32 >> 1;
            }
        }
    }
    Ok(l)
}
