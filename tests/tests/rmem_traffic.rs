//! Model-backed rmem traffic between a memory node and compute nodes.
//!
//! Model-backed rmem traffic: a memory node and compute nodes, each its own model
//! HCA with the real mlx4_core + mlx4_ib + ib_core stack, cabled on one model
//! fabric, the model's engines executing the RDMA: RPC alloc/free (and a malformed
//! RPC answered with an error), a pattern written and read back with the data
//! checked, two compute nodes sharing one memory node without interference, an
//! out-of-bounds access refused by the card (remote access error CQE), a pulled
//! cable and a gone memory node ending in "transport retry counter exceeded" within
//! the deadline. Most connections are made without the CM
//! (`accept_peer`/`connect_peer`); one test connects through the CM listener with a
//! hand-built path (no SA on these wires).

use tests::mlx4_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ib_core::verbs::WcStatus;
use ib_core::{DeviceId, IbCore};
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;
use rmem::conn::Peer;
use rmem::{Client, ClientConfig, Error, Server, ServerConfig};
use sim::{SimConfig, SimHca, Wire};

struct Node {
    hca: Model,
    core: IbCore,
    dev: DeviceId,
}

fn node(hca: SimHca) -> Node {
    let clock = hca.clock();
    node_with(hca, clock)
}

/// Host time, for the benchmark (the model keeps its own fake clock).
struct WallClock(Instant);

