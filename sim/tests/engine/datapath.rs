//! Data-path corrections found running the real stack on the model.
//!
//! QPNs with a tag above the QPC index (what Linux's QP bitmap hands out after a
//! free), a malformed receive WQE answered with the Remote Operational Error NAK,
//! PortXmitDiscards counted and cleared by its own CounterSelect bit, and UD sends
//! with a GRH put on the wire and delivered into the receive buffer's GRH area.

use std::time::Duration;

use crate::harness::{CmdError, profile::LOG_QPS};
use crate::loopback::one;
use crate::mlx::UdHeader;
use crate::pairs::b2b;
use crate::poster::*;

/// A PMA PortCounters MAD for `port` (Get, or Set with `select`).
fn pma(port: u8, set: Option<u16>) -> Vec<u8> {
    let mut m = vec![0u8; 256];
    m[0] = 1;
    m[1] = 0x04;
    m[2] = 1;
    m[3] = if set.is_some() { 0x02 } else { 0x01 };
    m[0x10..0x12].copy_from_slice(&0x0012u16.to_be_bytes());
    m[0x40 + 1] = port;
    if let Some(s) = set {
        m[0x40 + 2..0x40 + 4].copy_from_slice(&s.to_be_bytes());
    }
    m
}

/// PortXmitDiscards and PortXmitPkts of `port` (a Set with `select` first,
/// if given).
fn discards(h: &mut Hca, port: u8, set: Option<u16>) -> (u16, u32) {
    let r =
        h.r.cmd_box(&pma(port, set), u32::from(port), 3, sim::Opcode::MAD_IFC)
            .unwrap();
    let d = &r[0x40..];
    (
        u16::from_be_bytes([d[14], d[15]]),
        u32::from_be_bytes([d[32], d[33], d[34], d[35]]),
    )
}

fn send(len: u32, mr: &Mr) -> Wr {
    Wr::send(vec![mr.sge(0, len)])
}

#[test]
fn a_qpn_with_a_tag_above_the_table_index_uses_that_slot() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let s = QpSpec::new(RC, cq.cqn);
    let tag = 1u32 << LOG_QPS;
    // 0x80 lives and dies; its slot comes back as 0x80 | tag, as Linux's
    // QP bitmap numbers it after the free.
    let a = h.qp(0x80, s);
    h.r.cmd(0, a.qpn, 2, sim::Opcode::RST_QP).unwrap();
    let mut a = h.qp(0x80 | tag, s);
    let mut b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80 | tag, lid).unwrap();
    // While 0x81 is out of RESET, its slot cannot take another tag.
    match h.try_qp(0x81 | tag, s) {
        Err(CmdError::Status(st)) => assert_eq!(st, sim::Status::BAD_RES_STATE),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("two live QPs in one context slot"),
    }
    let src = h.mr(0x10_0000, 4096, acc::ALL);
    let dst = h.mr(0x20_0000, 4096, acc::ALL);
    src.write(0, &[0x5a; 300]);
    b.post_recv(&[dst.sge(0, 4096)]);
    a.post(&h, &send(300, &src));
    let c = one(&mut cq, true);
    assert!(c.ok(), "{c:?}");
    assert_eq!(c.qpn, 0x80 | tag, "the CQE names the full QPN");
    let r = one(&mut cq, false);
    assert_eq!((r.qpn, r.byte_cnt), (0x81, 300));
    assert_eq!(dst.read(0, 300), vec![0x5a; 300]);
    let v = h.r.sim.take_violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("in use by QP 0x81"), "{v:?}");
}

