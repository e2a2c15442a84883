//! Our kernel's subnet manager in QEMU: `run-qemu.sh --sm none`, node 0 runs `opensm`.
//!
//! Two guests cabled back to back (no switch, `--emu-args --back-to-back`):
//! once node 0 sees node 1 at the end of its cable (a directed-route NodeInfo
//! answered), its SM brings both ports to Active (the first SUBNET UP within
//! 2 s of its start) and `ib_write_bw --check` runs between them. Three guests on the
//! switch: `ibnetdiscover` and `saquery -p` from the other guests, answered by
//! node 0's SM and SA. One QEMU run at a time.

use std::sync::Mutex;
use std::time::Duration;

use tests::qemu;

const DEADLINE: Duration = Duration::from_secs(150);

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How a client runs: again a second later while it fails.
const RETRY: &str = "retry -n 40 -i 1";

fn node(t: &str, n: usize) -> String {
    qemu::node(t, n)
        .unwrap_or_else(|| panic!("no node {n} in:\n{t}"))
        .replace("\r\n", "\n")
}

/// The milliseconds of "First SUBNET UP : N.NNN ms after the start".
fn first_up_ms(t: &str) -> Option<f64> {
    let l = t.lines().find(|l| l.contains("First SUBNET UP"))?;
    let v = l.split(':').nth(1)?.trim();
    v.split(" ms").next()?.trim().parse().ok()
}

/// The milliseconds from kernel entry to port 1 Active a guest logged.
fn active_ms(t: &str) -> Option<f64> {
    let l = t
        .lines()
        .find(|l| l.contains("port 1 state: ACTIVE") && l.contains("after kernel entry"))?;
    let at = l.rfind('(')?;
    l[at + 1..].split(" ms").next()?.trim().parse().ok()
}

#[test]
fn two_guests_back_to_back_under_our_sm_run_ib_write_bw() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let r = qemu::run_args(
        &[
            "--nodes",
            "2",
            "--sm",
            "none",
            "--emu-args",
            "--back-to-back",
            "--run-on",
            "0",
            "retry -n 60 -i 1 smpquery -D nodeinfo 0,1; uptime; opensm -s 2; ib_write_bw --check -s 65536 -n 100; opensm status; ibstat; sminfo; saquery -p 2; sleep 15",
            "--run-on",
            "1",
            &format!("{RETRY} ib_write_bw --check -s 65536 -n 100 1; ibstat; saquery -p 1"),
        ],
        DEADLINE,
    );
    let (n0, n1) = (node(&r.transcript, 0), node(&r.transcript, 1));
    assert_eq!(r.status, 0, "{n0}\n{n1}\n{}", r.stderr);
    if std::env::var_os("SHOW_TRANSCRIPTS").is_some() {
        eprintln!("{n0}\n{n1}");
    }
    assert!(n0.contains("SUBNET UP (2 nodes, 2 end ports"), "{n0}");
    let up = first_up_ms(&n0).unwrap_or_else(|| panic!("no First SUBNET UP in:\n{n0}"));
    eprintln!(
        "back to back: first SUBNET UP {up:.3} ms after the SM's start; Active at {:?} / {:?} ms after kernel entry",
        active_ms(&n0),
        active_ms(&n1)
    );
    assert!(
        up < 2000.0,
        "both ports Active within 2 s of the start: {up} ms\n{n0}"
    );
    assert!(n0.contains("opensm: SUBNET UP"), "{n0}");
    assert!(n0.contains("SM State               : MASTER"), "{n0}");
    for (t, lid) in [(&n0, 1), (&n1, 2)] {
        assert!(t.contains("\t\tState: Active"), "{t}");
        assert!(t.contains(&format!("\t\tBase lid: {lid}\n")), "{t}");
        assert!(t.contains("\t\tSM lid: 1\n"), "{t}");
        assert!(t.contains("PathRecord dump:"), "{t}");
        assert!(t.contains("\t\tmtu.....................0x85\n"), "{t}");
    }
    // The client's result line, data checked.
    assert!(
        n1.contains("#bytes") && !n1.contains("mismatch"),
        "ib_write_bw ran:\n{n1}"
    );
    assert!(
        n0.contains("sminfo: sm lid 1 sm guid 0x2c90300000011") && n0.contains("SMINFO_MASTER"),
        "sminfo finds our SM:\n{n0}"
    );
}

#[test]
fn three_guests_on_a_switch_under_our_sm_discover_and_ask_the_sa() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // LIDs: the SM's port 1, then by port GUID: the switch 2, node 1 3,
    // node 2 4 (the SM host 5).
    let r = qemu::run_args(
        &[
            "--nodes",
            "3",
            "--sm",
            "none",
            "--run-on",
            "0",
            // Once both other guests answer at the switch (so the first
            // sweep sees them all and numbers them by GUID).
            "retry -n 60 -i 1 smpquery -D nodeinfo 0,1,2; retry -n 60 -i 1 smpquery -D nodeinfo 0,1,3; opensm; sleep 20; opensm status",
            "--run-on",
            "1",
            &format!("{RETRY} saquery -p 4; ibnetdiscover; saquery -N"),
            "--run-on",
            "2",
            &format!("{RETRY} saquery -p 3; sminfo; sleep 2"),
        ],
        DEADLINE,
    );
    let (n0, n1, n2) = (
        node(&r.transcript, 0),
        node(&r.transcript, 1),
        node(&r.transcript, 2),
    );
    assert_eq!(r.status, 0, "{n0}\n{n1}\n{n2}\n{}", r.stderr);
    eprintln!(
        "three guests: first SUBNET UP {:?} ms after the SM's start",
        first_up_ms(&n0)
    );
    // The switch, the three guests and the fabric's SM host (attached
    // for the host's diags even with `--sm none`).
    assert!(
        n0.contains("Subnet                 : 5 nodes, 5 end ports"),
        "{n0}"
    );
    // ibnetdiscover from node 1: the switch and the three CAs.
    for want in [
        "Switch\t36 \"S-0002c90000000100\"",
        "caguid=0x2c90300000010",
        "caguid=0x2c90300000020",
        "caguid=0x2c90300000030",
    ] {
        assert!(n1.contains(want), "ibnetdiscover shows {want:?}:\n{n1}");
    }
    assert!(
        n1.contains("\t\tdlid....................4\n\t\tslid....................3\n"),
        "{n1}"
    );
    assert!(
        n2.contains("\t\tdlid....................3\n\t\tslid....................4\n"),
        "{n2}"
    );
    assert!(
        n2.contains("sm lid 1") && n2.contains("SMINFO_MASTER"),
        "{n2}"
    );
}
