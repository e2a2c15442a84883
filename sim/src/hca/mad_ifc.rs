//! The firmware's subnet-management and performance-management agents behind MAD_IFC.
//!
//! SubnGet/SubnSet of NodeDescription, NodeInfo, PortInfo, GUIDInfo,
//! PKeyTable, SLtoVLMappingTable and VLArbitrationTable (LID-routed and
//! directed-route SMPs, processed locally), M_Key protection with its lease,
//! the SMA's traps (Bad M_Key 256, Bad P_Key 257), and PMA ClassPortInfo /
//! PortCounters / PortCountersExtended (the counters the data-path engines
//! keep); SMInfo, B_Key checks, trap repetition and directed-route
//! forwarding are not modelled.
//!
//! Layouts are the IBA's (vol. 1, 13.4 MAD header, 14.2.5 SMP attributes,
//! 16.1 PMA): MAD header 24 bytes (attribute id at 0x10, modifier at 0x14),
//! SMP M_Key at 0x18, SMP and PMA data at 0x40. Responses are GetResp
//! (0x81) copies of the request with the IBA status field set; Linux's
//! mlx4_ib adds the directed-route D bit itself, so the firmware does not.
//!
//! # Decisions
//!
//! * M_Key (IBA 14.2.4): a port whose M_Key is 0 checks nothing; otherwise
//!   a Set or TrapRepress without the key fails at every protection level,
//!   a Get fails from level 2 on, and at level 1 a Get without the key
//!   succeeds with PortInfo's M_Key field zero. A failed check drops the
//!   SMP (MAD_IFC answers BAD_PKT, the driver sends nothing), counts
//!   M_KeyViolations, starts the lease timer if the lease period is not 0
//!   and sends trap 256; the timer runs out `M_KeyLeasePeriod` seconds
//!   later unless an SMP with the key comes first, and then the protection
//!   bits fall to 0 (the SM can read the key again). MAD_IFC's "ignore
//!   M_Key" (the driver's own queries) skips the check.
//! * Traps go as a ConnectX firmware sends them: the SMA builds a
//!   SubnTrap(Notice) (class 0x01, method 0x05, attribute 0x0002, the
//!   Notice of 13.4.8.2 with the DataDetails of 14.2.5.1, IssuerGID left
//!   out as an SMP has no room for it) and the card delivers it to the
//!   port's QP0 as a MAD received with SLID 0; the driver forwards it to
//!   the SM (Linux mlx4_ib `forward_trap`). Each trap is sent once: the
//!   SMA does not repeat it until a TrapRepress comes (the fabric's ibsim
//!   server, like ibsim, drops OpenSM's TrapRepress). A port sends traps
//!   only while Active with an SM LID.
//! * SLtoVLMappingTable and VLArbitrationTable of a CA port: the attribute
//!   modifier's port bits are ignored (the port is the one the SMP came
//!   in on, as ibsim does); VLArbitration blocks 1 (low, entries 0-31) and
//!   3 (high, 0-31) exist, of which the first 8 entries (the capacities
//!   PortInfo reports) are kept; blocks 2 and 4 are an invalid field.
//! * FDR (MT27500 FCBT): PortInfo reports LinkSpeedActive QDR with
//!   LinkSpeedExtSupported FDR and LinkSpeedExtActive FDR while the link
//!   is up and FDR enabled, as a ConnectX-3 on an FDR switch does; a Set
//!   takes LinkSpeedExtEnabled only with the attribute modifier's bit 31
//!   (SMSupportsExtendedSpeeds): 0 no change, 30 disable, 31 all
//!   supported.

use crate::fabric::LogicalState;
use crate::hca::device::Hca;
use crate::hca::hcr::Status;
use crate::hca::layout::{get8, get16, get32, get64, put8, put16, put32, put64};
use crate::hca::port::Port;

/// MAD size.
pub const MAD_SIZE: usize = 256;
/// SMP/PMA data offset.
pub const DATA: usize = 0x40;

/// Management classes.
pub mod class {
    #![allow(missing_docs)]
    pub const SUBN_LID_ROUTED: u8 = 0x01;
    pub const SUBN_DIRECTED_ROUTE: u8 = 0x81;
    pub const PERF_MGMT: u8 = 0x04;
    pub const VENDOR_09: u8 = 0x09;
    pub const VENDOR_0A: u8 = 0x0a;
    pub const CONG_MGMT: u8 = 0x21;
}

/// Methods.
pub mod method {
    #![allow(missing_docs)]
    pub const GET: u8 = 0x01;
    pub const SET: u8 = 0x02;
    pub const TRAP: u8 = 0x05;
    pub const TRAP_REPRESS: u8 = 0x07;
    pub const GET_RESP: u8 = 0x81;
}

/// Attribute ids.
pub mod attr {
    #![allow(missing_docs)]
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    pub const NODE_DESC: u16 = 0x0010;
    pub const NODE_INFO: u16 = 0x0011;
    pub const GUID_INFO: u16 = 0x0014;
    pub const NOTICE: u16 = 0x0002;
    pub const PORT_INFO: u16 = 0x0015;
    pub const PKEY_TABLE: u16 = 0x0016;
    pub const SL_TO_VL_TABLE: u16 = 0x0017;
    pub const VL_ARB_TABLE: u16 = 0x0018;
    pub const SM_INFO: u16 = 0x0020;
    pub const PORT_COUNTERS: u16 = 0x0012;
    pub const PORT_COUNTERS_EXT: u16 = 0x001d;
    pub const VENDOR_EXT_PORT_INFO: u16 = 0xff90;
}

/// MAD status values (IBA 13.4.7).
pub mod mad_status {
    #![allow(missing_docs)]
    pub const BAD_VERSION: u16 = 0x0004;
    pub const METHOD_UNSUPPORTED: u16 = 0x0008;
    pub const ATTR_UNSUPPORTED: u16 = 0x000c;
    pub const INVALID_FIELD: u16 = 0x001c;
}

/// Mellanox's IEEE OUI.
pub const VENDOR_ID: u32 = 0x0002c9;

