//! ClassPortInfo of the SA, after OpenSM's `osm_sa_class_port_info.c`: the answer OpenSM 3.3.23 gives (capability masks 0x2602 and 0xB5E8 as its Debian build reports them, RespTimeValue from the transaction timeout, RedirectQP 1 and both Q_Keys 0x80010000).
//!
//! Only SubnAdmGet is taken; any other method is REQ_INVALID, as OpenSM
//! answers.

use hal::be::{put_be16, put_be32};
use ib_core::mad::{Mad, method};

use super::{Answer, SA_DATA, SA_SM_KEY};
use crate::ib_types::status;
use crate::sm::Sm;

/// CapabilityMask: Get/Set Notice, UD multicast, MultiPathRecord,
/// PortInfo CapabilityMask matching.
pub const CAP_MASK: u16 = 0x2602;
/// CapabilityMask2 (OpenSM 3.3.23's).
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
pub fn process(sm: &Sm, m: &Mad) -> Answer {
    if m.method() != method::GET {
        return Answer::Error(status::SA_REQ_INVALID);
    }
    let mut r = Mad::default();
    r.0[..SA_DATA].copy_from_slice(&m.0[..SA_DATA]);
    r.0[24..36].fill(0);
    r.set_status(0);
    r.set_method(method::GET_RESP);
    r.0[SA_SM_KEY..SA_SM_KEY + 8].fill(0);
    let d = &mut r.0[SA_DATA..];
    d[0] = 1;
    d[1] = 2;
    put_be16(d, 2, CAP_MASK);
    let rtv = u32::from(resp_time_value(sm.cfg.transaction_timeout_ms));
    put_be32(d, 4, CAP_MASK2 << 5 | (rtv & 0x1f));
    put_be32(d, 32, 1); // RedirectQP
    put_be32(d, 36, ib_core::verbs::IB_QP1_QKEY);
    put_be32(d, 68, ib_core::verbs::IB_QP1_QKEY);
    Answer::Mad(alloc::boxed::Box::new(r))
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
