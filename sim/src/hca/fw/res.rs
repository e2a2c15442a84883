//! Resource-ownership commands: SW2HW/HW2SW/QUERY for EQs, CQs, MPTs and
//! SRQs, MAP_EQ, MODIFY_CQ, WRITE_MTT and ARM_SRQ; memory-window binding,
//! READ_MTT, SYNC_TPT and XRC checks are not modelled.
//!
//! SW2HW copies the mailbox context into its ICM slot (which must be mapped)
//! after checking it; HW2SW hands it back from ICM. Buffers named by a context
//! are resolved through MTT entries read from ICM, each of which must be
//! present. CQ and EQ buffers get every entry's owner bit set (hardware
//! owned) at SW2HW.

use super::{CmdResult, Outcome, need};
use crate::hca::ctx::{self, CqCtx, ENTRY_32, EqCtx, MptEntry, SrqCtx, cqc, eqc, mpt};
use crate::hca::device::{CqState, FwState, Hca, MptState, QpState, SrqState};
use crate::hca::eq::EqState;
use crate::hca::hcr::{Command, Status};
use crate::hca::icm::Table;
use crate::hca::layout::{get64, put8};
use crate::hca::regs;

/// Reads the context mailbox.
fn ctx_in(hca: &mut Hca, cmd: &Command, len: usize) -> Result<Vec<u8>, Status> {
    hca.read_mailbox(cmd.in_param, len)
}

/// HW2SW/QUERY output: the context as it sits in ICM.
fn ctx_out(hca: &mut Hca, cmd: &Command, va: u64, len: usize) -> Result<(), Status> {
    let mut b = vec![0u8; len];
    hca.icm_read(va, &mut b)?;
    hca.write_mailbox(cmd.out_param, &b)
}

/// The object number an input modifier names (bits 23:0); a set bit in
/// 31:24 is a reserved-bit violation (BAD_PARAM), never silently masked.
pub(crate) fn index(hca: &mut Hca, cmd: &Command) -> Result<u32, Status> {
    if cmd.in_mod >> 24 != 0 {
        hca.violation(format!(
            "{}: input modifier {:#010x} has reserved bits 31:24 set (the object number is 23:0)",
            cmd.opcode, cmd.in_mod
        ));
        return Err(Status::BAD_PARAM);
    }
    Ok(cmd.in_mod)
}

/// HW2SW_* opcode modifier: 0 returns the context in the output mailbox, 1
/// returns nothing (Linux `mlx4_HW2SW_*` with a NULL mailbox); anything else
/// is BAD_OP.
fn hw2sw_mailbox(cmd: &Command) -> Result<bool, Status> {
    match cmd.op_mod {
        0 => Ok(true),
        1 => Ok(false),
        _ => Err(Status::BAD_OP),
    }
}

/// Records and refuses (BAD_PARAM) a context with a reserved bit set.
fn reserved_ctx(
    hca: &mut Hca,
    cmd: &Command,
    n: u32,
    b: &[u8],
    masks: &[(usize, u32)],
) -> Result<(), Status> {
    match ctx::reserved_bits(b, masks) {
        None => Ok(()),
        Some((off, bad)) => {
            hca.violation(format!(
                "{} {n:#x}: context dword {off:#04x} has reserved bits {bad:#010x} set",
                cmd.opcode
            ));
            Err(Status::BAD_PARAM)
        }
    }
}

// ------------------------------------------------------------------ EQ

