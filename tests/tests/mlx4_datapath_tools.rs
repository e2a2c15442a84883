//! The perftest tools between two real stacks on the model.
//!
//! The perftest tools of `ib_tools` between two real stacks (mlx4_core + mlx4_ib +
//! ib_core, each on its own threaded model HCA) cabled to one model switch with the
//! fabric's embedded SM and SA, as `run-qemu.sh --nodes 2 --emu-args --embedded-sm`
//! runs them: `ib_read_bw --check` verifies every byte it reads (the server's slots
//! must hold their pattern before the client may read them), and two tools run one
//! after the other on one `IbCore` each, as a console script does (a second CM
//! connection in the same boot).

use tests::mlx4_common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ib_core::{ClientId, DeviceId, IbCore};
use ib_tools::perftest::{self, Params, Tool};
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;
use sim::fabric::topology::Topology;
use sim::fabric::{Fabric, SmConfig};
use sim::{SimConfig, Wire};

struct Node {
    hca: Model,
    core: IbCore,
    dev: DeviceId,
    sa: ClientId,
    cm: ClientId,
}

/// What a tool printed so far, shared with the test thread.
#[derive(Clone, Default)]
struct Out(Arc<Mutex<String>>);

impl core::fmt::Write for Out {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.0.lock().unwrap().push_str(s);
        Ok(())
    }
}

impl Out {
    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }
    /// Waits until the output holds `what` `n` times (deadline).
    fn wait_for(&self, what: &str, n: usize, limit: Duration) {
        let end = Instant::now() + limit;
        while self.text().matches(what).count() < n {
            assert!(Instant::now() < end, "no '{what}' in:\n{}", self.text());
            thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Two threaded HCAs on ports 1 and 2 of a switch, the embedded SM on
/// port 3, as cx3-emu's `--nodes 2 --embedded-sm`.
fn fabric() -> (Wire, Vec<Node>) {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(2)
        .unwrap()
        .build(&mut f)
        .expect("topology");
    f.add_sm_on_free_port(SmConfig::default()).expect("SM port");
    let wire = Wire::threaded(Arc::new(Mutex::new(f)));
    let nodes = built
        .hcas
        .iter()
        .map(|h| {
            let cfg = SimConfig {
                node_guid: h.node_guid,
                sys_image_guid: h.node_guid + 3,
                dma_size: 64 << 20,
                ..SimConfig::default()
            };
            let hca = Model::on_ports(cfg, &wire, [Some(h.ports[0]), Some(h.ports[1])]);
            let d = bring_up(&hca, Profile::default()).expect("mlx4_core");
            let ib = Mlx4IbDev::add(d, "mlx4_0").expect("mlx4_ib_add");
            let mut core = IbCore::new(hca.clock());
            let dev = core
                .register_device(Box::new(ib))
                .map_err(|e| e.error)
                .expect("registered");
            let sa = ib_core::sa_query::init(&mut core);
            let cm = ib_core::cm::init(&mut core);
            Node {
                hca,
                core,
                dev,
                sa,
                cm,
            }
        })
        .collect();
    (wire, nodes)
}

fn teardown(mut n: Node) {
    let mut p = n.core.unregister_device(n.dev).expect("unregistered");
    let ib = p
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
        .expect("mlx4_ib");
    assert_eq!(ib.live_objects(), [0; 7], "the tools freed what they made");
    ib.remove();
    drop(p);
    let v = n.hca.violations();
    assert!(v.is_empty(), "{v:#?}");
}

/// Runs the tools `cmds` (name, arguments) one after the other on `n`.
fn run_tools(n: &mut Node, cmds: &[(String, Vec<String>)], out: &mut Out) -> Result<(), String> {
    for (name, args) in cmds {
        let t = Tool::from_name(name).ok_or("unknown tool")?;
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let p = Params::parse(t, &a).map_err(|e| format!("{e}"))?;
        let mut no = || false;
        let mut env = perftest::run::Env {
            core: &mut n.core,
            sa: n.sa,
            cm: n.cm,
            dev: n.dev,
            dev_name: "mlx4_0",
            ip: None,
            interrupted: &mut no,
        };
        perftest::run::run(&mut env, &p, out).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// Server tools on node 0, the same tools as clients of node 0 on node 1;
/// each client starts once the server says it waits.
fn server_and_client(
    tools: &[(&str, &str)],
) -> (Result<(), String>, Result<(), String>, String, String) {
    let (wire, mut nodes) = fabric();
    let mut n1 = nodes.pop().unwrap();
    let mut n0 = nodes.pop().unwrap();
    let srv_cmds: Vec<(String, Vec<String>)> = tools
        .iter()
        .map(|(t, a)| (t.to_string(), args(a)))
        .collect();
    let srv_out = Out::default();
    let mut so = srv_out.clone();
    let server = thread::spawn(move || {
        let r = run_tools(&mut n0, &srv_cmds, &mut so);
        (n0, r)
    });
    let mut cli_out = Out::default();
    let mut r1 = Ok(());
    for (k, (t, a)) in tools.iter().enumerate() {
        srv_out.wait_for(
            "Waiting for client to connect",
            k + 1,
            Duration::from_secs(60),
        );
        // The server's LID, as the console shows it.
        let text = srv_out.text();
        let lid: u16 = text
            .rsplit("(LID ")
            .next()
            .and_then(|s| s.split(',').next())
            .and_then(|s| s.parse().ok())
            .expect("the server says its LID");
        let cmd = [(t.to_string(), args(&format!("{a} {lid}")))];
        r1 = run_tools(&mut n1, &cmd, &mut cli_out);
        if r1.is_err() {
            break;
        }
    }
    let (n0, r0) = server.join().expect("server thread");
    teardown(n1);
    teardown(n0);
    drop(wire);
    (r0, r1, srv_out.text(), cli_out.text())
}

#[test]
fn ib_read_bw_check_reads_every_slot_as_the_server_filled_it() {
    let (r0, r1, so, co) = server_and_client(&[("ib_read_bw", "--check -n 100")]);
    assert!(r1.is_ok(), "client: {r1:?}\n{co}\nserver:\n{so}");
    assert!(r0.is_ok(), "server: {r0:?}\n{so}");
    assert!(co.contains(" 65536      100"), "{co}");
}

#[test]
fn two_connections_one_after_the_other_in_one_boot() {
    let (r0, r1, so, co) = server_and_client(&[
        ("ib_write_bw", "-n 50 -s 4096"),
        ("ib_read_lat", "-n 20 -s 64"),
    ]);
    assert!(r1.is_ok(), "client: {r1:?}\n{co}\nserver:\n{so}");
    assert!(r0.is_ok(), "server: {r0:?}\n{so}");
}
