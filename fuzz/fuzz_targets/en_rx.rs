//! Ethernet frames into mlx4_en's receive path: frames the input builds (to our MAC, broadcast, multicast or another, untagged, in VLAN 5 which has a VLAN device, priority-tagged or in another VLAN; ARP, IPv4 with ICMP/UDP/TCP, RoCE or any Ethertype; the payload as given) or raw bytes, sent from the switch's other node to a model card whose port 1 is driven by the real mlx4_core and mlx4_en, with `eth0` and its VLAN device `eth0.5` in an IP stack.
//!
//! The card steers, strips tags and writes CQEs as it does; mlx4_en reads
//! them, hands each frame to the device of its VLAN (keeping other
//! devices' frames in their backlogs), and smoltcp parses what it gets
//! (answering ARP and echo requests, which go out through the send ring).
//! Checks: nothing panics or loops; the model records no violation of
//! the driver (a driver bug, whatever the frames); after the input, a
//! well-formed ARP request for our address still gets its answer, and
//! frames for a VLAN device are only ever counted on it.

#![no_main]

use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use mlx4_core::{Dev, Profile};
use mlx4_en::{EnConfig, EnLink, EnPriv};
use net::{Ipv4Cidr, LinkId, Stack};
use sim::fabric::{Fabric, LinkLayer, Packet, PortId, Topology, packet};
use sim::{PortType, SimHca, Wire};

/// eth0's address, eth0.5's address.
const OUR_IP: [u8; 4] = [10, 0, 0, 1];
const OUR_VLAN_IP: [u8; 4] = [10, 5, 0, 1];
/// The other node's MAC as the frames claim it.
const PEER_MAC: [u8; 6] = [0x00, 0x02, 0xc9, 0x77, 0x00, 0x02];

#[derive(Arbitrary, Debug)]
enum Dst {
    Ours,
    Broadcast,
    Multicast([u8; 3]),
    Other([u8; 6]),
}

#[derive(Arbitrary, Debug)]
enum Tag {
    None,
    /// VLAN 5 (eth0.5), with this PCP.
    Vlan5(u8),
    /// VID 0: priority only.
    Priority(u8),
    /// Any TCI.
    Tci(u16),
}

#[derive(Arbitrary, Debug)]
enum Kind {
    Arp {
        op: u16,
        sha: [u8; 6],
        spa: [u8; 4],
        /// Ask for one of our addresses (eth0's or eth0.5's by the tag).
        for_us: bool,
        tpa: [u8; 4],
        /// Hardware/protocol types and lengths as given, else Ethernet/IPv4.
        odd_types: Option<(u16, u16, u8, u8)>,
    },
    Ipv4 {
        proto: u8,
        to_us: bool,
        dst: [u8; 4],
        ttl: u8,
        bad_checksum: bool,
        /// Total length as given, else the real one.
        total_len: Option<u16>,
        frag: u16,
    },
    /// Ethertype 0x8915 (RoCE v1): a GRH and what follows, as given.
    Roce,
    Other(u16),
}

#[derive(Arbitrary, Debug)]
enum Frame {
    /// Padded to the minimum and given its FCS (a wrong one if
    /// `bad_fcs`).
    Built {
        dst: Dst,
        tag: Tag,
        kind: Kind,
        payload: Vec<u8>,
        bad_fcs: bool,
    },
    /// Bytes as they come, FCS included (computed over them if `reseal`).
    Raw { bytes: Vec<u8>, reseal: bool },
}

struct Ctx {
    dev: Dev,
}

fn get_dev(c: &mut Ctx, _handle: u32) -> Option<&mut Dev> {
    Some(&mut c.dev)
}

struct Rig {
    a: SimHca,
    _b: SimHca,
    /// B's mlx4_core, which only opened its port (the frames come from
    /// the fuzzer, sent from B's cable).
    _b_dev: Dev,
    wire: Wire,
    fabric: Arc<Mutex<Fabric>>,
    bport: PortId,
    ctx: Ctx,
    stack: Stack<Ctx>,
    eth0: LinkId,
    vlan: LinkId,
    mac: [u8; 6],
}

