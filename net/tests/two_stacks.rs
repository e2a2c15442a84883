//! Two stacks joined by an in-memory wire, on a clock the test moves: ping, UDP and TCP echo of 1 MiB, a lost peer, bad packets, and `ip`'s output, in both media.

use net::iproute::ip;
use net::ping::{self, Ping};
use net::wire::{self, Wire};
use net::{Ipv4Address, Ipv4Cidr, LinkKind, Stack};

/// Simulated microseconds per poll of both stacks.
const TICK_US: u64 = 100;
/// No scenario may take longer than this on the simulated clock.
const SIM_LIMIT_US: u64 = 120_000_000;

fn cidr(s: &str) -> Ipv4Cidr {
    net::config::parse_cidr(s).unwrap()
}

fn addr(s: &str) -> Ipv4Address {
    s.parse().unwrap()
}

struct Pair {
    a: Stack,
    b: Stack,
    wire: Wire,
    now: u64,
}

impl Pair {
    /// `ib0` on both sides (10.0.0.1 and 10.0.0.2 /24) over a wire of
    /// `kind`.
    fn new(kind: LinkKind) -> Pair {
        let mtu = if kind == LinkKind::Ether { 1500 } else { 2044 };
        let (ea, eb, wire) = wire::pair(kind, mtu);
        let mut a = Stack::new(0);
        let mut b = Stack::new(0);
        let ia = a.add_link("ib0", Box::new(ea)).unwrap();
        let ib = b.add_link("ib0", Box::new(eb)).unwrap();
        a.add_addr(ia, cidr("10.0.0.1/24")).unwrap();
        b.add_addr(ib, cidr("10.0.0.2/24")).unwrap();
        Pair { a, b, wire, now: 0 }
    }

    fn tick(&mut self) {
        self.now += TICK_US;
        assert!(
            self.now < SIM_LIMIT_US,
            "the scenario ran past its deadline"
        );
        self.a.poll(self.now, &mut ());
        self.b.poll(self.now, &mut ());
    }

    /// `ping ARGS` on side a; the transcript and whether it succeeded.
    fn ping(&mut self, args: &[&str]) -> (String, bool) {
        let o = ping::parse(args).unwrap();
        let mut out = String::new();
        let mut p = match Ping::start(&mut self.a, o, self.now, &mut out) {
            Ok(p) => p,
            Err(e) => return (e, false),
        };
        loop {
            self.tick();
            if !p.step(&mut self.a, self.now, &mut out) {
                break;
            }
        }
        let ok = p.finish(&mut self.a, &mut out);
        (out, ok)
    }
}

fn ip_out<C: ?Sized>(s: &mut Stack<C>, args: &str) -> Result<String, String> {
    let words: Vec<&str> = args.split_whitespace().collect();
    let mut out = String::new();
    ip(s, None, &words, &mut out).map(|()| out)
}