/// SW2HW_EQ: in_mod = EQN.
pub fn sw2hw_eq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    let eqn = index(hca, cmd)?;
    let va = hca.ctx_va(Table::Eqc, u64::from(eqn))?;
    if eqn < u32::from(hca.caps().rsvd_eqs) {
        return Err(Status::BAD_RESOURCE);
    }
    if hca.eqs.contains_key(&eqn) {
        return Err(Status::BAD_RES_STATE);
    }
    hca.ctx_va(Table::Cmpt(3), u64::from(eqn))?;
    let mut b = ctx_in(hca, cmd, eqc::SIZE)?;
    reserved_ctx(hca, cmd, eqn, &b, eqc::RESERVED)?;
    let c = EqCtx::decode(&b);
    if c.ec {
        hca.violation(format!(
            "SW2HW_EQ {eqn}: event coalescing requested; not modelled (neither Linux nor iPXE sets it)"
        ));
        return Err(Status::BAD_PARAM);
    }
    if c.status != 0
        || !matches!(c.st, eqc::ST_ARMED | eqc::ST_FIRED | eqc::ST_ALWAYS_ARMED)
        || c.log_eq_size > hca.caps().log_max_eq_sz
        || c.intr >= 128
    {
        return Err(Status::BAD_PARAM);
    }
    let page_size = 4096u64 << c.log_page_size.min(20);
    if u64::from(c.page_offset) >= page_size {
        return Err(Status::BAD_PARAM);
    }
    let nent = 1u32 << c.log_eq_size;
    let bytes = u64::from(c.page_offset) + u64::from(nent) * ENTRY_32 as u64;
    let pages = hca.mtt_pages(c.mtt_base, c.log_page_size, bytes)?;
    let eq = EqState {
        nent,
        pages,
        page_size,
        page_offset: u64::from(c.page_offset),
        prod: c.prod_index,
        cons: c.cons_index,
        armed: matches!(c.st, eqc::ST_ARMED | eqc::ST_ALWAYS_ARMED),
        interrupts: 0,
        doorbells: 0,
        overrun: false,
        intr: c.intr,
        oi: c.oi,
    };
    hca.eq_init_owner_bits(&eq)?;
    put8(&mut b, eqc::FLAGS, 0); // status OK
    hca.icm_write(va, &b)?;
    // A stale doorbell in the slot is not this EQ's.
    hca.bar2.set_raw(regs::eq_doorbell(eqn), 0);
    hca.eqs.insert(eqn, eq);
    Ok(Outcome::OK)
}

fn owned_eq(hca: &mut Hca, cmd: &Command) -> Result<(u32, u64), Status> {
    need(hca, &[FwState::Initialized])?;
    let eqn = index(hca, cmd)?;
    let g = hca.geo()?;
    if g.count(Table::Eqc).is_some_and(|n| u64::from(eqn) >= n) {
        return Err(Status::BAD_INDEX);
    }
    if !hca.eqs.contains_key(&eqn) {
        return Err(Status::BAD_RES_STATE);
    }
    Ok((eqn, g.va(Table::Eqc, u64::from(eqn))))
}

/// HW2SW_EQ: refused while a CQ still reports to the EQ. Async event types
/// still mapped to it (a teardown that skipped MAP_EQ with the unmap bit, or
/// sent it with a wrong modifier) are a recorded violation: Linux
/// (`mlx4_cleanup_eq_table`) and iPXE (`hermon_destroy_eq`, "HCA may die")
/// both unmap first. The command still succeeds (no source shows the card
/// refusing it) and the mappings go with the EQ.
pub fn hw2sw_eq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let (eqn, va) = owned_eq(hca, cmd)?;
    let with_mailbox = hw2sw_mailbox(cmd)?;
    if hca.cqs.values().any(|c| c.eqn == eqn) {
        return Err(Status::RESOURCE_BUSY);
    }
    if with_mailbox {
        ctx_out(hca, cmd, va, eqc::SIZE)?;
    }
    let still = hca.mapped_async_events(Some(eqn));
    if !still.is_empty() {
        hca.violation(format!(
            "HW2SW_EQ {eqn} while async events {} are still mapped to it (MAP_EQ with the unmap bit, in_mod bit 31, not done)",
            crate::hca::eq::event_list(&still)
        ));
    }
    hca.eqs.remove(&eqn);
    for m in hca.async_map.iter_mut() {
        if *m == Some(eqn) {
            *m = None;
        }
    }
    Ok(Outcome::OK)
}

/// QUERY_EQ.
pub fn query_eq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let (_, va) = owned_eq(hca, cmd)?;
    ctx_out(hca, cmd, va, eqc::SIZE)?;
    Ok(Outcome::OK)
}

/// MAP_EQ: in_param = event mask, in_mod = EQN | unmap << 31 (Linux
/// `mlx4_MAP_EQ`, iPXE `HERMON_UNMAP_EQ`); bits 30:24 are reserved.
pub fn map_eq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    let unmap = cmd.in_mod >> 31 != 0;
    if cmd.in_mod & 0x7f00_0000 != 0 {
        hca.violation(format!(
            "MAP_EQ input modifier {:#010x}: reserved bits 30:24 set (unmap is bit 31, the EQN 23:0)",
            cmd.in_mod
        ));
        return Err(Status::BAD_PARAM);
    }
    let eqn = cmd.in_mod & 0xff_ffff;
    if hca
        .geo()?
        .count(Table::Eqc)
        .is_some_and(|n| u64::from(eqn) >= n)
    {
        return Err(Status::BAD_INDEX);
    }
    if !hca.eqs.contains_key(&eqn) {
        return Err(Status::BAD_RES_STATE);
    }
    for bit in 0..64 {
        if cmd.in_param >> bit & 1 == 0 {
            continue;
        }
        let slot = &mut hca.async_map[bit];
        if unmap {
            if *slot == Some(eqn) {
                *slot = None;
            }
        } else {
            *slot = Some(eqn);
        }
    }
    Ok(Outcome::OK)
}

