//! Model-backed tests of mlx4_ib through ib_core.
//!
//! Device registration with node and port attributes from the firmware SMA, QP0/QP1
//! brought up by the MAD layer (CONF_SPECIAL_QP QPNs, INIT_PORT when QP0 reaches
//! RTR), verbs objects and their firmware commands (RC/UC/UD QPs through RTS with
//! the context fields Linux writes, SRQ, MRs, AHs), port events and snooped SMPs
//! reaching ib_core, removal with nothing leaked. Traffic (WQEs executed by the
//! model) is not covered: the model's data path has not landed.

use tests::mlx4_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ib_core::IbCore;
use ib_core::verbs::{
    AccessFlags, AhAttr, CqInitAttr, EventType, Gid, GlobalRoute, IbDevice, Mtu, NodeType,
    PortState, QpAttr, QpAttrMask, QpCap, QpCreateFlags, QpInitAttr, QpState, QpType, SigType,
    SrqAttr, SrqAttrMask, SrqInitAttr,
};
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;

fn add(hca: &sim::SimHca) -> Mlx4IbDev {
    let dev = bring_up(hca, Profile::default()).expect("mlx4_core up");
    Mlx4IbDev::add(dev, "mlx4_0").expect("mlx4_ib_add")
}

fn core(hca: &sim::SimHca) -> IbCore {
    IbCore::new(hca.clock())
}

#[test]
fn mlx4_ib_add_reads_node_data_and_registers_with_ib_core() {
    let hca = sync_hca();
    let ib = add(&hca);
    let info = ib.info();
    assert_eq!(info.name, "mlx4_0");
    assert_eq!(info.node_type, NodeType::Ca);
    assert_eq!(info.phys_port_cnt, 2);
    assert_ne!(info.node_guid, 0, "node GUID from NodeInfo");
    let mut core = core(&hca);
    let id = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    let dev = core.device_mut(id).unwrap();
    // Both ports answer through the firmware SMA; the MAD layer opened both
    // (QP0 and QP1 each), so INIT_PORT went out for both.
    for port in 1..=2 {
        let a = dev.query_port(port).unwrap();
        // INIT_PORT brought the link up; no SM has set it Active yet.
        assert_eq!(a.state, PortState::Init);
        assert!(a.gid_tbl_len > 0 && a.pkey_tbl_len > 0);
        let gid = dev.query_gid(port, 0).unwrap();
        assert_eq!(
            gid.0[..8],
            [0xfe, 0x80, 0, 0, 0, 0, 0, 0],
            "link-local prefix"
        );
        assert_eq!(dev.query_pkey(port, 0).unwrap() & 0x7fff, 0x7fff);
    }
    let attr = dev.query_device().unwrap();
    assert_eq!(attr.vendor_id, 0x02c9, "Mellanox OUI");
    assert!(attr.max_qp > 0 && attr.max_cqe > 0);
    let init_ports: Vec<u32> = hca
        .trace()
        .iter()
        .filter(|e| e.name == "INIT_PORT")
        .map(|e| e.in_mod)
        .collect();
    assert_eq!(init_ports, [1, 2], "QP0 reaching RTR opened each port");
    assert!(hca.violations().is_empty(), "{:#?}", hca.violations());
    let failed: Vec<_> = hca.trace().into_iter().filter(|e| !e.ok()).collect();
    assert!(failed.is_empty(), "{failed:#?}");

    // Unregister and remove: every object back, ports closed.
    let mut provider = core.unregister_device(id).unwrap();
    let ib = provider
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
        .expect("the provider is mlx4_ib");
    assert_eq!(ib.live_objects(), [0; 7], "ib_core's MAD ports freed all");
    let closes = hca
        .trace()
        .iter()
        .filter(|e| e.name == "CLOSE_PORT")
        .count();
    assert_eq!(closes, 2, "QP0 leaving RTS closed both ports");
    ib.remove();
    assert_eq!(ib.core().qp_avail().1, 0);
    assert_eq!(ib.core().cq_avail().1, 0);
    drop(provider);
    assert_eq!(
        hca.icm_mapped_pages(),
        0,
        "dropping the provider tore the HCA down"
    );
}

