//! Bring-up and configuration commands: success paths and the rejections
//! the card gives for out-of-order or malformed use.

use crate::harness::*;
use sim::hca::layout::PageEntry;
use sim::{Opcode, Status};

fn st(s: Status) -> R<()> {
    Err(CmdError::Status(s))
}

#[test]
fn query_dev_cap_before_run_fw_is_bad_sys_state() {
    let mut r = Raw::new();
    assert_eq!(
        r.cmd_out(0, 0, Opcode::QUERY_DEV_CAP).map(|_| ()),
        st(Status::BAD_SYS_STATE)
    );
    assert_eq!(
        r.cmd_out(1, 0, Opcode::QUERY_PORT).map(|_| ()),
        st(Status::BAD_SYS_STATE)
    );
    assert_eq!(
        r.cmd_out(0, 0, Opcode::QUERY_ADAPTER).map(|_| ()),
        st(Status::BAD_SYS_STATE)
    );
    assert_eq!(r.cmd(0, 0x1f, 0, Opcode::NOP), st(Status::BAD_SYS_STATE));
    assert_eq!(
        r.cmd_imm(1 << 30, 0, 0, Opcode::SET_ICM_SIZE).map(|_| ()),
        st(Status::BAD_SYS_STATE)
    );
}

#[test]
fn run_fw_needs_the_whole_fw_area() {
    let mut r = Raw::new();
    assert_eq!(
        r.cmd(0, 0, 0, Opcode::RUN_FW),
        st(Status::BAD_SYS_STATE),
        "no MAP_FA"
    );
    let pas = r.pages(10);
    let e: Vec<_> = pas
        .iter()
        .map(|&pa| PageEntry {
            va: 0,
            pa,
            log_size: 0,
        })
        .collect();
    r.map_pages(Opcode::MAP_FA, &e).unwrap();
    assert_eq!(
        r.cmd(0, 0, 0, Opcode::RUN_FW),
        st(Status::ICM_ERROR),
        "10 of 256 pages"
    );
    // A misaligned chunk and an empty list are refused.
    let bad = [PageEntry {
        va: 0,
        pa: pas[0] + 0x1000,
        log_size: 1,
    }];
    let mut b = vec![0u8; 16];
    bad[0].encode(&mut b, 0);
    assert_eq!(r.cmd_in(&b, 1, 0, Opcode::MAP_FA), st(Status::BAD_PARAM));
    assert_eq!(r.cmd_in(&b, 0, 0, Opcode::MAP_FA), st(Status::BAD_PARAM));
    assert_eq!(r.cmd_in(&b, 257, 0, Opcode::MAP_FA), st(Status::BAD_PARAM));
    // One 1 MiB chunk (log 8) covers the rest.
    let big = r.pool.alloc(1 << 20, 1 << 20).unwrap();
    r.map_pages(
        Opcode::MAP_FA,
        &[PageEntry {
            va: 0,
            pa: big.bus_addr().0,
            log_size: 8,
        }],
    )
    .unwrap();
    r.cmd(0, 0, 0, Opcode::RUN_FW).unwrap();
    let mut tag = [0u8; 16];
    big.read_bytes(0, &mut tag);
    assert_eq!(&tag[..12], b"CX3 FW page ", "RUN_FW wrote the FW area");
    r.keep.push(big);
    assert_eq!(
        r.cmd(0, 0, 0, Opcode::RUN_FW),
        st(Status::BAD_SYS_STATE),
        "twice"
    );
    assert_eq!(
        r.cmd_in(&b, 1, 0, Opcode::MAP_FA),
        st(Status::BAD_SYS_STATE),
        "FA while running"
    );
}

