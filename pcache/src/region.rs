//! One remote-backed region and its fault path: a fault on a page not
//! resident takes a frame of the local cache (a CLOCK victim, unmapped and
//! written back if dirty), fetches the page with one RDMA READ straight
//! into that frame (busy-polled, bounded), maps it and returns; a page never
//! written to a memory node is filled with zeros instead, as anonymous
//! memory is on first touch.
//!
//! The pages are spread over the memory nodes by [`Placement`]; with two
//! copies every write-back goes to both and a fetch whose node fails is
//! served by the next copy, so one node can fail with nothing lost. A fault
//! with no usable copy left fails the region ([`FaultError`] says which
//! page, which node, which completion status); the caller ends the workload
//! that faulted, nothing else.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;

use hal::{BusAddr, Deadline, DmaBuf};
use ib_core::{DeviceId, IbCore};
use rmem::client::RemoteChunk;
use rmem::{Client, Token};

use crate::PAGE_SIZE;
use crate::cache::{Cache, FrameState};
use crate::mmu::Mmu;
use crate::place::Placement;
use crate::stats::{Counters, NodeStats, Split};

/// Pages read ahead at most.
pub const MAX_READAHEAD: usize = 8;

/// How a region is set up.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Pages of the region.
    pub pages: u64,
    /// Frames of the local cache (at least 1).
    pub cache_pages: usize,
    /// Copies of every page (1 to the number of memory nodes).
    pub replicas: usize,
    /// Pages read ahead on a sequential fault (0 to [`MAX_READAHEAD`]).
    pub readahead: usize,
    /// Backstop for one batch of RDMA requests: past it the requests still
    /// in flight count as failed (rmem's own `op_timeout` fails a
    /// connection sooner; this is only the bound of the wait).
    pub io_timeout: Duration,
    /// Samples kept of each part of the fault time.
    pub samples: usize,
    /// The clock of the fault-time split (the kernel's TSC); `None`: the
    /// core's nanoseconds.
    pub ticks: Option<fn() -> u64>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pages: 256,
            cache_pages: 64,
            replicas: 1,
            readahead: 0,
            io_timeout: Duration::from_secs(30),
            samples: 1 << 16,
            ticks: None,
        }
    }
}

/// A memory node as the caller connected it.
#[derive(Debug)]
pub struct MemNode {
    /// How the user named it (its port GUID or LID).
    pub label: String,
    /// The connection.
    pub client: Client,
}

/// Why a region could not be attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachError {
    /// The configuration makes no sense.
    Config(&'static str),
    /// No DMA memory for the cache's frames.
    NoMemory,
    /// A memory node refused the region's chunk.
    Node {
        /// Its label.
        label: String,
        /// What it said.
        error: rmem::Error,
    },
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::Config(w) => f.write_str(w),
            AttachError::NoMemory => f.write_str("no DMA memory for the cache's frames"),
            AttachError::Node { label, error } => {
                write!(f, "memory node {label} cannot hold its part: {error}")
            }
        }
    }
}

/// Why a fault could not be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// The page is outside the region.
    OutOfRange,
    /// No frame could be taken (none holds a page that may be evicted).
    NoFrame,
    /// The last memory node that could have served it failed.
    Node {
        /// Its index (in the attach order).
        node: usize,
        /// Its label.
        label: String,
        /// Its error (with the completion status, if one came).
        error: rmem::Error,
    },
}

/// A fault that could not be served: the region is failed from then on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultError {
    /// The page (index in the region).
    pub page: u64,
    /// Whether the failure was writing a dirty victim back (its data is
    /// lost) rather than fetching the faulting page.
    pub write_back: bool,
    /// Why.
    pub cause: Cause,
}

