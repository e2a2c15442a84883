//! The subnet administrator on QP1, after OpenSM's `osm_sa.c` (`osm_sa_respond`, `osm_sa_send_error`) and `osm_sa_mad_ctrl.c` (what is answered, ignored or refused): SubnAdmGet, GetTable, Set and Delete of the records in this directory, answered from the last completed heavy sweep.
//!
//! As OpenSM: nothing is answered unless this SM is master and its first
//! sweep as master is done (C15-0.1.3); a MAD whose SM_Key is neither 0 nor
//! ours is dropped; a Get with several records is TOO_MANY_RECORDS, one with
//! none NO_RECORDS; a GetTable answer of any size goes out as an RMPP
//! transfer ([`rmpp`]); an attribute OpenSM does not serve is dropped
//! (ERR 1A01), a method an attribute does not take is answered
//! UNSUP_METHOD_ATTR; a request from a LID that is not in the subnet is
//! dropped. Partitions other than the default one, InformInfo, GUIDInfo,
//! P_Key/SL2VL/VLArb table records, TraceRecord and the SA database dump
//! are left out.

pub mod class_port_info;
pub mod lft_record;
pub mod link_record;
pub mod mcmember_record;
pub mod mft_record;
pub mod multipath_record;
pub mod node_record;
pub mod path_record;
pub mod portinfo_record;
pub mod rmpp;
pub mod service_record;
pub mod sminfo_record;
pub mod sw_info_record;

use alloc::vec::Vec;

use hal::be::{get_be64, put_be16, put_be64};
use ib_core::mad::{Mad, method};
use ib_core::{IbCore, MadRecvWc, MadSendBuf};

use crate::ib_types::{sa_attr, sa_method, sm_state, status};
use crate::sm::Sm;

/// Offset of the SA header's SM_Key.
pub const SA_SM_KEY: usize = 36;
/// Offset of the AttributeOffset (8-byte words).
pub const SA_ATTR_OFFSET: usize = 44;
/// Offset of the ComponentMask.
pub const SA_COMP_MASK: usize = 48;
/// Offset of the SA data.
pub const SA_DATA: usize = 56;
/// Bytes of SA data in one MAD.
pub const SA_DATA_LEN: usize = 200;

/// What the SA counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SaCounters {
    /// Requests received.
    pub received: u64,
    /// Requests answered with status 0.
    pub answered: u64,
    /// Requests answered with an error status.
    pub errors: u64,
    /// Requests ignored (not master yet, SM_Key, unknown requester, an
    /// attribute not served, a method not served).
    pub ignored: u64,
    /// GetTable answers sent as RMPP transfers of more than one segment.
    pub rmpp_transfers: u64,
    /// RMPP transfers given up or stopped by the receiver.
    pub rmpp_aborted: u64,
    /// RMPP segments sent, resends included.
    pub rmpp_segments: u64,
}

/// The SA's own state: services, multicast groups, RMPP transfers.
#[derive(Debug, Default)]
pub struct SaState {
    /// Counters.
    pub counters: SaCounters,
    /// Transfers under way.
    pub rmpp: Vec<rmpp::RmppSend>,
    /// Registered services.
    pub services: Vec<service_record::Service>,
    /// Multicast groups.
    pub mcast: mcmember_record::McastState,
}

/// The ComponentMask of a request.
pub fn comp_mask(m: &Mad) -> u64 {
    get_be64(&m.0, SA_COMP_MASK)
}

/// The request's record (the 200 bytes of SA data).
pub fn rec(m: &Mad) -> &[u8] {
    &m.0[SA_DATA..]
}

/// Whether component `bit` is in `cm`.
pub fn has(cm: u64, bit: u32) -> bool {
    bit < 64 && cm & (1u64 << bit) != 0
}

/// Pads a record size to whole 8-byte words (AttributeOffset).
pub fn padded(len: usize) -> usize {
    len.div_ceil(8) * 8
}

