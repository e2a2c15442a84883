//! QP state machine, context checks, QUERY_QP and CONF_SPECIAL_QP.

use crate::harness::profile::*;
use crate::harness::*;
use sim::{Opcode, Status};

fn st(s: Status) -> R<()> {
    Err(CmdError::Status(s))
}

const UD: u8 = 3;
const RC: u8 = 0;
const MLX: u8 = 7;

fn setup() -> (Raw, u32) {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    create_cq(&mut r, FIRST_CQ, 8, FIRST_EQ as u8).unwrap();
    (r, FIRST_CQ)
}

fn state_of(r: &mut Raw, qpn: u32) -> u8 {
    let out = r.cmd_out(qpn, 0, Opcode::QUERY_QP).unwrap();
    out[8] >> 4
}

#[test]
fn ud_qp_walks_rst_init_rtr_rts_err_rst() {
    let (mut r, cq) = setup();
    let qpn = 80;
    assert_eq!(state_of(&mut r, qpn), 0);
    create_qp(&mut r, qpn, UD, cq).unwrap();
    assert_eq!(state_of(&mut r, qpn), 1);
    let rtr = QpMbox::new(2, UD)
        .u8(0x18 + 0x20, 0x83 | 0x40)
        .optpar(1 << 16);
    r.cmd_in(&rtr.0, qpn, 0, Opcode::INIT2RTR_QP).unwrap();
    let rts = QpMbox::new(3, UD).u32(0x78, 0);
    r.cmd_in(&rts.0, qpn, 0, Opcode::RTR2RTS_QP).unwrap();
    let out = r.cmd_out(qpn, 0, Opcode::QUERY_QP).unwrap();
    let ctx = &out[8..];
    assert_eq!(ctx[0] >> 4, 3, "RTS");
    assert_eq!(ctx[1], UD, "service type kept");
    assert_eq!(
        u32::from_be_bytes(ctx[0x7c..0x80].try_into().unwrap()),
        cq,
        "send CQ kept"
    );
    assert_eq!(
        u32::from_be_bytes(ctx[0xa8..0xac].try_into().unwrap()),
        0x8001_0000,
        "Q_Key kept"
    );
    assert_eq!(ctx[0x18 + 0x20], 0xc3, "sched_queue from INIT2RTR");
    // RTS2RTS changes only what optpar selects.
    let rts2 = QpMbox::new(3, UD).u32(0xa8, 0x1111_1111).u32(0x04, 99);
    r.cmd_in(&rts2.clone_with_optpar(1 << 5), qpn, 0, Opcode::RTS2RTS_QP)
        .unwrap();
    let out = r.cmd_out(qpn, 0, Opcode::QUERY_QP).unwrap();
    assert_eq!(
        u32::from_be_bytes(out[8 + 0xa8..8 + 0xac].try_into().unwrap()),
        0x1111_1111
    );
    assert_eq!(
        u32::from_be_bytes(out[8 + 4..8 + 8].try_into().unwrap()),
        PD,
        "PD untouched"
    );
    r.cmd_in(&QpMbox::new(6, UD).0, qpn, 0, Opcode::ERR_QP)
        .unwrap();
    assert_eq!(state_of(&mut r, qpn), 6);
    r.cmd(0, qpn, 2, Opcode::RST_QP).unwrap();
    assert_eq!(state_of(&mut r, qpn), 0);
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}

trait WithOptpar {
    fn clone_with_optpar(&self, o: u32) -> Vec<u8>;
}
impl WithOptpar for QpMbox {
    fn clone_with_optpar(&self, o: u32) -> Vec<u8> {
        let mut v = self.0.clone();
        v[0..4].copy_from_slice(&o.to_be_bytes());
        v
    }
}

