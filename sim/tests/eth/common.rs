//! What the Ethernet tests share: cards with Ethernet ports brought up by
//! raw commands, the Ethernet SET_PORTs, raw Ethernet QPs, RoCE QPs and
//! address vectors, frames, raw CQEs.

#![allow(dead_code)]

use std::time::Duration;

use sim::fabric::{LinkLayer, Topology};
use sim::{Opcode, PortType, SimConfig, SimHca, Wire};

use crate::harness::{self, QpMbox, R, Raw, profile::*};
use crate::poster::*;

/// A synchronous card with node GUID `guid`, ports of `types`.
pub fn cfg(guid: u64, types: [PortType; 2]) -> SimConfig {
    SimConfig {
        node_guid: guid,
        dma_size: 64 << 20,
        port_types: types,
        ..SimConfig::default()
    }
}

/// `init_full` with each port's SET_PORT by its type: InfiniBand as Linux
/// sends it, Ethernet the general flavour (MTU 1522, pause off) as
/// mlx4_en does (`types`: Ethernet per port).
pub fn bring_up(sim: SimHca, eth: [bool; 2]) -> Hca {
    let mut r = Raw::with(sim);
    harness::init(&mut r).unwrap();
    let comp = harness::create_eq(&mut r, FIRST_EQ, 6).unwrap();
    let asy = harness::create_eq(&mut r, FIRST_EQ + 1, 9).unwrap();
    r.cmd(harness::ASYNC_MASK, FIRST_EQ + 1, 0, Opcode::MAP_EQ)
        .unwrap();
    harness::eq_doorbell(&r, FIRST_EQ, 0, true);
    harness::eq_doorbell(&r, FIRST_EQ + 1, 0, true);
    r.cmd(0, BASE_SQPN, 0, Opcode::CONF_SPECIAL_QP).unwrap();
    for port in 1..=2u8 {
        if eth[usize::from(port) - 1] {
            set_general(&mut r, port, 1522).unwrap();
        } else {
            let mut sp = vec![0u8; 256];
            sp[0..4].copy_from_slice(&(1u32 << 22 | 1 << 21 | 5 << 12 | 8 << 4).to_be_bytes());
            r.cmd_in(&sp, u32::from(port), 0, Opcode::SET_PORT).unwrap();
        }
    }
    Hca::brought_up(r, (comp, asy))
}

/// SET_PORT flavour `sub` (op_mod 1) of `port` with mailbox `b`.
pub fn set_port_eth(r: &mut Raw, port: u8, sub: u32, b: &[u8]) -> R {
    r.cmd_in(b, sub << 8 | u32::from(port), 1, Opcode::SET_PORT)
}

/// SET_PORT general: MTU (FCS included), pause off (Linux
/// `mlx4_SET_PORT_general`).
pub fn set_general(r: &mut Raw, port: u8, mtu: u16) -> R {
    let mut b = vec![0u8; 64];
    b[3] = 0x7;
    b[6..8].copy_from_slice(&mtu.to_be_bytes());
    set_port_eth(r, port, 0, &b)
}

/// SET_PORT MAC_TABLE with `macs` at indices 0, 1, ...
pub fn set_macs(r: &mut Raw, port: u8, macs: &[[u8; 6]]) -> R {
    let mut b = vec![0u8; 1024];
    for (i, m) in macs.iter().enumerate() {
        let v = 1u64 << 63 | mac_u64(m);
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_be_bytes());
    }
    set_port_eth(r, port, 2, &b)
}

/// SET_PORT GID_TABLE with `gids` at indices 0, 1, ...
pub fn set_gids(r: &mut Raw, port: u8, gids: &[[u8; 16]]) -> R {
    let mut b = vec![0u8; 2048];
    for (i, g) in gids.iter().enumerate() {
        b[i * 16..i * 16 + 16].copy_from_slice(g);
    }
    set_port_eth(r, port, 5, &b)
}

/// SET_PORT RQP_CALC as Linux's A0 steering writes it, plus the
/// promiscuous bit and multicast mode.
pub fn set_rqp(r: &mut Raw, port: u8, base: u32, n_mac: u8, uc_promisc: bool, mc_mode: u32) -> R {
    let mut b = vec![0u8; 64];
    b[0..4].copy_from_slice(&base.to_be_bytes());
    b[5] = n_mac;
    b[0x14..0x18].copy_from_slice(&(u32::from(uc_promisc) << 31 | base).to_be_bytes());
    b[0x18..0x1c].copy_from_slice(&(mc_mode << 30 | base).to_be_bytes());
    set_port_eth(r, port, 1, &b)
}

