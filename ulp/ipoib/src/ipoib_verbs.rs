//! Port of Linux `ipoib_verbs.c`: the PD, the send and receive CQs, the UD QP (multicast loopback blocked) and the DMA rings of one IPoIB port, the QP's INIT-RTR-RTS walk, its Q_Key from the broadcast join, and the attach to a multicast group.
//!
//! Left out: the LSO and checksum capabilities (never asked for), the SRQ
//! and the connected-mode QPs (`ipoib_cm.c`), and the CQ event handlers
//! (the link polls its CQs). Linux's `pd->local_dma_lkey` is a DMA MR
//! here (`get_dma_mr`); the rings are one DMA buffer each.

use hal::dma::DmaBuf;
use ib_core::Device;
use ib_core::error::{Error, Result};
use ib_core::verbs::{
    AccessFlags, Cq, CqInitAttr, Gid, Mr, Pd, Qp, QpAttr, QpAttrMask, QpCap, QpCreateFlags,
    QpInitAttr, QpState, QpType, SigType,
};

use crate::{Config, IB_GRH_BYTES, IPOIB_ENCAP_LEN};

/// The verbs objects and rings of one port (the `ipoib_dev_priv` fields
/// `pd`, `send_cq`, `recv_cq`, `qp`, `rx_ring`, `tx_ring`).
pub struct Transport {
    /// Protection domain.
    pub pd: Pd,
    /// Send completions.
    pub send_cq: Cq,
    /// Receive completions.
    pub recv_cq: Cq,
    /// The UD QP.
    pub qp: Qp,
    /// Its number (the hardware address's QPN).
    pub qpn: u32,
    /// The local key every buffer is posted with.
    pub mr: Mr,
    /// Receive slots: the 40-byte GRH area, the 4-byte header, the MTU.
    pub rx: DmaBuf,
    /// Bytes per receive slot.
    pub rx_slot: usize,
    /// Receive slots (posted WRs).
    pub rx_n: u32,
    /// Send slots: the header and the MTU.
    pub tx: DmaBuf,
    /// Bytes per send slot.
    pub tx_slot: usize,
    /// Send slots.
    pub tx_n: u32,
}

/// Bytes of a receive slot for IP MTU `mtu` (`IPOIB_UD_BUF_SIZE`),
/// 64-byte aligned.
pub const fn rx_slot_bytes(mtu: usize) -> usize {
    (IB_GRH_BYTES + IPOIB_ENCAP_LEN + mtu).next_multiple_of(64)
}

/// Bytes of a send slot for IP MTU `mtu`.
pub const fn tx_slot_bytes(mtu: usize) -> usize {
    (IPOIB_ENCAP_LEN + mtu).next_multiple_of(64)
}

/// `ipoib_transport_dev_init`: the PD, both CQs, the UD QP on `port` with
/// multicast loopback blocked, the DMA MR and the rings for IP MTU `mtu`.
/// On failure everything made so far is destroyed again.
#[doc(alias = "ipoib_transport_dev_init")]
pub fn transport_dev_init(
    dev: &mut Device,
    port: u8,
    mtu: usize,
    cfg: &Config,
) -> Result<Transport> {
    let rx_n = cfg.recv_queue_size.max(2);
    let tx_n = cfg.send_queue_size.max(2);
    let pd = dev.alloc_pd()?;
    let mut undo = Undo {
        pd: Some(pd),
        ..Undo::default()
    };
    let r = (|| {
        let (send_cq, _) = dev.create_cq(&CqInitAttr {
            cqe: tx_n,
            comp_vector: 0,
        })?;
        undo.cqs[0] = Some(send_cq);
        let (recv_cq, _) = dev.create_cq(&CqInitAttr {
            cqe: rx_n,
            comp_vector: 0,
        })?;
        undo.cqs[1] = Some(recv_cq);
        let (qp, _) = dev.create_qp(
            pd,
            &QpInitAttr {
                send_cq,
                recv_cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: tx_n,
                    max_recv_wr: rx_n,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_type: SigType::AllWr,
                qp_type: QpType::Ud,
                create_flags: QpCreateFlags::BLOCK_MULTICAST_LOOPBACK,
                port_num: port,
            },
        )?;
        undo.qp = Some(qp);
        let mr = dev.get_dma_mr(pd, AccessFlags::LOCAL_WRITE)?;
        undo.mr = Some(mr);
        let rx_slot = rx_slot_bytes(mtu);
        let tx_slot = tx_slot_bytes(mtu);
        let pool = dev.provider().dma_pool();
        let rx = pool
            .alloc((rx_slot * rx_n as usize).next_multiple_of(4096), 4096)
            .map_err(|_| Error::NoMem)?;
        let tx = pool
            .alloc((tx_slot * tx_n as usize).next_multiple_of(4096), 4096)
            .map_err(|_| Error::NoMem)?;
        Ok(Transport {
            pd,
            send_cq,
            recv_cq,
            qpn: qp.qp_num,
            qp,
            mr,
            rx,
            rx_slot,
            rx_n,
            tx,
            tx_slot,
            tx_n,
        })
    })();
    match r {
        Ok(t) => Ok(t),
        Err(e) => {
            undo.run(dev);
            Err(e)
        }
    }
}

