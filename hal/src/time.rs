//! Time for pollers: a monotonic [`Clock`] and the [`Deadline`] every poll loop
//! takes.
//!
//! There are no interrupts in the driver path, so every wait is a poll, and
//! every poll has a deadline. The kernel's clock is the calibrated TSC; tests
//! use [`crate::fake::FakeClock`], which advances on [`Clock::relax`] so
//! deadline tests never sleep.

use core::time::Duration;

/// A monotonic clock.
pub trait Clock: Send + Sync {
    /// Nanoseconds since an arbitrary fixed point; never goes backwards.
    fn now_ns(&self) -> u64;

    /// Called by pollers between two polls of the same condition. The real
    /// clock issues a spin-loop hint; a fake clock may advance time.
    fn relax(&self) {
        core::hint::spin_loop();
    }

    /// Waits at least `d` (Linux `msleep`/`udelay`; always a busy wait here).
    fn delay(&self, d: Duration) {
        let end = Deadline::after(self, d);
        while !end.expired(self) {
            self.relax();
        }
    }
}

/// A point in time after which a poll gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    at_ns: u64,
}

impl Deadline {
    /// The deadline `d` from now on `clock`.
    pub fn after<C: Clock + ?Sized>(clock: &C, d: Duration) -> Self {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Deadline {
            at_ns: clock.now_ns().saturating_add(ns),
        }
    }

    /// True once the deadline has passed.
    pub fn expired<C: Clock + ?Sized>(&self, clock: &C) -> bool {
        clock.now_ns() >= self.at_ns
    }

    /// Time left, zero once expired.
    pub fn remaining<C: Clock + ?Sized>(&self, clock: &C) -> Duration {
        Duration::from_nanos(self.at_ns.saturating_sub(clock.now_ns()))
    }
}

/// Polls `f` until it returns `Some`, or until `timeout` has passed.
///
/// `f` is always called at least once, and once more after the deadline has
/// passed, so a condition that became true while the caller was descheduled is
/// not reported as a timeout.
pub fn poll_until<C, T>(
    clock: &C,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> crate::Result<T>
where
    C: Clock + ?Sized,
{
    let deadline = Deadline::after(clock, timeout);
    loop {
        let expired = deadline.expired(clock);
        if let Some(v) = f() {
            return Ok(v);
        }
        if expired {
            return Err(crate::Error::TimedOut);
        }
        clock.relax();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeClock;

    #[test]
    fn deadline_expires_on_a_fake_clock() {
        let clock = FakeClock::new();
        let d = Deadline::after(&clock, Duration::from_millis(10));
        assert!(!d.expired(&clock));
        assert_eq!(d.remaining(&clock), Duration::from_millis(10));
        clock.advance(Duration::from_millis(10));
        assert!(d.expired(&clock));
        assert_eq!(d.remaining(&clock), Duration::ZERO);
    }

    #[test]
    fn poll_until_times_out_without_sleeping() {
        let clock = FakeClock::with_relax_step(Duration::from_millis(1));
        let mut polls = 0;
        let r: crate::Result<()> = poll_until(&clock, Duration::from_secs(10), || {
            polls += 1;
            None
        });
        assert_eq!(r, Err(crate::Error::TimedOut));
        // 10 s in 1 ms steps: the loop ran ~10000 times and then stopped.
        assert!((10_000..=10_002).contains(&polls), "{polls}");
    }

    #[test]
    fn poll_until_returns_the_value() {
        let clock = FakeClock::with_relax_step(Duration::from_millis(1));
        let mut n = 0;
        let r = poll_until(&clock, Duration::from_secs(1), || {
            n += 1;
            (n == 5).then_some(n)
        });
        assert_eq!(r, Ok(5));
    }

    #[test]
    fn delay_waits_at_least_the_duration() {
        let clock = FakeClock::with_relax_step(Duration::from_micros(3));
        clock.delay(Duration::from_micros(100));
        assert!(clock.now_ns() >= 100_000);
    }
}
