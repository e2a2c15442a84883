//! Port of Linux `drivers/infiniband/core/sa_query.c` (3.11), busy-polled: PathRecord, NodeRecord, PortInfoRecord and MCMemberRecord queries to the SA, with retries, backoff and a per-port PathRecord cache.
//!
//! Absent in LegoOS. Queries (SubnAdmGet, SubnAdmGetTable, and SubnAdmSet and
//! SubnAdmDelete of MCMemberRecords for [`crate::multicast`]) go on QP1 to the
//! SM's LID and SL (`update_sm_ah`) and are retried with backoff while the SA
//! does not answer; the PathRecord cache is dropped on LID change, SM change
//! and client re-register. ServiceRecord, InformInfo/notices, SA redirection
//! and sending RMPP are left out (a GetTable answer spanning several MADs is
//! taken through the MAD layer's RMPP reassembly).
//! An Ethernet (RoCE) port has no SA: PathRecord Gets are answered locally
//! from the GIDs (`local_query`) and the other queries refused.
//!
//! The SA client is an [`IbClient`] whose per-device state lives in the
//! device's client data (as Linux's `ib_sa_device`); it is driven by
//! [`IbClient::poll`] from [`IbCore::poll`], so a blocking helper here only
//! waits on [`IbCore::poll_until`] against its deadline.
//!

mod ib_sa;

pub use ib_sa::*;

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::time::Duration;

use crate::device::{ClientId, Device, DeviceId, IbClient, IbCore};
use crate::error::{Error, Result};
use crate::mad::{Mad, MadAgent, MadEvent, MadSendBuf, MadSendId, method};
use crate::verbs::{
    AhAttr, Event, EventElement, EventType, Gid, GlobalRoute, IB_QP1_QKEY, LinkLayer, PortState,
    QpType,
};
use hal::be::get_be32;

/// Records of a response: `(first segment, reassembled data)` to one record
/// slice each. A Get answer holds one record; a GetTable answer as many as
/// the attribute offset divides the payload into (the RMPP payload length
/// of a single-MAD answer, or the reassembled data of a multi-MAD one).
fn response_records(mad: &Mad, rmpp_data: Option<&[u8]>, min_len: usize) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    if mad.method() == method::GET_RESP || mad.method() == sa_method::DELETE_RESP {
        out.push(mad.0[IB_SA_DATA_OFFSET..].to_vec());
        return Ok(out);
    }
    if mad.method() != sa_method::GET_TABLE_RESP {
        return Err(Error::Invalid("SA response with an unexpected method"));
    }
    let stride = usize::from(attr_offset(mad)) * 8;
    let data: &[u8] = match rmpp_data {
        Some(d) => d,
        None => {
            // Single MAD: RMPP header active (OpenSM) gives the payload
            // length (SA header 20 bytes + records); without it, one MAD's
            // worth of data.
            let active = mad.0[26] & 1 != 0;
            let len = if active {
                (get_be32(&mad.0, 32) as usize).saturating_sub(20)
            } else {
                IB_SA_DATA_SIZE
            };
            &mad.0[IB_SA_DATA_OFFSET..IB_SA_DATA_OFFSET + len.min(IB_SA_DATA_SIZE)]
        }
    };
    if stride == 0 {
        return Ok(out); // no records
    }
    if stride < min_len {
        return Err(Error::Invalid(
            "SA attribute offset shorter than the record",
        ));
    }
    for chunk in data.chunks(stride) {
        if chunk.len() < min_len {
            break;
        }
        out.push(chunk.to_vec());
    }
    Ok(out)
}

/// For the fuzz test: `m` as the answer to a query of `attr_id` (a cached
/// PathRecord query when it is one), through the client's response handler
/// and its bookkeeping. Returns what the query ended with (None: retried).
#[cfg(test)]
pub(crate) fn sa_query_parse_for_fuzz(
    m: &Mad,
    rmpp: Option<&[u8]>,
    attr_id: u16,
) -> Option<Result<SaResponse>> {
    let min_len = match attr_id {
        sa_attr::NODE_REC => 108,
        sa_attr::PORT_INFO_REC => 68,
        sa_attr::MC_MEMBER_REC => MC_MEMBER_REC_SIZE,
        _ => PATH_REC_SIZE,
    };
    let mut sp = SaPort {
        port: 1,
        agent: None,
        sm_ah: None,
        queries: Vec::new(),
        done: Vec::new(),
        next_seq: 2,
        cache: Vec::new(),
        counters: SaCounters::default(),
    };
    sp.queries.push(SaQuery {
        seq: 1,
        mad: Mad::default(),
        attr_id,
        min_len,
        deadline_ns: u64::MAX,
        try_ms: 1,
        backoff_ms: 1,
        tries: 1,
        state: QState::Backoff(0),
        cache_key: (attr_id == sa_attr::PATH_REC).then_some(PathKey::Lid(1)),
    });
    let r = handle_response(&mut sp, 0, m, rmpp)?;
    finish(&mut sp, 0, r);
    let (_, r) = sp.done.pop()?;
    Some(r)
}

// ---------------------------------------------------------------------------
// The client

