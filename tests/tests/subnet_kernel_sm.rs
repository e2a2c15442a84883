//! Our kernel's subnet manager (`ib_sm`) brings driver-run HCAs to Active.
//!
//! Two or more model HCAs with the real mlx4_core + mlx4_ib + ib_core, on the
//! `--nodes N` topology (one model switch) or back to back, with no SM of the
//! fabric's own (`--sm none`): the SM runs inside guest a's ib_core, every SMP
//! it sends crosses the fabric to the other guests' QP0 (answered by their
//! ib_core agent and mlx4_ib's MAD_IFC) and to the switch's SMA, and its SA
//! answers the other guests' ib_core SA client on QP1.

use tests::subnet_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ib_core::multicast::{self, McastId, MemberState};
use ib_core::sa_query::{McMemberRecord, join_state, mcmember_comp};
use ib_core::verbs::{
    AccessFlags, AhAttr, Cq, CqInitAttr, EventType, Gid, GlobalRoute, MrPages, Pd, PortState, Qp,
    QpAttr, QpAttrMask, QpCap, QpCreateFlags, QpInitAttr, QpState, QpType, RecvWr, SendFlags,
    SendWr, Sge, SigType, Wc, WcStatus, WrDetail, WrOpcode,
};
use ib_sm::SmConfig;
use ib_sm::ib_types::sm_state;
use sim::fabric::{Fabric, Owner, Topology};
use subnet_common::*;

const UP_LIMIT: Duration = Duration::from_secs(30);

struct Net {
    fabric: Arc<Mutex<Fabric>>,
    a: Guest,
    b: Guest,
    sm: ib_core::ClientId,
}

fn net(topo: Topology) -> Net {
    let mut f = Fabric::new();
    let built = topo.build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let (mut a, b) = sync_guests(&fabric, &built);
    let sm = ib_sm::init(&mut a.core);
    Net { fabric, a, b, sm }
}

fn start(n: &mut Net, cfg: SmConfig) {
    ib_sm::start(&mut n.a.core, n.sm, n.a.dev, 1, cfg).expect("SM started");
}

fn sm_log(n: &mut Net) -> String {
    ib_sm::log(&mut n.a.core, n.sm, n.a.dev)
        .unwrap_or_default()
        .join("\n")
}

/// Starts an SA query on guest b's (or a's) SA client and runs both
/// guests until it ends.
fn sa_query(
    n: &mut Net,
    on_a: bool,
    q: impl FnOnce(
        &mut ib_core::IbCore,
        ib_core::ClientId,
        ib_core::DeviceId,
    ) -> ib_core::Result<ib_core::sa_query::SaQueryId>,
) -> ib_core::sa_query::SaResponse {
    let g = if on_a { &mut n.a } else { &mut n.b };
    let (sa, dev) = (g.sa, g.dev);
    let id = q(&mut g.core, sa, dev).expect("query started");
    let mut got = None;
    pump_until(&mut [&mut n.a, &mut n.b], Duration::from_secs(20), 1, |g| {
        let g = if on_a { &mut *g[0] } else { &mut *g[1] };
        got = ib_core::sa_query::query_result(&mut g.core, sa, id);
        got.is_some()
    });
    let log = sm_log(n);
    got.expect("the SA answered")
        .unwrap_or_else(|e| panic!("SA query: {e}\nSM log:\n{log}"))
}

/// Both ports Active, and each guest's client told so: IB_EVENT_PORT_ACTIVE
/// comes through the guest's async EQ, read at its next poll, which can
/// come after the round whose QUERY_PORT already showed Active.
fn up(n: &mut Net) {
    let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 64, |g| {
        g.iter_mut()
            .all(|g| g.active() && g.events().contains(&(EventType::PortActive, 1)))
    });
    let log = sm_log(n);
    assert!(ok, "both ports Active; SM log:\n{log}");
}

