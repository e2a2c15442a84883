//! Byte layouts of the firmware-command mailboxes the model reads or writes.
//!
//! Byte layouts of the firmware-command mailboxes the model reads or writes
//! (QUERY_FW, QUERY_DEV_CAP, QUERY_PORT, QUERY_ADAPTER, INIT_HCA/QUERY_HCA,
//! MOD_STAT_CFG, SET_PORT, ICM page lists); contexts live in [`crate::hca::ctx`],
//! MADs in [`crate::hca::mad_ifc`]; Ethernet-only and SR-IOV blocks are not
//! decoded.
//!
//! All multi-byte values are big-endian. Offsets are from iPXE's
//! `MT25408_PRM.h` (pseudo-structs list fields from bit 0 up within each
//! big-endian dword) and were checked against Linux 3.11 `fw.c`.
//!
//! # iPXE vs Linux
//!
//! * QUERY_DEV_CAP 0x1e: iPXE names the low nibble `log2_rsvd_eqs` (a log)
//!   and has a separate *count* `num_rsvd_eqs` in byte 0x18; Linux reads the
//!   0x1e nibble as a count (`reserved_eqs = field & 0xf`, then
//!   max(count, 4 * reserved UARs)). The model reports 32 reserved EQs so
//!   every reading agrees: 0x18 = 32, 0x1e = 5 (2^5), 0x48 = 8 UARs << 4.
//! * QUERY_DEV_CAP 0x23: iPXE `log_max_mtts` (MTT entries); Linux
//!   `QUERY_DEV_CAP_MAX_MTT_SEG_OFFSET` (calls it segments).
//! * QUERY_DEV_CAP 0x94 (BMME): iPXE defines bits 0..5 (bmme, win_type, mps,
//!   bl, zb, lif); Linux defines bits 1, 6, 7, 9, 10, 11. The model sets only
//!   Linux's local/remote invalidate, reserved L_Key and fast-register bits.
//! * QUERY_DEV_CAP 0x65: `log_max_pd` is 5 bits in iPXE, masked with 0x3f in
//!   Linux.
//! * QUERY_DEV_CAP 0x68 (max counters) and 0x70 (ext flags): reserved in
//!   iPXE.
//! * INIT_HCA 0x0e (cache line; Linux 3.14+ also sets bit 4), 0x58
//!   (64-byte EQE/CQE), 0x8a (Linux 3.19+ `num_sys_eqs`), 0xf8 bit 7
//!   (memory windows): present in Linux, reserved in iPXE. INIT_HCA 0x14
//!   bits 2, 4, 6, 13 (QoS, counters, flow steering, RSS of IP fragments):
//!   Linux only, each behind a capability the model does not report except
//!   QoS, which is accepted.
//! * QUERY_PORT byte 0 bit 7: iPXE `link_state`, not read by Linux; byte 0
//!   bits 3 and 4 (Linux: suggested type, default sense) are reserved in
//!   iPXE; byte 4 (`ib_link_speed`) is read only by iPXE.
//! * MOD_STAT_CFG: Linux uses op_mod 0 with a page-size mailbox (byte 2
//!   "modify", byte 3 log2 page size - 12); iPXE uses op_mod 1 (set) / 3
//!   (query) with an input modifier naming port, setup mode and an offset
//!   (for the port MAC/VPI configuration). The model implements Linux's
//!   flavour only and answers BAD_OP to the other.
//! * MAD_IFC in_mod: iPXE (from the PRM) has "extended info valid" at bit 8
//!   and the source LID at 31:16; Linux signals extended info with op_mod
//!   bit 2 instead. The model takes the port from bits 7:0 only.
//! * SET_PORT: see [`set_port_ib`].
//! * INIT_HCA table bases: iPXE shares the low bits of each base dword with
//!   the log field (`qpc_base_addr_l` is bits 31:7, `log_num_of_qp` bits
//!   4:0); Linux writes a 64-bit base and then the log byte over its last
//!   byte. Same bytes, provided the base is aligned, which the model checks.

/// 2^`log`, saturating (limits come from configuration and must not
/// overflow a shift).
pub fn pow2(log: u8) -> u64 {
    1u64.checked_shl(u32::from(log)).unwrap_or(u64::MAX)
}

/// Reads a byte (0 past the end).
pub fn get8(b: &[u8], off: usize) -> u8 {
    b.get(off).copied().unwrap_or(0)
}
/// Reads a BE16 (0 past the end).
pub fn get16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([get8(b, off), get8(b, off + 1)])
}
/// Reads a BE32 (0 past the end).
pub fn get32(b: &[u8], off: usize) -> u32 {
    u32::from(get16(b, off)) << 16 | u32::from(get16(b, off + 2))
}
/// Reads a BE64 (0 past the end).
pub fn get64(b: &[u8], off: usize) -> u64 {
    u64::from(get32(b, off)) << 32 | u64::from(get32(b, off + 4))
}
/// Writes a byte (ignored past the end).
pub fn put8(b: &mut [u8], off: usize, v: u8) {
    if let Some(x) = b.get_mut(off) {
        *x = v;
    }
}
/// Writes a BE16.
pub fn put16(b: &mut [u8], off: usize, v: u16) {
    for (i, x) in v.to_be_bytes().into_iter().enumerate() {
        put8(b, off + i, x);
    }
}
/// Writes a BE32.
pub fn put32(b: &mut [u8], off: usize, v: u32) {
    for (i, x) in v.to_be_bytes().into_iter().enumerate() {
        put8(b, off + i, x);
    }
}
/// Writes a BE64.
pub fn put64(b: &mut [u8], off: usize, v: u64) {
    for (i, x) in v.to_be_bytes().into_iter().enumerate() {
        put8(b, off + i, x);
    }
}

/// Mailbox size used by the drivers.
pub const MAILBOX_SIZE: usize = 4096;

