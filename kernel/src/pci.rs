//! PCI configuration access, enumeration and BARs.
//!
//! PCI: configuration access through ports 0xcf8/0xcfc, enumeration of every
//! bus with `pci_types`, BAR sizing (decoding off while sizing, as Linux
//! does), and the `hal::PciFunction` handed to drivers with its memory BARs
//! mapped uncached.
//!
//! An ivshmem function carrying the emulated HCA (`docs/ivshmem.md`) is
//! recorded as the card it emulates, with [`Backing::Emulated`], so that
//! `lspci` and drivers see a 15b3:1003 either way.
//!
//! Leaves out: ECAM (extended config space above 0x100 reads as zero through
//! ports), bridges' windows, hot plug, interrupts.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ptr::NonNull;

use hal::pci::cfg;
use hal::{Bar, BarInfo, BarKind, ConfigSpace, PciFunction};
use pci_types::{
    Bar as PtBar, ConfigRegionAccess, EndpointHeader, HeaderType, PciAddress, PciHeader,
};

use crate::arch::port::{inl, outl};

/// Legacy configuration mechanism #1.
struct PortAccess;

static CONFIG_LOCK: spin::Mutex<()> = spin::Mutex::new(());

fn cf8(addr: PciAddress, off: u16) -> u32 {
    0x8000_0000
        | (u32::from(addr.bus()) << 16)
        | (u32::from(addr.device()) << 11)
        | (u32::from(addr.function()) << 8)
        | u32::from(off & 0xfc)
}

impl ConfigRegionAccess for PortAccess {
    unsafe fn read(&self, addr: PciAddress, off: u16) -> u32 {
        if off >= 0x100 {
            return 0;
        }
        let _g = CONFIG_LOCK.lock();
        outl(0xcf8, cf8(addr, off));
        inl(0xcfc)
    }

    unsafe fn write(&self, addr: PciAddress, off: u16, value: u32) {
        if off >= 0x100 {
            return;
        }
        let _g = CONFIG_LOCK.lock();
        outl(0xcf8, cf8(addr, off));
        outl(0xcfc, value);
    }
}

fn read(addr: PciAddress, off: u16) -> u32 {
    // SAFETY: configuration reads of an enumerated function have no memory
    // effects; out-of-range offsets read as zero.
    unsafe { PortAccess.read(addr, off) }
}

/// One function's config space, as `hal` wants it.
pub struct PortConfig(PciAddress);

impl ConfigSpace for PortConfig {
    fn read32(&self, offset: u16) -> u32 {
        read(self.0, offset)
    }
    fn write32(&self, offset: u16, value: u32) {
        // SAFETY: a function a driver owns (or enumeration's BAR sizing); config
        // writes cannot touch RAM themselves (bus mastering is the driver's call).
        unsafe { PortAccess.write(self.0, offset, value) }
    }
}

/// How a function's config space and BARs are reached.
#[derive(Debug, Clone, Copy)]
pub enum Backing {
    /// A real function: config through ports, BARs by MMIO.
    Port,
    /// The emulated HCA in an ivshmem window.
    Emulated(crate::ivshmem::Window),
}

/// What enumeration found about one function.
#[derive(Debug, Clone, Copy)]
pub struct Device {
    /// Where it is.
    pub addr: hal::PciAddress,
    /// Vendor and device ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Class, subclass, programming interface.
    pub class: u32,
    /// Revision.
    pub revision: u8,
    /// Header type (0 endpoint, 1 bridge).
    pub header_type: u8,
    /// Subsystem vendor and ID (endpoints).
    pub subsystem: (u16, u16),
    /// Sized BARs (endpoints).
    pub bars: [Option<BarInfo>; 6],
    /// Real or emulated.
    pub backing: Backing,
}

static DEVICES: spin::Once<Vec<Device>> = spin::Once::new();

fn to_hal(a: PciAddress) -> hal::PciAddress {
    hal::PciAddress {
        segment: a.segment(),
        bus: a.bus(),
        device: a.device(),
        function: a.function(),
    }
}

