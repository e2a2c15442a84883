//! PathRecord, after OpenSM's `osm_sa_path_record.c`: paths between end ports named by GID or LID (or every pair), their MTU and rate the smallest along the route the switches' LFTs take, PacketLifeTime the subnet timeout (0 on a loopback path), checked against the selectors the request carries, Reversible when the way back exists too.
//!
//! As OpenSM 3.3.23: an unknown SGID, DGID or LID gives no records (a Get:
//! NO_RECORDS); an MTU or rate with its selector that is not a valid code is
//! REQ_INVALID; half a ServiceID is INSUF_COMPS; a multicast DGID answers
//! the group's path. The default partition (P_Key 0xFFFF) and SL 0 are the
//! only ones; QoS levels, routers, alias GUIDs and LMC > 0 are left out.

use alloc::vec::Vec;

use hal::be::{get_be16, get_be64};
use ib_core::mad::{Mad, method};

use super::{Answer, gid, has, rec};
use crate::ib_types::{
    CAP_HAS_EXT_SPEEDS, LINK_LOCAL_PREFIX, mtu_is_valid, rate_is_valid, rate_value, sa_method,
    status,
};
use crate::sm::Sm;
use crate::subnet::{EndPort, Subnet};

/// PathRecord size.
pub const PATH_RECORD_LEN: usize = 64;

/// Component mask bits (`IB_PR_COMPMASK_*`).
pub mod pr {
    #![allow(missing_docs)]
    pub const SERVICEID_MSB: u32 = 0;
    pub const SERVICEID_LSB: u32 = 1;
    pub const DGID: u32 = 2;
    pub const SGID: u32 = 3;
    pub const DLID: u32 = 4;
    pub const SLID: u32 = 5;
    pub const RAWTRAFFIC: u32 = 6;
    pub const REVERSIBLE: u32 = 11;
    pub const NUMBPATH: u32 = 12;
    pub const PKEY: u32 = 13;
    pub const SL: u32 = 15;
    pub const MTUSELEC: u32 = 16;
    pub const MTU: u32 = 17;
    pub const RATESELEC: u32 = 18;
    pub const RATE: u32 = 19;
    pub const PKTLIFETIMESELEC: u32 = 20;
    pub const PKTLIFETIME: u32 = 21;
}

/// The parameters of one direction of a path (`osm_path_parms_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathParms {
    /// MTU code.
    pub mtu: u8,
    /// Rate code.
    pub rate: u8,
    /// PacketLifeTime.
    pub pkt_life: u8,
    /// P_Key.
    pub pkey: u16,
    /// SL.
    pub sl: u8,
}

/// What a request asks of a path (the fields and selectors it carries).
#[derive(Debug, Clone, Copy, Default)]
pub struct Wants {
    /// MTU selector and code, if both are in the mask.
    pub mtu: Option<(u8, u8)>,
    /// Rate selector and code.
    pub rate: Option<(u8, u8)>,
    /// PacketLifeTime selector and value.
    pub pkt_life: Option<(u8, u8)>,
    /// A P_Key asked for.
    pub pkey: Option<u16>,
    /// An SL asked for.
    pub sl: Option<u8>,
    /// Raw traffic (no P_Key).
    pub raw: bool,
}

/// MTU and rate along the route from `src` to `dst` by the LFTs: the
/// smallest MTUCap and the slowest port passed (`pr_rcv_get_path_parms`'
/// walk). `None` if the LFTs lead nowhere.
pub fn route_mtu_rate(s: &Subnet, src: &EndPort, dst: &EndPort) -> Option<(u8, u8)> {
    let spi = s.end_pi(src)?;
    let dpi = s.end_pi(dst)?;
    let mut mtu = spi.mtu_cap();
    let mut rate = spi.rate();
    let slow = |rate: &mut u8, r: u8| {
        if rate_value(r) < rate_value(*rate) {
            *rate = r;
        }
    };
    if src.guid != dst.guid {
        // Where we stand: a port on the way out of a node.
        let mut at = (src.node, src.port);
        if s.nodes.get(&src.node)?.is_switch() {
            let out = *s
                .nodes
                .get(&src.node)?
                .sw
                .as_ref()?
                .lft
                .get(usize::from(dst.lid))?;
            at = (src.node, out);
        }
        let mut hops = 0;
        loop {
            if at == (dst.node, dst.port) {
                break;
            }
            let here = s.physp(at.0, at.1)?;
            let next = here.remote?;
            if next == (dst.node, dst.port) {
                break;
            }
            let n = s.nodes.get(&next.0)?;
            if !n.is_switch() {
                return None;
            }
            // A switch's ports rate extended speeds by its port 0's
            // CapabilityMask (OpenSM's `p0_extended`).
            let p0_ext = n
                .ports
                .get(&0)
                .and_then(|p| p.pi)
                .is_some_and(|pi| pi.capability_mask() & CAP_HAS_EXT_SPEEDS != 0);
            let inp = n.ports.get(&next.1)?.pi?;
            mtu = mtu.min(inp.mtu_cap());
            slow(&mut rate, inp.rate_ext(p0_ext));
            let out = *n.sw.as_ref()?.lft.get(usize::from(dst.lid))?;
            if out == crate::ib_types::LFT_NO_PATH {
                return None;
            }
            at = (next.0, out);
            if at == (dst.node, dst.port) {
                break;
            }
            let outp = n.ports.get(&out)?.pi?;
            mtu = mtu.min(outp.mtu_cap());
            slow(&mut rate, outp.rate_ext(p0_ext));
            hops += 1;
            if hops > 64 {
                return None;
            }
        }
    }
    mtu = mtu.min(dpi.mtu_cap());
    slow(&mut rate, dpi.rate());
    Some((mtu, rate))
}

