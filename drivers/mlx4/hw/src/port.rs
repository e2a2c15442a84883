//! SET_PORT (IB flavour) and the MAD_IFC PortInfo query mlx4_core sends (Linux `port.c`: `mlx4_SET_PORT`, `mlx4_get_port_ib_caps`).
//!
//! Left out: the Ethernet SET_PORT flavours.

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
    fn golden_port_info_query() {
        let b = port_info_query(2);
        assert_eq!(b[0..4], [1, 1, 1, 1]);
        assert_eq!(b[16..24], [0, 0x15, 0, 0, 0, 0, 0, 2]);
    }
}