#[test]
fn two_stacks_ping_each_other_with_iputils_lines_over_an_ip_link() {
    let mut p = Pair::new(LinkKind::Infiniband);
    let (out, ok) = p.ping(&["-c", "3", "10.0.0.2"]);
    assert!(ok, "{out}");
    // A request leaves in the poll after it is queued, the peer answers
    // in its poll of the same tick, and the reply is read a tick later.
    assert_eq!(
        out,
        "PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.\n\
         64 bytes from 10.0.0.2: icmp_seq=1 ttl=64 time=0.200 ms\n\
         64 bytes from 10.0.0.2: icmp_seq=2 ttl=64 time=0.200 ms\n\
         64 bytes from 10.0.0.2: icmp_seq=3 ttl=64 time=0.200 ms\n\
         \n\
         --- 10.0.0.2 ping statistics ---\n\
         3 packets transmitted, 3 received, 0% packet loss, time 2000ms\n\
         rtt min/avg/max/mdev = 0.200/0.200/0.200/0.000 ms\n"
    );
    // The other way, a bigger payload, a shorter interval.
    std::mem::swap(&mut p.a, &mut p.b);
    let (out, ok) = p.ping(&["-c", "2", "-s", "1000", "-i", "0.2", "10.0.0.1"]);
    assert!(ok, "{out}");
    assert!(out.starts_with("PING 10.0.0.1 (10.0.0.1) 1000(1028) bytes of data.\n1008 bytes from 10.0.0.1: icmp_seq=1 ttl=64 time="), "{out}");
    assert!(
        out.contains("2 packets transmitted, 2 received, 0% packet loss, time 200ms\n"),
        "{out}"
    );
    std::mem::swap(&mut p.a, &mut p.b);
    // An IPoIB-like link shows its neighbours itself: the peer's 20 bytes.
    let n = ip_out(&mut p.a, "neigh").unwrap();
    assert_eq!(
        n,
        "10.0.0.2 dev ib0 lladdr 00:00:00:4a:fe:80:00:00:00:00:00:00:00:02:c9:03:00:00:00:21 REACHABLE\n"
    );
    // A request too big for the link's MTU: iputils' local error.
    let (out, ok) = p.ping(&["-c", "1", "-s", "2017", "10.0.0.2"]);
    assert!(!ok);
    assert_eq!(out, "local error: message too long, mtu=2044");
    // No route.
    let (out, ok) = p.ping(&["-c", "1", "192.168.7.7"]);
    assert!(!ok);
    assert_eq!(out, "connect: Network is unreachable");
}

#[test]
fn ethernet_link_resolves_by_arp_and_shows_the_neighbour() {
    let mut p = Pair::new(LinkKind::Ether);
    let (out, ok) = p.ping(&["-c", "2", "-i", "0.5", "10.0.0.2"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("64 bytes from 10.0.0.2: icmp_seq=1 ttl=64 time="),
        "{out}"
    );
    assert!(
        out.contains("2 packets transmitted, 2 received, 0% packet loss"),
        "{out}"
    );
    assert_eq!(
        ip_out(&mut p.a, "neigh show dev ib0").unwrap(),
        "10.0.0.2 dev ib0 lladdr 02:00:00:00:00:02 REACHABLE\n"
    );
    // What RoCE would follow of it: the address and the neighbour's MAC
    // (the buffers are cleared first); no RDMA port behind this wire.
    let id = p.a.links().find(|l| l.1 == "ib0").unwrap().0;
    let (mut addrs, mut neigh) = (vec![[9; 4]], vec![([9; 4], [9; 6])]);
    p.a.roce_addrs(id, &mut addrs, &mut neigh);
    assert_eq!(addrs, [[10, 0, 0, 1]]);
    assert_eq!(neigh, [([10, 0, 0, 2], [2, 0, 0, 0, 0, 2])]);
    assert_eq!(p.a.roce_link(id), None);
    // 31 s later it is stale, past 60 s gone (smoltcp's cache lifetime).
    for _ in 0..310 {
        p.now += 100_000;
        p.a.poll(p.now, &mut ());
    }
    assert!(ip_out(&mut p.a, "neigh").unwrap().ends_with("STALE\n"));
    for _ in 0..300 {
        p.now += 100_000;
        p.a.poll(p.now, &mut ());
    }
    assert_eq!(ip_out(&mut p.a, "neigh").unwrap(), "");
    let link = ip_out(&mut p.a, "link show ib0").unwrap();
    assert_eq!(
        link,
        "2: ib0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT group default\n    \
         link/ether 02:00:00:00:00:01 brd ff:ff:ff:ff:ff:ff\n"
    );
}

#[test]
fn a_lost_peer_times_out_with_iputils_summary() {
    for kind in [LinkKind::Infiniband, LinkKind::Ether] {
        let mut p = Pair::new(kind);
        p.wire.cut(true);
        let start = p.now;
        let (out, ok) = p.ping(&["-c", "3", "-W", "1", "10.0.0.2"]);
        assert!(!ok, "{out}");
        assert_eq!(
            out,
            "PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.\n\
             \n\
             --- 10.0.0.2 ping statistics ---\n\
             3 packets transmitted, 0 received, 100% packet loss, time 2000ms\n\
             \n"
        );
        // Two intervals, then -W after the last request.
        let took = p.now - start;
        assert!((3_000_000..3_100_000).contains(&took), "{took}");
        // One of three requests lost: iputils' %g. (An Ethernet link
        // resolves its peer again first: smoltcp keeps its requests until
        // then.)
        p.wire.cut(false);
        let (out, ok) = p.ping(&["-c", "1", "10.0.0.2"]);
        assert!(ok, "{out}");
        p.wire.drop_next(1, 1);
        let (out, ok) = p.ping(&["-c", "3", "-i", "0.1", "10.0.0.2"]);
        assert!(ok, "{out}");
        assert!(
            out.contains("3 packets transmitted, 2 received, 33.3333% packet loss, time 200ms\n"),
            "{out}"
        );
        // -w bounds a run with no -c.
        p.wire.cut(true);
        let (out, ok) = p.ping(&["-w", "2", "10.0.0.2"]);
        assert!(!ok);
        assert!(
            out.contains(" 0 received, 100% packet loss, time "),
            "{out}"
        );
    }
}

#[test]
fn a_pulled_cable_is_no_carrier_and_counted() {
    let mut p = Pair::new(LinkKind::Infiniband);
    p.wire.set_carrier(false);
    let (out, ok) = p.ping(&["-c", "2", "-W", "1", "10.0.0.2"]);
    assert!(!ok, "{out}");
    let link = ip_out(&mut p.a, "-s link show dev ib0").unwrap();
    assert!(link.starts_with("2: ib0: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 2044 qdisc noqueue state DOWN mode DEFAULT group default\n"), "{link}");
    let tx = link.lines().nth(5).unwrap();
    // TX: bytes packets errors dropped carrier collsns
    let cols: Vec<u64> = tx.split_whitespace().map(|w| w.parse().unwrap()).collect();
    assert_eq!(cols[4], 2, "{link}");
    assert!(ip_out(&mut p.a, "route").unwrap().ends_with(" linkdown\n"));
    p.wire.set_carrier(true);
    let (out, ok) = p.ping(&["-c", "1", "10.0.0.2"]);
    assert!(ok, "{out}");
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8)) as u8
}

