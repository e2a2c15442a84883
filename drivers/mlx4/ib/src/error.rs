//! The error type of mlx4_ib: errno-faithful (Linux returns `-EINVAL`, `-ENOMEM`, ... from every verb), with mlx4_core's errors kept as data.

use core::fmt;

use mlx4_hw::cmd::errno::*;

/// Errors of mlx4_ib.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// mlx4_core (a firmware command, an allocator) failed.
    Core(mlx4_core::Error),
    /// An argument the verb refuses (Linux `-EINVAL`), with the reason.
    Inval(&'static str),
    /// A work queue is full (Linux `-ENOMEM` from post_send/post_recv).
    QueueFull,
    /// Out of memory or of a hardware resource (Linux `-ENOMEM`).
    NoMem,
    /// The handle names no live object (a stale or foreign handle).
    NoObject,
    /// The object is still in use (Linux `-EBUSY`).
    Busy,
    /// Not supported by this port (Linux `-ENOSYS`/`-EOPNOTSUPP`).
    Unsupported(&'static str),
    /// The firmware SMA answered a MAD with a non-zero status.
    MadStatus(u16),
    /// The device had a catastrophic error and is being removed.
    Fatal,
}

impl Error {
    /// The negative errno Linux returns.
    pub fn to_errno(&self) -> i32 {
        match self {
            Error::Core(e) => e.to_errno(),
            Error::Inval(_) => -EINVAL,
            Error::QueueFull | Error::NoMem => -ENOMEM,
            Error::NoObject => -EINVAL,
            Error::Busy => -EBUSY,
            Error::Unsupported(_) => -EOPNOTSUPP,
            Error::MadStatus(_) => -EINVAL,
            Error::Fatal => -EIO,
        }
    }
}

impl From<mlx4_core::Error> for Error {
    fn from(e: mlx4_core::Error) -> Self {
        Error::Core(e)
    }
}

impl From<hal::Error> for Error {
    fn from(e: hal::Error) -> Self {
        match e {
            hal::Error::NoMemory => Error::NoMem,
            _ => Error::Core(mlx4_core::Error::Dma(e)),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Core(e) => write!(f, "{e}"),
            Error::Inval(why) => write!(f, "invalid argument: {why}"),
            Error::QueueFull => f.write_str("work queue full"),
            Error::NoMem => f.write_str("out of memory"),
            Error::NoObject => f.write_str("no such object"),
            Error::Busy => f.write_str("object in use"),
            Error::Unsupported(what) => write!(f, "not supported: {what}"),
            Error::MadStatus(s) => write!(f, "MAD status {s:#06x}"),
            Error::Fatal => f.write_str("device in catastrophic error"),
        }
    }
}

/// Result with mlx4_ib's [`Error`].
pub type Result<T = ()> = core::result::Result<T, Error>;
