//! RDMA over Ethernet (RoCE v1) between driver-run HCAs on the fabric's Ethernet switch.
//!
//! Two model HCAs whose port 1 is an Ethernet port cabled to the model's
//! learning Ethernet switch (the `--nodes 2 --link-layer eth` topology),
//! each with the real mlx4_core + mlx4_ib + ib_core. Nothing brings a port
//! up by hand: mlx4_ib writes the Ethernet ports' GID tables (fe80::EUI-64
//! of the MAC, then `::ffff:a.b.c.d` per IPv4 address) and, with no mlx4_en
//! here, opens them (`roce_open_port`); the link comes up. Paths are made locally from the GIDs (no SA on Ethernet),
//! address handles carry the GRH and the destination MAC. Shown here: the
//! port and GID table as ibv_devinfo/show_gids read them, RC RDMA WRITE,
//! READ and SEND and UD SEND with data checked, an IB CM connection over
//! RoCE (QP1 with the Ethernet + GRH header), one card running InfiniBand
//! on port 1 (under the fabric's SM) and RoCE on port 2 at the same time,
//! and an address handle without a GRH refused.

use tests::subnet_common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ib_core::cm::{self, CmEvent, CmRepParam, CmReqParam};
use ib_core::sa_query;
use ib_core::verbs::{
    AccessFlags, AhAttr, Cq, EventType, Gid, GlobalRoute, LinkLayer, Mr, Mtu, Pd, PortState, Qp,
    QpAttr, QpAttrMask as M, QpState, QpType, RecvWr, SendFlags, SendWr, Sge, Wc, WcFlags,
    WcOpcode, WcStatus, WrDetail, WrOpcode,
};
use mlx4_ib::roce;
use sim::fabric::{Fabric, LinkLayer as SimLl, SmConfig, Topology};
use sim::{PortType, SimHca};
use subnet_common::*;

/// Wall time for anything to happen (debug build, shared machine).
const LIMIT: Duration = Duration::from_secs(30);
const BUF: usize = 64 * 1024;
const IOVA: u64 = 0x5000_0000;
const QKEY: u32 = 0x1111_2222;

struct Rig {
    _fabric: Arc<Mutex<Fabric>>,
    a: Guest,
    b: Guest,
}

/// Two guests on `--nodes 2 --link-layer ll` with ports of `types`, the
/// fabric's SM on the InfiniBand switch if there is one.
fn rig(ll: [SimLl; 2], types: [PortType; 2]) -> Rig {
    let mut f = Fabric::new();
    let built = Topology::for_nodes_with(2, ll)
        .unwrap()
        .build(&mut f)
        .unwrap();
    if ll.contains(&SimLl::Ib) {
        f.add_sm_on_free_port(SmConfig::default())
            .expect("SM on the InfiniBand switch");
    }
    let fabric = Arc::new(Mutex::new(f));
    let wire = sim::Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    let mut g = built.hcas.iter().take(2).map(|h| {
        let cfg = sim::SimConfig {
            port_types: types,
            ..guest_config(h)
        };
        let hca = SimHca::new_on_ports(cfg, &wire, [Some(h.ports[0]), Some(h.ports[1])]);
        guest(hca, &h.name)
    });
    let mut a = g.next().expect("node0");
    let mut b = g.next().expect("node1");
    // No mlx4_en here: mlx4_ib opens the Ethernet ports itself.
    for g in [&mut a, &mut b] {
        for (i, t) in types.iter().enumerate() {
            if *t == PortType::Eth && ll[i] == SimLl::Eth {
                g.ib().roce_open_port(i as u8 + 1).expect("INIT_PORT");
            }
        }
    }
    Rig {
        _fabric: fabric,
        a,
        b,
    }
}

