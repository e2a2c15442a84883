//! The host channel adapters this kernel drives: every ConnectX-3 found on
//! PCI, real or emulated, is brought up with `mlx4_core` at boot, polled from
//! the shell's idle loop (event queues, catastrophic-error buffer), and
//! described to the console in the words of `ibv_devinfo` and `ibstat`.
//!
//! Leaves out: mlx4_ib and ib_core (later), so port attributes come straight
//! from the firmware SMA through MAD_IFC, as `mlx4_ib_query_port` reads them.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt::Write;

use mlx4_core::{Caps, Dev, Event, Interface, Profile};

use crate::pci::{self, Backing};
use crate::time::TscClock;

/// One adapter.
pub struct Hca {
    /// `mlx4_0`, `mlx4_1`, ...
    pub name: String,
    /// The running device.
    pub dev: Dev,
    /// Where enumeration found it.
    pub pci: pci::Device,
}

static HCAS: spin::Mutex<Vec<Hca>> = spin::Mutex::new(Vec::new());

/// Logs the events mlx4_core reports, in Linux's words.
struct EventLog {
    name: String,
}

impl Interface for EventLog {
    fn event(&mut self, _caps: &Caps, event: Event) {
        match event {
            Event::CatastrophicError => {
                log::error!("{}: catastrophic error: the HCA needs a reset", self.name)
            }
            Event::PortUp { port } => log::info!("{}: port {port} up", self.name),
            Event::PortDown { port } => log::info!("{}: port {port} down", self.name),
            other => log::debug!("{}: event {other:?}", self.name),
        }
    }
}

/// Probes every ConnectX-3 / ConnectX-3 Pro. A failure is logged and leaves
/// the shell usable.
pub fn init() {
    let Some(pool) = crate::mm::dma::pool() else {
        log::error!("mlx4: no DMA pool; HCAs left alone");
        return;
    };
    for d in pci::devices()
        .iter()
        .filter(|d| d.vendor == 0x15b3 && matches!(d.device, 0x1003 | 0x1007))
    {
        let pdev = match pci::function(d) {
            Ok(p) => p,
            Err(e) => {
                log::error!("mlx4_core {}: cannot map BARs: {e}", d.addr);
                continue;
            }
        };
        let t0 = crate::time::uptime_us();
        match mlx4_core::probe(pdev, pool.clone(), Arc::new(TscClock), Profile::research()) {
            Ok(mut dev) => {
                let mut hcas = HCAS.lock();
                let name = alloc::format!("mlx4_{}", hcas.len());
                dev.register_interface(Box::new(EventLog { name: name.clone() }));
                let us = crate::time::uptime_us();
                log::info!(
                    "{name}: mlx4_core ready in {}.{:03} ms ({} firmware commands, {} KiB ICM), {} since kernel entry",
                    (us - t0) / 1000,
                    (us - t0) % 1000,
                    dev.commands_issued(),
                    dev.icm_mapped_bytes() / 1024,
                    Ms(us)
                );
                if let Backing::Emulated(w) = d.backing {
                    w.set_guest_state(crate::ivshmem::GuestState::DriverUp);
                }
                hcas.push(Hca { name, dev, pci: *d });
            }
            Err(e) => log::error!(
                "mlx4 {}: HCA left unusable ({e}); the shell carries on without it",
                d.addr
            ),
        }
    }
}

struct Ms(u64);

impl core::fmt::Display for Ms {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{:03} ms", self.0 / 1000, self.0 % 1000)
    }
}

/// One pass of the progress loop over every HCA (never blocks: skipped if a
/// console command holds the adapters).
pub fn poll() {
    if let Some(mut hcas) = HCAS.try_lock() {
        for h in hcas.iter_mut() {
            h.dev.poll();
        }
    }
}

/// Runs `f` on the adapters.
pub fn with<R>(f: impl FnOnce(&mut [Hca]) -> R) -> R {
    f(&mut HCAS.lock())
}

