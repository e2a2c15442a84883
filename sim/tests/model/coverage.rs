//! The issue's "done when": every command runs on its success path and is
//! refused at least once, checked from the model's own trace.

use crate::harness::profile::*;
use crate::harness::*;
use sim::{Opcode, Status};

const ISSUE_COMMANDS: [Opcode; 41] = [
    Opcode::QUERY_FW,
    Opcode::MAP_FA,
    Opcode::UNMAP_FA,
    Opcode::RUN_FW,
    Opcode::MOD_STAT_CFG,
    Opcode::QUERY_DEV_CAP,
    Opcode::QUERY_PORT,
    Opcode::SET_ICM_SIZE,
    Opcode::MAP_ICM_AUX,
    Opcode::UNMAP_ICM_AUX,
    Opcode::MAP_ICM,
    Opcode::UNMAP_ICM,
    Opcode::INIT_HCA,
    Opcode::CLOSE_HCA,
    Opcode::QUERY_ADAPTER,
    Opcode::QUERY_HCA,
    Opcode::INIT_PORT,
    Opcode::CLOSE_PORT,
    Opcode::SET_PORT,
    Opcode::SW2HW_EQ,
    Opcode::HW2SW_EQ,
    Opcode::SW2HW_CQ,
    Opcode::HW2SW_CQ,
    Opcode::SW2HW_MPT,
    Opcode::HW2SW_MPT,
    Opcode::SW2HW_SRQ,
    Opcode::HW2SW_SRQ,
    Opcode::MAP_EQ,
    Opcode::NOP,
    Opcode::WRITE_MTT,
    Opcode::RST2INIT_QP,
    Opcode::INIT2INIT_QP,
    Opcode::INIT2RTR_QP,
    Opcode::RTR2RTS_QP,
    Opcode::RTS2RTS_QP,
    Opcode::SQERR2RTS_QP,
    Opcode::ERR_QP,
    Opcode::RST_QP,
    Opcode::QUERY_QP,
    Opcode::CONF_SPECIAL_QP,
    Opcode::MAD_IFC,
];

fn refused(r: &mut Raw, op: Opcode) {
    let res = r.post(0, 0, 0, 0, op);
    assert!(matches!(res, Err(CmdError::Status(_))), "{op}: {res:?}");
}

