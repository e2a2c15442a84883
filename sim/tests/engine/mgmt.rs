//! What the card checks and counts for the subnet's management: the source
//! LID of connected packets, the VL a data packet leaves on (the port's
//! SLtoVLMappingTable), a P_Key violation at QP1 (P_KeyViolations and the
//! SMA's Bad P_Key trap on QP0), packets to the port's own LIDs, which
//! never leave it, and the link's speed: FDR only when both ends of the
//! cable have it.

use std::time::Duration;

use hal::Clock;
use sim::fabric::packet::{self, Bth, Deth, Headers, Lrh, opcode};
use sim::fabric::{Packet, PortId};
use sim::{SimHca, Wire};

use crate::harness::profile::BASE_SQPN;
use crate::loopback::one;
use crate::mlx::special_qps;
use crate::pairs::{b2b, cfg};
use crate::poster::*;

/// One HCA whose port 1 is cabled to a bare fabric port the test reads
/// and writes packets on; port 1 Active with LID 5 (SM LID 5).
fn on_a_raw_cable() -> (Hca, Wire, PortId) {
    let w = Wire::new(Duration::from_micros(1));
    let sim = SimHca::new_on(cfg(0x0002_c903_0000_1000), &w);
    let raw = {
        let fab = w.fabric();
        let mut f = fab.lock().unwrap();
        let raw = f.attach_hca_port(0x0002_c903_0000_9900, 1);
        f.connect(sim.fabric_port(1).unwrap(), raw).unwrap();
        f.set_enabled(raw, true).unwrap();
        raw
    };
    let mut h = Hca::bare(sim);
    h.port_up(1, 5).unwrap();
    (h, w, raw)
}

/// Every packet waiting at the raw port.
fn take(w: &Wire, raw: PortId) -> Vec<Packet> {
    let fab = w.fabric();
    let mut f = fab.lock().unwrap();
    let now = w.fake_clock().unwrap().now_ns() + 1_000_000_000;
    std::iter::from_fn(|| f.receive(raw, now)).collect()
}

/// Sends `bytes` from the raw port to the HCA and lets it take them.
fn inject(h: &Hca, w: &Wire, raw: PortId, bytes: Vec<u8>) {
    {
        let fab = w.fabric();
        let mut f = fab.lock().unwrap();
        let now = w.fake_clock().unwrap().now_ns();
        assert!(f.transmit(raw, Packet { bytes }, now));
    }
    wait_steps(&h.r, Duration::from_micros(5));
}

/// SubnSet through MAD_IFC (the SM's part) of attribute `attr` with
/// modifier `modifier` and the 64 data bytes `data`.
fn smp_set(h: &mut Hca, attr: u16, modifier: u32, data: &[u8]) -> Vec<u8> {
    let mut m = crate::harness::smp_get(attr, modifier);
    m[3] = 0x02;
    m[0x40..0x40 + data.len()].copy_from_slice(data);
    h.r.cmd_box(&m, 1, 3, sim::Opcode::MAD_IFC).unwrap()
}

/// PortInfo through MAD_IFC.
fn port_info(h: &mut Hca) -> Vec<u8> {
    let m = crate::harness::smp_get(0x0015, 1);
    let r = h.r.cmd_box(&m, 1, 3, sim::Opcode::MAD_IFC).unwrap();
    r[0x40..0x80].to_vec()
}

/// A UD QP 0xa0 on `cq`, ready to send.
fn ud_qp(h: &mut Hca, cq: &Cq) -> Qp {
    let s = QpSpec::new(UD, cq.cqn);
    let q = h.qp(0xa0, s);
    h.connect(&q, s, 0, 0).unwrap();
    q
}

fn ud_send(to: u16, sl: u8, mr: &Mr) -> Wr {
    Wr {
        opcode: op::SEND,
        signalled: true,
        ud: Some(Av {
            port: 1,
            dlid: to,
            dqpn: 0x99,
            qkey: 0x1234,
            sl,
            ..Av::default()
        }),
        sges: vec![mr.sge(0, 64)],
        ..Wr::default()
    }
}

