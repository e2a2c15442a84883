//! Port of the receive half of Linux `drivers/infiniband/core/mad_rmpp.c` (3.11): reassembly of multi-segment RMPP transfers (IBTA Vol. 1 13.6) for agents registered with RMPP version 1.
//!
//! ACKs open the sender's window; an SA GetTable response is the transfer this
//! serves. Sending RMPP transfers, keeping out-of-order segments and the
//! STOP/ABORT handling of our own transfers are left out.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::device::MadConfig;
use crate::mad::{Grh, IB_MGMT_MAD_SIZE, Mad, MadCtx, MadPort, MadRecvWc, MadSendBuf, class};
use crate::verbs::{IB_QP_SET_QKEY, Wc};

/// `IB_MGMT_RMPP_VERSION`.
pub const IB_MGMT_RMPP_VERSION: u8 = 1;
/// RMPP header offset in the MAD.
pub const IB_MGMT_RMPP_HDR: usize = 36;
/// RMPP types.
pub mod rmpp_type {
    /// A data segment.
    pub const DATA: u8 = 1;
    /// An acknowledgement.
    pub const ACK: u8 = 2;
    /// Stop the transfer.
    pub const STOP: u8 = 3;
    /// Abort the transfer.
    pub const ABORT: u8 = 4;
}
/// RMPP flags (low 3 bits of the `rtime_flags` byte).
pub mod rmpp_flag {
    /// RMPP is active (the MAD is part of a transfer).
    pub const ACTIVE: u8 = 1;
    /// First segment.
    pub const FIRST: u8 = 2;
    /// Last segment.
    pub const LAST: u8 = 4;
}
/// RMPP status values used here.
pub mod rmpp_status {
    /// Total time too long (reassembly timed out).
    pub const T2L: u8 = 118;
    /// Bad segment number or first/last flags.
    pub const BAD_SEG: u8 = 120;
    /// Bad RMPP type.
    pub const BADT: u8 = 121;
    /// Unsupported version.
    pub const UNV: u8 = 125;
}

/// How long a reassembly may sit without progress (Linux waits 40 s).
pub const RMPP_RECV_TIMEOUT_NS: u64 = 40_000_000_000;
/// The largest message one reassembly may grow to; a sender announcing
/// more is aborted (bad input must not exhaust memory).
pub const RMPP_MAX_MESSAGE: usize = 4 << 20;
/// Reassemblies a port keeps at once.
pub const RMPP_MAX_RECVS: usize = 16;

/// `ib_is_mad_class_rmpp`.
#[doc(alias = "ib_is_mad_class_rmpp")]
pub fn is_mad_class_rmpp(mgmt_class: u8) -> bool {
    matches!(
        mgmt_class,
        class::SUBN_ADM | class::DEVICE_MGMT | class::DEVICE_ADM | class::BIS
    ) || (class::VENDOR_RANGE2_START..=class::VENDOR_RANGE2_END).contains(&mgmt_class)
}

/// `ib_get_mad_data_offset`: where a class's data starts (the class header
/// is repeated in every segment).
#[doc(alias = "ib_get_mad_data_offset")]
pub fn get_mad_data_offset(mgmt_class: u8) -> usize {
    match mgmt_class {
        class::SUBN_ADM => 56,
        class::DEVICE_MGMT | class::DEVICE_ADM | class::BIS => 64,
        c if (class::VENDOR_RANGE2_START..=class::VENDOR_RANGE2_END).contains(&c) => 40,
        _ => 24,
    }
}

/// The RMPP header fields of a MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmppHdr {
    /// Version.
    pub version: u8,
    /// Type.
    pub rtype: u8,
    /// Flags (ACTIVE, FIRST, LAST).
    pub flags: u8,
    /// Status.
    pub status: u8,
    /// Segment number (DATA) or last segment acknowledged (ACK).
    pub seg_num: u32,
    /// Payload length (DATA) or new window last (ACK).
    pub paylen_newwin: u32,
}

