//! DIAG_RPRT, the diagnostic counters report.
//!
//! Op_mod 2 (transport and CI error counters, what Linux's
//! `mlx4_query_diag_counters` reads for mlx4_ib's `hw_counters`), device-wide
//! (in_mod 0) or per port; other reports answer BAD_OP.
//!
//! The report is a 1 KiB mailbox of big-endian 32-bit counters (Linux reads
//! them at fixed offsets up to 0x104). The model counts none of these errors
//! yet (the data-path engines will), so every counter reads zero, which is
//! what a card that has seen no error reports.

use crate::hca::device::FwState::Initialized;
use crate::hca::device::Hca;
use crate::hca::fw::{CmdResult, Outcome, need};
use crate::hca::hcr::{Command, Status};

/// DIAG_RPRT op_mod: query transport and CI error counters.
pub const QUERY_TRANSPORT_CI_ERRORS: u8 = 2;
/// Size of the report written to the outbox.
pub const REPORT_LEN: usize = 0x400;

/// DIAG_RPRT: in_mod = port (0: the whole device).
pub fn diag_rprt(hca: &mut Hca, cmd: &Command) -> CmdResult {
    need(hca, &[Initialized])?;
    if cmd.op_mod != QUERY_TRANSPORT_CI_ERRORS {
        return Err(Status::BAD_OP);
    }
    if cmd.in_mod as usize > hca.ports.len() {
        return Err(Status::BAD_PARAM);
    }
    hca.dma_write(cmd.out_param, &[0u8; REPORT_LEN])?;
    Ok(Outcome::OK)
}
