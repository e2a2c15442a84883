//! A region as the host tests use it: [`SoftRegion`] plays the processor
//! over a [`Pcache`] and a [`SoftMmu`], turning word accesses into page
//! walks, faults served by the cache, and loads and stores in the frames,
//! so the workloads run through the real fault path against the model.

use ib_core::IbCore;

use crate::PAGE_SIZE;
use crate::mmu::SoftMmu;
use crate::region::{Fault, FaultError, Pcache};
use crate::workload::Words;

/// A remote-backed region's words, each access through the page tables.
pub struct SoftRegion<'a> {
    /// The cache.
    pub pc: &'a mut Pcache,
    /// ib_core, for the fault path.
    pub core: &'a mut IbCore,
    /// The page tables.
    pub mmu: &'a mut SoftMmu,
    /// The first fault that could not be served.
    pub error: Option<FaultError>,
    /// Faults taken, by outcome: hit, major, zero-fill, spurious.
    pub faults: [u64; 4],
}

impl<'a> SoftRegion<'a> {
    /// The region behind `pc`.
    pub fn new(pc: &'a mut Pcache, core: &'a mut IbCore, mmu: &'a mut SoftMmu) -> Self {
        SoftRegion {
            pc,
            core,
            mmu,
            error: None,
            faults: [0; 4],
        }
    }

    /// The byte offset in the cache's frames of word `i`, after a fault
    /// if the page is not mapped (`None` if the fault failed).
    fn locate(&mut self, i: usize, write: bool) -> Option<usize> {
        let byte = i.checked_mul(8)?;
        let page = (byte / PAGE_SIZE) as u64;
        if self.error.is_some() {
            return None;
        }
        let frame = match self.mmu.touch(page, write) {
            Some(f) => f,
            None => {
                let t0 = self.core.clock().now_ns();
                match self.pc.fault(self.core, self.mmu, page, t0) {
                    Ok(k) => {
                        self.faults[match k {
                            Fault::Hit => 0,
                            Fault::Major => 1,
                            Fault::ZeroFill => 2,
                            Fault::Spurious => 3,
                        }] += 1;
                    }
                    Err(e) => {
                        self.error = Some(e);
                        return None;
                    }
                }
                self.mmu.touch(page, write)?
            }
        };
        let base = frame.0.checked_sub(self.pc.frames().bus_addr().0)?;
        Some(base as usize + byte % PAGE_SIZE)
    }
}

impl Words for SoftRegion<'_> {
    fn len(&self) -> usize {
        self.pc.config().pages as usize * PAGE_SIZE / 8
    }

    fn get(&mut self, i: usize) -> u64 {
        match self.locate(i, false) {
            Some(off) => self.pc.frames().read_u64(off),
            None => 0,
        }
    }

    fn set(&mut self, i: usize, v: u64) {
        if let Some(off) = self.locate(i, true) {
            self.pc.frames().write_u64(off, v);
        }
    }

    fn failed(&self) -> bool {
        self.error.is_some()
    }
}
