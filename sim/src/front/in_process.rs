//! The front end for host tests.
//!
//! [`SimHca`] hands the driver a `hal::PciFunction` (config space, BAR0, BAR2), a
//! `hal::DmaPool` and a `hal::Clock` backed by the model, in a synchronous
//! deterministic mode or a threaded mode that polls shared register memory like the
//! ivshmem emulator; the ivshmem front end (`cx3-emu`, [`crate::front::ivshmem`])
//! uses the latter without a thread ([`SimHca::new_polled`]).
//!
//! * **Synchronous** ([`SimHca::new`]): every register access calls into the
//!   model on the caller's thread. Writing HCR dword 6 with GO executes the
//!   command at once; GO stays visible for [`SimConfig::hcr_polls`] reads of
//!   the status dword (and until [`SimConfig::hcr_delay`] has passed on the
//!   model clock). The clock is a `FakeClock` that advances
//!   [`SimConfig::relax_step`] per `relax()` and by the full amount on
//!   `delay()`, so Linux's one-second reset sleep costs nothing.
//! * **Threaded** ([`SimHca::new_threaded`], [`SimHca::new_over`],
//!   [`SimHca::new_polled`]): BARs are
//!   plain atomic memory; a model thread polls them every
//!   [`SimConfig::poll_interval`] while busy, backing off to 1 ms when idle
//!   (HCR GO, software reset, and the doorbells of EQs, CQs and QPs in
//!   hardware ownership, consumed by atomic swap with 0 so that repeated
//!   equal writes all count). In [`SimHca::new_threaded`] the driver's
//!   accesses still pass through this module, which makes the synchronous
//!   mode's HCR and semaphore checks on the caller's thread (write order,
//!   writes while busy, 64-bit stores, decoding off, read-to-claim
//!   semaphores, reset without the semaphore). The polling side adds what
//!   memory alone shows, the only checks left when the window is plain
//!   shared RAM (`cx3-emu`, `docs/ivshmem.md`): GO stays up for one more
//!   poll pass, during which dwords 0..5 must not change; dword 6 must not
//!   change while busy; T must flip; GO with decoding off is undone. The CQ
//!   doorbell's second dword may be read before it lands. The clock is real
//!   monotonic time. The thread stops when the last `SimHca` clone is
//!   dropped.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hal::fake::{ArenaDma, FakeClock};
use hal::{Bar, Clock, ConfigSpace, DmaPool, PciAddress, PciFunction, RegisterBackend};

use crate::fabric::SharedFabric;
use crate::fabric::{LogicalState, PhysicalState};
use crate::hca::HcaConfig;
use crate::hca::device::{FwState, Hca};
use crate::hca::eq::EqState;
use crate::hca::faults::{BadCap, EqeCorruption, FaultPlan, OpcodeFault};
use crate::hca::hcr::{Opcode, bits};
use crate::hca::layout::DevCap;
use crate::hca::mem::{DmaFault, HostMemory};
use crate::hca::pci::{BAR0_SIZE, BAR2_SIZE, PciConfig};
use crate::hca::regs::{self, RegFile};
use crate::hca::trace::TraceEntry;

/// Model configuration: the card's ([`HcaConfig`], field for field) and
/// how this front end hosts it (DMA arena, clocks, polling).
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Number of IB ports (1 or 2).
    pub num_ports: u8,
    /// Firmware version (major, minor, subminor); 2.42.5000 by default.
    pub fw_version: (u16, u16, u16),
    /// FW area size in 4 KiB pages (QUERY_FW).
    pub fw_pages: u16,
    /// Command interface revision (3: new port commands).
    pub cmd_if_rev: u16,
    /// Node GUID; port n's GUID is node GUID + n.
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// NodeDescription the firmware SMA reports.
    pub node_description: String,
    /// Board id in QUERY_ADAPTER's VSD.
    pub board_id: String,
    /// Hardware revision (NodeInfo).
    pub hw_rev: u32,
    /// INTA pin (QUERY_ADAPTER).
    pub inta_pin: u8,
    /// Core clock in MHz (QUERY_HCA, internal clock).
    pub core_clock_mhz: u16,
    /// Sync mode: status-dword reads that still show GO after a post.
    pub hcr_polls: u32,
    /// Model-clock time before GO clears (both modes).
    pub hcr_delay: Duration,
    /// How long the function is off the bus after a software reset.
    pub reset_duration: Duration,
    /// Size of the DMA arena.
    pub dma_size: usize,
    /// Bus address of the arena's first byte.
    pub dma_bus_base: u64,
    /// Sync mode: fake-clock advance per `relax()`.
    pub relax_step: Duration,
    /// Threaded mode: model thread polling period while busy (it backs off
    /// to 1 ms when nothing happens).
    pub poll_interval: Duration,
    /// Cables plugged: ports train after INIT_PORT.
    pub cable_plugged: bool,
    /// Data VLs each port supports (SET_PORT above this is EXCEED_LIM).
    pub max_vls: u8,
    /// Record a software reset without the reset semaphore as a violation.
    pub strict_reset_semaphore: bool,
    /// Device limits reported by QUERY_DEV_CAP and enforced.
    pub dev_cap: DevCap,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig::assemble(
            HcaConfig::default(),
            256 << 20,
            0x1_0000_0000,
            Duration::from_micros(1),
            Duration::from_micros(20),
        )
    }
}

