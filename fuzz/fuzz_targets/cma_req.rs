//! ib_core's RDMA CM, passive side: REQs and SIDR_REQs whose private data opens with a fuzzed cma header (`cma_ib_req_handler`'s checks) arrive at listeners of every port space; the application accepts, rejects or drops what it is handed.
//!
//! Two fake HCAs: B runs the RDMA CM with one IP device (`ib0`,
//! 10.0.0.2/24 over its port 1, P_Key 0xffff) and listeners on a TCP and
//! a UDP port (optionally bound to B's address); A sends through the IB CM
//! directly, so every header field is the input's. The oracle is the one
//! Linux's passive side gives: a request is handed to a listener as a
//! CONNECT_REQUEST, with the private data after the 36-byte header, exactly
//! when its header is version 0, IPv4, from a unicast address to B's
//! address, for a port space and port somebody listens on with the QP type
//! of the request; every other request is refused (A hears a REJ or a
//! SIDR_REP that is not SUCCESS, or, for a service nobody listens to, the
//! IB CM's own refusal), and none is lost silently.

#![no_main]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use arbitrary::Arbitrary;
use ib_core::addr::{ARPHRD_INFINIBAND, DevAddrBytes, IpNet, IpRoute, NetDev, dev_addr_bytes};
use ib_core::cm::{self, CmEvent, CmReqParam, CmSidrReqParam};
use ib_core::cma::{self, CMA_HDR_LEN, PortSpace, RdmaCmEventType, RdmaCmId};
use ib_core::device::{ClientId, IbCore};
use ib_core::error::{Error, Result, errno};
use ib_core::verbs::*;
use legoib_fuzz::ibrig::{self, Rig};
use libfuzzer_sys::fuzz_target;

const B_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const TCP_PORT: u16 = 7471;
const UDP_PORT: u16 = 7472;

/// B's IP side: one IPoIB device on port 1, nothing to resolve.
struct Net {
    dev: NetDev,
}

