//! The data-path engines driven by our own raw WQE poster.
//!
//! The data-path engines driven by our own raw WQE poster (no driver
//! crate): bytes moved and verified, completions and errors as the card
//! writes them, owner bits over several wraps, timers on the fake clock,
//! the fuzz run.

#[path = "../model/harness.rs"]
mod harness;
mod poster;

mod bench;
mod datapath;
mod emu_fabric;
mod emu_round_trip;
mod errors;
mod fabric;
mod fuzz;
mod loopback;
mod mgmt;
mod mlx;
mod mw;
mod mw_fabric;
mod pairs;
mod polled;
mod rings;
mod window;
