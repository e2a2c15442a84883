//! Queue pairs in the HCA, as Linux's `qp.c` reserves, maps and moves them between states.
//!
//! Linux: `qp.c` (`mlx4_init_qp_table`, `mlx4_cleanup_qp_table`,
//! `mlx4_qp_reserve_range`, `mlx4_qp_alloc`, `mlx4_qp_free`,
//! `__mlx4_qp_modify`, `mlx4_qp_to_ready`, `mlx4_qp_query`,
//! `mlx4_CONF_SPECIAL_QP`): QPN ranges with reserved regions and the
//! special-QP block, per-QP ICM, the state-transition commands. SR-IOV
//! proxy/tunnel QPs are left out.

use alloc::collections::BTreeMap;

use mlx4_hw::cmd::{Opcode, timeout};
use mlx4_hw::qp::{QP_MODIFY_CONTEXT_OFFSET, QpContext, QpState, transition};

use crate::bitmap::Bitmap;
use crate::cmd::{Cmd, Mailbox};
use crate::dev::{Dev, Hca, Mtt, QpTable};
use crate::{Error, Result, Why, mlx4_dbg, mlx4_err, mlx4_warn};

/// QP regions (`enum mlx4_qp_region`): firmware, Ethernet MAC, FC address,
/// FC exchange.
pub const NUM_QP_REGION: usize = 4;

/// A hardware QP (Linux `struct mlx4_qp`, core part).
#[derive(Debug)]
pub struct Qp {
    /// QP number.
    pub qpn: u32,
}

/// Linux `mlx4_CONF_SPECIAL_QP`: the special-QP block starts at `base_qpn`
/// (0: none).
fn conf_special_qp(cmd: &mut Cmd, base_qpn: u32) -> Result<()> {
    cmd.cmd(0, base_qpn, 0, Opcode::CONF_SPECIAL_QP, timeout::CLASS_B)
}

impl QpTable {
    /// Linux `mlx4_init_qp_table`: special-QP base (aligned to 8 above the
    /// firmware's QPs), regions taken from the top of the QPN space, the
    /// bitmap, and CONF_SPECIAL_QP.
    pub(crate) fn init(hca: &mut Hca) -> Result<QpTable> {
        let pci = hca.pci;
        let c = &mut hca.caps;
        c.base_sqpn = c.reserved_qps_cnt[0].next_multiple_of(8);
        // Regions 1.. sorted by decreasing size, stacked from the top.
        let mut sort = [1usize, 2, 3];
        sort.sort_by(|&a, &b| c.reserved_qps_cnt[b].cmp(&c.reserved_qps_cnt[a]));
        let mut last_base = c.num_qps;
        let mut from_top = 0u32;
        for &r in &sort {
            let cnt = c.reserved_qps_cnt[r];
            last_base = last_base.checked_sub(cnt).ok_or(Error::InvalidArg)?;
            c.reserved_qps_base[r] = last_base;
            from_top += cnt;
        }
        // 8 special QPs: QP0 and QP1 of each port, real numbers.
        let reserved_bot = c.base_sqpn + 8;
        if reserved_bot + from_top > c.num_qps {
            mlx4_err!(
                pci,
                "{} QPs cannot hold {} reserved at the bottom and {} at the top",
                c.num_qps,
                reserved_bot,
                from_top
            );
            return Err(Error::InvalidArg);
        }
        let bitmap = Bitmap::new(c.num_qps, (1 << 23) - 1, reserved_bot, from_top)?;
        let base = c.base_sqpn;
        conf_special_qp(&mut hca.cmd, base)?;
        mlx4_dbg!(pci, "special QPs at {base:#x}");
        Ok(QpTable {
            bitmap,
            special_configured: true,
            live: BTreeMap::new(),
        })
    }

