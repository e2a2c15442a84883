//! Raw Ethernet QPs (mlx4_en's rings) through the fabric's Ethernet
//! switch: steering by destination MAC (A0 and B0), flooding, learning,
//! RSS, VLAN insertion and stripping, checksum offload, the drops.

use sim::Opcode;
use sim::fabric::LinkLayer;

use crate::common::*;
use crate::poster::*;

const ETH: [LinkLayer; 2] = [LinkLayer::Eth, LinkLayer::Eth];
const RX: u32 = 0xa0;
const TX: u32 = 0xa1;

/// A node of the raw tests: its card, CQ, RX and TX QPs, a buffer, MAC.
struct Node {
    h: Hca,
    cq: Cq,
    rx: Qp,
    tx: Qp,
    buf: Mr,
    mac: [u8; 6],
}

fn node(mut h: Hca) -> Node {
    let (mac, _) = eth_up(&mut h, 1);
    let cq = h.cq(8);
    let (rx, _) = raw_qp(&mut h, RX, 1, cq.cqn);
    let (tx, _) = raw_qp(&mut h, TX, 1, cq.cqn);
    // A0 steering: our MAC (index 0) to RX, every multicast to RX.
    set_rqp(&mut h.r, 1, RX, 0, false, 2).unwrap();
    let buf = h.mr(0x10_0000_0000, 64 << 10, acc::ALL);
    Node {
        h,
        cq,
        rx,
        tx,
        buf,
        mac,
    }
}

fn nodes(
    n: usize,
) -> (
    Vec<Node>,
    sim::Wire,
    sim::fabric::SharedFabric,
    sim::fabric::Built,
) {
    nodes_with(n, |_| {})
}

/// [`nodes`] of cards whose configuration `tweak` changed.
fn nodes_with(
    n: usize,
    tweak: impl Fn(&mut sim::SimConfig),
) -> (
    Vec<Node>,
    sim::Wire,
    sim::fabric::SharedFabric,
    sim::fabric::Built,
) {
    let (hcas, w, f, b) = on_switches_with(n, ETH, tweak);
    let v: Vec<Node> = hcas.into_iter().map(node).collect();
    settle(&v[0].h);
    (v, w, f, b)
}

impl Node {
    /// Posts `n` receive buffers of 2 KiB (at 32 KiB + k * 2 KiB).
    fn post_rx(&mut self, n: u64) {
        for k in 0..n {
            let s = self.buf.sge((32 << 10) + k * 2048, 2048);
            self.rx.post_recv(&[s]);
        }
    }
    fn send(&mut self, f: &[u8]) {
        self.send_with(f, None, 0);
    }
    fn send_with(&mut self, f: &[u8], tci: Option<u16>, extra: u32) {
        raw_send(&self.h, &mut self.tx, &self.buf, 0, f, tci, extra);
    }
    /// The receive CQEs now (raw), send CQEs dropped.
    fn received(&mut self) -> Vec<[u8; 32]> {
        settle(&self.h);
        drain_raw(&mut self.cq)
            .into_iter()
            .filter(|c| !cqe_basics(c).1)
            .collect()
    }
}

#[test]
fn a_send_ring_without_an_rq_needs_mtt_entries_for_its_sq_only() {
    // mlx4_en's TX ring: RQ size byte 0 (no RQ), a 4 KiB SQ (64 TXBBs) in
    // one page described by one MTT entry, as Linux sizes the buffer
    // (en_tx.c: size * TXBB_SIZE). The card must not want a second entry
    // for an RQ the QP does not have.
    let (mut n, _w, _f, _b) = nodes(2);
    n[1].post_rx(2);
    let mut s = QpSpec::new(MLX, n[0].cq.cqn);
    (s.no_rq, s.sq_log, s.sq_shift) = (true, 6, 6);
    let mut tx = n[0].h.qp(0xb0, s);
    n[0].h.connect(&tx, s, 0, 0).unwrap();
    let f = frame(n[1].mac, n[0].mac, 0x0800, &[7u8; 50]);
    raw_send(&n[0].h, &mut tx, &n[0].buf, 0, &f, None, 0);
    let rb = n[1].received();
    assert_eq!(rb.len(), 1);
    assert_eq!(n[1].buf.read(32 << 10, f.len()), f);
    n[0].h.assert_no_violations();
}

