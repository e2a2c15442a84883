//! The HCR go/toggle protocol, QUERY_FW, and what the model records when the
//! protocol is broken.

use std::time::Duration;

use crate::harness::*;
use sim::hca::faults::OpcodeFault;
use sim::{Opcode, SimConfig, SimHca, Status};

#[test]
fn after_reset_t_reads_zero_and_query_fw_reports_the_firmware() {
    let mut r = Raw::new();
    assert_eq!(r.bar0.read_be32(HCR + 0x18), 0, "T=0, GO=0 after power-on");
    assert!(!r.pending(), "driver toggle 1 vs T 0: free");
    let fw = r.cmd_out(0, 0, Opcode::QUERY_FW).unwrap();
    assert_eq!(&fw[0..8], &[0x01, 0x00, 0x00, 0x02, 0x13, 0x88, 0x00, 0x2a]);
    assert_eq!(u16::from_be_bytes([fw[0x0a], fw[0x0b]]), 3, "cmd_if_rev");
    assert_eq!(
        u64::from_be_bytes(fw[0x30..0x38].try_into().unwrap()),
        0xa_0000
    );
    let s = r.bar0.read_be32(HCR + 0x18);
    assert_eq!(s & (GO | T), T, "GO cleared, T as posted");
    assert_eq!(s & 0xfff, 0x004, "opcode left in place");
    let t = r.sim.trace();
    assert_eq!(t.len(), 1);
    assert_eq!(
        (t[0].name, t[0].status, t[0].token),
        ("QUERY_FW", 0, 0xffff)
    );
    assert!(t[0].duration.is_some());
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}

#[test]
fn go_stays_set_for_the_configured_polls() {
    let cfg = SimConfig {
        hcr_polls: 5,
        ..Default::default()
    };
    let r = Raw::cfg(cfg);
    r.bar0.write_be32(HCR + 0xc, 0);
    for off in [0, 4, 8, 0x10, 0x14] {
        r.bar0.write_be32(HCR + off, 0);
    }
    r.bar0.write_be32(HCR + 0x18, GO | T | 0x031); // NOP: BAD_SYS_STATE before RUN_FW
    let mut reads = 0;
    while r.bar0.read_be32(HCR + 0x18) & GO != 0 {
        reads += 1;
        assert!(reads < 100);
    }
    assert_eq!(reads, 5);
    assert_eq!(
        r.bar0.read_be32(HCR + 0x18) >> 24,
        u32::from(Status::BAD_SYS_STATE.0)
    );
}

#[test]
fn posting_while_busy_is_a_violation_and_ignored() {
    let cfg = SimConfig {
        hcr_polls: 3,
        ..Default::default()
    };
    let r = Raw::cfg(cfg);
    for off in [0, 4, 8, 0xc, 0x10, 0x14] {
        r.bar0.write_be32(HCR + off, 0);
    }
    r.bar0.write_be32(HCR + 0x18, GO | T | 0x031);
    // Overwrite a parameter and post again without waiting.
    r.bar0.write_be32(HCR + 8, 7);
    r.bar0.write_be32(HCR + 0x18, GO | 0x031);
    let v = r.sim.violations();
    assert!(
        v.iter()
            .any(|s| s.contains("dword 2 written while a command is in flight")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|s| s.contains("GO written while the HCR is busy")),
        "{v:?}"
    );
    assert_eq!(r.sim.trace().len(), 1, "the second post was not executed");
}

#[test]
fn partial_writes_stale_toggle_and_wide_stores_are_violations() {
    let r = Raw::new();
    r.bar0.write_be32(HCR + 0x18, GO | T | 0x004);
    while r.bar0.read_be32(HCR + 0x18) & GO != 0 {}
    for off in [0, 4, 8, 0xc, 0x10, 0x14] {
        r.bar0.write_be32(HCR + off, 0);
    }
    r.bar0.write_be32(HCR + 0x18, GO | T | 0x004); // T not flipped
    while r.bar0.read_be32(HCR + 0x18) & GO != 0 {}
    r.bar0.write64(HCR, 0);
    let v = r.sim.violations();
    assert!(v.iter().any(|s| s.contains("before dwords 0..5")), "{v:?}");
    assert!(v.iter().any(|s| s.contains("toggle not flipped")), "{v:?}");
    assert!(
        v.iter().any(|s| s.contains("64-bit store into the HCR")),
        "{v:?}"
    );
}

