//! EQ, CQ, MPT, SRQ and MTT commands, MAP_EQ: success paths, the contexts
//! landing in ICM, and the rejections.

use crate::harness::profile::*;
use crate::harness::*;
use sim::{Opcode, Status};

fn st(s: Status) -> R<()> {
    Err(CmdError::Status(s))
}

#[test]
fn sw2hw_eq_stores_the_context_in_icm_and_marks_entries_hw_owned() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    let q = create_eq(&mut r, FIRST_EQ, 7).unwrap();
    let ctx = r.icm_peek(EQC + u64::from(FIRST_EQ) * 64, 64);
    assert_eq!(&ctx[..4], &[0, 0, 9, 0], "status OK, armed");
    assert_eq!(ctx[0x0c], 7);
    assert_eq!(
        u32::from_be_bytes(ctx[0x1c..0x20].try_into().unwrap()),
        (q.mtt * 8) as u32
    );
    for i in [0, 1, 127] {
        assert_eq!(eqe(&r, &q, 128, i)[31], 0x80, "EQE {i} owner = HW");
    }
    let out = r.cmd_out(FIRST_EQ, 0, Opcode::QUERY_EQ).unwrap();
    assert_eq!(out[..64], ctx[..]);
    // HW2SW hands the context back and frees the EQN for reuse.
    let out = r.cmd_out(FIRST_EQ, 0, Opcode::HW2SW_EQ).unwrap();
    assert_eq!(out[0x0c], 7);
    assert_eq!(
        r.cmd_out(FIRST_EQ, 0, Opcode::HW2SW_EQ).map(|_| ()),
        st(Status::BAD_RES_STATE)
    );
    r.cmd_in(&eq_ctx(7, q.mtt, 0), FIRST_EQ, 0, Opcode::SW2HW_EQ)
        .unwrap();
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}

#[test]
fn sw2hw_eq_rejections() {
    let mut r = Raw::new();
    assert_eq!(
        r.cmd_in(&[0; 64], FIRST_EQ, 0, Opcode::SW2HW_EQ),
        st(Status::BAD_SYS_STATE)
    );
    init(&mut r).unwrap();
    let q = queue(&mut r, 1).unwrap();
    let ok = eq_ctx(6, q.mtt, 0);
    assert_eq!(
        r.cmd_in(&ok, 3, 0, Opcode::SW2HW_EQ),
        st(Status::BAD_RESOURCE),
        "reserved EQ"
    );
    assert_eq!(
        r.cmd_in(&ok, 64, 0, Opcode::SW2HW_EQ),
        st(Status::BAD_INDEX),
        "past log_num_eqs"
    );
    let mut bad = ok.clone();
    bad[0x0c] = 23;
    assert_eq!(
        r.cmd_in(&bad, FIRST_EQ, 0, Opcode::SW2HW_EQ),
        st(Status::BAD_PARAM),
        "too big"
    );
    let mut bad = ok.clone();
    bad[2] = 0x03;
    assert_eq!(
        r.cmd_in(&bad, FIRST_EQ, 0, Opcode::SW2HW_EQ),
        st(Status::BAD_PARAM),
        "state"
    );
    // MTT entry not present.
    let unwritten = alloc_mtt(&mut r, 1);
    let bad = eq_ctx(6, unwritten, 0);
    assert_eq!(
        r.cmd_in(&bad, FIRST_EQ, 0, Opcode::SW2HW_EQ),
        st(Status::BAD_PARAM)
    );
    assert!(r.sim.violations().iter().any(|v| v.contains("not present")));
    // MTT index whose ICM page is not mapped.
    let bad = eq_ctx(6, 4096 * 2, 0);
    assert_eq!(
        r.cmd_in(&bad, FIRST_EQ, 0, Opcode::SW2HW_EQ),
        st(Status::ICM_ERROR)
    );
    r.cmd_in(&ok, FIRST_EQ, 0, Opcode::SW2HW_EQ).unwrap();
    assert_eq!(
        r.cmd_in(&ok, FIRST_EQ, 0, Opcode::SW2HW_EQ),
        st(Status::BAD_RES_STATE),
        "twice"
    );
    assert_eq!(
        r.cmd_out(FIRST_EQ + 1, 0, Opcode::QUERY_EQ).map(|_| ()),
        st(Status::BAD_RES_STATE)
    );
}

