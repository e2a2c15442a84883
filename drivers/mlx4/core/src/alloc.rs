//! The allocators of mlx4_core (bitmaps, the MTT buddy, queue buffers, doorbell records), as Linux's `alloc.c` has them.
//!
//! Linux: `alloc.c` (`mlx4_bitmap_*`, `mlx4_buf_alloc/free`,
//! `mlx4_db_alloc/free`) and `mlx4_buddy_*` from `mr.c`: bitmaps with
//! reserved ranges, the MTT buddy allocator, queue buffers and doorbell
//! records. `vmap` of page lists is not needed (buffers are reached page by
//! page through `hal`).
//!
//! Loaded as module `bitmap` (`#[path = "alloc.rs"]`) because `alloc` names
//! the `alloc` crate.

use alloc::vec;
use alloc::vec::Vec;

use hal::{DmaBuf, DmaPool};

use crate::dev::{Dev, Mtt};
use crate::{Error, Result};

/// Linux `struct mlx4_bitmap`: objects `[0, max)` with `reserved_bot` taken at
/// the bottom and `reserved_top` kept out at the top; a rotating `top` value
/// is OR-ed into returned numbers (under `mask`), as Linux does to vary MPT
/// keys and PD numbers.
#[derive(Debug)]
pub struct Bitmap {
    last: u32,
    top: u32,
    max: u32,
    reserved_top: u32,
    mask: u32,
    avail: u32,
    table: Vec<u64>,
}

impl Bitmap {
    /// Linux `mlx4_bitmap_init`: `num` must be a power of two.
    pub fn new(num: u32, mask: u32, reserved_bot: u32, reserved_top: u32) -> Result<Bitmap> {
        if !num.is_power_of_two()
            || reserved_bot
                .checked_add(reserved_top)
                .is_none_or(|r| r > num)
        {
            return Err(Error::InvalidArg);
        }
        let max = num - reserved_top;
        let mut b = Bitmap {
            last: 0,
            top: 0,
            max,
            reserved_top,
            mask,
            avail: num - reserved_top - reserved_bot,
            table: vec![0; (max as usize).div_ceil(64)],
        };
        for i in 0..reserved_bot {
            b.set(i);
        }
        Ok(b)
    }

    fn test(&self, i: u32) -> bool {
        self.table[(i / 64) as usize] & (1 << (i % 64)) != 0
    }
    fn set(&mut self, i: u32) {
        self.table[(i / 64) as usize] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: u32) {
        self.table[(i / 64) as usize] &= !(1 << (i % 64));
    }

    fn find_zero_from(&self, from: u32) -> Option<u32> {
        (from..self.max).find(|&i| !self.test(i))
    }

    /// Linux `mlx4_bitmap_alloc`.
    pub fn alloc(&mut self) -> Result<u32> {
        let mut obj = self.find_zero_from(self.last);
        if obj.is_none() {
            self.top = self.top.wrapping_add(self.max + self.reserved_top) & self.mask;
            obj = self.find_zero_from(0);
        }
        let obj = obj.ok_or(Error::NoMem)?;
        self.set(obj);
        self.last = obj + 1;
        if self.last == self.max {
            self.last = 0;
        }
        self.avail -= 1;
        Ok(obj | self.top)
    }

    /// Linux `mlx4_bitmap_free`.
    pub fn free(&mut self, obj: u32) {
        self.free_range(obj, 1)
    }

    /// Linux `mlx4_bitmap_alloc_range`: `cnt` consecutive objects starting at
    /// a multiple of `align`.
    pub fn alloc_range(&mut self, cnt: u32, align: u32) -> Result<u32> {
        if cnt == 1 && align == 1 {
            return self.alloc();
        }
        if cnt == 0 || !align.is_power_of_two() {
            return Err(Error::InvalidArg);
        }
        let find = |b: &Bitmap, from: u32| -> Option<u32> {
            let mut s = from.next_multiple_of(align);
            while s.checked_add(cnt)? <= b.max {
                match (s..s + cnt).find(|&i| b.test(i)) {
                    None => return Some(s),
                    Some(busy) => s = (busy + 1).next_multiple_of(align),
                }
            }
            None
        };
        let mut obj = find(self, self.last);
        if obj.is_none() {
            self.top = self.top.wrapping_add(self.max + self.reserved_top) & self.mask;
            obj = find(self, 0);
        }
        let obj = obj.ok_or(Error::NoMem)?;
        for i in obj..obj + cnt {
            self.set(i);
        }
        if obj == self.last {
            self.last = obj + cnt;
            if self.last >= self.max {
                self.last = 0;
            }
        }
        self.avail -= cnt;
        Ok(obj | self.top)
    }

