//! rmem through the subnet manager.
//!
//! `Client::connect` (what `rmem connect LID` runs) asks the SA for the path to the
//! memory node's LID and connects through the CM, on a model fabric whose embedded
//! SM assigned the LIDs and brought the ports to Active (no test shortcut touches a
//! port). A memory node that starts serving late is waited for (connect attempts
//! repeated, counted as `retries`); a LID nobody holds fails with a clear error
//! within `connect_timeout`. Each node is a model HCA with the real mlx4_core +
//! mlx4_ib + ib_core.

use tests::mlx4_common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ib_core::verbs::PortState;
use ib_core::{DeviceId, IbCore};
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;
use rmem::server::ServerStats;
use rmem::{Client, ClientConfig, Error, Server, ServerConfig};
use sim::fabric::{Fabric, SmConfig, Topology};
use sim::{SimConfig, SimHca, Wire};

struct Node {
    hca: Model,
    core: IbCore,
    dev: DeviceId,
}

fn node(hca: SimHca) -> Node {
    let clock = hca.clock();
    let hca = Model::wrap(hca, "on the SM-run fabric");
    let d = bring_up(&hca, Profile::default()).expect("mlx4_core");
    let ib = Mlx4IbDev::add(d, "mlx4_0").expect("mlx4_ib_add");
    let mut core = IbCore::new(clock);
    let dev = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    Node { hca, core, dev }
}

impl Node {
    fn port(&mut self) -> (PortState, u16) {
        let a = self
            .core
            .device_mut(self.dev)
            .expect("device")
            .query_port(1)
            .expect("query_port");
        (a.state, a.lid)
    }

    fn teardown(mut self) {
        let mut p = self.core.unregister_device(self.dev).expect("unregistered");
        let ib = p
            .as_any_mut()
            .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
            .expect("mlx4_ib");
        assert_eq!(ib.live_objects(), [0; 7], "rmem freed what it made");
        ib.remove();
        drop(p);
        self.hca.finish();
    }
}

/// Two HCAs on a switch with the fabric's embedded SM on the next port;
/// returns them once the SM has made both ports Active.
type SharedFabric = Arc<Mutex<Fabric>>;

/// Steps the fabric (and its SM: sweeps, SA answers) to the model's now.
fn advance(f: &SharedFabric, clock: &dyn hal::Clock) {
    f.lock()
        .unwrap_or_else(|e| e.into_inner())
        .advance(clock.now_ns());
}

fn subnet() -> (Node, Node, SharedFabric, Wire) {
    init_logger();
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2).unwrap().build(&mut f).unwrap();
    f.add_sm_on_free_port(SmConfig::default())
        .expect("SM on the switch");
    let fabric = Arc::new(Mutex::new(f));
    let w = Wire::over(fabric.clone(), SimConfig::default().relax_step);
    let mut it = built.hcas.iter().map(|h| {
        node(SimHca::new_on_ports(
            SimConfig {
                node_guid: h.node_guid,
                ..SimConfig::default()
            },
            &w,
            [Some(h.ports[0]), Some(h.ports[1])],
        ))
    });
    let (mut m, mut c) = (it.next().unwrap(), it.next().unwrap());
    let t = Instant::now();
    let t_model = m.hca.clock().now_ns();
    let mut n = 0u64;
    loop {
        m.core.poll();
        c.core.poll();
        advance(&fabric, m.core.clock());
        n += 1;
        if n.is_multiple_of(64)
            && m.port().0 == PortState::Active
            && c.port().0 == PortState::Active
        {
            break;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let log = fabric
                .lock()
                .map(|f| f.sm().map(|s| s.log().join("\n")).unwrap_or_default())
                .unwrap_or_default();
            panic!(
                "the embedded SM did not bring both ports to Active: {:?} {:?}\n{log}",
                m.port(),
                c.port()
            );
        }
        // The model's clock kept up with the wall clock: the SM's sweeps
        // (a light one every 10 s, retries of silent ports) come in time.
        let clock = m.hca.clock();
        let wall = t.elapsed().as_nanos() as u64;
        let now = clock.now_ns().saturating_sub(t_model);
        if wall > now {
            clock.delay(Duration::from_nanos(wall - now));
        } else {
            clock.relax();
        }
    }
    (m, c, fabric, w)
}

