//! The RDMA CM by IP address under the real OpenSM: driver-run HCAs with the whole stack (mlx4_core, mlx4_ib, ib_core with its RDMA CM, ipoib, net) resolve each other's IPv4 addresses by IPoIB ARP, their routes through OpenSM's SA, and connect RC (REQ/REP with the cma header) and UD (SIDR); bad requests are refused as Linux refuses them.
//!
//! Model HCAs on the `--nodes 2` topology under Debian's OpenSM (which makes
//! the IPoIB broadcast group itself), each guest an IP stack whose `ib0` is
//! its ipoib link, addressed 10.0.0.N/24, pumped together with ib_core as the
//! kernel does (the stack's poll, then `cma::net_poll`). Skipped loudly
//! without the packages (`scripts/deps.sh ensure_ib_peers`).

use tests::ip_node::*;
use tests::subnet_common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use ib_core::cm::{self, CmEvent, CmReqParam};
use ib_core::cma::{
    self, CmaHdr, PortSpace, RDMA_UDP_QKEY, RdmaCmEvent, RdmaCmEventType, RdmaCmId, RdmaConnParam,
};
use ib_core::verbs::{
    AccessFlags, Cq, CqInitAttr, Mr, MrPages, Pd, Qp, QpCap, QpCreateFlags, QpInitAttr, QpType,
    RecvWr, SendFlags, SendWr, Sge, SigType, Wc, WcStatus, WrDetail, WrOpcode,
};
use ib_tools::rping::{self, Rping};
use std::task::Poll;
use subnet_common::*;

const UP_LIMIT: Duration = Duration::from_secs(90);
const STEP_LIMIT: Duration = Duration::from_secs(30);

fn run(
    sm: &mut OpenSm,
    nodes: &mut [&mut Node],
    limit: Duration,
    mut done: impl FnMut(&mut [&mut Node]) -> bool,
) -> bool {
    let t = Instant::now();
    let mut idle = 0u32;
    loop {
        let work = {
            let mut gs: Vec<&mut Guest> = nodes.iter_mut().map(|n| &mut n.g).collect();
            sm.round(&mut gs)
        };
        for n in nodes.iter_mut() {
            n.step();
        }
        if done(nodes) {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        if work == 0 {
            idle += 1;
            if idle > 32 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::thread::yield_now();
            }
        } else {
            idle = 0;
        }
    }
}

/// The next event of `id` on node `who`, everything running meanwhile.
fn event(sm: &mut OpenSm, nodes: &mut [&mut Node], who: usize, id: RdmaCmId) -> RdmaCmEvent {
    let mut got = None;
    run(sm, nodes, STEP_LIMIT, |n| {
        let cma = n[who].cma;
        got = cma::get_cm_event(&mut n[who].g.core, cma, id);
        got.is_some()
    });
    got.unwrap_or_else(|| panic!("no event on {id:?} in {STEP_LIMIT:?}"))
}

fn expect(ev: &RdmaCmEvent, want: RdmaCmEventType, status: i32) {
    assert_eq!((ev.event, ev.status), (want, status), "{ev:?}");
}

/// Verbs of one side: PD, CQ, a buffer and its MR (remote access), a QP
/// made through the RDMA CM.
struct Verbs {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    buf: hal::DmaBuf,
}

fn verbs(n: &mut Node, id: RdmaCmId, t: QpType) -> Verbs {
    let pool = n.g.hca.dma_pool();
    let d = n.g.core.device_mut(n.g.dev).unwrap();
    let pd = d.alloc_pd().unwrap();
    let (cq, _) = d
        .create_cq(&CqInitAttr {
            cqe: 32,
            comp_vector: 0,
        })
        .unwrap();
    let buf = pool.alloc_pages(1).unwrap();
    let base = buf.bus_addr().0;
    let mr = d
        .reg_mr(
            pd,
            &MrPages {
                pages: &[base],
                page_shift: 12,
                iova: base,
                length: 4096,
                access: AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_WRITE,
            },
        )
        .unwrap();
    let attr = QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_type: SigType::AllWr,
        qp_type: t,
        create_flags: QpCreateFlags::empty(),
        port_num: 1,
    };
    let qp = cma::create_qp(&mut n.g.core, n.cma, id, pd, &attr).unwrap();
    Verbs {
        pd,
        cq,
        qp,
        mr,
        buf,
    }
}

