//! The CM end to end between the two fake HCAs, with paths from the fake SA.
//!
//! Connect, accept and disconnect with both RC QPs driven to RTS with the
//! attributes the REQ and REP carry; REJ with reason and private data; unknown
//! service; MRA; duplicate REQ (REP re-sent), stale REQ in time-wait, REP for
//! an unknown ID; a silent peer and a lost DREQ ending in their timeouts;
//! random CM MADs.

use std::time::Duration;

use hal::Clock;

use super::fake::{Arrival, lock};
use super::sa::{Rng, sa_rig};
use super::*;
use crate::cm::{self, *};
use crate::cm_msgs::*;
use crate::device::ClientId;
use crate::error::Error;
use crate::mad::*;
use crate::sa_query::{self, PathRecord, path_comp};
use crate::verbs::*;

const SID: u64 = 0x0000_0000_0001_0abc;
const T: Duration = Duration::from_secs(10);

struct CmRig {
    r: Rig,
    sa: ClientId,
    cm: ClientId,
    qp_a: Qp,
    qp_b: Qp,
}

fn rc_qp(core: &mut IbCore, dev: DeviceId) -> Qp {
    let d = core.device_mut(dev).unwrap();
    let pd = d.alloc_pd().unwrap();
    let (cq, _) = d
        .create_cq(&CqInitAttr {
            cqe: 16,
            comp_vector: 0,
        })
        .unwrap();
    d.create_qp(
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
                max_inline_data: 0,
            },
            sq_sig_type: SigType::AllWr,
            qp_type: QpType::Rc,
            create_flags: QpCreateFlags::empty(),
            port_num: 1,
        },
    )
    .unwrap()
    .0
}

fn cm_rig() -> CmRig {
    let s = sa_rig();
    let mut r = s.r;
    let cm = cm::init(&mut r.core);
    r.core.poll();
    let qp_a = rc_qp(&mut r.core, r.a);
    let qp_b = rc_qp(&mut r.core, r.b);
    CmRig {
        r,
        sa: s.sa,
        cm,
        qp_a,
        qp_b,
    }
}

impl CmRig {
    fn path(&mut self) -> PathRecord {
        sa_query::path_to_lid(&mut self.r.core, self.sa, self.r.a, 1, B_LID, T).unwrap()
    }
    fn req(&mut self) -> CmReqParam {
        let path = self.path();
        let mut p = CmReqParam::new(path, SID, self.qp_a);
        p.starting_psn = 0x11_1111;
        p.responder_resources = 4;
        p.initiator_depth = 2;
        p.retry_count = 6;
        p.rnr_retry_count = 5;
        p.private_data = b"hello from A".to_vec();
        p
    }
    fn rep(&self) -> CmRepParam {
        let mut p = CmRepParam::new(self.qp_b);
        p.starting_psn = 0x22_2222;
        p.responder_resources = 3;
        p.initiator_depth = 4;
        p.rnr_retry_count = 7;
        p.private_data = b"welcome from B".to_vec();
        p
    }
    fn wait(&mut self, id: CmId) -> CmEvent {
        cm::wait_event(&mut self.r.core, self.cm, id, T).unwrap()
    }
    fn wait_req(&mut self, listen: CmId) -> CmId {
        match self.wait(listen) {
            CmEvent::ReqReceived { id, .. } => id,
            e => panic!("expected a REQ, got {e:?}"),
        }
    }
    fn qp_state(&self, hca: usize, qp: Qp) -> QpState {
        lock(&self.r.world).hcas[hca].qps[qp.handle as usize]
            .as_ref()
            .unwrap()
            .state
    }
    fn attrs(&self, hca: usize, qp: Qp, state: QpState) -> (QpAttr, QpAttrMask) {
        lock(&self.r.world).hcas[hca]
            .qp_attr_log
            .iter()
            .rev()
            .find(|(h, a, m)| {
                *h == qp.handle && a.qp_state == state && m.contains(QpAttrMask::STATE)
            })
            .map(|(_, a, m)| (*a, *m))
            .unwrap()
    }
    /// CM MADs on the wire from `hca` with `attr`.
    fn sent(&self, hca: usize, attr: u16) -> Vec<Mad> {
        lock(&self.r.world)
            .wire
            .iter()
            .filter(|p| {
                p.from.0 == hca && p.mad.mgmt_class() == class::CM && p.mad.attr_id() == attr
            })
            .map(|p| p.mad.clone())
            .collect()
    }
    fn connect(&mut self) -> (CmId, CmId, CmId) {
        let listen = cm::listen(&mut self.r.core, self.cm, self.r.b, SID).unwrap();
        let p = self.req();
        let a = cm::send_req(&mut self.r.core, self.cm, self.r.a, 1, &p).unwrap();
        let b = self.wait_req(listen);
        let rp = self.rep();
        cm::send_rep(&mut self.r.core, self.cm, b, &rp).unwrap();
        assert!(matches!(self.wait(a), CmEvent::Established { .. }));
        assert!(matches!(self.wait(b), CmEvent::Established { .. }));
        (listen, a, b)
    }
    /// Delivers `mad` to HCA `hca`'s QP1 as if from the other HCA's QP1.
    fn inject(&mut self, hca: usize, mad: &Mad) {
        let slid = if hca == 0 { B_LID } else { A_LID };
        assert!(lock(&self.r.world).deliver(hca, 1, 1, Arrival::mad(&mad.0, 1, slid)));
    }
}

