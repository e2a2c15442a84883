//! The error type of mlx4_core: firmware status kept as data, with `to_errno` faithful to Linux.

use core::fmt;

use mlx4_hw::cmd::errno::*;
use mlx4_hw::cmd::{Opcode, Status};

/// Errors of mlx4_core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// A firmware command completed with a non-zero status.
    Fw {
        /// The command.
        op: Opcode,
        /// Its status.
        status: Status,
    },
    /// The GO bit did not clear before the command's deadline.
    CmdTimeout {
        /// The command.
        op: Opcode,
    },
    /// The HCR was still busy when the command was posted (Linux `-EAGAIN`
    /// from `mlx4_cmd_post` in polling mode).
    CmdBusy {
        /// The command that could not be posted.
        op: Opcode,
    },
    /// An allocator (bitmap, buddy, ICM refcount) is exhausted.
    NoMem,
    /// The DMA pool refused an allocation.
    Dma(hal::Error),
    /// An argument out of range (Linux `-EINVAL`) where no single argument
    /// is to blame (e.g. a table that does not exist yet).
    InvalidArg,
    /// A size, count or address argument of the API that the card or Linux
    /// would refuse (Linux `-EINVAL`), named.
    BadArg {
        /// The argument, as the function names it (`nent`, `wqe_shift`,
        /// `sq_size_stride`, ...).
        arg: &'static str,
        /// The value given.
        value: u64,
        /// What is wrong with it.
        why: Why,
    },
    /// The device reported a capability that is absurd or inconsistent.
    BadCaps {
        /// Linux's name of the field (`max_qps`, `uar_size`, ...).
        field: &'static str,
        /// The raw value read from the device.
        value: u64,
    },
    /// Something the port does not do (old command interface, SR-IOV, ...).
    Unsupported,
    /// The function is not an mlx4 device or lacks a BAR (Linux `-ENODEV`).
    NoDevice,
    /// Another function owns the HCA ("Multiple PFs not yet supported").
    NotOwner,
    /// The HW semaphore of the reset block never cleared.
    ResetSemaphore,
    /// The device did not come back after reset.
    ResetTimeout,
    /// The profile does not fit the device's ICM (Linux `-ENOMEM`).
    ProfileTooBig {
        /// Bytes the profile needs.
        need: u64,
        /// Bytes the device offers.
        max: u64,
    },
    /// The device reported an internal (catastrophic) error.
    Catastrophic,
    /// The resource is still in use.
    Busy,
}

impl Error {
    /// The negative errno Linux would return (firmware status through
    /// `mlx4_status_to_errno`).
    pub fn to_errno(&self) -> i32 {
        match self {
            Error::Fw { status, .. } => status.to_errno(),
            Error::CmdTimeout { .. } => -ETIMEDOUT,
            Error::CmdBusy { .. } => -EAGAIN,
            Error::NoMem | Error::ProfileTooBig { .. } => -ENOMEM,
            Error::Dma(_) => -ENOMEM,
            Error::InvalidArg | Error::BadArg { .. } => -EINVAL,
            Error::BadCaps { .. } | Error::NoDevice => -ENODEV,
            Error::Unsupported => -EOPNOTSUPP,
            Error::NotOwner => -EINVAL,
            Error::ResetSemaphore => -EAGAIN,
            Error::ResetTimeout => -ENODEV,
            Error::Catastrophic => -EIO,
            Error::Busy => -EBUSY,
        }
    }

    /// The firmware command this error is about, if any.
    pub fn opcode(&self) -> Option<Opcode> {
        match *self {
            Error::Fw { op, .. } | Error::CmdTimeout { op } | Error::CmdBusy { op } => Some(op),
            _ => None,
        }
    }
}