/// Processes one MAD for port index `pi` and returns the response MAD.
pub fn process(hca: &mut Hca, pi: usize, op_mod: u8, mad: &[u8]) -> Result<Vec<u8>, Status> {
    process_from(hca, pi, op_mod, None, mad)
}

/// [`process`] for a MAD from the link whose LRH SLID is known (MAD_IFC's
/// input modifier carries it): the SLID a Bad M_Key trap names.
pub fn process_from(
    hca: &mut Hca,
    pi: usize,
    op_mod: u8,
    slid: Option<u16>,
    mad: &[u8],
) -> Result<Vec<u8>, Status> {
    if get8(mad, 0) != 1 {
        return Err(Status::BAD_PKT);
    }
    let cls = get8(mad, 1);
    let meth = get8(mad, 3);
    if meth & 0x80 != 0 {
        return Err(Status::BAD_PKT);
    }
    let mut r = mad[..MAD_SIZE.min(mad.len())].to_vec();
    r.resize(MAD_SIZE, 0);
    let status = match cls {
        class::SUBN_LID_ROUTED | class::SUBN_DIRECTED_ROUTE => {
            if get8(mad, 2) != 1 {
                Ok(mad_status::BAD_VERSION)
            } else {
                smp(hca, pi, op_mod, slid, mad, &mut r)
            }
        }
        class::PERF_MGMT => {
            if get8(mad, 2) != 1 {
                Ok(mad_status::BAD_VERSION)
            } else {
                pma(hca, pi, mad, &mut r)
            }
        }
        class::VENDOR_09 | class::VENDOR_0A | class::CONG_MGMT => Ok(mad_status::ATTR_UNSUPPORTED),
        _ => Err(Status::BAD_PKT),
    }?;
    if meth != method::TRAP_REPRESS {
        put8(&mut r, 3, method::GET_RESP);
    }
    let keep_d = get16(&r, 4) & 0x8000;
    put16(&mut r, 4, status | keep_d);
    Ok(r)
}

fn smp(
    hca: &mut Hca,
    pi: usize,
    op_mod: u8,
    slid: Option<u16>,
    mad: &[u8],
    r: &mut [u8],
) -> Result<u16, Status> {
    let meth = get8(mad, 3);
    let id = get16(mad, 0x10);
    let modifier = get32(mad, 0x14);
    let ignore_mkey = op_mod & 1 != 0;
    let key = get64(mad, 0x18);
    mkey_lease(hca, pi);
    if !ignore_mkey && !mkey_check(hca, pi, meth, key) {
        mkey_violation(hca, pi, slid, mad);
        return Err(Status::BAD_PKT);
    }
    if meth == method::TRAP_REPRESS {
        return Ok(0);
    }
    if meth != method::GET && meth != method::SET {
        return Ok(mad_status::METHOD_UNSUPPORTED);
    }
    let set = meth == method::SET;
    let data = &mad[DATA..DATA + 64];
    let out = &mut r[DATA..DATA + 64];
    match (id, set) {
        (attr::NODE_DESC, false) => {
            out.fill(0);
            for (o, c) in out.iter_mut().zip(hca.cfg.node_description.bytes()) {
                *o = c;
            }
        }
        (attr::NODE_INFO, false) => {
            out.fill(0);
            put8(out, 0, 1);
            put8(out, 1, 1);
            put8(out, 2, 1); // channel adapter
            put8(out, 3, hca.ports.len() as u8);
            put64(out, 4, hca.cfg.sys_image_guid);
            put64(out, 12, hca.cfg.node_guid);
            put64(out, 20, hca.ports[pi].guid());
            put16(out, 28, crate::hca::port::PKEY_TABLE_LEN as u16);
            put16(out, 30, crate::hca::pci::DEVICE_CONNECTX3);
            put32(out, 32, hca.cfg.hw_rev);
            put32(out, 36, u32::from(hca.ports[pi].num) << 24 | VENDOR_ID);
        }
        (attr::GUID_INFO, _) => {
            let block = modifier as usize;
            if (block + 1) * 8 > crate::hca::port::GUID_TABLE_LEN {
                return Ok(mad_status::INVALID_FIELD);
            }
            if set {
                // Index 0 (the port GUID) is read-only.
                for k in 0..8 {
                    if block * 8 + k != 0 {
                        hca.ports[pi].guids[block * 8 + k] = get64(data, k * 8);
                    }
                }
            }
            for k in 0..8 {
                put64(out, k * 8, hca.ports[pi].guids[block * 8 + k]);
            }
        }
        (attr::PKEY_TABLE, _) => {
            let block = (modifier & 0xffff) as usize;
            if (block + 1) * 32 > crate::hca::port::PKEY_TABLE_LEN {
                return Ok(mad_status::INVALID_FIELD);
            }
            if set {
                for k in 0..32 {
                    hca.ports[pi].pkeys[block * 32 + k] = get16(data, k * 2);
                }
            }
            for k in 0..32 {
                put16(out, k * 2, hca.ports[pi].pkeys[block * 32 + k]);
            }
        }
        (attr::PORT_INFO, _) => {
            // The port is the modifier's low byte; bit 31 is the SM's
            // SMSupportsExtendedSpeeds flag (OpenSM sets it for a port
            // whose CapabilityMask has IsExtendedSpeedsSupported).
            let port = modifier & 0xff;
            let target = if port == 0 {
                Some(pi)
            } else {
                hca.port_index(port)
            };
            let Some(ti) = target else {
                return Ok(mad_status::INVALID_FIELD);
            };
            let ext_speeds = modifier & 0x8000_0000 != 0;
            // Protection level 1: a Get without the key reads M_Key 0
            // (judged before a Set, whose answer shows what it set).
            let hide_mkey = !ignore_mkey && !mkey_visible(&hca.ports[ti], key);
            if set {
                let before = hca.ports[ti].state;
                if let Err(s) = port_info_set(&mut hca.ports[ti], data, ext_speeds) {
                    encode_port_info(&hca.ports[ti], out);
                    return Ok(s);
                }
                hca.port_changed(ti, before);
            }
            encode_port_info(&hca.ports[ti], out);
            if hide_mkey {
                out[..8].fill(0);
            }
        }
        (attr::SL_TO_VL_TABLE, _) => {
            let p = &mut hca.ports[pi];
            if set {
                p.sl2vl.copy_from_slice(&data[..8]);
            }
            out.fill(0);
            out[..8].copy_from_slice(&p.sl2vl);
        }
        (attr::VL_ARB_TABLE, _) => {
            let p = &mut hca.ports[pi];
            let table = match modifier >> 16 {
                1 => &mut p.vlarb_low,
                3 => &mut p.vlarb_high,
                _ => return Ok(mad_status::INVALID_FIELD),
            };
            if set {
                for (k, e) in table.iter_mut().enumerate() {
                    *e = [data[2 * k] & 0xf, data[2 * k + 1]];
                }
            }
            out.fill(0);
            for (k, e) in table.iter().enumerate() {
                out[2 * k..2 * k + 2].copy_from_slice(e);
            }
        }
        (attr::VENDOR_EXT_PORT_INFO, false) => out.fill(0),
        _ => return Ok(mad_status::ATTR_UNSUPPORTED),
    }
    Ok(0)
}

