//! Firmware command opcodes, status codes and timeouts (Linux `include/linux/mlx4/cmd.h` and the status table of `cmd.c`).
//!
//! Left out: the SR-IOV virtual opcodes.

use core::fmt;

/// A firmware command opcode (12 bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u16);

macro_rules! opcodes {
    ($($name:ident = $val:expr),* $(,)?) => {
        impl Opcode {
            $(
                #[doc = concat!("`MLX4_CMD_", stringify!($name), "`.")]
                pub const $name: Opcode = Opcode($val);
            )*
            /// All opcodes known to this crate.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name),*];
            /// Linux's name of the command (`QUERY_FW`), or `None` if unknown.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($val => Some(stringify!($name)),)*
                    _ => None,
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
    RST2INIT_QP = 0x019, INIT2RTR_QP = 0x01a, RTR2RTS_QP = 0x01b, RTS2RTS_QP = 0x01c,
    SQERR2RTS_QP = 0x01d, QP_2ERR = 0x01e, RTS2SQD_QP = 0x01f, SQD2RTS_QP = 0x020,
    QP_2RST = 0x021, QUERY_QP = 0x022, CONF_SPECIAL_QP = 0x023, MAD_IFC = 0x024,
    READ_MCG = 0x025, WRITE_MCG = 0x026, MGID_HASH = 0x027, MODIFY_CQ = 0x02c,
    INIT2INIT_QP = 0x02d, ACCESS_MEM = 0x02e, SYNC_TPT = 0x02f, DIAG_RPRT = 0x030,
    NOP = 0x031, SUSPEND_QP = 0x032, UNSUSPEND_QP = 0x033, MOD_STAT_CFG = 0x034,
    SW2HW_SRQ = 0x035, HW2SW_SRQ = 0x036, QUERY_SRQ = 0x037, SQD2SQD_QP = 0x038,
    ARM_SRQ = 0x040, QUERY_PORT = 0x043, SET_VLAN_FLTR = 0x047,
    SET_MCAST_FLTR = 0x048, DUMP_ETH_STATS = 0x049, SENSE_PORT = 0x04d, HW_HEALTH_CHECK = 0x050,
    QUERY_FUNC = 0x056, SET_NODE = 0x05a, UPDATE_QP = 0x061,
    MAP_FA = 0xfff, UNMAP_FA = 0xffe, RUN_FW = 0xff6, SET_ICM_SIZE = 0xffd,
    MAP_ICM_AUX = 0xffc, UNMAP_ICM_AUX = 0xffb, MAP_ICM = 0xffa, UNMAP_ICM = 0xff9,
    ENABLE_LAM = 0xff8, DISABLE_LAM = 0xff7,
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Opcode {
    /// `QUERY_FW`, or `0x123` for an unknown opcode. The two QP transitions
    /// whose Linux names start with a digit print as `2ERR_QP`/`2RST_QP`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0x01e => f.write_str("2ERR_QP"),
            0x021 => f.write_str("2RST_QP"),
            _ => match self.name() {
                Some(n) => f.write_str(n),
                None => write!(f, "{:#x}", self.0),
            },
        }
    }
}

/// Firmware command status (`CMD_STAT_*`), kept as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// 0x00: command completed successfully.
    Ok,
    /// 0x01: internal error (e.g. a bus error).
    InternalErr,
    /// 0x02: operation/opcode modifier not supported.
    BadOp,
    /// 0x03: parameter not supported or out of range.
    BadParam,
    /// 0x04: system not enabled or bad system state.
    BadSysState,
    /// 0x05: attempt to access a reserved or unallocated resource.
    BadResource,
    /// 0x06: requested resource is currently executing a command.
    ResourceBusy,
    /// 0x08: required capability exceeds device limits.
    ExceedLim,
    /// 0x09: resource is not in the appropriate state or ownership.
    BadResState,
    /// 0x0a: index out of range.
    BadIndex,
    /// 0x0b: firmware image corrupt.
    BadNvmem,
    /// 0x0c: error in ICM mapping (e.g. not enough auxiliary ICM pages).
    IcmError,
    /// 0x10: attempt to modify a QP/EE which is not in the presumed state.
    BadQpState,
    /// 0x20: bad segment parameters (address/size).
    BadSegParam,
    /// 0x21: memory region has memory windows bound to.
    RegBound,
    /// 0x22: HCA local attached memory not present.
    LamNotPre,
    /// 0x30: bad management packet (silently discarded).
    BadPkt,
    /// 0x40: more outstanding CQEs in CQ than new CQ size.
    BadSize,
    /// 0x50: multi-function request (SR-IOV).
    MultiFuncReq,
    /// Any other value.
    Unknown(u8),
}

impl Status {
    /// Decodes the status byte.
    pub const fn from_u8(v: u8) -> Status {
        match v {
            0x00 => Status::Ok,
            0x01 => Status::InternalErr,
            0x02 => Status::BadOp,
            0x03 => Status::BadParam,
            0x04 => Status::BadSysState,
            0x05 => Status::BadResource,
            0x06 => Status::ResourceBusy,
            0x08 => Status::ExceedLim,
            0x09 => Status::BadResState,
            0x0a => Status::BadIndex,
            0x0b => Status::BadNvmem,
            0x0c => Status::IcmError,
            0x10 => Status::BadQpState,
            0x20 => Status::BadSegParam,
            0x21 => Status::RegBound,
            0x22 => Status::LamNotPre,
            0x30 => Status::BadPkt,
            0x40 => Status::BadSize,
            0x50 => Status::MultiFuncReq,
            x => Status::Unknown(x),
        }
    }

