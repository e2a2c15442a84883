//! The PCI configuration space of an MT27500 (ConnectX-3) function.
//!
//! Ids, class, two 64-bit memory BARs, a capability list (PM, VPD with a read-only
//! VPD image, MSI-X, PCIe) and the command register the model obeys; MSI-X
//! delivery, power states, VPD writes and extended (PCIe) config space are not
//! modelled.
//!
//! Only the bits a real function implements are writable: the command
//! register (I/O, memory, bus master, parity, SERR, INTx disable), the BAR
//! address bits above the BAR size, cache line / latency, interrupt line, the
//! MSI-X enable and mask bits, PCIe device and link control. The status
//! register's error bits are write-one-to-clear. While a software reset is in
//! progress every config read returns all ones (as the function drops off the
//! bus), which is what Linux's `mlx4_reset` polls the vendor ID for.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use hal::{BarInfo, BarKind, Clock, ConfigSpace};

/// Mellanox's PCI vendor ID.
pub const VENDOR_MELLANOX: u16 = 0x15b3;
/// ConnectX-3 (MT27500 family).
pub const DEVICE_CONNECTX3: u16 = 0x1003;
/// Subsystem id of a dual-port VPI card (MCX354A).
pub const SUBSYSTEM_ID: u16 = 0x0050;
/// Class code: network controller, "other" (lspci: `Network controller [0280]`).
pub const CLASS_CODE: u32 = 0x02_8000;
/// Revision id reported.
pub const REVISION: u8 = 0x00;
/// BAR0 ("DCS": HCR, reset, catas buffer) size.
pub const BAR0_SIZE: u64 = 1 << 20;
/// BAR2 (UAR pages) size.
pub const BAR2_SIZE: u64 = 8 << 20;
/// Address BAR0 is assigned before any reset.
pub const BAR0_ADDR: u64 = 0xf7c0_0000;
/// Address BAR2 is assigned before any reset.
pub const BAR2_ADDR: u64 = 0xf000_0000;

/// Offsets of the capabilities in config space.
pub mod caps {
    /// Power management capability.
    pub const PM: u16 = 0x40;
    /// Vital product data capability.
    pub const VPD: u16 = 0x48;
    /// PCI Express capability.
    pub const EXP: u16 = 0x60;
    /// MSI-X capability.
    pub const MSIX: u16 = 0x9c;
}

const CMD_MEMORY: u32 = 1 << 1;
const CMD_MASTER: u32 = 1 << 2;

/// The VPD image (PCI 3.0 6.4): identifier string, then a read-only
/// section with part number, EC level, serial number, a vendor field and
/// the checksum, then the end tag; padded to 256 bytes.
pub fn vpd_image() -> Vec<u8> {
    let id = b"CX354A - ConnectX-3 QSFP";
    let mut v = vec![0x82, id.len() as u8, 0];
    v.extend_from_slice(id);
    let fields: [(&[u8; 2], &[u8]); 4] = [
        (b"PN", b"MCX354A-FCBT"),
        (b"EC", b"A4"),
        (b"SN", b"MT1234X00042"),
        (b"V0", b"PCIeGen3 x8"),
    ];
    let mut ro = Vec::new();
    for (k, val) in fields {
        ro.extend_from_slice(k);
        ro.push(val.len() as u8);
        ro.extend_from_slice(val);
    }
    // RV: checksum byte plus reserved bytes to the end of the section.
    ro.extend_from_slice(b"RV");
    ro.push(1);
    let ro_len = ro.len() + 1;
    v.push(0x90);
    v.extend_from_slice(&(ro_len as u16).to_le_bytes());
    v.extend_from_slice(&ro);
    let sum = v.iter().fold(0u8, |a, b| a.wrapping_add(*b));
    v.push(0u8.wrapping_sub(sum));
    v.push(0x78);
    v.resize(256, 0);
    v
}

/// The config space model, shared (atomics) between the driver's thread and
/// the model.
pub struct PciConfig {
    words: Vec<AtomicU32>,
    masks: Vec<u32>,
    /// Config reads return all ones until this time (ns on the model clock).
    reset_until_ns: AtomicU64,
    /// Bumped after every write and reset ([`PciConfig::changes`]).
    changes: AtomicU64,
    clock: Arc<dyn Clock>,
}