#[test]
fn an_rx_ring_with_equal_strides_has_its_rq_after_the_one_txbb_sq() {
    // Linux mlx4_en's RX ring: RQ stride 64 (MLX4_EN_MAX_RX_FRAGS data
    // segments), an SQ of one 64-byte TXBB (sq_size_stride = 2). With equal
    // strides the SQ comes first (mlx4_ib `rq.wqe_shift > sq.wqe_shift`
    // puts the RQ first only when larger; mlx4_en_activate_rx_rings moves
    // `ring->buf` past the TXBB when the stride is <= TXBB_SIZE): the
    // receive WQEs start at +64.
    let (mut n, _w, _f, _b) = nodes(2);
    let mut s = QpSpec::new(MLX, n[1].cq.cqn);
    (s.sq_log, s.sq_shift, s.rq_log, s.rq_shift) = (0, 6, 3, 6);
    let mut rx = n[1].h.qp(0xb1, s);
    assert_eq!((rx.sq_off, rx.rq_off), (0, 64), "Linux's layout");
    n[1].h.connect(&rx, s, 0, 0).unwrap();
    set_rqp(&mut n[1].h.r, 1, 0xb1, 0, false, 2).unwrap();
    rx.post_recv(&[n[1].buf.sge(40 << 10, 2048)]);
    let f = frame(n[1].mac, n[0].mac, 0x0800, &[9u8; 80]);
    n[0].send(&f);
    let rb = n[1].received();
    assert_eq!(rb.len(), 1, "one frame");
    assert_eq!(cqe_basics(&rb[0]).0, 0xb1);
    assert_eq!(n[1].buf.read(40 << 10, f.len()), f);
    n[1].h.assert_no_violations();
}

#[test]
fn frames_are_steered_by_mac_through_a_learning_switch() {
    let (mut n, _w, fab, built) = nodes(3);
    for x in n.iter_mut() {
        x.post_rx(8);
    }
    let (a, b) = (n[0].mac, n[1].mac);
    // A to B: B unknown to the switch, so it floods; C's port sees the
    // frame and steers it nowhere (not its MAC, no promiscuous QP).
    let payload: Vec<u8> = (0..100u8).collect();
    let f = frame(b, a, 0x0800, &payload);
    n[0].send(&f);
    let rb = n[1].received();
    assert_eq!(rb.len(), 1);
    let (qpn, _, _, len) = cqe_basics(&rb[0]);
    assert_eq!((qpn, len), (RX, f.len() as u32));
    assert_eq!(n[1].buf.read(32 << 10, f.len()), f, "the frame as sent");
    assert!(n[2].received().is_empty());
    let c = n[2].h.r.sim.eth_counters(1).unwrap();
    assert_eq!(
        (c.rx_frames, c.rx_no_steer),
        (1, 1),
        "flooded to C, dropped"
    );
    // B answers: now the switch knows both; A to B no longer floods.
    n[1].send(&frame(a, b, 0x0800, &payload));
    assert_eq!(n[0].received().len(), 1);
    n[0].send(&f);
    assert_eq!(n[1].received().len(), 1);
    assert_eq!(
        n[2].h.r.sim.eth_counters(1).unwrap().rx_frames,
        1,
        "C saw only the first frame, flooded"
    );
    let sw = built.eth_switches[0].1;
    let table = fab.lock().unwrap().eth_switch(sw).unwrap().table();
    let ports: Vec<([u8; 6], u8)> = table.iter().map(|t| (t.0, t.1)).collect();
    assert!(
        ports.contains(&(a, 1)) && ports.contains(&(b, 2)),
        "{ports:?}"
    );
    // Broadcast floods to everyone and lands on the default multicast QP.
    n[0].send(&frame([0xff; 6], a, 0x0806, &[0u8; 28]));
    assert_eq!(n[1].received().len(), 1);
    assert_eq!(n[2].received().len(), 1);
    assert!(n[0].received().is_empty(), "not back to the sender");
    for x in &n {
        x.h.assert_no_violations();
    }
}

