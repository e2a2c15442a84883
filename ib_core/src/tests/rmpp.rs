//! RMPP reassembly: an SA GetTable answered in several segments, ACKs opening the window, duplicates, bad segments, stalled transfers, and the cap on transfers put together at once.

use std::time::Duration;

use super::fake::lock;
use super::*;
use crate::mad::*;
use crate::mad_rmpp::*;
use crate::verbs::*;

const GET_TABLE_RESP: u8 = 0x92;

struct Sa {
    client: MadAgent,
    server: MadAgent,
}

fn sa(r: &mut Rig) -> Sa {
    let client = r
        .core
        .register_mad_agent(r.a, 1, QpType::Gsi, None, 1)
        .unwrap();
    let server = r
        .core
        .register_mad_agent(
            r.b,
            1,
            QpType::Gsi,
            Some(MadRegReq::new(class::SUBN_ADM, 2, &[method::GET_TABLE])),
            0,
        )
        .unwrap();
    Sa { client, server }
}

fn ask(r: &mut Rig, s: &Sa) -> (MadSendId, Box<MadRecvWc>) {
    let m = Mad::new_request(class::SUBN_ADM, 2, method::GET_TABLE, 0x35, 0);
    let mut buf = MadSendBuf::new(
        m,
        AhAttr {
            dlid: B_LID,
            port_num: 1,
            ..AhAttr::default()
        },
        1,
    );
    buf.timeout_ms = 100;
    let id = r.core.post_send_mad(s.client, buf).unwrap();
    let server = s.server;
    let req = r
        .core
        .poll_until(Duration::from_secs(1), |c| match c.mad_poll_agent(server) {
            Some(MadEvent::Recv(rw)) => Some(rw),
            _ => None,
        })
        .unwrap();
    (id, req)
}

/// Segment `i` of `n` of the answer to `req`, 200 data bytes each (the last
/// `last_len`), byte k of the whole message being `k as u8`.
fn segment(req: &MadRecvWc, i: u32, n: u32, last_len: usize) -> Mad {
    let mut m = req.mad.clone();
    m.set_method(GET_TABLE_RESP);
    let mut flags = rmpp_flag::ACTIVE;
    if i == 1 {
        flags |= rmpp_flag::FIRST;
    }
    if i == n {
        flags |= rmpp_flag::LAST;
    }
    let paylen = if i == 1 {
        (n - 1) * 220 + 20 + last_len as u32
    } else if i == n {
        20 + last_len as u32
    } else {
        0
    };
    RmppHdr {
        version: 1,
        rtype: rmpp_type::DATA,
        flags,
        status: 0,
        seg_num: i,
        paylen_newwin: paylen,
    }
    .write(&mut m);
    for k in 0..200 {
        m.0[56 + k] = ((i as usize - 1) * 200 + k) as u8;
    }
    m
}

fn send_seg(r: &mut Rig, s: &Sa, req: &MadRecvWc, m: Mad) {
    let ah = crate::agent::init_ah_from_wc(r.core.device(r.b).unwrap(), 1, &req.wc, None).unwrap();
    r.core
        .post_send_mad(s.server, MadSendBuf::new(m, ah, req.wc.src_qp))
        .unwrap();
    r.core.poll();
    r.core.poll();
}

/// The ACKs (and ABORTs) the server got, as (type, status, seg_num, newwin).
fn acks(r: &mut Rig, s: &Sa) -> Vec<(u8, u8, u32, u32)> {
    let mut v = Vec::new();
    while let Some(e) = r.core.mad_poll_agent(s.server) {
        if let MadEvent::Recv(rw) = e {
            assert_eq!(
                rw.mad.method(),
                method::GET_TABLE,
                "ACKs flip the response bit"
            );
            let h = RmppHdr::read(&rw.mad);
            v.push((h.rtype, h.status, h.seg_num, h.paylen_newwin));
        }
    }
    v
}