// ------------------------------------------------------------------ CQ

/// SW2HW_CQ: in_mod = CQN; the completion EQ must be in hardware ownership.
pub fn sw2hw_cq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    let cqn = index(hca, cmd)?;
    let va = hca.ctx_va(Table::Cqc, u64::from(cqn))?;
    if cqn < hca.caps().rsvd_cqs() {
        return Err(Status::BAD_RESOURCE);
    }
    if hca.cqs.contains_key(&cqn) {
        return Err(Status::BAD_RES_STATE);
    }
    hca.ctx_va(Table::Cmpt(2), u64::from(cqn))?;
    let b = ctx_in(hca, cmd, cqc::SIZE)?;
    reserved_ctx(hca, cmd, cqn, &b, cqc::RESERVED)?;
    let c = CqCtx::decode(&b);
    let caps = hca.caps();
    if c.log_size > caps.log_max_cq_sz
        || c.usr_page >= caps.num_uars()
        || c.usr_page < u32::from(caps.rsvd_uars)
        || c.flags >> 28 != 0
        || !c.db_rec_addr.is_multiple_of(8)
    {
        return Err(Status::BAD_PARAM);
    }
    if !hca.eqs.contains_key(&c.comp_eqn) {
        hca.violation(format!(
            "SW2HW_CQ {cqn:#x}: completion EQ {} is not in hardware ownership",
            c.comp_eqn
        ));
        return Err(Status::BAD_RES_STATE);
    }
    let page_size = 4096u64 << c.log_page_size.min(20);
    if u64::from(c.page_offset) >= page_size {
        return Err(Status::BAD_PARAM);
    }
    let nent = 1u32 << c.log_size;
    let bytes = u64::from(c.page_offset) + u64::from(nent) * ENTRY_32 as u64;
    let pages = hca.mtt_pages(c.mtt_base, c.log_page_size, bytes)?;
    let mut db = [0u8; 8];
    hca.dma_read(c.db_rec_addr, &mut db)?;
    for i in 0..u64::from(nent) {
        let off = u64::from(c.page_offset) + i * ENTRY_32 as u64;
        let pa = pages[(off / page_size) as usize] + off % page_size;
        hca.dma_write(pa + ENTRY_32 as u64 - 1, &[ctx::eqe::OWNER_BIT])?;
    }
    hca.icm_write(va, &b)?;
    hca.cqs.insert(
        cqn,
        CqState {
            nent,
            eqn: c.comp_eqn,
            uar: c.usr_page,
            arms: 0,
        },
    );
    crate::hca::engine::cq_changed(hca, cqn, false);
    Ok(Outcome::OK)
}

/// MODIFY_CQ: op_mod 0 resizes (new size, page size and MTT; the UAR and
/// EQ stay), op_mod 1 sets moderation (count and period). With no CQ engine
/// yet nothing is outstanding, so BAD_SIZE cannot arise.
pub fn modify_cq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let cqn = index(hca, cmd)?;
    let (cq, va) = owned(hca, Table::Cqc, cqn, |h| h.cqs.get(&cqn).copied())?;
    let b = ctx_in(hca, cmd, cqc::SIZE)?;
    let mut cur = vec![0u8; cqc::SIZE];
    hca.icm_read(va, &mut cur)?;
    match cmd.op_mod {
        1 => cur[cqc::CQ_PERIOD..cqc::CQ_PERIOD + 4]
            .copy_from_slice(&b[cqc::CQ_PERIOD..cqc::CQ_PERIOD + 4]),
        0 => {
            let c = CqCtx::decode(&b);
            if c.log_size > hca.caps().log_max_cq_sz {
                return Err(Status::BAD_PARAM);
            }
            let page_size = 4096u64 << c.log_page_size.min(20);
            let nent = 1u32 << c.log_size;
            let pages = hca.mtt_pages(c.mtt_base, c.log_page_size, u64::from(nent) * 32)?;
            for i in 0..u64::from(nent) {
                let off = i * ENTRY_32 as u64;
                let pa = pages[(off / page_size) as usize] + off % page_size;
                hca.dma_write(pa + ENTRY_32 as u64 - 1, &[ctx::eqe::OWNER_BIT])?;
            }
            let ls = u32::from(c.log_size) << 24 | cq.uar;
            cur[cqc::LOGSIZE_USRPAGE..cqc::LOGSIZE_USRPAGE + 4].copy_from_slice(&ls.to_be_bytes());
            cur[cqc::LOG_PAGE_SIZE] = b[cqc::LOG_PAGE_SIZE];
            cur[cqc::MTT_ADDR_H..cqc::MTT_ADDR_L + 4]
                .copy_from_slice(&b[cqc::MTT_ADDR_H..cqc::MTT_ADDR_L + 4]);
            if let Some(x) = hca.cqs.get_mut(&cqn) {
                x.nent = nent;
            }
        }
        _ => return Err(Status::BAD_OP),
    }
    hca.icm_write(va, &cur)?;
    if cmd.op_mod == 0 {
        crate::hca::engine::cq_changed(hca, cqn, true);
    }
    Ok(Outcome::OK)
}

