//! Exception handling: every CPU exception is reported, then the machine stops.
//!
//! Exception handling: assembly stubs save every register into a
//! [`TrapFrame`], and one Rust handler prints the vector, error code, RIP,
//! CR2, the registers and a frame-pointer backtrace, then stops the machine
//! with a failure status; a page fault in a remote-backed region is served
//! by the page cache first and resumed. There are no interrupt handlers:
//! this kernel polls.

use core::fmt::Write;
use x86_64::VirtAddr;
use x86_64::registers::control::Cr2;
use x86_64::structures::idt::InterruptDescriptorTable;

use crate::serial::EmergencyConsole;

/// Registers as the stubs leave them on the stack (lowest address first).
#[repr(C)]
#[derive(Debug)]
pub struct TrapFrame {
    r15: u64,
    r14: u64,
    r13: u64,
    r12: u64,
    r11: u64,
    r10: u64,
    r9: u64,
    r8: u64,
    rbp: u64,
    rdi: u64,
    rsi: u64,
    rdx: u64,
    rcx: u64,
    rbx: u64,
    rax: u64,
    vector: u64,
    error_code: u64,
    rip: u64,
    cs: u64,
    rflags: u64,
    rsp: u64,
    ss: u64,
}

macro_rules! stubs {
    ($($vec:literal $err:ident),* $(,)?) => {
        core::arch::global_asm!(
            $(
                concat!(".global exc_stub_", stringify!($vec)),
                concat!("exc_stub_", stringify!($vec), ":"),
                stubs!(@err $err),
                concat!("push ", stringify!($vec)),
                "jmp exc_common",
            )*
            "exc_common:",
            "push rax", "push rbx", "push rcx", "push rdx", "push rsi", "push rdi", "push rbp",
            "push r8", "push r9", "push r10", "push r11", "push r12", "push r13", "push r14", "push r15",
            "mov rdi, rsp",
            "call {handler}",
            "ud2",
            handler = sym exception_handler,
        );
    };
    (@err noerr) => { "push 0" };
    (@err err) => { "" };
}

stubs!(
    0 noerr, 1 noerr, 2 noerr, 3 noerr, 4 noerr, 5 noerr, 6 noerr, 7 noerr,
    8 err, 10 err, 11 err, 12 err, 13 err, 16 noerr, 17 err,
    18 noerr, 19 noerr, 20 noerr, 21 err, 28 noerr, 29 err, 30 err,
);

// The page fault's stub returns when the page cache served the fault: the
// registers come back, the vector and error code go, and `iretq` resumes
// the faulting instruction; otherwise the same report as every exception.
core::arch::global_asm!(
    ".global exc_stub_14",
    "exc_stub_14:",
    "push 14",
    "push rax", "push rbx", "push rcx", "push rdx", "push rsi", "push rdi", "push rbp",
    "push r8", "push r9", "push r10", "push r11", "push r12", "push r13", "push r14", "push r15",
    "mov rdi, rsp",
    "call {pf}",
    "test al, al",
    "jz 2f",
    "pop r15", "pop r14", "pop r13", "pop r12", "pop r11", "pop r10", "pop r9", "pop r8",
    "pop rbp", "pop rdi", "pop rsi", "pop rdx", "pop rcx", "pop rbx", "pop rax",
    "add rsp, 16",
    "iretq",
    "2:",
    "mov rdi, rsp",
    "call {handler}",
    "ud2",
    pf = sym page_fault_handler,
    handler = sym exception_handler,
);

unsafe extern "C" {
    fn exc_stub_0();
    fn exc_stub_1();
    fn exc_stub_2();
    fn exc_stub_3();
    fn exc_stub_4();
    fn exc_stub_5();
    fn exc_stub_6();
    fn exc_stub_7();
    fn exc_stub_8();
    fn exc_stub_10();
    fn exc_stub_11();
    fn exc_stub_12();
    fn exc_stub_13();
    fn exc_stub_14();
    fn exc_stub_16();
    fn exc_stub_17();
    fn exc_stub_18();
    fn exc_stub_19();
    fn exc_stub_20();
    fn exc_stub_21();
    fn exc_stub_28();
    fn exc_stub_29();
    fn exc_stub_30();
}

static IDT: spin::Once<InterruptDescriptorTable> = spin::Once::new();

fn addr(f: unsafe extern "C" fn()) -> VirtAddr {
    VirtAddr::new(f as usize as u64)
}

