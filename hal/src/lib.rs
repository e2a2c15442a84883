//! The platform layer the drivers are written against.
//!
//! Register access, DMA memory, barriers, big-endian fields, time and the PCI
//! function.
//!
//! It plays the part of the small "Linux to our kernel" shim (WinOF's `l2w`):
//! Linux names above (`wmb`, `dma_rmb`, `readl`-like accessors), one
//! implementation per platform below. The kernel provides the real one (MMIO
//! mappings, physically contiguous DMA, the TSC clock, port-I/O config space);
//! [`fake`] provides a host one for tests, and the device model plugs its
//! own register backend and DMA arena in through the same traits, so the
//! driver crates have one code path.
//!
//! `unsafe` lives only in [`mmio`], [`dma`] and [`barrier`]: the crate denies
//! `unsafe_code` and only those three modules are let off the lint.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

/// Records an access for [`fake::record`] where its hooks are compiled in
/// (debug builds with the fake); nothing otherwise, so the kernel's and
/// every release build's accessors are unchanged.
macro_rules! record {
    ($a:expr) => {
        #[cfg(all(any(test, feature = "fake"), debug_assertions))]
        $crate::fake::record::note($a);
    };
}

#[allow(unsafe_code)]
pub mod barrier;
pub mod be;
#[allow(unsafe_code)]
pub mod dma;
#[allow(unsafe_code)]
pub mod mmio;
pub mod pci;
pub mod time;

#[cfg(any(test, feature = "fake"))]
pub mod fake;

pub use dma::{
    BusAddr, DmaAllocator, DmaBlock, DmaBuf, DmaPool, DmaRecord, DmaRegion, DmaStats, DmaWindow,
    RangeAllocator,
};
pub use mmio::{Bar, Doorbell, RegisterBackend};
pub use pci::{BarInfo, BarKind, ConfigSpace, PciAddress, PciFunction};
pub use time::{Clock, Deadline};

use core::fmt;

/// Errors of the platform layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The DMA pool has no contiguous range of the requested size left.
    NoMemory,
    /// A size or alignment the allocator cannot honour (zero, not a power of
    /// two, or larger than the pool).
    BadRequest,
    /// The BAR was already handed out: each BAR is claimed once.
    AlreadyClaimed,
    /// The function has no memory BAR with that index.
    NoSuchBar,
    /// A poll did not see its condition before the deadline.
    TimedOut,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::NoMemory => "out of DMA memory",
            Error::BadRequest => "invalid DMA size or alignment",
            Error::AlreadyClaimed => "BAR already claimed",
            Error::NoSuchBar => "no such memory BAR",
            Error::TimedOut => "timed out",
        })
    }
}

/// Result with the platform layer's [`Error`].
pub type Result<T = ()> = core::result::Result<T, Error>;