impl Rig {
    /// Pumps both guests until `f` says something (or fails after LIMIT).
    fn until<T>(&mut self, what: &str, mut f: impl FnMut(&mut Rig) -> Option<T>) -> T {
        let t = Instant::now();
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            assert!(t.elapsed() < LIMIT, "{what}: not within {LIMIT:?}");
            let w = self.a.core.poll() + self.b.core.poll();
            if w == 0 {
                self.a.core.clock().delay(IDLE_STEP);
            } else {
                self.a.core.clock().relax();
            }
        }
    }

    fn g(&mut self, on_a: bool) -> &mut Guest {
        if on_a { &mut self.a } else { &mut self.b }
    }

    /// Waits until `port` of both guests is Active in ib_core's cache.
    fn wait_active(&mut self, port: u8) {
        self.until("both ports Active", |r| {
            let ok = |g: &Guest| {
                g.core
                    .device(g.dev)
                    .and_then(|d| d.port_cache(port).ok())
                    .is_some_and(|c| c.state == Some(PortState::Active))
            };
            (ok(&r.a) && ok(&r.b)).then_some(())
        });
    }

    /// The next completion on `cq` of guest A or B, which must be a success.
    fn wc_ok(&mut self, on_a: bool, cq: Cq, what: &str) -> Wc {
        let w = self.wc(on_a, cq, what);
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
        w
    }

    /// Frees A's `ends_a` and B's `ends_b`, then tears both guests down.
    fn close(mut self, ends_a: Vec<End>, ends_b: Vec<End>) {
        for e in ends_a {
            free(&mut self.a, e);
        }
        for e in ends_b {
            free(&mut self.b, e);
        }
        self.a.teardown();
        self.b.teardown();
    }

    /// The next completion on `e.cq` of guest A or B.
    fn wc(&mut self, on_a: bool, cq: Cq, what: &str) -> Wc {
        self.until(what, |r| {
            let g = r.g(on_a);
            let mut wc = [Wc::default(); 1];
            let n = g.core.device_mut(g.dev)?.poll_cq(cq, &mut wc).ok()?;
            (n == 1).then_some(wc[0])
        })
    }
}

fn gid0(g: &Guest, port: u8) -> Gid {
    g.core
        .device(g.dev)
        .unwrap()
        .get_cached_gid(port, 0)
        .unwrap()
}

/// One end of a connection: PD, CQ, QP of `t` on `port`, a 64 KiB buffer
/// registered with every remote right.
struct End {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    buf: hal::DmaBuf,
    port: u8,
}

fn end(g: &mut Guest, port: u8, t: QpType) -> End {
    let pool = g.hca.dma_pool();
    let d = g.core.device_mut(g.dev).expect("device");
    let pd = d.alloc_pd().expect("PD");
    let (cq, qp) = cq_and_qp(d, pd, t, port, 64, 32, 8);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (buf, mr) = reg_buf(&pool, d, pd, BUF, IOVA, access);
    End {
        pd,
        cq,
        qp,
        mr,
        buf,
        port,
    }
}

fn free(g: &mut Guest, e: End) {
    let d = g.core.device_mut(g.dev).expect("device");
    d.destroy_qp(e.qp).expect("destroy QP");
    d.dereg_mr(e.mr).expect("dereg MR");
    d.destroy_cq(e.cq).expect("destroy CQ");
    d.dealloc_pd(e.pd).expect("dealloc PD");
}

/// The path to `dgid` as every SA client asks for it (made locally on an
/// Ethernet port) and the address it gives.
fn path_ah(g: &mut Guest, port: u8, dgid: Gid) -> (sa_query::PathRecord, AhAttr) {
    let p = sa_query::path_to_gid(&mut g.core, g.sa, g.dev, port, dgid, Duration::from_secs(2))
        .expect("a path");
    let ah = sa_query::init_ah_from_path(g.core.device(g.dev).unwrap(), port, &p).expect("AH");
    (p, ah)
}

/// INIT, RTR (to `dqpn` over `ah`, path MTU `mtu`), RTS of an RC QP.
fn rc_up(g: &mut Guest, e: &End, ah: AhAttr, mtu: Mtu, dqpn: u32) {
    let d = g.core.device_mut(g.dev).expect("device");
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: e.port,
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..Default::default()
    };
    d.modify_qp(
        e.qp,
        &a,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .expect("INIT");
    let a = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: mtu,
        dest_qp_num: dqpn,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        ah_attr: ah,
        ..Default::default()
    };
    d.modify_qp(e.qp, &a, rc_rtr_mask()).expect("RTR");
    let a = QpAttr {
        qp_state: QpState::Rts,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..Default::default()
    };
    d.modify_qp(e.qp, &a, rc_rts_mask()).expect("RTS");
}