#[test]
fn steering_b0_entries_promiscuous_qps_and_rss() {
    let (mut n, _w, _f, _b) = nodes(2);
    let (a, bmac) = (n[0].mac, n[1].mac);
    let h = &mut n[1].h;
    // B0 (Linux with VEP_UC_STEER/VEP_MC_STEER): no RQP_CALC match for
    // another MAC, an MCG entry of protocol Ethernet steers it to QP 0xa2.
    let cq = h.cq(8);
    let (mut q2, _) = raw_qp(h, 0xa2, 1, cq.cqn);
    let other = [0x02, 0, 0, 0, 0, 0x42];
    let gid = {
        let mut g = [0u8; 16];
        g[5] = 1;
        g[7] = 1 << 1; // unicast steer
        g[10..].copy_from_slice(&other);
        g
    };
    h.r.inbox.write_bytes(0, &gid);
    let ib = h.r.inbox.bus_addr().0;
    let hash = h.r.post(ib, 0, 0, 1, Opcode::MGID_HASH).map(|_| ()).ok();
    assert!(hash.is_some());
    let idx = h.r.cmd_imm(ib, 0, 1, Opcode::MGID_HASH).unwrap() as u32;
    let mut e = vec![0u8; 64];
    e[4..8].copy_from_slice(&(1u32 << 30 | 1).to_be_bytes()); // Ethernet, 1 member
    e[0x10..0x20].copy_from_slice(&gid);
    e[0x20..0x24].copy_from_slice(&0xa2u32.to_be_bytes());
    let mut entry = vec![0u8; 1 << 9];
    entry[..64].copy_from_slice(&e);
    h.r.cmd_in(&entry, idx, 0, Opcode::WRITE_MCG).unwrap();
    q2.post_recv(&[n[1].buf.sge(16 << 10, 2048)]);
    n[0].send(&frame(other, a, 0x0800, &[1; 50]));
    settle(&n[0].h);
    let mut cq = cq;
    let got = drain_raw(&mut cq);
    assert_eq!(got.len(), 1);
    assert_eq!(cqe_basics(&got[0]).0, 0xa2);
    // A promiscuous entry (WRITE_MCG op_mod 1, port << 16 | UC << 1) takes
    // the unicast frames nothing else names.
    let mut pe = vec![0u8; 1 << 9];
    pe[4..8].copy_from_slice(&(1u32 << 30 | 1).to_be_bytes());
    pe[0x20..0x24].copy_from_slice(&0xa2u32.to_be_bytes());
    n[1].h
        .r
        .cmd_in(&pe, 1 << 16 | 1 << 1, 1, Opcode::WRITE_MCG)
        .unwrap();
    q2.post_recv(&[n[1].buf.sge(18 << 10, 2048)]);
    n[0].send(&frame([0x02, 0, 0, 0, 0, 0x43], a, 0x0800, &[1; 50]));
    settle(&n[0].h);
    let got = drain_raw(&mut cq);
    assert_eq!(got.len(), 1, "to the promiscuous QP");
    // A frame for B's own MAC is still steered by RQP_CALC (the entry
    // covers misses only): nothing names it in B0, so the promiscuous
    // entry takes it too.
    // RSS: QP 0xb1 spreads over rings 0xc0, 0xc1 by Toeplitz.
    let h = &mut n[1].h;
    let (mut r0, _) = raw_qp(h, 0xc0, 1, cq.cqn);
    let (mut r1, _) = raw_qp(h, 0xc1, 1, cq.cqn);
    let key: [u8; 40] = core::array::from_fn(|i| (i * 7 + 1) as u8);
    rss_qp(h, 0xb1, 1, cq.cqn, 0xc0, 1, 1 << 5 | 1 << 4 | 1 << 1, &key);
    set_rqp(&mut h.r, 1, 0xb1, 0, false, 0).unwrap();
    // The promiscuous entry off again.
    let empty = vec![0u8; 1 << 9];
    h.r.cmd_in(&empty, 1 << 16 | 1 << 1, 1, Opcode::WRITE_MCG)
        .unwrap();
    for k in 0..8 {
        r0.post_recv(&[n[1].buf.sge((20 << 10) + k * 1024, 1024)]);
        r1.post_recv(&[n[1].buf.sge((28 << 10) + k * 1024, 1024)]);
    }
    // UDP frames with different ports: both rings get some, each CQE's
    // hash is the Toeplitz hash of addresses and ports.
    for sport in 0..8u16 {
        let mut ip = vec![0u8; 20 + 8 + 4];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&32u16.to_be_bytes());
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
        ip[20..22].copy_from_slice(&(1000 + sport).to_be_bytes());
        ip[22..24].copy_from_slice(&4791u16.to_be_bytes());
        ip[24..26].copy_from_slice(&12u16.to_be_bytes());
        n[0].send(&frame(bmac, a, 0x0800, &ip));
    }
    // A non-IP frame goes to the default QPN.
    n[0].send(&frame(bmac, a, 0x88b5, &[7; 46]));
    settle(&n[0].h);
    let got = drain_raw(&mut cq);
    let rings: Vec<u32> = got.iter().map(|c| cqe_basics(c).0).collect();
    assert_eq!(rings.len(), 9, "{rings:x?}");
    assert!(rings.contains(&0xc0) && rings.contains(&0xc1), "{rings:x?}");
    assert_eq!(*rings.last().unwrap(), 0xc0, "non-IP: the default QPN");
    // Each hashed CQE carries the Toeplitz hash of addresses and ports,
    // whose low bit picked the ring.
    for (k, c) in got[..8].iter().enumerate() {
        let hashed = u32::from_be_bytes(c[4..8].try_into().unwrap());
        let mut input = vec![10, 0, 0, 1, 10, 0, 0, 2];
        input.extend_from_slice(&(1000 + k as u16).to_be_bytes());
        input.extend_from_slice(&4791u16.to_be_bytes());
        assert_eq!(hashed, sim::hca::engine::eth::toeplitz(&key, &input));
        assert_eq!(cqe_basics(c).0, 0xc0 + (hashed & 1));
    }
    for x in &n {
        x.h.assert_no_violations();
    }
}

