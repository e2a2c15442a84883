//! Bring-up and configuration commands.
//!
//! Firmware load (QUERY_FW, MAP_FA, RUN_FW, UNMAP_FA), capability queries, ICM
//! sizing and mapping, INIT_HCA / CLOSE_HCA / QUERY_HCA and NOP; firmware burning,
//! DDR and LAM commands are not modelled.

use super::{CmdResult, Outcome, need};
use crate::hca::device::{FwState, Hca};
use crate::hca::faults::BadCap;
use crate::hca::hcr::{Command, Status};
use crate::hca::icm::{self, Geometry, Table};
use crate::hca::layout::{
    self, InitHca, PageEntry, dev_cap, init_hca, mod_stat_cfg, put8, put16, put64,
};

use FwState::*;

/// Writes an output mailbox.
fn out(hca: &mut Hca, cmd: &Command, bytes: &[u8]) -> CmdResult {
    hca.write_mailbox(cmd.out_param, bytes)?;
    Ok(Outcome::OK)
}

/// QUERY_FW: always allowed.
pub fn query_fw(hca: &mut Hca, cmd: &Command) -> CmdResult {
    let b = hca.fw_info().encode();
    out(hca, cmd, &b)
}

/// Reads and checks a page list of `in_mod` entries (1..=256): bits 11:6
/// of each address dword are reserved, and MAP_FA / MAP_ICM_AUX entries
/// carry no virtual address (Linux `mlx4_map_cmd` with `virt == -1` and iPXE
/// `hermon_map_vpm` with va 0 leave it zero).
fn page_list(hca: &mut Hca, cmd: &Command) -> Result<Vec<PageEntry>, Status> {
    let n = cmd.in_mod;
    if n == 0 || n > icm::MAX_ENTRIES {
        return Err(Status::BAD_PARAM);
    }
    let b = hca.read_mailbox(cmd.in_param, n as usize * 16)?;
    let virt = cmd.opcode == crate::hca::hcr::Opcode::MAP_ICM;
    for i in 0..n as usize {
        let (va, pa) = (layout::get64(&b, i * 16), layout::get64(&b, i * 16 + 8));
        if pa & 0xfc0 != 0 || (!virt && va != 0) {
            hca.violation(format!(
                "{} entry {i}: reserved bits set (va {va:#x}, pa|log_size {pa:#x})",
                cmd.opcode
            ));
            return Err(Status::BAD_PARAM);
        }
    }
    Ok((0..n as usize).map(|i| PageEntry::decode(&b, i)).collect())
}

/// Total 4 KiB pages a page list names, refused (ICM_ERROR) if `already`
/// plus them would pass [`icm::MAX_MAPPED_PAGES`]; checked before anything
/// is expanded.
fn total_pages(entries: &[PageEntry], already: usize) -> Result<usize, Status> {
    let mut n = already;
    for e in entries {
        if e.log_size > 20 {
            return Err(Status::BAD_PARAM);
        }
        n += 1usize << e.log_size;
        if n > icm::MAX_MAPPED_PAGES {
            return Err(Status::ICM_ERROR);
        }
    }
    Ok(n - already)
}

/// The 4 KiB pages of a FA/aux page list.
fn expand(entries: &[PageEntry], already: usize) -> Result<Vec<u64>, Status> {
    let mut pages = Vec::with_capacity(total_pages(entries, already)?);
    for e in entries {
        pages.extend(icm::chunk_pages(e)?);
    }
    Ok(pages)
}

/// MAP_FA: pages for the firmware area, before RUN_FW.
pub fn map_fa(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[Off])?;
    let entries = page_list(hca, cmd)?;
    let pages = expand(&entries, hca.icm.fa.len())?;
    hca.icm.fa.extend(pages);
    Ok(Outcome::OK)
}

/// UNMAP_FA: gives the firmware area back; the firmware stops.
pub fn unmap_fa(hca: &mut Hca, _cmd: &Command) -> CmdResult {
    need(hca, &[Off, Running])?;
    if !hca.icm.aux.is_empty() {
        return Err(Status::BAD_SYS_STATE);
    }
    hca.icm.fa.clear();
    hca.fw = Off;
    Ok(Outcome::OK)
}