#[test]
fn eq_context_slot_must_be_mapped() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    r.cmd(EQC, 1, 0, Opcode::UNMAP_ICM).unwrap();
    let q = queue(&mut r, 1).unwrap();
    assert_eq!(
        r.cmd_in(&eq_ctx(6, q.mtt, 0), FIRST_EQ, 0, Opcode::SW2HW_EQ),
        st(Status::ICM_ERROR)
    );
    assert!(r.sim.violations().iter().any(|v| v.contains("Eqc entry")));
}

#[test]
fn map_eq_routes_async_events_and_unmaps() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    assert_eq!(
        r.cmd(1 << 9, FIRST_EQ, 0, Opcode::MAP_EQ),
        st(Status::BAD_RES_STATE)
    );
    create_eq(&mut r, FIRST_EQ, 6).unwrap();
    r.cmd(ASYNC_MASK, FIRST_EQ, 0, Opcode::MAP_EQ).unwrap();
    assert_eq!(r.sim.async_eq(0x09), Some(FIRST_EQ));
    assert_eq!(r.sim.async_eq(0x00), None, "completions are not mapped");
    r.cmd(ASYNC_MASK, FIRST_EQ | 1 << 31, 0, Opcode::MAP_EQ)
        .unwrap();
    assert_eq!(r.sim.async_eq(0x09), None);
}

#[test]
fn cq_needs_a_hw_owned_eq_and_gets_hw_owned_entries() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    // Completion EQ not in hardware ownership.
    let q = queue(&mut r, 1).unwrap();
    let db = r.pages(1)[0];
    let ctx = cq_ctx(7, UAR, FIRST_EQ as u8, q.mtt, db);
    assert_eq!(
        r.cmd_in(&ctx, FIRST_CQ, 0, Opcode::SW2HW_CQ),
        st(Status::BAD_RES_STATE)
    );
    assert!(
        r.sim
            .violations()
            .iter()
            .any(|v| v.contains("not in hardware ownership"))
    );
    create_eq(&mut r, FIRST_EQ, 6).unwrap();
    assert_eq!(
        r.cmd_in(&ctx, 5, 0, Opcode::SW2HW_CQ),
        st(Status::BAD_RESOURCE),
        "reserved CQ"
    );
    assert_eq!(
        r.cmd_in(&ctx, 256, 0, Opcode::SW2HW_CQ),
        st(Status::BAD_INDEX)
    );
    let bad = cq_ctx(7, 3, FIRST_EQ as u8, q.mtt, db);
    assert_eq!(
        r.cmd_in(&bad, FIRST_CQ, 0, Opcode::SW2HW_CQ),
        st(Status::BAD_PARAM),
        "reserved UAR"
    );
    let bad = cq_ctx(7, UAR, FIRST_EQ as u8, q.mtt, db + 4);
    assert_eq!(
        r.cmd_in(&bad, FIRST_CQ, 0, Opcode::SW2HW_CQ),
        st(Status::BAD_PARAM),
        "db align"
    );
    let bad = cq_ctx(7, UAR, FIRST_EQ as u8, q.mtt, 0x10);
    assert_eq!(
        r.cmd_in(&bad, FIRST_CQ, 0, Opcode::SW2HW_CQ),
        st(Status::INTERNAL_ERR),
        "db DMA"
    );
    r.cmd_in(&ctx, FIRST_CQ, 0, Opcode::SW2HW_CQ).unwrap();
    assert_eq!(eqe(&r, &q, 128, 0)[31], 0x80);
    assert_eq!(eqe(&r, &q, 128, 127)[31], 0x80);
    assert_eq!(r.icm_peek(CQC + u64::from(FIRST_CQ) * 64, 64), ctx);
    // The EQ cannot go while the CQ reports to it.
    assert_eq!(
        r.cmd_out(FIRST_EQ, 0, Opcode::HW2SW_EQ).map(|_| ()),
        st(Status::RESOURCE_BUSY)
    );
    let out = r.cmd_out(FIRST_CQ, 0, Opcode::QUERY_CQ).unwrap();
    assert_eq!(out[..64], ctx[..]);
    r.cmd(0, FIRST_CQ, 1, Opcode::HW2SW_CQ).unwrap();
    assert_eq!(
        r.cmd(0, FIRST_CQ, 1, Opcode::HW2SW_CQ),
        st(Status::BAD_RES_STATE)
    );
    r.cmd_out(FIRST_EQ, 0, Opcode::HW2SW_EQ).unwrap();
}

