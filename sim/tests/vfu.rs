//! cx3-vfu without QEMU, driven by the `vfio_user` crate's own client.
//!
//! cx3-vfu without QEMU: the `vfio_user` crate's own client drives the
//! function over a real socket the way QEMU's does (config space, trapped
//! BAR0, DMA into a shared memfd, MSI-X eventfds), and the binary's command
//! line, signal and error behaviour.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use sim::front::host::Log;
use sim::front::vfu::{Function, Options, irqs, regions, serve};
use vfio_user::Client;

const HCR: u64 = 0x8_0680;
const GO: u32 = 1 << 23;
const T: u32 = 1 << 21;
const E: u32 = 1 << 22;
/// Where the test maps its guest RAM.
const RAM_IOVA: u64 = 0x10_0000;
const RAM_LEN: u64 = 4 << 20;

fn sock_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("cx3-vfu-test-{}-{tag}.sock", std::process::id()))
}

fn memfd(len: u64) -> File {
    // SAFETY: a fresh anonymous file; the name is a valid C string.
    let fd = unsafe { libc::memfd_create(c"vfu-ram".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: `fd` is ours and open.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

fn eventfd() -> File {
    // SAFETY: creates a new eventfd.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK) };
    assert!(fd >= 0);
    // SAFETY: ours.
    unsafe { File::from_raw_fd(fd) }
}

fn events(f: &File) -> u64 {
    let mut b = [0u8; 8];
    let mut f = f;
    f.read(&mut b).map(|_| u64::from_ne_bytes(b)).unwrap_or(0)
}

/// A function served on its own thread, and a connected client.
struct Rig {
    f: Arc<Function>,
    c: Client,
    ram: File,
    path: PathBuf,
}

impl Rig {
    fn new(tag: &str, opts: Options) -> Rig {
        let path = sock_path(tag);
        let _ = std::fs::remove_file(&path);
        let server = vfio_user::Server::new(&path, true, irqs(), regions()).unwrap();
        let f = Function::new(0, opts, Log::capture());
        let f2 = f.clone();
        std::thread::spawn(move || {
            static NEVER: AtomicBool = AtomicBool::new(false);
            serve(&f2, server, &NEVER);
        });
        let c = Client::new(&path).unwrap();
        let ram = memfd(RAM_LEN);
        let mut r = Rig { f, c, ram, path };
        r.c.dma_map(0, RAM_IOVA, RAM_LEN, r.ram.as_raw_fd())
            .unwrap();
        r
    }

    fn cfg_read32(&mut self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.c.region_read(7, off, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    fn bar0_read(&mut self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.c.region_read(0, off, &mut b).unwrap();
        u32::from_be_bytes(b)
    }

    fn bar0_write(&mut self, off: u64, v: u32) {
        self.c.region_write(0, off, &v.to_be_bytes()).unwrap();
    }

    fn ram_read(&self, iova: u64, buf: &mut [u8]) {
        use std::os::unix::fs::FileExt;
        self.ram.read_exact_at(buf, iova - RAM_IOVA).unwrap();
    }

    /// Posts a command as Linux's `mlx4_cmd_post` does (dwords 0..5, then
    /// GO with the toggle) and returns dword 6 once GO has cleared.
    fn cmd(&mut self, t: bool, ev: bool, op: u32, in_mod: u32, out: u64) -> u32 {
        let dws = [0, 0, in_mod, (out >> 32) as u32, out as u32, 0x1234 << 16];
        for (i, v) in dws.into_iter().enumerate() {
            self.bar0_write(HCR + 4 * i as u64, v);
        }
        let dw6 = GO | if t { T } else { 0 } | if ev { E } else { 0 } | op;
        self.bar0_write(HCR + 0x18, dw6);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = self.bar0_read(HCR + 0x18);
            if s & GO == 0 {
                return s;
            }
            assert!(Instant::now() < deadline, "GO never cleared");
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.c.shutdown();
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
fn a_client_finds_the_card_and_runs_query_fw_into_shared_ram() {
    let mut r = Rig::new("qfw", Options::default());
    assert_eq!(r.cfg_read32(0), 0x1003_15b3);
    assert_eq!(r.cfg_read32(8) >> 8, 0x02_8000);
    // Registers are dropped until memory decoding is on.
    r.c.region_write(7, 4, &6u32.to_le_bytes()).unwrap();
    // Ownership: the first read claims the HCA, the second sees it taken.
    assert_eq!(r.bar0_read(0x8_069c), 0);
    assert_eq!(r.bar0_read(0x8_069c), 1);
    let st = r.cmd(true, false, 0x004, 0, RAM_IOVA + 0x1000);
    assert_eq!(st >> 24, 0, "QUERY_FW status");
    let mut b = [0u8; 8];
    r.ram_read(RAM_IOVA + 0x1000, &mut b);
    assert_eq!(
        u16::from_be_bytes([b[2], b[3]]),
        2,
        "FW major in the outbox"
    );
    // An outbox outside every DMA mapping: the command fails, the model
    // records a DMA fault, nothing crashes.
    let st = r.cmd(false, false, 0x004, 0, 0x8000_0000);
    assert_eq!(st >> 24, 0x01, "INTERNAL_ERR");
    r.f.service();
    let (cmds, violations, faults) = r.f.counts();
    assert_eq!((cmds, violations, faults), (2, 0, 1));
    assert!(
        r.f.log_lines()
            .iter()
            .any(|l| l.contains("DMA fault: DMA write of") && l.contains("0x80000000")),
        "{:?}",
        r.f.log_lines()
    );
}

#[test]
fn hcr_protocol_violations_are_seen_access_by_access() {
    let opts = Options {
        hcr_delay: Duration::from_millis(300),
        ..Options::default()
    };
    let mut r = Rig::new("viol", opts);
    r.c.region_write(7, 4, &6u32.to_le_bytes()).unwrap();
    // GO while the first command is still in flight.
    for (i, v) in [0u32, 0, 0, 0, (RAM_IOVA + 0x2000) as u32, 0]
        .into_iter()
        .enumerate()
    {
        r.bar0_write(HCR + 4 * i as u64, v);
    }
    r.bar0_write(HCR + 0x18, GO | T | 0x004);
    assert_ne!(r.bar0_read(HCR + 0x18) & GO, 0, "busy for 300 ms");
    r.bar0_write(HCR + 0x18, GO | 0x004);
    // A 2-byte register access is not something the card takes.
    let mut two = [0u8; 2];
    r.c.region_read(0, 0x8_069c, &mut two).unwrap();
    assert_eq!(two, [0xff, 0xff]);
    r.f.service();
    let log = r.f.log_lines().join("\n");
    assert!(log.contains("GO written while the HCR is busy"), "{log}");
    assert!(log.contains("dropped"), "{log}");
}

#[test]
fn msix_vectors_are_taken_and_an_event_mode_command_without_an_eq_raises_nothing() {
    let mut r = Rig::new("irq", Options::default());
    r.c.region_write(7, 4, &6u32.to_le_bytes()).unwrap();
    // Interrupt delivery without an EQ is nothing; with MSI-X vectors set up
    // the front end raises the vector of an EQ whose interrupt count moves.
    let v0 = eventfd();
    let v1 = eventfd();
    let flags = (1 << 5) | (1 << 2); // ACTION_TRIGGER | DATA_EVENTFD
    r.c.set_irqs(2, flags, 0, 2, &[v0.as_raw_fd(), v1.as_raw_fd()])
        .unwrap();
    // Firmware bring-up up to a running EQ is the model tests' job; here
    // the point is the plumbing: a command in event mode with no EQ mapped
    // completes in the HCR and raises nothing.
    let st = r.cmd(true, true, 0x004, 0, RAM_IOVA + 0x1000);
    assert_eq!(st >> 24, 0);
    r.f.service();
    assert_eq!((events(&v0), events(&v1)), (0, 0));
    let irqs = r.f.irqs.lock().unwrap();
    assert_eq!(irqs.lost, 0);
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cx3-vfu")
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_binary_refuses_bad_arguments_with_status_2() {
    for args in [
        &[][..],
        &["--socket"][..],
        &["--socket", "/tmp/x", "--fail", "NOPE"][..],
        &["--bogus"][..],
    ] {
        let out = Command::new(bin()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("cx3-vfu: "));
    }
    // A socket path that exists is an error too (another server's).
    let p = sock_path("exists");
    std::fs::write(&p, b"").unwrap();
    let out = Command::new(bin())
        .args(["--socket", p.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_file(&p);
    let out = Command::new(bin()).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("vfio-user-pci"));
}

#[test]
fn the_binary_exits_cleanly_on_sigterm_and_when_the_client_goes() {
    // SIGTERM while waiting for a client.
    let p = sock_path("term");
    let _ = std::fs::remove_file(&p);
    let mut child = Command::new(bin())
        .args(["--socket", p.to_str().unwrap(), "--stats"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&p);
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = wait_deadline(&mut child);
    assert_eq!(st, Some(0));
    assert!(!p.exists(), "socket removed at exit");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("exiting: signal"), "{err}");
    assert!(err.contains("violations 0, DMA faults 0"), "{err}");

    // A client that connects and goes away ends the server.
    let p = sock_path("gone");
    let _ = std::fs::remove_file(&p);
    let mut child = Command::new(bin())
        .args(["--socket", p.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&p);
    let c = Client::new(&p).unwrap();
    drop(c);
    assert_eq!(wait_deadline(&mut child), Some(0));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("exiting: client disconnected"), "{err}");
    assert!(!p.exists());
}

fn wait_deadline(child: &mut std::process::Child) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cx3-vfu did not exit within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
