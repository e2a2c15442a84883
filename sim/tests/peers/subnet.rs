//! OpenSM brings the subnet up; the diags see it.

use std::time::Duration;

use sim::LogicalState;
use sim::fabric::Capture;

use crate::rig::{NET_SMALL, Rig, tools_present};

const UP_LIMIT: Duration = Duration::from_secs(30);
const DIAG_LIMIT: Duration = Duration::from_secs(20);

/// (name, LID, state) of every host node.
fn ports(rig: &Rig) -> Vec<(String, u16, LogicalState, u16)> {
    let w = rig.world();
    w.server
        .nodes()
        .iter()
        .map(|n| (n.name.clone(), n.lid(), n.state(), n.sm_lid()))
        .collect()
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

fn up(rig: &mut Rig) -> Duration {
    rig.start_opensm("H1", &[]);
    let Some(t) = rig.wait_subnet_up(1, UP_LIMIT) else {
        panic!(
            "no SUBNET UP within {UP_LIMIT:?}; log:\n{}",
            rig.opensm_log()
        );
    };
    t
}

#[test]
fn opensm_brings_the_subnet_up() {
    if !tools_present("opensm_brings_the_subnet_up") {
        return;
    }
    let mut rig = Rig::start("up", NET_SMALL);
    let pcap = rig.dir.join("up.pcapng");
    rig.world()
        .fabric
        .set_capture(Some(Capture::create(&pcap).expect("capture file")));
    let t = up(&mut rig);
    let smps = rig.world().server.stats().client_smps;
    let p = ports(&rig);
    eprintln!("SUBNET UP after {t:?} (opensm exec to the log line), {smps} SMPs; ports {p:?}");
    let sm_lid = p[0].1;
    assert_ne!(sm_lid, 0, "the SM's own port got a LID: {p:?}");
    let mut lids: Vec<u16> = p.iter().map(|x| x.1).collect();
    lids.sort_unstable();
    lids.dedup();
    assert_eq!(lids.len(), 3, "distinct LIDs: {p:?}");
    for (name, lid, state, smlid) in &p {
        assert_eq!(*state, LogicalState::Active, "{name} Active: {p:?}");
        assert_ne!(*lid, 0, "{name} has a LID");
        assert_eq!(*smlid, sm_lid, "{name} knows the SM's LID");
    }
    // Every SMP crossed the wire: each non-local one is a request and a
    // response on one or two cables.
    let captured = {
        let mut w = rig.world();
        let c = w.fabric.capture_mut().expect("capture");
        c.flush().expect("capture written");
        c.packets()
    };
    assert!(
        captured >= 2 * smps,
        "{captured} packets captured for {smps} SMPs"
    );
    if std::path::Path::new("/usr/bin/tshark").exists() {
        let out = std::process::Command::new("/usr/bin/tshark")
            .arg("-r")
            .arg(&pcap)
            .args([
                "-Y",
                "infiniband.mad.mgmtclass == 0x81 && infiniband.mad.attributeid == 0x0011",
            ])
            .args([
                "-T",
                "fields",
                "-e",
                "infiniband.lrh.vl",
                "-e",
                "infiniband.bth.destqp",
            ])
            .output()
            .expect("tshark");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() >= 6, "DR NodeInfo SMPs dissected:\n{text}");
        assert!(
            lines
                .iter()
                .all(|l| *l == "0x0f\t0x000000" || *l == "15\t0"),
            "every SMP on VL15 to QP0:\n{text}"
        );
    } else {
        eprintln!("!!!!! tshark missing: the capture was counted, not dissected");
    }
    let log = rig.opensm_log();
    assert!(
        !log.contains("ERR 3120"),
        "no SMP timed out during the sweep:\n{log}"
    );
}

