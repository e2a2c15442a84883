//! What the model refuses or records that it used to accept.
//!
//! Teardown state a wrong modifier leaves behind (MAP_EQ without the unmap bit,
//! CLOSE_PORT on the wrong port), firmware-reserved MTT entries and PDs, INIT_HCA
//! reserved and flag bits (a byte-swapped flags dword) and the QUERY_HCA round
//! trip, reserved modifier, context, mailbox and HCR bits.

use crate::harness::profile::*;
use crate::harness::*;
use sim::hca::layout::{get8, put32};
use sim::{Opcode, Status};

fn st(s: Status) -> R {
    Err(CmdError::Status(s))
}

const UNMAP: u32 = 1 << 31;
const ASYNC_EQ: u32 = FIRST_EQ + 1;

/// Linux's teardown of the EQ table after `init_full`, with the MAP_EQ
/// input modifier given.
fn eq_teardown(r: &mut Raw, map_eq_in_mod: u32) {
    r.cmd(ASYNC_MASK, map_eq_in_mod, 0, Opcode::MAP_EQ).unwrap();
    for eqn in [FIRST_EQ, ASYNC_EQ] {
        r.cmd_out(eqn, 0, Opcode::HW2SW_EQ).unwrap();
    }
}

#[test]
fn teardown_with_the_map_eq_unmap_bit_is_clean() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    r.cmd(0, 0, 0, Opcode::CONF_SPECIAL_QP).unwrap();
    eq_teardown(&mut r, ASYNC_EQ | UNMAP);
    assert_eq!(r.sim.async_eq(0x09), None);
    r.cmd(0, 0, 0, Opcode::CLOSE_HCA).unwrap();
    unmap_all(&mut r).unwrap();
    assert_eq!(r.sim.violations(), Vec::<String>::new());
}

#[test]
fn map_eq_without_the_unmap_bit_at_teardown_is_recorded_at_hw2sw_eq() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    // The porter's mistake: the unmap flag dropped from the modifier. The
    // command itself is a valid MAP_EQ (it maps the events again).
    eq_teardown(&mut r, ASYNC_EQ);
    assert!(
        r.violated("HW2SW_EQ 33 while async events 0x01"),
        "{:#?}",
        r.sim.violations()
    );
    assert_eq!(r.sim.async_eq(0x09), None, "the mappings went with the EQ");
}

#[test]
fn close_hca_with_async_events_still_mapped_is_recorded() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    // No MAP_EQ unmap and the EQs left to CLOSE_HCA.
    r.cmd(0, 0, 0, Opcode::CLOSE_HCA).unwrap();
    assert!(r.violated("CLOSE_HCA with async events 0x01"));
    assert!(r.violated("CLOSE_HCA with 2 EQs still in hardware ownership"));
}

#[test]
fn map_eq_refuses_reserved_modifier_bits() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    // Unmap in bit 30 instead of 31.
    assert_eq!(
        r.cmd(ASYNC_MASK, ASYNC_EQ | 1 << 30, 0, Opcode::MAP_EQ),
        st(Status::BAD_PARAM)
    );
    assert!(r.violated("MAP_EQ input modifier 0x40000021"));
    assert_eq!(r.sim.async_eq(0x09), Some(ASYNC_EQ), "nothing unmapped");
    assert_eq!(
        r.cmd(ASYNC_MASK, 64, 0, Opcode::MAP_EQ),
        st(Status::BAD_INDEX),
        "EQN beyond the table"
    );
}

#[test]
fn close_port_on_the_wrong_port_leaves_it_open_and_close_hca_records_it() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    r.cmd(0, 1, 0, Opcode::INIT_PORT).unwrap();
    // Port number in the wrong byte: refused, the port stays open.
    assert_eq!(
        r.cmd(0, 1 << 8, 0, Opcode::CLOSE_PORT),
        st(Status::BAD_PARAM)
    );
    eq_teardown(&mut r, ASYNC_EQ | UNMAP);
    r.cmd(0, 0, 0, Opcode::CLOSE_HCA).unwrap();
    assert!(
        r.violated("CLOSE_HCA with port 1 still open"),
        "{:#?}",
        r.sim.violations()
    );
}

