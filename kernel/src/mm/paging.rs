//! The kernel's page tables.
//!
//! Built with the `x86_64` crate: RAM identity-mapped (2 MiB pages where alignment
//! allows), page 0 left unmapped to catch null pointers, a guard page below the
//! boot stack, and uncached identity mappings of device MMIO made on request.

use boot::{MemoryKind, MemoryRegion};
use x86_64::registers::control::{Cr3, Cr3Flags};
use x86_64::structures::paging::mapper::{MapToError, UnmapError};
use x86_64::structures::paging::{
    Mapper, OffsetPageTable, Page, PageTable, PageTableFlags as F, PhysFrame, Size2MiB, Size4KiB,
};
use x86_64::{PhysAddr, VirtAddr};

use super::frame::{self, PageTableFrames};

static MAPPER: spin::Mutex<Option<OffsetPageTable<'static>>> = spin::Mutex::new(None);

const TWO_MIB: u64 = 2 << 20;

/// Identity-maps `[start, end)`, with 4 KiB pages in the 2 MiB chunk at
/// `small`; parts that are already mapped (by a 4 KiB or a huge page) are
/// left as they are.
fn map_range(
    m: &mut OffsetPageTable<'static>,
    start: u64,
    end: u64,
    flags: F,
    small: u64,
) -> Result<(), &'static str> {
    let mut a = start & !0xfff;
    while a < end {
        let huge = a.is_multiple_of(TWO_MIB) && a + TWO_MIB <= end && a != small;
        let result = if huge {
            let page = Page::<Size2MiB>::containing_address(VirtAddr::new(a));
            let frame = PhysFrame::<Size2MiB>::containing_address(PhysAddr::new(a));
            // SAFETY: identity mapping of memory not mapped elsewhere; no Rust
            // reference can alias through a new address.
            unsafe { m.map_to(page, frame, flags | F::HUGE_PAGE, &mut PageTableFrames) }
                .map(|f| f.ignore())
                .map_err(|e| matches!(e, MapToError::FrameAllocationFailed))
        } else {
            let page = Page::<Size4KiB>::containing_address(VirtAddr::new(a));
            let frame = PhysFrame::<Size4KiB>::containing_address(PhysAddr::new(a));
            // SAFETY: as above.
            unsafe { m.map_to(page, frame, flags, &mut PageTableFrames) }
                .map(|f| f.ignore())
                .map_err(|e| matches!(e, MapToError::FrameAllocationFailed))
        };
        if result == Err(true) {
            return Err("out of memory for page tables");
        }
        a += if huge { TWO_MIB } else { 4096 };
    }
    Ok(())
}

/// Builds the kernel page tables and switches to them.
pub fn init(map: &[MemoryRegion]) {
    let l4_pa = frame::alloc_contiguous(4096, 4096, true)
        .unwrap_or_else(|| panic!("no memory for page tables"));
    // SAFETY: a fresh zeroed frame, identity-mapped by the boot tables, used
    // only as this page table from now on.
    let l4 = unsafe { &mut *(l4_pa as *mut PageTable) };
    // SAFETY: physical memory is identity-mapped (offset 0) by the boot tables
    // now and by these tables once loaded, for every frame the mapper touches.
    let mut m = unsafe { OffsetPageTable::new(l4, VirtAddr::new(0)) };
    let rw = F::PRESENT | F::WRITABLE;
    // Guard page: the lowest page of the boot stack. Its 2 MiB chunk is
    // mapped with 4 KiB pages so that the guard alone can be unmapped
    // (where the linker puts the stack moves as the image grows).
    let (stack_lo, _) = boot::boot_stack();
    let small = stack_lo & !(TWO_MIB - 1);
    // Low memory (BIOS data, ACPI tables) except page 0.
    map_range(&mut m, 0x1000, 0x10_0000, rw, small)
        .unwrap_or_else(|e| panic!("mapping low memory: {e}"));
    for r in map {
        if matches!(
            r.kind,
            MemoryKind::Usable | MemoryKind::AcpiReclaimable | MemoryKind::AcpiNvs
        ) {
            let start = r.start.max(0x10_0000);
            if start < r.end() {
                map_range(&mut m, start, r.end(), rw, small)
                    .unwrap_or_else(|e| panic!("mapping RAM: {e}"));
            }
        }
    }
    // The kernel image itself (it may sit in a region the map calls reserved).
    let (ks, ke) = boot::kernel_image();
    map_range(&mut m, ks, ke, rw, small).unwrap_or_else(|e| panic!("mapping the kernel: {e}"));
    let guard = Page::<Size4KiB>::containing_address(VirtAddr::new(stack_lo));
    match m.unmap(guard) {
        Ok((_, f)) => f.ignore(),
        Err(UnmapError::ParentEntryHugePage) => {
            log::warn!("boot stack guard page inside a huge page")
        }
        Err(e) => log::warn!("no guard page below the boot stack: {e:?}"),
    }
    let frame = PhysFrame::containing_address(PhysAddr::new(l4_pa));
    // SAFETY: the new tables map the kernel image, the stack we are running
    // on and all RAM at the same addresses as the boot tables.
    unsafe { Cr3::write(frame, Cr3Flags::empty()) };
    *MAPPER.lock() = Some(m);
}

