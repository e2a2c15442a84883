//! MCMemberRecord, after OpenSM's `osm_sa_mcmember_record.c`, `osm_multicast.c` and its default partition: the IPv4 broadcast group created at the SM's first sweep as OpenSM makes it without a partitions file, joins (SubnAdmSet) that create or join a group, leaves (SubnAdmDelete), queries (Get, GetTable) and the multicast PathRecord.
//!
//! The broadcast group: MGID ff12:401b:ffff::ffff:ffff, MLID 0xC000,
//! Q_Key 0x0B1B, MTU 2048, 10 Gb/s, SL 0, P_Key 0xFFFF, link-local scope,
//! kept without members. As OpenSM: a join or leave without MGID, PortGID
//! and JoinState is INSUF_COMPS; a join of an unknown port GUID
//! REQ_INVALID; a group is created only by a full member (REQ_INVALID) with
//! Q_Key, TClass, P_Key, FlowLabel and SL in the mask (INSUF_COMPS), an
//! MGID that is valid (0xFF first, no reserved flags, the SA signature
//! 0xA01B not link-local; IPoIB MGIDs unchecked) or all zero (the SA makes
//! one), and an MTU and rate the joining port can carry (REQ_INVALID),
//! getting the MLID asked for if free or the lowest free one; a join whose
//! MTU or rate selector the group does not meet, whose port's MTUCap or
//! rate is below the group's, or whose JoinState is 0 is REQ_INVALID, as
//! is a change to another port's membership that was not a proxy join; a
//! leave of a group or state the port does not hold is REQ_INVALID; a
//! query shows PortGID, JoinState and ProxyJoin only to a trusted
//! requester (SM_Key). A group other than the broadcast one goes with its
//! last member. IPv6 solicited-node MLID sharing and partitions other than
//! the default are left out.

use std::collections::BTreeMap;

use super::path_record::PATH_RECORD_LEN;
use super::path_record::pr;
use super::{
    Reply, Request, SaState, View, be16, be32, be64, has, link_rate, sa_method, sa_status,
};
use crate::fabric::packet::{mad_status, method};

/// MCMemberRecord size.
pub const MCMEMBER_RECORD_LEN: usize = 56;
/// The first multicast LID.
pub const MLID_BASE: u16 = 0xc000;
/// The last MLID the SA hands out (the switch model's MulticastFDBCap
/// of 1024 from 0xC000).
pub const MLID_TOP: u16 = MLID_BASE + 1023;

/// Component bits (`IB_MCR_COMPMASK_*`).
pub mod mcr {
    #![allow(missing_docs)]
    pub const MGID: u32 = 0;
    pub const PORT_GID: u32 = 1;
    pub const QKEY: u32 = 2;
    pub const MLID: u32 = 3;
    pub const MTU_SEL: u32 = 4;
    pub const MTU: u32 = 5;
    pub const TCLASS: u32 = 6;
    pub const PKEY: u32 = 7;
    pub const RATE_SEL: u32 = 8;
    pub const RATE: u32 = 9;
    pub const LIFE_SEL: u32 = 10;
    pub const LIFE: u32 = 11;
    pub const SL: u32 = 12;
    pub const FLOW: u32 = 13;
    pub const HOP: u32 = 14;
    pub const SCOPE: u32 = 15;
    pub const JOIN_STATE: u32 = 16;
    pub const PROXY: u32 = 17;
}

const JOIN_MASK: u64 = 1 << mcr::MGID | 1 << mcr::PORT_GID | 1 << mcr::JOIN_STATE;
const CREATE_MASK: u64 =
    JOIN_MASK | 1 << mcr::QKEY | 1 << mcr::TCLASS | 1 << mcr::PKEY | 1 << mcr::FLOW | 1 << mcr::SL;

/// The IPv4 broadcast MGID of P_Key 0xFFFF.
pub const IPV4_BCAST_MGID: [u8; 16] = [
    0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
];

/// A member port (`osm_mcm_port_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its GID.
    pub port_gid: [u8; 16],
    /// JoinState bits (Full, NonMember, SendOnlyNonMember, SendOnlyFull).
    pub join_state: u8,
    /// Joined by another port.
    pub proxy: bool,
}

