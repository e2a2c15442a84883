//! The SA's ClassPortInfo, after OpenSM's `osm_sa_class_port_info.c`: the answer OpenSM 3.3.23 gives (capability masks 0x2602 and 0xB5E8 as Debian's build reports them, RespTimeValue from the transaction timeout, RedirectQP 1 and both Q_Keys 0x80010000).
//!
//! Only SubnAdmGet is taken; any other method is REQ_INVALID, as OpenSM
//! answers. The redirection and trap GIDs, LIDs and P_Keys are left 0.

use super::{Reply, Request, SA_DATA, SA_SM_KEY, View, sa_status};
use crate::fabric::packet::{GSI_QKEY, MAD_LEN, MadHdr, method};

/// CapabilityMask: notices, UD multicast, MultiPathRecord, PortInfo
/// CapabilityMask matching.
pub const CAP_MASK: u16 = 0x2602;
/// CapabilityMask2.
pub const CAP_MASK2: u32 = 0xb5e8;

/// 4.096 us * 2^(n+8) in ms, n = 0.. (OpenSM's `msecs_to_rtv_table`).
const MSECS_TO_RTV: [u32; 24] = [
    1, 2, 4, 8, 16, 33, 67, 134, 268, 536, 1073, 2147, 4294, 8589, 17179, 34359, 68719, 137438,
    274877, 549755, 1099511, 2199023, 4398046, 8796093,
];

/// RespTimeValue for a transaction timeout of `ms`.
pub fn resp_time_value(ms: u32) -> u8 {
    let i = MSECS_TO_RTV
        .iter()
        .position(|&t| ms <= t)
        .unwrap_or(MSECS_TO_RTV.len() - 1);
    i as u8 + 8
}

/// `osm_cpi_rcv_process`.
pub fn process(v: &View, r: &Request) -> Reply {
    if r.method() != method::GET {
        return Reply::Error(sa_status::REQ_INVALID);
    }
    let mut m = [0u8; MAD_LEN];
    m[..SA_DATA].copy_from_slice(&r.mad[..SA_DATA]);
    let mut h: MadHdr = r.hdr;
    h.method = method::GET_RESP;
    h.status = 0;
    h.write(&mut m);
    m[24..36].fill(0);
    m[SA_SM_KEY..SA_SM_KEY + 8].fill(0);
    let d = &mut m[SA_DATA..];
    d[0] = 1; // BaseVersion
    d[1] = super::SA_CLASS_VERSION;
    d[2..4].copy_from_slice(&CAP_MASK.to_be_bytes());
    let ms = (v.cfg.smp_timeout_ns / 1_000_000).min(u64::from(u32::MAX)) as u32;
    let rtv = u32::from(resp_time_value(ms));
    d[4..8].copy_from_slice(&(CAP_MASK2 << 5 | (rtv & 0x1f)).to_be_bytes());
    d[32..36].copy_from_slice(&1u32.to_be_bytes()); // RedirectQP
    d[36..40].copy_from_slice(&GSI_QKEY.to_be_bytes()); // RedirectQ_Key
    d[68..72].copy_from_slice(&GSI_QKEY.to_be_bytes()); // TrapQ_Key
    Reply::Mad(Box::new(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_time_of_200_ms_is_16() {
        assert_eq!(resp_time_value(200), 16, "as OpenSM answers (0x10)");
        assert_eq!(resp_time_value(1), 8);
        assert_eq!(resp_time_value(u32::MAX), 31);
    }
}
