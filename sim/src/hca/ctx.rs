//! Byte layouts of the hardware contexts the firmware stores in ICM.
//!
//! Byte layouts of the hardware contexts the firmware stores in ICM (EQC,
//! CQC, QPC, SRQC, dMPT), MTT entries and EQEs, with the field checks
//! SW2HW/modify commands apply; CQE/WQE formats belong to the data-path
//! engines ([`crate::hca::engine`]).
//!
//! Offsets from iPXE `MT25408_PRM.h` (`hermonprm_eqc_st`,
//! `hermonprm_completion_queue_context_st`, `hermonprm_mpt_st`,
//! `hermonprm_mtt_st`, `hermonprm_srq_context_st`,
//! `hermonprm_event_queue_entry_st`), checked against Linux 3.11
//! (`struct mlx4_eq_context` in eq.c, `mlx4_cq_context` in
//! include/linux/mlx4/cq.h, `mlx4_mpt_entry` in mr.c, `mlx4_qp_context` in
//! include/linux/mlx4/qp.h, `mlx4_srq_context` in srq.c).
//!
//! # iPXE vs Linux
//!
//! * EQC 0x10..0x13: iPXE has 16-bit `eq_period` (0x10) and `eq_max_count`
//!   (0x12); Linux declares u8 fields at 0x11 and 0x13 (the low bytes).
//! * EQC 0x14: iPXE `intr` is 10 bits (0x16..0x17); Linux a u8 at 0x17.
//! * EQC 0x00 bits 24+: Linux defines `MLX4_EQ_OWNER_SW/HW` at bit 24 (not
//!   used by the driver); iPXE marks those bits reserved.
//! * CQC 0x14: iPXE `c_eqn` is 9 bits (0x16..0x17); Linux a u8 `comp_eqn` at
//!   0x17. The model accepts up to 9 bits.
//! * dMPT 0x00 bit 17: Linux `MLX4_MPT_FLAG_MIO`; iPXE `atc_xlated` (bit 16
//!   `atc_req`, bit 19 `no_snoop`).
//! * dMPT 0x20 `lkey`: iPXE says "must be 0 for SW2HW_MPT"; Linux never
//!   writes it (the key lives at 0x08). The model rejects a non-zero value.
//! * EQE 0x1c: Linux `slave_id`; reserved in iPXE.
//! * MTT: iPXE splits the entry into `ptag_h` (dword 0) and `p | ptag_l` (bit
//!   0 present, bits 31:3 address); Linux writes one BE64 `addr | 1`.
//! * dMPT 0x08: iPXE describes `mem_key` as `{key[7:0], key[31:8]}`; Linux
//!   writes `key_to_hw_index(key)`. Same value: the MPT index in bits 23:0.
//! * QPC 0x00: iPXE `st` is 4 bits (19:16); Linux ORs an 8-bit type at 16.
//! * QPC 0x90 bits 11:6: iPXE `page_offset` of the first WQE; Linux has no
//!   such field (always 0).
//! * QPC 0xc0: Linux `param3` bit 30 (strip VLAN, Ethernet); iPXE puts
//!   `rmc_parent_qpn`, `hs`, `is`, `rme`, `mkey_rmp` there, bit 30 reserved.
//! * QP path +0x04: Linux `counter_index`; iPXE has that byte reserved and
//!   `counter_index` at path +0x24. Path +0x21 is Linux `vlan_index`, iPXE
//!   puts `vlan_index` at +0x25. Path +0x00 bit 7: Linux uses it for SR-IOV
//!   source checks, iPXE calls it `fl` (force loopback).

use crate::hca::layout::{get8, get16, get32, get64, put8, put32};

/// Size of an EQE/CQE in 32-byte mode.
pub const ENTRY_32: usize = 32;

/// MTT base address of a context (40 bits: [39:32] in `hi`, [31:0] in `lo`).
fn mtt_addr(b: &[u8], hi: usize, lo: usize) -> u64 {
    u64::from(get8(b, hi)) << 32 | u64::from(get32(b, lo))
}

/// The first dword of `b` (at the offsets `masks` names) with a bit set
/// that its mask marks reserved: `(offset, offending bits)`.
pub fn reserved_bits(b: &[u8], masks: &[(usize, u32)]) -> Option<(usize, u32)> {
    masks
        .iter()
        .map(|&(off, m)| (off, get32(b, off) & m))
        .find(|&(_, bad)| bad != 0)
}

