//! Doorbell records for kernel CQs, QPs and SRQs (Linux `mlx4_db_alloc`/`mlx4_db_free` of mlx4_core's `alloc.c`, which mlx4_ib calls).
//!
//! 4-byte big-endian slots in DMA pages, handed out singly (RQ/SRQ) or as
//! aligned pairs (CQ `set_ci` + arm). Left out, with user contexts: mlx4_ib's
//! own `doorbell.c` (mapping user-space record pages).

use alloc::sync::Arc;
use alloc::vec::Vec;

use hal::{DmaBuf, DmaPool, DmaRecord};

use crate::{Error, Result};

/// Slots per page (4-byte records in a 4 KiB page).
const SLOTS: usize = 4096 / 4;

struct DbPage {
    buf: Arc<DmaBuf>,
    used: [u64; SLOTS / 64],
}

impl DbPage {
    fn is_used(&self, i: usize) -> bool {
        self.used[i / 64] & (1 << (i % 64)) != 0
    }
    fn set(&mut self, i: usize, v: bool) {
        if v {
            self.used[i / 64] |= 1 << (i % 64);
        } else {
            self.used[i / 64] &= !(1 << (i % 64));
        }
    }
    /// First free run of `n` slots aligned to `n`.
    fn find(&self, n: usize) -> Option<usize> {
        (0..SLOTS)
            .step_by(n)
            .find(|&i| (i..i + n).all(|j| !self.is_used(j)))
    }
}

/// A doorbell record (Linux `struct mlx4_db`): `1 << order` consecutive
/// big-endian dwords the HCA reads at [`Db::dma`]. Each record's place in
/// its page is checked once, when allocated, so a post or a poll writes it
/// with one store.
pub struct Db {
    rec: DmaRecord<4>,
    /// The second record of a pair (a CQ's arm record).
    rec1: Option<DmaRecord<4>>,
    page_index: usize,
    slot: usize,
    order: u8,
}

impl core::fmt::Debug for Db {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Db({:#x}, order {})", self.dma(), self.order)
    }
}

impl Db {
    /// The bus address of the first record.
    pub fn dma(&self) -> u64 {
        self.rec.buf().bus_addr().0 + (self.slot * 4) as u64
    }

    /// Stores record `i` (0 or, for a pair, 1) as big-endian; record 1 of
    /// a single record is no record (nothing is written).
    #[inline(always)]
    pub fn write(&self, i: usize, v: u32) {
        match (i, &self.rec1) {
            (0, _) => self.rec.write_be32(0, v),
            (_, Some(r)) => r.write_be32(0, v),
            (_, None) => {}
        }
    }

    /// The page the records live in and where record `i` is in it (for
    /// the tests of store order).
    #[cfg(test)]
    pub(crate) fn place(&self, i: usize) -> (Arc<DmaBuf>, core::ops::Range<usize>) {
        let at = self.slot * 4 + i * 4;
        (self.rec.buf().clone(), at..at + 4)
    }

    /// Loads record `i` (0 for record 1 of a single record).
    pub fn read(&self, i: usize) -> u32 {
        match (i, &self.rec1) {
            (0, _) => self.rec.read_be32(0),
            (_, Some(r)) => r.read_be32(0),
            (_, None) => 0,
        }
    }
}

/// The device's doorbell-record pages (Linux `mlx4_ib_dev` keeps them in
/// `dev->pgdir_list`).
#[derive(Default)]
pub struct DbPool {
    pages: Vec<DbPage>,
}

impl DbPool {
    /// Linux `mlx4_db_alloc`: `1 << order` records (order 0 or 1), zeroed.
    pub fn alloc(&mut self, pool: &DmaPool, order: u8) -> Result<Db> {
        let n = 1usize << order.min(1);
        let found = self
            .pages
            .iter()
            .enumerate()
            .find_map(|(p, pg)| pg.find(n).map(|s| (p, s)));
        let (p, slot) = match found {
            Some(f) => f,
            None => {
                let buf = Arc::new(pool.alloc_pages(1)?);
                self.pages.push(DbPage {
                    buf,
                    used: [0; SLOTS / 64],
                });
                (self.pages.len() - 1, 0)
            }
        };
        let pg = &mut self.pages[p];
        let bad = Error::Inval("doorbell record outside its page");
        let rec = DmaRecord::new(pg.buf.clone(), slot * 4).ok_or(bad)?;
        let rec1 = if n == 2 {
            Some(DmaRecord::new(pg.buf.clone(), slot * 4 + 4).ok_or(bad)?)
        } else {
            None
        };
        for i in slot..slot + n {
            pg.set(i, true);
            pg.buf.write_u32(i * 4, 0);
        }
        Ok(Db {
            rec,
            rec1,
            page_index: p,
            slot,
            order: order.min(1),
        })
    }

    /// Linux `mlx4_db_free` (empty pages stay for reuse).
    pub fn free(&mut self, db: Db) {
        if let Some(pg) = self.pages.get_mut(db.page_index) {
            for i in db.slot..db.slot + (1 << db.order) {
                pg.set(i, false);
            }
        }
    }

    /// Records in use (leak checks).
    pub fn in_use(&self) -> usize {
        self.pages
            .iter()
            .map(|p| {
                p.used
                    .iter()
                    .map(|w| w.count_ones() as usize)
                    .sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hal::fake::ArenaDma;

    #[test]
    fn pairs_are_aligned_and_slots_reused() {
        let pool = DmaPool::new(Arc::new(ArenaDma::new(1 << 16)));
        let mut p = DbPool::default();
        let a = p.alloc(&pool, 0).unwrap();
        let b = p.alloc(&pool, 1).unwrap();
        assert_eq!(b.dma() % 8, 0, "a CQ pair is 8-byte aligned");
        assert_eq!(b.dma() - a.dma(), 8);
        b.write(1, 0x1234_5678);
        assert_eq!(b.read(1), 0x1234_5678);
        let c = p.alloc(&pool, 0).unwrap();
        assert_eq!(c.dma() - a.dma(), 4, "the single slot next to `a` is used");
        assert_eq!(p.in_use(), 4);
        p.free(b);
        let d = p.alloc(&pool, 1).unwrap();
        assert_eq!(d.read(1), 0, "records come back zeroed");
        assert_eq!(p.in_use(), 4);
        p.free(a);
        p.free(c);
        p.free(d);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn a_full_page_opens_another() {
        let pool = DmaPool::new(Arc::new(ArenaDma::new(1 << 16)));
        let mut p = DbPool::default();
        let v: Vec<Db> = (0..SLOTS / 2 + 1)
            .map(|_| p.alloc(&pool, 1).unwrap())
            .collect();
        assert_ne!(v[0].dma() & !0xfff, v[SLOTS / 2].dma() & !0xfff);
        assert_eq!(pool.stats().allocations, 2);
    }
}
