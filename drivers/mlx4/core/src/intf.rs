//! The interface registry through which mlx4_ib attaches and receives events, as Linux's `intf.c` keeps it.
//!
//! Linux: `intf.c` (`mlx4_register_interface`, `mlx4_unregister_interface`,
//! `mlx4_dispatch_event`, `mlx4_register_device`/`mlx4_unregister_device`)
//! and `struct mlx4_interface` of `driver.h`. `mlx4_get_protocol_dev` and
//! the global device list are left out (the kernel keeps one registry per
//! device).
//!
//! Linux's `add` receives the device and sets up the client's resources; here
//! the device cannot be lent to a callback it owns, so a client (mlx4_ib)
//! does its setup with `&mut Dev` first and then registers an [`Interface`]
//! for `add`/`remove` notifications and events.
//!
//! Linux hands per-object events (CQ completion/error, QP and SRQ events) to
//! callbacks stored in each object; here every event goes through the
//! registered interfaces as an [`Event`] value and mlx4_ib routes it to its
//! objects.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::dev::{Caps, Dev};

/// An event of the device (Linux `enum mlx4_dev_event` plus the per-object
/// events of `eq.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The device reported an internal error; it needs a reset.
    CatastrophicError,
    /// Port went active (`MLX4_DEV_EVENT_PORT_UP`).
    PortUp {
        /// Port number (1-based).
        port: u8,
    },
    /// Port went down (`MLX4_DEV_EVENT_PORT_DOWN`).
    PortDown {
        /// Port number (1-based).
        port: u8,
    },
    /// Port management change (PortInfo/GUID/P_Key table), raw EQE kept.
    PortMgmtChange {
        /// Port number.
        port: u8,
        /// EQE subtype.
        subtype: u8,
        /// The whole EQE.
        raw: [u8; 32],
    },
    /// A completion event on an armed CQ.
    CqCompletion {
        /// CQ number.
        cqn: u32,
    },
    /// CQ error (1 overrun, 2 access violation).
    CqError {
        /// CQ number.
        cqn: u32,
        /// EQE syndrome.
        syndrome: u8,
    },
    /// An affiliated QP event (`MLX4_EVENT_TYPE_*` value).
    Qp {
        /// QP number.
        qpn: u32,
        /// Event type.
        event_type: u8,
    },
    /// An SRQ event.
    Srq {
        /// SRQ number.
        srqn: u32,
        /// Event type.
        event_type: u8,
    },
}

/// A client of the device (Linux `struct mlx4_interface`).
pub trait Interface: Send {
    /// The device is available (Linux `add`).
    fn add(&mut self, caps: &Caps) {
        let _ = caps;
    }
    /// The device goes away (Linux `remove`).
    fn remove(&mut self, caps: &Caps) {
        let _ = caps;
    }
    /// An event (Linux `event`).
    fn event(&mut self, caps: &Caps, event: Event);
}

/// Handle of a registered interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IntfId(u32);

/// The registered interfaces of one device.
#[derive(Default)]
pub struct Registry {
    next: u32,
    entries: Vec<(IntfId, Box<dyn Interface>)>,
    registered: bool,
}

impl Registry {
    pub(crate) fn dispatch(&mut self, caps: &Caps, ev: Event) {
        for (_, i) in self.entries.iter_mut() {
            i.event(caps, ev);
        }
    }
}

impl Dev {
    /// Linux `mlx4_register_interface` for this device: calls `add` at once
    /// (the device is registered) and delivers events until unregistered.
    #[doc(alias = "mlx4_register_interface")]
    pub fn register_interface(&mut self, mut intf: Box<dyn Interface>) -> IntfId {
        let id = IntfId(self.intf.next);
        self.intf.next += 1;
        if self.intf.registered {
            intf.add(&self.hca.caps);
        }
        self.intf.entries.push((id, intf));
        id
    }

    /// Linux `mlx4_unregister_interface`: calls `remove` and forgets it.
    #[doc(alias = "mlx4_unregister_interface")]
    pub fn unregister_interface(&mut self, id: IntfId) -> Option<Box<dyn Interface>> {
        let pos = self.intf.entries.iter().position(|(i, _)| *i == id)?;
        let (_, mut intf) = self.intf.entries.remove(pos);
        if self.intf.registered {
            intf.remove(&self.hca.caps);
        }
        Some(intf)
    }

    /// Linux `mlx4_dispatch_event`.
    #[doc(alias = "mlx4_dispatch_event")]
    pub fn dispatch_event(&mut self, ev: Event) {
        self.intf.dispatch(&self.hca.caps, ev);
    }

    pub(crate) fn unregister_device(&mut self) {
        let entries = core::mem::take(&mut self.intf.entries);
        for (_, mut i) in entries {
            i.remove(&self.hca.caps);
        }
        self.intf.registered = false;
    }

    pub(crate) fn mark_registered(&mut self) {
        self.intf.registered = true;
    }
}