/// RUN_FW: needs `fw_pages` FA pages; "loads" the firmware into them.
pub fn run_fw(hca: &mut Hca, _cmd: &Command) -> CmdResult {
    need(hca, &[Off])?;
    if hca.icm.fa.is_empty() {
        return Err(Status::BAD_SYS_STATE);
    }
    if (hca.icm.fa.len() as u64) < u64::from(hca.cfg.fw_pages) {
        return Err(Status::ICM_ERROR);
    }
    let pages = hca.icm.fa.clone();
    for (i, pa) in pages.iter().enumerate() {
        let mut tag = *b"CX3 FW page ....";
        tag[12..16].copy_from_slice(&(i as u32).to_be_bytes());
        hca.dma_write(*pa, &tag)?;
    }
    hca.fw = Running;
    Ok(Outcome::OK)
}

/// MOD_STAT_CFG: op_mod 0 (Linux's set, at RUN_FW time) where only 4 KiB
/// pages may be set; op_mod 2, the query of one port's static
/// configuration that Linux 6.1's `mlx4_get_phys_port_id` makes at every
/// probe (in_mod = port << 8, the iPXE input modifier's `portnum`; offset
/// and the other fields 0), answered with the block's port and node GUIDs
/// where iPXE's `hermonprm_mod_stat_cfg` has them (the rest of the block,
/// SerDes and Ethernet settings, reads as zero). iPXE's own set/query
/// (op_mod 1/3, with offsets and setup modes) is refused.
pub fn mod_stat_cfg(hca: &mut Hca, cmd: &Command) -> CmdResult {
    if cmd.op_mod == 2 {
        need(hca, &[Running, Initialized])?;
        let port = cmd.in_mod >> 8;
        if cmd.in_mod & !0xff00 != 0 {
            return Err(Status::BAD_PARAM);
        }
        let Some(i) = hca.port_index(port) else {
            return Err(Status::BAD_PARAM);
        };
        let guid = hca.ports[i].guid();
        let node = hca.cfg.node_guid;
        let mut b = vec![0u8; mod_stat_cfg::QUERY_LEN];
        layout::put32(&mut b, mod_stat_cfg::GUID_HI, (guid >> 32) as u32);
        layout::put32(&mut b, mod_stat_cfg::GUID_LO, guid as u32);
        layout::put32(&mut b, mod_stat_cfg::NODEGUID_HI, (node >> 32) as u32);
        layout::put32(&mut b, mod_stat_cfg::NODEGUID_LO, node as u32);
        return out(hca, cmd, &b);
    }
    need(hca, &[Running])?;
    if cmd.op_mod != 0 {
        return Err(Status::BAD_OP);
    }
    let b = hca.read_mailbox(cmd.in_param, 0x100)?;
    if layout::get8(&b, mod_stat_cfg::PG_SZ_M) & !1 != 0 {
        return Err(Status::BAD_PARAM);
    }
    if layout::get8(&b, mod_stat_cfg::PG_SZ_M) & 1 != 0
        && layout::get8(&b, mod_stat_cfg::PG_SZ) != 0
    {
        return Err(Status::BAD_PARAM);
    }
    hca.stat_cfg = true;
    Ok(Outcome::OK)
}

/// QUERY_DEV_CAP, with any armed absurd values applied.
pub fn query_dev_cap(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[Running, Initialized])?;
    let mut b = hca.caps().encode();
    for bad in hca.faults.bad_caps.clone() {
        match bad {
            BadCap::HugeLogMaxQps => put8(&mut b, dev_cap::MAX_QP, 0x1f),
            BadCap::NoPorts => put8(&mut b, dev_cap::NUM_PORTS, 0),
            BadCap::MinPageTooLarge => put8(&mut b, dev_cap::PAGE_SZ, 16),
            BadCap::ZeroQpcEntrySize => put16(&mut b, dev_cap::QPC_ENTRY_SZ, 0),
            BadCap::HugeUarSize => put8(&mut b, dev_cap::UAR_SZ, 20),
            BadCap::Byte { offset, value } => put8(&mut b, offset, value),
        }
    }
    out(hca, cmd, &b)
}

