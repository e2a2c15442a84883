//! Remote memory for disaggregated-memory experiments.
//!
//! A kernel service over ib_core's verbs in the spirit of LegoOS's FIT (kernel RPC
//! over RDMA) and LITE: a memory node ([`Server`]) exports one region registered
//! through MTTs with an rkey scoped to it; compute nodes ([`Client`]) connect with
//! the CM, allocate and free chunks over a small RPC ([`proto`]) and read and write
//! them with RDMA READ/WRITE, many requests in flight, completions busy-polled.
//! A memory node is reached by LID or port GUID through the IB CM, or by IPv4
//! address through the RDMA CM (TCP port space, port [`IP_PORT`]).
//! Leaves out: paging integration (who maps the fetched page), replication,
//! multiple regions per node, memory windows.
//!
//! Errors a user meets are worded for them ([`Error`]'s `Display`): a card
//! refusing an access outside the region is "remote access error", a node
//! gone or a cable pulled "memory node unreachable (transport retry counter
//! exceeded)", each within the connection's deadline.

#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod bench;
pub mod chunks;
pub mod client;
pub mod conn;
pub mod proto;
pub mod server;
pub mod stats;

pub use client::{Client, ClientConfig, Completion, Token};
pub use server::{Server, ServerConfig, ServerStats};
pub use stats::{Percentiles, Stats};

use core::fmt;
use core::net::SocketAddrV4;

use ib_core::cma::RdmaCmEventType;
use ib_core::verbs::{Qp, RecvWr, SendFlags, SendWr, Sge, WcStatus, WrOpcode};
use ib_core::{Device, DeviceId, IbCore};

/// Our service ID on the CM ("LEGORMEM" folded into 64 bits; IBTA's
/// locally administered range has the top byte 0x02... we use a private
/// value as ib_srp/ib_ipoib do for theirs).
pub const SERVICE_ID: u64 = 0x0000_4c45_474f_524d;

/// The memory node's port in the RDMA CM's TCP port space (service ID
/// `0x0000000001060000 | port`): 21069, `0x524d`, the RPC's magic "RM".
pub const IP_PORT: u16 = 0x524d;

/// Bytes in a page (page-granular accesses and chunk rounding).
pub const PAGE_SIZE: usize = 4096;

/// An rmem error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// A verb failed.
    Verbs(ib_core::Error),
    /// The memory node's card refused the access (`IB_WC_REM_ACCESS_ERR`):
    /// outside its exported region or without the right.
    RemoteAccess {
        /// Remote address of the refused access.
        addr: u64,
        /// Its length.
        len: u32,
    },
    /// The memory node stopped answering: transport (or RNR) retries
    /// exceeded. A node gone or a cable pulled ends here.
    Unreachable(WcStatus),
    /// Another completion error.
    Completion(WcStatus),
    /// The memory node answered an RPC with an error.
    Rpc(proto::Status),
    /// A reply we could not make sense of.
    Protocol(&'static str),
    /// An operation did not complete within the deadline.
    TimedOut(&'static str),
    /// The connection failed earlier (the first error is kept in
    /// [`Client::broken`]); it must be closed and made again.
    Broken,
    /// A length of zero or more than a slot holds.
    BadLength,
    /// All `window` slots are in flight; poll first.
    WindowFull,
    /// A blocking call while asynchronous operations are in flight.
    Busy,
    /// The CM connection could not be made (refused or timed out).
    Connect(ib_core::Error),
    /// The memory node could not be reached by IP address through the
    /// RDMA CM.
    ConnectIp {
        /// Its address and port.
        dst: SocketAddrV4,
        /// The RDMA CM event that ended the attempt (`None`: refused at
        /// once, by `rdma_resolve_addr` or another call).
        event: Option<RdmaCmEventType>,
        /// The event's status: a negative errno, or the REJ reason of a
        /// [`RdmaCmEventType::Rejected`].
        status: i32,
    },
}

impl From<ib_core::Error> for Error {
    fn from(e: ib_core::Error) -> Self {
        Error::Verbs(e)
    }
}

impl From<ib_core::PostError> for Error {
    fn from(e: ib_core::PostError) -> Self {
        Error::Verbs(e.error)
    }
}

impl Error {
    /// The error of a failed completion of an access at `addr`/`len`.
    pub fn from_wc(status: WcStatus, addr: u64, len: u32) -> Error {
        match status {
            WcStatus::RemAccessErr => Error::RemoteAccess { addr, len },
            WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr => Error::Unreachable(status),
            s => Error::Completion(s),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Verbs(e) => write!(f, "verbs error: {e}"),
            Error::RemoteAccess { addr, len } => write!(
                f,
                "remote access error: the memory node refused {len} bytes at {addr:#x} \
                 (outside its exported region)"
            ),
            Error::Unreachable(s) => write!(f, "memory node unreachable: {}", s.msg()),
            Error::Completion(s) => write!(f, "completion error: {}", s.msg()),
            Error::Rpc(s) => write!(f, "memory node refused the request: {s}"),
            Error::Protocol(w) => write!(f, "protocol error: {w}"),
            Error::TimedOut(w) => write!(f, "timed out waiting for {w}"),
            Error::Broken => f.write_str("connection failed earlier; reconnect"),
            Error::BadLength => f.write_str("bad length"),
            Error::WindowFull => f.write_str("all requests in flight; poll first"),
            Error::Busy => f.write_str("asynchronous requests in flight"),
            Error::Connect(e) => write!(f, "cannot connect to the memory node: {e}"),
            Error::ConnectIp { dst, event, status } => {
                write!(f, "cannot connect to the memory node at {dst}: ")?;
                why_ip(f, *dst, *event, *status)
            }
        }
    }
}

/// strerror for the errnos the RDMA CM reports.
fn errno_text(e: i32) -> &'static str {
    use ib_core::error::errno::*;
    match -e {
        ENODEV => "No such device",
        EINVAL => "Invalid argument",
        EADDRINUSE => "Address already in use",
        EADDRNOTAVAIL => "Cannot assign requested address",
        ENETUNREACH => "Network is unreachable",
        ECONNRESET => "Connection reset by peer",
        ETIMEDOUT => "Connection timed out",
        ECONNREFUSED => "Connection refused",
        EHOSTUNREACH => "No route to host",
        _ => "error",
    }
}

