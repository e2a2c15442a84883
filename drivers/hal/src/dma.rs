//! DMA memory: physically contiguous buffers that know both their CPU view and
//! the bus address the device must be given.
//!
//! A [`DmaPool`] is a handle on one platform allocator (per device, because
//! with the ivshmem model DMA must come from the shared window). It hands out
//! [`DmaBuf`]s, zeroed, which return themselves to the pool when dropped.
//! Contents are reached only through bounds-checked volatile accessors, never
//! through references, because the device may write the memory at any time.

use alloc::sync::Arc;
use core::fmt;
use core::ptr::NonNull;

use crate::{Error, Result};

/// An address as the device sees it (equal to the physical address without an
/// IOMMU, but never confused with it in the types).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BusAddr(pub u64);

impl BusAddr {
    /// The address `off` bytes further on.
    pub const fn add(self, off: u64) -> BusAddr {
        BusAddr(self.0 + off)
    }
}

impl fmt::Debug for BusAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bus:{:#x}", self.0)
    }
}

impl fmt::Display for BusAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// One allocation made by a [`DmaAllocator`].
#[derive(Debug)]
pub struct DmaRegion {
    cpu: NonNull<u8>,
    bus: BusAddr,
    len: usize,
}

impl DmaRegion {
    /// Describes an allocation.
    ///
    /// # Safety
    ///
    /// `cpu` must be valid for volatile reads and writes of `len` bytes until
    /// the region is given back with [`DmaAllocator::free`], must not be
    /// reachable through any other `DmaRegion`, and the device must reach the
    /// same bytes at `bus`.
    pub unsafe fn new(cpu: NonNull<u8>, bus: BusAddr, len: usize) -> DmaRegion {
        DmaRegion { cpu, bus, len }
    }
    /// The CPU address (for allocator bookkeeping only).
    pub fn cpu_ptr(&self) -> NonNull<u8> {
        self.cpu
    }
    /// The bus address.
    pub fn bus(&self) -> BusAddr {
        self.bus
    }
    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Bytes and allocations currently handed out by a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DmaStats {
    /// Live allocations.
    pub allocations: usize,
    /// Bytes in live allocations (after rounding).
    pub bytes: usize,
}

/// A platform's source of DMA memory.
///
/// # Safety
///
/// Implementation safety: `alloc` returns zeroed, physically contiguous memory
/// satisfying [`DmaRegion::new`]'s contract, aligned to `align` both in CPU and
/// bus address, that no other live region overlaps.
pub unsafe trait DmaAllocator: Send + Sync {
    /// Allocates `len` bytes aligned to `align` (a power of two).
    fn alloc(&self, len: usize, align: usize) -> Result<DmaRegion>;
    /// Gives a region back.
    ///
    /// # Safety
    ///
    /// `region` came from this allocator's `alloc`, is freed once, and neither
    /// the CPU nor the device uses it afterwards.
    unsafe fn free(&self, region: DmaRegion);
    /// What is handed out right now (leak checks in tests, `meminfo`).
    fn stats(&self) -> DmaStats;
}

/// First-fit bookkeeping of a contiguous range: which `[offset, offset + len)`
/// pieces are handed out. Pure arithmetic; platforms pair it with memory.
#[derive(Debug)]
pub struct RangeAllocator {
    len: usize,
    granule: usize,
    /// Allocated `(offset, len)` pieces, sorted by offset.
    used: alloc::vec::Vec<(usize, usize)>,
    stats: DmaStats,
}

impl RangeAllocator {
    /// Manages `[0, len)` in multiples of `granule` (a power of two).
    pub fn new(len: usize, granule: usize) -> RangeAllocator {
        RangeAllocator {
            len,
            granule: granule.max(1),
            used: alloc::vec::Vec::new(),
            stats: DmaStats::default(),
        }
    }

    /// The total size managed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if nothing can ever be allocated.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reserves `len` bytes whose offset plus `base` is a multiple of `align`;
    /// returns the offset and the rounded length.
    pub fn alloc(&mut self, len: usize, align: usize, base: u64) -> Result<(usize, usize)> {
        if len == 0 || !align.is_power_of_two() {
            return Err(Error::BadRequest);
        }
        let size = len.div_ceil(self.granule) * self.granule;
        let align = align.max(self.granule) as u64;
        // First offset >= cursor whose bus address is aligned.
        let fit = |cursor: usize| -> Option<usize> {
            let addr = (base.checked_add(cursor as u64)?).checked_next_multiple_of(align)?;
            usize::try_from(addr - base).ok()
        };
        let mut cursor = 0usize;
        let mut slot = None;
        for (i, &(o, l)) in self.used.iter().enumerate() {
            if let Some(start) = fit(cursor)
                && start.checked_add(size).is_some_and(|e| e <= o)
            {
                slot = Some((i, start));
                break;
            }
            cursor = o + l;
        }
        let (i, start) = match slot {
            Some(s) => s,
            None => {
                let start = fit(cursor).ok_or(Error::NoMemory)?;
                if start.checked_add(size).is_none_or(|e| e > self.len) {
                    return Err(Error::NoMemory);
                }
                (self.used.len(), start)
            }
        };
        self.used.insert(i, (start, size));
        self.stats.allocations += 1;
        self.stats.bytes += size;
        Ok((start, size))
    }