#[test]
fn udp_echo_returns_one_mebibyte_unchanged() {
    for kind in [LinkKind::Infiniband, LinkKind::Ether] {
        let mut p = Pair::new(kind);
        let dev = p.a.link_id("ib0").unwrap();
        let s = p.a.udp_open(dev, 40000, 64, 128 * 1024).unwrap();
        const TOTAL: usize = 1 << 20;
        const CHUNK: usize = 1024;
        let peer = (addr("10.0.0.2"), 7);
        let (mut sent, mut got) = (0usize, 0usize);
        let mut buf = vec![0u8; 2048];
        while got < TOTAL {
            let u = p.a.udp(s).unwrap();
            // At most 16 datagrams in flight: the echo socket holds 16.
            while sent < TOTAL && sent - got < 16 * CHUNK && u.can_send() {
                let d: Vec<u8> = (sent..sent + CHUNK).map(pattern).collect();
                u.send_slice(&d, peer).unwrap();
                sent += CHUNK;
            }
            while let Ok((n, meta)) = u.recv_slice(&mut buf) {
                assert_eq!(meta.endpoint.port, 7);
                assert_eq!(n, CHUNK);
                for (k, b) in buf[..n].iter().enumerate() {
                    assert_eq!(*b, pattern(got + k), "byte {}", got + k);
                }
                got += n;
            }
            p.tick();
        }
        p.a.close(s);
        let stats = p.b.stats(p.b.link_id("ib0").unwrap()).unwrap();
        assert!(stats.rx_bytes > TOTAL as u64 && stats.tx_bytes > TOTAL as u64);
    }
}

