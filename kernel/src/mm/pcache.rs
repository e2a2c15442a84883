//! Remote paging's kernel side: the page-table entries and the page-fault
//! trap of the remote-backed regions whose policy and RDMA live in the
//! `pcache` crate (LegoOS's pcache in spirit): a region is a range of
//! kernel virtual addresses, one 512 GiB slot each above the RAM identity
//! map; a fault in it is served by `Pcache::fault` and the faulting
//! instruction resumes.
//!
//! Leaves out: several CPUs (one fault at a time), user space, huge pages.
//! A fault that cannot be served (no usable copy of its page) fails the
//! region: that fault and every later one in it get a scratch frame (the
//! poison page), and the workload running on it sees [`failed`] and ends
//! with the error; nothing else stops.

use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hal::BusAddr;
use pcache::{FaultError, Mmu, Pcache, PteBits};
use x86_64::VirtAddr;
use x86_64::structures::paging::PageTableFlags as F;

/// Where region slot 0 starts (16 TiB, an L4 entry of its own).
pub const BASE: u64 = 0x0000_1000_0000_0000;
/// Bytes of each slot (one L4 entry).
pub const SLOT: u64 = 1 << 39;
/// Regions at most.
pub const MAX_REGIONS: usize = 4;

/// A region attached to a slot.
pub struct Region {
    /// The cache and its memory nodes.
    pub pc: Pcache,
    /// Its level-1 page tables (physical = virtual addresses), one per
    /// 2 MiB.
    tables: Vec<u64>,
    /// How the fault that failed it went (also kept by `pc`).
    pub error: Option<FaultError>,
    /// Faults answered with the poison page after it failed.
    pub poisoned: u64,
}

static REGIONS: spin::Mutex<[Option<Region>; MAX_REGIONS]> =
    spin::Mutex::new([const { None }; MAX_REGIONS]);

/// Set by the fault path when a region fails; read by its workload.
static FAILED: [AtomicBool; MAX_REGIONS] = [const { AtomicBool::new(false) }; MAX_REGIONS];

/// The latency probe's stamp: the TSC just before a faulting access (0:
/// none). The handler turns it into the trap time.
pub static STAMP: AtomicU64 = AtomicU64::new(0);
/// The TSC when the fault handler last returned, for the probe's return
/// time.
pub static EXIT: AtomicU64 = AtomicU64::new(0);

/// The scratch frame failed regions get.
static POISON: spin::Once<Option<u64>> = spin::Once::new();

/// The first virtual address of slot `slot`.
pub fn base(slot: usize) -> u64 {
    BASE + slot as u64 * SLOT
}

/// Whether the region in `slot` has failed.
pub fn failed(slot: usize) -> bool {
    FAILED.get(slot).is_some_and(|f| f.load(Ordering::SeqCst))
}

/// The region page-table entries as the `pcache` crate sees them.
struct KernelMmu<'a> {
    slot: usize,
    tables: &'a [u64],
}

impl KernelMmu<'_> {
    /// The entry of `page`, if the region has one.
    fn pte(&self, page: u64) -> Option<&AtomicU64> {
        let t = *self.tables.get((page / 512) as usize)?;
        let p = (t + (page % 512) * 8) as *const AtomicU64;
        // SAFETY: `t` is a level-1 table made by `paging::l1_tables` for
        // this slot (a page-table frame, identity-mapped, 4 KiB aligned),
        // and entry `page % 512` lies inside it; only this module writes
        // entries of region slots, one fault at a time, and a page-table
        // entry is a naturally aligned u64 the processor updates atomically
        // (accessed and dirty bits), as AtomicU64 does.
        Some(unsafe { &*p })
    }

    fn va(&self, page: u64) -> VirtAddr {
        VirtAddr::new(base(self.slot) + page * 4096)
    }
}

const ACCESSED: u64 = F::ACCESSED.bits();
const DIRTY: u64 = F::DIRTY.bits();

