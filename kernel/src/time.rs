//! Time: the TSC, calibrated once against PIT channel 2, behind `hal::Clock`.
//!
//! Leaves out: HPET, TSC deadline timers, per-CPU TSC offsets (one CPU).

use core::sync::atomic::{AtomicU64, Ordering};

use crate::arch::port::{inb, outb};
use crate::arch::rdtsc;

static TSC_HZ: AtomicU64 = AtomicU64::new(0);
static BOOT_TSC: AtomicU64 = AtomicU64::new(0);

const PIT_HZ: u64 = 1_193_182;
const CALIBRATION_MS: u64 = 10;
const ROUNDS: usize = 9;

/// Measures the TSC frequency against PIT one-shots; `entry_tsc` is the TSC
/// at kernel entry, the zero of `uptime`.
pub fn init(entry_tsc: u64) {
    BOOT_TSC.store(entry_tsc, Ordering::Relaxed);
    let hz = calibrate().unwrap_or_else(|| {
        log::warn!("PIT calibration failed; assuming a 2 GHz TSC");
        2_000_000_000
    });
    TSC_HZ.store(hz, Ordering::Relaxed);
}

/// The lowest reading of [`ROUNDS`] one-shots of [`CALIBRATION_MS`]. One one-shot is
/// not enough under an emulator on a loaded host: a vCPU descheduled inside
/// a round (after reading the TSC, or before it sees terminal count) reads
/// the TSC as too fast (10.7 GHz was seen for about 3), which stretches
/// every `sleep` and deadline by as much. A disturbance only ever lengthens
/// a round (the PIT keeps counting host time while the vCPU waits), so the
/// smallest reading is the least disturbed; the median was not enough at
/// load 25 on 2 cores (5.5 GHz read for 2.45: a 150 s `rmem serve` lasted
/// 340 s).
fn calibrate() -> Option<u64> {
    (0..ROUNDS).filter_map(|_| one_shot()).min()
}

fn one_shot() -> Option<u64> {
    let latch = PIT_HZ * CALIBRATION_MS / 1000;
    // Gate channel 2 on, speaker off; mode 0 (interrupt on terminal count).
    outb(0x61, (inb(0x61) & !0x02) | 0x01);
    outb(0x43, 0xb0);
    outb(0x42, latch as u8);
    let t0 = rdtsc();
    // Counting starts with the high byte.
    outb(0x42, (latch >> 8) as u8);
    // OUT2 (bit 5 of port 0x61) goes high at terminal count. Bounded by an
    // iteration count: there is no other clock yet.
    let mut done = false;
    for _ in 0..50_000_000u64 {
        if inb(0x61) & 0x20 != 0 {
            done = true;
            break;
        }
    }
    let t1 = rdtsc();
    (done && t1 > t0).then(|| (t1 - t0) * 1000 / CALIBRATION_MS)
}

/// TSC frequency in Hz (0 before calibration).
pub fn tsc_hz() -> u64 {
    TSC_HZ.load(Ordering::Relaxed)
}

/// Converts a TSC delta to nanoseconds.
pub fn tsc_to_ns(ticks: u64) -> u64 {
    let hz = tsc_hz();
    if hz == 0 {
        return 0;
    }
    (u128::from(ticks) * 1_000_000_000 / u128::from(hz)) as u64
}

/// Microseconds since kernel entry (0 before calibration).
pub fn uptime_us() -> u64 {
    tsc_to_ns(rdtsc().saturating_sub(BOOT_TSC.load(Ordering::Relaxed))) / 1000
}

/// The TSC as a `hal::Clock`.
pub struct TscClock;

impl hal::Clock for TscClock {
    fn now_ns(&self) -> u64 {
        tsc_to_ns(rdtsc())
    }
}
