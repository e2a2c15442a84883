//! The completion queues of a port's rings, as Linux's `en_cq.c` makes them (`mlx4_en_create_cq`, `mlx4_en_activate_cq`, `mlx4_en_destroy_cq`), polled by owner bit.
//!
//! Left out: arming and completion events (the rings are busy-polled),
//! moderation (`mlx4_en_set_cq_moder`), 64-byte CQEs.

use hal::barrier::dma_rmb;
use mlx4_core::Dev;
use mlx4_core::bitmap::{Buf, Db};
use mlx4_core::cq::Cq;
use mlx4_core::dev::{Mtt, Uar};
use mlx4_hw::cq::{CQE_OWNER_MASK, CQE_OWNER_SR_OPCODE, CQE_SIZE};

use crate::Result;

/// A CQ of one ring.
pub struct EnCq {
    cq: Cq,
    buf: Buf,
    mtt: Mtt,
    db: Db,
    nent: u32,
    /// Consumer index (`mcq.cons_index`).
    pub cons_index: u32,
}

impl EnCq {
    /// Linux `mlx4_en_create_cq` + `mlx4_en_activate_cq`: `nent` CQEs
    /// (a power of two), every one hardware-owned in the first pass (owner
    /// bit 1), doorbells through `uar`.
    pub fn create(dev: &mut Dev, nent: u32, uar: &Uar) -> Result<EnCq> {
        let size = nent as usize * CQE_SIZE;
        let buf = dev.buf_alloc(size, size.max(4096))?;
        for i in 0..nent as usize {
            if let Some((b, off)) = buf.locate(i * CQE_SIZE + CQE_OWNER_SR_OPCODE) {
                b.write_u8(off, CQE_OWNER_MASK);
            }
        }
        let mtt = dev.mtt_init(buf.npages, buf.page_shift)?;
        let r = dev.buf_write_mtt(&mtt, &buf).and_then(|()| dev.db_alloc(1));
        let db = match r {
            Ok(db) => db,
            Err(e) => {
                dev.mtt_cleanup(&mtt);
                return Err(e.into());
            }
        };
        match dev.cq_alloc(nent, &mtt, uar, db.dma, 0, false, false) {
            Ok(cq) => Ok(EnCq {
                cq,
                buf,
                mtt,
                db,
                nent,
                cons_index: 0,
            }),
            Err(e) => {
                dev.db_free(db);
                dev.mtt_cleanup(&mtt);
                Err(e.into())
            }
        }
    }

    /// The CQ number.
    pub fn cqn(&self) -> u32 {
        self.cq.cqn
    }

    /// The CQE at the consumer index if software owns it (its owner bit
    /// equals the pass parity), copied out after a read barrier.
    pub fn peek(&self) -> Option<[u8; CQE_SIZE]> {
        let off = (self.cons_index & (self.nent - 1)) as usize * CQE_SIZE;
        let (b, o) = self.buf.locate(off)?;
        let owner = b.read_u8(o + CQE_OWNER_SR_OPCODE) & CQE_OWNER_MASK != 0;
        if owner != (self.cons_index & self.nent != 0) {
            return None;
        }
        dma_rmb();
        let mut c = [0u8; CQE_SIZE];
        b.read_bytes(o, &mut c);
        Some(c)
    }

    /// Consumes `n` CQEs and tells the HCA (`mlx4_cq_set_ci`).
    pub fn consume(&mut self, dev: &Dev, n: u32) {
        if n == 0 {
            return;
        }
        self.cons_index = self.cons_index.wrapping_add(n);
        if let Some((b, off)) = dev.db_record(&self.db) {
            b.write_be32(off, self.cons_index & 0xff_ffff);
        }
    }

    /// Linux `mlx4_en_deactivate_cq` + `mlx4_en_destroy_cq`.
    pub fn destroy(self, dev: &mut Dev) {
        if let Err(e) = dev.cq_free(self.cq) {
            log::warn!("mlx4_en: HW2SW_CQ failed: {e}");
        }
        dev.mtt_cleanup(&self.mtt);
        dev.db_free(self.db);
    }
}
