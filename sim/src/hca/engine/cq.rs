//! Completion queues as the card runs them.
//!
//! CQE writing with the owner bit of each pass, the consumer index read from the
//! doorbell record, overrun (CQ_ERROR, the CQ stops), arming (next / solicited) and
//! the completion EQE an armed CQ raises; CQ moderation, the resize CQE and 64-byte
//! CQEs are not modelled.
//!
//! CQE layout: iPXE `hermonprm_completion_queue_entry_st` and
//! `hermonprm_completion_with_error_st`, Linux 3.11 `struct mlx4_cqe` and
//! `struct mlx4_err_cqe` (porting map 6.6).
//!
//! # Where the readings differ
//!
//! * Error CQE opcode: iPXE's comments give "0x1F" in one place and
//!   "0xFE receive / 0xFF send" (the whole byte, owner and S_R included) in
//!   another; Linux and libmlx4 test the 5-bit opcode against `0x1e`
//!   (`MLX4_CQE_OPCODE_ERROR`) and read S_R from bit 6. The model writes
//!   opcode `0x1e` with S_R set for send-queue errors, which satisfies
//!   Linux and is what `0xFE`/`0xFF` would mean with the owner bit and
//!   the `is` bit set.
//! * P_Key index and immediate share dword 1: iPXE says the P_Key index is
//!   there for GSI receives; Linux 3.11 reads `immed_rss_invalid & 0x7f` as
//!   the P_Key index of every receive. The model writes the immediate when
//!   the message carried one, else the P_Key index (UD and MLX receives).
//! * Arming while CQEs are outstanding: the PRM raises the event at once
//!   when the CQ is armed for "next" and the consumer index in the arm
//!   doorbell is behind the producer; the model does the same, and keeps a
//!   "solicited" arm pending until a solicited or error CQE arrives.
//! * The arm sequence number (`sn`, 2 bits) is recorded, not checked.

use crate::hca::ctx::{CqCtx, Event, cqc};
use crate::hca::device::Hca;
use crate::hca::icm::Table;
use crate::hca::layout::{put8, put16, put32};

/// CQE opcodes of receive completions.
pub mod rcv_op {
    #![allow(missing_docs)]
    pub const RDMA_WRITE_IMM: u8 = 0x00;
    pub const SEND: u8 = 0x01;
    pub const SEND_IMM: u8 = 0x02;
    pub const SEND_INVAL: u8 = 0x03;
}

/// The error CQE opcode.
pub const OPCODE_ERROR: u8 = 0x1e;

/// Completion-with-error syndromes (IBTA names, mlx4 values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Syndrome {
    LocalLength = 0x01,
    LocalQpOp = 0x02,
    LocalProt = 0x04,
    WrFlush = 0x05,
    MwBind = 0x06,
    BadResp = 0x10,
    LocalAccess = 0x11,
    RemoteInvalidReq = 0x12,
    RemoteAccess = 0x13,
    RemoteOp = 0x14,
    RetryExceeded = 0x15,
    RnrRetryExceeded = 0x16,
    RemoteAborted = 0x22,
}

impl Syndrome {
    /// The vendor syndrome written next to it. 0xf9 (flush) and 0x81
    /// (transport retries) are the values reported by Mellanox HCAs in the
    /// field; the others are the model's own, one per cause.
    pub fn vendor(self) -> u8 {
        match self {
            Syndrome::LocalLength => 0x69,
            Syndrome::LocalQpOp => 0x68,
            Syndrome::LocalProt => 0x56,
            Syndrome::WrFlush => 0xf9,
            Syndrome::MwBind => 0x6a,
            Syndrome::BadResp => 0x90,
            Syndrome::LocalAccess => 0x57,
            Syndrome::RemoteInvalidReq => 0x8a,
            Syndrome::RemoteAccess => 0x88,
            Syndrome::RemoteOp => 0x89,
            Syndrome::RetryExceeded => 0x81,
            Syndrome::RnrRetryExceeded => 0x82,
            Syndrome::RemoteAborted => 0x8b,
        }
    }
}

/// One CQE before it is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cqe {
    /// Local QPN.
    pub qpn: u32,
    /// Send (else receive).
    pub send: bool,
    /// Opcode (WQE opcode for sends, [`rcv_op`] for receives).
    pub opcode: u8,
    /// Byte count.
    pub byte_cnt: u32,
    /// Immediate, or P_Key index.
    pub imm: u32,
    /// GRH present.
    pub grh: bool,
    /// DLID path bits.
    pub path_bits: u8,
    /// Source QPN.
    pub rqpn: u32,
    /// SL.
    pub sl: u8,
    /// Source LID.
    pub slid: u16,
    /// WQE counter.
    pub wqe_counter: u16,
    /// Error syndrome (None = success).
    pub error: Option<Syndrome>,
    /// The message asked for a solicited event.
    pub solicited: bool,
    /// The Ethernet fields of a receive on an Ethernet port.
    pub eth: Option<CqeEth>,
}

