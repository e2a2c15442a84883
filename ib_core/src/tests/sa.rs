//! The SA client against a small fake SA (an agent on the other HCA's QP1, polled as a client).
//!
//! PathRecord by LID and GID, retries while the SA is silent, BUSY, no records,
//! timeouts within the deadline, the cache and the events that drop it,
//! NodeRecord and PortInfoRecord tables, and random answers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::fake::lock;
use super::*;
use crate::device::{ClientId, Device, IbClient};
use crate::error::Error;
use crate::mad::*;
use crate::sa_query::{self, *};
use crate::verbs::*;
use hal::Clock;

/// What the fake SA does and saw.
#[derive(Default)]
pub struct FakeSaState {
    /// Requests to ignore before answering (an SA still sweeping).
    pub ignore: usize,
    /// Never answer.
    pub silent: bool,
    /// Answer BUSY this many times first.
    pub busy: usize,
    /// Answer ERR_NO_RECORDS to PathRecord queries.
    pub no_records: bool,
    /// Replace every answer by these bytes (fuzz).
    pub raw_answer: Option<Mad>,
    /// Every request it received.
    pub requests: Vec<Mad>,
    /// NodeRecords it knows.
    pub nodes: Vec<NodeRecord>,
    /// PortInfoRecords it knows.
    pub portinfos: Vec<PortInfoRecord>,
    /// (GID, LID) of the ports it knows.
    pub lids: Vec<(Gid, u16)>,
    /// RMPP segments of a multi-MAD answer, sent after `answer`.
    pub segments: Vec<Mad>,
}

pub type SaState = Arc<Mutex<FakeSaState>>;

pub struct FakeSa {
    pub dev: DeviceId,
    pub port: u8,
    pub agent: Option<MadAgent>,
    pub st: SaState,
}