/// An EQ context (64 bytes).
pub mod eqc {
    #![allow(missing_docs)]
    pub const FLAGS: usize = 0x00;
    pub const PAGE_OFFSET: usize = 0x08;
    pub const LOG_EQ_SIZE: usize = 0x0c;
    pub const EQ_PERIOD: usize = 0x10;
    pub const EQ_MAX_COUNT: usize = 0x12;
    pub const INTR: usize = 0x14;
    pub const LOG_PAGE_SIZE: usize = 0x18;
    pub const MTT_ADDR_H: usize = 0x1b;
    pub const MTT_ADDR_L: usize = 0x1c;
    pub const CONS_INDEX: usize = 0x28;
    pub const PROD_INDEX: usize = 0x2c;
    pub const SIZE: usize = 64;
    /// Event delivery state (bits 11:8): armed.
    pub const ST_ARMED: u8 = 0x9;
    /// Fired (an event was generated, not re-armed yet).
    pub const ST_FIRED: u8 = 0xa;
    /// Always armed.
    pub const ST_ALWAYS_ARMED: u8 = 0xb;
    /// Overrun ignore.
    pub const OI: u32 = 1 << 17;
    /// Event coalescing.
    pub const EC: u32 = 1 << 18;
    /// Reserved bits per dword (iPXE `hermonprm_eqc_st`; Linux
    /// `mlx4_eq_context` agrees): flags 27:19, 16:12 and 7:0; page offset
    /// outside 11:5; log size 31:29; intr 31:10; log page size and MTT
    /// high byte's neighbours; MTT low 2:0; the counters' top bytes; the
    /// reserved dwords.
    pub const RESERVED: &[(usize, u32)] = &[
        (0x00, 0x0ff8_0000 | 0x0001_f000 | 0xff),
        (0x04, !0),
        (0x08, !0xfe0),
        (0x0c, 0xe0ff_ffff),
        (0x14, 0xffff_fc00),
        (0x18, 0xc0ff_ff00),
        (0x1c, 0x7),
        (0x20, !0),
        (0x24, !0),
        (0x28, 0xff00_0000),
        (0x2c, 0xff00_0000),
        (0x30, !0),
        (0x34, !0),
        (0x38, !0),
        (0x3c, !0),
    ];
}

/// Decoded EQ context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EqCtx {
    /// Status (31:28).
    pub status: u8,
    /// Delivery state (11:8).
    pub st: u8,
    /// Overrun ignore.
    pub oi: bool,
    /// Coalescing.
    pub ec: bool,
    /// Byte offset of the first EQE in the first page.
    pub page_offset: u32,
    /// log2 entries.
    pub log_eq_size: u8,
    /// MSI-X vector.
    pub intr: u16,
    /// log2(page size) - 12.
    pub log_page_size: u8,
    /// MTT offset relative to the MTT table (bytes).
    pub mtt_base: u64,
    /// Consumer counter (24 bits).
    pub cons_index: u32,
    /// Producer counter (24 bits).
    pub prod_index: u32,
}

impl EqCtx {
    /// Decodes 64 bytes.
    pub fn decode(b: &[u8]) -> EqCtx {
        use eqc::*;
        let flags = get32(b, FLAGS);
        EqCtx {
            status: (flags >> 28) as u8,
            st: ((flags >> 8) & 0xf) as u8,
            oi: flags & OI != 0,
            ec: flags & EC != 0,
            page_offset: get32(b, PAGE_OFFSET) & 0xfe0,
            log_eq_size: get8(b, LOG_EQ_SIZE) & 0x1f,
            intr: get16(b, INTR + 2) & 0x3ff,
            log_page_size: get8(b, LOG_PAGE_SIZE) & 0x3f,
            mtt_base: mtt_addr(b, MTT_ADDR_H, MTT_ADDR_L),
            cons_index: get32(b, CONS_INDEX) & 0xff_ffff,
            prod_index: get32(b, PROD_INDEX) & 0xff_ffff,
        }
    }
}

/// A CQ context (64 bytes).
pub mod cqc {
    #![allow(missing_docs)]
    pub const FLAGS: usize = 0x00;
    pub const PAGE_OFFSET: usize = 0x08;
    pub const LOGSIZE_USRPAGE: usize = 0x0c;
    pub const CQ_PERIOD: usize = 0x10;
    pub const CQ_MAX_COUNT: usize = 0x12;
    pub const COMP_EQN: usize = 0x14;
    pub const LOG_PAGE_SIZE: usize = 0x18;
    pub const MTT_ADDR_H: usize = 0x1b;
    pub const MTT_ADDR_L: usize = 0x1c;
    pub const LAST_NOTIFIED: usize = 0x20;
    pub const SOLICIT_PROD: usize = 0x24;
    pub const CONS_INDEX: usize = 0x28;
    pub const PROD_INDEX: usize = 0x2c;
    pub const DB_REC_ADDR: usize = 0x38;
    pub const SIZE: usize = 64;
    /// Reserved bits per dword (iPXE `hermonprm_completion_queue_context_st`,
    /// Linux `mlx4_cq_context`): flags 27:20, 16:12 and 7:0 (bit 19 is
    /// Linux's timestamp enable, bit 18 collapsed, 17 overrun ignore, 11:8
    /// the delivery state iPXE sets to "fired"), the second dword,
    /// page offset outside 11:5, log size 31:29, the EQN's 31:9, the
    /// neighbours of log page size and MTT high byte, MTT low 2:0, the
    /// doorbell record's 2:0.
    pub const RESERVED: &[(usize, u32)] = &[
        (0x00, 0x0ff0_0000 | 0x0001_f000 | 0xff),
        (0x04, !0),
        (0x08, !0xfe0),
        (0x0c, 0xe000_0000),
        (0x14, 0xffff_fe00),
        (0x18, 0xc0ff_ff00),
        (0x1c, 0x7),
        (0x3c, 0x7),
    ];
}

