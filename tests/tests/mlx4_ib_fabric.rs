//! Model-backed MADs through a switch with the real stack.
//!
//! Model-backed MADs through a switch with the real stack (mlx4_core + mlx4_ib +
//! ib_core on two model HCAs cabled to one model switch): a directed-route SMP
//! answered by the peer HCA's driver (its QP0 agent through MAD_IFC) with the SMI
//! rules checked both ways, SMPs answered by the switch's SMA, a PMA PortCounters
//! query answered by the peer's agent on QP1, a dropped response retried and, with
//! every response dropped, a timeout within its deadline; the ports are brought up
//! by hand (no SM on these wires yet).

use tests::mlx4_common;

use std::sync::{Arc, Mutex};

use ib_core::mad::{Mad, MadEvent, MadSendBuf, class, method};
use ib_core::verbs::{AhAttr, IB_LID_PERMISSIVE, IB_QP_SET_QKEY, QpType, WcStatus};
use ib_core::{DeviceId, IbCore, MadAgent};
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;
use sim::fabric::{FaultKind, FaultRule, SharedFabric, SwitchId};
use sim::{SimConfig, Wire};

/// LID of the switch (its SMA and PMA).
const SWITCH_LID: u16 = 0x10;
/// NodeInfo.
const NODE_INFO: u16 = 0x0011;
/// PortCounters.
const PORT_COUNTERS: u16 = 0x0012;

struct Node {
    hca: Model,
    core: IbCore,
    dev: DeviceId,
    guid: u64,
    lid: u16,
}

/// Two HCAs (LIDs 1 and 2) on switch ports 1 and 2, the switch at
/// [`SWITCH_LID`], everything Active.
struct Net {
    a: Node,
    b: Node,
    wire: Wire,
    fabric: SharedFabric,
    switch: SwitchId,
}

fn node(hca: Model, lid: u16) -> Node {
    let d = bring_up(&hca, Profile::default()).expect("mlx4_core");
    let ib = Mlx4IbDev::add(d, "mlx4_0").expect("mlx4_ib_add");
    let guid = ib.node_guid();
    let mut core = IbCore::new(hca.clock());
    let dev = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    Node {
        hca,
        core,
        dev,
        guid,
        lid,
    }
}

fn net() -> Net {
    let mut f = sim::fabric::Fabric::new();
    let built = sim::fabric::Topology::for_nodes(2)
        .unwrap()
        .build(&mut f)
        .unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let wire = Wire::over(fabric.clone(), SimConfig::default().relax_step);
    let mut hcas = built.hcas.iter().map(|h| {
        Model::on_ports(
            SimConfig {
                node_guid: h.node_guid,
                ..SimConfig::default()
            },
            &wire,
            [Some(h.ports[0]), Some(h.ports[1])],
        )
    });
    let a = node(hcas.next().unwrap(), 1);
    let b = node(hcas.next().unwrap(), 2);
    wire.settle();
    for n in [&a, &b] {
        assert!(
            tests::sm::sm_activate(&n.hca, 1, n.lid, 1),
            "port 1 of LID {}",
            n.lid
        );
    }
    let switch = built.switches[0].1;
    fabric
        .lock()
        .unwrap()
        .switch_mut(switch)
        .unwrap()
        .configure(SWITCH_LID, &[(1, 1), (2, 2)]);
    let mut n = Net {
        a,
        b,
        wire,
        fabric,
        switch,
    };
    // Let both cores take the port events (and refresh their caches).
    n.pump_for(1_000_000);
    n
}

impl Net {
    fn now(&self) -> u64 {
        self.a.hca.clock().now_ns()
    }

    /// One round: both cores polled, the wire settled, the shared fake
    /// clock moved on.
    fn round(&mut self) {
        self.a.core.poll();
        self.b.core.poll();
        self.wire.settle();
        self.a.hca.clock().relax();
    }

    fn pump_for(&mut self, ns: u64) {
        let end = self.now() + ns;
        let mut rounds = 0;
        while self.now() < end && rounds < 10_000_000 {
            self.round();
            rounds += 1;
        }
    }

