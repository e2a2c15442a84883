//! The host command register (HCR) and the other fixed BAR0 registers, ownership and reset block (constants of Linux `cmd.c`, `reset.c`, `main.c`).
//!
//! PRM: "HCA Command Register". Every HCR dword is a 32-bit big-endian store;
//! dword 6 (status/GO) is written last, after a write barrier.

/// BAR0 offset of the HCR (`MLX4_HCR_BASE`).
pub const HCR_BASE: usize = 0x80680;
/// Size of the HCR window (`MLX4_HCR_SIZE`).
pub const HCR_SIZE: usize = 0x1c;
/// in_param high dword (low dword at +4).
pub const HCR_IN_PARAM_OFFSET: usize = 0x00;
/// Input modifier.
pub const HCR_IN_MODIFIER_OFFSET: usize = 0x08;
/// out_param high dword (low dword at +4).
pub const HCR_OUT_PARAM_OFFSET: usize = 0x0c;
/// Token in bits 31:16.
pub const HCR_TOKEN_OFFSET: usize = 0x14;
/// Status (31:24), GO, E, T, op_mod (15:12), opcode (11:0).
pub const HCR_STATUS_OFFSET: usize = 0x18;
/// Bit position of the opcode modifier.
pub const HCR_OPMOD_SHIFT: u32 = 12;
/// Toggle bit.
pub const HCR_T_BIT: u32 = 21;
/// Event-completion bit.
pub const HCR_E_BIT: u32 = 22;
/// GO bit: set by software to post, cleared by firmware on completion.
pub const HCR_GO_BIT: u32 = 23;
/// Token used for polled commands (`CMD_POLL_TOKEN`).
pub const CMD_POLL_TOKEN: u16 = 0xffff;

/// BAR0 offset of the ownership semaphore (`MLX4_OWNER_BASE`): a read of 0
/// claims the HCA, writing 0 releases it.
pub const OWNER_BASE: usize = 0x8069c;
/// Size of the ownership register.
pub const OWNER_SIZE: usize = 4;

/// BAR0 offset of the reset block (`MLX4_RESET_BASE`).
pub const RESET_BASE: usize = 0xf0000;
/// Size of the reset block.
pub const RESET_SIZE: usize = 0x400;
/// Reset register inside the block; write big-endian 1 to reset.
pub const RESET_OFFSET: usize = 0x10;
/// Value written to the reset register (big-endian 1 on the bus).
pub const RESET_VALUE: u32 = 1;
/// HW semaphore inside the block: a read of 0 acquires it.
pub const SEM_OFFSET: usize = 0x3fc;

/// The status dword (HCR dword 6) that posts a command.
pub const fn status_word(opcode: u16, op_modifier: u8, toggle: bool, event: bool) -> u32 {
    (1 << HCR_GO_BIT)
        | ((toggle as u32) << HCR_T_BIT)
        | ((event as u32) << HCR_E_BIT)
        | (((op_modifier & 0xf) as u32) << HCR_OPMOD_SHIFT)
        | (opcode & 0xfff) as u32
}

/// Firmware status carried in bits 31:24 of the status dword.
pub const fn status_of(word: u32) -> u8 {
    (word >> 24) as u8
}

/// Linux `cmd_pending`: the HCR is busy if GO is still set or the T bit read
/// back equals the toggle the driver will use next.
pub const fn is_pending(word: u32, toggle: bool) -> bool {
    word & (1 << HCR_GO_BIT) != 0 || ((word >> HCR_T_BIT) & 1 != 0) == toggle
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_status_word() {
        // QUERY_FW, op_mod 0, toggle 1, polled: GO | T | 0x004.
        assert_eq!(status_word(0x004, 0, true, false), 0x00a0_0004);
        // 2RST_QP, op_mod 2, toggle 0.
        assert_eq!(status_word(0x021, 2, false, false), 0x0080_2021);
        assert_eq!(
            status_word(0xfff, 0xf, true, true).to_be_bytes(),
            [0, 0xe0, 0xff, 0xff]
        );
        assert_eq!(status_of(0x0300_0000), 3);
    }

    #[test]
    fn pending_follows_linux_cmd_pending() {
        // After reset HW reads T=0; driver toggle starts at 1: free.
        assert!(!is_pending(0, true));
        assert!(is_pending(1 << HCR_GO_BIT, true));
        // Command posted with T=1 and completed: T reads 1, next toggle 0: free.
        assert!(!is_pending(1 << HCR_T_BIT, false));
        // Stale read: T still shows the old value equal to the next toggle.
        assert!(is_pending(0, false));
    }
}
