//! The real OpenSM brings driver-run HCAs to Active.
//!
//! The real OpenSM (Debian's, under the umad2sim preload, attached through the
//! fabric's ibsim server as the SM host on the switch's last port) brings
//! driver-run HCAs to Active: two model HCAs with the real mlx4_core + mlx4_ib +
//! ib_core on the `--nodes 2` topology, every SMP OpenSM sends to them crossing the
//! fabric into their QP0 and answered by ib_core's agent and mlx4_ib (MAD_IFC). The
//! real diags query them. Skipped loudly without the packages (`scripts/deps.sh
//! ensure_ib_peers`).

use tests::subnet_common;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ib_core::verbs::{EventType, PortState};
use sim::fabric::{Capture, Fabric, PortId, Topology};
use subnet_common::*;

const UP_LIMIT: Duration = Duration::from_secs(20);

struct Net {
    fabric: Arc<Mutex<Fabric>>,
    a: Guest,
    b: Guest,
    sm: OpenSm,
    /// Port GUIDs of the guests' port 1.
    guids: [u64; 2],
    /// Fabric ports of the guests' port 1.
    ports: [PortId; 2],
}

fn net(test: &str, args: &[&str]) -> Net {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let (a, b) = sync_guests(&fabric, &built);
    let sm = OpenSm::start(test, &fabric, built.switches[0].1, true, args);
    // Every packet on every cable, from OpenSM's first SMP on (the
    // service is polled only by the test's rounds, none has run yet).
    let cap = Capture::create(&sm.dir.join("subnet.pcapng")).expect("capture file");
    fabric.lock().unwrap().set_capture(Some(cap));
    let guids = [built.hcas[0].node_guid + 1, built.hcas[1].node_guid + 1];
    let ports = [built.hcas[0].ports[0], built.hcas[1].ports[0]];
    Net {
        ports,
        fabric,
        a,
        b,
        sm,
        guids,
    }
}

fn up(n: &mut Net) -> Duration {
    let t = Instant::now();
    let ok =
        n.sm.pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 256, |sm, g| {
            sm.subnet_ups() >= 1 && g.iter_mut().all(|g| g.active())
        });
    assert!(
        ok,
        "SUBNET UP and both ports Active within {UP_LIMIT:?}; OpenSM log:\n{}",
        n.sm.log()
    );
    t.elapsed()
}

/// An SMP OpenSM timed out (ERR 3120) is not counted a failure: on a
/// loaded machine the test's thread can be off the CPU longer than
/// OpenSM's 200 ms; what matters (every SMP that reached a guest answered,
/// the ports Active) is asserted apart. It is reported loudly.
fn warn_timeouts(log: &str) {
    let n = log.matches("ERR 3120").count();
    if n > 0 {
        eprintln!("!!!!! OpenSM timed out {n} SMP(s) (ERR 3120): a loaded machine?");
    }
}

/// OpenSM's LID of each port GUID, from its `guid2lid` cache file.
fn guid2lid(sm: &OpenSm) -> Vec<(u64, u16)> {
    let text = std::fs::read_to_string(sm.dir.join("guid2lid")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let g = u64::from_str_radix(w.next()?.trim_start_matches("0x"), 16).ok()?;
            let lid = u16::from_str_radix(w.next()?.trim_start_matches("0x"), 16).ok()?;
            Some((g, lid))
        })
        .collect()
}

/// The LID OpenSM gave port GUID `g`: its cache file is written at the
/// end of a sweep, so wait for it a little (serving).
fn opensm_lid(n: &mut Net, g: u64) -> u16 {
    let mut lid = 0;
    n.sm.pump_until(
        &mut [&mut n.a, &mut n.b],
        Duration::from_secs(5),
        64,
        |sm, _| {
            lid = guid2lid(sm)
                .iter()
                .find(|(x, _)| *x == g)
                .map_or(0, |x| x.1);
            lid != 0
        },
    );
    lid
}