/// A multicast group (`osm_mgrp_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The group's record (PortGID zero; selectors "exactly").
    pub rec: [u8; MCMEMBER_RECORD_LEN],
    /// Members by port GUID.
    pub members: BTreeMap<u64, Member>,
    /// Created by the SM itself (kept without members).
    pub well_known: bool,
}

impl Group {
    /// MLID.
    pub fn mlid(&self) -> u16 {
        be16(&self.rec, 36)
    }
    /// MGID.
    pub fn mgid(&self) -> &[u8] {
        &self.rec[0..16]
    }
    /// The group's JoinState: the union of its members'.
    fn join_union(&self) -> u8 {
        self.members.values().fold(0, |a, m| a | m.join_state)
    }
}

/// The groups and the SA's MGID counter.
#[derive(Debug, Default)]
pub struct McastState {
    /// Groups by MLID.
    pub groups: BTreeMap<u16, Group>,
    /// The broadcast group was made.
    pub started: bool,
    next_mgid: u32,
}

impl McastState {
    /// The group with MGID `mgid`.
    pub fn by_mgid(&self, mgid: &[u8]) -> Option<&Group> {
        self.groups.values().find(|g| g.mgid() == mgid)
    }
    /// MLID -> the port GUIDs of its members, for the MFTs.
    pub fn members(&self) -> BTreeMap<u16, Vec<u64>> {
        self.groups
            .iter()
            .filter(|(_, g)| !g.members.is_empty())
            .map(|(l, g)| (*l, g.members.keys().copied().collect()))
            .collect()
    }
}

/// The IPoIB broadcast group as OpenSM's default partition creates it.
fn broadcast_group(pkt_life: u8) -> Group {
    let mut r = [0u8; MCMEMBER_RECORD_LEN];
    r[0..16].copy_from_slice(&IPV4_BCAST_MGID);
    r[32..36].copy_from_slice(&0x0000_0b1bu32.to_be_bytes());
    r[36..38].copy_from_slice(&MLID_BASE.to_be_bytes());
    r[38] = 0x80 | 4; // exactly 2048
    r[40..42].copy_from_slice(&0xffffu16.to_be_bytes());
    r[42] = 0x80 | 3; // exactly 10 Gb/s
    r[43] = 0x80 | (pkt_life & 0x3f);
    r[48] = 0x20; // link-local scope
    Group {
        rec: r,
        members: BTreeMap::new(),
        well_known: true,
    }
}

/// At the end of every heavy sweep: the broadcast group exists from the
/// first; members whose port left the subnet go. Returns whether a
/// membership changed.
pub fn subnet_changed(st: &mut SaState, v: &View) -> bool {
    let mut changed = false;
    if !st.mcast.started {
        st.mcast.started = true;
        let g = broadcast_group(v.cfg.packet_life_time);
        st.mcast.groups.insert(g.mlid(), g);
    }
    st.mcast.groups.retain(|_, g| {
        let before = g.members.len();
        g.members.retain(|guid, _| v.port_by_guid(*guid).is_some());
        changed |= before != g.members.len();
        g.well_known || !g.members.is_empty()
    });
    changed
}

/// `validate_more_comp_fields`: the request's MTU and rate selectors
/// against the group (the codes compared as numbers, as OpenSM does).
fn more_fields_ok(g: &Group, q: &[u8], cm: u64) -> bool {
    let check = |sel: u8, want: u8, have: u8| match sel {
        0 => have > want,
        1 => have < want,
        2 => have == want,
        _ => true,
    };
    (!has(cm, mcr::MTU_SEL) || check(q[38] >> 6, q[38] & 0x3f, g.rec[38] & 0x3f))
        && (!has(cm, mcr::RATE_SEL) || check(q[42] >> 6, q[42] & 0x3f, g.rec[42] & 0x3f))
}

/// `validate_port_caps`: the joining port's MTUCap and rate carry the
/// group's.
fn port_caps_ok(g: &Group, pi: &[u8; 64]) -> bool {
    pi[41] & 0xf >= g.rec[38] & 0x3f
        && super::rate_value(link_rate(pi)) >= super::rate_value(g.rec[42] & 0x3f)
}

/// `validate_requested_mgid` (o15-0.1.5).
fn mgid_valid(mgid: &[u8]) -> bool {
    if mgid[0] != 0xff {
        return false;
    }
    let sig = be16(mgid, 2);
    if sig == 0x401b || sig == 0x601b {
        return true;
    }
    if mgid[1] & 0xe0 != 0 {
        return false;
    }
    !(sig == 0xa01b && mgid[1] & 0x0f == 2)
}