/// The memory node in its own thread: its core polled all along (the CM
/// answers, the SM's SMPs are answered), the region exported only once
/// `export_at` (model-clock ns, 0 = not yet) has passed.
struct MemNode {
    stop: Arc<AtomicBool>,
    export_at: Arc<AtomicU64>,
    thread: Option<thread::JoinHandle<(Node, Option<Server>)>>,
    /// The server's statistics when the thread ended.
    stats: Arc<Mutex<Option<ServerStats>>>,
}

fn mem_node(n: Node, fabric: SharedFabric) -> MemNode {
    mem_node_deaf(n, fabric, Duration::ZERO)
}

/// A memory node that, after accepting its first connection, stops
/// serving RPCs for `deaf` (model time; the CM and the rest of ib_core
/// still progress): the compute node's HELLO goes unanswered.
fn mem_node_deaf(mut n: Node, fabric: SharedFabric, deaf: Duration) -> MemNode {
    let stop = Arc::new(AtomicBool::new(false));
    let export_at = Arc::new(AtomicU64::new(0));
    let stats = Arc::new(Mutex::new(None));
    let (s2, e2, st2) = (stop.clone(), export_at.clone(), stats.clone());
    let thread = thread::spawn(move || {
        let mut deaf_until = None;
        let cm = ib_core::cm::init(&mut n.core);
        let mut srv: Option<Server> = None;
        let t0 = Instant::now();
        let clock = n.hca.clock();
        let t_model = clock.now_ns();
        while !s2.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(120) {
            n.core.poll();
            // The model's clock (shared by every node) keeps up with the
            // wall clock, so the compute node's deadlines are wall time.
            let wall = t0.elapsed().as_nanos() as u64;
            let now = clock.now_ns().saturating_sub(t_model);
            if wall > now {
                clock.delay(Duration::from_nanos(wall - now));
            }
            advance(&fabric, n.core.clock());
            let at = e2.load(Ordering::Relaxed);
            if srv.is_none() && at != 0 && n.core.clock().now_ns() >= at {
                srv = Some(
                    Server::export(&mut n.core, cm, n.dev, 1 << 20, ServerConfig::default())
                        .expect("exported"),
                );
            }
            let now = n.core.clock().now_ns();
            if let Some(s) = srv.as_mut() {
                if !deaf.is_zero() && deaf_until.is_none() && s.stats().connects == 1 {
                    deaf_until = Some(now + deaf.as_nanos() as u64);
                }
                if deaf_until.is_none_or(|t| now >= t) {
                    s.poll(&mut n.core).expect("served");
                }
            }
            thread::yield_now();
        }
        *st2.lock().unwrap() = srv.as_ref().map(|s| s.stats());
        (n, srv)
    });
    MemNode {
        stop,
        export_at,
        thread: Some(thread),
        stats,
    }
}

