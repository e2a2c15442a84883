//! `cx3-vfu`: serves the ConnectX-3 model as a PCI function (15b3:1003) to a
//! QEMU `vfio-user-pci` client, per `docs/vfio-user.md`; see [`sim::vfu`]
//! for the logic and `--help` for the command line.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use sim::ivshmem::Log;
use sim::vfu::{Cli, Exit, Function, USAGE, irqs, parse_args, regions, serve};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Release);
}

fn main() -> ExitCode {
    let (socket, node, opts) = match parse_args(std::env::args().skip(1)) {
        Ok(Cli::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Cli::Run { socket, node, opts }) => (socket, node, opts),
        Err(e) => {
            eprintln!("cx3-vfu: {e}");
            return ExitCode::from(2);
        }
    };
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, handler) };
    }
    let stats = opts.stats;
    let server = match vfio_user::Server::new(&socket, true, irqs(), regions()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cx3-vfu: {}: cannot listen: {e}", socket.display());
            return ExitCode::from(2);
        }
    };
    let f = Function::new(node, opts, Log::stderr());
    eprintln!(
        "cx3-vfu: serving node{node} as 15b3:1003 on {}",
        socket.display()
    );
    let why = serve(&f, server, &STOP);
    let msg = match why {
        Exit::ClientGone => "client disconnected",
        Exit::Stopped => "signal",
        Exit::ParentGone => "parent process gone",
        Exit::PidsGone => "watched processes gone",
    };
    eprintln!("cx3-vfu: exiting: {msg}");
    if stats {
        eprint!("{}", f.stats());
    }
    // The server thread may still block in accept or recv: the socket file is
    // removed here, and the process exit ends the thread.
    let _ = std::fs::remove_file(&socket);
    ExitCode::SUCCESS
}