/// One query, as the caller names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SaQueryId {
    /// Device.
    pub dev: DeviceId,
    /// Port.
    pub port: u8,
    /// Sequence number on that port.
    pub seq: u64,
}

/// A finished query's answer: the records in wire order (each as long as
/// the attribute offset says, at least the record's size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaResponse {
    /// Attribute queried.
    pub attr_id: u16,
    /// The records.
    pub records: Vec<Vec<u8>>,
    /// Tries it took (1 = answered at once).
    pub tries: u32,
}

impl SaResponse {
    /// The records as PathRecords.
    pub fn path_records(&self) -> Result<Vec<PathRecord>> {
        self.records.iter().map(|r| PathRecord::unpack(r)).collect()
    }
    /// The records as NodeRecords.
    pub fn node_records(&self) -> Result<Vec<NodeRecord>> {
        self.records.iter().map(|r| NodeRecord::unpack(r)).collect()
    }
    /// The records as PortInfoRecords.
    pub fn portinfo_records(&self) -> Result<Vec<PortInfoRecord>> {
        self.records
            .iter()
            .map(|r| PortInfoRecord::unpack(r))
            .collect()
    }
    /// The records as MCMemberRecords.
    pub fn mcmember_records(&self) -> Result<Vec<McMemberRecord>> {
        self.records
            .iter()
            .map(|r| McMemberRecord::unpack(r))
            .collect()
    }
}

/// Retry policy of the SA client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaRetry {
    /// Response timeout of the first try.
    pub first_try_ms: u32,
    /// The per-try timeout doubles up to this.
    pub max_try_ms: u32,
    /// Wait before re-sending after a BUSY answer or while the port has no
    /// SM; doubles up to `max_try_ms` too.
    pub backoff_ms: u32,
}

impl Default for SaRetry {
    fn default() -> Self {
        SaRetry {
            first_try_ms: 100,
            max_try_ms: 1600,
            backoff_ms: 50,
        }
    }
}

/// What the SA client of one port counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SaCounters {
    /// Requests sent (retries included).
    pub sent: u64,
    /// Retries after a timeout or a BUSY answer.
    pub retries: u64,
    /// Queries answered with records.
    pub answered: u64,
    /// Queries that ran out of time.
    pub timeouts: u64,
    /// Answers with a non-zero status (BUSY aside).
    pub errors: u64,
    /// PathRecord cache hits.
    pub cache_hits: u64,
    /// Times the PathRecord cache was dropped by an event.
    pub cache_flushes: u64,
    /// Answers that could not be parsed.
    pub bad_answers: u64,
    /// PathRecords made locally (an Ethernet port has no SA).
    pub local_paths: u64,
}

