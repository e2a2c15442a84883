//! RoCE v1 between two cards on Ethernet ports: RC SEND/WRITE/READ and UD
//! SEND with data checked, the card's checks (a GID or MAC that is not the
//! port's, an address without a GRH), QP1 over RoCE.

use sim::{Opcode, Status};

use crate::common::*;
use crate::harness::CmdError;
use crate::harness::profile::BASE_SQPN;
use crate::poster::*;

struct Pair {
    a: Hca,
    b: Hca,
    _w: sim::Wire,
    ida: ([u8; 6], [u8; 16]),
    idb: ([u8; 6], [u8; 16]),
}

fn pair() -> Pair {
    let (mut a, mut b, w) = eth_b2b();
    // Jumbo frames (netdev MTU 9000): RoCE path MTU 4096.
    set_general(&mut a.r, 1, 9022).unwrap();
    set_general(&mut b.r, 1, 9022).unwrap();
    let ida = eth_up(&mut a, 1);
    let idb = eth_up(&mut b, 1);
    settle(&a);
    Pair {
        a,
        b,
        _w: w,
        ida,
        idb,
    }
}

#[test]
fn rc_send_write_read_over_roce_with_data_checked() {
    let mut p = pair();
    let mut ca = p.a.cq(8);
    let mut cb = p.b.cq(8);
    let sa = QpSpec::new(RC, ca.cqn);
    let sb = QpSpec::new(RC, cb.cqn);
    let mut qa = p.a.qp(0x80, sa);
    let mut qb = p.b.qp(0x90, sb);
    roce_connect(&mut p.a, &qa, sa, 0x90, RocePath::to(p.idb.0, p.idb.1)).unwrap();
    roce_connect(&mut p.b, &qb, sb, 0x80, RocePath::to(p.ida.0, p.ida.1)).unwrap();
    let la = p.a.mr(0x10_0000_0100, 64 << 10, acc::ALL);
    let rb = p.b.mr(0x20_0000_0200, 64 << 10, acc::ALL);
    let mut rng = Rng(7);
    // SEND of 10 000 bytes: three packets at MTU 4096.
    let data = rng.bytes(10_000);
    la.write(0, &data);
    qb.post_recv(&[rb.sge(0, 20_000)]);
    qa.post(&p.a, &Wr::send(vec![la.sge(0, 10_000)]));
    let r = one(&p.b, &mut cb, false);
    assert_eq!((r.opcode, r.byte_cnt), (1, 10_000), "{r:?}");
    assert_eq!(rb.read(0, 10_000), data);
    assert!(one(&p.a, &mut ca, true).ok());
    // RDMA WRITE of 9000 bytes.
    let data = rng.bytes(9000);
    la.write(20_000, &data);
    qa.post(
        &p.a,
        &Wr {
            opcode: op::RDMA_WRITE,
            signalled: true,
            raddr: rb.addr(30_000),
            rkey: rb.key,
            sges: vec![la.sge(20_000, 9000)],
            ..Wr::default()
        },
    );
    assert!(one(&p.a, &mut ca, true).ok());
    assert_eq!(rb.read(30_000, 9000), data);
    // RDMA READ of 12 000 bytes (three responses).
    let remote = rng.bytes(12_000);
    rb.write(40_000, &remote);
    qa.post(
        &p.a,
        &Wr {
            opcode: op::RDMA_READ,
            signalled: true,
            raddr: rb.addr(40_000),
            rkey: rb.key,
            sges: vec![la.sge(40_000, 12_000)],
            ..Wr::default()
        },
    );
    let c = one(&p.a, &mut ca, true);
    assert_eq!((c.opcode, c.byte_cnt), (op::RDMA_READ, 12_000), "{c:?}");
    assert_eq!(la.read(40_000, 12_000), remote);
    let ea = p.a.r.sim.eth_counters(1).unwrap();
    let eb = p.b.r.sim.eth_counters(1).unwrap();
    assert!(ea.roce_tx >= 5 && eb.roce_rx >= 5, "{ea:?} {eb:?}");
    assert_eq!((ea.roce_not_ours, eb.roce_not_ours), (0, 0));
    p.a.assert_no_violations();
    p.b.assert_no_violations();
}

