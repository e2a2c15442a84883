//! ServiceRecord, after OpenSM's `osm_sa_service_record.c` and `osm_service.c`: SubnAdmSet registers (or replaces) a service under its record ID (ServiceID, ServiceGID, ServiceP_Key), SubnAdmDelete removes it, Get and GetTable find services by any component; a lease runs out and the service goes.
//!
//! As OpenSM: a Set without ServiceID and ServiceGID is REQ_INVALID, as is a
//! Set or Delete with a P_Key outside the default partition; a Delete of no
//! such service is NO_RECORDS; the ServiceKey is shown only to a trusted
//! request. Services are kept in memory only (no SA database file).

use alloc::vec::Vec;

use hal::be::{get_be32, get_be64};
use ib_core::MadRecvWc;
use ib_core::mad::{Mad, method};

use super::{Answer, has, rec};
use crate::ib_types::{sa_method, status};
use crate::sm::Sm;

/// ServiceRecord size.
pub const SERVICE_RECORD_LEN: usize = 176;
/// Services kept at most (more: NO_RESOURCES).
pub const MAX_SERVICES: usize = 256;

/// A registered service (`osm_svcr_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// The record as set.
    pub rec: [u8; SERVICE_RECORD_LEN],
    /// When its lease runs out (ns), `u64::MAX` if never.
    pub expires_ns: u64,
}

/// Component bits 7..36: ServiceData8/16/32/64, each bit one element.
fn data_fields() -> impl Iterator<Item = (u32, usize, usize)> {
    let d8 = (0..16).map(|i| (7 + i as u32, 112 + i, 1));
    let d16 = (0..8).map(|i| (23 + i as u32, 128 + 2 * i, 2));
    let d32 = (0..4).map(|i| (31 + i as u32, 144 + 4 * i, 4));
    let d64 = (0..2).map(|i| (35 + i as u32, 160 + 8 * i, 8));
    d8.chain(d16).chain(d32).chain(d64)
}

/// Whether service record `s` matches query `q` under `cm`
/// (`get_matching_sr`).
pub fn matches(s: &[u8], q: &[u8], cm: u64) -> bool {
    let eq = |bit: u32, o: usize, l: usize| !has(cm, bit) || s[o..o + l] == q[o..o + l];
    eq(0, 0, 8)
        && eq(1, 8, 16)
        && eq(2, 24, 2)
        && eq(5, 32, 16)
        && eq(6, 48, 64)
        && data_fields().all(|(b, o, l)| eq(b, o, l))
}

/// The record ID (ServiceID, GID, P_Key).
fn rid(r: &[u8]) -> &[u8] {
    &r[..26]
}

fn pkey_ok(r: &[u8], cm: u64) -> bool {
    !has(cm, 2) || u16::from_be_bytes([r[24], r[25]]) & 0x7fff == 0x7fff
}

/// `osm_sr_rcv_process`.
pub fn process(sm: &mut Sm, m: &Mad, _r: &MadRecvWc, now: u64) -> Answer {
    let cm = super::comp_mask(m);
    let q = rec(m);
    let trusted = get_be64(&m.0, super::SA_SM_KEY) != 0;
    let hide = |mut r: Vec<u8>| {
        if !trusted {
            r[32..48].fill(0);
        }
        r
    };
    match m.method() {
        method::SET => {
            if !pkey_ok(q, cm) {
                return Answer::Error(status::SA_REQ_INVALID);
            }
            if !has(cm, 0) || !has(cm, 1) {
                return Answer::Error(status::SA_REQ_INVALID);
            }
            let mut rec = [0u8; SERVICE_RECORD_LEN];
            rec.copy_from_slice(&q[..SERVICE_RECORD_LEN]);
            if !has(cm, 4) {
                rec[28..32].copy_from_slice(&u32::MAX.to_be_bytes());
            }
            let lease = get_be32(&rec, 28);
            let expires_ns = if lease == u32::MAX {
                u64::MAX
            } else {
                now.saturating_add(u64::from(lease) * 1_000_000_000)
            };
            let services = &mut sm.sa.services;
            if let Some(s) = services.iter_mut().find(|s| rid(&s.rec) == rid(&rec)) {
                s.rec = rec;
                s.expires_ns = expires_ns;
            } else {
                if services.len() >= MAX_SERVICES {
                    return Answer::Error(status::SA_NO_RESOURCES);
                }
                services.insert(0, Service { rec, expires_ns });
            }
            let mut resp = rec.to_vec();
            if !has(cm, 2) {
                resp[24..26].copy_from_slice(&0xffffu16.to_be_bytes());
            }
            Answer::Records(SERVICE_RECORD_LEN, alloc::vec![hide(resp)])
        }
        sa_method::DELETE => {
            if !pkey_ok(q, cm) {
                return Answer::Error(status::SA_REQ_INVALID);
            }
            let Some(i) = sm.sa.services.iter().position(|s| rid(&s.rec) == rid(q)) else {
                return Answer::Error(status::SA_NO_RECORDS);
            };
            let s = sm.sa.services.remove(i);
            Answer::Records(SERVICE_RECORD_LEN, alloc::vec![hide(s.rec.to_vec())])
        }
        method::GET | sa_method::GET_TABLE => {
            let out: Vec<Vec<u8>> = sm
                .sa
                .services
                .iter()
                .filter(|s| s.expires_ns > now && matches(&s.rec, q, cm))
                .map(|s| hide(s.rec.to_vec()))
                .collect();
            Answer::Records(SERVICE_RECORD_LEN, out)
        }
        _ => Answer::Error(status::UNSUP_METHOD_ATTR),
    }
}

/// Drops the services whose lease ran out (`osm_sr_rcv_lease_cb`).
pub fn expire(sm: &mut Sm, now: u64) -> usize {
    let before = sm.sa.services.len();
    sm.sa.services.retain(|s| s.expires_ns > now);
    before - sm.sa.services.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching_by_components() {
        let mut s = [0u8; SERVICE_RECORD_LEN];
        s[0..8].copy_from_slice(&0x1234u64.to_be_bytes());
        s[48..53].copy_from_slice(b"lego1");
        s[112] = 7;
        let mut q = [0u8; SERVICE_RECORD_LEN];
        q[0..8].copy_from_slice(&0x1234u64.to_be_bytes());
        assert!(matches(&s, &q, 1));
        assert!(matches(&s, &q, 0), "no components: every service");
        assert!(!matches(&s, &q, 1 << 6), "name differs");
        q[48..53].copy_from_slice(b"lego1");
        assert!(matches(&s, &q, 1 | 1 << 6));
        assert!(!matches(&s, &q, 1 << 7), "ServiceData8[0] differs");
        q[112] = 7;
        assert!(matches(&s, &q, 1 << 7));
    }
}