#[test]
fn unknown_and_unsupported_opcodes_are_bad_op() {
    let mut r = Raw::new();
    assert_eq!(
        r.cmd(0, 0, 0, Opcode(0x7ab)),
        Err(CmdError::Status(Status::BAD_OP))
    );
    // (WRITE_MCG was the example here until the model took multicast
    // groups: see `mcg.rs`.)
    assert_eq!(
        r.cmd(0, 0, 0, Opcode::ACCESS_MEM),
        Err(CmdError::Status(Status::BAD_OP))
    );
    assert_eq!(r.sim.trace()[0].name, "UNKNOWN");
}

#[test]
fn mailbox_outside_host_memory_is_a_dma_fault_not_a_panic() {
    let mut r = Raw::new();
    assert_eq!(
        r.post(0, 0xdead_0000, 0, 0, Opcode::QUERY_FW),
        Err(CmdError::Status(Status::INTERNAL_ERR))
    );
    let f = r.sim.dma_faults();
    assert_eq!(f.len(), 1);
    assert_eq!((f[0].bus, f[0].write), (0xdead_0000, true));
}

#[test]
fn no_dma_without_bus_mastering_and_no_registers_without_memory_decode() {
    let mut r = Raw::new();
    r.pci.clear_command_bits(hal::pci::cfg::COMMAND_MASTER);
    assert_eq!(
        r.cmd_out(0, 0, Opcode::QUERY_FW),
        Err(CmdError::Status(Status::INTERNAL_ERR))
    );
    assert_eq!(
        r.sim.dma_faults()[0].kind,
        sim::hca::mem::DmaFaultKind::BusMasterOff
    );
    r.pci.clear_command_bits(hal::pci::cfg::COMMAND_MEMORY);
    assert_eq!(r.bar0.read32(HCR + 0x18), u32::MAX);
    assert!(
        r.sim
            .violations()
            .iter()
            .any(|s| s.contains("memory decoding disabled"))
    );
}

#[test]
fn ownership_is_claimed_by_the_first_read_and_released_by_writing_zero() {
    let r = Raw::new();
    assert_eq!(r.bar0.read_be32(0x8_069c), 0);
    assert_ne!(r.bar0.read_be32(0x8_069c), 0, "second reader: owned");
    r.bar0.write_be32(0x8_069c, 0);
    assert_eq!(r.bar0.read_be32(0x8_069c), 0);
}

#[test]
fn reset_needs_the_semaphore_and_takes_the_function_off_the_bus() {
    let r = Raw::new();
    r.bar0.write_be32(0xf_0010, 1);
    assert!(
        r.sim
            .violations()
            .iter()
            .any(|s| s.contains("reset semaphore"))
    );
    assert_eq!(r.pci.read16(0), 0xffff, "off the bus during reset");
    r.clock.delay(Duration::from_millis(200));
    assert_eq!(r.pci.read16(0), 0x15b3);
    assert_eq!(r.pci.command() & 0x6, 0, "command register cleared");
    let mut r = Raw::new();
    reset(&mut r);
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
    assert_eq!(r.bar0.read_be32(HCR + 0x18), 0, "HCR back to T=0");
    r.cmd_out(0, 0, Opcode::QUERY_FW).unwrap();
}

#[test]
fn stuck_go_times_out_and_leaves_the_hcr_busy() {
    let mut r = Raw::new();
    r.timeout = Duration::from_millis(5);
    r.sim.faults().set(Opcode::QUERY_FW, OpcodeFault::stuck());
    assert_eq!(r.cmd_out(0, 0, Opcode::QUERY_FW), Err(CmdError::Timeout));
    assert_eq!(r.cmd_out(0, 0, Opcode::QUERY_FW), Err(CmdError::Busy));
    let t = r.sim.trace();
    assert_eq!(t[0].duration, None);
    assert!(t[0].to_string().contains("GO still set"));
}