#[test]
fn kernel_sm_brings_two_guests_on_a_switch_to_active() {
    let mut n = net(Topology::for_nodes(2).unwrap());
    start(&mut n, SmConfig::default());
    up(&mut n);
    let st = ib_sm::status(&mut n.a.core, n.sm, n.a.dev).unwrap();
    eprintln!("{}\n{st:?}", sm_log(&mut n));
    let (pa, pb) = (n.a.port(1), n.b.port(1));
    assert_eq!(pa.state, PortState::Active);
    assert_eq!(pb.state, PortState::Active);
    assert_ne!(pa.lid, pb.lid);
    assert_eq!(pa.sm_lid, pa.lid, "the SM is on guest a");
    assert_eq!(pb.sm_lid, pa.lid);
    let _ = &n.fabric;
    // Guest b's SA client asks our SA for the path to guest a.
    let path = sa_query(&mut n, false, |core, sa, dev| {
        let (sgid, slid) = {
            let c = core.device(dev).unwrap().port_cache(1).unwrap();
            (c.get_gid(0).unwrap(), c.lid)
        };
        let rec = ib_core::sa_query::PathRecord {
            sgid,
            slid,
            dlid: pa.lid,
            pkey: 0xffff,
            numb_path: 1,
            reversible: true,
            ..Default::default()
        };
        use ib_core::sa_query::path_comp as pc;
        let mask = pc::SGID | pc::SLID | pc::DLID | pc::PKEY | pc::NUMB_PATH | pc::REVERSIBLE;
        ib_core::sa_query::path_rec_get(core, sa, dev, 1, &rec, mask, Duration::from_secs(5))
    });
    let p = &path.path_records().unwrap()[0];
    eprintln!("path b -> a: {p:?}");
    assert_eq!((p.slid, p.dlid), (pb.lid, pa.lid));
    assert_eq!((p.mtu_selector, p.mtu), (2, 5), "exactly 4096");
    // 4x FDR, rated 56 Gb/s as OpenSM rates it.
    assert_eq!((p.rate_selector, p.rate), (2, 12), "exactly 56 Gb/s");
    assert!(p.reversible);
    // Every NodeRecord: three records of 112 bytes, two RMPP segments.
    let nodes = sa_query(&mut n, false, |core, sa, dev| {
        ib_core::sa_query::node_rec_get_table(
            core,
            sa,
            dev,
            1,
            &Default::default(),
            0,
            Duration::from_secs(5),
        )
    });
    let recs = nodes.node_records().unwrap();
    assert_eq!(recs.len(), 3, "{recs:?}");
    // Guest a's own SA client asks the SA on its own port (loopback).
    let p = sa_query(&mut n, true, |core, sa, dev| {
        ib_core::sa_query::node_rec_get_table(
            core,
            sa,
            dev,
            1,
            &Default::default(),
            0,
            Duration::from_secs(5),
        )
    });
    assert_eq!(p.node_records().unwrap().len(), 3);
    let st = ib_sm::status(&mut n.a.core, n.sm, n.a.dev).unwrap();
    eprintln!("{:?}", st.sa);
    assert!(st.sa.rmpp_transfers >= 2, "{:?}", st.sa);
    let Net { a, b, .. } = n;
    a.teardown();
    b.teardown();
}

/// `n` synchronous guests on `built`'s first `n` HCAs (one fake clock).
fn guests(fabric: &Arc<Mutex<Fabric>>, built: &sim::fabric::Built, n: usize) -> Vec<Guest> {
    let wire = sim::Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    built
        .hcas
        .iter()
        .take(n)
        .map(|h| {
            let hca = sim::SimHca::new_on_ports(
                guest_config(h),
                &wire,
                [Some(h.ports[0]), Some(h.ports[1])],
            );
            guest(hca, &h.name)
        })
        .collect()
}