    /// Posts `buf` from `agent` (on node A if `from_a`, else B) and pumps
    /// both nodes until the send completes (at most `limit_ns` of model
    /// time). Returns the completion status, the response, and the model
    /// time it took.
    fn request(
        &mut self,
        from_a: bool,
        agent: MadAgent,
        buf: MadSendBuf,
        limit_ns: u64,
    ) -> (WcStatus, Option<Mad>, u64) {
        let t0 = self.now();
        fn core(n: &mut Net, from_a: bool) -> &mut IbCore {
            if from_a { &mut n.a.core } else { &mut n.b.core }
        }
        let id = core(self, from_a)
            .post_send_mad(agent, buf)
            .expect("posted");
        let mut resp = None;
        let mut rounds = 0u64;
        loop {
            while let Some(ev) = core(self, from_a).mad_poll_agent(agent) {
                match ev {
                    MadEvent::Recv(r) => {
                        assert_eq!(r.send_id, Some(id), "a response to our request");
                        resp = Some(r.mad.clone());
                    }
                    MadEvent::SendDone(s) => {
                        assert_eq!(s.id, id);
                        return (s.status, resp, self.now() - t0);
                    }
                }
            }
            assert!(
                self.now() - t0 < limit_ns && rounds < 50_000_000,
                "no send completion within {limit_ns} ns of model time"
            );
            self.round();
            rounds += 1;
        }
    }

    fn switch_counters(&self, port: u8) -> sim::fabric::switch::PortCounters {
        self.fabric
            .lock()
            .unwrap()
            .switch(self.switch)
            .unwrap()
            .counters(port)
    }

    fn finish(self) {
        for mut n in [self.a, self.b] {
            let mut p = n.core.unregister_device(n.dev).expect("unregistered");
            let ib = p
                .as_any_mut()
                .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
                .expect("mlx4_ib");
            ib.remove();
            drop(p);
            n.hca.finish();
        }
    }
}

fn agent(n: &mut Node, t: QpType) -> MadAgent {
    n.core
        .register_mad_agent(n.dev, 1, t, None, 0)
        .expect("agent")
}

/// A directed-route SubnGet(NodeInfo) along `path` (out of port 1 first).
fn dr_get(path: &[u8]) -> MadSendBuf {
    let mut m = Mad::new_request(class::SUBN_DIRECTED_ROUTE, 1, method::GET, NODE_INFO, 0);
    m.set_hop_cnt(path.len() as u8);
    for (i, &p) in path.iter().enumerate() {
        m.set_initial_path(i as u8 + 1, p);
    }
    m.set_dr_slid(IB_LID_PERMISSIVE);
    m.set_dr_dlid(IB_LID_PERMISSIVE);
    let mut b = MadSendBuf::new(
        m,
        AhAttr {
            dlid: IB_LID_PERMISSIVE,
            port_num: 1,
            ..AhAttr::default()
        },
        0,
    );
    b.timeout_ms = 50;
    b
}

/// A PerfMgmt Get(PortCounters) of port 1 to the PMA at `dlid`.
fn pma_get(dlid: u16) -> MadSendBuf {
    let mut m = Mad::new_request(class::PERF_MGMT, 1, method::GET, PORT_COUNTERS, 0);
    // PortSelect 1, CounterSelect all.
    m.0[64 + 1] = 1;
    m.0[64 + 2] = 0xff;
    m.0[64 + 3] = 0xff;
    let mut b = MadSendBuf::new(
        m,
        AhAttr {
            dlid,
            port_num: 1,
            ..AhAttr::default()
        },
        1,
    );
    b.remote_qkey = IB_QP_SET_QKEY;
    b.timeout_ms = 50;
    b
}

fn node_guid(m: &Mad) -> u64 {
    u64::from_be_bytes(m.smp_data()[12..20].try_into().unwrap())
}