/// Writes valid MTT entries straight into ICM at `first..first + n` (as
/// native Linux does), so that only the reserved-range check can refuse
/// them.
fn poke_mtts(r: &mut Raw, first: u64, n: usize) -> Vec<u64> {
    let pages = r.pages(n);
    for (i, pa) in pages.iter().enumerate() {
        r.icm_poke(MTT + (first + i as u64) * 8, &(pa | 1).to_be_bytes());
    }
    pages
}

#[test]
fn firmware_reserved_mtt_entries_are_refused_everywhere() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    poke_mtts(&mut r, 0, 16);
    let refused = |r: &mut Raw, res: R, what: &str| {
        assert_eq!(res, st(Status::BAD_RESOURCE), "{what}");
        assert!(
            r.violated("firmware-reserved MTT entries"),
            "{what}: {:#?}",
            r.sim.violations()
        );
        r.sim.take_violations();
    };
    // WRITE_MTT into the range, and straddling its end.
    let res = write_mtt(&mut r, 0, &[0x1_0000_0000]);
    refused(&mut r, res, "WRITE_MTT at 0");
    let res = write_mtt(&mut r, 15, &[0x1_0000_0000, 0x1_0000_1000]);
    refused(&mut r, res, "WRITE_MTT at 15..17");
    // Contexts whose MTT base is entry 8.
    let res = r.cmd_in(&eq_ctx(6, 8, 0), FIRST_EQ + 2, 0, Opcode::SW2HW_EQ);
    refused(&mut r, res, "EQ");
    let db = r.pages(1)[0];
    let res = r.cmd_in(
        &cq_ctx(6, UAR, FIRST_EQ as u8, 8, db),
        FIRST_CQ + 1,
        0,
        Opcode::SW2HW_CQ,
    );
    refused(&mut r, res, "CQ");
    let res = r.cmd_in(
        &srq_ctx(FIRST_SRQ, 6, 2, PD, 8, db),
        FIRST_SRQ,
        0,
        Opcode::SW2HW_SRQ,
    );
    refused(&mut r, res, "SRQ");
    let cq = create_cq(&mut r, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    drop(cq);
    let qpn = BASE_SQPN + 8;
    let res = r.cmd_in(
        &rst2init(qpn, 3, PD, FIRST_CQ, 8, db).0,
        qpn,
        0,
        Opcode::RST2INIT_QP,
    );
    refused(&mut r, res, "QP");
    let res = r.cmd_in(
        &mpt_entry(FIRST_MPT, PD, false, 0x1000, 4096, 8),
        FIRST_MPT,
        0,
        Opcode::SW2HW_MPT,
    );
    refused(&mut r, res, "MPT");
    // The same MPT one entry above the range is fine.
    poke_mtts(&mut r, 16, 1);
    r.cmd_in(
        &mpt_entry(FIRST_MPT, PD, false, 0x1000, 4096, 16),
        FIRST_MPT,
        0,
        Opcode::SW2HW_MPT,
    )
    .unwrap();
    write_mtt(&mut r, 16, &[0x1_0000_0000]).unwrap();
    assert_eq!(r.sim.violations(), Vec::<String>::new());
}

#[test]
fn mtt_entries_with_reserved_bits_are_refused() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    let pa = r.pages(1)[0];
    r.icm_poke(MTT + 40 * 8, &(pa | 1 | 2).to_be_bytes());
    assert_eq!(
        r.cmd_in(&eq_ctx(6, 40, 0), FIRST_EQ + 2, 0, Opcode::SW2HW_EQ),
        st(Status::BAD_PARAM)
    );
    assert!(r.violated("reserved bits 2:1"));
    let mut b = vec![0u8; 24];
    b[7] = 48;
    b[15] = 1; // reserved quadword
    b[16..24].copy_from_slice(&(pa | 1).to_be_bytes());
    assert_eq!(r.cmd_in(&b, 1, 0, Opcode::WRITE_MTT), st(Status::BAD_PARAM));
}

