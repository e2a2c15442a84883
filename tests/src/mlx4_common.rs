//! Shared helpers of the mlx4 model-backed tests.
//!
//! The [`Model`] fixture (harness invariants checked when a test's model goes away,
//! and a watchdog), bring-up against `sim`, a capturing logger, the Linux command
//! order.
//!
//! Every model-backed test builds its model through [`Model`] (or
//! [`sync_hca`]), never with `SimHca::new*` directly (`mlx4_harness.rs`
//! checks the sources). When the fixture is dropped (or [`Model::finish`]ed)
//! it asserts, from probe through teardown:
//!
//! * no protocol violation and no DMA fault was recorded by the model,
//!   except those the test announced with [`Model::expect_violation`] /
//!   [`Model::expect_dma_fault`] (each of which must then have happened);
//! * the firmware is no longer running (the driver was torn down);
//! * no ICM page is mapped in the model;
//! * the DMA pool is back where it was when the model was built.
//!
//! A watchdog watches every live fixture: a test that keeps its model longer
//! than [`WATCHDOG_DEFAULT`] (environment `MLX4_WATCHDOG_SECS` overrides it)
//! is taken for a hang (a poll loop without a deadline): the watchdog prints
//! which test, which firmware command was posted last and how long ago, and
//! ends the test process with status 101, so the suite fails instead of
//! never ending (a hung Rust thread cannot be killed otherwise).

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use mlx4_core::{Dev, Profile, Result};
use sim::hca::trace::TraceEntry;
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

/// How long a test may keep one model before the watchdog calls it a hang.
/// A test keeps one model a few seconds in a debug build (the longest, the
/// threaded lifecycle, about 4 s on a shared 2-core machine; the fault
/// matrices take 30 s over dozens of models, each timed on its own), so
/// this is generous; a hang is reported within three minutes, not never.
pub const WATCHDOG_DEFAULT: Duration = Duration::from_secs(180);