#[test]
fn data_packets_leave_on_the_vl_their_sl_maps_to() {
    let (mut h, w, raw) = on_a_raw_cable();
    let mut cq = h.cq(6);
    let mut q = ud_qp(&mut h, &cq);
    let mr = h.mr(0x10_0000, 4096, acc::ALL);
    // The default table maps every SL to VL 0.
    q.post(&h, &ud_send(9, 5, &mr));
    assert!(cq.drain().iter().all(Cqe::ok));
    let p = take(&w, raw);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].vl(), Some(0));
    // The SM's SLtoVLMappingTable: SL n on VL n % 8, SL 7 on VL 15.
    let map = [0x01, 0x23, 0x45, 0x6f, 0x01, 0x23, 0x45, 0x67];
    let r = smp_set(&mut h, 0x0017, 0, &map);
    assert_eq!(&r[0x40..0x48], &map, "the table as set");
    for (sl, vl) in [(5u8, 5u8), (0, 0), (9, 1), (14, 6)] {
        q.post(&h, &ud_send(9, sl, &mr));
        let p = take(&w, raw);
        assert_eq!(p.len(), 1, "SL {sl}");
        assert_eq!(p[0].vl(), Some(vl), "SL {sl}");
        assert_eq!(p[0].bytes[1] >> 4, sl, "the LRH keeps the SL");
    }
    // An SL mapped to VL 15 does not leave as data: dropped at the port,
    // counted as a discard; the UD send completes as a lost packet does.
    let before =
        h.r.cmd_box(&crate::mlx::pma_get(), 1, 3, sim::Opcode::MAD_IFC)
            .unwrap();
    q.post(&h, &ud_send(9, 7, &mr));
    assert!(take(&w, raw).is_empty(), "nothing on VL 15");
    let after =
        h.r.cmd_box(&crate::mlx::pma_get(), 1, 3, sim::Opcode::MAD_IFC)
            .unwrap();
    let discards = |pc: &[u8]| u16::from_be_bytes([pc[0x40 + 14], pc[0x40 + 15]]);
    assert_eq!(discards(&after) - discards(&before), 1, "PortXmitDiscards");
    assert_eq!(cq.drain().len(), 5);
    h.assert_no_violations();
}

#[test]
fn connected_packets_from_another_lid_than_the_qps_remote_lid_are_dropped() {
    let (mut a, mut b, _w) = b2b();
    let mut ca = a.cq(6);
    let mut cb = b.cq(6);
    let la = a.mr(0x10_0000, 4096, acc::ALL);
    let rb = b.mr(0x20_0000, 4096, acc::ALL);
    la.write(0, &[0x3c; 64]);
    // UC: A's QP 0x80 sends to B's 0x90, whose context names LID 7 (no
    // such port) as its remote: B drops A's packets; A's UC SEND
    // completes all the same.
    let sa = QpSpec::new(UC, ca.cqn);
    let sb = QpSpec::new(UC, cb.cqn);
    let mut qa = a.qp(0x80, sa);
    let mut qb = b.qp(0x90, sb);
    a.connect(&qa, sa, 0x90, b.lid).unwrap();
    b.connect(&qb, sb, 0x80, 7).unwrap();
    qb.post_recv(&[rb.sge(0, 64)]);
    qa.post(&a, &Wr::send(vec![la.sge(0, 64)]));
    assert!(one(&mut ca, true).ok());
    assert!(
        cb.drain().is_empty(),
        "nothing delivered from LID {}",
        a.lid
    );
    assert_eq!(b.r.sim.engine_stats().slid_drops, 1);
    // The same from the right LID is delivered.
    let mut qa2 = a.qp(0x82, sa);
    let mut qb2 = b.qp(0x92, sb);
    a.connect(&qa2, sa, 0x92, b.lid).unwrap();
    b.connect(&qb2, sb, 0x82, a.lid).unwrap();
    qb2.post_recv(&[rb.sge(0, 64)]);
    qa2.post(&a, &Wr::send(vec![la.sge(0, 64)]));
    assert!(one(&mut ca, true).ok());
    assert_eq!(one(&mut cb, false).byte_cnt, 64);
    assert_eq!(b.r.sim.engine_stats().slid_drops, 1);
    let _ = (&mut qb, &mut qb2);
    // RC over the card's loopback: 0x84 -> 0x85, whose context names
    // another LID. Dropped: the requester's retries run out.
    let mut h = Hca::new();
    let mut c = h.cq(6);
    let mut s = QpSpec::new(RC, c.cqn);
    s.retry_cnt = 1;
    s.ack_timeout = 1;
    let mut x = h.qp(0x84, s);
    let mut y = h.qp(0x85, s);
    let lid = h.lid;
    h.connect(&x, s, 0x85, lid).unwrap();
    h.connect(&y, s, 0x84, lid + 1).unwrap();
    let m = h.mr(0x30_0000, 4096, acc::ALL);
    y.post_recv(&[m.sge(0, 64)]);
    x.post(&h, &Wr::send(vec![m.sge(64, 64)]));
    wait_steps(&h.r, Duration::from_millis(5));
    let e = one(&mut c, true);
    assert_eq!(e.syndrome, 0x15, "transport retries exceeded: {e:?}");
    assert!(c.drain().iter().all(|c| c.send), "no receive at 0x85");
    assert!(h.r.sim.engine_stats().slid_drops >= 1);
    let _ = &mut y;
}