fn make() -> Rig {
    let mut f = Fabric::new();
    let built = Topology::for_nodes_with(2, [LinkLayer::Eth, LinkLayer::Eth])
        .expect("two nodes")
        .build(&mut f)
        .expect("the fabric");
    let fabric = Arc::new(Mutex::new(f));
    let wire = Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    let mut hcas = built.hcas.iter().take(2).map(|h| {
        let cfg = sim::SimConfig {
            port_types: [PortType::Eth, PortType::Eth],
            ..legoib_fuzz::sim_cfg(h.node_guid, 16 << 20)
        };
        SimHca::new_on_ports(cfg, &wire, [Some(h.ports[0]), Some(h.ports[1])])
    });
    let a = hcas.next().expect("A");
    let b = hcas.next().expect("B");
    drop(hcas);
    let bport = built.hcas[1].ports[0];
    let mut b_dev = mlx4_core::probe(
        b.pci_function(),
        b.dma_pool(),
        b.clock(),
        Profile::default(),
    )
    .expect("mlx4_core on the model (B)");
    b_dev.init_port(1).expect("B's INIT_PORT");
    let mut dev = mlx4_core::probe(
        a.pci_function(),
        a.dma_pool(),
        a.clock(),
        Profile::default(),
    )
    .expect("mlx4_core on the model");
    let en = EnPriv::open(&mut dev, 1, "eth0", 0, EnConfig::default()).expect("mlx4_en");
    let mac = mlx4_en::mac_bytes(en.mac);
    let mut ctx = Ctx { dev };
    let mut stack = Stack::new(a.clock().now_ns() / 1000);
    let eth0 = stack
        .add_link("eth0", Box::new(EnLink::<Ctx>::new(en, get_dev)))
        .expect("eth0");
    stack
        .add_addr(eth0, Ipv4Cidr::new(OUR_IP.into(), 24))
        .expect("eth0's address");
    let vlan = stack.add_vlan(eth0, "eth0.5", 5, &mut ctx).expect("eth0.5");
    stack
        .add_addr(vlan, Ipv4Cidr::new(OUR_VLAN_IP.into(), 24))
        .expect("eth0.5's address");
    let mut r = Rig {
        a,
        _b: b,
        _b_dev: b_dev,
        wire,
        fabric,
        bport,
        ctx,
        stack,
        eth0,
        vlan,
        mac,
    };
    // The port comes up.
    for _ in 0..2000 {
        step(&mut r);
        if r.stack.carrier(r.eth0) && r.stack.carrier(r.vlan) {
            break;
        }
    }
    assert!(r.stack.carrier(r.eth0), "eth0 has no carrier");
    r
}

/// 100 us of the fabric's time, the cards' work, a pass of the stack.
fn step(r: &mut Rig) {
    if let Some(c) = r.wire.fake_clock() {
        c.advance(std::time::Duration::from_micros(100));
    }
    r.wire.settle();
    let now = r.a.clock().now_ns() / 1000;
    r.stack.poll(now, &mut r.ctx);
    r.wire.settle();
}

fn frame_bytes(r: &Rig, f: &Frame) -> Vec<u8> {
    let (dst, tag, kind, payload, bad_fcs) = match f {
        Frame::Raw { bytes, reseal } => {
            let mut b = bytes[..bytes.len().min(2100)].to_vec();
            if *reseal {
                let _ = packet::reseal_fcs(&mut b);
            }
            return b;
        }
        Frame::Built {
            dst,
            tag,
            kind,
            payload,
            bad_fcs,
        } => (
            dst,
            tag,
            kind,
            &payload[..payload.len().min(1600)],
            *bad_fcs,
        ),
    };
    let mut b = Vec::with_capacity(64 + payload.len());
    b.extend_from_slice(&match dst {
        Dst::Ours => r.mac,
        Dst::Broadcast => [0xff; 6],
        Dst::Multicast(x) => [0x01, 0x00, 0x5e, x[0] & 0x7f, x[1], x[2]],
        Dst::Other(m) => *m,
    });
    b.extend_from_slice(&PEER_MAC);
    let in_vlan5 = matches!(tag, Tag::Vlan5(_));
    let tci = match tag {
        Tag::None => None,
        Tag::Vlan5(p) => Some(u16::from(p & 7) << 13 | 5),
        Tag::Priority(p) => Some(u16::from(p & 7) << 13),
        Tag::Tci(t) => Some(*t),
    };
    if let Some(t) = tci {
        b.extend_from_slice(&0x8100u16.to_be_bytes());
        b.extend_from_slice(&t.to_be_bytes());
    }
    let ours = if in_vlan5 { OUR_VLAN_IP } else { OUR_IP };
    match kind {
        Kind::Arp {
            op,
            sha,
            spa,
            for_us,
            tpa,
            odd_types,
        } => {
            b.extend_from_slice(&0x0806u16.to_be_bytes());
            let (htype, ptype, hlen, plen) = odd_types.unwrap_or((1, 0x0800, 6, 4));
            b.extend_from_slice(&htype.to_be_bytes());
            b.extend_from_slice(&ptype.to_be_bytes());
            b.extend_from_slice(&[hlen, plen]);
            b.extend_from_slice(&op.to_be_bytes());
            b.extend_from_slice(sha);
            b.extend_from_slice(spa);
            b.extend_from_slice(&[0; 6]);
            b.extend_from_slice(if *for_us { &ours } else { tpa });
            b.extend_from_slice(payload);
        }
        Kind::Ipv4 {
            proto,
            to_us,
            dst,
            ttl,
            bad_checksum,
            total_len,
            frag,
        } => {
            b.extend_from_slice(&0x0800u16.to_be_bytes());
            let len = total_len.unwrap_or((20 + payload.len()).min(0xffff) as u16);
            let mut h = [0u8; 20];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&len.to_be_bytes());
            h[6..8].copy_from_slice(&frag.to_be_bytes());
            h[8] = *ttl;
            h[9] = *proto;
            h[12..16].copy_from_slice(&[10, 0, 0, 2]);
            h[16..20].copy_from_slice(if *to_us { &ours } else { dst });
            let mut sum: u32 = h
                .chunks(2)
                .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
                .sum();
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            let c = !(sum as u16) ^ u16::from(*bad_checksum);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            b.extend_from_slice(&h);
            b.extend_from_slice(payload);
        }
        Kind::Roce => {
            b.extend_from_slice(&0x8915u16.to_be_bytes());
            b.extend_from_slice(payload);
        }
        Kind::Other(t) => {
            b.extend_from_slice(&t.to_be_bytes());
            b.extend_from_slice(payload);
        }
    }
    seal(b, bad_fcs)
}

