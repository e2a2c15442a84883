//! Golden-byte tests of send and receive WQEs built by the real posting code over host memory, pinned to the documented segment offsets (porting map 6.1-6.5).

use alloc::sync::Arc;
use alloc::vec::Vec;

use hal::fake::{ArenaDma, MemBar};
use hal::{Bar, DmaPool};
use mlx4_core::Caps;

use mlx4_hw::doorbell::SEND_DOORBELL;

use super::post::HW_OPCODE;
use super::*;
use crate::ah::{Mlx4IbAh, create_ib_ah};
use crate::doorbell::DbPool;
use crate::table::Slab;
use crate::verbs::{AhAttr, QpCap, RecvWr, SendFlags, SendWr, Sge, WrDetail, WrOpcode};

/// A host-memory stand-in for the HCA: DMA arena, a UAR page, doorbell
/// records, device limits like a ConnectX-3's.
pub(crate) struct Bed {
    pub pool: DmaPool,
    pub uar_mem: Arc<MemBar>,
    pub dbs: DbPool,
    pub caps: Caps,
    pub ahs: Slab<Mlx4IbAh>,
}

impl Bed {
    pub fn new() -> Bed {
        let mut caps = Caps {
            num_ports: 2,
            max_wqes: 16384,
            max_sq_sg: 32,
            max_rq_sg: 32,
            max_sq_desc_sz: 1008,
            stat_rate_support: 0x1f80,
            ..Default::default()
        };
        caps.port[1].gid_table_len = 128;
        caps.port[1].pkey_table_len = 128;
        Bed {
            pool: DmaPool::new(Arc::new(ArenaDma::new(8 << 20))),
            uar_mem: Arc::new(MemBar::new(4096)),
            dbs: DbPool::default(),
            caps,
            ahs: Slab::default(),
        }
    }

    pub fn uar(&self) -> Bar {
        Bar::from_backend(self.uar_mem.clone(), 4096)
    }

    pub fn qp(&mut self, t: QpType, cap: QpCap, sig_all: bool) -> Mlx4IbQp {
        let db = self.dbs.alloc(&self.pool, 0).unwrap();
        let mut cap = cap;
        Mlx4IbQp::detached(
            t,
            0x48,
            &mut cap,
            sig_all,
            HostMemory {
                caps: &self.caps,
                pool: &self.pool,
                uar: self.uar(),
                recv: HostRecv::Rq(db),
            },
        )
        .unwrap()
    }
}

fn rc_cap(sge: u32) -> QpCap {
    QpCap {
        max_send_wr: 100,
        max_recv_wr: 16,
        max_send_sge: sge,
        max_recv_sge: 2,
        max_inline_data: 0,
    }
}

fn dw(qp: &Mlx4IbQp, off: usize) -> u32 {
    qp.buf.read_be32(off)
}

#[test]
fn sq_geometry_follows_set_kernel_sq_size() {
    let caps = Bed::new().caps;
    // RC, 1 SGE: 16 + 32 + 16 + 16 = 80 -> 128-byte stride; 2048/128 + 1
    // = 17 spare; 100 + 17 -> 128 WQEs; max_send_wr = 111.
    let mut cap = rc_cap(1);
    let (sq, spare) = set_kernel_sq_size(&caps, &mut cap, QpType::Rc).unwrap();
    assert_eq!(
        (sq.wqe_shift, spare, sq.wqe_cnt, sq.max_post),
        (7, 17, 128, 111)
    );
    assert_eq!(cap.max_send_wr, 111);
    assert_eq!(sq.max_gs, (128 - 64) / 16);
    // UC: 16 + 16 + 16 = 48 -> the 64-byte minimum, 33 spare.
    let mut cap = rc_cap(1);
    let (sq, spare) = set_kernel_sq_size(&caps, &mut cap, QpType::Uc).unwrap();
    assert_eq!((sq.wqe_shift, spare), (6, 33));
    // QP1 as ib_mad creates it (2 SGEs): 128 + 32 -> 256 bytes.
    let mut cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: 512,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    assert_eq!(send_wqe_overhead(QpType::Gsi), 128);
    let (sq, _) = set_kernel_sq_size(&caps, &mut cap, QpType::Gsi).unwrap();
    assert_eq!(sq.wqe_shift, 8);
    // RQ: 2 SGEs -> 32-byte WQEs; 16 WRs.
    let mut cap = rc_cap(1);
    let rq = set_rq_size(&caps, &mut cap, true).unwrap();
    assert_eq!((rq.wqe_cnt, rq.max_gs, rq.wqe_shift), (16, 2, 5));
    // Limits.
    let mut cap = rc_cap(33);
    assert!(set_kernel_sq_size(&caps, &mut cap, QpType::Rc).is_err());
    let mut cap = rc_cap(1);
    cap.max_recv_wr = 1;
    assert!(
        set_rq_size(&caps, &mut cap, false).is_err(),
        "RQ sizes with an SRQ"
    );
}

#[test]
fn golden_rdma_write() {
    let mut b = Bed::new();
    let mut qp = b.qp(QpType::Rc, rc_cap(1), false);
    let sg = [Sge {
        addr: 0x1122_3344_5566_7788,
        length: 0x1000,
        lkey: 0xabcd,
    }];
    let wr = SendWr {
        wr_id: 7,
        opcode: WrOpcode::RdmaWrite,
        send_flags: SendFlags::SIGNALED | SendFlags::FENCE,
        sg_list: &sg,
        wr: WrDetail::Rdma {
            remote_addr: 0xdead_beef_0000_1000,
            rkey: 0x0102_0304,
        },
        ..Default::default()
    };
    qp.post_send(&b.ahs, &[wr]).unwrap();
    let w = qp.send_wqe_offset(0);
    // ctrl: owner 0 (pass 0) | RDMA_WRITE; fence | 3 DS; CQ update; imm 0.
    assert_eq!(dw(&qp, w), 0x0000_0008);
    assert_eq!(dw(&qp, w + 4), 0x0000_0043);
    assert_eq!(dw(&qp, w + 8), 0x0000_000c);
    assert_eq!(dw(&qp, w + 12), 0);
    // raddr seg.
    assert_eq!(qp.buf.read_be64(w + 16), 0xdead_beef_0000_1000);
    assert_eq!(dw(&qp, w + 24), 0x0102_0304);
    // data seg: byte count, lkey, address.
    assert_eq!(dw(&qp, w + 32), 0x1000);
    assert_eq!(dw(&qp, w + 36), 0xabcd);
    assert_eq!(qp.buf.read_be64(w + 40), 0x1122_3344_5566_7788);
    // Send doorbell: BE (qpn << 8) at UAR + 0x14.
    assert_eq!(b.uar_mem.bytes(0x14, 4), [0, 0, 0x48, 0]);
    assert_eq!(qp.sq.head, 1);
    assert_eq!(qp.sq.wrid[0], 7);
}