fn free(n: &mut Node, v: Verbs) {
    let d = n.g.core.device_mut(n.g.dev).unwrap();
    d.destroy_qp(v.qp).unwrap();
    d.dereg_mr(v.mr).unwrap();
    d.destroy_cq(v.cq).unwrap();
    d.dealloc_pd(v.pd).unwrap();
}

fn post_recv(n: &mut Node, v: &Verbs, off: u64, len: u32) {
    let sge = [Sge {
        addr: v.buf.bus_addr().0 + off,
        length: len,
        lkey: v.mr.lkey,
    }];
    n.g.core
        .device_mut(n.g.dev)
        .unwrap()
        .post_recv(
            v.qp,
            &[RecvWr {
                wr_id: 1,
                sg_list: &sge,
            }],
        )
        .unwrap();
}

fn post_send(n: &mut Node, v: &Verbs, data: &[u8], detail: WrDetail) {
    v.buf.write_bytes(2048, data);
    let sge = [Sge {
        addr: v.buf.bus_addr().0 + 2048,
        length: data.len() as u32,
        lkey: v.mr.lkey,
    }];
    let wr = SendWr {
        wr_id: 2,
        sg_list: &sge,
        opcode: WrOpcode::Send,
        send_flags: SendFlags::SIGNALED,
        wr: detail,
        ..SendWr::default()
    };
    n.g.core
        .device_mut(n.g.dev)
        .unwrap()
        .post_send(v.qp, &[wr])
        .unwrap();
}

/// Waits for one completion on `v`'s CQ at node `who`.
fn completion(sm: &mut OpenSm, nodes: &mut [&mut Node], who: usize, cq: Cq) -> Wc {
    let mut got = None;
    run(sm, nodes, STEP_LIMIT, |n| {
        let mut wc = [Wc::default(); 1];
        let dev = n[who].g.dev;
        if let Ok(1) = n[who].g.core.device_mut(dev).unwrap().poll_cq(cq, &mut wc) {
            got = Some(wc[0]);
        }
        got.is_some()
    });
    got.expect("a completion")
}

