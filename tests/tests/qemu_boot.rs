//! End-to-end: the real image booted under QEMU.
//!
//! End-to-end: the real image booted under QEMU (TCG), driven over its serial
//! console, judged by the transcript and by the `isa-debug-exit` status.

use std::time::Duration;
use tests::qemu::{self, Console};

/// A run takes seconds; the deadline only bounds a hang.
const DEADLINE: Duration = Duration::from_secs(60);
/// These tests are about the kernel alone; the emulated HCA has its own.
const NO_HCA: &[&str] = &["--no-hca"];

#[test]
fn boots_with_banner_memory_map_and_boot_time() {
    let r = qemu::run("meminfo; uptime", NO_HCA, DEADLINE);
    assert_eq!(r.status, 0, "{}", r.transcript);
    r.expect("LegoIB research kernel")
        .expect("booted by PVH")
        .expect("BIOS-provided physical RAM map:")
        .expect("] usable")
        .expect("Boot: kernel entry to shell prompt in")
        .expect("MemTotal:")
        .expect("DmaTotal:")
        .expect("since kernel entry")
        .expect("run: all commands succeeded");
}

#[test]
fn lspci_lists_the_q35_host_bridge_in_lspci_format() {
    // A NIC behind a PCI-to-PCI bridge proves the recursive scan.
    let bridge = [
        "--",
        "-device",
        "pci-bridge,id=br1,chassis_nr=1,bus=pcie.0,addr=0x5",
        "-device",
        "e1000,bus=br1,addr=0x1",
    ];
    let r = qemu::run("lspci; lspci -n; lspci -v", &bridge, DEADLINE);
    assert_eq!(r.status, 0, "{}", r.transcript);
    r.expect("00:05.0 PCI bridge: Red Hat, Inc.").expect(
        "01:01.0 Ethernet controller: Intel Corporation 82540EM Gigabit Ethernet Controller",
    );
    r.expect("00:00.0 Host bridge: Intel Corporation 82G33/G31/P35/P31 Express DRAM Controller")
        .expect("00:00.0 0600: 8086:29c0")
        .expect("00:1f.0 ISA bridge: Intel Corporation 82801IB (ICH9) LPC Interface Controller (rev 02)")
        .expect("\tMemory at ")
        .expect("(32-bit, non-prefetchable) [size=")
        .expect("\tCapabilities: [");
}

#[test]
fn a_failing_command_fails_the_run_and_the_rest_still_runs() {
    let r = qemu::run("nosuchcommand; lspci -x; uptime", NO_HCA, DEADLINE);
    assert_eq!(r.status, 1, "{}", r.transcript);
    r.expect("nosuchcommand: command not found")
        .expect("lspci: usage: lspci [-v] [-n]")
        .expect("since kernel entry")
        .expect("run: a command failed");
}

#[test]
fn retry_reruns_a_failing_command_and_stops_at_the_first_success() {
    let r = qemu::run(
        "retry -n 3 -i 0 lspci -x; retry -i 0 uptime; retry; \
         retry -u -i 0 lspci -x; retry -u -n 2 -i 0 uptime",
        NO_HCA,
        DEADLINE,
    );
    assert_eq!(r.status, 1, "{}", r.transcript);
    r.expect("lspci: usage: lspci [-v] [-n]")
        .expect("retry: lspci failed (1 of 3); again in 0 s")
        .expect("retry: lspci failed (2 of 3); again in 0 s")
        .expect("lspci: usage: lspci [-v] [-n]")
        .expect("retry: lspci failed 3 times")
        .expect("since kernel entry")
        .expect("retry: usage: retry [-n TIMES] [-i SECONDS] [-u] COMMAND [ARGS...]")
        // -u: until it fails, which ends the retry at once ...
        .expect("lspci: usage: lspci [-v] [-n]")
        .expect("retry: lspci failed (try 1 of 10)")
        // ... and a command that keeps succeeding makes it fail.
        .expect("since kernel entry")
        .expect("retry: uptime succeeded (1 of 2); again in 0 s")
        .expect("since kernel entry")
        .expect("retry: uptime succeeded 2 times")
        .reject("retry: uptime failed");
}

#[test]
fn page_fault_prints_a_diagnostic_and_exits_with_failure() {
    let r = qemu::run("crash pagefault; uptime", NO_HCA, DEADLINE);
    assert_eq!(
        r.status, 1,
        "must fail, not hang or pass:\n{}",
        r.transcript
    );
    r.expect("CPU exception: Page fault (#PF, vector 14), error code 0x2")
        .expect("write access to a non-present page (kernel-mode)")
        .expect("CR2 0x00006000dead0000")
        .expect("backtrace:")
        .expect("#1 ")
        .expect("System halted.")
        .reject("since kernel entry");
}

#[test]
fn invalid_opcode_and_stack_overflow_are_reported() {
    let r = qemu::run("crash invalid-opcode", NO_HCA, DEADLINE);
    assert_eq!(r.status, 1, "{}", r.transcript);
    r.expect("Invalid opcode (#UD, vector 6)");
    // Runs off the guard page; the double fault runs on its own stack.
    let r = qemu::run("crash stack-overflow", NO_HCA, DEADLINE);
    assert_eq!(r.status, 1, "{}", r.transcript);
    r.expect("Double fault (#DF, vector 8)");
}

