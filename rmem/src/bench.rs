//! `rmem bench`: 4 KiB page-fetch latency and throughput.
//!
//! `rmem bench`: 4 KiB page-fetch latency (one request in flight: min,
//! median, 99%, 99.9%) and throughput (K in flight) over N remote pages,
//! sequential or random, printed as ib_read_lat/ib_read_bw do or as CSV for
//! plots (our own experiment driver; LegoOS's page-fetch measurement in
//! spirit); leaves out mixed read/write ratios and think time.

use core::fmt::{self, Write};

use ib_core::IbCore;

use crate::client::{Client, RemoteChunk};
use crate::stats::Percentiles;
use crate::{Error, PAGE_SIZE, Result};

/// Access pattern over the pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Page 0, 1, 2, ... wrapping.
    Sequential,
    /// Uniformly random pages (xorshift, fixed seed: runs are repeatable).
    Random,
}

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct BenchConfig {
    /// Remote pages to spread accesses over.
    pub pages: u64,
    /// Page fetches per phase.
    pub iters: u64,
    /// Requests in flight in the throughput phase (at most the client's
    /// window).
    pub window: usize,
    /// Access pattern.
    pub pattern: Pattern,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            pages: 256,
            iters: 10_000,
            window: 16,
            pattern: Pattern::Random,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Copy)]
pub struct BenchResult {
    /// The configuration.
    pub cfg: BenchConfig,
    /// Latency of single page fetches (ns).
    pub lat: Percentiles,
    /// Page fetches completed in the throughput phase.
    pub ops: u64,
    /// Its duration (ns).
    pub elapsed_ns: u64,
}

impl BenchResult {
    /// Page fetches per second with K in flight.
    pub fn ops_per_sec(&self) -> u64 {
        if self.elapsed_ns == 0 {
            return 0;
        }
        (u128::from(self.ops) * 1_000_000_000 / u128::from(self.elapsed_ns)) as u64
    }

    /// MB/s (10^6 bytes, as perftest prints) with K in flight.
    pub fn mbytes_per_sec(&self) -> u64 {
        self.ops_per_sec() * PAGE_SIZE as u64 / 1_000_000
    }

    /// The report, worded like perftest's.
    pub fn write_report(&self, out: &mut dyn Write) -> fmt::Result {
        let us = |ns: u64| Us(ns);
        writeln!(
            out,
            " 4 KiB page fetch (RDMA READ), {} pages, {}, {} iterations",
            self.cfg.pages,
            match self.cfg.pattern {
                Pattern::Sequential => "sequential",
                Pattern::Random => "random",
            },
            self.cfg.iters
        )?;
        writeln!(
            out,
            " #bytes #iterations  t_min[usec]  t_median[usec]  t_99%[usec]  t_99.9%[usec]  t_max[usec]"
        )?;
        writeln!(
            out,
            " {:<6} {:<11}  {:<11}  {:<14}  {:<11}  {:<13}  {}",
            PAGE_SIZE,
            self.lat.count,
            us(self.lat.min),
            us(self.lat.median),
            us(self.lat.p99),
            us(self.lat.p999),
            us(self.lat.max)
        )?;
        writeln!(
            out,
            " {} in flight: {} pages/s, {} MB/s",
            self.cfg.window,
            self.ops_per_sec(),
            self.mbytes_per_sec()
        )
    }

    /// The CSV header.
    pub const CSV_HEADER: &'static str = "pattern,pages,iters,window,lat_min_ns,lat_median_ns,lat_p99_ns,lat_p999_ns,lat_max_ns,pages_per_s,mb_per_s";

    /// One CSV line (no header).
    pub fn write_csv(&self, out: &mut dyn Write) -> fmt::Result {
        writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{}",
            match self.cfg.pattern {
                Pattern::Sequential => "seq",
                Pattern::Random => "rand",
            },
            self.cfg.pages,
            self.cfg.iters,
            self.cfg.window,
            self.lat.min,
            self.lat.median,
            self.lat.p99,
            self.lat.p999,
            self.lat.max,
            self.ops_per_sec(),
            self.mbytes_per_sec()
        )
    }
}

struct Us(u64);

impl fmt::Display for Us {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = alloc::format!("{}.{:02}", self.0 / 1000, (self.0 % 1000) / 10);
        f.pad(&s)
    }
}

struct Pages {
    cfg: BenchConfig,
    next: u64,
    x: u64,
}

impl Pages {
    fn page(&mut self) -> u64 {
        match self.cfg.pattern {
            Pattern::Sequential => {
                let p = self.next;
                self.next = (self.next + 1) % self.cfg.pages;
                p
            }
            Pattern::Random => {
                self.x ^= self.x << 13;
                self.x ^= self.x >> 7;
                self.x ^= self.x << 17;
                self.x % self.cfg.pages
            }
        }
    }
}

