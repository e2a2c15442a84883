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
    /// [`alloc`](Self::alloc) for a large buffer whose zeroing takes long
    /// (hundreds of MiB): `progress` is called every few MiB meanwhile, so
    /// the caller's event queues and MADs are served (a port whose SMPs go
    /// unanswered for seconds is dropped by the SM). By default, `alloc`.
    fn alloc_with_progress(
        &self,
        len: usize,
        align: usize,
        progress: &mut dyn FnMut(),
    ) -> Result<DmaRegion> {
        let _ = progress;
        self.alloc(len, align)
    }
}

/// First-fit bookkeeping of a contiguous range: which `[offset, offset + len)`
/// pieces are handed out. Pure arithmetic; platforms pair it with memory.
#[derive(Debug)]
pub struct RangeAllocator {
    len: usize,
    granule: usize,
    /// Allocated `(offset, len)` pieces, sorted by offset.
    used: alloc::vec::Vec<(usize, usize)>,
    /// `used[..packed]` leave no gap before the first of them nor between
    /// them: first fit starts its scan after them, so handing out pages one
    /// by one (ICM, queues) costs one step each, not the whole list.
    packed: usize,
    stats: DmaStats,
}

impl RangeAllocator {
    /// Manages `[0, len)` in multiples of `granule` (a power of two).
    pub fn new(len: usize, granule: usize) -> RangeAllocator {
        RangeAllocator {
            len,
            granule: granule.max(1),
            used: alloc::vec::Vec::new(),
            packed: 0,
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
        // No gap in the packed prefix can hold anything.
        let mut cursor = self.packed_end();
        let mut slot = None;
        for (i, &(o, l)) in self.used.iter().enumerate().skip(self.packed) {
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
        // `i >= packed`: the prefix still holds; the new piece may extend it.
        let mut end = self.packed_end();
        while let Some(&(o, l)) = self.used.get(self.packed) {
            if o != end {
                break;
            }
            end = o + l;
            self.packed += 1;
        }
        self.stats.allocations += 1;
        self.stats.bytes += size;
        Ok((start, size))
    }

    /// Where the packed prefix ends (0 if it is empty).
    fn packed_end(&self) -> usize {
        self.packed
            .checked_sub(1)
            .map_or(0, |p| self.used[p].0 + self.used[p].1)
    }

    /// Releases the piece that starts at `offset`; false if there is none.
    pub fn free(&mut self, offset: usize) -> bool {
        match self.used.binary_search_by_key(&offset, |&(o, _)| o) {
            Ok(i) => {
                let (_, l) = self.used.remove(i);
                self.packed = self.packed.min(i);
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
            region,
            len,
            pool: self.clone(),
        })
    }

    /// A zeroed, page-aligned buffer of `pages` 4 KiB pages.
    pub fn alloc_pages(&self, pages: usize) -> Result<DmaBuf> {
        let len = pages.checked_mul(4096).ok_or(Error::BadRequest)?;
        self.alloc(len, 4096)
    }

    /// [`alloc_pages`](Self::alloc_pages) calling `progress` every few MiB
    /// while the platform zeroes the buffer
    /// ([`DmaAllocator::alloc_with_progress`]): for regions so large that
    /// zeroing them would leave the device unpolled for seconds.
    pub fn alloc_pages_with_progress(
        &self,
        pages: usize,
        progress: &mut dyn FnMut(),
    ) -> Result<DmaBuf> {
        let len = pages.checked_mul(4096).ok_or(Error::BadRequest)?;
        if len == 0 {
            return Err(Error::BadRequest);
        }
        let region = self.inner.alloc_with_progress(len, 4096, progress)?;
        debug_assert!(region.len >= len && region.bus.0 % 4096 == 0);
        Ok(DmaBuf {
            region,
            len,
            pool: self.clone(),
        })
    }

    /// What the pool has handed out right now.
    pub fn stats(&self) -> DmaStats {
        self.inner.stats()
    }
}

#[cold]
#[inline(never)]
fn out_of_bounds(off: usize, width: usize, len: usize) -> ! {
    panic!("DMA access at {off:#x} (width {width}) outside a {len:#x}-byte buffer")
}

/// A DMA buffer owned by the driver: CPU view plus bus address, freed on drop.
///
/// All accessors are bounds-checked volatile accesses; multi-byte `_be`
/// accessors read and write big-endian device formats.
pub struct DmaBuf {
    /// Given back to the pool in `drop` (a copy of it: the buffer is never
    /// used again).
    region: DmaRegion,
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
            // SAFETY: `ptr` checked the naturally aligned access is inside the
            // region (valid per DmaRegion, 8-byte aligned per DmaPool::alloc).
            unsafe { p.cast::<$t>().read_volatile() }
        }
        #[doc = concat!("Stores a native-endian `", stringify!($t), "` at `off`.")]
        #[inline]
        pub fn $write(&self, off: usize, v: $t) {
            let p = self.ptr(off, core::mem::size_of::<$t>());
            // SAFETY: as in the load.
            unsafe { p.cast::<$t>().write_volatile(v) }
            record!(crate::fake::record::Access::Store {
                addr: p as usize,
                len: core::mem::size_of::<$t>(),
            });
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

/// A burst view of a [`DmaBuf`]: its CPU pointer and length copied into a
/// small `Copy` value, so a run of accesses (building one WQE, reading one
/// CQE) keeps them in registers instead of re-reading the buffer after each
/// volatile access. Same bounds and alignment checks, same accessors; it
/// borrows the buffer, which therefore outlives it.
#[derive(Clone, Copy)]
pub struct DmaWindow<'a> {
    cpu: NonNull<u8>,
    len: usize,
    _buf: core::marker::PhantomData<&'a DmaBuf>,
}

impl DmaWindow<'_> {
    /// Checks `[off, off + width)` and natural alignment; returns the pointer.
    #[inline(always)]
    fn ptr(&self, off: usize, width: usize) -> *mut u8 {
        if !(off.checked_add(width).is_some_and(|e| e <= self.len) && off.is_multiple_of(width)) {
            out_of_bounds(off, width, self.len);
        }
        // SAFETY: `off + width <= len`, the length of the live region the
        // window borrows (see `DmaBuf::window`).
        unsafe { self.cpu.as_ptr().add(off) }
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
    #[inline]
    pub fn write_bytes(&self, off: usize, src: &[u8]) {
        if src.is_empty() {
            return;
        }
        if off.checked_add(src.len()).is_none_or(|e| e > self.len) {
            out_of_bounds(off, src.len(), self.len);
        }
        // SAFETY: the destination range is inside the region (checked above);
        // `src` is ordinary memory that cannot overlap a DMA region.
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr(), self.cpu.as_ptr().add(off), src.len())
        };
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        record!(crate::fake::record::Access::Store {
            addr: self.cpu.as_ptr() as usize + off,
            len: src.len(),
        });
    }
}