impl SimConfig {
    /// The card's part, as the card takes it.
    pub fn hca_config(&self) -> HcaConfig {
        let SimConfig {
            num_ports,
            fw_version,
            fw_pages,
            cmd_if_rev,
            node_guid,
            sys_image_guid,
            node_description,
            board_id,
            hw_rev,
            inta_pin,
            core_clock_mhz,
            hcr_polls,
            hcr_delay,
            reset_duration,
            cable_plugged,
            max_vls,
            strict_reset_semaphore,
            dev_cap,
            dma_size: _,
            dma_bus_base: _,
            relax_step: _,
            poll_interval: _,
        } = self.clone();
        HcaConfig {
            num_ports,
            fw_version,
            fw_pages,
            cmd_if_rev,
            node_guid,
            sys_image_guid,
            node_description,
            board_id,
            hw_rev,
            inta_pin,
            core_clock_mhz,
            hcr_polls,
            hcr_delay,
            reset_duration,
            cable_plugged,
            max_vls,
            strict_reset_semaphore,
            dev_cap,
        }
    }

    /// `card` hosted with the given arena, clock step and polling period.
    fn assemble(
        card: HcaConfig,
        dma_size: usize,
        dma_bus_base: u64,
        relax_step: Duration,
        poll_interval: Duration,
    ) -> SimConfig {
        let HcaConfig {
            num_ports,
            fw_version,
            fw_pages,
            cmd_if_rev,
            node_guid,
            sys_image_guid,
            node_description,
            board_id,
            hw_rev,
            inta_pin,
            core_clock_mhz,
            hcr_polls,
            hcr_delay,
            reset_duration,
            cable_plugged,
            max_vls,
            strict_reset_semaphore,
            dev_cap,
        } = card;
        SimConfig {
            num_ports,
            fw_version,
            fw_pages,
            cmd_if_rev,
            node_guid,
            sys_image_guid,
            node_description,
            board_id,
            hw_rev,
            inta_pin,
            core_clock_mhz,
            hcr_polls,
            hcr_delay,
            reset_duration,
            dma_size,
            dma_bus_base,
            relax_step,
            poll_interval,
            cable_plugged,
            max_vls,
            strict_reset_semaphore,
            dev_cap,
        }
    }
}

fn lock(m: &Mutex<Hca>) -> MutexGuard<'_, Hca> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// BAR0 in synchronous mode: every access is a model call; after a
/// write, every HCA on the same wire is stepped until quiet.
struct SyncBar0(Arc<Mutex<Hca>>, Option<Wire>);
impl RegisterBackend for SyncBar0 {
    fn read32(&self, offset: usize) -> u32 {
        lock(&self.0).bar0_read(offset)
    }
    fn write32(&self, offset: usize, value: u32) {
        lock(&self.0).bar0_write(offset, value);
        if let Some(w) = &self.1 {
            w.settle();
        }
    }
    fn write64(&self, offset: usize, value: u64) {
        lock(&self.0).bar0_write64(offset, value);
        if let Some(w) = &self.1 {
            w.settle();
        }
    }
}

/// BAR2 in synchronous mode.
struct SyncBar2(Arc<Mutex<Hca>>, Option<Wire>);
impl RegisterBackend for SyncBar2 {
    fn read32(&self, offset: usize) -> u32 {
        lock(&self.0).bar2_read(offset)
    }
    fn write32(&self, offset: usize, value: u32) {
        lock(&self.0).bar2_write(offset, value);
        if let Some(w) = &self.1 {
            w.settle();
        }
    }
}

/// HCAs cabled to one fabric and the clock they share, stepped together:
/// in synchronous mode after every register write of any of them and on
/// every `relax` of the (shared) fake clock, until no HCA makes progress;
/// in threaded mode each HCA's own thread steps it, on a shared monotonic
/// clock. The lock order is one HCA at a time, then the fabric.
#[derive(Clone)]
pub struct Wire {
    fabric: SharedFabric,
    members: Arc<Mutex<Vec<std::sync::Weak<Mutex<Hca>>>>>,
    fake: Option<Arc<FakeClock>>,
    mono: Arc<MonoClock>,
}

impl core::fmt::Debug for Wire {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "Wire({} HCAs)",
            self.members.lock().map_or(0, |m| m.len())
        )
    }
}

/// Rounds of [`Wire::settle`] at most (a chatty fabric cannot hang a
/// register write).
const SETTLE_ROUNDS: usize = 256;

impl Wire {
    /// A synchronous wire over a new empty fabric, with one fake clock for
    /// every HCA on it (advancing `relax_step` per `relax`).
    pub fn new(relax_step: Duration) -> Wire {
        Self::over(crate::fabric::Fabric::shared(), relax_step)
    }

    /// A synchronous wire over `fabric` (a topology already built).
    pub fn over(fabric: SharedFabric, relax_step: Duration) -> Wire {
        Wire {
            fabric,
            members: Arc::default(),
            fake: Some(Arc::new(FakeClock::with_relax_step(relax_step))),
            mono: Arc::new(MonoClock(Instant::now())),
        }
    }

    /// A wire for threaded (and polled) HCAs over `fabric`: real time on one
    /// monotonic clock.
    pub fn threaded(fabric: SharedFabric) -> Wire {
        Wire {
            fabric,
            members: Arc::default(),
            fake: None,
            mono: Arc::new(MonoClock(Instant::now())),
        }
    }

    /// The fabric.
    pub fn fabric(&self) -> SharedFabric {
        self.fabric.clone()
    }

    /// The fake clock every HCA on a synchronous wire shares.
    pub fn fake_clock(&self) -> Option<Arc<FakeClock>> {
        self.fake.clone()
    }

    fn join(&self, h: &Arc<Mutex<Hca>>) {
        if let Ok(mut m) = self.members.lock() {
            m.retain(|w| w.strong_count() > 0);
            m.push(Arc::downgrade(h));
        }
    }

    fn members(&self) -> Vec<Arc<Mutex<Hca>>> {
        self.members
            .lock()
            .map(|m| m.iter().filter_map(|w| w.upgrade()).collect())
            .unwrap_or_default()
    }

