//! Boots the real image under QEMU and collects the serial transcript.
//!
//! Boots the real image under QEMU through `run-qemu.sh` and collects the
//! serial transcript, always against a deadline; every QEMU started here is
//! ended by its pid.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run_qemu_sh() -> PathBuf {
    root().join("run-qemu.sh")
}

/// Builds the image once per test process (and the ISO, if asked), so
/// parallel tests do not race on the build.
fn build(iso: bool) {
    static BUILT: OnceLock<()> = OnceLock::new();
    static ISO: OnceLock<()> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    BUILT.get_or_init(|| {
        let st = Command::new(run_qemu_sh())
            .arg("--build-only")
            .status()
            .expect("run-qemu.sh runs");
        assert!(st.success(), "building the kernel image failed");
    });
    if iso {
        ISO.get_or_init(|| {
            let st = Command::new(run_qemu_sh())
                .args(["--iso", "--build-only", "--no-build"])
                .status()
                .expect("run-qemu.sh runs");
            assert!(st.success(), "building the GRUB ISO failed");
        });
    }
}

/// What a scripted run produced.
#[derive(Debug)]
pub struct Run {
    /// `run-qemu.sh`'s exit status (0 all commands succeeded, 1 failure or
    /// crash, 124 deadline).
    pub status: i32,
    /// Everything the guest printed on the serial console.
    pub transcript: String,
    /// What `run-qemu.sh`, `cx3-emu` and QEMU printed on stderr.
    pub stderr: String,
}

impl Run {
    /// The transcript, then the stderr: what a failed assertion shows.
    pub fn all(&self) -> String {
        format!("{}\n--- stderr ---\n{}", self.transcript, self.stderr)
    }

    /// Panics with the transcript unless `needle` appears in it.
    pub fn expect(&self, needle: &str) -> &Self {
        assert!(
            self.transcript.contains(needle),
            "expected {needle:?} in the transcript:\n{}",
            self.transcript
        );
        self
    }
    /// Panics with the transcript if `needle` appears in it.
    pub fn reject(&self, needle: &str) -> &Self {
        assert!(
            !self.transcript.contains(needle),
            "did not expect {needle:?} in the transcript:\n{}",
            self.transcript
        );
        self
    }

    /// Panics with everything unless the two-node run succeeded and both
    /// nodes' models recorded no violation or DMA fault; returns node 0's
    /// and node 1's transcripts.
    pub fn two_clean_nodes(&self) -> (&str, &str) {
        let all = self.all();
        assert_eq!(self.status, 0, "{all}");
        for n in 0..2 {
            assert!(
                node_clean(&self.stderr, n),
                "node {n}: the model recorded a violation or a DMA fault:\n{all}"
            );
        }
        (
            node(&self.transcript, 0).unwrap_or(""),
            node(&self.transcript, 1).unwrap_or(""),
        )
    }
}

/// `run-qemu.sh --run CMDS` with extra options; the script's own deadline is
/// `deadline`. With `--nodes N` the transcript holds every node's console,
/// each after a `===== node I (exit S) =====` line.
pub fn run(cmds: &str, opts: &[&str], deadline: Duration) -> Run {
    let mut args = vec!["--run", cmds];
    args.extend_from_slice(opts);
    run_args(&args, deadline)
}

/// `run-qemu.sh ARGS` on the image built once, with `deadline` as the
/// script's own (`--timeout`); for runs whose scripts are all `--run-on`.
pub fn run_args(args: &[&str], deadline: Duration) -> Run {
    build(args.contains(&"--iso"));
    let secs = deadline.as_secs().to_string();
    let mut all = vec!["--no-build", "--timeout", &secs];
    all.extend_from_slice(args);
    script(&all)
}

