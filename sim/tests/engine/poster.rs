//! Our own raw work-request poster, written from the PRM reading, never from `mlx4_ib`.
//!
//! Our own raw work-request poster, written from the PRM reading (porting
//! map 5-6, iPXE `MT25408_PRM.h`), never from `mlx4_ib`: CQs, QPs, SRQs and
//! MRs created with raw commands, WQEs built byte by byte, doorbells rung on
//! the UAR, CQEs and EQEs decoded here.

#![allow(dead_code)]

use std::time::Duration;

use hal::DmaBuf;
use sim::{Opcode, SimConfig, SimHca};

use crate::harness::{self, QpMbox, R, Raw, profile::*};

pub const RC: u8 = 0;
pub const UC: u8 = 1;
pub const UD: u8 = 3;
pub const MLX: u8 = 7;

pub const PD: u32 = 8;
/// A second PD (memory the QPs of PD must not reach).
pub const OTHER_PD: u32 = 9;
pub const COMP_EQ: u32 = FIRST_EQ;
pub const ASYNC_EQ: u32 = FIRST_EQ + 1;

/// Send opcodes (PRM).
pub mod op {
    pub const NOP: u8 = 0x00;
    pub const RDMA_WRITE: u8 = 0x08;
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    pub const SEND: u8 = 0x0a;
    pub const SEND_IMM: u8 = 0x0b;
    pub const LSO: u8 = 0x0e;
    pub const RDMA_READ: u8 = 0x10;
    pub const ATOMIC_CS: u8 = 0x11;
    pub const ATOMIC_FA: u8 = 0x12;
    pub const SEND_INVAL: u8 = 0x01;
    pub const BIND_MW: u8 = 0x18;
    pub const LOCAL_INVAL: u8 = 0x1b;
}

/// Access bits of a dMPT (PRM).
pub mod acc {
    pub const LW: u32 = 1 << 11;
    pub const RR: u32 = 1 << 12;
    pub const RW: u32 = 1 << 13;
    pub const RA: u32 = 1 << 14;
    pub const ALL: u32 = LW | RR | RW | RA;
    /// Bind enable (windows may be bound to the region).
    pub const BIND: u32 = 1 << 15;
}

/// The bind segment (32 bytes after the control segment; PRM reading:
/// flags1 with the remote rights in bits 31:29 (atomic, write, read),
/// flags2 with type 2 in bit 31 and zero-based in bit 30, the new R_Key,
/// the parent's L_Key, address, length). `rights` uses [`acc`] bits.
pub fn bind_seg(
    rkey: u32,
    lkey: u32,
    addr: u64,
    len: u64,
    rights: u32,
    type2: bool,
    zero_based: bool,
) -> Vec<u8> {
    let mut f1 = 0u32;
    if rights & acc::RR != 0 {
        f1 |= 1 << 29;
    }
    if rights & acc::RW != 0 {
        f1 |= 1 << 30;
    }
    if rights & acc::RA != 0 {
        f1 |= 1 << 31;
    }
    let f2 = u32::from(type2) << 31 | u32::from(zero_based) << 30;
    let mut b = Vec::with_capacity(32);
    b.extend_from_slice(&f1.to_be_bytes());
    b.extend_from_slice(&f2.to_be_bytes());
    b.extend_from_slice(&rkey.to_be_bytes());
    b.extend_from_slice(&lkey.to_be_bytes());
    b.extend_from_slice(&addr.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// The local-invalidate segment (32 bytes, the key at byte 8).
pub fn inval_seg(key: u32) -> Vec<u8> {
    let mut b = vec![0u8; 32];
    b[8..12].copy_from_slice(&key.to_be_bytes());
    b
}

/// A memory-window dMPT entry: no region bit, no access bits, no MTT;
/// type 1 with status 0, type 2 with status free, the bound-QP bit and
/// invalidation enabled.
pub fn mw_mpt(key: u32, pd: u32, type2: bool) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    if type2 {
        b[0..4].copy_from_slice(&(3u32 << 28).to_be_bytes());
        b[4..8].copy_from_slice(&(1u32 << 7).to_be_bytes());
    }
    b[0x08..0x0c].copy_from_slice(&key.rotate_left(24).to_be_bytes());
    let pdf = pd | if type2 { 3 << 24 } else { 0 };
    b[0x0c..0x10].copy_from_slice(&pdf.to_be_bytes());
    b
}

/// A decoded CQE (our reading of the PRM layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    pub qpn: u32,
    pub send: bool,
    pub opcode: u8,
    pub imm: u32,
    pub grh: bool,
    pub path_bits: u8,
    pub rqpn: u32,
    pub sl: u8,
    pub slid: u16,
    pub byte_cnt: u32,
    pub wqe_counter: u16,
    pub syndrome: u8,
    pub vendor: u8,
}