impl fmt::Display for FaultError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.write_back {
            "could not be written back"
        } else {
            "could not be fetched"
        };
        write!(f, "page {} {what}: ", self.page)?;
        match &self.cause {
            Cause::OutOfRange => f.write_str("outside the region"),
            Cause::NoFrame => f.write_str("no frame of the cache can be freed"),
            Cause::Node { node, label, error } => {
                write!(f, "no usable copy; memory node {node} ({label}): {error}")?;
                match error {
                    rmem::Error::Unreachable(s) | rmem::Error::Completion(s) => {
                        write!(f, " (completion status {})", s.name())
                    }
                    rmem::Error::RemoteAccess { .. } => {
                        f.write_str(" (completion status IB_WC_REM_ACCESS_ERR)")
                    }
                    _ => Ok(()),
                }
            }
        }
    }
}

/// How a fault was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The page was in the cache (read ahead): mapped, no READ.
    Hit,
    /// Fetched with an RDMA READ.
    Major,
    /// Never written to a memory node: a zeroed frame.
    ZeroFill,
    /// Already mapped (nothing done).
    Spurious,
}

/// A memory node's state, as [`Pcache::nodes`] shows it.
#[derive(Debug)]
pub struct NodeView<'a> {
    /// Its label.
    pub label: &'a str,
    /// The error that took it out, if it failed.
    pub down: Option<rmem::Error>,
    /// Its counters.
    pub stats: &'a NodeStats,
    /// Its chunk of the region.
    pub chunk: Option<RemoteChunk>,
    /// The connection's QP number.
    pub qpn: u32,
    /// Requests in flight on it.
    pub inflight: usize,
}

struct Node {
    label: String,
    client: Client,
    chunk: Option<RemoteChunk>,
    down: Option<rmem::Error>,
    stats: NodeStats,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IoState {
    ToPost,
    Posted,
    Done,
    Failed,
}

/// One RDMA request of a batch.
#[derive(Debug, Clone, Copy)]
struct Io {
    page: u64,
    frame: u32,
    write: bool,
    /// A read's next copy to try; a write's copy.
    copy: usize,
    node: usize,
    token: Token,
    state: IoState,
}

/// The remote-backed region: the cache, the memory nodes, the statistics.
pub struct Pcache {
    cfg: Config,
    place: Placement,
    cache: Cache,
    frames: DmaBuf,
    nodes: Vec<Node>,
    /// Pages written to the memory nodes at least once (the others are
    /// zero).
    written: Vec<u64>,
    last_fault: Option<u64>,
    failed: Option<FaultError>,
    /// Frames given up because a request into them never ended.
    quarantined: usize,
    counters: Counters,
    split: Split,
}

impl fmt::Debug for Pcache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pcache")
            .field("pages", &self.cfg.pages)
            .field("cache_pages", &self.cfg.cache_pages)
            .field("nodes", &self.nodes.len())
            .field("failed", &self.failed)
            .finish()
    }
}

/// Spins between two looks at ib_core's progress function while waiting
/// for a completion (the CQs themselves are polled on every spin).
const PROGRESS_EVERY: u32 = 64;

/// Write requests in flight at most in one batch of a write-back (a
/// fault's dirty victims, each to every copy; a flush's pages).
const WRITE_BATCH: usize = 2 * (1 + MAX_READAHEAD);

/// Memory nodes of a region at most.
pub const MAX_NODES: usize = 8;

