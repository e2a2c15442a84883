//! Port of Linux's mlx4_core for the ConnectX-3 (15b3:1003, 15b3:1007): native PF, InfiniBand and Ethernet ports, fully polled.
//!
//! It covers firmware commands, ICM, EQ/CQ/QP/SRQ/MR/PD/UAR, ports
//! (InfiniBand and Ethernet: port types, SENSE_PORT, the Ethernet SET_PORT
//! flavours, MAC/VLAN/GID tables), catastrophic-error polling and the
//! interface registry with its protocols (mlx4_ib, mlx4_en); SR-IOV,
//! interrupts, BlueFlame, device-managed flow steering, changing a port's
//! type at run time and the resource tracker are left out.
//!
//! Linux: `drivers/net/ethernet/mellanox/mlx4/` (3.11 as LegoOS ported it;
//! checked against newer kernels for fixes), headers
//! `include/linux/mlx4/{device,driver,cmd}.h`. File names are Linux's:
//! `dev.rs` plays `mlx4.h` (the device, its capabilities, the object tables
//! and the `mlx4_err!`/`mlx4_warn!`/`mlx4_info!`/`mlx4_dbg!` log macros),
//! `main.rs` (probe and teardown, a library file thanks to `autobins =
//! false`), `cmd.rs`, `fw.rs`, `icm.rs`, `profile.rs`, `alloc.rs` (loaded as
//! module `bitmap` because `alloc` is the name of the `alloc` crate), `eq.rs`,
//! `cq.rs`, `qp.rs`, `srq.rs`, `mr.rs`, `pd.rs`, `port.rs`, `mcg.rs`,
//! `catas.rs`, `intf.rs`, `reset.rs`.
//!
//! Entry point: [`probe`] takes a [`hal::PciFunction`], a [`hal::DmaPool`], a
//! clock and a [`Profile`] and returns a running [`Dev`]; [`Dev::teardown`]
//! undoes everything in Linux's reverse order. There are no interrupts:
//! commands are polled on the GO bit and the kernel's progress loop calls
//! [`Dev::poll`] (EQs and the catastrophic-error buffer).
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
// Linux's main.c keeps its name as a library module (`autobins = false`).
#![allow(special_module_name)]

extern crate alloc;

#[path = "alloc.rs"]
pub mod bitmap;
pub mod catas;
pub mod cmd;
pub mod cq;
pub mod dev;
pub mod eq;
mod error;
pub mod fw;
pub mod icm;
pub mod intf;
pub mod main;
pub mod mcg;
pub mod mr;
pub mod pd;
pub mod port;
pub mod profile;
pub mod qp;
pub mod reset;
pub mod srq;
#[cfg(test)]
mod tests;

pub use dev::{Caps, Dev, MAX_PORTS, PortCaps, PortType};
pub use error::{Error, Result, Why};
pub use intf::{Event, Interface, IntfId, Protocol, ProtocolDev};
pub use main::probe;
pub use port::{EthPortState, EthTables};
pub use profile::Profile;

// The log macros (`mlx4_err!`, ...) reach `log` through this path, so that
// their users need not name it.
#[doc(hidden)]
pub use log as __log;

pub use mlx4_hw as hw;
