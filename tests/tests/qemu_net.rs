//! End-to-end: the kernel's IP stack in one short boot (no HCA): `lo` in `ip addr` and `ip link` in iproute2's lines, `ping -c 3 127.0.0.1` with iputils' lines and summary, the counters it leaves, and a command-line address waiting for its link.

use std::time::Duration;

use tests::qemu;

/// The boot takes seconds and the ping two; the deadline only bounds a
/// hang.
const DEADLINE: Duration = Duration::from_secs(90);

/// The output of `lego> CMD` up to the next prompt, kernel log lines left
/// out, line ends trimmed.
fn output<'a>(t: &'a str, cmd: &str) -> Vec<&'a str> {
    let at = t
        .find(&format!("lego> {cmd}\n"))
        .or_else(|| t.find(&format!("lego> {cmd}\r\n")))
        .unwrap_or_else(|| panic!("`{cmd}` was not run:\n{t}"));
    t[at..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("lego> ") && !l.starts_with("run: "))
        .filter(|l| !l.starts_with('['))
        .map(|l| l.trim_end_matches('\r'))
        .collect()
}

#[test]
fn lo_shows_in_ip_and_answers_ping_with_iputils_lines() {
    let r = qemu::run(
        "ip addr; ip link; ping -c 3 127.0.0.1; ip -s link show lo; ip route get 127.0.0.1; ping -c 1 10.9.9.9",
        &["--no-hca", "--append", "ip=ib0:10.0.0.7/24"],
        DEADLINE,
    );
    // The last ping has no route: the run fails on it, as iputils' exits 2.
    assert_eq!(r.status, 1, "{}", r.transcript);
    let t = &r.transcript;
    // The address for a link that does not exist yet waits for it.
    r.expect("10.0.0.7/24 for ib0 once it appears");
    assert_eq!(
        output(t, "ip addr"),
        [
            "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN group default",
            "    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00",
            "    inet 127.0.0.1/8 scope host lo",
            "       valid_lft forever preferred_lft forever",
        ]
    );
    assert_eq!(
        output(t, "ip link"),
        [
            "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default",
            "    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00",
        ]
    );
    let ping = output(t, "ping -c 3 127.0.0.1");
    assert_eq!(ping.len(), 8, "{ping:#?}");
    assert_eq!(ping[0], "PING 127.0.0.1 (127.0.0.1) 56(84) bytes of data.");
    for (i, l) in ping[1..4].iter().enumerate() {
        let head = format!("64 bytes from 127.0.0.1: icmp_seq={} ttl=64 time=", i + 1);
        let time = l
            .strip_prefix(&head)
            .and_then(|r| r.strip_suffix(" ms"))
            .unwrap_or_else(|| panic!("{l:?}"));
        assert!(time.parse::<f64>().is_ok(), "{l:?}");
    }
    assert_eq!(ping[4], "");
    assert_eq!(ping[5], "--- 127.0.0.1 ping statistics ---");
    let summary = ping[6]
        .strip_prefix("3 packets transmitted, 3 received, 0% packet loss, time ")
        .and_then(|r| r.strip_suffix("ms"))
        .unwrap_or_else(|| panic!("{:?}", ping[6]));
    // Two intervals of a second between the three requests (never less;
    // a loaded TCG host may stretch them, as it would iputils' own).
    let ms: u64 = summary.parse().unwrap();
    assert!((1990..6000).contains(&ms), "{}", ping[6]);
    let rtt = ping[7]
        .strip_prefix("rtt min/avg/max/mdev = ")
        .and_then(|r| r.strip_suffix(" ms"))
        .unwrap_or_else(|| panic!("{:?}", ping[7]));
    assert_eq!(rtt.split('/').count(), 4, "{rtt}");
    // Three requests and three replies went through lo, both ways.
    let stats = output(t, "ip -s link show lo");
    assert_eq!(
        stats[2],
        "    RX:  bytes packets errors dropped  missed   mcast           "
    );
    assert_eq!(
        stats[3],
        "           504       6      0       0       0       0 "
    );
    assert_eq!(
        stats[4],
        "    TX:  bytes packets errors dropped carrier collsns           "
    );
    assert_eq!(
        stats[5],
        "           504       6      0       0       0       0 "
    );
    assert_eq!(
        output(t, "ip route get 127.0.0.1"),
        [
            "local 127.0.0.1 dev lo src 127.0.0.1 uid 0",
            "    cache <local> "
        ]
    );
    assert_eq!(
        output(t, "ping -c 1 10.9.9.9"),
        ["ping: connect: Network is unreachable"]
    );
    r.expect("run: a command failed");
}
