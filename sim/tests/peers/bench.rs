//! Figures: OpenSM's SUBNET UP time on our fabric beside ibsim's.
//!
//! Figures (ignored; run in release): OpenSM's SUBNET UP time on our
//! fabric beside ibsim's own on the same net file, and the SMPs of a
//! sweep. `cargo test --release -p sim --test peers -- --ignored --nocapture`

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::rig::{NET_SMALL, Rig, UMAD2SIM, tools_present};

const RUNS: usize = 5;
const LIMIT: Duration = Duration::from_secs(30);

/// Microseconds of the day of an OpenSM log line ("Nov 23 03:42:27 368958 ...").
fn log_us(line: &str) -> Option<u64> {
    let mut w = line.split_whitespace().skip(2);
    let hms: Vec<u64> = w
        .next()?
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let us: u64 = w.next()?.parse().ok()?;
    Some(((hms.first()? * 60 + hms.get(1)?) * 60 + hms.get(2)?) * 1_000_000 + us)
}

/// (first log line to SUBNET UP, DISCOVERING to SUBNET UP), from the log.
fn log_times(log: &str) -> Option<(Duration, Duration)> {
    let first = log.lines().find_map(log_us)?;
    let disc = log
        .lines()
        .find(|l| l.contains("Entering DISCOVERING"))
        .and_then(log_us)?;
    let up = log
        .lines()
        .find(|l| l.contains("SUBNET UP"))
        .and_then(log_us)?;
    Some((
        Duration::from_micros(up.checked_sub(first)?),
        Duration::from_micros(up.checked_sub(disc)?),
    ))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn report(what: &str, exec: Vec<Duration>, logged: Vec<(Duration, Duration)>) {
    let (a, b): (Vec<_>, Vec<_>) = logged.into_iter().unzip();
    eprintln!(
        "{what}: exec->SUBNET UP seen: median {:?} (min {:?}, max {:?}); log first line->UP median {:?}; DISCOVERING->UP median {:?}",
        median(exec.clone()),
        exec.iter().min().copied().unwrap_or_default(),
        exec.iter().max().copied().unwrap_or_default(),
        median(a),
        median(b)
    );
}

#[test]
#[ignore = "benchmark: prints figures"]
fn subnet_up_time_beside_ibsim() {
    if !tools_present("subnet_up_time_beside_ibsim")
        || !std::path::Path::new("/usr/bin/ibsim").exists()
    {
        eprintln!("!!!!! SKIPPED subnet_up_time_beside_ibsim: needs ibsim-utils too");
        return;
    }
    // Ours.
    let (mut exec, mut logged, mut smps) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let mut rig = Rig::start("bench", NET_SMALL);
        rig.start_opensm("H1", &[]);
        let t = rig.wait_subnet_up(1, LIMIT).expect("SUBNET UP");
        exec.push(t);
        logged.push(log_times(&rig.opensm_log()).expect("log times"));
        smps.push(rig.world().server.stats().client_smps);
    }
    report("our fabric", exec, logged);
    eprintln!("our fabric: SMPs until SUBNET UP per run: {smps:?}");

    // ibsim 0.10 on the same net file.
    let (mut exec, mut logged) = (Vec::new(), Vec::new());
    for k in 0..RUNS {
        let rig = Rig::start("benchdir", NET_SMALL); // only for its scratch dir
        let dir = rig.dir.clone();
        std::fs::write(dir.join("net.small"), NET_SMALL).expect("net file");
        let sock = format!("ibsimref-{}-{k}", std::process::id());
        let mut ibsim = Command::new("/usr/bin/ibsim")
            .args(["-s", "-n", "net.small"])
            .env("IBSIM_SOCKNAME", &sock)
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ibsim");
        std::thread::sleep(Duration::from_millis(300));
        let log = dir.join("osm-ibsim.log");
        let t = Instant::now();
        let mut osm = Command::new("/usr/sbin/opensm")
            .arg("-d2")
            .arg("-e")
            .arg("-f")
            .arg(&log)
            .arg("--dump_files_dir")
            .arg(&dir)
            .env("LD_PRELOAD", UMAD2SIM)
            .env("IBSIM_SOCKNAME", &sock)
            .env("SIM_HOST", "H1")
            .env("OSM_TMP_DIR", &dir)
            .env("OSM_CACHE_DIR", &dir)
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("opensm");
        let mut up = None;
        while t.elapsed() < LIMIT {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("SUBNET UP") {
                up = Some(t.elapsed());
                logged.push(log_times(&text).expect("log times"));
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // OpenSM before ibsim (its exit waits for ibsim's DISCONNECT reply).
        for c in [&mut osm, &mut ibsim] {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            let end = Instant::now();
            while end.elapsed() < Duration::from_secs(3) && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        exec.push(up.expect("SUBNET UP on ibsim"));
    }
    report("ibsim 0.10", exec, logged);

    // SMPs of a light sweep on our fabric (OpenSM sweeping every second).
    let mut rig = Rig::start("sweep", NET_SMALL);
    rig.start_opensm("H1", &["-s", "1"]);
    rig.wait_subnet_up(1, LIMIT).expect("SUBNET UP");
    std::thread::sleep(Duration::from_millis(500));
    let a = rig.world().server.stats().client_smps;
    std::thread::sleep(Duration::from_secs(4));
    let b = rig.world().server.stats().client_smps;
    eprintln!(
        "light sweeps: {} SMPs in 4 s at one sweep per second",
        b - a
    );
}

/// What an idle server costs an emulator loop per poll (no clients, no
/// packets): 11 non-blocking receives and a look at each host node.
#[test]
#[ignore = "benchmark: prints figures"]
fn idle_poll_cost() {
    use sim::fabric::{Fabric, HostNode, IbsimServer, Topology};
    let mut fabric = Fabric::new();
    let built = Topology::from_netfile(NET_SMALL)
        .expect("net")
        .build(&mut fabric)
        .expect("build");
    let nodes = built
        .hcas
        .iter()
        .map(|h| HostNode::new(&mut fabric, &h.name, h.node_guid, h.ports[0]))
        .collect();
    let mut s =
        IbsimServer::bind(&format!("lego-idle-{}", std::process::id()), nodes).expect("bind");
    let n = 200_000u32;
    let t = Instant::now();
    let mut work = 0;
    for i in 0..n {
        work += s.poll(&mut fabric, u64::from(i));
    }
    let el = t.elapsed();
    assert_eq!(work, 0);
    eprintln!(
        "idle poll: {:.0} ns per poll ({n} polls in {el:?}; 1 switch, 3 host nodes, no clients)",
        el.as_nanos() as f64 / f64::from(n)
    );
}