/// Decoded CQ context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CqCtx {
    /// Flags dword.
    pub flags: u32,
    /// Byte offset of the first CQE.
    pub page_offset: u32,
    /// log2 entries.
    pub log_size: u8,
    /// UAR page index.
    pub usr_page: u32,
    /// Completion EQ.
    pub comp_eqn: u32,
    /// log2(page size) - 12.
    pub log_page_size: u8,
    /// MTT offset relative to the MTT table (bytes).
    pub mtt_base: u64,
    /// Doorbell record bus address.
    pub db_rec_addr: u64,
}

impl CqCtx {
    /// Decodes 64 bytes.
    pub fn decode(b: &[u8]) -> CqCtx {
        use cqc::*;
        let ls = get32(b, LOGSIZE_USRPAGE);
        CqCtx {
            flags: get32(b, FLAGS),
            page_offset: get32(b, PAGE_OFFSET) & 0xfe0,
            log_size: ((ls >> 24) & 0x1f) as u8,
            usr_page: ls & 0xff_ffff,
            comp_eqn: get32(b, COMP_EQN) & 0x1ff,
            log_page_size: get8(b, LOG_PAGE_SIZE) & 0x3f,
            mtt_base: mtt_addr(b, MTT_ADDR_H, MTT_ADDR_L),
            db_rec_addr: get64(b, DB_REC_ADDR),
        }
    }
}

/// A dMPT entry (64 bytes).
pub mod mpt {
    #![allow(missing_docs)]
    pub const FLAGS: usize = 0x00;
    pub const QPN: usize = 0x04;
    pub const KEY: usize = 0x08;
    pub const PD_FLAGS: usize = 0x0c;
    pub const START: usize = 0x10;
    pub const LENGTH: usize = 0x18;
    pub const LKEY: usize = 0x20;
    pub const WIN_CNT: usize = 0x24;
    pub const MTT_REP: usize = 0x2b;
    pub const MTT_ADDR: usize = 0x2c;
    pub const MTT_SZ: usize = 0x34;
    pub const ENTITY_SIZE: usize = 0x38;
    pub const FIRST_BYTE_OFFSET: usize = 0x3c;
    pub const SIZE: usize = 64;
    /// Region (else window).
    pub const FLAG_REGION: u32 = 1 << 8;
    /// Physical: no translation.
    pub const FLAG_PHYSICAL: u32 = 1 << 9;
    /// Local read; must be set on every MPT.
    pub const FLAG_LR: u32 = 1 << 10;
    /// Status "SW owns" as written by SW2HW_MPT's mailbox.
    pub const STATUS_SW: u32 = 0xf;
    /// Status "free" (fast-register MRs).
    pub const STATUS_FREE: u32 = 0x3;
    /// Fast-register enable in pd_flags.
    pub const FAST_REG: u32 = 1 << 27;
    /// Reserved bits per dword (Linux `mlx4_mpt_entry`, iPXE
    /// `hermonprm_mpt_st`): bytes 0x28..0x2a, the MTT address above bit 39.
    pub const RESERVED: &[(usize, u32)] = &[(0x28, 0xffff_ff00), (0x2c, 0xffff_ff00)];
}

/// Decoded dMPT entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MptEntry {
    /// Flags dword.
    pub flags: u32,
    /// Memory key in hardware-index form: `{key[7:0], key[31:8]}` (iPXE
    /// `mem_key`), which is the MPT index in the low 24 bits (Linux writes
    /// `key_to_hw_index(mr->key)`).
    pub key: u32,
    /// PD (24 bits).
    pub pd: u32,
    /// pd_flags bits 31:24.
    pub pd_flags: u32,
    /// Start (iova).
    pub start: u64,
    /// Length.
    pub length: u64,
    /// The lkey field (must be 0 on SW2HW).
    pub lkey: u32,
    /// MTT offset relative to the MTT table (bytes).
    pub mtt_addr: u64,
    /// MTT entries (fast register).
    pub mtt_sz: u32,
    /// log2 page size.
    pub entity_size: u32,
}

