//! Bring-up, unwinding and resource tests against the unit-test fake ([`testdev`]).

mod testdev;

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use std::sync::Mutex;

use hal::Clock;
use mlx4_hw::cmd::{Opcode, Status};
use mlx4_hw::mr::flags as mrf;
use mlx4_hw::qp::{QpContext, QpState};

use crate::*;
use testdev::Rig;

fn up(rig: &Rig) -> Result<Dev> {
    probe(
        rig.pdev(),
        rig.pool.clone(),
        rig.clock.clone(),
        Profile::default(),
    )
}

#[test]
fn bring_up_follows_linux_order() {
    let rig = Rig::new();
    let dev = up(&rig).unwrap();
    assert_eq!(dev.fw_ver_string(), "2.42.5000");
    assert_eq!(dev.board_id(), "MT_1090120019");
    let ops = rig.ops();
    let names: Vec<String> = ops.iter().map(|&o| Opcode(o).to_string()).collect();
    // Collapse repeats (MAP_ICM per table, QUERY_PORT/MAD_IFC/SET_PORT per port).
    let mut seq: Vec<&str> = Vec::new();
    for n in &names {
        if seq.last() != Some(&n.as_str()) {
            seq.push(n);
        }
    }
    assert_eq!(
        seq,
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
            "QUERY_ADAPTER",
            "SW2HW_EQ",
            "MAP_EQ",
            "NOP",
            "CONF_SPECIAL_QP",
            "MAD_IFC",
            "SET_PORT",
            "MAD_IFC",
            "SET_PORT"
        ]
    );
    let c = dev.caps();
    assert_eq!(c.num_ports, 2);
    assert_eq!(c.base_sqpn, 64);
    assert_eq!(c.reserved_uars, 128);
    assert_eq!(c.port[1].ib_port_def_cap, 0x0251_0868);
    assert_eq!(dev.commands_issued() as usize, ops.len());
    let before = rig.pool.stats();
    assert!(before.allocations > 0);
    dev.teardown();
    assert_eq!(rig.pool.stats(), hal::DmaStats::default());
    let tail: Vec<String> = rig.ops()[ops.len()..]
        .iter()
        .map(|&o| Opcode(o).to_string())
        .collect();
    assert!(
        !tail.contains(&"CLOSE_PORT".to_string()),
        "no port was opened"
    );
    assert!(tail.contains(&"CLOSE_HCA".to_string()));
    assert_eq!(tail.last().map(String::as_str), Some("UNMAP_FA"));
    assert_eq!(tail[tail.len() - 2], "UNMAP_ICM_AUX");
}

fn bring_up_opcodes() -> Vec<u16> {
    let rig = Rig::new();
    let dev = up(&rig).unwrap();
    let mut ops = rig.ops();
    drop(dev);
    ops.dedup();
    let mut seen = Vec::new();
    for o in ops {
        if !seen.contains(&o) {
            seen.push(o);
        }
    }
    seen
}

#[test]
fn fault_matrix_error_status_and_stuck_go() {
    for op in bring_up_opcodes() {
        let name = Opcode(op);
        // Optional commands whose failure is only a warning.
        let optional = matches!(op, 0x034 | 0x012 | 0x024);
        for stuck in [false, true] {
            let rig = Rig::new();
            {
                let mut f = rig.dev.faults.lock().unwrap();
                if stuck {
                    f.stuck = Some(op);
                } else {
                    f.status = Some((op, 0x03));
                }
            }
            let t0 = rig.clock.now_ns();
            let r = up(&rig);
            let waited = rig.clock.now_ns() - t0;
            match r {
                Ok(dev) => {
                    assert!(optional && !stuck, "{name} stuck={stuck} succeeded");
                    dev.teardown();
                }
                Err(e) => {
                    if stuck {
                        assert_eq!(e, Error::CmdTimeout { op: name }, "{name}");
                    } else if !optional {
                        assert_eq!(
                            e,
                            Error::Fw {
                                op: name,
                                status: Status::BadParam
                            },
                            "{name}"
                        );
                    }
                }
            }
            assert_eq!(
                rig.pool.stats(),
                hal::DmaStats::default(),
                "{name} stuck={stuck} leaked DMA"
            );
            // Reset (1 s + semaphore), ownership release (1 s), at most one
            // command timeout (10 s) plus polling slack.
            assert!(
                waited < 13_000_000_000,
                "{name} stuck={stuck} waited {waited} ns"
            );
        }
    }
}

