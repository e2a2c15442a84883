//! iproute2's `ip` and iputils' `ping` in the shell, over the kernel's IP stack.
//!
//! `ip` runs `net::iproute` on the stack; `ping` runs `net::ping`, polling
//! ib_core and the stack between its steps, each wait bounded by ping's own
//! deadlines (`-c` with `-W`, or `-w`), and Ctrl-C ends it with its
//! statistics, as SIGINT ends iputils' ping. A ping that got no reply
//! fails the command (for `run=` scripts and `retry`) with no line of its
//! own: iputils' statistics have said it.

use alloc::string::{String, ToString};
use core::fmt::Write;

use net::ping::{self, Ping};

use crate::console::CmdResult;

const NO_STACK: &str = "the IP stack is not up";

/// `ip`.
pub fn ip(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    crate::net::with_stack(|s| net::iproute::ip(s, args, out))
        .unwrap_or_else(|| Err(NO_STACK.to_string()))
}

/// `ping`.
pub fn ping(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let o = ping::parse(args)?;
    let now = crate::net::now_us;
    let mut p = crate::net::with(|s, _| Ping::start(s, o, now(), out)).ok_or(NO_STACK)??;
    loop {
        crate::hca::poll();
        let go = crate::net::with(|s, core| {
            s.poll(now(), core);
            p.step(s, now(), out)
        });
        if go != Some(true) {
            break;
        }
        if crate::console::ctrl_c() {
            let _ = writeln!(out, "^C");
            break;
        }
        core::hint::spin_loop();
    }
    match crate::net::with(|s, _| p.finish(s, out)) {
        Some(true) => Ok(()),
        Some(false) => Err(String::new()),
        None => Err(NO_STACK.to_string()),
    }
}
