//! The capture of an Ethernet fabric as tshark 4.0 reads it: RoCE v1
//! (`eth.type == 0x8915`), ARP and IPv4, the FCS good, nothing malformed;
//! in pcapng (Ethernet interfaces) and in classic pcap (ERF records of
//! type 2).

use std::path::{Path, PathBuf};
use std::process::Command;

use sim::fabric::{Capture, LinkLayer};

use crate::common::*;
use crate::poster::*;

fn tshark() -> Option<PathBuf> {
    ["/usr/bin/tshark", "/usr/local/bin/tshark"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// `tshark -T fields` over `file` with the FCS and the IPv4/UDP checksums
/// checked. ERF Ethernet records always carry the FCS, but tshark 4.0
/// only guesses so for ERF in a classic pcap (no interface description
/// says it), and its guess fails on frames that need no padding: `erf`
/// tells it.
fn fields(ts: &Path, file: &Path, erf: bool, filter: &str, fields: &[&str]) -> Vec<String> {
    let mut c = Command::new(ts);
    c.env("HOME", std::env::temp_dir());
    c.arg("-r").arg(file);
    for o in [
        "eth.check_fcs:TRUE",
        "ip.check_checksum:TRUE",
        "udp.check_checksum:TRUE",
    ] {
        c.arg("-o").arg(o);
    }
    if erf {
        c.arg("-o").arg("eth.fcs:Always");
    }
    if !filter.is_empty() {
        c.arg("-Y").arg(filter);
    }
    c.arg("-T").arg("fields");
    for f in fields {
        c.arg("-e").arg(f);
    }
    let o = c.output().expect("tshark runs");
    assert!(
        o.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(String::from)
        .collect()
}

/// ARP, IPv4/UDP and an RC SEND over RoCE (with its ACK) between two
/// cards on the Ethernet switch, captured to `path`.
fn traffic(path: &Path) {
    let (mut hcas, _w, fab, _built) = on_switches(2, [LinkLayer::Eth, LinkLayer::Eth]);
    fab.lock()
        .unwrap()
        .set_capture(Some(Capture::create(path).unwrap()));
    let mut b = hcas.pop().unwrap();
    let mut a = hcas.pop().unwrap();
    let ida = eth_up(&mut a, 1);
    let idb = eth_up(&mut b, 1);
    settle(&a);
    let ca = a.cq(8);
    let mut cb = b.cq(8);
    let (mut tx, _) = raw_qp(&mut a, 0xa1, 1, ca.cqn);
    let buf = a.mr(0x10_0000_0000, 64 << 10, acc::ALL);
    // ARP request for 10.0.0.2 from 10.0.0.1 (broadcast).
    let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
    arp.extend_from_slice(&ida.0);
    arp.extend_from_slice(&[10, 0, 0, 1]);
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&[10, 0, 0, 2]);
    raw_send(
        &a,
        &mut tx,
        &buf,
        0,
        &frame([0xff; 6], ida.0, 0x0806, &arp),
        None,
        0,
    );
    // IPv4/UDP, checksums by the card.
    let mut ip = vec![0u8; 28 + 16];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&44u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
    ip[20..22].copy_from_slice(&40000u16.to_be_bytes());
    ip[22..24].copy_from_slice(&7u16.to_be_bytes());
    ip[24..26].copy_from_slice(&24u16.to_be_bytes());
    raw_send(
        &a,
        &mut tx,
        &buf,
        4096,
        &frame(idb.0, ida.0, 0x0800, &ip),
        None,
        1 << 4 | 1 << 5,
    );
    // RoCE RC SEND of 3000 bytes.
    let mut sa = QpSpec::new(RC, ca.cqn);
    let mut sb = QpSpec::new(RC, cb.cqn);
    // Path MTU 1024 (netdev MTU 1500): three packets.
    sa.mtu = 3;
    sb.mtu = 3;
    let mut qa = a.qp(0x80, sa);
    let mut qb = b.qp(0x90, sb);
    roce_connect(&mut a, &qa, sa, 0x90, RocePath::to(idb.0, idb.1)).unwrap();
    roce_connect(&mut b, &qb, sb, 0x80, RocePath::to(ida.0, ida.1)).unwrap();
    let rb = b.mr(0x20_0000_0000, 8192, acc::ALL);
    qb.post_recv(&[rb.sge(0, 4096)]);
    qa.post(&a, &Wr::send(vec![buf.sge(8192, 3000)]));
    assert_eq!(one(&b, &mut cb, false).byte_cnt, 3000);
    settle(&a);
    let mut f = fab.lock().unwrap();
    let c = f.set_capture(None).unwrap();
    assert!(c.error().is_none());
    drop(c);
    a.assert_no_violations();
}

fn check(ts: &Path, path: &Path, erf: bool) {
    let f = |filter: &str, names: &[&str]| fields(ts, path, erf, filter, names);
    let protos = f("", &["frame.protocols"]);
    assert!(
        protos.iter().any(|p| p.ends_with(":arp")),
        "ARP decoded: {protos:?}"
    );
    assert!(
        protos.iter().any(|p| p.contains(":ip:udp")),
        "IPv4/UDP decoded: {protos:?}"
    );
    let roce = f(
        "eth.type == 0x8915",
        &["infiniband.bth.opcode", "infiniband.bth.destqp"],
    );
    // SEND first, middle, last (MTU 1024) and the ACK (0x11).
    for op in ["0\t", "1\t", "2\t", "17\t"] {
        assert!(roce.iter().any(|l| l.starts_with(op)), "{op}: {roce:?}");
    }
    assert!(
        f(
            "_ws.malformed || _ws.expert.severity >= 6",
            &["frame.number"]
        )
        .is_empty(),
        "malformed or erroneous packets"
    );
    // Every frame (each crossing two cables) with a good FCS.
    let fcs = f("", &["eth.fcs.status"]);
    assert_eq!(fcs.len(), protos.len());
    assert!(fcs.iter().all(|s| s == "1"), "FCS good: {fcs:?}");
    // The IPv4 and UDP checksums the card computed are right (1: good).
    let csum = f("udp", &["ip.checksum.status", "udp.checksum.status"]);
    assert!(
        !csum.is_empty() && csum.iter().all(|l| l == "1\t1"),
        "{csum:?}"
    );
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sim-eth-capture-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn tshark_decodes_roce_arp_and_ipv4_in_pcapng_and_pcap() {
    let Some(ts) = tshark() else {
        eprintln!(
            "\n*** SKIPPED: tshark is not installed, the Ethernet capture was not dissected. \
             Install it with scripts/deps.sh (ensure_tshark) or apt-get install tshark. ***\n"
        );
        return;
    };
    for (name, erf) in [("eth.pcapng", false), ("eth.pcap", true)] {
        let p = temp(name);
        traffic(&p);
        if erf {
            let b = std::fs::read(&p).unwrap();
            assert_eq!(&b[20..24], &197u32.to_le_bytes(), "LINKTYPE_ERF");
        }
        check(&ts, &p, erf);
        let _ = std::fs::remove_file(&p);
    }
    let _ = std::fs::remove_dir(temp("x").parent().unwrap());
}