#[test]
fn kernel_sm_brings_two_guests_back_to_back_to_active() {
    let mut n = net(Topology::back_to_back());
    start(&mut n, SmConfig::default());
    up(&mut n);
    let (pa, pb) = (n.a.port(1), n.b.port(1));
    assert_eq!((pa.lid, pb.lid), (1, 2), "the SM's port first, as OpenSM");
    assert_eq!((pa.sm_lid, pb.sm_lid), (1, 1));
    assert_eq!(pb.subnet_timeout, 18);
    for g in [&n.a, &n.b] {
        let ev = g.events();
        assert!(
            ev.contains(&(EventType::PortActive, 1)),
            "{}: {ev:?}",
            g.name
        );
        assert!(
            ev.contains(&(EventType::ClientReregister, 1)),
            "{}: the first sweep asks clients to re-register: {ev:?}",
            g.name
        );
    }
    let p = sa_query(&mut n, false, |core, sa, dev| {
        let (sgid, slid) = {
            let c = core.device(dev).unwrap().port_cache(1).unwrap();
            (c.get_gid(0).unwrap(), c.lid)
        };
        let rec = ib_core::sa_query::PathRecord {
            sgid,
            slid,
            dlid: 1,
            ..Default::default()
        };
        use ib_core::sa_query::path_comp as pc;
        ib_core::sa_query::path_rec_get(
            core,
            sa,
            dev,
            1,
            &rec,
            pc::SGID | pc::SLID | pc::DLID,
            Duration::from_secs(5),
        )
    });
    let p = &p.path_records().unwrap()[0];
    assert_eq!((p.slid, p.dlid, p.mtu, p.rate), (2, 1, 5, 12));
    // Back to back there is no switch: every periodic sweep is heavy, as
    // OpenSM's; after the first, nothing is set again.
    let before =
        n.b.core
            .mad_counters(n.b.dev, 1)
            .unwrap()
            .process_mad_replies;
    pump_until(
        &mut [&mut n.a, &mut n.b],
        Duration::from_secs(20),
        64,
        |g| {
            let _ = g;
            false
        },
    );
    let st = ib_sm::status(&mut n.a.core, n.sm, n.a.dev).unwrap();
    eprintln!("{}\n{st:?}", sm_log(&mut n));
    assert!(st.stats.heavy_sweeps >= 2, "{st:?}");
    assert_eq!(st.stats.light_sweeps, 0);
    let after =
        n.b.core
            .mad_counters(n.b.dev, 1)
            .unwrap()
            .process_mad_replies;
    assert!(after > before, "guest b answered the later sweeps");
    // NodeInfo, NodeDescription and PortInfo of both nodes, and nothing
    // set: the model's SMA keeps the LocalPhyErrors/OverrunErrors
    // thresholds it was set to (8/8), as the card does (it read them back
    // as 0 once, and every heavy sweep wrote them again).
    assert!(
        st.stats.smps_last_heavy <= 6,
        "a sweep of an unchanged subnet only reads: {st:?}"
    );
    assert!(n.a.active() && n.b.active());
    let Net { a, b, .. } = n;
    a.teardown();
    b.teardown();
}

#[test]
fn kernel_sm_brings_four_guests_on_a_switch_to_active_with_distinct_lids() {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(4).unwrap().build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let mut gs = guests(&fabric, &built, 4);
    let sm = ib_sm::init(&mut gs[0].core);
    let (dev, t0) = (gs[0].dev, gs[0].core.clock().now_ns());
    ib_sm::start(&mut gs[0].core, sm, dev, 1, SmConfig::default()).unwrap();
    let mut refs: Vec<&mut Guest> = gs.iter_mut().collect();
    let ok = pump_until(&mut refs, UP_LIMIT, 64, |g| {
        g.iter_mut().all(|g| g.active())
    });
    drop(refs);
    let st = ib_sm::status(&mut gs[0].core, sm, dev).unwrap();
    let log = ib_sm::log(&mut gs[0].core, sm, dev).unwrap().join("\n");
    assert!(ok, "{log}");
    let lids: std::collections::BTreeSet<u16> = gs.iter_mut().map(|g| g.port(1).lid).collect();
    assert_eq!(lids.len(), 4, "{lids:?}");
    eprintln!(
        "4 guests: SUBNET UP {} us of model time after the start, {} SMPs; ports Active {} us after",
        st.stats.first_up_ns / 1000,
        st.stats.smps_last_heavy,
        (gs[0].core.clock().now_ns() - t0) / 1000
    );
    assert_eq!(st.ports, 5, "4 CAs and the switch");
    for g in gs {
        g.teardown();
    }
}