/// QUERY_FW output.
pub mod query_fw {
    /// BE16 FW area size in 4 KiB pages.
    pub const FW_PAGES: usize = 0x00;
    /// BE16 major.
    pub const MAJOR: usize = 0x02;
    /// BE16 sub-minor (before minor!).
    pub const SUBMINOR: usize = 0x04;
    /// BE16 minor.
    pub const MINOR: usize = 0x06;
    /// BE16 command interface revision.
    pub const CMD_IF_REV: usize = 0x0a;
    /// u8 log2 max outstanding commands.
    pub const LOG_MAX_CMDS: usize = 0x0f;
    /// BE64 clear-interrupt register offset.
    pub const CLR_INT_BASE: usize = 0x20;
    /// u8: BAR pair in bits 7:6.
    pub const CLR_INT_BAR: usize = 0x28;
    /// BE64 catastrophic-error buffer offset.
    pub const CATAS_OFFSET: usize = 0x30;
    /// BE32 catastrophic-error buffer size in dwords.
    pub const CATAS_SIZE: usize = 0x38;
    /// u8: BAR pair in bits 7:6.
    pub const CATAS_BAR: usize = 0x3c;
    /// BE64 internal clock offset.
    pub const CLOCK_OFFSET: usize = 0x50;
    /// u8: BAR pair in bits 7:6.
    pub const CLOCK_BAR: usize = 0x58;
    /// Bytes the model writes.
    pub const LEN: usize = 0x100;
}

/// What QUERY_FW reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FwInfo {
    /// FW area pages (MAP_FA must cover them before RUN_FW).
    pub fw_pages: u16,
    /// (major, minor, subminor).
    pub version: (u16, u16, u16),
    /// Command interface revision.
    pub cmd_if_rev: u16,
    /// log2 of outstanding commands in event mode.
    pub log_max_cmds: u8,
    /// BAR0 offset of the clear-interrupt register.
    pub clr_int_base: u64,
    /// BAR0 offset of the catastrophic error buffer.
    pub catas_offset: u64,
    /// Its size in dwords.
    pub catas_size: u32,
    /// BAR0 offset of the internal clock.
    pub clock_offset: u64,
}

impl FwInfo {
    /// The QUERY_FW output mailbox.
    pub fn encode(&self) -> Vec<u8> {
        use query_fw::*;
        let mut b = vec![0u8; LEN];
        put16(&mut b, FW_PAGES, self.fw_pages);
        put16(&mut b, MAJOR, self.version.0);
        put16(&mut b, MINOR, self.version.1);
        put16(&mut b, SUBMINOR, self.version.2);
        put16(&mut b, CMD_IF_REV, self.cmd_if_rev);
        put8(&mut b, LOG_MAX_CMDS, self.log_max_cmds);
        put64(&mut b, CLR_INT_BASE, self.clr_int_base);
        put8(&mut b, CLR_INT_BAR, 0); // BAR 0-1
        put64(&mut b, CATAS_OFFSET, self.catas_offset);
        put32(&mut b, CATAS_SIZE, self.catas_size);
        put8(&mut b, CATAS_BAR, 0);
        put64(&mut b, CLOCK_OFFSET, self.clock_offset);
        put8(&mut b, CLOCK_BAR, 0);
        b
    }
}

/// Device limits the model enforces and QUERY_DEV_CAP reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevCap {
    /// log2 max SRQ WQEs.
    pub log_max_srq_sz: u8,
    /// log2 max QP WQEs.
    pub log_max_qp_sz: u8,
    /// log2 QPs reserved for firmware.
    pub log_rsvd_qps: u8,
    /// log2 max QPs.
    pub log_max_qps: u8,
    /// log2 reserved SRQs.
    pub log_rsvd_srqs: u8,
    /// log2 max SRQs.
    pub log_max_srqs: u8,
    /// log2 max CQEs per CQ.
    pub log_max_cq_sz: u8,
    /// log2 reserved CQs.
    pub log_rsvd_cqs: u8,
    /// log2 max CQs.
    pub log_max_cqs: u8,
    /// log2 max EQEs per EQ.
    pub log_max_eq_sz: u8,
    /// log2 max dMPTs.
    pub log_max_mpts: u8,
    /// Reserved EQs (count; see the module docs).
    pub rsvd_eqs: u8,
    /// log2 max EQs.
    pub log_max_eqs: u8,
    /// log2 reserved MTT entries.
    pub log_rsvd_mtts: u8,
    /// log2 max region size.
    pub log_max_mrw_sz: u8,
    /// log2 reserved MPTs.
    pub log_rsvd_mrws: u8,
    /// log2 max MTT entries.
    pub log_max_mtts: u8,
    /// log2 max outstanding RDMA read/atomic as requester / responder.
    pub log_max_ra_req_qp: u8,
    /// Responder side.
    pub log_max_ra_res_qp: u8,
    /// log2 global RDMA read/atomic resources.
    pub log_max_ra_res_global: u8,
    /// Local CA ACK delay.
    pub local_ca_ack_delay: u8,
    /// Number of ports.
    pub num_ports: u8,
    /// log2 max message size.
    pub log_max_msg: u8,
    /// log2 GIDs per port (old port commands).
    pub log_max_gids: u8,
    /// log2 P_Keys per port (old port commands).
    pub log_max_pkeys: u8,
    /// Static rate support bitmap.
    pub stat_rate_support: u16,
    /// Capability flags (64 bit, Linux `caps.flags` numbering).
    pub flags: u64,
    /// Reserved UARs (count).
    pub rsvd_uars: u8,
    /// UAR area: 1 MiB << uar_sz.
    pub uar_sz: u8,
    /// log2 min page size.
    pub log_pg_sz: u8,
    /// Max S/G entries per SQ WQE and max SQ descriptor bytes.
    pub max_sg_sq: u8,
    /// Max SQ descriptor size.
    pub max_desc_sz_sq: u16,
    /// Max S/G entries per RQ WQE.
    pub max_sg_rq: u8,
    /// Max RQ descriptor size.
    pub max_desc_sz_rq: u16,
    /// log2 QPs per MCG.
    pub log_max_qp_mcg: u8,
    /// Reserved MCGs.
    pub rsvd_mcgs: u8,
    /// log2 max MCGs.
    pub log_max_mcg: u8,
    /// Reserved PDs (count).
    pub rsvd_pds: u8,
    /// log2 max PDs.
    pub log_max_pd: u8,
    /// Reserved XRCDs (count).
    pub rsvd_xrcds: u8,
    /// log2 max XRCDs.
    pub log_max_xrcds: u8,
    /// Context entry sizes in bytes.
    pub rdmarc_entry_sz: u16,
    /// QPC.
    pub qpc_entry_sz: u16,
    /// AUXC.
    pub aux_entry_sz: u16,
    /// ALTC.
    pub altc_entry_sz: u16,
    /// EQC.
    pub eqc_entry_sz: u16,
    /// CQC.
    pub cqc_entry_sz: u16,
    /// SRQC.
    pub srq_entry_sz: u16,
    /// cMPT.
    pub c_mpt_entry_sz: u16,
    /// MTT.
    pub mtt_entry_sz: u16,
    /// dMPT.
    pub d_mpt_entry_sz: u16,
    /// BMME flags.
    pub bmme_flags: u32,
    /// Reserved L_Key.
    pub rsvd_lkey: u32,
    /// Max ICM bytes.
    pub max_icm_sz: u64,
}