/// Builds and loads the IDT.
pub fn init() {
    let idt = IDT.call_once(|| {
        let mut idt = InterruptDescriptorTable::new();
        // Each stub pushes a dummy error code exactly where the CPU does not.
        // SAFETY: every stub saves a `TrapFrame` and never returns to the code.
        unsafe {
            idt.divide_error.set_handler_addr(addr(exc_stub_0));
            idt.debug.set_handler_addr(addr(exc_stub_1));
            idt.non_maskable_interrupt
                .set_handler_addr(addr(exc_stub_2));
            idt.breakpoint.set_handler_addr(addr(exc_stub_3));
            idt.overflow.set_handler_addr(addr(exc_stub_4));
            idt.bound_range_exceeded.set_handler_addr(addr(exc_stub_5));
            idt.invalid_opcode.set_handler_addr(addr(exc_stub_6));
            idt.device_not_available.set_handler_addr(addr(exc_stub_7));
            idt.double_fault
                .set_handler_addr(addr(exc_stub_8))
                .set_stack_index(super::gdt::DOUBLE_FAULT_IST);
            idt.invalid_tss.set_handler_addr(addr(exc_stub_10));
            idt.segment_not_present.set_handler_addr(addr(exc_stub_11));
            idt.stack_segment_fault.set_handler_addr(addr(exc_stub_12));
            idt.general_protection_fault
                .set_handler_addr(addr(exc_stub_13));
            idt.page_fault.set_handler_addr(addr(exc_stub_14));
            idt.x87_floating_point.set_handler_addr(addr(exc_stub_16));
            idt.alignment_check.set_handler_addr(addr(exc_stub_17));
            idt.machine_check.set_handler_addr(addr(exc_stub_18));
            idt.simd_floating_point.set_handler_addr(addr(exc_stub_19));
            idt.virtualization.set_handler_addr(addr(exc_stub_20));
            idt.cp_protection_exception
                .set_handler_addr(addr(exc_stub_21));
            idt.hv_injection_exception
                .set_handler_addr(addr(exc_stub_28));
            idt.vmm_communication_exception
                .set_handler_addr(addr(exc_stub_29));
            idt.security_exception.set_handler_addr(addr(exc_stub_30));
        }
        idt
    });
    idt.load();
}

fn name(vector: u64) -> (&'static str, &'static str) {
    match vector {
        0 => ("Divide error", "#DE"),
        1 => ("Debug", "#DB"),
        2 => ("Non-maskable interrupt", "NMI"),
        3 => ("Breakpoint", "#BP"),
        4 => ("Overflow", "#OF"),
        5 => ("BOUND range exceeded", "#BR"),
        6 => ("Invalid opcode", "#UD"),
        7 => ("Device not available", "#NM"),
        8 => ("Double fault", "#DF"),
        10 => ("Invalid TSS", "#TS"),
        11 => ("Segment not present", "#NP"),
        12 => ("Stack-segment fault", "#SS"),
        13 => ("General protection fault", "#GP"),
        14 => ("Page fault", "#PF"),
        16 => ("x87 floating-point error", "#MF"),
        17 => ("Alignment check", "#AC"),
        18 => ("Machine check", "#MC"),
        19 => ("SIMD floating-point error", "#XM"),
        20 => ("Virtualization exception", "#VE"),
        21 => ("Control protection", "#CP"),
        28 => ("Hypervisor injection", "#HV"),
        29 => ("VMM communication", "#VC"),
        30 => ("Security exception", "#SX"),
        _ => ("Unknown exception", "#??"),
    }
}

/// Called by the page fault's stub with the saved registers: whether the
/// page cache served the fault (a fault in one of its regions), in which
/// case the stub resumes the faulting code.
extern "C" fn page_fault_handler(f: &TrapFrame) -> bool {
    let t0 = super::rdtsc();
    crate::mm::pcache::handle_fault(Cr2::read_raw(), f.error_code, t0)
}

/// Called by `exc_common` with the saved registers; never returns.
extern "C" fn exception_handler(f: &TrapFrame) -> ! {
    let mut out = EmergencyConsole;
    let (long, short) = name(f.vector);
    let _ = writeln!(
        out,
        "\n!!! CPU exception: {long} ({short}, vector {}), error code {:#x}",
        f.vector, f.error_code
    );
    if f.vector == 14 {
        let e = f.error_code;
        let _ = writeln!(
            out,
            "    {} access to {} page ({}-mode){}",
            if e & 0x10 != 0 {
                "instruction fetch"
            } else if e & 2 != 0 {
                "write"
            } else {
                "read"
            },
            if e & 1 != 0 {
                "a protected"
            } else {
                "a non-present"
            },
            if e & 4 != 0 { "user" } else { "kernel" },
            if e & 8 != 0 { ", reserved bit set" } else { "" },
        );
    }
    let cr2 = Cr2::read_raw();
    let _ = writeln!(out, "    RIP {:#018x}  CR2 {:#018x}", f.rip, cr2);
    let _ = writeln!(
        out,
        "    RSP {:#018x}  RFLAGS {:#010x}  CS {:#x}  SS {:#x}",
        f.rsp, f.rflags, f.cs, f.ss
    );
    let _ = writeln!(
        out,
        "    RAX {:#018x}  RBX {:#018x}  RCX {:#018x}",
        f.rax, f.rbx, f.rcx
    );
    let _ = writeln!(
        out,
        "    RDX {:#018x}  RSI {:#018x}  RDI {:#018x}",
        f.rdx, f.rsi, f.rdi
    );
    let _ = writeln!(
        out,
        "    RBP {:#018x}  R8  {:#018x}  R9  {:#018x}",
        f.rbp, f.r8, f.r9
    );
    let _ = writeln!(
        out,
        "    R10 {:#018x}  R11 {:#018x}  R12 {:#018x}",
        f.r10, f.r11, f.r12
    );
    let _ = writeln!(
        out,
        "    R13 {:#018x}  R14 {:#018x}  R15 {:#018x}",
        f.r13, f.r14, f.r15
    );
    crate::backtrace::print(&mut out, f.rip, f.rbp);
    let _ = writeln!(out, "System halted.");
    crate::qemu::exit(crate::qemu::ExitCode::Failure)
}
