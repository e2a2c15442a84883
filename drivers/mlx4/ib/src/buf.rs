//! Queue buffers described to the HCA by an MTT of 4 KiB pages (Linux `mlx4_buf_write_mtt` of mlx4_core, as mlx4_ib calls it for CQ, QP and SRQ buffers).
//!
//! Left out: the vmap'ed page-list allocation for large buffers (the DMA pool
//! hands out contiguous memory of any size).

use alloc::vec::Vec;

use hal::DmaBuf;
use mlx4_core::Dev;
use mlx4_core::mr::Mtt;

use crate::{Error, Result};

/// Page size of queue buffers.
pub const BUF_PAGE_SHIFT: u32 = 12;

/// An MTT range holding the pages of `buf` (page aligned, whole pages).
pub fn write_buf_mtt(dev: &mut Dev, buf: &DmaBuf) -> Result<Mtt> {
    let pages = buf.len().div_ceil(1 << BUF_PAGE_SHIFT);
    let npages = u32::try_from(pages).map_err(|_| Error::Inval("queue buffer too large"))?;
    let mtt = dev.mtt_init(npages, BUF_PAGE_SHIFT)?;
    let base = buf.bus_addr().0;
    let list: Vec<u64> = (0..pages as u64)
        .map(|i| base + (i << BUF_PAGE_SHIFT))
        .collect();
    if let Err(e) = dev.write_mtt(&mtt, 0, &list) {
        dev.mtt_cleanup(&mtt);
        return Err(e.into());
    }
    Ok(mtt)
}