#[test]
fn vlan_insertion_and_stripping_and_checksum_offload() {
    let (mut n, _w, _f, _b) = nodes(2);
    n[1].post_rx(4);
    let (a, b) = (n[0].mac, n[1].mac);
    // B is in VLAN 100.
    let mut v = vec![0u8; 512];
    v[4..8].copy_from_slice(&(1u32 << 31 | 100).to_be_bytes());
    set_port_eth(&mut n[1].h.r, 1, 3, &v).unwrap();
    // An IPv4/UDP frame with zero checksums, tagged by the card (PCP 5,
    // VID 100), checksums computed by the card.
    let mut ip = vec![0u8; 20 + 8 + 23];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&51u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
    ip[20..22].copy_from_slice(&5000u16.to_be_bytes());
    ip[22..24].copy_from_slice(&5001u16.to_be_bytes());
    ip[24..26].copy_from_slice(&31u16.to_be_bytes());
    ip[28..].copy_from_slice(b"checksummed by the card");
    let f = frame(b, a, 0x0800, &ip);
    let tci = 5 << 13 | 100;
    n[0].send_with(&f, Some(tci), 1 << 4 | 1 << 5);
    let got = n[1].received();
    assert_eq!(got.len(), 1);
    let c = got[0];
    let be16 = |o: usize| u16::from_be_bytes([c[o], c[o + 1]]);
    assert_ne!(c[0] & 0x20, 0, "C-VLAN present (vlan_my_qpn bit 29)");
    assert_eq!(be16(0x0c), tci, "sl_vid");
    let status = be16(0x10);
    assert_eq!(
        status & (1 << 6 | 1 << 11 | 1 << 12),
        1 << 6 | 1 << 11 | 1 << 12
    );
    assert_eq!(be16(0x1a), 0xffff, "L4 checksum good");
    let got_f = n[1].buf.read(32 << 10, f.len());
    assert_eq!(&got_f[..12], &f[..12], "the tag stripped");
    assert_ne!(&got_f[24..26], &[0, 0], "IPv4 header checksum filled in");
    assert_ne!(&got_f[40..42], &[0, 0], "UDP checksum filled in");
    // A VLAN B is not in: dropped and counted.
    n[0].send_with(&f, Some(101), 0);
    assert!(n[1].received().is_empty());
    assert_eq!(n[1].h.r.sim.eth_counters(1).unwrap().rx_vlan_drop, 1);
    for x in &n {
        x.h.assert_no_violations();
    }
}

#[test]
fn frames_too_short_or_too_long_are_dropped_and_counted_without_stalling() {
    let (mut n, _w, _f, _b) = nodes(2);
    let (a, b) = (n[0].mac, n[1].mac);
    // No receive WQE: dropped, counted, nothing stalls.
    n[0].send(&frame(b, a, 0x0800, &[1; 50]));
    assert!(n[1].received().is_empty());
    assert_eq!(n[1].h.r.sim.eth_counters(1).unwrap().rx_no_wqe, 1);
    // A 256-byte buffer and a 1000-byte frame: dropped, the WQE stays.
    let sge = n[1].buf.sge(32 << 10, 256);
    n[1].rx.post_recv(&[sge]);
    n[0].send(&frame(b, a, 0x0800, &[2; 986]));
    assert!(n[1].received().is_empty());
    assert_eq!(n[1].h.r.sim.eth_counters(1).unwrap().rx_too_long_for_wqe, 1);
    n[0].send(&frame(b, a, 0x0800, &[3; 100]));
    assert_eq!(n[1].received().len(), 1, "the WQE took the next frame");
    // Longer than the port's MTU (1522): not sent, counted, completed.
    n[1].post_rx(2);
    n[0].send(&frame(b, a, 0x0800, &[4; 1600]));
    settle(&n[0].h);
    let sends: Vec<_> = drain_raw(&mut n[0].cq)
        .into_iter()
        .filter(|c| cqe_basics(c).1)
        .collect();
    assert_eq!(sends.len(), 4, "every send completed");
    assert!(
        sends.iter().all(|c| cqe_basics(c).2 != 0x1e),
        "none in error"
    );
    assert_eq!(n[0].h.r.sim.eth_counters(1).unwrap().tx_dropped, 1);
    assert!(n[1].received().is_empty());
    // Shorter than an Ethernet header: recorded, dropped, completed.
    n[0].send(&[0u8; 10]);
    settle(&n[0].h);
    assert!(n[0].h.r.sim.take_violations()[0].contains("shorter than an Ethernet header"));
    assert_eq!(n[0].h.r.sim.eth_counters(1).unwrap().tx_dropped, 2);
    // A short frame is padded to 60 bytes (64 with the FCS).
    n[0].send(&frame(b, a, 0x0806, &[5; 28]));
    let got = n[1].received();
    assert_eq!(cqe_basics(&got[0]).3, 60);
}

