//! A PCI function as a driver sees it: config space, BAR descriptions, and
//! BARs that can be claimed once.
//!
//! The kernel builds a [`PciFunction`] from its enumeration (port-I/O config
//! access, MMIO mappings); tests and the device model build one over their
//! own config space and register backends. Drivers never learn which.

use alloc::sync::Arc;
use core::fmt;

use crate::{Bar, Error, Result};

/// Config-space access for one function (32-bit, aligned).
pub trait ConfigSpace: Send + Sync {
    /// Reads the dword at `offset` (4-byte aligned, below 4096).
    fn read32(&self, offset: u16) -> u32;
    /// Writes the dword at `offset` (4-byte aligned, below 4096).
    fn write32(&self, offset: u16, value: u32);
}

/// Standard config-space offsets and bits used by the drivers.
pub mod cfg {
    /// Vendor ID (16 bit).
    pub const VENDOR_ID: u16 = 0x00;
    /// Device ID (16 bit).
    pub const DEVICE_ID: u16 = 0x02;
    /// Command register (16 bit).
    pub const COMMAND: u16 = 0x04;
    /// Status register (16 bit).
    pub const STATUS: u16 = 0x06;
    /// Revision ID (8 bit).
    pub const REVISION: u16 = 0x08;
    /// Subsystem vendor ID (16 bit).
    pub const SUBSYSTEM_VENDOR_ID: u16 = 0x2c;
    /// Subsystem ID (16 bit).
    pub const SUBSYSTEM_ID: u16 = 0x2e;
    /// Capabilities pointer (8 bit).
    pub const CAP_PTR: u16 = 0x34;
    /// Command: memory space enable.
    pub const COMMAND_MEMORY: u16 = 1 << 1;
    /// Command: bus master enable.
    pub const COMMAND_MASTER: u16 = 1 << 2;
    /// Command: INTx emulation disable (the function must not assert INTx).
    pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
    /// Status: capability list present.
    pub const STATUS_CAP_LIST: u16 = 1 << 4;
    /// Capability ID: PCI Express.
    pub const CAP_ID_EXP: u8 = 0x10;
    /// Capability ID: MSI-X.
    pub const CAP_ID_MSIX: u8 = 0x11;
    /// Capability ID: power management.
    pub const CAP_ID_PM: u8 = 0x01;
    /// Capability ID: vital product data.
    pub const CAP_ID_VPD: u8 = 0x03;
    /// PCIe capability: device control (offset from the capability).
    pub const EXP_DEVCTL: u16 = 0x08;
    /// PCIe capability: link control (offset from the capability).
    pub const EXP_LNKCTL: u16 = 0x10;
}

/// Segment, bus, device, function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PciAddress {
    /// PCI segment (domain).
    pub segment: u16,
    /// Bus number.
    pub bus: u8,
    /// Device number (0..32).
    pub device: u8,
    /// Function number (0..8).
    pub function: u8,
}

impl fmt::Display for PciAddress {
    /// lspci's short form, `00:03.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:02x}:{:02x}.{:x}",
            self.bus, self.device, self.function
        )
    }
}

/// What kind of BAR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarKind {
    /// 32-bit memory BAR.
    Memory32,
    /// 64-bit memory BAR (occupies two slots).
    Memory64,
    /// I/O port BAR.
    Io,
}

/// A sized BAR as enumeration found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarInfo {
    /// BAR index (0..6).
    pub index: u8,
    /// Memory or I/O, and width.
    pub kind: BarKind,
    /// Prefetchable memory.
    pub prefetchable: bool,
    /// Base address (bus address for memory, port for I/O).
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
}

/// One PCI function handed to a driver.
pub struct PciFunction {
    addr: PciAddress,
    config: Arc<dyn ConfigSpace>,
    info: [Option<BarInfo>; 6],
    bars: claims::Slots,
}

/// BAR slots that can each be taken once (an atomic flag per slot).
mod claims {
    use crate::Bar;
    use core::sync::atomic::{AtomicBool, Ordering};

    pub struct Slots {
        taken: [AtomicBool; 6],
        bars: [Option<Bar>; 6],
    }

