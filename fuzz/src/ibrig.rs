//! Two fake HCAs on one ib_core, as ib_core's own tests build them.

use std::sync::Arc;
use std::time::Duration;

use hal::fake::FakeClock;
use ib_core::device::{DeviceId, IbCore, MadConfig};
use ib_core::sa_query::PathRecord;
use ib_core::verbs::Mtu;

use crate::ibfake::{SharedWorld, add_hca, cable, lock, world_with_dma};

pub const A_GUID: u64 = 0x0002_c903_0000_0a00;
pub const B_GUID: u64 = 0x0002_c903_0000_0b00;
pub const A_LID: u16 = 10;
pub const B_LID: u16 = 20;

pub struct Rig {
    pub core: IbCore,
    pub world: SharedWorld,
    pub clock: Arc<FakeClock>,
    pub a: DeviceId,
    pub b: DeviceId,
}

/// The LID port 1 of HCA `hca` has now (an SMP Set may have changed it).
pub fn lid_now(r: &Rig, hca: usize) -> u16 {
    lock(&r.world).hcas[hca].ports[0].lid
}

/// Two one-port HCAs, A (LID 10) and B (LID 20), cabled port 1 to port 1,
/// registered with one core whose clock advances 50 us per relax; the
/// wire capture off unless `capture`.
pub fn rig(capture: bool) -> Rig {
    rig_with(capture, |_| {})
}

/// [`rig`], with `tweak` run on the world before the devices register.
pub fn rig_with(capture: bool, tweak: impl FnOnce(&SharedWorld)) -> Rig {
    let w = world_with_dma(256 << 10);
    lock(&w).capture = capture;
    let da = add_hca(&w, "fake_a", A_GUID, 1, A_LID);
    let db = add_hca(&w, "fake_b", B_GUID, 1, B_LID);
    cable(&w, (0, 1), (1, 1));
    tweak(&w);
    let clock = Arc::new(FakeClock::with_relax_step(Duration::from_micros(50)));
    // Smaller queues than Linux's 128/512, so that a rig costs little
    // (the code paths are the same; a small mailbox reaches its drops).
    let mut core = IbCore::with_mad_config(
        clock.clone(),
        MadConfig {
            send_queue_size: 16,
            recv_queue_size: 64,
            agent_mailbox: 16,
            poll_budget: 256,
        },
    );
    let a = core.register_device(Box::new(da)).expect("register A");
    let b = core.register_device(Box::new(db)).expect("register B");
    Rig {
        core,
        world: w,
        clock,
        a,
        b,
    }
}

/// The path from A's port 1 to B's (GIDs from the caches, 2048-byte MTU,
/// the rate and packet life time an SM would give), as the CM targets
/// hand it to `send_req`.
pub fn path_a_to_b(r: &Rig) -> PathRecord {
    let sgid = r.core.device(r.a).unwrap().get_cached_gid(1, 0).unwrap();
    let dgid = r.core.device(r.b).unwrap().get_cached_gid(1, 0).unwrap();
    PathRecord {
        dgid,
        sgid,
        dlid: B_LID,
        slid: A_LID,
        reversible: true,
        numb_path: 1,
        pkey: 0xffff,
        mtu_selector: 2,
        mtu: Mtu::Mtu2048 as u8,
        rate_selector: 2,
        rate: 7,
        packet_life_time_selector: 2,
        packet_life_time: 14,
        ..PathRecord::default()
    }
}
