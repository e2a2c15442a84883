//! The capture, dissected by tshark.
//!
//! SMPs (directed route and LID routed), PMA GMPs, UD sends (with and without GRH),
//! RC and UC sends, an RDMA WRITE segmented over three MTUs, an RDMA READ with its
//! responses, atomics with their acknowledgement, ACKs and NAKs, all through a
//! switch (so each packet crosses two cables). Every frame must decode with its
//! headers, with no "Malformed" and no expert info.
//!
//! tshark is a Debian package (`scripts/deps.sh` `ensure_tshark`); when
//! it is missing the test installs nothing itself and says loudly that it
//! skipped the dissection.

use crate::common::Net;
use sim::fabric::packet::{self, Aeth, AtomicEth, Grh, Headers, Reth, aeth, attr, method, opcode};
use sim::fabric::{Capture, Packet};
use std::path::{Path, PathBuf};
use std::process::Command;

const MTU: usize = 256;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sim-fabric-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn hdr(op: u8, slid: u16, dlid: u16, psn: u32) -> Headers {
    let mut h = Headers::for_opcode(op).unwrap();
    h.lrh.slid = slid;
    h.lrh.dlid = dlid;
    h.bth.pkey = 0xffff;
    h.bth.dest_qp = 0x48;
    h.bth.psn = psn;
    h.bth.ack_req = true;
    h
}

/// The traffic of the capture, as (from node, packet) pairs; node 0 has
/// LID 1, node 1 LID 2. Returns the expected opcode sequence too.
fn traffic() -> Vec<(usize, Vec<u8>)> {
    let mut v = Vec::new();
    let mut push = |from: usize, h: Headers, payload: &[u8]| {
        v.push((from, packet::build(&h, payload).unwrap()));
    };
    // UD SEND, SEND with immediate, and one with a GRH.
    let mut h = hdr(opcode::UD_SEND_ONLY, 1, 2, 1);
    h.deth.as_mut().unwrap().qkey = 0x1111_1111;
    h.deth.as_mut().unwrap().src_qp = 0x49;
    push(0, h, b"hello over UD");
    let mut hi = hdr(opcode::UD_SEND_ONLY_IMM, 1, 2, 2);
    hi.imm = Some(0xdead_beef);
    push(0, hi, b"with immediate");
    let mut g = h;
    g.grh = Some(Grh {
        ip_ver: 6,
        nxt_hdr: packet::GRH_NXT_HDR_IBA,
        hop_lmt: 64,
        sgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 0, 0, 0x11],
        dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 0, 0, 0x21],
        ..Grh::default()
    });
    push(0, g, b"global route");
    // RC SEND over three packets, and SEND Only with immediate.
    let msg = vec![0x5a; 2 * MTU + 100];
    for (i, (op, chunk)) in [
        (opcode::SEND_FIRST, &msg[..MTU]),
        (opcode::SEND_MIDDLE, &msg[MTU..2 * MTU]),
        (opcode::SEND_LAST, &msg[2 * MTU..]),
    ]
    .into_iter()
    .enumerate()
    {
        push(0, hdr(op, 1, 2, 10 + i as u32), chunk);
    }
    let mut si = hdr(opcode::SEND_ONLY_IMM, 1, 2, 13);
    si.imm = Some(7);
    push(0, si, b"imm");
    push(
        1,
        hdr(opcode::ACKNOWLEDGE, 2, 1, 13).with_aeth(aeth::ack(0x1f), 4),
        b"",
    );
    // RDMA WRITE of 700 bytes segmented at the 256-byte MTU.
    let w = vec![0xa5; 700];
    let mut first = hdr(opcode::RDMA_WRITE_FIRST, 1, 2, 20);
    first.reth = Some(Reth {
        va: 0x7f00_0000_1000,
        rkey: 0x1234,
        dma_len: 700,
    });
    push(0, first, &w[..MTU]);
    push(
        0,
        hdr(opcode::RDMA_WRITE_MIDDLE, 1, 2, 21),
        &w[MTU..2 * MTU],
    );
    let mut last = hdr(opcode::RDMA_WRITE_LAST_IMM, 1, 2, 22);
    last.imm = Some(0x0102_0304);
    push(0, last, &w[2 * MTU..]);
    push(
        1,
        hdr(opcode::ACKNOWLEDGE, 2, 1, 22).with_aeth(aeth::ack(0x1f), 5),
        b"",
    );
    // RDMA READ of 600 bytes: request, then three responses.
    let mut rr = hdr(opcode::RDMA_READ_REQUEST, 1, 2, 30);
    rr.reth = Some(Reth {
        va: 0x7f00_0000_2000,
        rkey: 0x5678,
        dma_len: 600,
    });
    push(0, rr, b"");
    let r = vec![0x3c; 600];
    push(
        1,
        hdr(opcode::RDMA_READ_RESPONSE_FIRST, 2, 1, 30).with_aeth(aeth::ack(0x1f), 6),
        &r[..MTU],
    );
    push(
        1,
        hdr(opcode::RDMA_READ_RESPONSE_MIDDLE, 2, 1, 31),
        &r[MTU..2 * MTU],
    );
    push(
        1,
        hdr(opcode::RDMA_READ_RESPONSE_LAST, 2, 1, 32).with_aeth(aeth::ack(0x1f), 6),
        &r[2 * MTU..],
    );
    // Atomics and their acknowledgements.
    for (i, op) in [opcode::COMPARE_SWAP, opcode::FETCH_ADD]
        .into_iter()
        .enumerate()
    {
        let mut a = hdr(op, 1, 2, 40 + i as u32);
        a.atomic_eth = Some(AtomicEth {
            va: 0x7f00_0000_3000,
            rkey: 0x9abc,
            swap_add: 5,
            compare: if op == opcode::COMPARE_SWAP { 4 } else { 0 },
        });
        push(0, a, b"");
        let mut ack = hdr(opcode::ATOMIC_ACKNOWLEDGE, 2, 1, 40 + i as u32)
            .with_aeth(aeth::ack(0x1f), 7 + i as u32);
        ack.atomic_ack = Some(4);
        push(1, ack, b"");
    }
    // NAKs: remote access error, RNR, PSN sequence error.
    push(
        1,
        hdr(opcode::ACKNOWLEDGE, 2, 1, 50).with_aeth(aeth::NAK_REMOTE_ACCESS, 9),
        b"",
    );
    push(
        1,
        hdr(opcode::ACKNOWLEDGE, 2, 1, 51).with_aeth(aeth::rnr_nak(14), 9),
        b"",
    );
    push(
        1,
        hdr(opcode::ACKNOWLEDGE, 2, 1, 52).with_aeth(aeth::NAK_PSN_SEQ_ERROR, 9),
        b"",
    );
    // UC SEND.
    push(
        0,
        hdr(opcode::UC | opcode::SEND_ONLY, 1, 2, 60),
        b"unreliable connected",
    );
    v
}

