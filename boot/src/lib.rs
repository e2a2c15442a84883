//! The boot path of the kernel image, for QEMU's `-kernel` and for GRUB.
//!
//! Boot path of the kernel image: PVH entry (QEMU `-kernel`) and a Multiboot2
//! header (GRUB, bare metal) in one ELF, the 32→64-bit trampoline with early
//! identity page tables for the first 4 GiB, and the boot information (memory
//! map, command line) copied out of either protocol's structures.
//!
//! Leaves out: SMP bring-up, UEFI, Multiboot v1, modules/initrd.
//!
//! The kernel provides `kernel_main(&'static BootInfo) -> !`; everything the
//! loader handed over is copied into static storage before it is called, so
//! the loader's structures may be overwritten afterwards.
#![no_std]

use core::arch::global_asm;
use core::fmt;

global_asm!(include_str!("entry.S"), options(att_syntax));

/// The boot protocol that started the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Xen/QEMU PVH direct boot (`qemu -kernel`).
    Pvh,
    /// Multiboot2 (GRUB).
    Multiboot2,
    /// Entered without a recognised protocol magic.
    Unknown,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Pvh => "PVH",
            Protocol::Multiboot2 => "Multiboot2",
            Protocol::Unknown => "unknown",
        })
    }
}

/// What a memory-map range is (E820 numbering, shared by PVH and Multiboot2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Usable RAM.
    Usable,
    /// Reserved.
    Reserved,
    /// ACPI tables, reclaimable after reading.
    AcpiReclaimable,
    /// ACPI non-volatile storage.
    AcpiNvs,
    /// Defective RAM.
    Bad,
    /// Any other type number.
    Other(u32),
}

impl MemoryKind {
    fn from_e820(t: u32) -> MemoryKind {
        match t {
            1 => MemoryKind::Usable,
            2 => MemoryKind::Reserved,
            3 => MemoryKind::AcpiReclaimable,
            4 => MemoryKind::AcpiNvs,
            5 => MemoryKind::Bad,
            t => MemoryKind::Other(t),
        }
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryKind::Usable => f.write_str("usable"),
            MemoryKind::Reserved => f.write_str("reserved"),
            MemoryKind::AcpiReclaimable => f.write_str("ACPI data"),
            MemoryKind::AcpiNvs => f.write_str("ACPI NVS"),
            MemoryKind::Bad => f.write_str("unusable"),
            MemoryKind::Other(t) => write!(f, "type {t}"),
        }
    }
}

/// One range of the physical memory map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRegion {
    /// First byte.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// Kind of memory.
    pub kind: MemoryKind,
}

impl MemoryRegion {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }
}

/// Most memory-map entries kept; firmware rarely reports more than ~40.
pub const MAX_REGIONS: usize = 128;
/// Longest command line kept (longer ones are cut at a character boundary).
pub const MAX_CMDLINE: usize = 4096;

/// What the loader told the kernel, copied into kernel memory.
pub struct BootInfo {
    /// Which protocol started us.
    pub protocol: Protocol,
    regions: [MemoryRegion; MAX_REGIONS],
    nregions: usize,
    cmdline: [u8; MAX_CMDLINE],
    cmdline_len: usize,
    loader: [u8; 64],
    loader_len: usize,
    /// Physical address of the ACPI RSDP, if the loader gave one.
    pub rsdp: Option<u64>,
    /// TSC value at the first instruction of 64-bit Rust code.
    pub entry_tsc: u64,
}

impl BootInfo {
    const fn empty() -> BootInfo {
        BootInfo {
            protocol: Protocol::Unknown,
            regions: [MemoryRegion {
                start: 0,
                len: 0,
                kind: MemoryKind::Reserved,
            }; MAX_REGIONS],
            nregions: 0,
            cmdline: [0; MAX_CMDLINE],
            cmdline_len: 0,
            loader: [0; 64],
            loader_len: 0,
            rsdp: None,
            entry_tsc: 0,
        }
    }

    /// The physical memory map, as the loader reported it.
    pub fn memory_map(&self) -> &[MemoryRegion] {
        &self.regions[..self.nregions]
    }

    /// The kernel command line (empty if none, or not UTF-8).
    pub fn cmdline(&self) -> &str {
        core::str::from_utf8(&self.cmdline[..self.cmdline_len]).unwrap_or("")
    }

    /// The boot loader's name (Multiboot2 only).
    pub fn loader_name(&self) -> &str {
        core::str::from_utf8(&self.loader[..self.loader_len]).unwrap_or("")
    }

    fn push_region(&mut self, start: u64, len: u64, kind: u32) {
        if len == 0 || self.nregions == MAX_REGIONS {
            return;
        }
        self.regions[self.nregions] = MemoryRegion {
            start,
            len,
            kind: MemoryKind::from_e820(kind),
        };
        self.nregions += 1;
    }

    fn set_cmdline(&mut self, s: &[u8]) {
        let mut n = s
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(s.len())
            .min(MAX_CMDLINE);
        while core::str::from_utf8(&s[..n]).is_err() && n > 0 {
            n -= 1;
        }
        self.cmdline[..n].copy_from_slice(&s[..n]);
        self.cmdline_len = n;
    }

    fn set_loader(&mut self, s: &[u8]) {
        let n = s.iter().position(|&b| b == 0).unwrap_or(s.len()).min(64);
        if core::str::from_utf8(&s[..n]).is_ok() {
            self.loader[..n].copy_from_slice(&s[..n]);
            self.loader_len = n;
        }
    }
}