impl IpNet for Net {
    fn route(&mut self, _src: Option<Ipv4Addr>, _dst: Ipv4Addr) -> Result<IpRoute> {
        Err(Error::Errno(errno::ENETUNREACH))
    }
    fn netdevs(&self, f: &mut dyn FnMut(&NetDev)) {
        f(&self.dev)
    }
    fn neigh(
        &mut self,
        _core: &mut IbCore,
        _ifindex: u32,
        _ip: Ipv4Addr,
        _start: bool,
    ) -> Result<Option<DevAddrBytes>> {
        Err(Error::Errno(errno::EHOSTUNREACH))
    }
    fn poll(&mut self, _core: &mut IbCore) {}
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Space {
    Tcp,
    Udp,
    Ib,
    Ipoib,
    Raw(u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Port {
    Tcp,
    Udp,
    Raw(u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Dst {
    Ours,
    Raw([u8; 4]),
    /// Any 16 bytes (an IPv6-looking address, or IPv4 not where cma puts it).
    Wide([u8; 16]),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Answer {
    Accept,
    Reject,
    Nothing,
    Destroy,
}

#[derive(Arbitrary, Debug)]
struct Req {
    sidr: bool,
    space: Space,
    port: Port,
    /// `None`: version 0, as Linux writes it.
    cma_version: Option<u8>,
    /// `None`: 4.
    ip_version: Option<u8>,
    /// The low nibble of the IP-version byte (reserved).
    low_nibble: u8,
    src_port: u16,
    src: [u8; 4],
    dst: Dst,
    /// Private data cut to this many bytes (a header too short).
    cut: Option<u8>,
    user: Vec<u8>,
    answer: Answer,
    delay_ms: u8,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Listeners bound to B's address (else to any address).
    bound: bool,
    reqs: Vec<Req>,
}

fn space(s: Space) -> u16 {
    match s {
        Space::Tcp => PortSpace::Tcp.value(),
        Space::Udp => PortSpace::Udp.value(),
        Space::Ib => PortSpace::Ib.value(),
        Space::Ipoib => PortSpace::Ipoib.value(),
        Space::Raw(v) => v,
    }
}

fn port(p: Port) -> u16 {
    match p {
        Port::Tcp => TCP_PORT,
        Port::Udp => UDP_PORT,
        Port::Raw(v) => v,
    }
}

fn qp(core: &mut IbCore, dev: ib_core::device::DeviceId, t: QpType) -> (Pd, Qp) {
    let d = core.device_mut(dev).unwrap();
    let pd = d.alloc_pd().unwrap();
    let (cq, _) = d
        .create_cq(&CqInitAttr {
            cqe: 16,
            comp_vector: 0,
        })
        .unwrap();
    let q = d.create_qp(pd, &qp_attr(cq, t)).unwrap().0;
    (pd, q)
}

fn qp_attr(cq: Cq, t: QpType) -> QpInitAttr {
    QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_type: SigType::AllWr,
        qp_type: t,
        port_num: 1,
        create_flags: QpCreateFlags::empty(),
    }
}

/// The cma header and the user's bytes, as the input says.
fn private_data(q: &Req, max: usize) -> Vec<u8> {
    let mut d = vec![0u8; CMA_HDR_LEN];
    d[0] = q.cma_version.unwrap_or(0);
    d[1] = (q.ip_version.unwrap_or(4) << 4) | (q.low_nibble & 0x0f);
    d[2..4].copy_from_slice(&q.src_port.to_be_bytes());
    d[16..20].copy_from_slice(&q.src);
    match q.dst {
        Dst::Ours => d[32..36].copy_from_slice(&B_IP.octets()),
        Dst::Raw(a) => d[32..36].copy_from_slice(&a),
        Dst::Wide(a) => d[20..36].copy_from_slice(&a),
    }
    d.extend_from_slice(&q.user);
    d.truncate(usize::from(q.cut.unwrap_or(u8::MAX)).min(max));
    d
}

/// Whether B's RDMA CM must hand `q` (sent with private data `d`) to a
/// listener, by Linux's rules.
fn acceptable(q: &Req, d: &[u8], bound: bool) -> bool {
    if d.len() < CMA_HDR_LEN || d[0] != 0 || d[1] >> 4 != 4 {
        return false;
    }
    let src = Ipv4Addr::new(d[16], d[17], d[18], d[19]);
    let dst = Ipv4Addr::new(d[32], d[33], d[34], d[35]);
    if dst != B_IP || !ib_core::addr::is_unicast(src) {
        return false;
    }
    let (sp, p) = (space(q.space), port(q.port));
    let _ = bound; // both listeners take B_IP whether bound to it or to any
    if q.sidr {
        sp == PortSpace::Udp.value() && p == UDP_PORT
    } else {
        sp == PortSpace::Tcp.value() && p == TCP_PORT
    }
}

/// Polls the core and B's IP side `n` times, a millisecond apart.
fn spin(r: &mut Rig, cma_id: ClientId, net: &mut Net, n: usize) {
    for _ in 0..n {
        r.core.poll();
        cma::net_poll(&mut r.core, cma_id, net);
        r.clock.advance(Duration::from_millis(1));
    }
}

fuzz_target!(|input: Input| {
    let mut r = ibrig::rig(false);
    let cmc = cma::init(&mut r.core);
    let cm = cm::init(&mut r.core);
    r.core.poll();
    let gid = r.core.device(r.b).unwrap().get_cached_gid(1, 0).unwrap();
    let mut hw = [0u8; 20];
    hw[1..4].copy_from_slice(&[0, 0, 0x48]);
    hw[4..20].copy_from_slice(&gid.0);
    let mut bcast = [0u8; 20];
    bcast[8] = 0xff;
    bcast[9] = 0xff;
    let mut net = Net {
        dev: NetDev {
            ifindex: 2,
            name: "ib0".into(),
            dev_type: ARPHRD_INFINIBAND,
            dev_addr: dev_addr_bytes(&hw),
            broadcast: dev_addr_bytes(&bcast),
            mtu: 2044,
            carrier: true,
            addrs: vec![(B_IP, 24)],
            rdma_port: Some((r.b, 1)),
        },
    };
    spin(&mut r, cmc, &mut net, 1);
    let ip = if input.bound {
        B_IP
    } else {
        Ipv4Addr::UNSPECIFIED
    };
    let mut listeners: Vec<RdmaCmId> = Vec::new();
    for (ps, p) in [(PortSpace::Tcp, TCP_PORT), (PortSpace::Udp, UDP_PORT)] {
        let id = cma::create_id(&mut r.core, cmc, ps).expect("create_id");
        cma::bind_addr(&mut r.core, cmc, id, SocketAddrV4::new(ip, p)).expect("bind");
        cma::listen(&mut r.core, cmc, id, 1).expect("listen");
        listeners.push(id);
    }
    let (pdb, _) = qp(&mut r.core, r.b, QpType::Rc);
    let pr = ibrig::path_a_to_b(&r);
    let mut conns: Vec<RdmaCmId> = Vec::new();
    for q in input.reqs.iter().take(6) {
        r.clock
            .advance(Duration::from_millis(u64::from(q.delay_ms)));
        let sid = (u64::from(space(q.space)) << 16) | u64::from(port(q.port));
        let max = if q.sidr { 216 } else { 92 };
        let d = private_data(q, max);
        let sent = if q.sidr {
            cm::send_sidr_req(
                &mut r.core,
                cm,
                r.a,
                1,
                &CmSidrReqParam {
                    path: pr,
                    service_id: sid,
                    timeout_ms: 100,
                    max_cm_retries: 0,
                    private_data: d.clone(),
                },
            )
        } else {
            // A QP of its own: a second REQ from one QP is a stale
            // connection to the IB CM, before the RDMA CM sees it.
            let (_, qa) = qp(&mut r.core, r.a, QpType::Rc);
            let mut p = CmReqParam::new(pr, sid, qa);
            p.private_data = d.clone();
            p.max_cm_retries = 0;
            p.remote_cm_response_timeout = 14;
            p.local_cm_response_timeout = 14;
            cm::send_req(&mut r.core, cm, r.a, 1, &p)
        };
        let Ok(a_id) = sent else {
            continue;
        };
        spin(&mut r, cmc, &mut net, 20);
        // What B's listeners were handed.
        let mut handed = Vec::new();
        for &l in &listeners {
            while let Some(e) = cma::get_cm_event(&mut r.core, cmc, l) {
                assert_eq!(e.event, RdmaCmEventType::ConnectRequest, "{e:?}");
                assert_eq!(e.listen_id, Some(l));
                handed.push(e);
            }
        }
        let want = acceptable(q, &d, input.bound);
        assert_eq!(
            handed.len(),
            usize::from(want),
            "request {q:?} with private data {d:02x?}: handed {handed:?}"
        );
        if let Some(e) = handed.pop() {
            let user = if q.sidr {
                &e.ud.as_ref().expect("SIDR request without ud").private_data
            } else {
                &e.conn.private_data
            };
            // The CM's private data is a fixed field (92 bytes in a REQ,
            // 216 in a SIDR_REQ): the consumer gets all of it after the
            // header, its bytes then zeros.
            let sent = &d[CMA_HDR_LEN..];
            assert_eq!(user.len(), max - CMA_HDR_LEN, "the consumer's private data");
            assert_eq!(&user[..sent.len()], sent, "the consumer's private data");
            assert!(user[sent.len()..].iter().all(|&b| b == 0), "{user:02x?}");
            let id = e.id;
            conns.push(id);
            match q.answer {
                Answer::Accept => {
                    let t = if q.sidr { QpType::Ud } else { QpType::Rc };
                    let (cq, _) = r
                        .core
                        .device_mut(r.b)
                        .unwrap()
                        .create_cq(&CqInitAttr {
                            cqe: 8,
                            comp_vector: 0,
                        })
                        .unwrap();
                    if cma::create_qp(&mut r.core, cmc, id, pdb, &qp_attr(cq, t)).is_ok() {
                        let _ = cma::accept(&mut r.core, cmc, id, None);
                    }
                }
                Answer::Reject => {
                    let _ = cma::reject(&mut r.core, cmc, id, b"no");
                }
                Answer::Nothing => {}
                Answer::Destroy => {
                    let _ = cma::destroy_id(&mut r.core, cmc, id);
                    conns.pop();
                }
            }
            spin(&mut r, cmc, &mut net, 20);
        } else {
            // Refused: A hears so (a REJ, a SIDR_REP that is not SUCCESS),
            // within the polls above, never silence.
            let mut heard = false;
            while let Some(ev) = cm::get_event(&mut r.core, cm, a_id) {
                match ev {
                    CmEvent::Rejected { .. } => heard = true,
                    CmEvent::SidrRepReceived { status, .. } => {
                        assert_ne!(status, 0, "a refused SIDR_REQ answered SUCCESS");
                        heard = true;
                    }
                    other => panic!("refused request {q:?}: A got {other:?}"),
                }
            }
            assert!(heard, "request {q:?} ({d:02x?}) was refused in silence");
        }
        let _ = cm::destroy_id(&mut r.core, cm, a_id);
    }
    // Every timer runs out; the IDs go.
    for _ in 0..40 {
        spin(&mut r, cmc, &mut net, 1);
        r.clock.advance(Duration::from_millis(250));
        for &id in conns.iter().chain(listeners.iter()) {
            while cma::get_cm_event(&mut r.core, cmc, id).is_some() {}
        }
    }
    for id in conns.into_iter().chain(listeners) {
        let _ = cma::destroy_id(&mut r.core, cmc, id);
    }
    spin(&mut r, cmc, &mut net, 5);
    let _ = cma::counters(&mut r.core, cmc);
});
