//! The sending side of RMPP (IBTA vol. 1, 13.6.5; Linux `mad_rmpp.c`'s sender, which OpenSM relies on through the kernel): an SA GetTable answer cut into 200-byte DATA segments, sent under the receiver's window, resent after a timeout, finished by the last ACK or given up after the resends or on STOP/ABORT.
//!
//! ib_core receives RMPP but does not send it, so the SA does it here on its
//! own agent (registered without RMPP: the receiver's ACKs, which come back
//! as GetTable requests with the RMPP ACK type, reach it as MADs). A
//! single-segment answer is sent once (flags First and Last) and its ACK
//! ignored. Left out: the sender's response-time handling, ABORT with a
//! reason on give-up (the transfer is dropped silently, as a lost one).

use alloc::vec::Vec;

use hal::be::{get_be32, get_be64};
use ib_core::mad::Mad;
use ib_core::verbs::AhAttr;
use ib_core::{IbCore, MadRecvWc, MadSendBuf};

use super::{SA_DATA, SA_DATA_LEN};
use crate::sm::Sm;

/// Transfers under way at once; more are answered NO_RESOURCES.
pub const RMPP_MAX_SENDS: usize = 16;

/// An answer going out as DATA segments.
#[derive(Debug, Clone)]
pub struct RmppSend {
    tid: u64,
    dlid: u16,
    ah: AhAttr,
    dqp: u32,
    pkey_index: u16,
    /// The headers every segment repeats.
    hdr: Mad,
    data: Vec<u8>,
    nsegs: u32,
    acked: u32,
    window_last: u32,
    sent: u32,
    deadline: u64,
    tries: u32,
}

/// Segments a message of `len` data bytes takes (at least one).
pub fn segments(len: usize) -> u32 {
    len.div_ceil(SA_DATA_LEN).max(1) as u32
}

/// Segment `seg` (1-based) of `nsegs` for the message `data` (RMPP
/// header: version 1, DATA, ACTIVE with FIRST on the first and LAST on the
/// last, no response time; PayloadLength: the whole message after the
/// RMPP header in the first segment, what the last carries in the last).
pub fn segment(hdr: &Mad, data: &[u8], seg: u32, nsegs: u32) -> Mad {
    let mut m = hdr.clone();
    let off = (seg as usize).saturating_sub(1) * SA_DATA_LEN;
    let chunk = data
        .get(off..data.len().min(off + SA_DATA_LEN))
        .unwrap_or(&[]);
    m.0[24] = 1;
    m.0[25] = 1;
    let mut flags = 1u8;
    if seg == 1 {
        flags |= 2;
    }
    if seg == nsegs {
        flags |= 4;
    }
    m.0[26] = 0x1f << 3 | flags;
    m.0[27] = 0;
    m.0[28..32].copy_from_slice(&seg.to_be_bytes());
    let paylen = if seg == 1 {
        20 + data.len()
    } else if seg == nsegs {
        20 + chunk.len()
    } else {
        0
    };
    m.0[32..36].copy_from_slice(&(paylen as u32).to_be_bytes());
    m.0[SA_DATA..].fill(0);
    m.0[SA_DATA..SA_DATA + chunk.len()].copy_from_slice(chunk);
    m
}

impl Sm {
    /// Starts sending `data` as the answer `hdr` to `r`.
    pub(crate) fn rmpp_start(
        &mut self,
        core: &mut IbCore,
        r: &MadRecvWc,
        hdr: Mad,
        data: Vec<u8>,
        now: u64,
    ) {
        let nsegs = segments(data.len());
        let Some(ah) = core.device(self.dev).and_then(|d| {
            ib_core::agent::init_ah_from_wc(d, self.port, &r.wc, r.grh.as_ref()).ok()
        }) else {
            return;
        };
        if nsegs == 1 {
            let m = segment(&hdr, &data, 1, 1);
            self.sa.counters.rmpp_segments += 1;
            self.sa_send(core, r, m);
            return;
        }
        let tid = hdr.tid();
        let dlid = r.wc.slid;
        // A repeated request restarts its transfer.
        self.sa.rmpp.retain(|t| !(t.tid == tid && t.dlid == dlid));
        if self.sa.rmpp.len() >= RMPP_MAX_SENDS {
            self.sa.counters.answered = self.sa.counters.answered.saturating_sub(1);
            self.sa_send_error(core, r, crate::ib_types::status::SA_NO_RESOURCES);
            return;
        }
        self.sa.counters.rmpp_transfers += 1;
        self.sa.rmpp.push(RmppSend {
            tid,
            dlid,
            ah,
            dqp: r.wc.src_qp,
            pkey_index: r.wc.pkey_index,
            hdr,
            data,
            nsegs,
            acked: 0,
            window_last: 1,
            sent: 0,
            deadline: 0,
            tries: 0,
        });
        let i = self.sa.rmpp.len() - 1;
        self.rmpp_send_window(core, i, now);
    }