#[test]
fn connect_accept_disconnect_drive_both_qps_with_the_negotiated_attributes() {
    let mut c = cm_rig();
    let listen = cm::listen(&mut c.r.core, c.cm, c.r.b, SID).unwrap();
    assert_eq!(
        cm::listen(&mut c.r.core, c.cm, c.r.b, SID).unwrap_err(),
        Error::Conflict("service ID already listened to")
    );
    let p = c.req();
    let path = p.path;
    let a = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap();
    assert_eq!(c.qp_state(0, c.qp_a), QpState::Init);
    let (b, pd, rqpn, guid, rlid) = match c.wait(listen) {
        CmEvent::ReqReceived {
            id,
            private_data,
            remote_qpn,
            remote_ca_guid,
            remote_lid,
            ..
        } => (id, private_data, remote_qpn, remote_ca_guid, remote_lid),
        e => panic!("{e:?}"),
    };
    assert_eq!(&pd[..12], b"hello from A");
    assert_eq!(pd.len(), 92);
    assert_eq!((rqpn, guid, rlid), (c.qp_a.qp_num, A_GUID, A_LID));
    assert_eq!(cm::state(&mut c.r.core, c.cm, b), Some(CmState::ReqRcvd));
    assert_eq!(cm::state(&mut c.r.core, c.cm, a), Some(CmState::ReqSent));
    let rp = c.rep();
    cm::send_rep(&mut c.r.core, c.cm, b, &rp).unwrap();
    assert_eq!(c.qp_state(1, c.qp_b), QpState::Rtr);
    match c.wait(a) {
        CmEvent::Established { private_data } => assert_eq!(&private_data[..14], b"welcome from B"),
        e => panic!("{e:?}"),
    }
    assert!(matches!(c.wait(b), CmEvent::Established { .. }));
    assert_eq!(c.qp_state(0, c.qp_a), QpState::Rts);
    assert_eq!(c.qp_state(1, c.qp_b), QpState::Rts);
    // Comm IDs cross.
    let (ra, rqa) = cm::remote(&mut c.r.core, c.cm, a).unwrap();
    let (rb, rqb) = cm::remote(&mut c.r.core, c.cm, b).unwrap();
    assert_eq!((ra, rb), (b.local_id, a.local_id));
    assert_eq!((rqa, rqb), (c.qp_b.qp_num, c.qp_a.qp_num));

    // A's INIT/RTR/RTS.
    let (init, m) = c.attrs(0, c.qp_a, QpState::Init);
    assert_eq!(
        m,
        QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT
    );
    assert_eq!(init.port_num, 1);
    assert!(
        init.qp_access_flags
            .contains(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ)
    );
    let (rtr, _) = c.attrs(0, c.qp_a, QpState::Rtr);
    assert_eq!(rtr.dest_qp_num, c.qp_b.qp_num);
    assert_eq!(
        rtr.rq_psn, 0x11_1111,
        "A expects the PSN its REQ named (Linux)"
    );
    assert_eq!(rtr.path_mtu, Mtu::Mtu2048);
    assert_eq!(rtr.ah_attr.dlid, B_LID);
    assert_eq!(rtr.ah_attr.port_num, 1);
    assert_eq!(rtr.ah_attr.static_rate, path.rate);
    // A offered 4 responder resources, B initiates at most 4.
    assert_eq!(rtr.max_dest_rd_atomic, 4);
    let (rts, _) = c.attrs(0, c.qp_a, QpState::Rts);
    assert_eq!(rts.sq_psn, 0x22_2222, "A sends from the PSN B's REP named");
    assert_eq!(rts.retry_cnt, 6);
    assert_eq!(rts.rnr_retry, 7, "the RNR retry B asked for");
    // A initiates at most min(2, B's 3 responder resources).
    assert_eq!(rts.max_rd_atomic, 2);
    // Local ACK timeout: packet life 14 + 1, CA ACK delay 0 -> 15.
    assert_eq!(rts.timeout, 15);
    // B's.
    let (rtr, _) = c.attrs(1, c.qp_b, QpState::Rtr);
    assert_eq!(rtr.dest_qp_num, c.qp_a.qp_num);
    assert_eq!(rtr.rq_psn, 0x22_2222);
    assert_eq!(rtr.path_mtu, Mtu::Mtu2048);
    assert_eq!(rtr.ah_attr.dlid, A_LID);
    assert_eq!(rtr.max_dest_rd_atomic, 2, "B serves A's initiator depth");
    let (rts, m) = c.attrs(1, c.qp_b, QpState::Rts);
    assert_eq!(
        m,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC
    );
    assert_eq!(rts.sq_psn, 0x11_1111);
    assert_eq!(rts.retry_cnt, 6);
    assert_eq!(rts.rnr_retry, 5, "the RNR retry A asked for");
    assert_eq!(
        rts.max_rd_atomic, 4,
        "B initiates up to A's responder resources"
    );
    assert_eq!(rts.timeout, 15);
    // cm::init_qp_attr agrees with what was applied.
    let (x, _) = cm::init_qp_attr(&mut c.r.core, c.cm, b, QpState::Rts).unwrap();
    assert_eq!(x.sq_psn, 0x11_1111);

    // The messages on the wire: one REQ, one REP, one RTU.
    assert_eq!(c.sent(0, cm_attr::REQ).len(), 1);
    assert_eq!(c.sent(1, cm_attr::REP).len(), 1);
    assert_eq!(c.sent(0, cm_attr::RTU).len(), 1);
    let req = CmReq::unpack(&c.sent(0, cm_attr::REQ)[0]);
    assert_eq!(
        (req.primary.local_lid, req.primary.remote_lid),
        (A_LID, B_LID)
    );
    assert_eq!(
        (req.service_id, req.local_qpn, req.path_mtu),
        (SID, c.qp_a.qp_num, 4)
    );

    // Disconnect from A.
    cm::send_dreq(&mut c.r.core, c.cm, a, b"bye").unwrap();
    match c.wait(b) {
        CmEvent::Disconnected {
            private_data,
            by_peer,
            dreq_timed_out,
        } => {
            assert_eq!(&private_data[..3], b"bye");
            assert!(by_peer && !dreq_timed_out);
        }
        e => panic!("{e:?}"),
    }
    match c.wait(a) {
        CmEvent::Disconnected {
            by_peer,
            dreq_timed_out,
            ..
        } => assert!(!by_peer && !dreq_timed_out),
        e => panic!("{e:?}"),
    }
    assert_eq!(c.qp_state(0, c.qp_a), QpState::Err);
    assert_eq!(c.qp_state(1, c.qp_b), QpState::Err);
    assert_eq!(cm::state(&mut c.r.core, c.cm, a), Some(CmState::Timewait));
    // Time-wait ends.
    c.r.core
        .poll_until(Duration::from_secs(2), |core| {
            (cm::state(core, c.cm, a) == Some(CmState::Idle)).then_some(())
        })
        .unwrap();
    for id in [a, b, listen] {
        cm::destroy_id(&mut c.r.core, c.cm, id).unwrap();
    }
}