#[test]
fn golden_send_with_imm_atomics_and_read() {
    let mut b = Bed::new();
    let mut qp = b.qp(QpType::Rc, rc_cap(1), true);
    let sg = [Sge {
        addr: 0x2000,
        length: 8,
        lkey: 5,
    }];
    let atomic = |op, compare_add, swap| SendWr {
        wr_id: 1,
        opcode: op,
        sg_list: &sg,
        wr: WrDetail::Atomic {
            remote_addr: 0x9000,
            compare_add,
            swap,
            compare_add_mask: 0,
            swap_mask: 0,
            rkey: 0x77,
        },
        ..Default::default()
    };
    let wrs = [
        SendWr {
            wr_id: 1,
            opcode: WrOpcode::SendWithImm,
            send_flags: SendFlags::SOLICITED,
            sg_list: &sg,
            imm_data: 0xcafe_f00d,
            ..Default::default()
        },
        atomic(WrOpcode::AtomicCmpAndSwp, 11, 22),
        atomic(WrOpcode::AtomicFetchAndAdd, 5, 0),
        SendWr {
            wr_id: 1,
            opcode: WrOpcode::RdmaRead,
            sg_list: &sg,
            wr: WrDetail::Rdma {
                remote_addr: 0x4000,
                rkey: 9,
            },
            ..Default::default()
        },
    ];
    qp.post_send(&b.ahs, &wrs).unwrap();
    // SEND_IMM: signalled by the QP (ALL_WR) and solicited; 2 DS; imm.
    let w = qp.send_wqe_offset(0);
    assert_eq!(dw(&qp, w), 0x0b);
    assert_eq!(dw(&qp, w + 4), 2);
    assert_eq!(dw(&qp, w + 8), 0x0c | 0x02);
    assert_eq!(dw(&qp, w + 12), 0xcafe_f00d);
    assert_eq!(dw(&qp, w + 16), 8);
    // CAS: raddr, then swap, compare; 4 DS.
    let w = qp.send_wqe_offset(1);
    assert_eq!(dw(&qp, w), 0x11);
    assert_eq!(dw(&qp, w + 4), 4);
    assert_eq!(qp.buf.read_be64(w + 16), 0x9000);
    assert_eq!(dw(&qp, w + 24), 0x77);
    assert_eq!(qp.buf.read_be64(w + 32), 22, "swap first");
    assert_eq!(qp.buf.read_be64(w + 40), 11, "then compare");
    assert_eq!(dw(&qp, w + 48), 8);
    // FAA: the addend in the first field.
    let w = qp.send_wqe_offset(2);
    assert_eq!(dw(&qp, w), 0x12);
    assert_eq!(qp.buf.read_be64(w + 32), 5);
    // READ.
    let w = qp.send_wqe_offset(3);
    assert_eq!(dw(&qp, w), 0x10);
    assert_eq!(dw(&qp, w + 4), 3);
}

#[test]
fn inline_send_splits_at_64_bytes() {
    let mut b = Bed::new();
    let mut cap = rc_cap(1);
    cap.max_inline_data = 64;
    let db = b.dbs.alloc(&b.pool, 0).unwrap();
    let mut qp = Mlx4IbQp::detached(
        QpType::Rc,
        0x48,
        &mut cap,
        true,
        HostMemory {
            caps: &b.caps,
            pool: &b.pool,
            uar: b.uar(),
            recv: HostRecv::Rq(db),
        },
    )
    .unwrap();
    let data: Vec<u8> = (0..64u8).collect();
    let wr = SendWr {
        opcode: WrOpcode::Send,
        send_flags: SendFlags::INLINE,
        inline_data: &data,
        ..Default::default()
    };
    qp.post_send(&b.ahs, &[wr]).unwrap();
    let w = qp.send_wqe_offset(0);
    assert_eq!(dw(&qp, w), 0x0a);
    // ctrl 16 + (4 + 44) + (4 + 20) = 88 bytes -> 6 DS.
    assert_eq!(dw(&qp, w + 4), 6);
    assert_eq!(dw(&qp, w + 16), 0x8000_0000 | 44);
    let mut got = [0u8; 44];
    qp.buf.read_bytes(w + 20, &mut got);
    assert_eq!(got[..], data[..44]);
    assert_eq!(dw(&qp, w + 64), 0x8000_0000 | 20);
    let mut got = [0u8; 20];
    qp.buf.read_bytes(w + 68, &mut got);
    assert_eq!(got[..], data[44..]);
    // Longer than max_inline_data: refused, nothing posted.
    let long = [0u8; 65];
    let e = qp
        .post_send(
            &b.ahs,
            &[SendWr {
                inline_data: &long,
                ..wr
            }],
        )
        .unwrap_err();
    assert_eq!(e.err, PostFault::InlineTooLong);
    assert_eq!(e.error(), Error::NoMem);
    assert_eq!(e.error().to_errno(), -12, "ENOMEM, as libmlx4");
    assert_eq!(qp.sq.head, 1);
}