#[test]
fn a_directed_route_smp_crosses_the_switch_both_ways_and_the_peer_driver_answers() {
    let mut n = net();
    for from_a in [true, false] {
        let (me, peer_guid, my_switch_port) = if from_a {
            (&mut n.a, n.b.guid, 1)
        } else {
            (&mut n.b, n.a.guid, 2)
        };
        let peer_switch_port = 3 - my_switch_port;
        let ag = agent(me, QpType::Smi);
        let peer_replies_before = {
            let peer = if from_a { &n.b } else { &n.a };
            peer.core.mad_counters(peer.dev, 1).unwrap()
        };
        // Out of our port 1, through the switch, out of its port towards
        // the peer.
        let (st, resp, _) = n.request(from_a, ag, dr_get(&[1, peer_switch_port]), 1_000_000_000);
        assert_eq!(st, WcStatus::Success);
        let r = resp.expect("a GetResp");
        assert_eq!(r.method(), method::GET_RESP);
        assert_eq!(node_guid(&r), peer_guid, "the peer's NodeInfo");
        assert_eq!(r.smp_data()[2], 1, "node type CA");
        // SMI, outbound: the peer saw hop pointer = hop count and filled
        // the return path; inbound: the D bit set by the responder, the hop
        // pointer walked back to 0 on our side.
        assert!(r.smp_direction(), "D bit set in the response");
        assert_eq!(r.status() & 0x7fff, 0, "status");
        assert_eq!((r.hop_cnt(), r.hop_ptr()), (2, 0));
        assert_eq!(
            (r.initial_path(1), r.initial_path(2)),
            (1, peer_switch_port)
        );
        assert_eq!(
            (r.return_path(1), r.return_path(2)),
            (my_switch_port, 1),
            "return path: the switch's ingress port, then the peer's port"
        );
        assert_eq!(
            (r.dr_slid(), r.dr_dlid()),
            (IB_LID_PERMISSIVE, IB_LID_PERMISSIVE)
        );
        let peer = if from_a { &n.b } else { &n.a };
        let c = peer.core.mad_counters(peer.dev, 1).unwrap();
        assert_eq!(
            c.process_mad_replies,
            peer_replies_before.process_mad_replies + 1,
            "answered by the peer's driver (process_mad -> MAD_IFC)"
        );
        assert_eq!(c.drop_smi, 0);
        let me = if from_a { &mut n.a } else { &mut n.b };
        assert_eq!(me.core.mad_counters(me.dev, 1).unwrap().drop_smi, 0);
        me.core.unregister_mad_agent(ag).unwrap();
    }
    for p in 1..=2 {
        assert_eq!(n.switch_counters(p).vl15_dropped, 0);
    }
    n.finish();
}

#[test]
fn a_directed_route_smp_with_a_bad_path_is_refused_or_dropped() {
    let mut n = net();
    let ag = agent(&mut n.a, QpType::Smi);
    // Our own port is not 2: the SMI send rules refuse it at once.
    let e = n.a.core.post_send_mad(ag, dr_get(&[2, 2])).unwrap_err();
    assert!(matches!(e, ib_core::Error::Invalid(_)), "{e:?}");
    // The switch has no port 40: it drops the SMP (VL15Dropped on its
    // ingress port), and the request times out.
    let mut b = dr_get(&[1, 40]);
    b.retries = 1;
    let (st, resp, t) = n.request(true, ag, b, 1_000_000_000);
    assert_eq!(st, WcStatus::RespTimeoutErr);
    assert!(resp.is_none());
    assert!(t >= 100_000_000, "two tries of 50 ms: {t} ns");
    assert!(n.switch_counters(1).vl15_dropped >= 2);
    n.a.core.unregister_mad_agent(ag).unwrap();
    n.finish();
}

#[test]
fn the_switch_sma_answers_directed_route_and_lid_routed_smps() {
    let mut n = net();
    let ag = agent(&mut n.a, QpType::Smi);
    let (st, resp, _) = n.request(true, ag, dr_get(&[1]), 1_000_000_000);
    assert_eq!(st, WcStatus::Success);
    let r = resp.expect("GetResp from the switch");
    assert_eq!(r.smp_data()[2], 2, "node type switch");
    assert_eq!(r.smp_data()[3], 36, "NumPorts of a SwitchX");
    assert!(r.smp_direction());
    assert_eq!(r.hop_ptr(), 0);
    assert_eq!(r.return_path(1), 1, "the switch's ingress port");
    let switch_guid = node_guid(&r);
    // LID routed, to the switch's LID.
    let m = Mad::new_request(class::SUBN_LID_ROUTED, 1, method::GET, NODE_INFO, 0);
    let mut b = MadSendBuf::new(
        m,
        AhAttr {
            dlid: SWITCH_LID,
            port_num: 1,
            ..AhAttr::default()
        },
        0,
    );
    b.timeout_ms = 50;
    let (st, resp, _) = n.request(true, ag, b, 1_000_000_000);
    assert_eq!(st, WcStatus::Success);
    let r = resp.expect("GetResp from the switch");
    assert_eq!(node_guid(&r), switch_guid);
    assert!(!r.smp_direction(), "no D bit on a LID-routed SMP");
    n.a.core.unregister_mad_agent(ag).unwrap();
    n.finish();
}

