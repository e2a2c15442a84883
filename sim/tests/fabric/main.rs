//! The fabric of the model, driven by a test SM and raw HCA ports.
//!
//! The fabric of the model (issue 8, "Links and a switch", "Capture and
//! packet faults", topologies, bad input): a test SM and raw HCA ports,
//! written from the IBTA layouts with `sim::fabric::packet`, drive the switch,
//! the capture and the faults through the public fabric API.

mod bench;
mod capture;
mod common;
mod crc;
mod faults;
mod fuzz;
mod switch;
mod topology;