impl Mmu for KernelMmu<'_> {
    fn map(&mut self, page: u64, frame: BusAddr) {
        // Without an IOMMU the frame's bus address is its physical address.
        // A not-present entry is never cached by the TLB: no flush.
        if let Some(e) = self.pte(page) {
            e.store(
                (frame.0 & 0x000f_ffff_ffff_f000) | (F::PRESENT | F::WRITABLE).bits(),
                Ordering::SeqCst,
            );
        }
    }

    fn unmap(&mut self, page: u64) -> PteBits {
        let Some(e) = self.pte(page) else {
            return PteBits::default();
        };
        let old = e.swap(0, Ordering::SeqCst);
        if old & F::PRESENT.bits() != 0 {
            x86_64::instructions::tlb::flush(self.va(page));
        }
        PteBits {
            accessed: old & ACCESSED != 0,
            dirty: old & DIRTY != 0,
        }
    }

    fn test_and_clear_young(&mut self, page: u64) -> bool {
        let Some(e) = self.pte(page) else {
            return false;
        };
        let was = e.fetch_and(!ACCESSED, Ordering::SeqCst) & ACCESSED != 0;
        if was {
            x86_64::instructions::tlb::flush(self.va(page));
        }
        was
    }

    fn test_and_clear_dirty(&mut self, page: u64) -> bool {
        let Some(e) = self.pte(page) else {
            return false;
        };
        let was = e.fetch_and(!DIRTY, Ordering::SeqCst) & DIRTY != 0;
        if was {
            x86_64::instructions::tlb::flush(self.va(page));
        }
        was
    }
}

/// Attaches `pc` to a free slot: makes its page tables (every entry not
/// present) and returns the slot.
pub fn attach(pc: Pcache) -> Result<usize, (&'static str, alloc::boxed::Box<Pcache>)> {
    POISON.call_once(|| super::frame::alloc_contiguous(4096, 4096, true));
    let mut g = REGIONS.lock();
    let Some(slot) = g.iter().position(Option::is_none) else {
        return Err((
            "every region slot is in use (pcache detach first)",
            alloc::boxed::Box::new(pc),
        ));
    };
    let tables = match super::paging::l1_tables(base(slot), pc.config().pages) {
        Ok(t) => t,
        Err(e) => return Err((e, alloc::boxed::Box::new(pc))),
    };
    // Entries left by an earlier region in this slot were cleared at its
    // detach; clear again in case its tables covered more.
    wipe(slot, &tables);
    FAILED[slot].store(false, Ordering::SeqCst);
    g[slot] = Some(Region {
        pc,
        tables,
        error: None,
        poisoned: 0,
    });
    Ok(slot)
}

/// Clears every entry of `tables` and flushes the TLB.
fn wipe(_slot: usize, tables: &[u64]) {
    for &t in tables {
        for i in 0..512 {
            // SAFETY: as in `KernelMmu::pte`: entries of this slot's own
            // level-1 tables.
            unsafe { (*((t + i * 8) as *const AtomicU64)).store(0, Ordering::SeqCst) };
        }
    }
    x86_64::instructions::tlb::flush_all();
}

/// Detaches the region in `slot`: `f` gets the cache (to detach it
/// through ib_core) with the region's page tables, then every entry of the
/// slot is cleared.
pub fn detach<R>(slot: usize, f: impl FnOnce(Pcache, &mut dyn Mmu) -> R) -> Option<R> {
    let r = REGIONS.lock().get_mut(slot)?.take()?;
    let mut mmu = KernelMmu {
        slot,
        tables: &r.tables,
    };
    let out = f(r.pc, &mut mmu);
    wipe(slot, &r.tables);
    FAILED[slot].store(false, Ordering::SeqCst);
    Some(out)
}

/// Runs `f` on the region in `slot` with its page tables (the console's
/// commands: stats, flush). Not from code that may fault on a region.
pub fn with<R>(slot: usize, f: impl FnOnce(&mut Region, &mut dyn Mmu) -> R) -> Option<R> {
    let mut g = REGIONS.lock();
    let r = g.get_mut(slot)?.as_mut()?;
    let tables = core::mem::take(&mut r.tables);
    let mut mmu = KernelMmu {
        slot,
        tables: &tables,
    };
    let out = f(r, &mut mmu);
    r.tables = tables;
    Some(out)
}