fn watchdog_limit() -> Duration {
    std::env::var("MLX4_WATCHDOG_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(WATCHDOG_DEFAULT, Duration::from_secs_f64)
}

/// A model-backed test's HCA model with the harness invariants (see the
/// module doc). Dereferences to [`SimHca`]; declare it before the `Dev`
/// brought up on it, so that the device is torn down (or dropped) first.
pub struct Model {
    hca: SimHca,
    id: u64,
    label: String,
    dma0: hal::DmaStats,
    expected: Mutex<Expected>,
    checked: bool,
}

#[derive(Default)]
struct Expected {
    violations: Vec<String>,
    dma_faults: Vec<String>,
    /// Why the firmware may be left running with ICM mapped.
    left_behind: Option<String>,
}

impl Deref for Model {
    type Target = SimHca;
    fn deref(&self) -> &SimHca {
        &self.hca
    }
}

impl Model {
    /// A synchronous model with `cfg`.
    #[track_caller]
    pub fn new(cfg: SimConfig) -> Model {
        Model::wrap(SimHca::new(cfg), "sync")
    }

    /// A synchronous model with the default configuration.
    #[track_caller]
    pub fn sync() -> Model {
        Model::new(SimConfig::default())
    }

    /// A threaded model with `cfg`.
    #[track_caller]
    pub fn threaded_with(cfg: SimConfig) -> Model {
        Model::wrap(SimHca::new_threaded(cfg), "threaded")
    }

    /// A threaded model with the default configuration.
    #[track_caller]
    pub fn threaded() -> Model {
        Model::threaded_with(SimConfig::default())
    }

    /// A synchronous model on `wire` whose ports 1 and 2 are the fabric
    /// ports `ports` (a topology's `Built::hcas[i].ports`).
    #[track_caller]
    pub fn on_ports(
        cfg: SimConfig,
        wire: &sim::Wire,
        ports: [Option<sim::fabric::PortId>; 2],
    ) -> Model {
        Model::wrap(SimHca::new_on_ports(cfg, wire, ports), "on a fabric")
    }

    /// Wraps a model built on a fabric wire (`SimHca::back_to_back`,
    /// `SimHca::new_on_ports`), which the constructors above cannot build.
    #[track_caller]
    pub fn wrap(hca: SimHca, mode: &str) -> Model {
        init_logger();
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let at = std::panic::Location::caller();
        let test = std::thread::current()
            .name()
            .unwrap_or("<unnamed thread>")
            .to_string();
        let label = format!(
            "test {test} ({mode} model built at {}:{})",
            at.file(),
            at.line()
        );
        watchdog().watch(id, &label, &hca, watchdog_limit());
        Model {
            dma0: hca.dma_pool().stats(),
            hca,
            id,
            label,
            expected: Mutex::new(Expected::default()),
            checked: false,
        }
    }

    /// This test provokes protocol violations on purpose: violations whose
    /// text contains `substr` are allowed, and at least one must be
    /// recorded by the end of the test.
    pub fn expect_violation(&self, substr: &str) -> &Self {
        self.expected_lock().violations.push(substr.to_string());
        self
    }

    /// Like [`Model::expect_violation`] for DMA faults (matched against
    /// their `Display` text).
    pub fn expect_dma_fault(&self, substr: &str) -> &Self {
        self.expected_lock().dma_faults.push(substr.to_string());
        self
    }

    /// This test leaves the device in a state no teardown can undo (a
    /// command that never completes keeps the HCR busy; after a
    /// catastrophic error every command fails until the next reset): the
    /// firmware may still run and ICM may stay mapped in the model when it
    /// goes away. Violations, DMA faults and the DMA pool are still checked.
    pub fn expect_firmware_left_behind(&self, why: &str) -> &Self {
        self.expected_lock().left_behind = Some(why.to_string());
        self
    }

    /// A different watchdog limit for this model (long stress tests).
    pub fn watchdog(&self, limit: Duration) -> &Self {
        watchdog().set_limit(self.id, limit);
        self
    }

    fn expected_lock(&self) -> std::sync::MutexGuard<'_, Expected> {
        self.expected.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The invariants, as a list of failures (empty: all hold).
    pub fn invariant_failures(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let exp = self.expected_lock();
        let violations = self.hca.violations();
        let dma_faults: Vec<String> = self
            .hca
            .dma_faults()
            .iter()
            .map(ToString::to_string)
            .collect();
        for (what, seen, allowed) in [
            ("protocol violation", &violations, &exp.violations),
            ("DMA fault", &dma_faults, &exp.dma_faults),
        ] {
            let unexpected: Vec<&String> = seen
                .iter()
                .filter(|v| !allowed.iter().any(|a| v.contains(a.as_str())))
                .collect();
            if !unexpected.is_empty() {
                bad.push(format!(
                    "{} unexpected {what}(s) recorded by the model between probe and teardown: {unexpected:#?}",
                    unexpected.len()
                ));
            }
            for a in allowed {
                if !seen.iter().any(|v| v.contains(a.as_str())) {
                    bad.push(format!(
                        "the test expected a {what} containing {a:?}, the model recorded none (seen: {seen:#?})"
                    ));
                }
            }
        }
        let left_ok = exp.left_behind.is_some();
        if self.hca.is_running() && !left_ok {
            bad.push(
                "the firmware is still running: the device was not torn down before its model went away"
                    .to_string(),
            );
        }
        let pages = self.hca.icm_mapped_pages();
        if pages != 0 && !left_ok {
            bad.push(format!(
                "{pages} ICM page(s) still mapped in the model after teardown (a table freed its host memory without UNMAP_ICM, or was never cleaned up)"
            ));
        }
        let dma = self.hca.dma_pool().stats();
        if dma != self.dma0 {
            bad.push(format!(
                "DMA pool not back to its baseline after teardown: {} allocation(s) / {} bytes live, {} / {} when the model was built",
                dma.allocations, dma.bytes, self.dma0.allocations, self.dma0.bytes
            ));
        }
        bad
    }

    /// Checks the invariants now and consumes the fixture (the same checks
    /// run on drop).
    pub fn finish(mut self) {
        self.check();
    }

    fn check(&mut self) {
        if self.checked {
            return;
        }
        self.checked = true;
        watchdog().unwatch(self.id);
        let bad = self.invariant_failures();
        if !bad.is_empty() {
            panic!(
                "harness invariants broken in {}:\n- {}",
                self.label,
                bad.join("\n- ")
            );
        }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The test already failed; a second panic would abort.
            watchdog().unwatch(self.id);
            return;
        }
        self.check();
    }
}

/// A synchronous model with the default configuration.
#[track_caller]
pub fn sync_hca() -> Model {
    Model::sync()
}

