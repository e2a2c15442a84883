//! The firmware: one handler per command opcode.
//!
//! Grouped by area, each validating the device state and its inputs and answering
//! with the status the card uses; SR-IOV, Ethernet, DDR/LAM and the other
//! diagnostic commands answer BAD_OP.
//!
//! | module | commands |
//! |---|---|
//! | [`init`] | QUERY_FW, MAP_FA, UNMAP_FA, RUN_FW, MOD_STAT_CFG, QUERY_DEV_CAP, QUERY_ADAPTER, SET_ICM_SIZE, MAP_ICM_AUX, UNMAP_ICM_AUX, MAP_ICM, UNMAP_ICM, INIT_HCA, CLOSE_HCA, QUERY_HCA, NOP |
//! | [`res`] | SW2HW/HW2SW/QUERY for EQ, CQ, MPT, SRQ; MAP_EQ; MODIFY_CQ; WRITE_MTT; ARM_SRQ |
//! | [`qp`] | RST2INIT, INIT2INIT, INIT2RTR, RTR2RTS, RTS2RTS, SQERR2RTS, RTS2SQD, SQD2RTS, SQD2SQD, 2ERR, 2RST, QUERY_QP, CONF_SPECIAL_QP |
//! | [`port`] | QUERY_PORT, SENSE_PORT, INIT_PORT, CLOSE_PORT, SET_PORT, MAD_IFC |
//! | [`diag`] | DIAG_RPRT (transport/CI error counters) |
//! | [`mcg`] | MGID_HASH, READ_MCG, WRITE_MCG (the multicast group table) |
//!
//! State gates (the card's behaviour as the PRM describes it): before RUN_FW
//! only QUERY_FW and MAP_FA work; between RUN_FW and INIT_HCA the
//! configuration commands; after INIT_HCA the resource commands. Anything
//! else is BAD_SYS_STATE.

pub mod diag;
pub mod init;
pub mod mcg;
pub mod port;
pub mod qp;
pub mod res;

use crate::hca::device::{FwState, Hca};
use crate::hca::hcr::{Command, Opcode, Status};

/// What a command produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Completion status.
    pub status: Status,
    /// Immediate output (written to HCR dwords 3..4).
    pub imm_out: Option<u64>,
}

impl Outcome {
    /// Success, nothing returned in the HCR.
    pub const OK: Outcome = Outcome {
        status: Status::OK,
        imm_out: None,
    };
    /// Completion with `s`.
    pub fn status(s: Status) -> Outcome {
        Outcome {
            status: s,
            imm_out: None,
        }
    }
    /// Success with an immediate result.
    pub fn imm(v: u64) -> Outcome {
        Outcome {
            status: Status::OK,
            imm_out: Some(v),
        }
    }
}

/// Handler result.
pub type CmdResult = Result<Outcome, Status>;

/// Requires one of the firmware states.
pub fn need(hca: &Hca, states: &[FwState]) -> Result<(), Status> {
    if states.contains(&hca.fw) {
        Ok(())
    } else {
        Err(Status::BAD_SYS_STATE)
    }
}

/// Runs one command.
pub fn execute(hca: &mut Hca, cmd: &Command) -> Outcome {
    let r = match cmd.opcode {
        Opcode::QUERY_FW => init::query_fw(hca, cmd),
        Opcode::MAP_FA => init::map_fa(hca, cmd),
        Opcode::UNMAP_FA => init::unmap_fa(hca, cmd),
        Opcode::RUN_FW => init::run_fw(hca, cmd),
        Opcode::MOD_STAT_CFG => init::mod_stat_cfg(hca, cmd),
        Opcode::QUERY_DEV_CAP => init::query_dev_cap(hca, cmd),
        Opcode::QUERY_ADAPTER => init::query_adapter(hca, cmd),
        Opcode::SET_ICM_SIZE => init::set_icm_size(hca, cmd),
        Opcode::MAP_ICM_AUX => init::map_icm_aux(hca, cmd),
        Opcode::UNMAP_ICM_AUX => init::unmap_icm_aux(hca, cmd),
        Opcode::MAP_ICM => init::map_icm(hca, cmd),
        Opcode::UNMAP_ICM => init::unmap_icm(hca, cmd),
        Opcode::INIT_HCA => init::init_hca(hca, cmd),
        Opcode::CLOSE_HCA => init::close_hca(hca, cmd),
        Opcode::QUERY_HCA => init::query_hca(hca, cmd),
        Opcode::NOP => init::nop(hca, cmd),
        Opcode::SW2HW_EQ => res::sw2hw_eq(hca, cmd),
        Opcode::HW2SW_EQ => res::hw2sw_eq(hca, cmd),
        Opcode::QUERY_EQ => res::query_eq(hca, cmd),
        Opcode::MAP_EQ => res::map_eq(hca, cmd),
        Opcode::SW2HW_CQ => res::sw2hw_cq(hca, cmd),
        Opcode::HW2SW_CQ => res::hw2sw_cq(hca, cmd),
        Opcode::QUERY_CQ => res::query_cq(hca, cmd),
        Opcode::MODIFY_CQ => res::modify_cq(hca, cmd),
        Opcode::SW2HW_MPT => res::sw2hw_mpt(hca, cmd),
        Opcode::HW2SW_MPT => res::hw2sw_mpt(hca, cmd),
        Opcode::QUERY_MPT => res::query_mpt(hca, cmd),
        Opcode::WRITE_MTT => res::write_mtt(hca, cmd),
        Opcode::SW2HW_SRQ => res::sw2hw_srq(hca, cmd),
        Opcode::HW2SW_SRQ => res::hw2sw_srq(hca, cmd),
        Opcode::QUERY_SRQ => res::query_srq(hca, cmd),
        Opcode::ARM_SRQ => res::arm_srq(hca, cmd),
        Opcode::RST2INIT_QP
        | Opcode::INIT2INIT_QP
        | Opcode::INIT2RTR_QP
        | Opcode::RTR2RTS_QP
        | Opcode::RTS2RTS_QP
        | Opcode::SQERR2RTS_QP
        | Opcode::RTS2SQD_QP
        | Opcode::SQD2RTS_QP
        | Opcode::SQD2SQD_QP
        | Opcode::ERR_QP
        | Opcode::RST_QP => qp::modify(hca, cmd),
        Opcode::QUERY_QP => qp::query_qp(hca, cmd),
        Opcode::CONF_SPECIAL_QP => qp::conf_special_qp(hca, cmd),
        Opcode::QUERY_PORT => port::query_port(hca, cmd),
        Opcode::SENSE_PORT => port::sense_port(hca, cmd),
        Opcode::INIT_PORT => port::init_port(hca, cmd),
        Opcode::CLOSE_PORT => port::close_port(hca, cmd),
        Opcode::SET_PORT => port::set_port(hca, cmd),
        Opcode::MAD_IFC => port::mad_ifc(hca, cmd),
        Opcode::DIAG_RPRT => diag::diag_rprt(hca, cmd),
        Opcode::MGID_HASH => mcg::mgid_hash(hca, cmd),
        Opcode::READ_MCG => mcg::read_mcg(hca, cmd),
        Opcode::WRITE_MCG => mcg::write_mcg(hca, cmd),
        _ => Err(Status::BAD_OP),
    };
    r.unwrap_or_else(Outcome::status)
}