impl Pcache {
    /// Sets up a region of `cfg.pages` pages over `nodes` (connected
    /// clients on device `dev`): the cache's frames from the device's DMA
    /// pool, a chunk on every node. On failure the clients come back with
    /// the error, for the caller to close.
    pub fn attach(
        core: &mut IbCore,
        dev: DeviceId,
        nodes: Vec<MemNode>,
        cfg: Config,
    ) -> Result<Pcache, (AttachError, Vec<MemNode>)> {
        let bad = |w, nodes| Err((AttachError::Config(w), nodes));
        let Some(place) = Placement::new(nodes.len(), cfg.replicas) else {
            return bad("replicas must be 1 to the number of memory nodes", nodes);
        };
        if cfg.pages == 0 || cfg.cache_pages == 0 || cfg.cache_pages >= u32::MAX as usize {
            return bad("the region and its cache need at least one page", nodes);
        }
        if usize::try_from(cfg.pages).is_err() || cfg.pages > 1 << 36 {
            return bad("region too large", nodes);
        }
        if nodes.len() > MAX_NODES {
            return bad("at most 8 memory nodes", nodes);
        }
        if cfg.readahead > MAX_READAHEAD {
            return bad("read-ahead is 0 to 8 pages", nodes);
        }
        let Some(d) = core.device_mut(dev) else {
            return bad("no such device", nodes);
        };
        let Some(len) = cfg.cache_pages.checked_mul(PAGE_SIZE) else {
            return bad("cache too large", nodes);
        };
        let frames = match d.provider().dma_pool().alloc(len, PAGE_SIZE) {
            Ok(f) => f,
            Err(_) => return Err((AttachError::NoMemory, nodes)),
        };
        let chunk_len = place.chunk_len(cfg.pages);
        let mut ns: Vec<Node> = nodes
            .into_iter()
            .map(|m| Node {
                label: m.label,
                client: m.client,
                chunk: None,
                down: None,
                stats: NodeStats {
                    read_ns: crate::stats::Samples::new(cfg.samples),
                    ..NodeStats::default()
                },
            })
            .collect();
        for i in 0..ns.len() {
            match ns[i].client.alloc(core, chunk_len) {
                Ok(c) => ns[i].chunk = Some(c),
                Err(error) => {
                    let label = ns[i].label.clone();
                    return Err((
                        AttachError::Node { label, error },
                        Self::give_back(core, ns),
                    ));
                }
            }
        }
        Ok(Pcache {
            cfg,
            place,
            cache: Cache::new(cfg.pages, cfg.cache_pages),
            frames,
            nodes: ns,
            written: alloc::vec![0; (cfg.pages as usize).div_ceil(64)],
            last_fault: None,
            failed: None,
            quarantined: 0,
            counters: Counters::default(),
            split: Split::new(cfg.samples),
        })
    }

    /// Frees the chunks (on the nodes still up) and returns the clients.
    fn give_back(core: &mut IbCore, nodes: Vec<Node>) -> Vec<MemNode> {
        nodes
            .into_iter()
            .map(|mut n| {
                if let Some(c) = n.chunk.take()
                    && n.down.is_none()
                    && n.client.broken().is_none()
                    && n.client.inflight() == 0
                {
                    let _ = n.client.free(core, c);
                }
                MemNode {
                    label: n.label,
                    client: n.client,
                }
            })
            .collect()
    }

