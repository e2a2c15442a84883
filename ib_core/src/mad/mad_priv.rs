//! Port of Linux `drivers/infiniband/core/mad_priv.h` (3.11): the private state of the MAD layer of a port, of its agents and of its sends.

use alloc::collections::{BTreeSet, VecDeque};
use alloc::vec::Vec;

use hal::{Clock, DmaBuf};

use super::{MAD_RECV_BUF, MadCounters, qp_index};
use crate::device::{Device, MadConfig};
use crate::error::{Error, Result};
use crate::mad::{IB_MGMT_MAD_SIZE, Mad, MadEvent, MadRegReq, MadSendBuf, MadSendId};
use crate::verbs::{Ah, Cq, Mr, Pd, Qp, QpType};

/// An agent (`struct ib_mad_agent_private`): its QP, registration, TIDs
/// and mailbox.
pub(super) struct AgentPriv {
    pub(super) qp_type: QpType,
    pub(super) rmpp_version: u8,
    pub(super) reg: Option<MadRegReq>,
    pub(super) hi_tid: u32,
    pub(super) next_tid: u32,
    pub(super) mailbox: VecDeque<MadEvent>,
}

/// Where a send is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendState {
    /// Waiting for room on the send queue.
    Queued,
    /// Posted in send slot `slot`.
    OnWire(u32),
    /// Sent; waiting for the response until `deadline` (ns).
    WaitResp(u64),
}

/// One send (`struct ib_mad_send_wr_private`).
pub(super) struct SendPriv {
    pub(super) generation: u32,
    pub(super) agent: Option<u32>,
    pub(super) qpi: usize,
    pub(super) buf: MadSendBuf,
    pub(super) ah: Ah,
    pub(super) retries_left: u32,
    pub(super) state: SendState,
    pub(super) canceled: bool,
    pub(super) got_response: bool,
    /// In flight when the QP went to SQE: repost it when it comes back
    /// flushed (Linux `mark_sends_for_retry`).
    pub(super) retry_on_flush: bool,
}

/// QP0 or QP1 of a port with its buffers (`struct ib_mad_qp_info`).
pub(super) struct MadQp {
    pub(super) qp: Qp,
    pub(super) recv_pages: Vec<DmaBuf>,
    pub(super) recv_per_page: usize,
    pub(super) send_pages: Vec<DmaBuf>,
    pub(super) send_per_page: usize,
    /// Which send (slab index) occupies each send slot.
    pub(super) send_slot: Vec<Option<u32>>,
    pub(super) free_slots: Vec<u32>,
    pub(super) overflow: VecDeque<u32>,
}

impl MadQp {
    pub(super) fn recv_addr(&self, slot: usize) -> Option<(&DmaBuf, usize)> {
        let page = self.recv_pages.get(slot / self.recv_per_page)?;
        Some((page, (slot % self.recv_per_page) * MAD_RECV_BUF))
    }
    pub(super) fn send_addr(&self, slot: usize) -> Option<(&DmaBuf, usize)> {
        let page = self.send_pages.get(slot / self.send_per_page)?;
        Some((page, (slot % self.send_per_page) * IB_MGMT_MAD_SIZE))
    }
}

/// The MAD layer of one port (`struct ib_mad_port_private` + the port's
/// `ib_agent_port_private`).
pub(crate) struct MadPort {
    pub(super) port: u8,
    pub(super) pd: Option<Pd>,
    pub(super) mr: Option<Mr>,
    pub(super) cq: Option<Cq>,
    pub(super) qps: [Option<MadQp>; 2],
    pub(super) agents: Vec<Option<AgentPriv>>,
    pub(super) sends: Vec<Option<SendPriv>>,
    pub(super) free_sends: Vec<u32>,
    pub(super) next_gen: u32,
    /// Agents' requests by (TID, send index), to match responses without a
    /// scan of every send.
    pub(super) by_tid: BTreeSet<(u64, u32)>,
    /// No response deadline falls before this (ns); `u64::MAX` if none.
    pub(super) next_deadline: u64,
    /// RMPP transfers being received.
    pub(crate) rmpp_recvs: Vec<crate::mad_rmpp::RmppRecv>,
    pub(crate) counters: MadCounters,
}

