//! The host command register as the firmware sees it.
//!
//! Opcodes, completion status codes, the dword-6 bit layout and the go/toggle
//! protocol; the multi-command (event-mode token) queue is not modelled: one
//! command is in flight at a time, and an event-mode command completes both in the
//! HCR and with a CMD EQE.
//!
//! Protocol (Linux `cmd.c` `mlx4_cmd_post`/`cmd_pending`, iPXE
//! `hermon_cmd`): the driver writes dwords 0..5 (in_param hi/lo, in_modifier,
//! out_param hi/lo, token<<16) with 32-bit stores, then dword 6 = GO | T |
//! E | op_mod<<12 | opcode. The device answers by clearing GO and placing the
//! status in bits 31:24, leaving T as written. After reset T reads 0 and the
//! first command carries T=1; every command flips T (a driver is "pending"
//! while GO is set or T still equals its next toggle). The model records as
//! violations: GO written while a command is in flight, a write to dwords
//! 0..5 while busy, dword 6 written before all of dwords 0..5, a 64-bit store
//! into the HCR, a T bit that did not flip, reserved bits of dwords 5 and 6,
//! and an event-mode post while no EQ takes command completions. The
//! synchronous and threaded front ends see every access; the ivshmem window
//! sees only memory (`docs/ivshmem.md` lists what it cannot check).

use core::fmt;

/// HCR dword-6 bits.
pub mod bits {
    /// Status byte shift (written by the device).
    pub const STATUS_SHIFT: u32 = 24;
    /// Go: set by software to post, cleared by the device on completion.
    pub const GO: u32 = 1 << 23;
    /// Event: report completion with a CMD EQE.
    pub const EVENT: u32 = 1 << 22;
    /// Toggle.
    pub const T: u32 = 1 << 21;
    /// Opcode modifier shift (4 bits).
    pub const OPMOD_SHIFT: u32 = 12;
    /// Opcode mask.
    pub const OPCODE_MASK: u32 = 0xfff;
}

/// Firmware command opcodes (values of Linux `include/linux/mlx4/cmd.h`,
/// identical to iPXE's `HERMON_HCR_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Opcode(pub u16);

macro_rules! opcodes {
    ($($name:ident = $val:expr),* $(,)?) => {
        impl Opcode {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                pub const $name: Opcode = Opcode($val);
            )*
            /// All opcodes the model knows by name.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name),*];
            fn ident(self) -> &'static str {
                match self.0 {
                    $($val => stringify!($name),)*
                    _ => "UNKNOWN",
                }
            }
        }
    };
}

opcodes! {
    SYS_EN = 0x001, SYS_DIS = 0x002, QUERY_DEV_CAP = 0x003, QUERY_FW = 0x004,
    QUERY_DDR = 0x005, QUERY_ADAPTER = 0x006, INIT_HCA = 0x007, CLOSE_HCA = 0x008,
    INIT_PORT = 0x009, CLOSE_PORT = 0x00a, QUERY_HCA = 0x00b, SET_PORT = 0x00c,
    SW2HW_MPT = 0x00d, QUERY_MPT = 0x00e, HW2SW_MPT = 0x00f, READ_MTT = 0x010,
    WRITE_MTT = 0x011, MAP_EQ = 0x012, SW2HW_EQ = 0x013, HW2SW_EQ = 0x014,
    QUERY_EQ = 0x015, SW2HW_CQ = 0x016, HW2SW_CQ = 0x017, QUERY_CQ = 0x018,
    RST2INIT_QP = 0x019, INIT2RTR_QP = 0x01a, RTR2RTS_QP = 0x01b,
    RTS2RTS_QP = 0x01c, SQERR2RTS_QP = 0x01d, ERR_QP = 0x01e, RTS2SQD_QP = 0x01f,
    SQD2RTS_QP = 0x020, RST_QP = 0x021, QUERY_QP = 0x022, CONF_SPECIAL_QP = 0x023,
    MAD_IFC = 0x024, READ_MCG = 0x025, WRITE_MCG = 0x026, MGID_HASH = 0x027,
    MODIFY_CQ = 0x02c, INIT2INIT_QP = 0x02d, ACCESS_MEM = 0x02e, SYNC_TPT = 0x02f,
    DIAG_RPRT = 0x030, NOP = 0x031, SUSPEND_QP = 0x032, UNSUSPEND_QP = 0x033,
    MOD_STAT_CFG = 0x034, SW2HW_SRQ = 0x035, HW2SW_SRQ = 0x036, QUERY_SRQ = 0x037,
    SQD2SQD_QP = 0x038, ARM_SRQ = 0x040, QUERY_PORT = 0x043, SET_VLAN_FLTR = 0x047,
    SET_MCAST_FLTR = 0x048, DUMP_ETH_STATS = 0x049, SENSE_PORT = 0x04d,
    HW_HEALTH_CHECK = 0x050, QUERY_FUNC = 0x056, SET_NODE = 0x05a, UPDATE_QP = 0x061,
    RUN_FW = 0xff6, DISABLE_LAM = 0xff7, ENABLE_LAM = 0xff8, UNMAP_ICM = 0xff9,
    MAP_ICM = 0xffa, UNMAP_ICM_AUX = 0xffb, MAP_ICM_AUX = 0xffc,
    SET_ICM_SIZE = 0xffd, UNMAP_FA = 0xffe, MAP_FA = 0xfff,
}

