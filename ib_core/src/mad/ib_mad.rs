//! Port of Linux `include/rdma/ib_mad.h` (3.11): the 256-byte MAD with its common header, the management classes, methods and status values, and the types of the agent API.
//!
//! The agent API's types are the registration request, the send buffer and the
//! receive and send completions. The RMPP header is in `mad_rmpp.rs`, the SMP's
//! fields in `ib_smi.rs`.
//!
//! `struct ib_grh` (Linux keeps it in `ib_verbs.h`) is here too, as the
//! MAD layer hands it to agents with every MAD received through a GRH.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;

use crate::device::DeviceId;
use crate::verbs::{AhAttr, IB_QP_SET_QKEY, Wc, WcStatus};
use hal::be::{get_be16, get_be32, get_be64};

/// Size of a MAD.
pub const IB_MGMT_MAD_SIZE: usize = 256;
/// Size of the common MAD header.
pub const IB_MGMT_MAD_HDR: usize = 24;
/// Bytes of data after the common header.
pub const IB_MGMT_MAD_DATA: usize = 232;
/// Size of a GRH (the area in front of every UD receive buffer).
pub const IB_GRH_BYTES: usize = 40;

/// `IB_MGMT_BASE_VERSION`.
pub const IB_MGMT_BASE_VERSION: u8 = 1;

/// Management classes (`IB_MGMT_CLASS_*`).
pub mod class {
    /// Subnet management, LID routed.
    pub const SUBN_LID_ROUTED: u8 = 0x01;
    /// Subnet management, directed route.
    pub const SUBN_DIRECTED_ROUTE: u8 = 0x81;
    /// Subnet administration.
    pub const SUBN_ADM: u8 = 0x03;
    /// Performance management.
    pub const PERF_MGMT: u8 = 0x04;
    /// Baseboard management.
    pub const BM: u8 = 0x05;
    /// Device management.
    pub const DEVICE_MGMT: u8 = 0x06;
    /// Communication management.
    pub const CM: u8 = 0x07;
    /// SNMP.
    pub const SNMP: u8 = 0x08;
    /// Device administration.
    pub const DEVICE_ADM: u8 = 0x10;
    /// Boot management.
    pub const BOOT_MGMT: u8 = 0x11;
    /// BIS.
    pub const BIS: u8 = 0x12;
    /// Congestion management.
    pub const CONG_MGMT: u8 = 0x21;
    /// First vendor class of range 2 (with OUI).
    pub const VENDOR_RANGE2_START: u8 = 0x30;
    /// Last vendor class of range 2.
    pub const VENDOR_RANGE2_END: u8 = 0x4f;
}

/// Methods (`IB_MGMT_METHOD_*`).
pub mod method {
    /// Get.
    pub const GET: u8 = 0x01;
    /// Set.
    pub const SET: u8 = 0x02;
    /// Get response.
    pub const GET_RESP: u8 = 0x81;
    /// Send.
    pub const SEND: u8 = 0x03;
    /// Trap.
    pub const TRAP: u8 = 0x05;
    /// Report.
    pub const REPORT: u8 = 0x06;
    /// Report response.
    pub const REPORT_RESP: u8 = 0x86;
    /// Trap repress.
    pub const TRAP_REPRESS: u8 = 0x07;
    /// GetTable (SA).
    pub const GET_TABLE: u8 = 0x12;
    /// The response bit.
    pub const RESP: u8 = 0x80;
}

/// MAD status values (`IB_MGMT_MAD_STATUS_*`), host order.
pub mod status {
    /// Success.
    pub const SUCCESS: u16 = 0x0000;
    /// Busy.
    pub const BUSY: u16 = 0x0001;
    /// Redirect required.
    pub const REDIRECT_REQD: u16 = 0x0002;
    /// Bad base or class version.
    pub const BAD_VERSION: u16 = 0x0004;
    /// Method not supported.
    pub const UNSUPPORTED_METHOD: u16 = 0x0008;
    /// Method/attribute combination not supported.
    pub const UNSUPPORTED_METHOD_ATTRIB: u16 = 0x000c;
    /// Invalid attribute or modifier.
    pub const INVALID_ATTRIB_VALUE: u16 = 0x001c;
    /// The direction bit of a directed-route SMP (`IB_SMP_DIRECTION`).
    pub const IB_SMP_DIRECTION: u16 = 0x8000;
}

