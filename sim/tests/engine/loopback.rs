//! Every opcode on every service type over the HCA's loopback, with
//! verified bytes.

use crate::pairs::pair;
use crate::poster::*;

#[test]
fn rc_send_moves_bytes_and_completes_both_sides() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let (mut a, mut b, _) = pair(&mut h, RC, &cq);
    let src = h.mr(0x10_0000_0123, 10_000, acc::ALL);
    let dst = h.mr(0x20_0000_0456, 10_000, acc::ALL);
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    src.write(0, &data);
    b.post_recv(&[dst.sge(0, 10_000)]);
    let w = Wr {
        opcode: op::SEND_IMM,
        signalled: true,
        imm: 0xcafe_f00d,
        sges: vec![src.sge(0, 5000)],
        ..Wr::default()
    };
    a.post(&h, &w);
    let cqes = cq.drain();
    assert_eq!(cqes.len(), 2, "{cqes:?} {:?}", h.r.sim.violations());
    let recv = cqes.iter().find(|c| !c.send).unwrap();
    let send = cqes.iter().find(|c| c.send).unwrap();
    assert_eq!(
        (recv.qpn, recv.opcode, recv.byte_cnt, recv.imm),
        (0x81, 2, 5000, 0xcafe_f00d)
    );
    assert_eq!(
        (send.qpn, send.opcode, send.wqe_counter),
        (0x80, op::SEND_IMM, 0)
    );
    assert_eq!(dst.read(0, 5000), data);
    h.assert_no_violations();
}

/// Splits `len` bytes at `off` of `mr` into `n` SGEs of random sizes.
pub fn split(rng: &mut Rng, mr: &Mr, off: u64, len: u64, n: usize) -> Vec<Sge> {
    let mut cuts: Vec<u64> = (0..n.saturating_sub(1))
        .map(|_| rng.below(len + 1))
        .collect();
    cuts.push(0);
    cuts.push(len);
    cuts.sort_unstable();
    cuts.windows(2)
        .map(|w| mr.sge(off + w[0], (w[1] - w[0]) as u32))
        .filter(|s| s.len > 0)
        .collect()
}

/// The one CQE of the send (or receive) side among those available now.
pub fn one(cq: &mut Cq, send: bool) -> Cqe {
    let v = cq.drain();
    cq.stash.extend(v);
    let i = cq.stash.iter().position(|c| c.send == send);
    let Some(i) = i else {
        panic!(
            "no {} CQE: {:?}",
            if send { "send" } else { "receive" },
            cq.stash
        )
    };
    let c = cq.stash.remove(i);
    assert!(
        !cq.stash.iter().any(|x| x.send == send),
        "more than one: {c:?} {:?}",
        cq.stash
    );
    c
}

