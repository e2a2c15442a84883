//! Memory windows as the ConnectX-3 runs them.
//!
//! Memory windows as a ConnectX-3 runs them (IBTA vol. 1 10.6.7, the
//! mlx4 window MPT of Linux `mlx4_mw_enable`): the BIND_MW WQE for type 1
//! and type 2 (2B) windows, R_Key checks through a bound window (its own
//! bounds, rights, PD and, for type 2, the QP it is bound to, then the
//! parent MR's translation), LOCAL_INVAL and SEND with Invalidate of a
//! type 2 window (in loopback and across a link, where the R_Key travels in
//! the IETH of SEND Only/Last with Invalidate, [`super::wire`]), the bound
//! state in the window's dMPT entry and the parent's window count; left
//! out: invalidation of MR keys (fast-register MRs are not modelled, so
//! such a key fails), and the status nibble of a type 2 window's entry
//! (free/valid; the model keeps the type in the firmware's MPT state and
//! the entry's status reads "hardware owned" throughout).
//!
//! # The window's dMPT entry and the parent's `win_cnt`
//!
//! Every bind, unbind and invalidation writes the window's state into its
//! dMPT entry (Linux `struct mlx4_mpt_entry`, the fields `mlx4_mw_enable`
//! fills): the R_Key in hardware-index form at 0x08, start at 0x10, length
//! at 0x18, the remote rights in the flags dword (bits 12-14, as a
//! region's) and, for type 2, the bound QP in bits 31:8 of the QPN dword at
//! 0x04 (the low byte, with Linux's bound-QP flag bit 7, kept). An unbound
//! window reads length 0, no rights, QPN 0, its last key. QUERY_MPT and the
//! mailbox of HW2SW_MPT show it. The parent region's `win_cnt` (0x24)
//! counts the windows bound to it, both types.
//!
//! HW2SW_MPT of a region with windows bound is refused with status REG_BOUND (0x21)
//! and the region stays with the hardware, its windows working. Sources: Linux mlx4
//! `cmd.c` names status 0x21 "Memory Region has Memory Windows bound to" (mapped to
//! -EBUSY) and `mlx4_closing_cmd_fatal_error` excepts exactly that status of
//! HW2SW_MPT from the fatal errors ("memory region has memory windows bound to
//! it"); `mlx4_mr_free_reserved` then keeps the MR enabled; libibverbs
//! `ibv_alloc_mw(3)`: "ibv_dereg_mr() fails if any memory window is still bound to
//! this MR". HW2SW_MPT of a bound window itself succeeds and releases it from its
//! parent (`ibv_dealloc_mw(3)`: deallocation unbinds; Linux `mlx4_mw_free` is a
//! plain HW2SW_MPT).
//!
//! Bind segment (32 bytes after the control segment; Linux 3.11
//! `mlx4_wqe_bind_seg`, rdma-core libmlx4 `wqe.h`, same layout): 0x00
//! flags1 (bit 29 remote read, 30 remote write, 31 remote atomic), 0x04
//! flags2 (bit 30 zero-based, bit 31 type 2), 0x08 new R_Key, 0x0c L_Key of
//! the parent MR, 0x10 address, 0x18 length. Local-invalidate segment (32
//! bytes): the key at 0x08.
//!
//! # Where the readings differ
//!
//! * Local-invalidate segment: Linux before the memory-window support put
//!   `mem_key` at byte 4 (`u8 flags; u8 reserved1[3]; __be32 mem_key`);
//!   Linux 3.11 and libmlx4 put it at byte 8 (`u64 reserved1`). The model
//!   reads byte 8, as the Linux that posts BIND_MW does.
//! * Bind flags1: Linux's `set_bind_seg` builds it with `convert_access`
//!   and masks it to the three remote bits; libmlx4 sets only those three.
//!   The model reads bits 31:29 and ignores the local bits 28:27 (a window
//!   grants remote access only).
//! * Window type: Linux marks a type 2 window by status "free" (0x3), the
//!   bound-QP bit (bit 7 of the QPN dword) and EN_INV; a type 1 window by
//!   status 0. The model takes the type from the status and requires
//!   EN_INV (pd_flags bits 25:24) for any invalidation.
//!
//! # Decisions (IBTA 10.6.7, where the PRM is silent)
//!
//! * Every bind failure completes with the memory window bind error
//!   (syndrome 0x06) and moves the QP to the error state: a window key
//!   that names no window, a type bit that does not match the window, a
//!   window of another PD, a type 2 window that is already bound, a
//!   zero-based type 1 bind (zero-based addressing is for type 2 only), a
//!   parent L_Key that is not a valid region of the QP's PD, a parent
//!   without bind enable (dMPT bit 15), remote write or atomic on a parent
//!   without local write, a range outside the parent.
//! * A type 1 bind of length 0 unbinds the window; a type 1 window may be
//!   rebound. A type 2 window is bound once and returns to the free state
//!   only by invalidation.
//! * LOCAL_INVAL failures (a key that names no bound type 2 window of the
//!   QP's PD, or a type 1 window) complete with syndrome 0x06 as well
//!   (IBTA "memory management operation error", the status Linux names
//!   IB_WC_MW_BIND_ERR).
//! * SEND with Invalidate (RC only, IBTA 9.4.1.1): the responder checks the
//!   key before it consumes the message (a bound type 2 window of the
//!   responder's PD, bound to the responder QP); an invalid key completes
//!   the receive WQE with "local access error", moves the responder to ERR
//!   (invalid request event) and NAKs the requester with "invalid request"
//!   (REM_INV_REQ_ERR). On success the receive CQE has opcode SEND_INVAL
//!   and the invalidated key in its immediate dword.
//! * Windows are checked only through their R_Key: a window key used as a
//!   local key is refused as a non-region.

