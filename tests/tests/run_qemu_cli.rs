//! `run-qemu.sh`'s command line as a newcomer meets it.
//!
//! Without booting anything: `--help` and unknown options print exactly the usage
//! text, missing and bad option values end with a clear message and status 2, sizes
//! are converted the way QEMU reads them.

use std::process::{Command, Output};

use tests::qemu::root;

fn script(args: &[&str]) -> Output {
    Command::new(root().join("run-qemu.sh"))
        .args(args)
        .output()
        .expect("run-qemu.sh runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The usage text as the script holds it (its heredoc).
fn usage_text() -> String {
    let src = std::fs::read_to_string(root().join("run-qemu.sh")).unwrap();
    let start = src.find("<<'USAGE'\n").expect("the usage is a heredoc") + "<<'USAGE'\n".len();
    let len = src[start..].find("\nUSAGE\n").expect("end of the heredoc") + 1;
    src[start..start + len].to_string()
}

const USAGE_LINE: &str = "Usage: ./run-qemu.sh [options] [-- QEMU options]";

/// Bash's own complaints a user must never see.
fn assert_no_bash_noise(s: &str) {
    for noise in [
        "parameter null or not set",
        "unbound variable",
        "set -euo pipefail",
        "here=",
        "line ",
        "syntax error",
    ] {
        assert!(!s.contains(noise), "{noise:?} in:\n{s}");
    }
}

#[test]
fn help_prints_exactly_the_usage_text() {
    let u = usage_text();
    assert!(u.starts_with(USAGE_LINE), "{u}");
    assert!(u.contains("TCG by default"), "{u}");
    assert!(!u.contains("KVM if usable"), "{u}");
    for flag in ["--help", "-h"] {
        let o = script(&[flag]);
        assert_eq!(o.status.code(), Some(0), "{flag}");
        assert_eq!(text(&o.stdout), u, "{flag}");
        assert_eq!(text(&o.stderr), "", "{flag}");
    }
}

#[test]
fn an_unknown_option_prints_its_name_and_the_usage_text() {
    let o = script(&["--bogus", "--dry-run"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(text(&o.stdout), "");
    assert_eq!(
        text(&o.stderr),
        format!("run-qemu.sh: unknown option '--bogus'\n{}", usage_text())
    );
}

#[test]
fn an_option_without_its_argument_prints_the_usage_line() {
    for opt in [
        "--run",
        "--vfio",
        "--nodes",
        "--emu-args",
        "--append",
        "--memory",
        "--timeout",
    ] {
        let o = script(&[opt]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{opt}: {err}");
        assert!(
            err.starts_with(&format!(
                "run-qemu.sh: {opt} needs an argument\n{USAGE_LINE}\n"
            )),
            "{opt}: {err}"
        );
        assert_no_bash_noise(&err);
        assert_eq!(text(&o.stdout), "", "{opt}");
    }
}

#[test]
fn bad_option_values_are_refused_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["--memory", "10"], "--memory takes 64M to 64G"),
        (&["--memory", "10K"], "--memory takes 64M to 64G"),
        (&["--memory", "lots"], "--memory takes 64M to 64G"),
        (&["--memory", "65G"], "--memory takes 64M to 64G"),
        (&["--memory", ""], "--memory takes 64M to 64G"),
        (&["--timeout", "0"], "--timeout takes whole seconds"),
        (&["--timeout", "-5"], "--timeout takes whole seconds"),
        (&["--timeout", "1.5"], "--timeout takes whole seconds"),
        (&["--timeout", "100000"], "--timeout takes whole seconds"),
        (&["--nodes", "0"], "--nodes takes 1 to 8"),
        (&["--nodes", "9"], "--nodes takes 1 to 8"),
        (&["--nodes", "two"], "--nodes takes 1 to 8"),
        (
            &["--nodes", "2", "--no-hca"],
            "--nodes needs the emulated HCA",
        ),
        (
            &["--no-hca", "--emu-args", "--fail RUN_FW"],
            "--emu-args needs the emulated HCA",
        ),
        (&["--vfio", "04:00"], "--vfio wants a full PCI address"),
        (&["--run", ""], "--run needs at least one command"),
        (&["--run", " ; "], "--run needs at least one command"),
        (
            &["--run", "echo 'x'"],
            "--run commands cannot contain single quotes",
        ),
        (
            &["--append", "log=\"debug\""],
            "--append text cannot contain quotes",
        ),
    ];
    for (args, msg) in cases {
        let mut a = args.to_vec();
        a.push("--dry-run");
        let o = script(&a);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with(&format!("run-qemu.sh: {msg}")),
            "{args:?}: {err}"
        );
        assert!(err.contains(USAGE_LINE), "{args:?}: {err}");
        assert_no_bash_noise(&err);
        assert_eq!(text(&o.stdout), "", "{args:?}: nothing may start");
    }
}

#[test]
fn memory_sizes_reach_qemu_and_the_shared_ram_file_alike() {
    // QEMU reads a bare number as MiB; so does the script.
    for (given, mib) in [("512", 512), ("64M", 64), ("1G", 1024), ("2g", 2048)] {
        let o = script(&["--memory", given, "--dry-run"]);
        let out = text(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{given}: {}", text(&o.stderr));
        assert!(out.contains(&format!(" -m {mib}M ")), "{given}: {out}");
        assert!(
            out.contains(&format!("memory-backend-file,id=ram0,size={mib}M,")),
            "{given}: {out}"
        );
    }
}

/// The QEMU lines a dry run prints, in node order (the emulator's line
/// left out): the system's QEMU, or for `--vfu` the one scripts/qemu-vfu.sh
/// fetched under `target/`, named by its path.
fn qemu_lines(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| {
            l.split(' ')
                .next()
                .is_some_and(|cmd| cmd.rsplit('/').next() == Some("qemu-system-x86_64"))
        })
        .collect()
}

/// The `-serial` value of one QEMU line.
fn serial_of(line: &str) -> &str {
    let at = line.find(" -serial ").expect("a -serial option") + " -serial ".len();
    line[at..].split(' ').next().unwrap()
}

#[test]
fn a_multi_node_dry_run_prints_the_consoles_the_run_gives() {
    let root = root().canonicalize().unwrap();
    let root = root.to_str().unwrap();
    // (extra arguments, the node logs' name)
    for (mode, name) in [(&[][..], "node"), (&["--vfu"][..], "vfu-node")] {
        // Interactive: node 0 on this terminal, the others in files.
        let mut a = mode.to_vec();
        a.extend(["--nodes", "3", "--dry-run", "--no-build"]);
        let o = script(&a);
        let out = text(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{a:?}: {}", text(&o.stderr));
        let lines = qemu_lines(&out);
        assert_eq!(lines.len(), 3, "{a:?}: {out}");
        assert_eq!(serial_of(lines[0]), "mon:stdio", "{a:?}: node 0\n{out}");
        for (i, l) in lines.iter().enumerate().skip(1) {
            assert_eq!(
                serial_of(l),
                format!("file:{root}/target/nodes/{name}{i}.log"),
                "{a:?}: node {i}\n{out}"
            );
        }
        // Scripted: every console in the run's own directory.
        a.extend(["--run", "uptime"]);
        let o = script(&a);
        let out = text(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{a:?}: {}", text(&o.stderr));
        let lines = qemu_lines(&out);
        assert_eq!(lines.len(), 3, "{a:?}: {out}");
        let dir0 = serial_of(lines[0])
            .strip_suffix(&format!("/{name}0.log"))
            .unwrap_or_else(|| panic!("{a:?}: node 0\n{out}"))
            .to_string();
        assert!(dir0.starts_with("file:/"), "{a:?}: {out}");
        assert_ne!(dir0, format!("file:{root}/target/nodes"), "{a:?}: {out}");
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(
                serial_of(l),
                format!("{dir0}/{name}{i}.log"),
                "{a:?}: node {i}\n{out}"
            );
        }
    }
    // One node: this terminal, with the monitor unless scripted.
    for (args, want) in [
        (&["--vfu", "--dry-run"][..], "mon:stdio"),
        (&["--vfu", "--run", "uptime", "--dry-run"][..], "stdio"),
        (&["--dry-run", "--no-build"][..], "mon:stdio"),
        (&["--run", "uptime", "--dry-run", "--no-build"][..], "stdio"),
    ] {
        let o = script(args);
        let out = text(&o.stdout);
        let lines = qemu_lines(&out);
        assert_eq!(lines.len(), 1, "{args:?}: {out}");
        assert_eq!(serial_of(lines[0]), want, "{args:?}: {out}");
    }
}

/// QEMU's exit status -> the run's, as `scripts/nodes.sh` maps it for
/// both paths (run-qemu.sh's ivshmem nodes are our kernel; vfu-run.sh maps
/// each node by its kind), checked by calling the function the scripts
/// call.
fn qemu_status(st: u32, kind: &str, scripted: bool) -> String {
    let nodes_sh = root().join("scripts/nodes.sh");
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -euo pipefail; . '{}'; scripted={}; qemu_status {st} {kind}",
            nodes_sh.display(),
            u8::from(scripted)
        ))
        .output()
        .expect("bash runs");
    assert!(o.status.success(), "{}", text(&o.stderr));
    text(&o.stdout).trim().to_string()
}

