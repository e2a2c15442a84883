//! A connection to the fourth LID of a port under LMC 2, on the wire.
//!
//! Two model HCAs back to back with the real stack on each (mlx4_core +
//! mlx4_ib + ib_core with its CM). B's port has LMC 2 (LIDs 4 to 7); A connects
//! through the CM to LID 7, and both sides move RC traffic. The fabric's capture
//! shows the SLID of every packet: B answers from the LID it was called on (7),
//! as Linux's CM sets it up (the path reversed from the REQ), never from its
//! base LID. A ConnectX-3 drops an RC packet whose SLID is not the QP's remote
//! LID; the model does not check that yet, so the capture is the witness here.
//! The ports are brought up by hand (no SM on this wire).

use tests::mlx4_common;

use ib_core::cm::{self, CmEvent, CmId, CmRepParam, CmReqParam};
use ib_core::sa_query::PathRecord;
use ib_core::verbs::{
    AccessFlags, Cq, CqInitAttr, Mr, MrPages, Pd, Qp, QpCap, QpCreateFlags, QpInitAttr, QpType,
    RecvWr, SendFlags, SendWr, Sge, SigType, WcStatus, WrDetail, WrOpcode,
};
use ib_core::{ClientId, DeviceId, IbCore};
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;
use sim::fabric::capture::Capture;
use sim::{SimConfig, SimHca, Wire};

const A_LID: u16 = 1;
/// B's base LID; with LMC 2 its port answers to 4..=7.
const B_BASE: u16 = 4;
const B_CALLED: u16 = B_BASE + 3;
const SID: u64 = 0x0000_0000_0001_0c3e;

struct Node {
    hca: Model,
    core: IbCore,
    dev: DeviceId,
    cm: ClientId,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    buf: hal::DmaBuf,
}

fn node(hca: Model) -> Node {
    let d = bring_up(&hca, Profile::default()).expect("mlx4_core");
    let ib = Mlx4IbDev::add(d, "mlx4_0").expect("mlx4_ib_add");
    let mut core = IbCore::new(hca.clock());
    let dev = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    let cm = cm::init(&mut core);
    let d = core.device_mut(dev).unwrap();
    let pd = d.alloc_pd().unwrap();
    let (cq, _) = d
        .create_cq(&CqInitAttr {
            cqe: 16,
            comp_vector: 0,
        })
        .unwrap();
    let (qp, _) = d
        .create_qp(
            pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 8,
                    max_recv_wr: 8,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_type: SigType::AllWr,
                qp_type: QpType::Rc,
                create_flags: QpCreateFlags::empty(),
                port_num: 1,
            },
        )
        .unwrap();
    let buf = d.provider().dma_pool().alloc_pages(1).unwrap();
    let base = buf.bus_addr().0;
    let mr = d
        .reg_mr(
            pd,
            &MrPages {
                pages: &[base],
                page_shift: 12,
                iova: base,
                length: 4096,
                access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            },
        )
        .unwrap();
    Node {
        hca,
        core,
        dev,
        cm,
        pd,
        cq,
        qp,
        mr,
        buf,
    }
}

struct Net {
    a: Node,
    b: Node,
    wire: Wire,
}

impl Net {
    fn round(&mut self) {
        self.a.core.poll();
        self.b.core.poll();
        self.wire.settle();
        self.a.hca.clock().relax();
    }

    /// Pumps until `f` gives a value (at most `limit` of model time).
    fn until<T>(&mut self, what: &str, mut f: impl FnMut(&mut Net) -> Option<T>) -> T {
        let end = self.a.hca.clock().now_ns() + 5_000_000_000;
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            assert!(
                self.a.hca.clock().now_ns() < end,
                "{what}: not within 5 s of model time"
            );
            self.round();
        }
    }

    fn event(&mut self, on_a: bool, id: CmId, what: &str) -> CmEvent {
        self.until(what, |n| {
            let x = if on_a { &mut n.a } else { &mut n.b };
            cm::get_event(&mut x.core, x.cm, id)
        })
    }

    fn completion(&mut self, on_a: bool, what: &str) -> WcStatus {
        self.until(what, |n| {
            let x = if on_a { &mut n.a } else { &mut n.b };
            let mut wc = [ib_core::verbs::Wc::default(); 1];
            let got = x.core.device_mut(x.dev)?.poll_cq(x.cq, &mut wc).ok()?;
            (got == 1).then_some(wc[0].status)
        })
    }
}