fn st(s: &SaState) -> std::sync::MutexGuard<'_, FakeSaState> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeSa {
    fn answer(&self, req: &Mad) -> Option<Mad> {
        // The requester's RMPP ACKs of our single-segment tables (sent with
        // the request method, as Linux does) are no requests.
        if req.0[26] & 1 != 0 && req.0[25] != 1 {
            return None;
        }
        let mut s = st(&self.st);
        s.requests.push(req.clone());
        if s.silent {
            return None;
        }
        if s.ignore > 0 {
            s.ignore -= 1;
            return None;
        }
        if let Some(raw) = &s.raw_answer {
            let mut m = raw.clone();
            m.set_tid(req.tid());
            return Some(m);
        }
        let mut resp = req.clone();
        resp.set_method(if req.method() == method::GET {
            method::GET_RESP
        } else {
            sa_method::GET_TABLE_RESP
        });
        resp.0[56..].fill(0);
        if s.busy > 0 {
            s.busy -= 1;
            resp.set_status(status::BUSY);
            return Some(resp);
        }
        let mask = sa_query::comp_mask(req);
        let no_records = |mut r: Mad| {
            r.set_status(sa_status::NO_RECORDS << 8);
            Some(r)
        };
        match req.attr_id() {
            sa_attr::PATH_REC => {
                if s.no_records {
                    return no_records(resp);
                }
                let q = PathRecord::unpack(&req.0[56..]).ok()?;
                let (dgid, dlid) = if mask & path_comp::DLID != 0 {
                    let g = s.lids.iter().find(|(_, l)| *l == q.dlid)?.0;
                    (g, q.dlid)
                } else if mask & path_comp::DGID != 0 {
                    let Some(&(g, l)) = s.lids.iter().find(|(g, _)| *g == q.dgid) else {
                        return no_records(resp);
                    };
                    (g, l)
                } else {
                    return no_records(resp);
                };
                let slid = s
                    .lids
                    .iter()
                    .find(|(g, _)| *g == q.sgid)
                    .map_or(q.slid, |x| x.1);
                let p = PathRecord {
                    dgid,
                    sgid: q.sgid,
                    dlid,
                    slid,
                    reversible: true,
                    numb_path: 1,
                    pkey: 0xffff,
                    sl: 0,
                    mtu_selector: 2,
                    mtu: Mtu::Mtu2048 as u8,
                    rate_selector: 2,
                    rate: 7,
                    packet_life_time_selector: 2,
                    packet_life_time: 14,
                    ..PathRecord::default()
                };
                resp.0[56..120].copy_from_slice(&p.pack());
            }
            sa_attr::NODE_REC => {
                let q = NodeRecord::unpack(&req.0[56..]).ok()?;
                let hits: Vec<&NodeRecord> = s
                    .nodes
                    .iter()
                    .filter(|n| mask & node_comp::LID == 0 || n.lid == q.lid)
                    .collect();
                let Some(first) = hits.first() else {
                    return no_records(resp);
                };
                if req.method() == sa_method::GET_TABLE && hits.len() > 1 {
                    // Several records: an RMPP transfer of 200-byte
                    // segments, the SA header in each.
                    let data: Vec<u8> = hits.iter().flat_map(|n| n.pack()).collect();
                    let chunks: Vec<&[u8]> = data.chunks(200).collect();
                    let total = chunks.len();
                    sa_query::set_attr_offset(&mut resp, 14);
                    let mut segs = Vec::new();
                    for (i, c) in chunks.iter().enumerate() {
                        let mut m = resp.clone();
                        m.0[56..].fill(0);
                        m.0[56..56 + c.len()].copy_from_slice(c);
                        m.0[24] = 1;
                        m.0[25] = 1;
                        let mut flags = 0x01;
                        if i == 0 {
                            flags |= 0x02;
                        }
                        if i + 1 == total {
                            flags |= 0x04;
                        }
                        m.0[26] = flags;
                        m.0[28..32].copy_from_slice(&(i as u32 + 1).to_be_bytes());
                        let paylen = if i == 0 {
                            (20 * total + data.len()) as u32
                        } else if i + 1 == total {
                            20 + c.len() as u32
                        } else {
                            0
                        };
                        m.0[32..36].copy_from_slice(&paylen.to_be_bytes());
                        segs.push(m);
                    }
                    s.segments = segs;
                    return None;
                }
                // One NodeRecord per MAD (112 of 200 bytes).
                resp.0[56..168].copy_from_slice(&first.pack());
                sa_query::set_attr_offset(&mut resp, 14);
                if req.method() == sa_method::GET_TABLE {
                    resp.0[24] = 1; // RMPP version
                    resp.0[25] = 1; // DATA
                    resp.0[26] = 0x01 | 0x02 | 0x04; // active, first, last
                    resp.0[28..32].copy_from_slice(&1u32.to_be_bytes());
                    resp.0[32..36].copy_from_slice(&(20u32 + 112).to_be_bytes());
                }
            }
            sa_attr::PORT_INFO_REC => {
                let q = PortInfoRecord::unpack(&req.0[56..]).ok()?;
                let hits: Vec<[u8; 72]> = s
                    .portinfos
                    .iter()
                    .filter(|p| mask & portinfo_comp::LID == 0 || p.lid == q.lid)
                    .map(|p| p.pack())
                    .collect();
                if hits.is_empty() {
                    return no_records(resp);
                }
                let n = hits.len().min(2);
                for (i, h) in hits.iter().take(n).enumerate() {
                    resp.0[56 + i * 72..56 + (i + 1) * 72].copy_from_slice(h);
                }
                sa_query::set_attr_offset(&mut resp, 9);
                resp.0[24] = 1;
                resp.0[25] = 1;
                resp.0[26] = 0x07;
                resp.0[28..32].copy_from_slice(&1u32.to_be_bytes());
                resp.0[32..36].copy_from_slice(&(20 + 72 * n as u32).to_be_bytes());
            }
            _ => {
                resp.set_status(status::UNSUPPORTED_METHOD_ATTRIB);
            }
        }
        Some(resp)
    }
}

