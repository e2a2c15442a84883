//! End-to-end IP over InfiniBand: two of our guests ping each other 100 times with no loss, and an unmodified Linux 6.1 guest (its own `ib_ipoib`) and ours ping, resolve and echo each other, the exchange captured and dissected by tshark.
//!
//! Two boots, both TCG under Debian's OpenSM, each with a deadline of
//! [`DEADLINE`] (about 20 s and 40 s of it used on a loaded 2-core host):
//!
//! * `--nodes 2` (cx3-emu): `ibv_ud_pingpong` between the two first (the
//!   round trip below IP, for the figures of `docs/ipoib.md`); then `ib0`
//!   with the address run-qemu.sh gives each node (10.0.0.N+1/24), each side
//!   pings the other 100 times (0% loss), `ip neigh` shows the peer's
//!   20-byte address (flags 0, its QPN, its port GID) as its own `ip link`
//!   prints it; node 0 sends 1 MiB through node 1's TCP echo and pings it
//!   500 times back to back while node 1 waits for node 0 to go
//!   (`retry -u ping`).
//! * `--guests linux,lego` (cx3-vfu, `--capture`): Linux loads `ib_ipoib`
//!   and puts 192.168.100.1/24 on its `ib0`, ours takes 192.168.100.2/24
//!   (the Linux guests' e1000 link uses 10.0.0.0/24); each pings the other
//!   100 times with no loss, and Linux's `ibping -f` measures the UD round
//!   trip to our kernel's responder below IP; Linux's `ip neigh` shows our
//!   QPN and GID with flags 0 (datagram mode), ours shows Linux's (with its
//!   connected-mode flag, which we ignore); 1 MiB from Linux's `nc` comes
//!   back from our echo service unchanged, and our `tcpecho` gets its bytes
//!   back from Linux's `nc -l -e cat`; tshark reads the capture as IPoIB
//!   carrying ARP (hardware type 32), ICMP and TCP, with no malformed
//!   packet.

use std::process::Command;
use std::time::Duration;

use tests::qemu;

/// Each boot's deadline (TCG on a loaded 2-core machine).
const DEADLINE: Duration = Duration::from_secs(110);

/// Node `n`'s transcript.
fn node(out: &str, n: usize) -> &str {
    qemu::node(out, n).unwrap_or("")
}

/// The lines after `{prompt}{cmd}` up to the next prompt line.
fn after<'a>(t: &'a str, prompt: &str, cmd: &str) -> Vec<&'a str> {
    let Some(at) = t.find(&format!("{prompt}{cmd}")) else {
        return Vec::new();
    };
    t[at..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with(prompt) && !l.starts_with("run: "))
        .filter(|l| !l.starts_with('['))
        .map(|l| l.trim_end_matches('\r'))
        .collect()
}

/// The hardware address `ip link show ib0` prints after `link/infiniband`.
fn link_addr(t: &str) -> Option<&str> {
    let i = t.find("link/infiniband ")? + "link/infiniband ".len();
    t[i..].split_whitespace().next()
}