/// What ended an attempt by IP address, in words.
fn why_ip(
    f: &mut fmt::Formatter<'_>,
    dst: SocketAddrV4,
    event: Option<RdmaCmEventType>,
    status: i32,
) -> fmt::Result {
    use RdmaCmEventType as E;
    use ib_core::error::errno::*;
    let ip = dst.ip();
    match (event, -status) {
        (None, ENETUNREACH) => write!(
            f,
            "no route to {ip} (Network is unreachable: no address of ours on its network yet?)"
        ),
        (Some(E::AddrError), ETIMEDOUT) => write!(
            f,
            "no ARP answer from {ip} (address resolution timed out: no such node, or its ib0 is not up)"
        ),
        (Some(E::RouteError), _) => write!(
            f,
            "no path to {ip} from the SA (route resolution failed: {})",
            errno_text(status)
        ),
        (Some(E::Rejected), _) => write!(
            f,
            "it rejected the connection ({}{})",
            ib_core::cm_msgs::rej_reason_str(status as u16),
            match status {
                8 => ": nothing listens on that port (is rmem serve running?)",
                28 => ": its RDMA CM refused the request",
                _ => "",
            }
        ),
        (Some(E::Unreachable), ETIMEDOUT) => {
            f.write_str("it never answered the connection request (timed out)")
        }
        (Some(e), _) => write!(f, "{} ({})", e.name(), errno_text(status)),
        (None, _) => write!(f, "{}", errno_text(status)),
    }
}

/// `Result` with [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

/// The registered device `id`, or [`ib_core::Error::NoDev`].
fn dev(core: &mut IbCore, id: DeviceId) -> Result<&mut Device> {
    core.device_mut(id)
        .ok_or(Error::Verbs(ib_core::Error::NoDev))
}

/// Posts a receive of one RPC message ([`proto::MSG_LEN`] bytes at bus
/// address `addr`) on `qp`: the client's and the memory node's receives.
fn post_msg_recv(d: &mut Device, qp: Qp, wr_id: u64, addr: u64, lkey: u32) -> Result<()> {
    let sge = [Sge {
        addr,
        length: proto::MSG_LEN as u32,
        lkey,
    }];
    d.post_recv(
        qp,
        &[RecvWr {
            wr_id,
            sg_list: &sge,
        }],
    )?;
    Ok(())
}

/// Sends one RPC message ([`proto::MSG_LEN`] bytes at bus address `addr`)
/// on `qp` as a signalled SEND with immediate `imm`: the client's requests
/// and the memory node's replies.
fn post_msg_send(d: &mut Device, qp: Qp, wr_id: u64, addr: u64, lkey: u32, imm: u32) -> Result<()> {
    let sge = [Sge {
        addr,
        length: proto::MSG_LEN as u32,
        lkey,
    }];
    d.post_send(
        qp,
        &[SendWr {
            wr_id,
            sg_list: &sge,
            opcode: WrOpcode::SendWithImm,
            send_flags: SendFlags::SIGNALED,
            imm_data: imm,
            ..SendWr::default()
        }],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    #[test]
    fn ip_connect_errors_say_what_failed() {
        let dst = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 77), IP_PORT);
        let e = |event, status| Error::ConnectIp { dst, event, status }.to_string();
        assert_eq!(
            e(Some(RdmaCmEventType::AddrError), -110),
            "cannot connect to the memory node at 10.0.0.77:21069: no ARP answer from \
             10.0.0.77 (address resolution timed out: no such node, or its ib0 is not up)"
        );
        assert!(e(None, -101).ends_with(
            "no route to 10.0.0.77 (Network is unreachable: no address of ours on its network yet?)"
        ));
        assert!(e(Some(RdmaCmEventType::Rejected), 8).ends_with(
            "it rejected the connection (IB_CM_REJ_INVALID_SERVICE_ID: nothing listens on that port (is rmem serve running?))"
        ));
        assert!(
            e(Some(RdmaCmEventType::Unreachable), -110)
                .ends_with("it never answered the connection request (timed out)")
        );
        assert!(e(Some(RdmaCmEventType::RouteError), -110).ends_with(
            "no path to 10.0.0.77 from the SA (route resolution failed: Connection timed out)"
        ));
        assert!(
            e(Some(RdmaCmEventType::ConnectError), -22)
                .ends_with("RDMA_CM_EVENT_CONNECT_ERROR (Invalid argument)")
        );
        assert_eq!(IP_PORT, 21069);
    }
}
