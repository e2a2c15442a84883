//! Two guests, one command: `run-qemu.sh --run-on N CMDS`.
//!
//! Two guests, one command: `run-qemu.sh --run-on N CMDS` gives each node its own
//! script (next to `--run` for all), prints every node's transcript and exits 0
//! only if every node's script succeeded; the RDMA tools themselves (perftest,
//! diags) join these tests once the kernel runs them (mlx4_ib, the CM and an SM on
//! main).

use std::time::Duration;

use tests::qemu;

/// A run takes seconds; the deadline only bounds a hang.
const DEADLINE: Duration = Duration::from_secs(90);

fn script(args: &[&str]) -> (i32, String, String) {
    let r = qemu::script(args);
    (r.status, r.transcript, r.stderr)
}

/// The `run="..."` each QEMU of a dry run boots with, in node order.
fn dry_run_scripts(args: &[&str]) -> Vec<String> {
    let mut a = vec!["--no-build", "--dry-run"];
    a.extend_from_slice(args);
    let (st, out, err) = script(&a);
    assert_eq!(st, 0, "{out}{err}");
    out.lines()
        .filter(|l| l.starts_with("qemu-system-x86_64"))
        .map(|l| {
            let at = l.find("-append ").expect("a kernel command line") + "-append ".len();
            let rest = &l[at..];
            let end = rest.find(" -serial").unwrap_or(rest.len());
            rest[..end].replace('\\', "")
        })
        .collect()
}

#[test]
fn each_node_boots_with_its_own_script() {
    let s = dry_run_scripts(&[
        "--nodes",
        "2",
        "--run-on",
        "0",
        "ib_write_bw",
        "--run-on",
        "1",
        "ib_write_bw 1",
    ]);
    // Each node's IPoIB address comes first (run-qemu.sh: 10.0.0.<N+1>/24).
    assert_eq!(
        s,
        [
            "ip=ib0:10.0.0.1/24 run=\"ib_write_bw\"",
            "ip=ib0:10.0.0.2/24 run=\"ib_write_bw 1\""
        ]
    );
    // --run for the nodes without their own.
    let s = dry_run_scripts(&["--nodes", "3", "--run", "uptime", "--run-on", "1", "lspci"]);
    assert_eq!(
        s,
        [
            "ip=ib0:10.0.0.1/24 run=\"uptime\"",
            "ip=ib0:10.0.0.2/24 run=\"lspci\"",
            "ip=ib0:10.0.0.3/24 run=\"uptime\""
        ]
    );
    // --append comes along on every node.
    let s = dry_run_scripts(&["--append", "log=debug", "--run-on", "0", "uptime"]);
    assert_eq!(s, ["log=debug ip=ib0:10.0.0.1/24 run=\"uptime\""]);
    // An ip= of --append's own replaces the default address.
    let s = dry_run_scripts(&["--append", "ip=ib0:10.9.0.1/16", "--run-on", "0", "uptime"]);
    assert_eq!(s, ["ip=ib0:10.9.0.1/16 run=\"uptime\""]);
}

#[test]
fn bad_run_on_is_refused_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--run-on", "0"],
            "--run-on needs a node number and its commands",
        ),
        (
            &["--run-on", "x", "uptime"],
            "--run-on takes a node number 0 to 7",
        ),
        (
            &["--run-on", "8", "uptime"],
            "--run-on takes a node number 0 to 7",
        ),
        (
            &["--run-on", "1", "uptime"],
            "--run-on 1: there are only 1 node(s)",
        ),
        (
            &["--nodes", "2", "--run-on", "0", "uptime"],
            "node 1 has no script: give --run-on 1 CMDS",
        ),
        (
            &["--run-on", "0", "a", "--run-on", "0", "b"],
            "--run-on 0 given twice",
        ),
        (
            &["--run-on", "0", " ; "],
            "--run-on 0 needs at least one command",
        ),
        (
            &["--run-on", "0", "echo 'x'"],
            "--run-on commands cannot contain quotes",
        ),
        (
            &["--iso", "--run-on", "0", "uptime"],
            "--run-on boots nodes with -kernel",
        ),
    ];
    for (args, msg) in cases {
        let mut a = vec!["--no-build", "--dry-run"];
        a.extend_from_slice(args);
        let (st, out, err) = script(&a);
        assert_eq!(st, 2, "{args:?}: {out}{err}");
        assert!(err.contains(msg), "{args:?}: expected {msg:?} in {err}");
        assert!(
            !out.contains("qemu-system"),
            "{args:?} must boot nothing: {out}"
        );
    }
}

#[test]
fn two_guests_run_their_own_scripts_and_every_transcript_is_printed() {
    // Node 0 runs --run's commands, node 1 its own.
    let r = qemu::run(
        "ibv_devinfo",
        &["--nodes", "2", "--run-on", "1", "uptime; lspci"],
        DEADLINE,
    );
    assert_eq!(r.status, 0, "{}\n{}", r.transcript, r.stderr);
    let n0 = r
        .transcript
        .find("===== node 0 (exit 0) =====")
        .expect("node 0 first");
    let n1 = r
        .transcript
        .find("===== node 1 (exit 0) =====")
        .expect("node 1 after");
    assert!(n0 < n1, "{}", r.transcript);
    let (t0, t1) = (&r.transcript[n0..n1], &r.transcript[n1..]);
    assert!(
        t0.contains("lego> ibv_devinfo") && t0.contains("hca_id:"),
        "{t0}"
    );
    assert!(!t0.contains("lego> lspci"), "{t0}");
    assert!(
        t1.contains("lego> uptime") && t1.contains("lego> lspci"),
        "{t1}"
    );
    assert!(!t1.contains("lego> ibv_devinfo"), "{t1}");

    // Only --run-on, one node failing: exit 1, both transcripts, the
    // failing node named.
    let qemu::Run {
        status: st,
        transcript: out,
        stderr: err,
    } = qemu::run_args(
        &[
            "--nodes",
            "2",
            "--run-on",
            "0",
            "uptime",
            "--run-on",
            "1",
            "no_such_command",
        ],
        DEADLINE,
    );
    assert_eq!(st, 1, "{out}\n{err}");
    assert!(out.contains("===== node 0 (exit 0) ====="), "{out}");
    assert!(out.contains("===== node 1 (exit 1) ====="), "{out}");
    assert!(out.contains("no_such_command: command not found"), "{out}");
    assert!(err.contains("run-qemu.sh: node 1 failed (exit 1)"), "{err}");
    assert!(!err.contains("node 0 failed"), "{err}");
}