pub fn mac_u64(m: &[u8; 6]) -> u64 {
    m.iter().fold(0u64, |a, &b| a << 8 | u64::from(b))
}

/// The MAC the card gives port `port` of node GUID `guid` (its port GUID
/// without the middle bytes).
pub fn port_mac(guid: u64, port: u8) -> [u8; 6] {
    let g = (guid + u64::from(port)).to_be_bytes();
    [g[0], g[1], g[2], g[5], g[6], g[7]]
}

/// fe80::EUI-64 of `mac` (Linux `iboe_mac_vlan_to_ll` without a VLAN).
pub fn ll_gid(mac: &[u8; 6]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8] = mac[0] ^ 2;
    g[9] = mac[1];
    g[10] = mac[2];
    g[11] = 0xff;
    g[12] = 0xfe;
    g[13..16].copy_from_slice(&mac[3..6]);
    g
}

/// An Ethernet port made ready as mlx4_en and mlx4_ib would: its MAC at
/// index 0 of the MAC table, its link-local GID at index 0 of the GID
/// table, INIT_PORT. Returns (MAC, GID).
pub fn eth_up(h: &mut Hca, port: u8) -> ([u8; 6], [u8; 16]) {
    let mac = h.r.sim.eth_port(port).unwrap().mac;
    let gid = ll_gid(&mac);
    set_macs(&mut h.r, port, &[mac]).unwrap();
    set_gids(&mut h.r, port, &[gid]).unwrap();
    h.r.cmd(0, u32::from(port), 0, Opcode::INIT_PORT).unwrap();
    (mac, gid)
}

/// Two synchronous cards whose ports 1 are Ethernet, back to back.
pub fn eth_b2b() -> (Hca, Hca, Wire) {
    let t = [PortType::Eth, PortType::Ib];
    let (x, y, w) =
        SimHca::back_to_back(cfg(0x0002_c903_0000_1000, t), cfg(0x0002_c903_0000_2000, t));
    assert_eq!(x.link_layer(1), Some(LinkLayer::Eth));
    (bring_up(x, [true, false]), bring_up(y, [true, false]), w)
}

/// `n` cards on the `--nodes n --link-layer ll` fabric (synchronous),
/// brought up; the shared fabric and the built topology.
pub fn on_switches(
    n: usize,
    ll: [LinkLayer; 2],
) -> (
    Vec<Hca>,
    Wire,
    sim::fabric::SharedFabric,
    sim::fabric::Built,
) {
    on_switches_with(n, ll, |_| {})
}

/// [`on_switches`] with each card's configuration changed by `tweak`.
pub fn on_switches_with(
    n: usize,
    ll: [LinkLayer; 2],
    tweak: impl Fn(&mut SimConfig),
) -> (
    Vec<Hca>,
    Wire,
    sim::fabric::SharedFabric,
    sim::fabric::Built,
) {
    let mut f = sim::fabric::Fabric::new();
    let built = Topology::for_nodes_with(n, ll)
        .unwrap()
        .build(&mut f)
        .unwrap();
    let shared = std::sync::Arc::new(std::sync::Mutex::new(f));
    let w = Wire::over(shared.clone(), Duration::from_micros(1));
    let eth = [ll[0] == LinkLayer::Eth, ll[1] == LinkLayer::Eth];
    let hcas = built
        .hcas
        .iter()
        .map(|b| {
            let mut c = cfg(b.node_guid, [PortType::Ib; 2]);
            tweak(&mut c);
            let s = SimHca::new_on_ports(c, &w, [Some(b.ports[0]), Some(b.ports[1])]);
            bring_up(s, eth)
        })
        .collect();
    (hcas, w, shared, built)
}

/// A raw Ethernet QP (MLX, not a special QP) of `port` on CQ `cq`,
/// through RTS.
pub fn raw_qp(h: &mut Hca, qpn: u32, port: u8, cq: u32) -> (Qp, QpSpec) {
    let mut s = QpSpec::new(MLX, cq);
    s.port = port;
    s.rq_shift = 6;
    let q = h.qp(qpn, s);
    h.connect(&q, s, 0, 0).unwrap();
    (q, s)
}

