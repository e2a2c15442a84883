//! Port of Linux `ipoib_ib.c`: the receive ring (each slot the 40-byte GRH area, the 4-byte header and the MTU), the receive completion handler that sorts frames into IPv4 for the stack, ARP for the link and counted drops, and the send ring with its completions.
//!
//! Left out: NAPI and the CQ events (the stack polls, the link polls its
//! CQs), LSO and checksum offload, the connected-mode paths, the dead-AH
//! reaper (an address handle is destroyed when its path gets a new one:
//! a UD send has taken the address into its WQE by the time it is posted),
//! and `ipoib_ib_dev_stop`'s drain (the QP is destroyed with the link).
//! Linux copies each received frame into a new skb only when it is small;
//! here every frame is copied once, out of the ring into the stack's
//! buffer, and the slot posted again at once.

use ib_core::IbCore;
use ib_core::error::Result;
use ib_core::verbs::{
    Ah, RecvWr, SendFlags, SendWr, Sge, Wc, WcFlags, WcStatus, WrDetail, WrOpcode,
};

use crate::arp::ARP_LEN;
use crate::ipoib_main::IpoibDev;
use crate::{FrameError, IB_GRH_BYTES, IPOIB_ENCAP_LEN, parse_frame};

/// Bit of a send WR's id (receive ids are the slot alone).
const TX_WRID: u64 = 1 << 63;

impl IpoibDev {
    /// `ipoib_ib_post_receive` of ring slot `slot`.
    #[doc(alias = "ipoib_ib_post_receive")]
    fn ib_post_receive(&mut self, core: &mut IbCore, slot: u32) -> Result<()> {
        let (Some(t), Some(d)) = (self.t.as_ref(), core.device_mut(self.dev)) else {
            return Err(ib_core::Error::NoDev);
        };
        let sge = [Sge {
            addr: t.rx.bus_addr().0 + u64::from(slot) * t.rx_slot as u64,
            length: t.rx_slot as u32,
            lkey: t.mr.lkey,
        }];
        match d.post_recv(
            t.qp,
            &[RecvWr {
                wr_id: u64::from(slot),
                sg_list: &sge,
            }],
        ) {
            Ok(()) => {
                self.rx_posted += 1;
                Ok(())
            }
            Err(e) => {
                self.counters.rx_post_errors += 1;
                Err(e.error)
            }
        }
    }

    /// `ipoib_ib_post_receives`: the whole ring.
    #[doc(alias = "ipoib_ib_post_receives")]
    pub(crate) fn ib_post_receives(&mut self, core: &mut IbCore) -> Result<()> {
        let n = self.t.as_ref().map_or(0, |t| t.rx_n);
        for slot in 0..n {
            self.ib_post_receive(core, slot)?;
        }
        Ok(())
    }

    /// Posts again the slots whose post failed before (the ring is kept
    /// full; a flushed slot stays down with its QP).
    pub(crate) fn ib_refill_receives(&mut self, core: &mut IbCore) {
        while let Some(slot) = self.rx_down.pop() {
            if self.ib_post_receive(core, slot).is_err() {
                self.rx_down.push(slot);
                return;
            }
        }
    }

    fn repost(&mut self, core: &mut IbCore, slot: u32) {
        if self.ib_post_receive(core, slot).is_err() && self.rx_down.len() < self.rx_down.capacity()
        {
            self.rx_down.push(slot);
        }
    }

    /// The next receive completion (the CQ is polled a batch at a time).
    pub(crate) fn ib_next_rx_wc(&mut self, core: &mut IbCore) -> Option<Wc> {
        if self.rx_wc_pos >= self.rx_wc_len {
            let t = self.t.as_ref()?;
            let d = core.device_mut(self.dev)?;
            let n = match d.poll_cq(t.recv_cq, &mut self.rx_wc) {
                Ok(n) => n.min(self.rx_wc.len()),
                Err(_) => {
                    self.counters.rx_wc_errors += 1;
                    0
                }
            };
            self.rx_wc_len = n;
            self.rx_wc_pos = 0;
            if n == 0 {
                return None;
            }
        }
        let wc = self.rx_wc[self.rx_wc_pos];
        self.rx_wc_pos += 1;
        Some(wc)
    }

