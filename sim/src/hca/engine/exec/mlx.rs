//! The MLX transport of QP0 and QP1: the UD header the driver builds in
//! the WQE's inline segment, parsed and checked, the MAD sent on it, and
//! the MADs delivered to the special QPs.
//!
//! On an Ethernet port (RoCE) QP1's WQE holds the whole frame but its FCS:
//! the Ethernet header, the GRH, BTH and DETH the driver built (Linux
//! `build_mlx_header` for an Ethernet port), the MAD, and the ICRC's room,
//! which the card fills; there is no QP0.

use super::*;

/// The UD header the driver built inside an MLX WQE.
#[derive(Debug, Clone, Copy)]
struct UdHeader {
    vl: u8,
    sl: u8,
    dlid: u16,
    slid: u16,
    pkt_words: u16,
    grh: Option<[u8; 40]>,
    se: bool,
    pad: u8,
    pkey: u16,
    dqpn: u32,
    psn: u32,
    qkey: u32,
    sqpn: u32,
    imm: Option<u32>,
    len: usize,
}

fn parse_ud_header(h: &[u8]) -> Result<UdHeader, &'static str> {
    if h.len() < 8 {
        return Err("shorter than an LRH");
    }
    if h[0] & 0xf != 0 {
        return Err("LRH LVer not 0");
    }
    let lnh = h[1] & 3;
    let mut off = 8;
    let grh = match lnh {
        2 => None,
        3 => {
            let g: [u8; 40] = h
                .get(8..48)
                .ok_or("GRH cut short")?
                .try_into()
                .map_err(|_| "GRH")?;
            off += 40;
            Some(g)
        }
        _ => return Err("LRH LNH is neither IBA local nor IBA global"),
    };
    let bth = h.get(off..off + 12).ok_or("BTH cut short")?;
    let opcode = bth[0];
    if opcode != 0x64 && opcode != 0x65 {
        return Err("BTH opcode is not UD SEND only (with immediate)");
    }
    if bth[1] & 0xf != 0 {
        return Err("BTH TVer not 0");
    }
    off += 12;
    let deth = h.get(off..off + 8).ok_or("DETH cut short")?;
    off += 8;
    let imm = if opcode == 0x65 {
        let v = get32(h.get(off..off + 4).ok_or("ImmDt cut short")?, 0);
        off += 4;
        Some(v)
    } else {
        None
    };
    Ok(UdHeader {
        vl: h[0] >> 4,
        sl: h[1] >> 4,
        dlid: get16(h, 2),
        pkt_words: get16(h, 4) & 0x7ff,
        slid: get16(h, 6),
        grh,
        se: bth[1] & 0x80 != 0,
        pad: (bth[1] >> 4) & 3,
        pkey: get16(bth, 2),
        dqpn: get32(bth, 4) & 0xff_ffff,
        psn: get32(bth, 8) & 0xff_ffff,
        qkey: get32(deth, 0),
        sqpn: get32(deth, 4) & 0xff_ffff,
        imm,
        len: off,
    })
}

