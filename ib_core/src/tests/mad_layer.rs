//! The MAD layer end to end over the fake wire.

use std::time::Duration;

use hal::Clock;

use super::fake::{Arrival, lock};
use super::*;
use crate::agent::init_ah_from_wc;
use crate::error::Error;
use crate::mad::*;
use crate::verbs::*;

const WAIT: Duration = Duration::from_secs(5);

fn dr_get(attr_id: u16, hops: &[u8]) -> Mad {
    let mut m = Mad::new_request(class::SUBN_DIRECTED_ROUTE, 1, method::GET, attr_id, 0);
    m.set_hop_cnt(hops.len() as u8);
    for (i, &p) in hops.iter().enumerate() {
        m.set_initial_path(i as u8 + 1, p);
    }
    m.set_dr_slid(IB_LID_PERMISSIVE);
    m.set_dr_dlid(IB_LID_PERMISSIVE);
    m
}

fn to_lid(dlid: u16) -> AhAttr {
    AhAttr {
        dlid,
        port_num: 1,
        ..AhAttr::default()
    }
}

#[test]
fn port_start_brings_qp0_and_qp1_to_rts_with_receives_posted() {
    let r = rig();
    let w = lock(&r.world);
    for h in &w.hcas {
        let qps: Vec<_> = h.qps.iter().flatten().collect();
        assert_eq!(qps.len(), 2);
        for q in &qps {
            assert_eq!(q.state, QpState::Rts);
            assert_eq!(q.recv.len(), 512);
            assert!(
                q.recv.iter().all(|(_, s)| s.length == 296),
                "GRH area + MAD"
            );
        }
        assert_eq!(qps[0].qp_type, QpType::Smi);
        assert_eq!(qps[0].qkey, 0);
        assert_eq!(qps[1].qkey, IB_QP1_QKEY);
        // INIT with the default P_Key's index, RTR, RTS with the SQ PSN.
        let log: Vec<_> = h.modify_log.iter().filter(|l| l.0 == QpType::Gsi).collect();
        assert_eq!(log.len(), 3);
        assert_eq!(
            log[0].3,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::QKEY
        );
        assert_eq!(log[2].3, QpAttrMask::STATE | QpAttrMask::SQ_PSN);
    }
    assert!(r.core.mad_port_open(r.a, 1));
}

#[test]
fn dr_smp_is_answered_by_the_peers_sma_through_process_mad() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Smi, None, 0)
        .unwrap();
    let mut buf = MadSendBuf::new(dr_get(attr::NODE_INFO, &[1]), to_lid(IB_LID_PERMISSIVE), 0);
    buf.timeout_ms = 100;
    let (done, resp) = r.core.send_mad_wait(ag, buf, WAIT).unwrap();
    assert_eq!(done.status, WcStatus::Success);
    let resp = resp.expect("a response");
    assert_eq!(resp.mad.method(), method::GET_RESP);
    assert!(resp.mad.smp_direction());
    assert_eq!(resp.mad.hop_ptr(), 0, "back at the SM end of the path");
    assert_eq!(&resp.mad.smp_data()[12..20], &B_GUID.to_be_bytes());
    assert_eq!(resp.mad.tid() >> 32, u64::from(ag.hi_tid));
    let cb = r.core.mad_counters(r.b, 1).unwrap();
    assert_eq!(cb.process_mad_replies, 1);
    let w = lock(&r.world);
    assert_eq!(w.wire.len(), 2, "request and response on the wire");
    assert_eq!(w.wire[0].dest_qpn, 0);
}

#[test]
fn dr_smp_to_the_local_port_never_touches_the_wire() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Smi, None, 0)
        .unwrap();
    let mut buf = MadSendBuf::new(dr_get(attr::PORT_INFO, &[]), to_lid(IB_LID_PERMISSIVE), 0);
    buf.mad.set_attr_mod(1);
    buf.timeout_ms = 100;
    let (done, resp) = r.core.send_mad_wait(ag, buf, WAIT).unwrap();
    assert_eq!(done.status, WcStatus::Success);
    let resp = resp.unwrap();
    assert_eq!(
        u16::from_be_bytes([resp.mad.smp_data()[16], resp.mad.smp_data()[17]]),
        A_LID
    );
    assert!(lock(&r.world).wire.is_empty());
    assert_eq!(r.core.mad_counters(r.a, 1).unwrap().local_smps, 1);
}

#[test]
fn pma_query_is_answered_by_the_peers_agent() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    let mut buf = MadSendBuf::new(m, to_lid(B_LID), 1);
    buf.timeout_ms = 50;
    let (done, resp) = r.core.send_mad_wait(ag, buf, WAIT).unwrap();
    assert_eq!(done.status, WcStatus::Success);
    let resp = resp.unwrap();
    assert_eq!(resp.wc.slid, B_LID);
    assert_eq!(resp.wc.src_qp, 1);
    assert_eq!(&resp.mad.0[72..76], &0x1234_5678u32.to_be_bytes());
}