#[test]
fn rc_and_uc_receives_over_roce_get_no_grh_in_their_buffer() {
    // Every RoCE packet has a GRH, but only UD (and MLX) receives scatter
    // it: an RC or UC receive gets the payload alone, at offset 0 (Linux
    // mlx4_ib reserves GRH room in UD receive buffers only).
    let mut p = pair();
    let mut ca = p.a.cq(8);
    let mut cb = p.b.cq(8);
    let la = p.a.mr(0x10_0000_0000, 8192, acc::ALL);
    let rb = p.b.mr(0x20_0000_0000, 8192, acc::ALL);
    la.write(0, b"xRoCE payload");
    for (st, qpn) in [(RC, 0x80u32), (UC, 0x81)] {
        let sa = QpSpec::new(st, ca.cqn);
        let sb = QpSpec::new(st, cb.cqn);
        let mut qa = p.a.qp(qpn, sa);
        let mut qb = p.b.qp(qpn + 0x10, sb);
        roce_connect(
            &mut p.a,
            &qa,
            sa,
            qpn + 0x10,
            RocePath::to(p.idb.0, p.idb.1),
        )
        .unwrap();
        roce_connect(&mut p.b, &qb, sb, qpn, RocePath::to(p.ida.0, p.ida.1)).unwrap();
        // A 1-byte SEND into a 1-byte buffer.
        rb.write(0, &[0xee; 64]);
        qb.post_recv(&[rb.sge(0, 1)]);
        qa.post(&p.a, &Wr::send(vec![la.sge(0, 1)]));
        let r = one(&p.b, &mut cb, false);
        assert!(r.ok(), "{st}: {r:?}");
        assert_eq!((r.byte_cnt, r.grh), (1, false), "{st}: {r:?}");
        assert_eq!(
            rb.read(0, 2),
            b"x\xee",
            "{st}: the byte at 0, nothing after it"
        );
        assert!(one(&p.a, &mut ca, true).ok(), "{st}");
        // 13 bytes into a 64-byte buffer: the payload at 0, the rest
        // untouched.
        rb.write(0, &[0xee; 64]);
        qb.post_recv(&[rb.sge(0, 64)]);
        qa.post(&p.a, &Wr::send(vec![la.sge(0, 13)]));
        let r = one(&p.b, &mut cb, false);
        assert_eq!((r.byte_cnt, r.grh), (13, false), "{st}: {r:?}");
        assert_eq!(rb.read(0, 13), b"xRoCE payload", "{st}");
        assert_eq!(rb.read(13, 51), vec![0xee; 51], "{st}: no GRH bytes");
        assert!(one(&p.a, &mut ca, true).ok(), "{st}");
    }
    p.a.assert_no_violations();
    p.b.assert_no_violations();
}

#[test]
fn ud_send_over_roce_lands_after_the_grh_with_the_source_mac() {
    let mut p = pair();
    let mut ca = p.a.cq(8);
    let mut cb = p.b.cq(8);
    let mut qa = p.a.qp(0x80, QpSpec::new(UD, ca.cqn));
    let mut sb = QpSpec::new(UD, cb.cqn);
    sb.qkey = 0x1111;
    let mut qb = p.b.qp(0x90, sb);
    p.a.connect(&qa, QpSpec::new(UD, ca.cqn), 0, 0).unwrap();
    p.b.connect(&qb, sb, 0, 0).unwrap();
    let la = p.a.mr(0x10_0000_0000, 8192, acc::ALL);
    let rb = p.b.mr(0x20_0000_0000, 8192, acc::ALL);
    la.write(0, b"hello over RoCE");
    qb.post_recv(&[rb.sge(0, 4096)]);
    let av = roce_av(1, p.idb.1, p.idb.0, 0x90, 0x1111);
    qa.post(&p.a, &ud_wr(av, la.sge(0, 15)));
    let r = one(&p.b, &mut cb, false);
    assert_eq!((r.byte_cnt, r.rqpn, r.grh), (40 + 15, 0x80, true), "{r:?}");
    let grh = rb.read(0, 40);
    assert_eq!(grh[0] >> 4, 6);
    assert_eq!(&grh[8..24], &p.ida.1, "SGID");
    assert_eq!(&grh[24..40], &p.idb.1, "DGID");
    assert_eq!(rb.read(40, 15), b"hello over RoCE");
    // The CQE has the source MAC where an IB CQE has the SLID.
    let _ = cb.drain();
    assert!(one(&p.a, &mut ca, true).ok());
    p.a.assert_no_violations();
    p.b.assert_no_violations();
}