    /// Unmaps every page, frees the chunks and returns the connections.
    /// Nothing is written back: the region's contents go with it.
    pub fn detach(mut self, core: &mut IbCore, mmu: &mut dyn Mmu) -> Vec<MemNode> {
        let mapped: Vec<u64> = self
            .cache
            .resident()
            .filter(|(_, f)| f.state == FrameState::Mapped)
            .map(|(_, f)| f.page)
            .collect();
        for p in mapped {
            mmu.unmap(p);
        }
        // Requests still in flight (after a failure) end before the
        // frames go back to the pool.
        for n in &mut self.nodes {
            if n.client.inflight() > 0 {
                let _ = n.client.drain(core, |_| {});
            }
        }
        Self::give_back(core, self.nodes)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The placement rule.
    pub fn placement(&self) -> Placement {
        self.place
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The fault-time samples.
    pub fn split(&self) -> &Split {
        &self.split
    }

    /// The fault-time samples, for the caller to add the parts it measures
    /// itself (trap and return).
    pub fn split_mut(&mut self) -> &mut Split {
        &mut self.split
    }

    /// Forgets counters and samples (before an experiment's measured run).
    pub fn reset_stats(&mut self) {
        self.counters = Counters::default();
        self.split.clear();
        for n in &mut self.nodes {
            n.stats.reads = 0;
            n.stats.writes = 0;
            n.stats.errors = 0;
            n.stats.read_ns.clear();
        }
    }

    /// The memory nodes.
    pub fn nodes(&self) -> impl Iterator<Item = NodeView<'_>> {
        self.nodes.iter().map(|n| NodeView {
            label: &n.label,
            down: n.down,
            stats: &n.stats,
            chunk: n.chunk,
            qpn: n.client.qpn(),
            inflight: n.client.inflight(),
        })
    }

    /// The error that failed the region, if one did.
    pub fn failed(&self) -> Option<&FaultError> {
        self.failed.as_ref()
    }

    /// Frames holding a page, and frames given up for good.
    pub fn resident(&self) -> (usize, usize) {
        (self.cache.resident().count(), self.quarantined)
    }

    /// The cache's frames (DMA memory; frame `f` at byte `f * 4096`).
    pub fn frames(&self) -> &DmaBuf {
        &self.frames
    }

    /// The frame holding `page` and whether it is mapped.
    pub fn frame_of(&self, page: u64) -> Option<(u32, bool)> {
        let f = self.cache.lookup(page)?;
        Some((f, self.cache.frame(f).state == FrameState::Mapped))
    }

    /// The bus address of frame `f`.
    pub fn frame_bus(&self, f: u32) -> BusAddr {
        BusAddr(self.frames.bus_addr().0 + u64::from(f) * PAGE_SIZE as u64)
    }

    fn is_written(&self, page: u64) -> bool {
        self.written
            .get((page / 64) as usize)
            .is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    fn set_written(&mut self, page: u64) {
        if let Some(w) = self.written.get_mut((page / 64) as usize) {
            *w |= 1 << (page % 64);
        }
    }

    fn now(&self, core: &IbCore) -> u64 {
        match self.cfg.ticks {
            Some(t) => t(),
            None => core.clock().now_ns(),
        }
    }

    /// Serves a fault on `page`: maps it (fetching it, or taking it from
    /// the cache, or zeroing a frame) or says why it cannot. `t0` is when
    /// the handler began, in the configured ticks. Allocates nothing; every
    /// wait has a deadline.
    pub fn fault(
        &mut self,
        core: &mut IbCore,
        mmu: &mut dyn Mmu,
        page: u64,
        t0: u64,
    ) -> Result<Fault, FaultError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.counters.pgfault += 1;
        if page >= self.cfg.pages {
            return Err(self.fail(FaultError {
                page,
                write_back: false,
                cause: Cause::OutOfRange,
            }));
        }
        if let Some(f) = self.cache.lookup(page) {
            match self.cache.frame(f).state {
                FrameState::Cached => {
                    let t1 = self.now(core);
                    mmu.map(page, self.frame_bus(f));
                    self.cache.frame_mut(f).state = FrameState::Mapped;
                    self.counters.hit += 1;
                    self.counters.readahead_hit += 1;
                    self.last_fault = Some(page);
                    let t2 = self.now(core);
                    self.split.lookup.record(t1.saturating_sub(t0));
                    self.split.map.record(t2.saturating_sub(t1));
                    self.split.minor.record(t2.saturating_sub(t0));
                    return Ok(Fault::Hit);
                }
                // Mapped already (nothing to do); busy or free cannot be
                // looked up (one fault at a time).
                _ => return Ok(Fault::Spurious),
            }
        }
        let t1 = self.now(core);
        // The pages to bring in: this one, and, when it is fetched on a
        // sequential pattern, the next ones that a node holds and the
        // cache does not.
        let major = self.is_written(page);
        let mut want = [0u64; 1 + MAX_READAHEAD];
        want[0] = page;
        let mut n = 1;
        let k = self.cfg.readahead.min(self.cfg.cache_pages / 4);
        if major && k > 0 && self.last_fault.is_some_and(|l| l.wrapping_add(1) == page) {
            for p in page + 1..=page.saturating_add(k as u64).min(self.cfg.pages - 1) {
                if self.is_written(p) && self.cache.lookup(p).is_none() {
                    want[n] = p;
                    n += 1;
                }
            }
        }
        self.last_fault = Some(page);
        // A frame for each (read-ahead settles for fewer).
        let mut frames = [0u32; 1 + MAX_READAHEAD];
        let mut dirty = [(0u64, 0u32); 1 + MAX_READAHEAD];
        let mut nd = 0;
        let mut got = 0;
        while got < n {
            let f = match self.cache.take_free() {
                Some(f) => f,
                None => {
                    let Some(v) = self.cache.choose_victim(mmu) else {
                        break;
                    };
                    let fr = *self.cache.frame(v);
                    let mut d = fr.dirty;
                    if fr.state == FrameState::Mapped {
                        d |= mmu.unmap(fr.page).dirty;
                    }
                    self.cache.evict(v);
                    self.counters.evictions += 1;
                    if d {
                        dirty[nd] = (fr.page, v);
                        nd += 1;
                    }
                    v
                }
            };
            frames[got] = f;
            got += 1;
        }
        if got == 0 {
            return Err(self.fail(FaultError {
                page,
                write_back: false,
                cause: Cause::NoFrame,
            }));
        }
        n = got;
        if nd > 0
            && let Err(e) = self.write_back(core, &dirty[..nd])
        {
            return Err(self.fail(e));
        }
        let t2 = self.now(core);
        for i in 0..n {
            self.cache.install(frames[i], want[i]);
        }
        let mut t3 = t2;
        if major {
            let mut ios = [Io {
                page: 0,
                frame: 0,
                write: false,
                copy: 0,
                node: 0,
                token: Token(0),
                state: IoState::ToPost,
            }; 1 + MAX_READAHEAD];
            for i in 0..n {
                ios[i].page = want[i];
                ios[i].frame = frames[i];
            }
            self.run_io(core, &mut ios[..n]);
            t3 = self.now(core);
            for (i, io) in ios[..n].iter().enumerate() {
                match io.state {
                    IoState::Done => {
                        self.counters.pswpin += 1;
                        if io.copy > 0 {
                            self.counters.fallbacks += 1;
                        }
                        if i > 0 {
                            let fr = self.cache.frame_mut(io.frame);
                            fr.state = FrameState::Cached;
                            fr.young = true;
                            self.counters.readahead += 1;
                        }
                    }
                    // A request that never ended keeps its frame out of
                    // use (the card may still write it).
                    IoState::Posted => {
                        self.cache.evict(io.frame);
                        self.quarantined += 1;
                    }
                    // A read-ahead page that failed is just not cached.
                    IoState::ToPost | IoState::Failed => self.cache.release(io.frame),
                }
            }
            if ios[0].state != IoState::Done {
                let cause = self.node_cause(ios[0].node);
                return Err(self.fail(FaultError {
                    page,
                    write_back: false,
                    cause,
                }));
            }
            self.counters.pgmajfault += 1;
        } else {
            self.frames
                .fill(frames[0] as usize * PAGE_SIZE, PAGE_SIZE, 0);
            self.counters.zero_fill += 1;
        }
        mmu.map(page, self.frame_bus(frames[0]));
        self.cache.frame_mut(frames[0]).state = FrameState::Mapped;
        let t4 = self.now(core);
        self.split.lookup.record(t1.saturating_sub(t0));
        self.split.evict.record(t2.saturating_sub(t1));
        self.split.map.record(t4.saturating_sub(t3));
        if major {
            self.split.read.record(t3.saturating_sub(t2));
            self.split.major.record(t4.saturating_sub(t0));
            Ok(Fault::Major)
        } else {
            self.split.minor.record(t4.saturating_sub(t0));
            Ok(Fault::ZeroFill)
        }
    }

    /// Writes every dirty resident page back (keeping it mapped, clean):
    /// `msync` for the region. Returns how many were written.
    pub fn flush(&mut self, core: &mut IbCore, mmu: &mut dyn Mmu) -> Result<usize, FaultError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let resident: Vec<(u32, u64, FrameState, bool)> = self
            .cache
            .resident()
            .map(|(f, fr)| (f, fr.page, fr.state, fr.dirty))
            .collect();
        // As many as one write-back batch holds: spread over the nodes by
        // the placement, all in flight together.
        let mut batch = [(0u64, 0u32); WRITE_BATCH];
        let mut n = 0;
        let mut total = 0;
        for (f, page, state, soft) in resident {
            let hw = state == FrameState::Mapped && mmu.test_and_clear_dirty(page);
            if !(hw || soft) {
                continue;
            }
            self.cache.frame_mut(f).dirty = false;
            batch[n] = (page, f);
            n += 1;
            if n == batch.len() {
                self.write_back(core, &batch[..n])
                    .map_err(|e| self.fail(e))?;
                total += n;
                n = 0;
            }
        }
        if n > 0 {
            self.write_back(core, &batch[..n])
                .map_err(|e| self.fail(e))?;
            total += n;
        }
        Ok(total)
    }