#[test]
fn a_get_table_answer_in_five_segments_is_put_together() {
    let mut r = rig();
    let s = sa(&mut r);
    let (id, req) = ask(&mut r, &s);
    send_seg(&mut r, &s, &req, segment(&req, 1, 5, 150));
    // The first segment is acknowledged with a window of 1 + 512/8.
    assert_eq!(acks(&mut r, &s), [(rmpp_type::ACK, 0, 1, 65)]);
    send_seg(&mut r, &s, &req, segment(&req, 2, 5, 150));
    // A duplicate is acknowledged again, a segment out of order dropped.
    send_seg(&mut r, &s, &req, segment(&req, 2, 5, 150));
    assert_eq!(acks(&mut r, &s), [(rmpp_type::ACK, 0, 2, 65)]);
    send_seg(&mut r, &s, &req, segment(&req, 4, 5, 150));
    assert!(acks(&mut r, &s).is_empty());
    assert!(
        r.core.mad_poll_agent(s.client).is_none(),
        "nothing before the end"
    );
    // Time passes beyond the request's 100 ms: the transfer keeps it alive.
    r.clock.advance(Duration::from_millis(80));
    send_seg(&mut r, &s, &req, segment(&req, 3, 5, 150));
    r.clock.advance(Duration::from_millis(80));
    send_seg(&mut r, &s, &req, segment(&req, 4, 5, 150));
    send_seg(&mut r, &s, &req, segment(&req, 5, 5, 150));
    assert_eq!(acks(&mut r, &s), [(rmpp_type::ACK, 0, 5, 65)]);
    let evs: Vec<_> = std::iter::from_fn(|| r.core.mad_poll_agent(s.client)).collect();
    assert_eq!(evs.len(), 2, "{evs:?}");
    let MadEvent::Recv(rw) = &evs[0] else {
        panic!("{evs:?}")
    };
    assert_eq!(rw.send_id, Some(id));
    assert_eq!(rw.mad.method(), GET_TABLE_RESP);
    let data = rw.rmpp_data.as_ref().unwrap();
    assert_eq!(data.len(), 4 * 200 + 150);
    assert!(data.iter().enumerate().all(|(k, &b)| b == k as u8));
    assert!(matches!(evs[1], MadEvent::SendDone(d) if d.id == id && d.status == WcStatus::Success));
    let c = r.core.mad_counters(r.a, 1).unwrap();
    assert_eq!((c.rmpp_completed, c.rmpp_segments), (1, 7));
}

