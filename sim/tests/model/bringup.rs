//! Linux-order bring-up (porting map 2.2) and teardown against the model:
//! every step succeeds, no violations, and the trace reads like Linux's
//! command log.

use crate::harness::profile::*;
use crate::harness::*;
use sim::{LogicalState, Opcode, SimConfig, SimHca};

fn names(r: &Raw) -> Vec<&'static str> {
    let mut v: Vec<&str> = r.sim.trace().iter().map(|e| e.name).collect();
    v.dedup();
    v
}

#[test]
fn linux_order_init_runs_clean() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
    assert!(r.sim.dma_faults().is_empty());
    assert_eq!(
        names(&r),
        [
            "QUERY_FW",
            "MAP_FA",
            "RUN_FW",
            "MOD_STAT_CFG",
            "QUERY_DEV_CAP",
            "QUERY_PORT",
            "SET_ICM_SIZE",
            "MAP_ICM_AUX",
            "MAP_ICM",
            "INIT_HCA",
            "QUERY_ADAPTER"
        ]
    );
    assert!(r.ok_trace(), "{:#?}", r.sim.trace());
    assert!(r.sim.is_initialized());
}

/// mlx4_ib's special-QP bring-up for one port: QP0 and QP1 to RTS, with
/// INIT_PORT when QP0 reaches RTR.
fn port_start(r: &mut Raw, port: u32, cq: u32) {
    for (k, st, sched) in [(0u32, 7u8, 0x3fu8), (2, 7, 0x83)] {
        let qpn = BASE_SQPN + k + port - 1;
        let q = queue(r, 2).unwrap();
        let db = r.pages(1)[0];
        r.cmd_in(
            &rst2init(qpn, st, PD, cq, q.mtt, db).0,
            qpn,
            0,
            Opcode::RST2INIT_QP,
        )
        .unwrap();
        let rtr = QpMbox::new(2, st)
            .u8(0x38, (port as u8 - 1) << 6 | sched)
            .optpar(1 << 16);
        r.cmd_in(&rtr.0, qpn, 0, Opcode::INIT2RTR_QP).unwrap();
        if k == 0 {
            r.cmd(0, port, 0, Opcode::INIT_PORT).unwrap();
        }
        r.cmd_in(&QpMbox::new(3, st).0, qpn, 0, Opcode::RTR2RTS_QP)
            .unwrap();
    }
}

#[test]
fn full_bring_up_and_teardown_in_linux_order_run_clean() {
    let mut r = Raw::new();
    let (_, asy) = init_full(&mut r).unwrap();
    // mlx4_ib: DMA MR, MAD CQ, QP0/QP1 per port.
    r.cmd_in(
        &mpt_entry(FIRST_MPT, PD, true, 0, u64::MAX, 0),
        FIRST_MPT,
        0,
        Opcode::SW2HW_MPT,
    )
    .unwrap();
    create_cq(&mut r, FIRST_CQ, 11, FIRST_EQ as u8).unwrap();
    port_start(&mut r, 1, FIRST_CQ);
    port_start(&mut r, 2, FIRST_CQ);
    assert_eq!(r.sim.port_state(1).unwrap().0, LogicalState::Init);
    // The SM brings port 1 up (SubnSet PortInfo: LID, Armed, Active):
    // PORT_CHANGE(ACTIVE).
    sm_activate(&r.sim, 1, 1, 1);
    let e = eqe(&r, &asy, 512, 0);
    assert_eq!((e[1], e[3], e[0x0c] >> 4, e[31]), (0x09, 4, 1, 0));
    eq_doorbell(&r, FIRST_EQ + 1, 1, true);

    // Teardown (mlx4_ib remove, then mlx4_core remove).
    for port in 1..=2 {
        r.cmd(0, port, 0, Opcode::CLOSE_PORT).unwrap();
    }
    for qpn in BASE_SQPN..BASE_SQPN + 4 {
        r.cmd(0, qpn, 2, Opcode::RST_QP).unwrap();
    }
    r.cmd(0, FIRST_CQ, 1, Opcode::HW2SW_CQ).unwrap();
    r.cmd(0, FIRST_MPT, 1, Opcode::HW2SW_MPT).unwrap();
    r.cmd(0, 0, 0, Opcode::CONF_SPECIAL_QP).unwrap();
    r.cmd(ASYNC_MASK, (FIRST_EQ + 1) | 1 << 31, 0, Opcode::MAP_EQ)
        .unwrap();
    r.cmd_out(FIRST_EQ + 1, 0, Opcode::HW2SW_EQ).unwrap();
    r.cmd_out(FIRST_EQ, 0, Opcode::HW2SW_EQ).unwrap();
    r.cmd(0, 0, 0, Opcode::CLOSE_HCA).unwrap();
    unmap_all(&mut r).unwrap();
    r.bar0.write_be32(0x8_069c, 0); // mlx4_free_ownership

    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
    assert!(r.sim.dma_faults().is_empty());
    assert!(r.ok_trace(), "{:#?}", r.sim.trace());
    let n = names(&r);
    let pos = |s: &str| n.iter().position(|x| *x == s).unwrap();
    assert!(pos("INIT_HCA") < pos("SW2HW_EQ"));
    assert!(pos("SW2HW_EQ") < pos("MAP_EQ"));
    assert!(pos("MAP_EQ") < pos("NOP"));
    assert!(pos("NOP") < pos("CONF_SPECIAL_QP"));
    assert!(pos("CONF_SPECIAL_QP") < pos("MAD_IFC"));
    assert!(pos("MAD_IFC") < pos("SET_PORT"));
    assert!(pos("INIT2RTR_QP") < pos("INIT_PORT"));
    assert_eq!(*n.last().unwrap(), "UNMAP_FA");
    // The trace is meant for people too.
    let line = r
        .sim
        .trace()
        .iter()
        .find(|e| e.name == "INIT_PORT")
        .unwrap()
        .to_string();
    assert!(
        line.starts_with("INIT_PORT(0x009) in_mod=0x1 op_mod=0 -> OK(0x00)"),
        "{line}"
    );
    assert!(!r.sim.is_running());
}

#[test]
fn threaded_bring_up_runs_clean() {
    let sim = SimHca::new_threaded(SimConfig::default());
    let mut r = Raw::with(sim);
    r.timeout = std::time::Duration::from_secs(30);
    init_no_reset(&mut r).unwrap();
    create_eq(&mut r, FIRST_EQ, 6).unwrap();
    r.cmd(0, 0x1f, 0, Opcode::NOP).unwrap();
    assert!(r.sim.is_initialized());
    assert!(r.ok_trace());
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}
