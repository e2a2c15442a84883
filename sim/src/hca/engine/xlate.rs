//! Translation and protection: L_Key/R_Key lookup and MTT translation.
//!
//! Translation and protection: L_Key/R_Key lookup in the dMPT (the full
//! key, hardware ownership, region flag, PD, access rights, bounds), MTT
//! translation at the MPT's page size or none for a physical MPT, the
//! reserved L_Key for QPs allowed to use it, and the copy loops that move
//! bytes between translated segments; R_Keys of memory windows go to
//! [`super::mw`]; fast-register MRs in the free state are not modelled (a
//! free MR used as a key fails the key check).

use super::QpEng;
use crate::hca::ctx::{MptEntry, mpt};
use crate::hca::device::Hca;
use crate::hca::icm::Table;

/// Access a key is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Local read (gather).
    LocalRead,
    /// Local write (scatter, READ responses, atomic results).
    LocalWrite,
    /// Remote read (RDMA READ).
    RemoteRead,
    /// Remote write (RDMA WRITE).
    RemoteWrite,
    /// Remote atomic.
    RemoteAtomic,
}

impl Access {
    fn bit(self) -> u32 {
        match self {
            Access::LocalRead => 1 << 10,
            Access::LocalWrite => 1 << 11,
            Access::RemoteRead => 1 << 12,
            Access::RemoteWrite => 1 << 13,
            Access::RemoteAtomic => 1 << 14,
        }
    }
}

/// Why a key check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// No MPT in hardware ownership at the index, or the key bits differ.
    BadKey,
    /// A window or a free fast-register MR.
    NotRegion,
    /// PD of the QP and the MR differ.
    Pd,
    /// The access right is not granted.
    Access,
    /// Outside the region.
    Bounds,
    /// A type 2 window bound to another QP.
    Qp,
}

/// How to turn an address inside a checked region into a bus address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Xl {
    /// Physical: the address is the bus address.
    pub phys: bool,
    /// Page shift of the region.
    pub shift: u8,
    /// First page-aligned address of the region.
    pub base: u64,
    /// MTT index of the region's first page.
    pub mtt: u64,
    /// Added to an address before translation (a zero-based window's
    /// offset into its parent; 0 otherwise).
    pub delta: u64,
}

/// A checked piece of memory (or an inline run: `xl` None, `addr` is the
/// offset in the inline buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seg {
    /// Address (or inline offset).
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Translation; None for inline data.
    pub xl: Option<Xl>,
}

fn nmpt(hca: &mut Hca) -> u64 {
    if hca.engine.nmpt == 0 {
        hca.engine.nmpt = hca
            .geo()
            .ok()
            .and_then(|g| g.count(Table::Dmpt))
            .unwrap_or(1)
            .max(1);
    }
    hca.engine.nmpt
}

pub(super) fn mpt_entry(hca: &mut Hca, idx: u32) -> Option<MptEntry> {
    if let Some(m) = hca.engine.mpts.get(&idx) {
        return Some(*m);
    }
    let va = hca.geo().ok()?.va(Table::Dmpt, u64::from(idx));
    let mut b = [0u8; mpt::SIZE];
    hca.icm_read(va, &mut b).ok()?;
    let m = MptEntry::decode(&b);
    hca.engine.mpts.insert(idx, m);
    Some(m)
}

/// The dMPT index `key` names.
pub(super) fn key_index(hca: &mut Hca, key: u32) -> u32 {
    (key.rotate_left(24) as u64 & (nmpt(hca) - 1)) as u32
}