impl<'a> DmaWindow<'a> {
    /// The `N`-byte block at `off` (8-byte aligned), checked once: the
    /// accesses of a [`DmaBlock`] at constant offsets need no check of
    /// their own once inlined (one check per WQE or CQE instead of one per
    /// field). `None` if it does not fit or `off` is not 8-byte aligned.
    #[inline(always)]
    pub fn block<const N: usize>(&self, off: usize) -> Option<DmaBlock<'a, N>> {
        // `off <= len - N` (with `len >= N`): the same test as
        // `off + N <= len` without an overflow check of its own.
        if self.len.checked_sub(N).is_some_and(|last| off <= last) && off.is_multiple_of(8) {
            // SAFETY: `off + N <= len`, inside the live region the window
            // borrows.
            let p = unsafe { self.cpu.as_ptr().add(off) };
            NonNull::new(p).map(|cpu| DmaBlock {
                cpu,
                _buf: core::marker::PhantomData,
            })
        } else {
            None
        }
    }
}

/// `N` bytes of a [`DmaBuf`] whose bounds were checked when the block was
/// made ([`DmaWindow::block`]); its accessors check the offset against the
/// constant `N` (and natural alignment; the block starts 8-byte aligned),
/// which the compiler folds away for constant offsets.
#[derive(Clone, Copy)]
pub struct DmaBlock<'a, const N: usize> {
    cpu: NonNull<u8>,
    _buf: core::marker::PhantomData<&'a DmaBuf>,
}