    fn fail(&mut self, e: FaultError) -> FaultError {
        self.counters.errors += 1;
        if self.failed.is_none() {
            self.failed = Some(e.clone());
        }
        e
    }

    /// Why node `i` failed, as a fault's cause.
    fn node_cause(&self, i: usize) -> Cause {
        match self.nodes.get(i) {
            Some(n) => Cause::Node {
                node: i,
                label: n.label.clone(),
                error: n.down.unwrap_or(rmem::Error::Broken),
            },
            None => Cause::NoFrame,
        }
    }

    /// Writes `pages` (page, frame) to every live copy; fails if a page
    /// reached none.
    fn write_back(&mut self, core: &mut IbCore, pages: &[(u64, u32)]) -> Result<(), FaultError> {
        let r = self.place.replicas();
        let mut ios = [Io {
            page: 0,
            frame: 0,
            write: true,
            copy: 0,
            node: 0,
            token: Token(0),
            state: IoState::ToPost,
        }; WRITE_BATCH];
        let mut all = 0;
        // At most `ios.len()` requests a batch.
        for group in pages.chunks((ios.len() / r).max(1)) {
            let mut n = 0;
            for &(page, frame) in group {
                for j in 0..r {
                    if n == ios.len() {
                        break;
                    }
                    let (node, _) = self.place.copy(page, j);
                    ios[n] = Io {
                        page,
                        frame,
                        write: true,
                        copy: j,
                        node,
                        token: Token(0),
                        state: IoState::ToPost,
                    };
                    n += 1;
                }
            }
            self.run_io(core, &mut ios[..n]);
            for &(page, _) in group {
                let mut ok = 0;
                let mut last_node = 0;
                for io in ios[..n].iter().filter(|io| io.page == page) {
                    last_node = io.node;
                    if io.state == IoState::Done {
                        ok += 1;
                    }
                }
                if ok == 0 {
                    return Err(FaultError {
                        page,
                        write_back: true,
                        cause: self.node_cause(last_node),
                    });
                }
                if ok < r {
                    self.counters.degraded_writes += 1;
                }
                self.set_written(page);
                self.counters.writebacks += 1;
            }
            all += group.len();
        }
        debug_assert_eq!(all, pages.len());
        Ok(())
    }

