//! A unit-test fake of a ConnectX-3 (not a port of anything).
//!
//! It answers every firmware command with a programmable status and canned
//! query mailboxes, so bring-up, unwinding and the resource paths can be
//! tested without the device model.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};
use core::time::Duration;
use std::sync::Mutex;

use hal::be::*;
use hal::fake::{ArenaDma, FakeClock, MemBar, MemConfig};
use hal::{Bar, BarInfo, BarKind, BusAddr, DmaPool, PciAddress, PciFunction, RegisterBackend};
use mlx4_hw::fw::dev_cap::*;
use mlx4_hw::hcr::*;

/// Catastrophic error buffer offset in BAR0.
pub const CATAS_OFFSET: usize = 0x2000;

#[derive(Default)]
pub struct Faults {
    /// (opcode, status) applied to the first post of that opcode.
    pub status: Option<(u16, u8)>,
    /// GO never clears for this opcode.
    pub stuck: Option<u16>,
    /// QUERY_DEV_CAP byte overrides.
    pub dev_cap: Vec<(usize, u8)>,
    /// The n-th command posted (0-based) fails with this status.
    pub fail_at: Option<(usize, u8)>,
    /// The n-th command posted never completes.
    pub stuck_at: Option<usize>,
}

pub struct FakeDev {
    bar0: MemBar,
    mgm: Mutex<std::collections::BTreeMap<u32, Vec<u8>>>,
    dma: Arc<ArenaDma>,
    pub posted: Mutex<Vec<(u16, u8, u32)>>,
    pub faults: Mutex<Faults>,
    /// The last INIT_HCA mailbox.
    pub init_hca: Mutex<Vec<u8>>,
    hcr: [AtomicU32; 7],
}

impl FakeDev {
    fn be(&self, i: usize) -> u32 {
        u32::from_be(self.hcr[i].load(Ordering::SeqCst))
    }

    fn mailbox_out(&self, addr: u64, data: &[u8]) {
        self.dma.device_write(BusAddr(addr), data).unwrap();
    }

