//! A subnet manager and subnet administrator for our kernel, after OpenSM 3.3: it brings every port of the subnet to Active, programs the switches, answers the SA queries on QP1 and elects a master with the other SMs, through ib_core's MAD layer from ib_core's progress function.
//!
//! Left out of OpenSM: partitions beyond the default one, QoS and SL2VL
//! programming, M_Key protection, LMC > 0, routing engines other than
//! min-hop, the unicast cache, congestion control, InformInfo and event
//! forwarding, GUIDInfo and alias GUIDs, the SA database and cache files,
//! the console and the perf manager. What each part ports and leaves out
//! is said in its module.
//!
//! # Using it
//!
//! [`init`] registers the SM as an ib_core client (once per core);
//! [`start`] runs an SM on a port of a device with a [`SmConfig`]; from then
//! on every [`ib_core::IbCore::poll`] moves it on (no thread, no wait):
//! sweeps, SMInfo, traps, SA requests. [`status`] and [`log`] read it,
//! [`stop`] ends it (a master hands over to a standby SM first).
//!
//! # Files
//!
//! Named after OpenSM's: [`sm`] (`osm_sm.c`, the object and its MAD
//! dispatch), [`req`] (`osm_req.c`/`osm_vl15intf.c`), [`state_mgr`]
//! (sweeps), [`sm_state_mgr`] (SM states, polling, handover),
//! [`sminfo_rcv`], [`node_info_rcv`] (NodeInfo, PortInfo and SwitchInfo
//! answers), [`lid_mgr`], [`ucast_mgr`], [`mcast_mgr`], [`link_mgr`],
//! [`trap_rcv`], [`subnet`] (`osm_subnet.c` and the node/port objects),
//! [`ib_types`] (`iba/ib_types.h`), and [`sa`] with one file per record.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod ib_types;
pub mod lid_mgr;
pub mod link_mgr;
pub mod mcast_mgr;
pub mod node_info_rcv;
pub mod req;
pub mod sa;
pub mod sm;
pub mod sm_state_mgr;
pub mod sminfo_rcv;
pub mod state_mgr;
pub mod subnet;
pub mod trap_rcv;
pub mod ucast_mgr;

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::time::Duration;

use ib_core::verbs::{Event, EventElement, EventType};
use ib_core::{ClientId, Device, DeviceId, Error, IbClient, IbCore, Result};

pub use sm::{SmStats, SmStatus};
pub use subnet::SmConfig;

/// The client's name (one per core).
pub const CLIENT_NAME: &str = "opensm";

/// The SM of a device, in the device's client data.
struct SmSlot(Option<sm::Sm>);

/// The ib_core client that runs the SMs.
struct SmClient {
    devs: Vec<DeviceId>,
}

impl IbClient for SmClient {
    fn name(&self) -> &str {
        CLIENT_NAME
    }
    fn accepts(&self, _n: ib_core::verbs::NodeType, t: ib_core::verbs::Transport) -> bool {
        t == ib_core::verbs::Transport::Ib
    }
    fn add(&mut self, me: ClientId, dev: &mut Device) {
        dev.set_client_data(me, Box::new(SmSlot(None)));
        self.devs.push(dev.id());
    }
    fn remove(&mut self, _me: ClientId, dev: &mut Device) {
        let id = dev.id();
        self.devs.retain(|d| *d != id);
    }
    fn event(&mut self, me: ClientId, dev: &mut Device, e: &Event) {
        let EventElement::Port(p) = e.element else {
            return;
        };
        let Some(SmSlot(Some(sm))) = dev.client_data::<SmSlot>(me) else {
            return;
        };
        if sm.port == p && e.event == EventType::PortErr {
            // Our own port changed: look at the subnet again.
            sm.request_heavy_sweep();
        }
    }
    fn poll(&mut self, me: ClientId, core: &mut IbCore) -> usize {
        let mut work = 0;
        for i in 0..self.devs.len() {
            let dev = self.devs[i];
            let Some(mut s) = take(core, me, dev) else {
                continue;
            };
            work += s.poll(core);
            let now = core.clock().now_ns();
            if s.stop_done(now) {
                s.note(now, String::from("Exiting SM"));
                s.close(core);
                work += 1;
            } else {
                put(core, me, dev, s);
            }
        }
        work
    }
}

fn take(core: &mut IbCore, me: ClientId, dev: DeviceId) -> Option<sm::Sm> {
    core.device_mut(dev)?.client_data::<SmSlot>(me)?.0.take()
}

fn put(core: &mut IbCore, me: ClientId, dev: DeviceId, s: sm::Sm) {
    if let Some(slot) = core
        .device_mut(dev)
        .and_then(|d| d.client_data::<SmSlot>(me))
    {
        slot.0 = Some(s);
    }
}

/// Registers the SM client (once per core; a later call returns the same
/// id).
pub fn init(core: &mut IbCore) -> ClientId {
    if let Some(id) = core.client_by_name(CLIENT_NAME) {
        return id;
    }
    core.register_client(Box::new(SmClient { devs: Vec::new() }))
}

/// Starts an SM on `port` of `dev` (OpenSM started with `-g` that port's
/// GUID). An SM already running on the device is an error.
pub fn start(
    core: &mut IbCore,
    me: ClientId,
    dev: DeviceId,
    port: u8,
    cfg: SmConfig,
) -> Result<()> {
    let running = core
        .device_mut(dev)
        .ok_or(Error::NoDev)?
        .client_data::<SmSlot>(me)
        .ok_or(Error::NoDev)?
        .0
        .is_some();
    if running {
        return Err(Error::Busy);
    }
    let s = sm::Sm::open(core, dev, port, cfg)?;
    put(core, me, dev, s);
    Ok(())
}

/// Stops the SM of `dev` (OpenSM's exit): a master first hands over to
/// the best standby SM in the subnet (looking once more if it knows of
/// none); the SM closes (its agents, IsSM) from the progress function once
/// that is answered or `timeout` has passed: [`running`] says when, the
/// log says whether a handover was sent.
pub fn stop(core: &mut IbCore, me: ClientId, dev: DeviceId, timeout: Duration) -> Result<()> {
    let mut s = take(core, me, dev).ok_or(Error::NotFound)?;
    let now = core.clock().now_ns();
    s.stop_deadline = now.saturating_add(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX));
    s.begin_stop(core, now);
    if s.stop_done(now) {
        s.note(now, String::from("Exiting SM"));
        s.close(core);
    } else {
        put(core, me, dev, s);
    }
    Ok(())
}

/// The status of the SM of `dev`, if one runs.
pub fn status(core: &mut IbCore, me: ClientId, dev: DeviceId) -> Option<SmStatus> {
    let d = core.device_mut(dev)?;
    let s = d.client_data::<SmSlot>(me)?.0.as_ref()?;
    Some(s.status())
}

/// The SM's log lines (oldest first), if one runs.
pub fn log(core: &mut IbCore, me: ClientId, dev: DeviceId) -> Option<Vec<String>> {
    let d = core.device_mut(dev)?;
    let s = d.client_data::<SmSlot>(me)?.0.as_ref()?;
    Some(s.log.iter().cloned().collect())
}

/// The device and port an SM runs on, if any.
pub fn running(core: &mut IbCore, me: ClientId) -> Option<(DeviceId, u8)> {
    for dev in core.device_ids() {
        if let Some(d) = core.device_mut(dev)
            && let Some(SmSlot(Some(s))) = d.client_data::<SmSlot>(me)
        {
            return Some((dev, s.port));
        }
    }
    None
}