    /// Node `i` is out (its first error kept).
    fn node_down(&mut self, i: usize, e: rmem::Error) {
        if let Some(n) = self.nodes.get_mut(i)
            && n.down.is_none()
        {
            log::warn!("pcache: memory node {i} ({}) failed: {e}", n.label);
            n.down = Some(e);
        }
    }

    /// Posts one request (a read on its first live copy from `io.copy`
    /// on); leaves it to post again if the window is full.
    fn post(&mut self, core: &mut IbCore, io: &mut Io) {
        loop {
            if io.copy >= self.place.replicas() {
                io.state = IoState::Failed;
                return;
            }
            let (node, off) = self.place.copy(io.page, io.copy);
            io.node = node;
            let bus = self.frame_bus(io.frame);
            let Some(n) = self.nodes.get_mut(node) else {
                io.state = IoState::Failed;
                return;
            };
            let usable = n.down.is_none();
            let r = match (usable, n.chunk) {
                (true, Some(c)) if io.write => {
                    n.client
                        .write_from_async(core, c.addr + off, bus, PAGE_SIZE)
                }
                (true, Some(c)) => n.client.read_into_async(core, c.addr + off, bus, PAGE_SIZE),
                _ => Err(rmem::Error::Broken),
            };
            match r {
                Ok(t) => {
                    io.token = t;
                    io.state = IoState::Posted;
                    return;
                }
                Err(rmem::Error::WindowFull) => {
                    io.state = IoState::ToPost;
                    return;
                }
                Err(e) => {
                    if usable {
                        n.stats.errors += 1;
                        let e = n.client.broken().unwrap_or(e);
                        self.node_down(node, e);
                    }
                    if io.write {
                        io.state = IoState::Failed;
                        return;
                    }
                    io.copy += 1;
                }
            }
        }
    }