    /// `ipoib_ib_handle_rx_wc`: an IPv4 packet is copied into `buf` and
    /// its length returned; ARP goes to the link's ARP; everything else is
    /// a counted drop. The slot is posted again in every case (but a
    /// flush).
    #[doc(alias = "ipoib_ib_handle_rx_wc")]
    pub(crate) fn ib_handle_rx_wc(
        &mut self,
        core: &mut IbCore,
        wc: &Wc,
        buf: &mut [u8],
    ) -> Option<usize> {
        let t = self.t.as_ref()?;
        let (rx_n, rx_slot, qpn) = (t.rx_n, t.rx_slot, t.qpn);
        let Some(slot) = u32::try_from(wc.wr_id).ok().filter(|&s| s < rx_n) else {
            // Not a WR of ours: nothing to post again.
            self.counters.rx_wc_errors += 1;
            self.stats.rx_errors += 1;
            return None;
        };
        self.rx_posted = self.rx_posted.saturating_sub(1);
        if wc.status != WcStatus::Success {
            if wc.status == WcStatus::WrFlushErr {
                self.counters.rx_flushed += 1;
            } else {
                self.counters.rx_wc_errors += 1;
                self.stats.rx_errors += 1;
                self.repost(core, slot);
            }
            return None;
        }
        let len = wc.byte_len as usize;
        if len < IB_GRH_BYTES + IPOIB_ENCAP_LEN || len > rx_slot {
            self.counters.rx_short += 1;
            self.stats.rx_errors += 1;
            self.repost(core, slot);
            return None;
        }
        if wc.src_qp == qpn && wc.slid == self.lid {
            // Our own datagram (the QP blocks multicast loopback; this is a
            // unicast to ourselves or a switch's reflection).
            self.counters.rx_own += 1;
            self.repost(core, slot);
            return None;
        }
        let off = slot as usize * rx_slot;
        let frame_len = len - IB_GRH_BYTES;
        // The header and enough of what follows to classify the frame.
        let mut head = [0u8; IPOIB_ENCAP_LEN + ARP_LEN];
        let k = frame_len.min(head.len());
        let t = self.t.as_ref()?;
        t.rx.read_bytes(off + IB_GRH_BYTES, &mut head[..k]);
        let multicast = wc.wc_flags.contains(WcFlags::GRH) && t.rx.read_u8(off + 24) == 0xff;
        let kind = parse_frame(&head[..k]);
        let payload = frame_len - IPOIB_ENCAP_LEN;
        let got = match kind {
            Ok(crate::Frame::Ipv4(_)) => {
                if payload > buf.len() {
                    self.counters.rx_too_long += 1;
                    self.stats.rx_dropped += 1;
                    None
                } else {
                    t.rx.read_bytes(off + IB_GRH_BYTES + IPOIB_ENCAP_LEN, &mut buf[..payload]);
                    Some(payload)
                }
            }
            Ok(crate::Frame::Arp(_)) => None,
            Err(FrameError::Short) => {
                self.counters.rx_short += 1;
                self.stats.rx_errors += 1;
                None
            }
            Err(FrameError::BadIpv4) => {
                self.counters.rx_bad_ipv4 += 1;
                self.stats.rx_errors += 1;
                None
            }
            Err(FrameError::UnknownType(_)) => {
                self.counters.rx_unknown_type += 1;
                self.stats.rx_dropped += 1;
                None
            }
        };
        self.repost(core, slot);
        if kind.is_ok() {
            self.stats.count_rx(payload);
            if multicast {
                self.stats.multicast += 1;
            }
        }
        match kind {
            Ok(crate::Frame::Arp(_)) => {
                let n = (k - IPOIB_ENCAP_LEN).min(payload);
                self.arp_rcv(core, &head[IPOIB_ENCAP_LEN..IPOIB_ENCAP_LEN + n]);
                None
            }
            Ok(crate::Frame::Ipv4(_)) => {
                let n = got?;
                if n >= 20 {
                    let src = net::Ipv4Address::new(buf[12], buf[13], buf[14], buf[15]);
                    self.neighs.confirm(&src, wc.src_qp, self.now_us);
                }
                Some(n)
            }
            Err(_) => None,
        }
    }

