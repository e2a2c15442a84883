//! The verbs types mlx4_ib speaks (Linux `include/rdma/ib_verbs.h`: `ib_wc`, `ib_send_wr`, `ib_recv_wr`, `ib_sge`, `ib_qp_attr` and its mask, `ib_ah_attr`, `ib_qp_init_attr`, the enums) until ib_core provides them; user-space (`ib_udata`), XRC, memory windows, fast-register and LSO work requests are left out.
//!
//! Values are Linux's, so `enum` numbers and bit masks can be compared
//! against the C headers. A send work request borrows its scatter list and
//! its address handle, so posting allocates nothing.

use core::fmt;

use crate::table::AhId;

/// A scatter/gather element (`struct ib_sge`): an address the HCA can reach
/// through the memory region of `lkey`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sge {
    /// I/O virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

/// Send opcodes (`enum ib_wr_opcode`).
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
    SendWithInv = 9,
    MaskedAtomicCmpAndSwp = 12,
    MaskedAtomicFetchAndAdd = 13,
}

/// `enum ib_send_flags`.
pub mod send_flags {
    /// `IB_SEND_FENCE`.
    pub const FENCE: u32 = 1;
    /// `IB_SEND_SIGNALED`.
    pub const SIGNALED: u32 = 2;
    /// `IB_SEND_SOLICITED`.
    pub const SOLICITED: u32 = 4;
    /// `IB_SEND_INLINE`.
    pub const INLINE: u32 = 8;
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
    /// [`send_flags`] bits.
    pub send_flags: u32,
    /// Gather list (ignored when `IB_SEND_INLINE` is set).
    pub sg_list: &'a [Sge],
    /// Data copied into the WQE when `IB_SEND_INLINE` is set (Linux reads
    /// it through the scatter list's kernel addresses; a safe port needs the
    /// bytes themselves).
    pub inline_data: &'a [u8],
    /// Immediate data (`ex.imm_data`, host order) or the rkey to invalidate
    /// (`ex.invalidate_rkey`).
    pub imm_data: u32,
    /// Opcode-specific fields.
    pub wr: WrDetail,
}

impl Default for SendWr<'_> {
    fn default() -> Self {
        SendWr {
            wr_id: 0,
            opcode: WrOpcode::Send,
            send_flags: 0,
            sg_list: &[],
            inline_data: &[],
            imm_data: 0,
            wr: WrDetail::None,
        }
    }
}

/// A receive work request (`struct ib_recv_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sg_list: &'a [Sge],
}

/// Completion status (`enum ib_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum WcStatus {
    #[default]
    Success = 0,
    LocLenErr,
    LocQpOpErr,
    LocEecOpErr,
    LocProtErr,
    WrFlushErr,
    MwBindErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    LocRddViolErr,
    RemInvRdReqErr,
    RemAbortErr,
    InvEecnErr,
    InvEecStateErr,
    FatalErr,
    RespTimeoutErr,
    GeneralErr,
}

impl WcStatus {
    /// The Linux enumerator name (`IB_WC_LOC_LEN_ERR`, ...).
    pub fn name(self) -> &'static str {
        use WcStatus::*;
        match self {
            Success => "IB_WC_SUCCESS",
            LocLenErr => "IB_WC_LOC_LEN_ERR",
            LocQpOpErr => "IB_WC_LOC_QP_OP_ERR",
            LocEecOpErr => "IB_WC_LOC_EEC_OP_ERR",
            LocProtErr => "IB_WC_LOC_PROT_ERR",
            WrFlushErr => "IB_WC_WR_FLUSH_ERR",
            MwBindErr => "IB_WC_MW_BIND_ERR",
            BadRespErr => "IB_WC_BAD_RESP_ERR",
            LocAccessErr => "IB_WC_LOC_ACCESS_ERR",
            RemInvReqErr => "IB_WC_REM_INV_REQ_ERR",
            RemAccessErr => "IB_WC_REM_ACCESS_ERR",
            RemOpErr => "IB_WC_REM_OP_ERR",
            RetryExcErr => "IB_WC_RETRY_EXC_ERR",
            RnrRetryExcErr => "IB_WC_RNR_RETRY_EXC_ERR",
            LocRddViolErr => "IB_WC_LOC_RDD_VIOL_ERR",
            RemInvRdReqErr => "IB_WC_REM_INV_RD_REQ_ERR",
            RemAbortErr => "IB_WC_REM_ABORT_ERR",
            InvEecnErr => "IB_WC_INV_EECN_ERR",
            InvEecStateErr => "IB_WC_INV_EEC_STATE_ERR",
            FatalErr => "IB_WC_FATAL_ERR",
            RespTimeoutErr => "IB_WC_RESP_TIMEOUT_ERR",
            GeneralErr => "IB_WC_GENERAL_ERR",
        }
    }
}