#[test]
fn run_fw_with_fa_pages_outside_host_memory_faults() {
    let mut r = Raw::new();
    let e: Vec<_> = (0..256u64)
        .map(|i| PageEntry {
            va: 0,
            pa: 0x7000_0000 + i * 4096,
            log_size: 0,
        })
        .collect();
    r.map_pages(Opcode::MAP_FA, &e).unwrap();
    assert_eq!(r.cmd(0, 0, 0, Opcode::RUN_FW), st(Status::INTERNAL_ERR));
    assert_eq!(r.sim.dma_faults()[0].bus, 0x7000_0000);
    assert!(!r.sim.is_running());
}

#[test]
fn unmap_fa_stops_the_firmware() {
    let mut r = Raw::new();
    load_fw(&mut r).unwrap();
    r.cmd(0, 0, 0, Opcode::UNMAP_FA).unwrap();
    assert!(!r.sim.is_running());
    assert_eq!(
        r.cmd_out(0, 0, Opcode::QUERY_DEV_CAP).map(|_| ()),
        st(Status::BAD_SYS_STATE)
    );
    // After INIT_HCA the FA cannot go.
    let mut r = Raw::new();
    init(&mut r).unwrap();
    assert_eq!(r.cmd(0, 0, 0, Opcode::UNMAP_FA), st(Status::BAD_SYS_STATE));
}

#[test]
fn mod_stat_cfg_accepts_4k_pages_only() {
    let mut r = Raw::new();
    load_fw(&mut r).unwrap();
    let mut b = vec![0u8; 256];
    b[2] = 1;
    b[3] = 0;
    r.cmd_in(&b, 0, 0, Opcode::MOD_STAT_CFG).unwrap();
    b[3] = 4;
    assert_eq!(
        r.cmd_in(&b, 0, 0, Opcode::MOD_STAT_CFG),
        st(Status::BAD_PARAM)
    );
    assert_eq!(r.cmd_in(&b, 0, 1, Opcode::MOD_STAT_CFG), st(Status::BAD_OP));
}

/// Linux 6.1's `mlx4_get_phys_port_id`: MOD_STAT_CFG op_mod 2, in_mod
/// port << 8, reads the port GUID at 0x14 (high) and 0x1c (low).
#[test]
fn mod_stat_cfg_query_returns_the_port_guid() {
    let mut r = Raw::new();
    load_fw(&mut r).unwrap();
    let node = sim::SimConfig::default().node_guid;
    for port in 1..=2u32 {
        let b = r.cmd_out(port << 8, 2, Opcode::MOD_STAT_CFG).unwrap();
        let be = |o: usize| u64::from(u32::from_be_bytes(b[o..o + 4].try_into().unwrap()));
        assert_eq!(
            be(0x14) << 32 | be(0x1c),
            node + u64::from(port),
            "port {port}"
        );
        assert_eq!(be(0x24) << 32 | be(0x2c), node, "node GUID");
    }
    for bad in [0, 3 << 8, (1 << 8) | 1, 1 << 16] {
        assert_eq!(
            r.cmd_out(bad, 2, Opcode::MOD_STAT_CFG).map(|_| ()),
            st(Status::BAD_PARAM),
            "in_mod {bad:#x}"
        );
    }
    assert_eq!(
        r.cmd_out(1 << 8, 3, Opcode::MOD_STAT_CFG).map(|_| ()),
        st(Status::BAD_OP),
        "iPXE's query flavour is not modelled"
    );
}

#[test]
fn query_dev_cap_and_query_port_report_a_dual_port_ib_card() {
    let mut r = Raw::new();
    load_fw(&mut r).unwrap();
    let c = r.cmd_out(0, 0, Opcode::QUERY_DEV_CAP).unwrap();
    assert_eq!(c[0x37] & 0xf, 2, "ports");
    assert_eq!(c[0x4b], 12, "min page 4 KiB");
    assert_eq!(1u64 << ((c[0x49] & 0x3f) + 20), 8 << 20, "UAR size = BAR2");
    assert_eq!(u16::from_be_bytes([c[0x82], c[0x83]]), 256, "QPC entry");
    let p = r.cmd_out(1, 0, Opcode::QUERY_PORT).unwrap();
    assert_eq!((p[0] & 3, p[1] & 0xf, p[7]), (1, 5, 0x77));
    assert_eq!(
        r.cmd_out(3, 0, Opcode::QUERY_PORT).map(|_| ()),
        st(Status::BAD_PARAM)
    );
    assert_eq!(
        r.cmd_out(0, 0, Opcode::QUERY_PORT).map(|_| ()),
        st(Status::BAD_PARAM)
    );
}

