//! ICM (InfiniHost Context Memory) as the firmware manages it.
//!
//! The firmware area (MAP_FA), auxiliary pages (MAP_ICM_AUX), the ICM size
//! (SET_ICM_SIZE) and the ICM-virtual to bus page table (MAP_ICM / UNMAP_ICM), plus
//! the table geometry INIT_HCA defines; the firmware's own use of FA/aux memory is
//! only imitated (RUN_FW fills the FA pages).
//!
//! ICM pages are 4 KiB. A page-list entry maps a naturally aligned chunk of
//! 2^n pages; the model records every 4 KiB page, refuses misaligned chunks,
//! chunks past what the auxiliary table for the ICM size can describe
//! ([`Icm::reach`]) and pages that are already mapped, and never
//! resolves an unmapped ICM address to anything (the caller gets
//! `ICM_ERROR`).

use std::collections::BTreeMap;

use crate::hca::hcr::Status;
use crate::hca::layout::{DevCap, InitHca, PageEntry};

/// ICM page size.
pub const ICM_PAGE: u64 = 4096;
/// ICM pages one auxiliary page can describe (4 bytes per ICM page).
pub const ICM_PAGES_PER_AUX_PAGE: u64 = 1024;
/// Max entries in one page-list mailbox.
pub const MAX_ENTRIES: u32 = 256;
/// Most 4 KiB pages the model lets a driver map into ICM (16 GiB), and the
/// most FA or aux pages: a runaway driver gets ICM_ERROR, not an
/// out-of-memory host.
pub const MAX_MAPPED_PAGES: usize = 1 << 22;

/// The firmware's ICM bookkeeping.
#[derive(Debug, Default, Clone)]
pub struct Icm {
    /// FW area pages (bus addresses, 4 KiB each), in mapping order.
    pub fa: Vec<u64>,
    /// Auxiliary pages.
    pub aux: Vec<u64>,
    /// ICM size from SET_ICM_SIZE.
    pub size: Option<u64>,
    map: BTreeMap<u64, u64>,
}

/// Auxiliary pages needed for `icm_size` bytes of ICM.
pub fn aux_pages_for(icm_size: u64) -> u64 {
    icm_size
        .div_ceil(ICM_PAGE)
        .div_ceil(ICM_PAGES_PER_AUX_PAGE)
        .max(1)
}

/// Checks a host chunk of a page list and expands it to 4 KiB pages.
pub fn chunk_pages(e: &PageEntry) -> Result<Vec<u64>, Status> {
    if e.log_size > 20 {
        return Err(Status::BAD_PARAM);
    }
    let bytes = e.bytes();
    if !e.pa.is_multiple_of(bytes) || e.pa.checked_add(bytes).is_none() {
        return Err(Status::BAD_PARAM);
    }
    Ok((0..bytes / ICM_PAGE).map(|i| e.pa + i * ICM_PAGE).collect())
}

impl Icm {
    /// The bus address backing ICM virtual address `va`.
    pub fn translate(&self, va: u64) -> Option<u64> {
        self.map.get(&(va / ICM_PAGE)).map(|pa| pa + va % ICM_PAGE)
    }

    /// Number of mapped ICM pages.
    pub fn mapped_pages(&self) -> usize {
        self.map.len()
    }

    /// True if the whole range `[va, va + len)` is mapped.
    pub fn is_mapped(&self, va: u64, len: u64) -> bool {
        let end = va.saturating_add(len.max(1)) - 1;
        (va / ICM_PAGE..=end / ICM_PAGE).all(|p| self.map.contains_key(&p))
    }

    /// Validates a MAP_ICM entry without changing anything.
    pub fn check_map(&self, e: &PageEntry) -> Result<Vec<u64>, Status> {
        let size = self.size.ok_or(Status::BAD_SYS_STATE)?;
        let pages = chunk_pages(e)?;
        let bytes = e.bytes();
        let reach = Icm::reach(size);
        if !e.va.is_multiple_of(bytes) || e.va.checked_add(bytes).is_none_or(|end| end > reach) {
            return Err(Status::BAD_PARAM);
        }
        if self.map.len() + pages.len() > MAX_MAPPED_PAGES {
            return Err(Status::ICM_ERROR);
        }
        if (0..pages.len() as u64).any(|i| self.map.contains_key(&(e.va / ICM_PAGE + i))) {
            return Err(Status::RESOURCE_BUSY);
        }
        Ok(pages)
    }

