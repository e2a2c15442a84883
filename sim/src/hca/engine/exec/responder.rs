//! The responder within the HCA.
//!
//! A message delivered to a QP of this card (from its own send queue, or
//! reassembled from the wire) lands in a receive WQE or an SRQ's, or in memory for
//! RDMA WRITE/READ and atomics, with the access checks, the RNR answer and the
//! responder's errors.

use super::*;

/// A receive WQE taken (not yet consumed).
pub(in crate::hca::engine) struct Rwqe {
    /// RQ counter or SRQ index (the CQE's WQE counter).
    pub(in crate::hca::engine) counter: u16,
    /// Scatter entries (in the caller's scratch).
    pub(in crate::hca::engine) n: usize,
    /// SRQ: index of the next free WQE.
    pub(in crate::hca::engine) srq_next: Option<u16>,
    /// The scatter list is one the card refuses
    /// ([`wqe::scatter_malformed`]).
    pub(in crate::hca::engine) malformed: bool,
}

/// Peeks at the next receive WQE of `q` (its RQ or SRQ); its scatter list
/// lands in `sc.sges`.
pub(in crate::hca::engine) fn rq_peek(hca: &mut Hca, q: &QpEng, sc: &mut Scratch) -> Option<Rwqe> {
    let Scratch {
        sges, rbuf: buf, ..
    } = sc;
    if let Some(srqn) = q.srq {
        let s = srq_get(hca, srqn)?;
        let (db, consumed, head, shift, cnt) = (s.db_rec, s.consumed, s.head, s.shift, s.cnt);
        let (pages, page_shift) = (s.pages.clone(), s.page_shift);
        let mut d = [0u8; 4];
        hca.dma_read(db, &mut d).ok()?;
        let counter = (u32::from_be_bytes(d) & 0xffff) as u16;
        if counter == consumed {
            return None;
        }
        let stride = (1usize << shift).min(RWQE_MAX);
        let off = u64::from(u32::from(head) & (cnt - 1)) << shift;
        let pa = pages.get((off >> page_shift) as usize)? + (off & ((1 << page_shift) - 1));
        hca.dma_read(pa, &mut buf[..stride]).ok()?;
        let next = get16(&buf[..], 2);
        let n = wqe::parse_scatter(&buf[16..stride], sges);
        return Some(Rwqe {
            counter: head,
            n,
            srq_next: Some(next),
            malformed: wqe::scatter_malformed(&buf[16..stride]),
        });
    }
    if q.rq_cnt == 0 {
        return None;
    }
    let head = rq_head(hca, q)?;
    if head == q.rq_ci {
        return None;
    }
    let stride = (1usize << q.rq_shift).min(RWQE_MAX);
    let pa = q.rq_wqe(u32::from(q.rq_ci))?;
    hca.dma_read(pa, &mut buf[..stride]).ok()?;
    let n = wqe::parse_scatter(&buf[..stride], sges);
    Some(Rwqe {
        counter: q.rq_ci,
        n,
        srq_next: None,
        malformed: wqe::scatter_malformed(&buf[..stride]),
    })
}

/// The driver's RQ producer counter (the doorbell record's low 16 bits),
/// `None` if the record cannot be read. A counter more WQEs ahead of the
/// card's consumer counter than the RQ holds is the driver's mistake
/// (a driver posts only into free slots): recorded once until the counter
/// is back within the ring; the card goes on as the counter says, taking
/// the ring's WQEs again as it wraps, and a QP in error flushes that many
/// (so a small CQ overruns).
pub(in crate::hca::engine) fn rq_head(hca: &mut Hca, q: &QpEng) -> Option<u16> {
    let mut d = [0u8; 4];
    hca.dma_read(q.db_rec, &mut d).ok()?;
    let head = (u32::from_be_bytes(d) & 0xffff) as u16;
    let ahead = head.wrapping_sub(q.rq_ci);
    let over = u32::from(ahead) > q.rq_cnt;
    let Some(live) = hca.engine.qps.get_mut(&q.qpn) else {
        return Some(head);
    };
    let first = over && !live.rq_overclaim;
    live.rq_overclaim = over;
    if first {
        hca.violation(format!(
            "RQ doorbell record of QP {:#x} claims {ahead} receive WQEs posted \
             (counter {head}, consumer {}) in an RQ of {}",
            q.qpn, q.rq_ci, q.rq_cnt
        ));
    }
    Some(head)
}

