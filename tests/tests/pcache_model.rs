//! The page cache's fault path against the model: one compute node and two memory nodes, each its own model HCA with the real mlx4_core + mlx4_ib + ib_core stack, behind the model's switch; the memory nodes serve rmem from their own threads, the compute node runs the pcache crate over a software MMU (`SoftRegion` plays the processor: page walks setting the accessed and dirty bits, faults served by `Pcache::fault`). Covers CLOCK's victim choice and dirty tracking (a clean victim is not written back, a dirty one is, and the memory node holds its bytes where the placement rule says), every workload at 25% local memory matching its local checksum, read-ahead, a pulled cable with two copies losing nothing, and without copies the fault's clear error (page, node, completion status) while another region on the live node goes on.

use tests::mlx4_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ib_core::{DeviceId, IbCore};
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;
use pcache::workload::{self, Kind, Words};
use pcache::{Cause, Config, MemNode, Pcache, SoftMmu, soft::SoftRegion};
use rmem::conn::Peer;
use rmem::{Client, ClientConfig, Server, ServerConfig};
use sim::{SimConfig, SimHca, Wire};

struct Node {
    hca: Model,
    core: IbCore,
    dev: DeviceId,
}

fn node(hca: SimHca) -> Node {
    let clock = hca.clock();
    let hca = Model::wrap(hca, "on the switch");
    let d = bring_up(&hca, Profile::default()).expect("mlx4_core");
    let ib = Mlx4IbDev::add(d, "mlx4_0").expect("mlx4_ib_add");
    let mut core = IbCore::new(clock);
    let dev = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    Node { hca, core, dev }
}

fn teardown(mut n: Node) {
    let mut p = n.core.unregister_device(n.dev).expect("unregistered");
    let ib = p
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
        .expect("mlx4_ib");
    assert_eq!(ib.live_objects(), [0; 7], "everything made was freed");
    ib.remove();
    drop(p);
    assert_eq!(n.hca.icm_mapped_pages(), 0);
    let v = n.hca.violations();
    assert!(v.is_empty(), "{v:#?}");
}

/// Each memory node exports this much.
const EXPORT: u64 = 1 << 20;

/// A memory node served from its own thread.
struct MemThread {
    stop: Arc<AtomicBool>,
    req: mpsc::Sender<Req>,
    thread: Option<thread::JoinHandle<(Node, Server)>>,
}

enum Req {
    Accept(Peer, mpsc::Sender<rmem::Result<Peer>>),
    /// The region's bytes and its base address.
    Memory(mpsc::Sender<(u64, Vec<u8>)>),
}

fn serve(n: Node) -> MemThread {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<Req>();
    let s2 = stop.clone();
    let thread = thread::spawn(move || {
        let mut n = n;
        let cm = ib_core::cm::init(&mut n.core);
        let mut srv = Server::export(&mut n.core, cm, n.dev, EXPORT, ServerConfig::default())
            .expect("exported");
        let end = Instant::now() + Duration::from_secs(300);
        while !s2.load(Ordering::Relaxed) && Instant::now() < end {
            n.core.poll();
            // A cut-off memory node may see errors; it keeps serving.
            let _ = srv.poll(&mut n.core);
            while let Ok(r) = rx.try_recv() {
                match r {
                    Req::Accept(p, back) => {
                        let _ = back.send(srv.accept_peer(&mut n.core, p));
                    }
                    Req::Memory(back) => {
                        let mut mem = vec![0u8; EXPORT as usize];
                        srv.memory().read_bytes(0, &mut mem);
                        let _ = back.send((srv.region().base, mem));
                    }
                }
            }
            std::thread::yield_now();
        }
        (n, srv)
    });
    MemThread {
        stop,
        req: tx,
        thread: Some(thread),
    }
}

impl MemThread {
    fn accept(&self, p: Peer) -> Peer {
        let (tx, rx) = mpsc::channel();
        self.req.send(Req::Accept(p, tx)).unwrap();
        rx.recv_timeout(Duration::from_secs(30))
            .expect("memory node answers")
            .expect("accepted")
    }
    fn memory(&self) -> (u64, Vec<u8>) {
        let (tx, rx) = mpsc::channel();
        self.req.send(Req::Memory(tx)).unwrap();
        rx.recv_timeout(Duration::from_secs(30)).expect("memory")
    }
    fn finish(mut self) -> Node {
        self.stop.store(true, Ordering::Relaxed);
        let (mut n, srv) = self
            .thread
            .take()
            .unwrap()
            .join()
            .expect("memory node thread");
        srv.close(&mut n.core).expect("closed");
        n
    }
}