/// The fastest rate slower than `r` (`ib_path_rate_get_prev`).
pub(crate) fn rate_prev(r: u8) -> Option<u8> {
    crate::ib_types::RATES
        .iter()
        .rev()
        .copied()
        .find(|&x| rate_value(x) < rate_value(r))
}

/// `pr_rcv_get_path_parms`: one direction's parameters, or `None` if the
/// request's selectors rule the path out.
pub fn path_parms(sm: &Sm, src: &EndPort, dst: &EndPort, w: &Wants) -> Option<PathParms> {
    let s = &sm.done;
    let (mut mtu, mut rate) = route_mtu_rate(s, src, dst)?;
    let mut pkt_life = if src.guid == dst.guid {
        0
    } else {
        sm.cfg.subnet_timeout
    };
    if let Some((sel, req)) = w.mtu {
        match sel {
            0 if mtu <= req => return None,
            1 if mtu >= req => {
                if req > 1 {
                    mtu = req - 1;
                } else {
                    return None;
                }
            }
            2 if mtu < req => return None,
            2 => mtu = req,
            _ => {}
        }
    }
    if let Some((sel, req)) = w.rate {
        let (have, want) = (rate_value(rate), rate_value(req));
        match sel {
            0 if have <= want => return None,
            1 if have >= want => rate = rate_prev(req)?,
            2 if have < want => return None,
            2 => rate = req,
            _ => {}
        }
    }
    if let Some((sel, req)) = w.pkt_life {
        match sel {
            0 if pkt_life <= req => return None,
            1 if pkt_life >= req => {
                if req > 1 {
                    pkt_life = req - 1;
                } else {
                    return None;
                }
            }
            2 if pkt_life < req => return None,
            2 => pkt_life = req,
            _ => {}
        }
    }
    let pkey = if w.raw {
        0
    } else if let Some(k) = w.pkey {
        // The default partition is the only one: every port is a full
        // member of 0xFFFF.
        if k & 0x7fff != 0x7fff {
            return None;
        }
        k
    } else {
        0xffff
    };
    let sl = w.sl.unwrap_or(0);
    Some(PathParms {
        mtu,
        rate,
        pkt_life,
        pkey,
        sl,
    })
}

/// `pr_rcv_build_pr`.
pub fn build_pr(sm: &Sm, src: &EndPort, dst: &EndPort, p: &PathParms, reversible: bool) -> Vec<u8> {
    let prefix = sm.cfg.subnet_prefix;
    let mut r = alloc::vec![0u8; PATH_RECORD_LEN];
    r[8..24].copy_from_slice(&gid(prefix, dst.guid));
    r[24..40].copy_from_slice(&gid(prefix, src.guid));
    r[40..42].copy_from_slice(&dst.lid.to_be_bytes());
    r[42..44].copy_from_slice(&src.lid.to_be_bytes());
    r[49] = if reversible { 0x80 } else { 0 };
    r[50..52].copy_from_slice(&p.pkey.to_be_bytes());
    r[52..54].copy_from_slice(&u16::from(p.sl & 0xf).to_be_bytes());
    r[54] = 0x80 | (p.mtu & 0x3f);
    r[55] = 0x80 | (p.rate & 0x3f);
    r[56] = 0x80
        | if src.guid == dst.guid {
            0
        } else {
            p.pkt_life & 0x3f
        };
    r
}

/// The wants of a PathRecord request.
pub fn wants(cm: u64, q: &[u8]) -> Wants {
    Wants {
        mtu: (has(cm, pr::MTUSELEC) && has(cm, pr::MTU)).then(|| (q[54] >> 6, q[54] & 0x3f)),
        rate: (has(cm, pr::RATESELEC) && has(cm, pr::RATE)).then(|| (q[55] >> 6, q[55] & 0x3f)),
        pkt_life: (has(cm, pr::PKTLIFETIMESELEC) && has(cm, pr::PKTLIFETIME))
            .then(|| (q[56] >> 6, q[56] & 0x3f)),
        pkey: has(cm, pr::PKEY).then(|| get_be16(q, 50)),
        sl: has(cm, pr::SL).then(|| (get_be16(q, 52) & 0xf) as u8),
        raw: has(cm, pr::RAWTRAFFIC) && q[44] & 0x80 != 0,
    }
}