/// The fabric's embedded SM, already master, and ours started beside it:
/// the priorities decide. A lower kernel SM stands by (and the embedded SM
/// learns of it from the trap 144 guest a's HCA sends when IsSM is set); a
/// higher one stands by only until the embedded SM, told by its trap 144,
/// sweeps, finds it and hands over; stopping ours then hands the subnet
/// back, no port leaving Active.
#[test]
fn the_priorities_decide_between_the_kernel_sm_and_the_embedded_sm() {
    for (embedded, ours) in [(15u8, 0u8), (1, 10)] {
        let mut f = Fabric::new();
        let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
        f.add_sm_on_free_port(sim::fabric::SmConfig {
            priority: embedded,
            polling_interval_ns: 1_000_000_000,
            ..Default::default()
        })
        .unwrap();
        let fabric = Arc::new(Mutex::new(f));
        let (mut a, b) = sync_guests(&fabric, &built);
        let sm = ib_sm::init(&mut a.core);
        let mut n = Net { fabric, a, b, sm };
        up(&mut n);
        let emb_lid = n.fabric.lock().unwrap().sm().unwrap().lid();
        let traps0 = n.fabric.lock().unwrap().sm().unwrap().stats().traps;
        start(
            &mut n,
            SmConfig {
                priority: ours,
                polling_timeout_ms: 1000,
                ..Default::default()
            },
        );
        let sm = n.sm;
        let our_guid =
            n.a.core
                .device(n.a.dev)
                .unwrap()
                .port_cache(1)
                .unwrap()
                .get_gid(0)
                .unwrap()
                .0;
        let our_guid = u64::from_be_bytes(our_guid[8..16].try_into().unwrap());
        let want = if ours > embedded {
            sm_state::MASTER
        } else {
            sm_state::STANDBY
        };
        let fab = n.fabric.clone();
        let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 64, |g| {
            let st = ib_sm::status(&mut g[0].core, sm, g[0].dev);
            let emb = fab
                .lock()
                .unwrap()
                .sm()
                .map(|s| (s.sm_state(), s.remote_sms()));
            st.is_some_and(|s| s.state == want && !s.sweeping)
                && emb.is_some_and(|(state, remote)| {
                    remote.iter().any(|r| r.0 == our_guid)
                        && (ours < embedded || state == sm_state::STANDBY)
                })
        });
        let log = sm_log(&mut n);
        let emb_log = n.fabric.lock().unwrap().sm().unwrap().log().join("\n");
        assert!(
            ok,
            "embedded {embedded}, ours {ours}: ours {want}; log:\n{log}\nembedded:\n{emb_log}"
        );
        // The embedded SM heard of ours by trap 144 (IsSM set on guest
        // a's port by modify_port: the HCA's SMA sends it).
        let traps = n.fabric.lock().unwrap().sm().unwrap().stats().traps;
        assert!(
            traps > traps0,
            "trap 144 reached the embedded SM\n{emb_log}"
        );
        // Polls keep it so; the ports follow the master.
        pump_until(
            &mut [&mut n.a, &mut n.b],
            Duration::from_secs(5),
            64,
            |_| false,
        );
        let st = ib_sm::status(&mut n.a.core, n.sm, n.a.dev).unwrap();
        let log = sm_log(&mut n);
        assert_eq!(st.state, want, "{log}");
        let master_lid = if ours > embedded { st.lid } else { emb_lid };
        if ours < embedded {
            assert_eq!(st.master_lid, emb_lid);
        } else {
            let f = n.fabric.lock().unwrap();
            let e = f.sm().unwrap();
            assert_eq!(e.sm_state(), sim::fabric::sm::sm_state::STANDBY);
            assert_eq!(e.master_guid(), our_guid);
            assert_eq!(e.stats().handovers_sent, 1);
        }
        let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 64, |g| {
            g.iter_mut()
                .all(|g| g.active() && g.port(1).sm_lid == master_lid)
        });
        assert!(ok, "ports Active under the master, LID {master_lid}\n{log}");
        eprintln!("embedded {embedded} / ours {ours}: {log}");
        if ours > embedded {
            // Ours stops: it hands over to the standby embedded SM.
            let (ea, eb) = (n.a.events().len(), n.b.events().len());
            ib_sm::stop(&mut n.a.core, n.sm, n.a.dev, Duration::from_secs(5)).unwrap();
            let fab = n.fabric.clone();
            let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 64, |g| {
                fab.lock()
                    .unwrap()
                    .sm()
                    .is_some_and(|s| s.is_master() && !s.sweeping())
                    && g.iter_mut()
                        .all(|g| g.active() && g.port(1).sm_lid == emb_lid)
            });
            let emb_log = n.fabric.lock().unwrap().sm().unwrap().log().join("\n");
            assert!(ok, "the embedded SM took the subnet back\n{emb_log}");
            assert_eq!(
                n.fabric
                    .lock()
                    .unwrap()
                    .sm()
                    .unwrap()
                    .stats()
                    .handovers_received,
                1,
                "{emb_log}"
            );
            for (g, e0) in [(&n.a, ea), (&n.b, eb)] {
                let ev = g.events()[e0..].to_vec();
                assert!(
                    !ev.contains(&(EventType::PortErr, 1)),
                    "{}: no port left Active: {ev:?}",
                    g.name
                );
            }
        }
        let Net { a, b, .. } = n;
        a.teardown();
        b.teardown();
    }
}