/// The frame `dst <- src` of Ethertype `ty` with `payload`.
pub fn frame(dst: [u8; 6], src: [u8; 6], ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ty.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Control segment dword 2 of a raw Ethernet send: CQE, "inhibit ICRC"
/// (bit 1, as mlx4_en sets), and `extra` (checksum bits 4/5, force
/// loopback bit 0).
pub fn raw_wr(frame_sge: Sge, extra: u32) -> Wr {
    Wr {
        opcode: op::SEND,
        signalled: true,
        solicited: true,
        sges: vec![frame_sge],
        mlx_flags: Some((extra, 0)),
        ..Wr::default()
    }
}

/// Sends `f` on raw QP `q` (from `buf` at offset `off`), with the 802.1Q
/// tag `tci` inserted by the card if given.
pub fn raw_send(h: &Hca, q: &mut Qp, buf: &Mr, off: u64, f: &[u8], tci: Option<u16>, extra: u32) {
    buf.write(off, f);
    let w = raw_wr(buf.sge(off, f.len() as u32), extra);
    let mut b = q.build(&w);
    if let Some(t) = tci {
        b[4..6].copy_from_slice(&t.to_be_bytes());
        b[6] = 0x40;
    }
    q.put(w.opcode, false, &b);
    h.ring_send(q.qpn);
}

/// The next CQE of `cq` as raw bytes (owner bit checked), consumed.
pub fn poll_raw(cq: &mut Cq) -> Option<[u8; 32]> {
    let off = ((cq.ci & (cq.nent - 1)) * 32) as usize;
    let mut b = [0u8; 32];
    cq.buf.read_bytes(off, &mut b);
    let parity = cq.ci & cq.nent != 0;
    if (b[31] & 0x80 != 0) != parity {
        return None;
    }
    cq.ci = cq.ci.wrapping_add(1);
    cq.db.write_be32(0, cq.ci & 0xff_ffff);
    Some(b)
}

/// Every CQE available now, raw.
pub fn drain_raw(cq: &mut Cq) -> Vec<[u8; 32]> {
    std::iter::from_fn(|| poll_raw(cq)).collect()
}

/// A raw CQE's fields: (qpn, send, opcode, byte count).
pub fn cqe_basics(b: &[u8; 32]) -> (u32, bool, u8, u32) {
    let be32 = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
    (
        be32(0) & 0xff_ffff,
        b[31] & 0x40 != 0,
        b[31] & 0x1f,
        be32(0x14),
    )
}

/// Steps the wire a little (fake time).
pub fn settle(h: &Hca) {
    wait_steps(&h.r, Duration::from_micros(50));
}

/// A RoCE connected QP's path (Linux `mlx4_set_path` for an Ethernet
/// port): the GRH bit with source MAC index 0, source GID index 0, the
/// peer's GID and MAC, SL in sched_queue bits 5:3.
#[derive(Debug, Clone, Copy)]
pub struct RocePath {
    pub dmac: [u8; 6],
    pub dgid: [u8; 16],
    pub sl: u8,
    pub grh: bool,
    pub sgid_index: u8,
    pub vlan_index: Option<u8>,
}

impl RocePath {
    pub fn to(dmac: [u8; 6], dgid: [u8; 16]) -> RocePath {
        RocePath {
            dmac,
            dgid,
            sl: 0,
            grh: true,
            sgid_index: 0,
            vlan_index: None,
        }
    }
}

fn mbox_bytes(mut m: QpMbox, ctx_off: usize, b: &[u8]) -> QpMbox {
    m.0[8 + ctx_off..8 + ctx_off + b.len()].copy_from_slice(b);
    m
}

/// INIT2RTR and RTR2RTS of a RoCE RC/UC QP to `dqpn` over `path`.
pub fn roce_connect(h: &mut Hca, q: &Qp, s: QpSpec, dqpn: u32, path: RocePath) -> R {
    let p = 0x18;
    let sched = (s.port - 1) << 6 | 0x83 | (path.sl & 7) << 3;
    let mut rtr = QpMbox::new(2, s.st)
        .u8(0x08, s.mtu << 5 | 31)
        .u32(0x14, dqpn)
        .u8(p + 3, s.pkey_index)
        .u8(p + 5, if path.grh { 0x80 } else { 0 })
        .u8(p + 8, s.ack_timeout << 3 | 1)
        .u8(p + 9, path.sgid_index)
        .u8(p + 0x0b, 64)
        .u8(p + 0x20, sched)
        .u32(0x90, s.access)
        .u32(0x94, u32::from(s.min_rnr_timer) << 24 | 0x100)
        .optpar(1 << 16);
    if let Some(vi) = path.vlan_index {
        rtr = rtr.u8(p, 0x40).u8(p + 0x21, vi);
    }
    rtr = mbox_bytes(rtr, p + 0x10, &path.dgid);
    rtr = mbox_bytes(rtr, p + 0x26, &path.dmac);
    h.r.cmd_in(&rtr.0, q.qpn, 0, Opcode::INIT2RTR_QP)?;
    let rts = QpMbox::new(3, s.st)
        .u32(
            0x70,
            u32::from(s.retry_cnt) << 16 | u32::from(s.rnr_retry) << 13,
        )
        .u8(p + 8, s.ack_timeout << 3 | 1)
        .u32(0x78, 0x100);
    h.r.cmd_in(&rts.0, q.qpn, 0, Opcode::RTR2RTS_QP)
}

/// The 48-byte datagram segment of a RoCE UD send (Linux `mlx4_eth_av` +
/// `set_datagram_seg`): port, source MAC index 0, source GID index,
/// SL << 29, DGID, QPN, Q_Key, tag (0xffff: none), destination MAC.
pub fn roce_av(port: u8, dgid: [u8; 16], dmac: [u8; 6], dqpn: u32, qkey: u32) -> Vec<u8> {
    let mut d = vec![0u8; 48];
    d[0..4].copy_from_slice(&(u32::from(port) << 24 | PD).to_be_bytes());
    d[9] = 0;
    d[0x0b] = 64;
    d[0x10..0x20].copy_from_slice(&dgid);
    d[0x20..0x24].copy_from_slice(&dqpn.to_be_bytes());
    d[0x24..0x28].copy_from_slice(&qkey.to_be_bytes());
    d[0x28..0x2a].copy_from_slice(&0xffffu16.to_be_bytes());
    d[0x2a..0x30].copy_from_slice(&dmac);
    d
}

/// A UD SEND of `sge` with datagram segment `av`.
pub fn ud_wr(av: Vec<u8>, sge: Sge) -> Wr {
    Wr {
        opcode: op::SEND,
        signalled: true,
        raw: Some(av),
        sges: vec![sge],
        ..Wr::default()
    }
}

/// Waits (fake time) for a CQE on `cq` for `send` or fails.
pub fn one(h: &Hca, cq: &mut Cq, send: bool) -> Cqe {
    for _ in 0..200 {
        let v = cq.drain();
        cq.stash.extend(v);
        if let Some(i) = cq.stash.iter().position(|c| c.send == send) {
            return cq.stash.remove(i);
        }
        settle(h);
    }
    panic!(
        "no {} CQE: {:?}",
        if send { "send" } else { "receive" },
        cq.stash
    )
}

/// A raw Ethernet RSS QP of `port` (no queues): QPC flags bit 13, the RSS
/// context at path + 0x24 (2^`log_n` rings from `base`, default `base`,
/// Toeplitz, hash `flags`, `key`), through RTR.
#[allow(clippy::too_many_arguments)]
pub fn rss_qp(
    h: &mut Hca,
    qpn: u32,
    port: u8,
    cq: u32,
    base: u32,
    log_n: u8,
    flags: u8,
    key: &[u8; 40],
) {
    let p = 0x18;
    let o = 8 + p + 0x24;
    let rss = |m: &mut QpMbox| {
        m.0[o..o + 4].copy_from_slice(&(u32::from(log_n) << 24 | base).to_be_bytes());
        m.0[o + 4..o + 8].copy_from_slice(&base.to_be_bytes());
        m.0[o + 0x0a] = 1;
        m.0[o + 0x0b] = flags;
        m.0[o + 0x0c..o + 0x34].copy_from_slice(key);
    };
    let sched = (port - 1) << 6 | 0x83;
    let mut m = QpMbox::new(1, MLX)
        .u32(0x04, PD)
        .u8(0x08, 0xff)
        .u8(0x0a, 2)
        .u32(0x0c, UAR)
        .u32(0x10, qpn)
        .u8(p + 0x20, sched)
        .u32(0x7c, cq)
        .u32(0x9c, cq);
    m.0[8..12].copy_from_slice(&(1u32 << 28 | 7 << 16 | 1 << 13 | 3 << 11).to_be_bytes());
    rss(&mut m);
    h.r.cmd_in(&m.0, qpn, 0, Opcode::RST2INIT_QP).unwrap();
    let mut rtr = QpMbox::new(2, MLX).u8(0x08, 0xff).u8(p + 0x20, sched);
    rss(&mut rtr);
    h.r.cmd_in(&rtr.0, qpn, 0, Opcode::INIT2RTR_QP).unwrap();
}
