//! PathRecord, after OpenSM's `osm_sa_path_record.c`: paths between end ports named by GID or LID (a pair, one end and every port, or every pair), their MTU and rate the smallest along the route the switches' LFTs take, PacketLifeTime the subnet timeout (0 on a loopback path), adjusted to the selectors the request carries, Reversible when the way back exists too; a multicast destination answers the group's path.
//!
//! As OpenSM 3.3.23: an unknown SGID, DGID, SLID or DLID (or a GID of
//! another subnet) gives no records (a Get: NO_RECORDS); an MTU or rate
//! with its selector that is not a valid code is REQ_INVALID; half a
//! ServiceID is INSUF_COMPS; a multicast DGID with a unicast DLID is
//! INVALID_FIELD. The default partition (P_Key 0xFFFF) and SL 0 are the
//! only ones; QoS levels, routers, alias GUIDs and LMC > 0 are left out.

use super::{
    CAP_HAS_EXT_SPEEDS, Reply, Request, SaState, View, be16, be32, be64, gid, has, link_rate,
    link_rate_ext, mtu_is_valid, rate_is_valid, rate_value, sa_status,
};
use crate::fabric::packet::mad_status;
use crate::fabric::sm::EndPort;

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
    pub const FLOWLABEL: u32 = 8;
    pub const HOPLIMIT: u32 = 9;
    pub const TCLASS: u32 = 10;
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

/// What a request asks of a path: the fields and selectors it carries.
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

/// The wants of a PathRecord request.
pub fn wants(cm: u64, q: &[u8]) -> Wants {
    Wants {
        mtu: (has(cm, pr::MTUSELEC) && has(cm, pr::MTU)).then(|| (q[54] >> 6, q[54] & 0x3f)),
        rate: (has(cm, pr::RATESELEC) && has(cm, pr::RATE)).then(|| (q[55] >> 6, q[55] & 0x3f)),
        pkt_life: (has(cm, pr::PKTLIFETIMESELEC) && has(cm, pr::PKTLIFETIME))
            .then(|| (q[56] >> 6, q[56] & 0x3f)),
        pkey: has(cm, pr::PKEY).then(|| be16(q, 50)),
        sl: has(cm, pr::SL).then(|| (be16(q, 52) & 0xf) as u8),
        raw: has(cm, pr::RAWTRAFFIC) && q[44] & 0x80 != 0,
    }
}

/// MTU (code) and rate (code) along the LID route from `src` to `dst`:
/// the smallest MTUCap and slowest link on the way (both ends and every
/// switch port passed). `None` if the LFTs lead nowhere.
pub fn route_mtu_rate(v: &View, src: &EndPort, dst: &EndPort) -> Option<(u8, u8)> {
    let mut mtu = (src.port_info[41] & 0xf).min(dst.port_info[41] & 0xf);
    let mut rate = link_rate(&src.port_info);
    let slow = |rate: &mut u8, r: u8| {
        if rate_value(r) < rate_value(*rate) {
            *rate = r;
        }
    };
    slow(&mut rate, link_rate(&dst.port_info));
    if src.port_guid == dst.port_guid {
        return Some((mtu, rate));
    }
    let mut at = (src.node_guid, src.port);
    // A CA port: step over its cable first.
    if src.node_type != 2 {
        at = *v.links.get(&at)?;
    }
    for _ in 0..64 {
        let (node, in_port) = at;
        if node == dst.node_guid {
            // Arrived: a CA on the port asked for, a switch on any.
            return (dst.node_type == 2 || in_port == dst.port).then_some((mtu, rate));
        }
        let lft = v.lfts.get(&node)?;
        let out = *lft.get(usize::from(dst.lid))?;
        if out == 0 || out == 0xff {
            return None;
        }
        // A switch's ports rate their extended speeds by its port 0's
        // CapabilityMask (OpenSM's `p0_extended`).
        let p0_extended = v
            .port_infos
            .get(&(node, 0))
            .is_some_and(|i| be32(i, 20) & CAP_HAS_EXT_SPEEDS != 0);
        for p in [in_port, out] {
            if let Some(i) = v.port_infos.get(&(node, p)) {
                mtu = mtu.min(i[41] & 0xf);
                slow(&mut rate, link_rate_ext(i, p0_extended));
            }
        }
        at = *v.links.get(&(node, out))?;
    }
    None
}

