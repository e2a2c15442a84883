//! The embedded subnet manager and SA.
//!
//! The embedded subnet manager and SA (issue 10, "An embedded SM in the
//! fabric"): a switch, CAs the test models itself ([`ca`], its own SMA
//! written from the IBTA), and the SM on a port of the switch, all on the
//! fake model clock.

mod bench;
mod ca;
mod election;
mod fuzz;
mod host_nodes;
mod net;
mod real_diags;
mod records;
mod sa;

mod sweep;