/// Registration fills ib_core's cache with every GID and P_Key of both
/// ports. Read one entry at a time (Linux 3.11) that is 2 x 128 x 2 + 2 x
/// 128 MAD_IFCs, each a polled firmware command, with QP0 unpolled all the
/// while (the SM's first SMPs time out); read in blocks it is 1 + 16 + 4
/// per port. The blocks must read the same table as single entries do.
#[test]
fn registration_reads_the_gid_and_pkey_tables_in_blocks() {
    let hca = sync_hca();
    let ib = add(&hca);
    let mut core = core(&hca);
    let before = hca.trace_len();
    let id = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    let mad_ifcs = hca
        .trace_since(before)
        .iter()
        .filter(|e| e.name == "MAD_IFC")
        .count();
    let dev = core.device_mut(id).unwrap();
    let mut blocks = 0;
    for port in 1..=2u8 {
        let (gids, pkeys) = (
            dev.gid_tbl_len(port).unwrap(),
            dev.pkey_tbl_len(port).unwrap(),
        );
        assert_eq!((gids, pkeys), (128, 128), "ConnectX-3's table sizes");
        blocks += 1 + gids.div_ceil(8) as usize + usize::from(pkeys.div_ceil(32));
        let cache = dev.port_cache(port).unwrap().clone();
        assert_eq!(cache.gids.len(), gids as usize);
        assert_eq!(cache.pkeys.len(), usize::from(pkeys));
        for i in 0..gids {
            assert_eq!(
                cache.gids[i as usize],
                dev.query_gid(port, i).unwrap(),
                "GID {i}"
            );
        }
        for i in 0..pkeys {
            assert_eq!(
                cache.pkeys[usize::from(i)],
                dev.query_pkey(port, i).unwrap(),
                "P_Key {i}"
            );
        }
    }
    println!("registration: {mad_ifcs} MAD_IFCs, of them {blocks} for the GID and P_Key tables");
    assert!(
        mad_ifcs <= blocks + 16,
        "registration issued {mad_ifcs} MAD_IFCs; the tables need {blocks}"
    );
    let mut provider = core.unregister_device(id).unwrap();
    let ib = provider
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
        .expect("the provider is mlx4_ib");
    ib.remove();
}

