//! `cx3-emu --sm`: the subnet manager the emulator runs.
//!
//! `cx3-emu --sm`: the subnet manager the emulator runs (docs/peers.md):
//! OpenSM as a child process that ends with the emulator however it ends,
//! the ibsim server the diags attach to, and the socket-name file
//! `scripts/ib-host.sh` reads. No guest drives the HCAs here (their ports
//! stay Down), so the subnet is the switch and OpenSM's host node; QEMU
//! guests brought to Active are `tests/tests/qemu_subnet.rs`. The tests
//! that need Debian's opensm, infiniband-diags and libumad2sim0 say
//! SKIPPED when they are missing.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const UMAD2SIM: &str = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so";

fn tools_present(test: &str) -> bool {
    let ok = Path::new("/usr/sbin/opensm").exists()
        && Path::new("/usr/sbin/sminfo").exists()
        && Path::new(UMAD2SIM).exists();
    if !ok {
        eprintln!(
            "SKIPPED {test}: needs opensm, infiniband-diags and libumad2sim0 (scripts/deps.sh ensure_ib_peers)"
        );
    }
    ok
}

/// A scratch directory with one window and RAM file per node.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn new(tag: &str) -> Files {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("emu-sm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Files { dir }
    }

    fn node_arg(&self, i: u32) -> String {
        let w = self.dir.join(format!("n{i}.win"));
        let r = self.dir.join(format!("n{i}.ram"));
        File::create(&w).unwrap().set_len(16 << 20).unwrap();
        File::create(&r).unwrap().set_len(4 << 20).unwrap();
        format!("{},{}", w.display(), r.display())
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Kills and reaps the emulator if a test fails before it exits.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wait_for(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < within {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// The children of `pid` (Linux's /proc task children list).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The OpenSM children of `pid` (waiting up to 5 s for exec to finish).
fn opensm_children(pid: u32) -> Vec<u32> {
    let mut osm = Vec::new();
    wait_for(Duration::from_secs(5), || {
        osm = children(pid)
            .into_iter()
            .filter(|p| comm(*p) == "opensm")
            .collect();
        !osm.is_empty()
    });
    osm
}

/// Starts cx3-emu serving two (undriven) nodes with `sm_args`; returns it,
/// the OpenSM directory and the socket-name file.
fn start(f: &Files, sm_args: &[&str]) -> (Reaper, PathBuf, PathBuf) {
    let sm_dir = f.dir.join("sm");
    let sockname = f.dir.join("ibsim-sockname");
    let child = Command::new(env!("CARGO_BIN_EXE_cx3-emu"))
        .args(["--node", &f.node_arg(0), "--node", &f.node_arg(1)])
        .args(sm_args)
        .arg("--sm-dir")
        .arg(&sm_dir)
        .arg("--sockname-file")
        .arg(&sockname)
        .stderr(Stdio::null())
        .spawn()
        .map(Reaper)
        .unwrap();
    (child, sm_dir, sockname)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs a diag through `scripts/ib-host.sh` on the fabric `sock` serves.
fn diag(sock: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(repo().join("scripts/ib-host.sh"))
        .args(["--sock", sock, "--timeout", "20"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn opensm_runs_as_the_emulators_child_and_ends_with_it() {
    if !tools_present("opensm_runs_as_the_emulators_child_and_ends_with_it") {
        return;
    }
    let f = Files::new("osm");
    let (mut emu, sm_dir, sockname) = start(&f, &["--sm", "opensm"]);
    let emu_pid = emu.0.id();
    assert!(
        wait_for(Duration::from_secs(10), || sockname.exists()),
        "the socket-name file appears"
    );
    let sock = std::fs::read_to_string(&sockname)
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(sock, format!("lego-{emu_pid}-0"));
    let osm = opensm_children(emu_pid);
    assert_eq!(osm.len(), 1, "one OpenSM, a child of cx3-emu");
    let log = sm_dir.join("opensm.log");
    assert!(
        wait_for(Duration::from_secs(20), || std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains("SUBNET UP"))),
        "OpenSM brings the switch and its host node up: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let (ok, out) = diag(&sock, &["sminfo"]);
    assert!(
        ok && out.contains("SMINFO_MASTER") && out.contains("sm lid 1 "),
        "sminfo through the emulator's server: {out}"
    );
    // SIGTERM: OpenSM says goodbye, the file goes, the emulator exits 0.
    let st = Command::new("kill")
        .args(["-TERM", &emu_pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(
        wait_for(Duration::from_secs(5), || emu
            .0
            .try_wait()
            .unwrap()
            .is_some()),
        "cx3-emu exits on SIGTERM"
    );
    assert!(emu.0.wait().unwrap().success());
    assert!(!alive(osm[0]), "OpenSM ended with the emulator");
    assert!(!sockname.exists(), "socket-name file removed");

    // SIGKILL: the emulator cannot clean up; OpenSM must still go.
    let (mut emu, _, sockname) = start(&f, &["--sm", "opensm"]);
    let emu_pid = emu.0.id();
    assert!(wait_for(Duration::from_secs(10), || sockname.exists()));
    let osm = opensm_children(emu_pid);
    assert_eq!(osm.len(), 1);
    emu.0.kill().unwrap();
    emu.0.wait().unwrap();
    assert!(
        wait_for(Duration::from_secs(3), || !alive(osm[0])),
        "OpenSM (pid {}) outlived a killed cx3-emu",
        osm[0]
    );
}

#[test]
fn embedded_sm_answers_the_diags_through_the_emulators_server() {
    if !tools_present("embedded_sm_answers_the_diags_through_the_emulators_server") {
        return;
    }
    let f = Files::new("emb");
    let (mut emu, sm_dir, sockname) = start(&f, &["--embedded-sm"]);
    assert!(wait_for(Duration::from_secs(10), || sockname.exists()));
    let sock = std::fs::read_to_string(&sockname)
        .unwrap()
        .trim()
        .to_string();
    assert!(
        !children(emu.0.id()).iter().any(|p| comm(*p) == "opensm"),
        "no OpenSM with the embedded SM"
    );
    // The embedded SM sweeps within its first second; sminfo may need a
    // second try while the host node's port is not yet Active.
    let mut last = String::new();
    let found = wait_for(Duration::from_secs(20), || {
        let (ok, out) = diag(&sock, &["sminfo"]);
        last = out;
        ok && last.contains("SMINFO_MASTER")
    });
    assert!(found, "sminfo finds the embedded SM: {last}");
    assert!(!sm_dir.join("opensm.log").exists());
    let _ = emu.0.kill();
    let _ = emu.0.wait();
}

#[test]
fn opensm_without_a_switch_port_is_refused_with_advice() {
    let f = Files::new("b2b");
    let out = Command::new(env!("CARGO_BIN_EXE_cx3-emu"))
        .args(["--node", &f.node_arg(0), "--node", &f.node_arg(1)])
        .args(["--back-to-back", "--sm", "opensm"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--sm opensm needs a switch") && err.contains("--sm none"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_cx3-emu"))
        .args(["--node", &f.node_arg(0)])
        .args(["--sm", "opensm", "--embedded-sm"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("two subnet managers"));
}