    impl Slots {
        pub fn new(bars: [Option<Bar>; 6]) -> Slots {
            Slots {
                taken: Default::default(),
                bars,
            }
        }
        /// A window over slot `i` the first time; `None` afterwards.
        pub fn take(&self, i: usize) -> Option<Option<Bar>> {
            let slot = self.taken.get(i)?;
            if slot.swap(true, Ordering::AcqRel) {
                return None;
            }
            Some(self.bars[i].as_ref().and_then(|b| b.slice(0, b.len())))
        }
        pub fn release(&self, i: usize) {
            if let Some(s) = self.taken.get(i) {
                s.store(false, Ordering::Release);
            }
        }
    }
}

impl fmt::Debug for PciFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PciFunction({} {:04x}:{:04x})",
            self.addr,
            self.vendor_id(),
            self.device_id()
        )
    }
}

impl PciFunction {
    /// A function at `addr` with its config space, sized BARs and the register
    /// windows mapped for its memory BARs (same index as `info`).
    pub fn new(
        addr: PciAddress,
        config: Arc<dyn ConfigSpace>,
        info: [Option<BarInfo>; 6],
        bars: [Option<Bar>; 6],
    ) -> PciFunction {
        PciFunction {
            addr,
            config,
            info,
            bars: claims::Slots::new(bars),
        }
    }

    /// Where the function sits.
    pub fn address(&self) -> PciAddress {
        self.addr
    }

    /// Reads a config dword.
    pub fn read32(&self, off: u16) -> u32 {
        self.config.read32(off & !3)
    }
    /// Writes a config dword.
    pub fn write32(&self, off: u16, v: u32) {
        self.config.write32(off & !3, v)
    }
    /// Reads a config word (2-byte aligned).
    pub fn read16(&self, off: u16) -> u16 {
        (self.read32(off) >> ((off & 2) * 8)) as u16
    }
    /// Reads a config byte.
    pub fn read8(&self, off: u16) -> u8 {
        (self.read32(off) >> ((off & 3) * 8)) as u8
    }
    /// Writes a config word by read-modify-write of its dword.
    ///
    /// Writing the command register this way also writes back the status
    /// word; its bits are write-one-to-clear, so they are masked off.
    pub fn write16(&self, off: u16, v: u16) {
        let shift = (off & 2) * 8;
        let mut dw = self.read32(off);
        if off & !3 == cfg::COMMAND {
            dw &= 0x0000_ffff; // do not clear RW1C status bits
        }
        dw = (dw & !(0xffff << shift)) | (u32::from(v) << shift);
        self.write32(off, dw);
    }

    /// Vendor ID.
    pub fn vendor_id(&self) -> u16 {
        self.read16(cfg::VENDOR_ID)
    }
    /// Device ID.
    pub fn device_id(&self) -> u16 {
        self.read16(cfg::DEVICE_ID)
    }
    /// Revision ID.
    pub fn revision(&self) -> u8 {
        self.read8(cfg::REVISION)
    }
    /// Class code, subclass and programming interface (24 bit).
    pub fn class(&self) -> u32 {
        self.read32(cfg::REVISION) >> 8
    }
    /// Command register.
    pub fn command(&self) -> u16 {
        self.read16(cfg::COMMAND)
    }
    /// Sets bits in the command register.
    pub fn set_command_bits(&self, bits: u16) {
        self.write16(cfg::COMMAND, self.command() | bits);
    }
    /// Clears bits in the command register.
    pub fn clear_command_bits(&self, bits: u16) {
        self.write16(cfg::COMMAND, self.command() & !bits);
    }
    /// Enables memory decoding and bus mastering (Linux `pci_enable_device`
    /// plus `pci_set_master`).
    pub fn enable(&self) {
        self.set_command_bits(cfg::COMMAND_MEMORY | cfg::COMMAND_MASTER);
    }

    /// The sized BAR `i`, if present.
    pub fn bar_info(&self, i: usize) -> Option<BarInfo> {
        self.info.get(i).copied().flatten()
    }

    /// Claims memory BAR `i`. Each BAR can be claimed once until released.
    pub fn take_bar(&self, i: usize) -> Result<Bar> {
        if i >= 6 {
            return Err(Error::NoSuchBar);
        }
        match self.bars.take(i) {
            None => Err(Error::AlreadyClaimed),
            Some(Some(bar)) => Ok(bar),
            Some(None) => {
                self.bars.release(i);
                Err(Error::NoSuchBar)
            }
        }
    }

