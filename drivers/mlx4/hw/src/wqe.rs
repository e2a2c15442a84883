//! Send and receive work-queue entry layouts (Linux `include/linux/mlx4/qp.h`: `struct mlx4_wqe_*_seg`, `struct mlx4_av`, `MLX4_OPCODE_*`, `MLX4_WQE_CTRL_*`).
//!
//! Control, remote-address, atomic, datagram (with the address vector), data,
//! inline, MLX and SRQ-next segments. Left out: the LSO, bind, fast-register
//! and local-invalidate segment bodies.
//!
//! Offsets are within each segment; every multi-byte field is big-endian.
//! The driver writes WQEs field by field in the order the hardware needs
//! (mlx4_ib `qp.rs`); these definitions only say where each field lives.

/// Send opcodes (`MLX4_OPCODE_*`), the low 5 bits of `owner_opcode`.
pub mod opcode {
    #![allow(missing_docs)]
    pub const NOP: u32 = 0x00;
    pub const SEND_INVAL: u32 = 0x01;
    pub const RDMA_WRITE: u32 = 0x08;
    pub const RDMA_WRITE_IMM: u32 = 0x09;
    pub const SEND: u32 = 0x0a;
    pub const SEND_IMM: u32 = 0x0b;
    pub const LSO: u32 = 0x0e;
    pub const RDMA_READ: u32 = 0x10;
    pub const ATOMIC_CS: u32 = 0x11;
    pub const ATOMIC_FA: u32 = 0x12;
    pub const MASKED_ATOMIC_CS: u32 = 0x14;
    pub const MASKED_ATOMIC_FA: u32 = 0x15;
    pub const BIND_MW: u32 = 0x18;
    pub const FMR: u32 = 0x19;
    pub const LOCAL_INVAL: u32 = 0x1b;
    pub const CONFIG_CMD: u32 = 0x1f;
}

/// Control segment (`struct mlx4_wqe_ctrl_seg`, 16 bytes).
pub mod ctrl {
    /// Size in bytes.
    pub const SIZE: usize = 16;
    /// BE32 owner bit, NEC, WQE counter, opcode.
    pub const OWNER_OPCODE: usize = 0x00;
    /// BE16 VLAN tag (Ethernet).
    pub const VLAN_TAG: usize = 0x04;
    /// u8 VLAN insert flag.
    pub const INS_VLAN: usize = 0x06;
    /// u8 fence bit and WQE size in 16-byte units.
    pub const FENCE_SIZE: usize = 0x07;
    /// BE32 completion/solicited/loopback flags (XRC: remote SRQN above).
    pub const SRCRB_FLAGS: usize = 0x08;
    /// BE32 immediate data or invalidated key.
    pub const IMM: usize = 0x0c;
    /// `owner_opcode` bit 31: owner (pass parity of the WQE index).
    pub const OWNER: u32 = 1 << 31;
    /// `owner_opcode` bit 29: no error completion (NOP pads).
    pub const NEC: u32 = 1 << 29;
    /// `ins_vlan` bit 6: insert the C-VLAN tag of `vlan_tag`
    /// (`MLX4_WQE_CTRL_INS_CVLAN`).
    pub const INS_CVLAN: u8 = 1 << 6;
    /// `fence_size` bit 6: fence.
    pub const FENCE: u8 = 1 << 6;
    /// `fence_size` bits 5:0: the DS count.
    pub const DS_MASK: u8 = 0x3f;
    /// `srcrb_flags` bits 3:2 = 3: generate a CQE (`MLX4_WQE_CTRL_CQ_UPDATE`).
    pub const CQ_UPDATE: u32 = 3 << 2;
    /// `srcrb_flags` bit 1: solicited event.
    pub const SOLICITED: u32 = 1 << 1;
    /// `srcrb_flags` bit 0: force loopback.
    pub const FORCE_LOOPBACK: u32 = 1 << 0;
    /// `srcrb_flags` bit 4: IP checksum offload.
    pub const IP_CSUM: u32 = 1 << 4;
    /// `srcrb_flags` bit 5: TCP/UDP checksum offload.
    pub const TCP_UDP_CSUM: u32 = 1 << 5;
    /// `srcrb_flags` bit 7: strong ordering.
    pub const STRONG_ORDER: u32 = 1 << 7;
}

/// Remote-address segment (`struct mlx4_wqe_raddr_seg`, 16 bytes).
pub mod raddr {
    /// Size in bytes.
    pub const SIZE: usize = 16;
    /// BE64 remote virtual address.
    pub const RADDR: usize = 0x00;
    /// BE32 remote key.
    pub const RKEY: usize = 0x08;
}