#[test]
fn under_lmc_the_passive_side_answers_from_the_lid_it_was_called_on() {
    let mut c = cm_rig();
    // B's port has four LIDs, B_LID to B_LID + 3; A calls the last one.
    lock(&c.r.world).hcas[1].ports[0].lmc = 2;
    c.r.core.device_mut(c.r.b).unwrap().cache_update(1).unwrap();
    let listen = cm::listen(&mut c.r.core, c.cm, c.r.b, SID).unwrap();
    let mut p = c.req();
    p.path.dlid = B_LID + 3;
    let a = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap();
    let b = c.wait_req(listen);
    let rp = c.rep();
    cm::send_rep(&mut c.r.core, c.cm, b, &rp).unwrap();
    assert!(matches!(c.wait(a), CmEvent::Established { .. }));
    assert!(matches!(c.wait(b), CmEvent::Established { .. }));
    let req = CmReq::unpack(&c.sent(0, cm_attr::REQ)[0]);
    assert_eq!(
        (req.primary.local_lid, req.primary.remote_lid),
        (A_LID, B_LID + 3)
    );
    let (rtr, _) = c.attrs(0, c.qp_a, QpState::Rtr);
    assert_eq!(
        (rtr.ah_attr.dlid, rtr.ah_attr.src_path_bits),
        (B_LID + 3, 0)
    );
    // B's connection leaves from B_LID + 3 (Linux: the path reversed from
    // the REQ has the called LID as its SLID), so A sees the LID it called.
    let (rtr, _) = c.attrs(1, c.qp_b, QpState::Rtr);
    assert_eq!(
        (rtr.ah_attr.dlid, rtr.ah_attr.src_path_bits),
        (A_LID, 3),
        "the passive side answers from the LID it was called on"
    );
}