/// Probes the driver on `hca`.
pub fn bring_up(hca: &SimHca, profile: Profile) -> Result<Dev> {
    init_logger();
    mlx4_core::probe(hca.pci_function(), hca.dma_pool(), hca.clock(), profile)
}

// --- the watchdog -------------------------------------------------------

struct Watched {
    label: String,
    hca: SimHca,
    since: Instant,
    limit: Duration,
    /// Trace length at the last sample, the last entry then, and when the
    /// length last changed (wall clock).
    trace_len: usize,
    last: Option<TraceEntry>,
    changed: Instant,
    sampled: bool,
}

struct Watchdog {
    live: Mutex<BTreeMap<u64, Watched>>,
}

fn watchdog() -> &'static Watchdog {
    static W: OnceLock<&'static Watchdog> = OnceLock::new();
    W.get_or_init(|| {
        let w: &'static Watchdog = Box::leak(Box::new(Watchdog {
            live: Mutex::new(BTreeMap::new()),
        }));
        // The sampler reads each model's trace (it may block on a model's
        // lock; the enforcer never touches a model, so it cannot).
        let _ = std::thread::Builder::new()
            .name("mlx4-watchdog-sampler".into())
            .spawn(move || {
                loop {
                    w.sample();
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
        let _ = std::thread::Builder::new()
            .name("mlx4-watchdog".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_millis(200));
                    if let Some(report) = w.expired() {
                        // Straight to stderr: the test harness captures
                        // `eprintln!` of threads spawned by a test.
                        let mut e = std::io::stderr().lock();
                        let _ = e.write_all(report.as_bytes());
                        let _ = e.flush();
                        std::process::exit(101);
                    }
                }
            });
        w
    })
}

impl Watchdog {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Watched>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn watch(&self, id: u64, label: &str, hca: &SimHca, limit: Duration) {
        let now = Instant::now();
        self.lock().insert(
            id,
            Watched {
                label: label.to_string(),
                hca: hca.clone(),
                since: now,
                limit,
                trace_len: 0,
                last: None,
                changed: now,
                sampled: false,
            },
        );
    }

    fn unwatch(&self, id: u64) {
        let w = self.lock().remove(&id);
        drop(w);
    }

    fn set_limit(&self, id: u64, limit: Duration) {
        if let Some(w) = self.lock().get_mut(&id) {
            w.limit = limit;
        }
    }

    fn sample(&self) {
        let models: Vec<(u64, SimHca)> = self
            .lock()
            .iter()
            .map(|(&id, w)| (id, w.hca.clone()))
            .collect();
        for (id, hca) in models {
            let len = hca.trace_len();
            let last = if len > 0 {
                hca.trace_since(len - 1).pop()
            } else {
                None
            };
            if let Some(w) = self.lock().get_mut(&id) {
                if !w.sampled || len != w.trace_len || last != w.last {
                    w.changed = Instant::now();
                }
                w.sampled = true;
                w.trace_len = len;
                w.last = last;
            }
        }
    }

    fn expired(&self) -> Option<String> {
        let live = self.lock();
        let (_, w) = live.iter().find(|(_, w)| w.since.elapsed() >= w.limit)?;
        let mut r = format!(
            "\nmlx4 test watchdog: {} still holds its model after {:.1} s (limit {} s; set MLX4_WATCHDOG_SECS to change it): a poll loop without a deadline?\n",
            w.label,
            w.since.elapsed().as_secs_f64(),
            w.limit.as_secs_f64()
        );
        match (&w.last, w.sampled) {
            (Some(e), _) => {
                let model_now = w.hca.clock().now_ns();
                let ago = Duration::from_nanos(model_now.saturating_sub(e.at.as_nanos() as u64));
                r += &format!(
                    "  last firmware command posted: {e}\n  posted {:.3} s ago on the model clock, the trace last changed {:.1} s ago (wall clock); {} command(s) in the trace\n",
                    ago.as_secs_f64(),
                    w.changed.elapsed().as_secs_f64(),
                    w.trace_len
                );
            }
            (None, true) => r += "  no firmware command was posted to this model\n",
            (None, false) => {
                r += "  the model's trace could not be read (its lock is held: the hang may be inside the model)\n"
            }
        }
        r += "  ending the test process (status 101)\n";
        Some(r)
    }
}

// --- command orders -------------------------------------------------------

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