/// Identity-maps `[pa, pa + len)` uncached for device registers and returns the
/// virtual address (equal to `pa`).
pub fn map_mmio(pa: u64, len: u64) -> Result<u64, &'static str> {
    let mut guard = MAPPER.lock();
    let m = guard.as_mut().ok_or("paging not initialised")?;
    let flags = F::PRESENT | F::WRITABLE | F::NO_CACHE | F::WRITE_THROUGH;
    let end = pa.checked_add(len).ok_or("MMIO range overflows")?;
    let mut a = pa & !0xfff;
    while a < end {
        let page = Page::<Size4KiB>::containing_address(VirtAddr::new(a));
        let frame = PhysFrame::<Size4KiB>::containing_address(PhysAddr::new(a));
        // SAFETY: device memory at its own address; RAM is never passed here
        // (BARs live in the PCI hole, which the RAM map excludes).
        match unsafe { m.map_to(page, frame, flags, &mut PageTableFrames) } {
            Ok(f) => f.flush(),
            Err(MapToError::PageAlreadyMapped(f)) if f == frame => {}
            Err(MapToError::PageAlreadyMapped(_)) => {
                return Err("MMIO range overlaps another mapping");
            }
            Err(MapToError::ParentEntryHugePage) => {
                return Err("MMIO range inside a RAM huge page");
            }
            Err(MapToError::FrameAllocationFailed) => return Err("out of memory for page tables"),
        }
        a += 4096;
    }
    Ok(pa)
}

/// The level-1 page tables covering `[va, va + pages * 4 KiB)`, made where
/// missing (zeroed: every entry not present), one per 2 MiB of the range
/// in order: their physical (= virtual) addresses, for the page cache,
/// which writes those entries itself on its fault path. `va` must be
/// 2 MiB aligned and in the lower half outside the RAM identity map; tables
/// made stay for later regions at the same place (frames are never freed).
pub fn l1_tables(va: u64, pages: u64) -> Result<alloc::vec::Vec<u64>, &'static str> {
    if !va.is_multiple_of(TWO_MIB) {
        return Err("region not 2 MiB aligned");
    }
    let end = pages
        .checked_mul(4096)
        .and_then(|l| va.checked_add(l))
        .filter(|&e| e <= 0x0000_8000_0000_0000)
        .ok_or("region outside the lower half")?;
    let mut guard = MAPPER.lock();
    let m = guard.as_mut().ok_or("paging not initialised")?;
    let mut out = alloc::vec::Vec::new();
    let mut a = va;
    while a < end {
        let v = VirtAddr::new(a);
        let idx = [
            usize::from(v.p4_index()),
            usize::from(v.p3_index()),
            usize::from(v.p2_index()),
        ];
        let mut table: &mut PageTable = m.level_4_table_mut();
        for i in idx {
            let e = &mut table[i];
            if e.flags().contains(F::HUGE_PAGE) {
                return Err("region overlaps a huge page");
            }
            if e.is_unused() {
                let pa = frame::alloc_contiguous(4096, 4096, true)
                    .ok_or("out of memory for page tables")?;
                e.set_addr(PhysAddr::new(pa), F::PRESENT | F::WRITABLE);
            }
            let next = e.addr().as_u64();
            // SAFETY: `next` is a page-table frame (made above or earlier
            // by this function or the mapper), identity-mapped, reachable
            // only through this entry and the mapper, whose lock is held.
            table = unsafe { &mut *(next as *mut PageTable) };
        }
        out.push(core::ptr::from_mut(table) as u64);
        a += TWO_MIB;
    }
    Ok(out)
}