impl Cqe {
    pub fn ok(&self) -> bool {
        self.opcode != 0x1e
    }
    fn decode(b: &[u8; 32]) -> Cqe {
        let be32 = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
        let be16 = |o: usize| u16::from_be_bytes(b[o..o + 2].try_into().unwrap());
        let g = be32(8);
        Cqe {
            qpn: be32(0) & 0xff_ffff,
            send: b[31] & 0x40 != 0,
            opcode: b[31] & 0x1f,
            imm: be32(4),
            grh: g >> 31 != 0,
            path_bits: ((g >> 24) & 0x7f) as u8,
            rqpn: g & 0xff_ffff,
            sl: (be16(0xc) >> 12) as u8,
            slid: be16(0xe),
            byte_cnt: be32(0x14),
            wqe_counter: be16(0x18),
            syndrome: b[0x1b],
            vendor: b[0x1a],
        }
    }
}

/// A CQ with its buffer and doorbell record.
pub struct Cq {
    pub cqn: u32,
    pub nent: u32,
    pub buf: DmaBuf,
    pub db: DmaBuf,
    pub ci: u32,
    /// CQEs polled but not yet looked at.
    pub stash: Vec<Cqe>,
}

impl Cq {
    /// The next software-owned CQE, if any; advances the consumer index
    /// and writes the set_ci record.
    pub fn poll(&mut self) -> Option<Cqe> {
        let off = ((self.ci & (self.nent - 1)) * 32) as usize;
        let mut b = [0u8; 32];
        self.buf.read_bytes(off, &mut b);
        let parity = self.ci & self.nent != 0;
        if (b[31] & 0x80 != 0) != parity {
            return None;
        }
        self.ci = self.ci.wrapping_add(1);
        self.db.write_be32(0, self.ci & 0xff_ffff);
        Some(Cqe::decode(&b))
    }
    /// Every CQE available now.
    pub fn drain(&mut self) -> Vec<Cqe> {
        let mut v = core::mem::take(&mut self.stash);
        while let Some(c) = self.poll() {
            v.push(c);
        }
        v
    }
    /// Arms: cmd 2 next, cmd 1 solicited (CQ doorbell at UAR + 0x20),
    /// the arm doorbell record written first as Linux's `mlx4_cq_arm`
    /// does (`sn << 28 | cmd << 24 | ci`).
    pub fn arm(&self, r: &Raw, cmd: u32, sn: u32) {
        let dw0 = (sn & 3) << 28 | cmd << 24 | self.cqn;
        self.db
            .write_be32(4, (sn & 3) << 28 | cmd << 24 | (self.ci & 0xff_ffff));
        r.bar2
            .write_be32_pair(UAR as usize * 4096 + 0x20, dw0, self.ci & 0xff_ffff);
    }
}

/// A memory region seen by the host through its pages, in MTT order.
pub struct Mr {
    pub key: u32,
    pub iova: u64,
    pub len: u64,
    /// Host pages in the order the MTT maps them (None = physical MR).
    pub pages: Vec<DmaBuf>,
    pub phys: Option<DmaBuf>,
}

impl Mr {
    fn at(&self, off: u64) -> (&DmaBuf, usize, usize) {
        if let Some(p) = &self.phys {
            return (p, off as usize, usize::MAX);
        }
        let first = (self.iova % 4096) + off;
        let page = (first / 4096) as usize;
        let o = (first % 4096) as usize;
        (&self.pages[page], o, 4096 - o)
    }
    /// Host write at `off` bytes into the region.
    pub fn write(&self, mut off: u64, mut data: &[u8]) {
        while !data.is_empty() {
            let (b, o, room) = self.at(off);
            let n = data.len().min(room);
            b.write_bytes(o, &data[..n]);
            data = &data[n..];
            off += n as u64;
        }
    }
    /// Host read of `len` bytes at `off`.
    pub fn read(&self, mut off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let (b, o, room) = self.at(off);
            let n = (len - done).min(room);
            b.read_bytes(o, &mut v[done..done + n]);
            done += n;
            off += n as u64;
        }
        v
    }
    /// The address of byte `off`.
    pub fn addr(&self, off: u64) -> u64 {
        self.iova + off
    }
    /// The gather/scatter entry for `len` bytes at `off`.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr(off),
            len,
            lkey: self.key,
        }
    }
}

/// A gather/scatter entry.
#[derive(Debug, Clone, Copy)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// A send work request as our poster understands it.
#[derive(Debug, Clone, Default)]
pub struct Wr {
    pub opcode: u8,
    pub signalled: bool,
    pub solicited: bool,
    pub fence: bool,
    pub imm: u32,
    pub raddr: u64,
    pub rkey: u32,
    pub swap: u64,
    pub cmp: u64,
    pub sges: Vec<Sge>,
    pub inline: Option<Vec<u8>>,
    /// UD: (port, dlid, dqpn, qkey, sl, grh).
    pub ud: Option<Av>,
    /// Raw segment bytes appended as is (MLX headers, fuzzing).
    pub raw: Option<Vec<u8>>,
    /// Raw MLX flags dword (control segment dword 2) for QP0/QP1.
    pub mlx_flags: Option<(u32, u16)>,
    /// Raw bytes after the data segments (the MLX ICRC segment).
    pub tail: Option<Vec<u8>>,
}