/// A raw send of `f` inline (mlx4_en's `build_inline_wqe`: one inline
/// segment up to 44 bytes, else 44 bytes and the rest in a second at the
/// next 64-byte boundary), with the card inserting `tci` if given.
fn send_inline(x: &mut Node, f: &[u8], tci: Option<u16>) {
    let w = Wr {
        opcode: op::SEND,
        signalled: true,
        solicited: true,
        inline: Some(f.to_vec()),
        mlx_flags: Some((0, 0)),
        ..Wr::default()
    };
    let mut b = x.tx.build(&w);
    if let Some(t) = tci {
        b[4..6].copy_from_slice(&t.to_be_bytes());
        b[6] = 0x40;
    }
    x.tx.put(w.opcode, false, &b);
    x.h.ring_send(x.tx.qpn);
}

#[test]
fn inline_frames_as_mlx4_en_writes_them() {
    let (mut n, _w, _f, _b) = nodes(2);
    n[1].post_rx(4);
    let (a, b) = (n[0].mac, n[1].mac);
    // 40 bytes: one inline segment, padded by the card to 60.
    let short = frame(b, a, 0x0806, &[9; 26]);
    send_inline(&mut n[0], &short, None);
    // 100 bytes: two inline segments (44 + 56).
    let long: Vec<u8> = frame(b, a, 0x88b5, &(0..86u8).collect::<Vec<_>>());
    send_inline(&mut n[0], &long, None);
    // And one the card tags (VLAN 0: priority only, always taken).
    send_inline(&mut n[0], &long, Some(3 << 13));
    let got = n[1].received();
    assert_eq!(got.len(), 3);
    assert_eq!(cqe_basics(&got[0]).3, 60, "padded");
    let mut padded = short.clone();
    padded.resize(60, 0);
    assert_eq!(n[1].buf.read(32 << 10, 60), padded);
    assert_eq!(cqe_basics(&got[1]).3, 100);
    assert_eq!(n[1].buf.read((32 << 10) + 2048, 100), long);
    assert_eq!(
        n[1].buf.read((32 << 10) + 4096, 100),
        long,
        "the tag stripped"
    );
    assert_ne!(got[2][0] & 0x20, 0, "C-VLAN present");
    assert_eq!(u16::from_be_bytes([got[2][0x0c], got[2][0x0d]]), 3 << 13);
    for x in &n {
        x.h.assert_no_violations();
    }
}

