//! Two HCAs on a fabric: back to back and through a switch.
//!
//! Two HCAs on a fabric: back to back and through a switch. Links follow
//! INIT_PORT/CLOSE_PORT and cables; every opcode crosses the wire in
//! packets (segmented at the MTU); counters and the firmware PMA.

use std::time::Duration;

use hal::Clock;

use crate::loopback::one;
use crate::mlx::{UdHeader, pma_get};
use crate::pairs::{b2b, rc_pair, switched, threaded};
use crate::poster::*;

fn counters(h: &mut Hca) -> (u32, u32, u32, u32) {
    let pc = h.r.cmd_box(&pma_get(), 1, 3, sim::Opcode::MAD_IFC).unwrap();
    let d = |o: usize| u32::from_be_bytes(pc[0x40 + o..0x44 + o].try_into().unwrap());
    (d(24), d(28), d(32), d(36))
}

#[test]
fn every_rc_opcode_crosses_the_wire_in_mtu_segments() {
    let (mut a, mut b, _w) = b2b();
    let mut ca = a.cq(8);
    let mut cb = b.cq(8);
    let (mut qa, mut qb) = rc_pair(&mut a, &mut b, &ca, &cb, |_| {});
    let la = a.mr(0x10_0000_0100, 64 << 10, acc::ALL);
    let rb = b.mr(0x20_0000_0200, 64 << 10, acc::ALL);
    let mut rng = Rng(42);
    let before = counters(&mut a);
    // SEND of 10 000 bytes: 3 packets at MTU 4096.
    let data = rng.bytes(10_000);
    la.write(0, &data);
    qb.post_recv(&[rb.sge(0, 20_000)]);
    qa.post(
        &a,
        &Wr {
            opcode: op::SEND_IMM,
            signalled: true,
            imm: 9,
            sges: vec![la.sge(0, 10_000)],
            ..Wr::default()
        },
    );
    let r = one(&mut cb, false);
    assert_eq!((r.opcode, r.byte_cnt, r.imm), (2, 10_000, 9), "{r:?}");
    assert_eq!(rb.read(0, 10_000), data);
    assert!(one(&mut ca, true).ok());
    let after = counters(&mut a);
    assert_eq!(after.2 - before.2, 3, "three SEND packets left A");
    // (LRH 8 + BTH 12 + payload + ImmDt on the last + ICRC 4) / 4 words.
    assert_eq!(
        after.0 - before.0,
        (3 * 24 + 4 + 10_000) / 4,
        "PortXmitData in words"
    );
    let rcv = counters(&mut b);
    assert_eq!(
        (rcv.1, rcv.3),
        (after.0 - before.0, 3),
        "B received the same words and packets"
    );
    // RDMA WRITE with immediate, 9000 bytes.
    let data = rng.bytes(9000);
    la.write(20_000, &data);
    qb.post_recv(&[rb.sge(0, 8)]);
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_WRITE_IMM,
            signalled: true,
            imm: 0x77,
            raddr: rb.addr(30_000),
            rkey: rb.key,
            sges: vec![la.sge(20_000, 9000)],
            ..Wr::default()
        },
    );
    let r = one(&mut cb, false);
    assert_eq!((r.opcode, r.byte_cnt, r.imm), (0, 9000, 0x77));
    assert!(one(&mut ca, true).ok());
    assert_eq!(rb.read(30_000, 9000), data);
    // RDMA READ of 12 000 bytes (3 response packets).
    let remote = rng.bytes(12_000);
    rb.write(40_000, &remote);
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_READ,
            signalled: true,
            raddr: rb.addr(40_000),
            rkey: rb.key,
            sges: vec![la.sge(40_000, 12_000)],
            ..Wr::default()
        },
    );
    let c = one(&mut ca, true);
    assert_eq!((c.opcode, c.byte_cnt), (op::RDMA_READ, 12_000), "{c:?}");
    assert_eq!(la.read(40_000, 12_000), remote);
    // Atomics.
    rb.write(64, &41u64.to_be_bytes());
    qa.post(
        &a,
        &Wr {
            opcode: op::ATOMIC_FA,
            signalled: true,
            raddr: rb.addr(64),
            rkey: rb.key,
            swap: 1,
            sges: vec![la.sge(0, 8)],
            ..Wr::default()
        },
    );
    assert!(one(&mut ca, true).ok());
    assert_eq!(
        (la.read(0, 8), rb.read(64, 8)),
        (41u64.to_be_bytes().to_vec(), 42u64.to_be_bytes().to_vec())
    );
    qa.post(
        &a,
        &Wr {
            opcode: op::ATOMIC_CS,
            signalled: true,
            raddr: rb.addr(64),
            rkey: rb.key,
            cmp: 42,
            swap: 7,
            sges: vec![la.sge(8, 8)],
            ..Wr::default()
        },
    );
    assert!(one(&mut ca, true).ok());
    assert_eq!(rb.read(64, 8), 7u64.to_be_bytes());
    // A remote access error comes back as a NAK.
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_WRITE,
            signalled: true,
            raddr: rb.addr(0),
            rkey: rb.key ^ 0xff,
            sges: vec![la.sge(0, 8)],
            ..Wr::default()
        },
    );
    let e = one(&mut ca, true);
    assert_eq!((e.opcode, e.syndrome), (0x1e, 0x13), "{e:?}");
    assert_eq!(b.qp_state(0x90), 6, "responder in ERR");
    assert!(
        a.r.sim.violations().is_empty() && b.r.sim.violations().is_empty(),
        "{:?} {:?}",
        a.r.sim.violations(),
        b.r.sim.violations()
    );
}