impl<const N: usize> DmaBlock<'_, N> {
    /// Checks `[off, off + width)` against `N` and natural alignment.
    #[inline(always)]
    fn ptr(&self, off: usize, width: usize) -> *mut u8 {
        if !(off.checked_add(width).is_some_and(|e| e <= N) && off.is_multiple_of(width)) {
            out_of_bounds(off, width, N);
        }
        // SAFETY: `off + width <= N`, and the block's `N` bytes are inside
        // the region (checked by `DmaWindow::block`); the block starts
        // 8-byte aligned in an 8-byte aligned buffer.
        unsafe { self.cpu.as_ptr().add(off) }
    }

    accessors!(read_u8, write_u8, read_u8_be, write_u8_be, u8);
    accessors!(read_u16, write_u16, read_be16, write_be16, u16);
    accessors!(read_u32, write_u32, read_be32, write_be32, u32);
    accessors!(read_u64, write_u64, read_be64, write_be64, u64);

    /// Copies `src` into the block at `off`.
    ///
    /// # Panics
    ///
    /// If the range does not fit (a driver bug).
    #[inline]
    pub fn write_bytes(&self, off: usize, src: &[u8]) {
        if off.checked_add(src.len()).is_none_or(|e| e > N) {
            out_of_bounds(off, src.len(), N);
        }
        // SAFETY: the destination range is inside the block (checked
        // above); `src` is ordinary memory that cannot overlap a DMA region.
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr(), self.cpu.as_ptr().add(off), src.len())
        };
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        record!(crate::fake::record::Access::Store {
            addr: self.cpu.as_ptr() as usize + off,
            len: src.len(),
        });
    }
}

/// `N` bytes of a shared [`DmaBuf`] checked once, when made, and kept: a
/// doorbell record that the driver writes on every post or poll (the RQ
/// producer counter, a CQ's consumer index). It holds the buffer, so the
/// memory outlives it; its accessors check the offset against the constant
/// `N` only, which the compiler folds away for constant offsets.
pub struct DmaRecord<const N: usize> {
    cpu: NonNull<u8>,
    buf: Arc<DmaBuf>,
}

// SAFETY: the record only performs volatile accesses of plain integers to
// memory that `buf` (Send + Sync) keeps alive; as for `DmaBuf`.
unsafe impl<const N: usize> Send for DmaRecord<N> {}
// SAFETY: as above: shared use is volatile loads/stores of plain integers.
unsafe impl<const N: usize> Sync for DmaRecord<N> {}

impl<const N: usize> fmt::Debug for DmaRecord<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DmaRecord<{N}>({:?})", self.buf)
    }
}

impl<const N: usize> DmaRecord<N> {
    /// Alignment of the record's start: `N` up to 8 bytes (`N` is a
    /// multiple of 4: 4-byte records are doorbell slots).
    const ALIGN: usize = if N >= 8 { 8 } else { 4 };

    /// The `N` bytes at `off` of `buf`; `None` if they do not fit, `N` is
    /// not a multiple of 4, or `off` is not aligned to `min(N, 8)`.
    pub fn new(buf: Arc<DmaBuf>, off: usize) -> Option<Self> {
        if !(N.is_multiple_of(4)
            && off.checked_add(N).is_some_and(|e| e <= buf.len)
            && off.is_multiple_of(Self::ALIGN))
        {
            return None;
        }
        // SAFETY: `off + N <= len`, inside the live region `buf` owns.
        let p = unsafe { buf.region().cpu.as_ptr().add(off) };
        NonNull::new(p).map(|cpu| DmaRecord { cpu, buf })
    }

    /// The buffer the record lives in.
    pub fn buf(&self) -> &Arc<DmaBuf> {
        &self.buf
    }

    /// Checks `[off, off + width)` against `N` and natural alignment (the
    /// record starts aligned to `min(N, 8)`).
    #[inline(always)]
    fn ptr(&self, off: usize, width: usize) -> *mut u8 {
        if !(off.checked_add(width).is_some_and(|e| e <= N)
            && off.is_multiple_of(width)
            && width <= Self::ALIGN)
        {
            out_of_bounds(off, width, N);
        }
        // SAFETY: `off + width <= N`, and the record's `N` bytes are inside
        // the region `buf` keeps alive (checked by `DmaRecord::new`).
        unsafe { self.cpu.as_ptr().add(off) }
    }

