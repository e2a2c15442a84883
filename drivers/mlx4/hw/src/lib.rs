//! mlx4 wire formats (placeholder until the port lands).
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