impl Wr {
    /// A signalled SEND of `sges`.
    pub fn send(sges: Vec<Sge>) -> Wr {
        Wr {
            opcode: op::SEND,
            signalled: true,
            sges,
            ..Wr::default()
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Av {
    pub port: u8,
    pub dlid: u16,
    pub dqpn: u32,
    pub qkey: u32,
    pub sl: u8,
    pub path_bits: u8,
    pub force_lb: bool,
    /// The AV's GRH: source GID index, hop limit, traffic class, flow
    /// label, destination GID.
    pub grh: Option<(u8, u8, u8, u32, [u8; 16])>,
}

/// A QP with its buffer and doorbell record.
pub struct Qp {
    pub qpn: u32,
    pub st: u8,
    pub buf: DmaBuf,
    pub db: DmaBuf,
    pub sq_off: usize,
    pub sq_cnt: u32,
    pub sq_shift: u32,
    pub rq_off: usize,
    pub rq_cnt: u32,
    pub rq_shift: u32,
    pub sq_pi: u32,
    pub rq_pi: u16,
    pub srq: Option<u32>,
    pub mtt: u64,
    pub spec: QpSpec,
}

/// QP creation parameters.
#[derive(Debug, Clone, Copy)]
pub struct QpSpec {
    pub st: u8,
    pub sq_log: u8,
    pub sq_shift: u8,
    pub rq_log: u8,
    pub rq_shift: u8,
    pub srq: Option<u32>,
    /// No RQ at all (RQ size byte 0, as mlx4_en's send rings): only for
    /// raw Ethernet QPs, where the card reads it so.
    pub no_rq: bool,
    /// The RQ size/stride byte as written when it differs from what the
    /// geometry says: Linux mlx4_ib writes `0 - 4` (0xfc) for a QP on an
    /// SRQ (`rq.wqe_shift - 4` of an RQ it never sized).
    pub rq_ss: Option<u8>,
    pub scq: u32,
    pub rcq: u32,
    pub port: u8,
    pub access: u32,
    pub mtu: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub ack_timeout: u8,
    pub qkey: u32,
    pub pkey_index: u8,
    pub pd: u32,
}

impl QpSpec {
    pub fn new(st: u8, cq: u32) -> QpSpec {
        QpSpec {
            st,
            sq_log: 6,
            sq_shift: 7,
            rq_log: 6,
            rq_shift: 6,
            srq: None,
            no_rq: false,
            rq_ss: None,
            scq: cq,
            rcq: cq,
            port: 1,
            access: 1 << 15 | 1 << 14 | 1 << 13,
            mtu: 5,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            ack_timeout: 10,
            qkey: 0x1111_2222,
            pkey_index: 0,
            pd: PD,
        }
    }
}

/// The device with its fixtures.
pub struct Hca {
    pub r: Raw,
    pub comp: harness::Queue,
    pub asy: harness::Queue,
    pub next_cqn: u32,
    pub next_mpt: u32,
    pub async_ci: u32,
    pub comp_ci: u32,
    pub lid: u16,
}

pub fn wait_steps(r: &Raw, d: Duration) {
    // Polling with the driver's clock: relax steps the engines.
    let deadline = hal::Deadline::after(&*r.clock, d);
    while !deadline.expired(&*r.clock) {
        r.clock.relax();
    }
}

impl Hca {
    pub fn new() -> Hca {
        Self::with(SimHca::new(SimConfig::default()))
    }

    pub fn with(sim: SimHca) -> Hca {
        let mut h = Self::bare(sim);
        h.port_up(1, 0x11).unwrap();
        h
    }

    /// Asserts that the model saw no driver mistake (the violations are
    /// the message).
    #[track_caller]
    pub fn assert_no_violations(&self) {
        let v = self.r.sim.violations();
        assert!(v.is_empty(), "{v:?}");
    }

    /// Brought up to the ports (EQs, CONF_SPECIAL_QP, SET_PORT), ports
    /// still closed.
    pub fn bare(sim: SimHca) -> Hca {
        Self::bare_raw(Raw::with(sim))
    }

    /// [`Hca::bare`] over a poster built already (a device in another
    /// process: [`Raw::over`]).
    pub fn bare_raw(mut r: Raw) -> Hca {
        let eqs = harness::init_full(&mut r).unwrap();
        Self::brought_up(r, eqs)
    }

    /// The poster over a card brought up to the ports already, with `comp`
    /// and `asy` its completion and async EQs; no CQ, MPT or LID yet.
    pub fn brought_up(r: Raw, (comp, asy): (harness::Queue, harness::Queue)) -> Hca {
        Hca {
            r,
            comp,
            asy,
            next_cqn: FIRST_CQ,
            next_mpt: FIRST_MPT,
            async_ci: 0,
            comp_ci: 0,
            lid: 0,
        }
    }

    /// INIT_PORT, then the SM's job done by SMPs through MAD_IFC:
    /// LID + Armed, then Active.
    pub fn port_up(&mut self, port: u8, lid: u16) -> R {
        self.r.cmd(0, u32::from(port), 0, Opcode::INIT_PORT)?;
        self.activate(port, lid)
    }

    /// The SM's part: SubnSet(PortInfo) with the LID and Armed, then Active,
    /// through the firmware SMA (MAD_IFC).
    pub fn activate(&mut self, port: u8, lid: u16) -> R {
        let get = harness::smp_get(0x0015, u32::from(port));
        let mut pi = self.r.cmd_box(&get, u32::from(port), 3, Opcode::MAD_IFC)?;
        pi.truncate(256);
        pi[3] = 0x02; // Set
        pi[0x40 + 16..0x40 + 18].copy_from_slice(&lid.to_be_bytes());
        pi[0x40 + 18..0x40 + 20].copy_from_slice(&lid.to_be_bytes());
        pi[0x40 + 32] = (pi[0x40 + 32] & 0xf0) | 3;
        self.r.cmd_box(&pi, u32::from(port), 3, Opcode::MAD_IFC)?;
        pi[0x40 + 32] = (pi[0x40 + 32] & 0xf0) | 4;
        self.r.cmd_box(&pi, u32::from(port), 3, Opcode::MAD_IFC)?;
        self.lid = lid;
        Ok(())
    }

    pub fn cq(&mut self, log_nent: u8) -> Cq {
        let cqn = self.next_cqn;
        self.next_cqn += 1;
        let nent = 1u32 << log_nent;
        let bytes = (32 * nent as usize).max(4096);
        let buf = self.r.pool.alloc(bytes, 4096).unwrap();
        let pages: Vec<u64> = (0..bytes / 4096)
            .map(|i| buf.bus_addr().0 + i as u64 * 4096)
            .collect();
        let mtt = harness::alloc_mtt(&mut self.r, pages.len() as u64);
        harness::write_mtt(&mut self.r, mtt, &pages).unwrap();
        let db = self.r.pool.alloc(64, 64).unwrap();
        db.fill(0, 64, 0);
        let ctx = harness::cq_ctx(log_nent, UAR, COMP_EQ as u8, mtt, db.bus_addr().0);
        self.r.cmd_in(&ctx, cqn, 0, Opcode::SW2HW_CQ).unwrap();
        Cq {
            cqn,
            nent,
            buf,
            db,
            ci: 0,
            stash: Vec::new(),
        }
    }

    /// A region of `len` bytes at `iova` (with a page offset), MTT pages
    /// mapped in reverse order so that translation matters.
    pub fn mr(&mut self, iova: u64, len: u64, access: u32) -> Mr {
        self.mr_pd(iova, len, access, PD)
    }

    pub fn mr_pd(&mut self, iova: u64, len: u64, access: u32, pd: u32) -> Mr {
        let idx = self.next_mpt;
        self.next_mpt += 1;
        let npages = ((iova % 4096) + len).div_ceil(4096).max(1) as usize;
        let pages: Vec<DmaBuf> = (0..npages)
            .map(|_| self.r.pool.alloc_pages(1).unwrap())
            .collect();
        let mut bus: Vec<u64> = pages.iter().map(|p| p.bus_addr().0).collect();
        bus.reverse();
        let mut pages = pages;
        pages.reverse();
        let mtt = harness::alloc_mtt(&mut self.r, npages as u64);
        for (i, chunk) in bus.chunks(256).enumerate() {
            harness::write_mtt(&mut self.r, mtt + i as u64 * 256, chunk).unwrap();
        }
        let key = idx << 8 | 0x5a;
        let e = mpt(key, pd, false, iova, len, mtt, access);
        self.r.cmd_in(&e, idx, 0, Opcode::SW2HW_MPT).unwrap();
        Mr {
            key,
            iova,
            len,
            pages,
            phys: None,
        }
    }

    /// A memory window of `pd` (type 2 or type 1) through SW2HW_MPT; its
    /// allocation key.
    pub fn mw(&mut self, pd: u32, type2: bool) -> u32 {
        let idx = self.next_mpt;
        self.next_mpt += 1;
        let key = idx << 8 | 0x77;
        self.r
            .cmd_in(&mw_mpt(key, pd, type2), idx, 0, Opcode::SW2HW_MPT)
            .unwrap();
        key
    }

    /// A physical region (no translation) over a fresh contiguous buffer.
    pub fn mr_phys(&mut self, len: usize, access: u32) -> Mr {
        let idx = self.next_mpt;
        self.next_mpt += 1;
        let buf = self.r.pool.alloc(len.max(64), 4096).unwrap();
        let key = idx << 8 | 0x33;
        let iova = buf.bus_addr().0;
        let e = mpt(key, PD, true, iova, len as u64, 0, access);
        self.r.cmd_in(&e, idx, 0, Opcode::SW2HW_MPT).unwrap();
        Mr {
            key,
            iova,
            len: len as u64,
            pages: Vec::new(),
            phys: Some(buf),
        }
    }

    pub fn qp(&mut self, qpn: u32, s: QpSpec) -> Qp {
        self.try_qp(qpn, s).unwrap()
    }

    /// [`Hca::qp`], with RST2INIT's status.
    pub fn try_qp(&mut self, qpn: u32, s: QpSpec) -> R<Qp> {
        let rq_cnt = if s.srq.is_some() || s.no_rq {
            0
        } else {
            1u32 << s.rq_log
        };
        let sq_cnt = 1u32 << s.sq_log;
        let rq_bytes = (rq_cnt as usize) << s.rq_shift;
        let sq_bytes = (sq_cnt as usize) << s.sq_shift;
        let (rq_off, sq_off) = if rq_cnt > 0 && s.rq_shift > s.sq_shift {
            (0, rq_bytes)
        } else {
            (sq_bytes, 0)
        };
        let total = (rq_bytes + sq_bytes).next_multiple_of(4096);
        let buf = self.r.pool.alloc(total, 4096).unwrap();
        buf.fill(0, total, 0);
        // Linux's RST2INIT pre-stamp: every SQ WQE owned by software in
        // pass 0 (owner bit set).
        for i in 0..sq_cnt as usize {
            buf.write_be32(sq_off + (i << s.sq_shift), 0x8000_0000);
        }
        let pages: Vec<u64> = (0..total / 4096)
            .map(|i| buf.bus_addr().0 + i as u64 * 4096)
            .collect();
        let mtt = harness::alloc_mtt(&mut self.r, pages.len() as u64);
        harness::write_mtt(&mut self.r, mtt, &pages).unwrap();
        let db = self.r.pool.alloc(64, 64).unwrap();
        db.fill(0, 64, 0);
        let msgmax = if s.st == UD || s.st == MLX { 12 } else { 31 };
        let rq_ss = s.rq_ss.unwrap_or(if rq_cnt > 0 {
            s.rq_log << 3 | (s.rq_shift - 4)
        } else {
            0
        });
        let p = 0x18;
        let sched = if s.st == MLX && qpn < BASE_SQPN + 2 {
            (s.port - 1) << 6 | 0x3f
        } else {
            (s.port - 1) << 6 | 0x83
        };
        let m = QpMbox::new(1, s.st)
            .u32(0x04, s.pd)
            .u8(0x08, 5 << 5 | msgmax)
            .u8(0x09, rq_ss)
            .u8(0x0a, s.sq_log << 3 | (s.sq_shift - 4))
            .u8(0x0b, 1 << 4)
            .u32(0x0c, UAR)
            .u32(0x10, qpn)
            .u8(p + 3, s.pkey_index)
            .u8(p + 0x20, sched)
            .u32(0x7c, s.scq)
            .u32(0x90, s.access)
            .u32(0x9c, s.rcq)
            .u64(0xa0, db.bus_addr().0)
            .u32(0xa8, s.qkey)
            .u32(0xac, s.srq.map_or(0, |n| 1 << 24 | n))
            .u8(0xcb, ((mtt * 8) >> 32) as u8)
            .u32(0xcc, (mtt * 8) as u32)
            .optpar(1 << 4 | 1 << 5);
        self.r.cmd_in(&m.0, qpn, 0, Opcode::RST2INIT_QP)?;
        Ok(Qp {
            qpn,
            st: s.st,
            buf,
            db,
            sq_off,
            sq_cnt,
            sq_shift: u32::from(s.sq_shift),
            rq_off,
            rq_cnt,
            rq_shift: u32::from(s.rq_shift),
            sq_pi: 0,
            rq_pi: 0,
            srq: s.srq,
            mtt,
            spec: s,
        })
    }

    /// 2RST, then the software reset of the queues (counters to 0, the SQ
    /// pre-stamped again) and RST2INIT over the same buffer.
    pub fn reinit(&mut self, q: &mut Qp) {
        self.reinit_on(q, UAR);
    }

    /// [`Hca::reinit`] with the QP's doorbells on UAR page `uar`.
    pub fn reinit_on(&mut self, q: &mut Qp, uar: u32) {
        self.r.cmd(0, q.qpn, 2, Opcode::RST_QP).unwrap();
        let len = q.buf.len();
        q.buf.fill(0, len, 0);
        for i in 0..q.sq_cnt as usize {
            q.buf.write_be32(q.sq_off + (i << q.sq_shift), 0x8000_0000);
        }
        q.db.fill(0, 64, 0);
        q.sq_pi = 0;
        q.rq_pi = 0;
        let s = q.spec;
        let rq_ss = if q.rq_cnt > 0 {
            s.rq_log << 3 | (s.rq_shift - 4)
        } else {
            0
        };
        let msgmax = if s.st == UD || s.st == MLX { 12 } else { 31 };
        let m = QpMbox::new(1, s.st)
            .u32(0x04, s.pd)
            .u8(0x08, 5 << 5 | msgmax)
            .u8(0x09, rq_ss)
            .u8(0x0a, s.sq_log << 3 | (s.sq_shift - 4))
            .u8(0x0b, 1 << 4)
            .u32(0x0c, uar)
            .u32(0x10, q.qpn)
            .u8(0x18 + 3, s.pkey_index)
            .u8(0x18 + 0x20, (s.port - 1) << 6 | 0x83)
            .u32(0x7c, s.scq)
            .u32(0x90, s.access)
            .u32(0x9c, s.rcq)
            .u64(0xa0, q.db.bus_addr().0)
            .u32(0xa8, s.qkey)
            .u32(0xac, s.srq.map_or(0, |n| 1 << 24 | n))
            .u8(0xcb, ((q.mtt * 8) >> 32) as u8)
            .u32(0xcc, (q.mtt * 8) as u32)
            .optpar(1 << 4 | 1 << 5);
        self.r.cmd_in(&m.0, q.qpn, 0, Opcode::RST2INIT_QP).unwrap();
    }

    /// INIT2RTR and RTR2RTS, connected to `dqpn` at `dlid` (RC/UC).
    pub fn connect(&mut self, q: &Qp, s: QpSpec, dqpn: u32, dlid: u16) -> R {
        let p = 0x18;
        let sched = if s.st == MLX && q.qpn < BASE_SQPN + 2 {
            (s.port - 1) << 6 | 0x3f
        } else {
            (s.port - 1) << 6 | 0x83
        };
        let msgmax = if s.st == UD || s.st == MLX { 12 } else { 31 };
        let rtr = QpMbox::new(2, s.st)
            .u8(0x08, s.mtu << 5 | msgmax)
            .u32(0x14, dqpn)
            .u8(p + 3, s.pkey_index)
            .u16be(p + 6, dlid)
            .u8(p + 8, s.ack_timeout << 3)
            .u8(p + 0x20, sched)
            .u32(0x90, s.access)
            .u32(0x94, u32::from(s.min_rnr_timer) << 24 | 0x100)
            .optpar(1 << 16);
        self.r.cmd_in(&rtr.0, q.qpn, 0, Opcode::INIT2RTR_QP)?;
        let rts = QpMbox::new(3, s.st)
            .u32(
                0x70,
                u32::from(s.retry_cnt) << 16 | u32::from(s.rnr_retry) << 13,
            )
            .u8(p + 8, s.ack_timeout << 3)
            .u32(0x78, 0x100);
        self.r.cmd_in(&rts.0, q.qpn, 0, Opcode::RTR2RTS_QP)
    }

    /// Writes bytes into host memory by bus address (searching the buffers
    /// the harness keeps is not needed: callers pass the buffer).
    pub fn ring_send(&self, qpn: u32) {
        self.ring_send_on(qpn, UAR);
    }

    /// [`Hca::ring_send`] on UAR page `uar`.
    pub fn ring_send_on(&self, qpn: u32, uar: u32) {
        self.r.bar2.write_be32(uar as usize * 4096 + 0x14, qpn << 8);
    }

    /// Async EQEs since the last call: (type, data dword).
    pub fn async_events(&mut self) -> Vec<(u8, u32)> {
        let mut v = Vec::new();
        loop {
            let e = harness::eqe(&self.r, &self.asy, 512, self.async_ci);
            let parity = self.async_ci & 512 != 0;
            if (e[31] & 0x80 != 0) != parity {
                break;
            }
            v.push((e[1], u32::from_be_bytes(e[4..8].try_into().unwrap())));
            self.async_ci += 1;
        }
        harness::eq_doorbell(&self.r, ASYNC_EQ, self.async_ci, true);
        v
    }

    /// Completion EQEs since the last call: CQNs.
    pub fn comp_events(&mut self) -> Vec<u32> {
        let mut v = Vec::new();
        loop {
            let e = harness::eqe(&self.r, &self.comp, 64, self.comp_ci);
            let parity = self.comp_ci & 64 != 0;
            if (e[31] & 0x80 != 0) != parity {
                break;
            }
            v.push(u32::from_be_bytes(e[4..8].try_into().unwrap()) & 0xff_ffff);
            self.comp_ci += 1;
        }
        harness::eq_doorbell(&self.r, COMP_EQ, self.comp_ci, true);
        v
    }

    pub fn qp_state(&mut self, qpn: u32) -> u8 {
        let out = self.r.cmd_out(qpn, 0, Opcode::QUERY_QP).unwrap();
        out[8] >> 4
    }
}

/// A dMPT entry (PRM `hermonprm_mpt_st`).
pub fn mpt(key: u32, pd: u32, phys: bool, start: u64, len: u64, mtt: u64, access: u32) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    let mut flags = 0xf000_0000u32 | 1 << 8 | 1 << 10 | access;
    if phys {
        flags |= 1 << 9;
    }
    b[0..4].copy_from_slice(&flags.to_be_bytes());
    b[0x08..0x0c].copy_from_slice(&key.rotate_left(24).to_be_bytes());
    b[0x0c..0x10].copy_from_slice(&(pd | 3 << 24).to_be_bytes());
    b[0x10..0x18].copy_from_slice(&start.to_be_bytes());
    b[0x18..0x20].copy_from_slice(&len.to_be_bytes());
    if !phys {
        b[0x2c..0x34].copy_from_slice(&(mtt * 8).to_be_bytes());
    }
    b[0x38..0x3c].copy_from_slice(&12u32.to_be_bytes());
    b
}

impl Qp {
    /// Builds the WQE bytes for `w` (without the owner/opcode dword and
    /// fence_size byte, which `post` writes last).
    pub fn build(&self, w: &Wr) -> Vec<u8> {
        let mut b = vec![0u8; 16];
        let mut flags = 0u32;
        if w.signalled {
            flags |= 0xc;
        }
        if w.solicited {
            flags |= 2;
        }
        if let Some((f, rlid)) = w.mlx_flags {
            b[8..12].copy_from_slice(&(f | flags).to_be_bytes());
            b[14..16].copy_from_slice(&rlid.to_be_bytes());
        } else {
            b[8..12].copy_from_slice(&flags.to_be_bytes());
            b[12..16].copy_from_slice(&w.imm.to_be_bytes());
        }
        if let Some(av) = w.ud {
            let mut d = [0u8; 48];
            let pp = u32::from(av.port) << 24 | PD | u32::from(av.force_lb) << 31;
            d[0..4].copy_from_slice(&pp.to_be_bytes());
            d[5] = av.path_bits & 0x7f;
            d[6..8].copy_from_slice(&av.dlid.to_be_bytes());
            let mut sl_tc = u32::from(av.sl) << 28;
            if let Some((gid_index, hop, tclass, flow, dgid)) = av.grh {
                d[5] |= 0x80;
                d[9] = gid_index;
                d[0x0b] = hop;
                sl_tc |= u32::from(tclass) << 20 | (flow & 0xf_ffff);
                d[0x10..0x20].copy_from_slice(&dgid);
            }
            d[0x0c..0x10].copy_from_slice(&sl_tc.to_be_bytes());
            d[0x20..0x24].copy_from_slice(&av.dqpn.to_be_bytes());
            d[0x24..0x28].copy_from_slice(&av.qkey.to_be_bytes());
            b.extend_from_slice(&d);
        }
        if matches!(
            w.opcode,
            op::RDMA_WRITE | op::RDMA_WRITE_IMM | op::RDMA_READ | op::ATOMIC_CS | op::ATOMIC_FA
        ) && w.ud.is_none()
        {
            b.extend_from_slice(&w.raddr.to_be_bytes());
            b.extend_from_slice(&w.rkey.to_be_bytes());
            b.extend_from_slice(&[0; 4]);
            if matches!(w.opcode, op::ATOMIC_CS | op::ATOMIC_FA) {
                b.extend_from_slice(&w.swap.to_be_bytes());
                b.extend_from_slice(&w.cmp.to_be_bytes());
            }
        }
        if let Some(raw) = &w.raw {
            b.extend_from_slice(raw);
        }
        if let Some(data) = &w.inline {
            // Inline segments never cross a 64-byte boundary.
            let mut rest = &data[..];
            loop {
                let room = 64 - (b.len() % 64) - 4;
                let n = rest.len().min(room);
                b.extend_from_slice(&(0x8000_0000u32 | n as u32).to_be_bytes());
                b.extend_from_slice(&rest[..n]);
                while !b.len().is_multiple_of(16) {
                    b.push(0);
                }
                rest = &rest[n..];
                if rest.is_empty() {
                    break;
                }
            }
        }
        for s in &w.sges {
            b.extend_from_slice(&s.len.to_be_bytes());
            b.extend_from_slice(&s.lkey.to_be_bytes());
            b.extend_from_slice(&s.addr.to_be_bytes());
        }
        if let Some(t) = &w.tail {
            b.extend_from_slice(t);
        }
        b
    }

    /// Writes WQE bytes at the producer index with the PRM's write order
    /// (segments, fence/size, then owner + opcode); no doorbell.
    pub fn put(&mut self, opcode: u8, fence: bool, wqe: &[u8]) -> u32 {
        let idx = self.sq_pi;
        let stride = 1usize << self.sq_shift;
        assert!(
            wqe.len() <= stride,
            "WQE of {} bytes in a {stride}-byte stride",
            wqe.len()
        );
        let base = self.sq_off + ((idx & (self.sq_cnt - 1)) as usize) * stride;
        self.buf.write_bytes(base + 4, &wqe[4..]);
        let ds = wqe.len().div_ceil(16) as u8;
        self.buf
            .write_u8(base + 7, ds | if fence { 0x40 } else { 0 });
        let owner = if idx & self.sq_cnt != 0 {
            0x8000_0000u32
        } else {
            0
        };
        hal::barrier::wmb();
        self.buf.write_be32(base, owner | u32::from(opcode));
        self.sq_pi = self.sq_pi.wrapping_add(1);
        idx
    }

    /// Builds, writes and rings one WR; returns its WQE index.
    pub fn post(&mut self, h: &Hca, w: &Wr) -> u32 {
        let b = self.build(w);
        let i = self.put(w.opcode, w.fence, &b);
        h.ring_send(self.qpn);
        i
    }

    /// Posts a receive WQE (data segments + terminator).
    pub fn post_recv(&mut self, sges: &[Sge]) -> u16 {
        let idx = self.rq_pi;
        let stride = 1usize << self.rq_shift;
        let base = self.rq_off + ((u32::from(idx) & (self.rq_cnt - 1)) as usize) * stride;
        let mut b = vec![0u8; stride];
        for (i, s) in sges.iter().enumerate() {
            b[i * 16..i * 16 + 4].copy_from_slice(&s.len.to_be_bytes());
            b[i * 16 + 4..i * 16 + 8].copy_from_slice(&s.lkey.to_be_bytes());
            b[i * 16 + 8..i * 16 + 16].copy_from_slice(&s.addr.to_be_bytes());
        }
        if sges.len() * 16 < stride {
            let t = sges.len() * 16;
            b[t + 4..t + 8].copy_from_slice(&0x100u32.to_be_bytes());
        }
        self.buf.write_bytes(base, &b);
        hal::barrier::wmb();
        self.rq_pi = self.rq_pi.wrapping_add(1);
        self.db.write_be32(0, u32::from(self.rq_pi));
        idx
    }
}

/// An SRQ (free list of WQEs linked by `next`).
pub struct Srq {
    pub srqn: u32,
    pub buf: DmaBuf,
    pub db: DmaBuf,
    pub cnt: u32,
    pub shift: u32,
    pub head: u16,
    pub tail: u16,
    pub counter: u16,
}

impl Hca {
    pub fn srq(&mut self, srqn: u32, log: u8, shift: u8) -> Srq {
        let cnt = 1u32 << log;
        let total = ((cnt as usize) << shift).next_multiple_of(4096);
        let buf = self.r.pool.alloc(total, 4096).unwrap();
        buf.fill(0, total, 0);
        for i in 0..cnt {
            let next = ((i + 1) & (cnt - 1)) as u16;
            buf.write_be16(((i as usize) << shift) + 2, next);
        }
        let pages: Vec<u64> = (0..total / 4096)
            .map(|i| buf.bus_addr().0 + i as u64 * 4096)
            .collect();
        let mtt = harness::alloc_mtt(&mut self.r, pages.len() as u64);
        harness::write_mtt(&mut self.r, mtt, &pages).unwrap();
        let db = self.r.pool.alloc(64, 64).unwrap();
        db.fill(0, 64, 0);
        let ctx = harness::srq_ctx(srqn, log, shift - 4, PD, mtt, db.bus_addr().0);
        self.r.cmd_in(&ctx, srqn, 0, Opcode::SW2HW_SRQ).unwrap();
        Srq {
            srqn,
            buf,
            db,
            cnt,
            shift: u32::from(shift),
            head: 0,
            tail: (cnt - 1) as u16,
            counter: 0,
        }
    }
}

impl Srq {
    /// Posts at the free list's head (Linux's order, from the PRM).
    pub fn post(&mut self, sges: &[Sge]) -> u16 {
        let idx = self.head;
        let base = (idx as usize) << self.shift;
        let next = self.buf.read_be16(base + 2);
        let stride = 1usize << self.shift;
        let mut b = vec![0u8; stride - 16];
        for (i, s) in sges.iter().enumerate() {
            b[i * 16..i * 16 + 4].copy_from_slice(&s.len.to_be_bytes());
            b[i * 16 + 4..i * 16 + 8].copy_from_slice(&s.lkey.to_be_bytes());
            b[i * 16 + 8..i * 16 + 16].copy_from_slice(&s.addr.to_be_bytes());
        }
        if sges.len() * 16 < stride - 16 {
            let t = sges.len() * 16;
            b[t + 4..t + 8].copy_from_slice(&0x100u32.to_be_bytes());
        }
        self.buf.write_bytes(base + 16, &b);
        self.head = next;
        self.counter = self.counter.wrapping_add(1);
        hal::barrier::wmb();
        self.db.write_be32(0, u32::from(self.counter));
        idx
    }
    /// Returns a completed WQE to the free list's tail.
    pub fn free(&mut self, idx: u16) {
        let t = (self.tail as usize) << self.shift;
        self.buf.write_be16(t + 2, idx);
        self.tail = idx;
    }
}

/// QP mailbox fields the model-test harness does not write.
pub trait MboxExt {
    fn u16be(self, ctx_off: usize, v: u16) -> Self;
}

impl MboxExt for QpMbox {
    fn u16be(mut self, ctx_off: usize, v: u16) -> Self {
        self.0[8 + ctx_off..10 + ctx_off].copy_from_slice(&v.to_be_bytes());
        self
    }
}

/// A deterministic xorshift generator for the tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}