#[test]
fn opensm_brings_two_driver_run_hcas_to_active() {
    if !peers_present("opensm_brings_two_driver_run_hcas_to_active") {
        return;
    }
    let mut n = net("up", &[]);
    let t = up(&mut n);
    let smps = n.sm.svc.server.stats().client_smps;
    let sm_lid = n.sm.svc.server.node("smhost").expect("SM host").lid();
    eprintln!(
        "OpenSM: both driver-run ports Active {t:?} after exec; {smps} SMPs from OpenSM so far"
    );
    assert_ne!(sm_lid, 0, "OpenSM's own port has a LID");
    let guids = [n.guids[0], n.guids[1]];
    let want = [opensm_lid(&mut n, guids[0]), opensm_lid(&mut n, guids[1])];
    let log = n.sm.log();
    for (k, g) in [&mut n.a, &mut n.b].into_iter().enumerate() {
        let name = g.name.clone();
        let p = g.port(1);
        assert_eq!(p.state, PortState::Active, "{name}: {p:?}");
        assert_ne!(want[k], 0, "{name}: OpenSM assigned a LID (guid2lid)");
        assert_eq!(p.lid, want[k], "{name}: query_port shows OpenSM's LID");
        assert_eq!(p.sm_lid, sm_lid, "{name}: SM LID is OpenSM's port");
        let c = g.core.device(g.dev).unwrap().port_cache(1).unwrap();
        assert_eq!((c.lid, c.sm_lid), (p.lid, sm_lid), "{name}: port cache");
        let ev = g.events();
        for e in [EventType::LidChange, EventType::PortActive] {
            assert!(
                ev.contains(&(e, 1)),
                "{name}: {e:?} reached the client: {ev:?}"
            );
        }
        // OpenSM's SMPs really reached this guest's QP0: its MAD layer
        // handed them to mlx4_ib's process_mad (MAD_IFC) and sent the
        // answers; nothing was dropped on the way in.
        let m = g.core.mad_counters(g.dev, 1).expect("MAD port 1");
        assert!(
            m.process_mad_replies >= 10,
            "{name}: SMPs answered through MAD_IFC: {m:?}"
        );
        assert_eq!(
            (m.drop_smi, m.drop_wrong_qp, m.drop_no_agent, m.send_errors),
            (0, 0, 0, 0),
            "{name}: {m:?}"
        );
        eprintln!(
            "{name}: LID {} events {ev:?}; {} SMPs answered",
            p.lid, m.process_mad_replies
        );
    }
    assert_ne!(want[0], want[1], "distinct LIDs");
    // The SMPs crossed the guests' cables as packets (VL15, QP0), and
    // tshark reads them so.
    let answered = [
        n.a.core
            .mad_counters(n.a.dev, 1)
            .unwrap()
            .process_mad_replies,
        n.b.core
            .mad_counters(n.b.dev, 1)
            .unwrap()
            .process_mad_replies,
    ];
    let pcap = n.sm.dir.join("subnet.pcapng");
    n.fabric
        .lock()
        .unwrap()
        .capture_mut()
        .expect("capture")
        .flush()
        .expect("capture written");
    if Path::new("/usr/bin/tshark").exists() {
        let out = Command::new("/usr/bin/tshark")
            .arg("-r")
            .arg(&pcap)
            .args(["-Y", "infiniband.mad.mgmtclass == 0x81"])
            .args(["-T", "fields", "-e", "frame.interface_name"])
            .args(["-e", "infiniband.lrh.vl", "-e", "infiniband.bth.destqp"])
            .args(["-e", "infiniband.mad.method"])
            .output()
            .expect("tshark");
        let text = String::from_utf8_lossy(&out.stdout);
        for (k, node) in ["node0/1", "node1/1"].into_iter().enumerate() {
            let smps: Vec<&str> = text.lines().filter(|l| l.contains(node)).collect();
            assert!(
                smps.len() as u64 >= 2 * answered[k],
                "{node}: each of the {} answered SMPs crossed its cable twice: {} captured",
                answered[k],
                smps.len()
            );
            assert!(
                smps.iter()
                    .all(|l| l.contains("\t15\t0\t") || l.contains("\t0x0f\t0x000000\t")),
                "{node}: VL15 to QP0:\n{}",
                smps.join("\n")
            );
            // Every request that reached the guest was answered (late or
            // not): as many GetResp as Get and Set.
            let resp = smps.iter().filter(|l| l.ends_with("\t0x81")).count();
            assert_eq!(
                2 * resp,
                smps.len(),
                "{node}: one GetResp per request:\n{}",
                smps.join("\n")
            );
        }
    } else {
        eprintln!("!!!!! tshark missing: the capture was not dissected");
    }
    assert!(
        !log.contains("ERR 0F10"),
        "OpenSM logged no refused SubnSet (ERR 0F10):\n{log}"
    );
    warn_timeouts(&log);
    let Net { a, b, sm, .. } = n;
    sm.stop();
    a.teardown();
    b.teardown();
}

