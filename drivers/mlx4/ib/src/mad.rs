//! MADs through the firmware SMA/PMA (Linux `mad.c`): `mlx4_MAD_IFC`, the queries built on it and `mlx4_ib_process_mad`.
//!
//! `mlx4_MAD_IFC` with the extended information of a received completion,
//! `init_query_mad`, the queries main.c builds on (NodeInfo, NodeDescription,
//! PortInfo, GUIDInfo, PKeyTable, ExtendedPortInfo), and
//! `mlx4_ib_process_mad` for IB ports with its filtering, node-description
//! override, direction bit and the snooping of
//! Set(PortInfo/PKeyTable/GUIDInfo) returned as events. Left out: trap
//! forwarding to the SM, SR-IOV demultiplexing/tunnelling, paravirtualised
//! GUIDs and the PMA counters of Ethernet ports.

use hal::be::{get_be16, get_be32, get_be64};
use mlx4_core::Dev;
use mlx4_hw::port::MAD_SIZE;

use crate::verbs::{Wc, WcFlags};
use crate::{Error, Result};

/// Management classes (`IB_MGMT_CLASS_*`, `MLX4_IB_VENDOR_CLASS*`).
pub mod class {
    #![allow(missing_docs)]
    pub const SUBN_LID_ROUTED: u8 = 0x01;
    pub const SUBN_DIRECTED_ROUTE: u8 = 0x81;
    pub const PERF_MGMT: u8 = 0x04;
    pub const VENDOR1: u8 = 0x09;
    pub const VENDOR2: u8 = 0x0a;
    pub const CONG_MGMT: u8 = 0x21;
}

/// Methods (`IB_MGMT_METHOD_*`).
pub mod method {
    #![allow(missing_docs)]
    pub const GET: u8 = 0x01;
    pub const SET: u8 = 0x02;
    pub const GET_RESP: u8 = 0x81;
    pub const TRAP: u8 = 0x05;
    pub const TRAP_REPRESS: u8 = 0x07;
}

/// SMP attributes (`IB_SMP_ATTR_*`).
pub mod attr {
    #![allow(missing_docs)]
    pub const NODE_DESC: u16 = 0x0010;
    pub const NODE_INFO: u16 = 0x0011;
    pub const GUID_INFO: u16 = 0x0014;
    pub const PORT_INFO: u16 = 0x0015;
    pub const PKEY_TABLE: u16 = 0x0016;
    pub const SM_INFO: u16 = 0x0020;
    /// Mellanox ExtendedPortInfo (`MLX4_ATTR_EXTENDED_PORT_INFO`).
    pub const EXTENDED_PORT_INFO: u16 = 0xff90;
}

/// Offsets in a MAD (common header, SMP data).
pub mod off {
    #![allow(missing_docs)]
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: usize = 4;
    pub const ATTR_ID: usize = 16;
    pub const ATTR_MOD: usize = 20;
    /// Data of an SMP.
    pub const SMP_DATA: usize = 64;
}

/// `MLX4_MAD_IFC_*` flags of [`mad_ifc`].
pub mod ifc {
    /// Do not check the M_Key.
    pub const IGNORE_MKEY: u8 = 1;
    /// Do not check the B_Key.
    pub const IGNORE_BKEY: u8 = 2;
    /// Both.
    pub const IGNORE_KEYS: u8 = 3;
}

/// `op_modifier` bit: the extended information block is present.
const OP_MOD_EXT_INFO: u8 = 0x4;

/// Offsets of the extended information in the MAD_IFC input mailbox.
mod ext {
    pub const MY_QPN: usize = 0x100;
    pub const RQPN: usize = 0x108;
    pub const SL: usize = 0x10c;
    pub const G_PATH: usize = 0x10d;
    pub const PKEY: usize = 0x112;
    pub const GRH: usize = 0x140;
    pub const END: usize = 0x168;
}

/// Linux `init_query_mad`: a LID-routed SubnGet() of `attr_id`.
pub fn init_query_mad(attr_id: u16, attr_mod: u32) -> [u8; MAD_SIZE] {
    let mut m = [0u8; MAD_SIZE];
    m[off::BASE_VERSION] = 1;
    m[off::MGMT_CLASS] = class::SUBN_LID_ROUTED;
    m[off::CLASS_VERSION] = 1;
    m[off::METHOD] = method::GET;
    m[off::ATTR_ID..off::ATTR_ID + 2].copy_from_slice(&attr_id.to_be_bytes());
    m[off::ATTR_MOD..off::ATTR_MOD + 4].copy_from_slice(&attr_mod.to_be_bytes());
    m
}

