//! QP0/QP1: the MLX transport with the header the driver builds, checked
//! by the model, MADs received after the GRH area, SMPs dropped when QP0
//! is not ready (VL15Dropped).

use crate::harness::profile::BASE_SQPN;
use crate::loopback::one;
use crate::poster::*;

/// The LRH, BTH and DETH of a UD SEND-only of `payload` bytes, as the
/// driver writes them into an MLX WQE. The default is a 256-byte MAD to
/// LID 0 with the default P_Key, every other field 0.
#[derive(Debug, Clone, Copy)]
pub struct UdHeader {
    pub vl: u8,
    pub sl: u8,
    pub dlid: u16,
    pub slid: u16,
    pub pkey: u16,
    pub dqpn: u32,
    pub qkey: u32,
    pub sqpn: u32,
    pub payload: usize,
}

impl Default for UdHeader {
    fn default() -> Self {
        UdHeader {
            vl: 0,
            sl: 0,
            dlid: 0,
            slid: 0,
            pkey: 0xffff,
            dqpn: 0,
            qkey: 0,
            sqpn: 0,
            payload: 256,
        }
    }
}

impl UdHeader {
    /// The headers as an inline segment (4-byte header + 28 bytes, padded
    /// to 16).
    pub fn segment(&self) -> Vec<u8> {
        let UdHeader {
            vl,
            sl,
            dlid,
            slid,
            pkey,
            dqpn,
            qkey,
            sqpn,
            payload,
        } = *self;
        let pad = (4 - payload % 4) % 4;
        let words = (8 + 12 + 8 + payload + pad + 4) / 4;
        let mut h = Vec::new();
        h.push(vl << 4);
        h.push(sl << 4 | 2);
        h.extend_from_slice(&dlid.to_be_bytes());
        h.extend_from_slice(&(words as u16).to_be_bytes());
        h.extend_from_slice(&slid.to_be_bytes());
        h.push(0x64);
        h.push((pad as u8) << 4);
        h.extend_from_slice(&pkey.to_be_bytes());
        h.extend_from_slice(&dqpn.to_be_bytes());
        h.extend_from_slice(&7u32.to_be_bytes()); // PSN
        h.extend_from_slice(&qkey.to_be_bytes());
        h.extend_from_slice(&sqpn.to_be_bytes());
        let mut seg = (0x8000_0000u32 | h.len() as u32).to_be_bytes().to_vec();
        seg.extend_from_slice(&h);
        while !seg.len().is_multiple_of(16) {
            seg.push(0);
        }
        seg
    }
}

pub fn icrc_seg() -> Vec<u8> {
    let mut t = 0x8000_0004u32.to_be_bytes().to_vec();
    t.extend_from_slice(&[0; 12]);
    t
}

/// QP0 and QP1 of port 1 in RTS on one CQ.
pub fn special_qps(h: &mut Hca, cq: &Cq) -> (Qp, Qp) {
    let mut s = QpSpec::new(MLX, cq.cqn);
    s.sq_shift = 8;
    s.rq_shift = 5;
    s.qkey = 0;
    let qp0 = h.qp(BASE_SQPN, s);
    h.connect(&qp0, s, 0, 0).unwrap();
    s.qkey = 0x8001_0000;
    let qp1 = h.qp(BASE_SQPN + 2, s);
    h.connect(&qp1, s, 0, 0).unwrap();
    (qp0, qp1)
}

fn mad(class: u8) -> Vec<u8> {
    let mut m = vec![0u8; 256];
    m[0] = 1;
    m[1] = class;
    m[2] = 1;
    m[3] = 1;
    m[8..16].copy_from_slice(&0xabcdu64.to_be_bytes());
    m
}

#[test]
fn qp1_mad_loops_back_after_the_grh_area() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let (_qp0, mut qp1) = special_qps(&mut h, &cq);
    let m = h.mr(0x10_0000, 8192, acc::ALL);
    let g = mad(0x03); // SA class
    m.write(0, &g);
    qp1.post_recv(&[m.sge(4096, 296)]);
    let lid = h.lid;
    let w = Wr {
        opcode: op::SEND,
        signalled: true,
        mlx_flags: Some((2 << 8, lid)),
        raw: Some(
            UdHeader {
                sl: 2,
                dlid: lid,
                dqpn: 1,
                qkey: 0x8001_0000,
                sqpn: 1,
                ..UdHeader::default()
            }
            .segment(),
        ),
        sges: vec![m.sge(0, 256)],
        tail: Some(icrc_seg()),
        ..Wr::default()
    };
    qp1.post(&h, &w);
    let r = one(&mut cq, false);
    assert_eq!(
        (r.qpn, r.byte_cnt, r.rqpn, r.slid, r.sl, r.imm & 0x7f),
        (BASE_SQPN + 2, 296, 1, lid, 2, 0),
        "{r:?} {:?}",
        h.r.sim.violations()
    );
    assert_eq!(m.read(4096 + 40, 256), g);
    assert!(one(&mut cq, true).ok());
    h.assert_no_violations();
}