/// The value of a `Name:.....value` line of the diags.
fn field(out: &str, name: &str) -> String {
    out.lines()
        .map(str::trim)
        .find_map(|l| {
            let rest = l.strip_prefix(name)?;
            rest.starts_with([':', '.'])
                .then(|| rest.trim_start_matches([':', '.']).trim().to_string())
        })
        .unwrap_or_default()
}

fn counter(out: &str, name: &str) -> u64 {
    field(out, name)
        .parse()
        .unwrap_or_else(|_| panic!("no {name} in\n{out}"))
}

const DIAG_LIMIT: Duration = Duration::from_secs(20);

#[test]
fn diags_and_the_sa_query_driver_run_guests() {
    if !peers_present("diags_and_the_sa_query_driver_run_guests") {
        return;
    }
    let mut n = net("diags", &[]);
    up(&mut n);
    let (la, lb) = (n.a.port(1).lid, n.b.port(1).lid);
    let descs = [
        ib_tools::diags::node_desc_string(n.a.ib().node_desc()),
        ib_tools::diags::node_desc_string(n.b.ib().node_desc()),
    ];
    let Net { a, b, sm, .. } = &mut n;
    let mut g = [a, b];

    // ibnetdiscover walks the fabric by directed route: the switch, both
    // guests (NodeInfo and NodeDescription answered by their drivers) and
    // the SM host.
    let (ok, out) = sm.diag(&mut g, "/usr/sbin/ibnetdiscover", &[], DIAG_LIMIT);
    assert!(ok, "ibnetdiscover:\n{out}");
    for want in [
        "Switch\t36 \"S-0002c90000000100\"".to_string(),
        "caguid=0x2c90300000010".to_string(),
        "caguid=0x2c90300000020".to_string(),
        format!("# \"{}\"", descs[0]),
        format!("# \"{}\"", descs[1]),
        format!("lid {la} "),
        format!("lid {lb} "),
    ] {
        assert!(out.contains(&want), "ibnetdiscover shows {want:?}:\n{out}");
    }
    assert_eq!(
        descs,
        ["node0 HCA-1", "node1 HCA-1"],
        "the drivers' node_desc"
    );

    // perfquery from the host: guest a's PMA (its ib_core agent on QP1,
    // mlx4_ib's process_mad, the firmware PMA through MAD_IFC) answers;
    // the counters grow by what an RC WRITE stream to guest b moved.
    let la_s = la.to_string();
    let lb_s = lb.to_string();
    let (ok, before) = sm.diag(&mut g, "/usr/sbin/perfquery", &[&la_s, "1"], DIAG_LIMIT);
    assert!(ok, "perfquery {la} 1:\n{before}");
    assert_eq!(field(&before, "PortSelect"), "1", "{before}");
    let (ok, before_b) = sm.diag(&mut g, "/usr/sbin/perfquery", &[&lb_s, "1"], DIAG_LIMIT);
    assert!(ok, "perfquery {lb} 1:\n{before_b}");
    let pma_replies = g[0]
        .core
        .mad_counters(g[0].dev, 1)
        .unwrap()
        .process_mad_replies;
    let [ga, gb] = &mut g;
    let bytes = rc_write(ga, gb, 64, 8192, &mut |a, b| {
        sm.round(&mut [a, b]);
    });
    let (ok, after) = sm.diag(&mut g, "/usr/sbin/perfquery", &[&la_s, "1"], DIAG_LIMIT);
    assert!(ok, "perfquery {la} 1:\n{after}");
    let (ok, after_b) = sm.diag(&mut g, "/usr/sbin/perfquery", &[&lb_s, "1"], DIAG_LIMIT);
    assert!(ok, "perfquery {lb} 1:\n{after_b}");
    let grew = |o1: &str, o2: &str, name: &str| counter(o2, name) - counter(o1, name);
    // PortXmitData counts 4-byte words of LRH..ICRC: the payload alone
    // is bytes / 4.
    let (xd, xp) = (
        grew(&before, &after, "PortXmitData"),
        grew(&before, &after, "PortXmitPkts"),
    );
    let (rd, rp) = (
        grew(&before_b, &after_b, "PortRcvData"),
        grew(&before_b, &after_b, "PortRcvPkts"),
    );
    eprintln!(
        "RC WRITE {bytes} bytes: guest a XmitData +{xd} words, XmitPkts +{xp}; guest b RcvData +{rd}, RcvPkts +{rp}"
    );
    assert!(
        xd >= bytes / 4 && rd >= bytes / 4,
        "data counters grew by the payload at least"
    );
    assert!(
        xp >= 64 * 4 && rp >= 64 * 4,
        "8 KiB at MTU 2048: 4 packets a WRITE"
    );
    assert!(
        g[0].core
            .mad_counters(g[0].dev, 1)
            .unwrap()
            .process_mad_replies
            > pma_replies,
        "the second perfquery was answered by guest a's own agent"
    );

    // saquery -p (OpenSM's SA) from the SM host: the path a -> b.
    let src_dst = format!("{la}:{lb}");
    let (ok, out) = sm.diag(
        &mut g,
        "/usr/sbin/saquery",
        &["-p", "--src-to-dst", &src_dst],
        DIAG_LIMIT,
    );
    assert!(ok, "saquery -p:\n{out}");
    assert_eq!(field(&out, "slid"), la_s, "{out}");
    assert_eq!(field(&out, "dlid"), lb_s, "{out}");
    assert_eq!(
        field(&out, "mtu"),
        "0x85",
        "exactly 4096 (both ends' MTUCap):\n{out}"
    );
    // Both CAs and the switch's ports run 4x FDR: 56 Gb/s (OpenSM's
    // IB_PATH_RECORD_RATE_56_GBS, 12), exactly (selector 2).
    assert_eq!(
        field(&out, "rate"),
        "0x8C",
        "exactly 56 Gb/s (4x FDR):\n{out}"
    );
    assert_eq!(
        field(&out, "sgid"),
        "fe80::2:c903:0:11",
        "guest a's port GID:\n{out}"
    );

    // The guest's own SA client asks OpenSM's SA (QP1 to the SM LID the
    // port cache holds) for the path to guest b.
    let (dev, sa) = (g[0].dev, g[0].sa);
    let rec = ib_core::sa_query::PathRecord {
        sgid: g[0].core.device(dev).unwrap().get_cached_gid(1, 0).unwrap(),
        slid: la,
        dlid: lb,
        pkey: 0xffff,
        numb_path: 1,
        reversible: true,
        ..Default::default()
    };
    use ib_core::sa_query::path_comp as pc;
    let mask = pc::SGID | pc::SLID | pc::DLID | pc::PKEY | pc::NUMB_PATH | pc::REVERSIBLE;
    let q = ib_core::sa_query::path_rec_get(
        &mut g[0].core,
        sa,
        dev,
        1,
        &rec,
        mask,
        Duration::from_secs(10),
    )
    .expect("PathRecord query started");
    let mut got = None;
    sm.pump_until(&mut g, Duration::from_secs(15), 1, |_, g| {
        got = ib_core::sa_query::query_result(&mut g[0].core, sa, q);
        got.is_some()
    });
    let resp = got
        .expect("the SA answered within 15 s")
        .expect("PathRecord");
    let paths = resp.path_records().expect("parsed");
    assert_eq!(paths.len(), 1, "{paths:?}");
    let p = &paths[0];
    eprintln!("guest a's PathRecord to LID {lb}: {p:?}");
    assert_eq!((p.slid, p.dlid), (la, lb));
    assert_eq!(p.sgid, rec.sgid);
    assert_eq!(
        p.dgid,
        g[1].core
            .device(g[1].dev)
            .unwrap()
            .get_cached_gid(1, 0)
            .unwrap()
    );
    assert_eq!((p.mtu_selector, p.mtu), (2, 5), "exactly 4096");
    assert_eq!((p.rate_selector, p.rate), (2, 12), "exactly 56 Gb/s");
    assert_eq!(p.pkey, 0xffff);
    assert!(p.reversible);
    // ib_init_ah_from_path turns it into an address vector to guest b.
    let ah = ib_core::sa_query::init_ah_from_path(g[0].core.device(dev).unwrap(), 1, p)
        .expect("AH from the path");
    assert_eq!((ah.dlid, ah.port_num), (lb, 1));
    let sac = ib_core::sa_query::counters(&mut g[0].core, sa, dev, 1).unwrap();
    assert_eq!(
        (sac.answered, sac.timeouts, sac.errors),
        (1, 0, 0),
        "{sac:?}"
    );

    let Net { a, b, sm, .. } = n;
    sm.stop();
    a.teardown();
    b.teardown();
}

