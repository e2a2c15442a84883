//! A raw command poster written from the PRM/Linux protocol description, and
//! a small-profile Linux-order bring-up the other tests build on.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use hal::{Bar, Clock, DmaBuf, DmaPool, PciFunction};
use sim::layout::{InitHca, PageEntry, put64};
use sim::{Opcode, SimConfig, SimHca, Status};

pub const HCR: usize = 0x8_0680;
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

    /// Writes an MTT entry straight into ICM (as native Linux does): finds
    /// the host page backing `icm_va` through the harness's own record.
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
    pub const CQC: u64 = 0x1_0004_2000;
    pub const EQC: u64 = 0x1_0004_6000;
    pub const DMPT: u64 = 0x1_0004_7000;
    pub const MTT: u64 = 0x1_0004_b000;
    pub const MC: u64 = 0x1_0005_3000;
    pub const END: u64 = 0x1_0005_7000;
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
    let fw = r.cmd_out(0, 0, Opcode::QUERY_FW)?;
    let fw_pages = u16::from_be_bytes([fw[0], fw[1]]) as usize;
    let pas = r.pages(fw_pages);
    let e: Vec<_> = pas
        .iter()
        .map(|&pa| PageEntry {
            va: 0,
            pa,
            log_size: 0,
        })
        .collect();
    r.map_pages(Opcode::MAP_FA, &e)?;
    r.cmd(0, 0, 0, Opcode::RUN_FW)
}

/// Linux-order bring-up with the small profile, up to INIT_HCA and
/// QUERY_ADAPTER (Linux steps 2..15).
pub fn init(r: &mut Raw) -> R {
    use profile::*;
    load_fw(r)?;
    let mut stat = vec![0u8; 0x100];
    stat[2] = 1;
    r.cmd_in(&stat, 0, 0, Opcode::MOD_STAT_CFG)?;
    r.cmd_out(0, 0, Opcode::QUERY_DEV_CAP)?;
    r.cmd_out(1, 0, Opcode::QUERY_PORT)?;
    r.cmd_out(2, 0, Opcode::QUERY_PORT)?;
    let aux = r.cmd_imm(ICM_SIZE, 0, 0, Opcode::SET_ICM_SIZE)?;
    let pas = r.pages(aux as usize);
    let e: Vec<_> = pas
        .iter()
        .map(|&pa| PageEntry {
            va: 0,
            pa,
            log_size: 0,
        })
        .collect();
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
    let ih = init_hca_params().encode();
    r.cmd_in(&ih, 0, 0, Opcode::INIT_HCA)?;
    r.cmd_out(0, 0, Opcode::QUERY_ADAPTER)?;
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