#[derive(Default)]
struct Undo {
    pd: Option<Pd>,
    cqs: [Option<Cq>; 2],
    qp: Option<Qp>,
    mr: Option<Mr>,
}

impl Undo {
    fn run(self, dev: &mut Device) {
        if let Some(mr) = self.mr {
            let _ = dev.dereg_mr(mr);
        }
        if let Some(qp) = self.qp {
            let _ = dev.destroy_qp(qp);
        }
        for cq in self.cqs.into_iter().flatten() {
            let _ = dev.destroy_cq(cq);
        }
        if let Some(pd) = self.pd {
            let _ = dev.dealloc_pd(pd);
        }
    }
}

/// `ipoib_transport_dev_cleanup`: destroys the QP, the MR, the CQs and
/// the PD (the rings go with `t`).
#[doc(alias = "ipoib_transport_dev_cleanup")]
pub fn transport_dev_cleanup(dev: &mut Device, t: Transport) {
    Undo {
        pd: Some(t.pd),
        cqs: [Some(t.send_cq), Some(t.recv_cq)],
        qp: Some(t.qp),
        mr: Some(t.mr),
    }
    .run(dev);
}

/// `ipoib_init_qp`: RESET to INIT (the port, the P_Key index, Q_Key 0
/// until the broadcast join says which), RTR, RTS.
#[doc(alias = "ipoib_init_qp")]
pub fn init_qp(dev: &mut Device, qp: Qp, port: u8, pkey_index: u16) -> Result<()> {
    let steps = [
        (
            QpAttr {
                qp_state: QpState::Init,
                port_num: port,
                pkey_index,
                qkey: 0,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        ),
        (
            QpAttr {
                qp_state: QpState::Rtr,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        ),
        (
            QpAttr {
                qp_state: QpState::Rts,
                sq_psn: 0,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::SQ_PSN,
        ),
    ];
    for (a, m) in steps {
        if let Err(e) = dev.modify_qp(qp, &a, m) {
            // Back to RESET, so that a later try starts clean.
            let _ = dev.modify_qp(
                qp,
                &QpAttr {
                    qp_state: QpState::Reset,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE,
            );
            return Err(e);
        }
    }
    Ok(())
}

/// The Q_Key part of `ipoib_mcast_attach`: the QP takes the broadcast
/// group's Q_Key (RTS to RTS).
pub fn set_qkey(dev: &mut Device, qp: Qp, qkey: u32) -> Result<()> {
    if qkey & 0x8000_0000 != 0 {
        // A controlled Q_Key is for the special QPs (IBA 10.2.4).
        return Err(Error::Invalid("a Q_Key with the high bit set"));
    }
    dev.modify_qp(
        qp,
        &QpAttr {
            qkey,
            ..QpAttr::default()
        },
        QpAttrMask::QKEY,
    )
}

/// `ipoib_mcast_attach`'s attach: the QP receives what is sent to `mgid`
/// at `mlid`.
#[doc(alias = "ipoib_mcast_attach")]
pub fn mcast_attach(dev: &mut Device, qp: Qp, mgid: &Gid, mlid: u16) -> Result<()> {
    dev.attach_mcast(qp, mgid, mlid)
}

/// `ipoib_mcast_detach`.
#[doc(alias = "ipoib_mcast_detach")]
pub fn mcast_detach(dev: &mut Device, qp: Qp, mgid: &Gid, mlid: u16) -> Result<()> {
    dev.detach_mcast(qp, mgid, mlid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_hold_the_grh_the_header_and_the_mtu() {
        assert_eq!(rx_slot_bytes(crate::IPOIB_UD_MTU), 2112);
        assert_eq!(tx_slot_bytes(crate::IPOIB_UD_MTU), 2048);
        assert!(rx_slot_bytes(1) > IB_GRH_BYTES + IPOIB_ENCAP_LEN);
    }
}