/// QUERY_DEV_CAP output offsets.
pub mod dev_cap {
    #![allow(missing_docs)]
    pub const LOG_MAX_SRQ_SZ: usize = 0x10;
    pub const LOG_MAX_QP_SZ: usize = 0x11;
    pub const RSVD_QP: usize = 0x12;
    pub const MAX_QP: usize = 0x13;
    pub const RSVD_SRQ: usize = 0x14;
    pub const MAX_SRQ: usize = 0x15;
    pub const NUM_RSVD_EQ_IPXE: usize = 0x18;
    pub const LOG_MAX_CQ_SZ: usize = 0x19;
    pub const RSVD_CQ: usize = 0x1a;
    pub const MAX_CQ: usize = 0x1b;
    pub const LOG_MAX_EQ_SZ: usize = 0x1c;
    pub const MAX_MPT: usize = 0x1d;
    pub const RSVD_EQ: usize = 0x1e;
    pub const MAX_EQ: usize = 0x1f;
    pub const RSVD_MTT: usize = 0x20;
    pub const MAX_MRW_SZ: usize = 0x21;
    pub const RSVD_MRW: usize = 0x22;
    pub const MAX_MTT: usize = 0x23;
    pub const MAX_REQ_QP: usize = 0x29;
    pub const MAX_RES_QP: usize = 0x2b;
    pub const MAX_RDMA: usize = 0x2f;
    pub const ACK_DELAY: usize = 0x35;
    pub const NUM_PORTS: usize = 0x37;
    pub const MAX_MSG_SZ: usize = 0x38;
    pub const MAX_GID: usize = 0x3b;
    pub const RATE_SUPPORT: usize = 0x3c;
    pub const MAX_PKEY: usize = 0x3f;
    pub const FLAGS_HI: usize = 0x40;
    pub const FLAGS_LO: usize = 0x44;
    pub const RSVD_UAR: usize = 0x48;
    pub const UAR_SZ: usize = 0x49;
    pub const PAGE_SZ: usize = 0x4b;
    pub const MAX_SG_SQ: usize = 0x51;
    pub const MAX_DESC_SZ_SQ: usize = 0x52;
    pub const MAX_SG_RQ: usize = 0x55;
    pub const MAX_DESC_SZ_RQ: usize = 0x56;
    pub const QP_PER_MCG: usize = 0x61;
    pub const RSVD_MCG: usize = 0x62;
    pub const MAX_MCG: usize = 0x63;
    pub const RSVD_PD: usize = 0x64;
    pub const MAX_PD: usize = 0x65;
    pub const RSVD_XRC: usize = 0x66;
    pub const MAX_XRC: usize = 0x67;
    pub const RDMARC_ENTRY_SZ: usize = 0x80;
    pub const QPC_ENTRY_SZ: usize = 0x82;
    pub const AUX_ENTRY_SZ: usize = 0x84;
    pub const ALTC_ENTRY_SZ: usize = 0x86;
    pub const EQC_ENTRY_SZ: usize = 0x88;
    pub const CQC_ENTRY_SZ: usize = 0x8a;
    pub const SRQ_ENTRY_SZ: usize = 0x8c;
    pub const C_MPT_ENTRY_SZ: usize = 0x8e;
    pub const MTT_ENTRY_SZ: usize = 0x90;
    pub const D_MPT_ENTRY_SZ: usize = 0x92;
    pub const BMME_FLAGS: usize = 0x94;
    pub const RSVD_LKEY: usize = 0x98;
    pub const MAX_ICM_SZ: usize = 0xa0;
    pub const LEN: usize = 0x100;
}

/// `caps.flags` bits the model sets (Linux numbering).
pub mod cap_flags {
    #![allow(missing_docs)]
    pub const RC: u64 = 1 << 0;
    pub const UC: u64 = 1 << 1;
    pub const UD: u64 = 1 << 2;
    pub const SRQ: u64 = 1 << 6;
    pub const IPOIB_CSUM: u64 = 1 << 7;
    pub const BAD_PKEY_CNTR: u64 = 1 << 8;
    pub const BAD_QKEY_CNTR: u64 = 1 << 9;
    pub const BLH: u64 = 1 << 15;
    pub const MEM_WINDOW: u64 = 1 << 16;
    pub const APM: u64 = 1 << 17;
    pub const ATOMIC: u64 = 1 << 18;
    pub const RAW_MCAST: u64 = 1 << 19;
    pub const UD_AV_PORT: u64 = 1 << 20;
    pub const UD_MCAST: u64 = 1 << 21;
    pub const VEP_UC_STEER: u64 = 1 << 41;
    pub const VEP_MC_STEER: u64 = 1 << 42;
    pub const COUNTERS: u64 = 1 << 48;
    pub const PORT_MNG_CHG_EV: u64 = 1 << 59;
    pub const EQE_64B: u64 = 1 << 61;
    pub const CQE_64B: u64 = 1 << 62;
}

