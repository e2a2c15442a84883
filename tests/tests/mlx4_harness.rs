//! The model-backed test harness itself.
//!
//! The invariants its [`Model`] fixture checks when a model goes away (violations,
//! DMA faults, firmware left running, ICM left mapped, DMA leaked), the narrow
//! opt-outs, the watchdog that turns a hang into a failure, and that every `mlx4_*`
//! test file uses the fixture.

use tests::mlx4_common;

use std::io::Read;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mlx4_common::*;
use mlx4_core::Profile;
use sim::OpcodeFault;

/// Drops `m` and returns the harness's complaint, if any.
fn complaint(m: Model) -> Option<String> {
    match catch_unwind(AssertUnwindSafe(move || drop(m))) {
        Ok(()) => None,
        Err(p) => Some(
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        ),
    }
}

/// A register write the model refuses: BAR0 before memory decoding is on.
fn provoke_violation(m: &Model) {
    let pci = m.pci_function();
    let bar0 = pci.take_bar(0).expect("BAR0");
    bar0.write_be32(0x8_0680, 0);
}

#[test]
fn a_clean_bring_up_and_teardown_satisfies_the_invariants() {
    for m in [Model::sync(), Model::threaded()] {
        let dev = bring_up(&m, Profile::default()).unwrap();
        dev.teardown();
        assert_eq!(m.invariant_failures(), Vec::<String>::new());
        assert_eq!(complaint(m), None);
    }
}

#[test]
fn a_violation_anywhere_fails_the_test_when_its_model_goes_away() {
    let m = Model::sync();
    provoke_violation(&m);
    let c = complaint(m).expect("the harness must fail the test");
    assert!(
        c.contains("1 unexpected protocol violation(s)") && c.contains("memory decoding disabled"),
        "{c}"
    );
    assert!(
        c.contains("mlx4_harness.rs"),
        "names where the model was built: {c}"
    );
}

#[test]
fn expect_violation_allows_only_what_it_names_and_requires_it() {
    let m = Model::sync();
    m.expect_violation("memory decoding disabled");
    provoke_violation(&m);
    assert_eq!(complaint(m), None);

    // Named but never seen: the opt-out is not needed, so it is an error.
    let m = Model::sync();
    m.expect_violation("memory decoding disabled");
    let c = complaint(m).expect("an unused opt-out fails");
    assert!(c.contains("the model recorded none"), "{c}");

    // Another violation than the one named still fails.
    let m = Model::sync();
    m.expect_violation("MTT entry");
    provoke_violation(&m);
    let c = complaint(m).expect("only the named violation is allowed");
    assert!(c.contains("unexpected protocol violation"), "{c}");
}

#[test]
fn a_device_never_torn_down_leaves_icm_mapped_and_fails() {
    let m = Model::sync();
    let dev = bring_up(&m, Profile::default()).unwrap();
    // The device object is lost without Linux's remove path running.
    std::mem::forget(dev);
    let c = complaint(m).expect("the harness must fail the test");
    assert!(c.contains("firmware is still running"), "{c}");
    assert!(c.contains("ICM page(s) still mapped"), "{c}");
    assert!(c.contains("DMA pool not back to its baseline"), "{c}");
}

#[test]
fn leaked_dma_memory_fails_the_test() {
    let m = Model::sync();
    let dev = bring_up(&m, Profile::default()).unwrap();
    let buf = dev.dma_pool().alloc_pages(1).unwrap();
    dev.teardown();
    std::mem::forget(buf);
    let c = complaint(m).expect("the harness must fail the test");
    assert!(
        c.contains(
            "DMA pool not back to its baseline after teardown: 1 allocation(s) / 4096 bytes"
        ),
        "{c}"
    );
    assert!(!c.contains("ICM"), "{c}");
}

