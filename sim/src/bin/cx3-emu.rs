//! `cx3-emu`: serves the ConnectX-3 model to QEMU guests over ivshmem.
//!
//! Per `docs/ivshmem.md`, with the subnet manager `--sm` asks for (OpenSM as a
//! child process that ends with it, docs/peers.md); see [`sim::front::ivshmem`] for
//! the logic, [`sim::front::host::EmuArgs`] and `--help` for the command line.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use sim::front::host::{Log, usage_exit};
use sim::front::ivshmem::{Emulator, Exit, parse_args};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Release);
}

fn main() -> ExitCode {
    let (nodes, opts) = match parse_args(std::env::args_os().skip(1)) {
        Ok(parsed) => parsed,
        Err(e) => return usage_exit("cx3-emu", &e),
    };
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, handler) };
    }
    let stats = opts.host.stats;
    let mut emu = match Emulator::open(&nodes, opts, Log::stderr()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("cx3-emu: {e}");
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "cx3-emu: serving {} node(s): {}",
        emu.nodes().len(),
        nodes
            .iter()
            .map(|(w, r)| format!("{},{}", w.display(), r.display()))
            .collect::<Vec<_>>()
            .join(" ")
    );
    match (emu.opensm_pid(), emu.opensm_log(), emu.ibsim_sockname()) {
        (Some(pid), Some(log), Some(sock)) => eprintln!(
            "cx3-emu: OpenSM (pid {pid}) on host node smhost, log {}; diags: IBSIM_SOCKNAME={sock}",
            log.display()
        ),
        (_, _, Some(sock)) => {
            eprintln!("cx3-emu: ibsim server for the diags: IBSIM_SOCKNAME={sock}")
        }
        _ => {}
    }
    let why = emu.run(&STOP);
    let msg = match why {
        Exit::GuestsDone => "every guest has shut down".to_string(),
        Exit::Stopped => "signal".to_string(),
        Exit::ParentGone => "parent process gone".to_string(),
        Exit::PidsGone => "watched processes gone".to_string(),
    };
    eprintln!("cx3-emu: exiting: {msg}");
    emu.shutdown();
    if stats {
        eprint!("{}", emu.stats());
    }
    drop(emu);
    ExitCode::SUCCESS
}