impl Default for DevCap {
    /// A dual-port ConnectX-3 with room for Linux's default profile.
    fn default() -> Self {
        use cap_flags::*;
        DevCap {
            log_max_srq_sz: 14,
            log_max_qp_sz: 14,
            log_rsvd_qps: 6,
            log_max_qps: 18,
            log_rsvd_srqs: 6,
            log_max_srqs: 16,
            log_max_cq_sz: 22,
            log_rsvd_cqs: 7,
            log_max_cqs: 16,
            log_max_eq_sz: 22,
            log_max_mpts: 20,
            rsvd_eqs: 32,
            log_max_eqs: 9,
            log_rsvd_mtts: 4,
            log_max_mrw_sz: 52,
            log_rsvd_mrws: 4,
            log_max_mtts: 27,
            log_max_ra_req_qp: 4,
            log_max_ra_res_qp: 4,
            log_max_ra_res_global: 23,
            local_ca_ack_delay: 15,
            num_ports: 2,
            log_max_msg: 31,
            log_max_gids: 7,
            log_max_pkeys: 7,
            stat_rate_support: 0x018f,
            flags: RC
                | UC
                | UD
                | SRQ
                | IPOIB_CSUM
                | BAD_PKEY_CNTR
                | BAD_QKEY_CNTR
                | BLH
                | MEM_WINDOW
                | APM
                | ATOMIC
                | RAW_MCAST
                | UD_AV_PORT
                | UD_MCAST
                // B0 steering, as a ConnectX-3 runs natively (Linux's
                // choose_steering_mode needs both).
                | VEP_UC_STEER
                | VEP_MC_STEER,
            rsvd_uars: 8,
            uar_sz: 3,
            log_pg_sz: 12,
            max_sg_sq: 32,
            max_desc_sz_sq: 1008,
            max_sg_rq: 32,
            max_desc_sz_rq: 512,
            log_max_qp_mcg: 3,
            rsvd_mcgs: 0,
            log_max_mcg: 13,
            rsvd_pds: 4,
            log_max_pd: 17,
            rsvd_xrcds: 0,
            log_max_xrcds: 16,
            rdmarc_entry_sz: 32,
            qpc_entry_sz: 256,
            aux_entry_sz: 64,
            altc_entry_sz: 128,
            eqc_entry_sz: 64,
            cqc_entry_sz: 64,
            srq_entry_sz: 64,
            c_mpt_entry_sz: 64,
            mtt_entry_sz: 8,
            d_mpt_entry_sz: 64,
            bmme_flags: 1 << 6 | 1 << 7 | 1 << 10 | 1 << 11,
            rsvd_lkey: 0x0000_0500,
            max_icm_sz: 1 << 36,
        }
    }
}

fn log2_floor(v: u32) -> u8 {
    if v == 0 {
        0
    } else {
        (31 - v.leading_zeros()) as u8
    }
}

impl DevCap {
    /// The QUERY_DEV_CAP output mailbox.
    pub fn encode(&self) -> Vec<u8> {
        use dev_cap::*;
        let mut b = vec![0u8; LEN];
        put8(&mut b, LOG_MAX_SRQ_SZ, self.log_max_srq_sz);
        put8(&mut b, LOG_MAX_QP_SZ, self.log_max_qp_sz);
        put8(&mut b, RSVD_QP, self.log_rsvd_qps & 0xf);
        put8(&mut b, MAX_QP, self.log_max_qps & 0x1f);
        put8(&mut b, RSVD_SRQ, self.log_rsvd_srqs << 4);
        put8(&mut b, MAX_SRQ, self.log_max_srqs & 0x1f);
        put8(&mut b, NUM_RSVD_EQ_IPXE, self.rsvd_eqs);
        put8(&mut b, LOG_MAX_CQ_SZ, self.log_max_cq_sz);
        put8(&mut b, RSVD_CQ, self.log_rsvd_cqs & 0xf);
        put8(&mut b, MAX_CQ, self.log_max_cqs & 0x1f);
        put8(&mut b, LOG_MAX_EQ_SZ, self.log_max_eq_sz);
        put8(&mut b, MAX_MPT, self.log_max_mpts & 0x3f);
        put8(&mut b, RSVD_EQ, log2_floor(u32::from(self.rsvd_eqs)) & 0xf);
        put8(&mut b, MAX_EQ, self.log_max_eqs & 0xf);
        put8(&mut b, RSVD_MTT, self.log_rsvd_mtts << 4);
        put8(&mut b, MAX_MRW_SZ, self.log_max_mrw_sz);
        put8(&mut b, RSVD_MRW, self.log_rsvd_mrws & 0xf);
        put8(&mut b, MAX_MTT, self.log_max_mtts & 0x3f);
        put8(&mut b, MAX_REQ_QP, self.log_max_ra_req_qp & 0x3f);
        put8(&mut b, MAX_RES_QP, self.log_max_ra_res_qp & 0x3f);
        put8(&mut b, MAX_RDMA, self.log_max_ra_res_global & 0x3f);
        put8(&mut b, ACK_DELAY, self.local_ca_ack_delay & 0x1f);
        put8(&mut b, NUM_PORTS, self.num_ports & 0xf);
        put8(&mut b, MAX_MSG_SZ, self.log_max_msg & 0x1f);
        put8(&mut b, MAX_GID, self.log_max_gids & 0xf);
        put16(&mut b, RATE_SUPPORT, self.stat_rate_support);
        put8(&mut b, MAX_PKEY, self.log_max_pkeys & 0xf);
        put32(&mut b, FLAGS_HI, (self.flags >> 32) as u32);
        put32(&mut b, FLAGS_LO, self.flags as u32);
        put8(&mut b, RSVD_UAR, self.rsvd_uars << 4);
        put8(&mut b, UAR_SZ, self.uar_sz & 0x3f);
        put8(&mut b, PAGE_SZ, self.log_pg_sz);
        put8(&mut b, MAX_SG_SQ, self.max_sg_sq);
        put16(&mut b, MAX_DESC_SZ_SQ, self.max_desc_sz_sq);
        put8(&mut b, MAX_SG_RQ, self.max_sg_rq);
        put16(&mut b, MAX_DESC_SZ_RQ, self.max_desc_sz_rq);
        put8(&mut b, QP_PER_MCG, self.log_max_qp_mcg);
        put8(&mut b, RSVD_MCG, self.rsvd_mcgs & 0xf);
        put8(&mut b, MAX_MCG, self.log_max_mcg);
        put8(&mut b, RSVD_PD, self.rsvd_pds << 4);
        put8(&mut b, MAX_PD, self.log_max_pd & 0x3f);
        put8(&mut b, RSVD_XRC, self.rsvd_xrcds << 4);
        put8(&mut b, MAX_XRC, self.log_max_xrcds & 0x1f);
        put16(&mut b, RDMARC_ENTRY_SZ, self.rdmarc_entry_sz);
        put16(&mut b, QPC_ENTRY_SZ, self.qpc_entry_sz);
        put16(&mut b, AUX_ENTRY_SZ, self.aux_entry_sz);
        put16(&mut b, ALTC_ENTRY_SZ, self.altc_entry_sz);
        put16(&mut b, EQC_ENTRY_SZ, self.eqc_entry_sz);
        put16(&mut b, CQC_ENTRY_SZ, self.cqc_entry_sz);
        put16(&mut b, SRQ_ENTRY_SZ, self.srq_entry_sz);
        put16(&mut b, C_MPT_ENTRY_SZ, self.c_mpt_entry_sz);
        put16(&mut b, MTT_ENTRY_SZ, self.mtt_entry_sz);
        put16(&mut b, D_MPT_ENTRY_SZ, self.d_mpt_entry_sz);
        put32(&mut b, BMME_FLAGS, self.bmme_flags);
        put32(&mut b, RSVD_LKEY, self.rsvd_lkey);
        put64(&mut b, MAX_ICM_SZ, self.max_icm_sz);
        b
    }

