//! A raw command poster written from the PRM/Linux protocol description, and
//! a small-profile Linux-order bring-up the other tests build on.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use hal::{Bar, Clock, DmaBuf, DmaPool, PciFunction};
use sim::hca::layout::{InitHca, PageEntry, put64};
use sim::{Opcode, SimConfig, SimHca, Status};

pub const HCR: usize = 0x8_0680;
/// The first PD above the firmware-reserved ones (QUERY_DEV_CAP reports 4).
pub const PD: u32 = 4;
pub const GO: u32 = 1 << 23;
pub const T: u32 = 1 << 21;
pub const E: u32 = 1 << 22;

/// Why a raw command failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmdError {
    /// The HCR was busy when we wanted to post (Linux's -EAGAIN).
    Busy,
    /// GO did not clear before the deadline.
    Timeout,
    /// Completed with a non-zero status.
    Status(Status),
}

pub type R<T = ()> = Result<T, CmdError>;

pub struct Raw {
    pub sim: SimHca,
    pub pci: PciFunction,
    pub bar0: Bar,
    pub bar2: Bar,
    pub pool: DmaPool,
    pub clock: Arc<dyn Clock>,
    pub toggle: bool,
    pub inbox: DmaBuf,
    pub outbox: DmaBuf,
    pub timeout: Duration,
    /// Keeps DMA pages the device was given alive.
    pub keep: Vec<DmaBuf>,
    /// Next free MTT index (the first 16 are reserved).
    pub next_mtt: u64,
    /// ICM page -> index in `keep` of the host page backing it.
    pub icm: std::collections::BTreeMap<u64, usize>,
}

impl Raw {
    pub fn with(sim: SimHca) -> Raw {
        let pci = sim.pci_function();
        pci.enable();
        let bar0 = pci.take_bar(0).unwrap();
        let bar2 = pci.take_bar(2).unwrap();
        let pool = sim.dma_pool();
        let inbox = pool.alloc_pages(1).unwrap();
        let outbox = pool.alloc_pages(1).unwrap();
        Raw {
            clock: sim.clock(),
            sim,
            pci,
            bar0,
            bar2,
            pool,
            toggle: true,
            inbox,
            outbox,
            timeout: Duration::from_secs(10),
            keep: Vec::new(),
            next_mtt: 16,
            icm: Default::default(),
        }
    }

    /// A poster over someone else's device: `pci`'s BARs, `pool` and
    /// `clock` (a host process standing in for a guest of `cx3-emu`, the
    /// model in another process). `sim` is only a placeholder there: the
    /// checks that read the model in process (`violated`, the trace) do not
    /// apply.
    pub fn over(sim: SimHca, pci: PciFunction, pool: DmaPool, clock: Arc<dyn Clock>) -> Raw {
        pci.enable();
        let bar0 = pci.take_bar(0).unwrap();
        let bar2 = pci.take_bar(2).unwrap();
        let inbox = pool.alloc_pages(1).unwrap();
        let outbox = pool.alloc_pages(1).unwrap();
        Raw {
            clock,
            sim,
            pci,
            bar0,
            bar2,
            pool,
            toggle: true,
            inbox,
            outbox,
            timeout: Duration::from_secs(10),
            keep: Vec::new(),
            next_mtt: 16,
            icm: Default::default(),
        }
    }

    pub fn new() -> Raw {
        Self::with(SimHca::new(SimConfig::default()))
    }

    pub fn cfg(cfg: SimConfig) -> Raw {
        Self::with(SimHca::new(cfg))
    }

    /// Linux `cmd_pending`.
    pub fn pending(&self) -> bool {
        let s = self.bar0.read_be32(HCR + 0x18);
        s & GO != 0 || (s & T != 0) == self.toggle
    }

