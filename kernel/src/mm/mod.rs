//! Memory: frames, page tables, the heap and the DMA pool.
//!
//! Memory: physical frames from the boot memory map, the kernel's own page
//! tables (identity direct map of RAM, uncached MMIO mappings), the heap, the
//! DMA pool drivers allocate from, and the remote-backed regions of the page
//! cache (their page tables and fault trap).

pub mod dma;
pub mod frame;
pub mod heap;
pub mod paging;
pub mod pcache;

/// Brings up frames, paging, heap and DMA in that order.
pub fn init(info: &'static boot::BootInfo) {
    frame::init(info.memory_map());
    paging::init(info.memory_map());
    heap::init();
    dma::init();
}
