//! EQ context, EQE layout, event types and the async event mask (Linux `eq.c`, `device.h`).
//!
//! Left out: 64-byte EQEs and the payloads of the SR-IOV event types.

use hal::be::*;

/// Size of an EQE (`MLX4_EQ_ENTRY_SIZE`; 64-byte EQEs stay disabled).
pub const EQ_ENTRY_SIZE: usize = 32;
/// `MLX4_NUM_ASYNC_EQE`.
pub const NUM_ASYNC_EQE: u32 = 0x100;
/// `MLX4_NUM_SPARE_EQE`: the consumer index must be written back at least
/// this often.
pub const NUM_SPARE_EQE: u32 = 0x80;

/// EQ context flags (`MLX4_EQ_STATUS_OK`, `MLX4_EQ_STATE_ARMED`, ...).
pub mod flags {
    #![allow(missing_docs)]
    pub const STATUS_OK: u32 = 0 << 28;
    pub const STATUS_WRITE_FAIL: u32 = 0xa << 28;
    pub const OWNER_SW: u32 = 0 << 24;
    pub const OWNER_HW: u32 = 1 << 24;
    pub const FLAG_EC: u32 = 1 << 18;
    pub const FLAG_OI: u32 = 1 << 17;
    pub const STATE_ARMED: u32 = 9 << 8;
    pub const STATE_FIRED: u32 = 0xa << 8;
    pub const STATE_ALWAYS_ARMED: u32 = 0xb << 8;
}

/// The 64-byte EQ context (`struct mlx4_eq_context`, packed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct EqContext {
    pub flags: u32,
    pub page_offset: u16,
    pub log_eq_size: u8,
    pub eq_period: u8,
    pub eq_max_count: u8,
    pub intr: u8,
    pub log_page_size: u8,
    pub mtt_base_addr_h: u8,
    pub mtt_base_addr_l: u32,
    pub consumer_index: u32,
    pub producer_index: u32,
}

#[allow(missing_docs)]
impl EqContext {
    pub const SIZE: usize = 64;
    pub const FLAGS: usize = 0x00;
    pub const PAGE_OFFSET: usize = 0x0a;
    pub const LOG_EQ_SIZE: usize = 0x0c;
    pub const EQ_PERIOD: usize = 0x11;
    pub const EQ_MAX_COUNT: usize = 0x13;
    pub const INTR: usize = 0x17;
    pub const LOG_PAGE_SIZE: usize = 0x18;
    pub const MTT_BASE_ADDR_H: usize = 0x1b;
    pub const MTT_BASE_ADDR_L: usize = 0x1c;
    pub const CONSUMER_INDEX: usize = 0x28;
    pub const PRODUCER_INDEX: usize = 0x2c;

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        put_be32(&mut b, Self::FLAGS, self.flags);
        put_be16(&mut b, Self::PAGE_OFFSET, self.page_offset);
        put_u8(&mut b, Self::LOG_EQ_SIZE, self.log_eq_size);
        put_u8(&mut b, Self::EQ_PERIOD, self.eq_period);
        put_u8(&mut b, Self::EQ_MAX_COUNT, self.eq_max_count);
        put_u8(&mut b, Self::INTR, self.intr);
        put_u8(&mut b, Self::LOG_PAGE_SIZE, self.log_page_size);
        put_u8(&mut b, Self::MTT_BASE_ADDR_H, self.mtt_base_addr_h);
        put_be32(&mut b, Self::MTT_BASE_ADDR_L, self.mtt_base_addr_l);
        put_be32(&mut b, Self::CONSUMER_INDEX, self.consumer_index);
        put_be32(&mut b, Self::PRODUCER_INDEX, self.producer_index);
        b
    }

    pub fn from_bytes(b: &[u8]) -> Self {
        EqContext {
            flags: get_be32(b, Self::FLAGS),
            page_offset: get_be16(b, Self::PAGE_OFFSET),
            log_eq_size: get_u8(b, Self::LOG_EQ_SIZE),
            eq_period: get_u8(b, Self::EQ_PERIOD),
            eq_max_count: get_u8(b, Self::EQ_MAX_COUNT),
            intr: get_u8(b, Self::INTR),
            log_page_size: get_u8(b, Self::LOG_PAGE_SIZE),
            mtt_base_addr_h: get_u8(b, Self::MTT_BASE_ADDR_H),
            mtt_base_addr_l: get_be32(b, Self::MTT_BASE_ADDR_L),
            consumer_index: get_be32(b, Self::CONSUMER_INDEX),
            producer_index: get_be32(b, Self::PRODUCER_INDEX),
        }
    }
}