#[test]
fn the_multicast_filter_the_port_mtu_and_dump_eth_stats() {
    let (mut n, _w, _f, _b) = nodes(2);
    n[1].post_rx(8);
    let (a, b) = (n[0].mac, n[1].mac);
    let g1 = [0x01, 0x00, 0x5e, 0, 0, 1];
    let g2 = [0x01, 0x00, 0x5e, 0, 0, 2];
    // B's multicast filter: clear, add g1, enable (Linux
    // mlx4_SET_MCAST_FLTR: MLX4_MCAST_CONFIG, then MLX4_MCAST_ENABLE).
    let r = &mut n[1].h.r;
    r.cmd(1 << 63, 1, 0, Opcode::SET_MCAST_FLTR).unwrap();
    r.cmd(mac_u64(&g1), 1, 0, Opcode::SET_MCAST_FLTR).unwrap();
    r.cmd(0, 1, 2, Opcode::SET_MCAST_FLTR).unwrap();
    n[0].send(&frame(g1, a, 0x0800, &[1; 46]));
    assert_eq!(n[1].received().len(), 1, "g1 passes");
    n[0].send(&frame(g2, a, 0x0800, &[2; 46]));
    assert!(n[1].received().is_empty(), "g2 held back");
    assert_eq!(n[1].h.r.sim.eth_counters(1).unwrap().rx_mcast_filtered, 1);
    n[0].send(&frame([0xff; 6], a, 0x0806, &[3; 28]));
    assert_eq!(n[1].received().len(), 1, "broadcast passes");
    // Disabled: everything again.
    n[1].h.r.cmd(0, 1, 1, Opcode::SET_MCAST_FLTR).unwrap();
    n[0].send(&frame(g2, a, 0x0800, &[2; 46]));
    assert_eq!(n[1].received().len(), 1);
    // B's MTU 1000 (FCS included): a 1200-byte frame is too long for B's
    // port (A's is 1522), dropped and counted there.
    set_general(&mut n[1].h.r, 1, 1000).unwrap();
    n[0].send(&frame(b, a, 0x0800, &[4; 1186]));
    assert!(n[1].received().is_empty());
    let c = n[1].h.r.sim.eth_counters(1).unwrap();
    assert_eq!(c.rx_too_long, 1);
    n[0].send(&frame(b, a, 0x0800, &[5; 100]));
    assert_eq!(n[1].received().len(), 1, "no stall");
    // DUMP_ETH_STATS: the frame counters where mlx4_en reads them, and
    // the reset bit (in_mod bit 8) starts them again.
    let c = n[1].h.r.sim.eth_counters(1).unwrap();
    let s = n[1]
        .h
        .r
        .cmd_out(1 << 8 | 1, 0, Opcode::DUMP_ETH_STATS)
        .unwrap();
    let be64 = |slot: usize| u64::from_be_bytes(s[slot * 8..slot * 8 + 8].try_into().unwrap());
    let be32 = |o: usize| u32::from_be_bytes(s[o..o + 4].try_into().unwrap());
    assert_eq!(be64(168), c.rx_frames, "RTOT_novlan");
    assert_eq!(be64(98), c.rx_broadcast, "RBCAST_novlan");
    assert_eq!(be64(107), c.rx_multicast, "MCAST_novlan");
    assert_eq!(be64(177), 1, "RFrmTooLong");
    assert_eq!(u64::from(be32(2980)), c.rx_frames, "RTOTFRMS");
    assert!(c.rx_frames >= 5 && c.rx_multicast >= 3, "{c:?}");
    assert_eq!(
        n[1].h.r.sim.eth_counters(1).unwrap(),
        sim::hca::eth::EthCounters::default(),
        "reset"
    );
    for x in &n {
        x.h.assert_no_violations();
    }
}

/// An LSO WQE as mlx4_en builds one: opcode 0x0E (with bit 6, as Linux
/// writes it), the LSO segment (MSS << 16 | header length, the header
/// padded to 16 bytes), then the payload by pointer; checksum bits set.
fn send_lso(x: &mut Node, hdr: &[u8], mss: u16, payload_off: u64, payload_len: u32) {
    let mut seg = (u32::from(mss) << 16 | hdr.len() as u32)
        .to_be_bytes()
        .to_vec();
    seg.extend_from_slice(hdr);
    seg.resize(seg.len().next_multiple_of(16), 0);
    let w = Wr {
        opcode: 0x0e,
        signalled: true,
        solicited: true,
        raw: Some(seg),
        sges: vec![x.buf.sge(payload_off, payload_len)],
        mlx_flags: Some((1 << 4 | 1 << 5, 0)),
        ..Wr::default()
    };
    let b = x.tx.build(&w);
    x.tx.put(0x0e | 0x40, false, &b);
    x.h.ring_send(x.tx.qpn);
}