#[test]
fn a_pma_query_is_answered_by_the_peer_agent_on_qp1() {
    let mut n = net();
    let ag = agent(&mut n.a, QpType::Gsi);
    let before = n.b.core.mad_counters(n.b.dev, 1).unwrap();
    let (st, resp, _) = n.request(true, ag, pma_get(2), 1_000_000_000);
    assert_eq!(st, WcStatus::Success);
    let r = resp.expect("PortCounters GetResp");
    assert_eq!(
        (r.mgmt_class(), r.method()),
        (class::PERF_MGMT, method::GET_RESP)
    );
    assert_eq!(r.status(), 0);
    assert_eq!(r.attr_id(), PORT_COUNTERS);
    assert_eq!(r.0[64 + 1], 1, "PortSelect echoed");
    let after = n.b.core.mad_counters(n.b.dev, 1).unwrap();
    assert_eq!(
        after.process_mad_replies,
        before.process_mad_replies + 1,
        "answered by B's agent through process_mad"
    );
    // And the switch's PMA, for comparison: port 1 received our request.
    let (st, resp, _) = n.request(true, ag, pma_get(SWITCH_LID), 1_000_000_000);
    assert_eq!(st, WcStatus::Success);
    let r = resp.expect("switch PortCounters");
    let rcv_pkts = u32::from_be_bytes(r.0[64 + 36..64 + 40].try_into().unwrap());
    assert!(rcv_pkts >= 2, "PortRcvPkts of switch port 1: {rcv_pkts}");
    n.a.core.unregister_mad_agent(ag).unwrap();
    n.finish();
}

#[test]
fn a_dropped_response_is_retried_and_all_dropped_times_out_within_the_deadline() {
    let mut n = net();
    let ag = agent(&mut n.a, QpType::Gsi);
    // Responses come to A out of switch port 1; requests leave through 2.
    let to_a = n.fabric.lock().unwrap().switch_port(n.switch, 1).unwrap();
    n.fabric
        .lock()
        .unwrap()
        .faults
        .add(FaultRule::new(FaultKind::Drop).port(to_a).qpn(1).times(1));
    let c0 = n.a.core.mad_counters(n.a.dev, 1).unwrap();
    let mut b = pma_get(2);
    b.retries = 2;
    let (st, resp, t) = n.request(true, ag, b, 1_000_000_000);
    assert_eq!(st, WcStatus::Success, "the retry got through");
    assert!(resp.is_some());
    assert!(
        t >= 50_000_000,
        "one timeout of 50 ms before the retry: {t} ns"
    );
    let c1 = n.a.core.mad_counters(n.a.dev, 1).unwrap();
    assert_eq!(c1.retries, c0.retries + 1, "one retry");
    assert_eq!(c1.timeouts, c0.timeouts);
    let b_answers =
        n.b.core
            .mad_counters(n.b.dev, 1)
            .unwrap()
            .process_mad_replies;
    // Every response dropped: three tries, then IB_WC_RESP_TIMEOUT_ERR.
    n.fabric
        .lock()
        .unwrap()
        .faults
        .add(FaultRule::new(FaultKind::Drop).port(to_a).qpn(1));
    let mut b = pma_get(2);
    b.retries = 2;
    let (st, resp, t) = n.request(true, ag, b, 1_000_000_000);
    assert_eq!(st, WcStatus::RespTimeoutErr);
    assert_eq!(st.name(), "IB_WC_RESP_TIMEOUT_ERR");
    assert!(resp.is_none());
    // The deadline: three tries of 50 ms, plus a little polling slack.
    assert!(
        (150_000_000..160_000_000).contains(&t),
        "timed out after {t} ns of model time"
    );
    let c2 = n.a.core.mad_counters(n.a.dev, 1).unwrap();
    assert_eq!(c2.retries, c1.retries + 2);
    assert_eq!(c2.timeouts, c1.timeouts + 1);
    assert_eq!(
        n.b.core
            .mad_counters(n.b.dev, 1)
            .unwrap()
            .process_mad_replies,
        b_answers + 3,
        "the peer answered every try; only the wire lost them"
    );
    n.a.core.unregister_mad_agent(ag).unwrap();
    n.fabric.lock().unwrap().faults.clear();
    n.finish();
}

