//! cx3-vfu without QEMU, driven by the `vfio_user` crate's own client.
//!
//! cx3-vfu without QEMU: the `vfio_user` crate's own client drives the
//! function over a real socket the way QEMU's does (config space, trapped
//! BAR0, DMA into a shared memfd, MSI-X eventfds, BAR2 mapped from the
//! function's own file with the engine tests' raw poster ringing doorbells
//! into it), and the binary's command line, signal and error behaviour.

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

#[path = "model/harness.rs"]
mod harness;
#[path = "engine/poster.rs"]
mod poster;

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

// ---------------------------------------------------------------------------
// BAR2 mapped: the guest's doorbells are stores into the function's file

mod mapped {
    use std::sync::Mutex;

    use hal::dma::{DmaAllocator, DmaRegion, DmaStats, RangeAllocator};
    use hal::{
        Bar, BusAddr, Clock, ConfigSpace, DmaPool, PciAddress, PciFunction, RegisterBackend,
    };
    use sim::front::ivshmem::SharedFile;
    use sim::front::vfu::{Function, PollOptions, regions_with};

    use std::sync::atomic::Ordering;

    use super::*;
    use crate::harness::{Raw, profile::UAR};
    use crate::poster::*;

    /// Guest RAM: a memfd mapped at this I/O virtual address (= bus address).
    const DMA_BASE: u64 = 16 << 20;
    const DMA_LEN: u64 = 64 << 20;
    const BAR2_LEN: u64 = 8 << 20;

    /// The client, shared by the config-space and BAR0 views (one message
    /// per access, as QEMU's trapped regions).
    type Shared = Arc<Mutex<Client>>;

    struct ClientConfig(Shared);

    impl ConfigSpace for ClientConfig {
        fn read32(&self, off: u16) -> u32 {
            let mut b = [0u8; 4];
            let mut c = self.0.lock().unwrap();
            c.region_read(7, u64::from(off & !3), &mut b).unwrap();
            u32::from_le_bytes(b)
        }
        fn write32(&self, off: u16, v: u32) {
            let mut c = self.0.lock().unwrap();
            c.region_write(7, u64::from(off & !3), &v.to_le_bytes())
                .unwrap();
        }
    }

    struct ClientBar0(Shared);

    impl RegisterBackend for ClientBar0 {
        fn read32(&self, off: usize) -> u32 {
            let mut b = [0u8; 4];
            let mut c = self.0.lock().unwrap();
            c.region_read(0, off as u64, &mut b).unwrap();
            u32::from_ne_bytes(b)
        }
        fn write32(&self, off: usize, raw: u32) {
            let mut c = self.0.lock().unwrap();
            c.region_write(0, off as u64, &raw.to_ne_bytes()).unwrap();
        }
        fn write64(&self, off: usize, raw: u64) {
            let mut c = self.0.lock().unwrap();
            c.region_write(0, off as u64, &raw.to_ne_bytes()).unwrap();
        }
    }

    /// BAR2 as the guest has it: the region's file, mapped here (what
    /// QEMU maps into the guest); a store is a store, no message.
    struct MappedBar2(Arc<SharedFile>);

    impl RegisterBackend for MappedBar2 {
        fn read32(&self, off: usize) -> u32 {
            self.0.load32(off)
        }
        fn write32(&self, off: usize, raw: u32) {
            self.0.store32(off, raw)
        }
        fn write64(&self, off: usize, raw: u64) {
            self.0.store64(off, raw)
        }
    }

    /// DMA memory in the RAM memfd, bus address = DMA_BASE + file offset.
    struct RamDma {
        map: memmap2::MmapRaw,
        ranges: Mutex<RangeAllocator>,
    }

    // SAFETY: `alloc` hands out non-overlapping, zeroed ranges of the RAM
    // mapping (bookkeeping under the mutex), which the function reaches at
    // the same bus address through its own mapping of the file (the
    // client's dma_map); the mapping lives as long as the allocator, which
    // every `DmaBuf` keeps alive through its pool.
    unsafe impl DmaAllocator for RamDma {
        fn alloc(&self, len: usize, align: usize) -> hal::Result<DmaRegion> {
            let (off, size) = self.ranges.lock().unwrap().alloc(len, align, DMA_BASE)?;
            // SAFETY: `[off, off + size)` is inside the mapping (the range
            // allocator covers DMA_LEN bytes).
            let cpu = unsafe { self.map.as_mut_ptr().add(off) };
            // SAFETY: just reserved, so no other region overlaps it.
            unsafe { core::ptr::write_bytes(cpu, 0, size) };
            let cpu = core::ptr::NonNull::new(cpu).ok_or(hal::Error::NoMemory)?;
            // SAFETY: see the impl's comment.
            Ok(unsafe { DmaRegion::new(cpu, BusAddr(DMA_BASE + off as u64), len) })
        }
        unsafe fn free(&self, region: DmaRegion) {
            let off = (region.bus().0 - DMA_BASE) as usize;
            self.ranges.lock().unwrap().free(off);
        }
        fn stats(&self) -> DmaStats {
            self.ranges.lock().unwrap().stats()
        }
    }