/// Every command of the bring-up by position (repeats included): once
/// failing, once stuck. Bring-up stops naming it (unless Linux only warns),
/// frees all DMA, and waits at most one deadline.
#[test]
fn fault_matrix_by_position() {
    let clean = {
        let rig = Rig::new();
        let dev = up(&rig).unwrap();
        let n = rig.ops().len();
        dev.teardown();
        n
    };
    for k in 0..clean {
        for stuck in [false, true] {
            let rig = Rig::new();
            {
                let mut f = rig.dev.faults.lock().unwrap();
                if stuck {
                    f.stuck_at = Some(k);
                } else {
                    f.fail_at = Some((k, 0x01));
                }
            }
            let t0 = rig.clock.now_ns();
            let r = up(&rig);
            let waited = rig.clock.now_ns() - t0;
            let op = Opcode(rig.ops()[k]);
            let optional = matches!(op.0, 0x034 | 0x012 | 0x024);
            match r {
                Ok(dev) => {
                    assert!(optional && !stuck, "#{k} {op} stuck={stuck} succeeded");
                    dev.teardown();
                }
                Err(e) => {
                    assert_eq!(e.opcode(), Some(op), "#{k} {op} stuck={stuck}: {e}");
                    if stuck {
                        assert_eq!(e, Error::CmdTimeout { op });
                    } else {
                        assert_eq!(e.to_errno(), -5, "INTERNAL_ERR is -EIO");
                    }
                }
            }
            assert_eq!(
                rig.pool.stats(),
                hal::DmaStats::default(),
                "#{k} {op} stuck={stuck} leaked DMA"
            );
            assert!(
                waited < 13_000_000_000,
                "#{k} {op} stuck={stuck} waited {waited} ns"
            );
        }
    }
}

