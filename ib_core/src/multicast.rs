//! Port of Linux `drivers/infiniband/core/multicast.c` (3.11), busy-polled: joining and leaving multicast groups through the SA, one membership per port and group shared by its members, joins retried with backoff and made again when the SM asks clients to re-register.
//!
//! Present but not built in LegoOS. A join is a SubnAdmSet of an MCMemberRecord (JoinState
//! full member, or what the caller asks), a leave a SubnAdmDelete of the bits
//! no remaining member needs, both through [`crate::sa_query`]. Left out: groups
//! whose MGID the SA assigns (a join with a zero MGID), the callback interface
//! (members poll their state and events instead, see below), and the P_Key
//! event of later kernels.
//!
//! # How it works
//!
//! Each port keeps its groups by MGID (Linux's `mcast_group` rb-tree); each
//! group its members (`mcast_member`), the JoinState bits it holds at the SA
//! and the SA's answer (the group's Q_Key, MLID, MTU, rate, SL, flow label
//! and hop limit), which every member is given. At most one join is on the
//! wire per group; members wait their turn in join order (Linux's pending
//! list), and a member whose bits the group holds already is joined without
//! asking the SA.
//!
//! A join that fails (the SA refuses it, does not answer within
//! [`McastRetry::try_ms`] — OpenSM ignores the SA until its first sweep
//! ends — or answers a group whose MTU is larger than the port's active MTU)
//! is reported to the member and tried again after a backoff that doubles up
//! to [`McastRetry::max_backoff_ms`], for as long as the member exists, as
//! Linux's IPoIB does with its broadcast join. A group refused for its MTU is
//! left at once (the SA counted us a member).
//!
//! On PORT_ERR, LID_CHANGE, SM_CHANGE and CLIENT_REREGISTER (`mcast_event_handler`)
//! every group of the port forgets its membership and every member is told
//! ([`McastEvent::Reset`], Linux's `-ENETRESET`) and joined again, so the new
//! SM knows the members; PORT_ACTIVE brings a backed-off join forward.
//!
//! # Using it
//!
//! [`init`] once (it registers the SA client too), then [`join`] with the
//! record and component mask the ULP builds (Linux IPoIB's broadcast join:
//! MGID, PortGID, P_Key and JoinState, [`mcmember_comp::IPOIB_BCAST_JOIN`]);
//! [`status`] or [`next_event`] (or [`wait_joined`] against a deadline) tell
//! when the member is joined and with what record; [`leave`] ends the
//! membership (`ib_sa_free_multicast`). [`init_ah_from_mcmember`] makes the
//! address vector of a group (send to QPN [`IB_MULTICAST_QPN`] with the
//! group's Q_Key); the QP is attached to the MGID with the verbs
//! ([`crate::Device::attach_mcast`]).

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::time::Duration;

use crate::device::{ClientId, Device, DeviceId, IbClient, IbCore};
use crate::error::{Error, Result};
use crate::mad::method;
use crate::sa_query::{self, McMemberRecord, SaQueryId, mcmember_comp, sa_method};
use crate::verbs::{AhAttr, Event, EventElement, EventType, Gid, GlobalRoute, Mtu};

/// The destination QPN of a multicast datagram (`IB_MULTICAST_QPN`).
pub const IB_MULTICAST_QPN: u32 = 0xff_ffff;

/// Events a member's mailbox keeps; older ones go first.
const MAX_EVENTS: usize = 32;
/// Members per port; more joins are refused with `-ENOMEM`.
const MAX_MEMBERS: usize = 256;

/// Retry policy of the multicast client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McastRetry {
    /// How long one join may take at the SA client (its MAD retries
    /// included): Linux's `send_join` gives 3000 ms.
    pub try_ms: u32,
    /// Wait after the first failed join; doubles after each failure.
    pub backoff_ms: u32,
    /// The backoff stops doubling here (Linux IPoIB: 16 s).
    pub max_backoff_ms: u32,
}

impl Default for McastRetry {
    fn default() -> Self {
        McastRetry {
            try_ms: 3000,
            backoff_ms: 1000,
            max_backoff_ms: 16_000,
        }
    }
}

