//! Remote paging between QEMU guests, as a researcher runs it: `run-qemu.sh --nodes 3`, node 0 the compute node whose `pcache` region faults its pages in over RDMA from nodes 1 and 2, the memory nodes (`rmem serve`), named by port GUID or by IP address (10.0.0.2, 10.0.0.3: the RDMA CM). Three boots, one after the other: every workload at 25% local memory ending with the checksum it has on local memory, with the fault-time probe and a small `pcache experiment` whose CSV run-qemu.sh collects; two copies of every page and memory node 2's cable pulled by cx3-emu (`--pull`, by bytes) in the middle of a GUPS run that still ends with the local checksum; and the same pull with one copy ending the run with the fault's error (page, node, completion status) within the deadline while the console goes on (stats, detach, a new region on the surviving node). Every run has a deadline; QEMU and cx3-emu are ended by run-qemu.sh.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tests::qemu::{self, root};

/// One boot's deadline.
const DEADLINE: Duration = Duration::from_secs(400);

/// The memory nodes' port GUIDs (HCA i: node GUID 0x0002c903_0000_0000 +
/// (i+1)*0x10, port 1 that plus 1).
const MEM1: &str = "0x0002c90300000021";
const MEM2: &str = "0x0002c90300000031";

/// The memory nodes' IPoIB addresses (run-qemu.sh gives node N
/// `ip=ib0:10.0.0.<N+1>/24`).
const MEM1_IP: &str = "10.0.0.2";
const MEM2_IP: &str = "10.0.0.3";

/// Node 2's cable is pulled once this much has crossed it: past the
/// connection and GUPS's fill (about 1 MiB through node 2 with two
/// copies), well before the run's end (some 20 MiB with two copies, 10
/// with one).
const PULL_AFTER: &str = "4MiB";

/// A memory node that is cut off cannot see the compute node leave: it
/// serves this long (guest seconds after its export), past the pull.
const CUT_SERVE_S: u32 = 90;

/// The boots run one at a time (three guests each on a small machine).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Outcome {
    status: i32,
    stdout: String,
    stderr: String,
}

fn run_qemu(args: &[&str]) -> Outcome {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let t = Instant::now();
    let r = qemu::run_args(args, DEADLINE);
    eprintln!("the three guests took {:?}", t.elapsed());
    Outcome {
        status: r.status,
        stdout: r.transcript,
        stderr: r.stderr,
    }
}

fn node(out: &str, n: usize) -> &str {
    qemu::node(out, n).unwrap_or_else(|| panic!("node {n}'s transcript in:\n{out}"))
}

/// The output of `lego> CMD` up to the next prompt (kernel log lines left
/// out).
fn output<'a>(t: &'a str, cmd: &str) -> Vec<&'a str> {
    output_nth(t, cmd, 0)
}

/// The output of the `n`th run (from 0) of `CMD`.
fn output_nth<'a>(t: &'a str, cmd: &str, n: usize) -> Vec<&'a str> {
    let mut runs: Vec<usize> = t
        .match_indices(&format!("lego> {cmd}\n"))
        .chain(t.match_indices(&format!("lego> {cmd}\r\n")))
        .map(|(i, _)| i)
        .collect();
    runs.sort_unstable();
    let Some(&at) = runs.get(n) else {
        panic!("`{cmd}` was not run:\n{t}");
    };
    t[at..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("lego> ") && !l.starts_with("run: "))
        .filter(|l| !l.starts_with('['))
        .map(|l| l.trim_end_matches('\r'))
        .collect()
}

fn line_with<'a>(t: &'a str, cmd: &str, needle: &str) -> &'a str {
    let out = output(t, cmd);
    out.iter()
        .find(|l| l.contains(needle))
        .copied()
        .unwrap_or_else(|| {
            panic!("`{cmd}`: expected {needle:?} in {out:#?}\nwhole transcript:\n{t}")
        })
}

/// The number after the first `key` in `line`.
fn field(line: &str, key: &str) -> u64 {
    let (_, rest) = line
        .split_once(key)
        .unwrap_or_else(|| panic!("no {key:?} in {line:?}"));
    rest.trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{key:?} in {line:?}"))
}

