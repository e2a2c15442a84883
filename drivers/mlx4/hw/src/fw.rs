//! Mailbox layouts of the HCA-level commands (Linux `fw.c`'s offset tables).
//!
//! QUERY_FW, QUERY_DEV_CAP, QUERY_PORT, QUERY_ADAPTER, MOD_STAT_CFG,
//! INIT_HCA/QUERY_HCA. Left out: the SR-IOV QUERY_FUNC_CAP and device-managed
//! flow-steering blocks.

use hal::be::*;

/// QUERY_FW output offsets.
pub mod query_fw {
    #![allow(missing_docs)]
    /// BE64: `fw_pages` (BE16 at 0) | major (BE16) | subminor (BE16) | minor (BE16).
    pub const VER_OFFSET: usize = 0x00;
    pub const SIZE_OFFSET: usize = 0x00;
    pub const PPF_ID_OFFSET: usize = 0x09;
    pub const CMD_IF_REV_OFFSET: usize = 0x0a;
    pub const MAX_CMD_OFFSET: usize = 0x0f;
    pub const CLR_INT_BASE_OFFSET: usize = 0x20;
    pub const CLR_INT_BAR_OFFSET: usize = 0x28;
    pub const ERR_START_OFFSET: usize = 0x30;
    pub const ERR_SIZE_OFFSET: usize = 0x38;
    pub const ERR_BAR_OFFSET: usize = 0x3c;
    pub const OUT_SIZE: usize = 0x100;
    /// Oldest command interface revision the driver accepts.
    pub const COMMAND_INTERFACE_MIN_REV: u16 = 2;
    /// Newest command interface revision the driver accepts.
    pub const COMMAND_INTERFACE_MAX_REV: u16 = 3;
    /// From this revision on, port commands are the "new" ones (QUERY_PORT).
    pub const COMMAND_INTERFACE_NEW_PORT_CMDS: u16 = 3;
}

/// Linux swaps minor and subminor so that `fw_ver` = major<<32 | minor<<16 | subminor.
pub const fn fw_ver_from_raw(raw: u64) -> u64 {
    (raw & 0xffff_0000_0000) | ((raw & 0xffff_0000) >> 16) | ((raw & 0xffff) << 16)
}

/// `(bar_field >> 6) * 2`: the BAR index encoding of QUERY_FW.
pub const fn bar_index(field: u8) -> u8 {
    (field >> 6) * 2
}

/// QUERY_DEV_CAP output offsets (`QUERY_DEV_CAP_*_OFFSET`).
pub mod dev_cap {
    #![allow(missing_docs)]
    pub const OUT_SIZE: usize = 0x100;
    pub const MAX_SRQ_SZ: usize = 0x10;
    pub const MAX_QP_SZ: usize = 0x11;
    pub const RSVD_QP: usize = 0x12;
    pub const MAX_QP: usize = 0x13;
    pub const RSVD_SRQ: usize = 0x14;
    pub const MAX_SRQ: usize = 0x15;
    pub const MAX_CQ_SZ: usize = 0x19;
    pub const RSVD_CQ: usize = 0x1a;
    pub const MAX_CQ: usize = 0x1b;
    pub const MAX_MPT: usize = 0x1d;
    pub const RSVD_EQ: usize = 0x1e;
    pub const MAX_EQ: usize = 0x1f;
    pub const RSVD_MTT: usize = 0x20;
    pub const MAX_MRW_SZ: usize = 0x21;
    pub const RSVD_MRW: usize = 0x22;
    pub const MAX_MTT_SEG: usize = 0x23;
    pub const MAX_REQ_QP: usize = 0x29;
    pub const MAX_RES_QP: usize = 0x2b;
    pub const MAX_GSO: usize = 0x2d;
    pub const MAX_RDMA: usize = 0x2f;
    pub const RSZ_SRQ: usize = 0x33;
    pub const ACK_DELAY: usize = 0x35;
    pub const MTU_WIDTH: usize = 0x36;
    pub const VL_PORT: usize = 0x37;
    pub const MAX_MSG_SZ: usize = 0x38;
    pub const MAX_GID: usize = 0x3b;
    pub const RATE_SUPPORT: usize = 0x3c;
    pub const CQ_TS_SUPPORT: usize = 0x3e;
    pub const MAX_PKEY: usize = 0x3f;
    pub const EXT_FLAGS: usize = 0x40;
    pub const FLAGS: usize = 0x44;
    pub const RSVD_UAR: usize = 0x48;
    pub const UAR_SZ: usize = 0x49;
    pub const PAGE_SZ: usize = 0x4b;
    pub const BF: usize = 0x4c;
    pub const LOG_BF_REG_SZ: usize = 0x4d;
    pub const LOG_MAX_BF_REGS_PER_PAGE: usize = 0x4e;
    pub const MAX_SG_SQ: usize = 0x51;
    pub const MAX_DESC_SZ_SQ: usize = 0x52;
    pub const MAX_SG_RQ: usize = 0x55;
    pub const MAX_DESC_SZ_RQ: usize = 0x56;
    pub const MAX_QP_MCG: usize = 0x61;
    pub const RSVD_MCG: usize = 0x62;
    pub const MAX_MCG: usize = 0x63;
    pub const RSVD_PD: usize = 0x64;
    pub const MAX_PD: usize = 0x65;
    pub const RSVD_XRC: usize = 0x66;
    pub const MAX_XRC: usize = 0x67;
    pub const MAX_COUNTERS: usize = 0x68;
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
}