/// The address of the SA (Linux's `ib_sa_sm_ah`): SM LID, SM SL and the
/// P_Key index of the default P_Key, as `update_sm_ah` reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmAh {
    /// SM LID.
    pub dlid: u16,
    /// SM SL.
    pub sl: u8,
    /// P_Key index of 0xffff (0 if the table has none).
    pub pkey_index: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QState {
    /// Waiting to (re)send at this time.
    Backoff(u64),
    /// On the wire, waiting for its answer.
    Sent(MadSendId),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PathKey {
    Gid(Gid),
    Lid(u16),
}

struct SaQuery {
    seq: u64,
    mad: Mad,
    attr_id: u16,
    min_len: usize,
    deadline_ns: u64,
    try_ms: u32,
    backoff_ms: u32,
    tries: u32,
    state: QState,
    cache_key: Option<PathKey>,
}

struct SaPort {
    port: u8,
    agent: Option<MadAgent>,
    sm_ah: Option<SmAh>,
    queries: Vec<SaQuery>,
    done: Vec<(u64, Result<SaResponse>)>,
    next_seq: u64,
    cache: Vec<(PathKey, PathRecord)>,
    counters: SaCounters,
}

/// Per-device SA state (`struct ib_sa_device`), kept in the device's client
/// data.
pub struct SaDevice {
    ports: Vec<SaPort>,
    retry: SaRetry,
}

struct SaSlot(Option<SaDevice>);

/// Finished answers kept per port until collected.
const MAX_DONE: usize = 256;
/// Queries running per port; more are refused with `-EAGAIN`.
const MAX_RUNNING: usize = 256;
/// PathRecords cached per port.
const MAX_CACHE: usize = 64;

/// The SA client (`sa_client` / `ib_sa_add_one`, `ib_sa_remove_one`,
/// `ib_sa_event`).
pub struct SaClient {
    retry: SaRetry,
}

/// `ib_sa_init`: registers the SA client with the core and returns its id,
/// the handle every query names. There is one SA client per core, as
/// Linux's `ib_sa` module is one per system: a later call returns the
/// client already registered, so every user (perftest, the diags, the
/// remote-memory service) shares its agents, its SM address and its path
/// cache instead of asking the SA again for what another user learned.
#[doc(alias = "ib_sa_init")]
pub fn init(core: &mut IbCore) -> ClientId {
    init_with(core, SaRetry::default())
}

/// [`init`] with another retry policy; the policy is the first
/// registration's when the client already exists.
pub fn init_with(core: &mut IbCore, retry: SaRetry) -> ClientId {
    let client = SaClient { retry };
    if let Some(id) = core.client_by_name(client.name()) {
        return id;
    }
    core.register_client(Box::new(client))
}

impl IbClient for SaClient {
    fn name(&self) -> &str {
        "sa"
    }
    fn accepts(&self, _n: crate::verbs::NodeType, t: crate::verbs::Transport) -> bool {
        t == crate::verbs::Transport::Ib
    }
    fn add(&mut self, me: ClientId, dev: &mut Device) {
        let ports = (1..=dev.phys_port_cnt())
            .map(|port| SaPort {
                port,
                agent: None,
                sm_ah: None,
                queries: Vec::new(),
                done: Vec::new(),
                next_seq: 1,
                cache: Vec::new(),
                counters: SaCounters::default(),
            })
            .collect();
        dev.set_client_data(
            me,
            Box::new(SaSlot(Some(SaDevice {
                ports,
                retry: self.retry,
            }))),
        );
    }
    fn remove(&mut self, _me: ClientId, _dev: &mut Device) {
        // The MAD agents go with the device's MAD ports.
    }
    #[doc(alias = "ib_sa_event")]
    fn event(&mut self, me: ClientId, dev: &mut Device, ev: &Event) {
        let EventElement::Port(p) = ev.element else {
            return;
        };
        let Some(SaSlot(Some(sd))) = dev.client_data::<SaSlot>(me) else {
            return;
        };
        event(sd, p, ev.event);
    }
    fn poll(&mut self, me: ClientId, core: &mut IbCore) -> usize {
        let mut work = 0;
        // By index: the progress function allocates nothing here.
        for i in 0..core.devices.len() {
            let dev = DeviceId(i as u32);
            if core.devices[i].is_none() {
                continue;
            }
            work +=
                with_sa(core, me, dev, |core, sd| Ok(sa_poll_device(core, dev, sd))).unwrap_or(0);
        }
        work
    }
}

/// `ib_sa_event`: the SM's address is read again on the next send; the
/// PathRecord cache goes on LID change, SM change, client re-register and
/// port state changes.
fn event(sd: &mut SaDevice, port: u8, ev: EventType) {
    let Some(sp) = sd.ports.iter_mut().find(|p| p.port == port) else {
        return;
    };
    match ev {
        EventType::PortActive
        | EventType::PortErr
        | EventType::LidChange
        | EventType::SmChange
        | EventType::ClientReregister => {
            sp.sm_ah = None;
            if !sp.cache.is_empty() {
                sp.counters.cache_flushes += 1;
            }
            sp.cache.clear();
        }
        EventType::PkeyChange => sp.sm_ah = None,
        _ => {}
    }
}

fn with_sa<T>(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    f: impl FnOnce(&mut IbCore, &mut SaDevice) -> Result<T>,
) -> Result<T> {
    let d = core.device_mut(dev).ok_or(Error::NoDev)?;
    let slot = d.client_data::<SaSlot>(sa).ok_or(Error::NoDev)?;
    let mut sd = slot.0.take().ok_or(Error::Busy)?;
    let r = f(core, &mut sd);
    if let Some(d) = core.device_mut(dev)
        && let Some(slot) = d.client_data::<SaSlot>(sa)
    {
        slot.0 = Some(sd);
    }
    r
}

fn port_of(sd: &mut SaDevice, port: u8) -> Result<&mut SaPort> {
    sd.ports
        .iter_mut()
        .find(|p| p.port == port)
        .ok_or(Error::Invalid("port number out of range"))
}

/// `update_sm_ah`: the SA's address from the port cache (None while the
/// port is not Active or knows no SM).
fn update_sm_ah(dev: &Device, port: u8) -> Option<SmAh> {
    let c = dev.port_cache(port).ok()?;
    if c.state != Some(PortState::Active) || c.sm_lid == 0 {
        return None;
    }
    Some(SmAh {
        dlid: c.sm_lid,
        sl: c.sm_sl,
        pkey_index: c.find_pkey(0xffff).unwrap_or(0),
    })
}

fn now_ns(core: &IbCore) -> u64 {
    core.clock().now_ns()
}

fn ensure_agent(core: &mut IbCore, dev: DeviceId, sp: &mut SaPort) -> Result<MadAgent> {
    if let Some(a) = sp.agent {
        return Ok(a);
    }
    let a = core.register_mad_agent(
        dev,
        sp.port,
        QpType::Gsi,
        None,
        crate::mad_rmpp::IB_MGMT_RMPP_VERSION,
    )?;
    sp.agent = Some(a);
    Ok(a)
}

/// Sends (or re-sends) query `qi`; `Ok(false)` if the port has no SM yet
/// (the query stays in backoff).
fn send_query(core: &mut IbCore, dev: DeviceId, sp: &mut SaPort, qi: usize) -> Result<bool> {
    let agent = ensure_agent(core, dev, sp)?;
    if sp.sm_ah.is_none() {
        sp.sm_ah = core.device(dev).and_then(|d| update_sm_ah(d, sp.port));
    }
    let Some(ah) = sp.sm_ah else {
        return Ok(false);
    };
    let now = now_ns(core);
    let q = &mut sp.queries[qi];
    let left_ms = q.deadline_ns.saturating_sub(now) / 1_000_000;
    let try_ms = u64::from(q.try_ms).min(left_ms).max(1) as u32;
    let mut buf = MadSendBuf::new(
        q.mad.clone(),
        AhAttr {
            dlid: ah.dlid,
            sl: ah.sl,
            port_num: sp.port,
            ..AhAttr::default()
        },
        1,
    );
    buf.remote_qkey = IB_QP1_QKEY;
    buf.pkey_index = ah.pkey_index;
    buf.timeout_ms = try_ms;
    buf.retries = 0;
    buf.context = q.seq;
    // A fresh TID per try: the core fills the low half when it is 0.
    buf.mad.set_tid(0);
    let id = core.post_send_mad(agent, buf)?;
    q.tries += 1;
    q.state = QState::Sent(id);
    sp.counters.sent += 1;
    Ok(true)
}

fn finish(sp: &mut SaPort, qi: usize, r: Result<SaResponse>) {
    let q = sp.queries.swap_remove(qi);
    match &r {
        Ok(resp) => {
            sp.counters.answered += 1;
            if let (Some(key), Some(rec)) = (q.cache_key, resp.records.first())
                && let Ok(p) = PathRecord::unpack(rec)
            {
                sp.cache.retain(|(k, _)| *k != key);
                if sp.cache.len() >= MAX_CACHE {
                    sp.cache.remove(0);
                }
                sp.cache.push((key, p));
            }
        }
        Err(Error::TimedOut) => sp.counters.timeouts += 1,
        Err(_) => sp.counters.errors += 1,
    }
    if sp.done.len() >= MAX_DONE {
        let _ = sp.done.remove(0);
    }
    sp.done.push((q.seq, r));
}

/// Schedules a retry of `qi` after its backoff, or ends it with
/// `-ETIMEDOUT` when the deadline does not leave room for one.
fn retry_later(core: &IbCore, sp: &mut SaPort, qi: usize, max_ms: u32) {
    let now = now_ns(core);
    let q = &mut sp.queries[qi];
    if now >= q.deadline_ns {
        finish(sp, qi, Err(Error::TimedOut));
        return;
    }
    // The last try may be short; the query ends at its deadline.
    let at = now
        .saturating_add(u64::from(q.backoff_ms) * 1_000_000)
        .min(q.deadline_ns);
    q.backoff_ms = q.backoff_ms.saturating_mul(2).min(max_ms);
    q.try_ms = q.try_ms.saturating_mul(2).min(max_ms);
    q.state = QState::Backoff(at);
    sp.counters.retries += 1;
}

fn handle_response(
    sp: &mut SaPort,
    qi: usize,
    mad: &Mad,
    rmpp: Option<&[u8]>,
) -> Option<Result<SaResponse>> {
    let q = &sp.queries[qi];
    let st = mad.status();
    if st == crate::mad::status::BUSY {
        return None; // retried by the caller
    }
    if st != 0 {
        let sa_code = (st >> 8) & 0x7f;
        if sa_code == sa_status::NO_RECORDS {
            return Some(Err(Error::NotFound));
        }
        return Some(Err(Error::MadStatus(st)));
    }
    if mad.attr_id() != q.attr_id {
        sp.counters.bad_answers += 1;
        return Some(Err(Error::Invalid("SA answered another attribute")));
    }
    match response_records(mad, rmpp, q.min_len) {
        Ok(records) => {
            if records.is_empty() {
                return Some(Err(Error::NotFound));
            }
            Some(Ok(SaResponse {
                attr_id: q.attr_id,
                records,
                tries: q.tries,
            }))
        }
        Err(e) => {
            sp.counters.bad_answers += 1;
            Some(Err(e))
        }
    }
}

fn sa_poll_device(core: &mut IbCore, dev: DeviceId, sd: &mut SaDevice) -> usize {
    let retry = sd.retry;
    let mut work = 0;
    for sp in sd.ports.iter_mut() {
        // Answers and send completions.
        if let Some(agent) = sp.agent {
            while let Some(ev) = core.mad_poll_agent(agent) {
                work += 1;
                match ev {
                    MadEvent::Recv(r) => {
                        let Some(id) = r.send_id else { continue };
                        let Some(qi) = sp.queries.iter().position(|q| q.state == QState::Sent(id))
                        else {
                            continue;
                        };
                        match handle_response(sp, qi, &r.mad, r.rmpp_data.as_deref()) {
                            Some(res) => finish(sp, qi, res),
                            None => retry_later(core, sp, qi, retry.max_try_ms),
                        }
                    }
                    MadEvent::SendDone(s) => {
                        let Some(qi) = sp
                            .queries
                            .iter()
                            .position(|q| q.state == QState::Sent(s.id))
                        else {
                            continue;
                        };
                        // Done without an answer: timed out or failed.
                        retry_later(core, sp, qi, retry.max_try_ms);
                    }
                }
            }
        }
        // Backoffs that are over, and queries past their deadline.
        let now = now_ns(core);
        let mut qi = 0;
        while qi < sp.queries.len() {
            let q = &sp.queries[qi];
            match q.state {
                QState::Backoff(at) if now >= at => {
                    work += 1;
                    if now >= q.deadline_ns {
                        finish(sp, qi, Err(Error::TimedOut));
                        continue;
                    }
                    match send_query(core, dev, sp, qi) {
                        Ok(true) => {}
                        Ok(false) => retry_later(core, sp, qi, retry.max_try_ms),
                        Err(e) => {
                            finish(sp, qi, Err(e));
                            continue;
                        }
                    }
                }
                QState::Sent(id)
                    if now
                        >= q.deadline_ns
                            .saturating_add(u64::from(retry.max_try_ms) * 2_000_000) =>
                {
                    // The MAD layer owes us a completion; do not wait forever.
                    if let Some(a) = sp.agent {
                        let _ = core.cancel_mad(a, id);
                    }
                    finish(sp, qi, Err(Error::TimedOut));
                    continue;
                }
                _ => {}
            }
            qi += 1;
        }
    }
    work
}

/// What one query asks the SA: method, attribute, component mask and
/// record (the MAD `init_mad` and the caller fill in Linux), the size an
/// answer's records must have, and where a PathRecord answer is cached.
struct SaRequest<'a> {
    method: u8,
    attr_id: u16,
    comp_mask: u64,
    rec: &'a [u8],
    min_len: usize,
    cache_key: Option<PathKey>,
}