    /// One step of every HCA on the wire; true if any made progress.
    /// `blocking`: wait for each HCA's lock (else skip a busy one).
    pub fn step(&self, blocking: bool) -> bool {
        let mut any = false;
        for h in self.members() {
            let g = if blocking {
                Some(lock(&h))
            } else {
                h.try_lock().ok()
            };
            if let Some(mut g) = g {
                any |= crate::hca::engine::step(&mut g);
            }
        }
        any
    }

    /// Steps every HCA until none makes progress (bounded).
    pub fn settle(&self) {
        for _ in 0..SETTLE_ROUNDS {
            if !self.step(true) {
                break;
            }
        }
    }
}

/// BAR0 in threaded mode: shared memory the model thread polls, with the
/// protocol checks of the synchronous front end made here, on the caller's
/// thread, since every access still passes through this code: accesses
/// with memory decoding off (dropped), HCR dwords 0..5 written while GO is
/// up (dropped), dword 6 without GO or while GO is up (dropped), GO before
/// all of dwords 0..5, 64-bit stores into the HCR, writes to the
/// catastrophic-error buffer (dropped), a software reset without the reset
/// semaphore. The ownership and reset semaphores are read-to-claim as on
/// the card (the semaphore word itself holds the state; a reset frees it).
/// The T bit is checked by the model when it picks the command up.
struct SharedBar0 {
    regs: Arc<RegFile>,
    hca: Arc<Mutex<Hca>>,
    pci: Arc<PciConfig>,
    strict_reset: bool,
    /// HCR dwords 0..5 written since the last GO (bit n = dword n).
    written: AtomicU8,
}

impl SharedBar0 {
    fn record(&self, msg: String) {
        lock(&self.hca).violation(msg);
    }
    fn busy(&self) -> bool {
        self.regs.be(regs::HCR_STATUS) & bits::GO != 0
    }
}

impl RegisterBackend for SharedBar0 {
    fn read32(&self, off: usize) -> u32 {
        if !self.pci.memory_enabled() {
            self.record(format!(
                "BAR0 read at {off:#x} with memory decoding disabled (or during reset)"
            ));
            return u32::MAX;
        }
        match off {
            regs::OWNERSHIP | regs::RESET_SEMAPHORE => self.regs.swap_raw(off, 1u32.to_be()),
            _ => self.regs.raw(off),
        }
    }

    fn write32(&self, off: usize, raw: u32) {
        let v = u32::from_be(raw);
        if !self.pci.memory_enabled() {
            self.record(format!(
                "BAR0 write {v:#010x} at {off:#x} with memory decoding disabled (or during reset)"
            ));
            return;
        }
        match off {
            o if (regs::HCR_BASE..regs::HCR_STATUS).contains(&o) => {
                let n = (o - regs::HCR_BASE) / 4;
                if self.busy() {
                    self.record(format!(
                        "HCR dword {n} written while a command is in flight"
                    ));
                    return;
                }
                self.regs.set_raw(o, raw);
                self.written.fetch_or(1 << n, Ordering::AcqRel);
            }
            regs::HCR_STATUS => {
                if v & bits::GO == 0 {
                    self.record(format!("HCR dword 6 written without GO: {v:#010x}"));
                    return;
                }
                if self.busy() {
                    self.record(format!(
                        "GO written while the HCR is busy (opcode {})",
                        Opcode((v & bits::OPCODE_MASK) as u16)
                    ));
                    return;
                }
                let w = self.written.swap(0, Ordering::AcqRel);
                if w & 0x3f != 0x3f {
                    self.record(format!(
                        "HCR dword 6 (GO) written before dwords 0..5 (written mask {w:#04x})"
                    ));
                }
                self.regs.set_raw(off, raw);
            }
            regs::RESET => {
                if v & 1 != 0 {
                    if self.strict_reset && self.regs.raw(regs::RESET_SEMAPHORE) == 0 {
                        self.record(
                            "software reset without holding the reset semaphore".to_string(),
                        );
                    }
                    self.written.store(0, Ordering::Release);
                }
                self.regs.set_raw(off, raw);
            }
            o if (regs::CATAS_BASE..regs::CATAS_BASE + regs::CATAS_DWORDS * 4).contains(&o) => {
                self.record(format!(
                    "write to the read-only catastrophic buffer at {o:#x}"
                ));
            }
            _ => self.regs.set_raw(off, raw),
        }
    }

    fn write64(&self, off: usize, raw: u64) {
        if off + 8 > regs::HCR_BASE && off < regs::HCR_BASE + regs::HCR_LEN {
            self.record(format!("64-bit store into the HCR at {off:#x}"));
        }
        self.write32(off, raw as u32);
        self.write32(off + 4, (raw >> 32) as u32);
    }
}

/// BAR2 in threaded mode: shared memory (doorbells are consumed by the
/// model thread); accesses with memory decoding off are dropped and
/// recorded.
struct SharedBar2 {
    regs: Arc<RegFile>,
    hca: Arc<Mutex<Hca>>,
    pci: Arc<PciConfig>,
}

impl RegisterBackend for SharedBar2 {
    fn read32(&self, off: usize) -> u32 {
        if !self.pci.memory_enabled() {
            lock(&self.hca).violation(format!(
                "BAR2 read at {off:#x} with memory decoding disabled"
            ));
            return u32::MAX;
        }
        self.regs.raw(off)
    }
    fn write32(&self, off: usize, raw: u32) {
        if !self.pci.memory_enabled() {
            lock(&self.hca).violation(format!(
                "BAR2 write at {off:#x} with memory decoding disabled"
            ));
            return;
        }
        self.regs.set_raw(off, raw)
    }
}

