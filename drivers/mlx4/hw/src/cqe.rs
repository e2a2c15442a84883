//! The 32-byte completion-queue entry and its error form (Linux `include/linux/mlx4/cq.h`: `struct mlx4_cqe`, `struct mlx4_err_cqe`, `MLX4_CQE_*`).
//!
//! With the opcode and syndrome values. Left out: the Ethernet checksum/VLAN
//! fields and the 64-byte CQE layout (64-byte CQEs stay disabled).

use hal::be::*;

/// Size of a CQE.
pub const SIZE: usize = 32;
/// BE32 bits 23:0 local (real) QPN, bit 29 VLAN present.
pub const VLAN_MY_QPN: usize = 0x00;
/// `vlan_my_qpn` bit 29: the frame carried a C-VLAN tag, stripped; its TCI
/// is in [`SL_VID`] (`MLX4_CQE_CVLAN_PRESENT_MASK`).
pub const CVLAN_PRESENT: u32 = 1 << 29;
/// The VLAN id bits of the TCI in [`SL_VID`] (`MLX4_CQE_VID_MASK`).
pub const VID_MASK: u16 = 0xfff;
/// BE32 immediate / invalidated rkey; UD receive: bits 6:0 P_Key index.
pub const IMMED_RSS_INVALID: usize = 0x04;
/// BE32 bit 31 GRH, bits 30:24 DLID path bits, bits 23:0 remote QPN.
pub const G_MLPATH_RQPN: usize = 0x08;
/// BE16 bits 15:12 SL.
pub const SL_VID: usize = 0x0c;
/// BE16 source LID.
pub const RLID: usize = 0x0e;
/// BE16 checksum status flags.
pub const STATUS: usize = 0x10;
/// BE32 byte count (receives, RDMA READ).
pub const BYTE_CNT: usize = 0x14;
/// BE16 counter of the completed WQE.
pub const WQE_INDEX: usize = 0x18;
/// BE16 checksum.
pub const CHECKSUM: usize = 0x1a;
/// u8 error CQE: vendor syndrome.
pub const VENDOR_ERR_SYNDROME: usize = 0x1a;
/// u8 error CQE: syndrome.
pub const SYNDROME: usize = 0x1b;
/// u8 bit 7 owner, bit 6 is-send, bits 4:0 opcode.
pub const OWNER_SR_OPCODE: usize = 0x1f;

/// Owner bit of `owner_sr_opcode`.
pub const OWNER_MASK: u8 = 0x80;
/// Send/receive bit of `owner_sr_opcode`.
pub const IS_SEND_MASK: u8 = 0x40;
/// Opcode bits of `owner_sr_opcode`.
pub const OPCODE_MASK: u8 = 0x1f;
/// QPN bits of `vlan_my_qpn`.
pub const QPN_MASK: u32 = 0xff_ffff;

/// Opcode of an error CQE (`MLX4_CQE_OPCODE_ERROR`).
pub const OPCODE_ERROR: u8 = 0x1e;
/// Opcode of a resize CQE (`MLX4_CQE_OPCODE_RESIZE`).
pub const OPCODE_RESIZE: u8 = 0x16;

/// Receive opcodes (`MLX4_RECV_OPCODE_*`).
pub mod recv_opcode {
    #![allow(missing_docs)]
    pub const RDMA_WRITE_IMM: u8 = 0x00;
    pub const SEND: u8 = 0x01;
    pub const SEND_IMM: u8 = 0x02;
    pub const SEND_INVAL: u8 = 0x03;
}

/// Error syndromes (`MLX4_CQE_SYNDROME_*`).
pub mod syndrome {
    #![allow(missing_docs)]
    pub const LOCAL_LENGTH_ERR: u8 = 0x01;
    pub const LOCAL_QP_OP_ERR: u8 = 0x02;
    pub const LOCAL_PROT_ERR: u8 = 0x04;
    pub const WR_FLUSH_ERR: u8 = 0x05;
    pub const MW_BIND_ERR: u8 = 0x06;
    pub const BAD_RESP_ERR: u8 = 0x10;
    pub const LOCAL_ACCESS_ERR: u8 = 0x11;
    pub const REMOTE_INVAL_REQ_ERR: u8 = 0x12;
    pub const REMOTE_ACCESS_ERR: u8 = 0x13;
    pub const REMOTE_OP_ERR: u8 = 0x14;
    pub const TRANSPORT_RETRY_EXC_ERR: u8 = 0x15;
    pub const RNR_RETRY_EXC_ERR: u8 = 0x16;
    pub const REMOTE_ABORTED_ERR: u8 = 0x22;
}