#[test]
fn query_adapter_board_id_reads_back_after_swab() {
    let mut r = Raw::new();
    load_fw(&mut r).unwrap();
    let a = r.cmd_out(0, 0, Opcode::QUERY_ADAPTER).unwrap();
    let mut id = Vec::new();
    for i in 0..4 {
        let w = u32::from_ne_bytes(a[0xf0 + 4 * i..0xf4 + 4 * i].try_into().unwrap());
        id.extend_from_slice(&w.swap_bytes().to_ne_bytes());
    }
    assert_eq!(&id[..13], b"MT_1090120019");
}

#[test]
fn icm_size_aux_and_map_rules() {
    use profile::*;
    let mut r = Raw::new();
    load_fw(&mut r).unwrap();
    assert_eq!(
        r.cmd_imm(0, 0, 0, Opcode::SET_ICM_SIZE).map(|_| ()),
        st(Status::BAD_PARAM)
    );
    assert_eq!(
        r.cmd_imm(1 << 40, 0, 0, Opcode::SET_ICM_SIZE).map(|_| ()),
        st(Status::EXCEED_LIM)
    );
    let aux = r.cmd_imm(ICM_SIZE, 0, 0, Opcode::SET_ICM_SIZE).unwrap();
    assert_eq!(aux, ICM_SIZE.div_ceil(4096).div_ceil(1024));
    // INIT_HCA without the aux pages.
    let ih = init_hca_params().encode();
    assert_eq!(r.cmd_in(&ih, 0, 0, Opcode::INIT_HCA), st(Status::ICM_ERROR));
    // MAP_ICM before the aux pages: the firmware has nowhere to keep the map.
    assert_eq!(r.map_icm(CMPT, 1), st(Status::ICM_ERROR));
    assert!(
        r.violated("0 of the 1025 aux pages"),
        "{:?}",
        r.sim.violations()
    );
    r.sim.take_violations();
    let pas = r.pages(aux as usize);
    let e: Vec<_> = pas
        .iter()
        .map(|&pa| PageEntry {
            va: 0,
            pa,
            log_size: 0,
        })
        .collect();
    r.map_pages(Opcode::MAP_ICM_AUX, &e).unwrap();
    assert_eq!(
        r.cmd_imm(ICM_SIZE, 0, 0, Opcode::SET_ICM_SIZE).map(|_| ()),
        st(Status::BAD_SYS_STATE)
    );
    // MAP_ICM: past what the aux pages for the ICM size reach, twice the
    // same page, misaligned VA.
    let pa = r.pages(2);
    let mut b = vec![0u8; 32];
    PageEntry {
        va: sim::hca::icm::Icm::reach(ICM_SIZE),
        pa: pa[0],
        log_size: 0,
    }
    .encode(&mut b, 0);
    assert_eq!(r.cmd_in(&b, 1, 0, Opcode::MAP_ICM), st(Status::BAD_PARAM));
    r.map_icm(QPC, 1).unwrap();
    PageEntry {
        va: QPC,
        pa: pa[1],
        log_size: 0,
    }
    .encode(&mut b, 0);
    assert_eq!(
        r.cmd_in(&b, 1, 0, Opcode::MAP_ICM),
        st(Status::RESOURCE_BUSY)
    );
    PageEntry {
        va: QPC + 0x1000,
        pa: pa[0],
        log_size: 1,
    }
    .encode(&mut b, 0);
    assert_eq!(r.cmd_in(&b, 1, 0, Opcode::MAP_ICM), st(Status::BAD_PARAM));
    // Two entries of one command overlapping each other: nothing mapped.
    PageEntry {
        va: QPC + 0x2000,
        pa: pa[0],
        log_size: 0,
    }
    .encode(&mut b, 0);
    PageEntry {
        va: QPC + 0x2000,
        pa: pa[1],
        log_size: 0,
    }
    .encode(&mut b, 1);
    assert_eq!(r.cmd_in(&b, 2, 0, Opcode::MAP_ICM), st(Status::BAD_PARAM));
    assert_eq!(r.sim.icm_mapped_pages(), 1);
    // UNMAP_ICM of a misaligned address is refused; a range wider than
    // what is mapped unmaps what is there (Linux unmaps whole chunks).
    assert_eq!(
        r.cmd(QPC + 8, 2, 0, Opcode::UNMAP_ICM),
        st(Status::BAD_PARAM)
    );
    assert_eq!(r.sim.icm_mapped_pages(), 1);
    r.cmd(QPC, 2, 0, Opcode::UNMAP_ICM).unwrap();
    assert_eq!(r.sim.icm_mapped_pages(), 0);
    r.cmd(0, 0, 0, Opcode::UNMAP_ICM_AUX).unwrap();
    assert_eq!(
        r.cmd_in(&ih, 0, 0, Opcode::INIT_HCA),
        st(Status::ICM_ERROR),
        "aux gone"
    );
}