    /// Linux `mlx4_bitmap_free_range`. Objects outside the bitmap are ignored.
    pub fn free_range(&mut self, obj: u32, cnt: u32) {
        let obj = obj & (self.max + self.reserved_top - 1);
        for i in obj..obj.saturating_add(cnt).min(self.max) {
            if self.test(i) {
                self.clear(i);
                self.avail += 1;
            }
        }
        self.last = self.last.min(obj);
        self.top = self.top.wrapping_add(self.max + self.reserved_top) & self.mask;
    }

    /// Objects still available (Linux `mlx4_bitmap_avail`).
    pub fn avail(&self) -> u32 {
        self.avail
    }

    /// True if `obj` (masked) is allocated or reserved.
    pub fn is_set(&self, obj: u32) -> bool {
        let obj = obj & (self.max + self.reserved_top - 1);
        obj < self.max && self.test(obj)
    }
}

/// Linux `struct mlx4_buddy`: power-of-two segments of `[0, 2^max_order)`.
#[derive(Debug)]
pub struct Buddy {
    bits: Vec<Vec<u64>>,
    num_free: Vec<u32>,
    max_order: u32,
}

impl Buddy {
    /// Linux `mlx4_buddy_init`.
    pub fn new(max_order: u32) -> Result<Buddy> {
        if max_order > 31 {
            return Err(Error::InvalidArg);
        }
        let bits = (0..=max_order)
            .map(|o| vec![0u64; (1usize << (max_order - o)).div_ceil(64)])
            .collect();
        let mut b = Buddy {
            bits,
            num_free: vec![0; max_order as usize + 1],
            max_order,
        };
        b.bits[max_order as usize][0] |= 1;
        b.num_free[max_order as usize] = 1;
        Ok(b)
    }

    fn test(&self, o: u32, i: u32) -> bool {
        self.bits[o as usize][(i / 64) as usize] & (1 << (i % 64)) != 0
    }
    fn set(&mut self, o: u32, i: u32) {
        self.bits[o as usize][(i / 64) as usize] |= 1 << (i % 64);
    }
    fn clear(&mut self, o: u32, i: u32) {
        self.bits[o as usize][(i / 64) as usize] &= !(1 << (i % 64));
    }

    /// Linux `mlx4_buddy_alloc`: the first segment of a free block of
    /// `2^order` segments.
    pub fn alloc(&mut self, order: u32) -> Result<u32> {
        let mut o = order;
        let mut found = None;
        while o <= self.max_order {
            if self.num_free[o as usize] > 0 {
                let n = 1u32 << (self.max_order - o);
                if let Some(m) = (0..n).find(|&m| self.test(o, m)) {
                    found = Some(m);
                    break;
                }
            }
            o += 1;
        }
        let mut m = found.ok_or(Error::NoMem)?;
        self.clear(o, m);
        self.num_free[o as usize] -= 1;
        while o > order {
            o -= 1;
            m <<= 1;
            self.set(o, m ^ 1);
            self.num_free[o as usize] += 1;
        }
        Ok(m << order)
    }

    /// Linux `mlx4_buddy_free`.
    pub fn free(&mut self, seg: u32, order: u32) {
        let mut seg = seg >> order;
        let mut order = order;
        while order < self.max_order && self.test(order, seg ^ 1) {
            self.clear(order, seg ^ 1);
            self.num_free[order as usize] -= 1;
            seg >>= 1;
            order += 1;
        }
        self.set(order, seg);
        self.num_free[order as usize] += 1;
    }