    /// Linux `mlx4_cmd_post` + `mlx4_cmd_poll` (poll mode, no wait on entry).
    pub fn post(
        &mut self,
        in_param: u64,
        out_param: u64,
        in_mod: u32,
        op_mod: u8,
        op: Opcode,
    ) -> R<u64> {
        if self.pending() {
            return Err(CmdError::Busy);
        }
        let b = &self.bar0;
        b.write_be32(HCR, (in_param >> 32) as u32);
        b.write_be32(HCR + 4, in_param as u32);
        b.write_be32(HCR + 8, in_mod);
        b.write_be32(HCR + 0xc, (out_param >> 32) as u32);
        b.write_be32(HCR + 0x10, out_param as u32);
        b.write_be32(HCR + 0x14, 0xffff << 16);
        hal::barrier::wmb();
        let t = if self.toggle { T } else { 0 };
        b.write_be32(
            HCR + 0x18,
            GO | t | u32::from(op_mod) << 12 | u32::from(op.0),
        );
        self.toggle = !self.toggle;
        let deadline = hal::Deadline::after(&*self.clock, self.timeout);
        while self.pending() {
            if deadline.expired(&*self.clock) {
                return Err(CmdError::Timeout);
            }
            self.clock.relax();
        }
        let st = (self.bar0.read_be32(HCR + 0x18) >> 24) as u8;
        if st != 0 {
            return Err(CmdError::Status(Status(st)));
        }
        let hi = self.bar0.read_be32(HCR + 0xc);
        let lo = self.bar0.read_be32(HCR + 0x10);
        Ok(u64::from(hi) << 32 | u64::from(lo))
    }

    /// Posts seven raw dwords as given (dwords 0..5, then dword 6) and waits
    /// for GO to clear; the status byte. The caller sets GO and T in `dw[6]`
    /// (and flips `toggle` accordingly).
    pub fn post_raw(&mut self, dw: [u32; 7]) -> R<u8> {
        for (i, v) in dw.iter().enumerate() {
            self.bar0.write_be32(HCR + 4 * i, *v);
        }
        self.toggle = dw[6] & T == 0;
        let deadline = hal::Deadline::after(&*self.clock, self.timeout);
        while self.pending() {
            if deadline.expired(&*self.clock) {
                return Err(CmdError::Timeout);
            }
            self.clock.relax();
        }
        Ok((self.bar0.read_be32(HCR + 0x18) >> 24) as u8)
    }

    /// The T bit the next post must carry.
    pub fn next_t(&self) -> u32 {
        if self.toggle { T } else { 0 }
    }

    /// True if a recorded violation contains `pat`.
    pub fn violated(&self, pat: &str) -> bool {
        self.sim.violations().iter().any(|v| v.contains(pat))
    }

    /// A command without mailboxes.
    pub fn cmd(&mut self, in_param: u64, in_mod: u32, op_mod: u8, op: Opcode) -> R {
        self.post(in_param, 0, in_mod, op_mod, op).map(|_| ())
    }

    /// Immediate output.
    pub fn cmd_imm(&mut self, in_param: u64, in_mod: u32, op_mod: u8, op: Opcode) -> R<u64> {
        self.post(in_param, 0, in_mod, op_mod, op)
    }

    /// In mailbox with `data`.
    pub fn cmd_in(&mut self, data: &[u8], in_mod: u32, op_mod: u8, op: Opcode) -> R {
        self.inbox.fill(0, 4096, 0);
        self.inbox.write_bytes(0, data);
        let a = self.inbox.bus_addr().0;
        self.post(a, 0, in_mod, op_mod, op).map(|_| ())
    }

    /// Out mailbox; returns its 4096 bytes.
    pub fn cmd_out(&mut self, in_mod: u32, op_mod: u8, op: Opcode) -> R<Vec<u8>> {
        self.outbox.fill(0, 4096, 0);
        let a = self.outbox.bus_addr().0;
        self.post(0, a, in_mod, op_mod, op)?;
        let mut v = vec![0u8; 4096];
        self.outbox.read_bytes(0, &mut v);
        Ok(v)
    }

    /// In and out mailboxes.
    pub fn cmd_box(&mut self, data: &[u8], in_mod: u32, op_mod: u8, op: Opcode) -> R<Vec<u8>> {
        self.inbox.fill(0, 4096, 0);
        self.inbox.write_bytes(0, data);
        self.outbox.fill(0, 4096, 0);
        let (i, o) = (self.inbox.bus_addr().0, self.outbox.bus_addr().0);
        self.post(i, o, in_mod, op_mod, op)?;
        let mut v = vec![0u8; 4096];
        self.outbox.read_bytes(0, &mut v);
        Ok(v)
    }