    /// Releases the piece that starts at `offset`; false if there is none.
    pub fn free(&mut self, offset: usize) -> bool {
        match self.used.binary_search_by_key(&offset, |&(o, _)| o) {
            Ok(i) => {
                let (_, l) = self.used.remove(i);
                self.stats.allocations -= 1;
                self.stats.bytes -= l;
                true
            }
            Err(_) => false,
        }
    }

    /// What is handed out.
    pub fn stats(&self) -> DmaStats {
        self.stats
    }
}

/// A cloneable handle on one DMA allocator.
#[derive(Clone)]
pub struct DmaPool {
    inner: Arc<dyn DmaAllocator>,
}

impl fmt::Debug for DmaPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DmaPool({:?})", self.inner.stats())
    }
}

impl DmaPool {
    /// Wraps an allocator.
    pub fn new(inner: Arc<dyn DmaAllocator>) -> DmaPool {
        DmaPool { inner }
    }

    /// A zeroed buffer of `len` bytes aligned to `align` (a power of two).
    pub fn alloc(&self, len: usize, align: usize) -> Result<DmaBuf> {
        if len == 0 || !align.is_power_of_two() {
            return Err(Error::BadRequest);
        }
        // At least 8-byte alignment, so every naturally aligned offset is an
        // aligned address.
        let region = self.inner.alloc(len, align.max(8))?;
        debug_assert!(region.len >= len && region.bus.0 % align as u64 == 0);
        Ok(DmaBuf {
            region: Some(region),
            len,
            pool: self.clone(),
        })
    }

    /// A zeroed, page-aligned buffer of `pages` 4 KiB pages.
    pub fn alloc_pages(&self, pages: usize) -> Result<DmaBuf> {
        let len = pages.checked_mul(4096).ok_or(Error::BadRequest)?;
        self.alloc(len, 4096)
    }

    /// What the pool has handed out right now.
    pub fn stats(&self) -> DmaStats {
        self.inner.stats()
    }
}

/// A DMA buffer owned by the driver: CPU view plus bus address, freed on drop.
///
/// All accessors are bounds-checked volatile accesses; multi-byte `_be`
/// accessors read and write big-endian device formats.
pub struct DmaBuf {
    /// Always `Some` until `drop`.
    region: Option<DmaRegion>,
    len: usize,
    pool: DmaPool,
}

// SAFETY: a `DmaBuf` owns its region exclusively (DmaRegion contract); the
// pointer is only used for volatile accesses through `&self`/`&mut self`
// methods, and the device is the only other party, as with any DMA memory.
unsafe impl Send for DmaBuf {}
// SAFETY: shared access only performs volatile loads/stores of plain integers,
// which cannot violate memory safety however they interleave.
unsafe impl Sync for DmaBuf {}

impl fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DmaBuf({}, {:#x} bytes)", self.bus_addr(), self.len)
    }
}

macro_rules! accessors {
    ($read:ident, $write:ident, $read_be:ident, $write_be:ident, $t:ty) => {
        #[doc = concat!("Loads a native-endian `", stringify!($t), "` at `off`.")]
        #[inline]
        pub fn $read(&self, off: usize) -> $t {
            let p = self.ptr(off, core::mem::size_of::<$t>());
            // SAFETY: `ptr` checked that the naturally aligned access lies
            // inside the region, which is valid for volatile access (DmaRegion
            // contract) and at least 8-byte aligned (`DmaPool::alloc`).
            unsafe { p.cast::<$t>().read_volatile() }
        }
        #[doc = concat!("Stores a native-endian `", stringify!($t), "` at `off`.")]
        #[inline]
        pub fn $write(&self, off: usize, v: $t) {
            let p = self.ptr(off, core::mem::size_of::<$t>());
            // SAFETY: as in the load.
            unsafe { p.cast::<$t>().write_volatile(v) }
        }
        #[doc = concat!("Loads a big-endian `", stringify!($t), "` at `off`.")]
        #[inline]
        pub fn $read_be(&self, off: usize) -> $t {
            <$t>::from_be(self.$read(off))
        }
        #[doc = concat!("Stores a big-endian `", stringify!($t), "` at `off`.")]
        #[inline]
        pub fn $write_be(&self, off: usize, v: $t) {
            self.$write(off, v.to_be())
        }
    };
}

impl DmaBuf {
    /// Length in bytes (as requested).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty buffer (never: `alloc` refuses zero).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bus address of byte 0.
    pub fn bus_addr(&self) -> BusAddr {
        self.region().bus
    }

    /// The pool this buffer came from.
    pub fn pool(&self) -> &DmaPool {
        &self.pool
    }

    fn region(&self) -> &DmaRegion {
        // INVARIANT: `region` is only taken in `drop`.
        match &self.region {
            Some(r) => r,
            None => unreachable!("DmaBuf used after drop"),
        }
    }

