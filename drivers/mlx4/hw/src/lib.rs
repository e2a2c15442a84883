//! mlx4 (ConnectX-3) wire formats as pure data, without driver logic: HCR layout, opcodes and status codes, command mailboxes, contexts, EQEs, doorbells.
//!
//! Linux: `include/linux/mlx4/{cmd,device,cq,qp,srq}.h` and the offset tables in
//! `drivers/net/ethernet/mellanox/mlx4/{cmd,fw,eq,mr,port}.c` (3.11 via LegoOS;
//! checked against newer kernels). Everything the device reads or writes is
//! big-endian; single-byte fields sit at their big-endian byte position.
//!
//! Contexts are plain Rust structs with CPU-typed fields named as in Linux and
//! an explicit `to_bytes`/`from_bytes` against named offsets (mirroring Linux's
//! `MLX4_PUT`/`MLX4_GET` and struct layouts). Two of them (EQ context, MPT
//! entry) are packed with 64-bit fields at 4-byte aligned offsets, which a
//! `#[repr(C)]` struct cannot express, so all layouts use the same offset
//! tables; each is pinned by a golden byte test written from the documented
//! offsets.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cmd;
pub mod cq;
pub mod cqe;
pub mod doorbell;
pub mod eq;
pub mod fw;
pub mod hcr;
pub mod icm;
pub mod mcg;
pub mod mr;
pub mod port;
pub mod qp;
pub mod srq;
pub mod wqe;