trait WithAeth {
    fn with_aeth(self, syndrome: u8, msn: u32) -> Self;
}

impl WithAeth for Headers {
    fn with_aeth(mut self, syndrome: u8, msn: u32) -> Headers {
        self.aeth = Some(Aeth { syndrome, msn });
        self
    }
}

/// Writes a capture of everything above; returns its path and the number
/// of frames expected.
fn write_capture(name: &str) -> (PathBuf, usize) {
    let path = tmp(name);
    let mut n = Net::star(2);
    n.f.set_capture(Some(Capture::create(&path).unwrap()));
    // The SM's directed-route SMPs: 13 SMPs (PortInfo of port 0 Get and
    // Set, LFT Set, SwitchInfo Get and Set, two ports times two states
    // times Get and Set) and their responses, each over one cable.
    n.sm_bring_up(2, 10);
    let mut frames = 2 * 13;
    // A LID-routed SMP to the switch.
    let smp = packet::Smp::lid_routed(0x99, method::GET, attr::NODE_INFO, 0);
    let h = packet::mad_headers(10, 1, 0, 0, 0xffff);
    let p0 = n.port(0);
    let p1 = n.port(1);
    assert!(n.send(p0, packet::build(&h, &smp.to_bytes()).unwrap()));
    assert_eq!(n.drain(p0).len(), 1);
    frames += 2;
    // PMA: request and response, one cable each.
    n.pma(0, 10, method::GET, attr::PORT_COUNTERS, 1, 0);
    frames += 2;
    for (from, bytes) in traffic() {
        let (src, dst) = if from == 0 { (p0, p1) } else { (p1, p0) };
        assert!(n.f.transmit(src, Packet { bytes }, n.now));
        assert_eq!(n.drain(dst).len(), 1);
        frames += 2; // node -> switch, switch -> node
    }
    let mut c = n.f.set_capture(None).unwrap();
    c.flush().unwrap();
    assert_eq!(c.packets() as usize, frames);
    (path, frames)
}

