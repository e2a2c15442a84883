//! Port of Linux 3.11's mlx4_ib (`drivers/infiniband/hw/mlx4`), the ConnectX-3's InfiniBand driver, busy-polled.
//!
//! It ports the verbs objects (PD, CQ, QP, SRQ, MR, AH) over mlx4_core, the
//! WQE/CQE fast path with owner bits, stamping and doorbells, the special QPs
//! and MAD_IFC queries, and RoCE v1 on Ethernet ports (`roce.rs`). Left
//! out: SR-IOV (proxy/tunnel QPs, alias GUIDs, paravirtualised CM), XRC, memory windows, fast-register
//! MRs, LSO, BlueFlame, user-space contexts and interrupts.
//!
//! File names are Linux's: `main.rs` (the device, `mlx4_ib_add`, queries),
//! `cq.rs`, `qp.rs` (with `qp/create.rs`, `qp/post.rs` and `qp/modify.rs`:
//! `qp.c` in three parts), `srq.rs`, `mr.rs`, `ah.rs`, `mad.rs`,
//! `doorbell.rs` (here the kernel doorbell-record allocator of mlx4_core's
//! `alloc.c`, which Linux keeps next to mlx4_ib's user-page version).
//! `verbs.rs` re-exports ib_core's `ib_verbs.h` types (the send work
//! request included) and adds `ib_qp_init_attr` with the driver's handles.
//!
//! Objects live in tables owned by [`Mlx4IbDev`] and are named by small
//! handles ([`CqId`], [`QpId`], ...), so that polling a CQ can reach the QPs
//! and SRQs whose work requests complete there without locks: the caller
//! that owns the device owns every queue. The fast path (post send, post
//! receive, poll) allocates nothing.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
// Linux's main.c keeps its name as a library module.
#![allow(special_module_name)]

extern crate alloc;

pub mod ah;
mod buf;
pub mod cq;
pub mod doorbell;
mod error;
pub mod mad;
pub mod main;
pub mod mr;
pub mod provider;
pub mod qp;
pub mod roce;
pub mod srq;
mod table;
pub mod verbs;

pub use error::{Error, Result};
pub use main::Mlx4IbDev;
pub use table::{AhId, CqId, MrId, PdId, QpId, QpTable, Slab, SrqId};
