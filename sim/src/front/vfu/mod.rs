//! The vfio-user front end behind `cx3-vfu`.
//!
//! Serves the model as a real PCI function 15b3:1003 to QEMU's `vfio-user-pci`
//! client (protocol from the rust-vmm `vfio_user` crate); vfio-user DMA
//! read/write messages (guest RAM must be shared), migration, dirty-page
//! tracking and several functions per server are not provided.
//!
//! A thin adapter over [`SimHca::new_trapped`]:
//!
//! * **config space** (region 7) is the model's [`PciConfig`] (all ones
//!   while a reset is in progress); sub-dword writes are read-modify-write
//!   with the status register's write-one-to-clear bits left alone;
//! * **BAR0** (region 0) is trapped access by access, so every read is seen
//!   (ownership and reset semaphores, the HCR status dword) and the HCR
//!   protocol is checked exactly; 64-bit stores go to the model as one store
//!   (`bar0_write64`: a 64-bit store into the HCR is a violation), 1- and
//!   2-byte accesses, which the card's registers do not take, are logged
//!   and dropped (reads return all ones);
//! * **BAR2** (region 2, the UAR pages) is by default memory the client maps
//!   into the guest ([`UarPages`]: the region is mmappable, one sparse area
//!   over all of it, backed by our file), so a doorbell is a plain store and
//!   no message; the model polls the doorbell words of its live EQs, CQs
//!   and QPs as cx3-emu's does ([`Function::poll_uar`], adaptively: spin a
//!   few µs after work, then nap, 1 ms naps once idle), and takes what is
//!   there before every BAR0 or config write and before a reset, so a
//!   doorbell still reaches the model before any command the guest issues
//!   after it. With `--trap-uar` BAR2 is trapped as BAR0 is (every doorbell
//!   acted on when its message arrives);
//! * **DMA**: every `dma_map` maps the client's file (guest RAM, which must be
//!   `share=on`) and [`GuestMemory`] serves the model's accesses by I/O
//!   virtual address, which is guest-physical (no vIOMMU); anything outside a
//!   mapping is a DMA fault recorded by the model, never a crash;
//! * **reset** (`VFIO_DEVICE_RESET`, a function-level reset) puts the model
//!   back to power-on, ownership semaphore included;
//! * **interrupts**: INTx (one eventfd, automasked until the client unmasks
//!   it, as vfio's INTx is) and MSI-X with the capability's 128 vectors (the
//!   client emulates the table in BAR0 and hands one eventfd per vector).
//!   After each access the front end looks at every EQ's interrupt count
//!   ([`SimHca::eq_interrupts`]: the model counts an interrupt when it writes
//!   an EQE to an armed EQ) and raises the EQ's vector (its context's `intr`
//!   field) over MSI-X when the client has enabled it, else INTx.
//!
//! Guest memory is in `memory.rs`, the interrupts in `interrupts.rs`; the
//! command line is the host module's ([`crate::front::host::VfuArgs`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hal::{ConfigSpace, RegisterBackend};

use crate::front::host::{
    HostOptions, Log, node_config, parse_vfu_args, pid_alive, process_cpu_time, set_timer_slack_1ns,
};
use crate::front::in_process::{SimConfig, SimHca};
use crate::hca::hcr::Opcode;
use crate::hca::pci::{BAR0_SIZE, BAR2_SIZE, PciConfig};

mod interrupts;
mod memory;

pub use interrupts::Interrupts;
pub use memory::{GuestMemory, UarPages};

/// vfio region indices of a PCI device.
pub mod region {
    /// BAR0.
    pub const BAR0: u32 = 0;
    /// BAR2.
    pub const BAR2: u32 = 2;
    /// Expansion ROM.
    pub const ROM: u32 = 6;
    /// Config space.
    pub const CONFIG: u32 = 7;
    /// VGA.
    pub const VGA: u32 = 8;
    /// Number of regions.
    pub const COUNT: u32 = 9;
}

/// vfio interrupt indices of a PCI device.
pub mod irq {
    /// Legacy INTx.
    pub const INTX: u32 = 0;
    /// MSI.
    pub const MSI: u32 = 1;
    /// MSI-X.
    pub const MSIX: u32 = 2;
    /// Error reporting.
    pub const ERR: u32 = 3;
    /// Device request.
    pub const REQ: u32 = 4;
    /// Number of indices.
    pub const COUNT: u32 = 5;
}

/// MSI-X vectors of the function (the capability's table size + 1).
pub const MSIX_VECTORS: u32 = 128;
/// Config space size served (PCIe: 4 KiB; nothing lives above 0x100).
pub const CONFIG_SIZE: u64 = 4096;

// vfio ABI values (linux/vfio.h), spelled here so the front end's tests need
// no bindings.
const REGION_FLAG_READ: u32 = 1 << 0;
const REGION_FLAG_WRITE: u32 = 1 << 1;
const REGION_FLAG_MMAP: u32 = 1 << 2;
/// PCI command register: Interrupt Disable (INTx).
const PCI_COMMAND_INTX_DISABLE: u32 = 1 << 10;
const IRQ_INFO_EVENTFD: u32 = 1 << 0;
const IRQ_INFO_MASKABLE: u32 = 1 << 1;
const IRQ_INFO_AUTOMASKED: u32 = 1 << 2;
const IRQ_INFO_NORESIZE: u32 = 1 << 3;
const IRQ_SET_DATA_NONE: u32 = 1 << 0;
const IRQ_SET_DATA_BOOL: u32 = 1 << 1;
const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const IRQ_SET_ACTION_MASK: u32 = 1 << 3;
const IRQ_SET_ACTION_UNMASK: u32 = 1 << 4;
const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;

/// The regions the server announces: config, BAR0, BAR2, read/write and
/// trapped; the others are empty.
pub fn regions() -> Vec<vfio_user::ServerRegion> {
    regions_with(None)
}

/// [`regions`], with BAR2 mmappable from `uar` (one sparse area over the
/// whole BAR, file offset 0) when given: the client maps it into the guest
/// and sends no message for its accesses.
pub fn regions_with(uar: Option<&UarPages>) -> Vec<vfio_user::ServerRegion> {
    let mut r = trapped_regions();
    if let Some(u) = uar
        && let Some(bar2) = r.get_mut(region::BAR2 as usize)
    {
        bar2.region_info.flags |= REGION_FLAG_MMAP;
        bar2.sparse_areas = vec![vfio_user::SparseArea {
            area: vfio_bindings::bindings::vfio::vfio_region_sparse_mmap_area {
                offset: 0,
                size: u.len() as u64,
            },
        }];
        bar2.mmap_fd = Some(u.fd());
    }
    r
}