/// A UD QP in RTS through ib_core's verbs (P_Key index 0, port 1).
fn ud_qp(
    d: &mut ib_core::Device,
    pd: ib_core::verbs::Pd,
    cq: ib_core::verbs::Cq,
    qkey: u32,
    max_inline: u32,
) -> (ib_core::verbs::Qp, ib_core::verbs::QpCap) {
    use ib_core::verbs::{
        QpAttr, QpAttrMask as M, QpCap, QpCreateFlags, QpInitAttr, QpState, SigType,
    };
    let (qp, cap) = d
        .create_qp(
            pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: max_inline,
                },
                sq_sig_type: SigType::AllWr,
                qp_type: QpType::Ud,
                create_flags: QpCreateFlags::empty(),
                port_num: 1,
            },
        )
        .expect("UD QP");
    for (a, m) in [
        (
            QpAttr {
                qp_state: QpState::Init,
                port_num: 1,
                pkey_index: 0,
                qkey,
                ..Default::default()
            },
            M::STATE | M::PORT | M::PKEY_INDEX | M::QKEY,
        ),
        (
            QpAttr {
                qp_state: QpState::Rtr,
                ..Default::default()
            },
            M::STATE,
        ),
        (
            QpAttr {
                qp_state: QpState::Rts,
                sq_psn: 0x42,
                ..Default::default()
            },
            M::STATE | M::SQ_PSN,
        ),
    ] {
        d.modify_qp(qp, &a, m).expect("UD QP to RTS");
    }
    (qp, cap)
}

fn poll_one(n: &mut Net, on_a: bool, cq: ib_core::verbs::Cq) -> ib_core::verbs::Wc {
    let mut wc = [ib_core::verbs::Wc::default()];
    for _ in 0..100_000 {
        let node = if on_a { &mut n.a } else { &mut n.b };
        let got = node.core.device_mut(node.dev).unwrap().poll_cq(cq, &mut wc);
        if got.expect("poll_cq") == 1 {
            return wc[0];
        }
        n.round();
    }
    panic!("no completion");
}

