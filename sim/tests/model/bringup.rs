//! Linux-order bring-up (porting map 2.2) against the model: every step
//! succeeds, no violations, and the trace reads like Linux's command log.

use crate::harness::*;
use sim::Opcode;

#[test]
fn linux_order_bring_up_runs_clean() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    let v = r.sim.violations();
    assert!(v.is_empty(), "{v:?}");
    assert!(r.sim.dma_faults().is_empty());
    let names: Vec<&str> = r.sim.trace().iter().map(|e| e.name).collect();
    let mut dedup = names.clone();
    dedup.dedup();
    assert_eq!(
        dedup,
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
    let _ = Opcode::NOP;
}
