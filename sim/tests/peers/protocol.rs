//! The ibsim protocol itself, driven by a raw client written from
//! real-peers.md's layouts (no packages needed): control messages, MADs
//! answered by host nodes and the switch, TIDs, timeouts, bad input.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use sim::fabric::ibsim::{CTL_LEN, ETIMEDOUT, REQ_LEN, SIM_MAGIC, abstract_addr, ctl};

use crate::rig::{NET_SMALL, Rig};

pub(crate) const WAIT: Duration = Duration::from_secs(5);

pub(crate) struct RawClient {
    ctl: UnixDatagram,
    pub(crate) data: UnixDatagram,
    slot: u32,
}

fn ctl_msg(slot: u32, ty: u32, data: &[u8]) -> [u8; CTL_LEN] {
    let mut m = [0u8; CTL_LEN];
    m[0..4].copy_from_slice(&SIM_MAGIC.to_le_bytes());
    m[4..8].copy_from_slice(&slot.to_le_bytes());
    m[8..12].copy_from_slice(&ty.to_le_bytes());
    m[12..16].copy_from_slice(&(data.len() as u32).to_le_bytes());
    m[16..16 + data.len()].copy_from_slice(data);
    m
}

fn ty(r: &[u8]) -> u32 {
    u32::from_le_bytes([r[8], r[9], r[10], r[11]])
}

/// Binds and connects like umad2sim; `Err` carries the CONNECT reply.
pub(crate) fn connect(
    base: &str,
    id: u32,
    node: &str,
    issm: bool,
) -> Result<RawClient, [u8; CTL_LEN]> {
    let c = UnixDatagram::bind_addr(&abstract_addr(&format!("{base}:ctl{id}")).unwrap()).unwrap();
    c.connect_addr(&abstract_addr(&format!("{base}:ctl")).unwrap())
        .unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    let d = UnixDatagram::bind_addr(&abstract_addr(&format!("{base}:in{id}")).unwrap()).unwrap();
    d.set_read_timeout(Some(WAIT)).unwrap();
    let mut info = [0u8; 44];
    info[0..4].copy_from_slice(&id.to_le_bytes());
    info[8..12].copy_from_slice(&u32::from(issm).to_le_bytes());
    info[12..12 + node.len()].copy_from_slice(node.as_bytes());
    c.send(&ctl_msg(0, ctl::CONNECT, &info)).unwrap();
    let mut r = [0u8; CTL_LEN];
    assert_eq!(c.recv(&mut r).expect("CONNECT reply"), CTL_LEN);
    if ty(&r) != ctl::CONNECT {
        return Err(r);
    }
    let slot = u32::from_le_bytes([r[16], r[17], r[18], r[19]]);
    d.connect_addr(&abstract_addr(&format!("{base}:out{slot}")).unwrap())
        .unwrap();
    Ok(RawClient {
        ctl: c,
        data: d,
        slot,
    })
}

impl RawClient {
    pub(crate) fn ctl(&self, ty_: u32, data: &[u8]) -> [u8; CTL_LEN] {
        self.ctl.send(&ctl_msg(self.slot, ty_, data)).unwrap();
        let mut r = [0u8; CTL_LEN];
        assert_eq!(self.ctl.recv(&mut r).expect("ctl reply"), CTL_LEN);
        r
    }
    pub(crate) fn send(&self, dlid: u16, dqp: u32, mad: &[u8; 256]) {
        let mut b = [0u8; REQ_LEN];
        b[0..2].copy_from_slice(&dlid.to_be_bytes());
        if dlid == 0xffff {
            b[4..6].copy_from_slice(&0xffffu16.to_be_bytes());
        }
        b[8..12].copy_from_slice(&dqp.to_be_bytes());
        b[12..16].copy_from_slice(&dqp.min(1).to_be_bytes());
        b[24..32].copy_from_slice(&256u64.to_be_bytes());
        b[32..].copy_from_slice(mad);
        let t = Instant::now();
        loop {
            match self.data.send(&b) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && t.elapsed() < WAIT => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("send to the server: {e}"),
            }
        }
    }
    /// (status, MAD) of the next message, or `None` after the wait.
    pub(crate) fn recv(&self) -> Option<(u32, [u8; 256])> {
        let mut b = [0u8; 512];
        let n = self.data.recv(&mut b).ok()?;
        assert_eq!(n, REQ_LEN, "the server sends 288-byte messages");
        let mut mad = [0u8; 256];
        mad.copy_from_slice(&b[32..REQ_LEN]);
        Some((u32::from_be_bytes([b[16], b[17], b[18], b[19]]), mad))
    }
}

