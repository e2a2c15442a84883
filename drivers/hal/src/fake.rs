//! Host-side fake backend: memory-backed registers and config space, an arena
//! that plays physically contiguous DMA memory with a device-side view by bus
//! address, and a manual clock.
//!
//! Tests use these directly; the device model builds its BAR backends and its
//! DMA on top of [`ArenaDma`]'s device view, so the model reaches host memory
//! only by bus address, as a card does.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use core::time::Duration;

use crate::dma::{BusAddr, DmaAllocator, DmaRegion, DmaStats, RangeAllocator};
use crate::mmio::RegisterBackend;
use crate::pci::ConfigSpace;
use crate::time::Clock;
use crate::{Error, Result};

/// A register window that is plain memory (atomically accessed words).
pub struct MemBar {
    words: Vec<AtomicU32>,
}

impl MemBar {
    /// `len` bytes (rounded up to whole dwords), zeroed.
    pub fn new(len: usize) -> MemBar {
        MemBar {
            words: (0..len.div_ceil(4)).map(|_| AtomicU32::new(0)).collect(),
        }
    }
    /// The bytes at `[off, off + len)` as memory holds them.
    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        (off..off + len)
            .map(|i| self.words[i / 4].load(Ordering::Acquire).to_ne_bytes()[i % 4])
            .collect()
    }
}

impl RegisterBackend for MemBar {
    fn read32(&self, offset: usize) -> u32 {
        self.words[offset / 4].load(Ordering::Acquire)
    }
    fn write32(&self, offset: usize, value: u32) {
        self.words[offset / 4].store(value, Ordering::Release)
    }
}

/// A config space that is plain memory, recording the last value written to
/// each dword.
pub struct MemConfig {
    words: [AtomicU32; 1024],
    written: [AtomicU64; 1024],
}

impl Default for MemConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl MemConfig {
    /// An all-zero config space.
    pub fn new() -> MemConfig {
        MemConfig {
            words: core::array::from_fn(|_| AtomicU32::new(0)),
            written: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
    /// Sets a dword without recording it as a driver write.
    pub fn set32(&self, off: u16, v: u32) {
        self.words[usize::from(off / 4)].store(v, Ordering::Release);
    }
    /// The last value the driver wrote to the dword at `off`.
    pub fn last_write(&self, off: u16) -> Option<u32> {
        let w = self.written[usize::from(off / 4)].load(Ordering::Acquire);
        (w >> 32 != 0).then_some(w as u32)
    }
}

impl ConfigSpace for MemConfig {
    fn read32(&self, offset: u16) -> u32 {
        self.words[usize::from(offset / 4) % 1024].load(Ordering::Acquire)
    }
    fn write32(&self, offset: u16, value: u32) {
        let i = usize::from(offset / 4) % 1024;
        self.written[i].store((1 << 32) | u64::from(value), Ordering::Release);
        // The command register's RW1C status half is not stored.
        let v = if i == 1 {
            (self.words[1].load(Ordering::Acquire) & 0xffff_0000) | (value & 0xffff)
        } else {
            value
        };
        self.words[i].store(v, Ordering::Release);
    }
}

/// A contiguous arena standing for host RAM that a device can reach.
///
/// Allocations are first-fit over 64-byte granules; bus addresses start at
/// `bus_base` (default 0x1_0000_0000, so a driver that confuses a bus address
/// with a small offset or a pointer is caught).
pub struct ArenaDma {
    base: NonNull<u8>,
    len: usize,
    bus_base: u64,
    state: spin_lock::Lock<RangeAllocator>,
}

/// A minimal spin lock, so the fake needs no dependency.
mod spin_lock {
    use core::cell::UnsafeCell;
    use core::sync::atomic::{AtomicBool, Ordering};

    pub struct Lock<T> {
        held: AtomicBool,
        value: UnsafeCell<T>,
    }
    // SAFETY: the value is only reached through `with`, which holds the lock.
    unsafe impl<T: Send> Sync for Lock<T> {}
    // SAFETY: moving the lock moves the value; `T: Send` suffices.
    unsafe impl<T: Send> Send for Lock<T> {}

    impl<T> Lock<T> {
        pub const fn new(v: T) -> Self {
            Lock {
                held: AtomicBool::new(false),
                value: UnsafeCell::new(v),
            }
        }
        pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
            while self
                .held
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                core::hint::spin_loop();
            }
            // SAFETY: the lock is held, so this is the only reference.
            let r = f(unsafe { &mut *self.value.get() });
            self.held.store(false, Ordering::Release);
            r
        }
    }
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
        let layout = core::alloc::Layout::from_size_align(len, 4096).expect("arena layout");
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { alloc::alloc::alloc_zeroed(layout) };
        let base = NonNull::new(p).unwrap_or_else(|| alloc::alloc::handle_alloc_error(layout));
        ArenaDma {
            base,
            len,
            bus_base,
            state: spin_lock::Lock::new(RangeAllocator::new(len, GRANULE)),
        }
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
        // SAFETY: the range is inside the arena allocation (checked); plain
        // bytes have no validity requirements. The driver may be accessing
        // the same bytes, as with real DMA; both sides use raw accesses.
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
        let layout = core::alloc::Layout::from_size_align(self.len, 4096).expect("arena layout");
        // SAFETY: allocated in `with_bus_base` with this layout; no `DmaBuf`
        // can outlive the arena because each holds a pool (an `Arc` of it).
        unsafe { alloc::alloc::dealloc(self.base.as_ptr(), layout) };
    }
}