/// `mgrp_request_is_realizable`: the MTU and rate of a new group (the
/// joining port's when not asked for), or `None` if the request cannot be
/// met. The selector is kept as asked (3, "largest", when none).
fn realizable(cm: u64, q: &[u8], pi: &[u8; 64]) -> Option<(u8, u8)> {
    let port_mtu = pi[41] & 0xf;
    let mtu = if !has(cm, mcr::MTU) || !has(cm, mcr::MTU_SEL) || q[38] >> 6 == 3 {
        (if has(cm, mcr::MTU) && has(cm, mcr::MTU_SEL) {
            q[38] & 0xc0
        } else {
            0x80
        }) | port_mtu
    } else {
        let (sel, req) = (q[38] >> 6, q[38] & 0x3f);
        let m = match sel {
            0 => {
                if req >= port_mtu {
                    return None;
                }
                port_mtu
            }
            1 => {
                if req > port_mtu {
                    port_mtu
                } else {
                    req.wrapping_sub(1)
                }
            }
            _ => req,
        };
        if !super::mtu_is_valid(m) {
            return None;
        }
        sel << 6 | m
    };
    let port_rate = link_rate(pi);
    let rate = if !has(cm, mcr::RATE) || !has(cm, mcr::RATE_SEL) || q[42] >> 6 == 3 {
        (if has(cm, mcr::RATE) && has(cm, mcr::RATE_SEL) {
            q[42] & 0xc0
        } else {
            0x80
        }) | port_rate
    } else {
        let (sel, req) = (q[42] >> 6, q[42] & 0x3f);
        let r = match sel {
            // Ordered as OpenSM orders them (`ib_path_compare_rates`),
            // not by code.
            0 => {
                if super::rate_value(req) >= super::rate_value(port_rate) {
                    return None;
                }
                port_rate
            }
            1 => {
                if super::rate_value(req) > super::rate_value(port_rate) {
                    port_rate
                } else {
                    super::path_record::rate_prev(req).unwrap_or(0)
                }
            }
            _ => req,
        };
        if !super::rate_is_valid(r) {
            return None;
        }
        sel << 6 | r
    };
    Some((mtu, rate))
}

/// `osm_mcmr_rcv_process`. Returns the reply and whether a group's
/// membership changed.
pub fn process(v: &View, st: &mut SaState, r: &Request) -> (Reply, bool) {
    let cm = r.cm;
    let mut q = [0u8; MCMEMBER_RECORD_LEN];
    q.copy_from_slice(&r.rec()[..MCMEMBER_RECORD_LEN]);
    match r.method() {
        method::SET | sa_method::DELETE => {
            if cm & JOIN_MASK != JOIN_MASK {
                return (Reply::Error(sa_status::INSUFFICIENT_COMPONENTS), false);
            }
            if r.method() == method::SET {
                join(v, st, &q, cm, r.requester)
            } else {
                leave(v, st, &q, r.requester)
            }
        }
        method::GET | sa_method::GET_TABLE => (
            Reply::Records(MCMEMBER_RECORD_LEN, query(st, &q, cm, r.trusted)),
            false,
        ),
        _ => (Reply::Error(mad_status::ATTR_UNSUPPORTED), false),
    }
}

/// A group's record as one member sees it.
fn record_for(g: &Group, m: &Member) -> Vec<u8> {
    let mut out = g.rec.to_vec();
    out[16..32].copy_from_slice(&m.port_gid);
    out[48] = (g.rec[48] & 0xf0) | (m.join_state & 0x0f);
    out[49] = if m.proxy { 0x80 } else { 0 };
    out
}

/// o15-0.2.1 (`validate_modify`): a port's existing membership changes
/// only by the port itself, unless it was a proxy join.
fn modify_ok(v: &View, g: &Group, guid: u64, requester: u16) -> bool {
    let Some(m) = g.members.get(&guid) else {
        return true;
    };
    m.proxy
        || v.port_by_lid(requester)
            .is_some_and(|e| e.port_guid == guid)
}

