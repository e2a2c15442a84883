//! Multicast datagrams in the HCA: a UD packet to a multicast LID delivered to every QP of the port attached to its group, and the card's own copy of a multicast datagram it sends to the port's members (multicast loopback).
//!
//! The group is found in the MCG table by the GRH's DGID
//! ([`crate::hca::fw::mcg::members`]): the card steers by MGID and keeps no
//! table of MLIDs (the SM's forwarding tables route the MLID). Left out: raw
//! (non-UD) multicast and the Ethernet steering of B0 mode.
//!
//! # Decisions
//!
//! * A packet to a multicast LID (0xC000 to 0xFFFE) must be a UD datagram to
//!   QPN 0xFFFFFF with a GRH whose DGID is a multicast GID (the card steers by
//!   it): anything else is dropped and counted ([`McastStats::malformed`]);
//!   a group no QP of the port is attached to is dropped and counted too
//!   ([`McastStats::not_attached`]).
//! * Each attached QP gets its own copy through the responder, as a unicast
//!   datagram: its state, port, P_Key and Q_Key are checked per QP (a Q_Key
//!   mismatch counts in the port's Q_Key violations and drops that copy only),
//!   and an empty receive queue drops that copy.
//! * A multicast datagram a QP of this HCA sends goes to the wire and, inside
//!   the card, to the members of its group on the sending port; the sender
//!   itself gets a copy unless its member word carries the block-loopback bit
//!   (`MGM_BLCK_LB_BIT`, which Linux sets for a QP created with
//!   `IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK`, as IPoIB's is). The switch never
//!   sends a multicast packet back out of the port it came in on, so this copy
//!   is the only one the sending port sees.

use super::exec::{Kind, Msg, respond};
use super::xlate::Seg;
use crate::fabric::LogicalState;
use crate::fabric::packet::{Headers, opcode};
use crate::hca::ctx::st;
use crate::hca::device::Hca;
use crate::hca::fw::mcg::{self, BLCK_LB, QPN_MASK};

/// The destination QPN of every multicast datagram.
pub const MULTICAST_QPN: u32 = 0xff_ffff;

/// What the multicast steering counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct McastStats {
    /// Copies of received multicast datagrams handed to attached QPs (each
    /// QP's copy counts once, taken or not by its receive queue).
    pub delivered: u64,
    /// Copies a receiving QP did not take (state, P_Key, Q_Key, no receive
    /// WQE).
    pub refused: u64,
    /// Multicast packets for a group no QP of the port is attached to.
    pub not_attached: u64,
    /// Packets to a multicast LID that are no UD datagram to QPN 0xFFFFFF
    /// with a multicast DGID.
    pub malformed: u64,
    /// Copies of our own multicast datagrams delivered inside the card.
    pub loopback: u64,
    /// Copies not delivered back to their sender (block-loopback bit).
    pub loopback_blocked: u64,
}

/// A multicast LID (IBTA 4.1.1: 0xC000 to 0xFFFE; 0xFFFF is permissive).
pub fn is_mcast_lid(lid: u16) -> bool {
    (0xc000..0xffff).contains(&lid)
}

/// Hands `m` (its `dst_qpn` set per member) to each member of the port;
/// `sender` is the sending QP of a loopback copy. Returns the copies taken.
fn to_members(
    hca: &mut Hca,
    m: &Msg,
    members: &[u32],
    src: &[Seg],
    inline: &[u8],
    sender: Option<u32>,
) -> u64 {
    let mut taken = 0;
    for &w in members {
        let qpn = w & QPN_MASK;
        if sender == Some(qpn) && w & BLCK_LB != 0 {
            hca.engine.mcast.loopback_blocked += 1;
            continue;
        }
        let copy = Msg { dst_qpn: qpn, ..*m };
        let r = respond(hca, &copy, src, inline);
        let ok = matches!(r, super::exec::Resp::Ack);
        if sender.is_some() {
            if ok {
                hca.engine.mcast.loopback += 1;
            }
        } else {
            hca.engine.mcast.delivered += 1;
            if !ok {
                hca.engine.mcast.refused += 1;
            }
        }
        taken += u64::from(ok);
    }
    taken
}

/// A packet to a multicast LID arrived at `port` (`state`: the port's
/// logical state).
pub(super) fn receive(hca: &mut Hca, port: u8, h: &Headers, payload: &[u8], state: LogicalState) {
    if state != LogicalState::Active {
        return;
    }
    let (Some(d), Some(g)) = (h.deth, h.grh) else {
        hca.engine.mcast.malformed += 1;
        return;
    };
    if h.bth.opcode & 0xe0 != opcode::UD
        || h.bth.dest_qp != MULTICAST_QPN
        || h.lrh.vl == 15
        || g.dgid[0] != 0xff
    {
        hca.engine.mcast.malformed += 1;
        return;
    }
    let Some(members) = mcg::members(hca, &g.dgid) else {
        hca.engine.mcast.not_attached += 1;
        return;
    };
    let mut grh = [0u8; 40];
    g.write(&mut grh);
    let len = payload.len() as u64;
    let m = Msg {
        kind: Kind::Send,
        st: st::UD,
        src_qpn: d.src_qp,
        dst_qpn: MULTICAST_QPN,
        port,
        len,
        imm: h.imm,
        se: h.bth.se,
        raddr: 0,
        rkey: 0,
        swap: 0,
        cmp: 0,
        slid: h.lrh.slid,
        dlid: h.lrh.dlid,
        sl: h.lrh.sl,
        pkey: h.bth.pkey,
        qkey: d.qkey,
        grh: Some(grh),
        npkts: 1,
        inv: None,
    };
    let src = [Seg {
        addr: 0,
        len,
        xl: None,
    }];
    to_members(hca, &m, &members, &src, payload, None);
}

/// QP `m.src_qpn` sends the UD datagram `m` to a multicast LID: the copies
/// the card delivers to the port's members (see the module's decisions).
/// The caller sends it to the wire as any datagram.
pub(super) fn loopback(hca: &mut Hca, m: &Msg, segs: &[Seg], inline: &[u8]) {
    let Some(g) = m.grh else { return };
    if m.dst_qpn != MULTICAST_QPN || g[24] != 0xff {
        return;
    }
    let up = hca
        .port_index(u32::from(m.port))
        .is_some_and(|i| hca.ports[i].state == LogicalState::Active);
    if !up {
        return;
    }
    let mut mgid = [0u8; 16];
    mgid.copy_from_slice(&g[24..40]);
    let Some(members) = mcg::members(hca, &mgid) else {
        return;
    };
    to_members(hca, m, &members, segs, inline, Some(m.src_qpn));
}

/// The responder takes a datagram whose GRH names a multicast group only
/// from these paths, which found the QP among the group's members.
pub(super) fn steered(m: &Msg) -> bool {
    is_mcast_lid(m.dlid) && m.grh.is_some_and(|g| g[24] == 0xff)
}
