//! PortInfoRecord, after OpenSM's `osm_sa_portinfo_record.c`: one record per port (a switch: each of its ports under its LID), filtered on every PortInfo field the component mask names, the CapabilityMask bitwise when the attribute modifier's bit 31 asks (what `saquery -s` uses to list SM ports), the M_Key shown only to a trusted request.
//!
//! Extended link speeds are reported as read (OpenSM adds the QDR bit when
//! an extended speed is active); partition checks are left out.

use alloc::vec::Vec;

use hal::be::{get_be16, get_be32};
use ib_core::mad::{Mad, method};

use super::{Answer, has, rec};
use crate::ib_types::{PortInfo, sa_method, status};
use crate::sm::Sm;
use crate::subnet::Node;

/// PortInfoRecord size (LID, port, options, PortInfo, pad).
pub const PORTINFO_RECORD_LEN: usize = 72;

/// Component bit -> (byte of PortInfo, length, mask of a one-byte field).
const FIELDS: &[(u32, usize, usize, u8)] = &[
    (3, 0, 8, 0xff),   // M_Key
    (4, 8, 8, 0xff),   // GidPrefix
    (5, 16, 2, 0xff),  // LID
    (6, 18, 2, 0xff),  // MasterSMLID
    (8, 24, 2, 0xff),  // DiagCode
    (9, 26, 2, 0xff),  // M_KeyLeasePeriod
    (10, 28, 1, 0xff), // LocalPortNum
    (11, 29, 1, 0xff), // LinkWidthEnabled
    (12, 30, 1, 0xff), // LinkWidthSupported
    (13, 31, 1, 0xff), // LinkWidthActive
    (14, 32, 1, 0xf0), // LinkSpeedSupported
    (15, 32, 1, 0x0f), // PortState
    (16, 33, 1, 0xf0), // PortPhysicalState
    (17, 33, 1, 0x0f), // LinkDownDefaultState
    (18, 34, 1, 0xc0), // M_KeyProtectBits
    (20, 34, 1, 0x07), // LMC
    (21, 35, 1, 0xf0), // LinkSpeedActive
    (22, 35, 1, 0x0f), // LinkSpeedEnabled
    (23, 36, 1, 0xf0), // NeighborMTU
    (24, 36, 1, 0x0f), // MasterSMSL
    (25, 37, 1, 0xf0), // VLCap
    (26, 37, 1, 0x0f), // InitType
    (27, 38, 1, 0xff), // VLHighLimit
    (28, 39, 1, 0xff), // VLArbitrationHighCap
    (29, 40, 1, 0xff), // VLArbitrationLowCap
    (31, 41, 1, 0x0f), // MTUCap
    (32, 42, 1, 0xe0), // VLStallCount
    (33, 42, 1, 0x1f), // HOQLife
    (34, 43, 1, 0xf0), // OperationalVLs
    (35, 43, 1, 0x08), // PartitionEnforcementInbound
    (36, 43, 1, 0x04), // PartitionEnforcementOutbound
    (37, 43, 1, 0x02), // FilterRawInbound
    (38, 43, 1, 0x01), // FilterRawOutbound
    (39, 44, 2, 0xff), // M_KeyViolations
    (40, 46, 2, 0xff), // P_KeyViolations
    (41, 48, 2, 0xff), // Q_KeyViolations
    (42, 50, 1, 0xff), // GUIDCap
    (45, 51, 1, 0x1f), // SubnetTimeOut
    (47, 52, 1, 0x1f), // RespTimeValue
    (48, 53, 1, 0xf0), // LocalPhyErrors
    (49, 53, 1, 0x0f), // OverrunErrors
];

fn field_eq(a: &[u8], b: &[u8], off: usize, len: usize, mask: u8) -> bool {
    if len == 1 {
        a[off] & mask == b[off] & mask
    } else {
        a[off..off + len] == b[off..off + len]
    }
}

