//! Multicast joins against a small fake SA that keeps groups and members (an agent on the other HCA's QP1, polled as a client).
//!
//! Join and leave, the masks and records on the wire, shared memberships, joins
//! retried with backoff while the SA is silent or refuses, a group MTU the port
//! cannot carry, re-joins after a client-reregister or SM change, `saquery -g`'s
//! table, the verbs' attach checks, and random answers and records.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::fake::lock;
use super::*;
use crate::device::{ClientId, Device, IbClient};
use crate::error::Error;
use crate::mad::*;
use crate::multicast::{self, McastEvent, McastId, MemberState};
use crate::sa_query::{self, *};
use crate::verbs::*;

/// A group the fake SA keeps.
#[derive(Debug, Clone)]
pub struct FakeGroup {
    pub rec: McMemberRecord,
    /// (PortGID, JoinState) of each member port.
    pub members: Vec<(Gid, u8)>,
}

/// What the fake SA does and saw.
#[derive(Default)]
pub struct McSaState {
    /// Requests to ignore before answering (an SA still sweeping).
    pub ignore: usize,
    /// Refuse this many joins with `refuse_status` first.
    pub refuse: usize,
    pub refuse_status: u16,
    /// Replace every answer by these bytes (fuzz).
    pub raw_answer: Option<Mad>,
    /// Every request it received, with the time (ns) it came.
    pub requests: Vec<(u64, Mad)>,
    pub groups: Vec<FakeGroup>,
    pub next_mlid: u16,
}

pub type McSa = Arc<Mutex<McSaState>>;

fn st(s: &McSa) -> std::sync::MutexGuard<'_, McSaState> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct FakeMcSa {
    pub dev: DeviceId,
    pub agent: Option<MadAgent>,
    pub st: McSa,
}

impl McSaState {
    fn answer(&mut self, now: u64, req: &Mad) -> Option<Mad> {
        if req.0[26] & 1 != 0 && req.0[25] != 1 {
            return None; // an RMPP ACK of our table
        }
        self.requests.push((now, req.clone()));
        if self.ignore > 0 {
            self.ignore -= 1;
            return None;
        }
        if let Some(raw) = &self.raw_answer {
            let mut m = raw.clone();
            m.set_tid(req.tid());
            return Some(m);
        }
        let mut resp = req.clone();
        resp.0[56..].fill(0);
        let mask = sa_query::comp_mask(req);
        let q = McMemberRecord::unpack(&req.0[56..]).ok()?;
        let fail = |mut r: Mad, st: u16| {
            r.set_status(st);
            Some(r)
        };
        match req.method() {
            method::SET => {
                resp.set_method(method::GET_RESP);
                if self.refuse > 0 {
                    self.refuse -= 1;
                    return fail(resp, self.refuse_status);
                }
                if mask & mcmember_comp::OPENSM_JOIN != mcmember_comp::OPENSM_JOIN {
                    return fail(resp, sa_status::INSUFFICIENT_COMPONENTS << 8);
                }
                let gi = match self.groups.iter().position(|g| g.rec.mgid == q.mgid) {
                    Some(i) => i,
                    None => {
                        if mask & mcmember_comp::OPENSM_CREATE != mcmember_comp::OPENSM_CREATE {
                            return fail(resp, sa_status::INSUFFICIENT_COMPONENTS << 8);
                        }
                        let mlid = 0xc000 + self.next_mlid;
                        self.next_mlid += 1;
                        self.groups.push(FakeGroup {
                            rec: McMemberRecord {
                                mlid,
                                mtu_selector: 2,
                                mtu: if mask & mcmember_comp::MTU != 0 {
                                    q.mtu
                                } else {
                                    4
                                },
                                rate_selector: 2,
                                rate: 3,
                                scope: 2,
                                ..q
                            },
                            members: Vec::new(),
                        });
                        self.groups.len() - 1
                    }
                };
                let g = &mut self.groups[gi];
                let js = match g.members.iter_mut().find(|(p, _)| *p == q.port_gid) {
                    Some((_, s)) => {
                        *s |= q.join_state;
                        *s
                    }
                    None => {
                        g.members.push((q.port_gid, q.join_state));
                        q.join_state
                    }
                };
                let r = McMemberRecord {
                    port_gid: q.port_gid,
                    join_state: js,
                    ..g.rec
                };
                resp.0[56..108].copy_from_slice(&r.pack());
            }
            sa_method::DELETE => {
                resp.set_method(sa_method::DELETE_RESP);
                let Some(g) = self.groups.iter_mut().find(|g| g.rec.mgid == q.mgid) else {
                    return fail(resp, sa_status::REQ_INVALID << 8);
                };
                let Some(i) = g.members.iter().position(|(p, _)| *p == q.port_gid) else {
                    return fail(resp, sa_status::REQ_INVALID << 8);
                };
                g.members[i].1 &= !q.join_state;
                if g.members[i].1 == 0 {
                    g.members.remove(i);
                }
                let r = McMemberRecord {
                    port_gid: q.port_gid,
                    join_state: q.join_state,
                    ..g.rec
                };
                resp.0[56..108].copy_from_slice(&r.pack());
            }
            sa_method::GET_TABLE => {
                resp.set_method(sa_method::GET_TABLE_RESP);
                let recs: Vec<[u8; 52]> = self.groups.iter().map(|g| g.rec.pack()).collect();
                let n = recs.len().min(3);
                for (i, r) in recs.iter().take(n).enumerate() {
                    resp.0[56 + i * 56..56 + i * 56 + 52].copy_from_slice(r);
                }
                sa_query::set_attr_offset(&mut resp, 7);
                resp.0[24] = 1;
                resp.0[25] = 1;
                resp.0[26] = 0x07;
                resp.0[28..32].copy_from_slice(&1u32.to_be_bytes());
                resp.0[32..36].copy_from_slice(&(20 + 56 * n as u32).to_be_bytes());
            }
            _ => return fail(resp, status::UNSUPPORTED_METHOD_ATTRIB),
        }
        Some(resp)
    }
}