#[test]
fn rc_every_opcode_random_sizes_page_crossing_sg() {
    let mut h = Hca::new();
    let mut cq = h.cq(8);
    let (mut a, mut b, _) = pair(&mut h, RC, &cq);
    let la = h.mr(0x10_0000_0ff0, 40_000, acc::ALL);
    let rb = h.mr(0x30_0000_0a08, 40_000, acc::ALL);
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for round in 0..60 {
        let len = match round % 6 {
            0 => 0,
            1 => 1 + rng.below(8),
            _ => rng.below(16_000),
        };
        let nsg = 1 + rng.below(4) as usize;
        let data = rng.bytes(len as usize);
        let loff = rng.below(20_000);
        let roff = rng.below(20_000);
        la.write(loff, &data);
        let sges = split(&mut rng, &la, loff, len, nsg);
        match round % 5 {
            0 | 1 => {
                // SEND / SEND_IMM into a scatter list of several pieces.
                let extra = rng.below(100);
                let rsg = split(&mut rng, &rb, roff, len + extra, 3);
                let rsg = if rsg.is_empty() {
                    vec![rb.sge(roff, 16)]
                } else {
                    rsg
                };
                b.post_recv(&rsg);
                let opc = if round % 5 == 0 {
                    op::SEND
                } else {
                    op::SEND_IMM
                };
                a.post(
                    &h,
                    &Wr {
                        opcode: opc,
                        signalled: true,
                        imm: round,
                        sges,
                        ..Wr::default()
                    },
                );
                let r = one(&mut cq, false);
                assert!(r.ok(), "round {round}: {r:?}");
                assert_eq!(r.byte_cnt as u64, len);
                assert_eq!(r.opcode, if opc == op::SEND { 1 } else { 2 });
                if opc == op::SEND_IMM {
                    assert_eq!(r.imm, round);
                }
                assert_eq!(rb.read(roff, len as usize), data, "round {round}");
                assert_eq!(one(&mut cq, true).opcode, opc);
            }
            2 => {
                a.post(
                    &h,
                    &Wr {
                        opcode: op::RDMA_WRITE,
                        signalled: true,
                        raddr: rb.addr(roff),
                        rkey: rb.key,
                        sges,
                        ..Wr::default()
                    },
                );
                let s = one(&mut cq, true);
                assert!(s.ok() && s.opcode == op::RDMA_WRITE, "{s:?}");
                assert_eq!(rb.read(roff, len as usize), data);
            }
            3 => {
                b.post_recv(&[rb.sge(0, 8)]);
                a.post(
                    &h,
                    &Wr {
                        opcode: op::RDMA_WRITE_IMM,
                        signalled: true,
                        imm: 0x1000 + round,
                        raddr: rb.addr(roff),
                        rkey: rb.key,
                        sges,
                        ..Wr::default()
                    },
                );
                let r = one(&mut cq, false);
                assert_eq!(
                    (r.opcode, r.imm, r.byte_cnt as u64),
                    (0, 0x1000 + round, len)
                );
                assert!(one(&mut cq, true).ok());
                assert_eq!(rb.read(roff, len as usize), data);
            }
            _ => {
                // READ the remote bytes back into a fresh local place.
                let remote = rng.bytes(len as usize);
                rb.write(roff, &remote);
                let dst = (loff + 20_000) % 20_000;
                let sges = split(&mut rng, &la, dst, len, nsg);
                a.post(
                    &h,
                    &Wr {
                        opcode: op::RDMA_READ,
                        signalled: true,
                        raddr: rb.addr(roff),
                        rkey: rb.key,
                        sges,
                        ..Wr::default()
                    },
                );
                let s = one(&mut cq, true);
                assert!(s.ok() && s.opcode == op::RDMA_READ, "{s:?}");
                assert_eq!(s.byte_cnt as u64, len);
                assert_eq!(la.read(dst, len as usize), remote);
            }
        }
    }
    h.assert_no_violations();
}

#[test]
fn rc_atomics_compare_swap_and_fetch_add_on_big_endian_words() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let (mut a, _b, _) = pair(&mut h, RC, &cq);
    let la = h.mr(0x1000, 4096, acc::ALL);
    let rb = h.mr(0x7000_0000, 4096, acc::ALL);
    rb.write(64, &100u64.to_be_bytes());
    let fa = |raddr: u64, add: u64| Wr {
        opcode: op::ATOMIC_FA,
        signalled: true,
        raddr,
        rkey: rb.key,
        swap: add,
        sges: vec![la.sge(0, 8)],
        ..Wr::default()
    };
    a.post(&h, &fa(rb.addr(64), 23));
    let c = one(&mut cq, true);
    assert_eq!((c.opcode, c.byte_cnt), (op::ATOMIC_FA, 8), "{c:?}");
    assert_eq!(
        la.read(0, 8),
        100u64.to_be_bytes(),
        "original value returned"
    );
    assert_eq!(rb.read(64, 8), 123u64.to_be_bytes());
    let cs = |cmp: u64, swap: u64| Wr {
        opcode: op::ATOMIC_CS,
        signalled: true,
        raddr: rb.addr(64),
        rkey: rb.key,
        swap,
        cmp,
        sges: vec![la.sge(8, 8)],
        ..Wr::default()
    };
    a.post(&h, &cs(5, 9));
    assert!(one(&mut cq, true).ok());
    assert_eq!(
        rb.read(64, 8),
        123u64.to_be_bytes(),
        "compare failed: unchanged"
    );
    assert_eq!(la.read(8, 8), 123u64.to_be_bytes());
    a.post(&h, &cs(123, 0xdead));
    assert!(one(&mut cq, true).ok());
    assert_eq!(rb.read(64, 8), 0xdeadu64.to_be_bytes(), "swapped");
}