impl MemNode {
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

#[test]
fn rmem_connect_asks_the_sa_for_the_path_and_waits_for_a_late_memory_node() {
    let (mut m, mut cn, fabric, _w) = subnet();
    let (_, mem_lid) = m.port();
    let (_, my_lid) = cn.port();
    assert!(mem_lid != 0 && my_lid != 0 && mem_lid != my_lid);
    let clock = cn.hca.clock();
    let mem = mem_node(m, fabric);
    let sa = ib_core::sa_query::init(&mut cn.core);
    let cm = ib_core::cm::init(&mut cn.core);
    let cfg = ClientConfig {
        connect_timeout: Duration::from_secs(30),
        ..ClientConfig::default()
    };

    // The memory node exports one second (model time) from now: the
    // first attempts find nothing listening and are made again.
    mem.export_at
        .store(clock.now_ns() + 1_000_000_000, Ordering::Relaxed);
    let r = Client::connect(&mut cn.core, cm, sa, cn.dev, mem_lid, cfg);
    let mut c = r.expect("connected through the SA's path and the CM");
    assert!(
        c.stats().retries >= 1,
        "the first attempts failed and were counted"
    );
    let r = c.region();
    assert_eq!(r.len, 1 << 20);
    let ch = c.alloc(&mut cn.core, 3 * 4096).unwrap();
    let data: Vec<u8> = (0..3 * 4096u64)
        .map(|i| (i ^ (i >> 8) ^ 0x5a) as u8)
        .collect();
    c.write(&mut cn.core, ch.addr + 1, &data[1..]).unwrap();
    let mut back = vec![0u8; data.len() - 1];
    c.read(&mut cn.core, ch.addr + 1, &mut back).unwrap();
    assert_eq!(back, data[1..]);
    c.free(&mut cn.core, ch).unwrap();
    c.close(&mut cn.core).expect("closed");

    // A LID nobody holds: the SA has no path; tried again until the
    // deadline, then a clear error.
    let t0 = clock.now_ns();
    let short = ClientConfig {
        connect_timeout: Duration::from_secs(2),
        ..cfg
    };
    let e = Client::connect(&mut cn.core, cm, sa, cn.dev, 0x99, short).unwrap_err();
    assert!(matches!(e, Error::Connect(_)), "{e}");
    assert!(
        format!("{e}").starts_with("cannot connect to the memory node: "),
        "{e}"
    );
    let took = Duration::from_nanos(clock.now_ns() - t0);
    assert!(took < Duration::from_secs(4), "gave up after {took:?}");

    mem.finish().teardown();
    cn.teardown();
}

#[test]
fn rmem_connect_says_hello_again_when_the_first_hello_goes_unanswered() {
    let (mut m, mut cn, fabric, _w) = subnet();
    let (_, mem_lid) = m.port();
    let clock = cn.hca.clock();
    // Accepts the first connection, then answers nothing for 2 s: the
    // compute node's HELLO times out (op_timeout 500 ms).
    let mem = mem_node_deaf(m, fabric, Duration::from_secs(2));
    let sa = ib_core::sa_query::init(&mut cn.core);
    let cm = ib_core::cm::init(&mut cn.core);
    let cfg = ClientConfig {
        connect_timeout: Duration::from_secs(30),
        op_timeout: Duration::from_millis(500),
        ..ClientConfig::default()
    };
    mem.export_at.store(clock.now_ns(), Ordering::Relaxed);
    let mut c = Client::connect(&mut cn.core, cm, sa, cn.dev, mem_lid, cfg)
        .expect("connected after the unanswered HELLO");
    assert!(c.stats().retries >= 1, "the unanswered HELLO was a retry");
    assert_eq!(c.stats().errors, 0, "and not an error: {:?}", c.stats());
    assert_eq!(c.region().len, 1 << 20);
    let ch = c.alloc(&mut cn.core, 4096).unwrap();
    c.write(&mut cn.core, ch.addr, &[0x5a; 4096]).unwrap();
    let mut back = [0u8; 4096];
    c.read(&mut cn.core, ch.addr, &mut back).unwrap();
    assert_eq!(back, [0x5a; 4096]);
    c.close(&mut cn.core).expect("closed");
    let stats = mem.stats.clone();
    mem.finish().teardown();
    let s = stats.lock().unwrap().expect("the memory node exported");
    // One compute node got its region: the HELLO it gave up on counts
    // neither as served nor twice.
    assert_eq!(s.hellos, 1, "{s:?}");
    assert!(s.connects >= 2, "{s:?}");
    cn.teardown();
}