/// `mcmr_rcv_join_mgrp`.
fn join(v: &View, st: &mut SaState, q: &[u8], cm: u64, requester: u16) -> (Reply, bool) {
    let guid = be64(q, 24);
    let Some(port) = v.port_by_guid(guid) else {
        return (Reply::Error(sa_status::REQ_INVALID), false);
    };
    let proxy = v
        .port_by_lid(requester)
        .is_some_and(|e| e.port_guid != guid);
    let join_state = q[48] & 0x0f;
    let existing = st.mcast.by_mgid(&q[0..16]).map(Group::mlid);
    let (mlid, new) = match existing {
        Some(l) => (l, false),
        None => {
            // o15-0.1.9: only a full member creates a group.
            if join_state & 1 == 0 {
                return (Reply::Error(sa_status::REQ_INVALID), false);
            }
            if cm & CREATE_MASK != CREATE_MASK {
                return (Reply::Error(sa_status::INSUFFICIENT_COMPONENTS), false);
            }
            let mut rec = [0u8; MCMEMBER_RECORD_LEN];
            rec.copy_from_slice(&q[..MCMEMBER_RECORD_LEN]);
            if q[0..16].iter().all(|&b| b == 0) {
                // An SA-made MGID: ff1<scope>:a01b:<subnet prefix>:<n>.
                let scope = if has(cm, mcr::SCOPE) { q[48] >> 4 } else { 2 };
                st.mcast.next_mgid = st.mcast.next_mgid.wrapping_add(1);
                rec[0] = 0xff;
                rec[1] = 0x10 | (scope & 0xf);
                rec[2..4].copy_from_slice(&[0xa0, 0x1b]);
                rec[4..12].copy_from_slice(&v.cfg.subnet_prefix.to_be_bytes());
                rec[12..16].copy_from_slice(&st.mcast.next_mgid.to_be_bytes());
            } else if !mgid_valid(&q[0..16]) {
                return (Reply::Error(sa_status::REQ_INVALID), false);
            }
            let Some((mtu, rate)) = realizable(cm, q, &port.port_info) else {
                return (Reply::Error(sa_status::REQ_INVALID), false);
            };
            let asked = be16(q, 36);
            let free = |l: u16| !st.mcast.groups.contains_key(&l);
            let mlid = if (MLID_BASE..=MLID_TOP).contains(&asked) && free(asked) {
                asked
            } else {
                match (MLID_BASE..=MLID_TOP).find(|l| free(*l)) {
                    Some(l) => l,
                    None => return (Reply::Error(sa_status::NO_RESOURCES), false),
                }
            };
            rec[16..32].fill(0);
            rec[36..38].copy_from_slice(&mlid.to_be_bytes());
            // Selectors "exactly" in the group (`mcmr_rcv_create_new_mgrp`).
            rec[38] = 0x80 | (mtu & 0x3f);
            rec[42] = 0x80 | (rate & 0x3f);
            rec[43] = 0x80 | (q[43] & 0x3f);
            rec[48] &= 0xf0;
            rec[49] = 0;
            st.mcast.groups.insert(
                mlid,
                Group {
                    rec,
                    members: BTreeMap::new(),
                    well_known: false,
                },
            );
            (mlid, true)
        }
    };
    let Some(g) = st.mcast.groups.get(&mlid) else {
        return (Reply::Error(sa_status::REQ_INVALID), false);
    };
    if !more_fields_ok(g, q, cm) || !port_caps_ok(g, &port.port_info) || join_state == 0 {
        if new {
            st.mcast.groups.remove(&mlid);
        }
        return (Reply::Error(sa_status::REQ_INVALID), false);
    }
    if !new && !modify_ok(v, g, guid, requester) {
        return (Reply::Error(sa_status::REQ_INVALID), false);
    }
    let Some(g) = st.mcast.groups.get_mut(&mlid) else {
        return (Reply::Error(sa_status::REQ_INVALID), false);
    };
    let mut pg = [0u8; 16];
    pg.copy_from_slice(&q[16..32]);
    let before = g.members.get(&guid).map(|m| m.join_state);
    let mem = g.members.entry(guid).or_insert(Member {
        port_gid: pg,
        join_state: 0,
        proxy,
    });
    mem.join_state |= join_state;
    let changed = before != Some(mem.join_state);
    let mem = mem.clone();
    (
        Reply::Records(MCMEMBER_RECORD_LEN, vec![record_for(g, &mem)]),
        changed,
    )
}