#[test]
fn rc_max_sges_inline_zero_length_and_nop() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let mut s = QpSpec::new(RC, cq.cqn);
    s.sq_shift = 10;
    s.rq_shift = 10;
    let mut a = h.qp(0x90, s);
    let mut b = h.qp(0x91, s);
    let lid = h.lid;
    h.connect(&a, s, 0x91, lid).unwrap();
    h.connect(&b, s, 0x90, lid).unwrap();
    let la = h.mr(0x4000_0100, 70_000, acc::ALL);
    let rb = h.mr(0x5000_0200, 70_000, acc::ALL);
    let mut rng = Rng(99);
    // 62 gather entries (ctrl + 62 x 16 = 1008 bytes = 63 units, the most
    // a WQE holds) into 64 scatter entries (a full 1 KiB receive WQE).
    let data = rng.bytes(62 * 1000);
    la.write(0, &data);
    let sges: Vec<Sge> = (0..62).map(|i| la.sge(i * 1000, 1000)).collect();
    let rsg: Vec<Sge> = (0..64).map(|i| rb.sge(i * 1000, 1000)).collect();
    b.post_recv(&rsg);
    a.post(
        &h,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            sges,
            ..Wr::default()
        },
    );
    let r = one(&mut cq, false);
    assert_eq!(r.byte_cnt, 62_000, "{r:?}");
    assert_eq!(rb.read(0, 62_000), data);
    assert!(one(&mut cq, true).ok());
    // Inline data (several 64-byte-bounded segments).
    let text = rng.bytes(300);
    b.post_recv(&[rb.sge(65_000, 400)]);
    a.post(
        &h,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            inline: Some(text.clone()),
            ..Wr::default()
        },
    );
    assert_eq!(one(&mut cq, false).byte_cnt, 300);
    assert_eq!(rb.read(65_000, 300), text);
    assert!(one(&mut cq, true).ok());
    // Zero-length SEND (no gather entry at all), zero-length WRITE/READ.
    b.post_recv(&[rb.sge(0, 8)]);
    a.post(
        &h,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            ..Wr::default()
        },
    );
    assert_eq!(one(&mut cq, false).byte_cnt, 0);
    assert!(one(&mut cq, true).ok());
    a.post(
        &h,
        &Wr {
            opcode: op::RDMA_WRITE,
            signalled: true,
            raddr: 0,
            rkey: 0,
            ..Wr::default()
        },
    );
    assert!(one(&mut cq, true).ok(), "zero-length WRITE checks no R_Key");
    a.post(
        &h,
        &Wr {
            opcode: op::RDMA_READ,
            signalled: true,
            raddr: 0,
            rkey: 0,
            ..Wr::default()
        },
    );
    assert!(one(&mut cq, true).ok());
    // NOP: signalled completes with opcode NOP; unsignalled stays silent.
    a.post(
        &h,
        &Wr {
            opcode: op::NOP,
            signalled: true,
            ..Wr::default()
        },
    );
    assert_eq!(one(&mut cq, true).opcode, op::NOP);
    a.post(
        &h,
        &Wr {
            opcode: op::NOP,
            ..Wr::default()
        },
    );
    a.post(
        &h,
        &Wr {
            opcode: op::RDMA_WRITE,
            raddr: rb.addr(0),
            rkey: rb.key,
            sges: vec![la.sge(0, 4)],
            ..Wr::default()
        },
    );
    assert!(cq.drain().is_empty(), "unsignalled WQEs complete silently");
    assert_eq!(rb.read(0, 4), data[..4], "...but they ran");
    h.assert_no_violations();
}

#[test]
fn uc_sends_and_writes_but_refuses_reads_and_atomics() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let (mut a, mut b, _) = pair(&mut h, UC, &cq);
    let la = h.mr(0x1_0000, 20_000, acc::ALL);
    let rb = h.mr(0x2_0000, 20_000, acc::ALL);
    let mut rng = Rng(7);
    let data = rng.bytes(9000);
    la.write(0, &data);
    b.post_recv(&[rb.sge(0, 10_000)]);
    a.post(&h, &Wr::send(vec![la.sge(0, 9000)]));
    assert_eq!(one(&mut cq, false).byte_cnt, 9000);
    assert!(one(&mut cq, true).ok());
    assert_eq!(rb.read(0, 9000), data);
    a.post(
        &h,
        &Wr {
            opcode: op::RDMA_WRITE_IMM,
            signalled: true,
            imm: 5,
            raddr: rb.addr(10_000),
            rkey: rb.key,
            sges: vec![la.sge(0, 9000)],
            ..Wr::default()
        },
    );
    assert!(one(&mut cq, true).ok());
    // No receive posted: UC drops the WRITE_IMM's completion (no RNR).
    assert_ne!(
        rb.read(10_000, 9000),
        data,
        "UC without a receive WQE drops the message"
    );
    // A SEND with no receive WQE is dropped too, and the sender completes.
    a.post(
        &h,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            ..Wr::default()
        },
    );
    assert!(one(&mut cq, true).ok());
    a.post(
        &h,
        &Wr {
            opcode: op::RDMA_READ,
            signalled: true,
            raddr: rb.addr(0),
            rkey: rb.key,
            sges: vec![la.sge(0, 8)],
            ..Wr::default()
        },
    );
    let e = one(&mut cq, true);
    assert_eq!(
        (e.opcode, e.syndrome),
        (0x1e, 0x02),
        "local QP operation error: {e:?}"
    );
    assert_eq!(h.qp_state(a.qpn), 4, "UC send-side error: SQE state");
}

