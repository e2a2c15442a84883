//! The ivshmem front end behind `cx3-emu`.
//!
//! Serves the model to QEMU guests through two shared files per guest, exactly as
//! `docs/ivshmem.md` (the contract with the kernel's `ivshmem.rs`) lays them out;
//! ivshmem doorbells and interrupts (ivshmem-plain has none) and MSI-X delivery are
//! not modelled.
//!
//! * The **window** (16 MiB): a header, the config-space image, and BAR0 and
//!   BAR2, which *are* the model's register files ([`RegFile::from_shared`]
//!   over the mapping; no copying).
//! * The **guest RAM** file: [`GuestRam`] implements [`HostMemory`] with the
//!   q35 bus-address rule ([`gpa_to_offset`]); anything else is a DMA fault.
//!
//! [`Emulator`] serves every node from one thread: each round syncs the
//! config image both ways, polls the model ([`SimHca::poll`]), streams the
//! trace, violations and DMA faults to stderr, bumps the heartbeat, and
//! raises a planned catastrophic error (once per node, `--catas-after` after
//! its first successful INIT_HCA). [`Emulator::run`] polls adaptively
//! (spin a few µs after work, or with `--busy-spin-us N` N µs while work
//! keeps coming back within N µs of a pause, then sleep 20 µs with 1 ns
//! timer slack, and
//! 1 ms per round once nothing has happened for 100 ms) until every guest
//! has shut down, a signal arrives, or a watched process is gone. The deep
//! idle step exists because 20 µs naps alone cost half a core on a 2-vCPU
//! VM (measured: 50% with idle guests; 2% with the idle step).
//!
//! One thread for all nodes, not one per node: on the 2-core machines this
//! runs on, every extra poller is another wake-up competing with the spinning
//! TCG vCPUs, and a round over two idle nodes costs well under a
//! microsecond.

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use hal::ConfigSpace;
use memmap2::MmapRaw;

use crate::front::host::{
    HostOptions, Log, node_config, parse_emu_args, pid_alive, process_cpu_time, set_timer_slack_1ns,
};
use crate::front::in_process::{SimConfig, SimHca};
use crate::hca::hcr::Opcode;
use crate::hca::mem::{DmaFault, DmaFaultKind, HostMemory};
use crate::hca::pci::PciConfig;
use crate::hca::regs::RegFile;

/// `C X 3 E` as a little-endian dword.
pub const MAGIC: u32 = 0x4533_5843;
/// Contract version.
pub const VERSION: u32 = 1;
/// Window size.
pub const WINDOW_LEN: usize = 16 << 20;
/// Config-space image offset in the window.
pub const CONFIG_OFF: usize = 0x1000;
/// Config-space image size.
pub const CONFIG_LEN: usize = 0x1000;
/// Dwords of the image synced every round (the rest is static).
pub const CONFIG_SYNC_DWORDS: usize = 64;
/// BAR0 offset in the window.
pub const BAR0_OFF: usize = 0x10_0000;
/// BAR0 length.
pub const BAR0_LEN: usize = 0x10_0000;
/// BAR2 offset in the window.
pub const BAR2_OFF: usize = 0x80_0000;
/// BAR2 length.
pub const BAR2_LEN: usize = 0x80_0000;

/// Header field offsets (little-endian).
pub mod hdr {
    /// u32 magic, written last.
    pub const MAGIC: usize = 0x00;
    /// u32 version.
    pub const VERSION: usize = 0x04;
    /// u32 node id.
    pub const NODE: usize = 0x08;
    /// u32 number of nodes.
    pub const NODES: usize = 0x0c;
    /// u32 config image offset.
    pub const CONFIG_OFF: usize = 0x10;
    /// u32 BAR0 offset.
    pub const BAR0_OFF: usize = 0x14;
    /// u32 BAR0 length.
    pub const BAR0_LEN: usize = 0x18;
    /// u32 BAR2 offset.
    pub const BAR2_OFF: usize = 0x1c;
    /// u32 BAR2 length.
    pub const BAR2_LEN: usize = 0x20;
    /// u64 guest RAM size.
    pub const RAM_SIZE: usize = 0x28;
    /// u64 low-memory split.
    pub const LOWMEM: usize = 0x30;
    /// u64 heartbeat.
    pub const HEARTBEAT: usize = 0x38;
    /// u32 guest state (written by the guest).
    pub const GUEST_STATE: usize = 0x40;
}

/// The busy loop's full rounds (SM sockets, reports, the model's config
/// image published without a guest write) come at least this often; the
/// rounds between them poll the models only.
pub const FULL_ROUND_EVERY: Duration = Duration::from_micros(20);

/// Guest state: shut down (the emulator may exit once every guest says so).
pub const GUEST_SHUT_DOWN: u32 = 3;

/// q35 keeps all RAM below 4 GiB while it is smaller than this.
pub const Q35_LOWMEM_LIMIT: u64 = 0xb000_0000;
/// q35's low-memory size when RAM does not fit below the PCI hole.
pub const Q35_SPLIT: u64 = 0x8000_0000;
const FOUR_GIB: u64 = 1 << 32;
/// No DMA below 1 MiB (VGA and PAM windows).
pub const DMA_FLOOR: u64 = 0x10_0000;