/// Consumes the receive WQE `r` peeked from `qpn`'s queue.
pub(in crate::hca::engine) fn rq_commit(hca: &mut Hca, qpn: u32, r: &Rwqe) {
    let Some(q) = hca.engine.qps.get_mut(&qpn) else {
        return;
    };
    match (q.srq, r.srq_next) {
        (Some(srqn), Some(next)) => {
            let Some(s) = hca.engine.srqs.get_mut(&srqn) else {
                return;
            };
            s.head = next;
            s.consumed = s.consumed.wrapping_add(1);
            let db = s.db_rec;
            let consumed = s.consumed;
            let limit = hca.srqs.get(&srqn).map_or(0, |x| x.limit);
            if limit > 0 {
                let mut d = [0u8; 4];
                if hca.dma_read(db, &mut d).is_ok() {
                    let counter = (u32::from_be_bytes(d) & 0xffff) as u16;
                    if counter.wrapping_sub(consumed) < limit {
                        if let Some(x) = hca.srqs.get_mut(&srqn) {
                            x.limit = 0;
                        }
                        hca.post_async(Event::Srq {
                            kind: eqe::SRQ_LIMIT,
                            srqn,
                        });
                    }
                }
            }
        }
        _ => q.rq_ci = q.rq_ci.wrapping_add(1),
    }
}

fn srq_get(hca: &mut Hca, srqn: u32) -> Option<&mut crate::hca::engine::SrqEng> {
    if !hca.engine.srqs.contains_key(&srqn) {
        let s = *hca.srqs.get(&srqn)?;
        let va = hca
            .geo()
            .ok()?
            .va(crate::hca::icm::Table::Srqc, u64::from(srqn));
        let mut b = [0u8; crate::hca::ctx::srqc::SIZE];
        hca.icm_read(va, &mut b).ok()?;
        let c = crate::hca::ctx::SrqCtx::decode(&b);
        let shift = u32::from(c.log_stride) + 4;
        let cnt = 1u32 << s.log_size;
        let pages = hca
            .mtt_pages(c.mtt_base, c.log_page_size, u64::from(cnt) << shift)
            .ok()?
            .into();
        hca.engine.srqs.insert(
            srqn,
            crate::hca::engine::SrqEng {
                cnt,
                shift,
                pages,
                page_shift: 12 + u32::from(c.log_page_size.min(20)),
                db_rec: c.db_rec_addr,
                pd: c.pd,
                head: 0,
                consumed: 0,
            },
        );
    }
    hca.engine.srqs.get_mut(&srqn)
}

/// Responder-side failure: the responder QP's receive WQE (if any) gets
/// `local` and the QP goes to ERR with `event`; an RC requester gets `nak`.
pub(in crate::hca::engine) fn responder_error(
    hca: &mut Hca,
    d: &QpEng,
    r: Option<&Rwqe>,
    local: Option<Syndrome>,
    event: u8,
    nak: Syndrome,
) -> Resp {
    if let (Some(r), Some(s)) = (r, local) {
        rq_commit(hca, d.qpn, r);
        let c = Cqe {
            qpn: d.qpn,
            wqe_counter: r.counter,
            error: Some(s),
            ..Cqe::default()
        };
        cq::push(hca, d.rcq, &c);
    }
    hca.post_async(Event::Qp {
        kind: event,
        qpn: d.qpn,
    });
    enter_error(hca, d.qpn, None);
    if d.st == st::RC {
        Resp::Nak(nak)
    } else {
        Resp::Ack
    }
}

/// A receive WQE the card cannot use (IBTA 9.9.3.1, class A responder
/// error "malformed WQE"): the WQE completes with a local QP operation
/// error, the QP goes to ERR with a work queue catastrophic error, and an
/// RC requester gets the Remote Operational Error NAK (REM_OP_ERR).
pub(in crate::hca::engine) fn malformed_rwqe(hca: &mut Hca, d: &QpEng, r: &Rwqe) -> Resp {
    hca.violation(format!(
        "QP {:#x} receive WQE {}: scatter entry with the inline bit (receive WQEs take data \
         pointers only)",
        d.qpn, r.counter
    ));
    responder_error(
        hca,
        d,
        Some(r),
        Some(Syndrome::LocalQpOp),
        eqe::WQ_CATAS_ERROR,
        Syndrome::RemoteOp,
    )
}

