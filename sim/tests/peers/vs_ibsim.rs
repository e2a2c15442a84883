//! The switch as ibsim answers for a SwitchX (issue 21, item 5): the same
//! diag queries on the real ibsim and on our fabric, each under OpenSM,
//! and their fields compared: SwitchInfo, PortInfo of port 0 and of an
//! external port (LinkState, CapabilityMask), Mellanox ExtendedPortInfo,
//! GUIDInfo, the partition enforcement table, and the multicast
//! forwarding table OpenSM programs after two ports join the IPoIB
//! group; what the discovery tools print ("bad status" lines) and what
//! OpenSM logs (ERR 3111). Then `ibportstate` on our fabric: query,
//! disable, enable and reset of a switch port.

use std::time::{Duration, Instant};

use sim::LogicalState;

use crate::protocol::{RawClient, connect, tid_of};
use crate::rig::{IbsimRef, NET_SMALL, Rig, ibsim_present, tools_present};

const UP_LIMIT: Duration = Duration::from_secs(30);
const DIAG_LIMIT: Duration = Duration::from_secs(20);

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

/// The same diag on both fabrics, from H2: (ibsim's output, ours), both
/// having succeeded.
/// Each MAD waits up to 5 s (`-t 5000`) instead of the diags' 1 s: under
/// a loaded host the fabric's server thread can miss the default (seen at
/// load 12 in `smpquery switchinfo`); the answers compared are the same.
fn both(r: &IbsimRef, rig: &Rig, prog: &str, args: &[&str]) -> (String, String) {
    let args: Vec<&str> = ["-t", "5000"].iter().chain(args).copied().collect();
    let (ok_r, a, _) = r.diag("H2", prog, &args, DIAG_LIMIT);
    let (ok_o, b, _) = rig.diag("H2", prog, &args, DIAG_LIMIT);
    assert!(ok_r, "{prog} {args:?} on ibsim:\n{a}");
    assert!(ok_o, "{prog} {args:?} on our fabric:\n{b}");
    (a, b)
}

/// Asserts that `fields` read the same in both outputs.
fn same(what: &str, a: &str, b: &str, fields: &[&str]) {
    for f in fields {
        let (x, y) = (field(a, f), field(b, f));
        assert!(!x.is_empty(), "{what}: ibsim shows {f}:\n{a}");
        assert_eq!(
            x, y,
            "{what}: {f} as ibsim answers\n-- ibsim:\n{a}\n-- ours:\n{b}"
        );
    }
}

/// An SA SubnAdmSet(MCMemberRecord): port GUID `port_guid` joins the IPoIB
/// broadcast group of the default partition as a full member.
fn join_ipoib_group(c: &RawClient, sm_lid: u16, port_guid: u64, tid: u64) {
    let mut m = [0u8; 256];
    m[0] = 1;
    m[1] = 0x03; // SubnAdm
    m[2] = 2;
    m[3] = 0x02; // Set
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&0x0038u16.to_be_bytes()); // MCMemberRecord
    // ComponentMask: MGID, PortGID, JoinState.
    m[48..56].copy_from_slice(&0x1_0003u64.to_be_bytes());
    let d = 56;
    m[d..d + 16].copy_from_slice(&[
        0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
    ]);
    m[d + 16..d + 24].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
    m[d + 24..d + 32].copy_from_slice(&port_guid.to_be_bytes());
    m[d + 48] = 1; // JoinState: full member
    // OpenSM's SA ignores requests until its first sweep has ended:
    // retry a few times.
    for _ in 0..10 {
        c.send(sm_lid, 1, &m);
        // (ibsim leaves its client slot in TID bits 48..63: compare the
        // low 32 bits, as libibmad does.)
        if let Some((st, r)) = c.recv()
            && st == 0
            && tid_of(&r) as u32 == tid as u32
        {
            assert_eq!(
                u16::from_be_bytes([r[4], r[5]]),
                0,
                "the SA took the join of {port_guid:#x}"
            );
            return;
        }
    }
    panic!("no answer to the join of {port_guid:#x}");
}