fn trapped_regions() -> Vec<vfio_user::ServerRegion> {
    (0..region::COUNT)
        .map(|index| {
            let size = match index {
                region::CONFIG => CONFIG_SIZE,
                region::BAR0 => BAR0_SIZE,
                region::BAR2 => BAR2_SIZE,
                _ => 0,
            };
            let info = vfio_bindings::bindings::vfio::vfio_region_info {
                argsz: core::mem::size_of::<vfio_bindings::bindings::vfio::vfio_region_info>()
                    as u32,
                flags: if size > 0 {
                    REGION_FLAG_READ | REGION_FLAG_WRITE
                } else {
                    0
                },
                index,
                cap_offset: 0,
                size,
                offset: 0,
            };
            vfio_user::ServerRegion {
                region_info: info,
                sparse_areas: Vec::new(),
                mmap_fd: None,
            }
        })
        .collect()
}

/// The interrupts the server announces: INTx (maskable, automasked), MSI-X
/// (128 vectors), and one error and one request eventfd each, which the
/// client sets up (QEMU warns "Could not enable error recovery" without
/// them) and the function never raises (AER is not modelled); no MSI.
pub fn irqs() -> Vec<vfio_user::IrqInfo> {
    (0..irq::COUNT)
        .map(|index| {
            let (count, flags) = match index {
                irq::INTX => (
                    1,
                    IRQ_INFO_EVENTFD | IRQ_INFO_MASKABLE | IRQ_INFO_AUTOMASKED,
                ),
                irq::MSIX => (MSIX_VECTORS, IRQ_INFO_EVENTFD | IRQ_INFO_NORESIZE),
                irq::ERR | irq::REQ => (1, IRQ_INFO_EVENTFD),
                _ => (0, 0),
            };
            vfio_user::IrqInfo {
                index,
                flags,
                count,
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Options and the command line

/// How the server runs.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Fault injection, trace, exit conditions, statistics.
    pub host: HostOptions,
    /// Model-clock time before GO clears (default 0: at once).
    pub hcr_delay: Duration,
    /// The fabric the functions' ports are cabled to (topology, capture,
    /// latency, packet faults) and its subnet manager (`--sm`,
    /// `--sm-dir`, `--opensm-args`, `--sockname-file`), parsed by the
    /// same code as cx3-emu's.
    pub fabric: Box<crate::fabric::options::FabricOptions>,
    /// How the UAR pages reach the model and how often it looks at them.
    pub poll: PollOptions,
}

/// BAR2 trapped or mapped, and the pace of the loop that polls the mapped
/// UAR pages and the fabric (cx3-emu's, `docs/ivshmem.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollOptions {
    /// BAR2 trapped access by access (`--trap-uar`) instead of mapped.
    pub trap_uar: bool,
    /// Spin this long after the last work.
    pub spin: Duration,
    /// Spin this long after each piece of work while work keeps coming back
    /// within this long of a pause (0: off).
    pub busy_spin: Duration,
    /// Then sleep this long per round.
    pub sleep: Duration,
    /// After this long without work ...
    pub idle_after: Duration,
    /// ... sleep this long per round instead.
    pub idle_sleep: Duration,
}

impl Default for PollOptions {
    /// The command line's defaults.
    fn default() -> PollOptions {
        PollOptions {
            trap_uar: false,
            spin: Duration::from_micros(5),
            busy_spin: Duration::ZERO,
            sleep: Duration::from_micros(20),
            idle_after: Duration::from_millis(100),
            idle_sleep: Duration::from_millis(1),
        }
    }
}

/// The loop's pace: spin `spin` after work (or `busy_spin` while work
/// keeps coming back within it), then nap `sleep`, and `idle_sleep` once
/// nothing has happened for `idle_after`.
struct Pacer {
    o: PollOptions,
    busy_spin: Duration,
    spin_for: Duration,
    last_active: Instant,
}

impl Pacer {
    fn new(o: &PollOptions) -> Pacer {
        Pacer {
            busy_spin: o.busy_spin.max(o.spin),
            spin_for: o.spin,
            o: o.clone(),
            last_active: Instant::now(),
        }
    }

    /// A round found work.
    fn worked(&mut self) {
        let done = Instant::now();
        let gap = done.duration_since(self.last_active);
        if gap > self.busy_spin {
            self.spin_for = self.o.spin;
        } else if gap > self.o.spin {
            self.spin_for = self.busy_spin;
        }
        self.last_active = done;
    }

    /// Spins, yields or sleeps before the next round.
    fn pause(&self) {
        let idle = Instant::now().saturating_duration_since(self.last_active);
        let nap = if idle >= self.o.idle_after {
            self.o.idle_sleep
        } else {
            self.o.sleep
        };
        if idle < self.spin_for {
            core::hint::spin_loop();
        } else if nap.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(nap);
        }
    }
}

/// Full rounds of the fleet's loop (the fabric's clock, the SM, every
/// function's interrupts and reports) come at least this often; the rounds
/// between them poll the mapped UAR pages only.
pub const FULL_ROUND_EVERY: Duration = Duration::from_micros(20);

/// Parses `cx3-vfu`'s command line (without the program name;
/// [`VfuArgs`](crate::front::host::VfuArgs)): the sockets (node 0, 1, ...), the node id of a single
/// socket, and the options.
pub fn parse_args<I, T>(args: I) -> Result<(Vec<std::path::PathBuf>, u32, Options), clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let a = parse_vfu_args(args)?;
    let opts = Options {
        host: a.common.host,
        hcr_delay: a.hcr_delay,
        fabric: Box::new(a.common.fabric.0),
        poll: PollOptions {
            trap_uar: a.trap_uar,
            spin: a.spin,
            busy_spin: a.busy_spin,
            sleep: a.sleep,
            idle_after: a.idle_after,
            idle_sleep: a.idle_sleep,
        },
    };
    Ok((a.sockets, a.node.unwrap_or(0), opts))
}

