//! The kernel heap.
//!
//! `linked_list_allocator` over one contiguous range carved from RAM at boot (a
//! quarter of usable RAM, between 4 and 64 MiB).

use linked_list_allocator::LockedHeap;

#[global_allocator]
static HEAP: LockedHeap = LockedHeap::empty();

/// Carves the heap and hands it to the allocator.
pub fn init() {
    let (usable, _) = super::frame::stats();
    let size = (usable / 4).clamp(4 << 20, 64 << 20) & !((2 << 20) - 1);
    let Some(start) = super::frame::alloc_contiguous(size, 2 << 20, false) else {
        panic!("no contiguous {} MiB for the heap", size >> 20);
    };
    // SAFETY: `[start, start + size)` is RAM handed out only to the heap,
    // identity-mapped and unused by anything else for the rest of the run.
    unsafe { HEAP.lock().init(start as *mut u8, size as usize) };
}

/// Heap size, bytes in use, bytes free.
pub fn stats() -> (usize, usize, usize) {
    let h = HEAP.lock();
    (h.size(), h.used(), h.free())
}
