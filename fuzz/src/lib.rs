//! Shared rigs of the fuzz targets: the test fixtures of the crates under test, included as they are, and a few helpers.
//!
//! The fixtures are the crates' own test code, compiled here through
//! `#[path]` so the targets drive exactly what the unit tests drive and the
//! two cannot drift apart: ib_core's fake provider (two software HCAs
//! cabled back to back), the model's raw HCR poster and its WQE poster.
//! They reach the crates only through their public API, which is why they
//! can live in another crate; the `crate::` paths they use resolve to the
//! re-exports below.

#![allow(clippy::all)]

// ib_core's fake provider says `crate::error`, `crate::mad`, `crate::verbs`.
pub use ib_core::{error, mad, verbs};

/// ib_core's fake provider (`ib_core/src/tests/fake.rs`).
#[path = "../../ib_core/src/tests/fake.rs"]
#[allow(dead_code, unused_imports)]
pub mod ibfake;

/// The model's raw HCR poster and Linux-order bring-up
/// (`sim/tests/model/harness.rs`).
#[path = "../../sim/tests/model/harness.rs"]
#[allow(dead_code, unused_imports)]
pub mod harness;

/// The model's WQE/CQE poster (`sim/tests/engine/poster.rs`).
#[path = "../../sim/tests/engine/poster.rs"]
#[allow(dead_code, unused_imports)]
pub mod poster;

pub mod ibrig;
pub mod madgen;
pub mod fwdev;