/// Synchronous mode's clock as the driver sees it: the fake clock, and on
/// every `relax`/`delay` a step of the data-path engines, so RNR and retry
/// timers fire on fake time while the driver polls. Reading it takes a
/// nanosecond, as reading a TSC takes a few: a register write settles the
/// whole wire (a message sent, received and acknowledged) without a
/// `relax`, and a driver timing that exchange must still see time pass.
struct SteppingClock {
    fake: Arc<FakeClock>,
    hca: std::sync::Weak<Mutex<Hca>>,
    wire: Option<Wire>,
}

impl SteppingClock {
    fn step(&self) {
        if let Some(w) = &self.wire {
            for _ in 0..SETTLE_ROUNDS {
                if !w.step(false) {
                    break;
                }
            }
        } else if let Some(h) = self.hca.upgrade()
            && let Ok(mut g) = h.try_lock()
        {
            crate::hca::engine::step(&mut g);
        }
    }
}

impl Clock for SteppingClock {
    fn now_ns(&self) -> u64 {
        self.fake.advance(Duration::from_nanos(1));
        self.fake.now_ns()
    }
    fn relax(&self) {
        self.fake.relax();
        self.step();
    }
    fn delay(&self, d: Duration) {
        self.fake.delay(d);
        self.step();
    }
}

/// Real monotonic time (threaded mode).
struct MonoClock(Instant);
impl Clock for MonoClock {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
    fn relax(&self) {
        std::thread::yield_now();
    }
    fn delay(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

struct Inner {
    hca: Arc<Mutex<Hca>>,
    /// The configuration built with (the card's part changes at run time:
    /// SET_PORT's GUIDs).
    cfg: SimConfig,
    arena: Arc<ArenaDma>,
    clock: Arc<dyn Clock>,
    fake_clock: Option<Arc<FakeClock>>,
    pci: Arc<PciConfig>,
    bar0: Arc<dyn RegisterBackend>,
    bar2: Arc<dyn RegisterBackend>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

/// Why [`SimHca::sma_receive`] dropped an SMP (no response, as on the
/// wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmpDropped {
    /// Not a 256-byte subnet-management MAD.
    NotAnSmp,
    /// The HCA has no such port.
    NoSuchPort,
    /// The port's physical link is not up: nothing reaches it.
    NoLink,
    /// The SMA discarded it (M_Key violation, bad base version, a
    /// response method).
    Discarded,
}

/// A simulated ConnectX-3. Cheap to clone (an `Arc` inside); all methods take
/// `&self`.
///
/// # Examples
///
/// QUERY_FW by hand, the way Linux's `mlx4_cmd_post` does it:
///
/// ```
/// use sim::{SimConfig, SimHca};
///
/// let hca = SimHca::new(SimConfig::default());
/// let pci = hca.pci_function();
/// pci.enable();
/// let bar0 = pci.take_bar(0).unwrap();
/// let outbox = hca.dma_pool().alloc_pages(1).unwrap();
/// let hcr = 0x8_0680;
/// let out = outbox.bus_addr().0;
/// for (i, v) in [0, 0, 0, (out >> 32) as u32, out as u32, 0xffff << 16].into_iter().enumerate() {
///     bar0.write_be32(hcr + 4 * i, v);
/// }
/// bar0.write_be32(hcr + 0x18, 1 << 23 | 1 << 21 | 0x004); // GO | T | QUERY_FW
/// while bar0.read_be32(hcr + 0x18) & (1 << 23) != 0 {}
/// assert_eq!(bar0.read_be32(hcr + 0x18) >> 24, 0, "status OK");
/// assert_eq!(outbox.read_be16(2), 2, "FW major");
/// assert_eq!(hca.trace()[0].name, "QUERY_FW");
/// ```
#[derive(Clone)]
pub struct SimHca {
    inner: Arc<Inner>,
}

impl core::fmt::Debug for SimHca {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "SimHca({:?})", lock(&self.inner.hca).fw)
    }
}

/// Fault injection handle (see [`crate::hca::faults`]).
#[derive(Clone)]
pub struct Faults(Arc<Mutex<Hca>>);

impl Faults {
    /// Arms `fault` for opcode `op`.
    pub fn set(&self, op: Opcode, fault: OpcodeFault) -> &Self {
        lock(&self.0).faults.set(op, fault);
        self
    }
    /// Disarms `op`.
    pub fn clear(&self, op: Opcode) -> &Self {
        lock(&self.0).faults.clear(op);
        self
    }
    /// Disarms everything.
    pub fn clear_all(&self) -> &Self {
        lock(&self.0).faults = FaultPlan::default();
        self
    }
    /// QUERY_DEV_CAP reports an absurd value.
    pub fn bad_cap(&self, c: BadCap) -> &Self {
        lock(&self.0).faults.bad_caps.push(c);
        self
    }
    /// The next EQE written is corrupted.
    pub fn corrupt_next_eqe(&self, c: EqeCorruption) -> &Self {
        lock(&self.0).faults.corrupt_eqes.push(c);
        self
    }
    /// Raises a catastrophic error now.
    pub fn catastrophic(&self) -> &Self {
        lock(&self.0).raise_catastrophic(1);
        self
    }
    /// A copy of the plan.
    pub fn plan(&self) -> FaultPlan {
        lock(&self.0).faults.clone()
    }
}

/// Where the registers and host memory come from.
enum Backing {
    /// Sync mode, own registers, arena memory.
    Sync,
    /// Threaded mode, own registers, arena memory.
    Threaded,
    /// As `Threaded`, without a model thread: the caller polls.
    ThreadedPolled,
    /// Synchronous (trapped) register semantics over a caller's host memory,
    /// on real monotonic time, no thread: the vfio-user front end.
    Trapped { mem: Arc<dyn HostMemory> },
    /// Threaded mode over a caller's memory and register windows; with
    /// `own_thread` false the caller polls ([`SimHca::poll`]).
    External {
        mem: Arc<dyn HostMemory>,
        bar0: Arc<RegFile>,
        bar2: Arc<RegFile>,
        own_thread: bool,
    },
}