/// `IB_MAD_RESULT_*` bits returned by `process_mad`.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct MadResult(pub u32);

impl MadResult {
    /// `IB_MAD_RESULT_FAILURE`: not handled.
    pub const FAILURE: MadResult = MadResult(0);
    /// `IB_MAD_RESULT_SUCCESS`: handled.
    pub const SUCCESS: MadResult = MadResult(1);
    /// `IB_MAD_RESULT_REPLY`: `out_mad` holds a response to send.
    pub const REPLY: MadResult = MadResult(2);
    /// `IB_MAD_RESULT_CONSUMED`: taken; deliver nowhere else.
    pub const CONSUMED: MadResult = MadResult(4);
    /// True if every bit of `o` is set.
    pub const fn contains(self, o: MadResult) -> bool {
        self.0 & o.0 == o.0
    }
}

impl core::ops::BitOr for MadResult {
    type Output = MadResult;
    fn bitor(self, o: MadResult) -> MadResult {
        MadResult(self.0 | o.0)
    }
}

impl fmt::Debug for MadResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MadResult(")?;
        let mut first = true;
        for (b, n) in [(1, "SUCCESS"), (2, "REPLY"), (4, "CONSUMED")] {
            if self.0 & b != 0 {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(n)?;
                first = false;
            }
        }
        if first {
            f.write_str("FAILURE")?;
        }
        f.write_str(")")
    }
}

/// A 256-byte management datagram in wire order (`struct ib_mad`, and
/// through the SMP accessors `struct ib_smp`). All accessors read and write
/// the big-endian wire fields at fixed offsets inside the array, so none can
/// go out of bounds.
#[derive(Clone, PartialEq, Eq)]
pub struct Mad(pub [u8; IB_MGMT_MAD_SIZE]);

impl Default for Mad {
    fn default() -> Self {
        Mad([0; IB_MGMT_MAD_SIZE])
    }
}

impl fmt::Debug for Mad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Mad {{ class {:#04x} v{} method {:#04x} status {:#06x} tid {:#018x} attr {:#06x}/{:#x} }}",
            self.mgmt_class(),
            self.class_version(),
            self.method(),
            self.status(),
            self.tid(),
            self.attr_id(),
            self.attr_mod()
        )
    }
}

macro_rules! field {
    ($get:ident, $set:ident, u8, $off:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u8 {
            self.0[$off]
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u8) {
            self.0[$off] = v;
        }
    };
    ($get:ident, $set:ident, u16, $off:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u16 {
            get_be16(&self.0, $off)
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u16) {
            self.0[$off..$off + 2].copy_from_slice(&v.to_be_bytes());
        }
    };
    ($get:ident, $set:ident, u32, $off:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u32 {
            get_be32(&self.0, $off)
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u32) {
            self.0[$off..$off + 4].copy_from_slice(&v.to_be_bytes());
        }
    };
    ($get:ident, $set:ident, u64, $off:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u64 {
            get_be64(&self.0, $off)
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u64) {
            self.0[$off..$off + 8].copy_from_slice(&v.to_be_bytes());
        }
    };
}
pub(super) use field;

impl Mad {
    /// A MAD from the first 256 bytes of `b` (shorter input is zero-padded).
    pub fn from_bytes(b: &[u8]) -> Mad {
        let mut m = Mad::default();
        let n = b.len().min(IB_MGMT_MAD_SIZE);
        m.0[..n].copy_from_slice(&b[..n]);
        m
    }

    /// A request with the common header filled in.
    pub fn new_request(
        mgmt_class: u8,
        class_version: u8,
        method: u8,
        attr_id: u16,
        attr_mod: u32,
    ) -> Mad {
        let mut m = Mad::default();
        m.set_base_version(IB_MGMT_BASE_VERSION);
        m.set_mgmt_class(mgmt_class);
        m.set_class_version(class_version);
        m.set_method(method);
        m.set_attr_id(attr_id);
        m.set_attr_mod(attr_mod);
        m
    }

