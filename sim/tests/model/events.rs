//! EQE writing, ownership parity, EQ doorbells, overrun, CQ errors and the
//! catastrophic error.

use crate::harness::profile::*;
use crate::harness::*;
use sim::hca::faults::EqeCorruption;
use sim::{Opcode, SimConfig, SimHca, Status};

#[test]
fn completion_events_follow_the_ownership_parity_and_the_doorbell() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    let q = create_eq(&mut r, FIRST_EQ, 2).unwrap(); // 4 entries
    create_cq(&mut r, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    eq_doorbell(&r, FIRST_EQ, 0, true);
    let mut ci = 0u32;
    for round in 0..3u32 {
        for _ in 0..4 {
            assert!(r.sim.inject_completion_event(FIRST_CQ));
        }
        for i in 0..4 {
            let e = eqe(&r, &q, 4, ci);
            // Software owns the entry when owner == parity of its index.
            assert_eq!(e[31] >> 7, u8::from(ci & 4 != 0), "round {round} entry {i}");
            assert_eq!(e[1], 0x00);
            assert_eq!(u32::from_be_bytes(e[4..8].try_into().unwrap()), FIRST_CQ);
            ci += 1;
        }
        eq_doorbell(&r, FIRST_EQ, ci, true);
    }
    let eq = r.sim.eq(FIRST_EQ).unwrap();
    assert_eq!((eq.prod, eq.cons, eq.doorbells), (12, 12, 4));
    assert_eq!(eq.interrupts, 3, "one per arm");
    // The context in ICM tracks the indices.
    let ctx = r.icm_peek(EQC + u64::from(FIRST_EQ) * 64, 64);
    assert_eq!(u32::from_be_bytes(ctx[0x28..0x2c].try_into().unwrap()), 12);
    assert_eq!(u32::from_be_bytes(ctx[0x2c..0x30].try_into().unwrap()), 12);
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}

/// The race Linux's mlx4_eq_int leaves to the card: it polls its EQ
/// empty, then arms it with the consumer index it reached. An EQE the card
/// wrote in between (the EQ had fired, so no interrupt for it) must raise
/// the interrupt when the arm arrives behind the producer; otherwise the
/// event waits for the next EQE, which for a firmware command's completion
/// may never come (Linux then times the command out and resets the card).
#[test]
fn arming_an_eq_behind_its_producer_fires_at_once() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    create_eq(&mut r, FIRST_EQ, 2).unwrap(); // 4 entries
    create_cq(&mut r, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    eq_doorbell(&r, FIRST_EQ, 0, true);
    assert!(r.sim.inject_completion_event(FIRST_CQ));
    assert_eq!(r.sim.eq(FIRST_EQ).unwrap().interrupts, 1, "armed: fires");
    // The driver's handler runs; meanwhile a second EQE lands (fired: no
    // interrupt), after the handler's last look at the EQ.
    assert!(r.sim.inject_completion_event(FIRST_CQ));
    assert_eq!(r.sim.eq(FIRST_EQ).unwrap().interrupts, 1);
    // The handler arms with the index it reached (1): one EQE is pending.
    eq_doorbell(&r, FIRST_EQ, 1, true);
    let eq = r.sim.eq(FIRST_EQ).unwrap();
    assert_eq!(eq.interrupts, 2, "the arm behind the producer fires");
    assert!(!eq.armed, "and leaves the EQ fired");
    // Caught up and armed: nothing fires until the next EQE.
    eq_doorbell(&r, FIRST_EQ, 2, true);
    assert_eq!(r.sim.eq(FIRST_EQ).unwrap().interrupts, 2);
    assert!(r.sim.inject_completion_event(FIRST_CQ));
    assert_eq!(r.sim.eq(FIRST_EQ).unwrap().interrupts, 3);
    // Without the arm bit, a consumer index behind the producer fires nothing.
    eq_doorbell(&r, FIRST_EQ, 2, false);
    assert_eq!(r.sim.eq(FIRST_EQ).unwrap().interrupts, 3);
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}