#[test]
fn lso_cuts_a_tcp_payload_into_frames_of_the_mss() {
    // Cards that report BLH (a real ConnectX-3 does; the model's default
    // leaves it clear for IPoIB's sake), as mlx4_en needs for LSO.
    let (mut n, _w, _f, _b) = nodes_with(2, |c| c.dev_cap.flags |= 1 << 15);
    n[1].post_rx(8);
    let (a, b) = (n[0].mac, n[1].mac);
    let payload = Rng(4).bytes(3000);
    n[0].buf.write(8192, &payload);
    let tcp = |ip_payload_hdr: &mut Vec<u8>| {
        let mut t = vec![0u8; 20];
        t[0..2].copy_from_slice(&40000u16.to_be_bytes());
        t[2..4].copy_from_slice(&5201u16.to_be_bytes());
        t[4..8].copy_from_slice(&0xffff_f800u32.to_be_bytes());
        t[12] = 0x50;
        t[13] = 0x80 | 0x10 | 0x08 | 0x01; // CWR ACK PSH FIN
        t[14..16].copy_from_slice(&512u16.to_be_bytes());
        ip_payload_hdr.extend_from_slice(&t);
    };
    // IPv4: MSS 1448, three frames of 1448, 1448 and 104 bytes.
    let mut ip = vec![0u8; 20];
    ip[0] = 0x45;
    ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
    tcp(&mut ip);
    let h4 = frame(b, a, 0x0800, &ip);
    send_lso(&mut n[0], &h4, 1448, 8192, 3000);
    // IPv6: MSS 1428.
    let mut ip6 = vec![0u8; 40];
    ip6[0] = 0x60;
    ip6[6] = 6;
    ip6[7] = 64;
    ip6[8] = 0xfe;
    ip6[9] = 0x80;
    ip6[23] = 1;
    ip6[24] = 0xfe;
    ip6[25] = 0x80;
    ip6[39] = 2;
    tcp(&mut ip6);
    let h6 = frame(b, a, 0x86dd, &ip6);
    send_lso(&mut n[0], &h6, 1428, 8192, 3000);
    let got = n[1].received();
    assert_eq!(got.len(), 6, "three frames each");
    let be16 = |c: &[u8; 32], o: usize| u16::from_be_bytes([c[o], c[o + 1]]);
    let mut seen4 = Vec::new();
    let mut seen6 = Vec::new();
    for (k, c) in got.iter().enumerate() {
        let (_, _, _, len) = cqe_basics(c);
        let f = n[1].buf.read((32 << 10) + k as u64 * 2048, len as usize);
        let v4 = k < 3;
        let (l4, mss) = if v4 { (34, 1448) } else { (54, 1428) };
        let i = k % 3;
        let chunk = &payload[i * mss..(i * mss + mss).min(3000)];
        assert_eq!(&f[l4 + 20..], chunk, "frame {k}: the payload's part");
        let seq = u32::from_be_bytes(f[l4 + 4..l4 + 8].try_into().unwrap());
        assert_eq!(seq, 0xffff_f800u32.wrapping_add((i * mss) as u32));
        let fl = f[l4 + 13];
        assert_eq!(fl & 0x10, 0x10, "ACK on every frame");
        assert_eq!(fl & 0x09 != 0, i == 2, "FIN/PSH on the last only: {fl:#x}");
        assert_eq!(fl & 0x80 != 0, i == 0, "CWR on the first only: {fl:#x}");
        if v4 {
            let total = u16::from_be_bytes([f[16], f[17]]);
            assert_eq!(usize::from(total), 40 + chunk.len());
            assert_eq!(
                u16::from_be_bytes([f[18], f[19]]),
                0x1234 + i as u16,
                "IP id"
            );
            seen4.extend_from_slice(chunk);
        } else {
            let pl = u16::from_be_bytes([f[18], f[19]]);
            assert_eq!(usize::from(pl), 20 + chunk.len());
            seen6.extend_from_slice(chunk);
        }
        // The receiving card verified both checksums.
        let st = be16(c, 0x10);
        assert_eq!(
            st & (1 << 10 | 1 << 12),
            1 << 10 | 1 << 12,
            "TCP, IP OK: {st:#x}"
        );
        assert_eq!(be16(c, 0x1a), 0xffff, "frame {k}: TCP checksum good");
    }
    assert_eq!(
        (seen4.as_slice(), seen6.as_slice()),
        (&payload[..], &payload[..])
    );
    assert_eq!(n[0].h.r.sim.eth_counters(1).unwrap().tx_frames, 6);
    // A header that is not TCP over IP: a bad WQE, recorded.
    let mut udp = ip.clone();
    udp[9] = 17;
    send_lso(&mut n[0], &frame(b, a, 0x0800, &udp), 1448, 8192, 3000);
    settle(&n[0].h);
    let err: Vec<_> = drain_raw(&mut n[0].cq)
        .into_iter()
        .filter(|c| cqe_basics(c).2 == 0x1e)
        .collect();
    assert_eq!(err.len(), 1, "the LSO of a UDP header fails");
    assert!(n[0].h.r.sim.take_violations()[0].contains("not an IPv4 TCP header"));
    n[1].h.assert_no_violations();
    // A card that does not report BLH takes no LSO WQE.
    let (mut m, _w, _f, _b) = nodes(2);
    m[1].post_rx(1);
    m[0].buf.write(8192, &payload);
    send_lso(&mut m[0], &h4, 1448, 8192, 3000);
    settle(&m[0].h);
    let sends = drain_raw(&mut m[0].cq);
    assert_eq!(cqe_basics(&sends[0]).2, 0x1e, "an error CQE");
    assert!(m[0].h.r.sim.take_violations()[0].contains("did not report BLH"));
    assert!(m[1].received().is_empty());
}