/// Linux `mlx4_MAD_IFC` (native): `in_mad` to the firmware of `port`, with
/// the extended information of `in_wc`/`in_grh` when the MAD came from the
/// wire. Returns the response MAD.
pub fn mad_ifc(
    dev: &mut Dev,
    flags: u8,
    port: u8,
    in_wc: Option<&Wc>,
    in_grh: Option<&[u8; 40]>,
    in_mad: &[u8; MAD_SIZE],
) -> Result<[u8; MAD_SIZE]> {
    let mut op_mod = 0u8;
    if flags & ifc::IGNORE_MKEY != 0 {
        op_mod |= 0x1;
    }
    if flags & ifc::IGNORE_BKEY != 0 {
        op_mod |= 0x2;
    }
    match in_wc {
        None => {
            // Key-check traps cannot be generated without a WC saying
            // where to send them.
            op_mod |= 0x3;
            Ok(dev.mad_ifc(port, op_mod, 0, in_mad)?)
        }
        Some(wc) => {
            let mut inb = [0u8; ext::END];
            inb[..MAD_SIZE].copy_from_slice(in_mad);
            inb[ext::MY_QPN..ext::MY_QPN + 4].copy_from_slice(&wc.qp_num.to_be_bytes());
            inb[ext::RQPN..ext::RQPN + 4].copy_from_slice(&wc.src_qp.to_be_bytes());
            inb[ext::SL] = (wc.sl & 0xf) << 4;
            inb[ext::G_PATH] = (wc.dlid_path_bits & 0x7f)
                | if wc.wc_flags.contains(WcFlags::GRH) {
                    0x80
                } else {
                    0
                };
            inb[ext::PKEY..ext::PKEY + 2].copy_from_slice(&wc.pkey_index.to_be_bytes());
            if let Some(g) = in_grh {
                inb[ext::GRH..ext::GRH + 40].copy_from_slice(g);
            }
            op_mod |= OP_MOD_EXT_INFO;
            Ok(dev.mad_ifc(port, op_mod, wc.slid, &inb)?)
        }
    }
}

/// A SubnGet() through MAD_IFC ignoring keys; a non-zero MAD status is an
/// error.
pub fn query(dev: &mut Dev, port: u8, attr_id: u16, attr_mod: u32) -> Result<[u8; MAD_SIZE]> {
    let out = mad_ifc(
        dev,
        ifc::IGNORE_KEYS,
        port,
        None,
        None,
        &init_query_mad(attr_id, attr_mod),
    )?;
    let status = get_be16(&out, off::STATUS) & 0x7fff;
    if status != 0 {
        return Err(Error::MadStatus(status));
    }
    Ok(out)
}

/// NodeInfo fields main.c reads (`mlx4_ib_query_device`, `init_node_data`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Node GUID.
    pub node_guid: u64,
    /// Device ID (PCI).
    pub device_id: u16,
    /// Revision.
    pub revision: u32,
    /// Vendor OUI (24 bits).
    pub vendor_id: u32,
}

/// NodeInfo from the firmware SMA.
pub fn query_node_info(dev: &mut Dev) -> Result<NodeInfo> {
    let m = query(dev, 1, attr::NODE_INFO, 0)?;
    let d = &m[off::SMP_DATA..];
    Ok(NodeInfo {
        sys_image_guid: get_be64(d, 4),
        node_guid: get_be64(d, 12),
        device_id: get_be16(d, 30),
        revision: get_be32(d, 32),
        vendor_id: get_be32(d, 36) & 0xff_ffff,
    })
}

/// NodeDescription from the firmware SMA (64 bytes).
pub fn query_node_desc(dev: &mut Dev) -> Result<[u8; 64]> {
    let m = query(dev, 1, attr::NODE_DESC, 0)?;
    let mut d = [0u8; 64];
    d.copy_from_slice(&m[off::SMP_DATA..off::SMP_DATA + 64]);
    Ok(d)
}