    accessors!(read_u8, write_u8, read_u8_be, write_u8_be, u8);
    accessors!(read_u16, write_u16, read_be16, write_be16, u16);
    accessors!(read_u32, write_u32, read_be32, write_be32, u32);
    accessors!(read_u64, write_u64, read_be64, write_be64, u64);
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

    /// A burst view for a run of accesses (see [`DmaWindow`]).
    #[inline(always)]
    pub fn window(&self) -> DmaWindow<'_> {
        DmaWindow {
            cpu: self.region().cpu,
            len: self.len,
            _buf: core::marker::PhantomData,
        }
    }

    /// The bus address of byte 0.
    pub fn bus_addr(&self) -> BusAddr {
        self.region().bus
    }

    /// The pool this buffer came from.
    pub fn pool(&self) -> &DmaPool {
        &self.pool
    }

    /// The CPU address of byte 0, as a number (where [`crate::fake::record`]
    /// places a store).
    #[cfg(any(test, feature = "fake"))]
    pub(crate) fn cpu_addr(&self) -> usize {
        self.region.cpu.as_ptr() as usize
    }

    #[inline(always)]
    fn region(&self) -> &DmaRegion {
        &self.region
    }

    /// Checks `[off, off + width)` and natural alignment; returns the pointer.
    #[inline(always)]
    fn ptr(&self, off: usize, width: usize) -> *mut u8 {
        if !(off.checked_add(width).is_some_and(|e| e <= self.len) && off.is_multiple_of(width)) {
            // Out of line, so the hot path does not build panic arguments.
            out_of_bounds(off, width, self.len);
        }
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
    #[inline]
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
        record!(crate::fake::record::Access::Store {
            addr: p as usize,
            len: src.len(),
        });
    }

    /// Copies bytes at `off` out into `dst`.
    ///
    /// # Panics
    ///
    /// If the range does not fit (a driver bug).
    #[inline]
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
        record!(crate::fake::record::Access::Store {
            addr: p as usize,
            len,
        });
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        let region = DmaRegion {
            cpu: self.region.cpu,
            bus: self.region.bus,
            len: self.region.len,
        };
        // Freeing memory the device still owns is a driver bug, as in Linux.
        // SAFETY: the region came from this pool and is freed once, here;
        // `self` (the only other holder of it) is not used after `drop`.
        unsafe { self.pool.inner.free(region) };
    }
}

/// The host-side DMA arena behind [`crate::fake::ArenaDma`].
#[cfg(any(test, feature = "fake"))]
pub(crate) mod arena {
    extern crate std;

    use core::ptr::NonNull;
    use core::sync::atomic::AtomicU32;

    use super::{BusAddr, DmaAllocator, DmaRegion, DmaStats, RangeAllocator};
    use crate::{Error, Result};

    /// A contiguous arena standing for host RAM that a device can reach.
    ///
    /// Allocations are first-fit over 64-byte granules; bus addresses start at
    /// `bus_base` (default 0x1_0000_0000, so a driver that confuses a bus address
    /// with a small offset or a pointer is caught).
    pub struct ArenaDma {
        base: NonNull<u8>,
        len: usize,
        bus_base: u64,
        state: std::sync::Mutex<RangeAllocator>,
    }

    // SAFETY: the arena memory is owned by the `ArenaDma` and only reached through
    // its methods (which lock the bookkeeping) or through `DmaBuf` volatile
    // accessors; the raw pointer itself is not tied to a thread.
    unsafe impl Send for ArenaDma {}
    // SAFETY: as above.
    unsafe impl Sync for ArenaDma {}

    const GRANULE: usize = 64;

    impl ArenaDma {
        /// An arena of `len` bytes with bus addresses from 0x1_0000_0000.
        pub fn new(len: usize) -> ArenaDma {
            Self::with_bus_base(len, 0x1_0000_0000)
        }