impl Opcode {
    /// The PRM/Linux name (`2ERR_QP`, `2RST_QP` as Linux spells them), or
    /// `"UNKNOWN"`.
    pub fn name(self) -> &'static str {
        match self {
            Opcode::ERR_QP => "2ERR_QP",
            Opcode::RST_QP => "2RST_QP",
            _ => self.ident(),
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#05x})", self.name(), self.0)
    }
}

/// A completion status (Linux `cmd.c` `CMD_STAT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub u8);

macro_rules! statuses {
    ($($name:ident = $val:expr, $doc:expr;)*) => {
        impl Status {
            $(
                #[doc = $doc]
                pub const $name: Status = Status($val);
            )*
            /// Linux's name without the `CMD_STAT_` prefix, or `"UNKNOWN"`.
            pub fn name(self) -> &'static str {
                match self.0 {
                    $($val => stringify!($name),)*
                    _ => "UNKNOWN",
                }
            }
        }
    };
}

statuses! {
    OK = 0x00, "Command completed successfully.";
    INTERNAL_ERR = 0x01, "Internal error (e.g. a bus error) while processing the command.";
    BAD_OP = 0x02, "Opcode or opcode modifier not supported.";
    BAD_PARAM = 0x03, "Parameter not supported or out of range.";
    BAD_SYS_STATE = 0x04, "System not enabled or bad system state.";
    BAD_RESOURCE = 0x05, "Reserved or unallocated resource.";
    RESOURCE_BUSY = 0x06, "Resource busy.";
    EXCEED_LIM = 0x08, "Required capability exceeds device limits.";
    BAD_RES_STATE = 0x09, "Resource not in the appropriate state or ownership.";
    BAD_INDEX = 0x0a, "Index out of range.";
    BAD_NVMEM = 0x0b, "Firmware image corrupted.";
    ICM_ERROR = 0x0c, "Error in ICM mapping (e.g. not enough auxiliary pages).";
    BAD_QP_STATE = 0x10, "QP not in the presumed state.";
    BAD_SEG_PARAM = 0x20, "Bad segment parameters (address/size).";
    REG_BOUND = 0x21, "Memory region has memory windows bound.";
    LAM_NOT_PRE = 0x22, "HCA local attached memory not present.";
    BAD_PKT = 0x30, "Bad management packet (silently discarded).";
    BAD_SIZE = 0x40, "More outstanding CQEs than the new CQ size.";
    MULTI_FUNC_REQ = 0x50, "Multi-function device support required.";
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self.name(), self.0)
    }
}

/// One posted command, decoded from the seven HCR dwords.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command {
    /// Input parameter (mailbox bus address or immediate).
    pub in_param: u64,
    /// Input modifier.
    pub in_mod: u32,
    /// Output parameter (mailbox bus address); immediate results replace it.
    pub out_param: u64,
    /// Token (bits 31:16 of dword 5).
    pub token: u16,
    /// Opcode.
    pub opcode: Opcode,
    /// Opcode modifier (4 bits).
    pub op_mod: u8,
    /// Event completion requested.
    pub event: bool,
    /// Toggle bit as written.
    pub toggle: bool,
}

impl Command {
    /// Decodes the seven big-endian HCR dwords.
    pub fn decode(dw: [u32; 7]) -> Command {
        Command {
            in_param: u64::from(dw[0]) << 32 | u64::from(dw[1]),
            in_mod: dw[2],
            out_param: u64::from(dw[3]) << 32 | u64::from(dw[4]),
            token: (dw[5] >> 16) as u16,
            opcode: Opcode((dw[6] & bits::OPCODE_MASK) as u16),
            op_mod: ((dw[6] >> bits::OPMOD_SHIFT) & 0xf) as u8,
            event: dw[6] & bits::EVENT != 0,
            toggle: dw[6] & bits::T != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dword6_decodes_as_linux_and_ipxe_post_it() {
        // Linux: GO | T | E | op_mod << 12 | opcode, for MAD_IFC op_mod 3.
        let dw6 = bits::GO | bits::T | 3 << 12 | 0x024;
        let c = Command::decode([0x1, 0x2000_0000, 1, 0x1, 0x2000_1000, 0xffff_0000, dw6]);
        assert_eq!(c.opcode, Opcode::MAD_IFC);
        assert_eq!(c.op_mod, 3);
        assert_eq!(c.in_param, 0x1_2000_0000);
        assert_eq!(c.out_param, 0x1_2000_1000);
        assert_eq!(c.token, 0xffff);
        assert!(c.toggle && !c.event);
        assert_eq!(dw6, 0x00a0_3024);
    }

    #[test]
    fn names_and_status_values_match_linux() {
        assert_eq!(Opcode::QUERY_FW.name(), "QUERY_FW");
        assert_eq!(Opcode(0x7ff).name(), "UNKNOWN");
        assert_eq!(Status::BAD_SEG_PARAM.0, 0x20);
        assert_eq!(Status::BAD_PKT.0, 0x30);
        assert_eq!(Status::BAD_SIZE.0, 0x40);
        assert_eq!(Status::MULTI_FUNC_REQ.0, 0x50);
        assert_eq!(Status::ICM_ERROR.to_string(), "ICM_ERROR(0x0c)");
    }
}