#[test]
fn a_malformed_receive_wqe_is_a_remote_operation_error_on_the_wire() {
    let (mut a, mut b, _w) = b2b();
    let mut ca = a.cq(6);
    let mut cb = b.cq(6);
    let sa = QpSpec::new(RC, ca.cqn);
    let sb = QpSpec::new(RC, cb.cqn);
    let mut qa = a.qp(0x80, sa);
    let mut qb = b.qp(0x90, sb);
    a.connect(&qa, sa, 0x90, b.lid).unwrap();
    b.connect(&qb, sb, 0x80, a.lid).unwrap();
    let la = a.mr(0x1_0000, 16_384, acc::ALL);
    let rb = b.mr(0x2_0000, 16_384, acc::ALL);
    // A receive WQE whose scatter entry carries the inline bit.
    qb.post_recv(&[rb.sge(0, 0x8000_0000 | 8192)]);
    // A two-packet SEND: refused at its first packet.
    qa.post(&a, &send(5000, &la));
    wait_steps(&a.r, Duration::from_millis(2));
    let s = one(&mut ca, true);
    assert_eq!(s.syndrome, 0x14, "remote operation error: {s:?}");
    let r = one(&mut cb, false);
    assert_eq!(
        (r.syndrome, r.wqe_counter),
        (0x02, 0),
        "local QP operation error on the responder: {r:?}"
    );
    assert!(
        b.async_events().contains(&(0x05, 0x90)),
        "work queue catastrophic error on QP 0x90"
    );
    let v = b.r.sim.take_violations();
    assert!(
        v.iter().any(|x| x.contains("inline bit")),
        "the responder recorded the malformed WQE: {v:?}"
    );
    // The same over the loopback: one packet.
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let (mut x, mut y, _) = crate::pairs::pair(&mut h, RC, &cq);
    let m = h.mr(0x30_0000, 4096, acc::ALL);
    y.post_recv(&[m.sge(0, 0x8000_0000 | 64)]);
    x.post(&h, &send(16, &m));
    assert_eq!(one(&mut cq, true).syndrome, 0x14);
    assert_eq!(one(&mut cq, false).syndrome, 0x02);
    assert_eq!(h.r.sim.take_violations().len(), 1);
}

#[test]
fn port_xmit_discards_count_sends_a_port_cannot_make_and_clear_by_bit_6() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    // A UD QP on port 2, which was never brought up.
    let mut s = QpSpec::new(UD, cq.cqn);
    s.port = 2;
    let mut q = h.qp(0xa0, s);
    h.connect(&q, s, 0, 0).unwrap();
    let m = h.mr(0x10_0000, 4096, acc::ALL);
    for _ in 0..3 {
        let w = Wr {
            ud: Some(Av {
                port: 2,
                dlid: 7,
                dqpn: 0xa4,
                qkey: s.qkey,
                ..Av::default()
            }),
            ..send(64, &m)
        };
        q.post(&h, &w);
        assert!(one(&mut cq, true).ok(), "UD completes: the packet is lost");
    }
    assert_eq!(discards(&mut h, 2, None), (3, 0));
    // CounterSelect bit 7 is PortXmitConstraintErrors: not ours.
    assert_eq!(discards(&mut h, 2, Some(0x0080)), (3, 0));
    assert_eq!(discards(&mut h, 2, None), (3, 0));
    // Bit 6 is PortXmitDiscards (IBTA table 247).
    assert_eq!(discards(&mut h, 2, Some(0x0040)), (0, 0));
}

/// Port GID of port 1 of a `b2b()` node with node GUID `g`.
fn gid(g: u64) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
    d[8..].copy_from_slice(&(g + 1).to_be_bytes());
    d
}