    /// Reserved QPs (count).
    pub fn rsvd_qps(&self) -> u32 {
        pow2(self.log_rsvd_qps).min(u64::from(u32::MAX)) as u32
    }
    /// Reserved CQs (count).
    pub fn rsvd_cqs(&self) -> u32 {
        pow2(self.log_rsvd_cqs).min(u64::from(u32::MAX)) as u32
    }
    /// Reserved SRQs (count).
    pub fn rsvd_srqs(&self) -> u32 {
        pow2(self.log_rsvd_srqs).min(u64::from(u32::MAX)) as u32
    }
    /// Reserved MPTs (count).
    pub fn rsvd_mrws(&self) -> u32 {
        pow2(self.log_rsvd_mrws).min(u64::from(u32::MAX)) as u32
    }
    /// Firmware-reserved MTT entries (count; a driver's MTT allocator
    /// starts above them: Linux `mlx4_init_mr_table`, iPXE
    /// `hermon_alloc_mtt`).
    pub fn rsvd_mtts(&self) -> u32 {
        pow2(self.log_rsvd_mtts).min(u64::from(u32::MAX)) as u32
    }
    /// Number of UAR pages in BAR2.
    pub fn num_uars(&self) -> u32 {
        (pow2(self.uar_sz.saturating_add(20)) >> 12).min(u64::from(u32::MAX)) as u32
    }
}

/// QUERY_PORT (cmd_if_rev >= 3) output.
pub mod query_port {
    #![allow(missing_docs)]
    pub const SUPPORTED_TYPE: usize = 0x00;
    pub const IB_MTU: usize = 0x01;
    pub const ETH_MTU: usize = 0x02;
    pub const WIDTH: usize = 0x06;
    pub const MAX_GID_PKEY: usize = 0x07;
    pub const MAX_MACVLAN: usize = 0x0a;
    pub const MAX_VL: usize = 0x0b;
    pub const MAC: usize = 0x10;
    pub const LEN: usize = 0x40;
}

/// What QUERY_PORT reports for one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortCap {
    /// IB MTU capability (IB enum: 5 = 4096).
    pub ib_mtu: u8,
    /// Supported widths (IB bitmask: 1 = 1x, 2 = 4x).
    pub width: u8,
    /// log2 GID table size.
    pub log_max_gids: u8,
    /// log2 P_Key table size.
    pub log_max_pkeys: u8,
    /// Max VL (IB VLCap enum: 4 = VL0..7).
    pub max_vl: u8,
}

impl PortCap {
    /// The QUERY_PORT output mailbox (IB-only port: types = 1, no
    /// suggested type, no default sense).
    pub fn encode(&self) -> Vec<u8> {
        use query_port::*;
        let mut b = vec![0u8; LEN];
        put8(&mut b, SUPPORTED_TYPE, 0x01);
        put8(&mut b, IB_MTU, self.ib_mtu & 0xf);
        put8(&mut b, WIDTH, self.width & 0xf);
        put8(
            &mut b,
            MAX_GID_PKEY,
            self.log_max_gids << 4 | (self.log_max_pkeys & 0xf),
        );
        put8(&mut b, MAX_VL, self.max_vl & 0xf);
        b
    }
}

/// QUERY_ADAPTER output.
pub mod query_adapter {
    /// u8 INTA pin.
    pub const INTA_PIN: usize = 0x10;
    /// Vendor-specific data.
    pub const VSD: usize = 0x20;
    /// Board id within the VSD (16 bytes, each dword byte-swapped).
    pub const VSD_BOARD_ID: usize = 0xd0;
    /// Bytes written.
    pub const LEN: usize = 0x120;
}

/// The QUERY_ADAPTER output mailbox: INTA pin and a Mellanox-layout VSD whose
/// board id reads as `board_id` after Linux's per-dword swab32.
pub fn encode_query_adapter(inta_pin: u8, board_id: &str) -> Vec<u8> {
    use query_adapter::*;
    let mut b = vec![0u8; LEN];
    put8(&mut b, INTA_PIN, inta_pin);
    let mut id = [0u8; 16];
    for (d, s) in id.iter_mut().zip(board_id.bytes()) {
        *d = s;
    }
    for (i, chunk) in id.chunks(4).enumerate() {
        for (j, &c) in chunk.iter().enumerate() {
            put8(&mut b, VSD + VSD_BOARD_ID + i * 4 + (3 - j), c);
        }
    }
    b
}

