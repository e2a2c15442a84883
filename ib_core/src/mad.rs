//! Port of Linux `include/rdma/ib_mad.h`, `ib_smi.h` and `drivers/infiniband/core/mad.c` (3.11): the 256-byte MAD and SMP layouts with their constants, and the MAD layer; RMPP, redirection and vendor-class OUI tables are left out.

use core::fmt;

/// Size of a MAD.
pub const IB_MGMT_MAD_SIZE: usize = 256;
/// Size of the common MAD header.
pub const IB_MGMT_MAD_HDR: usize = 24;
/// Bytes of data after the common header.
pub const IB_MGMT_MAD_DATA: usize = 232;
/// Size of a GRH (the area in front of every UD receive buffer).
pub const IB_GRH_BYTES: usize = 40;
/// Bytes of SMP data.
pub const IB_SMP_DATA_SIZE: usize = 64;
/// Longest directed route.
pub const IB_SMP_MAX_PATH_HOPS: u8 = 64;

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

/// SMP attribute IDs (`IB_SMP_ATTR_*`).
pub mod attr {
    /// Notice.
    pub const NOTICE: u16 = 0x0002;
    /// NodeDescription.
    pub const NODE_DESC: u16 = 0x0010;
    /// NodeInfo.
    pub const NODE_INFO: u16 = 0x0011;
    /// SwitchInfo.
    pub const SWITCH_INFO: u16 = 0x0012;
    /// GUIDInfo.
    pub const GUID_INFO: u16 = 0x0014;
    /// PortInfo.
    pub const PORT_INFO: u16 = 0x0015;
    /// P_KeyTable.
    pub const PKEY_TABLE: u16 = 0x0016;
    /// SLtoVLMappingTable.
    pub const SL_TO_VL_TABLE: u16 = 0x0017;
    /// VLArbitrationTable.
    pub const VL_ARB_TABLE: u16 = 0x0018;
    /// SMInfo.
    pub const SM_INFO: u16 = 0x0020;
    /// VendorDiag.
    pub const VENDOR_DIAG: u16 = 0x0030;
    /// LedInfo.
    pub const LED_INFO: u16 = 0x0031;
    /// PMA ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// PMA PortCounters.
    pub const PORT_COUNTERS: u16 = 0x0012;
    /// PMA PortCountersExtended.
    pub const PORT_COUNTERS_EXT: u16 = 0x001d;
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

fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}
fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
fn be64(b: &[u8], off: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(x)
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
            be16(&self.0, $off)
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u16) {
            self.0[$off..$off + 2].copy_from_slice(&v.to_be_bytes());
        }
    };
    ($get:ident, $set:ident, u32, $off:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u32 {
            be32(&self.0, $off)
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u32) {
            self.0[$off..$off + 4].copy_from_slice(&v.to_be_bytes());
        }
    };
    ($get:ident, $set:ident, u64, $off:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u64 {
            be64(&self.0, $off)
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u64) {
            self.0[$off..$off + 8].copy_from_slice(&v.to_be_bytes());
        }
    };
}

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

    // SMP (struct ib_smp)
    field!(hop_ptr, set_hop_ptr, u8, 6, "SMP hop pointer.");
    field!(hop_cnt, set_hop_cnt, u8, 7, "SMP hop count.");
    field!(mkey, set_mkey, u64, 24, "SMP M_Key.");
    field!(dr_slid, set_dr_slid, u16, 32, "DR SMP DrSLID.");
    field!(dr_dlid, set_dr_dlid, u16, 34, "DR SMP DrDLID.");

    /// True for a response (method bit 7).
    pub fn is_response(&self) -> bool {
        self.method() & method::RESP != 0
    }

    /// The 64 bytes of SMP data.
    pub fn smp_data(&self) -> &[u8] {
        &self.0[64..128]
    }
    /// The 64 bytes of SMP data, writable.
    pub fn smp_data_mut(&mut self) -> &mut [u8] {
        &mut self.0[64..128]
    }
    /// `initial_path[i]` of a DR SMP (index taken modulo 64, never out of
    /// bounds).
    pub fn initial_path(&self, i: u8) -> u8 {
        self.0[128 + (i as usize & 63)]
    }
    /// Sets `initial_path[i]`.
    pub fn set_initial_path(&mut self, i: u8, port: u8) {
        self.0[128 + (i as usize & 63)] = port;
    }
    /// `return_path[i]` of a DR SMP (index modulo 64).
    pub fn return_path(&self, i: u8) -> u8 {
        self.0[192 + (i as usize & 63)]
    }
    /// Sets `return_path[i]`.
    pub fn set_return_path(&mut self, i: u8, port: u8) {
        self.0[192 + (i as usize & 63)] = port;
    }
    /// The 232 bytes after the common header.
    pub fn data(&self) -> &[u8] {
        &self.0[IB_MGMT_MAD_HDR..]
    }
    /// The 232 bytes after the common header, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.0[IB_MGMT_MAD_HDR..]
    }
    /// Bit 15 of the status of a DR SMP (`ib_get_smp_direction`).
    pub fn smp_direction(&self) -> bool {
        self.status() & status::IB_SMP_DIRECTION != 0
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
        ((be32(&self.0, 0) >> 20) & 0xff) as u8
    }
    /// Flow label.
    pub fn flow_label(&self) -> u32 {
        be32(&self.0, 0) & 0xf_ffff
    }
    /// Payload length.
    pub fn paylen(&self) -> u16 {
        be16(&self.0, 4)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smp_fields_sit_at_ibta_offsets() {
        let mut m = Mad::new_request(
            class::SUBN_DIRECTED_ROUTE,
            1,
            method::GET,
            attr::NODE_INFO,
            0,
        );
        m.set_tid(0x0102_0304_0506_0708);
        m.set_hop_cnt(3);
        m.set_hop_ptr(1);
        m.set_mkey(0x1122_3344_5566_7788);
        m.set_dr_slid(0xffff);
        m.set_dr_dlid(0xfffe);
        m.set_initial_path(1, 7);
        m.set_return_path(2, 9);
        m.set_status(status::IB_SMP_DIRECTION);
        let b = &m.0;
        assert_eq!(&b[0..4], &[1, 0x81, 1, 1]);
        assert_eq!(&b[4..8], &[0x80, 0, 1, 3]);
        assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[16..18], &[0, 0x11]);
        assert_eq!(
            &b[24..32],
            &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
        );
        assert_eq!(&b[32..36], &[0xff, 0xff, 0xff, 0xfe]);
        assert_eq!(b[0x80 + 1], 7);
        assert_eq!(b[0xc0 + 2], 9);
        assert!(m.smp_direction());
        assert!(!m.is_response());
        // Path indices never leave the array.
        assert_eq!(m.initial_path(200), m.initial_path(200 & 63));
    }
}
