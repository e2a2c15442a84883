//! The host channel adapters this kernel drives.
//!
//! Every ConnectX-3 found on PCI, real or emulated, is brought up with `mlx4_core`,
//! gets `mlx4_ib` (`mlx4_ib_add`) and is registered with `ib_core`, which opens the
//! MAD ports (QP0/QP1). The shell's idle loop runs ib_core's progress function
//! (event queues, the catastrophic-error buffer, MAD completions and timeouts), and
//! the console reads devices and ports through ib_core, as rdma-core's and
//! infiniband-diags' tools read them through verbs.
//!
//! Leaves out: hot-plug, and restarting a device after a catastrophic error
//! (it is unregistered from ib_core and kept only for `mlx4 catas`).

use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt::Write;

use ib_core::IbCore;
use ib_core::device::DeviceId;
use ib_core::verbs::{Event, EventElement, EventType, IbDevice};
use ib_tools::port_events::PortLog;
use mlx4_core::{Profile, mlx4_err};
use mlx4_ib::Mlx4IbDev;

use crate::pci::{self, Backing};
use crate::time::TscClock;

/// One adapter.
pub struct Hca {
    /// `mlx4_0`, `mlx4_1`, ...
    pub name: String,
    /// Its ib_core device, while registered.
    pub id: Option<DeviceId>,
    /// The provider taken back from ib_core after a catastrophic error
    /// (mlx4_core still answers `mlx4 caps|catas`).
    pub dead: Option<Box<dyn IbDevice>>,
    /// Where enumeration found it.
    pub pci: pci::Device,
}

/// ib_core and the adapters registered with it.
pub struct Ib {
    /// The core: devices, clients, MAD layer.
    pub core: IbCore,
    /// Adapters in probe order.
    pub hcas: Vec<Hca>,
}

impl Ib {
    /// The mlx4_ib device of `h`, live or dead.
    pub fn mlx4<'a>(core: &'a mut IbCore, h: &'a mut Hca) -> Option<&'a mut Mlx4IbDev> {
        match h.id {
            Some(id) => core.device_mut(id)?.provider_as::<Mlx4IbDev>(),
            None => h.dead.as_mut()?.as_any_mut()?.downcast_mut::<Mlx4IbDev>(),
        }
    }
}

static IB: spin::Mutex<Option<Ib>> = spin::Mutex::new(None);

/// Devices that reported IB_EVENT_DEVICE_FATAL, removed by the next poll.
static FATAL: spin::Mutex<Vec<DeviceId>> = spin::Mutex::new(Vec::new());

/// ib_core's event handler: a catastrophic error is acted on at once; port
/// transitions are logged by the [`PortLog`] client as they are
/// dispatched (the rarer port events here, at debug level).
fn on_event(name: &str, id: DeviceId, e: &Event) {
    match (e.event, e.element) {
        (EventType::DeviceFatal, _) => {
            log::error!("{name}: catastrophic error: the HCA needs a reset");
            FATAL.lock().push(id);
        }
        (
            EventType::PortActive
            | EventType::PortErr
            | EventType::LidChange
            | EventType::SmChange
            | EventType::ClientReregister,
            EventElement::Port(_),
        ) => {}
        (ev, el) => log::debug!("{name}: {} on {el:?}", ev.name()),
    }
}

/// Probes every ConnectX-3 / ConnectX-3 Pro and registers it with ib_core.
/// A failure is logged and leaves the shell usable.
pub fn init() {
    let mut ib = Ib {
        core: IbCore::new(Arc::new(TscClock)),
        hcas: Vec::new(),
    };
    // Each port transition, logged when it is dispatched (by the idle
    // loop, or by a console command polling ib_core while it waits), with
    // the time it came.
    ib.core.register_client(Box::new(PortLog::new(
        Box::new(|line| log::info!("{line}")),
        Box::new(crate::time::uptime_us),
    )));
    // infiniband-diags' `ibping -S` on every HCA from boot on, answered by
    // ib_core's progress function: from the idle loop, and while a console
    // command polls ib_core (an `ibping` to this node's own LID included).
    ib.core
        .register_client(Box::new(ib_tools::ibping::ResponderClient::new(Box::new(
            |line| log::warn!("{line}"),
        ))));
    let Some(pool) = crate::mm::dma::pool() else {
        log::error!("mlx4: no DMA pool; HCAs left alone");
        // An empty core still carries the IP stack's links (lo).
        *IB.lock() = Some(ib);
        return;
    };
    for d in pci::devices()
        .iter()
        .filter(|d| d.vendor == 0x15b3 && matches!(d.device, 0x1003 | 0x1007))
    {
        let pdev = match pci::function(d) {
            Ok(p) => p,
            Err(e) => {
                mlx4_err!(d.addr, "cannot map BARs: {e}");
                continue;
            }
        };
        let t0 = crate::time::uptime_us();
        let dev =
            match mlx4_core::probe(pdev, pool.clone(), Arc::new(TscClock), Profile::research()) {
                Ok(dev) => dev,
                Err(e) => {
                    log::error!(
                        "mlx4 {}: HCA left unusable ({e}); the shell carries on without it",
                        d.addr
                    );
                    continue;
                }
            };
        let name = alloc::format!("mlx4_{}", ib.hcas.len());
        let us = crate::time::uptime_us();
        log::info!(
            "{name}: mlx4_core ready in {}.{:03} ms ({} firmware commands, {} KiB ICM), {} since kernel entry",
            (us - t0) / 1000,
            (us - t0) % 1000,
            dev.commands_issued(),
            dev.icm_mapped_bytes() / 1024,
            Ms(us)
        );
        let mlx4ib = match Mlx4IbDev::add(dev, &name) {
            Ok(m) => m,
            Err(e) => {
                log::error!("mlx4_ib: {name}: mlx4_ib_add failed: {}", e.err);
                continue;
            }
        };
        let id = match ib.core.register_device(Box::new(mlx4ib)) {
            Ok(id) => id,
            Err(e) => {
                log::error!("mlx4_ib: {name}: ib_register_device failed: {}", e.error);
                continue;
            }
        };
        let n = name.clone();
        let _ = ib
            .core
            .register_event_handler(id, Box::new(move |id, e| on_event(&n, id, e)));
        log::info!(
            "{name}: registered with ib_core in {}",
            Ms(crate::time::uptime_us() - us)
        );
        if let Backing::Emulated(w) = d.backing {
            w.set_guest_state(crate::ivshmem::GuestState::DriverUp);
        }
        ib.hcas.push(Hca {
            name,
            id: Some(id),
            dead: None,
            pci: *d,
        });
    }
    *IB.lock() = Some(ib);
}