impl Sm {
    /// One SA MAD (`sa_mad_ctrl_rcv_callback` and `sa_mad_ctrl_process`).
    pub(crate) fn sa_request(&mut self, core: &mut IbCore, r: &MadRecvWc, now: u64) {
        let m = &r.mad;
        self.sa.counters.received += 1;
        // RMPP control of one of our transfers.
        if m.0[24] == 1 && m.0[26] & 1 != 0 && m.0[25] != 1 {
            self.rmpp_control(core, r, now);
            return;
        }
        // C15-0.1.3: only a master past its first sweep answers.
        if self.state != sm_state::MASTER || self.stats.subnet_ups == 0 {
            self.sa.counters.ignored += 1;
            return;
        }
        let key = get_be64(&m.0, SA_SM_KEY);
        if key != 0 && key != self.cfg.sm_key {
            self.note(
                now,
                alloc::format!(
                    "ERR 1A04: Non-Zero MAD SM_Key: {key:#018x} != SM_Key: {:#018x}; SA MAD ignored",
                    self.cfg.sm_key
                ),
            );
            self.sa.counters.ignored += 1;
            return;
        }
        // A request in several segments is not taken.
        if m.0[24] == 1 && m.0[26] & 1 != 0 && m.0[26] & 6 != 6 {
            self.sa.counters.ignored += 1;
            return;
        }
        match m.method() {
            method::GET
            | sa_method::GET_TABLE
            | sa_method::GET_MULTI
            | method::SET
            | sa_method::DELETE => {}
            method::REPORT_RESP => return,
            other => {
                self.note(
                    now,
                    alloc::format!("ERR 1A05: Unsupported method = {other:#04x}"),
                );
                self.sa.counters.ignored += 1;
                return;
            }
        }
        // The requester must be a port of the subnet.
        if self.done.port_by_lid(r.wc.slid).is_none() {
            self.sa.counters.ignored += 1;
            return;
        }
        let attr = m.attr_id();
        let answer = match attr {
            sa_attr::CLASS_PORT_INFO => class_port_info::process(self, m),
            sa_attr::NODE_RECORD => node_record::process(self, m),
            sa_attr::PORTINFO_RECORD => portinfo_record::process(self, m),
            sa_attr::LINK_RECORD => link_record::process(self, m),
            sa_attr::SMINFO_RECORD => sminfo_record::process(self, m),
            sa_attr::SWITCH_INFO_RECORD => sw_info_record::process(self, m),
            sa_attr::LFT_RECORD => lft_record::process(self, m),
            sa_attr::MFT_RECORD => mft_record::process(self, m),
            sa_attr::PATH_RECORD => path_record::process(self, m, r.wc.slid),
            sa_attr::MULTIPATH_RECORD => multipath_record::process(self, m, r.wc.slid),
            sa_attr::SERVICE_RECORD => service_record::process(self, m, r, now),
            sa_attr::MCMEMBER_RECORD => mcmember_record::process(self, m, r, now),
            _ => {
                self.note(
                    now,
                    alloc::format!("ERR 1A01: Unsupported attribute {attr:#06x}"),
                );
                self.sa.counters.ignored += 1;
                return;
            }
        };
        match answer {
            Answer::Drop => self.sa.counters.ignored += 1,
            Answer::Error(st) => self.sa_send_error(core, r, st),
            Answer::Mad(resp) => {
                self.sa.counters.answered += 1;
                self.sa_send(core, r, *resp);
            }
            Answer::Records(size, recs) => self.sa_respond(core, r, size, recs, now),
        }
    }

    /// `osm_sa_send_error`: the request back with `st`.
    pub(crate) fn sa_send_error(&mut self, core: &mut IbCore, r: &MadRecvWc, st: u16) {
        self.sa.counters.errors += 1;
        let mut resp = r.mad.clone();
        resp.set_status(st);
        match resp.method() {
            method::SET => resp.set_method(method::GET),
            sa_method::GET_TABLE => put_be16(&mut resp.0, SA_ATTR_OFFSET, 0),
            _ => {}
        }
        resp.set_method(resp.method() | method::RESP);
        put_be64(&mut resp.0, SA_SM_KEY, 0);
        resp.0[24..36].fill(0);
        if resp.attr_id() == sa_attr::MULTIPATH_RECORD {
            resp.set_attr_id(sa_attr::PATH_RECORD);
        }
        self.sa_send(core, r, resp);
    }