/// QUERY_ADAPTER.
pub fn query_adapter(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[Running, Initialized])?;
    let b = layout::encode_query_adapter(hca.cfg.inta_pin, &hca.cfg.board_id);
    out(hca, cmd, &b)
}

/// SET_ICM_SIZE: in_param = bytes; returns the aux pages needed.
pub fn set_icm_size(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[Running])?;
    let size = cmd.in_param;
    if size == 0 || !size.is_multiple_of(icm::ICM_PAGE) {
        return Err(Status::BAD_PARAM);
    }
    if size > hca.caps().max_icm_sz {
        return Err(Status::EXCEED_LIM);
    }
    if !hca.icm.aux.is_empty() {
        return Err(Status::BAD_SYS_STATE);
    }
    hca.icm.size = Some(size);
    Ok(Outcome::imm(icm::aux_pages_for(size)))
}

/// MAP_ICM_AUX.
pub fn map_icm_aux(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[Running])?;
    if hca.icm.size.is_none() {
        return Err(Status::BAD_SYS_STATE);
    }
    let entries = page_list(hca, cmd)?;
    let pages = expand(&entries, hca.icm.aux.len())?;
    hca.icm.aux.extend(pages);
    Ok(Outcome::OK)
}

/// UNMAP_ICM_AUX: only before INIT_HCA (or after CLOSE_HCA).
pub fn unmap_icm_aux(hca: &mut Hca, _cmd: &Command) -> CmdResult {
    need(hca, &[Running])?;
    if hca.icm.mapped_pages() != 0 {
        let n = hca.icm.mapped_pages();
        hca.violation(format!("UNMAP_ICM_AUX with {n} ICM pages still mapped"));
        hca.icm.clear_map();
    }
    hca.icm.aux.clear();
    Ok(Outcome::OK)
}

/// MAP_ICM: every entry is checked before any is mapped.
pub fn map_icm(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[Running, Initialized])?;
    if hca.icm.size.is_none() {
        return Err(Status::BAD_SYS_STATE);
    }
    // The firmware keeps its ICM page tables in the aux pages:
    // ICM_ERROR is "error in ICM mapping (e.g. not enough auxiliary pages)".
    let (have, need_aux) = (hca.icm.aux.len() as u64, hca.icm.aux_needed());
    if have < need_aux {
        hca.violation(format!(
            "MAP_ICM with {have} of the {need_aux} aux pages SET_ICM_SIZE asked for mapped"
        ));
        return Err(Status::ICM_ERROR);
    }
    let entries = page_list(hca, cmd)?;
    total_pages(&entries, hca.icm.mapped_pages())?;
    let mut checked = Vec::new();
    for e in &entries {
        let pages = hca.icm.check_map(e)?;
        if checked.iter().any(|(va, p): &(u64, Vec<u64>)| {
            *va < e.va + e.bytes() && e.va < va + p.len() as u64 * icm::ICM_PAGE
        }) {
            return Err(Status::BAD_PARAM);
        }
        checked.push((e.va, pages));
    }
    for (va, pages) in checked {
        hca.icm.map(va, &pages);
    }
    Ok(Outcome::OK)
}

/// True if a context in hardware ownership lives in `[va, va + len)`.
fn icm_in_use(hca: &Hca, va: u64, len: u64) -> bool {
    let Some(g) = hca.geo else { return false };
    let end = va.saturating_add(len);
    let hit = |t: Table, idx: u32| {
        let a = g.va(t, u64::from(idx));
        a < end && va < a + g.entry_size(t)
    };
    hca.eqs.keys().any(|&n| hit(Table::Eqc, n))
        || hca.cqs.keys().any(|&n| hit(Table::Cqc, n))
        || hca.mpts.keys().any(|&n| hit(Table::Dmpt, n))
        || hca.srqs.keys().any(|&n| hit(Table::Srqc, n))
        || hca.qps.iter().any(|(&n, q)| {
            q.state != crate::hca::device::QpState::Rst && hit(Table::Qpc, hca.qp_index(n) as u32)
        })
}

/// UNMAP_ICM: in_param = ICM address, in_mod = 4 KiB pages. Refused while a
/// hardware-owned context lives there.
pub fn unmap_icm(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[Running, Initialized])?;
    let len = u64::from(cmd.in_mod) * icm::ICM_PAGE;
    if icm_in_use(hca, cmd.in_param, len) {
        return Err(Status::RESOURCE_BUSY);
    }
    hca.icm.unmap(cmd.in_param, cmd.in_mod)?;
    Ok(Outcome::OK)
}