/// Resolves `dst` from node `who` on a new ID of `ps`: ADDR_RESOLVED, then
/// ROUTE_RESOLVED.
fn resolve(
    sm: &mut OpenSm,
    nodes: &mut [&mut Node],
    who: usize,
    ps: PortSpace,
    dst: SocketAddrV4,
) -> RdmaCmId {
    let cma = nodes[who].cma;
    let id = cma::create_id(&mut nodes[who].g.core, cma, ps).unwrap();
    nodes[who]
        .with_net(|core, net| cma::resolve_addr(core, cma, net, id, None, dst, 2000))
        .unwrap();
    let ev = event(sm, nodes, who, id);
    expect(&ev, RdmaCmEventType::AddrResolved, 0);
    cma::resolve_route(&mut nodes[who].g.core, cma, id, 2000).unwrap();
    let ev = event(sm, nodes, who, id);
    expect(&ev, RdmaCmEventType::RouteResolved, 0);
    id
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

#[test]
fn rdma_cm_connects_by_ip_refuses_bad_requests_and_reports_a_silent_peer() {
    let name = "rdma_cm_connects_by_ip_refuses_bad_requests_and_reports_a_silent_peer";
    if !peers_present(name) {
        return;
    }
    let mut s = subnet(name, 2);
    let mut a = s.guest(0, "10.0.0.1/24");
    let mut b = s.guest(1, "10.0.0.2/24");
    let sm = &mut s.sm;
    let ok = run(sm, &mut [&mut a, &mut b], UP_LIMIT, |n| {
        n.iter().all(|x| x.carrier())
    });
    assert!(ok, "both ib0 up\n{}", sm.current_log());

    // B listens on TCP port 7174 (rping's), any address.
    let lb = cma::create_id(&mut b.g.core, b.cma, PortSpace::Tcp).unwrap();
    cma::bind_addr(
        &mut b.g.core,
        b.cma,
        lb,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 7174),
    )
    .unwrap();
    cma::listen(&mut b.g.core, b.cma, lb, 3).unwrap();

    // --- RC: resolve, connect, the REQ's header as Linux writes it,
    // accept, a SEND each way, disconnect.
    let dst = SocketAddrV4::new(ip("10.0.0.2"), 7174);
    let t0 = Instant::now();
    let ia = resolve(sm, &mut [&mut a, &mut b], 0, PortSpace::Tcp, dst);
    let resolved_in = t0.elapsed();
    let info = cma::query(&mut a.g.core, a.cma, ia).unwrap();
    assert_eq!(*info.src.ip(), ip("10.0.0.1"));
    assert!(info.src.port() >= 32768, "{info:?}");
    let path = info.path.expect("a path");
    assert_eq!(path.dlid, b.g.port(1).lid);
    let va = verbs(&mut a, ia, QpType::Rc);
    let param = RdmaConnParam {
        private_data: b"hello from A".to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..RdmaConnParam::default()
    };
    cma::connect(&mut a.g.core, a.cma, ia, &param).unwrap();
    let req = event(sm, &mut [&mut a, &mut b], 1, lb);
    expect(&req, RdmaCmEventType::ConnectRequest, 0);
    assert_eq!(req.listen_id, Some(lb));
    assert_eq!(&req.conn.private_data[..12], b"hello from A");
    assert_eq!(req.conn.private_data.len(), 92 - 36);
    assert_eq!(
        (req.conn.responder_resources, req.conn.initiator_depth),
        (1, 1)
    );
    let ib = req.id;
    let binfo = cma::query(&mut b.g.core, b.cma, ib).unwrap();
    assert_eq!(binfo.src, SocketAddrV4::new(ip("10.0.0.2"), 7174));
    assert_eq!(binfo.dst, info.src);
    let vb = verbs(&mut b, ib, QpType::Rc);
    post_recv(&mut b, &vb, 0, 64);
    post_recv(&mut a, &va, 0, 64);
    cma::accept(&mut b.g.core, b.cma, ib, None).unwrap();
    let ev = event(sm, &mut [&mut a, &mut b], 0, ia);
    expect(&ev, RdmaCmEventType::Established, 0);
    let ev = event(sm, &mut [&mut a, &mut b], 1, ib);
    expect(&ev, RdmaCmEventType::Established, 0);
    post_send(&mut a, &va, b"ping over rdma_cm", WrDetail::None);
    let wc = completion(sm, &mut [&mut a, &mut b], 1, vb.cq);
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 17));
    let mut got = [0u8; 17];
    vb.buf.read_bytes(0, &mut got);
    assert_eq!(&got, b"ping over rdma_cm");
    let wc = completion(sm, &mut [&mut a, &mut b], 0, va.cq);
    assert_eq!(wc.status, WcStatus::Success);
    post_send(&mut b, &vb, b"pong", WrDetail::None);
    let wc = completion(sm, &mut [&mut a, &mut b], 0, va.cq);
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 4));
    cma::disconnect(&mut a.g.core, a.cma, ia).unwrap();
    let ev = event(sm, &mut [&mut a, &mut b], 1, ib);
    expect(&ev, RdmaCmEventType::Disconnected, 0);
    let ev = event(sm, &mut [&mut a, &mut b], 0, ia);
    expect(&ev, RdmaCmEventType::Disconnected, 0);
    cma::destroy_id(&mut a.g.core, a.cma, ia).unwrap();
    cma::destroy_id(&mut b.g.core, b.cma, ib).unwrap();
    free(&mut a, va);
    free(&mut b, vb);

    // --- Bad input 1: a REQ whose cma header says version 1 (and one that
    // says IPv6): REJ "consumer defined" (28), counted, the listener none
    // the wiser.
    for (bad, what) in [(0x01u8, "version"), (0xff, "version")] {
        let mut hdr = CmaHdr::ipv4(
            SocketAddrV4::new(ip("10.0.0.1"), 40000),
            SocketAddrV4::new(ip("10.0.0.2"), 7174),
        )
        .pack();
        hdr[0] = bad;
        let _ = what;
        let r = raw_req(sm, &mut [&mut a, &mut b], path, &hdr);
        assert_eq!(r, 28, "REJ reason for cma version {bad:#x}");
    }
    let mut hdr = CmaHdr::ipv4(
        SocketAddrV4::new(ip("10.0.0.1"), 40000),
        SocketAddrV4::new(ip("10.0.0.2"), 7174),
    )
    .pack();
    hdr[1] = 0x60;
    assert_eq!(raw_req(sm, &mut [&mut a, &mut b], path, &hdr), 28);
    // A destination address that is not B's.
    let hdr = CmaHdr::ipv4(
        SocketAddrV4::new(ip("10.0.0.1"), 40000),
        SocketAddrV4::new(ip("10.0.0.9"), 7174),
    )
    .pack();
    assert_eq!(raw_req(sm, &mut [&mut a, &mut b], path, &hdr), 28);
    let c = cma::counters(&mut b.g.core, b.cma).unwrap();
    assert_eq!(
        (c.bad_version, c.bad_ip_version, c.no_netdev, c.requests),
        (2, 1, 1, 1),
        "{c:?}"
    );
    assert!(cma::get_cm_event(&mut b.g.core, b.cma, lb).is_none());

    // --- Bad input 2: a port nobody listens on: REJ "invalid service ID"
    // (8) from B's IB CM, RDMA_CM_EVENT_REJECTED with status 8 here.
    let ia = resolve(
        sm,
        &mut [&mut a, &mut b],
        0,
        PortSpace::Tcp,
        SocketAddrV4::new(ip("10.0.0.2"), 9999),
    );
    let va = verbs(&mut a, ia, QpType::Rc);
    cma::connect(&mut a.g.core, a.cma, ia, &param).unwrap();
    let ev = event(sm, &mut [&mut a, &mut b], 0, ia);
    expect(&ev, RdmaCmEventType::Rejected, 8);
    cma::destroy_id(&mut a.g.core, a.cma, ia).unwrap();
    free(&mut a, va);

    // An address no one answers ARP for: ADDR_ERROR -ETIMEDOUT within the
    // 2 s asked for.
    let ix = cma::create_id(&mut a.g.core, a.cma, PortSpace::Tcp).unwrap();
    let cma_a = a.cma;
    a.with_net(|core, net| {
        cma::resolve_addr(
            core,
            cma_a,
            net,
            ix,
            None,
            SocketAddrV4::new(ip("10.0.0.77"), 7174),
            2000,
        )
    })
    .unwrap();
    let t = Instant::now();
    let ev = event(sm, &mut [&mut a, &mut b], 0, ix);
    expect(&ev, RdmaCmEventType::AddrError, -110);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // No route at all: refused at once.
    let e = a
        .with_net(|core, net| {
            cma::resolve_addr(
                core,
                cma_a,
                net,
                ix,
                None,
                SocketAddrV4::new(ip("192.168.7.7"), 7174),
                2000,
            )
        })
        .unwrap_err();
    assert_eq!(e.to_errno(), -101);
    cma::destroy_id(&mut a.g.core, a.cma, ix).unwrap();

    // --- Bad input 3: B stops answering after the route is resolved: the
    // REQ goes unanswered; with a short CM timing (14: 67 ms plus twice the
    // packet life a try, 2 retries) RDMA_CM_EVENT_UNREACHABLE -ETIMEDOUT
    // comes within the deadline.
    let ia = resolve(sm, &mut [&mut a, &mut b], 0, PortSpace::Tcp, dst);
    let va = verbs(&mut a, ia, QpType::Rc);
    cma::set_cm_timeout(&mut a.g.core, a.cma, ia, 14, 2).unwrap();
    cma::connect(&mut a.g.core, a.cma, ia, &param).unwrap();
    let t = Instant::now();
    let ev = event(sm, &mut [&mut a], 0, ia);
    let took = t.elapsed();
    expect(&ev, RdmaCmEventType::Unreachable, -110);
    assert!(took < Duration::from_secs(25), "{took:?}");
    cma::destroy_id(&mut a.g.core, a.cma, ia).unwrap();
    free(&mut a, va);
    // B wakes up: the REQs it missed come in now and are answered, and the
    // ID it made for them is dropped by the REJ "timeout" A's IB CM sent.
    run(sm, &mut [&mut a, &mut b], Duration::from_secs(2), |_| false);
    while let Some(ev) = cma::get_cm_event(&mut b.g.core, b.cma, lb) {
        let _ = cma::destroy_id(&mut b.g.core, b.cma, ev.id);
    }

    // --- UD through SIDR on the UDP port space.
    let lu = cma::create_id(&mut b.g.core, b.cma, PortSpace::Udp).unwrap();
    cma::bind_addr(
        &mut b.g.core,
        b.cma,
        lu,
        SocketAddrV4::new(ip("10.0.0.2"), 5000),
    )
    .unwrap();
    cma::listen(&mut b.g.core, b.cma, lu, 3).unwrap();
    let iu = resolve(
        sm,
        &mut [&mut a, &mut b],
        0,
        PortSpace::Udp,
        SocketAddrV4::new(ip("10.0.0.2"), 5000),
    );
    let va = verbs(&mut a, iu, QpType::Ud);
    let up = RdmaConnParam {
        private_data: b"hello over SIDR".to_vec(),
        ..RdmaConnParam::default()
    };
    cma::connect(&mut a.g.core, a.cma, iu, &up).unwrap();
    let req = event(sm, &mut [&mut a, &mut b], 1, lu);
    expect(&req, RdmaCmEventType::ConnectRequest, 0);
    let ud = req.ud.clone().expect("UD parameters");
    assert_eq!(&ud.private_data[..15], b"hello over SIDR");
    assert_eq!(ud.private_data.len(), 216 - 36);
    let vb = verbs(&mut b, req.id, QpType::Ud);
    post_recv(&mut b, &vb, 0, 40 + 64);
    cma::accept(
        &mut b.g.core,
        b.cma,
        req.id,
        Some(&RdmaConnParam {
            private_data: b"welcome".to_vec(),
            ..RdmaConnParam::default()
        }),
    )
    .unwrap();
    let ev = event(sm, &mut [&mut a, &mut b], 0, iu);
    expect(&ev, RdmaCmEventType::Established, 0);
    let ud = ev.ud.expect("UD parameters");
    assert_eq!((ud.qp_num, ud.qkey), (vb.qp.qp_num, RDMA_UDP_QKEY));
    assert_eq!(&ud.private_data[..7], b"welcome");
    assert_eq!(ud.ah_attr.dlid, b.g.port(1).lid);
    let ah =
        a.g.core
            .device_mut(a.g.dev)
            .unwrap()
            .create_ah(va.pd, &ud.ah_attr)
            .unwrap();
    post_send(
        &mut a,
        &va,
        b"datagram",
        WrDetail::Ud {
            ah,
            remote_qpn: ud.qp_num,
            remote_qkey: ud.qkey,
            pkey_index: 0,
            port_num: 1,
        },
    );
    let wc = completion(sm, &mut [&mut a, &mut b], 1, vb.cq);
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 40 + 8));
    assert_eq!(wc.src_qp, va.qp.qp_num);
    let mut got = [0u8; 8];
    vb.buf.read_bytes(40, &mut got);
    assert_eq!(&got, b"datagram");
    a.g.core
        .device_mut(a.g.dev)
        .unwrap()
        .destroy_ah(ah)
        .unwrap();
    cma::destroy_id(&mut a.g.core, a.cma, iu).unwrap();
    cma::destroy_id(&mut b.g.core, b.cma, req.id).unwrap();
    free(&mut a, va);
    free(&mut b, vb);
    // A SIDR_REQ for a UDP port nobody serves: SIDR_REP "unsupported",
    // RDMA_CM_EVENT_UNREACHABLE -ECONNRESET.
    let iu = resolve(
        sm,
        &mut [&mut a, &mut b],
        0,
        PortSpace::Udp,
        SocketAddrV4::new(ip("10.0.0.2"), 5001),
    );
    cma::connect(&mut a.g.core, a.cma, iu, &up).unwrap();
    let ev = event(sm, &mut [&mut a, &mut b], 0, iu);
    expect(&ev, RdmaCmEventType::Unreachable, -104);
    cma::destroy_id(&mut a.g.core, a.cma, iu).unwrap();
    cma::destroy_id(&mut b.g.core, b.cma, lu).unwrap();
    cma::destroy_id(&mut b.g.core, b.cma, lb).unwrap();
    eprintln!("address and route resolved in {resolved_in:?}");

    a.teardown();
    b.teardown();
    s.sm.stop();
}

