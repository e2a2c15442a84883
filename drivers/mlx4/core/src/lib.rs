//! Port of Linux mlx4_core (placeholder until the port lands).
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
