//! Multicast datagrams between two driver-run HCAs on the model.
//!
//! Two model HCAs with the real stack (mlx4_core + mlx4_ib + ib_core), their QPs
//! attached to a group through ib_core's `attach_mcast` (mlx4_ib over
//! mlx4_core's MGID_HASH/READ_MCG/WRITE_MCG): a datagram to the group's MLID
//! and MGID reaches every attached QP of the peer's port and, by the card's
//! loopback, of the sender's port, not the sender itself when its QP blocks
//! multicast loopback, not a QP that is not attached, and not one with another
//! Q_Key; an MCG entry holds what its size allows. Back to back (no switch),
//! and through the switch once it honours the SM's MulticastForwardingTable.
//! The ports are brought up by hand (no SM on these wires).

use tests::mlx4_common;

use std::sync::{Arc, Mutex};

use ib_core::mad::{Mad, MadEvent, MadSendBuf};
use ib_core::verbs::{
    AccessFlags, Ah, AhAttr, Cq, CqInitAttr, Gid, GlobalRoute, Mr, MrPages, Pd, Qp, QpAttr,
    QpAttrMask as M, QpCap, QpCreateFlags, QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendWr,
    Sge, SigType, Wc, WcFlags, WcStatus, WrDetail, WrOpcode,
};
use ib_core::{DeviceId, IbCore};
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;
use sim::{SimConfig, SimHca, Wire};

const A_LID: u16 = 1;
const B_LID: u16 = 2;
const MLID: u16 = 0xc001;
const QKEY: u32 = 0x0b1b;
/// The QPN of every multicast datagram.
const MCAST_QPN: u32 = 0xff_ffff;

fn mgid() -> Gid {
    let mut g = [0u8; 16];
    g[..6].copy_from_slice(&[0xff, 0x12, 0x40, 0x1b, 0xff, 0xff]);
    g[12..].copy_from_slice(&[0xff; 4]);
    Gid(g)
}

struct Node {
    hca: Model,
    core: IbCore,
    dev: DeviceId,
    pd: Pd,
    mr: Mr,
    buf: hal::DmaBuf,
    /// Receive slots handed out so far (256 bytes each).
    slots: u64,
}

fn node(hca: Model, profile: Profile) -> Node {
    let d = bring_up(&hca, profile).expect("mlx4_core");
    let ib = Mlx4IbDev::add(d, "mlx4_0").expect("mlx4_ib_add");
    let mut core = IbCore::new(hca.clock());
    let dev = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    let d = core.device_mut(dev).unwrap();
    let pd = d.alloc_pd().unwrap();
    let buf = d.provider().dma_pool().alloc_pages(4).unwrap();
    let base = buf.bus_addr().0;
    let mr = d
        .reg_mr(
            pd,
            &MrPages {
                pages: &[base, base + 4096, base + 8192, base + 12288],
                page_shift: 12,
                iova: base,
                length: 4 * 4096,
                access: AccessFlags::LOCAL_WRITE,
            },
        )
        .unwrap();
    Node {
        hca,
        core,
        dev,
        pd,
        mr,
        buf,
        slots: 0,
    }
}

/// A UD QP of a node, in RTS, with its own CQ and receives posted.
struct Ud {
    qp: Qp,
    cq: Cq,
    /// Bus address of each receive slot, by wr_id.
    slots: Vec<u64>,
}

