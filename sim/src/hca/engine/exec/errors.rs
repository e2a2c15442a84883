//! A QP's error state: entering it (SQER or ERR, with the async event),
//! and the flushes that complete every outstanding WQE with WR_FLUSH_ERR.

use super::*;

/// Moves `qpn` to ERR (or SQER for a send-side error on UD/UC/MLX) and
/// flushes.
pub fn enter_error(hca: &mut Hca, qpn: u32, send_error: Option<Syndrome>) {
    let Some(st_) = hca.engine.qps.get(&qpn).map(|q| q.st) else {
        return;
    };
    let to = if send_error.is_some() && st_ != st::RC {
        QpState::Sqer
    } else {
        QpState::Err
    };
    let was = qp_state(hca, qpn);
    if let Some(r) = hca.qps.get_mut(&qpn) {
        if r.state == QpState::Err {
            // Already there; only flush.
        } else {
            r.state = to;
        }
    }
    if let Some(q) = hca.engine.qps.get_mut(&qpn) {
        q.wait = None;
        q.retrying = false;
    }
    if let Some(w) = hca.engine.windows.get_mut(&qpn) {
        // Every message in flight is flushed with the rest of the SQ.
        w.txq.clear();
        w.resend = None;
        w.ack_due = None;
        w.seq_nak = None;
        w.drain_event = false;
    }
    flush_sq(hca, qpn);
    if qp_state(hca, qpn) == Some(QpState::Err) {
        flush_rq(hca, qpn);
        let srq = hca.engine.qps.get(&qpn).and_then(|q| q.srq);
        if srq.is_some() && was != Some(QpState::Err) {
            hca.post_async(Event::Qp {
                kind: eqe::SRQ_QP_LAST_WQE,
                qpn,
            });
        }
        watch(hca, qpn);
    }
}

/// Completes every hardware-owned SQ WQE with WR_FLUSH_ERR.
pub fn flush_sq(hca: &mut Hca, qpn: u32) -> u32 {
    let Some(q) = hca.engine.qps.get(&qpn) else {
        return 0;
    };
    let (cnt, scq) = (q.sq_cnt, q.scq);
    let mut n = 0;
    for _ in 0..cnt {
        let Some(q) = hca.engine.qps.get(&qpn) else {
            break;
        };
        let idx = q.sq_ci;
        let parity = idx & q.sq_cnt != 0;
        let (raw, stride) = (q.raw_eth, 1u32 << q.sq_shift);
        let Some(addr) = q.sq_wqe(idx) else { break };
        let mut b = [0u8; 16];
        if hca.dma_read(addr, &mut b).is_err()
            || (b[0] & 0x80 != 0) != parity
            || super::wqe::unwritten(&b)
        {
            break;
        }
        // A raw Ethernet WQE spans its DS count's basic blocks.
        let bbs = if raw {
            (u32::from(b[7] & 0x3f) * 16).div_ceil(stride).clamp(1, cnt)
        } else {
            1
        };
        super::advance_by(hca, qpn, bbs);
        let c = Cqe {
            qpn,
            send: true,
            wqe_counter: idx as u16,
            error: Some(Syndrome::WrFlush),
            ..Cqe::default()
        };
        cq::push(hca, scq, &c);
        n += 1;
    }
    hca.engine.stats.flushed += u64::from(n);
    n
}

/// Completes every posted receive WQE (own RQ only) with WR_FLUSH_ERR.
pub fn flush_rq(hca: &mut Hca, qpn: u32) -> u32 {
    let Some(q) = hca.engine.qps.get(&qpn).cloned() else {
        return 0;
    };
    if q.srq.is_some() || q.rq_cnt == 0 {
        return 0;
    }
    let Some(head) = super::responder::rq_head(hca, &q) else {
        return 0;
    };
    let pending = head.wrapping_sub(q.rq_ci).min(q.rq_cnt as u16);
    for k in 0..pending {
        let c = Cqe {
            qpn,
            wqe_counter: q.rq_ci.wrapping_add(k),
            error: Some(Syndrome::WrFlush),
            ..Cqe::default()
        };
        cq::push(hca, q.rcq, &c);
    }
    if let Some(qm) = hca.engine.qps.get_mut(&qpn) {
        qm.rq_ci = q.rq_ci.wrapping_add(pending);
    }
    hca.engine.stats.flushed += u64::from(pending);
    u32::from(pending)
}