/// Atomic segment (`struct mlx4_wqe_atomic_seg`, 16 bytes).
pub mod atomic {
    /// Size in bytes.
    pub const SIZE: usize = 16;
    /// BE64 swap (compare-and-swap) or add (fetch-and-add) operand.
    pub const SWAP_ADD: usize = 0x00;
    /// BE64 compare operand.
    pub const COMPARE: usize = 0x08;
    /// Size of the masked variant (`struct mlx4_wqe_masked_atomic_seg`).
    pub const MASKED_SIZE: usize = 32;
    /// BE64 swap/add mask (masked variant).
    pub const SWAP_ADD_MASK: usize = 0x10;
    /// BE64 compare mask (masked variant).
    pub const COMPARE_MASK: usize = 0x18;
}

/// Address vector (`struct mlx4_av`, 32 bytes), inside a datagram segment
/// and built by `mlx4_ib_create_ah`.
pub mod av {
    /// Size in bytes.
    pub const SIZE: usize = 32;
    /// BE32 port << 24 | PD (bit 31 force loopback).
    pub const PORT_PD: usize = 0x00;
    /// u8 bit 7 GRH present | source path bits.
    pub const G_SLID: usize = 0x05;
    /// BE16 destination LID.
    pub const DLID: usize = 0x06;
    /// u8 source GID index.
    pub const GID_INDEX: usize = 0x09;
    /// u8 static rate (0 full, else IB rate + 5).
    pub const STAT_RATE: usize = 0x0a;
    /// u8 hop limit.
    pub const HOP_LIMIT: usize = 0x0b;
    /// BE32 SL << 28 | traffic class << 20 | flow label.
    pub const SL_TCLASS_FLOWLABEL: usize = 0x0c;
    /// 16-byte destination GID.
    pub const DGID: usize = 0x10;
    /// `g_slid` bit 7.
    pub const GRH: u8 = 1 << 7;
    /// `static_rate` offset added to `enum ib_rate` (`MLX4_STAT_RATE_OFFSET`).
    pub const STAT_RATE_OFFSET: u8 = 5;
}

/// Datagram segment (`struct mlx4_wqe_datagram_seg`, 48 bytes).
pub mod datagram {
    /// Size in bytes.
    pub const SIZE: usize = 48;
    /// The 32-byte address vector.
    pub const AV: usize = 0x00;
    /// BE32 destination QPN.
    pub const DQPN: usize = 0x20;
    /// BE32 Q_Key.
    pub const QKEY: usize = 0x24;
    /// BE16 VLAN (Ethernet).
    pub const VLAN: usize = 0x28;
    /// 6-byte MAC (Ethernet).
    pub const MAC: usize = 0x2a;
}

/// Data (scatter/gather) segment (`struct mlx4_wqe_data_seg`, 16 bytes).
pub mod data {
    /// Size in bytes.
    pub const SIZE: usize = 16;
    /// BE32 byte count (written last, behind a barrier, on sends).
    pub const BYTE_COUNT: usize = 0x00;
    /// BE32 local key.
    pub const LKEY: usize = 0x04;
    /// BE64 address.
    pub const ADDR: usize = 0x08;
}

/// Inline segment header (`struct mlx4_wqe_inline_seg`, 4 bytes, data follows).
pub mod inline {
    /// Header size in bytes.
    pub const SIZE: usize = 4;
    /// `byte_count` bit 31 marks an inline segment (`MLX4_INLINE_SEG`).
    pub const SEG: u32 = 1 << 31;
    /// An inline segment must not cross this boundary (`MLX4_INLINE_ALIGN`).
    pub const ALIGN: usize = 64;
}

/// MLX segment (`struct mlx4_wqe_mlx_seg`, 16 bytes) overlaying the control
/// segment of QP0/QP1 sends.
pub mod mlx {
    /// Size in bytes.
    pub const SIZE: usize = 16;
    /// u8 owner (bit 7).
    pub const OWNER: usize = 0x00;
    /// u8 opcode.
    pub const OPCODE: usize = 0x03;
    /// BE16 scheduling priority (Ethernet).
    pub const SCHED_PRIO: usize = 0x04;
    /// u8 DS count.
    pub const SIZE_DS: usize = 0x07;
    /// BE32 flags.
    pub const FLAGS: usize = 0x08;
    /// BE16 remote LID (followed by 2 reserved bytes).
    pub const RLID: usize = 0x0c;
    /// flags bit 17: send on VL15.
    pub const VL15: u32 = 1 << 17;
    /// flags bit 16: take the SLID from the header (permissive DLID).
    pub const SLR: u32 = 1 << 16;
    /// flags bit 4: the ICRC is in the payload.
    pub const ICRC: u32 = 1 << 4;
    /// flags: static rate, bits 15:12.
    pub const STAT_RATE_SHIFT: u32 = 12;
    /// flags: SL, bits 11:8.
    pub const SL_SHIFT: u32 = 8;
}