/// One use of an L_Key or R_Key: the key, the QP it comes with (a type 2
/// window must be bound to it; None: not checked) and that QP's protection
/// domain, what for, and which bytes.
#[derive(Debug, Clone, Copy)]
pub struct KeyUse {
    /// The key.
    pub key: u32,
    /// The QP the access arrives at, if known.
    pub qpn: Option<u32>,
    /// The QP's protection domain.
    pub pd: u32,
    /// What for.
    pub access: Access,
    /// First byte.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

impl KeyUse {
    /// A remote access (`key`, `access`, `len` bytes at `addr`) arriving at
    /// responder QP `d`.
    pub fn remote(d: &QpEng, key: u32, access: Access, addr: u64, len: u64) -> KeyUse {
        KeyUse {
            key,
            qpn: Some(d.qpn),
            pd: d.pd,
            access,
            addr,
            len,
        }
    }
}

/// Checks `key` for `len` bytes at `addr` with `access` on behalf of a QP
/// in protection domain `pd`. `rsvd_ok`: the QP may use the reserved L_Key.
pub fn check(
    hca: &mut Hca,
    key: u32,
    pd: u32,
    access: Access,
    addr: u64,
    len: u64,
    rsvd_ok: bool,
) -> Result<Xl, KeyError> {
    let local = matches!(access, Access::LocalRead | Access::LocalWrite);
    if local && rsvd_ok && key == hca.caps().rsvd_lkey {
        return Ok(Xl {
            phys: true,
            ..Xl::default()
        });
    }
    let u = KeyUse {
        key,
        qpn: None,
        pd,
        access,
        addr,
        len,
    };
    check_qp(hca, u)
}

/// [`check`] for a use `u` that names its QP (a remote access: the
/// reserved L_Key is never taken).
pub fn check_qp(hca: &mut Hca, u: KeyUse) -> Result<Xl, KeyError> {
    let KeyUse {
        key,
        pd,
        access,
        addr,
        len,
        ..
    } = u;
    let idx = (key.rotate_left(24) as u64 & (nmpt(hca) - 1)) as u32;
    let Some(st) = hca.mpts.get(&idx).copied() else {
        return Err(KeyError::BadKey);
    };
    let Some(m) = mpt_entry(hca, idx) else {
        return Err(KeyError::BadKey);
    };
    if m.flags & mpt::FLAG_REGION == 0 {
        // A window: its key changes with every bind.
        return super::mw::check(hca, idx, u);
    }
    if m.key != key.rotate_left(24) {
        return Err(KeyError::BadKey);
    }
    if st.free || m.flags & mpt::FLAG_REGION == 0 {
        return Err(KeyError::NotRegion);
    }
    if m.pd != pd {
        return Err(KeyError::Pd);
    }
    if m.flags & access.bit() == 0 {
        return Err(KeyError::Access);
    }
    let end = addr.checked_add(len).ok_or(KeyError::Bounds)?;
    let mend = m.start.saturating_add(m.length);
    if addr < m.start || end > mend {
        return Err(KeyError::Bounds);
    }
    let phys = m.flags & mpt::FLAG_PHYSICAL != 0;
    let shift = m.entity_size.clamp(12, 32) as u8;
    Ok(Xl {
        phys,
        shift,
        base: m.start & !((1u64 << shift) - 1),
        mtt: m.mtt_addr / 8,
        delta: 0,
    })
}

/// Drops cached MPT `idx` (SW2HW/HW2SW) and the MTT cache.
pub fn forget_mpt(hca: &mut Hca, idx: u32) {
    hca.engine.mpts.remove(&idx);
    super::mw::forget(hca, idx);
    forget_mtts(hca);
}

/// Drops the MTT cache (WRITE_MTT, SW2HW/HW2SW_MPT).
pub fn forget_mtts(hca: &mut Hca) {
    hca.engine.mtt_cache.clear();
}

const MTT_CACHE: usize = 1024;

fn mtt(hca: &mut Hca, index: u64) -> Option<u64> {
    let slot = (index as usize) & (MTT_CACHE - 1);
    if let Some(&(i, pa)) = hca.engine.mtt_cache.get(slot)
        && i == index
    {
        return Some(pa);
    }
    let pa = hca.mtt_lookup(index).ok()?;
    if hca.engine.mtt_cache.len() != MTT_CACHE {
        hca.engine.mtt_cache = vec![(u64::MAX, 0); MTT_CACHE];
    }
    hca.engine.mtt_cache[slot] = (index, pa);
    Some(pa)
}

/// Bus address of `addr` and the bytes left in its page.
fn bus(hca: &mut Hca, xl: &Xl, addr: u64) -> Option<(u64, u64)> {
    let addr = addr.wrapping_add(xl.delta);
    if xl.phys {
        return Some((addr, u64::MAX));
    }
    let page = 1u64 << xl.shift;
    let idx = (addr - xl.base) >> xl.shift;
    let pa = mtt(hca, xl.mtt + idx)?;
    Some((pa + (addr & (page - 1)), page - (addr & (page - 1))))
}

/// A DMA through a translation failed (a fault the card reports as a
/// local protection error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault;

/// Reads `buf.len()` bytes starting `skip` bytes into `segs` (inline runs
/// come from `inline`).
pub fn gather(
    hca: &mut Hca,
    segs: &[Seg],
    inline: &[u8],
    mut skip: u64,
    buf: &mut [u8],
) -> Result<(), Fault> {
    let mut done = 0usize;
    for s in segs {
        if done == buf.len() {
            break;
        }
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        let mut at = s.addr + skip;
        let mut left = (s.len - skip).min((buf.len() - done) as u64);
        skip = 0;
        match s.xl {
            None => {
                let from = usize::try_from(at).map_err(|_| Fault)?;
                let n = left as usize;
                let src = inline.get(from..from + n).ok_or(Fault)?;
                buf[done..done + n].copy_from_slice(src);
                done += n;
            }
            Some(xl) => {
                while left > 0 {
                    let (pa, room) = bus(hca, &xl, at).ok_or(Fault)?;
                    let n = left.min(room) as usize;
                    hca.dma_read(pa, &mut buf[done..done + n])
                        .map_err(|_| Fault)?;
                    done += n;
                    at += n as u64;
                    left -= n as u64;
                }
            }
        }
    }
    if done == buf.len() {
        Ok(())
    } else {
        Err(Fault)
    }
}

/// Writes `buf` starting `skip` bytes into `segs` (no inline runs).
pub fn scatter(hca: &mut Hca, segs: &[Seg], mut skip: u64, buf: &[u8]) -> Result<(), Fault> {
    let mut done = 0usize;
    for s in segs {
        if done == buf.len() {
            break;
        }
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        let xl = s.xl.ok_or(Fault)?;
        let mut at = s.addr + skip;
        let mut left = (s.len - skip).min((buf.len() - done) as u64);
        skip = 0;
        while left > 0 {
            let (pa, room) = bus(hca, &xl, at).ok_or(Fault)?;
            let n = left.min(room) as usize;
            hca.dma_write(pa, &buf[done..done + n]).map_err(|_| Fault)?;
            done += n;
            at += n as u64;
            left -= n as u64;
        }
    }
    if done == buf.len() {
        Ok(())
    } else {
        Err(Fault)
    }
}

/// Chunk of the engine's bounce buffer.
pub const CHUNK: usize = 16 << 10;

/// Copies `len` bytes from `src` (with inline runs from `inline`) to `dst`
/// starting `dst_skip` bytes in, through the engine's bounce buffer.
pub fn copy(
    hca: &mut Hca,
    src: &[Seg],
    inline: &[u8],
    dst: &[Seg],
    dst_skip: u64,
    len: u64,
) -> Result<(), Fault> {
    let mut bounce = core::mem::take(&mut hca.engine.bounce);
    if bounce.len() < CHUNK {
        bounce.resize(CHUNK, 0);
    }
    let mut off = 0u64;
    let mut r = Ok(());
    while off < len {
        let n = (len - off).min(CHUNK as u64) as usize;
        r = gather(hca, src, inline, off, &mut bounce[..n])
            .and_then(|()| scatter(hca, dst, dst_skip + off, &bounce[..n]));
        if r.is_err() {
            break;
        }
        off += n as u64;
    }
    hca.engine.bounce = bounce;
    r
}
