//! Port of Linux `include/rdma/ib_smi.h` (3.11): the SMP's fields in a [`Mad`] (`struct ib_smp`) and the attribute IDs of the SMA and PMA.
//!
//! The fields are the hop pointer and count, M_Key, DrSLID/DrDLID, the data and
//! the two paths. `struct ib_port_info` is left to the readers of PortInfo.

use super::ib_mad::{Mad, field, status};
use hal::be::{get_be16, get_be64};

/// Bytes of SMP data.
pub const IB_SMP_DATA_SIZE: usize = 64;
/// Longest directed route.
pub const IB_SMP_MAX_PATH_HOPS: u8 = 64;

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

impl Mad {
    field!(hop_ptr, set_hop_ptr, u8, 6, "SMP hop pointer.");
    field!(hop_cnt, set_hop_cnt, u8, 7, "SMP hop count.");
    field!(mkey, set_mkey, u64, 24, "SMP M_Key.");
    field!(dr_slid, set_dr_slid, u16, 32, "DR SMP DrSLID.");
    field!(dr_dlid, set_dr_dlid, u16, 34, "DR SMP DrDLID.");

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
    /// Bit 15 of the status of a DR SMP (`ib_get_smp_direction`).
    pub fn smp_direction(&self) -> bool {
        self.status() & status::IB_SMP_DIRECTION != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::{class, method};

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