/// A membership, as the ULP names it (Linux's `struct ib_sa_multicast`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct McastId {
    /// Device.
    pub dev: DeviceId,
    /// Port.
    pub port: u8,
    /// Sequence number on that port.
    pub seq: u64,
}

/// Where a member stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Waiting for its join (on the wire, waiting its turn, or backing
    /// off after a failure).
    Joining,
    /// Joined: the group's record is the SA's answer.
    Joined,
}

/// A member's state as [`status`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStatus {
    /// Joining or joined.
    pub state: MemberState,
    /// The group's record (the SA's answer) while joined.
    pub rec: Option<McMemberRecord>,
    /// Failed joins since the member last joined.
    pub tries: u32,
    /// Why the last join failed, if one did since the member last joined.
    pub last_error: Option<Error>,
    /// Times the member was joined (a join made again after a reset counts
    /// once more: a ULP that sees it change rebuilds its address handle).
    pub generation: u32,
}

/// What a member is told, in order (Linux's member callback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McastEvent {
    /// Joined (again): the group's record, whose Q_Key, MLID, MTU, rate,
    /// SL, flow label and hop limit the member uses (callback status 0).
    Joined(McMemberRecord),
    /// A join failed; it is tried again after the backoff (callback with
    /// the error).
    Failed(Error),
    /// The port's membership was lost (PORT_ERR, LID_CHANGE, SM_CHANGE,
    /// CLIENT_REREGISTER: Linux's `-ENETRESET`); the member is being joined
    /// again.
    Reset,
}

/// What the multicast client of one port counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct McastCounters {
    /// Joins sent to the SA (SubnAdmSet).
    pub joins_sent: u64,
    /// Joins the SA granted and the member took.
    pub joins_ok: u64,
    /// Joins the SA refused (a MAD status).
    pub joins_refused: u64,
    /// Joins the SA did not answer in time.
    pub join_timeouts: u64,
    /// Joins granted for a group whose MTU the port cannot carry.
    pub mtu_refusals: u64,
    /// Other failed joins (a bad answer, the port gone).
    pub join_errors: u64,
    /// Members joined from the group's membership without asking the SA.
    pub joins_shared: u64,
    /// Leaves sent (SubnAdmDelete).
    pub leaves_sent: u64,
    /// Leaves the SA did not acknowledge (refused or unanswered).
    pub leave_errors: u64,
    /// Times the port's groups were reset by an event.
    pub resets: u64,
}

/// One group of a port, as [`groups`] shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupInfo {
    /// MGID.
    pub mgid: Gid,
    /// The SA's last answer (while the group holds a membership).
    pub rec: Option<McMemberRecord>,
    /// JoinState bits held at the SA.
    pub join_state: u8,
    /// Members.
    pub members: usize,
}

struct Member {
    seq: u64,
    /// The request: record and component mask as the ULP gave them.
    rec: McMemberRecord,
    comp_mask: u64,
    state: MemberState,
    tries: u32,
    last_error: Option<Error>,
    generation: u32,
    events: VecDeque<McastEvent>,
    /// Next try (model-clock nanoseconds) while joining.
    next_try_ns: u64,
    backoff_ms: u32,
}

impl Member {
    fn push(&mut self, e: McastEvent) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }
}

/// A join on the wire: the SA query, the member it is for and the bits it
/// asks.
#[derive(Debug, Clone, Copy)]
struct Joining {
    query: SaQueryId,
    seq: u64,
    bits: u8,
}

struct Group {
    mgid: Gid,
    rec: Option<McMemberRecord>,
    join_state: u8,
    joining: Option<Joining>,
    members: Vec<Member>,
}

struct McPort {
    port: u8,
    groups: Vec<Group>,
    /// Leaves on the wire (their answers are only counted).
    leaves: Vec<SaQueryId>,
    next_seq: u64,
    /// An event asked for every group to be reset / every backed-off join
    /// to be tried now (taken by the next poll, which has the clock).
    reset: bool,
    kick: bool,
    counters: McastCounters,
}