/// UNMAP_ICM's page count is the guest's (up to 2^32 - 1 pages, 16 TiB):
/// the model answers at once, unmapping what is mapped in the range and
/// nothing else (fuzz finding `sim_hcr-timeout-f41bf8fa`: the model walked
/// every page of the range, seconds per command).
#[test]
fn unmap_icm_of_any_page_count_answers_at_once() {
    use profile::*;
    let mut r = Raw::new();
    init_up_to_hca(&mut r).unwrap();
    let before = r.sim.icm_mapped_pages();
    let t = std::time::Instant::now();
    // Past everything mapped: nothing to do.
    r.cmd(END, 0xfffe_4949, 0, Opcode::UNMAP_ICM).unwrap();
    assert_eq!(r.sim.icm_mapped_pages(), before);
    // From the QP contexts on: every table but the cMPTs (11 pages below).
    r.cmd(QPC, u32::MAX, 0, Opcode::UNMAP_ICM).unwrap();
    assert_eq!(r.sim.icm_mapped_pages(), 4 + 2 + 4 + 1);
    r.cmd(0, u32::MAX, 0, Opcode::UNMAP_ICM).unwrap();
    assert_eq!(r.sim.icm_mapped_pages(), 0);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(1),
        "{:?}",
        t.elapsed()
    );
}

/// A change to the INIT_HCA parameters.
type Edit = fn(&mut sim::hca::layout::InitHca);

