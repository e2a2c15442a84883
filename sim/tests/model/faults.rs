//! Fault injection per opcode: status override, stuck GO, extra delay,
//! counted faults, absurd capabilities.

use std::time::Duration;

use crate::harness::*;
use sim::hca::faults::{BadCap, OpcodeFault};
use sim::{Opcode, Status};

#[test]
fn a_status_override_fails_exactly_that_command_in_the_bring_up() {
    let ops = [
        Opcode::QUERY_FW,
        Opcode::MAP_FA,
        Opcode::RUN_FW,
        Opcode::MOD_STAT_CFG,
        Opcode::QUERY_DEV_CAP,
        Opcode::QUERY_PORT,
        Opcode::SET_ICM_SIZE,
        Opcode::MAP_ICM_AUX,
        Opcode::MAP_ICM,
        Opcode::INIT_HCA,
        Opcode::QUERY_ADAPTER,
        Opcode::WRITE_MTT,
        Opcode::SW2HW_EQ,
        Opcode::MAP_EQ,
        Opcode::NOP,
        Opcode::CONF_SPECIAL_QP,
        Opcode::MAD_IFC,
        Opcode::SET_PORT,
    ];
    for op in ops {
        let mut r = Raw::new();
        r.sim
            .faults()
            .set(op, OpcodeFault::status(Status::RESOURCE_BUSY).times(1));
        let res = init_full(&mut r).map(|_| ());
        assert_eq!(res, Err(CmdError::Status(Status::RESOURCE_BUSY)), "{op}");
        let t = r.sim.trace();
        let last = t.last().unwrap();
        assert_eq!(
            (last.opcode, last.status, last.injected),
            (op.0, 0x06, true),
            "{op}"
        );
        assert!(
            t[..t.len() - 1].iter().all(|e| e.ok() && !e.injected),
            "{op}"
        );
        assert!(r.sim.faults().plan().opcodes.is_empty(), "{op}: used up");
    }
}

#[test]
fn an_injected_failure_has_no_effect() {
    let mut r = Raw::new();
    r.sim.faults().set(
        Opcode::INIT_HCA,
        OpcodeFault::status(Status::BAD_PARAM).times(1),
    );
    assert!(init(&mut r).is_err());
    assert!(!r.sim.is_initialized());
    let ih = init_hca_params().encode();
    r.cmd_in(&ih, 0, 0, Opcode::INIT_HCA).unwrap();
    assert!(r.sim.is_initialized());
}

#[test]
fn stuck_go_per_opcode_only_blocks_that_opcode() {
    let mut r = Raw::new();
    r.timeout = Duration::from_millis(50);
    r.sim
        .faults()
        .set(Opcode::QUERY_DEV_CAP, OpcodeFault::stuck());
    load_fw(&mut r).unwrap();
    assert_eq!(
        r.cmd_out(0, 0, Opcode::QUERY_DEV_CAP).map(|_| ()),
        Err(CmdError::Timeout)
    );
    assert!(r.pending(), "GO still set");
    // A reset is the only way out.
    r.sim.faults().clear_all();
    reset(&mut r);
    r.cmd_out(0, 0, Opcode::QUERY_FW).unwrap();
}

#[test]
fn extra_polls_and_extra_time_delay_completion() {
    let mut r = Raw::new();
    r.sim.faults().set(
        Opcode::QUERY_FW,
        OpcodeFault::delay(50, Duration::from_millis(3)),
    );
    let clock = r.sim.fake_clock().unwrap();
    let t0 = hal::Clock::now_ns(&*clock);
    r.cmd_out(0, 0, Opcode::QUERY_FW).unwrap();
    let spent = hal::Clock::now_ns(&*clock) - t0;
    assert!(spent >= 3_000_000, "{spent} ns");
    let d = r.sim.trace()[0].duration.unwrap();
    assert!(d >= Duration::from_millis(3));
    // The deadline is honoured: a 1 ms budget fails against a 3 ms delay.
    r.timeout = Duration::from_millis(1);
    assert_eq!(
        r.cmd_out(0, 0, Opcode::QUERY_FW).map(|_| ()),
        Err(CmdError::Timeout)
    );
}

#[test]
fn absurd_capabilities() {
    let mut r = Raw::new();
    r.sim
        .faults()
        .bad_cap(BadCap::HugeLogMaxQps)
        .bad_cap(BadCap::NoPorts)
        .bad_cap(BadCap::MinPageTooLarge)
        .bad_cap(BadCap::ZeroQpcEntrySize)
        .bad_cap(BadCap::HugeUarSize)
        .bad_cap(BadCap::Byte {
            offset: 0x98,
            value: 0xee,
        });
    load_fw(&mut r).unwrap();
    let c = r.cmd_out(0, 0, Opcode::QUERY_DEV_CAP).unwrap();
    assert_eq!(c[0x13], 0x1f);
    assert_eq!(c[0x37], 0);
    assert_eq!(c[0x4b], 16);
    assert_eq!(&c[0x82..0x84], &[0, 0]);
    assert_eq!(c[0x49], 20);
    assert_eq!(c[0x98], 0xee);
}
