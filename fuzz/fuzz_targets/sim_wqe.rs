//! The model's data-path engines: send WQEs of any bytes (or plausible ones with wrong keys, addresses, lengths and opcodes), receive lists, RQ doorbell records and doorbells of any QPN, posted on two connected RC QPs and two UD QPs of one model HCA looped back, with memory of another PD beside them.
//!
//! The model may record violations and complete with errors; it must not
//! panic, hang (every step is bounded: the model runs only within the
//! poster's steps), or write the other PD's memory, which it was never
//! given for these QPs. After the input, well-formed traffic must still run
//! on fresh QPs.

#![no_main]

use arbitrary::Arbitrary;
use legoib_fuzz::poster::*;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Key {
    Mr,
    Guard,
    Raw(u32),
}

#[derive(Arbitrary, Debug)]
enum Wqe {
    /// A WQE as the poster builds it, fields from the input.
    Plausible {
        opcode: u8,
        signalled: bool,
        solicited: bool,
        sges: Vec<(u16, u16, Key)>,
        raddr: u32,
        rkey: Key,
        inline: Option<Vec<u8>>,
        dlid: Option<u16>,
        dqpn: u8,
        qkey: Option<u32>,
    },
    /// Bytes as they come, with a DS count (byte 7) or not.
    Garbage { bytes: Vec<u8>, ds: Option<u8> },
}

#[derive(Arbitrary, Debug)]
struct Post {
    qp: u8,
    wqes: Vec<(Wqe, bool)>,
    recvs: Vec<Vec<(u16, u16, Key)>>,
    rq_db: Option<u32>,
    /// Rings: the QP's doorbell, another QPN's, a raw UAR store.
    ring: Option<u32>,
    raw_db: Option<(u32, u32)>,
}

const QPNS: [u32; 4] = [0x80, 0x81, 0x90, 0x91];
const UAR_PAGE: usize = legoib_fuzz::harness::profile::UAR as usize;

fn recover(h: &mut Hca, q: &mut Qp, s: QpSpec, peer: u32, wedged: bool) {
    match h.qp_state(q.qpn) {
        3 if !wedged => {}
        4 if !wedged => {
            let m = legoib_fuzz::harness::QpMbox::new(3, s.st);
            let _ = h.r.cmd_in(&m.0, q.qpn, 0, sim::Opcode::SQERR2RTS_QP);
        }
        _ => {
            h.reinit(q);
            let lid = h.lid;
            let _ = h.connect(q, s, peer, lid);
        }
    }
}

struct Rig {
    h: Hca,
    cq: Cq,
    s: QpSpec,
    us: QpSpec,
    qps: [Qp; 4],
    mr: Mr,
    guard: Mr,
    pattern: Vec<u8>,
}

/// Brings the card up again for an input (`legoib_fuzz::reset_card` says
/// why each input starts from a reset): port 1 Active, the CQ, the four
/// QPs connected, the MR and the other PD's guard.
fn bring_up(r: legoib_fuzz::harness::Raw) -> Rig {
    let mut h = legoib_fuzz::bare_again(r);
    h.port_up(1, 0x11).expect("port 1 up");
    // 1024 CQEs: more than every queue of the four QPs flushed at once
    // (4 x (64 + 64)), so only a driver mistake can overrun it.
    let cq = h.cq(10);
    let mut s = QpSpec::new(RC, cq.cqn);
    s.rnr_retry = 0;
    let a = h.qp(0x80, s);
    let b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let us = QpSpec::new(UD, cq.cqn);
    let u0 = h.qp(0x90, us);
    let u1 = h.qp(0x91, us);
    h.connect(&u0, us, 0, 0).unwrap();
    h.connect(&u1, us, 0, 0).unwrap();
    let mr = h.mr(0x10_0000, 64 << 10, acc::ALL);
    let guard = h.mr_pd(0x80_0000, 16 << 10, acc::ALL, OTHER_PD);
    let pattern: Vec<u8> = (0..16 << 10).map(|i| (i * 31 % 251) as u8).collect();
    guard.write(0, &pattern);
    Rig {
        h,
        cq,
        s,
        us,
        qps: [a, b, u0, u1],
        mr,
        guard,
        pattern,
    }
}

