//! The receive ring of a port, as Linux's `en_rx.c` runs it: a raw Ethernet QP at the QPN the MAC table steers to, one 2 KiB buffer per descriptor (`mlx4_en_create_rx_ring`, `mlx4_en_activate_rx_rings`, `mlx4_en_process_rx_cq`).
//!
//! Left out: RSS (Linux puts an RSS QP in front of its rings; with one ring
//! the steered QP is the ring's own), page fragments and GRO, checksum
//! and VLAN offload results (the stack checks checksums; the port is in no
//! VLAN), several rings.

use hal::barrier::wmb;
use hal::be::{get_be16, get_be32};
use mlx4_core::Dev;
use mlx4_core::bitmap::{Buf, Db};
use mlx4_core::dev::{Mtt, Uar};
use mlx4_core::qp::Qp;
use mlx4_hw::cqe;
use mlx4_hw::wqe::data;

use crate::en_cq::EnCq;
use crate::en_netdev::{RingStats, fill_qp_context, qp_destroy};
use crate::{ETH_HLEN, RX_BUF_SIZE, Result, TXBB_SIZE};

/// Bytes of a receive descriptor: one data segment.
const STRIDE: usize = data::SIZE;
/// CQE `badfcs_enc` byte and its bad-FCS bit (`MLX4_CQE_BAD_FCS`).
const CQE_BADFCS_ENC: usize = 0x13;
const CQE_BAD_FCS: u8 = 1 << 4;

/// One receive ring (Linux `struct mlx4_en_rx_ring`) and its CQ.
pub struct RxRing {
    qp: Option<Qp>,
    qp_buf: Buf,
    mtt: Option<Mtt>,
    bufs: Buf,
    db: Option<Db>,
    size: u32,
    /// Descriptors posted (`prod`).
    pub prod: u32,
    /// Descriptors consumed (`cons`).
    pub cons: u32,
    /// The ring's CQ.
    pub cq: EnCq,
    /// Its counters.
    pub stats: RingStats,
}

impl RxRing {
    /// `mlx4_en_create_rx_ring` + `mlx4_en_activate_rx_rings`: `size`
    /// descriptors, each with its buffer, all posted; the QP `qpn` (the
    /// one RQP_CALC steers the port's MAC to) through RTS on `port`.
    pub fn create(
        dev: &mut Dev,
        port: u8,
        qpn: u32,
        size: u32,
        uar: &Uar,
        pdn: u32,
        lkey: u32,
    ) -> Result<RxRing> {
        let cq = EnCq::create(dev, size, uar)?;
        let bytes = TXBB_SIZE + size as usize * STRIDE;
        let blen = size as usize * RX_BUF_SIZE;
        let made = dev
            .buf_alloc(bytes, bytes.max(4096))
            .and_then(|q| Ok((q, dev.buf_alloc(blen, blen)?)));
        let (qp_buf, bufs) = match made {
            Ok(x) => x,
            Err(e) => {
                cq.destroy(dev);
                return Err(e.into());
            }
        };
        let mut ring = RxRing {
            qp: None,
            qp_buf,
            mtt: None,
            bufs,
            db: None,
            size,
            prod: 0,
            cons: 0,
            cq,
            stats: RingStats::default(),
        };
        if let Err(e) = ring.activate(dev, port, qpn, uar, pdn, lkey) {
            ring.destroy(dev);
            return Err(e);
        }
        Ok(ring)
    }

    fn activate(
        &mut self,
        dev: &mut Dev,
        port: u8,
        qpn: u32,
        uar: &Uar,
        pdn: u32,
        lkey: u32,
    ) -> Result<()> {
        // The QP's one send WQE (it sends nothing) owned by software, as
        // mlx4_ib stamps a new SQ: a card that looks at the send queues of
        // a UAR page's QPs after a doorbell there (the model's polled front
        // ends) must not find a zeroed, hardware-owned WQE.
        if let Some((d, o)) = self.qp_buf.locate(0) {
            d.write_be32(o, mlx4_hw::wqe::ctrl::OWNER);
        }
        // Descriptor i points at buffer i for good (`mlx4_en_init_rx_desc`).
        for i in 0..self.size as usize {
            let (Some((d, o)), Some((b, bo))) = (
                self.qp_buf.locate(TXBB_SIZE + i * STRIDE),
                self.bufs.locate(i * RX_BUF_SIZE),
            ) else {
                return Err(crate::Error::Core(mlx4_core::Error::NoMem));
            };
            d.write_be32(o + data::BYTE_COUNT, RX_BUF_SIZE as u32);
            d.write_be32(o + data::LKEY, lkey);
            d.write_be64(o + data::ADDR, b.bus_addr().0 + bo as u64);
        }
        let db = *self.db.insert(dev.db_alloc(0)?);
        let mtt = *self
            .mtt
            .insert(dev.mtt_init(self.qp_buf.npages, self.qp_buf.page_shift)?);
        dev.buf_write_mtt(&mtt, &self.qp_buf)?;
        let qp = dev.qp_alloc(qpn)?;
        let ctx = fill_qp_context(
            port,
            pdn,
            uar.index,
            self.cq.cqn(),
            Some(((self.size.ilog2() as u8) << 3, db.dma)),
            2,
        );
        let r = dev.qp_to_ready(&qp, &mtt, &ctx);
        self.qp = Some(qp);
        r?;
        self.prod = self.size;
        self.update_db(dev);
        Ok(())
    }