#[test]
fn overrun_is_detected_and_reported_on_the_async_eq() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    create_eq(&mut r, FIRST_EQ, 1).unwrap(); // 2 entries
    let asy = create_eq(&mut r, FIRST_EQ + 1, 6).unwrap();
    r.cmd(ASYNC_MASK, FIRST_EQ + 1, 0, Opcode::MAP_EQ).unwrap();
    create_cq(&mut r, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    for _ in 0..3 {
        r.sim.inject_completion_event(FIRST_CQ);
    }
    let eq = r.sim.eq(FIRST_EQ).unwrap();
    assert!(eq.overrun);
    assert_eq!(eq.prod, 2, "the third event was lost");
    assert!(r.sim.violations().iter().any(|v| v.contains("overrun")));
    let e = eqe(&r, &asy, 64, 0);
    assert_eq!(
        (e[1], u32::from_be_bytes(e[4..8].try_into().unwrap())),
        (0x0f, FIRST_EQ)
    );
    let ctx = r.icm_peek(EQC + u64::from(FIRST_EQ) * 64, 4);
    assert_eq!(ctx[0] >> 4, 9, "EQ status: overflow");
}

#[test]
fn doorbell_beyond_the_producer_or_for_a_sw_owned_eq_is_a_violation() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    create_eq(&mut r, FIRST_EQ, 3).unwrap();
    eq_doorbell(&r, FIRST_EQ, 5, false);
    eq_doorbell(&r, FIRST_EQ + 3, 0, true);
    let v = r.sim.violations();
    assert!(v.iter().any(|s| s.contains("beyond producer")), "{v:?}");
    assert!(
        v.iter().any(|s| s.contains("not in hardware ownership")),
        "{v:?}"
    );
    assert_eq!(r.sim.eq(FIRST_EQ).unwrap().cons, 0);
}

#[test]
fn cq_error_and_catastrophic_error_events() {
    let mut r = Raw::new();
    let (_, asy) = init_full(&mut r).unwrap();
    r.sim.inject_cq_error(FIRST_CQ, 1);
    let e = eqe(&r, &asy, 512, 0);
    assert_eq!((e[1], e[7], e[0x0f]), (0x04, FIRST_CQ as u8, 1));
    assert_eq!(r.sim.catas_syndrome(), 0);
    r.sim.raise_catastrophic_error();
    // Linux polls dword 0 of the buffer QUERY_FW reported (BAR0 + 0xa0000).
    assert_ne!(r.bar0.read_be32(0xa_0000), 0);
    assert_eq!(eqe(&r, &asy, 512, 1)[1], 0x08);
    assert_eq!(
        r.cmd(0, 0x1f, 0, Opcode::NOP),
        Err(CmdError::Status(Status::INTERNAL_ERR))
    );
    // A reset brings the device back.
    reset(&mut r);
    assert_eq!(r.sim.catas_syndrome(), 0);
    r.cmd_out(0, 0, Opcode::QUERY_FW).unwrap();
}

#[test]
fn corrupt_eqes_on_demand() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    let q = create_eq(&mut r, FIRST_EQ, 3).unwrap();
    create_cq(&mut r, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    r.sim
        .faults()
        .corrupt_next_eqe(EqeCorruption::WrongOwner)
        .corrupt_next_eqe(EqeCorruption::BadType)
        .corrupt_next_eqe(EqeCorruption::GarbageData);
    for _ in 0..4 {
        r.sim.inject_completion_event(FIRST_CQ);
    }
    assert_eq!(eqe(&r, &q, 8, 0)[31], 0x80, "looks hardware-owned");
    assert_eq!(eqe(&r, &q, 8, 1)[1], 0x3f);
    assert_eq!(&eqe(&r, &q, 8, 2)[4..8], &[0xff; 4]);
    let good = eqe(&r, &q, 8, 3);
    assert_eq!((good[1], good[31]), (0, 0));
}

