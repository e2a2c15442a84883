//! Shared helpers for the integration tests.
//!
//! Building the kernel image once, booting it under QEMU with a deadline through
//! `run-qemu.sh`, and driving its serial console; an SM's PortInfo Sets through the
//! model's SMA (`sm`).

pub mod qemu;
pub mod sm;