/// `pcache run W`'s line: checksum equal to local memory's.
fn check_run(t: &str, cmd: &str, workload: &str) {
    let l = line_with(t, cmd, &format!("pcache: {workload} on region "));
    assert!(l.ends_with(": match"), "{workload}: {l}");
    let (remote, local) = l.split_once("; local memory").unwrap();
    let sum = |s: &str| s.split("checksum ").nth(1).map(|c| c[..18].to_string());
    assert_eq!(sum(remote), sum(local), "{l}");
}

fn memory_node(secs: u32, clients: Option<u32>) -> String {
    match clients {
        Some(n) => format!("rmem serve 64M {secs} --clients {n}"),
        None => format!("rmem serve 64M {secs}"),
    }
}

/// The CSV files run-qemu.sh said it wrote, by node.
fn csv_files(stderr: &str) -> Vec<(usize, PathBuf)> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("run-qemu.sh: node ")?;
            let (n, path) = rest.split_once(" CSV: ")?;
            Some((n.parse().ok()?, root().join(path.trim())))
        })
        .collect()
}

#[test]
fn pcache_every_workload_at_25_percent_local_matches_local_memory() {
    // The region's memory nodes named one by IP address (the RDMA CM), one
    // by port GUID (the IB CM); the experiment's both by IP address; then
    // `rmem connect` by IP address to node 2, a pattern written and
    // checked.
    let attach = format!("pcache attach 1M --nodes {MEM1_IP},{MEM2} --cache 25% -t 120");
    let experiment = format!(
        "pcache experiment --nodes {MEM1_IP},{MEM2_IP} --ws 256K --fractions 100,25 --workloads seq,kv -t 60"
    );
    let rmem_ip = format!("rmem connect {MEM2_IP} -t 60");
    let compute = format!(
        "{attach}; pcache run seq; pcache run gups; pcache run sort; pcache run kv; pcache lat; \
         pcache stats; pcache detach; {experiment}; pcache stats; {rmem_ip}; rmem alloc 64K; \
         rmem write @ 64K; rmem read @ 64K --check; rmem close"
    );
    let (m1, m2) = (memory_node(300, Some(2)), memory_node(300, Some(3)));
    let o = run_qemu(&[
        "--nodes", "3", "--run-on", "0", &compute, "--run-on", "1", &m1, "--run-on", "2", &m2,
    ]);
    let all = format!("{}\n--- stderr ---\n{}", o.stdout, o.stderr);
    assert_eq!(o.status, 0, "{all}");
    let t = node(&o.stdout, 0);
    line_with(
        t,
        &attach,
        "1024 KiB (256 pages) over 2 memory node(s) (10.0.0.2, 0x0002c90300000031), replicas 1, cache 64 pages (25%)",
    );
    // The memory nodes listened on the RDMA CM beside the IB CM, and were
    // reached both ways: node 1 served two connections by IP address (the
    // region's and the experiment's), node 2 one by GUID and two by IP
    // address (the experiment's and rmem's).
    for (n, mem, clients) in [(1, &m1, 2), (2, &m2, 3)] {
        let m = node(&o.stdout, n);
        let serve = line_with(m, mem, "rmem: serving ");
        assert!(serve.contains(" and TCP port 21069 (RDMA CM); "), "{serve}");
        let done = line_with(m, mem, " clients served, ");
        assert!(
            done.starts_with(&format!("rmem: {clients} clients served, ")),
            "{done}"
        );
    }
    line_with(
        t,
        &rmem_ip,
        "connected to 10.0.0.3: region 0x10000000000..0x10004000000 (65536 KiB)",
    );
    line_with(t, "rmem read @ 64K --check", "read 65536 bytes at 0x");
    line_with(t, "rmem read @ 64K --check", ": pattern ok");
    for w in ["seq", "gups", "sort", "kv"] {
        let cmd = format!("pcache run {w}");
        check_run(t, &cmd, w);
        let l = line_with(t, &cmd, " faults (");
        assert!(
            field(l, "faults (") > 0,
            "{w}: pages fetched over RDMA: {l}"
        );
        assert!(
            l.contains(" evictions, ") && l.ends_with(" 0 fall-backs to a replica"),
            "{l}"
        );
    }
    // The probe: every fault a READ, timed part by part.
    let probe = line_with(t, "pcache lat", " faults/s");
    assert!(field(probe, "pcache:") > 100, "{probe}");
    let split = line_with(t, "pcache lat", "fault time, TSC cycles");
    for part in ["trap", "lookup", "evict", "read", "map", "return"] {
        assert!(
            split.contains(&format!("; {part} ")) || split.contains(&format!(": {part} ")),
            "{split}"
        );
    }
    assert!(field(split, "read") > 0, "{split}");
    let nodes: Vec<&str> = output(t, "pcache stats")
        .into_iter()
        .filter(|l| l.starts_with("node "))
        .collect();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    for n in &nodes {
        assert!(n.contains("): up,") && field(n, "reads") > 0, "{n}");
    }
    line_with(
        t,
        "pcache detach",
        "pcache: region 0 detached, 2 connection(s) closed",
    );
    // The experiment: each run's checksum matched, CSV collected.
    let ex = output(t, &experiment);
    let runs: Vec<&&str> = ex.iter().filter(|l| l.contains("% local (")).collect();
    assert_eq!(
        runs.len(),
        2 * 2 * 2,
        "2 workloads x 2 node counts x 2 fractions: {ex:#?}"
    );
    assert!(
        runs.iter()
            .all(|l| l.ends_with("checksum matches local memory")),
        "{runs:#?}"
    );
    assert_eq!(
        ex.iter().filter(|l| l.contains("fault probe over")).count(),
        2,
        "{ex:#?}"
    );
    assert_eq!(
        output_nth(t, "pcache stats", 1),
        ["pcache: no region attached"],
        "{t}"
    );
    let files = csv_files(&o.stderr);
    let csv = files
        .iter()
        .find(|(n, p)| *n == 0 && p.ends_with("node0-pcache-experiment.csv"))
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("no experiment CSV: {files:?}\n{all}"));
    let text = std::fs::read_to_string(csv).unwrap();
    let mut lines = text.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("workload,nodes,replicas,readahead,local_pct")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 8, "{text}");
    for r in &rows {
        assert_eq!(r.len(), 24, "{r:?}");
        assert_eq!(r[10], "1", "checksum_ok: {r:?}");
        // The spread: best (time_us) <= median <= worst, over `runs` runs
        // (the 100% point three times a round).
        let us = |i: usize| r[i].parse::<u64>().unwrap();
        assert!(us(7) <= us(22) && us(22) <= us(23), "{r:?}");
        assert_eq!(r[21], if r[4] == "100" { "3" } else { "1" }, "{r:?}");
        if r[4] == "100" {
            assert_eq!(r[9], "1.000", "normalised to the 100% run: {r:?}");
        }
    }
    let faults = files
        .iter()
        .find(|(_, p)| p.ends_with("node0-pcache-faults.csv"))
        .map(|(_, p)| std::fs::read_to_string(p).unwrap())
        .unwrap_or_else(|| panic!("no fault-time CSV: {files:?}"));
    assert_eq!(faults.lines().count(), 1 + 2 * 8, "{faults}");
}

