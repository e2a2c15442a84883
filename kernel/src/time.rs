//! Time: the TSC, calibrated once against PIT channel 2, behind `hal::Clock`.
//!
//! Leaves out: HPET, TSC deadline timers, per-CPU TSC offsets (one CPU).

use core::sync::atomic::{AtomicU64, Ordering};

use crate::arch::port::{inb, outb};
use crate::arch::rdtsc;

static TSC_HZ: AtomicU64 = AtomicU64::new(0);
static BOOT_TSC: AtomicU64 = AtomicU64::new(0);

const PIT_HZ: u64 = 1_193_182;
/// PIT ticks a round measures at least (about 20 ms).
const ROUND_TICKS: u16 = 24_000;
const ROUNDS: usize = 3;
/// The widest TSC bracket around one PIT read that counts as a sample:
/// 200 us even at 5 GHz, so at most 1 % of a round at the real rate.
const MAX_BRACKET: u64 = 1_000_000;
/// Reads a round may take before it gives up (there is no other clock).
const MAX_READS: u32 = 5_000_000;

/// Measures the TSC frequency against PIT channel 2; `entry_tsc` is the TSC
/// at kernel entry, the zero of `uptime`.
pub fn init(entry_tsc: u64) {
    BOOT_TSC.store(entry_tsc, Ordering::Relaxed);
    let hz = calibrate().unwrap_or_else(|| {
        log::warn!("PIT calibration failed; assuming a 2 GHz TSC");
        2_000_000_000
    });
    TSC_HZ.store(hz, Ordering::Relaxed);
}

/// The median of [`ROUNDS`] rounds. Each round reads the PIT's counter
/// itself, bracketed by two TSC reads, at its start and once at least
/// [`ROUND_TICKS`] have gone by; a read whose bracket is wide (the vCPU was
/// descheduled around it) is taken again. Waiting for terminal count and
/// reading the TSC afterwards instead reads the TSC as too fast whenever an
/// emulator on a loaded host deschedules the vCPU in between (10 GHz was
/// seen at a load of 26 on 2 cores, which stretches every `sleep` 4-fold).
fn calibrate() -> Option<u64> {
    let mut rounds = [0u64; ROUNDS];
    let mut n = 0;
    for r in rounds.iter_mut() {
        if let Some(hz) = round() {
            *r = hz;
            n += 1;
        }
    }
    if n == 0 {
        return None;
    }
    rounds.sort_unstable();
    // Failed rounds sort first as zeros: the median of those that worked.
    let ok = &rounds[ROUNDS - n..];
    Some(ok[ok.len() / 2])
}

/// One PIT count with the TSC at its middle, or None if the bracket was
/// too wide. The count is channel 2's, latched; OUT2 (bit 5 of port 0x61)
/// high means it passed terminal count.
fn sample() -> Option<(u64, u16, bool)> {
    let t0 = rdtsc();
    outb(0x43, 0x80); // latch channel 2
    let lo = inb(0x42);
    let hi = inb(0x42);
    let out2 = inb(0x61) & 0x20 != 0;
    let t1 = rdtsc();
    let w = t1.checked_sub(t0)?;
    (w <= MAX_BRACKET).then_some((t0 + w / 2, u16::from_le_bytes([lo, hi]), out2))
}

fn round() -> Option<u64> {
    // Gate channel 2 on, speaker off; mode 0 from 0xffff (55 ms to
    // terminal count: a round ends well before).
    outb(0x61, (inb(0x61) & !0x02) | 0x01);
    outb(0x43, 0xb0);
    outb(0x42, 0xff);
    outb(0x42, 0xff);
    let mut reads = 0;
    let mut next = || {
        while reads < MAX_READS {
            reads += 1;
            if let Some(s) = sample() {
                return Some(s);
            }
        }
        None
    };
    let (ta, ca, _) = next()?;
    loop {
        let (tb, cb, out2) = next()?;
        if out2 || cb > ca {
            return None; // past terminal count: the round took too long
        }
        let ticks = u64::from(ca - cb);
        if ticks >= u64::from(ROUND_TICKS) {
            return (tb > ta).then(|| (tb - ta) * PIT_HZ / ticks);
        }
    }
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