/// A CQE as plain data (for tests and for building CQEs in a model of
/// the hardware; the driver's poll loop reads fields in place).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Cqe {
    pub vlan_my_qpn: u32,
    pub immed_rss_invalid: u32,
    pub g_mlpath_rqpn: u32,
    pub sl_vid: u16,
    pub rlid: u16,
    pub status: u16,
    pub byte_cnt: u32,
    pub wqe_index: u16,
    pub checksum: u16,
    pub owner_sr_opcode: u8,
}

impl Cqe {
    /// The wire bytes. For an error CQE, `checksum` carries the vendor
    /// syndrome (high byte) and the syndrome (low byte).
    pub fn to_bytes(&self) -> [u8; SIZE] {
        let mut b = [0u8; SIZE];
        put_be32(&mut b, VLAN_MY_QPN, self.vlan_my_qpn);
        put_be32(&mut b, IMMED_RSS_INVALID, self.immed_rss_invalid);
        put_be32(&mut b, G_MLPATH_RQPN, self.g_mlpath_rqpn);
        put_be16(&mut b, SL_VID, self.sl_vid);
        put_be16(&mut b, RLID, self.rlid);
        put_be16(&mut b, STATUS, self.status);
        put_be32(&mut b, BYTE_CNT, self.byte_cnt);
        put_be16(&mut b, WQE_INDEX, self.wqe_index);
        put_be16(&mut b, CHECKSUM, self.checksum);
        put_u8(&mut b, OWNER_SR_OPCODE, self.owner_sr_opcode);
        b
    }

    /// Decodes the wire bytes.
    pub fn from_bytes(b: &[u8; SIZE]) -> Cqe {
        Cqe {
            vlan_my_qpn: get_be32(b, VLAN_MY_QPN),
            immed_rss_invalid: get_be32(b, IMMED_RSS_INVALID),
            g_mlpath_rqpn: get_be32(b, G_MLPATH_RQPN),
            sl_vid: get_be16(b, SL_VID),
            rlid: get_be16(b, RLID),
            status: get_be16(b, STATUS),
            byte_cnt: get_be32(b, BYTE_CNT),
            wqe_index: get_be16(b, WQE_INDEX),
            checksum: get_be16(b, CHECKSUM),
            owner_sr_opcode: get_u8(b, OWNER_SR_OPCODE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_cqe() {
        let c = Cqe {
            vlan_my_qpn: 0x48,
            immed_rss_invalid: 0x1122_3344,
            g_mlpath_rqpn: (1 << 31) | (0x05 << 24) | 0x01,
            sl_vid: 3 << 12,
            rlid: 0x0007,
            byte_cnt: 296,
            wqe_index: 0x0102,
            owner_sr_opcode: OWNER_MASK | recv_opcode::SEND,
            ..Default::default()
        };
        let mut g = [0u8; 32];
        g[0..4].copy_from_slice(&[0, 0, 0, 0x48]);
        g[4..8].copy_from_slice(&[0x11, 0x22, 0x33, 0x44]);
        g[8..12].copy_from_slice(&[0x85, 0, 0, 1]);
        g[12..14].copy_from_slice(&[0x30, 0]);
        g[14..16].copy_from_slice(&[0, 7]);
        g[20..24].copy_from_slice(&[0, 0, 1, 0x28]);
        g[24..26].copy_from_slice(&[1, 2]);
        g[31] = 0x81;
        assert_eq!(c.to_bytes(), g);
        assert_eq!(Cqe::from_bytes(&g), c);
        // Error CQE: syndrome at 0x1b, vendor syndrome at 0x1a.
        let e = Cqe {
            checksum: 0x3205,
            owner_sr_opcode: OPCODE_ERROR,
            ..Default::default()
        };
        let b = e.to_bytes();
        assert_eq!((b[VENDOR_ERR_SYNDROME], b[SYNDROME]), (0x32, 0x05));
    }
}
