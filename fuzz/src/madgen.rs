//! Structure-aware MADs: a template a real sender would build, then edits to its header fields and bytes.
//!
//! A raw 256-byte string almost never has base version 1, a class the
//! layer knows and a TID an agent is waiting for; these inputs start from
//! one and let libFuzzer take it apart field by field.

use arbitrary::Arbitrary;
use ib_core::mad::{Mad, attr, class, method};
use ib_core::mad_rmpp::{RmppHdr, rmpp_type};

/// Where a MAD starts.
#[derive(Arbitrary, Debug, Clone)]
pub enum Base {
    /// A directed-route SMP (path, hop pointer and count, DR LIDs).
    DrSmp {
        method: u8,
        attr: u16,
        hop_cnt: u8,
        hop_ptr: u8,
        direction: bool,
        path: [u8; 4],
        permissive_slid: bool,
        permissive_dlid: bool,
    },
    /// A LID-routed SMP.
    LidSmp {
        method: u8,
        attr: u16,
        attr_mod: u32,
    },
    /// A GMP of `class` (PMA, SA, CM, device management, vendor...).
    Gmp {
        class: ClassPick,
        version: u8,
        method: u8,
        attr: u16,
        attr_mod: u32,
    },
    /// An RMPP segment (SA GetTable, as OpenSM sends them).
    Rmpp {
        method: u8,
        rtype: u8,
        flags: u8,
        status: u8,
        seg_num: u8,
        paylen: u16,
        attr: u16,
    },
    /// Bytes as they come (zero-padded to 256).
    Raw(Vec<u8>),
}

/// Classes a MAD is most often built for, or any byte.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum ClassPick {
    Pma,
    Sa,
    Cm,
    DevMgmt,
    Vendor(u8),
    Any(u8),
}

impl ClassPick {
    pub fn byte(self) -> u8 {
        match self {
            ClassPick::Pma => class::PERF_MGMT,
            ClassPick::Sa => class::SUBN_ADM,
            ClassPick::Cm => class::CM,
            ClassPick::DevMgmt => class::DEVICE_MGMT,
            ClassPick::Vendor(v) => class::VENDOR_RANGE2_START + v % 0x20,
            ClassPick::Any(b) => b,
        }
    }
}

/// A TID: as given, or one an agent of the rig is waiting for.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum TidPick {
    Raw(u64),
    /// `(hi_tid of agent [i % n]) << 32 | low`.
    Agent(u8, u8),
}

/// One change to the template.
#[derive(Arbitrary, Debug, Clone)]
pub enum Edit {
    Byte(u8, u8),
    BaseVersion(u8),
    ClassVersion(u8),
    Method(u8),
    Status(u16),
    Class(u8),
    AttrId(u16),
    AttrMod(u32),
    HopCnt(u8),
    HopPtr(u8),
    Tid(TidPick),
    /// Bytes written from offset `.0` on (wrapping at 256).
    Splice(u8, Vec<u8>),
}

/// A MAD to build.
#[derive(Arbitrary, Debug, Clone)]
pub struct MadSpec {
    pub base: Base,
    pub tid: TidPick,
    pub edits: Vec<Edit>,
}

fn pick_method(m: u8, choices: &[u8]) -> u8 {
    if m & 0x80 != 0 {
        m
    } else {
        choices[usize::from(m) % choices.len()]
    }
}

/// Resolves a TID against the rig's agents' `hi_tid`s.
pub fn tid(t: TidPick, hi_tids: &[u32]) -> u64 {
    match t {
        TidPick::Raw(v) => v,
        TidPick::Agent(i, low) => {
            let hi = if hi_tids.is_empty() {
                0
            } else {
                hi_tids[usize::from(i) % hi_tids.len()]
            };
            (u64::from(hi) << 32) | u64::from(low)
        }
    }
}