impl Node {
    fn ud(&mut self, qkey: u32, flags: QpCreateFlags, recvs: usize) -> Ud {
        let d = self.core.device_mut(self.dev).unwrap();
        let (cq, _) = d
            .create_cq(&CqInitAttr {
                cqe: 16,
                comp_vector: 0,
            })
            .unwrap();
        let (qp, _) = d
            .create_qp(
                self.pd,
                &QpInitAttr {
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: 8,
                        max_recv_wr: 8,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 64,
                    },
                    sq_sig_type: SigType::AllWr,
                    qp_type: QpType::Ud,
                    create_flags: flags,
                    port_num: 1,
                },
            )
            .expect("UD QP");
        for (a, m) in [
            (
                QpAttr {
                    qp_state: QpState::Init,
                    port_num: 1,
                    pkey_index: 0,
                    qkey,
                    ..Default::default()
                },
                M::STATE | M::PORT | M::PKEY_INDEX | M::QKEY,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rtr,
                    ..Default::default()
                },
                M::STATE,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rts,
                    sq_psn: 1,
                    ..Default::default()
                },
                M::STATE | M::SQ_PSN,
            ),
        ] {
            d.modify_qp(qp, &a, m).expect("UD QP to RTS");
        }
        let base = self.buf.bus_addr().0;
        let mut slots = Vec::new();
        for i in 0..recvs {
            let at = base + self.slots * 256;
            self.slots += 1;
            let sg = [Sge {
                addr: at,
                length: 256,
                lkey: self.mr.lkey,
            }];
            d.post_recv(
                qp,
                &[RecvWr {
                    wr_id: i as u64,
                    sg_list: &sg,
                }],
            )
            .unwrap();
            slots.push(at);
        }
        Ud { qp, cq, slots }
    }

    fn attach(&mut self, u: &Ud) -> ib_core::Result<()> {
        self.core
            .device_mut(self.dev)
            .unwrap()
            .attach_mcast(u.qp, &mgid(), MLID)
    }

    fn detach(&mut self, u: &Ud) -> ib_core::Result<()> {
        self.core
            .device_mut(self.dev)
            .unwrap()
            .detach_mcast(u.qp, &mgid(), MLID)
    }

    /// The group's address vector from port 1 (GRH to the MGID).
    fn mcast_ah(&mut self) -> Ah {
        let d = self.core.device_mut(self.dev).unwrap();
        d.create_ah(
            self.pd,
            &AhAttr {
                dlid: MLID,
                port_num: 1,
                grh: Some(GlobalRoute {
                    dgid: mgid(),
                    sgid_index: 0,
                    hop_limit: 1,
                    ..GlobalRoute::default()
                }),
                ..AhAttr::default()
            },
        )
        .unwrap()
    }

    fn send(&mut self, u: &Ud, ah: Ah, qkey: u32, payload: &[u8]) {
        let d = self.core.device_mut(self.dev).unwrap();
        d.post_send(
            u.qp,
            &[SendWr {
                wr_id: 0x5e,
                opcode: WrOpcode::Send,
                send_flags: SendFlags::INLINE | SendFlags::SIGNALED,
                wr: WrDetail::Ud {
                    ah,
                    remote_qpn: MCAST_QPN,
                    remote_qkey: qkey,
                    pkey_index: 0,
                    port_num: 1,
                },
                inline_data: payload,
                ..SendWr::default()
            }],
        )
        .expect("posted");
    }

    /// Completions of `u`'s CQ so far.
    fn completions(&mut self, u: &Ud) -> Vec<Wc> {
        let d = self.core.device_mut(self.dev).unwrap();
        let mut out = Vec::new();
        let mut wc = [Wc::default(); 4];
        while let Ok(n @ 1..) = d.poll_cq(u.cq, &mut wc) {
            out.extend_from_slice(&wc[..n]);
        }
        out
    }

    fn read(&self, bus: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.buf
            .read_bytes((bus - self.buf.bus_addr().0) as usize, &mut v);
        v
    }

    fn finish(mut self) {
        let mut p = self.core.unregister_device(self.dev).expect("unregistered");
        let ib = p
            .as_any_mut()
            .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
            .expect("mlx4_ib");
        ib.remove();
        drop(p);
        drop(self.buf);
        self.hca.finish();
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

    fn pump(&mut self, rounds: usize) {
        for _ in 0..rounds {
            self.round();
        }
    }

    fn finish(self) {
        self.a.finish();
        self.b.finish();
    }
}

fn back_to_back(profile: Profile) -> Net {
    let cfg = |guid: u64| SimConfig {
        node_guid: guid,
        ..SimConfig::default()
    };
    let (x, y, wire) = SimHca::back_to_back(cfg(0x0002_c903_00aa_0000), cfg(0x0002_c903_00bb_0000));
    let a = node(Model::wrap(x, "multicast back to back"), profile);
    let b = node(Model::wrap(y, "multicast back to back"), profile);
    assert!(tests::sm::sm_activate(&a.hca, 1, A_LID, A_LID));
    assert!(tests::sm::sm_activate(&b.hca, 1, B_LID, A_LID));
    let mut n = Net { a, b, wire };
    n.pump(2000);
    n
}

/// The payload of receive `wc` of `u`, past the 40-byte GRH area, and the
/// GRH's DGID.
fn received(n: &Node, u: &Ud, wc: &Wc) -> (Vec<u8>, [u8; 16]) {
    let at = u.slots[wc.wr_id as usize];
    let b = n.read(at, wc.byte_len as usize);
    let mut dgid = [0u8; 16];
    dgid.copy_from_slice(&b[24..40]);
    (b[40..].to_vec(), dgid)
}