/// `run-qemu.sh ARGS` as given (no build, no deadline of its own: for
/// `--dry-run` and refused command lines), stdin closed.
pub fn script(args: &[&str]) -> Run {
    let out = Command::new(run_qemu_sh())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run-qemu.sh runs");
    Run {
        status: out.status.code().unwrap_or(-1),
        transcript: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A vfio-user run (`--vfu`, `--linux`, `--guests`): [`run_args`] after
/// building cx3-vfu and fetching the QEMU with the vfio-user client (and,
/// with `linux_guest`, building the Linux guest) once per test process, so
/// that the first run's downloads do not eat into the deadline. The
/// transcript's lines end in LF (the serial console's CR LF turned).
pub fn run_vfu(args: &[&str], deadline: Duration, linux_guest: bool) -> Run {
    build(false);
    static VFU: OnceLock<()> = OnceLock::new();
    static LINUX: OnceLock<()> = OnceLock::new();
    VFU.get_or_init(|| {
        let root = root();
        let st = Command::new("cargo")
            .current_dir(&root)
            .env("CARGO_TARGET_DIR", root.join("target/emu"))
            .args([
                "build",
                "--release",
                "--quiet",
                "-p",
                "sim",
                "--bin",
                "cx3-vfu",
            ])
            .status()
            .expect("cargo runs");
        assert!(st.success(), "building cx3-vfu failed");
        fetch("scripts/qemu-vfu.sh");
    });
    if linux_guest {
        LINUX.get_or_init(|| fetch("scripts/linux-guest.sh"));
    }
    let r = run_args(args, deadline);
    Run {
        transcript: r.transcript.replace("\r\n", "\n"),
        ..r
    }
}

/// cx3-vfu's `--stats` line of node `n`'s accesses (`nodeN: accesses:
/// config C, BAR0 B, BAR2 M (mapped: P polls took doorbells), ...`), or "".
pub fn vfu_accesses(stderr: &str, n: usize) -> &str {
    let tag = format!("node{n}: accesses: ");
    stderr.lines().find(|l| l.starts_with(&tag)).unwrap_or("")
}

/// The number right after `key` in `line` (`count_after(a, "BAR2 ")`).
pub fn count_after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Runs one of the scripts that fetch and cache what the vfio-user runs
/// need.
fn fetch(s: &str) {
    let st = Command::new(root().join(s))
        .stdout(Stdio::null())
        .status()
        .expect("the script runs");
    assert!(st.success(), "{s} failed");
}

/// The output lines of the command `cmd` in a guest's transcript `t`, found
/// where it is echoed after `prompt` (`"# "` by the Linux guest's init,
/// `"lego> "` by ours), up to the next prompt or `run: ` line, with the
/// kernel's log lines (starting with `[`) left out. Empty if `cmd` never ran.
pub fn lines_after<'a>(t: &'a str, prompt: &str, cmd: &str) -> Vec<&'a str> {
    let Some(at) = t.find(&format!("{prompt}{cmd}")) else {
        return Vec::new();
    };
    t[at..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with(prompt) && !l.starts_with("run: "))
        .filter(|l| !l.starts_with('['))
        .collect()
}

/// Whether node `n`'s model (`--stats` on the stderr of a multi-node run)
/// recorded no command violation and no DMA fault.
pub fn node_clean(stderr: &str, n: usize) -> bool {
    stderr.lines().any(|l| {
        l.starts_with(&format!("node{n}: commands ")) && l.ends_with("violations 0, DMA faults 0")
    })
}

/// Whether one of `lines` has the words of `want` (spacing aside), as
/// `ibv_devinfo` prints `state:\t\t\tPORT_ACTIVE (4)`.
pub fn has_words(lines: &[&str], want: &str) -> bool {
    lines
        .iter()
        .any(|l| l.split_whitespace().eq(want.split_whitespace()))
}

/// How many result lines (perftest's, ours) `text` has: first two fields
/// `size` and `iters`, the third a number.
pub fn perftest_results(text: &str, size: u64, iters: u64) -> usize {
    text.lines()
        .filter(|l| {
            let mut w = l.split_whitespace();
            w.next().and_then(|x| x.parse::<u64>().ok()) == Some(size)
                && w.next().and_then(|x| x.parse::<u64>().ok()) == Some(iters)
                && w.next().is_some_and(|x| x.parse::<f64>().is_ok())
        })
        .count()
}

/// Node `n`'s transcript in a multi-node run's output: from its
/// `===== node N ` line up to the next node's.
pub fn node(out: &str, n: usize) -> Option<&str> {
    let start = out.find(&format!("===== node {n} "))?;
    let rest = &out[start..];
    let end = rest[1..].find("===== node ").map_or(rest.len(), |e| e + 1);
    Some(&rest[..end])
}

/// Console lines after which no awaited output can come: a wait stops at
/// the first of them instead of running into its deadline.
pub const FATAL: [&str; 5] = [
    "bring-up failed",
    "Kernel panic",
    "CPU exception",
    "System halted",
    "no emulator answers in the ivshmem window",
];

/// An interactive console session: QEMU with the serial port on pipes.
pub struct Console {
    child: Child,
    rx: Receiver<Vec<u8>>,
    seen: String,
    /// What `run-qemu.sh` and the emulator wrote to stderr (their own
    /// messages, never the guest's): shown when the output ends early.
    stderr: std::sync::Arc<Mutex<String>>,
    deadline: Instant,
}

