//! The SM's requests on the wire, after OpenSM's `osm_req.c` and `osm_vl15intf.c`: directed-route SubnGet/SubnSet queued, at most `max_wire_smps` outstanding, each resent after `transaction_timeout` up to `transaction_retries` times.
//!
//! Every SMP goes through ib_core's MAD layer (an agent on QP0: the SMI send
//! rules, the local SMA for hop 0, the response matched by TID). A response
//! is checked against what was asked (method, attribute and modifier); one
//! that does not match counts as a bad answer and the SMP is sent again, as
//! a lost one would be. OpenSM's M_Key handling and LID-routed requests are
//! left out: every request is directed route.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;

use ib_core::mad::{Mad, MadSendBuf, class, method};
use ib_core::verbs::{AhAttr, WcStatus};
use ib_core::{IbCore, MadAgent, MadRecvWc, MadSendWc};

use crate::ib_types::PERMISSIVE_LID;

/// What a request is for: how its answer is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ctx {
    /// NodeInfo along a path, reached through (node, port) (`None`: our
    /// own node). `dup` counts re-queries of a suspected duplicate GUID.
    NodeInfo {
        /// Where the cable starts.
        from: Option<(u64, u8)>,
        /// Re-queries so far.
        dup: u8,
    },
    /// NodeDescription of a node.
    NodeDesc(u64),
    /// SwitchInfo of a switch (`light`: a light sweep's state check).
    SwitchInfo {
        /// Node GUID.
        node: u64,
        /// From a light sweep.
        light: bool,
    },
    /// PortInfo of (node, port).
    PortInfo(u64, u8),
    /// SMInfo of the SM at this port GUID.
    SmInfo(u64),
    /// SubnSet(SMInfo) with this modifier to the SM at this port GUID.
    SetSmInfo(u64, u32),
    /// SubnSet(PortInfo) of (node, port).
    SetPortInfo(u64, u8),
    /// SubnSet(SwitchInfo).
    SetSwitchInfo(u64),
    /// SubnSet(LinearForwardingTable) block.
    SetLft(u64, u16),
    /// SubnSet(MulticastForwardingTable) block and position.
    SetMft(u64, u16, u8),
}

/// One SMP to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    /// Egress ports from the SM's node, one per hop (empty: our own node).
    pub path: Vec<u8>,
    /// Get or Set.
    pub method: u8,
    /// Attribute.
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
    /// SMP data (for a Set).
    pub data: [u8; 64],
    /// What it is for.
    pub ctx: Ctx,
}

impl Req {
    /// A SubnGet.
    pub fn get(path: &[u8], attr_id: u16, attr_mod: u32, ctx: Ctx) -> Req {
        Req {
            path: path.to_vec(),
            method: method::GET,
            attr_id,
            attr_mod,
            data: [0; 64],
            ctx,
        }
    }
    /// A SubnSet.
    pub fn set(path: &[u8], attr_id: u16, attr_mod: u32, data: [u8; 64], ctx: Ctx) -> Req {
        Req {
            path: path.to_vec(),
            method: method::SET,
            attr_id,
            attr_mod,
            data,
            ctx,
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// Answered (status 0): the answer's SMP data.
    Ok(Req, [u8; 64]),
    /// Answered with an error status.
    Status(Req, u16),
    /// No (good) answer after every try.
    Timeout(Req),
}

/// Counters of the SMPs (OpenSM's `qp0_mads_sent` and friends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmpCounters {
    /// SMPs posted, resends included.
    pub sent: u64,
    /// Resends after a timeout or a bad answer.
    pub retried: u64,
    /// Requests given up after every try.
    pub timeouts: u64,
    /// Answers with an error status.
    pub errors: u64,
    /// Answers that did not match the request (method, attribute,
    /// modifier): dropped, the SMP sent again.
    pub bad_answers: u64,
    /// Posts ib_core refused.
    pub post_errors: u64,
}

struct InFlight {
    req: Req,
    tries: u32,
}

/// The queue and the SMPs on the wire.
#[derive(Default)]
pub struct ReqQueue {
    queue: VecDeque<Req>,
    wire: BTreeMap<u64, InFlight>,
    /// Counters.
    pub counters: SmpCounters,
}

/// How requests are sent.
#[derive(Debug, Clone, Copy)]
pub struct WireCfg {
    /// The agent (QP0).
    pub agent: MadAgent,
    /// Outstanding at most.
    pub max_wire: usize,
    /// Response timeout per try (ms).
    pub timeout_ms: u32,
    /// Resends.
    pub retries: u32,
    /// M_Key put in every SMP.
    pub m_key: u64,
}

/// Builds the directed-route SMP for `r` (C14-9: hop count, initial path,
/// permissive DrSLID and DrDLID; the MAD layer moves the hop pointer).
pub fn build_smp(r: &Req, m_key: u64) -> Mad {
    let mut m = Mad::new_request(
        class::SUBN_DIRECTED_ROUTE,
        1,
        r.method,
        r.attr_id,
        r.attr_mod,
    );
    let hops = r.path.len().min(63) as u8;
    m.set_hop_cnt(hops);
    m.set_hop_ptr(0);
    for (i, &p) in r.path.iter().take(63).enumerate() {
        m.set_initial_path(i as u8 + 1, p);
    }
    m.set_mkey(m_key);
    m.set_dr_slid(PERMISSIVE_LID);
    m.set_dr_dlid(PERMISSIVE_LID);
    m.smp_data_mut().copy_from_slice(&r.data);
    m
}

impl ReqQueue {
    /// Queues a request.
    pub fn push(&mut self, r: Req) {
        self.queue.push_back(r);
    }
    /// Requests queued or on the wire.
    pub fn pending(&self) -> usize {
        self.queue.len() + self.wire.len()
    }
    /// Whether nothing is queued or outstanding (`wait_for_pending_transactions`).
    pub fn idle(&self) -> bool {
        self.queue.is_empty() && self.wire.is_empty()
    }
    /// Drops everything (the sweep is abandoned); answers still coming
    /// are ignored.
    pub fn clear(&mut self, core: &mut IbCore, agent: MadAgent) {
        self.queue.clear();
        for &id in self.wire.keys() {
            let _ = core.cancel_mad(agent, ib_core::MadSendId(id));
        }
        self.wire.clear();
    }