// ---------------------------------------------------------------------------
// The function

/// Counters for `--stats` and the tests.
#[derive(Debug, Default)]
pub struct Counters {
    /// Config-space accesses.
    pub config: AtomicU64,
    /// BAR0 accesses.
    pub bar0: AtomicU64,
    /// BAR2 accesses (messages: none while the guest maps the UAR pages).
    pub bar2: AtomicU64,
    /// Polls of the mapped UAR pages that took a doorbell.
    pub uar_polls: AtomicU64,
    /// Accesses the function does not take (size, region).
    pub refused: AtomicU64,
    /// DMA maps that came without a file (not guest RAM: ROM, VGA memory);
    /// the device cannot reach them.
    pub unshared_maps: AtomicU64,
}

/// What the server thread and the main thread share.
pub struct Function {
    id: u32,
    hca: SimHca,
    pci: Arc<PciConfig>,
    bar0: Arc<dyn RegisterBackend>,
    bar2: Arc<dyn RegisterBackend>,
    /// BAR2 as memory the guest maps (`None`: trapped, `--trap-uar`).
    uar: Option<UarPages>,
    /// The wire the function's ports are on, if any.
    wire: Option<crate::Wire>,
    mem: Arc<GuestMemory>,
    /// Interrupt state.
    pub irqs: Mutex<Interrupts>,
    report: Mutex<Report>,
    opts: Options,
    /// Access counters.
    pub counters: Counters,
    started: Instant,
    /// The other functions on the fabric: serviced after each access of
    /// this one (a doorbell here may complete work, and raise interrupts,
    /// there).
    peers: std::sync::OnceLock<Vec<std::sync::Weak<Function>>>,
}

#[derive(Default)]
struct Report {
    log: Log,
    trace_next: usize,
    commands: u64,
    violations: u64,
    dma_faults: u64,
    init_at: Option<Instant>,
    catas_done: bool,
    eq_seen: BTreeMap<u32, u32>,
}

/// The model configuration for a vfio-user function: cx3-emu's node GUIDs,
/// GO cleared at once (a driver in event mode waits for the EQE, not GO).
pub fn function_config(node: u32, opts: &Options) -> SimConfig {
    SimConfig {
        hcr_polls: 0,
        hcr_delay: opts.hcr_delay,
        ..node_config(node)
    }
}

impl Function {
    /// A powered-on function for node `id`, on no fabric (its ports see
    /// the model's own cable).
    pub fn new(id: u32, opts: Options, log: Log) -> Arc<Function> {
        let mem = Arc::new(GuestMemory::default());
        let hca = SimHca::new_trapped(function_config(id, &opts), mem.clone());
        Self::with_hca(id, hca, mem, None, opts, log)
    }

    /// A powered-on function for node `id`, its ports those of topology
    /// HCA `at` on `wire`'s fabric (its node GUID the topology's, as
    /// cx3-emu's nodes).
    pub fn on_fabric(
        id: u32,
        opts: Options,
        log: Log,
        wire: &crate::Wire,
        at: &crate::fabric::topology::BuiltHca,
    ) -> Arc<Function> {
        let mem = Arc::new(GuestMemory::default());
        let cfg = SimConfig {
            node_guid: at.node_guid,
            sys_image_guid: at.node_guid + 3,
            ..function_config(id, &opts)
        };
        let hca = SimHca::new_trapped_on(
            cfg,
            mem.clone(),
            wire,
            [Some(at.ports[0]), Some(at.ports[1])],
        );
        Self::with_hca(id, hca, mem, Some(wire.clone()), opts, log)
    }

    fn with_hca(
        id: u32,
        hca: SimHca,
        mem: Arc<GuestMemory>,
        wire: Option<crate::Wire>,
        opts: Options,
        log: Log,
    ) -> Arc<Function> {
        for (op, st) in &opts.host.fail {
            hca.faults()
                .set(*op, crate::hca::faults::OpcodeFault::status(*st));
        }
        let (Some(bar0), Some(bar2)) = (hca.registers(0), hca.registers(2)) else {
            unreachable!("BAR0 and BAR2 exist")
        };
        let mut report = Report {
            log,
            ..Report::default()
        };
        let uar = if opts.poll.trap_uar {
            None
        } else {
            match UarPages::new(BAR2_SIZE as usize) {
                Ok(u) => {
                    // The model's BAR2 is the file the guest maps.
                    let mut h = hca.hca();
                    h.bar2 = u.regs();
                    h.bar2_polled = true;
                    Some(u)
                }
                Err(e) => {
                    report.log.line(format!("node{id}: BAR2 trapped: {e}"));
                    None
                }
            }
        };
        Arc::new(Function {
            id,
            pci: hca.config_space(),
            hca,
            bar0,
            bar2,
            uar,
            wire,
            mem,
            irqs: Mutex::new(Interrupts::default()),
            report: Mutex::new(report),
            opts,
            counters: Counters::default(),
            started: Instant::now(),
            peers: std::sync::OnceLock::new(),
        })
    }

    /// The node id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The model.
    pub fn hca(&self) -> &SimHca {
        &self.hca
    }

    /// Guest memory as mapped by the client.
    pub fn memory(&self) -> &GuestMemory {
        &self.mem
    }

    /// The UAR pages the guest maps (`None` with `--trap-uar`).
    pub fn uar_pages(&self) -> Option<&UarPages> {
        self.uar.as_ref()
    }

    /// The regions to announce for this function: BAR2 mmappable from
    /// its UAR pages unless trapped ([`regions_with`]).
    pub fn regions(&self) -> Vec<vfio_user::ServerRegion> {
        regions_with(self.uar.as_ref())
    }

    /// Takes the doorbells the guest stored into the mapped UAR pages since
    /// the last look (none with `--trap-uar`), then, if there were any,
    /// settles the wire (the packets they sent, their acknowledgements) and
    /// services this function and the others, as a trapped doorbell's
    /// message does; true if there were any.
    pub fn poll_uar(&self) -> bool {
        if self.uar.is_none() {
            return false;
        }
        let took = self.hca.hca().poll_doorbells();
        if took {
            self.counters.uar_polls.fetch_add(1, Ordering::Relaxed);
            match &self.wire {
                Some(w) => w.settle(),
                None => self.hca.tick(),
            }
            self.service();
            self.service_peers();
        }
        took
    }