/// The `--nodes 3` fabric: compute node LID 1, memory nodes LIDs 2 and 3.
struct Fabric {
    /// The HCAs are polled models (threaded wire), not synchronous ones.
    polled: bool,
    cn: Node,
    mems: Vec<MemThread>,
    /// The memory nodes' fabric ports (to pull their cables).
    mem_ports: Vec<sim::fabric::PortId>,
    wire: Wire,
}

/// The fabric with synchronous models: every register write reaches the
/// model at once, on the writer's thread, on one fake clock.
fn fabric() -> Fabric {
    fabric_on(false)
}

/// The fabric with `polled` models: each HCA's registers are shared
/// memory that its own model thread reads once a pass, in real time, as
/// cx3-emu serves the QEMU guests over ivshmem (a UAR page's send doorbell
/// is one word there: two QPs rung between two passes leave one value).
fn fabric_on(polled: bool) -> Fabric {
    let mut f = sim::fabric::Fabric::new();
    let built = sim::fabric::Topology::for_nodes(3)
        .unwrap()
        .build(&mut f)
        .unwrap();
    let shared = Arc::new(Mutex::new(f));
    let w = if polled {
        Wire::threaded(shared.clone())
    } else {
        Wire::over(shared.clone(), SimConfig::default().relax_step)
    };
    let hcas: Vec<SimHca> = built
        .hcas
        .iter()
        .map(|h| {
            SimHca::new_on_ports(
                SimConfig {
                    node_guid: h.node_guid,
                    ..SimConfig::default()
                },
                &w,
                [Some(h.ports[0]), Some(h.ports[1])],
            )
        })
        .collect();
    init_logger();
    let nodes: Vec<Node> = hcas.into_iter().map(node).collect();
    w.settle();
    for (i, n) in nodes.iter().enumerate() {
        let lid = i as u16 + 1;
        assert!(
            tests::sm::sm_activate(&n.hca, 1, lid, 1),
            "LID {lid} active"
        );
    }
    shared
        .lock()
        .unwrap()
        .switch_mut(built.switches[0].1)
        .unwrap()
        .configure(0x10, &[(1, 1), (2, 2), (3, 3)]);
    let mut it = nodes.into_iter();
    let cn = it.next().unwrap();
    let mut mem_ports = vec![];
    let mut mems = vec![];
    for m in it {
        mem_ports.push(m.hca.fabric_port(1).expect("on the fabric"));
        mems.push(serve(m));
    }
    Fabric {
        polled,
        cn,
        mems,
        mem_ports,
        wire: w,
    }
}

fn client_cfg(polled: bool) -> ClientConfig {
    if polled {
        // Real time on a shared machine, where a model thread may wait its
        // turn for a while: 4.096 us * 2^16 = 268 ms per try, 8 tries
        // (2.1 s, under `op_timeout`).
        return ClientConfig {
            window: 16,
            op_timeout: Duration::from_secs(5),
            ack_timeout: 16,
            retry_count: 7,
            ..ClientConfig::default()
        };
    }
    ClientConfig {
        window: 16,
        op_timeout: Duration::from_secs(5),
        // 4.096 us * 2^12 = 16.8 ms per try, 4 tries: a cut-off node is
        // noticed in ~67 ms of model time.
        ack_timeout: 12,
        retry_count: 3,
        ..ClientConfig::default()
    }
}

impl Fabric {
    /// Connections to memory nodes `which` (0 and 1: LIDs 2 and 3).
    fn connect(&mut self, which: &[usize]) -> Vec<MemNode> {
        which
            .iter()
            .map(|&i| {
                let c = Client::create(&mut self.cn.core, self.cn.dev, client_cfg(self.polled))
                    .expect("client");
                let theirs = self.mems[i].accept(Peer {
                    lid: 1,
                    qpn: c.qpn(),
                    psn: c.sq_psn(),
                });
                let c = c
                    .connect_peer(&mut self.cn.core, theirs)
                    .expect("connected");
                MemNode {
                    label: format!("LID {}", i + 2),
                    client: c,
                }
            })
            .collect()
    }