#[test]
fn requests_nobody_handles_get_unsupported_method_attrib() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    let m = Mad::new_request(class::DEVICE_MGMT, 1, method::GET, 0x10, 0);
    let mut buf = MadSendBuf::new(m, to_lid(B_LID), 1);
    buf.timeout_ms = 50;
    let (done, resp) = r.core.send_mad_wait(ag, buf, WAIT).unwrap();
    assert_eq!(done.status, WcStatus::Success);
    let resp = resp.unwrap();
    assert_eq!(resp.mad.method(), method::GET_RESP);
    assert_eq!(resp.mad.status(), status::UNSUPPORTED_METHOD_ATTRIB);
    assert_eq!(r.core.mad_counters(r.b, 1).unwrap().unsupported_replies, 1);

    // A Send (no response due) to nobody is dropped, not answered: the
    // requester times out.
    let m = Mad::new_request(class::DEVICE_MGMT, 1, method::SEND, 0x10, 0);
    let mut buf = MadSendBuf::new(m, to_lid(B_LID), 1);
    buf.timeout_ms = 20;
    let (done, resp) = r.core.send_mad_wait(ag, buf, WAIT).unwrap();
    assert_eq!(done.status, WcStatus::RespTimeoutErr);
    assert!(resp.is_none());
    let cb = r.core.mad_counters(r.b, 1).unwrap();
    assert_eq!(cb.unsupported_replies, 1);
    assert_eq!(cb.drop_no_agent, 1);
}

#[test]
fn unsolicited_requests_reach_the_registered_agent_which_answers() {
    let mut r = rig();
    let client = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    let server = r
        .core
        .register_mad_agent(
            r.b,
            1,
            QpType::Gsi,
            Some(MadRegReq::new(class::DEVICE_MGMT, 1, &[method::GET])),
            0,
        )
        .unwrap();
    let m = Mad::new_request(class::DEVICE_MGMT, 1, method::GET, 0x10, 7);
    let mut buf = MadSendBuf::new(m, to_lid(B_LID), 1);
    buf.timeout_ms = 100;
    buf.context = 0xc0ffee;
    let id = r.core.post_send_mad(client, buf).unwrap();
    // Serve on B.
    let req = r
        .core
        .poll_until(WAIT, |c| match c.mad_poll_agent(server) {
            Some(MadEvent::Recv(rw)) => Some(rw),
            _ => None,
        })
        .unwrap();
    assert_eq!(req.mad.attr_mod(), 7);
    assert!(req.send_id.is_none());
    let mut resp = req.mad.clone();
    resp.set_method(method::GET_RESP);
    resp.data_mut()[0] = 0x42;
    let ah = init_ah_from_wc(r.core.device(r.b).unwrap(), 1, &req.wc, req.grh.as_ref()).unwrap();
    assert_eq!(ah.dlid, A_LID);
    r.core
        .post_send_mad(server, MadSendBuf::new(resp, ah, req.wc.src_qp))
        .unwrap();
    // Back on A: the response, then the send completion, in that order.
    let mut evs = Vec::new();
    r.core
        .poll_until(WAIT, |c| {
            while let Some(e) = c.mad_poll_agent(client) {
                evs.push(e);
            }
            (evs.len() >= 2).then_some(())
        })
        .unwrap();
    match (&evs[0], &evs[1]) {
        (MadEvent::Recv(rw), MadEvent::SendDone(s)) => {
            assert_eq!(rw.send_id, Some(id));
            assert_eq!(rw.mad.data()[0], 0x42);
            assert_eq!(s.id, id);
            assert_eq!(s.status, WcStatus::Success);
            assert_eq!(s.context, 0xc0ffee);
        }
        other => panic!("{other:?}"),
    }
    // The server's own send completed too.
    r.core.poll();
    assert!(matches!(
        r.core.mad_poll_agent(server),
        Some(MadEvent::SendDone(MadSendWc {
            status: WcStatus::Success,
            ..
        }))
    ));
}

