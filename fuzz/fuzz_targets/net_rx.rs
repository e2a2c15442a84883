//! The `net` crate's receive path: packets of any bytes arriving on a link (IP over an IPoIB-kind link, or Ethernet frames), through the stack's receive checks into smoltcp, with a TCP listener, the echo services, neighbours and routes in place, the clock moving on between packets.
//!
//! Packets come in over the in-memory wire the crate's own tests use: the
//! fuzzer is the peer, and reads what the stack sends back (a TCP segment
//! may follow the stack's sequence numbers). Structure: an IPv4 header the
//! input's fields fill (checksum right unless asked otherwise) in front of
//! a payload, or raw bytes. Checks: nothing panics or loops; the counters
//! stay readable.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use net::wire;
use net::{Link, LinkKind, Stack};

#[derive(Arbitrary, Debug)]
enum Pkt {
    Ipv4 {
        tos: u8,
        /// Total length as given (else the real one).
        total_len: Option<u16>,
        id: u16,
        frag: u16,
        ttl: u8,
        proto: Proto,
        bad_checksum: bool,
        src: [u8; 4],
        /// To us (10.0.0.1), broadcast, or as given.
        dst: Dst,
        options: Vec<u8>,
        payload: Payload,
    },
    /// An ARP packet (Ethernet only).
    Arp {
        op: u16,
        sha: [u8; 6],
        spa: [u8; 4],
        tpa: [u8; 4],
    },
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Proto {
    Icmp,
    Tcp,
    Udp,
    Other(u8),
}

#[derive(Arbitrary, Debug)]
enum Dst {
    Us,
    Broadcast,
    Other([u8; 4]),
}

#[derive(Arbitrary, Debug)]
enum Payload {
    /// An ICMP echo request or other type.
    Icmp {
        ty: u8,
        code: u8,
        rest: Vec<u8>,
    },
    /// A TCP segment to port 7 or the listener (ports, seq, ack and
    /// window as given; flags a peer sends, or any with the data offset).
    /// With `follow`, seq and ack follow the last segment the stack sent
    /// (seq = what it acknowledged + the first, ack = its seq + the
    /// second), as a peer's TCP would: a handshake and the data path are
    /// then within a few mutations instead of a guess of the stack's
    /// 32-bit ISN.
    Tcp {
        sport: u16,
        to_listener: bool,
        seq: u32,
        ack: u32,
        follow: Option<(u8, u16)>,
        flags: Flags,
        win: u16,
        opts_data: Vec<u8>,
    },
    Udp {
        sport: u16,
        dport7: bool,
        len: Option<u16>,
        data: Vec<u8>,
    },
    Raw(Vec<u8>),
}

/// A TCP segment's data offset and flags: the ones a peer's TCP sends
/// (a 20-byte header), or any. Replaying the corpus of 2 x 10^7
/// executions with the raw 16 bits only never reached the echo service
/// reading data, nor smoltcp's out-of-order reassembly: every segment
/// after the SYN needs the data offset and the ACK flag right.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Flags {
    Syn,
    Ack,
    PshAck,
    FinAck,
    Rst,
    Raw(u16),
}

