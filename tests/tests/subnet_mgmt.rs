//! The real OpenSM manages driver-run HCAs as it manages ConnectX-3 cards.
//!
//! Two model HCAs with the real mlx4_core + mlx4_ib + ib_core on the
//! `--nodes 2` topology, Debian's OpenSM attached through the fabric's ibsim
//! server (as in `subnet_opensm.rs`), and what an SM administrator sets and
//! reads on the CAs' firmware SMA: QoS (SLtoVL and VLArbitration tables),
//! the 4x FDR link, M_Key protection (level 1 hides the key, a violation
//! traps), and a P_Key violation at QP1, counted and trapped to OpenSM
//! through the driver's trap forwarding. Skipped loudly without the
//! packages (`scripts/deps.sh ensure_ib_peers`).

use tests::subnet_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ib_core::verbs::PortState;
use sim::fabric::{Fabric, Topology};
use subnet_common::*;

const UP_LIMIT: Duration = Duration::from_secs(20);
const DIAG_LIMIT: Duration = Duration::from_secs(20);

struct Net {
    _fabric: Arc<Mutex<Fabric>>,
    a: Guest,
    b: Guest,
    sm: OpenSm,
    /// Where the files given to [`net`] are.
    conf: std::path::PathBuf,
}

/// The two guests and OpenSM started with `args`; `files` are written to
/// OpenSM's directory first (a config or partitions file its arguments
/// name as `{dir}/...`).
fn net(test: &str, args: &[&str], files: &[(&str, &str)]) -> Net {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let (a, b) = sync_guests(&fabric, &built);
    // OpenSM's directory is made by the start; the files go to a sibling
    // the arguments name by its full path.
    let conf = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("subnet-mgmt-conf")
        .join(format!("{test}-{}", std::process::id()));
    std::fs::create_dir_all(&conf).unwrap();
    let mut owned: Vec<String> = Vec::new();
    for (name, text) in files {
        std::fs::write(conf.join(name), text).unwrap();
    }
    for a in args {
        owned.push(a.replace("{conf}", &conf.display().to_string()));
    }
    let args: Vec<&str> = owned.iter().map(String::as_str).collect();
    let sm = OpenSm::start(test, &fabric, built.switches[0].1, true, &args);
    Net {
        _fabric: fabric,
        a,
        b,
        sm,
        conf,
    }
}

fn up(n: &mut Net) {
    let ok =
        n.sm.pump_until(&mut [&mut n.a, &mut n.b], UP_LIMIT, 256, |sm, g| {
            sm.subnet_ups() >= 1 && g.iter_mut().all(|g| g.active())
        });
    assert!(
        ok,
        "SUBNET UP and both ports Active within {UP_LIMIT:?}; OpenSM log:\n{}",
        n.sm.log()
    );
}

fn done(n: Net) {
    let Net { a, b, sm, .. } = n;
    sm.stop();
    a.teardown();
    b.teardown();
}

/// Runs a diag on the SM host while the guests are served.
fn diag(n: &mut Net, prog: &str, args: &[&str]) -> (bool, String) {
    let Net { a, b, sm, .. } = n;
    sm.diag(&mut [a, b], prog, args, DIAG_LIMIT)
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

/// Serves the guests and OpenSM until OpenSM's log has `what` (or 10 s).
fn log_shows(n: &mut Net, what: &str) -> bool {
    let Net { a, b, sm, .. } = n;
    sm.pump_until(&mut [a, b], Duration::from_secs(10), 64, |sm, _| {
        sm.log().contains(what)
    })
}

/// OpenSM's ERR 3111 reports (an SMP answered with an error status, with
/// the SMP's attribute and directed-route path on the lines after it) for
/// SMPs that went to a CA: on the `--nodes 2` topology the SM host's port
/// is path 0, the switch 0,1 and the guests 0,1,1 and 0,1,2.
fn errs_3111_for_cas(log: &str) -> Vec<String> {
    let lines: Vec<&str> = log.lines().collect();
    let mut v = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !l.contains("ERR 3111") {
            continue;
        }
        let report = lines[i..(i + 3).min(lines.len())].join("\n");
        if report.contains("Initial path: 0,1,1 ") || report.contains("Initial path: 0,1,2 ") {
            v.push(report);
        }
    }
    v
}