/// `caps.flags` bits (`MLX4_DEV_CAP_FLAG_*`, device.h).
pub mod dev_cap_flags {
    #![allow(missing_docs)]
    pub const RC: u64 = 1 << 0;
    pub const UC: u64 = 1 << 1;
    pub const UD: u64 = 1 << 2;
    pub const XRC: u64 = 1 << 3;
    pub const SRQ: u64 = 1 << 6;
    pub const IPOIB_CSUM: u64 = 1 << 7;
    pub const BAD_PKEY_CNTR: u64 = 1 << 8;
    pub const BAD_QKEY_CNTR: u64 = 1 << 9;
    pub const DPDP: u64 = 1 << 12;
    pub const BLH: u64 = 1 << 15;
    pub const MEM_WINDOW: u64 = 1 << 16;
    pub const APM: u64 = 1 << 17;
    pub const ATOMIC: u64 = 1 << 18;
    pub const RAW_MCAST: u64 = 1 << 19;
    pub const UD_AV_PORT: u64 = 1 << 20;
    pub const UD_MCAST: u64 = 1 << 21;
    pub const IBOE: u64 = 1 << 30;
    pub const UC_LOOPBACK: u64 = 1 << 32;
    pub const FCS_KEEP: u64 = 1 << 34;
    pub const WOL_PORT1: u64 = 1 << 37;
    pub const WOL_PORT2: u64 = 1 << 38;
    pub const UDP_RSS: u64 = 1 << 40;
    pub const VEP_UC_STEER: u64 = 1 << 41;
    pub const VEP_MC_STEER: u64 = 1 << 42;
    pub const COUNTERS: u64 = 1 << 48;
    pub const SET_ETH_SCHED: u64 = 1 << 53;
    pub const SENSE_SUPPORT: u64 = 1 << 55;
    pub const PORT_MNG_CHG_EV: u64 = 1 << 59;
    pub const EQE_64B: u64 = 1 << 61;
    pub const CQE_64B: u64 = 1 << 62;
}

/// QUERY_PORT output offsets (command interface revision >= 3).
pub mod query_port {
    #![allow(missing_docs)]
    pub const SUPPORTED_TYPE: usize = 0x00;
    pub const MTU: usize = 0x01;
    pub const ETH_MTU: usize = 0x02;
    pub const WIDTH: usize = 0x06;
    pub const MAX_GID_PKEY: usize = 0x07;
    pub const MAX_MACVLAN: usize = 0x0a;
    pub const MAX_VL: usize = 0x0b;
    pub const MAC: usize = 0x10;
    pub const TRANS_VENDOR: usize = 0x18;
    pub const WAVELENGTH: usize = 0x1c;
    pub const TRANS_CODE: usize = 0x20;
}

