//! The verbs types of mlx4_ib: ib_core's (`include/rdma/ib_verbs.h` as ib_core ports it) re-exported, plus this driver's send work request, which extends ib_core's with inline bytes, masked atomics and the driver's own address-handle handle; XRC, memory windows, fast-register and LSO work requests are left out.
//!
//! [`SendWr`] borrows its scatter list and its inline bytes, so posting
//! allocates nothing; ib_core's `SendWr` converts into it without copying
//! data ([`from_ib_send_wr`]).

pub use ib_core::verbs::{
    AccessFlags, AhAttr, Gid, GlobalRoute, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr,
    SendFlags, Sge, SigType, SrqAttr, SrqAttrMask, Wc, WcFlags, WcOpcode, WcStatus,
};

use crate::table::AhId;

/// Send opcodes (`enum ib_wr_opcode` of the 3.11 kernel's `ib_verbs.h`,
/// including the ones ib_core does not name yet). The kernel's values, not
/// libibverbs' `enum ibv_wr_opcode` (where SEND_WITH_INV is 9): LSO is 7,
/// SEND_WITH_INV 8, RDMA_READ_WITH_INV 9, LOCAL_INV 10, FAST_REG_MR 11.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum WrOpcode {
    RdmaWrite = 0,
    RdmaWriteWithImm = 1,
    Send = 2,
    SendWithImm = 3,
    RdmaRead = 4,
    AtomicCmpAndSwp = 5,
    AtomicFetchAndAdd = 6,
    SendWithInv = 8,
    MaskedAtomicCmpAndSwp = 12,
    MaskedAtomicFetchAndAdd = 13,
}

/// The opcode-specific part of a send work request (the `wr` union of
/// `struct ib_send_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WrDetail {
    /// Plain sends on RC/UC.
    #[default]
    None,
    /// RDMA WRITE/READ: `wr.rdma`.
    Rdma {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// Atomics: `wr.atomic`.
    Atomic {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Compare (CAS) or add (FAA) operand.
        compare_add: u64,
        /// Swap operand (CAS).
        swap: u64,
        /// Mask of the compare/add operand (masked atomics).
        compare_add_mask: u64,
        /// Mask of the swap operand (masked atomics).
        swap_mask: u64,
        /// Remote key.
        rkey: u32,
    },
    /// UD and QP0/QP1 sends: `wr.ud`.
    Ud {
        /// The address handle.
        ah: AhId,
        /// Destination QPN.
        remote_qpn: u32,
        /// Destination Q_Key (bit 31 set: use the QP's own Q_Key).
        remote_qkey: u32,
        /// P_Key index (QP1 only).
        pkey_index: u16,
    },
}

/// A send work request (`struct ib_send_wr`, one element of the list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub opcode: WrOpcode,
    /// `IB_SEND_*` flags.
    pub send_flags: SendFlags,
    /// Gather list (ignored when `IB_SEND_INLINE` is set).
    pub sg_list: &'a [Sge],
    /// Data copied into the WQE when `IB_SEND_INLINE` is set (Linux reads
    /// it through the scatter list's kernel addresses; a safe port needs the
    /// bytes themselves).
    pub inline_data: &'a [u8],
    /// Immediate data (`ex.imm_data`, wire order read as a `u32`) or the
    /// rkey to invalidate (`ex.invalidate_rkey`).
    pub imm_data: u32,
    /// Opcode-specific fields.
    pub wr: WrDetail,
}

impl Default for SendWr<'_> {
    fn default() -> Self {
        SendWr {
            wr_id: 0,
            opcode: WrOpcode::Send,
            send_flags: SendFlags::empty(),
            sg_list: &[],
            inline_data: &[],
            imm_data: 0,
            wr: WrDetail::None,
        }
    }
}

/// ib_core's send work request as this driver's (no data is copied). An
/// `IB_SEND_INLINE` request carries its bytes in `inline_data` (ib_core's
/// safe stand-in for Linux reading them through the SGEs' kernel
/// addresses); one with the flag and no bytes but a gather list is refused
/// (`None`): the driver cannot read memory through bus addresses. Whether
/// the bytes fit the QP's `max_inline_data` is checked when the WQE is
/// built (`-ENOMEM`, as libmlx4 and kernel mlx5 answer).
pub fn from_ib_send_wr<'a>(w: &ib_core::verbs::SendWr<'a>) -> Option<SendWr<'a>> {
    use ib_core::verbs::WrDetail as W;
    use ib_core::verbs::WrOpcode as O;
    let inline = w.send_flags.contains(SendFlags::INLINE);
    if inline && w.inline_data.is_empty() && !w.sg_list.is_empty() {
        return None;
    }
    let opcode = match w.opcode {
        O::RdmaWrite => WrOpcode::RdmaWrite,
        O::RdmaWriteWithImm => WrOpcode::RdmaWriteWithImm,
        O::Send => WrOpcode::Send,
        O::SendWithImm => WrOpcode::SendWithImm,
        O::RdmaRead => WrOpcode::RdmaRead,
        O::AtomicCmpAndSwp => WrOpcode::AtomicCmpAndSwp,
        O::AtomicFetchAndAdd => WrOpcode::AtomicFetchAndAdd,
        O::SendWithInv => WrOpcode::SendWithInv,
    };
    let wr = match w.wr {
        W::None => WrDetail::None,
        W::Rdma { remote_addr, rkey } => WrDetail::Rdma { remote_addr, rkey },
        W::Atomic {
            remote_addr,
            compare_add,
            swap,
            rkey,
        } => WrDetail::Atomic {
            remote_addr,
            compare_add,
            swap,
            compare_add_mask: 0,
            swap_mask: 0,
            rkey,
        },
        W::Ud {
            ah,
            remote_qpn,
            remote_qkey,
            pkey_index,
            ..
        } => WrDetail::Ud {
            ah: AhId(ah.0),
            remote_qpn,
            remote_qkey,
            pkey_index,
        },
    };
    Some(SendWr {
        wr_id: w.wr_id,
        opcode,
        send_flags: w.send_flags,
        sg_list: w.sg_list,
        inline_data: if inline { w.inline_data } else { &[] },
        imm_data: w.imm_data,
        wr,
    })
}

/// `struct ib_qp_init_attr` with this driver's handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    /// CQ of send completions.
    pub send_cq: crate::CqId,
    /// CQ of receive completions.
    pub recv_cq: crate::CqId,
    /// Shared receive queue, if any.
    pub srq: Option<crate::SrqId>,
    /// Requested sizes; updated to what was granted.
    pub cap: QpCap,
    /// Which sends complete.
    pub sq_sig_type: SigType,
    /// Transport.
    pub qp_type: QpType,
    /// Port (QP0/QP1 only).
    pub port_num: u8,
}
