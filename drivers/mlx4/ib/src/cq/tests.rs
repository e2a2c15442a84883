//! CQ polling over host memory: CQEs written as the HCA would (owner bit by pass parity), parsed into work completions with every field and status Linux maps.

use alloc::vec::Vec;

use mlx4_hw::cqe::Cqe;

use super::*;
use crate::qp::tests::Bed;
use crate::verbs::{QpCap, QpType, RecvWr, SendFlags, SendWr, Sge, WcFlags};

struct Rig {
    bed: Bed,
    cq: Mlx4IbCq,
    qps: QpTable,
    srqs: Slab<Mlx4IbSrq>,
    qp: crate::QpId,
}

fn rig(nent: u32, sig_all: bool) -> Rig {
    let mut bed = Bed::new();
    let db = bed.dbs.alloc(&bed.pool, 1).unwrap();
    let cq = Mlx4IbCq::detached(nent, &bed.pool, bed.uar(), db, 0x81).unwrap();
    let qp = bed.qp(
        QpType::Ud,
        QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sig_all,
    );
    let mut qps = QpTable::default();
    let qp = qps.insert(qp);
    Rig {
        bed,
        cq,
        qps,
        srqs: Slab::default(),
        qp,
    }
}

impl Rig {
    /// Writes CQE number `n` (absolute index) with the owner bit of its
    /// pass, as the HCA does.
    fn hw_write(&self, n: u32, mut c: Cqe) {
        let owner = if n & self.cq.nent != 0 {
            cqe::OWNER_MASK
        } else {
            0
        };
        c.owner_sr_opcode = (c.owner_sr_opcode & !cqe::OWNER_MASK) | owner;
        let off = ((n & (self.cq.nent - 1)) as usize) * cqe::SIZE;
        self.cq.buf.write_bytes(off, &c.to_bytes());
    }
    fn poll(&mut self, n: usize) -> Result<Vec<Wc>> {
        let mut wc = alloc::vec![Wc::default(); n];
        let got = self.cq.poll(&mut self.qps, &mut self.srqs, &mut wc)?;
        wc.truncate(got);
        Ok(wc)
    }
    fn post_recvs(&mut self, n: u64) {
        let sg = [Sge {
            addr: 0x1000,
            length: 296,
            lkey: 1,
        }];
        let wrs: Vec<RecvWr> = (0..n)
            .map(|i| RecvWr {
                wr_id: 1000 + i,
                sg_list: &sg,
            })
            .collect();
        self.qps.get_mut(self.qp).unwrap().post_recv(&wrs).unwrap();
    }
    fn post_sends(&mut self, n: u64, signalled_every: u64) {
        let ahs = core::mem::take(&mut self.bed.ahs);
        let ah = crate::ah::create_ib_ah(
            &self.bed.caps,
            1,
            &crate::verbs::AhAttr {
                dlid: 1,
                port_num: 1,
                ..Default::default()
            },
        )
        .unwrap();
        let mut ahs = ahs;
        let ah = ib_core::verbs::Ah(ahs.insert(ah));
        for i in 0..n {
            let wr = SendWr {
                wr_id: 500 + i,
                send_flags: if (i + 1) % signalled_every == 0 {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::empty()
                },
                wr: crate::verbs::WrDetail::Ud {
                    ah,
                    remote_qpn: 2,
                    remote_qkey: 3,
                    pkey_index: 0,
                    port_num: 0,
                },
                ..Default::default()
            };
            self.qps
                .get_mut(self.qp)
                .unwrap()
                .post_send(&ahs, &[wr])
                .unwrap();
        }
        self.bed.ahs = ahs;
    }
}