    /// Linux `mlx4_cleanup_qp_table`: CONF_SPECIAL_QP(0).
    pub(crate) fn cleanup(&mut self, hca: &mut Hca) {
        if core::mem::take(&mut self.special_configured)
            && let Err(e) = conf_special_qp(&mut hca.cmd, 0)
        {
            mlx4_warn!(hca.pci, "CONF_SPECIAL_QP(0) failed ({})", e.to_errno());
        }
    }
}

impl Dev {
    /// Linux `mlx4_CONF_SPECIAL_QP`.
    #[doc(alias = "mlx4_CONF_SPECIAL_QP")]
    pub fn conf_special_qp(&mut self, base_qpn: u32) -> Result<()> {
        conf_special_qp(&mut self.hca.cmd, base_qpn)
    }

    /// Real QPN of QP0 (`qp1 == false`) or QP1 of `port`.
    pub fn special_qpn(&self, port: u8, qp1: bool) -> u32 {
        self.hca.caps.base_sqpn + u32::from(port.saturating_sub(1)) + if qp1 { 2 } else { 0 }
    }

    /// Linux `mlx4_qp_reserve_range`: `cnt` QPNs aligned to `align`.
    #[doc(alias = "mlx4_qp_reserve_range")]
    ///
    /// `cnt` must be 1 to `num_qps`, `align` a power of two no larger than
    /// `num_qps` ([`Error::BadArg`] otherwise).
    pub fn qp_reserve_range(&mut self, cnt: u32, align: u32) -> Result<u32> {
        let n = u64::from(self.hca.caps.num_qps);
        Error::check_range("cnt", cnt.into(), 1, n)?;
        Error::check_pow2("align", align.into(), n)?;
        self.tables
            .qp
            .bitmap
            .alloc_range(cnt, align)
            .map(|q| q & 0x7f_ffff)
    }

    /// Linux `mlx4_qp_release_range` (reserved QPNs are never released).
    #[doc(alias = "mlx4_qp_release_range")]
    pub fn qp_release_range(&mut self, base: u32, cnt: u32) {
        if base < self.hca.caps.base_sqpn + 8 {
            return;
        }
        self.tables.qp.bitmap.free_range(base, cnt);
    }

    /// Linux `mlx4_qp_alloc`: maps the QP's context memory (QPC, AUXC, ALTC,
    /// RDMARC, cMPT) for a QPN obtained from [`Dev::qp_reserve_range`] or a
    /// special QPN.
    #[doc(alias = "mlx4_qp_alloc")]
    pub fn qp_alloc(&mut self, qpn: u32) -> Result<Qp> {
        // QPNs carry the bitmap's rotating high bits (Linux); the context
        // index is the QPN modulo the table size.
        Error::check_range("qpn", qpn.into(), 1, (1 << 24) - 1)?;
        if self.tables.qp.live.contains_key(&qpn) {
            return Err(Error::Busy);
        }
        self.hca.qp_icm(qpn, true)?;
        self.tables.qp.live.insert(qpn, QpState::Rst);
        Ok(Qp { qpn })
    }

    /// Linux `mlx4_qp_free` (with `mlx4_qp_remove`): releases the context
    /// memory; the QPN goes back with [`Dev::qp_release_range`].
    #[doc(alias = "mlx4_qp_free")]
    pub fn qp_free(&mut self, qp: Qp) {
        self.tables.qp.live.remove(&qp.qpn);
        let _ = self.hca.qp_icm(qp.qpn, false);
    }