#[test]
fn golden_ud_send_with_address_vector() {
    let mut b = Bed::new();
    let ah = create_ib_ah(
        &b.caps,
        0x11,
        &AhAttr {
            dlid: 0x22,
            sl: 1,
            port_num: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let av = ah.av;
    let ah = ib_core::verbs::Ah(b.ahs.insert(ah));
    let mut cap = rc_cap(1);
    cap.max_recv_wr = 1;
    let mut qp = b.qp(QpType::Ud, cap, true);
    let sg = [Sge {
        addr: 0x3000,
        length: 256,
        lkey: 1,
    }];
    let wr = SendWr {
        opcode: WrOpcode::Send,
        sg_list: &sg,
        wr: WrDetail::Ud {
            ah,
            remote_qpn: 0x123456,
            remote_qkey: 0x8001_0000,
            pkey_index: 0,
            port_num: 0,
        },
        ..Default::default()
    };
    qp.post_send(&b.ahs, &[wr]).unwrap();
    let w = qp.send_wqe_offset(0);
    assert_eq!(dw(&qp, w + 4), 5, "ctrl + 48-byte datagram + data = 5 DS");
    let mut got = [0u8; 32];
    qp.buf.read_bytes(w + 16, &mut got);
    assert_eq!(got, av);
    assert_eq!(dw(&qp, w + 48), 0x123456);
    assert_eq!(dw(&qp, w + 52), 0x8001_0000);
    assert_eq!(dw(&qp, w + 64), 256);
    // A UD QP refuses RDMA; an unknown AH is refused.
    let bad = SendWr {
        opcode: WrOpcode::RdmaWrite,
        ..wr
    };
    assert_eq!(
        qp.post_send(&b.ahs, &[wr, bad]).unwrap_err(),
        PostError {
            err: PostFault::BadOpcode,
            bad_wr: 1
        }
    );
    assert_eq!(
        qp.post_send(&b.ahs, &[bad]).unwrap_err().error(),
        Error::Inval("opcode not valid for the QP type")
    );
    assert_eq!(qp.sq.head, 2, "the good WR before the bad one was posted");
    let gone = SendWr {
        wr: WrDetail::Ud {
            ah: ib_core::verbs::Ah(9),
            remote_qpn: 1,
            remote_qkey: 1,
            pkey_index: 0,
            port_num: 0,
        },
        ..wr
    };
    assert!(qp.post_send(&b.ahs, &[gone]).is_err());
}

#[test]
fn bad_requests_and_a_full_queue_are_refused() {
    let mut b = Bed::new();
    let mut uc = b.qp(QpType::Uc, rc_cap(1), true);
    let sg = [Sge::default(); 3];
    let read = SendWr {
        opcode: WrOpcode::RdmaRead,
        wr: WrDetail::Rdma {
            remote_addr: 0,
            rkey: 0,
        },
        ..Default::default()
    };
    assert!(uc.post_send(&b.ahs, &[read]).is_err(), "UC has no READ");
    let too_many = SendWr {
        sg_list: &sg,
        ..Default::default()
    };
    assert!(uc.post_send(&b.ahs, &[too_many]).is_err());
    let mismatch = SendWr {
        opcode: WrOpcode::RdmaWrite,
        ..Default::default()
    };
    assert!(
        uc.post_send(&b.ahs, &[mismatch]).is_err(),
        "RDMA without raddr"
    );
    assert_eq!(b.uar_mem.bytes(0x14, 4), [0; 4], "no doorbell for nothing");
    // Fill the queue: max_post WRs go, the next is QueueFull.
    let max = uc.sq.max_post as usize;
    let wrs: Vec<SendWr> = (0..max + 1)
        .map(|i| SendWr {
            wr_id: i as u64,
            ..Default::default()
        })
        .collect();
    let e = uc.post_send(&b.ahs, &wrs).unwrap_err();
    assert_eq!(
        e,
        PostError {
            err: PostFault::QueueFull,
            bad_wr: max
        }
    );
    assert_eq!(uc.sq.head as usize, max);
}

#[test]
fn owner_bit_flips_each_pass_and_freed_wqes_are_stamped() {
    let mut b = Bed::new();
    let mut qp = b.qp(QpType::Rc, rc_cap(4), true);
    let cnt = qp.sq.wqe_cnt;
    let spare = qp.sq_spare_wqes;
    assert_eq!((cnt, qp.sq.wqe_shift), (128, 7));
    // At RST->INIT every WQE is owner 1 (invalid in pass 0), 8 DS, and
    // its second 64-byte chunk is stamped.
    for i in 0..cnt {
        let w = qp.send_wqe_offset(i);
        assert_eq!(dw(&qp, w), 0x8000_0000);
        assert_eq!(dw(&qp, w + 64), 0xffff_ffff);
    }
    // A 4-SGE send fills WQE 0 up to byte 80: its chunk at 64 holds data.
    let sg = [Sge {
        addr: 0x1000,
        length: 1,
        lkey: 1,
    }; 4];
    let big = SendWr {
        sg_list: &sg,
        ..Default::default()
    };
    qp.post_send(&b.ahs, &[big]).unwrap();
    assert_eq!(dw(&qp, qp.send_wqe_offset(0) + 4), 5);
    assert_eq!(dw(&qp, qp.send_wqe_offset(0) + 64), 1, "a byte count");
    // Post until the stamp index (ind + spare) wraps onto WQE 0 again.
    let small = SendWr::default();
    for ind in 1..=(cnt - spare) {
        qp.sq.tail = qp.sq.head; // the HCA completed everything
        qp.post_send(&b.ahs, &[small]).unwrap();
        if ind < cnt - spare {
            assert_eq!(dw(&qp, qp.send_wqe_offset(0) + 64), 1, "ind {ind}");
        }
    }
    assert_eq!(dw(&qp, qp.send_wqe_offset(0) + 64), 0xffff_ffff, "stamped");
    // Through the wrap: pass 1 WQEs carry the owner bit.
    while qp.sq.head < cnt + 2 {
        qp.sq.tail = qp.sq.head;
        qp.post_send(&b.ahs, &[small]).unwrap();
    }
    assert_eq!(dw(&qp, qp.send_wqe_offset(cnt - 1)), 0x0a, "pass 0");
    assert_eq!(dw(&qp, qp.send_wqe_offset(cnt)), 0x8000_000a, "pass 1");
    assert_eq!(dw(&qp, qp.send_wqe_offset(cnt + 1)), 0x8000_000a);
}

#[test]
fn receive_wqes_carry_the_terminator_and_ring_the_record() {
    let mut b = Bed::new();
    let mut qp = b.qp(QpType::Rc, rc_cap(1), true);
    let sg = [Sge {
        addr: 0xabc0,
        length: 296,
        lkey: 0x42,
    }];
    let wrs = [
        RecvWr {
            wr_id: 1,
            sg_list: &sg,
        },
        RecvWr {
            wr_id: 2,
            sg_list: &[sg[0], sg[0]],
        },
    ];
    qp.post_recv(&wrs).unwrap();
    let r = qp.recv_wqe_offset(0);
    assert_eq!(qp.rq.wqe_shift, 5);
    assert_eq!(dw(&qp, r), 296);
    assert_eq!(dw(&qp, r + 4), 0x42);
    assert_eq!(qp.buf.read_be64(r + 8), 0xabc0);
    assert_eq!(dw(&qp, r + 16), 0, "terminator byte count");
    assert_eq!(dw(&qp, r + 20), 0x100, "MLX4_INVALID_LKEY");
    assert_eq!(qp.buf.read_be64(r + 24), 0);
    let r = qp.recv_wqe_offset(1);
    assert_eq!(dw(&qp, r + 20), 0x42, "full WQE: no terminator");
    assert_eq!(qp.db.as_ref().unwrap().read(0), 2, "RQ record = head");
    // One request alone takes the straight-line path: same WQE.
    qp.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &sg,
    }])
    .unwrap();
    let r = qp.recv_wqe_offset(2);
    assert_eq!((dw(&qp, r), dw(&qp, r + 4)), (296, 0x42));
    assert_eq!(qp.buf.read_be64(r + 8), 0xabc0);
    assert_eq!((dw(&qp, r + 16), dw(&qp, r + 20)), (0, 0x100), "terminator");
    assert_eq!(qp.rq.wrid[2], 9);
    qp.post_recv(&[RecvWr {
        wr_id: 10,
        sg_list: &[],
    }])
    .unwrap();
    let r = qp.recv_wqe_offset(3);
    assert_eq!(
        (dw(&qp, r), dw(&qp, r + 4)),
        (0, 0x100),
        "no SGE: terminator first"
    );
    assert_eq!(qp.db.as_ref().unwrap().read(0), 4);
    let three = [sg[0]; 3];
    assert!(
        qp.post_recv(&[RecvWr {
            wr_id: 3,
            sg_list: &three
        }])
        .is_err()
    );
}

