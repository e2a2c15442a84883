//! The error type of ib_core, each error carrying the errno Linux's `ib_core` would return.
//!
//! Linux has no such file (it passes bare `-errno` ints), so nothing is left
//! out.

use core::fmt;

use crate::verbs::{QpAttrMask, QpState, QpType};

/// Linux errno values (asm-generic/errno-base.h, errno.h), positive.
pub mod errno {
    /// Operation not permitted.
    pub const EPERM: i32 = 1;
    /// No such entry.
    pub const ENOENT: i32 = 2;
    /// I/O error.
    pub const EIO: i32 = 5;
    /// Try again.
    pub const EAGAIN: i32 = 11;
    /// Out of memory.
    pub const ENOMEM: i32 = 12;
    /// Bad address.
    pub const EFAULT: i32 = 14;
    /// Device or resource busy.
    pub const EBUSY: i32 = 16;
    /// Exists already.
    pub const EEXIST: i32 = 17;
    /// No such device.
    pub const ENODEV: i32 = 19;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Function not implemented.
    pub const ENOSYS: i32 = 38;
    /// No data available.
    pub const ENODATA: i32 = 61;
    /// Message too long.
    pub const EMSGSIZE: i32 = 90;
    /// Protocol not supported.
    pub const EPROTONOSUPPORT: i32 = 93;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = 95;
    /// Address family not supported by protocol.
    pub const EAFNOSUPPORT: i32 = 97;
    /// Address already in use.
    pub const EADDRINUSE: i32 = 98;
    /// Cannot assign requested address.
    pub const EADDRNOTAVAIL: i32 = 99;
    /// Network is unreachable.
    pub const ENETUNREACH: i32 = 101;
    /// Connection reset by peer.
    pub const ECONNRESET: i32 = 104;
    /// Transport endpoint is already connected.
    pub const EISCONN: i32 = 106;
    /// Connection timed out.
    pub const ETIMEDOUT: i32 = 110;
    /// Connection refused.
    pub const ECONNREFUSED: i32 = 111;
    /// No route to host.
    pub const EHOSTUNREACH: i32 = 113;
    /// Operation canceled.
    pub const ECANCELED: i32 = 125;
}

use errno::*;