/// The median of the `time=X ms` of a ping's reply lines.
fn median(lines: &[&str]) -> Option<f64> {
    let mut t: Vec<f64> = lines
        .iter()
        .filter_map(|l| l.split("time=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    t.sort_by(f64::total_cmp);
    t.get(t.len() / 2).copied()
}

/// The `min/avg/max` of a ping summary line (iputils' `rtt ...` or
/// busybox's `round-trip ...`).
fn rtt(lines: &[&str]) -> Option<String> {
    lines
        .iter()
        .find(|l| l.starts_with("rtt ") || l.starts_with("round-trip "))
        .and_then(|l| l.split(" = ").nth(1))
        .map(|v| v.to_string())
}

// One boot: ibv_ud_pingpong first (the round trip below IP, and both nodes
// past it together), then the pings both ways at once; node 0 goes on with
// TCP and a back-to-back ping while node 1 serves them, until node 0 has
// powered off and stops answering (`retry -u`).
const OURS_0: &str = "retry -n 90 -i 1 ibv_ud_pingpong -n 1000 -s 88 0x0002c90300000021; \
     retry -n 60 -i 1 ping -c 1 -W 1 10.0.0.2; ping -c 100 -i 0.05 10.0.0.2; \
     ip neigh; ip link show ib0; tcpecho 10.0.0.2; ping -c 500 -i 0 10.0.0.2; \
     ip -s link show ib0; ethtool -S ib0";
const OURS_1: &str = "retry -n 3 -i 1 ibv_ud_pingpong -n 1000 -s 88; \
     retry -n 60 -i 1 ping -c 1 -W 1 10.0.0.1; ping -c 100 -i 0.05 10.0.0.1; \
     ip neigh; ip link show ib0; retry -n 90 -i 1 -u ping -c 3 -i 0.5 -W 2 10.0.0.1; \
     ip -s link show ib0; ethtool -S ib0";

#[test]
fn two_of_our_guests_ping_each_other_over_ib0() {
    let r = qemu::run_args(
        &[
            "--nodes", "2", "--run-on", "0", OURS_0, "--run-on", "1", OURS_1,
        ],
        DEADLINE,
    );
    let all = r.all();
    assert_eq!(r.status, 0, "{all}");
    let (t0, t1) = (node(&r.transcript, 0), node(&r.transcript, 1));
    for (t, peer) in [(t0, "10.0.0.2"), (t1, "10.0.0.1")] {
        let ping = after(t, "lego> ", &format!("ping -c 100 -i 0.05 {peer}"));
        assert!(
            ping.iter()
                .any(|l| l.starts_with("100 packets transmitted, 100 received, 0% packet loss")),
            "{all}"
        );
        eprintln!(
            "ping -c 100 to {peer}: rtt {:?}, median {:?} ms",
            rtt(&ping),
            median(&ping)
        );
    }
    // Each side's neighbour is the other's own address: flags 0, QPN, GID.
    let (a0, a1) = (
        link_addr(t0).expect("node 0's address"),
        link_addr(t1).expect("node 1's address"),
    );
    assert_eq!(a0.len(), 59, "20 bytes: {a0}");
    for (a, guid) in [
        (a0, "00:02:c9:03:00:00:00:11"),
        (a1, "00:02:c9:03:00:00:00:21"),
    ] {
        assert!(a.starts_with("00:"), "datagram mode, flags 0: {a}");
        assert!(
            a.ends_with(&format!("fe:80:00:00:00:00:00:00:{guid}")),
            "the port GID: {a}"
        );
    }
    assert_eq!(
        after(t0, "lego> ", "ip neigh"),
        [format!("10.0.0.2 dev ib0 lladdr {a1} REACHABLE")],
        "{all}"
    );
    assert_eq!(
        after(t1, "lego> ", "ip neigh"),
        [format!("10.0.0.1 dev ib0 lladdr {a0} REACHABLE")],
        "{all}"
    );
    let echo = after(t0, "lego> ", "tcpecho 10.0.0.2");
    assert!(
        echo.iter()
            .any(|l| l.starts_with("tcpecho: 1048576 bytes echoed by 10.0.0.2:7 in ")),
        "{all}"
    );
    let ud = after(t0, "lego> ", "retry -n 90 -i 1 ibv_ud_pingpong");
    let ud = ud.iter().find(|l| l.contains("usec/iter"));
    assert!(ud.is_some(), "{all}");
    eprintln!(
        "{}\nibv_ud_pingpong -s 88: {}",
        echo.join("\n"),
        ud.unwrap()
    );
    // Back to back (the emulator never naps): the IP stack's share beside
    // ibv_ud_pingpong's round trip. A measurement, not the 0% loss check
    // above: in one run of about ten, 17 requests sent 10 ms apart while
    // node 1 stalled for 240 ms got no reply, with every IPoIB counter of
    // both links at 0 (docs/ipoib.md, findings); at least 95% must come.
    let flood = after(t0, "lego> ", "ping -c 500 -i 0 10.0.0.2");
    let got = flood
        .iter()
        .find_map(|l| l.strip_prefix("500 packets transmitted, "))
        .and_then(|l| l.split(' ').next()?.parse::<u32>().ok());
    assert!(got.is_some_and(|n| n >= 475), "{all}");
    eprintln!(
        "ping -c 500 -i 0: {:?} received, {:?}, median {:?} ms",
        got,
        rtt(&flood),
        median(&flood)
    );
    // Nothing dropped on either side once up (no ARP failure, no full
    // ring), no bad frame.
    for t in [t0, t1] {
        let stats = after(t, "lego> ", "ethtool -S ib0");
        for k in [
            "tx_ring_full",
            "tx_no_path",
            "rx_short",
            "rx_unknown_type",
            "arp_bad",
        ] {
            assert!(
                stats.contains(&format!("     {k}: 0").as_str()),
                "{k}: {stats:#?}"
            );
        }
    }
}

// Linux pings first while ours waits for its `nc -l` in `retry tcpecho`,
// and ours pings Linux after that: with both pings at once, busybox's ping
// now and then missed a reply under TCG (2 of 100 in one of eight runs)
// that the capture shows on Linux's cable and Linux's IPoIB counted in its
// RX packets, so lost above IPoIB; most likely in busybox's raw socket,
// whose receive buffer holds only a few of IPoIB's 4 KiB receive buffers
// and also gets a copy of every echo request we send Linux.
const LINUX: &str = "wait-active 120; modprobe ib_ipoib; ip link set ib0 up; \
     ip addr add 192.168.100.1/24 dev ib0; cat /sys/class/net/ib0/mode; ip link show ib0; \
     retry 120 ping -c 1 -W 2 192.168.100.2; ping -c 100 -i 0.1 192.168.100.2; \
     lid=$(peer-lid 2) && ibping -f -c 100 $lid; ip neigh show dev ib0; head -c 1048576 /dev/urandom > /tmp/a; \
     time nc 192.168.100.2 7 < /tmp/a > /tmp/b; cmp /tmp/a /tmp/b && echo tcp-echo-same; \
     echo hello-lego | nc 192.168.100.2 7; nc -l -p 7 -e cat; ifconfig ib0; wait-down 2 300";
const OURS_WITH_LINUX: &str = "retry -n 60 -i 1 ip addr add 192.168.100.2/24 dev ib0; \
     retry -n 180 -i 1 ping -c 1 -W 2 192.168.100.1; retry -n 300 -i 1 tcpecho 192.168.100.1 -t 30; \
     ping -c 100 -i 0.05 192.168.100.1; ip neigh; ip link show ib0; ip -s link show ib0; ethtool -S ib0";

#[test]
fn linux_and_our_guest_ping_resolve_and_echo_over_ipoib() {
    let cap = tests::target_tmpdir().join(format!("qemu-ipoib-{}.pcapng", std::process::id()));
    let _ = std::fs::create_dir_all(cap.parent().unwrap());
    let _ = std::fs::remove_file(&cap);
    let emu = format!("--stats --capture {}", cap.display());
    let r = qemu::run_vfu(
        &[
            "--guests",
            "linux,lego",
            "--emu-args",
            &emu,
            "--run-on",
            "0",
            LINUX,
            "--run-on",
            "1",
            OURS_WITH_LINUX,
        ],
        DEADLINE,
        true,
    );
    let all = r.all();
    assert_eq!(r.status, 0, "{all}");
    assert!(
        r.stderr.contains("violations 0, DMA faults 0"),
        "cx3-vfu recorded a violation or a DMA fault:\n{all}"
    );
    let (lin, ours) = (node(&r.transcript, 0), node(&r.transcript, 1));
    let linux = |cmd: &str| after(lin, "# ", cmd);
    let lego = |cmd: &str| after(ours, "lego> ", cmd);
    assert_eq!(linux("cat /sys/class/net/ib0/mode"), ["datagram"], "{all}");
    let our_addr = link_addr(ours).expect("our ib0's address").to_string();
    let linux_addr = link_addr(lin).expect("Linux's ib0's address").to_string();
    // Linux says it could do connected mode (0x80); ours does not.
    assert!(linux_addr.starts_with("80:"), "{linux_addr}");
    assert!(our_addr.starts_with("00:"), "{our_addr}");
    // 100 pings each way, none lost.
    let lping = linux("ping -c 100 -i 0.1 192.168.100.2");
    assert!(
        lping.contains(&"100 packets transmitted, 100 packets received, 0% packet loss"),
        "Linux's ping:\n{all}"
    );
    let oping = lego("ping -c 100 -i 0.05 192.168.100.1");
    assert!(
        oping
            .iter()
            .any(|l| l.starts_with("100 packets transmitted, 100 received, 0% packet loss")),
        "our ping:\n{all}"
    );
    eprintln!(
        "Linux to ours: rtt {:?}, median {:?} ms; ours to Linux: rtt {:?}, median {:?} ms",
        rtt(&lping),
        median(&lping),
        rtt(&oping),
        median(&oping)
    );
    // The same path below IP: Linux's ibping to our kernel's responder.
    let ibping = linux("lid=$(peer-lid 2) && ibping -f -c 100 $lid");
    assert!(
        ibping
            .iter()
            .any(|l| l.contains("100 packets transmitted, 100 received")),
        "Linux's ibping of our guest:\n{all}"
    );
    eprintln!("Linux's ibping to ours: {:?}", rtt(&ibping));
    // Linux's neighbour entry names our QPN and GID (flags 0); ours names
    // Linux's.
    let lneigh = linux("ip neigh show dev ib0");
    assert!(
        lneigh.iter().any(
            |l| l.starts_with(&format!("192.168.100.2 lladdr {our_addr} "))
                && l.ends_with("REACHABLE")
        ),
        "Linux's ip neigh:\n{all}"
    );
    assert_eq!(
        lego("ip neigh"),
        [format!(
            "192.168.100.1 dev ib0 lladdr {linux_addr} REACHABLE"
        )],
        "{all}"
    );
    // TCP both ways: Linux's nc through our echo, ours through Linux's.
    let lt = linux("time nc 192.168.100.2 7");
    assert!(
        linux("cmp /tmp/a /tmp/b").contains(&"tcp-echo-same"),
        "1 MiB from Linux:\n{all}"
    );
    assert!(linux("echo hello-lego").contains(&"hello-lego"), "{all}");
    eprintln!(
        "Linux's nc, 1 MiB through our echo: {:?}",
        lt.iter().find(|l| l.starts_with("real"))
    );
    let ot = lego("retry -n 300 -i 1 tcpecho 192.168.100.1");
    let line = ot
        .iter()
        .find(|l| l.starts_with("tcpecho: 1048576 bytes echoed by 192.168.100.1:7"));
    assert!(line.is_some(), "our tcpecho through Linux's nc:\n{all}");
    eprintln!("{}", line.unwrap());
    let stats = lego("ethtool -S ib0");
    for k in [
        "tx_ring_full",
        "tx_no_path",
        "rx_short",
        "rx_unknown_type",
        "arp_bad",
    ] {
        assert!(
            stats.contains(&format!("     {k}: 0").as_str()),
            "{k}: {stats:#?}"
        );
    }
    // tshark: ARP over IPoIB (hardware type 32, 20-byte addresses), ICMP
    // and TCP, and not one malformed packet.
    if !std::path::Path::new("/usr/bin/tshark").exists() {
        eprintln!("!!!!! tshark missing: the capture was not dissected");
        return;
    }
    let tshark = |filter: &str, fields: &[&str]| -> String {
        let mut c = Command::new("/usr/bin/tshark");
        c.arg("-r").arg(&cap).args(["-Y", filter, "-T", "fields"]);
        for f in fields {
            c.args(["-e", f]);
        }
        let out = c.output().expect("tshark runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let malformed = tshark("_ws.malformed", &["frame.number", "_ws.col.Info"]);
    assert!(
        malformed.trim().is_empty(),
        "malformed packets:\n{malformed}"
    );
    let arp = tshark(
        "arp && frame.interface_name contains \"node1\"",
        &[
            "arp.hw.type",
            "arp.hw.size",
            "arp.opcode",
            "arp.src.proto_ipv4",
            "arp.dst.proto_ipv4",
        ],
    );
    // Who asked whom first depends on which side came up first: each side
    // sent ARP with hardware type 32 and 20-byte addresses, and a reply
    // went by.
    for (src, dst) in [
        ("192.168.100.2", "192.168.100.1"),
        ("192.168.100.1", "192.168.100.2"),
    ] {
        assert!(
            arp.lines()
                .any(|l| l.starts_with("32\t20\t") && l.ends_with(&format!("\t{src}\t{dst}"))),
            "ARP from {src}:\n{arp}"
        );
    }
    assert!(
        arp.lines().any(|l| l.starts_with("32\t20\t2\t")),
        "an ARP reply:\n{arp}"
    );
    let icmp = tshark(
        "icmp && frame.interface_name contains \"node1\"",
        &["ip.src", "ip.dst", "icmp.type"],
    );
    for (src, dst) in [
        ("192.168.100.1", "192.168.100.2"),
        ("192.168.100.2", "192.168.100.1"),
    ] {
        for ty in [8, 0] {
            let n = icmp
                .lines()
                .filter(|l| *l == format!("{src}\t{dst}\t{ty}"))
                .count();
            assert!(n >= 100, "{n} ICMP type {ty} from {src} to {dst}");
        }
    }
    let tcp = tshark(
        "tcp.port == 7 && frame.interface_name contains \"node1\"",
        &["frame.number"],
    );
    assert!(tcp.lines().count() > 1000, "the echoes went by as TCP");
    let _ = std::fs::remove_file(&cap);
}
