//! The model's firmware command interface: a sequence of HCR commands (any opcode, opcode modifier, input modifier, parameters pointing at a mailbox of the input's bytes or anywhere), on a card just reset, with its firmware running, or brought up as Linux does with its EQs and ports (the input says which), with register stores to BAR0 and doorbells on BAR2 between them.
//!
//! Every command must complete (GO clears: no hang, no busy HCR left
//! behind), with a status or a violation recorded; no panic; the card
//! still runs NOP. (Memory the card was not given is the WQE and link
//! targets' check: here a command's raw parameters may give it any page.)
//!
//! Every input starts from the state it names, reached from a card reset
//! as a driver's probe reaches it, so what it covers does not depend on
//! the inputs before it (see `start`).

#![no_main]

use arbitrary::Arbitrary;
use legoib_fuzz::harness::*;
use libfuzzer_sys::fuzz_target;
use sim::Opcode;

#[derive(Arbitrary, Debug)]
enum Param {
    Inbox,
    Outbox,
    Zero,
    Raw(u64),
}

#[derive(Arbitrary, Debug)]
enum Step {
    Cmd {
        op: u16,
        known: bool,
        op_mod: u8,
        in_mod: u32,
        in_param: Param,
        out_param: Param,
        /// Mailbox bytes: (offset, bytes) written over zeros.
        mailbox: Vec<(u16, Vec<u8>)>,
    },
    Bar0(u32, u32),
    Doorbell(u32, u32),
    /// An EQ created as Linux's `mlx4_create_eq` does (pages, MTT,
    /// SW2HW_EQ with a valid context), for the raw commands after it to
    /// map, query, arm and destroy: a valid EQ context out of raw bytes
    /// took millions of executions.
    Eq {
        eqn: u8,
        log_nent: u8,
    },
    /// A command on one of the EQs this input created, its number in the
    /// input modifier as Linux puts it: MAP_EQ (an event mask, the unmap
    /// bit), QUERY_EQ or HW2SW_EQ. A raw command's 32-bit modifier names
    /// such an EQ only by chance: HW2SW_EQ's success path (every mapped
    /// event unmapped first) came at 5.4 million executions in the second
    /// campaign (fuzz/README.md).
    OnEq {
        which: bool,
        op: EqOp,
        mask: u64,
        unmap: bool,
    },
}

#[derive(Arbitrary, Debug)]
enum EqOp {
    Map,
    Query,
    Hw2Sw,
}

/// Where an input's commands start: a card just reset, one whose
/// firmware runs (MAP_FA, RUN_FW), or one brought up as Linux does
/// (INIT_HCA, EQs, ports).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Start {
    Reset,
    Firmware,
    Initialised,
}

#[derive(Arbitrary, Debug)]
struct Input {
    start: Start,
    steps: Vec<Step>,
}

thread_local! {
    static RIG: std::cell::RefCell<(Option<Raw>, u32)> = const { std::cell::RefCell::new((None, 0)) };
}

/// One card for 1,000 inputs (a new one then: its command trace grows).
/// 8 MiB of DMA memory hold the initialised card's ICM (5.6 MB) with
/// room for the input's EQs; a larger arena costs more to build than
/// the runs of its inputs.
fn make() -> Raw {
    let mut r = legoib_fuzz::new_card(0, 8 << 20);
    r.timeout = std::time::Duration::from_secs(2);
    r
}

/// Resets the card and brings it to `start` (`legoib_fuzz::reset_card`
/// says why every input starts from a reset). Replayed on one card and
/// on a new card per input, a corpus covers the same edges, but for the
/// new cards' drop code.
fn start(r: &mut Raw, start: Start) {
    legoib_fuzz::reset_card(r);
    let _ = match start {
        Start::Reset => Ok(()),
        Start::Firmware => load_fw_no_reset(r),
        Start::Initialised => load_fw_no_reset(r)
            .and_then(|()| init_after_fw_pub(r))
            .and_then(|()| init_after_hca(r).map(drop)),
    };
    r.sim.take_violations();
}

fuzz_target!(|input: Input| {
    legoib_fuzz::persistent(&RIG, 1000, make, |r| {
        start(r, input.start);
        run(r, &input);
        true
    });
});

fn run(r: &mut Raw, input: &Input) {
    let (inbox, outbox) = (r.inbox.bus_addr().0, r.outbox.bus_addr().0);
    // At most two EQs per input.
    let mut eqs = Vec::new();
    for step in input.steps.iter().take(32) {
        match step {
            Step::Eq { eqn, log_nent } => {
                if eqs.len() < 2 {
                    let eqn = u32::from(*eqn) % 32;
                    let _ = create_eq(r, eqn, log_nent % 8);
                    eqs.push(eqn);
                }
            }
            Step::OnEq {
                which,
                op,
                mask,
                unmap,
            } => {
                let Some(&eqn) = eqs.get(usize::from(*which) % eqs.len().max(1)) else {
                    continue;
                };
                let res = match op {
                    EqOp::Map => r.post(*mask, 0, eqn | u32::from(*unmap) << 31, 0, Opcode::MAP_EQ),
                    EqOp::Query => r.post(0, outbox, eqn, 0, Opcode::QUERY_EQ),
                    EqOp::Hw2Sw => r.post(0, outbox, eqn, 0, Opcode::HW2SW_EQ),
                };
                assert!(
                    !matches!(res, Err(CmdError::Timeout) | Err(CmdError::Busy)),
                    "{op:?} on EQ {eqn} -> {res:?}"
                );
            }
            Step::Cmd {
                op,
                known,
                op_mod,
                in_mod,
                in_param,
                out_param,
                mailbox,
            } => {
                let op = if *known {
                    Opcode::ALL[usize::from(*op) % Opcode::ALL.len()]
                } else {
                    Opcode(op & 0xfff)
                };
                // CLOSE_HCA and the unmaps are fine too: the card must take
                // any order.
                r.inbox.fill(0, 4096, 0);
                for (off, bytes) in mailbox.iter().take(8) {
                    let off = usize::from(*off) % 4096;
                    let n = bytes.len().min(4096 - off);
                    r.inbox.write_bytes(off, &bytes[..n]);
                }
                let p = |x: &Param| match x {
                    Param::Inbox => inbox,
                    Param::Outbox => outbox,
                    Param::Zero => 0,
                    Param::Raw(v) => *v,
                };
                let res = r.post(p(in_param), p(out_param), *in_mod, op_mod & 0xf, op);
                assert!(
                    !matches!(res, Err(CmdError::Timeout) | Err(CmdError::Busy)),
                    "{op} -> {res:?}"
                );
            }
            Step::Bar0(off, v) => {
                let off = (*off as usize % (1 << 20)) & !3;
                // Not the HCR (commands go through `post`) nor the reset
                // dword (a reset is not a fuzzed store).
                if !(0xf_0000..0xf_0400).contains(&off) && !(HCR..HCR + 0x20).contains(&off) {
                    r.bar0.write32(off, *v);
                }
            }
            Step::Doorbell(off, v) => {
                let off = (*off as usize % (8 << 20)) & !3;
                r.bar2.write32(off, *v);
            }
        }
        r.sim.take_violations();
    }
    let res = r.post(0, 0, 0x1f, 0, Opcode::NOP);
    assert!(
        !matches!(res, Err(CmdError::Timeout) | Err(CmdError::Busy)),
        "NOP at the end: {res:?}"
    );
}
