//! Model-backed fault matrix of mlx4_core.
//!
//! Every bring-up command once with an error status and once with GO never
//! clearing; absurd QUERY_DEV_CAP values; a catastrophic error while idle.

use tests::mlx4_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mlx4_common::*;
use mlx4_core::hw::cmd::Opcode;
use mlx4_core::{Caps, Error, Event, Interface, Profile};
use sim::hca::faults::BadCap;
use sim::{OpcodeFault, SimConfig, Status};

/// Commands whose failure Linux only warns about.
fn optional(op: u16) -> bool {
    matches!(op, 0x034 | 0x012 | 0x024 | 0x00b)
}

fn bring_up_opcodes() -> Vec<u16> {
    let hca = sync_hca();
    let dev = bring_up(&hca, Profile::default()).expect("clean bring-up");
    let mut ops: Vec<u16> = Vec::new();
    for e in hca.trace() {
        if !ops.contains(&e.opcode) {
            ops.push(e.opcode);
        }
    }
    dev.teardown();
    ops
}

fn model(relax: Duration) -> Model {
    Model::new(SimConfig {
        relax_step: relax,
        ..SimConfig::default()
    })
}

#[test]
fn every_bring_up_command_fails_cleanly_with_an_error_status() {
    for op in bring_up_opcodes() {
        let name = Opcode(op);
        let hca = model(Duration::from_micros(1));
        let dma0 = hca.dma_pool().stats();
        hca.faults().set(
            sim::Opcode(op),
            OpcodeFault::status(Status::BAD_PARAM).times(1),
        );
        match bring_up(&hca, Profile::default()) {
            Ok(dev) => {
                assert!(optional(op), "{name}: bring-up ignored a failed command");
                dev.teardown();
            }
            Err(e) => {
                assert!(
                    !optional(op),
                    "{name}: optional command failed bring-up: {e}"
                );
                assert_eq!(
                    e.opcode(),
                    Some(name),
                    "{name}: error names another command: {e}"
                );
                assert!(e.to_string().contains(&name.to_string()), "{e}");
                assert_eq!(e.to_errno(), -22, "{name}: BAD_PARAM is -EINVAL");
            }
        }
        assert_eq!(hca.dma_pool().stats(), dma0, "{name}: DMA not freed");
        assert_eq!(
            hca.icm_mapped_pages(),
            0,
            "{name}: ICM still mapped in the model"
        );
        assert!(!hca.is_running(), "{name}: firmware still running");
        assert!(
            hca.violations().is_empty(),
            "{name}: {:#?}",
            hca.violations()
        );
    }
}

#[test]
fn every_bring_up_command_with_a_stuck_go_bit_times_out() {
    for op in bring_up_opcodes() {
        let name = Opcode(op);
        let hca = model(Duration::from_millis(1));
        let dma0 = hca.dma_pool().stats();
        hca.faults().set(sim::Opcode(op), OpcodeFault::stuck());
        hca.expect_firmware_left_behind(
            "GO never clears: the HCR stays busy, nothing can be closed",
        );
        let clock = hca.clock();
        let t0 = clock.now_ns();
        let r = bring_up(&hca, Profile::default());
        let waited = Duration::from_nanos(clock.now_ns() - t0);
        match r {
            Ok(_) => panic!("{name}: bring-up survived a stuck command"),
            Err(e) => assert_eq!(e, Error::CmdTimeout { op: name }, "{name}"),
        }
        assert_eq!(hca.dma_pool().stats(), dma0, "{name}: DMA not freed");
        // Reset (1 s), semaphore/vendor polls, ownership release (1 s), one
        // command deadline (NOP: 0.1 s, others 10 s) and nothing more: every
        // later command finds the HCR busy and fails at once.
        let limit = if op == 0x031 { 3 } else { 13 };
        assert!(
            waited < Duration::from_secs(limit),
            "{name}: waited {waited:?}"
        );
        assert!(
            waited >= Duration::from_millis(100),
            "{name}: did not wait at all"
        );
    }
}

#[test]
fn absurd_dev_caps_are_named_errors() {
    let cases = [
        (BadCap::HugeLogMaxQps, "max_qps"),
        (BadCap::NoPorts, "num_ports"),
        (BadCap::MinPageTooLarge, "min_page_sz"),
        (BadCap::ZeroQpcEntrySize, "qpc_entry_sz"),
        (BadCap::HugeUarSize, "uar_size"),
    ];
    for (cap, field) in cases {
        let hca = sync_hca();
        let dma0 = hca.dma_pool().stats();
        hca.faults().bad_cap(cap);
        match bring_up(&hca, Profile::default()) {
            Err(Error::BadCaps { field: f, .. }) => assert_eq!(f, field, "{cap:?}"),
            Err(e) => panic!("{cap:?}: {e}"),
            Ok(_) => panic!("{cap:?}: accepted"),
        }
        assert_eq!(hca.dma_pool().stats(), dma0, "{cap:?}");
        assert!(!hca.is_running(), "{cap:?}");
        assert_eq!(hca.icm_mapped_pages(), 0);
    }
}