#[test]
fn transitions_from_the_wrong_state_are_bad_qp_state() {
    let (mut r, cq) = setup();
    let qpn = 81;
    let rtr = QpMbox::new(2, UD).u8(0x38, 0x83);
    assert_eq!(
        r.cmd_in(&rtr.0, qpn, 0, Opcode::INIT2RTR_QP),
        st(Status::BAD_QP_STATE)
    );
    assert_eq!(
        r.cmd_in(&rtr.0, qpn, 0, Opcode::RTR2RTS_QP),
        st(Status::BAD_QP_STATE)
    );
    create_qp(&mut r, qpn, UD, cq).unwrap();
    let q2 = queue(&mut r, 2).unwrap();
    let again = rst2init(qpn, UD, PD, cq, q2.mtt, r.pages(1)[0]);
    assert_eq!(
        r.cmd_in(&again.0, qpn, 0, Opcode::RST2INIT_QP),
        st(Status::BAD_QP_STATE)
    );
    assert_eq!(
        r.cmd_in(&rtr.0, qpn, 0, Opcode::RTS2RTS_QP),
        st(Status::BAD_QP_STATE)
    );
    assert_eq!(
        r.cmd_in(&rtr.0, qpn, 0, Opcode::SQERR2RTS_QP),
        st(Status::BAD_QP_STATE)
    );
    assert_eq!(
        r.cmd_in(&rtr.0, qpn, 0, Opcode::SQD2RTS_QP),
        st(Status::BAD_QP_STATE)
    );
    r.cmd_in(&QpMbox::new(1, UD).0, qpn, 0, Opcode::INIT2INIT_QP)
        .unwrap();
    assert_eq!(state_of(&mut r, qpn), 1);
}

#[test]
fn rst2init_checks_the_context() {
    let (mut r, cq) = setup();
    let q = queue(&mut r, 2).unwrap();
    let db = r.pages(1)[0];
    let qpn = 82;
    let ok = || rst2init(qpn, UD, PD, cq, q.mtt, db);
    let cases = [
        (
            "reserved QPN",
            rst2init(8, UD, PD, cq, q.mtt, db),
            8,
            Status::BAD_RESOURCE,
        ),
        (
            // The QPN's low log_num_qps bits index the table, the rest is
            // a tag (Linux's QP bitmap hands such QPNs out): 300 is slot
            // 44, a reserved one.
            "QPN past the table",
            rst2init(300, UD, PD, cq, q.mtt, db),
            300,
            Status::BAD_RESOURCE,
        ),
        ("local QPN", ok().u32(0x10, qpn + 1), qpn, Status::BAD_PARAM),
        (
            "MLX on a normal QPN",
            rst2init(qpn, MLX, PD, cq, q.mtt, db),
            qpn,
            Status::BAD_PARAM,
        ),
        (
            "RD",
            rst2init(qpn, 2, PD, cq, q.mtt, db),
            qpn,
            Status::BAD_PARAM,
        ),
        ("reserved UAR", ok().u32(0x0c, 2), qpn, Status::BAD_PARAM),
        (
            "send CQ not HW-owned",
            ok().u32(0x7c, cq + 1),
            qpn,
            Status::BAD_RES_STATE,
        ),
        (
            "SRQ not HW-owned",
            ok().u32(0xac, 1 << 24 | FIRST_SRQ),
            qpn,
            Status::BAD_RES_STATE,
        ),
        (
            "SQ too big",
            ok().u8(0x0a, 15 << 3 | 2),
            qpn,
            Status::BAD_PARAM,
        ),
        (
            "MTT not present",
            ok().u32(0xcc, (alloc_mtt(&mut r, 2) * 8) as u32),
            qpn,
            Status::BAD_PARAM,
        ),
        (
            "doorbell outside memory",
            ok().u64(0xa0, 0x20),
            qpn,
            Status::INTERNAL_ERR,
        ),
    ];
    for (what, m, n, want) in cases {
        assert_eq!(
            r.cmd_in(&m.0, n, 0, Opcode::RST2INIT_QP),
            st(want),
            "{what}"
        );
    }
    // QPC page not mapped: QPN 250's context lies in QPC page 15, mapped;
    // unmap it and try again.
    r.cmd(QPC + 15 * 4096, 1, 0, Opcode::UNMAP_ICM).unwrap();
    let q3 = queue(&mut r, 2).unwrap();
    let m = rst2init(250, UD, PD, cq, q3.mtt, db);
    assert_eq!(
        r.cmd_in(&m.0, 250, 0, Opcode::RST2INIT_QP),
        st(Status::ICM_ERROR)
    );
    r.cmd_in(&ok().0, qpn, 0, Opcode::RST2INIT_QP).unwrap();
}