impl IbClient for FakeSa {
    fn name(&self) -> &str {
        "fake-sa"
    }
    fn add(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn remove(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn poll(&mut self, _me: ClientId, core: &mut IbCore) -> usize {
        let agent = match self.agent {
            Some(a) => a,
            None => {
                let Ok(a) = core.register_mad_agent(
                    self.dev,
                    self.port,
                    QpType::Gsi,
                    Some(MadRegReq::new(
                        class::SUBN_ADM,
                        2,
                        &[method::GET, sa_method::GET_TABLE],
                    )),
                    0,
                ) else {
                    return 0;
                };
                self.agent = Some(a);
                a
            }
        };
        let mut work = 0;
        while let Some(ev) = core.mad_poll_agent(agent) {
            work += 1;
            let MadEvent::Recv(r) = ev else { continue };
            let mut out: Vec<Mad> = self.answer(&r.mad).into_iter().collect();
            out.append(&mut st(&self.st).segments);
            for resp in out {
                let mut buf = MadSendBuf::new(
                    resp,
                    AhAttr {
                        dlid: r.wc.slid,
                        sl: r.wc.sl,
                        port_num: self.port,
                        ..AhAttr::default()
                    },
                    r.wc.src_qp,
                );
                buf.remote_qkey = IB_QP1_QKEY;
                let _ = core.post_send_mad(agent, buf);
            }
        }
        work
    }
}

pub struct SaRig {
    pub r: Rig,
    pub sa: ClientId,
    pub st: SaState,
}

pub fn a_gid() -> Gid {
    Gid::new(fake::GID_PREFIX, A_GUID)
}
pub fn b_gid() -> Gid {
    Gid::new(fake::GID_PREFIX, B_GUID)
}

/// The rig, with B's port 1 the SM (A's SM LID = 20) and a fake SA on it,
/// and the SA client registered.
pub fn sa_rig() -> SaRig {
    let mut r = rig();
    {
        let mut w = lock(&r.world);
        w.hcas[0].ports[0].sm_lid = B_LID;
        w.hcas[1].ports[0].sm_lid = B_LID;
    }
    r.core.device_mut(r.a).unwrap().cache_update(1).unwrap();
    r.core.device_mut(r.b).unwrap().cache_update(1).unwrap();
    let st: SaState = Arc::new(Mutex::new(FakeSaState {
        lids: vec![(a_gid(), A_LID), (b_gid(), B_LID)],
        ..FakeSaState::default()
    }));
    r.core.register_client(Box::new(FakeSa {
        dev: r.b,
        port: 1,
        agent: None,
        st: st.clone(),
    }));
    let sa = sa_query::init(&mut r.core);
    // Let the fake SA register its agent.
    r.core.poll();
    SaRig { r, sa, st }
}

fn requests(s: &SaRig) -> usize {
    st(&s.st).requests.len()
}

const T: Duration = Duration::from_secs(2);

#[test]
fn path_to_a_lid_is_asked_of_the_sm_lid_and_answered() {
    let mut s = sa_rig();
    let p = sa_query::path_to_lid(&mut s.r.core, s.sa, s.r.a, 1, B_LID, T).unwrap();
    assert_eq!(p.dlid, B_LID);
    assert_eq!(p.slid, A_LID);
    assert_eq!(p.dgid, b_gid());
    assert_eq!(p.sgid, a_gid());
    assert_eq!(p.mtu, Mtu::Mtu2048 as u8);
    assert_eq!(p.pkey, 0xffff);
    // The request: class 3 v2 Get PathRecord, SGID|SLID|DLID|... in the
    // mask, to the SM's LID on QP1.
    let req = st(&s.st).requests[0].clone();
    assert_eq!(req.mgmt_class(), class::SUBN_ADM);
    assert_eq!(req.class_version(), 2);
    assert_eq!(req.method(), method::GET);
    assert_eq!(req.attr_id(), sa_attr::PATH_REC);
    let mask = sa_query::comp_mask(&req);
    assert_eq!(
        mask,
        path_comp::SGID
            | path_comp::SLID
            | path_comp::DLID
            | path_comp::PKEY
            | path_comp::NUMB_PATH
            | path_comp::REVERSIBLE
    );
    let q = PathRecord::unpack(&req.0[56..]).unwrap();
    assert_eq!((q.slid, q.dlid, q.sgid), (A_LID, B_LID, a_gid()));
    let w = lock(&s.r.world);
    let pkt = w
        .wire
        .iter()
        .find(|p| p.mad.mgmt_class() == class::SUBN_ADM && p.from.0 == 0)
        .unwrap();
    assert_eq!((pkt.dlid, pkt.dest_qpn), (B_LID, 1));
    drop(w);
    let sm = sa_query::sm_ah(&mut s.r.core, s.sa, s.r.a, 1).unwrap();
    assert_eq!(sm.dlid, B_LID);
    let c = sa_query::counters(&mut s.r.core, s.sa, s.r.a, 1).unwrap();
    assert_eq!((c.sent, c.answered, c.retries), (1, 1, 0));
}

#[test]
fn path_to_a_gid_is_found_and_its_ah_built() {
    let mut s = sa_rig();
    let p = sa_query::path_to_gid(&mut s.r.core, s.sa, s.r.a, 1, b_gid(), T).unwrap();
    assert_eq!(p.dlid, B_LID);
    let req = st(&s.st).requests[0].clone();
    assert_ne!(sa_query::comp_mask(&req) & path_comp::DGID, 0);
    assert_eq!(sa_query::comp_mask(&req) & path_comp::DLID, 0);
    let dev = s.r.core.device(s.r.a).unwrap();
    let ah = sa_query::init_ah_from_path(dev, 1, &p).unwrap();
    assert_eq!((ah.dlid, ah.port_num, ah.static_rate), (B_LID, 1, 7));
    assert!(ah.grh.is_none());
    // A path that leaves the subnet gets a GRH with the SGID's index.
    let mut far = p;
    far.hop_limit = 4;
    far.sgid = dev.get_cached_gid(1, 2).unwrap();
    let ah = sa_query::init_ah_from_path(dev, 1, &far).unwrap();
    let g = ah.grh.unwrap();
    assert_eq!((g.sgid_index, g.hop_limit, g.dgid), (2, 4, b_gid()));
    far.sgid = Gid::new(1, 2);
    assert!(sa_query::init_ah_from_path(dev, 1, &far).is_err());
}

#[test]
fn an_sa_that_never_answers_times_out_within_the_deadline() {
    let mut s = sa_rig();
    st(&s.st).silent = true;
    let t0 = s.r.clock.now_ns();
    let e = sa_query::path_to_lid(&mut s.r.core, s.sa, s.r.a, 1, B_LID, T).unwrap_err();
    let took = Duration::from_nanos(s.r.clock.now_ns() - t0);
    assert_eq!(e, Error::TimedOut);
    assert!(took >= T, "gave up early: {took:?}");
    assert!(took <= T + Duration::from_millis(150), "too late: {took:?}");
    let c = sa_query::counters(&mut s.r.core, s.sa, s.r.a, 1).unwrap();
    assert_eq!(c.timeouts, 1);
    // 100 + 200 + 400 + 800 ms tries with backoffs fit in 2 s.
    assert!(c.sent >= 4, "{c:?}");
    assert_eq!(requests(&s) as u64, c.sent);
}

#[test]
fn an_sa_that_answers_after_some_retries_succeeds() {
    let mut s = sa_rig();
    st(&s.st).ignore = 3;
    let id = sa_query::path_rec_get(
        &mut s.r.core,
        s.sa,
        s.r.a,
        1,
        &PathRecord {
            dlid: B_LID,
            ..PathRecord::default()
        },
        path_comp::DLID,
        Duration::from_secs(5),
    )
    .unwrap();
    let resp = sa_query::wait(&mut s.r.core, s.sa, id, Duration::from_secs(5)).unwrap();
    assert_eq!(resp.tries, 4);
    assert_eq!(resp.path_records().unwrap()[0].dlid, B_LID);
    assert_eq!(requests(&s), 4);
    // Each try had its own TID.
    let tids: std::collections::HashSet<u64> = st(&s.st).requests.iter().map(|m| m.tid()).collect();
    assert_eq!(tids.len(), 4);
    let c = sa_query::counters(&mut s.r.core, s.sa, s.r.a, 1).unwrap();
    assert_eq!((c.retries, c.answered), (3, 1));
    // Taken once.
    assert!(sa_query::query_result(&mut s.r.core, s.sa, id).is_none());
}

#[test]
fn busy_answers_are_retried_and_no_records_is_not_found() {
    let mut s = sa_rig();
    st(&s.st).busy = 2;
    let p = sa_query::path_to_lid(&mut s.r.core, s.sa, s.r.a, 1, B_LID, T).unwrap();
    assert_eq!(p.dlid, B_LID);
    assert_eq!(requests(&s), 3);
    st(&s.st).no_records = true;
    let e = sa_query::path_to_gid(&mut s.r.core, s.sa, s.r.a, 1, Gid::new(1, 1), T).unwrap_err();
    assert_eq!(e, Error::NotFound);
}

#[test]
fn paths_are_cached_and_dropped_on_lid_sm_and_reregister_events() {
    let mut s = sa_rig();
    sa_query::path_to_lid(&mut s.r.core, s.sa, s.r.a, 1, B_LID, T).unwrap();
    sa_query::path_to_lid(&mut s.r.core, s.sa, s.r.a, 1, B_LID, T).unwrap();
    assert_eq!(requests(&s), 1, "second query answered from the cache");
    let c = sa_query::counters(&mut s.r.core, s.sa, s.r.a, 1).unwrap();
    assert_eq!(c.cache_hits, 1);
    let mut want = 1;
    for ev in [
        EventType::LidChange,
        EventType::SmChange,
        EventType::ClientReregister,
    ] {
        if ev == EventType::LidChange {
            lock(&s.r.world).hcas[0].ports[0].lid = 11;
            st(&s.st).lids[0].1 = 11;
        }
        lock(&s.r.world).hcas[0]
            .events
            .push_back(Event::port(ev, 1));
        s.r.core.poll();
        let p = sa_query::path_to_lid(&mut s.r.core, s.sa, s.r.a, 1, B_LID, T).unwrap();
        want += 1;
        assert_eq!(requests(&s), want, "{ev:?} must drop the cache");
        assert_eq!(p.slid, 11);
        sa_query::path_to_lid(&mut s.r.core, s.sa, s.r.a, 1, B_LID, T).unwrap();
        assert_eq!(requests(&s), want);
    }
    // Other events keep it.
    lock(&s.r.world).hcas[0]
        .events
        .push_back(Event::port(EventType::GidChange, 1));
    s.r.core.poll();
    sa_query::path_to_lid(&mut s.r.core, s.sa, s.r.a, 1, B_LID, T).unwrap();
    assert_eq!(requests(&s), want);
    let c = sa_query::counters(&mut s.r.core, s.sa, s.r.a, 1).unwrap();
    assert_eq!(c.cache_flushes, 3);
}

#[test]
fn a_second_sa_user_shares_the_one_sa_client() {
    // perftest, saquery and the remote-memory service each call
    // sa_query::init: they get the one SA client, so a path one of them
    // learned is not asked of the SA again for another.
    let mut s = sa_rig();
    sa_query::path_to_lid(&mut s.r.core, s.sa, s.r.a, 1, B_LID, T).unwrap();
    let second = sa_query::init(&mut s.r.core);
    assert_eq!(second, s.sa, "one SA client per core");
    let p = sa_query::path_to_lid(&mut s.r.core, second, s.r.a, 1, B_LID, T).unwrap();
    assert_eq!(p.dlid, B_LID);
    assert_eq!(
        requests(&s),
        1,
        "the second user's path came from the cache"
    );
    let c = sa_query::counters(&mut s.r.core, second, s.r.a, 1).unwrap();
    assert_eq!((c.sent, c.cache_hits), (1, 1));
}

#[test]
fn a_port_without_an_sm_waits_until_one_appears() {
    let mut s = sa_rig();
    lock(&s.r.world).hcas[0].ports[0].sm_lid = 0;
    s.r.core.device_mut(s.r.a).unwrap().cache_update(1).unwrap();
    let id = sa_query::path_rec_get(
        &mut s.r.core,
        s.sa,
        s.r.a,
        1,
        &PathRecord {
            dlid: B_LID,
            ..PathRecord::default()
        },
        path_comp::DLID,
        Duration::from_secs(3),
    )
    .unwrap();
    let _ =
        s.r.core
            .poll_until(Duration::from_millis(500), |_| None::<()>);
    assert_eq!(requests(&s), 0, "nothing sent without an SM LID");
    assert!(sa_query::query_result(&mut s.r.core, s.sa, id).is_none());
    // The SM shows up.
    lock(&s.r.world).hcas[0].ports[0].sm_lid = B_LID;
    lock(&s.r.world).hcas[0]
        .events
        .push_back(Event::port(EventType::SmChange, 1));
    let resp = sa_query::wait(&mut s.r.core, s.sa, id, Duration::from_secs(3)).unwrap();
    assert_eq!(resp.path_records().unwrap()[0].dlid, B_LID);
}

#[test]
fn node_and_portinfo_records() {
    let mut s = sa_rig();
    let mut desc = [0u8; 64];
    desc[..8].copy_from_slice(b"fake_b 1");
    let node = NodeRecord {
        lid: B_LID,
        node_info: NodeInfo {
            base_version: 1,
            class_version: 1,
            node_type: 1,
            num_ports: 1,
            node_guid: B_GUID,
            port_guid: B_GUID + 1,
            vendor_id: 0x2c9,
            local_port_num: 1,
            ..NodeInfo::default()
        },
        node_desc: desc,
    };
    let mut pi = [0u8; 64];
    pi[16..18].copy_from_slice(&B_LID.to_be_bytes());
    pi[18..20].copy_from_slice(&B_LID.to_be_bytes());
    pi[32] = 0x54;
    {
        let mut f = st(&s.st);
        f.nodes.push(node.clone());
        for port_num in [0, 1] {
            f.portinfos.push(PortInfoRecord {
                lid: B_LID,
                port_num,
                options: 0,
                port_info: pi,
            });
        }
    }
    let nodes = sa_query::node_records(&mut s.r.core, s.sa, s.r.a, 1, T).unwrap();
    assert_eq!(nodes, vec![node.clone()]);
    assert_eq!(nodes[0].desc(), "fake_b 1");
    let req = st(&s.st).requests[0].clone();
    assert_eq!(req.method(), sa_method::GET_TABLE);
    assert_eq!(sa_query::attr_offset(&req), 14);
    let pirs = sa_query::portinfo_records(&mut s.r.core, s.sa, s.r.a, 1, B_LID, T).unwrap();
    assert_eq!(pirs.len(), 2);
    assert_eq!(pirs[1].port_num, 1);
    assert_eq!(
        (pirs[1].base_lid(), pirs[1].sm_lid(), pirs[1].port_state()),
        (B_LID, B_LID, 4)
    );
    let reqs: Vec<(u8, u16, u64)> = st(&s.st)
        .requests
        .iter()
        .map(|m| (m.method(), m.attr_id(), sa_query::comp_mask(m)))
        .collect();
    assert_eq!(
        reqs,
        vec![
            (sa_method::GET_TABLE, sa_attr::NODE_REC, 0),
            (
                sa_method::GET_TABLE,
                sa_attr::PORT_INFO_REC,
                portinfo_comp::LID
            )
        ]
    );
    assert_eq!(
        sa_query::portinfo_records(&mut s.r.core, s.sa, s.r.a, 1, 99, T).unwrap_err(),
        Error::NotFound
    );
}

/// xorshift64*.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_answer(rng: &mut Rng) -> Mad {
    let mut m = Mad::new_request(class::SUBN_ADM, 2, method::GET_RESP, sa_attr::PATH_REC, 0);
    for b in m.0[4..].iter_mut() {
        if rng.below(4) == 0 {
            *b = rng.next() as u8;
        }
    }
    m.set_method(match rng.below(4) {
        0 => method::GET_RESP,
        1 => sa_method::GET_TABLE_RESP,
        2 => rng.next() as u8 | 0x80,
        _ => method::GET_RESP,
    });
    if rng.below(2) == 0 {
        m.set_status(0);
    }
    if rng.below(2) == 0 {
        m.set_attr_id(
            [sa_attr::PATH_REC, sa_attr::NODE_REC, sa_attr::PORT_INFO_REC][rng.below(3) as usize],
        );
    }
    m
}

#[test]
fn fuzz_random_sa_answers_never_panic() {
    // End to end through the wire: random answers to real queries.
    let mut s = sa_rig();
    s.r.clock.set_relax_step(Duration::from_millis(2));
    let mut rng = Rng(0x5a5a_1234_9876_0001);
    let mut outcomes = [0usize; 3];
    for i in 0..1500 {
        st(&s.st).raw_answer = Some(random_answer(&mut rng));
        let t = Duration::from_millis(300);
        let id = match i % 3 {
            0 => sa_query::path_rec_get(
                &mut s.r.core,
                s.sa,
                s.r.a,
                1,
                &PathRecord::default(),
                path_comp::DLID,
                t,
            ),
            1 => sa_query::node_rec_get_table(
                &mut s.r.core,
                s.sa,
                s.r.a,
                1,
                &NodeRecord::default(),
                0,
                t,
            ),
            _ => sa_query::portinfo_rec_get_table(
                &mut s.r.core,
                s.sa,
                s.r.a,
                1,
                &PortInfoRecord::default(),
                0,
                t,
            ),
        }
        .unwrap();
        match sa_query::wait(&mut s.r.core, s.sa, id, t) {
            Ok(r) => {
                let _ = (r.path_records(), r.node_records(), r.portinfo_records());
                outcomes[0] += 1
            }
            Err(Error::TimedOut) => outcomes[1] += 1,
            Err(_) => outcomes[2] += 1,
        }
    }
    // Every query ended one way or another, and nothing is left running.
    assert_eq!(outcomes.iter().sum::<usize>(), 1500);
    assert!(outcomes[0] > 0 && outcomes[2] > 0, "{outcomes:?}");
}

#[test]
fn fuzz_record_parsers_on_random_bytes() {
    // 10^5 random answers through the client's response handler (status,
    // attribute, record splitting, the cache) and the record parsers.
    let mut rng = Rng(0x0bad_cafe_f00d_0001);
    let mut answered = 0;
    for _ in 0..100_000 {
        let m = random_answer(&mut rng);
        let n = rng.below(400) as usize;
        let data: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        let rmpp = (rng.below(2) == 0).then_some(&data[..]);
        let attr =
            [sa_attr::PATH_REC, sa_attr::NODE_REC, sa_attr::PORT_INFO_REC][rng.below(3) as usize];
        if let Some(Ok(resp)) = sa_query_parse_for_fuzz(&m, rmpp, attr) {
            // Whatever was accepted has at least one whole record.
            assert!(!resp.records.is_empty());
            match attr {
                sa_attr::PATH_REC => assert!(resp.path_records().is_ok()),
                sa_attr::NODE_REC => assert!(resp.node_records().is_ok()),
                _ => assert!(resp.portinfo_records().is_ok()),
            }
            answered += 1;
        }
        let _ = PathRecord::unpack(&m.0[56..]);
        let _ = NodeRecord::unpack(&data);
        let _ = PortInfoRecord::unpack(&data);
    }
    assert!(answered > 1000, "only {answered} random answers were whole");
}

#[test]
fn a_node_table_larger_than_one_mad_comes_through_rmpp() {
    let mut s = sa_rig();
    let nodes: Vec<NodeRecord> = (0..5u16)
        .map(|i| {
            let mut desc = [0u8; 64];
            desc[..6].copy_from_slice(b"node 0");
            desc[5] = b'0' + i as u8;
            NodeRecord {
                lid: 100 + i,
                node_info: NodeInfo {
                    node_type: 1,
                    num_ports: 1,
                    node_guid: 0x1000 + u64::from(i),
                    ..NodeInfo::default()
                },
                node_desc: desc,
            }
        })
        .collect();
    st(&s.st).nodes = nodes.clone();
    // 5 * 112 bytes = 560: three segments of 200, 200 and 160 bytes.
    let got = sa_query::node_records(&mut s.r.core, s.sa, s.r.a, 1, T).unwrap();
    assert_eq!(got, nodes);
    assert_eq!(got[4].desc(), "node 4");
    let c = s.r.core.mad_counters(s.r.a, 1).unwrap();
    assert_eq!((c.rmpp_segments, c.rmpp_completed), (3, 1));
    assert_eq!(requests(&s), 1);
}

#[test]
fn running_queries_are_bounded() {
    let mut s = sa_rig();
    st(&s.st).silent = true;
    let rec = PathRecord {
        dlid: B_LID,
        ..PathRecord::default()
    };
    let t = Duration::from_millis(500);
    let mut ids = Vec::new();
    for _ in 0..256 {
        ids.push(
            sa_query::path_rec_get(&mut s.r.core, s.sa, s.r.a, 1, &rec, path_comp::DLID, t)
                .unwrap(),
        );
    }
    assert_eq!(
        sa_query::path_rec_get(&mut s.r.core, s.sa, s.r.a, 1, &rec, path_comp::DLID, t)
            .unwrap_err(),
        Error::Again
    );
    // They all end by their deadline, and room comes back.
    for id in ids {
        assert_eq!(
            sa_query::wait(&mut s.r.core, s.sa, id, t).unwrap_err(),
            Error::TimedOut
        );
    }
    assert!(
        sa_query::path_rec_get(&mut s.r.core, s.sa, s.r.a, 1, &rec, path_comp::DLID, t).is_ok()
    );
}

/// An Ethernet (RoCE) port has no SA: a path is made from the GIDs at once
/// (no LIDs, P_Key 0xffff, the port's MTU, 40 Gb/s), nothing goes on the
/// wire, the address handle built from it has the GRH, and the queries only
/// an SA could answer (and multicast joins) are refused.
#[test]
fn an_ethernet_port_makes_its_paths_locally_and_asks_no_sa() {
    let w = fake::world();
    let da = fake::add_hca(&w, "fake_a", A_GUID, 1, 0);
    let db = fake::add_hca(&w, "fake_b", B_GUID, 1, 0);
    fake::cable(&w, (0, 1), (1, 1));
    for h in lock(&w).hcas.iter_mut() {
        h.ports[0].link_layer = LinkLayer::Ethernet;
        h.ports[0].sm_lid = 0;
        h.ports[0].active_mtu = Mtu::Mtu1024;
    }
    let clock = Arc::new(hal::fake::FakeClock::with_relax_step(
        Duration::from_micros(50),
    ));
    let mut core = crate::device::IbCore::new(clock);
    let a = core.register_device(Box::new(da)).unwrap();
    let _b = core.register_device(Box::new(db)).unwrap();
    let sa = sa_query::init(&mut core);
    core.poll();
    let sgid = core.device(a).unwrap().get_cached_gid(1, 0).unwrap();
    let p = sa_query::path_to_gid(&mut core, sa, a, 1, b_gid(), T).unwrap();
    assert_eq!((p.sgid, p.dgid), (sgid, b_gid()));
    assert_eq!((p.slid, p.dlid, p.pkey, p.hop_limit), (0, 0, 0xffff, 1));
    assert_eq!((p.mtu, p.rate), (Mtu::Mtu1024 as u8, 7));
    let c = sa_query::counters(&mut core, sa, a, 1).unwrap();
    assert_eq!((c.sent, c.local_paths), (0, 1));
    assert!(
        lock(&w)
            .wire
            .iter()
            .all(|p| p.mad.mgmt_class() != class::SUBN_ADM),
        "nothing asked of an SA"
    );
    let ah = sa_query::init_ah_from_path(core.device(a).unwrap(), 1, &p).unwrap();
    let g = ah.grh.expect("the GRH is mandatory on RoCE");
    assert_eq!((g.dgid, g.sgid_index, ah.dlid), (b_gid(), 0, 0));
    assert!(matches!(
        sa_query::node_records(&mut core, sa, a, 1, T),
        Err(Error::NotSupported)
    ));
    let mc = crate::multicast::init(&mut core);
    let mut mgid = [0u8; 16];
    mgid[0] = 0xff;
    mgid[1] = 0x12;
    let rec = McMemberRecord {
        mgid: Gid(mgid),
        port_gid: sgid,
        ..McMemberRecord::default()
    };
    assert!(matches!(
        crate::multicast::join(&mut core, mc, a, 1, &rec, 0),
        Err(Error::NotSupported)
    ));
}
