//! Shared helpers of the subnet tests.
//!
//! Shared helpers of the subnet tests (`subnet_*.rs`): driver-run guests (a model
//! HCA in the [`Model`] fixture with the real mlx4_core + mlx4_ib + ib_core on it)
//! cabled to a model switch, an ib_core client recording port events, and the loops
//! that run the guests' progress functions while an SM works; no port is made
//! Active by a test shortcut.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ib_core::verbs::{Event, EventElement, EventType, PortAttr, PortState};
use ib_core::{ClientId, Device, DeviceId, IbClient, IbCore};
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;
use sim::SimHca;

use crate::mlx4_common::{Model, bring_up, init_logger};

/// Port events one guest's client saw, in order.
pub type EventLog = Arc<Mutex<Vec<(EventType, u8)>>>;

/// An ib_core client that records every port event (what a ULP such as
/// the SA client or IPoIB would react to).
pub struct PortEvents(pub EventLog);

impl IbClient for PortEvents {
    fn name(&self) -> &str {
        "subnet-test-events"
    }
    fn add(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn remove(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn event(&mut self, _me: ClientId, _dev: &mut Device, e: &Event) {
        if let EventElement::Port(p) = e.element
            && let Ok(mut l) = self.0.lock()
        {
            l.push((e.event, p));
        }
    }
}

/// One driver-run guest: its model, its ib_core with one mlx4 device.
pub struct Guest {
    pub name: String,
    pub hca: Model,
    pub core: IbCore,
    pub dev: DeviceId,
    pub events: EventLog,
    /// ib_core's SA client (Linux's `ib_sa` module, loaded with the core).
    pub sa: ClientId,
}

/// Brings the whole stack up on `hca` (probe, mlx4_ib add, ib_core
/// registration: QP0/QP1 open, which runs INIT_PORT, so the cable trains;
/// nothing else touches the port).
pub fn guest(hca: SimHca, name: &str) -> Guest {
    init_logger();
    let clock = hca.clock();
    let hca = Model::wrap(hca, "on the subnet fabric");
    let d = bring_up(&hca, Profile::default()).expect("mlx4_core probe");
    let ib = Mlx4IbDev::add(d, "mlx4_0").expect("mlx4_ib_add");
    let mut core = IbCore::new(clock);
    let events = EventLog::default();
    core.register_client(Box::new(PortEvents(events.clone())));
    let sa = ib_core::sa_query::init(&mut core);
    let dev = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("ib_register_device");
    Guest {
        name: name.to_string(),
        hca,
        core,
        dev,
        events,
        sa,
    }
}

impl Guest {
    /// ib_core's `query_port` (through mlx4_ib and MAD_IFC).
    pub fn port(&mut self, port: u8) -> PortAttr {
        self.core
            .device_mut(self.dev)
            .expect("device")
            .query_port(port)
            .expect("query_port")
    }

    /// Events seen so far.
    pub fn events(&self) -> Vec<(EventType, u8)> {
        self.events.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Whether port 1 is Active (driver's view).
    pub fn active(&mut self) -> bool {
        self.port(1).state == PortState::Active
    }

    /// The mlx4_ib device under ib_core.
    pub fn ib(&mut self) -> &mut Mlx4IbDev {
        self.core
            .device_mut(self.dev)
            .and_then(|d| d.provider_as::<Mlx4IbDev>())
            .expect("an mlx4_ib device")
    }

    /// Unregisters and removes the device (the fixture then checks the
    /// model's invariants).
    pub fn teardown(mut self) {
        let mut p = self
            .core
            .unregister_device(self.dev)
            .expect("ib_unregister_device");
        if let Some(ib) = p.as_any_mut().and_then(|a| a.downcast_mut::<Mlx4IbDev>()) {
            ib.remove();
        }
        drop(p);
        self.hca.finish();
    }
}

/// Model time a quiet round of [`pump_until`] moves the shared fake clock
/// on (a busy round moves it by one `relax`).
pub const IDLE_STEP: Duration = Duration::from_micros(500);

/// Runs every guest's progress function (and through it the synchronous
/// wire, the switch and the embedded SM on the shared fake clock) until
/// `done` holds or `limit` of wall time passes; returns whether it held.
/// `done` is asked every `every` rounds (it may cost MAD_IFC commands).
pub fn pump_until(
    guests: &mut [&mut Guest],
    limit: Duration,
    every: u64,
    mut done: impl FnMut(&mut [&mut Guest]) -> bool,
) -> bool {
    let t = Instant::now();
    let mut round = 0u64;
    loop {
        let mut work = 0;
        for g in guests.iter_mut() {
            work += g.core.poll();
        }
        round += 1;
        if round.is_multiple_of(every.max(1)) && done(guests) {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        if let Some(g) = guests.first() {
            if work == 0 {
                g.core.clock().delay(IDLE_STEP);
            } else {
                g.core.clock().relax();
            }
        }
    }
}

/// The model of guest HCA `h`: its node GUID from the topology, a system
/// image GUID of its own (node GUID + 3, as on a ConnectX-3; two guests are
/// two systems) and a host-style NodeDescription in the firmware ("node0
/// HCA-1", what OFED's init script or rdma-ndd would set on a Linux host),
/// which mlx4_ib reads at add time and answers SMPs with.
pub fn guest_config(h: &sim::fabric::topology::BuiltHca) -> sim::SimConfig {
    sim::SimConfig {
        node_guid: h.node_guid,
        sys_image_guid: h.node_guid + 3,
        node_description: format!("{} HCA-1", h.name),
        ..sim::SimConfig::default()
    }
}

/// Two synchronous guests on `fabric` (one fake clock, stepped together),
/// on the first two HCAs of `built`, brought up one after the other.
pub fn sync_guests(
    fabric: &Arc<Mutex<sim::fabric::Fabric>>,
    built: &sim::fabric::Built,
) -> (Guest, Guest) {
    let wire = sim::Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    let mut g = built.hcas.iter().take(2).map(|h| {
        let hca =
            SimHca::new_on_ports(guest_config(h), &wire, [Some(h.ports[0]), Some(h.ports[1])]);
        guest(hca, &h.name)
    });
    let a = g.next().expect("two HCAs in the topology");
    let b = g.next().expect("two HCAs in the topology");
    (a, b)
}

// --- the real OpenSM and the diags ----------------------------------------

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use sim::fabric::ibsim::{SmOptions, SmService, UMAD2SIM};

/// The Debian programs the OpenSM tests run.
pub const PEER_PROGRAMS: [&str; 6] = [
    "/usr/sbin/opensm",
    "/usr/sbin/ibnetdiscover",
    "/usr/sbin/perfquery",
    "/usr/sbin/saquery",
    "/usr/sbin/smpquery",
    UMAD2SIM,
];

/// Whether OpenSM, the diags and the preload are installed; if not, says
/// so loudly (the caller then skips the test).
pub fn peers_present(test: &str) -> bool {
    let missing: Vec<&str> = PEER_PROGRAMS
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

/// The ibsim server with OpenSM on the SM host ("smhost", the switch's
/// last port), served from the test's thread together with the guests: one
/// loop runs every guest's progress function and the server, on the
/// guests' fake clock pulled along with wall time (OpenSM and the diags
/// are real processes with real timeouts).
pub struct OpenSm {
    pub fabric: Arc<Mutex<sim::fabric::Fabric>>,
    pub svc: SmService,
    pub dir: PathBuf,
    pub base: String,
    t0: Instant,
    started: Instant,
    /// An OpenSM started again by [`OpenSm::restart`] (the service's own
    /// child was ended by then).
    restarted: Option<Child>,
    /// Rounds run, and the wall time spent in the guests' progress
    /// functions (for the benchmark's account of where time goes).
    pub rounds: u64,
    pub guest_ns: u64,
    /// One OpenSM test at a time: two of them at once on two loaded cores
    /// take longer than one after the other, and risk OpenSM's timeouts.
    _serial: std::sync::MutexGuard<'static, ()>,
}

static SERIAL: Mutex<()> = Mutex::new(());

static SEQ: AtomicUsize = AtomicUsize::new(0);

impl OpenSm {
    /// Adds the SM host to `fabric` (cabled to switch `sw`'s last free
    /// port), binds the server and starts OpenSM with `args` (`opensm:
    /// false` for the server alone).
    pub fn start(
        test: &str,
        fabric: &Arc<Mutex<sim::fabric::Fabric>>,
        sw: sim::fabric::SwitchId,
        opensm: bool,
        args: &[&str],
    ) -> OpenSm {
        Self::start_with(test, fabric, sw, opensm, args, Vec::new())
    }

    /// [`OpenSm::start`] with `extra` host nodes served beside the SM host
    /// (CAs the fabric models, for comparison with driver-run ones).
    pub fn start_with(
        test: &str,
        fabric: &Arc<Mutex<sim::fabric::Fabric>>,
        sw: sim::fabric::SwitchId,
        opensm: bool,
        args: &[&str],
        extra: Vec<sim::fabric::HostNode>,
    ) -> OpenSm {
        let base = format!(
            "lego-{test}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = crate::target_tmpdir().join("subnet").join(&base);
        let _ = std::fs::remove_dir_all(&dir);
        let opts = SmOptions {
            base: base.clone(),
            switch: Some(sw),
            peer: None,
            opensm,
            opensm_args: args.iter().map(|s| s.to_string()).collect(),
            dir: dir.clone(),
            sockname_file: None,
            // OpenSM's own transaction timeout is 200 ms (cx3-emu uses
            // it); the tests allow 1 s, as their thread and OpenSM share
            // two loaded cores: a request is still answered or bounced.
            timeout: Duration::from_secs(1),
        };
        let svc = {
            let mut f = fabric.lock().unwrap_or_else(|e| e.into_inner());
            SmService::start(&mut f, &opts, extra).expect("ibsim server and OpenSM")
        };
        OpenSm {
            fabric: fabric.clone(),
            svc,
            dir,
            base,
            t0: Instant::now(),
            started: Instant::now(),
            restarted: None,
            rounds: 0,
            guest_ns: 0,
            _serial: serial,
        }
    }

    /// One round: every guest's progress function, the server; the shared
    /// fake clock is moved up to the wall time since the start when it is
    /// behind (a packet a host node sends is due at the fabric's `now`,
    /// which must be the guests' clock). Returns the work done.
    pub fn round(&mut self, guests: &mut [&mut Guest]) -> usize {
        let mut work = 0;
        let t = Instant::now();
        for g in guests.iter_mut() {
            work += g.core.poll();
        }
        self.rounds += 1;
        self.guest_ns += t.elapsed().as_nanos() as u64;
        let wall = self.t0.elapsed().as_nanos() as u64;
        let Some(clock) = guests.first().map(|g| g.hca.clock()) else {
            // No guests (host nodes only): the fabric runs on wall time.
            let mut f = self.fabric.lock().unwrap_or_else(|e| e.into_inner());
            f.advance(wall);
            return work + self.svc.poll(&mut f, wall);
        };
        let now = clock.now_ns();
        if wall > now {
            clock.delay(Duration::from_nanos(wall - now));
        }
        let now = clock.now_ns();
        {
            let mut f = self.fabric.lock().unwrap_or_else(|e| e.into_inner());
            f.advance(now);
            work += self.svc.poll(&mut f, now);
        }
        if work == 0 {
            clock.relax();
        }
        work
    }

    /// Rounds until `done` (asked every `every` rounds) or `limit`.
    pub fn pump_until(
        &mut self,
        guests: &mut [&mut Guest],
        limit: Duration,
        every: u64,
        mut done: impl FnMut(&mut OpenSm, &mut [&mut Guest]) -> bool,
    ) -> bool {
        let t = Instant::now();
        let mut n = 0u64;
        let mut idle = 0u32;
        loop {
            if self.round(guests) == 0 {
                idle += 1;
                if idle > 32 {
                    // Nothing for a while: sleep a little.
                    std::thread::sleep(Duration::from_micros(50));
                } else {
                    // Let OpenSM (another process on this 2-core machine)
                    // run.
                    std::thread::yield_now();
                }
            } else {
                idle = 0;
            }
            n += 1;
            if n.is_multiple_of(every.max(1)) && done(self, guests) {
                return true;
            }
            if t.elapsed() > limit {
                return false;
            }
        }
    }

    /// Pumps until both guests' ports are Active and the `smhost` has a
    /// LID (and, where OpenSM is the SM, `opensm_is_sm`, it said SUBNET UP),
    /// asserting that within `limit` (`who` names the SM in the failure);
    /// then 2 s more, so the SA finishes its first sweep as master (OpenSM
    /// ignores the SA until then) and the LFT settles.
    pub fn wait_subnet_up(
        &mut self,
        a: &mut Guest,
        b: &mut Guest,
        limit: Duration,
        opensm_is_sm: bool,
        who: &str,
    ) {
        let ok = self.pump_until(&mut [&mut *a, &mut *b], limit, 256, |osm, g| {
            g.iter_mut().all(|g| g.active())
                && osm.svc.server.node("smhost").is_some_and(|h| h.lid() != 0)
                && (!opensm_is_sm || osm.subnet_ups() >= 1)
        });
        assert!(ok, "subnet up ({who}):\n{}", self.log());
        self.pump_until(
            &mut [&mut *a, &mut *b],
            Duration::from_secs(2),
            1 << 20,
            |_, _| false,
        );
    }

    /// OpenSM's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.svc.opensm_log()).unwrap_or_default()
    }

    /// Lines of the running OpenSM's log with "SUBNET UP".
    pub fn subnet_ups(&self) -> usize {
        self.current_log().matches("SUBNET UP").count()
    }

    /// When OpenSM was started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// [`OpenSm::diag`] of `prog` with the arguments of `template`, each
    /// `{name}` in it replaced by the LID `lids` gives that name, and a
    /// patient MAD timeout (`-t 5000`; the tools' default is 1 s, and on a
    /// loaded machine OpenSM's SA answers late but it answers). Returns the
    /// arguments as run and the output.
    pub fn patient_diag(
        &mut self,
        guests: &mut [&mut Guest],
        prog: &str,
        template: &str,
        lids: &[(&str, u16)],
        limit: Duration,
    ) -> (String, String) {
        let args = lids.iter().fold(template.to_string(), |t, (name, lid)| {
            t.replace(&format!("{{{name}}}"), &lid.to_string())
        });
        let argv: Vec<&str> = ["-t", "5000"]
            .into_iter()
            .chain(args.split_whitespace())
            .collect();
        let (_, out) = self.diag(guests, prog, &argv, limit);
        (args, out)
    }

    /// Runs an infiniband-diags tool on the SM host under the preload while
    /// the guests and the server are served; returns (exit success, stdout
    /// and stderr). Killed after `limit`.
    pub fn diag(
        &mut self,
        guests: &mut [&mut Guest],
        prog: &str,
        args: &[&str],
        limit: Duration,
    ) -> (bool, String) {
        let mut child = Command::new(prog)
            .args(args)
            .env("LD_PRELOAD", UMAD2SIM)
            .env("IBSIM_SOCKNAME", &self.base)
            .env("SIM_HOST", "smhost")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
        let pid = child.id();
        let t = Instant::now();
        let mut ok = None;
        while t.elapsed() < limit {
            self.round(guests);
            match child.try_wait() {
                Ok(Some(st)) => {
                    ok = Some(st.success());
                    break;
                }
                Ok(None) => {}
                Err(_) => break,
            }
        }
        if ok.is_none() {
            end_child(&mut child, &mut || {
                self.round(guests);
            });
        }
        // Serve the DISCONNECT of an exiting tool, then collect.
        let mut text = String::new();
        if let Ok(o) = child.wait_with_output() {
            text.push_str(&String::from_utf8_lossy(&o.stdout));
            text.push_str(&String::from_utf8_lossy(&o.stderr));
        }
        if ok.is_none() {
            text.push_str(&format!("\n[{prog} killed after {limit:?}]"));
        }
        let _ = std::fs::remove_dir_all(self.dir.join(format!("sys-{pid}")));
        (ok.unwrap_or(false), text)
    }

    /// Ends OpenSM (SIGTERM, its DISCONNECT served) and starts it again
    /// on the SM host with `args`, its log, cache and dump files in a new
    /// directory (`<dir>/restart`): an SM that knows nothing of the LIDs
    /// given before except what the ports report.
    pub fn restart(&mut self, guests: &mut [&mut Guest], args: &[&str]) {
        let now = guests.first().map_or(0, |g| g.hca.clock().now_ns());
        {
            let mut f = self.fabric.lock().unwrap_or_else(|e| e.into_inner());
            self.svc.stop(&mut f, now);
        }
        self.end_restarted();
        let dir = self.dir.join("restart");
        let _ = std::fs::create_dir_all(&dir);
        let child = sim::fabric::ibsim::opensm_command(&self.base, "smhost", &dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("OpenSM started again");
        self.restarted = Some(child);
        self.started = Instant::now();
    }

    /// The log of the OpenSM running now.
    pub fn current_log(&self) -> String {
        if self.restarted.is_some() {
            std::fs::read_to_string(self.dir.join("restart").join("opensm.log")).unwrap_or_default()
        } else {
            self.log()
        }
    }

    fn end_restarted(&mut self) {
        if let Some(mut c) = self.restarted.take() {
            let (fabric, svc) = (&self.fabric, &mut self.svc);
            end_child(&mut c, &mut || {
                let mut f = fabric.lock().unwrap_or_else(|e| e.into_inner());
                let now = f.next_due().unwrap_or(0);
                svc.poll(&mut f, now);
            });
        }
    }

    /// Ends OpenSM (serving its DISCONNECT) and removes the scratch
    /// directory unless the test failed or `KEEP_SUBNET_SCRATCH` is set.
    pub fn stop(mut self) {
        let now = self
            .fabric
            .lock()
            .map(|f| f.next_due().unwrap_or(0))
            .unwrap_or(0);
        self.end_restarted();
        {
            let mut f = self.fabric.lock().unwrap_or_else(|e| e.into_inner());
            self.svc.stop(&mut f, now);
        }
        if std::env::var_os("KEEP_SUBNET_SCRATCH").is_none() && !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Ends a child we spawned and have not reaped (SIGTERM, then SIGKILL
/// after 3 s), running `serve` meanwhile.
fn end_child(c: &mut Child, serve: &mut dyn FnMut()) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(c.id().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        serve();
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = c.kill();
    let _ = c.wait();
}

// --- RC traffic between two guests -----------------------------------------

use ib_core::verbs::{
    AccessFlags, AhAttr, CqInitAttr, Mr, MrPages, Mtu, QpAttr, QpAttrMask as M, QpCap,
    QpCreateFlags, QpInitAttr, QpState, QpType, SendFlags, SendWr, Sge, SigType, Wc, WcStatus,
    WrDetail, WrOpcode,
};
use ib_core::verbs::{Cq, Pd, Qp};

/// One end of an RC connection made with plain verbs (no CM).
pub struct RcEnd {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    buf: hal::DmaBuf,
    pub qpn: u32,
}

/// Size of each end's registered buffer.
pub const RC_BUF: usize = 64 * 1024;
const RC_IOVA: u64 = 0x4000_0000;

/// A CQ of `cqe` entries and a QP of type `t` on `port` that uses it for
/// both queues: `send_wr`/`recv_wr` requests of one SGE, every send
/// signalled.
pub fn cq_and_qp(
    d: &mut Device,
    pd: Pd,
    t: QpType,
    port: u8,
    cqe: u32,
    send_wr: u32,
    recv_wr: u32,
) -> (Cq, Qp) {
    let (cq, _) = d
        .create_cq(&CqInitAttr {
            cqe,
            comp_vector: 0,
        })
        .expect("CQ");
    let (qp, _) = d
        .create_qp(
            pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: send_wr,
                    max_recv_wr: recv_wr,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_type: SigType::AllWr,
                qp_type: t,
                create_flags: QpCreateFlags::empty(),
                port_num: port,
            },
        )
        .unwrap_or_else(|e| panic!("{t:?} QP: {e}"));
    (cq, qp)
}

/// A zeroed DMA buffer of `len` bytes (whole pages) from `pool`, registered
/// in `pd` at `iova` with `access`.
pub fn reg_buf(
    pool: &hal::DmaPool,
    d: &mut Device,
    pd: Pd,
    len: usize,
    iova: u64,
    access: AccessFlags,
) -> (hal::DmaBuf, Mr) {
    let buf = pool.alloc_pages(len / 4096).expect("DMA buffer");
    let pages: Vec<u64> = (0..(len / 4096) as u64)
        .map(|i| buf.bus_addr().0 + i * 4096)
        .collect();
    let mr = d
        .reg_mr(
            pd,
            &MrPages {
                pages: &pages,
                page_shift: 12,
                iova,
                length: len as u64,
                access,
            },
        )
        .expect("MR");
    (buf, mr)
}

fn rc_end(g: &mut Guest) -> RcEnd {
    let pool = g.hca.dma_pool();
    let d = g.core.device_mut(g.dev).expect("device");
    let pd = d.alloc_pd().expect("PD");
    let (cq, qp) = cq_and_qp(d, pd, QpType::Rc, 1, 128, 64, 4);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (buf, mr) = reg_buf(&pool, d, pd, RC_BUF, RC_IOVA, access);
    RcEnd {
        pd,
        cq,
        qpn: qp.qp_num,
        qp,
        mr,
        buf,
    }
}

fn rc_connect(g: &mut Guest, e: &RcEnd, dlid: u16, dqpn: u32) {
    let d = g.core.device_mut(g.dev).expect("device");
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        pkey_index: 0,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        ..Default::default()
    };
    d.modify_qp(
        e.qp,
        &a,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .expect("INIT");
    let a = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu2048,
        dest_qp_num: dqpn,
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: AhAttr {
            dlid,
            port_num: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    d.modify_qp(e.qp, &a, rc_rtr_mask()).expect("RTR");
    let a = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..Default::default()
    };
    d.modify_qp(e.qp, &a, rc_rts_mask()).expect("RTS");
}

/// What an RC QP's move to RTR sets: the path, its MTU, the remote QPN and
/// PSN, the responder's RDMA READ depth and the RNR timer.
pub fn rc_rtr_mask() -> M {
    M::STATE
        | M::AV
        | M::PATH_MTU
        | M::DEST_QPN
        | M::RQ_PSN
        | M::MAX_DEST_RD_ATOMIC
        | M::MIN_RNR_TIMER
}

/// What an RC QP's move to RTS sets: the send PSN, the ACK timeout and
/// retry counts, the initiator's RDMA READ depth.
pub fn rc_rts_mask() -> M {
    M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC
}

fn rc_free(g: &mut Guest, e: RcEnd) {
    let d = g.core.device_mut(g.dev).expect("device");
    d.destroy_qp(e.qp).expect("destroy QP");
    d.dereg_mr(e.mr).expect("dereg MR");
    d.destroy_cq(e.cq).expect("destroy CQ");
    d.dealloc_pd(e.pd).expect("dealloc PD");
    drop(e.buf);
}

/// `count` RDMA WRITEs of `size` bytes from `a` into `b`'s buffer over an
/// RC connection made with verbs between the LIDs the SM gave them (the
/// switch forwards by the LFT the SM programmed), the data checked;
/// `serve` runs between polls (the SM's server). Returns the bytes moved.
pub fn rc_write(
    a: &mut Guest,
    b: &mut Guest,
    count: usize,
    size: usize,
    serve: &mut dyn FnMut(&mut Guest, &mut Guest),
) -> u64 {
    assert!(size <= RC_BUF);
    let (la, lb) = (a.port(1).lid, b.port(1).lid);
    let ea = rc_end(a);
    let eb = rc_end(b);
    rc_connect(a, &ea, lb, eb.qpn);
    rc_connect(b, &eb, la, ea.qpn);
    let pattern: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
    ea.buf.write_bytes(0, &pattern);
    let rkey = eb.mr.rkey;
    let t = Instant::now();
    let mut done = 0;
    let mut posted = 0;
    let mut wc = [Wc::default(); 16];
    while done < count {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "RC WRITEs stuck: {done} of {count} done"
        );
        while posted < count && posted - done < 32 {
            let sge = [Sge {
                addr: RC_IOVA,
                length: size as u32,
                lkey: ea.mr.lkey,
            }];
            let wr = SendWr {
                wr_id: posted as u64,
                sg_list: &sge,
                opcode: WrOpcode::RdmaWrite,
                send_flags: SendFlags::SIGNALED,
                wr: WrDetail::Rdma {
                    remote_addr: RC_IOVA,
                    rkey,
                },
                ..Default::default()
            };
            a.core
                .device_mut(a.dev)
                .expect("device")
                .post_send(ea.qp, &[wr])
                .expect("post RDMA WRITE");
            posted += 1;
        }
        let n = a
            .core
            .device_mut(a.dev)
            .expect("device")
            .poll_cq(ea.cq, &mut wc)
            .expect("poll CQ");
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
        }
        done += n;
        serve(a, b);
        if n == 0 {
            a.core.clock().relax();
        }
    }
    let mut back = vec![0u8; size];
    eb.buf.read_bytes(0, &mut back);
    assert_eq!(back, pattern, "the data landed in the peer's buffer");
    rc_free(a, ea);
    rc_free(b, eb);
    (count * size) as u64
}

impl Drop for OpenSm {
    fn drop(&mut self) {
        // A failed test: end a restarted OpenSM at once (the service ends
        // its own child when it is dropped).
        if let Some(mut c) = self.restarted.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