    /// The order of the whole range.
    pub fn max_order(&self) -> u32 {
        self.max_order
    }

    /// Free blocks of `2^order` segments.
    pub fn num_free_at(&self, order: u32) -> u32 {
        self.num_free.get(order as usize).copied().unwrap_or(0)
    }

    /// True if the whole range is one free block (nothing allocated).
    pub fn is_empty(&self) -> bool {
        self.num_free[self.max_order as usize] == 1
    }
}

/// A queue buffer (Linux `struct mlx4_buf`): one contiguous DMA block when
/// small enough, else a list of 4 KiB pages.
pub struct Buf {
    /// The DMA blocks: one (direct) or `npages`.
    pub pages: Vec<DmaBuf>,
    /// Pages of `2^page_shift` bytes the MTT describes.
    pub npages: u32,
    /// log2 of the page size.
    pub page_shift: u32,
    direct: bool,
}

impl Buf {
    /// Bus address and byte offset in its block of byte `off` of the buffer.
    pub fn locate(&self, off: usize) -> Option<(&DmaBuf, usize)> {
        if self.direct {
            let b = self.pages.first()?;
            (off < b.len()).then_some((b, off))
        } else {
            Some((self.pages.get(off / 4096)?, off % 4096))
        }
    }

    /// Bus addresses of the MTT pages.
    pub fn page_addrs(&self) -> Vec<u64> {
        if self.direct {
            let base = self.pages.first().map_or(0, |b| b.bus_addr().0);
            (0..u64::from(self.npages))
                .map(|i| base + (i << self.page_shift))
                .collect()
        } else {
            self.pages.iter().map(|p| p.bus_addr().0).collect()
        }
    }
}

/// Linux `mlx4_buf_alloc`: `size` bytes, contiguous if `size <= max_direct`
/// (page size lowered until the block's bus address is aligned to it), else
/// 4 KiB pages.
pub fn buf_alloc(pool: &DmaPool, size: usize, max_direct: usize) -> Result<Buf> {
    // An MTT describes at most 2^31 pages.
    Error::check_range("size", size as u64, 1, 1 << 43)?;
    if size <= max_direct {
        let len = size.next_power_of_two().max(4096);
        let b = pool.alloc(len, 4096)?;
        let mut page_shift = len.trailing_zeros();
        let mut npages = 1u32;
        while b.bus_addr().0 & ((1u64 << page_shift) - 1) != 0 {
            page_shift -= 1;
            npages *= 2;
        }
        Ok(Buf {
            pages: vec![b],
            npages,
            page_shift,
            direct: true,
        })
    } else {
        let n = size.div_ceil(4096);
        let pages = (0..n)
            .map(|_| pool.alloc_pages(1))
            .collect::<hal::Result<Vec<_>>>()?;
        Ok(Buf {
            pages,
            npages: n as u32,
            page_shift: 12,
            direct: false,
        })
    }
}

/// Doorbell-record slots per page (4-byte records).
const DB_PER_PAGE: usize = 4096 / 4;

struct DbPage {
    buf: DmaBuf,
    used: [u64; DB_PER_PAGE / 64],
    count: usize,
}

/// Doorbell-record pages (Linux `priv->pgdir_list`).
#[derive(Default)]
pub struct DbPages {
    pages: Vec<Option<DbPage>>,
}

/// A doorbell record (Linux `struct mlx4_db`): `2^order` dwords.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Db {
    page: usize,
    index: usize,
    /// log2 of the number of dwords (0 for RQ/SRQ, 1 for CQ).
    pub order: u32,
    /// Bus address of the first dword (what contexts carry).
    pub dma: u64,
}