struct FixedHeader(Vec<u8>);

impl MlxHeader for FixedHeader {
    fn build(&mut self, qp: &MlxSendInfo, _wr: &SendWr<'_>, out: &mut [u8]) -> Result<MlxFields> {
        out[..self.0.len()].copy_from_slice(&self.0);
        Ok(MlxFields {
            len: self.0.len(),
            dlid: if qp.is_qp0 { 0xffff } else { 7 },
            sl: 2,
            eth: None,
        })
    }
}

#[test]
fn golden_mlx_segment_header_and_icrc() {
    let mut b = Bed::new();
    let ah = create_ib_ah(
        &b.caps,
        1,
        &AhAttr {
            dlid: 0xffff,
            port_num: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let ah = ib_core::verbs::Ah(b.ahs.insert(ah));
    let mut cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    let db = b.dbs.alloc(&b.pool, 0).unwrap();
    let mut qp0 = Mlx4IbQp::detached(
        QpType::Smi,
        0x40,
        &mut cap,
        true,
        HostMemory {
            caps: &b.caps,
            pool: &b.pool,
            uar: b.uar(),
            recv: HostRecv::Rq(db),
        },
    )
    .unwrap();
    qp0.sqp = Some(Sqp::default());
    let sg = [Sge {
        addr: 0x5000,
        length: 256,
        lkey: 3,
    }];
    let wr = SendWr {
        sg_list: &sg,
        wr: WrDetail::Ud {
            ah,
            remote_qpn: 0,
            remote_qkey: 0,
            pkey_index: 0,
            port_num: 0,
        },
        ..Default::default()
    };
    // LRH + BTH + DETH = 28 bytes: one inline segment.
    let mut h = FixedHeader((1..=28).collect());
    qp0.post_send_mlx(&b.ahs, &mut h, &[wr]).unwrap();
    let w = qp0.send_wqe_offset(0);
    assert_eq!(dw(&qp0, w), 0x0a, "SEND, owner 0");
    // MLX flags: CQ update (ALL_WR) | VL15 | SLR (permissive DLID) | SL 2.
    assert_eq!(dw(&qp0, w + 8), 0x0c | (1 << 17) | (1 << 16) | (2 << 8));
    assert_eq!(dw(&qp0, w + 12), 0xffff_0000, "RLID then reserved");
    assert_eq!(dw(&qp0, w + 16), 0x8000_0000 | 28);
    assert_eq!(qp0.buf.read_u8(w + 20), 1);
    // 4 + 28 = 32 bytes -> data seg at 48, then the ICRC segment.
    assert_eq!(dw(&qp0, w + 48), 256);
    assert_eq!(dw(&qp0, w + 64), 0x8000_0004);
    assert_eq!(dw(&qp0, w + 68), 0);
    assert_eq!(dw(&qp0, w + 4), 5, "16 + 32 + 16 + 16 = 80 bytes");
    assert_eq!(qp0.sqp.unwrap().send_psn, 1, "PSN advances");
    // With a GRH the header (68 bytes) takes two segments split at 64.
    let mut h = FixedHeader((1..=68).collect());
    qp0.post_send_mlx(&b.ahs, &mut h, &[wr]).unwrap();
    let w = qp0.send_wqe_offset(1);
    assert_eq!(dw(&qp0, w + 16), 0x8000_0000 | 44);
    assert_eq!(dw(&qp0, w + 64), 0x8000_0000 | 24);
    assert_eq!(qp0.buf.read_u8(w + 68), 45);
    // 16 + ALIGN(8 + 68, 16) = 96: data at 96, ICRC at 112.
    assert_eq!(dw(&qp0, w + 96), 256);
    assert_eq!(dw(&qp0, w + 112), 0x8000_0004);
    assert_eq!(dw(&qp0, w + 4), 8);
    // Ordinary posting is refused on a special QP.
    assert!(qp0.post_send(&b.ahs, &[wr]).is_err());
}

/// `enum ib_wr_opcode` (Linux 3.11 `include/rdma/ib_verbs.h`) and
/// `mlx4_ib_opcode[]` (`MLX4_OPCODE_*` of `include/linux/mlx4/qp.h`): the
/// values pinned, and a SEND with invalidate as the HCA sees it.
#[test]
fn golden_opcode_tables_and_send_with_invalidate() {
    use ib_core::verbs::WrOpcode as IbOp;
    let kernel = [
        (WrOpcode::RdmaWrite, 0, 0x08),
        (WrOpcode::RdmaWriteWithImm, 1, 0x09),
        (WrOpcode::Send, 2, 0x0a),
        (WrOpcode::SendWithImm, 3, 0x0b),
        (WrOpcode::RdmaRead, 4, 0x10),
        (WrOpcode::AtomicCmpAndSwp, 5, 0x11),
        (WrOpcode::AtomicFetchAndAdd, 6, 0x12),
        (WrOpcode::SendWithInv, 8, 0x01),
        (WrOpcode::MaskedAtomicCmpAndSwp, 12, 0x14),
        (WrOpcode::MaskedAtomicFetchAndAdd, 13, 0x15),
    ];
    for (op, ib, hw) in kernel {
        assert_eq!(op as u8, ib, "{op:?} in enum ib_wr_opcode");
        assert_eq!(HW_OPCODE[usize::from(ib)], hw, "mlx4_ib_opcode[{op:?}]");
    }
    assert_eq!(
        IbOp::SendWithInv as u8,
        8,
        "ib_core names the kernel's value"
    );
    // ib_core's request is the one the driver posts (no conversion).
    let w = ib_core::verbs::SendWr {
        opcode: IbOp::SendWithInv,
        imm_data: 0x1234,
        ..Default::default()
    };
    assert_eq!(w.opcode, WrOpcode::SendWithInv);
    let mut b = Bed::new();
    let mut qp = b.qp(QpType::Rc, rc_cap(1), false);
    let sg = [Sge {
        addr: 0x3000,
        length: 16,
        lkey: 3,
    }];
    let wr = SendWr {
        sg_list: &sg,
        imm_data: 0x00ab_cd01,
        ..w
    };
    qp.post_send(&b.ahs, &[wr]).unwrap();
    let w = qp.send_wqe_offset(0);
    assert_eq!(dw(&qp, w), 0x01, "MLX4_OPCODE_SEND_INVAL");
    assert_eq!(dw(&qp, w + 12), 0x00ab_cd01, "the rkey to invalidate");
    // Only RC and UC may send it.
    let mut ud = b.qp(QpType::Ud, rc_cap(1), false);
    assert!(ud.post_send(&b.ahs, &[wr]).is_err());
}

#[test]
fn straight_line_stamps_a_pass_after_a_wqe_past_64_bytes() {
    let mut b = Bed::new();
    let mut cap = rc_cap(1);
    cap.max_inline_data = 64;
    let db = b.dbs.alloc(&b.pool, 0).unwrap();
    let mut qp = Mlx4IbQp::detached(
        QpType::Rc,
        0x48,
        &mut cap,
        true,
        HostMemory {
            caps: &b.caps,
            pool: &b.pool,
            uar: b.uar(),
            recv: HostRecv::Rq(db),
        },
    )
    .unwrap();
    let (cnt, spare) = (qp.sq.wqe_cnt, qp.sq_spare_wqes);
    let sg = [Sge {
        addr: 0x1000,
        length: 8,
        lkey: 1,
    }];
    let small = SendWr {
        opcode: WrOpcode::RdmaWrite,
        sg_list: &sg,
        wr: WrDetail::Rdma {
            remote_addr: 0x2000,
            rkey: 2,
        },
        ..Default::default()
    };
    // Only 64-byte WQEs so far: nothing needs a stamp.
    qp.post_send(&b.ahs, &[small]).unwrap();
    assert_eq!(qp.stamp_until, 0);
    // A 64-byte inline SEND (straight line) fills WQE 1 past its first
    // chunk: the slot must be stamped when ind + spare comes back to it.
    let data = [7u8; 64];
    let big = SendWr {
        opcode: WrOpcode::Send,
        send_flags: SendFlags::INLINE,
        inline_data: &data,
        ..Default::default()
    };
    qp.post_send(&b.ahs, &[big]).unwrap();
    let w1 = qp.send_wqe_offset(1);
    assert_eq!(dw(&qp, w1 + 64), 0x8000_0000 | 20, "second inline segment");
    // The stamp index ind + spare reaches slot 1 again at ind = 1 + cnt -
    // spare.
    while qp.sq.head <= 1 + cnt - spare {
        qp.sq.tail = qp.sq.head; // the HCA completed everything
        qp.post_send(&b.ahs, &[small]).unwrap();
        if qp.sq.head <= 1 + cnt - spare {
            assert_eq!(dw(&qp, w1 + 64), 0x8000_0000 | 20, "ind {}", qp.sq.head);
        }
    }
    assert_eq!(
        dw(&qp, w1 + 64),
        0xffff_ffff,
        "stamped by the straight line"
    );
}

/// A UAR page that counts the stores to the send doorbell.
struct CountingUar {
    mem: MemBar,
    send_doorbells: core::sync::atomic::AtomicUsize,
}

impl hal::RegisterBackend for CountingUar {
    fn read32(&self, offset: usize) -> u32 {
        self.mem.read32(offset)
    }
    fn write32(&self, offset: usize, value: u32) {
        if offset == SEND_DOORBELL {
            self.send_doorbells
                .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        }
        self.mem.write32(offset, value);
    }
}

/// An RC QP over a UAR page that counts send doorbells.
fn counted_qp(b: &mut Bed, cap: QpCap) -> (Mlx4IbQp, Arc<CountingUar>) {
    let uar = Arc::new(CountingUar {
        mem: MemBar::new(4096),
        send_doorbells: core::sync::atomic::AtomicUsize::new(0),
    });
    let db = b.dbs.alloc(&b.pool, 0).unwrap();
    let mut cap = cap;
    let qp = Mlx4IbQp::detached(
        QpType::Rc,
        0x48,
        &mut cap,
        true,
        HostMemory {
            caps: &b.caps,
            pool: &b.pool,
            uar: Bar::from_backend(uar.clone(), 4096),
            recv: HostRecv::Rq(db),
        },
    )
    .unwrap();
    (qp, uar)
}

fn doorbells(u: &CountingUar) -> usize {
    u.send_doorbells.load(core::sync::atomic::Ordering::Relaxed)
}

/// Linux's `mlx4_ib_post_send` rings once for its whole list: 16 RDMA
/// WRITEs in one call are one store to the send doorbell, a list the
/// general builder takes part of too, and a list cut short by a bad
/// request (the ones before it posted, the doorbell rung for them).
#[test]
fn a_list_of_sends_rings_the_doorbell_once() {
    let mut b = Bed::new();
    let mut cap = rc_cap(2);
    cap.max_inline_data = 64;
    let (mut qp, uar) = counted_qp(&mut b, cap);
    let sg = [Sge {
        addr: 0x1000,
        length: 64,
        lkey: 1,
    }];
    let writes: Vec<SendWr> = (0..16)
        .map(|i| SendWr {
            wr_id: i,
            opcode: WrOpcode::RdmaWrite,
            send_flags: SendFlags::SIGNALED,
            sg_list: &sg,
            wr: WrDetail::Rdma {
                remote_addr: 0x10_0000 + 64 * i,
                rkey: 0x1234,
            },
            ..Default::default()
        })
        .collect();
    qp.post_send(&b.ahs, &writes).unwrap();
    assert_eq!(doorbells(&uar), 1, "16 requests, one doorbell");
    assert_eq!(qp.sq.head, 16);
    assert_eq!(qp.sq.wrid[..16], (0..16).collect::<Vec<u64>>()[..]);
    assert_eq!(
        uar.mem.bytes(SEND_DOORBELL, 4),
        (0x48u32 << 8).to_be_bytes(),
        "the QPN in the doorbell"
    );
    // One at a time: one doorbell each.
    qp.sq.tail = qp.sq.head;
    for w in &writes[..3] {
        qp.post_send(&b.ahs, core::slice::from_ref(w)).unwrap();
    }
    assert_eq!(doorbells(&uar), 4);
    // Straight-line and general requests mixed (two SGEs, an atomic, a
    // 64-byte inline SEND): still one doorbell.
    qp.sq.tail = qp.sq.head;
    let sg2 = [sg[0]; 2];
    let data = [5u8; 64];
    let mixed = [
        writes[0],
        SendWr {
            sg_list: &sg2,
            ..Default::default()
        },
        SendWr {
            opcode: WrOpcode::AtomicFetchAndAdd,
            sg_list: &sg,
            wr: WrDetail::Atomic {
                remote_addr: 0x2000,
                compare_add: 1,
                swap: 0,
                compare_add_mask: 0,
                swap_mask: 0,
                rkey: 2,
            },
            ..Default::default()
        },
        SendWr {
            send_flags: SendFlags::INLINE,
            inline_data: &data,
            ..Default::default()
        },
        writes[1],
    ];
    qp.post_send(&b.ahs, &mixed).unwrap();
    assert_eq!(doorbells(&uar), 5);
    assert_eq!(qp.sq.head, 16 + 3 + 5);
    // A bad request third in the list: two posted, one doorbell, bad_wr 2.
    let bad = SendWr {
        opcode: WrOpcode::RdmaWrite,
        ..Default::default()
    };
    let e = qp
        .post_send(&b.ahs, &[writes[2], writes[3], bad, writes[4]])
        .unwrap_err();
    assert_eq!(
        e,
        PostError {
            err: PostFault::FieldsMismatch,
            bad_wr: 2
        }
    );
    assert_eq!(doorbells(&uar), 6);
    assert_eq!(qp.sq.head, 16 + 3 + 5 + 2);
    // Bad first: nothing posted, no doorbell.
    qp.post_send(&b.ahs, &[bad, writes[4]]).unwrap_err();
    assert_eq!(doorbells(&uar), 6);
    assert_eq!(qp.sq.head, 16 + 3 + 5 + 2);
}

/// A list posted in one call leaves the send queue byte for byte as the
/// same requests posted one at a time (WQEs, owner bits, stamps), over
/// several passes of the ring.
#[test]
fn a_list_builds_the_wqes_of_single_posts() {
    let mut b = Bed::new();
    let mut cap = rc_cap(2);
    cap.max_inline_data = 64;
    let (mut one, _) = counted_qp(&mut b, cap);
    let (mut list, _) = counted_qp(&mut b, cap);
    let sg = [Sge {
        addr: 0x1000,
        length: 64,
        lkey: 1,
    }];
    let sg2 = [sg[0]; 2];
    let data = [9u8; 64];
    let kinds = |i: u64| match i % 5 {
        0 | 1 => SendWr {
            wr_id: i,
            opcode: WrOpcode::RdmaWrite,
            sg_list: &sg,
            wr: WrDetail::Rdma {
                remote_addr: 0x10_0000 + i,
                rkey: 7,
            },
            ..Default::default()
        },
        2 => SendWr {
            wr_id: i,
            send_flags: SendFlags::INLINE | SendFlags::SIGNALED,
            inline_data: &data[..(i as usize % 64) + 1],
            ..Default::default()
        },
        3 => SendWr {
            wr_id: i,
            sg_list: &sg2,
            ..Default::default()
        },
        _ => SendWr {
            wr_id: i,
            sg_list: &sg,
            ..Default::default()
        },
    };
    let len = one.buf.len();
    let mut i = 0u64;
    for batch in [16usize, 7, 30, 1, 64, 16, 50, 33, 16, 100, 16, 2] {
        let wrs: Vec<SendWr> = (i..i + batch as u64).map(kinds).collect();
        i += batch as u64;
        for w in &wrs {
            one.post_send(&b.ahs, core::slice::from_ref(w)).unwrap();
        }
        list.post_send(&b.ahs, &wrs).unwrap();
        assert_eq!(one.sq.head, list.sq.head);
        let mut x = alloc::vec![0u8; len];
        let mut y = alloc::vec![0u8; len];
        one.buf.read_bytes(0, &mut x);
        list.buf.read_bytes(0, &mut y);
        assert!(x == y, "send queues differ after {i} requests");
        assert_eq!(one.sq.wrid, list.sq.wrid);
        one.sq.tail = one.sq.head;
        list.sq.tail = list.sq.head;
    }
}

/// Where a handover in a recording went wrong, if it did. The WQE at `wqe`
/// of `buf`: the last store to its first dword (owner and opcode) comes
/// after every other store into the WQE, with a barrier ordering DMA
/// stores between the last of them and it. And Linux's rule for the HCA's
/// prefetch, that no 64-byte chunk looks valid before the contents written
/// ahead of it: in every other chunk the recording wrote into, the last
/// store to the chunk's first dword (a segment's byte count or header,
/// over the stamp) has such a barrier after the chunk's stores before it.
/// (Later stores into the same chunk are allowed there, as in Linux's MLX
/// path, whose data and ICRC segments follow the header's second segment.)
pub(crate) fn check_handover(
    log: &[hal::fake::record::Access],
    buf: &hal::DmaBuf,
    wqe: core::ops::Range<usize>,
    what: &str,
) -> core::result::Result<(), alloc::string::String> {
    let overlaps = |a: &core::ops::Range<usize>, b: &core::ops::Range<usize>| {
        a.start < b.end && b.start < a.end
    };
    for chunk in wqe.clone().step_by(64) {
        let c = chunk..(chunk + 64).min(wqe.end);
        let head = chunk..chunk + 4;
        let hits: Vec<(usize, core::ops::Range<usize>)> = log
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.in_buf(buf).filter(|r| overlaps(r, &c)).map(|r| (i, r)))
            .collect();
        if hits.is_empty() && chunk != wqe.start {
            continue;
        }
        let Some(&(at, _)) = hits.iter().rev().find(|(_, r)| overlaps(r, &head)) else {
            return Err(alloc::format!(
                "{what}: the chunk at {chunk} is written but its first dword is not"
            ));
        };
        if chunk == wqe.start {
            // Nothing anywhere in the WQE after the owner store.
            let later = log[at + 1..]
                .iter()
                .filter_map(|a| a.in_buf(buf))
                .find(|r| overlaps(r, &wqe));
            if let Some(r) = later {
                return Err(alloc::format!(
                    "{what}: store {r:?} after the owner store (access {at})"
                ));
            }
        }
        let before = if chunk == wqe.start {
            log[..at]
                .iter()
                .rposition(|a| a.in_buf(buf).is_some_and(|r| overlaps(&r, &wqe)))
        } else {
            hits.iter().rev().map(|(i, _)| *i).find(|i| *i < at)
        };
        if let Some(b) = before
            && !log[b + 1..at].iter().any(|a| a.is_dma_store_barrier())
        {
            return Err(alloc::format!(
                "{what}: no barrier between a store (access {b}) and the first dword of the chunk at {chunk} (access {at}): {:?}",
                &log[b..=at]
            ));
        }
    }
    Ok(())
}

/// Where a doorbell in a recording went wrong, if one did: each register
/// write has a barrier that orders memory before MMIO (`wmb`) after the
/// last store before it. Returns how many register writes there were.
pub(crate) fn check_doorbells(
    log: &[hal::fake::record::Access],
    what: &str,
) -> core::result::Result<usize, alloc::string::String> {
    use hal::fake::record::Access;
    let mut n = 0;
    for (i, a) in log.iter().enumerate() {
        if !matches!(a, Access::Mmio { .. }) {
            continue;
        }
        n += 1;
        if let Some(s) = log[..i]
            .iter()
            .rposition(|a| matches!(a, Access::Store { .. }))
            && !log[s + 1..i].iter().any(|a| a.is_mmio_barrier())
        {
            return Err(alloc::format!(
                "{what}: doorbell (access {i}) with no wmb after the store (access {s}): {:?}",
                &log[s..=i]
            ));
        }
    }
    Ok(n)
}

/// Posts `wrs` on `qp` while recording, and checks each WQE's handover and
/// the doorbell; the queue is then emptied as if every send completed.
fn post_checked(b: &Bed, qp: &mut Mlx4IbQp, wrs: &[SendWr<'_>], what: &str) {
    let head = qp.sq.head;
    let mut rec = hal::fake::record::Recording::start();
    qp.post_send(&b.ahs, wrs).unwrap();
    let log = rec.take();
    drop(rec);
    assert_eq!(qp.sq.head, head.wrapping_add(wrs.len() as u32), "{what}");
    let stride = 1usize << qp.sq.wqe_shift;
    for ind in head..qp.sq.head {
        let w = qp.send_wqe_offset(ind);
        check_handover(
            &log,
            &qp.buf,
            w..w + stride,
            &alloc::format!("{what}, WQE {ind}"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    let rung = check_doorbells(&log, what).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rung, 1, "{what}: one doorbell per post");
    qp.sq.tail = qp.sq.head;
}

/// A barrier separates every WQE's body from the store of its owner and
/// control words, and a `wmb` precedes every doorbell, on each path that
/// builds a WQE: the straight lines (one SGE, inline), the general
/// builder's staged copy (two and four SGEs, atomics) and its direct one
/// (five SGEs, long inline data), lists mixing them, the MLX path of a special QP, and
/// the receive queue's doorbell record, over several passes of each ring. The program order comes from hal's recording
/// fake; on x86 the stores would be in order without the barriers.
#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "hal's recorder exists in debug builds only"
)]
fn barriers_separate_wqes_from_their_owner_stores_and_precede_doorbells() {
    let mut b = Bed::new();
    let mut cap = rc_cap(5);
    cap.max_inline_data = 160;
    let mut qp = b.qp(QpType::Rc, cap, false);
    let sg = [Sge {
        addr: 0x1000,
        length: 64,
        lkey: 7,
    }; 5];
    let data = [0x5au8; 150];
    let write = SendWr {
        wr_id: 1,
        opcode: WrOpcode::RdmaWrite,
        sg_list: &sg[..1],
        wr: WrDetail::Rdma {
            remote_addr: 0x9000,
            rkey: 3,
        },
        ..Default::default()
    };
    let inline = SendWr {
        wr_id: 2,
        opcode: WrOpcode::Send,
        send_flags: SendFlags::INLINE | SendFlags::SIGNALED,
        inline_data: &data[..60],
        ..Default::default()
    };
    let long_inline = SendWr {
        inline_data: &data,
        ..inline
    };
    let two_sges = SendWr {
        wr_id: 3,
        opcode: WrOpcode::Send,
        sg_list: &sg[..2],
        ..Default::default()
    };
    let five_sges = SendWr {
        sg_list: &sg,
        ..two_sges
    };
    // 16 + 16 + 4 * 16 = 96 bytes: the staged copy's second chunk.
    let write_four = SendWr {
        sg_list: &sg[..4],
        ..write
    };
    let atomic = SendWr {
        wr_id: 4,
        opcode: WrOpcode::AtomicFetchAndAdd,
        sg_list: &sg[..1],
        wr: WrDetail::Atomic {
            remote_addr: 0x9000,
            compare_add: 1,
            swap: 0,
            compare_add_mask: 0,
            swap_mask: 0,
            rkey: 3,
        },
        ..Default::default()
    };
    // Three passes over the ring, so every slot is built more than once
    // and the owner bit flips.
    let rounds = 3 * qp.sq.wqe_cnt as usize / 16 + 1;
    for round in 0..rounds {
        post_checked(
            &b,
            &mut qp,
            &[write],
            &alloc::format!("WRITE, round {round}"),
        );
        post_checked(
            &b,
            &mut qp,
            &[inline],
            &alloc::format!("inline SEND, round {round}"),
        );
        post_checked(
            &b,
            &mut qp,
            &[two_sges],
            &alloc::format!("two SGEs, round {round}"),
        );
        post_checked(
            &b,
            &mut qp,
            &[write, two_sges, inline, atomic, write],
            &alloc::format!("list, round {round}"),
        );
        post_checked(
            &b,
            &mut qp,
            &[atomic],
            &alloc::format!("atomic, round {round}"),
        );
        post_checked(
            &b,
            &mut qp,
            &[five_sges],
            &alloc::format!("five SGEs, round {round}"),
        );
        post_checked(
            &b,
            &mut qp,
            &[write_four],
            &alloc::format!("WRITE, 4 SGEs, round {round}"),
        );
        post_checked(
            &b,
            &mut qp,
            &[long_inline, five_sges, write],
            &alloc::format!("long list, round {round}"),
        );
    }

    // The MLX path (QP0), with a header in two inline segments.
    let ah = create_ib_ah(
        &b.caps,
        1,
        &AhAttr {
            dlid: 0xffff,
            port_num: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let ah = ib_core::verbs::Ah(b.ahs.insert(ah));
    let mut cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    let db = b.dbs.alloc(&b.pool, 0).unwrap();
    let mut qp0 = Mlx4IbQp::detached(
        QpType::Smi,
        0x40,
        &mut cap,
        true,
        HostMemory {
            caps: &b.caps,
            pool: &b.pool,
            uar: b.uar(),
            recv: HostRecv::Rq(db),
        },
    )
    .unwrap();
    qp0.sqp = Some(Sqp::default());
    let mad = [Sge {
        addr: 0x5000,
        length: 256,
        lkey: 3,
    }];
    let wr = SendWr {
        sg_list: &mad,
        wr: WrDetail::Ud {
            ah,
            remote_qpn: 0,
            remote_qkey: 0,
            pkey_index: 0,
            port_num: 0,
        },
        ..Default::default()
    };
    for (i, len) in [28u8, 68, 28].into_iter().cycle().take(40).enumerate() {
        let head = qp0.sq.head;
        let mut h = FixedHeader((1..=len).collect());
        let mut rec = hal::fake::record::Recording::start();
        qp0.post_send_mlx(&b.ahs, &mut h, &[wr]).unwrap();
        let log = rec.take();
        drop(rec);
        let w = qp0.send_wqe_offset(head);
        let what = alloc::format!("MLX send {i}");
        check_handover(&log, &qp0.buf, w..w + (1 << qp0.sq.wqe_shift), &what)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(check_doorbells(&log, &what), Ok(1));
        qp0.sq.tail = qp0.sq.head;
    }

    // Receives: the WQEs, a barrier, then the doorbell record.
    let (dbuf, rec_at) = qp.db.as_ref().unwrap().place(0);
    for (i, n) in [1usize, 3, 1, 5].into_iter().cycle().take(12).enumerate() {
        let wrs: Vec<RecvWr<'_>> = (0..n)
            .map(|k| RecvWr {
                wr_id: k as u64,
                sg_list: &sg[..1],
            })
            .collect();
        let mut rec = hal::fake::record::Recording::start();
        qp.post_recv(&wrs).unwrap();
        let log = rec.take();
        drop(rec);
        let what = alloc::format!("receive post {i} of {n}");
        let at = log
            .iter()
            .rposition(|a| a.in_buf(&dbuf).is_some_and(|r| r == rec_at))
            .unwrap_or_else(|| panic!("{what}: no doorbell record store"));
        let last_wqe = log[..at]
            .iter()
            .rposition(|a| a.in_buf(&qp.buf).is_some())
            .unwrap_or_else(|| panic!("{what}: no WQE store"));
        assert!(
            log[last_wqe + 1..at]
                .iter()
                .any(|a| a.is_dma_store_barrier()),
            "{what}: no barrier between the WQEs and the doorbell record: {:?}",
            &log[last_wqe..=at]
        );
        assert!(
            !log[at + 1..].iter().any(|a| a.in_buf(&qp.buf).is_some()),
            "{what}: a WQE store after the doorbell record"
        );
        qp.rq.tail = qp.rq.head;
    }
}
