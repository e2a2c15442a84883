//! Memory regions and their translation tables, as Linux's `mr.c` manages them on a native PF.
//!
//! Linux: `mr.c` (`mlx4_init_mr_table`, `mlx4_mtt_init`, `mlx4_write_mtt`,
//! `mlx4_mr_alloc`, `mlx4_mr_enable`, `mlx4_mr_free`, ...): MPT allocation and
//! SW2HW/HW2SW_MPT, MTT ranges from a buddy allocator with entries written
//! straight into ICM host memory. WRITE_MTT (SR-IOV), FMRs and memory
//! windows are left out.

use hal::barrier::wmb;
use mlx4_hw::cmd::{Opcode, timeout};
use mlx4_hw::mr::{self as hw, LOG_MTTS_PER_SEG, MptEntry, flags};

use crate::bitmap::{Bitmap, Buddy};
use crate::cmd::Mailbox;
use crate::dev::{Dev, Hca, MrTable};
use crate::{Error, Result, Why, mlx4_warn};

pub use crate::dev::Mtt;

/// A memory region (Linux `struct mlx4_mr`).
#[derive(Debug)]
pub struct Mr {
    /// I/O virtual address the region starts at.
    pub iova: u64,
    /// Length in bytes.
    pub size: u64,
    /// Protection domain.
    pub pd: u32,
    /// `MLX4_PERM_*` access bits.
    pub access: u32,
    /// The key (`hw_index_to_key(index)`): lkey and rkey.
    pub key: u32,
    /// Its translation.
    pub mtt: Mtt,
    enabled: bool,
    icm_held: bool,
}

impl MrTable {
    /// Linux `mlx4_init_mr_table` (native): MPT bitmap, MTT buddy in
    /// segments of 8, and the firmware's reserved MTTs taken first.
    pub(crate) fn init(hca: &mut Hca) -> Result<MrTable> {
        let mpt_bitmap = Bitmap::new(hca.caps.num_mpts, !0, hca.caps.reserved_mrws, 0)?;
        let segs = hca.caps.num_mtts >> LOG_MTTS_PER_SEG;
        let mtt_buddy = Buddy::new(segs.max(1).ilog2())?;
        let mut t = MrTable {
            mpt_bitmap,
            enabled: Default::default(),
            mtt_buddy,
            reserved_mtts: None,
        };
        let rsvd = hca.caps.reserved_mtts;
        if rsvd > 0 {
            let order = u32::BITS - (rsvd - 1).leading_zeros();
            match t.alloc_mtt_range(hca, order) {
                Ok(off) => t.reserved_mtts = Some((off, order)),
                Err(e) => {
                    mlx4_warn!(
                        hca.pci,
                        "MTT table of order {} is too small.",
                        t.mtt_buddy.max_order()
                    );
                    return Err(e);
                }
            }
        }
        Ok(t)
    }

    /// Linux `mlx4_cleanup_mr_table`: the firmware's MTTs go back.
    pub(crate) fn cleanup(&mut self, hca: &mut Hca) {
        if let Some((off, order)) = self.reserved_mtts.take() {
            self.free_mtt_range(hca, off, order);
        }
    }

    /// Linux `mlx4_alloc_mtt_range`: `2^order` entries (rounded up to a
    /// segment), with the ICM chunks holding them mapped.
    fn alloc_mtt_range(&mut self, hca: &mut Hca, order: u32) -> Result<u32> {
        let seg_order = order.saturating_sub(LOG_MTTS_PER_SEG);
        let seg = self.mtt_buddy.alloc(seg_order)?;
        let offset = seg << LOG_MTTS_PER_SEG;
        let end = offset + (1 << order) - 1;
        let r = hca
            .icm
            .mtt
            .get_range(&mut hca.cmd, &hca.pool, offset, end, &hca.pci);
        if let Err(e) = r {
            self.mtt_buddy.free(seg, seg_order);
            return Err(e);
        }
        Ok(offset)
    }