/// The M_Key lease timer of port index `pi` runs out (IBA 14.2.4.2): the
/// protection bits fall to 0. Looked at when an SMP comes (the model's
/// clock is read then; nothing else sees the bits).
fn mkey_lease(hca: &mut Hca, pi: usize) {
    let now = hca.clock.now_ns();
    let p = &mut hca.ports[pi];
    if p.mkey_lease_due.is_some_and(|due| due <= now) {
        p.mkey_lease_due = None;
        p.mkey_protect = 0;
    }
}

/// M_Key check of an SMP with method `meth` and key `key` at port index
/// `pi` (IBA 14.2.4.1): false if it fails. An SMP with the key stops a
/// running lease timer.
fn mkey_check(hca: &mut Hca, pi: usize, meth: u8, key: u64) -> bool {
    let p = &mut hca.ports[pi];
    if p.mkey == 0 {
        return true;
    }
    if key == p.mkey {
        p.mkey_lease_due = None;
        return true;
    }
    let protected = meth == method::SET || meth == method::TRAP_REPRESS || p.mkey_protect >= 2;
    !protected
}

/// The port's M_Key reads as itself in a PortInfo answered to an SMP with
/// key `key` (protection level 0, or the right key); else as 0.
fn mkey_visible(p: &Port, key: u64) -> bool {
    p.mkey == 0 || key == p.mkey || p.mkey_protect == 0
}

/// An SMP failed the M_Key check: M_KeyViolations, the lease timer, and
/// trap 256 (IBA 14.2.5.1 table: LIDADDR, DRSLID, Method, AttributeID,
/// AttributeModifier, M_Key, DRNotice/DRPathTruncated/DRHopCount and the
/// return path of a directed-route SMP).
fn mkey_violation(hca: &mut Hca, pi: usize, slid: Option<u16>, mad: &[u8]) {
    let now = hca.clock.now_ns();
    let p = &mut hca.ports[pi];
    p.mkey_violations = p.mkey_violations.saturating_add(1);
    if p.mkey_lease != 0 && p.mkey_lease_due.is_none() {
        p.mkey_lease_due = Some(now.saturating_add(u64::from(p.mkey_lease) * 1_000_000_000));
    }
    let dr = get8(mad, 1) == class::SUBN_DIRECTED_ROUTE;
    let mut d = [0u8; NOTICE_DETAILS];
    put16(&mut d, 0, slid.unwrap_or(0xffff));
    if dr {
        put16(&mut d, 2, get16(mad, 0x20));
    }
    put8(&mut d, 4, get8(mad, 3));
    put16(&mut d, 6, get16(mad, 0x10));
    put32(&mut d, 8, get32(mad, 0x14));
    put64(&mut d, 12, get64(mad, 0x18));
    if dr {
        let hops = get8(mad, 5) & 0x3f;
        let n = usize::from(hops) + 1;
        let truncated = n > 30;
        put8(&mut d, 20, 0x80 | u8::from(truncated) << 6 | hops);
        let n = n.min(30).min(mad.len().saturating_sub(0xc0));
        d[21..21 + n].copy_from_slice(&mad[0xc0..0xc0 + n]);
    }
    send_trap(hca, pi, trap::BAD_MKEY, &d);
}

/// Trap numbers of the SMA (IBA 14.2.5.1).
pub mod trap {
    #![allow(missing_docs)]
    pub const LOCAL_CHANGES: u16 = 144;
    pub const BAD_MKEY: u16 = 256;
    pub const BAD_PKEY: u16 = 257;
}

/// Notice types (IBA 13.4.8.2).
pub mod notice_type {
    #![allow(missing_docs)]
    pub const SECURITY: u8 = 2;
    pub const INFO: u8 = 4;
}

/// Trap 144 (local changes) for a new CapabilityMask of port index `pi`,
/// as a ConnectX-3 SMA sends it when the driver changes the mask (SET_PORT:
/// IsSM set or cleared by an SM starting or stopping on the port). IBA
/// 14.2.5.1 DataDetails: reserved 16, LIDADDR, reserved 7 /
/// OtherLocalChanges 1 (0: the change is the mask's), CapabilityMask,
/// change flags 0 (no link speed/width or NodeDescription change).
pub fn capability_mask_trap(hca: &mut Hca, pi: usize) {
    let p = &hca.ports[pi];
    let mut d = [0u8; NOTICE_DETAILS];
    put16(&mut d, 2, p.lid);
    put32(&mut d, 6, p.cap_mask);
    send_notice(hca, pi, notice_type::INFO, trap::LOCAL_CHANGES, &d);
}

/// A P_Key violation seen at the port (IBA 10.9.3) for trap 257: the
/// packet's P_Key, its source (LID, QP, SL, GID if it had a GRH) and its
/// destination here.
#[derive(Debug, Clone, Copy)]
pub struct BadKey {
    /// The P_Key the packet carried.
    pub key: u16,
    /// LRH SLID.
    pub slid: u16,
    /// LRH DLID.
    pub dlid: u16,
    /// LRH SL.
    pub sl: u8,
    /// Source QP (DETH; for RC/UC the QP context's remote QP).
    pub src_qp: u32,
    /// Destination QP.
    pub dst_qp: u32,
    /// The GRH's SGID and DGID, if it had one.
    pub gids: Option<([u8; 16], [u8; 16])>,
}