        /// An arena of `len` bytes (rounded up to 4 KiB) whose byte 0 is at bus
        /// address `bus_base` (4 KiB aligned).
        pub fn with_bus_base(len: usize, bus_base: u64) -> ArenaDma {
            let len = len.div_ceil(4096).max(1) * 4096;
            let Ok(layout) = core::alloc::Layout::from_size_align(len, 4096) else {
                // Only a size near usize::MAX gets here; treat it as out of memory.
                alloc::alloc::handle_alloc_error(core::alloc::Layout::new::<[u8; 4096]>())
            };
            // SAFETY: `layout` has a non-zero size.
            let p = unsafe { alloc::alloc::alloc_zeroed(layout) };
            let base = NonNull::new(p).unwrap_or_else(|| alloc::alloc::handle_alloc_error(layout));
            ArenaDma {
                base,
                len,
                bus_base,
                state: std::sync::Mutex::new(RangeAllocator::new(len, GRANULE)),
            }
        }

        fn ranges(&self) -> std::sync::MutexGuard<'_, RangeAllocator> {
            // A panic while holding the lock cannot leave the bookkeeping torn
            // (every update is a single insert or remove), so poisoning is ignored.
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Size of the arena.
        pub fn len(&self) -> usize {
            self.len
        }
        /// True if the arena is empty (never).
        pub fn is_empty(&self) -> bool {
            self.len == 0
        }
        /// Bus address of byte 0.
        pub fn bus_base(&self) -> BusAddr {
            BusAddr(self.bus_base)
        }

        /// Offset of `[bus, bus + len)` inside the arena, or `None` if any of it is
        /// outside (a DMA fault, as an IOMMU would report).
        pub fn offset_of(&self, bus: BusAddr, len: usize) -> Option<usize> {
            let off = usize::try_from(bus.0.checked_sub(self.bus_base)?).ok()?;
            (off.checked_add(len)? <= self.len).then_some(off)
        }

        /// The device reads host memory at `bus`.
        pub fn device_read(&self, bus: BusAddr, dst: &mut [u8]) -> Result<()> {
            let off = self.offset_of(bus, dst.len()).ok_or(Error::BadRequest)?;
            // The driver may touch the same bytes, as with real DMA (raw on both sides).
            // SAFETY: the range is inside the arena (checked); bytes have no invalid values.
            unsafe { core::ptr::copy(self.base.as_ptr().add(off), dst.as_mut_ptr(), dst.len()) };
            Ok(())
        }

        /// The device writes host memory at `bus`.
        pub fn device_write(&self, bus: BusAddr, src: &[u8]) -> Result<()> {
            let off = self.offset_of(bus, src.len()).ok_or(Error::BadRequest)?;
            // SAFETY: as in `device_read`.
            unsafe { core::ptr::copy(src.as_ptr(), self.base.as_ptr().add(off), src.len()) };
            Ok(())
        }