/// The slots in use, with each region's base and size in pages.
pub fn list() -> Vec<(usize, u64, u64)> {
    REGIONS
        .lock()
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().map(|r| (i, base(i), r.pc.config().pages)))
        .collect()
}

/// The page-fault trap's hook: serves a fault at `addr` (error code `err`)
/// if it falls in an attached region, and returns whether it did (the
/// faulting instruction is then resumed). `t0` is the TSC at the
/// handler's start. Runs with the interrupted code's locks held: it only
/// tries the locks it needs, and a fault from code holding them (a bug) is
/// left to the crash report.
pub fn handle_fault(addr: u64, err: u64, t0: u64) -> bool {
    if !(BASE..BASE + SLOT * MAX_REGIONS as u64).contains(&addr) || err & 1 != 0 {
        // Outside the regions, or a protection fault on a present page.
        return false;
    }
    let slot = ((addr - BASE) / SLOT) as usize;
    let Some(mut g) = REGIONS.try_lock() else {
        crate::println!("pcache: fault at {addr:#x} while the region table is held");
        return false;
    };
    let Some(r) = g.get_mut(slot).and_then(Option::as_mut) else {
        return false;
    };
    let page = (addr - base(slot)) / 4096;
    if page >= r.pc.config().pages {
        return false;
    }
    let stamp = STAMP.swap(0, Ordering::SeqCst);
    let tables = core::mem::take(&mut r.tables);
    let mut mmu = KernelMmu {
        slot,
        tables: &tables,
    };
    let poison = POISON.get().copied().flatten();
    let ok = if FAILED[slot].load(Ordering::SeqCst) {
        false
    } else {
        match crate::hca::try_with(|ib| r.pc.fault(&mut ib.core, &mut mmu, page, t0)) {
            Some(Ok(_)) => {
                if stamp != 0 {
                    r.pc.split_mut().trap.record(t0.saturating_sub(stamp));
                }
                true
            }
            Some(Err(e)) => {
                log::error!("pcache: region {slot}: {e}");
                r.error = Some(e);
                FAILED[slot].store(true, Ordering::SeqCst);
                false
            }
            None => {
                crate::println!("pcache: fault at {addr:#x} while the adapters are held");
                r.tables = tables;
                return false;
            }
        }
    };
    // A failed region: the poison page, for the workload to run on to its
    // next look at `failed`.
    let ok = ok
        || match poison {
            Some(p) => {
                mmu.map(page, BusAddr(p));
                r.poisoned += 1;
                true
            }
            None => false,
        };
    r.tables = tables;
    EXIT.store(crate::arch::rdtsc(), Ordering::SeqCst);
    ok
}

/// The words of the region in `slot`, for the workloads: each access a
/// load or store at its virtual address, faults served by the trap.
pub struct RegionWords {
    slot: usize,
    ptr: *mut u64,
    len: usize,
}

impl RegionWords {
    /// The region in `slot`, if attached.
    pub fn new(slot: usize) -> Option<RegionWords> {
        let pages = REGIONS.lock().get(slot)?.as_ref()?.pc.config().pages;
        Some(RegionWords {
            slot,
            ptr: base(slot) as *mut u64,
            len: usize::try_from(pages * 512).ok()?,
        })
    }
}

impl pcache::Words for RegionWords {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&mut self, i: usize) -> u64 {
        if i >= self.len {
            return 0;
        }
        // SAFETY: inside the region's range, which the trap keeps backed
        // (a resident frame, a fetched one, or the poison page) while it is
        // attached; the console detaches only between workloads.
        unsafe { self.ptr.add(i).read_volatile() }
    }

    fn set(&mut self, i: usize, v: u64) {
        if i < self.len {
            // SAFETY: as in `get`.
            unsafe { self.ptr.add(i).write_volatile(v) }
        }
    }

    fn failed(&self) -> bool {
        failed(self.slot)
    }
}
