//! Devices, clients, events and the cache.

use std::sync::{Arc, Mutex};

use super::fake::{Arrival, add_hca, lock, world};
use super::*;
use crate::device::{ClientId, Device, IbClient};
use crate::error::Error;
use crate::verbs::*;

type Log = Arc<Mutex<Vec<String>>>;

struct Recorder {
    name: &'static str,
    log: Log,
    only: Option<Transport>,
}

impl IbClient for Recorder {
    fn name(&self) -> &str {
        self.name
    }
    fn accepts(&self, _nt: NodeType, t: Transport) -> bool {
        self.only.is_none_or(|o| o == t)
    }
    fn add(&mut self, me: ClientId, dev: &mut Device) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} add {}", self.name, dev.name()));
        dev.set_client_data(me, Box::new(format!("{}@{}", self.name, dev.name())));
    }
    fn remove(&mut self, me: ClientId, dev: &mut Device) {
        let data = dev.client_data::<String>(me).cloned();
        self.log.lock().unwrap().push(format!(
            "{} remove {} {}",
            self.name,
            dev.name(),
            data.unwrap_or_default()
        ));
    }
    fn event(&mut self, _me: ClientId, dev: &mut Device, ev: &Event) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} event {} {}", self.name, dev.name(), ev.event));
    }
}

fn recorder(name: &'static str, log: &Log, only: Option<Transport>) -> Box<Recorder> {
    Box::new(Recorder {
        name,
        log: log.clone(),
        only,
    })
}

fn take(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[test]
fn clients_see_devices_before_and_after_and_are_removed_in_reverse() {
    let w = world();
    let clock = Arc::new(hal::fake::FakeClock::new());
    let mut core = IbCore::new(clock);
    let log: Log = Arc::default();
    let c1 = core.register_client(recorder("sa", &log, None));
    let d0 = core
        .register_device(Box::new(add_hca(&w, "mlx4_0", 0x10, 2, 1)))
        .unwrap();
    let rnic = core.register_client(recorder("iwcm", &log, Some(Transport::Iwarp)));
    let c2 = core.register_client(recorder("rmem", &log, Some(Transport::Ib)));
    let d1 = core
        .register_device(Box::new(add_hca(&w, "mlx4_1", 0x20, 1, 5)))
        .unwrap();
    assert_eq!(
        take(&log),
        [
            "sa add mlx4_0",
            "rmem add mlx4_0",
            "sa add mlx4_1",
            "rmem add mlx4_1"
        ]
    );
    // Client data per device.
    assert_eq!(
        core.device_mut(d1)
            .unwrap()
            .client_data::<String>(c2)
            .cloned(),
        Some("rmem@mlx4_1".into())
    );
    assert_eq!(
        core.device_mut(d1).unwrap().client_data::<String>(rnic),
        None
    );
    assert_eq!(
        core.device_mut(d1).unwrap().client_data::<u32>(c1),
        None,
        "typed"
    );

    core.unregister_device(d0).unwrap();
    assert_eq!(
        take(&log),
        [
            "rmem remove mlx4_0 rmem@mlx4_0",
            "sa remove mlx4_0 sa@mlx4_0"
        ]
    );
    assert_eq!(core.unregister_device(d0).err(), Some(Error::NoDev));
    core.unregister_client(c1).unwrap();
    assert_eq!(take(&log), ["sa remove mlx4_1 sa@mlx4_1"]);
    assert!(core.unregister_client(c1).is_err());
    // A device registered after a client left is not shown to it.
    core.register_device(Box::new(add_hca(&w, "mlx4_2", 0x30, 1, 9)))
        .unwrap();
    assert_eq!(take(&log), ["rmem add mlx4_2"]);
    // The freed slot is reused; names stay unique.
    let refused = core
        .register_device(Box::new(add_hca(&w, "mlx4_1", 0x40, 1, 11)))
        .unwrap_err();
    assert!(matches!(refused.error, Error::Conflict(_)));
    // The driver gets its device back to tear it down.
    assert_eq!(refused.provider.info().node_guid, 0x40);
}

#[test]
fn events_reach_handlers_clients_and_the_cache() {
    let mut r = rig();
    let log: Log = Arc::default();
    r.core.register_client(recorder("cm", &log, None));
    take(&log);
    let seen: Arc<Mutex<Vec<(DeviceId, Event)>>> = Arc::default();
    let s2 = seen.clone();
    let h = r
        .core
        .register_event_handler(r.a, Box::new(move |d, e| s2.lock().unwrap().push((d, *e))))
        .unwrap();
    assert_eq!(
        r.core.device(r.a).unwrap().port_cache(1).unwrap().lid,
        A_LID
    );
    // The SM gives A a new LID; the provider reports it.
    {
        let mut w = lock(&r.world);
        w.hcas[0].ports[0].lid = 77;
        w.hcas[0].ports[0].pkeys[3] = 0x8123;
        w.hcas[0]
            .events
            .push_back(Event::port(EventType::LidChange, 1));
        w.hcas[0]
            .events
            .push_back(Event::port(EventType::PkeyChange, 1));
    }
    assert!(r.core.poll() >= 2);
    let d = r.core.device(r.a).unwrap();
    assert_eq!(d.port_cache(1).unwrap().lid, 77);
    assert_eq!(d.find_cached_pkey(1, 0x0123), Ok(3));
    assert_eq!(d.get_cached_pkey(1, 3), Ok(0x8123));
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (r.a, Event::port(EventType::LidChange, 1)),
            (r.a, Event::port(EventType::PkeyChange, 1))
        ]
    );
    assert_eq!(
        take(&log),
        [
            "cm event fake_a IB_EVENT_LID_CHANGE",
            "cm event fake_a IB_EVENT_PKEY_CHANGE"
        ]
    );
    // Every event type reaches them; the fatal one marks the device.
    for ev in [
        EventType::PortActive,
        EventType::PortErr,
        EventType::SmChange,
        EventType::ClientReregister,
        EventType::GidChange,
    ] {
        lock(&r.world).hcas[0].events.push_back(Event::port(ev, 1));
    }
    lock(&r.world).hcas[0].events.push_back(Event {
        event: EventType::DeviceFatal,
        element: EventElement::Device,
    });
    r.core.poll();
    assert_eq!(seen.lock().unwrap().len(), 8);
    assert_eq!(take(&log).len(), 6);
    assert!(r.core.device(r.a).unwrap().is_fatal());
    assert!(!r.core.device(r.b).unwrap().is_fatal());
    r.core.unregister_event_handler(r.a, h).unwrap();
    assert_eq!(
        r.core.unregister_event_handler(r.a, h),
        Err(Error::NotFound)
    );
}