impl MptEntry {
    /// Decodes 64 bytes.
    pub fn decode(b: &[u8]) -> MptEntry {
        use mpt::*;
        let pd = get32(b, PD_FLAGS);
        MptEntry {
            flags: get32(b, FLAGS),
            key: get32(b, KEY),
            pd: pd & 0xff_ffff,
            pd_flags: pd & 0xff00_0000,
            start: get64(b, START),
            length: get64(b, LENGTH),
            lkey: get32(b, LKEY),
            mtt_addr: get64(b, MTT_ADDR) & 0xff_ffff_ffff,
            mtt_sz: get32(b, MTT_SZ),
            entity_size: get32(b, ENTITY_SIZE) & 0x1f_ffff,
        }
    }
    /// Status nibble.
    pub fn status(&self) -> u32 {
        self.flags >> 28
    }
}

/// The MPT index a key names (Linux `key_to_hw_index`: rotate left by 24).
pub fn key_to_index(key: u32) -> u32 {
    key.rotate_left(24)
}

/// An SRQ context (Linux `mlx4_srq_context`, 48 bytes used).
pub mod srqc {
    #![allow(missing_docs)]
    pub const STATE_LOGSIZE_SRQN: usize = 0x00;
    pub const LOGSTRIDE: usize = 0x04;
    pub const XRCD: usize = 0x06;
    pub const PG_OFFSET_CQN: usize = 0x08;
    pub const LOG_PAGE_SIZE: usize = 0x10;
    pub const MTT_ADDR_H: usize = 0x13;
    pub const MTT_ADDR_L: usize = 0x14;
    pub const PD: usize = 0x18;
    pub const LIMIT_WATERMARK: usize = 0x1c;
    pub const WQE_CNT: usize = 0x1e;
    pub const WQE_COUNTER: usize = 0x22;
    pub const DB_REC_ADDR: usize = 0x28;
    pub const SIZE: usize = 64;
    /// Reserved bits per dword (Linux `mlx4_srq_context`): log stride's
    /// 7:3 and `reserved1`, `reserved2`, the neighbours of log page size and
    /// MTT high byte, MTT low 2:0, the PD's top byte, `reserved4`,
    /// `reserved5`, the doorbell record's 1:0.
    pub const RESERVED: &[(usize, u32)] = &[
        (0x04, 0xf8ff_0000),
        (0x0c, !0),
        (0x10, 0xc0ff_ff00),
        (0x14, 0x7),
        (0x18, 0xff00_0000),
        (0x20, 0xffff_0000),
        (0x24, !0),
        (0x2c, 0x3),
    ];
}

/// Decoded SRQ context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqCtx {
    /// State (31:28).
    pub state: u8,
    /// log2 WQEs.
    pub log_size: u8,
    /// SRQN as written.
    pub srqn: u32,
    /// log2(stride) - 4.
    pub log_stride: u8,
    /// CQN (XRC SRQs).
    pub cqn: u32,
    /// log2(page size) - 12.
    pub log_page_size: u8,
    /// MTT offset relative to the MTT table (bytes).
    pub mtt_base: u64,
    /// PD.
    pub pd: u32,
    /// Doorbell record address.
    pub db_rec_addr: u64,
}

impl SrqCtx {
    /// Decodes the context.
    pub fn decode(b: &[u8]) -> SrqCtx {
        use srqc::*;
        let w = get32(b, STATE_LOGSIZE_SRQN);
        SrqCtx {
            state: (w >> 28) as u8,
            log_size: ((w >> 24) & 0xf) as u8,
            srqn: w & 0xff_ffff,
            log_stride: get8(b, LOGSTRIDE) & 0x7,
            cqn: get32(b, PG_OFFSET_CQN) & 0xff_ffff,
            log_page_size: get8(b, LOG_PAGE_SIZE) & 0x3f,
            mtt_base: mtt_addr(b, MTT_ADDR_H, MTT_ADDR_L),
            pd: get32(b, PD) & 0xff_ffff,
            db_rec_addr: get64(b, DB_REC_ADDR),
        }
    }
}

