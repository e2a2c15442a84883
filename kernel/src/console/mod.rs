//! The serial console shell.
//!
//! A line editor (backspace, Ctrl-U, Ctrl-C, history on the arrow keys), the
//! command table, and the scripted mode behind `run-qemu.sh --run`, which runs
//! commands from the kernel command line and exits with success only if every one
//! of them succeeded.

mod commands;
mod diags;
mod ib;
mod lspci;
mod opensm;
mod pcache;
mod perftest;
mod rmem;

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

use crate::serial::{self, Console};

/// Longest command line accepted.
pub const MAX_LINE: usize = 256;
const HISTORY: usize = 32;
const PROMPT: &str = "lego> ";

/// Outcome of a command: `Err` carries the message printed after the command's
/// name (`lspci: usage: ...`).
pub type CmdResult = Result<(), String>;

/// Runs one command line; returns whether it succeeded.
pub fn execute(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some((&name, args)) = words.split_first() else {
        return true;
    };
    let mut out = Console;
    let ok = match commands::find(name) {
        Some(cmd) => match (cmd.run)(&mut out, args) {
            Ok(()) => true,
            Err(msg) => {
                let _ = writeln!(out, "{name}: {msg}");
                false
            }
        },
        None => {
            let _ = writeln!(out, "{name}: command not found (type 'help' for the list)");
            false
        }
    };
    // Port transitions that happened while the command held the adapters.
    crate::hca::log_port_events();
    ok
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

enum Key {
    Char(u8),
    Enter,
    Backspace,
    KillLine,
    Cancel,
    Up,
    Down,
    Ignore,
}

/// Decodes input bytes, including the VT100 arrow-key sequences.
struct Decoder {
    esc: u8,
}

impl Decoder {
    fn feed(&mut self, b: u8) -> Key {
        match (self.esc, b) {
            (0, 0x1b) => {
                self.esc = 1;
                Key::Ignore
            }
            (1, b'[') => {
                self.esc = 2;
                Key::Ignore
            }
            (2, b) => {
                self.esc = 0;
                match b {
                    b'A' => Key::Up,
                    b'B' => Key::Down,
                    _ => Key::Ignore,
                }
            }
            (1, _) => {
                self.esc = 0;
                Key::Ignore
            }
            (_, b'\r' | b'\n') => Key::Enter,
            (_, 0x7f | 0x08) => Key::Backspace,
            (_, 0x15) => Key::KillLine,
            (_, 0x03) => Key::Cancel,
            (_, b) if (0x20..0x7f).contains(&b) => Key::Char(b),
            _ => Key::Ignore,
        }
    }
}

/// The interactive shell; never returns. `idle` runs whenever no input waits
/// (the progress loop: drivers' event queues are polled from here).
pub fn shell(mut idle: impl FnMut()) -> ! {
    let mut history: Vec<String> = Vec::new();
    let mut line = String::new();
    let mut too_long = false;
    let mut hist_pos = 0usize;
    let mut dec = Decoder { esc: 0 };
    let mut last_was_cr = false;
    serial::write_str(PROMPT);
    loop {
        let Some(b) = serial::try_read() else {
            idle();
            core::hint::spin_loop();
            continue;
        };
        // CR LF from a terminal is one Enter.
        if b == b'\n' && last_was_cr {
            last_was_cr = false;
            continue;
        }
        last_was_cr = b == b'\r';
        let key = dec.feed(b);
        match key {
            Key::Char(c) => {
                if line.len() < MAX_LINE {
                    line.push(c as char);
                    serial::write_str(core::str::from_utf8(&[c]).unwrap_or("?"));
                } else {
                    too_long = true;
                }
            }
            Key::Backspace => {
                if line.pop().is_some() {
                    serial::write_str("\x08 \x08");
                }
            }
            Key::KillLine => {
                for _ in 0..line.len() {
                    serial::write_str("\x08 \x08");
                }
                line.clear();
            }
            Key::Cancel => {
                serial::write_str("^C\n");
                line.clear();
                too_long = false;
                serial::write_str(PROMPT);
            }
            Key::Up | Key::Down => {
                let up = matches!(key, Key::Up);
                let next = if up {
                    hist_pos.checked_sub(1)
                } else {
                    (hist_pos < history.len()).then_some(hist_pos + 1)
                };
                if let Some(p) = next {
                    hist_pos = p;
                    for _ in 0..line.len() {
                        serial::write_str("\x08 \x08");
                    }
                    line = history.get(p).cloned().unwrap_or_default();
                    serial::write_str(&line);
                }
            }
            Key::Enter => {
                serial::write_str("\n");
                if too_long {
                    crate::println!(
                        "error: line too long (at most {MAX_LINE} characters); discarded"
                    );
                } else {
                    let cmd = line.trim();
                    if !cmd.is_empty() {
                        if history.last().is_none_or(|h| h != cmd) {
                            if history.len() == HISTORY {
                                history.remove(0);
                            }
                            history.push(String::from(cmd));
                        }
                        execute(cmd);
                    }
                }
                line.clear();
                too_long = false;
                hist_pos = history.len();
                serial::write_str(PROMPT);
            }
            Key::Ignore => {}
        }
    }
}