#[test]
fn threaded_mode_serves_commands_from_shared_memory_and_stops_on_drop() {
    let sim = SimHca::new_threaded(SimConfig::default());
    let weak_clock = std::sync::Arc::downgrade(&sim.clock());
    {
        let mut r = Raw::with(sim);
        let fw = r.cmd_out(0, 0, Opcode::QUERY_FW).unwrap();
        assert_eq!(&fw[2..4], &[0, 2]);
        assert_eq!(
            r.cmd(0, 0, 0, Opcode::RUN_FW),
            Err(CmdError::Status(Status::BAD_SYS_STATE))
        );
        assert_eq!(r.sim.trace().len(), 2);
        assert!(r.sim.trace()[0].duration.is_some());
    }
    // The handle, its clones and the thread are gone: the clock is freed.
    assert!(weak_clock.upgrade().is_none());
}

#[test]
fn threaded_mode_software_reset_and_bring_up() {
    let sim = SimHca::new_threaded(SimConfig {
        reset_duration: Duration::from_millis(50),
        ..Default::default()
    });
    let mut r = Raw::with(sim);
    r.timeout = Duration::from_secs(30);
    // Linux's sequence, with its real one-second sleep.
    init(&mut r).unwrap();
    assert!(r.sim.is_initialized());
    assert!(r.ok_trace());
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}

#[test]
fn immediate_completion_and_time_based_delay() {
    // hcr_polls 0: GO is already clear on the first read after posting.
    let r = Raw::cfg(SimConfig {
        hcr_polls: 0,
        ..Default::default()
    });
    for off in [0, 4, 8, 0xc, 0x10, 0x14] {
        r.bar0.write_be32(HCR + off, 0);
    }
    let a = r.outbox.bus_addr().0;
    r.bar0.write_be32(HCR + 0xc, (a >> 32) as u32);
    r.bar0.write_be32(HCR + 0x10, a as u32);
    r.bar0.write_be32(HCR + 0x18, GO | T | 0x004);
    assert_eq!(r.bar0.read_be32(HCR + 0x18) & GO, 0);
    assert_eq!(r.sim.trace()[0].duration, Some(Duration::ZERO));
    // Threaded, with a 5 ms completion delay on real time.
    let sim = SimHca::new_threaded(SimConfig {
        hcr_delay: Duration::from_millis(5),
        ..Default::default()
    });
    let mut r = Raw::with(sim);
    let t0 = std::time::Instant::now();
    r.cmd_out(0, 0, Opcode::QUERY_FW).unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(5));
    assert!(r.sim.trace()[0].duration.unwrap() >= Duration::from_millis(5));
}

#[test]
fn the_handle_is_send_and_sync_and_clones_share_the_device() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SimHca>();
    let sim = SimHca::new(SimConfig::default());
    let other = sim.clone();
    let mut r = Raw::with(sim);
    r.cmd_out(0, 0, Opcode::QUERY_FW).unwrap();
    assert_eq!(other.trace().len(), 1);
    other.clear_trace();
    assert!(r.sim.trace().is_empty());
}

#[test]
fn a_model_over_external_memory_and_register_windows() {
    use sim::hca::regs::RegFile;
    use std::sync::Arc;
    // "Guest RAM" and the two BAR windows belong to someone else.
    let guest = Arc::new(hal::fake::ArenaDma::with_bus_base(1 << 20, 0x4000_0000));
    let pool = hal::DmaPool::new(guest.clone());
    let mut bar0_mem = vec![0u32; (1 << 20) / 4];
    let mut bar2_mem = vec![0u32; (8 << 20) / 4];
    // SAFETY: both vectors outlive the model (dropped after `sim` below) and
    // are only accessed through the register files.
    let (bar0, bar2) = unsafe {
        (
            Arc::new(RegFile::from_raw_parts(
                std::ptr::NonNull::new(bar0_mem.as_mut_ptr()).unwrap(),
                bar0_mem.len(),
            )),
            Arc::new(RegFile::from_raw_parts(
                std::ptr::NonNull::new(bar2_mem.as_mut_ptr()).unwrap(),
                bar2_mem.len(),
            )),
        )
    };
    let cfg = SimConfig {
        dma_size: 4096,
        ..Default::default()
    };
    let sim = SimHca::new_over(cfg, guest.clone(), bar0.clone(), bar2);
    let cs = sim.config_space();
    hal::ConfigSpace::write32(&*cs, 4, 0x6);
    assert_eq!(hal::ConfigSpace::read32(&*cs, 0), 0x1003_15b3);
    let out = pool.alloc_pages(1).unwrap();
    let a = out.bus_addr().0;
    for (i, v) in [0, 0, 0, (a >> 32) as u32, a as u32, 0xffff << 16]
        .into_iter()
        .enumerate()
    {
        bar0.set_be(HCR + 4 * i, v);
    }
    bar0.set_be(HCR + 0x18, GO | T | 0x004);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while bar0.be(HCR + 0x18) & GO != 0 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_micros(50));
    }
    assert_eq!(bar0.be(HCR + 0x18) >> 24, 0);
    assert_eq!(out.read_be16(2), 2, "QUERY_FW landed in the guest's memory");
    drop(sim);
    drop(out);
    drop(bar0);
    drop(bar0_mem);
    drop(bar2_mem);
}

