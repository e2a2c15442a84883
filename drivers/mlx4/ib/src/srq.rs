//! Shared receive queues (Linux `srq.c`): create, post, arm, query and destroy.
//!
//! The WQE free list threaded through `next_wqe_index`, posting with the
//! scatter terminator and the doorbell record (`mlx4_ib_post_srq_recv`),
//! returning WQEs on completion (`mlx4_ib_free_srq_wqe`), arming the limit
//! (`mlx4_ib_modify_srq`), create/query/destroy. Left out: XRC SRQs and
//! user-space SRQs.

use alloc::vec;
use alloc::vec::Vec;

use hal::DmaBuf;
use hal::barrier::dma_wmb;
use mlx4_core::mr::Mtt;
use mlx4_hw::wqe::{self, data, srq_next};

use crate::doorbell::Db;
use crate::qp::{PostError, PostFault};
use crate::verbs::RecvWr;
use crate::{Error, Result};

/// The hardware side of an SRQ created through mlx4_core.
#[derive(Debug)]
pub(crate) struct SrqHw {
    pub(crate) msrq: mlx4_core::srq::Srq,
    pub(crate) mtt: Mtt,
}

/// A shared receive queue (Linux `struct mlx4_ib_srq`).
pub struct Mlx4IbSrq {
    pub(crate) buf: DmaBuf,
    /// WQEs (a power of two); one is always kept as the list's tail.
    pub(crate) max: u32,
    pub(crate) max_gs: u32,
    pub(crate) wqe_shift: u32,
    /// First free WQE.
    pub(crate) head: u16,
    /// Last free WQE (where returned WQEs are linked).
    pub(crate) tail: u16,
    /// WQEs posted so far (16 bits go to the doorbell record).
    pub(crate) wqe_ctr: u16,
    pub(crate) wrid: Vec<u64>,
    /// True for WQEs posted and not yet completed.
    pub(crate) busy: Vec<bool>,
    pub(crate) db: Db,
    pub(crate) srq_limit: u32,
    pub(crate) hw: Option<SrqHw>,
}

impl core::fmt::Debug for Mlx4IbSrq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "Mlx4IbSrq({} WQEs, head {}, tail {})",
            self.max, self.head, self.tail
        )
    }
}

/// Linux `mlx4_ib_create_srq` sizing: `(max, max_gs, wqe_shift)` for
/// `max_wr` requests of `max_sge` entries.
pub fn srq_size(caps: &mlx4_core::Caps, max_wr: u32, max_sge: u32) -> Result<(u32, u32, u32)> {
    if max_wr >= caps.max_srq_wqes || max_sge > caps.max_srq_sge {
        return Err(Error::Inval("SRQ larger than the device allows"));
    }
    let max = (max_wr + 1).next_power_of_two();
    let desc = ((srq_next::SIZE as u32) + max_sge * data::SIZE as u32)
        .next_power_of_two()
        .max(32);
    Ok((max, max_sge, desc.ilog2()))
}

/// The WQE buffer of an SRQ of `max` WQEs (a power of two up to 65536).
pub fn alloc_srq_buf(pool: &hal::DmaPool, max: u32, wqe_shift: u32) -> Result<DmaBuf> {
    if !max.is_power_of_two() || !(2..=1 << 16).contains(&max) || !(5..=12).contains(&wqe_shift) {
        return Err(Error::Inval("SRQ size must be a power of two up to 65536"));
    }
    let bytes = (max as usize) << wqe_shift;
    Ok(pool.alloc(bytes.next_multiple_of(4096), 4096)?)
}

impl Mlx4IbSrq {
    /// An SRQ's WQE ring over fresh memory, every WQE linked into the free
    /// list and its scatter entries invalid (the kernel branch of Linux
    /// `mlx4_ib_create_srq`), without an HCA behind it.
    pub fn detached(
        pool: &hal::DmaPool,
        max: u32,
        max_gs: u32,
        wqe_shift: u32,
        db: Db,
    ) -> Result<Self> {
        let buf = alloc_srq_buf(pool, max, wqe_shift)?;
        Ok(Self::assemble(buf, max, max_gs, wqe_shift, db))
    }