#[test]
fn agent_registration_refuses_conflicts_and_bad_requests() {
    let mut r = rig();
    let req = MadRegReq::new(class::DEVICE_MGMT, 1, &[method::GET, method::SET]);
    r.core
        .register_mad_agent(r.a, 1, QpType::Gsi, Some(req), 0)
        .unwrap();
    let e = r
        .core
        .register_mad_agent(
            r.a,
            1,
            QpType::Gsi,
            Some(MadRegReq::new(class::DEVICE_MGMT, 1, &[method::SET])),
            0,
        )
        .unwrap_err();
    assert_eq!(e, Error::Conflict("method already in use"));
    assert_eq!(e.to_errno(), -22);
    // Same class, other version or method: fine.
    r.core
        .register_mad_agent(
            r.a,
            1,
            QpType::Gsi,
            Some(MadRegReq::new(class::DEVICE_MGMT, 2, &[method::SET])),
            0,
        )
        .unwrap();
    let bad = |core: &mut IbCore, t, req| core.register_mad_agent(r.a, 1, t, Some(req), 0);
    assert!(bad(&mut r.core, QpType::Gsi, MadRegReq::new(0, 1, &[1])).is_err());
    assert!(
        bad(
            &mut r.core,
            QpType::Gsi,
            MadRegReq::new(class::SUBN_LID_ROUTED, 1, &[1])
        )
        .is_err()
    );
    assert!(
        bad(
            &mut r.core,
            QpType::Smi,
            MadRegReq::new(class::PERF_MGMT, 1, &[1])
        )
        .is_err()
    );
    assert!(
        bad(
            &mut r.core,
            QpType::Gsi,
            MadRegReq::new(class::PERF_MGMT, 8, &[1])
        )
        .is_err()
    );
    assert!(bad(&mut r.core, QpType::Gsi, MadRegReq::new(90, 1, &[1])).is_err());
    assert!(
        bad(
            &mut r.core,
            QpType::Rc,
            MadRegReq::new(class::PERF_MGMT, 1, &[1])
        )
        .is_err()
    );
    assert_eq!(
        r.core
            .register_mad_agent(r.a, 1, QpType::Gsi, None, 2)
            .unwrap_err(),
        Error::NotSupported
    );
    // RMPP only where the class uses it.
    assert!(matches!(
        r.core.register_mad_agent(
            r.a,
            1,
            QpType::Gsi,
            Some(MadRegReq::new(class::PERF_MGMT, 1, &[method::GET])),
            1
        ),
        Err(Error::Invalid(_))
    ));
    assert!(
        r.core
            .register_mad_agent(r.a, 1, QpType::Smi, None, 1)
            .is_err()
    );
    assert_eq!(
        r.core
            .register_mad_agent(r.a, 2, QpType::Gsi, None, 0)
            .unwrap_err(),
        Error::Invalid("port number out of range")
    );
}

#[test]
fn a_dropped_response_is_retried_and_then_times_out() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    // Every response is lost.
    lock(&r.world).drop_method = Some(method::GET_RESP);
    let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    let mut buf = MadSendBuf::new(m.clone(), to_lid(B_LID), 1);
    buf.timeout_ms = 10;
    buf.retries = 2;
    let t0 = r.clock.now_ns();
    let (done, resp) = r.core.send_mad_wait(ag, buf, WAIT).unwrap();
    assert_eq!(done.status, WcStatus::RespTimeoutErr);
    assert_eq!(done.status.msg(), "response timeout error");
    assert!(resp.is_none());
    assert!(r.clock.now_ns() - t0 >= 30_000_000, "three tries of 10 ms");
    let ca = r.core.mad_counters(r.a, 1).unwrap();
    assert_eq!((ca.retries, ca.timeouts), (2, 1));
    {
        let w = lock(&r.world);
        let reqs: Vec<_> = w
            .wire
            .iter()
            .filter(|p| p.mad.method() == method::GET)
            .collect();
        assert_eq!(reqs.len(), 3);
        assert!(
            reqs.iter().all(|p| p.mad.tid() == reqs[0].mad.tid()),
            "same TID on retries"
        );
    }
    // Only the first response lost: the retry succeeds.
    {
        let mut w = lock(&r.world);
        w.drop_method = None;
        w.drop_next = 1;
    }
    let mut buf = MadSendBuf::new(m, to_lid(B_LID), 1);
    buf.timeout_ms = 10;
    buf.retries = 2;
    let (done, resp) = r.core.send_mad_wait(ag, buf, WAIT).unwrap();
    assert_eq!(done.status, WcStatus::Success);
    assert!(resp.is_some());
    assert_eq!(r.core.mad_counters(r.a, 1).unwrap().retries, 3);
}

