//! Shared receive queues in the HCA, as Linux's `srq.c` creates, arms and frees them.
//!
//! Linux: `srq.c` (LegoOS did not build it): SRQN allocation, ICM, the SRQ
//! context, SW2HW_SRQ/HW2SW_SRQ, ARM_SRQ, QUERY_SRQ. Per-SRQ callbacks are
//! left out (events go through the interface registry).

use mlx4_hw::cmd::{Opcode, timeout};
use mlx4_hw::srq::SrqContext;

use crate::bitmap::Bitmap;
use crate::cmd::Mailbox;
use crate::dev::{Caps, Dev, Hca, Mtt, SrqTable};
use crate::{Error, Result, Why, mlx4_warn};

/// A hardware SRQ (Linux `struct mlx4_srq`, core part).
#[derive(Debug)]
pub struct Srq {
    /// SRQ number.
    pub srqn: u32,
    /// WQEs (a power of two).
    pub max: u32,
}

impl SrqTable {
    /// Linux `mlx4_init_srq_table`.
    pub(crate) fn init(caps: &Caps) -> Result<SrqTable> {
        let n = caps.num_srqs;
        Ok(SrqTable {
            bitmap: Bitmap::new(n, n - 1, caps.reserved_srqs, 0)?,
            live: Default::default(),
        })
    }
}

impl Hca {
    /// The SRQ's context and cMPT entry in ICM, taken (`get`) or released
    /// (Linux `__mlx4_srq_alloc_icm`, `__mlx4_srq_free_icm`).
    fn srq_icm(&mut self, srqn: u32, get: bool) -> Result<()> {
        if get {
            self.icm
                .srqc
                .get(&mut self.cmd, &self.pool, srqn, &self.pci)?;
            if let Err(e) = self
                .icm
                .cmpt_srq
                .get(&mut self.cmd, &self.pool, srqn, &self.pci)
            {
                self.icm.srqc.put(&mut self.cmd, srqn);
                return Err(e);
            }
        } else {
            self.icm.cmpt_srq.put(&mut self.cmd, srqn);
            self.icm.srqc.put(&mut self.cmd, srqn);
        }
        Ok(())
    }
}

impl Dev {
    /// Linux `mlx4_srq_alloc`: `max` WQEs (a power of two) of `2^wqe_shift`
    /// bytes in `mtt`, completions to `cqn`, doorbell record at `db_rec`.
    ///
    /// Refused with [`Error::BadArg`]: `max` zero, not a power of two or
    /// above the device's `max_srq_wqes`; `wqe_shift` below 5 (Linux's
    /// smallest SRQ WQE: next segment and one scatter entry, 32 bytes) or
    /// above the device's `max_rq_desc_sz`; an `mtt` without translation or
    /// smaller than the queue; a `db_rec` not 4-byte aligned.
    #[doc(alias = "mlx4_srq_alloc")]
    #[expect(clippy::too_many_arguments)]
    pub fn srq_alloc(
        &mut self,
        pdn: u32,
        cqn: u32,
        xrcd: u16,
        mtt: &Mtt,
        db_rec: u64,
        max: u32,
        wqe_shift: u32,
    ) -> Result<Srq> {
        let caps = &self.hca.caps;
        Error::check_pow2("max", max.into(), caps.max_srq_wqes.into())?;
        let max_shift = caps.max_rq_desc_sz.max(1).ilog2().min(11);
        Error::check_range("wqe_shift", wqe_shift.into(), 5, max_shift.into())?;
        Dev::check_queue_mtt(mtt, "max", max.into(), u64::from(max) << wqe_shift)?;
        if !db_rec.is_multiple_of(4) {
            return Err(Error::bad_arg("db_rec", db_rec, Why::Misaligned(4)));
        }
        let srqn = self.tables.srq.bitmap.alloc()?;
        let hca = &mut self.hca;
        let r = hca.srq_icm(srqn, true).and_then(|()| {
            let mtt_addr = hca.mtt_addr(mtt);
            let ctx = SrqContext {
                state_logsize_srqn: (max.ilog2() << 24) | srqn,
                logstride: (wqe_shift - 4) as u8,
                xrcd,
                pg_offset_cqn: cqn & 0xff_ffff,
                log_page_size: (mtt.page_shift - mlx4_hw::icm::ICM_PAGE_SHIFT) as u8,
                mtt_base_addr_h: (mtt_addr >> 32) as u8,
                mtt_base_addr_l: mtt_addr as u32,
                pd: pdn,
                db_rec_addr: db_rec,
                ..Default::default()
            };
            let mb = Mailbox::new(&hca.pool)?;
            mb.write(0, &ctx.to_bytes());
            let r = hca
                .cmd
                .cmd(mb.dma(), srqn, 0, Opcode::SW2HW_SRQ, timeout::CLASS_A);
            if r.is_err() {
                let _ = hca.srq_icm(srqn, false);
            }
            r
        });
        let t = &mut self.tables.srq;
        match r {
            Ok(()) => {
                t.live.insert(srqn);
                Ok(Srq { srqn, max })
            }
            Err(e) => {
                t.bitmap.free(srqn);
                Err(e)
            }
        }
    }

