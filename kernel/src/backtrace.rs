//! Frame-pointer backtraces (the kernel is built with frame pointers kept).
//!
//! Each frame is `[rbp] = caller's rbp, [rbp + 8] = return address`; the chain
//! ends at the zero the boot trampoline puts in rbp. Every frame pointer is
//! checked against the known stacks before it is read, so a corrupt chain ends
//! the walk instead of faulting again. Resolve addresses with
//! `addr2line -e target/x86_64-target/release/kernel`.

use core::fmt::Write;

const MAX_FRAMES: usize = 32;

fn on_a_stack(addr: u64) -> bool {
    let (lo, hi) = boot::boot_stack();
    addr.is_multiple_of(8) && addr >= lo && addr + 16 <= hi
}

/// Prints `#0 pc` and then one line per caller.
pub fn print(out: &mut dyn Write, pc: u64, mut rbp: u64) {
    let _ = writeln!(out, "    backtrace:");
    let _ = writeln!(out, "      #0  {pc:#018x}");
    for i in 1..MAX_FRAMES {
        if !on_a_stack(rbp) {
            break;
        }
        // SAFETY: `rbp` is 8-aligned and `[rbp, rbp + 16)` lies inside the
        // boot stack, which is mapped and readable.
        let (next, ret) = unsafe {
            let p = rbp as *const u64;
            (p.read_volatile(), p.add(1).read_volatile())
        };
        if ret == 0 {
            break;
        }
        let _ = writeln!(out, "      #{i:<2} {ret:#018x}");
        if next <= rbp {
            break; // frames must move up the stack
        }
        rbp = next;
    }
}

/// The current frame pointer.
pub fn current_rbp() -> u64 {
    let rbp: u64;
    // SAFETY: reads a register.
    unsafe {
        core::arch::asm!("mov {}, rbp", out(reg) rbp, options(nomem, nostack, preserves_flags))
    };
    rbp
}
