//! mlx4_ib's `poll_cq` over CQEs the device writes: any bytes in any CQE slot (ownership, opcode, syndrome, QPN, WQE counter), for an RC and a UD QP with sends and receives outstanding and a UD QP receiving through an SRQ, polled into arrays of any size, interleaved with posts, `clean` and re-arming.
//!
//! The CQ and QPs sit in host memory as in the fast-path example (no HCA
//! behind them); the fuzzer stands for the HCA. Checks: `poll` fills no
//! more completions than asked, a completion names a WR that was
//! posted on a QP of the CQ, and an SRQ WR completes at most once.

#![no_main]

use std::sync::Arc;

use arbitrary::Arbitrary;
use hal::fake::{ArenaDma, MemBar};
use hal::{Bar, DmaPool};
use libfuzzer_sys::fuzz_target;
use mlx4_core::Caps;
use mlx4_hw::cqe;
use mlx4_ib::ah::{Mlx4IbAh, create_ib_ah};
use mlx4_ib::cq::Mlx4IbCq;
use mlx4_ib::doorbell::DbPool;
use mlx4_ib::qp::{HostMemory, HostRecv, Mlx4IbQp};
use mlx4_ib::srq::Mlx4IbSrq;
use mlx4_ib::verbs::{
    AhAttr, QpCap, QpType, RecvWr, SendFlags, SendWr, Sge, Wc, WrDetail, WrOpcode,
};
use mlx4_ib::{QpId, QpTable, Slab, SrqId};

