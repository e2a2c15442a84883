//! The test rig for real peers on our fabric.
//!
//! The test rig: a fabric built from an ibsim net file, every CA a host
//! node, our ibsim server polled by a thread, and real OpenSM and
//! infiniband-diags run under umad2sim with a private socket name and a
//! scratch directory. Every process started is ended by pid; every wait
//! has a deadline.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sim::fabric::{Fabric, HostNode, IbsimServer, Topology};

pub use sim::fabric::ibsim::UMAD2SIM;

/// 1 switch and 3 CAs, as real-peers.md measured ibsim with (H1 is where
/// the SM and the diags attach).
pub const NET_SMALL: &str = r#"
vendid=0x02c9
devid=0xc738
switchguid=0x0002c90000000100
Switch	8 "Sw1"
[1]	"H1"[1]
[2]	"H2"[1]
[3]	"H3"[1]

vendid=0x02c9
devid=0x1003
caguid=0x0002c90300000010
Ca	1 "H1"
[1]	"Sw1"[1]

vendid=0x02c9
devid=0x1003
caguid=0x0002c90300000020
Ca	1 "H2"
[1]	"Sw1"[2]

vendid=0x02c9
devid=0x1003
caguid=0x0002c90300000030
Ca	1 "H3"
[1]	"Sw1"[3]
"#;

/// Whether OpenSM, the diags and the preload are installed; if not, says
/// so loudly (the test is then skipped).
pub fn tools_present(test: &str) -> bool {
    let need = [
        "/usr/sbin/opensm",
        "/usr/sbin/ibnetdiscover",
        "/usr/sbin/smpquery",
        "/usr/sbin/perfquery",
        "/usr/sbin/saquery",
        "/usr/sbin/sminfo",
        "/usr/sbin/ibroute",
        UMAD2SIM,
    ];
    let missing: Vec<&str> = need
        .iter()
        .copied()
        .filter(|p| !Path::new(p).exists())
        .collect();
    if missing.is_empty() {
        return true;
    }
    eprintln!(
        "\n!!!!! SKIPPED {test}: missing {missing:?}; install opensm infiniband-diags libumad2sim0 ibsim-utils (scripts/deps.sh ensure_ib_peers) !!!!!\n"
    );
    false
}

/// The fabric and the server, as the polling thread shares them.
pub struct World {
    /// The fabric.
    pub fabric: Fabric,
    /// The server.
    pub server: IbsimServer,
}

/// A running fabric with its server.
pub struct Rig {
    /// Socket base name.
    pub base: String,
    /// Scratch directory (umad2sim's fake sysfs, OpenSM's files).
    pub dir: PathBuf,
    world: Arc<Mutex<World>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    children: Vec<Child>,
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

impl Rig {
    /// Builds `net` (every CA a host node) and starts serving.
    pub fn start(test: &str, net: &str) -> Rig {
        let net = net.to_string();
        Rig::start_with(test, move |fabric| {
            let topo = Topology::from_netfile(&net).expect("net file");
            let built = topo.build(fabric).expect("build");
            built
                .hcas
                .iter()
                .map(|h| HostNode::new(fabric, &h.name, h.node_guid, h.ports[0]))
                .collect()
        })
    }

    /// Builds the fabric with `build` (which returns the host nodes) and
    /// starts serving.
    pub fn start_with(test: &str, build: impl FnOnce(&mut Fabric) -> Vec<HostNode>) -> Rig {
        let base = format!(
            "lego-{test}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("peers")
            .join(&base);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let mut fabric = Fabric::new();
        let nodes = build(&mut fabric);
        let server = IbsimServer::bind(&base, nodes).expect("bind the ibsim sockets");
        let world = Arc::new(Mutex::new(World { fabric, server }));
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let thread = {
            let world = world.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut last_work = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let work = {
                        let mut g = world.lock().unwrap_or_else(|e| e.into_inner());
                        let now = t0.elapsed().as_nanos() as u64;
                        let w = &mut *g;
                        w.fabric.advance(now);
                        w.server.poll(&mut w.fabric, now)
                    };
                    if work > 0 {
                        last_work = Instant::now();
                    } else if last_work.elapsed() < Duration::from_millis(2) {
                        // In a burst (a sweep): stay close.
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
            })
        };
        Rig {
            base,
            dir,
            world,
            stop,
            thread: Some(thread),
            children: Vec::new(),
        }
    }

