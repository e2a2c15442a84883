//! Both ports of the HCA, each with its own parameters and its own traffic.
//!
//! Two model HCAs cabled port 1 to port 1 and port 2 to port 2, with the real
//! stack on each (mlx4_core + mlx4_ib + ib_core). mlx4_core's SET_PORT gives
//! A's two ports different VL capabilities (the model refuses port 1's first
//! try with EXCEED_LIM, so port 1 retries with 4 VLs while port 2 keeps 8), and
//! each port's PortInfo, as the model's SMA answers it, shows what that port
//! received. Then MADs go out of port 2 only: an SMP answered by the peer's
//! port 2 (its NodeInfo names local port 2) and a PMA query answered by the
//! peer's port-2 agent, with port 1's MAD counters left alone. The ports are
//! brought up by hand (no SM on these wires).

use tests::mlx4_common;

use ib_core::mad::{Mad, MadEvent, MadSendBuf, class, method};
use ib_core::verbs::{AhAttr, IB_QP_SET_QKEY, QpType, WcStatus};
use ib_core::{DeviceId, IbCore, MadAgent};
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;
use sim::{Opcode, OpcodeFault, SimConfig, SimHca, Status, Wire};

/// LIDs: A's ports 1 and 2, B's ports 1 and 2.
const A1: u16 = 1;
const A2: u16 = 3;
const B1: u16 = 2;
const B2: u16 = 4;

struct Node {
    hca: Model,
    core: IbCore,
    dev: DeviceId,
    guid: u64,
}

fn node(hca: Model) -> Node {
    let d = bring_up(&hca, Profile::default()).expect("mlx4_core");
    let ib = Mlx4IbDev::add(d, "mlx4_0").expect("mlx4_ib_add");
    let guid = ib.node_guid();
    let mut core = IbCore::new(hca.clock());
    let dev = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    Node {
        hca,
        core,
        dev,
        guid,
    }
}

/// A SubnGet(PortInfo) of `port` to the model's own SMA, as an SM's SMP
/// arriving at that port: the 64 bytes of PortInfo.
fn port_info(hca: &SimHca, port: u8) -> Vec<u8> {
    let mut m = vec![0u8; 256];
    m[0] = 1;
    m[1] = 0x01; // LID-routed SM class
    m[2] = 1;
    m[3] = 0x01; // Get
    m[8..16].copy_from_slice(&0x2b07_u64.to_be_bytes());
    m[0x10..0x12].copy_from_slice(&0x0015u16.to_be_bytes());
    m[0x14..0x18].copy_from_slice(&u32::from(port).to_be_bytes());
    let r = hca.sma_receive(port, &m).expect("the SMA answers");
    r[0x40..0x80].to_vec()
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

    fn pump_for(&mut self, ns: u64) {
        let end = self.a.hca.clock().now_ns() + ns;
        let mut rounds = 0;
        while self.a.hca.clock().now_ns() < end && rounds < 10_000_000 {
            self.round();
            rounds += 1;
        }
    }

    /// Posts `buf` from A's `agent` and pumps until it completes; the
    /// status and the response.
    fn request(&mut self, agent: MadAgent, buf: MadSendBuf) -> (WcStatus, Option<Mad>) {
        let t0 = self.a.hca.clock().now_ns();
        let id = self.a.core.post_send_mad(agent, buf).expect("posted");
        let mut resp = None;
        loop {
            while let Some(ev) = self.a.core.mad_poll_agent(agent) {
                match ev {
                    MadEvent::Recv(r) => {
                        assert_eq!(r.send_id, Some(id));
                        resp = Some(r.mad.clone());
                    }
                    MadEvent::SendDone(s) => return (s.status, resp),
                }
            }
            assert!(
                self.a.hca.clock().now_ns() - t0 < 1_000_000_000,
                "no send completion within a second of model time"
            );
            self.round();
        }
    }
}