    fn attach(&mut self, which: &[usize], cfg: Config) -> Pcache {
        let nodes = self.connect(which);
        Pcache::attach(&mut self.cn.core, self.cn.dev, nodes, cfg)
            .map_err(|(e, _)| e)
            .expect("attached")
    }

    fn detach(&mut self, pc: Pcache, mmu: &mut SoftMmu) {
        for m in pc.detach(&mut self.cn.core, mmu) {
            m.client.close(&mut self.cn.core).expect("closed");
        }
        assert_eq!(mmu.mapped(), 0, "detach unmaps everything");
    }

    fn finish(self) {
        for m in self.mems {
            teardown(m.finish());
        }
        teardown(self.cn);
    }
}

fn cfg(pages: u64, cache_pages: usize, replicas: usize) -> Config {
    Config {
        pages,
        cache_pages,
        replicas,
        io_timeout: Duration::from_secs(30),
        samples: 4096,
        ..Config::default()
    }
}

/// The local-memory run of a workload.
fn local(kind: Kind, words: usize, seed: u64) -> workload::Outcome {
    let mut v = vec![0u64; words];
    workload::run(kind, v.as_mut_slice(), seed, 0).expect("local memory never fails")
}

#[test]
fn pcache_clock_and_dirty_tracking_write_back_only_what_was_written() {
    let mut f = fabric();
    let mut pc = f.attach(&[0, 1], cfg(8, 2, 1));
    let mut mmu = SoftMmu::new(8);
    {
        let mut r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
        // Page 0 written, page 1 only read (both zero-filled: never on a
        // node yet).
        r.set(0, 0x1111);
        assert_eq!(r.get(512), 0);
        assert_eq!(r.faults, [0, 0, 2, 0]);
        // Page 2: the hand passes 0 and 1 (both referenced: second
        // chance, bits cleared) and takes page 0's frame. Page 0 is
        // dirty: written back to node 0 (page 0's primary).
        r.set(1024, 0x2222);
    }
    let c = *pc.counters();
    assert_eq!((c.evictions, c.writebacks), (1, 1), "{c:?}");
    assert_eq!(pc.frame_of(0), None, "page 0 went");
    // Page 3: page 1 goes, clean: no write.
    {
        let mut r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
        r.set(3 * 512, 0x3333);
    }
    let c = *pc.counters();
    assert_eq!(
        (c.evictions, c.writebacks),
        (2, 1),
        "a clean victim is not written: {c:?}"
    );
    // Page 0 now comes back by READ with its bytes.
    {
        let mut r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
        assert_eq!(r.get(0), 0x1111);
        assert_eq!(r.faults[1], 1, "a major fault");
        assert_eq!(r.get(512), 0, "page 1 was never written: zero again");
    }
    let c = *pc.counters();
    assert_eq!(
        (c.pgmajfault, c.zero_fill, c.writebacks),
        (1, 5, 3),
        "{c:?}"
    );
    // Pages 2 and 3 were dirty: written back when they went. Page 2 is on
    // node 0 (2 mod 2), page 3 on node 1, each in slot page / 2.
    let chunk0 = pc.nodes().next().unwrap().chunk.unwrap();
    let (base, mem) = f.mems[0].memory();
    let at = (chunk0.addr - base) as usize;
    let word = |m: &[u8], off: usize| u64::from_le_bytes(m[off..off + 8].try_into().unwrap());
    assert_eq!(word(&mem, at), 0x1111, "page 0 in slot 0 of node 0");
    assert_eq!(word(&mem, at + 4096), 0x2222, "page 2 in slot 1 of node 0");
    let chunk1 = pc.nodes().nth(1).unwrap().chunk.unwrap();
    let (base1, mem1) = f.mems[1].memory();
    assert_eq!(
        word(&mem1, (chunk1.addr - base1) as usize + 4096),
        0x3333,
        "page 3 in slot 1 of node 1"
    );
    // flush writes what is still dirty, and keeps it mapped and clean.
    {
        let mut r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
        r.set(1, 0x4444);
    }
    assert_eq!(pc.flush(&mut f.cn.core, &mut mmu), Ok(1));
    assert_eq!(pc.flush(&mut f.cn.core, &mut mmu), Ok(0), "clean now");
    let s = pc
        .nodes()
        .map(|n| (n.stats.reads, n.stats.writes))
        .collect::<Vec<_>>();
    assert_eq!(s, [(1, 3), (0, 1)], "per node: reads, writes");
    f.detach(pc, &mut mmu);
    f.finish();
}

