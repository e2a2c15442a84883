//! SET_PORT (IB and Ethernet flavours), SET_MCAST_FLTR and the MAD_IFC PortInfo query mlx4_core sends (Linux `port.c`: `mlx4_SET_PORT`, `mlx4_SET_PORT_general`, `mlx4_SET_PORT_qpn_calc`, the MAC/VLAN table writers, `mlx4_get_port_ib_caps`).
//!
//! Left out: the priority table, the VXLAN and RoCE v2 flavours of the
//! ConnectX-3 Pro. Ethernet layouts from Linux 3.11 `mlx4.h`
//! (`struct mlx4_set_port_general_context`, `struct
//! mlx4_set_port_rqp_calc_context`) and `port.c`.

use hal::be::*;

/// SET_PORT dword 0: change the MTU cap.
pub const CHANGE_PORT_MTU_CAP: u32 = 22;
/// SET_PORT dword 0: change the VL cap.
pub const CHANGE_PORT_VL_CAP: u32 = 21;
/// SET_PORT dword 0: change the P_Key table size.
pub const CHANGE_PORT_PKEY_TBL_SZ: u32 = 20;
/// Shift of the MTU cap.
pub const SET_PORT_MTU_CAP: u32 = 12;
/// Shift of the VL cap.
pub const SET_PORT_VL_CAP: u32 = 4;
/// IB MTU enum value for 4096 bytes.
pub const IB_MTU_4096: u32 = 5;
/// Size of the SET_PORT input used.
pub const SET_PORT_IN_SIZE: usize = 256;

/// SET_PORT (IB, op_mod 0) input: dword 0 = change flags | MTU cap | VL cap;
/// dword 1 = port capability mask (as MAD_IFC returned it); BE16 at 0x28 =
/// P_Key table size when `pkey_tbl_sz` is given.
pub fn set_port_ib(
    mtu_cap: u32,
    vl_cap: u32,
    cap_mask: u32,
    pkey_tbl_sz: Option<u16>,
) -> [u8; SET_PORT_IN_SIZE] {
    let mut b = [0u8; SET_PORT_IN_SIZE];
    let pkey_flag = pkey_tbl_sz.is_some() as u32;
    put_be32(
        &mut b,
        0,
        (1 << CHANGE_PORT_MTU_CAP)
            | (1 << CHANGE_PORT_VL_CAP)
            | (pkey_flag << CHANGE_PORT_PKEY_TBL_SZ)
            | (mtu_cap << SET_PORT_MTU_CAP)
            | (vl_cap << SET_PORT_VL_CAP),
    );
    put_be32(&mut b, 4, cap_mask);
    if let Some(sz) = pkey_tbl_sz {
        put_be16(&mut b, 0x28, sz);
    }
    b
}

/// SET_PORT (IB, op_mod 0) input as mlx4_ib's own `mlx4_SET_PORT` builds it
/// for `ib_modify_port`: no change flags, byte 3 bit 0 resets the Q_Key
/// violation counter, dword 1 is the new port capability mask.
pub fn set_port_ib_cap_mask(cap_mask: u32, reset_qkey_cntrs: bool) -> [u8; SET_PORT_IN_SIZE] {
    let mut b = [0u8; SET_PORT_IN_SIZE];
    b[3] = u8::from(reset_qkey_cntrs);
    put_be32(&mut b, 4, cap_mask);
    b
}