    /// A config read of `data.len()` bytes at `off`.
    pub fn config_read(&self, off: u64, data: &mut [u8]) -> Result<(), String> {
        self.counters.config.fetch_add(1, Ordering::Relaxed);
        for (i, b) in data.iter_mut().enumerate() {
            let o = off + i as u64;
            if o >= CONFIG_SIZE {
                return Err(format!("config read beyond {CONFIG_SIZE:#x}"));
            }
            let dw = self.pci.read32((o & !3) as u16);
            *b = (dw >> (8 * (o & 3))) as u8;
        }
        Ok(())
    }

    /// A config write; sub-dword writes merge with the current value (the
    /// status register's write-one-to-clear bits are not written back).
    pub fn config_write(&self, off: u64, data: &[u8]) -> Result<(), String> {
        self.counters.config.fetch_add(1, Ordering::Relaxed);
        // Doorbells stored before this write reach the model before it (a
        // doorbell, then bus mastering off: the work runs first).
        self.poll_uar();
        let end = off
            .checked_add(data.len() as u64)
            .filter(|e| *e <= CONFIG_SIZE)
            .ok_or(format!("config write beyond {CONFIG_SIZE:#x}"))?;
        let mut o = off;
        while o < end {
            let base = o & !3;
            let mut dw = self.pci.read32(base as u16);
            if base == 4 {
                dw &= 0x0000_ffff;
            }
            let mut written = false;
            while o < end && o < base + 4 {
                let sh = 8 * (o & 3);
                dw = (dw & !(0xff << sh)) | u32::from(data[(o - off) as usize]) << sh;
                o += 1;
                written = true;
            }
            if written {
                self.pci.write32(base as u16, dw);
            }
        }
        Ok(())
    }

    /// A BAR access of 4 or 8 bytes at `off` (other sizes are refused).
    fn bar_access(&self, bar: u32, off: u64, data: BarData<'_>) -> Result<(), String> {
        let (regs, size, counter) = match bar {
            region::BAR0 => (&self.bar0, BAR0_SIZE, &self.counters.bar0),
            region::BAR2 => (&self.bar2, BAR2_SIZE, &self.counters.bar2),
            _ => return Err(format!("region {bar} has no registers")),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let len = match &data {
            BarData::Read(d) => d.len(),
            BarData::Write(d) => d.len(),
        } as u64;
        let in_bar = off.checked_add(len).is_some_and(|e| e <= size);
        let aligned = (len == 4 || len == 8) && off.is_multiple_of(len);
        if !in_bar || !aligned {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            self.note(format!(
                "BAR{bar} {} of {len} bytes at {off:#x} dropped: the registers take aligned 4- and 8-byte accesses",
                if matches!(data, BarData::Read(_)) {
                    "read"
                } else {
                    "write"
                }
            ));
            if let BarData::Read(d) = data {
                d.fill(0xff);
            }
            return Ok(());
        }
        let o = off as usize;
        if bar == region::BAR2
            && let Some(u) = &self.uar
        {
            self.uar_message(&u.regs(), o, data);
            return Ok(());
        }
        let writes = matches!(data, BarData::Write(_));
        if writes {
            // Doorbells the guest stored before this write reach the model
            // first, as on the card: a command (HW2SW_CQ, 2RST_QP) or a
            // reset after a doorbell finds the doorbell done.
            self.poll_uar();
        }
        let config_seen = self.pci.changes();
        match data {
            BarData::Read(d) => {
                for (k, chunk) in d.chunks_exact_mut(4).enumerate() {
                    chunk.copy_from_slice(&regs.read32(o + 4 * k).to_ne_bytes());
                }
            }
            BarData::Write(d) if d.len() == 8 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(d);
                regs.write64(o, u64::from_ne_bytes(b));
            }
            BarData::Write(d) => {
                let mut b = [0u8; 4];
                b.copy_from_slice(d);
                regs.write32(o, u32::from_ne_bytes(b));
            }
        }
        if writes
            && self.pci.changes() != config_seen
            && let Some(u) = &self.uar
        {
            // A software reset (the only BAR write that moves the config
            // space) forgets doorbells not yet taken.
            u.clear();
        }
        self.service();
        self.service_peers();
        Ok(())
    }

    /// A BAR2 access that came as a message although the UAR pages are
    /// mapped (a client that does not map them, or maps part): the store
    /// lands in the pages as a mapped store would (the next poll takes it),
    /// the load reads them.
    fn uar_message(&self, regs: &crate::hca::regs::RegFile, o: usize, data: BarData<'_>) {
        if !self.pci.memory_enabled() {
            self.hca.hca().violation(format!(
                "BAR2 access at {o:#x} with memory decoding disabled"
            ));
            if let BarData::Read(d) = data {
                d.fill(0xff);
            }
            return;
        }
        match data {
            BarData::Read(d) => {
                for (k, chunk) in d.chunks_exact_mut(4).enumerate() {
                    chunk.copy_from_slice(&regs.raw(o + 4 * k).to_ne_bytes());
                }
            }
            BarData::Write(d) => {
                // The high dword first: a CQ doorbell's consumer index is in
                // place when the poll swaps its command dword.
                for (k, chunk) in d.chunks_exact(4).enumerate().rev() {
                    let mut b = [0u8; 4];
                    b.copy_from_slice(chunk);
                    regs.set_raw(o + 4 * k, u32::from_ne_bytes(b));
                }
            }
        }
        self.poll_uar();
    }

    /// Services the other functions on the fabric (see `peers`).
    fn service_peers(&self) {
        for p in self.peers.get().into_iter().flatten() {
            if let Some(p) = p.upgrade() {
                p.service();
            }
        }
    }

    fn note(&self, s: String) {
        let mut r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        r.violations += 1;
        let id = self.id;
        r.log.line(format!("node{id}: violation: {s}"));
    }