#[test]
fn a_response_with_an_unknown_tid_is_ignored() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    // A request whose real response is lost is outstanding.
    lock(&r.world).drop_method = Some(method::GET_RESP);
    let req = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    let mut buf = MadSendBuf::new(req, to_lid(B_LID), 1);
    buf.timeout_ms = 20;
    let id = r.core.post_send_mad(ag, buf).unwrap();
    r.core.poll();
    r.core.poll();
    let sent_tid = lock(&r.world).wire[0].mad.tid();
    assert_eq!(sent_tid >> 32, u64::from(ag.hi_tid));
    // Responses with the agent's hi_tid but another TID, with another class,
    // and with nobody's hi_tid.
    let mut m = Mad::new_request(
        class::PERF_MGMT,
        1,
        method::GET_RESP,
        attr::PORT_COUNTERS,
        0,
    );
    m.set_tid(sent_tid ^ 0x99);
    let mut other_class = m.clone();
    other_class.set_mgmt_class(class::DEVICE_MGMT);
    other_class.set_tid(sent_tid);
    let mut m2 = m.clone();
    m2.set_tid(0xdead_0000_0001);
    for x in [&m, &other_class, &m2] {
        assert!(lock(&r.world).deliver(0, 1, 1, Arrival::mad(&x.0, 1, B_LID)));
    }
    r.core.poll();
    assert_eq!(
        r.core.mad_counters(r.a, 1).unwrap().drop_unmatched_response,
        3
    );
    assert!(r.core.mad_poll_agent(ag).is_none());
    // Nothing was answered either, and the request still times out.
    assert_eq!(
        lock(&r.world).wire.len(),
        2,
        "request and the lost response only"
    );
    let done = r.core.poll_until(WAIT, |c| c.mad_poll_agent(ag)).unwrap();
    assert!(
        matches!(done, MadEvent::SendDone(s) if s.id == id && s.status == WcStatus::RespTimeoutErr)
    );
}

#[test]
fn cancel_completes_with_flush() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    lock(&r.world).drop_method = Some(method::GET_RESP);
    let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    let mut buf = MadSendBuf::new(m, to_lid(B_LID), 1);
    buf.timeout_ms = 60_000;
    let id = r.core.post_send_mad(ag, buf).unwrap();
    r.core.poll();
    r.core.poll();
    assert!(r.core.mad_poll_agent(ag).is_none());
    r.core.cancel_mad(ag, id).unwrap();
    match r.core.mad_poll_agent(ag) {
        Some(MadEvent::SendDone(s)) => {
            assert_eq!(s.id, id);
            assert_eq!(s.status, WcStatus::WrFlushErr);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.core.cancel_mad(ag, id), Err(Error::NotFound));
    // Every AH the MAD layer made was destroyed.
    assert!(lock(&r.world).hcas[0].ahs.iter().all(|a| a.is_none()));
}

#[test]
fn sends_beyond_the_send_queue_wait_their_turn() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..300u32 {
        let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, i);
        let mut buf = MadSendBuf::new(m, to_lid(B_LID), 1);
        buf.timeout_ms = 1000;
        ids.push(r.core.post_send_mad(ag, buf).unwrap());
    }
    let mut ok = 0;
    r.core
        .poll_until(WAIT, |c| {
            while let Some(e) = c.mad_poll_agent(ag) {
                if let MadEvent::SendDone(s) = e {
                    assert_eq!(s.status, WcStatus::Success);
                    ok += 1;
                }
            }
            (ok == 300).then_some(())
        })
        .unwrap();
}

#[test]
fn malformed_mads_are_counted_drops_and_the_agent_keeps_working() {
    let mut r = rig();
    let good = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    let mut w = lock(&r.world);
    // Bad base version.
    let mut m = good.clone();
    m.set_base_version(2);
    w.deliver(0, 1, 1, Arrival::mad(&m.0, 1, B_LID));
    // An SMP on QP1, a PMA MAD on QP0.
    let smp = dr_get(attr::NODE_INFO, &[1]);
    w.deliver(0, 1, 1, Arrival::mad(&smp.0, 1, B_LID));
    w.deliver(0, 1, 0, Arrival::mad(&good.0, 0, B_LID));
    // DR SMPs with a hop count of 64 and with an absurd hop pointer.
    let mut m = dr_get(attr::NODE_INFO, &[1]);
    m.set_hop_cnt(64);
    w.deliver(0, 1, 0, Arrival::mad(&m.0, 0, 0xffff));
    let mut m = dr_get(attr::NODE_INFO, &[1]);
    m.set_hop_ptr(7);
    w.deliver(0, 1, 0, Arrival::mad(&m.0, 0, 0xffff));
    // Too short, and a completion in error.
    w.deliver(0, 1, 1, Arrival::mad(&good.0[..100], 1, B_LID));
    w.deliver(
        0,
        1,
        1,
        Arrival {
            status: WcStatus::LocLenErr,
            ..Arrival::mad(&good.0, 1, B_LID)
        },
    );
    drop(w);
    r.core.poll();
    let c = r.core.mad_counters(r.a, 1).unwrap();
    assert_eq!(c.drop_bad_version, 1);
    assert_eq!(c.drop_wrong_qp, 2);
    assert_eq!(c.drop_smi, 2);
    assert_eq!(c.drop_short, 1);
    assert_eq!(c.recv_errors, 1);
    assert_eq!(c.process_mad_replies, 0);
    // Every buffer went back on the queue.
    assert!(
        lock(&r.world).hcas[0]
            .qps
            .iter()
            .flatten()
            .all(|q| q.recv.len() == 512)
    );
    // And the layer still works.
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    let mut buf = MadSendBuf::new(good, to_lid(B_LID), 1);
    buf.timeout_ms = 10;
    let (done, _) = r.core.send_mad_wait(ag, buf, WAIT).unwrap();
    assert_eq!(done.status, WcStatus::Success);
}

