//! The card: the ConnectX-3 function as a driver reaches it over PCI.
//!
//! The card: the ConnectX-3 function as a driver reaches it over PCI (config
//! space, BAR0 and BAR2 registers, DMA), its firmware commands, ICM, event
//! queues, the data-path engines and the firmware SMA/PMA; what the card
//! leaves to others (the cable and what lies beyond it, the host that maps
//! its registers) is [`crate::fabric`]'s and the front ends'.
//!
//! Dependencies point down only: the card uses the fabric (its ports are
//! fabric ports, its engines put packets on the wire) and never a front
//! end; a front end builds the card's [`HcaConfig`] and owns the card
//! behind its lock.

pub mod config;
pub mod ctx;
pub(crate) mod device;
pub mod engine;
pub mod eq;
pub mod eth;
pub mod faults;
pub mod fw;
pub mod hcr;
pub mod icm;
pub mod layout;
pub mod mad_ifc;
pub mod mem;
pub mod pci;
pub mod port;
pub mod regs;
pub mod trace;

pub use config::HcaConfig;