/// The low-memory split q35 uses for `ram` bytes of guest RAM.
pub fn lowmem(ram: u64) -> u64 {
    if ram < Q35_LOWMEM_LIMIT {
        ram
    } else {
        Q35_SPLIT
    }
}

/// The RAM-file offset of the bus (guest-physical) range `[gpa, gpa + len)`
/// for a q35 guest with `ram` bytes, or `None` if any of it is outside RAM
/// (below 1 MiB, in the PCI hole, beyond the end).
pub fn gpa_to_offset(ram: u64, gpa: u64, len: u64) -> Option<u64> {
    let end = gpa.checked_add(len)?;
    if gpa < DMA_FLOOR {
        return None;
    }
    let low = lowmem(ram);
    if end <= low {
        return Some(gpa);
    }
    let high_end = FOUR_GIB.checked_add(ram.checked_sub(low)?)?;
    if gpa >= FOUR_GIB && end <= high_end {
        return Some(gpa - FOUR_GIB + low);
    }
    None
}

/// Why the emulator could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmuError(pub String);

impl core::fmt::Display for EmuError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EmuError {}

/// A file mapped shared, read-write, accessed by bounds-checked atomics and
/// byte copies (the other side is another process).
pub struct SharedFile {
    map: MmapRaw,
    path: PathBuf,
}

impl SharedFile {
    /// Maps `path` (which must exist) read-write and shared.
    pub fn open(path: &Path) -> Result<SharedFile, EmuError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| EmuError(format!("{}: cannot open: {e}", path.display())))?;
        let len = file
            .metadata()
            .map_err(|e| EmuError(format!("{}: {e}", path.display())))?
            .len();
        if len == 0 {
            return Err(EmuError(format!("{}: file is empty", path.display())));
        }
        let map = MmapRaw::map_raw(&file)
            .map_err(|e| EmuError(format!("{}: cannot map: {e}", path.display())))?;
        Ok(SharedFile {
            map,
            path: path.to_path_buf(),
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True for an empty mapping (never: `open` refuses empty files).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The path mapped.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn in_bounds(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|e| e <= self.map.len())
    }

    fn atomic32(&self, off: usize) -> Option<&AtomicU32> {
        if !off.is_multiple_of(4) || !self.in_bounds(off, 4) {
            return None;
        }
        // SAFETY: in bounds and 4-aligned (mappings are page aligned) memory
        // of a mapping that lives as long as `self`, touched only atomically.
        Some(unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(off).cast()) })
    }

    fn atomic64(&self, off: usize) -> Option<&AtomicU64> {
        if !off.is_multiple_of(8) || !self.in_bounds(off, 8) {
            return None;
        }
        // SAFETY: as in `atomic32`, 8-aligned.
        Some(unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(off).cast()) })
    }

    /// Acquire load of the dword at `off` (all ones outside the file).
    pub fn load32(&self, off: usize) -> u32 {
        self.atomic32(off)
            .map_or(u32::MAX, |a| a.load(Ordering::Acquire))
    }

    /// Release store of the dword at `off` (ignored outside the file).
    pub fn store32(&self, off: usize, v: u32) {
        if let Some(a) = self.atomic32(off) {
            a.store(v, Ordering::Release);
        }
    }

    /// Acquire load of the qword at `off` (all ones outside the file).
    pub fn load64(&self, off: usize) -> u64 {
        self.atomic64(off)
            .map_or(u64::MAX, |a| a.load(Ordering::Acquire))
    }

    /// Release store of the qword at `off`.
    pub fn store64(&self, off: usize, v: u64) {
        if let Some(a) = self.atomic64(off) {
            a.store(v, Ordering::Release);
        }
    }

    /// Copies bytes out of the file; false if out of bounds.
    pub fn read_bytes(&self, off: usize, buf: &mut [u8]) -> bool {
        if !self.in_bounds(off, buf.len()) {
            return false;
        }
        // SAFETY: `[off, off + len)` is inside the live mapping; `buf` is
        // ours and cannot overlap a shared file mapping.
        unsafe {
            core::ptr::copy_nonoverlapping(self.map.as_ptr().add(off), buf.as_mut_ptr(), buf.len())
        };
        fence(Ordering::Acquire);
        true
    }

    /// Copies bytes into the file, the last 8 bytes (when 8-aligned) with a
    /// release store so a peer polling that tail sees the rest first; false
    /// if out of bounds.
    pub fn write_bytes(&self, off: usize, buf: &[u8]) -> bool {
        if !self.in_bounds(off, buf.len()) {
            return false;
        }
        let end = off + buf.len();
        let body = if buf.len() >= 8 && end.is_multiple_of(8) {
            buf.len() - 8
        } else {
            buf.len()
        };
        // SAFETY: `[off, off + body)` is inside the live mapping; `buf` is
        // ours and cannot overlap it.
        unsafe {
            core::ptr::copy_nonoverlapping(buf.as_ptr(), self.map.as_mut_ptr().add(off), body)
        };
        if body < buf.len() {
            let mut tail = [0u8; 8];
            tail.copy_from_slice(&buf[body..]);
            self.store64(off + body, u64::from_ne_bytes(tail));
        } else {
            fence(Ordering::Release);
        }
        true
    }

    /// Zeroes the whole file.
    pub fn zero(&self) {
        // SAFETY: the whole live mapping, written before anyone is told
        // (the magic) that it holds anything.
        unsafe { core::ptr::write_bytes(self.map.as_mut_ptr(), 0, self.map.len()) };
        fence(Ordering::Release);
    }

    /// A register file over `[off, off + len)` that keeps the mapping alive.
    fn reg_file(self: &Arc<Self>, off: usize, len: usize) -> Option<RegFile> {
        if !off.is_multiple_of(4) || !self.in_bounds(off, len) {
            return None;
        }
        let ptr = self.map.as_mut_ptr().wrapping_add(off);
        let ptr = core::ptr::NonNull::new(ptr.cast::<u32>())?;
        let owner: Arc<dyn std::any::Any + Send + Sync> = self.clone();
        // SAFETY: 4-aligned and in bounds of the mapping `owner` keeps alive;
        // the guest stores only single aligned dwords/qwords there.
        Some(unsafe { RegFile::from_shared(owner, ptr, len / 4) })
    }
}

