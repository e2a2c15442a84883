//! The platform DMA pool: one physically contiguous range carved at boot
//! (1/8 of usable RAM, 8 to 128 MiB), handed out first-fit by `hal`'s
//! [`RangeAllocator`]. Without an IOMMU the bus address is the physical
//! address; the types keep the two apart all the same.

use alloc::sync::Arc;
use core::ptr::NonNull;
use hal::{BusAddr, DmaAllocator, DmaPool, DmaRegion, DmaStats, RangeAllocator};

/// DMA memory in one contiguous physical range.
pub struct PhysDma {
    base: u64,
    ranges: spin::Mutex<RangeAllocator>,
}

// SAFETY: `alloc` returns zeroed, non-overlapping pieces of a range that is
// RAM, identity-mapped, and reserved for this pool; bus == physical here.
unsafe impl DmaAllocator for PhysDma {
    fn alloc(&self, len: usize, align: usize) -> hal::Result<DmaRegion> {
        let (off, size) = self.ranges.lock().alloc(len, align, self.base)?;
        let pa = self.base + off as u64;
        // SAFETY: inside the pool's range (RangeAllocator keeps off + size <= len).
        unsafe { core::ptr::write_bytes(pa as *mut u8, 0, size) };
        let cpu = NonNull::new(pa as *mut u8).ok_or(hal::Error::NoMemory)?;
        // SAFETY: identity-mapped RAM valid for `size` bytes until freed,
        // reserved for this allocation alone; the device reaches it at `pa`.
        Ok(unsafe { DmaRegion::new(cpu, BusAddr(pa), len) })
    }

    unsafe fn free(&self, region: DmaRegion) {
        let off = (region.bus().0 - self.base) as usize;
        if !self.ranges.lock().free(off) {
            log::error!(
                "DMA free of {} which the pool never handed out",
                region.bus()
            );
        }
    }

    fn stats(&self) -> DmaStats {
        self.ranges.lock().stats()
    }
}

static POOL: spin::Once<(DmaPool, u64, usize)> = spin::Once::new();

/// Carves the pool.
pub fn init() {
    let (usable, _) = super::frame::stats();
    let size = (usable / 8).clamp(8 << 20, 128 << 20) & !((2 << 20) - 1);
    let Some(base) = super::frame::alloc_contiguous(size, 2 << 20, false) else {
        log::error!("no contiguous {} MiB for the DMA pool", size >> 20);
        return;
    };
    POOL.call_once(|| {
        let a = PhysDma {
            base,
            ranges: spin::Mutex::new(RangeAllocator::new(size as usize, 64)),
        };
        (DmaPool::new(Arc::new(a)), base, size as usize)
    });
}

/// The platform DMA pool (for drivers of real devices).
pub fn pool() -> Option<DmaPool> {
    POOL.get().map(|(p, _, _)| p.clone())
}

/// Base and size of the pool, for `meminfo`.
pub fn region() -> Option<(u64, usize)> {
    POOL.get().map(|&(_, b, l)| (b, l))
}