    /// Allocates `n` pages and keeps them; returns their bus addresses.
    pub fn pages(&mut self, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| {
                let b = self.pool.alloc_pages(1).unwrap();
                let a = b.bus_addr().0;
                self.keep.push(b);
                a
            })
            .collect()
    }

    /// Allocates `n` pages as naturally aligned blocks of up to 64 pages
    /// (Linux's ICM chunks are at most 256 KiB, and `mlx4_map_cmd` names
    /// each by its log2 size), keeps them, and returns the MAP_FA /
    /// MAP_ICM_AUX entries that name them.
    pub fn page_blocks(&mut self, n: usize) -> Vec<PageEntry> {
        let mut entries = Vec::new();
        let mut left = n;
        while left > 0 {
            let log = left.ilog2().min(6);
            let bytes = 4096 << log;
            let b = self.pool.alloc(bytes, bytes).unwrap();
            entries.push(PageEntry {
                va: 0,
                pa: b.bus_addr().0,
                log_size: log as u8,
            });
            self.keep.push(b);
            left -= 1 << log;
        }
        entries
    }

    /// Sends a page list (MAP_FA/MAP_ICM_AUX/MAP_ICM) in chunks of 256.
    pub fn map_pages(&mut self, op: Opcode, entries: &[PageEntry]) -> R {
        for chunk in entries.chunks(256) {
            let mut b = vec![0u8; 4096];
            for (i, e) in chunk.iter().enumerate() {
                e.encode(&mut b, i);
            }
            self.cmd_in(&b, chunk.len() as u32, 0, op)?;
        }
        Ok(())
    }

    /// MAP_ICM `npages` fresh 4 KiB pages at `va`.
    pub fn map_icm(&mut self, va: u64, npages: usize) -> R {
        let pas = self.pages(npages);
        let first = self.keep.len() - npages;
        for i in 0..npages {
            self.icm.insert(va / 4096 + i as u64, first + i);
        }
        let e: Vec<_> = pas
            .iter()
            .enumerate()
            .map(|(i, &pa)| PageEntry {
                va: va + i as u64 * 4096,
                pa,
                log_size: 0,
            })
            .collect();
        self.map_pages(Opcode::MAP_ICM, &e)
    }

    /// Device-visible memory: writes `data` into a fresh buffer, returns it.
    pub fn buf(&mut self, len: usize) -> DmaBuf {
        self.pool.alloc(len, 4096).unwrap()
    }

    /// Writes bytes straight into ICM through the host page backing it (as
    /// native Linux writes MTT entries).
    pub fn icm_poke(&self, va: u64, data: &[u8]) {
        let i = self.icm[&(va / 4096)];
        self.keep[i].write_bytes((va % 4096) as usize, data);
    }

    /// Reads ICM through the host page backing it.
    pub fn icm_peek(&self, va: u64, len: usize) -> Vec<u8> {
        let i = self.icm[&(va / 4096)];
        let mut v = vec![0u8; len];
        self.keep[i].read_bytes((va % 4096) as usize, &mut v);
        v
    }

    /// True if exactly `n` commands so far failed.
    pub fn ok_trace_after_errors(&self, n: usize) -> bool {
        self.sim.trace().iter().filter(|e| !e.ok()).count() == n
    }

    /// True if every command so far succeeded.
    pub fn ok_trace(&self) -> bool {
        self.sim.trace().iter().all(|e| e.ok())
    }
}

/// The small profile's ICM layout (cMPT first, as Linux's sort puts it).
pub mod profile {
    pub const CMPT: u64 = 0;
    pub const QPC: u64 = 0x1_0000_0000;
    pub const AUXC: u64 = 0x1_0001_0000;
    pub const ALTC: u64 = 0x1_0001_4000;
    pub const RDMARC: u64 = 0x1_0002_0000;
    pub const SRQC: u64 = 0x1_0004_0000;
    pub const EQC: u64 = 0x1_0004_2000;
    pub const CQC: u64 = 0x1_0004_4000;
    pub const DMPT: u64 = 0x1_0004_8000;
    pub const MTT: u64 = 0x1_0004_c000;
    pub const MC: u64 = 0x1_0005_4000;
    pub const END: u64 = 0x1_0005_8000;
    pub const ICM_SIZE: u64 = 0x1_0010_0000;
    pub const LOG_QPS: u8 = 8;
    pub const LOG_SRQS: u8 = 7;
    pub const LOG_CQS: u8 = 8;
    pub const LOG_EQS: u8 = 6;
    pub const LOG_MPTS: u8 = 8;
    pub const LOG_RD: u8 = 4;
    pub const CMPT_TYPE: u64 = 64 << 24;
    pub const RSVD_QPS: u32 = 64;
    pub const BASE_SQPN: u32 = 64;
    pub const FIRST_EQ: u32 = 32;
    pub const FIRST_CQ: u32 = 128;
    pub const FIRST_MPT: u32 = 16;
    pub const FIRST_SRQ: u32 = 64;
    pub const UAR: u32 = 128;
}

