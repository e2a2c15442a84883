//! SRQ context (Linux `struct mlx4_srq_context`, `srq.c`).
//!
//! ARM_SRQ limits and XRC are carried as plain fields only.

use hal::be::*;

/// The 48-byte SRQ context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct SrqContext {
    pub state_logsize_srqn: u32,
    pub logstride: u8,
    pub xrcd: u16,
    pub pg_offset_cqn: u32,
    pub log_page_size: u8,
    pub mtt_base_addr_h: u8,
    pub mtt_base_addr_l: u32,
    pub pd: u32,
    pub limit_watermark: u16,
    pub wqe_cnt: u16,
    pub wqe_counter: u16,
    pub db_rec_addr: u64,
}

#[allow(missing_docs)]
impl SrqContext {
    pub const SIZE: usize = 0x30;
    pub const STATE_LOGSIZE_SRQN: usize = 0x00;
    pub const LOGSTRIDE: usize = 0x04;
    pub const XRCD: usize = 0x06;
    pub const PG_OFFSET_CQN: usize = 0x08;
    pub const LOG_PAGE_SIZE: usize = 0x10;
    pub const MTT_BASE_ADDR_H: usize = 0x13;
    pub const MTT_BASE_ADDR_L: usize = 0x14;
    pub const PD: usize = 0x18;
    pub const LIMIT_WATERMARK: usize = 0x1c;
    pub const WQE_CNT: usize = 0x1e;
    pub const WQE_COUNTER: usize = 0x22;
    pub const DB_REC_ADDR: usize = 0x28;

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        put_be32(&mut b, Self::STATE_LOGSIZE_SRQN, self.state_logsize_srqn);
        put_u8(&mut b, Self::LOGSTRIDE, self.logstride);
        put_be16(&mut b, Self::XRCD, self.xrcd);
        put_be32(&mut b, Self::PG_OFFSET_CQN, self.pg_offset_cqn);
        put_u8(&mut b, Self::LOG_PAGE_SIZE, self.log_page_size);
        put_u8(&mut b, Self::MTT_BASE_ADDR_H, self.mtt_base_addr_h);
        put_be32(&mut b, Self::MTT_BASE_ADDR_L, self.mtt_base_addr_l);
        put_be32(&mut b, Self::PD, self.pd);
        put_be16(&mut b, Self::LIMIT_WATERMARK, self.limit_watermark);
        put_be16(&mut b, Self::WQE_CNT, self.wqe_cnt);
        put_be16(&mut b, Self::WQE_COUNTER, self.wqe_counter);
        put_be64(&mut b, Self::DB_REC_ADDR, self.db_rec_addr);
        b
    }

    pub fn from_bytes(b: &[u8]) -> Self {
        SrqContext {
            state_logsize_srqn: get_be32(b, Self::STATE_LOGSIZE_SRQN),
            logstride: get_u8(b, Self::LOGSTRIDE),
            xrcd: get_be16(b, Self::XRCD),
            pg_offset_cqn: get_be32(b, Self::PG_OFFSET_CQN),
            log_page_size: get_u8(b, Self::LOG_PAGE_SIZE),
            mtt_base_addr_h: get_u8(b, Self::MTT_BASE_ADDR_H),
            mtt_base_addr_l: get_be32(b, Self::MTT_BASE_ADDR_L),
            pd: get_be32(b, Self::PD),
            limit_watermark: get_be16(b, Self::LIMIT_WATERMARK),
            wqe_cnt: get_be16(b, Self::WQE_CNT),
            wqe_counter: get_be16(b, Self::WQE_COUNTER),
            db_rec_addr: get_be64(b, Self::DB_REC_ADDR),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_srq_context() {
        let c = SrqContext {
            state_logsize_srqn: (6 << 24) | 0x45,
            logstride: 2,
            pg_offset_cqn: 0x81,
            log_page_size: 0,
            mtt_base_addr_l: 0x100,
            pd: 3,
            db_rec_addr: 0x1_0000_0008,
            ..Default::default()
        };
        let mut g = [0u8; 0x30];
        g[0..4].copy_from_slice(&[6, 0, 0, 0x45]);
        g[4] = 2;
        g[0x0b] = 0x81;
        g[0x16] = 1;
        g[0x1b] = 3;
        g[0x28..0x30].copy_from_slice(&[0, 0, 0, 1, 0, 0, 0, 8]);
        assert_eq!(c.to_bytes(), g);
        assert_eq!(SrqContext::from_bytes(&g), c);
    }
}