/// Delivers `m` to its destination QP on this HCA.
pub(in crate::hca::engine) fn respond(hca: &mut Hca, m: &Msg, src: &[Seg], inline: &[u8]) -> Resp {
    let Some(d) = hca.engine.qps.get(&m.dst_qpn).map(QpEng::for_send) else {
        return Resp::Silent;
    };
    if !matches!(
        qp_state(hca, d.qpn),
        Some(QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqer)
    ) || d.st != m.st
        || d.port != m.port
    {
        return Resp::Silent;
    }
    // Connected service: only the QP's remote port (its LID with the path
    // bits) may send to it, looped back or not (RoCE has no LIDs).
    if matches!(d.st, st::RC | st::UC) && m.eth.is_none() && m.slid != d.rlid {
        hca.engine.stats.slid_drops += 1;
        return Resp::Silent;
    }
    let pi = hca.port_index(u32::from(d.port)).unwrap_or(0);
    if !pkey_match(m.pkey, pkey_at(hca, d.port, d.pkey_index)) {
        super::pkey_violation(hca, pi, m, d.qpn);
        return Resp::Silent;
    }
    // A GRH whose DGID is not this port's is not for us (IBTA 9.6.1.1):
    // silently dropped.
    if d.st == st::UD
        && let Some(g) = &m.grh
        && !dgid_is_ours(hca, d.port, g)
        && !crate::hca::engine::mcast::steered(m)
    {
        return Resp::Silent;
    }
    if d.st == st::UD && m.qkey != d.qkey {
        let p = &mut hca.ports[pi];
        p.qkey_violations = p.qkey_violations.saturating_add(1);
        return Resp::Silent;
    }
    if let Some(dq) = hca.engine.qps.get_mut(&d.qpn) {
        dq.rq_psn = (dq.rq_psn + m.npkts) & 0xff_ffff;
    }
    match m.kind {
        Kind::Send => receive(hca, &d, m, src, inline, false),
        Kind::Write => {
            if !d.rwe {
                return responder_error(
                    hca,
                    &d,
                    None,
                    None,
                    eqe::WQ_ACCESS_ERROR,
                    Syndrome::RemoteAccess,
                );
            }
            let r = if m.imm.is_some() {
                let mut sc = take_scratch(&mut hca.engine.rx_scratch);
                let r = rq_peek(hca, &d, &mut sc);
                hca.engine.rx_scratch = Some(sc);
                match r {
                    Some(r) if r.malformed => return malformed_rwqe(hca, &d, &r),
                    Some(r) => Some(r),
                    None => return rnr(&d),
                }
            } else {
                None
            };
            if m.len > 0 {
                let xl = match xlate::check_qp(
                    hca,
                    xlate::KeyUse::remote(&d, m.rkey, Access::RemoteWrite, m.raddr, m.len),
                ) {
                    Ok(x) => x,
                    Err(_) => {
                        return responder_error(
                            hca,
                            &d,
                            r.as_ref(),
                            Some(Syndrome::LocalAccess),
                            eqe::WQ_ACCESS_ERROR,
                            Syndrome::RemoteAccess,
                        );
                    }
                };
                let dst = Seg {
                    addr: m.raddr,
                    len: m.len,
                    xl: Some(xl),
                };
                if xlate::copy(hca, src, inline, &[dst], 0, m.len).is_err() {
                    return responder_error(
                        hca,
                        &d,
                        r.as_ref(),
                        Some(Syndrome::LocalAccess),
                        eqe::WQ_ACCESS_ERROR,
                        Syndrome::RemoteOp,
                    );
                }
            }
            if let Some(r) = r {
                rq_commit(hca, d.qpn, &r);
                let c = Cqe {
                    qpn: d.qpn,
                    opcode: rcv_op::RDMA_WRITE_IMM,
                    byte_cnt: m.len as u32,
                    imm: m.imm.unwrap_or(0),
                    wqe_counter: r.counter,
                    solicited: m.se,
                    ..Cqe::default()
                };
                cq::push(hca, d.rcq, &c);
            }
            Resp::Ack
        }
        Kind::Read => {
            if !d.rre {
                return responder_error(
                    hca,
                    &d,
                    None,
                    None,
                    eqe::WQ_ACCESS_ERROR,
                    Syndrome::RemoteAccess,
                );
            }
            if m.len == 0 {
                return Resp::Read(Seg::default());
            }
            match xlate::check_qp(
                hca,
                xlate::KeyUse::remote(&d, m.rkey, Access::RemoteRead, m.raddr, m.len),
            ) {
                Ok(xl) => Resp::Read(Seg {
                    addr: m.raddr,
                    len: m.len,
                    xl: Some(xl),
                }),
                Err(_) => responder_error(
                    hca,
                    &d,
                    None,
                    None,
                    eqe::WQ_ACCESS_ERROR,
                    Syndrome::RemoteAccess,
                ),
            }
        }
        Kind::CmpSwap | Kind::FetchAdd => {
            if !d.rae {
                return responder_error(
                    hca,
                    &d,
                    None,
                    None,
                    eqe::WQ_ACCESS_ERROR,
                    Syndrome::RemoteAccess,
                );
            }
            if !m.raddr.is_multiple_of(8) {
                return responder_error(
                    hca,
                    &d,
                    None,
                    None,
                    eqe::WQ_INVAL_REQ_ERROR,
                    Syndrome::RemoteInvalidReq,
                );
            }
            let xl = match xlate::check_qp(
                hca,
                xlate::KeyUse::remote(&d, m.rkey, Access::RemoteAtomic, m.raddr, 8),
            ) {
                Ok(x) => x,
                Err(_) => {
                    return responder_error(
                        hca,
                        &d,
                        None,
                        None,
                        eqe::WQ_ACCESS_ERROR,
                        Syndrome::RemoteAccess,
                    );
                }
            };
            let seg = [Seg {
                addr: m.raddr,
                len: 8,
                xl: Some(xl),
            }];
            let mut b = [0u8; 8];
            if xlate::gather(hca, &seg, &[], 0, &mut b).is_err() {
                return Resp::Nak(Syndrome::RemoteOp);
            }
            let orig = u64::from_be_bytes(b);
            let new = match m.kind {
                Kind::CmpSwap if orig == m.cmp => m.swap,
                Kind::CmpSwap => orig,
                _ => orig.wrapping_add(m.swap),
            };
            if new != orig && xlate::scatter(hca, &seg, 0, &new.to_be_bytes()).is_err() {
                return Resp::Nak(Syndrome::RemoteOp);
            }
            Resp::Atomic(orig)
        }
    }
}