impl From<hal::Error> for Error {
    fn from(e: hal::Error) -> Self {
        Error::Dma(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Fw { op, status } => {
                write!(
                    f,
                    "command {} ({:#x}) failed: fw status = {}",
                    op, op.0, status
                )
            }
            Error::CmdTimeout { op } => {
                write!(
                    f,
                    "command {} ({:#x}) timed out (go bit not cleared)",
                    op, op.0
                )
            }
            Error::CmdBusy { op } => {
                write!(f, "command {} ({:#x}): HCR busy (cmd_pending)", op, op.0)
            }
            Error::NoMem => f.write_str("out of resources"),
            Error::Dma(e) => write!(f, "DMA allocation failed: {e}"),
            Error::InvalidArg => f.write_str("invalid argument"),
            Error::BadArg { arg, value, why } => {
                write!(f, "invalid argument {arg} = {value} ({value:#x}): {why}")
            }
            Error::BadCaps { field, value } => {
                write!(
                    f,
                    "device reports an absurd capability: {field} = {value:#x}"
                )
            }
            Error::Unsupported => f.write_str("not supported"),
            Error::NoDevice => f.write_str("no such device"),
            Error::NotOwner => {
                f.write_str("HCA owned by another function (multiple PFs not yet supported)")
            }
            Error::ResetSemaphore => f.write_str("failed to obtain HW semaphore"),
            Error::ResetTimeout => f.write_str("PCI device did not come back after reset"),
            Error::ProfileTooBig { need, max } => write!(
                f,
                "profile requires {need:#x} bytes; won't fit in {max:#x} bytes of context memory"
            ),
            Error::Catastrophic => f.write_str("internal (catastrophic) error"),
            Error::Busy => f.write_str("resource busy"),
        }
    }
}

/// What is wrong with a [`Error::BadArg`] argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Zero where at least one is needed.
    Zero,
    /// Not a power of two (the context holds its log2: rounding would
    /// silently change what the caller asked for).
    NotPowerOfTwo,
    /// Above the largest value allowed (the device's or the field's).
    AboveMax(u64),
    /// Below the smallest value allowed.
    BelowMin(u64),
    /// Not aligned to this many bytes.
    Misaligned(u64),
    /// Anything else.
    Other(&'static str),
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Zero => f.write_str("must not be zero"),
            Why::NotPowerOfTwo => f.write_str("must be a power of two"),
            Why::AboveMax(m) => write!(f, "above the maximum {m}"),
            Why::BelowMin(m) => write!(f, "below the minimum {m}"),
            Why::Misaligned(a) => write!(f, "not aligned to {a} bytes"),
            Why::Other(s) => f.write_str(s),
        }
    }
}

impl Error {
    /// A [`Error::BadArg`].
    pub const fn bad_arg(arg: &'static str, value: u64, why: Why) -> Error {
        Error::BadArg { arg, value, why }
    }

    /// `Ok` if `value` is a non-zero power of two no larger than `max`, else
    /// the [`Error::BadArg`] naming `arg`.
    pub fn check_pow2(arg: &'static str, value: u64, max: u64) -> Result<()> {
        let why = if value == 0 {
            Why::Zero
        } else if !value.is_power_of_two() {
            Why::NotPowerOfTwo
        } else if value > max {
            Why::AboveMax(max)
        } else {
            return Ok(());
        };
        Err(Error::BadArg { arg, value, why })
    }

    /// `Ok` if `min <= value <= max`, else the [`Error::BadArg`].
    pub fn check_range(arg: &'static str, value: u64, min: u64, max: u64) -> Result<()> {
        let why = if value < min {
            if min == 1 {
                Why::Zero
            } else {
                Why::BelowMin(min)
            }
        } else if value > max {
            Why::AboveMax(max)
        } else {
            return Ok(());
        };
        Err(Error::BadArg { arg, value, why })
    }
}

/// Result with mlx4_core's [`Error`].
pub type Result<T = ()> = core::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_follows_linux() {
        let e = Error::Fw {
            op: Opcode::INIT_HCA,
            status: Status::BadParam,
        };
        assert_eq!(e.to_errno(), -22);
        assert_eq!(e.opcode(), Some(Opcode::INIT_HCA));
        assert_eq!(
            e.to_string(),
            "command INIT_HCA (0x7) failed: fw status = 0x3"
        );
        assert_eq!(Error::CmdTimeout { op: Opcode::RUN_FW }.to_errno(), -110);
        assert!(
            Error::CmdTimeout { op: Opcode::RUN_FW }
                .to_string()
                .contains("RUN_FW")
        );
    }
}