#[test]
fn ud_with_a_grh_carries_it_and_lands_it_in_the_receive_buffer() {
    let (mut a, mut b, _w) = b2b();
    let mut ca = a.cq(6);
    let mut cb = b.cq(6);
    let su = QpSpec::new(UD, ca.cqn);
    let mut ua = a.qp(0xa0, su);
    a.connect(&ua, su, 0, 0).unwrap();
    let sb = QpSpec::new(UD, cb.cqn);
    let mut ub = b.qp(0xa4, sb);
    b.connect(&ub, sb, 0, 0).unwrap();
    let la = a.mr(0x1_0000, 16_384, acc::ALL);
    let rb = b.mr(0x2_0000, 16_384, acc::ALL);
    let data = Rng(9).bytes(1000);
    la.write(0, &data);
    rb.write(0, &[0xee; 64]);
    let (ga, gb) = (gid(0x0002_c903_0000_1000), gid(0x0002_c903_0000_2000));
    ub.post_recv(&[rb.sge(0, 2048)]);
    let av = Av {
        port: 1,
        dlid: b.lid,
        dqpn: 0xa4,
        qkey: 0x8000_0000,
        sl: 2,
        grh: Some((0, 64, 0x12, 0x3_4567, gb)),
        ..Av::default()
    };
    let w = Wr {
        opcode: op::SEND_IMM,
        imm: 0x0102_0304,
        ud: Some(av),
        ..send(1000, &la)
    };
    ua.post(&a, &w);
    wait_steps(&a.r, Duration::from_millis(1));
    assert!(one(&mut ca, true).ok());
    let r = one(&mut cb, false);
    assert!(r.grh, "the CQE says a GRH is there: {r:?}");
    assert_eq!((r.byte_cnt, r.rqpn, r.slid), (1040, 0xa0, a.lid));
    let g = rb.read(0, 40);
    let w0 = u32::from_be_bytes(g[0..4].try_into().unwrap());
    assert_eq!(w0 >> 28, 6, "IPVer");
    assert_eq!((w0 >> 20) & 0xff, 0x12, "traffic class");
    assert_eq!(w0 & 0xf_ffff, 0x3_4567, "flow label");
    // PayLen: BTH 12 + DETH 8 + ImmDt 4 + 1000 + ICRC 4.
    assert_eq!(u16::from_be_bytes([g[4], g[5]]), 1028, "PayLen");
    assert_eq!((g[6], g[7]), (0x1b, 64), "NxtHdr, HopLmt");
    assert_eq!(&g[8..24], &ga, "SGID: the sender's port GID");
    assert_eq!(&g[24..40], &gb, "DGID");
    assert_eq!(rb.read(40, 1000), data);
    // Without the GRH bit, the GRH area is left alone and the flag clear.
    rb.write(0, &[0xee; 64]);
    ub.post_recv(&[rb.sge(0, 2048)]);
    let w = Wr {
        ud: Some(Av { grh: None, ..av }),
        ..send(100, &la)
    };
    ua.post(&a, &w);
    wait_steps(&a.r, Duration::from_millis(1));
    assert!(one(&mut ca, true).ok());
    let r = one(&mut cb, false);
    assert!(!r.grh);
    assert_eq!(rb.read(0, 40), vec![0xee; 40]);
    // A DGID that is not the receiver's: dropped.
    ub.post_recv(&[rb.sge(0, 2048)]);
    let mut other = gb;
    other[15] ^= 0x40;
    let w = Wr {
        ud: Some(Av {
            grh: Some((0, 64, 0, 0, other)),
            ..av
        }),
        ..send(100, &la)
    };
    ua.post(&a, &w);
    wait_steps(&a.r, Duration::from_millis(1));
    assert!(one(&mut ca, true).ok());
    assert!(cb.drain().is_empty(), "not for this port: dropped");
    // A source GID index beyond the table: the AV is refused.
    let w = Wr {
        ud: Some(Av {
            grh: Some((200, 64, 0, 0, gb)),
            ..av
        }),
        ..send(100, &la)
    };
    ua.post(&a, &w);
    assert_eq!(one(&mut ca, true).syndrome, 0x02);
    assert_eq!(a.r.sim.take_violations().len(), 1);
}

#[test]
fn a_gmp_on_a_port_that_is_not_active_is_a_port_xmit_discard() {
    let mut h = Hca::bare(sim::SimHca::new(sim::SimConfig::default()));
    h.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    // Port 1 is up (Init) but no SM made it Active: QP1 may not send.
    let mut cq = h.cq(6);
    let (_qp0, mut qp1) = crate::mlx::special_qps(&mut h, &cq);
    let m = h.mr(0x10_0000, 8192, acc::ALL);
    let w = Wr {
        opcode: op::SEND,
        signalled: true,
        mlx_flags: Some((0, 5)),
        raw: Some(
            UdHeader {
                dlid: 5,
                dqpn: 1,
                qkey: 0x8001_0000,
                sqpn: 1,
                ..UdHeader::default()
            }
            .segment(),
        ),
        sges: vec![m.sge(0, 256)],
        tail: Some(crate::mlx::icrc_seg()),
        ..Wr::default()
    };
    qp1.post(&h, &w);
    assert!(one(&mut cq, true).ok(), "the WQE completes");
    assert_eq!(discards(&mut h, 1, None), (1, 0), "and the port discards");
}