#[test]
fn sends_the_smi_rules_refuse_are_errors() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Smi, None, 0)
        .unwrap();
    // The first hop must leave through this port.
    let buf = MadSendBuf::new(dr_get(attr::NODE_INFO, &[2]), to_lid(IB_LID_PERMISSIVE), 0);
    assert!(matches!(
        r.core.post_send_mad(ag, buf),
        Err(Error::Invalid(_))
    ));
    let mut m = dr_get(attr::NODE_INFO, &[1]);
    m.set_hop_cnt(64);
    let buf = MadSendBuf::new(m, to_lid(IB_LID_PERMISSIVE), 0);
    assert!(r.core.post_send_mad(ag, buf).is_err());
    // A PMA MAD cannot go out of QP0.
    let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, 0x12, 0);
    assert!(
        r.core
            .post_send_mad(ag, MadSendBuf::new(m, to_lid(B_LID), 1))
            .is_err()
    );
    assert!(lock(&r.world).wire.is_empty());
}

#[test]
fn unregistering_an_agent_stops_its_mail_and_frees_its_sends() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    lock(&r.world).drop_method = Some(method::GET_RESP);
    let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    let mut buf = MadSendBuf::new(m, to_lid(B_LID), 1);
    buf.timeout_ms = 60_000;
    r.core.post_send_mad(ag, buf).unwrap();
    r.core.poll();
    r.core.unregister_mad_agent(ag).unwrap();
    assert!(r.core.mad_poll_agent(ag).is_none());
    assert_eq!(r.core.unregister_mad_agent(ag), Err(Error::NotFound));
    assert!(lock(&r.world).hcas[0].ahs.iter().all(|a| a.is_none()));
}

#[test]
fn unregistering_the_device_tears_the_mad_ports_down() {
    let mut r = rig();
    r.core.unregister_device(r.a).unwrap();
    let w = lock(&r.world);
    let h = &w.hcas[0];
    assert!(h.qps.iter().all(|q| q.is_none()));
    assert!(h.cqs.iter().all(|q| q.is_none()));
    assert_eq!((h.pds, h.mrs), (0, 0));
    drop(w);
    assert!(r.core.device(r.a).is_none());
    assert!(r.core.mad_counters(r.a, 1).is_none());
}

#[test]
fn smp_and_pma_queries_block_until_answered() {
    let mut r = rig();
    // Local port by an empty directed route, the peer by one hop, the peer by LID.
    let m = r
        .core
        .smp_query(r.a, 1, SmpRoute::Directed(&[]), attr::NODE_INFO, 0, WAIT)
        .unwrap();
    assert_eq!(&m.smp_data()[12..20], &A_GUID.to_be_bytes());
    let m = r
        .core
        .smp_query(r.a, 1, SmpRoute::Directed(&[1]), attr::NODE_INFO, 0, WAIT)
        .unwrap();
    assert_eq!(&m.smp_data()[12..20], &B_GUID.to_be_bytes());
    let m = r
        .core
        .smp_query(r.a, 1, SmpRoute::Lid(B_LID), attr::PORT_INFO, 1, WAIT)
        .unwrap();
    assert_eq!(
        u16::from_be_bytes([m.smp_data()[16], m.smp_data()[17]]),
        B_LID
    );
    // An attribute the SMA does not know: the status is an error.
    assert_eq!(
        r.core
            .smp_query(r.a, 1, SmpRoute::Lid(B_LID), 0x7777, 0, WAIT),
        Err(Error::MadStatus(status::UNSUPPORTED_METHOD_ATTRIB))
    );
    let m = r
        .core
        .pma_query(r.a, 1, B_LID, attr::PORT_COUNTERS, 0, &[0, 1], WAIT)
        .unwrap();
    assert_eq!(&m.0[72..76], &0x1234_5678u32.to_be_bytes());
    // Nobody at LID 99: a timeout, no agent left behind.
    assert_eq!(
        r.core.smp_query(
            r.a,
            1,
            SmpRoute::Lid(99),
            attr::NODE_INFO,
            0,
            Duration::from_millis(40)
        ),
        Err(Error::TimedOut)
    );
    assert!(lock(&r.world).hcas[0].ahs.iter().all(|a| a.is_none()));
}

