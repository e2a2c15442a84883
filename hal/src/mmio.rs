//! Register access to a PCI BAR.
//!
//! [`Bar`], a bounds-checked window of 32-bit registers, over real MMIO or over a
//! [`RegisterBackend`].
//!
//! Real hardware gets a pointer to an uncached mapping and every access is one
//! volatile load or store (never a reference, see the `volatile` crate's
//! rationale). Host tests and the device model plug in a backend instead; the
//! driver cannot tell the two apart. Byte swapping for mlx4's big-endian
//! registers happens only in the `_be` accessors here.

use alloc::sync::Arc;
use core::ptr::NonNull;

/// A memory-like register window implemented in software (a fake BAR, the
/// device model's BAR0/UAR, or an ivshmem window).
///
/// Accesses have memory semantics as seen by the CPU: `read32` returns the four
/// bytes at `offset` loaded as a native-endian `u32` (no swap), exactly what a
/// `read_volatile` of an MMIO register would return. Offsets are
/// bounds-checked and 4-byte aligned by [`Bar`] before they get here.
pub trait RegisterBackend: Send + Sync {
    /// Loads the 32-bit register at `offset`.
    fn read32(&self, offset: usize) -> u32;
    /// Stores the 32-bit register at `offset`.
    fn write32(&self, offset: usize, value: u32);
    /// One 64-bit store at `offset` (8-byte aligned). The default splits it
    /// into two 32-bit stores, low address first.
    fn write64(&self, offset: usize, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }
}

#[derive(Clone)]
enum Io {
    /// # Invariants
    /// `base` points to an uncached mapping valid for reads and writes of
    /// `Bar::len` bytes for the lifetime of the program.
    Mmio(NonNull<u8>),
    Backend(Arc<dyn RegisterBackend>),
}

/// A window of device registers.
///
/// Created once per BAR by the platform (see [`crate::PciFunction::take_bar`]);
/// [`Bar::slice`] hands out sub-windows (e.g. one UAR page).
pub struct Bar {
    io: Io,
    /// Offset of this window inside the backend's register space.
    offset: usize,
    len: usize,
}

// SAFETY: MMIO registers are accessed only by single volatile loads and stores,
// which are safe to issue from any CPU; a backend is `Send + Sync` by its trait
// bounds. Ordering between CPUs is the driver's business (it serialises
// commands), exactly as in Linux.
unsafe impl Send for Bar {}
// SAFETY: as above; no `&`-to-MMIO is ever created, so shared use from several
// threads is the same as several CPUs issuing `readl`/`writel`.
unsafe impl Sync for Bar {}

impl core::fmt::Debug for Bar {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let kind = match self.io {
            Io::Mmio(p) => {
                return write!(f, "Bar(mmio {:p}+{:#x}, {:#x})", p, self.offset, self.len);
            }
            Io::Backend(_) => "backend",
        };
        write!(f, "Bar({kind}+{:#x}, {:#x})", self.offset, self.len)
    }
}

impl Bar {
    /// A window over real MMIO.
    ///
    /// # Safety
    ///
    /// `base` must point to a mapping of device registers that is uncached,
    /// valid for volatile reads and writes of `len` bytes for the rest of the
    /// program, and not handed out as another `Bar` (the platform's BAR claim
    /// ensures this).
    pub unsafe fn from_mmio(base: NonNull<u8>, len: usize) -> Bar {
        // INVARIANT: the caller guarantees the mapping for `len` bytes.
        Bar {
            io: Io::Mmio(base),
            offset: 0,
            len,
        }
    }

    /// A window over a software backend of `len` bytes.
    pub fn from_backend(backend: Arc<dyn RegisterBackend>, len: usize) -> Bar {
        Bar {
            io: Io::Backend(backend),
            offset: 0,
            len,
        }
    }