pub fn init_hca_params() -> InitHca {
    use profile::*;
    InitHca {
        version: 2,
        cacheline: 0x40,
        flags: 0,
        qpc_base: QPC,
        log_num_qps: LOG_QPS,
        srqc_base: SRQC,
        log_num_srqs: LOG_SRQS,
        cqc_base: CQC,
        log_num_cqs: LOG_CQS,
        eqe_cqe_64: 0,
        altc_base: ALTC,
        auxc_base: AUXC,
        eqc_base: EQC,
        log_num_eqs: LOG_EQS,
        rdmarc_base: RDMARC,
        log_rd_per_qp: LOG_RD,
        mc_base: MC,
        log_mc_entry_sz: 6,
        log_mc_hash_sz: 7,
        log_mc_table_sz: 8,
        dmpt_base: DMPT,
        log_mpt_sz: LOG_MPTS,
        mtt_base: MTT,
        cmpt_base: CMPT,
        log_uars: 11,
        uar_page_sz: 0,
    }
}

/// Linux `mlx4_reset`: semaphore, reset, sleep, vendor-ID poll, restore.
pub fn reset(r: &mut Raw) {
    let saved: Vec<u32> = (0..16u16).map(|i| r.pci.read32(i * 4)).collect();
    let deadline = hal::Deadline::after(&*r.clock, Duration::from_secs(10));
    while r.bar0.read_be32(0xf_03fc) != 0 {
        assert!(!deadline.expired(&*r.clock), "reset semaphore never free");
        r.clock.delay(Duration::from_millis(1));
    }
    r.bar0.write_be32(0xf_0010, 1);
    r.clock.delay(Duration::from_millis(1000));
    let deadline = hal::Deadline::after(&*r.clock, Duration::from_secs(2));
    while r.pci.read16(0) == 0xffff {
        assert!(!deadline.expired(&*r.clock), "device never came back");
        r.clock.delay(Duration::from_millis(1));
    }
    for (i, v) in saved.iter().enumerate() {
        if i != 1 {
            r.pci.write32(i as u16 * 4, *v);
        }
    }
    r.pci.write32(4, saved[1]);
    r.toggle = true;
}

/// Everything up to and including RUN_FW (Linux steps 2..6).
pub fn load_fw(r: &mut Raw) -> R {
    assert_eq!(r.bar0.read_be32(0x8_069c), 0, "ownership");
    reset(r);
    load_fw_no_reset(r)
}

/// MAP_FA and RUN_FW only.
pub fn load_fw_no_reset(r: &mut Raw) -> R {
    let fw = r.cmd_out(0, 0, Opcode::QUERY_FW)?;
    let fw_pages = u16::from_be_bytes([fw[0], fw[1]]) as usize;
    let e = r.page_blocks(fw_pages);
    r.map_pages(Opcode::MAP_FA, &e)?;
    r.cmd(0, 0, 0, Opcode::RUN_FW)
}

/// Linux-order bring-up with the small profile, up to INIT_HCA and
/// QUERY_ADAPTER (Linux steps 2..15).
pub fn init(r: &mut Raw) -> R {
    load_fw(r)?;
    init_after_fw(r)
}

/// As [`init`] without the software reset (threaded tests: Linux's reset
/// sleeps a real second there).
pub fn init_no_reset(r: &mut Raw) -> R {
    load_fw_no_reset(r)?;
    init_after_fw(r)
}

/// Steps after RUN_FW up to QUERY_ADAPTER.
pub fn init_after_fw_pub(r: &mut Raw) -> R {
    init_after_fw(r)
}

fn init_after_fw(r: &mut Raw) -> R {
    init_before_hca(r)?;
    let ih = init_hca_params().encode();
    r.cmd_in(&ih, 0, 0, Opcode::INIT_HCA)?;
    r.cmd_out(0, 0, Opcode::QUERY_ADAPTER)?;
    Ok(())
}