#[test]
fn pcache_every_workload_at_25_percent_matches_local_memory() {
    let mut f = fabric();
    // 64 pages (32768 words), 16 frames; pages spread over both nodes.
    let pages = 64;
    for kind in Kind::ALL {
        let mut pc = f.attach(&[0, 1], cfg(pages, 16, 1));
        let mut mmu = SoftMmu::new(pages);
        let want = local(kind, pages as usize * 512, 42);
        let got = {
            let mut r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
            let got = workload::run(kind, &mut r, 42, 0).expect("no failure");
            assert_eq!(r.error, None);
            got
        };
        assert_eq!(got, want, "{kind:?}: the same result as on local memory");
        assert!(got.ok);
        let c = *pc.counters();
        eprintln!("{kind:?}: {c:?}");
        assert!(
            c.pgmajfault > 0 && c.writebacks > 0 && c.evictions > 0,
            "{kind:?}: {c:?}"
        );
        assert_eq!(c.errors, 0);
        let (resident, lost) = pc.resident();
        assert_eq!(
            (resident, lost),
            (16, 0),
            "the cache is full, no frame lost"
        );
        // Both nodes served.
        for n in pc.nodes() {
            assert!(n.stats.reads > 0 && n.down.is_none(), "{kind:?}: {n:?}");
        }
        let split = pc.split();
        assert_eq!(split.read.count, c.pgmajfault);
        assert!(split.read.summary().median > 0);
        f.detach(pc, &mut mmu);
    }
    f.finish();
}

#[test]
fn pcache_readahead_turns_sequential_misses_into_hits() {
    let mut f = fabric();
    let pages = 64;
    let mut runs = vec![];
    for ra in [0, 4] {
        let mut pc = f.attach(
            &[0, 1],
            Config {
                readahead: ra,
                ..cfg(pages, 16, 1)
            },
        );
        let mut mmu = SoftMmu::new(pages);
        let want = local(Kind::Seq, pages as usize * 512, 9);
        {
            let mut r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
            assert_eq!(workload::run(Kind::Seq, &mut r, 9, 0), Ok(want));
        }
        runs.push(*pc.counters());
        f.detach(pc, &mut mmu);
    }
    let (off, on) = (runs[0], runs[1]);
    assert_eq!((off.readahead, off.hit), (0, 0));
    assert!(on.readahead > 0 && on.hit > 0, "{on:?}");
    assert!(
        on.pgmajfault * 2 < off.pgmajfault,
        "read-ahead of 4 takes most sequential misses: {} vs {}",
        on.pgmajfault,
        off.pgmajfault
    );
    f.finish();
}