/// Whether PortInfo `pi` passes the filter `q` under `cm`.
pub fn matches(pi: &PortInfo, q: &PortInfo, cm: u64, enhanced: bool, cap0: u32) -> bool {
    for &(bit, off, len, mask) in FIELDS {
        if has(cm, bit) && !field_eq(&pi.0, &q.0, off, len, mask) {
            return false;
        }
    }
    if has(cm, 7) {
        let (have, want) = (pi.capability_mask(), q.capability_mask());
        let ok = if enhanced {
            have & want == want
        } else {
            have == want
        };
        if !ok {
            return false;
        }
    }
    if has(cm, 53) {
        let (have, want) = (get_be16(&pi.0, 60), get_be16(&q.0, 60));
        let ok = if enhanced {
            have & want == want
        } else {
            have == want
        };
        if !ok {
            return false;
        }
    }
    // Extended speeds only where the port has them (CapabilityMask bit 14).
    if cap0 & (1 << 14) != 0 {
        for (bit, off, mask) in [(54, 62, 0xf0u8), (55, 62, 0x0f), (57, 63, 0x1f)] {
            if has(cm, bit) && pi.0[off] & mask != q.0[off] & mask {
                return false;
            }
        }
    }
    true
}

fn node_records(
    sm: &Sm,
    n: &Node,
    q: &[u8],
    cm: u64,
    enhanced: bool,
    trusted: bool,
    out: &mut Vec<Vec<u8>>,
) {
    let qpi = PortInfo::from_smp(&q[4..68]);
    let end_port = if n.is_switch() { Some(0) } else { None };
    let cap0 = n
        .ports
        .get(&0)
        .and_then(|p| p.pi)
        .map_or(0, |p| p.capability_mask());
    for (&p, pp) in &n.ports {
        if has(cm, 1) && p != q[2] {
            continue;
        }
        let Some(pi) = pp.pi else { continue };
        // The port's LID: its own (CA) or the switch's.
        let lid_port = end_port.unwrap_or(p);
        let Some(lp) = n.ports.get(&lid_port) else {
            continue;
        };
        let lid = super::lid_of(sm, lp.guid);
        if lid == 0 && !n.is_switch() {
            continue;
        }
        if has(cm, 0) && lid != get_be16(q, 0) {
            continue;
        }
        let cap = if n.is_switch() {
            cap0
        } else {
            pi.capability_mask()
        };
        if !matches(&pi, &qpi, cm, enhanced, cap) {
            continue;
        }
        let mut r = alloc::vec![0u8; PORTINFO_RECORD_LEN];
        r[0..2].copy_from_slice(&lid.to_be_bytes());
        r[2] = p;
        if has(cm, 2) {
            r[3] = q[3];
        }
        r[4..68].copy_from_slice(&pi.0);
        if !trusted {
            r[4..12].fill(0);
        }
        out.push(r);
    }
}

/// `osm_pir_rcv_process`.
pub fn process(sm: &Sm, m: &Mad) -> Answer {
    if m.method() != method::GET && m.method() != sa_method::GET_TABLE {
        return Answer::Error(status::UNSUP_METHOD_ATTR);
    }
    let cm = super::comp_mask(m);
    let q = rec(m);
    let enhanced = get_be32(&m.0, 20) & (1 << 31) != 0;
    let trusted = hal::be::get_be64(&m.0, super::SA_SM_KEY) != 0;
    let mut out = Vec::new();
    if has(cm, 0) || has(cm, 5) {
        let lid = get_be16(q, 0);
        if let Some(e) = sm.done.port_by_lid(lid)
            && let Some(n) = sm.done.nodes.get(&e.node)
        {
            node_records(sm, n, q, cm, enhanced, trusted, &mut out);
        }
    } else {
        for n in sm.done.nodes.values() {
            node_records(sm, n, q, cm, enhanced, trusted, &mut out);
        }
    }
    Answer::Records(PORTINFO_RECORD_LEN, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_mask_matches_bitwise_when_enhanced() {
        let mut pi = PortInfo::default();
        pi.set_capability_mask(0x0251_486a);
        let mut q = PortInfo::default();
        q.set_capability_mask(0x2);
        assert!(matches(&pi, &q, 1 << 7, true, 0), "IsSM set: listed");
        assert!(!matches(&pi, &q, 1 << 7, false, 0), "exact compare");
        pi.set_capability_mask(0x0251_4868);
        assert!(!matches(&pi, &q, 1 << 7, true, 0), "no IsSM: not listed");
        assert!(matches(&pi, &q, 0, true, 0), "no component: all");
        let mut q2 = PortInfo::default();
        q2.set_port_state(4);
        pi.set_port_state(4);
        assert!(matches(&pi, &q2, 1 << 15, false, 0));
        pi.set_port_state(2);
        assert!(!matches(&pi, &q2, 1 << 15, false, 0));
    }
}