#[test]
fn each_port_gets_its_own_set_port_and_mads_cross_port_2() {
    let cfg = |guid: u64| SimConfig {
        node_guid: guid,
        ..SimConfig::default()
    };
    let (x, y, wire) = SimHca::back_to_back(cfg(0x0002_c903_00aa_0000), cfg(0x0002_c903_00bb_0000));
    let (p, q) = (x.fabric_port(2).unwrap(), y.fabric_port(2).unwrap());
    wire.fabric().lock().unwrap().connect(p, q).unwrap();
    // Port 1's first SET_PORT (8 VLs) is refused as too much: mlx4_core
    // retries it with 4 (Linux's loop); port 2's goes through with 8.
    x.faults().set(
        Opcode::SET_PORT,
        OpcodeFault::status(Status::EXCEED_LIM).times(1),
    );
    let a = node(Model::wrap(x, "two ports back to back"));
    let b = node(Model::wrap(y, "two ports back to back"));
    let set_ports: Vec<(u32, u8)> = a
        .hca
        .trace()
        .iter()
        .filter(|e| e.name == "SET_PORT")
        .map(|e| (e.in_mod, e.status))
        .collect();
    assert_eq!(
        set_ports,
        [(1, Status::EXCEED_LIM.0), (1, 0), (2, 0)],
        "one SET_PORT per port, port 1 tried twice"
    );
    // What each port received, as its PortInfo shows it: VLCap (4 bits at
    // byte 37: 3 is VL0-3, 4 is VL0-7), MTUCap (byte 41: 5 is 4096), and
    // the capability mask.
    let (pi1, pi2) = (port_info(&a.hca, 1), port_info(&a.hca, 2));
    assert_eq!(pi1[37] >> 4, 3, "port 1: 4 VLs, from its retried SET_PORT");
    assert_eq!(pi2[37] >> 4, 4, "port 2: 8 VLs, its own SET_PORT");
    assert_eq!((pi1[41] & 0xf, pi2[41] & 0xf), (5, 5), "MTU cap 4096");
    assert_eq!(pi1[20..24], pi2[20..24], "the same default capability mask");
    let pb = port_info(&b.hca, 2);
    assert_eq!(pb[37] >> 4, 4, "B, with no refusal: 8 VLs");

    // Both ports of both nodes Active, each with its own LID.
    for (n, port, lid) in [(&a, 1, A1), (&a, 2, A2), (&b, 1, B1), (&b, 2, B2)] {
        assert!(
            tests::sm::sm_activate(&n.hca, port, lid, A1),
            "port {port} of LID {lid}"
        );
    }
    let mut n = Net { a, b, wire };
    n.pump_for(1_000_000);

    // MADs out of A's port 2 only.
    let before = [1, 2].map(|p| n.b.core.mad_counters(n.b.dev, p).unwrap());
    let smi =
        n.a.core
            .register_mad_agent(n.a.dev, 2, QpType::Smi, None, 0)
            .expect("QP0 agent on port 2");
    let gsi =
        n.a.core
            .register_mad_agent(n.a.dev, 2, QpType::Gsi, None, 0)
            .expect("QP1 agent on port 2");
    let ah = AhAttr {
        dlid: B2,
        port_num: 2,
        ..AhAttr::default()
    };
    // B's NodeInfo: the SMP arrived at its port 2.
    let mut smp = MadSendBuf::new(
        Mad::new_request(class::SUBN_LID_ROUTED, 1, method::GET, 0x0011, 0),
        ah,
        0,
    );
    smp.timeout_ms = 50;
    let (st, resp) = n.request(smi, smp);
    assert_eq!(st, WcStatus::Success);
    let r = resp.expect("B's NodeInfo");
    assert_eq!(r.method(), method::GET_RESP);
    let d = r.smp_data();
    assert_eq!(
        u64::from_be_bytes(d[12..20].try_into().unwrap()),
        n.b.guid,
        "B's node GUID"
    );
    assert_eq!(
        u64::from_be_bytes(d[20..28].try_into().unwrap()),
        n.b.guid + 2,
        "the port GUID of B's port 2"
    );
    assert_eq!(d[36], 2, "LocalPortNum: it came in at port 2");
    // B's PortCounters of port 2, from its port-2 agent on QP1.
    let mut pma = Mad::new_request(class::PERF_MGMT, 1, method::GET, 0x0012, 0);
    pma.0[64 + 1] = 2;
    pma.0[64 + 2] = 0xff;
    pma.0[64 + 3] = 0xff;
    let mut buf = MadSendBuf::new(pma, ah, 1);
    buf.remote_qkey = IB_QP_SET_QKEY;
    buf.timeout_ms = 50;
    let (st, resp) = n.request(gsi, buf);
    assert_eq!(st, WcStatus::Success);
    let r = resp.expect("B's PortCounters");
    assert_eq!((r.method(), r.status()), (method::GET_RESP, 0));
    assert_eq!(r.0[64 + 1], 2, "PortSelect 2 echoed");
    let rcv_pkts = u32::from_be_bytes(r.0[64 + 36..64 + 40].try_into().unwrap());
    assert!(rcv_pkts >= 2, "B's port 2 received our MADs: {rcv_pkts}");
    let after = [1, 2].map(|p| n.b.core.mad_counters(n.b.dev, p).unwrap());
    assert_eq!(
        after[1].process_mad_replies - before[1].process_mad_replies,
        2,
        "B's port 2 answered both"
    );
    assert_eq!(
        after[0].process_mad_replies, before[0].process_mad_replies,
        "port 1 saw none of it"
    );
    n.a.core.unregister_mad_agent(smi).unwrap();
    n.a.core.unregister_mad_agent(gsi).unwrap();
    for mut node in [n.a, n.b] {
        let mut p = node.core.unregister_device(node.dev).expect("unregistered");
        let ib = p
            .as_any_mut()
            .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
            .expect("mlx4_ib");
        ib.remove();
        drop(p);
        node.hca.finish();
    }
}
