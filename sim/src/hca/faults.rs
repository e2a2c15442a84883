//! Fault injection: per-opcode status overrides, stuck GO bits and extra
//! completion delay, absurd QUERY_DEV_CAP values, corrupt EQEs; packet-level
//! faults belong to the fabric ([`crate::fabric::faults`]).
//!
//! A [`FaultPlan`] is set through a front end (`SimHca::faults`); the firmware
//! consults it on every command. Injected statuses are applied *after* the
//! command's checks but *instead of* its effects, so the device state is as
//! if the card had refused the command.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::hca::hcr::{Opcode, Status};

/// What to do to one opcode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpcodeFault {
    /// Complete with this status instead of executing.
    pub status: Option<Status>,
    /// GO never clears (the command never completes).
    pub stuck: bool,
    /// Extra HCR status reads before GO clears (synchronous mode).
    pub extra_polls: u32,
    /// Extra time before GO clears (both modes, on the model clock).
    pub extra_delay: Duration,
    /// Apply only this many times, then forget (`None` = always).
    pub times: Option<u32>,
}

impl OpcodeFault {
    /// Complete with `status` instead of executing.
    pub fn status(s: Status) -> OpcodeFault {
        OpcodeFault {
            status: Some(s),
            ..Default::default()
        }
    }
    /// Never clear GO.
    pub fn stuck() -> OpcodeFault {
        OpcodeFault {
            stuck: true,
            ..Default::default()
        }
    }
    /// Delay completion by `polls` extra status reads and `delay` time.
    pub fn delay(polls: u32, delay: Duration) -> OpcodeFault {
        OpcodeFault {
            extra_polls: polls,
            extra_delay: delay,
            ..Default::default()
        }
    }
    /// Apply only `n` times.
    pub fn times(self, n: u32) -> OpcodeFault {
        OpcodeFault {
            times: Some(n),
            ..self
        }
    }
}

/// Absurd capability values QUERY_DEV_CAP can be made to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadCap {
    /// Log max QPs of 0x1f (2^31 QPs).
    HugeLogMaxQps,
    /// Zero ports.
    NoPorts,
    /// Log min page size of 16 (64 KiB pages; Linux requires <= 4 KiB).
    MinPageTooLarge,
    /// A QPC entry size of zero.
    ZeroQpcEntrySize,
    /// UAR BAR size field claiming 1 TiB.
    HugeUarSize,
    /// Overwrite one byte of the mailbox.
    Byte {
        /// Offset in the QUERY_DEV_CAP mailbox.
        offset: usize,
        /// Value written there.
        value: u8,
    },
}

/// How to corrupt the next EQE the model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EqeCorruption {
    /// Write the owner bit with the wrong parity (the EQE stays "HW-owned").
    WrongOwner,
    /// Replace the event type with an undefined one (0x3f).
    BadType,
    /// Garbage in the event data (CQN/QPN fields all ones).
    GarbageData,
}

/// All faults currently armed.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// Per-opcode faults.
    pub opcodes: BTreeMap<u16, OpcodeFault>,
    /// QUERY_DEV_CAP reports these absurd values.
    pub bad_caps: Vec<BadCap>,
    /// The next EQEs written are corrupted this way (one per EQE).
    pub corrupt_eqes: Vec<EqeCorruption>,
}

impl FaultPlan {
    /// Arms `fault` for `op`.
    pub fn set(&mut self, op: Opcode, fault: OpcodeFault) {
        self.opcodes.insert(op.0, fault);
    }
    /// Disarms everything for `op`.
    pub fn clear(&mut self, op: Opcode) {
        self.opcodes.remove(&op.0);
    }
    /// The fault for `op`, consuming one use.
    pub(crate) fn take(&mut self, op: Opcode) -> Option<OpcodeFault> {
        let f = self.opcodes.get_mut(&op.0)?;
        let out = *f;
        if let Some(n) = &mut f.times {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.opcodes.remove(&op.0);
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_faults_expire() {
        let mut p = FaultPlan::default();
        p.set(Opcode::NOP, OpcodeFault::status(Status::BAD_OP).times(2));
        assert!(p.take(Opcode::NOP).is_some());
        assert!(p.take(Opcode::NOP).is_some());
        assert!(p.take(Opcode::NOP).is_none());
        p.set(Opcode::QUERY_FW, OpcodeFault::stuck());
        for _ in 0..5 {
            assert!(p.take(Opcode::QUERY_FW).unwrap().stuck);
        }
        p.clear(Opcode::QUERY_FW);
        assert!(p.take(Opcode::QUERY_FW).is_none());
    }
}
