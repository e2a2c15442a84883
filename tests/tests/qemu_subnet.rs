//! The subnet comes up in QEMU.
//!
//! `run-qemu.sh --sm opensm|embedded|none` (OpenSM by default), two guests whose
//! ports a subnet manager brings to Active through their own QP0, `ibstat` with
//! distinct LIDs and the SM's LID, `saquery -p` and `sminfo` answered by the SM,
//! and nothing left running afterwards, however the run ends (normal exit, a guest
//! crash, Ctrl-C). Each test prints the time from kernel entry to port Active that
//! the guests logged (run with `--nocapture` to read it).

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tests::qemu::{self, root};

/// A boot takes seconds; the deadline only bounds a hang (two TCG guests
/// on a loaded 2-core machine are slow).
const DEADLINE: Duration = Duration::from_secs(100);

/// One QEMU run at a time from this file: two TCG guests already fill a
/// 2-core machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn script(args: &[&str]) -> (i32, String, String) {
    let r = qemu::script(args);
    (r.status, r.transcript, r.stderr)
}

fn opensm_present(test: &str) -> bool {
    let ok = std::path::Path::new("/usr/sbin/opensm").exists()
        && std::path::Path::new("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so").exists();
    if !ok {
        eprintln!(
            "SKIPPED {test}: OpenSM and libumad2sim0 are not installed (scripts/deps.sh ensure_ib_peers)"
        );
    }
    ok
}

/// The cx3-emu command line of a dry run.
fn emu_line(args: &[&str]) -> String {
    let mut a = vec!["--no-build", "--dry-run"];
    a.extend_from_slice(args);
    let (st, out, err) = script(&a);
    assert_eq!(st, 0, "{args:?}: {out}{err}");
    out.lines()
        .find(|l| l.contains("cx3-emu"))
        .unwrap_or_else(|| panic!("{args:?}: no cx3-emu line in {out}"))
        .to_string()
}

#[test]
fn the_sm_choice_reaches_the_emulator() {
    let l = emu_line(&[]);
    assert!(l.contains(" --sm opensm "), "OpenSM by default: {l}");
    assert!(
        l.contains("/target/fabric/run-") && l.contains(" --sockname-file "),
        "per-run OpenSM directory and the socket-name file: {l}"
    );
    assert!(emu_line(&["--nodes", "2"]).contains(" --sm opensm "));
    assert!(emu_line(&["--sm", "embedded"]).contains(" --sm embedded "));
    assert!(emu_line(&["--sm", "none"]).contains(" --sm none "));
    // The old spelling still works, and agrees with itself.
    let l = emu_line(&["--emu-args", "--embedded-sm"]);
    assert!(
        l.contains(" --sm embedded ") && l.contains("--embedded-sm"),
        "{l}"
    );
    let l = emu_line(&["--sm", "embedded", "--emu-args", "--embedded-sm"]);
    assert!(l.contains(" --sm embedded "), "{l}");
    for (args, msg) in [
        (&["--sm", "osm"][..], "--sm takes opensm, embedded or none"),
        (&["--sm"], "--sm needs an argument"),
        (
            &["--sm", "opensm", "--emu-args", "--embedded-sm"],
            "--sm opensm and --emu-args asking for the embedded SM disagree",
        ),
        (
            &["--sm", "none", "--emu-args", "--sm=opensm"],
            "--sm none and --emu-args asking for the opensm SM disagree",
        ),
        (&["--no-hca", "--sm", "none"], "--sm needs the emulated HCA"),
    ] {
        let mut a = vec!["--no-build", "--dry-run"];
        a.extend_from_slice(args);
        let (st, out, err) = script(&a);
        assert_eq!(st, 2, "{args:?}: {out}{err}");
        assert!(
            err.starts_with(&format!("run-qemu.sh: {msg}")),
            "{args:?}: {err}"
        );
        assert_eq!(out, "", "{args:?}: nothing may start");
    }
}

/// Node `n`'s part of a multi-node transcript.
fn node(transcript: &str, n: usize) -> &str {
    qemu::node(transcript, n).unwrap_or_else(|| panic!("no node {n} in:\n{transcript}"))
}

/// The milliseconds from kernel entry to port 1 Active a guest logged.
fn active_ms(t: &str) -> Option<f64> {
    let l = t
        .lines()
        .find(|l| l.contains("port 1 state: ACTIVE") && l.contains("after kernel entry"))?;
    let at = l.rfind('(')?;
    l[at + 1..].split(" ms").next()?.trim().parse().ok()
}

