//! The MADs on the wire.
//!
//! The MADs on the wire (IBTA vol. 1, 13.4: the common MAD header; 14.2.1:
//! the SMP with its directed-route fields): classes, methods, attributes,
//! status codes, and the headers that carry a MAD to QP0 or QP1.

use super::*;

/// Management classes.
pub mod mgmt_class {
    #![allow(missing_docs)]
    pub const SUBN_LID_ROUTED: u8 = 0x01;
    pub const SUBN_ADM: u8 = 0x03;
    pub const PERF_MGMT: u8 = 0x04;
    pub const CM: u8 = 0x07;
    pub const SUBN_DIRECTED_ROUTE: u8 = 0x81;
}

/// MAD methods.
pub mod method {
    #![allow(missing_docs)]
    pub const GET: u8 = 0x01;
    pub const SET: u8 = 0x02;
    pub const SEND: u8 = 0x03;
    pub const TRAP: u8 = 0x05;
    pub const REPORT: u8 = 0x06;
    pub const TRAP_REPRESS: u8 = 0x07;
    pub const GET_TABLE: u8 = 0x12;
    pub const DELETE: u8 = 0x15;
    pub const GET_RESP: u8 = 0x81;
    pub const REPORT_RESP: u8 = 0x86;
}

/// Attribute ids (SMP 14.2.5, PMA 16.1.3).
pub mod attr {
    #![allow(missing_docs)]
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    pub const NODE_DESC: u16 = 0x0010;
    pub const NODE_INFO: u16 = 0x0011;
    pub const SWITCH_INFO: u16 = 0x0012;
    pub const GUID_INFO: u16 = 0x0014;
    pub const PORT_INFO: u16 = 0x0015;
    pub const PKEY_TABLE: u16 = 0x0016;
    pub const SL_TO_VL_TABLE: u16 = 0x0017;
    pub const VL_ARB_TABLE: u16 = 0x0018;
    pub const LINEAR_FORWARDING_TABLE: u16 = 0x0019;
    pub const MULTICAST_FORWARDING_TABLE: u16 = 0x001b;
    pub const SM_INFO: u16 = 0x0020;
    /// Mellanox's vendor-specific ExtendedPortInfo (OpenSM's
    /// `IB_MAD_ATTR_MLNX_EXTENDED_PORT_INFO`).
    pub const MLNX_EXT_PORT_INFO: u16 = 0xff90;
    pub const PORT_COUNTERS: u16 = 0x0012;
    pub const PORT_COUNTERS_EXT: u16 = 0x001d;
}

/// MAD status values (IBTA 13.4.7; bit 15 is the SMP D bit).
pub mod mad_status {
    #![allow(missing_docs)]
    pub const BUSY: u16 = 0x0001;
    pub const BAD_VERSION: u16 = 0x0004;
    pub const METHOD_UNSUPPORTED: u16 = 0x0008;
    pub const ATTR_UNSUPPORTED: u16 = 0x000c;
    pub const INVALID_FIELD: u16 = 0x001c;
    /// The SMP "direction" bit: set on the return trip.
    pub const DIRECTION: u16 = 0x8000;
}

/// Offset of the SMP/PMA attribute data within a MAD.
pub const SMP_DATA: usize = 64;
/// Offset of the PMA attribute data within a MAD.
pub const PMA_DATA: usize = 64;
/// Length of SMP attribute data.
pub const SMP_DATA_LEN: usize = 64;