fn size_bars(addr: PciAddress) -> [Option<BarInfo>; 6] {
    let mut out = [None; 6];
    let header = PciHeader::new(addr);
    let Some(ep) = EndpointHeader::from_header(header, PortAccess) else {
        return out;
    };
    // Decoding off while the BARs hold all-ones, as Linux's __pci_read_base.
    let cmd = read(addr, cfg::COMMAND) & 0xffff;
    let cfgw = PortConfig(addr);
    cfgw.write32(cfg::COMMAND, cmd & !u32::from(cfg::COMMAND_MEMORY | 1));
    let mut slot = 0u8;
    while slot < 6 {
        let bar = ep.bar(slot, PortAccess);
        let (info, width) = match bar {
            Some(PtBar::Memory32 {
                address,
                size,
                prefetchable,
            }) => (
                Some(BarInfo {
                    index: slot,
                    kind: BarKind::Memory32,
                    prefetchable,
                    addr: u64::from(address),
                    size: u64::from(size),
                }),
                1,
            ),
            Some(PtBar::Memory64 {
                address,
                size,
                prefetchable,
            }) => (
                Some(BarInfo {
                    index: slot,
                    kind: BarKind::Memory64,
                    prefetchable,
                    addr: address,
                    size,
                }),
                2,
            ),
            Some(PtBar::Io { port }) => {
                // pci_types does not size I/O BARs; do it here.
                let off = 0x10 + u16::from(slot) * 4;
                let orig = read(addr, off);
                cfgw.write32(off, 0xffff_ffff);
                let mask = read(addr, off) & !0x3;
                cfgw.write32(off, orig);
                let size = (!mask).wrapping_add(1) & 0xffff;
                (
                    Some(BarInfo {
                        index: slot,
                        kind: BarKind::Io,
                        prefetchable: false,
                        addr: u64::from(port),
                        size: u64::from(size),
                    }),
                    1,
                )
            }
            None => (None, 1),
        };
        out[usize::from(slot)] = info;
        slot += width;
    }
    cfgw.write32(cfg::COMMAND, cmd);
    out
}

fn probe(addr: PciAddress, found: &mut Vec<Device>) -> bool {
    let header = PciHeader::new(addr);
    let (vendor, device) = header.id(PortAccess);
    if vendor == 0xffff {
        return false;
    }
    let (revision, base, sub, iface) = header.revision_and_class(PortAccess);
    let ht = match header.header_type(PortAccess) {
        HeaderType::Endpoint => 0,
        HeaderType::PciPciBridge => 1,
        HeaderType::CardBusBridge => 2,
        _ => 0x7f,
    };
    let (bars, subsystem) = if ht == 0 {
        let ss = read(addr, cfg::SUBSYSTEM_VENDOR_ID);
        (size_bars(addr), (ss as u16, (ss >> 16) as u16))
    } else {
        ([None; 6], (0, 0))
    };
    found.push(Device {
        addr: to_hal(addr),
        vendor,
        device,
        class: (u32::from(base) << 16) | (u32::from(sub) << 8) | u32::from(iface),
        revision,
        header_type: ht,
        subsystem,
        bars,
        backing: Backing::Port,
    });
    true
}

/// Replaces an ivshmem function's record by the HCA it carries, if any.
fn adopt_emulated(d: &mut Device, wait: core::time::Duration) {
    let Some(bar2) = d.bars[2].filter(|b| b.kind == BarKind::Memory64) else {
        return;
    };
    match crate::ivshmem::probe((bar2.addr, bar2.size), wait) {
        Ok(w) => {
            let c = w.config();
            let id = c.read32(cfg::VENDOR_ID);
            let rev_class = c.read32(cfg::REVISION);
            let ss = c.read32(cfg::SUBSYSTEM_VENDOR_ID);
            *d = Device {
                addr: d.addr,
                vendor: id as u16,
                device: (id >> 16) as u16,
                class: rev_class >> 8,
                revision: rev_class as u8,
                header_type: 0,
                subsystem: (ss as u16, (ss >> 16) as u16),
                bars: w.bar_info(),
                backing: Backing::Emulated(w),
            };
        }
        // One line that says what to do, not a chain of consequences.
        Err(e @ crate::ivshmem::ProbeError::NoEmulator { .. }) => log::error!("{e}"),
        Err(e) => log::warn!("pci {}: ivshmem function left alone: {e}", d.addr),
    }
}