    /// The fabric and server, locked.
    pub fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts OpenSM on `host` with `extra` arguments; its log is
    /// `opensm.log` in the scratch directory. Returns its pid.
    pub fn start_opensm(&mut self, host: &str, extra: &[&str]) -> u32 {
        let _ = std::fs::remove_file(self.dir.join("opensm.log"));
        let child = sim::fabric::ibsim::opensm_command(&self.base, host, &self.dir)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn opensm");
        let pid = child.id();
        self.children.push(child);
        pid
    }

    /// Spawns `c`; the rig ends it (by pid) when it is dropped.
    pub fn spawn(&mut self, mut c: Command) -> u32 {
        let child = c.spawn().expect("spawn");
        let pid = child.id();
        self.children.push(child);
        pid
    }

    /// The OpenSM log so far.
    pub fn opensm_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("opensm.log")).unwrap_or_default()
    }

    /// Waits (at most `limit`) until the OpenSM log has `n` lines with
    /// "SUBNET UP"; returns the time it took.
    pub fn wait_subnet_up(&self, n: usize, limit: Duration) -> Option<Duration> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if self.opensm_log().matches("SUBNET UP").count() >= n {
                return Some(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    /// Polls `cond` on the world until it holds or `limit` passes.
    pub fn wait_for(&self, limit: Duration, mut cond: impl FnMut(&World) -> bool) -> bool {
        let t = Instant::now();
        while t.elapsed() < limit {
            if cond(&self.world()) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// Ends the process `pid` (SIGTERM, then SIGKILL after 3 s) and reaps
    /// it.
    pub fn stop_pid(&mut self, pid: u32) {
        let Some(k) = self.children.iter().position(|c| c.id() == pid) else {
            return;
        };
        let mut c = self.children.swap_remove(k);
        end_child(&mut c);
    }

    /// Runs an infiniband-diags tool on `host` with a deadline; returns
    /// (exit success, stdout + stderr, how long it ran).
    pub fn diag(
        &self,
        host: &str,
        prog: &str,
        args: &[&str],
        limit: Duration,
    ) -> (bool, String, Duration) {
        run_diag(&self.base, &self.dir, host, prog, args, limit)
    }
}

fn command(base: &str, dir: &Path, prog: &str, host: &str) -> Command {
    let mut c = Command::new(prog);
    c.env("LD_PRELOAD", UMAD2SIM)
        .env("IBSIM_SOCKNAME", base)
        .env("SIM_HOST", host)
        .env("OSM_TMP_DIR", dir)
        .env("OSM_CACHE_DIR", dir)
        .current_dir(dir)
        .stdin(Stdio::null());
    c
}

/// Runs an infiniband-diags tool on `host` of the fabric served under
/// `base`, in `dir`, with a deadline: (exit success, stdout + stderr, how
/// long it ran).
pub fn run_diag(
    base: &str,
    dir: &Path,
    host: &str,
    prog: &str,
    args: &[&str],
    limit: Duration,
) -> (bool, String, Duration) {
    let t = Instant::now();
    let mut child = command(base, dir, prog, host)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
    let pid = child.id();
    let mut ok = None;
    while t.elapsed() < limit {
        match child.try_wait() {
            Ok(Some(st)) => {
                ok = Some(st.success());
                break;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => break,
        }
    }
    let timed_out = ok.is_none();
    if timed_out {
        end_child(&mut child);
    }
    let out = child.wait_with_output().ok();
    let mut text = String::new();
    if let Some(o) = out {
        text.push_str(&String::from_utf8_lossy(&o.stdout));
        text.push_str(&String::from_utf8_lossy(&o.stderr));
    }
    if timed_out {
        text.push_str(&format!("\n[{prog} killed after {limit:?}]"));
    }
    let _ = std::fs::remove_dir_all(dir.join(format!("sys-{pid}")));
    (ok.unwrap_or(false), text, t.elapsed())
}

fn end_child(c: &mut Child) {
    // A pid we spawned and have not reaped yet.
    signal(c.id(), "TERM");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// Sends a signal by name with kill(1) (no `unsafe` in tests).
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Drop for Rig {
    fn drop(&mut self) {
        // Clients first: their exit path waits for the server's reply to
        // DISCONNECT.
        while let Some(mut c) = self.children.pop() {
            end_child(&mut c);
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if std::env::var_os("KEEP_PEERS_SCRATCH").is_none() && !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whether Debian's ibsim is installed (the reference answers); if not,
/// says so loudly.
pub fn ibsim_present(test: &str) -> bool {
    let ok = Path::new("/usr/bin/ibsim").exists();
    if !ok {
        eprintln!("\n!!!!! SKIPPED {test}: needs ibsim-utils (the reference fabric) !!!!!\n");
    }
    ok
}

/// The reference: the real ibsim serving `net` under a private socket
/// name, with OpenSM on one of its nodes, for the same diag queries as
/// on our fabric. OpenSM and the diags are ended before ibsim (their exit
/// waits for ibsim's DISCONNECT reply).
pub struct IbsimRef {
    /// Socket base name.
    pub base: String,
    /// Scratch directory.
    pub dir: PathBuf,
    ibsim: Child,
    children: Vec<Child>,
}

impl IbsimRef {
    /// Starts ibsim on `net` (it takes a moment to bind its sockets).
    pub fn start(test: &str, net: &str) -> IbsimRef {
        let base = format!(
            "ibsimref-{test}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("peers")
            .join(&base);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        std::fs::write(dir.join("net"), net).expect("net file");
        let ibsim = Command::new("/usr/bin/ibsim")
            .args(["-s", "-n", "net"])
            .env("IBSIM_SOCKNAME", &base)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ibsim");
        // ibsim binds its control socket once it has read the net file.
        let name = format!("@{base}:ctl@");
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            let unix = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
            if unix.lines().any(|l| l.ends_with(&name)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        IbsimRef {
            base,
            dir,
            ibsim,
            children: Vec::new(),
        }
    }

    /// Starts OpenSM on `host` (its log is `opensm.log` in the scratch
    /// directory).
    pub fn start_opensm(&mut self, host: &str, extra: &[&str]) {
        let child = sim::fabric::ibsim::opensm_command(&self.base, host, &self.dir)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn opensm");
        self.children.push(child);
    }

    /// The OpenSM log so far.
    pub fn opensm_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("opensm.log")).unwrap_or_default()
    }

    /// Waits (at most `limit`) for OpenSM's first SUBNET UP.
    pub fn wait_subnet_up(&self, limit: Duration) -> bool {
        let t = Instant::now();
        while t.elapsed() < limit {
            if self.opensm_log().contains("SUBNET UP") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// [`run_diag`] on this fabric.
    pub fn diag(
        &self,
        host: &str,
        prog: &str,
        args: &[&str],
        limit: Duration,
    ) -> (bool, String, Duration) {
        run_diag(&self.base, &self.dir, host, prog, args, limit)
    }
}

impl Drop for IbsimRef {
    fn drop(&mut self) {
        while let Some(mut c) = self.children.pop() {
            end_child(&mut c);
        }
        end_child(&mut self.ibsim);
        if std::env::var_os("KEEP_PEERS_SCRATCH").is_none() && !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
