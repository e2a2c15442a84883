//! `scripts/ib-host.sh`'s deadline, without a fabric.
//!
//! The script refuses at once when no fabric serves the socket name; here
//! a bare abstract socket of the right name stands for the fabric's
//! control socket, and a tool that never ends stands for a diag that
//! hangs in libumad2sim at exit after its query timed out (docs/peers.md):
//! the default deadline ends it within seconds, as a script needs. Skipped
//! where Debian's libumad2sim0 is not installed.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const PRELOAD: &str = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so";

/// A socket bound where the fabric's `<name>:ctl` would be (abstract,
/// with its trailing NUL, as umad2sim names it).
fn fake_fabric(name: &str) -> UnixDatagram {
    let addr = SocketAddr::from_abstract_name(format!("{name}:ctl\0").as_bytes())
        .expect("an abstract name");
    UnixDatagram::bind_addr(&addr).expect("bound")
}

fn ib_host(args: &[&str]) -> (Option<i32>, String, Duration) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let t = Instant::now();
    let out = Command::new(root.join("scripts/ib-host.sh"))
        .args(args)
        .output()
        .expect("ib-host.sh runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t.elapsed(),
    )
}

#[test]
fn a_diag_that_never_ends_is_ended_by_the_default_deadline() {
    if !Path::new(PRELOAD).exists() {
        eprintln!("skipped: {PRELOAD} is not installed (libumad2sim0)");
        return;
    }
    let name = format!("ib-host-test-{}", std::process::id());
    let _fabric = fake_fabric(&name);
    // `sleep 600` hangs as such a diag does.
    let (rc, err, took) = ib_host(&["--sock", &name, "sleep", "600"]);
    assert_eq!(rc, Some(124), "{err}");
    assert!(
        took < Duration::from_secs(30),
        "the default deadline is short enough for scripts: {took:?}"
    );
    assert!(
        err.contains("sleep ended after 20s") && err.contains("docs/peers.md"),
        "{err}"
    );
    // An explicit deadline wins.
    let (rc, err, took) = ib_host(&["--sock", &name, "--timeout", "1", "sleep", "600"]);
    assert_eq!(rc, Some(124), "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(err.contains("sleep ended after 1s"), "{err}");
}