    /// Sets up the free list over `buf` (from [`alloc_srq_buf`]).
    pub(crate) fn assemble(buf: DmaBuf, max: u32, max_gs: u32, wqe_shift: u32, db: Db) -> Self {
        let desc = 1usize << wqe_shift;
        for i in 0..max {
            let base = i as usize * desc;
            buf.write_be16(
                base + srq_next::NEXT_WQE_INDEX,
                ((i + 1) & (max - 1)) as u16,
            );
            let mut s = base + srq_next::SIZE;
            while s < base + desc {
                buf.write_be32(s + data::LKEY, wqe::INVALID_LKEY);
                s += data::SIZE;
            }
        }
        db.write(0, 0);
        Mlx4IbSrq {
            buf,
            max,
            max_gs,
            wqe_shift,
            head: 0,
            tail: (max - 1) as u16,
            wqe_ctr: 0,
            wrid: vec![0; max as usize],
            busy: vec![false; max as usize],
            db,
            srq_limit: 0,
            hw: None,
        }
    }

    /// SRQ number (0 when detached).
    pub fn srqn(&self) -> u32 {
        self.hw.as_ref().map_or(0, |h| h.msrq.srqn)
    }

    /// Requests the SRQ can hold (verbs `max_wr`).
    pub fn max_wr(&self) -> u32 {
        self.max - 1
    }

    /// The WQE buffer (tests read WQEs from it).
    pub fn buf(&self) -> &DmaBuf {
        &self.buf
    }

    /// Byte offset of WQE `i`.
    pub fn wqe_offset(&self, i: u16) -> usize {
        (i as usize) << self.wqe_shift
    }

