//! Our SM against a misbehaving SM on the SM host: answers that do not match the request, a bogus GUID, a second master of the same priority that never hands over, and then falls silent.
//!
//! The "SM" is a raw ibsim client written here (attached to the SM host with
//! issm, as OpenSM attaches): every SMInfo our SM sends the SM host reaches it,
//! and it answers what the test says. Our SM must handle each answer as
//! OpenSM would (resend, ignore, wait for the handover with trap 144, take
//! over the wait when the other stops answering) and never stop sweeping.
//! Needs no packages (the server alone; no OpenSM, no umad2sim).

use tests::subnet_common;

use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ib_sm::SmConfig;
use ib_sm::ib_types::sm_state;
use sim::fabric::ibsim::{CTL_LEN, REQ_LEN, SIM_MAGIC, abstract_addr, ctl};
use sim::fabric::{Fabric, Topology};
use subnet_common::*;

const LIMIT: Duration = Duration::from_secs(30);
/// The SM host's port GUID.
const HOST_GUID: u64 = sim::fabric::ibsim::SM_HOST_GUID + 1;

struct Fake {
    ctl: UnixDatagram,
    data: UnixDatagram,
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

struct Net {
    a: Guest,
    b: Guest,
    osm: OpenSm,
    _fabric: Arc<Mutex<Fabric>>,
}

impl Net {
    fn round(&mut self) {
        self.osm.round(&mut [&mut self.a, &mut self.b]);
    }
}

/// Attaches the fake SM to the SM host (serving the control socket while
/// waiting for the reply).
fn attach(n: &mut Net, base: &str) -> Fake {
    let id = std::process::id() ^ 0x5a5a;
    let c = UnixDatagram::bind_addr(&abstract_addr(&format!("{base}:ctl{id}")).unwrap()).unwrap();
    c.connect_addr(&abstract_addr(&format!("{base}:ctl")).unwrap())
        .unwrap();
    c.set_nonblocking(true).unwrap();
    let d = UnixDatagram::bind_addr(&abstract_addr(&format!("{base}:in{id}")).unwrap()).unwrap();
    d.set_nonblocking(true).unwrap();
    let mut info = [0u8; 44];
    info[0..4].copy_from_slice(&id.to_le_bytes());
    info[8..12].copy_from_slice(&1u32.to_le_bytes());
    info[12..18].copy_from_slice(b"smhost");
    c.send(&ctl_msg(0, ctl::CONNECT, &info)).unwrap();
    let mut r = [0u8; CTL_LEN];
    let t = Instant::now();
    loop {
        n.round();
        if c.recv(&mut r).is_ok() {
            break;
        }
        assert!(t.elapsed() < LIMIT, "no CONNECT reply");
    }
    assert_eq!(u32::from_le_bytes([r[8], r[9], r[10], r[11]]), ctl::CONNECT);
    let slot = u32::from_le_bytes([r[16], r[17], r[18], r[19]]);
    d.connect_addr(&abstract_addr(&format!("{base}:out{slot}")).unwrap())
        .unwrap();
    Fake {
        ctl: c,
        data: d,
        slot,
    }
}

impl Fake {
    fn send(&self, dlid: u16, mad: &[u8; 256]) {
        let mut b = [0u8; REQ_LEN];
        b[0..2].copy_from_slice(&dlid.to_be_bytes());
        if dlid == 0xffff {
            b[4..6].copy_from_slice(&0xffffu16.to_be_bytes());
        }
        b[24..32].copy_from_slice(&256u64.to_be_bytes());
        b[32..].copy_from_slice(mad);
        self.data.send(&b).unwrap();
    }
    fn recv(&self) -> Option<[u8; 256]> {
        let mut b = [0u8; 512];
        let n = self.data.recv(&mut b).ok()?;
        (n == REQ_LEN).then(|| b[32..REQ_LEN].try_into().unwrap())
    }
    fn detach(self, n: &mut Net) {
        let _ = self.ctl.send(&ctl_msg(self.slot, ctl::DISCONNECT, &[]));
        for _ in 0..64 {
            n.round();
        }
    }
}

/// What the fake answers to an SMInfo request.
#[derive(Clone, Copy)]
enum Reply {
    /// A GetResp of another attribute (NodeInfo).
    WrongAttr,
    /// SMInfo naming a GUID that is not its port's.
    BogusGuid,
    /// SMInfo: master, priority 0.
    Master,
    /// Nothing.
    Silence,
}

/// Serves the fake until `done` or the limit; `reply(k)` says how to
/// answer the k-th SMInfo request. Returns (SMInfo requests seen, traps 144
/// received).
fn serve(
    n: &mut Net,
    fake: &Fake,
    limit: Duration,
    mut reply: impl FnMut(usize) -> Reply,
    mut done: impl FnMut(&mut Net, usize, usize) -> bool,
) -> (usize, usize) {
    let (mut asked, mut traps) = (0, 0);
    let t = Instant::now();
    while t.elapsed() < limit {
        for _ in 0..16 {
            n.round();
        }
        while let Some(m) = fake.recv() {
            let (class, meth, attr) = (m[1], m[3], u16::from_be_bytes([m[16], m[17]]));
            if meth == 0x05 && attr == 0x0002 {
                // A trap: note 144 (not repressed: a sloppy SM).
                if u16::from_be_bytes([m[64 + 4], m[64 + 5]]) == 144 {
                    traps += 1;
                }
                continue;
            }
            if meth != 0x01 || attr != 0x0020 {
                continue;
            }
            let k = asked;
            asked += 1;
            let mut r = m;
            r[3] = 0x81;
            if class == 0x81 {
                r[4] |= 0x80; // direction
            }
            r[64..128].fill(0);
            let smi = |guid: u64| {
                let mut d = [0u8; 24];
                d[0..8].copy_from_slice(&guid.to_be_bytes());
                d[8..16].copy_from_slice(&1u64.to_be_bytes());
                d[20] = sm_state::MASTER;
                d
            };
            match reply(k) {
                Reply::WrongAttr => r[16..18].copy_from_slice(&0x0011u16.to_be_bytes()),
                Reply::BogusGuid => r[64..88].copy_from_slice(&smi(0x1234)),
                Reply::Master => r[64..88].copy_from_slice(&smi(HOST_GUID)),
                Reply::Silence => continue,
            }
            fake.send(0xffff, &r);
        }
        if done(n, asked, traps) {
            break;
        }
    }
    (asked, traps)
}

#[test]
fn our_sm_survives_a_misbehaving_second_master() {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let (mut a, b) = sync_guests(&fabric, &built);
    let sm = ib_sm::init(&mut a.core);
    let osm = OpenSm::start("ksm-fake", &fabric, built.switches[0].1, false, &[]);
    let base = osm.base.clone();
    let mut n = Net {
        a,
        b,
        osm,
        _fabric: fabric,
    };
    let cfg = SmConfig {
        polling_timeout_ms: 300,
        polling_retries: 2,
        sweep_interval_ms: 1000,
        ..SmConfig::default()
    };
    let dev = n.a.dev;
    ib_sm::start(&mut n.a.core, sm, dev, 1, cfg).unwrap();
    let t = Instant::now();
    while !(n.a.active()
        && n.b.active()
        && n.osm
            .svc
            .server
            .node("smhost")
            .is_some_and(|h| h.lid() != 0))
    {
        n.round();
        assert!(t.elapsed() < LIMIT, "subnet up");
    }
    let our_lid = n.a.port(1).lid;
    // The fake SM attaches (IsSM on the SM host) and tells our SM with a
    // trap 144, as an SMA would.
    let fake = attach(&mut n, &base);
    let mut trap = [0u8; 256];
    trap[0..4].copy_from_slice(&[1, 0x01, 1, 0x05]);
    trap[8..16].copy_from_slice(&0x77u64.to_be_bytes());
    trap[16..18].copy_from_slice(&0x0002u16.to_be_bytes());
    trap[64] = 0x80 | 4;
    trap[68..70].copy_from_slice(&144u16.to_be_bytes());
    fake.send(our_lid, &trap);
    // First SMInfo answer: the wrong attribute; the resend gets a master
    // of priority 0 with a higher GUID than ours (we win the tie: we stay
    // master, poll it and tell it with trap 144 to hand over).
    let (asked, traps) = serve(
        &mut n,
        &fake,
        LIMIT,
        |k| {
            if k == 0 {
                Reply::WrongAttr
            } else {
                Reply::Master
            }
        },
        |n, _, traps| {
            traps >= 1
                && ib_sm::status(&mut n.a.core, sm, dev)
                    .is_some_and(|s| s.remote_sms.iter().any(|(g, _)| *g == HOST_GUID))
        },
    );
    let log = ib_sm::log(&mut n.a.core, sm, dev).unwrap().join("\n");
    let st = ib_sm::status(&mut n.a.core, sm, dev).unwrap();
    assert!(
        asked >= 2 && traps >= 1,
        "asked {asked}, traps {traps}:\n{log}"
    );
    assert!(st.smps.bad_answers >= 1 && st.smps.retried >= 1, "{st:?}");
    assert_eq!(st.state, sm_state::MASTER, "{log}");
    assert!(log.contains("Found remote master SM"), "{log}");
    // A bogus GUID is not taken for the SM; then silence: our SM stops
    // waiting and forces a heavy sweep.
    serve(
        &mut n,
        &fake,
        LIMIT,
        |k| {
            if k == 0 {
                Reply::BogusGuid
            } else {
                Reply::Silence
            }
        },
        |n, _, _| {
            ib_sm::log(&mut n.a.core, sm, dev)
                .is_some_and(|l| l.iter().any(|x| x.contains("stopped answering")))
        },
    );
    let log = ib_sm::log(&mut n.a.core, sm, dev).unwrap().join("\n");
    assert!(log.contains("ERR 2F13: Bogus SM port GUID"), "{log}");
    assert!(log.contains("stopped answering"), "{log}");
    let st = ib_sm::status(&mut n.a.core, sm, dev).unwrap();
    assert_eq!(st.state, sm_state::MASTER);
    assert!(n.a.active() && n.b.active());
    fake.detach(&mut n);
    let Net { a, b, osm, .. } = n;
    osm.stop();
    a.teardown();
    b.teardown();
}