impl hal::Clock for WallClock {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

fn node_with(hca: SimHca, clock: Arc<dyn hal::Clock>) -> Node {
    // The fixture checks the harness invariants when the node goes away.
    let hca = Model::wrap(hca, "on a wire");
    let d = bring_up(&hca, Profile::default()).expect("mlx4_core");
    let ib = Mlx4IbDev::add(d, "mlx4_0").expect("mlx4_ib_add");
    let mut core = IbCore::new(clock);
    let dev = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    Node { hca, core, dev }
}

fn activate(w: &Wire, nodes: &[(&SimHca, u16)]) {
    w.settle();
    for (h, lid) in nodes {
        assert!(
            tests::sm::sm_activate(h, 1, *lid, 1),
            "port 1 of LID {lid} active"
        );
    }
}

fn teardown(mut n: Node) {
    let mut p = n.core.unregister_device(n.dev).expect("unregistered");
    let ib = p
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
        .expect("mlx4_ib");
    assert_eq!(ib.live_objects(), [0; 7], "rmem freed what it made");
    ib.remove();
    drop(p);
    assert_eq!(n.hca.icm_mapped_pages(), 0);
    let v = n.hca.violations();
    assert!(v.is_empty(), "{v:#?}");
}

/// The memory node, served from its own thread (its core polled there).
struct MemNode {
    stop: Arc<AtomicBool>,
    req: mpsc::Sender<Req>,
    thread: Option<thread::JoinHandle<(Node, Option<Server>)>>,
}

enum Req {
    Accept(Peer, mpsc::Sender<rmem::Result<Peer>>),
    Close(mpsc::Sender<()>),
    Stats(mpsc::Sender<(rmem::ServerStats, u64, Vec<u8>)>),
}

const REGION: u64 = 256 * 1024;

fn mem_node(n: Node) -> MemNode {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<Req>();
    let s2 = stop.clone();
    let thread = thread::spawn(move || {
        let mut n = n;
        let cm = ib_core::cm::init(&mut n.core);
        let mut srv = Some(
            Server::export(&mut n.core, cm, n.dev, REGION, ServerConfig::default())
                .expect("exported"),
        );
        let end = Instant::now() + Duration::from_secs(120);
        while !s2.load(Ordering::Relaxed) && Instant::now() < end {
            n.core.poll();
            if let Some(s) = srv.as_mut() {
                s.poll(&mut n.core).expect("served");
            }
            while let Ok(r) = rx.try_recv() {
                match r {
                    Req::Accept(p, back) => {
                        let r = match srv.as_mut() {
                            Some(s) => s.accept_peer(&mut n.core, p),
                            None => Err(Error::Broken),
                        };
                        let _ = back.send(r);
                    }
                    Req::Close(back) => {
                        if let Some(s) = srv.take() {
                            s.close(&mut n.core).expect("closed");
                        }
                        let _ = back.send(());
                    }
                    Req::Stats(back) => {
                        if let Some(s) = srv.as_ref() {
                            let mut mem = vec![0u8; REGION as usize];
                            s.memory().read_bytes(0, &mut mem);
                            let _ = back.send((s.stats(), s.used_bytes(), mem));
                        }
                    }
                }
            }
            std::thread::yield_now();
        }
        (n, srv)
    });
    MemNode {
        stop,
        req: tx,
        thread: Some(thread),
    }
}

impl MemNode {
    fn accept(&self, p: Peer) -> Peer {
        let (tx, rx) = mpsc::channel();
        self.req.send(Req::Accept(p, tx)).unwrap();
        rx.recv_timeout(Duration::from_secs(30))
            .expect("memory node answers")
            .expect("accepted")
    }
    fn stats(&self) -> (rmem::ServerStats, u64, Vec<u8>) {
        let (tx, rx) = mpsc::channel();
        self.req.send(Req::Stats(tx)).unwrap();
        rx.recv_timeout(Duration::from_secs(30)).expect("stats")
    }
    fn close_server(&self) {
        let (tx, rx) = mpsc::channel();
        self.req.send(Req::Close(tx)).unwrap();
        rx.recv_timeout(Duration::from_secs(30)).expect("closed");
    }
    fn finish(mut self) -> Node {
        self.stop.store(true, Ordering::Relaxed);
        let (mut n, srv) = self
            .thread
            .take()
            .unwrap()
            .join()
            .expect("memory node thread");
        if let Some(s) = srv {
            s.close(&mut n.core).expect("closed");
        }
        n
    }
}

fn connect(n: &mut Node, mem: &MemNode, mem_lid: u16, cfg: ClientConfig) -> Client {
    let c = Client::create(&mut n.core, n.dev, cfg).expect("client");
    let my_lid = n.core.device_mut(n.dev).unwrap().query_port(1).unwrap().lid;
    let theirs = mem.accept(Peer {
        lid: my_lid,
        qpn: c.qpn(),
        psn: c.sq_psn(),
    });
    assert_eq!(theirs.lid, mem_lid);
    c.connect_peer(&mut n.core, theirs)
        .expect("connected and said hello")
}

fn pattern(a: u64, salt: u8) -> u8 {
    (a ^ (a >> 8) ^ (a >> 16)) as u8 ^ salt
}

fn cfg() -> ClientConfig {
    ClientConfig {
        window: 8,
        op_timeout: Duration::from_secs(5),
        // 4.096 us * 2^12 = 16.8 ms per try, 4 tries: a gone node is
        // noticed in ~67 ms of model time.
        ack_timeout: 12,
        retry_count: 3,
        ..ClientConfig::default()
    }
}

fn pair() -> (MemNode, Node, Wire) {
    let (a, b, w) = SimHca::back_to_back(SimConfig::default(), SimConfig::default());
    init_logger();
    let (m, c) = (node(a), node(b));
    activate(&w, &[(&m.hca, 1), (&c.hca, 2)]);
    (mem_node(m), c, w)
}

#[test]
fn rmem_rpc_alloc_free_and_pattern_read_back() {
    let (mem, mut cn, _w) = pair();
    let mut c = connect(&mut cn, &mem, 1, cfg());
    let r = c.region();
    assert_eq!((r.base, r.len), (ServerConfig::default().iova, REGION));
    // Alloc rounds to pages; the chunk lies in the region.
    let a = c.alloc(&mut cn.core, 10_000).expect("alloc");
    assert_eq!((a.addr, a.len), (r.base, 12 * 1024));
    let b = c.alloc(&mut cn.core, 4096).expect("alloc 2");
    assert_eq!(b.addr, r.base + 12 * 1024);
    assert_eq!(
        c.alloc(&mut cn.core, REGION).unwrap_err(),
        Error::Rpc(rmem::proto::Status::NoSpace)
    );
    // Byte-granular write and read back (unaligned, across pages).
    let data: Vec<u8> = (0..5000u64)
        .map(|i| pattern(a.addr + 3 + i, 0x11))
        .collect();
    c.write(&mut cn.core, a.addr + 3, &data).expect("write");
    let mut back = vec![0u8; 5000];
    c.read(&mut cn.core, a.addr + 3, &mut back).expect("read");
    assert_eq!(back, data);
    // Page-granular, several in flight.
    let pages: Vec<u8> = (0..3 * 4096u64)
        .map(|i| pattern(a.addr + i, 0x22))
        .collect();
    c.write(&mut cn.core, a.addr, &pages)
        .expect("pages written");
    let mut back = vec![0u8; 3 * 4096];
    c.read(&mut cn.core, a.addr, &mut back).expect("pages read");
    assert_eq!(back, pages);
    // The memory node's own view holds the same bytes.
    let (st, used, mem_bytes) = mem.stats();
    assert_eq!(&mem_bytes[..3 * 4096], &pages[..]);
    assert_eq!(used, 16 * 1024);
    assert!(st.rpcs >= 3, "{st:?}");
    let s = c.stats();
    assert_eq!(
        (s.reads, s.writes),
        (2 + 3, 2 + 3),
        "5000 B = 2 pieces, 3 pages"
    );
    assert_eq!(s.bytes_read, 5000 + 3 * 4096);
    // Free: twice is refused; the space is reused.
    c.free(&mut cn.core, a).expect("free");
    assert_eq!(
        c.free(&mut cn.core, a).unwrap_err(),
        Error::Rpc(rmem::proto::Status::NotOwner)
    );
    assert_eq!(c.alloc(&mut cn.core, 8192).expect("reuse").addr, r.base);
    c.close(&mut cn.core).expect("closed");
    teardown(mem.finish());
    teardown(cn);
}

#[test]
fn rmem_out_of_bounds_is_refused_by_the_card() {
    let (mem, mut cn, _w) = pair();
    let mut c = connect(&mut cn, &mem, 1, cfg());
    let r = c.region();
    let t = c
        .read_async(&mut cn.core, r.base + r.len - 100, 4096)
        .expect("posted: the client does not check, the card does");
    let mut got = None;
    let start = Instant::now();
    while got.is_none() && start.elapsed() < Duration::from_secs(30) {
        cn.core.poll();
        c.poll(&mut cn.core, |d| got = Some(*d)).expect("polled");
    }
    let d = got.expect("a completion within the deadline");
    assert_eq!(d.token, t);
    assert_eq!(
        d.result,
        Err(Error::RemoteAccess {
            addr: r.base + r.len - 100,
            len: 4096
        })
    );
    let msg = format!("{}", d.result.unwrap_err());
    assert!(msg.starts_with("remote access error"), "{msg}");
    assert_eq!(c.stats().errors, 1);
    // The connection is in error now: later calls say so at once.
    assert_eq!(
        c.read_async(&mut cn.core, r.base, 8).unwrap_err(),
        Error::Broken
    );
    let _ = WcStatus::RemAccessErr;
    c.close(&mut cn.core).expect("closed");
    teardown(mem.finish());
    teardown(cn);
}

#[test]
fn rmem_cable_pulled_ends_in_retry_exceeded_within_the_deadline() {
    let (mem, mut cn, w) = pair();
    let mut c = connect(&mut cn, &mem, 1, cfg());
    let r = c.region();
    c.write(&mut cn.core, r.base, &[1u8; 64])
        .expect("works before");
    let port = cn.hca.fabric_port(1).expect("on the fabric");
    w.fabric().lock().unwrap().unplug(port).expect("unplugged");
    let t0 = Instant::now();
    let e = c.read(&mut cn.core, r.base, &mut [0u8; 4096]).unwrap_err();
    assert_eq!(e, Error::Unreachable(WcStatus::RetryExcErr), "{e}");
    assert!(
        format!("{e}").contains("transport retry counter exceeded"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(30));
    c.close(&mut cn.core).expect("closed");
    teardown(mem.finish());
    teardown(cn);
}

#[test]
fn rmem_memory_node_gone_ends_in_retry_exceeded() {
    let (mem, mut cn, _w) = pair();
    let mut c = connect(&mut cn, &mem, 1, cfg());
    let r = c.region();
    mem.close_server();
    let e = c.read(&mut cn.core, r.base, &mut [0u8; 128]).unwrap_err();
    assert!(matches!(e, Error::Unreachable(_)), "{e}");
    c.close(&mut cn.core).expect("closed");
    teardown(mem.finish());
    teardown(cn);
}

#[test]
fn rmem_two_compute_nodes_share_one_memory_node() {
    let (a, b, w) = SimHca::back_to_back(SimConfig::default(), SimConfig::default());
    init_logger();
    let (m, cn) = (node(a), node(b));
    activate(&w, &[(&m.hca, 1), (&cn.hca, 2)]);
    let mem = mem_node(m);
    // Two compute nodes' connections (two QPs of the compute HCA, each
    // its own client and owner on the memory node).
    let cn = Arc::new(Mutex::new(cn));
    let mut g = cn.lock().unwrap();
    let mut c1 = connect(&mut g, &mem, 1, cfg());
    let mut c2 = connect(&mut g, &mem, 1, cfg());
    let x1 = c1.alloc(&mut g.core, 8192).unwrap();
    let x2 = c2.alloc(&mut g.core, 8192).unwrap();
    assert_ne!(x1.addr, x2.addr);
    // A client cannot free another's chunk.
    assert_eq!(
        c2.free(&mut g.core, x1).unwrap_err(),
        Error::Rpc(rmem::proto::Status::NotOwner)
    );
    let d1: Vec<u8> = (0..8192u64).map(|i| pattern(x1.addr + i, 1)).collect();
    let d2: Vec<u8> = (0..8192u64).map(|i| pattern(x2.addr + i, 2)).collect();
    // Interleaved, several in flight on both.
    for k in 0..2u64 {
        let o = (k * 4096) as usize;
        c1.write_async(&mut g.core, x1.addr + k * 4096, &d1[o..o + 4096])
            .unwrap();
        c2.write_async(&mut g.core, x2.addr + k * 4096, &d2[o..o + 4096])
            .unwrap();
    }
    let core = &mut g.core;
    c1.drain(core, |d| assert!(d.result.is_ok(), "{d:?}"))
        .unwrap();
    c2.drain(core, |d| assert!(d.result.is_ok(), "{d:?}"))
        .unwrap();
    let mut b1 = vec![0u8; 8192];
    let mut b2 = vec![0u8; 8192];
    c1.read(core, x1.addr, &mut b1).unwrap();
    c2.read(core, x2.addr, &mut b2).unwrap();
    assert_eq!(b1, d1, "client 1 reads its own data");
    assert_eq!(b2, d2, "client 2 reads its own data");
    let (st, used, _) = mem.stats();
    assert_eq!(st.connects, 2);
    assert_eq!(used, 16384);
    c1.close(core).unwrap();
    c2.close(core).unwrap();
    drop(g);
    teardown(mem.finish());
    teardown(Arc::try_unwrap(cn).ok().unwrap().into_inner().unwrap());
}

/// Page-fetch figures on the host model (release build:
/// `cargo test --release -p tests --test rmem_traffic -- --ignored --nocapture
/// rmem_bench`). The compute node's core runs on host time, so the
/// latencies printed are what the host spends per fetch in the stack and
/// the synchronous model together (the model executes the READ inside the
/// doorbell write).
#[test]
#[ignore]
fn rmem_bench_page_fetch_on_the_model() {
    let (a, b, w) = SimHca::back_to_back(SimConfig::default(), SimConfig::default());
    init_logger();
    let m = node(a);
    let mut cn = node_with(b, Arc::new(WallClock(Instant::now())));
    activate(&w, &[(&m.hca, 1), (&cn.hca, 2)]);
    let mem = mem_node(m);
    let mut c = connect(
        &mut cn,
        &mem,
        1,
        ClientConfig {
            window: 16,
            ..cfg()
        },
    );
    for (pattern, window) in [
        (rmem::bench::Pattern::Random, 1),
        (rmem::bench::Pattern::Random, 16),
        (rmem::bench::Pattern::Sequential, 16),
    ] {
        let bc = rmem::bench::BenchConfig {
            pages: 32,
            iters: 5000,
            window,
            pattern,
        };
        let r = rmem::bench::run(&mut cn.core, &mut c, bc).expect("bench");
        let mut s = String::new();
        r.write_report(&mut s).unwrap();
        print!("{s}");
        let mut csv = String::new();
        r.write_csv(&mut csv).unwrap();
        print!("{}\n{csv}", rmem::bench::BenchResult::CSV_HEADER);
    }
    c.close(&mut cn.core).expect("closed");
    teardown(mem.finish());
    teardown(cn);
}

/// Three HCAs behind a model switch (routed as a min-hop SM would): one
/// memory node, two compute nodes with their own stacks, interleaved
/// requests in flight on both, each reading back only its own data.
#[test]
fn rmem_two_compute_nodes_behind_a_switch() {
    // The `--nodes 3` topology: three HCAs on one switch, LID i+1 behind
    // switch port i+1 (the switch's LFT set as its SM stand-in does).
    let mut f = sim::fabric::Fabric::new();
    let built = sim::fabric::Topology::for_nodes(3)
        .unwrap()
        .build(&mut f)
        .unwrap();
    let shared = Arc::new(Mutex::new(f));
    let w = Wire::over(shared.clone(), SimConfig::default().relax_step);
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
    let mut it = hcas.into_iter();
    let (m, a, b) = (
        node(it.next().unwrap()),
        node(it.next().unwrap()),
        node(it.next().unwrap()),
    );
    activate(&w, &[(&m.hca, 1), (&a.hca, 2), (&b.hca, 3)]);
    // Set once the links are up (the switch makes its trained ports Active).
    shared
        .lock()
        .unwrap()
        .switch_mut(built.switches[0].1)
        .unwrap()
        .configure(0x10, &[(1, 1), (2, 2), (3, 3)]);
    let mem = mem_node(m);
    let (mut a, mut b) = (a, b);
    let mut c1 = connect(&mut a, &mem, 1, cfg());
    let mut c2 = connect(&mut b, &mem, 1, cfg());
    let x1 = c1.alloc(&mut a.core, 16384).unwrap();
    let x2 = c2.alloc(&mut b.core, 16384).unwrap();
    assert_ne!(x1.addr, x2.addr);
    assert_eq!(
        c1.free(&mut a.core, x2).unwrap_err(),
        Error::Rpc(rmem::proto::Status::NotOwner),
        "a node cannot free another's chunk"
    );
    let d1: Vec<u8> = (0..16384u64).map(|i| pattern(x1.addr + i, 0x31)).collect();
    let d2: Vec<u8> = (0..16384u64).map(|i| pattern(x2.addr + i, 0x32)).collect();
    for k in 0..4u64 {
        let o = (k * 4096) as usize;
        c1.write_async(&mut a.core, x1.addr + k * 4096, &d1[o..o + 4096])
            .unwrap();
        c2.write_async(&mut b.core, x2.addr + k * 4096, &d2[o..o + 4096])
            .unwrap();
    }
    c1.drain(&mut a.core, |d| assert!(d.result.is_ok(), "{d:?}"))
        .unwrap();
    c2.drain(&mut b.core, |d| assert!(d.result.is_ok(), "{d:?}"))
        .unwrap();
    let (mut b1, mut b2) = (vec![0u8; 16384], vec![0u8; 16384]);
    c1.read(&mut a.core, x1.addr, &mut b1).unwrap();
    c2.read(&mut b.core, x2.addr, &mut b2).unwrap();
    assert_eq!(b1, d1, "compute node 1 reads its own data");
    assert_eq!(b2, d2, "compute node 2 reads its own data");
    let (st, used, _) = mem.stats();
    assert_eq!((st.connects, used), (2, 32768));
    c1.close(&mut a.core).unwrap();
    c2.close(&mut b.core).unwrap();
    teardown(mem.finish());
    teardown(a);
    teardown(b);
}

/// A lost RTU: the compute node's HELLO reaches the memory node while its
/// side of the connection still waits for the RTU (QP in RTR). The first
/// request establishes the connection (`ib_cm_notify`, as Linux ULPs do on
/// COMM_EST), the QP goes to RTS and the reply is sent; the connection
/// then moves data. (Seen under QEMU with three guests, where the memory
/// node took the HELLO before it had processed the RTU and refused to
/// answer.)
#[test]
fn rmem_cm_request_before_the_rtu_establishes_the_connection() {
    let (a, b, w) = SimHca::back_to_back(SimConfig::default(), SimConfig::default());
    init_logger();
    let (m, mut cn) = (node(a), node(b));
    activate(&w, &[(&m.hca, 1), (&cn.hca, 2)]);
    let dgid = {
        let mut m = m;
        let g = m.core.device_mut(m.dev).unwrap().query_gid(1, 0).unwrap();
        (g, m)
    };
    let (dgid, m) = dgid;
    let mem = mem_node(m);
    let sgid = cn.core.device_mut(cn.dev).unwrap().query_gid(1, 0).unwrap();
    // The compute node's second CM MAD (REQ, then RTU) is lost.
    let port = cn.hca.fabric_port(1).expect("on the fabric");
    w.fabric().lock().unwrap().faults.add(
        sim::fabric::FaultRule::new(sim::fabric::FaultKind::Drop)
            .qpn(1)
            .port(port)
            .every(2)
            .times(1),
    );
    let path = ib_core::sa_query::PathRecord {
        dgid,
        sgid,
        dlid: 1,
        slid: 2,
        reversible: true,
        numb_path: 1,
        pkey: 0xffff,
        mtu: 3,
        rate: 3,
        packet_life_time: 14,
        ..Default::default()
    };
    let cm = ib_core::cm::init(&mut cn.core);
    let mut c = Client::connect_path(&mut cn.core, cm, cn.dev, path, cfg())
        .expect("HELLO answered although the RTU was lost");
    assert_eq!(
        w.fabric().lock().unwrap().faults.stats.dropped,
        1,
        "the RTU was dropped"
    );
    let ch = c.alloc(&mut cn.core, 8192).unwrap();
    let data: Vec<u8> = (0..8192u64).map(|i| pattern(ch.addr + i, 9)).collect();
    c.write(&mut cn.core, ch.addr, &data).unwrap();
    let mut back = vec![0u8; 8192];
    c.read(&mut cn.core, ch.addr, &mut back).unwrap();
    assert_eq!(back, data);
    c.close(&mut cn.core).expect("closed");
    let (st, _, _) = mem.stats();
    assert_eq!((st.connects, st.hellos, st.errors), (1, 1, 0));
    teardown(mem.finish());
    teardown(cn);
}

/// The CM path: the memory node listens on rmem's service ID, the compute
/// node connects with `Client::connect_path` (a path built by hand: no SA
/// on the back-to-back wire), says hello and moves data.
#[test]
fn rmem_cm_connect_through_the_listener() {
    let (a, b, w) = SimHca::back_to_back(SimConfig::default(), SimConfig::default());
    init_logger();
    let (m, mut cn) = (node(a), node(b));
    activate(&w, &[(&m.hca, 1), (&cn.hca, 2)]);
    let mem_gid = {
        let mut m = m;
        let g = m.core.device_mut(m.dev).unwrap().query_gid(1, 0).unwrap();
        (g, mem_node(m))
    };
    let (dgid, mem) = mem_gid;
    let d = cn.core.device_mut(cn.dev).unwrap();
    let sgid = d.query_gid(1, 0).unwrap();
    let path = ib_core::sa_query::PathRecord {
        dgid,
        sgid,
        dlid: 1,
        slid: 2,
        reversible: true,
        numb_path: 1,
        pkey: 0xffff,
        mtu: 3,  // 1024
        rate: 3, // 2.5 Gb/s
        packet_life_time: 14,
        hop_limit: 0,
        ..Default::default()
    };
    let cm = ib_core::cm::init(&mut cn.core);
    let mut c = Client::connect_path(&mut cn.core, cm, cn.dev, path, cfg())
        .expect("connected through the CM");
    let r = c.region();
    assert_eq!(r.len, REGION);
    let ch = c.alloc(&mut cn.core, 4096).unwrap();
    let data: Vec<u8> = (0..4096u64).map(|i| pattern(ch.addr + i, 7)).collect();
    c.write(&mut cn.core, ch.addr, &data).unwrap();
    let mut back = vec![0u8; 4096];
    c.read(&mut cn.core, ch.addr, &mut back).unwrap();
    assert_eq!(back, data);
    c.close(&mut cn.core).expect("closed (DREQ)");
    let (st, _, _) = mem.stats();
    assert_eq!(st.connects, 1);
    teardown(mem.finish());
    teardown(cn);
}