fn rnr(d: &QpEng) -> Resp {
    if d.st == st::RC {
        Resp::Rnr(d.min_rnr_timer)
    } else {
        Resp::Silent
    }
}

/// A SEND (or a MAD on QP0/QP1) arriving at `d`.
pub(super) fn receive(
    hca: &mut Hca,
    d: &QpEng,
    m: &Msg,
    src: &[Seg],
    inline: &[u8],
    mad: bool,
) -> Resp {
    let mut sc = take_scratch(&mut hca.engine.rx_scratch);
    let r = receive_in(hca, d, m, src, inline, mad, &mut sc);
    hca.engine.rx_scratch = Some(sc);
    r
}

fn receive_in(
    hca: &mut Hca,
    d: &QpEng,
    m: &Msg,
    src: &[Seg],
    inline: &[u8],
    mad: bool,
    sc: &mut Scratch,
) -> Resp {
    let Some(r) = rq_peek(hca, d, sc) else {
        return rnr(d);
    };
    if r.malformed {
        return malformed_rwqe(hca, d, &r);
    }
    // SEND with Invalidate: the key is checked before anything lands
    // (IBTA 9.4.1.1, 10.6.7.2; the model's choice of status: crate::hca::engine::mw).
    if let Some(k) = m.inv
        && crate::hca::engine::mw::invalidate(hca, k, d.qpn, d.pd, true, false).is_err()
    {
        return responder_error(
            hca,
            d,
            Some(&r),
            Some(Syndrome::LocalAccess),
            eqe::WQ_INVAL_REQ_ERROR,
            Syndrome::RemoteInvalidReq,
        );
    }
    let pd = match d.srq {
        Some(s) => hca.engine.srqs.get(&s).map_or(d.pd, |x| x.pd),
        None => d.pd,
    };
    let dq = QpEng { pd, ..d.clone() };
    let datagram = matches!(d.st, st::UD | st::MLX);
    let skip = if datagram { 40u64 } else { 0 };
    let need = skip + m.len;
    // The scatter list is checked over the bytes the message uses.
    let Scratch { sges, segs, .. } = sc;
    let mut room = 0u64;
    let mut n = 0;
    let mut bad = false;
    for s in &sges[..r.n] {
        let Sge::Ptr { len, lkey, addr } = *s else {
            continue;
        };
        if room >= need {
            break;
        }
        let used = len.min(need - room);
        match xlate::check(hca, lkey, dq.pd, Access::LocalWrite, addr, used, dq.rlkey) {
            Ok(xl) => {
                segs[n] = Seg {
                    addr,
                    len: used,
                    xl: Some(xl),
                };
                n += 1;
                room += used;
            }
            Err(_) => {
                bad = true;
                break;
            }
        }
    }
    if bad {
        return responder_error(
            hca,
            d,
            Some(&r),
            Some(Syndrome::LocalProt),
            eqe::WQ_ACCESS_ERROR,
            Syndrome::RemoteOp,
        );
    }
    if room < need {
        return responder_error(
            hca,
            d,
            Some(&r),
            Some(Syndrome::LocalLength),
            eqe::WQ_INVAL_REQ_ERROR,
            Syndrome::RemoteInvalidReq,
        );
    }
    // Only datagram receives get the GRH (40 bytes at the head of the
    // buffer); an RC/UC receive gets the payload alone even though every
    // RoCE packet (and a globally routed IB one) carries a GRH.
    if let Some(g) = m.grh.as_ref().filter(|_| datagram)
        && xlate::scatter(hca, &segs[..n], 0, g).is_err()
    {
        bad = true;
    }
    if bad || xlate::copy(hca, src, inline, &segs[..n], skip, m.len).is_err() {
        return responder_error(
            hca,
            d,
            Some(&r),
            Some(Syndrome::LocalProt),
            eqe::WQ_ACCESS_ERROR,
            Syndrome::RemoteOp,
        );
    }
    if let Some(k) = m.inv {
        let _ = crate::hca::engine::mw::invalidate(hca, k, d.qpn, d.pd, true, true);
    }
    rq_commit(hca, d.qpn, &r);
    hca.engine.stats.received += 1;
    let pkey_index = if datagram {
        hca.port_index(u32::from(d.port))
            .and_then(|i| {
                hca.ports[i]
                    .pkeys
                    .iter()
                    .position(|&p| pkey_match(p, m.pkey))
            })
            .unwrap_or(0) as u32
    } else {
        0
    };
    let _ = mad;
    let c = Cqe {
        qpn: d.qpn,
        opcode: if m.inv.is_some() {
            rcv_op::SEND_INVAL
        } else if m.imm.is_some() {
            rcv_op::SEND_IMM
        } else {
            rcv_op::SEND
        },
        byte_cnt: need.min(u64::from(u32::MAX)) as u32,
        imm: m.inv.or(m.imm).unwrap_or(pkey_index),
        grh: datagram && m.grh.is_some(),
        path_bits: if datagram {
            (m.dlid & 0x7f) as u8 & lmc_mask(hca, d.port)
        } else {
            0
        },
        rqpn: if datagram { m.src_qpn } else { 0 },
        sl: if datagram { m.sl } else { 0 },
        slid: if datagram { m.slid } else { 0 },
        wqe_counter: r.counter,
        solicited: m.se,
        // RoCE datagrams: the source MAC and the tag (mlx4_ib's
        // `IB_WC_WITH_SMAC`, `IB_WC_WITH_VLAN`).
        eth: m.eth.filter(|_| datagram).map(|e| cq::CqeEth {
            vlan: e.vlan,
            smac: Some(e.src),
            ..cq::CqeEth::default()
        }),
        ..Cqe::default()
    };
    cq::push(hca, d.rcq, &c);
    Resp::Ack
}

pub(in crate::hca::engine) fn lmc_mask(hca: &Hca, port: u8) -> u8 {
    port_state(hca, port).map_or(0, |(_, _, lmc)| ((1u16 << lmc.min(7)) - 1) as u8)
}