#[test]
fn a_full_mailbox_drops_receives_but_never_send_completions() {
    let w = super::fake::world();
    let da = super::fake::add_hca(&w, "fake_a", A_GUID, 1, A_LID);
    let clock = std::sync::Arc::new(hal::fake::FakeClock::with_relax_step(
        Duration::from_micros(50),
    ));
    let cfg = crate::device::MadConfig {
        agent_mailbox: 4,
        ..crate::device::MadConfig::default()
    };
    let mut core = IbCore::with_mad_config(clock, cfg);
    let a = core.register_device(Box::new(da)).unwrap();
    let ag = core
        .register_mad_agent(
            a,
            1,
            QpType::Gsi,
            Some(MadRegReq::new(class::DEVICE_MGMT, 1, &[method::GET])),
            0,
        )
        .unwrap();
    let m = Mad::new_request(class::DEVICE_MGMT, 1, method::GET, 0x10, 0);
    for _ in 0..10 {
        lock(&w).deliver(0, 1, 1, Arrival::mad(&m.0, 1, 5));
    }
    core.poll();
    assert_eq!(core.mad_counters(a, 1).unwrap().drop_mailbox_full, 6);
    // Its own sends still complete into the full mailbox (to itself, LID 10).
    let mut resp = m.clone();
    resp.set_method(method::GET_RESP);
    let id = core
        .post_send_mad(ag, MadSendBuf::new(resp, to_lid(A_LID), 1))
        .unwrap();
    core.poll();
    core.poll();
    let evs: Vec<_> = std::iter::from_fn(|| core.mad_poll_agent(ag)).collect();
    assert_eq!(evs.len(), 5);
    assert!(matches!(evs[4], MadEvent::SendDone(s) if s.id == id));
}

#[test]
fn the_core_can_live_in_a_kernel_static() {
    fn is_send<T: Send>() {}
    is_send::<IbCore>();
}

#[test]
fn modify_mad_extends_the_wait() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    lock(&r.world).drop_method = Some(method::GET_RESP);
    let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    let mut buf = MadSendBuf::new(m, to_lid(B_LID), 1);
    buf.timeout_ms = 10;
    let id = r.core.post_send_mad(ag, buf).unwrap();
    r.core.poll();
    r.core.poll();
    r.core.modify_mad(ag, id, 1000).unwrap();
    let t0 = r.clock.now_ns();
    let ev = r.core.poll_until(WAIT, |c| c.mad_poll_agent(ag)).unwrap();
    assert!(matches!(ev, MadEvent::SendDone(s) if s.status == WcStatus::RespTimeoutErr));
    assert!(
        r.clock.now_ns() - t0 >= 1_000_000_000,
        "waited the new timeout"
    );
    assert_eq!(r.core.modify_mad(ag, id, 5), Err(Error::NotFound));
}

#[test]
fn a_dr_smp_starting_with_a_lid_routed_part_leaves_its_hop_pointer_alone() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Smi, None, 0)
        .unwrap();
    let mut m = dr_get(attr::NODE_INFO, &[1]);
    m.set_dr_slid(A_LID);
    // The wrong first hop would be refused if the rules ran.
    m.set_initial_path(1, 9);
    r.core
        .post_send_mad(ag, MadSendBuf::new(m, to_lid(B_LID), 0))
        .unwrap();
    let w = lock(&r.world);
    assert_eq!(w.wire.len(), 1);
    assert_eq!(w.wire[0].mad.hop_ptr(), 0);
}

#[test]
fn a_send_error_is_reported_and_the_qp_is_brought_back_from_sqe() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    lock(&r.world).fail_sends = 1;
    let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    let mut buf = MadSendBuf::new(m.clone(), to_lid(B_LID), 1);
    buf.timeout_ms = 10;
    let (done, _) = r.core.send_mad_wait(ag, buf.clone(), WAIT).unwrap();
    assert_eq!(done.status, WcStatus::LocQpOpErr);
    assert_eq!(done.status.msg(), "local QP operation error");
    assert_eq!(done.vendor_err, 0x68);
    // SQE -> RTS with CUR_STATE, as mad_error_handler does.
    {
        let w = lock(&r.world);
        let last = w.hcas[0].modify_log.last().copied().unwrap();
        assert_eq!(
            last,
            (
                QpType::Gsi,
                QpState::Sqe,
                QpState::Rts,
                QpAttrMask::STATE | QpAttrMask::CUR_STATE
            )
        );
    }
    let (done, resp) = r.core.send_mad_wait(ag, buf, WAIT).unwrap();
    assert_eq!(done.status, WcStatus::Success);
    assert!(resp.is_some());
}

#[test]
fn flushed_receive_buffers_are_not_posted_again() {
    let mut r = rig();
    let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    for _ in 0..3 {
        lock(&r.world).deliver(
            0,
            1,
            1,
            Arrival {
                status: WcStatus::WrFlushErr,
                ..Arrival::mad(&m.0, 1, B_LID)
            },
        );
    }
    r.core.poll();
    assert_eq!(r.core.mad_counters(r.a, 1).unwrap().recv_flushed, 3);
    let w = lock(&r.world);
    let gsi = w.hcas[0]
        .qps
        .iter()
        .flatten()
        .find(|q| q.qp_type == QpType::Gsi)
        .unwrap();
    assert_eq!(gsi.recv.len(), 509);
}