/// A directed-route SMP along `path` (empty: this node).
pub(crate) fn dr_smp(
    meth: u8,
    tid: u64,
    attr: u16,
    amod: u32,
    path: &[u8],
    data: &[u8],
) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[0] = 1;
    m[1] = 0x81;
    m[2] = 1;
    m[3] = meth;
    m[7] = path.len() as u8; // hop count; hop pointer 0
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    m[20..24].copy_from_slice(&amod.to_be_bytes());
    m[32..36].fill(0xff); // permissive DrSLID, DrDLID
    m[64..64 + data.len()].copy_from_slice(data);
    m[129..129 + path.len()].copy_from_slice(path);
    m
}

pub(crate) fn tid_of(m: &[u8; 256]) -> u64 {
    u64::from_be_bytes(m[8..16].try_into().unwrap())
}

#[test]
fn control_messages_describe_the_node() {
    let rig = Rig::start("ctl", NET_SMALL);
    let c = connect(&rig.base, 70001, "H2", false).expect("connect to H2");
    let r = c.ctl(ctl::GET_NODEINFO, &[0; 64]);
    assert_eq!(ty(&r), ctl::GET_NODEINFO);
    let ni = &r[16..];
    assert_eq!(ni[2], 1, "a CA");
    assert_eq!(
        &ni[12..20],
        &0x0002_c903_0000_0020u64.to_be_bytes(),
        "node GUID"
    );
    assert_eq!(
        &ni[20..28],
        &0x0002_c903_0000_0021u64.to_be_bytes(),
        "port GUID"
    );
    let r = c.ctl(ctl::GET_PORTINFO, &[0; 64]);
    assert_eq!(r[16 + 28], 1, "LocalPortNum");
    assert_eq!(r[16 + 32] & 0xf, 2, "Init: the link is up, no SM yet");
    let r = c.ctl(ctl::GET_PKEYS, &[0; 64]);
    assert_eq!(&r[16..18], &[0xff, 0xff], "P_Key 0 is the default");
    let r = c.ctl(ctl::GET_VENDOR, &[0; 24]);
    assert_eq!(
        &r[16..24],
        &[0xc9, 0x02, 0, 0, 0x03, 0x10, 0, 0],
        "vendor, part (host order)"
    );
    let r = c.ctl(ctl::GET_PORT, &[0; 4]);
    assert_eq!((r[16], r[17], r[18]), (0, 0, 2), "LID 0, Init");

    let e = connect(&rig.base, 70002, "nowhere", false)
        .err()
        .expect("unknown node refused");
    assert_eq!(ty(&e), ctl::ERROR);
    // A control message with a bad magic gets an ERROR reply, not silence.
    let mut bad = ctl_msg(c.slot, ctl::GET_PORT, &[]);
    bad[0] = 0;
    c.ctl.send(&bad).unwrap();
    let mut r = [0u8; CTL_LEN];
    c.ctl.recv(&mut r).expect("a reply");
    assert_eq!(ty(&r), ctl::ERROR);
    let clients = rig.world().server.clients();
    assert_eq!(clients.len(), 1);
    assert_eq!(clients[0].node, "H2");
    c.ctl(ctl::DISCONNECT, &[]);
    assert!(rig.wait_for(WAIT, |w| w.server.clients().is_empty()));
}

#[test]
fn one_sm_per_node() {
    let rig = Rig::start("issm", NET_SMALL);
    let a = connect(&rig.base, 71001, "H1", true).expect("first SM");
    assert_eq!(
        ty(&connect(&rig.base, 71002, "H1", true)
            .err()
            .expect("second SM refused")),
        ctl::ERROR
    );
    let b = connect(&rig.base, 71003, "H1", false).expect("a diag may attach beside it");
    assert_eq!(
        ty(&b.ctl(ctl::SET_ISSM, &1u32.to_le_bytes())),
        ctl::ERROR,
        "SET_ISSM refused too"
    );
    let pi = a.ctl(ctl::GET_PORTINFO, &[0; 64]);
    assert_ne!(pi[16 + 23] & 0x02, 0, "IsSM set in the CapabilityMask");
    a.ctl(ctl::DISCONNECT, &[]);
    let pi = b.ctl(ctl::GET_PORTINFO, &[0; 64]);
    assert_eq!(pi[16 + 23] & 0x02, 0, "IsSM cleared when the SM left");
    assert_eq!(
        ty(&b.ctl(ctl::SET_ISSM, &1u32.to_le_bytes())),
        ctl::SET_ISSM
    );
}