/// Guest `k`'s fabric port and the switch port its cable goes to.
fn cable(n: &Net, k: usize) -> (PortId, PortId) {
    let f = n.fabric.lock().unwrap();
    let mine = n.ports[k];
    (mine, f.peer(mine).expect("cabled"))
}

#[test]
fn a_pulled_cable_comes_back_active_with_its_lid_by_the_trap_alone() {
    if !peers_present("a_pulled_cable_comes_back_active_with_its_lid_by_the_trap_alone") {
        return;
    }
    // No periodic sweep: only the switch's Trap 128 can make OpenSM look.
    let mut n = net("cable", &["-s", "0"]);
    up(&mut n);
    let lid = n.a.port(1).lid;
    let ups = n.sm.subnet_ups();
    let (mine, sw_port) = cable(&n, 0);
    n.fabric.lock().unwrap().unplug(mine).expect("pulled");
    let down = n.sm.pump_until(
        &mut [&mut n.a, &mut n.b],
        Duration::from_secs(5),
        16,
        |_, g| g[0].port(1).state == PortState::Down,
    );
    assert!(down, "guest a's port went Down: {:?}", n.a.port(1));
    assert!(
        n.a.events().contains(&(EventType::PortErr, 1)),
        "IB_EVENT_PORT_ERR reached the client: {:?}",
        n.a.events()
    );
    let t = Instant::now();
    n.fabric
        .lock()
        .unwrap()
        .connect(mine, sw_port)
        .expect("plugged back");
    let back = n.sm.pump_until(
        &mut [&mut n.a, &mut n.b],
        Duration::from_secs(15),
        64,
        |_, g| g[0].active(),
    );
    assert!(
        back,
        "Active again after the cable came back; OpenSM log:\n{}",
        n.sm.log()
    );
    eprintln!("cable back -> Active in {:?}", t.elapsed());
    // The port turns Active in the middle of OpenSM's sweep; the sweep's
    // "SUBNET UP" comes when it ends.
    let swept = n.sm.pump_until(
        &mut [&mut n.a, &mut n.b],
        Duration::from_secs(10),
        64,
        |sm, _| sm.subnet_ups() > ups,
    );
    let log = n.sm.log();
    assert!(swept, "OpenSM swept again (trap 128):\n{log}");
    let p = n.a.port(1);
    assert_eq!(p.lid, lid, "the same LID");
    assert!(
        log.contains("Trap") || log.contains("trap"),
        "OpenSM logged the trap:\n{log}"
    );
    // The other guest never noticed.
    assert!(n.b.active());
    assert!(!n.b.events().contains(&(EventType::PortErr, 1)));
    let Net { a, b, sm, .. } = n;
    sm.stop();
    a.teardown();
    b.teardown();
}

