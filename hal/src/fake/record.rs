//! A recording of the driver's stores to DMA memory, its barriers and its register writes, in program order.
//!
//! On x86 the CPU keeps stores in order, so a missing write barrier
//! between a WQE and its owner bit or its doorbell changes nothing a host
//! test can see. This recorder makes the order itself visible: while a
//! [`Recording`] is live on a thread, every store through [`DmaBuf`],
//! [`crate::DmaWindow`], [`crate::DmaBlock`] and [`crate::DmaRecord`], every
//! barrier of [`crate::barrier`] and every register write through
//! [`crate::Bar`] and [`crate::Doorbell`] made on that thread is appended to
//! its log, which a test then reads ("a barrier separates the WQE body
//! from its owner store and precedes the doorbell").
//!
//! The hooks exist only in debug builds with the `fake` feature (the
//! tests' builds; [`ENABLED`]). A release build, the fast-path benchmark's,
//! has none, so its instruction counts are those of the kernel's build. In
//! a debug build without a live recording a hook costs one relaxed load.
//! Loads are not recorded, nor what the device does.

extern crate std;

use alloc::vec::Vec;
use core::cell::RefCell;
use core::ops::Range;
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::DmaBuf;

/// Whether the hooks are compiled in (debug builds with `fake`); a test
/// of the order has nothing to read where they are not.
pub const ENABLED: bool = cfg!(debug_assertions);

/// A barrier of [`crate::barrier`], by its Linux name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Barrier {
    /// `mb`.
    Mb,
    /// `rmb`.
    Rmb,
    /// `wmb`.
    Wmb,
    /// `dma_rmb`.
    DmaRmb,
    /// `dma_wmb`.
    DmaWmb,
}

impl Barrier {
    /// True if it orders earlier stores before later ones to DMA memory
    /// (`mb`, `wmb`, `dma_wmb`).
    pub fn orders_dma_stores(self) -> bool {
        matches!(self, Barrier::Mb | Barrier::Wmb | Barrier::DmaWmb)
    }
    /// True if it orders stores to memory before a later register write
    /// (`mb`, `wmb`: Linux's rule for a doorbell).
    pub fn orders_mmio(self) -> bool {
        matches!(self, Barrier::Mb | Barrier::Wmb)
    }
}

/// One recorded access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A store of `len` bytes to DMA memory at CPU address `addr`.
    Store {
        /// The CPU address (see [`Access::in_buf`]).
        addr: usize,
        /// Bytes stored.
        len: usize,
    },
    /// A barrier.
    Barrier(Barrier),
    /// A register write of `len` bytes at offset `off` of its register
    /// space (the backend's, or the mapping's), as the CPU stored it.
    Mmio {
        /// Offset from the start of the BAR the window was cut from.
        off: usize,
        /// Bytes written (4 or 8).
        len: usize,
        /// The value as stored (not byte-swapped back).
        value: u64,
    },
}

impl Access {
    /// The bytes of `buf` a store covers, as offsets into `buf`; `None`
    /// for a store elsewhere (or anything but a store).
    pub fn in_buf(&self, buf: &DmaBuf) -> Option<Range<usize>> {
        let Access::Store { addr, len } = *self else {
            return None;
        };
        let start = addr.checked_sub(buf.cpu_addr())?;
        (start < buf.len()).then(|| start..start + len)
    }
    /// True for a barrier that orders DMA stores.
    pub fn is_dma_store_barrier(&self) -> bool {
        matches!(self, Access::Barrier(b) if b.orders_dma_stores())
    }
    /// True for a barrier that orders stores before a register write.
    pub fn is_mmio_barrier(&self) -> bool {
        matches!(self, Access::Barrier(b) if b.orders_mmio())
    }
}

/// Live recordings on any thread: zero keeps the hooks to one load.
static LIVE: AtomicUsize = AtomicUsize::new(0);

std::thread_local! {
    static LOG: RefCell<Option<Vec<Access>>> = const { RefCell::new(None) };
}

/// Appends `a` to this thread's recording, if one is live.
#[inline]
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub(crate) fn note(a: Access) {
    if LIVE.load(Ordering::Relaxed) == 0 {
        return;
    }
    LOG.with(|l| {
        if let Ok(mut l) = l.try_borrow_mut()
            && let Some(v) = l.as_mut()
        {
            v.push(a);
        }
    });
}

/// A recording on the current thread, from [`Recording::start`] until it
/// is dropped. One at a time per thread.
pub struct Recording {
    _not_send: core::marker::PhantomData<*const ()>,
}

impl Recording {
    /// Starts recording this thread's accesses (an earlier recording of
    /// the thread, if still live, is cleared).
    pub fn start() -> Recording {
        LOG.with(|l| *l.borrow_mut() = Some(Vec::new()));
        LIVE.fetch_add(1, Ordering::Relaxed);
        Recording {
            _not_send: core::marker::PhantomData,
        }
    }

    /// What was recorded since the start or the last `take`.
    pub fn take(&mut self) -> Vec<Access> {
        LOG.with(|l| l.borrow_mut().as_mut().map(core::mem::take))
            .unwrap_or_default()
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        LOG.with(|l| *l.borrow_mut() = None);
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{ArenaDma, MemBar};
    use crate::{Bar, DmaPool, DmaRecord, barrier};
    use alloc::sync::Arc;

    #[test]
    fn stores_barriers_and_register_writes_are_recorded_in_order() {
        if !ENABLED {
            return;
        }
        let pool = DmaPool::new(Arc::new(ArenaDma::new(1 << 16)));
        let buf = Arc::new(pool.alloc(256, 64).unwrap());
        let rec = DmaRecord::<4>::new(buf.clone(), 192).unwrap();
        let bar = Bar::from_backend(Arc::new(MemBar::new(64)), 64);
        let db = bar.slice(16, 16).unwrap().doorbell(4).unwrap();
        buf.write_be32(8, 1); // before the recording: not seen
        let mut r = Recording::start();
        buf.write_be64(16, 2);
        let w = buf.window();
        w.write_bytes(40, &[1, 2, 3]);
        w.block::<64>(64).unwrap().write_be32(4, 3);
        barrier::dma_wmb();
        rec.write_be32(0, 4);
        barrier::wmb();
        db.write_be32(5);
        bar.write_be32_pair(8, 6, 7);
        let log = r.take();
        assert_eq!(log.len(), 8, "{log:?}");
        let ranges: Vec<_> = log.iter().filter_map(|a| a.in_buf(&buf)).collect();
        assert_eq!(ranges, [16..24, 40..43, 68..72, 192..196]);
        assert_eq!(log[3], Access::Barrier(Barrier::DmaWmb));
        assert!(log[3].is_dma_store_barrier() && !log[3].is_mmio_barrier());
        assert!(log[5].is_mmio_barrier());
        assert_eq!(
            log[6],
            Access::Mmio {
                off: 20,
                len: 4,
                value: u64::from(5u32.to_be())
            }
        );
        assert!(matches!(log[7], Access::Mmio { off: 8, len: 8, .. }));
        assert!(r.take().is_empty(), "taken");
        drop(r);
        buf.write_be32(0, 1);
        let mut r = Recording::start();
        // Another thread's stores are not this recording's.
        let b2 = buf.clone();
        std::thread::spawn(move || b2.write_be32(0, 9))
            .join()
            .unwrap();
        assert!(r.take().is_empty());
    }
}