/// QUERY_ADAPTER output offsets and the board-id rules of `get_board_id`.
pub mod query_adapter {
    #![allow(missing_docs)]
    pub const INTA_PIN: usize = 0x10;
    pub const VSD: usize = 0x20;
    pub const VSD_OFFSET_SIG1: usize = 0x00;
    pub const VSD_OFFSET_SIG2: usize = 0xde;
    pub const VSD_OFFSET_MLX_BOARD_ID: usize = 0xd0;
    pub const VSD_OFFSET_TS_BOARD_ID: usize = 0x20;
    pub const VSD_SIGNATURE_TOPSPIN: u16 = 0x5ad;
    /// `MLX4_BOARD_ID_LEN`.
    pub const BOARD_ID_LEN: usize = 64;
}

/// Extracts the board id from a QUERY_ADAPTER output mailbox (Linux
/// `get_board_id`): Mellanox firmware byte-swaps each dword of the 16-byte
/// string; Topspin boards keep it plain at VSD+0x20.
pub fn board_id(outbox: &[u8]) -> [u8; 16] {
    use query_adapter::*;
    let vsd = &outbox[VSD..];
    let mut id = [0u8; 16];
    if get_be16(vsd, VSD_OFFSET_SIG1) == VSD_SIGNATURE_TOPSPIN
        && get_be16(vsd, VSD_OFFSET_SIG2) == VSD_SIGNATURE_TOPSPIN
    {
        id.copy_from_slice(&vsd[VSD_OFFSET_TS_BOARD_ID..VSD_OFFSET_TS_BOARD_ID + 16]);
    } else {
        for i in 0..4 {
            let o = VSD_OFFSET_MLX_BOARD_ID + i * 4;
            // swab32 of a little-endian load = the bytes reversed.
            for j in 0..4 {
                id[i * 4 + j] = vsd[o + 3 - j];
            }
        }
    }
    id
}

/// MOD_STAT_CFG input (Linux `mlx4_mod_stat_cfg`): byte 2 = log_pg_sz_m
/// (modify), byte 3 = log page size - 12.
pub mod mod_stat_cfg {
    #![allow(missing_docs)]
    pub const IN_SIZE: usize = 0x100;
    pub const PG_SZ_M_OFFSET: usize = 0x002;
    pub const PG_SZ_OFFSET: usize = 0x003;
}

/// INIT_HCA input offsets (`INIT_HCA_*_OFFSET`); QUERY_HCA returns the same
/// layout.
pub mod init_hca {
    #![allow(missing_docs)]
    pub const IN_SIZE: usize = 0x200;
    pub const VERSION_OFFSET: usize = 0x000;
    pub const VERSION: u8 = 2;
    pub const CACHELINE_SZ_OFFSET: usize = 0x0e;
    pub const FLAGS_OFFSET: usize = 0x014;
    pub const QPC_BASE_OFFSET: usize = 0x030;
    pub const LOG_QP_OFFSET: usize = 0x037;
    pub const SRQC_BASE_OFFSET: usize = 0x048;
    pub const LOG_SRQ_OFFSET: usize = 0x04f;
    pub const CQC_BASE_OFFSET: usize = 0x050;
    pub const LOG_CQ_OFFSET: usize = 0x057;
    pub const EQE_CQE_OFFSET: usize = 0x058;
    pub const ALTC_BASE_OFFSET: usize = 0x060;
    pub const AUXC_BASE_OFFSET: usize = 0x070;
    pub const EQC_BASE_OFFSET: usize = 0x080;
    pub const LOG_EQ_OFFSET: usize = 0x087;
    pub const RDMARC_BASE_OFFSET: usize = 0x090;
    pub const LOG_RD_OFFSET: usize = 0x097;
    pub const MC_BASE_OFFSET: usize = 0x0c0;
    pub const LOG_MC_ENTRY_SZ_OFFSET: usize = 0x0d2;
    pub const LOG_MC_HASH_SZ_OFFSET: usize = 0x0d6;
    pub const UC_STEERING_OFFSET: usize = 0x0d8;
    pub const LOG_MC_TABLE_SZ_OFFSET: usize = 0x0db;
    pub const DMPT_BASE_OFFSET: usize = 0x0f0;
    /// Bit 7: memory windows enabled (`INIT_HCA_TPT_MW_ENABLE`).
    pub const TPT_MW_OFFSET: usize = 0x0f8;
    pub const TPT_MW_ENABLE: u8 = 1 << 7;
    pub const LOG_MPT_SZ_OFFSET: usize = 0x0fb;
    pub const MTT_BASE_OFFSET: usize = 0x100;
    pub const CMPT_BASE_OFFSET: usize = 0x108;
    pub const LOG_UAR_SZ_OFFSET: usize = 0x12a;
    pub const UAR_PAGE_SZ_OFFSET: usize = 0x12b;
    /// QUERY_HCA: BE16 HCA core clock in MHz.
    pub const CORE_CLOCK_OFFSET: usize = 0x00c;
    /// Flag bits in the dword at FLAGS_OFFSET.
    pub const FLAG_CHECK_PORT_UD_AV: u32 = 1 << 0;
    pub const FLAG_BIG_ENDIAN: u32 = 1 << 1;
    pub const FLAG_QOS: u32 = 1 << 2;
    pub const FLAG_IPOIB_CSUM: u32 = 1 << 3;
    pub const FLAG_COUNTERS: u32 = 1 << 4;
}