/// Physical memory below 4 GiB, readable through the boot identity map.
///
/// # Invariants
/// Only used before the kernel replaces the boot page tables, and only for
/// addresses the loader reported (bounded by the checks in the parsers).
struct Phys;

impl Phys {
    fn read_u32(&self, pa: u64) -> u32 {
        if pa + 4 > 1 << 32 {
            return 0;
        }
        // SAFETY: the boot page tables identity-map [0, 4 GiB); the loader
        // placed its structures in RAM there. Unaligned reads are allowed.
        unsafe { core::ptr::read_unaligned(pa as *const u32) }
    }
    fn read_u64(&self, pa: u64) -> u64 {
        u64::from(self.read_u32(pa)) | (u64::from(self.read_u32(pa + 4)) << 32)
    }
    fn bytes(&self, pa: u64, max: usize) -> &'static [u8] {
        if pa == 0 || pa >= 1 << 32 {
            return &[];
        }
        let max = max.min(((1u64 << 32) - pa) as usize);
        // SAFETY: as in `read_u32`; the slice is only read, immediately copied,
        // and the loader's string lies inside it or is cut at `max`.
        unsafe { core::slice::from_raw_parts(pa as *const u8, max) }
    }
}

const PVH_MAGIC: u32 = 0x336e_c578;

fn parse_pvh(bi: &mut BootInfo, info: u64) {
    let m = Phys;
    if m.read_u32(info) != PVH_MAGIC {
        return;
    }
    let version = m.read_u32(info + 4);
    let cmdline = m.read_u64(info + 24);
    let rsdp = m.read_u64(info + 32);
    bi.set_cmdline(m.bytes(cmdline, MAX_CMDLINE));
    if rsdp != 0 {
        bi.rsdp = Some(rsdp);
    }
    if version >= 1 {
        let map = m.read_u64(info + 40);
        let n = m.read_u32(info + 48) as usize;
        for i in 0..n.min(MAX_REGIONS) {
            let e = map + 24 * i as u64;
            bi.push_region(m.read_u64(e), m.read_u64(e + 8), m.read_u32(e + 16));
        }
    }
}

fn parse_multiboot2(bi: &mut BootInfo, info: u64) {
    let m = Phys;
    let total = u64::from(m.read_u32(info)).min(1 << 20);
    let mut tag = info + 8;
    let end = info + total;
    while tag + 8 <= end {
        let ty = m.read_u32(tag);
        let size = u64::from(m.read_u32(tag + 4));
        if ty == 0 || size < 8 {
            break;
        }
        let body = tag + 8;
        let body_len = (size - 8) as usize;
        match ty {
            1 => bi.set_cmdline(m.bytes(body, body_len)),
            2 => bi.set_loader(m.bytes(body, body_len)),
            6 => {
                let entry_size = u64::from(m.read_u32(body));
                if entry_size >= 24 {
                    let mut e = body + 8;
                    while e + entry_size <= tag + size {
                        bi.push_region(m.read_u64(e), m.read_u64(e + 8), m.read_u32(e + 16));
                        e += entry_size;
                    }
                }
            }
            14 | 15 => bi.rsdp = Some(body),
            _ => {}
        }
        tag += size.next_multiple_of(8);
    }
}

static mut BOOT_INFO: BootInfo = BootInfo::empty();

unsafe extern "Rust" {
    /// The kernel's entry point, called once with the copied boot information.
    fn kernel_main(info: &'static BootInfo) -> !;
}

/// Called by the trampoline in long mode on the boot stack.
#[unsafe(no_mangle)]
extern "C" fn boot_entry64(protocol: u32, info: u32) -> ! {
    // SAFETY: rdtsc has no side effects.
    let tsc = unsafe { core::arch::x86_64::_rdtsc() };
    // SAFETY: this runs once, on the only CPU, before anything else reads
    // BOOT_INFO; afterwards it is only shared immutably.
    let bi = unsafe { &mut *core::ptr::addr_of_mut!(BOOT_INFO) };
    bi.entry_tsc = tsc;
    match protocol {
        1 => {
            bi.protocol = Protocol::Pvh;
            parse_pvh(bi, u64::from(info));
        }
        2 => {
            bi.protocol = Protocol::Multiboot2;
            parse_multiboot2(bi, u64::from(info));
        }
        _ => bi.protocol = Protocol::Unknown,
    }
    // SAFETY: the kernel defines `kernel_main` with this signature; `bi` is
    // never written again.
    unsafe { kernel_main(bi) }
}

unsafe extern "C" {
    static __kernel_start: u8;
    static __kernel_end: u8;
    static boot_stack_bottom: u8;
    static boot_stack_top: u8;
}

/// Physical range `[start, end)` the kernel image occupies (text to bss).
pub fn kernel_image() -> (u64, u64) {
    // Only the symbols' addresses are taken, which needs no `unsafe`.
    (
        core::ptr::addr_of!(__kernel_start) as u64,
        core::ptr::addr_of!(__kernel_end) as u64,
    )
}

/// The boot stack `[bottom, top)`, for stack-overflow diagnostics.
pub fn boot_stack() -> (u64, u64) {
    (
        core::ptr::addr_of!(boot_stack_bottom) as u64,
        core::ptr::addr_of!(boot_stack_top) as u64,
    )
}