    /// `osm_sa_respond`: records to a Get (one) or a GetTable (an RMPP
    /// transfer).
    fn sa_respond(
        &mut self,
        core: &mut IbCore,
        r: &MadRecvWc,
        size: usize,
        recs: Vec<Vec<u8>>,
        now: u64,
    ) {
        let m = &r.mad;
        let get = matches!(m.method(), method::GET | method::SET | sa_method::DELETE);
        if get && recs.len() > 1 {
            self.sa_send_error(core, r, status::SA_TOO_MANY_RECORDS);
            return;
        }
        if get && recs.is_empty() {
            self.sa_send_error(core, r, status::SA_NO_RECORDS);
            return;
        }
        let step = padded(size);
        let mut resp = Mad::default();
        resp.0[..SA_DATA].copy_from_slice(&m.0[..SA_DATA]);
        resp.0[24..36].fill(0);
        resp.set_status(0);
        if resp.method() == method::SET {
            resp.set_method(method::GET);
        }
        resp.set_method(resp.method() | method::RESP);
        if m.attr_id() == sa_attr::MULTIPATH_RECORD {
            resp.set_attr_id(sa_attr::PATH_RECORD);
        }
        put_be64(&mut resp.0, SA_SM_KEY, 0);
        put_be16(
            &mut resp.0,
            SA_ATTR_OFFSET,
            if recs.is_empty() {
                0
            } else {
                (step / 8) as u16
            },
        );
        self.sa.counters.answered += 1;
        if get {
            let k = size.min(SA_DATA_LEN).min(recs[0].len());
            resp.0[SA_DATA..SA_DATA + k].copy_from_slice(&recs[0][..k]);
            self.sa_send(core, r, resp);
            return;
        }
        let mut data = alloc::vec![0u8; recs.len() * step];
        for (i, rec) in recs.iter().enumerate() {
            let k = size.min(rec.len());
            data[i * step..i * step + k].copy_from_slice(&rec[..k]);
        }
        self.rmpp_start(core, r, resp, data, now);
    }

    /// Sends one SA MAD back to the requester.
    pub(crate) fn sa_send(&mut self, core: &mut IbCore, r: &MadRecvWc, resp: Mad) {
        let Some(ah) = core.device(self.dev).and_then(|d| {
            ib_core::agent::init_ah_from_wc(d, self.port, &r.wc, r.grh.as_ref()).ok()
        }) else {
            return;
        };
        let mut buf = MadSendBuf::new(resp, ah, r.wc.src_qp);
        buf.pkey_index = r.wc.pkey_index;
        let _ = core.post_send_mad(self.sa_agent, buf);
    }

    /// The subnet changed (a heavy sweep ended): nothing cached to drop
    /// (every answer is built from [`Sm::done`]).
    pub(crate) fn sa_subnet_changed(&mut self) {
        mcmember_record::subnet_changed(self);
    }
}

/// What a record handler decided.
pub enum Answer {
    /// No answer (OpenSM drops it).
    Drop,
    /// An error status.
    Error(u16),
    /// A ready answer MAD (ClassPortInfo).
    Mad(alloc::boxed::Box<Mad>),
    /// Records of this (unpadded) size.
    Records(usize, Vec<Vec<u8>>),
}

/// The LID of a GUID's end port in the last sweep.
pub(crate) fn lid_of(sm: &Sm, guid: u64) -> u16 {
    sm.done.port_by_guid(guid).map_or(0, |e| e.lid)
}

/// A 16-byte GID of our subnet prefix and `guid`.
pub(crate) fn gid(prefix: u64, guid: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&prefix.to_be_bytes());
    g[8..].copy_from_slice(&guid.to_be_bytes());
    g
}
