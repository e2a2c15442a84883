//! Random and malformed WQEs, receive lists and doorbells: the model never
//! panics or hangs, never writes memory the QPs' PD does not own, and still
//! serves well-formed traffic afterwards.

use crate::loopback::one;
use crate::poster::*;

const QPNS: [u32; 4] = [0x80, 0x81, 0x90, 0x91];

fn recover(h: &mut Hca, q: &mut Qp, s: QpSpec, peer: u32, wedged: bool) {
    match h.qp_state(q.qpn) {
        3 if !wedged => {}
        4 if !wedged => {
            let m = crate::harness::QpMbox::new(3, s.st);
            h.r.cmd_in(&m.0, q.qpn, 0, sim::Opcode::SQERR2RTS_QP)
                .unwrap();
        }
        _ => {
            h.reinit(q);
            let lid = h.lid;
            h.connect(q, s, peer, lid).unwrap();
        }
    }
}

fn run(wqes: u64) {
    let mut h = Hca::new();
    let mut cq = h.cq(12);
    let mut s = QpSpec::new(RC, cq.cqn);
    s.rnr_retry = 0;
    let mut a = h.qp(0x80, s);
    let mut b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let us = QpSpec::new(UD, cq.cqn);
    let mut u0 = h.qp(0x90, us);
    let mut u1 = h.qp(0x91, us);
    h.connect(&u0, us, 0, 0).unwrap();
    h.connect(&u1, us, 0, 0).unwrap();
    let mr = h.mr(0x10_0000, 64 << 10, acc::ALL);
    let guard = h.mr_pd(0x80_0000, 16 << 10, acc::ALL, OTHER_PD);
    let pattern: Vec<u8> = (0..16 << 10).map(|i| (i * 31 % 251) as u8).collect();
    guard.write(0, &pattern);
    let keys = [mr.key, guard.key, mr.key ^ 1, 0x100, 0x500, 0];
    let mut rng = Rng(0x5eed_f00d_dead_beef);
    let mut posted = 0u64;
    let mut doorbells = 0u64;
    while posted < wqes {
        let pick = rng.below(4);
        let (q, spec, peer) = match pick {
            0 => (&mut a, s, 0x81),
            1 => (&mut b, s, 0x80),
            2 => (&mut u0, us, 0),
            _ => (&mut u1, us, 0),
        };
        let n = 1 + rng.below(16) as u32;
        let mut wedged = false;
        for _ in 0..n {
            let stride = 1usize << q.sq_shift;
            let mut w = vec![0u8; stride];
            if rng.below(4) != 0 {
                // Plausible: a real opcode, sane segments, random keys,
                // addresses and lengths.
                let all = [
                    0u8, 0x08, 0x09, 0x0a, 0x0b, 0x10, 0x11, 0x12, 0x18, 0x1b, 0x0e,
                ];
                let fit: &[u8] = if spec.st == UD {
                    &[0x0a, 0x0b, 0x00]
                } else {
                    &all[..8]
                };
                let opc = if rng.below(8) == 0 {
                    all[rng.below(11) as usize]
                } else {
                    fit[rng.below(fit.len() as u64) as usize]
                };
                let oob = rng.below(8) == 0;
                let sg = (0..rng.below(4))
                    .map(|_| Sge {
                        addr: if oob {
                            mr.addr(0)
                                .wrapping_add(rng.below(80 << 10))
                                .wrapping_sub(8 << 10)
                        } else {
                            mr.addr(rng.below(56 << 10))
                        },
                        len: rng.below(if oob { 9000 } else { 2000 }) as u32,
                        lkey: if rng.below(16) != 0 {
                            mr.key
                        } else {
                            keys[rng.below(keys.len() as u64) as usize]
                        },
                    })
                    .collect();
                let ud = (spec.st == UD).then(|| Av {
                    port: 1 + rng.below(2) as u8,
                    dlid: if rng.below(4) == 0 {
                        rng.next_u64() as u16
                    } else {
                        h.lid
                    },
                    dqpn: QPNS[rng.below(4) as usize],
                    qkey: if rng.below(3) == 0 {
                        rng.next_u64() as u32
                    } else {
                        spec.qkey
                    },
                    ..Av::default()
                });
                let wr = Wr {
                    opcode: opc,
                    signalled: rng.below(2) == 0,
                    solicited: rng.below(2) == 0,
                    raddr: if oob {
                        mr.addr(rng.below(70 << 10))
                            .wrapping_sub(rng.below(2) * (4 << 10))
                    } else {
                        mr.addr(rng.below(7 << 10) * 8)
                    },
                    rkey: if rng.below(16) != 0 {
                        mr.key
                    } else {
                        keys[rng.below(keys.len() as u64) as usize]
                    },
                    swap: rng.next_u64(),
                    cmp: rng.next_u64(),
                    sges: sg,
                    inline: (rng.below(8) == 0).then(|| {
                        let n = rng.below(100) as usize;
                        rng.bytes(n)
                    }),
                    ud,
                    ..Wr::default()
                };
                let bytes = q.build(&wr);
                if bytes.len() <= stride {
                    w[..bytes.len()].copy_from_slice(&bytes);
                    w[0..4].copy_from_slice(&u32::from(opc).to_be_bytes());
                    w[7] = bytes.len().div_ceil(16) as u8;
                }
            } else {
                // Garbage, sometimes with a plausible DS count.
                w = rng.bytes(stride);
                if rng.below(2) == 0 {
                    w[7] = (rng.below(u64::from(stride as u32 / 16)) + 1) as u8;
                }
            }
            let idx = q.sq_pi;
            let base = q.sq_off + ((idx & (q.sq_cnt - 1)) as usize) * stride;
            let mut owner = idx & q.sq_cnt != 0;
            if rng.below(64) == 0 {
                // Wrongly owned: never executed; the SQ waits on it for
                // ever, as the card would, until the QP is reset.
                owner = !owner;
                wedged = true;
            }
            let first = (u32::from_be_bytes(w[0..4].try_into().unwrap()) & 0x7fff_ffff)
                | u32::from(owner) << 31;
            if first == 0 && w[4..16].iter().all(|&b| b == 0) {
                // An all-zero slot (a WQE too big for the stride, left
                // blank) is no WQE, as mlx4_en's cleared TX ring: the SQ
                // waits on it, as on a wrongly owned one.
                wedged = true;
            }
            q.buf.write_bytes(base + 4, &w[4..]);
            q.buf.write_be32(base, first);
            q.sq_pi = q.sq_pi.wrapping_add(1);
            posted += 1;
        }
        // Receive WQEs with random scatter lists, and a random RQ counter now
        // and then.
        for _ in 0..rng.below(6) {
            let sg: Vec<Sge> = (0..1 + rng.below(3))
                .map(|_| Sge {
                    addr: mr.addr(rng.below(70 << 10)),
                    len: rng.below(12_000) as u32,
                    lkey: if rng.below(8) != 0 {
                        mr.key
                    } else {
                        keys[rng.below(keys.len() as u64) as usize]
                    },
                })
                .collect();
            if q.rq_cnt > 0 {
                q.post_recv(&sg);
            }
        }
        if rng.below(50) == 0 {
            q.db.write_be32(0, rng.next_u64() as u32);
        }
        // Doorbells: the right one, and random ones.
        h.ring_send(q.qpn);
        doorbells += 1;
        if rng.below(4) == 0 {
            h.ring_send(rng.next_u64() as u32 & 0xff_ffff);
            let off = UAR_PAGE * 4096 + 0x20;
            h.r.bar2
                .write_be32_pair(off, rng.next_u64() as u32, rng.next_u64() as u32);
            doorbells += 2;
        }
        cq.drain();
        cq.stash.clear();
        recover(&mut h, q, spec, peer, wedged);
        h.r.sim.take_violations();
        h.r.sim.take_dma_faults();
    }
    assert!(posted >= wqes && doorbells > 0);
    assert_eq!(
        guard.read(0, 16 << 10),
        pattern,
        "memory of another PD untouched"
    );
    // Well-formed traffic still runs, on fresh QPs and a fresh CQ.
    let mut cq2 = h.cq(6);
    let s2 = QpSpec::new(RC, cq2.cqn);
    let mut x = h.qp(0xa0, s2);
    let mut y = h.qp(0xa1, s2);
    let lid = h.lid;
    h.connect(&x, s2, 0xa1, lid).unwrap();
    h.connect(&y, s2, 0xa0, lid).unwrap();
    let src = h.mr(0x200_0000, 8192, acc::ALL);
    let dst = h.mr(0x300_0000, 8192, acc::ALL);
    let data = rng.bytes(6000);
    src.write(0, &data);
    y.post_recv(&[dst.sge(0, 8192)]);
    x.post(&h, &Wr::send(vec![src.sge(0, 6000)]));
    assert!(one(&mut cq2, false).ok());
    assert!(one(&mut cq2, true).ok());
    assert_eq!(dst.read(0, 6000), data);
    let st = h.r.sim.engine_stats();
    eprintln!("fuzz: {posted} WQEs posted, {doorbells} doorbells; engine: {st:?}");
    assert!(
        st.executed + st.flushed > wqes * 3 / 4 && st.executed > wqes / 10,
        "most WQEs reached the engine: {st:?}"
    );
}

const UAR_PAGE: usize = crate::harness::profile::UAR as usize;

/// The default run: 10^5 random WQEs (a few seconds in a debug build).
#[test]
fn random_wqes_and_doorbells_then_well_formed_traffic() {
    run(100_000);
}

/// The full run: 10^6 random WQEs (`cargo test --release -p sim --test
/// engine -- --ignored fuzz_full`).
#[test]
#[ignore]
fn fuzz_full_million_wqes() {
    run(1_000_000);
}