#[test]
fn diags_query_the_fabric() {
    if !tools_present("diags_query_the_fabric") {
        return;
    }
    let mut rig = Rig::start("diags", NET_SMALL);
    // The capture of OpenSM's sweep and every diag's MADs stays with
    // KEEP_PEERS_SCRATCH=1 (`fuzz/seeds/from-capture.py` makes the MAD
    // fuzz targets' seeds of it).
    let pcap = rig.dir.join("diags.pcapng");
    rig.world()
        .fabric
        .set_capture(Some(Capture::create(&pcap).expect("capture file")));
    up(&mut rig);
    let p = ports(&rig);
    let h3 = p[2].1.to_string();

    let (ok, out, _) = rig.diag("H2", "/usr/sbin/ibstat", &[], DIAG_LIMIT);
    assert!(ok, "ibstat:\n{out}");
    for want in [
        "State: Active".to_string(),
        "Physical state: LinkUp".to_string(),
        format!("Base lid: {}", p[1].1),
        format!("SM lid: {}", p[0].1),
        "Port GUID: 0x0002c90300000021".to_string(),
    ] {
        assert!(out.contains(&want), "ibstat on H2 shows {want:?}:\n{out}");
    }

    let (ok, out, _) = rig.diag("H1", "/usr/sbin/ibnetdiscover", &[], DIAG_LIMIT);
    assert!(ok, "ibnetdiscover:\n{out}");
    for want in [
        "Switch\t8 \"S-0002c90000000100\"",
        "# \"Sw1\"",
        "\"H1\"",
        "\"H2\"",
        "\"H3\"",
        "caguid=0x2c90300000030",
    ] {
        assert!(out.contains(want), "ibnetdiscover shows {want:?}:\n{out}");
    }

    let (ok, out, _) = rig.diag("H1", "/usr/sbin/smpquery", &["nodeinfo", &h3], DIAG_LIMIT);
    assert!(ok, "smpquery nodeinfo:\n{out}");
    assert_eq!(field(&out, "PortGuid"), "0x0002c90300000031", "{out}");
    assert_eq!(field(&out, "NodeType"), "Channel Adapter", "{out}");
    assert_eq!(field(&out, "DevId"), "0x1003", "{out}");
    let (ok, out, _) = rig.diag("H2", "/usr/sbin/smpquery", &["nodedesc", &h3], DIAG_LIMIT);
    assert!(
        ok && out.contains("H3"),
        "smpquery nodedesc from H2:\n{out}"
    );

    let xmit = |out: &str| -> u64 {
        field(out, "PortXmitPkts")
            .parse()
            .unwrap_or_else(|_| panic!("no PortXmitPkts in\n{out}"))
    };
    let (ok, out1, _) = rig.diag("H1", "/usr/sbin/perfquery", &[&h3, "1"], DIAG_LIMIT);
    assert!(ok, "perfquery:\n{out1}");
    let (ok, out2, _) = rig.diag("H1", "/usr/sbin/perfquery", &[&h3, "1"], DIAG_LIMIT);
    assert!(ok, "perfquery:\n{out2}");
    let (a, b) = (xmit(&out1), xmit(&out2));
    assert!(
        a > 0 && b > a,
        "H3's PortXmitPkts grow with traffic: {a} then {b}"
    );

    let (ok, out, _) = rig.diag("H1", "/usr/sbin/sminfo", &[], DIAG_LIMIT);
    assert!(ok, "sminfo:\n{out}");
    assert!(
        out.contains(&format!("sminfo: sm lid {} ", p[0].1)) && out.contains("SMINFO_MASTER"),
        "sminfo names the master SM:\n{out}"
    );

    let src_dst = format!("{}:{}", p[1].1, p[2].1);
    let (ok, out, _) = rig.diag(
        "H1",
        "/usr/sbin/saquery",
        &["-p", "--src-to-dst", &src_dst],
        DIAG_LIMIT,
    );
    assert!(ok, "saquery -p:\n{out}");
    assert!(
        field(&out, "dlid") == p[2].1.to_string() && field(&out, "slid") == p[1].1.to_string(),
        "saquery -p returns the path H2 -> H3:\n{out}"
    );
    // From H2 the SA's answer crosses the fabric: still one record.
    let (ok, out, _) = rig.diag(
        "H2",
        "/usr/sbin/saquery",
        &["-p", "--src-to-dst", &src_dst],
        DIAG_LIMIT,
    );
    assert!(ok, "saquery -p from H2:\n{out}");
    assert_eq!(
        out.matches("PathRecord dump:").count(),
        1,
        "one record:\n{out}"
    );
    assert_eq!(field(&out, "dlid"), p[2].1.to_string(), "{out}");

    let sw_lid = rig
        .world()
        .fabric
        .switch(sim::fabric::SwitchId(0))
        .map(|s| s.lid())
        .unwrap_or(0);
    // The switch's PMA, port 3 (H3's cable), extended counters too.
    let sw = sw_lid.to_string();
    let (ok, out, _) = rig.diag("H1", "/usr/sbin/perfquery", &["-x", &sw, "3"], DIAG_LIMIT);
    assert!(ok, "perfquery -x of the switch:\n{out}");
    let pkts: u64 = field(&out, "PortXmitPkts").parse().unwrap_or(0);
    assert!(pkts > 0, "switch port 3 sent packets to H3:\n{out}");
    let (ok, out, _) = rig.diag(
        "H1",
        "/usr/sbin/ibroute",
        &[&sw_lid.to_string()],
        DIAG_LIMIT,
    );
    assert!(ok, "ibroute:\n{out}");
    assert!(
        out.contains(&format!(
            "0x{:04x} 003 : (Channel Adapter portguid 0x0002c90300000031: 'H3')",
            p[2].1
        )),
        "ibroute shows the switch's LFT entry for H3:\n{out}"
    );
}