/// `struct ib_port_attr` as `__mlx4_ib_query_port` fills it for IB ports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct PortAttr {
    /// 1 Down, 2 Init, 3 Armed, 4 Active.
    pub state: u8,
    pub phys_state: u8,
    pub lid: u16,
    pub lmc: u8,
    pub sm_lid: u16,
    pub sm_sl: u8,
    pub port_cap_flags: u32,
    /// `enum ib_mtu` of the port's MTU capability (PortInfo MTUCap).
    pub max_mtu: u8,
    /// NeighborMTU.
    pub active_mtu: u8,
    pub active_width: u8,
    /// 1 SDR, 2 DDR, 4 QDR, 8 FDR10, 16 FDR, 32 EDR (Linux values).
    pub active_speed: u8,
    pub max_vl_num: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub bad_pkey_cntr: u16,
    pub qkey_viol_cntr: u16,
    pub gid_tbl_len: u32,
    pub pkey_tbl_len: u32,
    pub max_msg_sz: u32,
    pub gid_prefix: u64,
}

/// Linux `ib_link_query_port`: PortInfo through MAD_IFC, extended speeds
/// and the FDR10 check as Linux does them.
pub fn query_port(dev: &mut Dev, port: u8) -> Result<PortAttr> {
    let m = query(dev, port, attr::PORT_INFO, u32::from(port))?;
    let d = &m[off::SMP_DATA..];
    let caps = dev.caps();
    let pc = caps
        .port
        .get(usize::from(port))
        .copied()
        .unwrap_or_default();
    let mut a = PortAttr {
        gid_prefix: get_be64(d, 8),
        lid: get_be16(d, 16),
        sm_lid: get_be16(d, 18),
        port_cap_flags: get_be32(d, 20),
        active_width: d[31] & 0xf,
        state: d[32] & 0xf,
        phys_state: d[33] >> 4,
        lmc: d[34] & 0x7,
        active_speed: d[35] >> 4,
        active_mtu: d[36] >> 4,
        sm_sl: d[36] & 0xf,
        max_vl_num: d[37] >> 4,
        max_mtu: d[41] & 0xf,
        init_type_reply: d[41] >> 4,
        bad_pkey_cntr: get_be16(d, 46),
        qkey_viol_cntr: get_be16(d, 48),
        subnet_timeout: d[51] & 0x1f,
        gid_tbl_len: pc.gid_table_len,
        pkey_tbl_len: pc.pkey_table_len,
        max_msg_sz: caps.max_msg_sz,
    };
    // Extended speeds (FDR/EDR) when the port advertises them.
    if a.port_cap_flags & (1 << 14) != 0 {
        match d[62] >> 4 {
            1 => a.active_speed = 16,
            2 => a.active_speed = 32,
            _ => {}
        }
    }
    // QDR on a Mellanox port may really be FDR10.
    if a.active_speed == 4
        && let Ok(e) = query(dev, port, attr::EXTENDED_PORT_INFO, u32::from(port))
        && e[off::SMP_DATA + 15] & 0x1 != 0
    {
        a.active_speed = 8;
    }
    // A down port reports SDR.
    if a.state == 1 {
        a.active_speed = 1;
    }
    Ok(a)
}

/// Linux `__mlx4_ib_query_gid`: prefix from PortInfo, GUID from GUIDInfo
/// block `index / 8`.
pub fn query_gid(dev: &mut Dev, port: u8, index: u32) -> Result<[u8; 16]> {
    let m = query(dev, port, attr::PORT_INFO, u32::from(port))?;
    let mut gid = [0u8; 16];
    gid[..8].copy_from_slice(&m[off::SMP_DATA + 8..off::SMP_DATA + 16]);
    let g = query(dev, port, attr::GUID_INFO, index / 8)?;
    let o = off::SMP_DATA + (index as usize % 8) * 8;
    gid[8..].copy_from_slice(&g[o..o + 8]);
    Ok(gid)
}

/// The whole GID table in one PortInfo and one GUIDInfo query per 8
/// entries: what the cache refresh needs, at 1 + len/8 MAD_IFCs where
/// [`query_gid`] per entry costs 2 each (Linux 3.11's cache does that;
/// under TCG every MAD_IFC is a polled firmware command).
pub fn query_gid_table(
    dev: &mut Dev,
    port: u8,
    len: usize,
    mut put: impl FnMut(usize, [u8; 16]),
) -> Result<()> {
    let m = query(dev, port, attr::PORT_INFO, u32::from(port))?;
    let mut gid = [0u8; 16];
    gid[..8].copy_from_slice(&m[off::SMP_DATA + 8..off::SMP_DATA + 16]);
    for (block, first) in (0u32..).zip((0..len).step_by(8)) {
        let g = query(dev, port, attr::GUID_INFO, block)?;
        for index in first..len.min(first + 8) {
            let o = off::SMP_DATA + (index - first) * 8;
            gid[8..].copy_from_slice(&g[o..o + 8]);
            put(index, gid);
        }
    }
    Ok(())
}