/// A pulled cable and its return: the switch's trap 128 makes our SM sweep
/// heavily at once (not at the 10 s period); the port comes back Active
/// with its LID.
#[test]
fn a_cable_back_is_taken_in_by_the_trap_alone() {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let b_port = built.hcas[1].ports[0];
    let fabric = Arc::new(Mutex::new(f));
    let (mut a, b) = sync_guests(&fabric, &built);
    let sm = ib_sm::init(&mut a.core);
    let mut n = Net { fabric, a, b, sm };
    start(&mut n, SmConfig::default());
    up(&mut n);
    let lid = n.b.port(1).lid;
    let sw_port = n.fabric.lock().unwrap().peer(b_port).unwrap();
    n.fabric.lock().unwrap().unplug(b_port).unwrap();
    let down = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 16, |g| {
        g[1].port(1).state == PortState::Down
    });
    assert!(down);
    let (sm, dev) = (n.sm, n.a.dev);
    let heavy = ib_sm::status(&mut n.a.core, sm, dev)
        .unwrap()
        .stats
        .heavy_sweeps;
    let t0 = n.a.hca.clock().now_ns();
    n.fabric.lock().unwrap().connect(b_port, sw_port).unwrap();
    up(&mut n);
    let took_ms = (n.a.hca.clock().now_ns() - t0) / 1_000_000;
    let st = ib_sm::status(&mut n.a.core, sm, dev).unwrap();
    let log = sm_log(&mut n);
    assert!(
        st.stats.traps >= 1 && st.stats.heavy_sweeps > heavy,
        "{st:?}\n{log}"
    );
    assert!(
        log.contains("Received Generic Notice type:1 num:128"),
        "{log}"
    );
    assert!(
        took_ms < 1000,
        "trap-driven, not the 10 s sweep: {took_ms} ms\n{log}"
    );
    assert_eq!(n.b.port(1).lid, lid, "the same LID");
    let Net { a, b, .. } = n;
    a.teardown();
    b.teardown();
}

/// The IPv4 broadcast group's MGID (ff12:401b:ffff::ffff:ffff), which our
/// SA makes as OpenSM does without a partitions file.
fn bcast_mgid() -> Gid {
    Gid(ib_sm::sa::mcmember_record::IPV4_BCAST_MGID)
}

/// Linux IPoIB's broadcast join through ib_core's multicast client.
fn join_bcast(g: &mut Guest, mc: ib_core::ClientId) -> McastId {
    let port_gid = g
        .core
        .device(g.dev)
        .unwrap()
        .port_cache(1)
        .unwrap()
        .get_gid(0)
        .unwrap();
    let rec = McMemberRecord {
        mgid: bcast_mgid(),
        port_gid,
        pkey: 0xffff,
        join_state: join_state::FULL_MEMBER,
        ..McMemberRecord::default()
    };
    multicast::join(
        &mut g.core,
        mc,
        g.dev,
        1,
        &rec,
        mcmember_comp::IPOIB_BCAST_JOIN,
    )
    .expect("join started")
}

/// A UD QP in RTS with the group's Q_Key, attached to the group, with
/// receives posted into a DMA buffer of its own.
struct McastQp {
    qp: Qp,
    cq: Cq,
    pd: Pd,
    buf: hal::DmaBuf,
}

const SLOT: u64 = 256;