fn start_query(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    req: SaRequest<'_>,
    timeout: Duration,
) -> Result<SaQueryId> {
    let SaRequest {
        method,
        attr_id,
        comp_mask,
        rec,
        min_len,
        cache_key,
    } = req;
    let link = core
        .device(dev)
        .ok_or(Error::NoDev)?
        .port_link_layer(port)?;
    if link == LinkLayer::Ethernet {
        return local_query(core, sa, dev, port, method, attr_id, rec);
    }
    let mut mad = build_mad(method, attr_id, comp_mask, rec)?;
    if method == sa_method::GET_TABLE {
        set_attr_offset(&mut mad, (min_len.div_ceil(8)) as u16);
    }
    with_sa(core, sa, dev, |core, sd| {
        let retry = sd.retry;
        let sp = port_of(sd, port)?;
        if sp.queries.len() >= MAX_RUNNING {
            return Err(Error::Again);
        }
        let now = now_ns(core);
        let seq = sp.next_seq;
        sp.next_seq += 1;
        sp.queries.push(SaQuery {
            seq,
            mad,
            attr_id,
            min_len,
            deadline_ns: now.saturating_add(timeout.as_nanos().min(u128::from(u64::MAX)) as u64),
            try_ms: retry.first_try_ms.max(1),
            backoff_ms: retry.backoff_ms.max(1),
            tries: 0,
            state: QState::Backoff(now),
            cache_key,
        });
        let qi = sp.queries.len() - 1;
        match send_query(core, dev, sp, qi) {
            Ok(true) => {}
            Ok(false) => retry_later(core, sp, qi, retry.max_try_ms),
            Err(e) => {
                sp.queries.swap_remove(qi);
                return Err(e);
            }
        }
        Ok(SaQueryId { dev, port, seq })
    })
}

