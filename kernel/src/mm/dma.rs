//! The platform DMA pool.
//!
//! A physically contiguous range carved at boot (1/8 of usable RAM, 8 to 128 MiB)
//! that grows on demand by further contiguous ranges taken from the frame allocator
//! when an allocation does not fit (a 256 MiB remote-memory region, say), each
//! handed out first-fit by `hal`'s [`RangeAllocator`]. Leaves out giving grown
//! ranges back to the frame allocator (frames are never returned; a freed range
//! stays in the pool for the next large allocation). Without an IOMMU the bus
//! address is the physical address; the types keep the two apart all the same.

use alloc::sync::Arc;
use core::ptr::NonNull;
use hal::{BusAddr, DmaAllocator, DmaPool, DmaRegion, DmaStats, RangeAllocator};

/// Ranges the pool may hold: the boot range and the ones it grew by.
const MAX_RANGES: usize = 16;
/// Frames left to the rest of the kernel (page tables) when growing.
const RESERVE: u64 = 8 << 20;
/// Ranges are taken in multiples of this (and aligned to it).
const GROW: u64 = 2 << 20;

struct Range {
    base: u64,
    ranges: RangeAllocator,
}

/// DMA memory in contiguous physical ranges.
pub struct PhysDma {
    ranges: spin::Mutex<[Option<Range>; MAX_RANGES]>,
}

impl PhysDma {
    /// Takes a new contiguous range with room for `len` bytes from the
    /// frame allocator, keeping [`RESERVE`] for the rest of the kernel.
    fn grow(ranges: &mut [Option<Range>; MAX_RANGES], len: usize) -> Option<usize> {
        let slot = ranges.iter().position(Option::is_none)?;
        let size = (len as u64).checked_next_multiple_of(GROW)?;
        let (usable, used) = super::frame::stats();
        if used.saturating_add(size).saturating_add(RESERVE) > usable {
            return None;
        }
        let base = super::frame::alloc_contiguous(size, GROW, false)?;
        log::info!(
            "DMA pool grown by {} MiB at {base:#x} (a {} KiB allocation)",
            size >> 20,
            len / 1024
        );
        ranges[slot] = Some(Range {
            base,
            ranges: RangeAllocator::new(size as usize, 64),
        });
        Some(slot)
    }
}

/// Zeroing runs in steps of this size with the caller's progress function
/// between them: about a millisecond of TCG per step on an idle host, so
/// a 256 MiB region keeps the port's SMPs answered while it is zeroed.
const ZERO_STEP: usize = 1 << 20;

// SAFETY: `alloc` returns zeroed, non-overlapping pieces of ranges that are
// RAM, identity-mapped, and reserved for this pool; bus == physical here.
unsafe impl DmaAllocator for PhysDma {
    fn alloc(&self, len: usize, align: usize) -> hal::Result<DmaRegion> {
        self.alloc_with_progress(len, align, &mut || {})
    }

    fn alloc_with_progress(
        &self,
        len: usize,
        align: usize,
        progress: &mut dyn FnMut(),
    ) -> hal::Result<DmaRegion> {
        let mut g = self.ranges.lock();
        let mut found = None;
        for r in g.iter_mut().flatten() {
            if let Ok((off, size)) = r.ranges.alloc(len, align, r.base) {
                found = Some((r.base + off as u64, size));
                break;
            }
        }
        // Nothing fits: a new range, if the frames allow (aligned to GROW,
        // so any `align` up to 2 MiB holds at its start).
        if found.is_none()
            && align as u64 <= GROW
            && let Some(i) = Self::grow(&mut g, len)
            && let Some(r) = g[i].as_mut()
        {
            let (off, size) = r.ranges.alloc(len, align, r.base)?;
            found = Some((r.base + off as u64, size));
        }
        drop(g);
        let (pa, size) = found.ok_or(hal::Error::NoMemory)?;
        // Zeroed step by step, the pool unlocked: `progress` may allocate.
        let mut off = 0;
        while off < size {
            let n = (size - off).min(ZERO_STEP);
            // SAFETY: inside one of the pool's ranges (RangeAllocator keeps
            // off + size <= the range's length), reserved for this
            // allocation alone.
            unsafe { core::ptr::write_bytes((pa as *mut u8).add(off), 0, n) };
            off += n;
            if off < size {
                progress();
            }
        }
        let cpu = NonNull::new(pa as *mut u8).ok_or(hal::Error::NoMemory)?;
        // SAFETY: identity-mapped RAM valid for `size` bytes until freed,
        // reserved for this allocation alone; the device reaches it at `pa`.
        Ok(unsafe { DmaRegion::new(cpu, BusAddr(pa), len) })
    }

    unsafe fn free(&self, region: DmaRegion) {
        let pa = region.bus().0;
        let mut g = self.ranges.lock();
        let freed = g.iter_mut().flatten().any(|r| {
            pa >= r.base
                && pa - r.base < r.ranges.len() as u64
                && r.ranges.free((pa - r.base) as usize)
        });
        if !freed {
            log::error!(
                "DMA free of {} which the pool never handed out",
                region.bus()
            );
        }
    }

    fn stats(&self) -> DmaStats {
        let g = self.ranges.lock();
        let mut s = DmaStats::default();
        for r in g.iter().flatten() {
            let t = r.ranges.stats();
            s.allocations += t.allocations;
            s.bytes += t.bytes;
        }
        s
    }
}

static POOL: spin::Once<(DmaPool, Arc<PhysDma>)> = spin::Once::new();

/// Carves the boot range of the pool.
pub fn init() {
    let (usable, _) = super::frame::stats();
    let size = (usable / 8).clamp(8 << 20, 128 << 20) & !((2 << 20) - 1);
    let Some(base) = super::frame::alloc_contiguous(size, 2 << 20, false) else {
        log::error!("no contiguous {} MiB for the DMA pool", size >> 20);
        return;
    };
    POOL.call_once(|| {
        let mut ranges = [const { None }; MAX_RANGES];
        ranges[0] = Some(Range {
            base,
            ranges: RangeAllocator::new(size as usize, 64),
        });
        let a = Arc::new(PhysDma {
            ranges: spin::Mutex::new(ranges),
        });
        (DmaPool::new(a.clone()), a)
    });
}

/// The platform DMA pool (for drivers of real devices).
pub fn pool() -> Option<DmaPool> {
    POOL.get().map(|(p, _)| p.clone())
}

/// Base and size of each of the pool's ranges (the boot range first), for
/// `meminfo`; `f` is called once per range.
pub fn ranges(mut f: impl FnMut(u64, usize)) {
    if let Some((_, a)) = POOL.get() {
        for r in a.ranges.lock().iter().flatten() {
            f(r.base, r.ranges.len());
        }
    }
}

/// Total size of the pool's ranges.
pub fn total() -> usize {
    let mut t = 0;
    ranges(|_, l| t += l);
    t
}
