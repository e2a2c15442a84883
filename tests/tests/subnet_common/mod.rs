//! Shared helpers of the subnet tests (`subnet_*.rs`): driver-run guests (a model HCA in the [`Model`] fixture with the real mlx4_core + mlx4_ib + ib_core on it) cabled to a model switch, an ib_core client recording port events, and the loops that run the guests' progress functions while an SM works; no port is made Active by a test shortcut.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ib_core::verbs::{Event, EventElement, EventType, PortAttr, PortState};
use ib_core::{ClientId, Device, DeviceId, IbClient, IbCore};
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;
use sim::SimHca;

use crate::mlx4_common::{Model, bring_up, init_logger};

/// Port events one guest's client saw, in order.
pub type EventLog = Arc<Mutex<Vec<(EventType, u8)>>>;

/// An ib_core client that records every port event (what a ULP such as
/// the SA client or IPoIB would react to).
pub struct PortEvents(pub EventLog);

impl IbClient for PortEvents {
    fn name(&self) -> &str {
        "subnet-test-events"
    }
    fn add(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn remove(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn event(&mut self, _me: ClientId, _dev: &mut Device, e: &Event) {
        if let EventElement::Port(p) = e.element
            && let Ok(mut l) = self.0.lock()
        {
            l.push((e.event, p));
        }
    }
}

/// One driver-run guest: its model, its ib_core with one mlx4 device.
pub struct Guest {
    pub name: String,
    pub hca: Model,
    pub core: IbCore,
    pub dev: DeviceId,
    pub events: EventLog,
}

/// Brings the whole stack up on `hca` (probe, mlx4_ib add, ib_core
/// registration: QP0/QP1 open, which runs INIT_PORT, so the cable trains;
/// nothing else touches the port).
pub fn guest(hca: SimHca, name: &str) -> Guest {
    init_logger();
    let clock = hca.clock();
    let hca = Model::wrap(hca, "on the subnet fabric");
    let d = bring_up(&hca, Profile::default()).expect("mlx4_core probe");
    let ib = Mlx4IbDev::add(d, "mlx4_0").expect("mlx4_ib_add");
    let mut core = IbCore::new(clock);
    let events = EventLog::default();
    core.ib_register_client(Box::new(PortEvents(events.clone())));
    let dev = core
        .ib_register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("ib_register_device");
    Guest {
        name: name.to_string(),
        hca,
        core,
        dev,
        events,
    }
}

impl Guest {
    /// ib_core's `query_port` (through mlx4_ib and MAD_IFC).
    pub fn port(&mut self, port: u8) -> PortAttr {
        self.core
            .device_mut(self.dev)
            .expect("device")
            .query_port(port)
            .expect("query_port")
    }

    /// Events seen so far.
    pub fn events(&self) -> Vec<(EventType, u8)> {
        self.events.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Whether port 1 is Active (driver's view).
    pub fn active(&mut self) -> bool {
        self.port(1).state == PortState::Active
    }

    /// The mlx4_ib device under ib_core.
    pub fn ib(&mut self) -> &mut Mlx4IbDev {
        self.core
            .device_mut(self.dev)
            .and_then(|d| d.provider_as::<Mlx4IbDev>())
            .expect("an mlx4_ib device")
    }

    /// Unregisters and removes the device (the fixture then checks the
    /// model's invariants).
    pub fn teardown(mut self) {
        let mut p = self
            .core
            .ib_unregister_device(self.dev)
            .expect("ib_unregister_device");
        if let Some(ib) = p.as_any_mut().and_then(|a| a.downcast_mut::<Mlx4IbDev>()) {
            ib.remove();
        }
        drop(p);
        self.hca.finish();
    }
}

/// Model time a quiet round of [`pump_until`] moves the shared fake clock
/// on (a busy round moves it by one `relax`).
pub const IDLE_STEP: Duration = Duration::from_micros(500);

/// Runs every guest's progress function (and through it the synchronous
/// wire, the switch and the embedded SM on the shared fake clock) until
/// `done` holds or `limit` of wall time passes; returns whether it held.
/// `done` is asked every `every` rounds (it may cost MAD_IFC commands).
pub fn pump_until(
    guests: &mut [&mut Guest],
    limit: Duration,
    every: u64,
    mut done: impl FnMut(&mut [&mut Guest]) -> bool,
) -> bool {
    let t = Instant::now();
    let mut round = 0u64;
    loop {
        let mut work = 0;
        for g in guests.iter_mut() {
            work += g.core.poll();
        }
        round += 1;
        if round % every.max(1) == 0 && done(guests) {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        if let Some(g) = guests.first() {
            if work == 0 {
                g.core.clock().delay(IDLE_STEP);
            } else {
                g.core.clock().relax();
            }
        }
    }
}

/// Two synchronous guests on `fabric` (one fake clock, stepped together),
/// on the first two HCAs of `built`, brought up one after the other.
pub fn sync_guests(
    fabric: &Arc<Mutex<sim::fabric::Fabric>>,
    built: &sim::fabric::Built,
) -> (Guest, Guest) {
    let wire = sim::Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    let mut g = built.hcas.iter().take(2).map(|h| {
        let hca = SimHca::new_on_ports(
            sim::SimConfig {
                node_guid: h.node_guid,
                ..sim::SimConfig::default()
            },
            &wire,
            [Some(h.ports[0]), Some(h.ports[1])],
        );
        guest(hca, &h.name)
    });
    let a = g.next().expect("two HCAs in the topology");
    let b = g.next().expect("two HCAs in the topology");
    (a, b)
}