#[test]
fn a_multicast_datagram_reaches_every_attached_qp_on_both_ports_but_not_its_sender() {
    let mut n = back_to_back(Profile::default());
    let block = QpCreateFlags::BLOCK_MULTICAST_LOOPBACK;
    // A: the sender (blocking its own loopback, as IPoIB), a member that
    // takes the card's loopback copy, a QP that is not attached.
    let a_tx = n.a.ud(QKEY, block, 2);
    let a_peer = n.a.ud(QKEY, QpCreateFlags::empty(), 2);
    let a_none = n.a.ud(QKEY, QpCreateFlags::empty(), 2);
    // B: two members, a member with another Q_Key, a QP not attached.
    let b1 = n.b.ud(QKEY, block, 2);
    let b2 = n.b.ud(QKEY, QpCreateFlags::empty(), 2);
    let b_qkey = n.b.ud(0x1234, QpCreateFlags::empty(), 2);
    let b_none = n.b.ud(QKEY, QpCreateFlags::empty(), 2);
    for u in [&a_tx, &a_peer] {
        n.a.attach(u).unwrap();
    }
    for u in [&b1, &b2, &b_qkey] {
        n.b.attach(u).unwrap();
    }
    // The group as the card keeps it: one MGM entry per HCA, the sender's
    // word with the block-loopback bit.
    let members = n.a.hca.mcg_members(&mgid().0).expect("A's group");
    assert_eq!(members.len(), 2);
    assert_eq!(members[0], a_tx.qp.qp_num | 1 << 30);
    assert_eq!(members[1], a_peer.qp.qp_num);
    let ah = n.a.mcast_ah();
    let payload: Vec<u8> = (0..48u8).map(|i| i ^ 0xa5).collect();
    n.a.send(&a_tx, ah, QKEY, &payload);
    n.pump(2000);
    let tx = n.a.completions(&a_tx);
    assert_eq!(
        tx.len(),
        1,
        "the send completed, nothing looped back to the sender: {tx:?}"
    );
    assert_eq!((tx[0].wr_id, tx[0].status), (0x5e, WcStatus::Success));
    for (on_a, u, who) in [
        (false, &b1, "b1"),
        (false, &b2, "b2"),
        (true, &a_peer, "a_peer"),
    ] {
        let node = if on_a { &mut n.a } else { &mut n.b };
        let wcs = node.completions(u);
        assert_eq!(wcs.len(), 1, "{who}: {wcs:?}");
        let wc = wcs[0];
        assert_eq!(wc.status, WcStatus::Success, "{who}");
        assert!(wc.wc_flags.contains(WcFlags::GRH), "{who}: a GRH in front");
        assert_eq!((wc.src_qp, wc.slid), (a_tx.qp.qp_num, A_LID), "{who}");
        assert_eq!(wc.byte_len, 40 + 48, "{who}");
        let (got, dgid) = received(node, u, &wc);
        assert_eq!(got, payload, "{who}");
        assert_eq!(dgid, mgid().0, "{who}: the GRH's DGID is the group's");
    }
    for (on_a, u, who) in [
        (true, &a_none, "a_none"),
        (false, &b_none, "b_none"),
        (false, &b_qkey, "b_qkey"),
    ] {
        let node = if on_a { &mut n.a } else { &mut n.b };
        assert_eq!(node.completions(u), vec![], "{who} got nothing");
    }
    let (sa, sb) = (n.a.hca.mcast_stats(), n.b.hca.mcast_stats());
    assert_eq!((sa.loopback, sa.loopback_blocked), (1, 1), "{sa:?}");
    assert_eq!(
        (sb.delivered, sb.refused, sb.not_attached),
        (3, 1, 0),
        "{sb:?}"
    );
    // The Q_Key mismatch counted at B's port (PortInfo.Q_KeyViolations).
    let p = n.b.core.device_mut(n.b.dev).unwrap().query_port(1).unwrap();
    assert_eq!(p.qkey_viol_cntr, 1);
    n.finish();
}

#[test]
fn the_model_refuses_a_multicast_packet_to_a_qp_that_is_not_attached() {
    let mut n = back_to_back(Profile::default());
    let a_tx = n.a.ud(QKEY, QpCreateFlags::BLOCK_MULTICAST_LOOPBACK, 0);
    let b = n.b.ud(QKEY, QpCreateFlags::empty(), 4);
    let ah = n.a.mcast_ah();
    // Not attached: the packet crosses the cable and is dropped at B.
    n.a.send(&a_tx, ah, QKEY, b"nobody home");
    n.pump(2000);
    assert_eq!(n.b.completions(&b), vec![]);
    assert_eq!(n.b.hca.mcast_stats().not_attached, 1);
    assert_eq!(n.b.hca.mcg_members(&mgid().0), None);
    // Attached: delivered.
    n.b.attach(&b).unwrap();
    n.a.send(&a_tx, ah, QKEY, b"hello group");
    n.pump(2000);
    let wcs = n.b.completions(&b);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(received(&n.b, &b, &wcs[0]).0, b"hello group");
    // Detached again: refused again, the MGM entry empty.
    n.b.detach(&b).unwrap();
    assert_eq!(n.b.hca.mcg_members(&mgid().0), None);
    n.a.send(&a_tx, ah, QKEY, b"gone");
    n.pump(2000);
    assert_eq!(n.b.completions(&b), vec![]);
    assert_eq!(n.b.hca.mcast_stats().not_attached, 2);
    // Detaching what is not attached is an error (Linux: -EINVAL).
    assert!(n.b.detach(&b).is_err());
    let _ = n.a.completions(&a_tx);
    n.finish();
}