thread_local! {
    static RIG: std::cell::RefCell<(Option<Option<Rig>>, u32)> = const { std::cell::RefCell::new((None, 0)) };
}

// One card for 1,000 inputs (a new one then: its command trace grows),
// brought up again for each: the last input's objects go first, so the
// bring-up gets the same pages. 8 MiB of DMA memory hold its ICM and
// queues; a larger arena costs more to build than the runs of its inputs.
fuzz_target!(|posts: Vec<Post>| {
    legoib_fuzz::persistent(
        &RIG,
        1000,
        || None,
        |slot| {
            let card = match slot.take() {
                Some(rig) => rig.h.r,
                None => legoib_fuzz::new_card(0, 8 << 20),
            };
            let mut rig = bring_up(card);
            let ok = run(&mut rig, &posts);
            *slot = Some(rig);
            ok
        },
    );
});

/// Runs the posts; false if the CQ overran (the rig is built again).
fn run(rig: &mut Rig, posts: &[Post]) -> bool {
    let Rig {
        h,
        cq,
        s,
        us,
        qps,
        mr,
        guard,
        pattern,
    } = rig;
    let (s, us) = (*s, *us);
    let [a, b, u0, u1] = qps;
    // The event queues are read as a driver's EQ handler reads them (the
    // bring-up's events). An input may arm the CQ (raw_db), one EQE per
    // arm, at most 16 times (one raw doorbell per post), and its QP errors
    // stay far below the async EQ's 512: an EQ that overruns is the
    // model's mistake.
    h.comp_events();
    h.async_events();
    let mut seen = Vec::new();
    let key = |k: &Key| match k {
        Key::Mr => mr.key,
        Key::Guard => guard.key,
        Key::Raw(v) => *v,
    };
    for p in posts.iter().take(16) {
        let (q, spec, peer) = match p.qp % 4 {
            0 => (&mut *a, s, 0x81),
            1 => (&mut *b, s, 0x80),
            2 => (&mut *u0, us, 0),
            _ => (&mut *u1, us, 0),
        };
        let mut wedged = false;
        for (wqe, wrong_owner) in p.wqes.iter().take(8) {
            let stride = 1usize << q.sq_shift;
            let mut w = vec![0u8; stride];
            match wqe {
                Wqe::Plausible {
                    opcode,
                    signalled,
                    solicited,
                    sges,
                    raddr,
                    rkey,
                    inline,
                    dlid,
                    dqpn,
                    qkey,
                } => {
                    let sg = sges
                        .iter()
                        .take(4)
                        .map(|(off, len, k)| Sge {
                            addr: mr
                                .addr(0)
                                .wrapping_add(u64::from(*off) * 2)
                                .wrapping_sub(8 << 10),
                            len: u32::from(*len) % 9000,
                            lkey: key(k),
                        })
                        .collect();
                    let ud = (spec.st == UD).then(|| Av {
                        port: 1,
                        dlid: dlid.unwrap_or(h.lid),
                        dqpn: QPNS[usize::from(*dqpn) % 4],
                        qkey: qkey.unwrap_or(spec.qkey),
                        ..Av::default()
                    });
                    let wr = Wr {
                        opcode: *opcode & 0x1f,
                        signalled: *signalled,
                        solicited: *solicited,
                        raddr: mr
                            .addr(0)
                            .wrapping_add(u64::from(*raddr % (80 << 10)))
                            .wrapping_sub(4 << 10),
                        rkey: key(rkey),
                        swap: 1,
                        cmp: 2,
                        sges: sg,
                        inline: inline.as_ref().map(|v| v[..v.len().min(120)].to_vec()),
                        ud,
                        ..Wr::default()
                    };
                    let bytes = q.build(&wr);
                    if bytes.len() <= stride {
                        w[..bytes.len()].copy_from_slice(&bytes);
                        w[0..4].copy_from_slice(&u32::from(*opcode & 0x1f).to_be_bytes());
                        w[7] = bytes.len().div_ceil(16) as u8;
                    }
                }
                Wqe::Garbage { bytes, ds } => {
                    for (d, s) in w.iter_mut().zip(bytes.iter()) {
                        *d = *s;
                    }
                    if let Some(ds) = ds {
                        w[7] = (u32::from(*ds) % (stride as u32 / 16) + 1) as u8;
                    }
                }
            }
            let idx = q.sq_pi;
            let base = q.sq_off + ((idx & (q.sq_cnt - 1)) as usize) * stride;
            let mut owner = idx & q.sq_cnt != 0;
            if *wrong_owner {
                owner = !owner;
                wedged = true;
            }
            let first = (u32::from_be_bytes(w[0..4].try_into().unwrap()) & 0x7fff_ffff)
                | u32::from(owner) << 31;
            q.buf.write_bytes(base + 4, &w[4..]);
            q.buf.write_be32(base, first);
            q.sq_pi = q.sq_pi.wrapping_add(1);
        }
        for sges in p.recvs.iter().take(4) {
            let sg: Vec<Sge> = sges
                .iter()
                .take(3)
                .map(|(off, len, k)| Sge {
                    addr: mr.addr(0).wrapping_add(u64::from(*off) * 2),
                    len: u32::from(*len) % 12_000,
                    lkey: key(k),
                })
                .collect();
            if q.rq_cnt > 0 && !sg.is_empty() {
                q.post_recv(&sg);
            }
        }
        if let Some(v) = p.rq_db {
            q.db.write_be32(0, v);
        }
        h.ring_send(q.qpn);
        if let Some(other) = p.ring {
            h.ring_send(other & 0xff_ffff);
        }
        if let Some((x, y)) = p.raw_db {
            h.r.bar2.write_be32_pair(UAR_PAGE * 4096 + 0x20, x, y);
        }
        cq.drain();
        cq.stash.clear();
        recover(h, q, spec, peer, wedged);
        seen.extend(h.r.sim.take_violations());
        h.r.sim.take_dma_faults();
    }
    assert_eq!(
        guard.read(0, 16 << 10),
        *pattern,
        "memory of another PD untouched"
    );
    // Every QP back in RTS for the next input, and well-formed traffic runs.
    for (q, spec, peer) in [(&mut *a, s, 0x81), (&mut *b, s, 0x80)] {
        recover(h, q, spec, peer, true);
    }
    let _ = cq.drain();
    cq.stash.clear();
    let src = mr.addr(0);
    let _ = src;
    mr.write(0, &[0x5a; 600]);
    mr.write(4096, &[0; 600]);
    b.post_recv(&[mr.sge(4096, 4096)]);
    a.post(h, &Wr::send(vec![mr.sge(0, 600)]));
    let got = cq.drain();
    // An RQ doorbell record from the input may claim up to 65 535 posted
    // receives: a QP in error flushes that many, as the card would, and the
    // CQ overruns (in error for good, as on the card): the next input gets
    // a new card. An overrun without that cause is a finding.
    let after = h.r.sim.violations();
    let all: Vec<&String> = seen.iter().chain(after.iter()).collect();
    // An RQ doorbell record of this input claimed more receives than its
    // RQ holds (the model says so once, before the overrun it causes).
    let rq_claimed = all.iter().any(|v| v.contains("receive WQEs posted"));
    // The EQs were read before the posts (above).
    assert!(
        !all.iter()
            .any(|v| v.starts_with("EQ ") && v.contains(" overrun")),
        "EQ overrun though every EQE was read: {all:?}"
    );
    if all
        .iter()
        .any(|v| v.starts_with("CQ ") && v.contains(" overrun"))
    {
        assert!(
            rq_claimed,
            "CQ overrun with every RQ counter within its ring: {all:?}"
        );
        return false;
    }
    assert!(
        got.iter().filter(|c| c.ok()).count() >= 2,
        "a SEND still runs: {got:?}; violations of this input: {seen:?}, after: {:?}; CQ {:?}",
        h.r.sim.violations(),
        (cq.cqn, cq.ci)
    );
    assert_eq!(mr.read(4096, 600), vec![0x5a; 600]);
    cq.stash.clear();
    h.r.sim.take_violations();
    h.r.sim.take_dma_faults();
    true
}