/// An Ethernet (RoCE) port has no SA: a PathRecord Get is answered at once
/// with a path made from the GIDs, as Linux's RDMAoE makes it
/// (`cma_resolve_iboe_route`, `ib_init_ah_from_path` forcing the GRH): no
/// LIDs, P_Key 0xffff, hop limit 1, the port's active MTU, 40 Gb/s, the SGID
/// asked for (the port's GID 0 if none). Every other query ends with
/// `-EOPNOTSUPP`, and nothing goes on the wire.
fn local_query(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    method: u8,
    attr_id: u16,
    rec: &[u8],
) -> Result<SaQueryId> {
    if attr_id != sa_attr::PATH_REC || method != method::GET {
        return Err(Error::NotSupported);
    }
    let asked = PathRecord::unpack(rec)?;
    let d = core.device_mut(dev).ok_or(Error::NoDev)?;
    let pa = d.query_port(port)?;
    let sgid = if asked.sgid == Gid::default() {
        d.port_cache(port)?.get_gid(0)?
    } else {
        asked.sgid
    };
    let path = PathRecord {
        service_id: asked.service_id,
        dgid: asked.dgid,
        sgid,
        dlid: 0,
        slid: 0,
        flow_label: asked.flow_label,
        hop_limit: 1,
        traffic_class: asked.traffic_class,
        reversible: true,
        numb_path: 1,
        pkey: 0xffff,
        sl: asked.sl & 7,
        mtu_selector: IB_SA_EQ,
        mtu: pa.active_mtu as u8,
        rate_selector: IB_SA_EQ,
        rate: IB_RATE_40_GBPS,
        packet_life_time_selector: IB_SA_EQ,
        ..PathRecord::default()
    };
    with_sa(core, sa, dev, |_, sd| {
        let sp = port_of(sd, port)?;
        if sp.done.len() >= MAX_DONE {
            return Err(Error::Again);
        }
        let seq = sp.next_seq;
        sp.next_seq += 1;
        sp.counters.local_paths += 1;
        sp.done.push((
            seq,
            Ok(SaResponse {
                attr_id,
                records: alloc::vec![path.pack().to_vec()],
                tries: 0,
            }),
        ));
        Ok(SaQueryId { dev, port, seq })
    })
}

