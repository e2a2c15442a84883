//! Remote memory between QEMU guests, one command as a researcher runs it.
//!
//! `run-qemu.sh --nodes 3` with the default subnet manager (OpenSM), node 0 serving
//! 256 MiB (`rmem serve 256M`), nodes 1 and 2 connecting to its LID through the SA
//! and the CM. One boot covers: a pattern written and read back across 16 MiB of
//! the region with every byte checked; the two compute nodes filling their own
//! chunks with different bytes at the same time and each reading back only its own;
//! an access past the region refused by the card ("remote access error"); node 2's
//! cable pulled (cx3-emu `--pull`) while it probes, ending a read in "memory node
//! unreachable" within the client's deadline, its port DOWN; OpenSM never dropping
//! the memory node's port while it exported; `rmem bench --csv` on both compute
//! nodes, collected by run-qemu.sh under target/experiments/ and parsed here. Every
//! run has a deadline; QEMU and cx3-emu are ended by run-qemu.sh.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use tests::qemu::{self, root};

/// The whole boot; the memory node serves 240 s of it.
const DEADLINE: Duration = Duration::from_secs(420);

/// Node 0's port GUID (HCA i of the fabric has node GUID
/// 0x0002c903_0000_0000 + (i+1)*0x10, its port 1 that plus 1): the memory
/// node is named by it, not by a LID, which depends on the SM (OpenSM and
/// the embedded SM number the ports differently).
const MEM: &str = "0x0002c90300000011";

/// Node 2's cable is pulled once this much traffic has crossed it (cx3-emu
/// `--pull node2/1@16MiB`), not at a time: node 2's first part (connect,
/// a 1 MiB fill written and read back, the bench's 64-page fill and 400
/// page reads, MADs) moved about 6 MiB (2,578 probe reads of 4 KiB came
/// before the pull in a run), whatever the machine's load; then `rmem
/// probe -i 1` reads a page every millisecond until the pull makes one
/// fail. Node 2's order of events
/// thus never depends on how fast a loaded machine runs it.
const PULL_AFTER: &str = "16MiB";

/// The memory node serves this long (guest seconds from the end of its
/// export), past the pull: node 2's read must fail because of its cable,
/// not because the memory node went away (which looks the same to node 2;
/// its port going DOWN tells the two apart). It cannot end on its own
/// once its clients are gone: node 2, cut off, never says goodbye. The
/// one timing margin left: node 2 reached the pull 100 s into the run in
/// the slowest run seen (loaded 2-core machine, 24 connect retries while
/// node 0 exported), about 85 s into node 0's serving.
const SERVE_S: u32 = 240;

struct Outcome {
    status: i32,
    stdout: String,
    stderr: String,
    took: Duration,
}

fn run_qemu(args: &[&str]) -> Outcome {
    let t = Instant::now();
    let r = qemu::run_args(args, DEADLINE);
    Outcome {
        status: r.status,
        stdout: r.transcript,
        stderr: r.stderr,
        took: t.elapsed(),
    }
}

/// Node `n`'s transcript (between its `===== node N` line and the next).
fn node(out: &str, n: usize) -> &str {
    qemu::node(out, n).unwrap_or_else(|| panic!("node {n}'s transcript in:\n{out}"))
}

/// The output of `lego> CMD` up to the next prompt (kernel log lines
/// left out).
fn output<'a>(t: &'a str, cmd: &str) -> Vec<&'a str> {
    let Some(at) = t
        .find(&format!("lego> {cmd}\n"))
        .or_else(|| t.find(&format!("lego> {cmd}\r\n")))
    else {
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

fn expect_line(t: &str, cmd: &str, needle: &str) {
    let out = output(t, cmd);
    assert!(
        out.iter().any(|l| l.contains(needle)),
        "`{cmd}`: expected {needle:?} in {out:#?}\nwhole transcript:\n{t}"
    );
}

/// `rmem probe`'s failure: how many reads went well, and how many ms after
/// the last good one the failing read ended.
fn probe_outcome(line: &str) -> Option<(u64, u64)> {
    let (_, rest) = line.split_once(" (")?;
    let (good, rest) = rest.split_once(" reads of ")?;
    let (_, rest) = rest.split_once(" failed ")?;
    let (ms, _) = rest.split_once(" ms after")?;
    Some((good.parse().ok()?, ms.parse().ok()?))
}

/// The OpenSM log run-qemu.sh named (`subnet manager: OpenSM, log PATH
/// (...)`).
fn opensm_log(stderr: &str) -> Option<PathBuf> {
    let l = stderr
        .lines()
        .find_map(|l| l.strip_prefix("subnet manager: OpenSM, log "))?;
    Some(root().join(l.split_whitespace().next()?))
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

/// Checks a bench CSV: rmem's header, then one row per K with numbers.
fn check_bench_csv(path: &PathBuf, pattern: &str, ks: &[u64]) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(rmem::bench::BenchResult::CSV_HEADER),
        "{path:?}:\n{text}"
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), ks.len(), "{path:?}:\n{text}");
    for (row, &k) in rows.iter().zip(ks) {
        assert_eq!(row.len(), 11, "{path:?}: {row:?}");
        assert_eq!(row[0], pattern, "{path:?}: {row:?}");
        let v: Vec<u64> = row[1..]
            .iter()
            .map(|x| {
                x.parse()
                    .unwrap_or_else(|_| panic!("{path:?}: {x:?} in {row:?}"))
            })
            .collect();
        let (pages, iters, window, min, median, p99, p999, max, pps) =
            (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]);
        assert_eq!((pages, iters, window), (64, 200, k), "{path:?}: {row:?}");
        assert!(
            0 < min && min <= median && median <= p99 && p99 <= p999 && p999 <= max,
            "{path:?}: latencies out of order in {row:?}"
        );
        assert!(pps > 0, "{path:?}: no throughput in {row:?}");
    }
}