fn owned<T>(
    hca: &mut Hca,
    t: Table,
    idx: u32,
    present: impl Fn(&Hca) -> Option<T>,
) -> Result<(T, u64), Status> {
    need(hca, &[FwState::Initialized])?;
    let g = hca.geo()?;
    if g.count(t).is_some_and(|n| u64::from(idx) >= n) {
        return Err(Status::BAD_INDEX);
    }
    let v = present(hca).ok_or(Status::BAD_RES_STATE)?;
    Ok((v, g.va(t, u64::from(idx))))
}

/// PDs below QUERY_DEV_CAP's reserved count belong to the firmware (Linux
/// and iPXE start their PD allocators above them): BAD_RESOURCE, recorded.
pub(crate) fn pd_check(hca: &mut Hca, cmd: &Command, n: u32, pd: u32) -> Result<(), Status> {
    let rsvd = u32::from(hca.caps().rsvd_pds);
    if pd < rsvd {
        hca.violation(format!(
            "{} {n:#x}: PD {pd} is one of the {rsvd} firmware-reserved PDs",
            cmd.opcode
        ));
        return Err(Status::BAD_RESOURCE);
    }
    Ok(())
}

fn qp_uses(hca: &Hca, f: impl Fn(&crate::hca::device::QpRt) -> bool) -> bool {
    hca.qps.values().any(|q| q.state != QpState::Rst && f(q))
}

/// HW2SW_CQ: refused while a live QP uses the CQ; op_mod 1 = no mailbox.
pub fn hw2sw_cq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let cqn = index(hca, cmd)?;
    let (_, va) = owned(hca, Table::Cqc, cqn, |h| h.cqs.get(&cqn).copied())?;
    let with_mailbox = hw2sw_mailbox(cmd)?;
    if qp_uses(hca, |q| q.scq == cqn || q.rcq == cqn) {
        return Err(Status::RESOURCE_BUSY);
    }
    if with_mailbox {
        ctx_out(hca, cmd, va, cqc::SIZE)?;
    }
    hca.cqs.remove(&cqn);
    crate::hca::engine::cq_changed(hca, cqn, false);
    Ok(Outcome::OK)
}

/// QUERY_CQ.
pub fn query_cq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let cqn = index(hca, cmd)?;
    let (_, va) = owned(hca, Table::Cqc, cqn, |h| h.cqs.get(&cqn).copied())?;
    ctx_out(hca, cmd, va, cqc::SIZE)?;
    Ok(Outcome::OK)
}

// ------------------------------------------------------------------ MPT

