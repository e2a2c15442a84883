//! Completion queues in the HCA, as Linux's `cq.c` creates and frees them.
//!
//! Linux: `cq.c` (`mlx4_cq_alloc`, `mlx4_cq_free`, `mlx4_cq_completion`,
//! `mlx4_init_cq_table`): CQN allocation, ICM, the CQ context and
//! SW2HW_CQ/HW2SW_CQ. MODIFY_CQ (moderation, resize) and the per-CQ
//! callbacks are left out (events go through the interface registry).

use alloc::collections::BTreeMap;

use mlx4_hw::cmd::{Opcode, timeout};
use mlx4_hw::cq::CqContext;

use crate::bitmap::Bitmap;
use crate::cmd::Mailbox;
use crate::dev::{Caps, CqTable, Dev, Hca, Mtt, Uar};
use crate::{Error, Result, Why, mlx4_warn};

/// A hardware CQ (Linux `struct mlx4_cq`, core part).
#[derive(Debug)]
pub struct Cq {
    /// CQ number.
    pub cqn: u32,
    /// Entries (a power of two).
    pub nent: u32,
    /// UAR index its doorbells go through.
    pub uar_index: u32,
}

impl CqTable {
    /// Linux `mlx4_init_cq_table`.
    pub(crate) fn init(caps: &Caps) -> Result<CqTable> {
        let n = caps.num_cqs;
        Ok(CqTable {
            bitmap: Bitmap::new(n, n - 1, caps.reserved_cqs, 0)?,
            cqs: BTreeMap::new(),
        })
    }
}

impl Hca {
    /// The CQ's context and cMPT entry in ICM (Linux `mlx4_cq_alloc_icm`).
    fn cq_alloc_icm(&mut self, cqn: u32) -> Result<()> {
        self.icm
            .cqc
            .get(&mut self.cmd, &self.pool, cqn, &self.pci)?;
        if let Err(e) = self
            .icm
            .cmpt_cq
            .get(&mut self.cmd, &self.pool, cqn, &self.pci)
        {
            self.icm.cqc.put(&mut self.cmd, cqn);
            return Err(e);
        }
        Ok(())
    }

    /// Linux `mlx4_cq_free_icm`.
    fn cq_free_icm(&mut self, cqn: u32) {
        self.icm.cmpt_cq.put(&mut self.cmd, cqn);
        self.icm.cqc.put(&mut self.cmd, cqn);
    }
}