/// Per-device multicast state (`struct mcast_device`), in the device's
/// client data.
struct McDevice {
    sa: ClientId,
    retry: McastRetry,
    ports: Vec<McPort>,
}

struct McSlot(Option<McDevice>);

/// The multicast client (`mcast_client`: `mcast_add_one`,
/// `mcast_remove_one`, `mcast_event_handler`).
pub struct McastClient {
    sa: ClientId,
    retry: McastRetry,
}

/// `mcast_init`: registers the multicast client (and the SA client it asks
/// through, [`sa_query::init`]) and returns its id. One per core, as the
/// SA client: a later call returns the client already registered.
#[doc(alias = "mcast_init")]
pub fn init(core: &mut IbCore) -> ClientId {
    init_with(core, McastRetry::default())
}

/// [`init`] with another retry policy (the first registration's wins).
pub fn init_with(core: &mut IbCore, retry: McastRetry) -> ClientId {
    const NAME: &str = "multicast";
    if let Some(id) = core.client_by_name(NAME) {
        return id;
    }
    let sa = sa_query::init(core);
    core.register_client(Box::new(McastClient { sa, retry }))
}

impl IbClient for McastClient {
    fn name(&self) -> &str {
        "multicast"
    }
    fn accepts(&self, _n: crate::verbs::NodeType, t: crate::verbs::Transport) -> bool {
        t == crate::verbs::Transport::Ib
    }
    #[doc(alias = "mcast_add_one")]
    fn add(&mut self, me: ClientId, dev: &mut Device) {
        let ports = (1..=dev.phys_port_cnt())
            .map(|port| McPort {
                port,
                groups: Vec::new(),
                leaves: Vec::new(),
                next_seq: 1,
                reset: false,
                kick: false,
                counters: McastCounters::default(),
            })
            .collect();
        dev.set_client_data(
            me,
            Box::new(McSlot(Some(McDevice {
                sa: self.sa,
                retry: self.retry,
                ports,
            }))),
        );
    }
    #[doc(alias = "mcast_remove_one")]
    fn remove(&mut self, _me: ClientId, _dev: &mut Device) {
        // The memberships go with the device; the SM forgets them when the
        // port goes down.
    }
    #[doc(alias = "mcast_event_handler")]
    fn event(&mut self, me: ClientId, dev: &mut Device, ev: &Event) {
        let EventElement::Port(p) = ev.element else {
            return;
        };
        let Some(McSlot(Some(md))) = dev.client_data::<McSlot>(me) else {
            return;
        };
        let Some(mp) = md.ports.iter_mut().find(|x| x.port == p) else {
            return;
        };
        match ev.event {
            EventType::PortErr
            | EventType::LidChange
            | EventType::SmChange
            | EventType::ClientReregister => mp.reset = true,
            EventType::PortActive => mp.kick = true,
            _ => {}
        }
    }
    fn poll(&mut self, me: ClientId, core: &mut IbCore) -> usize {
        let mut work = 0;
        for i in 0..core.devices.len() {
            let dev = DeviceId(i as u32);
            if core.devices[i].is_none() {
                continue;
            }
            work += with_mc(core, me, dev, |core, md| {
                let (sa, retry) = (md.sa, md.retry);
                let mut w = 0;
                for mp in md.ports.iter_mut() {
                    w += process_port(core, sa, retry, dev, mp);
                }
                Ok(w)
            })
            .unwrap_or(0);
        }
        work
    }
}

fn with_mc<T>(
    core: &mut IbCore,
    mc: ClientId,
    dev: DeviceId,
    f: impl FnOnce(&mut IbCore, &mut McDevice) -> Result<T>,
) -> Result<T> {
    let d = core.device_mut(dev).ok_or(Error::NoDev)?;
    let slot = d.client_data::<McSlot>(mc).ok_or(Error::NoDev)?;
    let mut md = slot.0.take().ok_or(Error::Busy)?;
    let r = f(core, &mut md);
    if let Some(d) = core.device_mut(dev)
        && let Some(slot) = d.client_data::<McSlot>(mc)
    {
        slot.0 = Some(md);
    }
    r
}