struct Recorder(Arc<Mutex<Vec<Event>>>);
impl Interface for Recorder {
    fn event(&mut self, _caps: &Caps, ev: Event) {
        self.0.lock().unwrap().push(ev);
    }
}

#[test]
fn catastrophic_error_while_idle_is_reported_within_one_poll() {
    for threaded in [false, true] {
        let hca = if threaded {
            Model::threaded()
        } else {
            sync_hca()
        };
        hca.expect_firmware_left_behind(
            "after a catastrophic error every command fails until the next reset",
        );
        let dma0 = hca.dma_pool().stats();
        let mut dev = bring_up(&hca, Profile::default()).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        dev.register_interface(Box::new(Recorder(seen.clone())));
        dev.poll();
        assert!(!dev.is_catastrophic());
        hca.raise_catastrophic_error();
        dev.poll();
        assert!(dev.is_catastrophic(), "threaded={threaded}");
        let ev = seen.lock().unwrap().clone();
        assert_eq!(
            ev.iter()
                .filter(|e| **e == Event::CatastrophicError)
                .count(),
            1,
            "{ev:?}"
        );
        assert!(!log_lines("Internal error detected").is_empty());
        dev.teardown();
        assert_eq!(hca.dma_pool().stats(), dma0);
    }
}

#[test]
fn slow_commands_complete_within_their_class_deadline() {
    // INIT_HCA may take up to 10 s, NOP only 100 ms (Linux 3.11 values).
    let cases = [
        (sim::Opcode::INIT_HCA, Duration::from_secs(9), None),
        (
            sim::Opcode::INIT_HCA,
            Duration::from_secs(11),
            Some(Opcode::INIT_HCA),
        ),
        (sim::Opcode::NOP, Duration::from_millis(50), None),
        (
            sim::Opcode::NOP,
            Duration::from_millis(200),
            Some(Opcode::NOP),
        ),
    ];
    for (op, delay, expect_timeout) in cases {
        let hca = model(Duration::from_micros(100));
        let dma0 = hca.dma_pool().stats();
        hca.faults().set(op, OpcodeFault::delay(0, delay).times(1));
        if expect_timeout.is_some() {
            hca.expect_firmware_left_behind(
                "a command past its deadline keeps the HCR busy while teardown runs",
            );
        }
        match (bring_up(&hca, Profile::default()), expect_timeout) {
            (Ok(dev), None) => drop(dev.teardown()),
            (Err(e), Some(t)) => assert_eq!(e, Error::CmdTimeout { op: t }),
            (r, _) => panic!("{op:?} delayed {delay:?}: {:?}", r.err()),
        }
        assert_eq!(hca.dma_pool().stats(), dma0);
    }
}

#[test]
fn a_second_function_does_not_steal_an_owned_hca() {
    let hca = sync_hca();
    let mut dev = bring_up(&hca, Profile::default()).unwrap();
    match bring_up(&hca, Profile::default()) {
        Err(Error::NotOwner) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("two drivers own one HCA"),
    }
    // The first one is untouched.
    assert_eq!(dev.poll(), 0);
    assert!(hca.is_running());
    dev.teardown();
    // Ownership was released: a new probe works.
    let dev = bring_up(&hca, Profile::default()).unwrap();
    dev.teardown();
}

#[test]
fn running_out_of_dma_memory_is_an_error_not_a_leak() {
    for size in [64 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20] {
        let hca = Model::new(SimConfig {
            dma_size: size,
            ..SimConfig::default()
        });
        match bring_up(&hca, Profile::default()) {
            Ok(dev) => drop(dev.teardown()),
            Err(e) => assert!(matches!(e, Error::Dma(_)), "{size:#x}: {e}"),
        }
        assert_eq!(
            hca.dma_pool().stats(),
            hal::DmaStats::default(),
            "{size:#x}"
        );
        assert_eq!(hca.icm_mapped_pages(), 0, "{size:#x}");
        assert!(!hca.is_running(), "{size:#x}");
    }
}

#[test]
fn after_a_catastrophic_error_the_function_can_be_probed_again() {
    let hca = sync_hca();
    let dma0 = hca.dma_pool().stats();
    let mut dev = bring_up(&hca, Profile::default()).unwrap();
    hca.raise_catastrophic_error();
    dev.poll();
    assert!(dev.is_catastrophic());
    // Linux's restart: remove, then probe the same function (reset clears
    // the error).
    let pdev = dev.teardown();
    assert_eq!(hca.dma_pool().stats(), dma0);
    let dev = mlx4_core::probe(pdev, hca.dma_pool(), hca.clock(), Profile::default())
        .unwrap_or_else(|e| panic!("re-probe: {e}: {:#?}", hca.violations()));
    assert!(!dev.is_catastrophic());
    dev.teardown();
    assert_eq!(hca.dma_pool().stats(), dma0);
}