#[test]
fn firmware_reserved_pds_are_refused() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    assert_eq!(
        r.cmd_in(
            &mpt_entry(FIRST_MPT, 0, true, 0, u64::MAX, 0),
            FIRST_MPT,
            0,
            Opcode::SW2HW_MPT
        ),
        st(Status::BAD_RESOURCE)
    );
    assert!(r.violated("PD 0 is one of the 4 firmware-reserved PDs"));
}

/// The INIT_HCA mailbox Linux builds on x86 for the model's capabilities:
/// the UD port check flag (no IPoIB checksum flag: the model does not
/// report the capability), 64-byte cache lines, memory windows.
fn linux_init_hca() -> Vec<u8> {
    let mut b = init_hca_params().encode();
    put32(&mut b, 0x14, 1 << 0);
    b[0xf8] = 0x80;
    b
}

#[test]
fn init_hca_refuses_reserved_bits_and_a_byte_swapped_flags_dword() {
    let mut r = Raw::new();
    init_up_to_hca(&mut r).unwrap();
    let good = linux_init_hca();
    let flags = u32::from_be_bytes(good[0x14..0x18].try_into().unwrap());
    type Edit = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "byte-swapped flags",
            Box::new(move |b| put32(b, 0x14, flags.swap_bytes())),
            "a byte-swapped flags dword",
        ),
        (
            "big-endian host",
            Box::new(|b| b[0x17] |= 2),
            "host big-endian",
        ),
        (
            "counters not reported",
            Box::new(|b| b[0x17] |= 1 << 4),
            "did not report",
        ),
        (
            "IPoIB checksum not reported",
            Box::new(|b| b[0x17] |= 1 << 3),
            "did not report",
        ),
        ("router mode", Box::new(|b| b[0x10] = 0x80), "byte 0x010"),
        (
            "cache line reserved bits",
            Box::new(|b| b[0x0e] |= 2),
            "byte 0x00e",
        ),
        (
            "core clock is output only",
            Box::new(|b| b[0x0c] = 1),
            "byte 0x00c",
        ),
        (
            "multicast hash function",
            Box::new(|b| b[0xd8] = 1),
            "byte 0x0d8",
        ),
        (
            "64-byte entries dword",
            Box::new(|b| b[0x5b] = 1),
            "dword 0x58",
        ),
        (
            "UAR log high nibble",
            Box::new(|b| b[0x12a] |= 0x10),
            "byte 0x12a",
        ),
        (
            "tail of the mailbox",
            Box::new(|b| b[0x1ff] = 1),
            "byte 0x1ff",
        ),
    ];
    for (what, mutate, msg) in cases {
        let mut b = good.clone();
        mutate(&mut b);
        assert_eq!(
            r.cmd_in(&b, 0, 0, Opcode::INIT_HCA),
            st(Status::BAD_PARAM),
            "{what}"
        );
        assert!(r.violated(msg), "{what}: {:#?}", r.sim.violations());
        assert!(!r.sim.is_initialized(), "{what}");
        r.sim.take_violations();
    }
    // What Linux 6.1 writes there too: cache line bit 4, num_sys_eqs 0.
    let mut modern = good.clone();
    modern[0x0e] |= 1 << 4;
    r.cmd_in(&modern, 0, 0, Opcode::INIT_HCA).unwrap();
    assert!(r.sim.is_initialized());
}