fn port_of(md: &mut McDevice, port: u8) -> Result<&mut McPort> {
    md.ports
        .iter_mut()
        .find(|p| p.port == port)
        .ok_or(Error::Invalid("port number out of range"))
}

fn now_ns(core: &IbCore) -> u64 {
    core.clock().now_ns()
}

fn fail_member(m: &mut Member, e: Error, now: u64, retry: McastRetry) {
    m.state = MemberState::Joining;
    m.tries = m.tries.saturating_add(1);
    m.last_error = Some(e);
    m.push(McastEvent::Failed(e));
    m.next_try_ns = now.saturating_add(u64::from(m.backoff_ms) * 1_000_000);
    m.backoff_ms = m
        .backoff_ms
        .saturating_mul(2)
        .min(retry.max_backoff_ms.max(1));
}

fn joined(m: &mut Member, rec: McMemberRecord, retry: McastRetry) {
    m.state = MemberState::Joined;
    m.generation = m.generation.wrapping_add(1);
    m.tries = 0;
    m.last_error = None;
    m.backoff_ms = retry.backoff_ms.max(1);
    m.push(McastEvent::Joined(rec));
}

/// `mcast_groups_event(port, MCAST_GROUP_ERROR)` and `process_group_error`:
/// every group forgets its membership (a join on the wire is dropped) and
/// every member is joined again now.
fn reset_port(core: &mut IbCore, sa: ClientId, retry: McastRetry, mp: &mut McPort, now: u64) {
    mp.counters.resets += 1;
    for g in mp.groups.iter_mut() {
        if let Some(j) = g.joining.take() {
            let _ = sa_query::cancel_query(core, sa, j.query);
        }
        g.join_state = 0;
        g.rec = None;
        for m in g.members.iter_mut() {
            if m.state == MemberState::Joined {
                m.state = MemberState::Joining;
                m.tries = 0;
                m.push(McastEvent::Reset);
            }
            m.next_try_ns = now;
            m.backoff_ms = retry.backoff_ms.max(1);
        }
    }
}

/// The port's active MTU code (`ib_mtu`), read from the device.
fn port_mtu(core: &mut IbCore, dev: DeviceId, port: u8) -> Result<u8> {
    let d = core.device_mut(dev).ok_or(Error::NoDev)?;
    Ok(d.query_port(port)?.active_mtu as u8)
}

/// `send_leave`: a SubnAdmDelete of JoinState `bits` of group `gi` (its
/// record as the SA gave it, or its MGID and the port's GID 0), not
/// waited for: Linux gives it 3 s and does not try again.
fn send_leave(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    mp: &mut McPort,
    gi: usize,
    bits: u8,
) {
    if bits == 0 {
        return;
    }
    let port = mp.port;
    let g = &mp.groups[gi];
    let mgid = g.mgid;
    let mut rec = g.rec.unwrap_or(McMemberRecord {
        mgid,
        ..McMemberRecord::default()
    });
    if rec.port_gid == Gid::default()
        && let Some(gid) = core
            .device(dev)
            .and_then(|d| d.port_cache(port).ok())
            .and_then(|c| c.get_gid(0).ok())
    {
        rec.port_gid = gid;
    }
    rec.join_state = bits;
    let mask = mcmember_comp::MGID | mcmember_comp::PORT_GID | mcmember_comp::JOIN_STATE;
    let timeout = Duration::from_millis(3000);
    match sa_query::mcmember_rec_query(core, sa, dev, port, sa_method::DELETE, &rec, mask, timeout)
    {
        Ok(q) => {
            mp.counters.leaves_sent += 1;
            mp.leaves.push(q);
        }
        Err(e) => {
            mp.counters.leave_errors += 1;
            log::warn!("multicast: port {port}: leaving {mgid} failed at once: {e}");
        }
    }
}