#[test]
fn a_sender_that_does_not_block_loopback_gets_its_own_datagram() {
    let mut n = back_to_back(Profile::default());
    let a = n.a.ud(QKEY, QpCreateFlags::empty(), 2);
    n.a.attach(&a).unwrap();
    let ah = n.a.mcast_ah();
    n.a.send(&a, ah, QKEY, b"echo");
    n.pump(2000);
    let wcs = n.a.completions(&a);
    assert_eq!(wcs.len(), 2, "the send and its own copy: {wcs:?}");
    let rx = wcs
        .iter()
        .find(|w| w.opcode == ib_core::verbs::WcOpcode::Recv)
        .expect("a receive");
    assert_eq!(rx.src_qp, a.qp.qp_num);
    assert_eq!(received(&n.a, &a, rx).0, b"echo");
    assert_eq!(n.a.hca.mcast_stats().loopback, 1);
    n.finish();
}

#[test]
fn attach_refuses_a_qp_that_is_not_ud_and_a_full_mcg_entry() {
    // 128-byte MGM entries: 4 * (128 / 16 - 2) = 24 QPs each.
    let profile = Profile {
        log_mgm_entry_size: 7,
        ..Profile::default()
    };
    let mut n = back_to_back(profile);
    let d = n.a.core.device_mut(n.a.dev).unwrap();
    let attr = d.query_device().unwrap();
    assert_eq!(attr.max_mcast_qp_attach, 24);
    assert!(
        attr.device_cap_flags
            .contains(ib_core::verbs::DeviceCapFlags::BLOCK_MULTICAST_LOOPBACK)
    );
    let (cq, _) = d
        .create_cq(&CqInitAttr {
            cqe: 4,
            comp_vector: 0,
        })
        .unwrap();
    let rc = d
        .create_qp(
            n.a.pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 1,
                    max_recv_wr: 1,
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
        .unwrap()
        .0;
    assert!(matches!(
        d.attach_mcast(rc, &mgid(), MLID),
        Err(ib_core::Error::Invalid(_))
    ));
    // Block-loopback is for UD QPs only (mlx4_ib_create_qp).
    let e = d.create_qp(
        n.a.pd,
        &QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_type: SigType::AllWr,
            qp_type: QpType::Rc,
            create_flags: QpCreateFlags::BLOCK_MULTICAST_LOOPBACK,
            port_num: 1,
        },
    );
    assert!(matches!(e, Err(ib_core::Error::Invalid(_))), "{e:?}");
    let qps: Vec<Ud> = (0..25)
        .map(|_| n.a.ud(QKEY, QpCreateFlags::empty(), 0))
        .collect();
    n.a.attach(&qps[0]).unwrap();
    // Attaching again is not an error and adds nothing (while the entry
    // has room: mlx4_qp_attach_common checks for a full entry first).
    n.a.attach(&qps[0]).unwrap();
    assert_eq!(n.a.hca.mcg_members(&mgid().0).map(|m| m.len()), Some(1));
    for u in &qps[1..24] {
        n.a.attach(u).unwrap();
    }
    assert_eq!(n.a.hca.mcg_members(&mgid().0).map(|m| m.len()), Some(24));
    let e = n.a.attach(&qps[24]).unwrap_err();
    assert_eq!(e.to_errno(), -12, "ENOMEM: {e}");
    assert!(
        log_lines("is full")
            .iter()
            .any(|l| l.contains("MGM at index")),
        "mlx4_core says the MGM is full"
    );
    for u in &qps[..24] {
        n.a.detach(u).unwrap();
    }
    assert_eq!(n.a.hca.mcg_members(&mgid().0), None);
    // Destroying an attached QP detaches it.
    n.a.attach(&qps[3]).unwrap();
    n.a.core
        .device_mut(n.a.dev)
        .unwrap()
        .destroy_qp(qps[3].qp)
        .unwrap();
    assert_eq!(n.a.hca.mcg_members(&mgid().0), None);
    n.finish();
}