/// INIT_HCA parameters (Linux `struct mlx4_init_hca_param`, native subset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct InitHcaParam {
    pub qpc_base: u64,
    pub rdmarc_base: u64,
    pub auxc_base: u64,
    pub altc_base: u64,
    pub srqc_base: u64,
    pub cqc_base: u64,
    pub eqc_base: u64,
    pub mc_base: u64,
    pub dmpt_base: u64,
    pub cmpt_base: u64,
    pub mtt_base: u64,
    pub log_mc_entry_sz: u16,
    pub log_mc_hash_sz: u16,
    pub log_num_qps: u8,
    pub log_num_srqs: u8,
    pub log_num_cqs: u8,
    pub log_num_eqs: u8,
    pub log_rd_per_qp: u8,
    pub log_mc_table_sz: u8,
    pub log_mpt_sz: u8,
    pub log_uar_sz: u8,
    /// UAR page size as log2(page) - 12.
    pub uar_page_sz: u8,
    /// Flags dword at 0x14 (`FLAG_*`).
    pub flags: u32,
    /// Set bit 3 of byte 0xd8 (B0 unicast steering).
    pub uc_steering: bool,
    /// Enable memory windows (byte 0xf8 bit 7).
    pub mw_enabled: bool,
}

#[allow(missing_docs)]
impl InitHcaParam {
    /// The 0x200-byte INIT_HCA input mailbox (Linux `mlx4_INIT_HCA`, 64-byte
    /// cache lines).
    pub fn to_bytes(&self) -> [u8; init_hca::IN_SIZE] {
        use init_hca::*;
        let mut b = [0u8; IN_SIZE];
        put_u8(&mut b, VERSION_OFFSET, VERSION);
        put_u8(&mut b, CACHELINE_SZ_OFFSET, (6 - 4) << 5);
        put_be32(&mut b, FLAGS_OFFSET, self.flags);
        put_be64(&mut b, QPC_BASE_OFFSET, self.qpc_base);
        put_u8(&mut b, LOG_QP_OFFSET, self.log_num_qps);
        put_be64(&mut b, SRQC_BASE_OFFSET, self.srqc_base);
        put_u8(&mut b, LOG_SRQ_OFFSET, self.log_num_srqs);
        put_be64(&mut b, CQC_BASE_OFFSET, self.cqc_base);
        put_u8(&mut b, LOG_CQ_OFFSET, self.log_num_cqs);
        put_be64(&mut b, ALTC_BASE_OFFSET, self.altc_base);
        put_be64(&mut b, AUXC_BASE_OFFSET, self.auxc_base);
        put_be64(&mut b, EQC_BASE_OFFSET, self.eqc_base);
        put_u8(&mut b, LOG_EQ_OFFSET, self.log_num_eqs);
        put_be64(&mut b, RDMARC_BASE_OFFSET, self.rdmarc_base);
        put_u8(&mut b, LOG_RD_OFFSET, self.log_rd_per_qp);
        put_be64(&mut b, MC_BASE_OFFSET, self.mc_base);
        put_be16(&mut b, LOG_MC_ENTRY_SZ_OFFSET, self.log_mc_entry_sz);
        put_be16(&mut b, LOG_MC_HASH_SZ_OFFSET, self.log_mc_hash_sz);
        if self.uc_steering {
            put_u8(&mut b, UC_STEERING_OFFSET, 1 << 3);
        }
        put_u8(&mut b, LOG_MC_TABLE_SZ_OFFSET, self.log_mc_table_sz);
        put_be64(&mut b, DMPT_BASE_OFFSET, self.dmpt_base);
        if self.mw_enabled {
            put_u8(&mut b, TPT_MW_OFFSET, TPT_MW_ENABLE);
        }
        put_u8(&mut b, LOG_MPT_SZ_OFFSET, self.log_mpt_sz);
        put_be64(&mut b, MTT_BASE_OFFSET, self.mtt_base);
        put_be64(&mut b, CMPT_BASE_OFFSET, self.cmpt_base);
        put_u8(&mut b, UAR_PAGE_SZ_OFFSET, self.uar_page_sz);
        put_u8(&mut b, LOG_UAR_SZ_OFFSET, self.log_uar_sz);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fw_ver_swaps_minor_and_subminor() {
        // Mailbox: pages 0x0100, major 2, subminor 5000, minor 42.
        let raw = 0x0100_0002_1388_002a_u64;
        let v = fw_ver_from_raw(raw);
        assert_eq!((v >> 32) & 0xffff, 2);
        assert_eq!((v >> 16) & 0xffff, 42);
        assert_eq!(v & 0xffff, 5000);
        assert_eq!(bar_index(0x80), 4);
        assert_eq!(bar_index(0x00), 0);
    }

    #[test]
    fn golden_init_hca() {
        let p = InitHcaParam {
            qpc_base: 0x1_0000_0000,
            log_num_qps: 12,
            srqc_base: 0x20_0000,
            log_num_srqs: 10,
            cqc_base: 0x30_0000,
            log_num_cqs: 10,
            altc_base: 0x40_0000,
            auxc_base: 0x50_0000,
            eqc_base: 0x60_0000,
            log_num_eqs: 6,
            rdmarc_base: 0x70_0000,
            log_rd_per_qp: 4,
            mc_base: 0x80_0000,
            log_mc_entry_sz: 10,
            log_mc_hash_sz: 7,
            log_mc_table_sz: 8,
            dmpt_base: 0x90_0000,
            log_mpt_sz: 14,
            mtt_base: 0xa0_0000,
            cmpt_base: 0,
            log_uar_sz: 11,
            uar_page_sz: 0,
            flags: init_hca::FLAG_CHECK_PORT_UD_AV,
            uc_steering: true,
            mw_enabled: true,
        };
        let b = p.to_bytes();
        let mut g = [0u8; 0x200];
        g[0x00] = 2;
        g[0x0e] = 0x40;
        g[0x17] = 1;
        g[0x30..0x38].copy_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]);
        g[0x37] = 12;
        g[0x48..0x50].copy_from_slice(&[0, 0, 0, 0, 0, 0x20, 0, 0]);
        g[0x4f] = 10;
        g[0x50..0x58].copy_from_slice(&[0, 0, 0, 0, 0, 0x30, 0, 0]);
        g[0x57] = 10;
        g[0x65] = 0x40;
        g[0x75] = 0x50;
        g[0x85] = 0x60;
        g[0x87] = 6;
        g[0x95] = 0x70;
        g[0x97] = 4;
        g[0xc5] = 0x80;
        g[0xd3] = 10;
        g[0xd7] = 7;
        g[0xd8] = 0x08;
        g[0xdb] = 8;
        g[0xf5] = 0x90;
        g[0xf8] = 0x80;
        g[0xfb] = 14;
        g[0x105] = 0xa0;
        g[0x12a] = 11;
        assert_eq!(b[..], g[..]);
    }

    #[test]
    fn board_id_is_byte_swapped_per_dword() {
        let mut out = [0u8; 0x100 + 0x20];
        // "MT_1090120019" as firmware stores it: each dword reversed.
        let s = b"MT_1090120019\0\0\0";
        for i in 0..4 {
            for j in 0..4 {
                out[0x20 + 0xd0 + i * 4 + j] = s[i * 4 + 3 - j];
            }
        }
        assert_eq!(&board_id(&out), s);
        let mut ts = [0u8; 0x120];
        ts[0x20..0x22].copy_from_slice(&[0x05, 0xad]);
        ts[0x20 + 0xde..0x20 + 0xe0].copy_from_slice(&[0x05, 0xad]);
        ts[0x40..0x45].copy_from_slice(b"TS123");
        assert_eq!(&board_id(&ts)[..6], b"TS123\0");
    }
}
