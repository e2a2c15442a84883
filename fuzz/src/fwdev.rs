//! A ConnectX-3 stand-in for mlx4_core's bring-up whose firmware answers come from the fuzzer: the HCR protocol done right, every query mailbox a good ConnectX-3 answer with the input's bytes written over it, and any command failing with the input's status.
//!
//! Written for the fuzz targets (the answers are the same facts as
//! mlx4_core's unit-test fake, `drivers/mlx4/core/src/tests/testdev.rs`);
//! the multicast commands keep a small MGM table as the firmware would.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hal::be::*;
use hal::fake::{ArenaDma, FakeClock, MemConfig};
use hal::{Bar, BarInfo, BarKind, BusAddr, DmaPool, PciAddress, PciFunction, RegisterBackend};
use mlx4_hw::fw::dev_cap::*;
use mlx4_hw::hcr::*;

/// What the firmware answers.
#[derive(Debug, Default, Clone)]
pub struct Answers {
    /// (opcode, offset, byte) written over that query's good answer.
    pub patches: Vec<(u16, usize, u8)>,
    /// The n-th command posted completes with this status.
    pub fail: Vec<(usize, u8)>,
    /// SET_ICM_SIZE's answer (aux pages), if not 8.
    pub aux_pages: Option<u64>,
}

/// A BAR that reads back what was written and zero elsewhere, keeping only
/// the words written: a zeroed `MemBar` without zeroing megabytes per input
/// (the BARs are 9 MiB; the bring-up writes a few hundred words).
#[derive(Default)]
pub struct SparseBar {
    words: Mutex<BTreeMap<usize, u32>>,
}

impl RegisterBackend for SparseBar {
    fn read32(&self, offset: usize) -> u32 {
        let w = self.words.lock().unwrap_or_else(|e| e.into_inner());
        w.get(&offset).copied().unwrap_or(0)
    }
    fn write32(&self, offset: usize, value: u32) {
        let mut w = self.words.lock().unwrap_or_else(|e| e.into_inner());
        w.insert(offset, value);
    }
}

pub struct FwDev {
    bar0: SparseBar,
    dma: Arc<ArenaDma>,
    hcr: [AtomicU32; 7],
    mgm: Mutex<BTreeMap<u32, Vec<u8>>>,
    answers: Answers,
    posted: AtomicU32,
}

/// QUERY_DEV_CAP of a ConnectX-3 (log2 counts, entry sizes).
pub fn good_dev_cap() -> [u8; 0x100] {
    let mut o = [0u8; 0x100];
    o[MAX_SRQ_SZ] = 15;
    o[MAX_QP_SZ] = 14;
    o[RSVD_QP] = 6;
    o[MAX_QP] = 18;
    o[RSVD_SRQ] = 6 << 4;
    o[MAX_SRQ] = 16;
    o[MAX_CQ_SZ] = 22;
    o[RSVD_CQ] = 7;
    o[MAX_CQ] = 16;
    o[MAX_MPT] = 20;
    o[RSVD_EQ] = 4;
    o[MAX_EQ] = 9;
    o[RSVD_MTT] = 4 << 4;
    o[MAX_MRW_SZ] = 40;
    o[RSVD_MRW] = 4;
    o[MAX_MTT_SEG] = 24;
    o[VL_PORT] = 2;
    o[MAX_MSG_SZ] = 30;
    o[RSVD_UAR] = 1 << 4;
    o[UAR_SZ] = 3;
    o[PAGE_SZ] = 12;
    o[MAX_SG_RQ] = 32;
    o[MAX_SG_SQ] = 32;
    o[RSVD_PD] = 4 << 4;
    o[MAX_PD] = 17;
    o[MAX_REQ_QP] = 4;
    o[MAX_RES_QP] = 4;
    for (off, v) in [
        (RDMARC_ENTRY_SZ, 32u16),
        (QPC_ENTRY_SZ, 256),
        (AUX_ENTRY_SZ, 64),
        (ALTC_ENTRY_SZ, 64),
        (EQC_ENTRY_SZ, 64),
        (CQC_ENTRY_SZ, 64),
        (SRQ_ENTRY_SZ, 64),
        (C_MPT_ENTRY_SZ, 64),
        (MTT_ENTRY_SZ, 8),
        (D_MPT_ENTRY_SZ, 64),
        (MAX_DESC_SZ_SQ, 1008),
        (MAX_DESC_SZ_RQ, 512),
    ] {
        put_be16(&mut o, off, v);
    }
    put_be64(&mut o, MAX_ICM_SZ, 1 << 40);
    o
}

