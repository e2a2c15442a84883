//! The interface registry through which mlx4_ib and mlx4_en attach, take their ports and receive events, as Linux's `intf.c` keeps it.
//!
//! Linux: `intf.c` (`mlx4_register_interface`, `mlx4_unregister_interface`,
//! `mlx4_dispatch_event`, `mlx4_register_device`/`mlx4_unregister_device`,
//! `mlx4_get_protocol_dev`), `struct mlx4_interface` and `enum
//! mlx4_protocol` of `driver.h`, `mlx4_foreach_port` and
//! `mlx4_foreach_ib_transport_port` of `device.h`. The global device list
//! is left out (the kernel keeps one registry per device).
//!
//! Which ports a protocol takes ([`Dev::protocol_ports`]): mlx4_en every
//! Ethernet port; mlx4_ib every InfiniBand port and, on a card with IBOE,
//! the Ethernet ports too (RoCE), sharing them with mlx4_en. A client
//! names its protocol ([`Interface::protocol`]) and describes its device
//! on a port ([`Interface::get_dev`]) so that the other can find it:
//! mlx4_ib asks for mlx4_en's device on a RoCE port
//! ([`Dev::get_protocol_dev`]) for its MAC and state.
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

use crate::dev::{Caps, Dev, PortType};

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

/// The protocol a client drives (Linux `enum mlx4_protocol`, IB and EN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// mlx4_ib: InfiniBand, and RoCE on Ethernet ports.
    Ib,
    /// mlx4_en: Ethernet network devices.
    En,
}

/// What a client's device on a port is (Linux `get_dev` hands back the
/// `ib_device` or `net_device`; here a description of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolDev {
    /// The device's name (`eth1`, `mlx4_0`).
    pub name: alloc::string::String,
    /// Its MAC (Ethernet), low 48 bits; 0 for InfiniBand.
    pub mac: u64,
    /// Its MTU (Ethernet payload bytes).
    pub mtu: u32,
    /// The link is up and the device open.
    pub up: bool,
}

/// A client of the device (Linux `struct mlx4_interface`).
pub trait Interface: Send {
    /// The protocol this client drives (Linux `protocol`); `None` for a
    /// client that owns no ports (a test's event listener).
    fn protocol(&self) -> Option<Protocol> {
        None
    }
    /// Its device on `port`, if it drives that port (Linux `get_dev`).
    fn get_dev(&self, port: u8) -> Option<ProtocolDev> {
        let _ = port;
        None
    }
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

    /// Linux `mlx4_get_protocol_dev`: the device of the client of protocol
    /// `proto` on `port`.
    #[doc(alias = "mlx4_get_protocol_dev")]
    pub fn get_protocol_dev(&self, proto: Protocol, port: u8) -> Option<ProtocolDev> {
        self.intf
            .entries
            .iter()
            .filter(|(_, i)| i.protocol() == Some(proto))
            .find_map(|(_, i)| i.get_dev(port))
    }

    /// The ports protocol `proto` takes: Ethernet ports for mlx4_en
    /// (`mlx4_foreach_port(.., MLX4_PORT_TYPE_ETH)`); InfiniBand ports,
    /// and Ethernet ones when the card has IBOE, for mlx4_ib
    /// (`mlx4_foreach_ib_transport_port`).
    #[doc(alias = "mlx4_foreach_port")]
    #[doc(alias = "mlx4_foreach_ib_transport_port")]
    pub fn protocol_ports(&self, proto: Protocol) -> Vec<u8> {
        let c = &self.hca.caps;
        let iboe = c.flags & mlx4_hw::fw::dev_cap_flags::IBOE != 0;
        match proto {
            Protocol::En => c.ports_of_type(PortType::Eth).collect(),
            Protocol::Ib if iboe => c.ports().collect(),
            Protocol::Ib => c.ports_of_type(PortType::Ib).collect(),
        }
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