/// Trap 257 for a P_Key violation at port index `pi` (IBA 14.2.5.1:
/// reserved 16, LIDADDR1, LIDADDR2, KEY 32, SL 4 / reserved 4 / QP1 24,
/// reserved 8 / QP2 24, GIDADDR1, GIDADDR2); PortInfo's P_KeyViolations
/// is the caller's to count.
pub fn bad_pkey_trap(hca: &mut Hca, pi: usize, b: &BadKey) {
    let mut d = [0u8; NOTICE_DETAILS];
    put16(&mut d, 2, b.slid);
    put16(&mut d, 4, b.dlid);
    put32(&mut d, 6, u32::from(b.key));
    put32(
        &mut d,
        10,
        u32::from(b.sl & 0xf) << 28 | (b.src_qp & 0xff_ffff),
    );
    put32(&mut d, 14, b.dst_qp & 0xff_ffff);
    if let Some((sgid, dgid)) = b.gids {
        d[18..34].copy_from_slice(&sgid);
        d[34..50].copy_from_slice(&dgid);
    }
    send_trap(hca, pi, trap::BAD_PKEY, &d);
}

/// Bytes of a Notice's DataDetails.
pub const NOTICE_DETAILS: usize = 54;

/// Sends trap `num` with DataDetails `details` from port index `pi` to its
/// SM: a SubnTrap(Notice) delivered to the port's QP0 as a MAD received
/// with SLID 0, for the driver to forward (the module's "Decisions").
/// Nothing while the port is not Active or knows no SM.
pub fn send_trap(hca: &mut Hca, pi: usize, num: u16, details: &[u8; NOTICE_DETAILS]) {
    send_notice(hca, pi, notice_type::SECURITY, num, details);
}

/// [`send_trap`] with the Notice's type `ntype` (security for 256/257,
/// informational for 144).
pub fn send_notice(hca: &mut Hca, pi: usize, ntype: u8, num: u16, details: &[u8; NOTICE_DETAILS]) {
    let p = &mut hca.ports[pi];
    if p.state != LogicalState::Active || p.sm_lid == 0 {
        return;
    }
    p.traps_sent = p.traps_sent.wrapping_add(1);
    let mut m = [0u8; MAD_SIZE];
    put8(&mut m, 0, 1);
    put8(&mut m, 1, class::SUBN_LID_ROUTED);
    put8(&mut m, 2, 1);
    put8(&mut m, 3, method::TRAP);
    put64(&mut m, 8, u64::from(p.num) << 32 | u64::from(p.traps_sent));
    put16(&mut m, 0x10, attr::NOTICE);
    put64(&mut m, 0x18, p.mkey);
    // Notice: IsGeneric | Type, ProducerType 1 (CA), TrapNumber,
    // IssuerLID; NoticeToggle/Count 0; DataDetails.
    let n = &mut m[DATA..DATA + 64];
    put32(n, 0, u32::from(0x80 | (ntype & 0x7f)) << 24 | 1);
    put16(n, 4, num);
    put16(n, 6, p.lid);
    n[10..10 + NOTICE_DETAILS].copy_from_slice(details);
    let port = p.num;
    crate::hca::engine::deliver_local_smp(hca, port, &m);
}

/// PortInfo (IBA 14.2.5.6) as the SMA reports it.
pub fn encode_port_info(p: &Port, out: &mut [u8]) {
    out[..64].fill(0);
    put64(out, 0, p.mkey);
    put64(out, 8, p.gid_prefix);
    put16(out, 16, p.lid);
    put16(out, 18, p.sm_lid);
    put32(out, 20, p.cap_mask);
    put16(out, 26, p.mkey_lease);
    put8(out, 28, p.num);
    put8(out, 29, 0x03); // width enabled: 1x, 4x
    put8(out, 30, 0x03); // width supported
    put8(out, 31, 0x02); // width active: 4x
    put8(out, 32, 0x70 | p.state as u8); // speed supported SDR/DDR/QDR
    put8(out, 33, (p.phys as u8) << 4 | 0x2); // link down default: polling
    put8(out, 34, p.mkey_protect << 6 | (p.lmc & 7));
    put8(out, 35, 0x40 | 0x07); // active QDR, enabled SDR/DDR/QDR
    put8(out, 36, p.neighbor_mtu << 4 | (p.sm_sl & 0xf));
    let vl_cap = match p.vl_cap {
        0 | 1 => 1,
        2 => 2,
        3 | 4 => 3,
        _ => 4,
    };
    put8(out, 37, vl_cap << 4);
    put8(out, 39, 8); // VL arbitration high cap
    put8(out, 40, 8); // VL arbitration low cap
    put8(out, 41, p.mtu_cap & 0xf);
    put8(out, 42, 0x1f); // HOQ life
    put8(out, 43, p.op_vls << 4);
    put16(out, 44, p.mkey_violations);
    put16(out, 46, p.pkey_violations);
    put16(out, 48, p.qkey_violations);
    put8(out, 50, crate::hca::port::GUID_TABLE_LEN as u8);
    put8(
        out,
        51,
        u8::from(p.client_rereg) << 7 | (p.subnet_timeout & 0x1f),
    );
    put8(out, 52, 0x10); // response time value
    put8(out, 53, p.error_thresholds); // LocalPhyErrors, OverrunErrors
    put8(
        out,
        62,
        p.link_speed_ext_active() << 4 | crate::hca::port::LINK_SPEED_EXT_SUPPORTED,
    );
    put8(out, 63, p.link_speed_ext_enabled & 0x1f);
}