fn ilog2(v: u32) -> u8 {
    31 - v.max(1).leading_zeros() as u8
}

/// Bits of INIT_HCA byte `off` that may be set (iPXE
/// `hermonprm_init_hca_st` and its sub-blocks, plus the Linux-only fields
/// listed in [`crate::hca::layout`]); every other bit of the 0x200 bytes is
/// reserved. The flags dword and the 64-byte-entry dword are checked
/// field by field in [`init_hca_fields`].
fn init_hca_allowed(off: usize) -> u8 {
    match off {
        0x00 => 0xff, // version
        // Linux: (log2 cache line - 4) << 5, and since 3.14 also bit 4.
        0x0e => 0xf0,
        0x8a => 0x0f, // Linux 3.19+: num_sys_eqs (12 bits, 0 unless SYS_EQS)
        0x8b => 0xff,
        0x14..=0x17 | 0x58..=0x5b => 0xff, // flags, 64-byte EQE/CQE
        0x30..=0x37 | 0x48..=0x4f | 0x50..=0x57 | 0x60..=0x67 | 0x70..=0x77 | 0x80..=0x87 => 0xff,
        0x90..=0x96 => 0xff,        // RDMARC base
        0x97 => 0xe7,               // base bits 7:5, log RDMARC per QP 2:0
        0xc0..=0xc7 => 0xff,        // MC base
        0xd3 | 0xd7 | 0xdb => 0x1f, // log MC entry / hash / table size
        0xd8 => 0x08,               // uc_group_steering (mc_hash_fn 0 only)
        0xf0..=0xf7 => 0xff,        // dMPT base
        0xf8 => 0x80,               // Linux: memory windows enable
        0xfa => 0x1f,               // iPXE: pfto
        0xfb => 0x3f,               // log dMPT size
        0x100..=0x10f => 0xff,      // MTT and cMPT bases
        0x12a => 0x0f,              // log max UARs
        0x12b => 0xff,              // UAR page size
        _ => 0,
    }
}

/// The first reserved bit set in an INIT_HCA mailbox, then the flag bits
/// the device cannot honour; `Err` carries the recorded message.
fn init_hca_fields(b: &[u8], c: &crate::hca::layout::DevCap) -> Result<(), String> {
    use crate::hca::layout::cap_flags;
    use init_hca::*;
    if let Some((off, v)) = b
        .iter()
        .enumerate()
        .take(init_hca::LEN)
        .map(|(i, &v)| (i, v & !init_hca_allowed(i)))
        .find(|&(_, v)| v != 0)
    {
        return Err(format!(
            "INIT_HCA byte {off:#05x} has reserved bits {v:#04x} set"
        ));
    }
    let flags = layout::get32(b, FLAGS);
    let mut allowed = FLAG_UD_PORT_CHECK | FLAG_QOS;
    if c.flags & cap_flags::IPOIB_CSUM != 0 {
        allowed |= FLAG_IPOIB_CSUM;
    }
    if c.flags & cap_flags::COUNTERS != 0 {
        allowed |= FLAG_COUNTERS;
    }
    if flags & FLAG_HOST_BE != 0 {
        return Err(format!(
            "INIT_HCA flags {flags:#010x}: host big-endian bit (1) set; the hosts this model serves are little-endian (Linux clears it on x86)"
        ));
    }
    if flags & !allowed != 0 {
        return Err(format!(
            "INIT_HCA flags {flags:#010x}: bits {:#010x} are reserved or name a capability QUERY_DEV_CAP did not report (a byte-swapped flags dword?)",
            flags & !allowed
        ));
    }
    let e = layout::get32(b, EQE_CQE_64);
    if e & !(EQE_64 | CQE_64) != 0 {
        return Err(format!("INIT_HCA dword 0x58 {e:#010x}: reserved bits set"));
    }
    if layout::get8(b, UC_STEERING) != 0
        && c.flags & (cap_flags::VEP_UC_STEER | cap_flags::VEP_MC_STEER) == 0
    {
        return Err(
            "INIT_HCA: unicast steering enabled without the VEP steering capabilities".into(),
        );
    }
    if layout::get8(b, MW_ENABLE) != 0 && c.flags & cap_flags::MEM_WINDOW == 0 {
        return Err("INIT_HCA: memory windows enabled without the capability".into());
    }
    Ok(())
}