// --- through a switch -------------------------------------------------------

/// LID of the switch.
const SWITCH_LID: u16 = 0x10;
/// MulticastForwardingTable (IBTA 14.2.5.13).
const MFT: u16 = 0x001b;

/// A SubnSet(MulticastForwardingTable) from A's QP0 to the switch: MLID
/// `mlid` forwarded to the switch ports in `mask` (position 0: ports 0 to
/// 15, block `(mlid - 0xC000) / 32`). The switch's answer's status.
fn set_mft(n: &mut SwNet, mlid: u16, mask: u16) -> Option<u16> {
    let a = &mut n.a;
    let agent = a
        .core
        .register_mad_agent(a.dev, 1, QpType::Smi, None, 0)
        .expect("SMI agent");
    let idx = mlid - 0xc000;
    let mut m = Mad::new_request(0x01, 1, 0x02, MFT, u32::from(idx / 32));
    let at = 64 + usize::from(idx % 32) * 2;
    m.0[at..at + 2].copy_from_slice(&mask.to_be_bytes());
    let mut buf = MadSendBuf::new(
        m,
        AhAttr {
            dlid: SWITCH_LID,
            port_num: 1,
            ..AhAttr::default()
        },
        0,
    );
    buf.timeout_ms = 200;
    buf.retries = 2;
    let id = a.core.post_send_mad(agent, buf).expect("posted");
    let mut status = None;
    for _ in 0..200_000 {
        while let Some(ev) = n.a.core.mad_poll_agent(agent) {
            match ev {
                MadEvent::Recv(r) if r.send_id == Some(id) => status = Some(r.mad.status()),
                MadEvent::SendDone(s) if s.id == id => return status,
                _ => {}
            }
        }
        n.round();
    }
    status
}

struct SwNet {
    a: Node,
    b: Node,
    wire: Wire,
}

impl SwNet {
    fn round(&mut self) {
        self.a.core.poll();
        self.b.core.poll();
        self.wire.settle();
        self.a.hca.clock().relax();
    }
}

#[test]
#[ignore = "needs the switch's MFT (mgmt-fabric branch)"]
fn a_multicast_datagram_crosses_the_switch_to_the_ports_of_its_mft_entry() {
    let mut f = sim::fabric::Fabric::new();
    let built = sim::fabric::Topology::for_nodes(2)
        .unwrap()
        .build(&mut f)
        .unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let wire = Wire::over(fabric.clone(), SimConfig::default().relax_step);
    let mut hcas = built.hcas.iter().map(|h| {
        Model::on_ports(
            SimConfig {
                node_guid: h.node_guid,
                ..SimConfig::default()
            },
            &wire,
            [Some(h.ports[0]), Some(h.ports[1])],
        )
    });
    let a = node(hcas.next().unwrap(), Profile::default());
    let b = node(hcas.next().unwrap(), Profile::default());
    wire.settle();
    assert!(tests::sm::sm_activate(&a.hca, 1, A_LID, A_LID));
    assert!(tests::sm::sm_activate(&b.hca, 1, B_LID, A_LID));
    fabric
        .lock()
        .unwrap()
        .switch_mut(built.switches[0].1)
        .unwrap()
        .configure(SWITCH_LID, &[(A_LID, 1), (B_LID, 2)]);
    let mut n = SwNet { a, b, wire };
    for _ in 0..2000 {
        n.round();
    }
    // The SM's MFT entry: the MLID goes to both HCAs' switch ports.
    let st = set_mft(&mut n, MLID, 1 << 1 | 1 << 2);
    assert_eq!(st, Some(0), "the switch took the MFT block");
    let a_tx = n.a.ud(QKEY, QpCreateFlags::BLOCK_MULTICAST_LOOPBACK, 0);
    let b1 = n.b.ud(QKEY, QpCreateFlags::empty(), 2);
    n.a.attach(&a_tx).unwrap();
    n.b.attach(&b1).unwrap();
    let ah = n.a.mcast_ah();
    n.a.send(&a_tx, ah, QKEY, b"through the switch");
    for _ in 0..4000 {
        n.round();
    }
    let wcs = n.b.completions(&b1);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(received(&n.b, &b1, &wcs[0]).0, b"through the switch");
    // A blocks its own loopback, and the switch does not send the packet
    // back out of A's port.
    assert_eq!(n.a.completions(&a_tx).len(), 1, "only the send");
    assert_eq!(n.a.hca.mcast_stats().not_attached, 0);
    n.a.finish();
    n.b.finish();
}