use super::QpEng;
use super::cq::Syndrome;
use super::exec::Outcome;
use super::xlate::{self, Access, KeyError, KeyUse, Xl};
use crate::hca::ctx::mpt;
use crate::hca::device::Hca;
use crate::hca::icm::Table;
use crate::hca::layout::{get32, get64};

/// Bind flags1: remote read, remote write, remote atomic.
const BIND_RR: u32 = 1 << 29;
const BIND_RW: u32 = 1 << 30;
const BIND_RA: u32 = 1 << 31;
/// Bind flags2: zero-based, type 2.
const BIND_ZB: u32 = 1 << 30;
const BIND_TYPE2: u32 = 1 << 31;
/// dMPT access bits.
const MPT_LW: u32 = 1 << 11;
const MPT_RR: u32 = 1 << 12;
const MPT_RW: u32 = 1 << 13;
const MPT_RA: u32 = 1 << 14;
/// dMPT pd_flags: invalidation enabled.
const EN_INV: u32 = 3 << 24;

/// A window's binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The full R_Key of the binding.
    pub key: u32,
    /// First byte in the parent MR's address space.
    pub start: u64,
    /// Length.
    pub len: u64,
    /// Remote rights as dMPT access bits.
    pub access: u32,
    /// Addressed from 0 (type 2 only).
    pub zero_based: bool,
    /// L_Key of the parent MR.
    pub parent: u32,
    /// Type 2: the QP it is bound to.
    pub qpn: Option<u32>,
}

/// A window in hardware ownership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Type 2 (else type 1).
    pub type2: bool,
    /// PD.
    pub pd: u32,
    /// Invalidation enabled (EN_INV).
    pub en_inv: bool,
    /// Current binding.
    pub bound: Option<Bound>,
}

/// The window at dMPT `idx`, from the entry SW2HW_MPT installed (None if
/// the entry is not a window in hardware ownership).
fn window(hca: &mut Hca, idx: u32) -> Option<Window> {
    if let Some(w) = hca.engine.mws.get(&idx) {
        return Some(*w);
    }
    let st = hca.mpts.get(&idx).copied()?;
    let m = xlate::mpt_entry(hca, idx)?;
    if m.flags & crate::hca::ctx::mpt::FLAG_REGION != 0 {
        return None;
    }
    let w = Window {
        type2: st.free,
        pd: m.pd,
        en_inv: m.pd_flags & EN_INV == EN_INV,
        bound: None,
    };
    hca.engine.mws.insert(idx, w);
    Some(w)
}

/// Forgets window state at `idx` (SW2HW_MPT / HW2SW_MPT); a window that
/// was bound no longer counts in its parent's `win_cnt`.
pub fn forget(hca: &mut Hca, idx: u32) {
    let gone = hca.engine.mws.remove(&idx).and_then(|w| w.bound);
    if let Some(b) = gone {
        let p = xlate::key_index(hca, b.parent);
        write_win_cnt(hca, p);
    }
}

