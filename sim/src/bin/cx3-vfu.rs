//! `cx3-vfu`: serves the ConnectX-3 model as PCI functions over vfio-user.
//!
//! `cx3-vfu`: serves the ConnectX-3 model as PCI functions (15b3:1003), one
//! per socket and all on one emulated fabric with its subnet manager, to
//! QEMU `vfio-user-pci` clients, per `docs/vfio-user.md`; see [`sim::front::vfu`]
//! for the logic, [`sim::front::host::VfuArgs`] and `--help` for the
//! command line.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use sim::front::host::{Log, usage_exit};
use sim::front::vfu::{Exit, Fleet, irqs, parse_args};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Release);
}

fn main() -> ExitCode {
    let (sockets, node, opts) = match parse_args(std::env::args_os().skip(1)) {
        Ok(parsed) => parsed,
        Err(e) => return usage_exit("cx3-vfu", &e),
    };
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, handler) };
    }
    let stats = opts.host.stats;
    let mut servers = Vec::new();
    let remove_all = |n: usize| {
        for s in &sockets[..n] {
            let _ = std::fs::remove_file(s);
        }
    };
    // Another server's socket: refused before the fabric and its SM start.
    if let Some(s) = sockets.iter().find(|s| s.exists()) {
        eprintln!("cx3-vfu: {}: cannot listen: the path exists", s.display());
        return ExitCode::from(2);
    }
    // The functions first: each announces its own BAR2 file.
    let mut fleet = match Fleet::open(sockets.len(), node, opts, |_| Log::stderr()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cx3-vfu: {e}");
            return ExitCode::from(2);
        }
    };
    for (s, f) in sockets.iter().zip(fleet.functions()) {
        match vfio_user::Server::new(s, true, irqs(), f.regions()) {
            Ok(v) => servers.push(v),
            Err(e) => {
                eprintln!("cx3-vfu: {}: cannot listen: {e}", s.display());
                remove_all(servers.len());
                return ExitCode::from(2);
            }
        }
    }
    for (f, s) in fleet.functions().iter().zip(&sockets) {
        eprintln!(
            "cx3-vfu: serving node{} as 15b3:1003 on {}",
            f.id(),
            s.display()
        );
    }
    if let Some(log) = fleet.opensm_log() {
        eprintln!(
            "cx3-vfu: OpenSM runs on the fabric; its log: {}",
            log.display()
        );
    }
    let why = fleet.serve(servers, &STOP);
    let msg = match why {
        Exit::ClientGone if sockets.len() == 1 => "client disconnected",
        Exit::ClientGone => "every client disconnected",
        Exit::Stopped => "signal",
        Exit::ParentGone => "parent process gone",
        Exit::PidsGone => "watched processes gone",
    };
    eprintln!("cx3-vfu: exiting: {msg}");
    if stats {
        eprint!("{}", fleet.stats());
    }
    drop(fleet);
    // A server thread may still block in accept or recv: the socket files
    // are removed here, and the process exit ends the threads.
    remove_all(sockets.len());
    ExitCode::SUCCESS
}