/// A QP context (248 bytes; in the modify mailbox it follows the 4-byte
/// optpar mask and 4 reserved bytes, i.e. starts at mailbox offset 8).
pub mod qpc {
    #![allow(missing_docs)]
    pub const MAILBOX_OPTPAR: usize = 0x00;
    pub const MAILBOX_CTX: usize = 0x08;
    pub const FLAGS: usize = 0x00;
    pub const PD: usize = 0x04;
    pub const MTU_MSGMAX: usize = 0x08;
    pub const RQ_SIZE_STRIDE: usize = 0x09;
    pub const SQ_SIZE_STRIDE: usize = 0x0a;
    pub const RLKEY: usize = 0x0b;
    pub const USR_PAGE: usize = 0x0c;
    pub const LOCAL_QPN: usize = 0x10;
    pub const REMOTE_QPN: usize = 0x14;
    pub const PRI_PATH: usize = 0x18;
    pub const ALT_PATH: usize = 0x44;
    pub const PARAMS1: usize = 0x70;
    pub const NEXT_SEND_PSN: usize = 0x78;
    pub const CQN_SEND: usize = 0x7c;
    pub const PARAMS2: usize = 0x90;
    pub const RNR_NEXTRECVPSN: usize = 0x94;
    pub const CQN_RECV: usize = 0x9c;
    pub const DB_REC_ADDR: usize = 0xa0;
    pub const QKEY: usize = 0xa8;
    pub const SRQN: usize = 0xac;
    pub const PARAM3: usize = 0xc0;
    pub const LOG_PAGE_SIZE: usize = 0xc8;
    pub const MTT_ADDR_H: usize = 0xcb;
    pub const MTT_ADDR_L: usize = 0xcc;
    pub const SIZE: usize = 0xf8;
    /// Within a path: P_Key index.
    pub const PATH_PKEY_INDEX: usize = 0x03;
    /// Within a path: remote LID.
    pub const PATH_RLID: usize = 0x06;
    /// Within a path: scheduling queue (bit 6 = port - 1).
    pub const PATH_SCHED_QUEUE: usize = 0x20;
    /// SRQN field bit 24: the QP uses an SRQ.
    pub const HAS_SRQ: u32 = 1 << 24;
}

/// QP service types (QPC flags bits 23:16).
pub mod st {
    #![allow(missing_docs)]
    pub const RC: u8 = 0;
    pub const UC: u8 = 1;
    pub const RD: u8 = 2;
    pub const UD: u8 = 3;
    pub const XRC: u8 = 6;
    pub const MLX: u8 = 7;
}

/// Decoded QP context fields the model checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCtx {
    /// State (31:28) as written by software.
    pub state: u8,
    /// Service type.
    pub st: u8,
    /// PD.
    pub pd: u32,
    /// MTU (7:5 of mtu_msgmax).
    pub mtu: u8,
    /// log2 max message.
    pub msgmax: u8,
    /// log2 RQ WQEs and log2 stride - 4.
    pub rq_log_size: u8,
    /// RQ stride.
    pub rq_log_stride: u8,
    /// log2 SQ WQEs.
    pub sq_log_size: u8,
    /// SQ stride.
    pub sq_log_stride: u8,
    /// UAR index.
    pub usr_page: u32,
    /// Local QPN.
    pub local_qpn: u32,
    /// Remote QPN.
    pub remote_qpn: u32,
    /// Primary path P_Key index.
    pub pkey_index: u8,
    /// Primary path sched_queue.
    pub sched_queue: u8,
    /// Send CQ.
    pub cqn_send: u32,
    /// Receive CQ.
    pub cqn_recv: u32,
    /// SRQ (if `has_srq`).
    pub srqn: u32,
    /// Uses an SRQ.
    pub has_srq: bool,
    /// Q_Key.
    pub qkey: u32,
    /// RQ doorbell record.
    pub db_rec_addr: u64,
    /// log2(page size) - 12.
    pub log_page_size: u8,
    /// MTT offset relative to the MTT table (bytes).
    pub mtt_base: u64,
    /// RSS (flags bit 13; Linux `MLX4_RSS_QPC_FLAG_OFFSET`): a raw
    /// Ethernet QP that spreads frames over rings and has no queues.
    pub rss: bool,
}