    /// Linux `mlx4_free_mtt_range`.
    fn free_mtt_range(&mut self, hca: &mut Hca, offset: u32, order: u32) {
        let seg_order = order.saturating_sub(LOG_MTTS_PER_SEG);
        self.mtt_buddy.free(offset >> LOG_MTTS_PER_SEG, seg_order);
        hca.icm
            .mtt
            .put_range(&mut hca.cmd, offset, offset + (1 << order) - 1);
    }

    /// Linux `mlx4_mtt_init` (see [`Dev::mtt_init`]).
    pub(crate) fn mtt_init(&mut self, hca: &mut Hca, npages: u32, page_shift: u32) -> Result<Mtt> {
        if npages == 0 {
            return Ok(Mtt {
                offset: 0,
                order: None,
                page_shift: mlx4_hw::icm::ICM_PAGE_SHIFT,
            });
        }
        // 4 KiB pages at least (the ICM page); the contexts' log_page_size
        // field holds page_shift - 12 in 6 bits.
        Error::check_range("page_shift", page_shift.into(), 12, 63)?;
        Error::check_range("npages", npages.into(), 1, hca.caps.num_mtts.into())?;
        let order = npages
            .checked_next_power_of_two()
            .ok_or(Error::bad_arg(
                "npages",
                npages.into(),
                Why::AboveMax(1 << 31),
            ))?
            .ilog2();
        let offset = self.alloc_mtt_range(hca, order)?;
        Ok(Mtt {
            offset,
            order: Some(order),
            page_shift,
        })
    }

    /// Linux `mlx4_mtt_cleanup`.
    pub(crate) fn mtt_cleanup(&mut self, hca: &mut Hca, mtt: &Mtt) {
        if let Some(order) = mtt.order {
            self.free_mtt_range(hca, mtt.offset, order);
        }
    }
}

impl Hca {
    /// Linux `mlx4_mtt_addr` (see [`Dev::mtt_addr`]).
    pub(crate) fn mtt_addr(&self, mtt: &Mtt) -> u64 {
        u64::from(mtt.offset) * u64::from(self.caps.mtt_entry_sz)
    }

    /// Linux `mlx4_write_mtt` (see [`Dev::write_mtt`]).
    pub(crate) fn write_mtt(&self, mtt: &Mtt, start: u32, pages: &[u64]) -> Result<()> {
        let order = mtt.order.ok_or(Error::bad_arg(
            "mtt",
            0,
            Why::Other("no translation: there are no entries to write"),
        ))?;
        let n = u32::try_from(pages.len())
            .map_err(|_| Error::bad_arg("pages", pages.len() as u64, Why::AboveMax(1 << order)))?;
        let end = u64::from(start) + u64::from(n);
        if end > 1 << order {
            return Err(Error::bad_arg(
                "start + pages.len()",
                end,
                Why::AboveMax(1 << order),
            ));
        }
        let page = 1u64 << mtt.page_shift.min(63);
        if let Some(&p) = pages.iter().find(|&&p| p & (page - 1) != 0) {
            return Err(Error::bad_arg("pages[]", p, Why::Misaligned(page)));
        }
        for (i, &p) in pages.iter().enumerate() {
            let (buf, off) = self
                .icm
                .mtt
                .find(mtt.offset + start + i as u32)
                .ok_or(Error::InvalidArg)?;
            buf.write_be64(off, hw::mtt_entry(p));
        }
        // The HCA must see the entries before any context pointing at them.
        wmb();
        Ok(())
    }
}

impl Dev {
    /// Linux `mlx4_mtt_init`: an MTT range for `npages` pages of
    /// `2^page_shift` bytes (`npages == 0`: no translation).
    #[doc(alias = "mlx4_mtt_init")]
    pub fn mtt_init(&mut self, npages: u32, page_shift: u32) -> Result<Mtt> {
        self.tables.mr.mtt_init(&mut self.hca, npages, page_shift)
    }

    /// Bytes the pages of `mtt` hold (0 for no translation).
    pub fn mtt_bytes(mtt: &Mtt) -> u64 {
        mtt.order.map_or(0, |o| {
            (1u64 << o).saturating_mul(1u64 << mtt.page_shift.min(63))
        })
    }