/// Offset of the catastrophic error buffer in BAR0.
pub const CATAS_OFFSET: usize = 0x2000;

impl FwDev {
    fn be(&self, i: usize) -> u32 {
        u32::from_be(self.hcr[i].load(Ordering::SeqCst))
    }

    fn out(&self, op: u16, addr: u64, good: &[u8]) {
        let mut o = good.to_vec();
        for &(pop, off, v) in &self.answers.patches {
            if pop == op && !o.is_empty() {
                let n = o.len();
                o[off % n] = v;
            }
        }
        // A mailbox outside memory is the driver's bug, not the device's.
        let _ = self.dma.device_write(BusAddr(addr), &o);
    }

    fn execute(&self, op: u16, in_param: u64, out_param: u64, in_mod: u32) -> u64 {
        match op {
            // QUERY_FW
            0x004 => {
                let mut o = [0u8; 0x100];
                put_be16(&mut o, 0, 16); // fw_pages
                put_be16(&mut o, 2, 2);
                put_be16(&mut o, 4, 5000);
                put_be16(&mut o, 6, 42);
                put_be16(&mut o, 0x0a, 3);
                put_be64(&mut o, 0x30, CATAS_OFFSET as u64);
                put_be32(&mut o, 0x38, 4);
                self.out(op, out_param, &o);
            }
            // QUERY_DEV_CAP
            0x003 => self.out(op, out_param, &good_dev_cap()),
            // QUERY_PORT
            0x043 => {
                let mut o = [0u8; 0x40];
                o[0] = 1;
                o[1] = 5;
                o[7] = 0x70;
                o[0x0b] = 4;
                self.out(op, out_param, &o);
            }
            // QUERY_ADAPTER
            0x006 => {
                let mut o = [0u8; 0x120];
                let s = b"MT_1090120019\0\0\0";
                for i in 0..4 {
                    for j in 0..4 {
                        o[0x20 + 0xd0 + i * 4 + j] = s[i * 4 + 3 - j];
                    }
                }
                self.out(op, out_param, &o);
            }
            // QUERY_HCA
            0x00b => self.out(op, out_param, &[0u8; 0x100]),
            // SET_ICM_SIZE: aux pages.
            0xffd => return self.answers.aux_pages.unwrap_or(8),
            // MGID_HASH: few buckets, so collisions build AMGM chains.
            0x027 => {
                let mut gid = [0u8; 16];
                let _ = self.dma.device_read(BusAddr(in_param), &mut gid);
                return u64::from(gid[15] % 4);
            }
            // READ_MCG
            0x025 => {
                let e = self
                    .mgm
                    .lock()
                    .unwrap()
                    .get(&in_mod)
                    .cloned()
                    .unwrap_or_else(|| vec![0; 1024]);
                self.out(op, out_param, &e);
            }
            // WRITE_MCG
            0x026 => {
                let mut e = vec![0u8; 1024];
                let _ = self.dma.device_read(BusAddr(in_param), &mut e);
                self.mgm.lock().unwrap().insert(in_mod, e);
            }
            // MAD_IFC: a PortInfo answer.
            0x024 => {
                let mut o = [0u8; 256];
                put_be32(&mut o, 84, 0x0251_0868);
                self.out(op, out_param, &o);
            }
            _ => {}
        }
        0
    }
}