/// What a CQE of a receive on an Ethernet port carries (Linux
/// `struct mlx4_cqe`: `vlan_my_qpn` bit 29, `sl_vid`, the `smac` union with
/// `rlid`/`status`/`badfcs_enc`, `checksum`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CqeEth {
    /// The 802.1Q TCI of a tagged frame (the C-VLAN present bit, and the
    /// TCI in `sl_vid`); for an untagged RoCE frame `sl_vid` gets 0.
    pub vlan: Option<u16>,
    /// RoCE: the source MAC (a raw frame's CQE has the status instead).
    pub smac: Option<[u8; 6]>,
    /// Raw frames: the status bits (`MLX4_CQE_STATUS_*`).
    pub status: u16,
    /// Raw frames: the L4 checksum (0xffff: verified).
    pub checksum: u16,
    /// Raw frames steered by RSS: the hash (in the immediate dword).
    pub rss_hash: Option<u32>,
}

impl Cqe {
    /// The 32 bytes, owner bit clear.
    pub fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        put32(&mut b, 0x00, self.qpn & 0xff_ffff);
        put16(&mut b, 0x18, self.wqe_counter);
        let sr = if self.send { 0x40 } else { 0 };
        if let Some(s) = self.error {
            put8(&mut b, 0x1a, s.vendor());
            put8(&mut b, 0x1b, s as u8);
            put8(&mut b, 0x1f, sr | OPCODE_ERROR);
            return b;
        }
        put32(&mut b, 0x04, self.imm);
        put32(
            &mut b,
            0x08,
            u32::from(self.grh) << 31
                | u32::from(self.path_bits & 0x7f) << 24
                | (self.rqpn & 0xff_ffff),
        );
        put16(&mut b, 0x0c, u16::from(self.sl & 0xf) << 12);
        put16(&mut b, 0x0e, self.slid);
        put32(&mut b, 0x14, self.byte_cnt);
        put8(&mut b, 0x1f, sr | (self.opcode & 0x1f));
        if let Some(e) = self.eth {
            let tci = e.vlan.unwrap_or(u16::from(self.sl & 7) << 13);
            put16(&mut b, 0x0c, tci);
            if e.vlan.is_some() {
                put32(&mut b, 0x00, 1 << 29 | (self.qpn & 0xff_ffff));
            }
            match e.smac {
                Some(m) => b[0x0e..0x14].copy_from_slice(&m),
                None => {
                    put16(&mut b, 0x0e, 0);
                    put16(&mut b, 0x10, e.status);
                    put16(&mut b, 0x1a, e.checksum);
                }
            }
            if let Some(h) = e.rss_hash {
                put32(&mut b, 0x04, h);
            }
        }
        b
    }
}

/// Arm state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arm {
    /// No event wanted.
    None,
    /// Event on the next CQE.
    Next,
    /// Event on the next solicited (or error) CQE.
    Solicited,
}

/// A CQ as the engine runs it.
#[derive(Debug, Clone)]
pub struct CqEng {
    /// Entries.
    pub nent: u32,
    /// Buffer pages.
    pub pages: Vec<u64>,
    /// Page size.
    pub page_size: u64,
    /// Offset of entry 0.
    pub page_offset: u64,
    /// Producer index (free running).
    pub prod: u32,
    /// Doorbell record (set_ci at +0, arm at +4).
    pub db_rec: u64,
    /// Completion EQ.
    pub eqn: u32,
    /// Arm state.
    pub arm: Arm,
    /// Last arm sequence number seen.
    pub arm_sn: u8,
    /// The last arm request taken (sn, command, consumer index), by
    /// doorbell or from the arm doorbell record.
    pub last_arm: Option<(u8, u32, u32)>,
    /// Overran: stopped.
    pub error: bool,
    /// CQEs dropped after the error.
    pub dropped: u64,
}

impl CqEng {
    fn entry_addr(&self, i: u32) -> u64 {
        let off = self.page_offset + u64::from(i & (self.nent - 1)) * 32;
        let p = (off / self.page_size) as usize;
        self.pages.get(p).copied().unwrap_or(0) + off % self.page_size
    }
}

/// Builds the engine state of CQ `cqn` from its context in ICM.
fn load(hca: &mut Hca, cqn: u32) -> Option<CqEng> {
    let nent = hca.cqs.get(&cqn)?.nent;
    let va = hca.geo().ok()?.va(Table::Cqc, u64::from(cqn));
    let mut b = [0u8; cqc::SIZE];
    hca.icm_read(va, &mut b).ok()?;
    let c = CqCtx::decode(&b);
    let page_size = 4096u64 << c.log_page_size.min(20);
    let bytes = u64::from(c.page_offset) + u64::from(nent) * 32;
    let pages = hca.mtt_pages(c.mtt_base, c.log_page_size, bytes).ok()?;
    let prod = crate::hca::layout::get32(&b, cqc::PROD_INDEX) & 0xff_ffff;
    Some(CqEng {
        nent,
        pages,
        page_size,
        page_offset: u64::from(c.page_offset),
        prod,
        db_rec: c.db_rec_addr,
        eqn: c.comp_eqn,
        arm: Arm::None,
        arm_sn: 0,
        last_arm: None,
        error: false,
        dropped: 0,
    })
}