impl RmppHdr {
    /// Reads it from bytes 24..36.
    pub fn read(m: &Mad) -> RmppHdr {
        let b = &m.0;
        RmppHdr {
            version: b[24],
            rtype: b[25],
            flags: b[26] & 7,
            status: b[27],
            seg_num: u32::from_be_bytes([b[28], b[29], b[30], b[31]]),
            paylen_newwin: u32::from_be_bytes([b[32], b[33], b[34], b[35]]),
        }
    }
    /// Writes it into bytes 24..36 (the response-time bits of byte 26 are
    /// cleared).
    pub fn write(&self, m: &mut Mad) {
        let b = &mut m.0;
        b[24] = self.version;
        b[25] = self.rtype;
        b[26] = self.flags & 7;
        b[27] = self.status;
        b[28..32].copy_from_slice(&self.seg_num.to_be_bytes());
        b[32..36].copy_from_slice(&self.paylen_newwin.to_be_bytes());
    }
    /// True if the MAD takes part in an RMPP transfer.
    pub fn active(&self) -> bool {
        self.flags & rmpp_flag::ACTIVE != 0
    }
}

/// One transfer being put together (`struct mad_rmpp_recv`).
pub(crate) struct RmppRecv {
    agent: u32,
    tid: u64,
    src_qp: u32,
    slid: u16,
    mgmt_class: u8,
    /// The first segment's completion and MAD.
    first: Box<MadRecvWc>,
    /// The data of every segment so far, after the class header.
    data: Vec<u8>,
    /// The last segment received in order.
    seg_num: u32,
    /// The window's last segment as last acknowledged.
    newwin: u32,
    deadline: u64,
}

/// What the receive side made of a segment.
pub(crate) enum RmppResult {
    /// Not an RMPP transfer: deliver the MAD as it is.
    NotRmpp,
    /// Taken into a reassembly (or dropped, with the reason counted).
    Consumed,
    /// The transfer is complete.
    Complete(Box<MadRecvWc>),
    /// The sender aborted or stopped the transfer.
    Aborted,
}

fn window_size(cfg: &MadConfig) -> u32 {
    (cfg.recv_queue_size >> 3).max(1)
}

/// Sends an ACK (or, with `abort`, an ABORT with that status) for the
/// segment in `seg` back to its sender (`format_ack` / `nack_recv`).
fn send_ack(
    cx: &mut MadCtx<'_>,
    seg: &Mad,
    wc: &Wc,
    grh: Option<&Grh>,
    seg_num: u32,
    newwin: u32,
    abort: Option<u8>,
) {
    let hdr_len = get_mad_data_offset(seg.mgmt_class()).min(IB_MGMT_MAD_SIZE);
    let mut ack = Mad::default();
    ack.0[..hdr_len].copy_from_slice(&seg.0[..hdr_len]);
    ack.set_method(seg.method() ^ crate::mad::method::RESP);
    RmppHdr {
        version: IB_MGMT_RMPP_VERSION,
        rtype: if abort.is_some() {
            rmpp_type::ABORT
        } else {
            rmpp_type::ACK
        },
        flags: rmpp_flag::ACTIVE,
        status: abort.unwrap_or(0),
        seg_num,
        paylen_newwin: newwin,
    }
    .write(&mut ack);
    let Ok(ah) = crate::agent::init_ah_from_wc(cx.dev, cx.mp.port(), wc, grh) else {
        cx.mp.counters.send_errors += 1;
        return;
    };
    let mut buf = MadSendBuf::new(ack, ah, wc.src_qp);
    buf.remote_qkey = IB_QP_SET_QKEY;
    buf.pkey_index = wc.pkey_index;
    if crate::mad::send_response(cx, 1, buf).is_err() {
        cx.mp.counters.send_errors += 1;
    }
}

