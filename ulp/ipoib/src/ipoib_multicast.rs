//! Port of Linux `ipoib_multicast.c` for the broadcast group: the join of the port's IPv4 broadcast group through ib_core's multicast client (retried with backoff while the SA refuses or does not answer, made again after a reregistration), and `ipoib_mcast_join_finish`: the group's Q_Key on the QP, the QP attached, the group's address handle and MTU.
//!
//! Left out: IP multicast groups (send-only and full joins of mapped MGIDs
//! for `224.0.0.0/4`: their packets are counted drops), the join task's
//! own timers (ib_core's multicast client keeps the retries and the
//! re-join on client reregister, SM change, LID change and port up), and
//! the carrier handling of the join task: the link's carrier is the port
//! Active with the broadcast group's address handle made.

use ib_core::multicast::{self, McastEvent, McastId};
use ib_core::sa_query::{McMemberRecord, join_state, mcmember_comp};
use ib_core::verbs::{Ah, Gid, Mtu};
use ib_core::{Error, IbCore};

use crate::ipoib_main::IpoibDev;
use crate::ipoib_verbs;
use crate::{IPOIB_UD_MTU, bcast_mgid, ud_mtu};

/// The broadcast group as the port holds it (`priv->broadcast`).
#[derive(Debug, Default)]
pub(crate) struct Bcast {
    /// The membership at the multicast client.
    pub member: Option<McastId>,
    /// The SA's answer while joined.
    pub rec: Option<McMemberRecord>,
    /// The address handle of the group (the carrier waits for it).
    pub ah: Option<Ah>,
    /// The MGID and MLID the QP is attached to.
    pub attached: Option<(Gid, u16)>,
    /// The Q_Key the QP has.
    pub qkey: Option<u32>,
    /// Why the last join failed (logged once per new reason).
    pub last_error: Option<Error>,
}

impl IpoibDev {
    /// `ipoib_mcast_join` of the broadcast group: MGID, our port GID, our
    /// P_Key and JoinState full member (Linux's mask; the SM made the
    /// group).
    #[doc(alias = "ipoib_mcast_join")]
    pub(crate) fn mcast_start(&mut self, core: &mut IbCore) {
        let rec = McMemberRecord {
            mgid: bcast_mgid(self.pkey),
            port_gid: self.gid,
            pkey: self.pkey,
            join_state: join_state::FULL_MEMBER,
            ..McMemberRecord::default()
        };
        match multicast::join(
            core,
            self.mc,
            self.dev,
            self.port,
            &rec,
            mcmember_comp::IPOIB_BCAST_JOIN,
        ) {
            Ok(id) => self.bcast.member = Some(id),
            Err(e) => {
                if self.bcast.last_error != Some(e) {
                    log::error!("{}: cannot join the broadcast group: {e}", self.name);
                    self.bcast.last_error = Some(e);
                }
            }
        }
    }

    /// Leaves the broadcast group: the membership, the attach and the
    /// address handle go (`ipoib_mcast_leave` + `ipoib_mcast_detach`).
    #[doc(alias = "ipoib_mcast_leave")]
    pub(crate) fn mcast_stop(&mut self, core: &mut IbCore) {
        let b = core::mem::take(&mut self.bcast);
        if let Some(id) = b.member {
            let _ = multicast::leave(core, self.mc, id);
        }
        let (Some(t), Some(d)) = (self.t.as_ref(), core.device_mut(self.dev)) else {
            return;
        };
        if let Some((mgid, mlid)) = b.attached {
            let _ = ipoib_verbs::mcast_detach(d, t.qp, &mgid, mlid);
        }
        if let Some(ah) = b.ah {
            let _ = d.destroy_ah(ah);
        }
    }

    /// Leaves the group and joins the one of the current P_Key.
    pub(crate) fn mcast_restart(&mut self, core: &mut IbCore) {
        self.mcast_stop(core);
        self.mcast_start(core);
    }