impl QpCtx {
    /// Decodes a context (not the mailbox: pass `&mbox[8..]`).
    pub fn decode(b: &[u8]) -> QpCtx {
        use qpc::*;
        let flags = get32(b, FLAGS);
        let rq = get8(b, RQ_SIZE_STRIDE);
        let sq = get8(b, SQ_SIZE_STRIDE);
        let srqn = get32(b, SRQN);
        QpCtx {
            state: (flags >> 28) as u8,
            st: ((flags >> 16) & 0xff) as u8,
            pd: get32(b, PD) & 0xff_ffff,
            mtu: get8(b, MTU_MSGMAX) >> 5,
            msgmax: get8(b, MTU_MSGMAX) & 0x1f,
            rq_log_size: (rq >> 3) & 0xf,
            rq_log_stride: rq & 0x7,
            sq_log_size: (sq >> 3) & 0xf,
            sq_log_stride: sq & 0x7,
            usr_page: get32(b, USR_PAGE) & 0xff_ffff,
            local_qpn: get32(b, LOCAL_QPN) & 0xff_ffff,
            remote_qpn: get32(b, REMOTE_QPN) & 0xff_ffff,
            pkey_index: get8(b, PRI_PATH + PATH_PKEY_INDEX) & 0x7f,
            sched_queue: get8(b, PRI_PATH + PATH_SCHED_QUEUE),
            cqn_send: get32(b, CQN_SEND) & 0xff_ffff,
            cqn_recv: get32(b, CQN_RECV) & 0xff_ffff,
            srqn: srqn & 0xff_ffff,
            has_srq: srqn & HAS_SRQ != 0,
            qkey: get32(b, QKEY),
            db_rec_addr: get64(b, DB_REC_ADDR),
            log_page_size: get8(b, LOG_PAGE_SIZE) & 0x3f,
            mtt_base: mtt_addr(b, MTT_ADDR_H, MTT_ADDR_L),
            rss: flags & 1 << 13 != 0,
        }
    }
    /// The port the primary path's sched_queue names (1 or 2).
    pub fn port(&self) -> u8 {
        ((self.sched_queue >> 6) & 1) + 1
    }
}

/// An MTT entry: the page's bus address if the present bit is set.
pub fn mtt_decode(b: &[u8]) -> Option<u64> {
    let v = get64(b, 0);
    (v & 1 != 0).then_some(v & !0x7)
}

/// EQE fields.
pub mod eqe {
    #![allow(missing_docs)]
    pub const TYPE: usize = 0x01;
    pub const SUBTYPE: usize = 0x03;
    pub const DATA: usize = 0x04;
    pub const OWNER: usize = 0x1f;
    pub const OWNER_BIT: u8 = 0x80;
    pub const COMP: u8 = 0x00;
    pub const PATH_MIG: u8 = 0x01;
    pub const COMM_EST: u8 = 0x02;
    pub const SQ_DRAINED: u8 = 0x03;
    pub const CQ_ERROR: u8 = 0x04;
    pub const WQ_CATAS_ERROR: u8 = 0x05;
    pub const LOCAL_CATAS_ERROR: u8 = 0x08;
    pub const PORT_CHANGE: u8 = 0x09;
    pub const CMD: u8 = 0x0a;
    pub const EQ_OVERFLOW: u8 = 0x0f;
    pub const PORT_MNG_CHG: u8 = 0x1d;
    pub const PORT_DOWN: u8 = 1;
    pub const PORT_ACTIVE: u8 = 4;
    pub const WQ_INVAL_REQ_ERROR: u8 = 0x10;
    pub const WQ_ACCESS_ERROR: u8 = 0x11;
    pub const SRQ_QP_LAST_WQE: u8 = 0x13;
    pub const SRQ_LIMIT: u8 = 0x14;
    pub const CQ_ERR_OVERRUN: u8 = 1;
    pub const CQ_ERR_ACCESS: u8 = 2;
}

/// An event to write as an EQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Completion on a CQ.
    Completion {
        /// CQN.
        cqn: u32,
    },
    /// Port state change.
    PortChange {
        /// Port number.
        port: u8,
        /// Now active (else down).
        up: bool,
    },
    /// CQ error.
    CqError {
        /// CQN.
        cqn: u32,
        /// Syndrome (1 overrun, 2 access violation).
        syndrome: u8,
    },
    /// Catastrophic error.
    LocalCatas,
    /// A command completed in event mode.
    Cmd {
        /// Token.
        token: u16,
        /// Status.
        status: u8,
        /// Immediate output.
        out_param: u64,
    },
    /// An EQ overran (reported on the async EQ).
    EqOverflow {
        /// The EQ that overran.
        eqn: u32,
    },
    /// A QP-affiliated event (COMM_EST, SQ_DRAINED, WQ_*_ERROR, ...).
    Qp {
        /// EQE type.
        kind: u8,
        /// QPN.
        qpn: u32,
    },
    /// An SRQ-affiliated event (SRQ_LIMIT, SRQ_CATAS_ERROR).
    Srq {
        /// EQE type.
        kind: u8,
        /// SRQN.
        srqn: u32,
    },
}

impl Event {
    /// The EQE type.
    pub fn kind(&self) -> u8 {
        match self {
            Event::Completion { .. } => eqe::COMP,
            Event::PortChange { .. } => eqe::PORT_CHANGE,
            Event::CqError { .. } => eqe::CQ_ERROR,
            Event::LocalCatas => eqe::LOCAL_CATAS_ERROR,
            Event::Cmd { .. } => eqe::CMD,
            Event::EqOverflow { .. } => eqe::EQ_OVERFLOW,
            Event::Qp { kind, .. } | Event::Srq { kind, .. } => *kind,
        }
    }