#[test]
fn ud_uc_and_rnr_across_the_wire() {
    let (mut a, mut b, _w) = b2b();
    let mut ca = a.cq(6);
    let mut cb = b.cq(6);
    let la = a.mr(0x1_0000, 16_384, acc::ALL);
    let rb = b.mr(0x2_0000, 16_384, acc::ALL);
    // UD: source LID/QP, SL, the GRH area, Q_Key rule.
    let su = QpSpec::new(UD, ca.cqn);
    let ua = a.qp(0xa0, su);
    a.connect(&ua, su, 0, 0).unwrap();
    let sb = QpSpec::new(UD, cb.cqn);
    let mut ub = b.qp(0xa4, sb);
    b.connect(&ub, sb, 0, 0).unwrap();
    let mut ua = ua;
    let data = Rng(5).bytes(3000);
    la.write(0, &data);
    ub.post_recv(&[rb.sge(0, 4136)]);
    let av = Av {
        port: 1,
        dlid: b.lid,
        dqpn: 0xa4,
        qkey: 0x8000_0000,
        sl: 5,
        ..Av::default()
    };
    ua.post(
        &a,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            ud: Some(av),
            sges: vec![la.sge(0, 3000)],
            ..Wr::default()
        },
    );
    assert!(one(&mut ca, true).ok());
    let r = one(&mut cb, false);
    assert_eq!(
        (r.byte_cnt, r.rqpn, r.slid, r.sl, r.qpn),
        (3040, 0xa0, a.lid, 5, 0xa4),
        "{r:?}"
    );
    assert_eq!(rb.read(40, 3000), data);
    // UC: a WRITE of two packets.
    let sa = QpSpec::new(UC, ca.cqn);
    let sb2 = QpSpec::new(UC, cb.cqn);
    let mut xa = a.qp(0xb0, sa);
    let xb = b.qp(0xb4, sb2);
    a.connect(&xa, sa, 0xb4, b.lid).unwrap();
    b.connect(&xb, sb2, 0xb0, a.lid).unwrap();
    xa.post(
        &a,
        &Wr {
            opcode: op::RDMA_WRITE,
            signalled: true,
            raddr: rb.addr(8000),
            rkey: rb.key,
            sges: vec![la.sge(0, 3000)],
            ..Wr::default()
        },
    );
    assert!(one(&mut ca, true).ok());
    assert_eq!(rb.read(8000, 3000), data);
    // RC SEND without a receive: RNR NAKs until one is posted.
    let (mut qa, mut qb) = rc_pair(&mut a, &mut b, &ca, &cb, |_| {});
    qa.post(&a, &Wr::send(vec![la.sge(0, 100)]));
    wait_steps(&a.r, Duration::from_millis(5));
    assert!(ca.drain().is_empty(), "RNR: waiting");
    qb.post_recv(&[rb.sge(12_000, 100)]);
    wait_steps(&a.r, Duration::from_millis(1));
    assert!(one(&mut ca, true).ok());
    assert_eq!(one(&mut cb, false).byte_cnt, 100);
}