#[test]
fn qos_on_configures_the_cas_sl2vl_and_vlarb_tables() {
    if !peers_present("qos_on_configures_the_cas_sl2vl_and_vlarb_tables") {
        return;
    }
    let mut n = net("qos", &["-Q"], &[]);
    up(&mut n);
    let (la, lb) = (n.a.port(1).lid, n.b.port(1).lid);
    // Serve a little longer: the QoS SMPs may follow SUBNET UP.
    let (_, _) = diag(&mut n, "/usr/sbin/smpquery", &["nodeinfo", &la.to_string()]);
    let log = n.sm.log();
    let errs = errs_3111_for_cas(&log);
    assert!(
        errs.is_empty(),
        "OpenSM logged ERR 3111 for a CA:\n{}\n--- whole log:\n{log}",
        errs.join("\n---\n")
    );
    for lid in [la, lb] {
        let l = lid.to_string();
        let (ok, out) = diag(&mut n, "/usr/sbin/smpquery", &["sl2vl", &l]);
        assert!(ok, "smpquery sl2vl {lid}:\n{out}");
        // OpenSM's default QoS SL2VL, masked to the port's operational
        // VLs (VL0-7).
        assert!(
            out.contains("ports: in  0, out  0: | 0| 1| 2| 3| 4| 5| 6| 7| 0| 1| 2| 3| 4| 5| 6| 7|"),
            "OpenSM's SL2VL table on LID {lid}:\n{out}"
        );
        let (ok, out) = diag(&mut n, "/usr/sbin/smpquery", &["vlarb", &l]);
        assert!(ok, "smpquery vlarb {lid}:\n{out}");
        assert!(
            out.contains("LowCap 8 HighCap 8"),
            "capacities of 8:\n{out}"
        );
        // OpenSM's default QoS weights (qos_vlarb_low 0:0,1:4,...,7:4 and
        // qos_vlarb_high 0:4,1:0,...), kept by the SMA.
        assert!(
            out.contains(
                "# Low priority VL Arbitration Table:\n\
                 VL    : |0x0 |0x1 |0x2 |0x3 |0x4 |0x5 |0x6 |0x7 |\n\
                 WEIGHT: |0x0 |0x4 |0x4 |0x4 |0x4 |0x4 |0x4 |0x4 |\n\
                 # High priority VL Arbitration Table:\n\
                 VL    : |0x0 |0x1 |0x2 |0x3 |0x4 |0x5 |0x6 |0x7 |\n\
                 WEIGHT: |0x4 |0x0 |0x0 |0x0 |0x0 |0x0 |0x0 |0x0 |"
            ),
            "OpenSM's VL arbitration on LID {lid}:\n{out}"
        );
    }
    done(n);
}

