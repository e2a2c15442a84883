//! The host memory the HCA keeps its contexts in (ICM), as Linux's `icm.c` allocates and maps it.
//!
//! Linux: `icm.c` and `mlx4_map_cmd` from `fw.c`: allocation in chunks,
//! MAP_FA/MAP_ICM_AUX/MAP_ICM page lists, and per-table on-demand mapping
//! with refcounted 256 KiB chunks and pinned reserved entries. Scatterlists
//! and `dma_sync` for non-coherent memory are not needed with `hal` DMA.
//!
//! One deliberate fix: Linux's `mlx4_table_get` always maps a full 256 KiB
//! chunk even when the table is smaller, which would map ICM beyond the
//! table; here a chunk never extends past its table (same as Linux's
//! `mlx4_init_icm_table` sizing of the last chunk).

use alloc::vec::Vec;

use hal::{DmaBuf, DmaPool};
use log::warn;
use mlx4_hw::cmd::{Opcode, timeout};
use mlx4_hw::icm::*;

use crate::cmd::{Cmd, Mailbox};
use crate::{Error, Result, mlx4_dbg, mlx4_warn};

/// `MLX4_ICM_ALLOC_SIZE`: the largest contiguous chunk asked of the pool.
pub const ICM_ALLOC_SIZE: usize = 1 << 18;

/// Host memory given to the HCA (Linux `struct mlx4_icm`): power-of-two,
/// naturally aligned where the pool allows, DMA chunks.
pub struct Icm {
    chunks: Vec<DmaBuf>,
    refcount: u32,
}

impl Icm {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.len()).sum()
    }
}

fn alloc_chunk(pool: &DmaPool, len: usize) -> Result<DmaBuf> {
    match pool.alloc(len, len) {
        Ok(b) => Ok(b),
        Err(_) => Ok(pool.alloc(len, 4096)?),
    }
}

/// Linux `mlx4_alloc_icm`: `npages` 4 KiB pages in chunks of at most 256 KiB,
/// halving the chunk size when the pool cannot serve one.
pub fn alloc_icm(pool: &DmaPool, npages: usize) -> Result<Icm> {
    let mut chunks = Vec::new();
    let mut left = npages;
    let mut order_pages = ICM_ALLOC_SIZE / 4096;
    while left > 0 {
        while order_pages > left {
            order_pages >>= 1;
        }
        match alloc_chunk(pool, order_pages * 4096) {
            Ok(b) => {
                chunks.push(b);
                left -= order_pages;
            }
            Err(e) => {
                if order_pages == 1 {
                    return Err(e);
                }
                order_pages >>= 1;
            }
        }
    }
    Ok(Icm {
        chunks,
        refcount: 0,
    })
}

/// Linux `mlx4_map_cmd`: describes `icm` to the firmware in page-list
/// mailboxes of up to 256 naturally aligned entries. `virt` is the ICM
/// virtual address for MAP_ICM, `None` for MAP_FA and MAP_ICM_AUX.
pub fn map_cmd(
    cmd: &mut Cmd,
    pool: &DmaPool,
    op: Opcode,
    icm: &Icm,
    virt: Option<u64>,
    name: &hal::PciAddress,
) -> Result<()> {
    let mut done_kb = 0u64;
    let r = map_cmd_inner(cmd, pool, op, icm, virt, name, &mut done_kb);
    if r.is_err() && done_kb > 0 {
        // Linux leaves the part mapped by earlier mailboxes to the device
        // while it frees the memory; undo it instead.
        let undo = match op {
            Opcode::MAP_FA => crate::fw::unmap_fa(cmd),
            Opcode::MAP_ICM_AUX => crate::fw::unmap_icm_aux(cmd),
            _ => unmap_icm(cmd, virt.unwrap_or(0), (done_kb >> 2) as u32),
        };
        if let Err(e) = undo {
            mlx4_warn!(name, "undoing a partial {op} failed ({})", e.to_errno());
        }
    }
    r
}