/// INIT_HCA input / QUERY_HCA output.
pub mod init_hca {
    #![allow(missing_docs)]
    pub const VERSION: usize = 0x00;
    pub const CORE_CLOCK: usize = 0x0c;
    pub const CACHELINE: usize = 0x0e;
    pub const FLAGS: usize = 0x14;
    pub const QPC_BASE: usize = 0x30;
    pub const LOG_QP: usize = 0x37;
    pub const SRQC_BASE: usize = 0x48;
    pub const LOG_SRQ: usize = 0x4f;
    pub const CQC_BASE: usize = 0x50;
    pub const LOG_CQ: usize = 0x57;
    pub const EQE_CQE_64: usize = 0x58;
    pub const ALTC_BASE: usize = 0x60;
    pub const AUXC_BASE: usize = 0x70;
    pub const EQC_BASE: usize = 0x80;
    pub const LOG_EQ: usize = 0x87;
    pub const RDMARC_BASE: usize = 0x90;
    pub const LOG_RD: usize = 0x97;
    pub const MC_BASE: usize = 0xc0;
    pub const LOG_MC_ENTRY: usize = 0xd3;
    pub const LOG_MC_HASH: usize = 0xd7;
    pub const UC_STEERING: usize = 0xd8;
    pub const LOG_MC_TABLE: usize = 0xdb;
    pub const DMPT_BASE: usize = 0xf0;
    pub const MW_ENABLE: usize = 0xf8;
    pub const LOG_MPT: usize = 0xfb;
    pub const MTT_BASE: usize = 0x100;
    pub const CMPT_BASE: usize = 0x108;
    pub const LOG_UARS: usize = 0x12a;
    pub const UAR_PAGE_SZ: usize = 0x12b;
    pub const LEN: usize = 0x200;
    /// The only version the model accepts.
    pub const VERSION_2: u8 = 2;
    /// Flags bit 0: check the port of UD address vectors (iPXE `udp`).
    pub const FLAG_UD_PORT_CHECK: u32 = 1 << 0;
    /// Flags bit 1: host is big-endian (iPXE `he`).
    pub const FLAG_HOST_BE: u32 = 1 << 1;
    /// Flags bit 2: QoS (Linux `enable_qos`; reserved in iPXE).
    pub const FLAG_QOS: u32 = 1 << 2;
    /// Flags bit 3: IPoIB checksum (iPXE `ce`).
    pub const FLAG_IPOIB_CSUM: u32 = 1 << 3;
    /// Flags bit 4: counters (Linux; reserved in iPXE).
    pub const FLAG_COUNTERS: u32 = 1 << 4;
    /// Flags bit 6: device-managed flow steering (Linux; reserved in iPXE).
    pub const FLAG_FLOW_STEERING: u32 = 1 << 6;
    /// 0x58 bit 29: 64-byte EQEs.
    pub const EQE_64: u32 = 1 << 29;
    /// 0x58 bit 30: 64-byte CQEs.
    pub const CQE_64: u32 = 1 << 30;
}

/// The INIT_HCA parameters the model uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InitHca {
    /// Mailbox version.
    pub version: u8,
    /// Cache line field ((log2 - 4) << 5).
    pub cacheline: u8,
    /// Flags dword.
    pub flags: u32,
    /// QPC base and log count.
    pub qpc_base: u64,
    /// log2 QPs.
    pub log_num_qps: u8,
    /// SRQC base.
    pub srqc_base: u64,
    /// log2 SRQs.
    pub log_num_srqs: u8,
    /// CQC base.
    pub cqc_base: u64,
    /// log2 CQs.
    pub log_num_cqs: u8,
    /// 64-byte entry flags.
    pub eqe_cqe_64: u32,
    /// ALTC base.
    pub altc_base: u64,
    /// AUXC base.
    pub auxc_base: u64,
    /// EQC base.
    pub eqc_base: u64,
    /// log2 EQs.
    pub log_num_eqs: u8,
    /// RDMARC base.
    pub rdmarc_base: u64,
    /// log2 RDMARC entries per QP.
    pub log_rd_per_qp: u8,
    /// MCG table base.
    pub mc_base: u64,
    /// log2 MCG entry size.
    pub log_mc_entry_sz: u8,
    /// log2 MCG hash size.
    pub log_mc_hash_sz: u8,
    /// log2 MCG table size.
    pub log_mc_table_sz: u8,
    /// dMPT base.
    pub dmpt_base: u64,
    /// log2 MPTs.
    pub log_mpt_sz: u8,
    /// MTT base.
    pub mtt_base: u64,
    /// cMPT base.
    pub cmpt_base: u64,
    /// log2 UARs.
    pub log_uars: u8,
    /// UAR page size (log2(page) - 12).
    pub uar_page_sz: u8,
}

impl InitHca {
    /// Decodes the INIT_HCA mailbox. Bases are returned with the log bits
    /// that share their last byte masked off.
    pub fn decode(b: &[u8]) -> InitHca {
        use init_hca::*;
        InitHca {
            version: get8(b, VERSION),
            cacheline: get8(b, CACHELINE),
            flags: get32(b, FLAGS),
            qpc_base: get64(b, QPC_BASE) & !0x1f,
            log_num_qps: get8(b, LOG_QP) & 0x1f,
            srqc_base: get64(b, SRQC_BASE) & !0x1f,
            log_num_srqs: get8(b, LOG_SRQ) & 0x1f,
            cqc_base: get64(b, CQC_BASE) & !0x1f,
            log_num_cqs: get8(b, LOG_CQ) & 0x1f,
            eqe_cqe_64: get32(b, EQE_CQE_64),
            altc_base: get64(b, ALTC_BASE),
            auxc_base: get64(b, AUXC_BASE),
            eqc_base: get64(b, EQC_BASE) & !0x1f,
            log_num_eqs: get8(b, LOG_EQ) & 0x1f,
            rdmarc_base: get64(b, RDMARC_BASE) & !0x1f,
            log_rd_per_qp: get8(b, LOG_RD) & 0x7,
            mc_base: get64(b, MC_BASE),
            log_mc_entry_sz: get8(b, LOG_MC_ENTRY) & 0x1f,
            log_mc_hash_sz: get8(b, LOG_MC_HASH) & 0x1f,
            log_mc_table_sz: get8(b, LOG_MC_TABLE) & 0x1f,
            dmpt_base: get64(b, DMPT_BASE),
            log_mpt_sz: get8(b, LOG_MPT) & 0x3f,
            mtt_base: get64(b, MTT_BASE),
            cmpt_base: get64(b, CMPT_BASE),
            log_uars: get8(b, LOG_UARS) & 0xf,
            uar_page_sz: get8(b, UAR_PAGE_SZ),
        }
    }