#[test]
fn links_follow_close_port_and_cables_and_rc_retries_run_out() {
    let (mut a, mut b, w) = b2b();
    a.async_events();
    // The partner closes its port: A's link goes down, Active -> Down with
    // PORT_CHANGE and LinkDowned.
    b.r.cmd(0, 1, 0, sim::Opcode::CLOSE_PORT).unwrap();
    assert_eq!(
        a.r.sim.port_state(1),
        Some((sim::LogicalState::Down, sim::PhysicalState::Polling))
    );
    assert!(
        a.async_events().iter().any(|e| e.0 == 0x09),
        "PORT_CHANGE down"
    );
    let pc = a.r.cmd_box(&pma_get(), 1, 3, sim::Opcode::MAD_IFC).unwrap();
    assert_eq!(pc[0x40 + 7], 1, "LinkDownedCounter");
    // Back: link up, logical Init until the SM acts again.
    b.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    assert_eq!(
        a.r.sim.port_state(1),
        Some((sim::LogicalState::Init, sim::PhysicalState::LinkUp))
    );
    a.activate(1, 1).unwrap();
    b.activate(1, 2).unwrap();
    // A pulled cable takes both ends down.
    let pa = a.r.sim.fabric_port(1).unwrap();
    w.fabric().lock().unwrap().unplug(pa).unwrap();
    wait_steps(&a.r, Duration::from_micros(2));
    assert_eq!(
        b.r.sim.port_state(1).map(|s| s.1),
        Some(sim::PhysicalState::Polling)
    );
    // Cable back in, SM again; then B closes and an RC SEND runs out of
    // retries on A.
    let pb = b.r.sim.fabric_port(1).unwrap();
    w.fabric().lock().unwrap().connect(pa, pb).unwrap();
    wait_steps(&a.r, Duration::from_micros(2));
    a.activate(1, 1).unwrap();
    b.activate(1, 2).unwrap();
    let mut ca = a.cq(6);
    let cb = b.cq(6);
    let mut s = QpSpec::new(RC, ca.cqn);
    s.retry_cnt = 2;
    s.ack_timeout = 10; // 4.2 ms
    let mut qa = a.qp(0x80, s);
    a.connect(&qa, s, 0x90, 2).unwrap();
    let _ = cb;
    let la = a.mr(0x1_0000, 4096, acc::ALL);
    // B has no QP 0x90: requests vanish; A retries twice, then gives up.
    qa.post(&a, &Wr::send(vec![la.sge(0, 8)]));
    wait_steps(&a.r, Duration::from_millis(12));
    assert!(ca.drain().is_empty());
    wait_steps(&a.r, Duration::from_millis(2));
    let e = one(&mut ca, true);
    assert_eq!((e.syndrome, e.vendor), (0x15, 0x81), "{e:?}");
    let (x, _, p, _) = counters(&mut a);
    assert!(p >= 3 && x > 0, "three attempts on the wire: {p} packets");
}

#[test]
fn dropped_and_corrupted_packets_are_recovered_or_counted() {
    let (mut a, mut b, w) = b2b();
    let mut ca = a.cq(6);
    let mut cb = b.cq(6);
    let (mut qa, mut qb) = rc_pair(&mut a, &mut b, &ca, &cb, |_| {});
    let la = a.mr(0x1_0000, 32_768, acc::ALL);
    let rb = b.mr(0x2_0000, 32_768, acc::ALL);
    let data = Rng(11).bytes(12_000);
    la.write(0, &data);
    // Drop the second packet of the message once: a retransmission
    // (after the ACK timeout, PSN sequence NAK at once) fixes it.
    w.fabric().lock().unwrap().faults.add(
        sim::fabric::FaultRule::new(sim::fabric::FaultKind::Drop)
            .qpn(0x90)
            .every(2)
            .times(1),
    );
    qb.post_recv(&[rb.sge(0, 16_000)]);
    qa.post(&a, &Wr::send(vec![la.sge(0, 12_000)]));
    wait_steps(&a.r, Duration::from_millis(10));
    assert!(one(&mut ca, true).ok());
    assert_eq!(one(&mut cb, false).byte_cnt, 12_000);
    assert_eq!(rb.read(0, 12_000), data);
    // A corrupted packet: the receiver drops it and counts PortRcvErrors.
    w.fabric().lock().unwrap().faults.clear();
    w.fabric().lock().unwrap().faults.add(
        sim::fabric::FaultRule::new(sim::fabric::FaultKind::Corrupt)
            .qpn(0x90)
            .times(1),
    );
    qb.post_recv(&[rb.sge(0, 16_000)]);
    qa.post(&a, &Wr::send(vec![la.sge(0, 100)]));
    wait_steps(&a.r, Duration::from_millis(10));
    assert!(one(&mut ca, true).ok(), "recovered by retransmission");
    let pc = b.r.cmd_box(&pma_get(), 1, 3, sim::Opcode::MAD_IFC).unwrap();
    assert_eq!(
        u16::from_be_bytes([pc[0x40 + 8], pc[0x40 + 9]]),
        1,
        "PortRcvErrors"
    );
}