impl MadSpec {
    /// The MAD, with TIDs resolved against `hi_tids`.
    pub fn build(&self, hi_tids: &[u32]) -> Mad {
        let methods = [
            method::GET,
            method::SET,
            method::GET_RESP,
            method::SEND,
            method::TRAP,
            method::REPORT,
            method::GET_TABLE,
            0x92, // GetTableResp
            method::TRAP_REPRESS,
        ];
        let mut m = match &self.base {
            Base::DrSmp {
                method,
                attr,
                hop_cnt,
                hop_ptr,
                direction,
                path,
                permissive_slid,
                permissive_dlid,
            } => {
                let mut m = Mad::new_request(
                    class::SUBN_DIRECTED_ROUTE,
                    1,
                    pick_method(*method, &methods),
                    smp_attr(*attr),
                    0,
                );
                m.set_hop_cnt(hop_cnt % 66);
                m.set_hop_ptr(hop_ptr % 66);
                if *direction {
                    m.set_status(ib_core::mad::status::IB_SMP_DIRECTION);
                }
                for (i, p) in path.iter().enumerate() {
                    m.set_initial_path(i as u8, p % 4);
                    m.set_return_path(i as u8, p / 64);
                }
                m.set_dr_slid(if *permissive_slid { 0xffff } else { 1 });
                m.set_dr_dlid(if *permissive_dlid { 0xffff } else { 20 });
                m
            }
            Base::LidSmp {
                method,
                attr,
                attr_mod,
            } => Mad::new_request(
                class::SUBN_LID_ROUTED,
                1,
                pick_method(*method, &methods),
                smp_attr(*attr),
                *attr_mod,
            ),
            Base::Gmp {
                class,
                version,
                method,
                attr,
                attr_mod,
            } => {
                let c = class.byte();
                let v = match (c, version % 4) {
                    (class::SUBN_ADM, 0) => 2,
                    (class::CM, 0) => 2,
                    (_, 0) => 1,
                    (_, _) => *version,
                };
                let mut m =
                    Mad::new_request(c, v, pick_method(*method, &methods), *attr, *attr_mod);
                if matches!(class, ClassPick::Vendor(_)) {
                    // OUI 0x001405 (ibping's) in the vendor header.
                    m.0[37..40].copy_from_slice(&[0x00, 0x14, 0x05]);
                }
                m
            }
            Base::Rmpp {
                method,
                rtype,
                flags,
                status,
                seg_num,
                paylen,
                attr,
            } => {
                let mut m = Mad::new_request(
                    class::SUBN_ADM,
                    2,
                    pick_method(*method, &[0x92, method::GET_TABLE, method::GET_RESP]),
                    if *attr & 0x8000 != 0 {
                        *attr
                    } else {
                        [0x35u16, 0x11, 0x12][usize::from(*attr) % 3]
                    },
                    0,
                );
                RmppHdr {
                    version: 1,
                    rtype: if rtype & 0x80 != 0 {
                        *rtype
                    } else {
                        [
                            rmpp_type::DATA,
                            rmpp_type::ACK,
                            rmpp_type::STOP,
                            rmpp_type::ABORT,
                        ][usize::from(*rtype) % 4]
                    },
                    flags: *flags,
                    status: *status,
                    seg_num: u32::from(*seg_num),
                    paylen_newwin: u32::from(*paylen),
                }
                .write(&mut m);
                m
            }
            Base::Raw(b) => Mad::from_bytes(b),
        };
        if !matches!(self.base, Base::Raw(_)) {
            m.set_tid(tid(self.tid, hi_tids));
        }
        for e in &self.edits {
            apply(&mut m, e, hi_tids);
        }
        m
    }
}

fn smp_attr(a: u16) -> u16 {
    if a & 0x8000 != 0 {
        a & 0x7fff
    } else {
        [
            attr::NODE_INFO,
            attr::PORT_INFO,
            attr::NODE_DESC,
            attr::GUID_INFO,
            attr::PKEY_TABLE,
            attr::SM_INFO,
            attr::SL_TO_VL_TABLE,
            attr::VL_ARB_TABLE,
            attr::NOTICE,
            attr::SWITCH_INFO,
        ][usize::from(a) % 10]
    }
}

/// Applies one edit to `m` (TIDs resolved against `hi_tids`).
pub fn apply(m: &mut Mad, e: &Edit, hi_tids: &[u32]) {
    match e {
        Edit::Byte(at, v) => m.0[usize::from(*at)] = *v,
        Edit::BaseVersion(v) => m.set_base_version(*v),
        Edit::ClassVersion(v) => m.set_class_version(*v),
        Edit::Method(v) => m.set_method(*v),
        Edit::Status(v) => m.set_status(*v),
        Edit::Class(v) => m.set_mgmt_class(*v),
        Edit::AttrId(v) => m.set_attr_id(*v),
        Edit::AttrMod(v) => m.set_attr_mod(*v),
        Edit::HopCnt(v) => m.set_hop_cnt(*v),
        Edit::HopPtr(v) => m.set_hop_ptr(*v),
        Edit::Tid(t) => m.set_tid(tid(*t, hi_tids)),
        Edit::Splice(at, bytes) => {
            for (i, b) in bytes.iter().take(256).enumerate() {
                m.0[(usize::from(*at) + i) & 255] = *b;
            }
        }
    }
}