/// `IB_SA_EQ`: a selector asking for exactly the value given.
const IB_SA_EQ: u8 = 2;
/// `IB_RATE_40_GBPS`.
const IB_RATE_40_GBPS: u8 = 7;

/// `ib_sa_path_rec_get`: starts a PathRecord Get with `comp_mask` naming
/// the fields of `rec` that matter; the answer is collected with
/// [`query_result`]. The query is retried with backoff until
/// `timeout` has passed, then ends with `-ETIMEDOUT`.
#[doc(alias = "ib_sa_path_rec_get")]
pub fn path_rec_get(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    rec: &PathRecord,
    comp_mask: u64,
    timeout: Duration,
) -> Result<SaQueryId> {
    let req = SaRequest {
        method: method::GET,
        attr_id: sa_attr::PATH_REC,
        comp_mask,
        rec: &rec.pack(),
        min_len: PATH_REC_SIZE,
        cache_key: None,
    };
    start_query(core, sa, dev, port, req, timeout)
}

/// A NodeRecord Get (one record: more than one match is an error) or
/// GetTable (`method` [`method::GET`] or [`sa_method::GET_TABLE`]).
fn node_rec_request(method: u8, rec: &[u8], comp_mask: u64) -> SaRequest<'_> {
    SaRequest {
        method,
        attr_id: sa_attr::NODE_REC,
        comp_mask,
        rec: &rec[..108],
        min_len: 108,
        cache_key: None,
    }
}

/// A PortInfoRecord Get or GetTable, as [`node_rec_request`].
fn portinfo_rec_request(method: u8, rec: &[u8], comp_mask: u64) -> SaRequest<'_> {
    SaRequest {
        method,
        attr_id: sa_attr::PORT_INFO_REC,
        comp_mask,
        rec: &rec[..68],
        min_len: 68,
        cache_key: None,
    }
}

/// NodeRecord Get: the one record matching `rec` in the fields
/// `comp_mask` names (several matches end the query with the SA's error).
pub fn node_rec_get(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    rec: &NodeRecord,
    comp_mask: u64,
    timeout: Duration,
) -> Result<SaQueryId> {
    let rec = rec.pack();
    let req = node_rec_request(method::GET, &rec, comp_mask);
    start_query(core, sa, dev, port, req, timeout)
}

/// NodeRecord GetTable: every record matching `rec` in the fields
/// `comp_mask` names.
pub fn node_rec_get_table(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    rec: &NodeRecord,
    comp_mask: u64,
    timeout: Duration,
) -> Result<SaQueryId> {
    let rec = rec.pack();
    let req = node_rec_request(sa_method::GET_TABLE, &rec, comp_mask);
    start_query(core, sa, dev, port, req, timeout)
}

/// PortInfoRecord Get, as [`node_rec_get`].
pub fn portinfo_rec_get(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    rec: &PortInfoRecord,
    comp_mask: u64,
    timeout: Duration,
) -> Result<SaQueryId> {
    let rec = rec.pack();
    let req = portinfo_rec_request(method::GET, &rec, comp_mask);
    start_query(core, sa, dev, port, req, timeout)
}

/// PortInfoRecord GetTable, as [`node_rec_get_table`].
pub fn portinfo_rec_get_table(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    rec: &PortInfoRecord,
    comp_mask: u64,
    timeout: Duration,
) -> Result<SaQueryId> {
    let rec = rec.pack();
    let req = portinfo_rec_request(sa_method::GET_TABLE, &rec, comp_mask);
    start_query(core, sa, dev, port, req, timeout)
}

/// `ib_sa_mcmember_rec_query`: an MCMemberRecord request, `method` one of
/// SubnAdmSet ([`method::SET`], a join), SubnAdmDelete
/// ([`sa_method::DELETE`], a leave), SubnAdmGet or SubnAdmGetTable, with
/// `comp_mask` naming the fields of `rec` that matter; the answer is
/// collected with [`query_result`]. [`crate::multicast`] joins and leaves
/// through it.
#[doc(alias = "ib_sa_mcmember_rec_query")]
#[allow(clippy::too_many_arguments)]
pub fn mcmember_rec_query(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    method: u8,
    rec: &McMemberRecord,
    comp_mask: u64,
    timeout: Duration,
) -> Result<SaQueryId> {
    if !matches!(
        method,
        method::GET | method::SET | sa_method::GET_TABLE | sa_method::DELETE
    ) {
        return Err(Error::Invalid(
            "MCMemberRecord method is not Get, Set, GetTable or Delete",
        ));
    }
    let rec = rec.pack();
    let req = SaRequest {
        method,
        attr_id: sa_attr::MC_MEMBER_REC,
        comp_mask,
        rec: &rec,
        min_len: MC_MEMBER_REC_SIZE,
        cache_key: None,
    };
    start_query(core, sa, dev, port, req, timeout)
}

