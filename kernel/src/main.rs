//! The research kernel.
//!
//! Boots from the `boot` crate's trampoline, brings up the console, memory, time
//! and PCI, and then runs the serial shell (or the commands given with `run=` on
//! the command line, for scripted runs).
//!
//! Leaves out: interrupts (everything is polled), SMP, user space, a file
//! system. Drivers and the IP stack run in the shell's idle loop
//! ([`progress`]).
#![no_std]
#![no_main]

extern crate alloc;

mod arch;
mod backtrace;
mod cmdline;
mod console;
mod hca;
mod ivshmem;
mod logger;
mod mm;
mod net;
mod pci;
mod pci_ids;
mod qemu;
mod serial;
mod time;

use core::fmt::Write;

use boot::BootInfo;

static BOOT_INFO: spin::Once<&'static BootInfo> = spin::Once::new();

/// What the loader handed over.
pub fn boot_info() -> &'static BootInfo {
    match BOOT_INFO.get() {
        Some(b) => b,
        None => unreachable!("boot info is set first thing in kernel_main"),
    }
}

/// Prints the memory map in the words of Linux's boot log.
pub fn print_memory_map(out: &mut dyn Write) {
    for r in boot_info().memory_map() {
        let _ = writeln!(
            out,
            "  [mem {:#018x}-{:#018x}] {}",
            r.start,
            r.end().saturating_sub(1),
            r.kind
        );
    }
}

#[unsafe(no_mangle)]
fn kernel_main(info: &'static BootInfo) -> ! {
    BOOT_INFO.call_once(|| info);
    serial::init();
    time::init(info.entry_tsc);
    logger::init(cmdline::get(info.cmdline(), "log"));
    arch::init();

    println!();
    // No heap yet: nothing here may allocate.
    let (open, loader, close) = match info.loader_name() {
        "" => ("", "", ""),
        name => (" (", name, ")"),
    };
    log::info!(
        "LegoIB research kernel {} (x86_64), booted by {}{open}{loader}{close}",
        env!("CARGO_PKG_VERSION"),
        info.protocol,
    );
    log::info!("Command line: {}", info.cmdline());
    log::info!(
        "tsc: {}.{:03} MHz",
        time::tsc_hz() / 1_000_000,
        time::tsc_hz() / 1000 % 1000
    );
    log::info!("BIOS-provided physical RAM map:");
    for r in info.memory_map() {
        log::info!(
            "  [mem {:#018x}-{:#018x}] {}",
            r.start,
            r.end().saturating_sub(1),
            r.kind
        );
    }

    mm::init(info);
    let (usable, _) = mm::frame::stats();
    let (heap, _, _) = mm::heap::stats();
    log::info!(
        "Memory: {}K usable, heap {}K, DMA pool {}K",
        usable / 1024,
        heap / 1024,
        mm::dma::total() / 1024
    );
    let emu_wait = cmdline::get(info.cmdline(), "cx3emu_wait")
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    pci::init(core::time::Duration::from_secs(emu_wait));

    hca::init();
    net::init(info.cmdline());
    // IPoIB ports whose link trained during the probe get their links now
    // (the others when they come up).
    net::poll();

    let boot_ns = time::tsc_to_ns(arch::rdtsc().saturating_sub(info.entry_tsc));
    log::info!(
        "Boot: kernel entry to shell prompt in {}.{:03} ms",
        boot_ns / 1_000_000,
        boot_ns / 1000 % 1000
    );

    if let Some(script) = cmdline::get(info.cmdline(), "run") {
        let ok = console::run_script(script);
        println!(
            "run: {}",
            if ok {
                "all commands succeeded"
            } else {
                "a command failed"
            }
        );
        qemu::exit(if ok {
            qemu::ExitCode::Success
        } else {
            qemu::ExitCode::Failure
        });
    }
    println!("Type 'help' for the list of commands.");
    console::shell(progress)
}

/// One pass of the progress loop: ib_core and the adapters, then the IP
/// stack (each skipped while a command holds it; never blocks).
pub fn progress() {
    hca::poll();
    net::poll();
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let mut out = serial::EmergencyConsole;
    let _ = writeln!(out, "\n!!! Kernel panic: {}", info.message());
    if let Some(loc) = info.location() {
        let _ = writeln!(out, "    at {}:{}:{}", loc.file(), loc.line(), loc.column());
    }
    backtrace::print(&mut out, 0, backtrace::current_rbp());
    let _ = writeln!(out, "System halted.");
    qemu::exit(qemu::ExitCode::Failure)
}