const RC_QPN: u32 = 0x48;
const UD_QPN: u32 = 0x49;
/// A UD QP receiving through the SRQ.
const SRQ_QPN: u32 = 0x4a;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Owner {
    /// The owner bit of the pass the slot is in (software-owned).
    Right,
    /// The other one (still hardware-owned).
    Wrong,
    /// As the bytes say.
    Raw,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Pick {
    Rc,
    Ud,
    /// The QP on the SRQ (its receives are the SRQ's).
    OnSrq,
}

impl Pick {
    fn qpn(self) -> u32 {
        match self {
            Pick::Rc => RC_QPN,
            Pick::Ud => UD_QPN,
            Pick::OnSrq => SRQ_QPN,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum QpnPick {
    Qp(Pick),
    Raw(u32),
}

#[derive(Arbitrary, Debug)]
enum Step {
    /// The device writes CQE slot `slot`: the bytes, with the QPN, the
    /// WQE counter and the owner bit as picked.
    Write {
        slot: u8,
        bytes: [u8; 32],
        qpn: QpnPick,
        wqe: Option<u16>,
        owner: Owner,
        /// Which pass the owner bit is for (0 = the one being consumed).
        pass: u8,
    },
    /// The device writes the next CQE the consumer will read.
    Next {
        bytes: [u8; 32],
        send: bool,
        qp: Pick,
        wqe: u16,
    },
    Poll(u8),
    PostSend {
        rc: bool,
        n: u8,
        signalled: u8,
        inline: bool,
    },
    PostRecv {
        qp: Pick,
        n: u8,
    },
    Clean {
        qp: Pick,
    },
    Arm(bool, u32),
}

#[derive(Arbitrary, Debug)]
struct Input {
    log_nent: u8,
    sig_all: bool,
    steps: Vec<Step>,
}

struct Rig {
    cq: Mlx4IbCq,
    qps: QpTable,
    srqs: Slab<Mlx4IbSrq>,
    ahs: Slab<Mlx4IbAh>,
    ah: u32,
    rc: QpId,
    ud: QpId,
    srq: u32,
    nent: u32,
    produced: u32,
    next_wr: u64,
}

fn rig(nent: u32, sig_all: bool) -> Rig {
    let pool = DmaPool::new(Arc::new(ArenaDma::new(128 << 10)));
    let uar = Bar::from_backend(Arc::new(MemBar::new(4096)), 4096);
    let mut dbs = DbPool::default();
    let caps = Caps {
        num_ports: 1,
        max_wqes: 16384,
        max_sq_sg: 32,
        max_rq_sg: 32,
        max_sq_desc_sz: 1008,
        ..Default::default()
    };
    let mk = |t, qpn, recv: HostRecv| {
        let rq = if matches!(recv, HostRecv::Rq(_)) {
            8
        } else {
            0
        };
        let mut cap = QpCap {
            max_send_wr: 8,
            max_recv_wr: rq,
            max_send_sge: 2,
            max_recv_sge: rq.min(2),
            max_inline_data: 64,
        };
        Mlx4IbQp::detached(
            t,
            qpn,
            &mut cap,
            sig_all,
            HostMemory {
                caps: &caps,
                pool: &pool,
                uar: uar.slice(0, 4096).expect("uar"),
                recv,
            },
        )
        .expect("QP")
    };
    let mut rq_db = || HostRecv::Rq(dbs.alloc(&pool, 0).expect("doorbell record"));
    let rc = mk(QpType::Rc, RC_QPN, rq_db());
    let ud = mk(QpType::Ud, UD_QPN, rq_db());
    // Eight WQEs of two scatter entries (64 bytes with the next segment).
    let sdb = dbs.alloc(&pool, 0).expect("SRQ doorbell record");
    let mut srqs = Slab::default();
    let srq = srqs.insert(Mlx4IbSrq::detached(&pool, 8, 2, 6, sdb).expect("SRQ"));
    let on_srq = mk(QpType::Ud, SRQ_QPN, HostRecv::Srq(SrqId::from_index(srq)));
    let cdb = dbs.alloc(&pool, 1).expect("CQ doorbell records");
    let cq = Mlx4IbCq::detached(nent, &pool, uar, cdb, 0x81).expect("CQ");
    let mut qps = QpTable::default();
    let rc = qps.insert(rc);
    let ud = qps.insert(ud);
    qps.insert(on_srq);
    let mut ahs = Slab::default();
    let ah = ahs.insert(
        create_ib_ah(
            &caps,
            1,
            &AhAttr {
                dlid: 3,
                port_num: 1,
                ..Default::default()
            },
        )
        .expect("AH"),
    );
    Rig {
        cq,
        qps,
        srqs,
        ahs,
        ah,
        rc,
        ud,
        srq,
        nent,
        produced: 0,
        next_wr: 1,
    }
}

impl Rig {
    fn write(&mut self, n: u32, mut b: [u8; 32], owner: Owner) {
        let bit = if n & self.nent != 0 {
            cqe::OWNER_MASK
        } else {
            0
        };
        let o = &mut b[cqe::OWNER_SR_OPCODE];
        match owner {
            Owner::Right => *o = (*o & !cqe::OWNER_MASK) | bit,
            Owner::Wrong => *o = (*o & !cqe::OWNER_MASK) | (bit ^ cqe::OWNER_MASK),
            Owner::Raw => {}
        }
        let off = ((n & (self.nent - 1)) as usize) * cqe::SIZE;
        self.cq.buf().write_bytes(off, &b);
    }
}

fuzz_target!(|input: Input| {
    let nent = 1u32 << (1 + input.log_nent % 6);
    let mut r = rig(nent, input.sig_all);
    let sg = [
        Sge {
            addr: 0x20_0000,
            length: 64,
            lkey: 0x100,
        },
        Sge {
            addr: 0x30_0000,
            length: 8,
            lkey: 0x100,
        },
    ];
    let data = [0x5au8; 64];
    let mut posted = std::collections::HashSet::new();
    // The SRQ's WRs posted, and those completed.
    let mut on_srq = std::collections::HashSet::new();
    let mut srq_done = std::collections::HashSet::new();
    let mut wc = [Wc::default(); 64];
    for step in input.steps.iter().take(256) {
        match step {
            Step::Write {
                slot,
                bytes,
                qpn,
                wqe,
                owner,
                pass,
            } => {
                let mut b = *bytes;
                let q = match qpn {
                    QpnPick::Qp(p) => p.qpn(),
                    QpnPick::Raw(v) => *v,
                };
                b[cqe::VLAN_MY_QPN..cqe::VLAN_MY_QPN + 4].copy_from_slice(&q.to_be_bytes());
                if let Some(w) = wqe {
                    b[cqe::WQE_INDEX..cqe::WQE_INDEX + 2].copy_from_slice(&w.to_be_bytes());
                }
                let base = r.cq.cons_index().wrapping_add(u32::from(*pass) * r.nent);
                let n = (base & !(r.nent - 1)) | (u32::from(*slot) & (r.nent - 1));
                r.write(n, b, *owner);
            }
            Step::Next {
                bytes,
                send,
                qp,
                wqe,
            } => {
                let mut b = *bytes;
                let q = qp.qpn();
                b[cqe::VLAN_MY_QPN..cqe::VLAN_MY_QPN + 4].copy_from_slice(&q.to_be_bytes());
                b[cqe::WQE_INDEX..cqe::WQE_INDEX + 2].copy_from_slice(&wqe.to_be_bytes());
                let o = &mut b[cqe::OWNER_SR_OPCODE];
                *o = if *send {
                    *o | cqe::IS_SEND_MASK
                } else {
                    *o & !cqe::IS_SEND_MASK
                };
                let n = r.cq.cons_index().wrapping_add(r.produced % r.nent);
                r.produced = r.produced.wrapping_add(1);
                r.write(n, b, Owner::Right);
            }
            Step::Poll(k) => {
                let k = usize::from(*k) % wc.len() + 1;
                let before = r.cq.cons_index();
                if let Ok(got) = r.cq.poll(&mut r.qps, &mut r.srqs, &mut wc[..k]) {
                    assert!(got <= k, "{got} completions for {k} slots");
                    for w in &wc[..got] {
                        assert!(
                            posted.contains(&w.wr_id),
                            "a completion for WR {:#x}, never posted: {w:?}",
                            w.wr_id
                        );
                        // An SRQ WR completes once (its WQE goes back on
                        // the free list, and a later one reuses the slot).
                        if on_srq.contains(&w.wr_id) {
                            assert!(
                                srq_done.insert(w.wr_id),
                                "SRQ WR {:#x} completed twice: {w:?}",
                                w.wr_id
                            );
                        }
                    }
                }
                let used = r.cq.cons_index().wrapping_sub(before);
                r.produced = r.produced.saturating_sub(used);
            }
            Step::PostSend {
                rc,
                n,
                signalled,
                inline,
            } => {
                let id = if *rc { r.rc } else { r.ud };
                for i in 0..(n % 9) {
                    let wr_id = r.next_wr;
                    r.next_wr += 1;
                    let mut flags = if (signalled >> (i % 8)) & 1 != 0 {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::empty()
                    };
                    if *inline {
                        flags |= SendFlags::INLINE;
                    }
                    let wr = SendWr {
                        wr_id,
                        opcode: if *rc {
                            WrOpcode::RdmaWrite
                        } else {
                            WrOpcode::Send
                        },
                        send_flags: flags,
                        sg_list: if *inline {
                            &[]
                        } else {
                            &sg[..1 + usize::from(i & 1)]
                        },
                        inline_data: if *inline { &data } else { &[] },
                        imm_data: 0,
                        wr: if *rc {
                            WrDetail::Rdma {
                                remote_addr: 0x10_0000,
                                rkey: 0x1234,
                            }
                        } else {
                            WrDetail::Ud {
                                ah: ib_core::verbs::Ah(r.ah),
                                remote_qpn: 2,
                                remote_qkey: 3,
                                pkey_index: 0,
                                port_num: 0,
                            }
                        },
                    };
                    let qp = r.qps.get_mut(id).expect("qp");
                    if qp.post_send(&r.ahs, &[wr]).is_ok() {
                        posted.insert(wr_id);
                    }
                }
            }
            Step::PostRecv { qp, n } => {
                for _ in 0..(n % 9) {
                    let wr_id = r.next_wr;
                    r.next_wr += 1;
                    let wr = [RecvWr {
                        wr_id,
                        sg_list: &sg,
                    }];
                    let ok = match qp {
                        Pick::Rc => r.qps.get_mut(r.rc).expect("qp").post_recv(&wr),
                        Pick::Ud => r.qps.get_mut(r.ud).expect("qp").post_recv(&wr),
                        Pick::OnSrq => r.srqs.get_mut(r.srq).expect("srq").post_recv(&wr),
                    }
                    .is_ok();
                    if ok {
                        posted.insert(wr_id);
                        if let Pick::OnSrq = qp {
                            on_srq.insert(wr_id);
                        }
                    }
                }
            }
            Step::Clean { qp } => {
                let srq = match qp {
                    Pick::OnSrq => r.srqs.get_mut(r.srq),
                    _ => None,
                };
                r.cq.clean(qp.qpn(), srq);
            }
            Step::Arm(solicited, sn) => r.cq.req_notify(*solicited, *sn),
        }
    }
});