/// `frame` padded to 60 bytes and followed by its FCS (inverted if `bad`).
fn seal(mut b: Vec<u8>, bad: bool) -> Vec<u8> {
    b.resize(b.len().max(60), 0);
    b.extend_from_slice(&[0; 4]);
    let _ = packet::reseal_fcs(&mut b);
    if bad {
        let n = b.len();
        b[n - 1] ^= 0xff;
    }
    b
}

/// A well-formed ARP request for `ip` from the peer, in VLAN 5 if `vlan`.
fn arp_request(vlan: bool, ip: [u8; 4]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&[0xff; 6]);
    b.extend_from_slice(&PEER_MAC);
    if vlan {
        b.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
    }
    b.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    b.extend_from_slice(&PEER_MAC);
    // From the peer's address on the same network (smoltcp answers no
    // other).
    b.extend_from_slice(&[ip[0], ip[1], ip[2], 2]);
    b.extend_from_slice(&[0; 6]);
    b.extend_from_slice(&ip);
    seal(b, false)
}

fn send(r: &mut Rig, bytes: Vec<u8>) {
    let now = r.a.clock().now_ns();
    if let Ok(mut f) = r.fabric.lock() {
        f.transmit(r.bport, Packet { bytes }, now);
    }
}

thread_local! {
    static RIG: std::cell::RefCell<(Option<Rig>, u32)> = const { std::cell::RefCell::new((None, 0)) };
}

fuzz_target!(|frames: Vec<Frame>| {
    legoib_fuzz::persistent(&RIG, 500, make, |r| run(r, &frames));
});

fn run(r: &mut Rig, frames: &[Frame]) -> bool {
    let vlan_before = r.stack.stats(r.vlan).unwrap_or_default();
    let tagged5 = frames
        .iter()
        .filter(|f| {
            matches!(
                f,
                Frame::Built {
                    tag: Tag::Vlan5(_),
                    ..
                }
            )
        })
        .count() as u64;
    for f in frames.iter().take(32) {
        let mut bytes = frame_bytes(r, f);
        if bytes.is_empty() {
            bytes.push(0);
        }
        send(r, bytes);
        step(r);
    }
    for _ in 0..4 {
        step(r);
    }
    let v = r.a.take_violations();
    assert!(v.is_empty(), "the driver made the model record: {v:?}");
    // Frames counted on eth0.5 came from this input's VLAN 5 frames (or
    // its raw bytes, which may carry any tag).
    let vlan_after = r.stack.stats(r.vlan).unwrap_or_default();
    let raw = frames.iter().any(|f| {
        matches!(
            f,
            Frame::Raw { .. }
                | Frame::Built {
                    tag: Tag::Tci(_),
                    ..
                }
        )
    });
    if !raw {
        assert!(
            vlan_after.rx_packets - vlan_before.rx_packets <= tagged5,
            "eth0.5 took frames not in VLAN 5"
        );
    }
    // Both links still answer ARP: the neighbour tables see the peer and
    // the answers leave (the send ring is not stuck).
    let tx_before = r.stack.stats(r.eth0).unwrap_or_default().tx_packets;
    let vtx_before = vlan_after.tx_packets;
    send(r, arp_request(false, OUR_IP));
    send(r, arp_request(true, OUR_VLAN_IP));
    let mut answered = false;
    for _ in 0..50 {
        step(r);
        let tx = r.stack.stats(r.eth0).unwrap_or_default().tx_packets;
        let vtx = r.stack.stats(r.vlan).unwrap_or_default().tx_packets;
        if tx > tx_before && vtx > vtx_before {
            answered = true;
            break;
        }
    }
    assert!(
        answered,
        "eth0 or eth0.5 no longer answers ARP: eth0 {:?}, eth0.5 {:?}",
        r.stack.stats(r.eth0),
        r.stack.stats(r.vlan)
    );
    true
}
