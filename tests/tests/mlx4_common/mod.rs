//! Shared helpers of the mlx4 model-backed tests: bring-up against `sim`, a capturing logger, the Linux command order.
#![allow(dead_code)]

use std::sync::{Mutex, Once};

use mlx4_core::{Dev, Profile, Result};
use sim::{SimConfig, SimHca};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
static INIT: Once = Once::new();

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, r: &log::Record) {
        let line = format!("{:<5} {}", r.level(), r.args());
        if std::env::var_os("MLX4_LOG").is_some() {
            eprintln!("{line}");
        }
        if let Ok(mut l) = LINES.lock()
            && l.len() < 200_000
        {
            l.push(line);
        }
    }
    fn flush(&self) {}
}

/// Installs the capturing logger (debug level) once per test binary.
pub fn init_logger() {
    INIT.call_once(|| {
        let _ = log::set_logger(&Capture);
        log::set_max_level(log::LevelFilter::Debug);
    });
}

/// Captured log lines containing `pat`.
pub fn log_lines(pat: &str) -> Vec<String> {
    LINES
        .lock()
        .map(|l| l.iter().filter(|s| s.contains(pat)).cloned().collect())
        .unwrap_or_default()
}

/// A synchronous model with the default configuration.
pub fn sync_hca() -> SimHca {
    SimHca::new(SimConfig::default())
}

/// Probes the driver on `hca`.
pub fn bring_up(hca: &SimHca, profile: Profile) -> Result<Dev> {
    init_logger();
    mlx4_core::probe(hca.pci_function(), hca.dma_pool(), hca.clock(), profile)
}

/// Command names of the trace with consecutive repeats collapsed.
pub fn collapsed(hca: &SimHca) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for e in hca.trace() {
        if v.last().map(String::as_str) != Some(e.name) {
            v.push(e.name.to_string());
        }
    }
    v
}

/// Linux's load sequence (`__mlx4_init_one` in polling mode, porting map
/// 2.2) for a two-port IB HCA, repeats collapsed; QUERY_HCA only when the
/// device reports CQ timestamps.
pub fn linux_order(timestamp: bool, ports: u8) -> Vec<String> {
    let mut v = vec![
        "QUERY_FW",
        "MAP_FA",
        "RUN_FW",
        "MOD_STAT_CFG",
        "QUERY_DEV_CAP",
        "QUERY_PORT",
        "SET_ICM_SIZE",
        "MAP_ICM_AUX",
        "MAP_ICM",
        "INIT_HCA",
    ];
    if timestamp {
        v.push("QUERY_HCA");
    }
    v.extend([
        "QUERY_ADAPTER",
        "SW2HW_EQ",
        "MAP_EQ",
        "NOP",
        "CONF_SPECIAL_QP",
    ]);
    for _ in 0..ports {
        v.extend(["MAD_IFC", "SET_PORT"]);
    }
    v.into_iter().map(String::from).collect()
}