/// The rate codes by speed.
const RATES: [u8; 21] = [
    2, 5, 3, 11, 6, 4, 15, 19, 7, 8, 20, 12, 9, 10, 16, 13, 14, 17, 18, 21, 22,
];

/// The fastest rate slower than `r` (`ib_path_rate_get_prev`).
pub(super) fn rate_prev(r: u8) -> Option<u8> {
    RATES
        .iter()
        .rev()
        .copied()
        .find(|&x| rate_value(x) < rate_value(r))
}

/// One direction of a path (`osm_path_parms_t`).
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

/// `pr_rcv_get_path_parms`: one direction's parameters, or `None` if the
/// request's selectors rule the path out. A selector "less than" takes
/// the largest value below what was asked, "exactly" the value asked.
pub fn path_parms(v: &View, src: &EndPort, dst: &EndPort, w: &Wants) -> Option<PathParms> {
    let (mut mtu, mut rate) = route_mtu_rate(v, src, dst)?;
    let mut pkt_life = if src.port_guid == dst.port_guid {
        0
    } else {
        v.cfg.packet_life_time & 0x3f
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
    Some(PathParms {
        mtu,
        rate,
        pkt_life,
        pkey,
        sl: w.sl.unwrap_or(v.cfg.sm_sl & 0xf),
    })
}

/// `pr_rcv_build_pr`: selectors 2 ("exactly"), HopLimit 0 inside the
/// subnet, NumbPath 0.
pub fn build_pr(
    v: &View,
    src: &EndPort,
    dst: &EndPort,
    p: &PathParms,
    reversible: bool,
) -> Vec<u8> {
    let prefix = v.cfg.subnet_prefix;
    let mut r = vec![0u8; PATH_RECORD_LEN];
    r[8..24].copy_from_slice(&gid(prefix, dst.port_guid));
    r[24..40].copy_from_slice(&gid(prefix, src.port_guid));
    r[40..42].copy_from_slice(&dst.lid.to_be_bytes());
    r[42..44].copy_from_slice(&src.lid.to_be_bytes());
    r[49] = if reversible { 0x80 } else { 0 };
    r[50..52].copy_from_slice(&p.pkey.to_be_bytes());
    r[52..54].copy_from_slice(&u16::from(p.sl & 0xf).to_be_bytes());
    r[54] = 0x80 | (p.mtu & 0x3f);
    r[55] = 0x80 | (p.rate & 0x3f);
    r[56] = 0x80 | (p.pkt_life & 0x3f);
    r
}

/// `pr_rcv_get_lid_pair_path`: the path if its parameters hold both
/// ways as asked (reversible), or one way when reversibility is not asked.
pub fn lid_pair_path(
    v: &View,
    src: &EndPort,
    dst: &EndPort,
    w: &Wants,
    want_reversible: bool,
) -> Option<Vec<u8>> {
    let p = path_parms(v, src, dst, w)?;
    let reversible = path_parms(v, dst, src, w).is_some();
    if want_reversible && !reversible {
        return None;
    }
    Some(build_pr(v, src, dst, &p, reversible))
}

/// The end port a GID names: `None` for another subnet's prefix or an
/// unknown GUID.
pub fn by_gid<'a>(v: &View<'a>, g: &[u8]) -> Option<&'a EndPort> {
    let prefix = be64(g, 0);
    if prefix != super::LINK_LOCAL_PREFIX && prefix != v.cfg.subnet_prefix {
        return None;
    }
    v.port_by_guid(be64(g, 8))
}

