//! The serial console shell.
//!
//! A line editor (backspace, Ctrl-U, Ctrl-C, history on the arrow keys; the
//! `line_edit` crate), typeahead kept while a command runs, the command table,
//! and the scripted mode behind `run-qemu.sh --run`, which runs commands from
//! the kernel command line and exits with success only if every one of them
//! succeeded.

mod commands;
mod diags;
mod ib;
mod lspci;
mod net;
mod opensm;
mod pcache;
mod perftest;
mod rmem;

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

use line_edit::{Done, LineEditor, Typeahead};

use crate::serial::{self, Console};

pub use line_edit::MAX_LINE;
const PROMPT: &str = "lego> ";

/// Outcome of a command: `Err` carries the message printed after the command's
/// name (`lspci: usage: ...`); an empty one fails silently (the command has
/// said why, as `ping` does with its statistics).
pub type CmdResult = Result<(), String>;

/// Whether the last command other than `status` succeeded (what `status`
/// prints, as a shell's `$?`: a script driving the console reads it).
static LAST_OK: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(true);

/// Whether the last command other than `status` succeeded.
pub fn last_succeeded() -> bool {
    LAST_OK.load(core::sync::atomic::Ordering::Relaxed)
}

/// Runs one command line; returns whether it succeeded.
pub fn execute(line: &str) -> bool {
    let ok = execute_inner(line);
    if line.split_whitespace().next() != Some("status") {
        LAST_OK.store(ok, core::sync::atomic::Ordering::Relaxed);
    }
    ok
}

fn execute_inner(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some((&name, args)) = words.split_first() else {
        return true;
    };
    let mut out = Console;
    match commands::find(name) {
        Some(cmd) => match (cmd.run)(&mut out, args) {
            Ok(()) => true,
            Err(msg) => {
                if !msg.is_empty() {
                    let _ = writeln!(out, "{name}: {msg}");
                }
                false
            }
        },
        None => {
            let _ = writeln!(out, "{name}: command not found (type 'help' for the list)");
            false
        }
    }
}

/// Runs `;`-separated commands as if typed, echoing each after the prompt.
/// Returns true if all succeeded. Stops at a command that never returns
/// (poweroff, reboot, crash).
pub fn run_script(script: &str) -> bool {
    let mut ok = true;
    for cmd in script.split(';').map(str::trim).filter(|c| !c.is_empty()) {
        crate::println!("{PROMPT}{cmd}");
        if !execute(cmd) {
            ok = false;
        }
    }
    ok
}

/// Bytes typed while a command runs, for the next prompt.
static TYPEAHEAD: spin::Mutex<Typeahead> = spin::Mutex::new(Typeahead::new());

/// Whether Ctrl-C was typed since the last look: what a running command
/// calls while it waits. Every other byte waiting on the serial line is
/// kept for the next prompt (a Ctrl-C discards those typed before it).
pub fn ctrl_c() -> bool {
    let mut t = TYPEAHEAD.lock();
    let mut hit = false;
    while let Some(b) = serial::try_read() {
        hit |= t.take(b);
    }
    hit
}

/// The next input byte: typeahead first, then the serial line.
fn next_byte() -> Option<u8> {
    TYPEAHEAD.lock().pop().or_else(serial::try_read)
}

/// The interactive shell; never returns. `idle` runs whenever no input waits
/// (the progress loop: drivers' event queues are polled from here).
pub fn shell(mut idle: impl FnMut()) -> ! {
    let mut ed = LineEditor::new();
    let mut echo = |s: &str| serial::write_str(s);
    serial::write_str(PROMPT);
    loop {
        let Some(b) = next_byte() else {
            idle();
            core::hint::spin_loop();
            continue;
        };
        let Some(done) = ed.feed(b, &mut echo) else {
            continue;
        };
        match done {
            Done::Run(cmd) => {
                execute(&cmd);
            }
            Done::TooLong => {
                crate::println!("error: line too long (at most {MAX_LINE} characters); discarded")
            }
            Done::Empty | Done::Cancelled => {}
        }
        let dropped = TYPEAHEAD.lock().take_dropped();
        if dropped > 0 {
            crate::println!("({dropped} characters typed during the command were dropped)");
        }
        serial::write_str(PROMPT);
    }
}