impl Flags {
    /// The header's 16 bits of data offset and flags (RFC 793 bit order).
    fn off_flags(self) -> u16 {
        const OFF5: u16 = 5 << 12;
        const FIN: u16 = 1 << 0;
        const SYN: u16 = 1 << 1;
        const RST: u16 = 1 << 2;
        const PSH: u16 = 1 << 3;
        const ACK: u16 = 1 << 4;
        match self {
            Flags::Syn => OFF5 | SYN,
            Flags::Ack => OFF5 | ACK,
            Flags::PshAck => OFF5 | PSH | ACK,
            Flags::FinAck => OFF5 | FIN | ACK,
            Flags::Rst => OFF5 | RST,
            Flags::Raw(v) => v,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    ether: bool,
    pkts: Vec<(Pkt, u16)>,
}

fn csum(b: &[u8]) -> u16 {
    let mut s = 0u32;
    for c in b.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

const US: [u8; 4] = [10, 0, 0, 1];
const PEER: [u8; 4] = [10, 0, 0, 2];

/// The stack's last TCP segment as the peer heard it: its sequence
/// number and its acknowledgement.
#[derive(Clone, Copy, Default)]
struct Heard {
    seq: u32,
    ack: u32,
}

/// Reads what the stack sent to the peer's end, keeping the last TCP
/// segment's numbers (smoltcp's own parsers read the frames).
fn hear(b: &mut wire::WireEnd, ether: bool, last: &mut Heard) {
    use net::smoltcp::wire::{EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket};
    let mut buf = [0u8; 2100];
    while let Some(n) = Link::<()>::receive(b, &mut (), &mut buf) {
        let ip = if ether {
            match EthernetFrame::new_checked(&buf[..n]) {
                Ok(f) if f.ethertype() == EthernetProtocol::Ipv4 => f.payload(),
                _ => continue,
            }
        } else {
            &buf[..n]
        };
        let Ok(ip) = Ipv4Packet::new_checked(ip) else {
            continue;
        };
        if ip.next_header() != IpProtocol::Tcp {
            continue;
        }
        if let Ok(t) = TcpPacket::new_checked(ip.payload()) {
            *last = Heard {
                seq: t.seq_number().0 as u32,
                ack: t.ack_number().0 as u32,
            };
        }
    }
}

fn ipv4(p: &Pkt, heard: Heard) -> Vec<u8> {
    let Pkt::Ipv4 {
        tos,
        total_len,
        id,
        frag,
        ttl,
        proto,
        bad_checksum,
        src,
        dst,
        options,
        payload,
    } = p
    else {
        return Vec::new();
    };
    let (_body_proto, mut body) = match payload {
        Payload::Icmp { ty, code, rest } => {
            let mut b = vec![*ty, *code, 0, 0];
            b.extend_from_slice(rest);
            let c = csum(&b);
            b[2..4].copy_from_slice(&c.to_be_bytes());
            (1u8, b)
        }
        Payload::Tcp {
            sport,
            to_listener,
            seq,
            ack,
            follow,
            flags,
            win,
            opts_data,
        } => {
            let (seq, ack) = match follow {
                Some((ds, da)) => (
                    heard.ack.wrapping_add(u32::from(*ds)),
                    heard.seq.wrapping_add(u32::from(*da)),
                ),
                None => (*seq, *ack),
            };
            let mut b = Vec::new();
            b.extend_from_slice(&sport.to_be_bytes());
            b.extend_from_slice(&(if *to_listener { 5000u16 } else { 7 }).to_be_bytes());
            b.extend_from_slice(&seq.to_be_bytes());
            b.extend_from_slice(&ack.to_be_bytes());
            b.extend_from_slice(&flags.off_flags().to_be_bytes());
            b.extend_from_slice(&win.to_be_bytes());
            b.extend_from_slice(&[0, 0, 0, 0]);
            b.extend_from_slice(opts_data);
            (6, b)
        }
        Payload::Udp {
            sport,
            dport7,
            len,
            data,
        } => {
            let mut b = Vec::new();
            b.extend_from_slice(&sport.to_be_bytes());
            b.extend_from_slice(&(if *dport7 { 7u16 } else { 9 }).to_be_bytes());
            let l = len.unwrap_or((8 + data.len()) as u16);
            b.extend_from_slice(&l.to_be_bytes());
            b.extend_from_slice(&[0, 0]);
            b.extend_from_slice(data);
            (17, b)
        }
        Payload::Raw(b) => (253, b.clone()),
    };
    let pnum: u8 = match proto {
        Proto::Icmp => 1,
        Proto::Tcp => 6,
        Proto::Udp => 17,
        Proto::Other(v) => *v,
    };
    let src = if src[0] == 0 { PEER } else { *src };
    let dst = match dst {
        Dst::Us => US,
        Dst::Broadcast => [255, 255, 255, 255],
        Dst::Other(d) => *d,
    };
    let opts = &options[..options.len().min(40) & !3];
    let ihl = 5 + opts.len() / 4;
    // TCP and UDP checksums over the pseudo-header.
    if pnum == 6 || pnum == 17 {
        let mut ph = Vec::new();
        ph.extend_from_slice(&src);
        ph.extend_from_slice(&dst);
        ph.extend_from_slice(&[0, pnum]);
        ph.extend_from_slice(&(body.len() as u16).to_be_bytes());
        ph.extend_from_slice(&body);
        let c = csum(&ph);
        let at = if pnum == 6 { 16 } else { 6 };
        if body.len() >= at + 2 {
            body[at..at + 2].copy_from_slice(&c.to_be_bytes());
        }
    }
    let mut h = vec![0u8; ihl * 4];
    h[0] = 0x40 | ihl as u8;
    h[1] = *tos;
    let tl = total_len.unwrap_or((ihl * 4 + body.len()) as u16);
    h[2..4].copy_from_slice(&tl.to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h[6..8].copy_from_slice(&frag.to_be_bytes());
    h[8] = *ttl;
    h[9] = pnum;
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    h[20..].copy_from_slice(opts);
    let c = csum(&h) ^ u16::from(*bad_checksum);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h.extend_from_slice(&body);
    h
}

fuzz_target!(|input: Input| {
    let kind = if input.ether {
        LinkKind::Ether
    } else {
        LinkKind::Infiniband
    };
    let mtu = if input.ether { 1500 } else { 2044 };
    let (a, mut b, w) = wire::pair(kind, mtu);
    let mut heard = Heard::default();
    let mut s = Stack::new(0);
    let ia = s.add_link("ib0", Box::new(a)).expect("link");
    s.add_addr(ia, net::config::parse_cidr("10.0.0.1/24").unwrap())
        .unwrap();
    let _ = s.add_route(
        net::config::parse_cidr("0.0.0.0/0").unwrap(),
        Some("10.0.0.2".parse().unwrap()),
        Some(ia),
        net::route::Proto::Static,
    );
    let _listener = s.tcp_listen(ia, 5000, 4096);
    let mut now = 0u64;
    s.poll(now, &mut ());
    for (p, dt) in input.pkts.iter().take(32) {
        let mut bytes = match p {
            Pkt::Raw(b) => b.clone(),
            Pkt::Arp { op, sha, spa, tpa } => {
                let mut b = vec![0, 1, 8, 0, 6, 4];
                b.extend_from_slice(&op.to_be_bytes());
                b.extend_from_slice(sha);
                b.extend_from_slice(spa);
                b.extend_from_slice(&[0; 6]);
                b.extend_from_slice(tpa);
                b
            }
            ip => ipv4(ip, heard),
        };
        if input.ether {
            // Ethernet header: to us (or broadcast for ARP), from the peer.
            let ty: u16 = if matches!(p, Pkt::Arp { .. }) {
                0x0806
            } else {
                0x0800
            };
            let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
            if matches!(p, Pkt::Arp { .. }) {
                f[..6].fill(0xff);
            }
            if !matches!(p, Pkt::Raw(_)) {
                f.extend_from_slice(&ty.to_be_bytes());
                f.append(&mut bytes);
                bytes = f;
            }
        }
        w.inject(0, &bytes);
        now += u64::from(*dt) * 10;
        s.poll(now, &mut ());
        hear(&mut b, input.ether, &mut heard);
    }
    for _ in 0..8 {
        now += 100_000;
        s.poll(now, &mut ());
    }
    let c = s.counters(ia);
    let _ = (c, s.stats(ia));
});