#[test]
fn query_hca_returns_exactly_what_init_hca_accepted() {
    let mut r = Raw::new();
    init_up_to_hca(&mut r).unwrap();
    assert_eq!(
        r.cmd_out(0, 0, Opcode::QUERY_HCA),
        st(Status::BAD_SYS_STATE).map(|()| Vec::new())
    );
    let good = linux_init_hca();
    r.cmd_in(&good, 0, 0, Opcode::INIT_HCA).unwrap();
    let out = r.cmd_out(0, 0, Opcode::QUERY_HCA).unwrap();
    let clock = u16::from_be_bytes([out[0x0c], out[0x0d]]);
    assert_eq!(clock, r.sim.config().core_clock_mhz);
    let mut want = good.clone();
    want[0x0c..0x0e].copy_from_slice(&clock.to_be_bytes());
    assert_eq!(
        &out[..0x200],
        &want[..],
        "QUERY_HCA = INIT_HCA + core clock"
    );
    assert_eq!(get8(&out, 0x14 + 3), 0x01, "flags as given");
    r.cmd(0, 0, 0, Opcode::CLOSE_HCA).unwrap();
    assert_eq!(
        r.cmd_out(0, 0, Opcode::QUERY_HCA),
        st(Status::BAD_SYS_STATE).map(|()| Vec::new())
    );
}

#[test]
fn init_hca_refuses_tables_no_bigger_than_their_reserved_part() {
    let mut r = Raw::new();
    init_up_to_hca(&mut r).unwrap();
    for (what, off, v) in [
        ("QPs = reserved", 0x37usize, 6u8),
        ("EQs = reserved", 0x87, 5),
        ("MPTs = reserved", 0xfb, 4),
        ("MGM entry too small", 0xd3, 5),
    ] {
        let mut b = linux_init_hca();
        b[off] = (b[off] & !0x1f) | v;
        assert_eq!(
            r.cmd_in(&b, 0, 0, Opcode::INIT_HCA),
            st(Status::BAD_PARAM),
            "{what}"
        );
    }
}

#[test]
fn init_hca_refuses_a_table_not_aligned_on_its_size() {
    let mut r = Raw::new();
    init_up_to_hca(&mut r).unwrap();
    // The CQC table (256 x 64 B = 16 KiB) moved to a free spot aligned to
    // its entries but not to its size.
    let mut p = init_hca_params();
    p.cqc_base = END + 0x2000;
    let mut b = p.encode();
    b[0x14..0x18].copy_from_slice(&linux_init_hca()[0x14..0x18]);
    assert_eq!(r.cmd_in(&b, 0, 0, Opcode::INIT_HCA), st(Status::BAD_PARAM));
    p.cqc_base = END;
    let b = p.encode();
    r.cmd_in(&b, 0, 0, Opcode::INIT_HCA).unwrap();
}

#[test]
fn reserved_modifier_bits_are_refused_not_masked() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    create_cq(&mut r, FIRST_CQ, 6, FIRST_EQ as u8).unwrap();
    // The CQN with a stray bit above 23: once masked to the right CQ.
    assert_eq!(
        r.cmd(0, FIRST_CQ | 1 << 24, 1, Opcode::HW2SW_CQ),
        st(Status::BAD_PARAM)
    );
    assert!(r.violated("reserved bits 31:24"));
    assert_eq!(r.cmd(0, FIRST_CQ, 2, Opcode::HW2SW_CQ), st(Status::BAD_OP));
    assert!(r.sim.cq_arms(FIRST_CQ).is_some(), "still hardware-owned");
    // EQN 33 plus bit 10: once masked (10 bits) to EQ 33.
    assert_eq!(
        r.cmd_out(ASYNC_EQ | 1 << 10, 0, Opcode::QUERY_EQ),
        st(Status::BAD_INDEX).map(|()| Vec::new())
    );
    assert_eq!(
        r.cmd_out(ASYNC_EQ, 5, Opcode::HW2SW_EQ).err(),
        Some(CmdError::Status(Status::BAD_OP))
    );
    // QP modify: bit 31 (SQD event) only on RTS2SQD.
    let qpn = BASE_SQPN + 8;
    let q = queue(&mut r, 2).unwrap();
    let db = r.pages(1)[0];
    let m = rst2init(qpn, 3, PD, FIRST_CQ, q.mtt, db);
    assert_eq!(
        r.cmd_in(&m.0, qpn | 1 << 31, 0, Opcode::RST2INIT_QP),
        st(Status::BAD_PARAM)
    );
    assert_eq!(
        r.cmd_in(&m.0, qpn, 1, Opcode::RST2INIT_QP),
        st(Status::BAD_OP)
    );
    r.cmd_in(&m.0, qpn, 0, Opcode::RST2INIT_QP).unwrap();
    // 2RST: Linux's op_mod 2 and iPXE's 3 both work.
    r.cmd(0, qpn, 3, Opcode::RST_QP).unwrap();
    assert_eq!(r.cmd(0, qpn, 4, Opcode::RST_QP), st(Status::BAD_OP));
    // Ports, CONF_SPECIAL_QP, CLOSE_HCA.
    assert_eq!(
        r.cmd_out(0x101, 0, Opcode::QUERY_PORT),
        st(Status::BAD_PARAM).map(|()| Vec::new())
    );
    assert_eq!(
        r.cmd(0, BASE_SQPN, 1, Opcode::CONF_SPECIAL_QP),
        st(Status::BAD_OP)
    );
    assert_eq!(r.cmd(0, 0, 2, Opcode::CLOSE_HCA), st(Status::BAD_OP));
    assert!(r.sim.is_initialized());
}