#[test]
fn rc_init2rtr_checks_mtu_and_port() {
    let (mut r, cq) = setup();
    let qpn = 83;
    create_qp(&mut r, qpn, RC, cq).unwrap();
    let path = |m: QpMbox| {
        m.u8(0x18 + 0x20, 0x83)
            .u32(0x14, 90)
            .optpar(1 << 7 | 1 << 16)
    };
    let bad_mtu = path(QpMbox::new(2, RC).u8(0x08, 6 << 5 | 31));
    assert_eq!(
        r.cmd_in(&bad_mtu.0, qpn, 0, Opcode::INIT2RTR_QP),
        st(Status::BAD_PARAM)
    );
    let ok = path(QpMbox::new(2, RC).u8(0x08, 5 << 5 | 31));
    r.cmd_in(&ok.0, qpn, 0, Opcode::INIT2RTR_QP).unwrap();
    let out = r.cmd_out(qpn, 0, Opcode::QUERY_QP).unwrap();
    assert_eq!(
        u32::from_be_bytes(out[8 + 0x14..8 + 0x18].try_into().unwrap()),
        90
    );
    r.cmd_in(&QpMbox::new(3, RC).0, qpn, 0, Opcode::RTR2RTS_QP)
        .unwrap();
    r.cmd_in(&QpMbox::new(5, RC).0, qpn, 0, Opcode::RTS2SQD_QP)
        .unwrap();
    r.cmd_in(&QpMbox::new(5, RC).0, qpn, 0, Opcode::SQD2SQD_QP)
        .unwrap();
    r.cmd_in(&QpMbox::new(3, RC).0, qpn, 0, Opcode::SQD2RTS_QP)
        .unwrap();
    assert_eq!(state_of(&mut r, qpn), 3);
}

#[test]
fn special_qps_need_conf_special_qp_and_their_own_port() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    create_eq(&mut r, FIRST_EQ, 6).unwrap();
    create_cq(&mut r, FIRST_CQ, 8, FIRST_EQ as u8).unwrap();
    let qp0 = BASE_SQPN; // port 1
    let q = queue(&mut r, 2).unwrap();
    let db = r.pages(1)[0];
    let m = rst2init(qp0, MLX, PD, FIRST_CQ, q.mtt, db);
    assert_eq!(
        r.cmd_in(&m.0, qp0, 0, Opcode::RST2INIT_QP),
        st(Status::BAD_PARAM),
        "not special yet"
    );
    assert_eq!(
        r.cmd(0, 60, 0, Opcode::CONF_SPECIAL_QP),
        st(Status::BAD_PARAM),
        "unaligned"
    );
    assert_eq!(
        r.cmd(0, 8, 0, Opcode::CONF_SPECIAL_QP),
        st(Status::BAD_PARAM),
        "in reserved range"
    );
    assert_eq!(
        r.cmd(0, 256, 0, Opcode::CONF_SPECIAL_QP),
        st(Status::BAD_PARAM),
        "past the table"
    );
    r.cmd(0, BASE_SQPN, 0, Opcode::CONF_SPECIAL_QP).unwrap();
    let ud = rst2init(qp0, UD, PD, FIRST_CQ, q.mtt, db);
    assert_eq!(
        r.cmd_in(&ud.0, qp0, 0, Opcode::RST2INIT_QP),
        st(Status::BAD_PARAM),
        "QP0 must be MLX"
    );
    r.cmd_in(&m.0, qp0, 0, Opcode::RST2INIT_QP).unwrap();
    // QP0 of port 1 with a path naming port 2.
    let rtr = QpMbox::new(2, MLX).u8(0x38, 0x40 | 0x3f).optpar(1 << 16);
    assert_eq!(
        r.cmd_in(&rtr.0, qp0, 0, Opcode::INIT2RTR_QP),
        st(Status::BAD_PARAM)
    );
    let rtr = QpMbox::new(2, MLX).u8(0x38, 0x3f).optpar(1 << 16);
    r.cmd_in(&rtr.0, qp0, 0, Opcode::INIT2RTR_QP).unwrap();
    assert_eq!(
        r.cmd(0, 0, 0, Opcode::CONF_SPECIAL_QP),
        st(Status::RESOURCE_BUSY),
        "QP0 alive"
    );
    // CQ cannot go while QP0 uses it; after 2RST it can.
    assert_eq!(
        r.cmd(0, FIRST_CQ, 1, Opcode::HW2SW_CQ),
        st(Status::RESOURCE_BUSY)
    );
    r.cmd(0, qp0, 2, Opcode::RST_QP).unwrap();
    r.cmd(0, FIRST_CQ, 1, Opcode::HW2SW_CQ).unwrap();
    r.cmd(0, 0, 0, Opcode::CONF_SPECIAL_QP).unwrap();
}

