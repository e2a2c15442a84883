//! Port of Linux `drivers/infiniband/core` (3.11, as LegoOS kept it), busy-polled: devices and clients, verbs types and the provider trait, the cache, UD headers, the MAD layer with its agents and the SMI rules; `sa_query`, `cm`, RMPP, multicast, sysfs and every user-space path are left out (SA and CM come later).
//!
//! There are no interrupts: one progress function polls every device's
//! event queues, the QP0/QP1 completion queues and the MAD timeouts, and every
//! blocking helper calls it while it waits against a deadline.
//!
//! Files keep Linux's names: `verbs.rs` (`ib_verbs.h` + `verbs.c`), `mad.rs`
//! (`ib_mad.h`, `ib_smi.h`).
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod agent;
pub mod cache;
pub mod device;
pub mod error;
pub mod mad;
pub mod packer;
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
