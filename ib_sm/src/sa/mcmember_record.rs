//! MCMemberRecord, after OpenSM's `osm_sa_mcmember_record.c`, `osm_multicast.c` and its default partition: the IPv4 broadcast group of P_Key 0xFFFF created at start (MGID ff12:401b:ffff::ffff:ffff, MLID 0xC000, Q_Key 0x0B1B, MTU 2048, 10 Gb/s, as OpenSM makes it without a partitions file), joins (SubnAdmSet) that create or join a group, leaves (SubnAdmDelete), queries, and the multicast PathRecord.
//!
//! As OpenSM: a join or leave without MGID, PortGID and JoinState is
//! INSUF_COMPS; a PortGID of another subnet prefix INVALID_GID; an unknown
//! port, a group created without Full membership, a group created without
//! Q_Key, TClass, P_Key, FlowLabel and SL (INSUF_COMPS), an MTU or rate
//! the group does not meet, a join state of 0, a leave of a state the port
//! does not hold: REQ_INVALID. A group the SA creates gets the next free
//! MLID; an all-zero MGID gets one of the SA's (signature 0xA01B). The
//! switches' MFTs follow the members ([`crate::mcast_mgr`]). Proxy joins
//! are taken without the P_Key check OpenSM makes; IPv6 solicited-node
//! MLID sharing and MGID validation are left out.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use hal::be::{get_be16, get_be64};
use ib_core::MadRecvWc;
use ib_core::mad::{Mad, method};

use super::{Answer, has, rec};
use crate::ib_types::{MCAST_LID_BASE, rate_value, sa_method, status};
use crate::sm::Sm;

/// MCMemberRecord size.
pub const MCMEMBER_RECORD_LEN: usize = 56;
/// Groups at most.
pub const MAX_GROUPS: usize = 1024;

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

/// A member port.
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
    /// The group's record (PortGID zero, JoinState the union).
    pub rec: [u8; MCMEMBER_RECORD_LEN],
    /// Members by port GUID.
    pub members: BTreeMap<u64, Member>,
    /// Created by the SM itself (kept without members).
    pub well_known: bool,
}

impl Group {
    /// MLID.
    pub fn mlid(&self) -> u16 {
        get_be16(&self.rec, 36)
    }
    /// MGID.
    pub fn mgid(&self) -> &[u8] {
        &self.rec[0..16]
    }
}

/// The groups and the SA's MGID counter.
#[derive(Debug, Default)]
pub struct McastState {
    /// Groups by MLID.
    pub groups: BTreeMap<u16, Group>,
    /// The broadcast group exists.
    pub started: bool,
    next_mgid: u64,
    /// The MFTs need writing.
    pub dirty: bool,
}

/// The IPoIB broadcast group as OpenSM's default partition creates it.
fn broadcast_group(subnet_timeout: u8) -> Group {
    let mut r = [0u8; MCMEMBER_RECORD_LEN];
    r[0..16].copy_from_slice(&IPV4_BCAST_MGID);
    r[32..36].copy_from_slice(&0x0000_0b1bu32.to_be_bytes());
    r[36..38].copy_from_slice(&MCAST_LID_BASE.to_be_bytes());
    r[38] = 0x80 | 4; // 2048
    r[40..42].copy_from_slice(&0xffffu16.to_be_bytes());
    r[42] = 0x80 | 3; // 10 Gb/s
    r[43] = 0x80 | (subnet_timeout & 0x3f);
    r[48] = 0x20; // link-local scope
    Group {
        rec: r,
        members: BTreeMap::new(),
        well_known: true,
    }
}

/// Called at the end of every heavy sweep: the broadcast group exists from
/// the first, and members whose port left the subnet go.
pub fn subnet_changed(sm: &mut Sm) {
    if !sm.sa.mcast.started {
        sm.sa.mcast.started = true;
        let g = broadcast_group(sm.cfg.subnet_timeout);
        sm.sa.mcast.groups.insert(g.mlid(), g);
        sm.sa.mcast.dirty = true;
    }
    let ports = &sm.done.ports;
    let mut changed = false;
    sm.sa.mcast.groups.retain(|_, g| {
        let before = g.members.len();
        g.members.retain(|guid, _| ports.contains_key(guid));
        changed |= before != g.members.len();
        g.well_known || !g.members.is_empty()
    });
    if changed {
        sm.sa.mcast.dirty = true;
    }
}