#[test]
fn reject_with_reason_and_private_data() {
    let mut c = cm_rig();
    let listen = cm::listen(&mut c.r.core, c.cm, c.r.b, SID).unwrap();
    let p = c.req();
    let a = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap();
    let b = c.wait_req(listen);
    cm::send_rej(
        &mut c.r.core,
        c.cm,
        b,
        rej_reason::CONSUMER_DEFINED,
        &[1, 2, 3],
        b"go away",
    )
    .unwrap();
    match c.wait(a) {
        CmEvent::Rejected {
            reason,
            ari,
            private_data,
        } => {
            assert_eq!(reason, rej_reason::CONSUMER_DEFINED);
            assert_eq!(ari, vec![1, 2, 3]);
            assert_eq!(&private_data[..7], b"go away");
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(cm::state(&mut c.r.core, c.cm, a), Some(CmState::Idle));
    // The REQ's retries stop: no second REQ after its timeout.
    let _ = c.r.core.poll_until(Duration::from_secs(10), |_| None::<()>);
    assert_eq!(c.sent(0, cm_attr::REQ).len(), 1);
    // One-call connect reports the REJ as ECONNREFUSED.
    let p = c.req();
    let mut p2 = p.clone();
    p2.service_id = SID + 1;
    let e = cm::connect(&mut c.r.core, c.cm, c.r.a, 1, &p2, T).unwrap_err();
    assert_eq!(e, Error::Errno(ECONNREFUSED));
    let rej = CmRej::unpack(c.sent(1, cm_attr::REJ).last().unwrap());
    assert_eq!(rej.reason, rej_reason::INVALID_SERVICE_ID);
    assert_eq!(rej.msg_rejected, msg_response::REQ);
}

#[test]
fn mra_keeps_the_active_side_waiting_past_its_timeout() {
    let mut c = cm_rig();
    let listen = cm::listen(&mut c.r.core, c.cm, c.r.b, SID).unwrap();
    let mut p = c.req();
    p.remote_cm_response_timeout = 16; // 256 ms
    p.max_cm_retries = 1;
    let a = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap();
    let b = c.wait_req(listen);
    cm::send_mra(&mut c.r.core, c.cm, b, 21, b"wait").unwrap(); // ~8.6 s
    assert!(matches!(
        c.wait(a),
        CmEvent::MraReceived {
            service_timeout: 21
        }
    ));
    assert_eq!(cm::state(&mut c.r.core, c.cm, a), Some(CmState::MraReqRcvd));
    // Far beyond 2 * 256 ms (the REQ's own retries), still waiting.
    let _ = c.r.core.poll_until(Duration::from_secs(3), |_| None::<()>);
    assert_eq!(cm::state(&mut c.r.core, c.cm, a), Some(CmState::MraReqRcvd));
    assert!(cm::get_event(&mut c.r.core, c.cm, a).is_none());
    let rp = c.rep();
    cm::send_rep(&mut c.r.core, c.cm, b, &rp).unwrap();
    assert!(matches!(c.wait(a), CmEvent::Established { .. }));
}

#[test]
fn duplicate_req_resends_the_rep_and_a_stale_one_is_rejected() {
    let mut c = cm_rig();
    let listen = cm::listen(&mut c.r.core, c.cm, c.r.b, SID).unwrap();
    let p = c.req();
    let a = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap();
    let b = c.wait_req(listen);
    let req = c.sent(0, cm_attr::REQ)[0].clone();
    // While B considers it: the duplicate is dropped (no new listener
    // event, no answer).
    c.inject(1, &req);
    c.r.core.poll();
    assert!(cm::get_event(&mut c.r.core, c.cm, listen).is_none());
    assert_eq!(
        c.sent(1, cm_attr::REP).len() + c.sent(1, cm_attr::REJ).len(),
        0
    );
    // After the REP: the duplicate makes B send the REP again.
    let rp = c.rep();
    cm::send_rep(&mut c.r.core, c.cm, b, &rp).unwrap();
    c.inject(1, &req);
    assert!(matches!(c.wait(a), CmEvent::Established { .. }));
    assert!(matches!(c.wait(b), CmEvent::Established { .. }));
    let reps = c.sent(1, cm_attr::REP);
    assert_eq!(reps.len(), 2);
    assert_eq!(reps[0].0[24..], reps[1].0[24..]);
    // A got the second REP while established: its RTU was lost, so the
    // RTU goes again.
    assert_eq!(c.sent(0, cm_attr::RTU).len(), 2);
    let counters = cm::counters(&mut c.r.core, c.cm, c.r.b).unwrap();
    assert_eq!(counters.duplicates, 2);
    // Disconnect; in time-wait the old REQ is a stale connection.
    cm::send_dreq(&mut c.r.core, c.cm, a, &[]).unwrap();
    assert!(matches!(c.wait(b), CmEvent::Disconnected { .. }));
    assert_eq!(cm::state(&mut c.r.core, c.cm, b), Some(CmState::Timewait));
    c.inject(1, &req);
    c.r.core.poll();
    let rej = CmRej::unpack(c.sent(1, cm_attr::REJ).last().unwrap());
    assert_eq!(rej.reason, rej_reason::STALE_CONN);
    assert_eq!(rej.remote_comm_id, a.local_id);
    // A new REQ from the same QP (new comm ID) while B still holds it in
    // time-wait: stale too.
    let mut req2 = req.clone();
    req2.0[24..28].copy_from_slice(&0x0bad_0001u32.to_be_bytes());
    c.inject(1, &req2);
    c.r.core.poll();
    let rej = CmRej::unpack(c.sent(1, cm_attr::REJ).last().unwrap());
    assert_eq!(
        (rej.reason, rej.remote_comm_id),
        (rej_reason::STALE_CONN, 0x0bad_0001)
    );
    assert!(cm::get_event(&mut c.r.core, c.cm, listen).is_none());
}

#[test]
fn rep_for_an_unknown_comm_id_is_rejected_with_invalid_comm_id() {
    let mut c = cm_rig();
    let rep = CmRep {
        local_comm_id: 0x1234_5678,
        remote_comm_id: 0xdead_beef,
        local_qpn: 0x99,
        local_ca_guid: B_GUID,
        ..CmRep::default()
    };
    c.inject(0, &rep.pack().unwrap());
    c.r.core.poll();
    let rejs = c.sent(0, cm_attr::REJ);
    assert_eq!(rejs.len(), 1);
    let rej = CmRej::unpack(&rejs[0]);
    assert_eq!(rej.reason, rej_reason::INVALID_COMM_ID);
    assert_eq!(rej.msg_rejected, msg_response::REP);
    assert_eq!(
        (rej.local_comm_id, rej.remote_comm_id),
        (0xdead_beef, 0x1234_5678)
    );
    assert_eq!(
        cm::counters(&mut c.r.core, c.cm, c.r.a).unwrap().unknown_id,
        1
    );
    // An RTU or DREP for nothing is dropped; a DREQ for nothing still gets
    // a DREP.
    let ids = CmIds {
        local_comm_id: 1,
        remote_comm_id: 2,
        remote_qpn: 3,
        private_data: vec![],
    };
    c.inject(0, &ids.pack(cm_attr::RTU).unwrap());
    c.inject(0, &ids.pack(cm_attr::DREP).unwrap());
    c.inject(0, &ids.pack(cm_attr::DREQ).unwrap());
    c.r.core.poll();
    assert_eq!(c.sent(0, cm_attr::DREP).len(), 1);
    assert_eq!(c.sent(0, cm_attr::REJ).len(), 1);
    // LAP is answered with APR "unsupported" (and no REJ).
    let mut lap = cm_mad(cm_attr::LAP);
    lap.0[24..28].copy_from_slice(&5u32.to_be_bytes());
    lap.0[28..32].copy_from_slice(&6u32.to_be_bytes());
    c.inject(0, &lap);
    c.r.core.poll();
    let apr = c.sent(0, cm_attr::APR);
    assert_eq!(apr.len(), 1);
    assert_eq!(
        &apr[0].0[24..34],
        &[0, 0, 0, 6, 0, 0, 0, 5, 0, IB_CM_APR_UNSUPPORTED]
    );
    assert_eq!(c.sent(0, cm_attr::REJ).len(), 1);
}

#[test]
fn a_peer_that_never_answers_times_out_after_its_retries() {
    let mut c = cm_rig();
    let mut p = c.req();
    p.path.dlid = 99; // nobody
    p.path.packet_life_time = 14; // 64 ms
    p.remote_cm_response_timeout = 16; // 256 ms
    p.max_cm_retries = 3;
    let per_try = 2 * 64 + 256;
    let t0 = c.r.clock.now_ns();
    let e = cm::connect(&mut c.r.core, c.cm, c.r.a, 1, &p, T).unwrap_err();
    let took = Duration::from_nanos(c.r.clock.now_ns() - t0);
    assert_eq!(e, Error::TimedOut);
    let budget = Duration::from_millis(4 * per_try);
    assert!(took >= budget, "gave up early: {took:?}");
    assert!(
        took < budget + Duration::from_millis(50),
        "too late: {took:?}"
    );
    assert_eq!(c.sent(0, cm_attr::REQ).len(), 4, "first try + 3 retries");
    assert_eq!(
        cm::counters(&mut c.r.core, c.cm, c.r.a).unwrap().timeouts,
        1
    );
}

#[test]
fn a_lost_dreq_ends_in_the_drep_timeout() {
    let mut c = cm_rig();
    let (_, a, b) = c.connect();
    lock(&c.r.world).drop_next = 1000;
    c.r.clock.set_relax_step(Duration::from_millis(5));
    let t0 = c.r.clock.now_ns();
    cm::send_dreq(&mut c.r.core, c.cm, a, &[]).unwrap();
    // Each try waits 2 * 64 ms (packet life 14) + 4096 ms (the REQ's
    // remote response timeout 20); 15 retries.
    let budget = Duration::from_millis(16 * (2 * 64 + 4096));
    let ev = cm::wait_event(&mut c.r.core, c.cm, a, budget + Duration::from_secs(1)).unwrap();
    let took = Duration::from_nanos(c.r.clock.now_ns() - t0);
    assert!(
        took >= budget && took < budget + Duration::from_millis(100),
        "{took:?}"
    );
    match ev {
        CmEvent::Disconnected {
            dreq_timed_out,
            by_peer,
            private_data,
        } => {
            assert!(dreq_timed_out && !by_peer);
            assert!(private_data.is_empty());
        }
        e => panic!("{e:?}"),
    }
    // REQ's max CM retries (15) + 1 DREQs, all lost.
    assert_eq!(c.sent(0, cm_attr::DREQ).len(), 16);
    assert_eq!(cm::state(&mut c.r.core, c.cm, a), Some(CmState::Timewait));
    assert_eq!(c.qp_state(0, c.qp_a), QpState::Err);
    // B never heard of it.
    assert_eq!(
        cm::state(&mut c.r.core, c.cm, b),
        Some(CmState::Established)
    );
}

#[test]
fn destroying_an_established_id_sends_a_dreq() {
    let mut c = cm_rig();
    let (_, a, b) = c.connect();
    cm::destroy_id(&mut c.r.core, c.cm, a).unwrap();
    assert!(matches!(
        c.wait(b),
        CmEvent::Disconnected { by_peer: true, .. }
    ));
    assert_eq!(cm::get_event(&mut c.r.core, c.cm, a), None);
    assert_eq!(
        cm::destroy_id(&mut c.r.core, c.cm, a).unwrap_err(),
        Error::NotFound
    );
    // Waiting on a destroyed ID says so at once.
    assert_eq!(
        cm::wait_event(&mut c.r.core, c.cm, a, T).unwrap_err(),
        Error::NotFound
    );
}

#[test]
fn fuzz_random_cm_mads_never_panic() {
    let mut c = cm_rig();
    let (listen, a, b) = c.connect();
    let ids = [a.local_id, b.local_id, listen.local_id, 0, 0xffff_ffff];
    let mut rng = Rng(0xc0ff_ee00_1234_5678);
    let req = c.sent(0, cm_attr::REQ)[0].clone();
    let templates: Vec<Mad> = vec![
        req,
        c.sent(1, cm_attr::REP)[0].clone(),
        c.sent(0, cm_attr::RTU)[0].clone(),
        CmIds::default().pack(cm_attr::DREQ).unwrap(),
        CmIds::default().pack(cm_attr::DREP).unwrap(),
        CmRej::default().pack().unwrap(),
        CmMra::default().pack().unwrap(),
        cm_mad(cm_attr::LAP),
        cm_mad(cm_attr::SIDR_REQ),
    ];
    lock(&c.r.world).capture = false;
    let n = 100_000;
    for i in 0..n {
        let mut m = templates[rng.below(templates.len() as u64) as usize].clone();
        // Known IDs in the ID fields half the time, random bytes elsewhere.
        if rng.below(2) == 0 {
            let x = ids[rng.below(ids.len() as u64) as usize];
            m.0[24..28].copy_from_slice(&x.to_be_bytes());
        }
        if rng.below(2) == 0 {
            let x = ids[rng.below(ids.len() as u64) as usize];
            m.0[28..32].copy_from_slice(&x.to_be_bytes());
        }
        for _ in 0..rng.below(6) {
            let at = rng.below(256) as usize;
            m.0[at] = rng.next() as u8;
        }
        let dev = if rng.below(2) == 0 { c.r.a } else { c.r.b };
        let r = MadRecvWc {
            wc: Wc {
                slid: if dev == c.r.a { B_LID } else { A_LID },
                src_qp: 1,
                port_num: 1,
                ..Wc::default()
            },
            grh: None,
            mad: m,
            port: 1,
            send_id: None,
            rmpp_data: None,
        };
        crate::cm::cm_inject_for_fuzz(&mut c.r.core, c.cm, dev, &r);
        if i % 64 == 0 {
            c.r.core.poll();
            // Drain the events so queues stay small.
            for id in [listen, a, b] {
                while cm::get_event(&mut c.r.core, c.cm, id).is_some() {}
            }
        }
    }
    // The CM still works: a fresh connection on new QPs.
    lock(&c.r.world).capture = true;
    lock(&c.r.world).wire.clear();
    c.qp_a = rc_qp(&mut c.r.core, c.r.a);
    c.qp_b = rc_qp(&mut c.r.core, c.r.b);
    let l2 = cm::listen(&mut c.r.core, c.cm, c.r.b, SID + 7).unwrap();
    let mut p = c.req();
    p.service_id = SID + 7;
    let a2 = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap();
    let b2 = loop {
        match c.wait(l2) {
            CmEvent::ReqReceived { id, remote_qpn, .. } if remote_qpn == c.qp_a.qp_num => break id,
            _ => continue,
        }
    };
    let rp = c.rep();
    cm::send_rep(&mut c.r.core, c.cm, b2, &rp).unwrap();
    assert!(matches!(c.wait(a2), CmEvent::Established { .. }));
}

#[test]
fn an_active_side_that_gives_up_rejects_with_timeout_and_its_guid() {
    let mut c = cm_rig();
    let listen = cm::listen(&mut c.r.core, c.cm, c.r.b, SID).unwrap();
    let p = c.req();
    let a = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap();
    let b = c.wait_req(listen);
    cm::destroy_id(&mut c.r.core, c.cm, a).unwrap();
    match c.wait(b) {
        CmEvent::Rejected { reason, ari, .. } => {
            assert_eq!(reason, rej_reason::TIMEOUT);
            assert_eq!(ari, A_GUID.to_be_bytes().to_vec());
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(cm::state(&mut c.r.core, c.cm, b), Some(CmState::Idle));
    let rej = CmRej::unpack(&c.sent(0, cm_attr::REJ)[0]);
    assert_eq!(
        (rej.local_comm_id, rej.msg_rejected),
        (a.local_id, msg_response::OTHER)
    );
    // The passive side's own REJ of a REQ carries no local ID (as Linux).
    let mut p2 = c.req();
    p2.qp = rc_qp(&mut c.r.core, c.r.a);
    let a2 = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p2).unwrap();
    let b2 = c.wait_req(listen);
    cm::send_rej(&mut c.r.core, c.cm, b2, rej_reason::NO_QP, &[], &[]).unwrap();
    assert!(matches!(
        c.wait(a2),
        CmEvent::Rejected {
            reason: rej_reason::NO_QP,
            ..
        }
    ));
    let rej = CmRej::unpack(c.sent(1, cm_attr::REJ).last().unwrap());
    assert_eq!((rej.local_comm_id, rej.remote_comm_id), (0, a2.local_id));
}

/// Figures, not a pass/fail: host time per SA PathRecord query and per CM
/// connect + accept + disconnect over the fake (release build:
/// `cargo test -p ib_core --release --lib bench_sa_and_cm -- --ignored --nocapture`).
#[test]
#[ignore]
fn bench_sa_and_cm() {
    let mut c = cm_rig();
    lock(&c.r.world).capture = false;
    let n = 2000u32;
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        let id = sa_query::path_rec_get(
            &mut c.r.core,
            c.sa,
            c.r.a,
            1,
            &PathRecord {
                dlid: B_LID,
                ..PathRecord::default()
            },
            path_comp::DLID,
            T,
        )
        .unwrap();
        sa_query::wait(&mut c.r.core, c.sa, id, T).unwrap();
    }
    let sa = t0.elapsed() / n;
    let listen = cm::listen(&mut c.r.core, c.cm, c.r.b, SID).unwrap();
    let path = c.path();
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        let qa = rc_qp(&mut c.r.core, c.r.a);
        let qb = rc_qp(&mut c.r.core, c.r.b);
        let p = CmReqParam::new(path, SID, qa);
        let a = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap();
        let b = c.wait_req(listen);
        cm::send_rep(&mut c.r.core, c.cm, b, &CmRepParam::new(qb)).unwrap();
        assert!(matches!(c.wait(a), CmEvent::Established { .. }));
        assert!(matches!(c.wait(b), CmEvent::Established { .. }));
        cm::send_dreq(&mut c.r.core, c.cm, a, &[]).unwrap();
        assert!(matches!(c.wait(a), CmEvent::Disconnected { .. }));
        assert!(matches!(c.wait(b), CmEvent::Disconnected { .. }));
        cm::destroy_id(&mut c.r.core, c.cm, a).unwrap();
        cm::destroy_id(&mut c.r.core, c.cm, b).unwrap();
        // The QPs are kept: a reused QPN would meet its old connection in
        // time-wait and be refused as stale, as it should.
    }
    let cm = t0.elapsed() / n;
    println!(
        "SA PathRecord query (fake wire, one port to the other): {:.1} us; \
         CM REQ/REP/RTU + DREQ/DREP with 4 QP transitions per side: {:.1} us",
        sa.as_secs_f64() * 1e6,
        cm.as_secs_f64() * 1e6
    );
}

#[test]
fn bad_arguments_are_refused_with_clear_errors() {
    let mut c = cm_rig();
    let good = c.req();
    let mut p = good.clone();
    p.private_data = vec![0; 93];
    assert_eq!(
        cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap_err(),
        Error::MsgSize
    );
    let mut p = good.clone();
    p.path.mtu = 0;
    assert!(matches!(
        cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p),
        Err(Error::Invalid(_))
    ));
    let mut p = good.clone();
    p.path.pkey = 0x1234;
    assert!(matches!(
        cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p),
        Err(Error::Invalid(_))
    ));
    let mut p = good.clone();
    p.path.packet_life_time = 255;
    p.remote_cm_response_timeout = 255;
    p.max_cm_retries = 255;
    p.path.dlid = 99;
    // Absurd values are cut to their field widths, never overflow.
    let id = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap();
    cm::destroy_id(&mut c.r.core, c.cm, id).unwrap();
    assert!(cm::send_req(&mut c.r.core, c.cm, c.r.a, 9, &good).is_err());
    // Calls in the wrong state.
    let (_, a, _) = c.connect();
    assert!(matches!(
        cm::send_rep(&mut c.r.core, c.cm, a, &CmRepParam::new(c.qp_a)),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        cm::send_rej(&mut c.r.core, c.cm, a, rej_reason::NO_QP, &[], &[]),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        cm::send_mra(&mut c.r.core, c.cm, a, 20, &[]),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        cm::init_qp_attr(&mut c.r.core, c.cm, a, QpState::Sqd),
        Err(Error::Invalid(_))
    ));
    let gone = CmId {
        dev: c.r.a,
        local_id: 0x7777,
    };
    assert_eq!(
        cm::send_dreq(&mut c.r.core, c.cm, gone, &[]).unwrap_err(),
        Error::NotFound
    );
    // The SA refuses a port it does not have.
    assert!(sa_query::path_to_lid(&mut c.r.core, c.sa, c.r.a, 3, B_LID, T).is_err());
}