    /// Maps a checked entry.
    pub fn map(&mut self, va: u64, pages: &[u64]) {
        for (i, pa) in pages.iter().enumerate() {
            self.map.insert(va / ICM_PAGE + i as u64, *pa);
        }
    }

    /// UNMAP_ICM: `npages` pages from `va`; pages that are not mapped are
    /// skipped. Linux (3.11 and 6.1 alike) unmaps every table chunk with the
    /// full 256 KiB chunk size (`mlx4_cleanup_icm_table`), also for tables
    /// it mapped smaller (the EQ context and EQ cMPT tables), and real cards
    /// unload without a failed UNMAP_ICM. The count is the driver's (up to
    /// 2^32 - 1 pages): the model visits only the pages mapped in the range,
    /// so the answer takes no longer for a huge range than a small one.
    pub fn unmap(&mut self, va: u64, npages: u32) -> Result<(), Status> {
        if !va.is_multiple_of(ICM_PAGE) || npages == 0 {
            return Err(Status::BAD_PARAM);
        }
        let first = va / ICM_PAGE;
        let end = first.saturating_add(u64::from(npages));
        let mapped: Vec<u64> = self.map.range(first..end).map(|(&p, _)| p).collect();
        for p in mapped {
            self.map.remove(&p);
        }
        Ok(())
    }

    /// Forgets every ICM mapping (CLOSE_HCA does not; reset does).
    pub fn clear_map(&mut self) {
        self.map.clear();
    }

    /// The ICM addresses MAP_ICM accepts for an ICM size: everything the
    /// auxiliary pages SET_ICM_SIZE asked for can describe (each aux page
    /// covers 1024 ICM pages), not just the size in bytes. Linux since its
    /// SYS_EQS rework maps the EQ context table for 1024 EQs while its
    /// profile (and so the ICM size) holds 128; the EQ table is the last
    /// and smallest section, so that mapping ends up to 56 KiB past the
    /// size, and it works on cards with firmware that lacks SYS_EQS.
    pub fn reach(size: u64) -> u64 {
        aux_pages_for(size)
            .saturating_mul(ICM_PAGES_PER_AUX_PAGE)
            .saturating_mul(ICM_PAGE)
    }

    /// Aux pages required by the current ICM size.
    pub fn aux_needed(&self) -> u64 {
        self.size.map_or(0, aux_pages_for)
    }
}

/// Which context table an object lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// QP contexts.
    Qpc,
    /// Auxiliary QP contexts.
    Auxc,
    /// Alternate-path QP contexts.
    Altc,
    /// RDMA read/atomic contexts (per QP).
    Rdmarc,
    /// SRQ contexts.
    Srqc,
    /// CQ contexts.
    Cqc,
    /// EQ contexts.
    Eqc,
    /// Data MPTs.
    Dmpt,
    /// MTT entries.
    Mtt,
    /// Completion MPTs for QPs (type 0), SRQs (1), CQs (2), EQs (3).
    Cmpt(u8),
}

/// Where each table lives, from INIT_HCA and the entry sizes of QUERY_DEV_CAP.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// The INIT_HCA parameters.
    pub hca: InitHca,
    caps_entry: [u64; 10],
}

impl Geometry {
    /// Geometry from INIT_HCA and the reported entry sizes.
    pub fn new(hca: InitHca, caps: &DevCap) -> Geometry {
        Geometry {
            hca,
            caps_entry: [
                u64::from(caps.qpc_entry_sz),
                u64::from(caps.aux_entry_sz),
                u64::from(caps.altc_entry_sz),
                u64::from(caps.rdmarc_entry_sz),
                u64::from(caps.srq_entry_sz),
                u64::from(caps.cqc_entry_sz),
                u64::from(caps.eqc_entry_sz),
                u64::from(caps.d_mpt_entry_sz),
                u64::from(caps.mtt_entry_sz),
                u64::from(caps.c_mpt_entry_sz),
            ],
        }
    }

    /// Entry size of a table (RDMARC: per QP, i.e. times 2^log_rd_per_qp).
    pub fn entry_size(&self, t: Table) -> u64 {
        match t {
            Table::Qpc => self.caps_entry[0],
            Table::Auxc => self.caps_entry[1],
            Table::Altc => self.caps_entry[2],
            Table::Rdmarc => self.caps_entry[3] << self.hca.log_rd_per_qp,
            Table::Srqc => self.caps_entry[4],
            Table::Cqc => self.caps_entry[5],
            Table::Eqc => self.caps_entry[6],
            Table::Dmpt => self.caps_entry[7],
            Table::Mtt => self.caps_entry[8],
            Table::Cmpt(_) => self.caps_entry[9],
        }
    }