#[test]
fn receive_cqe_fields_reach_the_work_completion() {
    let mut r = rig(8, true);
    r.post_recvs(2);
    assert!(
        r.poll(4).unwrap().is_empty(),
        "all entries start hardware-owned"
    );
    assert_eq!(r.cq.db.read(0), 0, "an empty poll writes no set_ci");
    r.hw_write(
        0,
        Cqe {
            vlan_my_qpn: 0x48,
            immed_rss_invalid: 0x1234_5603,
            g_mlpath_rqpn: (1 << 31) | (0x05 << 24) | 0x00_0123,
            sl_vid: 7 << 12,
            rlid: 0x0042,
            byte_cnt: 40 + 256,
            wqe_index: 0,
            owner_sr_opcode: cqe::recv_opcode::SEND_IMM,
            ..Default::default()
        },
    );
    let wc = r.poll(4).unwrap();
    assert_eq!(wc.len(), 1);
    let w = wc[0];
    assert_eq!(w.wr_id, 1000);
    assert_eq!(w.status, WcStatus::Success);
    assert_eq!(w.opcode, WcOpcode::Recv);
    assert_eq!(w.byte_len, 296);
    assert_eq!(w.qp_num, 0x48);
    assert_eq!(w.src_qp, 0x123);
    assert_eq!(w.slid, 0x42);
    assert_eq!(w.sl, 7);
    assert_eq!(w.dlid_path_bits, 5);
    assert_eq!(w.pkey_index, 3);
    assert_eq!(w.imm_data, 0x1234_5603);
    assert_eq!(w.wc_flags, WcFlags::GRH | WcFlags::WITH_IMM);
    assert_eq!(r.cq.db.read(0), 1, "set_ci = consumer index");
    // RDMA WRITE with immediate on the receive side.
    r.hw_write(
        1,
        Cqe {
            vlan_my_qpn: 0x48,
            immed_rss_invalid: 9,
            owner_sr_opcode: cqe::recv_opcode::RDMA_WRITE_IMM,
            ..Default::default()
        },
    );
    let w = r.poll(1).unwrap()[0];
    assert_eq!(
        (w.wr_id, w.opcode, w.imm_data),
        (1001, WcOpcode::RecvRdmaWithImm, 9)
    );
    assert_eq!(w.wc_flags, WcFlags::WITH_IMM, "no GRH bit");
}

#[test]
fn send_cqes_map_opcodes_and_skip_unsignalled_wrs() {
    let mut r = rig(16, false);
    // 6 sends, every third signalled: completions name WQEs 2 and 5.
    r.post_sends(6, 3);
    for (k, idx) in [(0u32, 2u16), (1, 5)] {
        r.hw_write(
            k,
            Cqe {
                vlan_my_qpn: 0x48,
                wqe_index: idx,
                owner_sr_opcode: cqe::IS_SEND_MASK | opcode::SEND as u8,
                ..Default::default()
            },
        );
    }
    let wc = r.poll(8).unwrap();
    assert_eq!(wc.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [502, 505]);
    assert_eq!(r.qps.get(r.qp).unwrap().sq.tail, 6);
    for (op, want, len) in [
        (opcode::RDMA_WRITE, WcOpcode::RdmaWrite, 0),
        (opcode::RDMA_READ, WcOpcode::RdmaRead, 77),
        (opcode::ATOMIC_CS, WcOpcode::CompSwap, 8),
        (opcode::ATOMIC_FA, WcOpcode::FetchAdd, 8),
        (opcode::MASKED_ATOMIC_CS, WcOpcode::MaskedCompSwap, 8),
    ] {
        let (o, _, l) = send_wc(op as u8);
        assert_eq!(o, want);
        assert_eq!(
            l.map(|l| if l == u32::MAX { 77 } else { l }).unwrap_or(0),
            len
        );
    }
    assert_eq!(send_wc(opcode::RDMA_WRITE_IMM as u8).1, WcFlags::WITH_IMM);
}

#[test]
fn every_error_syndrome_has_its_linux_status() {
    let table = [
        (0x01, "IB_WC_LOC_LEN_ERR"),
        (0x02, "IB_WC_LOC_QP_OP_ERR"),
        (0x04, "IB_WC_LOC_PROT_ERR"),
        (0x05, "IB_WC_WR_FLUSH_ERR"),
        (0x06, "IB_WC_MW_BIND_ERR"),
        (0x10, "IB_WC_BAD_RESP_ERR"),
        (0x11, "IB_WC_LOC_ACCESS_ERR"),
        (0x12, "IB_WC_REM_INV_REQ_ERR"),
        (0x13, "IB_WC_REM_ACCESS_ERR"),
        (0x14, "IB_WC_REM_OP_ERR"),
        (0x15, "IB_WC_RETRY_EXC_ERR"),
        (0x16, "IB_WC_RNR_RETRY_EXC_ERR"),
        (0x22, "IB_WC_REM_ABORT_ERR"),
        (0x77, "IB_WC_GENERAL_ERR"),
    ];
    for (s, name) in table {
        assert_eq!(syndrome_to_status(s).name(), name);
    }
    assert_eq!(syndrome_to_status(0x05).msg(), "WR flushed");
    // Through the poller: an error CQE for a receive, with vendor syndrome.
    let mut r = rig(4, true);
    r.post_recvs(1);
    r.hw_write(
        0,
        Cqe {
            vlan_my_qpn: 0x48,
            checksum: 0x3213, // vendor 0x32, syndrome 0x13
            owner_sr_opcode: cqe::OPCODE_ERROR,
            ..Default::default()
        },
    );
    let w = r.poll(1).unwrap()[0];
    assert_eq!(
        (w.wr_id, w.status, w.vendor_err),
        (1000, WcStatus::RemAccessErr, 0x32)
    );
}