#[test]
fn every_command_succeeds_and_is_refused_at_least_once() {
    let mut r = Raw::new();
    reset(&mut r);
    // Out of order: before the firmware runs, everything but QUERY_FW,
    // MAP_FA and UNMAP_FA is BAD_SYS_STATE (UNMAP_FA and MAP_FA fail on
    // their parameters / later states instead).
    for op in ISSUE_COMMANDS {
        if ![Opcode::QUERY_FW, Opcode::MAP_FA, Opcode::UNMAP_FA].contains(&op) {
            assert_eq!(
                r.post(0, 0, 0, 0, op),
                Err(CmdError::Status(Status::BAD_SYS_STATE)),
                "{op}"
            );
        }
    }
    refused(&mut r, Opcode::QUERY_FW); // out mailbox at bus 0: DMA fault
    refused(&mut r, Opcode::MAP_FA); // zero entries
    r.cmd(0, 0, 0, Opcode::UNMAP_FA).unwrap();
    load_fw_no_reset(&mut r).unwrap();
    init_after_fw_pub(&mut r).unwrap();
    refused(&mut r, Opcode::UNMAP_FA); // after INIT_HCA

    // EQs, port 1 up, resources, a UD QP through every transition.
    let comp = create_eq(&mut r, FIRST_EQ, 6).unwrap();
    create_eq(&mut r, FIRST_EQ + 1, 9).unwrap();
    r.cmd(ASYNC_MASK, FIRST_EQ + 1, 0, Opcode::MAP_EQ).unwrap();
    r.cmd(0, 0x1f, 0, Opcode::NOP).unwrap();
    r.cmd(0, BASE_SQPN, 0, Opcode::CONF_SPECIAL_QP).unwrap();
    r.cmd_box(&smp_get(0x0015, 1), 1, 3, Opcode::MAD_IFC)
        .unwrap();
    r.cmd_in(&[0u8; 256], 1, 0, Opcode::SET_PORT).unwrap();
    r.cmd(0, 1, 0, Opcode::INIT_PORT).unwrap();
    r.cmd_out(0, 0, Opcode::QUERY_HCA).unwrap();
    create_cq(&mut r, FIRST_CQ, 8, FIRST_EQ as u8).unwrap();
    r.cmd_in(
        &mpt_entry(FIRST_MPT, PD, true, 0, u64::MAX, 0),
        FIRST_MPT,
        0,
        Opcode::SW2HW_MPT,
    )
    .unwrap();
    let sq = queue(&mut r, 1).unwrap();
    let db = r.pages(1)[0];
    r.cmd_in(
        &srq_ctx(FIRST_SRQ, 6, 2, PD, sq.mtt, db),
        FIRST_SRQ,
        0,
        Opcode::SW2HW_SRQ,
    )
    .unwrap();
    let qpn = 100;
    create_qp(&mut r, qpn, 3, FIRST_CQ).unwrap();
    r.cmd_in(&QpMbox::new(1, 3).0, qpn, 0, Opcode::INIT2INIT_QP)
        .unwrap();
    r.cmd_in(
        &QpMbox::new(2, 3).u8(0x38, 0x83).0,
        qpn,
        0,
        Opcode::INIT2RTR_QP,
    )
    .unwrap();
    r.cmd_in(&QpMbox::new(3, 3).0, qpn, 0, Opcode::RTR2RTS_QP)
        .unwrap();
    r.cmd_in(&QpMbox::new(3, 3).0, qpn, 0, Opcode::RTS2RTS_QP)
        .unwrap();
    assert!(r.sim.inject_sq_error(qpn));
    r.cmd_out(qpn, 0, Opcode::QUERY_QP).unwrap();
    assert_eq!(
        r.cmd_out(qpn, 0, Opcode::QUERY_QP).unwrap()[8] >> 4,
        4,
        "SQER"
    );
    r.cmd_in(&QpMbox::new(3, 3).0, qpn, 0, Opcode::SQERR2RTS_QP)
        .unwrap();
    r.cmd_in(&QpMbox::new(6, 3).0, qpn, 0, Opcode::ERR_QP)
        .unwrap();
    r.cmd(0, qpn, 2, Opcode::RST_QP).unwrap();
    let _ = comp;

    // Teardown in Linux order.
    r.cmd(0, 1, 0, Opcode::CLOSE_PORT).unwrap();
    r.cmd_out(FIRST_SRQ, 0, Opcode::HW2SW_SRQ).unwrap();
    r.cmd(0, FIRST_MPT, 1, Opcode::HW2SW_MPT).unwrap();
    r.cmd(0, FIRST_CQ, 1, Opcode::HW2SW_CQ).unwrap();
    r.cmd(0, 0, 0, Opcode::CONF_SPECIAL_QP).unwrap();
    r.cmd(ASYNC_MASK, (FIRST_EQ + 1) | 1 << 31, 0, Opcode::MAP_EQ)
        .unwrap();
    r.cmd_out(FIRST_EQ + 1, 0, Opcode::HW2SW_EQ).unwrap();
    r.cmd_out(FIRST_EQ, 0, Opcode::HW2SW_EQ).unwrap();
    r.cmd(0, 0, 0, Opcode::CLOSE_HCA).unwrap();
    unmap_all(&mut r).unwrap();

    let trace = r.sim.trace();
    for op in ISSUE_COMMANDS {
        let ok = trace.iter().any(|e| e.opcode == op.0 && e.ok());
        let no = trace
            .iter()
            .any(|e| e.opcode == op.0 && e.status != 0 && !e.injected);
        assert!(ok && no, "{op}: success {ok}, refusal {no}");
    }
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}