impl Console {
    /// Boots the image interactively; the whole session must end within
    /// `deadline`.
    pub fn boot(opts: &[&str], deadline: Duration) -> Console {
        build(false);
        let mut child = Command::new(run_qemu_sh())
            .arg("--no-build")
            .args(opts)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run-qemu.sh runs");
        let mut out = child.stdout.take().expect("piped stdout");
        let mut err = child.stderr.take().expect("piped stderr");
        let stderr = std::sync::Arc::new(Mutex::new(String::new()));
        let keep = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut s = keep.lock().unwrap_or_else(|e| e.into_inner());
                s.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Console {
            child,
            rx,
            seen: String::new(),
            stderr,
            deadline: Instant::now() + deadline,
        }
    }

    /// Waits until `needle` has been printed (after everything consumed so
    /// far); returns what was printed up to and including it. Panics at
    /// once on a [`FATAL`] line, when QEMU ends, or at the session deadline.
    pub fn wait_for(&mut self, needle: &str) -> String {
        self.try_wait_for(needle).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`Console::wait_for`], but returns why the wait ended without
    /// `needle`: a [`FATAL`] line (found as soon as it is printed, complete
    /// with its line), the end of QEMU's output, or the deadline.
    pub fn try_wait_for(&mut self, needle: &str) -> Result<String, String> {
        loop {
            if let Some(i) = self.seen.find(needle) {
                let upto: String = self.seen.drain(..i + needle.len()).collect();
                return Ok(upto);
            }
            if let Some(end) = self.fatal_line_end(needle) {
                // Consumed with the line, so that a later wait goes on after it.
                let upto: String = self.seen.drain(..end).collect();
                let line = upto.lines().last().unwrap_or_default().trim_end();
                return Err(format!(
                    "stopped waiting for {needle:?}: the guest printed {line:?}; console so far:\n{upto}"
                ));
            }
            let left = self.deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(bytes) => self.seen.push_str(&String::from_utf8_lossy(&bytes)),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // The stderr reader may still be draining the last lines.
                    std::thread::sleep(Duration::from_millis(200));
                    let status = self.child.try_wait().ok().flatten();
                    let stderr = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
                    return Err(format!(
                        "QEMU's output ended while waiting for {needle:?} (run-qemu.sh: {status:?}); \
                         its stderr:\n{stderr}\nconsole so far:\n{}",
                        self.seen
                    ));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let stderr = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
                    return Err(format!(
                        "timed out waiting for {needle:?}; run-qemu.sh's stderr:\n{stderr}\n\
                         console so far:\n{}",
                        self.seen
                    ));
                }
            }
        }
    }

    /// Where the first complete line of unconsumed output holding a
    /// [`FATAL`] marker that `needle` itself does not mention ends.
    fn fatal_line_end(&self, needle: &str) -> Option<usize> {
        let mut start = 0;
        while let Some(n) = self.seen[start..].find('\n') {
            let end = start + n + 1;
            let line = &self.seen[start..end];
            if FATAL
                .iter()
                .any(|f| line.contains(f) && !needle.contains(f))
            {
                return Some(end);
            }
            start = end;
        }
        None
    }

    /// The pid of `run-qemu.sh` (its shared files are named after it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Types `keys` on the console.
    pub fn send(&mut self, keys: &str) {
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        stdin.write_all(keys.as_bytes()).expect("console input");
        stdin.flush().expect("console input");
    }

    /// Waits for QEMU to exit (within the session deadline) and returns the
    /// script's status.
    pub fn wait_exit(mut self) -> i32 {
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < self.deadline,
                "QEMU did not exit before the deadline"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        // run-qemu.sh execs nothing in interactive mode, so end QEMU too:
        // closing stdin is not enough for a guest that polls the UART.
        if let Ok(None) = self.child.try_wait() {
            kill_tree(self.child.id());
            let _ = self.child.wait();
        }
    }
}

/// The pids of `pid`'s children (Linux `/proc`), with their command names.
pub fn children(pid: u32) -> Vec<(u32, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
        .map(|c| {
            let comm = std::fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
            (c, comm.trim().to_string())
        })
        .collect()
}

/// Ends `pid` and its descendants (by pid, never by name).
fn kill_tree(pid: u32) {
    for (c, _) in children(pid) {
        kill_tree(c);
    }
    let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
}