/// Two limited members of one partition (OpenSM's partitions file makes
/// every CA a limited member of the default partition): guest a's PMA Get
/// to guest b's QP1 carries P_Key 0x7fff, which b's table (0x7fff) does
/// not accept. Guest b's card drops it, counts P_KeyViolations and sends
/// the Bad P_Key trap (257), which b's driver forwards to OpenSM; OpenSM
/// logs it.
#[test]
fn a_pkey_violation_at_qp1_is_counted_and_opensm_logs_the_trap() {
    if !peers_present("a_pkey_violation_at_qp1_is_counted_and_opensm_logs_the_trap") {
        return;
    }
    let parts = "Default=0x7fff : ALL=limited, SELF=full ;\n";
    let mut n = net(
        "pkey",
        &["-P", "{conf}/partitions.conf"],
        &[("partitions.conf", parts)],
    );
    up(&mut n);
    let (la, lb) = (n.a.port(1).lid, n.b.port(1).lid);
    for g in [&mut n.a, &mut n.b] {
        let pkeys = g
            .core
            .device(g.dev)
            .unwrap()
            .port_cache(1)
            .unwrap()
            .pkeys
            .clone();
        assert_eq!(pkeys.first(), Some(&0x7fff), "{}: a limited member", g.name);
        assert_eq!(g.port(1).bad_pkey_cntr, 0);
    }
    let agent =
        n.a.core
            .register_mad_agent(n.a.dev, 1, ib_core::verbs::QpType::Gsi, None, 0)
            .expect("a GSI agent");
    let mut mad = ib_core::mad::Mad::new_request(0x04, 1, ib_core::mad::method::GET, 0x0012, 0);
    mad.0[0x40 + 1] = 1;
    let mut buf = ib_core::mad::MadSendBuf::new(
        mad,
        ib_core::verbs::AhAttr {
            dlid: lb,
            port_num: 1,
            ..ib_core::verbs::AhAttr::default()
        },
        1,
    );
    buf.remote_qkey = ib_core::verbs::IB_QP1_QKEY;
    n.a.core.post_send_mad(agent, buf).expect("PMA Get posted");
    let logged = log_shows(&mut n, "num:257");
    let log = n.sm.log();
    assert!(logged, "OpenSM logged the Bad P_Key trap:\n{log}");
    let want = format!("Bad P_Key:0x7fff on SL:0 from LID1:{la} QP1:0x1 to LID2:{lb} QP2:0x1");
    assert!(log.contains(&want), "{want:?} in OpenSM's log:\n{log}");
    assert!(
        log.contains(&format!("Producer:1 (Channel Adapter) from LID:{lb}")),
        "from guest b's port:\n{log}"
    );
    assert_eq!(n.b.port(1).bad_pkey_cntr, 1, "guest b's P_KeyViolations");
    let m = n.b.core.mad_counters(n.b.dev, 1).unwrap();
    assert_eq!(m.traps_forwarded, 1, "guest b's driver forwarded it: {m:?}");
    // The SM host reads the counter too.
    let (ok, out) = diag(&mut n, "/usr/sbin/smpquery", &["portinfo", &lb.to_string()]);
    assert!(ok, "{out}");
    assert_eq!(field(&out, "PkeyViolations"), "1", "{out}");
    let _ = n.a.core.unregister_mad_agent(agent);
    done(n);
}

const MKEY: &str = "0x00000000deadbeef";

/// OpenSM with an M_Key at protection `level` and a lease period.
fn mkey_conf(level: u8, lease: u16) -> String {
    format!("m_key {MKEY}\nm_key_protection_level {level}\nm_key_lease_period {lease}\n")
}

/// IBA 14.2.4.1 under OpenSM: at protection level 1 a PortInfo Get
/// without the key succeeds and reads M_Key 0, with the key it reads the
/// key; a Set without it (ibportstate) fails, counts M_KeyViolations and
/// the Bad M_Key trap (256) reaches OpenSM.
#[test]
fn mkey_level_1_hides_the_key_and_a_violation_traps_to_opensm() {
    if !peers_present("mkey_level_1_hides_the_key_and_a_violation_traps_to_opensm") {
        return;
    }
    let conf = mkey_conf(1, 0);
    let mut n = net(
        "mkey1",
        &["-F", "{conf}/opensm.conf"],
        &[("opensm.conf", &conf)],
    );
    up(&mut n);
    let la = n.a.port(1).lid.to_string();
    let (ok, out) = diag(&mut n, "/usr/sbin/smpquery", &["-K", "portinfo", &la, "1"]);
    assert!(ok, "a Get without the key succeeds at level 1:\n{out}");
    assert_eq!(field(&out, "Mkey"), "0x0000000000000000", "{out}");
    assert_eq!(field(&out, "ProtectBits"), "1", "{out}");
    let (ok, out) = diag(
        &mut n,
        "/usr/sbin/smpquery",
        &["-K", "-y", MKEY, "portinfo", &la, "1"],
    );
    assert!(ok, "{out}");
    assert_eq!(field(&out, "Mkey"), MKEY, "with the key:\n{out}");
    assert_eq!(field(&out, "MkeyViolations"), "0", "{out}");
    // A Set without the key: dropped (the tool times out), counted,
    // trapped.
    let (ok, out) = diag(&mut n, "/usr/sbin/ibportstate", &[&la, "1", "enable"]);
    assert!(!ok, "ibportstate's Set without the key fails:\n{out}");
    let logged = log_shows(&mut n, "num:256");
    let log = n.sm.log();
    assert!(logged, "OpenSM logged the Bad M_Key trap:\n{log}");
    let (ok, out) = diag(
        &mut n,
        "/usr/sbin/smpquery",
        &["-y", MKEY, "portinfo", &la, "1"],
    );
    assert!(ok, "{out}");
    // One violation per Set that reached the port: ibportstate's Set
    // goes out up to three times (libibmad's MAD_DEF_RETRIES), and
    // whether a retry lands before this query depends on the host's
    // timing (2 was seen once in a full run, 1 alone). Each violation
    // forwards at most one trap.
    let v: u64 = field(&out, "MkeyViolations").parse().unwrap_or(0);
    assert!((1..=3).contains(&v), "MkeyViolations {v}:\n{out}");
    let traps = n.a.core.mad_counters(n.a.dev, 1).unwrap().traps_forwarded;
    assert!((1..=v).contains(&traps), "{traps} traps for {v} violations");
    done(n);
}