#[test]
fn absurd_dev_cap_is_named() {
    let rig = Rig::new();
    rig.dev
        .faults
        .lock()
        .unwrap()
        .dev_cap
        .push((mlx4_hw::fw::dev_cap::UAR_SZ, 0x3f));
    match up(&rig) {
        Err(Error::BadCaps { field, .. }) => assert_eq!(field, "uar_size"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted"),
    }
    assert_eq!(rig.pool.stats(), hal::DmaStats::default());
    let ops = rig.ops();
    assert_eq!(
        Opcode(*ops.last().unwrap()),
        Opcode::UNMAP_FA,
        "unwound after RUN_FW"
    );
}

#[test]
fn resource_lifecycle_returns_to_baseline() {
    let rig = Rig::new();
    let mut dev = up(&rig).unwrap();
    let dma0 = rig.pool.stats();
    let pd0 = dev.pd_uar_avail();
    let mpt0 = dev.mpt_avail();
    let mtt0 = dev.mtt_free_segments();
    let cq0 = dev.cq_avail();
    let qp0 = dev.qp_avail();
    let srq0 = dev.srq_avail();
    let refs0 = dev.icm_refcounts();
    for _ in 0..3 {
        let pds: Vec<u32> = (0..3000).map(|_| dev.pd_alloc().unwrap()).collect();
        for p in pds {
            dev.pd_free(p);
        }
    }
    let uar = dev.uar_alloc().unwrap();
    let pd = dev.pd_alloc().unwrap();
    // Multi-page, non-contiguous MRs: pages from separate allocations.
    let pages: Vec<hal::DmaBuf> = (0..9).map(|_| rig.pool.alloc_pages(1).unwrap()).collect();
    let addrs: Vec<u64> = pages.iter().map(|p| p.bus_addr().0).collect();
    for round in 0..1000 {
        let mut mr = dev
            .mr_alloc(
                pd,
                0x10_0000,
                9 * 4096,
                mrf::PERM_LOCAL_READ | mrf::PERM_LOCAL_WRITE,
                9,
                12,
            )
            .unwrap();
        dev.write_mtt(&mr.mtt, 0, &addrs).unwrap();
        if round == 0 {
            assert_eq!(dev.read_mtt(&mr.mtt, 8), Some(addrs[8] | 1));
        }
        dev.mr_enable(&mut mr).unwrap();
        dev.mr_free(mr).unwrap();
    }
    for _ in 0..1000 {
        let mtt = dev.mtt_init(2, 12).unwrap();
        let cq = dev
            .cq_alloc(256, &mtt, &uar, 0x1_0000_0000, 0, false, false)
            .unwrap();
        let srq = dev
            .srq_alloc(pd, cq.cqn, 0, &mtt, 0x1_0000_0040, 64, 5)
            .unwrap();
        let qpn = dev.qp_reserve_range(1, 1).unwrap();
        let qp = dev.qp_alloc(qpn).unwrap();
        let ctx = QpContext {
            // 64 RQ WQEs of 16 bytes, 64 SQ WQEs of 64 bytes: 5 KiB of the
            // 8 KiB the MTT describes.
            rq_size_stride: 6 << 3,
            sq_size_stride: (6 << 3) | 2,
            ..QpContext::default()
        };
        dev.qp_modify(&qp, Some(&mtt), QpState::Rst, QpState::Init, &ctx, 0, false)
            .unwrap();
        assert_eq!(
            dev.qp_modify(&qp, None, QpState::Init, QpState::Rts, &ctx, 0, false),
            Err(Error::InvalidArg)
        );
        dev.qp_modify(&qp, None, QpState::Init, QpState::Rst, &ctx, 0, false)
            .unwrap();
        dev.qp_free(qp);
        dev.qp_release_range(qpn, 1);
        dev.srq_free(srq).unwrap();
        dev.cq_free(cq).unwrap();
        dev.mtt_cleanup(&mtt);
    }
    // Doorbell records and queue buffers (direct and page list).
    let dbs: Vec<_> = (0..3000).map(|i| dev.db_alloc(i % 2).unwrap()).collect();
    assert!(dbs.iter().all(|d| d.dma % (4 << d.order) == 0));
    for d in dbs {
        dev.db_free(d);
    }
    let direct = dev.buf_alloc(6000, 8192).unwrap();
    assert_eq!((direct.npages << direct.page_shift) as usize, 8192);
    let list = dev.buf_alloc(3 * 4096 + 1, 8192).unwrap();
    assert_eq!((list.npages, list.page_shift), (4, 12));
    let mtt = dev.mtt_init(list.npages, list.page_shift).unwrap();
    dev.buf_write_mtt(&mtt, &list).unwrap();
    assert_eq!(dev.read_mtt(&mtt, 3), Some(list.pages[3].bus_addr().0 | 1));
    dev.mtt_cleanup(&mtt);
    drop((direct, list));
    // Thousands alive at once, then freed.
    let mtt = dev.mtt_init(1, 12).unwrap();
    let cqs: Vec<_> = (0..800)
        .map(|_| {
            dev.cq_alloc(64, &mtt, &uar, 0x1_0000_0000, 0, false, false)
                .unwrap()
        })
        .collect();
    let qps: Vec<_> = (0..3000)
        .map(|_| {
            let n = dev.qp_reserve_range(1, 1).unwrap();
            dev.qp_alloc(n).unwrap()
        })
        .collect();
    for cq in cqs {
        dev.cq_free(cq).unwrap();
    }
    for qp in qps {
        let n = qp.qpn;
        dev.qp_free(qp);
        dev.qp_release_range(n, 1);
    }
    dev.mtt_cleanup(&mtt);
    dev.pd_free(pd);
    dev.uar_free(uar);
    drop(pages);
    assert_eq!(dev.pd_uar_avail(), pd0);
    assert_eq!(dev.mpt_avail(), mpt0);
    assert_eq!(dev.mtt_free_segments(), mtt0);
    assert_eq!(dev.cq_avail(), cq0);
    assert_eq!(dev.qp_avail(), qp0);
    assert_eq!(dev.srq_avail(), srq0);
    assert_eq!(dev.icm_refcounts(), refs0);
    assert_eq!(rig.pool.stats(), dma0);
    dev.teardown();
    assert_eq!(rig.pool.stats(), hal::DmaStats::default());
}

struct Recorder(Arc<Mutex<Vec<Event>>>);
impl Interface for Recorder {
    fn event(&mut self, _caps: &Caps, ev: Event) {
        self.0.lock().unwrap().push(ev);
    }
}

#[test]
fn async_eq_and_catastrophic_error_are_polled() {
    let rig = Rig::new();
    let mut dev = up(&rig).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    dev.register_interface(Box::new(Recorder(seen.clone())));
    assert_eq!(dev.poll(), 0);
    // Play the HCA: a PORT_CHANGE(ACTIVE, port 2) EQE at index 0 of the
    // async EQ, owner bit 0 (software-owned in pass 0).
    {
        let t = &dev.tables.eq;
        let eq = t.eqs.last().unwrap();
        let (buf, off) = eq_entry(eq, 0);
        buf.write_u8(off + 1, 0x09);
        buf.write_u8(off + 3, 4);
        buf.write_be32(off + 0x0c, 2 << 28);
        buf.write_u8(off + 0x1f, 0);
    }
    assert_eq!(dev.poll(), 1);
    assert_eq!(dev.poll(), 0);
    assert_eq!(seen.lock().unwrap().as_slice(), [Event::PortUp { port: 2 }]);
    rig.set_catas(0xdead_beef);
    dev.poll();
    assert!(dev.is_catastrophic());
    assert_eq!(seen.lock().unwrap().last(), Some(&Event::CatastrophicError));
    dev.teardown();
}

fn eq_entry(eq: &crate::eq::Eq, i: u32) -> (&hal::DmaBuf, usize) {
    eq.entry_for_test(i)
}

/// Linux's `mlx4_INIT_HCA` sets the unicast-steering bit (byte 0xd8 bit 3)
/// only in B0 steering, which needs both VEP steering capabilities; a card
/// reporting multicast steering alone runs A0 with the bit clear.
#[test]
fn init_hca_asks_for_b0_steering_only_in_b0_mode() {
    use mlx4_hw::fw::dev_cap::EXT_FLAGS;
    // EXT_FLAGS holds flag bits 63:32: VEP_UC_STEER (41) and VEP_MC_STEER
    // (42) are bits 1 and 2 of its third byte.
    for (ext, mode, bit) in [
        (0x00u8, crate::dev::SteeringMode::A0, false),
        (0x04, crate::dev::SteeringMode::A0, false),
        (0x02, crate::dev::SteeringMode::A0, false),
        (0x06, crate::dev::SteeringMode::B0, true),
    ] {
        let rig = Rig::new();
        rig.dev.faults.lock().unwrap().dev_cap = vec![(EXT_FLAGS + 2, ext)];
        let dev = up(&rig).unwrap();
        assert_eq!(dev.caps().steering_mode, mode, "flags {ext:#x}");
        let b = rig.dev.init_hca.lock().unwrap().clone();
        assert_eq!(
            b[0xd8] & 0x08 != 0,
            bit,
            "flags {ext:#x}: byte 0xd8 {:#x}",
            b[0xd8]
        );
        dev.teardown();
    }
}

#[test]
fn multicast_attach_detach_with_amgm_chains() {
    let rig = Rig::new();
    let mut dev = up(&rig).unwrap();
    let amgm0 = dev.amgm_avail();
    let qpns: Vec<u32> = (0..6)
        .map(|_| dev.qp_reserve_range(1, 1).unwrap())
        .collect();
    let qps: Vec<_> = qpns.iter().map(|&n| dev.qp_alloc(n).unwrap()).collect();
    // Hash = gid[15] % 4: gids 1, 5, 9 share bucket 1 (MGM 1 + two AMGMs).
    let gid = |x: u8| {
        let mut g = [0u8; 16];
        g[0] = 0xff;
        g[15] = x;
        g
    };
    for g in [1, 5, 9] {
        for qp in &qps[..3] {
            dev.multicast_attach(qp, &gid(g), false).unwrap();
        }
    }
    dev.multicast_attach(&qps[0], &gid(5), false).unwrap(); // already a member
    assert_eq!(dev.amgm_avail(), amgm0 - 2);
    let e = rig.dev.mgm_entries();
    assert_eq!(e.len(), 3, "{e:?}");
    assert_eq!(e[0].0, 1);
    assert!(e.iter().all(|&(_, n, _)| n == 3));
    assert_eq!(
        dev.multicast_detach(&qps[5], &gid(5)),
        Err(Error::InvalidArg)
    );
    assert_eq!(
        dev.multicast_detach(&qps[0], &gid(13)),
        Err(Error::InvalidArg)
    );
    // Remove the head group first: its AMGM successor moves into the MGM.
    for g in [1, 9, 5] {
        for qp in &qps[..3] {
            dev.multicast_detach(qp, &gid(g)).unwrap();
        }
    }
    assert_eq!(dev.amgm_avail(), amgm0);
    // The MGM heads are empty; unlinked AMGM slots keep stale bytes (as in
    // Linux) until reused.
    let heads: Vec<_> = rig
        .dev
        .mgm_entries()
        .into_iter()
        .filter(|e| e.0 < dev.caps().num_mgms)
        .collect();
    assert_eq!(heads, []);
    // An MGM holds num_qp_per_mgm members.
    let per = dev.caps().num_qp_per_mgm as usize;
    let many: Vec<_> = (0..=per)
        .map(|_| {
            let n = dev.qp_reserve_range(1, 1).unwrap();
            dev.qp_alloc(n).unwrap()
        })
        .collect();
    for qp in &many[..per] {
        dev.multicast_attach(qp, &gid(2), true).unwrap();
    }
    assert_eq!(
        dev.multicast_attach(&many[per], &gid(2), true),
        Err(Error::NoMem)
    );
    dev.teardown();
}