/// QP1 on an Ethernet port: the frame the WQE gathers (its last four
/// bytes the ICRC's room) is checked as a RoCE UD packet from QP1, its
/// ICRC filled in, and sent, or delivered inside the card (force loopback,
/// or a destination that is this port).
fn mlx_roce_send(hca: &mut Hca, q: &QpEng, wqe: &[u8]) -> Outcome {
    use crate::fabric::packet;
    let qpn = q.qpn;
    let bad = |hca: &mut Hca, why: &str| {
        hca.violation(format!("QP {qpn:#x} MLX send on an Ethernet port: {why}"));
        Outcome::Fail(Syndrome::LocalQpOp)
    };
    if q.special == Some(true) {
        return bad(hca, "QP0 on an Ethernet port (RoCE has no SMPs)");
    }
    let mlx = MlxCtrl::decode(&wqe[..16]);
    let mut sges = [Sge::None; MAX_SEGS];
    let n = match wqe::parse_gather(wqe, 16, wqe.len(), &mut sges) {
        Ok(n) => n,
        Err(e) => return bad(hca, &format!("malformed ({e:?})")),
    };
    let mut segs = [Seg::default(); MAX_SEGS];
    let mut len = 0u64;
    for (k, s) in sges[..n].iter().enumerate() {
        segs[k] = match *s {
            Sge::None => Seg::default(),
            Sge::Inline { off, len } => Seg {
                addr: u64::from(off),
                len: u64::from(len),
                xl: None,
            },
            Sge::Ptr { len, lkey, addr } => {
                match xlate::check(hca, lkey, q.pd, Access::LocalRead, addr, len, q.rlkey) {
                    Ok(xl) => Seg {
                        addr,
                        len,
                        xl: Some(xl),
                    },
                    Err(_) => return Outcome::Fail(Syndrome::LocalProt),
                }
            }
        };
        len += segs[k].len;
    }
    if len > 8192 {
        return bad(hca, "the frame is longer than a MAD packet can be");
    }
    let mut frame = vec![0u8; len as usize];
    if xlate::gather(hca, &segs[..n], wqe, 0, &mut frame).is_err() {
        return Outcome::Fail(Syndrome::LocalProt);
    }
    frame.extend_from_slice(&[0; packet::FCS_LEN]);
    let p = match packet::parse_roce(&frame) {
        Ok(p) => p,
        Err(e) => return bad(hca, &format!("not a RoCE packet: {e}")),
    };
    let h = p.hdr;
    let (Some(e), Some(g), Some(d)) = (h.eth, h.grh, h.deth) else {
        return bad(hca, "not a UD packet with a GRH");
    };
    if !matches!(h.bth.opcode, 0x64 | 0x65) {
        return bad(hca, "BTH opcode is not UD SEND only (with immediate)");
    }
    if d.src_qp != 1 {
        return bad(hca, "DETH source QP is not QP1");
    }
    if h.bth.dest_qp == 1 && d.qkey != GSI_QKEY {
        return bad(hca, "a GMP to QP1 without the Q_Key 0x80010000");
    }
    let port = q.port;
    let Some(pi) = hca.port_index(u32::from(port)) else {
        return Outcome::Fail(Syndrome::LocalQpOp);
    };
    if !hca.ports[pi]
        .pkeys
        .iter()
        .any(|&k| k != 0 && k == h.bth.pkey)
    {
        return bad(hca, "BTH P_Key is not in the port's P_Key table");
    }
    if hca.ports[pi].eth.gid_index(&g.sgid).is_none() {
        return bad(hca, "the source GID is not in the port's RoCE GID table");
    }
    // The ICRC's room: the card fills it.
    let n = frame.len() - packet::FCS_LEN;
    let icrc = packet::roce_icrc(&frame[e.len()..n - packet::ICRC_LEN]);
    frame[n - packet::ICRC_LEN..n].copy_from_slice(&icrc.to_le_bytes());
    frame.truncate(n);
    packet::finish_frame(&mut frame, false);
    let pe = &hca.ports[pi].eth;
    let to_self = pe.owns_mac(&e.dst) && pe.gid_index(&g.dgid).is_some();
    crate::hca::engine::eth::send_frame(hca, port, frame, mlx.force_lb || to_self);
    Outcome::Done {
        byte_cnt: p.payload_len as u32,
    }
}

