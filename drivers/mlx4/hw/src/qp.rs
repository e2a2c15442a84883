//! QP states, transition opcodes, modify parameters and the QP context (Linux `include/linux/mlx4/qp.h`, `qp.c`).
//!
//! Left out of the typed context: the RSS, Ethernet (VLAN/MAC) and SR-IOV
//! fields.

use crate::cmd::Opcode;
use hal::be::*;

/// QP states (`enum mlx4_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum QpState {
    Rst = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Sqer = 4,
    Sqd = 5,
    Err = 6,
}

/// Linux `__mlx4_qp_modify`'s `op[cur][new]` table: the command for a legal
/// transition, `None` for an illegal one.
pub const fn transition(cur: QpState, new: QpState) -> Option<Opcode> {
    use QpState::*;
    match (cur, new) {
        (_, Rst) => Some(Opcode::QP_2RST),
        (_, Err) => Some(Opcode::QP_2ERR),
        (Rst, Init) => Some(Opcode::RST2INIT_QP),
        (Init, Init) => Some(Opcode::INIT2INIT_QP),
        (Init, Rtr) => Some(Opcode::INIT2RTR_QP),
        (Rtr, Rts) => Some(Opcode::RTR2RTS_QP),
        (Rts, Rts) => Some(Opcode::RTS2RTS_QP),
        (Rts, Sqd) => Some(Opcode::RTS2SQD_QP),
        (Sqd, Rts) => Some(Opcode::SQD2RTS_QP),
        (Sqd, Sqd) => Some(Opcode::SQD2SQD_QP),
        (Sqer, Rts) => Some(Opcode::SQERR2RTS_QP),
        _ => None,
    }
}

/// Service types in the context flags (bits 23:16).
pub mod st {
    #![allow(missing_docs)]
    pub const RC: u32 = 0x0;
    pub const UC: u32 = 0x1;
    pub const RD: u32 = 0x2;
    pub const UD: u32 = 0x3;
    pub const XRC: u32 = 0x6;
    pub const MLX: u32 = 0x7;
}

/// Address path (44 bytes, `struct mlx4_qp_path`), IB fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct QpPath {
    pub fl: u8,
    pub disable_pkey_check: u8,
    pub pkey_index: u8,
    pub counter_index: u8,
    pub grh_mylmc: u8,
    pub rlid: u16,
    pub ackto: u8,
    pub mgid_index: u8,
    pub static_rate: u8,
    pub hop_limit: u8,
    pub tclass_flowlabel: u32,
    pub rgid: [u8; 16],
    pub sched_queue: u8,
    /// VLAN table index (Ethernet; valid with `fl` bit 6).
    pub vlan_index: u8,
    /// Destination MAC (Ethernet: RoCE).
    pub dmac: [u8; 6],
}

#[allow(missing_docs)]
impl QpPath {
    pub const SIZE: usize = 44;
    fn get(b: &[u8], o: usize) -> QpPath {
        let mut rgid = [0u8; 16];
        rgid.copy_from_slice(&b[o + 0x10..o + 0x20]);
        let mut dmac = [0u8; 6];
        dmac.copy_from_slice(&b[o + 0x26..o + 0x2c]);
        QpPath {
            fl: get_u8(b, o),
            disable_pkey_check: get_u8(b, o + 0x02),
            pkey_index: get_u8(b, o + 0x03),
            counter_index: get_u8(b, o + 0x04),
            grh_mylmc: get_u8(b, o + 0x05),
            rlid: get_be16(b, o + 0x06),
            ackto: get_u8(b, o + 0x08),
            mgid_index: get_u8(b, o + 0x09),
            static_rate: get_u8(b, o + 0x0a),
            hop_limit: get_u8(b, o + 0x0b),
            tclass_flowlabel: get_be32(b, o + 0x0c),
            rgid,
            sched_queue: get_u8(b, o + 0x20),
            vlan_index: get_u8(b, o + 0x21),
            dmac,
        }
    }
    fn put(&self, b: &mut [u8], o: usize) {
        put_u8(b, o, self.fl);
        put_u8(b, o + 0x02, self.disable_pkey_check);
        put_u8(b, o + 0x03, self.pkey_index);
        put_u8(b, o + 0x04, self.counter_index);
        put_u8(b, o + 0x05, self.grh_mylmc);
        put_be16(b, o + 0x06, self.rlid);
        put_u8(b, o + 0x08, self.ackto);
        put_u8(b, o + 0x09, self.mgid_index);
        put_u8(b, o + 0x0a, self.static_rate);
        put_u8(b, o + 0x0b, self.hop_limit);
        put_be32(b, o + 0x0c, self.tclass_flowlabel);
        b[o + 0x10..o + 0x20].copy_from_slice(&self.rgid);
        put_u8(b, o + 0x20, self.sched_queue);
        put_u8(b, o + 0x21, self.vlan_index);
        b[o + 0x26..o + 0x2c].copy_from_slice(&self.dmac);
    }
}