    pub fn dev_cap() -> [u8; 0x100] {
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

    fn execute(&self, op: u16, in_param: u64, out_param: u64, in_mod: u32) -> (u8, u64) {
        match op {
            0x004 => {
                let mut o = [0u8; 0x100];
                put_be16(&mut o, 0, 16); // fw_pages
                put_be16(&mut o, 2, 2);
                put_be16(&mut o, 4, 5000);
                put_be16(&mut o, 6, 42);
                put_be16(&mut o, 0x0a, 3);
                put_be64(&mut o, 0x30, CATAS_OFFSET as u64);
                put_be32(&mut o, 0x38, 4);
                self.mailbox_out(out_param, &o);
            }
            0x003 => {
                let mut o = Self::dev_cap();
                for &(off, v) in &self.faults.lock().unwrap().dev_cap {
                    o[off] = v;
                }
                self.mailbox_out(out_param, &o);
            }
            0x043 => {
                let mut o = [0u8; 0x40];
                o[0] = 1;
                o[1] = 5;
                o[7] = 0x70;
                o[0x0b] = 4;
                self.mailbox_out(out_param, &o);
            }
            0x006 => {
                let mut o = [0u8; 0x120];
                let s = b"MT_1090120019\0\0\0";
                for i in 0..4 {
                    for j in 0..4 {
                        o[0x20 + 0xd0 + i * 4 + j] = s[i * 4 + 3 - j];
                    }
                }
                self.mailbox_out(out_param, &o);
            }
            0xffd => return (0, 8),
            0x007 => {
                let mut b = vec![0u8; 0x200];
                self.dma.device_read(BusAddr(in_param), &mut b).unwrap();
                *self.init_hca.lock().unwrap() = b;
            }
            0x027 => {
                let mut gid = [0u8; 16];
                self.dma.device_read(BusAddr(in_param), &mut gid).unwrap();
                // Few buckets: collisions build AMGM chains.
                return (0, u64::from(gid[15] % 4));
            }
            0x025 => {
                let e = self
                    .mgm
                    .lock()
                    .unwrap()
                    .get(&in_mod)
                    .cloned()
                    .unwrap_or_else(|| vec![0; 1024]);
                self.mailbox_out(out_param, &e);
            }
            0x026 => {
                let mut e = vec![0u8; 1024];
                self.dma.device_read(BusAddr(in_param), &mut e).unwrap();
                self.mgm.lock().unwrap().insert(in_mod, e);
            }
            0x024 => {
                let mut o = [0u8; 256];
                put_be32(&mut o, 84, 0x0251_0868);
                self.mailbox_out(out_param, &o);
            }
            _ => {}
        }
        let _ = (in_param, in_mod);
        (0, 0)
    }
}

impl RegisterBackend for FakeDev {
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
        let op_mod = ((w >> 12) & 0xf) as u8;
        let in_param = (u64::from(self.be(0)) << 32) | u64::from(self.be(1));
        let out_param = (u64::from(self.be(3)) << 32) | u64::from(self.be(4));
        let in_mod = self.be(2);
        let n = {
            let mut p = self.posted.lock().unwrap();
            p.push((op, op_mod, in_mod));
            p.len() - 1
        };
        let mut f = self.faults.lock().unwrap();
        if f.stuck == Some(op) || f.stuck_at == Some(n) {
            return;
        }
        let forced = match (f.status, f.fail_at) {
            (Some((o, s)), _) if o == op => {
                f.status = None;
                Some(s)
            }
            (_, Some((k, s))) if k == n => Some(s),
            _ => None,
        };
        drop(f);
        let (status, imm) = match forced {
            Some(s) => (s, 0),
            None => self.execute(op, in_param, out_param, in_mod),
        };
        if imm != 0 || op == 0x027 {
            self.hcr[3].store(((imm >> 32) as u32).to_be(), Ordering::SeqCst);
            self.hcr[4].store((imm as u32).to_be(), Ordering::SeqCst);
        }
        let t = w & (1 << HCR_T_BIT);
        self.hcr[6].store(((u32::from(status) << 24) | t).to_be(), Ordering::SeqCst);
    }
}

pub struct Rig {
    pub dev: Arc<FakeDev>,
    pub pool: DmaPool,
    pub clock: Arc<FakeClock>,
    pub bar2: Arc<MemBar>,
}

impl Rig {
    pub fn new() -> Rig {
        let dma = Arc::new(ArenaDma::new(64 << 20));
        let dev = Arc::new(FakeDev {
            bar0: MemBar::new(1 << 20),
            mgm: Mutex::new(Default::default()),
            dma: dma.clone(),
            posted: Mutex::new(Vec::new()),
            faults: Mutex::new(Faults::default()),
            init_hca: Mutex::new(Vec::new()),
            hcr: Default::default(),
        });
        Rig {
            dev,
            pool: DmaPool::new(dma),
            clock: Arc::new(FakeClock::with_relax_step(Duration::from_micros(50))),
            bar2: Arc::new(MemBar::new(8 << 20)),
        }
    }

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

    pub fn ops(&self) -> Vec<u16> {
        self.dev
            .posted
            .lock()
            .unwrap()
            .iter()
            .map(|p| p.0)
            .collect()
    }

    pub fn set_catas(&self, v: u32) {
        self.dev.bar0.write32(CATAS_OFFSET, v.to_be());
    }
}

impl FakeDev {
    /// Non-empty MGM/AMGM entries: index -> (members, next).
    pub fn mgm_entries(&self) -> Vec<(u32, u32, u32)> {
        self.mgm
            .lock()
            .unwrap()
            .iter()
            .map(|(&i, e)| (i, get_be32(e, 4) & 0xff_ffff, get_be32(e, 0) >> 6))
            .filter(|&(_, n, next)| n != 0 || next != 0)
            .collect()
    }
}
