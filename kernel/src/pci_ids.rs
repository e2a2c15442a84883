//! Names for `lspci`.
//!
//! The few vendors, devices and classes a research machine with a ConnectX-3 (or
//! QEMU q35) shows, worded as pci.ids words them. Anything else prints as lspci
//! prints an unknown ID (`Device 1234`).

/// Vendor name.
pub fn vendor(v: u16) -> Option<&'static str> {
    Some(match v {
        0x8086 => "Intel Corporation",
        0x15b3 => "Mellanox Technologies",
        0x1af4 => "Red Hat, Inc.",
        0x1b36 => "Red Hat, Inc.",
        0x1234 => "Bochs",
        0x10de => "NVIDIA Corporation",
        0x1022 => "Advanced Micro Devices, Inc. [AMD]",
        _ => return None,
    })
}

/// Device name.
pub fn device(v: u16, d: u16) -> Option<&'static str> {
    Some(match (v, d) {
        (0x8086, 0x29c0) => "82G33/G31/P35/P31 Express DRAM Controller",
        (0x8086, 0x2918) => "82801IB (ICH9) LPC Interface Controller",
        (0x8086, 0x2922) => "82801IR/IO/IH (ICH9R/DO/DH) 6 port SATA Controller [AHCI mode]",
        (0x8086, 0x2930) => "82801I (ICH9 Family) SMBus Controller",
        (0x8086, 0x10d3) => "82574L Gigabit Network Connection",
        (0x8086, 0x100e) => "82540EM Gigabit Ethernet Controller",
        (0x8086, 0x1237) => "440FX - 82441FX PMC [Natoma]",
        (0x8086, 0x7000) => "82371SB PIIX3 ISA [Natoma/Triton II]",
        (0x1234, 0x1111) => "QEMU Virtual Video Controller",
        (0x1af4, 0x1110) => "Inter-VM shared memory",
        (0x1b36, 0x000d) => "QEMU XHCI Host Controller",
        (0x1b36, 0x0001) => "QEMU PCI-PCI bridge",
        (0x15b3, 0x1003) => "MT27500 Family [ConnectX-3]",
        (0x15b3, 0x1004) => "MT27500/MT27520 Family [ConnectX-3/ConnectX-3 Pro Virtual Function]",
        (0x15b3, 0x1007) => "MT27520 Family [ConnectX-3 Pro]",
        _ => return None,
    })
}

/// Subsystem name (subsystem vendor, subsystem ID).
pub fn subsystem(sv: u16, sd: u16) -> Option<&'static str> {
    Some(match (sv, sd) {
        (0x1af4, 0x1100) => "Red Hat, Inc. QEMU Virtual Machine",
        (0x15b3, 0x0051) => "Mellanox Technologies MCX354A-FCBT ConnectX-3 VPI",
        _ => return None,
    })
}

/// Class name from class and subclass.
pub fn class(class: u32) -> &'static str {
    match class >> 8 {
        0x0100 => "SCSI storage controller",
        0x0106 => "SATA controller",
        0x0200 => "Ethernet controller",
        0x0207 => "Infiniband controller",
        0x0280 => "Network controller",
        0x0300 => "VGA compatible controller",
        0x0380 => "Display controller",
        0x0500 => "RAM memory",
        0x0580 => "Memory controller",
        0x0600 => "Host bridge",
        0x0601 => "ISA bridge",
        0x0604 => "PCI bridge",
        0x0680 => "Bridge",
        0x0c03 => "USB controller",
        0x0c05 => "SMBus",
        0x0c06 => "InfiniBand",
        _ => match class >> 16 {
            0x01 => "Mass storage controller",
            0x02 => "Network controller",
            0x03 => "Display controller",
            0x05 => "Memory controller",
            0x06 => "Bridge",
            0x0c => "Serial bus controller",
            _ => "Unclassified device",
        },
    }
}