/// `ibportstate <switch> <port> disable` from the SM host takes guest a's
/// link down (its driver sees the port go Down, a perfquery to it finds
/// nobody) and `enable` brings it back to Active under OpenSM, by the
/// switch's trap alone; guest b never notices.
#[test]
fn ibportstate_disable_and_enable_take_a_guests_link_down_and_back() {
    if !peers_present("ibportstate_disable_and_enable_take_a_guests_link_down_and_back") {
        return;
    }
    let mut n = net("portstate", &["-s", "0"]);
    up(&mut n);
    let lid = n.a.port(1).lid;
    let (_, sw_port) = cable(&n, 0);
    let (sw_lid, port) = {
        let f = n.fabric.lock().unwrap();
        let Some(sim::fabric::Owner::Switch { switch, port }) = f.owner(sw_port) else {
            panic!("guest a is cabled to a switch");
        };
        (f.switch(switch).unwrap().lid(), port)
    };
    let (sw, port, la) = (sw_lid.to_string(), port.to_string(), lid.to_string());
    let Net { a, b, sm, .. } = &mut n;
    let mut g = [a, b];
    let (ok, out) = sm.diag(
        &mut g,
        "/usr/sbin/ibportstate",
        &[&sw, &port, "disable"],
        DIAG_LIMIT,
    );
    assert!(ok, "ibportstate disable:\n{out}");
    let down = sm.pump_until(&mut g, Duration::from_secs(5), 16, |_, g| {
        g[0].port(1).state == PortState::Down
    });
    assert!(down, "guest a's port went Down: {:?}", g[0].port(1));
    assert!(
        g[0].events().contains(&(EventType::PortErr, 1)),
        "IB_EVENT_PORT_ERR reached the client: {:?}",
        g[0].events()
    );
    let (ok, out) = sm.diag(
        &mut g,
        "/usr/sbin/perfquery",
        &["-t", "300", &la, "1"],
        DIAG_LIMIT,
    );
    assert!(
        !ok,
        "nothing reaches guest a while its link is down:\n{out}"
    );
    let (ok, out) = sm.diag(
        &mut g,
        "/usr/sbin/ibportstate",
        &[&sw, &port, "query"],
        DIAG_LIMIT,
    );
    assert!(ok, "{out}");
    assert_eq!(field(&out, "PhysLinkState"), "Disabled", "{out}");

    let t = Instant::now();
    let (ok, out) = sm.diag(
        &mut g,
        "/usr/sbin/ibportstate",
        &[&sw, &port, "enable"],
        DIAG_LIMIT,
    );
    assert!(ok, "ibportstate enable:\n{out}");
    let back = sm.pump_until(&mut g, Duration::from_secs(15), 64, |_, g| g[0].active());
    assert!(
        back,
        "Active again after the enable; OpenSM log:\n{}",
        sm.log()
    );
    eprintln!("enable -> Active in {:?}", t.elapsed());
    assert_eq!(g[0].port(1).lid, lid, "the same LID");
    let (ok, out) = sm.diag(&mut g, "/usr/sbin/perfquery", &[&la, "1"], DIAG_LIMIT);
    assert!(ok, "guest a answers again:\n{out}");
    assert!(g[1].active());
    assert!(!g[1].events().contains(&(EventType::PortErr, 1)));
    // The switch, the SM host and the guests all answer Mellanox's
    // ExtendedPortInfo: the discovery tools print no "bad status", OpenSM
    // logs no ERR 3111.
    for prog in ["/usr/sbin/iblinkinfo", "/usr/sbin/ibnetdiscover"] {
        let (ok, out) = sm.diag(&mut g, prog, &[], DIAG_LIMIT);
        assert!(ok && !out.contains("bad status"), "{prog}:\n{out}");
    }
    let log = sm.log();
    assert!(!log.contains("ERR 3111"), "OpenSM's log:\n{log}");
    let Net { a, b, sm, .. } = n;
    sm.stop();
    a.teardown();
    b.teardown();
}