/// A send on QP0/QP1: the header is the driver's, checked here.
pub(super) fn mlx_send(hca: &mut Hca, q: &QpEng, ctrl: &Ctrl, wqe: &[u8]) -> Outcome {
    let qpn = q.qpn;
    if crate::hca::engine::eth::port_is_eth(hca, q.port) {
        return mlx_roce_send(hca, q, wqe);
    }
    let mlx = MlxCtrl::decode(&wqe[..16]);
    let mut sges = [Sge::None; MAX_SEGS];
    let n = match wqe::parse_gather(wqe, 16, wqe.len(), &mut sges) {
        Ok(n) => n,
        Err(e) => {
            hca.violation(format!("QP {qpn:#x} MLX WQE malformed ({e:?})"));
            return Outcome::Fail(Syndrome::LocalQpOp);
        }
    };
    // Leading inline segments: the header; the last one: the ICRC room.
    let mut hdr = [0u8; 128];
    let mut hlen = 0usize;
    let mut first_data = n;
    for (i, s) in sges[..n].iter().enumerate() {
        match *s {
            Sge::Inline { off, len } if i + 1 < n || n == 1 => {
                let (o, l) = (usize::from(off), usize::from(len));
                if hlen + l > hdr.len() {
                    break;
                }
                hdr[hlen..hlen + l].copy_from_slice(&wqe[o..o + l]);
                hlen += l;
            }
            _ => {
                first_data = i;
                break;
            }
        }
    }
    let bad = |hca: &mut Hca, why: &str| {
        hca.violation(format!("QP {qpn:#x} MLX send: {why}"));
        Outcome::Fail(Syndrome::LocalQpOp)
    };
    let last_icrc = n >= 2 && matches!(sges[n - 1], Sge::Inline { len: 4, .. });
    if !last_icrc {
        return bad(hca, "no 4-byte inline ICRC segment at the end of the WQE");
    }
    let h = match parse_ud_header(&hdr[..hlen]) {
        Ok(h) => h,
        Err(e) => return bad(hca, e),
    };
    // Header bytes beyond the parsed header belong to the payload.
    let extra = hlen - h.len;
    let mut segs = [Seg::default(); MAX_SEGS];
    let mut ns = 0;
    if extra > 0 {
        segs[0] = Seg {
            addr: 0,
            len: extra as u64,
            xl: None,
        };
        ns = 1;
    }
    let mut payload = extra as u64;
    let mut hdr_inline = [0u8; 128];
    hdr_inline[..extra].copy_from_slice(&hdr[h.len..hlen]);
    let body = &sges[first_data.min(n - 1)..n - 1];
    for s in body {
        match *s {
            Sge::Ptr { len, lkey, addr } => {
                match xlate::check(hca, lkey, q.pd, Access::LocalRead, addr, len, q.rlkey) {
                    Ok(xl) => {
                        segs[ns] = Seg {
                            addr,
                            len,
                            xl: Some(xl),
                        };
                        ns += 1;
                        payload += len;
                    }
                    Err(_) => return Outcome::Fail(Syndrome::LocalProt),
                }
            }
            Sge::Inline { .. } => return bad(hca, "inline payload after data segments"),
            Sge::None => {}
        }
        if ns == MAX_SEGS {
            break;
        }
    }
    let is_qp0 = q.special == Some(true);
    if is_qp0 != (h.vl == 15) || is_qp0 != mlx.vl15 {
        return bad(
            hca,
            "VL15 is for QP0 (SMPs) only, and QP0 sends only on VL15",
        );
    }
    let want_sqpn = u32::from(!is_qp0);
    if h.sqpn != want_sqpn {
        return bad(hca, "DETH source QP is not the special QP's own number");
    }
    if is_qp0 && h.dqpn != 0 {
        return bad(hca, "an SMP addressed to a QP other than QP0");
    }
    if h.dqpn == 1 && h.qkey != GSI_QKEY {
        return bad(hca, "a GMP to QP1 without the Q_Key 0x80010000");
    }
    if u64::from(h.pkt_words) * 4 != h.len as u64 + payload + u64::from(h.pad) + 4
        || !(payload + u64::from(h.pad)).is_multiple_of(4)
    {
        return bad(
            hca,
            "LRH packet length does not match header + payload + pad + ICRC",
        );
    }
    if h.dlid == PERMISSIVE_LID {
        let mut cls = [0u8; 2];
        let class_ok = is_qp0
            && xlate::gather(hca, &segs[..ns], &hdr_inline, 0, &mut cls).is_ok()
            && cls[1] == 0x81;
        if !class_ok {
            return bad(hca, "permissive DLID on anything but a directed-route SMP");
        }
        if !mlx.slr {
            return bad(hca, "permissive DLID without SLR in the MLX segment");
        }
    }
    let port = q.port;
    let Some(pi) = hca.port_index(u32::from(port)) else {
        return Outcome::Fail(Syndrome::LocalQpOp);
    };
    if !is_qp0 && !hca.ports[pi].pkeys.iter().any(|&p| p != 0 && p == h.pkey) {
        return bad(hca, "BTH P_Key is not in the port's P_Key table");
    }
    let (state, lid, _) = port_state(hca, port).unwrap_or((LogicalState::Down, 0, 0));
    let up = if is_qp0 {
        state >= LogicalState::Init
    } else {
        state == LogicalState::Active
    };
    let slid = if mlx.slr {
        h.slid
    } else {
        lid | (h.slid & u16::from(lmc_mask(hca, port)))
    };
    let local = up && (mlx.force_lb || is_local(hca, port, h.dlid));
    if local {
        let base = hca.special_qp_base;
        let dst = if h.dqpn == 0 {
            base + u32::from(port) - 1
        } else if h.dqpn == 1 {
            base + 2 + u32::from(port) - 1
        } else {
            h.dqpn
        };
        let m = Msg {
            kind: Kind::Send,
            st: st::MLX,
            src_qpn: h.sqpn,
            dst_qpn: dst,
            port,
            len: payload,
            imm: h.imm,
            se: h.se,
            raddr: 0,
            rkey: 0,
            swap: 0,
            cmp: 0,
            slid,
            dlid: h.dlid,
            sl: h.sl,
            pkey: h.pkey,
            qkey: h.qkey,
            grh: h.grh,
            npkts: 1,
            inv: None,
            eth: None,
        };
        mad_deliver(hca, &m, &segs[..ns], &hdr_inline, is_qp0);
    } else if up && crate::hca::engine::wire::attached(hca, port) {
        let mut body = vec![0u8; payload as usize];
        if xlate::gather(hca, &segs[..ns], &hdr_inline, 0, &mut body).is_err() {
            return Outcome::Fail(Syndrome::LocalProt);
        }
        let grh = h
            .grh
            .and_then(|g| crate::fabric::packet::Grh::parse(&g).ok());
        let hd = crate::fabric::packet::Headers {
            lrh: crate::fabric::packet::Lrh {
                vl: h.vl,
                sl: h.sl,
                dlid: h.dlid,
                slid,
                ..Default::default()
            },
            grh,
            bth: crate::fabric::packet::Bth {
                opcode: if h.imm.is_some() {
                    crate::fabric::packet::opcode::UD_SEND_ONLY_IMM
                } else {
                    crate::fabric::packet::opcode::UD_SEND_ONLY
                },
                se: h.se,
                pkey: h.pkey,
                dest_qp: h.dqpn,
                psn: h.psn,
                ..Default::default()
            },
            deth: Some(crate::fabric::packet::Deth {
                qkey: h.qkey,
                src_qp: h.sqpn,
            }),
            imm: h.imm,
            ..Default::default()
        };
        match crate::fabric::packet::build(&hd, &body) {
            Ok(b) => {
                crate::hca::engine::wire::transmit(hca, port, b);
            }
            Err(e) => return bad(hca, &format!("the header does not make a packet: {e}")),
        }
    } else if !up {
        // The port cannot send (QP0: link not up; QP1: not Active): the
        // card completes the WQE and discards the packet at the port.
        let c = &mut hca.ports[pi].counters;
        c.xmit_discards = c.xmit_discards.saturating_add(1);
    }
    let _ = ctrl;
    Outcome::Done {
        byte_cnt: payload as u32,
    }
}