/// Under polled models (cx3-emu's way of serving a guest) requests go to
/// both memory nodes at once: a replicated write-back's two WRITEs, a
/// read-ahead batch spread over the nodes, a flush. The two connections'
/// QPs share the kernel's UAR page, whose one send-doorbell word the second
/// ring overwrites before the model's next pass. Every request must still
/// complete: a doorbell lost so leaves its request unsent, waiting for
/// rmem's `op_timeout`, which takes the node down (a degraded write, a
/// fall-back, a node down, an error).
#[test]
fn pcache_polled_model_requests_to_both_nodes_at_once_all_complete() {
    let mut f = fabric_on(true);
    let pages = 64;
    let t0 = Instant::now();
    let mut pc = f.attach(
        &[0, 1],
        Config {
            readahead: 4,
            ..cfg(pages, 16, 2)
        },
    );
    let mut mmu = SoftMmu::new(pages);
    for kind in [Kind::Gups, Kind::Seq] {
        let want = local(kind, pages as usize * 512, 11);
        let mut r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
        assert_eq!(workload::run(kind, &mut r, 11, 0), Ok(want), "{kind:?}");
        assert_eq!(r.error, None);
    }
    let c = *pc.counters();
    eprintln!("{c:?} in {:?}", t0.elapsed());
    assert!(c.writebacks > 0 && c.readahead > 0, "{c:?}");
    assert_eq!(
        (c.errors, c.fallbacks, c.degraded_writes),
        (0, 0, 0),
        "nothing waited for a doorbell: {c:?}"
    );
    for n in pc.nodes() {
        assert_eq!(n.down, None, "{n:?}");
        assert_eq!(n.inflight, 0);
        // Two nodes, two copies: each node takes every write-back.
        assert_eq!(n.stats.writes, c.writebacks, "{n:?}");
        assert!(n.stats.reads > 0, "{n:?}");
    }
    f.detach(pc, &mut mmu);
    // One copy, every page resident and written, then one flush: its
    // batches spread over both nodes, all in flight together; each page's
    // word where the placement puts it.
    let mut pc = f.attach(&[0, 1], cfg(pages, pages as usize, 1));
    let mut mmu = SoftMmu::new(pages);
    {
        let mut r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
        for p in 0..pages as usize {
            r.set(p * 512, 0x5eed_0000 + p as u64);
        }
    }
    assert_eq!(pc.flush(&mut f.cn.core, &mut mmu), Ok(pages as usize));
    let chunks: Vec<u64> = pc.nodes().map(|n| n.chunk.unwrap().addr).collect();
    for (i, n) in pc.nodes().enumerate() {
        assert_eq!((n.down, n.stats.writes), (None, pages / 2), "node {i}");
    }
    let word = |m: &[u8], off: usize| u64::from_le_bytes(m[off..off + 8].try_into().unwrap());
    for (i, chunk) in chunks.iter().enumerate() {
        let (base, mem) = f.mems[i].memory();
        for slot in 0..pages / 2 {
            let page = slot * 2 + i as u64;
            assert_eq!(
                word(&mem, (chunk - base) as usize + slot as usize * 4096),
                0x5eed_0000 + page,
                "page {page} on node {i}"
            );
        }
    }
    f.detach(pc, &mut mmu);
    eprintln!("both regions in {:?}", t0.elapsed());
    f.finish();
}

/// A region whose accesses pull a cable (`port`) after `after` of them.
struct PullAfter<'a, 'b> {
    r: SoftRegion<'a>,
    wire: &'b Wire,
    port: sim::fabric::PortId,
    n: u64,
    after: u64,
}

impl Words for PullAfter<'_, '_> {
    fn len(&self) -> usize {
        self.r.len()
    }
    fn get(&mut self, i: usize) -> u64 {
        self.tick();
        self.r.get(i)
    }
    fn set(&mut self, i: usize, v: u64) {
        self.tick();
        self.r.set(i, v)
    }
    fn failed(&self) -> bool {
        self.r.failed()
    }
}

impl PullAfter<'_, '_> {
    fn tick(&mut self) {
        self.n += 1;
        if self.n == self.after {
            self.wire
                .fabric()
                .lock()
                .unwrap()
                .unplug(self.port)
                .expect("unplugged");
        }
    }
}

#[test]
fn pcache_two_copies_lose_nothing_when_a_memory_nodes_cable_is_pulled() {
    let mut f = fabric();
    let pages = 64;
    let mut pc = f.attach(&[0, 1], cfg(pages, 16, 2));
    let mut mmu = SoftMmu::new(pages);
    for kind in [Kind::Gups, Kind::Seq] {
        let want = local(kind, pages as usize * 512, 5);
        // GUPS: the cable goes in the middle of the updates (after the
        // fill has put every page on both nodes); then a whole seq run
        // on the survivor alone.
        let got = {
            let r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
            let mut w = PullAfter {
                r,
                wire: &f.wire,
                port: f.mem_ports[1],
                n: 0,
                after: if kind == Kind::Gups {
                    32768 + 300
                } else {
                    u64::MAX
                },
            };
            let got = workload::run(kind, &mut w, 5, 0);
            assert_eq!(w.r.error, None);
            got
        };
        assert_eq!(got, Ok(want), "{kind:?}: nothing lost");
    }
    let c = *pc.counters();
    eprintln!("{c:?}");
    assert!(c.fallbacks > 0, "reads fell back to the replica: {c:?}");
    assert!(c.degraded_writes > 0, "writes went to one copy: {c:?}");
    assert_eq!(c.errors, 0);
    let nodes: Vec<_> = pc.nodes().map(|n| n.down).collect();
    assert_eq!(nodes[0], None);
    assert!(
        matches!(nodes[1], Some(rmem::Error::Unreachable(_))),
        "{:?}",
        nodes[1]
    );
    f.detach(pc, &mut mmu);
    f.finish();
}