/// One port's MAD layer with what its work needs: the device, the port's
/// state, the clock of the response timeouts and the core's MAD settings
/// (what Linux's `mad.c` reaches through `port_priv`), borrowed for one
/// call into the layer.
pub(crate) struct MadCtx<'a> {
    /// The device the port is on.
    pub(crate) dev: &'a mut Device,
    /// The port's MAD layer.
    pub(crate) mp: &'a mut MadPort,
    /// The core's clock.
    pub(crate) clock: &'a dyn Clock,
    /// The core's MAD settings.
    pub(crate) cfg: &'a MadConfig,
}

impl MadPort {
    pub(crate) fn port(&self) -> u8 {
        self.port
    }

    pub(super) fn agent_rmpp(&self, idx: u32) -> bool {
        self.agents
            .get(idx as usize)
            .and_then(|a| a.as_ref())
            .is_some_and(|a| a.rmpp_version != 0)
    }

    pub(super) fn agent(&mut self, idx: u32) -> Result<&mut AgentPriv> {
        self.agents
            .get_mut(idx as usize)
            .and_then(|a| a.as_mut())
            .ok_or(Error::NotFound)
    }

    pub(super) fn deliver(&mut self, cfg: &MadConfig, agent: u32, ev: MadEvent) {
        let Some(Some(a)) = self.agents.get_mut(agent as usize) else {
            return;
        };
        if matches!(ev, MadEvent::Recv(_)) && a.mailbox.len() >= cfg.agent_mailbox {
            self.counters.drop_mailbox_full += 1;
            return;
        }
        a.mailbox.push_back(ev);
    }

    /// `find_mad_agent` for a request: the agent registered for its class,
    /// class version and method on the QP it arrived on.
    pub(super) fn find_request_agent(&self, mad: &Mad, qpi: usize) -> Option<u32> {
        self.agents.iter().enumerate().find_map(|(i, a)| {
            let a = a.as_ref()?;
            let r = a.reg.as_ref()?;
            (qp_index(a.qp_type) == Some(qpi)
                && r.mgmt_class == mad.mgmt_class()
                && r.mgmt_class_version == mad.class_version()
                && r.has_method(mad.method())
                && (r.oui == [0; 3] || mad.0[37..40] == r.oui))
                .then_some(i as u32)
        })
    }

    /// `find_mad_agent` + `ib_find_send_mad` for a response: the agent whose
    /// `hi_tid` is the TID's upper half, and its outstanding request with
    /// that TID and class.
    pub(super) fn find_response_send(&self, mad: &Mad) -> Option<(u32, u32)> {
        let hi = (mad.tid() >> 32) as u32;
        let agent = self
            .agents
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.hi_tid == hi))? as u32;
        let tid = mad.tid();
        let send = self
            .by_tid
            .range((tid, 0)..=(tid, u32::MAX))
            .map(|&(_, i)| i)
            .find(|&i| {
                self.sends
                    .get(i as usize)
                    .and_then(|x| x.as_ref())
                    .is_some_and(|s| {
                        s.agent == Some(agent)
                            && !s.canceled
                            && !s.got_response
                            && s.buf.timeout_ms > 0
                            && s.buf.mad.mgmt_class() == mad.mgmt_class()
                            && !matches!(s.state, SendState::Queued)
                    })
            })?;
        Some((agent, send))
    }

    /// Puts send `idx` on the wait list until `deadline`.
    pub(super) fn wait_resp(&mut self, idx: u32, deadline: u64) {
        if let Some(s) = self.sends.get_mut(idx as usize).and_then(|x| x.as_mut()) {
            s.state = SendState::WaitResp(deadline);
            self.next_deadline = self.next_deadline.min(deadline);
        }
    }

    pub(super) fn send_id(&self, idx: u32) -> MadSendId {
        let generation = self
            .sends
            .get(idx as usize)
            .and_then(|x| x.as_ref())
            .map_or(0, |s| s.generation);
        MadSendId((u64::from(generation) << 32) | u64::from(idx))
    }

    pub(super) fn lookup_send(&self, id: MadSendId) -> Option<u32> {
        let idx = (id.0 & 0xffff_ffff) as u32;
        let generation = (id.0 >> 32) as u32;
        self.sends
            .get(idx as usize)
            .and_then(|s| s.as_ref())
            .filter(|s| s.generation == generation)
            .map(|_| idx)
    }
}