    /// A window of `len` bytes of ordinary host memory standing for an
    /// uncached register mapping, as the kernel's BARs are: a register
    /// write is one volatile store, where a [`RegisterBackend`] adds a
    /// dynamic call. For benchmarks and tests that measure or exercise the
    /// kernel's path on the host; the memory is leaked, so that it lives as
    /// long as the program, as a real mapping does. Host-side only (the
    /// `fake` feature), like the other stand-ins of [`crate::fake`].
    #[cfg(any(test, feature = "fake"))]
    pub fn leaked_host_memory(len: usize) -> Bar {
        let words: &'static mut [u64] =
            alloc::boxed::Box::leak(alloc::vec![0u64; len.div_ceil(8).max(1)].into_boxed_slice());
        let base = NonNull::from(words).cast::<u8>();
        // SAFETY: the leaked allocation is valid for reads and writes of
        // at least `len` bytes for the rest of the program, 8-byte aligned,
        // and nothing else refers to it.
        unsafe { Bar::from_mmio(base, len) }
    }

    /// Size of the window in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-sized window.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sub-window `[offset, offset + len)`, or `None` if it does not fit.
    pub fn slice(&self, offset: usize, len: usize) -> Option<Bar> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| Bar {
            io: self.io.clone(),
            offset: self.offset + offset,
            len,
        })
    }

    #[inline(always)]
    fn check(&self, offset: usize, width: usize) -> usize {
        assert!(
            offset.is_multiple_of(width)
                && offset.checked_add(width).is_some_and(|e| e <= self.len),
            "register access at {offset:#x} (width {width}) outside a {:#x}-byte window",
            self.len
        );
        self.offset + offset
    }

    /// Loads the 32-bit register at `offset` without swapping.
    ///
    /// # Panics
    ///
    /// If `offset` is not 4-byte aligned or the register is outside the window
    /// (a driver bug: offsets are driver constants).
    #[inline]
    pub fn read32(&self, offset: usize) -> u32 {
        let off = self.check(offset, 4);
        match &self.io {
            // SAFETY: the `Io::Mmio` invariant covers the window and `check`
            // kept the aligned access `[off, off + 4)` inside it.
            Io::Mmio(base) => unsafe { base.as_ptr().add(off).cast::<u32>().read_volatile() },
            Io::Backend(b) => b.read32(off),
        }
    }

    /// Stores the 32-bit register at `offset` without swapping.
    ///
    /// # Panics
    ///
    /// As [`Bar::read32`].
    #[inline]
    pub fn write32(&self, offset: usize, value: u32) {
        let off = self.check(offset, 4);
        match &self.io {
            // SAFETY: as in `read32`.
            Io::Mmio(base) => unsafe { base.as_ptr().add(off).cast::<u32>().write_volatile(value) },
            Io::Backend(b) => b.write32(off, value),
        }
        record!(crate::fake::record::Access::Mmio {
            off,
            len: 4,
            value: u64::from(value),
        });
    }

    /// One 64-bit store at `offset` (8-byte aligned) without swapping.
    ///
    /// # Panics
    ///
    /// As [`Bar::read32`].
    #[inline]
    pub fn write64(&self, offset: usize, value: u64) {
        let off = self.check(offset, 8);
        match &self.io {
            // SAFETY: as in `read32`, for an aligned 8-byte access.
            Io::Mmio(base) => unsafe { base.as_ptr().add(off).cast::<u64>().write_volatile(value) },
            Io::Backend(b) => b.write64(off, value),
        }
        record!(crate::fake::record::Access::Mmio { off, len: 8, value });
    }

    /// Loads a big-endian 32-bit register (Linux `swab32(readl())`).
    #[inline]
    pub fn read_be32(&self, offset: usize) -> u32 {
        u32::from_be(self.read32(offset))
    }

    /// Stores a big-endian 32-bit register (Linux `__raw_writel(cpu_to_be32())`).
    #[inline]
    pub fn write_be32(&self, offset: usize, value: u32) {
        self.write32(offset, value.to_be());
    }

    /// Stores two big-endian dwords, `hi` at `offset` and `lo` at `offset + 4`,
    /// as one 64-bit store (mlx4's CQ doorbell, Linux `mlx4_write64`).
    #[inline]
    pub fn write_be32_pair(&self, offset: usize, hi: u32, lo: u32) {
        let raw = u64::from(hi.to_be()) | (u64::from(lo.to_be()) << 32);
        self.write64(offset, raw);
    }
}

