//! The front ends: what puts the card in front of a driver.
//!
//! The front ends: what puts the card in front of a driver. [`in_process`]
//! hands a host test `hal` objects backed by the model ([`SimHca`],
//! [`Wire`]), [`ivshmem`] serves QEMU guests over shared memory
//! (`cx3-emu`), [`vfu`] serves the card as a PCI function over vfio-user
//! (`cx3-vfu`); [`host`] holds what the last two share.
//!
//! A front end owns its cards and drives them and their fabric; nothing
//! below (the card, the fabric) calls back up.
//!
//! [`SimHca`]: in_process::SimHca
//! [`Wire`]: in_process::Wire

pub mod host;
pub mod in_process;
pub mod ivshmem;
pub mod vfu;