fn tcp_echo(p: &mut Pair, dst: &str, local_port: u16) {
    let s =
        p.a.tcp_connect(addr(dst), 7, local_port, 64 * 1024)
            .unwrap();
    const TOTAL: usize = 1 << 20;
    let (mut sent, mut got) = (0usize, 0usize);
    let mut buf = vec![0u8; 16 * 1024];
    let chunk: Vec<u8> = (0..TOTAL).map(pattern).collect();
    while got < TOTAL {
        let t = p.a.tcp(s).unwrap();
        if t.can_send() && sent < TOTAL {
            sent += t.send_slice(&chunk[sent..]).unwrap();
        }
        while t.can_recv() {
            let n = t.recv_slice(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            assert_eq!(&buf[..n], &chunk[got..got + n], "at {got}");
            got += n;
        }
        p.tick();
    }
    // A clean close: both sides, and the echo socket listens again.
    p.a.tcp(s).unwrap().close();
    for _ in 0..10_000 {
        p.tick();
        if p.a.tcp(s).unwrap().state() == net::smoltcp::socket::tcp::State::TimeWait
            || !p.a.tcp(s).unwrap().is_open()
        {
            break;
        }
    }
    let st = p.a.tcp(s).unwrap().state();
    assert!(
        matches!(
            st,
            net::smoltcp::socket::tcp::State::TimeWait | net::smoltcp::socket::tcp::State::Closed
        ),
        "{st}"
    );
    p.a.close(s);
}

#[test]
fn tcp_echo_returns_one_mebibyte_unchanged_and_serves_again() {
    for kind in [LinkKind::Infiniband, LinkKind::Ether] {
        let mut p = Pair::new(kind);
        tcp_echo(&mut p, "10.0.0.2", 40001);
        tcp_echo(&mut p, "10.0.0.2", 40002);
        // Through lo, to our own address and to 127.0.0.1.
        tcp_echo(&mut p, "10.0.0.1", 40003);
        tcp_echo(&mut p, "127.0.0.1", 40004);
    }
}

#[test]
fn loopback_answers_its_own_pings_in_one_poll() {
    let mut p = Pair::new(LinkKind::Infiniband);
    for dst in ["127.0.0.1", "127.3.2.1", "10.0.0.1"] {
        let (out, ok) = p.ping(&["-c", "2", "-i", "0.5", dst]);
        assert!(ok, "{out}");
        assert!(
            out.contains(&format!(
                "64 bytes from {dst}: icmp_seq=1 ttl=64 time=0.100 ms\n"
            )),
            "{out}"
        );
    }
    let lo = ip_out(&mut p.a, "-s link show lo").unwrap();
    assert!(lo.starts_with(
        "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default\n    \
         link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n    \
         RX:  bytes packets errors dropped  missed   mcast           \n"
    ), "{lo}");
    // Six requests and six replies, RX and TX alike.
    assert_eq!(
        lo.lines().nth(3).unwrap(),
        "          1008      12      0       0       0       0 "
    );
    assert_eq!(
        lo.lines().nth(4).unwrap(),
        "    TX:  bytes packets errors dropped carrier collsns           "
    );
    assert_eq!(
        lo.lines().nth(5).unwrap(),
        "          1008      12      0       0       0       0 "
    );
    // -i 0: as fast as replies come, with iputils' ipg/ewma.
    let (out, ok) = p.ping(&["-c", "5", "-i", "0", "127.0.0.1"]);
    assert!(ok, "{out}");
    assert!(out.contains("5 packets transmitted, 5 received, 0% packet loss, time 1ms\nrtt min/avg/max/mdev = 0.100/0.100/0.100/0.000 ms, ipg/ewma 0.125/0.100 ms\n"), "{out}");
    // The largest request iputils sends.
    let (out, ok) = p.ping(&["-c", "1", "-s", "65507", "127.0.0.1"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("65515 bytes from 127.0.0.1: icmp_seq=1 ttl=64 time="),
        "{out}"
    );
    // Sizes below a timestamp's: no times, no rtt line.
    let (out, ok) = p.ping(&["-c", "1", "-s", "8", "127.0.0.1"]);
    assert!(ok, "{out}");
    assert_eq!(
        out,
        "PING 127.0.0.1 (127.0.0.1) 8(36) bytes of data.\n16 bytes from 127.0.0.1: icmp_seq=1 ttl=64\n\n--- 127.0.0.1 ping statistics ---\n1 packets transmitted, 1 received, 0% packet loss, time 0ms\n\n"
    );
}

#[test]
fn bad_packets_are_counted_drops_and_the_link_carries_on() {
    for kind in [LinkKind::Infiniband, LinkKind::Ether] {
        let mut p = Pair::new(kind);
        let dev = p.b.link_id("ib0").unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut injected = 0;
        for round in 0..2000 {
            let mut pkt = vec![0u8; (round * 7) % 300];
            for b in pkt.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            // Half of them look like IPv4 (behind an Ethernet header on
            // an Ethernet link), so the deeper checks run.
            if round % 2 == 0 {
                let at = if kind == LinkKind::Ether { 14 } else { 0 };
                if pkt.len() > at + 1 {
                    pkt[at] = 0x45;
                    if at > 0 {
                        pkt[12] = 0x08;
                        pkt[13] = 0x00;
                    }
                }
            }
            if p.wire.inject(1, &pkt) {
                injected += 1;
            }
            if round % 32 == 0 {
                p.tick();
            }
        }
        for _ in 0..100 {
            p.tick();
        }
        let c = p.b.counters(dev).unwrap();
        // Everything was dropped and counted (a few random frames may be
        // well-formed Ethernet for another host: smoltcp ignores them).
        assert!(
            c.rx_malformed + c.rx_unsupported + 30 >= injected,
            "{c:?} of {injected}"
        );
        assert_eq!(
            p.b.stats(dev).unwrap().rx_dropped,
            c.rx_malformed + c.rx_unsupported
        );
        let (out, ok) = p.ping(&["-c", "1", "10.0.0.2"]);
        assert!(ok, "{out}");
    }
}

#[test]
fn ip_shows_and_changes_addresses_and_routes_in_iproute2_words() {
    let mut p = Pair::new(LinkKind::Infiniband);
    let s = &mut p.a;
    assert_eq!(
        ip_out(s, "addr").unwrap(),
        "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN group default\n    \
         link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n    \
         inet 127.0.0.1/8 scope host lo\n       \
         valid_lft forever preferred_lft forever\n\
         2: ib0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 2044 qdisc noqueue state UP group default\n    \
         link/infiniband 00:00:00:49:fe:80:00:00:00:00:00:00:00:02:c9:03:00:00:00:11 brd 00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff\n    \
         inet 10.0.0.1/24 scope global ib0\n       \
         valid_lft forever preferred_lft forever\n"
    );
    assert_eq!(ip_out(s, "a show dev lo").unwrap().lines().count(), 4);
    assert_eq!(
        ip_out(s, "route").unwrap(),
        "10.0.0.0/24 dev ib0 proto kernel scope link src 10.0.0.1\n"
    );
    ip_out(s, "route add default via 10.0.0.254").unwrap();
    ip_out(s, "addr add 10.0.0.9/24 dev ib0").unwrap();
    ip_out(s, "addr add 10.5.0.1/16 dev ib0").unwrap();
    assert_eq!(
        ip_out(s, "r").unwrap(),
        "default via 10.0.0.254 dev ib0\n\
         10.0.0.0/24 dev ib0 proto kernel scope link src 10.0.0.1\n\
         10.5.0.0/16 dev ib0 proto kernel scope link src 10.5.0.1\n"
    );
    assert!(
        ip_out(s, "addr show ib0")
            .unwrap()
            .contains("    inet 10.0.0.9/24 scope global secondary ib0\n")
    );
    assert_eq!(
        ip_out(s, "route get 8.8.8.8").unwrap(),
        "8.8.8.8 via 10.0.0.254 dev ib0 src 10.0.0.1 uid 0\n    cache \n"
    );
    assert_eq!(
        ip_out(s, "route get 10.0.0.9").unwrap(),
        "local 10.0.0.9 dev lo src 10.0.0.9 uid 0\n    cache <local> \n"
    );
    assert_eq!(
        ip_out(s, "route show table local").unwrap(),
        "local 10.0.0.1 dev ib0 proto kernel scope host src 10.0.0.1\n\
         local 10.0.0.9 dev ib0 proto kernel scope host src 10.0.0.9\n\
         local 10.5.0.1 dev ib0 proto kernel scope host src 10.5.0.1\n\
         local 127.0.0.0/8 dev lo proto kernel scope host src 127.0.0.1\n\
         local 127.0.0.1 dev lo proto kernel scope host src 127.0.0.1\n"
    );
    // Errors, as iproute2 words them.
    assert_eq!(
        ip_out(s, "addr add 10.0.0.9/24 dev ib0").unwrap_err(),
        "RTNETLINK answers: File exists"
    );
    assert_eq!(
        ip_out(s, "addr add 10.0.0.3/24 dev ib7").unwrap_err(),
        "Cannot find device \"ib7\""
    );
    assert_eq!(
        ip_out(s, "addr add 10.0.0.3/24").unwrap_err(),
        "Not enough information: \"dev\" argument is required."
    );
    assert_eq!(
        ip_out(s, "addr del 10.0.0.77/24 dev ib0").unwrap_err(),
        "RTNETLINK answers: Cannot assign requested address"
    );
    assert_eq!(
        ip_out(s, "route add default via 10.0.0.254").unwrap_err(),
        "RTNETLINK answers: File exists"
    );
    assert_eq!(
        ip_out(s, "route add 10.9.0.0/16 via 10.7.0.1").unwrap_err(),
        "Error: Nexthop has invalid gateway."
    );
    assert_eq!(
        ip_out(s, "route del 10.9.0.0/16").unwrap_err(),
        "RTNETLINK answers: No such process"
    );
    assert_eq!(
        ip_out(s, "frob").unwrap_err(),
        "Object \"frob\" is unknown, try \"ip help\"."
    );
    assert_eq!(
        ip_out(s, "addr frob").unwrap_err(),
        "Command \"frob\" is unknown, try \"ip address help\"."
    );
    // Deleting the address a gateway hangs off takes the gateway route.
    ip_out(s, "addr del 10.0.0.9/24 dev ib0").unwrap();
    ip_out(s, "addr del 10.0.0.1/24 dev ib0").unwrap();
    assert_eq!(
        ip_out(s, "route").unwrap(),
        "10.5.0.0/16 dev ib0 proto kernel scope link src 10.5.0.1\n"
    );
    let (out, ok) = p.ping(&["-c", "1", "-W", "1", "10.0.0.2"]);
    assert!(!ok);
    assert_eq!(out, "connect: Network is unreachable");
}

#[test]
fn command_line_addresses_wait_for_their_link() {
    let mut s: Stack = Stack::new(0);
    for c in net::config::parse("ib0:10.0.0.7/24,eth0:192.168.1.5/24").unwrap() {
        s.configure(c);
    }
    for c in net::config::parse("10.9.9.9::10.9.9.1:255.255.255.0").unwrap() {
        s.configure(c);
    }
    assert_eq!(s.pending().len(), 3);
    let (a, _b, _w) = wire::pair(LinkKind::Infiniband, 2044);
    let id = s.add_link("ib0", Box::new(a)).unwrap();
    // ib0's own, and the one for the first link other than lo.
    assert_eq!(s.addrs(id), &[cidr("10.0.0.7/24"), cidr("10.9.9.9/24")]);
    assert_eq!(s.pending().len(), 1);
    assert_eq!(
        ip_out(&mut s, "route").unwrap(),
        "default via 10.9.9.1 dev ib0 proto boot\n\
         10.0.0.0/24 dev ib0 proto kernel scope link src 10.0.0.7\n\
         10.9.9.0/24 dev ib0 proto kernel scope link src 10.9.9.9\n"
    );
    let (e, _f, _w) = wire::pair(LinkKind::Ether, 1500);
    let id = s.add_link("eth0", Box::new(e)).unwrap();
    assert_eq!(s.addrs(id), &[cidr("192.168.1.5/24")]);
    assert!(s.pending().is_empty());
    // Taking a link out takes its addresses and routes.
    assert!(s.remove_link(id).is_some());
    assert!(!ip_out(&mut s, "route").unwrap().contains("192.168"));
    assert!(s.remove_link(s.link_id("lo").unwrap()).is_none());
}

/// An IP link that records the next hop of everything it is told to send,
/// in the context the stack is polled with (as IPoIB gets ib_core).
struct NextHops {
    buf: Vec<u8>,
    addrs: std::sync::Arc<std::sync::Mutex<Vec<Ipv4Cidr>>>,
}

impl net::Link<Vec<Ipv4Address>> for NextHops {
    fn kind(&self) -> LinkKind {
        LinkKind::Infiniband
    }
    fn mtu(&self) -> usize {
        2044
    }
    fn carrier(&self) -> bool {
        true
    }
    fn hw_addr(&self) -> net::HwAddr {
        net::HwAddr::new(&[0; 20])
    }
    fn stats(&self) -> net::LinkStats {
        net::LinkStats::default()
    }
    fn receive(&mut self, _: &mut Vec<Ipv4Address>, _: &mut [u8]) -> Option<usize> {
        None
    }
    fn tx_ready(&mut self, _: &mut Vec<Ipv4Address>) -> bool {
        true
    }
    fn tx_buffer(&mut self, _: &mut Vec<Ipv4Address>, len: usize) -> Option<&mut [u8]> {
        self.buf.resize(len, 0);
        Some(&mut self.buf)
    }
    fn tx_commit(&mut self, hops: &mut Vec<Ipv4Address>, next_hop: Ipv4Address) {
        hops.push(next_hop);
    }
    fn addrs_changed(&mut self, addrs: &[Ipv4Cidr]) {
        *self.addrs.lock().unwrap() = addrs.to_vec();
    }
}

#[test]
fn an_ip_link_hears_of_its_addresses_and_is_told_the_gateway_for_what_is_off_its_network() {
    let mut s: Stack<Vec<Ipv4Address>> = Stack::new(0);
    let addrs = std::sync::Arc::default();
    let link = NextHops {
        buf: Vec::new(),
        addrs: std::sync::Arc::clone(&addrs),
    };
    let id = s.add_link("ib0", Box::new(link)).unwrap();
    s.add_addr(id, cidr("10.0.0.1/24")).unwrap();
    // The link hears of its addresses (for its own ARP).
    s.add_addr(id, cidr("10.0.0.9/24")).unwrap();
    s.del_addr(id, cidr("10.0.0.9/24")).unwrap();
    assert_eq!(*addrs.lock().unwrap(), [cidr("10.0.0.1/24")]);
    s.add_route(
        cidr("0.0.0.0/0"),
        Some(addr("10.0.0.254")),
        None,
        net::route::Proto::Static,
    )
    .unwrap();
    s.add_route(
        cidr("10.8.0.0/16"),
        Some(addr("10.0.0.8")),
        Some(id),
        net::route::Proto::Static,
    )
    .unwrap();
    let mut hops = Vec::new();
    let mut now = 0;
    for dst in ["10.0.0.2", "8.8.8.8", "10.8.1.1", "10.0.0.255"] {
        let mut out = String::new();
        let o = ping::parse(&["-c", "1", "-W", "0.01", dst]).unwrap();
        let mut p = Ping::start(&mut s, o, now, &mut out).unwrap();
        loop {
            now += TICK_US;
            s.poll(now, &mut hops);
            if !p.step(&mut s, now, &mut out) {
                break;
            }
        }
        assert!(!p.finish(&mut s, &mut out));
    }
    assert_eq!(
        hops,
        [
            addr("10.0.0.2"),
            addr("10.0.0.254"),
            addr("10.0.0.8"),
            addr("10.0.0.255")
        ]
    );
}