#[test]
fn a_lost_rtu_is_made_up_for_by_the_first_packet() {
    let mut c = cm_rig();
    let listen = cm::listen(&mut c.r.core, c.cm, c.r.b, SID).unwrap();
    let p = c.req();
    let a = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap();
    let b = c.wait_req(listen);
    let rp = c.rep();
    cm::send_rep(&mut c.r.core, c.cm, b, &rp).unwrap();
    // The REP is on its way; the RTU that answers it is lost.
    lock(&c.r.world).drop_next = 1;
    assert!(matches!(c.wait(a), CmEvent::Established { .. }));
    assert_eq!(c.sent(0, cm_attr::RTU).len(), 1);
    c.r.core.poll();
    assert_eq!(cm::state(&mut c.r.core, c.cm, b), Some(CmState::RepSent));
    assert_eq!(c.qp_state(1, c.qp_b), QpState::Rtr);
    // The first data packet on B's QP: the provider reports COMM_EST.
    lock(&c.r.world).hcas[1].events.push_back(Event {
        event: EventType::CommEst,
        element: EventElement::Qp(c.qp_b),
    });
    // At once, not after the REP's retry (4.2 s) brought a second RTU.
    let ev = cm::wait_event(&mut c.r.core, c.cm, b, Duration::from_millis(500)).unwrap();
    assert!(matches!(ev, CmEvent::Established { .. }));
    assert_eq!(c.sent(0, cm_attr::RTU).len(), 1);
    assert_eq!(c.qp_state(1, c.qp_b), QpState::Rts);
    // The REP is not re-sent any more.
    let reps = c.sent(1, cm_attr::REP).len();
    let _ = c.r.core.poll_until(Duration::from_secs(10), |_| None::<()>);
    assert_eq!(c.sent(1, cm_attr::REP).len(), reps);
    assert!(cm::notify(&mut c.r.core, c.cm, b).is_err());
}