/// A MAD arriving at QP0/QP1 `m.dst_qpn`: dropped unless that QP is ready
/// (VL15Dropped counts dropped SMPs); a GMP whose P_Key matches no entry
/// of the port's table is a P_Key violation (P_KeyViolations, trap 257).
pub(in crate::hca::engine) fn mad_deliver(
    hca: &mut Hca,
    m: &Msg,
    src: &[Seg],
    inline: &[u8],
    smp: bool,
) {
    let ready = matches!(
        qp_state(hca, m.dst_qpn),
        Some(QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqer)
    );
    let d = hca.engine.qps.get(&m.dst_qpn).cloned();
    let dropped = match d {
        Some(d) if ready && d.st == st::MLX => {
            let pi = hca.port_index(u32::from(d.port)).unwrap_or(0);
            let ok = smp || hca.ports[pi].pkeys.iter().any(|&p| pkey_match(p, m.pkey));
            if !ok {
                pkey_violation(hca, pi, m, 1);
                return;
            }
            !matches!(receive(hca, &d, m, src, inline, true), Resp::Ack)
        }
        _ => true,
    };
    if dropped
        && smp
        && let Some(i) = hca.port_index(u32::from(m.port))
    {
        let c = &mut hca.ports[i].counters;
        c.vl15_dropped = c.vl15_dropped.saturating_add(1);
    }
}