#[test]
fn mpt_physical_and_mtt_backed_regions() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    // DMA MR: physical, no MTT.
    r.cmd_in(
        &mpt_entry(FIRST_MPT, PD, true, 0, u64::MAX, 0),
        FIRST_MPT,
        0,
        Opcode::SW2HW_MPT,
    )
    .unwrap();
    let icm = r.icm_peek(DMPT + u64::from(FIRST_MPT) * 64, 4);
    assert_eq!(icm[0] >> 4, 0, "status: hardware owned");
    assert_eq!(
        r.cmd_in(
            &mpt_entry(FIRST_MPT, PD, true, 0, 1, 0),
            FIRST_MPT,
            0,
            Opcode::SW2HW_MPT
        ),
        st(Status::BAD_RES_STATE)
    );
    // 3-page region through MTTs written straight into ICM (native Linux).
    let pages = r.pages(3);
    let mtt = alloc_mtt(&mut r, 3);
    for (i, pa) in pages.iter().enumerate() {
        r.icm_poke(MTT + (mtt + i as u64) * 8, &(pa | 1).to_be_bytes());
    }
    let idx = FIRST_MPT + 1;
    r.cmd_in(
        &mpt_entry(idx, PD, false, 0x1000_0000, 3 * 4096, mtt),
        idx,
        0,
        Opcode::SW2HW_MPT,
    )
    .unwrap();
    let q = r.cmd_out(idx, 0, Opcode::QUERY_MPT).unwrap();
    assert_eq!(
        u64::from_be_bytes(q[0x18..0x20].try_into().unwrap()),
        3 * 4096
    );
    r.cmd(0, idx, 1, Opcode::HW2SW_MPT).unwrap();
    // One page too long: the fourth MTT entry is not present.
    assert_eq!(
        r.cmd_in(
            &mpt_entry(idx, PD, false, 0x1000_0000, 4 * 4096, mtt),
            idx,
            0,
            Opcode::SW2HW_MPT
        ),
        st(Status::BAD_PARAM)
    );
    // Key naming another index, reserved index, non-zero lkey, no local read.
    assert_eq!(
        r.cmd_in(
            &mpt_entry(idx + 1, PD, true, 0, 1, 0),
            idx,
            0,
            Opcode::SW2HW_MPT
        ),
        st(Status::BAD_PARAM)
    );
    assert_eq!(
        r.cmd_in(&mpt_entry(2, PD, true, 0, 1, 0), 2, 0, Opcode::SW2HW_MPT),
        st(Status::BAD_RESOURCE)
    );
    let mut bad = mpt_entry(idx, PD, true, 0, 1, 0);
    bad[0x20] = 1;
    assert_eq!(
        r.cmd_in(&bad, idx, 0, Opcode::SW2HW_MPT),
        st(Status::BAD_PARAM)
    );
    let mut bad = mpt_entry(idx, PD, true, 0, 1, 0);
    bad[2] &= !0x04;
    assert_eq!(
        r.cmd_in(&bad, idx, 0, Opcode::SW2HW_MPT),
        st(Status::BAD_PARAM)
    );
    assert_eq!(
        r.cmd_out(idx, 0, Opcode::QUERY_MPT).map(|_| ()),
        st(Status::BAD_RES_STATE)
    );
}