    /// After every access (and periodically): deliver interrupts the model
    /// raised, stream the trace, violations and DMA faults, complete a
    /// delayed command, raise a planned catastrophic error.
    pub fn service(&self) {
        if !self.opts.hcr_delay.is_zero() {
            self.hca.tick();
        }
        let mut r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        let eqs = self.hca.eq_interrupts();
        let mut raise = Vec::new();
        for (eqn, vector, count) in &eqs {
            let seen = r.eq_seen.insert(*eqn, *count).unwrap_or(0);
            if *count != seen && *count > 0 {
                raise.push(*vector);
            }
        }
        if r.eq_seen.len() != eqs.len() {
            r.eq_seen.retain(|n, _| eqs.iter().any(|(e, _, _)| e == n));
        }
        {
            // The command register's Interrupt Disable bit (all ones during
            // a reset: disabled).
            let intx_disabled = self.pci.read32(4) & PCI_COMMAND_INTX_DISABLE != 0;
            let mut irqs = self.irqs.lock().unwrap_or_else(|e| e.into_inner());
            irqs.set_intx_disabled(intx_disabled);
            for v in raise {
                irqs.raise(v);
            }
        }
        self.report_locked(&mut r);
        if let (Some(after), Some(at)) = (self.opts.host.catas_after, r.init_at)
            && !r.catas_done
            && at.elapsed() >= after
        {
            r.catas_done = true;
            self.hca.raise_catastrophic_error();
            let id = self.id;
            r.log.line(format!(
                "node{id}: catastrophic error raised ({after:?} after INIT_HCA)"
            ));
            drop(r);
            self.service();
        }
    }

    fn report_locked(&self, r: &mut Report) {
        let id = self.id;
        let len = self.hca.trace_len();
        if len > r.trace_next {
            let entries = self.hca.trace_since(r.trace_next);
            let n = entries.len();
            for (k, e) in entries.into_iter().enumerate() {
                if e.duration.is_none() && k + 1 == n {
                    break;
                }
                r.trace_next += 1;
                r.commands += 1;
                if self.opts.host.trace {
                    r.log.line(format!("node{id}: {e}"));
                }
                if e.op() == Opcode::INIT_HCA && e.ok() && r.init_at.is_none() {
                    r.init_at = Some(Instant::now());
                }
            }
            if r.trace_next == len && len >= 4096 {
                self.hca.clear_trace();
                r.trace_next = 0;
            }
        }
        for v in self.hca.take_violations() {
            r.violations += 1;
            r.log.line(format!("node{id}: violation: {v}"));
        }
        for f in self.hca.take_dma_faults() {
            r.dma_faults += 1;
            r.log.line(format!("node{id}: DMA fault: {f}"));
        }
    }

    /// Commands served, violations and DMA faults seen.
    pub fn counts(&self) -> (u64, u64, u64) {
        let r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        (r.commands, r.violations, r.dma_faults)
    }

    /// Lines logged so far (with [`Log::capture`]).
    pub fn log_lines(&self) -> Vec<String> {
        let r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        r.log.lines().to_vec()
    }

    /// A function-level reset: the model back to power-on (registers,
    /// firmware, objects, ownership), config space restored at once, every
    /// interrupt disabled.
    pub fn reset(&self) {
        // Doorbells stored before the reset were the card's; taken first,
        // then forgotten with everything else.
        self.poll_uar();
        // The rest under the report lock, which `service` holds throughout:
        // another function's thread servicing this one must not find it
        // half reset (the command register cleared, so INTx no longer
        // disabled, while the interrupts still hold the client's eventfds
        // and a held INTx).
        let mut r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        self.hca.function_reset();
        if let Some(u) = &self.uar {
            u.clear();
        }
        self.irqs.lock().unwrap_or_else(|e| e.into_inner()).reset();
        r.eq_seen.clear();
        self.report_locked(&mut r);
    }

    /// The `--stats` text.
    pub fn stats(&self) -> String {
        let (c, v, d) = self.counts();
        let irqs = self.irqs.lock().unwrap_or_else(|e| e.into_inner());
        let wall = self.started.elapsed().as_secs_f64();
        let cpu = process_cpu_time().as_secs_f64();
        let pct = if wall > 0.0 { 100.0 * cpu / wall } else { 0.0 };
        format!(
            "node{}: commands {c}, violations {v}, DMA faults {d}\n\
             node{}: accesses: config {}, BAR0 {}, BAR2 {} ({}), refused {}; interrupts: INTx {}, MSI-X {}, lost {}\n\
             total: CPU {cpu:.3} s over {wall:.3} s wall ({pct:.1}%)\n",
            self.id,
            self.id,
            self.counters.config.load(Ordering::Relaxed),
            self.counters.bar0.load(Ordering::Relaxed),
            self.counters.bar2.load(Ordering::Relaxed),
            match &self.uar {
                Some(_) => format!(
                    "mapped: {} polls took doorbells",
                    self.counters.uar_polls.load(Ordering::Relaxed)
                ),
                None => "trapped".into(),
            },
            self.counters.refused.load(Ordering::Relaxed),
            irqs.delivered.0,
            irqs.delivered.1,
            irqs.lost,
        )
    }
}

enum BarData<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// The [`vfio_user::ServerBackend`] over a [`Function`].
pub struct Backend(pub Arc<Function>);

fn io_err(s: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, s)
}

impl vfio_user::ServerBackend for Backend {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> std::io::Result<()> {
        match region {
            region::CONFIG => self.0.config_read(offset, data),
            region::BAR0 | region::BAR2 => self.0.bar_access(region, offset, BarData::Read(data)),
            _ => Err(format!("read of empty region {region}")),
        }
        .map_err(io_err)
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> std::io::Result<()> {
        match region {
            region::CONFIG => self.0.config_write(offset, data),
            region::BAR0 | region::BAR2 => self.0.bar_access(region, offset, BarData::Write(data)),
            _ => Err(format!("write to empty region {region}")),
        }
        .map_err(io_err)
    }

