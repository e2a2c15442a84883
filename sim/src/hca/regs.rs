//! The register files behind BAR0 and BAR2.
//!
//! The register files behind BAR0 (HCR, ownership and reset semaphores,
//! software reset, catastrophic-error buffer, clear-interrupt register,
//! MSI-X table) and BAR2 (UAR pages with their doorbells); BlueFlame
//! registers and MSI-X delivery are not modelled.
//!
//! Registers hold what the CPU stored: big-endian values as raw native
//! loads/stores of four bytes, so `u32::from_be(raw)` is the register value.
//! Both files are arrays of atomics so that a model thread can poll them while
//! the driver writes them, exactly as the ivshmem emulator will; a file can
//! also be a window of shared memory ([`RegFile::from_raw_parts`]).

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// Host command register block.
pub const HCR_BASE: usize = 0x8_0680;
/// HCR size in bytes (7 dwords).
pub const HCR_LEN: usize = 0x1c;
/// HCR dword 6: status (31:24), GO (23), E (22), T (21), op_mod (15:12),
/// opcode (11:0).
pub const HCR_STATUS: usize = HCR_BASE + 0x18;
/// Ownership semaphore: a read of 0 claims the HCA; writing 0 releases it.
pub const OWNERSHIP: usize = 0x8_069c;
/// Software-reset block (Linux maps 0x400 bytes here).
pub const RESET_BASE: usize = 0xf_0000;
/// Software reset dword: BE bit 0 resets the device.
pub const RESET: usize = RESET_BASE + 0x10;
/// Reset semaphore: a read of 0 acquires it; a reset (or writing 0) frees it.
pub const RESET_SEMAPHORE: usize = RESET_BASE + 0x3fc;
/// Catastrophic-error buffer (reported by QUERY_FW).
pub const CATAS_BASE: usize = 0xa_0000;
/// Catastrophic-error buffer size in dwords.
pub const CATAS_DWORDS: usize = 16;
/// Clear-interrupt register (64 bit, reported by QUERY_FW).
pub const CLR_INT: usize = 0xb_0000;
/// Free-running internal clock (64 bit BE, reported by QUERY_FW).
pub const INTERNAL_CLOCK: usize = 0xc_0000;
/// MSI-X table (BAR0, per the MSI-X capability).
pub const MSIX_TABLE: usize = 0x7_c000;
/// MSI-X pending-bit array.
pub const MSIX_PBA: usize = 0x7_e000;

/// UAR page size.
pub const UAR_PAGE: usize = 4096;
/// Send doorbell within a UAR page (data path, later issue).
pub const UAR_SEND_DB: usize = 0x14;
/// CQ doorbell within a UAR page (data path, later issue).
pub const UAR_CQ_DB: usize = 0x20;
/// First EQ doorbell within a UAR page; EQ `n` rings page `n / 4` at
/// `0x800 + 8 * (n % 4)`.
pub const UAR_EQ_DB: usize = 0x800;

/// BAR2 offset of EQ `eqn`'s doorbell.
pub const fn eq_doorbell(eqn: u32) -> usize {
    (eqn as usize / 4) * UAR_PAGE + UAR_EQ_DB + 8 * (eqn as usize % 4)
}

/// A register file of `len` bytes: memory of its own, or a window of
/// shared memory (the ivshmem BAR windows of `cx3-emu`).
pub struct RegFile {
    words: Words,
}

enum Words {
    Owned(Box<[AtomicU32]>),
    /// # Invariants
    /// `ptr` is valid for atomic access to `len` dwords for the life of the
    /// `RegFile` (see [`RegFile::from_raw_parts`]).
    External(
        core::ptr::NonNull<AtomicU32>,
        usize,
        /// Keeps the memory alive (an mmap), if the caller handed it over.
        #[allow(dead_code)]
        Option<Arc<dyn Any + Send + Sync>>,
    ),
}

// SAFETY: every access is atomic, and an external window stays mapped for
// the life of the `RegFile` (its constructors' contract).
unsafe impl Send for RegFile {}
// SAFETY: as above; every access is an atomic load or store.
unsafe impl Sync for RegFile {}

impl RegFile {
    /// Zeroed registers.
    pub fn new(len: usize) -> RegFile {
        RegFile {
            words: Words::Owned((0..len / 4).map(|_| AtomicU32::new(0)).collect()),
        }
    }

