//! Shared helpers for the integration tests.
//!
//! Building the kernel image once, booting it under QEMU with a deadline through
//! `run-qemu.sh`, and driving its serial console; an SM's PortInfo Sets through the
//! model's SMA (`sm`); the fixtures of the model-backed tests (`mlx4_common`, `subnet_common`,
//! `ip_node`: guests with IPoIB, the IP stack and the RDMA CM under OpenSM).

pub mod eth_node;
pub mod ip_node;
pub mod mlx4_common;
pub mod qemu;
pub mod sm;
pub mod subnet_common;

/// Cargo's scratch directory for integration tests (`target/tmp`, what
/// `CARGO_TARGET_TMPDIR` names inside a test binary), found from the running
/// test executable (`target/<profile>/deps/<test>`), so a helper of this
/// library, built without that variable, puts its files where the tests do.
pub fn target_tmpdir() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    match exe.ancestors().nth(3) {
        Some(target) if !target.as_os_str().is_empty() => target.join("tmp"),
        _ => std::env::temp_dir(),
    }
}

/// The host's load average (the first three fields of `/proc/loadavg`), to
/// print beside a test's timings; empty where it cannot be read.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
