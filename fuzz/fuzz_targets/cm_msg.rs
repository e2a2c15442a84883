//! ib_core's CM: a pair of fake HCAs is driven into a connection state with the CM's own API (listening, REQ sent, REQ received, MRA sent or received, REP sent, established, DREQ sent, time-wait, rejected), then fuzzed CM messages arrive on either side's QP1.
//!
//! The messages start from those the pair really exchanged (so their
//! communication IDs name live connections), with their IDs kept, swapped
//! or replaced, their attribute and bytes edited. Afterwards time passes
//! until every timer has run, events are read, and the connections are
//! destroyed: nothing may panic, and every QP the CM touched stays in a
//! state `modify_qp` accepted.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use ib_core::cm::{self, CmEvent, CmId, CmRepParam, CmReqParam};
use ib_core::cm_msgs::cm_attr;
use ib_core::device::{ClientId, DeviceId, IbCore};
use ib_core::mad::{Mad, class};
use ib_core::verbs::*;
use legoib_fuzz::ibfake::{Arrival, lock};
use legoib_fuzz::ibrig::{self, A_LID, B_LID, Rig};
use legoib_fuzz::madgen::Edit;
use libfuzzer_sys::fuzz_target;

const SID: u64 = 0x0000_0000_0001_0abc;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum State {
    Listen,
    ReqSent,
    ReqRcvd,
    MraReqSent,
    MraReqRcvd,
    RepSent,
    Established,
    DreqSent,
    Timewait,
    Rejected,
}

#[derive(Arbitrary, Debug)]
enum Ids {
    AsSent,
    Swapped,
    Raw(u32, u32),
}

#[derive(Arbitrary, Debug)]
struct Msg {
    /// Into B (else A).
    to_b: bool,
    /// Which message of the exchange it starts from.
    template: u8,
    /// Another attribute (REQ..APR, SIDR, ClassPortInfo, or any).
    attr: Option<u8>,
    ids: Ids,
    edits: Vec<Edit>,
    /// Time before it arrives, in milliseconds.
    delay_ms: u8,
}

#[derive(Arbitrary, Debug)]
struct Input {
    state: State,
    msgs: Vec<Msg>,
    /// What the application does afterwards: DREQ, REJ, MRA, REP on every ID.
    app: u8,
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
            port_num: 1,
            create_flags: QpCreateFlags::empty(),
        },
    )
    .unwrap()
    .0
}

/// Polls until `id` has an event (bounded).
fn event(r: &mut Rig, cm: ClientId, id: CmId) -> Option<CmEvent> {
    for _ in 0..50 {
        r.core.poll();
        if let Some(e) = cm::get_event(&mut r.core, cm, id) {
            return Some(e);
        }
    }
    None
}

fn drop_next(r: &Rig) {
    lock(&r.world).drop_next = 1;
}

/// Drives the pair into `s`; the IDs in play.
fn drive(r: &mut Rig, cm: ClientId, qa: Qp, qb: Qp, s: State) -> Vec<CmId> {
    let listen = cm::listen(&mut r.core, cm, r.b, SID).expect("listen");
    let mut ids = vec![listen];
    if matches!(s, State::Listen) {
        return ids;
    }
    let mut p = CmReqParam::new(ibrig::path_a_to_b(r), SID, qa);
    p.private_data = b"req".to_vec();
    p.max_cm_retries = 2;
    p.remote_cm_response_timeout = 8;
    p.local_cm_response_timeout = 8;
    if matches!(s, State::ReqSent) {
        drop_next(r);
    }
    let Ok(a) = cm::send_req(&mut r.core, cm, r.a, 1, &p) else {
        return ids;
    };
    ids.push(a);
    if matches!(s, State::ReqSent) {
        r.core.poll();
        return ids;
    }
    let Some(CmEvent::ReqReceived { id: b, .. }) = event(r, cm, listen) else {
        return ids;
    };
    ids.push(b);
    match s {
        State::ReqRcvd => return ids,
        State::MraReqSent | State::MraReqRcvd => {
            if matches!(s, State::MraReqSent) {
                drop_next(r);
            }
            let _ = cm::send_mra(&mut r.core, cm, b, 10, b"mra");
            let _ = event(r, cm, a);
            return ids;
        }
        State::Rejected => {
            let _ = cm::send_rej(&mut r.core, cm, b, 28, &[], b"no");
            let _ = event(r, cm, a);
            return ids;
        }
        _ => {}
    }
    let mut rp = CmRepParam::new(qb);
    rp.private_data = b"rep".to_vec();
    if matches!(s, State::RepSent) {
        drop_next(r);
    }
    let _ = cm::send_rep(&mut r.core, cm, b, &rp);
    if matches!(s, State::RepSent) {
        r.core.poll();
        return ids;
    }
    let _ = event(r, cm, a);
    let _ = event(r, cm, b);
    match s {
        State::DreqSent => {
            drop_next(r);
            let _ = cm::send_dreq(&mut r.core, cm, a, b"bye");
            r.core.poll();
        }
        State::Timewait => {
            let _ = cm::send_dreq(&mut r.core, cm, a, b"bye");
            let _ = event(r, cm, b);
            let _ = event(r, cm, a);
        }
        _ => {}
    }
    ids
}