    /// A register file over `words` dwords of shared memory at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` must be 4-byte aligned and valid for reads and writes of
    /// `words * 4` bytes for as long as the returned `RegFile` (and any `Arc`
    /// of it) lives, and every other party must access that memory only with
    /// atomic operations (another process mapping the same file counts).
    pub unsafe fn from_raw_parts(ptr: core::ptr::NonNull<u32>, words: usize) -> RegFile {
        // INVARIANT: the caller guarantees validity for `words` dwords.
        RegFile {
            words: Words::External(ptr.cast(), words, None),
        }
    }

    /// A register file over `words` dwords of shared memory at `ptr` that
    /// `owner` keeps valid (e.g. the mapping of an ivshmem window): the file
    /// holds `owner` for as long as it lives.
    ///
    /// # Safety
    ///
    /// `ptr` must be 4-byte aligned and valid for reads and writes of
    /// `words * 4` bytes for as long as `owner` lives, and every other party
    /// must access that memory only with atomic operations (or be another
    /// process, such as a guest, whose stores are single aligned dwords).
    pub unsafe fn from_shared(
        owner: Arc<dyn Any + Send + Sync>,
        ptr: core::ptr::NonNull<u32>,
        words: usize,
    ) -> RegFile {
        // INVARIANT: the caller guarantees validity for `words` dwords while
        // `owner` lives, and the file holds `owner`.
        RegFile {
            words: Words::External(ptr.cast(), words, Some(owner)),
        }
    }

    fn words(&self) -> &[AtomicU32] {
        match &self.words {
            Words::Owned(b) => b,
            // SAFETY: `External` invariant: `len` aligned dwords, valid while
            // `self` lives; `AtomicU32` has the layout of `u32`.
            Words::External(p, len, _) => unsafe { core::slice::from_raw_parts(p.as_ptr(), *len) },
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.words().len() * 4
    }
    /// True for an empty file (never).
    pub fn is_empty(&self) -> bool {
        self.words().is_empty()
    }
    /// The raw dword at `off` (as the CPU stored it).
    pub fn raw(&self, off: usize) -> u32 {
        self.words()
            .get(off / 4)
            .map_or(u32::MAX, |w| w.load(Ordering::Acquire))
    }
    /// Stores a raw dword.
    pub fn set_raw(&self, off: usize, v: u32) {
        if let Some(w) = self.words().get(off / 4) {
            w.store(v, Ordering::Release);
        }
    }
    /// Atomically replaces the raw dword at `off`, returning the old value
    /// (how a polling model consumes doorbells so that two equal writes are
    /// two doorbells).
    pub fn swap_raw(&self, off: usize, v: u32) -> u32 {
        self.words()
            .get(off / 4)
            .map_or(0, |w| w.swap(v, Ordering::AcqRel))
    }
    /// The big-endian register value at `off`.
    pub fn be(&self, off: usize) -> u32 {
        u32::from_be(self.raw(off))
    }
    /// Stores a big-endian register value.
    pub fn set_be(&self, off: usize, v: u32) {
        self.set_raw(off, v.to_be())
    }
    /// Zeroes `[off, off + len)`.
    pub fn clear(&self, off: usize, len: usize) {
        for o in (off..off + len).step_by(4) {
            self.set_raw(o, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eq_doorbells_follow_the_uar_layout() {
        assert_eq!(eq_doorbell(0), 0x800);
        assert_eq!(eq_doorbell(3), 0x818);
        assert_eq!(eq_doorbell(4), 0x1800);
        assert_eq!(eq_doorbell(37), 9 * 4096 + 0x808);
    }

    #[test]
    fn an_external_window_is_shared_memory() {
        let mut mem = vec![0u32; 16];
        let p = core::ptr::NonNull::new(mem.as_mut_ptr()).unwrap();
        // SAFETY: `mem` outlives `r` and is only touched through `r` here.
        let r = unsafe { RegFile::from_raw_parts(p, 16) };
        r.set_be(8, 0x0102_0304);
        assert_eq!(r.len(), 64);
        assert_eq!(r.raw(64), u32::MAX);
        drop(r);
        assert_eq!(mem[2].to_ne_bytes(), [1, 2, 3, 4]);
    }

    #[test]
    fn registers_hold_raw_big_endian_stores() {
        let r = RegFile::new(64);
        r.set_raw(8, 0x0100_0000u32.to_be().swap_bytes());
        assert_eq!(r.be(8), 0x0000_0001);
        r.set_be(12, 0xdead_beef);
        assert_eq!(r.raw(12).to_ne_bytes(), [0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(r.raw(4096), u32::MAX, "outside the file reads all ones");
    }
}
