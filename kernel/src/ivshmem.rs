//! The emulated ConnectX-3 behind an ivshmem function.
//!
//! The emulated ConnectX-3 behind an ivshmem function (`docs/ivshmem.md`):
//! finds the window, checks its header against the contract, and describes
//! the card so that `pci` hands `mlx4_core` the same `hal::PciFunction` a
//! real 15b3:1003 gives.
//!
//! Leaves out: ivshmem doorbells and interrupts (ivshmem-plain has none),
//! hot-plugged windows.

use core::time::Duration;

use hal::pci::cfg;
use hal::{BarInfo, BarKind, ConfigSpace, Deadline};

use crate::time::TscClock;

/// `C X 3 E` as a little-endian dword.
pub const MAGIC: u32 = 0x4533_5843;
/// The contract version this kernel speaks.
pub const VERSION: u32 = 1;
/// Window size the contract defines.
pub const WINDOW_LEN: u64 = 16 << 20;

const CONFIG_OFF: u32 = 0x1000;
const BAR0_OFF: u32 = 0x10_0000;
const BAR0_LEN: u32 = 0x10_0000;
const BAR2_OFF: u32 = 0x80_0000;
const BAR2_LEN: u32 = 0x80_0000;

/// Guest states written to the header (offset 0x40).
#[derive(Debug, Clone, Copy)]
#[repr(u32)]
pub enum GuestState {
    /// The kernel found the window.
    KernelUp = 1,
    /// mlx4_core brought the HCA up.
    DriverUp = 2,
    /// The guest is shutting down.
    ShutDown = 3,
}

/// A mapped, validated window.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Virtual (== physical) address of the window.
    base: u64,
    /// Bus address of the window (the ivshmem BAR).
    pub bus: u64,
    /// Node id the emulator gave this guest.
    pub node: u32,
    /// Nodes the emulator serves.
    pub nodes: u32,
}

fn read32(base: u64, off: u32) -> u32 {
    // SAFETY: `base` is an uncached mapping of the whole 16 MiB window (mapped
    // in `probe` before any read), `off` is a dword-aligned contract offset.
    unsafe { ((base + u64::from(off)) as *const u32).read_volatile() }
}

fn write32(base: u64, off: u32, v: u32) {
    // SAFETY: as in `read32`.
    unsafe { ((base + u64::from(off)) as *mut u32).write_volatile(v) }
}

impl Window {
    /// The window's BAR0 and BAR2 as `(bus address, length, virtual address)`.
    pub fn bars(&self) -> [(u64, u64, u64); 2] {
        [
            (
                self.bus + u64::from(BAR0_OFF),
                u64::from(BAR0_LEN),
                self.base + u64::from(BAR0_OFF),
            ),
            (
                self.bus + u64::from(BAR2_OFF),
                u64::from(BAR2_LEN),
                self.base + u64::from(BAR2_OFF),
            ),
        ]
    }

    /// The config-space image.
    pub fn config(&self) -> ImageConfig {
        ImageConfig {
            base: self.base + u64::from(CONFIG_OFF),
        }
    }

    /// Tells the emulator how far the guest got.
    pub fn set_guest_state(&self, s: GuestState) {
        write32(self.base, 0x40, s as u32);
    }

    /// The emulator's heartbeat counter.
    pub fn heartbeat(&self) -> u64 {
        u64::from(read32(self.base, 0x38)) | (u64::from(read32(self.base, 0x3c)) << 32)
    }

    /// The BAR descriptions the emulated card shows.
    pub fn bar_info(&self) -> [Option<BarInfo>; 6] {
        let [(b0, l0, _), (b2, l2, _)] = self.bars();
        let mut out = [None; 6];
        out[0] = Some(BarInfo {
            index: 0,
            kind: BarKind::Memory64,
            prefetchable: false,
            addr: b0,
            size: l0,
        });
        out[2] = Some(BarInfo {
            index: 2,
            kind: BarKind::Memory64,
            prefetchable: true,
            addr: b2,
            size: l2,
        });
        out
    }
}

/// The config-space image in the window, as `hal` wants config space.
pub struct ImageConfig {
    base: u64,
}

impl ConfigSpace for ImageConfig {
    fn read32(&self, offset: u16) -> u32 {
        if offset >= 0x1000 {
            return 0xffff_ffff;
        }
        read32(self.base, u32::from(offset & !3))
    }
    fn write32(&self, offset: u16, value: u32) {
        if offset < 0x1000 {
            write32(self.base, u32::from(offset & !3), value);
        }
    }
}

/// Why an ivshmem function carries no emulated HCA.
#[derive(Debug, Clone, Copy)]
pub enum ProbeError {
    /// The window is where an emulator should answer, but none did in time.
    NoEmulator {
        /// Bus address of the window.
        bus: u64,
        /// How long the kernel waited.
        waited: Duration,
    },
    /// Anything else (not an HCA window, mapping failed, wrong contract).
    Other(&'static str),
}

impl core::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ProbeError::NoEmulator { bus, waited } => write!(
                f,
                "cx3-emu: no emulator answers in the ivshmem window at {bus:#x} after {} s; is cx3-emu running?",
                waited.as_secs_f32()
            ),
            ProbeError::Other(s) => f.write_str(s),
        }
    }
}

/// Checks an ivshmem function's BAR2 for the emulated HCA. `bar` is its
/// BAR2 `(address, size)`. Waits up to `wait` for the emulator's magic.
pub fn probe(bar: (u64, u64), wait: Duration) -> Result<Window, ProbeError> {
    let (bus, size) = bar;
    if size != WINDOW_LEN {
        return Err(ProbeError::Other(
            "ivshmem window is not 16 MiB: not an emulated HCA",
        ));
    }
    let base = crate::mm::paging::map_mmio(bus, size).map_err(ProbeError::Other)?;
    let deadline = Deadline::after(&TscClock, wait);
    while read32(base, 0) != MAGIC {
        if deadline.expired(&TscClock) {
            return Err(ProbeError::NoEmulator { bus, waited: wait });
        }
        core::hint::spin_loop();
    }
    let fields = [
        (0x04, VERSION, "version"),
        (0x10, CONFIG_OFF, "config offset"),
        (0x14, BAR0_OFF, "BAR0 offset"),
        (0x18, BAR0_LEN, "BAR0 length"),
        (0x1c, BAR2_OFF, "BAR2 offset"),
        (0x20, BAR2_LEN, "BAR2 length"),
    ];
    for (off, want, name) in fields {
        let got = read32(base, off);
        if got != want {
            log::error!(
                "ivshmem: emulator header {name} is {got:#x}, this kernel speaks {want:#x}"
            );
            return Err(ProbeError::Other(
                "emulator header does not match the contract",
            ));
        }
    }
    let w = Window {
        base,
        bus,
        node: read32(base, 0x08),
        nodes: read32(base, 0x0c),
    };
    let vendor = w.config().read32(cfg::VENDOR_ID);
    log::info!(
        "ivshmem: emulated HCA {:04x}:{:04x}, node {} of {}, window at {:#x}",
        vendor & 0xffff,
        vendor >> 16,
        w.node,
        w.nodes,
        bus
    );
    w.set_guest_state(GuestState::KernelUp);
    Ok(w)
}
