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

pub mod fwdev;
pub mod ibrig;
pub mod madgen;

/// The model's configuration for the fuzz targets: the default card with a
/// DMA arena of `dma` bytes instead of 256 MiB (the arena is set up per
/// run, and its size is most of a run's cost).
pub fn sim_cfg(node_guid: u64, dma: usize) -> sim::SimConfig {
    let d = sim::SimConfig::default();
    sim::SimConfig {
        node_guid: if node_guid == 0 {
            d.node_guid
        } else {
            node_guid
        },
        dma_size: dma,
        ..d
    }
}

/// Runs `f` on a rig kept across inputs (a new model card costs more than
/// a run of an input: its registers and DMA memory are zeroed), built by
/// `make` on first use, every `every` inputs, and for every input when
/// `LEGOIB_FUZZ_FRESH` is set (to replay or minimise a crash on its own).
/// The model's targets reset the card at the start of every input
/// ([`reset_card`]).
/// A rig whose run panicked is never reused: the process ends anyway; one
/// for which `f` returns false is built again for the next input.
pub fn persistent<R: 'static>(
    slot: &'static std::thread::LocalKey<std::cell::RefCell<(Option<R>, u32)>>,
    every: u32,
    make: impl FnOnce() -> R,
    f: impl FnOnce(&mut R) -> bool,
) {
    let fresh = std::env::var_os("LEGOIB_FUZZ_FRESH").is_some();
    slot.with(|s| {
        let mut s = s.borrow_mut();
        let (rig, runs) = &mut *s;
        if rig.is_none() || fresh || *runs >= every {
            *rig = None;
            *rig = Some(make());
            *runs = 0;
        }
        *runs += 1;
        if let Some(r) = rig.as_mut()
            && !f(r)
        {
            *rig = None;
        }
    });
}

/// A new model card (the default one with `dma` bytes of DMA memory),
/// claimed as a driver's probe claims it; the claim survives resets.
pub fn new_card(node_guid: u64, dma: usize) -> harness::Raw {
    claimed(sim::SimHca::new(sim_cfg(node_guid, dma)))
}

/// A poster over `sim`, the card claimed as a driver's probe claims it.
pub fn claimed(sim: sim::SimHca) -> harness::Raw {
    let r = harness::Raw::with(sim);
    let _ = r.bar0.read_be32(0x8_069c);
    r
}

/// Resets a card a rig used before, as a driver's probe after a reset
/// finds it, and empties its poster: the pages the card was given go
/// back to the pool (last first: the pool keeps its pieces sorted, and in
/// order, freeing a bring-up's pages was a fifth of a run), so the next
/// bring-up gets the same addresses; MTT and ICM bookkeeping start again;
/// the logs and the output mailbox (an input may hand it to a command)
/// start empty.
///
/// The model's targets start every input here: when a rig kept its card
/// from input to input, what an input covered depended on the inputs
/// before it, and a corpus replayed to fewer edges than the run that
/// built it (fuzz/README.md, third campaign).
pub fn reset_card(r: &mut harness::Raw) {
    harness::reset(r);
    while r.keep.pop().is_some() {}
    r.icm.clear();
    r.next_mtt = 16;
    r.sim.take_violations();
    r.sim.take_dma_faults();
    r.outbox.fill(0, 4096, 0);
}

/// [`reset_card`], then Linux's bring-up up to the ports, as
/// [`poster::Hca::bare`] does (ports still closed).
pub fn bare_again(mut r: harness::Raw) -> poster::Hca {
    reset_card(&mut r);
    harness::load_fw_no_reset(&mut r).expect("RUN_FW after a reset");
    harness::init_after_fw_pub(&mut r).expect("INIT_HCA after a reset");
    let eqs = harness::init_after_hca(&mut r).expect("EQs and ports after a reset");
    poster::Hca::brought_up(r, eqs)
}