/// Leaves the JoinState bits group `gi` holds (with `extra`, those of a
/// join that may have been granted) that none of its members needs.
fn trim(core: &mut IbCore, sa: ClientId, dev: DeviceId, mp: &mut McPort, gi: usize, extra: u8) {
    let g = &mut mp.groups[gi];
    let needed = g.members.iter().fold(0u8, |a, m| a | m.rec.join_state);
    let bits = (g.join_state | extra) & !needed & 0xf;
    if bits == 0 {
        return;
    }
    send_leave(core, sa, dev, mp, gi, bits);
    let g = &mut mp.groups[gi];
    g.join_state &= !bits;
    if g.join_state == 0 {
        g.rec = None;
    }
}

/// A join's answer (`join_handler` + `process_join_error`).
#[allow(clippy::too_many_arguments)]
fn join_done(
    core: &mut IbCore,
    sa: ClientId,
    retry: McastRetry,
    dev: DeviceId,
    mp: &mut McPort,
    gi: usize,
    j: Joining,
    r: Result<sa_query::SaResponse>,
) {
    let port = mp.port;
    let now = now_ns(core);
    let mgid = mp.groups[gi].mgid;
    let mut rec = r.and_then(|resp| {
        let rec = resp
            .mcmember_records()?
            .into_iter()
            .next()
            .ok_or(Error::Invalid("the SA answered the join without a record"))?;
        if rec.mgid != mgid {
            return Err(Error::Invalid("the SA answered the join with another MGID"));
        }
        Ok(rec)
    });
    if let Ok(g) = &rec {
        match port_mtu(core, dev, port) {
            Ok(mtu) if g.mtu > mtu => {
                log::warn!(
                    "multicast: port {port}: group {} has MTU {} bytes, more than the port's active MTU ({} bytes); not joined",
                    mgid,
                    Mtu::from_raw(g.mtu).map_or(0, |m| m.bytes()),
                    Mtu::from_raw(mtu).map_or(0, |m| m.bytes()),
                );
                mp.counters.mtu_refusals += 1;
                // The SA counted us a member: undo what this join added.
                let had = mp.groups[gi].join_state;
                send_leave(core, sa, dev, mp, gi, j.bits & !had);
                rec = Err(Error::Invalid(
                    "the group's MTU is larger than the port's active MTU",
                ));
            }
            Ok(_) => {}
            Err(e) => rec = Err(e),
        }
    }
    let g = &mut mp.groups[gi];
    match rec {
        Ok(rec) => {
            mp.counters.joins_ok += 1;
            g.rec = Some(rec);
            g.join_state |= j.bits;
            if let Some(m) = g.members.iter_mut().find(|m| m.seq == j.seq) {
                joined(m, rec, retry);
            }
        }
        Err(e) => {
            match e {
                Error::MadStatus(st) => {
                    mp.counters.joins_refused += 1;
                    log::warn!(
                        "multicast: port {port}: the SA refused the join of {}: status {st:#06x} ({})",
                        mgid,
                        sa_query::sa_status_str(st).unwrap_or("unknown")
                    );
                }
                Error::TimedOut => mp.counters.join_timeouts += 1,
                Error::Invalid("the group's MTU is larger than the port's active MTU") => {}
                _ => mp.counters.join_errors += 1,
            }
            if let Some(m) = g.members.iter_mut().find(|m| m.seq == j.seq) {
                fail_member(m, e, now, retry);
            }
        }
    }
}

