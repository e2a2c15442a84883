//! ICM units and the page-list mailbox of MAP_FA / MAP_ICM_AUX / MAP_ICM (Linux `icm.h` and `mlx4_map_cmd` in `fw.c`).

use hal::be::put_be64;

/// `MLX4_ICM_PAGE_SHIFT`: ICM is managed in 4 KiB pages.
pub const ICM_PAGE_SHIFT: u32 = 12;
/// `MLX4_ICM_PAGE_SIZE`.
pub const ICM_PAGE_SIZE: u64 = 1 << ICM_PAGE_SHIFT;
/// `MLX4_TABLE_CHUNK_SIZE`: ICM virtual space is mapped per 256 KiB chunk.
pub const TABLE_CHUNK_SIZE: u64 = 1 << 18;
/// Size of one page-list entry.
pub const MAP_ENTRY_SIZE: usize = 16;
/// Entries per mailbox (`MLX4_MAILBOX_SIZE / 16`).
pub const MAP_ENTRIES_PER_MAILBOX: usize = 4096 / MAP_ENTRY_SIZE;

/// One page-list entry: BE64 ICM virtual address (MAP_ICM only, else 0), BE64
/// bus address | (log2(size) - 12).
pub fn map_entry(virt: Option<u64>, bus: u64, log_size: u32) -> [u8; MAP_ENTRY_SIZE] {
    let mut e = [0u8; MAP_ENTRY_SIZE];
    if let Some(v) = virt {
        put_be64(&mut e, 0, v);
    }
    put_be64(&mut e, 8, bus | u64::from(log_size - ICM_PAGE_SHIFT));
    e
}

/// Splits `[addr, addr + size)` into naturally aligned power-of-two pieces
/// as `mlx4_map_cmd` does: the piece size is the lowest set bit of
/// `addr | size`. Returns that log2 size, or `None` if it is below 4 KiB.
pub fn map_chunk_log(addr: u64, size: u64) -> Option<u32> {
    let lg = (addr | size).trailing_zeros();
    (ICM_PAGE_SHIFT..64).contains(&lg).then_some(lg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_map_entry() {
        let e = map_entry(Some(0x0000_0001_0004_0000), 0x1_2340_0000, 18);
        assert_eq!(e, [0, 0, 0, 1, 0, 4, 0, 0, 0, 0, 0, 1, 0x23, 0x40, 0, 6]);
        let e = map_entry(None, 0x1_0000_1000, 12);
        assert_eq!(e, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0x10, 0]);
    }

    #[test]
    fn chunk_log_is_the_natural_alignment() {
        assert_eq!(map_chunk_log(0x4_0000, 0x4_0000), Some(18));
        assert_eq!(map_chunk_log(0x1000, 0x4_0000), Some(12));
        assert_eq!(map_chunk_log(0x800, 0x1000), None);
    }
}