#[test]
fn an_opensm_restart_keeps_the_lids() {
    if !peers_present("an_opensm_restart_keeps_the_lids") {
        return;
    }
    let mut n = net("restart", &["-s", "1"]);
    up(&mut n);
    let lids = [n.a.port(1).lid, n.b.port(1).lid];
    let sm_lid = n.sm.svc.server.node("smhost").unwrap().lid();
    let before = [n.a.events().len(), n.b.events().len()];
    n.sm.restart(&mut [&mut n.a, &mut n.b], &["-s", "1"]);
    let ok =
        n.sm.pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 256, |sm, _| {
            sm.subnet_ups() >= 1
        });
    assert!(
        ok,
        "the new OpenSM brought the subnet up:\n{}",
        n.sm.current_log()
    );
    let log = n.sm.current_log();
    assert!(!log.contains("ERR 0F10"), "no refused SubnSet:\n{log}");
    warn_timeouts(&log);
    for (k, g) in [&mut n.a, &mut n.b].into_iter().enumerate() {
        let p = g.port(1);
        assert_eq!(p.state, PortState::Active);
        assert_eq!(p.lid, lids[k], "{}: LID kept across the SM restart", g.name);
        assert_eq!(p.sm_lid, sm_lid, "{}: same SM LID", g.name);
        let ev = g.events()[before[k]..].to_vec();
        assert!(
            !ev.contains(&(EventType::LidChange, 1)) && !ev.contains(&(EventType::PortErr, 1)),
            "{}: no LID change, no port error: {ev:?}",
            g.name
        );
    }
    let Net { a, b, sm, .. } = n;
    sm.stop();
    a.teardown();
    b.teardown();
}

