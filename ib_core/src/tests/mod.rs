//! ib_core's tests against a fake provider (two software HCAs cabled back to back): registration and clients, events and the cache, the MAD layer end to end, bad input and the fuzz run.

mod bench;
mod clients;
mod cm;
mod fake;
mod flags;
mod fuzz;
mod mad_layer;
mod mcast;
mod rmpp;
mod sa;

use std::sync::Arc;
use std::time::Duration;

use hal::fake::FakeClock;

use crate::device::{DeviceId, IbCore};
use fake::{SharedWorld, add_hca, cable, world};

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

/// Two one-port HCAs, A (LID 10) and B (LID 20), cabled port 1 to port 1,
/// registered with one core whose clock advances 50 us per relax.
pub fn rig() -> Rig {
    let w = world();
    let da = add_hca(&w, "fake_a", A_GUID, 1, A_LID);
    let db = add_hca(&w, "fake_b", B_GUID, 1, B_LID);
    cable(&w, (0, 1), (1, 1));
    let clock = Arc::new(FakeClock::with_relax_step(Duration::from_micros(50)));
    let mut core = IbCore::new(clock.clone());
    let a = core.register_device(Box::new(da)).unwrap();
    let b = core.register_device(Box::new(db)).unwrap();
    Rig {
        core,
        world: w,
        clock,
        a,
        b,
    }
}