    /// Runs a batch to its end: every request done or failed (reads moved
    /// on to the next copy when their node fails), within `io_timeout`.
    /// Every request is posted at once, whatever its node (a replicated
    /// write-back's copies, a flush or a read-ahead spread over the nodes go
    /// out together), the batch's first request first; a read whose node
    /// fails is posted to its next copy as soon as that is seen.
    fn run_io(&mut self, core: &mut IbCore, ios: &mut [Io]) {
        let deadline = Deadline::after(core.clock(), self.cfg.io_timeout);
        let mut spins = 0u32;
        loop {
            for io in ios.iter_mut() {
                if io.state == IoState::ToPost {
                    let mut one = *io;
                    self.post(core, &mut one);
                    *io = one;
                }
            }
            if ios
                .iter()
                .all(|io| matches!(io.state, IoState::Done | IoState::Failed))
            {
                return;
            }
            if deadline.expired(core.clock()) {
                for io in ios.iter_mut() {
                    if io.state == IoState::ToPost {
                        io.state = IoState::Failed;
                    }
                    if io.state == IoState::Posted {
                        // Left Posted: its frame is not reused.
                        self.node_down(io.node, rmem::Error::TimedOut("an RDMA completion"));
                    }
                }
                return;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(PROGRESS_EVERY) {
                core.poll();
            }
            let mut progressed = false;
            let nn = self.nodes.len();
            for ni in 0..nn {
                if self.nodes[ni].client.inflight() == 0 {
                    continue;
                }
                let mut comps = [None::<(Token, bool, Result<(), rmem::Error>, u64)>; 16];
                let mut k = 0;
                let r = self.nodes[ni].client.poll(core, |c| {
                    if k < comps.len() {
                        comps[k] = Some((c.token, c.read, c.result, c.latency_ns));
                        k += 1;
                    }
                });
                if let Err(e) = r {
                    self.node_down(ni, e);
                }
                for (token, read, result, ns) in comps.iter().take(k).flatten().copied() {
                    progressed = true;
                    let Some(io) = ios.iter_mut().find(|io| {
                        io.node == ni && io.token == token && io.state == IoState::Posted
                    }) else {
                        continue;
                    };
                    match result {
                        Ok(()) => {
                            io.state = IoState::Done;
                            let s = &mut self.nodes[ni].stats;
                            if read {
                                s.reads += 1;
                                s.read_ns.record(ns);
                            } else {
                                s.writes += 1;
                            }
                        }
                        Err(e) => {
                            self.nodes[ni].stats.errors += 1;
                            if io.write {
                                io.state = IoState::Failed;
                            } else {
                                io.copy += 1;
                                io.state = IoState::ToPost;
                            }
                            self.node_down(ni, e);
                        }
                    }
                }
            }
            if !progressed {
                core.clock().relax();
            }
        }
    }
}
