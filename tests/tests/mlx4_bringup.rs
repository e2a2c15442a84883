//! Model-backed bring-up of mlx4_core.
//!
//! Command order against Linux's, capabilities, fw_ver, teardown back to baseline,
//! in both model modes.

use tests::mlx4_common;

use std::time::Instant;

use hal::ConfigSpace as _;

use mlx4_common::*;
use mlx4_core::Profile;
use sim::{SimConfig, SimHca};

fn bring_up_and_check(hca: &SimHca, mode: &str) {
    let dma0 = hca.dma_pool().stats();
    let pci = hca.config_space();
    let command0 = pci.read32(4) & 0xffff;
    let t0 = Instant::now();
    let dev = match bring_up(hca, Profile::default()) {
        Ok(d) => d,
        Err(e) => panic!(
            "{mode}: bring-up failed: {e}\nviolations: {:#?}\ntrace: {:#?}",
            hca.violations(),
            hca.trace()
        ),
    };
    let host = t0.elapsed();
    let c = dev.caps().clone();
    assert_eq!(
        collapsed(hca),
        linux_order(c.cq_timestamp, c.num_ports),
        "{mode}"
    );
    assert!(
        hca.violations().is_empty(),
        "{mode}: {:#?}",
        hca.violations()
    );
    assert!(
        hca.dma_faults().is_empty(),
        "{mode}: {:#?}",
        hca.dma_faults()
    );
    assert!(hca.is_initialized(), "{mode}");
    // Memory decoding and bus mastering on; INTx disabled, since the EQs
    // are polled and nothing would take it (and over vfio-user an INTx
    // makes QEMU trap the UAR pages it had mapped into the guest).
    let command = pci.read32(4) & 0xffff;
    assert_eq!(command & 0x406, 0x406, "{mode}: command {command:#x}");
    assert_eq!(dev.fw_ver_string(), "2.42.5000");
    assert_eq!(dev.board_id(), "MT_1090120019");
    assert_eq!(c.num_ports, 2);
    assert!(c.num_qps >= 1 << 12 && c.num_cqs >= 1 << 10);
    assert_eq!(c.base_sqpn % 8, 0);
    assert!(c.base_sqpn >= c.reserved_qps_cnt[0]);
    // Capabilities as the model reports them.
    let m = hca.config().dev_cap;
    let d = dev.dev_cap();
    assert_eq!(d.max_qps, 1 << m.log_max_qps);
    assert_eq!(d.reserved_qps, 1 << m.log_rsvd_qps);
    assert_eq!(d.max_cqs, 1 << m.log_max_cqs);
    assert_eq!(c.max_cqes, (1u32 << m.log_max_cq_sz) - 1);
    assert_eq!(c.reserved_cqs, 1 << m.log_rsvd_cqs);
    assert_eq!(d.max_mpts, 1 << m.log_max_mpts);
    assert_eq!(c.reserved_mrws, 1 << m.log_rsvd_mrws);
    assert_eq!(c.max_wqes, 1 << m.log_max_qp_sz);
    assert_eq!(c.flags, m.flags);
    assert_eq!(c.num_ports, m.num_ports);
    assert_eq!(c.local_ca_ack_delay, m.local_ca_ack_delay);
    assert_eq!(c.stat_rate_support, m.stat_rate_support);
    assert!(c.reserved_eqs >= 4 * u32::from(m.rsvd_uars));
    assert_eq!(c.port[1].gid_table_len, 1 << m.log_max_gids);
    assert_eq!(c.port[1].pkey_table_len, 1 << m.log_max_pkeys);
    let cmds = hca.trace().len();
    assert_eq!(dev.commands_issued() as usize, cmds);
    let icm = dev.icm_mapped_bytes();
    assert_eq!(
        hca.icm_mapped_pages() * 4096,
        icm,
        "{mode}: model and driver agree on mapped ICM"
    );
    let (fa, aux) = dev.fw_aux_bytes();
    println!(
        "{mode}: bring-up: {cmds} firmware commands, {:?} host time, ICM mapped {} bytes ({} KiB), FW area {} KiB, aux {} KiB, ICM space {:#x}",
        host,
        icm,
        icm >> 10,
        fa >> 10,
        aux >> 10,
        dev.layout().total_size
    );
    let before = hca.trace().len();
    let comp_eqn = dev.comp_eqn(0).expect("completion EQ");
    let async_eqn = dev.async_eqn().expect("async EQ");
    dev.teardown();
    // Linux's mlx4_remove_one order: QP table (special QPs off), EQ table
    // (MAP_EQ with the unmap bit 31 for the async EQ, then HW2SW_EQ of each
    // EQ, completion EQs first), CLOSE_HCA (op_mod 0: not a panic close),
    // the ICM tables, aux, FW area. Modifiers are compared where they carry
    // meaning; repeats (UNMAP_ICM of each chunk) are collapsed.
    let tail = teardown_tail(&hca.trace()[before..]);
    let want: Vec<Cmd> = vec![
        ("CONF_SPECIAL_QP", Some(0), Some(0)),
        ("MAP_EQ", Some((1 << 31) | async_eqn), Some(0)),
        ("HW2SW_EQ", Some(comp_eqn), Some(0)),
        ("HW2SW_EQ", Some(async_eqn), Some(0)),
        ("CLOSE_HCA", Some(0), Some(0)),
        ("UNMAP_ICM", None, Some(0)),
        ("UNMAP_ICM_AUX", Some(0), Some(0)),
        ("UNMAP_FA", Some(0), Some(0)),
    ];
    assert_eq!(tail, want, "{mode}: teardown (name, in_mod, op_mod)");
    assert!(
        hca.violations().is_empty(),
        "{mode} teardown: {:#?}",
        hca.violations()
    );
    assert!(
        !hca.is_running() && !hca.is_initialized(),
        "{mode}: device still up after teardown"
    );
    assert_eq!(hca.icm_mapped_pages(), 0, "{mode}");
    assert_eq!(hca.dma_pool().stats(), dma0, "{mode}: DMA back to baseline");
    assert_eq!(
        pci.read32(4) & 0xffff,
        command0,
        "{mode}: command register as before the probe"
    );
    let bad: Vec<_> = hca.trace().into_iter().filter(|e| !e.ok()).collect();
    assert!(bad.is_empty(), "{mode}: failed commands {bad:#?}");
}