fn mcast_qp(g: &mut Guest, qkey: u32, mlid: u16, recvs: u64) -> McastQp {
    let d = g.core.device_mut(g.dev).unwrap();
    let pd = d.alloc_pd().unwrap();
    let buf = d.provider().dma_pool().alloc_pages(1).unwrap();
    let base = buf.bus_addr().0;
    let mr = d
        .reg_mr(
            pd,
            &MrPages {
                pages: &[base],
                page_shift: 12,
                iova: base,
                length: 4096,
                access: AccessFlags::LOCAL_WRITE,
            },
        )
        .unwrap();
    let (cq, _) = d
        .create_cq(&CqInitAttr {
            cqe: 16,
            comp_vector: 0,
        })
        .unwrap();
    let (qp, _) = d
        .create_qp(
            pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 8,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                sq_sig_type: SigType::AllWr,
                qp_type: QpType::Ud,
                // As IPoIB: the card does not hand the sender its own copy.
                create_flags: QpCreateFlags::BLOCK_MULTICAST_LOOPBACK,
                port_num: 1,
            },
        )
        .unwrap();
    for (a, m) in [
        (
            QpAttr {
                qp_state: QpState::Init,
                port_num: 1,
                pkey_index: 0,
                qkey,
                ..Default::default()
            },
            QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX | QpAttrMask::QKEY,
        ),
        (
            QpAttr {
                qp_state: QpState::Rtr,
                ..Default::default()
            },
            QpAttrMask::STATE,
        ),
        (
            QpAttr {
                qp_state: QpState::Rts,
                sq_psn: 1,
                ..Default::default()
            },
            QpAttrMask::STATE | QpAttrMask::SQ_PSN,
        ),
    ] {
        d.modify_qp(qp, &a, m).expect("UD QP to RTS");
    }
    for i in 0..recvs {
        let sg = [Sge {
            addr: base + i * SLOT,
            length: SLOT as u32,
            lkey: mr.lkey,
        }];
        d.post_recv(
            qp,
            &[RecvWr {
                wr_id: i,
                sg_list: &sg,
            }],
        )
        .unwrap();
    }
    d.attach_mcast(qp, &bcast_mgid(), mlid).expect("attached");
    McastQp { qp, cq, pd, buf }
}

impl McastQp {
    /// A datagram to the group (its MLID, a GRH to its MGID, QPN 0xFFFFFF).
    fn send(&self, g: &mut Guest, mlid: u16, qkey: u32, payload: &[u8]) {
        let d = g.core.device_mut(g.dev).unwrap();
        let ah = d
            .create_ah(
                self.pd,
                &AhAttr {
                    dlid: mlid,
                    port_num: 1,
                    grh: Some(GlobalRoute {
                        dgid: bcast_mgid(),
                        sgid_index: 0,
                        hop_limit: 1,
                        ..GlobalRoute::default()
                    }),
                    ..AhAttr::default()
                },
            )
            .unwrap();
        d.post_send(
            self.qp,
            &[SendWr {
                wr_id: 0x5e,
                opcode: WrOpcode::Send,
                send_flags: SendFlags::INLINE | SendFlags::SIGNALED,
                wr: WrDetail::Ud {
                    ah,
                    remote_qpn: 0xff_ffff,
                    remote_qkey: qkey,
                    pkey_index: 0,
                    port_num: 1,
                },
                inline_data: payload,
                ..SendWr::default()
            }],
        )
        .expect("posted");
    }

    fn completions(&self, g: &mut Guest) -> Vec<Wc> {
        let d = g.core.device_mut(g.dev).unwrap();
        let mut out = Vec::new();
        let mut wc = [Wc::default(); 4];
        while let Ok(n @ 1..) = d.poll_cq(self.cq, &mut wc) {
            out.extend_from_slice(&wc[..n]);
        }
        out
    }

    /// The payload of receive `wc`, past the 40-byte GRH.
    fn payload(&self, wc: &Wc) -> Vec<u8> {
        let mut b = vec![0u8; (wc.byte_len as usize).min(SLOT as usize)];
        self.buf.read_bytes((wc.wr_id * SLOT) as usize, &mut b);
        b.get(40..).unwrap_or_default().to_vec()
    }
}