impl SimHca {
    fn build(cfg: SimConfig, backing: Backing) -> SimHca {
        Self::build_on(cfg, backing, None)
    }

    fn build_on(
        mut cfg: SimConfig,
        backing: Backing,
        wire: Option<(&Wire, [Option<crate::fabric::PortId>; 2])>,
    ) -> SimHca {
        if wire.is_some() {
            // The cables are the fabric's.
            cfg.cable_plugged = false;
        }
        let threaded = !matches!(backing, Backing::Sync | Backing::Trapped { .. });
        let real_time = !matches!(backing, Backing::Sync);
        let spawn = !matches!(
            backing,
            Backing::Sync
                | Backing::ThreadedPolled
                | Backing::Trapped { .. }
                | Backing::External {
                    own_thread: false,
                    ..
                }
        );
        let arena = Arc::new(ArenaDma::with_bus_base(cfg.dma_size, cfg.dma_bus_base));
        let (clock, fake_clock): (Arc<dyn Clock>, _) = match (real_time, wire) {
            (true, Some((w, _))) => (w.mono.clone(), None),
            (true, None) => (Arc::new(MonoClock(Instant::now())), None),
            (false, Some((w, _))) if w.fake.is_some() => {
                let c = w.fake.clone().unwrap_or_default();
                (c.clone(), Some(c))
            }
            (false, _) => {
                let c = Arc::new(FakeClock::with_relax_step(cfg.relax_step));
                (c.clone(), Some(c))
            }
        };
        let poll = cfg.poll_interval;
        let strict_reset = cfg.strict_reset_semaphore;
        let card = cfg.hca_config();
        let hca = match backing {
            Backing::External {
                mem, bar0, bar2, ..
            } => Hca::with_regs(card, mem, clock.clone(), true, bar0, bar2),
            Backing::Trapped { mem } => Hca::new(card, mem, clock.clone(), false),
            _ => Hca::new(card, arena.clone(), clock.clone(), threaded),
        };
        let mut hca = hca;
        if let Some((w, ports)) = wire {
            hca.fabric = Some(crate::hca::engine::wire::FabricLink::new(
                w.fabric.clone(),
                ports,
            ));
        }
        let pci = hca.pci.clone();
        let (r0, r2) = (hca.bar0.clone(), hca.bar2.clone());
        let hca = Arc::new(Mutex::new(hca));
        let wire = wire.map(|(w, _)| w.clone());
        if let Some(w) = &wire {
            w.join(&hca);
        }
        let clock: Arc<dyn Clock> = match &fake_clock {
            Some(f) => Arc::new(SteppingClock {
                fake: f.clone(),
                hca: Arc::downgrade(&hca),
                wire: wire.clone(),
            }),
            None => clock,
        };
        let (bar0, bar2): (Arc<dyn RegisterBackend>, Arc<dyn RegisterBackend>) = if threaded {
            (
                Arc::new(SharedBar0 {
                    regs: r0,
                    hca: hca.clone(),
                    pci: pci.clone(),
                    strict_reset,
                    written: AtomicU8::new(0),
                }),
                Arc::new(SharedBar2 {
                    regs: r2,
                    hca: hca.clone(),
                    pci: pci.clone(),
                }),
            )
        } else {
            (
                Arc::new(SyncBar0(hca.clone(), wire.clone())),
                Arc::new(SyncBar2(hca.clone(), wire.clone())),
            )
        };
        let stop = Arc::new(AtomicBool::new(false));
        let thread = spawn.then(|| {
            let (h, s) = (hca.clone(), stop.clone());
            std::thread::Builder::new()
                .name("cx3-model".into())
                .spawn(move || {
                    // Poll at `poll` while busy; back off to 1 ms when idle
                    // so an idle model does not eat a shared CPU.
                    let idle_max = poll.max(Duration::from_millis(1));
                    let mut wait = poll;
                    while !s.load(Ordering::Acquire) {
                        let active = lock(&h).poll_shared();
                        wait = if active {
                            poll
                        } else {
                            (wait * 2).min(idle_max)
                        };
                        std::thread::sleep(wait);
                    }
                })
                .expect("spawn the model thread")
        });
        SimHca {
            inner: Arc::new(Inner {
                hca,
                cfg,
                arena,
                clock,
                fake_clock,
                pci,
                bar0,
                bar2,
                stop,
                thread: Mutex::new(thread),
            }),
        }
    }

    /// A model in synchronous deterministic mode.
    pub fn new(cfg: SimConfig) -> SimHca {
        Self::build(cfg, Backing::Sync)
    }

    /// A model over its own shared-memory registers and arena, like
    /// [`SimHca::new_threaded`] but without a model thread: the caller
    /// polls with [`SimHca::poll`], as `cx3-emu`'s loop does (benchmarks of
    /// that loop without the ivshmem files).
    pub fn new_polled_local(cfg: SimConfig) -> SimHca {
        Self::build(cfg, Backing::ThreadedPolled)
    }

    /// A model whose two ports are attached to `wire`'s fabric (uncabled:
    /// cable them with [`SimHca::fabric_port`] and `Fabric::connect`, or
    /// use [`SimHca::back_to_back`]). Synchronous on a synchronous wire,
    /// threaded (own model thread) on a threaded one.
    pub fn new_on(cfg: SimConfig, wire: &Wire) -> SimHca {
        let ports = {
            let mut f = wire.fabric.lock().unwrap_or_else(|e| e.into_inner());
            [
                Some(f.attach_hca_port(cfg.node_guid, 1)),
                Some(f.attach_hca_port(cfg.node_guid, 2)),
            ]
        };
        Self::new_on_ports(cfg, wire, ports)
    }