    /// Linux `__mlx4_qp_modify`: the transition command for `cur -> new`
    /// (illegal transitions are refused without touching the HCA). At
    /// RST->INIT the MTT address and page size are filled from `mtt`; the
    /// local QPN is always overwritten.
    #[doc(alias = "mlx4_qp_modify")]
    #[expect(clippy::too_many_arguments)]
    pub fn qp_modify(
        &mut self,
        qp: &Qp,
        mtt: Option<&Mtt>,
        cur: QpState,
        new: QpState,
        context: &QpContext,
        optpar: u32,
        sqd_event: bool,
    ) -> Result<()> {
        let op = transition(cur, new).ok_or(Error::InvalidArg)?;
        let to_init = cur == QpState::Rst && new == QpState::Init;
        if to_init {
            self.check_qp_sizes(context, mtt)?;
        }
        let hca = &mut self.hca;
        let r = if op == Opcode::QP_2RST {
            hca.cmd.cmd(0, qp.qpn, 2, Opcode::QP_2RST, timeout::CLASS_A)
        } else {
            let mut ctx = *context;
            if to_init && let Some(m) = mtt {
                let a = hca.mtt_addr(m);
                ctx.mtt_base_addr_h = (a >> 32) as u8;
                ctx.mtt_base_addr_l = a as u32;
                ctx.log_page_size = (m.page_shift - mlx4_hw::icm::ICM_PAGE_SHIFT) as u8;
            }
            ctx.local_qpn = qp.qpn;
            let mb = Mailbox::new(&hca.pool)?;
            mb.write(0, &optpar.to_be_bytes());
            mb.write(QP_MODIFY_CONTEXT_OFFSET, &ctx.to_bytes());
            let in_mod = qp.qpn | (u32::from(sqd_event) << 31);
            let op_mod = if new == QpState::Rst { 2 } else { 0 };
            hca.cmd.cmd(mb.dma(), in_mod, op_mod, op, timeout::CLASS_C)
        };
        if r.is_ok()
            && let Some(s) = self.tables.qp.live.get_mut(&qp.qpn)
        {
            *s = new;
        }
        r
    }

    /// Linux `mlx4_qp_to_ready`: RST->INIT (with `mtt`) -> RTR -> RTS, the
    /// state field of `context`'s flags set for each step.
    #[doc(alias = "mlx4_qp_to_ready")]
    pub fn qp_to_ready(&mut self, qp: &Qp, mtt: &Mtt, context: &QpContext) -> Result<()> {
        let steps = [
            (QpState::Rst, QpState::Init),
            (QpState::Init, QpState::Rtr),
            (QpState::Rtr, QpState::Rts),
        ];
        for (cur, new) in steps {
            let mut c = *context;
            c.flags = (c.flags & 0x0fff_ffff) | (new as u32) << 28;
            let m = (cur == QpState::Rst).then_some(mtt);
            self.qp_modify(qp, m, cur, new, &c, 0, false)?;
        }
        Ok(())
    }

    /// The work-queue geometry of a RST->INIT context, as Linux's mlx4_ib
    /// (`set_rq_size`, `set_kernel_sq_size`) and the card bound it: each
    /// queue at most `max_wqes` WQEs; SQ stride 64 bytes (one WQE basic
    /// block, `MLX4_IB_SQ_MIN_WQE_SHIFT`) to `max_sq_desc_sz`; RQ stride 16
    /// bytes (one scatter entry) to `max_rq_desc_sz`, or `rq_size_stride`
    /// 0 (or an SRQ) for a QP without its own RQ; both queues inside the pages of `mtt`.
    fn check_qp_sizes(&self, ctx: &QpContext, mtt: Option<&Mtt>) -> Result<()> {
        let c = &self.hca.caps;
        let log_max_wqes = u64::from(c.max_wqes.max(1).ilog2());
        let sq = ctx.sq_size_stride;
        let rq = ctx.rq_size_stride;
        let field = |v: u8| (u64::from(v >> 3), u64::from(v & 7) + 4);
        let (sq_log, sq_shift) = field(sq);
        let (rq_log, rq_shift) = field(rq);
        let log_desc = |d: u32| u64::from(d.max(1).ilog2());
        let bad = |arg, why| {
            Err(Error::bad_arg(
                arg,
                u64::from(if arg == "sq_size_stride" { sq } else { rq }),
                why,
            ))
        };
        if sq_log > log_max_wqes {
            return bad(
                "sq_size_stride",
                Why::Other("more SQ WQEs than the device's max_wqes"),
            );
        }
        if sq_shift < 6 {
            return bad(
                "sq_size_stride",
                Why::Other("SQ stride below 64 bytes (one WQE basic block)"),
            );
        }
        if sq_shift > log_desc(c.max_sq_desc_sz) {
            return bad(
                "sq_size_stride",
                Why::Other("SQ stride above the device's max_sq_desc_sz"),
            );
        }
        // A QP on an SRQ (srqn bit 24) has no RQ of its own; Linux leaves
        // junk in its rq_size_stride.
        let own_rq = rq != 0 && ctx.srqn & (1 << 24) == 0;
        if own_rq {
            if rq_log > log_max_wqes {
                return bad(
                    "rq_size_stride",
                    Why::Other("more RQ WQEs than the device's max_wqes"),
                );
            }
            if rq_shift > log_desc(c.max_rq_desc_sz) {
                return bad(
                    "rq_size_stride",
                    Why::Other("RQ stride above the device's max_rq_desc_sz"),
                );
            }
        }
        if let Some(m) = mtt {
            let rq_bytes = if own_rq {
                1u64 << (rq_log + rq_shift)
            } else {
                0
            };
            let need = rq_bytes + (1u64 << (sq_log + sq_shift));
            Dev::check_queue_mtt(m, "sq_size_stride", u64::from(sq), need)?;
        }
        Ok(())
    }