    /// Real time; delays capped at 200 ms (the model's software reset
    /// takes 100 ms, the harness waits Linux's second).
    struct Mono(Instant);

    impl Clock for Mono {
        fn now_ns(&self) -> u64 {
            self.0.elapsed().as_nanos() as u64
        }
        fn relax(&self) {
            std::hint::spin_loop();
        }
        fn delay(&self, d: Duration) {
            std::thread::sleep(d.min(Duration::from_millis(200)));
        }
    }

    /// A function served on its own thread with BAR2 mapped, and the raw
    /// poster driving it as a guest would: config and BAR0 by messages,
    /// BAR2 by stores into the mapped file, DMA in a shared memfd.
    struct Guest {
        f: Arc<Function>,
        h: Hca,
        bar2: Arc<SharedFile>,
        client: Shared,
        path: PathBuf,
    }

    impl Drop for Guest {
        fn drop(&mut self) {
            let _ = self.client.lock().map(|c| c.shutdown());
            let _ = std::fs::remove_file(&self.path);
        }
    }

    fn guest(tag: &str, poll: PollOptions) -> Guest {
        let path = sock_path(tag);
        let _ = std::fs::remove_file(&path);
        let opts = Options {
            poll,
            ..Options::default()
        };
        let f = Function::new(0, opts, Log::capture());
        let server = vfio_user::Server::new(&path, true, irqs(), f.regions()).unwrap();
        let f2 = f.clone();
        std::thread::spawn(move || {
            static NEVER: AtomicBool = AtomicBool::new(false);
            serve(&f2, server, &NEVER);
        });
        let mut c = Client::new(&path).unwrap();
        // BAR2 is mmappable: one sparse area over the whole BAR, backed by
        // the file that came with the region's info (what QEMU maps).
        let r2 = c.region(2).expect("BAR2");
        assert_eq!(r2.size, BAR2_LEN);
        assert_ne!(r2.flags & (1 << 2), 0, "VFIO_REGION_INFO_FLAG_MMAP");
        let areas: Vec<_> = r2.sparse_areas.iter().map(|a| (a.offset, a.size)).collect();
        assert_eq!(areas, vec![(0, BAR2_LEN)]);
        let fo = r2.file_offset.as_ref().expect("BAR2's file");
        assert_eq!(fo.start(), 0);
        let bar2 = Arc::new(
            SharedFile::open(Path::new(&format!(
                "/proc/self/fd/{}",
                fo.file().as_raw_fd()
            )))
            .unwrap(),
        );
        assert_eq!(bar2.len() as u64, BAR2_LEN);
        // BAR0 stays trapped.
        let r0 = c.region(0).expect("BAR0");
        assert_eq!(r0.flags & (1 << 2), 0);
        assert!(r0.file_offset.is_none());
        let ram = memfd(DMA_LEN);
        c.dma_map(0, DMA_BASE, DMA_LEN, ram.as_raw_fd()).unwrap();
        let client: Shared = Arc::new(Mutex::new(c));
        let b0: Arc<dyn RegisterBackend> = Arc::new(ClientBar0(client.clone()));
        let b2: Arc<dyn RegisterBackend> = Arc::new(MappedBar2(bar2.clone()));
        let pci = PciFunction::new(
            PciAddress::default(),
            Arc::new(ClientConfig(client.clone())),
            sim::hca::pci::PciConfig::bar_infos(),
            [
                Some(Bar::from_backend(b0, 1 << 20)),
                None,
                Some(Bar::from_backend(b2, BAR2_LEN as usize)),
                None,
                None,
                None,
            ],
        );
        let dma = RamDma {
            map: memmap2::MmapRaw::map_raw(&ram).unwrap(),
            ranges: Mutex::new(RangeAllocator::new(DMA_LEN as usize, 64)),
        };
        let pool = DmaPool::new(Arc::new(dma));
        let clock: Arc<dyn Clock> = Arc::new(Mono(Instant::now()));
        // The placeholder model is never used: the device is the function.
        let placeholder = sim::SimHca::new(sim::SimConfig::default());
        let mut h = Hca::bare_raw(Raw::over(placeholder, pci, pool, clock));
        h.port_up(1, 1).unwrap();
        Guest {
            f,
            h,
            bar2,
            client,
            path,
        }
    }