/// Guest RAM as the device reaches it: the RAM file, by q35 bus address.
pub struct GuestRam {
    file: SharedFile,
    size: u64,
}

impl GuestRam {
    /// Maps the RAM file; its size is the guest's RAM size.
    pub fn open(path: &Path) -> Result<GuestRam, EmuError> {
        let file = SharedFile::open(path)?;
        let size = file.len() as u64;
        if size < 2 * DMA_FLOOR || !size.is_multiple_of(4096) {
            return Err(EmuError(format!(
                "{}: {size} bytes is not a guest RAM size (a multiple of 4 KiB, at least 2 MiB)",
                path.display()
            )));
        }
        Ok(GuestRam { file, size })
    }

    /// RAM size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn offset(&self, bus: u64, len: usize, write: bool) -> Result<usize, DmaFault> {
        gpa_to_offset(self.size, bus, len as u64)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or(out_of_range(bus, len, write))
    }
}

fn out_of_range(bus: u64, len: usize, write: bool) -> DmaFault {
    DmaFault {
        bus,
        len,
        write,
        kind: DmaFaultKind::OutOfRange,
    }
}

impl HostMemory for GuestRam {
    fn read(&self, bus: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let off = self.offset(bus, buf.len(), false)?;
        if self.file.read_bytes(off, buf) {
            Ok(())
        } else {
            Err(out_of_range(bus, buf.len(), false))
        }
    }
    fn write(&self, bus: u64, buf: &[u8]) -> Result<(), DmaFault> {
        let off = self.offset(bus, buf.len(), true)?;
        if self.file.write_bytes(off, buf) {
            Ok(())
        } else {
            Err(out_of_range(bus, buf.len(), true))
        }
    }
}

/// How the emulator runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Spin this long after the last activity before sleeping.
    pub spin: Duration,
    /// Spin this long instead while work comes back within this time
    /// after a pause (a request/response exchange between guests); 0
    /// (the default) turns this off: on a machine whose cores the TCG
    /// vCPUs fill, the spinning takes the time the guests need to answer
    /// (docs/ivshmem.md, "Polling and CPU use").
    pub busy_spin: Duration,
    /// Sleep this long per idle round (1 ns timer slack).
    pub sleep: Duration,
    /// After this long without activity, sleep `idle_sleep` per round.
    pub idle_after: Duration,
    /// Sleep per round once idle for `idle_after` (at most 5 ms: the
    /// heartbeat must move every 10 ms).
    pub idle_sleep: Duration,
    /// Fault injection, trace, exit conditions, statistics.
    pub host: HostOptions,
    /// The fabric every node's ports are cabled to (topology, capture,
    /// latency, packet faults).
    pub fabric: Box<crate::fabric::options::FabricOptions>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            spin: Duration::from_micros(5),
            busy_spin: Duration::ZERO,
            sleep: Duration::from_micros(20),
            idle_after: Duration::from_millis(100),
            idle_sleep: Duration::from_millis(1),
            host: HostOptions::default(),
            fabric: Default::default(),
        }
    }
}

/// One guest: its window, its model, and what has been reported so far.
pub struct Node {
    id: u32,
    window: Arc<SharedFile>,
    ram_size: u64,
    hca: SimHca,
    pci: Arc<PciConfig>,
    /// What the emulator last stored in (or saw in) the first config dwords.
    shadow: [u32; CONFIG_SYNC_DWORDS],
    /// [`PciConfig::changes`] when the model's dwords were last read.
    pci_seen: u64,
    trace_next: usize,
    commands: u64,
    violations: u64,
    dma_faults: u64,
    init_at: Option<Instant>,
    catas_done: bool,
    heartbeat: u64,
}