    /// What the multicast client said of our membership since the last
    /// poll.
    pub(crate) fn mcast_poll(&mut self, core: &mut IbCore) {
        let Some(id) = self.bcast.member else {
            // The join could not even start: try again each poll (logged
            // once).
            self.mcast_start(core);
            return;
        };
        while let Some(ev) = multicast::next_event(core, self.mc, id) {
            match ev {
                McastEvent::Joined(rec) => self.mcast_join_finish(core, rec),
                McastEvent::Failed(e) => {
                    self.counters.join_failures += 1;
                    if self.bcast.last_error != Some(e) {
                        log::warn!(
                            "{}: broadcast group {}: join failed ({e}); trying again",
                            self.name,
                            bcast_mgid(self.pkey)
                        );
                        self.bcast.last_error = Some(e);
                    }
                }
                McastEvent::Reset => {
                    // The SM forgot us (reregister, SM change, port
                    // bounce): the multicast client joins again; paths are
                    // asked again too.
                    log::debug!("{}: broadcast group membership reset", self.name);
                    self.mark_paths_invalid();
                }
            }
        }
    }

    /// `ipoib_mcast_join_finish` for the broadcast group: the Q_Key on the
    /// QP, the attach, the address handle, the MTU.
    #[doc(alias = "ipoib_mcast_join_finish")]
    pub(crate) fn mcast_join_finish(&mut self, core: &mut IbCore, rec: McMemberRecord) {
        let Some(qp) = self.t.as_ref().map(|t| t.qp) else {
            return;
        };
        let Some(d) = core.device_mut(self.dev) else {
            return;
        };
        let group_mtu = Mtu::from_raw(rec.mtu).map_or(0, |m| m.bytes() as usize);
        let mtu = ud_mtu(group_mtu).min(IPOIB_UD_MTU);
        if mtu < IPOIB_UD_MTU {
            log::warn!(
                "{}: the broadcast group's MTU is {group_mtu} bytes: packets above {mtu} bytes are dropped",
                self.name
            );
        }
        self.mcast_mtu = mtu;
        let fail = |me: &mut IpoibDev, what: &str, e: Error| {
            me.counters.join_failures += 1;
            log::error!("{}: broadcast group: {what}: {e}", me.name);
            me.bcast.last_error = Some(e);
        };
        if self.bcast.qkey != Some(rec.qkey) {
            if let Err(e) = ipoib_verbs::set_qkey(d, qp, rec.qkey) {
                return fail(self, "cannot set the Q_Key", e);
            }
            self.bcast.qkey = Some(rec.qkey);
        }
        if self.bcast.attached != Some((rec.mgid, rec.mlid)) {
            if let Some((mgid, mlid)) = self.bcast.attached.take() {
                let _ = ipoib_verbs::mcast_detach(d, qp, &mgid, mlid);
            }
            if let Err(e) = ipoib_verbs::mcast_attach(d, qp, &rec.mgid, rec.mlid) {
                return fail(self, "cannot attach the QP", e);
            }
            self.bcast.attached = Some((rec.mgid, rec.mlid));
        }
        let ah = multicast::init_ah_from_mcmember(d, self.port, &rec).and_then(|attr| {
            match self.t.as_ref() {
                Some(t) => d.create_ah(t.pd, &attr),
                None => Err(Error::NoDev),
            }
        });
        let ah = match ah {
            Ok(ah) => ah,
            Err(e) => return fail(self, "cannot make its address handle", e),
        };
        if let Some(old) = self.bcast.ah.replace(ah) {
            let _ = d.destroy_ah(old);
        }
        let first = self.bcast.rec.is_none();
        self.bcast.rec = Some(rec);
        self.bcast.last_error = None;
        self.counters.joins += 1;
        let line = alloc::format!(
            "{}: broadcast group {} joined: MLID {:#06x}, Q_Key {:#06x}, MTU {group_mtu}, SL {}",
            self.name,
            rec.mgid,
            rec.mlid,
            rec.qkey,
            rec.sl
        );
        if first {
            log::info!("{line}");
        } else {
            log::debug!("{line}");
        }
    }
}