    /// Linux `mlx4_ib_post_srq_recv`.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> core::result::Result<(), PostError> {
        let mut nreq = 0u16;
        let mut res = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sg_list.len() > self.max_gs as usize {
                res = Err(PostError {
                    err: PostFault::TooManySge,
                    bad_wr: i,
                });
                break;
            }
            if self.head == self.tail {
                res = Err(PostError {
                    err: PostFault::QueueFull,
                    bad_wr: i,
                });
                break;
            }
            let idx = self.head;
            let base = self.wqe_offset(idx);
            if let Some(w) = self.wrid.get_mut(idx as usize) {
                *w = wr.wr_id;
            }
            if let Some(b) = self.busy.get_mut(idx as usize) {
                *b = true;
            }
            self.head = self.buf.read_be16(base + srq_next::NEXT_WQE_INDEX) & (self.max - 1) as u16;
            let scat = base + srq_next::SIZE;
            for (k, s) in wr.sg_list.iter().enumerate() {
                let d = scat + k * data::SIZE;
                self.buf
                    .write_be64(d, (u64::from(s.length) << 32) | u64::from(s.lkey));
                self.buf.write_be64(d + data::ADDR, s.addr);
            }
            if wr.sg_list.len() < self.max_gs as usize {
                let d = scat + wr.sg_list.len() * data::SIZE;
                self.buf.write_be64(d, u64::from(wqe::INVALID_LKEY));
                self.buf.write_be64(d + data::ADDR, 0);
            }
            nreq += 1;
        }
        if nreq > 0 {
            self.wqe_ctr = self.wqe_ctr.wrapping_add(nreq);
            dma_wmb();
            self.db.write(0, u32::from(self.wqe_ctr));
        }
        res
    }

    /// The wr_id of completed WQE `idx`, which goes back on the free list
    /// (Linux `mlx4_ib_free_srq_wqe`). An index the device should not have
    /// reported (out of range, or not posted) is an error, not a corrupted
    /// list.
    pub fn take_wqe(&mut self, idx: u16) -> Result<u64> {
        let i = idx as usize;
        if i >= self.max as usize || !self.busy.get(i).copied().unwrap_or(false) {
            return Err(Error::Inval("SRQ completion for a WQE not posted"));
        }
        self.busy[i] = false;
        let tail = self.wqe_offset(self.tail);
        self.buf.write_be16(tail + srq_next::NEXT_WQE_INDEX, idx);
        self.tail = idx;
        Ok(self.wrid[i])
    }

    /// WQEs posted and not completed.
    pub fn outstanding(&self) -> usize {
        self.busy.iter().filter(|b| **b).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doorbell::DbPool;
    use crate::verbs::Sge;
    use alloc::sync::Arc;
    use hal::DmaPool;
    use hal::fake::ArenaDma;

    fn srq(max: u32, gs: u32) -> (DmaPool, Mlx4IbSrq) {
        let pool = DmaPool::new(Arc::new(ArenaDma::new(1 << 20)));
        let mut dbs = DbPool::default();
        let db = dbs.alloc(&pool, 0).unwrap();
        let caps = mlx4_core::Caps {
            max_srq_wqes: 1 << 16,
            max_srq_sge: 31,
            ..Default::default()
        };
        let (m, g, shift) = srq_size(&caps, max - 1, gs).unwrap();
        assert_eq!(m, max);
        (
            pool.clone(),
            Mlx4IbSrq::detached(&pool, m, g, shift, db).unwrap(),
        )
    }

    #[test]
    fn sizing_follows_linux() {
        let caps = mlx4_core::Caps {
            max_srq_wqes: 1 << 16,
            max_srq_sge: 31,
            ..Default::default()
        };
        // 1 SGE: 16 + 16 = 32-byte WQEs; 100 WRs -> 128 WQEs.
        assert_eq!(srq_size(&caps, 100, 1).unwrap(), (128, 1, 5));
        // 3 SGEs: 16 + 48 = 64.
        assert_eq!(srq_size(&caps, 127, 3).unwrap(), (128, 3, 6));
        assert!(srq_size(&caps, 1 << 16, 1).is_err());
        assert!(srq_size(&caps, 10, 32).is_err());
    }

    /// The WQEs, a barrier, then the doorbell record (hal's recording
    /// fake gives the program order).
    #[test]
    #[cfg_attr(
        not(debug_assertions),
        ignore = "hal's recorder exists in debug builds only"
    )]
    fn wqes_are_ordered_before_the_doorbell_record() {
        let (_pool, mut s) = srq(16, 1);
        let (page, at) = s.db.place(0);
        let sg = [Sge {
            addr: 0x1000,
            length: 64,
            lkey: 0x300,
        }];
        for n in [1usize, 3, 2] {
            let wrs: Vec<RecvWr> = (0..n as u64)
                .map(|i| RecvWr {
                    wr_id: i,
                    sg_list: &sg,
                })
                .collect();
            let mut rec = hal::fake::record::Recording::start();
            s.post_recv(&wrs).unwrap();
            let log = rec.take();
            drop(rec);
            let db = log
                .iter()
                .rposition(|a| a.in_buf(&page) == Some(at.clone()))
                .expect("the doorbell record is written");
            let last = log[..db]
                .iter()
                .rposition(|a| a.in_buf(&s.buf).is_some())
                .expect("WQE stores");
            assert!(
                log[last + 1..db].iter().any(|a| a.is_dma_store_barrier()),
                "{log:?}"
            );
        }
    }

    #[test]
    fn free_list_posting_and_terminator() {
        let (_pool, mut s) = srq(4, 2);
        let sg = [Sge {
            addr: 0x1000,
            length: 64,
            lkey: 0x300,
        }];
        let wrs: Vec<RecvWr> = (0..3)
            .map(|i| RecvWr {
                wr_id: 100 + i,
                sg_list: &sg,
            })
            .collect();
        s.post_recv(&wrs).unwrap();
        assert_eq!(s.db.read(0), 3, "doorbell record counts WQEs posted");
        // WQE 0: next index 1, one data segment, then the terminator.
        let b = s.wqe_offset(0);
        assert_eq!(s.buf.read_be16(b + 2), 1);
        assert_eq!(s.buf.read_be32(b + 16), 64);
        assert_eq!(s.buf.read_be32(b + 20), 0x300);
        assert_eq!(s.buf.read_be64(b + 24), 0x1000);
        assert_eq!(s.buf.read_be32(b + 32), 0);
        assert_eq!(s.buf.read_be32(b + 36), wqe::INVALID_LKEY);
        // Four WQEs, one kept as the tail: the fourth post is refused.
        let e = s
            .post_recv(&[RecvWr {
                wr_id: 9,
                sg_list: &sg,
            }])
            .unwrap_err();
        assert_eq!(
            e,
            PostError {
                err: PostFault::QueueFull,
                bad_wr: 0
            }
        );
        // Completing WQE 1 links it after the tail (WQE 3); the next post
        // takes WQE 3 and leaves WQE 1 as the new tail, so the SRQ is full
        // again.
        assert_eq!(s.take_wqe(1), Ok(101));
        assert!(s.take_wqe(1).is_err(), "a WQE completes once");
        assert!(
            s.take_wqe(77).is_err(),
            "out-of-range index from the device"
        );
        s.post_recv(&wrs[..1]).unwrap();
        assert_eq!(s.wrid[3], 100);
        assert_eq!((s.head, s.tail), (1, 1));
        assert_eq!(s.outstanding(), 3);
        assert_eq!(
            s.post_recv(&wrs[1..2]).unwrap_err().error(),
            Error::QueueFull
        );
        let too_many = [sg[0]; 3];
        let e = s
            .post_recv(&[RecvWr {
                wr_id: 1,
                sg_list: &too_many,
            }])
            .unwrap_err();
        assert!(matches!(e.error(), Error::Inval(_)));
    }
}