/// Applies a SubnSet(PortInfo); an invalid state change leaves the port
/// untouched and answers "invalid field". `ext_speeds`: the SM set the
/// modifier's SMSupportsExtendedSpeeds bit (LinkSpeedExtEnabled counts).
fn port_info_set(p: &mut Port, d: &[u8], ext_speeds: bool) -> Result<(), u16> {
    let new_state = p
        .state
        .set_by_sm(get8(d, 32) & 0xf)
        .ok_or(mad_status::INVALID_FIELD)?;
    // A port's LID is unicast: multicast LIDs and the permissive LID are
    // refused (as the SMAs of qib and ipath, in software in Linux, do).
    let lid = get16(d, 16);
    if lid >= 0xc000 {
        return Err(mad_status::INVALID_FIELD);
    }
    p.mkey = get64(d, 0);
    p.gid_prefix = get64(d, 8);
    p.lid = lid;
    p.sm_lid = get16(d, 18);
    p.mkey_lease = get16(d, 26);
    p.mkey_protect = get8(d, 34) >> 6;
    p.lmc = get8(d, 34) & 7;
    let nmtu = get8(d, 36) >> 4;
    if nmtu != 0 {
        p.neighbor_mtu = nmtu.min(p.mtu_cap);
    }
    p.sm_sl = get8(d, 36) & 0xf;
    let op_vls = get8(d, 43) >> 4;
    if op_vls != 0 {
        p.op_vls = op_vls;
    }
    p.client_rereg = get8(d, 51) & 0x80 != 0;
    p.subnet_timeout = get8(d, 51) & 0x1f;
    p.error_thresholds = get8(d, 53);
    if ext_speeds {
        p.link_speed_ext_enabled = match get8(d, 63) & 0x1f {
            0 => p.link_speed_ext_enabled,
            30 => 0,
            31 => crate::hca::port::LINK_SPEED_EXT_SUPPORTED,
            v => v & crate::hca::port::LINK_SPEED_EXT_SUPPORTED,
        };
    }
    match new_state {
        Some(LogicalState::Down) => {
            // The link retrains: Down, then Init again if it is up.
            p.state = LogicalState::Down;
            p.retrain();
        }
        Some(s) => p.state = s,
        None => {}
    }
    Ok(())
}