    /// Checks `[off, off + width)` and natural alignment; returns the pointer.
    #[inline(always)]
    fn ptr(&self, off: usize, width: usize) -> *mut u8 {
        assert!(
            off.checked_add(width).is_some_and(|e| e <= self.len) && off.is_multiple_of(width),
            "DMA access at {off:#x} (width {width}) outside a {:#x}-byte buffer",
            self.len
        );
        // SAFETY: `off + width <= len <= region.len`, so the result stays inside
        // the allocation.
        unsafe { self.region().cpu.as_ptr().add(off) }
    }

    accessors!(read_u8, write_u8, read_u8_be, write_u8_be, u8);
    accessors!(read_u16, write_u16, read_be16, write_be16, u16);
    accessors!(read_u32, write_u32, read_be32, write_be32, u32);
    accessors!(read_u64, write_u64, read_be64, write_be64, u64);

    /// Copies `src` into the buffer at `off`.
    ///
    /// # Panics
    ///
    /// If the range does not fit (a driver bug).
    pub fn write_bytes(&self, off: usize, src: &[u8]) {
        if src.is_empty() {
            return;
        }
        let p = self.ptr(off, 1);
        assert!(
            off + src.len() <= self.len,
            "DMA copy past the end of the buffer"
        );
        // SAFETY: the destination range is inside the region (checked above);
        // `src` is ordinary memory that cannot overlap a DMA region we own.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
    }

    /// Copies bytes at `off` out into `dst`.
    ///
    /// # Panics
    ///
    /// If the range does not fit (a driver bug).
    pub fn read_bytes(&self, off: usize, dst: &mut [u8]) {
        if dst.is_empty() {
            return;
        }
        let p = self.ptr(off, 1);
        assert!(
            off + dst.len() <= self.len,
            "DMA copy past the end of the buffer"
        );
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        // SAFETY: as in `write_bytes`, in the other direction.
        unsafe { core::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) };
    }

    /// Sets `len` bytes at `off` to `byte`.
    ///
    /// # Panics
    ///
    /// If the range does not fit (a driver bug).
    pub fn fill(&self, off: usize, len: usize, byte: u8) {
        if len == 0 {
            return;
        }
        let p = self.ptr(off, 1);
        assert!(off + len <= self.len, "DMA fill past the end of the buffer");
        // SAFETY: the range is inside the region (checked above).
        unsafe { core::ptr::write_bytes(p, byte, len) };
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            // SAFETY: the region came from this pool's allocator, is freed only
            // here, once, and the buffer is gone so the CPU cannot use it; the
            // driver must have stopped the device from using it (as in Linux,
            // freeing memory the device still owns is a driver bug).
            unsafe { self.pool.inner.free(region) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::ArenaDma;

    #[test]
    fn buffers_are_zeroed_aligned_and_returned_on_drop() {
        let arena = Arc::new(ArenaDma::new(1 << 20));
        let pool = DmaPool::new(arena.clone());
        let a = pool.alloc(100, 64).unwrap();
        let b = pool.alloc_pages(2).unwrap();
        assert_eq!(a.bus_addr().0 % 64, 0);
        assert_eq!(b.bus_addr().0 % 4096, 0);
        assert!((0..100).all(|i| a.read_u8(i) == 0));
        assert_eq!(pool.stats().allocations, 2);
        drop(a);
        drop(b);
        assert_eq!(pool.stats(), DmaStats::default());
    }

    #[test]
    fn be_accessors_and_device_view_agree() {
        let arena = Arc::new(ArenaDma::new(1 << 16));
        let pool = DmaPool::new(arena.clone());
        let buf = pool.alloc(64, 8).unwrap();
        buf.write_be32(4, 0x0a0b_0c0d);
        buf.write_be64(8, 0x0102_0304_0506_0708);
        let mut dev = [0u8; 12];
        arena.device_read(buf.bus_addr().add(4), &mut dev).unwrap();
        assert_eq!(dev, [0xa, 0xb, 0xc, 0xd, 1, 2, 3, 4, 5, 6, 7, 8]);
        arena
            .device_write(buf.bus_addr().add(16), &[0xff, 0, 0, 1])
            .unwrap();
        assert_eq!(buf.read_be32(16), 0xff00_0001);
        let mut out = [0u8; 4];
        buf.read_bytes(16, &mut out);
        assert_eq!(out, [0xff, 0, 0, 1]);
    }

    #[test]
    fn bad_requests_and_exhaustion_are_errors() {
        let pool = DmaPool::new(Arc::new(ArenaDma::new(8192)));
        assert_eq!(pool.alloc(0, 8).err(), Some(Error::BadRequest));
        assert_eq!(pool.alloc(8, 3).err(), Some(Error::BadRequest));
        let _a = pool.alloc_pages(2).unwrap();
        assert_eq!(pool.alloc(1, 1).err(), Some(Error::NoMemory));
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_bounds_access_is_caught() {
        let pool = DmaPool::new(Arc::new(ArenaDma::new(8192)));
        let b = pool.alloc(16, 16).unwrap();
        b.read_u32(16);
    }
}