/// Two HCAs through one 36-port switch (the `--nodes 2` topology), the
/// switch's LFT set by its SM stand-in.
#[test]
fn two_hcas_through_a_switch_and_a_directed_route_smp_to_its_sma() {
    let (mut a, mut b, _w) = switched();
    let mut ca = a.cq(6);
    let mut cb = b.cq(6);
    let (mut qa, mut qb) = rc_pair(&mut a, &mut b, &ca, &cb, |_| {});
    let la = a.mr(0x1_0000, 16_384, acc::ALL);
    let rb = b.mr(0x2_0000, 16_384, acc::ALL);
    let data = Rng(77).bytes(9000);
    la.write(0, &data);
    qb.post_recv(&[rb.sge(0, 9000)]);
    qa.post(&a, &Wr::send(vec![la.sge(0, 9000)]));
    assert!(one(&mut ca, true).ok());
    assert_eq!(one(&mut cb, false).byte_cnt, 9000);
    assert_eq!(rb.read(0, 9000), data);
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_READ,
            signalled: true,
            raddr: rb.addr(0),
            rkey: rb.key,
            sges: vec![la.sge(10_000, 5000)],
            ..Wr::default()
        },
    );
    assert!(one(&mut ca, true).ok());
    assert_eq!(la.read(10_000, 5000), data[..5000]);
    // A directed-route SubnGet(NodeInfo) from A's QP0, one hop out of
    // port 1: the switch's SMA answers, back to A's QP0.
    let (mut qp0, _qp1) = crate::mlx::special_qps(&mut a, &ca);
    let m = a.mr(0x40_0000, 8192, acc::ALL);
    let mut smp = sim::fabric::packet::Smp::dr_get(0x1234, 0x0011, 0, &[1]).unwrap();
    // The sender's own step of the route (IBTA C14-9; Linux does it in
    // ib_mad's smi_handle_dr_smp_send, not the HCA).
    smp.hop_ptr = 1;
    m.write(0, &smp.to_bytes());
    qp0.post_recv(&[m.sge(4096, 296)]);
    qp0.post(
        &a,
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
            sges: vec![m.sge(0, 256)],
            tail: Some(crate::mlx::icrc_seg()),
            ..Wr::default()
        },
    );
    assert!(one(&mut ca, true).ok(), "{:?}", a.r.sim.violations());
    let r = one(&mut ca, false);
    assert_eq!((r.byte_cnt, r.rqpn), (296, 0), "{r:?}");
    let resp = m.read(4096 + 40, 256);
    assert_eq!(resp[3], 0x81, "GetResp");
    let ni = &resp[0x40..];
    assert_eq!(ni[2], 2, "NodeType switch");
    assert_eq!(
        u16::from_be_bytes([ni[30], ni[31]]),
        0xc738,
        "SwitchX device id"
    );
    a.assert_no_violations();
}

/// The threaded front end on a fabric: each HCA's own model thread steps
/// it on a shared monotonic clock.
#[test]
fn threaded_hcas_back_to_back() {
    let (mut a, mut b, _w) = threaded(0x0002_c903_0000_3000, 0x0002_c903_0000_4000);
    let mut ca = a.cq(6);
    let mut cb = b.cq(6);
    let (mut qa, mut qb) = rc_pair(&mut a, &mut b, &ca, &cb, |_| {});
    let la = a.mr(0x1_0000, 16_384, acc::ALL);
    let rb = b.mr(0x2_0000, 16_384, acc::ALL);
    let data = Rng(9).bytes(10_000);
    la.write(0, &data);
    qb.post_recv(&[rb.sge(0, 10_000)]);
    qa.post(&a, &Wr::send(vec![la.sge(0, 10_000)]));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (mut s, mut r) = (None, None);
    while s.is_none() || r.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "no completion: {s:?} {r:?}"
        );
        s = s.or_else(|| ca.poll());
        r = r.or_else(|| cb.poll());
        std::thread::sleep(Duration::from_micros(100));
    }
    assert!(s.unwrap().ok());
    assert_eq!(r.unwrap().byte_cnt, 10_000);
    assert_eq!(rb.read(0, 10_000), data);
}