#[test]
fn pcache_two_copies_lose_nothing_when_a_memory_nodes_cable_is_pulled() {
    let pull = format!("--pull node2/1@{PULL_AFTER}");
    let attach = format!("pcache attach 1M --nodes {MEM1},{MEM2} --cache 25% --replicas 2 -t 120");
    let compute =
        format!("{attach}; pcache run gups --ops 8000; pcache stats; pcache detach; uptime");
    let (m1, m2) = (memory_node(300, Some(1)), memory_node(CUT_SERVE_S, None));
    let o = run_qemu(&[
        "--nodes",
        "3",
        "--emu-args",
        &pull,
        "--run-on",
        "0",
        &compute,
        "--run-on",
        "1",
        &m1,
        "--run-on",
        "2",
        &m2,
    ]);
    let all = format!("{}\n--- stderr ---\n{}", o.stdout, o.stderr);
    assert_eq!(o.status, 0, "{all}");
    let t = node(&o.stdout, 0);
    line_with(t, &attach, "replicas 2, cache 64 pages (25%)");
    // Nothing lost: the same checksum as on local memory, reads served by
    // the replica once node 2 was gone, writes to one copy.
    check_run(t, "pcache run gups --ops 8000", "gups");
    let stats = output(t, "pcache stats");
    let counters = stats.iter().find(|l| l.starts_with("pgfault ")).unwrap();
    assert!(field(counters, "fallbacks") > 0, "{counters}");
    assert!(field(counters, "degraded_writes") > 0, "{counters}");
    assert_eq!(field(counters, "errors"), 0, "{counters}");
    let n2 = stats.iter().find(|l| l.starts_with("node 1 ")).unwrap();
    assert!(
        n2.contains("DOWN (memory node unreachable: transport retry counter exceeded)"),
        "{n2}"
    );
    let n1 = stats.iter().find(|l| l.starts_with("node 0 ")).unwrap();
    assert!(n1.contains("): up,"), "{n1}");
    // The cable, not the node: node 2's port went down.
    assert!(node(&o.stdout, 2).contains("port 1 state: DOWN"), "{all}");
}

