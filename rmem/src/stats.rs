//! Statistics of an rmem client.
//!
//! Statistics of a client: operations, bytes, retries, errors and a latency
//! histogram (log2 buckets of nanoseconds, plus exact min/median/99%/99.9%
//! from a bounded sample); leaves out per-chunk and per-peer breakdowns.
//!
//! Recording allocates nothing (the sample is a fixed ring allocated when
//! the statistics are made); percentiles are computed when asked, on a copy.

use alloc::vec;
use alloc::vec::Vec;

/// Log2 buckets: bucket `i` counts latencies in `[2^i, 2^(i+1))` ns (bucket 0
/// also holds 0 ns).
pub const BUCKETS: usize = 40;

/// Latencies kept for the exact percentiles (the most recent ones).
pub const DEFAULT_SAMPLE: usize = 1 << 16;

/// What a client counted.
#[derive(Debug, Clone)]
pub struct Stats {
    /// RDMA READs completed successfully.
    pub reads: u64,
    /// RDMA WRITEs completed successfully.
    pub writes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// RPCs (hello/alloc/free) answered.
    pub rpcs: u64,
    /// Connection attempts made again by [`crate::Client::connect`] before
    /// it connected (the memory node not reachable through the SA yet, not
    /// listening yet, or its CM silent). Transport retransmissions are the
    /// card's own and invisible to software; their exhaustion is an error
    /// ("memory node unreachable").
    pub retries: u64,
    /// Operations that ended in an error.
    pub errors: u64,
    /// Latency histogram (log2 ns).
    pub hist: [u64; BUCKETS],
    sample: Vec<u64>,
    next: usize,
    filled: usize,
    min: u64,
    max: u64,
}

/// Percentiles of the sample, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Percentiles {
    /// Operations the sample holds.
    pub count: usize,
    /// Smallest latency seen (over all operations, not only the sample).
    pub min: u64,
    /// Median of the sample.
    pub median: u64,
    /// 99th percentile of the sample.
    pub p99: u64,
    /// 99.9th percentile of the sample.
    pub p999: u64,
    /// Largest latency seen.
    pub max: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new(DEFAULT_SAMPLE)
    }
}

impl Stats {
    /// Statistics keeping the `sample` latest latencies (at least 1).
    pub fn new(sample: usize) -> Stats {
        Stats {
            reads: 0,
            writes: 0,
            bytes_read: 0,
            bytes_written: 0,
            rpcs: 0,
            retries: 0,
            errors: 0,
            hist: [0; BUCKETS],
            sample: vec![0; sample.max(1)],
            next: 0,
            filled: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// The bucket of a latency.
    pub fn bucket(ns: u64) -> usize {
        let b = (63 - (ns | 1).leading_zeros()) as usize;
        b.min(BUCKETS - 1)
    }

    /// Records one operation's latency (allocates nothing).
    pub fn record(&mut self, ns: u64) {
        self.hist[Self::bucket(ns)] += 1;
        if let Some(s) = self.sample.get_mut(self.next) {
            *s = ns;
        }
        self.next = (self.next + 1) % self.sample.len();
        self.filled = (self.filled + 1).min(self.sample.len());
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    /// Forgets everything counted so far but the connection's `retries`.
    pub fn reset(&mut self) {
        let n = self.sample.len();
        let retries = self.retries;
        *self = Stats::new(n);
        self.retries = retries;
    }

    /// Exact percentiles over the sample (nearest rank); allocates a copy.
    pub fn percentiles(&self) -> Percentiles {
        if self.filled == 0 {
            return Percentiles::default();
        }
        let mut v: Vec<u64> = self.sample[..self.filled].to_vec();
        v.sort_unstable();
        let rank = |p_thousandths: usize| {
            // Nearest rank: ceil(p * n), 1-based.
            let r = (p_thousandths * v.len()).div_ceil(1000).max(1);
            v[r.min(v.len()) - 1]
        };
        Percentiles {
            count: v.len(),
            min: self.min,
            median: rank(500),
            p99: rank(990),
            p999: rank(999),
            max: self.max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2() {
        assert_eq!(Stats::bucket(0), 0);
        assert_eq!(Stats::bucket(1), 0);
        assert_eq!(Stats::bucket(2), 1);
        assert_eq!(Stats::bucket(1023), 9);
        assert_eq!(Stats::bucket(1024), 10);
        assert_eq!(Stats::bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_are_exact_nearest_rank() {
        let mut s = Stats::new(1000);
        for ns in (1..=1000).rev() {
            s.record(ns);
        }
        let p = s.percentiles();
        assert_eq!(
            p,
            Percentiles {
                count: 1000,
                min: 1,
                median: 500,
                p99: 990,
                p999: 999,
                max: 1000
            }
        );
        assert_eq!(s.hist.iter().sum::<u64>(), 1000);
        assert_eq!(s.hist[9], 489, "512..=1000");
    }

    #[test]
    fn sample_is_bounded_to_the_latest() {
        let mut s = Stats::new(4);
        for ns in [100, 100, 100, 100, 1, 2, 3, 4] {
            s.record(ns);
        }
        let p = s.percentiles();
        assert_eq!((p.count, p.median, p.max, p.min), (4, 2, 100, 1));
        assert_eq!(Stats::new(0).percentiles(), Percentiles::default());
    }

    #[test]
    fn reset_forgets_the_measurements_but_not_the_connect_retries() {
        let mut s = Stats::new(8);
        s.retries = 2;
        s.reads = 5;
        s.record(100);
        s.reset();
        assert_eq!((s.retries, s.reads, s.percentiles().count), (2, 0, 0));
        assert_eq!(s.hist.iter().sum::<u64>(), 0);
    }
}