/// Seconds of the day of an OpenSM log line ("Nov 23 05:52:03 942366 ...").
fn log_time(line: &str) -> Option<f64> {
    let mut w = line.split_whitespace().skip(2);
    let hms: Vec<f64> = w
        .next()?
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let us: f64 = w.next()?.parse().ok()?;
    (hms.len() == 3).then(|| hms[0] * 3600.0 + hms[1] * 60.0 + hms[2] + us / 1e6)
}

/// From OpenSM's log: (first line -> SUBNET UP, DISCOVERING -> SUBNET UP),
/// in ms.
fn log_spans(log: &str) -> Option<(f64, f64)> {
    let first = log_time(log.lines().next()?)?;
    let disc = log_time(log.lines().find(|l| l.contains("Entering DISCOVERING"))?)?;
    let up = log_time(log.lines().find(|l| l.contains("SUBNET UP"))?)?;
    Some(((up - first) * 1e3, (up - disc) * 1e3))
}

/// 1 switch of 8 ports, two CAs on ports 1 and 2 (the SM host goes on
/// port 8): the shape of real-peers.md's measurement (1 switch, 3 CAs).
const NET_TWO: &str = r#"
vendid=0x02c9
devid=0xc738
switchguid=0x0002c90000000100
Switch	8 "Sw1"
[1]	"H1"[1]
[2]	"H2"[1]

vendid=0x02c9
devid=0x1003
caguid=0x0002c90300000010
Ca	2 "H1"
[1]	"Sw1"[1]

