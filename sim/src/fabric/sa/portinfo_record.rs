//! PortInfoRecord, after OpenSM's `osm_sa_portinfo_record.c`: one record per port (a switch: each of its ports under its LID), filtered on every PortInfo field the component mask names, the CapabilityMask bitwise when the attribute modifier's bit 31 asks (what `saquery -s` uses to list the SM ports), the M_Key shown only to a trusted request.
//!
//! Extended link speeds are compared only where the port has them;
//! partition checks are left out.

use super::{Reply, Request, View, be16, be32, has};
use crate::fabric::packet::mad_status;

/// PortInfoRecord: EndportLID, PortNum, Options, PortInfo (64).
pub const PORTINFO_RECORD_LEN: usize = 68;

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

/// Whether PortInfo `pi` passes the filter `q` under `cm`; `enhanced`:
/// the CapabilityMask (and CapabilityMask2) compare bitwise; `cap0`: the
/// CapabilityMask that says whether the port has extended speeds.
pub fn matches(pi: &[u8], q: &[u8], cm: u64, enhanced: bool, cap0: u32) -> bool {
    for &(bit, off, len, mask) in FIELDS {
        if has(cm, bit) && !field_eq(pi, q, off, len, mask) {
            return false;
        }
    }
    let masked = |have: u32, want: u32| {
        if enhanced {
            have & want == want
        } else {
            have == want
        }
    };
    if has(cm, 7) && !masked(be32(pi, 20), be32(q, 20)) {
        return false;
    }
    if has(cm, 53) && !masked(u32::from(be16(pi, 60)), u32::from(be16(q, 60))) {
        return false;
    }
    // Extended speeds only where the port has them (CapabilityMask bit 14).
    if cap0 & (1 << 14) != 0 {
        for (bit, off, mask) in [(54, 62, 0xf0u8), (55, 62, 0x0f), (57, 63, 0x1f)] {
            if has(cm, bit) && pi[off] & mask != q[off] & mask {
                return false;
            }
        }
    }
    true
}

/// `osm_pir_rcv_process`.
pub fn process(v: &View, r: &Request) -> Reply {
    if !r.is_query() {
        return Reply::Error(mad_status::ATTR_UNSUPPORTED);
    }
    let (cm, q) = (r.cm, r.rec());
    let qpi = &q[4..68];
    let enhanced = r.hdr.attr_mod & (1 << 31) != 0;
    // By EndportLID (or the PortInfo LID): that node only.
    let only = if has(cm, 0) || has(cm, 5) {
        let lid = if has(cm, 0) {
            be16(q, 0)
        } else {
            be16(qpi, 16)
        };
        match v.port_by_lid(lid) {
            Some(e) => Some(e.node_guid),
            None => return Reply::Records(PORTINFO_RECORD_LEN, Vec::new()),
        }
    } else {
        None
    };
    let mut out = Vec::new();
    for e in v.ports {
        if only.is_some_and(|g| g != e.node_guid) || e.lid == 0 {
            continue;
        }
        if has(cm, 0) && e.lid != be16(q, 0) {
            continue;
        }
        // A switch answers for each of its ports under its LID.
        let nums: Vec<u8> = if e.node_type == 2 {
            (0..=e.node_info[3]).collect()
        } else {
            vec![e.port]
        };
        let cap0 = be32(&e.port_info, 20);
        for p in nums {
            if has(cm, 1) && p != q[2] {
                continue;
            }
            let info = if e.node_type == 2 && p != 0 {
                match v.port_infos.get(&(e.node_guid, p)) {
                    Some(i) => *i,
                    None => continue,
                }
            } else {
                e.port_info
            };
            if !matches(&info, qpi, cm, enhanced, cap0) {
                continue;
            }
            let mut rec = vec![0u8; PORTINFO_RECORD_LEN];
            rec[0..2].copy_from_slice(&e.lid.to_be_bytes());
            rec[2] = p;
            if has(cm, 2) {
                rec[3] = q[3];
            }
            rec[4..68].copy_from_slice(&info);
            // The M_Key only to a requester that knows the SM_Key.
            if !r.trusted {
                rec[4..12].fill(0);
            }
            out.push(rec);
        }
    }
    Reply::Records(PORTINFO_RECORD_LEN, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_mask_matches_bitwise_when_enhanced() {
        let mut pi = [0u8; 64];
        pi[20..24].copy_from_slice(&0x0251_486au32.to_be_bytes());
        let mut q = [0u8; 64];
        q[20..24].copy_from_slice(&2u32.to_be_bytes());
        assert!(matches(&pi, &q, 1 << 7, true, 0), "IsSM set: listed");
        assert!(!matches(&pi, &q, 1 << 7, false, 0), "exact compare");
        pi[20..24].copy_from_slice(&0x0251_4868u32.to_be_bytes());
        assert!(!matches(&pi, &q, 1 << 7, true, 0), "no IsSM: not listed");
        assert!(matches(&pi, &q, 0, true, 0), "no component: all");
        let mut q2 = [0u8; 64];
        q2[32] = 4;
        pi[32] = 0x54;
        assert!(matches(&pi, &q2, 1 << 15, false, 0));
        pi[32] = 0x52;
        assert!(!matches(&pi, &q2, 1 << 15, false, 0));
    }
}