impl Dev {
    /// Linux `mlx4_db_alloc`: `2^order` zeroed, aligned doorbell dwords.
    #[doc(alias = "mlx4_db_alloc")]
    pub fn db_alloc(&mut self, order: u32) -> Result<Db> {
        // One dword (RQ/SRQ) or two (CQ: set_ci and arm).
        Error::check_range("order", order.into(), 0, 1)?;
        let n = 1usize << order;
        let find = |p: &DbPage| {
            (0..DB_PER_PAGE)
                .step_by(n)
                .find(|&i| (i..i + n).all(|j| p.used[j / 64] & (1 << (j % 64)) == 0))
        };
        let mut slot = None;
        for (pi, p) in self.db_pages.pages.iter().enumerate() {
            if let Some(p) = p
                && let Some(i) = find(p)
            {
                slot = Some((pi, i));
                break;
            }
        }
        let (pi, i) = match slot {
            Some(s) => s,
            None => {
                let buf = self.hca.pool.alloc_pages(1)?;
                let page = DbPage {
                    buf,
                    used: [0; DB_PER_PAGE / 64],
                    count: 0,
                };
                let pi = match self.db_pages.pages.iter().position(Option::is_none) {
                    Some(pi) => {
                        self.db_pages.pages[pi] = Some(page);
                        pi
                    }
                    None => {
                        self.db_pages.pages.push(Some(page));
                        self.db_pages.pages.len() - 1
                    }
                };
                (pi, 0)
            }
        };
        let p = self.db_pages.pages[pi].as_mut().ok_or(Error::NoMem)?;
        for j in i..i + n {
            p.used[j / 64] |= 1 << (j % 64);
            p.buf.write_u32(j * 4, 0);
        }
        p.count += n;
        Ok(Db {
            page: pi,
            index: i,
            order,
            dma: p.buf.bus_addr().0 + (i as u64) * 4,
        })
    }

    /// Linux `mlx4_db_free`; an empty page goes back to the pool.
    #[doc(alias = "mlx4_db_free")]
    pub fn db_free(&mut self, db: Db) {
        let Some(Some(p)) = self.db_pages.pages.get_mut(db.page) else {
            return;
        };
        for j in db.index..db.index + (1 << db.order) {
            if p.used[j / 64] & (1 << (j % 64)) != 0 {
                p.used[j / 64] &= !(1 << (j % 64));
                p.count -= 1;
            }
        }
        if p.count == 0 {
            self.db_pages.pages[db.page] = None;
        }
    }

    /// The DMA page holding `db` and the byte offset of its first dword.
    pub fn db_record(&self, db: &Db) -> Option<(&DmaBuf, usize)> {
        let p = self.db_pages.pages.get(db.page)?.as_ref()?;
        Some((&p.buf, db.index * 4))
    }

    /// Linux `mlx4_buf_alloc` on this device's DMA pool.
    #[doc(alias = "mlx4_buf_alloc")]
    pub fn buf_alloc(&self, size: usize, max_direct: usize) -> Result<Buf> {
        buf_alloc(&self.hca.pool, size, max_direct)
    }

