//! The command trace.
//!
//! One [`TraceEntry`] per command the firmware executed, with opcode name,
//! modifiers, status and duration; doorbells and DMA are not traced here
//! (violations and DMA faults have their own logs).

use core::fmt;
use core::time::Duration;

use crate::hca::hcr::{Opcode, Status};

/// One executed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    /// Opcode number.
    pub opcode: u16,
    /// Opcode name (Linux spelling, e.g. `"QUERY_FW"`, `"2RST_QP"`).
    pub name: &'static str,
    /// Input modifier.
    pub in_mod: u32,
    /// Opcode modifier.
    pub op_mod: u8,
    /// Input parameter as posted.
    pub in_param: u64,
    /// Output parameter: the immediate result if the command has one, else
    /// the out-mailbox address as posted.
    pub out_param: u64,
    /// Completion status byte.
    pub status: u8,
    /// Token as posted.
    pub token: u16,
    /// Event completion was requested.
    pub event: bool,
    /// When GO was seen, on the model clock.
    pub at: Duration,
    /// Time from GO to completion on the model clock; `None` while the
    /// command has not completed (e.g. a stuck GO fault).
    pub duration: Option<Duration>,
    /// The status came from fault injection, not from the model's checks.
    pub injected: bool,
}

impl TraceEntry {
    /// The completion status.
    pub fn status(&self) -> Status {
        Status(self.status)
    }
    /// The opcode.
    pub fn op(&self) -> Opcode {
        Opcode(self.opcode)
    }
    /// Completed successfully.
    pub fn ok(&self) -> bool {
        self.status == 0 && self.duration.is_some()
    }
}

impl fmt::Display for TraceEntry {
    /// `QUERY_PORT(0x043) in_mod=0x1 op_mod=0 -> OK(0x00) 12us`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}({:#05x}) in_mod={:#x} op_mod={} -> {}",
            self.name,
            self.opcode,
            self.in_mod,
            self.op_mod,
            self.status()
        )?;
        match self.duration {
            Some(d) => write!(f, " {}us", d.as_micros())?,
            None => f.write_str(" (GO still set)")?,
        }
        if self.injected {
            f.write_str(" [injected]")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_reads_like_a_log_line() {
        let e = TraceEntry {
            opcode: 0x43,
            name: Opcode(0x43).name(),
            in_mod: 1,
            op_mod: 0,
            in_param: 0,
            out_param: 0x1000,
            status: 0,
            token: 0xffff,
            event: false,
            at: Duration::from_millis(3),
            duration: Some(Duration::from_micros(12)),
            injected: false,
        };
        assert_eq!(
            e.to_string(),
            "QUERY_PORT(0x043) in_mod=0x1 op_mod=0 -> OK(0x00) 12us"
        );
        let stuck = TraceEntry {
            duration: None,
            status: 3,
            injected: true,
            ..e
        };
        assert!(
            stuck
                .to_string()
                .ends_with("BAD_PARAM(0x03) (GO still set) [injected]")
        );
        assert!(!stuck.ok());
    }
}