#[test]
fn a_single_segment_answer_and_plain_mads_pass_through() {
    let mut r = rig();
    let s = sa(&mut r);
    let (id, req) = ask(&mut r, &s);
    send_seg(&mut r, &s, &req, segment(&req, 1, 1, 64));
    let evs: Vec<_> = std::iter::from_fn(|| r.core.mad_poll_agent(s.client)).collect();
    let MadEvent::Recv(rw) = &evs[0] else {
        panic!("{evs:?}")
    };
    assert_eq!(rw.rmpp_data.as_ref().map(|d| d.len()), Some(64));
    assert!(matches!(evs[1], MadEvent::SendDone(d) if d.id == id));
    assert_eq!(acks(&mut r, &s), [(rmpp_type::ACK, 0, 1, 1)]);
    // RMPP not active: delivered as a plain MAD.
    let (_, req) = ask(&mut r, &s);
    let mut m = req.mad.clone();
    m.set_method(method::GET_RESP);
    send_seg(&mut r, &s, &req, m);
    match r.core.mad_poll_agent(s.client) {
        Some(MadEvent::Recv(rw)) => assert!(rw.rmpp_data.is_none()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_segments_are_aborted_and_stalled_transfers_forgotten() {
    let mut r = rig();
    let s = sa(&mut r);
    let (_, req) = ask(&mut r, &s);
    // Segment 1 without FIRST.
    let mut m = segment(&req, 1, 3, 10);
    m.0[26] = rmpp_flag::ACTIVE;
    send_seg(&mut r, &s, &req, m);
    assert_eq!(
        acks(&mut r, &s),
        [(rmpp_type::ABORT, rmpp_status::BAD_SEG, 0, 0)]
    );
    // A bad RMPP version.
    let mut m = segment(&req, 1, 3, 10);
    m.0[24] = 2;
    send_seg(&mut r, &s, &req, m);
    assert_eq!(
        acks(&mut r, &s),
        [(rmpp_type::ABORT, rmpp_status::UNV, 0, 0)]
    );
    // A transfer that stalls after its first segment is dropped after 40 s;
    // the request then times out.
    send_seg(&mut r, &s, &req, segment(&req, 1, 3, 10));
    assert_eq!(acks(&mut r, &s).len(), 1);
    r.clock.advance(Duration::from_secs(41));
    r.core.poll();
    let c = r.core.mad_counters(r.a, 1).unwrap();
    assert!(c.rmpp_dropped >= 3, "{c:?}");
    let ev = r
        .core
        .poll_until(Duration::from_secs(1), |c| c.mad_poll_agent(s.client))
        .unwrap();
    assert!(matches!(ev, MadEvent::SendDone(d) if d.status == WcStatus::RespTimeoutErr));
    // An ABORT from the sender ends the request at once.
    let (id, req) = ask(&mut r, &s);
    send_seg(&mut r, &s, &req, segment(&req, 1, 3, 10));
    let mut m = segment(&req, 2, 3, 10);
    m.0[25] = rmpp_type::ABORT;
    send_seg(&mut r, &s, &req, m);
    let evs: Vec<_> = std::iter::from_fn(|| r.core.mad_poll_agent(s.client)).collect();
    assert!(
        evs.iter()
            .any(|e| matches!(e, MadEvent::SendDone(d) if d.id == id && d.status == WcStatus::RemAbortErr)),
        "{evs:?}"
    );
    assert!(lock(&r.world).hcas[0].ahs.iter().all(|a| a.is_none()));
}

#[test]
fn a_port_puts_together_at_most_sixteen_transfers_at_once() {
    // A flood of first segments must not grow memory without bound: a port
    // keeps RMPP_MAX_RECVS reassemblies; a first segment beyond them is
    // dropped, counted and not acknowledged (its sender retries or times
    // out), and the transfers in flight still complete.
    let mut r = rig();
    let s = sa(&mut r);
    let reqs: Vec<_> = (0..=RMPP_MAX_RECVS).map(|_| ask(&mut r, &s)).collect();
    for (_, req) in &reqs {
        send_seg(&mut r, &s, req, segment(req, 1, 2, 10));
    }
    let first = acks(&mut r, &s);
    assert_eq!(first.len(), RMPP_MAX_RECVS, "{first:?}");
    assert!(first.iter().all(|a| *a == (rmpp_type::ACK, 0, 1, 65)));
    let c = r.core.mad_counters(r.a, 1).unwrap();
    assert_eq!(c.rmpp_dropped, 1, "{c:?}");
    for (_, req) in &reqs[..RMPP_MAX_RECVS] {
        send_seg(&mut r, &s, req, segment(req, 2, 2, 10));
    }
    let evs: Vec<_> = std::iter::from_fn(|| r.core.mad_poll_agent(s.client)).collect();
    let whole = |evs: &[MadEvent]| {
        evs.iter()
            .filter(|e| matches!(e, MadEvent::Recv(rw) if rw.rmpp_data.as_ref().map(|d| d.len()) == Some(210)))
            .count()
    };
    assert_eq!(whole(&evs), RMPP_MAX_RECVS, "{evs:?}");
    // With room again, the one dropped is taken when its sender resends.
    let (id, req) = &reqs[RMPP_MAX_RECVS];
    send_seg(&mut r, &s, req, segment(req, 1, 2, 10));
    send_seg(&mut r, &s, req, segment(req, 2, 2, 10));
    let evs: Vec<_> = std::iter::from_fn(|| r.core.mad_poll_agent(s.client)).collect();
    assert_eq!(whole(&evs), 1, "{evs:?}");
    assert!(
        evs.iter().any(
            |e| matches!(e, MadEvent::SendDone(d) if d.id == *id && d.status == WcStatus::Success)
        ),
        "{evs:?}"
    );
    let done = r.core.mad_counters(r.a, 1).unwrap().rmpp_completed;
    assert_eq!(done, RMPP_MAX_RECVS as u64 + 1);
}