/// Joins the members the group's membership covers already, then sends
/// the join of the first member whose turn has come (`mcast_work_handler`).
fn start_next(
    core: &mut IbCore,
    sa: ClientId,
    retry: McastRetry,
    dev: DeviceId,
    mp: &mut McPort,
    gi: usize,
) -> usize {
    let port = mp.port;
    let now = now_ns(core);
    let mut work = 0;
    let g = &mut mp.groups[gi];
    if g.joining.is_some() {
        return 0;
    }
    if let Some(rec) = g.rec {
        for m in g.members.iter_mut() {
            if m.state == MemberState::Joining && m.rec.join_state & !g.join_state == 0 {
                joined(m, rec, retry);
                mp.counters.joins_shared += 1;
                work += 1;
            }
        }
    }
    let Some(mi) = g
        .members
        .iter()
        .position(|m| m.state == MemberState::Joining && m.next_try_ns <= now)
    else {
        return work;
    };
    let m = &g.members[mi];
    let mut rec = m.rec;
    let mut mask = m.comp_mask | mcmember_comp::MGID | mcmember_comp::JOIN_STATE;
    if rec.port_gid == Gid::default()
        && let Some(gid) = core
            .device(dev)
            .and_then(|d| d.port_cache(port).ok())
            .and_then(|c| c.get_gid(0).ok())
    {
        rec.port_gid = gid;
        mask |= mcmember_comp::PORT_GID;
    }
    let timeout = Duration::from_millis(u64::from(retry.try_ms.max(1)));
    let r = sa_query::mcmember_rec_query(core, sa, dev, port, method::SET, &rec, mask, timeout);
    let g = &mut mp.groups[gi];
    let seq = g.members[mi].seq;
    match r {
        Ok(query) => {
            mp.counters.joins_sent += 1;
            g.joining = Some(Joining {
                query,
                seq,
                bits: rec.join_state,
            });
        }
        Err(e) => {
            mp.counters.join_errors += 1;
            fail_member(&mut g.members[mi], e, now, retry);
        }
    }
    work + 1
}

fn process_port(
    core: &mut IbCore,
    sa: ClientId,
    retry: McastRetry,
    dev: DeviceId,
    mp: &mut McPort,
) -> usize {
    let mut work = 0;
    let now = now_ns(core);
    if mp.reset {
        mp.reset = false;
        mp.kick = false;
        reset_port(core, sa, retry, mp, now);
        work += 1;
    }
    if mp.kick {
        mp.kick = false;
        for m in mp.groups.iter_mut().flat_map(|g| g.members.iter_mut()) {
            if m.state == MemberState::Joining {
                m.next_try_ns = now;
                m.backoff_ms = retry.backoff_ms.max(1);
            }
        }
        work += 1;
    }
    let mut i = 0;
    while i < mp.leaves.len() {
        match sa_query::query_result(core, sa, mp.leaves[i]) {
            None => i += 1,
            Some(r) => {
                if r.is_err() {
                    mp.counters.leave_errors += 1;
                }
                mp.leaves.swap_remove(i);
                work += 1;
            }
        }
    }
    for gi in 0..mp.groups.len() {
        if let Some(j) = mp.groups[gi].joining {
            match sa_query::query_result(core, sa, j.query) {
                None => continue,
                Some(r) => {
                    mp.groups[gi].joining = None;
                    join_done(core, sa, retry, dev, mp, gi, j, r);
                    work += 1;
                }
            }
        }
        work += start_next(core, sa, retry, dev, mp, gi);
    }
    mp.groups
        .retain(|g| !g.members.is_empty() || g.joining.is_some() || g.join_state != 0);
    work
}

fn is_mgid(g: &Gid) -> bool {
    g.0[0] == 0xff
}

/// `ib_sa_join_multicast`: asks for membership of the group `rec.mgid`
/// on `port` with `rec.join_state` (full member when 0), the fields of
/// `rec` that `comp_mask` names going to the SA as they are (MGID and
/// JoinState always; PortGID is the port's GID 0 when `rec` leaves it
/// zero). The join starts at once and is tried until it succeeds or the
/// member leaves; the member follows it with [`status`], [`next_event`] or
/// [`wait_joined`].
#[doc(alias = "ib_sa_join_multicast")]
pub fn join(
    core: &mut IbCore,
    mc: ClientId,
    dev: DeviceId,
    port: u8,
    rec: &McMemberRecord,
    comp_mask: u64,
) -> Result<McastId> {
    if !is_mgid(&rec.mgid) {
        return Err(Error::Invalid(
            "the MGID is not a multicast GID (SA-assigned MGIDs are not supported)",
        ));
    }
    // An Ethernet (RoCE) port has no SA to join through.
    let link = core
        .device(dev)
        .ok_or(Error::NoDev)?
        .port_link_layer(port)?;
    if link == crate::verbs::LinkLayer::Ethernet {
        return Err(Error::NotSupported);
    }
    let mut rec = *rec;
    if rec.join_state == 0 {
        rec.join_state = sa_query::join_state::FULL_MEMBER;
    }
    if rec.join_state > 0xf {
        return Err(Error::Invalid("JoinState has only 4 bits"));
    }
    let id = with_mc(core, mc, dev, |core, md| {
        let (sa, retry) = (md.sa, md.retry);
        let mp = port_of(md, port)?;
        let members: usize = mp.groups.iter().map(|g| g.members.len()).sum();
        if members >= MAX_MEMBERS {
            return Err(Error::NoMem);
        }
        let now = now_ns(core);
        let seq = mp.next_seq;
        mp.next_seq += 1;
        let gi = match mp.groups.iter().position(|g| g.mgid == rec.mgid) {
            Some(i) => i,
            None => {
                mp.groups.push(Group {
                    mgid: rec.mgid,
                    rec: None,
                    join_state: 0,
                    joining: None,
                    members: Vec::new(),
                });
                mp.groups.len() - 1
            }
        };
        mp.groups[gi].members.push(Member {
            seq,
            rec,
            comp_mask,
            state: MemberState::Joining,
            tries: 0,
            last_error: None,
            generation: 0,
            events: VecDeque::new(),
            next_try_ns: now,
            backoff_ms: retry.backoff_ms.max(1),
        });
        start_next(core, sa, retry, dev, mp, gi);
        Ok(McastId { dev, port, seq })
    })?;
    Ok(id)
}