/// IBA 10.9.3: a GMP to QP1 whose P_Key matches no entry of the port's
/// table (two limited members) is dropped, P_KeyViolations counts it, and
/// the SMA's Bad P_Key trap (257) comes to QP0 as a MAD with SLID 0 for
/// the driver to forward to the SM.
#[test]
fn a_qp1_mad_with_a_mismatched_pkey_is_counted_and_trapped() {
    let (mut h, w, raw) = on_a_raw_cable();
    let mut cq = h.cq(8);
    let (mut qp0, mut qp1) = special_qps(&mut h, &cq);
    let mr = h.mr(0x10_0000, 8192, acc::ALL);
    qp0.post_recv(&[mr.sge(0, 296)]);
    qp1.post_recv(&[mr.sge(4096, 296)]);
    // The port is a limited member of the default partition only.
    let mut table = [0u8; 64];
    table[0..2].copy_from_slice(&0x7fffu16.to_be_bytes());
    smp_set(&mut h, 0x0016, 0, &table);
    let gmp = |pkey: u16| {
        let hd = Headers {
            lrh: Lrh {
                vl: 0,
                sl: 3,
                dlid: 5,
                slid: 9,
                ..Lrh::default()
            },
            bth: Bth {
                opcode: opcode::UD_SEND_ONLY,
                pkey,
                dest_qp: 1,
                ..Bth::default()
            },
            deth: Some(Deth {
                qkey: 0x8001_0000,
                src_qp: 0x4d,
            }),
            ..Headers::default()
        };
        let mut mad = vec![0u8; 256];
        mad[..4].copy_from_slice(&[1, 0x04, 1, 1]);
        packet::build(&hd, &mad).unwrap()
    };
    inject(&h, &w, raw, gmp(0x7fff));
    let cqes = cq.drain();
    assert_eq!(cqes.len(), 1, "one MAD, at QP0: {cqes:?}");
    let c = cqes[0];
    assert_eq!(
        (c.send, c.qpn, c.slid, c.rqpn, c.byte_cnt),
        (false, BASE_SQPN, 0, 0, 296),
        "the trap, received with SLID 0 from QP0: {c:?}"
    );
    let t = mr.read(40, 256);
    assert_eq!(&t[..4], &[1, 0x01, 1, 0x05], "SubnTrap, LID routed");
    assert_eq!(&t[0x10..0x12], &[0, 2], "Notice");
    let n = &t[0x40..0x80];
    let be16 = |o: usize| u16::from_be_bytes([n[o], n[o + 1]]);
    let be32 = |o: usize| u32::from_be_bytes(n[o..o + 4].try_into().unwrap());
    assert_eq!(n[0], 0x82, "generic, security");
    assert_eq!(be32(0) & 0xff_ffff, 1, "producer: a CA");
    assert_eq!((be16(4), be16(6)), (257, 5), "Bad P_Key from LID 5");
    // DataDetails (from byte 10): LIDADDR1, LIDADDR2, KEY, SL|QP1, QP2.
    assert_eq!((be16(12), be16(14)), (9, 5));
    assert_eq!(be32(16), 0x7fff);
    assert_eq!((be32(20) >> 28, be32(20) & 0xff_ffff), (3, 0x4d));
    assert_eq!(be32(24), 1);
    assert_eq!(
        u16::from_be_bytes([port_info(&mut h)[46], port_info(&mut h)[47]]),
        1,
        "P_KeyViolations"
    );
    // A full member's MAD gets through to QP1; nothing more is counted.
    inject(&h, &w, raw, gmp(0xffff));
    let cqes = cq.drain();
    assert_eq!(cqes.len(), 1, "{cqes:?}");
    assert_eq!((cqes[0].qpn, cqes[0].slid), (BASE_SQPN + 2, 9));
    assert_eq!(
        u16::from_be_bytes([port_info(&mut h)[46], port_info(&mut h)[47]]),
        1
    );
    h.assert_no_violations();
}