/// A UD QP through RTS with Q_Key `QKEY`.
fn ud_up(g: &mut Guest, e: &End) {
    let d = g.core.device_mut(g.dev).expect("device");
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: e.port,
        qkey: QKEY,
        ..Default::default()
    };
    d.modify_qp(e.qp, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .expect("INIT");
    let a = QpAttr {
        qp_state: QpState::Rtr,
        ..Default::default()
    };
    d.modify_qp(e.qp, &a, M::STATE).expect("RTR");
    let a = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    d.modify_qp(e.qp, &a, M::STATE | M::SQ_PSN).expect("RTS");
}

/// `len` bytes at `off` of `e`'s buffer.
fn sge(e: &End, off: u64, len: u32) -> [Sge; 1] {
    [Sge {
        addr: IOVA + off,
        length: len,
        lkey: e.mr.lkey,
    }]
}

fn post_recv(g: &mut Guest, e: &End, off: u64, len: u32) {
    let sge = sge(e, off, len);
    g.core
        .device_mut(g.dev)
        .unwrap()
        .post_recv(
            e.qp,
            &[RecvWr {
                wr_id: off,
                sg_list: &sge,
            }],
        )
        .expect("post receive");
}

fn post(g: &mut Guest, e: &End, op: WrOpcode, off: u64, len: u32, wr: WrDetail) {
    let sge = sge(e, off, len);
    g.core
        .device_mut(g.dev)
        .unwrap()
        .post_send(
            e.qp,
            &[SendWr {
                wr_id: off,
                sg_list: &sge,
                opcode: op,
                send_flags: SendFlags::SIGNALED,
                wr,
                ..Default::default()
            }],
        )
        .expect("post send");
}