#[test]
fn snooped_set_portinfo_changes_the_lid_and_the_cache_follows() {
    // The driver snoops a Set(PortInfo) from the SM and raises LID_CHANGE,
    // as mlx4_ib does; the cache refreshes on the event.
    let mut r = rig();
    let mut m = crate::mad::Mad::new_request(
        crate::mad::class::SUBN_LID_ROUTED,
        1,
        crate::mad::method::SET,
        crate::mad::attr::PORT_INFO,
        1,
    );
    m.smp_data_mut()[16..18].copy_from_slice(&33u16.to_be_bytes());
    assert!(lock(&r.world).deliver(0, 1, 0, Arrival::mad(&m.0, 0, B_LID)));
    r.core.poll();
    r.core.poll();
    assert_eq!(r.core.device(r.a).unwrap().port_cache(1).unwrap().lid, 33);
    // The SMA's GetResp went back on the wire to B's QP0.
    let w = lock(&r.world);
    assert_eq!(w.wire.len(), 1);
    assert_eq!(w.wire[0].dest_qpn, 0);
    assert_eq!(w.wire[0].mad.method(), crate::mad::method::GET_RESP);
}

#[test]
fn the_cache_holds_every_gid_and_pkey_and_finds_them() {
    let r = rig();
    let d = r.core.device(r.b).unwrap();
    let c = d.port_cache(1).unwrap();
    assert_eq!(c.gids.len(), 4);
    assert_eq!(c.pkeys, [0xffff, 0x8001, 0x7fff, 0]);
    let g = Gid::new(fake::GID_PREFIX, B_GUID);
    assert_eq!(d.get_cached_gid(1, 0), Ok(g));
    assert_eq!(d.find_cached_gid(&g), Some((1, 0)));
    assert_eq!(d.find_cached_pkey(1, 0xffff), Ok(0));
    // A limited member matches when no full member exists.
    assert_eq!(d.find_cached_pkey(1, 0x0001), Ok(1));
    assert_eq!(d.find_cached_pkey(1, 0x1234), Err(Error::NotFound));
    // Full membership wins over a limited entry met first (later Linux;
    // 3.11 took the first match and could put the MAD QPs on a limited key).
    lock(&r.world).hcas[1].ports[0].pkeys = vec![0x7fff, 0xffff, 0x0005, 0];
    let mut r = r;
    lock(&r.world).hcas[1]
        .events
        .push_back(Event::port(EventType::PkeyChange, 1));
    r.core.poll();
    let d = r.core.device(r.b).unwrap();
    assert_eq!(d.find_cached_pkey(1, 0xffff), Ok(1));
    assert_eq!(d.find_cached_pkey(1, 0x7fff), Ok(1));
    assert_eq!(d.find_cached_pkey(1, 0x8005), Ok(2), "only a limited one");
    assert!(d.get_cached_gid(1, 9).is_err());
    assert!(d.get_cached_gid(2, 0).is_err());
    assert_eq!(d.get_cached_lmc(1), Ok(0));
    // The owner reaches its driver through the core.
    let d = r.core.device_mut(r.b).unwrap();
    assert_eq!(
        d.provider_as::<super::fake::FakeDev>().map(|f| f.idx),
        Some(1)
    );
    assert!(d.provider_as::<u32>().is_none());
}

