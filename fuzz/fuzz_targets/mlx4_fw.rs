//! mlx4_core's bring-up against firmware answers from the fuzzer: QUERY_FW, QUERY_DEV_CAP, QUERY_PORT, QUERY_ADAPTER, QUERY_HCA, MAD_IFC (PortInfo) and SET_ICM_SIZE answers with any bytes written over a good ConnectX-3's, and any command failing with any status, through the real `probe` (validation, the profile, ICM, the tables, the ports) and `teardown`.
//!
//! Absurd capabilities must be refused by `DevCap::validate` or end in an
//! error further on (out of DMA memory, a table that cannot be built),
//! never in a panic or an overflow. A probe that succeeds is torn down;
//! either way every byte of DMA memory is given back.

#![no_main]

use arbitrary::Arbitrary;
use legoib_fuzz::fwdev::{Answers, FwRig};
use libfuzzer_sys::fuzz_target;
use mlx4_core::Profile;

#[derive(Arbitrary, Debug)]
enum Cmd {
    QueryFw,
    QueryDevCap,
    QueryPort,
    QueryAdapter,
    QueryHca,
    MadIfc,
}

impl Cmd {
    fn op(&self) -> u16 {
        match self {
            Cmd::QueryFw => 0x004,
            Cmd::QueryDevCap => 0x003,
            Cmd::QueryPort => 0x043,
            Cmd::QueryAdapter => 0x006,
            Cmd::QueryHca => 0x00b,
            Cmd::MadIfc => 0x024,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Bytes written over the answers: (command, offset, value).
    patches: Vec<(Cmd, u16, u8)>,
    /// The n-th command fails with a status (up to three: an undo path
    /// whose own command fails needs two).
    fail: Vec<(u8, u8)>,
    aux_pages: Option<u16>,
    /// Profile: log2 of the QP count (8 + this % 4).
    qp_log: u8,
}

fuzz_target!(|input: Input| {
    let answers = Answers {
        patches: input
            .patches
            .iter()
            .take(64)
            .map(|(c, off, v)| (c.op(), usize::from(*off), *v))
            .collect(),
        fail: input
            .fail
            .iter()
            .take(3)
            .map(|&(n, s)| (usize::from(n), s))
            .collect(),
        aux_pages: input.aux_pages.map(u64::from),
    };
    // Small tables (the research profile's ICM would take 64 MiB of DMA
    // memory to set up per run; the sizing code is the same).
    let rig = FwRig::new(answers, 6 << 20);
    let profile = Profile {
        num_qp: 1 << (8 + input.qp_log % 4),
        rdmarc_per_qp: 1 << 2,
        num_srq: 1 << 6,
        num_cq: 1 << 6,
        num_mcg: 1 << 6,
        num_mpt: 1 << 8,
        num_mtt_segs: 1 << 8,
        log_mgm_entry_size: 10,
        eth_fc_qp_regions: false,
        port_type: [None; mlx4_core::MAX_PORTS],
    };
    if let Ok(dev) = mlx4_core::probe(rig.pdev(), rig.pool.clone(), rig.clock.clone(), profile) {
        let _ = dev.fw_ver_string();
        let _ = dev.board_id();
        let _ = dev.teardown();
    }
    // A probe that failed anywhere, or a teardown, gives every DMA byte
    // back: a driver that keeps some on an error path loses memory each
    // time a card is refused.
    assert_eq!(
        rig.dma_in_use(),
        (0, 0),
        "DMA memory kept after probe/teardown"
    );
});
