//! End-to-end: the real image drives the emulated ConnectX-3.
//!
//! End-to-end: the real image drives the emulated ConnectX-3 (`cx3-emu` over
//! ivshmem and shared guest RAM) under QEMU, through the same mlx4_core code
//! path a real card takes.

use std::time::Duration;
use tests::qemu::{self, Console};

/// A run takes seconds; the deadline only bounds a hang.
const DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn one_guest_brings_the_hca_up_and_ibv_devinfo_shows_it() {
    // No subnet manager (`--sm none`): the ports stay in INIT (below).
    let r = qemu::run(
        "lspci; ibv_devices; ibv_devinfo; ibstat",
        &["--sm", "none"],
        DEADLINE,
    );
    assert_eq!(r.status, 0, "{}", r.transcript);
    r.expect("ivshmem: emulated HCA 15b3:1003, node 0 of 1")
        .expect("mlx4_core 00:03.0: ConnectX-3 ready: fw_ver 2.42.5000")
        .expect("mlx4_0: mlx4_core ready in")
        .expect("mlx4_0: registered with ib_core in")
        // ibv_devices, as rdma-core prints it
        .expect("    device          \t   node GUID")
        .expect("    ------          \t----------------")
        .expect("    mlx4_0          \t0002c903")
        .expect("00:03.0 Network controller: Mellanox Technologies MT27500 Family [ConnectX-3]")
        // ibv_devinfo, field by field as rdma-core prints them
        .expect("hca_id:\tmlx4_0")
        .expect("\ttransport:\t\t\tInfiniBand (0)")
        .expect("\tfw_ver:\t\t\t\t2.42.5000")
        .expect("\tvendor_id:\t\t\t0x02c9")
        .expect("\tvendor_part_id:\t\t\t4099")
        .expect("\tphys_port_cnt:\t\t\t2")
        .expect("\t\tport:\t1")
        .expect("\t\tport:\t2")
        .expect("\t\t\tmax_mtu:\t\t4096 (5)")
        .expect("\t\t\tlink_layer:\t\tInfiniBand")
        // ibstat
        .expect("CA 'mlx4_0'")
        .expect("\tCA type: MT4099")
        .expect("\tFirmware version: 2.42.5000")
        .expect("\t\tLink layer: InfiniBand")
        .reject("DMA fault")
        .reject("violation");
    // mlx4_ib's QP0 reaching RTR issued INIT_PORT: the links are up, and
    // without a subnet manager the ports stay in INIT.
    r.expect("\t\t\tstate:\t\t\tPORT_INIT (2)")
        .expect("\t\tState: Initializing");
    // node_guid and the port GUID are printed in their tools' formats.
    let guid = line_after(&r.transcript, "\tnode_guid:\t\t\t");
    assert_eq!(guid.len(), 19, "node_guid {guid:?}");
    assert_eq!(guid.matches(':').count(), 3, "node_guid {guid:?}");
}

#[test]
fn verbose_devinfo_caps_dump_and_fwtrace() {
    let r = qemu::run(
        "ibv_devinfo -v; mlx4 caps; mlx4 catas; fwtrace on; ibstat mlx4_0; fwtrace off; ibstat nosuch",
        &[],
        DEADLINE,
    );
    assert_eq!(r.status, 1, "`ibstat nosuch` must fail:\n{}", r.transcript);
    r.expect("\tmax_qp:\t\t\t\t")
        .expect("\t\t\tport_cap_flags:\t\t0x")
        .expect("QUERY_DEV_CAP")
        .expect("internal error buffer at BAR0 + ")
        .expect(", 16 dwords: clear")
        .expect("fwtrace: every firmware command is logged")
        // With fwtrace on, each MAD_IFC behind ibstat is logged.
        .expect("mlx4_core::cmd: mlx4_core 00:03.0: cmd MAD_IFC (0x24)")
        .expect("ibstat: CA 'nosuch' not found");
}

#[test]
fn a_failing_run_fw_is_reported_and_the_shell_carries_on() {
    let r = qemu::run(
        "uptime; ibv_devinfo",
        &["--emu-args", "--fail RUN_FW"],
        DEADLINE,
    );
    assert_eq!(
        r.status, 1,
        "ibv_devinfo must fail without an HCA:\n{}",
        r.transcript
    );
    r.expect("bring-up failed: command RUN_FW (0xff6) failed: fw status = ")
        .expect("the shell carries on without it")
        .expect("since kernel entry")
        .expect("ibv_devinfo: no HCA");
}

#[test]
fn a_catastrophic_error_raised_by_the_emulator_is_reported() {
    let r = qemu::run(
        "sleep 3; mlx4 catas",
        &["--emu-args", "--catas-after 0.5"],
        DEADLINE,
    );
    assert_eq!(r.status, 0, "{}", r.transcript);
    r.expect("Internal error detected")
        .expect("mlx4_0: catastrophic error: the HCA needs a reset")
        .expect("ERROR reported");
}

#[test]
fn two_guests_on_one_emulator_come_up_with_distinct_guids() {
    let r = qemu::run("ibv_devinfo", &["--nodes", "2"], DEADLINE);
    assert_eq!(r.status, 0, "{}", r.transcript);
    r.expect("===== node 0 (exit 0) =====")
        .expect("===== node 1 (exit 0) =====")
        .expect("node 0 of 2")
        .expect("node 1 of 2");
    let guids: Vec<&str> = r
        .transcript
        .lines()
        .filter_map(|l| l.strip_prefix("\tnode_guid:\t\t\t"))
        .collect();
    assert_eq!(guids.len(), 2, "{}", r.transcript);
    assert_ne!(
        guids[0], guids[1],
        "both nodes report node_guid {}",
        guids[0]
    );
}