/// A packet `m` to QP `dst_qp` of port index `pi` dropped for its P_Key:
/// PortInfo's P_KeyViolations and the SMA's Bad P_Key trap.
pub(in crate::hca::engine) fn pkey_violation(hca: &mut Hca, pi: usize, m: &Msg, dst_qp: u32) {
    let p = &mut hca.ports[pi];
    p.pkey_violations = p.pkey_violations.saturating_add(1);
    let gids = m.grh.map(|g| {
        let mut s = [0u8; 16];
        let mut d = [0u8; 16];
        s.copy_from_slice(&g[8..24]);
        d.copy_from_slice(&g[24..40]);
        (s, d)
    });
    let b = crate::hca::mad_ifc::BadKey {
        key: m.pkey,
        slid: m.slid,
        dlid: m.dlid,
        sl: m.sl,
        src_qp: m.src_qpn,
        dst_qp,
        gids,
    };
    crate::hca::mad_ifc::bad_pkey_trap(hca, pi, &b);
}

/// A MAD the card generates itself (the SMA's traps) arriving at port
/// `port`'s QP0 as a packet received with SLID 0, the way a ConnectX
/// firmware hands its traps to the driver; nothing if QP0 is not ready.
pub(in crate::hca::engine) fn local_smp(hca: &mut Hca, port: u8, mad: &[u8]) {
    let base = hca.special_qp_base;
    if base == 0 || port == 0 {
        return;
    }
    let dst = base + u32::from(port) - 1;
    let ready = matches!(
        qp_state(hca, dst),
        Some(QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqer)
    );
    let Some(d) = hca.engine.qps.get(&dst).cloned() else {
        return;
    };
    if !ready || d.st != st::MLX {
        return;
    }
    let lid = port_state(hca, port).map_or(0, |(_, l, _)| l);
    let m = Msg {
        kind: Kind::Send,
        st: st::MLX,
        src_qpn: 0,
        dst_qpn: dst,
        port,
        len: mad.len() as u64,
        imm: None,
        se: false,
        raddr: 0,
        rkey: 0,
        swap: 0,
        cmp: 0,
        slid: 0,
        dlid: lid,
        sl: 0,
        pkey: 0xffff,
        qkey: 0,
        grh: None,
        npkts: 1,
        inv: None,
        eth: None,
    };
    let src = [Seg {
        addr: 0,
        len: mad.len() as u64,
        xl: None,
    }];
    let _ = receive(hca, &d, &m, &src, mad, true);
}