fn map_cmd_inner(
    cmd: &mut Cmd,
    pool: &DmaPool,
    op: Opcode,
    icm: &Icm,
    virt: Option<u64>,
    name: &hal::PciAddress,
    done_kb: &mut u64,
) -> Result<()> {
    let mb = Mailbox::new(pool)?;
    let mut virt_cur = virt;
    let mut nent = 0usize;
    let (mut tc, mut ts) = (0u32, 0u64);
    for c in &icm.chunks {
        let addr = c.bus_addr().0;
        let size = c.len() as u64;
        let Some(lg) = map_chunk_log(addr, size) else {
            mlx4_warn!(name, "Got FW area not aligned to 4096 ({addr:x}/{size:x}).");
            return Err(Error::InvalidArg);
        };
        for i in 0..size >> lg {
            let e = map_entry(virt_cur, addr + (i << lg), lg);
            if let Some(v) = virt_cur.as_mut() {
                *v += 1 << lg;
            }
            mb.write(nent * MAP_ENTRY_SIZE, &e);
            ts += 1 << (lg - 10);
            tc += 1;
            nent += 1;
            if nent == MAP_ENTRIES_PER_MAILBOX {
                cmd.cmd(mb.dma(), nent as u32, 0, op, timeout::CLASS_B)?;
                *done_kb = ts;
                mb.clear(4096);
                nent = 0;
            }
        }
    }
    if nent > 0 {
        cmd.cmd(mb.dma(), nent as u32, 0, op, timeout::CLASS_B)?;
        *done_kb = ts;
    }
    match op {
        Opcode::MAP_FA => mlx4_dbg!(name, "Mapped {tc} chunks/{ts} KB for FW."),
        Opcode::MAP_ICM_AUX => mlx4_dbg!(name, "Mapped {tc} chunks/{ts} KB for ICM aux."),
        _ => mlx4_dbg!(
            name,
            "Mapped {tc} chunks/{ts} KB at {:x} for ICM.",
            virt.unwrap_or(0)
        ),
    }
    Ok(())
}

/// Linux `mlx4_UNMAP_ICM`: `page_count` 4 KiB pages at ICM address `virt`.
pub fn unmap_icm(cmd: &mut Cmd, virt: u64, page_count: u32) -> Result<()> {
    cmd.cmd(virt, page_count, 0, Opcode::UNMAP_ICM, timeout::CLASS_B)
}

/// Where one context table lies in ICM and how much of it is the
/// firmware's (the arguments of Linux's `mlx4_init_icm_table`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcmTableSpec {
    /// Linux's name, for logs (`QPC`, `MTT`, ...).
    pub name: &'static str,
    /// ICM virtual address of object 0.
    pub virt: u64,
    /// Bytes per object (a power of two, at most one chunk).
    pub obj_size: u32,
    /// Objects in the table.
    pub nobj: u32,
    /// Objects `[0, reserved)` belong to the firmware: mapped at once and
    /// pinned until cleanup.
    pub reserved: u32,
}

/// One context table in ICM (Linux `struct mlx4_icm_table`).
pub struct IcmTable {
    /// Linux's name, for logs (`QPC`, `MTT`, ...).
    pub name: &'static str,
    virt: u64,
    num_obj: u32,
    obj_size: u32,
    icm: Vec<Option<Icm>>,
}

impl IcmTable {
    /// An empty table (nothing mapped).
    pub fn empty(name: &'static str) -> IcmTable {
        IcmTable {
            name,
            virt: 0,
            num_obj: 0,
            obj_size: 0,
            icm: Vec::new(),
        }
    }

    fn objs_per_chunk(&self) -> u32 {
        (TABLE_CHUNK_SIZE / u64::from(self.obj_size)).max(1) as u32
    }

    fn chunk_len(&self, i: usize) -> usize {
        let total = u64::from(self.num_obj) * u64::from(self.obj_size);
        let start = i as u64 * TABLE_CHUNK_SIZE;
        let len = total.saturating_sub(start).min(TABLE_CHUNK_SIZE);
        len.next_multiple_of(ICM_PAGE_SIZE) as usize
    }

