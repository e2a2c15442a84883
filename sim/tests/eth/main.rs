//! Ethernet ports of the model driven by our own raw poster (no driver crate).
//!
//! Ethernet ports of the model driven by our own raw poster (no driver
//! crate): port types and the Ethernet SET_PORTs, raw Ethernet QPs through
//! the fabric's learning Ethernet switch, RoCE v1, a card with an IB and an
//! Ethernet port at once, and the capture as tshark reads it.

#[path = "../model/harness.rs"]
mod harness;
#[path = "../engine/poster.rs"]
mod poster;

mod capture;
mod common;
mod faults;
mod mixed;
mod ports;
mod raw;
mod roce;
