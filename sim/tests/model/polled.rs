//! The polled front end (cx3-emu's loop, `SimHca::poll`): what a guest
//! writes between two polling passes is taken in the order the guest wrote
//! it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::harness::profile::*;
use crate::harness::*;
use sim::{Opcode, SimConfig, SimHca};

/// A polled model brought up (Linux order) with CQs `FIRST_CQ` and
/// `FIRST_CQ + 1`, both on the kernel's UAR page, while a thread polls;
/// the thread has stopped when this returns.
fn polled_with_two_cqs() -> Raw {
    let sim = SimHca::new_polled_local(SimConfig::default());
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (s, stop) = (sim.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if !s.poll() {
                    std::thread::yield_now();
                }
            }
        })
    };
    let mut r = Raw::with(sim);
    init_full(&mut r).unwrap();
    create_cq(&mut r, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    create_cq(&mut r, FIRST_CQ + 1, 6, FIRST_EQ as u8).unwrap();
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();
    r
}

/// Linux arms a CQ through the UAR (`mlx4_cq_arm`) and then hands it back
/// with HW2SW_CQ; with a busy host both land before the model's next
/// pass. The arm was rung while the CQ was the hardware's: the pass must
/// take it before the command (another CQ keeps the UAR page in use, so
/// the pass still looks at it after the command).
#[test]
fn an_arm_and_then_hw2sw_cq_in_one_pass_is_no_violation() {
    let mut r = polled_with_two_cqs();
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
    let page = UAR as usize * 4096;
    r.bar2
        .write_be32_pair(page + 0x20, 1 << 28 | 2 << 24 | FIRST_CQ, 0);
    // HW2SW_CQ without an output mailbox (op_mod 1), written as
    // `mlx4_cmd_post` does, GO last; nobody polls yet.
    assert!(!r.pending());
    for (i, v) in [0, 0, FIRST_CQ, 0, 0, 0xffff << 16].into_iter().enumerate() {
        r.bar0.write_be32(HCR + 4 * i, v);
    }
    let go = GO | r.next_t() | 1 << 12 | u32::from(Opcode::HW2SW_CQ.0);
    r.bar0.write_be32(HCR + 0x18, go);
    r.toggle = !r.toggle;
    // One pass sees both; more only to let the command complete.
    r.sim.poll();
    for _ in 0..1000 {
        if !r.pending() {
            break;
        }
        r.sim.poll();
    }
    assert!(!r.pending(), "HW2SW_CQ did not complete");
    assert_eq!(r.bar0.read_be32(HCR + 0x18) >> 24, 0, "status");
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
    assert_eq!(r.sim.cq_arms(FIRST_CQ), None, "the CQ is software's now");
    assert_eq!(r.sim.cq_arms(FIRST_CQ + 1), Some(0));
}