impl fmt::Display for WcStatus {
    /// The words of `ib_wc_status_msg` / `ibv_wc_status_str`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use WcStatus::*;
        f.write_str(match self {
            Success => "success",
            LocLenErr => "local length error",
            LocQpOpErr => "local QP operation error",
            LocEecOpErr => "local EE context operation error",
            LocProtErr => "local protection error",
            WrFlushErr => "Work Request Flushed Error",
            MwBindErr => "memory management operation error",
            BadRespErr => "bad response error",
            LocAccessErr => "local access error",
            RemInvReqErr => "invalid request error",
            RemAccessErr => "remote access error",
            RemOpErr => "remote operation error",
            RetryExcErr => "transport retry counter exceeded",
            RnrRetryExcErr => "RNR retry counter exceeded",
            LocRddViolErr => "local RDD violation error",
            RemInvRdReqErr => "remote invalid RD request",
            RemAbortErr => "operation aborted",
            InvEecnErr => "invalid EE context number",
            InvEecStateErr => "invalid EE context state",
            FatalErr => "fatal error",
            RespTimeoutErr => "response timeout error",
            GeneralErr => "general error",
        })
    }
}

/// Completion opcodes (`enum ib_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum WcOpcode {
    #[default]
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    BindMw = 5,
    Lso = 6,
    LocalInv = 7,
    FastRegMr = 8,
    MaskedCompSwap = 9,
    MaskedFetchAdd = 10,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// `enum ib_wc_flags`.
pub mod wc_flags {
    /// `IB_WC_GRH`: the receive buffer starts with a GRH.
    pub const GRH: u32 = 1;
    /// `IB_WC_WITH_IMM`.
    pub const WITH_IMM: u32 = 2;
    /// `IB_WC_WITH_INVALIDATE`.
    pub const WITH_INVALIDATE: u32 = 4;
}

/// A work completion (`struct ib_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed (valid on success).
    pub opcode: WcOpcode,
    /// Vendor syndrome of an error completion.
    pub vendor_err: u32,
    /// Bytes received (receives include the 40-byte GRH area on UD).
    pub byte_len: u32,
    /// The QP's number as verbs see it (0 and 1 for QP0 and QP1).
    pub qp_num: u32,
    /// Immediate data (host order) or the invalidated rkey.
    pub imm_data: u32,
    /// Source QPN (UD receives).
    pub src_qp: u32,
    /// [`wc_flags`] bits.
    pub wc_flags: u32,
    /// P_Key index (UD/QP1 receives).
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
    /// Port (special QPs).
    pub port_num: u8,
}

/// QP transport types (`enum ib_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum QpType {
    Smi = 0,
    Gsi = 1,
    Rc = 2,
    Uc = 3,
    Ud = 4,
}

/// QP states (`enum ib_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum QpState {
    #[default]
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Sqd = 4,
    Sqe = 5,
    Err = 6,
}

/// `enum ib_sig_type`: which sends generate a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SigType {
    /// Every send (`IB_SIGNAL_ALL_WR`).
    #[default]
    AllWr,
    /// Only sends flagged `IB_SEND_SIGNALED` (`IB_SIGNAL_REQ_WR`).
    ReqWr,
}

/// Queue sizes (`struct ib_qp_cap`): requested at create, the granted values
/// are written back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `enum ib_access_flags`.
pub mod access {
    #![allow(missing_docs)]
    pub const LOCAL_WRITE: u32 = 1;
    pub const REMOTE_WRITE: u32 = 2;
    pub const REMOTE_READ: u32 = 4;
    pub const REMOTE_ATOMIC: u32 = 8;
    pub const MW_BIND: u32 = 16;
}

/// `enum ib_mtu` (1 = 256 .. 5 = 4096).
pub mod mtu {
    #![allow(missing_docs)]
    pub const MTU_256: u8 = 1;
    pub const MTU_512: u8 = 2;
    pub const MTU_1024: u8 = 3;
    pub const MTU_2048: u8 = 4;
    pub const MTU_4096: u8 = 5;
}

/// `struct ib_global_route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct GlobalRoute {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `IB_AH_GRH` in [`AhAttr::ah_flags`].
pub const AH_GRH: u8 = 1;

/// `struct ib_ah_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct AhAttr {
    pub grh: GlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    /// `enum ib_rate` (0 = port rate).
    pub static_rate: u8,
    pub ah_flags: u8,
    pub port_num: u8,
}

/// `enum ib_qp_attr_mask`.
pub mod qp_attr_mask {
    #![allow(missing_docs)]
    pub const STATE: u32 = 1;
    pub const CUR_STATE: u32 = 1 << 1;
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const QKEY: u32 = 1 << 6;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const ALT_PATH: u32 = 1 << 14;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    pub const CAP: u32 = 1 << 19;
    pub const DEST_QPN: u32 = 1 << 20;
}

/// `struct ib_qp_attr` (the fields this port uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    /// [`mtu`] value.
    pub path_mtu: u8,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    /// [`access`] bits.
    pub qp_access_flags: u32,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub pkey_index: u16,
    pub en_sqd_async_notify: bool,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

/// `struct ib_srq_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct SrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `enum ib_srq_attr_mask`.
pub mod srq_attr_mask {
    /// `IB_SRQ_MAX_WR` (resize: refused, as Linux mlx4 does).
    pub const MAX_WR: u32 = 1;
    /// `IB_SRQ_LIMIT`: arm the limit event.
    pub const LIMIT: u32 = 2;
}

/// `struct ib_qp_init_attr` (kernel QPs).
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
