//! Connections made without the CM.
//!
//! Both sides learn the other's LID, QPN and PSN some other way (a test, a
//! configuration, a future out-of-band exchange) and drive their RC QP to RTS with
//! the attributes Linux's CM would compute (`ib_cm_init_qp_attr` in spirit); leaves
//! out paths with a GRH and alternate paths.

use ib_core::Device;
use ib_core::verbs::{AccessFlags, AhAttr, Mtu, Qp, QpAttr, QpAttrMask as M, QpState};

use crate::Result;

/// The other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its LID.
    pub lid: u16,
    /// Its QP number.
    pub qpn: u32,
    /// The first PSN it sends (our receive PSN).
    pub psn: u32,
}

/// What the connection's QP uses.
#[derive(Debug, Clone, Copy)]
pub struct RcParams {
    /// Local port.
    pub port: u8,
    /// Our first send PSN.
    pub sq_psn: u32,
    /// Rights the peer has on our memory through this QP.
    pub access: AccessFlags,
    /// Local ACK timeout (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retries (3 bits).
    pub retry_cnt: u8,
    /// RNR retries (3 bits, 7 = infinite).
    pub rnr_retry: u8,
    /// Path MTU.
    pub mtu: Mtu,
}

/// Drives `qp` (in RESET) through INIT and RTR to RTS towards `peer`.
pub fn rc_connect(d: &mut Device, qp: Qp, p: &RcParams, peer: Peer) -> Result<()> {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: p.port,
        pkey_index: 0,
        qp_access_flags: p.access,
        ..QpAttr::default()
    };
    d.modify_qp(
        qp,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: p.mtu,
        dest_qp_num: peer.qpn,
        rq_psn: peer.psn & 0xff_ffff,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        ah_attr: AhAttr {
            dlid: peer.lid,
            port_num: p.port,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    d.modify_qp(
        qp,
        &rtr,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: p.sq_psn & 0xff_ffff,
        timeout: p.timeout,
        retry_cnt: p.retry_cnt.min(7),
        rnr_retry: p.rnr_retry.min(7),
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    d.modify_qp(
        qp,
        &rts,
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )?;
    Ok(())
}