/// The 248-byte QP context (`struct mlx4_qp_context`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct QpContext {
    pub flags: u32,
    pub pd: u32,
    pub mtu_msgmax: u8,
    pub rq_size_stride: u8,
    pub sq_size_stride: u8,
    pub rlkey: u8,
    pub usr_page: u32,
    pub local_qpn: u32,
    pub remote_qpn: u32,
    pub pri_path: QpPath,
    pub alt_path: QpPath,
    pub params1: u32,
    pub next_send_psn: u32,
    pub cqn_send: u32,
    pub last_acked_psn: u32,
    pub ssn: u32,
    pub params2: u32,
    pub rnr_nextrecvpsn: u32,
    pub xrcd: u32,
    pub cqn_recv: u32,
    pub db_rec_addr: u64,
    pub qkey: u32,
    pub srqn: u32,
    pub msn: u32,
    pub rq_wqe_counter: u16,
    pub sq_wqe_counter: u16,
    pub param3: u32,
    pub log_page_size: u8,
    pub mtt_base_addr_h: u8,
    pub mtt_base_addr_l: u32,
}

#[allow(missing_docs)]
impl QpContext {
    pub const SIZE: usize = 248;
    pub const LOCAL_QPN: usize = 0x10;
    pub const PRI_PATH: usize = 0x18;
    pub const ALT_PATH: usize = 0x44;
    pub const LOG_PAGE_SIZE: usize = 0xc8;
    pub const MTT_BASE_ADDR_H: usize = 0xcb;
    pub const MTT_BASE_ADDR_L: usize = 0xcc;

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        put_be32(&mut b, 0x00, self.flags);
        put_be32(&mut b, 0x04, self.pd);
        put_u8(&mut b, 0x08, self.mtu_msgmax);
        put_u8(&mut b, 0x09, self.rq_size_stride);
        put_u8(&mut b, 0x0a, self.sq_size_stride);
        put_u8(&mut b, 0x0b, self.rlkey);
        put_be32(&mut b, 0x0c, self.usr_page);
        put_be32(&mut b, Self::LOCAL_QPN, self.local_qpn);
        put_be32(&mut b, 0x14, self.remote_qpn);
        self.pri_path.put(&mut b, Self::PRI_PATH);
        self.alt_path.put(&mut b, Self::ALT_PATH);
        put_be32(&mut b, 0x70, self.params1);
        put_be32(&mut b, 0x78, self.next_send_psn);
        put_be32(&mut b, 0x7c, self.cqn_send);
        put_be32(&mut b, 0x88, self.last_acked_psn);
        put_be32(&mut b, 0x8c, self.ssn);
        put_be32(&mut b, 0x90, self.params2);
        put_be32(&mut b, 0x94, self.rnr_nextrecvpsn);
        put_be32(&mut b, 0x98, self.xrcd);
        put_be32(&mut b, 0x9c, self.cqn_recv);
        put_be64(&mut b, 0xa0, self.db_rec_addr);
        put_be32(&mut b, 0xa8, self.qkey);
        put_be32(&mut b, 0xac, self.srqn);
        put_be32(&mut b, 0xb0, self.msn);
        put_be16(&mut b, 0xb4, self.rq_wqe_counter);
        put_be16(&mut b, 0xb6, self.sq_wqe_counter);
        put_be32(&mut b, 0xc0, self.param3);
        put_u8(&mut b, Self::LOG_PAGE_SIZE, self.log_page_size);
        put_u8(&mut b, Self::MTT_BASE_ADDR_H, self.mtt_base_addr_h);
        put_be32(&mut b, Self::MTT_BASE_ADDR_L, self.mtt_base_addr_l);
        b
    }
}

impl QpContext {
    /// Decodes a context (QUERY_QP output at mailbox offset 8).
    pub fn from_bytes(b: &[u8]) -> QpContext {
        QpContext {
            flags: get_be32(b, 0x00),
            pd: get_be32(b, 0x04),
            mtu_msgmax: get_u8(b, 0x08),
            rq_size_stride: get_u8(b, 0x09),
            sq_size_stride: get_u8(b, 0x0a),
            rlkey: get_u8(b, 0x0b),
            usr_page: get_be32(b, 0x0c),
            local_qpn: get_be32(b, Self::LOCAL_QPN),
            remote_qpn: get_be32(b, 0x14),
            pri_path: QpPath::get(b, Self::PRI_PATH),
            alt_path: QpPath::get(b, Self::ALT_PATH),
            params1: get_be32(b, 0x70),
            next_send_psn: get_be32(b, 0x78),
            cqn_send: get_be32(b, 0x7c),
            last_acked_psn: get_be32(b, 0x88),
            ssn: get_be32(b, 0x8c),
            params2: get_be32(b, 0x90),
            rnr_nextrecvpsn: get_be32(b, 0x94),
            xrcd: get_be32(b, 0x98),
            cqn_recv: get_be32(b, 0x9c),
            db_rec_addr: get_be64(b, 0xa0),
            qkey: get_be32(b, 0xa8),
            srqn: get_be32(b, 0xac),
            msn: get_be32(b, 0xb0),
            rq_wqe_counter: get_be16(b, 0xb4),
            sq_wqe_counter: get_be16(b, 0xb6),
            param3: get_be32(b, 0xc0),
            log_page_size: get_u8(b, Self::LOG_PAGE_SIZE),
            mtt_base_addr_h: get_u8(b, Self::MTT_BASE_ADDR_H),
            mtt_base_addr_l: get_be32(b, Self::MTT_BASE_ADDR_L),
        }
    }