/// Our SM's multicast routing on the model switch: both guests join the
/// IPv4 broadcast group our SA makes (ib_core's multicast client, as IPoIB
/// does); the SM writes the switch's MFT entry for the group's MLID with
/// both guests' switch ports, and a datagram guest a sends to the group
/// crosses the switch to guest b's attached QP. When b leaves, the SM takes
/// b's port out of the entry, and the next datagram stops at the switch
/// though b's QP is still attached on its card.
#[test]
fn our_sm_programs_the_switch_mft_and_a_multicast_datagram_crosses_it() {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let sw = built.switches[0].1;
    let sw_port = |f: &Fabric, h: &sim::fabric::topology::BuiltHca| -> u8 {
        match f.peer(h.ports[0]).and_then(|p| f.owner(p)) {
            Some(Owner::Switch { port, .. }) => port,
            o => panic!("{}'s port 1 is cabled to the switch, not {o:?}", h.name),
        }
    };
    let (pa, pb) = (sw_port(&f, &built.hcas[0]), sw_port(&f, &built.hcas[1]));
    let fabric = Arc::new(Mutex::new(f));
    let (mut a, b) = sync_guests(&fabric, &built);
    let sm = ib_sm::init(&mut a.core);
    let mut n = Net { fabric, a, b, sm };
    let mc = [
        multicast::init(&mut n.a.core),
        multicast::init(&mut n.b.core),
    ];
    start(&mut n, SmConfig::default());
    up(&mut n);
    let ids = [join_bcast(&mut n.a, mc[0]), join_bcast(&mut n.b, mc[1])];
    let mut recs = [None, None];
    let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 16, |g| {
        for k in 0..2 {
            recs[k] = multicast::status(&mut g[k].core, mc[k], ids[k])
                .ok()
                .filter(|s| s.state == MemberState::Joined)
                .and_then(|s| s.rec);
        }
        recs.iter().all(Option::is_some)
    });
    let log = sm_log(&mut n);
    assert!(ok, "both guests joined: {recs:?}\n{log}");
    let recs = recs.map(Option::unwrap);
    assert_eq!(recs[0].mlid, recs[1].mlid, "one group, one MLID");
    let (mlid, qkey) = (recs[0].mlid, recs[0].qkey);
    assert_eq!(qkey, 0x0b1b, "OpenSM's IPoIB Q_Key");
    assert!((0xc000..0xffff).contains(&mlid), "MLID {mlid:#x}");
    // The SM wrote the switch's MFT: the MLID goes to both guests' ports.
    let fab = n.fabric.clone();
    let mft = move || fab.lock().unwrap().switch(sw).unwrap().mft_ports(mlid);
    let mut both = vec![pa, pb];
    both.sort_unstable();
    let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 16, |_| mft() == both);
    let log = sm_log(&mut n);
    assert!(
        ok,
        "the switch's MFT entry for {mlid:#x}: {:?}, not {both:?}\n{log}",
        mft()
    );
    // A datagram from a to the group crosses the switch to b.
    let qa = mcast_qp(&mut n.a, qkey, mlid, 2);
    let qb = mcast_qp(&mut n.b, qkey, mlid, 2);
    qa.send(&mut n.a, mlid, qkey, b"through our SM's MFT");
    let mut got = Vec::new();
    pump_until(&mut [&mut n.a, &mut n.b], Duration::from_secs(10), 4, |g| {
        got.extend(qb.completions(g[1]));
        !got.is_empty()
    });
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].status, WcStatus::Success, "{:?}", got[0]);
    assert_eq!(qb.payload(&got[0]), b"through our SM's MFT");
    let sent = qa.completions(&mut n.a);
    assert_eq!(sent.len(), 1, "only a's send completion: {sent:?}");
    let delivered = n.b.hca.mcast_stats().delivered;
    assert_eq!(delivered, 1);
    // b leaves: the SM takes its port out of the entry.
    multicast::leave(&mut n.b.core, mc[1], ids[1]).unwrap();
    let only_a = vec![pa];
    let ok = pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 16, |_| mft() == only_a);
    let log = sm_log(&mut n);
    assert!(ok, "after b's leave: {:?}\n{log}", mft());
    // The next datagram stops at the switch: b's card, its QP still
    // attached, sees nothing.
    qa.send(&mut n.a, mlid, qkey, b"not past the switch");
    pump_until(
        &mut [&mut n.a, &mut n.b],
        Duration::from_secs(2),
        16,
        |_| false,
    );
    let sent = qa.completions(&mut n.a);
    assert!(
        sent.len() == 1 && sent[0].status == WcStatus::Success,
        "the send completed: {sent:?}"
    );
    let got = qb.completions(&mut n.b);
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(n.b.hca.mcast_stats().delivered, delivered);
    assert_eq!(n.b.hca.mcast_stats().not_attached, 0);
    // The buffers go back to the DMA pools before the devices do.
    drop((qa, qb));
    let Net { a, b, .. } = n;
    a.teardown();
    b.teardown();
}