/// The whole P_Key table, one PKeyTable query per 32 entries.
pub fn query_pkey_table(dev: &mut Dev, port: u8, out: &mut [u16]) -> Result<()> {
    for (block, keys) in (0u32..).zip(out.chunks_mut(32)) {
        let m = query(dev, port, attr::PKEY_TABLE, block)?;
        for (i, k) in keys.iter_mut().enumerate() {
            *k = get_be16(&m, off::SMP_DATA + i * 2);
        }
    }
    Ok(())
}

/// Linux `__mlx4_ib_query_pkey`: entry `index % 32` of PKeyTable block
/// `index / 32`.
pub fn query_pkey(dev: &mut Dev, port: u8, index: u16) -> Result<u16> {
    let m = query(dev, port, attr::PKEY_TABLE, u32::from(index / 32))?;
    Ok(get_be16(&m, off::SMP_DATA + usize::from(index % 32) * 2))
}

/// `IB_MAD_RESULT_*` bits of [`process_mad`].
pub mod result {
    /// Processed (or deliberately ignored) without failure.
    pub const SUCCESS: u32 = 1 << 0;
    /// `out_mad` holds a reply to send back.
    pub const REPLY: u32 = 1 << 1;
    /// Nobody else should see the MAD.
    pub const CONSUMED: u32 = 1 << 2;
    /// The firmware refused the MAD.
    pub const FAILURE: u32 = 0;
}

/// Port events found by snooping a Set() the SMA accepted (Linux
/// `smp_snoop`), for ib_core to dispatch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snooped {
    /// `IB_EVENT_LID_CHANGE`.
    pub lid_change: bool,
    /// `IB_EVENT_CLIENT_REREGISTER`.
    pub client_reregister: bool,
    /// `IB_EVENT_PKEY_CHANGE`.
    pub pkey_change: bool,
    /// `IB_EVENT_GID_CHANGE`.
    pub gid_change: bool,
    /// New SM LID and SL (Linux `update_sm_ah`).
    pub sm: Option<(u16, u8)>,
}

/// What [`process_mad`] did.
#[derive(Debug, Clone, Copy)]
pub struct ProcessMad {
    /// [`result`] bits.
    pub result: u32,
    /// The reply (meaningful with `REPLY`).
    pub out_mad: [u8; MAD_SIZE],
    /// Events to dispatch.
    pub snooped: Snooped,
    /// The MAD was a locally generated trap that Linux forwards to the SM
    /// (left to ib_core's SM agent here).
    pub forward_trap: bool,
}