    /// `ipoib_poll_tx`-ish: takes send completions, freeing their slots.
    #[doc(alias = "ipoib_ib_handle_tx_wc")]
    pub(crate) fn ib_poll_tx(&mut self, core: &mut IbCore) {
        for _ in 0..64 {
            let (Some(t), Some(d)) = (self.t.as_ref(), core.device_mut(self.dev)) else {
                return;
            };
            let tx_n = t.tx_n;
            let n = match d.poll_cq(t.send_cq, &mut self.tx_wc) {
                Ok(n) => n.min(self.tx_wc.len()),
                Err(_) => {
                    self.counters.tx_wc_errors += 1;
                    return;
                }
            };
            for wc in &self.tx_wc[..n] {
                if wc.wr_id & TX_WRID == 0 {
                    continue;
                }
                let slot = (wc.wr_id & !TX_WRID) as u32;
                self.tx_outstanding = self.tx_outstanding.saturating_sub(1);
                self.tx_tail = (slot.wrapping_add(1)) % tx_n.max(1);
                if wc.status != WcStatus::Success {
                    self.counters.tx_wc_errors += 1;
                    self.stats.tx_errors += 1;
                }
            }
            if n < self.tx_wc.len() {
                return;
            }
        }
    }

    /// Whether a send slot is free (send completions taken first if the
    /// ring looks full).
    pub(crate) fn tx_slot_free(&mut self, core: &mut IbCore) -> bool {
        let Some(n) = self.t.as_ref().map(|t| t.tx_n) else {
            return false;
        };
        if self.tx_outstanding < n {
            return true;
        }
        self.ib_poll_tx(core);
        self.tx_outstanding < n
    }

    /// `ipoib_send`: `frame` (header and packet) into the next send slot,
    /// posted to QP `qpn` through `ah` with the broadcast group's Q_Key.
    /// Counts what it drops.
    #[doc(alias = "ipoib_send")]
    pub(crate) fn ib_send(&mut self, core: &mut IbCore, frame: &[u8], ah: Ah, qpn: u32) -> bool {
        if frame.len() > IPOIB_ENCAP_LEN + self.mcast_mtu {
            self.counters.tx_too_long += 1;
            self.stats.tx_dropped += 1;
            return false;
        }
        let Some(qkey) = self.bcast.qkey else {
            self.counters.tx_no_dest += 1;
            self.stats.tx_dropped += 1;
            return false;
        };
        if !self.tx_slot_free(core) {
            self.counters.tx_ring_full += 1;
            self.stats.tx_dropped += 1;
            return false;
        }
        let port = self.port;
        let (Some(t), Some(d)) = (self.t.as_ref(), core.device_mut(self.dev)) else {
            return false;
        };
        let slot = (self.tx_tail + self.tx_outstanding) % t.tx_n;
        let off = slot as usize * t.tx_slot;
        if frame.len() > t.tx_slot {
            self.counters.tx_too_long += 1;
            self.stats.tx_dropped += 1;
            return false;
        }
        t.tx.write_bytes(off, frame);
        let sge = [Sge {
            addr: t.tx.bus_addr().0 + off as u64,
            length: frame.len() as u32,
            lkey: t.mr.lkey,
        }];
        let wr = SendWr {
            wr_id: TX_WRID | u64::from(slot),
            sg_list: &sge,
            opcode: WrOpcode::Send,
            send_flags: SendFlags::SIGNALED,
            wr: WrDetail::Ud {
                ah,
                remote_qpn: qpn,
                remote_qkey: qkey,
                pkey_index: 0,
                port_num: port,
            },
            ..SendWr::default()
        };
        match d.post_send(t.qp, core::slice::from_ref(&wr)) {
            Ok(()) => {
                self.tx_outstanding += 1;
                self.stats.count_tx(frame.len() - IPOIB_ENCAP_LEN);
                true
            }
            Err(_) => {
                self.counters.tx_post_errors += 1;
                self.stats.tx_errors += 1;
                false
            }
        }
    }
}