fn attr_pick(a: u8) -> u16 {
    const ATTRS: [u16; 12] = [
        cm_attr::REQ,
        cm_attr::MRA,
        cm_attr::REJ,
        cm_attr::REP,
        cm_attr::RTU,
        cm_attr::DREQ,
        cm_attr::DREP,
        cm_attr::SIDR_REQ,
        cm_attr::SIDR_REP,
        cm_attr::LAP,
        cm_attr::APR,
        cm_attr::CLASS_PORT_INFO,
    ];
    if a & 0x80 != 0 {
        u16::from(a & 0x7f)
    } else {
        ATTRS[usize::from(a) % ATTRS.len()]
    }
}

fuzz_target!(|input: Input| {
    let mut r = ibrig::rig(true);
    let cm = cm::init(&mut r.core);
    r.core.poll();
    let (a, b) = (r.a, r.b);
    let qa = rc_qp(&mut r.core, a);
    let qb = rc_qp(&mut r.core, b);
    let ids = drive(&mut r, cm, qa, qb, input.state);
    // The CM MADs the pair exchanged, with their sender.
    let sent: Vec<(usize, Mad)> = lock(&r.world)
        .wire
        .iter()
        .filter(|p| p.mad.mgmt_class() == class::CM)
        .map(|p| (p.from.0, p.mad.clone()))
        .collect();
    for msg in input.msgs.iter().take(12) {
        let (from, mut m) = if sent.is_empty() {
            (
                0,
                Mad::new_request(class::CM, 2, ib_core::mad::method::SEND, cm_attr::REQ, 0),
            )
        } else {
            sent[usize::from(msg.template) % sent.len()].clone()
        };
        if let Some(at) = msg.attr {
            m.set_attr_id(attr_pick(at));
        }
        let (lo, re) = (m.0[24..28].to_vec(), m.0[28..32].to_vec());
        let to = usize::from(msg.to_b);
        match msg.ids {
            // A message A sent, delivered to A, is addressed with the IDs
            // swapped to make sense there.
            Ids::AsSent if from == to => {
                m.0[24..28].copy_from_slice(&re);
                m.0[28..32].copy_from_slice(&lo);
            }
            Ids::AsSent => {}
            Ids::Swapped => {
                m.0[24..28].copy_from_slice(&re);
                m.0[28..32].copy_from_slice(&lo);
            }
            Ids::Raw(l, rr) => {
                m.0[24..28].copy_from_slice(&l.to_be_bytes());
                m.0[28..32].copy_from_slice(&rr.to_be_bytes());
            }
        }
        for e in &msg.edits {
            legoib_fuzz::madgen::apply(&mut m, e, &[]);
        }
        r.clock
            .advance(Duration::from_millis(u64::from(msg.delay_ms)));
        let slid = if to == 1 { A_LID } else { B_LID };
        lock(&r.world).deliver(to, 1, 1, Arrival::mad(&m.0, 1, slid));
        r.core.poll();
    }
    // The application answers what it was told, then time runs out every
    // timer (CM response timeouts of ~1 s, retries, time-wait).
    let mut seen = ids.clone();
    for round in 0..60 {
        r.core.poll();
        for i in 0..seen.len() {
            while let Some(e) = cm::get_event(&mut r.core, cm, seen[i]) {
                if let CmEvent::ReqReceived { id, .. } = e {
                    seen.push(id);
                    match input.app % 4 {
                        0 => {
                            let _ = cm::send_rep(&mut r.core, cm, id, &CmRepParam::new(qb));
                        }
                        1 => {
                            let _ = cm::send_rej(&mut r.core, cm, id, 28, &[], &[]);
                        }
                        2 => {
                            let _ = cm::send_mra(&mut r.core, cm, id, 3, &[]);
                        }
                        _ => {}
                    }
                }
            }
        }
        if round == 5 && input.app & 4 != 0 {
            for &id in &seen {
                let _ = cm::send_dreq(&mut r.core, cm, id, &[]);
            }
        }
        r.clock.advance(Duration::from_millis(250));
    }
    for &id in seen.iter().rev() {
        let _ = cm::state(&mut r.core, cm, id);
        let _ = cm::destroy_id(&mut r.core, cm, id);
    }
    for _ in 0..20 {
        r.core.poll();
        r.clock.advance(Duration::from_millis(500));
    }
    let _ = cm::counters(&mut r.core, cm, a);
    let _ = cm::counters(&mut r.core, cm, b);
});