/// The engine state of `cqn`, loaded on first use.
pub fn get(hca: &mut Hca, cqn: u32) -> Option<&mut CqEng> {
    if !hca.engine.cqs.contains_key(&cqn) {
        let c = load(hca, cqn)?;
        hca.engine.cqs.insert(cqn, c);
    }
    hca.engine.cqs.get_mut(&cqn)
}

/// Reads the consumer index from the CQ's doorbell record.
fn consumer(hca: &mut Hca, db: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    hca.dma_read(db, &mut b).ok()?;
    Some(u32::from_be_bytes(b) & 0xff_ffff)
}

/// Writes `cqe` to CQ `cqn`; false if the CQ is missing, stopped or just
/// overran.
pub fn push(hca: &mut Hca, cqn: u32, cqe: &Cqe) -> bool {
    let Some(cq) = get(hca, cqn) else {
        hca.violation(format!(
            "completion for QP {:#x} on CQ {cqn:#x}, which is not in hardware ownership",
            cqe.qpn
        ));
        return false;
    };
    if cq.error {
        cq.dropped += 1;
        return false;
    }
    let (db, prod, nent) = (cq.db_rec, cq.prod, cq.nent);
    let ci = consumer(hca, db).unwrap_or(prod);
    let used = prod.wrapping_sub(ci) & 0xff_ffff;
    if used >= nent {
        if let Some(cq) = hca.engine.cqs.get_mut(&cqn) {
            cq.error = true;
            cq.dropped += 1;
        }
        hca.violation(format!(
            "CQ {cqn:#x} overrun: {used} CQEs outstanding of {nent} (consumer index {ci} not advanced)"
        ));
        hca.post_async(Event::CqError {
            cqn,
            syndrome: crate::hca::ctx::eqe::CQ_ERR_OVERRUN,
        });
        return false;
    }
    let Some(cq) = hca.engine.cqs.get_mut(&cqn) else {
        return false;
    };
    let addr = cq.entry_addr(prod);
    let mut b = cqe.encode();
    if prod & nent != 0 {
        b[31] |= 0x80;
    }
    cq.prod = prod.wrapping_add(1) & 0xff_ffff;
    let fire = match cq.arm {
        Arm::Next => true,
        Arm::Solicited => cqe.solicited || cqe.error.is_some(),
        Arm::None => false,
    };
    if fire {
        cq.arm = Arm::None;
    }
    let eqn = cq.eqn;
    // Body first, the owner byte last, as the card does.
    if hca.dma_write(addr, &b[..31]).is_err() || hca.dma_write(addr + 31, &b[31..]).is_err() {
        hca.violation(format!("CQ {cqn:#x}: CQE write to {addr:#x} failed"));
        return false;
    }
    hca.engine.stats.cqes += 1;
    if fire {
        hca.post_event(eqn, Event::Completion { cqn });
    }
    true
}

/// The CQ doorbell: arm for the next (cmd 2) or the next solicited (cmd 1)
/// completion; `ci` is the consumer index the driver has reached.
pub fn arm(hca: &mut Hca, cqn: u32, cmd: u32, sn: u8, ci: u32) {
    let Some(cq) = get(hca, cqn) else { return };
    if cq.error {
        return;
    }
    cq.last_arm = Some((sn, cmd, ci & 0xff_ffff));
    cq.arm_sn = sn;
    cq.arm = if cmd == 1 { Arm::Solicited } else { Arm::Next };
    if cq.arm == Arm::Next && cq.prod != ci & 0xff_ffff {
        cq.arm = Arm::None;
        let eqn = cq.eqn;
        hca.post_event(eqn, Event::Completion { cqn });
    }
}

/// Polled front ends: arms CQ `cqn` from its arm doorbell record (at the
/// doorbell record + 4: `sn << 28 | cmd << 24 | ci`) if it holds an arm
/// request other than the last one taken; a doorbell that another CQ's
/// overwrote is recovered so.
pub fn arm_from_record(hca: &mut Hca, cqn: u32) {
    let Some(cq) = get(hca, cqn) else { return };
    let (db, last) = (cq.db_rec, cq.last_arm);
    let mut b = [0u8; 4];
    if db == 0 || hca.dma_read(db + 4, &mut b).is_err() {
        return;
    }
    let v = u32::from_be_bytes(b);
    let (sn, cmd, ci) = ((v >> 28) as u8 & 3, (v >> 24) & 7, v & 0xff_ffff);
    if (cmd == 1 || cmd == 2) && last != Some((sn, cmd, ci)) {
        if let Some(c) = hca.cqs.get_mut(&cqn) {
            c.arms += 1;
        }
        arm(hca, cqn, cmd, sn, ci);
    }
}