/// `mcmr_rcv_leave_mgrp` with `validate_delete` (o15-0.1.14).
fn leave(v: &View, st: &mut SaState, q: &[u8], requester: u16) -> (Reply, bool) {
    let guid = be64(q, 24);
    let Some(mlid) = st.mcast.by_mgid(&q[0..16]).map(Group::mlid) else {
        return (Reply::Error(sa_status::REQ_INVALID), false);
    };
    let Some(g) = st.mcast.groups.get(&mlid) else {
        return (Reply::Error(sa_status::REQ_INVALID), false);
    };
    let want = q[48] & 0x0f;
    let Some(held) = g.members.get(&guid).map(|m| m.join_state) else {
        return (Reply::Error(sa_status::REQ_INVALID), false);
    };
    if want & held == 0 || (want | held) != held || !modify_ok(v, g, guid, requester) {
        return (Reply::Error(sa_status::REQ_INVALID), false);
    }
    let Some(g) = st.mcast.groups.get_mut(&mlid) else {
        return (Reply::Error(sa_status::REQ_INVALID), false);
    };
    let mut out = Vec::new();
    if let Some(mem) = g.members.get_mut(&guid) {
        mem.join_state &= !want;
        let mem = mem.clone();
        out = record_for(g, &mem);
        out[48] = (g.rec[48] & 0xf0) | want;
        if mem.join_state == 0 {
            g.members.remove(&guid);
        }
    }
    if !g.well_known && g.members.is_empty() {
        st.mcast.groups.remove(&mlid);
    }
    (Reply::Records(MCMEMBER_RECORD_LEN, vec![out]), true)
}

/// `mcmr_query_mgrp` / `mcmr_by_comp_mask`: a record per group, or per
/// member for a trusted requester that names no port.
fn query(st: &SaState, q: &[u8], cm: u64, trusted: bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let want_guid = be64(q, 24);
    let eq = |bit: u32, a: &[u8], b: &[u8]| !has(cm, bit) || a == b;
    for g in st.mcast.groups.values() {
        let r = &g.rec;
        let (gsl, gflow, ghop) = (r[44] >> 4, be32(r, 44) >> 8 & 0xf_ffff, r[47]);
        let (qsl, qflow, qhop) = (q[44] >> 4, be32(q, 44) >> 8 & 0xf_ffff, q[47]);
        if !(eq(mcr::MGID, &r[0..16], &q[0..16])
            && eq(mcr::MLID, &r[36..38], &q[36..38])
            && eq(mcr::QKEY, &r[32..36], &q[32..36])
            && eq(mcr::PKEY, &r[40..42], &q[40..42])
            && eq(mcr::TCLASS, &r[39..40], &q[39..40])
            && (!has(cm, mcr::SL) || gsl == qsl)
            && (!has(cm, mcr::FLOW) || gflow == qflow)
            && (!has(cm, mcr::HOP) || ghop == qhop)
            && (!has(cm, mcr::PROXY) || r[49] & 0x80 == q[49] & 0x80)
            && more_fields_ok(g, q, cm))
        {
            continue;
        }
        let mut mask = 0u8;
        if has(cm, mcr::SCOPE) {
            mask |= 0xf0;
        }
        if has(cm, mcr::JOIN_STATE) {
            mask |= 0x0f;
        }
        if trusted && !has(cm, mcr::PORT_GID) {
            for m in g.members.values() {
                let ss = (r[48] & 0xf0) | m.join_state;
                if mask & q[48] == mask & ss {
                    out.push(record_for(g, m));
                }
            }
            continue;
        }
        let rec = if has(cm, mcr::PORT_GID) {
            let Some(m) = g.members.get(&want_guid) else {
                continue;
            };
            record_for(g, m)
        } else {
            let mut x = r.to_vec();
            x[48] = (r[48] & 0xf0) | g.join_union();
            x
        };
        if mask & q[48] != mask & rec[48] {
            continue;
        }
        let mut rec = rec;
        // p923: PortGID, JoinState and ProxyJoin only to a trusted
        // requester.
        if !trusted {
            rec[16..32].fill(0);
            rec[48] &= 0xf0;
            rec[49] = 0;
        }
        out.push(rec);
    }
    out
}

