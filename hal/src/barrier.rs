//! Memory barriers under their Linux names, so ordering can be checked against
//! `cq.c`/`qp.c`/`cmd.c` line by line.
//!
//! On x86_64 (TSO) the CPU only reorders a store before a later load, so:
//! `mb` is `mfence`, `rmb` is `lfence`, `wmb` is `sfence` (all three also
//! compiler barriers, and they order MMIO against memory, which matters once
//! write-combining mappings exist); `dma_rmb`/`dma_wmb`, which only order
//! accesses to coherent DMA memory among themselves, are compiler barriers,
//! as in Linux's x86 `barrier.h`.

use core::sync::atomic::{Ordering, compiler_fence};

/// Full barrier: orders all earlier loads and stores before all later ones.
#[inline(always)]
pub fn mb() {
    record!(crate::fake::record::Access::Barrier(
        crate::fake::record::Barrier::Mb
    ));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `mfence` only orders memory accesses; it has no other effect.
    unsafe {
        core::arch::asm!("mfence", options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    core::sync::atomic::fence(Ordering::SeqCst);
}

/// Read barrier: earlier loads complete before later loads.
#[inline(always)]
pub fn rmb() {
    record!(crate::fake::record::Access::Barrier(
        crate::fake::record::Barrier::Rmb
    ));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `lfence` only orders loads; it has no other effect.
    unsafe {
        core::arch::asm!("lfence", options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    core::sync::atomic::fence(Ordering::Acquire);
}

/// Write barrier: earlier stores are visible before later stores (e.g. a
/// mailbox and HCR fields before the GO bit, a WQE before its doorbell).
#[inline(always)]
pub fn wmb() {
    record!(crate::fake::record::Access::Barrier(
        crate::fake::record::Barrier::Wmb
    ));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` only orders stores; it has no other effect.
    unsafe {
        core::arch::asm!("sfence", options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    core::sync::atomic::fence(Ordering::Release);
}

/// Orders loads from coherent DMA memory (read the owner bit, then the rest of
/// a CQE/EQE).
#[inline(always)]
pub fn dma_rmb() {
    record!(crate::fake::record::Access::Barrier(
        crate::fake::record::Barrier::DmaRmb
    ));
    compiler_fence(Ordering::SeqCst);
}

/// Orders stores to coherent DMA memory (write a WQE body, then its owner
/// bit or doorbell record).
#[inline(always)]
pub fn dma_wmb() {
    record!(crate::fake::record::Access::Barrier(
        crate::fake::record::Barrier::DmaWmb
    ));
    compiler_fence(Ordering::SeqCst);
}