/// `ib_sa_free_multicast`: ends a membership. The JoinState bits no other
/// member of the port needs are left at the SA (SubnAdmDelete, not waited
/// for); a join still on the wire for this member is dropped.
#[doc(alias = "ib_sa_free_multicast")]
pub fn leave(core: &mut IbCore, mc: ClientId, id: McastId) -> Result<()> {
    with_mc(core, mc, id.dev, |core, md| {
        let sa = md.sa;
        let mp = port_of(md, id.port)?;
        let (gi, mi) = find(mp, id.seq).ok_or(Error::NotFound)?;
        let g = &mut mp.groups[gi];
        let mut extra = 0;
        if let Some(j) = g.joining
            && j.seq == id.seq
        {
            // The SA may have granted it already: leave those bits too.
            let _ = sa_query::cancel_query(core, sa, j.query);
            g.joining = None;
            extra = j.bits;
        }
        g.members.remove(mi);
        trim(core, sa, id.dev, mp, gi, extra);
        let retry = md.retry;
        let mp = port_of(md, id.port)?;
        start_next(core, sa, retry, id.dev, mp, gi);
        mp.groups
            .retain(|g| !g.members.is_empty() || g.joining.is_some() || g.join_state != 0);
        Ok(())
    })
}

fn find(mp: &McPort, seq: u64) -> Option<(usize, usize)> {
    mp.groups.iter().enumerate().find_map(|(gi, g)| {
        g.members
            .iter()
            .position(|m| m.seq == seq)
            .map(|mi| (gi, mi))
    })
}

fn with_member<T>(
    core: &mut IbCore,
    mc: ClientId,
    id: McastId,
    f: impl FnOnce(&mut Member) -> T,
) -> Result<T> {
    with_mc(core, mc, id.dev, |_, md| {
        let mp = port_of(md, id.port)?;
        let (gi, mi) = find(mp, id.seq).ok_or(Error::NotFound)?;
        Ok(f(&mut mp.groups[gi].members[mi]))
    })
}

/// Where a member stands (`-ENOENT` once it left).
pub fn status(core: &mut IbCore, mc: ClientId, id: McastId) -> Result<MemberStatus> {
    let (sa_rec, s) = with_mc(core, mc, id.dev, |_, md| {
        let mp = port_of(md, id.port)?;
        let (gi, mi) = find(mp, id.seq).ok_or(Error::NotFound)?;
        let g = &mp.groups[gi];
        let m = &g.members[mi];
        Ok((
            g.rec,
            MemberStatus {
                state: m.state,
                rec: None,
                tries: m.tries,
                last_error: m.last_error,
                generation: m.generation,
            },
        ))
    })?;
    Ok(MemberStatus {
        rec: if s.state == MemberState::Joined {
            sa_rec
        } else {
            None
        },
        ..s
    })
}