    /// The state in the flags (bits 31:28), if valid.
    pub fn state(&self) -> Option<QpState> {
        use QpState::*;
        [Rst, Init, Rtr, Rts, Sqer, Sqd, Err]
            .get((self.flags >> 28) as usize)
            .copied()
    }
}

/// Modify-QP mailbox: BE32 optpar at 0, the context at 8.
pub const QP_MODIFY_CONTEXT_OFFSET: usize = 8;

/// `enum mlx4_qp_optpar`: the fields of a modify the firmware should take
/// (the mailbox's first dword).
pub mod optpar {
    #![allow(missing_docs)]
    pub const ALT_ADDR_PATH: u32 = 1 << 0;
    pub const RRE: u32 = 1 << 1;
    pub const RAE: u32 = 1 << 2;
    pub const RWE: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const Q_KEY: u32 = 1 << 5;
    pub const RNR_TIMEOUT: u32 = 1 << 6;
    pub const PRIMARY_ADDR_PATH: u32 = 1 << 7;
    pub const SRA_MAX: u32 = 1 << 8;
    pub const RRA_MAX: u32 = 1 << 9;
    pub const PM_STATE: u32 = 1 << 10;
    pub const RETRY_COUNT: u32 = 1 << 12;
    pub const RNR_RETRY: u32 = 1 << 13;
    pub const ACK_TIMEOUT: u32 = 1 << 14;
    pub const SCHED_QUEUE: u32 = 1 << 16;
    pub const COUNTER_INDEX: u32 = 1 << 20;
}

/// `MLX4_QP_PM_MIGRATED`: the path-migration state of the context flags
/// (bits 12:11).
pub const PM_MIGRATED: u32 = 3;

/// Bits of the context's `params2` (`MLX4_QP_BIT_*`): remote read, write
/// and atomic enable, and receives through an SRQ.
pub mod params2 {
    #![allow(missing_docs)]
    pub const RRE: u32 = 1 << 15;
    pub const RWE: u32 = 1 << 14;
    pub const RAE: u32 = 1 << 13;
    pub const RIC: u32 = 1 << 4;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_table() {
        use QpState::*;
        assert_eq!(transition(Rst, Init), Some(Opcode::RST2INIT_QP));
        assert_eq!(transition(Rts, Rst), Some(Opcode::QP_2RST));
        assert_eq!(transition(Init, Err), Some(Opcode::QP_2ERR));
        assert_eq!(transition(Rst, Rtr), None);
        assert_eq!(transition(Err, Rts), None);
    }

    #[test]
    fn golden_qp_context() {
        let c = QpContext {
            flags: (st::UD << 16) | (3 << 11),
            pd: 7,
            mtu_msgmax: (5 << 5) | 12,
            local_qpn: 0x48,
            pri_path: QpPath {
                pkey_index: 1,
                sched_queue: 0x83,
                rlid: 0x1234,
                ..Default::default()
            },
            qkey: 0x8001_0000,
            log_page_size: 0,
            mtt_base_addr_l: 0x40,
            ..Default::default()
        };
        let b = c.to_bytes();
        assert_eq!(b[0..4], [0, 3, 0x18, 0]);
        assert_eq!(b[4..8], [0, 0, 0, 7]);
        assert_eq!(b[8], 0xac);
        assert_eq!(b[0x10..0x14], [0, 0, 0, 0x48]);
        assert_eq!(b[0x18 + 3], 1);
        assert_eq!(b[0x18 + 6..0x18 + 8], [0x12, 0x34]);
        assert_eq!(b[0x18 + 0x20], 0x83);
        assert_eq!(b[0xa8..0xac], [0x80, 1, 0, 0]);
        assert_eq!(b[0xcc..0xd0], [0, 0, 0, 0x40]);
        assert_eq!(QpContext::from_bytes(&b), c);
        assert_eq!(c.state(), Some(QpState::Rst));
    }
}