/// Everything up to (not including) INIT_HCA, after a reset: QUERY_FW ..
/// MAP_ICM.
pub fn init_up_to_hca(r: &mut Raw) -> R {
    load_fw(r)?;
    init_before_hca(r)
}

/// Steps after RUN_FW up to MAP_ICM.
fn init_before_hca(r: &mut Raw) -> R {
    use profile::*;
    let mut stat = vec![0u8; 0x100];
    stat[2] = 1;
    r.cmd_in(&stat, 0, 0, Opcode::MOD_STAT_CFG)?;
    r.cmd_out(0, 0, Opcode::QUERY_DEV_CAP)?;
    r.cmd_out(1, 0, Opcode::QUERY_PORT)?;
    r.cmd_out(2, 0, Opcode::QUERY_PORT)?;
    let aux = r.cmd_imm(ICM_SIZE, 0, 0, Opcode::SET_ICM_SIZE)?;
    let e = r.page_blocks(aux as usize);
    r.map_pages(Opcode::MAP_ICM_AUX, &e)?;
    // cMPT for QPs, SRQs, CQs, EQs (the first objects of each), then the
    // context tables, in mlx4_init_icm's order.
    r.map_icm(CMPT, 4)?;
    r.map_icm(CMPT + CMPT_TYPE, 2)?;
    r.map_icm(CMPT + 2 * CMPT_TYPE, 4)?;
    r.map_icm(CMPT + 3 * CMPT_TYPE, 1)?;
    r.map_icm(EQC, 1)?;
    r.map_icm(MTT, 8)?;
    r.map_icm(DMPT, 4)?;
    r.map_icm(QPC, 16)?;
    r.map_icm(AUXC, 4)?;
    r.map_icm(ALTC, 8)?;
    r.map_icm(RDMARC, 32)?;
    r.map_icm(CQC, 4)?;
    r.map_icm(SRQC, 2)?;
    r.map_icm(MC, 4)?;
    Ok(())
}

/// Writes MTT entries for `pages` at MTT index `first` with WRITE_MTT.
pub fn write_mtt(r: &mut Raw, first: u64, pages: &[u64]) -> R {
    let mut b = vec![0u8; 16 + pages.len() * 8];
    put64(&mut b, 0, first);
    for (i, pa) in pages.iter().enumerate() {
        put64(&mut b, 16 + i * 8, pa | 1);
    }
    r.cmd_in(&b, pages.len() as u32, 0, Opcode::WRITE_MTT)
}

/// Reserves `n` MTT entries, returns the first index.
pub fn alloc_mtt(r: &mut Raw, n: u64) -> u64 {
    let first = r.next_mtt;
    r.next_mtt += n.next_multiple_of(8);
    first
}

/// A queue buffer: host pages plus their MTT range.
pub struct Queue {
    pub pages: Vec<u64>,
    pub mtt: u64,
}

/// Allocates `npages` pages for a queue and writes their MTT entries with
/// WRITE_MTT.
pub fn queue(r: &mut Raw, npages: usize) -> R<Queue> {
    let pages = r.pages(npages);
    let mtt = alloc_mtt(r, npages as u64);
    write_mtt(r, mtt, &pages)?;
    Ok(Queue { pages, mtt })
}

/// EQ context as Linux's mlx4_create_eq writes it.
pub fn eq_ctx(log_nent: u8, mtt: u64, intr: u8) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[0..4].copy_from_slice(&0x0000_0900u32.to_be_bytes()); // OK | ARMED
    b[0x0c] = log_nent;
    b[0x17] = intr;
    b[0x18] = 0;
    let a = mtt * 8;
    b[0x1b] = (a >> 32) as u8;
    b[0x1c..0x20].copy_from_slice(&(a as u32).to_be_bytes());
    b
}

/// Creates EQ `eqn` with 2^log_nent 32-byte entries.
pub fn create_eq(r: &mut Raw, eqn: u32, log_nent: u8) -> R<Queue> {
    let bytes = 32usize << log_nent;
    let q = queue(r, bytes.div_ceil(4096))?;
    r.cmd_in(&eq_ctx(log_nent, q.mtt, 0), eqn, 0, Opcode::SW2HW_EQ)?;
    Ok(q)
}

/// EQ doorbell: consumer index and re-arm.
pub fn eq_doorbell(r: &Raw, eqn: u32, ci: u32, arm: bool) {
    let off = (eqn as usize / 4) * 4096 + 0x800 + 8 * (eqn as usize % 4);
    r.bar2
        .write_be32(off, (ci & 0xff_ffff) | u32::from(arm) << 31);
}