#[test]
fn init_hca_twice_and_bad_parameters_are_refused() {
    let mut r = Raw::new();
    init(&mut r).unwrap();
    let ih = init_hca_params().encode();
    assert_eq!(
        r.cmd_in(&ih, 0, 0, Opcode::INIT_HCA),
        st(Status::BAD_SYS_STATE)
    );
    assert_eq!(
        r.cmd(0, 0, 0, Opcode::MOD_STAT_CFG),
        st(Status::BAD_SYS_STATE)
    );
    drop(r);
    // A device that is only running, every bad parameter on its own.
    let cases: [(&str, Edit, Status); 9] = [
        ("version", |h| h.version = 1, Status::BAD_PARAM),
        ("64B EQE", |h| h.eqe_cqe_64 = 1 << 29, Status::BAD_PARAM),
        ("QPs", |h| h.log_num_qps = 19, Status::EXCEED_LIM),
        ("EQs", |h| h.log_num_eqs = 10, Status::EXCEED_LIM),
        ("UAR page", |h| h.uar_page_sz = 1, Status::BAD_PARAM),
        ("overlap", |h| h.cqc_base = profile::QPC, Status::BAD_PARAM),
        (
            "past ICM",
            |h| h.mc_base = profile::ICM_SIZE,
            Status::BAD_PARAM,
        ),
        (
            "MTT align",
            |h| h.mtt_base = profile::MTT + 4,
            Status::BAD_PARAM,
        ),
        (
            "fewer QPs than reserved",
            |h| h.log_num_qps = 5,
            Status::BAD_PARAM,
        ),
    ];
    for (what, f, want) in cases {
        let mut r2 = Raw::new();
        load_fw(&mut r2).unwrap();
        let aux = r2
            .cmd_imm(profile::ICM_SIZE, 0, 0, Opcode::SET_ICM_SIZE)
            .unwrap();
        let pas = r2.pages(aux as usize);
        let e: Vec<_> = pas
            .iter()
            .map(|&pa| PageEntry {
                va: 0,
                pa,
                log_size: 0,
            })
            .collect();
        r2.map_pages(Opcode::MAP_ICM_AUX, &e).unwrap();
        let mut h = init_hca_params();
        f(&mut h);
        assert_eq!(
            r2.cmd_in(&h.encode(), 0, 0, Opcode::INIT_HCA),
            st(want),
            "{what}"
        );
        assert!(!r2.sim.is_initialized(), "{what}");
    }
}

#[test]
fn query_hca_close_hca_and_teardown_in_linux_order() {
    use profile::*;
    let mut r = Raw::new();
    assert_eq!(
        r.cmd_out(0, 0, Opcode::QUERY_HCA).map(|_| ()),
        st(Status::BAD_SYS_STATE)
    );
    init(&mut r).unwrap();
    let q = r.cmd_out(0, 0, Opcode::QUERY_HCA).unwrap();
    assert_eq!(u16::from_be_bytes([q[0x0c], q[0x0d]]), 427, "core clock");
    assert_eq!(
        u64::from_be_bytes(q[0x30..0x38].try_into().unwrap()) & !0x1f,
        QPC
    );
    assert_eq!(q[0x37], LOG_QPS);
    r.cmd(0, 0, 0, Opcode::CLOSE_HCA).unwrap();
    assert_eq!(r.cmd(0, 0, 0, Opcode::CLOSE_HCA), st(Status::BAD_SYS_STATE));
    // Linux: UNMAP_ICM per table chunk, UNMAP_ICM_AUX, UNMAP_FA.
    unmap_all(&mut r).unwrap();
    assert!(r.ok_trace_after_errors(2));
    assert!(r.sim.violations().is_empty(), "{:?}", r.sim.violations());
    assert_eq!(r.sim.icm_mapped_pages(), 0);
}

#[test]
fn nop_works_once_running() {
    let mut r = Raw::new();
    load_fw(&mut r).unwrap();
    r.cmd(0, 0x1f, 0, Opcode::NOP).unwrap();
}

#[test]
fn huge_page_lists_are_refused_before_anything_is_allocated() {
    let mut r = Raw::new();
    // 256 chunks of 4 GiB each for the FA: 2^28 pages.
    let mut b = vec![0u8; 4096];
    for i in 0..256u64 {
        PageEntry {
            va: 0,
            pa: (i + 1) << 32,
            log_size: 20,
        }
        .encode(&mut b, i as usize);
    }
    assert_eq!(r.cmd_in(&b, 256, 0, Opcode::MAP_FA), st(Status::ICM_ERROR));
    init(&mut r).unwrap();
    for i in 0..256u64 {
        PageEntry {
            va: (i + 1) << 32,
            pa: (i + 1) << 32,
            log_size: 20,
        }
        .encode(&mut b, i as usize);
    }
    assert_eq!(r.cmd_in(&b, 256, 0, Opcode::MAP_ICM), st(Status::ICM_ERROR));
}
