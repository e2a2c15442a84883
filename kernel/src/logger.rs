//! The `log` backend: the serial console and the `dmesg` ring.
//!
//! The `log` backend: every record goes to the serial console and into a ring
//! buffer that `dmesg` prints, filtered by a default level plus per-module
//! rules (`log=info,mlx4_core::cmd=trace`).
//!
//! Lines look like dmesg's: `[    0.012345] kernel::pci: message`, with the
//! level named for anything other than info. Nothing here allocates, so the
//! logger works before the heap exists and from the exception path.

use core::fmt::{self, Write};
use log::{Level, LevelFilter, Metadata, Record};

const RING_SIZE: usize = 64 * 1024;
const MAX_RULES: usize = 16;
const MAX_TARGET: usize = 48;

#[derive(Clone, Copy)]
struct Rule {
    target: [u8; MAX_TARGET],
    len: usize,
    level: LevelFilter,
}

struct Filter {
    default: LevelFilter,
    rules: [Option<Rule>; MAX_RULES],
}

impl Filter {
    fn level_for(&self, target: &str) -> LevelFilter {
        // Longest matching module prefix wins.
        let mut best: Option<(usize, LevelFilter)> = None;
        for r in self.rules.iter().flatten() {
            let t = &r.target[..r.len];
            let b = target.as_bytes();
            let matches =
                b.starts_with(t) && (b.len() == t.len() || b[t.len()..].starts_with(b"::"));
            if matches && best.is_none_or(|(l, _)| r.len > l) {
                best = Some((r.len, r.level));
            }
        }
        best.map_or(self.default, |(_, l)| l)
    }

    fn max(&self) -> LevelFilter {
        self.rules
            .iter()
            .flatten()
            .map(|r| r.level)
            .fold(self.default, core::cmp::max)
    }
}

struct Ring {
    buf: [u8; RING_SIZE],
    /// Total bytes ever written; the ring holds the last `RING_SIZE`.
    written: usize,
}

impl Ring {
    fn push(&mut self, s: &[u8]) {
        for &b in s {
            self.buf[self.written % RING_SIZE] = b;
            self.written += 1;
        }
    }
}

struct KernelLogger {
    filter: spin::Mutex<Filter>,
    ring: spin::Mutex<Ring>,
}

static LOGGER: KernelLogger = KernelLogger {
    filter: spin::Mutex::new(Filter {
        default: LevelFilter::Info,
        rules: [None; MAX_RULES],
    }),
    ring: spin::Mutex::new(Ring {
        buf: [0; RING_SIZE],
        written: 0,
    }),
};

/// A fixed-size line buffer; text past its end is dropped and marked.
struct Line {
    buf: [u8; 512],
    len: usize,
    cut: bool,
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        self.cut |= n < s.len();
        Ok(())
    }
}

impl log::Log for KernelLogger {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= self.filter.lock().level_for(m.target())
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let us = crate::time::uptime_us();
        let mut line = Line {
            buf: [0; 512],
            len: 0,
            cut: false,
        };
        let level = match record.level() {
            Level::Info => "",
            Level::Error => "ERROR ",
            Level::Warn => "WARN ",
            Level::Debug => "DEBUG ",
            Level::Trace => "TRACE ",
        };
        let _ = write!(
            line,
            "[{:5}.{:06}] {}{}: {}",
            us / 1_000_000,
            us % 1_000_000,
            level,
            record.target(),
            record.args()
        );
        if line.cut {
            line.len = line.buf.len() - 4;
            let _ = line.write_str("...");
        }
        let _ = line.write_str("\n");
        let text = &line.buf[..line.len];
        self.ring.lock().push(text);
        crate::serial::write_str(core::str::from_utf8(text).unwrap_or("<log line not UTF-8>\n"));
    }

    fn flush(&self) {}
}

/// Installs the logger with the filter from the `log=` command-line value.
pub fn init(spec: Option<&str>) {
    let _ = log::set_logger(&LOGGER);
    if let Some(spec) = spec
        && let Err(e) = set_filter(spec)
    {
        crate::println!("log: {e}; keeping level info");
    }
    log::set_max_level(LOGGER.filter.lock().max());
}

fn parse_level(s: &str) -> Option<LevelFilter> {
    Some(match s {
        "off" => LevelFilter::Off,
        "error" => LevelFilter::Error,
        "warn" => LevelFilter::Warn,
        "info" => LevelFilter::Info,
        "debug" => LevelFilter::Debug,
        "trace" => LevelFilter::Trace,
        _ => return None,
    })
}

/// Applies a filter spec: comma-separated `LEVEL` (the default) and
/// `module::path=LEVEL` rules. Validates everything before changing anything.
pub fn set_filter(spec: &str) -> Result<(), &'static str> {
    let mut f = LOGGER.filter.lock();
    let mut next = Filter {
        default: f.default,
        rules: f.rules,
    };
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match item.split_once('=') {
            None => {
                next.default = parse_level(item)
                    .ok_or("unknown level (off, error, warn, info, debug, trace)")?
            }
            Some((target, level)) => {
                let level = parse_level(level)
                    .ok_or("unknown level (off, error, warn, info, debug, trace)")?;
                if target.is_empty() || target.len() > MAX_TARGET {
                    return Err("module path empty or too long");
                }
                let slot = next
                    .rules
                    .iter()
                    .position(|r| r.is_some_and(|r| &r.target[..r.len] == target.as_bytes()))
                    .or_else(|| next.rules.iter().position(Option::is_none))
                    .ok_or("too many per-module rules (16)")?;
                let mut t = [0; MAX_TARGET];
                t[..target.len()].copy_from_slice(target.as_bytes());
                next.rules[slot] = Some(Rule {
                    target: t,
                    len: target.len(),
                    level,
                });
            }
        }
    }
    *f = next;
    log::set_max_level(f.max());
    Ok(())
}

fn level_name(l: LevelFilter) -> &'static str {
    match l {
        LevelFilter::Off => "off",
        LevelFilter::Error => "error",
        LevelFilter::Warn => "warn",
        LevelFilter::Info => "info",
        LevelFilter::Debug => "debug",
        LevelFilter::Trace => "trace",
    }
}

/// The filter in the spec syntax, for `log` without arguments.
pub fn describe(out: &mut dyn Write) -> fmt::Result {
    let f = LOGGER.filter.lock();
    out.write_str(level_name(f.default))?;
    for r in f.rules.iter().flatten() {
        let t = core::str::from_utf8(&r.target[..r.len]).unwrap_or("?");
        write!(out, ",{}={}", t, level_name(r.level))?;
    }
    Ok(())
}

/// Calls `f` with the ring's contents, oldest first, starting at a line
/// boundary.
pub fn with_dmesg(mut f: impl FnMut(&[u8])) {
    let ring = LOGGER.ring.lock();
    if ring.written <= RING_SIZE {
        f(&ring.buf[..ring.written]);
        return;
    }
    let start = ring.written % RING_SIZE;
    let (tail, head) = ring.buf.split_at(start);
    // Skip the partial line the wrap cut.
    let skip = head
        .iter()
        .position(|&b| b == b'\n')
        .map_or(head.len(), |p| p + 1);
    f(&head[skip..]);
    f(tail);
}