/// SW2HW_MPT: in_mod = MPT index; the key field (hardware-index form) must
/// name the same index.
pub fn sw2hw_mpt(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    let idx = index(hca, cmd)?;
    let va = hca.ctx_va(Table::Dmpt, u64::from(idx))?;
    if idx < hca.caps().rsvd_mrws() {
        return Err(Status::BAD_RESOURCE);
    }
    if hca.mpts.contains_key(&idx) {
        return Err(Status::BAD_RES_STATE);
    }
    let mut b = ctx_in(hca, cmd, mpt::SIZE)?;
    reserved_ctx(hca, cmd, idx, &b, mpt::RESERVED)?;
    let m = MptEntry::decode(&b);
    let nmpt = hca.geo()?.count(Table::Dmpt).unwrap_or(1) as u32;
    let status = m.status();
    let region = m.flags & mpt::FLAG_REGION != 0;
    // Regions come as "SW owns" (0xF) or, fast-register, "free" (0x3) and
    // must allow local read; windows (Linux mlx4_mw_enable) come with status
    // 0 (type 1) or free (type 2) and no access bits.
    let status_ok = if region {
        status == mpt::STATUS_SW || status == mpt::STATUS_FREE
    } else {
        status == 0 || status == mpt::STATUS_FREE
    };
    if !status_ok
        || m.key & (nmpt - 1) != idx
        || (region && m.flags & mpt::FLAG_LR == 0)
        || m.lkey != 0
        || u64::from(m.pd) >= crate::hca::layout::pow2(hca.caps().log_max_pd)
    {
        return Err(Status::BAD_PARAM);
    }
    pd_check(hca, cmd, idx, m.pd)?;
    let physical = m.flags & mpt::FLAG_PHYSICAL != 0;
    let free = status == mpt::STATUS_FREE;
    if !region {
        // A window has no translation of its own.
    } else if free {
        // Fast-register MR: the MTT range must be mapped ICM.
        let g = hca.geo()?;
        let va_mtt = g.va(Table::Mtt, m.mtt_addr / 8);
        hca.mtt_reserved_check(
            m.mtt_addr / 8,
            u64::from(m.mtt_sz.max(1)),
            "SW2HW_MPT (fast register)",
        )?;
        if !m.mtt_addr.is_multiple_of(8)
            || !hca.icm.is_mapped(va_mtt, u64::from(m.mtt_sz.max(1)) * 8)
        {
            return Err(Status::ICM_ERROR);
        }
    } else if !physical && m.length > 0 {
        if !(12..=32).contains(&m.entity_size) {
            return Err(Status::BAD_PARAM);
        }
        let page = 1u64 << m.entity_size;
        let bytes = (m.start % page).saturating_add(m.length);
        hca.mtt_pages(m.mtt_addr, (m.entity_size - 12) as u8, bytes)?;
    }
    b[0] &= 0x0f; // status: hardware owned
    hca.icm_write(va, &b)?;
    hca.mpts.insert(
        idx,
        MptState {
            pd: m.pd,
            physical,
            free,
        },
    );
    crate::hca::engine::xlate::forget_mpt(hca, idx);
    Ok(Outcome::OK)
}

/// HW2SW_MPT: op_mod 1 = no mailbox.
pub fn hw2sw_mpt(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let idx = index(hca, cmd)?;
    let (_, va) = owned(hca, Table::Dmpt, idx, |h| h.mpts.get(&idx).copied())?;
    // A region with memory windows bound to it stays with the hardware:
    // REG_BOUND (sources in engine::mw).
    if crate::hca::engine::mw::windows_on(hca, idx) > 0 {
        return Err(Status::REG_BOUND);
    }
    if hw2sw_mailbox(cmd)? {
        ctx_out(hca, cmd, va, mpt::SIZE)?;
    }
    hca.mpts.remove(&idx);
    crate::hca::engine::xlate::forget_mpt(hca, idx);
    Ok(Outcome::OK)
}

/// QUERY_MPT.
pub fn query_mpt(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let idx = index(hca, cmd)?;
    let (_, va) = owned(hca, Table::Dmpt, idx, |h| h.mpts.get(&idx).copied())?;
    ctx_out(hca, cmd, va, mpt::SIZE)?;
    Ok(Outcome::OK)
}

/// Most MTT entries one WRITE_MTT mailbox carries ((4096 - 16) / 8).
pub const MAX_WRITE_MTT: u32 = 510;

/// WRITE_MTT (PF semantics): in_mod = count; mailbox = BE64 first index,
/// 8 reserved bytes, then the entries, written into the MTT table in ICM.
pub fn write_mtt(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    let n = cmd.in_mod;
    if n == 0 || n > MAX_WRITE_MTT {
        return Err(Status::BAD_PARAM);
    }
    let b = hca.read_mailbox(cmd.in_param, 16 + n as usize * 8)?;
    let first = get64(&b, 0);
    if get64(&b, 8) != 0 {
        hca.violation(format!(
            "WRITE_MTT: reserved mailbox bytes 8..16 are {:#018x}, not zero",
            get64(&b, 8)
        ));
        return Err(Status::BAD_PARAM);
    }
    hca.mtt_reserved_check(first, u64::from(n), "WRITE_MTT")?;
    if first
        .checked_add(u64::from(n))
        .is_none_or(|e| e > crate::hca::layout::pow2(hca.caps().log_max_mtts))
    {
        return Err(Status::BAD_INDEX);
    }
    let g = hca.geo()?;
    let va = g.va(Table::Mtt, first);
    if !hca.icm.is_mapped(va, u64::from(n) * 8) {
        hca.violation(format!("WRITE_MTT {first:#x}+{n}: MTT ICM not mapped"));
        return Err(Status::ICM_ERROR);
    }
    hca.icm_write(va, &b[16..])?;
    crate::hca::engine::xlate::forget_mtts(hca);
    Ok(Outcome::OK)
}