/// Checks INIT_HCA parameters against the limits and the ICM size.
fn check_init_hca(hca: &Hca, h: &InitHca) -> Result<Geometry, Status> {
    let c = hca.caps();
    if h.version != init_hca::VERSION_2 {
        return Err(Status::BAD_PARAM);
    }
    if h.eqe_cqe_64 & (init_hca::EQE_64 | init_hca::CQE_64) != 0 {
        return Err(Status::BAD_PARAM);
    }
    if h.log_num_qps > c.log_max_qps
        || h.log_num_srqs > c.log_max_srqs
        || h.log_num_cqs > c.log_max_cqs
        || h.log_num_eqs > c.log_max_eqs
        || h.log_mpt_sz > c.log_max_mpts
        || h.log_rd_per_qp > c.log_max_ra_res_qp
        || h.log_mc_table_sz > c.log_max_mcg + 1
        || h.log_uars > ilog2(c.num_uars())
    {
        return Err(Status::EXCEED_LIM);
    }
    // Every table must hold more than the firmware's reserved entries.
    if h.log_num_qps <= c.log_rsvd_qps
        || h.log_num_cqs <= c.log_rsvd_cqs
        || h.log_num_srqs < c.log_rsvd_srqs
        || h.log_mpt_sz <= c.log_rsvd_mrws
        || layout::pow2(h.log_num_eqs) <= u64::from(c.rsvd_eqs)
        || layout::pow2(h.log_uars) <= u64::from(c.rsvd_uars)
    {
        return Err(Status::BAD_PARAM);
    }
    // An MGM entry holds its control and GID sections (iPXE: "must be
    // greater than 5"); the hash part cannot exceed the table.
    if (h.mc_base != 0 || h.log_mc_table_sz != 0)
        && (h.log_mc_entry_sz <= 5 || h.log_mc_hash_sz > h.log_mc_table_sz)
    {
        return Err(Status::BAD_PARAM);
    }
    if h.uar_page_sz != 0 {
        return Err(Status::BAD_PARAM);
    }
    let size = hca.icm.size.ok_or(Status::BAD_SYS_STATE)?;
    let g = Geometry::new(*h, c);
    let mut spans: Vec<(u64, u64)> = Vec::new();
    let tables = [
        Table::Qpc,
        Table::Auxc,
        Table::Altc,
        Table::Rdmarc,
        Table::Srqc,
        Table::Cqc,
        Table::Eqc,
        Table::Dmpt,
    ];
    for t in tables {
        let es = g.entry_size(t);
        let len = es * g.count(t).unwrap_or(1);
        let base = g.base(t);
        if es == 0 || !base.is_multiple_of(es.min(4096)) {
            return Err(Status::BAD_PARAM);
        }
        spans.push((base, len));
    }
    spans.push((
        g.base(Table::Cmpt(0)),
        4 * (g.entry_size(Table::Cmpt(0)) << 24),
    ));
    // iPXE `hermonprm_qpcbaseaddr_st` / `hermonprm_tptparams_st`: the QPC,
    // SRQC, CQC, dMPT and cMPT tables "must be aligned on [their] size"
    // (Linux's profile gets this for free by placing power-of-two tables in
    // decreasing size order); the others on their entry size (above).
    for t in [
        Table::Qpc,
        Table::Srqc,
        Table::Cqc,
        Table::Dmpt,
        Table::Cmpt(0),
    ] {
        let len = match t {
            Table::Cmpt(_) => 4 * (g.entry_size(t) << 24),
            _ => g.entry_size(t) * g.count(t).unwrap_or(1),
        };
        if len.is_power_of_two() && !g.base(t).is_multiple_of(len) {
            return Err(Status::BAD_PARAM);
        }
    }
    if h.mc_base != 0 || h.log_mc_table_sz != 0 {
        spans.push((h.mc_base, (1u64 << h.log_mc_table_sz) << h.log_mc_entry_sz));
    }
    if !h.mtt_base.is_multiple_of(8) || h.mtt_base >= size {
        return Err(Status::BAD_PARAM);
    }
    for &(b, l) in &spans {
        if b.checked_add(l).is_none_or(|e| e > size) {
            return Err(Status::BAD_PARAM);
        }
    }
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(Status::BAD_PARAM);
    }
    Ok(g)
}

