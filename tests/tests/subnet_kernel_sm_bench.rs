//! Figures for docs/sm.md: SUBNET UP after the SM's start and SMPs per sweep, our SM beside OpenSM on the same fabric.
//!
//! N driver-run guests (2 and 4) on the `--nodes N` switch with the SM host
//! the ibsim server attaches: once our SM in guest 0 (the server alone), once
//! OpenSM on the SM host; the guests' fake clock pulled along with wall time
//! as the OpenSM tests run it. Wall time from the SM's start to SUBNET UP
//! with every guest Active, the SMPs of that first sweep, and of an idle
//! light sweep. Medians of a few cold runs.
//! `cargo test --release -p tests --test subnet_kernel_sm_bench -- --ignored --nocapture`

use tests::subnet_common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ib_sm::SmConfig;
use sim::fabric::{Fabric, Topology};
use subnet_common::*;

const RUNS: usize = 3;

/// `subnet_opensm.rs`'s net: one 8-port switch, two CAs (the SM host on
/// port 8), where the issue counted OpenSM's 65 SMPs.
const NET_TWO: &str = r#"
vendid=0x02c9
devid=0xc738
switchguid=0x0002c90000000100
Switch	8 "Sw1"
[1]	"H1"[1]
[2]	"H2"[1]

vendid=0x02c9
devid=0x1003
caguid=0x0002c90300000010
Ca	2 "H1"
[1]	"Sw1"[1]

vendid=0x02c9
devid=0x1003
caguid=0x0002c90300000020
Ca	2 "H2"
[1]	"Sw1"[2]
"#;
const LIMIT: Duration = Duration::from_secs(60);

fn guests(fabric: &Arc<Mutex<Fabric>>, built: &sim::fabric::Built, n: usize) -> Vec<Guest> {
    let wire = sim::Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    built
        .hcas
        .iter()
        .take(n)
        .map(|h| {
            let hca = sim::SimHca::new_on_ports(
                guest_config(h),
                &wire,
                [Some(h.ports[0]), Some(h.ports[1])],
            );
            guest(hca, &h.name)
        })
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One cold run: (ms to SUBNET UP with every guest Active, SMPs of that
/// sweep, SMPs of an idle light sweep).
fn one(nodes: usize, ours: bool, run: usize) -> (f64, f64, f64) {
    let topo = if nodes == 0 {
        Topology::from_netfile(NET_TWO).unwrap()
    } else {
        Topology::for_nodes(nodes).unwrap()
    };
    let nodes = nodes.max(2);
    let mut f = Fabric::new();
    let built = topo.build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let mut gs = guests(&fabric, &built, nodes);
    let test = format!(
        "ksm-bench-{}-{nodes}-{run}",
        if ours { "ours" } else { "osm" }
    );
    let t0 = Instant::now();
    let mut osm = OpenSm::start(&test, &fabric, built.switches[0].1, !ours, &["-s", "1"]);
    let sm = ib_sm::init(&mut gs[0].core);
    if ours {
        let dev = gs[0].dev;
        let cfg = SmConfig {
            sweep_interval_ms: 1000,
            ..SmConfig::default()
        };
        ib_sm::start(&mut gs[0].core, sm, dev, 1, cfg).unwrap();
    }
    let dev0 = gs[0].dev;
    let mut refs: Vec<&mut Guest> = gs.iter_mut().collect();
    let mut last = Instant::now();
    let ok = osm.pump_until(&mut refs, LIMIT, 1, |osm, g| {
        if last.elapsed() < Duration::from_micros(500) {
            return false;
        }
        last = Instant::now();
        let up = if ours {
            ib_sm::status(&mut g[0].core, sm, dev0).is_some_and(|s| s.stats.subnet_ups >= 1)
        } else {
            osm.subnet_ups() >= 1
        };
        up && g.iter_mut().all(|g| g.active())
    });
    assert!(ok, "SUBNET UP ({})", if ours { "ours" } else { "OpenSM" });
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let smps = if ours {
        ib_sm::status(&mut refs[0].core, sm, dev0)
            .unwrap()
            .stats
            .smps_last_heavy as f64
    } else {
        osm.svc.server.stats().client_smps as f64
    };
    // Idle light sweeps: ours by model time (the guests' clock runs ahead
    // of wall time after their bring-up), OpenSM's by wall time; both
    // sweep every second.
    let per_light = if ours {
        let ok = osm.pump_until(&mut refs, Duration::from_secs(30), 64, |_, g| {
            ib_sm::status(&mut g[0].core, sm, dev0).is_some_and(|s| s.stats.light_sweeps >= 2)
        });
        assert!(ok, "two light sweeps");
        ib_sm::status(&mut refs[0].core, sm, dev0)
            .unwrap()
            .stats
            .smps_last_light as f64
    } else {
        let before = osm.svc.server.stats().client_smps;
        osm.pump_until(&mut refs, Duration::from_secs(3), 1 << 20, |_, _| false);
        (osm.svc.server.stats().client_smps - before) as f64 / 3.0
    };
    drop(refs);
    osm.stop();
    for g in gs {
        g.teardown();
    }
    (ms, smps, per_light)
}

#[test]
#[ignore]
fn bench_subnet_up_ours_beside_opensm() {
    if !peers_present("bench_subnet_up_ours_beside_opensm") {
        return;
    }
    // The machine's load while measuring (the figures move with it).
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    println!("load average at the start: {}", load());
    // 0: NET_TWO (2 guests on an 8-port switch).
    for nodes in [0, 2, 4] {
        for ours in [true, false] {
            let (mut t, mut s, mut l) = (Vec::new(), Vec::new(), Vec::new());
            for run in 0..RUNS {
                let (a, b, c) = one(nodes, ours, run);
                t.push(a);
                s.push(b);
                l.push(c);
            }
            let net = if nodes == 0 {
                "2 guests on an 8-port switch (NET_TWO)".to_string()
            } else {
                format!("{nodes} guests on the 36-port switch")
            };
            println!(
                "{net} + SM host, {}: SUBNET UP with every guest Active {:.1} ms after the SM's start (runs {t:.1?}); first sweep {} SMPs; an idle light sweep (-s 1) {:.1} SMPs",
                if ours {
                    "our SM (in guest 0)"
                } else {
                    "OpenSM (on the SM host)"
                },
                median(&mut t.clone()),
                median(&mut s.clone()),
                median(&mut l.clone()),
            );
            println!("  load average: {}", load());
        }
    }
}