    /// Gives a claimed BAR back (Linux `pci_release_regions`).
    pub fn release_bar(&self, i: usize, bar: Bar) {
        drop(bar);
        self.bars.release(i);
    }

    /// The capability list: `(id, offset)` pairs in list order. A malformed
    /// list (loops, pointers into the header) ends the walk, it never hangs.
    pub fn capabilities(&self) -> impl Iterator<Item = (u8, u16)> + '_ {
        let has_list = self.read16(cfg::STATUS) & cfg::STATUS_CAP_LIST != 0;
        let mut next = if has_list {
            self.read8(cfg::CAP_PTR) & !3
        } else {
            0
        };
        let mut budget = 48; // at most 48 capabilities fit in 192 bytes
        core::iter::from_fn(move || {
            if next < 0x40 || budget == 0 {
                return None;
            }
            budget -= 1;
            let off = u16::from(next);
            let dw = self.read32(off);
            next = (dw >> 8) as u8 & !3;
            Some((dw as u8, off))
        })
    }

    /// Offset of the first capability with `id`.
    pub fn find_capability(&self, id: u8) -> Option<u16> {
        self.capabilities()
            .find(|&(c, _)| c == id)
            .map(|(_, off)| off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{MemBar, MemConfig};

    fn function() -> (Arc<MemConfig>, PciFunction) {
        let cfg = Arc::new(MemConfig::new());
        cfg.set32(0x00, 0x1003_15b3);
        cfg.set32(0x04, 0x0010_0000); // status: capability list
        cfg.set32(0x08, 0x0200_0001); // class 02:00:00, revision 1
        cfg.set32(0x34, 0x40);
        cfg.set32(0x40, 0x0000_5001); // PM, next 0x50
        cfg.set32(0x50, 0x0000_4010); // PCIe, next 0x40: a loop
        let bar0 = Bar::from_backend(Arc::new(MemBar::new(0x1000)), 0x1000);
        let info = BarInfo {
            index: 0,
            kind: BarKind::Memory64,
            prefetchable: false,
            addr: 0xfe00_0000,
            size: 0x1000,
        };
        let f = PciFunction::new(
            PciAddress {
                bus: 0,
                device: 3,
                ..Default::default()
            },
            cfg.clone(),
            [Some(info), None, None, None, None, None],
            [Some(bar0), None, None, None, None, None],
        );
        (cfg, f)
    }

    #[test]
    fn ids_class_and_address() {
        let (_, f) = function();
        assert_eq!((f.vendor_id(), f.device_id()), (0x15b3, 0x1003));
        assert_eq!(f.revision(), 1);
        assert_eq!(f.class(), 0x02_0000);
        assert_eq!(f.address().to_string(), "00:03.0");
    }

    #[test]
    fn enable_sets_memory_and_master_without_clearing_status() {
        let (cfg, f) = function();
        cfg.set32(0x04, 0xf810_0000); // error bits set in status
        f.enable();
        assert_eq!(f.command(), 0x6);
        // Status written back as zero: RW1C bits untouched.
        assert_eq!(cfg.last_write(0x04), Some(0x0000_0006));
    }

    #[test]
    fn bars_are_claimed_once() {
        let (_, f) = function();
        let b = f.take_bar(0).unwrap();
        assert_eq!(f.take_bar(0).err(), Some(Error::AlreadyClaimed));
        f.release_bar(0, b);
        assert!(f.take_bar(0).is_ok());
        assert_eq!(f.take_bar(2).err(), Some(Error::NoSuchBar));
        assert_eq!(f.take_bar(9).err(), Some(Error::NoSuchBar));
        assert_eq!(f.bar_info(0).unwrap().size, 0x1000);
    }

    #[test]
    fn capability_walk_survives_a_loop() {
        let (_, f) = function();
        let caps: Vec<_> = f.capabilities().collect();
        assert_eq!(caps.len(), 48);
        assert_eq!(caps[0], (cfg::CAP_ID_PM, 0x40));
        assert_eq!(f.find_capability(cfg::CAP_ID_EXP), Some(0x50));
        assert_eq!(f.find_capability(cfg::CAP_ID_MSIX), None);
    }
}