    field!(base_version, set_base_version, u8, 0, "Base version (1).");
    field!(mgmt_class, set_mgmt_class, u8, 1, "Management class.");
    field!(class_version, set_class_version, u8, 2, "Class version.");
    field!(method, set_method, u8, 3, "Method (bit 7: response).");
    field!(
        status,
        set_status,
        u16,
        4,
        "Status (bit 15 of a DR SMP: direction)."
    );
    field!(
        class_specific,
        set_class_specific,
        u16,
        6,
        "Class-specific word (hop pointer and count of an SMP)."
    );
    field!(tid, set_tid, u64, 8, "Transaction ID.");
    field!(attr_id, set_attr_id, u16, 16, "Attribute ID.");
    field!(attr_mod, set_attr_mod, u32, 20, "Attribute modifier.");

    /// True for a response (method bit 7).
    pub fn is_response(&self) -> bool {
        self.method() & method::RESP != 0
    }
    /// The 232 bytes after the common header.
    pub fn data(&self) -> &[u8] {
        &self.0[IB_MGMT_MAD_HDR..]
    }
    /// The 232 bytes after the common header, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.0[IB_MGMT_MAD_HDR..]
    }
}

/// A global route header as received in the first 40 bytes of a UD receive
/// buffer (`struct ib_grh`), wire order.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Grh(pub [u8; IB_GRH_BYTES]);

impl Default for Grh {
    fn default() -> Self {
        Grh([0; IB_GRH_BYTES])
    }
}

impl fmt::Debug for Grh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Grh {{ tclass {} flow {:#x} hop {} sgid {} dgid {} }}",
            self.traffic_class(),
            self.flow_label(),
            self.hop_limit(),
            self.sgid(),
            self.dgid()
        )
    }
}

impl Grh {
    /// IP version (6).
    pub fn ip_version(&self) -> u8 {
        self.0[0] >> 4
    }
    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        ((get_be32(&self.0, 0) >> 20) & 0xff) as u8
    }
    /// Flow label.
    pub fn flow_label(&self) -> u32 {
        get_be32(&self.0, 0) & 0xf_ffff
    }
    /// Payload length.
    pub fn paylen(&self) -> u16 {
        get_be16(&self.0, 4)
    }
    /// Next header (0x1b).
    pub fn next_hdr(&self) -> u8 {
        self.0[6]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.0[7]
    }
    /// Source GID.
    pub fn sgid(&self) -> crate::verbs::Gid {
        let mut g = [0u8; 16];
        g.copy_from_slice(&self.0[8..24]);
        crate::verbs::Gid(g)
    }
    /// Destination GID.
    pub fn dgid(&self) -> crate::verbs::Gid {
        let mut g = [0u8; 16];
        g.copy_from_slice(&self.0[24..40]);
        crate::verbs::Gid(g)
    }
}

/// `ib_response_mad`: a response, a TrapRepress, or a BM response.
#[doc(alias = "ib_response_mad")]
pub fn response_mad(mad: &Mad) -> bool {
    mad.method() & method::RESP != 0
        || mad.method() == method::TRAP_REPRESS
        || (mad.mgmt_class() == class::BM && mad.attr_mod() & 0x0000_0001 != 0)
}

/// `struct ib_mad_reg_req`: class, class version and the methods an agent
/// takes unsolicited MADs for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadRegReq {
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub mgmt_class_version: u8,
    /// Method bitmap (bit `m` = method `m`).
    pub method_mask: [u64; 2],
    /// OUI of a vendor class of range 2 (0x30..0x4f; Linux's `oui[3]`);
    /// zero for every other class.
    pub oui: [u8; 3],
}