/// A packet to one of the port's own LIDs (the base LID or any in its LMC
/// range) is looped back inside the card: delivered, and never on the
/// cable (no packet at the peer, no PortXmitPkts), as a UD datagram and as
/// a GMP on QP1 (ibping to the node itself).
#[test]
fn a_packet_to_the_ports_own_lids_never_leaves_the_port() {
    let (mut h, w, raw) = on_a_raw_cable();
    // LMC 2: LIDs 4..=7 are the port's (base 4).
    let mut pi = port_info(&mut h);
    pi[16..18].copy_from_slice(&4u16.to_be_bytes());
    pi[34] = (pi[34] & !7) | 2;
    pi[32] &= 0xf0;
    smp_set(&mut h, 0x0015, 1, &pi);
    h.lid = 4;
    let mut cq = h.cq(8);
    let mr = h.mr(0x10_0000, 16384, acc::ALL);
    let s = QpSpec::new(UD, cq.cqn);
    let mut tx = h.qp(0xa0, s);
    h.connect(&tx, s, 0, 0).unwrap();
    let mut rx = h.qp(0x99, s);
    h.connect(&rx, s, 0, 0).unwrap();
    let (_qp0, mut qp1) = special_qps(&mut h, &cq);
    let pkts = |h: &mut Hca| {
        let pc =
            h.r.cmd_box(&crate::mlx::pma_get(), 1, 3, sim::Opcode::MAD_IFC)
                .unwrap();
        u32::from_be_bytes(pc[0x40 + 32..0x40 + 36].try_into().unwrap())
    };
    let before = pkts(&mut h);
    for dlid in [4u16, 7] {
        rx.post_recv(&[mr.sge(0, 4136)]);
        let mut wr = ud_send(dlid, 0, &mr);
        if let Some(av) = wr.ud.as_mut() {
            av.qkey = s.qkey;
        }
        tx.post(&h, &wr);
        let cqes = cq.drain();
        assert_eq!(cqes.len(), 2, "sent and received, DLID {dlid}: {cqes:?}");
        let r = cqes.iter().find(|c| !c.send).unwrap();
        assert_eq!((r.qpn, r.rqpn, r.slid), (0x99, 0xa0, 4), "DLID {dlid}");
    }
    // A GMP to QP1 at LID 6 (the request an ibping to oneself sends).
    qp1.post_recv(&[mr.sge(8192, 296)]);
    let mut mad = vec![0u8; 256];
    mad[..4].copy_from_slice(&[1, 0x32, 1, 1]);
    mr.write(12288, &mad);
    qp1.post(
        &h,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            mlx_flags: Some((0, 6)),
            raw: Some(
                crate::mlx::UdHeader {
                    dlid: 6,
                    slid: 4,
                    dqpn: 1,
                    qkey: 0x8001_0000,
                    sqpn: 1,
                    ..crate::mlx::UdHeader::default()
                }
                .segment(),
            ),
            sges: vec![mr.sge(12288, 256)],
            tail: Some(crate::mlx::icrc_seg()),
            ..Wr::default()
        },
    );
    let cqes = cq.drain();
    let r = cqes.iter().find(|c| !c.send).expect("the GMP came back");
    assert_eq!((r.qpn, r.slid, r.rqpn), (BASE_SQPN + 2, 4, 1), "{cqes:?}");
    assert_eq!(mr.read(8192 + 40, 4), vec![1, 0x32, 1, 1]);
    assert!(take(&w, raw).is_empty(), "nothing went on the cable");
    assert_eq!(pkts(&mut h), before, "PortXmitPkts");
    h.assert_no_violations();
}

/// The port runs 4x FDR only while the far end of its cable would train
/// to FDR too (link training takes the fastest speed both ends have): a
/// bare fabric port that says nothing of its speeds keeps the link at
/// QDR; once it says FDR the HCA reports FDR active, and the fabric hears
/// the HCA's own LinkSpeedExtEnabled, narrowed by the SM.
#[test]
fn the_link_runs_fdr_only_when_both_ends_have_it() {
    let (mut h, w, raw) = on_a_raw_cable();
    let d = port_info(&mut h);
    assert_eq!(
        (d[62], d[63] & 0x1f),
        (0x01, 0x01),
        "FDR supported and enabled, not active: the far end has none"
    );
    assert_eq!(d[35] >> 4, 4, "LinkSpeedActive QDR");
    let fab = w.fabric();
    assert_eq!(
        fab.lock().unwrap().peer_link_speeds_ext(raw),
        0x1,
        "what the HCA publishes"
    );
    fab.lock().unwrap().set_link_speeds_ext(raw, 0x1).unwrap();
    wait_steps(&h.r, Duration::from_micros(5));
    assert_eq!(port_info(&mut h)[62], 0x11, "FDR active");
    // The SM turns FDR off (LinkSpeedExtEnabled 30, SMSupportsExtendedSpeeds).
    let mut d = port_info(&mut h);
    d[32] &= 0xf0;
    d[33] &= 0x0f;
    d[63] = 30;
    let r = smp_set(&mut h, 0x0015, 0x8000_0001, &d);
    assert_eq!((r[0x40 + 62], r[0x40 + 63] & 0x1f), (0x01, 0));
    wait_steps(&h.r, Duration::from_micros(5));
    assert_eq!(
        fab.lock().unwrap().peer_link_speeds_ext(raw),
        0,
        "the far end hears it"
    );
}