    /// The 32-byte EQE with the given owner bit.
    pub fn encode(&self, owner: bool) -> [u8; ENTRY_32] {
        use eqe::*;
        let mut b = [0u8; ENTRY_32];
        put8(&mut b, TYPE, self.kind());
        match *self {
            Event::Completion { cqn } => put32(&mut b, DATA, cqn & 0xff_ffff),
            Event::PortChange { port, up } => {
                put8(&mut b, SUBTYPE, if up { PORT_ACTIVE } else { PORT_DOWN });
                put32(&mut b, 0x0c, u32::from(port) << 28);
            }
            Event::CqError { cqn, syndrome } => {
                put32(&mut b, DATA, cqn & 0xff_ffff);
                put8(&mut b, 0x0f, syndrome);
            }
            Event::LocalCatas => {}
            Event::Cmd {
                token,
                status,
                out_param,
            } => {
                put8(&mut b, 0x06, (token >> 8) as u8);
                put8(&mut b, 0x07, token as u8);
                put8(&mut b, 0x0f, status);
                crate::hca::layout::put64(&mut b, 0x10, out_param);
            }
            Event::EqOverflow { eqn } => put32(&mut b, DATA, eqn),
            Event::Qp { qpn, .. } => put32(&mut b, DATA, qpn & 0xff_ffff),
            Event::Srq { srqn, .. } => put32(&mut b, DATA, srqn & 0xff_ffff),
        }
        put8(&mut b, OWNER, if owner { OWNER_BIT } else { 0 });
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hca::layout::{put16, put64};

    #[test]
    fn eq_context_golden_as_linux_writes_it() {
        // Linux mlx4_create_eq: flags = status OK | state ARMED (9 << 8),
        // log_eq_size at 0x0c, intr at 0x17, log_page_size at 0x18,
        // mtt_base_addr_h at 0x1b, mtt_base_addr_l at 0x1c.
        let mut b = [0u8; 64];
        put32(&mut b, 0x00, 0x0000_0900);
        b[0x0c] = 9;
        b[0x17] = 3;
        b[0x18] = 0;
        b[0x1b] = 0x01;
        put32(&mut b, 0x1c, 0x0000_0200);
        put32(&mut b, 0x28, 0x0100_0005); // top byte reserved
        let e = EqCtx::decode(&b);
        assert_eq!(
            (e.status, e.st, e.oi, e.ec),
            (0, eqc::ST_ARMED, false, false)
        );
        assert_eq!((e.log_eq_size, e.intr, e.log_page_size), (9, 3, 0));
        assert_eq!(e.mtt_base, 0x1_0000_0200);
        assert_eq!(e.cons_index, 5);
    }

    #[test]
    fn cq_context_golden_as_linux_writes_it() {
        let mut b = [0u8; 64];
        put32(&mut b, 0x0c, 11 << 24 | 130); // logsize_usrpage
        b[0x17] = 33; // comp_eqn
        b[0x18] = 1;
        put32(&mut b, 0x1c, 0x40);
        put64(&mut b, 0x38, 0x1_0000_2000);
        let c = CqCtx::decode(&b);
        assert_eq!((c.log_size, c.usr_page, c.comp_eqn), (11, 130, 33));
        assert_eq!(
            (c.log_page_size, c.mtt_base, c.db_rec_addr),
            (1, 0x40, 0x1_0000_2000)
        );
        // iPXE's 9-bit c_eqn reaches into byte 0x16.
        b[0x16] = 1;
        assert_eq!(CqCtx::decode(&b).comp_eqn, 0x121);
    }

    #[test]
    fn mpt_golden_dma_mr_and_key_rotation() {
        // Linux DMA MR: flags = status SW (0xf<<28) | REGION | PHYSICAL | LR |
        // LW; key = hw index form; pd_flags = pd | EN_INV; length ~0.
        let mut b = [0u8; 64];
        put32(&mut b, 0x00, 0xf000_0f00);
        put32(&mut b, 0x08, 0x0000_0010); // key_to_hw_index(0x1000)
        put32(&mut b, 0x0c, 0x0300_0005);
        put64(&mut b, 0x18, u64::MAX);
        put32(&mut b, 0x38, 12);
        let m = MptEntry::decode(&b);
        assert_eq!(m.status(), mpt::STATUS_SW);
        assert_ne!(m.flags & mpt::FLAG_PHYSICAL, 0);
        assert_ne!(m.flags & mpt::FLAG_REGION, 0);
        assert_eq!((m.pd, m.pd_flags), (5, 0x0300_0000));
        assert_eq!(m.key, 0x10);
        assert_eq!(key_to_index(0x1000), 0x10, "lkey = index << 8");
        assert_eq!(key_to_index(0x1000).rotate_right(24), 0x1000);
        assert_eq!((m.length, m.entity_size, m.lkey), (u64::MAX, 12, 0));
    }

    #[test]
    fn qp_context_golden() {
        let mut b = vec![0u8; 0xf8];
        put32(&mut b, 0x00, 1 << 28 | 3 << 16 | 3 << 11); // INIT, UD, migrated
        put32(&mut b, 0x04, 7);
        b[0x08] = 5 << 5 | 12;
        b[0x09] = 8 << 3 | 2;
        b[0x0a] = 7 << 3 | 3;
        put32(&mut b, 0x0c, 129);
        put32(&mut b, 0x10, 0x48);
        b[0x18 + 0x03] = 2;
        b[0x18 + 0x20] = 0x83 | 0x40;
        put32(&mut b, 0x7c, 130);
        put32(&mut b, 0x9c, 131);
        put64(&mut b, 0xa0, 0x1_0000_3000);
        put32(&mut b, 0xa8, 0x8001_0000);
        b[0xc8] = 0;
        b[0xcb] = 0;
        put32(&mut b, 0xcc, 0x800);
        let q = QpCtx::decode(&b);
        assert_eq!((q.state, q.st, q.pd), (1, st::UD, 7));
        assert_eq!((q.mtu, q.msgmax), (5, 12));
        assert_eq!(
            (
                q.rq_log_size,
                q.rq_log_stride,
                q.sq_log_size,
                q.sq_log_stride
            ),
            (8, 2, 7, 3)
        );
        assert_eq!(
            (q.usr_page, q.local_qpn, q.pkey_index, q.port()),
            (129, 0x48, 2, 2)
        );
        assert_eq!((q.cqn_send, q.cqn_recv, q.qkey), (130, 131, 0x8001_0000));
        assert_eq!((q.db_rec_addr, q.mtt_base), (0x1_0000_3000, 0x800));
    }

    #[test]
    fn srq_context_golden() {
        let mut b = [0u8; 64];
        put32(&mut b, 0x00, 10 << 24 | 0x41);
        b[0x04] = 2;
        put32(&mut b, 0x08, 99);
        b[0x10] = 0;
        b[0x13] = 0;
        put32(&mut b, 0x14, 0x1000);
        put32(&mut b, 0x18, 3);
        put16(&mut b, 0x1e, 1024);
        put64(&mut b, 0x28, 0x1_0000_4000);
        let s = SrqCtx::decode(&b);
        assert_eq!(
            (s.state, s.log_size, s.srqn, s.log_stride),
            (0, 10, 0x41, 2)
        );
        assert_eq!(
            (s.cqn, s.mtt_base, s.pd, s.db_rec_addr),
            (99, 0x1000, 3, 0x1_0000_4000)
        );
    }

    #[test]
    fn mtt_entry_golden() {
        let mut b = [0u8; 8];
        put64(&mut b, 0, 0x1_2345_6000 | 1);
        assert_eq!(b, [0, 0, 0, 1, 0x23, 0x45, 0x60, 0x01]);
        assert_eq!(mtt_decode(&b), Some(0x1_2345_6000));
        b[7] = 0;
        assert_eq!(mtt_decode(&b), None, "present bit clear");
    }

    #[test]
    fn eqe_golden() {
        let b = Event::PortChange { port: 2, up: true }.encode(true);
        let mut want = [0u8; 32];
        want[0x01] = 0x09;
        want[0x03] = 0x04;
        want[0x0c] = 0x20;
        want[0x1f] = 0x80;
        assert_eq!(b, want);
        let c = Event::Completion { cqn: 0x12_3456 }.encode(false);
        assert_eq!(&c[0..8], &[0, 0, 0, 0, 0x00, 0x12, 0x34, 0x56]);
        assert_eq!(c[0x1f], 0);
        let e = Event::CqError {
            cqn: 7,
            syndrome: eqe::CQ_ERR_OVERRUN,
        }
        .encode(true);
        assert_eq!((e[0x01], e[0x07], e[0x0f], e[0x1f]), (0x04, 7, 1, 0x80));
        let cmd = Event::Cmd {
            token: 0xabcd,
            status: 3,
            out_param: 0x1122,
        }
        .encode(true);
        assert_eq!(
            (cmd[0x01], cmd[0x06], cmd[0x07], cmd[0x0f], cmd[0x17]),
            (0x0a, 0xab, 0xcd, 3, 0x22)
        );
    }
}