    /// Base ICM address of a table.
    pub fn base(&self, t: Table) -> u64 {
        let h = &self.hca;
        match t {
            Table::Qpc => h.qpc_base,
            Table::Auxc => h.auxc_base,
            Table::Altc => h.altc_base,
            Table::Rdmarc => h.rdmarc_base,
            Table::Srqc => h.srqc_base,
            Table::Cqc => h.cqc_base,
            Table::Eqc => h.eqc_base,
            Table::Dmpt => h.dmpt_base,
            Table::Mtt => h.mtt_base,
            Table::Cmpt(k) => h.cmpt_base + ((u64::from(k) * self.caps_entry[9]) << 24),
        }
    }

    /// Number of objects in a table (MTT: unbounded by INIT_HCA, `None`).
    pub fn count(&self, t: Table) -> Option<u64> {
        let h = &self.hca;
        Some(match t {
            Table::Qpc | Table::Auxc | Table::Altc | Table::Rdmarc => 1 << h.log_num_qps,
            Table::Srqc => 1 << h.log_num_srqs,
            Table::Cqc => 1 << h.log_num_cqs,
            Table::Eqc => 1 << h.log_num_eqs,
            Table::Dmpt => 1 << h.log_mpt_sz,
            Table::Mtt => return None,
            Table::Cmpt(_) => 1 << 24,
        })
    }

    /// ICM address of object `idx`.
    pub fn va(&self, t: Table, idx: u64) -> u64 {
        self.base(t) + idx * self.entry_size(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(va: u64, pa: u64, log: u8) -> PageEntry {
        PageEntry {
            va,
            pa,
            log_size: log,
        }
    }

    #[test]
    fn map_translate_and_unmap() {
        let mut icm = Icm {
            size: Some(1 << 24),
            ..Default::default()
        };
        let pages = icm.check_map(&entry(0x4_0000, 0x1_0004_0000, 2)).unwrap();
        assert_eq!(pages.len(), 4);
        icm.map(0x4_0000, &pages);
        assert_eq!(icm.translate(0x4_1008), Some(0x1_0004_1008));
        assert_eq!(icm.translate(0x4_4000), None);
        assert!(icm.is_mapped(0x4_0000, 0x4000));
        assert!(!icm.is_mapped(0x4_0000, 0x4001));
        assert_eq!(
            icm.check_map(&entry(0x4_2000, 0x1_0000_0000, 0))
                .unwrap_err(),
            Status::RESOURCE_BUSY
        );
        assert_eq!(icm.unmap(0x4_0800, 4), Err(Status::BAD_PARAM));
        assert_eq!(icm.unmap(0x4_0000, 0), Err(Status::BAD_PARAM));
        // A range larger than what is mapped (Linux's 256 KiB chunk over a
        // 16 KiB mapping) unmaps what is there.
        icm.unmap(0x4_0000, 64).unwrap();
        assert_eq!(icm.mapped_pages(), 0);
        // Only the range goes, whatever its length: the pages below it stay.
        let pages = icm.check_map(&entry(0x4_0000, 0x1_0004_0000, 2)).unwrap();
        icm.map(0x4_0000, &pages);
        icm.unmap(0x4_2000, u32::MAX).unwrap();
        assert_eq!(icm.mapped_pages(), 2);
        assert_eq!(icm.translate(0x4_1008), Some(0x1_0004_1008));
        assert_eq!(icm.translate(0x4_2000), None);
    }

    #[test]
    fn misaligned_or_oversized_chunks_are_refused() {
        let icm = Icm {
            size: Some(1 << 20),
            ..Default::default()
        };
        assert_eq!(
            icm.check_map(&entry(0x1000, 0x1_0000_0000, 1)),
            Err(Status::BAD_PARAM)
        );
        assert_eq!(
            icm.check_map(&entry(0, 0x1_0000_1000, 1)),
            Err(Status::BAD_PARAM)
        );
        assert_eq!(
            icm.check_map(&entry(0xff000, 0x1_0000_0000, 1)),
            Err(Status::BAD_PARAM)
        );
        let no_size = Icm::default();
        assert_eq!(
            no_size.check_map(&entry(0, 0, 0)),
            Err(Status::BAD_SYS_STATE)
        );
        assert_eq!(aux_pages_for(1 << 32), 1024);
        assert_eq!(aux_pages_for(1), 1);
    }
}