/// The Ethernet SET_PORT flavours (op_mod 1, input modifier bits 15:8),
/// Linux `MLX4_SET_PORT_*`.
pub mod eth {
    /// MTU and pause (`MLX4_SET_PORT_GENERAL`).
    pub const GENERAL: u32 = 0;
    /// The receive-QP calculation (`MLX4_SET_PORT_RQP_CALC`).
    pub const RQP_CALC: u32 = 1;
    /// The MAC table (`MLX4_SET_PORT_MAC_TABLE`).
    pub const MAC_TABLE: u32 = 2;
    /// The VLAN table (`MLX4_SET_PORT_VLAN_TABLE`).
    pub const VLAN_TABLE: u32 = 3;
    /// The RoCE GID table (`MLX4_SET_PORT_GID_TABLE`).
    pub const GID_TABLE: u32 = 5;
    /// SET_PORT op_mod of the Ethernet flavours.
    pub const OP_MOD: u8 = 1;
    /// Entries of the MAC table (`MLX4_MAX_MAC_NUM`).
    pub const MAX_MAC_NUM: usize = 128;
    /// Entries of the VLAN table (`MLX4_MAX_VLAN_NUM`).
    pub const MAX_VLAN_NUM: usize = 128;
    /// Entries of the RoCE GID table (`MLX4_ROCE_MAX_GIDS`).
    pub const MAX_GIDS: usize = 128;
    /// MAC table entry valid bit (`MLX4_MAC_VALID`).
    pub const MAC_VALID: u64 = 1 << 63;
    /// VLAN table entry valid bit (`MLX4_VLAN_VALID`).
    pub const VLAN_VALID: u32 = 1 << 31;
    /// RQP_CALC multicast mode: every multicast to the default QP
    /// (`MCAST_DEFAULT`).
    pub const MCAST_DEFAULT: u32 = 2;
    /// RQP_CALC multicast mode: by the MCG table (`MCAST_DIRECT`).
    pub const MCAST_DIRECT: u32 = 1;
    /// The VLAN index of untagged frames (`MLX4_NO_VLAN_IDX`).
    pub const NO_VLAN_IDX: u8 = 0;
    /// The VLAN index of a VLAN miss (`MLX4_VLAN_MISS_IDX`).
    pub const VLAN_MISS_IDX: u8 = 1;
    /// SET_MCAST_FLTR op_mods (`MLX4_MCAST_CONFIG`, `_DISABLE`, `_ENABLE`).
    pub const MCAST_CONFIG: u8 = 0;
    /// SET_MCAST_FLTR: filter off (every multicast passes).
    pub const MCAST_DISABLE: u8 = 1;
    /// SET_MCAST_FLTR: filter on.
    pub const MCAST_ENABLE: u8 = 2;
    /// Size of the general and RQP_CALC mailboxes written.
    pub const CTX_SIZE: usize = 0x40;
}

/// Linux `mlx4_SET_PORT_general`'s context: `mtu` is the largest frame
/// with its FCS; global pause on (`pptx`/`pprx`) or off, with the
/// per-priority bitmaps `pfctx`/`pfcrx` (0 with global pause).
pub fn set_port_general(
    mtu: u16,
    pptx: bool,
    pfctx: u8,
    pprx: bool,
    pfcrx: u8,
) -> [u8; eth::CTX_SIZE] {
    let mut b = [0u8; eth::CTX_SIZE];
    // flags: MTU, PPRX, PPTX valid.
    b[3] = 0x7;
    put_be16(&mut b, 6, mtu);
    b[8] = u8::from(pptx) << 7;
    b[9] = pfctx;
    b[0x0c] = u8::from(pprx) << 7;
    b[0x0d] = pfcrx;
    b
}

/// Linux `mlx4_SET_PORT_qpn_calc`'s context: MAC index `i` goes to
/// `base_qpn + i` (`n_mac` = log2 of the MAC indices), unicast misses to
/// `base_qpn` when `uc_promisc`, multicast by `mc_mode` (`MCAST_*`) with
/// `base_qpn` the default QP.
pub fn set_port_qpn_calc(
    base_qpn: u32,
    n_mac: u8,
    uc_promisc: bool,
    mc_mode: u32,
) -> [u8; eth::CTX_SIZE] {
    let mut b = [0u8; eth::CTX_SIZE];
    put_be32(&mut b, 0, base_qpn & 0xff_ffff);
    b[5] = n_mac & 0xf;
    b[0x0d] = eth::NO_VLAN_IDX;
    b[0x0f] = eth::VLAN_MISS_IDX;
    put_be32(
        &mut b,
        0x14,
        u32::from(uc_promisc) << 31 | (base_qpn & 0xff_ffff),
    );
    put_be32(&mut b, 0x18, (mc_mode & 3) << 30 | (base_qpn & 0xff_ffff));
    b
}