#[test]
fn write_mtt_lands_in_icm_and_checks_its_range() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    write_mtt(&mut r, 100, &[0x1_0000_5000, 0x1_0000_6000]).unwrap();
    assert_eq!(
        r.icm_peek(MTT + 100 * 8, 16),
        [0, 0, 0, 1, 0, 0, 0x50, 0x01, 0, 0, 0, 1, 0, 0, 0x60, 0x01]
    );
    assert_eq!(
        r.cmd_in(&[0; 16], 0, 0, Opcode::WRITE_MTT),
        st(Status::BAD_PARAM)
    );
    assert_eq!(
        r.cmd_in(&[0; 16], 511, 0, Opcode::WRITE_MTT),
        st(Status::BAD_PARAM)
    );
    // Past the end of mapped ICM (INIT_HCA gives the MTT table no size, so
    // only the mapping bounds it: entry 6144 is where the MCG table ends).
    let end = (END - MTT) / 8;
    assert_eq!(
        write_mtt(&mut r, end - 1, &[0x1_0000_0000, 0x1_0000_1000]),
        st(Status::ICM_ERROR)
    );
    assert_eq!(
        write_mtt(&mut r, 1 << 27, &[0x1_0000_0000]),
        st(Status::BAD_INDEX)
    );
}

#[test]
fn srq_lifecycle_and_arm() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    let q = queue(&mut r, 1).unwrap();
    let db = r.pages(1)[0];
    let ctx = srq_ctx(FIRST_SRQ, 6, 2, PD, q.mtt, db);
    assert_eq!(
        r.cmd_in(&ctx, FIRST_SRQ + 1, 0, Opcode::SW2HW_SRQ),
        st(Status::BAD_PARAM),
        "SRQN mismatch"
    );
    assert_eq!(
        r.cmd_in(&srq_ctx(3, 6, 2, PD, q.mtt, db), 3, 0, Opcode::SW2HW_SRQ),
        st(Status::BAD_RESOURCE)
    );
    assert_eq!(
        r.cmd_in(
            &srq_ctx(FIRST_SRQ, 15, 2, PD, q.mtt, db),
            FIRST_SRQ,
            0,
            Opcode::SW2HW_SRQ
        ),
        st(Status::BAD_PARAM),
        "bigger than log_max_srq_sz"
    );
    r.cmd_in(&ctx, FIRST_SRQ, 0, Opcode::SW2HW_SRQ).unwrap();
    assert_eq!(
        r.cmd_in(&ctx, FIRST_SRQ, 0, Opcode::SW2HW_SRQ),
        st(Status::BAD_RES_STATE)
    );
    r.cmd(16, FIRST_SRQ, 0, Opcode::ARM_SRQ).unwrap();
    assert_eq!(
        r.cmd(64, FIRST_SRQ, 0, Opcode::ARM_SRQ),
        st(Status::BAD_PARAM)
    );
    let out = r.cmd_out(FIRST_SRQ, 0, Opcode::QUERY_SRQ).unwrap();
    assert_eq!(
        u16::from_be_bytes([out[0x1c], out[0x1d]]),
        16,
        "QUERY_SRQ reports the armed limit_watermark (mlx4_srq_query)"
    );
    let mut armed = ctx.clone();
    armed[0x1c..0x1e].copy_from_slice(&16u16.to_be_bytes());
    assert_eq!(out[..48], armed[..48]);
    r.cmd(5, FIRST_SRQ, 0, Opcode::ARM_SRQ).unwrap();
    let out = r.cmd_out(FIRST_SRQ, 0, Opcode::QUERY_SRQ).unwrap();
    assert_eq!(u16::from_be_bytes([out[0x1c], out[0x1d]]), 5, "re-armed");
    assert_eq!(out[..0x1c], ctx[..0x1c], "nothing else changes");
    assert_eq!(out[0x1e..48], ctx[0x1e..48], "nothing else changes");
    r.cmd_out(FIRST_SRQ, 0, Opcode::HW2SW_SRQ).unwrap();
    assert_eq!(
        r.cmd(16, FIRST_SRQ, 0, Opcode::ARM_SRQ),
        st(Status::BAD_RES_STATE)
    );
}