fn power_on_image() -> (Vec<u32>, Vec<u32>) {
    let mut w = vec![0u32; 1024];
    let mut m = vec![0u32; 1024];
    w[0] = u32::from(DEVICE_CONNECTX3) << 16 | u32::from(VENDOR_MELLANOX);
    w[1] = 0x0010_0000; // status: capability list; command: all off
    m[1] = 0x0000_0547;
    w[2] = CLASS_CODE << 8 | u32::from(REVISION);
    m[3] = 0x0000_ffff; // cache line size, latency timer
    // BAR0: 64-bit non-prefetchable memory; BAR2: 64-bit prefetchable.
    w[4] = BAR0_ADDR as u32 | 0x4;
    m[4] = !(BAR0_SIZE as u32 - 1);
    w[5] = (BAR0_ADDR >> 32) as u32;
    m[5] = u32::MAX;
    w[6] = BAR2_ADDR as u32 | 0xc;
    m[6] = !(BAR2_SIZE as u32 - 1);
    w[7] = (BAR2_ADDR >> 32) as u32;
    m[7] = u32::MAX;
    w[11] = u32::from(SUBSYSTEM_ID) << 16 | u32::from(VENDOR_MELLANOX);
    w[13] = u32::from(caps::PM);
    w[15] = 0x0000_0100; // INTA, line 0
    m[15] = 0x0000_00ff;
    // PM: version 3, next VPD.
    w[0x40 / 4] = 0x0003_0000 | u32::from(caps::VPD) << 8 | 0x01;
    w[0x44 / 4] = 0x0000_0008; // D0, no soft reset
    m[0x44 / 4] = 0x0000_0003;
    // VPD: next MSI-X. Address register writable, data reads zero.
    w[0x48 / 4] = u32::from(caps::MSIX) << 8 | 0x03;
    m[0x48 / 4] = 0xffff_0000;
    // PCIe v2 endpoint, last in the list.
    w[0x60 / 4] = 0x0002_0010;
    w[0x64 / 4] = 0x0000_8fc1; // max payload 256, FLR capable
    w[0x68 / 4] = 0x0000_2810; // DEVCTL: max read req 512, relaxed ordering
    m[0x68 / 4] = 0x0000_ffff;
    w[0x6c / 4] = 0x0000_0083; // LNKCAP: 8 GT/s, x8
    w[0x70 / 4] = 0x1083_0000; // LNKSTA: 8 GT/s x8; LNKCTL 0
    m[0x70 / 4] = 0x0000_ffff;
    // MSI-X: 128 vectors, table in BAR0 at 0x7c000, PBA at 0x7e000.
    w[0x9c / 4] = 0x007f_0000 | u32::from(caps::EXP) << 8 | 0x11;
    m[0x9c / 4] = 0xc000_0000;
    w[0xa0 / 4] = 0x0007_c000;
    w[0xa4 / 4] = 0x0007_e000;
    (w, m)
}

impl PciConfig {
    /// The power-on config space.
    pub fn new(clock: Arc<dyn Clock>) -> PciConfig {
        let (w, masks) = power_on_image();
        PciConfig {
            words: w.into_iter().map(AtomicU32::new).collect(),
            masks,
            reset_until_ns: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            clock,
        }
    }

    /// A reset is in progress. The clock is read only while one may be
    /// (every DMA asks): the first look after its end clears the mark (the
    /// clock only moves forward), unless a newer reset replaced it.
    fn in_reset(&self) -> bool {
        let until = self.reset_until_ns.load(Ordering::Acquire);
        if until == 0 {
            return false;
        }
        if self.clock.now_ns() < until {
            return true;
        }
        let _ = self
            .reset_until_ns
            .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed);
        false
    }

    /// The raw dword (ignores a reset in progress).
    pub fn raw(&self, off: u16) -> u32 {
        self.words[usize::from(off / 4) % 1024].load(Ordering::Acquire)
    }

    /// What config reads of the first `out.len()` dwords return now (all
    /// ones during a reset), with one look at the clock: what a front end
    /// that publishes the header as an image (`cx3-emu`) copies each round.
    pub fn read_dwords(&self, out: &mut [u32]) {
        let reset = self.in_reset();
        for (i, o) in out.iter_mut().enumerate() {
            *o = if reset {
                u32::MAX
            } else {
                self.words
                    .get(i)
                    .map_or(u32::MAX, |w| w.load(Ordering::Acquire))
            };
        }
    }

    /// How many writes and resets the config space has seen: a front end
    /// that publishes the header as an image copies it again only when
    /// this moved (or a reset may have ended: reads return all ones until
    /// then).
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Memory decoding enabled (and not in reset).
    pub fn memory_enabled(&self) -> bool {
        !self.in_reset() && self.raw(4) & CMD_MEMORY != 0
    }

    /// Bus mastering enabled (and not in reset): the model may DMA.
    pub fn bus_master(&self) -> bool {
        !self.in_reset() && self.raw(4) & CMD_MASTER != 0
    }

    /// A software reset: the function leaves the bus for `duration_ns` and
    /// comes back with its power-on config space (command register clear,
    /// BAR addresses zero; software must restore them).
    pub fn reset(&self, duration_ns: u64) {
        let (w, _) = power_on_image();
        for (i, v) in w.into_iter().enumerate() {
            let v = match i {
                4 => 0x4,
                6 => 0xc,
                5 | 7 => 0,
                _ => v,
            };
            self.words[i].store(v, Ordering::Release);
        }
        self.reset_until_ns.store(
            self.clock.now_ns().saturating_add(duration_ns),
            Ordering::Release,
        );
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// The BAR descriptions `hal::PciFunction` wants (as assigned at power on).
    pub fn bar_infos() -> [Option<BarInfo>; 6] {
        [
            Some(BarInfo {
                index: 0,
                kind: BarKind::Memory64,
                prefetchable: false,
                addr: BAR0_ADDR,
                size: BAR0_SIZE,
            }),
            None,
            Some(BarInfo {
                index: 2,
                kind: BarKind::Memory64,
                prefetchable: true,
                addr: BAR2_ADDR,
                size: BAR2_SIZE,
            }),
            None,
            None,
            None,
        ]
    }
}

