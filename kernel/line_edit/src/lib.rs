//! The console shell's line editor and the typeahead kept while a command runs.
//!
//! Bytes from the serial line become editing keys ([`Decoder`]: printable
//! characters, Enter, Backspace, Ctrl-U, Ctrl-C, the VT100 arrow keys),
//! and the [`LineEditor`] turns keys into a line, echo and history. While a
//! command runs, the kernel reads the serial line only to look for Ctrl-C;
//! every other byte goes into the [`Typeahead`], which the shell replays
//! into the editor at the next prompt, as a terminal's typeahead reaches a
//! Unix shell. A Ctrl-C discards the typeahead as well as interrupting the
//! command, as a tty flushes its input on SIGINT. Left out: echo while the
//! command runs (the characters appear after the next prompt), line
//! editing beyond the end of the line (no cursor movement), UTF-8.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;

/// Longest command line accepted.
pub const MAX_LINE: usize = 256;
/// Lines kept in the history.
pub const HISTORY: usize = 32;
/// Bytes kept while a command runs (beyond, they are dropped): a few lines.
pub const TYPEAHEAD: usize = 4 * MAX_LINE;
/// The byte Ctrl-C sends.
pub const CTRL_C: u8 = 0x03;

/// An editing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// A printable ASCII character.
    Char(u8),
    /// CR or LF (a CR LF pair is one Enter).
    Enter,
    /// DEL or BS.
    Backspace,
    /// Ctrl-U.
    KillLine,
    /// Ctrl-C.
    Cancel,
    /// The up arrow (ESC [ A).
    Up,
    /// The down arrow (ESC [ B).
    Down,
    /// Anything else (other controls, other escape sequences).
    Ignore,
}

/// Decodes input bytes, including the VT100 arrow-key sequences.
#[derive(Debug, Default)]
pub struct Decoder {
    esc: u8,
    last_was_cr: bool,
}

impl Decoder {
    /// The key `b` completes, if any.
    pub fn feed(&mut self, b: u8) -> Key {
        // CR LF from a terminal is one Enter.
        let after_cr = core::mem::replace(&mut self.last_was_cr, b == b'\r');
        if b == b'\n' && after_cr {
            return Key::Ignore;
        }
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
            (_, CTRL_C) => Key::Cancel,
            (_, b) if (0x20..0x7f).contains(&b) => Key::Char(b),
            _ => Key::Ignore,
        }
    }
}

/// What a byte fed to the editor completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// A line to run (trimmed, not empty; already in the history).
    Run(String),
    /// An empty line: a new prompt.
    Empty,
    /// A line longer than [`MAX_LINE`]: discarded, with a message.
    TooLong,
    /// Ctrl-C at the prompt: the line is dropped, a new prompt.
    Cancelled,
}

/// The line being typed, and the history.
#[derive(Debug, Default)]
pub struct LineEditor {
    dec: Decoder,
    line: String,
    too_long: bool,
    history: Vec<String>,
    hist_pos: usize,
}

/// Erases `n` echoed characters.
fn rub_out(n: usize, echo: &mut dyn FnMut(&str)) {
    for _ in 0..n {
        echo("\x08 \x08");
    }
}

impl LineEditor {
    /// An empty line and history.
    pub fn new() -> LineEditor {
        LineEditor::default()
    }

    /// The line typed so far.
    pub fn line(&self) -> &str {
        &self.line
    }

    /// The history, oldest first.
    pub fn history(&self) -> &[String] {
        &self.history
    }

    /// Feeds one byte; `echo` gets what the terminal should show. Returns
    /// what the byte completed, if anything (the caller prints the next
    /// prompt after it).
    pub fn feed(&mut self, b: u8, echo: &mut dyn FnMut(&str)) -> Option<Done> {
        let key = self.dec.feed(b);
        match key {
            Key::Char(c) => {
                if self.line.len() < MAX_LINE {
                    self.line.push(char::from(c));
                    let mut buf = [0u8; 4];
                    echo(char::from(c).encode_utf8(&mut buf));
                } else {
                    self.too_long = true;
                }
                None
            }
            Key::Backspace => {
                if self.line.pop().is_some() {
                    rub_out(1, echo);
                }
                None
            }
            Key::KillLine => {
                rub_out(self.line.len(), echo);
                self.line.clear();
                None
            }
            Key::Cancel => {
                echo("^C\n");
                self.reset();
                Some(Done::Cancelled)
            }
            Key::Up | Key::Down => {
                let next = if key == Key::Up {
                    self.hist_pos.checked_sub(1)
                } else {
                    (self.hist_pos < self.history.len()).then_some(self.hist_pos + 1)
                };
                if let Some(p) = next {
                    self.hist_pos = p;
                    rub_out(self.line.len(), echo);
                    self.line = self.history.get(p).cloned().unwrap_or_default();
                    echo(&self.line);
                }
                None
            }
            Key::Enter => {
                echo("\n");
                let done = if self.too_long {
                    Done::TooLong
                } else {
                    let cmd = self.line.trim();
                    if cmd.is_empty() {
                        Done::Empty
                    } else {
                        if self.history.last().is_none_or(|h| h != cmd) {
                            if self.history.len() == HISTORY {
                                self.history.remove(0);
                            }
                            self.history.push(String::from(cmd));
                        }
                        Done::Run(String::from(cmd))
                    }
                };
                self.reset();
                Some(done)
            }
            Key::Ignore => None,
        }
    }