/// One 32-bit register of a [`Bar`] whose offset was checked once, when it
/// was made ([`Bar::doorbell`]): a UAR page's send doorbell, written on
/// every post. A write is one volatile store on real MMIO (one backend call
/// otherwise), with no bounds check on the way.
#[derive(Clone)]
pub struct Doorbell {
    io: Io,
    /// Offset inside the backend's register space (checked).
    off: usize,
}

// SAFETY: as for `Bar`: single volatile stores to a register, or a
// `Send + Sync` backend.
unsafe impl Send for Doorbell {}
// SAFETY: as above.
unsafe impl Sync for Doorbell {}

impl core::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Doorbell({:#x})", self.off)
    }
}

impl Bar {
    /// The 32-bit register at `offset` as a [`Doorbell`], or `None` if it
    /// is not 4-byte aligned or not inside the window.
    pub fn doorbell(&self, offset: usize) -> Option<Doorbell> {
        (offset.is_multiple_of(4) && offset.checked_add(4).is_some_and(|e| e <= self.len)).then(
            || Doorbell {
                io: self.io.clone(),
                off: self.offset + offset,
            },
        )
    }
}

impl Doorbell {
    /// Stores a big-endian 32-bit value (Linux `__raw_writel(cpu_to_be32())`).
    #[inline(always)]
    pub fn write_be32(&self, value: u32) {
        let v = value.to_be();
        match &self.io {
            // SAFETY: the `Io::Mmio` invariant covers the window, and
            // `Bar::doorbell` checked the aligned `[off, off + 4)` inside it.
            Io::Mmio(base) => unsafe {
                base.as_ptr().add(self.off).cast::<u32>().write_volatile(v)
            },
            Io::Backend(b) => b.write32(self.off, v),
        }
        record!(crate::fake::record::Access::Mmio {
            off: self.off,
            len: 4,
            value: u64::from(v),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::MemBar;

    #[test]
    fn be_accessors_swap_and_slices_offset() {
        let mem = Arc::new(MemBar::new(0x100));
        let bar = Bar::from_backend(mem.clone(), 0x100);
        bar.write_be32(0x10, 0x1122_3344);
        assert_eq!(mem.bytes(0x10, 4), vec![0x11, 0x22, 0x33, 0x44]);
        assert_eq!(bar.read_be32(0x10), 0x1122_3344);
        let page = bar.slice(0x80, 0x80).unwrap();
        page.write_be32(0, 0xdead_beef);
        assert_eq!(bar.read_be32(0x80), 0xdead_beef);
        assert!(bar.slice(0x80, 0x81).is_none());
        page.write_be32_pair(0x8, 0x0102_0304, 0x0506_0708);
        assert_eq!(mem.bytes(0x88, 8), vec![1, 2, 3, 4, 5, 6, 7, 8]);
        let db = page.doorbell(0x14).unwrap();
        db.write_be32(0x0000_4800);
        assert_eq!(mem.bytes(0x94, 4), vec![0, 0, 0x48, 0]);
        assert!(page.doorbell(0x7e).is_none() && page.doorbell(0x80).is_none());
        let host = Bar::leaked_host_memory(64);
        host.doorbell(0x14).unwrap().write_be32(0x0102_0304);
        assert_eq!(host.read_be32(0x14), 0x0102_0304);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_window_access_is_caught() {
        let bar = Bar::from_backend(Arc::new(MemBar::new(0x10)), 0x10);
        bar.read32(0x10);
    }

    #[test]
    fn mmio_path_reads_and_writes_memory() {
        let mut words = [0u32; 4];
        let base = NonNull::new(words.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `words` outlives `bar` (dropped at the end of this test) and
        // stands in for a register block.
        let bar = unsafe { Bar::from_mmio(base, 16) };
        bar.write_be32(4, 1);
        assert_eq!(bar.read32(4), 1u32.to_be());
        drop(bar);
        assert_eq!(words[1], 1u32.to_be());
    }
}
