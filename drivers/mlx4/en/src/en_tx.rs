//! The send ring of a port, as Linux's `en_tx.c` runs it: a raw Ethernet QP whose descriptors point at a bounce buffer per slot (`mlx4_en_create_tx_ring`, `mlx4_en_activate_tx_ring`, `mlx4_en_xmit`, `mlx4_en_process_tx_cq`).
//!
//! Left out: inline frames, LSO, scatter lists (the stack hands one
//! linear frame, copied into the slot's buffer), BlueFlame, checksum
//! offload, VLAN insertion, several rings and their queue selection.

use hal::Doorbell;
use hal::barrier::{dma_wmb, wmb};
use hal::be::get_be16;
use mlx4_core::Dev;
use mlx4_core::bitmap::Buf;
use mlx4_core::dev::{Mtt, Uar};
use mlx4_core::qp::Qp;
use mlx4_hw::cqe;
use mlx4_hw::doorbell::SEND_DOORBELL;
use mlx4_hw::wqe::{ctrl, data, opcode};

use crate::en_cq::EnCq;
use crate::en_netdev::{RingStats, fill_qp_context, qp_destroy};
use crate::{Error, RX_BUF_SIZE, Result, TXBB_SIZE};

/// Control and one data segment: 32 bytes, 2 units of 16.
const DESC_DS: u8 = 2;

/// One send ring (Linux `struct mlx4_en_tx_ring`) and its CQ.
pub struct TxRing {
    qp: Option<Qp>,
    qp_buf: Buf,
    mtt: Option<Mtt>,
    bounce: Buf,
    lkey: u32,
    size: u32,
    /// Descriptors posted (`prod`).
    pub prod: u32,
    /// Descriptors completed (`cons`).
    pub cons: u32,
    doorbell: Doorbell,
    doorbell_qpn: u32,
    /// The ring's CQ.
    pub cq: EnCq,
    /// Its counters.
    pub stats: RingStats,
}

impl TxRing {
    /// `mlx4_en_create_tx_ring` + `mlx4_en_activate_tx_ring`: `size` slots
    /// of one TXBB, a QPN of its own, the QP through RTS on `port`.
    pub fn create(
        dev: &mut Dev,
        port: u8,
        size: u32,
        uar: &Uar,
        pdn: u32,
        lkey: u32,
    ) -> Result<TxRing> {
        let doorbell = uar
            .map
            .doorbell(SEND_DOORBELL)
            .ok_or(Error::Core(mlx4_core::Error::InvalidArg))?;
        let cq = EnCq::create(dev, size, uar)?;
        let bytes = size as usize * TXBB_SIZE;
        let made = (|| -> Result<_> {
            // Exactly the SQ, as Linux allocates it: the QP has no RQ.
            let qp_buf = dev.buf_alloc(bytes, bytes.max(4096))?;
            // Every slot owned by software in the first pass (owner bit set).
            for i in 0..size as usize {
                if let Some((b, o)) = qp_buf.locate(i * TXBB_SIZE) {
                    b.write_be32(o, ctrl::OWNER);
                }
            }
            let blen = size as usize * RX_BUF_SIZE;
            let bounce = dev.buf_alloc(blen, blen)?;
            Ok((qp_buf, bounce))
        })();
        let (qp_buf, bounce) = match made {
            Ok(x) => x,
            Err(e) => {
                cq.destroy(dev);
                return Err(e);
            }
        };
        let mut ring = TxRing {
            qp: None,
            mtt: None,
            qp_buf,
            bounce,
            lkey,
            size,
            prod: 0,
            cons: 0,
            doorbell,
            doorbell_qpn: 0,
            cq,
            stats: RingStats::default(),
        };
        if let Err(e) = ring.activate(dev, port, uar, pdn) {
            ring.destroy(dev);
            return Err(e);
        }
        Ok(ring)
    }

    fn activate(&mut self, dev: &mut Dev, port: u8, uar: &Uar, pdn: u32) -> Result<()> {
        let mtt = *self
            .mtt
            .insert(dev.mtt_init(self.qp_buf.npages, self.qp_buf.page_shift)?);
        dev.buf_write_mtt(&mtt, &self.qp_buf)?;
        let qpn = dev.qp_reserve_range(1, 1)?;
        let qp = match dev.qp_alloc(qpn) {
            Ok(q) => q,
            Err(e) => {
                dev.qp_release_range(qpn, 1);
                return Err(e.into());
            }
        };
        self.doorbell_qpn = qp.qpn << 8;
        let ctx = fill_qp_context(
            port,
            pdn,
            uar.index,
            self.cq.cqn(),
            None,
            (self.size.ilog2() as u8) << 3 | 2,
        );
        let r = dev.qp_to_ready(&qp, &mtt, &ctx);
        self.qp = Some(qp);
        Ok(r?)
    }