#[test]
fn firmware_left_behind_is_allowed_only_when_announced() {
    let m = Model::sync();
    m.faults()
        .set(sim::Opcode::INIT_HCA, OpcodeFault::stuck().times(1));
    m.expect_firmware_left_behind("INIT_HCA never completes");
    assert!(bring_up(&m, Profile::default()).is_err());
    assert!(m.is_running());
    assert_eq!(complaint(m), None);
}

/// Run only as the watchdog test's child process: a poll loop without a
/// deadline on a command whose GO bit never clears.
#[test]
#[ignore = "run by watchdog_turns_a_hang_into_a_failure_naming_the_last_command"]
fn watchdog_child_hangs_in_a_poll_loop_without_a_deadline() {
    if std::env::var_os("MLX4_WATCHDOG_CHILD").is_none() {
        return;
    }
    let m = Model::sync();
    m.faults()
        .set(sim::Opcode::QUERY_FW, OpcodeFault::stuck().times(1));
    let pci = m.pci_function();
    pci.enable();
    let bar0 = pci.take_bar(0).expect("BAR0");
    let clock = m.clock();
    let hcr = 0x8_0680;
    let out = m.dma_pool().alloc_pages(1).unwrap();
    let a = out.bus_addr().0;
    for (i, v) in [0, 0, 0, (a >> 32) as u32, a as u32, 0]
        .into_iter()
        .enumerate()
    {
        bar0.write_be32(hcr + 4 * i, v);
    }
    bar0.write_be32(hcr + 0x18, (1 << 23) | (1 << 21) | 0x004);
    // The mistake: no deadline.
    while bar0.read_be32(hcr + 0x18) & (1 << 23) != 0 {
        clock.relax();
        std::thread::sleep(Duration::from_millis(1));
    }
    unreachable!("GO cleared on a stuck command");
}

#[test]
fn watchdog_turns_a_hang_into_a_failure_naming_the_last_command() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "watchdog_child_hangs_in_a_poll_loop_without_a_deadline",
            "--ignored",
            "--nocapture",
        ])
        .env("MLX4_WATCHDOG_CHILD", "1")
        .env("MLX4_WATCHDOG_SECS", "2")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    // Our own deadline: without the watchdog the child never ends.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = reader.join().unwrap();
    let status = status.unwrap_or_else(|| panic!("the hung test ran past 60 s:\n{stderr}"));
    assert_eq!(status.code(), Some(101), "{stderr}");
    for needle in [
        "mlx4 test watchdog: test watchdog_child_hangs_in_a_poll_loop_without_a_deadline",
        "mlx4_harness.rs:",
        "limit 2 s",
        "last firmware command posted: QUERY_FW(0x004)",
        "(GO still set)",
        "ago on the model clock",
    ] {
        assert!(stderr.contains(needle), "{needle:?} missing in:\n{stderr}");
    }
}

#[test]
fn every_model_backed_test_file_uses_the_fixture() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut bad = Vec::new();
    let mut files = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("mlx4_") && name.ends_with(".rs")) {
            continue;
        }
        files += 1;
        let src = std::fs::read_to_string(&p).unwrap();
        // subnet_common's `guest` wraps the model it is handed in
        // mlx4_common's `Model`, so a file on the subnet fixture may build
        // the `SimHca` it hands there; eth_node's nodes are such guests.
        let subnet =
            src.contains("use tests::subnet_common") || src.contains("use tests::eth_node");
        if !src.contains("use tests::mlx4_common") && !subnet {
            bad.push(format!("{name}: does not use mlx4_common"));
        }
        for (i, l) in src.lines().enumerate() {
            if l.contains(concat!("SimHca", "::new")) && !subnet {
                bad.push(format!(
                    "{name}:{}: builds a model without the fixture (use Model::new/sync/threaded): {}",
                    i + 1,
                    l.trim()
                ));
            }
        }
    }
    assert!(files >= 4, "found {files} mlx4_* test files in {dir:?}");
    assert!(bad.is_empty(), "{bad:#?}");
}