        /// The device's atomic view of the aligned dword at `bus` (for doorbell
        /// records and ownership words shared with another thread).
        pub fn device_atomic_u32(&self, bus: BusAddr) -> Result<&AtomicU32> {
            if !bus.0.is_multiple_of(4) {
                return Err(Error::BadRequest);
            }
            let off = self.offset_of(bus, 4).ok_or(Error::BadRequest)?;
            // SAFETY: the dword is inside the arena, aligned, and lives as long as
            // `self`; `AtomicU32` has the layout of `u32`.
            Ok(unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(off).cast::<u32>()) })
        }
    }

    impl Drop for ArenaDma {
        fn drop(&mut self) {
            let Ok(layout) = core::alloc::Layout::from_size_align(self.len, 4096) else {
                return; // cannot happen: `new` checked this layout
            };
            // SAFETY: allocated in `with_bus_base` with this layout; no `DmaBuf`
            // can outlive the arena because each holds a pool (an `Arc` of it).
            unsafe { alloc::alloc::dealloc(self.base.as_ptr(), layout) };
        }
    }

    // SAFETY: `alloc` hands out non-overlapping, zeroed, aligned ranges of the
    // arena, reachable by the device at the matching bus address.
    unsafe impl DmaAllocator for ArenaDma {
        fn alloc(&self, len: usize, align: usize) -> Result<DmaRegion> {
            let (off, size) = self.ranges().alloc(len, align, self.bus_base)?;
            // SAFETY: `off + size <= len`: inside the arena allocation.
            let cpu = unsafe { self.base.as_ptr().add(off) };
            // SAFETY: the range was just reserved (no other region overlaps it);
            // zero it so every allocation starts zeroed.
            unsafe { core::ptr::write_bytes(cpu, 0, size) };
            let cpu = NonNull::new(cpu).ok_or(Error::NoMemory)?;
            // SAFETY: `cpu` is valid for `size >= len` bytes until freed, exclusive, and
            // reached by the device at this bus address via `device_read`/`device_write`.
            Ok(unsafe { DmaRegion::new(cpu, BusAddr(self.bus_base + off as u64), len) })
        }

        unsafe fn free(&self, region: DmaRegion) {
            let off = (region.bus().0 - self.bus_base) as usize;
            self.ranges().free(off);
        }

        fn stats(&self) -> DmaStats {
            self.ranges().stats()
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn arena_reuses_freed_space_and_keeps_alignment() {
            let arena = ArenaDma::new(16384);
            let a = arena.alloc(4096, 4096).unwrap();
            let b = arena.alloc(100, 64).unwrap();
            assert_eq!(a.bus().0, 0x1_0000_0000);
            assert_eq!(b.bus().0, 0x1_0000_1000);
            // SAFETY: `a` came from this arena and is not used again.
            unsafe { arena.free(a) };
            let c = arena.alloc(64, 64).unwrap();
            assert_eq!(c.bus().0, 0x1_0000_0000, "first fit reuses the hole");
            assert_eq!(
                arena.stats(),
                DmaStats {
                    allocations: 2,
                    bytes: 192
                }
            );
            assert!(arena.offset_of(BusAddr(0x1_0000_4000), 1).is_none());
            assert!(arena.offset_of(BusAddr(0xfff), 1).is_none());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::arena::ArenaDma;
    use super::*;

    #[test]
    fn records_are_checked_once_and_keep_their_buffer() {
        let arena = Arc::new(ArenaDma::new(1 << 20));
        let pool = DmaPool::new(arena.clone());
        let buf = Arc::new(pool.alloc(4096, 4096).unwrap());
        assert!(
            DmaRecord::<4>::new(buf.clone(), 4094).is_none(),
            "past the end"
        );
        assert!(DmaRecord::<4>::new(buf.clone(), 2).is_none(), "misaligned");
        assert!(DmaRecord::<8>::new(buf.clone(), 4).is_none(), "a pair on 8");
        let r = DmaRecord::<4>::new(buf.clone(), 4092).unwrap();
        r.write_be32(0, 0x1234_5678);
        assert_eq!(buf.read_be32(4092), 0x1234_5678);
        assert_eq!(r.read_be32(0), 0x1234_5678);
        drop(buf);
        // The record holds the buffer: still allocated, still writable.
        assert_eq!(pool.stats().allocations, 1);
        r.write_be32(0, 1);
        drop(r);
        assert_eq!(pool.stats().allocations, 0);
    }

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

    /// An arena whose large allocations report progress, as the kernel's
    /// pool does while zeroing: counts the calls it makes.
    struct Stepping(ArenaDma);

    // SAFETY: forwards to the arena, which keeps the contract.
    unsafe impl DmaAllocator for Stepping {
        fn alloc(&self, len: usize, align: usize) -> Result<DmaRegion> {
            self.0.alloc(len, align)
        }
        unsafe fn free(&self, region: DmaRegion) {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.0.free(region) }
        }
        fn stats(&self) -> DmaStats {
            self.0.stats()
        }
        fn alloc_with_progress(
            &self,
            len: usize,
            align: usize,
            progress: &mut dyn FnMut(),
        ) -> Result<DmaRegion> {
            for _ in 0..len / 4096 {
                progress();
            }
            self.0.alloc(len, align)
        }
    }

    #[test]
    fn large_allocations_call_the_progress_function() {
        let pool = DmaPool::new(Arc::new(Stepping(ArenaDma::new(1 << 16))));
        let mut calls = 0;
        let b = pool
            .alloc_pages_with_progress(4, &mut || calls += 1)
            .unwrap();
        assert_eq!(calls, 4, "the platform's progress calls reach the caller");
        assert_eq!((b.len(), b.bus_addr().0 % 4096), (4 * 4096, 0));
        assert!((0..4 * 4096).all(|i| b.read_u8(i) == 0));
        assert_eq!(
            pool.alloc_pages_with_progress(0, &mut || calls += 1).err(),
            Some(Error::BadRequest)
        );
        // A platform without its own stepping: a plain allocation.
        let plain = DmaPool::new(Arc::new(ArenaDma::new(1 << 16)));
        let mut none = 0;
        let c = plain
            .alloc_pages_with_progress(2, &mut || none += 1)
            .unwrap();
        assert_eq!((c.len(), none), (2 * 4096, 0));
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
    fn a_window_sees_the_same_bytes_and_the_same_bounds() {
        let pool = DmaPool::new(Arc::new(ArenaDma::new(8192)));
        let b = pool.alloc(64, 64).unwrap();
        let w = b.window();
        w.write_be64(8, 0x0102_0304_0506_0708);
        w.write_bytes(16, &[9, 10]);
        assert_eq!(b.read_be32(8), 0x0102_0304);
        assert_eq!(w.read_u8(17), 10);
        b.write_be16(32, 0xabcd);
        assert_eq!(w.read_be16(32), 0xabcd);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.window().read_u32(64)));
        assert!(r.is_err(), "past the end");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            b.window().write_bytes(60, &[0; 8])
        }));
        assert!(r.is_err(), "a copy past the end");
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_bounds_access_is_caught() {
        let pool = DmaPool::new(Arc::new(ArenaDma::new(8192)));
        let b = pool.alloc(16, 16).unwrap();
        b.read_u32(16);
    }

    /// First fit with the packed prefix hands out exactly what a plain
    /// first-fit scan of every piece does, whatever the order of allocations
    /// and frees, sizes and alignments.
    #[test]
    fn range_allocator_is_first_fit_under_any_mix_of_allocs_and_frees() {
        // The plain scan: the first aligned start after any piece that fits.
        fn reference(
            used: &[(usize, usize)],
            len: usize,
            size: usize,
            align: usize,
            base: u64,
        ) -> Option<usize> {
            let fit = |c: usize| ((base + c as u64).next_multiple_of(align as u64) - base) as usize;
            let mut cursor = 0;
            for &(o, l) in used {
                if fit(cursor) + size <= o {
                    return Some(fit(cursor));
                }
                cursor = o + l;
            }
            (fit(cursor) + size <= len).then(|| fit(cursor))
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for base in [0u64, 0x1_0000_0000, 0x40] {
            let len = 1 << 20;
            let mut r = RangeAllocator::new(len, 64);
            let mut shadow: alloc::vec::Vec<(usize, usize)> = alloc::vec::Vec::new();
            for step in 0..4000 {
                // Runs of page-sized allocations, as a driver's bring-up.
                let free = shadow.len() > 8 && next() % 3 == 0;
                if free {
                    let k = (next() as usize) % shadow.len();
                    let (o, _) = shadow.remove(k);
                    assert!(r.free(o), "step {step}");
                } else {
                    let size = if next() % 4 == 0 {
                        1 + (next() as usize) % 20000
                    } else {
                        4096
                    };
                    let align = 1usize << (next() % 14);
                    let rounded = size.div_ceil(64) * 64;
                    let want = reference(&shadow, len, rounded, align.max(64), base);
                    let got = r.alloc(size, align, base).ok();
                    assert_eq!(
                        got.map(|g| g.0),
                        want,
                        "step {step}: {size} bytes aligned {align}"
                    );
                    if let Some((o, l)) = got {
                        assert_eq!(l, rounded);
                        let at = shadow.partition_point(|&(s, _)| s < o);
                        shadow.insert(at, (o, l));
                    }
                }
                let s = r.stats();
                assert_eq!(s.allocations, shadow.len());
                assert_eq!(s.bytes, shadow.iter().map(|p| p.1).sum::<usize>());
            }
        }
    }
}