#[test]
fn a_req_for_a_gid_or_pkey_this_port_lacks_is_rejected_invalid_gid() {
    let mut c = cm_rig();
    let listen = cm::listen(&mut c.r.core, c.cm, c.r.b, SID).unwrap();
    let p = c.req();
    let mut req = CmReq::unpack(
        &CmReq {
            local_comm_id: 0x0101_0101,
            service_id: SID,
            local_ca_guid: A_GUID,
            local_qpn: 0x77,
            pkey: 0xffff,
            path_mtu: 4,
            primary: crate::cm_msgs::CmReqPath {
                local_lid: A_LID,
                remote_lid: B_LID,
                local_gid: p.path.sgid,
                remote_gid: Gid::new(1, 2),
                subnet_local: true,
                ..Default::default()
            },
            ..CmReq::default()
        }
        .pack()
        .unwrap(),
    );
    c.inject(1, &req.pack().unwrap());
    c.r.core.poll();
    let rej = CmRej::unpack(c.sent(1, cm_attr::REJ).last().unwrap());
    assert_eq!(rej.reason, rej_reason::INVALID_GID);
    assert_eq!((rej.local_comm_id, rej.remote_comm_id), (0, 0x0101_0101));
    assert_eq!(rej.ari, super::sa::b_gid().0.to_vec());
    // The right GID but a P_Key the port lacks: the same.
    req.primary.remote_gid = super::sa::b_gid();
    req.pkey = 0x1234;
    req.local_comm_id = 0x0202_0202;
    c.inject(1, &req.pack().unwrap());
    c.r.core.poll();
    let rej = CmRej::unpack(c.sent(1, cm_attr::REJ).last().unwrap());
    assert_eq!(
        (rej.reason, rej.remote_comm_id),
        (rej_reason::INVALID_GID, 0x0202_0202)
    );
    assert!(cm::get_event(&mut c.r.core, c.cm, listen).is_none());
    // Both right: the listener hears of it.
    req.pkey = 0xffff;
    req.local_comm_id = 0x0303_0303;
    c.inject(1, &req.pack().unwrap());
    c.r.core.poll();
    assert!(matches!(
        cm::get_event(&mut c.r.core, c.cm, listen),
        Some(CmEvent::ReqReceived {
            remote_qpn: 0x77,
            ..
        })
    ));
}