/// `osm_pr_rcv_process`.
pub fn process(v: &View, st: &SaState, r: &Request) -> Reply {
    if !r.is_query() {
        return Reply::Error(mad_status::ATTR_UNSUPPORTED);
    }
    let (cm, q) = (r.cm, r.rec());
    if has(cm, pr::RATESELEC) && has(cm, pr::RATE) && !rate_is_valid(q[55] & 0x3f) {
        return Reply::Error(sa_status::REQ_INVALID);
    }
    if has(cm, pr::MTUSELEC) && has(cm, pr::MTU) && !mtu_is_valid(q[54] & 0x3f) {
        return Reply::Error(sa_status::REQ_INVALID);
    }
    if has(cm, pr::SERVICEID_MSB) != has(cm, pr::SERVICEID_LSB) {
        return Reply::Error(sa_status::INSUFFICIENT_COMPONENTS);
    }
    // A multicast destination (`pr_rcv_check_mcast_dest`).
    let mc_gid = has(cm, pr::DGID) && q[8] == 0xff;
    let mc_lid = has(cm, pr::DLID) && (0xc000..=0xfffe).contains(&be16(q, 40));
    if mc_gid && has(cm, pr::DLID) && !mc_lid {
        return Reply::Error(mad_status::INVALID_FIELD);
    }
    if mc_gid || mc_lid {
        return Reply::Records(
            PATH_RECORD_LEN,
            super::mcmember_record::multicast_path(st, cm, q, r.method()),
        );
    }
    let get = r.method() == crate::fabric::packet::method::GET;
    Reply::Records(PATH_RECORD_LEN, paths(v, cm, q, get))
}

/// The paths a request names (`osm_pr_get_end_points` and the pair,
/// half and world cases).
pub fn paths(v: &View, cm: u64, q: &[u8], get: bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let src = if has(cm, pr::SGID) {
        match by_gid(v, &q[24..40]) {
            Some(e) => Some(e),
            None => return out,
        }
    } else {
        None
    };
    let slid_port = if has(cm, pr::SLID) {
        match v.port_by_lid(be16(q, 42)) {
            Some(e) => Some(e),
            None => return out,
        }
    } else {
        None
    };
    let dst = if has(cm, pr::DGID) {
        match by_gid(v, &q[8..24]) {
            Some(e) => Some(e),
            None => return out,
        }
    } else {
        None
    };
    let dlid_port = if has(cm, pr::DLID) {
        match v.port_by_lid(be16(q, 40)) {
            Some(e) => Some(e),
            None => return out,
        }
    } else {
        None
    };
    // A GID and a LID naming two different ports name no path.
    if let (Some(a), Some(b)) = (src, slid_port)
        && a.port_guid != b.port_guid
    {
        return out;
    }
    if let (Some(a), Some(b)) = (dst, dlid_port)
        && a.port_guid != b.port_guid
    {
        return out;
    }
    let s = src.or(slid_port);
    let d = dst.or(dlid_port);
    let w = wants(cm, q);
    let want_rev = has(cm, pr::REVERSIBLE) && q[49] & 0x80 != 0;
    // NumbPath 0 (in a GetTable) asks for no path.
    if !get && has(cm, pr::NUMBPATH) && q[49] & 0x7f == 0 {
        return out;
    }
    let srcs: Vec<&EndPort> = match s {
        Some(e) => vec![e],
        None => v.ports.iter().collect(),
    };
    let dsts: Vec<&EndPort> = match d {
        Some(e) => vec![e],
        None => v.ports.iter().collect(),
    };
    for a in &srcs {
        for b in &dsts {
            if a.lid == 0 || b.lid == 0 {
                continue;
            }
            if let Some(r) = lid_pair_path(v, a, b, &w, want_rev) {
                out.push(r);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_slower_rate() {
        // OpenSM 3.3.23's order: 28 Gb/s (2x FDR, 35 equivalent) is next
        // below 40, then 25 Gb/s (1x EDR), then 30.
        assert_eq!(rate_prev(7), Some(19));
        assert_eq!(rate_prev(19), Some(15));
        assert_eq!(rate_prev(15), Some(4));
        assert_eq!(rate_prev(2), None);
        assert_eq!(rate_prev(3), Some(5));
    }
}
