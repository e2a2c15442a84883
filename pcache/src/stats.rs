//! What the cache counts, in the words of Linux's `vmstat` and LegoOS's
//! pcache counters, and the fault service time split into its parts, kept
//! as samples (in the caller's ticks: TSC cycles in the kernel) for exact
//! percentiles.

use alloc::vec::Vec;

/// A ring of the latest samples of one quantity.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    v: Vec<u32>,
    next: usize,
    cap: usize,
    /// Samples recorded (also those the ring has dropped).
    pub count: u64,
}

/// Median, 99th percentile and extremes of a [`Samples`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// Samples summarised (those kept).
    pub n: usize,
    /// Smallest.
    pub min: u64,
    /// Median.
    pub median: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

impl Samples {
    /// Room for the latest `cap` samples (allocated now: recording
    /// allocates nothing).
    pub fn new(cap: usize) -> Samples {
        Samples {
            v: Vec::with_capacity(cap),
            next: 0,
            cap,
            count: 0,
        }
    }

    /// Records one sample (saturated to `u32::MAX`).
    pub fn record(&mut self, x: u64) {
        let x = u32::try_from(x).unwrap_or(u32::MAX);
        self.count += 1;
        if self.cap == 0 {
            return;
        }
        if self.v.len() < self.cap {
            self.v.push(x);
        } else {
            self.v[self.next] = x;
            self.next = (self.next + 1) % self.cap;
        }
    }

    /// Forgets every sample.
    pub fn clear(&mut self) {
        self.v.clear();
        self.next = 0;
        self.count = 0;
    }

    /// The summary of the samples kept (sorts a copy: not for the fault
    /// path).
    pub fn summary(&self) -> Summary {
        let mut s = self.v.clone();
        s.sort_unstable();
        let n = s.len();
        if n == 0 {
            return Summary::default();
        }
        let at = |q: usize| u64::from(s[((n - 1) * q).div_ceil(100).min(n - 1)]);
        Summary {
            n,
            min: u64::from(s[0]),
            median: at(50),
            p99: at(99),
            max: u64::from(s[n - 1]),
        }
    }
}

/// The parts of a fault's service time.
#[derive(Debug, Clone, Default)]
pub struct Split {
    /// From the faulting access to the handler's first instruction (known
    /// only when the access was stamped: the latency probe does).
    pub trap: Samples,
    /// Finding the page in the cache (the handler's own start included).
    pub lookup: Samples,
    /// Choosing victims, unmapping them and writing dirty ones back.
    pub evict: Samples,
    /// The RDMA READ's round trip: post to completion (read-ahead's READs
    /// in flight with it).
    pub read: Samples,
    /// Writing the page table entry.
    pub map: Samples,
    /// From the handler's end back to the faulting code (stamped accesses
    /// only).
    pub ret: Samples,
    /// The handler's whole time, on faults that fetched a page.
    pub major: Samples,
    /// The handler's whole time, on hits and zero-filled pages.
    pub minor: Samples,
}

impl Split {
    /// Room for `cap` samples of each part.
    pub fn new(cap: usize) -> Split {
        Split {
            trap: Samples::new(cap),
            lookup: Samples::new(cap),
            evict: Samples::new(cap),
            read: Samples::new(cap),
            map: Samples::new(cap),
            ret: Samples::new(cap),
            major: Samples::new(cap),
            minor: Samples::new(cap),
        }
    }

    /// Forgets every sample.
    pub fn clear(&mut self) {
        for s in [
            &mut self.trap,
            &mut self.lookup,
            &mut self.evict,
            &mut self.read,
            &mut self.map,
            &mut self.ret,
            &mut self.major,
            &mut self.minor,
        ] {
            s.clear();
        }
    }
}

/// The counters of one region (`vmstat` words, LegoOS's in parentheses).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Faults taken (`pgfault`).
    pub pgfault: u64,
    /// Faults that fetched their page with an RDMA READ (`pgmajfault`;
    /// LegoOS `pcache_fill_remote`).
    pub pgmajfault: u64,
    /// Faults on a page already in the cache, read ahead and not yet
    /// mapped (LegoOS `pcache_hit`; a minor fault).
    pub hit: u64,
    /// Faults on a page never written to a memory node, filled with zeros
    /// without a READ (`pgalloc`/first touch).
    pub zero_fill: u64,
    /// Pages fetched from memory nodes, read-ahead included (`pswpin`).
    pub pswpin: u64,
    /// Pages read ahead (`pgreadahead`... Linux's `swap_ra`).
    pub readahead: u64,
    /// Read-ahead pages that a later fault used (`swap_ra_hit`).
    pub readahead_hit: u64,
    /// Frames taken from a page to hold another (`pgsteal`; LegoOS
    /// `pcache_eviction`).
    pub evictions: u64,
    /// Dirty pages written back to the memory nodes (`pswpout`; LegoOS
    /// `pcache_flush`), each counted once whatever the copies.
    pub writebacks: u64,
    /// Fetches a replica served because a node holding an earlier copy
    /// failed.
    pub fallbacks: u64,
    /// Write-backs that reached fewer copies than configured (a node
    /// down).
    pub degraded_writes: u64,
    /// Faults that could not be served (no usable copy).
    pub errors: u64,
}

/// One memory node's counters.
#[derive(Debug, Clone, Default)]
pub struct NodeStats {
    /// RDMA READs completed.
    pub reads: u64,
    /// RDMA WRITEs completed.
    pub writes: u64,
    /// Requests that failed.
    pub errors: u64,
    /// READ round trips as rmem measures them (post to completion seen,
    /// nanoseconds).
    pub read_ns: Samples,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_is_exact_and_the_ring_keeps_the_latest() {
        let mut s = Samples::new(100);
        for x in 1..=100 {
            s.record(x);
        }
        let m = s.summary();
        assert_eq!((m.n, m.min, m.median, m.p99, m.max), (100, 1, 51, 100, 100));
        for _ in 0..100 {
            s.record(7);
        }
        assert_eq!(s.summary().max, 7, "older samples overwritten");
        assert_eq!(s.count, 200);
        s.record(u64::MAX);
        assert_eq!(s.summary().max, u64::from(u32::MAX));
        s.clear();
        assert_eq!(s.summary(), Summary::default());
        let mut z = Samples::new(0);
        z.record(3);
        assert_eq!((z.count, z.summary().n), (1, 0));
    }
}