/// EQE field offsets (`struct mlx4_eqe`, 32-byte entries).
pub mod eqe {
    #![allow(missing_docs)]
    pub const TYPE: usize = 0x01;
    pub const SUBTYPE: usize = 0x03;
    /// Event data starts here (CQN/QPN/SRQN as BE32 & 0xffffff).
    pub const EVENT: usize = 0x04;
    /// CQ error syndrome (1 overrun, 2 access violation).
    pub const CQ_ERR_SYNDROME: usize = 0x0f;
    /// PORT_CHANGE: port = BE32 >> 28.
    pub const PORT_CHANGE_PORT: usize = 0x0c;
    /// PORT_MNG_CHG: port byte.
    pub const PORT_MNG_PORT: usize = 0x07;
    pub const SLAVE_ID: usize = 0x1c;
    pub const OWNER: usize = 0x1f;
    pub const OWNER_BIT: u8 = 0x80;
}

/// Event types (`enum mlx4_event`).
pub mod event {
    #![allow(missing_docs)]
    pub const COMP: u8 = 0x00;
    pub const PATH_MIG: u8 = 0x01;
    pub const COMM_EST: u8 = 0x02;
    pub const SQ_DRAINED: u8 = 0x03;
    pub const CQ_ERROR: u8 = 0x04;
    pub const WQ_CATAS_ERROR: u8 = 0x05;
    pub const EEC_CATAS_ERROR: u8 = 0x06;
    pub const PATH_MIG_FAILED: u8 = 0x07;
    pub const LOCAL_CATAS_ERROR: u8 = 0x08;
    pub const PORT_CHANGE: u8 = 0x09;
    pub const CMD: u8 = 0x0a;
    pub const ECC_DETECT: u8 = 0x0e;
    pub const EQ_OVERFLOW: u8 = 0x0f;
    pub const WQ_INVAL_REQ_ERROR: u8 = 0x10;
    pub const WQ_ACCESS_ERROR: u8 = 0x11;
    pub const SRQ_CATAS_ERROR: u8 = 0x12;
    pub const SRQ_QP_LAST_WQE: u8 = 0x13;
    pub const SRQ_LIMIT: u8 = 0x14;
    pub const COMM_CHANNEL: u8 = 0x18;
    pub const VEP_UPDATE: u8 = 0x19;
    pub const FATAL_WARNING: u8 = 0x1b;
    pub const FLR_EVENT: u8 = 0x1c;
    pub const PORT_MNG_CHG_EVENT: u8 = 0x1d;
    /// PORT_CHANGE subtypes.
    pub const PORT_CHANGE_SUBTYPE_DOWN: u8 = 1;
    pub const PORT_CHANGE_SUBTYPE_ACTIVE: u8 = 4;
}

/// `MLX4_ASYNC_EVENT_MASK`: the events MAP_EQ routes to the async EQ.
pub const ASYNC_EVENT_MASK: u64 = {
    use event::*;
    (1 << PATH_MIG)
        | (1 << COMM_EST)
        | (1 << SQ_DRAINED)
        | (1 << CQ_ERROR)
        | (1 << WQ_CATAS_ERROR)
        | (1 << EEC_CATAS_ERROR)
        | (1 << PATH_MIG_FAILED)
        | (1 << WQ_INVAL_REQ_ERROR)
        | (1 << WQ_ACCESS_ERROR)
        | (1 << PORT_CHANGE)
        | (1 << ECC_DETECT)
        | (1 << SRQ_CATAS_ERROR)
        | (1 << SRQ_QP_LAST_WQE)
        | (1 << SRQ_LIMIT)
        | (1 << CMD)
        | (1 << COMM_CHANNEL)
        | (1 << FLR_EVENT)
        | (1 << FATAL_WARNING)
};

/// MAP_EQ input modifier: bit 31 unmaps.
pub const fn map_eq_in_mod(eqn: u32, unmap: bool) -> u32 {
    ((unmap as u32) << 31) | eqn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_eq_context() {
        let c = EqContext {
            flags: flags::STATUS_OK | flags::STATE_ARMED,
            log_eq_size: 9,
            intr: 3,
            log_page_size: 0,
            mtt_base_addr_h: 0x12,
            mtt_base_addr_l: 0x3456_7800,
            consumer_index: 5,
            ..Default::default()
        };
        let b = c.to_bytes();
        let mut g = [0u8; 64];
        g[0x02] = 0x09;
        g[0x0c] = 9;
        g[0x17] = 3;
        g[0x1b] = 0x12;
        g[0x1c..0x20].copy_from_slice(&[0x34, 0x56, 0x78, 0x00]);
        g[0x2b] = 5;
        assert_eq!(b, g);
        assert_eq!(EqContext::from_bytes(&g), c);
    }

    #[test]
    fn async_mask_value() {
        // Bits 1-7, 9, 10, 14, 16-20, 24, 27, 28.
        assert_eq!(ASYNC_EVENT_MASK, 0x0000_0000_191f_46fe);
        assert_eq!(map_eq_in_mod(5, true), 0x8000_0005);
    }
}