    /// Descriptors free for [`TxRing::xmit`].
    pub fn room(&self) -> u32 {
        // One slot stays empty, as Linux keeps HEADROOM.
        self.size - 1 - self.prod.wrapping_sub(self.cons)
    }

    /// Linux `mlx4_en_xmit` for one linear frame: copied into the slot's
    /// buffer, a SEND descriptor with a data segment, the owner bit last,
    /// the doorbell; with `vlan_tci` the card inserts that 802.1Q tag
    /// (`MLX4_WQE_CTRL_INS_CVLAN`, as for a frame of a VLAN device). `false`
    /// (nothing posted) when the ring is full or the frame is longer than a
    /// slot's buffer.
    pub fn xmit(&mut self, frame: &[u8], vlan_tci: Option<u16>) -> bool {
        if self.room() == 0 || frame.len() > RX_BUF_SIZE || frame.is_empty() {
            return false;
        }
        let idx = (self.prod & (self.size - 1)) as usize;
        let Some((bb, bo)) = self.bounce.locate(idx * RX_BUF_SIZE) else {
            return false;
        };
        bb.write_bytes(bo, frame);
        let addr = bb.bus_addr().0 + bo as u64;
        let Some((d, o)) = self.qp_buf.locate(idx * TXBB_SIZE) else {
            return false;
        };
        // Data segment: byte count, lkey, address.
        let ds = o + ctrl::SIZE;
        d.write_be32(ds + data::BYTE_COUNT, frame.len() as u32);
        d.write_be32(ds + data::LKEY, self.lkey);
        d.write_be64(ds + data::ADDR, addr);
        // Control segment: the tag to insert if any, 2 units, completion
        // requested.
        let vlan = vlan_tci.map_or(0, |t| u32::from(t) << 16 | u32::from(ctrl::INS_CVLAN) << 8);
        d.write_be32(o + ctrl::VLAN_TAG, vlan | u32::from(DESC_DS));
        d.write_be32(o + ctrl::SRCRB_FLAGS, ctrl::CQ_UPDATE | ctrl::SOLICITED);
        d.write_be32(o + ctrl::IMM, 0);
        dma_wmb();
        let owner = if self.prod & self.size != 0 {
            ctrl::OWNER
        } else {
            0
        };
        d.write_be32(o + ctrl::OWNER_OPCODE, opcode::SEND | owner);
        self.prod = self.prod.wrapping_add(1);
        self.stats.packets += 1;
        self.stats.bytes += frame.len() as u64;
        wmb();
        self.doorbell.write_be32(self.doorbell_qpn);
        true
    }

    /// Linux `mlx4_en_process_tx_cq`: every send completion frees the
    /// descriptors up to the one it names; an error completion is counted.
    /// Returns the completions seen.
    pub fn process_cq(&mut self, dev: &Dev) -> u32 {
        let mut n = 0;
        // At most one pass of the CQ: a card that keeps writing CQEs
        // (garbage ones included, which `continue`) cannot hold us here.
        while n < self.size
            && let Some(c) = self.cq.peek()
        {
            n += 1;
            self.cq.consume(dev, 1);
            if c[cqe::OWNER_SR_OPCODE] & cqe::OPCODE_MASK == cqe::OPCODE_ERROR {
                self.stats.errors += 1;
            }
            let wqe_index = u32::from(get_be16(&c, cqe::WQE_INDEX));
            let ahead = wqe_index.wrapping_sub(self.cons) & (self.size - 1);
            // A completion for a descriptor not posted is the card's error:
            // counted, nothing freed.
            if ahead >= self.prod.wrapping_sub(self.cons) {
                self.stats.errors += 1;
                continue;
            }
            self.cons = self.cons.wrapping_add(ahead + 1);
        }
        n
    }

    /// Linux `mlx4_en_deactivate_tx_ring` + `mlx4_en_destroy_tx_ring`.
    pub fn destroy(mut self, dev: &mut Dev) {
        let qpn = self.qp.as_ref().map(|q| q.qpn);
        qp_destroy(dev, self.qp.take(), self.mtt.take());
        if let Some(qpn) = qpn {
            dev.qp_release_range(qpn, 1);
        }
        self.cq.destroy(dev);
    }
}