#[test]
fn inline_sends_through_ib_core_cross_the_switch() {
    use ib_core::verbs::{
        AccessFlags, CqInitAttr, MrPages, RecvWr, SendFlags, SendWr, Sge, WrDetail, WrOpcode,
    };
    let mut n = net();
    let pool = n.b.hca.dma_pool();
    let page = pool.alloc_pages(1).unwrap();
    let bus = page.bus_addr().0;
    // B: a UD QP with a receive buffer behind an MR.
    let (bq, bcq, bpd, mr) = {
        let d = n.b.core.device_mut(n.b.dev).unwrap();
        let pd = d.alloc_pd().unwrap();
        let (cq, _) = d
            .create_cq(&CqInitAttr {
                cqe: 64,
                comp_vector: 0,
            })
            .unwrap();
        let (qp, _) = ud_qp(d, pd, cq, 0x1234, 0);
        let mr = d
            .reg_mr(
                pd,
                &MrPages {
                    pages: &[bus],
                    page_shift: 12,
                    iova: bus,
                    length: 4096,
                    access: AccessFlags::LOCAL_WRITE,
                },
            )
            .unwrap();
        let sg = [Sge {
            addr: bus,
            length: 40 + 256,
            lkey: mr.lkey,
        }];
        d.post_recv(
            qp,
            &[RecvWr {
                wr_id: 77,
                sg_list: &sg,
            }],
        )
        .unwrap();
        (qp, cq, pd, mr)
    };
    let bqpn = bq.qp_num;
    // A: a UD QP with room for 128 inline bytes.
    let d = n.a.core.device_mut(n.a.dev).unwrap();
    let pd = d.alloc_pd().unwrap();
    let (acq, _) = d
        .create_cq(&CqInitAttr {
            cqe: 64,
            comp_vector: 0,
        })
        .unwrap();
    let (aq, cap) = ud_qp(d, pd, acq, 0x5678, 128);
    assert!(cap.max_inline_data >= 128, "granted {cap:?}");
    let ah = d
        .create_ah(
            pd,
            &AhAttr {
                dlid: 2,
                port_num: 1,
                ..AhAttr::default()
            },
        )
        .unwrap();
    let payload: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
    let wr = SendWr {
        wr_id: 9,
        opcode: WrOpcode::Send,
        send_flags: SendFlags::INLINE | SendFlags::SIGNALED,
        wr: WrDetail::Ud {
            ah,
            remote_qpn: bqpn,
            remote_qkey: 0x1234,
            pkey_index: 0,
            port_num: 1,
        },
        inline_data: &payload,
        ..SendWr::default()
    };
    // Longer than the QP's max_inline_data: ENOMEM, nothing posted.
    let long = vec![0u8; cap.max_inline_data as usize + 1];
    let e = d
        .post_send(
            aq,
            &[SendWr {
                inline_data: &long,
                ..wr
            }],
        )
        .unwrap_err();
    assert_eq!((e.index, e.error.to_errno()), (0, -12), "ENOMEM: {e}");
    // The inline flag with a gather list but no bytes: refused.
    let sg = [Sge {
        addr: 0x1000,
        length: 4,
        lkey: 1,
    }];
    let e = d
        .post_send(
            aq,
            &[SendWr {
                inline_data: &[],
                sg_list: &sg,
                ..wr
            }],
        )
        .unwrap_err();
    assert_eq!(e.error.to_errno(), -22, "EINVAL: {e}");
    // No gather entry at all: the bytes can only travel in the WQE.
    d.post_send(aq, &[wr]).expect("inline send posted");
    let ib = d.provider_as::<Mlx4IbDev>().unwrap();
    let q = ib.qp(mlx4_ib::QpId::from_index(aq.handle)).unwrap();
    let w = q.send_wqe_offset(0);
    // ctrl 16 + datagram 48: the first inline segment starts a chunk and
    // holds 60 bytes, the second the other 40.
    assert_eq!(q.buf().read_be32(w + 64), 0x8000_0000 | 60);
    assert_eq!(q.buf().read_be32(w + 128), 0x8000_0000 | 40);
    let wc = poll_one(&mut n, true, acq);
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success), "{wc:?}");
    let wc = poll_one(&mut n, false, bcq);
    assert_eq!((wc.wr_id, wc.status), (77, WcStatus::Success), "{wc:?}");
    assert_eq!(wc.byte_len, 40 + 100);
    assert_eq!(wc.slid, 1);
    let mut got = vec![0u8; 100];
    page.read_bytes(40, &mut got);
    assert_eq!(got, payload, "the inline bytes arrived at B");
    // Tear down the verbs objects before the stacks.
    let d = n.a.core.device_mut(n.a.dev).unwrap();
    d.destroy_ah(ah).unwrap();
    d.destroy_qp(aq).unwrap();
    d.destroy_cq(acq).unwrap();
    d.dealloc_pd(pd).unwrap();
    let d = n.b.core.device_mut(n.b.dev).unwrap();
    d.destroy_qp(bq).unwrap();
    d.dereg_mr(mr).unwrap();
    d.destroy_cq(bcq).unwrap();
    d.dealloc_pd(bpd).unwrap();
    drop(page);
    n.finish();
}

fn mad_ifcs(h: &Model) -> usize {
    h.trace().iter().filter(|e| e.name == "MAD_IFC").count()
}

#[test]
fn a_burst_of_mads_reads_the_pkey_from_the_cache_not_through_mad_ifc() {
    let mut n = net();
    let ag = agent(&mut n.a, QpType::Gsi);
    let before = mad_ifcs(&n.a.hca);
    for _ in 0..16 {
        let (st, resp, _) = n.request(true, ag, pma_get(SWITCH_LID), 1_000_000_000);
        assert_eq!(st, WcStatus::Success);
        assert!(resp.is_some());
    }
    assert_eq!(
        mad_ifcs(&n.a.hca) - before,
        0,
        "16 QP1 sends (and their responses) cost no MAD_IFC: the P_Key comes from the cache"
    );
    n.a.core.unregister_mad_agent(ag).unwrap();
    // The cache follows the events: a Set(PKeyTable) to our own SMA is
    // snooped, the P_Key change event refreshes ib_core's cache and the
    // driver's copy.
    let seen = |n: &mut Net| {
        let d = n.a.core.device_mut(n.a.dev).unwrap();
        let core_updates = d.port_cache(1).unwrap().updates;
        let c = d.provider_as::<Mlx4IbDev>().unwrap().sqp_cache(1).unwrap();
        (core_updates, c.updates, c.pkeys.first().copied())
    };
    let (u0, d0, pkey) = seen(&mut n);
    assert_eq!(pkey, Some(0xffff), "the default P_Key cached");
    assert!(u0 >= 1 && d0 >= 1);
    let sm = agent(&mut n.a, QpType::Smi);
    let mut b = dr_get(&[]);
    b.mad.set_method(method::SET);
    b.mad.set_attr_id(0x0016);
    b.mad.smp_data_mut()[..2].copy_from_slice(&0xffffu16.to_be_bytes());
    let (st, resp, _) = n.request(true, sm, b, 1_000_000_000);
    assert_eq!(st, WcStatus::Success);
    assert!(resp.is_some(), "our own SMA answered");
    n.pump_for(1_000_000);
    let (u1, d1, _) = seen(&mut n);
    assert!(
        u1 > u0,
        "ib_core refreshed its cache on the P_Key change event"
    );
    assert_eq!(d1 - d0, u1 - u0, "and handed each refresh to the driver");
    n.a.core.unregister_mad_agent(sm).unwrap();
    n.finish();
}