    /// Like [`SimHca::new_on`] with fabric ports attached already (a
    /// topology's `BuiltHca::ports`).
    pub fn new_on_ports(
        cfg: SimConfig,
        wire: &Wire,
        ports: [Option<crate::fabric::PortId>; 2],
    ) -> SimHca {
        let backing = if wire.fake.is_some() {
            Backing::Sync
        } else {
            Backing::Threaded
        };
        Self::build_on(cfg, backing, Some((wire, ports)))
    }

    /// A polled model ([`SimHca::new_polled`]) on `wire` with the given
    /// fabric ports (cx3-emu: one fabric spanning every node).
    pub fn new_polled_on(
        cfg: SimConfig,
        mem: Arc<dyn HostMemory>,
        bar0: Arc<RegFile>,
        bar2: Arc<RegFile>,
        wire: &Wire,
        ports: [Option<crate::fabric::PortId>; 2],
    ) -> SimHca {
        Self::build_on(
            cfg,
            Backing::External {
                mem,
                bar0,
                bar2,
                own_thread: false,
            },
            Some((wire, ports)),
        )
    }

    /// Two synchronous models on one new wire, port 1 cabled to port 1
    /// (node GUIDs `a.node_guid` and `b.node_guid` must differ).
    pub fn back_to_back(a: SimConfig, b: SimConfig) -> (SimHca, SimHca, Wire) {
        let w = Wire::new(a.relax_step);
        let x = SimHca::new_on(a, &w);
        let y = SimHca::new_on(b, &w);
        if let (Some(p), Some(q)) = (x.fabric_port(1), y.fabric_port(1)) {
            let _ = w
                .fabric
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .connect(p, q);
        }
        (x, y, w)
    }

    /// The fabric port of HCA port `port`, if the HCA is on a fabric.
    pub fn fabric_port(&self, port: u8) -> Option<crate::fabric::PortId> {
        crate::hca::engine::wire::fabric_port(&self.hca(), port)
    }

    /// A model served by its own thread polling shared register memory.
    pub fn new_threaded(cfg: SimConfig) -> SimHca {
        Self::build(cfg, Backing::Threaded)
    }

    /// A threaded model over someone else's host memory and register
    /// windows (the ivshmem front end: guest RAM and the shared BAR0/BAR2
    /// windows). `dma_pool()` still hands out the (then unused) arena of
    /// `cfg.dma_size` bytes; keep it small.
    pub fn new_over(
        cfg: SimConfig,
        mem: Arc<dyn HostMemory>,
        bar0: Arc<RegFile>,
        bar2: Arc<RegFile>,
    ) -> SimHca {
        Self::build(
            cfg,
            Backing::External {
                mem,
                bar0,
                bar2,
                own_thread: true,
            },
        )
    }

    /// Like [`SimHca::new_over`], but without a model thread: the caller
    /// polls with [`SimHca::poll`] (`cx3-emu` serves every node from one
    /// poll loop).
    pub fn new_polled(
        cfg: SimConfig,
        mem: Arc<dyn HostMemory>,
        bar0: Arc<RegFile>,
        bar2: Arc<RegFile>,
    ) -> SimHca {
        Self::build(
            cfg,
            Backing::External {
                mem,
                bar0,
                bar2,
                own_thread: false,
            },
        )
    }

    /// A model whose registers are trapped access by access (every read and
    /// write is a model call, as in [`SimHca::new`]) over a caller's host
    /// memory, on real monotonic time and without a thread: the vfio-user
    /// front end (`cx3-vfu`, [`crate::front::vfu`]). Set `cfg.hcr_polls` to 0 for a
    /// driver that waits for command-completion events instead of polling
    /// GO; a nonzero `cfg.hcr_delay` completes on [`SimHca::tick`].
    pub fn new_trapped(cfg: SimConfig, mem: Arc<dyn HostMemory>) -> SimHca {
        Self::build(cfg, Backing::Trapped { mem })
    }

    /// [`SimHca::new_trapped`] with its ports on `wire`'s fabric (a
    /// threaded wire: real time on the wire's clock; every register write
    /// settles the wire): `cx3-vfu` serving several functions on one
    /// fabric.
    pub fn new_trapped_on(
        cfg: SimConfig,
        mem: Arc<dyn HostMemory>,
        wire: &Wire,
        ports: [Option<crate::fabric::PortId>; 2],
    ) -> SimHca {
        Self::build_on(cfg, Backing::Trapped { mem }, Some((wire, ports)))
    }

    /// The register file of BAR `bar` (0 or 2) as its accesses reach the
    /// model: trapped calls in synchronous and trapped mode, shared memory
    /// otherwise.
    pub fn registers(&self, bar: u8) -> Option<Arc<dyn RegisterBackend>> {
        match bar {
            0 => Some(self.inner.bar0.clone()),
            2 => Some(self.inner.bar2.clone()),
            _ => None,
        }
    }

    /// A function-level reset (what vfio's device reset asks for): the
    /// device back to power-on, the ownership semaphore released, and the
    /// config space back at once with its power-on values (command register
    /// and BARs cleared; the caller restores them).
    pub fn function_reset(&self) {
        let mut h = self.hca();
        h.reset();
        h.owned = false;
        h.pci.reset(0);
    }

    /// Completes an in-flight command whose time has come (trapped mode
    /// with a nonzero `hcr_delay`: nothing else polls it), and steps the
    /// data-path engines (RNR and retry timers, the fabric).
    pub fn tick(&self) {
        let mut h = self.hca();
        h.try_complete();
        crate::hca::engine::step(&mut h);
    }