#[test]
fn reboot_resets_the_machine() {
    // run-qemu.sh passes -no-reboot, so a reset ends QEMU with status 0.
    let r = qemu::run("reboot; uptime", NO_HCA, DEADLINE);
    assert_eq!(r.status, 0, "{}", r.transcript);
    r.expect("Restarting system.").reject("since kernel entry");
}

#[test]
fn panic_is_reported_with_location() {
    let r = qemu::run("crash panic", NO_HCA, DEADLINE);
    assert_eq!(r.status, 1, "{}", r.transcript);
    r.expect("Kernel panic: crash panic requested from the console")
        .expect("kernel/src/console/commands.rs:");
}

#[test]
fn log_filters_from_the_command_line_and_the_console() {
    let r = qemu::run(
        "log; log kernel::pci=debug,warn; log; log loud; dmesg",
        &["--no-hca", "--append", "log=info,kernel::mm=trace"],
        DEADLINE,
    );
    assert_eq!(r.status, 1, "`log loud` must fail:\n{}", r.transcript);
    r.expect("log filter: info,kernel::mm=trace")
        .expect("log filter: warn,kernel::mm=trace,kernel::pci=debug")
        .expect("log: unknown level")
        // dmesg replays the boot log from the ring buffer.
        .expect("kernel: Command line: log=info,kernel::mm=trace");
}

#[test]
fn interactive_console_edits_lines_and_survives_bad_input() {
    let mut c = Console::boot(NO_HCA, DEADLINE);
    c.wait_for("lego> ");
    c.send("help\r");
    c.wait_for("poweroff");
    c.wait_for("lego> ");
    // Backspace: "lspcx<BS>i" is "lspci".
    c.send("lspcx\x7fi\r");
    c.wait_for("00:00.0 Host bridge");
    c.wait_for("lego> ");
    let long = "x".repeat(300);
    c.send(&format!("{long}\r"));
    c.wait_for("error: line too long (at most 256 characters); discarded");
    c.wait_for("lego> ");
    c.send("frobnicate\r");
    c.wait_for("frobnicate: command not found");
    c.wait_for("lego> ");
    // Ctrl-U kills the line, Ctrl-C cancels it.
    c.send("poweroff\x15uptime\r");
    c.wait_for("since kernel entry");
    c.send("poweroff\x03");
    c.wait_for("^C");
    // History: up-arrow recalls the last command (uptime).
    c.send("\x1b[A\r");
    c.wait_for("since kernel entry");
    c.send("poweroff\r");
    c.wait_for("Power down.");
    assert_eq!(c.wait_exit(), 0);
}

#[test]
fn typeahead_reaches_the_next_prompt_and_ctrl_c_still_interrupts() {
    let mut c = Console::boot(NO_HCA, DEADLINE);
    c.wait_for("lego> ");
    // `retry` looks for Ctrl-C while it waits: what is typed meanwhile is
    // kept for the next prompt, not swallowed.
    c.send("retry -n 3 -i 1 sleep x\r");
    c.wait_for("retry: sleep failed (1 of 3); again in 1 s");
    c.send("uptime\r");
    c.wait_for("retry: sleep failed 3 times");
    c.wait_for("lego> uptime");
    c.wait_for("since kernel entry");
    c.wait_for("lego> ");
    // Ctrl-C still interrupts, and discards what was typed before it (a
    // tty flushes its input on SIGINT).
    c.send("retry -n 5 -i 2 sleep x\r");
    c.wait_for("retry: sleep failed (1 of 5); again in 2 s");
    c.send("uptime\r\x03");
    c.wait_for("retry: interrupted after 1 failed tries of sleep");
    c.send("poweroff\r");
    let rest = c.wait_for("Power down.");
    assert!(!rest.contains("since kernel entry"), "{rest}");
    assert_eq!(c.wait_exit(), 0);
}

#[test]
fn grub_iso_boots_to_the_same_console() {
    let r = qemu::run("meminfo", &["--no-hca", "--iso"], DEADLINE);
    assert_eq!(r.status, 0, "{}", r.transcript);
    r.expect("booted by Multiboot2 (GRUB")
        .expect("Memory map (Multiboot2):")
        .expect("] usable")
        .expect("run: all commands succeeded");
}

#[test]
fn vfio_dry_run_prints_the_passthrough_command_line() {
    let out = qemu::script(&["--dry-run", "--vfio", "0000:04:00.0"]);
    assert_eq!(out.status, 0);
    let line = out.transcript;
    assert!(
        line.contains("-device vfio-pci,host=0000:04:00.0"),
        "{line}"
    );
    assert!(line.contains("-machine q35"), "{line}");
    assert!(line.contains("-accel kvm"), "passthrough needs KVM: {line}");
    let bad = qemu::script(&["--dry-run", "--vfio", "04:00"]);
    assert_eq!(bad.status, 2);
}