#[test]
fn ownership_follows_the_pass_and_wraps() {
    let mut r = rig(4, true);
    r.post_recvs(12);
    // Pass 0 wrote with owner 0; in pass 1 an entry with owner 0 is stale.
    for n in 0..4 {
        r.hw_write(
            n,
            Cqe {
                vlan_my_qpn: 0x48,
                owner_sr_opcode: cqe::recv_opcode::SEND,
                ..Default::default()
            },
        );
    }
    assert_eq!(r.poll(8).unwrap().len(), 4);
    assert!(
        r.poll(8).unwrap().is_empty(),
        "pass-0 entries are stale in pass 1"
    );
    for n in 4..7 {
        r.hw_write(
            n,
            Cqe {
                vlan_my_qpn: 0x48,
                owner_sr_opcode: cqe::recv_opcode::SEND,
                ..Default::default()
            },
        );
    }
    let wc = r.poll(8).unwrap();
    assert_eq!(
        wc.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [1004, 1005, 1006]
    );
    assert_eq!(r.cq.cons_index(), 7);
    assert_eq!(r.cq.db.read(0), 7);
}

#[test]
fn cqes_the_driver_cannot_account_for_are_errors_not_panics() {
    let mut r = rig(8, true);
    // Unknown QPN: consumed, reported.
    r.hw_write(
        0,
        Cqe {
            vlan_my_qpn: 0x99,
            owner_sr_opcode: cqe::recv_opcode::SEND,
            ..Default::default()
        },
    );
    assert!(matches!(r.poll(2), Err(Error::Inval(_))));
    assert_eq!(r.cq.cons_index(), 1, "the bad CQE is consumed");
    // A receive CQE with nothing posted.
    r.hw_write(
        1,
        Cqe {
            vlan_my_qpn: 0x48,
            owner_sr_opcode: cqe::recv_opcode::SEND,
            ..Default::default()
        },
    );
    assert!(r.poll(2).is_err());
    // A send CQE for a NOP, and a resize CQE.
    r.hw_write(
        2,
        Cqe {
            vlan_my_qpn: 0x48,
            owner_sr_opcode: cqe::IS_SEND_MASK,
            ..Default::default()
        },
    );
    assert!(r.poll(2).is_err());
    r.hw_write(
        3,
        Cqe {
            vlan_my_qpn: 0x48,
            owner_sr_opcode: cqe::OPCODE_RESIZE,
            ..Default::default()
        },
    );
    assert!(r.poll(2).is_err());
    // Completions before a bad CQE are returned; the error comes next.
    r.post_recvs(1);
    r.hw_write(
        4,
        Cqe {
            vlan_my_qpn: 0x48,
            owner_sr_opcode: cqe::recv_opcode::SEND,
            ..Default::default()
        },
    );
    r.hw_write(
        5,
        Cqe {
            vlan_my_qpn: 0x123,
            owner_sr_opcode: cqe::recv_opcode::SEND,
            ..Default::default()
        },
    );
    assert_eq!(r.poll(4).unwrap().len(), 1);
    assert!(r.poll(4).is_err());
    assert!(r.poll(4).unwrap().is_empty());
}

