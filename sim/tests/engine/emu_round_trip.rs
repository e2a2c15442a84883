//! The emulator round trip: figures, not assertions.
//!
//! The emulator round trip (release build, `--ignored`, figures printed,
//! nothing asserted about time): `cx3-emu` runs as its own process, as
//! under QEMU, and this process plays the guests through the same shared
//! files a guest uses (the window's config image, BAR0 and BAR2 as
//! registers, the RAM file as DMA memory at guest-physical addresses),
//! driving the raw poster: doorbell written into the BAR2 file to the CQE
//! visible in the RAM file, with the emulator's own polling and idle
//! strategy. The stack's share of a guest figure is the guest figure minus
//! this one.
//!
//! `cargo test --release -p sim --test engine -- --ignored --nocapture emu_round_trip`

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hal::dma::{DmaAllocator, DmaRegion, DmaStats, RangeAllocator};
use hal::{Bar, BusAddr, Clock, ConfigSpace, DmaPool, PciAddress, PciFunction, RegisterBackend};
use sim::front::ivshmem::{
    BAR0_LEN, BAR0_OFF, BAR2_LEN, BAR2_OFF, CONFIG_OFF, GUEST_SHUT_DOWN, MAGIC, SharedFile, hdr,
};

use crate::harness::Raw;
use crate::poster::*;

/// Guest RAM per node (a sparse file on tmpfs).
const RAM: u64 = 256 << 20;
/// DMA memory starts here (above the DMA floor, as a guest's pool would).
const DMA_BASE: u64 = 16 << 20;

/// One node's files, removed on drop.
struct Node {
    win: PathBuf,
    ram: PathBuf,
}

impl Node {
    fn new(dir: &Path, n: u32) -> Node {
        let win = dir.join(format!("node{n}.win"));
        let ram = dir.join(format!("node{n}.ram"));
        File::create(&win).unwrap().set_len(16 << 20).unwrap();
        File::create(&ram).unwrap().set_len(RAM).unwrap();
        Node { win, ram }
    }
}

/// A register window over part of the shared window file (what the
/// guest's uncached BAR mapping is).
struct WindowBar {
    file: Arc<SharedFile>,
    base: usize,
}

impl RegisterBackend for WindowBar {
    fn read32(&self, off: usize) -> u32 {
        self.file.load32(self.base + off)
    }
    fn write32(&self, off: usize, v: u32) {
        self.file.store32(self.base + off, v)
    }
    fn write64(&self, off: usize, v: u64) {
        self.file.store64(self.base + off, v)
    }
}

/// The config-space image in the window.
struct WindowConfig(Arc<SharedFile>);

impl ConfigSpace for WindowConfig {
    fn read32(&self, off: u16) -> u32 {
        self.0.load32(CONFIG_OFF + usize::from(off & !3))
    }
    fn write32(&self, off: u16, v: u32) {
        self.0.store32(CONFIG_OFF + usize::from(off & !3), v)
    }
}

/// DMA memory in the RAM file: what the guest's DMA pool is, bus address
/// = guest-physical address = file offset (RAM below 2816 MiB).
struct RamDma {
    map: memmap2::MmapRaw,
    ranges: Mutex<RangeAllocator>,
}

// SAFETY: `alloc` hands out non-overlapping ranges of the RAM file mapping
// above DMA_BASE (bookkeeping under the mutex), zeroed, aligned in both
// views (the mapping is page aligned and bus = file offset), which the
// emulator reaches at the same bus address through its own mapping of the
// file; the mapping lives as long as the allocator, which every `DmaBuf`
// keeps alive through its pool.
unsafe impl DmaAllocator for RamDma {
    fn alloc(&self, len: usize, align: usize) -> hal::Result<DmaRegion> {
        let (off, size) = self
            .ranges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alloc(len, align, DMA_BASE)?;
        let at = DMA_BASE as usize + off;
        // SAFETY: `[at, at + size)` is inside the mapping (the range
        // allocator covers RAM - DMA_BASE bytes from DMA_BASE).
        let cpu = unsafe { self.map.as_mut_ptr().add(at) };
        // SAFETY: just reserved, so no other region overlaps it.
        unsafe { core::ptr::write_bytes(cpu, 0, size) };
        let cpu = NonNull::new(cpu).ok_or(hal::Error::NoMemory)?;
        // SAFETY: see the impl's comment.
        Ok(unsafe { DmaRegion::new(cpu, BusAddr(at as u64), len) })
    }
    unsafe fn free(&self, region: DmaRegion) {
        let off = (region.bus().0 - DMA_BASE) as usize;
        self.ranges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free(off);
    }
    fn stats(&self) -> DmaStats {
        self.ranges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stats()
    }
}