#[test]
fn threaded_mode_sees_eq_doorbells_in_shared_memory() {
    let sim = SimHca::new_threaded(SimConfig {
        reset_duration: std::time::Duration::from_millis(1),
        ..Default::default()
    });
    let mut r = Raw::with(sim);
    r.timeout = std::time::Duration::from_secs(20);
    // No reset here (Linux sleeps a real second); bring the firmware up.
    let fw = r.cmd_out(0, 0, Opcode::QUERY_FW).unwrap();
    assert_eq!(&fw[2..4], &[0, 2]);
    let mut rr = r;
    init_no_reset(&mut rr).unwrap();
    create_eq(&mut rr, FIRST_EQ, 2).unwrap();
    create_cq(&mut rr, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    rr.sim.inject_completion_event(FIRST_CQ);
    eq_doorbell(&rr, FIRST_EQ, 1, true);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rr.sim.eq(FIRST_EQ).unwrap().cons != 1 {
        assert!(std::time::Instant::now() < deadline, "doorbell never seen");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(rr.sim.eq(FIRST_EQ).unwrap().armed);
    assert!(rr.sim.violations().is_empty(), "{:?}", rr.sim.violations());
}

#[test]
fn cq_and_send_doorbells_are_checked_and_kept_for_the_engines() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    create_eq(&mut r, FIRST_EQ, 3).unwrap();
    create_cq(&mut r, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    let page = UAR as usize * 4096;
    // Linux mlx4_cq_arm: sn 1, REQ_NOT (2 << 24), as one 64-bit store.
    r.bar2
        .write_be32_pair(page + 0x20, 1 << 28 | 2 << 24 | FIRST_CQ, 0);
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
    // Wrong UAR, unknown CQ, send doorbell for a QP in RESET.
    r.bar2
        .write_be32_pair(page + 4096 + 0x20, 2 << 24 | FIRST_CQ, 0);
    r.bar2
        .write_be32_pair(page + 0x20, 2 << 24 | (FIRST_CQ + 1), 0);
    r.bar2.write_be32(page + 0x14, 90 << 8);
    let v = r.sim.violations();
    assert!(
        v.iter().any(|s| s.contains("its context names UAR 128")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|s| s.contains("CQ 0x81") && s.contains("not in hardware")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|s| s.contains("send doorbell for QP 0x5a in RESET")),
        "{v:?}"
    );
    let pending = r.sim.pending_doorbells();
    assert_eq!(pending[0], (page + 0x20, 1 << 28 | 2 << 24 | FIRST_CQ));
    assert_eq!(pending[1], (page + 0x24, 0));
    assert_eq!(
        pending.len(),
        7,
        "three CQ doorbell pairs and one send doorbell"
    );
    assert_eq!(r.sim.cq_arms(FIRST_CQ), Some(2));
}

#[test]
fn event_mode_commands_also_complete_with_a_cmd_eqe() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    let q = create_eq(&mut r, FIRST_EQ, 3).unwrap();
    r.cmd(1 << 0x0a, FIRST_EQ, 0, Opcode::MAP_EQ).unwrap();
    // Linux mlx4_cmd_wait: E=1, token in dword 5.
    for off in [0, 4, 8, 0xc, 0x10] {
        r.bar0.write_be32(HCR + off, 0);
    }
    r.bar0.write_be32(HCR + 8, 0x1f);
    r.bar0.write_be32(HCR + 0x14, 0x0042 << 16);
    let t = if r.toggle { T } else { 0 };
    r.bar0.write_be32(HCR + 0x18, GO | E | t | 0x031);
    r.toggle = !r.toggle;
    while r.pending() {}
    let e = eqe(&r, &q, 8, 0);
    assert_eq!((e[1], e[6], e[7], e[0x0f], e[31]), (0x0a, 0x00, 0x42, 0, 0));
    assert!(r.sim.trace().last().unwrap().event);
}

#[test]
fn threaded_mode_consumes_doorbells_by_swap_so_repeats_count() {
    let sim = SimHca::new_threaded(SimConfig::default());
    let mut r = Raw::with(sim);
    r.timeout = std::time::Duration::from_secs(20);
    init_no_reset(&mut r).unwrap();
    create_eq(&mut r, FIRST_EQ, 2).unwrap();
    create_cq(&mut r, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    };
    for n in 1..=3u32 {
        // The same value three times: three doorbells.
        eq_doorbell(&r, FIRST_EQ, 0, true);
        wait("EQ doorbell", &|| {
            r.sim.eq(FIRST_EQ).unwrap().doorbells == n
        });
        let page = UAR as usize * 4096;
        r.bar2
            .write_be32_pair(page + 0x20, 1 << 28 | 2 << 24 | FIRST_CQ, 0);
        wait("CQ arm", &|| r.sim.cq_arms(FIRST_CQ) == Some(n));
    }
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
}
