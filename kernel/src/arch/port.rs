//! x86 port I/O behind safe functions.
//!
//! x86 port I/O, fenced behind safe functions for the few fixed ports the
//! kernel owns (serial, PIT, PCI config, isa-debug-exit, reset).

use x86_64::instructions::port::Port;

/// Reads a byte from `port`.
pub fn inb(port: u16) -> u8 {
    // SAFETY: only ports of legacy devices the kernel drives itself (COM1, PIT,
    // keyboard controller, PCI config); reading them cannot affect memory.
    unsafe { Port::<u8>::new(port).read() }
}

/// Writes a byte to `port`.
pub fn outb(port: u16, v: u8) {
    // SAFETY: as for `inb`; these devices cannot write memory.
    unsafe { Port::<u8>::new(port).write(v) }
}

/// Reads a dword from `port`.
pub fn inl(port: u16) -> u32 {
    // SAFETY: as for `inb`.
    unsafe { Port::<u32>::new(port).read() }
}

/// Writes a dword to `port`.
pub fn outl(port: u16, v: u32) {
    // SAFETY: as for `outb`.
    unsafe { Port::<u32>::new(port).write(v) }
}

/// Writes a word to `port`.
pub fn outw(port: u16, v: u16) {
    // SAFETY: as for `outb`.
    unsafe { Port::<u16>::new(port).write(v) }
}