#[test]
fn smps_are_answered_across_the_fabric_with_the_callers_tid() {
    let rig = Rig::start("smp", NET_SMALL);
    let c = connect(&rig.base, 72001, "H1", false).unwrap();
    // Upper TID bits are the client's (umad2sim's agent id lives there).
    let tid = 0x1234_5678_9abc_def0;
    c.send(0xffff, 0, &dr_smp(1, tid, 0x11, 0, &[], &[]));
    let (st, m) = c.recv().expect("zero-hop NodeInfo");
    assert_eq!(st, 0);
    assert_eq!((m[3], m[4] & 0x80), (0x81, 0x80), "GetResp with the D bit");
    assert_eq!(tid_of(&m), tid, "the caller's TID, all 64 bits");
    assert_eq!(
        &m[64 + 12..64 + 20],
        &0x0002_c903_0000_0010u64.to_be_bytes()
    );

    c.send(0xffff, 0, &dr_smp(1, 7, 0x11, 0, &[1], &[]));
    let (st, m) = c.recv().expect("NodeInfo of the switch");
    assert_eq!(
        (st, m[64 + 2], m[64 + 36]),
        (0, 2, 1),
        "a switch, reached on its port 1"
    );
    assert_eq!(m[6], 0, "delivered with hop pointer 0, as ibsim does");

    c.send(0xffff, 0, &dr_smp(1, 8, 0x10, 0, &[1, 3], &[]));
    let (st, m) = c.recv().expect("NodeDescription two hops away");
    assert_eq!(st, 0);
    assert_eq!(&m[64..66], b"H3");
    assert_eq!(
        m[192 + 1],
        1,
        "return path filled at the switch (in on port 1)"
    );
    assert_eq!(tid_of(&m), 8);
    let s = rig.world().server.stats().clone();
    assert_eq!(s.client_smps, 3);
    assert_eq!(rig.world().server.pending(), 0);
}

#[test]
fn port_info_set_walks_the_state_machine() {
    let rig = Rig::start("pi", NET_SMALL);
    let c = connect(&rig.base, 73001, "H2", false).unwrap();
    let mut pi = [0u8; 64];
    pi[16..18].copy_from_slice(&5u16.to_be_bytes()); // LID 5
    pi[18..20].copy_from_slice(&1u16.to_be_bytes()); // SM LID 1
    pi[32] = 4; // Active straight from Init: refused
    c.send(0xffff, 0, &dr_smp(2, 1, 0x15, 1, &[], &pi));
    let (_, m) = c.recv().unwrap();
    assert_eq!(
        u16::from_be_bytes([m[4], m[5]]) & 0x7fff,
        0x001c,
        "invalid field"
    );
    assert_eq!(m[64 + 32] & 0xf, 2, "still Init");
    assert_eq!(&m[64 + 16..64 + 18], &[0, 0], "and nothing else changed");
    for (state, want) in [(3u8, 3u8), (4, 4)] {
        pi[32] = state;
        c.send(0xffff, 0, &dr_smp(2, 2, 0x15, 0x8000_0001, &[], &pi));
        let (_, m) = c.recv().unwrap();
        assert_eq!(
            u16::from_be_bytes([m[4], m[5]]) & 0x7fff,
            0,
            "state {state} accepted"
        );
        assert_eq!(m[64 + 32] & 0xf, want);
    }
    let r = c.ctl(ctl::GET_PORT, &[0; 4]);
    assert_eq!(
        (u16::from_le_bytes([r[16], r[17]]), r[18]),
        (5, 4),
        "LID 5, Active"
    );
}

#[test]
fn requests_nobody_answers_come_back_with_status_110() {
    let rig = Rig::start("bounce", NET_SMALL);
    rig.world().server.timeout = Duration::from_millis(50);
    let c = connect(&rig.base, 74001, "H1", false).unwrap();
    // Out of switch port 7, which has no cable: the switch drops it.
    let t = Instant::now();
    c.send(0xffff, 0, &dr_smp(1, 0xabc, 0x11, 0, &[1, 7], &[]));
    let (st, m) = c.recv().expect("bounced");
    assert_eq!(st, ETIMEDOUT);
    assert_eq!(tid_of(&m), 0xabc, "the original request, TID as sent");
    assert_eq!(m[3], 1, "still the request");
    assert!(
        t.elapsed() >= Duration::from_millis(50),
        "after the timeout"
    );
    assert_eq!(rig.world().server.stats().timeouts, 1);
    // Not routable from here at all (initial path names port 2 of a
    // one-port CA): at once.
    c.send(0xffff, 0, &dr_smp(1, 0xabd, 0x11, 0, &[2], &[]));
    let (st, m) = c.recv().expect("bounced at once");
    assert_eq!((st, tid_of(&m)), (ETIMEDOUT, 0xabd));
    // A bad class version.
    let mut bad = dr_smp(1, 0xabe, 0x11, 0, &[], &[]);
    bad[2] = 9;
    c.send(0xffff, 0, &bad);
    assert_eq!(c.recv().map(|x| x.0), Some(ETIMEDOUT));
    // A message of the wrong size is dropped and counted.
    c.data.send(&[0u8; 100]).unwrap();
    assert!(rig.wait_for(WAIT, |w| {
        w.server
            .stats()
            .dropped
            .contains_key("client message not 288 bytes")
    }));
    assert_eq!(rig.world().server.pending(), 0);
}