/// (SLID, DLID, BTH opcode, destination QP) of every packet in a classic
/// pcap capture of ERF InfiniBand records.
fn captured(path: &std::path::Path) -> Vec<(u16, u16, u8, u32)> {
    let f = std::fs::read(path).expect("the capture");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= f.len() {
        let len = u32::from_le_bytes(f[at + 8..at + 12].try_into().unwrap()) as usize;
        let rec = &f[at + 16..(at + 16 + len).min(f.len())];
        at += 16 + len;
        // ERF header (16 bytes), then LRH and BTH.
        let Some(p) = rec.get(16..16 + 20) else {
            continue;
        };
        let dlid = u16::from_be_bytes([p[2], p[3]]);
        let slid = u16::from_be_bytes([p[6], p[7]]);
        let dqp = u32::from_be_bytes([0, p[13], p[14], p[15]]);
        out.push((slid, dlid, p[8], dqp));
    }
    out
}

#[test]
fn the_passive_side_sends_from_the_lid_it_was_called_on() {
    let cfg = |guid: u64| SimConfig {
        node_guid: guid,
        ..SimConfig::default()
    };
    let (x, y, wire) = SimHca::back_to_back(cfg(0x0002_c903_00cc_0000), cfg(0x0002_c903_00dd_0000));
    let pcap = std::env::temp_dir().join(format!("mlx4_cm_lmc-{}.pcap", std::process::id()));
    wire.fabric()
        .lock()
        .unwrap()
        .set_capture(Some(Capture::create(&pcap).expect("capture file")));
    let a = node(Model::wrap(x, "LMC back to back"));
    let b = node(Model::wrap(y, "LMC back to back"));
    assert!(tests::sm::sm_activate(&a.hca, 1, A_LID, A_LID));
    assert!(
        tests::sm::sm_port_info(&b.hca, 1, |d| {
            d[16..18].copy_from_slice(&B_BASE.to_be_bytes());
            d[18..20].copy_from_slice(&A_LID.to_be_bytes());
            d[34] = (d[34] & !7) | 2;
        }) && tests::sm::sm_set_state(&b.hca, 1, 3)
            && tests::sm::sm_set_state(&b.hca, 1, 4),
        "B's port at LID 4, LMC 2"
    );
    let mut n = Net { a, b, wire };
    let b_gid = n.until("B's port cache with LMC 2", |n| {
        let d = n.b.core.device(n.b.dev)?;
        let c = d.port_cache(1).ok()?;
        (c.lmc == 2 && c.lid == B_BASE).then(|| c.get_gid(0).ok())?
    });
    let a_gid = n.until("A's port cache", |n| {
        let c = n.a.core.device(n.a.dev)?.port_cache(1).ok()?;
        (c.lid == A_LID).then(|| c.get_gid(0).ok())?
    });

    // A calls B's fourth LID.
    let listen = cm::listen(&mut n.b.core, n.b.cm, n.b.dev, SID).unwrap();
    let path = PathRecord {
        sgid: a_gid,
        dgid: b_gid,
        slid: A_LID,
        dlid: B_CALLED,
        pkey: 0xffff,
        mtu: 4,
        rate: 2,
        packet_life_time: 14,
        reversible: true,
        numb_path: 1,
        ..PathRecord::default()
    };
    let id_a = cm::send_req(
        &mut n.a.core,
        n.a.cm,
        n.a.dev,
        1,
        &CmReqParam::new(path, SID, n.a.qp),
    )
    .unwrap();
    let id_b = match n.event(false, listen, "B's REQ") {
        CmEvent::ReqReceived { id, .. } => id,
        e => panic!("expected a REQ: {e:?}"),
    };
    cm::send_rep(&mut n.b.core, n.b.cm, id_b, &CmRepParam::new(n.b.qp)).unwrap();
    assert!(matches!(
        n.event(true, id_a, "A established"),
        CmEvent::Established { .. }
    ));
    assert!(matches!(
        n.event(false, id_b, "B established"),
        CmEvent::Established { .. }
    ));

    // RC traffic both ways: a SEND from B, an RDMA WRITE from A (B ACKs it).
    let recv_sge = [Sge {
        addr: n.a.buf.bus_addr().0,
        length: 256,
        lkey: n.a.mr.lkey,
    }];
    n.a.core
        .device_mut(n.a.dev)
        .unwrap()
        .post_recv(
            n.a.qp,
            &[RecvWr {
                wr_id: 1,
                sg_list: &recv_sge,
            }],
        )
        .unwrap();
    let send_sge = [Sge {
        addr: n.b.buf.bus_addr().0,
        length: 64,
        lkey: n.b.mr.lkey,
    }];
    n.b.core
        .device_mut(n.b.dev)
        .unwrap()
        .post_send(
            n.b.qp,
            &[SendWr {
                wr_id: 2,
                opcode: WrOpcode::Send,
                send_flags: SendFlags::SIGNALED,
                sg_list: &send_sge,
                ..Default::default()
            }],
        )
        .unwrap();
    assert_eq!(n.completion(false, "B's SEND"), WcStatus::Success);
    assert_eq!(n.completion(true, "A's receive"), WcStatus::Success);
    let write_sge = [Sge {
        addr: n.a.buf.bus_addr().0 + 1024,
        length: 128,
        lkey: n.a.mr.lkey,
    }];
    let (b_addr, b_rkey) = (n.b.buf.bus_addr().0 + 2048, n.b.mr.rkey);
    n.a.core
        .device_mut(n.a.dev)
        .unwrap()
        .post_send(
            n.a.qp,
            &[SendWr {
                wr_id: 3,
                opcode: WrOpcode::RdmaWrite,
                send_flags: SendFlags::SIGNALED,
                sg_list: &write_sge,
                wr: WrDetail::Rdma {
                    remote_addr: b_addr,
                    rkey: b_rkey,
                },
                ..Default::default()
            }],
        )
        .unwrap();
    assert_eq!(n.completion(true, "A's WRITE"), WcStatus::Success);

    n.wire
        .fabric()
        .lock()
        .unwrap()
        .capture_mut()
        .expect("capturing")
        .flush()
        .expect("capture written");
    let pkts = captured(&pcap);
    let _ = std::fs::remove_file(&pcap);
    // RC opcodes are 0x00..=0x1f; B's packets are those to A's LID.
    let from_b: Vec<_> = pkts.iter().filter(|p| p.1 == A_LID && p.2 < 0x20).collect();
    let to_b: Vec<_> = pkts.iter().filter(|p| p.0 == A_LID && p.2 < 0x20).collect();
    assert!(
        from_b.len() >= 2 && !to_b.is_empty(),
        "RC both ways (B's SEND and its ACK of A's WRITE): {pkts:x?}"
    );
    assert!(
        from_b.iter().all(|p| p.0 == B_CALLED),
        "B answers from the LID it was called on, {B_CALLED}, not its base LID: {from_b:x?}"
    );
    assert!(
        to_b.iter().all(|p| p.1 == B_CALLED),
        "and everything A sends (its ACKs too) goes to that LID: {to_b:x?}"
    );

    for (x, id) in [(&mut n.a, id_a), (&mut n.b, id_b)] {
        let _ = cm::send_dreq(&mut x.core, x.cm, id, &[]);
    }
    n.until("disconnected", |n| {
        let d = [(true, id_a), (false, id_b)].iter().all(|&(on_a, id)| {
            let x = if on_a { &mut n.a } else { &mut n.b };
            !matches!(
                cm::state(&mut x.core, x.cm, id),
                Some(cm::CmState::Established | cm::CmState::DreqSent)
            )
        });
        d.then_some(())
    });
    for mut x in [n.a, n.b] {
        let _ = cm::destroy_id(&mut x.core, x.cm, listen);
        let d = x.core.device_mut(x.dev).unwrap();
        d.destroy_qp(x.qp).unwrap();
        d.destroy_cq(x.cq).unwrap();
        d.dereg_mr(x.mr).unwrap();
        d.dealloc_pd(x.pd).unwrap();
        drop(x.buf);
        let mut p = x.core.unregister_device(x.dev).expect("unregistered");
        let ib = p
            .as_any_mut()
            .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
            .expect("mlx4_ib");
        ib.remove();
        drop(p);
        x.hca.finish();
    }
}
