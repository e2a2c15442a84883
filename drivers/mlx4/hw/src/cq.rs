//! CQ context (Linux `struct mlx4_cq_context`, `cq.c`) and CQE owner-bit constants.
//!
//! Left out: the CQ resize and moderation payloads beyond the context.

use hal::be::*;

/// Size of a CQE (64-byte CQEs stay disabled).
pub const CQE_SIZE: usize = 32;
/// Offset of the owner/is_send/opcode byte in a CQE.
pub const CQE_OWNER_SR_OPCODE: usize = 0x1f;
/// Owner bit in that byte.
pub const CQE_OWNER_MASK: u8 = 0x80;

/// The 64-byte CQ context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct CqContext {
    pub flags: u32,
    pub page_offset: u16,
    pub logsize_usrpage: u32,
    pub cq_period: u16,
    pub cq_max_count: u16,
    pub comp_eqn: u8,
    pub log_page_size: u8,
    pub mtt_base_addr_h: u8,
    pub mtt_base_addr_l: u32,
    pub last_notified_index: u32,
    pub solicit_producer_index: u32,
    pub consumer_index: u32,
    pub producer_index: u32,
    pub db_rec_addr: u64,
}

#[allow(missing_docs)]
impl CqContext {
    pub const SIZE: usize = 64;
    pub const FLAGS: usize = 0x00;
    pub const PAGE_OFFSET: usize = 0x0a;
    pub const LOGSIZE_USRPAGE: usize = 0x0c;
    pub const CQ_PERIOD: usize = 0x10;
    pub const CQ_MAX_COUNT: usize = 0x12;
    pub const COMP_EQN: usize = 0x17;
    pub const LOG_PAGE_SIZE: usize = 0x18;
    pub const MTT_BASE_ADDR_H: usize = 0x1b;
    pub const MTT_BASE_ADDR_L: usize = 0x1c;
    pub const LAST_NOTIFIED_INDEX: usize = 0x20;
    pub const SOLICIT_PRODUCER_INDEX: usize = 0x24;
    pub const CONSUMER_INDEX: usize = 0x28;
    pub const PRODUCER_INDEX: usize = 0x2c;
    pub const DB_REC_ADDR: usize = 0x38;
    /// flags bit 18: collapsed CQ.
    pub const FLAG_CC: u32 = 1 << 18;
    /// flags bit 19: timestamps.
    pub const FLAG_TS: u32 = 1 << 19;

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        put_be32(&mut b, Self::FLAGS, self.flags);
        put_be16(&mut b, Self::PAGE_OFFSET, self.page_offset);
        put_be32(&mut b, Self::LOGSIZE_USRPAGE, self.logsize_usrpage);
        put_be16(&mut b, Self::CQ_PERIOD, self.cq_period);
        put_be16(&mut b, Self::CQ_MAX_COUNT, self.cq_max_count);
        put_u8(&mut b, Self::COMP_EQN, self.comp_eqn);
        put_u8(&mut b, Self::LOG_PAGE_SIZE, self.log_page_size);
        put_u8(&mut b, Self::MTT_BASE_ADDR_H, self.mtt_base_addr_h);
        put_be32(&mut b, Self::MTT_BASE_ADDR_L, self.mtt_base_addr_l);
        put_be32(&mut b, Self::LAST_NOTIFIED_INDEX, self.last_notified_index);
        put_be32(
            &mut b,
            Self::SOLICIT_PRODUCER_INDEX,
            self.solicit_producer_index,
        );
        put_be32(&mut b, Self::CONSUMER_INDEX, self.consumer_index);
        put_be32(&mut b, Self::PRODUCER_INDEX, self.producer_index);
        put_be64(&mut b, Self::DB_REC_ADDR, self.db_rec_addr);
        b
    }

    pub fn from_bytes(b: &[u8]) -> Self {
        CqContext {
            flags: get_be32(b, Self::FLAGS),
            page_offset: get_be16(b, Self::PAGE_OFFSET),
            logsize_usrpage: get_be32(b, Self::LOGSIZE_USRPAGE),
            cq_period: get_be16(b, Self::CQ_PERIOD),
            cq_max_count: get_be16(b, Self::CQ_MAX_COUNT),
            comp_eqn: get_u8(b, Self::COMP_EQN),
            log_page_size: get_u8(b, Self::LOG_PAGE_SIZE),
            mtt_base_addr_h: get_u8(b, Self::MTT_BASE_ADDR_H),
            mtt_base_addr_l: get_be32(b, Self::MTT_BASE_ADDR_L),
            last_notified_index: get_be32(b, Self::LAST_NOTIFIED_INDEX),
            solicit_producer_index: get_be32(b, Self::SOLICIT_PRODUCER_INDEX),
            consumer_index: get_be32(b, Self::CONSUMER_INDEX),
            producer_index: get_be32(b, Self::PRODUCER_INDEX),
            db_rec_addr: get_be64(b, Self::DB_REC_ADDR),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_cq_context() {
        let c = CqContext {
            logsize_usrpage: (8 << 24) | 0x81,
            comp_eqn: 0x41,
            log_page_size: 1,
            mtt_base_addr_h: 0,
            mtt_base_addr_l: 0x800,
            db_rec_addr: 0x1_0000_2040,
            ..Default::default()
        };
        let mut g = [0u8; 64];
        g[0x0c..0x10].copy_from_slice(&[8, 0, 0, 0x81]);
        g[0x17] = 0x41;
        g[0x18] = 1;
        g[0x1c..0x20].copy_from_slice(&[0, 0, 8, 0]);
        g[0x38..0x40].copy_from_slice(&[0, 0, 0, 1, 0, 0, 0x20, 0x40]);
        assert_eq!(c.to_bytes(), g);
        assert_eq!(CqContext::from_bytes(&g), c);
    }
}