/// The `--nodes N` fabric of cx3-emu (one 36-port switch, node i on port
/// i+1) with the SM host on the switch's last port, as the emulator wires
/// it; host nodes stand in for the guests' HCAs.
#[test]
fn opensm_on_the_nodes_topology_with_the_sm_host() {
    if !tools_present("opensm_on_the_nodes_topology_with_the_sm_host") {
        return;
    }
    let mut rig = Rig::start_with("nodes", |fabric| {
        let built = sim::fabric::Topology::for_nodes(2)
            .expect("topology")
            .build(fabric)
            .expect("build");
        let sw = built.switches.first().map(|s| s.1);
        let sm = sim::fabric::ibsim::attach_sm_host(
            fabric,
            sw,
            None,
            "smhost",
            sim::fabric::ibsim::SM_HOST_GUID,
        )
        .expect("SM host");
        let mut nodes = vec![sm];
        for h in &built.hcas {
            nodes.push(sim::fabric::HostNode::new(
                fabric,
                &h.name,
                h.node_guid,
                h.ports[0],
            ));
        }
        nodes
    });
    rig.start_opensm("smhost", &[]);
    assert!(
        rig.wait_subnet_up(1, UP_LIMIT).is_some(),
        "{}",
        rig.opensm_log()
    );
    let p = ports(&rig);
    for (name, lid, state, smlid) in &p {
        assert_eq!(
            (*state, *smlid),
            (LogicalState::Active, p[0].1),
            "{name} {lid}: {p:?}"
        );
    }
    let w = rig.world();
    let sm_port = w.server.node("smhost").expect("smhost").port;
    let far = w.fabric.peer(sm_port).and_then(|q| w.fabric.owner(q));
    assert_eq!(
        far,
        Some(sim::fabric::Owner::Switch {
            switch: sim::fabric::SwitchId(0),
            port: 36
        }),
        "the SM host takes the switch's last port"
    );
}