#[test]
fn rmem_three_guests_share_a_memory_node_with_data_checked_errors_and_csv() {
    let pull = format!("--pull node2/1@{PULL_AFTER}");
    let serve = format!("rmem serve 256M {SERVE_S} --clients 2");
    let node0 = format!("{serve}; rmem stats");
    let node1 = format!(
        "rmem connect {MEM} -t 120; rmem alloc 16M; rmem write @ 16M; rmem read @ 16M --check; \
                 rmem write @ 1M 0x11; rmem read @ 1M --check 0x11; \
                 rmem bench -n 64 --iters 200 -k 1,8 --csv; \
                 rmem read 0x10010000000 4096; rmem stats; rmem close"
    );
    let node2 = format!(
        "rmem connect {MEM} -t 120; rmem alloc 1M; rmem write @ 1M 0x22; rmem read @ 1M --check 0x22; \
         rmem bench -n 64 --iters 200 -k 1,8 --csv --seq; rmem probe @ -i 1 -t 300; rmem stats; rmem close"
    );
    // The default subnet manager: OpenSM.
    let o = run_qemu(&[
        "--nodes",
        "3",
        "--emu-args",
        &pull,
        "--run-on",
        "0",
        &node0,
        "--run-on",
        "1",
        &node1,
        "--run-on",
        "2",
        &node2,
    ]);
    let all = format!("{}\n--- stderr ---\n{}", o.stdout, o.stderr);
    eprintln!("the three guests took {:?}", o.took);
    // Nodes 1 and 2 each end with an expected failure (the refused access,
    // the pulled cable), so the run's status is 1 and both are named.
    assert_eq!(o.status, 1, "{all}");
    assert!(
        o.stderr.contains("run-qemu.sh: node 1 failed (exit 1)"),
        "{all}"
    );
    assert!(
        o.stderr.contains("run-qemu.sh: node 2 failed (exit 1)"),
        "{all}"
    );
    assert!(!o.stderr.contains("node 0 failed"), "{all}");
    assert!(!o.stderr.contains("did not finish"), "{all}");

    let (t0, t1, t2) = (node(&o.stdout, 0), node(&o.stdout, 1), node(&o.stdout, 2));
    // The memory node: 256 MiB exported at run-qemu.sh's default 512 MiB
    // of guest RAM; both compute nodes served.
    expect_line(t0, &serve, "rmem: serving 262144 KiB at 0x10000000000");
    // Both compute nodes served (compute nodes that got their region: a
    // connect attempt its slow guest gave up does not count).
    let served: u64 = output(t0, &serve)
        .iter()
        .find_map(|l| l.strip_prefix("rmem: ")?.split_once(" clients served"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary from the memory node:\n{t0}"));
    assert_eq!(served, 2, "{t0}");
    assert!(t0.contains("run: all commands succeeded"), "{t0}");

    // Node 1: connected through the SA and the CM, the pattern over 16 MiB.
    expect_line(
        t1,
        &format!("rmem connect {MEM} -t 120"),
        "connected to 0x0002c90300000011: region 0x10000000000..0x10010000000 (262144 KiB)",
    );
    expect_line(
        t1,
        "rmem read @ 16M --check",
        "read 16777216 bytes at 0x100",
    );
    expect_line(t1, "rmem read @ 16M --check", ": pattern ok");
    // Both compute nodes' fills, written at the same time, read back.
    expect_line(t1, "rmem read @ 1M --check 0x11", ": fill 0x11 ok");
    expect_line(t2, "rmem read @ 1M --check 0x22", ": fill 0x22 ok");
    let a1 = output(t1, "rmem alloc 16M");
    let a2 = output(t2, "rmem alloc 1M");
    assert_ne!(
        a1.first(),
        a2.first(),
        "two nodes got the same chunk: {a1:?} {a2:?}"
    );
    // The card refuses what lies past the region.
    expect_line(
        t1,
        "rmem read 0x10010000000 4096",
        "rmem: remote access error: the memory node refused 4096 bytes at 0x10010000000 (outside its exported region)",
    );
    expect_line(t1, "rmem stats", "errors 1");
    // Node 2's cable was pulled while it probed: a read fails with the
    // transport's retry exhaustion, not a hang, within the client's
    // deadline (its 5 s op_timeout would have reported a timeout instead).
    let failed = output(t2, "rmem probe @ -i 1 -t 300");
    let line = failed
        .iter()
        .find(|l| {
            l.starts_with("rmem: memory node unreachable: transport retry counter exceeded (")
        })
        .unwrap_or_else(|| {
            panic!("node 2's probe did not end in retry exhaustion: {failed:#?}\n{t2}")
        });
    let (good, ms) = probe_outcome(line).unwrap_or_else(|| panic!("{line:?}"));
    assert!(
        good >= 1,
        "the probe never read well before the pull: {line:?}"
    );
    assert!(
        ms < 10_000,
        "the pulled cable was noticed only after {ms} ms: {line:?}"
    );
    // The cable, not the memory node: node 2's port went down, node 0's
    // never did.
    assert!(t2.contains("mlx4_0: port 1 state: DOWN"), "{t2}");
    assert!(!t0.contains("port 1 state: DOWN"), "{t0}");
    expect_line(
        t2,
        "rmem stats",
        "connection failed: memory node unreachable",
    );
    // OpenSM never dropped the memory node's port, although it exported
    // 256 MiB while OpenSM swept the fabric (the export runs ib_core's
    // progress function, so its SMPs are answered). It did drop node 2's
    // (the pull) and node 1's (its guest had ended).
    let log =
        opensm_log(&o.stderr).unwrap_or_else(|| panic!("no OpenSM log named in:\n{}", o.stderr));
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{log:?}: {e}"));
    let dropped: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Removed port with GUID:0x0002c90300000011"))
        .collect();
    assert!(
        dropped.is_empty(),
        "OpenSM dropped the memory node's port: {dropped:#?}"
    );
    assert!(
        text.contains("Removed port with GUID:0x0002c90300000031"),
        "OpenSM did not see node 2's cable pulled ({log:?})"
    );

    // The experiment's CSV, one file per compute node.
    let files = csv_files(&o.stderr);
    let f1 = files.iter().find(|(n, _)| *n == 1).map(|(_, p)| p);
    let f2 = files.iter().find(|(n, _)| *n == 2).map(|(_, p)| p);
    let (f1, f2) = (f1.expect(&all), f2.expect(&all));
    assert!(f1.ends_with("node1-rmem-bench.csv"), "{f1:?}");
    assert!(f1.starts_with(root().join("target/experiments")), "{f1:?}");
    check_bench_csv(f1, "rand", &[1, 8]);
    check_bench_csv(f2, "seq", &[1, 8]);
    assert!(
        !files.iter().any(|(n, _)| *n == 0),
        "node 0 printed no CSV: {files:?}"
    );
}

#[test]
fn csv_blocks_are_collected_per_node_and_name() {
    let dir = std::env::temp_dir().join(format!("rmem-csv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("node1.log");
    std::fs::write(
        &log,
        "lego> rmem bench --csv\r\n--- csv begin rmem-bench ---\r\na,b\r\n\
         [    1.234567] kernel::hca: a log line in the middle\r\n1,2\r\n--- csv end ---\r\n\
         lego> rmem bench --csv\r\n--- csv begin rmem-bench ---\r\na,b\r\n3,4\r\n--- csv end ---\r\n\
         --- csv begin other ---\r\nx\r\n--- csv end ---\r\nnot,csv\r\n",
    )
    .unwrap();
    let out_dir = dir.join("exp");
    let o = Command::new(root().join("scripts/csv-collect.sh"))
        .args([log.to_str().unwrap(), out_dir.to_str().unwrap(), "node1"])
        .output()
        .expect("csv-collect.sh runs");
    assert!(o.status.success(), "{o:?}");
    let listed = String::from_utf8_lossy(&o.stdout);
    assert_eq!(listed.lines().count(), 2, "{listed}");
    assert_eq!(
        std::fs::read_to_string(out_dir.join("node1-rmem-bench.csv")).unwrap(),
        "a,b\n1,2\n3,4\n",
        "one header, log lines and carriage returns left out"
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("node1-other.csv")).unwrap(),
        "x\n"
    );
    // A transcript without a block writes nothing, not even the directory.
    let quiet = dir.join("node0.log");
    std::fs::write(&quiet, "lego> uptime\r\n").unwrap();
    let none = dir.join("none");
    let o = Command::new(root().join("scripts/csv-collect.sh"))
        .args([quiet.to_str().unwrap(), none.to_str().unwrap(), "node0"])
        .output()
        .unwrap();
    assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");
    assert!(!none.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
