//! A remote-backed page cache for disaggregated-memory experiments, in the
//! spirit of LegoOS's pcache (the processor component's cache of memory
//! that lives on memory components) and of Linux's swap over RDMA
//! (Fastswap, Infiniswap): a fault on a page not resident fetches it with
//! one RDMA READ into a frame of a local cache of a set size; CLOCK over
//! the accessed bits picks victims, written back with RDMA WRITE when
//! dirty; pages spread over several memory nodes, optionally in two copies
//! with fall-back to the replica; read-ahead on sequential faults; and the
//! workloads that check it end to end.
//!
//! The kernel owns the page tables and the trap; this crate owns the
//! policy and the RDMA, behind [`mmu::Mmu`], so that the host tests run the
//! same fault path against the model HCA with a software MMU
//! ([`soft::SoftRegion`]). Leaves out: several faulting CPUs, huge pages,
//! write-protect based dirty tracking (the hardware dirty bit is used),
//! reconnecting a memory node that failed, and asynchronous read-ahead.

#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod cache;
pub mod mmu;
pub mod place;
pub mod region;
pub mod soft;
pub mod stats;
pub mod workload;

pub use mmu::{Mmu, PteBits, SoftMmu};
pub use place::Placement;
pub use region::{AttachError, Cause, Config, Fault, FaultError, MemNode, Pcache};
pub use workload::{Kind, Outcome, Words};

/// Bytes in a page.
pub const PAGE_SIZE: usize = 4096;