    /// Encodes the mailbox (for QUERY_HCA and for tests).
    pub fn encode(&self) -> Vec<u8> {
        use init_hca::*;
        let mut b = vec![0u8; LEN];
        put8(&mut b, VERSION, self.version);
        put8(&mut b, CACHELINE, self.cacheline);
        put32(&mut b, FLAGS, self.flags);
        put64(&mut b, QPC_BASE, self.qpc_base);
        put8(&mut b, LOG_QP, self.log_num_qps);
        put64(&mut b, SRQC_BASE, self.srqc_base);
        put8(&mut b, LOG_SRQ, self.log_num_srqs);
        put64(&mut b, CQC_BASE, self.cqc_base);
        put8(&mut b, LOG_CQ, self.log_num_cqs);
        put32(&mut b, EQE_CQE_64, self.eqe_cqe_64);
        put64(&mut b, ALTC_BASE, self.altc_base);
        put64(&mut b, AUXC_BASE, self.auxc_base);
        put64(&mut b, EQC_BASE, self.eqc_base);
        put8(&mut b, LOG_EQ, self.log_num_eqs);
        put64(&mut b, RDMARC_BASE, self.rdmarc_base);
        put8(&mut b, LOG_RD, self.log_rd_per_qp);
        put64(&mut b, MC_BASE, self.mc_base);
        put16(&mut b, LOG_MC_ENTRY - 1, u16::from(self.log_mc_entry_sz));
        put16(&mut b, LOG_MC_HASH - 1, u16::from(self.log_mc_hash_sz));
        put8(&mut b, LOG_MC_TABLE, self.log_mc_table_sz);
        put64(&mut b, DMPT_BASE, self.dmpt_base);
        put8(&mut b, LOG_MPT, self.log_mpt_sz);
        put64(&mut b, MTT_BASE, self.mtt_base);
        put64(&mut b, CMPT_BASE, self.cmpt_base);
        put8(&mut b, LOG_UARS, self.log_uars);
        put8(&mut b, UAR_PAGE_SZ, self.uar_page_sz);
        b
    }
}

/// MOD_STAT_CFG input: byte 2 = "modify page size" flag, byte 3 = log2 page
/// size - 12.
pub mod mod_stat_cfg {
    /// u8: 1 = modify the page size.
    pub const PG_SZ_M: usize = 0x02;
    /// u8: log2(page size) - 12.
    pub const PG_SZ: usize = 0x03;
    /// Query (op_mod 2): be32 port GUID [63:32] (iPXE `guid_hi`, dword 5;
    /// Linux `MOD_STAT_CFG_GUID_H`).
    pub const GUID_HI: usize = 0x14;
    /// Query: be32 port GUID [31:0] (iPXE `guid_lo`, dword 7; Linux
    /// `MOD_STAT_CFG_GUID_L`).
    pub const GUID_LO: usize = 0x1c;
    /// Query: be32 node GUID [63:32] (iPXE `nodeguid_hi`).
    pub const NODEGUID_HI: usize = 0x24;
    /// Query: be32 node GUID [31:0] (iPXE `nodeguid_lo`).
    pub const NODEGUID_LO: usize = 0x2c;
    /// Size of the static-configuration block the query returns.
    pub const QUERY_LEN: usize = 0x100;
}

/// SET_PORT (IB, op_mod 0) input. Linux's change bits 22/21/20 are iPXE's
/// `mmc`/`mvc`/`mp`; iPXE also defines `mg` (19, max GID at 0x2a), `sig`,
/// `ng`, `g0` (18..16) and link width/speed bits (27, 28) that Linux never
/// sets.
pub mod set_port_ib {
    /// BE32 flags and capabilities.
    pub const FLAGS: usize = 0x00;
    /// BE32 capability mask.
    pub const CAP_MASK: usize = 0x04;
    /// BE16 P_Key table size.
    pub const PKEY_TABLE_SIZE: usize = 0x28;
    /// Bit 22: change the MTU capability.
    pub const CHANGE_MTU: u32 = 1 << 22;
    /// Bit 21: change the VL capability.
    pub const CHANGE_VL: u32 = 1 << 21;
    /// Bit 20: change the P_Key table size.
    pub const CHANGE_PKEY: u32 = 1 << 20;
    /// Bits 15:12: MTU capability (IB enum).
    pub const MTU_SHIFT: u32 = 12;
    /// Bits 7:4: VL capability (number of data VLs).
    pub const VL_SHIFT: u32 = 4;
    /// Byte 3 bit 0 (mlx4_ib): reset the Q_Key violation counter.
    pub const RESET_QKEY_CNTR: u32 = 1 << 0;
    /// Bit 16 (iPXE `g0`): replace GUID0 with the BE64 at [`GUID0`].
    pub const CHANGE_GUID0: u32 = 1 << 16;
    /// Bit 17 (iPXE `ng`): replace the node GUID.
    pub const CHANGE_NODE_GUID: u32 = 1 << 17;
    /// Bit 18 (iPXE `sig`): replace the system image GUID.
    pub const CHANGE_SYS_IMAGE_GUID: u32 = 1 << 18;
    /// BE64 system image GUID (iPXE only).
    pub const SYS_IMAGE_GUID: usize = 0x08;
    /// BE64 GUID0 (iPXE only).
    pub const GUID0: usize = 0x10;
    /// BE64 node GUID (iPXE only).
    pub const NODE_GUID: usize = 0x18;
}

/// One 16-byte ICM page-list entry (MAP_FA / MAP_ICM_AUX / MAP_ICM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageEntry {
    /// ICM virtual address (MAP_ICM only).
    pub va: u64,
    /// Physical (bus) address of the chunk.
    pub pa: u64,
    /// log2(chunk size) - 12.
    pub log_size: u8,
}