    fn dma_map(
        &mut self,
        _flags: vfio_user::DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> std::io::Result<()> {
        let Some(fd) = fd else {
            // Memory the client cannot share (ROM, VGA RAM, ...): never a
            // DMA target of this function; an access there stays a fault.
            self.0
                .counters
                .unshared_maps
                .fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        self.0.mem.map(address, size, &fd, offset).map_err(|e| {
            self.0.note(e.clone());
            io_err(e)
        })
    }

    fn dma_unmap(
        &mut self,
        _flags: vfio_user::DmaUnmapFlags,
        address: u64,
        size: u64,
    ) -> std::io::Result<()> {
        self.0.mem.unmap(address, size);
        Ok(())
    }

    fn reset(&mut self) -> std::io::Result<()> {
        self.0.reset();
        Ok(())
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> std::io::Result<()> {
        let r = self
            .0
            .irqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set(index, flags, start, count, fds);
        r.map_err(|e| {
            self.0.note(e.clone());
            io_err(e)
        })?;
        // An interrupt that arrived before its vector was set up is not
        // replayed (the card's would be lost too), but a pending INTx is.
        self.0.service();
        Ok(())
    }
}

/// Why [`serve`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The client disconnected (or the connection failed).
    ClientGone,
    /// The stop flag was set (a signal).
    Stopped,
    /// The parent process is gone.
    ParentGone,
    /// Every watched process is gone.
    PidsGone,
}

/// Serves `f` on `server` until the client goes, `stop` is set, or the
/// watched processes are gone. The connection runs on its own thread; this
/// one polls the mapped UAR pages (paced as [`Fleet::serve`]), and watches
/// and services the function every 10 ms.
pub fn serve(f: &Arc<Function>, server: vfio_user::Server, stop: &AtomicBool) -> Exit {
    let done = Arc::new(AtomicBool::new(false));
    let (f2, d2) = (f.clone(), done.clone());
    let id = f.id;
    let spawned = std::thread::Builder::new()
        .name("cx3-vfu".into())
        .spawn(move || {
            let mut backend = Backend(f2.clone());
            if let Err(e) = server.run(&mut backend) {
                let mut r = f2.report.lock().unwrap_or_else(|e| e.into_inner());
                r.log
                    .line(format!("node{id}: vfio-user connection ended: {e}"));
            }
            d2.store(true, Ordering::Release);
        });
    if let Err(e) = spawned {
        let mut r = f.report.lock().unwrap_or_else(|e| e.into_inner());
        r.log
            .line(format!("node{id}: cannot start the server thread: {e}"));
        return Exit::ClientGone;
    }
    let parent = std::os::unix::process::parent_id();
    set_timer_slack_1ns();
    let mut pacer = Pacer::new(&f.opts.poll);
    let mut next_check = Instant::now();
    loop {
        if stop.load(Ordering::Acquire) {
            return Exit::Stopped;
        }
        if done.load(Ordering::Acquire) {
            f.service();
            return Exit::ClientGone;
        }
        if f.poll_uar() {
            pacer.worked();
        }
        let now = Instant::now();
        if now >= next_check {
            next_check = now + Duration::from_millis(10);
            if f.opts.host.exit_with_parent && std::os::unix::process::parent_id() != parent {
                return Exit::ParentGone;
            }
            if !f.opts.host.watch_pids.is_empty()
                && f.opts.host.watch_pids.iter().all(|p| !pid_alive(*p))
            {
                return Exit::PidsGone;
            }
            f.service();
        }
        if f.uar.is_some() {
            pacer.pause();
        } else {
            std::thread::sleep(next_check.saturating_duration_since(now));
        }
    }
}

/// Several functions on one fabric with its subnet manager: what
/// `cx3-vfu` serves (one vfio-user socket per function). Node i is HCA i
/// of the topology the fabric options describe, as in cx3-emu.
pub struct Fleet {
    functions: Vec<Arc<Function>>,
    wire: crate::Wire,
    sm: Option<crate::fabric::ibsim::SmService>,
    clock: Arc<dyn hal::Clock>,
    opts: Options,
    started: Instant,
    /// OpenSM's directory when it is the default temporary one (removed
    /// with OpenSM's stop).
    temp_dir: Option<std::path::PathBuf>,
}

impl Fleet {
    /// Builds the fabric, `n` functions (ids `first_id..`) on it, and the
    /// SM: OpenSM through the ibsim server (started here, a child of this
    /// process), the embedded SM, or none (the server alone, for diags).
    /// `log(id)` is each function's log.
    pub fn open(
        n: usize,
        first_id: u32,
        opts: Options,
        mut log: impl FnMut(u32) -> Log,
    ) -> Result<Fleet, String> {
        if n == 0 {
            return Err("no function to serve".into());
        }
        // Unique per fleet (the ibsim sockets are abstract names).
        static FLEETS: AtomicU64 = AtomicU64::new(0);
        let tag = match FLEETS.fetch_add(1, Ordering::Relaxed) {
            0 => std::process::id().to_string(),
            k => format!("{}-{k}", std::process::id()),
        };
        let mut fo = (*opts.fabric).clone();
        let mut temp_dir = None;
        if fo.sm_dir.is_none() {
            let t = std::env::temp_dir().join(format!("cx3-vfu-{tag}"));
            fo.sm_dir = Some(t.join("opensm"));
            temp_dir = Some(t);
        }
        let mut fabric = crate::fabric::Fabric::new();
        let built = fo.build(&mut fabric, n)?;
        let sm = fo.start_sm(&mut fabric, &built, &format!("cx3-vfu-{tag}"))?;
        let wire = crate::Wire::threaded(Arc::new(Mutex::new(fabric)));
        let mut functions = Vec::with_capacity(n);
        for (i, at) in built.hcas.iter().take(n).enumerate() {
            let id = first_id + i as u32;
            functions.push(Function::on_fabric(id, opts.clone(), log(id), &wire, at));
        }
        if functions.len() != n {
            return Err(format!(
                "the topology has {} HCAs for {n} nodes",
                functions.len()
            ));
        }
        for f in &functions {
            let others = functions
                .iter()
                .filter(|g| !Arc::ptr_eq(f, g))
                .map(Arc::downgrade)
                .collect();
            let _ = f.peers.set(others);
        }
        let clock = functions[0].hca.clock();
        Ok(Fleet {
            functions,
            wire,
            sm,
            clock,
            opts,
            started: Instant::now(),
            temp_dir,
        })
    }

    /// The functions, node 0 first.
    pub fn functions(&self) -> &[Arc<Function>] {
        &self.functions
    }

    /// The fabric.
    pub fn fabric(&self) -> crate::fabric::SharedFabric {
        self.wire.fabric()
    }

    /// OpenSM's log, when OpenSM runs.
    pub fn opensm_log(&self) -> Option<std::path::PathBuf> {
        let s = self.sm.as_ref()?;
        s.opensm_pid().map(|_| s.opensm_log())
    }

    /// The ibsim socket name diags attach to (`IBSIM_SOCKNAME`).
    pub fn ibsim_sockname(&self) -> Option<String> {
        self.sm.as_ref().map(|s| s.server.base().to_string())
    }

    /// One round: the model's timers and the fabric's packets, the SM and
    /// the ibsim server, interrupts and reports of every function; true if
    /// anything moved.
    pub fn poll_round(&mut self) -> bool {
        let mut active = self.wire.step(false);
        let now = self.clock.now_ns();
        {
            let fabric = self.wire.fabric();
            let mut f = fabric.lock().unwrap_or_else(|e| e.into_inner());
            f.advance(now);
            if let Some(sm) = self.sm.as_mut() {
                active |= sm.poll(&mut f, now) > 0;
            }
        }
        active |= self.wire.step(false);
        for f in &self.functions {
            f.service();
        }
        active
    }

    /// Serves one function per server (node i on `servers[i]`) until every
    /// client has gone, `stop` is set, or the watched processes are gone;
    /// then stops OpenSM. Each connection runs on its own thread; this one
    /// polls the mapped UAR pages and the fabric at the pace of
    /// [`PollOptions`] (spin 5 µs after work, then 20 µs naps, 1 ms naps
    /// once idle for 100 ms; a full round at most every
    /// [`FULL_ROUND_EVERY`]).
    pub fn serve(&mut self, servers: Vec<vfio_user::Server>, stop: &AtomicBool) -> Exit {
        set_timer_slack_1ns();
        let mut done = Vec::new();
        for (f, server) in self.functions.iter().zip(servers) {
            let d = Arc::new(AtomicBool::new(false));
            done.push(d.clone());
            let f2 = f.clone();
            let id = f.id;
            let spawned = std::thread::Builder::new()
                .name(format!("cx3-vfu-node{id}"))
                .spawn(move || {
                    let mut backend = Backend(f2.clone());
                    if let Err(e) = server.run(&mut backend) {
                        let mut r = f2.report.lock().unwrap_or_else(|e| e.into_inner());
                        r.log
                            .line(format!("node{id}: vfio-user connection ended: {e}"));
                    }
                    // The guest is gone (powered off): its card goes back to
                    // power-on, so its ports close and its links go down for
                    // the rest of the fabric, as a powered-off host's would.
                    f2.reset();
                    d.store(true, Ordering::Release);
                });
            if let Err(e) = spawned {
                f.note(format!("cannot start the server thread: {e}"));
                return Exit::ClientGone;
            }
        }
        let parent = std::os::unix::process::parent_id();
        let mut pacer = Pacer::new(&self.opts.poll);
        let mut next_check = Instant::now();
        let mut next_full = Instant::now();
        let why = loop {
            if stop.load(Ordering::Acquire) {
                break Exit::Stopped;
            }
            // Light rounds: the mapped UAR pages of every function (a
            // doorbell's work, its packets and interrupts are done within
            // the round that finds it); full rounds every FULL_ROUND_EVERY.
            let mut active = false;
            for f in &self.functions {
                active |= f.poll_uar();
            }
            let now = Instant::now();
            if now >= next_full {
                next_full = now + FULL_ROUND_EVERY;
                active |= self.poll_round();
            }
            if active {
                pacer.worked();
            }
            if done.iter().all(|d| d.load(Ordering::Acquire)) {
                break Exit::ClientGone;
            }
            if now >= next_check {
                next_check = now + Duration::from_millis(20);
                if self.opts.host.exit_with_parent && std::os::unix::process::parent_id() != parent
                {
                    break Exit::ParentGone;
                }
                if !self.opts.host.watch_pids.is_empty()
                    && self.opts.host.watch_pids.iter().all(|p| !pid_alive(*p))
                {
                    break Exit::PidsGone;
                }
            }
            pacer.pause();
        };
        self.stop_sm();
        for f in &self.functions {
            f.service();
        }
        why
    }

    /// Ends OpenSM (serving its DISCONNECT) and removes the socket-name
    /// file; idempotent.
    pub fn stop_sm(&mut self) {
        if let Some(mut sm) = self.sm.take() {
            let now = self.clock.now_ns();
            let fabric = self.wire.fabric();
            let mut f = fabric.lock().unwrap_or_else(|e| e.into_inner());
            sm.stop(&mut f, now);
        }
        if let Some(d) = self.temp_dir.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// The `--stats` text: every function's, then the fabric's.
    pub fn stats(&self) -> String {
        let mut s = String::new();
        for f in &self.functions {
            let t = f.stats();
            // One total line at the end instead of one per function.
            for line in t.lines().filter(|l| !l.starts_with("total:")) {
                s.push_str(line);
                s.push('\n');
            }
        }
        if let Ok(f) = self.wire.fabric().lock() {
            s.push_str(&format!("fabric: {:?}\n", f.stats()));
        }
        let wall = self.started.elapsed().as_secs_f64();
        let cpu = process_cpu_time().as_secs_f64();
        let pct = if wall > 0.0 { 100.0 * cpu / wall } else { 0.0 };
        let (mut c, mut v, mut d) = (0, 0, 0);
        for f in &self.functions {
            let (fc, fv, fd) = f.counts();
            c += fc;
            v += fv;
            d += fd;
        }
        s.push_str(&format!(
            "total: commands {c}, violations {v}, DMA faults {d}; CPU {cpu:.3} s over {wall:.3} s wall ({pct:.1}%)\n"
        ));
        s
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop_sm();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::options::SmChoice;

    #[test]
    fn config_space_bytes_and_rmw_keep_status_bits() {
        let f = Function::new(0, Options::default(), Log::capture());
        let mut b = [0u8; 2];
        f.config_read(0, &mut b).unwrap();
        assert_eq!(u16::from_le_bytes(b), 0x15b3);
        f.config_read(2, &mut b).unwrap();
        assert_eq!(u16::from_le_bytes(b), 0x1003);
        let mut one = [0u8; 1];
        f.config_read(0x34, &mut one).unwrap();
        assert_eq!(one[0], 0x40, "capability list");
        // A 2-byte command write enables memory and bus mastering.
        f.config_write(4, &6u16.to_le_bytes()).unwrap();
        assert!(f.pci.memory_enabled() && f.pci.bus_master());
        assert!(f.config_read(0xfff, &mut b).is_err());
        assert!(f.config_write(0xfff, &b).is_err());
        // Odd-sized BAR accesses are refused and logged.
        let mut three = [0u8; 2];
        f.bar_access(region::BAR0, 0x8_069c, BarData::Read(&mut three))
            .unwrap();
        assert_eq!(three, [0xff, 0xff]);
        assert_eq!(f.counters.refused.load(Ordering::Relaxed), 1);
        assert!(f.log_lines().iter().any(|l| l.contains("dropped")));
    }

    #[test]
    fn a_fleet_puts_every_function_on_one_fabric_with_its_sm() {
        use crate::fabric::options::{FabricOptions, TopologyChoice};
        let dir = std::env::temp_dir().join(format!("cx3-vfu-fleet-{}", std::process::id()));
        let sockname = dir.join("sockname");
        let with = |sm: SmChoice, topology: TopologyChoice| Options {
            fabric: Box::new(FabricOptions {
                sm,
                topology,
                sm_dir: Some(dir.join("opensm")),
                sockname_file: Some(sockname.clone()),
                ..FabricOptions::default()
            }),
            ..Options::default()
        };
        let open = |o| Fleet::open(3, 0, o, |_| Log::capture());
        let fleet = open(with(SmChoice::None, TopologyChoice::Switch)).unwrap();
        let fabric = fleet.fabric();
        for (i, f) in fleet.functions().iter().enumerate() {
            assert_eq!(f.id(), i as u32);
            assert_eq!(
                f.hca().config().node_guid,
                crate::fabric::topology::hca_guid(i),
                "the topology's GUIDs, as cx3-emu's nodes"
            );
            let p = f.hca().fabric_port(1).expect("port 1 on the fabric");
            let f = fabric.lock().unwrap();
            assert_eq!(f.port_name(f.peer(p).unwrap()), format!("sw0/{}", i + 1));
        }
        // The ibsim server runs (for diags) and its SM host is on the switch.
        let base = fleet.ibsim_sockname().expect("the ibsim server runs");
        assert_eq!(std::fs::read_to_string(&sockname).unwrap().trim(), base);
        assert!(fleet.opensm_log().is_none(), "--sm none starts no OpenSM");
        drop(fleet);
        assert!(
            !sockname.exists(),
            "the socket-name file goes with the fleet"
        );

        // The embedded SM sits on the switch.
        let fleet = open(with(SmChoice::Embedded, TopologyChoice::Switch)).unwrap();
        assert!(fleet.fabric().lock().unwrap().sm().is_some());
        drop(fleet);

        // OpenSM needs a switch for its host.
        let err = Fleet::open(
            2,
            0,
            with(SmChoice::OpenSm, TopologyChoice::BackToBack),
            |_| Log::capture(),
        )
        .err()
        .unwrap();
        assert!(err.contains("needs a switch"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn command_line() {
        let args = |s: &str| parse_args(s.split_whitespace());
        let Ok((sockets, node, opts)) = args(
            "--socket /tmp/x.sock --node 2 --fail RUN_FW --fail 0x3=BAD_PARAM --trace --stats \
             --exit-with-parent --watch-pid 7 --catas-after 0.5 --hcr-delay-us=100",
        ) else {
            panic!("parses");
        };
        assert_eq!(sockets, vec![std::path::PathBuf::from("/tmp/x.sock")]);
        assert_eq!(opts.fabric.sm, SmChoice::OpenSm, "OpenSM by default");
        assert_eq!(node, 2);
        assert_eq!(opts.host.fail.len(), 2);
        assert!(opts.host.trace && opts.host.stats && opts.host.exit_with_parent);
        assert_eq!(opts.host.watch_pids, vec![7]);
        assert_eq!(opts.hcr_delay, Duration::from_micros(100));
        assert!(
            matches!(args("--help"), Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp)
        );
        // Several sockets on one fabric, the fabric's options and the SM.
        let Ok((sockets, _, opts)) = args(
            "--socket a --socket b --socket c --latency 2us --drop every=5 --sm embedded \
             --sm-dir /tmp/o --capture /tmp/c.pcap --opensm-args -s,3",
        ) else {
            panic!("parses");
        };
        assert_eq!(sockets.len(), 3);
        assert_eq!(opts.fabric.sm, SmChoice::Embedded);
        assert_eq!(opts.fabric.latency_ns, Some(2000));
        assert_eq!(opts.fabric.sm_dir, Some("/tmp/o".into()));
        assert_eq!(
            opts.fabric.opensm_args,
            Some(vec!["-s".to_string(), "3".to_string()])
        );
        assert_eq!(opts.poll, PollOptions::default(), "UAR pages mapped");
        // The UAR pages trapped, and the polling pace (cx3-emu's options).
        let Ok((_, _, opts)) = args(
            "--socket a --trap-uar --spin-us 0 --busy-spin-us 50 --sleep-us 100 \
             --idle-after-ms 7 --idle-sleep-us=300",
        ) else {
            panic!("parses");
        };
        assert_eq!(
            opts.poll,
            PollOptions {
                trap_uar: true,
                spin: Duration::ZERO,
                busy_spin: Duration::from_micros(50),
                sleep: Duration::from_micros(100),
                idle_after: Duration::from_millis(7),
                idle_sleep: Duration::from_micros(300),
            }
        );
        let Ok((_, _, opts)) = args("--socket a --embedded-sm") else {
            panic!("parses");
        };
        assert_eq!(opts.fabric.sm, SmChoice::Embedded);
        let Ok((_, _, opts)) = args("--socket a --sm none") else {
            panic!("parses");
        };
        assert_eq!(opts.fabric.sm, SmChoice::None);
        for bad in [
            "",
            "--socket",
            "--socket x --node 300",
            "--socket x --fail NOPE",
            "--socket x --bogus",
            "--socket x --trace=1",
            "--socket x --watch-pid 0",
            "--socket x --socket x",
            "--socket x --socket y --node 1",
            "--socket x --sm osm",
            "--socket x --sm none --embedded-sm",
            "--socket x --sm-dir",
            "--socket x --latency soon",
            "--socket x --idle-sleep-us 6000",
            "--socket x --trap-uar=1",
        ] {
            assert!(args(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