    /// The status byte.
    pub const fn as_u8(self) -> u8 {
        match self {
            Status::Ok => 0x00,
            Status::InternalErr => 0x01,
            Status::BadOp => 0x02,
            Status::BadParam => 0x03,
            Status::BadSysState => 0x04,
            Status::BadResource => 0x05,
            Status::ResourceBusy => 0x06,
            Status::ExceedLim => 0x08,
            Status::BadResState => 0x09,
            Status::BadIndex => 0x0a,
            Status::BadNvmem => 0x0b,
            Status::IcmError => 0x0c,
            Status::BadQpState => 0x10,
            Status::BadSegParam => 0x20,
            Status::RegBound => 0x21,
            Status::LamNotPre => 0x22,
            Status::BadPkt => 0x30,
            Status::BadSize => 0x40,
            Status::MultiFuncReq => 0x50,
            Status::Unknown(x) => x,
        }
    }

    /// Linux `mlx4_status_to_errno`: the negative errno Linux returns for
    /// this status (0 for `Ok`, `-EIO` for anything not in the table).
    pub const fn to_errno(self) -> i32 {
        use errno::*;
        match self {
            Status::Ok => 0,
            Status::InternalErr => -EIO,
            Status::BadOp => -EPERM,
            Status::BadParam => -EINVAL,
            Status::BadSysState => -ENXIO,
            Status::BadResource => -EBADF,
            Status::ResourceBusy => -EBUSY,
            Status::ExceedLim => -ENOMEM,
            Status::BadResState => -EBADF,
            Status::BadIndex => -EBADF,
            Status::BadNvmem => -EFAULT,
            Status::IcmError => -ENFILE,
            Status::BadQpState => -EINVAL,
            Status::BadSegParam => -EFAULT,
            Status::RegBound => -EBUSY,
            Status::LamNotPre => -EAGAIN,
            Status::BadPkt => -EINVAL,
            Status::BadSize => -ENOMEM,
            Status::MultiFuncReq => -EACCES,
            Status::Unknown(_) => -EIO,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.as_u8())
    }
}

/// Linux errno values (asm-generic), for `to_errno` comparisons with Linux logs.
pub mod errno {
    #![allow(missing_docs)]
    pub const EPERM: i32 = 1;
    pub const EIO: i32 = 5;
    pub const ENXIO: i32 = 6;
    pub const EBADF: i32 = 9;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EACCES: i32 = 13;
    pub const EFAULT: i32 = 14;
    pub const EBUSY: i32 = 16;
    pub const ENODEV: i32 = 19;
    pub const EINVAL: i32 = 22;
    pub const ENFILE: i32 = 23;
    pub const ENOSPC: i32 = 28;
    pub const ENOENT: i32 = 2;
    pub const ETIMEDOUT: i32 = 110;
    pub const EOPNOTSUPP: i32 = 95;
}

/// Command timeouts in milliseconds (3.11 values; newer kernels raised the
/// classes to 60000).
pub mod timeout {
    /// `MLX4_CMD_TIME_CLASS_A`.
    pub const CLASS_A: u32 = 10_000;
    /// `MLX4_CMD_TIME_CLASS_B`.
    pub const CLASS_B: u32 = 10_000;
    /// `MLX4_CMD_TIME_CLASS_C`.
    pub const CLASS_C: u32 = 10_000;
    /// INIT_HCA.
    pub const INIT_HCA: u32 = 10_000;
    /// CLOSE_HCA and CLOSE_PORT.
    pub const CLOSE: u32 = 1_000;
    /// NOP.
    pub const NOP: u32 = 100;
}

/// Size of a command mailbox (`MLX4_MAILBOX_SIZE`).
pub const MAILBOX_SIZE: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values() {
        assert_eq!(Opcode::QUERY_FW.0, 0x004);
        assert_eq!(Opcode::MAP_FA.0, 0xfff);
        assert_eq!(Opcode::RUN_FW.0, 0xff6);
        assert_eq!(Opcode(0x003).to_string(), "QUERY_DEV_CAP");
        assert_eq!(Opcode::QP_2RST.to_string(), "2RST_QP");
        assert_eq!(Opcode(0x7ab).to_string(), "0x7ab");
        let mut v: Vec<u16> = Opcode::ALL.iter().map(|o| o.0).collect();
        v.sort();
        v.dedup();
        assert_eq!(v.len(), Opcode::ALL.len(), "duplicate opcode");
    }

    #[test]
    fn status_to_errno_matches_linux_table() {
        let table: &[(u8, i32)] = &[
            (0x00, 0),
            (0x01, -5),
            (0x02, -1),
            (0x03, -22),
            (0x04, -6),
            (0x05, -9),
            (0x06, -16),
            (0x07, -5),
            (0x08, -12),
            (0x09, -9),
            (0x0a, -9),
            (0x0b, -14),
            (0x0c, -23),
            (0x10, -22),
            (0x20, -14),
            (0x21, -16),
            (0x22, -11),
            (0x30, -22),
            (0x40, -12),
            (0x50, -13),
            (0x51, -5),
            (0xff, -5),
        ];
        for &(s, e) in table {
            assert_eq!(Status::from_u8(s).to_errno(), e, "status {s:#x}");
        }
        for s in 0..=255u8 {
            assert_eq!(Status::from_u8(s).as_u8(), s);
        }
    }
}