// SAFETY: `alloc` hands out non-overlapping, zeroed, aligned ranges of the
// arena, reachable by the device at the matching bus address.
unsafe impl DmaAllocator for ArenaDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaRegion> {
        let (off, size) = self.state.with(|r| r.alloc(len, align, self.bus_base))?;
        // SAFETY: `off + size <= len`: inside the arena allocation.
        let cpu = unsafe { self.base.as_ptr().add(off) };
        // SAFETY: the range was just reserved (no other region overlaps it);
        // zero it so every allocation starts zeroed.
        unsafe { core::ptr::write_bytes(cpu, 0, size) };
        let cpu = NonNull::new(cpu).ok_or(Error::NoMemory)?;
        // SAFETY: `cpu` is valid for `size >= len` bytes until freed, exclusive,
        // and reached by the device at the matching bus address through
        // `device_read`/`device_write`.
        Ok(unsafe { DmaRegion::new(cpu, BusAddr(self.bus_base + off as u64), len) })
    }

    unsafe fn free(&self, region: DmaRegion) {
        let off = (region.bus().0 - self.bus_base) as usize;
        self.state.with(|r| r.free(off));
    }

    fn stats(&self) -> DmaStats {
        self.state.with(|r| r.stats())
    }
}

/// A manual clock. Time moves only by [`FakeClock::advance`] and, if a relax
/// step is set, by each [`Clock::relax`] call, so deadline tests never sleep.
pub struct FakeClock {
    now: AtomicU64,
    relax_step_ns: AtomicU64,
}

impl Default for FakeClock {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeClock {
    /// A clock at 0 that never moves by itself.
    pub fn new() -> FakeClock {
        FakeClock {
            now: AtomicU64::new(0),
            relax_step_ns: AtomicU64::new(0),
        }
    }
    /// A clock at 0 that moves `step` on each `relax`.
    pub fn with_relax_step(step: Duration) -> FakeClock {
        let c = FakeClock::new();
        c.set_relax_step(step);
        c
    }
    /// Changes the step taken on each `relax`.
    pub fn set_relax_step(&self, step: Duration) {
        self.relax_step_ns.store(
            u64::try_from(step.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
    /// Moves time forward.
    pub fn advance(&self, d: Duration) {
        self.now.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::AcqRel,
        );
    }
    /// A shared handle, for code that wants an `Arc<dyn Clock>`.
    pub fn shared(self) -> Arc<FakeClock> {
        Arc::new(self)
    }
}

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }
    fn relax(&self) {
        let step = self.relax_step_ns.load(Ordering::Relaxed);
        if step == 0 {
            core::hint::spin_loop();
        } else {
            self.now.fetch_add(step, Ordering::AcqRel);
        }
    }
    fn delay(&self, d: Duration) {
        self.advance(d);
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

    #[test]
    fn mem_config_keeps_status_on_command_writes() {
        let c = MemConfig::new();
        c.set32(4, 0x0010_0000);
        c.write32(4, 0xffff_0007);
        assert_eq!(c.read32(4), 0x0010_0007);
    }
}