/// The engines' own packets (UD, RC SEND/WRITE segmented over several
/// MTUs, READ with its responses, atomics, ACK, RNR NAK and a remote
/// access NAK, a GMP between the QP1s) captured and dissected by
/// `tshark -V`: every frame decodes, no "Malformed", no expert info.
#[test]
fn the_engines_packets_dissect_cleanly_in_tshark() {
    let (mut a, mut b, w) = b2b();
    let path = std::env::temp_dir().join(format!("engine-capture-{}.pcap", std::process::id()));
    w.fabric()
        .lock()
        .unwrap()
        .set_capture(Some(sim::fabric::Capture::create(&path).unwrap()));
    let mut ca = a.cq(8);
    let mut cb = b.cq(8);
    let la = a.mr(0x1_0000, 65_536, acc::ALL);
    let rb = b.mr(0x2_0000, 65_536, acc::ALL);
    // UD.
    let su = QpSpec::new(UD, ca.cqn);
    let mut ua = a.qp(0xa0, su);
    a.connect(&ua, su, 0, 0).unwrap();
    let sbu = QpSpec::new(UD, cb.cqn);
    let mut ub = b.qp(0xa4, sbu);
    b.connect(&ub, sbu, 0, 0).unwrap();
    ub.post_recv(&[rb.sge(0, 4136)]);
    ua.post(
        &a,
        &Wr {
            opcode: op::SEND_IMM,
            imm: 1,
            signalled: true,
            // With a GRH (LNH = IBA global) to B's port GID.
            ud: Some(Av {
                port: 1,
                dlid: b.lid,
                dqpn: 0xa4,
                qkey: sbu.qkey,
                grh: Some((0, 64, 0x12, 0x3_4567, {
                    let mut g = [0u8; 16];
                    g[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
                    g[8..].copy_from_slice(&0x0002_c903_0000_2001u64.to_be_bytes());
                    g
                })),
                ..Av::default()
            }),
            sges: vec![la.sge(0, 1000)],
            ..Wr::default()
        },
    );
    // RC: RNR NAK first, then SEND over 3 MTUs, WRITE over 3, READ of 3,
    // atomics, a remote access NAK.
    let (mut qa, mut qb) = rc_pair(&mut a, &mut b, &ca, &cb, |_| {});
    qa.post(&a, &Wr::send(vec![la.sge(0, 10_000)]));
    qb.post_recv(&[rb.sge(0, 10_000)]);
    wait_steps(&a.r, Duration::from_millis(1));
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_WRITE_IMM,
            imm: 2,
            signalled: true,
            raddr: rb.addr(20_000),
            rkey: rb.key,
            sges: vec![la.sge(0, 9000)],
            ..Wr::default()
        },
    );
    qb.post_recv(&[rb.sge(0, 8)]);
    wait_steps(&a.r, Duration::from_millis(1));
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_READ,
            signalled: true,
            raddr: rb.addr(0),
            rkey: rb.key,
            sges: vec![la.sge(30_000, 9000)],
            ..Wr::default()
        },
    );
    qa.post(
        &a,
        &Wr {
            opcode: op::ATOMIC_FA,
            signalled: true,
            raddr: rb.addr(64),
            rkey: rb.key,
            swap: 5,
            sges: vec![la.sge(8, 8)],
            ..Wr::default()
        },
    );
    qa.post(
        &a,
        &Wr {
            opcode: op::ATOMIC_CS,
            signalled: true,
            raddr: rb.addr(64),
            rkey: rb.key,
            swap: 5,
            cmp: 5,
            sges: vec![la.sge(8, 8)],
            ..Wr::default()
        },
    );
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_WRITE,
            signalled: true,
            raddr: rb.addr(0),
            rkey: 0x5555_5500,
            sges: vec![la.sge(0, 8)],
            ..Wr::default()
        },
    );
    // A GMP from A's QP1 to B's QP1.
    let (_a0, mut a1) = crate::mlx::special_qps(&mut a, &ca);
    let (_b0, mut b1) = crate::mlx::special_qps(&mut b, &cb);
    let m = a.mr(0x40_0000, 4096, acc::ALL);
    let mut gmp = vec![0u8; 256];
    gmp[0] = 1;
    gmp[1] = 0x04; // PerfMgt
    gmp[2] = 1;
    gmp[3] = 1;
    gmp[0x10..0x12].copy_from_slice(&0x0012u16.to_be_bytes());
    m.write(0, &gmp);
    let mb = b.mr(0x40_0000, 4096, acc::ALL);
    b1.post_recv(&[mb.sge(0, 296)]);
    let blid = b.lid;
    a1.post(
        &a,
        &Wr {
            opcode: op::SEND,
            signalled: true,
            mlx_flags: Some((0, blid)),
            raw: Some(
                UdHeader {
                    dlid: blid,
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
        },
    );
    wait_steps(&a.r, Duration::from_millis(1));
    let sent: Vec<Cqe> = ca.drain();
    assert!(
        sent.iter().filter(|c| c.send && c.ok()).count() >= 7,
        "{sent:?}"
    );
    assert!(
        cb.drain()
            .iter()
            .any(|c| c.qpn == 64 + 2 && c.byte_cnt == 296),
        "the GMP arrived"
    );
    let mut c = w.fabric().lock().unwrap().set_capture(None).unwrap();
    c.flush().unwrap();
    let frames = c.packets();
    drop(c);
    assert!(frames >= 20, "{frames} frames");
    let Some(ts) = ["/usr/bin/tshark", "/usr/local/bin/tshark"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
    else {
        eprintln!("*** SKIPPED: tshark is not installed (scripts/deps.sh ensure_tshark) ***");
        let _ = std::fs::remove_file(&path);
        return;
    };
    let out = std::process::Command::new(ts)
        .args(["-r", path.to_str().unwrap(), "-V"])
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(!v.contains("Malformed"), "a malformed frame:\n{v}");
    assert!(!v.contains("Expert Info"), "expert info:\n{v}");
    assert_eq!(
        v.matches("\nFrame ").count() + usize::from(v.starts_with("Frame ")),
        frames as usize
    );
    assert!(
        v.contains("Global Route Header") && v.contains("fe80::2:c903:0:2001"),
        "the UD SEND's GRH dissected:\n{v}"
    );
    for what in [
        "(RC) - SEND First (0)",
        "(RC) - SEND Middle (1)",
        "(RC) - SEND Last (2)",
        "(RC) - RDMA WRITE First (6)",
        "(RC) - RDMA WRITE Last with Immediate (9)",
        "(RC) - RDMA READ Request (12)",
        "(RC) - RDMA READ response First (13)",
        "(RC) - RDMA READ response Last (15)",
        "(RC) - Acknowledge (17)",
        "(RC) - ATOMIC Acknowledge (18)",
        "(RC) - CmpSwap (19)",
        "(RC) - FetchAdd (20)",
        "(UD) - SEND only (100)",
        "(UD) - SEND only with Immediate (101)",
    ] {
        assert!(v.contains(what), "no {what} in the capture");
    }
}

/// A response the requester did not ask for (an atomic ACK while a SEND
/// waits for its ACK) completes the WQE with "bad response".
#[test]
fn an_unexpected_response_is_a_bad_response_error() {
    let (mut a, b, w) = b2b();
    let mut ca = a.cq(6);
    let s = QpSpec::new(RC, ca.cqn);
    let mut qa = a.qp(0x80, s);
    a.connect(&qa, s, 0x99, b.lid).unwrap();
    let la = a.mr(0x1_0000, 4096, acc::ALL);
    // B has no QP 0x99: A's SEND waits for an ACK.
    qa.post(&a, &Wr::send(vec![la.sge(0, 8)]));
    assert!(ca.drain().is_empty());
    // Forge B -> A: RC ATOMIC Acknowledge for QP 0x80 at PSN 0x100.
    use sim::fabric::packet::{Aeth, Bth, Headers, Lrh, build, opcode};
    let hd = Headers {
        lrh: Lrh {
            dlid: a.lid,
            slid: b.lid,
            ..Lrh::default()
        },
        bth: Bth {
            opcode: opcode::RC | opcode::ATOMIC_ACKNOWLEDGE,
            pkey: 0xffff,
            dest_qp: 0x80,
            psn: 0x100,
            ..Bth::default()
        },
        aeth: Some(Aeth {
            syndrome: 0x1f,
            msn: 0,
        }),
        atomic_ack: Some(7),
        ..Headers::default()
    };
    let pkt = build(&hd, &[]).unwrap();
    let pb = b.r.sim.fabric_port(1).unwrap();
    let now = w.fake_clock().unwrap().now_ns();
    assert!(
        w.fabric()
            .lock()
            .unwrap()
            .transmit(pb, sim::fabric::Packet { bytes: pkt }, now)
    );
    wait_steps(&a.r, Duration::from_micros(2));
    let e = one(&mut ca, true);
    assert_eq!(
        (e.opcode, e.syndrome, e.vendor),
        (0x1e, 0x10, 0x90),
        "{e:?}"
    );
}

/// Random packets at an HCA's port (well-formed with random fields,
/// resealed after random byte flips, or raw garbage): nothing panics or
/// hangs, memory of another PD is never written, and well-formed traffic
/// runs afterwards.
#[test]
fn random_packets_at_the_port_then_well_formed_traffic() {
    use sim::fabric::packet::{Aeth, AtomicEth, Bth, Deth, Headers, Lrh, Reth, build, reseal};
    let (mut a, mut b, w) = b2b();
    let mut ca = a.cq(12);
    let cb = b.cq(6);
    let (mut qa, _qb) = rc_pair(&mut a, &mut b, &ca, &cb, |_| {});
    let su = QpSpec::new(UD, ca.cqn);
    let mut ua = a.qp(0xa0, su);
    a.connect(&ua, su, 0, 0).unwrap();
    let (mut a0, mut a1) = crate::mlx::special_qps(&mut a, &ca);
    let mr = a.mr(0x10_0000, 64 << 10, acc::ALL);
    let guard = a.mr_pd(0x80_0000, 16 << 10, acc::ALL, OTHER_PD);
    let pattern: Vec<u8> = (0..16 << 10).map(|i| (i * 7 % 253) as u8).collect();
    guard.write(0, &pattern);
    for _ in 0..8 {
        qa.post_recv(&[mr.sge(0, 60_000)]);
        ua.post_recv(&[mr.sge(0, 4136)]);
        a0.post_recv(&[mr.sge(0, 296)]);
        a1.post_recv(&[mr.sge(0, 296)]);
    }
    let pb = b.r.sim.fabric_port(1).unwrap();
    let clock = w.fake_clock().unwrap();
    let keys = [mr.key, guard.key, 0, mr.key ^ 1];
    let mut rng = Rng(0xfeed);
    let n = 20_000;
    for i in 0..n {
        let op = if rng.below(4) == 0 {
            rng.next_u64() as u8
        } else {
            [
                0x00u8, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x0a, 0x0b, 0x0c, 0x0d,
                0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x24, 0x2a, 0x64, 0x65,
            ][rng.below(24) as usize]
        };
        let mut hd = Headers::for_opcode(op).unwrap_or_default();
        hd.lrh = Lrh {
            vl: if rng.below(8) == 0 { 15 } else { 0 },
            sl: rng.below(16) as u8,
            dlid: if rng.below(8) == 0 { 0xffff } else { a.lid },
            slid: b.lid,
            ..Lrh::default()
        };
        hd.bth = Bth {
            opcode: op,
            pkey: if rng.below(8) == 0 {
                rng.next_u64() as u16
            } else {
                0xffff
            },
            dest_qp: [0u32, 1, 0x80, 0xa0, 0x81, rng.next_u64() as u32 & 0xff_ffff]
                [rng.below(6) as usize],
            psn: (0x100 + rng.below(8) as u32).wrapping_sub(2) & 0xff_ffff,
            ..Bth::default()
        };
        let key = keys[rng.below(4) as usize];
        if hd.deth.is_some() {
            hd.deth = Some(Deth {
                qkey: [0, 0x8001_0000, su.qkey, rng.next_u64() as u32][rng.below(4) as usize],
                src_qp: rng.below(0x200) as u32,
            });
        }
        if hd.reth.is_some() {
            hd.reth = Some(Reth {
                va: mr.addr(rng.below(70 << 10)),
                rkey: key,
                dma_len: rng.below(9000) as u32,
            });
        }
        if hd.atomic_eth.is_some() {
            hd.atomic_eth = Some(AtomicEth {
                va: mr.addr(rng.below(64 << 10)) & !7,
                rkey: key,
                swap_add: rng.next_u64(),
                compare: rng.next_u64(),
            });
        }
        if hd.aeth.is_some() {
            hd.aeth = Some(Aeth {
                syndrome: rng.next_u64() as u8,
                msn: 0,
            });
        }
        if hd.atomic_ack.is_some() {
            hd.atomic_ack = Some(rng.next_u64());
        }
        let cap = if rng.below(4) == 0 { 4096 } else { 300 };
        let plen = rng.below(cap) as usize;
        let payload = rng.bytes(plen);
        let mut bytes =
            build(&hd, &payload).unwrap_or_else(|_| build(&hd, &[]).unwrap_or_default());
        match rng.below(4) {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    if !bytes.is_empty() {
                        let k = rng.below(bytes.len() as u64) as usize;
                        bytes[k] ^= 1 << rng.below(8);
                    }
                }
                let _ = reseal(&mut bytes);
            }
            1 if i % 16 == 0 => {
                let g = rng.below(200) as usize;
                bytes = rng.bytes(g);
            }
            _ => {}
        }
        {
            let fab = w.fabric();
            let mut f = fab.lock().unwrap();
            let now = clock.now_ns();
            f.transmit(pb, sim::fabric::Packet { bytes }, now);
        }
        if i % 64 == 0 {
            wait_steps(&a.r, std::time::Duration::from_micros(3));
            ca.drain();
            ca.stash.clear();
        }
    }
    wait_steps(&a.r, std::time::Duration::from_micros(3));
    assert_eq!(
        guard.read(0, 16 << 10),
        pattern,
        "memory of another PD untouched"
    );
    // Fresh QPs on both sides still talk.
    let mut ca2 = a.cq(6);
    let mut cb2 = b.cq(6);
    let sa = QpSpec::new(RC, ca2.cqn);
    let sb = QpSpec::new(RC, cb2.cqn);
    let mut xa = a.qp(0xc0, sa);
    let mut xb = b.qp(0xc4, sb);
    a.connect(&xa, sa, 0xc4, b.lid).unwrap();
    b.connect(&xb, sb, 0xc0, a.lid).unwrap();
    let rb = b.mr(0x9_0000, 16_384, acc::ALL);
    let data = rng.bytes(9000);
    mr.write(0, &data);
    xb.post_recv(&[rb.sge(0, 9000)]);
    xa.post(&a, &Wr::send(vec![mr.sge(0, 9000)]));
    assert!(one(&mut ca2, true).ok());
    assert_eq!(one(&mut cb2, false).byte_cnt, 9000);
    assert_eq!(rb.read(0, 9000), data);
    let pc = a.r.cmd_box(&pma_get(), 1, 3, sim::Opcode::MAD_IFC).unwrap();
    let errs = u16::from_be_bytes([pc[0x40 + 8], pc[0x40 + 9]]);
    assert!(errs > 100, "bad packets counted as PortRcvErrors: {errs}");
    let _ = (&mut a0, &mut a1);
}