/// Writes descriptor `d` (control segment first) the way Linux mlx4_en
/// does on its TX ring of 64-byte TXBBs: at the producer's TXBB, spanning
/// as many TXBBs as it needs and wrapping at the end of the ring (its
/// bounce-buffer copy), the DS count, then the owner and opcode dword
/// last; no doorbell. Returns the first TXBB's index.
fn put_txbbs(q: &mut Qp, opcode: u8, d: &[u8]) -> u32 {
    let idx = q.sq_pi;
    let bbs = d.len().div_ceil(64) as u32;
    let slot = |k: u32| q.sq_off + (((idx + k) & (q.sq_cnt - 1)) as usize) * 64;
    for k in (0..bbs).rev() {
        let from = k as usize * 64;
        let to = d.len().min(from + 64);
        let skip = if k == 0 { 8 } else { 0 };
        q.buf.write_bytes(slot(k) + skip, &d[from + skip..to]);
    }
    q.buf.write_bytes(slot(0) + 4, &d[4..8]);
    q.buf.write_u8(slot(0) + 7, d.len().div_ceil(16) as u8);
    let owner = if idx & q.sq_cnt != 0 { 1u32 << 31 } else { 0 };
    hal::barrier::wmb();
    q.buf.write_be32(slot(0), owner | u32::from(opcode));
    q.sq_pi = idx.wrapping_add(bbs);
    idx
}

#[test]
fn tx_descriptors_of_several_txbbs_run_and_wrap_as_mlx4_ens() {
    // mlx4_en's TX ring: stride 64, no RQ, cleared to zero (no pre-stamp);
    // an inline frame over 44 bytes takes two TXBBs (its second inline
    // segment starts the second), the next descriptor follows it, one
    // wraps at the end of the ring, and freed TXBBs are stamped
    // 0x7fffffff | owner of the pass they were used in.
    let (mut n, _w, _f, _b) = nodes(2);
    n[1].post_rx(12);
    let mut s = QpSpec::new(MLX, n[0].cq.cqn);
    (s.no_rq, s.sq_log, s.sq_shift) = (true, 3, 6);
    let mut tx = n[0].h.qp(0xb2, s);
    tx.buf.fill(tx.sq_off, 8 * 64, 0);
    n[0].h.connect(&tx, s, 0, 0).unwrap();
    let (a, b) = (n[0].mac, n[1].mac);
    let mut sent = Vec::new();
    let mut firsts = Vec::new();
    let inline = |q: &Qp, f: &[u8]| {
        q.build(&Wr {
            opcode: op::SEND,
            signalled: true,
            inline: Some(f.to_vec()),
            mlx_flags: Some((0, 0)),
            ..Wr::default()
        })
    };
    let big = frame(b, a, 0x0800, &[0x42; 84]);
    let d = inline(&tx, &big);
    assert_eq!(d.len(), 128, "two TXBBs");
    firsts.push(put_txbbs(&mut tx, op::SEND, &d));
    sent.push(big.clone());
    // Five one-TXBB descriptors (a pointer to the frame): TXBBs 2..6.
    for k in 0..5u8 {
        let f = frame(b, a, 0x0800, &[k; 46]);
        n[0].buf.write(u64::from(k) * 256, &f);
        let w = raw_wr(n[0].buf.sge(u64::from(k) * 256, f.len() as u32), 0);
        let d = tx.build(&w);
        firsts.push(put_txbbs(&mut tx, op::SEND, &d));
        sent.push(f);
    }
    n[0].h.ring_send(tx.qpn);
    settle(&n[0].h);
    // Freed TXBBs stamped as mlx4_en_free_tx_desc does (pass 0: owner 0).
    for k in 0..7usize {
        tx.buf.write_be32(tx.sq_off + k * 64, 0x7fff_ffff);
    }
    // A two-TXBB descriptor at TXBB 7, wrapping to TXBB 0 (index 8).
    let f = frame(b, a, 0x0800, &[0x77; 90]);
    let d = inline(&tx, &f);
    firsts.push(put_txbbs(&mut tx, op::SEND, &d));
    sent.push(f);
    n[0].h.ring_send(tx.qpn);
    settle(&n[0].h);
    // The next at TXBB 1 of the second pass (index 9, owner 1).
    let f = frame(b, a, 0x0800, &[0x99; 46]);
    let d = inline(&tx, &f);
    firsts.push(put_txbbs(&mut tx, op::SEND, &d));
    sent.push(f);
    n[0].h.ring_send(tx.qpn);
    assert_eq!(firsts, [0, 2, 3, 4, 5, 6, 7, 9]);
    let rx = n[1].received();
    assert_eq!(rx.len(), sent.len(), "every frame arrived");
    for (k, f) in sent.iter().enumerate() {
        let at = (32 << 10) + k as u64 * 2048;
        assert_eq!(n[1].buf.read(at, f.len()), *f, "frame {k}");
    }
    settle(&n[0].h);
    let done: Vec<u16> = drain_raw(&mut n[0].cq)
        .iter()
        .filter(|c| cqe_basics(c).1)
        .map(|c| u16::from_be_bytes([c[0x18], c[0x19]]))
        .collect();
    assert_eq!(
        done,
        [0, 2, 3, 4, 5, 6, 7, 9],
        "each CQE names its first TXBB"
    );
    n[0].h.assert_no_violations();
    n[1].h.assert_no_violations();
}