    /// `Ok` if `mtt` translates a queue buffer of `need` bytes (`arg` names
    /// the size argument to blame): a queue without an MTT would point its
    /// context at MTT entry 0, which the firmware reserves, and one larger
    /// than its pages makes the HCA read past them.
    pub(crate) fn check_queue_mtt(
        mtt: &Mtt,
        arg: &'static str,
        value: u64,
        need: u64,
    ) -> Result<()> {
        if mtt.order.is_none() {
            return Err(Error::bad_arg(
                "mtt",
                0,
                Why::Other("a queue buffer needs an MTT (this one has no translation)"),
            ));
        }
        if need > Self::mtt_bytes(mtt) {
            return Err(Error::bad_arg(
                arg,
                value,
                Why::Other("the queue is larger than the pages its MTT describes"),
            ));
        }
        Ok(())
    }

    /// Linux `mlx4_mtt_cleanup`.
    #[doc(alias = "mlx4_mtt_cleanup")]
    pub fn mtt_cleanup(&mut self, mtt: &Mtt) {
        self.tables.mr.mtt_cleanup(&mut self.hca, mtt);
    }

    /// Linux `mlx4_mtt_addr`: the byte offset of the range in the MTT table
    /// (what contexts carry; the firmware adds the table base).
    #[doc(alias = "mlx4_mtt_addr")]
    pub fn mtt_addr(&self, mtt: &Mtt) -> u64 {
        self.hca.mtt_addr(mtt)
    }

    /// Linux `mlx4_write_mtt` (native: `mlx4_write_mtt_chunk` writing ICM
    /// directly): entries `start..` of `mtt` = `pages` (bus addresses) with
    /// the present bit.
    #[doc(alias = "mlx4_write_mtt")]
    pub fn write_mtt(&mut self, mtt: &Mtt, start: u32, pages: &[u64]) -> Result<()> {
        self.hca.write_mtt(mtt, start, pages)
    }

    /// Reads MTT entry `i` of `mtt` back from ICM (tests, debugging).
    pub fn read_mtt(&self, mtt: &Mtt, i: u32) -> Option<u64> {
        let (buf, off) = self.hca.icm.mtt.find(mtt.offset + i)?;
        Some(buf.read_be64(off))
    }

    /// Linux `mlx4_mr_alloc`: reserves an MPT index and an MTT range.
    #[doc(alias = "mlx4_mr_alloc")]
    pub fn mr_alloc(
        &mut self,
        pd: u32,
        iova: u64,
        size: u64,
        access: u32,
        npages: u32,
        page_shift: u32,
    ) -> Result<Mr> {
        if npages > 0 {
            // The region must fit in its pages, counting the offset of
            // `iova` in the first one.
            let page = 1u64 << page_shift.clamp(12, 63);
            let room = u64::from(npages).saturating_mul(page);
            if (iova & (page - 1)).saturating_add(size) > room {
                return Err(Error::bad_arg(
                    "size",
                    size,
                    Why::Other("longer than npages pages of 2^page_shift bytes hold"),
                ));
            }
        }
        let t = &mut self.tables.mr;
        let index = t.mpt_bitmap.alloc()?;
        let mtt = match t.mtt_init(&mut self.hca, npages, page_shift) {
            Ok(m) => m,
            Err(e) => {
                t.mpt_bitmap.free(index);
                return Err(e);
            }
        };
        Ok(Mr {
            iova,
            size,
            pd,
            access,
            key: hw::hw_index_to_key(index),
            mtt,
            enabled: false,
            icm_held: false,
        })
    }

