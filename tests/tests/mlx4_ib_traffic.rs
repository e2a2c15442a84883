//! Model-backed traffic through mlx4_ib.
//!
//! Two HCAs cabled back to back, the model's engines executing the WQEs the driver
//! builds and writing the CQEs it parses: RC SEND (with immediate), RDMA WRITE
//! (with immediate), RDMA READ, both atomics with the data checked; UD send/receive
//! with and without GRH; SRQ receives; error completions under Linux's
//! `ib_wc_status` names.

use tests::mlx4_common;

use hal::DmaBuf;
use ib_core::verbs::{
    AccessFlags, AhAttr, Gid, GlobalRoute, Mtu, QpAttr, QpAttrMask as M, QpCap, QpState, QpType,
    RecvWr, SendFlags, Sge, SigType, SrqAttr, Wc, WcFlags, WcOpcode, WcStatus,
};
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::verbs::{QpCreateFlags, QpInitAttr, SendWr, WrDetail, WrOpcode};
use mlx4_ib::{CqId, Mlx4IbDev, MrId, PdId, QpId};
use sim::{SimConfig, SimHca, Wire};

/// One side: its model, driver, a PD, a CQ and a registered buffer.
struct Side {
    hca: SimHca,
    ib: Mlx4IbDev,
    pd: PdId,
    cq: CqId,
    buf: DmaBuf,
    mr: MrId,
    lid: u16,
}

const BUF: usize = 4 * 4096;
const IOVA: u64 = 0x7000_0000;