#[test]
fn ud_send_with_grh_area_source_and_qkey_rules() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let s = QpSpec::new(UD, cq.cqn);
    let mut a = h.qp(0xa0, s);
    let mut b = h.qp(0xa1, s);
    h.connect(&a, s, 0, 0).unwrap();
    h.connect(&b, s, 0, 0).unwrap();
    let la = h.mr(0x1_0000, 8192, acc::ALL);
    let rb = h.mr(0x9_0000, 8192, acc::ALL);
    let data = Rng(3).bytes(2048);
    la.write(0, &data);
    rb.write(0, &[0xee; 40]);
    b.post_recv(&[rb.sge(0, 4096 + 40)]);
    let av = Av {
        port: 1,
        dlid: h.lid,
        dqpn: 0xa1,
        qkey: s.qkey,
        sl: 3,
        ..Av::default()
    };
    let w = Wr {
        opcode: op::SEND_IMM,
        signalled: true,
        imm: 77,
        ud: Some(av),
        sges: vec![la.sge(0, 2048)],
        ..Wr::default()
    };
    a.post(&h, &w);
    let r = one(&mut cq, false);
    assert_eq!(
        (r.qpn, r.byte_cnt, r.rqpn, r.slid, r.sl, r.grh, r.imm),
        (0xa1, 2048 + 40, 0xa0, h.lid, 3, false, 77),
        "{r:?}"
    );
    assert_eq!(
        rb.read(0, 40),
        vec![0xee; 40],
        "no GRH: the 40-byte area is left alone"
    );
    assert_eq!(rb.read(40, 2048), data);
    assert!(one(&mut cq, true).ok());
    // Q_Key with bit 31 set: the sending QP's own Q_Key goes out.
    b.post_recv(&[rb.sge(0, 4096 + 40)]);
    let av2 = Av {
        qkey: 0x8000_0000,
        ..av
    };
    a.post(
        &h,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            ud: Some(av2),
            ..Wr::default()
        },
    );
    let r = one(&mut cq, false);
    assert_eq!(
        (r.opcode, r.byte_cnt, r.imm & 0x7f),
        (1, 40, 0),
        "P_Key index 0 in the CQE"
    );
    assert!(one(&mut cq, true).ok());
    // A wrong Q_Key: dropped at the receiver, the sender still completes.
    b.post_recv(&[rb.sge(0, 4096 + 40)]);
    a.post(
        &h,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            ud: Some(Av { qkey: 0x1234, ..av }),
            ..Wr::default()
        },
    );
    let v = cq.drain();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].send && v[0].ok());
    // Above the MTU: refused with a local length error.
    let big = h.mr(0x20_0000, 8192, acc::ALL);
    a.post(
        &h,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            ud: Some(av),
            sges: vec![big.sge(0, 4097)],
            ..Wr::default()
        },
    );
    let e = one(&mut cq, true);
    assert_eq!(e.syndrome, 0x01, "{e:?}");
}

#[test]
fn query_qp_reports_the_psns_the_engines_reached() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let (mut a, mut b, _) = pair(&mut h, RC, &cq);
    let la = h.mr(0x10_0000, 65_536, acc::ALL);
    b.post_recv(&[la.sge(0, 65_536)]);
    // 10 000 bytes at MTU 4096: three packets.
    a.post(&h, &Wr::send(vec![la.sge(0, 10_000)]));
    cq.drain();
    let psn = |h: &mut Hca, q: u32, off: usize| {
        let o = h.r.cmd_out(q, 0, sim::Opcode::QUERY_QP).unwrap();
        u32::from_be_bytes(o[8 + off..12 + off].try_into().unwrap()) & 0xff_ffff
    };
    assert_eq!(psn(&mut h, a.qpn, 0x78), 0x100 + 3, "next send PSN");
    assert_eq!(psn(&mut h, b.qpn, 0x94), 0x100 + 3, "expected receive PSN");
}