    /// Linux `mlx4_mr_enable`: maps the dMPT chunk and hands the entry to
    /// the HCA with SW2HW_MPT.
    #[doc(alias = "mlx4_mr_enable")]
    pub fn mr_enable(&mut self, mr: &mut Mr) -> Result<()> {
        let index = hw::key_to_hw_index(mr.key);
        let hca = &mut self.hca;
        hca.icm.dmpt.get(&mut hca.cmd, &hca.pool, index, &hca.pci)?;
        mr.icm_held = true;
        let mut e = MptEntry {
            flags: flags::MIO | flags::REGION | mr.access,
            key: index,
            pd_flags: mr.pd | flags::PD_FLAG_EN_INV,
            start: mr.iova,
            length: mr.size,
            entity_size: mr.mtt.page_shift,
            ..Default::default()
        };
        match mr.mtt.order {
            None => e.flags |= flags::PHYSICAL,
            Some(_) => e.mtt_addr = hca.mtt_addr(&mr.mtt),
        }
        if mr.mtt.order.is_some() && mr.mtt.page_shift == 0 {
            // Fast-register MR in free state.
            e.flags |= flags::FREE;
            e.pd_flags |= flags::PD_FLAG_FAST_REG | flags::PD_FLAG_RAE;
            e.mtt_sz = 1 << mr.mtt.order.unwrap_or(0);
        } else {
            e.flags |= flags::SW_OWNS;
        }
        let mb = Mailbox::new(&hca.pool)?;
        mb.write(0, &e.to_bytes());
        let in_mod = index & (hca.caps.num_mpts - 1);
        let pci = hca.pci;
        hca.cmd
            .cmd(mb.dma(), in_mod, 0, Opcode::SW2HW_MPT, timeout::CLASS_B)
            .inspect_err(|e| mlx4_warn!(pci, "SW2HW_MPT failed ({})", e.to_errno()))?;
        mr.enabled = true;
        self.tables.mr.enabled.insert(in_mod);
        Ok(())
    }

    /// Linux `mlx4_mr_free`: HW2SW_MPT if enabled, then the MTT range, the
    /// dMPT reference and the MPT index.
    #[doc(alias = "mlx4_mr_free")]
    pub fn mr_free(&mut self, mr: Mr) -> Result<()> {
        let index = hw::key_to_hw_index(mr.key);
        let mut r = Ok(());
        if mr.enabled {
            let in_mod = index & (self.hca.caps.num_mpts - 1);
            if let Err(e) =
                self.hca
                    .cmd
                    .cmd_box(0, 0, in_mod, 1, Opcode::HW2SW_MPT, timeout::CLASS_B)
            {
                mlx4_warn!(self.hca.pci, "HW2SW_MPT failed ({})", e.to_errno());
                r = Err(e);
            }
        }
        self.mtt_cleanup(&mr.mtt);
        if mr.icm_held {
            self.hca.icm.dmpt.put(&mut self.hca.cmd, index);
        }
        let t = &mut self.tables.mr;
        t.enabled.remove(&(index & (self.hca.caps.num_mpts - 1)));
        t.mpt_bitmap.free(index);
        r
    }

    /// MPTs still in hardware ownership at teardown go back (HW2SW_MPT).
    pub(crate) fn reclaim_mrs(&mut self) -> usize {
        let live = self.tables.mr.enabled.iter().copied().collect();
        self.reclaim_each(live, "HW2SW_MPT of leaked MPT", |cmd, i| {
            cmd.cmd_box(0, 0, i, 1, Opcode::HW2SW_MPT, timeout::CLASS_B)
                .map(drop)
        })
    }

    /// The dMPT entry as the HCA holds it (QUERY_MPT; newer Linux
    /// `mlx4_mr_hw_get_mpt`).
    #[doc(alias = "mlx4_mr_hw_get_mpt")]
    pub fn mpt_query(&mut self, mr: &Mr) -> Result<MptEntry> {
        let index = hw::key_to_hw_index(mr.key) & (self.hca.caps.num_mpts - 1);
        let mb = Mailbox::new(&self.hca.pool)?;
        self.hca
            .cmd
            .cmd_box(0, mb.dma(), index, 0, Opcode::QUERY_MPT, timeout::CLASS_B)?;
        let b: [u8; MptEntry::SIZE] = mb.read();
        Ok(MptEntry::from_bytes(&b))
    }

    /// Free MPT indices (leak checks).
    pub fn mpt_avail(&self) -> u32 {
        self.tables.mr.mpt_bitmap.avail()
    }

    /// Free MTT segments in the buddy at each order (leak checks).
    pub fn mtt_free_segments(&self) -> Option<u32> {
        Some(self.tables.mr.mtt_buddy.free_segments())
    }
}

impl Buddy {
    /// Total free segments.
    pub fn free_segments(&self) -> u32 {
        (0..=self.max_order())
            .map(|o| self.num_free_at(o) << o)
            .sum()
    }
}