/// A REQ through the IB CM directly (not the RDMA CM) from node 0 to B's
/// port 7174 with `private` as its private data; returns the REJ reason.
fn raw_req(
    sm: &mut OpenSm,
    nodes: &mut [&mut Node],
    path: ib_core::sa_query::PathRecord,
    private: &[u8],
) -> u16 {
    let a = &mut *nodes[0];
    let cm = cm::init(&mut a.g.core);
    let pool = a.g.hca.dma_pool();
    let _ = pool;
    let d = a.g.core.device_mut(a.g.dev).unwrap();
    let pd = d.alloc_pd().unwrap();
    let (cq, _) = d
        .create_cq(&CqInitAttr {
            cqe: 4,
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
                    max_send_wr: 1,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_type: SigType::AllWr,
                qp_type: QpType::Rc,
                create_flags: QpCreateFlags::empty(),
                port_num: 1,
            },
        )
        .unwrap();
    let mut p = CmReqParam::new(path, cma::service_id(PortSpace::Tcp, 7174), qp);
    p.private_data = private.to_vec();
    let id = cm::send_req(&mut a.g.core, cm, a.g.dev, 1, &p).unwrap();
    let mut reason = None;
    run(sm, nodes, STEP_LIMIT, |n| {
        if let Some(CmEvent::Rejected { reason: r, .. }) = cm::get_event(&mut n[0].g.core, cm, id) {
            reason = Some(r);
        }
        reason.is_some()
    });
    let a = &mut *nodes[0];
    let _ = cm::destroy_id(&mut a.g.core, cm, id);
    let d = a.g.core.device_mut(a.g.dev).unwrap();
    d.destroy_qp(qp).unwrap();
    d.destroy_cq(cq).unwrap();
    d.dealloc_pd(pd).unwrap();
    reason.expect("a REJ")
}