/// One PMA PortCounters answer: from the right class, attribute and
/// port, with PortRcvPkts (which counts every request the port received).
fn pma_answer(r: &Mad) -> u32 {
    assert_eq!(
        (r.mgmt_class(), r.method(), r.status(), r.attr_id()),
        (class::PERF_MGMT, method::GET_RESP, 0, PORT_COUNTERS)
    );
    assert_eq!(r.0[64 + 1], 1, "PortSelect echoed");
    u32::from_be_bytes(r.0[64 + 36..64 + 40].try_into().unwrap())
}

/// More MADs through QP0 and through QP1 than their send rings hold, on
/// both nodes (A's requests, B's answers): ib_core's 128 send WRs make a
/// 256-WQE ring (128 plus 2048 / 256 + 1 spare WQEs of 256 bytes, rounded
/// up to a power of two), so 600 of each pass every slot twice, with the
/// owner bit flipped, and the model refuses a WQE whose owner bit or
/// stamp is wrong. Every answer is checked: the peer's NodeInfo by
/// directed route and by LID, and the peer's PortCounters, whose packet
/// count grows with each request.
#[test]
fn a_burst_past_the_special_qps_send_rings_gets_every_answer_checked() {
    const BURST: usize = 600;
    let mut n = net();
    let smi = agent(&mut n.a, QpType::Smi);
    let gsi = agent(&mut n.a, QpType::Gsi);
    let b_guid = n.b.guid;
    let before = n.b.core.mad_counters(n.b.dev, 1).unwrap();
    let mut last_rcv = 0u32;
    for i in 0..BURST {
        // QP0: B's NodeInfo, by directed route and by LID in turn.
        let buf = if i % 2 == 0 {
            dr_get(&[1, 2])
        } else {
            let m = Mad::new_request(class::SUBN_LID_ROUTED, 1, method::GET, NODE_INFO, 0);
            let mut b = MadSendBuf::new(
                m,
                AhAttr {
                    dlid: n.b.lid,
                    port_num: 1,
                    ..AhAttr::default()
                },
                0,
            );
            b.timeout_ms = 50;
            b
        };
        let (st, resp, _) = n.request(true, smi, buf, 1_000_000_000);
        assert_eq!(st, WcStatus::Success, "SMP {i}");
        let r = resp.unwrap_or_else(|| panic!("SMP {i}: no answer"));
        assert_eq!(
            (r.method(), r.status() & 0x7fff, node_guid(&r)),
            (method::GET_RESP, 0, b_guid),
            "SMP {i}: B's NodeInfo"
        );
        assert_eq!(r.smp_data()[2], 1, "SMP {i}: node type CA");
        // QP1: B's PortCounters.
        let (st, resp, _) = n.request(true, gsi, pma_get(n.b.lid), 1_000_000_000);
        assert_eq!(st, WcStatus::Success, "PMA query {i}");
        let rcv = pma_answer(&resp.unwrap_or_else(|| panic!("PMA query {i}: no answer")));
        assert!(
            rcv > last_rcv,
            "PMA query {i}: PortRcvPkts {rcv} after {last_rcv}"
        );
        last_rcv = rcv;
    }
    let after = n.b.core.mad_counters(n.b.dev, 1).unwrap();
    assert_eq!(
        after.process_mad_replies - before.process_mad_replies,
        2 * BURST as u64,
        "B's driver answered every one"
    );
    for node in [&n.a, &n.b] {
        let c = node.core.mad_counters(node.dev, 1).unwrap();
        assert_eq!(c.drop_smi, 0);
    }
    n.a.core.unregister_mad_agent(smi).unwrap();
    n.a.core.unregister_mad_agent(gsi).unwrap();
    n.finish();
}