/// A ConnectX-3 FDR port (MT27500 family) under OpenSM: 4x FDR, as
/// `ibstat` says ("Rate: 56"): PortInfo's extended speeds read by
/// mlx4_ib's query_port and by smpquery.
#[test]
fn the_ports_come_up_4x_fdr_under_opensm() {
    if !peers_present("the_ports_come_up_4x_fdr_under_opensm") {
        return;
    }
    let mut n = net("fdr", &[], &[]);
    up(&mut n);
    for g in [&mut n.a, &mut n.b] {
        let p = g.port(1);
        assert_eq!(p.state, PortState::Active);
        // ib_core's enums: width 2 = 4x, speed 16 = FDR (14.0625 Gb/s a
        // lane): ibstat's Rate 4 x 14 = 56.
        assert_eq!(
            (p.active_width, p.active_speed),
            (2, 16),
            "{}: {p:?}",
            g.name
        );
    }
    let la = n.a.port(1).lid.to_string();
    let (ok, out) = diag(&mut n, "/usr/sbin/smpquery", &["portinfo", &la, "1"]);
    assert!(ok, "{out}");
    assert_eq!(field(&out, "LinkSpeedExtActive"), "14.0625 Gbps", "{out}");
    assert_eq!(
        field(&out, "LinkSpeedExtSupported"),
        "14.0625 Gbps",
        "{out}"
    );
    assert!(out.contains("\t\t\t\tIsExtendedSpeedsSupported\n"), "{out}");
    assert_eq!(
        field(&out, "LinkSpeedActive"),
        "10.0 Gbps",
        "beside FDR: {out}"
    );
    // iblinkinfo reads both ends of every link: each guest's cable runs 4x
    // FDR, seen from the guest and from the switch (a SwitchX's ports have
    // FDR too); the SM host's port (a host node without extended speeds)
    // keeps its cable at 4x QDR, as link training picks the speed both
    // ends have.
    let (ok, out) = diag(&mut n, "/usr/sbin/iblinkinfo", &[]);
    assert!(ok, "{out}");
    let fdr = "==( 4X       14.0625 Gbps Active/  LinkUp)==>";
    for (g, lid, sw_port) in [("node0", 3, 1), ("node1", 4, 2)] {
        let guest_end = format!(" {lid}    1[  ] {fdr}       2 {sw_port:>4}[  ] \"sw0\"");
        assert!(out.contains(&guest_end), "{g}'s end at 4x FDR:\n{out}");
        let switch_end = format!("    2 {sw_port:>4}[  ] {fdr}       {lid}    1[  ] \"{g} HCA-1\"");
        assert!(
            out.contains(&switch_end),
            "the switch's end of {g}'s cable at 4x FDR:\n{out}"
        );
    }
    assert!(
        out.contains("==( 4X          10.0 Gbps Active/  LinkUp)==>       1    1[  ] \"smhost\""),
        "the SM host's cable at 4x QDR:\n{out}"
    );
    assert_eq!(out.matches("14.0625 Gbps").count(), 4, "{out}");
    done(n);
}