/// Processes (other than zombies) whose command line mentions `needle`.
fn processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if pid == std::process::id().to_string() {
            continue;
        }
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.trim_start().chars().next())
            .unwrap_or('?');
        if state == 'Z' {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) {
            found.push(format!("{pid} ({state}): {cmd}"));
        }
    }
    found
}

/// The run id (run-qemu.sh's pid) in its "subnet manager: OpenSM, log
/// target/fabric/run-N/opensm.log" line.
fn run_id(stderr: &str) -> Option<String> {
    let at = stderr.find("target/fabric/run-")? + "target/fabric/run-".len();
    let id: String = stderr[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    (!id.is_empty()).then_some(id)
}

/// Nothing of run `id` is left: no QEMU, cx3-emu or OpenSM (given a
/// moment to finish exiting).
fn assert_nothing_left(id: &str) {
    let needles = [format!("cx3-{id}-node"), format!("fabric/run-{id}")];
    let t = Instant::now();
    loop {
        let left: Vec<String> = needles.iter().flat_map(|n| processes_with(n)).collect();
        if left.is_empty() {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "processes of run {id} left behind:\n{}",
            left.join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Both guests wait for their port (saquery waits, as perftest's tools
/// do), give the other time to come up, then read their port and ask the
/// SA for a path to the other; node 0 pings its own LID (answered by its
/// own responder while `ibping` holds the console).
fn two_guests(sm: &str) -> qemu::Run {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let r = qemu::run(
        "uptime",
        &[
            "--nodes",
            "2",
            "--sm",
            sm,
            "--run-on",
            "0",
            "saquery -t 20000 -p 3; sleep 10; ibstat; saquery -t 20000 -p 4; sminfo; ibping -c 2 3",
            "--run-on",
            "1",
            "saquery -t 20000 -p 4; sleep 10; ibstat; saquery -t 20000 -p 3; saquery -t 20000 3",
        ],
        DEADLINE,
    );
    assert_eq!(r.status, 0, "{}\n{}", r.transcript, r.stderr);
    // The serial console ends lines with CR LF.
    qemu::Run {
        transcript: r.transcript.replace("\r\n", "\n"),
        ..r
    }
}

/// `ibping -c 2 LID` to the guest's own LID: the card loops each ping
/// back and the guest's own responder answers it while `ibping` polls
/// ib_core (the idle loop does not run meanwhile).
fn check_self_ping(t: &str, lid: u16) {
    assert_eq!(
        t.matches(&format!(" (Lid {lid}): time ")).count(),
        2,
        "two pongs from itself:\n{t}"
    );
    assert!(
        t.contains("2 packets transmitted, 2 received, 0% packet loss"),
        "{t}"
    );
}

/// A guest's part: its port, and the path to `peer` at `rate` (saquery's
/// rate field).
fn check_node(t: &str, lid: u16, peer: u16, sm_lid: u16, rate: &str) {
    for want in [
        "\t\tState: Active".to_string(),
        "\t\tPhysical state: LinkUp".to_string(),
        // A ConnectX-3 FDR port: 4x FDR (14.0625 Gb/s a lane).
        "\t\tRate: 56\n".to_string(),
        format!("\t\tBase lid: {lid}\n"),
        format!("\t\tSM lid: {sm_lid}\n"),
        // saquery -p PEER: a path from this port to the peer.
        "PathRecord dump:".to_string(),
        format!("\t\tdlid....................{peer}\n\t\tslid....................{lid}\n"),
        "\t\tnum_path_revers.........0x80\n".to_string(),
        "\t\tpkey....................0xFFFF\n".to_string(),
        // 4096-byte MTU and the rate, "exactly" (selector 2).
        "\t\tmtu.....................0x85\n".to_string(),
        format!("\t\trate....................{rate}\n"),
        format!("port 1 state: ACTIVE, lid 0x{lid:x}, sm_lid 0x{sm_lid:x}"),
    ] {
        assert!(t.contains(&want), "expected {want:?} in:\n{t}");
    }
    assert!(!t.contains("violation") && !t.contains("DMA fault"), "{t}");
}

#[test]
fn two_guests_come_up_active_under_opensm() {
    if !opensm_present("two_guests_come_up_active_under_opensm") {
        return;
    }
    let t0 = Instant::now();
    let r = two_guests("opensm");
    let took = t0.elapsed();
    let (n0, n1) = (node(&r.transcript, 0), node(&r.transcript, 1));
    // OpenSM's host node is LID 1, the switch 2, node i 3 + i (the
    // guid2lid cache cx3-emu seeds: the embedded SM's rule).
    // OpenSM reads the extended speeds: 4x FDR from end to end, 56 Gb/s
    // (rate 12 | selector 2).
    check_node(n0, 3, 4, 1, "0x8C");
    check_node(n1, 4, 3, 1, "0x8C");
    check_self_ping(n0, 3);
    // sminfo from a guest finds OpenSM (its host node's port GUID).
    assert!(
        n0.contains("sminfo: sm lid 1 sm guid 0x2c90300000f01, activity count ")
            && n0.contains(" state 3 SMINFO_MASTER"),
        "{n0}"
    );
    // A NodeRecord by LID: node 0's HCA, as the SA knows it.
    assert!(
        n1.contains("NodeRecord dump:\n\t\tlid.....................3\n")
            && n1.contains("\t\tnode_type...............Channel Adapter\n")
            && n1.contains("\t\tport_guid...............0x0002c90300000011\n"),
        "{n1}"
    );
    assert!(
        r.stderr
            .contains("subnet manager: OpenSM, log target/fabric/run-"),
        "{}",
        r.stderr
    );
    let id = run_id(&r.stderr).expect("the run's OpenSM directory");
    let log = std::fs::read_to_string(root().join(format!("target/fabric/run-{id}/opensm.log")))
        .unwrap_or_default();
    assert!(log.contains("SUBNET UP"), "OpenSM's log:\n{log}");
    assert_nothing_left(&id);
    eprintln!(
        "OpenSM: kernel entry to port Active: node0 {:?} ms, node1 {:?} ms; the run took {:.1} s",
        active_ms(n0),
        active_ms(n1),
        took.as_secs_f64()
    );
}

#[test]
fn two_guests_come_up_active_under_the_embedded_sm() {
    let t0 = Instant::now();
    let r = two_guests("embedded");
    let took = t0.elapsed();
    let (n0, n1) = (node(&r.transcript, 0), node(&r.transcript, 1));
    // The embedded SM takes LID 1 itself; the same LIDs as under OpenSM.
    // Its SA rates the 4x FDR link 56 Gb/s, as OpenSM does.
    check_node(n0, 3, 4, 1, "0x8C");
    check_node(n1, 4, 3, 1, "0x8C");
    check_self_ping(n0, 3);
    assert!(n0.contains(" state 3 SMINFO_MASTER"), "{n0}");
    assert!(
        r.stderr
            .contains("subnet manager: the fabric's embedded SM"),
        "{}",
        r.stderr
    );
    eprintln!(
        "embedded SM: kernel entry to port Active: node0 {:?} ms, node1 {:?} ms; the run took {:.1} s",
        active_ms(n0),
        active_ms(n1),
        took.as_secs_f64()
    );
}

#[test]
fn nothing_is_left_behind_after_a_guest_crash_or_ctrl_c() {
    if !opensm_present("nothing_is_left_behind_after_a_guest_crash_or_ctrl_c") {
        return;
    }
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A guest that crashes ends the run; OpenSM goes with the emulator.
    let r = qemu::run("crash", &[], Duration::from_secs(60));
    assert_eq!(r.status, 1, "{}\n{}", r.transcript, r.stderr);
    let id = run_id(&r.stderr).expect("OpenSM ran");
    assert_nothing_left(&id);

    // Ctrl-C at the terminal: SIGINT to the whole foreground group. What
    // the script says goes to a file, for the report if it does not end.
    let said = root().join(format!("target/tmp/ctrl-c-{}.stderr", std::process::id()));
    std::fs::create_dir_all(said.parent().unwrap()).unwrap();
    let err = std::fs::File::create(&said).unwrap();
    // A terminal's foreground job has SIGINT at its default; a test run
    // from a background job of a script inherits it ignored, and a shell
    // cannot trap a signal ignored when it started. `env` puts it back.
    let mut child = Command::new("env")
        .arg("--default-signal=INT")
        .arg(root().join("run-qemu.sh"))
        .args([
            "--no-build",
            "--nodes",
            "2",
            "--timeout",
            "90",
            "--run",
            "sleep 60",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .process_group(0)
        .spawn()
        .expect("run-qemu.sh runs");
    let id = child.id().to_string();
    let log = root().join(format!("target/fabric/run-{id}/opensm.log"));
    let t = Instant::now();
    while !log.exists() || processes_with(&format!("cx3-{id}-node")).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "run {id} did not start OpenSM and QEMU"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let st = Command::new("kill")
        .args(["-INT", "--", &format!("-{id}")])
        .status()
        .expect("kill runs");
    assert!(st.success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t.elapsed() > Duration::from_secs(15) {
            // Which of the run's processes hold it up (the script, QEMU
            // under timeout, cx3-emu, OpenSM), then what the script said.
            let mut left: Vec<String> = [format!("cx3-{id}-node"), format!("fabric/run-{id}")]
                .iter()
                .flat_map(|n| processes_with(n))
                .collect();
            left.sort();
            left.dedup();
            let script = std::fs::read_to_string(format!("/proc/{id}/wchan")).unwrap_or_default();
            left.push(format!("{id}: run-qemu.sh, waiting in {script:?}"));
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "run-qemu.sh did not end within 15 s of Ctrl-C; still running:\n{}\n\
                 its stderr:\n{}",
                left.join("\n"),
                std::fs::read_to_string(&said).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "interrupted: {status:?}");
    assert_nothing_left(&id);
    let _ = std::fs::remove_file(&said);
}

/// Issue 21, item 1: stray MADs from a guest to the SM's LID. `ib_write_bw
/// 1` sends a CM REQ (class 0x07) to LID 1 (OpenSM's host node), `ibping
/// 1` a Get of a vendor class nobody there registered (0x32); the host
/// node's MAD layer drops the one and answers the other with status
/// 0x000C, as a real host's does, and OpenSM (which umad2sim would crash
/// on a class it has no agent for) keeps running: `sminfo` answers after
/// them as before.
#[test]
fn stray_mads_to_the_sm_lid_leave_opensm_running() {
    if !opensm_present("stray_mads_to_the_sm_lid_leave_opensm_running") {
        return;
    }
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let r = qemu::run(
        "uptime",
        &[
            "--nodes",
            "2",
            "--sm",
            "opensm",
            "--run-on",
            "0",
            "retry -n 30 sminfo; sleep 15",
            "--run-on",
            "1",
            "retry -n 30 sminfo; ib_write_bw -n 10 1; ibping -c 2 1; sminfo",
        ],
        DEADLINE,
    );
    let t = r.transcript.replace("\r\n", "\n");
    let n1 = node(&t, 1);
    // ib_write_bw and ibping fail (nobody serves them at LID 1), so the
    // run says a command failed; nothing crashed or hung.
    assert_eq!(r.status, 1, "{t}\n{}", r.stderr);
    let after = n1
        .split("> ib_write_bw -n 10 1")
        .nth(1)
        .unwrap_or_else(|| panic!("node 1 ran ib_write_bw:\n{n1}"));
    let last = after
        .split("> sminfo")
        .nth(1)
        .unwrap_or_else(|| panic!("node 1 ran sminfo after them:\n{n1}"));
    assert!(
        last.contains("sminfo: sm lid 1 sm guid 0x2c90300000f01")
            && last.contains(" state 3 SMINFO_MASTER"),
        "OpenSM still answers SMInfo after the stray MADs:\n{n1}"
    );
    // Each ping was answered at once (status 0x000C: no Pong, but no
    // wait for the 1 s timeout either): two pings take the 1 s between
    // them, not 3 s.
    let ms: u64 = after
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .and_then(|l| l.split("time ").nth(1))
        .and_then(|x| x.split(" ms").next())
        .and_then(|x| x.trim().parse().ok())
        .unwrap_or_else(|| panic!("ibping's statistics:\n{after}"));
    assert!(ms < 2000, "both pings answered at once ({ms} ms):\n{after}");
    let id = run_id(&r.stderr).expect("the run's OpenSM directory");
    let log = std::fs::read_to_string(root().join(format!("target/fabric/run-{id}/opensm.log")))
        .unwrap_or_default();
    assert!(log.contains("SUBNET UP"), "OpenSM's log:\n{log}");
    // Every node answers Mellanox's ExtendedPortInfo (no ERR 3111).
    assert!(!log.contains("ERR 3111"), "OpenSM's log:\n{log}");
    assert_nothing_left(&id);
    eprintln!("node 1 after the stray MADs:\n{after}");
}