fn pma(hca: &mut Hca, pi: usize, mad: &[u8], r: &mut [u8]) -> Result<u16, Status> {
    let meth = get8(mad, 3);
    let id = get16(mad, 0x10);
    if meth != method::GET && meth != method::SET {
        return Ok(mad_status::METHOD_UNSUPPORTED);
    }
    let out = &mut r[DATA..DATA + 192];
    match (id, meth) {
        (attr::CLASS_PORT_INFO, method::GET) => {
            out.fill(0);
            put8(out, 0, 1);
            put8(out, 1, 1);
            // CapabilityMask: AllPortSelect (bit 8), PortCountersExtended
            // supported (IsExtendedWidthSupported is bit 9: set, the
            // 64-bit data/packet counters are there).
            put16(out, 2, 1 << 8 | 1 << 9);
            put32(out, 4, 0x12); // RespTimeValue
        }
        (attr::PORT_COUNTERS_EXT, _) => {
            // IBA 16.1.4.11: PortSelect at 1, CounterSelect at 2, the
            // 64-bit counters from 8: XmitData, RcvData, XmitPkts,
            // RcvPkts, Unicast Xmit/Rcv, Multicast Xmit/Rcv.
            let select = get16(mad, DATA + 2);
            let c = &mut hca.ports[pi].counters;
            if meth == method::SET {
                if select & 1 != 0 {
                    c.ext_xmit_data = 0;
                }
                if select & 2 != 0 {
                    c.ext_rcv_data = 0;
                }
                if select & 4 != 0 {
                    c.ext_xmit_pkts = 0;
                }
                if select & 8 != 0 {
                    c.ext_rcv_pkts = 0;
                }
            }
            let c = *c;
            let port_select = get8(mad, DATA + 1);
            out.fill(0);
            put8(out, 1, port_select);
            put16(out, 2, select);
            put64(out, 8, c.ext_xmit_data);
            put64(out, 16, c.ext_rcv_data);
            put64(out, 24, c.ext_xmit_pkts);
            put64(out, 32, c.ext_rcv_pkts);
            // Every packet is unicast (multicast is not modelled).
            put64(out, 40, c.ext_xmit_pkts);
            put64(out, 48, c.ext_rcv_pkts);
        }
        (attr::PORT_COUNTERS, _) => {
            let select = get16(mad, DATA + 2);
            let c = &mut hca.ports[pi].counters;
            if meth == method::SET {
                if select & 1 != 0 {
                    c.symbol_errors = 0;
                }
                if select & 4 != 0 {
                    c.link_downed = 0;
                }
                if select & 8 != 0 {
                    c.rcv_errors = 0;
                }
                // IBTA table 247: CounterSelect bit 6 is PortXmitDiscards
                // (bit 7 is PortXmitConstraintErrors, not modelled).
                if select & 0x40 != 0 {
                    c.xmit_discards = 0;
                }
                if select & 0x800 != 0 {
                    c.vl15_dropped = 0;
                }
                if select & 0x1000 != 0 {
                    c.xmit_data = 0;
                }
                if select & 0x2000 != 0 {
                    c.rcv_data = 0;
                }
                if select & 0x4000 != 0 {
                    c.xmit_pkts = 0;
                }
                if select & 0x8000 != 0 {
                    c.rcv_pkts = 0;
                }
            }
            let c = *c;
            let port_select = get8(mad, DATA + 1);
            out.fill(0);
            put8(out, 1, port_select);
            put16(out, 2, select);
            put16(out, 4, c.symbol_errors);
            put8(out, 7, c.link_downed);
            put16(out, 8, c.rcv_errors);
            put16(out, 14, c.xmit_discards);
            put16(out, 22, c.vl15_dropped);
            put32(out, 24, c.xmit_data);
            put32(out, 28, c.rcv_data);
            put32(out, 32, c.xmit_pkts);
            put32(out, 36, c.rcv_pkts);
        }
        _ => return Ok(mad_status::ATTR_UNSUPPORTED),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hca::HcaConfig;

    #[test]
    fn port_info_golden() {
        let mut p = Port::new(2, &HcaConfig::default());
        p.initialized = true;
        p.retrain();
        p.state = LogicalState::Active;
        p.lid = 0x0012;
        p.sm_lid = 0x0001;
        p.sm_sl = 3;
        p.lmc = 1;
        p.subnet_timeout = 18;
        p.qkey_violations = 5;
        let mut d = [0u8; 64];
        encode_port_info(&p, &mut d);
        assert_eq!(&d[0..8], &[0; 8], "M_Key");
        assert_eq!(&d[8..16], &[0xfe, 0x80, 0, 0, 0, 0, 0, 0], "GID prefix");
        assert_eq!(&d[16..20], &[0x00, 0x12, 0x00, 0x01], "LID, SM LID");
        assert_eq!(&d[20..24], &[0x02, 0x51, 0x48, 0x68], "capability mask");
        assert_eq!(d[28], 2, "local port");
        assert_eq!((d[29], d[30], d[31]), (3, 3, 2), "widths");
        assert_eq!(d[32], 0x74, "speed supported | Active");
        assert_eq!(d[33], 0x52, "LinkUp | default Polling");
        assert_eq!(d[34], 0x01, "LMC");
        assert_eq!(d[35], 0x47, "QDR active | enabled");
        assert_eq!(d[36], 0x53, "neighbor MTU 4096 | SM SL");
        assert_eq!(d[37] >> 4, 4, "VL0-7");
        assert_eq!(d[41] & 0xf, 5, "MTU cap");
        assert_eq!(&d[48..50], &[0, 5], "Q_Key violations");
        assert_eq!(d[50], 128, "GUID cap");
        assert_eq!(d[51], 18, "subnet timeout");
        assert_eq!(d[62], 0x11, "LinkSpeedExtActive FDR | Supported FDR");
        assert_eq!(d[63], 0x01, "LinkSpeedExtEnabled FDR");
    }

    #[test]
    fn port_info_set_rules() {
        let mut p = Port::new(1, &HcaConfig::default());
        p.initialized = true;
        p.retrain();
        let mut d = [0u8; 64];
        encode_port_info(&p, &mut d);
        d[32] = (d[32] & 0xf0) | 2;
        assert_eq!(
            port_info_set(&mut p, &d, false),
            Err(mad_status::INVALID_FIELD),
            "Init cannot be set"
        );
        d[32] = (d[32] & 0xf0) | 3;
        d[16..18].copy_from_slice(&0xc001u16.to_be_bytes());
        assert_eq!(
            port_info_set(&mut p, &d, false),
            Err(mad_status::INVALID_FIELD),
            "multicast LID"
        );
        d[16..18].copy_from_slice(&0x0004u16.to_be_bytes());
        d[51] = 0x80 | 7;
        assert_eq!(port_info_set(&mut p, &d, false), Ok(()));
        assert_eq!(
            (p.state, p.lid, p.client_rereg, p.subnet_timeout),
            (LogicalState::Armed, 4, true, 7)
        );
        d[32] = (d[32] & 0xf0) | 1;
        assert_eq!(port_info_set(&mut p, &d, false), Ok(()));
        assert_eq!(
            p.state,
            LogicalState::Init,
            "Down retrains to Init while the link is up"
        );
    }

    #[test]
    fn port_info_modifier_bit_31_is_the_extended_speeds_flag() {
        // OpenSM's SubnSet(PortInfo) to a port advertising extended speeds
        // carries attribute modifier 0x8000_0001 (SMSupportsExtendedSpeeds
        // and port 1): the SMA answers for port 1, it does not refuse it.
        let mut hca = Hca::for_tests(HcaConfig::default());
        let mut mad = [0u8; MAD_SIZE];
        mad[0] = 1;
        mad[1] = class::SUBN_DIRECTED_ROUTE;
        mad[2] = 1;
        mad[3] = method::GET;
        mad[0x10..0x12].copy_from_slice(&attr::PORT_INFO.to_be_bytes());
        mad[0x14..0x18].copy_from_slice(&0x8000_0001u32.to_be_bytes());
        let r = process(&mut hca, 0, 1, &mad).expect("a response");
        assert_eq!(get16(&r, 4) & 0x7fff, 0, "status OK");
        assert_eq!(r[DATA + 28], 1, "LocalPortNum of port 1");
        mad[0x14..0x18].copy_from_slice(&0x8000_0003u32.to_be_bytes());
        let r = process(&mut hca, 0, 1, &mad).expect("a response");
        assert_eq!(get16(&r, 4), mad_status::INVALID_FIELD, "no port 3");
    }

    /// A subnet-management MAD (LID routed) with method `meth`, attribute
    /// `id`, modifier `modifier` and M_Key `key`.
    fn smp_mad(meth: u8, id: u16, modifier: u32, key: u64) -> [u8; MAD_SIZE] {
        let mut m = [0u8; MAD_SIZE];
        m[0] = 1;
        m[1] = class::SUBN_LID_ROUTED;
        m[2] = 1;
        m[3] = meth;
        m[8..16].copy_from_slice(&0x77u64.to_be_bytes());
        m[0x10..0x12].copy_from_slice(&id.to_be_bytes());
        m[0x14..0x18].copy_from_slice(&modifier.to_be_bytes());
        m[0x18..0x20].copy_from_slice(&key.to_be_bytes());
        m
    }

    /// Port 1 Active with LID 3, SM LID 1, M_Key 0x1234 at protection
    /// `level` and lease `lease` seconds, set by the SM's SubnSet.
    fn protected(level: u8, lease: u16) -> Hca {
        let mut hca = Hca::for_tests(HcaConfig::default());
        let p = &mut hca.ports[0];
        p.initialized = true;
        p.retrain();
        p.state = LogicalState::Active;
        p.lid = 3;
        p.sm_lid = 1;
        let mut set = smp_mad(method::SET, attr::PORT_INFO, 1, 0);
        let mut d = [0u8; 64];
        encode_port_info(&hca.ports[0], &mut d);
        d[0..8].copy_from_slice(&0x1234u64.to_be_bytes());
        d[26..28].copy_from_slice(&lease.to_be_bytes());
        d[34] = level << 6;
        d[32] &= 0xf0;
        set[DATA..DATA + 64].copy_from_slice(&d);
        let r = process(&mut hca, 0, 0, &set).expect("the first Set (M_Key 0 before)");
        assert_eq!(get16(&r, 4), 0);
        hca
    }

    fn port_info_get(hca: &mut Hca, key: u64) -> Result<Vec<u8>, Status> {
        process_from(
            hca,
            0,
            0,
            Some(9),
            &smp_mad(method::GET, attr::PORT_INFO, 1, key),
        )
    }

    /// IBA 14.2.4.1: what each M_Key protection level lets through without
    /// the key (with it, everything).
    #[test]
    fn mkey_protection_levels() {
        for level in 0..4u8 {
            let mut hca = protected(level, 0);
            // With the key: Get shows it.
            let r = port_info_get(&mut hca, 0x1234).expect("with the key");
            assert_eq!(get64(&r, DATA), 0x1234, "level {level}");
            // Without: level 0 shows the key, 1 reads 0, 2 and 3 drop it.
            let r = port_info_get(&mut hca, 0);
            match level {
                0 => assert_eq!(get64(&r.expect("level 0"), DATA), 0x1234),
                1 => {
                    let r = r.expect("level 1: the Get succeeds");
                    assert_eq!(get16(&r, 4), 0, "status");
                    assert_eq!(get64(&r, DATA), 0, "level 1: M_Key field zero");
                    assert_eq!(get16(&r, DATA + 16), 3, "the rest is there");
                    assert_eq!(r[DATA + 34] >> 6, 1, "protection bits");
                }
                _ => assert_eq!(r, Err(Status::BAD_PKT), "level {level}: dropped"),
            }
            let gets_dropped = u16::from(level >= 2);
            assert_eq!(hca.ports[0].mkey_violations, gets_dropped, "level {level}");
            // A Set without the key fails at every level and changes
            // nothing.
            let mut set = smp_mad(method::SET, attr::PORT_INFO, 1, 0);
            let mut d = [0u8; 64];
            encode_port_info(&hca.ports[0], &mut d);
            d[16..18].copy_from_slice(&7u16.to_be_bytes());
            set[DATA..DATA + 64].copy_from_slice(&d);
            assert_eq!(process(&mut hca, 0, 0, &set), Err(Status::BAD_PKT));
            assert_eq!(hca.ports[0].lid, 3, "level {level}");
            assert_eq!(hca.ports[0].mkey_violations, gets_dropped + 1);
            // MAD_IFC's "ignore M_Key" (the driver's own query) sees it.
            let r = process(&mut hca, 0, 1, &smp_mad(method::GET, attr::PORT_INFO, 1, 0))
                .expect("ignore M_Key");
            assert_eq!(get64(&r, DATA), 0x1234);
        }
    }

    /// The SM's first Set installs the key at level 1 with M_Key 0 in the
    /// MAD (the port had none): its answer shows the key it set, as
    /// OpenSM takes the port's key from it for its later SMPs.
    #[test]
    fn the_set_that_installs_a_key_answers_with_it() {
        let mut hca = Hca::for_tests(HcaConfig::default());
        let mut set = smp_mad(method::SET, attr::PORT_INFO, 1, 0);
        let mut d = [0u8; 64];
        encode_port_info(&hca.ports[0], &mut d);
        d[0..8].copy_from_slice(&0x1234u64.to_be_bytes());
        d[34] = 1 << 6;
        d[32] &= 0xf0;
        set[DATA..DATA + 64].copy_from_slice(&d);
        let r = process(&mut hca, 0, 0, &set).unwrap();
        assert_eq!(get64(&r, DATA), 0x1234);
        let r = process(&mut hca, 0, 0, &smp_mad(method::GET, attr::PORT_INFO, 1, 0)).unwrap();
        assert_eq!(get64(&r, DATA), 0, "a Get without it reads 0");
    }

    /// IBA 14.2.4.2: a failed check starts the lease timer; when it runs
    /// out without the key, the protection bits fall to 0 and a Get
    /// without the key reads the key again. An SMP with the key stops it.
    #[test]
    fn the_mkey_lease_runs_out_and_the_protection_falls_to_zero() {
        let mut hca = protected(2, 2);
        assert_eq!(port_info_get(&mut hca, 0), Err(Status::BAD_PKT));
        hca.clock.delay(core::time::Duration::from_millis(1500));
        assert_eq!(port_info_get(&mut hca, 0), Err(Status::BAD_PKT), "not yet");
        hca.clock.delay(core::time::Duration::from_millis(600));
        let r = port_info_get(&mut hca, 0).expect("the lease ran out");
        assert_eq!(get64(&r, DATA), 0x1234, "level 0: the key is readable");
        assert_eq!(r[DATA + 34] >> 6, 0, "protection bits 0");
        assert_eq!(get16(&r, DATA + 26), 2, "the lease period stays");
        assert_eq!(hca.ports[0].mkey_violations, 2);
        // The right key stops a running timer.
        let mut hca = protected(2, 2);
        assert_eq!(port_info_get(&mut hca, 0), Err(Status::BAD_PKT));
        hca.clock.delay(core::time::Duration::from_secs(1));
        port_info_get(&mut hca, 0x1234).expect("with the key");
        hca.clock.delay(core::time::Duration::from_secs(5));
        assert_eq!(
            port_info_get(&mut hca, 0),
            Err(Status::BAD_PKT),
            "still protected"
        );
        // A lease period of 0 never runs out.
        let mut hca = protected(2, 0);
        assert_eq!(port_info_get(&mut hca, 0), Err(Status::BAD_PKT));
        hca.clock.delay(core::time::Duration::from_secs(3600));
        assert_eq!(port_info_get(&mut hca, 0), Err(Status::BAD_PKT));
    }

    /// A failed check sends trap 256 to the SM (here: counted, no QP0 to
    /// take it), only from an Active port that knows its SM.
    #[test]
    fn an_mkey_violation_sends_a_trap_from_an_active_port() {
        let mut hca = protected(2, 0);
        assert_eq!(port_info_get(&mut hca, 0), Err(Status::BAD_PKT));
        assert_eq!(hca.ports[0].traps_sent, 1);
        hca.ports[0].state = LogicalState::Armed;
        assert_eq!(port_info_get(&mut hca, 0), Err(Status::BAD_PKT));
        assert_eq!(hca.ports[0].traps_sent, 1, "no trap from an Armed port");
        assert_eq!(hca.ports[0].mkey_violations, 2);
    }

    /// LocalPhyErrors/OverrunErrors thresholds are read-write: a Get
    /// after OpenSM's Set of 8/8 reads 8/8 (it read 0, so every heavy
    /// sweep wrote them again).
    #[test]
    fn error_thresholds_read_back_as_set() {
        let mut hca = protected(0, 0);
        let d = port_info_get(&mut hca, 0).expect("PortInfo");
        let mut pi = [0u8; 64];
        pi.copy_from_slice(&d[DATA..DATA + 64]);
        pi[32] &= 0xf0;
        pi[53] = 0x88;
        let mut set = smp_mad(method::SET, attr::PORT_INFO, 1, 0x1234);
        set[DATA..DATA + 64].copy_from_slice(&pi);
        let r = process(&mut hca, 0, 0, &set).expect("a response");
        assert_eq!(get16(&r, 4), 0);
        assert_eq!(r[DATA + 53], 0x88, "the Set's answer");
        let d = port_info_get(&mut hca, 0).expect("PortInfo");
        assert_eq!(d[DATA + 53], 0x88, "LocalPhyErrors 8, OverrunErrors 8");
    }

    /// A new CapabilityMask (SET_PORT) is reported to the SM with trap
    /// 144, only from an Active port that knows its SM.
    #[test]
    fn a_capability_mask_change_sends_trap_144_from_an_active_port() {
        let mut hca = protected(0, 0);
        let before = hca.ports[0].traps_sent;
        hca.ports[0].cap_mask |= 2;
        capability_mask_trap(&mut hca, 0);
        assert_eq!(hca.ports[0].traps_sent, before + 1);
        hca.ports[0].sm_lid = 0;
        capability_mask_trap(&mut hca, 0);
        assert_eq!(hca.ports[0].traps_sent, before + 1, "no SM to tell");
    }

    /// SLtoVLMappingTable and VLArbitrationTable: Get and Set kept per
    /// port, blocks beyond the capacities refused (as ibsim does).
    #[test]
    fn sl2vl_and_vlarb_tables_are_kept() {
        let mut hca = Hca::for_tests(HcaConfig::default());
        let r = process(
            &mut hca,
            0,
            1,
            &smp_mad(method::GET, attr::SL_TO_VL_TABLE, 0, 0),
        )
        .unwrap();
        assert_eq!((get16(&r, 4), &r[DATA..DATA + 8]), (0, &[0u8; 8][..]));
        let mut set = smp_mad(method::SET, attr::SL_TO_VL_TABLE, 0, 0);
        let map = [0x01, 0x23, 0x45, 0x67, 0x01, 0x23, 0x45, 0x6f];
        set[DATA..DATA + 8].copy_from_slice(&map);
        let r = process(&mut hca, 1, 1, &set).unwrap();
        assert_eq!(&r[DATA..DATA + 8], &map);
        assert_eq!(hca.ports[1].vl_of(3), 3);
        assert_eq!(hca.ports[1].vl_of(15), 15);
        assert_eq!(hca.ports[0].sl2vl, [0; 8], "port 1's table is its own");
        // VLArbitration: low (block 1) and high (block 3).
        let mut set = smp_mad(method::SET, attr::VL_ARB_TABLE, 1 << 16, 0);
        for k in 0..32 {
            set[DATA + 2 * k] = 0xf0 | (k as u8 & 7);
            set[DATA + 2 * k + 1] = 10 + k as u8;
        }
        let r = process(&mut hca, 0, 1, &set).unwrap();
        assert_eq!(get16(&r, 4), 0);
        assert_eq!(
            &r[DATA..DATA + 4],
            &[0, 10, 1, 11],
            "reserved VL bits dropped"
        );
        assert_eq!(&r[DATA + 16..DATA + 64], &[0u8; 48][..], "8 entries kept");
        let r = process(
            &mut hca,
            0,
            1,
            &smp_mad(method::GET, attr::VL_ARB_TABLE, 3 << 16 | 1, 0),
        )
        .unwrap();
        assert_eq!((get16(&r, 4), &r[DATA..DATA + 16]), (0, &[0u8; 16][..]));
        let r = process(
            &mut hca,
            0,
            1,
            &smp_mad(method::GET, attr::VL_ARB_TABLE, 1 << 16 | 1, 0),
        )
        .unwrap();
        assert_eq!(&r[DATA + 14..DATA + 16], &[7, 17]);
        for block in [0u32, 2, 4, 5] {
            let r = process(
                &mut hca,
                0,
                1,
                &smp_mad(method::GET, attr::VL_ARB_TABLE, block << 16, 0),
            )
            .unwrap();
            assert_eq!(get16(&r, 4), mad_status::INVALID_FIELD, "block {block}");
        }
    }

    /// LinkSpeedExtEnabled changes only with SMSupportsExtendedSpeeds
    /// (modifier bit 31): 30 disables FDR (the port reads QDR again), 31
    /// enables every supported extended speed.
    #[test]
    fn link_speed_ext_enabled_follows_the_sm_with_bit_31() {
        let mut p = Port::new(1, &HcaConfig::default());
        p.initialized = true;
        p.retrain();
        let mut d = [0u8; 64];
        encode_port_info(&p, &mut d);
        assert_eq!(d[62] >> 4, 1, "FDR active on a live link");
        d[32] &= 0xf0;
        d[63] = 30;
        assert_eq!(port_info_set(&mut p, &d, false), Ok(()));
        assert_eq!(p.link_speed_ext_enabled, 1, "ignored without bit 31");
        assert_eq!(port_info_set(&mut p, &d, true), Ok(()));
        encode_port_info(&p, &mut d);
        assert_eq!((d[62], d[63]), (0x01, 0), "disabled: active none");
        d[32] &= 0xf0;
        d[63] = 31;
        assert_eq!(port_info_set(&mut p, &d, true), Ok(()));
        encode_port_info(&p, &mut d);
        assert_eq!((d[62], d[63]), (0x11, 1));
        d[32] &= 0xf0;
        d[63] = 0;
        assert_eq!(port_info_set(&mut p, &d, true), Ok(()));
        assert_eq!(p.link_speed_ext_enabled, 1, "0: no change");
        p.cable = false;
        p.retrain();
        encode_port_info(&p, &mut d);
        assert_eq!(d[62] >> 4, 0, "no link, no active speed");
    }
}
