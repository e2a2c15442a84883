//! The page-table operations the cache needs ([`Mmu`]), done by the kernel
//! on its x86_64 page tables and, for host tests, by [`SoftMmu`], which
//! keeps the accessed and dirty bits the way a page walk sets them.

use alloc::vec::Vec;

use hal::BusAddr;

/// The bits a page-table entry had when it was cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PteBits {
    /// Accessed (`_PAGE_ACCESSED`): read or written since last cleared.
    pub accessed: bool,
    /// Dirty (`_PAGE_DIRTY`): written since mapped or last cleared.
    pub dirty: bool,
}

/// Page-table entries of one remote-backed region, by page index.
pub trait Mmu {
    /// Maps page `page` of the region to the frame at bus address `frame`
    /// (the same as its physical address without an IOMMU), writable, its
    /// accessed and dirty bits clear.
    fn map(&mut self, page: u64, frame: BusAddr);
    /// Clears the entry of `page`, invalidates its TLB entry, and returns
    /// the bits it had (a page not mapped returns none).
    fn unmap(&mut self, page: u64) -> PteBits;
    /// Clears the accessed bit of `page`, invalidating its TLB entry if it
    /// was set (so the next access sets it again); returns whether it was
    /// set (Linux's `ptep_test_and_clear_young`).
    fn test_and_clear_young(&mut self, page: u64) -> bool;
    /// The same for the dirty bit (`ptep_clear_flush_dirty` in spirit): a
    /// page written back stays mapped, clean.
    fn test_and_clear_dirty(&mut self, page: u64) -> bool;
}

#[derive(Debug, Clone, Copy)]
struct SoftPte {
    frame: BusAddr,
    accessed: bool,
    dirty: bool,
}

/// Page tables in software for host tests: the test plays the CPU with
/// [`SoftMmu::touch`], which sets the accessed (and on a write the dirty)
/// bit of a present entry, as the processor's page walk does, or reports
/// the fault.
#[derive(Debug, Default)]
pub struct SoftMmu {
    ptes: Vec<Option<SoftPte>>,
    /// TLB invalidations done (each unmap, each bit cleared that was set).
    pub invalidations: u64,
}

impl SoftMmu {
    /// Entries for a region of `pages` pages, all not present.
    pub fn new(pages: u64) -> SoftMmu {
        SoftMmu {
            ptes: alloc::vec![None; pages as usize],
            invalidations: 0,
        }
    }

    /// An access to `page`: the frame it is mapped to (its bits updated),
    /// or `None` (a page fault).
    pub fn touch(&mut self, page: u64, write: bool) -> Option<BusAddr> {
        let e = self.ptes.get_mut(page as usize)?.as_mut()?;
        e.accessed = true;
        e.dirty |= write;
        Some(e.frame)
    }

    /// The frame `page` is mapped to, without touching it.
    pub fn lookup(&self, page: u64) -> Option<BusAddr> {
        self.ptes.get(page as usize)?.map(|e| e.frame)
    }

    /// Pages mapped.
    pub fn mapped(&self) -> usize {
        self.ptes.iter().flatten().count()
    }

    fn entry(&mut self, page: u64) -> Option<&mut SoftPte> {
        self.ptes.get_mut(page as usize)?.as_mut()
    }
}

impl Mmu for SoftMmu {
    fn map(&mut self, page: u64, frame: BusAddr) {
        if let Some(e) = self.ptes.get_mut(page as usize) {
            *e = Some(SoftPte {
                frame,
                accessed: false,
                dirty: false,
            });
        }
    }

    fn unmap(&mut self, page: u64) -> PteBits {
        match self.ptes.get_mut(page as usize).and_then(Option::take) {
            Some(e) => {
                self.invalidations += 1;
                PteBits {
                    accessed: e.accessed,
                    dirty: e.dirty,
                }
            }
            None => PteBits::default(),
        }
    }

    fn test_and_clear_young(&mut self, page: u64) -> bool {
        let was = self
            .entry(page)
            .map(|e| core::mem::replace(&mut e.accessed, false))
            .unwrap_or(false);
        self.invalidations += u64::from(was);
        was
    }

    fn test_and_clear_dirty(&mut self, page: u64) -> bool {
        let was = self
            .entry(page)
            .map(|e| core::mem::replace(&mut e.dirty, false))
            .unwrap_or(false);
        self.invalidations += u64::from(was);
        was
    }
}