#[test]
fn mlx_header_checks_vl15_qkey_length_and_permissive_lid() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let (mut qp0, mut qp1) = special_qps(&mut h, &cq);
    let m = h.mr(0x10_0000, 8192, acc::ALL);
    m.write(0, &mad(0x01));
    m.write(512, &mad(0x81));
    let lid = h.lid;
    let body = |off| vec![m.sge(off, 256)];
    let cases: Vec<(&str, bool, Wr)> = vec![
        (
            "GMP on VL15",
            false,
            Wr {
                mlx_flags: Some((1 << 17, lid)),
                raw: Some(
                    UdHeader {
                        vl: 15,
                        dlid: lid,
                        dqpn: 1,
                        qkey: 0x8001_0000,
                        sqpn: 1,
                        ..UdHeader::default()
                    }
                    .segment(),
                ),
                ..Wr::default()
            },
        ),
        (
            "QP1 Q_Key",
            false,
            Wr {
                mlx_flags: Some((0, lid)),
                raw: Some(
                    UdHeader {
                        dlid: lid,
                        dqpn: 1,
                        qkey: 0x1234,
                        sqpn: 1,
                        ..UdHeader::default()
                    }
                    .segment(),
                ),
                ..Wr::default()
            },
        ),
        (
            "packet length",
            false,
            Wr {
                mlx_flags: Some((0, lid)),
                raw: Some(
                    UdHeader {
                        dlid: lid,
                        dqpn: 1,
                        qkey: 0x8001_0000,
                        sqpn: 1,
                        payload: 252,
                        ..UdHeader::default()
                    }
                    .segment(),
                ),
                ..Wr::default()
            },
        ),
        (
            "SMP off VL15",
            true,
            Wr {
                mlx_flags: Some((0, lid)),
                raw: Some(
                    UdHeader {
                        dlid: lid,
                        ..UdHeader::default()
                    }
                    .segment(),
                ),
                ..Wr::default()
            },
        ),
        (
            "permissive LID, LID-routed SMP",
            true,
            Wr {
                mlx_flags: Some((1 << 17 | 1 << 16, 0xffff)),
                raw: Some(
                    UdHeader {
                        vl: 15,
                        dlid: 0xffff,
                        slid: 0xffff,
                        ..UdHeader::default()
                    }
                    .segment(),
                ),
                ..Wr::default()
            },
        ),
    ];
    for (what, on_qp0, mut w) in cases {
        w.opcode = op::SEND;
        w.signalled = true;
        w.sges = body(0);
        w.tail = Some(icrc_seg());
        let (q, qpn) = if on_qp0 {
            (&mut qp0, BASE_SQPN)
        } else {
            (&mut qp1, BASE_SQPN + 2)
        };
        q.post(&h, &w);
        let c = one(&mut cq, true);
        assert_eq!((c.opcode, c.syndrome), (0x1e, 0x02), "{what}: {c:?}");
        assert!(
            h.r.sim
                .violations()
                .iter()
                .any(|v| v.contains(&format!("QP {qpn:#x} MLX"))),
            "{what}"
        );
        // Back to RTS for the next case (SQE -> RTS).
        let m = crate::harness::QpMbox::new(3, MLX);
        h.r.cmd_in(&m.0, qpn, 0, sim::Opcode::SQERR2RTS_QP).unwrap();
        h.r.sim.take_violations();
    }
    // A directed-route SMP with the permissive DLID is fine (it leaves the
    // port; nothing is cabled, so it is not seen again).
    qp0.post(
        &h,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            mlx_flags: Some((1 << 17 | 1 << 16, 0xffff)),
            raw: Some(
                UdHeader {
                    vl: 15,
                    dlid: 0xffff,
                    slid: 0xffff,
                    ..UdHeader::default()
                }
                .segment(),
            ),
            sges: body(512),
            tail: Some(icrc_seg()),
            ..Wr::default()
        },
    );
    assert!(one(&mut cq, true).ok(), "{:?}", h.r.sim.violations());
}

#[test]
fn smps_to_a_qp0_that_is_not_ready_are_dropped_and_counted() {
    let mut h = Hca::new();
    let mut cq = h.cq(6);
    let mut s = QpSpec::new(MLX, cq.cqn);
    s.sq_shift = 8;
    s.rq_shift = 5;
    s.qkey = 0;
    let mut qp0 = h.qp(BASE_SQPN, s);
    h.connect(&qp0, s, 0, 0).unwrap();
    let m = h.mr(0x10_0000, 8192, acc::ALL);
    m.write(0, &mad(0x01));
    let lid = h.lid;
    let smp = Wr {
        opcode: op::SEND,
        signalled: true,
        mlx_flags: Some((1 << 17, lid)),
        raw: Some(
            UdHeader {
                vl: 15,
                dlid: lid,
                ..UdHeader::default()
            }
            .segment(),
        ),
        sges: vec![m.sge(0, 256)],
        tail: Some(icrc_seg()),
        ..Wr::default()
    };
    // QP0 in RTS but no receive posted: dropped (no RNR on UD).
    qp0.post(&h, &smp);
    assert!(one(&mut cq, true).ok());
    let pc = h.r.cmd_box(&pma_get(), 1, 3, sim::Opcode::MAD_IFC).unwrap();
    assert_eq!(
        u16::from_be_bytes([pc[0x40 + 22], pc[0x40 + 23]]),
        1,
        "VL15Dropped"
    );
    // With a receive WQE it arrives.
    qp0.post_recv(&[m.sge(4096, 296)]);
    qp0.post(&h, &smp);
    let r = one(&mut cq, false);
    assert_eq!((r.byte_cnt, r.rqpn, r.slid), (296, 0, lid));
}

/// PMA Get(PortCounters) for port 1.
pub fn pma_get() -> Vec<u8> {
    let mut m = vec![0u8; 256];
    m[0] = 1;
    m[1] = 0x04;
    m[2] = 1;
    m[3] = 0x01;
    m[0x10..0x12].copy_from_slice(&0x0012u16.to_be_bytes());
    m[0x40 + 1] = 1;
    m
}
