//! IPoIB's receive side for what is not IPv4: the 4-byte IPoIB header (`parse_frame`), ARP over IPoIB (hardware type 32, 20-byte addresses: `ArpPacket::parse`), and `arp::process`, the decisions of Linux's `arp_process` the driver applies to its neighbour table, interleaved with the table's other inputs: packets waiting for an address (`output`), confirmations from received traffic, and the timers (retries, STALE, failure).
//!
//! The frames are the payloads of UD receives (after the GRH): built from
//! fields (a request or reply from any sender to our address or another,
//! any operation, odd types) or raw bytes. Checks: an ARP packet written
//! back by `emit` parses to itself; the table never holds more than its
//! size, never an entry for an address that cannot be a neighbour's or
//! for one of ours, and never learns from a packet `process` refused; an
//! answer is only for a request to one of our addresses.

#![no_main]

use arbitrary::Arbitrary;
use ipoib::arp::{self, ArpPacket, NeighTable, Verdict};
use ipoib::{Config, Frame, IpoibAddr};
use libfuzzer_sys::fuzz_target;
use net::Ipv4Address;

const OURS: [Ipv4Address; 2] = [Ipv4Address::new(10, 0, 0, 1), Ipv4Address::new(10, 0, 1, 1)];
/// Our hardware address: flags 0, QPN 0x48, a port GID.
const HW: [u8; 20] = [
    0, 0, 0, 0x48, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 0, 0, 0x11,
];
const TABLE: usize = 8;

#[derive(Arbitrary, Debug)]
enum Step {
    /// A built ARP packet behind an IPoIB header.
    Arp {
        op: u16,
        sha: [u8; 20],
        sip: [u8; 4],
        to_us: bool,
        tip: [u8; 4],
        odd: Option<(u16, u16, u8, u8)>,
        trailing: Vec<u8>,
    },
    /// A UD payload as it comes (IPoIB header and all).
    Raw(Vec<u8>),
    /// A packet to send to this address (`output`).
    Output([u8; 4]),
    /// Traffic from the entry's QP confirms it.
    Confirm([u8; 4], u32),
    /// Time passes (microseconds), the timers run.
    Time(u32),
}

fn build(
    op: u16,
    sha: &[u8; 20],
    sip: [u8; 4],
    tip: [u8; 4],
    odd: Option<(u16, u16, u8, u8)>,
    trailing: &[u8],
) -> Vec<u8> {
    let (hrd, pro, hln, pln) = odd.unwrap_or((arp::ARPHRD_INFINIBAND, 0x0800, 20, 4));
    let mut b = Vec::with_capacity(4 + arp::ARP_LEN + trailing.len());
    b.extend_from_slice(&[0x08, 0x06, 0, 0]);
    b.extend_from_slice(&hrd.to_be_bytes());
    b.extend_from_slice(&pro.to_be_bytes());
    b.extend_from_slice(&[hln, pln]);
    b.extend_from_slice(&op.to_be_bytes());
    b.extend_from_slice(sha);
    b.extend_from_slice(&sip);
    b.extend_from_slice(&[0; 20]);
    b.extend_from_slice(&tip);
    b.extend_from_slice(&trailing[..trailing.len().min(64)]);
    b
}

fuzz_target!(|steps: Vec<Step>| {
    let cfg = Config::default();
    let hw = IpoibAddr(HW);
    let ours = |a: &Ipv4Address| OURS.contains(a);
    let never = |_: &Ipv4Address| false;
    let mut neighs = NeighTable::new(TABLE);
    let mut now: u64 = 1_000_000;
    for s in steps.iter().take(64) {
        let frame = match s {
            Step::Arp {
                op,
                sha,
                sip,
                to_us,
                tip,
                odd,
                trailing,
            } => {
                let tip = if *to_us {
                    OURS[usize::from(tip[0] & 1)].octets()
                } else {
                    *tip
                };
                build(*op, sha, *sip, tip, *odd, trailing)
            }
            Step::Raw(b) => b[..b.len().min(256)].to_vec(),
            // The stack hands IPoIB unicast next hops that are not ours.
            Step::Output(ip) => {
                let ip = Ipv4Address::from(*ip);
                if arp::is_unicast_ip(&ip) && !ours(&ip) {
                    let _ = neighs.output(ip, now, &cfg, &never);
                }
                continue;
            }
            Step::Confirm(ip, qpn) => {
                neighs.confirm(&Ipv4Address::from(*ip), *qpn, now);
                continue;
            }
            Step::Time(us) => {
                now += u64::from(*us);
                neighs.timers(now, &cfg, &never, &mut |a| {
                    if let arp::Action::Request { ip, .. } = a {
                        assert!(arp::is_unicast_ip(&ip), "ARP asks about {ip}");
                    }
                });
                continue;
            }
        };
        let Ok(Frame::Arp(b)) = ipoib::parse_frame(&frame) else {
            continue;
        };
        let Ok(p) = ArpPacket::parse(b) else {
            continue;
        };
        let mut out = [0u8; arp::ARP_LEN];
        assert_eq!(p.emit(&mut out), arp::ARP_LEN);
        assert_eq!(ArpPacket::parse(&out), Ok(p), "emit then parse");
        let before: Vec<_> = neighs.iter().copied().collect();
        let v = arp::process(&mut neighs, &p, &hw, &ours, now, &never);
        match v {
            Verdict::Bad | Verdict::Probe | Verdict::Own | Verdict::Unsolicited => {
                let after: Vec<_> = neighs.iter().copied().collect();
                assert_eq!(before, after, "{v:?} changed the table");
            }
            Verdict::Answer => {
                assert!(p.op == arp::ARPOP_REQUEST && ours(&p.tip), "answered {p:?}");
            }
            Verdict::Seen | Verdict::Reply => {}
        }
        assert!(neighs.len() <= TABLE);
        for n in neighs.iter() {
            assert!(
                arp::is_unicast_ip(&n.ip) && !ours(&n.ip),
                "an entry for {}",
                n.ip
            );
            if let Some(a) = n.addr {
                assert!(a.is_valid_unicast(), "{} at {:?}", n.ip, a);
            }
        }
    }
});