#[test]
fn modify_cq_moderation_and_resize() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    create_eq(&mut r, FIRST_EQ, 6).unwrap();
    create_cq(&mut r, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    let mut m = vec![0u8; 64];
    m[0x10..0x14].copy_from_slice(&[0, 10, 0, 16]);
    r.cmd_in(&m, FIRST_CQ, 1, Opcode::MODIFY_CQ).unwrap();
    let ctx = r.icm_peek(CQC + u64::from(FIRST_CQ) * 64, 64);
    assert_eq!(&ctx[0x10..0x14], &[0, 10, 0, 16]);
    // Resize to 256 entries (2 pages).
    let q = queue(&mut r, 2).unwrap();
    let mut m = vec![0u8; 64];
    m[0x0c] = 8;
    m[0x1c..0x20].copy_from_slice(&((q.mtt * 8) as u32).to_be_bytes());
    r.cmd_in(&m, FIRST_CQ, 0, Opcode::MODIFY_CQ).unwrap();
    let ctx = r.icm_peek(CQC + u64::from(FIRST_CQ) * 64, 64);
    assert_eq!(
        u32::from_be_bytes(ctx[0x0c..0x10].try_into().unwrap()),
        8 << 24 | UAR
    );
    assert_eq!(eqe(&r, &q, 256, 255)[31], 0x80, "new buffer hardware-owned");
    m[0x0c] = 23;
    assert_eq!(
        r.cmd_in(&m, FIRST_CQ, 0, Opcode::MODIFY_CQ),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
    assert_eq!(
        r.cmd_in(&m, FIRST_CQ, 2, Opcode::MODIFY_CQ),
        Err(CmdError::Status(Status::BAD_OP))
    );
    assert_eq!(
        r.cmd_in(&m, FIRST_CQ + 1, 1, Opcode::MODIFY_CQ),
        Err(CmdError::Status(Status::BAD_RES_STATE))
    );
}

#[test]
fn close_hca_with_objects_still_owned_by_hardware_is_recorded() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    create_eq(&mut r, FIRST_EQ, 6).unwrap();
    create_cq(&mut r, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    r.cmd(0, 0, 0, Opcode::CLOSE_HCA).unwrap();
    let v = r.sim.violations();
    assert!(
        v.iter()
            .any(|s| s.contains("CLOSE_HCA with 1 EQs, 1 CQs still in hardware ownership")),
        "{v:?}"
    );
    assert_eq!(r.sim.eq(FIRST_EQ), None, "dropped");
}

#[test]
fn memory_windows_are_accepted_the_way_linux_writes_them() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    // mlx4_mw_enable, type 1: key and PD only.
    let mut w = vec![0u8; 64];
    w[0x08..0x0c].copy_from_slice(&(FIRST_MPT + 2).to_be_bytes());
    w[0x0c..0x10].copy_from_slice(&PD.to_be_bytes());
    r.cmd_in(&w, FIRST_MPT + 2, 0, Opcode::SW2HW_MPT).unwrap();
    // A window claiming "SW owns" is not something Linux sends.
    w[0] = 0xf0;
    w[0x08..0x0c].copy_from_slice(&(FIRST_MPT + 3).to_be_bytes());
    assert_eq!(
        r.cmd_in(&w, FIRST_MPT + 3, 0, Opcode::SW2HW_MPT),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
}