#[test]
fn a_guest_exit_status_means_the_same_on_the_ivshmem_and_vfio_user_paths() {
    for scripted in [false, true] {
        for kind in ["lego", "linux"] {
            assert_eq!(qemu_status(33, kind, scripted), "0", "{kind}: success");
            assert_eq!(qemu_status(35, kind, scripted), "1", "{kind}: failure");
            assert_eq!(qemu_status(124, kind, scripted), "124", "{kind}: timeout");
            assert_eq!(qemu_status(137, kind, scripted), "124", "{kind}: killed");
        }
    }
    // Our kernel's `reboot` ends QEMU (-no-reboot) with its own 0: a
    // success whether it ran on ivshmem (tests/qemu_boot.rs) or vfio-user.
    assert_eq!(qemu_status(0, "lego", true), "0");
    assert_eq!(qemu_status(0, "lego", false), "0");
    // A scripted Linux guest leaves through isa-debug-exit; its 0 is a
    // panic (panic=-1 resets) and fails the run.
    assert_eq!(qemu_status(0, "linux", true), "1");
    assert_eq!(qemu_status(0, "linux", false), "0");
    // Both scripts map through it.
    for s in ["run-qemu.sh", "scripts/vfu-run.sh"] {
        let src = std::fs::read_to_string(root().join(s)).unwrap();
        assert!(src.contains("    qemu_status \"$1\" "), "{s}");
    }
}