#[test]
fn trace_entries_carry_their_start_time_and_can_be_streamed() {
    let mut r = Raw::new();
    r.cmd_out(0, 0, Opcode::QUERY_FW).unwrap();
    r.sim
        .fake_clock()
        .unwrap()
        .advance(Duration::from_millis(7));
    r.cmd(0, 0, 0, Opcode::RUN_FW).ok();
    let t = r.sim.trace();
    assert!(t[1].at >= t[0].at + Duration::from_millis(7));
    assert_eq!(r.sim.trace_since(1), t[1..].to_vec());
    assert!(r.sim.trace_since(5).is_empty());
}

/// Polls `cond` for up to 10 s of real time.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn threaded_mode_enforces_the_hcr_write_order_and_the_reset_semaphore() {
    // A 30 ms command keeps the HCR busy long enough to write into it.
    let sim = SimHca::new_threaded(SimConfig {
        hcr_delay: Duration::from_millis(30),
        reset_duration: Duration::from_millis(20),
        ..Default::default()
    });
    let r = Raw::with(sim);
    let v = || r.sim.violations().join("\n");
    // GO before the parameters.
    r.bar0.write_be32(HCR + 0x18, GO | T | 0x031);
    eventually("NOP done", || r.bar0.read_be32(HCR + 0x18) & GO == 0);
    assert!(v().contains("GO) written before dwords 0..5"), "{}", v());
    // Parameters, GO, then a parameter and a second GO while busy: both
    // dropped, the first command runs with what it was posted with.
    for off in [0, 4, 8, 0xc, 0x10, 0x14] {
        r.bar0.write_be32(HCR + off, 0);
    }
    r.bar0.write_be32(HCR + 0x18, GO | 0x031);
    r.bar0.write_be32(HCR + 8, 0x1f);
    r.bar0.write_be32(HCR + 0x18, GO | T | 0x031);
    assert!(v().contains("dword 2 written while a command is in flight"));
    assert!(v().contains("GO written while the HCR is busy"));
    eventually("second NOP done", || r.bar0.read_be32(HCR + 0x18) & GO == 0);
    assert_eq!(r.bar0.read_be32(HCR + 8), 0, "late parameter dropped");
    assert_eq!(r.sim.trace().len(), 2, "the second GO did not post");
    // T not flipped (the model checks it when it takes the command).
    for off in [0, 4, 8, 0xc, 0x10, 0x14] {
        r.bar0.write_be32(HCR + off, 0);
    }
    r.bar0.write_be32(HCR + 0x18, GO | 0x031);
    eventually("third NOP done", || r.bar0.read_be32(HCR + 0x18) & GO == 0);
    assert!(v().contains("toggle not flipped"), "{}", v());
    // A 64-bit store into the HCR.
    r.bar0.write64(HCR, 0);
    assert!(v().contains("64-bit store into the HCR"));
    // Semaphores are read-to-claim; a reset without it is recorded.
    assert_eq!(r.bar0.read32(0xf_03fc), 0, "semaphore taken");
    assert_ne!(r.bar0.read32(0xf_03fc), 0, "already held");
    r.bar0.write32(0xf_03fc, 0);
    r.sim.take_violations();
    r.bar0.write_be32(0xf_0010, 1);
    assert!(
        v().contains("software reset without holding the reset semaphore"),
        "{}",
        v()
    );
}