#[test]
fn eq_and_cq_context_reserved_bits_are_refused() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    let q = queue(&mut r, 2).unwrap();
    for (what, off, v) in [
        (
            "EQ owner bit Linux defines but never sets",
            0x00usize,
            0x01u8,
        ),
        ("reserved dword 1", 0x05, 1),
        ("page offset below bit 5", 0x0b, 0x10),
        ("intr above bit 9", 0x15, 1),
        ("producer counter top byte", 0x2c, 1),
    ] {
        let mut c = eq_ctx(6, q.mtt, 0);
        c[off] |= v;
        assert_eq!(
            r.cmd_in(&c, FIRST_EQ + 2, 0, Opcode::SW2HW_EQ),
            st(Status::BAD_PARAM),
            "{what}"
        );
        assert!(r.violated("context dword"), "{what}");
    }
    let mut c = eq_ctx(6, q.mtt, 0);
    c[1] |= 1 << 2; // EC
    assert_eq!(
        r.cmd_in(&c, FIRST_EQ + 2, 0, Opcode::SW2HW_EQ),
        st(Status::BAD_PARAM)
    );
    assert!(r.violated("event coalescing"));
    let db = r.pages(1)[0];
    let mut c = cq_ctx(6, UAR, FIRST_EQ as u8, q.mtt, db);
    c[0x16] = 0x02; // EQN bit 9
    assert_eq!(
        r.cmd_in(&c, FIRST_CQ, 0, Opcode::SW2HW_CQ),
        st(Status::BAD_PARAM)
    );
    // iPXE's CQ context: delivery state "fired" (0xa).
    let mut c = cq_ctx(6, UAR, FIRST_EQ as u8, q.mtt, db);
    c[2] = 0x0a;
    r.cmd_in(&c, FIRST_CQ, 0, Opcode::SW2HW_CQ).unwrap();
    // iPXE's EQ context: "fired" with overrun ignore; it never overruns.
    let mut c = eq_ctx(6, q.mtt, 0);
    c[1] |= 1 << 1;
    c[2] = 0x0a;
    r.cmd_in(&c, FIRST_EQ + 2, 0, Opcode::SW2HW_EQ).unwrap();
    let cqn = FIRST_CQ + 1;
    let q2 = queue(&mut r, 1).unwrap();
    r.cmd_in(
        &cq_ctx(6, UAR, (FIRST_EQ + 2) as u8, q2.mtt, db),
        cqn,
        0,
        Opcode::SW2HW_CQ,
    )
    .unwrap();
    for _ in 0..100 {
        assert!(r.sim.inject_completion_event(cqn));
    }
    assert!(!r.violated("overrun"), "{:#?}", r.sim.violations());
}