/// Starts rping with `args` on node `who`.
fn rping_start(n: &mut Node, args: &[&str], out: &mut String) -> Result<Rping, String> {
    let p = rping::Params::parse(args)?;
    let cma = n.cma;
    n.with_net(|core, net| Rping::start(core, cma, net, &p, out))
}

/// Steps rpings on the nodes (index, rping, output) until all are over;
/// their results.
fn rping_run(
    sm: &mut OpenSm,
    nodes: &mut [&mut Node],
    mut rp: Vec<(usize, Rping, String)>,
    limit: Duration,
) -> Vec<(Result<(), String>, String)> {
    let mut res: Vec<Option<Result<(), String>>> = rp.iter().map(|_| None).collect();
    run(sm, nodes, limit, |n| {
        for (k, (who, r, out)) in rp.iter_mut().enumerate() {
            if res[k].is_none()
                && let Poll::Ready(x) = r.step(&mut n[*who].g.core, out)
            {
                res[k] = Some(x);
            }
        }
        res.iter().all(|x| x.is_some())
    });
    rp.into_iter()
        .zip(res)
        .map(|((who, r, out), x)| {
            r.finish(&mut nodes[who].g.core);
            (
                x.unwrap_or_else(|| Err(format!("still running after {limit:?}"))),
                out,
            )
        })
        .collect()
}

