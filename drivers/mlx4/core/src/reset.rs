//! The HCA reset with PCI header save and restore, as Linux's `reset.c` does it.
//!
//! Linux: `reset.c` (`mlx4_reset`), plus the ownership semaphore of `main.c`
//! (`mlx4_get_ownership`, `mlx4_free_ownership`). Nothing is left out.

use core::time::Duration;

use hal::pci::cfg;
use hal::time::poll_until;
use hal::{Bar, Clock, PciFunction};
use mlx4_hw::hcr::*;

use crate::{Error, Result, mlx4_err};

/// Linux `MLX4_SEM_TIMEOUT_JIFFIES`: 10 s for the HW semaphore.
pub const SEM_TIMEOUT: Duration = Duration::from_secs(10);
/// Linux `MLX4_RESET_TIMEOUT_JIFFIES`: 2 s for the device to come back.
pub const RESET_TIMEOUT: Duration = Duration::from_secs(2);

/// Linux `mlx4_get_ownership`: a read of 0 claims the HCA.
pub fn get_ownership(bar0: &Bar) -> bool {
    bar0.read32(OWNER_BASE) == 0
}

/// Linux `mlx4_free_ownership`: write 0, then wait a second.
pub fn free_ownership(bar0: &Bar, clock: &dyn Clock) {
    bar0.write32(OWNER_BASE, 0);
    clock.delay(Duration::from_millis(1000));
}

/// Linux `mlx4_reset`: save config dwords 0..63 (but 22 and 23), take the
/// HW semaphore (polled in 1 ms steps for up to 10 s), hit reset, wait 1 s,
/// wait for the vendor ID to read back (2 s), restore the PCIe device and
/// link control registers, then dwords 0..15 with the command register last.
pub fn reset(pdev: &PciFunction, bar0: &Bar, clock: &dyn Clock) -> Result<()> {
    let pci = pdev.address();
    let mut hdr = [0u32; 64];
    for (i, h) in hdr.iter_mut().enumerate() {
        if i == 22 || i == 23 {
            continue;
        }
        *h = pdev.read32((i * 4) as u16);
    }
    let pcie_cap = pdev.find_capability(cfg::CAP_ID_EXP);
    let Some(reset) = bar0.slice(RESET_BASE, RESET_SIZE) else {
        mlx4_err!(pci, "Couldn't map HCA reset register, aborting.");
        return Err(Error::NoDevice);
    };
    // Grab the HW semaphore to lock out flash updates.
    let sem = poll_until(clock, SEM_TIMEOUT, || {
        if reset.read32(SEM_OFFSET) == 0 {
            Some(())
        } else {
            clock.delay(Duration::from_millis(1));
            None
        }
    });
    if sem.is_err() {
        mlx4_err!(pci, "Failed to obtain HW semaphore, aborting");
        return Err(Error::ResetSemaphore);
    }
    reset.write_be32(RESET_OFFSET, RESET_VALUE);
    // Docs say to wait one second before accessing the device.
    clock.delay(Duration::from_millis(1000));
    let back = poll_until(clock, RESET_TIMEOUT, || {
        if pdev.vendor_id() != 0xffff {
            Some(())
        } else {
            clock.delay(Duration::from_millis(1));
            None
        }
    });
    if back.is_err() {
        mlx4_err!(pci, "PCI device did not come back after reset, aborting.");
        return Err(Error::ResetTimeout);
    }
    if let Some(cap) = pcie_cap {
        let devctl = cap + cfg::EXP_DEVCTL;
        pdev.write16(
            devctl,
            (hdr[usize::from(devctl / 4)] >> ((devctl & 2) * 8)) as u16,
        );
        let lnkctl = cap + cfg::EXP_LNKCTL;
        pdev.write16(
            lnkctl,
            (hdr[usize::from(lnkctl / 4)] >> ((lnkctl & 2) * 8)) as u16,
        );
    }
    for (i, &h) in hdr.iter().enumerate().take(16) {
        if i * 4 == usize::from(cfg::COMMAND) {
            continue;
        }
        pdev.write32((i * 4) as u16, h);
    }
    pdev.write32(cfg::COMMAND, hdr[usize::from(cfg::COMMAND / 4)]);
    Ok(())
}
