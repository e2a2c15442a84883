//! The verbs types of mlx4_ib: ib_core's (`include/rdma/ib_verbs.h`) re-exported, and `struct ib_qp_init_attr` with this driver's handles.
//!
//! The send work request is ib_core's [`SendWr`]: it borrows its scatter
//! list and its inline bytes, so posting allocates nothing. XRC,
//! memory-window, fast-register and LSO work requests are left out (ib_core
//! does not name their opcodes).

pub use ib_core::verbs::{
    AccessFlags, AhAttr, Gid, GlobalRoute, Mtu, QpAttr, QpAttrMask, QpCap, QpCreateFlags, QpState,
    QpType, RecvWr, SendFlags, SendWr, Sge, SigType, SrqAttr, SrqAttrMask, Wc, WcFlags, WcOpcode,
    WcStatus, WrDetail, WrOpcode,
};

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
    /// Creation flags: block multicast loopback (UD only).
    pub create_flags: QpCreateFlags,
    /// Port (QP0/QP1 only).
    pub port_num: u8,
}
