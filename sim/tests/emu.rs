//! `cx3-emu` over temp files, the guest side played with raw accesses per
//! `docs/ivshmem.md`: in process (stepping poll rounds by hand) and as the
//! binary.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use sim::front::host::{HostOptions, Log};
use sim::front::ivshmem::{
    BAR0_OFF, CONFIG_OFF, Emulator, Exit, GUEST_SHUT_DOWN, MAGIC, Options, SharedFile, hdr,
};
use sim::{Opcode, Status};

const RAM: u64 = 64 << 20;
const HCR: usize = BAR0_OFF + 0x8_0680;
const GO: u32 = 1 << 23;
const T: u32 = 1 << 21;
const OUTBOX: u64 = 0x20_0000;

/// A temp directory with window and RAM files, removed on drop.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn new(tag: &str) -> Files {
        let dir = std::env::temp_dir().join(format!("cx3-emu-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Files { dir }
    }
    fn node(&self, n: u32) -> (PathBuf, PathBuf) {
        let w = self.dir.join(format!("node{n}.win"));
        let r = self.dir.join(format!("node{n}.ram"));
        File::create(&w).unwrap().set_len(16 << 20).unwrap();
        File::create(&r).unwrap().set_len(RAM).unwrap();
        (w, r)
    }
    fn arg(w: &Path, r: &Path) -> String {
        format!("{},{}", w.display(), r.display())
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The guest's view: the window and RAM mapped by "another process".
struct Guest {
    win: SharedFile,
    ram: SharedFile,
    toggle: bool,
}

impl Guest {
    fn open(w: &Path, r: &Path) -> Guest {
        Guest {
            win: SharedFile::open(w).unwrap(),
            ram: SharedFile::open(r).unwrap(),
            toggle: false,
        }
    }
    fn wait_magic(&self, deadline: Duration) -> bool {
        let t = Instant::now();
        while self.win.load32(hdr::MAGIC) != MAGIC {
            if t.elapsed() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
    fn cfg(&self, off: usize) -> u32 {
        self.win.load32(CONFIG_OFF + off)
    }
    fn set_cfg(&self, off: usize, v: u32) {
        self.win.store32(CONFIG_OFF + off, v)
    }
    fn hcr(&self, i: usize) -> u32 {
        u32::from_be(self.win.load32(HCR + 4 * i))
    }
    /// Posts a command (dwords 0..5, then GO | T | opcode); returns at once.
    fn post(&mut self, op: Opcode, in_param: u64, in_mod: u32, out_param: u64) {
        self.toggle = !self.toggle;
        let dw = [
            (in_param >> 32) as u32,
            in_param as u32,
            in_mod,
            (out_param >> 32) as u32,
            out_param as u32,
            0x1234 << 16,
        ];
        for (i, v) in dw.into_iter().enumerate() {
            self.win.store32(HCR + 4 * i, v.to_be());
        }
        let go = GO | if self.toggle { T } else { 0 } | u32::from(op.0);
        self.win.store32(HCR + 0x18, go.to_be());
    }
    /// Waits for GO to clear, calling `step` between looks; the status.
    fn wait(&self, mut step: impl FnMut()) -> Option<u8> {
        let t = Instant::now();
        while self.hcr(6) & GO != 0 {
            if t.elapsed() > Duration::from_secs(3) {
                return None;
            }
            step();
        }
        Some((self.hcr(6) >> 24) as u8)
    }
    fn ram_be16(&self, gpa: u64) -> u16 {
        let mut b = [0u8; 2];
        assert!(self.ram.read_bytes(gpa as usize, &mut b));
        u16::from_be_bytes(b)
    }
}

#[test]
fn in_process_guest_session() {
    let f = Files::new("inproc");
    let (w, r) = f.node(0);
    let opts = Options {
        host: HostOptions {
            trace: true,
            ..HostOptions::default()
        },
        ..Options::default()
    };
    let mut emu = Emulator::open(&[(w.clone(), r.clone())], opts, Log::capture()).unwrap();
    let mut g = Guest::open(&w, &r);
    let step = |e: &mut Emulator| {
        e.poll_round();
    };

    // Header and config image.
    assert!(g.wait_magic(Duration::ZERO));
    let h = |o| g.win.load32(o);
    assert_eq!(
        [
            h(hdr::VERSION),
            h(hdr::NODE),
            h(hdr::NODES),
            h(hdr::CONFIG_OFF),
            h(hdr::BAR0_OFF),
            h(hdr::BAR0_LEN),
            h(hdr::BAR2_OFF),
            h(hdr::BAR2_LEN)
        ],
        [1, 0, 1, 0x1000, 0x10_0000, 0x10_0000, 0x80_0000, 0x80_0000]
    );
    assert_eq!(g.win.load64(hdr::RAM_SIZE), RAM);
    assert_eq!(g.win.load64(hdr::LOWMEM), RAM);
    assert_eq!(g.cfg(0), 0x1003_15b3);
    assert_eq!(g.cfg(8) >> 8, 0x02_8000, "class");
    assert_eq!(g.cfg(0x34) & 0xff, 0x40, "capability list");
    let hb = g.win.load64(hdr::HEARTBEAT);

    // A config write reaches the model; read-only fields stay read-only.
    let pci = emu.nodes()[0].hca().config_space();
    assert!(!pci.bus_master());
    g.set_cfg(4, 0x0000_0006);
    g.set_cfg(0, 0);
    step(&mut emu);
    assert!(pci.bus_master() && pci.memory_enabled());
    assert_eq!(g.cfg(4), 0x0010_0006, "status keeps the capability bit");
    assert_eq!(g.cfg(0), 0x1003_15b3, "ids restored");
    assert!(g.win.load64(hdr::HEARTBEAT) > hb, "heartbeat moves");

    // QUERY_FW through the window's HCR, output mailbox in guest RAM.
    g.post(Opcode::QUERY_FW, 0, 0, OUTBOX);
    assert_eq!(g.wait(|| step(&mut emu)), Some(0));
    assert_eq!(g.ram_be16(OUTBOX + 2), 2, "FW major");
    assert_eq!(g.hcr(6) & T, T, "T as posted");

    // A mailbox in the PCI hole is a DMA fault, not a crash.
    g.post(Opcode::QUERY_FW, 0, 0, 0xc000_0000);
    assert_eq!(
        g.wait(|| step(&mut emu)),
        Some(Status::INTERNAL_ERR.0),
        "DMA fault fails the command"
    );
    step(&mut emu);
    assert_eq!(emu.nodes()[0].counts(), (2, 0, 1));
    let log = emu.log().lines().join("\n");
    assert!(log.contains("node0: QUERY_FW(0x004)"), "{log}");
    assert!(
        log.contains("node0: DMA fault: DMA write of") && log.contains("0xc0000000"),
        "{log}"
    );

    // Software reset: config reads all ones until the model is back.
    g.win.store32(BAR0_OFF + 0xf_0010, 1u32.to_be());
    step(&mut emu);
    assert_eq!(g.cfg(0), u32::MAX, "function off the bus");
    let t = Instant::now();
    while g.cfg(0) == u32::MAX && t.elapsed() < Duration::from_secs(2) {
        step(&mut emu);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(g.cfg(0), 0x1003_15b3);
    assert_eq!(g.cfg(4) & 0xffff, 0, "command register cleared by reset");

    // Guest state 3 ends the run.
    assert!(!emu.all_shut_down());
    g.win.store32(hdr::GUEST_STATE, GUEST_SHUT_DOWN);
    assert_eq!(emu.run(&AtomicBool::new(false)), Exit::GuestsDone);
    let stats = emu.stats();
    assert!(
        stats.contains("node0: commands 2, violations 0, DMA faults 1"),
        "{stats}"
    );
    drop(emu);
    assert_eq!(g.win.load32(hdr::MAGIC), 0, "no stale magic after exit");
}

#[test]
fn the_window_records_what_memory_shows_of_the_hcr_protocol() {
    let f = Files::new("order");
    let (w, r) = f.node(0);
    let mut emu = Emulator::open(
        &[(w.clone(), r.clone())],
        Options::default(),
        Log::capture(),
    )
    .unwrap();
    let mut g = Guest::open(&w, &r);
    g.set_cfg(4, 6);
    emu.poll_round();
    let log = |e: &Emulator| e.log().lines().join("\n");
    // A parameter written after GO, while the command is in flight: the
    // model took GO on one pass and compares dwords 0..5 on the next.
    g.post(Opcode::QUERY_FW, 0, 0, OUTBOX);
    emu.poll_round();
    assert_ne!(g.hcr(6) & GO, 0, "GO stays up for one more pass");
    g.win.store32(HCR + 8, 0x55u32.to_be());
    assert_eq!(
        g.wait(|| {
            emu.poll_round();
        }),
        Some(0)
    );
    assert!(
        log(&emu).contains(
            "HCR parameters changed while QUERY_FW(0x004) was in flight (written after GO?): dword 2 0x00000000 -> 0x00000055"
        ),
        "{}",
        log(&emu)
    );
    // GO with T not flipped.
    g.toggle = !g.toggle;
    g.post(Opcode::QUERY_FW, 0, 0, OUTBOX);
    assert_eq!(
        g.wait(|| {
            emu.poll_round();
        }),
        Some(0)
    );
    emu.poll_round();
    assert!(
        log(&emu).contains("HCR toggle not flipped"),
        "{}",
        log(&emu)
    );
    // Dword 6 rewritten while busy.
    g.post(Opcode::QUERY_FW, 0, 0, OUTBOX);
    emu.poll_round();
    g.win
        .store32(HCR + 0x18, (GO | u32::from(Opcode::NOP.0)).to_be());
    assert_eq!(
        g.wait(|| {
            emu.poll_round();
        }),
        Some(0)
    );
    emu.poll_round();
    assert!(
        log(&emu).contains("HCR dword 6 rewritten while busy"),
        "{}",
        log(&emu)
    );
    // GO with memory decoding off: undone once the config sync confirms
    // decoding is still off (one pass of grace for a racing enable).
    g.set_cfg(4, 4); // bus master only
    emu.poll_round();
    let before = g.hcr(6);
    g.post(Opcode::QUERY_FW, 0, 0, OUTBOX);
    emu.poll_round();
    emu.poll_round();
    assert_eq!(
        g.hcr(6),
        before,
        "GO undone, the last completion shows again"
    );
    assert!(
        log(&emu).contains("written with memory decoding disabled"),
        "{}",
        log(&emu)
    );
    let (commands, violations, _) = emu.nodes()[0].counts();
    assert_eq!((commands, violations), (3, 4), "{}", log(&emu));
}

#[test]
fn injected_status() {
    let f = Files::new("fail");
    let (w, r) = f.node(0);
    let opts = Options {
        host: HostOptions {
            fail: vec![(Opcode::QUERY_FW, Status::BAD_PARAM)],
            ..HostOptions::default()
        },
        ..Options::default()
    };
    let mut emu = Emulator::open(&[(w.clone(), r.clone())], opts, Log::capture()).unwrap();
    let mut g = Guest::open(&w, &r);
    g.set_cfg(4, 6);
    emu.poll_round();
    for _ in 0..2 {
        g.post(Opcode::QUERY_FW, 0, 0, OUTBOX);
        assert_eq!(
            g.wait(|| {
                emu.poll_round();
            }),
            Some(Status::BAD_PARAM.0)
        );
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if t.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills and reaps a spawned emulator if the test fails before it exits.
struct Reaper(Child);

impl std::ops::Deref for Reaper {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaper {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn emu_bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cx3-emu"))
}

#[test]
fn binary_serves_two_nodes_until_both_guests_shut_down() {
    let f = Files::new("bin2");
    let (w0, r0) = f.node(0);
    let (w1, r1) = f.node(1);
    let mut child = emu_bin()
        .args([
            "--trace",
            "--stats",
            "--node",
            &Files::arg(&w0, &r0),
            "--node",
        ])
        .arg(Files::arg(&w1, &r1))
        .stderr(Stdio::piped())
        .spawn()
        .map(Reaper)
        .unwrap();
    let g0 = Guest::open(&w0, &r0);
    let mut g1 = Guest::open(&w1, &r1);
    assert!(g0.wait_magic(Duration::from_secs(5)) && g1.wait_magic(Duration::from_secs(5)));
    assert_eq!((g0.win.load32(hdr::NODE), g1.win.load32(hdr::NODE)), (0, 1));
    assert_eq!(g1.win.load32(hdr::NODES), 2);
    g1.set_cfg(4, 6);
    let t = Instant::now();
    while g1.cfg(4) & 0xffff != 6 && t.elapsed() < Duration::from_secs(3) {
        std::thread::yield_now();
    }
    g1.post(Opcode::QUERY_FW, 0, 0, OUTBOX);
    assert_eq!(g1.wait(std::thread::yield_now), Some(0));
    assert_eq!(g1.ram_be16(OUTBOX + 2), 2);
    g0.win.store32(hdr::GUEST_STATE, GUEST_SHUT_DOWN);
    std::thread::sleep(Duration::from_millis(20));
    assert!(child.try_wait().unwrap().is_none(), "node 1 still up");
    g1.win.store32(hdr::GUEST_STATE, GUEST_SHUT_DOWN);
    let status = wait_exit(&mut child, Duration::from_secs(3)).expect("exits");
    assert!(status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("node1: QUERY_FW(0x004)"), "{err}");
    assert!(
        err.contains("node0: commands 0, violations 0, DMA faults 0"),
        "{err}"
    );
    assert!(
        err.contains("total: commands 1, violations 0, DMA faults 0; CPU"),
        "{err}"
    );
    assert_eq!(g0.win.load32(hdr::MAGIC), 0);
}

#[test]
fn binary_exits_on_sigterm_and_when_a_watched_pid_is_gone() {
    let f = Files::new("sig");
    let (w, r) = f.node(0);
    let mut child = emu_bin()
        .args(["--node", &Files::arg(&w, &r)])
        .stderr(Stdio::null())
        .spawn()
        .map(Reaper)
        .unwrap();
    assert!(Guest::open(&w, &r).wait_magic(Duration::from_secs(5)));
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = wait_exit(&mut child, Duration::from_secs(3)).expect("exits on SIGTERM");
    assert!(status.success());

    let mut short = Command::new("sleep").arg("0.05").spawn().unwrap();
    let mut long = Command::new("sleep").arg("0.4").spawn().unwrap();
    let mut child = emu_bin()
        .args(["--node", &Files::arg(&w, &r)])
        .args(["--watch-pid", &short.id().to_string()])
        .args(["--watch-pid", &long.id().to_string()])
        .stderr(Stdio::null())
        .spawn()
        .map(Reaper)
        .unwrap();
    // The sleepers turn into unreaped zombies: that counts as gone.
    std::thread::sleep(Duration::from_millis(250));
    assert!(
        child.try_wait().unwrap().is_none(),
        "one watched pid still alive"
    );
    let status = wait_exit(&mut child, Duration::from_secs(3)).expect("exits after both pids");
    assert!(status.success());
    short.wait().unwrap();
    long.wait().unwrap();
}

#[test]
fn binary_refuses_bad_arguments_and_files_with_status_2() {
    let f = Files::new("bad");
    let (w, r) = f.node(0);
    let small = f.dir.join("small.win");
    File::create(&small).unwrap().set_len(1 << 20).unwrap();
    let missing = f.dir.join("missing.ram");
    let cases: [(Vec<String>, &str); 5] = [
        (vec![], "--node"),
        (vec!["--bogus".into()], "unexpected argument '--bogus'"),
        (
            vec!["--node".into(), Files::arg(&w, &missing)],
            "cannot open",
        ),
        (vec!["--node".into(), Files::arg(&small, &r)], "16 MiB"),
        (
            vec![
                "--node".into(),
                Files::arg(&w, &r),
                "--fail".into(),
                "NOPE".into(),
            ],
            "unknown command",
        ),
    ];
    for (args, want) in cases {
        let out = emu_bin().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let help = emu_bin().arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--node WINDOW_FILE,RAM_FILE"));
}

/// Round trips through the binary with the default polling, the guest side
/// spinning like a vCPU: `cargo test --release -p sim --test emu -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn bench_round_trips() {
    let f = Files::new("bench");
    let (w, r) = f.node(0);
    let mut child = emu_bin()
        .args(["--stats", "--node", &Files::arg(&w, &r)])
        .stderr(Stdio::piped())
        .spawn()
        .map(Reaper)
        .unwrap();
    let mut g = Guest::open(&w, &r);
    assert!(g.wait_magic(Duration::from_secs(5)));
    g.set_cfg(4, 6);
    let t = Instant::now();
    while g.cfg(4) & 0xffff != 6 && t.elapsed() < Duration::from_secs(3) {
        std::thread::yield_now();
    }
    let n = 20_000;
    let mut lat = Vec::with_capacity(n);
    let t0 = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        g.post(Opcode::QUERY_FW, 0, 0, OUTBOX);
        assert_eq!(g.wait(core::hint::spin_loop), Some(0));
        lat.push(t.elapsed());
    }
    let wall = t0.elapsed();
    lat.sort();
    // First command after an idle spell.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    g.post(Opcode::QUERY_FW, 0, 0, OUTBOX);
    assert_eq!(g.wait(core::hint::spin_loop), Some(0));
    let cold = t.elapsed();
    g.win.store32(hdr::GUEST_STATE, GUEST_SHUT_DOWN);
    assert!(wait_exit(&mut child, Duration::from_secs(3)).is_some());
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    println!(
        "{n} QUERY_FW in {wall:?}: p50 {:?} p99 {:?} max {:?}; after 300 ms idle {cold:?}\n{err}",
        lat[n / 2],
        lat[n * 99 / 100],
        lat[n - 1]
    );
}

#[test]
fn guest_ram_above_4_gib_and_faults_in_the_hole() {
    use sim::HostMemory;
    use sim::front::ivshmem::GuestRam;
    use sim::hca::mem::DmaFaultKind;
    let f = Files::new("bigram");
    let path = f.dir.join("big.ram");
    let size: u64 = 3 << 30;
    File::create(&path).unwrap().set_len(size).unwrap(); // sparse
    let ram = GuestRam::open(&path).unwrap();
    let file = SharedFile::open(&path).unwrap();
    ram.write(0x1_0000_1000, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let mut b = [0u8; 8];
    assert!(
        file.read_bytes(0x8000_1000, &mut b),
        "gpa 4G+4K is file offset 2G+4K"
    );
    assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
    ram.write(0x7fff_fff8, &[9; 8]).unwrap();
    let mut top = [0u8; 4];
    ram.read(0x1_3fff_fffc, &mut top).unwrap();
    for (gpa, len) in [
        (0x8000_0000u64, 4usize),
        (0x7fff_fffc, 8),
        (0xfebf_0000, 4),
        (0x1_4000_0000, 1),
        (0x1_3fff_fffc, 8),
        (0x8_0000, 4),
    ] {
        let e = ram.read(gpa, &mut vec![0; len]).unwrap_err();
        assert_eq!((e.bus, e.len, e.kind), (gpa, len, DmaFaultKind::OutOfRange));
        assert!(ram.write(gpa, &vec![0; len]).unwrap_err().write);
    }
    for bad in [4095u64, 1 << 20] {
        let p = f.dir.join(format!("bad{bad}.ram"));
        File::create(&p).unwrap().set_len(bad).unwrap();
        assert!(GuestRam::open(&p).is_err(), "{bad} bytes");
    }
}