/// `ib_process_rmpp_recv_wc` for an agent with RMPP on: takes one segment.
#[doc(alias = "ib_process_rmpp_recv_wc")]
pub(crate) fn process_rmpp_recv(
    cx: &mut MadCtx<'_>,
    agent: u32,
    wc: &Wc,
    grh: Option<Grh>,
    mad: &Mad,
    send_id: Option<crate::mad::MadSendId>,
) -> RmppResult {
    let h = RmppHdr::read(mad);
    if !h.active() || !is_mad_class_rmpp(mad.mgmt_class()) {
        return RmppResult::NotRmpp;
    }
    cx.mp.counters.rmpp_segments += 1;
    let now = cx.clock.now_ns();
    if h.version != IB_MGMT_RMPP_VERSION {
        cx.mp.counters.rmpp_dropped += 1;
        send_ack(cx, mad, wc, grh.as_ref(), 0, 0, Some(rmpp_status::UNV));
        return RmppResult::Consumed;
    }
    let key = |r: &RmppRecv| {
        r.agent == agent
            && r.tid == mad.tid()
            && r.src_qp == wc.src_qp
            && r.slid == wc.slid
            && r.mgmt_class == mad.mgmt_class()
    };
    match h.rtype {
        rmpp_type::DATA => {}
        rmpp_type::STOP | rmpp_type::ABORT => {
            cx.mp.rmpp_recvs.retain(|r| !key(r));
            cx.mp.counters.rmpp_dropped += 1;
            return RmppResult::Aborted;
        }
        rmpp_type::ACK => {
            // Only for transfers this side sends, and it sends none.
            cx.mp.counters.rmpp_dropped += 1;
            return RmppResult::Consumed;
        }
        _ => {
            cx.mp.counters.rmpp_dropped += 1;
            send_ack(cx, mad, wc, grh.as_ref(), 0, 0, Some(rmpp_status::BADT));
            return RmppResult::Consumed;
        }
    }
    let hdr_len = get_mad_data_offset(mad.mgmt_class());
    let seg_data = &mad.0[hdr_len..];
    let first = h.flags & rmpp_flag::FIRST != 0;
    let last = h.flags & rmpp_flag::LAST != 0;
    let bad = h.status != 0 || (h.seg_num == 1) != first || h.seg_num == 0;
    if bad {
        cx.mp.rmpp_recvs.retain(|r| !key(r));
        cx.mp.counters.rmpp_dropped += 1;
        send_ack(cx, mad, wc, grh.as_ref(), 0, 0, Some(rmpp_status::BAD_SEG));
        return RmppResult::Consumed;
    }
    // The payload of the last segment: IB_MGMT_RMPP_DATA minus padding.
    let last_len = |paylen: u32| -> usize {
        let rmpp_data = IB_MGMT_MAD_SIZE - IB_MGMT_RMPP_HDR;
        let pad = rmpp_data.saturating_sub(paylen as usize);
        if pad > rmpp_data {
            seg_data.len()
        } else {
            seg_data.len().saturating_sub(pad)
        }
    };
    if first {
        // start_rmpp: a new transfer replaces an old one with the same key.
        cx.mp.rmpp_recvs.retain(|r| !key(r));
        if (h.paylen_newwin as usize) > RMPP_MAX_MESSAGE {
            cx.mp.counters.rmpp_dropped += 1;
            send_ack(cx, mad, wc, grh.as_ref(), 0, 0, Some(rmpp_status::BAD_SEG));
            return RmppResult::Consumed;
        }
        let rw = Box::new(MadRecvWc {
            wc: *wc,
            grh,
            mad: mad.clone(),
            port: cx.mp.port(),
            send_id,
            rmpp_data: None,
        });
        if last {
            let mut rw = rw;
            rw.rmpp_data = Some(seg_data[..last_len(h.paylen_newwin)].to_vec());
            cx.mp.counters.rmpp_completed += 1;
            send_ack(cx, mad, wc, grh.as_ref(), 1, 1, None);
            return RmppResult::Complete(rw);
        }
        if cx.mp.rmpp_recvs.len() >= RMPP_MAX_RECVS {
            cx.mp.counters.rmpp_dropped += 1;
            return RmppResult::Consumed;
        }
        let newwin = 1 + window_size(cx.cfg);
        cx.mp.rmpp_recvs.push(RmppRecv {
            agent,
            tid: mad.tid(),
            src_qp: wc.src_qp,
            slid: wc.slid,
            mgmt_class: mad.mgmt_class(),
            first: rw,
            data: seg_data.to_vec(),
            seg_num: 1,
            newwin,
            deadline: now.saturating_add(RMPP_RECV_TIMEOUT_NS),
        });
        send_ack(cx, mad, wc, grh.as_ref(), 1, newwin, None);
        return RmppResult::Consumed;
    }
    // continue_rmpp
    let Some(i) = cx.mp.rmpp_recvs.iter().position(key) else {
        cx.mp.counters.rmpp_dropped += 1;
        return RmppResult::Consumed;
    };
    let (seg_num, newwin) = (cx.mp.rmpp_recvs[i].seg_num, cx.mp.rmpp_recvs[i].newwin);
    if h.seg_num <= seg_num {
        // A duplicate: the sender missed our ACK; acknowledge again.
        send_ack(cx, mad, wc, grh.as_ref(), seg_num, newwin, None);
        return RmppResult::Consumed;
    }
    if h.seg_num != seg_num + 1 || h.seg_num > newwin {
        // Out of order or beyond the window: the sender resends after its
        // timeout (Linux keeps out-of-order segments; this port does not).
        cx.mp.counters.rmpp_dropped += 1;
        return RmppResult::Consumed;
    }
    let r = &mut cx.mp.rmpp_recvs[i];
    let take = if last {
        last_len(h.paylen_newwin)
    } else {
        seg_data.len()
    };
    if r.data.len() + take > RMPP_MAX_MESSAGE {
        cx.mp.rmpp_recvs.remove(i);
        cx.mp.counters.rmpp_dropped += 1;
        send_ack(cx, mad, wc, grh.as_ref(), 0, 0, Some(rmpp_status::BAD_SEG));
        return RmppResult::Consumed;
    }
    r.data.extend_from_slice(&seg_data[..take]);
    r.seg_num = h.seg_num;
    r.deadline = now.saturating_add(RMPP_RECV_TIMEOUT_NS);
    if last {
        let r = cx.mp.rmpp_recvs.remove(i);
        let (seg_num, newwin) = (r.seg_num, r.newwin);
        let mut rw = r.first;
        rw.rmpp_data = Some(r.data);
        cx.mp.counters.rmpp_completed += 1;
        send_ack(cx, mad, wc, grh.as_ref(), seg_num, newwin, None);
        return RmppResult::Complete(rw);
    }
    if r.seg_num == r.newwin {
        r.newwin += window_size(cx.cfg);
        let (seg_num, newwin) = (r.seg_num, r.newwin);
        send_ack(cx, mad, wc, grh.as_ref(), seg_num, newwin, None);
    }
    RmppResult::Consumed
}

/// Drops the reassemblies that made no progress for
/// [`RMPP_RECV_TIMEOUT_NS`] (Linux's `recv_timeout_handler`).
pub(crate) fn rmpp_timeouts(mp: &mut MadPort, now: u64) -> usize {
    let before = mp.rmpp_recvs.len();
    mp.rmpp_recvs.retain(|r| r.deadline > now);
    let n = before - mp.rmpp_recvs.len();
    mp.counters.rmpp_dropped += n as u64;
    n
}

/// Drops the reassemblies of an agent that goes away.
pub(crate) fn rmpp_forget_agent(mp: &mut MadPort, agent: u32) {
    mp.rmpp_recvs.retain(|r| r.agent != agent);
}