    /// Linux `mlx4_buf_write_mtt`: the buffer's pages into `mtt`.
    #[doc(alias = "mlx4_buf_write_mtt")]
    pub fn buf_write_mtt(&mut self, mtt: &Mtt, buf: &Buf) -> Result<()> {
        self.write_mtt(mtt, 0, &buf.page_addrs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_reserved_and_rotation() {
        let mut b = Bitmap::new(16, 0xff, 4, 2).unwrap();
        assert_eq!(b.avail(), 10);
        let got: Vec<u32> = (0..10).map(|_| b.alloc().unwrap()).collect();
        assert_eq!(got, (4..14).collect::<Vec<_>>());
        assert_eq!(b.alloc(), Err(Error::NoMem));
        b.free(5);
        // The failed search and the free each rotate `top` by 16 (Linux):
        // the next number carries it.
        assert_eq!(b.alloc().unwrap(), 5 | 32);
        for i in (4..14).filter(|&i| i != 5) {
            b.free(i);
        }
        b.free(5 | 32);
        assert_eq!(b.avail(), 10);
    }

    #[test]
    fn bitmap_ranges_are_aligned() {
        let mut b = Bitmap::new(64, 63, 3, 0).unwrap();
        let r = b.alloc_range(8, 8).unwrap();
        assert_eq!(r, 8);
        // `last` only moves when the range started at it (Linux).
        let r2 = b.alloc_range(4, 4).unwrap();
        assert_eq!(r2, 4);
        b.free_range(r, 8);
        b.free_range(r2, 4);
        assert_eq!(b.avail(), 61);
        assert!(Bitmap::new(12, 11, 0, 0).is_err());
    }

    /// SplitMix64: a small deterministic PRNG for the property test.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// The buddy allocator against a reference bitmap of its segments,
    /// over random runs of allocations and frees: every block handed out
    /// is aligned, inside the range and overlaps no live one; an
    /// allocation fails only when no aligned free block of its size is
    /// left (eager merging keeps every such block whole); the free counts
    /// add up to the free segments; freeing everything merges back into
    /// the one block of the whole range.
    #[test]
    fn buddy_matches_a_reference_bitmap_over_random_runs() {
        const MAX_ORDER: u32 = 8;
        const SEGS: usize = 1 << MAX_ORDER;
        for seed in 0..64u64 {
            let mut rng = Rng(seed);
            let mut b = Buddy::new(MAX_ORDER).unwrap();
            let mut used = [false; SEGS];
            let mut live: Vec<(u32, u32)> = Vec::new();
            for step in 0..600 {
                let ctx = || format!("seed {seed}, step {step}");
                if live.is_empty() || rng.below(100) < 55 {
                    // Small orders mostly, the whole range now and then.
                    let order = match rng.below(10) {
                        0..=5 => rng.below(3) as u32,
                        6..=8 => rng.below(u64::from(MAX_ORDER)) as u32,
                        _ => MAX_ORDER,
                    };
                    let len = 1usize << order;
                    let fits = (0..SEGS)
                        .step_by(len)
                        .any(|s| used[s..s + len].iter().all(|u| !u));
                    match b.alloc(order) {
                        Ok(seg) => {
                            let s = seg as usize;
                            assert!(
                                s.is_multiple_of(len) && s + len <= SEGS,
                                "{}: block {seg} of order {order}",
                                ctx()
                            );
                            assert!(
                                used[s..s + len].iter().all(|u| !u),
                                "{}: block {seg} of order {order} overlaps a live one",
                                ctx()
                            );
                            used[s..s + len].fill(true);
                            live.push((seg, order));
                        }
                        Err(e) => {
                            assert_eq!(e, Error::NoMem, "{}", ctx());
                            assert!(
                                !fits,
                                "{}: order {order} refused with an aligned free block left",
                                ctx()
                            );
                        }
                    }
                } else {
                    let (seg, order) = live.swap_remove(rng.below(live.len() as u64) as usize);
                    b.free(seg, order);
                    let s = seg as usize;
                    used[s..s + (1 << order)].fill(false);
                }
                let free_segs: u64 = (0..=MAX_ORDER)
                    .map(|o| u64::from(b.num_free_at(o)) << o)
                    .sum();
                assert_eq!(
                    free_segs,
                    used.iter().filter(|u| !**u).count() as u64,
                    "{}: free counts",
                    ctx()
                );
            }
            for (seg, order) in live.drain(..) {
                b.free(seg, order);
            }
            assert!(b.is_empty(), "seed {seed}: everything came back");
            assert!(
                (0..MAX_ORDER).all(|o| b.num_free_at(o) == 0),
                "seed {seed}: merged into one block"
            );
            assert_eq!(b.alloc(MAX_ORDER), Ok(0));
        }
    }

    #[test]
    fn buddy_splits_and_merges() {
        let mut b = Buddy::new(4).unwrap();
        let a = b.alloc(0).unwrap();
        let c = b.alloc(2).unwrap();
        let d = b.alloc(3).unwrap();
        assert_eq!((a, c, d), (0, 4, 8));
        assert_eq!(b.alloc(3), Err(Error::NoMem));
        b.free(c, 2);
        b.free(a, 0);
        b.free(d, 3);
        assert!(b.is_empty());
        assert_eq!(b.alloc(4).unwrap(), 0);
    }
}