#[test]
fn verbs_objects_reach_rts_with_linux_contexts() {
    let hca = sync_hca();
    let mut ib = add(&hca);
    let pd = IbDevice::alloc_pd(&mut ib).unwrap();
    let (cq, n) = IbDevice::create_cq(
        &mut ib,
        &CqInitAttr {
            cqe: 100,
            comp_vector: 0,
        },
    )
    .unwrap();
    assert_eq!(n, 127, "roundup_pow_of_two(100 + 1) - 1");
    let init = |t| QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 0,
        },
        sq_sig_type: SigType::ReqWr,
        qp_type: t,
        create_flags: QpCreateFlags::empty(),
        port_num: 0,
    };
    let (rc, cap) = IbDevice::create_qp(&mut ib, pd, &init(QpType::Rc)).unwrap();
    assert!(cap.max_send_wr >= 64 && cap.max_recv_wr >= 64);
    // RESET -> INIT -> RTR -> RTS as ib_cm would.
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..Default::default()
    };
    IbDevice::modify_qp(
        &mut ib,
        rc,
        &a,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    // A wrong mask is refused by the IBTA table, naming what is missing.
    a.qp_state = QpState::Rtr;
    let e = IbDevice::modify_qp(&mut ib, rc, &a, QpAttrMask::STATE).unwrap_err();
    assert!(format!("{e}").contains("IB_QP_AV"), "{e}");
    a.path_mtu = Mtu::Mtu2048;
    a.dest_qp_num = 0x123;
    a.rq_psn = 0x42;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 12;
    a.ah_attr = AhAttr {
        dlid: 7,
        sl: 3,
        port_num: 1,
        ..Default::default()
    };
    IbDevice::modify_qp(
        &mut ib,
        rc,
        &a,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = 0x77;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    IbDevice::modify_qp(
        &mut ib,
        rc,
        &a,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
    // What the HCA holds, read back with QUERY_QP.
    let (q, qi) = IbDevice::query_qp(&mut ib, rc, QpAttrMask::empty()).unwrap();
    assert_eq!(q.qp_state, QpState::Rts);
    assert_eq!(q.path_mtu, Mtu::Mtu2048);
    assert_eq!(q.dest_qp_num, 0x123);
    assert_eq!((q.rq_psn, q.sq_psn), (0x42, 0x77));
    assert_eq!(
        (q.ah_attr.dlid, q.ah_attr.sl, q.ah_attr.port_num),
        (7, 3, 1)
    );
    assert_eq!((q.timeout, q.retry_cnt, q.rnr_retry), (14, 7, 7));
    assert_eq!((q.max_rd_atomic, q.max_dest_rd_atomic), (4, 4));
    assert_eq!(q.min_rnr_timer, 12);
    assert!(
        q.qp_access_flags
            .contains(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ)
    );
    assert_eq!(qi.qp_type, QpType::Rc);

    // UD with a GRH-capable AH, and an SRQ-attached UC QP.
    let (ud, _) = IbDevice::create_qp(&mut ib, pd, &init(QpType::Ud)).unwrap();
    let ud_init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey: 0x1111_1111,
        ..Default::default()
    };
    IbDevice::modify_qp(
        &mut ib,
        ud,
        &ud_init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    let ah = IbDevice::create_ah(
        &mut ib,
        pd,
        &AhAttr {
            dlid: 3,
            port_num: 1,
            grh: Some(GlobalRoute {
                dgid: Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]),
                hop_limit: 1,
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(IbDevice::query_ah(&mut ib, ah).unwrap().grh.is_some());
    let (srq, sa) = IbDevice::create_srq(
        &mut ib,
        pd,
        &SrqInitAttr {
            attr: SrqAttr {
                max_wr: 100,
                max_sge: 1,
                srq_limit: 0,
            },
        },
    )
    .unwrap();
    assert_eq!(sa.max_wr, 127);
    IbDevice::modify_srq(
        &mut ib,
        srq,
        &SrqAttr {
            srq_limit: 10,
            ..sa
        },
        SrqAttrMask::LIMIT,
    )
    .unwrap();
    assert_eq!(IbDevice::query_srq(&mut ib, srq).unwrap().srq_limit, 10);
    let mut uc_init = init(QpType::Uc);
    uc_init.srq = Some(srq);
    uc_init.cap.max_recv_wr = 0;
    let (uc, _) = IbDevice::create_qp(&mut ib, pd, &uc_init).unwrap();
    assert!(
        IbDevice::destroy_srq(&mut ib, srq).is_err(),
        "an SRQ in use is kept"
    );

    // MRs: a local DMA MR; no remote key over all memory; a page list.
    let dma = IbDevice::get_dma_mr(&mut ib, pd, AccessFlags::LOCAL_WRITE).unwrap();
    assert!(IbDevice::get_dma_mr(&mut ib, pd, AccessFlags::REMOTE_WRITE).is_err());
    let pool = IbDevice::dma_pool(&ib);
    let pages: Vec<_> = (0..3).map(|_| pool.alloc_pages(1).unwrap()).collect();
    let addrs: Vec<u64> = pages.iter().map(|p| p.bus_addr().0).collect();
    let mr = IbDevice::reg_mr(
        &mut ib,
        pd,
        &ib_core::verbs::MrPages {
            pages: &addrs,
            page_shift: 12,
            iova: 0x10_0000,
            length: 3 * 4096,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        },
    )
    .unwrap();
    assert_ne!(mr.rkey, dma.lkey);

    // Everything goes away; nothing leaks in mlx4_core either.
    for q in [rc, ud, uc] {
        IbDevice::destroy_qp(&mut ib, q).unwrap();
    }
    IbDevice::destroy_srq(&mut ib, srq).unwrap();
    IbDevice::destroy_ah(&mut ib, ah).unwrap();
    IbDevice::dereg_mr(&mut ib, mr).unwrap();
    IbDevice::dereg_mr(&mut ib, dma).unwrap();
    IbDevice::destroy_cq(&mut ib, cq).unwrap();
    IbDevice::dealloc_pd(&mut ib, pd).unwrap();
    assert_eq!(ib.live_objects(), [0; 7]);
    assert!(hca.violations().is_empty(), "{:#?}", hca.violations());
    assert!(hca.dma_faults().is_empty(), "{:#?}", hca.dma_faults());
    let failed: Vec<_> = hca.trace().into_iter().filter(|e| !e.ok()).collect();
    assert!(failed.is_empty(), "{failed:#?}");
    drop(pages);
    drop(ib);
    assert_eq!(hca.icm_mapped_pages(), 0);
}

#[test]
fn port_events_reach_ib_core_clients_and_the_cache() {
    let hca = sync_hca();
    let ib = add(&hca);
    let mut core = core(&hca);
    let id = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    core.register_event_handler(id, Box::new(move |_, e| s.lock().unwrap().push(*e)))
        .unwrap();
    assert!(tests::sm::sm_activate(&hca, 1, 0x11, 0x1));
    core.poll_until(Duration::from_secs(1), |c| {
        c.poll();
        seen.lock()
            .unwrap()
            .iter()
            .any(|e| e.event == EventType::PortActive)
            .then_some(())
    })
    .expect("IB_EVENT_PORT_ACTIVE");
    let dev = core.device_mut(id).unwrap();
    let a = dev.query_port(1).unwrap();
    assert_eq!((a.state, a.lid, a.sm_lid), (PortState::Active, 0x11, 1));
    assert_eq!(dev.port_cache(1).unwrap().lid, 0x11, "cache refreshed");
    assert!(hca.set_link(1, false));
    core.poll_until(Duration::from_secs(1), |c| {
        c.poll();
        seen.lock()
            .unwrap()
            .iter()
            .any(|e| e.event == EventType::PortErr)
            .then_some(())
    })
    .expect("IB_EVENT_PORT_ERR");
    assert!(hca.violations().is_empty(), "{:#?}", hca.violations());
}

/// The console's port lines (`ib_tools::port_events`, which the kernel
/// registers) come while ib_core is polled, as a running command polls it,
/// each with the time of its dispatch, DOWN included.
#[test]
fn port_transitions_are_logged_as_they_are_polled_with_their_time() {
    let hca = sync_hca();
    let ib = add(&hca);
    let mut core = core(&hca);
    let lines = Arc::new(Mutex::new(Vec::<(u64, String)>::new()));
    let (l, clock, c2) = (lines.clone(), hca.clock(), hca.clock());
    core.register_client(Box::new(ib_tools::port_events::PortLog::new(
        Box::new(move |s| {
            l.lock()
                .unwrap()
                .push((clock.now_ns() / 1000, s.to_string()))
        }),
        Box::new(move || c2.now_ns() / 1000),
    )));
    core.register_device(Box::new(ib))
        .map_err(|e| e.error)
        .unwrap();
    let wait_line = |core: &mut IbCore, pat: &str| -> (u64, String) {
        let t0 = hca.clock().now_ns() / 1000;
        let got = core
            .poll_until(Duration::from_secs(1), |c| {
                c.poll();
                lines
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|(_, s)| s.contains(pat))
                    .cloned()
            })
            .unwrap_or_else(|_| panic!("no {pat:?} line: {:?}", lines.lock().unwrap()));
        assert!(got.0 >= t0, "logged during this poll: {got:?}");
        got
    };
    assert!(tests::sm::sm_activate(&hca, 1, 0x11, 0x1));
    let (_, up) = wait_line(&mut core, "state: ACTIVE");
    assert!(
        up.starts_with("mlx4_0: port 1 state: ACTIVE, lid 0x11, sm_lid 0x1 (")
            && up.ends_with(" ms after kernel entry)"),
        "{up}"
    );
    assert!(hca.set_link(1, false));
    let (at, down) = wait_line(&mut core, "state: DOWN");
    assert_eq!(
        down,
        format!(
            "mlx4_0: port 1 state: DOWN ({}.{:03} ms after kernel entry)",
            at / 1000,
            at % 1000
        ),
        "the DOWN line carries the time it was dispatched"
    );
    assert!(hca.violations().is_empty(), "{:#?}", hca.violations());
}

#[test]
fn process_mad_answers_through_the_sma_and_snoops_sets() {
    let hca = sync_hca();
    let mut ib = add(&hca);
    // A Get(NodeDescription) from the wire: the reply carries the host's
    // node description, and a directed-route reply has the D bit.
    let mut m = ib_core::mad::Mad::default();
    m.0[0] = 1;
    m.0[1] = 0x81;
    m.0[2] = 1;
    m.0[3] = 0x01;
    m.0[16..18].copy_from_slice(&0x0010u16.to_be_bytes());
    let mut out = ib_core::mad::Mad::default();
    let wc = ib_core::verbs::Wc {
        qp_num: 0,
        slid: 0xffff,
        ..Default::default()
    };
    let r = IbDevice::process_mad(&mut ib, 0, 1, Some(&wc), None, &m, &mut out).unwrap();
    assert!(r.contains(ib_core::mad::MadResult::REPLY), "{r:?}");
    assert_eq!(out.0[3], 0x81, "GetResp");
    assert_eq!(out.0[4] & 0x80, 0x80, "direction bit");
    assert_eq!(&out.0[64..128], &ib.node_desc()[..]);
    // SMInfo is not for the firmware SMA; a Trap is consumed.
    m.0[16..18].copy_from_slice(&0x0020u16.to_be_bytes());
    let r = IbDevice::process_mad(&mut ib, 0, 1, Some(&wc), None, &m, &mut out).unwrap();
    assert!(!r.contains(ib_core::mad::MadResult::REPLY));
    // Set(PortInfo) with a LID and client re-register: snooped events.
    let mut set = [0u8; 256];
    set[..4].copy_from_slice(&[1, 0x01, 1, 0x02]);
    set[16..18].copy_from_slice(&0x0015u16.to_be_bytes());
    set[20..24].copy_from_slice(&1u32.to_be_bytes());
    let q = mlx4_ib::mad::query(ib.core_mut(), 1, 0x0015, 1).unwrap();
    set[64..128].copy_from_slice(&q[64..128]);
    set[64 + 16..64 + 18].copy_from_slice(&0x22u16.to_be_bytes());
    set[64 + 51] |= 0x80;
    let r = IbDevice::process_mad(&mut ib, 3, 1, None, None, &ib_core::mad::Mad(set), &mut out)
        .unwrap();
    assert!(r.contains(ib_core::mad::MadResult::REPLY), "{r:?}");
    let mut evs = Vec::new();
    IbDevice::poll_events(&mut ib, &mut |e| evs.push(e.event)).unwrap();
    if ib.core().caps().flags & (1 << 59) == 0 {
        assert!(evs.contains(&EventType::LidChange), "{evs:?}");
        assert!(evs.contains(&EventType::ClientReregister), "{evs:?}");
    }
    drop(ib);
}

#[test]
fn a_catastrophic_error_is_device_fatal_and_the_device_is_removed() {
    let hca = sync_hca();
    let ib = add(&hca);
    let mut core = core(&hca);
    let id = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    core.register_event_handler(id, Box::new(move |_, e| s.lock().unwrap().push(*e)))
        .unwrap();
    hca.expect_firmware_left_behind("after a catastrophic error every command fails until a reset");
    hca.raise_catastrophic_error();
    core.poll_until(Duration::from_secs(1), |c| {
        c.poll();
        seen.lock()
            .unwrap()
            .iter()
            .any(|e| e.event == EventType::DeviceFatal)
            .then_some(())
    })
    .expect("IB_EVENT_DEVICE_FATAL");
    // The owner removes it: the MAD ports close and mlx4_ib_remove runs
    // although every command now fails; nothing hangs, nothing panics.
    let mut p = core.unregister_device(id).unwrap();
    let m = p
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
        .unwrap();
    assert!(m.is_fatal());
    m.remove();
    assert_eq!(m.live_objects(), [0; 7]);
    assert!(core.devices().next().is_none());
}