impl ConfigSpace for PciConfig {
    fn read32(&self, offset: u16) -> u32 {
        if self.in_reset() {
            return u32::MAX;
        }
        self.raw(offset & !3)
    }

    fn write32(&self, offset: u16, value: u32) {
        if self.in_reset() {
            return;
        }
        let i = usize::from((offset & !3) / 4) % 1024;
        let mask = self.masks[i];
        let old = self.words[i].load(Ordering::Acquire);
        let mut new = (old & !mask) | (value & mask);
        if i == 1 {
            // Status error bits (31:27, 24) are write-one-to-clear.
            new &= !(value & 0xf900_0000);
        }
        if i == usize::from(caps::VPD / 4) && value & (1 << 31) == 0 {
            // VPD read: address in bits 30:16 (dword aligned); the data
            // register gets the four bytes and the flag (bit 31) sets.
            let addr = ((value >> 16) & 0x7ffc) as usize;
            let vpd = vpd_image();
            let d = (0..4).fold(0u32, |acc, k| {
                acc | u32::from(vpd.get(addr + k).copied().unwrap_or(0)) << (8 * k)
            });
            self.words[i + 1].store(d, Ordering::Release);
            new |= 1 << 31;
        }
        self.words[i].store(new, Ordering::Release);
        self.changes.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hal::fake::FakeClock;

    fn cfg() -> (Arc<FakeClock>, PciConfig) {
        let clock = Arc::new(FakeClock::new());
        (clock.clone(), PciConfig::new(clock))
    }

    #[test]
    fn identity_and_capability_chain() {
        let (_, c) = cfg();
        assert_eq!(c.read32(0), 0x1003_15b3);
        assert_eq!(c.read32(8) >> 8, 0x02_8000);
        assert_eq!(c.read32(0x2c), 0x0050_15b3);
        let mut chain = vec![];
        let mut p = c.read32(0x34) as u16 & 0xfc;
        while p != 0 && chain.len() < 8 {
            let dw = c.read32(p);
            chain.push((p, dw as u8));
            p = (dw >> 8) as u16 & 0xfc;
        }
        assert_eq!(
            chain,
            vec![(0x40, 0x01), (0x48, 0x03), (0x9c, 0x11), (0x60, 0x10)]
        );
    }

    #[test]
    fn bar_sizing_and_read_only_bits() {
        let (_, c) = cfg();
        c.write32(0x10, u32::MAX);
        assert_eq!(c.read32(0x10), 0xfff0_0004, "1 MiB, 64-bit memory");
        c.write32(0x18, u32::MAX);
        assert_eq!(c.read32(0x18), 0xff80_000c, "8 MiB, 64-bit prefetchable");
        c.write32(0x00, 0);
        assert_eq!(c.read32(0), 0x1003_15b3, "ids are read-only");
    }

    #[test]
    fn command_bits_gate_memory_and_dma_and_reset_hides_the_function() {
        let (clock, c) = cfg();
        assert!(!c.bus_master() && !c.memory_enabled());
        c.write32(4, 0x0000_0006);
        assert!(c.bus_master() && c.memory_enabled());
        c.reset(1_000_000);
        assert_eq!(c.read32(0), u32::MAX);
        assert!(!c.bus_master());
        clock.advance(core::time::Duration::from_millis(1));
        assert_eq!(c.read32(0), 0x1003_15b3);
        assert_eq!(c.read32(4) & 0xffff, 0, "command cleared by reset");
        assert_eq!(c.read32(0x10), 0x4, "BAR address lost by reset");
    }

    #[test]
    fn vpd_reads_back_a_valid_image() {
        let (_, c) = cfg();
        let mut bytes = Vec::new();
        for addr in (0..64u32).step_by(4) {
            c.write32(caps::VPD, addr << 16 | 0x9c03);
            assert_ne!(
                c.read32(caps::VPD) & (1 << 31),
                0,
                "flag set when data is ready"
            );
            bytes.extend_from_slice(&c.read32(caps::VPD + 4).to_le_bytes());
        }
        assert_eq!(bytes[0], 0x82);
        assert_eq!(&bytes[3..27], b"CX354A - ConnectX-3 QSFP");
        let img = vpd_image();
        let rv = img.windows(2).position(|w| w == b"RV").unwrap();
        assert_eq!(
            img[..=rv + 3].iter().fold(0u8, |a, b| a.wrapping_add(*b)),
            0,
            "checksum"
        );
        assert_eq!(img[rv + 4], 0x78, "end tag");
    }

    #[test]
    fn status_error_bits_are_write_one_to_clear() {
        let (_, c) = cfg();
        c.words[1].store(0xf910_0000, Ordering::Release);
        c.write32(4, 0x0800_0006);
        assert_eq!(c.read32(4), 0xf110_0006);
    }
}