    /// Descriptors in the ring.
    pub fn size(&self) -> u32 {
        self.size
    }

    fn update_db(&self, dev: &Dev) {
        if let Some(db) = &self.db
            && let Some((b, off)) = dev.db_record(db)
        {
            wmb();
            b.write_be32(off, self.prod & 0xffff);
        }
    }

    /// Linux `mlx4_en_process_rx_cq` for one frame: the next completion's
    /// frame copied into `out` (its length returned, with the VLAN id of the
    /// tag the card stripped, if it had one other than 0), the descriptor
    /// posted again. A completion in error, a bad FCS, a frame shorter than an
    /// Ethernet header or longer than `out` is counted and skipped.
    /// `None` when the CQ is empty, or after one ring's worth of skipped
    /// completions (the rest wait for the next call).
    pub fn receive(&mut self, dev: &Dev, out: &mut [u8]) -> Option<(usize, Option<u16>)> {
        for _ in 0..self.size {
            let c = self.cq.peek()?;
            self.cq.consume(dev, 1);
            // A send completion or another QP's is not one of the ring's
            // descriptors: counted, the ring left as it is.
            let vlan_my_qpn = get_be32(&c, cqe::VLAN_MY_QPN);
            let qpn = vlan_my_qpn & cqe::QPN_MASK;
            // A priority tag (VID 0) is no VLAN (Linux `vlan_do_receive`).
            let vid = Some(get_be16(&c, cqe::SL_VID) & cqe::VID_MASK)
                .filter(|&v| vlan_my_qpn & cqe::CVLAN_PRESENT != 0 && v != 0);
            let op = c[cqe::OWNER_SR_OPCODE];
            if op & cqe::IS_SEND_MASK != 0
                || Some(qpn) != self.qp.as_ref().map(|q| q.qpn & cqe::QPN_MASK)
            {
                self.stats.errors += 1;
                continue;
            }
            let idx = (self.cons & (self.size - 1)) as usize;
            self.cons = self.cons.wrapping_add(1);
            let len = get_be32(&c, cqe::BYTE_CNT) as usize;
            let got = if op & cqe::OPCODE_MASK == cqe::OPCODE_ERROR
                || c[CQE_BADFCS_ENC] & CQE_BAD_FCS != 0
            {
                self.stats.errors += 1;
                None
            } else if !(ETH_HLEN..=RX_BUF_SIZE).contains(&len) || len > out.len() {
                self.stats.dropped += 1;
                None
            } else if let Some((b, bo)) = self.bufs.locate(idx * RX_BUF_SIZE) {
                b.read_bytes(bo, &mut out[..len]);
                self.stats.packets += 1;
                self.stats.bytes += len as u64;
                if out[0] & 1 != 0 {
                    self.stats.multicast += 1;
                }
                Some((len, vid))
            } else {
                // A descriptor whose buffer is not in the ring's memory
                // (cannot happen with the ring as built): counted.
                self.stats.errors += 1;
                None
            };
            // The descriptor still points at its buffer: post it again.
            self.prod = self.prod.wrapping_add(1);
            self.update_db(dev);
            if got.is_some() {
                return got;
            }
        }
        None
    }

    /// Linux `mlx4_en_deactivate_rx_ring` + `mlx4_en_destroy_rx_ring`.
    pub fn destroy(mut self, dev: &mut Dev) {
        qp_destroy(dev, self.qp.take(), self.mtt.take());
        if let Some(db) = self.db.take() {
            dev.db_free(db);
        }
        self.cq.destroy(dev);
    }
}