/// Windows bound to the region at dMPT `idx` (its `win_cnt`).
pub fn windows_on(hca: &mut Hca, idx: u32) -> u32 {
    // The index mask (dMPT entries - 1): the index bits of an all-ones key.
    let mask = xlate::key_index(hca, u32::MAX);
    hca.engine
        .mws
        .values()
        .filter_map(|w| w.bound)
        .filter(|b| b.parent.rotate_left(24) & mask == idx)
        .count() as u32
}

/// Writes the parent region's window count into its dMPT entry.
fn write_win_cnt(hca: &mut Hca, pidx: u32) {
    let n = windows_on(hca, pidx);
    if let Ok(g) = hca.geo() {
        let va = g.va(Table::Dmpt, u64::from(pidx)) + mpt::WIN_CNT as u64;
        let _ = hca.icm_write(va, &n.to_be_bytes());
    }
}

/// Writes window `idx`'s binding into its dMPT entry (a QUERY_MPT or
/// HW2SW_MPT sees it), and the window counts of the parent it left and
/// the parent it is now bound to.
fn write_back(hca: &mut Hca, idx: u32, old: Option<Bound>, new: Option<Bound>) {
    let Ok(g) = hca.geo() else {
        return;
    };
    let va = g.va(Table::Dmpt, u64::from(idx));
    let mut e = [0u8; mpt::SIZE];
    if hca.icm_read(va, &mut e).is_err() {
        return;
    }
    let rights = MPT_RR | MPT_RW | MPT_RA;
    let b = new.unwrap_or(Bound {
        key: old.map_or(0, |o| o.key),
        start: 0,
        len: 0,
        access: 0,
        zero_based: false,
        parent: 0,
        qpn: None,
    });
    let flags = get32(&e, mpt::FLAGS) & !rights | b.access;
    let qpn = get32(&e, mpt::QPN) & 0xff | b.qpn.map_or(0, |q| q << 8);
    e[mpt::FLAGS..mpt::FLAGS + 4].copy_from_slice(&flags.to_be_bytes());
    e[mpt::QPN..mpt::QPN + 4].copy_from_slice(&qpn.to_be_bytes());
    e[mpt::KEY..mpt::KEY + 4].copy_from_slice(&b.key.rotate_left(24).to_be_bytes());
    e[mpt::START..mpt::START + 8].copy_from_slice(&b.start.to_be_bytes());
    e[mpt::LENGTH..mpt::LENGTH + 8].copy_from_slice(&b.len.to_be_bytes());
    let _ = hca.icm_write(va, &e);
    hca.engine.mpts.remove(&idx);
    for p in [old, new].into_iter().flatten() {
        let pidx = xlate::key_index(hca, p.parent);
        write_win_cnt(hca, pidx);
    }
}

/// Checks R_Key use `u` (dMPT `idx`, a window entry) for a remote access
/// (the type 2 QP check is skipped when `u` names no QP); returns the
/// parent's translation, shifted so that window addresses translate.
pub fn check(hca: &mut Hca, idx: u32, u: KeyUse) -> Result<Xl, KeyError> {
    let KeyUse {
        key,
        qpn,
        pd,
        access,
        addr,
        len,
    } = u;
    let Some(w) = window(hca, idx) else {
        return Err(KeyError::BadKey);
    };
    let Some(b) = w.bound else {
        return Err(KeyError::BadKey);
    };
    if b.key != key {
        return Err(KeyError::BadKey);
    }
    let bit = match access {
        Access::LocalRead | Access::LocalWrite => return Err(KeyError::NotRegion),
        Access::RemoteRead => MPT_RR,
        Access::RemoteWrite => MPT_RW,
        Access::RemoteAtomic => MPT_RA,
    };
    if w.pd != pd {
        return Err(KeyError::Pd);
    }
    if let (Some(bq), Some(q)) = (b.qpn, qpn)
        && bq != q
    {
        return Err(KeyError::Qp);
    }
    if b.access & bit == 0 {
        return Err(KeyError::Access);
    }
    let base = if b.zero_based { 0 } else { b.start };
    let end = addr.checked_add(len).ok_or(KeyError::Bounds)?;
    if addr < base || end > base.saturating_add(b.len) {
        return Err(KeyError::Bounds);
    }
    let paddr = b.start + (addr - base);
    let xl = xlate::check(hca, b.parent, pd, Access::LocalRead, paddr, len, false)
        .map_err(|_| KeyError::BadKey)?;
    Ok(Xl {
        delta: paddr.wrapping_sub(addr),
        ..xl
    })
}