/// Errors of ib_core and of the providers under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// An argument is out of range or inconsistent (`-EINVAL`); the text
    /// names what.
    Invalid(&'static str),
    /// `modify_qp` with an attribute mask the IBTA state table does not allow
    /// for this transition and QP type (`-EINVAL`, Linux `ib_modify_qp_is_ok`
    /// returning 0).
    BadQpAttrMask {
        /// The QP type.
        qp_type: QpType,
        /// The current state.
        cur: QpState,
        /// The requested state.
        next: QpState,
        /// Required attributes that are missing from the mask.
        missing: QpAttrMask,
        /// Attributes in the mask that the transition does not accept.
        extra: QpAttrMask,
    },
    /// The transition itself is not in the IBTA state table (`-EINVAL`).
    BadQpTransition {
        /// The QP type.
        qp_type: QpType,
        /// The current state.
        cur: QpState,
        /// The requested state.
        next: QpState,
    },
    /// Out of memory, or a queue or table is full (`-ENOMEM`).
    NoMem,
    /// The provider does not implement this verb (`-ENOSYS`).
    NoSys,
    /// Not supported by this device or port (`-EOPNOTSUPP`).
    NotSupported,
    /// Try again: a queue is momentarily full or the device is busy
    /// (`-EAGAIN`).
    Again,
    /// A wait ran past its deadline (`-ETIMEDOUT`).
    TimedOut,
    /// The object is still in use (`-EBUSY`).
    Busy,
    /// No such device or port, or the device is gone (`-ENODEV`).
    NoDev,
    /// No such object (`-ENOENT`).
    NotFound,
    /// The registration conflicts with an existing one (`-EEXIST`... Linux's
    /// `ib_register_mad_agent` returns `-EINVAL` for a method conflict; see
    /// [`Error::to_errno`]).
    Conflict(&'static str),
    /// A message does not fit (`-EMSGSIZE`).
    MsgSize,
    /// The request was canceled (`-ECANCELED`).
    Canceled,
    /// A MAD came back with this non-zero status (`-EINVAL`, as libibmad's
    /// callers report a bad status).
    MadStatus(u16),
    /// The device reported an error with this errno (positive), passed up
    /// unchanged from the provider.
    Errno(i32),
}

impl Error {
    /// The negative errno Linux would return.
    pub fn to_errno(&self) -> i32 {
        -match self {
            Error::Invalid(_) | Error::BadQpAttrMask { .. } | Error::BadQpTransition { .. } => {
                EINVAL
            }
            Error::NoMem => ENOMEM,
            Error::NoSys => ENOSYS,
            Error::NotSupported => EOPNOTSUPP,
            Error::Again => EAGAIN,
            Error::TimedOut => ETIMEDOUT,
            Error::Busy => EBUSY,
            Error::NoDev => ENODEV,
            Error::NotFound => ENOENT,
            // ib_register_mad_agent: "Method(s) already in use" -> -EINVAL.
            Error::Conflict(_) => EINVAL,
            Error::MsgSize => EMSGSIZE,
            Error::Canceled => ECANCELED,
            Error::MadStatus(_) => EINVAL,
            Error::Errno(e) => e.abs(),
        }
    }

    /// The error for a negative or positive errno, the way a provider passes
    /// one up.
    pub fn from_errno(e: i32) -> Error {
        match e.abs() {
            EINVAL => Error::Invalid("invalid argument"),
            ENOMEM => Error::NoMem,
            ENOSYS => Error::NoSys,
            EOPNOTSUPP => Error::NotSupported,
            EAGAIN => Error::Again,
            ETIMEDOUT => Error::TimedOut,
            EBUSY => Error::Busy,
            ENODEV => Error::NoDev,
            ENOENT => Error::NotFound,
            EMSGSIZE => Error::MsgSize,
            ECANCELED => Error::Canceled,
            other => Error::Errno(other),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(what) => write!(f, "invalid argument: {what}"),
            Error::BadQpAttrMask {
                qp_type,
                cur,
                next,
                missing,
                extra,
            } => {
                write!(
                    f,
                    "modify_qp {}: {} -> {} refused:",
                    qp_type.name(),
                    cur.name(),
                    next.name()
                )?;
                if !missing.is_empty() {
                    write!(f, " missing {missing}")?;
                }
                if !extra.is_empty() {
                    write!(f, " not allowed {extra}")?;
                }
                Ok(())
            }
            Error::BadQpTransition { qp_type, cur, next } => write!(
                f,
                "modify_qp {}: no transition {} -> {}",
                qp_type.name(),
                cur.name(),
                next.name()
            ),
            Error::NoMem => f.write_str("out of memory"),
            Error::NoSys => f.write_str("not implemented by the device"),
            Error::NotSupported => f.write_str("operation not supported"),
            Error::Again => f.write_str("resource temporarily unavailable"),
            Error::TimedOut => f.write_str("timed out"),
            Error::Busy => f.write_str("busy"),
            Error::NoDev => f.write_str("no such device"),
            Error::NotFound => f.write_str("not found"),
            Error::Conflict(what) => write!(f, "conflict: {what}"),
            Error::MsgSize => f.write_str("message too long"),
            Error::Canceled => f.write_str("canceled"),
            Error::MadStatus(st) => write!(f, "MAD status {st:#06x}"),
            Error::Errno(e) => write!(f, "errno {}", -e.abs()),
        }
    }
}

/// `Result` with ib_core's [`Error`].
pub type Result<T = ()> = core::result::Result<T, Error>;

/// A failed `post_send`/`post_recv`/`post_srq_recv`: Linux's `bad_wr`, as the
/// index of the first work request not posted, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostError {
    /// Index in the caller's slice of the first WR that was not posted; the
    /// ones before it were.
    pub index: usize,
    /// Why.
    pub error: Error,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "work request {}: {}", self.index, self.error)
    }
}