impl Dev {
    /// Linux `mlx4_cq_alloc`: `nent` entries (a power of two) described by
    /// `mtt`, doorbells through `uar`, doorbell record at bus address
    /// `db_rec`, completion events to vector `vector`.
    ///
    /// Refused with [`Error::BadArg`] naming the argument: `nent` zero, not
    /// a power of two or above the device's `max_cqes + 1`; a `vector`
    /// without an EQ; an `mtt` without translation or smaller than `nent`
    /// CQEs; a `db_rec` not 8-byte aligned (two doorbell dwords).
    #[doc(alias = "mlx4_cq_alloc")]
    #[expect(clippy::too_many_arguments)]
    pub fn cq_alloc(
        &mut self,
        nent: u32,
        mtt: &Mtt,
        uar: &Uar,
        db_rec: u64,
        vector: u32,
        collapsed: bool,
        timestamp_en: bool,
    ) -> Result<Cq> {
        let caps = &self.hca.caps;
        Error::check_pow2("nent", nent.into(), u64::from(caps.max_cqes) + 1)?;
        let eqn = self.comp_eqn(vector).ok_or(Error::bad_arg(
            "vector",
            vector.into(),
            Why::AboveMax(u64::from(caps.num_comp_vectors.saturating_sub(1))),
        ))?;
        Dev::check_queue_mtt(
            mtt,
            "nent",
            nent.into(),
            u64::from(nent) * mlx4_hw::cq::CQE_SIZE as u64,
        )?;
        if !db_rec.is_multiple_of(8) {
            return Err(Error::bad_arg("db_rec", db_rec, Why::Misaligned(8)));
        }
        let cqn = self.tables.cq.bitmap.alloc()?;
        let hca = &mut self.hca;
        let r = hca.cq_alloc_icm(cqn).and_then(|()| {
            let mtt_addr = hca.mtt_addr(mtt);
            let mut flags = 0;
            if collapsed {
                flags |= CqContext::FLAG_CC;
            }
            if timestamp_en {
                flags |= CqContext::FLAG_TS;
            }
            let ctx = CqContext {
                flags,
                logsize_usrpage: (nent.ilog2() << 24) | uar.index,
                comp_eqn: eqn as u8,
                log_page_size: (mtt.page_shift - mlx4_hw::icm::ICM_PAGE_SHIFT) as u8,
                mtt_base_addr_h: (mtt_addr >> 32) as u8,
                mtt_base_addr_l: mtt_addr as u32,
                db_rec_addr: db_rec,
                ..Default::default()
            };
            let mb = Mailbox::new(&hca.pool)?;
            mb.write(0, &ctx.to_bytes());
            let r = hca
                .cmd
                .cmd(mb.dma(), cqn, 0, Opcode::SW2HW_CQ, timeout::CLASS_A);
            if r.is_err() {
                hca.cq_free_icm(cqn);
            }
            r
        });
        let t = &mut self.tables.cq;
        match r {
            Ok(()) => {
                t.cqs.insert(cqn, 1);
                Ok(Cq {
                    cqn,
                    nent,
                    uar_index: uar.index,
                })
            }
            Err(e) => {
                t.bitmap.free(cqn);
                Err(e)
            }
        }
    }

    /// Linux `mlx4_cq_free`: HW2SW_CQ, then ICM and the CQN.
    #[doc(alias = "mlx4_cq_free")]
    pub fn cq_free(&mut self, cq: Cq) -> Result<()> {
        let r = self
            .hca
            .cmd
            .cmd_box(0, 0, cq.cqn, 1, Opcode::HW2SW_CQ, timeout::CLASS_A);
        if let Err(e) = &r {
            mlx4_warn!(
                self.hca.pci,
                "HW2SW_CQ failed ({}) for CQN {:06x}",
                e.to_errno(),
                cq.cqn
            );
        }
        self.hca.cq_free_icm(cq.cqn);
        let t = &mut self.tables.cq;
        t.cqs.remove(&cq.cqn);
        t.bitmap.free(cq.cqn);
        r
    }

    /// Linux `mlx4_cq_completion`: counts the arm sequence of a live CQ.
    pub(crate) fn cq_completion(&mut self, cqn: u32) {
        match self.tables.cq.cqs.get_mut(&cqn) {
            Some(sn) => *sn = sn.wrapping_add(1),
            None => mlx4_warn!(self.hca.pci, "Completion event for bogus CQ {cqn:08x}"),
        }
    }

    /// CQs still in hardware ownership at teardown go back (HW2SW_CQ).
    pub(crate) fn reclaim_cqs(&mut self) -> usize {
        let live = self.tables.cq.cqs.keys().copied().collect();
        self.reclaim_each(live, "HW2SW_CQ of leaked CQ", |cmd, cqn| {
            cmd.cmd_box(0, 0, cqn, 1, Opcode::HW2SW_CQ, timeout::CLASS_A)
                .map(drop)
        })
    }

    /// The arm sequence number of a live CQ (Linux `cq->arm_sn`).
    pub fn cq_arm_sn(&self, cqn: u32) -> Option<u32> {
        self.tables.cq.cqs.get(&cqn).copied()
    }

    /// Free CQNs and live CQs (leak checks).
    pub fn cq_avail(&self) -> (u32, usize) {
        let t = &self.tables.cq;
        (t.bitmap.avail(), t.cqs.len())
    }
}