#[test]
fn pcache_without_copies_a_pulled_cable_fails_the_workload_with_a_clear_error() {
    let mut f = fabric();
    let pages = 64;
    let mut pc = f.attach(&[0, 1], cfg(pages, 16, 1));
    let mut mmu = SoftMmu::new(pages);
    let (got, err) = {
        let r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
        let mut w = PullAfter {
            r,
            wire: &f.wire,
            port: f.mem_ports[1],
            n: 0,
            after: 32768 + 300,
        };
        let got = workload::run(Kind::Gups, &mut w, 5, 0);
        (got, w.r.error.clone())
    };
    assert_eq!(got, Err(workload::Aborted));
    let e = err.expect("the fault's error");
    assert!(!e.write_back || e.page % 2 == 1);
    match &e.cause {
        Cause::Node { node, label, error } => {
            assert_eq!((*node, label.as_str()), (1, "LID 3"));
            assert!(matches!(error, rmem::Error::Unreachable(_)), "{error:?}");
        }
        c => panic!("{c:?}"),
    }
    assert_eq!(e.page % 2, 1, "an odd page: node 1's");
    let msg = e.to_string();
    assert!(
        msg.contains("memory node 1 (LID 3)")
            && msg.contains("transport retry counter exceeded")
            && msg.contains("IB_WC_RETRY_EXC_ERR"),
        "{msg}"
    );
    assert_eq!(pc.failed(), Some(&e), "the region is failed from then on");
    let t0 = f.cn.core.clock().now_ns();
    assert_eq!(pc.fault(&mut f.cn.core, &mut mmu, 0, t0), Err(e));
    f.detach(pc, &mut mmu);
    // Another region on the node still up works.
    let mut pc = f.attach(&[0], cfg(16, 4, 1));
    let mut mmu = SoftMmu::new(16);
    let want = local(Kind::Sort, 16 * 512, 3);
    {
        let mut r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
        assert_eq!(workload::run(Kind::Sort, &mut r, 3, 0), Ok(want));
    }
    f.detach(pc, &mut mmu);
    f.finish();
}

#[test]
fn pcache_attach_refuses_what_makes_no_sense() {
    let mut f = fabric();
    let nodes = f.connect(&[0]);
    let (e, back) = Pcache::attach(&mut f.cn.core, f.cn.dev, nodes, cfg(8, 2, 2)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "replicas must be 1 to the number of memory nodes"
    );
    let (e, back) = Pcache::attach(&mut f.cn.core, f.cn.dev, back, cfg(1 << 20, 2, 1)).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("memory node LID 2 cannot hold its part: memory node refused the request"),
        "{e}"
    );
    for m in back {
        m.client.close(&mut f.cn.core).unwrap();
    }
    f.finish();
}

/// The fault path's cost on the host model, for callgrind (release build:
/// `cargo test --release -p tests --test pcache_model -- --ignored
/// --nocapture pcache_fault_path_cost`, then `valgrind --tool=callgrind
/// --toggle-collect='pcache::region::Pcache::fault*' target/release/deps/pcache_model-*
/// --ignored pcache_fault_path_cost --test-threads 1`): every page written
/// and flushed, then 2000 reads of random pages with a quarter of them
/// cached, every miss a READ of a clean page (docs/pcache.md).
#[test]
#[ignore]
fn pcache_fault_path_cost_on_the_model() {
    let mut f = fabric();
    let pages = 64;
    let mut pc = f.attach(&[0], cfg(pages, 16, 1));
    let mut mmu = SoftMmu::new(pages);
    {
        let mut r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
        for p in 0..pages as usize {
            r.set(p * 512, p as u64);
        }
    }
    pc.flush(&mut f.cn.core, &mut mmu).expect("flushed");
    pc.reset_stats();
    let mut rng = workload::Rng::new(7);
    {
        let mut r = SoftRegion::new(&mut pc, &mut f.cn.core, &mut mmu);
        for _ in 0..2000 {
            let p = rng.below(pages) as usize;
            assert_eq!(r.get(p * 512), p as u64);
        }
    }
    let c = *pc.counters();
    println!(
        "faults {} (majors {}), evictions {}, writebacks {}",
        c.pgfault, c.pgmajfault, c.evictions, c.writebacks
    );
    f.detach(pc, &mut mmu);
    f.finish();
}