/// Runs the benchmark on a chunk of `cfg.pages` pages it allocates (and
/// frees) on the memory node; the chunk is filled first so every fetch
/// moves real data.
pub fn run(core: &mut IbCore, c: &mut Client, cfg: BenchConfig) -> Result<BenchResult> {
    if cfg.pages == 0 || cfg.iters == 0 || cfg.window == 0 {
        return Err(Error::BadLength);
    }
    if c.config().slot_len < PAGE_SIZE {
        return Err(Error::BadLength);
    }
    let chunk = c.alloc(core, cfg.pages * PAGE_SIZE as u64)?;
    let r = measure(core, c, cfg, chunk);
    let freed = c.free(core, chunk);
    let r = r?;
    freed?;
    Ok(r)
}

fn measure(
    core: &mut IbCore,
    c: &mut Client,
    cfg: BenchConfig,
    chunk: RemoteChunk,
) -> Result<BenchResult> {
    let page = [0x5au8; PAGE_SIZE];
    for p in 0..cfg.pages {
        c.write(core, chunk.addr + p * PAGE_SIZE as u64, &page)?;
    }
    let mut pages = Pages {
        cfg,
        next: 0,
        x: 0x2545_f491_4f6c_dd1d,
    };
    let window = cfg.window.min(c.config().window);
    let mut err = None;
    // Latency: one in flight.
    c.reset_stats();
    for _ in 0..cfg.iters {
        let addr = chunk.addr + pages.page() * PAGE_SIZE as u64;
        c.read_async(core, addr, PAGE_SIZE)?;
        c.drain(core, |d| {
            if let Err(e) = d.result {
                err.get_or_insert(e);
            }
        })?;
        if let Some(e) = err {
            return Err(e);
        }
    }
    let lat = c.stats().percentiles();
    // Throughput: K in flight.
    let clock_start = core.clock().now_ns();
    let mut posted = 0u64;
    let mut done = 0u64;
    let deadline = hal::Deadline::after(
        core.clock(),
        c.config().op_timeout * 2
            + core::time::Duration::from_micros(cfg.iters.saturating_mul(1000)),
    );
    while done < cfg.iters {
        while posted < cfg.iters && c.inflight() < window {
            let addr = chunk.addr + pages.page() * PAGE_SIZE as u64;
            c.read_async(core, addr, PAGE_SIZE)?;
            posted += 1;
        }
        core.poll();
        let n = c.poll(core, |d| {
            done += 1;
            if let Err(e) = d.result {
                err.get_or_insert(e);
            }
        })?;
        if n == 0 {
            core.clock().relax();
        }
        if let Some(e) = err {
            let _ = c.drain(core, |_| {});
            return Err(e);
        }
        if deadline.expired(core.clock()) {
            return Err(Error::TimedOut("the throughput phase"));
        }
    }
    Ok(BenchResult {
        cfg: BenchConfig { window, ..cfg },
        lat,
        ops: done,
        elapsed_ns: core.clock().now_ns().saturating_sub(clock_start),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;

    #[test]
    fn report_and_csv_read_like_perftest() {
        let r = BenchResult {
            cfg: BenchConfig {
                pages: 64,
                iters: 1000,
                window: 8,
                pattern: Pattern::Sequential,
            },
            lat: Percentiles {
                count: 1000,
                min: 2_100,
                median: 2_500,
                p99: 4_000,
                p999: 9_990,
                max: 12_000,
            },
            ops: 1000,
            elapsed_ns: 1_000_000,
        };
        assert_eq!(r.ops_per_sec(), 1_000_000);
        assert_eq!(r.mbytes_per_sec(), 4096);
        let mut s = String::new();
        r.write_csv(&mut s).unwrap();
        assert_eq!(s, "seq,64,1000,8,2100,2500,4000,9990,12000,1000000,4096\n");
        assert_eq!(BenchResult::CSV_HEADER.split(',').count(), 11);
        let mut t = String::new();
        r.write_report(&mut t).unwrap();
        assert!(t.contains(" 4096   1000         2.10         2.50"), "{t}");
        assert!(t.contains("8 in flight: 1000000 pages/s, 4096 MB/s"), "{t}");
    }

    #[test]
    fn patterns_stay_inside_the_pages() {
        for pattern in [Pattern::Sequential, Pattern::Random] {
            let mut p = Pages {
                cfg: BenchConfig {
                    pages: 7,
                    pattern,
                    ..BenchConfig::default()
                },
                next: 0,
                x: 0x2545_f491_4f6c_dd1d,
            };
            let mut seen = [0u32; 7];
            for _ in 0..700 {
                seen[p.page() as usize] += 1;
            }
            assert!(seen.iter().all(|&n| n > 0), "{pattern:?} {seen:?}");
        }
    }
}