vendid=0x02c9
devid=0x1003
caguid=0x0002c90300000020
Ca	2 "H2"
[1]	"Sw1"[2]
"#;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// OpenSM's SUBNET UP on our fabric with the two CAs driver-run (mlx4 +
/// ib_core answering through QP0 and MAD_IFC) and, for comparison, the
/// same net with the CAs modelled by the fabric (host nodes): 5 cold runs
/// each, medians; SMPs of the cold sweep and of idle light sweeps (-s 1).
/// `cargo test --release -p tests --test subnet_opensm -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_opensm_subnet_up_driver_run_vs_host_nodes() {
    if !peers_present("bench_opensm_subnet_up_driver_run_vs_host_nodes") {
        return;
    }
    const RUNS: usize = 5;
    for driver in [true, false] {
        let (mut exec, mut first, mut disc, mut smps, mut light) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for run in 0..RUNS {
            let mut f = Fabric::new();
            let built = Topology::from_netfile(NET_TWO)
                .unwrap()
                .build(&mut f)
                .unwrap();
            let fabric = Arc::new(Mutex::new(f));
            let (mut guests, extra) = if driver {
                let (a, b) = sync_guests(&fabric, &built);
                (vec![a, b], Vec::new())
            } else {
                let mut f = fabric.lock().unwrap();
                (
                    Vec::new(),
                    sim::fabric::ibsim::host_nodes_beyond(&mut f, &built, 0),
                )
            };
            let sw = built.switches[0].1;
            let mut sm = OpenSm::start_with(
                &format!("bench{run}"),
                &fabric,
                sw,
                true,
                &["-s", "1"],
                extra,
            );
            let mut g: Vec<&mut Guest> = guests.iter_mut().collect();
            let t = Instant::now();
            let mut last_read = Instant::now();
            let ok = sm.pump_until(&mut g, UP_LIMIT, 1, |sm, _| {
                if last_read.elapsed() < Duration::from_micros(500) {
                    return false;
                }
                last_read = Instant::now();
                sm.subnet_ups() >= 1
            });
            assert!(ok, "SUBNET UP:\n{}", sm.log());
            exec.push(t.elapsed().as_secs_f64() * 1e3);
            if run == 0 {
                println!(
                    "  run 0: {} rounds, {:.1} us a round in the guests' progress functions",
                    sm.rounds,
                    sm.guest_ns as f64 / 1e3 / sm.rounds.max(1) as f64
                );
            }
            let n0 = sm.svc.server.stats().client_smps;
            smps.push(n0 as f64);
            // Idle light sweeps, one a second.
            sm.pump_until(&mut g, Duration::from_secs(3), 1 << 20, |_, _| false);
            light.push((sm.svc.server.stats().client_smps - n0) as f64 / 3.0);
            let (a, b) = log_spans(&sm.log()).expect("log spans");
            first.push(a);
            disc.push(b);
            if driver {
                for x in g.iter_mut() {
                    assert!(x.active());
                }
            }
            drop(g);
            sm.stop();
            for x in guests {
                x.teardown();
            }
        }
        println!(
            "OpenSM on NET_TWO (1 switch, 2 CAs + SM host), CAs {}: exec -> SUBNET UP seen {:.1} ms, log first line -> SUBNET UP {:.1} ms, DISCOVERING -> SUBNET UP {:.1} ms (medians of {RUNS}; runs {exec:.1?} / {first:.1?} / {disc:.1?}); cold sweep {} SMPs; idle -s 1: {:.1} SMPs/s",
            if driver {
                "driver-run (mlx4_core + mlx4_ib + ib_core, QP0 + MAD_IFC)"
            } else {
                "fabric host nodes"
            },
            median(&mut exec.clone()),
            median(&mut first.clone()),
            median(&mut disc.clone()),
            median(&mut smps.clone()),
            median(&mut light.clone()),
        );
    }
}