/// `pr_process_multicast`: the PathRecord to a multicast destination (by
/// MGID, and the MLID if given, or by MLID alone): the request with the
/// group's MGID, MLID, TClass, P_Key, SL, MTU, rate and lifetime
/// ("exactly"), NumbPath 1, FlowLabel and HopLimit (0xFF beyond link-local
/// scope); no record for an unknown group or one the request's P_Key, SL,
/// NumbPath (of a GetTable), FlowLabel, HopLimit or TClass do not match.
pub fn multicast_path(st: &SaState, cm: u64, q: &[u8], meth: u8) -> Vec<Vec<u8>> {
    let g = if has(cm, pr::DGID) {
        match st.mcast.by_mgid(&q[8..24]) {
            Some(g) if !has(cm, pr::DLID) || g.mlid() == be16(q, 40) => g,
            _ => return Vec::new(),
        }
    } else {
        match st.mcast.groups.get(&be16(q, 40)) {
            Some(g) => g,
            None => return Vec::new(),
        }
    };
    let r = &g.rec;
    let (sl, flow, hop) = (r[44] >> 4, be32(r, 44) >> 8 & 0xf_ffff, r[47]);
    if has(cm, pr::PKEY) && q[50..52] != r[40..42]
        || has(cm, pr::SL) && (be16(q, 52) & 0xf) as u8 != sl
        || has(cm, pr::NUMBPATH) && meth != method::GET && q[49] & 0x7f == 0
        || has(cm, pr::FLOWLABEL) && be32(q, 44) >> 8 & 0xf_ffff != flow
        || has(cm, pr::HOPLIMIT) && q[47] != hop
        || has(cm, pr::TCLASS) && q[48] != r[39]
    {
        return Vec::new();
    }
    let mut p = vec![0u8; PATH_RECORD_LEN];
    p.copy_from_slice(&q[..PATH_RECORD_LEN]);
    p[8..24].copy_from_slice(g.mgid());
    p[40..42].copy_from_slice(&r[36..38]);
    p[48] = r[39];
    p[49] = 1;
    p[50..52].copy_from_slice(&r[40..42]);
    p[52..54].copy_from_slice(&u16::from(sl).to_be_bytes());
    p[54] = 0x80 | (r[38] & 0x3f);
    p[55] = 0x80 | (r[42] & 0x3f);
    p[56] = 0x80 | (r[43] & 0x3f);
    let hop = if g.mgid()[1] & 0x0f == 2 { hop } else { 0xff };
    p[44..48].copy_from_slice(&(flow << 8 | u32::from(hop)).to_be_bytes());
    vec![p]
}

/// `ff12:401b:ffff::ffff:ffff`-style words of a GID (every group).
pub fn fmt_gid(g: &[u8]) -> String {
    (0..8)
        .map(|i| {
            format!(
                "{:x}",
                u16::from_be_bytes([
                    g.get(2 * i).copied().unwrap_or(0),
                    g.get(2 * i + 1).copied().unwrap_or(0)
                ])
            )
        })
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mgid_rules() {
        assert!(mgid_valid(&IPV4_BCAST_MGID));
        let mut m = [0u8; 16];
        assert!(!mgid_valid(&m), "no 0xFF");
        m[0] = 0xff;
        m[1] = 0x12;
        m[2..4].copy_from_slice(&[0xa0, 0x1b]);
        assert!(!mgid_valid(&m), "SA signature, link-local");
        m[1] = 0x15;
        assert!(mgid_valid(&m));
        m[1] = 0x35;
        assert!(!mgid_valid(&m), "reserved flags");
    }

    #[test]
    fn a_new_group_gets_the_ports_mtu_and_rate_unless_asked() {
        let mut pi = [0u8; 64];
        pi[41] = 5;
        pi[31] = 2;
        pi[35] = 0x40;
        assert_eq!(realizable(0, &[0u8; 56], &pi), Some((0x85, 0x87)));
        let mut q = [0u8; 56];
        q[38] = 2 << 6 | 4;
        q[42] = 2 << 6 | 3;
        let cm = 1 << mcr::MTU | 1 << mcr::MTU_SEL | 1 << mcr::RATE | 1 << mcr::RATE_SEL;
        assert_eq!(realizable(cm, &q, &pi), Some((0x84, 0x83)));
        q[38] = 5; // greater than 4096: not on this port
        assert_eq!(realizable(cm, &q, &pi), None);
    }
}