impl Node {
    /// Maps the files, builds the model over them and publishes the window
    /// (magic last).
    fn open(
        id: u32,
        nodes: u32,
        window: &Path,
        ram: &Path,
        wire: &crate::Wire,
        at: &crate::fabric::topology::BuiltHca,
        port_types: Option<[crate::hca::config::PortType; 2]>,
    ) -> Result<Node, EmuError> {
        let w = SharedFile::open(window)?;
        if w.len() != WINDOW_LEN {
            return Err(EmuError(format!(
                "{}: window is {} bytes, the contract wants {WINDOW_LEN} (16 MiB)",
                window.display(),
                w.len()
            )));
        }
        let ram = Arc::new(GuestRam::open(ram)?);
        let ram_size = ram.size();
        let w = Arc::new(w);
        w.zero();
        let (Some(bar0), Some(bar2)) = (
            w.reg_file(BAR0_OFF, BAR0_LEN),
            w.reg_file(BAR2_OFF, BAR2_LEN),
        ) else {
            return Err(EmuError("window too small for the BARs".into()));
        };
        let base = node_config(id);
        let cfg = SimConfig {
            node_guid: at.node_guid,
            sys_image_guid: at.node_guid + 3,
            port_types: port_types.unwrap_or(base.port_types),
            ..base
        };
        let hca = SimHca::new_polled_on(
            cfg,
            ram,
            Arc::new(bar0),
            Arc::new(bar2),
            wire,
            [Some(at.ports[0]), Some(at.ports[1])],
        );
        let pci = hca.config_space();
        let header32 = [
            (hdr::VERSION, VERSION),
            (hdr::NODE, id),
            (hdr::NODES, nodes),
            (hdr::CONFIG_OFF, CONFIG_OFF as u32),
            (hdr::BAR0_OFF, BAR0_OFF as u32),
            (hdr::BAR0_LEN, BAR0_LEN as u32),
            (hdr::BAR2_OFF, BAR2_OFF as u32),
            (hdr::BAR2_LEN, BAR2_LEN as u32),
        ];
        for (off, v) in header32 {
            w.store32(off, v);
        }
        w.store64(hdr::RAM_SIZE, ram_size);
        w.store64(hdr::LOWMEM, lowmem(ram_size));
        let mut image = vec![0u32; CONFIG_LEN / 4];
        let pci_seen = pci.changes();
        pci.read_dwords(&mut image);
        for (i, v) in image.iter().enumerate() {
            w.store32(CONFIG_OFF + 4 * i, *v);
        }
        let mut shadow = [0u32; CONFIG_SYNC_DWORDS];
        shadow.copy_from_slice(&image[..CONFIG_SYNC_DWORDS]);
        w.store32(hdr::MAGIC, MAGIC);
        Ok(Node {
            id,
            window: w,
            ram_size,
            hca,
            pci,
            shadow,
            pci_seen,
            trace_next: 0,
            commands: 0,
            violations: 0,
            dma_faults: 0,
            init_at: None,
            catas_done: false,
            heartbeat: 0,
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

    /// Guest RAM size mapped.
    pub fn ram_size(&self) -> u64 {
        self.ram_size
    }

    /// Commands served, violations and DMA faults seen.
    pub fn counts(&self) -> (u64, u64, u64) {
        (self.commands, self.violations, self.dma_faults)
    }

    /// The guest-state word.
    pub fn guest_state(&self) -> u32 {
        self.window.load32(hdr::GUEST_STATE)
    }

    /// Syncs the first config dwords: guest writes (a value different from
    /// what the emulator last stored) go to the model, then, if the guest
    /// wrote or `full`, the model's read values go back, by
    /// compare-exchange so that a guest write racing with the store is not
    /// lost. True if the guest wrote anything. (The model's values change
    /// only through a write, a reset ([`PciConfig::changes`] counts both),
    /// or the end of a reset, which a full round within
    /// [`FULL_ROUND_EVERY`] publishes.)
    fn sync_config(&mut self, full: bool) -> bool {
        let copy = self.config_copy();
        let mut cur = self.shadow;
        let mut wrote = false;
        if copy != self.shadow {
            for (i, c) in cur.iter_mut().enumerate() {
                if copy[i] == self.shadow[i] {
                    continue;
                }
                // Again with a dword load: the copy may have torn it.
                *c = self.window.load32(CONFIG_OFF + 4 * i);
                if *c != self.shadow[i] {
                    self.pci.write32((4 * i) as u16, *c);
                    wrote = true;
                }
            }
        }
        if !wrote && !full {
            return false;
        }
        let mut model = [0u32; CONFIG_SYNC_DWORDS];
        self.pci_seen = self.pci.changes();
        self.pci.read_dwords(&mut model);
        for i in 0..CONFIG_SYNC_DWORDS {
            self.shadow[i] = cur[i];
            if model[i] == cur[i] {
                continue;
            }
            if let Some(a) = self.window.atomic32(CONFIG_OFF + 4 * i)
                && a.compare_exchange(cur[i], model[i], Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                self.shadow[i] = model[i];
            }
        }
        wrote
    }

    /// The synced config dwords in one copy (a dword the guest is writing
    /// may be torn: only a difference from the shadow is taken from it);
    /// the shadow itself if the window is too small (never: checked at
    /// open).
    fn config_copy(&self) -> [u32; CONFIG_SYNC_DWORDS] {
        let mut bytes = [0u8; CONFIG_SYNC_DWORDS * 4];
        if !self.window.read_bytes(CONFIG_OFF, &mut bytes) {
            return self.shadow;
        }
        let mut w = [0u32; CONFIG_SYNC_DWORDS];
        for (d, b) in w.iter_mut().zip(bytes.chunks_exact(4)) {
            *d = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        }
        w
    }

    /// One round for this node; true if anything happened. A light round
    /// (`full` false) skips the model-to-image config copy unless the
    /// guest wrote the image or the model's config moved (a reset), and
    /// when it finds nothing to do also the reporting, which only a round
    /// with work (or time, in the next full round) can have changed.
    fn round(&mut self, opts: &Options, log: &mut Log, full: bool) -> bool {
        // Poll first, then sync: a reset the poll performed shows in the
        // image at once; a GO seen before the guest's memory-enable write
        // reached the model stays set and is taken next round.
        let mut active = self.hca.poll();
        // The image again only if the model's config moved (a reset the
        // poll performed): a doorbell or a command leaves it as it was.
        let moved = self.pci.changes() != self.pci_seen;
        active |= self.sync_config(full || moved);
        if !(full || active) {
            self.heartbeat = self.heartbeat.wrapping_add(1);
            self.window.store64(hdr::HEARTBEAT, self.heartbeat);
            return false;
        }
        self.report(opts, log);
        if let (Some(after), Some(at)) = (opts.host.catas_after, self.init_at)
            && !self.catas_done
            && at.elapsed() >= after
        {
            self.catas_done = true;
            self.hca.raise_catastrophic_error();
            log.line(format!(
                "node{}: catastrophic error raised ({:?} after INIT_HCA)",
                self.id, after
            ));
            self.report(opts, log);
            active = true;
        }
        self.heartbeat = self.heartbeat.wrapping_add(1);
        self.window.store64(hdr::HEARTBEAT, self.heartbeat);
        active
    }

    /// Streams completed trace entries, new violations and DMA faults.
    fn report(&mut self, opts: &Options, log: &mut Log) {
        let len = self.hca.trace_len();
        if len > self.trace_next {
            let entries = self.hca.trace_since(self.trace_next);
            let n = entries.len();
            for (k, e) in entries.into_iter().enumerate() {
                // The last entry may still be in flight; an earlier one that
                // never completed (stuck GO, then reset) is reported as is.
                if e.duration.is_none() && k + 1 == n {
                    break;
                }
                self.trace_next += 1;
                self.commands += 1;
                if opts.host.trace {
                    log.line(format!("node{}: {e}", self.id));
                }
                if e.op() == Opcode::INIT_HCA && e.ok() && self.init_at.is_none() {
                    self.init_at = Some(Instant::now());
                }
            }
            // Keep memory bounded: forget a fully reported trace (nothing in
            // flight: the last entry has completed).
            if self.trace_next == len && len >= 4096 {
                self.hca.clear_trace();
                self.trace_next = 0;
            }
        }
        for v in self.hca.take_violations() {
            self.violations += 1;
            log.line(format!("node{}: violation: {v}", self.id));
        }
        for f in self.hca.take_dma_faults() {
            self.dma_faults += 1;
            log.line(format!("node{}: DMA fault: {f}", self.id));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A window whose emulator is gone must not look served.
        self.window.store32(hdr::MAGIC, 0);
    }
}

/// Why [`Emulator::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every guest wrote state 3.
    GuestsDone,
    /// The stop flag was set (a signal).
    Stopped,
    /// The parent process is gone.
    ParentGone,
    /// Every watched process is gone.
    PidsGone,
}

/// One emulator process: all nodes, one poll loop.
pub struct Emulator {
    nodes: Vec<Node>,
    opts: Options,
    log: Log,
    started: Instant,
    wire: crate::Wire,
    /// The ibsim server and, with `--sm opensm`, OpenSM; polled each round.
    sm: Option<crate::fabric::ibsim::SmService>,
    /// OpenSM's pid while it runs (to say so when it exits on its own).
    opensm_pid: Option<u32>,
    /// The clock the HCAs on the wire use (the SM service's packets are
    /// due on it).
    clock: Arc<dyn hal::Clock>,
}

impl Emulator {
    /// Maps every node's `(window, ram)` files and publishes the windows.
    pub fn open(
        specs: &[(PathBuf, PathBuf)],
        opts: Options,
        log: Log,
    ) -> Result<Emulator, EmuError> {
        if specs.is_empty() {
            return Err(EmuError("no --node given".into()));
        }
        let mut seen = Vec::new();
        for (w, r) in specs {
            for p in [w, r] {
                let c = std::fs::canonicalize(p)
                    .map_err(|e| EmuError(format!("{}: cannot open: {e}", p.display())))?;
                if seen.contains(&c) {
                    return Err(EmuError(format!("{}: named twice", p.display())));
                }
                seen.push(c);
            }
        }
        let n = u32::try_from(specs.len()).map_err(|_| EmuError("too many nodes".into()))?;
        // One fabric spans every node: the topology's HCA i is node i.
        let mut fabric = crate::fabric::Fabric::new();
        let built = opts
            .fabric
            .build(&mut fabric, specs.len())
            .map_err(EmuError)?;
        // Unique per emulator, also for several emulators in one process
        // (the tests): the ibsim socket names live in one namespace.
        static EMULATORS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = EMULATORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = format!("lego-{}-{seq}", std::process::id());
        let sm = opts
            .fabric
            .start_sm(&mut fabric, &built, &base)
            .map_err(EmuError)?;
        let wire = crate::Wire::threaded(std::sync::Arc::new(std::sync::Mutex::new(fabric)));
        let mut nodes = Vec::with_capacity(specs.len());
        for (id, (w, r)) in (0..n).zip(specs) {
            let at = built
                .hcas
                .get(id as usize)
                .ok_or_else(|| EmuError(format!("the topology has no HCA for node {id}")))?;
            let node = Node::open(id, n, w, r, &wire, at, opts.host.port_type)?;
            for (op, st) in &opts.host.fail {
                node.hca
                    .faults()
                    .set(*op, crate::hca::faults::OpcodeFault::status(*st));
            }
            nodes.push(node);
        }
        let clock = nodes
            .first()
            .map(|n| n.hca.clock())
            .ok_or_else(|| EmuError("no node".into()))?;
        let opensm_pid = sm.as_ref().and_then(|s| s.opensm_pid());
        Ok(Emulator {
            nodes,
            opts,
            log,
            started: Instant::now(),
            wire,
            sm,
            opensm_pid,
            clock,
        })
    }

    /// OpenSM's log file, with `--sm opensm`.
    pub fn opensm_log(&self) -> Option<PathBuf> {
        self.sm
            .as_ref()
            .filter(|s| s.opensm_pid().is_some())
            .map(|s| s.opensm_log())
    }

    /// OpenSM's pid, while it runs.
    pub fn opensm_pid(&self) -> Option<u32> {
        self.sm.as_ref().and_then(|s| s.opensm_pid())
    }

    /// The ibsim socket name the diags attach to (`IBSIM_SOCKNAME`), if
    /// the server runs.
    pub fn ibsim_sockname(&self) -> Option<&str> {
        self.sm.as_ref().map(|s| s.server.base())
    }

    /// Ends OpenSM (serving its goodbye for up to 2 s) and the ibsim
    /// server, and removes the socket-name file. Dropping the emulator
    /// does the same.
    pub fn shutdown(&mut self) {
        if let Some(mut svc) = self.sm.take() {
            let now = self.clock.now_ns();
            let fabric = self.wire.fabric();
            let mut f = fabric.lock().unwrap_or_else(|e| e.into_inner());
            svc.stop(&mut f, now);
        }
    }

    /// One round of the SM service: the fabric brought to now, then the
    /// server's sockets and host nodes; true if anything happened.
    fn poll_sm(&mut self) -> bool {
        let Some(svc) = self.sm.as_mut() else {
            return false;
        };
        let now = self.clock.now_ns();
        let fabric = self.wire.fabric();
        let work = {
            let mut f = fabric.lock().unwrap_or_else(|e| e.into_inner());
            f.advance(now);
            svc.poll(&mut f, now)
        };
        if let Some(pid) = self.opensm_pid
            && svc.opensm_pid().is_none()
        {
            self.log.line(format!(
                "cx3-emu: OpenSM (pid {pid}) exited on its own; its log: {}",
                svc.opensm_log().display()
            ));
            self.opensm_pid = None;
        }
        work > 0
    }

    /// The fabric the nodes are cabled to.
    pub fn fabric(&self) -> crate::fabric::SharedFabric {
        self.wire.fabric()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Messages so far (with [`Log::capture`]).
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// One full poll round over every node; true if anything happened.
    pub fn poll_round(&mut self) -> bool {
        self.round(true)
    }

    /// One light round over every node (see [`Emulator::run`]); true if
    /// anything happened.
    pub fn poll_round_light(&mut self) -> bool {
        self.round(false)
    }

    /// One round over every node: a full one also publishes the model's
    /// config image, reports, and serves the SM sockets; a light one (the
    /// busy loop's, between full ones) polls each model for commands and
    /// doorbells and the config image for guest writes, and turns full for
    /// any node that finds work.
    fn round(&mut self, full: bool) -> bool {
        let mut active = false;
        for n in &mut self.nodes {
            active |= n.round(&self.opts, &mut self.log, full);
        }
        if full {
            active |= self.poll_sm();
        }
        active
    }

    /// Every guest has written state 3.
    pub fn all_shut_down(&self) -> bool {
        self.nodes
            .iter()
            .all(|n| n.guest_state() == GUEST_SHUT_DOWN)
    }

    /// Polls until every guest has shut down, `stop` is set, every watched
    /// process is gone, or the parent is (with `exit_with_parent`).
    pub fn run(&mut self, stop: &AtomicBool) -> Exit {
        set_timer_slack_1ns();
        let parent = std::os::unix::process::parent_id();
        let mut last_active = Instant::now();
        let mut next_check = Instant::now();
        let busy_spin = self.opts.busy_spin.max(self.opts.spin);
        let mut spin_for = self.opts.spin;
        let mut next_full = Instant::now();
        loop {
            if stop.load(Ordering::Acquire) {
                return Exit::Stopped;
            }
            let now = Instant::now();
            // A full round (SM sockets: each a system call; reports; the
            // model's config image) every FULL_ROUND_EVERY, light rounds in
            // between: a doorbell is noticed within a light round.
            let full = now >= next_full;
            if full {
                next_full = now + FULL_ROUND_EVERY;
            }
            if self.round(full) {
                let done = Instant::now();
                let gap = done.duration_since(last_active);
                // Work again after a pause no longer than `busy_spin`: a
                // guest in a request/response exchange. Spin that long
                // after each piece of work from now on, so its next request
                // is taken at once instead of after a nap; a longer pause
                // ends it.
                if gap > busy_spin {
                    spin_for = self.opts.spin;
                } else if gap > self.opts.spin {
                    spin_for = busy_spin;
                }
                last_active = done;
            }
            if self.all_shut_down() {
                // Report what the last round produced, then go.
                return Exit::GuestsDone;
            }
            if now >= next_check {
                next_check = now + Duration::from_millis(20);
                if self.opts.host.exit_with_parent && std::os::unix::process::parent_id() != parent
                {
                    return Exit::ParentGone;
                }
                if !self.opts.host.watch_pids.is_empty()
                    && self.opts.host.watch_pids.iter().all(|p| !pid_alive(*p))
                {
                    return Exit::PidsGone;
                }
            }
            // (Zero after a round with work: `last_active` is later.)
            let idle = now.saturating_duration_since(last_active);
            let nap = if idle >= self.opts.idle_after {
                self.opts.idle_sleep
            } else {
                self.opts.sleep
            };
            if idle < spin_for {
                core::hint::spin_loop();
            } else if nap.is_zero() {
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap);
            }
        }
    }

    /// The `--stats` lines: one per node and a total with CPU vs wall time.
    pub fn stats(&self) -> String {
        let mut s = String::new();
        let (mut c, mut v, mut d) = (0, 0, 0);
        for n in &self.nodes {
            let (nc, nv, nd) = n.counts();
            let _ = writeln!(
                s,
                "node{}: commands {nc}, violations {nv}, DMA faults {nd}",
                n.id
            );
            c += nc;
            v += nv;
            d += nd;
        }
        if let Ok(f) = self.wire.fabric().lock() {
            let _ = writeln!(s, "fabric: {:?}", f.stats());
            let _ = writeln!(s, "packet faults: {:?}", f.faults.stats);
        }
        let wall = self.started.elapsed().as_secs_f64();
        let cpu = process_cpu_time().as_secs_f64();
        let pct = if wall > 0.0 { 100.0 * cpu / wall } else { 0.0 };
        let _ = writeln!(
            s,
            "total: commands {c}, violations {v}, DMA faults {d}; CPU {cpu:.3} s over {wall:.3} s wall ({pct:.1}%)"
        );
        s
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Parses `cx3-emu`'s command line (without the program name;
/// [`EmuArgs`](crate::front::host::EmuArgs)): each node's window and RAM files, and the options.
pub fn parse_args<I, T>(args: I) -> Result<(Vec<(PathBuf, PathBuf)>, Options), clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let a = parse_emu_args(args)?;
    let opts = Options {
        spin: a.spin,
        busy_spin: a.busy_spin,
        sleep: a.sleep,
        idle_after: a.idle_after,
        idle_sleep: a.idle_sleep,
        host: a.common.host,
        fabric: Box::new(a.common.fabric.0),
    };
    Ok((a.nodes, opts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::host::{parse_opcode, parse_status};
    use crate::hca::hcr::Status;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn small_ram_is_identity_mapped_above_1_mib() {
        let ram = 512 * MIB;
        assert_eq!(lowmem(ram), ram);
        assert_eq!(gpa_to_offset(ram, MIB, 4096), Some(MIB));
        assert_eq!(gpa_to_offset(ram, ram - 8, 8), Some(ram - 8));
        assert_eq!(gpa_to_offset(ram, ram - 8, 9), None, "crosses the end");
        assert_eq!(gpa_to_offset(ram, ram, 1), None);
        assert_eq!(gpa_to_offset(ram, MIB - 1, 2), None, "below 1 MiB");
        assert_eq!(gpa_to_offset(ram, 0, 4), None);
        assert_eq!(gpa_to_offset(ram, 0xc000_0000, 4), None, "PCI hole");
        assert_eq!(gpa_to_offset(ram, 4 * GIB, 4), None, "no high RAM");
        assert_eq!(gpa_to_offset(ram, u64::MAX - 2, 8), None, "wraps");
        let just_below = Q35_LOWMEM_LIMIT - MIB;
        assert_eq!(lowmem(just_below), just_below);
        assert_eq!(
            gpa_to_offset(just_below, just_below - 4, 4),
            Some(just_below - 4)
        );
    }

    #[test]
    fn big_ram_splits_at_2_gib_and_resumes_at_4_gib() {
        for ram in [Q35_LOWMEM_LIMIT, 3 * GIB, 8 * GIB] {
            assert_eq!(lowmem(ram), 2 * GIB);
            assert_eq!(gpa_to_offset(ram, 2 * GIB - 8, 8), Some(2 * GIB - 8));
            assert_eq!(
                gpa_to_offset(ram, 2 * GIB - 8, 16),
                None,
                "runs into the hole"
            );
            assert_eq!(gpa_to_offset(ram, 2 * GIB, 4), None, "hole");
            assert_eq!(gpa_to_offset(ram, 0xfebd_5000, 4), None, "hole");
            assert_eq!(gpa_to_offset(ram, 4 * GIB - 4, 8), None, "hole into high");
            assert_eq!(gpa_to_offset(ram, 4 * GIB, 4), Some(2 * GIB));
            let top = 4 * GIB + ram - 2 * GIB;
            assert_eq!(gpa_to_offset(ram, top - 4, 4), Some(ram - 4));
            assert_eq!(gpa_to_offset(ram, top - 4, 8), None, "beyond RAM");
            assert_eq!(gpa_to_offset(ram, top, 1), None);
        }
        // The spike's check: 2816 MiB, gpa 0x101000000 is offset 0x81000000.
        assert_eq!(
            gpa_to_offset(2816 * MIB, 0x1_0100_0000, 8),
            Some(0x8100_0000)
        );
    }

    #[test]
    fn catastrophic_error_once_after_init_hca() {
        let dir = std::env::temp_dir().join(format!("cx3-emu-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (w, r) = (dir.join("w"), dir.join("r"));
        std::fs::File::create(&w)
            .unwrap()
            .set_len(WINDOW_LEN as u64)
            .unwrap();
        std::fs::File::create(&r).unwrap().set_len(4 * MIB).unwrap();
        let opts = Options {
            host: HostOptions {
                catas_after: Some(Duration::from_millis(10)),
                ..HostOptions::default()
            },
            ..Options::default()
        };
        let mut emu = Emulator::open(&[(w, r)], opts, Log::capture()).unwrap();
        emu.poll_round();
        assert_eq!(emu.nodes[0].hca.catas_syndrome(), 0, "no INIT_HCA yet");
        // As if INIT_HCA had succeeded 20 ms ago.
        emu.nodes[0].init_at = Instant::now().checked_sub(Duration::from_millis(20));
        emu.poll_round();
        assert_ne!(emu.nodes[0].hca.catas_syndrome(), 0);
        emu.poll_round();
        let raised = emu
            .log()
            .lines()
            .iter()
            .filter(|l| l.starts_with("node0: catastrophic error raised"))
            .count();
        assert_eq!(raised, 1);
        drop(emu);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn command_line() {
        let args = |s: &str| parse_args(s.split_whitespace());
        let Ok((nodes, opts)) = args(
            "--node a.win,a.ram --node=b.win,b.ram --fail RUN_FW --fail 0x3=BAD_PARAM \
             --fail 2err_qp=0x10 --catas-after 1.5 --trace --spin-us 0 --sleep-us 100 \
             --exit-with-parent --watch-pid 42 --watch-pid 43 --stats \
             --idle-after-ms 7 --idle-sleep-us=300 --busy-spin-us 50",
        ) else {
            panic!("parses");
        };
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1].1, PathBuf::from("b.ram"));
        assert_eq!(
            opts.host.fail,
            vec![
                (Opcode::RUN_FW, Status::INTERNAL_ERR),
                (Opcode::QUERY_DEV_CAP, Status::BAD_PARAM),
                (Opcode::ERR_QP, Status::BAD_QP_STATE),
            ]
        );
        assert_eq!(opts.host.catas_after, Some(Duration::from_millis(1500)));
        assert!(opts.host.trace && opts.host.stats && opts.host.exit_with_parent);
        assert_eq!(
            (opts.spin, opts.sleep),
            (Duration::ZERO, Duration::from_micros(100))
        );
        assert_eq!(opts.host.watch_pids, vec![42, 43]);
        assert_eq!(opts.busy_spin, Duration::from_micros(50));
        assert_eq!(
            (opts.idle_after, opts.idle_sleep),
            (Duration::from_millis(7), Duration::from_micros(300))
        );
        assert!(matches!(args("-h"), Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp));
        for bad in [
            "",
            "--node a.win",
            "--node a,b --fail NOPE",
            "--node a,b --fail RUN_FW=NOPE",
            "--node a,b --sleep-us 20000",
            "--node a,b --idle-sleep-us 6000",
            "--node a,b --catas-after -1",
            "--node a,b --watch-pid x",
            "--node a,b --busy-spin-us 2000000",
            "--node a,b --bogus",
            "--node a,b --trace=1",
            "--node",
        ] {
            assert!(args(bad).is_err(), "{bad:?} must be refused");
        }
        assert_eq!(parse_status("cmd_stat_icm_error"), Some(Status::ICM_ERROR));
        assert_eq!(parse_opcode("RST_QP"), Some(Opcode::RST_QP));
        assert_eq!(parse_opcode("query_fw"), Some(Opcode::QUERY_FW));
    }
}