/// The common MAD header (IBTA 13.4.3), 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MadHdr {
    /// Base version (1).
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method, response bit included.
    pub method: u8,
    /// Status (for directed-route SMPs bit 15 is the D bit).
    pub status: u16,
    /// Class specific (for directed-route SMPs: hop pointer << 8 | hop
    /// count).
    pub class_specific: u16,
    /// Transaction id.
    pub tid: u64,
    /// Attribute id.
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHdr {
    /// Reads the MAD header.
    pub fn parse(b: &[u8]) -> Result<MadHdr, PacketError> {
        need(b, 24, "MAD header")?;
        Ok(MadHdr {
            base_version: b[0],
            mgmt_class: b[1],
            class_version: b[2],
            method: b[3],
            status: be16(b, 4),
            class_specific: be16(b, 6),
            tid: be64(b, 8),
            attr_id: be16(b, 16),
            attr_mod: be32(b, 20),
        })
    }
    /// Writes the MAD header into `b[..24]`.
    pub fn write(&self, b: &mut [u8]) {
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        b[4..6].copy_from_slice(&self.status.to_be_bytes());
        b[6..8].copy_from_slice(&self.class_specific.to_be_bytes());
        b[8..16].copy_from_slice(&self.tid.to_be_bytes());
        b[16..18].copy_from_slice(&self.attr_id.to_be_bytes());
        b[18..20].fill(0);
        b[20..24].copy_from_slice(&self.attr_mod.to_be_bytes());
    }
}

/// A subnet management packet (IBTA 14.2.1.1 LID-routed, 14.2.1.2
/// directed route): the MAD header, M_Key, and for directed route the
/// hop pointer/count, DrSLID, DrDLID and both paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Smp {
    /// Common header. For directed route, [`Smp::parse`] moves the D bit
    /// into `direction` and the class-specific word into `hop_ptr` and
    /// `hop_cnt` (leaving them 0 here), and [`Smp::to_bytes`] writes them
    /// back from there.
    pub hdr: MadHdr,
    /// M_Key.
    pub mkey: u64,
    /// Directed route: hop pointer.
    pub hop_ptr: u8,
    /// Directed route: hop count (at most 63).
    pub hop_cnt: u8,
    /// Directed route: D bit (returning).
    pub direction: bool,
    /// Directed route: DrSLID.
    pub dr_slid: u16,
    /// Directed route: DrDLID.
    pub dr_dlid: u16,
    /// Attribute data.
    pub data: [u8; SMP_DATA_LEN],
    /// Directed route: initial path (entry 0 unused).
    pub initial_path: [u8; 64],
    /// Directed route: return path (entry 0 unused).
    pub return_path: [u8; 64],
}

impl Smp {
    /// A directed-route SubnGet of `attr_id` along `path` (the egress port
    /// at hops 1..), with permissive DrSLID/DrDLID.
    pub fn dr_get(tid: u64, attr_id: u16, attr_mod: u32, path: &[u8]) -> Result<Smp, PacketError> {
        if path.len() > 63 {
            return Err(PacketError::BadMad("directed route longer than 63 hops"));
        }
        let mut initial_path = [0u8; 64];
        initial_path[1..=path.len()].copy_from_slice(path);
        Ok(Smp {
            hdr: MadHdr {
                base_version: 1,
                mgmt_class: mgmt_class::SUBN_DIRECTED_ROUTE,
                class_version: 1,
                method: method::GET,
                tid,
                attr_id,
                attr_mod,
                ..MadHdr::default()
            },
            mkey: 0,
            hop_ptr: 0,
            hop_cnt: path.len() as u8,
            direction: false,
            dr_slid: PERMISSIVE_LID,
            dr_dlid: PERMISSIVE_LID,
            data: [0; SMP_DATA_LEN],
            initial_path,
            return_path: [0; 64],
        })
    }

    /// A LID-routed SubnGet/SubnSet.
    pub fn lid_routed(tid: u64, method: u8, attr_id: u16, attr_mod: u32) -> Smp {
        Smp {
            hdr: MadHdr {
                base_version: 1,
                mgmt_class: mgmt_class::SUBN_LID_ROUTED,
                class_version: 1,
                method,
                tid,
                attr_id,
                attr_mod,
                ..MadHdr::default()
            },
            mkey: 0,
            hop_ptr: 0,
            hop_cnt: 0,
            direction: false,
            dr_slid: 0,
            dr_dlid: 0,
            data: [0; SMP_DATA_LEN],
            initial_path: [0; 64],
            return_path: [0; 64],
        }
    }

    /// Whether this is a directed-route SMP.
    pub fn is_dr(&self) -> bool {
        self.hdr.mgmt_class == mgmt_class::SUBN_DIRECTED_ROUTE
    }

