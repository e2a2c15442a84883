//! MPT entry, MTT entry and key conversions (Linux `struct mlx4_mpt_entry`, `mr.c`).
//!
//! Memory windows and FMR-specific fields are carried as plain fields only.

use hal::be::*;

/// `MLX4_MTT_FLAG_PRESENT`.
pub const MTT_FLAG_PRESENT: u64 = 1;
/// `log_mtts_per_seg` default: MTTs are allocated in segments of 8.
pub const LOG_MTTS_PER_SEG: u32 = 3;

/// MPT flag bits (`MLX4_MPT_FLAG_*`) and access bits (`MLX4_PERM_*`).
pub mod flags {
    #![allow(missing_docs)]
    pub const SW_OWNS: u32 = 0xf << 28;
    pub const FREE: u32 = 0x3 << 28;
    pub const MIO: u32 = 1 << 17;
    pub const BIND_ENABLE: u32 = 1 << 15;
    pub const PHYSICAL: u32 = 1 << 9;
    pub const REGION: u32 = 1 << 8;
    pub const PD_FLAG_FAST_REG: u32 = 1 << 27;
    pub const PD_FLAG_RAE: u32 = 1 << 28;
    pub const PD_FLAG_EN_INV: u32 = 3 << 24;
    pub const PERM_LOCAL_READ: u32 = 1 << 10;
    pub const PERM_LOCAL_WRITE: u32 = 1 << 11;
    pub const PERM_REMOTE_READ: u32 = 1 << 12;
    pub const PERM_REMOTE_WRITE: u32 = 1 << 13;
    pub const PERM_ATOMIC: u32 = 1 << 14;
    pub const PERM_BIND_MW: u32 = 1 << 15;
}

/// Linux `hw_index_to_key`.
pub const fn hw_index_to_key(ind: u32) -> u32 {
    ind.rotate_left(8)
}

/// Linux `key_to_hw_index`.
pub const fn key_to_hw_index(key: u32) -> u32 {
    key.rotate_right(8)
}

/// An MTT entry: bus address of a page with the present bit.
pub const fn mtt_entry(page_bus: u64) -> u64 {
    page_bus | MTT_FLAG_PRESENT
}

/// The 64-byte dMPT entry (packed: `mtt_addr` is a BE64 at 0x2c).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct MptEntry {
    pub flags: u32,
    pub qpn: u32,
    pub key: u32,
    pub pd_flags: u32,
    pub start: u64,
    pub length: u64,
    pub lkey: u32,
    pub win_cnt: u32,
    pub mtt_rep: u8,
    pub mtt_addr: u64,
    pub mtt_sz: u32,
    pub entity_size: u32,
    pub first_byte_offset: u32,
}

#[allow(missing_docs)]
impl MptEntry {
    pub const SIZE: usize = 64;
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

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        put_be32(&mut b, Self::FLAGS, self.flags);
        put_be32(&mut b, Self::QPN, self.qpn);
        put_be32(&mut b, Self::KEY, self.key);
        put_be32(&mut b, Self::PD_FLAGS, self.pd_flags);
        put_be64(&mut b, Self::START, self.start);
        put_be64(&mut b, Self::LENGTH, self.length);
        put_be32(&mut b, Self::LKEY, self.lkey);
        put_be32(&mut b, Self::WIN_CNT, self.win_cnt);
        put_u8(&mut b, Self::MTT_REP, self.mtt_rep);
        put_be64(&mut b, Self::MTT_ADDR, self.mtt_addr);
        put_be32(&mut b, Self::MTT_SZ, self.mtt_sz);
        put_be32(&mut b, Self::ENTITY_SIZE, self.entity_size);
        put_be32(&mut b, Self::FIRST_BYTE_OFFSET, self.first_byte_offset);
        b
    }

    pub fn from_bytes(b: &[u8]) -> Self {
        MptEntry {
            flags: get_be32(b, Self::FLAGS),
            qpn: get_be32(b, Self::QPN),
            key: get_be32(b, Self::KEY),
            pd_flags: get_be32(b, Self::PD_FLAGS),
            start: get_be64(b, Self::START),
            length: get_be64(b, Self::LENGTH),
            lkey: get_be32(b, Self::LKEY),
            win_cnt: get_be32(b, Self::WIN_CNT),
            mtt_rep: get_u8(b, Self::MTT_REP),
            mtt_addr: get_be64(b, Self::MTT_ADDR),
            mtt_sz: get_be32(b, Self::MTT_SZ),
            entity_size: get_be32(b, Self::ENTITY_SIZE),
            first_byte_offset: get_be32(b, Self::FIRST_BYTE_OFFSET),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_rotate_like_linux() {
        assert_eq!(hw_index_to_key(0x12), 0x1200);
        assert_eq!(hw_index_to_key(0x0100_0012), 0x0000_1201);
        assert_eq!(key_to_hw_index(0x1201), 0x0100_0012);
        assert_eq!(mtt_entry(0x1_0000_3000), 0x1_0000_3001);
    }

    #[test]
    fn golden_mpt_entry() {
        let m = MptEntry {
            flags: flags::SW_OWNS | flags::MIO | flags::REGION | flags::PERM_LOCAL_READ,
            key: 0x10,
            pd_flags: 5 | flags::PD_FLAG_EN_INV,
            start: 0x1000,
            length: 0x3000,
            mtt_addr: 0x1_2345_6780,
            entity_size: 12,
            ..Default::default()
        };
        let mut g = [0u8; 64];
        g[0..4].copy_from_slice(&[0xf0, 0x02, 0x05, 0x00]);
        g[0x0b] = 0x10;
        g[0x0c..0x10].copy_from_slice(&[3, 0, 0, 5]);
        g[0x16] = 0x10;
        g[0x1e] = 0x30;
        g[0x2c..0x34].copy_from_slice(&[0, 0, 0, 1, 0x23, 0x45, 0x67, 0x80]);
        g[0x3b] = 12;
        assert_eq!(m.to_bytes(), g);
        assert_eq!(MptEntry::from_bytes(&g), m);
    }
}
