//! The EQ consumer index inside one long poll pass.
//!
//! The real mlx4_core against a model that keeps producing completion events while
//! the driver consumes them, as a busy card does, so that one pass of `mlx4_eq_int`
//! (`Dev::poll_eq`) runs through several times the EQ's size. A driver must write
//! the consumer index back at least every `MLX4_NUM_SPARE_EQE` entries (Linux
//! `eq.c`); one that writes it only at the end of the pass overruns the EQ, which
//! the model records.
//!
//! Deterministic on a loaded machine: every completion event the driver
//! dispatches makes the model post one more (from the driver's own thread,
//! under the model's lock, after consuming the EQ doorbell the driver last
//! wrote), so production keeps a fixed lead over consumption whatever the
//! scheduler does, and the model's view of the consumer index is exactly
//! what the driver has written by then.

use tests::mlx4_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use mlx4_common::{Model, bring_up};
use mlx4_core::hw::eq::NUM_SPARE_EQE;
use mlx4_core::{Caps, Dev, Event, Interface, Profile};
use sim::SimHca;

/// Events the model has ready before the pass starts.
const LEAD: u32 = 16;

/// A client whose CQ completes continuously: each completion event it sees
/// makes the card produce another, until the budget is spent.
struct BusyCq {
    hca: SimHca,
    cqn: u32,
    budget: Arc<AtomicU32>,
    seen: Arc<AtomicU32>,
}

impl Interface for BusyCq {
    fn event(&mut self, _: &Caps, ev: Event) {
        if ev != (Event::CqCompletion { cqn: self.cqn }) {
            return;
        }
        self.seen.fetch_add(1, Ordering::Relaxed);
        let more = self
            .budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
            .is_ok();
        if more {
            // False only if the CQ left hardware ownership: the count
            // assertion below then fails with the numbers.
            let _ = self.hca.inject_completion_event(self.cqn);
        }
    }
}

/// A profile whose completion EQ is small: `num_cq - reserved + spare`
/// rounded up = 256 entries.
fn small_eq_profile() -> Profile {
    Profile {
        num_cq: 256,
        ..Profile::default()
    }
}

fn probe(hca: &SimHca) -> Dev {
    bring_up(hca, small_eq_profile())
        .unwrap_or_else(|e| panic!("probe: {e}: {:#?}", hca.violations()))
}

/// One long pass over `passes` times the EQ size; returns (EQ entries,
/// events consumed by the first `poll_eq`, events seen).
fn long_pass(hca: &SimHca, passes: u32) -> (u32, usize, u32) {
    let mut dev = probe(hca);
    let eqn = dev.comp_eqn(0).expect("completion EQ");
    let nent = hca.eq(eqn).expect("EQ in hardware ownership").nent;
    assert_eq!(nent, 256, "the profile sizes the completion EQ");

    let uar = dev.uar_alloc().unwrap();
    let buf = dev.dma_pool().alloc_pages(1).unwrap();
    let mtt = dev.mtt_init(1, 12).unwrap();
    dev.write_mtt(&mtt, 0, &[buf.bus_addr().0]).unwrap();
    let db = dev.dma_pool().alloc(64, 64).unwrap();
    let cq = dev
        .cq_alloc(64, &mtt, &uar, db.bus_addr().0, 0, false, false)
        .unwrap();

    let total = passes * nent;
    let budget = Arc::new(AtomicU32::new(total - LEAD));
    let seen = Arc::new(AtomicU32::new(0));
    let id = dev.register_interface(Box::new(BusyCq {
        hca: hca.clone(),
        cqn: cq.cqn,
        budget: budget.clone(),
        seen: seen.clone(),
    }));
    for _ in 0..LEAD {
        assert!(hca.inject_completion_event(cq.cqn));
    }
    // The pass ends when the EQ is empty: after the budget is spent and the
    // lead drained, or when an overrun dropped events.
    let first = dev.poll_eq();
    // Whatever an overrun left behind (EQ_OVERFLOW on the async EQ).
    for _ in 0..4 {
        dev.poll_eq();
    }

    dev.unregister_interface(id);
    dev.cq_free(cq).unwrap();
    dev.mtt_cleanup(&mtt);
    dev.uar_free(uar);
    drop((buf, db));
    dev.teardown();
    (nent, first, seen.load(Ordering::Relaxed))
}

/// The fixture checks the harness invariants (no violation or DMA fault
/// from probe through teardown, firmware stopped, ICM unmapped, DMA back)
/// when `model` goes; the overrun is asserted here first for a clear
/// message.
fn check(model: Model, passes: u32) {
    let (nent, first, seen) = long_pass(&model, passes);
    let total = passes * nent;
    let v = model.violations();
    assert!(
        !v.iter().any(|s| s.contains("overrun")),
        "the EQ overran inside one poll pass (consumer index not written back every {NUM_SPARE_EQE} entries?): {v:#?}"
    );
    assert_eq!(
        seen, total,
        "completion events delivered (first pass consumed {first})"
    );
    assert!(
        first >= total as usize && total > nent,
        "one pass consumed {first} EQEs of {total}: the test did not exercise a pass longer than the EQ"
    );
    model.finish();
}

#[test]
fn consumer_index_is_written_inside_a_long_poll_pass_threaded_model() {
    check(Model::threaded(), 4);
}

#[test]
fn consumer_index_is_written_inside_a_long_poll_pass_sync_model() {
    check(Model::sync(), 4);
}