/// BIND_MW on an RC/UC QP.
pub(super) fn bind(hca: &mut Hca, q: &QpEng, wqe: &[u8]) -> Outcome {
    if wqe.len() < 16 + 32 {
        return Outcome::Fail(Syndrome::LocalQpOp);
    }
    let f1 = get32(wqe, 16);
    let f2 = get32(wqe, 20);
    let rkey = get32(wqe, 24);
    let lkey = get32(wqe, 28);
    let addr = get64(wqe, 32);
    let len = get64(wqe, 40);
    let type2 = f2 & BIND_TYPE2 != 0;
    let zero_based = f2 & BIND_ZB != 0;
    let mut access = 0;
    for (b, m) in [(BIND_RR, MPT_RR), (BIND_RW, MPT_RW), (BIND_RA, MPT_RA)] {
        if f1 & b != 0 {
            access |= m;
        }
    }
    let fail = Outcome::Fail(Syndrome::MwBind);
    let idx = xlate::key_index(hca, rkey);
    let Some(mut w) = window(hca, idx) else {
        return fail;
    };
    if w.type2 != type2 || w.pd != q.pd || (type2 && w.bound.is_some()) || (zero_based && !type2) {
        return fail;
    }
    if xlate::check(hca, lkey, q.pd, Access::LocalRead, addr, len, false).is_err() {
        return fail;
    }
    let pidx = xlate::key_index(hca, lkey);
    let Some(parent) = xlate::mpt_entry(hca, pidx) else {
        return fail;
    };
    if parent.flags & 1 << 15 == 0 {
        return fail;
    }
    if access & (MPT_RW | MPT_RA) != 0 && parent.flags & MPT_LW == 0 {
        return fail;
    }
    let old = w.bound;
    w.bound = if !type2 && len == 0 {
        None
    } else {
        Some(Bound {
            key: rkey,
            start: addr,
            len,
            access,
            zero_based,
            parent: lkey,
            qpn: type2.then_some(q.qpn),
        })
    };
    hca.engine.mws.insert(idx, w);
    write_back(hca, idx, old, w.bound);
    Outcome::Done { byte_cnt: 0 }
}

/// Checks that `key` may be invalidated by QP `qpn` of PD `pd` (remote:
/// SEND with Invalidate, which also needs the window bound to that QP);
/// invalidates it if `commit`.
pub(super) fn invalidate(
    hca: &mut Hca,
    key: u32,
    qpn: u32,
    pd: u32,
    remote: bool,
    commit: bool,
) -> Result<(), KeyError> {
    let idx = xlate::key_index(hca, key);
    let Some(mut w) = window(hca, idx) else {
        return Err(KeyError::BadKey);
    };
    let Some(b) = w.bound else {
        return Err(KeyError::BadKey);
    };
    if b.key != key || !w.type2 || !w.en_inv {
        return Err(KeyError::BadKey);
    }
    if w.pd != pd {
        return Err(KeyError::Pd);
    }
    if remote && b.qpn != Some(qpn) {
        return Err(KeyError::Qp);
    }
    if commit {
        w.bound = None;
        hca.engine.mws.insert(idx, w);
        write_back(hca, idx, Some(b), None);
    }
    Ok(())
}

/// LOCAL_INVAL on an RC/UC QP.
pub(super) fn local_inval(hca: &mut Hca, q: &QpEng, wqe: &[u8]) -> Outcome {
    if wqe.len() < 16 + 32 {
        return Outcome::Fail(Syndrome::LocalQpOp);
    }
    let key = get32(wqe, 16 + 8);
    match invalidate(hca, key, q.qpn, q.pd, false, true) {
        Ok(()) => Outcome::Done { byte_cnt: 0 },
        Err(_) => Outcome::Fail(Syndrome::MwBind),
    }
}