    fn rmpp_send_window(&mut self, core: &mut IbCore, i: usize, now: u64) {
        let timeout = u64::from(self.cfg.rmpp_timeout_ms.max(1)) * 1_000_000;
        let agent = self.sa_agent;
        let Some(t) = self.sa.rmpp.get_mut(i) else {
            return;
        };
        let last = t.window_last.min(t.nsegs);
        while t.sent < last {
            t.sent += 1;
            let m = segment(&t.hdr, &t.data, t.sent, t.nsegs);
            let mut buf = MadSendBuf::new(m, t.ah, t.dqp);
            buf.pkey_index = t.pkey_index;
            self.sa.counters.rmpp_segments += 1;
            let _ = core.post_send_mad(agent, buf);
        }
        t.deadline = now.saturating_add(timeout);
    }

    /// An ACK, STOP or ABORT of one of our transfers.
    pub(crate) fn rmpp_control(&mut self, core: &mut IbCore, r: &MadRecvWc, now: u64) {
        let m = &r.mad;
        let tid = get_be64(&m.0, 8);
        let Some(i) = self
            .sa
            .rmpp
            .iter()
            .position(|t| t.tid == tid && t.dlid == r.wc.slid)
        else {
            // The ACK of a single-segment answer, or of a finished one.
            return;
        };
        match m.0[25] {
            2 => {
                let seg = get_be32(&m.0, 28);
                let newwin = get_be32(&m.0, 32);
                let t = &mut self.sa.rmpp[i];
                if seg > t.sent || seg < t.acked || newwin < seg {
                    // Not a sane ACK: the timer will resend.
                    return;
                }
                t.acked = seg;
                t.tries = 0;
                t.window_last = t.window_last.max(newwin);
                if t.acked >= t.nsegs {
                    self.sa.rmpp.swap_remove(i);
                    return;
                }
                self.rmpp_send_window(core, i, now);
            }
            _ => {
                self.sa.rmpp.swap_remove(i);
                self.sa.counters.rmpp_aborted += 1;
            }
        }
    }

    /// Resends the window of a stalled transfer, or gives it up.
    pub(crate) fn sa_timers(&mut self, core: &mut IbCore, now: u64) -> usize {
        let mut work = 0;
        let mut i = 0;
        while i < self.sa.rmpp.len() {
            if self.sa.rmpp[i].deadline > now {
                i += 1;
                continue;
            }
            work += 1;
            if self.sa.rmpp[i].tries >= self.cfg.rmpp_retries {
                self.sa.rmpp.swap_remove(i);
                self.sa.counters.rmpp_aborted += 1;
                continue;
            }
            let t = &mut self.sa.rmpp[i];
            t.tries += 1;
            t.sent = t.acked;
            self.rmpp_send_window(core, i, now);
            i += 1;
        }
        work + self.mcast_timers(now) + super::service_record::expire(self, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_carry_rmpp_headers_and_data() {
        let data: Vec<u8> = (0..450u32).map(|i| i as u8).collect();
        let hdr = Mad::default();
        assert_eq!(segments(data.len()), 3);
        assert_eq!(segments(0), 1);
        let s1 = segment(&hdr, &data, 1, 3);
        assert_eq!((s1.0[24], s1.0[25], s1.0[26] & 7), (1, 1, 3));
        assert_eq!(get_be32(&s1.0, 28), 1);
        assert_eq!(get_be32(&s1.0, 32), 470);
        assert_eq!(s1.0[SA_DATA], 0);
        let s2 = segment(&hdr, &data, 2, 3);
        assert_eq!((s2.0[26] & 7, get_be32(&s2.0, 32)), (1, 0));
        assert_eq!(s2.0[SA_DATA], 200);
        let s3 = segment(&hdr, &data, 3, 3);
        assert_eq!((s3.0[26] & 7, get_be32(&s3.0, 32)), (5, 70));
        assert_eq!(s3.0[SA_DATA + 49], (449u32 as u8));
        assert!(s3.0[SA_DATA + 50..].iter().all(|&b| b == 0));
        let one = segment(&hdr, &data[..10], 1, 1);
        assert_eq!((one.0[26] & 7, get_be32(&one.0, 32)), (7, 30));
    }
}