#[test]
fn receive_cqes_of_a_qp_on_an_srq_complete_the_srq_wqe_they_name() {
    let mut r = rig(8, true);
    let db = r.bed.dbs.alloc(&r.bed.pool, 0).unwrap();
    // Four WQEs of one 16-byte entry after the 16-byte next segment.
    let srq = Mlx4IbSrq::detached(&r.bed.pool, 4, 1, 5, db).unwrap();
    let srq = crate::SrqId::from_index(r.srqs.insert(srq));
    let mut cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let qp = crate::qp::Mlx4IbQp::detached(
        QpType::Ud,
        0x4a,
        &mut cap,
        true,
        crate::qp::HostMemory {
            caps: &r.bed.caps,
            pool: &r.bed.pool,
            uar: r.bed.uar(),
            recv: crate::qp::HostRecv::Srq(srq),
        },
    )
    .unwrap();
    assert_eq!(qp.rq().wqe_cnt, 0, "a QP on an SRQ has no RQ of its own");
    r.qps.insert(qp);
    let sg = [Sge {
        addr: 0x1000,
        length: 64,
        lkey: 1,
    }];
    let wrs: Vec<RecvWr> = (0..3)
        .map(|i| RecvWr {
            wr_id: 700 + i,
            sg_list: &sg,
        })
        .collect();
    r.srqs
        .get_mut(srq.index())
        .unwrap()
        .post_recv(&wrs)
        .unwrap();
    // The SRQ's WQEs complete in any order: the CQE's counter names one.
    let recv = |idx: u16| Cqe {
        vlan_my_qpn: 0x4a,
        wqe_index: idx,
        byte_cnt: 8,
        owner_sr_opcode: cqe::recv_opcode::SEND,
        ..Default::default()
    };
    r.hw_write(0, recv(2));
    r.hw_write(1, recv(0));
    let wc = r.poll(4).unwrap();
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.qp_num)).collect::<Vec<_>>(),
        [(702, 0x4a), (700, 0x4a)]
    );
    assert_eq!(r.srqs.get(srq.index()).unwrap().outstanding(), 1);
    // A WQE completed once, or never posted, is the device's error; the
    // CQE is consumed and the posted WQE still completes after it.
    r.hw_write(2, recv(2));
    assert!(matches!(r.poll(4), Err(Error::Inval(_))));
    r.hw_write(3, recv(3));
    assert!(matches!(r.poll(4), Err(Error::Inval(_))));
    r.hw_write(4, recv(1));
    assert_eq!(r.poll(4).unwrap()[0].wr_id, 701);
    assert_eq!(r.cq.cons_index(), 5);
    // The SRQ gone: the QP's completions are refused, not guessed.
    r.srqs.remove(srq.index());
    r.hw_write(5, recv(0));
    assert!(matches!(r.poll(4), Err(Error::Inval(_))));
}

/// A successful send CQE of the rig's QP for WQE `idx`.
fn send_cqe(op: u32, idx: u16) -> Cqe {
    Cqe {
        vlan_my_qpn: 0x48,
        wqe_index: idx,
        byte_cnt: 77,
        owner_sr_opcode: cqe::IS_SEND_MASK | op as u8,
        ..Default::default()
    }
}

#[test]
fn send_cqes_of_the_cached_qp_fill_completions_and_refuse_wqes_not_posted() {
    for sig_all in [true, false] {
        let mut r = rig(8, sig_all);
        r.post_sends(2, 1);
        // The first CQE makes the QP the cached one; the second takes the
        // one-completion line; the third names no posted WQE.
        r.hw_write(0, send_cqe(opcode::RDMA_WRITE, 0));
        r.hw_write(1, send_cqe(opcode::RDMA_READ, 1));
        r.hw_write(2, send_cqe(opcode::SEND, 2));
        let w = r.poll(1).unwrap();
        assert_eq!((w[0].wr_id, w[0].opcode), (500, WcOpcode::RdmaWrite));
        let w = r.poll(1).unwrap();
        assert_eq!(
            (w[0].wr_id, w[0].qp_num, w[0].opcode, w[0].byte_len),
            (501, 0x48, WcOpcode::RdmaRead, 77),
            "sig_all {sig_all}"
        );
        assert_eq!(w[0].status, WcStatus::Success);
        assert!(r.poll(1).is_err(), "sig_all {sig_all}: a WQE never posted");
        assert_eq!(r.cq.cons_index(), 3, "the bad CQE is consumed");
        assert_eq!(r.cq.db.read(0), 3, "and the set_ci record says so");
        assert!(r.poll(1).unwrap().is_empty());

        // A run of the cached QP's sends: the completions before the bad
        // CQE come first, its error with the next poll.
        r.post_sends(3, 1);
        for (n, op, idx) in [
            (3, opcode::ATOMIC_FA, 2),
            (4, opcode::RDMA_WRITE_IMM, 3),
            (5, opcode::RDMA_WRITE, 4),
            (6, opcode::SEND, 5),
            (7, opcode::SEND, 4),
        ] {
            r.hw_write(n, send_cqe(op, idx));
        }
        // (`post_sends` numbers its WRs from 500 again.)
        let wc = r.poll(8).unwrap();
        assert_eq!(
            wc.iter().map(|w| (w.wr_id, w.opcode)).collect::<Vec<_>>(),
            [
                (500, WcOpcode::FetchAdd),
                (501, WcOpcode::RdmaWrite),
                (502, WcOpcode::RdmaWrite),
            ],
            "sig_all {sig_all}"
        );
        assert_eq!(wc[0].byte_len, 8, "an atomic reports 8 bytes");
        assert_eq!(wc[1].wc_flags, WcFlags::WITH_IMM);
        assert_eq!(r.cq.cons_index(), 7, "the bad CQE is consumed");
        assert!(r.poll(8).is_err(), "sig_all {sig_all}: reported next");
        // The CQE after it is again the queue's error (nothing posted),
        // and the queue is unharmed: five posted, five completed.
        assert!(r.poll(8).is_err());
        assert_eq!(r.cq.cons_index(), 8);
        let q = r.qps.get(r.qp).unwrap();
        assert_eq!((q.sq.head, q.sq.tail), (5, 5));
    }
}