/// Real time for the poster's deadlines.
struct Mono(Instant);

impl Clock for Mono {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
    fn relax(&self) {
        std::hint::spin_loop();
    }
    fn delay(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// The guest side of one node: a poster over its files, brought up to
/// the ports.
fn guest(n: &Node) -> (Hca, Arc<SharedFile>) {
    let win = Arc::new(SharedFile::open(&n.win).unwrap());
    let t = Instant::now();
    while win.load32(hdr::MAGIC) != MAGIC {
        assert!(t.elapsed() < Duration::from_secs(10), "no emulator");
        std::thread::sleep(Duration::from_millis(1));
    }
    let bar = |base: usize, len: usize| {
        let b: Arc<dyn RegisterBackend> = Arc::new(WindowBar {
            file: win.clone(),
            base,
        });
        Some(Bar::from_backend(b, len))
    };
    let pci = PciFunction::new(
        PciAddress::default(),
        Arc::new(WindowConfig(win.clone())),
        sim::hca::pci::PciConfig::bar_infos(),
        [
            bar(BAR0_OFF, BAR0_LEN),
            None,
            bar(BAR2_OFF, BAR2_LEN),
            None,
            None,
            None,
        ],
    );
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&n.ram)
        .unwrap();
    let map = memmap2::MmapRaw::map_raw(&file).unwrap();
    let dma = RamDma {
        map,
        ranges: Mutex::new(RangeAllocator::new((RAM - DMA_BASE) as usize, 64)),
    };
    let pool = DmaPool::new(Arc::new(dma));
    let clock: Arc<dyn Clock> = Arc::new(Mono(Instant::now()));
    // The placeholder model is never polled: the device is cx3-emu's.
    let placeholder = sim::SimHca::new(sim::SimConfig::default());
    let raw = Raw::over(placeholder, pci, pool, clock);
    (Hca::bare_raw(raw), win)
}

/// cx3-emu over `nodes`, ended (and waited for) on drop.
struct Emu(Child);

impl Drop for Emu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(nodes: &[&Node], extra: &[&str]) -> Emu {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cx3-emu"));
    for n in nodes {
        c.arg("--node")
            .arg(format!("{},{}", n.win.display(), n.ram.display()));
    }
    // EMU_ARGS: more cx3-emu options (polling experiments: --spin-us ...).
    let more = std::env::var("EMU_ARGS").unwrap_or_default();
    c.args(extra)
        .args(more.split_whitespace())
        .arg("--stats")
        .arg("--exit-with-parent");
    Emu(c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap())
}

fn stop(mut emu: Emu, wins: &[&SharedFile]) -> String {
    for w in wins {
        w.store32(hdr::GUEST_STATE, GUEST_SHUT_DOWN);
    }
    let t = Instant::now();
    while emu.0.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut err = String::new();
    if let Some(e) = emu.0.stderr.as_mut() {
        let _ = std::io::Read::read_to_string(e, &mut err);
    }
    err
}

/// CPU seconds (user + system, 100 Hz ticks) process `pid` has used: the
/// figures per emulator CPU second mean something on a loaded machine,
/// where the wall-clock ones mostly measure the scheduler.
fn cpu_of(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// CPU time this thread has run, in ns (the scheduler's own account):
/// figures that mean something on a loaded machine.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn percentiles(mut lat: Vec<u64>) -> String {
    lat.sort_unstable();
    let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)] as f64 / 1000.0;
    format!(
        "median {:.2} us, p90 {:.2} us, p99 {:.2} us, min {:.2} us, max {:.2} us",
        p(0.5),
        p(0.9),
        p(0.99),
        p(0.0),
        p(1.0)
    )
}