impl RegisterBackend for FwDev {
    fn read32(&self, off: usize) -> u32 {
        if (HCR_BASE..HCR_BASE + HCR_SIZE).contains(&off) {
            return self.hcr[(off - HCR_BASE) / 4].load(Ordering::SeqCst);
        }
        self.bar0.read32(off)
    }
    fn write32(&self, off: usize, v: u32) {
        if !(HCR_BASE..HCR_BASE + HCR_SIZE).contains(&off) {
            return self.bar0.write32(off, v);
        }
        let i = (off - HCR_BASE) / 4;
        self.hcr[i].store(v, Ordering::SeqCst);
        if i != 6 {
            return;
        }
        let w = u32::from_be(v);
        let op = (w & 0xfff) as u16;
        let in_param = (u64::from(self.be(0)) << 32) | u64::from(self.be(1));
        let out_param = (u64::from(self.be(3)) << 32) | u64::from(self.be(4));
        let in_mod = self.be(2);
        let n = self.posted.fetch_add(1, Ordering::SeqCst) as usize;
        let forced = self
            .answers
            .fail
            .iter()
            .find(|(k, _)| *k == n)
            .map(|&(_, s)| s);
        let (status, imm) = match forced {
            Some(s) => (s, 0),
            None => (0, self.execute(op, in_param, out_param, in_mod)),
        };
        if imm != 0 || op == 0x027 {
            self.hcr[3].store(((imm >> 32) as u32).to_be(), Ordering::SeqCst);
            self.hcr[4].store((imm as u32).to_be(), Ordering::SeqCst);
        }
        let t = w & (1 << HCR_T_BIT);
        self.hcr[6].store(((u32::from(status) << 24) | t).to_be(), Ordering::SeqCst);
    }
}

thread_local! {
    /// The DMA arena of the last rig (zeroing megabytes per input was most
    /// of a run's cost).
    static ARENA: std::cell::RefCell<Option<Arc<ArenaDma>>> = const { std::cell::RefCell::new(None) };
}

/// An arena of `len` bytes: the last rig's if it is that size and nothing
/// holds it any more. Reuse needs nothing of it handed out
/// ([`FwRig::dma_in_use`] is what the targets check before they return),
/// and the allocator zeroes what it hands out, so an input sees the same
/// memory either way; `LEGOIB_FUZZ_FRESH` takes a new one every time.
fn arena(len: usize) -> Arc<ArenaDma> {
    let fresh = std::env::var_os("LEGOIB_FUZZ_FRESH").is_some();
    ARENA.with(|a| {
        let mut a = a.borrow_mut();
        match a.as_ref() {
            Some(d)
                if !fresh && Arc::strong_count(d) == 1 && d.len() == len.div_ceil(4096) * 4096 =>
            {
                d.clone()
            }
            _ => {
                let d = Arc::new(ArenaDma::new(len));
                *a = Some(d.clone());
                d
            }
        }
    })
}

/// The device, its DMA memory and clock.
pub struct FwRig {
    pub dev: Arc<FwDev>,
    pub pool: DmaPool,
    pub clock: Arc<FakeClock>,
    pub bar2: Arc<SparseBar>,
}

impl FwRig {
    /// A device answering `answers`, with `dma_len` bytes of DMA memory.
    pub fn new(answers: Answers, dma_len: usize) -> FwRig {
        let dma = arena(dma_len);
        let dev = Arc::new(FwDev {
            bar0: SparseBar::default(),
            dma: dma.clone(),
            hcr: Default::default(),
            mgm: Mutex::new(BTreeMap::new()),
            answers,
            posted: AtomicU32::new(0),
        });
        FwRig {
            dev,
            pool: DmaPool::new(dma),
            clock: Arc::new(FakeClock::with_relax_step(Duration::from_micros(50))),
            bar2: Arc::new(SparseBar::default()),
        }
    }

    /// What the driver still holds of the DMA memory: (allocations, bytes).
    pub fn dma_in_use(&self) -> (usize, usize) {
        let s = self.pool.stats();
        (s.allocations, s.bytes)
    }

    /// The PCI function (15b3:1003, BAR0 1 MiB, BAR2 8 MiB).
    pub fn pdev(&self) -> PciFunction {
        let cfg = Arc::new(MemConfig::new());
        cfg.set32(0, 0x1003_15b3);
        let info = |index, size| {
            Some(BarInfo {
                index,
                kind: BarKind::Memory64,
                prefetchable: false,
                addr: 0xf000_0000,
                size,
            })
        };
        PciFunction::new(
            PciAddress {
                bus: 3,
                ..Default::default()
            },
            cfg,
            [info(0, 1 << 20), None, info(2, 8 << 20), None, None, None],
            [
                Some(Bar::from_backend(self.dev.clone(), 1 << 20)),
                None,
                Some(Bar::from_backend(self.bar2.clone(), 8 << 20)),
                None,
                None,
                None,
            ],
        )
    }
}
