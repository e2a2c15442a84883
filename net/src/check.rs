//! The receive-side checks the stack makes before smoltcp sees a packet: the part of Linux's `ip_rcv_core` and the transport checksum checks that decide whether a packet is dropped, so that every drop is counted.
//!
//! smoltcp drops a malformed packet without telling anyone; running the same
//! checks first lets the stack count each one against the link (the
//! `dropped` column of `ip -s link`) and hand smoltcp only packets that
//! pass, with its own receive checksum checks turned off (they would run a
//! second time). IPv4 fragments are dropped here too: the stack does not
//! reassemble. An Ethernet link's ARP packets are read on the way for
//! `ip neigh`.

use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    Icmpv4Packet, IpAddress, IpProtocol, Ipv4Address, Ipv4Packet, TcpPacket, UdpPacket,
};

use crate::link::LinkKind;

/// Why a received packet is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drop {
    /// Too short, a bad header field, a bad checksum.
    Malformed,
    /// Well formed, but nothing here takes it: IPv6, another EtherType,
    /// an ARP other than Ethernet/IPv4, an IPv4 fragment.
    Unsupported,
}

/// What an accepted frame carries that the stack wants to know about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// An IPv4 packet.
    Ipv4,
    /// An ARP request or reply: the sender's addresses (for `ip neigh`).
    Arp {
        /// The sender's IP address.
        ip: Ipv4Address,
        /// The sender's Ethernet address.
        mac: EthernetAddress,
        /// The address asked for (request) or answered to (reply).
        target: Ipv4Address,
        /// Whether it is a reply.
        reply: bool,
    },
}

/// Checks what a link of kind `kind` received.
pub fn received(kind: LinkKind, buf: &[u8]) -> Result<Accepted, Drop> {
    match kind {
        LinkKind::Ether => ethernet(buf),
        _ => match buf.first().map(|b| b >> 4) {
            Some(4) => ipv4(buf).map(|()| Accepted::Ipv4),
            Some(6) => Err(Drop::Unsupported),
            _ => Err(Drop::Malformed),
        },
    }
}

fn ethernet(buf: &[u8]) -> Result<Accepted, Drop> {
    let frame = EthernetFrame::new_checked(buf).map_err(|_| Drop::Malformed)?;
    match frame.ethertype() {
        EthernetProtocol::Ipv4 => ipv4(frame.payload()).map(|()| Accepted::Ipv4),
        EthernetProtocol::Arp => {
            let p = ArpPacket::new_checked(frame.payload()).map_err(|_| Drop::Malformed)?;
            match ArpRepr::parse(&p) {
                Ok(ArpRepr::EthernetIpv4 {
                    operation,
                    source_hardware_addr,
                    source_protocol_addr,
                    target_protocol_addr,
                    ..
                }) => Ok(Accepted::Arp {
                    ip: source_protocol_addr,
                    mac: source_hardware_addr,
                    target: target_protocol_addr,
                    reply: operation == ArpOperation::Reply,
                }),
                Ok(_) | Err(_) => Err(Drop::Unsupported),
            }
        }
        _ => Err(Drop::Unsupported),
    }
}

/// An IPv4 packet: header (version, lengths, checksum), no fragment, and
/// the ICMP, UDP or TCP header and checksum. Other protocols pass (smoltcp
/// answers them with a protocol unreachable).
pub fn ipv4(buf: &[u8]) -> Result<(), Drop> {
    let p = Ipv4Packet::new_checked(buf).map_err(|_| Drop::Malformed)?;
    if p.version() != 4 || !p.verify_checksum() {
        return Err(Drop::Malformed);
    }
    if p.more_frags() || p.frag_offset() != 0 {
        return Err(Drop::Unsupported);
    }
    let (src, dst) = (IpAddress::Ipv4(p.src_addr()), IpAddress::Ipv4(p.dst_addr()));
    let payload = p.payload();
    let ok = match p.next_header() {
        IpProtocol::Icmp => {
            Icmpv4Packet::new_checked(payload).is_ok_and(|icmp| icmp.verify_checksum())
        }
        IpProtocol::Udp => {
            UdpPacket::new_checked(payload).is_ok_and(|udp| udp.verify_checksum(&src, &dst))
        }
        IpProtocol::Tcp => {
            TcpPacket::new_checked(payload).is_ok_and(|tcp| tcp.verify_checksum(&src, &dst))
        }
        _ => true,
    };
    if ok { Ok(()) } else { Err(Drop::Malformed) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A well-formed ICMP echo request, 10.0.0.2 -> 10.0.0.1.
    fn echo_request() -> Vec<u8> {
        use smoltcp::phy::ChecksumCapabilities;
        use smoltcp::wire::{Icmpv4Repr, Ipv4Repr};
        let icmp = Icmpv4Repr::EchoRequest {
            ident: 1,
            seq_no: 1,
            data: b"abcdefgh",
        };
        let ip = Ipv4Repr {
            src_addr: Ipv4Address::new(10, 0, 0, 2),
            dst_addr: Ipv4Address::new(10, 0, 0, 1),
            next_header: IpProtocol::Icmp,
            payload_len: icmp.buffer_len(),
            hop_limit: 64,
        };
        let mut buf = vec![0u8; ip.buffer_len() + icmp.buffer_len()];
        let caps = ChecksumCapabilities::default();
        let mut p = Ipv4Packet::new_unchecked(&mut buf[..]);
        ip.emit(&mut p, &caps);
        icmp.emit(&mut Icmpv4Packet::new_unchecked(p.payload_mut()), &caps);
        buf
    }

    #[test]
    fn a_good_packet_passes_and_every_damage_is_a_drop() {
        let good = echo_request();
        assert_eq!(received(LinkKind::Infiniband, &good), Ok(Accepted::Ipv4));
        // Truncated anywhere: malformed.
        for n in 0..good.len() {
            assert_eq!(
                received(LinkKind::Infiniband, &good[..n]),
                Err(Drop::Malformed),
                "{n}"
            );
        }
        // One flipped bit anywhere: never accepted as it was... except in
        // the padding-free packet every bit is covered by a checksum, a
        // length or the version.
        for i in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(received(LinkKind::Infiniband, &bad).is_err(), "bit {i}");
        }
    }

    #[test]
    fn fragments_and_ipv6_are_unsupported_not_malformed() {
        let mut frag = echo_request();
        frag[6] |= 0x20; // more fragments
        let mut p = Ipv4Packet::new_unchecked(&mut frag[..]);
        p.fill_checksum();
        assert_eq!(
            received(LinkKind::Infiniband, &frag),
            Err(Drop::Unsupported)
        );
        let mut v6 = echo_request();
        v6[0] = 0x60;
        assert_eq!(received(LinkKind::None, &v6), Err(Drop::Unsupported));
        assert_eq!(received(LinkKind::Ether, &[0; 13]), Err(Drop::Malformed));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut buf = [0u8; 128];
        for round in 0..20_000 {
            for b in buf.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            // Sometimes a plausible IPv4 start, so the deeper checks run.
            if round % 2 == 0 {
                buf[0] = 0x45;
            }
            let n = (x as usize) % buf.len();
            for kind in [LinkKind::Ether, LinkKind::Infiniband] {
                let _ = received(kind, &buf[..n]);
            }
        }
    }
}