    fn map_chunk(
        &mut self,
        cmd: &mut Cmd,
        pool: &DmaPool,
        i: usize,
        name: &hal::PciAddress,
    ) -> Result<()> {
        let len = self.chunk_len(i);
        let icm = alloc_icm(pool, len / 4096)?;
        let virt = self.virt + i as u64 * TABLE_CHUNK_SIZE;
        map_cmd(cmd, pool, Opcode::MAP_ICM, &icm, Some(virt), name)?;
        self.icm[i] = Some(icm);
        Ok(())
    }

    /// Linux `mlx4_init_icm_table`: maps and pins the chunks holding objects
    /// `[0, spec.reserved)`. On failure everything mapped so far is unmapped
    /// and freed.
    pub fn init(
        cmd: &mut Cmd,
        pool: &DmaPool,
        spec: &IcmTableSpec,
        pci: &hal::PciAddress,
    ) -> Result<IcmTable> {
        let &IcmTableSpec {
            name,
            virt,
            obj_size,
            nobj,
            reserved,
        } = spec;
        if obj_size == 0 || !obj_size.is_power_of_two() || u64::from(obj_size) > TABLE_CHUNK_SIZE {
            return Err(Error::InvalidArg);
        }
        let mut t = IcmTable {
            name,
            virt,
            num_obj: nobj,
            obj_size,
            icm: Vec::new(),
        };
        let per = u64::from(t.objs_per_chunk());
        let num_icm = u64::from(nobj).div_ceil(per) as usize;
        t.icm.resize_with(num_icm, || None);
        let reserved_bytes = u64::from(reserved) * u64::from(obj_size);
        let mut i = 0usize;
        while (i as u64) * TABLE_CHUNK_SIZE < reserved_bytes && i < num_icm {
            if let Err(e) = t.map_chunk(cmd, pool, i, pci) {
                t.cleanup(cmd);
                return Err(e);
            }
            // Reserved firmware objects: never unmapped before cleanup.
            if let Some(icm) = t.icm[i].as_mut() {
                icm.refcount += 1;
            }
            i += 1;
        }
        Ok(t)
    }

    fn index(&self, obj: u32) -> usize {
        ((obj & self.num_obj.wrapping_sub(1)) / self.objs_per_chunk()) as usize
    }

    /// Linux `mlx4_table_get`: maps the chunk holding `obj` if needed and
    /// takes a reference.
    pub fn get(
        &mut self,
        cmd: &mut Cmd,
        pool: &DmaPool,
        obj: u32,
        pci: &hal::PciAddress,
    ) -> Result<()> {
        let i = self.index(obj);
        if i >= self.icm.len() {
            return Err(Error::InvalidArg);
        }
        if self.icm[i].is_none() {
            self.map_chunk(cmd, pool, i, pci)?;
        }
        if let Some(icm) = self.icm[i].as_mut() {
            icm.refcount += 1;
        }
        Ok(())
    }

    /// Linux `mlx4_table_put`: drops a reference; the last one unmaps and
    /// frees the chunk.
    pub fn put(&mut self, cmd: &mut Cmd, obj: u32) {
        let i = self.index(obj);
        let Some(Some(icm)) = self.icm.get_mut(i) else {
            return;
        };
        icm.refcount = icm.refcount.saturating_sub(1);
        if icm.refcount == 0 {
            let pages = (self.chunk_len(i) / 4096) as u32;
            if let Err(e) = unmap_icm(cmd, self.virt + i as u64 * TABLE_CHUNK_SIZE, pages) {
                warn!(
                    "{} chunk {i}: UNMAP_ICM failed ({})",
                    self.name,
                    e.to_errno()
                );
            }
            self.icm[i] = None;
        }
    }

    /// Linux `mlx4_table_get_range`: references every chunk of `[start, end]`.
    pub fn get_range(
        &mut self,
        cmd: &mut Cmd,
        pool: &DmaPool,
        start: u32,
        end: u32,
        pci: &hal::PciAddress,
    ) -> Result<()> {
        let inc = self.objs_per_chunk();
        let mut i = start;
        while i <= end {
            if let Err(e) = self.get(cmd, pool, i, pci) {
                let mut j = start;
                while j < i {
                    self.put(cmd, j);
                    j += inc;
                }
                return Err(e);
            }
            match i.checked_add(inc) {
                Some(n) => i = n,
                None => break,
            }
        }
        Ok(())
    }

