//! The physical frame allocator.
//!
//! Physical frame allocator: hands out 4 KiB frames and large contiguous
//! ranges from the usable RAM of the boot memory map, above 1 MiB and outside
//! the kernel image. Frames are never returned: page tables, the heap and the
//! DMA pool are carved once and live for the whole run.

use boot::{MemoryKind, MemoryRegion};
use x86_64::PhysAddr;
use x86_64::structures::paging::{FrameAllocator, PhysFrame, Size4KiB};

const MAX_RANGES: usize = 64;

#[derive(Clone, Copy)]
struct Range {
    next: u64,
    end: u64,
}

struct Frames {
    ranges: [Range; MAX_RANGES],
    n: usize,
    total_usable: u64,
    handed_out: u64,
}

static FRAMES: spin::Mutex<Frames> = spin::Mutex::new(Frames {
    ranges: [Range { next: 0, end: 0 }; MAX_RANGES],
    n: 0,
    total_usable: 0,
    handed_out: 0,
});

/// Collects usable RAM above 1 MiB, minus the kernel image.
pub fn init(map: &[MemoryRegion]) {
    let (kstart, kend) = boot::kernel_image();
    let mut f = FRAMES.lock();
    for r in map.iter().filter(|r| r.kind == MemoryKind::Usable) {
        f.total_usable += r.len;
        let start = r.start.max(0x10_0000).next_multiple_of(4096);
        let end = r.end() & !0xfff;
        // Split around the kernel image.
        for (s, e) in [
            (start, end.min(kstart)),
            (start.max(kend.next_multiple_of(4096)), end),
        ] {
            if s < e && f.n < MAX_RANGES {
                let n = f.n;
                f.ranges[n] = Range { next: s, end: e };
                f.n += 1;
            }
        }
    }
}

/// A contiguous range of `len` bytes aligned to `align` (a power of two, at
/// least 4 KiB), zeroed if `zero`, or `None` if no usable range has room.
pub fn alloc_contiguous(len: u64, align: u64, zero: bool) -> Option<u64> {
    let len = len.next_multiple_of(4096);
    let align = align.max(4096);
    let mut f = FRAMES.lock();
    let n = f.n;
    for r in f.ranges[..n].iter_mut() {
        let start = r.next.next_multiple_of(align);
        if start.checked_add(len).is_some_and(|e| e <= r.end) {
            r.next = start + len;
            if zero {
                // SAFETY: the range is usable RAM, identity-mapped (the boot
                // map covers 4 GiB, the kernel map all RAM), handed out only now.
                unsafe { core::ptr::write_bytes(start as *mut u8, 0, len as usize) };
            }
            f.handed_out += len;
            return Some(start);
        }
    }
    None
}

/// Usable RAM in the memory map, and how much of it has been handed out.
pub fn stats() -> (u64, u64) {
    let f = FRAMES.lock();
    (f.total_usable, f.handed_out)
}

/// Frame source for the `x86_64` page-table mapper.
pub struct PageTableFrames;

// SAFETY: each call hands out a distinct, zeroed, unused 4 KiB frame.
unsafe impl FrameAllocator<Size4KiB> for PageTableFrames {
    fn allocate_frame(&mut self) -> Option<PhysFrame<Size4KiB>> {
        let pa = alloc_contiguous(4096, 4096, true)?;
        Some(PhysFrame::containing_address(PhysAddr::new(pa)))
    }
}