/// Attributes of one port as the firmware SMA reports them.
#[derive(Debug, Default, Clone, Copy)]
pub struct PortAttr {
    /// PortState (1 Down .. 4 Active).
    pub state: u8,
    /// PortPhysicalState (1 Sleep .. 5 LinkUp).
    pub phys_state: u8,
    /// Base LID.
    pub lid: u16,
    /// LMC.
    pub lmc: u8,
    /// Master SM LID.
    pub sm_lid: u16,
    /// Master SM SL.
    pub sm_sl: u8,
    /// Capability mask.
    pub cap_mask: u32,
    /// MTUCap (1 256 .. 5 4096).
    pub max_mtu: u8,
    /// NeighborMTU.
    pub active_mtu: u8,
    /// LinkWidthActive (1 1x, 2 4x, 4 8x, 8 12x).
    pub width: u8,
    /// LinkSpeedActive (1 2.5, 2 5, 4 10 Gb/s per lane).
    pub speed: u8,
    /// GUID 0 of the port.
    pub port_guid: u64,
}

/// NodeInfo from the firmware SMA.
#[derive(Debug, Default, Clone, Copy)]
pub struct NodeAttr {
    /// Node GUID.
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Device revision.
    pub revision: u32,
    /// IEEE OUI of the vendor.
    pub vendor_id: u32,
}

/// A SubnGet() SMP for `attr` (LID-routed, management class 0x01).
fn smp_get(attr: u16, attr_mod: u32) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[0] = 1; // base version
    m[1] = 0x01; // class: subnet management, LID routed
    m[2] = 1; // class version
    m[3] = 0x01; // method Get
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    m[20..24].copy_from_slice(&attr_mod.to_be_bytes());
    m
}

const MAD_IFC_IGNORE_KEYS: u8 = 0x3;
const SMP_DATA: usize = 64;

fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn be64(b: &[u8], o: usize) -> u64 {
    (u64::from(be32(b, o)) << 32) | u64::from(be32(b, o + 4))
}

fn query(dev: &mut Dev, port: u8, attr: u16, attr_mod: u32) -> Result<[u8; 256], mlx4_core::Error> {
    let out = dev.mad_ifc(port, MAD_IFC_IGNORE_KEYS, 0, &smp_get(attr, attr_mod))?;
    // MAD status (bytes 4..6): a non-zero status means the SMA refused.
    if be16(&out, 4) & 0x7fff != 0 {
        return Err(mlx4_core::Error::InvalidArg);
    }
    Ok(out)
}

/// NodeInfo (Linux `mlx4_ib_query_device` / `init_node_data`).
pub fn node_attr(dev: &mut Dev) -> Result<NodeAttr, mlx4_core::Error> {
    let m = query(dev, 1, 0x0011, 0)?;
    let d = &m[SMP_DATA..];
    Ok(NodeAttr {
        sys_image_guid: be64(d, 4),
        node_guid: be64(d, 12),
        revision: be32(d, 32),
        vendor_id: be32(d, 36) & 0xff_ffff,
    })
}

/// PortInfo plus GUID 0 (Linux `mlx4_ib_query_port`).
pub fn port_attr(dev: &mut Dev, port: u8) -> Result<PortAttr, mlx4_core::Error> {
    let m = query(dev, port, 0x0015, u32::from(port))?;
    let d = &m[SMP_DATA..];
    let g = query(dev, port, 0x0014, 0)?;
    Ok(PortAttr {
        lid: be16(d, 16),
        sm_lid: be16(d, 18),
        cap_mask: be32(d, 20),
        width: d[31] & 0xf,
        state: d[32] & 0xf,
        phys_state: d[33] >> 4,
        lmc: d[34] & 0x7,
        speed: d[35] >> 4,
        active_mtu: d[36] >> 4,
        sm_sl: d[36] & 0xf,
        max_mtu: d[41] & 0xf,
        port_guid: be64(&g, SMP_DATA),
    })
}

/// `0002:c903:0010:a1b0`, as ibv_devinfo prints GUIDs.
pub struct Guid(pub u64);

impl core::fmt::Display for Guid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let g = self.0;
        write!(
            f,
            "{:04x}:{:04x}:{:04x}:{:04x}",
            g >> 48,
            (g >> 32) & 0xffff,
            (g >> 16) & 0xffff,
            g & 0xffff
        )
    }
}