fn dir(tag: &str) -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let d = base.join(format!("cx3-emu-rt-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Posts `wr` and spins on the CQ; the time from the doorbell store to
/// the CQE, in ns.
fn one_round_trip(h: &Hca, q: &mut Qp, cq: &mut Cq, wqe: &[u8], opcode: u8) -> u64 {
    q.put(opcode, false, wqe);
    let t = Instant::now();
    h.ring_send(q.qpn);
    loop {
        if let Some(c) = cq.poll() {
            assert!(c.ok(), "{c:?}");
            return t.elapsed().as_nanos() as u64;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "no CQE within 5 s");
        std::hint::spin_loop();
    }
}

/// One node, an RC QP looped back to another QP of the same HCA: 8-byte
/// RDMA WRITE latency (doorbell to CQE) through cx3-emu's files, with its
/// default polling (`--spin-us` etc.) and the poster spinning like a vCPU.
#[test]
#[ignore]
fn bench_emu_round_trip() {
    let d = dir("one");
    let n0 = Node::new(&d, 0);
    let emu = start(&[&n0], &[]);
    let (mut h, win) = guest(&n0);
    h.port_up(1, 1).unwrap();
    let mut cq = h.cq(10);
    let s = QpSpec::new(RC, cq.cqn);
    let mut a = h.qp(0x80, s);
    let b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let src = h.mr(0x1000, 4096, acc::ALL);
    let dst = h.mr(0x9000, 4096, acc::ALL);
    let wqe = a.build(&Wr {
        opcode: op::RDMA_WRITE,
        signalled: true,
        raddr: dst.addr(0),
        rkey: dst.key,
        sges: vec![src.sge(0, 8)],
        ..Wr::default()
    });
    let n = 20_000;
    let lat: Vec<u64> = (0..n)
        .map(|_| one_round_trip(&h, &mut a, &mut cq, &wqe, op::RDMA_WRITE))
        .collect();
    // Spaced out: each doorbell after a 100 us pause (a guest that thinks
    // between requests), then after 300 ms (the emulator's deep idle).
    let mut spaced = Vec::new();
    for _ in 0..500 {
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(100) {
            std::hint::spin_loop();
        }
        spaced.push(one_round_trip(&h, &mut a, &mut cq, &wqe, op::RDMA_WRITE));
    }
    std::thread::sleep(Duration::from_millis(300));
    let cold = one_round_trip(&h, &mut a, &mut cq, &wqe, op::RDMA_WRITE);
    let err = stop(emu, &[&win]);
    println!(
        "cx3-emu round trip, 8-byte RDMA WRITE loopback, doorbell to CQE, {n} back to back: {}\n\
         the same, each after 100 us without work: {}\n\
         after 300 ms idle: {:.1} us\nload average {}\n{err}",
        percentiles(lat),
        percentiles(spaced),
        cold as f64 / 1000.0,
        load()
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Two nodes of one cx3-emu, back to back: 64 KiB RDMA WRITEs from node 0
/// to node 1 over the emulated wire (what `ib_write_bw` between two guests
/// asks of the emulator), 16 per doorbell, and 8-byte WRITE round trips
/// between the nodes.
#[test]
#[ignore]
fn bench_emu_two_nodes() {
    let d = dir("two");
    let (n0, n1) = (Node::new(&d, 0), Node::new(&d, 1));
    let emu = start(&[&n0, &n1], &["--back-to-back"]);
    let (mut a, wa) = guest(&n0);
    let (mut b, wb) = guest(&n1);
    a.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    b.r.cmd(0, 1, 0, sim::Opcode::INIT_PORT).unwrap();
    // The link trains in the emulator's next rounds.
    std::thread::sleep(Duration::from_millis(50));
    a.activate(1, 1).unwrap();
    b.activate(1, 2).unwrap();
    let mut ca = a.cq(10);
    let cb = b.cq(10);
    let mut sa = QpSpec::new(RC, ca.cqn);
    sa.sq_log = 8;
    let sb = QpSpec::new(RC, cb.cqn);
    let mut qa = a.qp(0x80, sa);
    let qb = b.qp(0x90, sb);
    a.connect(&qa, sa, 0x90, b.lid).unwrap();
    b.connect(&qb, sb, 0x80, a.lid).unwrap();
    let src = a.mr(0x10_0000_0000, 1 << 20, acc::ALL);
    let dst = b.mr(0x20_0000_0000, 1 << 20, acc::ALL);
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    src.write(0, &pattern);
    let len = 65536u32;
    let mk = |i: u64, sig: bool, len: u32| {
        qa.build(&Wr {
            opcode: op::RDMA_WRITE,
            signalled: sig,
            raddr: dst.addr((i * 65536) % (1 << 20)),
            rkey: dst.key,
            sges: vec![src.sge(0, len)],
            ..Wr::default()
        })
    };
    let (plain, sig, small) = (mk(0, false, len), mk(0, true, len), mk(0, true, 8));
    let n = 20_000u64;
    let batch = 16u64;
    let pid = emu.0.id();
    let c0 = cpu_of(pid);
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        for k in 0..batch {
            let mut w = if k + 1 == batch {
                sig.clone()
            } else {
                plain.clone()
            };
            w[16..24].copy_from_slice(&dst.addr(((i + k) * 65536) % (1 << 20)).to_be_bytes());
            qa.put(op::RDMA_WRITE, false, &w);
        }
        a.ring_send(qa.qpn);
        i += batch;
        let dl = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(c) = ca.poll() {
                assert!(c.ok(), "{c:?}");
                break;
            }
            assert!(Instant::now() < dl, "no CQE within 10 s");
            std::hint::spin_loop();
        }
    }
    let wall = t.elapsed().as_secs_f64();
    let cpu = cpu_of(pid) - c0;
    assert_eq!(dst.read(0, 65536), pattern, "bytes arrived");
    let lat: Vec<u64> = (0..10_000)
        .map(|_| one_round_trip(&a, &mut qa, &mut ca, &small, op::RDMA_WRITE))
        .collect();
    let err = stop(emu, &[&wa, &wb]);
    println!(
        "cx3-emu, two nodes back to back, 64 KiB RDMA WRITE node0 -> node1, 16 per doorbell: \
         {n} in {wall:.3} s = {:.2} GB/s ({:.0} MB/s in perftest's MB), {:.0} messages/s; \
         emulator CPU {cpu:.2} s = {:.1} us per message, {:.2} GB per emulator CPU second\n\
         8-byte RDMA WRITE node0 -> node1, doorbell to CQE (the ACK back included): {}\n\
         load average {}\n{err}",
        n as f64 * 65536.0 / wall / 1e9,
        n as f64 * 65536.0 / wall / 1048576.0,
        n as f64 / wall,
        cpu / n as f64 * 1e6,
        n as f64 * 65536.0 / cpu.max(0.01) / 1e9,
        percentiles(lat),
        load()
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// cx3-emu's own work per doorbell, without the scheduler: the emulator
/// (the same `Emulator` the binary runs, over the same files) is brought
/// up on a thread, then driven round by round on the poster's thread:
/// doorbell, `poll_round` until the CQE is in the RAM file. Prints the
/// cost of an idle round (how late a doorbell can be noticed) and of the
/// doorbell-to-CQE rounds (what the emulator adds once it has seen it).
///
/// `cargo test --release -p sim --test engine -- --ignored --nocapture emu_rounds_in_process`
#[test]
#[ignore]
fn bench_emu_rounds_in_process() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let d = dir("inproc");
    let n0 = Node::new(&d, 0);
    let specs = [(n0.win.clone(), n0.ram.clone())];
    let emu = sim::front::ivshmem::Emulator::open(
        &specs,
        sim::front::ivshmem::Options::default(),
        sim::front::host::Log::capture(),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut emu = emu;
            emu.run(&stop);
            emu
        })
    };
    let (mut h, _win) = guest(&n0);
    h.port_up(1, 1).unwrap();
    let mut cq = h.cq(10);
    let s = QpSpec::new(RC, cq.cqn);
    let mut a = h.qp(0x80, s);
    let b = h.qp(0x81, s);
    let lid = h.lid;
    h.connect(&a, s, 0x81, lid).unwrap();
    h.connect(&b, s, 0x80, lid).unwrap();
    let src = h.mr(0x1000, 4096, acc::ALL);
    let dst = h.mr(0x9000, 4096, acc::ALL);
    let wqe = a.build(&Wr {
        opcode: op::RDMA_WRITE,
        signalled: true,
        raddr: dst.addr(0),
        rkey: dst.key,
        sges: vec![Sge {
            addr: src.addr(0),
            len: 8,
            lkey: src.key,
        }],
        ..Wr::default()
    });
    stop.store(true, Ordering::Release);
    let mut emu = server.join().unwrap();
    // Idle rounds, full (every FULL_ROUND_EVERY in the busy loop) and
    // light (the others): (wall, CPU) ns per round.
    let idle_n: u32 = std::env::var("IDLE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let mut idle = |full: bool| {
        let (t, c) = (Instant::now(), thread_cpu_ns());
        idle_rounds(&mut emu, full, idle_n);
        (
            t.elapsed().as_nanos() as f64 / f64::from(idle_n),
            (thread_cpu_ns() - c) as f64 / f64::from(idle_n),
        )
    };
    let (full_wall, full_cpu) = idle(true);
    let (light_wall, light_cpu) = idle(false);
    // Doorbell to CQE, the rounds on this thread.
    let n = std::env::var("TRIPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let c = thread_cpu_ns();
    let (lat, served, rounds) = trips(&mut emu, &h, &mut a, &mut cq, &wqe, n);
    let trip_cpu = (thread_cpu_ns() - c) as f64 / n as f64;
    assert_eq!(dst.read(0, 8), src.read(0, 8));
    let (_, violations, faults) = emu.nodes()[0].counts();
    assert_eq!((violations, faults), (0, 0), "{:?}", emu.log().lines());
    println!(
        "cx3-emu in process, one thread, idle rounds: full {full_wall:.0} ns wall, \
         {full_cpu:.0} ns CPU; light {light_wall:.0} ns wall, {light_cpu:.0} ns CPU\n\
         8-byte RDMA WRITE loopback, doorbell to CQE over {:.2} light rounds, {trip_cpu:.0} ns \
         CPU each (poster included), wall: {}\n\
         the round that found the doorbell (doorbell seen to CQE written): {}\nload average {}",
        rounds as f64 / n as f64,
        percentiles(lat),
        percentiles(served),
        load()
    );
    drop(emu);
    let _ = std::fs::remove_dir_all(&d);
}

/// `n` idle rounds, full or light (a function of its own so that
/// `valgrind --tool=callgrind --toggle-collect='*idle_rounds*'` counts
/// the instructions of these rounds only).
#[inline(never)]
fn idle_rounds(emu: &mut sim::front::ivshmem::Emulator, full: bool, n: u32) {
    for _ in 0..n {
        let work = if full {
            emu.poll_round()
        } else {
            emu.poll_round_light()
        };
        assert!(!work, "an idle round found work");
    }
}

/// `n` doorbell-to-CQE trips, the light rounds on this thread: (wall ns
/// per trip, wall ns of the round that found the doorbell, rounds run).
/// Its own function for callgrind (`--toggle-collect='*emu_round_trip*trips*'`).
#[inline(never)]
fn trips(
    emu: &mut sim::front::ivshmem::Emulator,
    h: &Hca,
    a: &mut Qp,
    cq: &mut Cq,
    wqe: &[u8],
    n: usize,
) -> (Vec<u64>, Vec<u64>, u64) {
    let mut lat = Vec::with_capacity(n);
    let mut served = Vec::with_capacity(n);
    let mut rounds = 0u64;
    for _ in 0..n {
        a.put(op::RDMA_WRITE, false, wqe);
        let t = Instant::now();
        h.ring_send(a.qpn);
        loop {
            let r = Instant::now();
            if emu.poll_round_light() {
                served.push(r.elapsed().as_nanos() as u64);
            }
            rounds += 1;
            if let Some(c) = cq.poll() {
                assert!(c.ok(), "{c:?}");
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "no CQE within 5 s");
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    (lat, served, rounds)
}
