//! Memory: frames, page tables, the heap and the DMA pool.
//!
//! Memory: physical frames from the boot memory map, the kernel's own page
//! tables (identity direct map of RAM, uncached MMIO mappings), the heap, and
//! the DMA pool drivers allocate from.

pub mod dma;
pub mod frame;
pub mod heap;
pub mod paging;

/// Brings up frames, paging, heap and DMA in that order.
pub fn init(info: &'static boot::BootInfo) {
    frame::init(info.memory_map());
    paging::init(info.memory_map());
    heap::init();
    dma::init();
}