    impl Guest {
        /// The function's violations so far (streamed to its log).
        fn violations(&self) -> Vec<String> {
            self.f.service();
            self.f
                .log_lines()
                .into_iter()
                .filter(|l| l.contains("violation"))
                .collect()
        }

        /// Waits until the model has taken the send doorbell stored on the
        /// poster's UAR page (the poll swaps the word back to zero).
        fn wait_taken(&self) {
            let t = Instant::now();
            while self.bar2.load32(UAR as usize * 4096 + 0x14) != 0 {
                assert!(t.elapsed() < Duration::from_secs(5), "doorbell never taken");
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// The next completion, within 5 s.
    fn next(cq: &mut Cq) -> Cqe {
        let t = Instant::now();
        loop {
            if let Some(c) = cq.poll() {
                return c;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "no CQE within 5 s");
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// An 8-byte RDMA WRITE from `src` to `dst` at `at`, signalled.
    fn write8(src: &Mr, dst: &Mr, at: u64) -> Wr {
        Wr {
            opcode: op::RDMA_WRITE,
            signalled: true,
            raddr: dst.addr(at),
            rkey: dst.key,
            sges: vec![src.sge(at, 8)],
            ..Wr::default()
        }
    }

    #[test]
    fn a_doorbell_stored_into_the_mapped_uar_page_runs_its_wqe_and_the_checks_stay() {
        let mut g = guest("uar", PollOptions::default());
        let h = &mut g.h;
        let mut cq = h.cq(6);
        let s = QpSpec::new(RC, cq.cqn);
        let mut a = h.qp(0x80, s);
        let b = h.qp(0x81, s);
        let lid = h.lid;
        h.connect(&a, s, 0x81, lid).unwrap();
        h.connect(&b, s, 0x80, lid).unwrap();
        let src = h.mr(0x1000, 4096, acc::ALL);
        let dst = h.mr(0x9000, 4096, acc::ALL);
        src.write(0, b"doorbell");
        let bar2_messages = g.f.counters.bar2.load(Ordering::Relaxed);

        // The WQE, then its doorbell: a store into the mapped page, which
        // the model's poll takes; the WQE runs.
        a.post(&g.h, &write8(&src, &dst, 0));
        let c = next(&mut cq);
        assert!(c.ok() && c.send && c.qpn == 0x80, "{c:?}");
        assert_eq!(dst.read(0, 8), b"doorbell");
        assert!(g.f.counters.uar_polls.load(Ordering::Relaxed) > 0);
        assert_eq!(
            g.f.counters.bar2.load(Ordering::Relaxed),
            bar2_messages,
            "no BAR2 message: the doorbell was a store"
        );

        // A doorbell before its WQE: taken with nothing to run, the WQE
        // written after it is the software's until the next doorbell, as
        // when the card sees the doorbell first.
        src.write(8, b"ordered!");
        g.h.ring_send(a.qpn);
        g.wait_taken();
        a.put(op::RDMA_WRITE, false, &a.build(&write8(&src, &dst, 8)));
        std::thread::sleep(Duration::from_millis(50));
        assert!(cq.poll().is_none(), "a WQE ran without a doorbell after it");
        assert_eq!(dst.read(8, 8), [0; 8]);
        g.h.ring_send(a.qpn);
        assert!(next(&mut cq).ok());
        assert_eq!(dst.read(8, 8), b"ordered!");
        assert!(g.violations().is_empty(), "{:?}", g.violations());

        // The same doorbell as a BAR2 message (QEMU traps a mapped BAR
        // again after the function's first INTx, for good): it lands in the
        // page and is taken at once, as the store would be.
        src.write(16, b"message!");
        a.put(op::RDMA_WRITE, false, &a.build(&write8(&src, &dst, 16)));
        let before = g.f.counters.bar2.load(Ordering::Relaxed);
        let db = u64::from(UAR) * 4096 + 0x14;
        g.client
            .lock()
            .unwrap()
            .region_write(2, db, &(a.qpn << 8).to_be_bytes())
            .unwrap();
        assert!(next(&mut cq).ok());
        assert_eq!(dst.read(16, 8), b"message!");
        assert_eq!(g.f.counters.bar2.load(Ordering::Relaxed), before + 1);
        assert_eq!(g.bar2.load32(db as usize), 0, "taken from the page");

        // A doorbell for a WQE not completely written (its second 64-byte
        // chunk still stamped): a violation, and the WQE waits.
        let w = Wr {
            sges: (0..4).map(|i| src.sge(i * 8, 8)).collect(),
            raddr: dst.addr(64),
            ..write8(&src, &dst, 0)
        };
        let mut bytes = a.build(&w);
        let good = bytes[64..68].to_vec();
        bytes[64..68].copy_from_slice(&[0xff; 4]);
        let idx = a.put(w.opcode, false, &bytes);
        g.h.ring_send(a.qpn);
        g.wait_taken();
        assert!(
            g.violations().iter().any(|v| v.contains("stamp")),
            "{:?}",
            g.violations()
        );
        assert!(cq.poll().is_none());
        let stride = 1usize << a.sq_shift;
        let base = a.sq_off + (idx & (a.sq_cnt - 1)) as usize * stride;
        a.buf.write_bytes(base + 64, &good);
        g.h.ring_send(a.qpn);
        assert!(next(&mut cq).ok());
        assert_eq!(dst.read(64, 32), src.read(0, 32));

        // A send doorbell for a QP in RESET (never created) on the page:
        // recorded as when trapped.
        g.h.ring_send(0x85);
        g.wait_taken();
        assert!(
            g.violations()
                .iter()
                .any(|v| v.contains("send doorbell for QP 0x85 in RESET")),
            "{:?}",
            g.violations()
        );
    }

    /// The model takes what the mapped page holds before each BAR0 write:
    /// a doorbell stored just before a command (here the QP's 2RST) runs
    /// its WQE first, as on the card, even when the poll is far off.
    #[test]
    fn a_doorbell_stored_before_a_command_reaches_the_model_first() {
        let slow = PollOptions {
            spin: Duration::ZERO,
            sleep: Duration::from_millis(5),
            idle_sleep: Duration::from_millis(5),
            ..PollOptions::default()
        };
        let mut g = guest("uar-order", slow);
        let h = &mut g.h;
        let mut cq = h.cq(6);
        let s = QpSpec::new(RC, cq.cqn);
        let mut a = h.qp(0x80, s);
        let b = h.qp(0x81, s);
        let lid = h.lid;
        h.connect(&a, s, 0x81, lid).unwrap();
        h.connect(&b, s, 0x80, lid).unwrap();
        let src = h.mr(0x1000, 4096, acc::ALL);
        let dst = h.mr(0x9000, 4096, acc::ALL);
        src.write(0, b"1st then");
        for _ in 0..5 {
            a.post(&g.h, &write8(&src, &dst, 0));
            g.h.r.cmd(0, a.qpn, 2, sim::Opcode::RST_QP).unwrap();
            let c = next(&mut cq);
            assert!(c.ok() && c.send, "{c:?}");
            assert_eq!(dst.read(0, 8), b"1st then");
            dst.write(0, &[0; 8]);
            g.h.reinit(&mut a);
            g.h.connect(&a, s, 0x81, lid).unwrap();
        }
        assert!(g.violations().is_empty(), "{:?}", g.violations());
    }

    #[test]
    fn with_trap_uar_bar2_is_announced_trapped_and_a_reset_clears_the_mapped_pages() {
        let trapped = Function::new(
            0,
            Options {
                poll: PollOptions {
                    trap_uar: true,
                    ..PollOptions::default()
                },
                ..Options::default()
            },
            Log::capture(),
        );
        assert!(trapped.uar_pages().is_none());
        let r = trapped.regions();
        assert_eq!(r[2].region_info.flags & (1 << 2), 0);
        assert!(r[2].mmap_fd.is_none() && r[2].sparse_areas.is_empty());
        assert_eq!(
            regions()[2].region_info.flags,
            regions_with(None)[2].region_info.flags
        );

        // A doorbell stored before a function-level reset is not taken
        // after it (the pages read zero again).
        let f = Function::new(0, Options::default(), Log::capture());
        let u = f.uar_pages().expect("mapped by default");
        u.regs().set_raw(128 * 4096 + 0x14, (0x80u32 << 8).to_be());
        f.reset();
        assert_eq!(u.regs().raw(128 * 4096 + 0x14), 0);
        assert_eq!(f.counts(), (0, 0, 0));
    }
}
