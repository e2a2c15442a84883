//! Console RDMA tools as clients of `ib_core`: perftest, pingpong and infiniband-diags.
//!
//! Console RDMA tools as clients of `ib_core` (no driver below them): perftest
//! (`perftest`), rdma-core's pingpong examples (`pingpong`), and infiniband-diags'
//! queries through QP0/QP1 (`diags`, `ibnetdiscover`, `ibping`); perftest's and
//! rdma-core's TCP exchange (the IB CM carries it here), CUDA/ROCm memory,
//! multi-QP, dual-port, bidirectional and JSON output are left out.
//!
//! The crate is `no_std` + `alloc` and never touches hardware: the kernel's
//! console commands (and the host tests) hand it an [`ib_core::IbCore`] and
//! a way to write text, and it prints what the Linux tools print, in their
//! words and columns, so a researcher can put our figures beside theirs.
//!
//! * [`perftest`]: `ib_write_bw`, `ib_write_lat`, `ib_read_bw`,
//!   `ib_read_lat`, `ib_send_bw`, `ib_send_lat`, `ib_atomic_lat`: options
//!   ([`perftest::Params::parse`]), the dashed header block
//!   ([`perftest::print_test_info`]), the address lines, and the result
//!   lines computed as perftest computes them ([`perftest::bw_report`],
//!   [`perftest::lat_report`]).
//! * [`diags`]: `perfquery`, `smpquery`, `sminfo`: decoding the attributes
//!   from the MAD by the IBTA layout and printing them as libibmad does
//!   (`Name:.....value`).
//! * [`pingpong`]: `ibv_rc_pingpong`, `ibv_ud_pingpong`.
//! * [`ibnetdiscover`]: the directed-route walk and the topology file.
//! * [`ibping`]: the client, and the responder the kernel runs from boot.
//! * [`port_events`]: the line the console prints for each port transition.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod cfmt;
pub mod diags;
pub mod ibnetdiscover;
pub mod ibping;
pub mod perftest;
pub mod pingpong;
pub mod port_events;
pub mod rping;