#[test]
fn the_cards_own_checks_foreign_gid_and_no_grh() {
    let mut p = pair();
    let mut ca = p.a.cq(8);
    let cb = p.b.cq(8);
    let mut qa = p.a.qp(0x80, QpSpec::new(UD, ca.cqn));
    let mut sb = QpSpec::new(UD, cb.cqn);
    sb.qkey = 0x1111;
    let mut qb = p.b.qp(0x90, sb);
    p.a.connect(&qa, QpSpec::new(UD, ca.cqn), 0, 0).unwrap();
    p.b.connect(&qb, sb, 0, 0).unwrap();
    let la = p.a.mr(0x10_0000_0000, 8192, acc::ALL);
    let rb = p.b.mr(0x20_0000_0000, 8192, acc::ALL);
    qb.post_recv(&[rb.sge(0, 4096)]);
    // B's MAC but a GID B does not have: dropped and counted at B.
    let mut foreign = p.idb.1;
    foreign[15] ^= 0x55;
    qa.post(
        &p.a,
        &ud_wr(roce_av(1, foreign, p.idb.0, 0x90, 0x1111), la.sge(0, 8)),
    );
    assert!(one(&p.a, &mut ca, true).ok(), "sent all the same");
    settle(&p.a);
    assert_eq!(p.b.r.sim.eth_counters(1).unwrap().roce_not_ours, 1);
    // B's GID but another MAC: not for B either.
    qa.post(
        &p.a,
        &ud_wr(
            roce_av(1, p.idb.1, [0x02, 0, 0, 0, 0, 9], 0x90, 0x1111),
            la.sge(0, 8),
        ),
    );
    assert!(one(&p.a, &mut ca, true).ok());
    settle(&p.a);
    assert_eq!(p.b.r.sim.eth_counters(1).unwrap().roce_not_ours, 2);
    // An address vector without a GRH (DGID zero): a bad WQE.
    qa.post(
        &p.a,
        &ud_wr(roce_av(1, [0; 16], p.idb.0, 0x90, 0x1111), la.sge(0, 8)),
    );
    let c = one(&p.a, &mut ca, true);
    assert_eq!(
        (c.ok(), c.syndrome),
        (false, 0x02),
        "local QP operation error"
    );
    assert!(p.a.r.sim.take_violations()[0].contains("no GRH"));
    // An RC path without the GRH bit is refused at INIT2RTR.
    let s = QpSpec::new(RC, ca.cqn);
    let q = p.a.qp(0x81, s);
    let mut path = RocePath::to(p.idb.0, p.idb.1);
    path.grh = false;
    assert_eq!(
        roce_connect(&mut p.a, &q, s, 0x90, path),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
    assert!(p.a.r.sim.take_violations()[0].contains("no GRH"));
    let _ = cb;
}

#[test]
fn qp1_over_roce_carries_a_mad_with_its_ethernet_and_grh_headers() {
    let mut p = pair();
    let mut ca = p.a.cq(8);
    let mut cb = p.b.cq(8);
    // QP1 of port 1 on both cards (MLX, the special QPN).
    let qp1 = BASE_SQPN + 2;
    let mut s = QpSpec::new(MLX, ca.cqn);
    s.qkey = 0x8001_0000;
    s.sq_shift = 9;
    let mut qa = p.a.qp(qp1, s);
    p.a.connect(&qa, s, 0, 0).unwrap();
    let mut s = QpSpec::new(MLX, cb.cqn);
    s.qkey = 0x8001_0000;
    let mut qb = p.b.qp(qp1, s);
    p.b.connect(&qb, s, 0, 0).unwrap();
    let rb = p.b.mr(0x20_0000_0000, 8192, acc::ALL);
    qb.post_recv(&[rb.sge(0, 4096)]);
    // What Linux's build_mlx_header writes for an Ethernet port: Ethernet
    // header (0x8915), GRH, BTH (UD SEND only to QP1), DETH, then the MAD
    // and the 4-byte ICRC room.
    let mad: Vec<u8> = (0..=255u8).collect();
    let mut hdr = frame(p.idb.0, p.ida.0, 0x8915, &[]);
    let mut grh = [0u8; 40];
    grh[0] = 0x60;
    grh[4..6].copy_from_slice(&(12u16 + 8 + 256 + 4).to_be_bytes());
    grh[6] = 0x1b;
    grh[7] = 64;
    grh[8..24].copy_from_slice(&p.ida.1);
    grh[24..40].copy_from_slice(&p.idb.1);
    hdr.extend_from_slice(&grh);
    hdr.extend_from_slice(&[0x64, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 7]);
    hdr.extend_from_slice(&0x8001_0000u32.to_be_bytes());
    hdr.extend_from_slice(&1u32.to_be_bytes());
    let la = p.a.mr(0x10_0000_0000, 8192, acc::ALL);
    la.write(0, &mad);
    let w = Wr {
        opcode: op::SEND,
        signalled: true,
        inline: Some(hdr),
        sges: vec![la.sge(0, 256)],
        mlx_flags: Some((0, 0)),
        tail: Some(vec![0x80, 0, 0, 4, 0, 0, 0, 0]),
        ..Wr::default()
    };
    // As Linux writes it, the destination MAC also in the control
    // segment (srcrb_flags16[0] and the rlid/imm dword), the PCP in
    // sched_prio.
    let mut b = qa.build(&w);
    b[4..6].copy_from_slice(&0u16.to_be_bytes());
    b[8..10].copy_from_slice(&p.idb.0[..2]);
    b[12..16].copy_from_slice(&p.idb.0[2..]);
    qa.put(w.opcode, false, &b);
    p.a.ring_send(qa.qpn);
    assert!(one(&p.a, &mut ca, true).ok());
    let r = one(&p.b, &mut cb, false);
    assert_eq!((r.byte_cnt, r.rqpn, r.grh), (40 + 256, 1, true), "{r:?}");
    assert_eq!(rb.read(40, 256), mad);
    assert_eq!(&rb.read(0, 40)[8..24], &p.ida.1);
    // The bytes the card put where an IB CQE has the SLID: the source MAC.
    p.a.assert_no_violations();
    p.b.assert_no_violations();
    let _ = Opcode::NOP;
}

/// A UD receive CQE of B, raw, waiting (fake time) for it.
fn raw_recv(h: &Hca, cq: &mut Cq) -> [u8; 32] {
    for _ in 0..200 {
        if let Some(c) = poll_raw(cq) {
            return c;
        }
        settle(h);
    }
    panic!("no CQE");
}

#[test]
fn roce_cqes_carry_the_source_mac_and_the_tag_and_vlans_are_checked() {
    let mut p = pair();
    let mut ca = p.a.cq(8);
    let mut cb = p.b.cq(8);
    // Both ports in VLAN 7 (VLAN table index 0).
    let mut v = vec![0u8; 512];
    v[0..4].copy_from_slice(&(1u32 << 31 | 7).to_be_bytes());
    set_port_eth(&mut p.a.r, 1, 3, &v).unwrap();
    set_port_eth(&mut p.b.r, 1, 3, &v).unwrap();
    let mut qa = p.a.qp(0x80, QpSpec::new(UD, ca.cqn));
    let mut sb = QpSpec::new(UD, cb.cqn);
    sb.qkey = 0x1111;
    let mut qb = p.b.qp(0x90, sb);
    p.a.connect(&qa, QpSpec::new(UD, ca.cqn), 0, 0).unwrap();
    p.b.connect(&qb, sb, 0, 0).unwrap();
    let la = p.a.mr(0x10_0000_0000, 8192, acc::ALL);
    let rb = p.b.mr(0x20_0000_0000, 8192, acc::ALL);
    la.write(0, b"untagged, then tagged");
    for k in 0..3 {
        qb.post_recv(&[rb.sge(k * 1024, 1024)]);
    }
    // Untagged: the CQE has the source MAC where an IB CQE has the SLID
    // (mlx4_ib's IB_WC_WITH_SMAC), no C-VLAN bit.
    qa.post(
        &p.a,
        &ud_wr(roce_av(1, p.idb.1, p.idb.0, 0x90, 0x1111), la.sge(0, 8)),
    );
    let c = raw_recv(&p.b, &mut cb);
    assert_eq!(cqe_basics(&c).3, 40 + 8);
    assert_eq!(&c[0x0e..0x14], &p.ida.0, "smac");
    assert_eq!(c[0] & 0x20, 0, "untagged");
    assert_ne!(c[8] & 0x80, 0, "GRH present");
    // Tagged (Linux create_iboe_ah: vlan | sl << 13): the tag in sl_vid.
    let mut av = roce_av(1, p.idb.1, p.idb.0, 0x90, 0x1111);
    av[0x0c..0x10].copy_from_slice(&(5u32 << 29).to_be_bytes());
    av[0x28..0x2a].copy_from_slice(&(5u16 << 13 | 7).to_be_bytes());
    qa.post(&p.a, &ud_wr(av.clone(), la.sge(0, 21)));
    let c = raw_recv(&p.b, &mut cb);
    assert_eq!(cqe_basics(&c).3, 40 + 21);
    assert_ne!(c[0] & 0x20, 0, "C-VLAN present");
    assert_eq!(u16::from_be_bytes([c[0x0c], c[0x0d]]), 5 << 13 | 7);
    assert_eq!(&c[0x0e..0x14], &p.ida.0);
    assert_eq!(rb.read(1024 + 40, 21), b"untagged, then tagged");
    // VLAN 8, which B is not in: dropped and counted, nothing received.
    av[0x28..0x2a].copy_from_slice(&8u16.to_be_bytes());
    qa.post(&p.a, &ud_wr(av, la.sge(0, 8)));
    settle(&p.a);
    settle(&p.b);
    assert!(poll_raw(&mut cb).is_none());
    assert_eq!(p.b.r.sim.eth_counters(1).unwrap().rx_vlan_drop, 1);
    let sends = drain_raw(&mut ca);
    assert_eq!(sends.len(), 3, "every send completed");
    p.a.assert_no_violations();
    p.b.assert_no_violations();
}

#[test]
fn uc_and_a_tagged_rc_path_over_roce() {
    let mut p = pair();
    let mut ca = p.a.cq(8);
    let mut cb = p.b.cq(8);
    let mut v = vec![0u8; 512];
    v[4..8].copy_from_slice(&(1u32 << 31 | 300).to_be_bytes());
    set_port_eth(&mut p.a.r, 1, 3, &v).unwrap();
    set_port_eth(&mut p.b.r, 1, 3, &v).unwrap();
    let la = p.a.mr(0x10_0000_0000, 64 << 10, acc::ALL);
    let rb = p.b.mr(0x20_0000_0000, 64 << 10, acc::ALL);
    let mut rng = Rng(9);
    // UC: SEND and RDMA WRITE.
    let sa = QpSpec::new(UC, ca.cqn);
    let sb = QpSpec::new(UC, cb.cqn);
    let mut qa = p.a.qp(0x80, sa);
    let mut qb = p.b.qp(0x90, sb);
    roce_connect(&mut p.a, &qa, sa, 0x90, RocePath::to(p.idb.0, p.idb.1)).unwrap();
    roce_connect(&mut p.b, &qb, sb, 0x80, RocePath::to(p.ida.0, p.ida.1)).unwrap();
    let d = rng.bytes(6000);
    la.write(0, &d);
    qb.post_recv(&[rb.sge(0, 8192)]);
    qa.post(&p.a, &Wr::send(vec![la.sge(0, 6000)]));
    assert_eq!(one(&p.b, &mut cb, false).byte_cnt, 6000);
    assert_eq!(rb.read(0, 6000), d);
    assert!(one(&p.a, &mut ca, true).ok());
    qa.post(
        &p.a,
        &Wr {
            opcode: op::RDMA_WRITE,
            signalled: true,
            raddr: rb.addr(16 << 10),
            rkey: rb.key,
            sges: vec![la.sge(0, 6000)],
            ..Wr::default()
        },
    );
    assert!(one(&p.a, &mut ca, true).ok());
    settle(&p.b);
    assert_eq!(rb.read(16 << 10, 6000), d);
    // RC on a tagged path (VLAN table index 1, VID 300, SL 2): both ends
    // in VLAN 300, the data arrives.
    let sa = QpSpec::new(RC, ca.cqn);
    let sb = QpSpec::new(RC, cb.cqn);
    let mut qa = p.a.qp(0x81, sa);
    let mut qb = p.b.qp(0x91, sb);
    let tagged = |dmac, dgid| RocePath {
        vlan_index: Some(1),
        sl: 2,
        ..RocePath::to(dmac, dgid)
    };
    roce_connect(&mut p.a, &qa, sa, 0x91, tagged(p.idb.0, p.idb.1)).unwrap();
    roce_connect(&mut p.b, &qb, sb, 0x81, tagged(p.ida.0, p.ida.1)).unwrap();
    let d = rng.bytes(9000);
    la.write(32 << 10, &d);
    qb.post_recv(&[rb.sge(32 << 10, 10_000)]);
    qa.post(&p.a, &Wr::send(vec![la.sge(32 << 10, 9000)]));
    assert_eq!(one(&p.b, &mut cb, false).byte_cnt, 9000);
    assert_eq!(rb.read(32 << 10, 9000), d);
    assert!(one(&p.a, &mut ca, true).ok());
    // B leaves VLAN 300: A's next SEND is dropped at B and counted, and
    // A's RC QP retries.
    set_port_eth(&mut p.b.r, 1, 3, &vec![0u8; 512]).unwrap();
    qb.post_recv(&[rb.sge(32 << 10, 10_000)]);
    qa.post(&p.a, &Wr::send(vec![la.sge(32 << 10, 100)]));
    settle(&p.a);
    settle(&p.b);
    assert!(ca.drain().is_empty(), "no ACK");
    assert!(p.b.r.sim.eth_counters(1).unwrap().rx_vlan_drop >= 1);
    p.a.assert_no_violations();
    p.b.assert_no_violations();
}