impl IbClient for FakeMcSa {
    fn name(&self) -> &str {
        "fake-mc-sa"
    }
    fn add(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn remove(&mut self, _me: ClientId, _dev: &mut Device) {}
    fn poll(&mut self, _me: ClientId, core: &mut IbCore) -> usize {
        let agent = match self.agent {
            Some(a) => a,
            None => {
                let Ok(a) = core.register_mad_agent(
                    self.dev,
                    1,
                    QpType::Gsi,
                    Some(MadRegReq::new(
                        class::SUBN_ADM,
                        2,
                        &[method::SET, sa_method::DELETE, sa_method::GET_TABLE],
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
            let now = core.clock().now_ns();
            let Some(resp) = st(&self.st).answer(now, &r.mad) else {
                continue;
            };
            let mut buf = MadSendBuf::new(
                resp,
                AhAttr {
                    dlid: r.wc.slid,
                    sl: r.wc.sl,
                    port_num: 1,
                    ..AhAttr::default()
                },
                r.wc.src_qp,
            );
            buf.remote_qkey = IB_QP1_QKEY;
            let _ = core.post_send_mad(agent, buf);
        }
        work
    }
}

pub struct McRig {
    pub r: Rig,
    pub mc: ClientId,
    pub sa: ClientId,
    pub st: McSa,
}

/// The IPv4 broadcast group of the default partition, as OpenSM makes it
/// without a partitions.conf.
pub fn bcast_mgid() -> Gid {
    let mut g = [0u8; 16];
    g[..6].copy_from_slice(&[0xff, 0x12, 0x40, 0x1b, 0xff, 0xff]);
    g[12..].copy_from_slice(&[0xff; 4]);
    Gid(g)
}

fn bcast_group() -> FakeGroup {
    FakeGroup {
        rec: McMemberRecord {
            mgid: bcast_mgid(),
            qkey: 0x0b1b,
            mlid: 0xc000,
            mtu_selector: 2,
            mtu: Mtu::Mtu2048 as u8,
            pkey: 0xffff,
            rate_selector: 2,
            rate: 3,
            sl: 0,
            scope: 2,
            ..McMemberRecord::default()
        },
        members: Vec::new(),
    }
}

/// The rig with B's port 1 the SM (A's SM LID = 20), a fake SA there that
/// knows the IPv4 broadcast group, and the multicast client registered.
pub fn mc_rig() -> McRig {
    mc_rig_with(multicast::McastRetry::default())
}

/// [`mc_rig`] with another retry policy.
pub fn mc_rig_with(retry: multicast::McastRetry) -> McRig {
    let mut r = rig();
    {
        let mut w = lock(&r.world);
        w.hcas[0].ports[0].sm_lid = B_LID;
        w.hcas[1].ports[0].sm_lid = B_LID;
    }
    r.core.device_mut(r.a).unwrap().cache_update(1).unwrap();
    r.core.device_mut(r.b).unwrap().cache_update(1).unwrap();
    let st: McSa = Arc::new(Mutex::new(McSaState {
        groups: vec![bcast_group()],
        next_mlid: 1,
        ..McSaState::default()
    }));
    r.core.register_client(Box::new(FakeMcSa {
        dev: r.b,
        agent: None,
        st: st.clone(),
    }));
    let mc = multicast::init_with(&mut r.core, retry);
    let sa = sa_query::init(&mut r.core);
    r.core.poll();
    McRig { r, mc, sa, st }
}

/// Linux IPoIB's broadcast join: MGID, PortGID, P_Key, JoinState.
fn bcast_join(s: &mut McRig) -> McastId {
    let rec = McMemberRecord {
        mgid: bcast_mgid(),
        port_gid: a_gid(),
        pkey: 0xffff,
        join_state: join_state::FULL_MEMBER,
        ..McMemberRecord::default()
    };
    multicast::join(
        &mut s.r.core,
        s.mc,
        s.r.a,
        1,
        &rec,
        mcmember_comp::IPOIB_BCAST_JOIN,
    )
    .unwrap()
}

pub fn a_gid() -> Gid {
    Gid::new(fake::GID_PREFIX, A_GUID)
}

fn events(s: &mut McRig, id: McastId) -> Vec<McastEvent> {
    let mut v = Vec::new();
    while let Some(e) = multicast::next_event(&mut s.r.core, s.mc, id) {
        v.push(e);
    }
    v
}

fn requests(s: &McRig) -> Vec<(u64, Mad)> {
    st(&s.st).requests.clone()
}

fn members(sa: &McSa, mgid: Gid) -> Vec<(Gid, u8)> {
    st(sa)
        .groups
        .iter()
        .find(|g| g.rec.mgid == mgid)
        .map(|g| g.members.clone())
        .unwrap_or_default()
}

const T: Duration = Duration::from_secs(10);

#[test]
fn join_and_leave_the_broadcast_group_as_ipoib_does() {
    let mut s = mc_rig();
    let id = bcast_join(&mut s);
    let rec = multicast::wait_joined(&mut s.r.core, s.mc, id, T).unwrap();
    // The SA's answer is what the member uses: Q_Key learned, not assumed.
    assert_eq!(rec.qkey, 0x0b1b);
    assert_eq!(rec.mlid, 0xc000);
    assert_eq!(rec.mtu, Mtu::Mtu2048 as u8);
    assert_eq!((rec.rate, rec.sl, rec.pkey), (3, 0, 0xffff));
    assert_eq!(rec.port_gid, a_gid());
    // One SubnAdmSet of an MCMemberRecord with Linux's broadcast mask.
    let reqs = requests(&s);
    assert_eq!(reqs.len(), 1);
    let m = &reqs[0].1;
    assert_eq!((m.mgmt_class(), m.method()), (class::SUBN_ADM, method::SET));
    assert_eq!(m.attr_id(), sa_attr::MC_MEMBER_REC);
    assert_eq!(sa_query::comp_mask(m), mcmember_comp::IPOIB_BCAST_JOIN);
    let q = McMemberRecord::unpack(&m.0[56..]).unwrap();
    assert_eq!(
        (q.mgid, q.port_gid, q.pkey),
        (bcast_mgid(), a_gid(), 0xffff)
    );
    assert_eq!(q.join_state, join_state::FULL_MEMBER);
    assert_eq!(members(&s.st, bcast_mgid()), vec![(a_gid(), 1)]);
    assert_eq!(events(&mut s, id), vec![McastEvent::Joined(rec)]);
    let st = multicast::status(&mut s.r.core, s.mc, id).unwrap();
    assert_eq!(
        (st.state, st.generation, st.tries),
        (MemberState::Joined, 1, 0)
    );
    // ib_sa_get_mcmember_rec and ib_init_ah_from_mcmember.
    let got = multicast::get_mcmember_rec(&mut s.r.core, s.mc, s.r.a, 1, &bcast_mgid()).unwrap();
    assert_eq!(got, rec);
    let ah = multicast::init_ah_from_mcmember(s.r.core.device(s.r.a).unwrap(), 1, &rec).unwrap();
    assert_eq!(
        (ah.dlid, ah.sl, ah.port_num, ah.static_rate),
        (0xc000, 0, 1, 3)
    );
    let grh = ah.grh.unwrap();
    assert_eq!((grh.dgid, grh.sgid_index), (bcast_mgid(), 0));
    // Leave: a SubnAdmDelete of the full-member bit; the SA forgets us.
    multicast::leave(&mut s.r.core, s.mc, id).unwrap();
    let ok =
        s.r.core
            .poll_until(T, |c| {
                let n = multicast::counters(c, s.mc, s.r.a, 1).unwrap();
                (n.leaves_sent == 1 && !members(&s.st, bcast_mgid()).contains(&(a_gid(), 1)))
                    .then_some(())
            })
            .is_ok();
    assert!(ok, "the leave reached the SA");
    let reqs = requests(&s);
    let d = &reqs[1].1;
    assert_eq!(d.method(), sa_method::DELETE);
    assert_eq!(
        sa_query::comp_mask(d),
        mcmember_comp::MGID | mcmember_comp::PORT_GID | mcmember_comp::JOIN_STATE
    );
    assert_eq!(McMemberRecord::unpack(&d.0[56..]).unwrap().join_state, 1);
    assert_eq!(
        multicast::status(&mut s.r.core, s.mc, id),
        Err(Error::NotFound)
    );
    assert_eq!(
        multicast::get_mcmember_rec(&mut s.r.core, s.mc, s.r.a, 1, &bcast_mgid()),
        Err(Error::NotFound)
    );
    s.r.core.poll();
    let c = multicast::counters(&mut s.r.core, s.mc, s.r.a, 1).unwrap();
    assert_eq!((c.joins_sent, c.joins_ok, c.leave_errors), (1, 1, 0));
    assert!(
        multicast::groups(&mut s.r.core, s.mc, s.r.a, 1)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn two_members_of_one_group_share_the_ports_membership() {
    let mut s = mc_rig();
    let a = bcast_join(&mut s);
    multicast::wait_joined(&mut s.r.core, s.mc, a, T).unwrap();
    let b = bcast_join(&mut s);
    let rb = multicast::wait_joined(&mut s.r.core, s.mc, b, T).unwrap();
    assert_eq!(rb.mlid, 0xc000);
    assert_eq!(
        requests(&s).len(),
        1,
        "the second member did not ask the SA"
    );
    let c = multicast::counters(&mut s.r.core, s.mc, s.r.a, 1).unwrap();
    assert_eq!((c.joins_sent, c.joins_shared), (1, 1));
    // The first leaves: the membership stays for the second.
    multicast::leave(&mut s.r.core, s.mc, a).unwrap();
    s.r.core.poll();
    assert_eq!(requests(&s).len(), 1, "no Delete while a member needs it");
    assert_eq!(members(&s.st, bcast_mgid()), vec![(a_gid(), 1)]);
    let g = multicast::groups(&mut s.r.core, s.mc, s.r.a, 1).unwrap();
    assert_eq!((g.len(), g[0].members, g[0].join_state), (1, 1, 1));
    multicast::leave(&mut s.r.core, s.mc, b).unwrap();
    s.r.core
        .poll_until(T, |_| members(&s.st, bcast_mgid()).is_empty().then_some(()))
        .unwrap();
    assert_eq!(requests(&s)[1].1.method(), sa_method::DELETE);
}

#[test]
fn a_new_group_is_created_with_the_create_mask_and_its_answer_used() {
    let mut s = mc_rig();
    let mut mgid = bcast_mgid().0;
    mgid[15] = 0x01; // ff12:401b:ffff::1, an IPv4 multicast group
    let rec = McMemberRecord {
        mgid: Gid(mgid),
        qkey: 0x0b1b,
        mtu_selector: 2,
        mtu: Mtu::Mtu2048 as u8,
        pkey: 0xffff,
        rate_selector: 2,
        rate: 3,
        ..McMemberRecord::default()
    };
    // Only the join mask: the SA cannot create the group.
    let id = multicast::join(
        &mut s.r.core,
        s.mc,
        s.r.a,
        1,
        &rec,
        mcmember_comp::IPOIB_BCAST_JOIN,
    )
    .unwrap();
    let e = multicast::wait_joined(&mut s.r.core, s.mc, id, Duration::from_millis(200));
    assert_eq!(
        e,
        Err(Error::MadStatus(sa_status::INSUFFICIENT_COMPONENTS << 8))
    );
    assert!(
        sa_status_str(sa_status::INSUFFICIENT_COMPONENTS << 8)
            .unwrap()
            .contains("component mask")
    );
    multicast::leave(&mut s.r.core, s.mc, id).unwrap();
    // With Linux's create mask (port GID filled in from the cache) it is.
    let id = multicast::join(
        &mut s.r.core,
        s.mc,
        s.r.a,
        1,
        &rec,
        mcmember_comp::IPOIB_CREATE,
    )
    .unwrap();
    let got = multicast::wait_joined(&mut s.r.core, s.mc, id, T).unwrap();
    assert_eq!((got.mgid, got.mlid, got.qkey), (Gid(mgid), 0xc001, 0x0b1b));
    let reqs = requests(&s);
    let last = &reqs.last().unwrap().1;
    assert_eq!(
        sa_query::comp_mask(last),
        mcmember_comp::IPOIB_CREATE | mcmember_comp::PORT_GID
    );
    assert_eq!(
        McMemberRecord::unpack(&last.0[56..]).unwrap().port_gid,
        a_gid()
    );
}

#[test]
fn a_join_is_retried_with_backoff_while_the_sa_is_silent() {
    let mut s = mc_rig();
    // OpenSM ignores the SA until its first sweep ends: more requests
    // than one join's 3 s of MAD retries.
    st(&s.st).ignore = 8;
    let t0 = s.r.core.clock().now_ns();
    let id = bcast_join(&mut s);
    let rec = multicast::wait_joined(&mut s.r.core, s.mc, id, Duration::from_secs(30)).unwrap();
    assert_eq!(rec.qkey, 0x0b1b);
    let ev = events(&mut s, id);
    assert!(
        ev.len() >= 2
            && ev[..ev.len() - 1]
                .iter()
                .all(|e| *e == McastEvent::Failed(Error::TimedOut)),
        "{ev:?}"
    );
    assert_eq!(ev.last(), Some(&McastEvent::Joined(rec)));
    let c = multicast::counters(&mut s.r.core, s.mc, s.r.a, 1).unwrap();
    assert_eq!(c.join_timeouts, ev.len() as u64 - 1);
    assert_eq!(c.joins_ok, 1);
    // Each join gave the SA its 3 s, and waited 1 s (then 2 s, ...) before
    // the next: the answer came after at least 3 + 1 s.
    let t = s.r.core.clock().now_ns() - t0;
    assert!(t >= 4_000_000_000, "joined after {t} ns");
    let reqs = requests(&s);
    let gaps: Vec<u64> = reqs.windows(2).map(|w| w[1].0 - w[0].0).collect();
    assert!(
        gaps.iter().any(|g| *g >= 1_000_000_000),
        "a backoff of at least 1 s between two joins: {gaps:?}"
    );
    let st = multicast::status(&mut s.r.core, s.mc, id).unwrap();
    assert_eq!((st.tries, st.last_error), (0, None));
}

#[test]
fn a_refused_join_is_a_clear_error_and_is_tried_again_with_a_growing_backoff() {
    let mut s = mc_rig();
    {
        let mut g = st(&s.st);
        g.refuse = 3;
        g.refuse_status = sa_status::REQ_INVALID << 8;
    }
    let id = bcast_join(&mut s);
    // Within a short deadline: the SA's refusal, not a bare timeout.
    let e = multicast::wait_joined(&mut s.r.core, s.mc, id, Duration::from_millis(500));
    assert_eq!(e, Err(Error::MadStatus(0x0200)));
    let st1 = multicast::status(&mut s.r.core, s.mc, id).unwrap();
    assert_eq!(st1.state, MemberState::Joining);
    assert_eq!(st1.last_error, Some(Error::MadStatus(0x0200)));
    // It keeps trying: joined once the SA stops refusing.
    let rec = multicast::wait_joined(&mut s.r.core, s.mc, id, Duration::from_secs(60)).unwrap();
    assert_eq!(rec.mlid, 0xc000);
    let ev = events(&mut s, id);
    assert_eq!(
        ev,
        vec![
            McastEvent::Failed(Error::MadStatus(0x0200)),
            McastEvent::Failed(Error::MadStatus(0x0200)),
            McastEvent::Failed(Error::MadStatus(0x0200)),
            McastEvent::Joined(rec),
        ]
    );
    // The tries were 1 s, 2 s and 4 s apart (each answered at once).
    let t: Vec<u64> = requests(&s).iter().map(|r| r.0).collect();
    assert_eq!(t.len(), 4);
    for (k, want) in [1u64, 2, 4].iter().enumerate() {
        let gap = t[k + 1] - t[k];
        assert!(
            gap >= want * 1_000_000_000 && gap < (want + 1) * 1_000_000_000,
            "try {k}: {gap} ns after the previous, want {want} s"
        );
    }
    let c = multicast::counters(&mut s.r.core, s.mc, s.r.a, 1).unwrap();
    assert_eq!((c.joins_refused, c.joins_ok), (3, 1));
}

#[test]
fn a_group_whose_mtu_the_port_cannot_carry_is_refused_and_left() {
    let mut s = mc_rig();
    st(&s.st).groups[0].rec.mtu = Mtu::Mtu4096 as u8;
    lock(&s.r.world).hcas[0].ports[0].active_mtu = Mtu::Mtu2048;
    let id = bcast_join(&mut s);
    let e = multicast::wait_joined(&mut s.r.core, s.mc, id, Duration::from_millis(500));
    let Err(Error::Invalid(msg)) = e else {
        panic!("{e:?}")
    };
    assert!(msg.contains("MTU"), "{msg}");
    // The SA made us a member; we told it we are not.
    s.r.core
        .poll_until(Duration::from_millis(500), |_| {
            members(&s.st, bcast_mgid()).is_empty().then_some(())
        })
        .unwrap();
    let reqs = requests(&s);
    assert_eq!(reqs[1].1.method(), sa_method::DELETE);
    let c = multicast::counters(&mut s.r.core, s.mc, s.r.a, 1).unwrap();
    assert_eq!((c.mtu_refusals, c.joins_ok), (1, 0));
    assert_eq!(
        multicast::status(&mut s.r.core, s.mc, id).unwrap().state,
        MemberState::Joining
    );
    // A port that carries it (the SM raised the MTU) is joined on a retry.
    lock(&s.r.world).hcas[0].ports[0].active_mtu = Mtu::Mtu4096;
    let rec = multicast::wait_joined(&mut s.r.core, s.mc, id, T).unwrap();
    assert_eq!(rec.mtu, Mtu::Mtu4096 as u8);
}

fn reregistered_members_join_again(ev: EventType) {
    let mut s = mc_rig();
    let id = bcast_join(&mut s);
    let r1 = multicast::wait_joined(&mut s.r.core, s.mc, id, T).unwrap();
    let _ = events(&mut s, id);
    // A new SM that knows nothing of us (the group keeps its MLID, as
    // OpenSM's broadcast group would get another one on restart).
    {
        let mut g = st(&s.st);
        g.groups[0].members.clear();
        g.groups[0].rec.mlid = 0xc005;
    }
    lock(&s.r.world).hcas[0]
        .events
        .push_back(Event::port(ev, 1));
    s.r.core
        .poll_until(T, |c| {
            let st = multicast::status(c, s.mc, id).ok()?;
            (st.generation == 2).then_some(())
        })
        .unwrap();
    let st = multicast::status(&mut s.r.core, s.mc, id).unwrap();
    assert_eq!(st.state, MemberState::Joined);
    let r2 = st.rec.unwrap();
    assert_eq!((r1.mlid, r2.mlid), (0xc000, 0xc005));
    assert_eq!(
        events(&mut s, id),
        vec![McastEvent::Reset, McastEvent::Joined(r2)]
    );
    assert_eq!(members(&s.st, bcast_mgid()), vec![(a_gid(), 1)]);
    let reqs = requests(&s);
    assert_eq!(reqs.len(), 2);
    assert!(reqs.iter().all(|r| r.1.method() == method::SET));
    assert_eq!(
        multicast::counters(&mut s.r.core, s.mc, s.r.a, 1)
            .unwrap()
            .resets,
        1
    );
}

#[test]
fn members_join_again_after_a_client_reregister() {
    reregistered_members_join_again(EventType::ClientReregister);
}

#[test]
fn members_join_again_after_an_sm_change() {
    reregistered_members_join_again(EventType::SmChange);
}

#[test]
fn a_join_on_the_wire_during_a_reset_is_sent_again() {
    let mut s = mc_rig();
    st(&s.st).ignore = 1;
    let id = bcast_join(&mut s);
    lock(&s.r.world).hcas[0]
        .events
        .push_back(Event::port(EventType::ClientReregister, 1));
    let rec = multicast::wait_joined(&mut s.r.core, s.mc, id, T).unwrap();
    assert_eq!(rec.mlid, 0xc000);
    // The reset dropped the first join and sent a new one at once (no
    // timeout on the way).
    let c = multicast::counters(&mut s.r.core, s.mc, s.r.a, 1).unwrap();
    assert_eq!((c.joins_sent, c.join_timeouts, c.resets), (2, 0, 1));
}

#[test]
fn port_active_brings_a_backed_off_join_forward() {
    let mut s = mc_rig();
    {
        let mut g = st(&s.st);
        g.refuse = 1;
        g.refuse_status = sa_status::NO_RESOURCES << 8;
    }
    let id = bcast_join(&mut s);
    s.r.core
        .poll_until(T, |c| {
            (multicast::counters(c, s.mc, s.r.a, 1)?.joins_refused == 1).then_some(())
        })
        .unwrap();
    let t0 = s.r.core.clock().now_ns();
    lock(&s.r.world).hcas[0]
        .events
        .push_back(Event::port(EventType::PortActive, 1));
    multicast::wait_joined(&mut s.r.core, s.mc, id, T).unwrap();
    let t = s.r.core.clock().now_ns() - t0;
    assert!(
        t < 500_000_000,
        "joined {t} ns after PORT_ACTIVE, not after the 1 s backoff"
    );
}

#[test]
fn get_table_lists_the_groups() {
    let mut s = mc_rig();
    let mut g2 = bcast_group();
    g2.rec.mgid.0[15] = 1;
    g2.rec.mlid = 0xc001;
    st(&s.st).groups.push(g2);
    let recs = sa_query::mcmember_records(&mut s.r.core, s.sa, s.r.a, 1, T).unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!((recs[0].mgid, recs[0].mlid), (bcast_mgid(), 0xc000));
    assert_eq!(recs[1].mlid, 0xc001);
    let m = &requests(&s)[0].1;
    assert_eq!(m.method(), sa_method::GET_TABLE);
    assert_eq!(sa_query::comp_mask(m), 0);
    assert_eq!(sa_query::attr_offset(m), 7);
    st(&s.st).groups.clear();
    assert!(
        sa_query::mcmember_records(&mut s.r.core, s.sa, s.r.a, 1, T)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn bad_joins_and_attaches_are_refused() {
    let mut s = mc_rig();
    let (core, mc, a) = (&mut s.r.core, s.mc, s.r.a);
    let good = McMemberRecord {
        mgid: bcast_mgid(),
        ..McMemberRecord::default()
    };
    let unicast = McMemberRecord {
        mgid: a_gid(),
        ..good
    };
    assert!(matches!(
        multicast::join(core, mc, a, 1, &unicast, mcmember_comp::OPENSM_JOIN),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        multicast::join(core, mc, a, 2, &good, mcmember_comp::OPENSM_JOIN),
        Err(Error::Invalid(_))
    ));
    let big = McMemberRecord {
        join_state: 0x10,
        ..good
    };
    assert!(matches!(
        multicast::join(core, mc, a, 1, &big, mcmember_comp::OPENSM_JOIN),
        Err(Error::Invalid(_))
    ));
    let gone = McastId {
        dev: a,
        port: 1,
        seq: 999,
    };
    assert_eq!(multicast::leave(core, mc, gone), Err(Error::NotFound));
    assert_eq!(multicast::next_event(core, mc, gone), None);
    // The AH of a record with a unicast LID or an unknown port GID.
    let d = core.device(a).unwrap();
    let rec = McMemberRecord {
        mgid: bcast_mgid(),
        port_gid: a_gid(),
        mlid: 0x10,
        ..McMemberRecord::default()
    };
    assert!(multicast::init_ah_from_mcmember(d, 1, &rec).is_err());
    let rec = McMemberRecord {
        mlid: 0xc000,
        port_gid: Gid::new(1, 2),
        ..rec
    };
    assert!(multicast::init_ah_from_mcmember(d, 1, &rec).is_err());
    // Verbs: attach only a UD QP, to a multicast GID and LID.
    let dev = core.device_mut(a).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let (cq, _) = dev
        .create_cq(&CqInitAttr {
            cqe: 8,
            ..CqInitAttr::default()
        })
        .unwrap();
    let qp_of = |dev: &mut Device, t: QpType| {
        dev.create_qp(
            pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap::default(),
                sq_sig_type: SigType::AllWr,
                qp_type: t,
                create_flags: QpCreateFlags::BLOCK_MULTICAST_LOOPBACK,
                port_num: 1,
            },
        )
        .unwrap()
        .0
    };
    let ud = qp_of(dev, QpType::Ud);
    let rc = qp_of(dev, QpType::Rc);
    let g = bcast_mgid();
    assert!(matches!(
        dev.attach_mcast(rc, &g, 0xc000),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        dev.attach_mcast(ud, &a_gid(), 0xc000),
        Err(Error::Invalid(_))
    ));
    for lid in [0, 0x10, 0xbfff, 0xffff] {
        assert!(
            matches!(dev.attach_mcast(ud, &g, lid), Err(Error::Invalid(_))),
            "LID {lid:#x}"
        );
    }
    dev.attach_mcast(ud, &g, 0xc000).unwrap();
    dev.detach_mcast(ud, &g, 0xc000).unwrap();
    assert!(dev.detach_mcast(ud, &g, 0xc000).is_err());
    assert_eq!(
        dev.query_qp(ud, QpAttrMask::empty())
            .unwrap()
            .1
            .create_flags,
        QpCreateFlags::BLOCK_MULTICAST_LOOPBACK
    );
    lock(&s.r.world).hcas[0].no_mcast = true;
    let dev = s.r.core.device_mut(a).unwrap();
    assert_eq!(dev.attach_mcast(ud, &g, 0xc000), Err(Error::NoSys));
}

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn mcmember_record_parse_fuzz() {
    let mut rng = Rng(0x5eed_0038);
    for len in 0..80usize {
        for _ in 0..200 {
            let b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            match McMemberRecord::unpack(&b) {
                Err(_) => assert!(len < 52),
                Ok(r) => {
                    // Every field comes back; only the reserved bits differ.
                    let p = r.pack();
                    let mut want = [0u8; 52];
                    want.copy_from_slice(&b[..52]);
                    want[49] &= 0x80;
                    want[50] = 0;
                    want[51] = 0;
                    assert_eq!(p, want);
                    assert_eq!(McMemberRecord::unpack(&p).unwrap(), r);
                }
            }
        }
    }
}

#[test]
fn random_answers_to_joins_are_failures_not_panics() {
    // Short tries and backoffs: many joins in little time.
    let mut s = mc_rig_with(multicast::McastRetry {
        try_ms: 50,
        backoff_ms: 1,
        max_backoff_ms: 2,
    });
    let mut rng = Rng(0xfeed_0038);
    let id = bcast_join(&mut s);
    for _ in 0..300 {
        let mut m = Mad::default();
        for b in m.0.iter_mut() {
            *b = rng.next() as u8;
        }
        // Mostly plausible SA responses, so the parser is reached.
        if !rng.next().is_multiple_of(4) {
            m.0[0] = 1;
            m.0[1] = class::SUBN_ADM;
            m.0[2] = 2;
            m.0[3] = if rng.next().is_multiple_of(3) {
                method::GET_RESP
            } else {
                sa_method::GET_TABLE_RESP
            };
            if rng.next().is_multiple_of(2) {
                m.0[4] = 0;
                m.0[5] = 0;
            }
            m.0[16..18].copy_from_slice(&sa_attr::MC_MEMBER_REC.to_be_bytes());
            m.0[24..28].fill(0);
        }
        st(&s.st).raw_answer = Some(m);
        for _ in 0..50 {
            s.r.core.poll();
            s.r.core.clock().relax();
        }
    }
    // Whatever happened, each answer ended a join (a refusal, a bad
    // answer, or by luck a grant), and the port's client still works once
    // the SA does.
    let c = multicast::counters(&mut s.r.core, s.mc, s.r.a, 1).unwrap();
    assert!(c.joins_sent > 20, "{c:?}");
    assert!(c.joins_refused > 5 && c.join_errors > 10, "{c:?}");
    st(&s.st).raw_answer = None;
    multicast::leave(&mut s.r.core, s.mc, id).unwrap();
    let id = bcast_join(&mut s);
    let rec = multicast::wait_joined(&mut s.r.core, s.mc, id, Duration::from_secs(60)).unwrap();
    assert_eq!(rec.mgid, bcast_mgid());
}