/// Reads the 32-byte EQE `i` of a one-page-per-128-entries EQ.
pub fn eqe(r: &Raw, q: &Queue, nent: u32, i: u32) -> [u8; 32] {
    let off = (i & (nent - 1)) as u64 * 32;
    let pa = q.pages[(off / 4096) as usize] + off % 4096;
    let mut e = [0u8; 32];
    for b in &r.keep {
        let base = b.bus_addr().0;
        if (base..base + b.len() as u64).contains(&pa) {
            b.read_bytes((pa - base) as usize, &mut e);
        }
    }
    e
}

/// CQ context as Linux's mlx4_cq_alloc writes it.
pub fn cq_ctx(log_nent: u8, uar: u32, eqn: u8, mtt: u64, db: u64) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[0x0c..0x10].copy_from_slice(&(u32::from(log_nent) << 24 | uar).to_be_bytes());
    b[0x17] = eqn;
    let a = mtt * 8;
    b[0x1b] = (a >> 32) as u8;
    b[0x1c..0x20].copy_from_slice(&(a as u32).to_be_bytes());
    b[0x38..0x40].copy_from_slice(&db.to_be_bytes());
    b
}

/// Creates CQ `cqn` reporting to `eqn`.
pub fn create_cq(r: &mut Raw, cqn: u32, log_nent: u8, eqn: u8) -> R<Queue> {
    let bytes = 32usize << log_nent;
    let q = queue(r, bytes.div_ceil(4096))?;
    let db = r.pages(1)[0];
    r.cmd_in(
        &cq_ctx(log_nent, profile::UAR, eqn, q.mtt, db),
        cqn,
        0,
        Opcode::SW2HW_CQ,
    )?;
    Ok(q)
}

/// dMPT entry as Linux's mlx4_mr_enable writes it.
pub fn mpt_entry(idx: u32, pd: u32, physical: bool, start: u64, len: u64, mtt: u64) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    let mut flags = 0xf000_0000u32 | 1 << 17 | 1 << 8 | 1 << 10 | 1 << 11;
    if physical {
        flags |= 1 << 9;
    }
    b[0..4].copy_from_slice(&flags.to_be_bytes());
    b[0x08..0x0c].copy_from_slice(&idx.to_be_bytes());
    b[0x0c..0x10].copy_from_slice(&(pd | 3 << 24).to_be_bytes());
    b[0x10..0x18].copy_from_slice(&start.to_be_bytes());
    b[0x18..0x20].copy_from_slice(&len.to_be_bytes());
    if !physical {
        b[0x2c..0x34].copy_from_slice(&(mtt * 8).to_be_bytes());
    }
    b[0x38..0x3c].copy_from_slice(&12u32.to_be_bytes());
    b
}

/// SRQ context as Linux's mlx4_srq_alloc writes it.
pub fn srq_ctx(srqn: u32, log_size: u8, log_stride: u8, pd: u32, mtt: u64, db: u64) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[0..4].copy_from_slice(&(u32::from(log_size) << 24 | srqn).to_be_bytes());
    b[4] = log_stride;
    let a = mtt * 8;
    b[0x13] = (a >> 32) as u8;
    b[0x14..0x18].copy_from_slice(&(a as u32).to_be_bytes());
    b[0x18..0x1c].copy_from_slice(&pd.to_be_bytes());
    b[0x28..0x30].copy_from_slice(&db.to_be_bytes());
    b
}

/// QP modify mailbox: optpar, reserved, then the context.
pub struct QpMbox(pub Vec<u8>);