#[test]
fn mailboxes_must_be_4k_aligned() {
    let mut r = Raw::new();
    let out = r.outbox.bus_addr().0;
    assert_eq!(
        r.post(0, out + 64, 0, 0, Opcode::QUERY_FW),
        Err(CmdError::Status(Status::BAD_PARAM))
    );
    assert!(r.violated("output mailbox at"));
    r.post(0, out, 0, 0, Opcode::QUERY_FW).unwrap();
}

#[test]
fn page_lists_refuse_reserved_bits() {
    let mut r = Raw::new();
    reset(&mut r);
    let pa = r.pages(1)[0];
    let mut b = vec![0u8; 16];
    b[0..8].copy_from_slice(&0x1000u64.to_be_bytes()); // va on MAP_FA
    b[8..16].copy_from_slice(&pa.to_be_bytes());
    assert_eq!(r.cmd_in(&b, 1, 0, Opcode::MAP_FA), st(Status::BAD_PARAM));
    b[0..8].fill(0);
    b[8..16].copy_from_slice(&(pa | 0x40).to_be_bytes());
    assert_eq!(r.cmd_in(&b, 1, 0, Opcode::MAP_FA), st(Status::BAD_PARAM));
    assert!(r.violated("MAP_FA(0xfff) entry 0: reserved bits"));
}

#[test]
fn hcr_reserved_bits_and_lost_command_events_are_recorded() {
    let mut r = Raw::new();
    let out = r.outbox.bus_addr().0;
    let t = r.next_t();
    // Dword 5 with reserved low bits.
    let st = r
        .post_raw([
            0,
            0,
            0,
            (out >> 32) as u32,
            out as u32,
            0xffff_0001,
            GO | t | 0x004,
        ])
        .unwrap();
    assert_eq!(st, 0);
    assert!(r.violated("dword 5 reserved bits"));
    // Event mode before any EQ takes command completions: the EQE is lost.
    let t = r.next_t();
    r.post_raw([
        0,
        0,
        0,
        (out >> 32) as u32,
        out as u32,
        0x0001_0000,
        GO | E | t | 0x004,
    ])
    .unwrap();
    assert!(r.violated("no EQ is mapped for command-completion events"));
    // Reserved bits 20:16 of dword 6.
    let t = r.next_t();
    r.post_raw([
        0,
        0,
        0,
        (out >> 32) as u32,
        out as u32,
        0,
        GO | t | 1 << 16 | 0x004,
    ])
    .unwrap();
    assert!(r.violated("reserved bits 20:16"));
}

#[test]
fn srq_and_mpt_reserved_bits_are_refused() {
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    let q = queue(&mut r, 1).unwrap();
    let db = r.pages(1)[0];
    for (what, off, v) in [("SRQ reserved2", 0x0cusize, 1u8), ("PD top byte", 0x18, 1)] {
        let mut c = srq_ctx(FIRST_SRQ, 6, 2, PD, q.mtt, db);
        c[off] = v;
        assert_eq!(
            r.cmd_in(&c, FIRST_SRQ, 0, Opcode::SW2HW_SRQ),
            st(Status::BAD_PARAM),
            "{what}"
        );
    }
    let mut m = mpt_entry(FIRST_MPT, PD, true, 0, u64::MAX, 0);
    m[0x29] = 1;
    assert_eq!(
        r.cmd_in(&m, FIRST_MPT, 0, Opcode::SW2HW_MPT),
        st(Status::BAD_PARAM)
    );
    assert!(r.violated("SW2HW_MPT(0x00d) 0x10: context dword 0x28"));
    r.cmd_in(
        &srq_ctx(FIRST_SRQ, 6, 2, PD, q.mtt, db),
        FIRST_SRQ,
        0,
        Opcode::SW2HW_SRQ,
    )
    .unwrap();
    r.cmd_in(
        &mpt_entry(FIRST_MPT, PD, true, 0, u64::MAX, 0),
        FIRST_MPT,
        0,
        Opcode::SW2HW_MPT,
    )
    .unwrap();
}