/// (command, in_mod, op_mod); `None` where the value is not compared.
type Cmd = (&'static str, Option<u32>, Option<u8>);

/// The teardown commands as (name, in_mod, op_mod), with the modifiers of
/// UNMAP_ICM (ICM address and page count of each chunk) left out and its
/// repeats collapsed.
fn teardown_tail(trace: &[sim::hca::trace::TraceEntry]) -> Vec<Cmd> {
    let mut v: Vec<Cmd> = Vec::new();
    for e in trace {
        let c = match e.name {
            "UNMAP_ICM" => (e.name, None, Some(e.op_mod)),
            n => (n, Some(e.in_mod), Some(e.op_mod)),
        };
        if v.last() != Some(&c) {
            v.push(c);
        }
    }
    v
}

#[test]
fn bring_up_sync_model() {
    let hca = sync_hca();
    bring_up_and_check(&hca, "sync");
    // fw_ver is printed the way Linux prints it.
    assert!(!log_lines("FW version 2.42.5000").is_empty());
    // One debug line per command, with name, modifiers, status and time.
    assert!(!log_lines("cmd QUERY_DEV_CAP (0x3) in_mod=0x0 op_mod=0x0 status=0x0").is_empty());
}

#[test]
fn bring_up_threaded_model() {
    let hca = Model::threaded();
    bring_up_and_check(&hca, "threaded");
}

#[test]
fn bring_up_twice_on_one_model() {
    let hca = sync_hca();
    bring_up_and_check(&hca, "first");
    hca.clear_trace();
    bring_up_and_check(&hca, "second");
}

#[test]
fn linux_profile_brings_up() {
    let hca = sync_hca();
    let dev =
        bring_up(&hca, Profile::linux()).unwrap_or_else(|e| panic!("{e}: {:#?}", hca.violations()));
    println!(
        "linux profile: ICM mapped {} KiB, ICM space {:#x}",
        dev.icm_mapped_bytes() >> 10,
        dev.layout().total_size
    );
    assert!(hca.violations().is_empty(), "{:#?}", hca.violations());
    dev.teardown();
    assert_eq!(hca.icm_mapped_pages(), 0);
}

#[test]
fn tiny_profile_is_raised_above_the_reserved_entries() {
    let hca = sync_hca();
    let p = Profile {
        num_qp: 8,
        num_srq: 1,
        num_cq: 2,
        num_mpt: 4,
        num_mtt_segs: 1,
        num_mcg: 0,
        ..Profile::research()
    };
    let dev = bring_up(&hca, p).unwrap_or_else(|e| panic!("{e}: {:#?}", hca.violations()));
    let c = dev.caps();
    assert!(
        c.num_cqs > c.reserved_cqs && c.num_qps > c.base_sqpn + 8 && c.num_mpts > c.reserved_mrws
    );
    assert!(!log_lines("raised to").is_empty());
    dev.teardown();
    assert!(hca.violations().is_empty(), "{:#?}", hca.violations());
}

#[test]
fn dev_is_send() {
    fn send<T: Send>() {}
    send::<mlx4_core::Dev>();
}

#[test]
fn cq_timestamp_capability_adds_query_hca() {
    let hca = sync_hca();
    hca.faults().bad_cap(sim::hca::faults::BadCap::Byte {
        offset: 0x3e,
        value: 0x80,
    });
    let dev = bring_up(&hca, Profile::default()).unwrap();
    let c = dev.caps().clone();
    assert!(c.cq_timestamp);
    assert_eq!(collapsed(&hca), linux_order(true, c.num_ports));
    assert_eq!(c.hca_core_clock, hca.config().core_clock_mhz);
    dev.teardown();
}

#[test]
fn a_profile_linux_would_refuse_is_refused_by_name_before_the_device_is_touched() {
    use mlx4_core::{Error, Why};
    let cases: [(Profile, &str, Why); 5] = [
        (
            Profile {
                log_mgm_entry_size: 6,
                ..Profile::research()
            },
            "log_mgm_entry_size",
            Why::BelowMin(7),
        ),
        (
            Profile {
                log_mgm_entry_size: 13,
                ..Profile::research()
            },
            "log_mgm_entry_size",
            Why::AboveMax(12),
        ),
        (
            Profile {
                rdmarc_per_qp: 0,
                ..Profile::research()
            },
            "rdmarc_per_qp",
            Why::Zero,
        ),
        (
            Profile {
                rdmarc_per_qp: 24,
                ..Profile::research()
            },
            "rdmarc_per_qp",
            Why::NotPowerOfTwo,
        ),
        (
            Profile {
                rdmarc_per_qp: 256,
                ..Profile::research()
            },
            "rdmarc_per_qp",
            Why::AboveMax(128),
        ),
    ];
    for (p, arg, why) in cases {
        let hca = sync_hca();
        match bring_up(&hca, p) {
            Err(e @ Error::BadArg { arg: a, why: w, .. }) if a == arg && w == why => {
                assert!(e.to_string().contains(arg), "{e}");
                assert!(!log_lines(&format!("bad profile: {e}")).is_empty());
            }
            r => panic!("{arg}: {:?}", r.map(|_| ())),
        }
        assert_eq!(hca.trace_len(), 0, "{arg}: no command before the check");
    }
    // Above what this device's firmware serves per QP (2^2): refused once
    // QUERY_DEV_CAP said so, and everything taken so far given back.
    let hca = Model::new(SimConfig {
        dev_cap: sim::hca::layout::DevCap {
            log_max_ra_res_qp: 2,
            ..Default::default()
        },
        ..Default::default()
    });
    match bring_up(&hca, Profile::research()) {
        Err(Error::BadArg {
            arg: "rdmarc_per_qp",
            value: 16,
            why: Why::AboveMax(4),
        }) => {}
        r => panic!("{:?}", r.map(|_| ())),
    }
}
