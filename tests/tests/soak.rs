//! The soak of issue 26: two or three of our guests under the real OpenSM on
//! the emulated fabric, driven over their serial consoles for a set time
//! (perftest bandwidth runs with `--check`, rmem writes and checked reads,
//! pings over IPoIB) while the fabric is disturbed at seeded random times
//! (cable pulls, OpenSM restarts, bursts of dropped packets); at the end
//! every guest must still answer, every data check made must have passed,
//! the model must have recorded no violation, errors outside the faults'
//! windows must be none, and the kernels' heap and DMA pool use must not
//! have grown. Run by `scripts/soak.sh` (docs/soak.md); `#[ignore]`d, as
//! it takes minutes to an hour. Configured by SOAK_MINUTES, SOAK_NODES and
//! SOAK_SEED.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::qemu::{FATAL, root};

const PROMPT: &str = "lego> ";
/// Node 0's port GUID (the rmem server), as `run-qemu.sh --nodes N` has it.
const NODE0_GUID: &str = "0x0002c90300000011";

/// A small seeded generator (xorshift64*), so the schedule prints and repeats.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum FaultKind {
    CablePull,
    SmRestart,
    DropBurst,
}

/// One planned disturbance, in seconds of the fabric's clock (from the
/// emulator's start).
#[derive(Clone, Debug)]
struct Fault {
    kind: FaultKind,
    at_s: u64,
    len_s: u64,
    node: usize,
}

impl Fault {
    fn describe(&self) -> String {
        match self.kind {
            FaultKind::CablePull => format!(
                "t={}s cable pull at node{}/1, re-plugged after {}s",
                self.at_s, self.node, self.len_s
            ),
            FaultKind::SmRestart => format!("t={}s OpenSM restart", self.at_s),
            FaultKind::DropBurst => format!(
                "t={}s burst of dropped packets (half the packets to every HCA) for {}s",
                self.at_s, self.len_s
            ),
        }
    }
    /// The window in which an activity may fail because of it: the fault
    /// and 45 s of recovery (OpenSM's sweep, the CM's and the transport's
    /// retries, ARP).
    fn window(&self) -> (u64, u64) {
        (self.at_s, self.at_s + self.len_s + 45)
    }
}

/// The plan: about one fault of each kind per two minutes, spread over
/// the activity window, seeded.
fn plan(seed: u64, start_s: u64, end_s: u64, nodes: usize) -> Vec<Fault> {
    let mut rng = Rng(seed | 1);
    let each = ((end_s - start_s) / 120).max(1);
    let mut v = Vec::new();
    for kind in [
        FaultKind::CablePull,
        FaultKind::SmRestart,
        FaultKind::DropBurst,
    ] {
        for _ in 0..each {
            let at_s = rng.range(start_s, end_s.saturating_sub(30).max(start_s + 1));
            let len_s = match kind {
                FaultKind::CablePull => rng.range(1, 9),
                FaultKind::SmRestart => 3,
                FaultKind::DropBurst => rng.range(2, 7),
            };
            let node = rng.range(0, nodes as u64) as usize;
            v.push(Fault {
                kind,
                at_s,
                len_s,
                node,
            });
        }
    }
    v.sort_by_key(|f| f.at_s);
    v
}

/// One guest: QEMU with its serial console on pipes, a transcript file.
struct Guest {
    id: usize,
    child: Child,
    stdin: ChildStdin,
    rx: Receiver<Vec<u8>>,
    seen: String,
    log: File,
}

/// How a console command ended.
enum Outcome {
    Ok(String),
    Failed(String),
    /// Did not end within its time; Ctrl-C brought the prompt back.
    Interrupted(String),
}

