//! Leaving the machine with a pass or fail status.
//!
//! Leaving the machine: QEMU's `isa-debug-exit` device (port 0xf4) for pass and
//! fail, ACPI S5 and the reset register as fallbacks on other machines.
//!
//! QEMU exits with status `(code << 1) | 1`: 33 for [`ExitCode::Success`], 35
//! for [`ExitCode::Failure`]; `run-qemu.sh` maps 33 to 0.

use crate::arch::port::{inb, outb, outl, outw};

/// What the run amounted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ExitCode {
    /// Every scripted command succeeded / orderly poweroff.
    Success = 0x10,
    /// A command failed, or the kernel crashed.
    Failure = 0x11,
}

/// Leaves QEMU with `code`; on other machines tries ACPI poweroff, then halts.
pub fn exit(code: ExitCode) -> ! {
    crate::pci::shutdown_emulated();
    outl(0xf4, code as u32);
    // Not under QEMU with isa-debug-exit: ICH9 PM1a control at PMBASE+4
    // (QEMU q35 uses SLP_TYP 0 for S5).
    outw(0x604, 1 << 13);
    halt_forever()
}

/// Resets the machine through the 0xcf9 reset register, then the keyboard
/// controller; halts if neither works.
pub fn reboot() -> ! {
    crate::pci::shutdown_emulated();
    outb(0xcf9, 0x02);
    outb(0xcf9, 0x06);
    for _ in 0..100_000 {
        if inb(0x64) & 0x02 == 0 {
            break;
        }
    }
    outb(0x64, 0xfe);
    halt_forever()
}

/// Stops this CPU for good (interrupts are never enabled in this kernel).
pub fn halt_forever() -> ! {
    loop {
        x86_64::instructions::interrupts::disable();
        x86_64::instructions::hlt();
    }
}