    /// Linux `mlx4_srq_free`: HW2SW_SRQ (no mailbox), ICM, SRQN.
    #[doc(alias = "mlx4_srq_free")]
    pub fn srq_free(&mut self, srq: Srq) -> Result<()> {
        let r = self
            .hca
            .cmd
            .cmd_box(0, 0, srq.srqn, 1, Opcode::HW2SW_SRQ, timeout::CLASS_A);
        if let Err(e) = &r {
            mlx4_warn!(
                self.hca.pci,
                "HW2SW_SRQ failed ({}) for SRQN {:06x}",
                e.to_errno(),
                srq.srqn
            );
        }
        let _ = self.hca.srq_icm(srq.srqn, false);
        let t = &mut self.tables.srq;
        t.bitmap.free(srq.srqn);
        t.live.remove(&srq.srqn);
        r
    }

    /// Linux `mlx4_srq_arm`: limit-watermark event when fewer WQEs remain.
    #[doc(alias = "mlx4_srq_arm")]
    /// A watermark of `srq.max` or more is refused (Linux
    /// `mlx4_ib_modify_srq`: the event could never fire).
    pub fn srq_arm(&mut self, srq: &Srq, limit_watermark: u32) -> Result<()> {
        if limit_watermark >= srq.max {
            return Err(Error::bad_arg(
                "limit_watermark",
                limit_watermark.into(),
                Why::AboveMax(u64::from(srq.max.saturating_sub(1))),
            ));
        }
        self.hca.cmd.cmd(
            u64::from(limit_watermark),
            srq.srqn,
            0,
            Opcode::ARM_SRQ,
            timeout::CLASS_B,
        )
    }

    /// Linux `mlx4_srq_query`: the current limit watermark.
    #[doc(alias = "mlx4_srq_query")]
    pub fn srq_query(&mut self, srq: &Srq) -> Result<u32> {
        let mb = Mailbox::new(&self.hca.pool)?;
        self.hca.cmd.cmd_box(
            0,
            mb.dma(),
            srq.srqn,
            0,
            Opcode::QUERY_SRQ,
            timeout::CLASS_A,
        )?;
        let b: [u8; SrqContext::SIZE] = mb.read();
        Ok(u32::from(SrqContext::from_bytes(&b).limit_watermark))
    }

    /// SRQs still in hardware ownership at teardown go back (HW2SW_SRQ).
    pub(crate) fn reclaim_srqs(&mut self) -> usize {
        let live = self.tables.srq.live.iter().copied().collect();
        self.reclaim_each(live, "HW2SW_SRQ of leaked SRQ", |cmd, srqn| {
            cmd.cmd_box(0, 0, srqn, 1, Opcode::HW2SW_SRQ, timeout::CLASS_A)
                .map(drop)
        })
    }

    /// Free SRQNs and live SRQs (leak checks).
    pub fn srq_avail(&self) -> (u32, usize) {
        let t = &self.tables.srq;
        (t.bitmap.avail(), t.live.len())
    }
}