/// Linux `mlx4_ib_process_mad` / `ib_process_mad` for an IB port. `in_wc`
/// is the completion of a MAD from the wire (`None` for a local request);
/// `node_desc` is the host's node description (`node_desc_override`).
pub fn process_mad(
    dev: &mut Dev,
    mad_flags: u8,
    port: u8,
    in_wc: Option<&Wc>,
    in_grh: Option<&[u8; 40]>,
    in_mad: &[u8; MAD_SIZE],
    node_desc: &[u8; 64],
) -> ProcessMad {
    let mut r = ProcessMad {
        result: result::SUCCESS,
        out_mad: [0u8; MAD_SIZE],
        snooped: Snooped::default(),
        forward_trap: false,
    };
    let cls = in_mad[off::MGMT_CLASS];
    let meth = in_mad[off::METHOD];
    let attr_id = get_be16(in_mad, off::ATTR_ID);
    let slid = in_wc.map_or(0xffff, |w| w.slid);
    if meth == method::TRAP && slid == 0 {
        r.forward_trap = true;
        r.result |= result::CONSUMED;
        return r;
    }
    let smp = cls == class::SUBN_LID_ROUTED || cls == class::SUBN_DIRECTED_ROUTE;
    if smp {
        if meth != method::GET && meth != method::SET && meth != method::TRAP_REPRESS {
            return r;
        }
        // The SMA cannot handle SMInfo.
        if attr_id == attr::SM_INFO {
            return r;
        }
    } else if matches!(
        cls,
        class::PERF_MGMT | class::VENDOR1 | class::VENDOR2 | class::CONG_MGMT
    ) {
        if meth != method::GET && meth != method::SET {
            return r;
        }
    } else {
        return r;
    }
    let set_port_info = smp && meth == method::SET && attr_id == attr::PORT_INFO;
    let prev_lid = if set_port_info {
        query_port(dev, port).map(|a| a.lid).ok()
    } else {
        None
    };
    let flags = mad_flags & ifc::IGNORE_KEYS;
    let out = match mad_ifc(dev, flags, port, in_wc, in_grh, in_mad) {
        Ok(o) => o,
        Err(_) => {
            r.result = result::FAILURE;
            return r;
        }
    };
    r.out_mad = out;
    if get_be16(&r.out_mad, off::STATUS) == 0 {
        let caps_flags = dev.caps().flags;
        // MLX4_DEV_CAP_FLAG_PORT_MNG_CHG_EV (bit 59): the firmware reports
        // these changes as events itself.
        if caps_flags & (1 << 59) == 0 {
            r.snooped = smp_snoop(in_mad, prev_lid.unwrap_or(0));
        }
        if smp && r.out_mad[off::METHOD] == method::GET_RESP && attr_id == attr::NODE_DESC {
            r.out_mad[off::SMP_DATA..off::SMP_DATA + 64].copy_from_slice(node_desc);
        }
    }
    if cls == class::SUBN_DIRECTED_ROUTE {
        r.out_mad[off::STATUS] |= 0x80;
    }
    if meth == method::TRAP_REPRESS {
        r.result |= result::CONSUMED;
    } else {
        r.result |= result::REPLY;
    }
    r
}

/// Linux `smp_snoop`: what a Set() the SMA accepted changes.
pub fn smp_snoop(mad: &[u8; MAD_SIZE], prev_lid: u16) -> Snooped {
    let mut s = Snooped::default();
    let cls = mad[off::MGMT_CLASS];
    if !(cls == class::SUBN_LID_ROUTED || cls == class::SUBN_DIRECTED_ROUTE)
        || mad[off::METHOD] != method::SET
    {
        return s;
    }
    let d = &mad[off::SMP_DATA..];
    match get_be16(mad, off::ATTR_ID) {
        attr::PORT_INFO => {
            s.sm = Some((get_be16(d, 18), d[36] & 0xf));
            s.client_reregister = d[51] & 0x80 != 0;
            s.lid_change = get_be16(d, 16) != prev_lid;
        }
        attr::PKEY_TABLE => s.pkey_change = true,
        attr::GUID_INFO => s.gid_change = true,
        _ => {}
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_mad_layout() {
        let m = init_query_mad(attr::GUID_INFO, 2);
        assert_eq!(m[..4], [1, 1, 1, 1]);
        assert_eq!(m[16..18], [0, 0x14]);
        assert_eq!(m[20..24], [0, 0, 0, 2]);
        assert!(m[24..].iter().all(|&b| b == 0));
    }

    #[test]
    fn snooping_finds_port_changes() {
        let mut m = init_query_mad(attr::PORT_INFO, 1);
        m[off::METHOD] = method::SET;
        let d = off::SMP_DATA;
        m[d + 16..d + 18].copy_from_slice(&5u16.to_be_bytes());
        m[d + 18..d + 20].copy_from_slice(&1u16.to_be_bytes());
        m[d + 36] = 0x40 | 3;
        m[d + 51] = 0x80 | 18;
        let s = smp_snoop(&m, 0);
        assert!(s.lid_change && s.client_reregister);
        assert_eq!(s.sm, Some((1, 3)));
        assert!(!smp_snoop(&m, 5).lid_change, "same LID: no event");
        m[off::ATTR_ID..off::ATTR_ID + 2].copy_from_slice(&attr::PKEY_TABLE.to_be_bytes());
        assert!(smp_snoop(&m, 5).pkey_change);
        m[off::METHOD] = method::GET;
        assert_eq!(
            smp_snoop(&m, 5),
            Snooped::default(),
            "Get() changes nothing"
        );
    }
}