/// The member's next event, oldest first (`None`: nothing new).
pub fn next_event(core: &mut IbCore, mc: ClientId, id: McastId) -> Option<McastEvent> {
    with_member(core, mc, id, |m| m.events.pop_front())
        .ok()
        .flatten()
}

/// Polls the core until the member is joined and returns the group's
/// record; at the deadline, the reason of the last failed join (a
/// refusal, an MTU the port cannot carry) or `-ETIMEDOUT`. The member
/// stays (and keeps trying) either way.
pub fn wait_joined(
    core: &mut IbCore,
    mc: ClientId,
    id: McastId,
    timeout: Duration,
) -> Result<McMemberRecord> {
    let r = core.poll_until(timeout, |core| match status(core, mc, id) {
        Ok(s) => s.rec.map(Ok),
        Err(e) => Some(Err(e)),
    });
    match r {
        Ok(x) => x,
        Err(Error::TimedOut) => Err(status(core, mc, id)?.last_error.unwrap_or(Error::TimedOut)),
        Err(e) => Err(e),
    }
}

/// `ib_sa_get_mcmember_rec`: the record of a group the port is a member
/// of (`-ENOENT` if it is not, or not yet).
#[doc(alias = "ib_sa_get_mcmember_rec")]
pub fn get_mcmember_rec(
    core: &mut IbCore,
    mc: ClientId,
    dev: DeviceId,
    port: u8,
    mgid: &Gid,
) -> Result<McMemberRecord> {
    with_mc(core, mc, dev, |_, md| {
        let mp = port_of(md, port)?;
        mp.groups
            .iter()
            .find(|g| g.mgid == *mgid && g.join_state != 0)
            .and_then(|g| g.rec)
            .ok_or(Error::NotFound)
    })
}

/// The port's groups (for diagnostics).
pub fn groups(core: &mut IbCore, mc: ClientId, dev: DeviceId, port: u8) -> Result<Vec<GroupInfo>> {
    with_mc(core, mc, dev, |_, md| {
        Ok(port_of(md, port)?
            .groups
            .iter()
            .map(|g| GroupInfo {
                mgid: g.mgid,
                rec: g.rec,
                join_state: g.join_state,
                members: g.members.len(),
            })
            .collect())
    })
}

/// What the multicast client of a port counted.
pub fn counters(core: &mut IbCore, mc: ClientId, dev: DeviceId, port: u8) -> Option<McastCounters> {
    with_mc(core, mc, dev, |_, md| Ok(port_of(md, port)?.counters)).ok()
}

/// `ib_init_ah_from_mcmember`: the address vector of a group from `port`:
/// DLID the MLID, the group's SL and rate, and a GRH to the MGID from the
/// port's GID that joined (its index in the cached table), with the
/// group's flow label, hop limit and traffic class. Datagrams go to QPN
/// [`IB_MULTICAST_QPN`] with the group's Q_Key.
#[doc(alias = "ib_init_ah_from_mcmember")]
pub fn init_ah_from_mcmember(dev: &Device, port: u8, rec: &McMemberRecord) -> Result<AhAttr> {
    if !(0xc000..0xffff).contains(&rec.mlid) {
        return Err(Error::Invalid("the record's MLID is not a multicast LID"));
    }
    if !is_mgid(&rec.mgid) {
        return Err(Error::Invalid("the record's MGID is not a multicast GID"));
    }
    let idx = dev
        .port_cache(port)?
        .find_gid(&rec.port_gid)
        .ok_or(Error::Invalid(
            "the record's PortGID is not in the port's GID table",
        ))?;
    Ok(AhAttr {
        dlid: rec.mlid,
        sl: rec.sl & 0xf,
        src_path_bits: 0,
        static_rate: rec.rate,
        port_num: port,
        grh: Some(GlobalRoute {
            dgid: rec.mgid,
            flow_label: rec.flow_label & 0xf_ffff,
            sgid_index: u8::try_from(idx).map_err(|_| Error::Invalid("SGID index above 255"))?,
            hop_limit: rec.hop_limit,
            traffic_class: rec.traffic_class,
        }),
    })
}
