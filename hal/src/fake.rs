//! A host-side fake of the platform for tests and the device model.
//!
//! Host-side fake backend: memory-backed registers and config space, an arena
//! that plays physically contiguous DMA memory with a device-side view by bus
//! address, and a manual clock.
//!
//! Tests use these directly; the device model builds its BAR backends and its
//! DMA on top of [`ArenaDma`]'s device view, so the model reaches host memory
//! only by bus address, as a card does. (The arena lives in [`crate::dma`],
//! where `unsafe` is allowed; this module has none.) [`record`] logs the
//! driver's DMA stores, barriers and register writes in program order.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use core::time::Duration;

pub mod record;

pub use crate::dma::arena::ArenaDma;
use crate::mmio::RegisterBackend;
use crate::pci::ConfigSpace;
use crate::time::Clock;

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
    fn mem_config_keeps_status_on_command_writes() {
        let c = MemConfig::new();
        c.set32(4, 0x0010_0000);
        c.write32(4, 0xffff_0007);
        assert_eq!(c.read32(4), 0x0010_0007);
    }
}
