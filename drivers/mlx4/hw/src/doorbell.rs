//! UAR doorbell offsets and values (Linux `include/linux/mlx4/doorbell.h`, `qp.h`, `cq.h`, and `eq_set_ci` in `eq.c`); BlueFlame left out.

/// Size of one UAR page.
pub const UAR_PAGE_SIZE: usize = 4096;
/// Send doorbell offset in a UAR page (`MLX4_SEND_DOORBELL`).
pub const SEND_DOORBELL: usize = 0x14;
/// CQ doorbell offset in a UAR page (`MLX4_CQ_DOORBELL`), one 64-bit store.
pub const CQ_DOORBELL: usize = 0x20;
/// EQ doorbells: page `eqn / 4`, offset `0x800 + 8 * (eqn % 4)`.
pub const EQ_DOORBELL_BASE: usize = 0x800;
/// UARs whose pages carry EQ doorbells (the first 128 are reserved).
pub const EQ_UAR_PAGES: u32 = 128;

/// (UAR page index, offset in the page) of the doorbell of EQ `eqn`.
pub const fn eq_doorbell(eqn: u32) -> (u32, usize) {
    (eqn / 4, EQ_DOORBELL_BASE + 8 * (eqn as usize % 4))
}

/// The EQ doorbell value: consumer index (24 bits) and the re-arm bit.
pub const fn eq_set_ci_value(cons_index: u32, req_not: bool) -> u32 {
    (cons_index & 0xff_ffff) | ((req_not as u32) << 31)
}

/// CQ doorbell commands (`MLX4_CQ_DB_REQ_NOT_SOL`, `MLX4_CQ_DB_REQ_NOT`).
pub const CQ_DB_REQ_NOT_SOL: u32 = 1 << 24;
/// Request notification for the next completion.
pub const CQ_DB_REQ_NOT: u32 = 2 << 24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eq_doorbell_layout() {
        assert_eq!(eq_doorbell(0), (0, 0x800));
        assert_eq!(eq_doorbell(5), (1, 0x808));
        assert_eq!(eq_set_ci_value(0x0100_0003, true), 0x8000_0003);
        assert_eq!(eq_set_ci_value(7, false).to_be_bytes(), [0, 0, 0, 7]);
    }
}