impl QpMbox {
    pub fn new(state: u8, st: u8) -> QpMbox {
        let mut b = vec![0u8; 256];
        b[8..12].copy_from_slice(
            &(u32::from(state) << 28 | u32::from(st) << 16 | 3 << 11).to_be_bytes(),
        );
        QpMbox(b)
    }
    pub fn u32(mut self, ctx_off: usize, v: u32) -> Self {
        self.0[8 + ctx_off..12 + ctx_off].copy_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u8(mut self, ctx_off: usize, v: u8) -> Self {
        self.0[8 + ctx_off] = v;
        self
    }
    pub fn u64(mut self, ctx_off: usize, v: u64) -> Self {
        self.0[8 + ctx_off..16 + ctx_off].copy_from_slice(&v.to_be_bytes());
        self
    }
    pub fn optpar(mut self, v: u32) -> Self {
        self.0[0..4].copy_from_slice(&v.to_be_bytes());
        self
    }
}

/// RST2INIT mailbox for a QP of service type `st` with 2^6 x 64-byte SQ
/// and 2^6 x 16-byte RQ WQEs on one page.
pub fn rst2init(qpn: u32, st: u8, pd: u32, cqn: u32, mtt: u64, db: u64) -> QpMbox {
    QpMbox::new(1, st)
        .u32(0x04, pd)
        .u8(0x08, 5 << 5 | 12)
        .u8(0x09, 6 << 3)
        .u8(0x0a, 6 << 3 | 2)
        .u8(0x0b, 1 << 4)
        .u32(0x0c, profile::UAR)
        .u32(0x10, qpn)
        .u32(0x7c, cqn)
        .u32(0x9c, cqn)
        .u64(0xa0, db)
        .u32(0xa8, 0x8001_0000)
        .u8(0xcb, ((mtt * 8) >> 32) as u8)
        .u32(0xcc, (mtt * 8) as u32)
        .optpar(1 << 4 | 1 << 5)
}

/// Creates a QP in INIT: one buffer page (64 x 16 B RQ + 64 x 64 B SQ = 5 KiB
/// -> 2 pages).
pub fn create_qp(r: &mut Raw, qpn: u32, st: u8, cqn: u32) -> R<Queue> {
    let q = queue(r, 2)?;
    let db = r.pages(1)[0];
    let m = rst2init(qpn, st, PD, cqn, q.mtt, db);
    r.cmd_in(&m.0, qpn, 0, Opcode::RST2INIT_QP)?;
    Ok(q)
}

/// Linux's whole bring-up: [`init`], then [`init_after_hca`].
pub fn init_full(r: &mut Raw) -> R<(Queue, Queue)> {
    init(r)?;
    init_after_hca(r)
}

/// The rest of Linux's bring-up after INIT_HCA: async + completion EQ,
/// MAP_EQ, arm, NOP, CONF_SPECIAL_QP, port caps via MAD_IFC, SET_PORT.
pub fn init_after_hca(r: &mut Raw) -> R<(Queue, Queue)> {
    use profile::*;
    let comp = create_eq(r, FIRST_EQ, 6)?;
    let asy = create_eq(r, FIRST_EQ + 1, 9)?;
    r.cmd(ASYNC_MASK, FIRST_EQ + 1, 0, Opcode::MAP_EQ)?;
    eq_doorbell(r, FIRST_EQ, 0, true);
    eq_doorbell(r, FIRST_EQ + 1, 0, true);
    r.cmd(0, 0x1f, 0, Opcode::NOP)?;
    r.cmd(0, BASE_SQPN, 0, Opcode::CONF_SPECIAL_QP)?;
    for port in 1..=2u32 {
        let out = r.cmd_box(&smp_get(0x0015, port), port, 3, Opcode::MAD_IFC)?;
        let cap = u32::from_be_bytes(out[84..88].try_into().unwrap());
        let mut sp = vec![0u8; 256];
        sp[0..4].copy_from_slice(&(1u32 << 22 | 1 << 21 | 5 << 12 | 8 << 4).to_be_bytes());
        sp[4..8].copy_from_slice(&cap.to_be_bytes());
        r.cmd_in(&sp, port, 0, Opcode::SET_PORT)?;
    }
    Ok((comp, asy))
}

/// Linux's async event mask (porting map 6.7), without PORT_MNG_CHG.
pub const ASYNC_MASK: u64 = 1 << 0x01
    | 1 << 0x02
    | 1 << 0x03
    | 1 << 0x04
    | 1 << 0x05
    | 1 << 0x06
    | 1 << 0x07
    | 1 << 0x10
    | 1 << 0x11
    | 1 << 0x09
    | 1 << 0x0e
    | 1 << 0x12
    | 1 << 0x13
    | 1 << 0x14
    | 1 << 0x0a
    | 1 << 0x18
    | 1 << 0x1c
    | 1 << 0x1b
    | 1 << 0x08
    | 1 << 0x0f;

/// A LID-routed SubnGet MAD.
pub fn smp_get(attr: u16, attr_mod: u32) -> Vec<u8> {
    let mut m = vec![0u8; 256];
    m[0] = 1;
    m[1] = 0x01;
    m[2] = 1;
    m[3] = 0x01;
    m[8..16].copy_from_slice(&0x1234u64.to_be_bytes());
    m[0x10..0x12].copy_from_slice(&attr.to_be_bytes());
    m[0x14..0x18].copy_from_slice(&attr_mod.to_be_bytes());
    m
}

/// Every ICM region `init` maps, for UNMAP_ICM at teardown.
pub const ICM_REGIONS: [(u64, u32); 14] = {
    use profile::*;
    [
        (CMPT, 4),
        (CMPT + CMPT_TYPE, 2),
        (CMPT + 2 * CMPT_TYPE, 4),
        (CMPT + 3 * CMPT_TYPE, 1),
        (EQC, 1),
        (MTT, 8),
        (DMPT, 4),
        (QPC, 16),
        (AUXC, 4),
        (ALTC, 8),
        (RDMARC, 32),
        (CQC, 4),
        (SRQC, 2),
        (MC, 4),
    ]
};

/// CLOSE_HCA's aftermath in Linux: UNMAP_ICM per table, UNMAP_ICM_AUX,
/// UNMAP_FA.
pub fn unmap_all(r: &mut Raw) -> R {
    for (va, n) in ICM_REGIONS {
        r.cmd(va, n, 0, Opcode::UNMAP_ICM)?;
    }
    r.cmd(0, 0, 0, Opcode::UNMAP_ICM_AUX)?;
    r.cmd(0, 0, 0, Opcode::UNMAP_FA)
}

/// A SubnSet(PortInfo) carrying `data` (the 64-byte attribute).
pub fn port_info_set_smp(port: u8, data: &[u8]) -> Vec<u8> {
    let mut m = smp_get(0x0015, u32::from(port));
    m[3] = 0x02;
    m[0x40..0x40 + data.len()].copy_from_slice(data);
    m
}

/// What an SM does to one port, by SMPs the port receives from the link
/// (`SimHca::sma_receive`, the firmware SMA with every check on): reads
/// PortInfo, then `edit`s it and sends it back as a SubnSet. Returns the
/// SMA's response status and the PortInfo it reports.
pub fn sm_port_info(
    sim: &SimHca,
    port: u8,
    edit: impl FnOnce(&mut [u8]),
) -> Result<(u16, Vec<u8>), sim::front::in_process::SmpDropped> {
    let got = sim.sma_receive(port, &smp_get(0x0015, u32::from(port)))?;
    let mut d = got[0x40..0x80].to_vec();
    // PortState and PortPhysicalState 0 = no change; everything else as read.
    d[32] &= 0xf0;
    d[33] &= 0x0f;
    edit(&mut d);
    let out = sim.sma_receive(port, &port_info_set_smp(port, &d))?;
    Ok((
        u16::from_be_bytes([out[4], out[5]]) & 0x7fff,
        out[0x40..0x80].to_vec(),
    ))
}

/// Asks the SMA for PortState `state` (1 Down, 3 Armed, 4 Active) on `port`;
/// returns the MAD status (0 accepted, 0x1c refused).
pub fn sm_set_state(
    sim: &SimHca,
    port: u8,
    state: u8,
) -> Result<u16, sim::front::in_process::SmpDropped> {
    sm_port_info(sim, port, |d| d[32] |= state & 0xf).map(|(st, _)| st)
}

/// An SM bringing a port up as OpenSM does: one SubnSet(PortInfo) with the
/// LID and SM LID (state unchanged), then Armed, then Active, each a
/// separate Set. Panics (test fixture) with the step that failed.
pub fn sm_activate(sim: &SimHca, port: u8, lid: u16, sm_lid: u16) {
    let (st, _) = sm_port_info(sim, port, |d| {
        d[16..18].copy_from_slice(&lid.to_be_bytes());
        d[18..20].copy_from_slice(&sm_lid.to_be_bytes());
    })
    .unwrap_or_else(|e| panic!("port {port}: LID set dropped: {e:?}"));
    assert_eq!(st, 0, "port {port}: LID set refused");
    for state in [3, 4] {
        let st = sm_set_state(sim, port, state)
            .unwrap_or_else(|e| panic!("port {port}: PortState {state} dropped: {e:?}"));
        assert_eq!(st, 0, "port {port}: PortState {state} refused");
    }
}
