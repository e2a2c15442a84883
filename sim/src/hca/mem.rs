//! The device's only path to host memory: [`HostMemory`], by bus address, and
//! the [`DmaFault`] an access outside the platform's memory produces; no
//! IOMMU page tables or ATS are modelled.
//!
//! Every DMA the model performs (mailboxes, ICM, MTT lookups, EQE writes)
//! goes through one [`HostMemory`] object, gated on the bus-master bit of the
//! config space. `hal::fake::ArenaDma` implements it for host tests, and each
//! front end over the guest memory it serves (`GuestRam`, `GuestMemory`).

use core::fmt;

use hal::BusAddr;
use hal::fake::ArenaDma;

/// Why a DMA failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmaFaultKind {
    /// The range is (partly) outside the memory the platform exposes.
    OutOfRange,
    /// Bus mastering is disabled in the command register.
    BusMasterOff,
}

/// One failed device access to host memory (what an IOMMU would report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaFault {
    /// First bus address of the access.
    pub bus: u64,
    /// Length in bytes.
    pub len: usize,
    /// A device write (else a read).
    pub write: bool,
    /// Why it failed.
    pub kind: DmaFaultKind,
}

impl fmt::Display for DmaFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DMA {} of {} bytes at bus {:#x}: {}",
            if self.write { "write" } else { "read" },
            self.len,
            self.bus,
            match self.kind {
                DmaFaultKind::OutOfRange => "outside host memory",
                DmaFaultKind::BusMasterOff => "bus mastering disabled",
            }
        )
    }
}

/// Host memory as the device reaches it: by bus address, never by pointer.
pub trait HostMemory: Send + Sync {
    /// Reads `buf.len()` bytes at `bus`.
    fn read(&self, bus: u64, buf: &mut [u8]) -> Result<(), DmaFault>;
    /// Writes `buf` at `bus`.
    fn write(&self, bus: u64, buf: &[u8]) -> Result<(), DmaFault>;
}

fn out_of_range(bus: u64, len: usize, write: bool) -> DmaFault {
    DmaFault {
        bus,
        len,
        write,
        kind: DmaFaultKind::OutOfRange,
    }
}

impl HostMemory for ArenaDma {
    fn read(&self, bus: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        self.device_read(BusAddr(bus), buf)
            .map_err(|_| out_of_range(bus, buf.len(), false))
    }
    fn write(&self, bus: u64, buf: &[u8]) -> Result<(), DmaFault> {
        self.device_write(BusAddr(bus), buf)
            .map_err(|_| out_of_range(bus, buf.len(), true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_accesses_by_bus_address_and_faults_outside() {
        let arena = ArenaDma::with_bus_base(8192, 0x10_0000);
        arena.write(0x10_0ffc, &[1, 2, 3, 4]).unwrap();
        let mut b = [0u8; 4];
        arena.read(0x10_0ffc, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4]);
        let e = arena.read(0x10_1ffe, &mut b).unwrap_err();
        assert_eq!(e.kind, DmaFaultKind::OutOfRange);
        assert_eq!((e.bus, e.len, e.write), (0x10_1ffe, 4, false));
        assert!(arena.write(0xfff, &[0]).is_err());
        assert!(e.to_string().contains("outside host memory"));
    }
}