#[test]
fn arm_doorbell_and_record() {
    let r = rig(8, true);
    r.cq.req_notify(false, 1);
    // Record: sn 1 << 28 | REQ_NOT | ci 0.
    assert_eq!(r.cq.db.read(1), 0x1200_0000);
    // MMIO at UAR + 0x20: [sn | cmd | cqn] [ci], big-endian.
    assert_eq!(r.bed.uar_mem.bytes(0x20, 8), [0x12, 0, 0, 0x81, 0, 0, 0, 0]);
    r.cq.req_notify(true, 6);
    assert_eq!(r.bed.uar_mem.bytes(0x20, 4), [0x21, 0, 0, 0x81]);
}

/// `mlx4_cq_arm`'s order, from hal's recording fake: the arm record in
/// host memory, a `wmb`, then the MMIO doorbell (x86 keeps the stores in
/// order without it). `set_ci` has no barrier in Linux and none here.
#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "hal's recorder exists in debug builds only"
)]
fn the_arm_record_is_ordered_before_the_arm_doorbell() {
    let r = rig(8, true);
    let (page, arm) = r.cq.db.place(1);
    for (solicited, sn) in [(false, 1), (true, 2), (false, 3)] {
        let mut rec = hal::fake::record::Recording::start();
        r.cq.req_notify(solicited, sn);
        let log = rec.take();
        drop(rec);
        assert!(
            log.iter().any(|a| a.in_buf(&page) == Some(arm.clone())),
            "the arm record is written: {log:?}"
        );
        assert_eq!(
            crate::qp::tests::check_doorbells(&log, "arm"),
            Ok(1),
            "{log:?}"
        );
    }
}

#[test]
fn cleaning_removes_one_qps_entries_and_keeps_the_rest() {
    let mut r = rig(8, true);
    r.post_recvs(2);
    // A second QP on the same CQ.
    let other = r.bed.qp(
        QpType::Ud,
        QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        true,
    );
    let mut other = other;
    other.qpn = 0x49;
    other.ibqp_num = 0x49;
    let sg = [Sge::default()];
    other
        .post_recv(&[RecvWr {
            wr_id: 77,
            sg_list: &sg,
        }])
        .unwrap();
    r.qps.insert(other);
    for (n, q) in [(0, 0x48), (1, 0x49), (2, 0x48)] {
        r.hw_write(
            n,
            Cqe {
                vlan_my_qpn: q,
                owner_sr_opcode: cqe::recv_opcode::SEND,
                ..Default::default()
            },
        );
    }
    r.cq.clean(0x48, None);
    assert_eq!(r.cq.cons_index(), 2, "two entries dropped");
    let wc = r.poll(8).unwrap();
    assert_eq!(
        wc.iter().map(|w| (w.qp_num, w.wr_id)).collect::<Vec<_>>(),
        [(0x49, 77)]
    );
}

/// xorshift64*: a deterministic stream for the fuzz test.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn random_cqes_from_the_device_never_panic_or_corrupt_the_queues() {
    let mut r = rig(64, false);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut n = 0u32;
    for _ in 0..100_000 {
        // Keep a few receives and sends outstanding so good CQEs can match.
        if r.qps.get(r.qp).unwrap().rq.outstanding() < 4 {
            r.post_recvs(4);
        }
        if r.qps.get(r.qp).unwrap().sq.outstanding() < 4 {
            r.post_sends(4, 1);
        }
        let mut b = [0u8; 32];
        for w in b.chunks_mut(8) {
            w.copy_from_slice(&rng.next().to_le_bytes());
        }
        // Half of them name our QP (so they reach the wrid/SRQ logic).
        if rng.next() & 1 == 0 {
            b[0..4].copy_from_slice(&0x48u32.to_be_bytes());
        }
        r.hw_write(n, Cqe::from_bytes(&b));
        n += 1;
        let mut wc = [Wc::default(); 4];
        let _ = r.cq.poll(&mut r.qps, &mut r.srqs, &mut wc);
        let q = r.qps.get(r.qp).unwrap();
        assert!(q.sq.outstanding() <= q.sq.wqe_cnt, "SQ tail ran past head");
        assert!(q.rq.outstanding() <= q.rq.wqe_cnt, "RQ tail ran past head");
    }
    assert_eq!(r.cq.cons_index(), n, "every CQE consumed exactly once");
}