impl Guest {
    fn spawn(id: usize, qemu: Vec<String>, log: &Path) -> Guest {
        let mut child = Command::new(&qemu[0])
            .args(&qemu[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("QEMU starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let mut out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Guest {
            id,
            child,
            stdin,
            rx,
            seen: String::new(),
            log: File::create(log).expect("transcript file"),
        }
    }

    fn send(&mut self, keys: &str) -> Result<(), String> {
        self.stdin
            .write_all(keys.as_bytes())
            .and_then(|_| self.stdin.flush())
            .map_err(|e| format!("node{}: console input: {e}", self.id))
    }

    /// Output up to and including `needle`, or why not (deadline, a fatal
    /// line, QEMU gone).
    fn wait_for(&mut self, needle: &str, within: Duration) -> Result<String, String> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(i) = self.seen.find(needle) {
                return Ok(self.seen.drain(..i + needle.len()).collect());
            }
            if let Some(f) = FATAL.iter().find(|f| self.seen.contains(*f)) {
                return Err(format!("node{}: the kernel printed {f:?}", self.id));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left.min(Duration::from_secs(1))) {
                Ok(b) => {
                    let _ = self.log.write_all(&b);
                    self.seen.push_str(&String::from_utf8_lossy(&b));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(format!("node{}: QEMU's output ended", self.id));
                }
                Err(mpsc::RecvTimeoutError::Timeout) if left.is_zero() => {
                    return Err(format!("node{}: no {needle:?} within {within:?}", self.id));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Types `cmd` (not waiting for it to end).
    fn start(&mut self, cmd: &str) -> Result<(), String> {
        self.send(&format!("{cmd}\r"))
    }

    /// Waits for the command started last to end (the prompt), Ctrl-C
    /// after `within`, then asks `status`. Err: the guest no longer answers.
    fn finish(&mut self, within: Duration) -> Result<Outcome, String> {
        let out = match self.wait_for(PROMPT, within) {
            Ok(o) => o,
            Err(e) if e.contains("no \"lego> \"") => {
                self.send("\x03")?;
                let o = self.wait_for(PROMPT, Duration::from_secs(60))?;
                return Ok(Outcome::Interrupted(o));
            }
            Err(e) => return Err(e),
        };
        self.start("status")?;
        let st = self.wait_for(PROMPT, Duration::from_secs(60))?;
        if st.contains("status 0") {
            Ok(Outcome::Ok(out))
        } else {
            Ok(Outcome::Failed(out))
        }
    }

    fn run(&mut self, cmd: &str, within: Duration) -> Result<Outcome, String> {
        self.start(cmd)?;
        self.finish(within)
    }

    /// `meminfo`'s HeapUsed and DmaUsed, in kB.
    fn memory(&mut self) -> Result<(u64, u64), String> {
        let out = match self.run("meminfo", Duration::from_secs(60))? {
            Outcome::Ok(o) => o,
            _ => return Err(format!("node{}: meminfo failed", self.id)),
        };
        let kb = |key: &str| {
            out.lines()
                .find(|l| l.trim_start().starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse::<u64>().ok())
        };
        match (kb("HeapUsed:"), kb("DmaUsed:")) {
            (Some(h), Some(d)) => Ok((h, d)),
            _ => Err(format!(
                "node{}: meminfo without HeapUsed/DmaUsed:\n{out}",
                self.id
            )),
        }
    }
}

/// What happened, for the summary.
#[derive(Default)]
struct Tally {
    /// Activity -> (iterations, succeeded).
    iterations: BTreeMap<&'static str, (u64, u64)>,
    data_checks: u64,
    data_checks_passed: u64,
    data_check_failures: Vec<String>,
    /// (activity, how reported) -> (count, in a fault's window).
    errors: BTreeMap<(String, String), (u64, u64)>,
    unexplained: Vec<String>,
}

/// The line that says why a command failed: the last line naming an error,
/// digits folded so that kinds count together.
fn error_kind(out: &str) -> String {
    let line = out
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with(PROMPT.trim_end()) && !l.starts_with("retry:"))
        .unwrap_or("(no output)");
    let mut s: String = line
        .chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect();
    while s.contains("##") {
        s = s.replace("##", "#");
    }
    s.chars().take(140).collect()
}

struct Soak {
    guests: Vec<Guest>,
    started: Instant,
    faults: Vec<Fault>,
    tally: Tally,
}

impl Soak {
    fn now_s(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    fn in_fault_window(&self, from: u64, to: u64) -> bool {
        self.faults.iter().any(|f| {
            let (a, b) = f.window();
            from <= b && to >= a
        })
    }

    /// Records one command's outcome; `check`: it checks data.
    fn record(&mut self, what: &'static str, from: u64, o: &Outcome, check: bool) -> bool {
        let to = self.now_s();
        let e = self.tally.iterations.entry(what).or_default();
        e.0 += 1;
        let (ok, out, how) = match o {
            Outcome::Ok(out) => (true, out, ""),
            Outcome::Failed(out) => (false, out, "failed: "),
            Outcome::Interrupted(out) => (false, out, "timed out, Ctrl-C: "),
        };
        if ok {
            e.1 += 1;
            if check {
                self.tally.data_checks += 1;
                self.tally.data_checks_passed += 1;
            }
            return true;
        }
        if out.contains("data check failed") {
            self.tally.data_checks += 1;
            self.tally
                .data_check_failures
                .push(format!("t={from}-{to}s {what}: {}", error_kind(out)));
        }
        let kind = format!("{how}{}", error_kind(out));
        let near = self.in_fault_window(from, to);
        let c = self
            .tally
            .errors
            .entry((what.to_string(), kind.clone()))
            .or_default();
        c.0 += 1;
        if near {
            c.1 += 1;
        } else {
            self.tally
                .unexplained
                .push(format!("t={from}-{to}s {what}: {kind}"));
        }
        println!("soak: t={to}s {what}: {kind}");
        false
    }

    /// A perftest pair: node 0 serves, node 1 runs the client by LID.
    fn perftest(&mut self, tool: &'static str) -> Result<(), String> {
        let from = self.now_s();
        let t = Duration::from_secs(90);
        self.guests[0].start(&format!("{tool} --check -n 200"))?;
        let c = self.guests[1].run(&format!("retry -n 15 -i 1 {tool} --check -n 200 3"), t)?;
        // A server whose client gave up waits for nobody: Ctrl-C ends it.
        let s = self.guests[0].finish(if matches!(c, Outcome::Ok(_)) {
            t
        } else {
            Duration::from_secs(5)
        })?;
        let name: &'static str = if tool == "ib_write_bw" {
            "ib_write_bw --check"
        } else {
            "ib_read_bw --check"
        };
        // One iteration per pair: the client's outcome; a server that
        // failed after its client succeeded is an error of its own.
        self.record(name, from, &c, true);
        if matches!(c, Outcome::Ok(_)) && !matches!(s, Outcome::Ok(_)) {
            self.record("perftest server", from, &s, false);
        }
        Ok(())
    }

    /// rmem: node 0 serves, every other node writes and reads back checked.
    fn rmem(&mut self, round: u64) -> Result<(), String> {
        let from = self.now_s();
        let clients = self.guests.len() - 1;
        self.guests[0].start(&format!("rmem serve 4M 120 --clients {clients}"))?;
        for k in 1..self.guests.len() {
            let byte = (round * 7 + k as u64) % 251 + 1;
            let conn = self.guests[k].run(
                &format!("rmem connect {NODE0_GUID} -t 30"),
                Duration::from_secs(60),
            )?;
            if !self.record("rmem connect", from, &conn, false) {
                continue;
            }
            let steps: [(&'static str, String, bool); 5] = [
                ("rmem alloc", "rmem alloc 131072".into(), false),
                ("rmem write", "rmem write @ 65536".into(), false),
                (
                    "rmem read --check",
                    "rmem read @ 65536 --check".into(),
                    true,
                ),
                (
                    "rmem write",
                    format!("rmem write @+65536 65536 {byte}"),
                    false,
                ),
                (
                    "rmem read --check",
                    format!("rmem read @+65536 65536 --check {byte}"),
                    true,
                ),
            ];
            for (what, cmd, check) in steps {
                let o = self.guests[k].run(&cmd, Duration::from_secs(60))?;
                if !self.record(what, from, &o, check) {
                    break;
                }
            }
            let o = self.guests[k].run("rmem close", Duration::from_secs(30))?;
            self.record("rmem close", from, &o, false);
        }
        // The server ends once its clients have gone (or Ctrl-C after a
        // client that never came).
        let o = self.guests[0].finish(Duration::from_secs(10))?;
        if matches!(o, Outcome::Failed(_)) {
            self.record("rmem serve", from, &o, false);
        }
        Ok(())
    }

    /// Every node pings the next over IPoIB.
    fn ping(&mut self) -> Result<(), String> {
        let n = self.guests.len();
        for k in 0..n {
            let from = self.now_s();
            let peer = (k + 1) % n + 1;
            let o = self.guests[k].run(
                &format!("ping -c 3 -W 2 10.0.0.{peer}"),
                Duration::from_secs(60),
            )?;
            self.record("ping", from, &o, false);
        }
        Ok(())
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Resident set size of `pid` in kB (`VmRSS` of /proc/PID/status).
fn rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Everything started here, ended by pid whatever happens.
#[derive(Default)]
struct Procs {
    qemu: Vec<u32>,
    emu: Option<u32>,
    opensm: Option<Child>,
    files: Vec<PathBuf>,
}

fn kill(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(|x| x != "Z"))
        })
        .unwrap_or(false)
}

impl Procs {
    fn end(&mut self) {
        // OpenSM first: its exit waits for the emulator's DISCONNECT reply.
        if let Some(mut c) = self.opensm.take() {
            kill(c.id(), "-TERM");
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(3) && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        for p in self.qemu.drain(..) {
            kill(p, "-TERM");
        }
        if let Some(p) = self.emu.take() {
            kill(p, "-TERM");
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) && alive(p) {
                std::thread::sleep(Duration::from_millis(50));
            }
            if alive(p) {
                kill(p, "-KILL");
            }
        }
        for f in self.files.drain(..) {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.end();
    }
}

/// The OpenSM the emulator started, from its stderr line.
fn emu_opensm_pid(stderr: &str) -> Option<u32> {
    let i = stderr.find("OpenSM (pid ")?;
    stderr[i + 12..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Starts OpenSM on the fabric's SM host as the emulator does
/// (`sim::fabric::ibsim::opensm_command`), its log `opensm-N.log`.
fn start_opensm(sock: &str, dir: &Path, n: u32) -> std::io::Result<Child> {
    let prog = if Path::new("/usr/sbin/opensm").exists() {
        "/usr/sbin/opensm"
    } else {
        "opensm"
    };
    Command::new(prog)
        .env("LD_PRELOAD", sim::fabric::ibsim::UMAD2SIM)
        .env("IBSIM_SOCKNAME", sock)
        .env("SIM_HOST", "smhost")
        .env("OSM_TMP_DIR", dir)
        .env("OSM_CACHE_DIR", dir)
        .current_dir(dir)
        .args(["-d2", "-e", "-f"])
        .arg(dir.join(format!("opensm-{n}.log")))
        .arg("--dump_files_dir")
        .arg(dir)
        .args(["-s", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

#[test]
#[ignore = "minutes to an hour: scripts/soak.sh"]
fn soak() {
    let minutes = env_u64("SOAK_MINUTES", 60).max(1);
    let nodes = env_u64("SOAK_NODES", 2).clamp(2, 3) as usize;
    let seed = env_u64("SOAK_SEED", 0x5eed_0026);
    let root = root().canonicalize().expect("repository root");
    let out_dir = root.join(format!("target/soak/run-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).expect("target/soak");
    let emu = root.join("target/emu/release/cx3-emu");
    let kernel = root.join("target/kernel/x86_64-target/release/kernel");
    assert!(
        emu.exists() && kernel.exists(),
        "build first (scripts/soak.sh does: run-qemu.sh --build-only)"
    );
    // Guests boot within seconds of the emulator's start (BOOT_S is what
    // the plan assumes; they may take up to BOOT_DEADLINE_S); the
    // activities run until END_S, the faults fall between.
    const BOOT_S: u64 = 20;
    let end_s = BOOT_S + minutes * 60;
    let faults = plan(seed, BOOT_S + 10, end_s, nodes);
    println!(
        "soak: {minutes} min, {nodes} nodes, seed {seed:#x}; transcripts and logs in {}",
        out_dir.display()
    );
    for f in &faults {
        println!("soak: planned: {}", f.describe());
    }

    let mut procs = Procs::default();
    let shm = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        root.join("target/shm")
    };
    let mem = "256M";
    let pid = std::process::id();
    let mut emu_cmd = Command::new(&emu);
    let sm_dir = out_dir.join("fabric");
    let sockname = out_dir.join("ibsim-sockname");
    emu_cmd
        .args([
            "--exit-with-parent",
            "--stats",
            "--sm",
            "opensm",
            "--sm-dir",
        ])
        .arg(&sm_dir)
        .arg("--sockname-file")
        .arg(&sockname);
    let mut wins = Vec::new();
    for i in 0..nodes {
        let win = shm.join(format!("cx3-soak-{pid}-node{i}.win"));
        let ram = shm.join(format!("cx3-soak-{pid}-node{i}.ram"));
        for (f, len) in [(&win, 16u64 << 20), (&ram, 256 << 20)] {
            File::create(f)
                .and_then(|h| h.set_len(len))
                .expect("shared file");
            procs.files.push(f.clone());
        }
        emu_cmd
            .arg("--node")
            .arg(format!("{},{}", win.display(), ram.display()));
        wins.push((win, ram));
    }
    for f in &faults {
        match f.kind {
            FaultKind::CablePull => {
                emu_cmd
                    .arg("--pull")
                    .arg(format!("node{}/1@{}s+{}s", f.node, f.at_s, f.len_s));
            }
            FaultKind::DropBurst => {
                emu_cmd.arg("--drop").arg(format!(
                    "rate=0.5,from={}s,until={}s",
                    f.at_s,
                    f.at_s + f.len_s
                ));
            }
            FaultKind::SmRestart => {}
        }
    }
    emu_cmd.arg("--fault-seed").arg(seed.to_string());
    let mut emu_child = emu_cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cx3-emu starts");
    let started = Instant::now();
    procs.emu = Some(emu_child.id());
    let emu_pid = emu_child.id();
    let emu_err = Arc::new(Mutex::new(String::new()));
    {
        let mut e = emu_child.stderr.take().expect("piped stderr");
        let keep = emu_err.clone();
        let mut log = File::create(out_dir.join("cx3-emu.log")).expect("emulator log");
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = e.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let _ = log.write_all(&buf[..n]);
                keep.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
    }
    // The emulator publishes each window's magic last.
    let deadline = Instant::now() + Duration::from_secs(20);
    for (win, _) in &wins {
        loop {
            let magic = std::fs::read(win).ok().and_then(|b| {
                b.get(..4)
                    .map(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]))
            });
            if magic == Some(0x4533_5843) {
                break;
            }
            assert!(
                Instant::now() < deadline && alive(emu_pid),
                "cx3-emu did not serve {}: {}",
                win.display(),
                emu_err.lock().unwrap_or_else(|e| e.into_inner())
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let mut guests = Vec::new();
    for (i, (win, ram)) in wins.iter().enumerate() {
        let q: Vec<String> = [
            "qemu-system-x86_64",
            "-display",
            "none",
            "-no-reboot",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=4",
            "-accel",
            "tcg",
            "-cpu",
            "max",
            "-machine",
            "q35,memory-backend=ram0",
            "-m",
            mem,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            "-object".into(),
            format!(
                "memory-backend-file,id=ram0,size={mem},mem-path={},share=on",
                ram.display()
            ),
            "-object".into(),
            format!(
                "memory-backend-file,id=hca0,size=16M,mem-path={},share=on",
                win.display()
            ),
            "-device".into(),
            "ivshmem-plain,memdev=hca0".into(),
            "-kernel".into(),
            kernel.display().to_string(),
            "-append".into(),
            format!("ip=ib0:10.0.0.{}/24", i + 1),
            "-serial".into(),
            "stdio".into(),
        ])
        .collect();
        let g = Guest::spawn(i, q, &out_dir.join(format!("node{i}.log")));
        procs.qemu.push(g.child.id());
        guests.push(g);
    }
    let mut soak = Soak {
        guests,
        started,
        faults: faults.clone(),
        tally: Tally::default(),
    };
    let mut failures: Vec<String> = Vec::new();
    let result = run(
        &mut soak, &mut procs, &emu_err, emu_pid, &sm_dir, &sockname, end_s, BOOT_S,
    );
    if let Err(e) = &result {
        failures.push(e.clone());
    }
    // Every guest still answers on its console.
    let mut mem_end = Vec::new();
    for g in &mut soak.guests {
        match g.memory() {
            Ok(m) => mem_end.push(Some(m)),
            Err(e) => {
                failures.push(format!("node{} does not answer: {e}", g.id));
                mem_end.push(None);
            }
        }
    }
    let rss_end = rss_kb(emu_pid);
    let load = tests::load_average();
    procs.end();
    let _ = emu_child.wait();
    std::thread::sleep(Duration::from_millis(300));
    let emu_log = emu_err.lock().unwrap_or_else(|e| e.into_inner()).clone();

    // The report.
    let t = &soak.tally;
    println!("\n===== soak: {minutes} min, {nodes} nodes, seed {seed:#x} =====");
    println!(
        "activity window: {} s; load average at the end: {load}",
        soak.now_s()
    );
    println!("iterations (made / succeeded):");
    for (k, (n, ok)) in &t.iterations {
        println!("  {k:<22} {n:>6} / {ok}");
    }
    let mut by_kind: BTreeMap<FaultKind, u64> = BTreeMap::new();
    let ran: Vec<&Fault> = faults.iter().filter(|f| f.at_s < soak.now_s()).collect();
    for f in &ran {
        *by_kind.entry(f.kind).or_default() += 1;
    }
    println!("faults injected: {by_kind:?} ({} planned)", faults.len());
    for key in ["fabric:", "packet faults:"] {
        let line = emu_log
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or("(no stats line)");
        println!("  emulator's {line}");
    }
    // What the guests saw of it: their port going down and coming back.
    for i in 0..nodes {
        let t = std::fs::read(out_dir.join(format!("node{i}.log"))).unwrap_or_default();
        let t = String::from_utf8_lossy(&t);
        println!(
            "  node{i}'s port: DOWN {} times, ACTIVE {} times",
            t.matches("port 1 state: DOWN").count(),
            t.matches("port 1 state: ACTIVE").count()
        );
    }
    println!(
        "data checks: {} made, {} passed",
        t.data_checks, t.data_checks_passed
    );
    for f in &t.data_check_failures {
        println!("  FAILED: {f}");
        failures.push(format!("data check failed: {f}"));
    }
    let violations: u64 = emu_log
        .lines()
        .find(|l| l.starts_with("total:"))
        .and_then(|l| l.split("violations ").nth(1))
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            failures.push("the emulator printed no statistics (violations unknown)".into());
            u64::MAX
        });
    let violation_lines = emu_log
        .lines()
        .filter(|l| l.contains(": violation: "))
        .count();
    println!("model violations: {violations} (lines logged: {violation_lines})");
    if violations != 0 || violation_lines != 0 {
        failures.push(format!("the model recorded {violations} violation(s)"));
    }
    println!("errors (activity, how reported: count, of which in a fault's window):");
    for ((a, k), (n, near)) in &t.errors {
        println!("  {a}: {k}: {n} ({near} in a fault's window)");
    }
    for u in &t.unexplained {
        println!("  outside every fault's window: {u}");
        failures.push(format!("an error outside every fault's window: {u}"));
    }
    for (what, (n, ok)) in &t.iterations {
        if *n > 0 && *ok == 0 {
            failures.push(format!("{what} never succeeded"));
        }
    }
    for a in [
        "ib_write_bw --check",
        "ib_read_bw --check",
        "rmem read --check",
        "ping",
    ] {
        if !t.iterations.contains_key(a) && result.is_ok() {
            failures.push(format!("{a} never ran"));
        }
    }
    println!("memory (kB; heap used, DMA pool used; start after the first round -> end):");
    let start = MEM_START.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (i, end) in mem_end.iter().enumerate() {
        let s = start.get(i).copied().flatten();
        println!("  node{i}: {s:?} -> {end:?}");
        if let (Some((h0, d0)), Some((h1, d1))) = (s, *end)
            && (h1 > h0 + 1024 || d1 > d0 + 1024)
        {
            failures.push(format!(
                "node{i}: memory grew: heap {h0} -> {h1} kB, DMA {d0} -> {d1} kB"
            ));
        }
    }
    let rss_start = *RSS_START.lock().unwrap_or_else(|e| e.into_inner());
    println!("  cx3-emu RSS: {rss_start:?} -> {rss_end:?} kB");
    let restarts = ran
        .iter()
        .filter(|f| f.kind == FaultKind::SmRestart)
        .count();
    let exited = emu_log.matches("exited on its own").count();
    println!("OpenSM restarts: {restarts} (emulator saw its OpenSM exit: {exited})");
    if failures.is_empty() {
        println!("soak: PASS");
    } else {
        println!("soak: FAIL");
        for f in &failures {
            println!("  - {f}");
        }
        panic!("soak failed: {} check(s)", failures.len());
    }
}

static MEM_START: Mutex<Vec<Option<(u64, u64)>>> = Mutex::new(Vec::new());
static RSS_START: Mutex<Option<u64>> = Mutex::new(None);

#[allow(clippy::too_many_arguments)]
fn run(
    soak: &mut Soak,
    procs: &mut Procs,
    emu_err: &Arc<Mutex<String>>,
    emu_pid: u32,
    sm_dir: &Path,
    sockname: &Path,
    end_s: u64,
    boot_s: u64,
) -> Result<(), String> {
    // Boot: every shell up, every port Active with its IPoIB address.
    for g in &mut soak.guests {
        g.wait_for(PROMPT, Duration::from_secs(boot_s.max(120)))?;
    }
    for g in &mut soak.guests {
        let id = g.id;
        match g.run(
            "retry -n 60 -i 1 ping -c 1 -W 2 10.0.0.1",
            Duration::from_secs(120),
        )? {
            Outcome::Ok(_) => {}
            _ => return Err(format!("node{id}: IPoIB never answered after boot")),
        }
    }
    println!("soak: t={}s every guest is up", soak.now_s());
    let mut next_fault = 0;
    let mut opensm_n = 1;
    let mut round = 0u64;
    // Between any two activities: an SM restart if one is due.
    let mut sm_due = |soak: &mut Soak| {
        restart_sm_if_due(
            soak,
            procs,
            emu_err,
            &mut next_fault,
            sm_dir,
            sockname,
            &mut opensm_n,
        )
    };
    while soak.now_s() < end_s {
        round += 1;
        soak.perftest("ib_write_bw")?;
        sm_due(soak)?;
        soak.perftest("ib_read_bw")?;
        sm_due(soak)?;
        soak.rmem(round)?;
        sm_due(soak)?;
        soak.ping()?;
        sm_due(soak)?;
        if round == 1 {
            // The baseline: after one round of everything, idle.
            let mut m = Vec::new();
            for g in &mut soak.guests {
                m.push(Some(g.memory()?));
            }
            println!("soak: memory after the first round (heap, DMA kB): {m:?}");
            *MEM_START.lock().unwrap_or_else(|e| e.into_inner()) = m;
            *RSS_START.lock().unwrap_or_else(|e| e.into_inner()) = rss_kb(emu_pid);
        }
        if round.is_multiple_of(5) {
            println!(
                "soak: t={}s round {round}: {:?}",
                soak.now_s(),
                soak.tally.iterations
            );
        }
    }
    Ok(())
}

/// Restarts OpenSM (the emulator's child the first time, ours after) when
/// the next planned SM restart is due. Checked between activities, so a
/// restart lands while the guests are between commands or in one.
#[allow(clippy::too_many_arguments)]
fn restart_sm_if_due(
    soak: &mut Soak,
    procs: &mut Procs,
    emu_err: &Arc<Mutex<String>>,
    next: &mut usize,
    sm_dir: &Path,
    sockname: &Path,
    n: &mut u32,
) -> Result<(), String> {
    let now = soak.now_s();
    let restarts: Vec<usize> = soak
        .faults
        .iter()
        .enumerate()
        .filter(|(i, f)| *i >= *next && f.kind == FaultKind::SmRestart && f.at_s <= now)
        .map(|(i, _)| i)
        .collect();
    let Some(&last) = restarts.last() else {
        return Ok(());
    };
    *next = last + 1;
    // Stop the running OpenSM: ours, else the emulator's.
    if let Some(mut c) = procs.opensm.take() {
        kill(c.id(), "-TERM");
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) && matches!(c.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
    } else if let Some(pid) = emu_opensm_pid(&emu_err.lock().unwrap_or_else(|e| e.into_inner())) {
        kill(pid, "-TERM");
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) && alive(pid) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Moved to when it really happened, for the fault windows.
    if let Some(f) = soak.faults.get_mut(last) {
        f.at_s = soak.started.elapsed().as_secs();
    }
    std::thread::sleep(Duration::from_secs(3));
    let sock =
        std::fs::read_to_string(sockname).map_err(|e| format!("{}: {e}", sockname.display()))?;
    *n += 1;
    let c = start_opensm(sock.trim(), sm_dir, *n).map_err(|e| format!("starting OpenSM: {e}"))?;
    println!(
        "soak: t={}s OpenSM restarted (pid {}, log {}/opensm-{n}.log)",
        soak.now_s(),
        c.id(),
        sm_dir.display()
    );
    procs.opensm = Some(c);
    Ok(())
}