fn by_mgid<'a>(sm: &'a Sm, mgid: &[u8]) -> Option<&'a Group> {
    sm.sa.mcast.groups.values().find(|g| g.mgid() == mgid)
}

/// `validate_more_comp_fields`: the request's MTU and rate selectors
/// against the group.
fn more_fields_ok(g: &Group, q: &[u8], cm: u64) -> bool {
    if has(cm, mcr::MTU_SEL) {
        let (sel, want, have) = (q[38] >> 6, q[38] & 0x3f, g.rec[38] & 0x3f);
        let ok = match sel {
            0 => have > want,
            1 => have < want,
            2 => have == want,
            _ => true,
        };
        if !ok {
            return false;
        }
    }
    if has(cm, mcr::RATE_SEL) {
        let (sel, want, have) = (
            q[42] >> 6,
            rate_value(q[42] & 0x3f),
            rate_value(g.rec[42] & 0x3f),
        );
        let ok = match sel {
            0 => have > want,
            1 => have < want,
            2 => have == want,
            _ => true,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// `validate_other_comp_fields`: Q_Key, P_Key, TClass, SL, FlowLabel,
/// HopLimit and Scope of a query or join against the group.
fn other_fields_ok(g: &Group, q: &[u8], cm: u64) -> bool {
    let eq = |bit: u32, a: &[u8], b: &[u8]| !has(cm, bit) || a == b;
    let r = &g.rec;
    eq(mcr::QKEY, &r[32..36], &q[32..36])
        && eq(mcr::PKEY, &r[40..42], &q[40..42])
        && eq(mcr::TCLASS, &r[39..40], &q[39..40])
        && (!has(cm, mcr::SL) || r[44] >> 4 == q[44] >> 4)
        && (!has(cm, mcr::FLOW) || get_be32_flow(r) == get_be32_flow(q))
        && (!has(cm, mcr::HOP) || r[47] == q[47])
        && (!has(cm, mcr::SCOPE) || r[48] >> 4 == q[48] >> 4)
}

fn get_be32_flow(r: &[u8]) -> u32 {
    u32::from_be_bytes([r[44], r[45], r[46], r[47]]) >> 8 & 0xf_ffff
}

fn rate_mtu_valid(cm: u64, q: &[u8]) -> bool {
    let rate_ok = !(has(cm, mcr::RATE_SEL) && has(cm, mcr::RATE))
        || crate::ib_types::rate_is_valid(q[42] & 0x3f);
    let mtu_ok = !(has(cm, mcr::MTU_SEL) && has(cm, mcr::MTU))
        || crate::ib_types::mtu_is_valid(q[38] & 0x3f);
    rate_ok && mtu_ok
}

/// `osm_mcmr_rcv_process`.
pub fn process(sm: &mut Sm, m: &Mad, r: &MadRecvWc, now: u64) -> Answer {
    let cm = super::comp_mask(m);
    let q: Vec<u8> = rec(m)[..MCMEMBER_RECORD_LEN].to_vec();
    match m.method() {
        method::SET | sa_method::DELETE => {
            if cm & JOIN_MASK != JOIN_MASK {
                return Answer::Error(status::SA_INSUF_COMPS);
            }
            if !rate_mtu_valid(cm, &q) {
                return Answer::Error(status::SA_REQ_INVALID);
            }
            if m.method() == method::SET {
                join(sm, &q, cm, r.wc.slid, now)
            } else {
                leave(sm, &q, now)
            }
        }
        method::GET | sa_method::GET_TABLE => {
            if !rate_mtu_valid(cm, &q) {
                return Answer::Error(status::SA_REQ_INVALID);
            }
            let trusted = get_be64(&m.0, super::SA_SM_KEY) != 0;
            Answer::Records(MCMEMBER_RECORD_LEN, query(sm, &q, cm, trusted))
        }
        _ => Answer::Error(status::UNSUP_METHOD_ATTR),
    }
}

fn port_gid_of(sm: &Sm, q: &[u8]) -> Result<u64, u16> {
    let prefix = get_be64(q, 16);
    if prefix != crate::ib_types::LINK_LOCAL_PREFIX && prefix != sm.cfg.subnet_prefix {
        return Err(status::SA_INVALID_GID);
    }
    Ok(get_be64(q, 24))
}

fn record_for(g: &Group, m: &Member) -> Vec<u8> {
    let mut out = g.rec.to_vec();
    out[16..32].copy_from_slice(&m.port_gid);
    out[48] = (g.rec[48] & 0xf0) | (m.join_state & 0x0f);
    out[49] = if m.proxy { 0x80 } else { 0 };
    out
}

/// `mcmr_rcv_join_mgrp`.
fn join(sm: &mut Sm, q: &[u8], cm: u64, requester: u16, now: u64) -> Answer {
    let guid = match port_gid_of(sm, q) {
        Ok(g) => g,
        Err(st) => return Answer::Error(st),
    };
    let Some(port) = sm.done.port_by_guid(guid).copied() else {
        return Answer::Error(status::SA_REQ_INVALID);
    };
    let proxy = sm
        .done
        .port_by_lid(requester)
        .is_some_and(|e| e.guid != guid);
    if has(cm, mcr::PKEY) && get_be16(q, 40) & 0x7fff == 0 {
        return Answer::Error(status::SA_REQ_INVALID);
    }
    let join_state = q[48] & 0x0f;
    let mgid_zero = q[0..16].iter().all(|&b| b == 0);
    let existing = if mgid_zero {
        None
    } else {
        sm.sa
            .mcast
            .groups
            .iter()
            .find(|(_, g)| g.mgid() == &q[0..16])
            .map(|(l, _)| *l)
    };
    let (mlid, new) = match existing {
        Some(l) => (l, false),
        None => {
            if join_state & (1 | 8) == 0 {
                return Answer::Error(status::SA_REQ_INVALID);
            }
            if cm & CREATE_MASK != CREATE_MASK {
                return Answer::Error(status::SA_INSUF_COMPS);
            }
            if sm.sa.mcast.groups.len() >= MAX_GROUPS {
                return Answer::Error(status::SA_NO_RESOURCES);
            }
            let Some(mlid) =
                (MCAST_LID_BASE..=0xfffe).find(|l| !sm.sa.mcast.groups.contains_key(l))
            else {
                return Answer::Error(status::SA_NO_RESOURCES);
            };
            let mut r = [0u8; MCMEMBER_RECORD_LEN];
            r.copy_from_slice(&q[..MCMEMBER_RECORD_LEN]);
            if mgid_zero {
                // An SA-made MGID: ff12:a01b:<prefix>:<counter>.
                sm.sa.mcast.next_mgid += 1;
                r[0..4].copy_from_slice(&[0xff, 0x12, 0xa0, 0x1b]);
                r[4..12].copy_from_slice(&sm.cfg.subnet_prefix.to_be_bytes()[..8]);
                r[12..16].copy_from_slice(&(sm.sa.mcast.next_mgid as u32).to_be_bytes());
            }
            r[16..32].fill(0);
            r[36..38].copy_from_slice(&mlid.to_be_bytes());
            // The group gets what the port can do when not asked.
            let pi = sm.done.end_pi(&port).copied().unwrap_or_default();
            if !(has(cm, mcr::MTU_SEL) && has(cm, mcr::MTU)) {
                r[38] = 0x80 | pi.mtu_cap().min(4);
            } else {
                r[38] = 0x80 | (q[38] & 0x3f);
            }
            if !(has(cm, mcr::RATE_SEL) && has(cm, mcr::RATE)) {
                r[42] = 0x80 | pi.rate();
            } else {
                r[42] = 0x80 | (q[42] & 0x3f);
            }
            r[43] = 0x80
                | if has(cm, mcr::LIFE) {
                    q[43] & 0x3f
                } else {
                    sm.cfg.subnet_timeout
                };
            if !has(cm, mcr::SCOPE) {
                r[48] = 0x20;
            }
            r[48] &= 0xf0;
            r[49] = 0;
            let g = Group {
                rec: r,
                members: BTreeMap::new(),
                well_known: false,
            };
            sm.sa.mcast.groups.insert(mlid, g);
            (mlid, true)
        }
    };
    let Some(g) = sm.sa.mcast.groups.get(&mlid) else {
        return Answer::Error(status::SA_REQ_INVALID);
    };
    if !new && !other_fields_ok(g, q, cm & !(1 << mcr::SCOPE)) {
        return Answer::Error(status::SA_REQ_INVALID);
    }
    if !more_fields_ok(g, q, cm) || join_state == 0 {
        if new {
            sm.sa.mcast.groups.remove(&mlid);
        }
        return Answer::Error(status::SA_REQ_INVALID);
    }
    let Some(g) = sm.sa.mcast.groups.get_mut(&mlid) else {
        return Answer::Error(status::SA_REQ_INVALID);
    };
    let mut pg = [0u8; 16];
    pg.copy_from_slice(&q[16..32]);
    let mem = g.members.entry(guid).or_insert(Member {
        port_gid: pg,
        join_state: 0,
        proxy,
    });
    mem.join_state |= join_state;
    let mem = mem.clone();
    let out = record_for(g, &mem);
    let mgid = g.rec;
    sm.sa.mcast.dirty = true;
    sm.request_mcast_update();
    sm.note(
        now,
        alloc::format!(
            "Port {guid:#018x} joined MGID {} (MLID {mlid:#06x}), join state {join_state:#x}",
            fmt_gid(&mgid[0..16])
        ),
    );
    Answer::Records(MCMEMBER_RECORD_LEN, alloc::vec![out])
}

/// `mcmr_rcv_leave_mgrp`.
fn leave(sm: &mut Sm, q: &[u8], now: u64) -> Answer {
    let guid = match port_gid_of(sm, q) {
        Ok(g) => g,
        Err(st) => return Answer::Error(st),
    };
    let Some((&mlid, _)) = sm
        .sa
        .mcast
        .groups
        .iter()
        .find(|(_, g)| g.mgid() == &q[0..16])
    else {
        return Answer::Error(status::SA_REQ_INVALID);
    };
    let Some(g) = sm.sa.mcast.groups.get_mut(&mlid) else {
        return Answer::Error(status::SA_REQ_INVALID);
    };
    let want = q[48] & 0x0f;
    let Some(mem) = g.members.get_mut(&guid) else {
        return Answer::Error(status::SA_REQ_INVALID);
    };
    if want & mem.join_state == 0 || (want | mem.join_state) != mem.join_state {
        return Answer::Error(status::SA_REQ_INVALID);
    }
    mem.join_state &= !want;
    let left = mem.join_state;
    let mem = mem.clone();
    let mut out = record_for(g, &mem);
    out[48] = (g.rec[48] & 0xf0) | want;
    if left == 0 {
        g.members.remove(&guid);
    }
    if !g.well_known && g.members.is_empty() {
        sm.sa.mcast.groups.remove(&mlid);
    }
    sm.sa.mcast.dirty = true;
    sm.request_mcast_update();
    sm.note(
        now,
        alloc::format!("Port {guid:#018x} left MLID {mlid:#06x} (join state {want:#x})"),
    );
    Answer::Records(MCMEMBER_RECORD_LEN, alloc::vec![out])
}

/// `mcmr_query_mgrp` / `mcmr_by_comp_mask`.
fn query(sm: &Sm, q: &[u8], cm: u64, trusted: bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let want_guid = get_be64(q, 24);
    for g in sm.sa.mcast.groups.values() {
        if has(cm, mcr::MGID) && g.mgid() != &q[0..16] {
            continue;
        }
        if has(cm, mcr::MLID) && g.rec[36..38] != q[36..38] {
            continue;
        }
        if !other_fields_ok(g, q, cm & !(1 << mcr::SCOPE | 1 << mcr::JOIN_STATE)) {
            continue;
        }
        if has(cm, mcr::PROXY) && g.rec[49] & 0x80 != q[49] & 0x80 {
            continue;
        }
        if !more_fields_ok(g, q, cm) {
            continue;
        }
        let mut mask = 0u8;
        if has(cm, mcr::SCOPE) {
            mask |= 0xf0;
        }
        if has(cm, mcr::JOIN_STATE) {
            mask |= 0x0f;
        }
        if has(cm, mcr::PORT_GID) {
            let Some(mem) = g.members.get(&want_guid) else {
                continue;
            };
            let ss = (g.rec[48] & 0xf0) | mem.join_state;
            if mask & q[48] != mask & ss {
                continue;
            }
            out.push(record_for(g, mem));
        } else if trusted {
            for mem in g.members.values() {
                let ss = (g.rec[48] & 0xf0) | mem.join_state;
                if mask & q[48] == mask & ss {
                    out.push(record_for(g, mem));
                }
            }
        } else {
            let union = g.members.values().fold(0u8, |a, m| a | m.join_state);
            let ss = (g.rec[48] & 0xf0) | union;
            if mask & q[48] != mask & ss {
                continue;
            }
            let mut r = g.rec.to_vec();
            r[48] = ss;
            out.push(r);
        }
    }
    out
}

/// `pr_process_multicast`: the PathRecord to a multicast DGID.
pub fn multicast_path(sm: &Sm, cm: u64, q: &[u8], requester: u16) -> Answer {
    use super::path_record::{PATH_RECORD_LEN, pr};
    let Some(g) = by_mgid(sm, &q[8..24]) else {
        return Answer::Records(PATH_RECORD_LEN, Vec::new());
    };
    // `pr_match_mgrp_attributes`: what the request names must be the
    // group's.
    let r = &g.rec;
    if has(cm, pr::PKEY) && q[50..52] != r[40..42]
        || has(cm, pr::SL) && (get_be16(q, 52) & 0xf) as u8 != r[44] >> 4
        || has(cm, pr::MTU) && has(cm, pr::MTUSELEC) && q[54] & 0x3f != r[38] & 0x3f
        || has(cm, pr::RATE) && has(cm, pr::RATESELEC) && q[55] & 0x3f != r[42] & 0x3f
    {
        return Answer::Records(PATH_RECORD_LEN, Vec::new());
    }
    let mut p = alloc::vec![0u8; PATH_RECORD_LEN];
    p.copy_from_slice(&q[..PATH_RECORD_LEN]);
    p[8..24].copy_from_slice(g.mgid());
    p[40..42].copy_from_slice(&r[36..38]);
    if !has(cm, pr::SGID)
        && let Some(e) = sm.done.port_by_lid(requester)
    {
        p[24..40].copy_from_slice(&super::gid(sm.cfg.subnet_prefix, e.guid));
    }
    if !has(cm, pr::SLID) {
        p[42..44].copy_from_slice(&requester.to_be_bytes());
    }
    p[48] = r[39];
    p[49] = 1;
    p[50..52].copy_from_slice(&r[40..42]);
    p[52..54].copy_from_slice(&u16::from(r[44] >> 4).to_be_bytes());
    p[54] = 0x80 | (r[38] & 0x3f);
    p[55] = 0x80 | (r[42] & 0x3f);
    p[56] = 0x80 | (r[43] & 0x3f);
    let flow = get_be32_flow(r);
    let hop: u32 = if g.rec[1] & 0x0f == 2 {
        u32::from(r[47])
    } else {
        0xff
    };
    p[44..48].copy_from_slice(&(flow << 8 | hop).to_be_bytes());
    Answer::Records(PATH_RECORD_LEN, alloc::vec![p])
}

/// `ff12:401b:ffff::ffff:ffff`-style text of a GID.
pub fn fmt_gid(g: &[u8]) -> alloc::string::String {
    use core::fmt::Write;
    let mut s = alloc::string::String::new();
    for i in 0..8 {
        let w = u16::from_be_bytes([
            g.get(2 * i).copied().unwrap_or(0),
            g.get(2 * i + 1).copied().unwrap_or(0),
        ]);
        if i > 0 {
            s.push(':');
        }
        let _ = write!(s, "{w:x}");
    }
    s
}