    /// Every EQ in hardware ownership as (EQN, interrupt vector from its
    /// context, interrupts raised so far): a front end that delivers
    /// interrupts raises the vector of every EQ whose count moved.
    pub fn eq_interrupts(&self) -> Vec<(u32, u16, u32)> {
        self.hca()
            .eqs
            .iter()
            .map(|(n, e)| (*n, e.intr, e.interrupts))
            .collect()
    }

    /// One polling pass over the shared registers (HCR GO, reset,
    /// doorbells), as the model thread of the threaded mode does it; true if
    /// anything happened. For [`SimHca::new_polled`] models.
    pub fn poll(&self) -> bool {
        self.hca().poll_shared()
    }

    /// The config space (for a front end that publishes its image).
    pub fn config_space(&self) -> Arc<PciConfig> {
        self.inner.pci.clone()
    }

    pub(crate) fn hca(&self) -> MutexGuard<'_, Hca> {
        lock(&self.inner.hca)
    }

    /// The PCI function (config space 15b3:1003, BAR0 1 MiB, BAR2 8 MiB).
    /// Each call builds a fresh function whose BARs can each be claimed once.
    pub fn pci_function(&self) -> PciFunction {
        let cfg: Arc<dyn ConfigSpace> = self.inner.pci.clone();
        let bars = [
            Some(Bar::from_backend(
                self.inner.bar0.clone(),
                BAR0_SIZE as usize,
            )),
            None,
            Some(Bar::from_backend(
                self.inner.bar2.clone(),
                BAR2_SIZE as usize,
            )),
            None,
            None,
            None,
        ];
        PciFunction::new(
            PciAddress {
                bus: 0x03,
                ..Default::default()
            },
            cfg,
            PciConfig::bar_infos(),
            bars,
        )
    }

    /// DMA memory the model reaches by bus address.
    pub fn dma_pool(&self) -> DmaPool {
        DmaPool::new(self.inner.arena.clone())
    }

    /// The model's clock (fake in sync mode, monotonic in threaded mode).
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    /// The fake clock (sync mode only), to advance time by hand.
    pub fn fake_clock(&self) -> Option<Arc<FakeClock>> {
        self.inner.fake_clock.clone()
    }

    /// Every command executed so far.
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.hca().trace.clone()
    }

    /// The trace from entry `index` on (for a front end that streams it).
    pub fn trace_since(&self, index: usize) -> Vec<TraceEntry> {
        let h = self.hca();
        h.trace
            .get(index..)
            .map(<[TraceEntry]>::to_vec)
            .unwrap_or_default()
    }

    /// Number of trace entries (commands posted since the last
    /// [`SimHca::clear_trace`]).
    pub fn trace_len(&self) -> usize {
        self.hca().trace.len()
    }

    /// Forgets the trace.
    pub fn clear_trace(&self) {
        self.hca().trace.clear();
    }

    /// Fault injection.
    pub fn faults(&self) -> Faults {
        Faults(self.inner.hca.clone())
    }

    /// Protocol violations recorded so far.
    pub fn violations(&self) -> Vec<String> {
        self.hca().violations.clone()
    }

    /// DMA faults recorded so far.
    pub fn dma_faults(&self) -> Vec<DmaFault> {
        self.hca().dma_faults.clone()
    }

    /// Takes the violations recorded so far (a front end that streams them
    /// keeps the model's capped log from filling up).
    pub fn take_violations(&self) -> Vec<String> {
        core::mem::take(&mut self.hca().violations)
    }

    /// Takes the DMA faults recorded so far.
    pub fn take_dma_faults(&self) -> Vec<DmaFault> {
        core::mem::take(&mut self.hca().dma_faults)
    }

    /// Raises a catastrophic error (error buffer, LOCAL_CATAS_ERROR EQE,
    /// every later command fails with INTERNAL_ERR until reset).
    pub fn raise_catastrophic_error(&self) {
        self.hca().raise_catastrophic(1);
    }

    /// Test-only cable of an HCA that is not on a fabric (on a [`Wire`],
    /// cables are the fabric's: `Fabric::connect`/`unplug`): plugs (link
    /// up) or unplugs (link down) port `port`'s cable. An active port going
    /// down raises PORT_CHANGE.
    pub fn set_link(&self, port: u8, up: bool) -> bool {
        let mut h = self.hca();
        match h.port_index(u32::from(port)) {
            Some(i) => {
                h.set_cable(i, up);
                true
            }
            None => false,
        }
    }

    /// Sets the physical state as a cable/partner would: `LinkUp` plugs the
    /// cable (the port trains if INIT_PORT was done), anything else unplugs
    /// it and leaves the port in that state.
    pub fn set_port_physical_state(&self, port: u8, s: PhysicalState) -> bool {
        let mut h = self.hca();
        let Some(i) = h.port_index(u32::from(port)) else {
            return false;
        };
        h.set_cable(i, s == PhysicalState::LinkUp);
        if s != PhysicalState::LinkUp && h.ports[i].initialized {
            h.ports[i].phys = s;
        }
        true
    }

    /// An SMP as port `port` receives it from the link on QP0 over VL15
    /// (an SM on the fabric, or a test standing in for one), handed to the
    /// firmware SMA: the same SMA code as MAD_IFC with every check on
    /// (M_Key never ignored, PortState changes only along the IBTA state
    /// machine: Armed from Init, Active from Armed, Down from any state),
    /// so a port becomes Armed and Active only the way an SM makes it so.
    /// Only subnet-management MADs (class 0x01 LID routed, 0x81 directed
    /// route, 256 bytes) are taken; nothing arrives on a port whose link is
    /// not up. Returns the SMA's response (GetResp with the MAD status; the
    /// D bit set on a directed-route response), or why the SMP was dropped.
    /// Unlike the card, the SMP does not pass through the driver's QP0
    /// (mlx4_ib's MAD_IFC and its PortInfo snooping are not involved).
    pub fn sma_receive(&self, port: u8, smp: &[u8]) -> Result<Vec<u8>, SmpDropped> {
        use crate::hca::mad_ifc::{MAD_SIZE, class};
        if smp.len() != MAD_SIZE {
            return Err(SmpDropped::NotAnSmp);
        }
        let cls = smp[1];
        if cls != class::SUBN_LID_ROUTED && cls != class::SUBN_DIRECTED_ROUTE {
            return Err(SmpDropped::NotAnSmp);
        }
        let mut h = self.hca();
        let i = h
            .port_index(u32::from(port))
            .ok_or(SmpDropped::NoSuchPort)?;
        if h.ports[i].phys != PhysicalState::LinkUp {
            return Err(SmpDropped::NoLink);
        }
        // Op_mod 0: M_Key checked. Every refusal the SMA answers with
        // BAD_PKT (bad base version, a response, an M_Key violation) is a
        // silent discard on the wire.
        let mut resp =
            crate::hca::mad_ifc::process(&mut h, i, 0, smp).map_err(|_| SmpDropped::Discarded)?;
        if cls == class::SUBN_DIRECTED_ROUTE && resp[3] == crate::hca::mad_ifc::method::GET_RESP {
            resp[4] |= 0x80;
        }
        Ok(resp)
    }

    /// (logical, physical) state of a port.
    pub fn port_state(&self, port: u8) -> Option<(LogicalState, PhysicalState)> {
        let h = self.hca();
        let i = h.port_index(u32::from(port))?;
        Some((h.ports[i].state, h.ports[i].phys))
    }

    /// The LID of a port.
    pub fn port_lid(&self, port: u8) -> Option<u16> {
        let h = self.hca();
        let i = h.port_index(u32::from(port))?;
        Some(h.ports[i].lid)
    }

    /// Reports a CQ error (async CQ_ERROR EQE; syndrome 1 overrun, 2 access).
    pub fn inject_cq_error(&self, cqn: u32, syndrome: u8) {
        self.hca()
            .post_async(crate::hca::ctx::Event::CqError { cqn, syndrome });
    }

    /// Posts a completion event for `cqn` to its completion EQ, as the CQ
    /// engine does for an armed CQ, without a CQE. False if the CQ is not in
    /// hardware ownership.
    pub fn inject_completion_event(&self, cqn: u32) -> bool {
        let mut h = self.hca();
        let Some(eqn) = h.cqs.get(&cqn).map(|c| c.eqn) else {
            return false;
        };
        h.post_event(eqn, crate::hca::ctx::Event::Completion { cqn });
        true
    }

    /// State of an EQ in hardware ownership.
    pub fn eq(&self, eqn: u32) -> Option<EqState> {
        self.hca().eqs.get(&eqn).cloned()
    }

    /// A send-queue error without a WQE that causes it: a QP in RTS moves to
    /// SQER, from where only SQERR2RTS, 2ERR and 2RST lead. False if the QP
    /// is not in RTS.
    pub fn inject_sq_error(&self, qpn: u32) -> bool {
        let mut h = self.hca();
        match h.qps.get_mut(&qpn) {
            Some(q) if q.state == crate::hca::device::QpState::Rts => {
                q.state = crate::hca::device::QpState::Sqer;
                true
            }
            _ => false,
        }
    }

    /// Writes seen to the clear-interrupt register.
    pub fn clr_int_writes(&self) -> u64 {
        self.hca().clr_int_writes
    }

    /// Arm requests seen on a CQ's doorbell (None if not in hardware
    /// ownership).
    pub fn cq_arms(&self, cqn: u32) -> Option<u32> {
        self.hca().cqs.get(&cqn).map(|c| c.arms)
    }

    /// The EQ async events of `event_type` go to (MAP_EQ).
    pub fn async_eq(&self, event_type: u8) -> Option<u32> {
        self.hca().async_map[usize::from(event_type & 0x3f)]
    }

    /// What the multicast steering counted (UD datagrams to a multicast
    /// LID, in and looped back).
    pub fn mcast_stats(&self) -> crate::hca::engine::mcast::McastStats {
        self.hca().engine.mcast
    }

    /// The member words (QPN | block-loopback bit) of IB multicast group
    /// `mgid` as the card finds them in its MCG table (`None`: no group).
    pub fn mcg_members(&self, mgid: &[u8; 16]) -> Option<Vec<u32>> {
        crate::hca::fw::mcg::members(&mut self.hca(), mgid)
    }

    /// INIT_HCA has been done (and not undone).
    pub fn is_initialized(&self) -> bool {
        self.hca().fw == FwState::Initialized
    }

    /// RUN_FW has been done (and the firmware not stopped or reset).
    pub fn is_running(&self) -> bool {
        self.hca().fw != FwState::Off
    }

    /// Number of 4 KiB ICM pages mapped.
    pub fn icm_mapped_pages(&self) -> usize {
        self.hca().icm.mapped_pages()
    }

    /// Every UAR doorbell seen (a log, capped), as (BAR2 offset, big-endian
    /// value).
    pub fn pending_doorbells(&self) -> Vec<(usize, u32)> {
        self.hca().pending_doorbells.clone()
    }

    /// The configuration in use.
    pub fn config(&self) -> SimConfig {
        let c = &self.inner.cfg;
        SimConfig::assemble(
            self.hca().cfg.clone(),
            c.dma_size,
            c.dma_bus_base,
            c.relax_step,
            c.poll_interval,
        )
    }

    /// What the data-path engines have done so far.
    pub fn engine_stats(&self) -> crate::hca::engine::Stats {
        self.hca().engine.stats
    }

    /// The catastrophic-error buffer's first dword (0 = healthy).
    pub fn catas_syndrome(&self) -> u32 {
        self.hca().bar0.be(crate::hca::regs::CATAS_BASE)
    }
}