#[test]
fn wrong_state_field_in_the_mailbox_is_recorded() {
    let (mut r, cq) = setup();
    create_qp(&mut r, 84, UD, cq).unwrap();
    let rtr = QpMbox::new(3, UD).u8(0x38, 0x83).optpar(1 << 16);
    r.cmd_in(&rtr.0, 84, 0, Opcode::INIT2RTR_QP).unwrap();
    assert!(
        r.sim
            .violations()
            .iter()
            .any(|v| v.contains("context state field 3"))
    );
}

/// QUERY_QP looks a QPN up as the transitions do: its low log_num_qps
/// bits index the table, the bits above are a tag (Linux's QP bitmap hands
/// such QPNs out). A QPN whose slot another tag holds out of RESET is
/// refused (BAD_RES_STATE, recorded), not answered with the other QP's
/// context; a firmware-reserved slot is BAD_RESOURCE; bits above the
/// 24-bit QPN are BAD_PARAM.
#[test]
fn query_qp_refuses_a_qpn_whose_slot_another_tag_holds() {
    let (mut r, cq) = setup();
    let qpn = 84;
    let alias = qpn + (1 << LOG_QPS);
    create_qp(&mut r, qpn, UD, cq).unwrap();
    assert_eq!(state_of(&mut r, qpn), 1, "INIT");
    assert_eq!(
        r.cmd_out(alias, 0, Opcode::QUERY_QP).map(|_| ()),
        st(Status::BAD_RES_STATE),
        "QP {alias:#x} shares slot {qpn:#x} with a live QP"
    );
    assert!(
        r.violated(&format!(
            "QP {alias:#x}: its context slot {qpn:#x} is in use by QP {qpn:#x}"
        )),
        "{:?}",
        r.sim.violations()
    );
    // The same refusal as a transition of the alias gets.
    assert_eq!(
        r.cmd_in(&QpMbox::new(6, UD).0, alias, 0, Opcode::ERR_QP),
        st(Status::BAD_RES_STATE)
    );
    assert_eq!(
        r.cmd_out(8, 0, Opcode::QUERY_QP).map(|_| ()),
        st(Status::BAD_RESOURCE),
        "reserved QPN"
    );
    assert_eq!(
        r.cmd_out(1 << 24 | qpn, 0, Opcode::QUERY_QP).map(|_| ()),
        st(Status::BAD_PARAM),
        "not a 24-bit QPN"
    );
    // Back in RESET the slot is free: the tagged QPN may be queried (and
    // used), and reads RESET.
    r.cmd(0, qpn, 2, Opcode::RST_QP).unwrap();
    assert_eq!(state_of(&mut r, alias), 0);
    assert_eq!(state_of(&mut r, qpn), 0);
}