// ------------------------------------------------------------------ SRQ

/// SW2HW_SRQ: in_mod = SRQN (also in the context).
pub fn sw2hw_srq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[FwState::Initialized])?;
    let srqn = index(hca, cmd)?;
    let va = hca.ctx_va(Table::Srqc, u64::from(srqn))?;
    if srqn < hca.caps().rsvd_srqs() {
        return Err(Status::BAD_RESOURCE);
    }
    if hca.srqs.contains_key(&srqn) {
        return Err(Status::BAD_RES_STATE);
    }
    hca.ctx_va(Table::Cmpt(1), u64::from(srqn))?;
    let b = ctx_in(hca, cmd, ctx::srqc::SIZE)?;
    reserved_ctx(hca, cmd, srqn, &b, ctx::srqc::RESERVED)?;
    let s = SrqCtx::decode(&b);
    if s.srqn != srqn
        || s.log_size > hca.caps().log_max_srq_sz
        || u64::from(s.pd) >= crate::hca::layout::pow2(hca.caps().log_max_pd)
        || !s.db_rec_addr.is_multiple_of(4)
    {
        return Err(Status::BAD_PARAM);
    }
    pd_check(hca, cmd, srqn, s.pd)?;
    let bytes = (1u64 << s.log_size) << (s.log_stride + 4);
    hca.mtt_pages(s.mtt_base, s.log_page_size, bytes)?;
    let mut db = [0u8; 4];
    hca.dma_read(s.db_rec_addr, &mut db)?;
    hca.icm_write(va, &b)?;
    hca.srqs.insert(
        srqn,
        SrqState {
            pd: s.pd,
            log_size: s.log_size,
            limit: 0,
        },
    );
    crate::hca::engine::srq_changed(hca, srqn);
    Ok(Outcome::OK)
}

/// HW2SW_SRQ: refused while a live QP uses the SRQ; op_mod 1 = no mailbox.
pub fn hw2sw_srq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let srqn = index(hca, cmd)?;
    let (_, va) = owned(hca, Table::Srqc, srqn, |h| h.srqs.get(&srqn).copied())?;
    let with_mailbox = hw2sw_mailbox(cmd)?;
    if qp_uses(hca, |q| q.srq == Some(srqn)) {
        return Err(Status::RESOURCE_BUSY);
    }
    if with_mailbox {
        ctx_out(hca, cmd, va, ctx::srqc::SIZE)?;
    }
    hca.srqs.remove(&srqn);
    crate::hca::engine::srq_changed(hca, srqn);
    Ok(Outcome::OK)
}

/// QUERY_SRQ.
pub fn query_srq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let srqn = index(hca, cmd)?;
    let (_, va) = owned(hca, Table::Srqc, srqn, |h| h.srqs.get(&srqn).copied())?;
    ctx_out(hca, cmd, va, ctx::srqc::SIZE)?;
    Ok(Outcome::OK)
}

/// ARM_SRQ: in_param = limit watermark (below the SRQ size). The watermark
/// lands in the context in ICM too (BE16 at 0x1c), where QUERY_SRQ reports
/// it (Linux `mlx4_srq_query` reads `limit_watermark` there).
pub fn arm_srq(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let srqn = index(hca, cmd)?;
    let (s, va) = owned(hca, Table::Srqc, srqn, |h| h.srqs.get(&srqn).copied())?;
    if cmd.in_param >= 1u64 << s.log_size {
        return Err(Status::BAD_PARAM);
    }
    let limit = cmd.in_param as u16;
    hca.icm_write(va + ctx::srqc::LIMIT_WATERMARK as u64, &limit.to_be_bytes())?;
    if let Some(x) = hca.srqs.get_mut(&srqn) {
        x.limit = cmd.in_param as u16;
    }
    Ok(Outcome::OK)
}