#[test]
fn sends_flushed_by_another_sends_error_are_posted_again() {
    let mut r = rig();
    let ag = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    lock(&r.world).hold_sends = true;
    let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    let a = r
        .core
        .post_send_mad(ag, MadSendBuf::new(m.clone(), to_lid(B_LID), 1))
        .unwrap();
    let b = r
        .core
        .post_send_mad(ag, MadSendBuf::new(m, to_lid(B_LID), 1))
        .unwrap();
    // The first fails (the QP goes to SQE), the second comes back flushed.
    {
        let mut w = lock(&r.world);
        w.hcas[0]
            .qps
            .iter_mut()
            .flatten()
            .filter(|q| q.qp_type == QpType::Gsi)
            .for_each(|q| q.state = QpState::Sqe);
        w.complete_held(0, 0, WcStatus::RemOpErr);
        w.complete_held(0, 1, WcStatus::WrFlushErr);
    }
    r.core.poll();
    match r.core.mad_poll_agent(ag) {
        Some(MadEvent::SendDone(s)) => {
            assert_eq!((s.id, s.status), (a, WcStatus::RemOpErr));
        }
        other => panic!("{other:?}"),
    }
    assert!(r.core.mad_poll_agent(ag).is_none(), "b is not finished");
    // b went out again on the recovered QP; complete it.
    {
        let mut w = lock(&r.world);
        assert_eq!(w.held.len(), 3);
        w.complete_held(0, 2, WcStatus::Success);
    }
    r.core.poll();
    match r.core.mad_poll_agent(ag) {
        Some(MadEvent::SendDone(s)) => assert_eq!((s.id, s.status), (b, WcStatus::Success)),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.core.mad_counters(r.a, 1).unwrap().retries, 1);
}

#[test]
fn each_port_of_a_two_port_hca_has_its_own_mad_layer() {
    use super::fake::{add_hca, cable, world};
    let w = world();
    let two = add_hca(&w, "mlx4_0", 0x100, 2, 1); // LIDs 1 and 2
    let x = add_hca(&w, "x", 0x200, 1, 30);
    let y = add_hca(&w, "y", 0x300, 1, 40);
    cable(&w, (0, 1), (1, 1));
    cable(&w, (0, 2), (2, 1));
    let clock = std::sync::Arc::new(hal::fake::FakeClock::with_relax_step(
        Duration::from_micros(50),
    ));
    let mut core = IbCore::new(clock);
    let d = core.register_device(Box::new(two)).unwrap();
    core.register_device(Box::new(x)).unwrap();
    core.register_device(Box::new(y)).unwrap();
    assert!(core.mad_port_open(d, 1) && core.mad_port_open(d, 2));
    assert_ne!(
        core.mad_qp(d, 1, QpType::Gsi),
        core.mad_qp(d, 2, QpType::Gsi)
    );
    // Out of port 2, one hop: the HCA cabled there answers.
    let m = core
        .smp_query(d, 2, SmpRoute::Directed(&[2]), attr::NODE_INFO, 0, WAIT)
        .unwrap();
    assert_eq!(&m.smp_data()[12..20], &0x300u64.to_be_bytes());
    let m = core
        .smp_query(d, 1, SmpRoute::Directed(&[1]), attr::NODE_INFO, 0, WAIT)
        .unwrap();
    assert_eq!(&m.smp_data()[12..20], &0x200u64.to_be_bytes());
    // The first hop must name the port it leaves from.
    assert!(matches!(
        core.smp_query(d, 1, SmpRoute::Directed(&[2]), attr::NODE_INFO, 0, WAIT),
        Err(Error::Invalid(_))
    ));
    // The local port's SMA by an empty route, per port.
    let m = core
        .smp_query(d, 2, SmpRoute::Directed(&[]), attr::NODE_INFO, 0, WAIT)
        .unwrap();
    assert_eq!(m.smp_data()[36], 2, "LocalPortNum");
    assert_eq!(core.mad_counters(d, 2).unwrap().local_smps, 1);
    assert_eq!(core.mad_counters(d, 1).unwrap().local_smps, 0);
}