fn scan_bus(bus: u8, found: &mut Vec<Device>, visited: &mut [bool; 256]) {
    if core::mem::replace(&mut visited[usize::from(bus)], true) {
        return;
    }
    for dev in 0..32u8 {
        let f0 = PciAddress::new(0, bus, dev, 0);
        if !probe(f0, found) {
            continue;
        }
        let functions = if PciHeader::new(f0).has_multiple_functions(PortAccess) {
            8
        } else {
            1
        };
        for func in 0..functions {
            let addr = PciAddress::new(0, bus, dev, func);
            if func > 0 && !probe(addr, found) {
                continue;
            }
            if found.last().is_some_and(|d| d.header_type == 1) {
                // PCI-to-PCI bridge: the secondary bus number is byte 0x19.
                let secondary = (read(addr, 0x18) >> 8) as u8;
                if secondary > bus {
                    scan_bus(secondary, found, visited);
                }
            }
        }
    }
}

/// Enumerates once, depth-first from bus 0 through every bridge (as Linux's
/// `pci_scan_child_bus`), instead of probing all 256 buses. An ivshmem window
/// gets `emu_wait` to show the emulator's header.
pub fn init(emu_wait: core::time::Duration) {
    DEVICES.call_once(|| {
        let mut found = Vec::new();
        let mut visited = [false; 256];
        scan_bus(0, &mut found, &mut visited);
        // A multi-function host bridge means several root buses (one per
        // function) on some chipsets.
        if PciHeader::new(PciAddress::new(0, 0, 0, 0)).has_multiple_functions(PortAccess) {
            for func in 1..8u8 {
                let (vendor, _) = PciHeader::new(PciAddress::new(0, 0, 0, func)).id(PortAccess);
                if vendor != 0xffff {
                    scan_bus(func, &mut found, &mut visited);
                }
            }
        }
        found.sort_by_key(|d| d.addr);
        for d in found
            .iter_mut()
            .filter(|d| (d.vendor, d.device) == (0x1af4, 0x1110))
        {
            adopt_emulated(d, emu_wait);
        }
        log::info!("pci: {} functions found", found.len());
        found
    });
}

/// Tells every emulator serving this guest that it is going away.
pub fn shutdown_emulated() {
    for d in devices() {
        if let Backing::Emulated(w) = d.backing {
            w.set_guest_state(crate::ivshmem::GuestState::ShutDown);
        }
    }
}

/// Every function enumeration found.
pub fn devices() -> &'static [Device] {
    DEVICES.get().map_or(&[], Vec::as_slice)
}

/// Reads config space of an enumerated function.
pub fn config(d: &Device) -> Arc<dyn ConfigSpace> {
    match d.backing {
        Backing::Emulated(w) => Arc::new(w.config()),
        Backing::Port => {
            let a = d.addr;
            Arc::new(PortConfig(PciAddress::new(
                a.segment, a.bus, a.device, a.function,
            )))
        }
    }
}

/// A `hal::PciFunction` without mapped BARs, for inspection (lspci).
pub fn inspect(d: &Device) -> PciFunction {
    PciFunction::new(d.addr, config(d), d.bars, Default::default())
}

/// Hands a function to a driver: memory BARs are mapped uncached.
pub fn function(d: &Device) -> Result<PciFunction, &'static str> {
    let mut bars: [Option<Bar>; 6] = Default::default();
    if let Backing::Emulated(w) = d.backing {
        for (i, (_, len, va)) in [0, 2].into_iter().zip(w.bars()) {
            let base = NonNull::new(va as *mut u8).ok_or("window at address 0")?;
            // SAFETY: inside the window `ivshmem::probe` mapped uncached for
            // good; the only `Bar` made for this part of it.
            bars[i] = Some(unsafe { Bar::from_mmio(base, len as usize) });
        }
        return Ok(PciFunction::new(d.addr, config(d), d.bars, bars));
    }
    for info in d.bars.iter().flatten() {
        if info.kind == BarKind::Io || info.addr == 0 || info.size == 0 {
            continue;
        }
        let va = crate::mm::paging::map_mmio(info.addr, info.size)?;
        let len = usize::try_from(info.size).map_err(|_| "BAR too large")?;
        let base = NonNull::new(va as *mut u8).ok_or("BAR at address 0")?;
        // SAFETY: just mapped uncached at `va` for `len` bytes, for good; the only
        // `Bar` made for it (PciFunction's claim registry hands it out once).
        bars[usize::from(info.index)] = Some(unsafe { Bar::from_mmio(base, len) });
    }
    Ok(PciFunction::new(d.addr, config(d), d.bars, bars))
}
