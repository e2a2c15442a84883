//! Model tests: the model driven through `hal` with a tiny raw HCR poster
//! (no driver crate involved), one module per area.

mod harness;

mod bringup;
mod coverage;
mod events;
mod faults;
mod fuzz;
mod fw_init;
mod hcr_protocol;
mod mcg;
mod polled;
mod ports_mad;
mod qp;
mod resources;
mod strict;