/// INIT_HCA: needs the aux pages SET_ICM_SIZE asked for; once only.
pub fn init_hca(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[Running])?;
    if (hca.icm.aux.len() as u64) < hca.icm.aux_needed() || hca.icm.size.is_none() {
        return Err(Status::ICM_ERROR);
    }
    let b = hca.read_mailbox(cmd.in_param, init_hca::LEN)?;
    if let Err(msg) = init_hca_fields(&b, hca.caps()) {
        hca.violation(msg);
        return Err(Status::BAD_PARAM);
    }
    let h = InitHca::decode(&b);
    let g = check_init_hca(hca, &h)?;
    hca.geo = Some(g);
    hca.init_hca_raw = b;
    hca.fw = Initialized;
    Ok(Outcome::OK)
}

/// CLOSE_HCA (op_mod 0, or 1 = Linux's "panic" teardown): drops every
/// object; ICM mappings stay until UNMAP_ICM. Recorded as violations, the
/// state a correct teardown has already undone (Linux `mlx4_remove_one` and
/// iPXE `hermon_stop`/`hermon_ib_close` both do): objects still in hardware
/// ownership, async events still mapped to an EQ (MAP_EQ without the unmap
/// bit), ports still open (INIT_PORT without CLOSE_PORT, e.g. CLOSE_PORT
/// with a wrong port number). The command itself succeeds: the card tears
/// down regardless.
pub fn close_hca(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[Initialized])?;
    if cmd.op_mod > 1 {
        return Err(Status::BAD_OP);
    }
    let live_qps = hca
        .qps
        .values()
        .filter(|q| q.state != crate::hca::device::QpState::Rst)
        .count();
    let counts = [
        ("EQs", hca.eqs.len()),
        ("CQs", hca.cqs.len()),
        ("MPTs", hca.mpts.len()),
        ("SRQs", hca.srqs.len()),
        ("QPs", live_qps),
    ];
    let left: Vec<String> = counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{n} {what}"))
        .collect();
    if !left.is_empty() {
        hca.violation(format!(
            "CLOSE_HCA with {} still in hardware ownership",
            left.join(", ")
        ));
    }
    let mapped = hca.mapped_async_events(None);
    if !mapped.is_empty() {
        hca.violation(format!(
            "CLOSE_HCA with async events {} still mapped to an EQ (MAP_EQ unmap, in_mod bit 31, not done)",
            crate::hca::eq::event_list(&mapped)
        ));
    }
    let open: Vec<String> = hca
        .ports
        .iter()
        .filter(|p| p.initialized)
        .map(|p| p.num.to_string())
        .collect();
    if !open.is_empty() {
        hca.violation(format!(
            "CLOSE_HCA with port {} still open (INIT_PORT without CLOSE_PORT)",
            open.join(", ")
        ));
    }
    hca.eqs.clear();
    hca.cqs.clear();
    hca.mpts.clear();
    hca.srqs.clear();
    hca.qps.clear();
    hca.async_map = [None; 64];
    hca.special_qp_base = 0;
    for p in &mut hca.ports {
        p.initialized = false;
        p.retrain();
    }
    hca.geo = None;
    hca.fw = Running;
    Ok(Outcome::OK)
}

/// QUERY_HCA: the INIT_HCA parameters plus the core clock.
pub fn query_hca(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[Initialized])?;
    let mut b = hca.init_hca_raw.clone();
    b.resize(init_hca::LEN, 0);
    put64(&mut b, 0x04, 0);
    put16(&mut b, init_hca::CORE_CLOCK, hca.cfg.core_clock_mhz);
    out(hca, cmd, &b)
}

/// NOP.
pub fn nop(hca: &mut Hca, _cmd: &Command) -> CmdResult {
    need(hca, &[Running, Initialized])?;
    Ok(Outcome::OK)
}