/// An RDMA WRITE or READ of `len` bytes at `off` of `e`'s buffer, to or from
/// `remote_off` of the peer's buffer under `rkey`.
#[allow(clippy::too_many_arguments)]
fn post_rdma(g: &mut Guest, e: &End, op: WrOpcode, off: u64, len: u32, remote_off: u64, rkey: u32) {
    let wr = WrDetail::Rdma {
        remote_addr: IOVA + remote_off,
        rkey,
    };
    post(g, e, op, off, len, wr);
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn read(e: &End, off: usize, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    e.buf.read_bytes(off, &mut v);
    v
}

/// An RC pair between A's and B's `port` over the locally made paths.
fn rc_pair(r: &mut Rig, port: u8) -> (End, End) {
    let (ga, gb) = (gid0(&r.a, port), gid0(&r.b, port));
    let ea = end(&mut r.a, port, QpType::Rc);
    let eb = end(&mut r.b, port, QpType::Rc);
    let (pa, aha) = path_ah(&mut r.a, port, gb);
    let (pb, ahb) = path_ah(&mut r.b, port, ga);
    let mtu = Mtu::from_raw(pa.mtu).expect("path MTU");
    assert_eq!(pa.mtu, pb.mtu);
    rc_up(&mut r.a, &ea, aha, mtu, eb.qp.qp_num);
    rc_up(&mut r.b, &eb, ahb, mtu, ea.qp.qp_num);
    (ea, eb)
}

fn eth_rig() -> Rig {
    let mut r = rig([SimLl::Eth, SimLl::Eth], [PortType::Eth, PortType::Eth]);
    r.wait_active(1);
    r
}

#[test]
fn an_ethernet_port_shows_link_layer_ethernet_and_gids_from_its_mac_and_addresses() {
    let mut r = eth_rig();
    let d = r.a.core.device_mut(r.a.dev).unwrap();
    assert_eq!(d.port_link_layer(1).unwrap(), LinkLayer::Ethernet);
    let pa = d.query_port(1).unwrap();
    assert_eq!((pa.state, pa.lid, pa.sm_lid), (PortState::Active, 0, 0));
    assert_eq!(pa.active_mtu, Mtu::Mtu1024, "netdev MTU 1500");
    let mac = r.a.hca.eth_port(1).unwrap().mac;
    let ll = roce::iboe_mac_vlan_to_ll(&mac, None);
    assert_eq!(gid0(&r.a, 1).0, ll, "fe80::EUI-64 of the port's MAC");
    // The source MAC is registered (MAC table index 0 of a fresh port).
    assert_eq!(r.a.ib().roce_port(1).unwrap().smac_index, Some(0));
    assert_eq!(
        r.a.ib()
            .core()
            .find_cached_mac(1, mac.iter().fold(0, |a, &b| (a << 8) | u64::from(b))),
        Some(0)
    );
    assert_eq!(r.a.ib().query_gid(1, 1).unwrap(), [0; 16]);
    // The interface gets two addresses: the table follows, ib_core is told.
    r.a.ib()
        .set_roce_ipv4_addrs(1, &[[10, 0, 0, 1], [192, 168, 7, 1]])
        .unwrap();
    r.until("ib_core's cache holds the IPv4 GIDs", |r| {
        let d = r.a.core.device(r.a.dev)?;
        let g = d.get_cached_gid(1, 2).ok()?;
        (g.0 == roce::ipv4_gid([192, 168, 7, 1])).then_some(())
    });
    assert!(r.a.events().contains(&(EventType::GidChange, 1)));
    assert_eq!(
        r.a.ib().query_gid(1, 1).unwrap(),
        roce::ipv4_gid([10, 0, 0, 1])
    );
    // One address goes: the table is written again without it.
    r.a.ib()
        .set_roce_ipv4_addrs(1, &[[192, 168, 7, 1]])
        .unwrap();
    assert_eq!(
        r.a.ib().query_gid(1, 1).unwrap(),
        roce::ipv4_gid([192, 168, 7, 1])
    );
    assert_eq!(r.a.ib().query_gid(1, 2).unwrap(), [0; 16]);
    assert_eq!(r.a.ib().roce_port(1).unwrap().gid_table_writes, 3);
    r.close(vec![], vec![]);
}

/// A GID table write the firmware refuses is an error to the caller and is
/// tried again at the next sync of the interface, though nothing changed
/// in between: the card ends up with the addresses' GIDs.
#[test]
fn a_refused_gid_table_write_is_tried_again_at_the_next_sync() {
    let mut r = eth_rig();
    let ip = [10, 0, 0, 1];
    let card_gids = |r: &Rig| r.a.hca.eth_port(1).expect("Ethernet port").gids;
    assert!(!card_gids(&r).contains(&roce::ipv4_gid(ip)));
    r.a.hca.faults().set(
        sim::Opcode::SET_PORT,
        sim::OpcodeFault::status(sim::Status::BAD_PARAM).times(1),
    );
    let e = r.a.ib().sync_roce_netdev(1, None, &[ip], &[]);
    assert!(
        e.is_err(),
        "a refused SET_PORT GID_TABLE is an error: {e:?}"
    );
    assert!(!card_gids(&r).contains(&roce::ipv4_gid(ip)));
    r.a.ib().sync_roce_netdev(1, None, &[ip], &[]).unwrap();
    assert_eq!(card_gids(&r)[1], roce::ipv4_gid(ip), "written at the retry");
    assert_eq!(r.a.ib().query_gid(1, 1).unwrap(), roce::ipv4_gid(ip));
    r.close(vec![], vec![]);
}

#[test]
fn rc_rdma_write_and_read_over_roce_with_data_checked() {
    let mut r = eth_rig();
    let (ea, eb) = rc_pair(&mut r, 1);
    // RDMA WRITE of 20 000 bytes (20 packets at 1024).
    let data = pattern(3, 20_000);
    ea.buf.write_bytes(0, &data);
    let rkey = eb.mr.rkey;
    post_rdma(&mut r.a, &ea, WrOpcode::RdmaWrite, 0, 20_000, 100, rkey);
    r.wc_ok(true, ea.cq, "WRITE completion");
    assert_eq!(read(&eb, 100, 20_000), data);
    // RDMA READ of 12 000 bytes back from B.
    let remote = pattern(77, 12_000);
    eb.buf.write_bytes(30_000, &remote);
    post_rdma(
        &mut r.a,
        &ea,
        WrOpcode::RdmaRead,
        40_000,
        12_000,
        30_000,
        rkey,
    );
    let w = r.wc(true, ea.cq, "READ completion");
    assert_eq!(
        (w.status, w.opcode, w.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 12_000),
        "{w:?}"
    );
    assert_eq!(read(&ea, 40_000, 12_000), remote);
    // It went as RoCE over the Ethernet switch, nothing dropped as not ours.
    let ca = r.a.hca.eth_counters(1).unwrap();
    let cb = r.b.hca.eth_counters(1).unwrap();
    assert!(ca.roce_tx >= 20 && cb.roce_rx >= 20, "{ca:?} {cb:?}");
    assert_eq!((ca.roce_not_ours, cb.roce_not_ours), (0, 0));
    r.close(vec![ea], vec![eb]);
}

#[test]
fn rc_send_over_roce_with_data_checked() {
    let mut r = eth_rig();
    let (ea, eb) = rc_pair(&mut r, 1);
    let data = pattern(9, 3000);
    ea.buf.write_bytes(0, &data);
    post_recv(&mut r.b, &eb, 8192, 3000);
    post(&mut r.a, &ea, WrOpcode::Send, 0, 3000, WrDetail::None);
    r.wc_ok(true, ea.cq, "SEND completion");
    let w = r.wc(false, eb.cq, "receive completion");
    assert_eq!(
        (w.status, w.opcode, w.byte_len),
        (WcStatus::Success, WcOpcode::Recv, 3000),
        "{w:?}"
    );
    assert_eq!(read(&eb, 8192, 3000), data);
    r.close(vec![ea], vec![eb]);
}

/// A 16-byte SEND into a 16-byte receive (perftest's end-of-size message
/// is such a one): an RC receive gets the payload alone, though every
/// RoCE packet carries a GRH (a model that scattered the 40-byte GRH into
/// it would fail the receive with REM_OP_ERR).
#[test]
fn rc_send_shorter_than_a_grh_into_an_exact_receive() {
    let mut r = eth_rig();
    let (ea, eb) = rc_pair(&mut r, 1);
    ea.buf.write_bytes(100, b"sixteen bytes!!!");
    post_recv(&mut r.b, &eb, 16_384, 16);
    post(&mut r.a, &ea, WrOpcode::Send, 100, 16, WrDetail::None);
    r.wc_ok(true, ea.cq, "small SEND completion");
    let w = r.wc(false, eb.cq, "small receive");
    assert_eq!((w.status, w.byte_len), (WcStatus::Success, 16), "{w:?}");
    assert_eq!(read(&eb, 16_384, 16), b"sixteen bytes!!!");
    r.close(vec![ea], vec![eb]);
}

#[test]
fn ud_send_over_roce_lands_after_the_grh() {
    let mut r = eth_rig();
    let gb = gid0(&r.b, 1);
    let ga = gid0(&r.a, 1);
    let ea = end(&mut r.a, 1, QpType::Ud);
    let eb = end(&mut r.b, 1, QpType::Ud);
    ud_up(&mut r.a, &ea);
    ud_up(&mut r.b, &eb);
    let (_, ah_attr) = path_ah(&mut r.a, 1, gb);
    let d = r.a.core.device_mut(r.a.dev).unwrap();
    let ah = d.create_ah(ea.pd, &ah_attr).expect("RoCE AH");
    let data = pattern(42, 900);
    ea.buf.write_bytes(0, &data);
    post_recv(&mut r.b, &eb, 0, 2048);
    post(
        &mut r.a,
        &ea,
        WrOpcode::Send,
        0,
        900,
        WrDetail::Ud {
            ah,
            remote_qpn: eb.qp.qp_num,
            remote_qkey: QKEY,
            pkey_index: 0,
            port_num: 1,
        },
    );
    r.wc_ok(true, ea.cq, "UD send completion");
    let w = r.wc(false, eb.cq, "UD receive");
    assert_eq!(
        (w.status, w.byte_len),
        (WcStatus::Success, 40 + 900),
        "{w:?}"
    );
    assert!(w.wc_flags.contains(WcFlags::GRH));
    assert_eq!(w.src_qp, ea.qp.qp_num);
    let grh = read(&eb, 0, 40);
    assert_eq!(&grh[8..24], &ga.0, "SGID");
    assert_eq!(&grh[24..40], &gb.0, "DGID");
    assert_eq!(read(&eb, 40, 900), data);
    let d = r.a.core.device_mut(r.a.dev).unwrap();
    d.destroy_ah(ah).unwrap();
    r.close(vec![ea], vec![eb]);
}

#[test]
fn an_address_handle_without_a_grh_is_refused_on_an_ethernet_port() {
    let mut r = eth_rig();
    let e = end(&mut r.a, 1, QpType::Ud);
    let d = r.a.core.device_mut(r.a.dev).unwrap();
    let err = d
        .create_ah(
            e.pd,
            &AhAttr {
                dlid: 5,
                port_num: 1,
                ..Default::default()
            },
        )
        .expect_err("no GRH on RoCE");
    assert!(err.to_string().contains("GRH"), "{err}");
    // A global DGID that is neither link-local nor IPv4-mapped has no MAC.
    let mut far = [0u8; 16];
    far[0] = 0x20;
    let err = d
        .create_ah(
            e.pd,
            &AhAttr {
                port_num: 1,
                grh: Some(GlobalRoute {
                    dgid: Gid(far),
                    hop_limit: 1,
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .expect_err("no MAC for that GID");
    assert!(err.to_string().contains("GID"), "{err}");
    // An IPv4-mapped DGID needs the interface's ARP entry first.
    let g = Gid(roce::ipv4_gid([10, 0, 0, 2]));
    let mk = |d: &mut ib_core::Device, pd| {
        d.create_ah(
            pd,
            &AhAttr {
                port_num: 1,
                grh: Some(GlobalRoute {
                    dgid: g,
                    hop_limit: 1,
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
    };
    assert!(mk(d, e.pd).is_err(), "no ARP entry yet");
    let peer = r.b.hca.eth_port(1).unwrap().mac;
    r.a.ib()
        .set_roce_neigh(1, [10, 0, 0, 2], Some(peer))
        .unwrap();
    let d = r.a.core.device_mut(r.a.dev).unwrap();
    let ah = mk(d, e.pd).expect("resolved by the neighbour entry");
    d.destroy_ah(ah).unwrap();
    // An RC path without a GRH is refused too (mlx4_set_path).
    let rc = end(&mut r.a, 1, QpType::Rc);
    let d = r.a.core.device_mut(r.a.dev).unwrap();
    d.modify_qp(
        rc.qp,
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            ..Default::default()
        },
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    let err = d
        .modify_qp(
            rc.qp,
            &QpAttr {
                qp_state: QpState::Rtr,
                path_mtu: Mtu::Mtu1024,
                dest_qp_num: 0x99,
                ah_attr: AhAttr {
                    dlid: 3,
                    port_num: 1,
                    ..Default::default()
                },
                ..Default::default()
            },
            rc_rtr_mask(),
        )
        .expect_err("an RC path without a GRH");
    assert!(err.to_string().contains("GRH"), "{err}");
    r.close(vec![rc, e], vec![]);
}

#[test]
fn a_cm_connection_over_roce() {
    let mut r = eth_rig();
    const SID: u64 = 0x0000_0000_0001_0c3f;
    let cma = cm::init(&mut r.a.core);
    let cmb = cm::init(&mut r.b.core);
    let gb = gid0(&r.b, 1);
    let ea = end(&mut r.a, 1, QpType::Rc);
    let eb = end(&mut r.b, 1, QpType::Rc);
    let listen = cm::listen(&mut r.b.core, cmb, r.b.dev, SID).unwrap();
    // The path every CM user asks the SA for, made locally.
    let (mut path, _) = path_ah(&mut r.a, 1, gb);
    path.packet_life_time = 14;
    let id_a = cm::send_req(
        &mut r.a.core,
        cma,
        r.a.dev,
        1,
        &CmReqParam::new(path, SID, ea.qp),
    )
    .unwrap();
    let id_b = r.until("B's REQ", |r| {
        match cm::get_event(&mut r.b.core, cmb, listen)? {
            CmEvent::ReqReceived { id, .. } => Some(id),
            e => panic!("expected a REQ: {e:?}"),
        }
    });
    cm::send_rep(&mut r.b.core, cmb, id_b, &CmRepParam::new(eb.qp)).unwrap();
    let ev = r.until("A established", |r| cm::get_event(&mut r.a.core, cma, id_a));
    assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");
    let ev = r.until("B established", |r| cm::get_event(&mut r.b.core, cmb, id_b));
    assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");
    // The connected QPs carry an RDMA WRITE.
    let data = pattern(5, 5000);
    ea.buf.write_bytes(0, &data);
    let rkey = eb.mr.rkey;
    post_rdma(&mut r.a, &ea, WrOpcode::RdmaWrite, 0, 5000, 16, rkey);
    r.wc_ok(true, ea.cq, "WRITE over the CM's connection");
    assert_eq!(read(&eb, 16, 5000), data);
    r.close(vec![ea], vec![eb]);
}

#[test]
fn infiniband_on_port_1_and_roce_on_port_2_at_the_same_time() {
    let mut r = rig([SimLl::Ib, SimLl::Eth], [PortType::Ib, PortType::Eth]);
    r.wait_active(1);
    r.wait_active(2);
    assert_eq!(
        r.a.core
            .device(r.a.dev)
            .unwrap()
            .port_link_layer(1)
            .unwrap(),
        LinkLayer::Infiniband
    );
    assert_eq!(
        r.a.core
            .device(r.a.dev)
            .unwrap()
            .port_link_layer(2)
            .unwrap(),
        LinkLayer::Ethernet
    );
    // InfiniBand: an RC pair between the LIDs the SM gave (path by LID).
    let lb = r.b.port(1).lid;
    let la = r.a.port(1).lid;
    assert!(la != 0 && lb != 0, "LIDs from the SM");
    let ia = end(&mut r.a, 1, QpType::Rc);
    let ib = end(&mut r.b, 1, QpType::Rc);
    let ah = |dlid| AhAttr {
        dlid,
        port_num: 1,
        ..Default::default()
    };
    rc_up(&mut r.a, &ia, ah(lb), Mtu::Mtu2048, ib.qp.qp_num);
    rc_up(&mut r.b, &ib, ah(la), Mtu::Mtu2048, ia.qp.qp_num);
    // RoCE on port 2.
    let (ea, eb) = rc_pair(&mut r, 2);
    let ib_data = pattern(1, 16_000);
    let roce_data = pattern(2, 16_000);
    ia.buf.write_bytes(0, &ib_data);
    ea.buf.write_bytes(0, &roce_data);
    // Both posted before either completes: eight WRITEs each, interleaved.
    for k in 0..8u64 {
        let (ibk, rk) = (ib.mr.rkey, eb.mr.rkey);
        post_rdma(
            &mut r.a,
            &ia,
            WrOpcode::RdmaWrite,
            0,
            16_000,
            0x8000 * (k % 2),
            ibk,
        );
        post_rdma(
            &mut r.a,
            &ea,
            WrOpcode::RdmaWrite,
            0,
            16_000,
            0x8000 * (k % 2),
            rk,
        );
    }
    for _ in 0..8 {
        r.wc_ok(true, ia.cq, "IB WRITE");
        r.wc_ok(true, ea.cq, "RoCE WRITE");
    }
    assert_eq!(read(&ib, 0, 16_000), ib_data);
    assert_eq!(read(&ib, 0x8000, 16_000), ib_data);
    assert_eq!(read(&eb, 0, 16_000), roce_data);
    assert_eq!(read(&eb, 0x8000, 16_000), roce_data);
    // RoCE went over port 2's Ethernet, none of it over port 1.
    assert!(r.a.hca.eth_counters(2).unwrap().roce_tx >= 8 * 16);
    assert!(r.a.hca.eth_counters(1).is_none_or(|c| c.roce_tx == 0));
    free(&mut r.a, ia);
    free(&mut r.b, ib);
    r.close(vec![ea], vec![eb]);
}

/// Output of a tool's console, readable from the other thread.
#[derive(Clone, Default)]
struct Out(Arc<Mutex<String>>);

impl std::fmt::Write for Out {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.lock().unwrap().push_str(s);
        Ok(())
    }
}

impl Out {
    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }
}

fn run_tool(
    g: &mut Guest,
    cm: ib_core::ClientId,
    tool: &str,
    args: &[&str],
    out: &mut Out,
) -> Result<(), String> {
    let t = ib_tools::perftest::Tool::from_name(tool).expect("a perftest tool");
    let p = ib_tools::perftest::Params::parse(t, args).map_err(|e| e.to_string())?;
    let mut no = || false;
    let mut env = ib_tools::perftest::run::Env {
        core: &mut g.core,
        sa: g.sa,
        cm,
        dev: g.dev,
        dev_name: "mlx4_0",
        interrupted: &mut no,
        ip: None,
    };
    ib_tools::perftest::run::run(&mut env, &p, out)
}

/// Our perftest tools over RoCE: the server waits on its Ethernet port, the
/// client names it by GID (as show_gids prints it) with `-g 0`; the path is
/// made locally, the CM connects over QP1, and `--check` verifies every
/// byte; the banner says Ethernet and the GIDs. The tools' end-of-size
/// SEND lands in a receive of exactly its size, which the model's bug
/// breaks; passes with branch simfix's responder.
#[test]
fn perftest_tools_over_roce_with_the_peer_given_by_gid() {
    let r = eth_rig();
    let Rig {
        _fabric: fabric,
        mut a,
        mut b,
    } = r;
    let cma = cm::init(&mut a.core);
    let cmb = cm::init(&mut b.core);
    let gb = gid0(&b, 1).0;
    let gid: String = gb
        .chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":");
    for (tool, args) in [
        ("ib_write_bw", &["-s", "65536", "-n", "20", "--check"][..]),
        ("ib_read_lat", &["-s", "64", "-n", "20", "--check"][..]),
        ("ib_send_bw", &["-s", "4096", "-n", "20", "--check"][..]),
    ] {
        let sout = Out::default();
        let mut s2 = sout.clone();
        let sargs: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let h = std::thread::spawn(move || {
            let a: Vec<&str> = sargs.iter().map(String::as_str).collect();
            let res = run_tool(&mut b, cmb, tool, &a, &mut s2);
            (b, res)
        });
        let t = Instant::now();
        while !sout.text().contains("Waiting for") && t.elapsed() < LIMIT {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut cargs: Vec<&str> = args.to_vec();
        cargs.extend(["-g", "0", gid.as_str()]);
        let mut cout = Out::default();
        let c = run_tool(&mut a, cma, tool, &cargs, &mut cout);
        let (bb, s) = h.join().expect("server thread");
        b = bb;
        assert!(
            c.is_ok() && s.is_ok(),
            "{tool}: {c:?} {s:?}\n{}\n{}",
            cout.text(),
            sout.text()
        );
        let text = cout.text();
        assert!(text.contains("Link type       : Ethernet"), "{text}");
        assert!(text.contains("GID index       : 0"), "{text}");
        assert!(text.contains(" GID: 254:128:00:00"), "{text}");
    }
    // An Ethernet port has no LIDs: a LID peer is refused with a sentence.
    let mut o = Out::default();
    let e = run_tool(&mut a, cma, "ib_write_bw", &["3"], &mut o).unwrap_err();
    assert!(e.contains("give the peer by its GID"), "{e}");
    drop(fabric);
    a.teardown();
    b.teardown();
}

/// rmem over RoCE: a memory node serving on its Ethernet port, a client
/// naming it by GID (from its GID index 0): it connects through the CM on
/// a locally made path, allocates, writes and reads back. Its RPCs are
/// SENDs into receives the model's bug overfills with the GRH (the HELLO
/// never answers, the client retries until the watchdog); passes with
/// branch simfix's responder.
#[test]
fn rmem_over_roce_with_the_memory_node_given_by_gid() {
    use rmem::client::{Client, ClientConfig, Dest};
    use rmem::server::{Server, ServerConfig};
    use std::sync::atomic::{AtomicBool, Ordering};
    let Rig {
        _fabric: fabric,
        mut a,
        b,
    } = eth_rig();
    let gb = gid0(&b, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let h = std::thread::spawn(move || {
        let mut b = b;
        let cm = cm::init(&mut b.core);
        let mut srv = Server::export(&mut b.core, cm, b.dev, 256 * 1024, ServerConfig::default())
            .expect("exported");
        let t = Instant::now();
        while !s2.load(Ordering::Relaxed) && t.elapsed() < LIMIT * 2 {
            b.core.poll();
            srv.poll(&mut b.core).expect("served");
            std::thread::yield_now();
        }
        srv.close(&mut b.core).expect("closed");
        b
    });
    let cma = cm::init(&mut a.core);
    let cfg = ClientConfig {
        connect_timeout: Duration::from_secs(20),
        ..ClientConfig::default()
    };
    let mut c = Client::connect_to(&mut a.core, cma, a.sa, a.dev, Dest::Gid(gb), cfg)
        .expect("connected over RoCE");
    let chunk = c.alloc(&mut a.core, 16 * 1024).expect("alloc");
    let data = pattern(17, 3 * 4096 + 100);
    c.write(&mut a.core, chunk.addr + 7, &data).expect("write");
    let mut back = vec![0u8; data.len()];
    c.read(&mut a.core, chunk.addr + 7, &mut back)
        .expect("read");
    assert_eq!(back, data);
    c.free(&mut a.core, chunk).expect("free");
    c.close(&mut a.core).expect("closed");
    stop.store(true, Ordering::Relaxed);
    let b = h.join().expect("memory node");
    drop(fabric);
    a.teardown();
    b.teardown();
}
