//! What the two host front ends (`cx3-emu`, `cx3-vfu`) share: the model
//! configuration of node N, the log their messages go to, the processes
//! they watch and the CPU time they report, and the values of the options
//! both command lines take.

use std::time::Duration;

use crate::front::in_process::SimConfig;
use crate::hca::hcr::{Opcode, Status};

/// The model configuration for node `id`: distinct node and system-image
/// GUIDs per node. (`cx3-emu` replaces the node GUID with the one its
/// fabric's topology gives HCA `id`; the vfio-user front end keeps this
/// one.)
pub fn node_config(id: u32) -> SimConfig {
    let guid = 0x0002_c903_00a1_b2c0 + (u64::from(id) << 8);
    SimConfig {
        node_guid: guid,
        sys_image_guid: guid + 3,
        dma_size: 4096,
        ..SimConfig::default()
    }
}

/// Where messages go: stderr, or a buffer (tests).
#[derive(Debug, Default)]
pub struct Log {
    capture: Option<Vec<String>>,
}

impl Log {
    /// Messages to stderr.
    pub fn stderr() -> Log {
        Log { capture: None }
    }
    /// Messages kept in memory.
    pub fn capture() -> Log {
        Log {
            capture: Some(Vec::new()),
        }
    }
    /// Emits one line.
    pub fn line(&mut self, s: String) {
        match &mut self.capture {
            Some(v) => {
                if v.len() < 100_000 {
                    v.push(s);
                }
            }
            None => eprintln!("{s}"),
        }
    }
    /// The captured lines (empty for stderr).
    pub fn lines(&self) -> &[String] {
        self.capture.as_deref().unwrap_or(&[])
    }
}

/// True while process `pid` exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(st) => st
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Sets this thread's timer slack to 1 ns so short sleeps are short.
pub fn set_timer_slack_1ns() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and touches no memory.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// User plus system CPU time of this process so far.
pub fn process_cpu_time() -> Duration {
    let mut ru = core::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a valid, writable rusage.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if r != 0 {
        return Duration::ZERO;
    }
    // SAFETY: getrusage succeeded and filled it (and zeroed is valid anyway).
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// `--fail CMD[=STATUS]` of both front ends (the status defaults to
/// INTERNAL_ERR).
pub fn parse_fail(value: &str) -> Result<(Opcode, Status), String> {
    let (c, st) = match value.split_once('=') {
        Some((c, st)) => (c, Some(st)),
        None => (value, None),
    };
    let op = parse_opcode(c).ok_or(format!("--fail: unknown command {c:?}"))?;
    let st = match st {
        Some(st) => parse_status(st).ok_or(format!("--fail: unknown status {st:?}"))?,
        None => Status::INTERNAL_ERR,
    };
    Ok((op, st))
}

/// `--catas-after SECONDS` of both front ends.
pub fn parse_catas_after(value: &str) -> Result<Duration, String> {
    value
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s >= 0.0 && *s < 1e9)
        .map(Duration::from_secs_f64)
        .ok_or(format!("--catas-after wants seconds, got {value:?}"))
}

/// `--watch-pid PID` of both front ends.
pub fn parse_watch_pid(value: &str) -> Result<u32, String> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or(format!("--watch-pid wants a process id, got {value:?}"))
}

/// A decimal or `0x` hexadecimal number.
pub fn parse_num(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// `RUN_FW`, `2ERR_QP`, `ERR_QP`, `0xff6`, `4086`.
pub fn parse_opcode(s: &str) -> Option<Opcode> {
    let up = s.trim().to_ascii_uppercase();
    if let Some(o) = Opcode::ALL.iter().find(|o| o.name() == up) {
        return Some(*o);
    }
    match up.as_str() {
        "ERR_QP" => return Some(Opcode::ERR_QP),
        "RST_QP" => return Some(Opcode::RST_QP),
        _ => {}
    }
    parse_num(s)
        .filter(|n| *n <= 0xfff)
        .map(|n| Opcode(n as u16))
}

/// `INTERNAL_ERR`, `CMD_STAT_BAD_PARAM`, `3`, `0x0c`.
pub fn parse_status(s: &str) -> Option<Status> {
    let up = s.trim().to_ascii_uppercase();
    let name = up.strip_prefix("CMD_STAT_").unwrap_or(&up);
    if let Some(st) = (0..=255u8).map(Status).find(|st| st.name() == name) {
        return Some(st);
    }
    parse_num(s).and_then(|n| u8::try_from(n).ok()).map(Status)
}
