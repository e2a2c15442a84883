//! The console's port-transition lines, one per port event, in the words of Linux's sysfs `ports/N/` files.
//!
//! An [`ib_core`] client ([`PortLog`]) that turns every port event into one
//! line as ib_core dispatches it, that is when some code polls the device:
//! the shell's idle loop, or a running console command that polls ib_core
//! while it waits. The line therefore comes at the time of the event, not
//! when the command ends. It reads the new LID and SM LID from ib_core's
//! port cache, which is refreshed before clients hear of the event. Linux
//! prints nothing of the kind (the state is in sysfs); the words are
//! sysfs's (`state`, `lid`, `sm_lid`). Events of other elements (QPs, CQs,
//! the device) and the rarer port events (P_Key and GID changes) are not
//! this client's.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;

use ib_core::device::{ClientId, Device, IbClient};
use ib_core::verbs::{Event, EventElement, EventType, PortState};

/// Where the lines go (the kernel's log), and the clock they are stamped
/// with (microseconds since kernel entry).
pub struct PortLog {
    sink: Box<dyn FnMut(&str) + Send>,
    uptime_us: Box<dyn Fn() -> u64 + Send>,
}

impl PortLog {
    /// A client handing each line to `sink`, stamped with `uptime_us()`.
    pub fn new(
        sink: Box<dyn FnMut(&str) + Send>,
        uptime_us: Box<dyn Fn() -> u64 + Send>,
    ) -> PortLog {
        PortLog { sink, uptime_us }
    }
}

impl IbClient for PortLog {
    fn name(&self) -> &str {
        "port_log"
    }
    fn add(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn remove(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn event(&mut self, _me: ClientId, dev: &mut Device, event: &Event) {
        if let Some(line) = port_event_line(dev, event, (self.uptime_us)()) {
            (self.sink)(&line);
        }
    }
}

/// The words of Linux's sysfs `ports/N/state` (ib_core `state_show`).
pub fn state_word(s: Option<PortState>) -> &'static str {
    match s {
        Some(PortState::Down) => "DOWN",
        Some(PortState::Init) => "INIT",
        Some(PortState::Armed) => "ARMED",
        Some(PortState::Active) => "ACTIVE",
        Some(PortState::ActiveDefer) => "ACTIVE_DEFER",
        _ => "NOP",
    }
}

/// `3013.809 ms`.
struct Ms(u64);

impl core::fmt::Display for Ms {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{:03} ms", self.0 / 1000, self.0 % 1000)
    }
}

/// The line for one event of `dev` dispatched at `at_us` microseconds
/// after kernel entry, or `None` for an event that is not a port's: a
/// state change with the LID and SM LID the port now has (ACTIVE) or
/// with the state word alone, both with the time; LID and SM changes
/// with the new values; a client re-register request (`None` for the
/// other port events).
pub fn port_event_line(dev: &Device, e: &Event, at_us: u64) -> Option<String> {
    let EventElement::Port(p) = e.element else {
        return None;
    };
    let name = dev.name();
    let cache = dev.port_cache(p).ok();
    let (lid, sm_lid, state) = cache.map_or((0, 0, None), |c| (c.lid, c.sm_lid, c.state));
    let at = Ms(at_us);
    Some(match e.event {
        EventType::PortActive => format!(
            "{name}: port {p} state: ACTIVE, lid 0x{lid:x}, sm_lid 0x{sm_lid:x} ({at} after kernel entry)"
        ),
        EventType::PortErr => format!(
            "{name}: port {p} state: {} ({at} after kernel entry)",
            state_word(state)
        ),
        EventType::LidChange => format!("{name}: port {p}: lid changed to 0x{lid:x}"),
        EventType::SmChange => format!("{name}: port {p}: sm_lid changed to 0x{sm_lid:x}"),
        EventType::ClientReregister => {
            format!("{name}: port {p}: the SM asks clients to re-register")
        }
        _ => return None,
    })
}