/// SRQ WQE header (`struct mlx4_wqe_srq_next_seg`, 16 bytes).
pub mod srq_next {
    /// Size in bytes.
    pub const SIZE: usize = 16;
    /// BE16 index of the next free WQE.
    pub const NEXT_WQE_INDEX: usize = 0x02;
}

/// `MLX4_INVALID_LKEY`: the lkey of a receive scatter terminator.
pub const INVALID_LKEY: u32 = 0x100;
/// First dword of every 64-byte chunk of an unused send WQE.
pub const STAMP: u32 = 0xffff_ffff;
/// Smallest send WQE stride (`MLX4_IB_SQ_MIN_WQE_SHIFT`).
pub const SQ_MIN_WQE_SHIFT: u32 = 6;
/// Prefetch headroom in bytes (`MLX4_IB_MAX_HEADROOM`).
pub const MAX_HEADROOM: u32 = 2048;
/// Spare WQEs at the smallest stride (`MLX4_IB_SQ_MAX_SPARE`).
pub const SQ_MAX_SPARE: u32 = (MAX_HEADROOM >> SQ_MIN_WQE_SHIFT) + 1;

/// The 32-byte address vector as plain data (built once per AH, copied into
/// every UD WQE).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Av {
    pub port_pd: u32,
    pub g_slid: u8,
    pub dlid: u16,
    pub gid_index: u8,
    pub stat_rate: u8,
    pub hop_limit: u8,
    pub sl_tclass_flowlabel: u32,
    pub dgid: [u8; 16],
}

impl Av {
    /// The wire bytes.
    pub fn to_bytes(&self) -> [u8; av::SIZE] {
        use hal::be::*;
        let mut b = [0u8; av::SIZE];
        put_be32(&mut b, av::PORT_PD, self.port_pd);
        put_u8(&mut b, av::G_SLID, self.g_slid);
        put_be16(&mut b, av::DLID, self.dlid);
        put_u8(&mut b, av::GID_INDEX, self.gid_index);
        put_u8(&mut b, av::STAT_RATE, self.stat_rate);
        put_u8(&mut b, av::HOP_LIMIT, self.hop_limit);
        put_be32(&mut b, av::SL_TCLASS_FLOWLABEL, self.sl_tclass_flowlabel);
        b[av::DGID..av::DGID + 16].copy_from_slice(&self.dgid);
        b
    }

    /// Decodes the wire bytes.
    pub fn from_bytes(b: &[u8; av::SIZE]) -> Av {
        use hal::be::*;
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&b[av::DGID..av::DGID + 16]);
        Av {
            port_pd: get_be32(b, av::PORT_PD),
            g_slid: get_u8(b, av::G_SLID),
            dlid: get_be16(b, av::DLID),
            gid_index: get_u8(b, av::GID_INDEX),
            stat_rate: get_u8(b, av::STAT_RATE),
            hop_limit: get_u8(b, av::HOP_LIMIT),
            sl_tclass_flowlabel: get_be32(b, av::SL_TCLASS_FLOWLABEL),
            dgid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_sizes_match_linux() {
        // sizeof() of the Linux structs.
        assert_eq!(ctrl::SIZE, 16);
        assert_eq!(raddr::SIZE + atomic::SIZE, 32);
        assert_eq!(atomic::MASKED_SIZE, 32);
        assert_eq!(datagram::SIZE, 48);
        assert_eq!(data::SIZE, 16);
        assert_eq!(SQ_MAX_SPARE, 33);
        // send_wqe_overhead(RC) = ctrl + masked atomic + raddr.
        assert_eq!(ctrl::SIZE + atomic::MASKED_SIZE + raddr::SIZE, 64);
    }

    #[test]
    fn golden_address_vector() {
        let a = Av {
            port_pd: (1 << 24) | 0x12,
            g_slid: av::GRH | 0x3,
            dlid: 0x0102,
            gid_index: 4,
            stat_rate: 7,
            hop_limit: 64,
            sl_tclass_flowlabel: (5 << 28) | (0xab << 20) | 0x12345,
            dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
        };
        let mut g = [0u8; 32];
        g[0..4].copy_from_slice(&[0x01, 0x00, 0x00, 0x12]);
        g[5] = 0x83;
        g[6..8].copy_from_slice(&[0x01, 0x02]);
        g[9] = 4;
        g[10] = 7;
        g[11] = 64;
        g[12..16].copy_from_slice(&[0x5a, 0xb1, 0x23, 0x45]);
        g[16..32].copy_from_slice(&a.dgid);
        assert_eq!(a.to_bytes(), g);
        assert_eq!(Av::from_bytes(&g), a);
    }
}