#[test]
fn one_call_connect_and_accept_exchange_private_data() {
    // The REQ goes out first; the server takes it and accepts in one call
    // (perftest-style tools trade rkey and address this way).
    let mut c = cm_rig();
    let listen = cm::listen(&mut c.r.core, c.cm, c.r.b, SID).unwrap();
    let mut p = c.req();
    p.private_data = b"rkey=0x1234 addr=0x10000".to_vec();
    let a = cm::send_req(&mut c.r.core, c.cm, c.r.a, 1, &p).unwrap();
    let mut rp = c.rep();
    rp.private_data = b"rkey=0x5678 addr=0x20000".to_vec();
    let (b, req_pd) = cm::accept(&mut c.r.core, c.cm, listen, &rp, T).unwrap();
    assert_eq!(&req_pd[..24], b"rkey=0x1234 addr=0x10000");
    match c.wait(a) {
        CmEvent::Established { private_data } => {
            assert_eq!(&private_data[..24], b"rkey=0x5678 addr=0x20000")
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(
        cm::state(&mut c.r.core, c.cm, b),
        Some(CmState::Established)
    );
    // Nobody calls: accept gives up at its deadline.
    let t0 = c.r.clock.now_ns();
    let e = cm::accept(&mut c.r.core, c.cm, listen, &rp, Duration::from_secs(1)).unwrap_err();
    assert_eq!(e, Error::TimedOut);
    assert!(c.r.clock.now_ns() - t0 < 1_100_000_000);
}

#[test]
fn a_second_cm_user_shares_the_one_cm() {
    // Two tools in one kernel (a perftest run, then the remote-memory
    // server) each call cm::init: both get the one CM, whose MAD agent
    // owns the CM class on QP1, and both can listen and connect.
    let mut c = cm_rig();
    let first = c.cm;
    let l1 = cm::listen(&mut c.r.core, first, c.r.b, SID).unwrap();
    let p = c.req();
    cm::send_req(&mut c.r.core, first, c.r.a, 1, &p).unwrap();
    let rp = c.rep();
    cm::accept(&mut c.r.core, first, l1, &rp, T).unwrap();
    let second = cm::init(&mut c.r.core);
    assert_eq!(second, first, "one CM per core");
    let l2 = cm::listen(&mut c.r.core, second, c.r.b, SID + 1).unwrap();
    c.qp_a = rc_qp(&mut c.r.core, c.r.a);
    c.qp_b = rc_qp(&mut c.r.core, c.r.b);
    let mut p = c.req();
    p.service_id = SID + 1;
    let a = cm::send_req(&mut c.r.core, second, c.r.a, 1, &p).unwrap();
    let rp = c.rep();
    cm::accept(&mut c.r.core, second, l2, &rp, T).unwrap();
    match c.wait(a) {
        CmEvent::Established { .. } => {}
        e => panic!("{e:?}"),
    }
}

#[test]
fn clients_registered_before_the_devices_work_too() {
    // Kernel order (as Linux's module load): SA and CM first, then the HCAs.
    use std::sync::{Arc, Mutex};
    let w = fake::world();
    let da = fake::add_hca(&w, "fake_a", A_GUID, 1, A_LID);
    let db = fake::add_hca(&w, "fake_b", B_GUID, 1, B_LID);
    fake::cable(&w, (0, 1), (1, 1));
    for h in lock(&w).hcas.iter_mut() {
        h.ports[0].sm_lid = B_LID;
    }
    let clock = Arc::new(hal::fake::FakeClock::with_relax_step(
        Duration::from_micros(50),
    ));
    let mut core = IbCore::new(clock);
    let sa = sa_query::init(&mut core);
    let cm = cm::init(&mut core);
    let st = Arc::new(Mutex::new(super::sa::FakeSaState {
        lids: vec![(super::sa::a_gid(), A_LID), (super::sa::b_gid(), B_LID)],
        ..Default::default()
    }));
    core.register_client(Box::new(super::sa::FakeSa {
        dev: DeviceId(1),
        port: 1,
        agent: None,
        st,
    }));
    let a = core.register_device(Box::new(da)).unwrap();
    let b = core.register_device(Box::new(db)).unwrap();
    core.poll();
    let path = sa_query::path_to_lid(&mut core, sa, a, 1, B_LID, T).unwrap();
    let listen = cm::listen(&mut core, cm, b, SID).unwrap();
    let qa = rc_qp(&mut core, a);
    let qb = rc_qp(&mut core, b);
    let id = cm::send_req(&mut core, cm, a, 1, &CmReqParam::new(path, SID, qa)).unwrap();
    let (_, _) = cm::accept(&mut core, cm, listen, &CmRepParam::new(qb), T).unwrap();
    assert!(matches!(
        cm::wait_event(&mut core, cm, id, T).unwrap(),
        CmEvent::Established { .. }
    ));
}