    /// Linux `mlx4_qp_query`: the QP context as the HCA holds it.
    #[doc(alias = "mlx4_qp_query")]
    pub fn qp_query(&mut self, qp: &Qp) -> Result<QpContext> {
        let mb = Mailbox::new(&self.hca.pool)?;
        self.hca
            .cmd
            .cmd_box(0, mb.dma(), qp.qpn, 0, Opcode::QUERY_QP, timeout::CLASS_A)?;
        let b: [u8; QP_MODIFY_CONTEXT_OFFSET + QpContext::SIZE] = mb.read();
        Ok(QpContext::from_bytes(&b[QP_MODIFY_CONTEXT_OFFSET..]))
    }

    /// QPs still out of RESET at teardown are moved there (2RST) so the HCA
    /// owns none when it is closed; returns how many.
    pub(crate) fn reclaim_qps(&mut self) -> usize {
        let busy = (self.tables.qp.live.iter())
            .filter(|(_, s)| **s != QpState::Rst)
            .map(|(q, _)| *q)
            .collect();
        self.reclaim_each(busy, "2RST of leaked QP", |cmd, qpn| {
            cmd.cmd(0, qpn, 2, Opcode::QP_2RST, timeout::CLASS_A)
        })
    }

    /// Free QPNs and live QPs (leak checks).
    pub fn qp_avail(&self) -> (u32, usize) {
        let t = &self.tables.qp;
        (t.bitmap.avail(), t.live.len())
    }
}

impl Hca {
    /// The QP's context memory (QPC, AUXC, ALTC, RDMARC, cMPT), taken
    /// (`get`) or released in reverse (Linux `__mlx4_qp_alloc_icm`,
    /// `__mlx4_qp_free_icm`).
    fn qp_icm(&mut self, qpn: u32, get: bool) -> Result<()> {
        let t = &mut self.icm;
        let mut tabs = [
            &mut t.qpc,
            &mut t.auxc,
            &mut t.altc,
            &mut t.rdmarc,
            &mut t.cmpt_qp,
        ];
        if get {
            for i in 0..tabs.len() {
                if let Err(e) = tabs[i].get(&mut self.cmd, &self.pool, qpn, &self.pci) {
                    for tab in tabs[..i].iter_mut().rev() {
                        tab.put(&mut self.cmd, qpn);
                    }
                    return Err(e);
                }
            }
        } else {
            for tab in tabs.iter_mut().rev() {
                tab.put(&mut self.cmd, qpn);
            }
        }
        Ok(())
    }
}