impl MadRegReq {
    /// A request for `methods` of `mgmt_class` version `version`.
    pub fn new(mgmt_class: u8, version: u8, methods: &[u8]) -> MadRegReq {
        let mut method_mask = [0u64; 2];
        for &m in methods {
            method_mask[usize::from(m >> 6) & 1] |= 1 << (m & 63);
        }
        MadRegReq {
            mgmt_class,
            mgmt_class_version: version,
            method_mask,
            oui: [0; 3],
        }
    }
    /// The same request for a vendor class of range 2 with this OUI (what
    /// infiniband-diags' `ibping -S` registers: class 0x32, OUI 0x001405).
    pub fn with_oui(mut self, oui: u32) -> MadRegReq {
        let b = oui.to_be_bytes();
        self.oui = [b[1], b[2], b[3]];
        self
    }
    /// Whether method `m` is registered.
    pub fn has_method(&self, m: u8) -> bool {
        m < 128 && self.method_mask[usize::from(m >> 6)] & (1 << (m & 63)) != 0
    }
}

/// A registered MAD agent (`struct ib_mad_agent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadAgent {
    /// The device.
    pub dev: DeviceId,
    /// The port.
    pub port: u8,
    /// Its slot on the port.
    pub(crate) idx: u32,
    /// `hi_tid`: the upper 32 bits of the TIDs of its requests.
    pub hi_tid: u32,
}

/// One MAD to send (`struct ib_mad_send_buf` with its address): the MAD,
/// where it goes, and how long to wait for a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadSendBuf {
    /// The MAD. For a request, ib_core puts the agent's `hi_tid` in the TID's
    /// upper half (and a counter in the lower half if it is 0).
    pub mad: Mad,
    /// Address vector (the core creates and destroys the AH).
    pub ah_attr: AhAttr,
    /// Destination QP (0, 1, or a redirected QP).
    pub remote_qpn: u32,
    /// Q_Key; [`IB_QP_SET_QKEY`] (the default) uses the QP's own.
    pub remote_qkey: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Milliseconds to wait for a response per try; 0 = none expected.
    pub timeout_ms: u32,
    /// Retries after a timeout.
    pub retries: u32,
    /// The caller's cookie, returned in the send completion.
    pub context: u64,
}

impl MadSendBuf {
    /// A send of `mad` to `remote_qpn` at `ah_attr`, expecting no response.
    pub fn new(mad: Mad, ah_attr: AhAttr, remote_qpn: u32) -> MadSendBuf {
        MadSendBuf {
            mad,
            ah_attr,
            remote_qpn,
            remote_qkey: IB_QP_SET_QKEY,
            pkey_index: 0,
            timeout_ms: 0,
            retries: 0,
            context: 0,
        }
    }
}

/// Identifies a posted MAD until its send completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadSendId(pub u64);

/// `struct ib_mad_recv_wc`: one received MAD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadRecvWc {
    /// The work completion (for a locally handled SMP, one built as Linux's
    /// `build_smp_wc` does).
    pub wc: Wc,
    /// The GRH, if the packet had one.
    pub grh: Option<Grh>,
    /// The MAD.
    pub mad: Mad,
    /// The port.
    pub port: u8,
    /// For a response: the request it answers.
    pub send_id: Option<MadSendId>,
    /// For an RMPP transfer (agents registered with RMPP version 1): the
    /// data of all its segments after the class header, padding removed;
    /// `mad` is then the first segment.
    pub rmpp_data: Option<Vec<u8>>,
}

/// `struct ib_mad_send_wc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadSendWc {
    /// Which send.
    pub id: MadSendId,
    /// `IB_WC_SUCCESS`, `IB_WC_RESP_TIMEOUT_ERR`, `IB_WC_WR_FLUSH_ERR`
    /// (canceled), or the send's error status.
    pub status: WcStatus,
    /// Vendor syndrome of a failed send.
    pub vendor_err: u32,
    /// The caller's cookie.
    pub context: u64,
}

/// What an agent's mailbox holds (the calls Linux makes to an agent's
/// `recv_handler` and `send_handler`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MadEvent {
    /// A MAD for the agent: an unsolicited request of a registered method,
    /// or a response to one of its requests.
    Recv(Box<MadRecvWc>),
    /// A send is finished.
    SendDone(MadSendWc),
}