#[test]
fn interactive_boot_with_the_hca_and_nothing_left_behind() {
    let mut c = Console::boot(&[], DEADLINE);
    c.wait_for("mlx4_0: mlx4_core ready in");
    c.wait_for("lego> ");
    let run = c.pid();
    let emu: Vec<u32> = qemu::children(run)
        .into_iter()
        .filter(|(_, name)| name == "cx3-emu")
        .map(|(pid, _)| pid)
        .collect();
    assert_eq!(emu.len(), 1, "one cx3-emu serves the guest");
    c.send("ibstat\r");
    c.wait_for("CA 'mlx4_0'");
    c.wait_for("lego> ");
    // Ctrl-C ends every tool that waits, and the shell carries on.
    c.send("ib_write_bw\r");
    c.wait_for("Waiting for client to connect... (LID");
    c.send("\x03");
    c.wait_for("ib_write_bw: interrupted while waiting for");
    c.wait_for("lego> ");
    c.send("ibv_rc_pingpong\r");
    c.wait_for("Ctrl-C stops)");
    c.send("\x03");
    c.wait_for("ibv_rc_pingpong: interrupted while waiting for");
    c.wait_for("lego> ");
    c.send("rmem serve 1M\r");
    c.wait_for("rmem: serving 1024 KiB at");
    c.send("\x03");
    c.wait_for("rmem: 0 clients served");
    c.wait_for("lego> ");
    c.send("retry -n 100 lspci -x\r");
    c.wait_for("retry: lspci failed (1 of 100); again in 1 s");
    c.send("\x03");
    c.wait_for("retry: interrupted after");
    c.wait_for("lego> ");
    c.send("poweroff\r");
    c.wait_for("Power down.");
    assert_eq!(c.wait_exit(), 0);
    // run-qemu.sh ended the emulator and removed the shared files.
    assert!(
        !std::path::Path::new(&format!("/proc/{}", emu[0])).exists(),
        "cx3-emu {} left running",
        emu[0]
    );
    // run-qemu.sh puts them in /dev/shm, or under target/shm when that is small.
    let leftovers: Vec<String> = [
        std::path::PathBuf::from("/dev/shm"),
        qemu::root().join("target/shm"),
    ]
    .iter()
    .filter_map(|d| std::fs::read_dir(d).ok())
    .flat_map(|d| {
        d.filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
    })
    .collect();
    let prefix = format!("cx3-{run}-");
    assert!(
        !leftovers.iter().any(|f| f.starts_with(&prefix)),
        "shared files left: {leftovers:?}"
    );
}

fn line_after<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{text}"))
}

#[test]
fn an_emulator_that_fails_to_start_stops_the_run_before_any_guest_boots() {
    let r = qemu::run("uptime", &["--emu-args", "--bogus"], DEADLINE);
    assert_eq!(
        r.status, 1,
        "stderr:\n{}\nconsole:\n{}",
        r.stderr, r.transcript
    );
    assert_eq!(r.transcript, "", "no guest may boot without its emulator");
    // cx3-emu's own message, then the script's verdict.
    assert!(r.stderr.contains("cx3-emu: "), "{}", r.stderr);
    assert!(r.stderr.contains("--bogus"), "{}", r.stderr);
    assert!(
        r.stderr.contains(
            "run-qemu.sh: cx3-emu exited (status 2) before serving the guests; not booting without the emulated HCA"
        ),
        "{}",
        r.stderr
    );
}

#[test]
fn an_ivshmem_window_without_an_emulator_is_one_log_line() {
    // An ivshmem window of the emulator's size that nobody serves.
    let r = qemu::run(
        "uptime",
        &[
            "--no-hca",
            "--",
            "-object",
            "memory-backend-memfd,id=lonely,size=16M,share=on",
            "-device",
            "ivshmem-plain,memdev=lonely",
        ],
        DEADLINE,
    );
    assert_eq!(r.status, 0, "{}", r.transcript);
    let lines: Vec<&str> = r
        .transcript
        .lines()
        .filter(|l| l.contains("ivshmem") || l.contains("cx3-emu"))
        .collect();
    assert_eq!(lines.len(), 1, "one line about the window: {lines:#?}");
    assert!(
        lines[0].contains("cx3-emu: no emulator answers in the ivshmem window at 0x")
            && lines[0].ends_with(" after 5 s; is cx3-emu running?"),
        "{}",
        lines[0]
    );
    r.expect("since kernel entry");
}

#[test]
fn a_console_wait_ends_at_the_first_bring_up_failure() {
    // The failure is on the console within seconds of boot; the wait must
    // end there, not at the session deadline.
    let mut c = Console::boot(&["--emu-args", "--fail RUN_FW"], DEADLINE);
    match c.try_wait_for("mlx4_0: mlx4_core ready in") {
        Ok(s) => panic!("bring-up succeeded with a failing RUN_FW:\n{s}"),
        Err(e) => assert!(
            e.starts_with("stopped waiting for \"mlx4_0: mlx4_core ready in\": the guest printed ")
                && e.contains("bring-up failed: command RUN_FW"),
            "{e}"
        ),
    }
    c.send("poweroff\r");
    c.wait_for("Power down.");
    assert_eq!(c.wait_exit(), 0);
}