impl PageEntry {
    /// Decodes entry `i` of a page-list mailbox.
    pub fn decode(b: &[u8], i: usize) -> PageEntry {
        let raw = get64(b, i * 16 + 8);
        PageEntry {
            va: get64(b, i * 16),
            pa: raw & !0xfff,
            log_size: (raw & 0x3f) as u8,
        }
    }
    /// Encodes the entry at `i`.
    pub fn encode(&self, b: &mut [u8], i: usize) {
        put64(b, i * 16, self.va);
        put64(b, i * 16 + 8, self.pa | u64::from(self.log_size));
    }
    /// Chunk size in bytes.
    pub fn bytes(&self) -> u64 {
        4096u64 << self.log_size.min(40)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_fw_golden() {
        let b = FwInfo {
            fw_pages: 0x0123,
            version: (2, 42, 5000),
            cmd_if_rev: 3,
            log_max_cmds: 4,
            clr_int_base: 0xb_0000,
            catas_offset: 0xa_0000,
            catas_size: 16,
            clock_offset: 0xc_0000,
        }
        .encode();
        // 0x00: fw_pages, major; 0x04: subminor (5000 = 0x1388), minor (42).
        assert_eq!(&b[0..8], &[0x01, 0x23, 0x00, 0x02, 0x13, 0x88, 0x00, 0x2a]);
        assert_eq!(&b[0x08..0x10], &[0, 0, 0, 3, 0, 0, 0, 4]);
        assert_eq!(&b[0x20..0x28], &[0, 0, 0, 0, 0, 0x0b, 0, 0]);
        assert_eq!(b[0x28], 0);
        assert_eq!(&b[0x30..0x3c], &[0, 0, 0, 0, 0, 0x0a, 0, 0, 0, 0, 0, 16]);
        assert_eq!(&b[0x50..0x58], &[0, 0, 0, 0, 0, 0x0c, 0, 0]);
        // Linux's caps.fw_ver swap: (u64 at 0 & 0xffff_0000_0000) | ...
        let raw = get64(&b, 0);
        let fw_ver =
            (raw & 0xffff_0000_0000) | ((raw & 0xffff_0000) >> 16) | ((raw & 0xffff) << 16);
        assert_eq!(fw_ver, 2 << 32 | 42 << 16 | 5000);
    }

    #[test]
    fn query_dev_cap_golden() {
        let b = DevCap::default().encode();
        assert_eq!(&b[0x10..0x14], &[14, 14, 6, 18]);
        assert_eq!(&b[0x14..0x16], &[0x60, 16]);
        assert_eq!(&b[0x18..0x20], &[32, 22, 7, 16, 22, 20, 5, 9]);
        assert_eq!(&b[0x20..0x24], &[0x40, 52, 4, 27]);
        assert_eq!((b[0x29], b[0x2b], b[0x2f]), (4, 4, 23));
        assert_eq!(
            (b[0x35], b[0x37], b[0x38], b[0x3b], b[0x3f]),
            (15, 2, 31, 7, 7)
        );
        assert_eq!(&b[0x3c..0x3e], &[0x01, 0x8f]);
        // RC UC UD SRQ CSUM PKEY QKEY BLH MW APM ATOMIC RAW_MCAST AV_PORT UD_MCAST,
        // and VEP_UC_STEER VEP_MC_STEER (bits 41 and 42: B0 steering).
        assert_eq!(&b[0x40..0x48], &[0, 0, 0x06, 0, 0x00, 0x3f, 0x83, 0xc7]);
        assert_eq!(&b[0x48..0x4c], &[0x80, 3, 0, 12]);
        assert_eq!(&b[0x50..0x58], &[0, 32, 0x03, 0xf0, 0, 32, 0x02, 0x00]);
        assert_eq!(&b[0x60..0x68], &[0, 3, 0, 13, 0x40, 17, 0x00, 16]);
        assert_eq!(
            &b[0x80..0x94],
            &[
                0, 32, 1, 0, 0, 64, 0, 128, 0, 64, 0, 64, 0, 64, 0, 64, 0, 8, 0, 64
            ]
        );
        assert_eq!(&b[0x94..0x9c], &[0, 0, 0x0c, 0xc0, 0, 0, 0x05, 0x00]);
        assert_eq!(&b[0xa0..0xa8], &[0, 0, 0, 0x10, 0, 0, 0, 0]);
        assert_eq!(DevCap::default().num_uars(), 2048);
    }

    #[test]
    fn query_port_and_adapter_golden() {
        let p = PortCap {
            ib_mtu: 5,
            width: 3,
            log_max_gids: 7,
            log_max_pkeys: 7,
            max_vl: 4,
        }
        .encode();
        assert_eq!(&p[0..0x0c], &[1, 5, 0, 0, 0, 0, 3, 0x77, 0, 0, 0, 4]);
        let a = encode_query_adapter(1, "MT_1090120019");
        assert_eq!(a[0x10], 1);
        // Linux: board_id dword i = swab32(*(u32 *)(vsd + 0xd0 + 4i)).
        assert_eq!(&a[0xf0..0x100], b"1_TM10901002\x00\x00\x009");
    }

    #[test]
    fn init_hca_golden_both_ways() {
        let mut b = vec![0u8; 0x200];
        b[0x00] = 2;
        b[0x0e] = 0x40;
        put64(&mut b, 0x30, 0x1_0000_0000);
        b[0x37] = 18;
        put64(&mut b, 0x50, 0x2000_0000);
        b[0x57] = 16;
        put64(&mut b, 0x80, 0x3000_0000);
        b[0x87] = 6;
        put64(&mut b, 0x90, 0x4000_0000);
        b[0x97] = 4;
        put64(&mut b, 0xc0, 0x5000_0000);
        b[0xd3] = 10;
        b[0xd7] = 13;
        b[0xdb] = 14;
        put64(&mut b, 0xf0, 0x6000_0000);
        b[0xfb] = 19;
        put64(&mut b, 0x100, 0x7000_0000);
        put64(&mut b, 0x108, 0);
        b[0x12a] = 11;
        let h = InitHca::decode(&b);
        assert_eq!((h.version, h.cacheline), (2, 0x40));
        assert_eq!((h.qpc_base, h.log_num_qps), (0x1_0000_0000, 18));
        assert_eq!((h.cqc_base, h.log_num_cqs), (0x2000_0000, 16));
        assert_eq!((h.eqc_base, h.log_num_eqs), (0x3000_0000, 6));
        assert_eq!((h.rdmarc_base, h.log_rd_per_qp), (0x4000_0000, 4));
        assert_eq!(
            (
                h.mc_base,
                h.log_mc_entry_sz,
                h.log_mc_hash_sz,
                h.log_mc_table_sz
            ),
            (0x5000_0000, 10, 13, 14)
        );
        assert_eq!(
            (h.dmpt_base, h.log_mpt_sz, h.mtt_base),
            (0x6000_0000, 19, 0x7000_0000)
        );
        assert_eq!((h.log_uars, h.uar_page_sz), (11, 0));
        assert_eq!(h.encode(), b);
    }

    #[test]
    fn page_list_entry_golden() {
        let mut b = vec![0u8; 32];
        PageEntry {
            va: 0x4_0000,
            pa: 0x1_2340_0000,
            log_size: 6,
        }
        .encode(&mut b, 1);
        assert_eq!(
            &b[16..32],
            &[
                0, 0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0, 0x01, 0x23, 0x40, 0x00, 0x06
            ]
        );
        let e = PageEntry::decode(&b, 1);
        assert_eq!(
            (e.va, e.pa, e.log_size, e.bytes()),
            (0x4_0000, 0x1_2340_0000, 6, 0x4_0000)
        );
    }
}