fn side(hca: SimHca, lid: u16) -> Side {
    let dev = bring_up(&hca, Profile::default()).expect("mlx4_core");
    let mut ib = Mlx4IbDev::add(dev, "mlx4_0").expect("mlx4_ib_add");
    ib.core_mut().init_port(1).expect("INIT_PORT");
    let pd = ib.alloc_pd().unwrap();
    let cq = ib.create_cq(256, 0).unwrap();
    let buf = hca.dma_pool().alloc_pages(BUF / 4096).unwrap();
    let pages: Vec<u64> = (0..(BUF / 4096) as u64)
        .map(|i| buf.bus_addr().0 + i * 4096)
        .collect();
    let mr = ib
        .reg_mr_pages(
            pd,
            IOVA,
            BUF as u64,
            12,
            &pages,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    Side {
        hca,
        ib,
        pd,
        cq,
        buf,
        mr,
        lid,
    }
}

fn pair() -> (Side, Side, Wire) {
    let (a, b, w) = SimHca::back_to_back(SimConfig::default(), SimConfig::default());
    init_logger();
    let (a, b) = (side(a, 1), side(b, 2));
    // Both ends opened: the cable trains; an SM would now make them Active.
    w.settle();
    for s in [&a, &b] {
        assert!(
            tests::sm::sm_activate(&s.hca, 1, s.lid, 1),
            "port 1 active: {:?}",
            s.hca.port_state(1)
        );
    }
    (a, b, w)
}

fn lkey(s: &Side) -> u32 {
    s.ib.mr(s.mr).unwrap().lkey()
}
fn rkey(s: &Side) -> u32 {
    s.ib.mr(s.mr).unwrap().rkey()
}

fn qp(s: &mut Side, t: QpType, srq: Option<mlx4_ib::SrqId>) -> QpId {
    let mut init = QpInitAttr {
        send_cq: s.cq,
        recv_cq: s.cq,
        srq,
        cap: QpCap {
            max_send_wr: 32,
            max_recv_wr: if srq.is_some() { 0 } else { 32 },
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        },
        sq_sig_type: SigType::ReqWr,
        qp_type: t,
        create_flags: QpCreateFlags::empty(),
        port_num: 0,
    };
    s.ib.create_qp(s.pd, &mut init).unwrap()
}

fn connect(s: &mut Side, q: QpId, peer_lid: u16, peer_qpn: u32) {
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        pkey_index: 0,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..Default::default()
    };
    s.ib.modify_qp(q, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    let a = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: peer_qpn,
        rq_psn: 0,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        ah_attr: AhAttr {
            dlid: peer_lid,
            port_num: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    s.ib.modify_qp(
        q,
        &a,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )
    .unwrap();
    let a = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..Default::default()
    };
    s.ib.modify_qp(
        q,
        &a,
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

fn ud_up(s: &mut Side, q: QpId, qkey: u32) {
    s.ib.modify_qp(
        q,
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey,
            ..Default::default()
        },
        M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
    )
    .unwrap();
    s.ib.modify_qp(
        q,
        &QpAttr {
            qp_state: QpState::Rtr,
            ..Default::default()
        },
        M::STATE,
    )
    .unwrap();
    s.ib.modify_qp(
        q,
        &QpAttr {
            qp_state: QpState::Rts,
            ..Default::default()
        },
        M::STATE | M::SQ_PSN,
    )
    .unwrap();
}

/// Steps the wire until `s`'s CQ yields `n` completions (bounded).
fn wait(w: &Wire, s: &mut Side, n: usize) -> Vec<Wc> {
    let mut got = Vec::new();
    for _ in 0..10_000 {
        w.step(true);
        let mut wc = [Wc::default(); 16];
        let k = s.ib.poll_cq(s.cq, &mut wc).unwrap();
        got.extend_from_slice(&wc[..k]);
        if got.len() >= n {
            return got;
        }
    }
    panic!("only {} of {n} completions: {got:#?}", got.len());
}

fn sge(s: &Side, off: u64, len: u32) -> [Sge; 1] {
    [Sge {
        addr: IOVA + off,
        length: len,
        lkey: lkey(s),
    }]
}

fn clean(s: &Side) {
    assert!(s.hca.violations().is_empty(), "{:#?}", s.hca.violations());
    assert!(s.hca.dma_faults().is_empty(), "{:#?}", s.hca.dma_faults());
}

#[test]
fn rc_send_write_read_and_atomics_move_the_data() {
    let (mut a, mut b, w) = pair();
    let qa = qp(&mut a, QpType::Rc, None);
    let qb = qp(&mut b, QpType::Rc, None);
    let (na, nb) = (a.ib.qp(qa).unwrap().qpn(), b.ib.qp(qb).unwrap().qpn());
    connect(&mut a, qa, b.lid, nb);
    connect(&mut b, qb, a.lid, na);

    // SEND with immediate into a posted receive.
    let msg: Vec<u8> = (0..200u8).collect();
    a.buf.write_bytes(0, &msg);
    let rsg = sge(&b, 0x1000, 256);
    b.ib.post_recv(
        qb,
        &[RecvWr {
            wr_id: 77,
            sg_list: &rsg,
        }],
    )
    .unwrap();
    let ssg = sge(&a, 0, 200);
    a.ib.post_send(
        qa,
        &[SendWr {
            wr_id: 1,
            opcode: WrOpcode::SendWithImm,
            send_flags: SendFlags::SIGNALED,
            sg_list: &ssg,
            imm_data: 0xabcd_1234,
            ..Default::default()
        }],
    )
    .unwrap();
    let wc = wait(&w, &mut a, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    let wc = wait(&w, &mut b, 1);
    assert_eq!(wc[0].wr_id, 77);
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    assert_eq!(wc[0].opcode, WcOpcode::Recv);
    assert_eq!(wc[0].byte_len, 200);
    assert!(wc[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(wc[0].imm_data, 0xabcd_1234);
    let mut got = vec![0u8; 200];
    b.buf.read_bytes(0x1000, &mut got);
    assert_eq!(got, msg);

    // RDMA WRITE (3000 bytes: several MTU-1024 packets).
    let big: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    a.buf.write_bytes(0x2000, &big);
    let wsg = sge(&a, 0x2000, 3000);
    a.ib.post_send(
        qa,
        &[SendWr {
            wr_id: 2,
            opcode: WrOpcode::RdmaWrite,
            send_flags: SendFlags::SIGNALED,
            sg_list: &wsg,
            wr: WrDetail::Rdma {
                remote_addr: IOVA + 0x2000,
                rkey: rkey(&b),
            },
            ..Default::default()
        }],
    )
    .unwrap();
    let wc = wait(&w, &mut a, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let mut got = vec![0u8; 3000];
    b.buf.read_bytes(0x2000, &mut got);
    assert_eq!(got, big);

    // RDMA WRITE with immediate consumes a receive on B.
    b.ib.post_recv(
        qb,
        &[RecvWr {
            wr_id: 78,
            sg_list: &rsg,
        }],
    )
    .unwrap();
    let isg = sge(&a, 0, 16);
    a.ib.post_send(
        qa,
        &[SendWr {
            wr_id: 3,
            opcode: WrOpcode::RdmaWriteWithImm,
            send_flags: SendFlags::SIGNALED,
            sg_list: &isg,
            imm_data: 0x5555,
            wr: WrDetail::Rdma {
                remote_addr: IOVA + 0x3000,
                rkey: rkey(&b),
            },
            ..Default::default()
        }],
    )
    .unwrap();
    wait(&w, &mut a, 1);
    let wc = wait(&w, &mut b, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].opcode, wc[0].imm_data),
        (78, WcOpcode::RecvRdmaWithImm, 0x5555)
    );

    // RDMA READ back from B.
    let rsg2 = sge(&a, 0x3000, 3000);
    a.ib.post_send(
        qa,
        &[SendWr {
            wr_id: 4,
            opcode: WrOpcode::RdmaRead,
            send_flags: SendFlags::SIGNALED,
            sg_list: &rsg2,
            wr: WrDetail::Rdma {
                remote_addr: IOVA + 0x2000,
                rkey: rkey(&b),
            },
            ..Default::default()
        }],
    )
    .unwrap();
    let wc = wait(&w, &mut a, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (4, WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(wc[0].byte_len, 3000);
    let mut got = vec![0u8; 3000];
    a.buf.read_bytes(0x3000, &mut got);
    assert_eq!(got, big);

    // Atomics on an 8-byte word of B.
    b.buf.write_bytes(0x3800, &100u64.to_be_bytes());
    let asg = sge(&a, 0x3900, 8);
    let atomic = |op, compare_add, swap| SendWr {
        wr_id: 5,
        opcode: op,
        send_flags: SendFlags::SIGNALED,
        sg_list: &asg,
        wr: WrDetail::Atomic {
            remote_addr: IOVA + 0x3800,
            compare_add,
            swap,
            compare_add_mask: 0,
            swap_mask: 0,
            rkey: rkey(&b),
        },
        ..Default::default()
    };
    a.ib.post_send(qa, &[atomic(WrOpcode::AtomicFetchAndAdd, 5, 0)])
        .unwrap();
    let wc = wait(&w, &mut a, 1);
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    assert_eq!(a.buf.read_be64(0x3900), 100, "FAA returns the old value");
    assert_eq!(b.buf.read_be64(0x3800), 105);
    a.ib.post_send(qa, &[atomic(WrOpcode::AtomicCmpAndSwp, 105, 7)])
        .unwrap();
    let wc = wait(&w, &mut a, 1);
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::Success, WcOpcode::CompSwap)
    );
    assert_eq!(a.buf.read_be64(0x3900), 105);
    assert_eq!(b.buf.read_be64(0x3800), 7, "CAS swapped");

    // Many more WRITEs: the SQ and the CQ wrap several times (owner bits,
    // stamps of reused WQEs, the unsignalled-skip on the CQ side).
    for i in 0..300u64 {
        let sg = sge(&a, 0x2000 + (i % 16) * 64, 64);
        let signalled = i % 3 == 2;
        a.ib.post_send(
            qa,
            &[SendWr {
                wr_id: 1000 + i,
                opcode: WrOpcode::RdmaWrite,
                send_flags: if signalled {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::empty()
                },
                sg_list: &sg,
                wr: WrDetail::Rdma {
                    remote_addr: IOVA + 0x3000 + (i % 16) * 64,
                    rkey: rkey(&b),
                },
                ..Default::default()
            }],
        )
        .unwrap();
        if signalled {
            let wc = wait(&w, &mut a, 1);
            assert_eq!((wc[0].wr_id, wc[0].status), (1000 + i, WcStatus::Success));
        }
    }

    // A bad rkey: remote access error, then the QP flushes.
    a.ib.post_send(
        qa,
        &[SendWr {
            wr_id: 6,
            opcode: WrOpcode::RdmaWrite,
            send_flags: SendFlags::SIGNALED,
            sg_list: &isg,
            wr: WrDetail::Rdma {
                remote_addr: IOVA,
                rkey: rkey(&b) ^ 0x100,
            },
            ..Default::default()
        }],
    )
    .unwrap();
    let wc = wait(&w, &mut a, 1);
    assert_eq!(wc[0].status.name(), "IB_WC_REM_ACCESS_ERR", "{:?}", wc[0]);
    clean(&a);
    clean(&b);
}

/// The straight-line send path (a single WR: inline data in one or two
/// segments, two SGEs, RDMA WRITE inline) checked by the model, data
/// compared at the far end.
#[test]
fn rc_inline_and_two_sge_sends_on_the_straight_line_path() {
    let (mut a, mut b, w) = pair();
    let qa = qp(&mut a, QpType::Rc, None);
    let qb = qp(&mut b, QpType::Rc, None);
    let (na, nb) = (a.ib.qp(qa).unwrap().qpn(), b.ib.qp(qb).unwrap().qpn());
    connect(&mut a, qa, b.lid, nb);
    connect(&mut b, qb, a.lid, na);
    let msg: Vec<u8> = (0..64u8).map(|i| i ^ 0xa5).collect();
    for (i, len) in [64usize, 30].into_iter().enumerate() {
        let rsg = sge(&b, 0x1000 * (i as u64 + 1), 256);
        b.ib.post_recv(
            qb,
            &[RecvWr {
                wr_id: 50 + i as u64,
                sg_list: &rsg,
            }],
        )
        .unwrap();
        a.ib.post_send(
            qa,
            &[SendWr {
                wr_id: 10 + i as u64,
                opcode: WrOpcode::Send,
                send_flags: SendFlags::SIGNALED | SendFlags::INLINE,
                inline_data: &msg[..len],
                ..Default::default()
            }],
        )
        .unwrap();
        let wc = wait(&w, &mut a, 1);
        assert_eq!(
            (wc[0].wr_id, wc[0].status),
            (10 + i as u64, WcStatus::Success)
        );
        let wc = wait(&w, &mut b, 1);
        assert_eq!((wc[0].wr_id, wc[0].byte_len), (50 + i as u64, len as u32));
        let mut got = vec![0u8; len];
        b.buf.read_bytes(0x1000 * (i + 1), &mut got);
        assert_eq!(got, msg[..len], "inline SEND of {len} bytes");
    }
    // Two SGEs gathered into one RDMA WRITE, then an inline WRITE.
    a.buf.write_bytes(0x3000, &[1u8; 100]);
    a.buf.write_bytes(0x3400, &[2u8; 50]);
    let two = [sge(&a, 0x3000, 100)[0], sge(&a, 0x3400, 50)[0]];
    for (wr_id, sg, inl, at) in [
        (20u64, &two[..], &[][..], 0x2000u64),
        (21, &[][..], &msg[..40], 0x2800),
    ] {
        a.ib.post_send(
            qa,
            &[SendWr {
                wr_id,
                opcode: WrOpcode::RdmaWrite,
                send_flags: if inl.is_empty() {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::SIGNALED | SendFlags::INLINE
                },
                sg_list: sg,
                inline_data: inl,
                wr: WrDetail::Rdma {
                    remote_addr: IOVA + at,
                    rkey: rkey(&b),
                },
                ..Default::default()
            }],
        )
        .unwrap();
        let wc = wait(&w, &mut a, 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (wr_id, WcStatus::Success));
    }
    let mut got = vec![0u8; 150];
    b.buf.read_bytes(0x2000, &mut got);
    assert!(got[..100].iter().all(|&x| x == 1) && got[100..].iter().all(|&x| x == 2));
    let mut got = vec![0u8; 40];
    b.buf.read_bytes(0x2800, &mut got);
    assert_eq!(got, msg[..40]);
    clean(&a);
    clean(&b);
}

#[test]
fn ud_with_and_without_grh_and_an_srq() {
    let (mut a, mut b, w) = pair();
    let qa = qp(&mut a, QpType::Ud, None);
    let mut sattr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq = b.ib.create_srq(b.pd, &mut sattr).unwrap();
    let qb = qp(&mut b, QpType::Ud, Some(srq));
    ud_up(&mut a, qa, 0x1111);
    ud_up(&mut b, qb, 0x2222);
    let nb = b.ib.qp(qb).unwrap().qpn();
    let rsgs: Vec<[Sge; 1]> = (0..2)
        .map(|i| sge(&b, 0x1000 * (i + 1), 40 + 512))
        .collect();
    for (i, r) in rsgs.iter().enumerate() {
        b.ib.post_srq_recv(
            srq,
            &[RecvWr {
                wr_id: 100 + i as u64,
                sg_list: r,
            }],
        )
        .unwrap();
    }
    let payload: Vec<u8> = (0..128u8).rev().collect();
    a.buf.write_bytes(0, &payload);
    let ssg = sge(&a, 0, 128);
    let gid = |s: &mut Side| Gid(s.ib.query_gid(1, 0).unwrap());
    let dgid = gid(&mut b);
    for (i, grh) in [None, Some(dgid)].into_iter().enumerate() {
        let ah =
            a.ib.create_ah(
                a.pd,
                &AhAttr {
                    dlid: b.lid,
                    port_num: 1,
                    grh: grh.map(|g| GlobalRoute {
                        dgid: g,
                        hop_limit: 1,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )
            .unwrap();
        a.ib.post_send(
            qa,
            &[SendWr {
                wr_id: 10 + i as u64,
                opcode: WrOpcode::Send,
                send_flags: SendFlags::SIGNALED,
                sg_list: &ssg,
                wr: WrDetail::Ud {
                    ah: ib_core::verbs::Ah(ah.index()),
                    remote_qpn: nb,
                    remote_qkey: 0x2222,
                    pkey_index: 0,
                    port_num: 0,
                },
                ..Default::default()
            }],
        )
        .unwrap();
        let wc = wait(&w, &mut a, 1);
        assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
        let wc = wait(&w, &mut b, 1);
        let r = wc[0];
        assert_eq!(r.status, WcStatus::Success, "{r:?}");
        assert_eq!(r.wr_id, 100 + i as u64, "SRQ WQE in order");
        assert_eq!(r.byte_len, 40 + 128, "byte_len counts the GRH area");
        // With the AH's GRH the packet carries one, and its 40 bytes land
        // first in the receive buffer: IPVer 6, NxtHdr 0x1B, the hop
        // limit, SGID = A's port GID, DGID = B's.
        assert_eq!(r.wc_flags.contains(WcFlags::GRH), grh.is_some(), "{r:?}");
        if grh.is_some() {
            let mut g = [0u8; 40];
            b.buf.read_bytes(0x1000 * (i + 1), &mut g);
            assert_eq!(g[0] >> 4, 6, "IPVer");
            assert_eq!((g[6], g[7]), (0x1b, 1), "NxtHdr, HopLmt");
            assert_eq!(u16::from_be_bytes([g[4], g[5]]), 12 + 8 + 128 + 4);
            assert_eq!(&g[8..24], &gid(&mut a).0, "SGID");
            assert_eq!(&g[24..40], &dgid.0, "DGID");
        }
        assert_eq!(r.slid, a.lid);
        let mut got = vec![0u8; 128];
        b.buf.read_bytes(0x1000 * (i + 1) + 40, &mut got);
        assert_eq!(got, payload);
    }
    clean(&a);
    clean(&b);
}

#[test]
fn an_smp_and_a_pma_query_loop_back_through_qp0_and_qp1() {
    // The engine delivers MLX (QP0/QP1) packets to the local port only so
    // far, so the MAD round trip runs HCA -> its own port -> HCA: the MLX
    // WQE (UD header from ib_core's ud_header, VL15, ICRC segment) checked
    // by the model, the receive on QP0/QP1 after the GRH area, ib_core's
    // agent asking the firmware SMA/PMA through MAD_IFC, the reply sent
    // back the same way.
    let hca = sync_hca();
    init_logger();
    let dev = bring_up(&hca, Profile::default()).expect("mlx4_core");
    let ib = Mlx4IbDev::add(dev, "mlx4_0").expect("mlx4_ib_add");
    let guid = ib.node_guid();
    let mut core = ib_core::IbCore::new(hca.clock());
    let id = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .unwrap();
    assert!(
        tests::sm::sm_activate(&hca, 1, 5, 5),
        "{:?}",
        hca.port_state(1)
    );
    let r = core
        .smp_query(
            id,
            1,
            ib_core::SmpRoute::Lid(5),
            0x0011,
            0,
            std::time::Duration::from_secs(2),
        )
        .expect("LID-routed SMP answered");
    assert_eq!(r.0[3], 0x81, "GetResp");
    assert_eq!(
        u64::from_be_bytes(r.0[64 + 12..64 + 20].try_into().unwrap()),
        guid
    );
    let p = core
        .pma_query(
            id,
            1,
            5,
            0x0012,
            0,
            &[0, 1],
            std::time::Duration::from_secs(2),
        )
        .expect("PMA PortCounters answered on QP1");
    assert_eq!((p.0[1], p.0[3]), (0x04, 0x81), "PerfMgmt GetResp");
    clean_hca(&hca);
}

fn clean_hca(h: &SimHca) {
    assert!(h.violations().is_empty(), "{:#?}", h.violations());
    assert!(h.dma_faults().is_empty(), "{:#?}", h.dma_faults());
}