    /// Reads an SMP from a 256-byte MAD.
    pub fn parse(b: &[u8]) -> Result<Smp, PacketError> {
        need(b, MAD_LEN, "SMP")?;
        let hdr = MadHdr::parse(b)?;
        let dr = hdr.mgmt_class == mgmt_class::SUBN_DIRECTED_ROUTE;
        if !dr && hdr.mgmt_class != mgmt_class::SUBN_LID_ROUTED {
            return Err(PacketError::BadMad("not a subnet management class"));
        }
        let mut data = [0u8; SMP_DATA_LEN];
        data.copy_from_slice(&b[SMP_DATA..SMP_DATA + SMP_DATA_LEN]);
        let mut initial_path = [0u8; 64];
        let mut return_path = [0u8; 64];
        if dr {
            initial_path.copy_from_slice(&b[128..192]);
            return_path.copy_from_slice(&b[192..256]);
        }
        let mut hdr = hdr;
        let status = hdr.status;
        if dr {
            hdr.status &= !mad_status::DIRECTION;
            hdr.class_specific = 0;
        }
        Ok(Smp {
            hdr,
            mkey: be64(b, 24),
            hop_ptr: if dr { b[6] } else { 0 },
            hop_cnt: if dr { b[7] } else { 0 },
            direction: dr && status & mad_status::DIRECTION != 0,
            dr_slid: if dr { be16(b, 32) } else { 0 },
            dr_dlid: if dr { be16(b, 34) } else { 0 },
            data,
            initial_path,
            return_path,
        })
    }

    /// Writes the SMP as a 256-byte MAD.
    pub fn to_bytes(&self) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        let mut h = self.hdr;
        if self.is_dr() {
            h.class_specific = u16::from(self.hop_ptr) << 8 | u16::from(self.hop_cnt);
            h.status = (h.status & !mad_status::DIRECTION)
                | if self.direction {
                    mad_status::DIRECTION
                } else {
                    0
                };
        }
        h.write(&mut b);
        b[24..32].copy_from_slice(&self.mkey.to_be_bytes());
        if self.is_dr() {
            b[32..34].copy_from_slice(&self.dr_slid.to_be_bytes());
            b[34..36].copy_from_slice(&self.dr_dlid.to_be_bytes());
            b[128..192].copy_from_slice(&self.initial_path);
            b[192..256].copy_from_slice(&self.return_path);
        }
        b[SMP_DATA..SMP_DATA + SMP_DATA_LEN].copy_from_slice(&self.data);
        b
    }
}

/// Headers of a UD packet carrying a MAD to QP0 (SMP, VL15) or QP1 (GMP,
/// VL 0): LRH, BTH (UD SEND Only, P_Key), DETH (Q_Key 0 for QP0,
/// 0x80010000 for QP1).
pub fn mad_headers(dlid: u16, slid: u16, dest_qp: u32, src_qp: u32, pkey: u16) -> Headers {
    let smi = dest_qp == 0;
    Headers {
        lrh: Lrh {
            vl: if smi { 15 } else { 0 },
            dlid,
            slid,
            ..Lrh::default()
        },
        bth: Bth {
            opcode: opcode::UD_SEND_ONLY,
            pkey,
            dest_qp,
            ..Bth::default()
        },
        deth: Some(Deth {
            qkey: if smi { 0 } else { GSI_QKEY },
            src_qp,
        }),
        ..Headers::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smp_dr_fields() {
        let mut s = Smp::dr_get(7, attr::PORT_INFO, 3, &[1, 5, 2]).unwrap();
        s.hop_ptr = 2;
        s.direction = true;
        s.return_path[1] = 9;
        let b = s.to_bytes();
        assert_eq!(&b[0..4], &[1, 0x81, 1, 1]);
        assert_eq!(&b[4..8], &[0x80, 0, 2, 3], "D bit, hop pointer, hop count");
        assert_eq!(&b[32..36], &[0xff, 0xff, 0xff, 0xff], "DrSLID, DrDLID");
        assert_eq!(&b[128..132], &[0, 1, 5, 2], "initial path");
        assert_eq!(b[193], 9, "return path");
        assert_eq!(Smp::parse(&b).unwrap(), s);
        assert!(Smp::dr_get(1, 1, 0, &[1; 64]).is_err());
    }
}