/// IBA 14.2.4.2 with OpenSM: an SM that does not know the ports' M_Key
/// (OpenSM restarted with another key and no cache) cannot read or set
/// them at protection level 2; its failed SMPs start the ports' lease
/// timers, the protection bits fall to 0 when they run out, OpenSM reads
/// the old key from PortInfo and with it installs its own. OpenSM
/// protects the switch's port 0 with its key too, so the switch keeps the
/// same lease (without it the new OpenSM stays blind beyond its own port:
/// ERR 3120 "Possible mis-set mkey?" for the switch's NodeInfo, then a
/// SUBNET UP of the SM host alone). The lease period OpenSM gives is
/// more than its sweep interval (it raises a smaller one to the interval
/// plus one when it reads its options): both OpenSMs sweep every second
/// from their config file, so the leases are 2 s.
#[test]
fn a_new_sm_without_the_key_takes_the_ports_over_when_the_lease_runs_out() {
    if !peers_present("a_new_sm_without_the_key_takes_the_ports_over_when_the_lease_runs_out") {
        return;
    }
    let k2 = "0x00000000cafef00d";
    let conf1 = format!("{}sweep_interval 1\n", mkey_conf(2, 1));
    let conf2 =
        format!("m_key {k2}\nm_key_protection_level 2\nm_key_lease_period 1\nsweep_interval 1\n");
    let mut n = net(
        "lease",
        &["-F", "{conf}/opensm.conf", "-s", "1"],
        &[("opensm.conf", &conf1), ("opensm2.conf", &conf2)],
    );
    up(&mut n);
    let la = n.a.port(1).lid.to_string();
    let (ok, out) = diag(
        &mut n,
        "/usr/sbin/smpquery",
        &["-K", "-y", MKEY, "portinfo", &la, "1"],
    );
    assert!(ok, "{out}");
    assert_eq!(field(&out, "Mkey"), MKEY, "{out}");
    assert_eq!(field(&out, "ProtectBits"), "2", "{out}");
    assert_eq!(field(&out, "MkeyLeasePeriod"), "2", "{out}");
    let second = n.conf.join("opensm2.conf").display().to_string();
    {
        let Net { a, b, sm, .. } = &mut n;
        sm.restart(&mut [a, b], &["-F", &second, "-s", "1"]);
    }
    let t = std::time::Instant::now();
    let ok = {
        let Net { a, b, sm, .. } = &mut n;
        sm.pump_until(&mut [a, b], Duration::from_secs(60), 256, |sm, _| {
            sm.subnet_ups() >= 1
        })
    };
    let up_after = t.elapsed();
    // Its first SUBNET UP is of the SM host alone: the switch's lease
    // has to run out (started by the new SM's first SMP to it), then each
    // guest's (started by the new SM's first SMPs to it), before a sweep
    // reports both guests' ports as new and ends with SUBNET UP. (No
    // smpquery meanwhile: a diag whose query times out may hang in
    // libumad2sim at exit.)
    let limit = Duration::from_secs(60);
    let taken = {
        let Net { a, b, sm, .. } = &mut n;
        sm.pump_until(&mut [a, b], limit, 256, |sm, g| {
            let log = sm.current_log();
            let names = g.iter().map(|g| format!("of node: {} HCA-1", g.name));
            names.into_iter().all(|w| log.contains(&w))
                && log
                    .rfind("state_mgr_report_new_ports")
                    .is_some_and(|i| log[i..].contains("SUBNET UP"))
        })
    };
    let log = n.sm.current_log();
    assert!(ok, "the new OpenSM brought the subnet up:\n{log}");
    assert!(
        taken,
        "the new SM took the guests over within {limit:?}:\n{log}"
    );
    eprintln!(
        "new SM: SUBNET UP {up_after:?} after its start, the guests' ports its own {:?} after it",
        t.elapsed()
    );
    for g in [&mut n.a, &mut n.b] {
        assert!(g.active(), "{}", g.name);
    }
    for lid in [la.clone(), n.b.port(1).lid.to_string()] {
        let (ok, out) = diag(
            &mut n,
            "/usr/sbin/smpquery",
            &["-K", "-y", k2, "portinfo", &lid, "1"],
        );
        assert!(ok, "LID {lid} answers the new key:\n{out}\n{log}");
        assert_eq!(
            field(&out, "Mkey"),
            k2,
            "the new SM's key on LID {lid}:\n{out}"
        );
        assert_eq!(field(&out, "ProtectBits"), "2", "{out}");
    }
    done(n);
}