    fn post(&mut self, core: &mut IbCore, w: &WireCfg, req: Req, tries: u32) -> Option<Done> {
        let mad = build_smp(&req, w.m_key);
        let mut buf = MadSendBuf::new(
            mad,
            AhAttr {
                dlid: PERMISSIVE_LID,
                port_num: w.agent.port,
                ..AhAttr::default()
            },
            0,
        );
        buf.timeout_ms = w.timeout_ms.max(1);
        buf.retries = 0;
        self.counters.sent += 1;
        match core.post_send_mad(w.agent, buf) {
            Ok(id) => {
                self.wire.insert(id.0, InFlight { req, tries });
                None
            }
            Err(e) => {
                // The SMI rules or the local SMA refused it: no answer will
                // ever come, so it ends here.
                log::debug!(
                    "SM: SMP {:#06x} along {:?} refused: {e}",
                    req.attr_id,
                    req.path
                );
                self.counters.post_errors += 1;
                self.counters.timeouts += 1;
                Some(Done::Timeout(req))
            }
        }
    }

    /// Posts queued requests while the window allows; a request ib_core
    /// refuses ends at once (returned).
    pub fn pump(&mut self, core: &mut IbCore, w: &WireCfg, done: &mut Vec<Done>) -> usize {
        let mut n = 0;
        while self.wire.len() < w.max_wire.max(1) {
            let Some(r) = self.queue.pop_front() else {
                break;
            };
            n += 1;
            if let Some(d) = self.post(core, w, r, 1) {
                done.push(d);
            }
        }
        n
    }

    /// A response that came to the agent: finishes its request (or sends
    /// it again if it does not match what was asked).
    pub fn on_recv(
        &mut self,
        core: &mut IbCore,
        w: &WireCfg,
        r: &MadRecvWc,
        done: &mut Vec<Done>,
    ) -> bool {
        let Some(id) = r.send_id else {
            return false;
        };
        let Some(f) = self.wire.remove(&id.0) else {
            // Late (after a resend) or canceled.
            return true;
        };
        let m = &r.mad;
        let matches = m.method() == method::GET_RESP
            && m.attr_id() == f.req.attr_id
            && (m.attr_mod() & 0x00ff_ffff) == (f.req.attr_mod & 0x00ff_ffff);
        if !matches {
            self.counters.bad_answers += 1;
            log::warn!(
                "SM: answer {:#04x} attr {:#06x} mod {:#x} to SMP {:#04x} attr {:#06x} mod {:#x} along {:?}: dropped",
                m.method(),
                m.attr_id(),
                m.attr_mod(),
                f.req.method,
                f.req.attr_id,
                f.req.attr_mod,
                f.req.path
            );
            self.retry(core, w, f, done);
            return true;
        }
        let st = m.status() & 0x7fff;
        if st != 0 {
            self.counters.errors += 1;
            done.push(Done::Status(f.req, st));
        } else {
            let mut d = [0u8; 64];
            d.copy_from_slice(m.smp_data());
            done.push(Done::Ok(f.req, d));
        }
        true
    }

    fn retry(&mut self, core: &mut IbCore, w: &WireCfg, f: InFlight, done: &mut Vec<Done>) {
        if f.tries <= w.retries {
            self.counters.retried += 1;
            if let Some(d) = self.post(core, w, f.req, f.tries + 1) {
                done.push(d);
            }
        } else {
            self.counters.timeouts += 1;
            done.push(Done::Timeout(f.req));
        }
    }

    /// A send completion: a timed-out request is sent again or given up.
    pub fn on_send_done(
        &mut self,
        core: &mut IbCore,
        w: &WireCfg,
        s: &MadSendWc,
        done: &mut Vec<Done>,
    ) {
        if s.status == WcStatus::Success {
            // Answered (the answer already took it off the wire), or a
            // send that expects nothing.
            return;
        }
        let Some(f) = self.wire.remove(&s.id.0) else {
            return;
        };
        self.retry(core, w, f, done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directed_route_smp_carries_its_path() {
        let r = Req::get(&[1, 5, 3], 0x11, 0, Ctx::NodeDesc(0));
        let m = build_smp(&r, 0x1234);
        assert_eq!(m.mgmt_class(), 0x81);
        assert_eq!((m.hop_cnt(), m.hop_ptr()), (3, 0));
        assert_eq!(
            (m.initial_path(1), m.initial_path(2), m.initial_path(3)),
            (1, 5, 3)
        );
        assert_eq!((m.dr_slid(), m.dr_dlid()), (0xffff, 0xffff));
        assert_eq!(m.mkey(), 0x1234);
        assert_eq!(m.attr_id(), 0x11);
    }
}
