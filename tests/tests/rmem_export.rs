//! Model-backed tests of rmem's memory node.
//!
//! Model-backed tests of rmem's memory node over the real mlx4_core +
//! mlx4_ib + ib_core stack on one model HCA: the exported region is
//! registered (its own MPT over MTT entries) with an rkey scoped
//! to it (not the all-memory DMA key), the CM listens on our service ID, a
//! region the DMA pool cannot hold is a clear error, and closing gives
//! everything back. RPC and RDMA traffic between nodes waits for the
//! model's data path (engine branch).

use tests::mlx4_common;

use ib_core::IbCore;
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;
use rmem::{Server, ServerConfig};

fn stack(hca: &sim::SimHca) -> (IbCore, ib_core::DeviceId, ib_core::ClientId) {
    let dev = bring_up(hca, Profile::default()).expect("mlx4_core up");
    let ib = Mlx4IbDev::add(dev, "mlx4_0").expect("mlx4_ib_add");
    let mut core = IbCore::new(hca.clock());
    let cm = ib_core::cm::init(&mut core);
    let id = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    (core, id, cm)
}

fn teardown(mut core: IbCore, id: ib_core::DeviceId) {
    let mut provider = core.unregister_device(id).expect("unregistered");
    let ib = provider
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
        .expect("mlx4_ib");
    assert_eq!(ib.live_objects(), [0; 7], "rmem and ib_core freed all");
    ib.remove();
}

#[test]
fn rmem_export_registers_a_bounded_region_through_mtts() {
    let hca = sync_hca();
    let (mut core, id, cm) = stack(&hca);
    let before = hca.trace_len();
    let cfg = ServerConfig::default();
    let srv = Server::export(&mut core, cm, id, 64 * 1024 + 1, cfg).expect("exported");
    let r = srv.region();
    assert_eq!(r.base, cfg.iova);
    assert_eq!(r.len, 68 * 1024, "rounded up to whole pages");
    let cmds: Vec<&str> = hca.trace_since(before).iter().map(|e| e.name).collect();
    // Linux 3.11 writes MTT entries straight into ICM (no WRITE_MTT
    // command when not in SR-IOV); the region and the local DMA key are
    // two MPTs.
    let mpts = cmds.iter().filter(|c| **c == "SW2HW_MPT").count();
    assert_eq!(mpts, 2, "region MPT and local key MPT: {cmds:?}");
    // The all-memory local key is a different MPT: the region's rkey is not it.
    let dma = core
        .device_mut(id)
        .unwrap()
        .provider()
        .alloc_pd()
        .and_then(|pd| {
            let d = core.device_mut(id).unwrap().provider();
            let mr = d.get_dma_mr(pd, ib_core::verbs::AccessFlags::LOCAL_WRITE)?;
            d.dereg_mr(mr)?;
            d.dealloc_pd(pd)?;
            Ok(mr)
        })
        .expect("dma mr");
    assert_ne!(dma.rkey, r.rkey);
    assert_eq!(srv.clients(), 0);
    // The service ID is ours now: a second export on it is refused.
    let again = Server::export(&mut core, cm, id, 4096, cfg).unwrap_err();
    assert!(format!("{again}").contains("already listened"), "{again}");
    srv.close(&mut core).expect("closed");
    // Closed: the service ID can be listened to again.
    let srv = Server::export(&mut core, cm, id, 4096, cfg).expect("again");
    srv.close(&mut core).expect("closed");
    teardown(core, id);
}

#[test]
fn rmem_export_beyond_the_dma_pool_is_a_clear_error() {
    let hca = sync_hca();
    let (mut core, id, cm) = stack(&hca);
    let e = Server::export(&mut core, cm, id, 1 << 40, ServerConfig::default()).unwrap_err();
    assert_eq!(e, rmem::Error::Verbs(ib_core::Error::NoMem), "{e}");
    let e = Server::export(&mut core, cm, id, 0, ServerConfig::default()).unwrap_err();
    assert_eq!(e, rmem::Error::BadLength);
    teardown(core, id);
}