fn tshark() -> Option<PathBuf> {
    ["/usr/bin/tshark", "/usr/local/bin/tshark"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn run_tshark(ts: &Path, args: &[&str]) -> String {
    let out = Command::new(ts)
        .args(args)
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("tshark runs");
    assert!(
        out.status.success(),
        "tshark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn dissect(path: &Path, frames: usize, pcapng: bool) {
    let Some(ts) = tshark() else {
        eprintln!(
            "\n*** SKIPPED: tshark is not installed, the capture was written but not dissected. \
             Install it with scripts/deps.sh (ensure_tshark) or apt-get install tshark. ***\n"
        );
        return;
    };
    let p = path.to_str().unwrap();
    let verbose = run_tshark(&ts, &["-r", p, "-V"]);
    assert!(
        !verbose.contains("Malformed"),
        "a malformed frame:\n{verbose}"
    );
    assert!(!verbose.contains("Expert Info"), "expert info:\n{verbose}");
    let fields = run_tshark(
        &ts,
        &[
            "-r",
            p,
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-e",
            "frame.protocols",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.lrh.pktlen",
            "-e",
            "frame.interface_name",
            "-e",
            "frame.packet_flags_direction",
            "-e",
            "infiniband.reth.dmalen",
            "-e",
            "infiniband.aeth.syndrome",
            "-e",
            "infiniband.atomiceth.swapdt",
            "-e",
            "infiniband.atomicacketh.origremdt",
            "-e",
            "infiniband.mad.attributeid",
            "-e",
            "infiniband.grh.hoplmt",
            "-e",
            "infiniband.deth.q_key",
            "-e",
            "infiniband.immdt",
            "-e",
            "_ws.col.Info",
        ],
    );
    let rows: Vec<Vec<&str>> = fields.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), frames, "every packet is a frame");
    let mut seen = std::collections::BTreeSet::new();
    for r in &rows {
        assert!(
            r[0].contains("erf:infiniband"),
            "decoded as InfiniBand: {r:?}"
        );
        assert!(
            !r[13].contains("Malformed") && !r[13].contains("Invalid"),
            "{r:?}"
        );
        let op: u8 = r[1]
            .parse()
            .unwrap_or_else(|_| panic!("BTH opcode in {r:?}"));
        seen.insert(op);
        let need = |i: usize, what: &str| assert!(!r[i].is_empty(), "{what} decoded in {r:?}");
        let l = packet::layout(op).unwrap();
        if l.reth {
            need(5, "RETH");
        }
        if l.aeth {
            need(6, "AETH");
        }
        if l.atomic_eth {
            need(7, "AtomicETH");
        }
        if l.atomic_ack_eth {
            need(8, "AtomicAckETH");
        }
        if l.deth {
            need(11, "DETH");
        }
        if l.imm {
            need(12, "ImmDt");
        }
        if pcapng {
            assert!(r[3].contains(" <-> "), "link named: {r:?}");
            assert!(
                r[4] == "0x00000001" || r[4] == "0x00000002",
                "direction: {r:?}"
            );
        }
    }
    assert!(rows.iter().any(|r| !r[10].is_empty()), "a GRH decoded");
    for (a, what) in [
        ("0x0011", "NodeInfo"),
        ("0x0015", "PortInfo"),
        ("0x0019", "LinearForwardingTable"),
        ("0x0012", "SwitchInfo or PortCounters"),
    ] {
        assert!(
            rows.iter().filter(|r| r[9] == a).count() >= 2,
            "{what} MADs decoded"
        );
    }
    assert!(
        rows.iter()
            .any(|r| r[9] == "0x0012" && r[13].contains("PERF")),
        "PMA decoded"
    );
    for op in [
        opcode::UD_SEND_ONLY,
        opcode::SEND_FIRST,
        opcode::SEND_MIDDLE,
        opcode::SEND_LAST,
        opcode::RDMA_WRITE_FIRST,
        opcode::RDMA_WRITE_MIDDLE,
        opcode::RDMA_WRITE_LAST_IMM,
        opcode::RDMA_READ_REQUEST,
        opcode::RDMA_READ_RESPONSE_FIRST,
        opcode::RDMA_READ_RESPONSE_MIDDLE,
        opcode::RDMA_READ_RESPONSE_LAST,
        opcode::COMPARE_SWAP,
        opcode::FETCH_ADD,
        opcode::ATOMIC_ACKNOWLEDGE,
        opcode::ACKNOWLEDGE,
    ] {
        assert!(seen.contains(&op), "opcode {op:#x} in the capture");
    }
    // The NAKs decode as NAKs.
    // (tshark prints the syndrome in decimal: 0x62 = 98, 0x2e = 46, 0x60 = 96.)
    let naks = rows
        .iter()
        .filter(|r| ["98", "46", "96"].contains(&r[6]))
        .count();
    assert_eq!(naks, 3 * 2, "three NAKs, each over two cables");
    assert_eq!(
        rows.iter()
            .filter(|r| r[13].contains("[Remote Access Error]"))
            .count(),
        2
    );
    assert_eq!(
        rows.iter()
            .filter(|r| r[13].contains("[PSN Sequence Error]"))
            .count(),
        2
    );
}

#[test]
fn capture_pcapng_dissected_by_tshark() {
    let (path, frames) = write_capture("fabric.pcapng");
    dissect(&path, frames, true);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(path.parent().unwrap());
}

#[test]
fn capture_classic_pcap_dissected_by_tshark() {
    let (path, frames) = write_capture("fabric.pcap");
    let b = std::fs::read(&path).unwrap();
    assert_eq!(&b[0..4], &0xa1b2_c3d4u32.to_le_bytes());
    assert_eq!(&b[20..24], &197u32.to_le_bytes(), "LINKTYPE_ERF");
    dissect(&path, frames, false);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(path.parent().unwrap());
}

#[test]
fn capture_write_error_stops_the_capture_not_the_fabric() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return;
    };
    drop(full);
    let mut n = Net::star(2);
    n.f.set_capture(Some(Capture::create(Path::new("/dev/full")).unwrap()));
    for _ in 0..2000 {
        let _ = n.dr(0, &[1], method::GET, attr::NODE_INFO, 0, &[0; 64]);
    }
    let c = n.f.capture_mut().unwrap();
    assert!(c.flush().is_err());
    assert!(c.error().unwrap().contains("capture stopped"));
}