    fn reset(&mut self) {
        self.line.clear();
        self.too_long = false;
        self.hist_pos = self.history.len();
    }
}

/// Bytes typed while a command runs, kept for the next prompt.
#[derive(Debug, Default)]
pub struct Typeahead {
    bytes: VecDeque<u8>,
    dropped: usize,
}

impl Typeahead {
    /// Nothing kept.
    pub const fn new() -> Typeahead {
        Typeahead {
            bytes: VecDeque::new(),
            dropped: 0,
        }
    }

    /// A byte that arrived while a command runs: true for Ctrl-C, which
    /// interrupts the command and discards what was typed before it; any
    /// other byte is kept (up to [`TYPEAHEAD`] of them).
    pub fn take(&mut self, b: u8) -> bool {
        if b == CTRL_C {
            self.bytes.clear();
            return true;
        }
        if self.bytes.len() < TYPEAHEAD {
            self.bytes.push_back(b);
        } else {
            self.dropped += 1;
        }
        false
    }

    /// The oldest byte kept, for the editor.
    pub fn pop(&mut self) -> Option<u8> {
        self.bytes.pop_front()
    }

    /// True if nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Bytes dropped because the typeahead was full, since the last call.
    pub fn take_dropped(&mut self) -> usize {
        core::mem::take(&mut self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn feed_all(ed: &mut LineEditor, bytes: &[u8], shown: &mut String) -> Vec<Done> {
        bytes
            .iter()
            .filter_map(|&b| ed.feed(b, &mut |s| shown.push_str(s)))
            .collect()
    }

    #[test]
    fn keys_decode_as_a_terminal_sends_them() {
        let mut d = Decoder::default();
        let keys: Vec<Key> = b"a\x7f\x08\x15\x03\x1b[A\x1b[B\x1b[C\x1bx\x01"
            .iter()
            .map(|&b| d.feed(b))
            .filter(|k| *k != Key::Ignore)
            .collect();
        assert_eq!(
            keys,
            [
                Key::Char(b'a'),
                Key::Backspace,
                Key::Backspace,
                Key::KillLine,
                Key::Cancel,
                Key::Up,
                Key::Down,
            ][..],
            "ESC [ C and ESC x are ignored whole"
        );
        // CR LF is one Enter; a lone LF or CR is one too.
        let enters = b"\r\n\n\r"
            .iter()
            .filter(|&&b| d.feed(b) == Key::Enter)
            .count();
        assert_eq!(enters, 3);
    }

    #[test]
    fn editing_history_and_long_lines() {
        let mut ed = LineEditor::new();
        let mut shown = String::new();
        let done = feed_all(&mut ed, b"ibstatt\x7f\r\n", &mut shown);
        assert_eq!(done, [Done::Run("ibstat".to_string())]);
        assert_eq!(shown, "ibstatt\x08 \x08\n");
        let done = feed_all(&mut ed, b"  \r", &mut shown);
        assert_eq!(done, [Done::Empty]);
        feed_all(&mut ed, b"lspci\r", &mut shown);
        // Up twice: the first line again; Ctrl-U clears it.
        let done = feed_all(&mut ed, b"\x1b[A\x1b[A", &mut shown);
        assert!(done.is_empty());
        assert_eq!(ed.line(), "ibstat");
        feed_all(&mut ed, b"\x15", &mut shown);
        assert_eq!(ed.line(), "");
        // Ctrl-C at the prompt drops the line.
        let done = feed_all(&mut ed, b"sminf\x03", &mut shown);
        assert_eq!(done, [Done::Cancelled]);
        assert_eq!(ed.line(), "");
        let long = [b'x'; MAX_LINE + 1];
        let done = feed_all(&mut ed, &long, &mut shown);
        assert!(done.is_empty());
        let done = feed_all(&mut ed, b"\r", &mut shown);
        assert_eq!(done, [Done::TooLong]);
        assert_eq!(ed.history(), ["ibstat", "lspci"]);
    }

    #[test]
    fn typeahead_reaches_the_next_prompt_and_ctrl_c_still_interrupts() {
        // While a command runs: "sminfo\r" typed, then the first letters
        // of the one after.
        let mut t = Typeahead::new();
        let interrupted = b"sminfo\ribst".iter().any(|&b| t.take(b));
        assert!(!interrupted, "ordinary typing does not interrupt");
        // At the next prompt the editor gets them: one line to run, and
        // the start of the next one on the line, echoed.
        let mut ed = LineEditor::new();
        let mut shown = String::new();
        let mut done = Vec::new();
        while let Some(b) = t.pop() {
            done.extend(ed.feed(b, &mut |s| shown.push_str(s)));
        }
        assert_eq!(done, [Done::Run("sminfo".to_string())]);
        assert_eq!(ed.line(), "ibst");
        assert_eq!(shown, "sminfo\nibst");
        // Ctrl-C while a command runs: interrupts, and what was typed
        // before it is gone (a tty flushes its input on SIGINT); what
        // comes after it is kept.
        assert!(!t.take(b'l'));
        assert!(t.take(CTRL_C), "Ctrl-C interrupts");
        assert!(t.is_empty());
        assert!(!t.take(b'x'));
        assert_eq!((t.pop(), t.pop()), (Some(b'x'), None));
        // Bounded: a runaway paste loses its tail, counted.
        for _ in 0..TYPEAHEAD + 3 {
            t.take(b'y');
        }
        assert_eq!(t.take_dropped(), 3);
        assert_eq!(t.take_dropped(), 0);
    }
}