    /// Linux `mlx4_table_put_range`.
    pub fn put_range(&mut self, cmd: &mut Cmd, start: u32, end: u32) {
        let inc = self.objs_per_chunk();
        let mut i = start;
        while i <= end {
            self.put(cmd, i);
            match i.checked_add(inc) {
                Some(n) => i = n,
                None => break,
            }
        }
    }

    /// Linux `mlx4_table_find`: the host memory holding `obj` (the DMA chunk
    /// and the byte offset in it), if mapped. Used to write MTTs and read
    /// dMPTs directly in native mode.
    pub fn find(&self, obj: u32) -> Option<(&DmaBuf, usize)> {
        let icm = self.icm.get(self.index(obj))?.as_ref()?;
        let mut off = (u64::from(obj & self.num_obj.wrapping_sub(1)) * u64::from(self.obj_size))
            % TABLE_CHUNK_SIZE;
        for c in &icm.chunks {
            if off < c.len() as u64 {
                return Some((c, off as usize));
            }
            off -= c.len() as u64;
        }
        None
    }

    /// Linux `mlx4_cleanup_icm_table`: unmaps and frees every chunk.
    pub fn cleanup(&mut self, cmd: &mut Cmd) {
        for i in 0..self.icm.len() {
            if self.icm[i].is_some() {
                let pages = (self.chunk_len(i) / 4096) as u32;
                if let Err(e) = unmap_icm(cmd, self.virt + i as u64 * TABLE_CHUNK_SIZE, pages) {
                    warn!(
                        "{} chunk {i}: UNMAP_ICM failed ({})",
                        self.name,
                        e.to_errno()
                    );
                }
                self.icm[i] = None;
            }
        }
    }

    /// Host bytes currently mapped for this table.
    pub fn mapped_bytes(&self) -> usize {
        self.icm.iter().flatten().map(Icm::bytes).sum()
    }

    /// Chunks currently mapped with their reference counts (for leak checks).
    pub fn refcounts(&self) -> Vec<(usize, u32)> {
        self.icm
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i, c.refcount)))
            .collect()
    }

    /// The table's ICM base address.
    pub fn virt(&self) -> u64 {
        self.virt
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::tests::setup;
    use alloc::sync::Arc;
    use core::sync::atomic::Ordering;
    use hal::fake::ArenaDma;

    #[test]
    fn a_partial_map_is_undone() {
        let pool = DmaPool::new(Arc::new(ArenaDma::new(4 << 20)));
        // 300 single pages: two mailboxes (256 + 44 entries).
        let chunks = (0..300).map(|_| pool.alloc_pages(1).unwrap()).collect();
        let icm = Icm {
            chunks,
            refcount: 0,
        };
        for (op, undo) in [
            (Opcode::MAP_FA, Opcode::UNMAP_FA),
            (Opcode::MAP_ICM_AUX, Opcode::UNMAP_ICM_AUX),
            (Opcode::MAP_ICM, Opcode::UNMAP_ICM),
        ] {
            let (hcr, _, mut cmd) = setup();
            hcr.status.store(0x0c, Ordering::SeqCst);
            hcr.status_from.store(1, Ordering::SeqCst);
            let virt = (op == Opcode::MAP_ICM).then_some(0x40_0000);
            let e =
                map_cmd(&mut cmd, &pool, op, &icm, virt, &hal::PciAddress::default()).unwrap_err();
            assert_eq!(e.opcode(), Some(op));
            let p = hcr.posted.lock().unwrap().clone();
            assert_eq!(
                p.iter().map(|x| x.0).collect::<Vec<_>>(),
                [op.0, op.0, undo.0]
            );
            assert_eq!(p[0].2, 256);
            assert_eq!(p[1].2, 44);
            if op == Opcode::MAP_ICM {
                assert_eq!(
                    (p[2].3, p[2].2),
                    (0x40_0000, 256),
                    "UNMAP_ICM of what was mapped"
                );
            }
        }
    }
}