/// The `ibroute -M` line of MLID 0xc000 (waiting, with a deadline, for
/// OpenSM to program the table after the joins).
fn mft_line(diag: impl Fn() -> String) -> String {
    let t = Instant::now();
    loop {
        let out = diag();
        if let Some(l) = out.lines().find(|l| l.starts_with("0xc000")) {
            return l.trim_end().to_string();
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no MFT entry for 0xc000:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_switch_answers_as_ibsim_does_for_a_switchx() {
    if !tools_present("the_switch_answers_as_ibsim_does_for_a_switchx")
        || !ibsim_present("the_switch_answers_as_ibsim_does_for_a_switchx")
    {
        return;
    }
    let mut r = IbsimRef::start("cmp", NET_SMALL);
    r.start_opensm("H1", &[]);
    assert!(r.wait_subnet_up(UP_LIMIT), "{}", r.opensm_log());
    let mut rig = Rig::start("cmp", NET_SMALL);
    rig.start_opensm("H1", &[]);
    assert!(
        rig.wait_subnet_up(1, UP_LIMIT).is_some(),
        "{}",
        rig.opensm_log()
    );
    let smp = "/usr/sbin/smpquery";

    // SwitchInfo (by directed route: the switch is one hop from H2).
    let (a, b) = both(&r, &rig, smp, &["-D", "switchinfo", "0,1"]);
    same(
        "SwitchInfo",
        &a,
        &b,
        &[
            "RandomFdbCap",
            "McastFdbCap",
            "LinearFdbTop",
            "DefPort",
            "DefMcastPrimPort",
            "DefMcastNotPrimPort",
            "LifeTime",
            "StateChange",
            "OptSLtoVLMapping",
            "LidsPerPort",
            "PartEnforceCap",
            "FilterRawInbound",
            "FilterRawOutbound",
            "EnhancedPort0",
        ],
    );
    // Apart by design: a SwitchX holds 48K unicast LIDs (ibsim's table
    // stops at 30K), and the model enforces partitions.
    assert_eq!(field(&b, "LinearFdbCap"), "49152", "{b}");
    assert_eq!(
        (field(&b, "InboundPartEnf"), field(&b, "OutboundPartEnf")),
        ("1".into(), "1".into()),
        "{b}"
    );

    // PortInfo of port 0 (Active once configured, ibsim's CapabilityMask)
    // and of external port 2 (H2's cable).
    let (a, b) = both(&r, &rig, smp, &["-D", "portinfo", "0,1", "0"]);
    same(
        "PortInfo port 0",
        &a,
        &b,
        &[
            "LinkState",
            "PhysLinkState",
            "CapMask",
            "Lid",
            "SMLid",
            "LMC",
            "GuidCap",
        ],
    );
    assert_eq!(field(&b, "LinkState"), "Active", "{b}");
    assert_eq!(field(&b, "CapMask"), "0xc048", "{b}");
    let (a, b) = both(&r, &rig, smp, &["-D", "portinfo", "0,1", "2"]);
    same(
        "PortInfo port 2",
        &a,
        &b,
        &["LinkState", "PhysLinkState", "CapMask", "LinkWidthActive"],
    );
    // Apart by design: a SwitchX's external ports support and enable FDR
    // (PortInfo's extended speeds, 14.0625 Gb/s a lane; port 0's
    // CapabilityMask, the same as ibsim's, says IsExtendedSpeedsSupported),
    // where ibsim's switch reports none by default. H2 is a host node with
    // no extended speeds (as ibsim's CAs), so its cable trains to QDR and
    // none is active: FDR runs only where both ends have it.
    for f in ["LinkSpeedExtSupported", "LinkSpeedExtEnabled"] {
        assert_eq!(field(&a, f), "0", "ibsim: no extended speeds\n{a}");
        assert_eq!(field(&b, f), "14.0625 Gbps", "{b}");
    }
    assert_eq!(field(&a, "LinkSpeedExtActive"), "No Extended Speed", "{a}");
    assert_eq!(field(&b, "LinkSpeedExtActive"), "No Extended Speed", "{b}");

    // Mellanox ExtendedPortInfo: switch ports 0 and 2, and H2's own port
    // (the host node).
    let mepi = [
        "StateChangeEnable",
        "LinkSpeedSupported",
        "LinkSpeedEnabled",
        "LinkSpeedActive",
    ];
    for args in [
        &["-D", "mepi", "0,1", "0"][..],
        &["-D", "mepi", "0,1", "2"],
        &["-D", "mepi", "0"],
    ] {
        let (a, b) = both(&r, &rig, smp, args);
        same(&format!("ExtendedPortInfo {args:?}"), &a, &b, &mepi);
    }

    // GUIDInfo of port 0; the partition enforcement table of port 2.
    let (a, b) = both(&r, &rig, smp, &["-D", "guidinfo", "0,1"]);
    assert_eq!(a, b, "GUIDInfo as ibsim answers");
    let (a, b) = both(&r, &rig, smp, &["-D", "pkeys", "0,1", "2"]);
    let cap = |o: &str| {
        o.lines()
            .find(|l| l.contains("pkeys capacity"))
            .map(str::to_string)
    };
    assert_eq!(cap(&a), cap(&b), "PartitionEnforcementCap:\n{a}\n{b}");
    assert!(b.contains("   0: 0xffff"), "OpenSM set H2's P_Key:\n{b}");

    // The discovery tools: no "bad status" lines (a SwitchX and a
    // ConnectX-3 answer ExtendedPortInfo), on either fabric.
    for prog in [
        "/usr/sbin/ibnetdiscover",
        "/usr/sbin/iblinkinfo",
        "/usr/sbin/ibqueryerrors",
        "/usr/sbin/ibhosts",
    ] {
        let (a, b) = both(&r, &rig, prog, &[]);
        assert!(!a.contains("bad status"), "{prog} on ibsim:\n{a}");
        assert!(!b.contains("bad status"), "{prog} on our fabric:\n{b}");
    }
    let (_, b) = both(&r, &rig, "/usr/sbin/ibnetdiscover", &[]);
    assert!(b.contains("Switch\t8 \"S-0002c90000000100\""), "{b}");

    // H2 and H3 join the IPoIB group; OpenSM programs both switches'
    // multicast forwarding tables the same way.
    for (k, base, sm_lid) in [(0u32, &r.base, 1u16), (1, &rig.base, 1)] {
        for (j, (node, guid)) in [
            ("H2", 0x0002_c903_0000_0021u64),
            ("H3", 0x0002_c903_0000_0031),
        ]
        .into_iter()
        .enumerate()
        {
            let c = connect(base, 79001 + 10 * k + j as u32, node, false).expect("attach");
            join_ipoib_group(&c, sm_lid, guid, 0x4a00 + u64::from(k));
        }
    }
    let ours = mft_line(|| {
        rig.diag("H2", "/usr/sbin/ibroute", &["-M", "2"], DIAG_LIMIT)
            .1
    });
    let theirs = mft_line(|| {
        r.diag("H2", "/usr/sbin/ibroute", &["-M", "2"], DIAG_LIMIT)
            .1
    });
    assert_eq!(ours, theirs, "ibroute -M: the group's port mask");
    let sw = rig
        .world()
        .fabric
        .switch(sim::fabric::SwitchId(0))
        .map(|s| s.mft_ports(0xc000))
        .unwrap_or_default();
    assert_eq!(sw, vec![2, 3], "H2's and H3's switch ports");
    let (a, b) = both(&r, &rig, smp, &["-D", "switchinfo", "0,1"]);
    eprintln!(
        "MulticastFDBTop after the joins: ibsim {} ours {}",
        field(&a, "MulticastFDBTop"),
        field(&b, "MulticastFDBTop")
    );

    // OpenSM configured everything without an error: no ERR 3111 (an
    // attribute refused, as ExtendedPortInfo was), none at all.
    let log = rig.opensm_log();
    let errs: Vec<&str> = log.lines().filter(|l| l.contains(" ERR ")).collect();
    assert!(
        errs.is_empty(),
        "OpenSM's errors on our fabric:\n{}",
        errs.join("\n")
    );
}

fn node(rig: &Rig, name: &str) -> (LogicalState, u16) {
    let w = rig.world();
    let n = w.server.node(name).expect("node");
    (n.state(), n.lid())
}

#[test]
fn ibportstate_queries_disables_enables_and_resets_a_switch_port() {
    if !tools_present("ibportstate_queries_disables_enables_and_resets_a_switch_port") {
        return;
    }
    let mut rig = Rig::start("portstate", NET_SMALL);
    // No periodic sweep: the switch's trap brings the port back.
    rig.start_opensm("H1", &["-s", "0"]);
    assert!(
        rig.wait_subnet_up(1, UP_LIMIT).is_some(),
        "{}",
        rig.opensm_log()
    );
    let (_, h3) = node(&rig, "H3");
    let sw_lid = rig
        .world()
        .fabric
        .switch(sim::fabric::SwitchId(0))
        .map(|s| s.lid())
        .unwrap_or(0)
        .to_string();
    let ps = |args: &[&str]| {
        let mut a = vec![sw_lid.as_str()];
        a.extend_from_slice(args);
        rig.diag("H1", "/usr/sbin/ibportstate", &a, DIAG_LIMIT)
    };
    // Query: the port, its ExtendedPortInfo, and its peer (reached by the
    // LID-routed start of a directed route at the switch).
    let (ok, out, _) = ps(&["3", "query"]);
    assert!(ok, "ibportstate query:\n{out}");
    assert!(out.contains("# MLNX ext Port info: Lid"), "{out}");
    assert!(out.contains("Peer PortInfo:"), "{out}");
    assert_eq!(field(&out, "LinkState"), "Active", "{out}");

    // Disable: H3's link goes down, H3 cannot be reached.
    let (ok, out, _) = ps(&["3", "disable"]);
    assert!(ok, "ibportstate disable:\n{out}");
    assert!(
        rig.wait_for(Duration::from_secs(5), |w| w
            .server
            .node("H3")
            .is_some_and(|n| n.state() == LogicalState::Down)),
        "H3 Down after the disable"
    );
    let (ok, out, _) = ps(&["3", "query"]);
    assert!(ok, "{out}");
    assert_eq!(field(&out, "PhysLinkState"), "Disabled", "{out}");
    let (ok, out, _) = rig.diag(
        "H1",
        "/usr/sbin/smpquery",
        &["-t", "200", "nodeinfo", &h3.to_string()],
        DIAG_LIMIT,
    );
    assert!(
        !ok,
        "H3 unreachable while its switch port is disabled:\n{out}"
    );

    // Enable: the link trains, the switch traps, OpenSM brings H3 back.
    let (ok, out, _) = ps(&["3", "enable"]);
    assert!(ok, "ibportstate enable:\n{out}");
    assert!(
        rig.wait_for(UP_LIMIT, |w| w
            .server
            .node("H3")
            .is_some_and(|n| n.state() == LogicalState::Active)),
        "H3 Active again after the enable:\n{}",
        rig.opensm_log()
    );
    assert_eq!(node(&rig, "H3").1, h3, "the same LID");
    let (ok, out, _) = rig.diag(
        "H1",
        "/usr/sbin/smpquery",
        &["nodeinfo", &h3.to_string()],
        DIAG_LIMIT,
    );
    assert!(ok, "H3 answers again:\n{out}");

    // Reset: the link retrains (H3 goes through Down) and comes back.
    let downs = rig
        .world()
        .server
        .node("H3")
        .map(|n| n.counters().link_downed)
        .unwrap_or(0);
    let (ok, out, _) = ps(&["3", "reset"]);
    assert!(ok, "ibportstate reset:\n{out}");
    assert!(
        rig.wait_for(UP_LIMIT, |w| w.server.node("H3").is_some_and(|n| {
            n.counters().link_downed > downs && n.state() == LogicalState::Active
        })),
        "H3's link went down and came back Active after the reset:\n{}",
        rig.opensm_log()
    );
}
