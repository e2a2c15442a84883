//! Port of Linux `drivers/infiniband/core` (3.11, as LegoOS kept it), busy-polled: devices and clients, verbs, the cache, UD headers, the MAD layer, SMI, RMPP reassembly, the SA client, multicast joins and the CM.
//!
//! Sending RMPP, redirection, sysfs and every user-space path are left out.
//!
//! There are no interrupts: one progress function, [`IbCore::poll`], polls
//! every device's event queues (through [`verbs::IbDevice::poll_events`]),
//! the QP0/QP1 completion queues (the MAD completion handler) and the MAD
//! timeouts, and every blocking helper ([`IbCore::poll_until`],
//! [`IbCore::send_mad_wait`], [`IbCore::smp_query`], [`IbCore::pma_query`])
//! calls it while it waits against a [`hal::Deadline`].
//!
//! Files keep Linux's names: `device.rs` (registration, clients, events, the
//! progress function), `verbs.rs` (`ib_verbs.h` + `verbs.c`: types, the
//! provider trait, `ib_modify_qp_is_ok`), `cache.rs`, `mad.rs` (`mad.c`;
//! `ib_mad.h`, `ib_smi.h` and `mad_priv.h` in `mad/`), `mad_rmpp.rs` (receive
//! side), `agent.rs`, `smi.rs`, `ud_header.rs`, `packer.rs`, `sa_query.rs`
//! (`ib_sa.h` in `sa_query/`), `multicast.rs`, `cm.rs` + `cm_msgs.rs`,
//! `cma.rs` + `addr.rs` (the RDMA CM: connections by IP address). Functions drop Linux's
//! `ib_` prefix (and the prefix their module already says:
//! `sa_query::path_rec_get` is `ib_sa_path_rec_get`) and keep the C name in
//! `#[doc(alias)]`, as mlx4_core does.
//!
//! # Using it
//!
//! A driver implements [`verbs::IbDevice`] (Linux's `struct ib_device`
//! ops) and hands it to [`IbCore::register_device`]; the core reads the
//! port tables, fills the cache, opens QP0/QP1 on every port and tells the
//! clients. The kernel keeps one [`IbCore`] and calls [`IbCore::poll`] from
//! its idle loop. Verbs go through [`Device`] ([`IbCore::device_mut`]); the
//! hot path (`post_send`, `post_recv`, `poll_cq`) is a direct call into the
//! provider and allocates nothing. MAD users register an agent
//! ([`IbCore::register_mad_agent`]), post with
//! [`IbCore::post_send_mad`] and read their mailbox with
//! [`IbCore::mad_poll_agent`]; a client without a thread of its own (the
//! SA and the CM) does that from [`IbClient::poll`], which every
//! [`IbCore::poll`] calls.
//!
//! Paths come from the SA client ([`sa_query::init`] once, then
//! [`sa_query::path_to_lid`] / [`sa_query::path_to_gid`], cached per
//! port); multicast groups from the multicast client ([`multicast::init`]
//! once, then [`multicast::join`] / [`multicast::leave`], a UD QP attached
//! with [`Device::attach_mcast`]); RC connections from the CM ([`cm::init`] once, then
//! [`cm::listen`] + [`cm::send_rep`] on the passive side,
//! [`cm::send_req`] or [`cm::connect`] on the active side, events
//! taken with [`cm::wait_event`] against a deadline); connections by IPv4
//! address and port from the RDMA CM ([`cma::init`], then
//! [`cma::resolve_addr`] / [`cma::listen`] as Linux's `rdma_cm`, the IP
//! stack lent through [`addr::IpNet`]).
//!
//! # Decisions
//!
//! * The core is one value owned by its caller, not a set of globals
//!   guarded by locks; providers are `Box<dyn IbDevice>`; verbs objects are
//!   small `Copy` handles the provider chooses.
//! * MAD agents receive their MADs and send completions in a bounded
//!   mailbox they poll, instead of Linux's `recv_handler`/`send_handler`
//!   callbacks: an agent can send from anywhere without re-entering the
//!   core, which suits a busy-polled kernel. Receives beyond the bound are a
//!   counted drop; send completions are never dropped.
//! * Requests get the agent's `hi_tid` in the upper half of their TID from
//!   the core (Linux leaves that to each caller).
//! * The cache is refreshed synchronously in the event's dispatch (LegoOS),
//!   before handlers and clients see the event, so they see fresh values.
//! * MAD send buffers are one 256-byte SGE (Linux uses two, header and
//!   data, for RMPP); receive buffers are the 40-byte GRH area plus the MAD.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod addr;
pub mod agent;
pub mod cache;
pub mod cm;
pub mod cm_msgs;
pub mod cma;
pub mod device;
pub mod error;
pub mod mad;
pub mod mad_rmpp;
pub mod multicast;
pub mod packer;
pub mod sa_query;
pub mod smi;
pub mod ud_header;
pub mod verbs;

#[cfg(test)]
mod tests;

pub use device::{
    ClientId, Device, DeviceId, HandlerId, IbClient, IbCore, MadConfig, RegisterError,
};
pub use error::{Error, PostError, Result};
pub use mad::{
    MadAgent, MadCounters, MadEvent, MadRecvWc, MadRegReq, MadSendBuf, MadSendId, MadSendWc,
    SmpRoute,
};
