//! x86_64 CPU set-up.
//!
//! GDT with a TSS (a separate stack for double faults), IDT with exception
//! handlers, port I/O, legacy PIC masking.

pub mod gdt;
pub mod idt;
pub mod port;

/// Loads the GDT/TSS and the IDT, and masks the legacy PICs (this kernel
/// never enables interrupts; everything is polled).
pub fn init() {
    port::outb(0x21, 0xff);
    port::outb(0xa1, 0xff);
    gdt::init();
    idt::init();
}

/// Reads the time-stamp counter.
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc only reads a counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}