/// Every MCMemberRecord the SA gives (`saquery -g`: a GetTable with an
/// empty component mask; OpenSM answers one record per group to a
/// requester without the SM_Key). An empty table is an empty list.
pub fn mcmember_records(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    timeout: Duration,
) -> Result<Vec<McMemberRecord>> {
    let id = mcmember_rec_query(
        core,
        sa,
        dev,
        port,
        sa_method::GET_TABLE,
        &McMemberRecord::default(),
        0,
        timeout,
    )?;
    match wait(core, sa, id, timeout) {
        Ok(r) => r.mcmember_records(),
        Err(Error::NotFound) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The answer of a finished query (taken: a second call says `None`);
/// `None` while it runs.
pub fn query_result(core: &mut IbCore, sa: ClientId, id: SaQueryId) -> Option<Result<SaResponse>> {
    with_sa(core, sa, id.dev, |_, sd| {
        let sp = port_of(sd, id.port)?;
        let i = sp.done.iter().position(|(s, _)| *s == id.seq);
        Ok(i.map(|i| sp.done.remove(i).1))
    })
    .ok()
    .flatten()
}

/// `ib_sa_cancel_query`: forgets a running query (its MAD is canceled).
#[doc(alias = "ib_sa_cancel_query")]
pub fn cancel_query(core: &mut IbCore, sa: ClientId, id: SaQueryId) -> Result<()> {
    with_sa(core, sa, id.dev, |core, sd| {
        let sp = port_of(sd, id.port)?;
        let qi = sp
            .queries
            .iter()
            .position(|q| q.seq == id.seq)
            .ok_or(Error::NotFound)?;
        let q = sp.queries.swap_remove(qi);
        if let (QState::Sent(mid), Some(a)) = (q.state, sp.agent) {
            let _ = core.cancel_mad(a, mid);
        }
        Ok(())
    })
}

/// Waits (polling the core) for a query's answer until `timeout` (plus a
/// little slack: the query has its own deadline and ends itself).
pub fn wait(
    core: &mut IbCore,
    sa: ClientId,
    id: SaQueryId,
    timeout: Duration,
) -> Result<SaResponse> {
    let r = core.poll_until(timeout + Duration::from_millis(100), |core| {
        if core.device(id.dev).is_none() {
            return Some(Err(Error::NoDev));
        }
        query_result(core, sa, id)
    });
    match r {
        Ok(x) => x,
        Err(e) => {
            let _ = cancel_query(core, sa, id);
            Err(e)
        }
    }
}

/// The port's SGID (GID index 0) and LID, for a query's source fields.
fn source_of(core: &IbCore, dev: DeviceId, port: u8) -> Result<(Gid, u16)> {
    let d = core.device(dev).ok_or(Error::NoDev)?;
    let c = d.port_cache(port)?;
    Ok((c.get_gid(0)?, c.lid))
}

fn cached_path(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    key: &PathKey,
) -> Option<PathRecord> {
    with_sa(core, sa, dev, |_, sd| {
        let sp = port_of(sd, port)?;
        let hit = sp.cache.iter().find(|(k, _)| k == key).map(|(_, p)| *p);
        if hit.is_some() {
            sp.counters.cache_hits += 1;
        }
        Ok(hit)
    })
    .ok()
    .flatten()
}

/// A PathRecord Get of `req` from the cache or the SA (the answer is
/// cached under `req.cache_key`).
fn path_wait(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    req: SaRequest<'_>,
    timeout: Duration,
) -> Result<PathRecord> {
    if let Some(key) = &req.cache_key
        && let Some(p) = cached_path(core, sa, dev, port, key)
    {
        return Ok(p);
    }
    let id = start_query(core, sa, dev, port, req, timeout)?;
    let resp = wait(core, sa, id, timeout)?;
    resp.path_records()?
        .into_iter()
        .next()
        .ok_or(Error::NotFound)
}

/// The PathRecord Get of `rec` with `comp_mask`, cached under `key`.
fn path_request(rec: &[u8; PATH_REC_SIZE], comp_mask: u64, key: PathKey) -> SaRequest<'_> {
    SaRequest {
        method: method::GET,
        attr_id: sa_attr::PATH_REC,
        comp_mask,
        rec,
        min_len: PATH_REC_SIZE,
        cache_key: Some(key),
    }
}

/// A path from this port to `dlid` (SGID and SLID from the port cache,
/// P_Key 0xffff, one path), from the cache or the SA, within `timeout`.
pub fn path_to_lid(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    dlid: u16,
    timeout: Duration,
) -> Result<PathRecord> {
    let (sgid, slid) = source_of(core, dev, port)?;
    let rec = PathRecord {
        sgid,
        slid,
        dlid,
        pkey: 0xffff,
        numb_path: 1,
        reversible: true,
        ..PathRecord::default()
    };
    let mask = path_comp::SGID
        | path_comp::SLID
        | path_comp::DLID
        | path_comp::PKEY
        | path_comp::NUMB_PATH
        | path_comp::REVERSIBLE;
    let rec = rec.pack();
    let req = path_request(&rec, mask, PathKey::Lid(dlid));
    path_wait(core, sa, dev, port, req, timeout)
}

/// A path from this port to `dgid` (SGID from the port cache), from the
/// cache or the SA, within `timeout`.
pub fn path_to_gid(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    dgid: Gid,
    timeout: Duration,
) -> Result<PathRecord> {
    let (sgid, _) = source_of(core, dev, port)?;
    path_between(core, sa, dev, port, sgid, dgid, timeout)
}

/// A path from `sgid` (one of this port's GIDs: on RoCE, `-g GIDX`'s) to
/// `dgid`, from the cache or the SA (made locally on an Ethernet port),
/// within `timeout`.
pub fn path_between(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    sgid: Gid,
    dgid: Gid,
    timeout: Duration,
) -> Result<PathRecord> {
    let rec = PathRecord {
        sgid,
        dgid,
        pkey: 0xffff,
        numb_path: 1,
        reversible: true,
        ..PathRecord::default()
    };
    let mask = path_comp::SGID
        | path_comp::DGID
        | path_comp::PKEY
        | path_comp::NUMB_PATH
        | path_comp::REVERSIBLE;
    let rec = rec.pack();
    let req = path_request(&rec, mask, PathKey::Gid(dgid));
    path_wait(core, sa, dev, port, req, timeout)
}

/// Every NodeRecord the SA has (`saquery` without arguments): a GetTable
/// with an empty component mask.
pub fn node_records(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    timeout: Duration,
) -> Result<Vec<NodeRecord>> {
    let id = node_rec_get_table(core, sa, dev, port, &NodeRecord::default(), 0, timeout)?;
    wait(core, sa, id, timeout)?.node_records()
}

/// The PortInfoRecords of the port at `lid` (GetTable by EndportLID).
pub fn portinfo_records(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    lid: u16,
    timeout: Duration,
) -> Result<Vec<PortInfoRecord>> {
    let rec = PortInfoRecord {
        lid,
        ..PortInfoRecord::default()
    };
    let id = portinfo_rec_get_table(core, sa, dev, port, &rec, portinfo_comp::LID, timeout)?;
    wait(core, sa, id, timeout)?.portinfo_records()
}

/// What the SA client of a port counted.
pub fn counters(core: &mut IbCore, sa: ClientId, dev: DeviceId, port: u8) -> Option<SaCounters> {
    with_sa(core, sa, dev, |_, sd| Ok(port_of(sd, port)?.counters)).ok()
}

/// The SA's address as the client last read it (None: not read yet, or
/// the port has no SM).
pub fn sm_ah(core: &mut IbCore, sa: ClientId, dev: DeviceId, port: u8) -> Option<SmAh> {
    with_sa(core, sa, dev, |_, sd| Ok(port_of(sd, port)?.sm_ah))
        .ok()
        .flatten()
}

/// `ib_init_ah_from_path`: the address vector of a path from `port` (a GRH
/// when the path leaves the subnet, hop limit above 1, with the SGID's
/// index from the cache; source path bits from the SLID and the LMC).
#[doc(alias = "ib_init_ah_from_path")]
pub fn init_ah_from_path(dev: &Device, port: u8, rec: &PathRecord) -> Result<AhAttr> {
    let lmc = dev.get_cached_lmc(port)?;
    // On Ethernet (RoCE) the GRH is always there (3.11's `force_grh`).
    let force_grh = dev.port_link_layer(port)? == LinkLayer::Ethernet;
    let mut ah = AhAttr {
        dlid: rec.dlid,
        sl: rec.sl & 0xf,
        src_path_bits: (rec.slid & ((1u16 << lmc.min(7)) - 1)) as u8,
        static_rate: rec.rate,
        port_num: port,
        grh: None,
    };
    if rec.hop_limit > 1 || force_grh {
        let c = dev.port_cache(port)?;
        let idx = c
            .find_gid(&rec.sgid)
            .ok_or(Error::Invalid("path SGID is not in the port's GID table"))?;
        ah.grh = Some(GlobalRoute {
            dgid: rec.dgid,
            flow_label: rec.flow_label,
            sgid_index: u8::try_from(idx).map_err(|_| Error::Invalid("SGID index above 255"))?,
            hop_limit: rec.hop_limit,
            traffic_class: rec.traffic_class,
        });
    }
    Ok(ah)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_table_records_split_by_attr_offset() {
        let mut m = build_mad(sa_method::GET_TABLE_RESP, sa_attr::PORT_INFO_REC, 0, &[]).unwrap();
        m.set_method(sa_method::GET_TABLE_RESP);
        set_attr_offset(&mut m, 9);
        // RMPP active, single segment, payload 20 + 2 * 72.
        m.0[26] = 0x01 | 0x06;
        m.0[32..36].copy_from_slice(&(20u32 + 144).to_be_bytes());
        m.0[56] = 0x11;
        m.0[56 + 72] = 0x22;
        let r = response_records(&m, None, 68).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0][0], 0x11);
        assert_eq!(r[1][0], 0x22);
        // Attribute offset 0: no records.
        set_attr_offset(&mut m, 0);
        assert!(response_records(&m, None, 68).unwrap().is_empty());
        // Shorter than the record: refused.
        set_attr_offset(&mut m, 2);
        assert!(response_records(&m, None, 68).is_err());
        // A huge payload length is clamped to one MAD.
        set_attr_offset(&mut m, 9);
        m.0[32..36].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(response_records(&m, None, 68).unwrap().len(), 2);
    }
}