/// What cx3-emu's single-threaded loop would do: the service started on
/// the `--nodes 2` fabric, polled in this thread until every port is
/// Active, then stopped (OpenSM ended, the socket-name file gone).
#[test]
fn sm_service_in_a_single_threaded_loop() {
    if !tools_present("sm_service_in_a_single_threaded_loop") {
        return;
    }
    use sim::fabric::ibsim::{SmOptions, SmService};
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("peers")
        .join(format!("svc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut fabric = sim::fabric::Fabric::new();
    let built = sim::fabric::Topology::for_nodes(2)
        .expect("topology")
        .build(&mut fabric)
        .expect("build");
    let guests: Vec<_> = built
        .hcas
        .iter()
        .map(|h| sim::fabric::HostNode::new(&mut fabric, &h.name, h.node_guid, h.ports[0]))
        .collect();
    let opts = SmOptions {
        base: format!("lego-svc-{}", std::process::id()),
        switch: built.switches.first().map(|s| s.1),
        peer: None,
        opensm: true,
        opensm_args: vec![],
        dir: dir.join("opensm"),
        sockname_file: Some(dir.join("ibsim-sockname")),
        timeout: Duration::from_millis(200),
    };
    let mut svc = SmService::start(&mut fabric, &opts, guests).expect("start");
    assert_eq!(
        std::fs::read_to_string(dir.join("ibsim-sockname"))
            .unwrap_or_default()
            .trim(),
        opts.base
    );
    let pid = svc.opensm_pid().expect("OpenSM runs");
    let t0 = std::time::Instant::now();
    let mut all_active = false;
    while t0.elapsed() < UP_LIMIT {
        let now = t0.elapsed().as_nanos() as u64;
        fabric.advance(now);
        if svc.poll(&mut fabric, now) == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
        if svc
            .server
            .nodes()
            .iter()
            .all(|n| n.state() == LogicalState::Active)
        {
            all_active = true;
            break;
        }
    }
    assert!(
        all_active,
        "every port Active: {:?}\n{}",
        svc.server
            .nodes()
            .iter()
            .map(|n| (n.name.clone(), n.state()))
            .collect::<Vec<_>>(),
        std::fs::read_to_string(svc.opensm_log()).unwrap_or_default()
    );
    eprintln!(
        "smhost + 2 nodes Active {:?} after the service started",
        t0.elapsed()
    );
    let now = t0.elapsed().as_nanos() as u64;
    svc.stop(&mut fabric, now);
    assert!(svc.opensm_pid().is_none());
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z ")),
        "OpenSM ended"
    );
    assert!(
        !dir.join("ibsim-sockname").exists(),
        "socket-name file removed"
    );
    assert!(
        svc.server.clients().is_empty(),
        "OpenSM said DISCONNECT and got its reply"
    );
    drop(svc);
    let _ = std::fs::remove_dir_all(&dir);
}

/// M_Key protection level 1 under OpenSM (`m_key`, `m_key_protection_level
/// 1` in its options file): `smpquery -K` without the key reads M_Key 0
/// from the switch and from a host node; with the key (`-y`) it reads the
/// key.
#[test]
fn m_key_level_1_shows_no_key_to_a_get_without_it() {
    if !tools_present("m_key_level_1_shows_no_key_to_a_get_without_it") {
        return;
    }
    let mut rig = Rig::start("mkey1", NET_SMALL);
    let conf = rig.dir.join("opensm.conf");
    std::fs::write(
        &conf,
        "m_key 0x00000000000a1b2c\nm_key_protection_level 1\nm_key_lease_period 0\n",
    )
    .expect("options file");
    let conf = conf.to_string_lossy().into_owned();
    rig.start_opensm("H1", &["-F", &conf]);
    assert!(
        rig.wait_subnet_up(1, UP_LIMIT).is_some(),
        "{}",
        rig.opensm_log()
    );
    let smp = "/usr/sbin/smpquery";
    // The switch (port 0) and H1, the SM's host node, one hop past it.
    for path in [&["0,1", "0"][..], &["0,1,1"]] {
        let mut a = vec!["-K", "-D", "portinfo"];
        a.extend_from_slice(path);
        let (ok, out, _) = rig.diag("H2", smp, &a, DIAG_LIMIT);
        assert!(ok, "{out}");
        assert_eq!(
            field(&out, "ProtectBits"),
            "1",
            "OpenSM set level 1:\n{out}"
        );
        assert_eq!(
            field(&out, "Mkey"),
            "0x0000000000000000",
            "{path:?}:\n{out}"
        );
        let mut a = vec!["-K", "-y", "0xa1b2c", "-D", "portinfo"];
        a.extend_from_slice(path);
        let (ok, out, _) = rig.diag("H2", smp, &a, DIAG_LIMIT);
        assert!(ok, "{out}");
        assert_eq!(
            field(&out, "Mkey"),
            "0x00000000000a1b2c",
            "{path:?} with the key:\n{out}"
        );
    }
}