/// `pr_rcv_get_lid_pair_path`: a path if its parameters hold both ways as
/// asked.
pub fn lid_pair_path(
    sm: &Sm,
    src: &EndPort,
    dst: &EndPort,
    w: &Wants,
    want_reversible: bool,
) -> Option<Vec<u8>> {
    let p = path_parms(sm, src, dst, w)?;
    let reversible = path_parms(sm, dst, src, w).is_some();
    if want_reversible && !reversible {
        return None;
    }
    Some(build_pr(sm, src, dst, &p, reversible))
}

/// An end port named by a GID: `Err(())` if the prefix is not ours (or
/// link-local) or the GUID unknown.
fn by_gid<'a>(sm: &'a Sm, g: &[u8]) -> Result<&'a EndPort, ()> {
    let prefix = get_be64(g, 0);
    if prefix != LINK_LOCAL_PREFIX && prefix != sm.cfg.subnet_prefix {
        return Err(());
    }
    sm.done.port_by_guid(get_be64(g, 8)).ok_or(())
}

/// `osm_pr_rcv_process`.
pub fn process(sm: &Sm, m: &Mad, requester: u16) -> Answer {
    if m.method() != method::GET && m.method() != sa_method::GET_TABLE {
        return Answer::Error(status::UNSUP_METHOD_ATTR);
    }
    let cm = super::comp_mask(m);
    let q = rec(m);
    if has(cm, pr::RATESELEC) && has(cm, pr::RATE) && !rate_is_valid(q[55] & 0x3f) {
        return Answer::Error(status::SA_REQ_INVALID);
    }
    if has(cm, pr::MTUSELEC) && has(cm, pr::MTU) && !mtu_is_valid(q[54] & 0x3f) {
        return Answer::Error(status::SA_REQ_INVALID);
    }
    if has(cm, pr::SERVICEID_MSB) != has(cm, pr::SERVICEID_LSB) {
        return Answer::Error(status::SA_INSUF_COMPS);
    }
    if has(cm, pr::DGID) && q[8] == 0xff {
        return super::mcmember_record::multicast_path(sm, cm, q, requester);
    }
    let get = m.method() == method::GET;
    let out = paths(sm, cm, q, get);
    Answer::Records(PATH_RECORD_LEN, out)
}

/// The paths a request names (`osm_pr_get_end_points` and the pair, half
/// and world cases).
pub fn paths(sm: &Sm, cm: u64, q: &[u8], get: bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let src: Option<&EndPort> = if has(cm, pr::SGID) {
        match by_gid(sm, &q[24..40]) {
            Ok(e) => Some(e),
            Err(()) => return out,
        }
    } else {
        None
    };
    let slid_port = if has(cm, pr::SLID) {
        match sm.done.port_by_lid(get_be16(q, 42)) {
            Some(e) => Some(e),
            None => return out,
        }
    } else {
        None
    };
    let dst: Option<&EndPort> = if has(cm, pr::DGID) {
        match by_gid(sm, &q[8..24]) {
            Ok(e) => Some(e),
            Err(()) => return out,
        }
    } else {
        None
    };
    let dlid_port = if has(cm, pr::DLID) {
        match sm.done.port_by_lid(get_be16(q, 40)) {
            Some(e) => Some(e),
            None => return out,
        }
    } else {
        None
    };
    // A GID and a LID naming two different ports name no path.
    if let (Some(a), Some(b)) = (src, slid_port)
        && a.guid != b.guid
    {
        return out;
    }
    if let (Some(a), Some(b)) = (dst, dlid_port)
        && a.guid != b.guid
    {
        return out;
    }
    let s = src.or(slid_port);
    let d = dst.or(dlid_port);
    let w = wants(cm, q);
    let want_rev = has(cm, pr::REVERSIBLE) && q[49] & 0x80 != 0;
    let limit = if get {
        1
    } else if has(cm, pr::NUMBPATH) {
        usize::from(q[49] & 0x7f)
    } else {
        usize::MAX
    };
    let all: Vec<&EndPort> = sm.done.ports.values().collect();
    let srcs: Vec<&EndPort> = match s {
        Some(e) => alloc::vec![e],
        None => all.clone(),
    };
    let dsts: Vec<&EndPort> = match d {
        Some(e) => alloc::vec![e],
        None => all,
    };
    for a in &srcs {
        for b in &dsts {
            if a.lid == 0 || b.lid == 0 {
                continue;
            }
            // NumbPath counts per port pair (one path each with LMC 0).
            if limit == 0 {
                continue;
            }
            if let Some(r) = lid_pair_path(sm, a, b, &w, want_rev) {
                out.push(r);
            }
            if get && !out.is_empty() && s.is_some() && d.is_some() {
                return out;
            }
        }
    }
    out
}