#[test]
fn rping_ours_against_ours_under_opensm() {
    let name = "rping_ours_against_ours_under_opensm";
    if !peers_present(name) {
        return;
    }
    let mut s = subnet(name, 2);
    let mut a = s.guest(0, "10.0.0.1/24");
    let mut b = s.guest(1, "10.0.0.2/24");
    let sm = &mut s.sm;
    let ok = run(sm, &mut [&mut a, &mut b], UP_LIMIT, |n| {
        n.iter().all(|x| x.carrier())
    });
    assert!(ok, "both ib0 up\n{}", sm.current_log());

    // `rping -s -a 10.0.0.2 -v` against `rping -c -a 10.0.0.2 -C 100 -S 100
    // -v -V`: 100 pings, the data checked, rping's lines on both sides.
    let (mut so, mut co) = (String::new(), String::new());
    let srv = rping_start(&mut b, &["-s", "-a", "10.0.0.2", "-v"], &mut so).unwrap();
    let cli = rping_start(
        &mut a,
        &["-c", "-a", "10.0.0.2", "-C", "100", "-S", "100", "-v", "-V"],
        &mut co,
    )
    .unwrap();
    let t = Instant::now();
    let r = rping_run(
        sm,
        &mut [&mut a, &mut b],
        vec![(1, srv, so), (0, cli, co)],
        Duration::from_secs(60),
    );
    let took = t.elapsed();
    let (ref sres, ref sout) = r[0];
    let (ref cres, ref cout) = r[1];
    assert!(
        cres.is_ok() && sres.is_ok(),
        "client {cres:?}\n{cout}\nserver {sres:?}\n{sout}"
    );
    let pings: Vec<&str> = cout
        .lines()
        .filter(|l| l.starts_with("ping data: "))
        .collect();
    assert_eq!(pings.len(), 100, "{cout}");
    let mut want = vec![0u8; 100];
    rping::fill_ping(&mut want, 0, 65);
    assert_eq!(pings[0], format!("ping data: {}", rping::c_str(&want)));
    rping::fill_ping(&mut want, 99, 65 + (99 % 58) as u8);
    assert_eq!(pings[99], format!("ping data: {}", rping::c_str(&want)));
    assert_eq!(
        sout.lines()
            .filter(|l| l.starts_with("server ping data: rdma-ping-"))
            .count(),
        100,
        "{sout}"
    );
    assert!(sout.contains("server DISCONNECT EVENT..."), "{sout}");
    assert!(cout.contains("client DISCONNECT EVENT..."), "{cout}");
    eprintln!("rping -C 100 -S 100 -V: {took:?} on the model");

    // A client to a port nobody listens on: REJECTED 8, said plainly.
    let mut co = String::new();
    let cli = rping_start(
        &mut a,
        &["-c", "-a", "10.0.0.2", "-p", "9", "-C", "1"],
        &mut co,
    )
    .unwrap();
    let r = rping_run(sm, &mut [&mut a, &mut b], vec![(0, cli, co)], STEP_LIMIT);
    let (ref cres, ref cout) = r[0];
    assert!(
        cout.contains("cma event RDMA_CM_EVENT_REJECTED, error 8"),
        "{cout}"
    );
    let e = cres.as_ref().unwrap_err();
    assert!(e.contains("IB_CM_REJ_INVALID_SERVICE_ID"), "{e}");
    // No route: rdma_resolve_addr fails at once, as perror words it.
    let mut co = String::new();
    let e = rping_start(&mut a, &["-c", "-a", "192.168.9.9"], &mut co)
        .err()
        .unwrap();
    assert_eq!(e, "rdma_resolve_addr: Network is unreachable");

    a.teardown();
    b.teardown();
    s.sm.stop();
}