#[test]
fn pcache_one_copy_and_a_pulled_cable_end_the_workload_with_the_error_and_the_console_goes_on() {
    let pull = format!("--pull node2/1@{PULL_AFTER}");
    let attach = format!("pcache attach 1M --nodes {MEM1},{MEM2} --cache 25% -t 120");
    let again = format!("pcache attach 512K --nodes {MEM1} --cache 50% -t 60");
    let compute = format!(
        "{attach}; pcache run gups --ops 8000; pcache stats; pcache detach; {again}; pcache run sort; \
         pcache detach; uptime"
    );
    let (m1, m2) = (memory_node(300, Some(2)), memory_node(CUT_SERVE_S, None));
    let o = run_qemu(&[
        "--nodes",
        "3",
        "--emu-args",
        &pull,
        "--run-on",
        "0",
        &compute,
        "--run-on",
        "1",
        &m1,
        "--run-on",
        "2",
        &m2,
    ]);
    let all = format!("{}\n--- stderr ---\n{}", o.stdout, o.stderr);
    // The failed workload is the one command that fails.
    assert_eq!(o.status, 1, "{all}");
    assert!(
        o.stderr.contains("run-qemu.sh: node 0 failed (exit 1)"),
        "{all}"
    );
    assert!(
        !o.stderr.contains("node 1 failed") && !o.stderr.contains("node 2 failed"),
        "{all}"
    );
    let t = node(&o.stdout, 0);
    for bad in qemu::FATAL {
        assert!(!t.contains(bad), "{bad}: {t}");
    }
    let err = line_with(
        t,
        "pcache run gups --ops 8000",
        "pcache: gups on region 0 ended after ",
    );
    assert!(
        err.contains(
            "no usable copy; memory node 1 (0x0002c90300000031): memory node unreachable: \
             transport retry counter exceeded (completion status IB_WC_RETRY_EXC_ERR) [address 0x1000"
        ),
        "{err}"
    );
    assert!(
        err.contains(" could not be fetched: ") || err.contains(" could not be written back: "),
        "{err}"
    );
    // Which page: an odd one (node 1 holds the odd pages).
    let page = field(err, "page");
    assert_eq!(page % 2, 1, "{err}");
    // Within the deadline: the whole run (the pull comes some seconds in)
    // ended well before rmem's op_timeout could have stacked up.
    let ms = field(err, "ended after");
    assert!(ms < 60_000, "{err}");
    // The console goes on: the failure in the statistics, the region
    // detached, a new one on the node still up, a clean run on it.
    let stats = output(t, "pcache stats");
    assert!(
        stats
            .iter()
            .any(|l| l.starts_with(&format!("failed: page {page} "))),
        "{stats:#?}"
    );
    let counters = stats.iter().find(|l| l.starts_with("pgfault ")).unwrap();
    assert_eq!(field(counters, "errors"), 1, "{counters}");
    line_with(t, "pcache detach", "pcache: region 0 detached");
    line_with(
        t,
        &again,
        "512 KiB (128 pages) over 1 memory node(s) (0x0002c90300000021)",
    );
    check_run(t, "pcache run sort", "sort");
    assert!(
        output(t, "uptime").iter().any(|l| l.starts_with("up ")),
        "{t}"
    );
}
