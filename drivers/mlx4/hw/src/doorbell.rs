//! UAR doorbell offsets and values (Linux `include/linux/mlx4/doorbell.h`, `qp.h`, `cq.h`, and `eq_set_ci` in `eq.c`).
//!
//! Left out: BlueFlame.

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

/// The RQ/SRQ doorbell record value: the 16-bit WQE counter.
pub const fn rq_db_record(head: u32) -> u32 {
    head & 0xffff
}

/// The CQ `set_ci` doorbell record value: the 24-bit consumer index.
pub const fn cq_set_ci_record(cons_index: u32) -> u32 {
    cons_index & 0xff_ffff
}

/// The CQ arm doorbell record value (Linux `mlx4_cq_arm`): arm sequence
/// number (2 bits), command, consumer index.
pub const fn cq_arm_record(arm_sn: u32, cmd: u32, cons_index: u32) -> u32 {
    ((arm_sn & 3) << 28) | cmd | (cons_index & 0xff_ffff)
}

/// The two dwords of the CQ doorbell at [`CQ_DOORBELL`]: `[sn << 28 | cmd |
/// cqn, consumer index]`, stored as one 64-bit write.
pub const fn cq_doorbell(arm_sn: u32, cmd: u32, cqn: u32, cons_index: u32) -> (u32, u32) {
    (
        ((arm_sn & 3) << 28) | cmd | (cqn & 0xff_ffff),
        cons_index & 0xff_ffff,
    )
}

/// The send doorbell value (before the big-endian store): `qpn << 8`.
pub const fn send_doorbell(qpn: u32) -> u32 {
    qpn << 8
}

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

    #[test]
    fn cq_and_wq_doorbell_layout() {
        // Arm for the next completion, sn 1, ci 0x1000005 (24 bits kept).
        assert_eq!(
            cq_arm_record(1, CQ_DB_REQ_NOT, 0x0100_0005).to_be_bytes(),
            [0x12, 0, 0, 5]
        );
        assert_eq!(cq_doorbell(5, CQ_DB_REQ_NOT_SOL, 0x81, 7), (0x1100_0081, 7));
        assert_eq!(cq_set_ci_record(0x0123_4567), 0x23_4567);
        assert_eq!(rq_db_record(0x1_0003), 3);
        assert_eq!(send_doorbell(0x48).to_be_bytes(), [0, 0, 0x48, 0]);
    }
}