/// A register write settles the wire: an RDMA WRITE goes out, is
/// acknowledged and completes inside its doorbell write, before any
/// `relax`. A driver timing it (perftest reads the clock before the post
/// and after the poll) must still see time pass, as it would on a card,
/// or a bandwidth run over the model "took no measurable time".
#[test]
fn a_write_completed_inside_its_doorbell_write_still_takes_time() {
    let (mut a, mut b, _w) = b2b();
    let mut ca = a.cq(8);
    let cb = b.cq(8);
    let (mut qa, _qb) = rc_pair(&mut a, &mut b, &ca, &cb, |_| {});
    let la = a.mr(0x10_0000_0100, 4096, acc::ALL);
    let rb = b.mr(0x20_0000_0200, 4096, acc::ALL);
    let clock = a.r.sim.clock();
    let t0 = clock.now_ns();
    qa.post(
        &a,
        &Wr {
            opcode: op::RDMA_WRITE,
            signalled: true,
            raddr: rb.addr(0),
            rkey: rb.key,
            sges: vec![la.sge(0, 4096)],
            ..Wr::default()
        },
    );
    let c = ca.poll().expect("completed within the doorbell write");
    let t1 = clock.now_ns();
    assert!(c.ok(), "{c:?}");
    assert!(t1 > t0, "the clock stood still: {t0} -> {t1}");
}