#[test]
fn a_client_that_dies_loses_its_slot() {
    let rig = Rig::start("dead", NET_SMALL);
    rig.world().server.timeout = Duration::from_millis(30);
    let c = connect(&rig.base, 75001, "H1", false).unwrap();
    c.send(0xffff, 0, &dr_smp(1, 1, 0x11, 0, &[1, 7], &[]));
    drop(c); // no DISCONNECT: its sockets are simply gone
    assert!(
        rig.wait_for(WAIT, |w| w.server.clients().is_empty()),
        "the slot is freed when the bounce cannot be delivered"
    );
    assert!(connect(&rig.base, 75002, "H1", false).is_ok());
}

#[test]
fn the_host_command_runs_a_diag_on_the_fabric() {
    if !crate::rig::tools_present("the_host_command_runs_a_diag_on_the_fabric") {
        return;
    }
    let rig = Rig::start("hostcmd", NET_SMALL);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ib-host.sh");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(script)
            .args(args)
            .env_remove("IBSIM_SOCKNAME")
            .output()
            .expect("run scripts/ib-host.sh");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    // Zero hops (the node itself) and one hop (the switch): no SM needed.
    let (rc, out) = run(&[
        "--sock",
        &rig.base,
        "--host",
        "H2",
        "--timeout",
        "20",
        "smpquery",
        "-D",
        "nodedesc",
        "0",
    ]);
    assert_eq!(rc, Some(0), "{out}");
    assert!(out.contains("H2"), "{out}");
    let (rc, out) = run(&[
        "--sock",
        &rig.base,
        "--timeout",
        "20",
        "smpquery",
        "-D",
        "nodedesc",
        "0,1",
    ]);
    assert_eq!(rc, Some(0), "{out}");
    assert!(out.contains("Sw1"), "{out}");
    // No fabric under that name: a clear error, not a hang.
    let (rc, out) = run(&["--sock", "no-such-fabric", "sminfo"]);
    assert_eq!(rc, Some(2), "{out}");
    assert!(
        out.contains("no fabric is serving socket 'no-such-fabric'"),
        "{out}"
    );
}

#[test]
fn garbage_from_clients_leaves_the_server_serving() {
    let rig = Rig::start("garbage", NET_SMALL);
    rig.world().server.timeout = Duration::from_millis(20);
    let c = connect(&rig.base, 76001, "H1", false).unwrap();
    c.data.set_nonblocking(true).unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..3000u64 {
        let mut mad = [0u8; 256];
        for b in mad.iter_mut() {
            *b = next() as u8;
        }
        mad[0] = 1;
        mad[1] = [0x01, 0x81, 0x04, 0x03, 0x07][(i % 5) as usize];
        mad[2] = (i % 3) as u8;
        let dlid = if i % 2 == 0 {
            0xffff
        } else {
            (next() % 8) as u16
        };
        c.send(dlid, (next() % 3) as u32, &mad);
        let mut sink = [0u8; 512];
        while c.data.recv(&mut sink).is_ok() {}
    }
    // Control garbage from a socket that never connected.
    let stray = UnixDatagram::unbound().unwrap();
    stray
        .connect_addr(&abstract_addr(&format!("{}:ctl", rig.base)).unwrap())
        .unwrap();
    for i in 0..200u64 {
        let mut m = [0u8; CTL_LEN];
        for b in m.iter_mut() {
            *b = next() as u8;
        }
        if i % 2 == 0 {
            m[0..4].copy_from_slice(&SIM_MAGIC.to_le_bytes());
            m[8..12].copy_from_slice(&((i % 12) as u32).to_le_bytes());
        }
        let _ = stray.send(&m[..(i as usize % CTL_LEN) + 1]);
    }
    assert!(
        rig.wait_for(WAIT, |w| w.server.pending() == 0),
        "every request answered or timed out"
    );
    // Still serving: a plain zero-hop NodeInfo.
    c.data.set_nonblocking(false).unwrap();
    let mut sink = [0u8; 512];
    c.data
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    while c.data.recv(&mut sink).is_ok() {}
    c.data.set_read_timeout(Some(WAIT)).unwrap();
    c.send(0xffff, 0, &dr_smp(1, 0x5151, 0x11, 0, &[], &[]));
    let (st, m) = c.recv().expect("answered after the garbage");
    assert_eq!((st, tid_of(&m)), (0, 0x5151));
    let s = rig.world().server.stats().clone();
    assert!(s.from_clients >= 3000, "{s:?}");
    eprintln!("after 3000 random MADs: {s:?}");
}