/// ibv_devinfo's port state words.
pub fn port_state_name(s: u8) -> &'static str {
    match s {
        1 => "PORT_DOWN",
        2 => "PORT_INIT",
        3 => "PORT_ARMED",
        4 => "PORT_ACTIVE",
        5 => "PORT_ACTIVE_DEFER",
        _ => "PORT_NOP",
    }
}

/// ibstat's state words.
pub fn ibstat_state(s: u8) -> &'static str {
    match s {
        1 => "Down",
        2 => "Initializing",
        3 => "Armed",
        4 => "Active",
        _ => "Unknown",
    }
}

/// ibstat's physical state words.
pub fn phys_state_name(s: u8) -> &'static str {
    match s {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "Phy Test",
        _ => "Unknown",
    }
}

/// MTU code to bytes.
pub fn mtu_bytes(code: u8) -> u32 {
    match code {
        1..=5 => 128 << code,
        _ => 0,
    }
}

/// Link rate in Gb/s (ibstat's "Rate"), as `(whole, tenths)`.
pub fn rate(width: u8, speed: u8) -> (u32, u32) {
    let lanes = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        _ => 0,
    };
    let tenths_per_lane = match speed {
        1 => 25,
        2 => 50,
        4 => 100,
        _ => 0,
    };
    let t = lanes * tenths_per_lane;
    (t / 10, t % 10)
}

/// Writes `mlx4 caps` output: the QUERY_DEV_CAP result.
pub fn write_caps(out: &mut dyn Write, h: &Hca) {
    let _ = writeln!(out, "{} ({}): QUERY_DEV_CAP", h.name, h.pci.addr);
    let _ = writeln!(out, "{:#?}", h.dev.dev_cap());
}

/// `mlx4 bench [N]`: what the transport to the HCA costs, seen from the
/// driver, averaged over `n` rounds each: a firmware command round trip
/// (MAD_IFC NodeInfo: inbox and outbox DMA, seven HCR stores, GO, polls
/// until it clears), an uncached register read (BAR0's HCR status dword:
/// non-posted, so a socket round trip over vfio-user), and a posted
/// register store (BAR2, UAR page 0 offset 0, where no doorbell lives: the
/// cost of a doorbell store without its side effects). The registers are
/// reached through a second view of the function's BARs
/// ([`pci::function`]), used for nothing else.
pub fn bench(out: &mut dyn Write, h: &mut Hca, n: u32) {
    use crate::arch::rdtsc;
    let n = n.max(1);
    let per = |t0: u64| crate::time::tsc_to_ns(rdtsc().saturating_sub(t0)) / u64::from(n);
    let t0 = rdtsc();
    for _ in 0..n {
        if let Err(e) = query(&mut h.dev, 1, 0x0011, 0) {
            let _ = writeln!(out, "mlx4 bench: {}: MAD_IFC failed: {e}", h.name);
            return;
        }
    }
    let cmd_ns = per(t0);
    let f = match pci::function(&h.pci) {
        Ok(f) => f,
        Err(e) => {
            let _ = writeln!(out, "mlx4 bench: {}: cannot map the BARs: {e}", h.name);
            return;
        }
    };
    let (Ok(bar0), Ok(bar2)) = (f.take_bar(0), f.take_bar(2)) else {
        let _ = writeln!(out, "mlx4 bench: {}: BAR0/BAR2 missing", h.name);
        return;
    };
    const HCR_STATUS: usize = 0x8_0698;
    let t0 = rdtsc();
    let mut acc = 0u32;
    for _ in 0..n {
        acc ^= bar0.read32(HCR_STATUS);
    }
    let read_ns = per(t0);
    let t0 = rdtsc();
    for _ in 0..n {
        bar2.write32(0, 0);
    }
    let write_ns = per(t0);
    let _ = writeln!(
        out,
        "{} ({}): {n} rounds: firmware command (MAD_IFC) {}.{:03} us, register read {}.{:03} us, \
         doorbell store {}.{:03} us{}",
        h.name,
        match h.pci.backing {
            Backing::Port => "PCI function",
            Backing::Emulated(_) => "ivshmem window",
        },
        cmd_ns / 1000,
        cmd_ns % 1000,
        read_ns / 1000,
        read_ns % 1000,
        write_ns / 1000,
        write_ns % 1000,
        if acc == u32::MAX {
            " (status reads all ones)"
        } else {
            ""
        }
    );
}
