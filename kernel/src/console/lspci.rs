//! `lspci`, in lspci's own format.
//!
//! One line per function by default, `-n` for numeric IDs, `-v` adding subsystem,
//! flags, BARs and capabilities.

use core::fmt::{self, Write};

use hal::pci::cfg;
use hal::{BarKind, PciFunction};

use crate::pci::{self, Device};
use crate::pci_ids;

fn size(out: &mut dyn Write, bytes: u64) -> fmt::Result {
    const UNITS: [&str; 5] = ["", "K", "M", "G", "T"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024 && v.is_multiple_of(1024) && u < UNITS.len() - 1 {
        v /= 1024;
        u += 1;
    }
    write!(out, "[size={v}{}]", UNITS[u])
}

fn names(out: &mut dyn Write, d: &Device, numeric: bool) -> fmt::Result {
    if numeric {
        return write!(
            out,
            "{:04x}: {:04x}:{:04x}",
            d.class >> 8,
            d.vendor,
            d.device
        );
    }
    write!(out, "{}: ", pci_ids::class(d.class))?;
    match pci_ids::vendor(d.vendor) {
        Some(v) => write!(out, "{v} ")?,
        None => write!(out, "Device {:04x}:", d.vendor)?,
    }
    match pci_ids::device(d.vendor, d.device) {
        Some(n) => write!(out, "{n}"),
        None => write!(out, "Device {:04x}", d.device),
    }
}

fn capability(out: &mut dyn Write, f: &PciFunction, id: u8, off: u16) -> fmt::Result {
    write!(out, "\tCapabilities: [{off:02x}] ")?;
    match id {
        cfg::CAP_ID_PM => writeln!(out, "Power Management version {}", f.read16(off + 2) & 7),
        cfg::CAP_ID_VPD => writeln!(out, "Vital Product Data"),
        0x05 => {
            let ctl = f.read16(off + 2);
            writeln!(
                out,
                "MSI: Enable{} Count=1/{} Maskable{} 64bit{}",
                if ctl & 1 != 0 { '+' } else { '-' },
                1 << ((ctl >> 1) & 7),
                if ctl & 0x100 != 0 { '+' } else { '-' },
                if ctl & 0x80 != 0 { '+' } else { '-' },
            )
        }
        0x09 => writeln!(
            out,
            "Vendor Specific Information: Len={:02x} <?>",
            f.read8(off + 2)
        ),
        cfg::CAP_ID_EXP => {
            let kind = match (f.read16(off + 2) >> 4) & 0xf {
                0 => "Endpoint",
                1 => "Legacy Endpoint",
                4 => "Root Port",
                9 => "Root Complex Integrated Endpoint",
                _ => "Device",
            };
            writeln!(out, "Express (v{}) {kind}", f.read16(off + 2) & 0xf)
        }
        cfg::CAP_ID_MSIX => {
            let ctl = f.read16(off + 2);
            writeln!(
                out,
                "MSI-X: Enable{} Count={} Masked{}",
                if ctl & 0x8000 != 0 { '+' } else { '-' },
                (ctl & 0x7ff) + 1,
                if ctl & 0x4000 != 0 { '+' } else { '-' },
            )
        }
        0x12 => writeln!(
            out,
            "SATA HBA v{}.{}",
            f.read8(off + 2) >> 4,
            f.read8(off + 2) & 0xf
        ),
        _ => writeln!(out, "Capability ID {id:#04x}"),
    }
}

fn verbose(out: &mut dyn Write, d: &Device) -> fmt::Result {
    let f = pci::inspect(d);
    if d.header_type == 0 && d.subsystem.0 != 0 {
        match pci_ids::subsystem(d.subsystem.0, d.subsystem.1) {
            Some(n) => writeln!(out, "\tSubsystem: {n}")?,
            None => match pci_ids::vendor(d.subsystem.0) {
                Some(v) => writeln!(out, "\tSubsystem: {v} Device {:04x}", d.subsystem.1)?,
                None => writeln!(
                    out,
                    "\tSubsystem: Device {:04x}:{:04x}",
                    d.subsystem.0, d.subsystem.1
                )?,
            },
        }
    }
    let cmd = f.command();
    write!(out, "\tFlags: ")?;
    if cmd & cfg::COMMAND_MASTER != 0 {
        write!(out, "bus master, ")?;
    }
    writeln!(out, "fast devsel, latency {}", f.read8(0x0d))?;
    for b in d.bars.iter().flatten() {
        match b.kind {
            BarKind::Io => write!(out, "\tI/O ports at {:04x} ", b.addr)?,
            k => write!(
                out,
                "\tMemory at {:x} ({}, {}) ",
                b.addr,
                if k == BarKind::Memory64 {
                    "64-bit"
                } else {
                    "32-bit"
                },
                if b.prefetchable {
                    "prefetchable"
                } else {
                    "non-prefetchable"
                }
            )?,
        }
        size(out, b.size)?;
        writeln!(out)?;
    }
    for (id, off) in f.capabilities() {
        capability(out, &f, id, off)?;
    }
    if let pci::Backing::Emulated(w) = d.backing {
        writeln!(
            out,
            "\tEmulated: cx3-emu node {} of {}, over ivshmem 1af4:1110 (window at {:x}, heartbeat {})",
            w.node,
            w.nodes,
            w.bus,
            w.heartbeat()
        )?;
    }
    writeln!(out)
}

/// Runs `lspci [-v] [-n]`.
pub fn run(out: &mut dyn Write, args: &[&str]) -> Result<(), &'static str> {
    let mut v = false;
    let mut n = false;
    for a in args {
        match *a {
            "-v" => v = true,
            "-n" => n = true,
            "-nv" | "-vn" => (v, n) = (true, true),
            _ => return Err("usage: lspci [-v] [-n]"),
        }
    }
    for d in pci::devices() {
        let _ = write!(out, "{} ", d.addr);
        let _ = names(out, d, n);
        if d.revision != 0 {
            let _ = write!(out, " (rev {:02x})", d.revision);
        }
        let _ = writeln!(out);
        if v {
            let _ = verbose(out, d);
        }
    }
    Ok(())
}