/// The MAC table mailbox: 128 BE64 `MAC | MAC_VALID` (0 for a free entry).
pub fn mac_table(entries: &[u64; eth::MAX_MAC_NUM]) -> [u8; eth::MAX_MAC_NUM * 8] {
    let mut b = [0u8; eth::MAX_MAC_NUM * 8];
    for (i, e) in entries.iter().enumerate() {
        put_be64(&mut b, i * 8, *e);
    }
    b
}

/// The VLAN table mailbox: 128 BE32 `VID | VLAN_VALID`.
pub fn vlan_table(entries: &[u32; eth::MAX_VLAN_NUM]) -> [u8; eth::MAX_VLAN_NUM * 4] {
    let mut b = [0u8; eth::MAX_VLAN_NUM * 4];
    for (i, e) in entries.iter().enumerate() {
        put_be32(&mut b, i * 4, *e);
    }
    b
}

/// MAD_IFC op_mod: ignore M_Key and B_Key.
pub const MAD_IFC_IGNORE_KEYS: u8 = 3;
/// Size of a MAD.
pub const MAD_SIZE: usize = 256;
/// Byte offset of the capability mask in a PortInfo GetResp MAD (0x40 + 20).
pub const PORT_INFO_CAP_MASK_OFFSET: usize = 84;

/// The SubnGet(PortInfo) MAD of `mlx4_get_port_ib_caps`: base version 1,
/// class 1 (LID routed), class version 1, method Get, attribute 0x0015,
/// attribute modifier = port.
pub fn port_info_query(port: u8) -> [u8; MAD_SIZE] {
    let mut b = [0u8; MAD_SIZE];
    b[0] = 1;
    b[1] = 1;
    b[2] = 1;
    b[3] = 1;
    put_be16(&mut b, 16, 0x0015);
    put_be32(&mut b, 20, u32::from(port));
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_set_port() {
        let b = set_port_ib(IB_MTU_4096, 8, 0x0251_0868, None);
        assert_eq!(b[0..8], [0x00, 0x60, 0x50, 0x80, 0x02, 0x51, 0x08, 0x68]);
        assert!(b[8..].iter().all(|&x| x == 0));
        let b = set_port_ib(IB_MTU_4096, 4, 0, Some(128));
        assert_eq!(b[0..4], [0x00, 0x70, 0x50, 0x40]);
        assert_eq!(b[0x28..0x2a], [0, 128]);
    }

    #[test]
    fn golden_eth_contexts() {
        let g = set_port_general(1522, true, 0, true, 0);
        assert_eq!(
            g[0..0x0e],
            [0, 0, 0, 7, 0, 0, 0x05, 0xf2, 0x80, 0, 0, 0, 0x80, 0]
        );
        let r = set_port_qpn_calc(0x48, 7, false, eth::MCAST_DEFAULT);
        assert_eq!(r[0..8], [0, 0, 0, 0x48, 0, 7, 0, 0]);
        assert_eq!((r[0x0d], r[0x0f]), (0, 1));
        assert_eq!(r[0x14..0x1c], [0, 0, 0, 0x48, 0x80, 0, 0, 0x48]);
        let mut t = [0u64; eth::MAX_MAC_NUM];
        t[1] = eth::MAC_VALID | 0x0002_c900_0011;
        let m = mac_table(&t);
        assert_eq!(m[8..16], [0x80, 0, 0, 2, 0xc9, 0, 0, 0x11]);
    }

    #[test]
    fn golden_port_info_query() {
        let b = port_info_query(2);
        assert_eq!(b[0..4], [1, 1, 1, 1]);
        assert_eq!(b[16..24], [0, 0x15, 0, 0, 0, 0, 0, 2]);
    }
}
