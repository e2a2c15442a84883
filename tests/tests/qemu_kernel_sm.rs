//! Our kernel's subnet manager in QEMU: `run-qemu.sh --sm none`, node 0 runs `opensm`.
//!
//! Two guests cabled back to back (no switch, `--emu-args --back-to-back`):
//! once node 0 sees node 1 at the end of its cable (a directed-route NodeInfo
//! answered), its SM brings both ports to Active (the first SUBNET UP within
//! 2 s of its start) and `ib_write_bw --check` runs between them. Three guests on the
//! switch: `ibnetdiscover` and `saquery -p` from the other guests, answered by
//! node 0's SM and SA. Beside Debian's OpenSM (started by the test on the
//! fabric's SM host, its log under `target/fabric/`): the priorities decide
//! who is master and stopping the master hands over, in one interactive
//! boot. One QEMU run at a time.

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

/// Debian's OpenSM on the fabric's SM host (the `--sm none` fabric's
/// ibsim server), started and ended by the test: its log in `dir`.
struct HostOpenSm {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl HostOpenSm {
    fn start(sock: &str, dir: &std::path::Path, args: &[&str]) -> HostOpenSm {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).expect("OpenSM's directory");
        let child = sim::fabric::ibsim::opensm_command(sock, "smhost", dir)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("OpenSM starts");
        HostOpenSm {
            child,
            log: dir.join("opensm.log"),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until OpenSM's log holds `needle`.
    fn wait_log(&self, needle: &str, limit: Duration, console: &str) -> String {
        let t = std::time::Instant::now();
        loop {
            let l = self.log();
            if l.contains(needle) {
                return l;
            }
            assert!(
                t.elapsed() < limit,
                "OpenSM's log said no {needle:?} within {limit:?}:\n{l}\n--- node 0:\n{console}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, then SIGKILL after 5 s.
    fn stop(mut self) -> String {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return self.log();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log()
    }
}

impl Drop for HostOpenSm {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Node 0's console: every command's output kept for the report.
struct Session {
    c: qemu::Console,
    seen: String,
}

impl Session {
    fn wait(&mut self, needle: &str) -> String {
        let s = self.c.try_wait_for(needle).unwrap_or_else(|e| {
            panic!("{e}\n--- node 0 so far:\n{}", self.seen);
        });
        let s = s.replace("\r\n", "\n");
        self.seen.push_str(&s);
        s
    }

    /// Runs `cmd` until it prints `needle`, a few times a second.
    fn run_until(&mut self, cmd: &str, needle: &str, limit: Duration) -> String {
        let t = std::time::Instant::now();
        loop {
            let out = self.run(cmd);
            if out.contains(needle) {
                return out;
            }
            assert!(
                t.elapsed() < limit,
                "{cmd:?} printed no {needle:?} within {limit:?}:\n{out}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Runs the `;`-separated commands of `cmds` one at a time (the
    /// console takes one a line) and returns what they printed up to the
    /// last one's prompt.
    fn run(&mut self, cmds: &str) -> String {
        let mut out = String::new();
        for cmd in cmds.split(';').map(str::trim) {
            self.c.send(&format!("{cmd}\r"));
            out.push_str(&self.wait("lego> "));
        }
        out
    }
}

#[test]
fn beside_opensm_the_priorities_decide_and_stopping_the_master_hands_over() {
    if !tests::subnet_common::peers_present(
        "beside_opensm_the_priorities_decide_and_stopping_the_master_hands_over",
    ) {
        return;
    }
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let fabric = qemu::root().join("target/fabric");
    let sockfile = fabric.join("ibsim-sockname");
    let _ = std::fs::remove_file(&sockfile);
    let t0 = std::time::Instant::now();
    let c = qemu::Console::boot(&["--nodes", "2", "--sm", "none"], Duration::from_secs(85));
    let mut s = Session {
        c,
        seen: String::new(),
    };
    s.wait("lego> ");
    let sock = std::fs::read_to_string(&sockfile)
        .unwrap_or_else(|e| panic!("{}: {e}", sockfile.display()))
        .trim()
        .to_string();
    let dir = fabric.join(format!("ksm-handover-{}", std::process::id()));
    // LIDs by our SM: its own port 1, then by port GUID the switch 2,
    // node 1 3, the SM host 4.
    let t_sm = std::time::Instant::now();
    let out = s.run("retry -n 60 -i 1 smpquery -D nodeinfo 0,1,2; opensm -p 5 -s 1");
    assert!(out.contains("priority 5: sweeping"), "{out}");
    s.wait("opensm: SUBNET UP");
    // OpenSM at a lower priority finds our master and stands by.
    let osm = HostOpenSm::start(&sock, &dir.join("p1"), &["-p", "1", "-s", "1"]);
    osm.wait_log("Entering STANDBY state", Duration::from_secs(20), &s.seen);
    // Its trap 144 (IsSM set) makes our master sweep and find it (the
    // SUBNET UP of a later sweep goes to the log quietly, as OpenSM's).
    s.wait("Received trap:144");
    // Read during its discovery, OpenSM's SMInfo says STANDBY at our next
    // (light) sweep's poll.
    s.run_until(
        "opensm status",
        "Other SM               : 0x0002c90300000f01 STANDBY (priority 1)",
        Duration::from_secs(10),
    );
    let out = s.run("sminfo; sminfo 4; opensm status");
    for want in [
        "sminfo: sm lid 1 sm guid 0x2c90300000011",
        "priority 5 state 3 SMINFO_MASTER",
        "sminfo: sm lid 4 sm guid 0x2c90300000f01",
        "priority 1 state 2 SMINFO_STANDBY",
        "SM State               : MASTER (priority 5)",
        "Other SM               : 0x0002c90300000f01 STANDBY (priority 1)",
    ] {
        assert!(out.contains(want), "{want:?} in:\n{out}");
    }
    // Our master stops: it hands over to OpenSM, which takes the subnet.
    let out = s.run("opensm stop");
    assert!(out.contains("exiting"), "{out}");
    let log = osm.wait_log("Entering MASTER state", Duration::from_secs(20), &s.seen);
    let _ = log;
    s.run_until(
        "sminfo 4",
        "priority 1 state 3 SMINFO_MASTER",
        Duration::from_secs(10),
    );
    osm.stop();
    // Ours again at 5 (no master now: it takes the subnet, keeping every
    // LID), then OpenSM at 10: we hand over and stand by.
    let out = s.run("opensm -p 5 -s 1");
    assert!(out.contains("sweeping"), "{out}");
    s.wait("opensm: SUBNET UP");
    let osm = HostOpenSm::start(&sock, &dir.join("p10"), &["-p", "10", "-s", "1"]);
    let log = osm.wait_log("Entering MASTER state", Duration::from_secs(20), &s.seen);
    // The ports learn their new SM LID from OpenSM's sweep as master.
    let mut out = s.run_until(
        "sminfo",
        "priority 10 state 3 SMINFO_MASTER",
        Duration::from_secs(10),
    );
    out.push_str(&s.run("opensm status; ibstat"));
    // Ours handed over to an OpenSM standing by (a HANDOVER's answer
    // gives the state before it), not to one still discovering, which
    // can lose it (then only OpenSM's polls time out, after 50 s).
    assert!(
        s.seen
            .contains("HANDOVER to SM 0x0002c90300000f01 answered (its state STANDBY)"),
        "{}\n--- OpenSM:\n{log}",
        s.seen
    );
    for want in [
        "sminfo: sm lid 4 sm guid 0x2c90300000f01",
        "priority 10 state 3 SMINFO_MASTER",
        "SM State               : STANDBY (priority 5)",
        "Master SM              : 0x0002c90300000f01, LID 4",
        "\t\tBase lid: 1\n",
        "\t\tSM lid: 4\n",
        "\t\tState: Active",
    ] {
        assert!(
            out.contains(want),
            "{want:?} in:\n{out}\n--- OpenSM:\n{log}"
        );
    }
    let guest_s = t_sm.elapsed().as_secs_f64();
    let out = s.run("opensm stop");
    assert!(out.contains("exiting"), "{out}");
    osm.stop();
    drop(s.c);
    let n1 = std::fs::read_to_string(qemu::root().join("target/nodes/node1.log"))
        .unwrap_or_default()
        .replace("\r\n", "\n");
    let n0 = s.seen.replace("\r\n", "\n");
    if std::env::var_os("SHOW_TRANSCRIPTS").is_some() {
        eprintln!("{n0}");
    }
    eprintln!(
        "SM start to OpenSM (10) master: {guest_s:.1} s; the run {:.1} s; our handover waited for OpenSM to stand by: {}",
        t0.elapsed().as_secs_f64(),
        n0.contains("is still DISCOVERING: handing over once it stands by")
    );
    // Both ports went Active once, at our first SUBNET UP, and kept their
    // LIDs (1 and 3) through four changes of master.
    for (t, lid) in [(&n0, 1), (&n1, 3)] {
        let active = t.matches("port 1 state: ACTIVE").count();
        assert_eq!(active, 1, "port 1 Active once:\n{t}");
        assert!(
            t.contains(&format!("port 1 state: ACTIVE, lid 0x{lid:x}")),
            "{t}"
        );
        // The one LID change: 0 to its LID at our first sweep.
        assert_eq!(t.matches("lid changed to").count(), 1, "{t}");
        assert!(
            t.contains(&format!("port 1: lid changed to 0x{lid:x}\n")),
            "{t}"
        );
        assert_eq!(
            t.matches("port 1 state:").count(),
            1,
            "never left Active:\n{t}"
        );
    }
}