#[test]
fn answers_to_a_packet_with_a_grh_go_back_along_the_reverse_route() {
    let mut r = rig();
    let a_gid = r.core.device(r.a).unwrap().get_cached_gid(1, 2).unwrap();
    let b_gid = r.core.device(r.b).unwrap().get_cached_gid(1, 0).unwrap();
    let grh = |dgid: Gid| {
        let mut g = [0u8; 40];
        g[0..4].copy_from_slice(&(0x6000_0000u32 | (0x12 << 20) | 0xabcde).to_be_bytes());
        g[6] = 0x1b;
        g[7] = 9;
        g[8..24].copy_from_slice(&b_gid.0);
        g[24..40].copy_from_slice(&dgid.0);
        g
    };
    let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    lock(&r.world).deliver(
        0,
        1,
        1,
        Arrival {
            grh: Some(grh(a_gid)),
            sl: 3,
            ..Arrival::mad(&m.0, 1, B_LID)
        },
    );
    r.core.poll();
    {
        let w = lock(&r.world);
        assert_eq!(w.wire.len(), 1);
        let g = w.wire[0].grh.expect("the answer carries a GRH");
        assert_eq!(g.dgid, b_gid);
        assert_eq!(g.sgid_index, 2, "the GID the request was sent to");
        assert_eq!(
            (g.flow_label, g.traffic_class, g.hop_limit),
            (0xabcde, 0x12, 0xff)
        );
    }
    // To a GID this port does not have: no answer, as in Linux.
    lock(&r.world).deliver(
        0,
        1,
        1,
        Arrival {
            grh: Some(grh(b_gid)),
            sl: 3,
            ..Arrival::mad(&m.0, 1, B_LID)
        },
    );
    r.core.poll();
    assert_eq!(lock(&r.world).wire.len(), 1);
    assert_eq!(r.core.mad_counters(r.a, 1).unwrap().send_errors, 1);
}

/// A trap of the HCA's own SMA comes to QP0 with SLID 0 (the firmware
/// hands it to the driver so): it is consumed and sent on, unchanged, to
/// the port's SM (mlx4_ib's `forward_trap`); the same MAD from the wire
/// (a real SLID) is the driver's as any other.
#[test]
fn a_trap_of_the_local_sma_is_forwarded_to_the_sm() {
    let mut r = rig();
    let mut trap = Mad::new_request(class::SUBN_LID_ROUTED, 1, method::TRAP, 0x0002, 0);
    trap.set_tid(0x0000_0001_0000_0007);
    trap.0[64..68].copy_from_slice(&[0x82, 0, 0, 1]);
    trap.0[68..70].copy_from_slice(&257u16.to_be_bytes());
    r.core.poll();
    lock(&r.world).wire.clear();
    assert!(lock(&r.world).deliver(0, 1, 0, Arrival::mad(&trap.0, 0, 0)));
    r.core.poll();
    let w = lock(&r.world);
    let sent: Vec<_> = w.wire.iter().filter(|p| p.from == (0, 1)).collect();
    assert_eq!(sent.len(), 1, "one packet");
    let sm_lid = w.hcas[0].ports[0].sm_lid;
    assert_eq!(
        (sent[0].dlid, sent[0].dest_qpn),
        (sm_lid, 0),
        "to the SM's QP0"
    );
    assert_eq!(sent[0].mad.0, trap.0, "as it came");
    drop(w);
    let c = r.core.mad_counters(r.a, 1).unwrap();
    assert_eq!((c.traps_forwarded, c.consumed), (1, 1), "{c:?}");
}

/// Found by the `mad_recv` fuzz target: a LID-routed SubnSet(PortInfo)
/// from the peer that gave B the permissive LID 0xFFFF left B unreachable
/// (B's answers to it looped back to B itself). A port's LID is unicast:
/// B's SMA refuses a multicast or permissive one and keeps its LID, and
/// its PMA answers at that LID.
#[test]
fn a_port_info_set_with_a_multicast_or_permissive_lid_is_refused() {
    let mut r = rig();
    let smi = r
        .core
        .register_mad_agent(r.a, 1, QpType::Smi, None, 0)
        .unwrap();
    let gsi = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 0)
        .unwrap();
    for bad in [0xffff_u16, 0xc000, 0xfffe] {
        let mut m = Mad::new_request(class::SUBN_LID_ROUTED, 1, method::SET, attr::PORT_INFO, 0);
        m.smp_data_mut()[16..18].copy_from_slice(&bad.to_be_bytes());
        let mut buf = MadSendBuf::new(m, to_lid(B_LID), 0);
        buf.timeout_ms = 50;
        let (done, resp) = r.core.send_mad_wait(smi, buf, WAIT).unwrap();
        assert_eq!(done.status, WcStatus::Success, "LID {bad:#x}");
        let resp = resp.expect("B's SMA answers");
        assert_eq!(
            resp.mad.status(),
            status::INVALID_ATTRIB_VALUE,
            "LID {bad:#x}"
        );
        assert_eq!(lock(&r.world).hcas[1].ports[0].lid, B_LID, "LID {bad:#x}");
    }
    let m = Mad::new_request(class::PERF_MGMT, 1, method::GET, attr::PORT_COUNTERS, 0);
    let mut buf = MadSendBuf::new(m, to_lid(B_LID), 1);
    buf.timeout_ms = 50;
    let (done, resp) = r.core.send_mad_wait(gsi, buf, WAIT).unwrap();
    assert_eq!(done.status, WcStatus::Success);
    assert!(resp.is_some(), "B's PMA answers at its LID");
}
