//! ib_core's MAD receive path: MADs of every class and method arriving on QP0 and QP1 (directed-route SMPs on a CA and on a switch, RMPP segments, responses matching outstanding requests), interleaved with sends through the SMI and GSI agents, time passing and agents polled.
//!
//! Checks, beyond "no panic": every receive buffer is posted again, every
//! AH is destroyed once the sends are done, and the layer still answers a
//! request at the end.

#![no_main]

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use ib_core::mad::{Mad, MadRegReq, MadSendBuf, class, method};
use ib_core::mad_rmpp::{RmppHdr, rmpp_flag, rmpp_type};
use ib_core::verbs::{AhAttr, NodeType, QpType, WcStatus};
use legoib_fuzz::ibfake::{Arrival, lock};
use legoib_fuzz::ibrig::{self, A_LID, B_LID};
use legoib_fuzz::madgen::{Base, MadSpec, TidPick};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    /// B is a switch (its SMI takes the switch paths).
    b_is_switch: bool,
    steps: Vec<Step>,
}

#[derive(Arbitrary, Debug)]
enum Step {
    /// A MAD arrives at A (or B) on QP0/QP1.
    Recv {
        to_b: bool,
        qp1: bool,
        mad: MadSpec,
        slid: Slid,
        src_qp: u8,
        sl: u8,
        grh: Option<[u8; 40]>,
        byte_len: Option<u16>,
        status: u8,
    },
    /// An agent of A sends a MAD (SMI rules on the send side).
    Send {
        agent: u8,
        mad: MadSpec,
        dlid: Slid,
        timeout_ms: u8,
        retries: u8,
    },
    /// The last MAD that arrived comes again from the same sender, with
    /// one field of its RMPP transfer's key (TID, source QP, SLID, class)
    /// changed or none, as the same segment, the next, the last, a first
    /// one again, or a STOP or ABORT of its transfer. Independent fields
    /// match a transfer in progress in four of its five key fields only by
    /// chance: each comparison of the key is a branch of its own, and they
    /// still turned up after 8 and 9.6 million executions in the fourth
    /// campaign (fuzz/README.md).
    Again { key: KeyField, seg: Seg },
    /// The last MAD again as the first segment of 1 to 24 new transfers,
    /// each with a TID of its own: a port puts together at most 16
    /// transfers at once (`RMPP_MAX_RECVS`), and seventeen `Again` steps
    /// reached that cap only at 9.7 million executions of the fifth
    /// campaign.
    Flood(u8),
    /// Time passes and the core polls.
    Tick(u16),
    /// Every agent's mailbox is read.
    Drain,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum KeyField {
    Same,
    Tid(u8),
    SrcQp,
    Slid,
    Class(u8),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Seg {
    Same,
    Next,
    Last,
    First,
    Stop,
    Abort,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Slid {
    Peer,
    Own,
    Permissive,
    Zero,
    Raw(u16),
}

impl Slid {
    fn lid(self, own: u16, peer: u16) -> u16 {
        match self {
            Slid::Peer => peer,
            Slid::Own => own,
            Slid::Permissive => 0xffff,
            Slid::Zero => 0,
            Slid::Raw(v) => v,
        }
    }
}

const MAX_STEPS: usize = 64;

/// Raw MADs from a capture (`fuzz/seeds/from-capture.py`): b"MAD0" then
/// MADs of 256 bytes, each arriving at A from B on QP0 (SMPs) or QP1.
fn raw_input(mads: &[u8]) -> Input {
    let steps = mads
        .chunks(256)
        .map(|m| Step::Recv {
            to_b: false,
            qp1: !matches!(m.get(1), Some(0x01 | 0x81)),
            mad: MadSpec {
                base: Base::Raw(m.to_vec()),
                tid: TidPick::Raw(0),
                edits: Vec::new(),
            },
            slid: Slid::Peer,
            src_qp: 1,
            sl: 0,
            grh: None,
            byte_len: None,
            status: 0,
        })
        .collect();
    Input {
        b_is_switch: false,
        steps,
    }
}

fuzz_target!(|data: &[u8]| {
    let input = match data.strip_prefix(b"MAD0") {
        Some(mads) => raw_input(mads),
        None => match Input::arbitrary_take_rest(Unstructured::new(data)) {
            Ok(i) => i,
            Err(_) => return,
        },
    };
    run(input);
});

fn run(input: Input) {
    let mut r = ibrig::rig_with(false, |w| {
        if input.b_is_switch {
            lock(w).hcas[1].node_type = NodeType::Switch;
        }
    });
    let reg = |r: &mut ibrig::Rig, dev, qpt, req, rmpp| {
        r.core
            .register_mad_agent(dev, 1, qpt, req, rmpp)
            .expect("agent")
    };
    let (a, b) = (r.a, r.b);
    let agents = [
        // A server for device management Gets and Sets.
        reg(
            &mut r,
            a,
            QpType::Gsi,
            Some(MadRegReq::new(
                class::DEVICE_MGMT,
                1,
                &[method::GET, method::SET],
            )),
            0,
        ),
        // A client with requests outstanding.
        reg(&mut r, a, QpType::Gsi, None, 0),
        // An SMI agent (sends SMPs, takes responses).
        reg(&mut r, a, QpType::Smi, None, 0),
        // An RMPP agent, as the SA client registers.
        reg(
            &mut r,
            a,
            QpType::Gsi,
            Some(MadRegReq::new(
                class::SUBN_ADM,
                2,
                &[method::GET_TABLE, method::REPORT],
            )),
            1,
        ),
        // A vendor-class agent with an OUI (ibping's).
        reg(
            &mut r,
            a,
            QpType::Gsi,
            Some(MadRegReq::new(0x32, 1, &[method::GET]).with_oui(0x00_14_05)),
            0,
        ),
        // An SMI agent for traps on B.
        reg(
            &mut r,
            b,
            QpType::Smi,
            Some(MadRegReq::new(
                class::SUBN_LID_ROUTED,
                1,
                &[method::TRAP, method::GET],
            )),
            0,
        ),
    ];
    let hi: Vec<u32> = agents.iter().map(|g| g.hi_tid).collect();
    // The last MAD that arrived: (HCA, QP, MAD, source QP, SLID).
    let mut last: Option<(usize, u32, Mad, u32, u16)> = None;
    for step in input.steps.iter().take(MAX_STEPS) {
        match step {
            Step::Recv {
                to_b,
                qp1,
                mad,
                slid,
                src_qp,
                sl,
                grh,
                byte_len,
                status,
            } => {
                let m = mad.build(&hi);
                let (hca, own, peer) = if *to_b {
                    (1, B_LID, A_LID)
                } else {
                    (0, A_LID, B_LID)
                };
                let status = if *status < 0xe0 {
                    WcStatus::Success
                } else {
                    match WcStatus::from_raw(status & 0x1f) {
                        // A flushed buffer is rightly not posted again.
                        Some(WcStatus::WrFlushErr) | None => WcStatus::GeneralErr,
                        Some(s) => s,
                    }
                };
                let (src_qp, slid) = (u32::from(*src_qp) & 1, slid.lid(own, peer));
                lock(&r.world).deliver(
                    hca,
                    1,
                    u32::from(*qp1),
                    Arrival {
                        grh: *grh,
                        sl: sl & 15,
                        byte_len: byte_len.map(u32::from),
                        status,
                        ..Arrival::mad(&m.0, src_qp, slid)
                    },
                );
                last = Some((hca, u32::from(*qp1), m, src_qp, slid));
            }
            Step::Again { key, seg } => {
                let Some((hca, qp, mut m, mut src_qp, mut slid)) = last.take() else {
                    continue;
                };
                match key {
                    KeyField::Same => {}
                    KeyField::Tid(x) => m.set_tid(m.tid() ^ u64::from((*x).max(1))),
                    KeyField::SrcQp => src_qp ^= 1,
                    KeyField::Slid => slid ^= 1,
                    KeyField::Class(c) => m.set_mgmt_class(*c),
                }
                let mut h = RmppHdr::read(&m);
                match seg {
                    Seg::Same => {}
                    Seg::Next => {
                        h.seg_num = h.seg_num.wrapping_add(1);
                        h.flags &= !rmpp_flag::FIRST;
                    }
                    Seg::Last => {
                        h.seg_num = h.seg_num.wrapping_add(1);
                        h.flags = (h.flags & !rmpp_flag::FIRST) | rmpp_flag::LAST;
                    }
                    Seg::First => {
                        h.seg_num = 1;
                        h.flags |= rmpp_flag::ACTIVE | rmpp_flag::FIRST;
                    }
                    Seg::Stop => h.rtype = rmpp_type::STOP,
                    Seg::Abort => h.rtype = rmpp_type::ABORT,
                }
                h.write(&mut m);
                lock(&r.world).deliver(hca, 1, qp, Arrival::mad(&m.0, src_qp, slid));
                last = Some((hca, qp, m, src_qp, slid));
            }
            Step::Flood(n) => {
                let Some((hca, qp, mut m, src_qp, slid)) = last.take() else {
                    continue;
                };
                let tid = m.tid();
                let mut h = RmppHdr::read(&m);
                h.seg_num = 1;
                h.flags |= rmpp_flag::ACTIVE | rmpp_flag::FIRST;
                h.write(&mut m);
                for i in 1..=1 + u64::from(n % 24) {
                    m.set_tid(tid.wrapping_add(i));
                    lock(&r.world).deliver(hca, 1, qp, Arrival::mad(&m.0, src_qp, slid));
                }
                last = Some((hca, qp, m, src_qp, slid));
            }
            Step::Send {
                agent,
                mad,
                dlid,
                timeout_ms,
                retries,
            } => {
                let ag = agents[usize::from(*agent) % 5];
                let m = mad.build(&hi);
                let qpn = if ag.port == 1 && usize::from(*agent) % 5 == 2 {
                    0
                } else {
                    1
                };
                let mut buf = MadSendBuf::new(
                    m,
                    AhAttr {
                        dlid: dlid.lid(A_LID, B_LID),
                        port_num: 1,
                        ..AhAttr::default()
                    },
                    qpn,
                );
                buf.timeout_ms = u32::from(timeout_ms % 8);
                buf.retries = u32::from(retries % 3);
                let _ = r.core.post_send_mad(ag, buf);
            }
            Step::Tick(us) => {
                r.clock.advance(Duration::from_micros(u64::from(*us)));
                r.core.poll();
            }
            Step::Drain => {
                r.core.poll();
                for g in agents {
                    while r.core.mad_poll_agent(g).is_some() {}
                }
            }
        }
    }
    // Every request ends. A plain one within 21 ms (timeouts of at most
    // 7 ms, two retries); an RMPP transfer may take longer, since an ACK
    // that moves its window on restores its retries (as Linux's
    // mad_rmpp.c does). An AH is destroyed when its send ends, so the wait
    // is over, after the 40 ms a plain one may take, when none is left;
    // one still there after a simulated second is a send that never ends,
    // and the check below reports it.
    for ms in 0..1000 {
        r.core.poll();
        r.clock.advance(Duration::from_millis(1));
        for g in agents {
            while r.core.mad_poll_agent(g).is_some() {}
        }
        let w = lock(&r.world);
        if ms >= 40 && w.hcas.iter().all(|h| h.ahs.iter().all(|a| a.is_none())) {
            break;
        }
    }
    {
        let w = lock(&r.world);
        for h in &w.hcas {
            for q in h.qps.iter().flatten() {
                if matches!(q.qp_type, QpType::Smi | QpType::Gsi) {
                    assert_eq!(
                        q.recv.len(),
                        q.max_recv as usize,
                        "{}: a receive buffer was lost",
                        h.name
                    );
                }
            }
            assert!(
                h.ahs.iter().all(|a| a.is_none()),
                "{}: an AH leaked",
                h.name
            );
        }
    }
    // The layer still answers a PMA Get from A to B (at B's LID of now).
    let dlid = ibrig::lid_now(&r, 1);
    let m = ib_core::mad::Mad::new_request(
        class::PERF_MGMT,
        1,
        method::GET,
        ib_core::mad::attr::PORT_COUNTERS,
        0,
    );
    let mut buf = MadSendBuf::new(
        m,
        AhAttr {
            dlid,
            port_num: 1,
            ..AhAttr::default()
        },
        1,
    );
    buf.timeout_ms = 10;
    buf.retries = 1;
    let (done, resp) = r
        .core
        .send_mad_wait(agents[1], buf, Duration::from_secs(1))
        .expect("the layer still sends");
    assert_eq!(done.status, WcStatus::Success);
    assert!(resp.is_some(), "B still answers");
}