struct Ms(u64);

impl core::fmt::Display for Ms {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{:03} ms", self.0 / 1000, self.0 % 1000)
    }
}

/// One pass of the progress loop: ib_core's progress function, then the
/// removal of devices that had a catastrophic error (never blocks: skipped
/// if a console command holds the adapters).
pub fn poll() {
    let Some(mut g) = IB.try_lock() else {
        return;
    };
    let Some(ib) = g.as_mut() else {
        return;
    };
    ib.core.poll();
    let fatal: Vec<DeviceId> = core::mem::take(&mut *FATAL.lock());
    for id in fatal {
        let Some(h) = ib.hcas.iter_mut().find(|h| h.id == Some(id)) else {
            continue;
        };
        match ib.core.unregister_device(id) {
            Ok(mut p) => {
                if let Some(m) = p.as_any_mut().and_then(|a| a.downcast_mut::<Mlx4IbDev>()) {
                    m.remove();
                }
                log::warn!(
                    "{}: removed from ib_core after a catastrophic error",
                    h.name
                );
                h.id = None;
                h.dead = Some(p);
            }
            Err(e) => log::error!("{}: ib_unregister_device failed: {e}", h.name),
        }
    }
}

/// Runs `f` on ib_core and the adapters; `None` if nothing was probed.
pub fn with<R>(f: impl FnOnce(&mut Ib) -> R) -> Option<R> {
    IB.lock().as_mut().map(f)
}

/// [`with`] if the adapters are free, `None` if held (by the code a page
/// fault interrupted: the page cache's fault path cannot wait for them).
pub fn try_with<R>(f: impl FnOnce(&mut Ib) -> R) -> Option<R> {
    IB.try_lock()?.as_mut().map(f)
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

/// mlx4_ib's firmware version string (`show_fw_ver`: major.minor.subminor).
pub fn fw_ver(v: u64) -> String {
    alloc::format!("{}.{}.{}", v >> 32, (v >> 16) & 0xffff, v & 0xffff)
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
        4 | 8 => 100,
        16 => 140,
        32 => 250,
        _ => 0,
    };
    let t = lanes * tenths_per_lane;
    (t / 10, t % 10)
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
pub fn bench(out: &mut dyn Write, name: &str, dev: &pci::Device, m: &mut Mlx4IbDev, n: u32) {
    use crate::arch::rdtsc;
    let n = n.max(1);
    let per = |t0: u64| crate::time::tsc_to_ns(rdtsc().saturating_sub(t0)) / u64::from(n);
    let t0 = rdtsc();
    for _ in 0..n {
        if let Err(e) = mlx4_ib::mad::query(m.core_mut(), 1, 0x0011, 0) {
            let _ = writeln!(out, "mlx4 bench: {}: MAD_IFC failed: {e}", name);
            return;
        }
    }
    let cmd_ns = per(t0);
    let f = match pci::function(dev) {
        Ok(f) => f,
        Err(e) => {
            let _ = writeln!(out, "mlx4 bench: {}: cannot map the BARs: {e}", name);
            return;
        }
    };
    let (Ok(bar0), Ok(bar2)) = (f.take_bar(0), f.take_bar(2)) else {
        let _ = writeln!(out, "mlx4 bench: {}: BAR0/BAR2 missing", name);
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
        name,
        match dev.backing {
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