#[test]
fn verbs_entry_points_check_their_arguments() {
    let mut r = rig();
    let d = r.core.device_mut(r.a).unwrap();
    assert!(d.query_port(0).is_err());
    assert!(d.query_port(2).is_err());
    assert!(d.query_gid(1, 4).is_err());
    assert!(d.query_pkey(1, 4).is_err());
    assert_eq!(d.query_port(1).unwrap().lid, A_LID);
    let pd = d.alloc_pd().unwrap();
    assert!(
        d.create_ah(
            pd,
            &AhAttr {
                port_num: 3,
                ..AhAttr::default()
            }
        )
        .is_err()
    );
    assert!(
        d.create_ah(
            pd,
            &AhAttr {
                port_num: 1,
                sl: 16,
                ..AhAttr::default()
            }
        )
        .is_err()
    );
    let grh = Some(GlobalRoute {
        sgid_index: 4,
        ..GlobalRoute::default()
    });
    assert!(
        d.create_ah(
            pd,
            &AhAttr {
                port_num: 1,
                grh,
                ..AhAttr::default()
            }
        )
        .is_err()
    );
    assert!(d.create_cq(&CqInitAttr::default()).is_err());
    // Remote access on the all-memory DMA MR is refused by the provider;
    // page-list MRs need a list that covers the region.
    assert!(
        d.get_dma_mr(pd, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .is_err()
    );
    let pages = [0x1000u64, 0x3000];
    let mut mr = MrPages {
        pages: &pages,
        page_shift: 12,
        iova: 0x10_0800,
        length: 0x1900,
        access: AccessFlags::LOCAL_WRITE,
    };
    assert!(
        matches!(d.reg_mr(pd, &mr), Err(Error::Invalid(_))),
        "needs 3 pages"
    );
    mr.length = 0x1000;
    assert_eq!(
        d.reg_mr(pd, &mr),
        Err(Error::NoSys),
        "checked, then the provider"
    );
    let bad = [0x1001u64, 0x3000];
    mr.pages = &bad;
    assert!(matches!(d.reg_mr(pd, &mr), Err(Error::Invalid(_))));
}

#[test]
fn a_port_whose_special_qps_cannot_be_created_has_no_mad_layer_but_the_device_registers() {
    let w = world();
    let dev = add_hca(&w, "mlx4_0", 0x10, 1, 1);
    lock(&w).hcas[0].fail_create_qp = true;
    let mut core = IbCore::new(Arc::new(hal::fake::FakeClock::new()));
    let id = core.register_device(Box::new(dev)).unwrap();
    assert!(!core.mad_port_open(id, 1));
    // Everything the failed open made was released.
    let wl = lock(&w);
    assert_eq!((wl.hcas[0].pds, wl.hcas[0].mrs), (0, 0));
    assert!(wl.hcas[0].cqs.iter().all(|c| c.is_none()));
    drop(wl);

    // Out of DMA memory after QP0 exists: QP0 is destroyed with the rest.
    let w = super::fake::world_with_dma(64 << 10);
    let dev = add_hca(&w, "mlx4_0", 0x10, 1, 1);
    let mut core = IbCore::new(Arc::new(hal::fake::FakeClock::new()));
    let id = core.register_device(Box::new(dev)).unwrap();
    assert!(!core.mad_port_open(id, 1));
    let wl = lock(&w);
    assert!(!wl.hcas[0].qps.is_empty(), "a QP was created");
    assert!(wl.hcas[0].qps.iter().all(|q| q.is_none()), "and destroyed");
    assert_eq!((wl.hcas[0].pds, wl.hcas[0].mrs), (0, 0));
    assert_eq!(wl.pool.stats().allocations, 0, "every DMA page returned");
}

/// A responder with no loop of its own: it answers DEVICE_MGMT Gets from
/// its poll hook, driven by whoever runs the progress function.
struct Responder {
    agent: Option<crate::mad::MadAgent>,
    answered: Arc<Mutex<u32>>,
    added: Arc<Mutex<u32>>,
}

impl IbClient for Responder {
    fn name(&self) -> &str {
        "responder"
    }
    fn add(&mut self, _me: ClientId, _dev: &mut Device) {
        *self.added.lock().unwrap() += 1;
    }
    fn remove(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn poll(&mut self, _me: ClientId, core: &mut IbCore) -> usize {
        use crate::mad::{MadEvent, MadSendBuf, method};
        let Some(ag) = self.agent else { return 0 };
        let mut n = 0;
        while let Some(ev) = core.mad_poll_agent(ag) {
            if let MadEvent::Recv(req) = ev {
                let mut resp = req.mad.clone();
                resp.set_method(method::GET_RESP);
                let ah = crate::agent::init_ah_from_wc(
                    core.device(ag.dev).unwrap(),
                    ag.port,
                    &req.wc,
                    req.grh.as_ref(),
                )
                .unwrap();
                core.post_send_mad(ag, MadSendBuf::new(resp, ah, req.wc.src_qp))
                    .unwrap();
                *self.answered.lock().unwrap() += 1;
                n += 1;
                // Re-entering the progress function is harmless.
                core.poll();
            }
        }
        n
    }
}

#[test]
fn clients_answer_from_the_progress_function() {
    use crate::mad::{MadRegReq, MadSendBuf, class, method};
    let mut r = rig();
    let answered = Arc::new(Mutex::new(0));
    let agent = r
        .core
        .register_mad_agent(
            r.b,
            1,
            QpType::Gsi,
            Some(MadRegReq::new(class::DEVICE_MGMT, 1, &[method::GET])),
            0,
        )
        .unwrap();
    let added = Arc::new(Mutex::new(0));
    let c = r.core.register_client(Box::new(Responder {
        agent: Some(agent),
        answered: answered.clone(),
        added: added.clone(),
    }));
    assert_eq!(
        *added.lock().unwrap(),
        2,
        "a client takes every CA by default"
    );
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    for i in 0..3 {
        let m = crate::mad::Mad::new_request(class::DEVICE_MGMT, 1, method::GET, 0x10, i);
        let mut buf = MadSendBuf::new(
            m,
            AhAttr {
                dlid: B_LID,
                port_num: 1,
                ..AhAttr::default()
            },
            1,
        );
        buf.timeout_ms = 50;
        let (done, resp) = r
            .core
            .send_mad_wait(ag, buf, std::time::Duration::from_secs(5))
            .unwrap();
        assert_eq!(done.status, WcStatus::Success);
        assert_eq!(resp.unwrap().mad.attr_mod(), i);
    }
    assert_eq!(*answered.lock().unwrap(), 3);
    // Unregistered, it is polled no more.
    r.core.unregister_client(c).unwrap();
    r.core.poll();
}
